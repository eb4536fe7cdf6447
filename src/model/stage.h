/* The embedding stage of a network's passes: where a batch's ids become the
 * pooled rows emb (B, F, D) that the model type reads, and where the
 * gradient d_emb (B, F, D) becomes the update of those rows.
 *
 * One interface, one implementation per place the rows live:
 *   local    the table where the network's backend reads it: a store in host
 *            memory on the CPU (ram, tiered, hash), or the table mirrored in
 *            a device's memory (stage_local.c);
 *   host     on a device, the table in host memory, pooled and updated by the
 *            CPU with the pooled rows and their gradient crossing the bus;
 *            with hot rows, the most frequent rows mirrored on the device too
 *            and pooled and updated there (stage_host.c);
 *   sharded  the table split over the ranks of a job: rows fetched from their
 *            owners, gradients sent back (src/dist/sharded.c);
 *   remote   read-only rows from another process (a server's Redis tier),
 *            fetched per batch in front of the table (stage_remote.c).
 * A network picks its own stage (local or host) once, from its backend and
 * the table's placement (dlrec_net_set_backend); the trainer hands a pass
 * the sharded stage, and the server the remote one. The passes
 * (net_pass.c) and the training step (src/train/step.c) are written once
 * over this interface, so a feature of the step (loss scaling, clipping,
 * hot rows) works with every stage.
 */
#ifndef DLREC_MODEL_STAGE_H
#define DLREC_MODEL_STAGE_H

#include "model/model.h"

typedef struct dlrec_stage dlrec_stage;

/* What a step's update tells the stage. */
typedef struct dlrec_stage_update {
  float lr;                /* the sparse optimizer's learning rate for this step */
  uint64_t global_lookups; /* the step's lookups over every part of the batch (the ranks'); a 16-bit table counts
                              an update for each step with any */
} dlrec_stage_update;

typedef struct dlrec_stage_ops {
  const char *name;
  /* 1: forward may pool a part of the batch on a one-thread lane of the
   * backend (a way of a split step: the stage's rows are host memory). */
  int splits;
  /* The batch's rows: *out = *b with its ids rewritten as rows of the table
   * forward pools from (a store's resident rows; the rows fetched from
   * their owners or from a remote tier), valid until the next call on the
   * stage. write: a training pass, whose update follows. */
  dlrec_status (*rows)(dlrec_stage *s, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out, int write);
  /* Pools b (rows from `rows`, or a part of them) into emb (b->rows, F, D),
   * memory of backend be: the network's, a lane of it, or a scorer's.
   * train: a training pass, whose update may reuse what forward prepared. */
  dlrec_status (*forward)(dlrec_stage *s, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b, float *emb,
                          int train);
  /* The fused sparse backward and update of b's rows from d_emb (b->rows,
   * F, D) in the network's backend's memory. NULL: a read-only stage. */
  dlrec_status (*update)(dlrec_stage *s, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *b,
                         const float *d_emb, const dlrec_stage_update *u);
} dlrec_stage_ops;

struct dlrec_stage {
  const dlrec_stage_ops *ops;
  dlrec_net *net;
  void *ctx; /* the implementation's own */
};

/* The network's own stage (local or host), valid until its backend, table
 * placement or hot rows change. */
dlrec_stage *dlrec_net_stage(const dlrec_net *n);

/* Pools b's ids, rows of `table`, into emb (b->rows, F, D) on be, with the
 * network's pooling: the bag forward every stage whose rows are host memory
 * ends in. */
dlrec_status dlrec_net_pool(const dlrec_net *n, dlrec_backend *be, const dlrec_table *table, const dlrec_batch *b,
                            float *emb);

/* Scores a batch with its rows from stage s (dlrec_net_predict's contract). */
dlrec_status dlrec_net_predict_stage(const dlrec_net_scorer *sc, dlrec_net_ws *ws, dlrec_stage *s,
                                     const dlrec_batch *batch, float *prob);

#endif
