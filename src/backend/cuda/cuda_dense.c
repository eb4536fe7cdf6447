/* The CUDA backend's ops that are neither GEMMs nor bags: moving rows,
 * activations, the interactions, FM and the wide term, dropout, batch
 * normalization, the loss and the dense optimizer. Each checks its
 * arguments as the CPU kernel does (backend/checks.h) before it enqueues
 * its kernels (cuda_kernels.h). */
#include "backend/cuda/cuda_impl.h"

#include <math.h>

#include "backend/checks.h"

/* ---- moving rows ---- */

dlrec_status cuda_copy_rows(dlrec_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                            size_t rows, size_t width) {
  if (!rows || !width) return DLREC_OK;
  TRY(nn_check_rows("copy_rows", dst, src, dst_ld, src_ld, width));
  return cuda_status(cuk_copy_rows(enter(be), dst, dst_ld, src, src_ld, rows, width), "copy_rows");
}

dlrec_status cuda_fill_rows(dlrec_backend *be, float *dst, size_t dst_ld, size_t rows, size_t width,
                            float value) {
  if (!rows || !width) return DLREC_OK;
  TRY(nn_check_rows("fill_rows", dst, dst, dst_ld, dst_ld, width));
  return cuda_status(cuk_fill_rows(enter(be), dst, dst_ld, rows, width, value), "fill_rows");
}

dlrec_status cuda_add(dlrec_backend *be, float *y, const float *x, size_t n) {
  if (!n) return DLREC_OK;
  TRY(NN_NONNULL("add", y, x));
  return cuda_status(cuk_add(enter(be), y, x, n), "add");
}

dlrec_status cuda_gather_rows(dlrec_backend *be, float *dst, const float *src, size_t rows, const uint32_t *idx,
                              size_t n, size_t width) {
  if (!n || !width) return DLREC_OK;
  TRY(nn_check_indexed_rows("gather_rows", dst, src, rows, idx, n));
  dlrec_status st;
  const uint32_t *d_idx = cuda_idx_on_device(be, idx, n, &st);
  return d_idx ? cuda_status(cuk_gather_rows(enter(be), dst, src, d_idx, n, width), "gather_rows") : st;
}

dlrec_status cuda_scatter_add_rows(dlrec_backend *be, float *dst, size_t rows, const uint32_t *idx,
                                   const float *src, size_t n, size_t width) {
  if (!n || !width) return DLREC_OK;
  TRY(nn_check_indexed_rows("scatter_add_rows", dst, src, rows, idx, n));
  dlrec_status st;
  const uint32_t *d_idx = cuda_idx_on_device(be, idx, n, &st);
  return d_idx ? cuda_status(cuk_scatter_add_rows(enter(be), dst, d_idx, src, n, width), "scatter_add_rows") : st;
}

dlrec_status cuda_scale(dlrec_backend *be, float *x, size_t n, float s) {
  if (!n) return DLREC_OK;
  TRY(NN_NONNULL("scale", x));
  return cuda_status(cuk_scale(enter(be), x, n, s), "scale");
}

dlrec_status cuda_all_finite(dlrec_backend *be, int *finite, const float *x, size_t n) {
  if (!finite || (n && !x)) return dlrec_error(DLREC_ERR_INVALID, "all_finite: NULL buffer");
  *finite = 1;
  if (!n) return DLREC_OK;
  cudaStream_t st = enter(be);
  int *flag = cuda_scratch(be, sizeof(int)), bad = 0;
  if (!flag) return dlrec_error(DLREC_ERR_NOMEM, "all_finite: no GPU memory for a flag");
  TRY(cuda_status(cudaMemsetAsync(flag, 0, sizeof(int), st), "all_finite"));
  TRY(cuda_status(cuk_any_nonfinite(st, flag, x, n), "all_finite"));
  TRY(cuda_status(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, st), "all_finite"));
  TRY(cuda_status(cuda_drain(be), "all_finite"));
  *finite = !bad;
  return DLREC_OK;
}

dlrec_status cuda_sum_columns(dlrec_backend *be, float *dst, const float *src, size_t B, size_t C) {
  if (!C) return DLREC_OK;
  if (!dst || (B && !src)) return dlrec_error(DLREC_ERR_INVALID, "sum_columns: NULL buffer");
  return cuda_status(cuk_sum_columns(enter(be), dst, src, B, C), "sum_columns");
}

/* ---- activations ---- */

dlrec_status cuda_relu_forward(dlrec_backend *be, float *out, const float *in, size_t n) {
  TRY(NN_NONNULL("relu_forward", out, in));
  return n ? cuda_status(cuk_relu_forward(enter(be), out, in, n), "relu_forward") : DLREC_OK;
}

dlrec_status cuda_relu_backward(dlrec_backend *be, float *din, const float *dout, const float *out, size_t n) {
  TRY(NN_NONNULL("relu_backward", din, dout, out));
  return n ? cuda_status(cuk_relu_backward(enter(be), din, dout, out, n), "relu_backward") : DLREC_OK;
}

dlrec_status cuda_sigmoid(dlrec_backend *be, float *out, const float *in, size_t n) {
  TRY(NN_NONNULL("sigmoid_forward", out, in));
  return n ? cuda_status(cuk_sigmoid(enter(be), out, in, n), "sigmoid_forward") : DLREC_OK;
}

/* ---- interactions ---- */

dlrec_status cuda_dot_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int F,
                              int D) {
  TRY(nn_check_dot("interaction_dot_forward", out, x, emb, B, F, D));
  return cuda_status(cuk_dot_forward(enter(be), out, x, emb, B, F, D), "interaction_dot_forward");
}

dlrec_status cuda_dot_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, const float *x,
                               const float *emb, int B, int F, int D) {
  TRY(nn_check_dot("interaction_dot_backward", dx, demb, dout, B, F, D));
  TRY(NN_NONNULL("interaction_dot_backward", x, emb));
  return cuda_status(cuk_dot_backward(enter(be), dx, demb, dout, x, emb, B, F, D), "interaction_dot_backward");
}

/* The concatenation is two strided copies: x into each row's first DX
 * values, emb into the rest. */
dlrec_status cuda_concat_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int DX,
                                 int F, int D) {
  TRY(nn_check_concat("interaction_concat_forward", out, emb, B, DX, F, D));
  if (DX > 0 && !x)
    return dlrec_error(DLREC_ERR_INVALID, "interaction_concat_forward: NULL dense buffer with DX=%d", DX);
  cudaStream_t st = enter(be);
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
  if (DX > 0) TRY(cuda_status(cuk_copy_rows(st, out, W, x, DX, B, DX), "interaction_concat_forward"));
  return cuda_status(cuk_copy_rows(st, out + DX, W, emb, FD, B, FD), "interaction_concat_forward");
}

dlrec_status cuda_concat_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, int B, int DX,
                                  int F, int D) {
  TRY(nn_check_concat("interaction_concat_backward", demb, dout, B, DX, F, D));
  cudaStream_t st = enter(be);
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
  if (dx && DX > 0) TRY(cuda_status(cuk_copy_rows(st, dx, DX, dout, W, B, DX), "interaction_concat_backward"));
  return cuda_status(cuk_copy_rows(st, demb, FD, dout + DX, W, B, FD), "interaction_concat_backward");
}

/* ---- FM, wide ---- */

dlrec_status cuda_fm_forward(dlrec_backend *be, float *out, const float *emb, int B, int F, int D) {
  TRY(nn_check_fm("fm_forward", out, emb, B, F, D));
  return cuda_status(cuk_fm_forward(enter(be), out, emb, B, F, D), "fm_forward");
}

dlrec_status cuda_fm_backward(dlrec_backend *be, float *demb, const float *dout, const float *emb, int B, int F,
                              int D) {
  TRY(nn_check_fm("fm_backward", demb, dout, B, F, D));
  TRY(NN_NONNULL("fm_backward", emb));
  return cuda_status(cuk_fm_backward(enter(be), demb, dout, emb, B, F, D), "fm_backward");
}

dlrec_status cuda_wide_forward(dlrec_backend *be, float *out, const float *w, const float *bias, int B, int F) {
  TRY(nn_check_wide("wide_forward", out, w, B, F));
  return cuda_status(cuk_wide_forward(enter(be), out, w, bias, B, F), "wide_forward");
}

dlrec_status cuda_wide_backward(dlrec_backend *be, float *dw, float *dbias, const float *dout, int B, int F) {
  TRY(nn_check_wide("wide_backward", dw, dout, B, F));
  cudaStream_t st = enter(be);
  float *partial = NULL;
  if (dbias && !(partial = cuda_scratch(be, cuk_colsum_partials((size_t)B, 1) * sizeof(float))))
    return dlrec_error(DLREC_ERR_NOMEM, "wide_backward: no GPU memory for its scratch");
  TRY(cuda_status(cuk_wide_backward(st, dw, dout, B, F), "wide_backward"));
  if (dbias) TRY(cuda_status(cuk_colsum_accumulate(st, dbias, dout, (size_t)B, 1, partial), "wide_backward"));
  return DLREC_OK;
}

/* ---- dropout: src/backend/cpu/dropout.c's masks ---- */

static dlrec_status dropout_apply(dlrec_backend *be, float *y, const float *x, size_t n, const nn_dropout_mask *m,
                                  int copy, const char *what) {
  if (!n) return DLREC_OK;
  cudaStream_t st = enter(be);
  if (copy)
    return y == x ? DLREC_OK
                  : cuda_status(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, st), what);
  return cuda_status(cuk_dropout(st, y, x, n, m->key, m->threshold, m->scale), what);
}

dlrec_status cuda_dropout_forward(dlrec_backend *be, float *out, const float *in, size_t n, float p,
                                  uint64_t seed, uint64_t step, int train) {
  nn_dropout_mask m;
  TRY(nn_dropout_mask_make(&m, "dropout_forward", out, in, p, seed, step));
  return dropout_apply(be, out, in, n, &m, !train || p == 0.0f, "dropout_forward");
}

dlrec_status cuda_dropout_backward(dlrec_backend *be, float *din, const float *dout, size_t n, float p,
                                   uint64_t seed, uint64_t step) {
  nn_dropout_mask m;
  TRY(nn_dropout_mask_make(&m, "dropout_backward", din, dout, p, seed, step));
  return dropout_apply(be, din, dout, n, &m, p == 0.0f, "dropout_backward");
}

/* ---- batch normalization (src/backend/cpu/batchnorm.c's steps) ---- */

dlrec_status cuda_batchnorm_train_forward(dlrec_backend *be, float *out, float *saved, const float *in,
                                          const float *gamma, const float *beta, float *running_mean,
                                          float *running_var, float momentum, float eps, int B, int C) {
  const char *what = "batchnorm_train_forward";
  TRY(NN_NONNULL(what, out, saved, in, gamma, beta, running_mean, running_var));
  TRY(nn_check_batchnorm(what, B, 2, C));
  TRY(nn_check_momentum(what, momentum, eps));
  double *sum = cuda_scratch(be, 2 * (size_t)C * sizeof(double)), *sqdev = sum + C;
  if (!sum) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for its scratch", what);
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_bn_stats(st, sum, in, NULL, B, B, C), what));
  TRY(cuda_status(cuk_bn_stats(st, sqdev, in, sum, B, B, C), what));
  return cuda_status(cuk_bn_normalize(st, out, saved, in, sum, sqdev, B, gamma, beta, running_mean, running_var,
                                      momentum, eps, B, C),
                     what);
}

dlrec_status cuda_batchnorm_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma, const float *saved,
                                     int B, int C) {
  const char *what = "batchnorm_backward";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, saved));
  TRY(nn_check_batchnorm(what, B, 2, C));
  double *sg = cuda_scratch(be, 2 * (size_t)C * sizeof(double)), *sgx = sg + C;
  if (!sg) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for its scratch", what);
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_bn_backward_stats(st, sg, sgx, dout, in, saved, B, C), what));
  return cuda_status(cuk_bn_backward_apply(st, din, dgamma, dbeta, dout, in, gamma, saved, sg, sgx, sg, sgx, B, B, C),
                     what);
}

dlrec_status cuda_batchnorm_stats(dlrec_backend *be, double *out, const float *in, const double *sum, double N,
                                  int B, int C) {
  TRY(NN_NONNULL("batchnorm_stats", out, in));
  TRY(nn_check_batchnorm("batchnorm_stats", B, 1, C));
  if (sum && !(N >= 1)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_stats: N=%g rows, expected at least 1", N);
  return cuda_status(cuk_bn_stats(enter(be), out, in, sum, N, B, C), "batchnorm_stats");
}

dlrec_status cuda_batchnorm_normalize(dlrec_backend *be, float *out, float *saved, const float *in,
                                      const double *sum, const double *sqdev, double N, const float *gamma,
                                      const float *beta, float *running_mean, float *running_var,
                                      float momentum, float eps, int B, int C) {
  const char *what = "batchnorm_normalize";
  TRY(NN_NONNULL(what, out, saved, in, sum, sqdev, gamma, beta));
  if (!running_mean != !running_var) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  TRY(nn_check_batchnorm(what, B, 1, C));
  TRY(nn_check_momentum(what, momentum, eps));
  if (!(N >= 2)) return dlrec_error(DLREC_ERR_INVALID, "%s: N=%g rows, expected at least 2", what, N);
  return cuda_status(cuk_bn_normalize(enter(be), out, saved, in, sum, sqdev, N, gamma, beta, running_mean,
                                      running_var, momentum, eps, B, C),
                     what);
}

dlrec_status cuda_batchnorm_backward_stats(dlrec_backend *be, double *sg, double *sgx, const float *dout,
                                           const float *in, const float *saved, int B, int C) {
  TRY(NN_NONNULL("batchnorm_backward_stats", sg, sgx, dout, in, saved));
  TRY(nn_check_batchnorm("batchnorm_backward_stats", B, 1, C));
  return cuda_status(cuk_bn_backward_stats(enter(be), sg, sgx, dout, in, saved, B, C), "batchnorm_backward_stats");
}

dlrec_status cuda_batchnorm_backward_apply(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                           const float *dout, const float *in, const float *gamma,
                                           const float *saved, const double *sg_way, const double *sgx_way,
                                           const double *sg, const double *sgx, double N, int B, int C) {
  const char *what = "batchnorm_backward_apply";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg, sgx));
  TRY(nn_check_batchnorm(what, B, 1, C));
  if (!(N >= 2)) return dlrec_error(DLREC_ERR_INVALID, "%s: N=%g rows, expected at least 2", what, N);
  return cuda_status(cuk_bn_backward_apply(enter(be), din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg,
                                           sgx, N, B, C),
                     what);
}

dlrec_status cuda_batchnorm_infer(dlrec_backend *be, float *out, const float *in, const float *gamma,
                                  const float *beta, const float *running_mean, const float *running_var,
                                  float eps, int B, int C) {
  TRY(NN_NONNULL("batchnorm_infer", out, in, gamma, beta, running_mean, running_var));
  TRY(nn_check_batchnorm("batchnorm_infer", B, 1, C));
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer: eps=%g must be > 0", eps);
  return cuda_status(cuk_bn_infer(enter(be), out, in, gamma, beta, running_mean, running_var, eps, B, C),
                     "batchnorm_infer");
}

dlrec_status cuda_batchnorm_infer_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                           const float *dout, const float *in, const float *gamma,
                                           const float *running_mean, const float *running_var, float eps,
                                           int B, int C) {
  const char *what = "batchnorm_infer_backward";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, running_mean, running_var));
  TRY(nn_check_batchnorm(what, B, 1, C));
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "%s: eps=%g must be > 0", what, eps);
  return cuda_status(
      cuk_bn_infer_backward(enter(be), din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C),
      what);
}

/* ---- loss, dense optimizer ---- */

/* *loss is the backend's memory, like every other output. */
dlrec_status cuda_bce_forward(dlrec_backend *be, double *loss, const float *logits, const float *labels,
                              int B) {
  TRY(nn_check_bce("bce_logits_forward", loss, logits, labels, B));
  double *terms = cuda_scratch(be, (size_t)B * sizeof(double));
  if (!terms) return dlrec_error(DLREC_ERR_NOMEM, "bce_logits_forward: no GPU memory for its scratch");
  return cuda_status(cuk_bce_forward(enter(be), loss, logits, labels, B, terms), "bce_logits_forward");
}

dlrec_status cuda_bce_backward(dlrec_backend *be, float *dlogits, const float *logits, const float *labels,
                               int B) {
  TRY(nn_check_bce("bce_logits_backward", dlogits, logits, labels, B));
  return cuda_status(cuk_bce_backward(enter(be), dlogits, logits, labels, B), "bce_logits_backward");
}

dlrec_status cuda_optim_step(dlrec_backend *be, const dlrec_optim_config *c, float *param, const float *grad,
                             float *state, size_t n, uint64_t step) {
  /* The config's checks are the CPU's own: initializing no state runs them
   * and touches nothing. */
  TRY(dlrec_optim_state_init(c, NULL, 0));
  TRY(NN_NONNULL("optim_step", param, grad));
  if (dlrec_optim_state_floats(c, n) && !state) return dlrec_error(DLREC_ERR_INVALID, "optim_step: NULL state");
  float step_size = 0, inv_sqrt_bc2 = 0;
  if (c->kind == DLREC_OPTIM_ADAM) {
    if (step < 1) return dlrec_error(DLREC_ERR_INVALID, "optim_step: Adam's step counts from 1");
    const double bc1 = 1.0 - pow(c->beta1, (double)step), bc2 = 1.0 - pow(c->beta2, (double)step);
    step_size = (float)(c->lr / bc1);
    inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  }
  if (!n) return DLREC_OK;
  const int kind = c->kind == DLREC_OPTIM_SGD ? 0 : c->kind == DLREC_OPTIM_ADAM ? 1 : 2;
  return cuda_status(cuk_optim_step(enter(be), kind, param, grad, state, n, c->lr, c->weight_decay, c->beta1,
                                    c->beta2, c->eps, step_size, inv_sqrt_bc2),
                     "optim_step");
}

