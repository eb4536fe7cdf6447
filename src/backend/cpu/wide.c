/* The first-order ("wide") term: the logit of a logistic regression over
 * one-hot features, whose weights are the lookups of a width-1 embedding
 * table, so per sample it is the sum of F looked-up scalars and a bias.
 *
 * The sum runs over f in order in fp32 and the bias is added last: a row's
 * value depends on its own F weights only, so the one forward serves
 * training and batch-invariant scoring alike.
 */
#include <stddef.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#define MAX_F 65536

dlrec_status nn_check_wide(const char *what, const void *a, const void *b, int B, int F) {
  if (!a || !b) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1 || F < 1 || F > MAX_F)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d F=%d (1 <= F <= %d)", what, B, F, MAX_F);
  return DLREC_OK;
}

dlrec_status cpu_wide_forward(float *out, const float *w, const float *bias, int B, int F) {
  dlrec_status st = nn_check_wide("wide_forward", out, w, B, F);
  if (st != DLREC_OK) return st;
  const float b0 = bias ? *bias : 0.0f;
#pragma omp parallel for schedule(static) if ((size_t)B * F >= 32768)
  for (int b = 0; b < B; b++) {
    const float *row = w + (size_t)b * F;
    float acc = 0.0f;
    for (int f = 0; f < F; f++) acc += row[f];
    out[b] = acc + b0;
  }
  return DLREC_OK;
}

dlrec_status cpu_wide_backward(float *dw, float *dbias, const float *dout, int B, int F) {
  dlrec_status st = nn_check_wide("wide_backward", dw, dout, B, F);
  if (st != DLREC_OK) return st;
#pragma omp parallel for schedule(static) if ((size_t)B * F >= 32768)
  for (int b = 0; b < B; b++) {
    float *row = dw + (size_t)b * F;
    for (int f = 0; f < F; f++) row[f] = dout[b];
  }
  /* One thread, in b order: the sum does not depend on the thread count. */
  if (dbias) {
    float acc = *dbias;
    for (int b = 0; b < B; b++) acc += dout[b];
    *dbias = acc;
  }
  return DLREC_OK;
}
