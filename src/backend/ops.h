/* What the backend's ops take (ops.def declares the ops themselves): the
 * types of their arguments and the size queries of their buffers.
 *
 * The argument convention, shared by every op so that a CUDA twin has the
 * same signature: the backend first, then the outputs, then the inputs, then
 * the sizes; fp32, row-major, shapes in the comments of ops.def. Nothing in
 * an op allocates: callers plan activations, gradients, optimizer state and
 * scratch once (sizes from the queries below) and pass them in.
 *
 * Gradients of parameters accumulate (dW += ...), so a trainer zeroes them
 * once per step; gradients of inputs are overwritten (din = ...); ops.def
 * says which at each. Every op returns DLREC_ERR_INVALID (with a message for
 * dlrec_last_error()) for a NULL required pointer or a size out of range,
 * and touches nothing in that case. In-place use is allowed only where an
 * op says so.
 *
 * The types here are the backend's own (a layer below the embedding stage
 * and the models, shared/ARCHITECTURE.md): the fused table (table.h) as a
 * tensor of rows, a batch of bags as the loader lays it out, the sparse
 * optimizer (sparse_optim.h), the dense optimizer's hyperparameters, and
 * the packed batch-invariant linear layer.
 */
#ifndef DLREC_BACKEND_OPS_H
#define DLREC_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/sparse_optim.h"
#include "backend/table.h"
#include "core/pooling.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activation a linear layer fuses after its bias. */
typedef enum dlrec_act {
  DLREC_ACT_NONE = 0,
  DLREC_ACT_RELU = 1,
} dlrec_act;

/* ---- embedding bags ---------------------------------------------------------- */

/* The most columns (bags per sample) in one batch. */
#define DLREC_BAG_MAX_COLS 4096

/* How a bag pools is core/pooling.h's dlrec_pooling, the enum the schema and
 * a model's config use too. */

/* One batch's bags in CSR form per column, the dlrec_batch layout of
 * loader.h: sample b of column c holds the global ids
 * ids[c][offsets[c][b] .. offsets[c][b+1]). Build it from a batch with
 *   dlrec_bag_batch bags = {batch->rows, F, batch->offsets, batch->ids};
 * Host memory, on every backend: a GPU's bag ops check it on the host and
 * copy it over. */
typedef struct dlrec_bag_batch {
  uint32_t rows;                  /* B, samples */
  uint32_t cols;                  /* F, columns (bags per sample), 1 to DLREC_BAG_MAX_COLS */
  const uint32_t *const *offsets; /* F arrays of (B + 1), non-decreasing */
  const uint32_t *const *ids;     /* F arrays of ids, each of offsets[c][B] values at least */
  /* F flags, or NULL for none: column c pools by its mean when the mode is
   * DLREC_POOLING_MEAN or mean_cols[c] is nonzero (a column the ETL schema
   * declares with mean pooling). */
  const uint8_t *mean_cols;
} dlrec_bag_batch;

/* Checks a batch against a table: shapes, non-decreasing offsets, and every
 * id < rows. Returns DLREC_ERR_INVALID naming the first bad column, sample
 * and id. The bag ops check the same things as they go, so callers need
 * this only to check a batch up front. */
dlrec_status dlrec_bag_check(const dlrec_table *t, const dlrec_bag_batch *bags);

/* ---- the dense optimizer's hyperparameters --------------------------------------- */

typedef enum dlrec_optim_kind {
  DLREC_OPTIM_SGD = 0,
  DLREC_OPTIM_ADAM = 1,
  DLREC_OPTIM_ADAGRAD = 2,
} dlrec_optim_kind;

/* Weight decay is the L2 kind (PyTorch's weight_decay for SGD, Adam and
 * Adagrad): g += weight_decay * w before the update. */
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

/* Sets the state (dlrec_optim_state_floats(c, n) floats, host memory) to its
 * starting value: zeros, or initial_accumulator for Adagrad. state may be
 * NULL for SGD. */
dlrec_status dlrec_optim_state_init(const dlrec_optim_config *c, float *state, size_t n);

/* ---- the packed batch-invariant linear layer ---------------------------------- */

/* A linear layer packed for scoring (the packed_create op): its outputs are
 * bitwise reproducible, each out[b][o] being
 *   acc = bias[o] (0 without a bias);
 *   acc = fma(in[b][k], W[o][k], acc) for k = 0 .. IN-1 in increasing order;
 *   out[b][o] = relu ? (acc > 0 ? acc : 0) : acc
 * with one rounding per multiply-add where the target has FMA (separately
 * rounded multiply and add otherwise). The value depends only on row b and
 * the weights: not on B, the other rows, the row's position in the batch or
 * the thread count. Bits may differ between builds (compiler, flags, FMA or
 * not) and from the linear_forward op, whose GEMMs order their sums by the
 * matrix sizes. Opaque: each backend packs in its own way. */
typedef struct dlrec_packed_linear dlrec_packed_linear;

/* ---- the sizes of the ops' buffers ----------------------------------------------- */

/* Width of the dot interaction's output: D + F(F+1)/2 for F embedding
 * vectors of width D (the dense vector x and the F(F+1)/2 distinct pairs
 * among the F+1 vectors, self-pairs excluded). 0 when F or D is out of
 * range. */
size_t dlrec_interaction_dot_dim(int F, int D);
/* Width of the concat interaction's output: DX + F·D. 0 when a size is out
 * of range (DX < 0, F or D < 1). */
size_t dlrec_interaction_concat_dim(int DX, int F, int D);
/* Floats of the activations a cross layer's training forward saves for its
 * backward: B·d (full rank, r = 0) or B·(r + d) (low rank). 0 for a bad
 * size. */
size_t dlrec_cross_act_floats(int B, int d, int r);
/* Floats of a cross layer's backward scratch: B·d (full rank, r = 0) or
 * B·(d + r). */
size_t dlrec_cross_ws_floats(int B, int d, int r);
/* The mixture of low-rank experts: what its training forward saves,
 * K·B·(2r + d) + B·K; its backward's scratch, B·(3d + 2r + K); its
 * inference forward's scratch, B·(2r + d + K). */
size_t dlrec_cross_mix_act_floats(int B, int d, int r, int K);
size_t dlrec_cross_mix_ws_floats(int B, int d, int r, int K);
size_t dlrec_cross_mix_infer_ws_floats(int B, int d, int r, int K);

#ifdef __cplusplus
}
#endif
#endif
