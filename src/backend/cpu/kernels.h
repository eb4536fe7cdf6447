/* Dense layers for recommendation models: the CPU reference kernels.
 *
 * Every layer has an explicit forward and backward in the style of llm.c:
 * `layer_forward(out, in, weights, B, ...)` with shapes in comments, fp32,
 * row-major. Nothing here allocates: callers plan activations, gradients and
 * optimizer state once (sizes from the query functions) and pass them in.
 * Matrix products go through OpenBLAS (cblas_sgemm); elementwise work and the
 * per-sample interaction use OpenMP.
 *
 * Gradients of parameters accumulate (dW += ...), so a trainer zeroes them
 * once per step; gradients of inputs are overwritten (din = ...).
 *
 * Every function that takes sizes returns DLREC_ERR_INVALID (with a message
 * for dlrec_last_error()) for a NULL required pointer or a size out of range,
 * and touches nothing in that case. In-place use is allowed only where a
 * function says so.
 */
#ifndef DLREC_NN_H
#define DLREC_NN_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- linear ------------------------------------------------------------ */

/* out = in · Wᵀ + bias.
 *   out    (B, OUT)
 *   in     (B, IN)
 *   weight (OUT, IN), row-major: row o holds the weights of output o
 *   bias   (OUT), or NULL for none
 * B, IN, OUT >= 1. out must not overlap the inputs. */
dlrec_status dlrec_linear_forward(float *out, const float *in, const float *weight, const float *bias,
                                  int B, int IN, int OUT);

/* out = relu(in · Wᵀ + bias): the linear layer with the bias and the ReLU
 * fused into one pass over out. Shapes as dlrec_linear_forward. The backward
 * of the ReLU is dlrec_relu_backward with this out as the mask. */
dlrec_status dlrec_linear_relu_forward(float *out, const float *in, const float *weight, const float *bias,
                                       int B, int IN, int OUT);

/* The backward of dlrec_linear_forward, given dout = dL/dout:
 *   dweight += doutᵀ · in     (OUT, IN), accumulated
 *   dbias   += Σ_b dout[b]    (OUT), accumulated; NULL to skip
 *   din      = dout · W       (B, IN), overwritten; NULL to skip (first layer)
 * dout (B, OUT), in (B, IN), weight (OUT, IN). din must not overlap dout. */
dlrec_status dlrec_linear_backward(float *din, float *dweight, float *dbias, const float *dout, const float *in,
                                   const float *weight, int B, int IN, int OUT);

/* dbias (OUT) += the column sums of dout (B, OUT), each summed over b in
 * order, so the result does not depend on the thread count (the bias part of
 * dlrec_linear_backward, for GEMMs that run elsewhere). */
void dlrec_bias_backward(float *dbias, const float *dout, int B, int OUT);

/* The products of a block built on linear layers (the cross layers), run by
 * whoever owns the arithmetic: forward is dlrec_linear_forward's contract
 * (dlrec_linear_relu_forward's when relu is set), backward is
 * dlrec_linear_backward's. A backend passes its own (bf16 GEMMs); a NULL
 * dlrec_gemm_ops * means fp32 sgemm, dlrec_linear_* itself. */
typedef struct dlrec_gemm_ops {
  dlrec_status (*forward)(void *ctx, float *out, const float *in, const float *weight, const float *bias, int B, int IN,
                          int OUT, int relu);
  dlrec_status (*backward)(void *ctx, float *din, float *dweight, float *dbias, const float *dout, const float *in,
                           const float *weight, int B, int IN, int OUT);
  void *ctx;
} dlrec_gemm_ops;

/* The linear layer's forward and backward through g (NULL: sgemm). */
dlrec_status dlrec_gemm_forward(const dlrec_gemm_ops *g, float *out, const float *in, const float *weight,
                                const float *bias, int B, int IN, int OUT, int relu);
dlrec_status dlrec_gemm_backward(const dlrec_gemm_ops *g, float *din, float *dweight, float *dbias, const float *dout,
                                 const float *in, const float *weight, int B, int IN, int OUT);

/* ---- moving rows (src/nn/rows.c) ----------------------------------------- */

/* dst's first `width` values of each of `rows` rows (row r at dst + r *
 * dst_ld) = src's (row r at src + r * src_ld): a strided copy, for the
 * concatenations and splits between blocks. width <= dst_ld, and <= src_ld
 * unless src_ld is 0, which copies src's one row into every row (a
 * broadcast); dst and src must not overlap. Nothing to do for 0 rows or
 * width. */
dlrec_status dlrec_copy_rows(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t width);
/* dst's first `width` values of each of `rows` rows (stride dst_ld) = value. */
dlrec_status dlrec_fill_rows(float *dst, size_t dst_ld, size_t rows, size_t width, float value);
/* Rows picked by index (rows of `width` floats, contiguous): gather sets
 * dst's row i to src's row idx[i], scatter sets dst's row idx[i] to src's
 * row i, scatter_add adds src's row i to dst's row idx[i] (one rounding
 * each), for i < n; the scatters' idx distinct. idx is host memory, every
 * idx[i] < the indexed array's `rows`, checked before anything is touched.
 * For a table on the host with hot rows on a device: only the pooled rows
 * that have cold ids cross over. */
dlrec_status dlrec_gather_rows(float *dst, const float *src, size_t rows, const uint32_t *idx, size_t n,
                               size_t width);
dlrec_status dlrec_scatter_rows(float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
                                size_t width);
dlrec_status dlrec_scatter_add_rows(float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
                                    size_t width);
/* The checks of all three (what names the op): DLREC_OK or the error. */
dlrec_status nn_check_indexed_rows(const char *what, const void *dst, const void *src, size_t rows,
                                   const uint32_t *idx, size_t n);
/* y[i] += x[i] for n values (one rounding each); y == x is allowed. */
dlrec_status dlrec_add(float *y, const float *x, size_t n);
/* x[i] *= s for n values. */
dlrec_status dlrec_scale(float *x, size_t n, float s);
/* *finite = 1 when every one of the n values is finite (no infinity, no
 * NaN), else 0: a loss-scaled step's gradients checked for overflow. */
dlrec_status dlrec_all_finite(const float *x, size_t n, int *finite);
/* dst[c] += the sum over b of src[b][c] (rows B, cols C), each column summed
 * in double over b in order and rounded once: a bias's gradient that does
 * not depend on the threads. */
dlrec_status dlrec_sum_columns(float *dst, const float *src, size_t B, size_t C);

/* ---- activations -------------------------------------------------------- */

/* out[i] = max(in[i], 0) for n values; out == in is allowed. */
dlrec_status dlrec_relu_forward(float *out, const float *in, size_t n);

/* din[i] = out[i] > 0 ? dout[i] : 0, where out is the ReLU's output (the
 * mask); n values. din == dout is allowed (the gradient is masked in place). */
dlrec_status dlrec_relu_backward(float *din, const float *dout, const float *out, size_t n);

/* out[i] = 1 / (1 + exp(-in[i])), computed without overflow for any finite
 * input; out == in is allowed. For inference: training uses the fused
 * dlrec_bce_logits_* loss on logits. */
dlrec_status dlrec_sigmoid_forward(float *out, const float *in, size_t n);

/* ---- pairwise dot interaction (DLRM "dot") -------------------------------- */

/* Width of the interaction's output: D + F(F+1)/2 for F embedding vectors of
 * width D (the dense vector x and the F(F+1)/2 distinct pairs among the F+1
 * vectors, self-pairs excluded). 0 when F or D is out of range. */
size_t dlrec_interaction_dot_dim(int F, int D);

/* DLRM's dot interaction (interaction_op=dot, arch_interaction_itself=False).
 * Per sample, Z = [x; e_1 .. e_F] is (F+1, D), and
 *   out = concat(x, [Z_i · Z_j for i in 1..F for j in 0..i-1])
 * i.e. x followed by the strictly lower triangle of Z Zᵀ, row by row, in the
 * order of the reference implementation.
 *   out (B, D + F(F+1)/2)
 *   x   (B, D)       the bottom MLP's output
 *   emb (B, F, D)    the pooled embeddings (dlrec_bag_forward's output)
 * 1 <= F <= 256, 1 <= D <= 4096. */
dlrec_status dlrec_interaction_dot_forward(float *out, const float *x, const float *emb, int B, int F, int D);

/* The backward of dlrec_interaction_dot_forward, given dout (B, D + F(F+1)/2):
 *   dx   (B, D)     overwritten: dout's first D values plus the pair terms
 *   demb (B, F, D)  overwritten
 * x and emb are the forward's inputs. dx and demb must not overlap the inputs. */
dlrec_status dlrec_interaction_dot_backward(float *dx, float *demb, const float *dout, const float *x,
                                            const float *emb, int B, int F, int D);

/* ---- loss --------------------------------------------------------------- */

/* Binary cross-entropy on logits, averaged over the batch:
 *   *loss = (1/B) Σ_b [ max(z_b, 0) - z_b y_b + log(1 + exp(-|z_b|)) ]
 * which equals -y log σ(z) - (1-y) log(1-σ(z)) without overflow or log(0) for
 * any finite logit. logits (B), labels (B) in [0, 1]. Accumulated in double
 * in sample order, so the value does not depend on the thread count. */
dlrec_status dlrec_bce_logits_forward(double *loss, const float *logits, const float *labels, int B);

/* The backward of the mean loss: dlogits[b] = (σ(z_b) - y_b) / B.
 * dlogits == logits is allowed. */
dlrec_status dlrec_bce_logits_backward(float *dlogits, const float *logits, const float *labels, int B);

/* ---- dense optimizers ---------------------------------------------------- */

typedef enum dlrec_optim_kind {
  DLREC_OPTIM_SGD = 0,
  DLREC_OPTIM_ADAM = 1,
  DLREC_OPTIM_ADAGRAD = 2,
} dlrec_optim_kind;

/* Hyperparameters. Weight decay is the L2 kind (PyTorch's weight_decay for
 * SGD, Adam and Adagrad): g += weight_decay * w before the update. */
typedef struct dlrec_optim_config {
  dlrec_optim_kind kind;
  float lr;
  float weight_decay;
  float beta1, beta2;        /* Adam's moment decay rates */
  float eps;                 /* Adam and Adagrad: added to the denominator's square root */
  float initial_accumulator; /* Adagrad: the accumulator's starting value */
} dlrec_optim_config;

/* Defaults for kind: lr 0.01, weight_decay 0, beta1 0.9, beta2 0.999,
 * eps 1e-8 (Adam) or 1e-10 (Adagrad), initial_accumulator 0 (PyTorch's). */
void dlrec_optim_config_default(dlrec_optim_config *c, dlrec_optim_kind kind);

/* Floats of optimizer state for n parameters: 0 (SGD), 2n (Adam: m then v),
 * n (Adagrad: the sum of squared gradients). */
size_t dlrec_optim_state_floats(const dlrec_optim_config *c, size_t n);

/* Sets the state (dlrec_optim_state_floats(c, n) floats) to its starting
 * value: zeros, or initial_accumulator for Adagrad. state may be NULL for SGD. */
dlrec_status dlrec_optim_state_init(const dlrec_optim_config *c, float *state, size_t n);

/* One update of n parameters in place, given their gradients:
 *   SGD:     w -= lr g
 *   Adam:    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;
 *            w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 *   Adagrad: s += g²;  w -= lr g / (sqrt(s) + eps)
 * with g = grad + weight_decay w. step is t, the 1-based number of this
 * update (Adam's bias correction); the caller keeps it, so the state is plain
 * arrays that a checkpoint copies. grad is not modified. */
dlrec_status dlrec_optim_step(const dlrec_optim_config *c, float *param, const float *grad, float *state, size_t n,
                              uint64_t step);

/* ---- batch-invariant linear layer for inference --------------------------- */

/* A linear layer whose outputs are bitwise reproducible: each out[b][o] is
 *   acc = bias[o] (0 without a bias);
 *   acc = fma(in[b][k], W[o][k], acc) for k = 0 .. IN-1 in increasing order;
 *   out[b][o] = relu ? (acc > 0 ? acc : 0) : acc
 * with one rounding per multiply-add where the target has FMA (separately
 * rounded multiply and add otherwise). The value depends only on row b and
 * the weights: not on B, the other rows, the row's position in the batch or
 * the thread count. Bits may differ between builds (compiler, flags, FMA or
 * not) and from dlrec_linear_forward, whose sgemm orders its sums by the
 * matrix sizes. For scoring; training keeps dlrec_linear_*. */
typedef struct dlrec_packed_linear dlrec_packed_linear;

/* Packs weight (OUT, IN), row-major as in dlrec_linear_forward, and bias
 * (OUT, or NULL for none) into a new layer at *out, which the caller frees
 * with dlrec_packed_linear_free. The arrays are copied and not kept.
 * 1 <= IN, OUT <= 65536. DLREC_ERR_NOMEM when allocation fails; *out is NULL
 * on any failure. */
dlrec_status dlrec_packed_linear_create(dlrec_packed_linear **out, const float *weight, const float *bias, int IN,
                                        int OUT);

/* Frees p; NULL is allowed. */
void dlrec_packed_linear_free(dlrec_packed_linear *p);

/* out = act(in · Wᵀ + bias) with act the ReLU when relu != 0, in the fixed
 * order above.
 *   in  (B, IN)
 *   out (B, OUT), must not overlap in
 * B >= 1. OpenMP threads split the rows (large B) or the output panels
 * (small B); layers below about a million multiply-adds run on the calling
 * thread. p is only read: concurrent forwards on one p are allowed. */
dlrec_status dlrec_packed_linear_forward(const dlrec_packed_linear *p, const float *in, float *out, int B, int relu);

/* ==== building blocks of the CTR models ===================================== *
 *
 * The blocks below are what the models beyond DLRM are made of (issue 9):
 * the concat interaction, the DCN-v2 cross layer, the FM second-order term,
 * the first-order "wide" term, dropout and batch normalization. Each has a
 * training forward and a backward, and an inference forward whose bits for a
 * row depend on that row and the parameters only: not on B, the other rows,
 * the row's position or the thread count (the server merges requests into
 * one batch). Where the training forward uses sgemm, a separate *_infer
 * function runs the products through dlrec_packed_linear instead; where it
 * does not, the one forward is already batch-invariant and says so. */

/* ---- concat interaction (DLRM "cat") ----------------------------------------- */

/* Width of the concat interaction's output: DX + F·D. 0 when a size is out of
 * range (DX < 0, F or D < 1). */
size_t dlrec_interaction_concat_dim(int DX, int F, int D);

/* out = [x, flatten(emb)] per sample.
 *   out (B, DX + F·D)
 *   x   (B, DX)      the dense vector; DX = 0 (no dense columns) with x NULL
 *   emb (B, F, D)
 * 1 <= F <= 256, 1 <= D <= 4096, 0 <= DX <= 65536. Copies only, so the
 * output is batch-invariant. out must not overlap the inputs. */
dlrec_status dlrec_interaction_concat_forward(float *out, const float *x, const float *emb, int B, int DX, int F,
                                              int D);

/* The backward: dx (B, DX) and demb (B, F, D) are the matching slices of
 * dout, overwritten; dx may be NULL (to skip it, and when DX = 0). */
dlrec_status dlrec_interaction_concat_backward(float *dx, float *demb, const float *dout, int B, int DX, int F,
                                               int D);

/* ---- DCN-v2 cross layer --------------------------------------------------------- */

/* One layer of DCN-v2's cross network (Wang et al. 2021; TorchRec's CrossNet
 * and LowRankCrossNet):
 *   full rank: out = x0 ⊙ (xl · Wᵀ + bias) + xl,          W (d, d)
 *   low rank:  out = x0 ⊙ ((xl · Vᵀ) · Uᵀ + bias) + xl,  V (r, d), U (d, r)
 * i.e. W = U V. Weights are in nn.Linear's (OUT, IN) layout: V is the down
 * projection d -> r and U the up projection r -> d. x0 is the cross network's
 * input, xl the previous layer's output (xl = x0 for the first layer).
 * 1 <= d <= 65536, 1 <= r <= 65536; r = 0 below names the full-rank layer. */

/* Floats of the activations a training forward saves for the backward:
 * B·d (full rank, r = 0) or B·(r + d) (low rank). 0 for a bad size. */
size_t dlrec_cross_act_floats(int B, int d, int r);

/* Floats of the backward's scratch: B·d (full rank, r = 0) or B·(d + r). */
size_t dlrec_cross_ws_floats(int B, int d, int r);

/* The training forward of the full-rank layer, its product through g
 * (dlrec_gemm_ops; NULL: fp32 sgemm), as in every training forward and
 * backward below.
 *   out (B, d); act (dlrec_cross_act_floats(B, d, 0)), written for the backward
 *   x0, xl (B, d); w (d, d); bias (d)
 * out must not overlap the inputs; xl == x0 is allowed. */
dlrec_status dlrec_cross_forward(const dlrec_gemm_ops *g, float *out, float *act, const float *x0, const float *xl,
                                 const float *w, const float *bias, int B, int d);

/* The backward of dlrec_cross_forward, given dout (B, d):
 *   dx0   (B, d)  ACCUMULATED (+=), since x0 feeds every layer of a stack
 *   dxl   (B, d)  overwritten
 *   dw    (d, d), dbias (d)  accumulated
 *   ws    dlrec_cross_ws_floats(B, d, 0) floats of scratch
 * x0, xl, act and w are the forward's. dx0 and dxl must not overlap each
 * other or the inputs: for the first layer (xl = x0) add dxl to dx0. */
dlrec_status dlrec_cross_backward(const dlrec_gemm_ops *g, float *dx0, float *dxl, float *dw, float *dbias,
                                  const float *dout, const float *x0, const float *xl, const float *act, const float *w,
                                  float *ws, int B, int d);

/* The training forward of the low-rank layer: act (dlrec_cross_act_floats(B,
 * d, r)) receives t = xl · Vᵀ (B, r) then u = t · Uᵀ + bias (B, d). */
dlrec_status dlrec_cross_lowrank_forward(const dlrec_gemm_ops *g, float *out, float *act, const float *x0,
                                         const float *xl, const float *v, const float *u, const float *bias, int B,
                                         int d, int r);

/* The backward of the low-rank layer, given dout (B, d): dx0 (B, d)
 * accumulated, dxl (B, d) overwritten, dv (r, d), du (d, r) and dbias (d)
 * accumulated; ws holds dlrec_cross_ws_floats(B, d, r) floats. act, v and u
 * are the forward's. Overlap rules as dlrec_cross_backward. */
dlrec_status dlrec_cross_lowrank_backward(const dlrec_gemm_ops *g, float *dx0, float *dxl, float *dv, float *du,
                                          float *dbias, const float *dout, const float *x0, const float *xl,
                                          const float *act, const float *v, const float *u, float *ws, int B, int d,
                                          int r);

/* The inference forwards, batch-invariant: the products run through packed
 * layers (dlrec_packed_linear_create of w with its bias, IN = OUT = d; of v
 * without a bias, IN = d, OUT = r; of u with the bias, IN = r, OUT = d),
 * then out = x0 ⊙ u + xl elementwise, a multiply and an add each rounded.
 * The caller packs with the sizes stated: a packed layer does not expose
 * them to be checked. The low-rank one needs ws (B, r). The values differ
 * from the training forward's in the last bits (another summation order). */
dlrec_status dlrec_cross_infer(float *out, const float *x0, const float *xl, const dlrec_packed_linear *w, int B,
                               int d);
dlrec_status dlrec_cross_lowrank_infer(float *out, float *ws, const float *x0, const float *xl,
                                       const dlrec_packed_linear *v, const dlrec_packed_linear *u, int B, int d,
                                       int r);

/* The mixture of low-rank experts (DCN-Mix; TorchRec's LowRankMixtureCrossNet):
 *   t1_k = relu(xl · V_kᵀ)        (B, r),  V_k (r, d)
 *   t2_k = relu(t1_k · C_kᵀ)      (B, r),  C_k (r, r)
 *   e_k  = t2_k · U_kᵀ + bias     (B, d),  U_k (d, r), bias (d) shared
 *   p    = softmax_k(xl · G_kᵀ)   (B, K),  G (K, d): one bias-free gate per expert
 *   out  = x0 ⊙ Σ_k p_k e_k + xl  (the experts' sum in k order)
 * The K experts' weights lie back to back: v (K, r, d), c (K, r, r),
 * u (K, d, r). 1 <= K <= 64, 1 <= r, d <= 65536. */

/* Floats the training forward saves: K·B·(2r + d) + B·K. */
size_t dlrec_cross_mix_act_floats(int B, int d, int r, int K);

/* Floats of the backward's scratch: B·(3d + 2r + K). */
size_t dlrec_cross_mix_ws_floats(int B, int d, int r, int K);

/* Floats of the inference forward's scratch: B·(2r + d + K). */
size_t dlrec_cross_mix_infer_ws_floats(int B, int d, int r, int K);

/* The training forward (products through g); act receives t1, t2, e (each k-major) and p. */
dlrec_status dlrec_cross_mix_forward(const dlrec_gemm_ops *g, float *out, float *act, const float *x0, const float *xl,
                                     const float *v, const float *c, const float *u, const float *gate,
                                     const float *bias, int B, int d, int r, int K);

/* The backward, given dout (B, d): dx0 (B, d) accumulated, dxl (B, d)
 * overwritten; dv, dc, du, dgate, dbias accumulated (shapes of v, c, u,
 * gate, bias). act, v, c, u and gate are the forward's; ws holds
 * dlrec_cross_mix_ws_floats floats. Overlap rules as dlrec_cross_backward. */
dlrec_status dlrec_cross_mix_backward(const dlrec_gemm_ops *g, float *dx0, float *dxl, float *dv, float *dc, float *du,
                                      float *dgate, float *dbias, const float *dout, const float *x0, const float *xl,
                                      const float *act, const float *v, const float *c, const float *u,
                                      const float *gate, float *ws, int B, int d, int r, int K);

/* The batch-invariant inference forward: v[k], c[k] (without biases), u[k]
 * (with the bias) and gate (K outputs, without a bias) are packed layers of
 * the shapes above; the softmax and the mixture are per row in fixed order.
 * ws holds dlrec_cross_mix_infer_ws_floats floats. */
dlrec_status dlrec_cross_mix_infer(float *out, float *ws, const float *x0, const float *xl,
                                   const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                   const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B,
                                   int d, int r, int K);

/* ---- FM second-order term ------------------------------------------------------ */

/* Factorization machine's pairwise term (Rendle 2010) over the pooled
 * embeddings: per sample
 *   out[b] = ½ Σ_d ((Σ_f e[b][f][d])² − Σ_f e[b][f][d]²)
 * which equals Σ_{f<g} <e_f, e_g>.
 *   out (B), emb (B, F, D); 1 <= F <= 65536, 1 <= D <= 4096.
 * Per d the sums run over f in order in fp32, and the sum over d in double in
 * order, so a row's value is batch-invariant and thread-count invariant. */
dlrec_status dlrec_fm_forward(float *out, const float *emb, int B, int F, int D);

/* The backward: demb[b][f][d] = dout[b] · (Σ_g e[b][g][d] − e[b][f][d]),
 * overwritten. demb must not overlap emb. */
dlrec_status dlrec_fm_backward(float *demb, const float *dout, const float *emb, int B, int F, int D);

/* ---- first-order ("wide") term ------------------------------------------------- */

/* out[b] = Σ_f w[b][f] + bias: the logit of a logistic regression over
 * one-hot features, whose weights are the lookups of a width-1 table.
 *   out (B), w (B, F); bias a single float, or NULL for none.
 * 1 <= F <= 65536. Summed in fp32 over f in order, then the bias added:
 * batch-invariant. */
dlrec_status dlrec_wide_forward(float *out, const float *w, const float *bias, int B, int F);

/* The backward: dw[b][f] = dout[b] (overwritten), *dbias += Σ_b dout[b]
 * (accumulated, in b order; NULL to skip). */
dlrec_status dlrec_wide_backward(float *dw, float *dbias, const float *dout, int B, int F);

/* ---- dropout -------------------------------------------------------------------- */

/* Inverted dropout over n values with rate p: out[i] = keep(i) ? in[i] / (1 − p)
 * : 0 in training, out = in at inference (train = 0). Whether element i is
 * kept is a pure function of (seed, step, i): a counter-based draw, so the
 * mask does not depend on the thread count and the backward recomputes it
 * instead of storing it. Give each dropout layer its own seed (for example
 * the run's seed mixed with the layer's index) and pass the training step.
 * 0 <= p < 1; p = 0 copies. out == in is allowed. */
dlrec_status dlrec_dropout_forward(float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t step,
                                   int train);

/* The backward with the same (p, seed, step): din[i] = keep(i) ? dout[i] /
 * (1 − p) : 0. din == dout is allowed. */
dlrec_status dlrec_dropout_backward(float *din, const float *dout, size_t n, float p, uint64_t seed,
                                    uint64_t step);

/* ---- batch normalization -------------------------------------------------------- */

/* Batch normalization over (B, C) (PyTorch's BatchNorm1d with affine and
 * running statistics). Training normalizes with the batch's mean and biased
 * variance and updates the running statistics:
 *   running_mean = (1 − momentum) running_mean + momentum · mean
 *   running_var  = (1 − momentum) running_var  + momentum · var · B / (B − 1)
 * saved (2C) receives mean then 1/sqrt(var + eps) for the backward.
 *   out, in (B, C); gamma, beta, running_mean, running_var (C)
 * B >= 2 (one sample has no variance), 1 <= C <= 65536, eps > 0,
 * 0 <= momentum <= 1. Column statistics are summed over b in order in double,
 * so the result does not depend on the thread count. out == in is allowed. */
dlrec_status dlrec_batchnorm_train_forward(float *out, float *saved, const float *in, const float *gamma,
                                           const float *beta, float *running_mean, float *running_var,
                                           float momentum, float eps, int B, int C);

/* The backward of the training forward, given dout (B, C):
 *   din    (B, C)  overwritten; din == dout is allowed
 *   dgamma, dbeta (C)  accumulated
 * in, gamma and saved are the forward's. */
dlrec_status dlrec_batchnorm_backward(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                                      const float *gamma, const float *saved, int B, int C);

/* Batch normalization over a batch split in ways (a split training step,
 * model.h's dlrec_net_ws_split): each way holds B of the batch's N rows, and
 * the caller sums each statistic over the ways (in way order) between the
 * calls. The forward is
 *   dlrec_batchnorm_stats(sum, in, NULL, 0, B, C)       sum   = Σ_b x        → summed over ways
 *   dlrec_batchnorm_stats(sqdev, in, sum, N, B, C)      sqdev = Σ_b (x − sum/N)² → summed over ways
 *   dlrec_batchnorm_normalize(out, saved, in, sum, sqdev, N, ...)
 * and the backward
 *   dlrec_batchnorm_backward_stats(sg, sgx, dout, in, saved, B, C)  Σ dout, Σ dout ⊙ x̂ → summed over ways
 *   dlrec_batchnorm_backward_apply(din, dgamma, dbeta, ..., sg_way, sgx_way, sg, sgx, N, B, C)
 * Sums are doubles over b in order, per column. With one way (N = B) the
 * results are bitwise dlrec_batchnorm_train_forward's and
 * dlrec_batchnorm_backward's, which run these same steps. normalize moves
 * the running statistics unless running_mean and running_var are NULL (one
 * way moves them; every way sees the same statistics). backward_apply adds
 * the way's own sums (sg_way, sgx_way) to dbeta and dgamma, so that summing
 * the ways' gradients gives the batch's. B >= 1, N >= 2. */
dlrec_status dlrec_batchnorm_stats(double *out, const float *in, const double *sum, double N, int B, int C);
dlrec_status dlrec_batchnorm_normalize(float *out, float *saved, const float *in, const double *sum,
                                       const double *sqdev, double N, const float *gamma, const float *beta,
                                       float *running_mean, float *running_var, float momentum, float eps, int B,
                                       int C);
dlrec_status dlrec_batchnorm_backward_stats(double *sg, double *sgx, const float *dout, const float *in,
                                            const float *saved, int B, int C);
dlrec_status dlrec_batchnorm_backward_apply(float *din, float *dgamma, float *dbeta, const float *dout,
                                            const float *in, const float *gamma, const float *saved,
                                            const double *sg_way, const double *sgx_way, const double *sg,
                                            const double *sgx, double N, int B, int C);

/* Inference: out = gamma · (in − running_mean) / sqrt(running_var + eps) +
 * beta, elementwise from the running statistics, so scoring is
 * batch-invariant. B >= 1. out == in is allowed. */
dlrec_status dlrec_batchnorm_infer(float *out, const float *in, const float *gamma, const float *beta,
                                   const float *running_mean, const float *running_var, float eps, int B, int C);
/* Its backward, for training a batch normalized by the running statistics
 * (a batch of one row has no variance of its own): with invstd = 1 /
 * sqrt(running_var + eps) and x̂ = (in − running_mean) · invstd,
 *   din     = dout · (gamma · invstd)     overwritten; din == dout allowed
 *   dbeta  += Σ_b dout, dgamma += Σ_b dout · x̂   accumulated, rows in order. */
dlrec_status dlrec_batchnorm_infer_backward(float *din, float *dgamma, float *dbeta, const float *dout,
                                            const float *in, const float *gamma, const float *running_mean,
                                            const float *running_var, float eps, int B, int C);

#ifdef __cplusplus
}
#endif
#endif
