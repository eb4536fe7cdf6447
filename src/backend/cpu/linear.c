/* The linear (fully connected) layer: forward, fused bias+ReLU forward, and
 * backward, with the matrix products in OpenBLAS.
 *
 * Weights are (OUT, IN) row-major like PyTorch's nn.Linear, so the forward is
 * in · Wᵀ and a checkpoint of PyTorch weights loads without a transpose.
 */
#include <cblas.h>
#include <stddef.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"
#include "backend/cpu/columns.h"

/* Elementwise passes smaller than this run on one thread: waking the OpenMP
 * team costs more than the pass itself. */
#define PARALLEL_MIN 32768

dlrec_status nn_check_linear(const char *what, const void *a, const void *b, const void *c, int B, int IN, int OUT) {
  if (!a || !b || !c) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (B < 1 || IN < 1 || OUT < 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d IN=%d OUT=%d", what, B, IN, OUT);
  return DLREC_OK;
}

/* Fills every row of out (B, OUT) with the bias (zeros without one), so that
 * the product accumulates onto it with beta = 1. With beta = 0 OpenBLAS
 * first clears C with scalar stores (sgemm_beta), which took 8% of a
 * training step at batch 2048; this vectorized fill costs the same bytes
 * and saves the separate bias pass. */
static void fill_bias(float *restrict out, const float *restrict bias, int B, int OUT) {
  size_t total = (size_t)B * (size_t)OUT;
#pragma omp parallel for schedule(static) if (total >= PARALLEL_MIN)
  for (int b = 0; b < B; b++) {
    float *restrict row = out + (size_t)b * OUT;
    if (bias)
      for (int o = 0; o < OUT; o++) row[o] = bias[o];
    else
      for (int o = 0; o < OUT; o++) row[o] = 0.0f;
  }
}

static void relu_inplace(float *restrict x, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static dlrec_status forward(float *out, const float *in, const float *weight, const float *bias, int B, int IN,
                            int OUT, int relu, const char *what) {
  dlrec_status st = nn_check_linear(what, out, in, weight, B, IN, OUT);
  if (st != DLREC_OK) return st;
  fill_bias(out, bias, B, OUT);
  // out (B, OUT) += in (B, IN) · Wᵀ (IN, OUT)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OUT, IN, 1.0f, in, IN, weight, IN, 1.0f, out, OUT);
  if (relu) relu_inplace(out, (size_t)B * (size_t)OUT);
  return DLREC_OK;
}

dlrec_status cpu_sgemm_linear_forward(float *out, const float *in, const float *weight, const float *bias, int B,
                                  int IN, int OUT) {
  return forward(out, in, weight, bias, B, IN, OUT, 0, "linear_forward");
}

dlrec_status cpu_sgemm_linear_relu_forward(float *out, const float *in, const float *weight, const float *bias,
                                       int B, int IN, int OUT) {
  return forward(out, in, weight, bias, B, IN, OUT, 1, "linear_relu_forward");
}

/* dbias (OUT) += column sums of dout (B, OUT). Threads split the columns, not
 * the rows, so each sum runs over b in order: the result does not depend on
 * the thread count, and each thread streams whole rows' slices. */
void cpu_bias_backward(float *restrict dbias, const float *restrict dout, int B, int OUT) {
  const int width = nn_column_width(OUT, (size_t)B * (size_t)OUT, PARALLEL_MIN);
  const int ranges = (OUT + width - 1) / width;
#pragma omp parallel for schedule(static) if (ranges > 1)
  for (int k = 0; k < ranges; k++) {
    const int o0 = k * width, o1 = o0 + width < OUT ? o0 + width : OUT;
    for (int b = 0; b < B; b++) {
      const float *restrict row = dout + (size_t)b * OUT;
      for (int o = o0; o < o1; o++) dbias[o] += row[o];
    }
  }
}

dlrec_status cpu_sgemm_linear_backward(float *din, float *dweight, float *dbias, const float *dout, const float *in,
                                   const float *weight, int B, int IN, int OUT) {
  dlrec_status st = nn_check_linear("linear_backward", dweight, dout, in, B, IN, OUT);
  if (st != DLREC_OK) return st;
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_backward: din needs the weights");
  // dW (OUT, IN) += doutᵀ (OUT, B) · in (B, IN)
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OUT, IN, B, 1.0f, dout, OUT, in, IN, 1.0f, dweight, IN);
  if (dbias) cpu_bias_backward(dbias, dout, B, OUT);
  // din (B, IN) = dout (B, OUT) · W (OUT, IN), onto zeros for the reason of fill_bias
  if (din) {
    fill_bias(din, NULL, B, IN);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, IN, OUT, 1.0f, dout, OUT, weight, IN, 1.0f, din, IN);
  }
  return DLREC_OK;
}
