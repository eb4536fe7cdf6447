/* The training loop: loader -> step -> logging, validation and checkpoints
 * at intervals; resume; a graceful stop. The run's setup and the rest live
 * in the trainer_*.c files beside this one (train/trainer_run.h). */
#include "train/trainer.h"

#include <math.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "train/trainer_run.h"

/* A training step queued and not yet counted (dlrec_step_queue). */
typedef struct queued_step {
  int on;
  uint64_t step;
  uint32_t rows;
  dlrec_position end; /* the position after its batch */
} queued_step;

/* Takes queued step q's loss, and counts the step: its rows, position and
 * loss, and the progress. A failed or diverged step leaves *state_ok 0. */
static dlrec_status step_taken(run *r, queued_step *q, dlrec_train_result *res, dlrec_progress *bar,
                               uint64_t *rows_log, int *state_ok, double *loss_out) {
  double loss = NAN;
  dlrec_status s = dlrec_step_loss(&r->step, &loss);
  q->on = 0;
  if (s != DLREC_OK || !isfinite(loss)) *state_ok = 0;
  if (s != DLREC_OK) return s;
  if (!isfinite(loss))
    return dlrec_error(DLREC_ERR_INVALID,
                       "training diverged at step %llu (loss is %g): lower the learning rates or add warmup",
                       (unsigned long long)q->step, loss);
  r->prog.step++;
  r->prog.samples += q->rows;
  r->prog.position = q->end;
  r->prog.loss_sum += loss * q->rows;
  r->prog.loss_rows += q->rows;
  *rows_log += q->rows;
  dlrec_progress_add(bar, q->rows);
  run_report_progress(r, res, 0, 0);
  if (loss_out) *loss_out = loss;
  return DLREC_OK;
}

/* The loop's own state, beside the run's. */
typedef struct loop {
  dlrec_progress *bar;
  uint64_t epoch_rows;
  double t0, t_log, eval_seconds;
  uint64_t rows_log, start_samples, start_step;
  int state_ok;   /* the parameters are those after r->prog.step whole steps */
  int split_said; /* how a step splits was logged */
  /* Across ranks, an error of rank 0's own (writing metrics.jsonl) waits for
   * the next step's agreement, so that every rank stops together. */
  dlrec_status pending;
  queued_step queued;
} loop;

/* The progress bar and the counters the loop's rates start from. Following,
 * the rows to come are unknown: the bar has no total unless max_steps gives
 * one. */
static void loop_begin(run *r, loop *L) {
  const dlrec_train_config *c = &r->cfg;
  const int follow = r->a->follow_dir != NULL;
  L->epoch_rows = follow ? 0 : dlrec_loader_epoch_rows(r->loader);
  uint64_t total = follow ? UINT64_MAX : L->epoch_rows * c->epochs;
  if (c->max_steps && c->max_steps * c->batch_size < total) total = c->max_steps * c->batch_size;
  if (total == UINT64_MAX) total = 0;
  L->bar = r->rank == 0 ? dlrec_progress_start("train", total, "samples") : NULL;
  dlrec_progress_add(L->bar, r->prog.samples < total ? r->prog.samples : total);
  L->t0 = L->t_log = dlrec_now();
  L->start_samples = r->prog.samples;
  L->start_step = r->prog.step;
  L->state_ok = 1;
  L->split_said = r->rank != 0;
  r->loop_start = L->t0, r->start_samples = L->start_samples, r->total_samples = total;
}

/* The next batch (this rank's part of it), and across ranks the step's
 * agreement: *rows and *row_base its global rows and this part's start.
 * DLREC_END: the loop ends (the data's end, or an agreed stop). */
static dlrec_status next_batch(run *r, loop *L, dlrec_train_result *res, const dlrec_batch **b, uint32_t *rows,
                               uint32_t *row_base) {
  double tw = dlrec_now();
  dlrec_status s = r->a->follow_dir ? run_follow_next(r, b) : dlrec_loader_next(r->loader, b);
  res->loader_wait += dlrec_now() - tw;
  *rows = s == DLREC_OK ? (*b)->rows : 0, *row_base = 0;
  if (r->sh) {
    int stop = 0;
    const uint32_t part = *rows;
    s = run_dist_step_agree(r, L->pending != DLREC_OK ? L->pending : s, part, rows, row_base, &stop, NULL);
    if (stop) r->stop = 1;
    if (stop && s == DLREC_OK) return DLREC_END;
  }
  return s;
}

/* Once, so a user sees how the threads share a step (dlrec_net_ws_split). */
static void say_split(run *r, loop *L) {
  if (L->split_said) return;
  const uint32_t ways = dlrec_net_ws_split(r->ws), t = dlrec_backend_threads(r->be);
  if (ways > 1) DLREC_INFO("training steps split %u ways, one per thread", ways);
  else DLREC_INFO("training steps run whole on %u thread%s (a split needs 32 rows a thread)", t, t == 1 ? "" : "s");
  L->split_said = 1;
}

/* metrics.jsonl's line of a logging step, with the interval's mean loss and rate. */
static dlrec_status log_step(run *r, loop *L, dlrec_train_result *res, double scale) {
  dlrec_status s = DLREC_OK;
  double now = dlrec_now();
  res->last_loss = r->prog.loss_sum / (double)r->prog.loss_rows;
  dlrec_progress_note(L->bar, "loss %.4f", res->last_loss);
  if (r->rank == 0) s = run_log_json(r, run_step_json(r, res->last_loss, scale, L->rows_log / (now - L->t_log)));
  r->prog.loss_sum = 0;
  r->prog.loss_rows = L->rows_log = 0;
  L->t_log = now;
  if (s != DLREC_OK && r->sh) L->pending = s, s = DLREC_OK;
  return s;
}

/* What follows the queued step `cur` (its batch b): the step before it
 * taken, and, when this step logs, validates, checkpoints or publishes, the
 * step itself taken at once and its work done. *stop: the loop ends here. */
static dlrec_status after_step(run *r, loop *L, dlrec_train_result *res, queued_step cur, const dlrec_batch *b,
                               double scale, int epoch_end, int validates, int *stop) {
  const dlrec_train_config *c = &r->cfg;
  const uint64_t step = cur.step;
  double loss = NAN;
  queued_step prev = L->queued;
  L->queued = cur;
  dlrec_status s = DLREC_OK;
  if (prev.on && (s = step_taken(r, &prev, res, L->bar, &L->rows_log, &L->state_ok, NULL)) != DLREC_OK) return s;
  if (r->pub && (s = publisher_note(r->pub, b, dlrec_net_schema(r->model)->n_sparse)) != DLREC_OK) return s;
  /* What reads the model, or logs, waits for the step: the rest does not. */
  const int logs = step % c->log_interval_steps == 0;
  const int publishes = r->pub && step % c->publish_interval_steps == 0;
  const int checkpoints = c->checkpoint_interval_steps && step % c->checkpoint_interval_steps == 0;
  if (dlrec_step_queues(&r->step) && !logs && !publishes && !checkpoints && !validates) return DLREC_OK;
  if ((s = step_taken(r, &L->queued, res, L->bar, &L->rows_log, &L->state_ok, &loss)) != DLREC_OK) return s;
  if (publishes) publisher_publish(r->pub, r->model, r->prog.step);
  if (logs && (s = log_step(r, L, res, scale)) != DLREC_OK) return s;
  if (validates) {
    double te = dlrec_now();
    s = run_validate(r, res, scale, loss, epoch_end, L->bar, stop);
    run_report_progress(r, res, 1, 0);
    const double dt = dlrec_now() - te;
    L->eval_seconds += dt;
    L->t_log += dt; /* an interval's samples_per_s leaves its evaluations out */
    if (s != DLREC_OK || *stop) return s;
  }
  if (checkpoints && r->last_ckpt_step != r->prog.step) s = run_dist_checkpoint(r);
  return s;
}

/* The steps, until the data's end, max_steps, a stop (across ranks, agreed
 * on at each step), or an error. */
static dlrec_status train_steps(run *r, loop *L, dlrec_train_result *res) {
  const dlrec_train_config *c = &r->cfg;
  const dlrec_train_args *a = r->a;
  dlrec_status s = DLREC_OK;
  while ((r->sh || !run_stop_requested(r)) && (!c->max_steps || r->prog.step + L->queued.on < c->max_steps)) {
    const dlrec_batch *b = NULL;
    uint32_t rows, row_base;
    if ((s = next_batch(r, L, res, &b, &rows, &row_base)) == DLREC_END) return DLREC_OK;
    if (s != DLREC_OK) return s;
    /* The schedule's scale times the plateau's factor (1 without one). */
    const uint64_t step = r->prog.step + L->queued.on + 1;
    const double scale = dlrec_lr_scale(c, step) * r->prog.valid.plateau_scale;
    /* The last batch of an epoch (following: of a file) ends at its last row. */
    const int epoch_end = b->end.row >= (a->follow_dir ? r->follow_rows : L->epoch_rows);
    const int validates = a->valid && ((c->eval_interval_steps && step % c->eval_interval_steps == 0) ||
                                       (c->eval_every_epoch && epoch_end));
    const queued_step cur = {1, step, rows, b->end};
    /* Queued: on a device it runs while the host readies the next batch,
     * and the step before it is taken once this one is on its way (so a
     * stop asked for after step k lands after step k + 1 there). */
    s = dlrec_step_queue(&r->step, b, rows, row_base, (float)scale, step);
    if (s != DLREC_OK && r->sh) {
      /* The other ranks may be waiting in this step's exchanges: the job
       * ends here; its last checkpoint stands. */
      DLREC_ERROR("rank %d: step %llu: %s", r->rank, (unsigned long long)step, dlrec_last_error());
      dlrec_comm_abort(a->comm, 1);
    }
    if (s != DLREC_OK) {
      L->state_ok = 0;
      return s;
    }
    say_split(r, L);
    int stop = 0;
    if ((s = after_step(r, L, res, cur, b, scale, epoch_end, validates, &stop)) != DLREC_OK || stop) return s;
  }
  return s;
}

/* After the loop: a step still queued (the data's end, max_steps, a signal,
 * an error of the data's) is trained: it counts, and is checkpointed
 * later; after a failed or diverged step it is only waited for. Then the
 * loop's seconds, its last loss, whether it was interrupted, and across
 * ranks rank 0's logging error to every rank. */
static dlrec_status loop_end(run *r, loop *L, dlrec_train_result *res, dlrec_status s, double *loop_seconds) {
  if (L->queued.on && L->state_ok) {
    dlrec_status ts = step_taken(r, &L->queued, res, L->bar, &L->rows_log, &L->state_ok, NULL);
    if (s == DLREC_OK) s = ts;
  } else if (L->queued.on) {
    double ignored;
    (void)dlrec_step_loss(&r->step, &ignored);
  }
  /* Waiting for a followed directory's next file is neither training nor
   * loading. */
  *loop_seconds = dlrec_now() - L->t0 - L->eval_seconds - r->follow_idle;
  res->loader_wait -= r->follow_idle;
  res->idle_seconds = r->follow_idle;
  res->files_rejected = r->files_rejected;
  dlrec_progress_finish(L->bar);
  if (s == DLREC_OK && r->prog.loss_rows) res->last_loss = r->prog.loss_sum / (double)r->prog.loss_rows;
  res->interrupted = r->stop && s == DLREC_OK;
  if (r->sh && s == DLREC_OK) s = run_dist_agree(r, L->pending);
  return s;
}

/* The final validation (unless the last step's stands) and, with
 * training.restore_best, RUN/best's evaluation. Across ranks every rank
 * takes part (the evaluations are collective) and rank 0 reports. */
static dlrec_status final_validation(run *r, dlrec_train_result *res) {
  const dlrec_train_config *c = &r->cfg;
  dlrec_status s = DLREC_OK;
  if (!r->a->valid || res->interrupted) return DLREC_OK;
  if (r->has_last_valid && r->last_valid_step == r->prog.step) {
    /* The last step was validated (and logged) already. */
    res->has_valid = 1;
    res->valid = r->last_valid;
  } else {
    dlrec_metrics train;
    int has_train = 0;
    s = run_evaluate_now(r, &res->valid);
    if (s == DLREC_OK) s = run_evaluate_train(r, &train, &has_train);
    if (s != DLREC_OK) return s;
    res->has_valid = 1;
    if (r->rank == 0) {
      cJSON *j = run_step_json(r, res->last_loss, dlrec_lr_scale(c, r->prog.step) * r->prog.valid.plateau_scale, 0);
      cJSON_DeleteItemFromObject(j, "samples_per_s");
      cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&res->valid));
      if (has_train) cJSON_AddItemToObject(j, "train", dlrec_metrics_to_json(&train));
      cJSON_AddBoolToObject(j, "final", 1);
      s = run_log_json(r, j);
    }
    if ((s = run_dist_status(r, s, NULL, 0)) != DLREC_OK) return s;
  }
  if (c->restore_best && r->prog.valid.validations && !isnan(r->prog.valid.best)) {
    /* RUN/best, loaded and scored in this process (its table mapped). */
    if (r->rank == 0) s = run_evaluate_best(r, res);
    s = run_dist_status(r, s, NULL, 0);
  }
  return s;
}

/* The final checkpoint: also after a signal or an error in the data or the
 * evaluation, so that the steps trained are not lost; never after a failed
 * or diverged step, whose parameters must not replace a good checkpoint. */
static dlrec_status final_checkpoint(run *r, const loop *L, dlrec_status s) {
  if (!L->state_ok) return s;
  dlrec_error_copy e;
  dlrec_error_save(&e);
  /* A checkpoint of this very state exists when the last step was both
   * validated and checkpointed (a best one, say): writing it again would
   * only replace RUN/best's directory under it. */
  const int saved = r->last_ckpt_step == r->prog.step && r->has_last_valid && r->last_valid_step == r->prog.step;
  dlrec_status cs =
      (r->prog.step > L->start_step || !r->a->resume) && !saved ? run_dist_checkpoint(r) : DLREC_OK;
  if (s == DLREC_OK) return cs;
  dlrec_error_restore(&e);
  return s;
}

/* The run's totals into res. */
static void result_of(run *r, const loop *L, dlrec_train_result *res, double loop_seconds) {
  res->steps = r->prog.step;
  res->samples = r->prog.samples;
  res->steps_this_run = r->prog.step - L->start_step;
  res->seconds = loop_seconds;
  res->samples_per_s = loop_seconds > 0 ? (double)(r->prog.samples - L->start_samples) / loop_seconds : 0;
  res->loss_scale = r->opt.loss_scale;
  res->skipped_steps = r->opt.skipped_steps;
  if (r->ws) dlrec_net_ws_profile(r->ws, &res->profile);
  res->ranks = r->ranks;
  if (r->sh) {
    dlrec_sharded_get_stats(r->sh, &res->dist);
    res->dist.bytes_sent = r->step.stats.bytes_sent;
    res->dist.exchange_seconds = r->step.stats.exchange_seconds;
    res->dist.compute_seconds = r->step.stats.compute_seconds;
    res->dist.update_seconds = r->step.stats.update_seconds;
  }
}

dlrec_status dlrec_train(const dlrec_train_args *a, dlrec_train_result *res) {
  memset(res, 0, sizeof *res);
  res->last_loss = NAN;
  run r = {.a = a, .lock_fd = -1, .last_ckpt_step = UINT64_MAX};
  r.rank = a->comm ? dlrec_comm_rank(a->comm) : 0;
  r.ranks = a->comm ? dlrec_comm_size(a->comm) : 1;
  dlrec_status s = run_setup(&r);
  if (r.ranks > 1 && (s = run_dist_agree(&r, s)) == DLREC_OK) s = run_dist_start(&r);
  if (s != DLREC_OK) {
    run_free(&r);
    return s;
  }
  loop L = {0};
  double loop_seconds = 0;
  loop_begin(&r, &L);
  s = loop_end(&r, &L, res, train_steps(&r, &L, res), &loop_seconds);
  if (s == DLREC_OK) s = final_validation(&r, res);
  /* The last trained rows reach the Redis tier too. */
  if (r.pub && L.state_ok) publisher_publish(r.pub, r.model, r.prog.step);
  s = final_checkpoint(&r, &L, s);
  result_of(&r, &L, res, loop_seconds);
  if (s == DLREC_OK) run_report_progress(&r, res, 1, 1);
  const int rank = r.rank;
  run_free(&r); /* closes metrics.jsonl, which the report reads */
  if (s == DLREC_OK && rank == 0) run_write_summary(a, res);
  return s;
}
