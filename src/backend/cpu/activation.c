/* Elementwise activations: ReLU forward and backward, sigmoid for inference.
 *
 * The ReLU's backward takes its mask from the forward's output (out > 0)
 * rather than the input, so a layer keeps one activation buffer, and the
 * fused cpu_sgemm_linear_relu_forward needs no pre-activation copy.
 */
#include <math.h>

#include "backend/cpu/kernels.h"

/* Passes smaller than this run on one thread (see linear.c). */
#define PARALLEL_MIN 32768

dlrec_status cpu_relu_forward(float *out, const float *in, size_t n) {
  if (!out || !in) return dlrec_error(DLREC_ERR_INVALID, "relu_forward: NULL buffer");
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
  return DLREC_OK;
}

dlrec_status cpu_relu_backward(float *din, const float *dout, const float *out, size_t n) {
  if (!din || !dout || !out) return dlrec_error(DLREC_ERR_INVALID, "relu_backward: NULL buffer");
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
  return DLREC_OK;
}

/* σ(z) from exp(-|z|), which is in (0, 1]: neither branch can overflow, and
 * for z very negative the result underflows gracefully to 0 instead of
 * computing 1 / (1 + inf). */
static inline float sigmoid(float z) {
  float e = expf(-fabsf(z));
  float s = 1.0f / (1.0f + e);
  return z >= 0.0f ? s : e * s;
}

dlrec_status cpu_sigmoid(float *out, const float *in, size_t n) {
  if (!out || !in) return dlrec_error(DLREC_ERR_INVALID, "sigmoid_forward: NULL buffer");
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) out[i] = sigmoid(in[i]);
  return DLREC_OK;
}
