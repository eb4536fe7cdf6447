/* The sparse optimizer of a table: its hyperparameters and its state (one
 * accumulator per row, or Adam's moments and step counts), which the fused
 * sparse backward (the bag_backward_update op, ops.def) updates together
 * with the rows a batch touches (dense Adam and a table-wide L2 then sweep
 * the other rows, whose gradient is zero or the L2's alone). Dense gradients
 * of a whole table are never materialized. */
#ifndef DLREC_BACKEND_SPARSE_OPTIM_H
#define DLREC_BACKEND_SPARSE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/table.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dlrec_sparse_optim_kind {
  DLREC_SPARSE_SGD = 0,
  DLREC_SPARSE_ROWWISE_ADAGRAD = 1, /* one accumulator per row (FBGEMM's row-wise Adagrad) */
  DLREC_SPARSE_LAZY_ADAM = 2,       /* Adam on touched rows only, per-row step counts */
  /* torch.optim.Adam over the whole table (an nn.Embedding with dense
   * gradients): every row every step, untouched rows with a zero gradient,
   * so they keep moving on their moments. Lazy Adam's state; every row's
   * step count stays the global step. */
  DLREC_SPARSE_ADAM = 3,
} dlrec_sparse_optim_kind;

/* Which rows weight_decay's L2 gradient (g += weight_decay * w) reaches. */
typedef enum dlrec_sparse_l2_scope {
  DLREC_SPARSE_L2_TOUCHED = 0, /* the rows a batch touches only */
  DLREC_SPARSE_L2_TABLE = 1,   /* every row every step: (weight_decay / 2) ||W||^2 in the loss (FuxiCTR's
                                  embedding_regularizer) */
} dlrec_sparse_l2_scope;

/* Hyperparameters. weight_decay is the L2 kind (g += weight_decay * w), on
 * the rows l2_scope says. */
typedef struct dlrec_sparse_optim_config {
  dlrec_sparse_optim_kind kind;
  float lr;
  float weight_decay;
  float beta1, beta2;        /* Adam and lazy Adam */
  float eps;                 /* Adagrad and Adam */
  float initial_accumulator; /* row-wise Adagrad */
  dlrec_sparse_l2_scope l2_scope;
} dlrec_sparse_optim_config;

/* Defaults for kind: lr 0.01, weight_decay 0, beta1 0.9, beta2 0.999,
 * eps 1e-8 (Adam) or 1e-10 (Adagrad), initial_accumulator 0, l2_scope
 * touched. */
void dlrec_sparse_optim_config_default(dlrec_sparse_optim_config *c, dlrec_sparse_optim_kind kind);

/* 1 when an update with config c changes rows its batch does not touch
 * (kind adam; l2_scope table with weight_decay > 0): each update then sweeps
 * the whole table after the touched rows, reading and writing every row and
 * its state. Such a table must be the whole logical table in one place: not
 * a cache (a tiered store's), a shard, or a device's hot rows. */
int dlrec_sparse_optim_sweeps(const dlrec_sparse_optim_config *c);

/* The optimizer of one table, holding its state (mmap'd like the table):
 *   SGD:               none
 *   row-wise Adagrad:  accum (rows): the running sum of the mean over the row
 *                      of the squared gradient
 *   lazy Adam:         m, v (rows, stride) and steps (rows): how many updates
 *                      each row has had, which sets its bias correction
 * The table must outlive the optimizer. */
typedef struct dlrec_sparse_optim dlrec_sparse_optim;

dlrec_status dlrec_sparse_optim_create(dlrec_sparse_optim **o, const dlrec_table *t,
                                       const dlrec_sparse_optim_config *c);
void dlrec_sparse_optim_free(dlrec_sparse_optim *o); /* accepts NULL */

/* Changes the learning rate for later updates (warmup and decay schedules). */
dlrec_status dlrec_sparse_optim_set_lr(dlrec_sparse_optim *o, float lr);

/* For a table that holds rows of a larger logical table (a tiered store's
 * cache): row_keys[r] is the logical row that table row r holds, and keys
 * the stochastic rounding of a 16-bit row instead of r, so that a row rounds
 * the same wherever it is cached. row_keys must stay valid (and current)
 * while updates run; NULL (the default) keys each row by itself. */
void dlrec_sparse_optim_set_row_keys(dlrec_sparse_optim *o, const uint64_t *row_keys);
/* The row keys set, or NULL. For a mirror in a backend's memory (a hot
 * rows' optimizer) they are that memory too. */
const uint64_t *dlrec_sparse_optim_row_keys(const dlrec_sparse_optim *o);

/* The optimizer's state arrays, for checkpoints and tests; NULL where the
 * kind has none. Valid until dlrec_sparse_optim_free. */
typedef struct dlrec_sparse_optim_state {
  uint64_t rows;
  uint32_t stride;
  float *accum;    /* (rows) row-wise Adagrad */
  float *m, *v;    /* (rows, stride) (lazy) Adam; padding zero */
  uint32_t *steps; /* (rows) (lazy) Adam */
  /* The number of updates so far, which keys the stochastic rounding of a
   * 16-bit table's rows (so a resumed run rounds as the original would);
   * NULL for an fp32 table, which needs no rounding. */
  uint64_t *updates;
} dlrec_sparse_optim_state;
void dlrec_sparse_optim_state_view(dlrec_sparse_optim *o, dlrec_sparse_optim_state *s);

/* An optimizer of table t (a dlrec_table_wrap mirror) over state arrays the
 * caller owns, as s lays them out for t's shape and c's kind (accum; m, v,
 * steps; NULL where the kind has none), with s->updates' count (0 when
 * NULL). Not touched here: a backend's mirror of an optimizer's state in
 * its own memory. dlrec_sparse_optim_free frees the handle alone. */
dlrec_status dlrec_sparse_optim_wrap(dlrec_sparse_optim **o, const dlrec_table *t, const dlrec_sparse_optim_config *c,
                                     const dlrec_sparse_optim_state *s);
/* The hyperparameters (the learning rate as last set). */
const dlrec_sparse_optim_config *dlrec_sparse_optim_get_config(const dlrec_sparse_optim *o);

/* Bytes of scratch that the bag_backward_update op needs for a batch of at
 * most max_ids ids in all (B times the sum of the columns' max hotness).
 * Plan it once; the scratch holds nothing between calls. */
size_t dlrec_bag_backward_scratch_bytes(const dlrec_table *t, uint64_t max_ids);

#ifdef __cplusplus
}
#endif
#endif
