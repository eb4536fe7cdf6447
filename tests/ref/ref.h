/* The naive references of every backend op (src/backend/ops.def), in
 * double precision: the obvious loops of each formula, written for reading,
 * not speed (llm.c's CPU reference beside each kernel). The unit tests of
 * the kernels (test_nn, test_nn_blocks, test_embed) and the op-by-op backend
 * test (test_backend) check every implementation against these.
 *
 * Conventions:
 *   - One function per op, with the op's argument order: outputs, inputs,
 *     sizes. Shapes row-major as in src/backend/ops.def, in double.
 *   - Every output is OVERWRITTEN, also where the op accumulates (dW += ...):
 *     a test adds what it pre-filled, so accumulation is checked there.
 *   - Optional outputs and inputs (a bias, din of the first layer) may be
 *     NULL where the op allows it.
 *   - Backwards are closed forms; each is itself checked against central
 *     differences of its forward (test_backend), so the two cannot share a
 *     mistake unnoticed.
 */
#ifndef DLREC_TEST_REF_H
#define DLREC_TEST_REF_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"

/* d[i] = f[i] for n values. */
void ref_to_double(double *d, const float *f, size_t n);
/* Σ_i a[i] · r[i]: the loss L = Σ R ⊙ out whose gradient is R. */
double ref_weighted_sum(const double *a, const float *r, size_t n);

/* The central difference (L(p + h) − L(p − h)) / 2h of loss(ctx) in *p,
 * which is restored afterwards. */
typedef double (*ref_loss_fn)(void *ctx);
double ref_central_difference(ref_loss_fn loss, void *ctx, double *p, double h);

/* ---- moving rows ------------------------------------------------------------ */

/* dst's first width values of each of rows rows = src's (src_ld 0: src's
 * one row in every row); fill sets them to value; the rest of dst is left
 * as it was. */
void ref_copy_rows(double *dst, size_t dst_ld, const double *src, size_t src_ld, size_t rows, size_t width);
void ref_fill_rows(double *dst, size_t dst_ld, size_t rows, size_t width, double value);
/* y += x; x *= s. (Rounded to float once, a double sum or product of two
 * floats is float arithmetic's: the double has more than twice the bits.) */
void ref_add(double *y, const double *x, size_t n);
void ref_scale(double *x, size_t n, double s);
/* dst row i = src row idx[i]; dst (rows, width) = src row i at row idx[i],
 * zeros elsewhere (the scatter's contribution, which the op adds). */
void ref_gather_rows(double *dst, const double *src, size_t rows, const uint32_t *idx, size_t n, size_t width);
void ref_scatter_add_rows(double *dst, size_t rows, const uint32_t *idx, const double *src, size_t n, size_t width);
/* dst[c] = Σ_b src[b][c], in b order. */
void ref_sum_columns(double *dst, const double *src, size_t B, size_t C);

/* ---- linear ---------------------------------------------------------------- */

/* out (B, OUT) = act(in (B, IN) · Wᵀ + bias), W (OUT, IN), act the ReLU when
 * relu != 0; bias may be NULL. */
void ref_linear_forward(double *out, const double *in, const double *w, const double *bias, int B, int IN, int OUT,
                        int relu);
/* The magnitude a rounding error of the forward scales with:
 * mag[b][o] = Σ_k |in[b][k] · W[o][k]| + |bias[o]| (mag NULL: nothing). */
void ref_linear_forward_abs(double *mag, const double *in, const double *w, const double *bias, int B, int IN,
                            int OUT);
/* How far the pre-activations (the linear layer without its ReLU) keep from
 * the ReLU's kink: *kink = min(*kink, min_i |pre_i| − slack · mag_i), for a
 * finite difference that must not cross it (mag: ref_linear_forward_abs's;
 * slack: how far a rounded operand may move a value per unit of mag; mag
 * NULL: nothing). */
void ref_linear_kinks(double *kink, double slack, const double *in, const double *w, const double *bias, int B,
                      int IN, int OUT, const double *mag);
/* dW (OUT, IN) = doutᵀ · in;  dbias (OUT) = Σ_b dout[b];  din (B, IN) = dout · W.
 * Any output may be NULL. */
void ref_linear_backward(double *din, double *dw, double *dbias, const double *dout, const double *in,
                         const double *w, int B, int IN, int OUT);
/* The same sums with every term's absolute value: the magnitudes of the
 * backward's rounding errors. */
void ref_linear_backward_abs(double *din, double *dw, double *dbias, const double *dout, const double *in,
                             const double *w, int B, int IN, int OUT);

/* ---- activations --------------------------------------------------------------- */

/* out[i] = in[i] > 0 ? in[i] : 0 (so −0 and NaN give +0). */
void ref_relu_forward(double *out, const double *in, size_t n);
/* din[i] = out[i] > 0 ? dout[i] : 0 (out is the ReLU's output). */
void ref_relu_backward(double *din, const double *dout, const double *out, size_t n);
/* out[i] = 1 / (1 + e^−in[i]). */
void ref_sigmoid(double *out, const double *in, size_t n);

/* ---- interactions ---------------------------------------------------------------- */

/* DLRM's dot interaction per sample, Z = [x; e_1 .. e_F]:
 * out = [x, Z_i · Z_j for i in 1..F for j in 0..i-1]   (B, D + F(F+1)/2). */
void ref_dot_forward(double *out, const double *x, const double *emb, int B, int F, int D);
/* dx (B, D) = dout[:D] + Σ_pairs with x dout_p · e_i;
 * demb[i] = Σ_{pairs (i, j)} dout_p · Z_j + Σ_{pairs (j, i)} dout_p · Z_j. */
void ref_dot_backward(double *dx, double *demb, const double *dout, const double *x, const double *emb, int B, int F,
                      int D);
/* out = [x, flatten(emb)]  (B, DX + F·D); x may be NULL when DX = 0. */
void ref_concat_forward(double *out, const double *x, const double *emb, int B, int DX, int F, int D);
/* dx, demb: the matching slices of dout; dx may be NULL. */
void ref_concat_backward(double *dx, double *demb, const double *dout, int B, int DX, int F, int D);

/* ---- DCN-v2 cross layers -------------------------------------------------------------- */

/* out = x0 ⊙ s + xl,  s = xl · Wᵀ + bias    W (d, d). */
void ref_cross_forward(double *out, const double *x0, const double *xl, const double *w, const double *bias, int B,
                       int d);
/* With g = dout ⊙ x0:  dx0 = dout ⊙ s;  dW = gᵀ · xl;  dbias = Σ_b g;
 * dxl = g · W + dout. */
void ref_cross_backward(double *dx0, double *dxl, double *dw, double *dbias, const double *dout, const double *x0,
                        const double *xl, const double *w, const double *bias, int B, int d);
/* out = x0 ⊙ s + xl,  s = (xl · Vᵀ) · Uᵀ + bias    V (r, d), U (d, r). */
void ref_cross_lowrank_forward(double *out, const double *x0, const double *xl, const double *v, const double *u,
                               const double *bias, int B, int d, int r);
/* With t = xl · Vᵀ and g = dout ⊙ x0:  dx0 = dout ⊙ s;  dU = gᵀ · t;
 * dbias = Σ_b g;  dt = g · U;  dV = dtᵀ · xl;  dxl = dt · V + dout. */
void ref_cross_lowrank_backward(double *dx0, double *dxl, double *dv, double *du, double *dbias, const double *dout,
                                const double *x0, const double *xl, const double *v, const double *u,
                                const double *bias, int B, int d, int r);
/* DCN-Mix per row a = xl[b]:
 *   t1_k = relu(V_k a);  t2_k = relu(C_k t1_k);  e_k = U_k t2_k + bias;
 *   p = softmax_k(G_k · a);  out = x0 ⊙ Σ_k p_k e_k + a
 * v (K, r, d), c (K, r, r), u (K, d, r), gate (K, d), bias (d). min_pre
 * (may be NULL) receives the smallest nonzero |pre-activation| of a ReLU, to
 * tell a finite difference that would cross a kink. */
void ref_cross_mix_forward(double *out, double *min_pre, const double *x0, const double *xl, const double *v,
                           const double *c, const double *u, const double *gate, const double *bias, int B, int d,
                           int r, int K);
/* Its backward by the chain rule through the mixture, the softmax
 * (dlogit_k = p_k (dp_k − Σ_j p_j dp_j)) and each expert's ReLUs. */
void ref_cross_mix_backward(double *dx0, double *dxl, double *dv, double *dc, double *du, double *dgate,
                            double *dbias, const double *dout, const double *x0, const double *xl, const double *v,
                            const double *c, const double *u, const double *gate, const double *bias, int B, int d,
                            int r, int K);

/* ---- FM and wide ------------------------------------------------------------------------- */

/* out[b] = Σ_{f<g} <e_f, e_g>: the pairwise definition, not the identity the
 * kernel uses. */
void ref_fm_forward(double *out, const double *emb, int B, int F, int D);
/* demb[b][f][d] = dout[b] · Σ_{g≠f} e[b][g][d]. */
void ref_fm_backward(double *demb, const double *dout, const double *emb, int B, int F, int D);
/* out[b] = Σ_f w[b][f] + *bias (bias may be NULL). */
void ref_wide_forward(double *out, const double *w, const double *bias, int B, int F);
/* dw[b][f] = dout[b];  *dbias = Σ_b dout[b] (dbias may be NULL). */
void ref_wide_backward(double *dw, double *dbias, const double *dout, int B, int F);

/* ---- dropout ------------------------------------------------------------------------------ */

/* Whether dropout keeps element i, by the documented draw (src/backend/cpu/dropout.c):
 * key = mix(seed ⊕ 0x6a09e667f3bcc909) ⊕ mix(step + φ), draw =
 * mix(key + (i + 1) φ) with mix SplitMix64's finalizer and φ = 0x9e3779b97f4a7c15;
 * kept when the draw's top 32 bits are >= ⌊p · 2³²⌋. Written out here again
 * so that another backend's mask is checked against the formula. */
int ref_dropout_keep(float p, uint64_t seed, uint64_t step, size_t i);
/* out[i] = keep(i) ? in[i] / (1 − p) : 0 in training; in at inference. */
void ref_dropout_forward(double *out, const double *in, size_t n, float p, uint64_t seed, uint64_t step, int train);
/* din[i] = keep(i) ? dout[i] / (1 − p) : 0. */
void ref_dropout_backward(double *din, const double *dout, size_t n, float p, uint64_t seed, uint64_t step);

/* ---- batch normalization ----------------------------------------------------------------- */

/* PyTorch's BatchNorm1d in training: per column, mean and biased variance
 * over the batch, out = gamma (x − mean) / sqrt(var + eps) + beta; saved (2C,
 * may be NULL) = mean then 1/sqrt(var + eps); the running statistics (may be
 * NULL) move by momentum, the variance's unbiased (· B/(B − 1)). */
void ref_batchnorm_train_forward(double *out, double *saved, const double *in, const double *gamma,
                                 const double *beta, double *running_mean, double *running_var, double momentum,
                                 double eps, int B, int C);
/* With x̂ = (x − mean) · inv:  dbeta = Σ_b dout;  dgamma = Σ_b dout x̂;
 * din = gamma · inv / B · (B dout − Σ_b dout − x̂ Σ_b dout x̂). The
 * statistics are recomputed from in and eps. */
void ref_batchnorm_backward(double *din, double *dgamma, double *dbeta, const double *dout, const double *in,
                            const double *gamma, double eps, int B, int C);
/* out = gamma (in − running_mean) / sqrt(running_var + eps) + beta. */
void ref_batchnorm_infer(double *out, const double *in, const double *gamma, const double *beta,
                         const double *running_mean, const double *running_var, double eps, int B, int C);

/* From the running statistics, with inv = 1/sqrt(running_var + eps) and
 * x̂ = (in − running_mean) · inv: din = dout · gamma · inv; dgamma = Σ_b
 * dout x̂; dbeta = Σ_b dout. The _abs twin gives each sum's terms' absolute
 * values (and |din|). */
void ref_batchnorm_infer_backward(double *din, double *dgamma, double *dbeta, const double *dout, const double *in,
                                  const double *gamma, const double *running_mean, const double *running_var,
                                  double eps, int B, int C);
void ref_batchnorm_infer_backward_abs(double *din, double *dgamma, double *dbeta, const double *dout,
                                      const double *in, const double *gamma, const double *running_mean,
                                      const double *running_var, double eps, int B, int C);

/* ---- loss and the dense optimizers ----------------------------------------------------------- */

/* *loss = (1/B) Σ_b −y log σ(z) − (1 − y) log(1 − σ(z)), each log taken
 * without overflow. */
void ref_bce_forward(double *loss, const double *logits, const double *labels, int B);
/* dlogits[b] = (σ(z_b) − y_b) / B. */
void ref_bce_backward(double *dlogits, const double *logits, const double *labels, int B);
/* One step of cpu_optim_step's formulas (ops.def) in double, state laid
 * out as the op's: nothing (SGD), m then v (Adam, 2n), s (Adagrad, n). */
void ref_optim_step(const dlrec_optim_config *c, double *param, const double *grad, double *state, size_t n,
                    uint64_t step);

/* ---- embeddings ---------------------------------------------------------------------------- */

/* out[b][c] (B, F, D) = the sum, or the mean (mode MEAN or the column's
 * mean_cols flag; an empty bag gives zeros), of the rows of sample b's ids in
 * column c. rows (n_rows, stride) fp32. */
void ref_bag_forward(double *out, const float *rows, uint32_t stride, uint32_t D, const dlrec_bag_batch *bags,
                     dlrec_pooling mode);

/* The table and the sparse optimizers' state in double, dense: w and m, v
 * (rows, D), accum (rows, starting at initial_accumulator), steps (rows),
 * and t, the steps so far (start it at 0). */
typedef struct ref_sparse_state {
  double *w, *accum, *m, *v;
  uint32_t *steps;
  uint32_t t;
} ref_sparse_state;

/* One fused backward + update: the gradient of every row the batch touches,
 * summed in FLOAT in (column, sample, position) order as the API promises
 * (so a hot row's sum matches to the bit, not to a tolerance that would hide
 * errors; a mean bag's terms are scaled by the float 1/|bag| first), then
 * the optimizer in double, as torch.optim writes it over a dense gradient:
 *   SGD:               w −= lr g
 *   row-wise Adagrad:  a += mean_d g²;  w −= lr g / (sqrt(a) + eps)
 *   lazy Adam:         t = ++steps; Adam with bias correction by t
 *   Adam:              the same with t the global step, every row
 * with g = grad + weight_decay w on the touched rows (on every row for
 * l2_scope "table"). An untouched row (gradient zero) is updated by Adam
 * and, with a table-wide L2, by every kind; otherwise left alone. */
void ref_bag_backward_update(ref_sparse_state *s, const dlrec_sparse_optim_config *c, const dlrec_bag_batch *bags,
                             dlrec_pooling mode, const float *d_out, uint64_t rows, uint32_t D);

#endif
