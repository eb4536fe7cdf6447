/* Inverted dropout with a counter-based mask.
 *
 * Whether element i is kept is a pure function of (seed, step, i): the key
 * (seed, step) is mixed once per call, and each element's 64-bit draw is
 * mix64(key + (i + 1)·golden), SplitMix64's output for counter i. Nothing is
 * carried from element to element, so any thread split gives the same mask,
 * a resumed run redraws the mask of a step exactly, and the backward
 * recomputes it instead of storing a byte per activation.
 *
 * An element is kept when the top 32 bits of its draw are at least
 * p·2³², so the keep probability is 1 − p to within 2⁻³². Kept values are
 * scaled by 1/(1 − p) (computed once in fp32), so the expectation of the
 * output is the input and inference is the identity.
 */
#include <string.h>

#include "core/hash.h"
#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#define PARALLEL_MIN 32768
#define GOLDEN 0x9e3779b97f4a7c15ULL

typedef nn_dropout_mask mask;

dlrec_status nn_dropout_mask_make(mask *m, const char *what, const void *a, const void *b, float p, uint64_t seed,
                                  uint64_t step) {
  if (!a || !b) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (!(p >= 0.0f && p < 1.0f)) return dlrec_error(DLREC_ERR_INVALID, "%s: rate p=%g not in [0, 1)", what, p);
  /* Seed and step go through the mixer separately, as in dlrec_rng_seed, so
   * that nearby (seed, step) pairs give unrelated keys. */
  m->key = dlrec_mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ dlrec_mix64(step + GOLDEN);
  /* p < 1, so p·2³² < 2³² fits; the product is exact in double (a float
   * times a power of two) and the cast truncates it. */
  m->threshold = (uint32_t)((double)p * 4294967296.0);
  m->scale = 1.0f / (1.0f - p);
  return DLREC_OK;
}

static inline int kept(const mask *m, size_t i) {
  return (uint32_t)(dlrec_mix64(m->key + (uint64_t)(i + 1) * GOLDEN) >> 32) >= m->threshold;
}

/* y[i] = keep(i) ? x[i] · scale : 0; y == x is allowed. */
static void apply(float *y, const float *x, size_t n, const mask *m) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) y[i] = kept(m, i) ? x[i] * m->scale : 0.0f;
}

dlrec_status cpu_dropout_forward(float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t step,
                                   int train) {
  mask m;
  dlrec_status st = nn_dropout_mask_make(&m, "dropout_forward", out, in, p, seed, step);
  if (st != DLREC_OK) return st;
  if (!train || p == 0.0f) {
    if (out != in && n) memmove(out, in, n * sizeof(float));
    return DLREC_OK;
  }
  apply(out, in, n, &m);
  return DLREC_OK;
}

dlrec_status cpu_dropout_backward(float *din, const float *dout, size_t n, float p, uint64_t seed,
                                    uint64_t step) {
  mask m;
  dlrec_status st = nn_dropout_mask_make(&m, "dropout_backward", din, dout, p, seed, step);
  if (st != DLREC_OK) return st;
  if (p == 0.0f) {
    if (din != dout && n) memmove(din, dout, n * sizeof(float));
    return DLREC_OK;
  }
  apply(din, dout, n, &m);
  return DLREC_OK;
}
