/* Binary cross-entropy with logits: the CTR models' loss.
 *
 * The loss takes logits, not probabilities, because log σ(z) computed from a
 * rounded σ(z) loses everything for confident predictions (σ(40) rounds to 1
 * and log(1 - 1) = -inf); the logit form is exact everywhere.
 */
#include <math.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

dlrec_status nn_check_bce(const char *what, const void *a, const void *b, const void *c, int B) {
  if (!a || !b || !c) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1) return dlrec_error(DLREC_ERR_INVALID, "%s: batch of %d rows", what, B);
  return DLREC_OK;
}

dlrec_status cpu_bce_forward(double *loss, const float *logits, const float *labels, int B) {
  dlrec_status st = nn_check_bce("bce_logits_forward", loss, logits, labels, B);
  if (st != DLREC_OK) return st;
  /* One thread, in sample order: a batch is a few thousand values, and a
   * parallel reduction would make the reported loss depend on the thread
   * count. */
  double sum = 0.0;
  for (int b = 0; b < B; b++) {
    double z = logits[b], y = labels[b];
    sum += fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
  }
  *loss = sum / B;
  return DLREC_OK;
}

dlrec_status cpu_bce_backward(float *dlogits, const float *logits, const float *labels, int B) {
  dlrec_status st = nn_check_bce("bce_logits_backward", dlogits, logits, labels, B);
  if (st != DLREC_OK) return st;
  const float inv_b = 1.0f / (float)B;
  for (int b = 0; b < B; b++) {
    /* σ(z) from exp(-|z|) so that neither sign overflows (see activation.c). */
    float z = logits[b];
    float e = expf(-fabsf(z));
    float s = 1.0f / (1.0f + e);
    float sig = z >= 0.0f ? s : e * s;
    dlogits[b] = (sig - labels[b]) * inv_b;
  }
  return DLREC_OK;
}
