/* The CPU backend: the ops of backend_impl.h over nn/nn.h's and
 * embed/embed.h's kernels, on the backend's own thread count and, for the
 * linear layers, in its precision (cpu_gemm.c).
 *
 * Threads: the kernels are OpenMP loops and OpenBLAS (its OpenMP build)
 * sizes its team from omp_get_max_threads() of the calling thread, so each
 * op first sets the calling thread's team size to the backend's. That is a
 * per-thread setting (OpenMP's nthreads-var), not process-wide state: a
 * server's scoring threads and a trainer may run backends of different
 * sizes side by side.
 */
#include "backend/backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "backend/cpu/cpu_gemm.h"

/* Sets the calling thread's OpenMP team to the backend's size. */
static inline void enter(dlrec_backend *be) {
  if (omp_get_max_threads() != (int)be->threads) omp_set_num_threads((int)be->threads);
}

static cpu_gemm *gemm_of(dlrec_backend *be) { return be->ctx; }

static void cpu_free(dlrec_backend *be) { cpu_gemm_free(gemm_of(be)); }

/* ---- memory: host memory ---- */

static void *cpu_alloc(dlrec_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) ? NULL : p;
}

static void cpu_release(dlrec_backend *be, void *p) {
  (void)be;
  free(p);
}

static dlrec_status cpu_copy(dlrec_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes && (!dst || !src)) return dlrec_error(DLREC_ERR_INVALID, "copy of %zu bytes with a NULL buffer", bytes);
  if (bytes) memmove(dst, src, bytes);
  return DLREC_OK;
}

static dlrec_status cpu_synchronize(dlrec_backend *be) {
  (void)be; /* every CPU op has finished when it returns */
  return DLREC_OK;
}

/* ---- dense layers ---- */

static dlrec_status cpu_linear_forward(dlrec_backend *be, float *out, const float *in, const float *weight,
                                       const float *bias, int B, int IN, int OUT, dlrec_act act) {
  enter(be);
  return cpu_gemm_linear_forward(gemm_of(be), out, in, weight, bias, B, IN, OUT, act);
}

static dlrec_status cpu_linear_backward(dlrec_backend *be, float *din, float *dweight, float *dbias,
                                        const float *dout, const float *in, const float *weight, int B, int IN,
                                        int OUT) {
  enter(be);
  return cpu_gemm_linear_backward(gemm_of(be), din, dweight, dbias, dout, in, weight, B, IN, OUT);
}

static dlrec_status cpu_linear_relu_backward(dlrec_backend *be, float *din, float *dweight, float *dbias, float *dout,
                                             const float *out, const float *in, const float *weight, int B, int IN,
                                             int OUT) {
  enter(be);
  return cpu_gemm_linear_relu_backward(gemm_of(be), din, dweight, dbias, dout, out, in, weight, B, IN, OUT);
}

static int cpu_keep_operands(dlrec_backend *be, int on) { return cpu_gemm_keep(gemm_of(be), on); }

static int cpu_fresh_gradients(dlrec_backend *be, int on) { return cpu_gemm_fresh(gemm_of(be), on); }

/* The cross layers' products, in the backend's precision like the linear
 * layers' (dlrec_gemm_ops over cpu_gemm). */
static dlrec_status gemm_ops_forward(void *ctx, float *out, const float *in, const float *weight,
                                     const float *bias, int B, int IN, int OUT, int relu) {
  return cpu_gemm_linear_forward(ctx, out, in, weight, bias, B, IN, OUT, relu ? DLREC_ACT_RELU : DLREC_ACT_NONE);
}

static dlrec_status gemm_ops_backward(void *ctx, float *din, float *dweight, float *dbias, const float *dout,
                                      const float *in, const float *weight, int B, int IN, int OUT) {
  return cpu_gemm_linear_backward(ctx, din, dweight, dbias, dout, in, weight, B, IN, OUT);
}

static dlrec_gemm_ops gemm_ops(dlrec_backend *be) {
  return (dlrec_gemm_ops){.forward = gemm_ops_forward, .backward = gemm_ops_backward, .ctx = gemm_of(be)};
}

static dlrec_status cpu_copy_rows(dlrec_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                                  size_t rows, size_t width) {
  enter(be);
  return dlrec_copy_rows(dst, dst_ld, src, src_ld, rows, width);
}

static dlrec_status cpu_fill_rows(dlrec_backend *be, float *dst, size_t dst_ld, size_t rows, size_t width,
                                  float value) {
  enter(be);
  return dlrec_fill_rows(dst, dst_ld, rows, width, value);
}

static dlrec_status cpu_gather_rows(dlrec_backend *be, float *dst, const float *src, size_t rows, const uint32_t *idx,
                                    size_t n, size_t width) {
  enter(be);
  return dlrec_gather_rows(dst, src, rows, idx, n, width);
}

static dlrec_status cpu_scatter_add_rows(dlrec_backend *be, float *dst, size_t rows, const uint32_t *idx,
                                         const float *src, size_t n, size_t width) {
  enter(be);
  return dlrec_scatter_add_rows(dst, rows, idx, src, n, width);
}

static dlrec_status cpu_add(dlrec_backend *be, float *y, const float *x, size_t n) {
  enter(be);
  return dlrec_add(y, x, n);
}

static dlrec_status cpu_scale(dlrec_backend *be, float *x, size_t n, float s) {
  enter(be);
  return dlrec_scale(x, n, s);
}

static dlrec_status cpu_all_finite(dlrec_backend *be, int *finite, const float *x, size_t n) {
  enter(be);
  return dlrec_all_finite(x, n, finite);
}

static dlrec_status cpu_sum_columns(dlrec_backend *be, float *dst, const float *src, size_t B, size_t C) {
  enter(be);
  return dlrec_sum_columns(dst, src, B, C);
}

static dlrec_status cpu_relu_forward(dlrec_backend *be, float *out, const float *in, size_t n) {
  enter(be);
  return dlrec_relu_forward(out, in, n);
}

static dlrec_status cpu_relu_backward(dlrec_backend *be, float *din, const float *dout, const float *out, size_t n) {
  enter(be);
  return dlrec_relu_backward(din, dout, out, n);
}

static dlrec_status cpu_sigmoid(dlrec_backend *be, float *out, const float *in, size_t n) {
  enter(be);
  return dlrec_sigmoid_forward(out, in, n);
}

static dlrec_status cpu_dot_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int F,
                                    int D) {
  enter(be);
  return dlrec_interaction_dot_forward(out, x, emb, B, F, D);
}

static dlrec_status cpu_dot_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, const float *x,
                                     const float *emb, int B, int F, int D) {
  enter(be);
  return dlrec_interaction_dot_backward(dx, demb, dout, x, emb, B, F, D);
}

static dlrec_status cpu_concat_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B,
                                       int DX, int F, int D) {
  enter(be);
  return dlrec_interaction_concat_forward(out, x, emb, B, DX, F, D);
}

static dlrec_status cpu_concat_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, int B, int DX,
                                        int F, int D) {
  enter(be);
  return dlrec_interaction_concat_backward(dx, demb, dout, B, DX, F, D);
}

static dlrec_status cpu_cross_forward(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                      const float *w, const float *bias, int B, int d) {
  enter(be);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_forward(&g, out, act, x0, xl, w, bias, B, d);
}

static dlrec_status cpu_cross_backward(dlrec_backend *be, float *dx0, float *dxl, float *dw, float *dbias,
                                       const float *dout, const float *x0, const float *xl, const float *act,
                                       const float *w, float *ws, int B, int d) {
  enter(be);
  if (cpu_gemm_fuses_cross(gemm_of(be)))
    return cpu_gemm_cross_backward(gemm_of(be), dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws, B, d);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_backward(&g, dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws, B, d);
}

static dlrec_status cpu_cross_lowrank_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                              const float *xl, const float *v, const float *u, const float *bias,
                                              int B, int d, int r) {
  enter(be);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_lowrank_forward(&g, out, act, x0, xl, v, u, bias, B, d, r);
}

static dlrec_status cpu_cross_lowrank_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *du,
                                               float *dbias, const float *dout, const float *x0, const float *xl,
                                               const float *act, const float *v, const float *u, float *ws, int B,
                                               int d, int r) {
  enter(be);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_lowrank_backward(&g, dx0, dxl, dv, du, dbias, dout, x0, xl, act, v, u, ws, B, d, r);
}

static dlrec_status cpu_cross_mix_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                          const float *xl, const float *v, const float *c, const float *u,
                                          const float *gate, const float *bias, int B, int d, int r, int K) {
  enter(be);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_mix_forward(&g, out, act, x0, xl, v, c, u, gate, bias, B, d, r, K);
}

static dlrec_status cpu_cross_mix_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *dc,
                                           float *du, float *dgate, float *dbias, const float *dout, const float *x0,
                                           const float *xl, const float *act, const float *v, const float *c,
                                           const float *u, const float *gate, float *ws, int B, int d, int r,
                                           int K) {
  enter(be);
  const dlrec_gemm_ops g = gemm_ops(be);
  return dlrec_cross_mix_backward(&g, dx0, dxl, dv, dc, du, dgate, dbias, dout, x0, xl, act, v, c, u, gate, ws, B, d,
                                  r, K);
}

static dlrec_status cpu_fm_forward(dlrec_backend *be, float *out, const float *emb, int B, int F, int D) {
  enter(be);
  return dlrec_fm_forward(out, emb, B, F, D);
}

static dlrec_status cpu_fm_backward(dlrec_backend *be, float *demb, const float *dout, const float *emb, int B,
                                    int F, int D) {
  enter(be);
  return dlrec_fm_backward(demb, dout, emb, B, F, D);
}

static dlrec_status cpu_wide_forward(dlrec_backend *be, float *out, const float *w, const float *bias, int B,
                                     int F) {
  enter(be);
  return dlrec_wide_forward(out, w, bias, B, F);
}

static dlrec_status cpu_wide_backward(dlrec_backend *be, float *dw, float *dbias, const float *dout, int B, int F) {
  enter(be);
  return dlrec_wide_backward(dw, dbias, dout, B, F);
}

static dlrec_status cpu_dropout_forward(dlrec_backend *be, float *out, const float *in, size_t n, float p,
                                        uint64_t seed, uint64_t step, int train) {
  enter(be);
  return dlrec_dropout_forward(out, in, n, p, seed, step, train);
}

static dlrec_status cpu_dropout_backward(dlrec_backend *be, float *din, const float *dout, size_t n, float p,
                                         uint64_t seed, uint64_t step) {
  enter(be);
  return dlrec_dropout_backward(din, dout, n, p, seed, step);
}

static dlrec_status cpu_batchnorm_train_forward(dlrec_backend *be, float *out, float *saved, const float *in,
                                                const float *gamma, const float *beta, float *running_mean,
                                                float *running_var, float momentum, float eps, int B, int C) {
  enter(be);
  return dlrec_batchnorm_train_forward(out, saved, in, gamma, beta, running_mean, running_var, momentum, eps, B, C);
}

static dlrec_status cpu_batchnorm_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                           const float *dout, const float *in, const float *gamma,
                                           const float *saved, int B, int C) {
  enter(be);
  return dlrec_batchnorm_backward(din, dgamma, dbeta, dout, in, gamma, saved, B, C);
}

static dlrec_status cpu_batchnorm_stats(dlrec_backend *be, double *out, const float *in, const double *sum, double N,
                                       int B, int C) {
  enter(be);
  return dlrec_batchnorm_stats(out, in, sum, N, B, C);
}

static dlrec_status cpu_batchnorm_normalize(dlrec_backend *be, float *out, float *saved, const float *in,
                                           const double *sum, const double *sqdev, double N, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var,
                                           float momentum, float eps, int B, int C) {
  enter(be);
  return dlrec_batchnorm_normalize(out, saved, in, sum, sqdev, N, gamma, beta, running_mean, running_var, momentum,
                                   eps, B, C);
}

static dlrec_status cpu_batchnorm_backward_stats(dlrec_backend *be, double *sg, double *sgx, const float *dout,
                                                const float *in, const float *saved, int B, int C) {
  enter(be);
  return dlrec_batchnorm_backward_stats(sg, sgx, dout, in, saved, B, C);
}

static dlrec_status cpu_batchnorm_backward_apply(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                                const float *dout, const float *in, const float *gamma,
                                                const float *saved, const double *sg_way, const double *sgx_way,
                                                const double *sg, const double *sgx, double N, int B, int C) {
  enter(be);
  return dlrec_batchnorm_backward_apply(din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg, sgx, N, B,
                                        C);
}

static dlrec_status cpu_batchnorm_infer(dlrec_backend *be, float *out, const float *in, const float *gamma,
                                        const float *beta, const float *running_mean, const float *running_var,
                                        float eps, int B, int C) {
  enter(be);
  return dlrec_batchnorm_infer(out, in, gamma, beta, running_mean, running_var, eps, B, C);
}

/* ---- loss and the dense optimizer ---- */

static dlrec_status cpu_bce_forward(dlrec_backend *be, double *loss, const float *logits, const float *labels,
                                    int B) {
  enter(be);
  return dlrec_bce_logits_forward(loss, logits, labels, B);
}

static dlrec_status cpu_bce_backward(dlrec_backend *be, float *dlogits, const float *logits, const float *labels,
                                     int B) {
  enter(be);
  return dlrec_bce_logits_backward(dlogits, logits, labels, B);
}

static dlrec_status cpu_optim_step(dlrec_backend *be, const dlrec_optim_config *c, float *param, const float *grad,
                                   float *state, size_t n, uint64_t step) {
  enter(be);
  return dlrec_optim_step(c, param, grad, state, n, step);
}

/* ---- embeddings ---- */

static dlrec_status cpu_bag_forward(dlrec_backend *be, float *out, const dlrec_table *t, const dlrec_bag_batch *bags,
                                    dlrec_bag_mode mode) {
  enter(be);
  return dlrec_bag_forward(t, bags, mode, out);
}

static dlrec_status cpu_bag_backward_update(dlrec_backend *be, dlrec_table *t, dlrec_sparse_optim *o,
                                            const dlrec_bag_batch *bags, dlrec_bag_mode mode, const float *d_out,
                                            void *scratch, size_t scratch_bytes) {
  enter(be);
  return dlrec_bag_backward_update(t, o, bags, mode, d_out, scratch, scratch_bytes);
}

/* ---- batch-invariant scoring ---- */

static dlrec_status cpu_packed_create(dlrec_backend *be, dlrec_packed_linear **p, const float *weight,
                                      const float *bias, int IN, int OUT) {
  (void)be;
  return dlrec_packed_linear_create(p, weight, bias, IN, OUT);
}

static void cpu_packed_free(dlrec_backend *be, dlrec_packed_linear *p) {
  (void)be;
  dlrec_packed_linear_free(p);
}

static dlrec_status cpu_packed_forward(dlrec_backend *be, float *out, const dlrec_packed_linear *p, const float *in,
                                       int B, dlrec_act act) {
  enter(be);
  return dlrec_packed_linear_forward(p, in, out, B, act == DLREC_ACT_RELU);
}

static dlrec_status cpu_cross_infer(dlrec_backend *be, float *out, const float *x0, const float *xl,
                                    const dlrec_packed_linear *w, int B, int d) {
  enter(be);
  return dlrec_cross_infer(out, x0, xl, w, B, d);
}

static dlrec_status cpu_cross_lowrank_infer(dlrec_backend *be, float *out, float *ws, const float *x0,
                                            const float *xl, const dlrec_packed_linear *v,
                                            const dlrec_packed_linear *u, int B, int d, int r) {
  enter(be);
  return dlrec_cross_lowrank_infer(out, ws, x0, xl, v, u, B, d, r);
}

static dlrec_status cpu_cross_mix_infer(dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl,
                                        const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                        const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B,
                                        int d, int r, int K) {
  enter(be);
  return dlrec_cross_mix_infer(out, ws, x0, xl, v, c, u, gate, B, d, r, K);
}

static dlrec_status cpu_batchnorm_infer_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                                 const float *dout, const float *in, const float *gamma,
                                                 const float *running_mean, const float *running_var, float eps,
                                                 int B, int C) {
  enter(be);
  return dlrec_batchnorm_infer_backward(din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C);
}

static const dlrec_backend_ops cpu_ops = {
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .copy_rows = cpu_copy_rows,
    .fill_rows = cpu_fill_rows,
    .add = cpu_add,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .scale = cpu_scale,
    .all_finite = cpu_all_finite,
    .sum_columns = cpu_sum_columns,
    .keep_operands = cpu_keep_operands,
    .fresh_gradients = cpu_fresh_gradients,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .linear_relu_backward = cpu_linear_relu_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .sigmoid = cpu_sigmoid,
    .dot_forward = cpu_dot_forward,
    .dot_backward = cpu_dot_backward,
    .concat_forward = cpu_concat_forward,
    .concat_backward = cpu_concat_backward,
    .cross_forward = cpu_cross_forward,
    .cross_backward = cpu_cross_backward,
    .cross_lowrank_forward = cpu_cross_lowrank_forward,
    .cross_lowrank_backward = cpu_cross_lowrank_backward,
    .cross_mix_forward = cpu_cross_mix_forward,
    .cross_mix_backward = cpu_cross_mix_backward,
    .fm_forward = cpu_fm_forward,
    .fm_backward = cpu_fm_backward,
    .wide_forward = cpu_wide_forward,
    .wide_backward = cpu_wide_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .batchnorm_train_forward = cpu_batchnorm_train_forward,
    .batchnorm_backward = cpu_batchnorm_backward,
    .batchnorm_stats = cpu_batchnorm_stats,
    .batchnorm_normalize = cpu_batchnorm_normalize,
    .batchnorm_backward_stats = cpu_batchnorm_backward_stats,
    .batchnorm_backward_apply = cpu_batchnorm_backward_apply,
    .batchnorm_infer = cpu_batchnorm_infer,
    .batchnorm_infer_backward = cpu_batchnorm_infer_backward,
    .bce_forward = cpu_bce_forward,
    .bce_backward = cpu_bce_backward,
    .optim_step = cpu_optim_step,
    .bag_forward = cpu_bag_forward,
    .bag_backward_update = cpu_bag_backward_update,
    .packed_create = cpu_packed_create,
    .packed_free = cpu_packed_free,
    .packed_forward = cpu_packed_forward,
    .cross_infer = cpu_cross_infer,
    .cross_lowrank_infer = cpu_cross_lowrank_infer,
    .cross_mix_infer = cpu_cross_mix_infer,
};

dlrec_status dlrec_backend_cpu_init(dlrec_backend *be, const dlrec_backend_config *c) {
  if (c->threads > 4096) return dlrec_error(DLREC_ERR_INVALID, "backend threads %u out of range [0, 4096]", c->threads);
  const dlrec_precision p = dlrec_precision_resolve("cpu", c->precision);
  cpu_gemm *g = NULL;
  int native = 0;
  dlrec_status s = cpu_gemm_create(&g, p, &native);
  if (s != DLREC_OK) return s;
  be->ops = &cpu_ops;
  be->name = "cpu";
  be->threads = c->threads ? c->threads : (uint32_t)omp_get_num_procs();
  be->precision = p;
  be->bf16_native = native;
  be->host_memory = 1;
  be->ctx = g;
  snprintf(be->describe, sizeof be->describe, "cpu: %u thread%s, %s", be->threads, be->threads == 1 ? "" : "s",
           cpu_gemm_describe(g));
  return DLREC_OK;
}
