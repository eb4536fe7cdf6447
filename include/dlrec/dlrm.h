/* DLRM (Naumov et al. 2019): a bottom MLP on the dense features, embedding
 * bags on the categorical ones, the pairwise dot interaction, a top MLP and a
 * sigmoid.
 *
 * A model (dlrec_dlrm) holds the parameters: the dense ones in one flat array
 * (so one optimizer call and one checkpoint record cover them) and the fused
 * embedding table. A workspace (dlrec_dlrm_ws) holds every activation and
 * gradient buffer for batches of up to max_batch rows, planned once; the
 * trainer owns one, and each serving thread owns its own while they share
 * one model read-only.
 */
#ifndef DLREC_DLRM_H
#define DLREC_DLRM_H

#include <stddef.h>
#include <stdint.h>

#include "dlrec/embed.h"
#include "dlrec/loader.h"
#include "dlrec/nn.h"
#include "dlrec/schema.h"
#include "dlrec/status.h"

#define DLREC_MLP_MAX_LAYERS 8

typedef struct dlrec_dlrm_shape {
  uint32_t emb_dim;                       /* D: embedding width = the bottom MLP's last width */
  uint32_t n_bottom;                      /* bottom MLP layers (>= 1), all ReLU */
  uint32_t bottom[DLREC_MLP_MAX_LAYERS];  /* their output widths */
  uint32_t n_top;                         /* top MLP layers (>= 1), ReLU but the last */
  uint32_t top[DLREC_MLP_MAX_LAYERS];     /* their output widths; the last is 1 (the logit) */
  dlrec_bag_mode pooling;                 /* how multi-hot bags pool */
} dlrec_dlrm_shape;

typedef struct dlrec_dlrm dlrec_dlrm;
typedef struct dlrec_dlrm_ws dlrec_dlrm_ws;

/* Creates a model for data of `schema` (its dense and sparse columns and the
 * fused table's rows), with parameters zeroed. Checks the shape against the
 * schema (bottom's last width == emb_dim, top's last == 1). */
dlrec_status dlrec_dlrm_create(dlrec_dlrm **m, const dlrec_dlrm_shape *shape, const dlrec_schema *schema);
void dlrec_dlrm_free(dlrec_dlrm *m); /* accepts NULL */

/* Initializes the parameters from seed, as the DLRM reference does: MLP
 * weights normal with std sqrt(2 / (fan_in + fan_out)) (Xavier), biases normal
 * with std sqrt(1 / fan_out), each column's embedding rows uniform in
 * ±sqrt(1 / its rows). The same for any thread count. */
dlrec_status dlrec_dlrm_init(dlrec_dlrm *m, uint64_t seed);

const dlrec_dlrm_shape *dlrec_dlrm_get_shape(const dlrec_dlrm *m);
const dlrec_schema *dlrec_dlrm_schema(const dlrec_dlrm *m);
/* The flat dense parameters (n floats), valid for the model's life. */
float *dlrec_dlrm_dense_params(dlrec_dlrm *m, size_t *n);
const float *dlrec_dlrm_dense_params_const(const dlrec_dlrm *m, size_t *n);
dlrec_table *dlrec_dlrm_table(dlrec_dlrm *m);
const dlrec_table *dlrec_dlrm_table_const(const dlrec_dlrm *m);

/* A workspace for batches of up to max_batch rows of model m's shape. */
dlrec_status dlrec_dlrm_ws_create(dlrec_dlrm_ws **ws, const dlrec_dlrm *m, uint32_t max_batch);
void dlrec_dlrm_ws_free(dlrec_dlrm_ws *ws); /* accepts NULL */

/* Where a workspace's forward and backward passes spent their time, summed
 * since the workspace was created (wall seconds, read with dlrec_now()
 * around each phase; the clock reads cost ~0.1 us a phase). */
typedef struct dlrec_dlrm_profile {
  uint64_t forward_rows;  /* rows through the forward pass */
  uint64_t backward_rows; /* rows through the backward pass */
  uint64_t lookups;       /* ids pooled by the embedding forward */
  double mlp_flops;       /* the MLPs' flops (2 per multiply-add), forward and backward */
  double mlp;             /* the MLPs: GEMMs, bias, ReLU, forward and backward */
  double emb_forward;     /* embedding bag lookups and pooling */
  double emb_update;      /* the fused sparse backward + optimizer update */
  double interaction;     /* dot interaction, forward and backward */
  double other;           /* loss, sigmoid, dense optimizer step */
} dlrec_dlrm_profile;
void dlrec_dlrm_ws_profile(const dlrec_dlrm_ws *ws, dlrec_dlrm_profile *p);

/* Scoring. A scorer holds the model's MLP weights packed for the
 * batch-invariant linear kernel (dlrec_packed_linear_forward), so that a
 * row's score is bitwise the same whatever batch it is scored in, at any
 * batch size and thread count: `dlrec predict`, evaluation and the server
 * agree to the bit. The packed weights are a snapshot of the MLPs when the
 * scorer is created (after training steps, create a new one); the embedding
 * table is read live. */
typedef struct dlrec_dlrm_scorer dlrec_dlrm_scorer;
dlrec_status dlrec_dlrm_scorer_create(dlrec_dlrm_scorer **s, const dlrec_dlrm *m);
void dlrec_dlrm_scorer_free(dlrec_dlrm_scorer *s); /* accepts NULL */

/* Scores a batch: prob[b] = σ(logit_b) for b < batch->rows (<= max_batch).
 * Reads the scorer and its model only, so threads with their own
 * workspaces may share them. A batch with ids outside the table is refused. */
dlrec_status dlrec_dlrm_predict(const dlrec_dlrm_scorer *s, dlrec_dlrm_ws *ws, const dlrec_batch *batch,
                                float *prob);

/* Optimizers of one training run. */
typedef struct dlrec_dlrm_optim {
  dlrec_optim_config dense;   /* dense.lr is the base learning rate */
  float *dense_state;         /* dlrec_optim_state_floats(&dense, n) floats */
  dlrec_sparse_optim *sparse; /* on the model's table */
  float sparse_lr;            /* the sparse optimizer's base learning rate */
} dlrec_dlrm_optim;

/* One training step on a labeled batch: forward, loss, backward, then the
 * sparse update of the touched embedding rows (fused into backward) and the
 * dense update, each with its base learning rate times lr_scale (the
 * schedule's warmup/decay factor); step is the 1-based update number (Adam). Writes the batch's mean loss and, if prob is not NULL, the batch's
 * predictions before the update. */
dlrec_status dlrec_dlrm_train_step(dlrec_dlrm *m, dlrec_dlrm_ws *ws, dlrec_dlrm_optim *opt, const dlrec_batch *batch,
                                   float lr_scale, uint64_t step, double *loss, float *prob);

/* For gradient checks: forward + backward without any update, leaving the
 * dense gradients in *grad (n floats, valid until the next call) and d_emb
 * (B, F, D) in *d_emb. */
dlrec_status dlrec_dlrm_gradients(dlrec_dlrm *m, dlrec_dlrm_ws *ws, const dlrec_batch *batch, double *loss,
                                  const float **grad, const float **d_emb);

#endif
