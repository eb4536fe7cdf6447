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

#include "dlrec/status.h"

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

#ifdef __cplusplus
}
#endif
#endif
