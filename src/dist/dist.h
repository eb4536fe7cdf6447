/* Training across ranks (docs/distributed.md): the shard plan of the fused
 * embedding table, and the sharded embedding stage of a data-parallel step.
 *
 * The plan splits the fused table's columns over N ranks: a small column
 * whole to one rank (table-wise), a large one row by row (row-wise: row k of
 * the column goes to rank k mod N, so that the hot rows at the start of a
 * frequency-ordered column spread over every rank). Each rank holds its
 * rows in a shard table of its own, column after column.
 *
 * A step (src/train/step.c, the one step of one process too), on every
 * rank, for its part of the global batch (the loader's
 * dlrec_loader_opts.part), with this rank's shard as its embedding stage
 * (model/stage.h):
 *   1. the stage's rows: the unique rows its lookups need go to their
 *      owners (all-to-all), and the owners send the rows back (all-to-all);
 *   2. forward, loss and backward on those rows (dlrec_net_train_pass);
 *   3. the dense gradients are summed over the ranks in rank order
 *      (dlrec_comm_allreduce_f32), and every rank steps the dense
 *      optimizer alike;
 *   4. the stage's update: each lookup's gradient goes to its row's owner
 *      (all-to-all), which updates its rows with the fused sparse backward,
 *      in the same order as one process would.
 * Bitwise: N ranks of one thread train the same model as one process of N
 * threads (whose step splits the same rows N ways).
 */
#ifndef DLREC_DIST_H
#define DLREC_DIST_H

#include <stdio.h>

#include "model/row_source.h"
#include "dist/comm.h"
#include "model/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DLREC_DIST_MAX_RANKS 1024

typedef struct dlrec_shard_col {
  uint64_t begin, end; /* the column's rows of the fused table */
  int owner;           /* its rank when table-wise; -1 when row-wise */
} dlrec_shard_col;

typedef struct dlrec_shard_plan {
  int ranks;
  uint32_t n_cols, dim;
  uint32_t row_bytes;   /* a table row's bytes (its dtype, padded) */
  uint32_t optim_bytes; /* a row's sparse optimizer state */
  dlrec_shard_col cols[DLREC_MAX_SPARSE];
  /* base[c * ranks + r]: where column c's rows start in rank r's shard. */
  uint64_t *base;
  uint64_t *rows;      /* (ranks) each shard's rows */
  double *lookups;     /* (ranks) expected lookups a row of the batch sends each rank */
} dlrec_shard_plan;

/* Plans the schema's columns over `ranks` ranks for rows of row_bytes
 * table bytes and optim_bytes optimizer bytes: a column with more than
 * rowwise_share of a rank's fair part (1 / ranks) of the table's bytes goes
 * row-wise (0: every column; a large value: none). The plan depends only on
 * its arguments, so every rank makes the same. */
dlrec_status dlrec_shard_plan_make(dlrec_shard_plan *p, const dlrec_schema *schema, int ranks, uint32_t dim,
                                   uint32_t row_bytes, uint32_t optim_bytes, double rowwise_share);
void dlrec_shard_plan_free(dlrec_shard_plan *p);

/* The owner of fused row `id` of column c, and its row in the owner's shard. */
static inline int dlrec_shard_owner(const dlrec_shard_plan *p, uint32_t c, uint64_t id, uint64_t *local) {
  const dlrec_shard_col *col = &p->cols[c];
  const uint64_t k = id - col->begin;
  if (col->owner >= 0) {
    *local = p->base[(size_t)c * p->ranks + col->owner] + k;
    return col->owner;
  }
  const int r = (int)(k % (uint64_t)p->ranks);
  *local = p->base[(size_t)c * p->ranks + r] + k / (uint64_t)p->ranks;
  return r;
}

/* Calls fn(ctx, local, global, n) for each run of n consecutive shard rows
 * of rank r from `local` whose fused rows are global, global + stride, ...
 * (stride: 1 table-wise, ranks row-wise), in shard order. */
typedef dlrec_status (*dlrec_shard_run_fn)(void *ctx, uint64_t local, uint64_t global, uint64_t stride, uint64_t n);
dlrec_status dlrec_shard_plan_runs(const dlrec_shard_plan *p, int r, dlrec_shard_run_fn fn, void *ctx);

/* About the bytes of a rank's step buffers (dlrec_sharded_create) for parts
 * of at most max_rows rows: the part's rows fetched, its lookups' keys and
 * gradients, and the gradients its rows receive. */
uint64_t dlrec_shard_plan_step_bytes(const dlrec_shard_plan *p, const dlrec_schema *schema, uint32_t max_rows);

/* Prints the plan and each rank's memory (dense_bytes: the dense
 * parameters and their optimizer state, on every rank; step_bytes: the step
 * buffers of dlrec_shard_plan_step_bytes; ws_bytes: the model's activations
 * and workspaces, dlrec_net_ws_bytes's, on every rank). */
void dlrec_shard_plan_print(const dlrec_shard_plan *p, const dlrec_schema *schema, uint64_t dense_bytes,
                            uint64_t step_bytes, uint64_t ws_bytes, FILE *out);

/* ---- the sharded embedding stage ---------------------------------------- */

typedef struct dlrec_sharded dlrec_sharded;

/* This rank's shard of the table of net (a tableless network: no rank holds
 * the whole table), with a sparse optimizer of config oc on it, for parts
 * of at most max_rows rows. */
dlrec_status dlrec_sharded_create(dlrec_sharded **s, dlrec_comm *c, const dlrec_shard_plan *p, dlrec_net *net,
                                  const dlrec_sparse_optim_config *oc, uint32_t max_rows);
void dlrec_sharded_free(dlrec_sharded *s);

/* The shard's rows as dlrec_net_init(seed) draws the whole table's, with
 * the model's embedding_init (each rank draws the table a window at a time
 * and keeps its rows: the same start as one process, bit for bit). */
dlrec_status dlrec_sharded_init(dlrec_sharded *s, const dlrec_net_config *model, const dlrec_schema *schema,
                                uint64_t seed);

/* Rows between rank 0 and the shards, for checkpoints (dlrec_row_source):
 * rank 0 drives, calling get and put (with s as ctx) chunk by chunk and then
 * dlrec_sharded_rows_end with its status; meanwhile every other rank runs
 * dlrec_sharded_rows_serve, which returns when rank 0 ends, with rank 0's
 * status. The end also gives every rank rank 0's update count (a resume
 * sets it). Rank 0 holds one chunk of rows at a time, never the table. */
dlrec_row_source dlrec_sharded_rows(dlrec_sharded *s, uint64_t table_rows);
dlrec_status dlrec_sharded_rows_get(void *s, dlrec_row_array a, uint64_t first, uint64_t n, void *out);
dlrec_status dlrec_sharded_rows_put(void *s, dlrec_row_array a, uint64_t first, uint64_t n, const void *in);
dlrec_status dlrec_sharded_rows_end(dlrec_sharded *s, dlrec_status status);
dlrec_status dlrec_sharded_rows_serve(dlrec_sharded *s);

/* The shard as an embedding stage (steps 1 and 4 above), for the training
 * step (train/step.h) and for scoring; valid for s's life. */
dlrec_stage *dlrec_sharded_stage(dlrec_sharded *s);

/* Scores this rank's part b of a batch (the step's rows in: step 1 above)
 * with scorer sc into prob (b->rows). Collective, like a step, and like a
 * step's, its errors may leave the other ranks waiting. */
dlrec_status dlrec_sharded_score(dlrec_sharded *s, const dlrec_net_scorer *sc, dlrec_net_ws *ws, const dlrec_batch *b,
                                 float *prob);

/* The stage's counts (steps, lookups, unique rows); the step's
 * (train/step.h) fill in the bytes and seconds. */
typedef struct dlrec_sharded_stats {
  uint64_t steps;
  uint64_t lookups, unique_rows; /* this rank's, over the steps */
  uint64_t bytes_sent;           /* this rank's, to other ranks */
  double exchange_seconds, compute_seconds, update_seconds;
} dlrec_sharded_stats;
void dlrec_sharded_get_stats(const dlrec_sharded *s, dlrec_sharded_stats *st);

#ifdef __cplusplus
}
#endif
#endif
