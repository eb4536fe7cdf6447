/* Scoring and evaluating .dlr files with a network (trainer.h's
 * dlrec_score_files and dlrec_evaluate), and the metrics as JSON. */
#include <math.h>
#include <stdlib.h>

#include "train/trainer_run.h"

cJSON *dlrec_metrics_to_json(const dlrec_metrics *m) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "rows", (double)m->count);
  /* NaN is not JSON: undefined metrics are null. */
#define NUM(key, v) (isfinite(v) ? cJSON_AddNumberToObject(j, key, v) : cJSON_AddNullToObject(j, key))
  NUM("auc", m->auc);
  NUM("logloss", m->logloss);
  NUM("ne", m->ne);
  NUM("calibration", m->calibration);
  NUM("ctr", m->ctr);
  NUM("mean_prediction", m->mean_pred);
#undef NUM
  /* The reliability curve, as three arrays of one entry per bin. */
  cJSON *rel = cJSON_AddObjectToObject(j, "reliability");
  cJSON *rows = cJSON_AddArrayToObject(rel, "rows"), *pred = cJSON_AddArrayToObject(rel, "mean_prediction"),
        *ctr = cJSON_AddArrayToObject(rel, "ctr");
  for (int b = 0; b < DLREC_RELIABILITY_BINS && m->reliability[b].rows; b++) {
    cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)m->reliability[b].rows));
    cJSON_AddItemToArray(pred, cJSON_CreateNumber(m->reliability[b].mean_pred));
    cJSON_AddItemToArray(ctr, cJSON_CreateNumber(m->reliability[b].ctr));
  }
  return j;
}

/* A loader over the files in order, once, in batches of `batch` rows (part
 * `part` of `parts` of each), for scoring m: the files must be encoded as
 * m's schema says. */
dlrec_status run_open_scoring(dlrec_loader **ld, const dlrec_net *m, const char *const *paths, int n_paths,
                              uint32_t batch, uint32_t part, uint32_t parts) {
  dlrec_loader_opts o;
  dlrec_loader_opts_default(&o);
  o.batch_rows = batch;
  o.shuffle = 0;
  o.epochs = 1;
  o.part = part;
  o.parts = parts;
  dlrec_status s = dlrec_loader_open(ld, paths, n_paths, &o);
  if (s == DLREC_OK && !dlrec_schema_equal(dlrec_loader_schema(*ld), dlrec_net_schema(m)))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than the model's (the schemas differ)",
                    paths[0]);
  return s;
}

dlrec_status dlrec_score_files(const dlrec_net *m, const char *const *paths, int n_paths, uint32_t batch,
                               uint64_t max_rows, dlrec_score_fn fn, void *ctx) {
  dlrec_loader *ld = NULL;
  dlrec_net_ws *ws = NULL;
  float *prob = malloc(batch * sizeof *prob);
  dlrec_status s = prob ? run_open_scoring(&ld, m, paths, n_paths, batch, 0, 1) : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  dlrec_net_scorer *sc = NULL;
  if (s == DLREC_OK) s = dlrec_net_ws_create(&ws, m, batch);
  if (s == DLREC_OK) s = dlrec_net_scorer_create(&sc, m);
  uint64_t done = 0;
  while (s == DLREC_OK && (!max_rows || done < max_rows)) {
    const dlrec_batch *b;
    s = dlrec_loader_next(ld, &b);
    if (s != DLREC_OK) break;
    uint32_t n = b->rows;
    if (max_rows && done + n > max_rows) n = (uint32_t)(max_rows - done);
    s = dlrec_net_predict(sc, ws, b, prob);
    if (s == DLREC_OK) s = fn(ctx, prob, b->labels, n);
    done += n;
  }
  if (s == DLREC_END) s = DLREC_OK;
  dlrec_net_scorer_free(sc);
  dlrec_net_ws_free(ws);
  dlrec_loader_close(ld);
  free(prob);
  return s;
}

static dlrec_status add_to_evaluator(void *ctx, const float *prob, const float *label, uint32_t n) {
  if (!label) return dlrec_error(DLREC_ERR_INVALID, "evaluation needs labeled data");
  return dlrec_evaluator_add(ctx, prob, label, n);
}

dlrec_status dlrec_evaluate(const dlrec_net *m, const char *const *paths, int n_paths, uint32_t batch,
                            uint64_t max_rows, dlrec_metrics *out) {
  dlrec_evaluator *ev;
  dlrec_status s = dlrec_evaluator_create(&ev, 0);
  if (s == DLREC_OK) s = dlrec_score_files(m, paths, n_paths, batch, max_rows, add_to_evaluator, ev);
  if (s == DLREC_OK) s = dlrec_evaluator_compute(ev, out);
  dlrec_evaluator_free(ev);
  return s;
}
