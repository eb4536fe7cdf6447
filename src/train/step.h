/* The training step, written once for one process and for a job of ranks
 * (docs/distributed.md), over any embedding stage (model/stage.h):
 *   1. the stage's rows for the batch (a store's resolve; across ranks, the
 *      rows fetched from their owners);
 *   2. the pass: forward, loss and backward, split across the backend's
 *      threads where it can (model/net_pass.c), batch normalization's
 *      statistics summed over the ranks;
 *   3. across ranks, the allreduce hook: the dense gradients summed over the
 *      ranks in rank order, each rank's loss, lookups and squared d_emb norm
 *      gathered;
 *   4. loss scaling: the gradients' finiteness (agreed across ranks), the
 *      unscale, the scale's update, or the step skipped;
 *   5. gradient-norm clipping, over the dense gradients and d_emb together;
 *   6. the stage's fused sparse update and the dense optimizer's step.
 * A feature of the step (loss scaling, clipping) therefore exists once and
 * works with every stage and any number of ranks. N ranks of one thread
 * train the model of one process of N threads bit for bit.
 */
#ifndef DLREC_TRAIN_STEP_H
#define DLREC_TRAIN_STEP_H

#include "dist/comm.h"
#include "model/stage.h"

/* Where a job's steps spent their time, on this rank. */
typedef struct dlrec_step_stats {
  uint64_t steps;
  uint64_t bytes_sent; /* to other ranks */
  double exchange_seconds, compute_seconds, update_seconds;
} dlrec_step_stats;

/* What a run's steps run on; zero-initialize, set the first five, and free
 * with dlrec_step_free. */
typedef struct dlrec_step {
  dlrec_net *net;
  dlrec_net_ws *ws;
  dlrec_net_optim *opt;
  dlrec_stage *stage; /* the embedding stage; NULL: the network's own */
  dlrec_comm *comm;   /* the job's ranks; NULL (or one rank): one process */
  dlrec_step_stats stats;
  /* Batch normalization across ranks: the sizes of the sums a pass made
   * (the last with rows), which a part of no rows makes with zeros. */
  size_t sums[64], n_sums;
  int sums_known, sums_overflow;
  double *zeros;
  size_t zeros_cap;
} dlrec_step;

void dlrec_step_free(dlrec_step *s);

/* One step on a labeled batch: this rank's part b, rows [row_base,
 * row_base + b->rows) of a global batch of global_rows rows (one process:
 * the batch itself, row_base 0), each optimizer at its base learning rate
 * times lr_scale; step is the 1-based update number (Adam). On a device the
 * step is queued and this returns while it runs (the batch's memory may be
 * reused at once); up to two steps may be queued, and their losses are
 * taken in order with dlrec_step_loss: the batch's mean loss (across ranks,
 * the global batch's). Anything else that reads the network or the
 * optimizer waits until every queued loss is taken. Across ranks an error
 * may leave the other ranks waiting: the caller aborts the job. */
dlrec_status dlrec_step_queue(dlrec_step *s, const dlrec_batch *b, uint32_t global_rows, uint32_t row_base,
                              float lr_scale, uint64_t step);
dlrec_status dlrec_step_loss(dlrec_step *s, double *loss);
/* Whether dlrec_step_queue returns before its step has run (a device). */
int dlrec_step_queues(const dlrec_step *s);

/* One step in one process, at once: the batch's mean loss into *loss and,
 * if prob is not NULL, its predictions before the update. With
 * opt->clip_grad_norm > 0, the dense gradients and d_emb (B, F, D) are
 * first scaled as PyTorch's clip_grad_norm_ does, by min(1, max_norm /
 * (norm + 1e-6)) with norm the L2 norm of all of them together; d_emb holds
 * per-lookup gradients (the fused update never forms per-row ones), so a
 * row looked up k times in a batch counts as k gradients, not as their sum
 * (docs/config.md). */
dlrec_status dlrec_train_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *batch,
                              float lr_scale, uint64_t step, double *loss, float *prob);

/* A step's outcome into opt's loss scaling (model.h's rule): finite says
 * whether its gradients were. DLREC_ERR_INVALID ("training diverged at
 * step N") when they were not at a dynamic scale of 1 or less: no scale
 * would help. */
dlrec_status dlrec_loss_scale_update(dlrec_net_optim *opt, int finite, uint64_t step);

#endif
