/* The training step (train/step.h), for one process and across ranks. */
#include "train/step.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/dispatch.h"
#include "core/clock.h"
#include "core/log.h"
#include "dist/dist.h"

void dlrec_step_free(dlrec_step *s) {
  free(s->zeros);
  s->zeros = NULL;
  s->zeros_cap = 0;
}

static int ranks_of(const dlrec_step *s) { return s->comm && dlrec_comm_size(s->comm) > 1; }

/* Across ranks, adds the seconds since *t to *acc and restarts *t. */
static void lap(const dlrec_step *s, double *acc, double *t) {
  if (!ranks_of(s)) return;
  const double now = dlrec_now();
  *acc += now - *t;
  *t = now;
}

/* Batch normalization's statistics, summed over the ranks in rank order
 * (a pass of one way each: as one process sums its ways). The sizes are
 * logged for the parts of no rows. A failed sum ends the job: the other
 * ranks would wait in it. */
static dlrec_status sum_ranks(void *ctx, double *v, size_t n) {
  dlrec_step *s = ctx;
  if (s->n_sums < sizeof s->sums / sizeof *s->sums) s->sums[s->n_sums++] = n;
  else s->sums_overflow = 1;
  dlrec_status st = dlrec_comm_allreduce_f64(s->comm, v, n);
  if (st != DLREC_OK) {
    DLREC_ERROR("rank %d: batch normalization's sums: %s", dlrec_comm_rank(s->comm), dlrec_last_error());
    dlrec_comm_abort(s->comm, 1);
  }
  return st;
}

/* A part of no rows in a step whose batch normalization sums over the
 * ranks: the sums the others make, with zeros (its rows add nothing). */
static dlrec_status sum_zeros(dlrec_step *s) {
  if (!s->sums_known || s->sums_overflow)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "rank %d has no row of a batch and no step before it to follow: with "
                       "batch normalization across ranks, every rank needs a row of the first batch",
                       dlrec_comm_rank(s->comm));
  for (size_t i = 0; i < s->n_sums; i++) {
    if (s->sums[i] > s->zeros_cap) {
      free(s->zeros);
      s->zeros_cap = s->sums[i];
      if (!(s->zeros = calloc(s->zeros_cap, sizeof *s->zeros))) {
        s->zeros_cap = 0;
        return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
      }
    }
    memset(s->zeros, 0, s->sums[i] * sizeof *s->zeros);
    dlrec_status st = dlrec_comm_allreduce_f64(s->comm, s->zeros, s->sums[i]);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

/* The ids a batch looks up. */
static uint64_t lookups_of(const dlrec_net *n, const dlrec_batch *b) {
  uint64_t k = 0;
  for (uint32_t c = 0; c < dlrec_net_schema(n)->n_sparse; c++) k += b->offsets[c][b->rows] - b->offsets[c][0];
  return k;
}

/* The allreduce hook: the dense gradients summed over the ranks; every
 * rank's loss sum, squared d_emb norm (for clipping) and lookups gathered
 * into all (3 a rank, in rank order); the global batch's mean loss and
 * lookups. */
static dlrec_status reduce_ranks(dlrec_step *s, const dlrec_net_grads *g, double loss_sum, uint64_t lookups,
                                 uint32_t G, double *all, double *loss, uint64_t *global_lookups, double *t) {
  double mine[3] = {loss_sum, 0, (double)lookups};
  if (s->opt->clip_grad_norm > 0)
    for (size_t i = 0; i < g->n_emb; i++) mine[1] += (double)g->emb[i] * g->emb[i];
  lap(s, &s->stats.compute_seconds, t);
  dlrec_status st = dlrec_comm_allreduce_f32(s->comm, g->dense, g->n_dense);
  if (st == DLREC_OK) st = dlrec_comm_allgather(s->comm, mine, sizeof mine, all);
  lap(s, &s->stats.exchange_seconds, t);
  if (st != DLREC_OK) return st;
  double sum = 0, k = 0;
  for (int r = 0; r < dlrec_comm_size(s->comm); r++) {
    sum += all[3 * r];
    k += all[3 * r + 2];
  }
  *loss = sum / G;
  *global_lookups = (uint64_t)k;
  return DLREC_OK;
}

dlrec_status dlrec_loss_scale_update(dlrec_net_optim *opt, int finite, uint64_t step) {
  if (finite) {
    if (opt->scale_growth_interval && ++opt->scale_good_steps >= opt->scale_growth_interval) {
      opt->scale_good_steps = 0;
      if (opt->loss_scale < DLREC_LOSS_SCALE_MAX) opt->loss_scale *= 2.0f;
    }
    return DLREC_OK;
  }
  opt->skipped_steps++;
  opt->scale_good_steps = 0;
  if (!opt->scale_growth_interval) return DLREC_OK;
  if (opt->loss_scale <= 1.0f)
    return dlrec_error(DLREC_ERR_INVALID, "training diverged at step %llu: the gradients are not finite at a loss "
                       "scale of %g; lower the learning rates or add warmup", (unsigned long long)step,
                       (double)opt->loss_scale);
  opt->loss_scale *= 0.5f;
  return DLREC_OK;
}

/* A loss-scaled step's gradients: *finite whether the dense gradients and
 * d_emb all are (on every rank), and if so both divided by the scale. */
static dlrec_status unscale(dlrec_step *s, const dlrec_net_grads *g, float scale, int *finite) {
  dlrec_backend *be = dlrec_net_backend(s->net);
  dlrec_status st = BE_OP(be, all_finite, finite, g->dense, g->n_dense);
  if (st == DLREC_OK && *finite) st = BE_OP(be, all_finite, finite, g->emb, g->n_emb);
  if (st == DLREC_OK && ranks_of(s)) {
    double bad = !*finite;
    st = dlrec_comm_allreduce_f64(s->comm, &bad, 1);
    *finite = bad == 0;
  }
  if (st != DLREC_OK || !*finite || scale == 1.0f) return st;
  st = BE_OP(be, scale, g->dense, g->n_dense, 1.0f / scale);
  return st == DLREC_OK ? BE_OP(be, scale, g->emb, g->n_emb, 1.0f / scale) : st;
}

/* Gradient-norm clipping with PyTorch clip_grad_norm_'s semantics: the
 * squared norm of the dense gradients and d_emb together, summed in double
 * in a fixed order (on a device, over copies brought back; across ranks,
 * with the ranks' d_emb sums in rank order), then both scaled by
 * max_norm / (norm + 1e-6) where the norm is over. A norm that is not
 * finite is the step's divergence. */
static dlrec_status clip(dlrec_step *s, const dlrec_net_grads *g, const double *all, uint64_t step) {
  dlrec_backend *be = dlrec_net_backend(s->net);
  const float max_norm = s->opt->clip_grad_norm;
  const float *grad = g->dense, *d_emb = g->emb;
  float *host = NULL;
  dlrec_status st = DLREC_OK;
  if (g->device) {
    if (!(host = malloc((g->n_dense + g->n_emb + 1) * sizeof(float))))
      return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    st = be->ops->download(be, host, g->dense, g->n_dense * sizeof(float));
    if (st == DLREC_OK) st = be->ops->download(be, host + g->n_dense, g->emb, g->n_emb * sizeof(float));
    grad = host, d_emb = host + g->n_dense;
  }
  double sq = 0;
  for (size_t i = 0; st == DLREC_OK && i < g->n_dense; i++) sq += (double)grad[i] * grad[i];
  if (all)
    for (int r = 0; r < dlrec_comm_size(s->comm); r++) sq += all[3 * r + 1];
  else
    for (size_t i = 0; st == DLREC_OK && i < g->n_emb; i++) sq += (double)d_emb[i] * d_emb[i];
  free(host);
  if (st != DLREC_OK) return st;
  const double norm = sqrt(sq);
  if (!isfinite(norm))
    return dlrec_error(DLREC_ERR_INVALID, "training diverged at step %llu (the gradient norm is %g): lower the "
                       "learning rates or add warmup", (unsigned long long)step, norm);
  const double coef = (double)max_norm / (norm + 1e-6);
  const float c = coef < 1.0 ? (float)coef : 1.0f;
  if (c == 1.0f) return DLREC_OK;
  st = BE_OP(be, scale, g->dense, g->n_dense, c);
  return st == DLREC_OK ? BE_OP(be, scale, g->emb, g->n_emb, c) : st;
}

/* The step's updates after its pass: the loss scale's check, clipping, the
 * stage's sparse update and the dense optimizer's step. */
static dlrec_status update(dlrec_step *s, dlrec_stage *stage, const dlrec_batch *rb, const dlrec_net_grads *g,
                           const dlrec_stage_update *u, const double *all, float lr_scale, uint64_t step) {
  dlrec_net_optim *opt = s->opt;
  dlrec_status st = DLREC_OK;
  if (opt->loss_scale > 0) {
    int finite = 0;
    st = unscale(s, g, opt->loss_scale, &finite);
    if (st == DLREC_OK) st = dlrec_loss_scale_update(opt, finite, step);
    if (st != DLREC_OK || !finite) return st; /* skipped: nothing updated */
  }
  if (opt->clip_grad_norm > 0) st = clip(s, g, all, step);
  if (st == DLREC_OK) st = stage->ops->update(stage, s->ws, opt, rb, g->emb, u);
  return st == DLREC_OK ? dlrec_net_dense_step(s->net, s->ws, opt, lr_scale, step) : st;
}

/* The step (train/step.h's 1 to 6): its loss into *loss (on a device, a
 * placeholder that the loss's copy back overwrites). */
static dlrec_status run(dlrec_step *s, const dlrec_batch *b, uint32_t G, uint32_t row_base, float lr_scale,
                        uint64_t step, double *loss, float *prob) {
  dlrec_net *n = s->net;
  dlrec_stage *stage = s->stage ? s->stage : dlrec_net_stage(n);
  const int ranks = ranks_of(s);
  if (!stage->ops->update) return dlrec_error(DLREC_ERR_INVALID, "the %s embedding stage does not train", stage->ops->name);
  double t = dlrec_now();
  dlrec_batch rb;
  dlrec_status st = stage->ops->rows(stage, s->ws, b, &rb, 1);
  if (st == DLREC_OK) st = dlrec_net_optim_ready(n, s->opt);
  if (st != DLREC_OK) return st;
  lap(s, &s->stats.exchange_seconds, &t);
  /* Batch normalization sums over every rank's rows, except in a batch of
   * one row, which normalizes by the running statistics. */
  const int bn = ranks && dlrec_net_has_batchnorm(n) && G >= 2;
  if (bn && rb.rows) s->n_sums = 0, s->sums_overflow = 0;
  const dlrec_pass_opts o = {.step = step,
                             .global_rows = ranks ? G : 0,
                             .row_base = ranks ? row_base : 0,
                             .grad_scale = s->opt->loss_scale,
                             .sum = bn && rb.rows ? sum_ranks : NULL,
                             .sum_ctx = s,
                             .loss_later = dlrec_net_ws_queues(s->ws),
                             .prob = prob};
  double mean = 0, sum = 0;
  st = dlrec_net_train_pass(n, s->ws, stage, &rb, &o, &mean, &sum);
  if (st == DLREC_OK && bn && rb.rows) s->sums_known = 1;
  if (st == DLREC_OK && bn && !rb.rows) st = sum_zeros(s);
  if (st != DLREC_OK) return st;
  dlrec_net_grads g;
  dlrec_net_ws_gradients(n, s->ws, rb.rows, &g);
  dlrec_stage_update u = {.lr = s->opt->sparse_lr * lr_scale, .global_lookups = lookups_of(n, &rb)};
  double all[3 * DLREC_DIST_MAX_RANKS];
  *loss = mean;
  if (ranks && (st = reduce_ranks(s, &g, sum, u.global_lookups, G, all, loss, &u.global_lookups, &t)) != DLREC_OK)
    return st;
  st = update(s, stage, &rb, &g, &u, ranks ? all : NULL, lr_scale, step);
  lap(s, &s->stats.update_seconds, &t);
  return st;
}

dlrec_status dlrec_step_queue(dlrec_step *s, const dlrec_batch *b, uint32_t global_rows, uint32_t row_base,
                              float lr_scale, uint64_t step) {
  double *slot = NULL;
  const uint64_t sent0 = ranks_of(s) ? dlrec_comm_bytes_sent(s->comm) : 0;
  dlrec_status st = dlrec_net_ws_loss_slot(s->ws, 1, &slot);
  if (st == DLREC_OK) st = run(s, b, global_rows, row_base, lr_scale, step, slot, NULL);
  if (st == DLREC_OK) st = dlrec_net_ws_loss_sent(s->net, s->ws, slot, 1);
  if (ranks_of(s)) {
    s->stats.steps++;
    s->stats.bytes_sent += dlrec_comm_bytes_sent(s->comm) - sent0;
  }
  return st;
}

dlrec_status dlrec_step_loss(dlrec_step *s, double *loss) { return dlrec_net_ws_loss(s->ws, loss); }

int dlrec_step_queues(const dlrec_step *s) { return dlrec_net_ws_queues(s->ws); }

dlrec_status dlrec_train_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *batch,
                              float lr_scale, uint64_t step, double *loss, float *prob) {
  dlrec_step s = {.net = n, .ws = ws, .opt = opt};
  double *slot = NULL;
  dlrec_status st = dlrec_net_ws_loss_slot(ws, 0, &slot);
  if (st == DLREC_OK) st = run(&s, batch, batch->rows, 0, lr_scale, step, slot, prob);
  if (st == DLREC_OK) st = dlrec_net_ws_loss_sent(n, ws, slot, 0);
  if (st == DLREC_OK) *loss = *slot;
  dlrec_step_free(&s);
  return st;
}
