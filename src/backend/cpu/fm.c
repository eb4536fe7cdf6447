/* The factorization machine's second-order term over pooled embeddings.
 *
 * Rendle's identity turns the F(F−1)/2 pairwise dot products into two sums
 * per embedding coordinate:
 *   Σ_{f<g} <e_f, e_g> = ½ Σ_d ((Σ_f e_fd)² − Σ_f e_fd²)
 * which costs 3·F·D flops per sample instead of F²·D. The per-d sums run over
 * f in order in fp32, vectorized along d (the rows e_f are contiguous); the
 * sum over d runs in double in order. A sample's value is thus one fixed
 * chain of operations on its own row: batch-invariant, with no separate
 * inference path. OpenMP splits the batch.
 */
#include <stddef.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#define MAX_F 65536
#define MAX_D 4096
/* Coordinates of d summed at a time: the stack scratch is 2 x DCHUNK floats. */
#define DCHUNK 256

dlrec_status nn_check_fm(const char *what, const void *a, const void *b, int B, int F, int D) {
  if (!a || !b) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1 || F < 1 || F > MAX_F || D < 1 || D > MAX_D)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d F=%d D=%d (F <= %d, D <= %d)", what, B, F, D, MAX_F,
                       MAX_D);
  return DLREC_OK;
}

/* s[j] = Σ_f e[f][d0 + j], and q[j] = Σ_f e[f][d0 + j]² when q is not NULL,
 * for j < n; e is one sample's (F, D). */
static void column_sums(float *restrict s, float *restrict q, const float *restrict e, int F, int D, int d0, int n) {
  for (int j = 0; j < n; j++) s[j] = 0.0f;
  if (q)
    for (int j = 0; j < n; j++) q[j] = 0.0f;
  for (int f = 0; f < F; f++) {
    const float *row = e + (size_t)f * D + d0;
    for (int j = 0; j < n; j++) s[j] += row[j];
    if (q)
      for (int j = 0; j < n; j++) q[j] += row[j] * row[j];
  }
}

dlrec_status cpu_fm_forward(float *out, const float *emb, int B, int F, int D) {
  dlrec_status st = nn_check_fm("fm_forward", out, emb, B, F, D);
  if (st != DLREC_OK) return st;
  const size_t FD = (size_t)F * D;
#pragma omp parallel for schedule(static) if ((size_t)B * FD >= 32768)
  for (int b = 0; b < B; b++) {
    float s[DCHUNK], q[DCHUNK];
    double acc = 0.0;
    for (int d0 = 0; d0 < D; d0 += DCHUNK) {
      const int n = D - d0 < DCHUNK ? D - d0 : DCHUNK;
      column_sums(s, q, emb + (size_t)b * FD, F, D, d0, n);
      for (int j = 0; j < n; j++) acc += (double)s[j] * s[j] - q[j];
    }
    out[b] = (float)(0.5 * acc);
  }
  return DLREC_OK;
}

dlrec_status cpu_fm_backward(float *demb, const float *dout, const float *emb, int B, int F, int D) {
  dlrec_status st = nn_check_fm("fm_backward", demb, dout, B, F, D);
  if (st == DLREC_OK && !emb) st = dlrec_error(DLREC_ERR_INVALID, "fm_backward: NULL buffer");
  if (st != DLREC_OK) return st;
  const size_t FD = (size_t)F * D;
#pragma omp parallel for schedule(static) if ((size_t)B * FD >= 32768)
  for (int b = 0; b < B; b++) {
    float s[DCHUNK];
    const float g = dout[b];
    const float *e = emb + (size_t)b * FD;
    float *de = demb + (size_t)b * FD;
    for (int d0 = 0; d0 < D; d0 += DCHUNK) {
      const int n = D - d0 < DCHUNK ? D - d0 : DCHUNK;
      column_sums(s, NULL, e, F, D, d0, n);
      for (int f = 0; f < F; f++) {
        const float *row = e + (size_t)f * D + d0;
        float *drow = de + (size_t)f * D + d0;
        for (int j = 0; j < n; j++) drow[j] = g * (s[j] - row[j]);
      }
    }
  }
  return DLREC_OK;
}
