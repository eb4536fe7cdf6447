/* Batch normalization over (B, C), as PyTorch's BatchNorm1d on 2-D input:
 * training normalizes with the batch's statistics and moves the running
 * ones; inference normalizes with the running ones, elementwise, so that a
 * row's score does not depend on the rows it is batched with.
 *
 * Column statistics are reductions over b. Threads split the columns into
 * blocks of 64, never the rows, and each block sums over b in order in
 * double (two passes: the mean, then the squared deviations, which avoids
 * the cancellation of E[x²] − E[x]²). The results are thus the same on any
 * thread count, and each thread streams the rows' slices of its block.
 *
 * The backward, with x̂ = (x − mean)·invstd and g = dout ⊙ gamma:
 *   dbeta  += Σ_b dout          dgamma += Σ_b dout ⊙ x̂
 *   din     = invstd · (g − mean_b(g) − x̂ ⊙ mean_b(g ⊙ x̂))
 * x̂ is recomputed from the input and the saved (mean, invstd), so the
 * forward saves 2C floats, not B·C.
 */
#include <math.h>
#include <stddef.h>

#include "dlrec/nn.h"

#define MAX_C 65536
#define BLOCK 64
#define PARALLEL_MIN 32768

static int min_int(int a, int b) { return a < b ? a : b; }

static dlrec_status check(const char *what, int B, int B_min, int C) {
  if (B < B_min || C < 1 || C > MAX_C)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d C=%d (B >= %d, 1 <= C <= %d)", what, B, C, B_min,
                       MAX_C);
  return DLREC_OK;
}

dlrec_status dlrec_batchnorm_train_forward(float *out, float *saved, const float *in, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var,
                                           float momentum, float eps, int B, int C) {
  if (!out || !saved || !in || !gamma || !beta || !running_mean || !running_var)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_train_forward: NULL buffer");
  dlrec_status st = check("batchnorm_train_forward", B, 2, C);
  if (st != DLREC_OK) return st;
  if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_train_forward: eps=%g must be > 0, momentum=%g in [0, 1]", eps,
                       momentum);
  const int blocks = (C + BLOCK - 1) / BLOCK;
  float *mean_out = saved, *invstd_out = saved + C;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    double mean[BLOCK] = {0}, var[BLOCK] = {0};
    float m[BLOCK], inv[BLOCK];
    for (int b = 0; b < B; b++) {
      const float *row = in + (size_t)b * C + c0;
      for (int j = 0; j < n; j++) mean[j] += row[j];
    }
    for (int j = 0; j < n; j++) mean[j] /= B, m[j] = (float)mean[j];
    for (int b = 0; b < B; b++) {
      const float *row = in + (size_t)b * C + c0;
      for (int j = 0; j < n; j++) {
        const double dev = row[j] - mean[j];
        var[j] += dev * dev;
      }
    }
    for (int j = 0; j < n; j++) {
      const int c = c0 + j;
      const double v = var[j] / B; /* biased: what the batch is normalized with */
      inv[j] = (float)(1.0 / sqrt(v + eps));
      mean_out[c] = m[j];
      invstd_out[c] = inv[j];
      running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mean[j]);
      running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * (var[j] / (B - 1)));
    }
    for (int b = 0; b < B; b++) {
      const float *row = in + (size_t)b * C + c0;
      float *o = out + (size_t)b * C + c0;
      for (int j = 0; j < n; j++) o[j] = gamma[c0 + j] * ((row[j] - m[j]) * inv[j]) + beta[c0 + j];
    }
  }
  return DLREC_OK;
}

dlrec_status dlrec_batchnorm_backward(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                                      const float *gamma, const float *saved, int B, int C) {
  if (!din || !dgamma || !dbeta || !dout || !in || !gamma || !saved)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_backward: NULL buffer");
  dlrec_status st = check("batchnorm_backward", B, 2, C);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
  const float *mean = saved, *invstd = saved + C;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    double sg[BLOCK] = {0}, sgx[BLOCK] = {0}; /* Σ dout, Σ dout ⊙ x̂ */
    for (int b = 0; b < B; b++) {
      const float *row = in + (size_t)b * C + c0, *g = dout + (size_t)b * C + c0;
      for (int j = 0; j < n; j++) {
        const float xhat = (row[j] - mean[c0 + j]) * invstd[c0 + j];
        sg[j] += g[j];
        sgx[j] += (double)g[j] * xhat;
      }
    }
    /* With g = dout ⊙ gamma: mean_b(g) = gamma·Σdout/B, likewise for g ⊙ x̂. */
    float a[BLOCK], k[BLOCK], s[BLOCK];
    for (int j = 0; j < n; j++) {
      const int c = c0 + j;
      dbeta[c] += (float)sg[j];
      dgamma[c] += (float)sgx[j];
      s[j] = gamma[c] * invstd[c];          /* din = s·dout − a − k·x̂ */
      a[j] = (float)(s[j] * sg[j] / B);
      k[j] = (float)(s[j] * sgx[j] / B);
    }
    for (int b = 0; b < B; b++) {
      const float *row = in + (size_t)b * C + c0;
      const float *g = dout + (size_t)b * C + c0;
      float *d = din + (size_t)b * C + c0;
      for (int j = 0; j < n; j++) {
        const float xhat = (row[j] - mean[c0 + j]) * invstd[c0 + j];
        d[j] = s[j] * g[j] - a[j] - k[j] * xhat;
      }
    }
  }
  return DLREC_OK;
}

dlrec_status dlrec_batchnorm_infer(float *out, const float *in, const float *gamma, const float *beta,
                                   const float *running_mean, const float *running_var, float eps, int B, int C) {
  if (!out || !in || !gamma || !beta || !running_mean || !running_var)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer: NULL buffer");
  dlrec_status st = check("batchnorm_infer", B, 1, C);
  if (st != DLREC_OK) return st;
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer: eps=%g must be > 0", eps);
  const size_t total = (size_t)B * C;
  /* Per element: gamma·((x − mean)·invstd) + beta, with invstd from the
   * running variance; the same operations for every row, so the output is
   * batch-invariant. invstd is recomputed per element rather than kept in a
   * scratch, so the function needs no workspace; the sqrt is cheap next to
   * the memory traffic at these sizes. */
#pragma omp parallel for schedule(static) if (total >= PARALLEL_MIN)
  for (int b = 0; b < B; b++) {
    const float *row = in + (size_t)b * C;
    float *o = out + (size_t)b * C;
    for (int c = 0; c < C; c++) {
      const float inv = 1.0f / sqrtf(running_var[c] + eps);
      o[c] = gamma[c] * ((row[c] - running_mean[c]) * inv) + beta[c];
    }
  }
  return DLREC_OK;
}
