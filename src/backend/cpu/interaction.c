/* DLRM's pairwise dot interaction: forward and backward.
 *
 * Per sample the work is a small Gram matrix: Z = [x; e_1 .. e_F] is (F+1, D)
 * and the output keeps the strictly lower triangle of Z Zᵀ (27 x 27 of width
 * 16 for Criteo Kaggle: 351 dot products). One sgemm call per sample would
 * cost more in call overhead than in arithmetic, so each sample runs a small
 * register-blocked kernel, and OpenMP splits the batch.
 *
 * Forward: a dot product of width 16 vectorizes only as a horizontal
 * reduction, which C cannot express without reassociating float sums.
 * Instead each sample's Z is transposed into a (D, F+1) scratch on the
 * stack, and the triangle is computed in blocks of RB = 4 rows x 16 outputs:
 *   acc[i][j..j+16) += Z[i][d] * Zᵀ[d][j..j+16)   for d in order,
 * an outer-product form: per d, 4 broadcasts and 2 vector loads feed 8
 * independent vector multiply-adds, enough to hide their latency (a single
 * accumulator chain runs at a quarter of the speed). Each output is still
 * summed over d in order, like the naive loop. Blocks reach past the
 * triangle's diagonal; the extra products are computed and dropped.
 *
 * Backward: with g the output gradient of the pairs and S the symmetric
 * (F+1, F+1) matrix holding g off the diagonal, dZ = S Z, which vectorizes
 * along D with no transpose: for 4 rows at a time,
 *   acc[i][d..d+16) += S[i][k] * Z[k][d..d+16)   for k in order,
 * where S[i][k] is read from the triangle as g[i][k] for k < i (row i of the
 * triangle) and g[k][i] for k > i (4 consecutive values of row k). Each row
 * of dZ is written once: no scratch, no zeroing.
 *
 * The accumulators are GNU C vectors of 8 floats held in named variables:
 * GCC keeps plain arrays of accumulators in memory here, at a third of the
 * speed. Kernels are instantiated for common widths (D = 16, 32, 64, 128)
 * so that the loops along D unroll; other widths take generic loops.
 */
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#define MAX_F 256
#define MAX_D 4096
/* Columns of D transposed at a time: the stack scratch is DCHUNK x FPAD_MAX. */
#define DCHUNK 32
/* Outputs of a forward block row; Zᵀ's rows are padded to a multiple of it
 * so that a block never reads past them. */
#define JB 16
#define FPAD_MAX (((MAX_F + 1) + JB - 1) / JB * JB)

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Eight floats in a register: AVX where the target has it; GCC and Clang
 * lower it to SSE pairs or scalars elsewhere. */
typedef float vf8 __attribute__((vector_size(32)));

static ALWAYS_INLINE vf8 vf8_load(const float *p) {
  vf8 v;
  memcpy(&v, p, sizeof v); /* unaligned */
  return v;
}

static ALWAYS_INLINE void vf8_store(float *p, vf8 v) { memcpy(p, &v, sizeof v); }

size_t dlrec_interaction_dot_dim(int F, int D) {
  if (F < 1 || F > MAX_F || D < 1 || D > MAX_D) return 0;
  return (size_t)D + (size_t)F * (size_t)(F + 1) / 2;
}

/* Row i of Z for one sample: x for i = 0, else embedding i-1. */
static ALWAYS_INLINE const float *zrow(const float *x, const float *emb, int i, int D) {
  return i == 0 ? x : emb + (size_t)(i - 1) * D;
}

/* Where row i (pairs (i, 0 .. i-1)) starts in the triangle. */
static ALWAYS_INLINE size_t tri_row(int i) { return (size_t)i * (size_t)(i - 1) / 2; }

static ALWAYS_INLINE int min_int(int a, int b) { return a < b ? a : b; }

/* dst[0 .. n) = src[0 .. n) for 0 < n <= JB, as a few fixed-size copies: a
 * variable-length loop becomes a memcpy call or `rep movs`, whose start-up
 * cost exceeds the copy of a few floats. */
static ALWAYS_INLINE void store_n(float *restrict dst, const float *restrict src, int n) {
  if (n == JB) {
    memcpy(dst, src, JB * sizeof(float));
    return;
  }
  int at = 0;
  for (int w = JB / 2; w >= 1; w /= 2)
    if (n & w) {
      for (int l = 0; l < w; l++) dst[at + l] = src[at + l];
      at += w;
    }
}

/* ---- forward ------------------------------------------------------------ */

/* One sample's forward. out (D + F(F+1)/2), x (D), emb (F, D); zt is this
 * thread's (DCHUNK, fpad) scratch whose columns F+1 .. fpad-1 are zero. */
static ALWAYS_INLINE void forward_sample(float *restrict out, const float *restrict x, const float *restrict emb,
                                         int F, int D, int fpad, float *restrict zt) {
  memcpy(out, x, (size_t)D * sizeof(float));
  float *restrict tri = out + D;
  for (int d0 = 0; d0 < D; d0 += DCHUNK) {
    /* Written so that dn folds to a constant when D does. */
    const int dn = D <= DCHUNK ? D : D % DCHUNK == 0 ? DCHUNK : min_int(D - d0, DCHUNK);
    for (int i = 0; i <= F; i++) {
      const float *zi = zrow(x, emb, i, D) + d0;
      for (int d = 0; d < dn; d++) zt[d * fpad + i] = zi[d];
    }
    for (int i0 = 1; i0 <= F; i0 += 4) {
      const int last = min_int(i0 + 3, F); /* the block's longest row */
      /* Rows past F compute on row F; their results are dropped. */
      const float *z0 = zrow(x, emb, i0, D) + d0, *z1 = zrow(x, emb, min_int(i0 + 1, F), D) + d0,
                  *z2 = zrow(x, emb, min_int(i0 + 2, F), D) + d0, *z3 = zrow(x, emb, min_int(i0 + 3, F), D) + d0;
      for (int j0 = 0; j0 < last; j0 += JB) {
        float res[4][JB] = {{0}};
        if (d0 > 0) /* later chunks of D continue the sums where earlier ones stopped */
          for (int r = 0; r < 4 && i0 + r <= F; r++)
            for (int l = 0; l < min_int(JB, i0 + r - j0); l++) res[r][l] = tri[tri_row(i0 + r) + j0 + l];
        vf8 a0 = vf8_load(res[0]), b0 = vf8_load(res[0] + 8), a1 = vf8_load(res[1]), b1 = vf8_load(res[1] + 8);
        vf8 a2 = vf8_load(res[2]), b2 = vf8_load(res[2] + 8), a3 = vf8_load(res[3]), b3 = vf8_load(res[3] + 8);
        for (int d = 0; d < dn; d++) {
          const float *zt_d = zt + d * fpad + j0; /* j0 + JB <= fpad */
          const vf8 lo = vf8_load(zt_d), hi = vf8_load(zt_d + 8);
          const float s0 = z0[d], s1 = z1[d], s2 = z2[d], s3 = z3[d];
          a0 += s0 * lo, b0 += s0 * hi, a1 += s1 * lo, b1 += s1 * hi;
          a2 += s2 * lo, b2 += s2 * hi, a3 += s3 * lo, b3 += s3 * hi;
        }
        vf8_store(res[0], a0), vf8_store(res[0] + 8, b0), vf8_store(res[1], a1), vf8_store(res[1] + 8, b1);
        vf8_store(res[2], a2), vf8_store(res[2] + 8, b2), vf8_store(res[3], a3), vf8_store(res[3] + 8, b3);
        for (int r = 0; r < 4 && i0 + r <= F; r++)
          if (i0 + r > j0) store_n(tri + tri_row(i0 + r) + j0, res[r], min_int(JB, i0 + r - j0));
      }
    }
  }
}

/* ---- backward ----------------------------------------------------------- */

/* Zeros standing in for the triangle rows of block rows past F. */
static const float zero_row[MAX_F + 1] = {0};

/* S[i][k] for the 4 rows of the block at i0, into s[4]; k < i0 + 4. */
static ALWAYS_INLINE void coefficients(float s[4], const float *const srow[4], const float *tri, int i0, int k,
                                       int F) {
  for (int r = 0; r < 4; r++) {
    const int i = i0 + r;
    s[r] = i > F || i == k ? 0.0f : k < i ? srow[r][k] : tri[tri_row(k) + i];
  }
}

/* One sample's backward for D a multiple of 16. dx (D), demb (F, D),
 * dout (D + F(F+1)/2). Rows are summed over k in order. */
static ALWAYS_INLINE void backward_sample_v16(float *restrict dx, float *restrict demb, const float *restrict dout,
                                              const float *restrict x, const float *restrict emb, int F, int D) {
  const float *tri = dout + D;
  for (int i0 = 0; i0 <= F; i0 += 4) {
    /* Row i of the triangle holds S[i][k] for k < i; rows past F read zeros. */
    const float *srow[4];
    for (int r = 0; r < 4; r++) srow[r] = i0 + r <= F ? tri + tri_row(i0 + r) : zero_row;
    for (int d0 = 0; d0 < D; d0 += 16) {
      const vf8 zero = {0};
      vf8 a0 = zero, b0 = zero, a1 = zero, b1 = zero, a2 = zero, b2 = zero, a3 = zero, b3 = zero;
      if (i0 == 0) { /* dx also gets the gradient of the copy of x at the output's start */
        a0 = vf8_load(dout + d0);
        b0 = vf8_load(dout + d0 + 8);
      }
#define ACCUMULATE(c0, c1, c2, c3)                                                                                  \
  do {                                                                                                             \
    const float s0 = (c0), s1 = (c1), s2 = (c2), s3 = (c3);                                                        \
    const vf8 lo = vf8_load(zk), hi = vf8_load(zk + 8);                                                            \
    a0 += s0 * lo, b0 += s0 * hi, a1 += s1 * lo, b1 += s1 * hi;                                                    \
    a2 += s2 * lo, b2 += s2 * hi, a3 += s3 * lo, b3 += s3 * hi;                                                    \
  } while (0)
      /* k below the block: every row reads its own triangle row. */
      for (int k = 0; k < i0; k++) {
        const float *zk = zrow(x, emb, k, D) + d0;
        ACCUMULATE(srow[0][k], srow[1][k], srow[2][k], srow[3][k]);
      }
      /* k inside the block: below, on or above each row's diagonal. */
      for (int k = i0; k <= min_int(i0 + 3, F); k++) {
        const float *zk = zrow(x, emb, k, D) + d0;
        float s[4];
        coefficients(s, srow, tri, i0, k, F);
        ACCUMULATE(s[0], s[1], s[2], s[3]);
      }
      /* k above the block: 4 consecutive values of triangle row k. Block
       * rows past F exist only in the last block, which has no k above it. */
      for (int k = i0 + 4; k <= F; k++) {
        const float *zk = zrow(x, emb, k, D) + d0;
        const float *sk = tri + tri_row(k) + i0;
        ACCUMULATE(sk[0], sk[1], sk[2], sk[3]);
      }
#undef ACCUMULATE
      /* Row i of dZ is dx for i = 0, else embedding i-1's gradient. */
      float *dz[4];
      for (int r = 0; r < 4; r++) dz[r] = i0 + r == 0 ? dx : demb + (size_t)(i0 + r - 1) * D;
      vf8_store(dz[0] + d0, a0), vf8_store(dz[0] + d0 + 8, b0);
      if (i0 + 1 <= F) vf8_store(dz[1] + d0, a1), vf8_store(dz[1] + d0 + 8, b1);
      if (i0 + 2 <= F) vf8_store(dz[2] + d0, a2), vf8_store(dz[2] + d0 + 8, b2);
      if (i0 + 3 <= F) vf8_store(dz[3] + d0, a3), vf8_store(dz[3] + d0 + 8, b3);
    }
  }
}

/* The same for any D, one row at a time with plain loops along D: the
 * summation order per element is the same (over k in order). */
static void backward_sample_any(float *restrict dx, float *restrict demb, const float *restrict dout,
                                const float *restrict x, const float *restrict emb, int F, int D) {
  const float *tri = dout + D;
  for (int i = 0; i <= F; i++) {
    float *dz = i == 0 ? dx : demb + (size_t)(i - 1) * D;
    for (int d = 0; d < D; d++) dz[d] = i == 0 ? dout[d] : 0.0f;
    for (int k = 0; k <= F; k++) {
      if (k == i) continue;
      const float s = k < i ? tri[tri_row(i) + k] : tri[tri_row(k) + i];
      const float *zk = zrow(x, emb, k, D);
      for (int d = 0; d < D; d++) dz[d] += s * zk[d];
    }
  }
}

/* ---- entry points --------------------------------------------------------- */

dlrec_status nn_check_dot(const char *what, const void *a, const void *b, const void *c, int B, int F, int D) {
  if (!a || !b || !c) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1 || F < 1 || F > MAX_F || D < 1 || D > MAX_D)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d F=%d D=%d (F <= %d, D <= %d)", what, B, F, D, MAX_F,
                       MAX_D);
  return DLREC_OK;
}

/* One sample, with D a compile-time constant where a case passes one. The
 * switch sits inside the parallel loop because GCC outlines an OpenMP region
 * before inlining: a region inside an inlined helper is compiled once, with
 * D a run-time value. */
static void forward_one(float *out, const float *x, const float *emb, int F, int D, int fpad, float *zt) {
  switch (D) {
  case 16: forward_sample(out, x, emb, F, 16, fpad, zt); break;
  case 32: forward_sample(out, x, emb, F, 32, fpad, zt); break;
  case 64: forward_sample(out, x, emb, F, 64, fpad, zt); break;
  case 128: forward_sample(out, x, emb, F, 128, fpad, zt); break;
  default: forward_sample(out, x, emb, F, D, fpad, zt); break;
  }
}

static void backward_one(float *dx, float *demb, const float *dout, const float *x, const float *emb, int F, int D) {
  switch (D) {
  case 16: backward_sample_v16(dx, demb, dout, x, emb, F, 16); break;
  case 32: backward_sample_v16(dx, demb, dout, x, emb, F, 32); break;
  case 64: backward_sample_v16(dx, demb, dout, x, emb, F, 64); break;
  case 128: backward_sample_v16(dx, demb, dout, x, emb, F, 128); break;
  default:
    if (D % 16 == 0) backward_sample_v16(dx, demb, dout, x, emb, F, D);
    else backward_sample_any(dx, demb, dout, x, emb, F, D);
    break;
  }
}

dlrec_status cpu_dot_forward(float *out, const float *x, const float *emb, int B, int F, int D) {
  dlrec_status st = nn_check_dot("interaction_dot_forward", out, x, emb, B, F, D);
  if (st != DLREC_OK) return st;
  const size_t W = dlrec_interaction_dot_dim(F, D);
  const int fpad = (F + 1 + JB - 1) / JB * JB;
#pragma omp parallel if (B > 64)
  {
    float zt[DCHUNK * FPAD_MAX];
    for (int d = 0; d < DCHUNK; d++)
      for (int i = F + 1; i < fpad; i++) zt[d * fpad + i] = 0.0f;
#pragma omp for schedule(static)
    for (int b = 0; b < B; b++)
      forward_one(out + (size_t)b * W, x + (size_t)b * D, emb + (size_t)b * F * D, F, D, fpad, zt);
  }
  return DLREC_OK;
}

dlrec_status cpu_dot_backward(float *dx, float *demb, const float *dout, const float *x,
                                            const float *emb, int B, int F, int D) {
  dlrec_status st = nn_check_dot("interaction_dot_backward", dx, demb, dout, B, F, D);
  if (st != DLREC_OK) return st;
  if (!x || !emb) return dlrec_error(DLREC_ERR_INVALID, "interaction_dot_backward: NULL buffer");
  const size_t W = dlrec_interaction_dot_dim(F, D);
#pragma omp parallel for schedule(static) if (B > 64)
  for (int b = 0; b < B; b++)
    backward_one(dx + (size_t)b * D, demb + (size_t)b * F * D, dout + (size_t)b * W, x + (size_t)b * D,
                 emb + (size_t)b * F * D, F, D);
  return DLREC_OK;
}

/* ---- the concat interaction ------------------------------------------------ */

/* DLRM's "cat" interaction: the dense vector followed by the embeddings,
 * flattened. Plain copies per sample, so its output is trivially
 * batch-invariant; OpenMP splits large batches. */

#define MAX_DX 65536

size_t dlrec_interaction_concat_dim(int DX, int F, int D) {
  if (DX < 0 || DX > MAX_DX || F < 1 || F > MAX_F || D < 1 || D > MAX_D) return 0;
  return (size_t)DX + (size_t)F * (size_t)D;
}

dlrec_status nn_check_concat(const char *what, const void *a, const void *b, int B, int DX, int F, int D) {
  if (!a || !b) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1 || !dlrec_interaction_concat_dim(DX, F, D))
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d DX=%d F=%d D=%d (0 <= DX <= %d, F <= %d, D <= %d)",
                       what, B, DX, F, D, MAX_DX, MAX_F, MAX_D);
  return DLREC_OK;
}

dlrec_status cpu_concat_forward(float *out, const float *x, const float *emb, int B, int DX, int F,
                                              int D) {
  dlrec_status st = nn_check_concat("interaction_concat_forward", out, emb, B, DX, F, D);
  if (st != DLREC_OK) return st;
  if (DX > 0 && !x)
    return dlrec_error(DLREC_ERR_INVALID, "interaction_concat_forward: NULL dense buffer with DX=%d", DX);
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
#pragma omp parallel for schedule(static) if ((size_t)B * W >= 32768)
  for (int b = 0; b < B; b++) {
    float *o = out + (size_t)b * W;
    if (DX > 0) memcpy(o, x + (size_t)b * DX, (size_t)DX * sizeof(float));
    memcpy(o + DX, emb + (size_t)b * FD, FD * sizeof(float));
  }
  return DLREC_OK;
}

dlrec_status cpu_concat_backward(float *dx, float *demb, const float *dout, int B, int DX, int F,
                                               int D) {
  dlrec_status st = nn_check_concat("interaction_concat_backward", demb, dout, B, DX, F, D);
  if (st != DLREC_OK) return st;
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
#pragma omp parallel for schedule(static) if ((size_t)B * W >= 32768)
  for (int b = 0; b < B; b++) {
    const float *g = dout + (size_t)b * W;
    if (dx && DX > 0) memcpy(dx + (size_t)b * DX, g, (size_t)DX * sizeof(float));
    memcpy(demb + (size_t)b * FD, g + DX, FD * sizeof(float));
  }
  return DLREC_OK;
}
