/* The CUDA backend's kernels (kernels_*.cu: rows and elementwise,
 * interactions, layers, embeddings), launched on a stream by the ops of
 * cuda_*.c. Each launcher only enqueues: the op has checked its
 * arguments, and the launcher returns the launch's error (cudaSuccess, or
 * why the kernel could not start). Shapes and what each computes are the
 * CPU kernels' (ops.def); what differs is said at each.
 *
 * Sizes are size_t or int as in ops.def. Every pointer is device memory.
 */
#ifndef DLREC_CUDA_KERNELS_H
#define DLREC_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- moving rows, elementwise ---- */
cudaError_t cuk_copy_rows(cudaStream_t st, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                          size_t width);
cudaError_t cuk_fill_rows(cudaStream_t st, float *dst, size_t dst_ld, size_t rows, size_t width, float value);
cudaError_t cuk_add(cudaStream_t st, float *y, const float *x, size_t n);
/* dst row i = src row idx[i]; dst row idx[i] += src row i (idx distinct):
 * rows of width floats, idx device memory. */
cudaError_t cuk_gather_rows(cudaStream_t st, float *dst, const float *src, const uint32_t *idx, size_t n,
                            size_t width);
cudaError_t cuk_scatter_add_rows(cudaStream_t st, float *dst, const uint32_t *idx, const float *src, size_t n,
                                 size_t width);
cudaError_t cuk_scale(cudaStream_t st, float *x, size_t n, float s);
/* dst[c] += (float) the sum of column c in double, rows in order (a thread a column). */
/* *flag = 1 if any of x's n values is not finite (flag is device memory,
 * zeroed by the caller). */
cudaError_t cuk_any_nonfinite(cudaStream_t st, int *flag, const float *x, size_t n);
cudaError_t cuk_sum_columns(cudaStream_t st, float *dst, const float *src, size_t B, size_t C);
cudaError_t cuk_relu_forward(cudaStream_t st, float *out, const float *in, size_t n);
cudaError_t cuk_relu_backward(cudaStream_t st, float *din, const float *dout, const float *out, size_t n);
cudaError_t cuk_sigmoid(cudaStream_t st, float *out, const float *in, size_t n);
/* dst (rows of dst_ld bfloat16 values, or IEEE half where fp16) = src (rows
 * of width floats) rounded to nearest even, the dst_ld - width values after
 * each row 0: a GEMM's operands in a bf16 or fp16 backend. */
cudaError_t cuk_to_half(cudaStream_t st, uint16_t *dst, size_t dst_ld, const float *src, size_t rows, size_t width,
                        int fp16);

/* dst[c] += sum over b of src[b * C + c] (B rows): the bias gradients. The
 * rows are summed in chunks of CUK_COLSUM_CHUNK in b order, then the chunks
 * in order, so the result does not depend on the launch; partial holds
 * cuk_colsum_partials(B, C) floats. */
#define CUK_COLSUM_CHUNK 256
size_t cuk_colsum_partials(size_t B, size_t C);
cudaError_t cuk_colsum_accumulate(cudaStream_t st, float *dst, const float *src, size_t B, size_t C, float *partial);
/* A ReLU's backward fused into what a 16-bit linear backward does to its
 * output gradient, in one pass: d = dout where mask > 0 (else 0) converted
 * as cuk_to_half does (rows of C, dst_ld = C), and, unless partial is NULL,
 * d's chunk sums as cuk_colsum_accumulate makes them; cuk_colsum_finish then
 * adds them to dst as it does. The same bits as cuk_relu_backward, then
 * cuk_to_half and cuk_colsum_accumulate. */
cudaError_t cuk_relu_to_half_chunks(cudaStream_t st, uint16_t *dst, float *partial, const float *dout,
                                    const float *mask, size_t B, size_t C, int fp16);
cudaError_t cuk_colsum_finish(cudaStream_t st, float *dst, const float *partial, size_t B, size_t C);

/* ---- interactions, FM, wide ---- */
cudaError_t cuk_dot_forward(cudaStream_t st, float *out, const float *x, const float *emb, int B, int F, int D);
cudaError_t cuk_dot_backward(cudaStream_t st, float *dx, float *demb, const float *dout, const float *x,
                             const float *emb, int B, int F, int D);
/* The sum over d is a fixed tree in double, not d order: batch-invariant,
 * a rounding apart from the CPU's. */
cudaError_t cuk_fm_forward(cudaStream_t st, float *out, const float *emb, int B, int F, int D);
cudaError_t cuk_fm_backward(cudaStream_t st, float *demb, const float *dout, const float *emb, int B, int F, int D);
cudaError_t cuk_wide_forward(cudaStream_t st, float *out, const float *w, const float *bias, int B, int F);
/* dw (B, F) = dout[b]; the bias gradient is cuk_colsum_accumulate's (C = 1). */
cudaError_t cuk_wide_backward(cudaStream_t st, float *dw, const float *dout, int B, int F);

/* ---- the cross layers' elementwise parts (src/backend/cpu/cross.c) ---- */
/* out = x0 * u + xl, each rounded (no FMA), as the CPU's gate. */
cudaError_t cuk_cross_gate(cudaStream_t st, float *out, const float *x0, const float *u, const float *xl, size_t n);
/* du = dout * x0; dx0 += dout * u. */
cudaError_t cuk_cross_gate_backward(cudaStream_t st, float *du, float *dx0, const float *dout, const float *x0,
                                    const float *u, size_t n);

/* ---- the mixture of low-rank experts' per-row parts (src/backend/cpu/cross_mix.c) ---- */
/* p (B, K) = softmax per row, in place (max-shifted, summed in k order). */
cudaError_t cuk_softmax_rows(cudaStream_t st, float *p, int B, int K);
/* m (B, d) = sum over k of p[b][k] e_k[b] in k order; e is (K, B, d). */
cudaError_t cuk_mixture(cudaStream_t st, float *m, const float *p, const float *e, int B, int d, int K);
/* out (B, d) += p[b][k] e[b] for one expert k (its products each rounded). */
cudaError_t cuk_mixture_add(cudaStream_t st, float *out, const float *p, const float *e, int B, int d, int K, int k);
/* dx0 += dout * m; then m = dout * x0 (dm, in m's place). */
cudaError_t cuk_mix_dx0(cudaStream_t st, float *dx0, float *m, const float *dout, const float *x0, size_t n);
/* dlogit (B, K): dp_k = <dm_b, e_k,b> in double, then the softmax's backward. */
cudaError_t cuk_mix_dlogit(cudaStream_t st, float *dlogit, const float *dm, const float *e, const float *p, int B,
                           int d, int K);
/* de (B, d) = p[b][k] * dm[b]. */
cudaError_t cuk_mix_scale(cudaStream_t st, float *de, const float *dm, const float *p, int B, int d, int K, int k);

/* ---- batch-invariant scoring: ops.h's packed layer ---- */
/* out[b][o] = relu?(fma chain over k in order from bias[o] (0 without)),
 * as the CPU's packed layer computes it where it has FMA: the same bits.
 * wt is the weight transposed, (IN, OUT). */
cudaError_t cuk_packed_forward(cudaStream_t st, float *out, const float *wt, const float *bias, const float *in, int B,
                               int IN, int OUT, int relu);

/* ---- dropout: the CPU's masks, bit for bit (the same counter-based draw) ---- */
cudaError_t cuk_dropout(cudaStream_t st, float *y, const float *x, size_t n, uint64_t key, uint32_t threshold,
                        float scale);

/* ---- batch normalization: a thread per column, rows in order, sums in
 * double as the CPU's (src/backend/cpu/batchnorm.c) ---- */
cudaError_t cuk_bn_stats(cudaStream_t st, double *out, const float *in, const double *sum, double N, int B, int C);
cudaError_t cuk_bn_normalize(cudaStream_t st, float *out, float *saved, const float *in, const double *sum,
                             const double *sqdev, double N, const float *gamma, const float *beta,
                             float *running_mean, float *running_var, float momentum, float eps, int B, int C);
cudaError_t cuk_bn_backward_stats(cudaStream_t st, double *sg, double *sgx, const float *dout, const float *in,
                                  const float *saved, int B, int C);
cudaError_t cuk_bn_backward_apply(cudaStream_t st, float *din, float *dgamma, float *dbeta, const float *dout,
                                  const float *in, const float *gamma, const float *saved, const double *sg_way,
                                  const double *sgx_way, const double *sg, const double *sgx, double N, int B, int C);
cudaError_t cuk_bn_infer(cudaStream_t st, float *out, const float *in, const float *gamma, const float *beta,
                         const float *running_mean, const float *running_var, float eps, int B, int C);
cudaError_t cuk_bn_infer_backward(cudaStream_t st, float *din, float *dgamma, float *dbeta, const float *dout,
                                  const float *in, const float *gamma, const float *running_mean,
                                  const float *running_var, float eps, int B, int C);

/* ---- embedding bags and the fused sparse update (src/backend/cpu/) ---- */

/* A batch of bags in device memory, as cuda.c lays it out from a host
 * dlrec_bag_batch: column c's offsets at offs + c (B + 1), unchanged; its
 * ids from ids + idbase[c] (its offsets minus its first); mean[c] nonzero
 * where the column pools by its mean. */
typedef struct cuk_bags {
  const uint32_t *offs, *idbase, *ids;
  const uint8_t *mean;
  uint32_t B, F;
} cuk_bags;

/* A table's rows in device memory: dtype 0 fp32, 1 bf16, 2 fp16
 * (dlrec_table_dtype), rows of stride elements, the first D used. */
typedef struct cuk_rows {
  void *data;
  uint64_t rows;
  uint32_t stride, D;
  int dtype;
} cuk_rows;

/* out (B, F, D): each bag's rows summed in id order in fp32 (times 1 / its
 * size where it pools by its mean; an empty bag is 0). */
cudaError_t cuk_bag_forward(cudaStream_t st, float *out, cuk_rows t, cuk_bags bags);

/* A sparse optimizer's hyperparameters and state (backend/sparse_optim.h); kind 0
 * SGD, 1 row-wise Adagrad, 2 lazy Adam; sr_key keys a 16-bit row's
 * stochastic rounding (src/backend/dtype.h). */
typedef struct cuk_sparse_opt {
  int kind;
  float lr, wd, b1, b2, eps;
  double log_b1, log_b2;
  float *accum, *m, *v;
  uint32_t *steps;
  uint64_t sr_key;
  const uint64_t *row_keys; /* device memory: row r rounds keyed as row_keys[r]; NULL: as r */
} cuk_sparse_opt;

/* Scratch bytes cuk_bag_update needs for n ids (n >= 1). */
size_t cuk_bag_update_scratch(uint32_t n, uint32_t D, uint64_t rows);
/* The backward of cuk_bag_forward fused with the optimizer: the batch's
 * items (column, sample, position order) sorted stably by row, each unique
 * row's gradient summed in that order (a run of more than 64 items in
 * segments of about its square root, each summed by a warp, then added in
 * order), and the row updated in place; n = idbase[F] ids. Deterministic.
 * D <= 1024. */
cudaError_t cuk_bag_update(cudaStream_t st, cuk_rows t, cuk_bags bags, uint32_t n, const float *d_out,
                           cuk_sparse_opt o, void *scratch, size_t scratch_bytes);

/* ---- loss, dense optimizers ---- */
/* *loss (device) = the mean of the per-sample terms, summed in double by a
 * fixed tree (terms: B doubles of scratch). */
cudaError_t cuk_bce_forward(cudaStream_t st, double *loss, const float *logits, const float *labels, int B,
                            double *terms);
cudaError_t cuk_bce_backward(cudaStream_t st, float *dlogits, const float *logits, const float *labels, int B);
/* kind: 0 SGD, 1 Adam (m = state, v = state + n), 2 Adagrad; the
 * arithmetic of src/backend/cpu/optim.c with the step's scalars precomputed. */
cudaError_t cuk_optim_step(cudaStream_t st, int kind, float *w, const float *grad, float *state, size_t n, float lr,
                           float wd, float b1, float b2, float eps, float step_size, float inv_sqrt_bc2);

#ifdef __cplusplus
}
#endif

#endif
