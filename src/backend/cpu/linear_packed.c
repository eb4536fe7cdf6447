/* A batch-invariant linear layer for inference: packed weights and a
 * fixed-order fp32 kernel.
 *
 * OpenBLAS's sgemm picks its blocking, its tail kernels and its thread split
 * from the matrix sizes, so a row's output changes in the last bits with the
 * batch it is scored in. The online server merges concurrent requests into
 * one batch, and a row's score must not depend on its neighbours. Here every
 * output is one fixed chain of operations:
 *
 *   acc = bias[o]                        (0 without a bias)
 *   acc = fma(in[b][k], W[o][k], acc)    for k = 0, 1, .., IN-1 in order
 *   out[b][o] = relu ? max(acc, 0) : acc
 *
 * where fma rounds once. That chain mentions nothing but row b and the
 * weights, and every kernel below evaluates exactly it: the value of an
 * output depends on neither B, nor the other rows, nor the row's position,
 * nor the thread count. Different kernels (6 rows x 16 outputs, 1 row x 64)
 * and different lanes give the same bits because an IEEE fused multiply-add
 * is exactly rounded wherever it runs.
 *
 * The multiply-add is explicit: vf8_fma is _mm256_fmadd_ps where the target
 * has FMA (x86 -mfma, which -march=native gives on the development machine),
 * never left to the compiler's contraction, which the project's -std=c11 turns
 * off under GCC (-ffp-contract=off in ISO mode) but Clang turns on within an
 * expression. Without FMA the fallback is a separately rounded multiply and
 * add, with contraction off for Clang by the pragma below and off for GCC by
 * ISO mode; every kernel goes through the same helper, so the result is again
 * one chain per output. The two cases give different bits, so invariance
 * holds within one build, not across builds.
 *
 * Layout: W (OUT, IN) is packed into panels of NR = 16 outputs, each panel
 * (IN, 16) k-major and zero-padded past OUT, so that the kernel reads two
 * vectors per k from one contiguous stream. The main kernel computes 6 rows x
 * 16 outputs (12 vector accumulators held in named variables, as in
 * interaction.c): per k, 2 vector loads and 6 broadcasts feed 12 independent
 * FMAs. Row tails of 4 or 5 rows run it on duplicated row pointers and drop
 * the extra rows; tails of 1 to 3 rows (and B = 1) run a one-row kernel over
 * 4 panels at a time (8 accumulators), which is cheaper than 6 rows of work
 * for one. Output tails compute the zero-padded lanes and drop them.
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
/* Without AVX (DLREC_NATIVE=OFF), GCC and Clang warn that passing vf8 by
 * value changes the ABI; the helpers that do are static and inlined, so no
 * vf8 crosses a call boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define NR 16 /* outputs per panel */
#define MR 6  /* rows per block of the main kernel */
#define PW 4  /* panels per call of the one-row kernel */
/* Row blocks with fewer valid rows than this take the one-row kernel. */
#define MR_MIN 4
#define MAX_DIM 65536
/* Panels are visited in groups of about this many bytes, which stay in L2
 * (512 KiB per core on the development machine) while each thread's rows
 * stream past them. */
#define GROUP_BYTES (192 * 1024)
/* Below this many multiply-adds (padded to whole panels) the forward runs on
 * the calling thread: waking a passive OpenMP team costs about 10 us, more
 * than such a layer takes on one thread (512 -> 256 at B = 1: 6 us alone,
 * 16 us on two threads). */
#define PARALLEL_MIN_MACS (1 << 20)

#define ALWAYS_INLINE inline __attribute__((always_inline))

typedef float vf8 __attribute__((vector_size(32)));
typedef int vi8 __attribute__((vector_size(32)));

struct dlrec_packed_linear {
  int in, out, panels;
  float *w;    /* (panels, IN, NR): w[(p IN + k) NR + j] = W[p NR + j][k], 0 past OUT */
  float *bias; /* (panels NR): the bias, 0 past OUT and without one */
};

static ALWAYS_INLINE vf8 vf8_load(const float *p) {
  vf8 v;
  memcpy(&v, p, sizeof v); /* unaligned */
  return v;
}

/* A macro (v must be a variable) for the reason given at vf8_fma. */
#define vf8_store(p, v) memcpy((p), &(v), sizeof(vf8))

static ALWAYS_INLINE vf8 vf8_splat(float x) { return (vf8){x, x, x, x, x, x, x, x}; }

/* a * b + c, rounded once where the target has FMA (see the file comment).
 * A macro, not a function: without AVX, GCC notes an ABI change for a
 * function taking vf8 by value even with -Wpsabi off. */
#if defined(__FMA__)
#define vf8_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#else
#define vf8_fma(a, b, c) ((c) + (a) * (b))
#endif

/* *x = max(*x, 0) as cpu_relu_forward computes it: x > 0 ? x : 0. */
static ALWAYS_INLINE void vf8_relu(vf8 *x) {
  const vf8 zero = {0};
  vi8 bits;
  memcpy(&bits, x, sizeof bits);
  bits &= *x > zero;
  memcpy(x, &bits, sizeof bits);
}

static ALWAYS_INLINE int min_int(int a, int b) { return a < b ? a : b; }

/* ---- packing ------------------------------------------------------------- */

static void pack(dlrec_packed_linear *p, const float *weight, const float *bias) {
  const int IN = p->in, OUT = p->out;
  for (int pn = 0; pn < p->panels; pn++) {
    float *panel = p->w + (size_t)pn * IN * NR;
    for (int j = 0; j < NR; j++) {
      const int o = pn * NR + j;
      if (o < OUT) {
        const float *row = weight + (size_t)o * IN;
        for (int k = 0; k < IN; k++) panel[(size_t)k * NR + j] = row[k];
      } else {
        for (int k = 0; k < IN; k++) panel[(size_t)k * NR + j] = 0.0f;
      }
    }
  }
  for (int o = 0; o < p->panels * NR; o++) p->bias[o] = bias && o < OUT ? bias[o] : 0.0f;
}

dlrec_status nn_check_packed(dlrec_packed_linear **out, const float *weight, int IN, int OUT) {
  if (out) *out = NULL;
  if (!out || !weight) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_create: NULL argument");
  if (IN < 1 || IN > MAX_DIM || OUT < 1 || OUT > MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "packed_linear_create: bad shape IN=%d OUT=%d (1 .. %d each)", IN, OUT,
                       MAX_DIM);
  return DLREC_OK;
}

dlrec_status cpu_packed_create(dlrec_packed_linear **out, const float *weight, const float *bias, int IN,
                                        int OUT) {
  dlrec_status st = nn_check_packed(out, weight, IN, OUT);
  if (st != DLREC_OK) return st;
  dlrec_packed_linear *p = calloc(1, sizeof *p);
  if (!p) goto nomem;
  p->in = IN;
  p->out = OUT;
  p->panels = (OUT + NR - 1) / NR;
  const size_t w_bytes = (size_t)p->panels * (size_t)IN * NR * sizeof(float);
  const size_t b_bytes = (size_t)p->panels * NR * sizeof(float);
  /* Multiples of 64 bytes by construction: aligned_alloc's requirement. */
  p->w = aligned_alloc(64, w_bytes);
  p->bias = aligned_alloc(64, b_bytes);
  if (!p->w || !p->bias) goto nomem;
  pack(p, weight, bias);
  *out = p;
  return DLREC_OK;
nomem:
  cpu_packed_free(p);
  return dlrec_error(DLREC_ERR_NOMEM, "packed_linear_create: out of memory for IN=%d OUT=%d", IN, OUT);
}

void cpu_packed_free(dlrec_packed_linear *p) {
  if (!p) return;
  free(p->w);
  free(p->bias);
  free(p);
}

/* ---- kernels --------------------------------------------------------------- */

/* Up to MR rows x one panel: dst[r][0 .. n) for r < rows. x holds MR row
 * pointers; those past rows repeat a valid row, and their results are
 * dropped, as are the lanes at n and past. One copy of this function (not
 * inlined) serves every row block. */
static __attribute__((noinline)) void kernel_6x16(float *const dst[MR], const float *const x[MR],
                                                  const float *restrict panel, const float *restrict bias, int IN,
                                                  int rows, int n, int relu) {
  const float *restrict x0 = x[0], *restrict x1 = x[1], *restrict x2 = x[2];
  const float *restrict x3 = x[3], *restrict x4 = x[4], *restrict x5 = x[5];
  const vf8 blo = vf8_load(bias), bhi = vf8_load(bias + 8);
  vf8 a0 = blo, b0 = bhi, a1 = blo, b1 = bhi, a2 = blo, b2 = bhi;
  vf8 a3 = blo, b3 = bhi, a4 = blo, b4 = bhi, a5 = blo, b5 = bhi;
  for (int k = 0; k < IN; k++) {
    const float *w = panel + (size_t)k * NR;
    const vf8 lo = vf8_load(w), hi = vf8_load(w + 8);
    vf8 s;
    s = vf8_splat(x0[k]), a0 = vf8_fma(s, lo, a0), b0 = vf8_fma(s, hi, b0);
    s = vf8_splat(x1[k]), a1 = vf8_fma(s, lo, a1), b1 = vf8_fma(s, hi, b1);
    s = vf8_splat(x2[k]), a2 = vf8_fma(s, lo, a2), b2 = vf8_fma(s, hi, b2);
    s = vf8_splat(x3[k]), a3 = vf8_fma(s, lo, a3), b3 = vf8_fma(s, hi, b3);
    s = vf8_splat(x4[k]), a4 = vf8_fma(s, lo, a4), b4 = vf8_fma(s, hi, b4);
    s = vf8_splat(x5[k]), a5 = vf8_fma(s, lo, a5), b5 = vf8_fma(s, hi, b5);
  }
  if (relu) {
    vf8_relu(&a0), vf8_relu(&b0), vf8_relu(&a1), vf8_relu(&b1);
    vf8_relu(&a2), vf8_relu(&b2), vf8_relu(&a3), vf8_relu(&b3);
    vf8_relu(&a4), vf8_relu(&b4), vf8_relu(&a5), vf8_relu(&b5);
  }
  if (rows == MR && n == NR) {
    vf8_store(dst[0], a0), vf8_store(dst[0] + 8, b0), vf8_store(dst[1], a1), vf8_store(dst[1] + 8, b1);
    vf8_store(dst[2], a2), vf8_store(dst[2] + 8, b2), vf8_store(dst[3], a3), vf8_store(dst[3] + 8, b3);
    vf8_store(dst[4], a4), vf8_store(dst[4] + 8, b4), vf8_store(dst[5], a5), vf8_store(dst[5] + 8, b5);
    return;
  }
  float res[MR][NR];
  vf8_store(res[0], a0), vf8_store(res[0] + 8, b0), vf8_store(res[1], a1), vf8_store(res[1] + 8, b1);
  vf8_store(res[2], a2), vf8_store(res[2] + 8, b2), vf8_store(res[3], a3), vf8_store(res[3] + 8, b3);
  vf8_store(res[4], a4), vf8_store(res[4] + 8, b4), vf8_store(res[5], a5), vf8_store(res[5] + 8, b5);
  for (int r = 0; r < rows; r++) memcpy(dst[r], res[r], (size_t)n * sizeof(float));
}

/* One row x np consecutive panels (1 <= np <= PW, a constant after
 * inlining): dst[0 .. n). Panel q starts at panel + q IN NR. */
static ALWAYS_INLINE void row_kernel(float *restrict dst, const float *restrict x, const float *restrict panel,
                                     const float *restrict bias, int IN, int np, int n, int relu) {
  const size_t ps = (size_t)IN * NR;
  const vf8 zero = {0};
  vf8 a0 = vf8_load(bias), b0 = vf8_load(bias + 8);
  vf8 a1 = np > 1 ? vf8_load(bias + 16) : zero, b1 = np > 1 ? vf8_load(bias + 24) : zero;
  vf8 a2 = np > 2 ? vf8_load(bias + 32) : zero, b2 = np > 2 ? vf8_load(bias + 40) : zero;
  vf8 a3 = np > 3 ? vf8_load(bias + 48) : zero, b3 = np > 3 ? vf8_load(bias + 56) : zero;
  for (int k = 0; k < IN; k++) {
    const float *w = panel + (size_t)k * NR;
    const vf8 s = vf8_splat(x[k]);
    a0 = vf8_fma(s, vf8_load(w), a0), b0 = vf8_fma(s, vf8_load(w + 8), b0);
    if (np > 1) a1 = vf8_fma(s, vf8_load(w + ps), a1), b1 = vf8_fma(s, vf8_load(w + ps + 8), b1);
    if (np > 2) a2 = vf8_fma(s, vf8_load(w + 2 * ps), a2), b2 = vf8_fma(s, vf8_load(w + 2 * ps + 8), b2);
    if (np > 3) a3 = vf8_fma(s, vf8_load(w + 3 * ps), a3), b3 = vf8_fma(s, vf8_load(w + 3 * ps + 8), b3);
  }
  if (relu) {
    vf8_relu(&a0), vf8_relu(&b0), vf8_relu(&a1), vf8_relu(&b1);
    vf8_relu(&a2), vf8_relu(&b2), vf8_relu(&a3), vf8_relu(&b3);
  }
  float res[PW * NR];
  float *to = n == np * NR ? dst : res;
  vf8_store(to, a0), vf8_store(to + 8, b0);
  if (np > 1) vf8_store(to + 16, a1), vf8_store(to + 24, b1);
  if (np > 2) vf8_store(to + 32, a2), vf8_store(to + 40, b2);
  if (np > 3) vf8_store(to + 48, a3), vf8_store(to + 56, b3);
  if (to == res) memcpy(dst, res, (size_t)n * sizeof(float));
}

static __attribute__((noinline)) void row_kernel_any(float *dst, const float *x, const float *panel,
                                                     const float *bias, int IN, int np, int n, int relu) {
  switch (np) {
  case 1: row_kernel(dst, x, panel, bias, IN, 1, n, relu); break;
  case 2: row_kernel(dst, x, panel, bias, IN, 2, n, relu); break;
  case 3: row_kernel(dst, x, panel, bias, IN, 3, n, relu); break;
  default: row_kernel(dst, x, panel, bias, IN, 4, n, relu); break;
  }
}

/* ---- the forward ------------------------------------------------------------ */

/* Rows of row blocks [rb0, rb1) x panels [p0, p1): one thread's share. */
static void forward_tile(const dlrec_packed_linear *p, const float *in, float *out, int B, int relu, int rb0,
                         int rb1, int p0, int p1) {
  const int IN = p->in, OUT = p->out;
  const size_t panel_floats = (size_t)IN * NR;
  /* A multiple of PW so that the one-row kernel runs whole groups of PW. */
  int group = (int)(GROUP_BYTES / (panel_floats * sizeof(float))) / PW * PW;
  if (group < PW) group = PW;
  for (int g0 = p0; g0 < p1; g0 += group) {
    const int g1 = min_int(g0 + group, p1);
    for (int rb = rb0; rb < rb1; rb++) {
      const int r0 = rb * MR, rows = min_int(MR, B - r0);
      if (rows >= MR_MIN) {
        const float *x[MR];
        float *dst[MR];
        for (int r = 0; r < MR; r++) {
          const int b = r0 + min_int(r, rows - 1); /* rows past B repeat the last one */
          x[r] = in + (size_t)b * IN;
          dst[r] = out + (size_t)b * OUT;
        }
        for (int pn = g0; pn < g1; pn++) {
          float *d[MR];
          for (int r = 0; r < MR; r++) d[r] = dst[r] + pn * NR;
          kernel_6x16(d, x, p->w + pn * panel_floats, p->bias + pn * NR, IN, rows, min_int(NR, OUT - pn * NR),
                      relu);
        }
      } else {
        for (int b = r0; b < r0 + rows; b++)
          for (int pn = g0; pn < g1; pn += PW) {
            const int np = min_int(PW, g1 - pn);
            row_kernel_any(out + (size_t)b * OUT + pn * NR, in + (size_t)b * IN, p->w + pn * panel_floats,
                           p->bias + pn * NR, IN, np, min_int(np * NR, OUT - pn * NR), relu);
          }
      }
    }
  }
}

dlrec_status cpu_packed_forward(float *out, const dlrec_packed_linear *p, const float *in, int B, dlrec_act act) {
  if (!p || !in || !out) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: NULL argument");
  const int relu = act == DLREC_ACT_RELU;
  if (B < 1) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: bad batch size B=%d", B);
  const int blocks = (B + MR - 1) / MR, panels = p->panels;
  const double macs = (double)B * p->in * panels * NR;
  if (macs < PARALLEL_MIN_MACS || omp_get_max_threads() == 1) {
    forward_tile(p, in, out, B, relu, 0, blocks, 0, panels);
    return DLREC_OK;
  }
#pragma omp parallel
  {
    /* Any split gives the same bits (see the file comment); this one is for
     * speed. Many row blocks: each thread takes a range of rows and all the
     * panels. Few (B up to about 50 per thread): each takes a range of the
     * panels and all the rows, so that the weights, not the rows, are shared
     * out; B = 1 on a wide layer thus runs on every thread. */
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    if (blocks >= 8 * T || panels < T)
      forward_tile(p, in, out, B, relu, (int)((long)blocks * t / T), (int)((long)blocks * (t + 1) / T), 0, panels);
    else
      forward_tile(p, in, out, B, relu, 0, blocks, (int)((long)panels * t / T), (int)((long)panels * (t + 1) / T));
  }
  return DLREC_OK;
}
