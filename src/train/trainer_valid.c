/* A run's validations: the metrics of the validation file (and the first
 * training rows), the validation rules' decisions (best, early stopping,
 * plateau), the best checkpoint, and the final evaluation of RUN/best. */
#include <math.h>

#include "core/log.h"
#include "train/trainer_run.h"
#include "train/loaded_model.h"

/* The metrics of the model on the first max_rows rows (0: all) of the file
 * at path. Across ranks, collective: every rank scores its part and gets
 * the metrics. */
dlrec_status run_evaluate_file(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out) {
  const char *paths[] = {path};
  dlrec_status s = r->sh ? run_dist_evaluate(r, path, max_rows, out)
                         : dlrec_evaluate(r->model, paths, 1, r->cfg.eval_batch_size, max_rows, out);
  return s == DLREC_OK ? DLREC_OK : dlrec_error_context("evaluating on %s: ", path);
}

/* The validation metrics. */
dlrec_status run_evaluate_now(run *r, dlrec_metrics *out) {
  dlrec_status s = run_evaluate_file(r, r->a->valid, r->cfg.eval_max_rows, out);
  if (s == DLREC_OK) r->prog.valid_auc = out->auc;
  return s;
}

/* eval.train_rows: the metrics of the first rows of the (first) training
 * file, which the report plots beside the validation's; *has is 0 when off
 * or when the run follows a directory (no fixed training file). */
dlrec_status run_evaluate_train(run *r, dlrec_metrics *out, int *has) {
  *has = r->cfg.eval_train_rows && r->a->n_train;
  return *has ? run_evaluate_file(r, r->a->train[0], r->cfg.eval_train_rows, out) : DLREC_OK;
}

/* The metric that early stopping, the plateau and RUN/best watch. */
static double watched(const dlrec_train_config *c, const dlrec_metrics *m) {
  return c->eval_metric == DLREC_VALID_LOGLOSS ? m->logloss : m->auc;
}

/* A scheduled validation (eval.interval_steps or the end of an epoch) after
 * the step trained with lr scale `scale`: evaluates, feeds the metric to the
 * validation state (best, early stopping, plateau), logs the line, and saves
 * the best checkpoint. *stop is set when the run must end here. Across
 * ranks every rank calls it: the evaluation is collective, rank 0 decides
 * and logs, and every rank takes its decisions. */
dlrec_status run_validate(run *r, dlrec_train_result *res, double scale, double loss, int epoch_end,
                          dlrec_progress *bar, int *stop) {
  const dlrec_train_config *c = &r->cfg;
  dlrec_metrics m, train;
  int has_train;
  dlrec_status s = run_evaluate_now(r, &m);
  if (s == DLREC_OK) s = run_evaluate_train(r, &train, &has_train);
  if (s != DLREC_OK) return s;
  r->has_last_valid = 1;
  r->last_valid_step = r->prog.step;
  r->last_valid = m;
  struct {
    dlrec_valid_outcome o;
    dlrec_valid_state valid;
  } d = {{0}, {0}};
  if (r->rank == 0) {
    dlrec_valid_observe(c, &r->prog.valid, watched(c, &m), r->prog.step, &d.o);
    cJSON *j = run_step_json(r, NAN, scale, 0);
    cJSON_DeleteItemFromObject(j, "samples_per_s");
    if (epoch_end) cJSON_AddBoolToObject(j, "epoch_end", 1);
    cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&m));
    if (has_train) cJSON_AddItemToObject(j, "train", dlrec_metrics_to_json(&train));
    if (d.o.improved && c->keep_best) cJSON_AddBoolToObject(j, "best", 1);
    if (c->plateau_factor < 1) cJSON_AddNumberToObject(j, "plateau_scale", r->prog.valid.plateau_scale);
    if (d.o.stop) cJSON_AddBoolToObject(j, "early_stop", 1);
    s = run_log_json(r, j);
    d.valid = r->prog.valid;
  }
  /* Rank 0's decisions (and the plateau's lr factor) to every rank. */
  if ((s = run_dist_status(r, s, &d, sizeof d)) != DLREC_OK) return s;
  const dlrec_valid_outcome o = d.o;
  r->prog.valid = d.valid;
  dlrec_progress_note(bar, "loss %.4f auc %.4f", isfinite(res->last_loss) ? res->last_loss : loss, m.auc);
  /* The best checkpoint: saved (which makes it `latest` too), then named by
   * RUN/best; a crash between the two is repaired on resume. */
  if (c->keep_best && o.improved) {
    if ((s = run_dist_checkpoint(r)) != DLREC_OK) return s;
    if (r->rank == 0) s = dlrec_checkpoint_mark_best(r->a->run_dir, r->prog.step);
    if ((s = run_dist_status(r, s, NULL, 0)) != DLREC_OK) return s;
  }
  if (o.reduced) DLREC_INFO("validation plateau at step %llu: learning rates x%g", (unsigned long long)r->prog.step,
                            r->prog.valid.plateau_scale);
  if (o.stop) {
    res->early_stopped = 1;
    *stop = 1;
  }
  if (c->target_auc > 0 && m.auc >= c->target_auc) {
    res->reached_target = 1;
    *stop = 1;
  }
  return DLREC_OK;
}

/* training.restore_best: the final report is RUN/best's evaluation. */
dlrec_status run_evaluate_best(run *r, dlrec_train_result *res) {
  char dir[4096];
  dlrec_model *best = NULL;
  const char *paths[] = {r->a->valid};
  dlrec_status s = dlrec_checkpoint_select(r->a->run_dir, "best", dir, sizeof dir);
  if (s == DLREC_OK) s = dlrec_model_load(dir, &best);
  /* scored on the run's threads, its table where the run's is */
  if (s == DLREC_OK) s = dlrec_net_set_host_table(best->net, dlrec_net_host_table(r->model));
  if (s == DLREC_OK) s = dlrec_net_set_backend(best->net, r->be);
  if (s == DLREC_OK) s = dlrec_evaluate(best->net, paths, 1, r->cfg.eval_batch_size, r->cfg.eval_max_rows, &res->valid);
  if (s == DLREC_OK) {
    res->has_valid = 1;
    res->restored_best = 1;
    res->best_step = best->progress.step;
    cJSON *j = run_step_json(r, res->last_loss, 0, 0);
    cJSON_DeleteItemFromObject(j, "samples_per_s");
    cJSON_DeleteItemFromObject(j, "lr_scale");
    cJSON_AddNumberToObject(j, "restored_best_step", (double)res->best_step);
    cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&res->valid));
    cJSON_AddBoolToObject(j, "final", 1);
    s = run_log_json(r, j);
  }
  dlrec_model_free(best);
  return s;
}
