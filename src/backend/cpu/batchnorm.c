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

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#define MAX_C 65536
#define BLOCK 64
#define PARALLEL_MIN 32768

static int min_int(int a, int b) { return a < b ? a : b; }

dlrec_status nn_check_batchnorm(const char *what, int B, int B_min, int C) {
  if (B < B_min || C < 1 || C > MAX_C)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d C=%d (B >= %d, 1 <= C <= %d)", what, B, C, B_min,
                       MAX_C);
  return DLREC_OK;
}

/* ---- per-block column math, shared by the whole-batch ops and the split
 * ones (whose statistics are summed across the ways of a split step) ---- */

/* acc[j] = Σ_b x[b][c0 + j], or Σ_b (x[b][c0 + j] − mean[j])² when mean is
 * not NULL, over b in order in double. */
static void col_sums(double *acc, const float *in, const double *mean, int B, int C, int c0, int n) {
  for (int j = 0; j < n; j++) acc[j] = 0;
  for (int b = 0; b < B; b++) {
    const float *row = in + (size_t)b * C + c0;
    if (!mean)
      for (int j = 0; j < n; j++) acc[j] += row[j];
    else
      for (int j = 0; j < n; j++) {
        const double dev = row[j] - mean[j];
        acc[j] += dev * dev;
      }
  }
}

/* From a block's column sums over all N rows, (mean, invstd) into saved and
 * the running statistics moved (running_mean NULL: left alone); then out =
 * gamma · (x − mean) · invstd + beta for the B rows of in. */
static void col_normalize(float *out, float *saved, const float *in, const double *sum, const double *sqdev,
                          double N, const float *gamma, const float *beta, float *running_mean, float *running_var,
                          float momentum, float eps, int B, int C, int c0, int n) {
  float m[BLOCK], inv[BLOCK];
  for (int j = 0; j < n; j++) {
    const int c = c0 + j;
    const double mean = sum[j] / N, v = sqdev[j] / N; /* biased: what the batch is normalized with */
    m[j] = (float)mean;
    inv[j] = (float)(1.0 / sqrt(v + eps));
    saved[c] = m[j];
    saved[C + c] = inv[j];
    if (running_mean) {
      running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * (sqdev[j] / (N - 1)));
    }
  }
  for (int b = 0; b < B; b++) {
    const float *row = in + (size_t)b * C + c0;
    float *o = out + (size_t)b * C + c0;
    for (int j = 0; j < n; j++) o[j] = gamma[c0 + j] * ((row[j] - m[j]) * inv[j]) + beta[c0 + j];
  }
}

/* sg[j] = Σ_b dout, sgx[j] = Σ_b dout ⊙ x̂ for a block, in double in b order. */
static void col_backward_sums(double *sg, double *sgx, const float *dout, const float *in, const float *saved, int B,
                              int C, int c0, int n) {
  const float *mean = saved, *invstd = saved + C;
  for (int j = 0; j < n; j++) sg[j] = sgx[j] = 0;
  for (int b = 0; b < B; b++) {
    const float *row = in + (size_t)b * C + c0, *g = dout + (size_t)b * C + c0;
    for (int j = 0; j < n; j++) {
      const float xhat = (row[j] - mean[c0 + j]) * invstd[c0 + j];
      sg[j] += g[j];
      sgx[j] += (double)g[j] * xhat;
    }
  }
}

/* dbeta += sg_way, dgamma += sgx_way (this batch's or way's own sums), and
 * din = s·dout − a − k·x̂ from the sums over all N rows (sg, sgx). */
static void col_backward_apply(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                               const float *gamma, const float *saved, const double *sg_way, const double *sgx_way,
                               const double *sg, const double *sgx, double N, int B, int C, int c0, int n) {
  const float *mean = saved, *invstd = saved + C;
  /* With g = dout ⊙ gamma: mean_b(g) = gamma·Σdout/N, likewise for g ⊙ x̂. */
  float a[BLOCK], k[BLOCK], s[BLOCK];
  for (int j = 0; j < n; j++) {
    const int c = c0 + j;
    dbeta[c] += (float)sg_way[j];
    dgamma[c] += (float)sgx_way[j];
    s[j] = gamma[c] * invstd[c];
    a[j] = (float)(s[j] * sg[j] / N);
    k[j] = (float)(s[j] * sgx[j] / N);
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

dlrec_status nn_check_momentum(const char *what, float momentum, float eps) {
  if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "%s: eps=%g must be > 0, momentum=%g in [0, 1]", what, eps, momentum);
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_train_forward(float *out, float *saved, const float *in, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var,
                                           float momentum, float eps, int B, int C) {
  if (!out || !saved || !in || !gamma || !beta || !running_mean || !running_var)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_train_forward: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_train_forward", B, 2, C);
  if (st == DLREC_OK) st = nn_check_momentum("batchnorm_train_forward", momentum, eps);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    double sum[BLOCK], mean[BLOCK], sqdev[BLOCK];
    col_sums(sum, in, NULL, B, C, c0, n);
    for (int j = 0; j < n; j++) mean[j] = sum[j] / B;
    col_sums(sqdev, in, mean, B, C, c0, n);
    col_normalize(out, saved, in, sum, sqdev, B, gamma, beta, running_mean, running_var, momentum, eps, B, C, c0, n);
  }
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_backward(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                                      const float *gamma, const float *saved, int B, int C) {
  if (!din || !dgamma || !dbeta || !dout || !in || !gamma || !saved)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_backward: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_backward", B, 2, C);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    double sg[BLOCK], sgx[BLOCK]; /* Σ dout, Σ dout ⊙ x̂ */
    col_backward_sums(sg, sgx, dout, in, saved, B, C, c0, n);
    col_backward_apply(din, dgamma, dbeta, dout, in, gamma, saved, sg, sgx, sg, sgx, B, B, C, c0, n);
  }
  return DLREC_OK;
}

/* ---- the split ops ---- */

dlrec_status cpu_batchnorm_stats(double *out, const float *in, const double *sum, double N, int B, int C) {
  if (!out || !in) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_stats: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_stats", B, 1, C);
  if (st == DLREC_OK && sum && !(N >= 1))
    st = dlrec_error(DLREC_ERR_INVALID, "batchnorm_stats: N=%g rows, expected at least 1", N);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    double mean[BLOCK];
    for (int j = 0; sum && j < n; j++) mean[j] = sum[c0 + j] / N;
    col_sums(out + c0, in, sum ? mean : NULL, B, C, c0, n);
  }
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_normalize(float *out, float *saved, const float *in, const double *sum,
                                       const double *sqdev, double N, const float *gamma, const float *beta,
                                       float *running_mean, float *running_var, float momentum, float eps, int B,
                                       int C) {
  if (!out || !saved || !in || !sum || !sqdev || !gamma || !beta || (!running_mean != !running_var))
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_normalize: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_normalize", B, 1, C);
  if (st == DLREC_OK) st = nn_check_momentum("batchnorm_normalize", momentum, eps);
  if (st == DLREC_OK && !(N >= 2))
    st = dlrec_error(DLREC_ERR_INVALID, "batchnorm_normalize: N=%g rows, expected at least 2", N);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    col_normalize(out, saved, in, sum + c0, sqdev + c0, N, gamma, beta, running_mean, running_var, momentum, eps, B,
                  C, c0, n);
  }
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_backward_stats(double *sg, double *sgx, const float *dout, const float *in,
                                            const float *saved, int B, int C) {
  if (!sg || !sgx || !dout || !in || !saved) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_backward_stats: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_backward_stats", B, 1, C);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    col_backward_sums(sg + c0, sgx + c0, dout, in, saved, B, C, c0, n);
  }
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_backward_apply(float *din, float *dgamma, float *dbeta, const float *dout,
                                            const float *in, const float *gamma, const float *saved,
                                            const double *sg_way, const double *sgx_way, const double *sg,
                                            const double *sgx, double N, int B, int C) {
  if (!din || !dgamma || !dbeta || !dout || !in || !gamma || !saved || !sg_way || !sgx_way || !sg || !sgx)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_backward_apply: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_backward_apply", B, 1, C);
  if (st == DLREC_OK && !(N >= 2))
    st = dlrec_error(DLREC_ERR_INVALID, "batchnorm_backward_apply: N=%g rows, expected at least 2", N);
  if (st != DLREC_OK) return st;
  const int blocks = (C + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN && blocks > 1)
  for (int blk = 0; blk < blocks; blk++) {
    const int c0 = blk * BLOCK, n = min_int(BLOCK, C - c0);
    col_backward_apply(din, dgamma, dbeta, dout, in, gamma, saved, sg_way + c0, sgx_way + c0, sg + c0, sgx + c0, N,
                       B, C, c0, n);
  }
  return DLREC_OK;
}

dlrec_status cpu_batchnorm_infer(float *out, const float *in, const float *gamma, const float *beta,
                                   const float *running_mean, const float *running_var, float eps, int B, int C) {
  if (!out || !in || !gamma || !beta || !running_mean || !running_var)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_infer", B, 1, C);
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

dlrec_status cpu_batchnorm_infer_backward(float *din, float *dgamma, float *dbeta, const float *dout,
                                            const float *in, const float *gamma, const float *running_mean,
                                            const float *running_var, float eps, int B, int C) {
  if (!din || !dgamma || !dbeta || !dout || !in || !gamma || !running_mean || !running_var)
    return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer_backward: NULL buffer");
  dlrec_status st = nn_check_batchnorm("batchnorm_infer_backward", B, 1, C);
  if (st != DLREC_OK) return st;
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer_backward: eps=%g must be > 0", eps);
  /* Columns side by side, rows in order within each: the accumulations of
   * dgamma and dbeta do not depend on the threads. */
#pragma omp parallel for schedule(static) if ((size_t)B * C >= PARALLEL_MIN)
  for (int c = 0; c < C; c++) {
    const float inv = 1.0f / sqrtf(running_var[c] + eps);
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      const float d = dout[i], xhat = (in[i] - running_mean[c]) * inv;
      dbeta[c] += d;
      dgamma[c] += d * xhat;
      din[i] = d * (gamma[c] * inv);
    }
  }
  return DLREC_OK;
}
