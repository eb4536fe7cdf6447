/* The CPU backend's linear layers (cpu_gemm.h), in one of three ways:
 *
 *   fp32      FP32: on oneDNN's fp32 matmul where the CPU has AVX-512, else
 *             on OpenBLAS sgemm (cpu_sgemm_linear_*, linear.c). The rule is
 *             measured (bench_roofline's sgemm_model_gflops against
 *             dnnl_f32_model_gflops): Debian's OpenBLAS 0.3.21 runs AVX2
 *             kernels on AMD's AVX-512 CPUs, and on a Zen 5 oneDNN's
 *             AVX-512 kernels are twice as fast on the step's shapes (483
 *             against 242 GFLOP/s on two cores); without AVX-512 OpenBLAS
 *             was the faster, and stays. DLREC_FP32_GEMM=openblas or onednn
 *             overrides the rule.
 *   oneDNN    BF16 on a CPU with AMX-BF16 or AVX512-BF16: the fp32 operands
 *             are converted to bf16 in scratch, and a oneDNN matmul (bf16
 *             source and weights, fp32 destination, bias and ReLU fused)
 *             runs on the CPU's own bf16 instructions (cpu_dnnl.c).
 *   emulated  BF16 elsewhere, and FP16 everywhere: the operands are rounded
 *             to bf16 (fp16) exactly as a conversion does (to nearest even;
 *             NaN stays NaN; fp16 overflows to infinity past 65504) but kept
 *             in fp32 scratch, and the fp32 GEMMs above multiply them. The
 *             product of two bf16 or fp16 values is exact in fp32, so this
 *             computes what the native path does (fp32 accumulation of exact
 *             products), only slower: a run on a CPU without bf16 learns
 *             what one with it would, and an fp16 run what a GPU's would.
 *
 * In every way the master weights, dW, db and the accumulations are fp32;
 * only the GEMMs' operands are rounded, and db sums the unrounded dout.
 * Scratch is owned here and grown to the largest layer seen, never
 * reallocated per batch.
 *
 * Kept operands (cpu_gemm_keep, oneDNN's path): a training pass converts
 * each layer's input and weights to bf16 in its forward and would convert
 * them again in its backward; while keeping, the forward converts into a
 * slot that remembers the source and its size, and the backward reads the
 * slot instead (the caller promises the sources unchanged in between). The
 * slots' buffers stay between passes, reused in the same order.
 */
#include "backend/cpu/cpu_gemm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_dnnl.h"
#include "backend/fresh_grads.h"
#include "backend/dtype.h"
#include "backend/checks.h"
#include "backend/cpu/columns.h"

/* Elementwise passes smaller than this run on one thread (as in nn/linear.c). */
#define PARALLEL_MIN 32768

typedef enum gemm_path { GEMM_FP32, GEMM_EMULATED, GEMM_ONEDNN } gemm_path;

/* What cpuid says about bf16 GEMM instructions. */
typedef enum bf16_isa { BF16_ISA_NONE = 0, BF16_ISA_AVX512 = 1, BF16_ISA_AMX = 2 } bf16_isa;

/* A kept bf16 copy of n floats at src (cpu_gemm_keep). */
typedef struct kept_operand {
  const float *src;
  size_t n;
  uint16_t *h;
  size_t cap; /* h's values */
} kept_operand;

/* More operands than this in one pass are converted again in the backward. */
#define MAX_KEPT 64

struct cpu_gemm {
  dlrec_precision precision;
  gemm_path path;
  int f16c; /* fp16's rounding on F16C (cpu_gemm_round_fp16) */
  cpu_dnnl *dnnl; /* the bf16 matmul (GEMM_ONEDNN) */
  cpu_dnnl *f32;  /* the fp32 matmul of GEMM_FP32 and GEMM_EMULATED; NULL: OpenBLAS sgemm */
  void *scratch; /* the rounded or converted operands */
  size_t scratch_bytes;
  int keep;        /* cpu_gemm_keep's switch */
  uint32_t n_kept; /* the slots in use this pass */
  kept_operand kept[MAX_KEPT];
  fresh_grads fresh; /* cpu_gemm_fresh's */
  char describe[128];
};

#if defined(__x86_64__) || defined(__i386__)
/* The OS's enabled register state (XCR0), read only when cpuid says OSXSAVE. */
static uint64_t xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

/* AMX-BF16 (leaf 7.0 EDX bits 22 and 24, tile state XCR0 bits 17-18) or
 * AVX512-BF16 (leaf 7.1 EAX bit 5, with AVX512F and the opmask/ZMM state
 * XCR0 bits 1-2 and 5-7). Both need the OS to save the registers, hence the
 * XCR0 checks; Linux additionally grants AMX per process on request, which
 * oneDNN makes itself. */
static bf16_isa detect_bf16_isa(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return BF16_ISA_NONE; /* OSXSAVE */
  uint64_t x = xcr0();
  if (__get_cpuid_max(0, NULL) < 7) return BF16_ISA_NONE;
  __cpuid_count(7, 0, a, b, c, d);
  int avx512f = (b >> 16) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (amx_bf16 && amx_tile && (x & 0x60000) == 0x60000) return BF16_ISA_AMX;
  unsigned a1, b1, c1, d1;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  if (avx512f && ((a1 >> 5) & 1) && (x & 0xe6) == 0xe6) return BF16_ISA_AVX512;
  return BF16_ISA_NONE;
}

/* AVX512F (leaf 7.0 EBX bit 16) with the opmask/ZMM state (XCR0 bits 1-2
 * and 5-7) saved by the OS: where oneDNN's fp32 matmul takes over. */
static int detect_avx512f(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  uint64_t x = xcr0();
  __cpuid_count(7, 0, a, b, c, d);
  return (b >> 16 & 1) && (x & 0xe6) == 0xe6;
}

/* F16C (leaf 1 ECX bit 29, with AVX: bit 28, and the YMM state XCR0 bits
 * 1-2): 8 conversions to and from fp16 an instruction. */
static int detect_f16c(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
  return (c >> 29 & 1) && (c >> 28 & 1) && (xcr0() & 0x6) == 0x6;
}

/* cpu_gemm_round_fp16's bulk on F16C: the hardware's round to nearest even,
 * overflow to infinity and subnormals are IEEE's, as dtype_f32_to_fp16's;
 * a NaN stays a NaN (its payload may differ, which no GEMM sees). */
__attribute__((target("avx,f16c"))) static void round_to_fp16_f16c(float *restrict dst, const float *restrict src,
                                                                     size_t n8) {
#pragma omp parallel for schedule(static) if (n8 >= PARALLEL_MIN)
  for (size_t i = 0; i < n8; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT)));
}
#else
static bf16_isa detect_bf16_isa(void) { return BF16_ISA_NONE; }
static int detect_avx512f(void) { return 0; }
#endif

int cpu_gemm_has_bf16(void) { return detect_bf16_isa() != BF16_ISA_NONE; }

int cpu_gemm_has_avx512(void) { return detect_avx512f(); }

float cpu_gemm_round_bf16(float x) { return dtype_bf16_to_f32(dtype_f32_to_bf16(x)); }

/* dst[i] = x[i] rounded to bf16, kept as fp32 (the emulated path). The same
 * rounding as dtype_f32_to_bf16, written out so that the loop vectorizes. */
static void round_to_bf16(float *restrict dst, const float *restrict src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    uint32_t u = dtype_f32_bits(src[i]);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    uint32_t nan = (u & 0xffff0000u) | 0x00400000u;
    dst[i] = dtype_bits_f32((u & 0x7fffffffu) > 0x7f800000u ? nan : r);
  }
}

int cpu_gemm_has_f16c(void) {
#if defined(__x86_64__) || defined(__i386__)
  return detect_f16c();
#else
  return 0;
#endif
}

void cpu_gemm_round_fp16(float *restrict dst, const float *restrict src, size_t n, int f16c) {
  size_t i = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (f16c) {
    round_to_fp16_f16c(dst, src, n / 8 * 8);
    i = n / 8 * 8;
  }
#else
  (void)f16c;
#endif
#pragma omp parallel for schedule(static) if (n - i >= PARALLEL_MIN)
  for (size_t k = i; k < n; k++) dst[k] = dtype_fp16_to_f32(dtype_f32_to_fp16(src[k]));
}

/* The emulated path's rounding of the operands. */
static void round_operand(const cpu_gemm *g, float *restrict dst, const float *restrict src, size_t n) {
  if (g->precision == DLREC_PRECISION_FP16) cpu_gemm_round_fp16(dst, src, n, g->f16c);
  else round_to_bf16(dst, src, n);
}

/* dst[i] = x[i] as bf16 (the oneDNN path). */
static void convert_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) dst[i] = dtype_f32_to_bf16(src[i]);
}

int cpu_gemm_keep(cpu_gemm *g, int on) {
  if (g->path != GEMM_ONEDNN) return 0;
  g->keep = on;
  for (uint32_t i = 0; i < g->n_kept; i++) g->kept[i].src = NULL;
  g->n_kept = 0;
  return 1;
}

int cpu_gemm_fresh(cpu_gemm *g, int on) {
  if (g->path == GEMM_FP32 && !g->f32) return 0;
  fresh_grads_set(&g->fresh, on);
  return 1;
}

/* Whether a dW GEMM adds to the n floats at dst (fresh_grads.h). */
static int accumulates(cpu_gemm *g, const float *dst, size_t n) { return fresh_grads_accumulates(&g->fresh, dst, n); }

/* The slot kept for src (n values) this pass, or NULL. */
static kept_operand *kept_find(cpu_gemm *g, const float *src, size_t n) {
  for (uint32_t i = 0; i < g->n_kept; i++)
    if (g->kept[i].src == src && g->kept[i].n == n) return &g->kept[i];
  return NULL;
}

/* The bf16 copy of src (n values) a forward reads: converted into its kept
 * slot while keeping (a new slot for a new source, while slots and memory
 * last), else into dst. */
static const uint16_t *convert_forward(cpu_gemm *g, uint16_t *dst, const float *src, size_t n) {
  kept_operand *k = g->keep ? kept_find(g, src, n) : NULL;
  if (g->keep && !k && g->n_kept < MAX_KEPT) {
    k = &g->kept[g->n_kept];
    void *p = NULL;
    if (k->cap < n && !posix_memalign(&p, 64, n * sizeof(uint16_t))) {
      free(k->h);
      k->h = p;
      k->cap = n;
    }
    if (k->cap >= n) {
      k->src = src;
      k->n = n;
      g->n_kept++;
    } else {
      k = NULL; /* out of memory: converted as without keeping */
    }
  }
  if (k) dst = k->h;
  convert_to_bf16(dst, src, n);
  return dst;
}

/* The bf16 copy of src (n values) a backward reads: the kept one, else
 * converted into dst. */
static const uint16_t *convert_backward(cpu_gemm *g, uint16_t *dst, const float *src, size_t n) {
  const kept_operand *k = kept_find(g, src, n);
  if (k) return k->h;
  convert_to_bf16(dst, src, n);
  return dst;
}

/* Scratch of at least n 4-byte values, grown (never shrunk) as layers need. */
static void *scratch(cpu_gemm *g, size_t n) {
  size_t bytes = n * 4;
  if (bytes <= g->scratch_bytes) return g->scratch;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes)) {
    dlrec_error(DLREC_ERR_NOMEM, "bf16 GEMM scratch of %zu bytes: out of memory", bytes);
    return NULL;
  }
  free(g->scratch);
  g->scratch = p;
  g->scratch_bytes = bytes;
  return p;
}

/* Chooses the fp32 GEMMs of GEMM_FP32 and GEMM_EMULATED (the rule in this
 * file's header) and names them in *engine. */
static dlrec_status choose_f32(cpu_gemm *g, const char **engine) {
  const char *env = getenv("DLREC_FP32_GEMM");
  int onednn;
  if (!env || !*env) onednn = cpu_gemm_has_avx512() && cpu_dnnl_available();
  else if (!strcmp(env, "onednn")) onednn = 1;
  else if (!strcmp(env, "openblas")) onednn = 0;
  else return dlrec_error(DLREC_ERR_INVALID, "DLREC_FP32_GEMM must be openblas or onednn, not \"%s\"", env);
  *engine = "OpenBLAS sgemm";
  if (!onednn) return DLREC_OK;
  if (cpu_dnnl_create(&g->f32, 0) != DLREC_OK)
    return dlrec_error_context(env && *env ? "DLREC_FP32_GEMM=onednn: " : "fp32 GEMMs on oneDNN: ");
  *engine = "oneDNN";
  return DLREC_OK;
}

/* The fp32 GEMMs, cpu_sgemm_linear_forward's (act NONE) and
 * cpu_sgemm_linear_relu_forward's (RELU) contracts: on oneDNN where chosen. */
static dlrec_status f32_forward(cpu_gemm *g, float *out, const float *in, const float *weight, const float *bias,
                                int B, int IN, int OUT, dlrec_act act) {
  if (!g->f32)
    return act == DLREC_ACT_RELU ? cpu_sgemm_linear_relu_forward(out, in, weight, bias, B, IN, OUT)
                                 : cpu_sgemm_linear_forward(out, in, weight, bias, B, IN, OUT);
  dlrec_status st = nn_check_linear("linear_forward", out, in, weight, B, IN, OUT);
  // out (B, OUT) = act(in (B, IN) · Wᵀ (IN, OUT) + bias); W is stored (OUT, IN), so B is transposed
  return st == DLREC_OK ? cpu_dnnl_matmul(g->f32, out, in, 0, weight, 1, bias, B, OUT, IN, act, 0) : st;
}

/* cpu_sgemm_linear_backward's contract, on oneDNN where chosen. */
static dlrec_status f32_backward(cpu_gemm *g, float *din, float *dweight, float *dbias, const float *dout,
                                 const float *in, const float *weight, int B, int IN, int OUT) {
  if (!g->f32) return cpu_sgemm_linear_backward(din, dweight, dbias, dout, in, weight, B, IN, OUT);
  dlrec_status st = nn_check_linear("linear_backward", dweight, dout, in, B, IN, OUT);
  if (st != DLREC_OK) return st;
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_backward: din needs the weights");
  // dW (OUT, IN) += doutᵀ (OUT, B) · in (B, IN); dout is stored (B, OUT), so A is transposed
  st = cpu_dnnl_matmul(g->f32, dweight, dout, 1, in, 0, NULL, OUT, IN, B, DLREC_ACT_NONE,
                       accumulates(g, dweight, (size_t)OUT * IN));
  // din (B, IN) = dout (B, OUT) · W (OUT, IN)
  if (st == DLREC_OK && din)
    st = cpu_dnnl_matmul(g->f32, din, dout, 0, weight, 0, NULL, B, IN, OUT, DLREC_ACT_NONE, 0);
  if (st == DLREC_OK && dbias) cpu_bias_backward(dbias, dout, B, OUT);
  return st;
}

/* One tiny bf16 matmul, so that a oneDNN without bf16 kernels for this CPU
 * (oneDNN 2.6 has none below AVX512) is refused when the backend is
 * created, not at the first training step. */
static dlrec_status probe(cpu_dnnl *d) {
  uint16_t one = dtype_f32_to_bf16(1.0f);
  float out = 0;
  dlrec_status s = cpu_dnnl_matmul(d, &out, &one, 0, &one, 0, NULL, 1, 1, 1, DLREC_ACT_NONE, 0);
  if (s == DLREC_OK && out != 1.0f)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "oneDNN's bf16 matmul computed 1 x 1 = %g", out);
  return s;
}

dlrec_status cpu_gemm_create(cpu_gemm **out, dlrec_precision precision, int *native) {
  *out = NULL;
  *native = 0;
  if (precision != DLREC_PRECISION_FP32 && precision != DLREC_PRECISION_BF16 && precision != DLREC_PRECISION_FP16)
    return dlrec_error(DLREC_ERR_INVALID, "GEMM precision must be resolved to fp32, bf16 or fp16, not %s",
                       dlrec_precision_name(precision));
  cpu_gemm *g = calloc(1, sizeof *g);
  if (!g) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  g->precision = precision;
  g->path = precision == DLREC_PRECISION_FP32 ? GEMM_FP32 : GEMM_EMULATED;
  dlrec_status s;
  if (precision == DLREC_PRECISION_BF16) {
    bf16_isa isa = detect_bf16_isa();
    const char *force = getenv("DLREC_BF16_FORCE_ONEDNN");
    int forced = force && !strcmp(force, "1");
    snprintf(g->describe, sizeof g->describe, "bf16 GEMMs (emulated: this CPU has no AVX512-BF16 or AMX)");
    if ((isa != BF16_ISA_NONE || forced) && cpu_dnnl_available()) {
      s = cpu_dnnl_create(&g->dnnl, 1);
      if (s == DLREC_OK) s = probe(g->dnnl);
      if (s != DLREC_OK) {
        cpu_gemm_free(g);
        if (forced && isa == BF16_ISA_NONE)
          return dlrec_error_context("DLREC_BF16_FORCE_ONEDNN=1 on a CPU without AVX512-BF16 or AMX "
                                     "(unset it to emulate bf16): ");
        return dlrec_error_context("bf16 GEMMs on oneDNN: ");
      }
      g->path = GEMM_ONEDNN;
      *native = isa != BF16_ISA_NONE;
      if (isa != BF16_ISA_NONE)
        snprintf(g->describe, sizeof g->describe, "bf16 GEMMs (oneDNN, %s)",
                 isa == BF16_ISA_AMX ? "AMX" : "AVX512-BF16");
      else
        snprintf(g->describe, sizeof g->describe,
                 "bf16 GEMMs (oneDNN forced by DLREC_BF16_FORCE_ONEDNN, not native: this CPU has no "
                 "AVX512-BF16 or AMX)");
    } else if (forced) {
      cpu_gemm_free(g);
      return dlrec_error(DLREC_ERR_UNSUPPORTED,
                         "DLREC_BF16_FORCE_ONEDNN=1, but this build has no oneDNN (install libdnnl-dev: "
                         "scripts/deps.sh build, and reconfigure)");
    } else if (isa != BF16_ISA_NONE) {
      snprintf(g->describe, sizeof g->describe, "bf16 GEMMs (emulated: this build has no oneDNN)");
    }
  }
  if (g->path != GEMM_ONEDNN) { /* the fp32 GEMMs run, on rounded operands where emulating */
    const char *engine = NULL;
    if ((s = choose_f32(g, &engine)) != DLREC_OK) {
      cpu_gemm_free(g);
      return s;
    }
    if (precision == DLREC_PRECISION_FP32) snprintf(g->describe, sizeof g->describe, "fp32 GEMMs (%s)", engine);
    if (precision == DLREC_PRECISION_FP16) {
      snprintf(g->describe, sizeof g->describe, "fp16 GEMMs (emulated: fp16-rounded operands on %s)", engine);
      g->f16c = cpu_gemm_has_f16c();
    }
  }
  *out = g;
  return DLREC_OK;
}

void cpu_gemm_free(cpu_gemm *g) {
  if (!g) return;
  cpu_dnnl_free(g->dnnl);
  cpu_dnnl_free(g->f32);
  free(g->scratch);
  for (uint32_t i = 0; i < MAX_KEPT; i++) free(g->kept[i].h);
  free(g);
}

const char *cpu_gemm_describe(const cpu_gemm *g) { return g->describe; }

dlrec_status cpu_linear_forward(cpu_gemm *g, float *out, const float *in, const float *weight, const float *bias,
                                int B, int IN, int OUT, dlrec_act act) {
  if (!g)
    return act == DLREC_ACT_RELU ? cpu_sgemm_linear_relu_forward(out, in, weight, bias, B, IN, OUT)
                                 : cpu_sgemm_linear_forward(out, in, weight, bias, B, IN, OUT);
  if (g->path == GEMM_FP32) return f32_forward(g, out, in, weight, bias, B, IN, OUT, act);
  dlrec_status st = nn_check_linear("linear_forward", out, in, weight, B, IN, OUT);
  if (st != DLREC_OK) return st;
  size_t n_in = (size_t)B * IN, n_w = (size_t)OUT * IN;
  float *s = scratch(g, n_in + n_w);
  if (!s) return DLREC_ERR_NOMEM;
  if (g->path == GEMM_EMULATED) {
    float *in_r = s, *w_r = s + n_in;
    round_operand(g, in_r, in, n_in);
    round_operand(g, w_r, weight, n_w);
    return f32_forward(g, out, in_r, w_r, bias, B, IN, OUT, act);
  }
  const uint16_t *in_h = convert_forward(g, (uint16_t *)s, in, n_in);
  const uint16_t *w_h = convert_forward(g, (uint16_t *)s + n_in, weight, n_w);
  // out (B, OUT) = act(in (B, IN) · Wᵀ (IN, OUT) + bias); W is stored (OUT, IN), so B is transposed
  return cpu_dnnl_matmul(g->dnnl, out, in_h, 0, w_h, 1, bias, B, OUT, IN, act, 0);
}

/* The backward's GEMMs on oneDNN's bf16 path, dout already bf16 (dout_h,
 * B·OUT values), the input and weights converted into s (or kept). */
static dlrec_status bf16_backward_gemms(cpu_gemm *g, float *din, float *dweight, const uint16_t *dout_h,
                                        const float *in, const float *weight, uint16_t *s, int B, int IN, int OUT) {
  const size_t n_in = (size_t)B * IN;
  const uint16_t *in_h = convert_backward(g, s, in, n_in);
  // dW (OUT, IN) += doutᵀ (OUT, B) · in (B, IN); dout is stored (B, OUT), so A is transposed
  dlrec_status st = cpu_dnnl_matmul(g->dnnl, dweight, dout_h, 1, in_h, 0, NULL, OUT, IN, B, DLREC_ACT_NONE,
                                    accumulates(g, dweight, (size_t)OUT * IN));
  if (st != DLREC_OK || !din) return st;
  const uint16_t *w_h = convert_backward(g, s + n_in, weight, (size_t)OUT * IN);
  // din (B, IN) = dout (B, OUT) · W (OUT, IN)
  return cpu_dnnl_matmul(g->dnnl, din, dout_h, 0, w_h, 0, NULL, B, IN, OUT, DLREC_ACT_NONE, 0);
}

dlrec_status cpu_linear_backward(cpu_gemm *g, float *din, float *dweight, float *dbias, const float *dout,
                                 const float *in, const float *weight, int B, int IN, int OUT) {
  if (!g) return cpu_sgemm_linear_backward(din, dweight, dbias, dout, in, weight, B, IN, OUT);
  if (g->path == GEMM_FP32) return f32_backward(g, din, dweight, dbias, dout, in, weight, B, IN, OUT);
  dlrec_status st = nn_check_linear("linear_backward", dweight, dout, in, B, IN, OUT);
  if (st != DLREC_OK) return st;
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_backward: din needs the weights");
  size_t n_dout = (size_t)B * OUT, n_in = (size_t)B * IN, n_w = din ? (size_t)OUT * IN : 0;
  float *s = scratch(g, n_dout + n_in + n_w);
  if (!s) return DLREC_ERR_NOMEM;
  if (g->path == GEMM_EMULATED) {
    float *dout_r = s, *in_r = s + n_dout, *w_r = din ? in_r + n_in : NULL;
    round_operand(g, dout_r, dout, n_dout);
    round_operand(g, in_r, in, n_in);
    if (din) round_operand(g, w_r, weight, n_w);
    st = f32_backward(g, din, dweight, NULL, dout_r, in_r, w_r, B, IN, OUT);
  } else {
    uint16_t *dout_h = (uint16_t *)s;
    convert_to_bf16(dout_h, dout, n_dout);
    st = bf16_backward_gemms(g, din, dweight, dout_h, in, weight, dout_h + n_dout, B, IN, OUT);
  }
  if (st != DLREC_OK) return st;
  if (dbias) cpu_bias_backward(dbias, dout, B, OUT); /* on the unrounded dout */
  return DLREC_OK;
}

/* The ReLU's backward fused with what the linear backward then does to its
 * output, as cross_gate_backward_bf16 below does for the cross gate: d =
 * dout where out > 0, else 0, goes straight to bf16 (d_h), and dbias (unless
 * NULL) += the unrounded d's column sums, in nn_column_width's ranges with
 * rows in order, as cpu_bias_backward sums. The same bits as
 * cpu_relu_backward followed by the linear backward's conversion and bias
 * pass, in one read of dout and out instead of three. */
static void relu_backward_bf16(uint16_t *restrict d_h, float *restrict dbias, const float *restrict dout,
                               const float *restrict out, int B, int C) {
  const int width = nn_column_width(C, (size_t)B * (size_t)C, PARALLEL_MIN);
  const int ranges = (C + width - 1) / width;
#pragma omp parallel for schedule(static) if (ranges > 1)
  for (int k = 0; k < ranges; k++) {
    const int o0 = k * width, o1 = o0 + width < C ? o0 + width : C;
    for (int b = 0; b < B; b++) {
      const size_t r = (size_t)b * (size_t)C;
      if (dbias) {
        for (int o = o0; o < o1; o++) {
          const float d = out[r + o] > 0.0f ? dout[r + o] : 0.0f;
          d_h[r + o] = dtype_f32_to_bf16(d);
          dbias[o] += d;
        }
      } else {
        for (int o = o0; o < o1; o++) d_h[r + o] = dtype_f32_to_bf16(out[r + o] > 0.0f ? dout[r + o] : 0.0f);
      }
    }
  }
}

dlrec_status cpu_linear_relu_backward(cpu_gemm *g, float *din, float *dweight, float *dbias, float *dout,
                                      const float *out, const float *in, const float *weight, int B, int IN, int OUT) {
  dlrec_status st = nn_check_linear("linear_relu_backward", dweight, dout, in, B, IN, OUT);
  if (st == DLREC_OK && !out) st = dlrec_error(DLREC_ERR_INVALID, "linear_relu_backward: NULL buffer");
  if (st == DLREC_OK && din && !weight)
    st = dlrec_error(DLREC_ERR_INVALID, "linear_relu_backward: din needs the weights");
  if (st != DLREC_OK) return st;
  const size_t n_dout = (size_t)B * OUT;
  if (!g || g->path != GEMM_ONEDNN) {
    cpu_relu_backward(dout, dout, out, n_dout);
    return cpu_linear_backward(g, din, dweight, dbias, dout, in, weight, B, IN, OUT);
  }
  uint16_t *s = scratch(g, n_dout + (size_t)B * IN + (din ? (size_t)OUT * IN : 0));
  if (!s) return DLREC_ERR_NOMEM;
  relu_backward_bf16(s, dbias, dout, out, B, OUT);
  return bf16_backward_gemms(g, din, dweight, s, in, weight, s + n_dout, B, IN, OUT);
}

int cpu_gemm_fuses_cross(const cpu_gemm *g) { return g && g->path == GEMM_ONEDNN; }

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* the products below are rounded as cross.c's, which turns contraction off too */
#endif

/* The cross gate's backward, fused with what the linear backward then does
 * to its output: du = dout ⊙ x0 goes straight to bf16 (du_h), dx0 += dout ⊙
 * u, and dbias += the unrounded du's column sums, in nn_column_width's
 * ranges with rows in order, as cpu_bias_backward sums. The same bits as
 * cross.c's gate_backward followed by the linear backward's conversion and
 * bias pass, in one read of dout, x0 and u instead of three. */
static void cross_gate_backward_bf16(uint16_t *restrict du_h, float *restrict dx0, float *restrict dbias,
                                     const float *restrict dout, const float *restrict x0, const float *restrict u,
                                     int B, int d) {
  const int width = nn_column_width(d, (size_t)B * (size_t)d, PARALLEL_MIN);
  const int ranges = (d + width - 1) / width;
#pragma omp parallel for schedule(static) if (ranges > 1)
  for (int k = 0; k < ranges; k++) {
    const int o0 = k * width, o1 = o0 + width < d ? o0 + width : d;
    for (int b = 0; b < B; b++) {
      const size_t r = (size_t)b * (size_t)d;
      for (int o = o0; o < o1; o++) {
        const float t = dout[r + o] * x0[r + o];
        const float p = dout[r + o] * u[r + o];
        du_h[r + o] = dtype_f32_to_bf16(t);
        dx0[r + o] += p;
        dbias[o] += t;
      }
    }
  }
}

dlrec_status cpu_gemm_cross_backward(cpu_gemm *g, float *dx0, float *dxl, float *dw, float *dbias, const float *dout,
                                     const float *x0, const float *xl, const float *u, const float *w, float *ws,
                                     int B, int d) {
  if (g->path != GEMM_ONEDNN)
    return dlrec_error(DLREC_ERR_INTERNAL, "cross_backward: the fused kernel runs on oneDNN's bf16 path only");
  dlrec_status st = NN_NONNULL("cross_backward", dx0, dxl, dw, dbias, dout, x0, xl, u, w, ws);
  if (st == DLREC_OK) st = nn_check_cross("cross_backward", B, d, 0);
  if (st != DLREC_OK) return st;
  const size_t n = (size_t)B * d, n_w = (size_t)d * d;
  uint16_t *du_h = (uint16_t *)ws; /* B·d bf16 in the caller's B·d floats */
  uint16_t *s = scratch(g, (n + n_w + 1) / 2);
  if (!s) return DLREC_ERR_NOMEM;
  cross_gate_backward_bf16(du_h, dx0, dbias, dout, x0, u, B, d);
  const uint16_t *xl_h = convert_backward(g, s, xl, n), *w_h = convert_backward(g, s + n, w, n_w);
  // dW (d, d) += duᵀ (d, B) · xl (B, d)
  st = cpu_dnnl_matmul(g->dnnl, dw, du_h, 1, xl_h, 0, NULL, d, d, B, DLREC_ACT_NONE, accumulates(g, dw, n_w));
  // dxl (B, d) = du (B, d) · W (d, d), then the residual
  if (st == DLREC_OK) st = cpu_dnnl_matmul(g->dnnl, dxl, du_h, 0, w_h, 0, NULL, B, d, d, DLREC_ACT_NONE, 0);
  return st == DLREC_OK ? cpu_add(dxl, dout, n) : st;
}
