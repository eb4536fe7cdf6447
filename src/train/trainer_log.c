/* What a run writes about itself: metrics.jsonl's lines (and their
 * truncation on resume), the result the CLI prints, RUN/summary.json and
 * the report made from it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/json.h"
#include "core/log.h"
#include "train/report.h"
#include "train/trainer_run.h"

dlrec_status run_log_json(run *r, cJSON *j) {
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  int ok = fprintf(r->metrics, "%s\n", text) >= 0 && fflush(r->metrics) == 0;
  free(text);
  return ok ? DLREC_OK : dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", r->metrics_path, strerror(errno));
}

/* On resume, metrics.jsonl keeps only the lines up to the checkpoint's step:
 * the steps after it are trained again and logged again. A "final" line (the
 * report of an interrupted or limited run) goes too: an uninterrupted run
 * has none there, and the validation it reports fed no decision. */
dlrec_status run_truncate_metrics(const char *path, uint64_t step) {
  char *text;
  size_t n;
  if (dlrec_read_file(path, (size_t)1 << 30, &text, &n) != DLREC_OK) return DLREC_OK; /* none yet */
  size_t keep = 0;
  for (size_t i = 0; i < n;) {
    char *nl = memchr(text + i, '\n', n - i);
    size_t end = nl ? (size_t)(nl - text) + 1 : n;
    cJSON *j = cJSON_ParseWithLength(text + i, end - i);
    const cJSON *st = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
    int keep_line = nl && st && cJSON_IsNumber(st) && st->valuedouble <= (double)step &&
                    !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "final"));
    cJSON_Delete(j);
    if (!keep_line) break; /* a torn last line, past the checkpoint, or a final report */
    keep = end;
    i = end;
  }
  dlrec_status s = dlrec_write_file_atomic(path, text, keep);
  free(text);
  return s;
}

cJSON *run_step_json(const run *r, double loss, double lr_scale, double rate) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "step", (double)r->prog.step);
  cJSON_AddNumberToObject(j, "samples", (double)r->prog.samples);
  cJSON_AddNumberToObject(j, "epoch", (double)r->prog.position.epoch);
  if (r->a->follow_dir) {
    cJSON_AddStringToObject(j, "file", r->prog.follow_file);
    cJSON_AddNumberToObject(j, "files_rejected", (double)r->files_rejected);
  }
  if (isfinite(loss)) cJSON_AddNumberToObject(j, "loss", loss);
  cJSON_AddNumberToObject(j, "lr_scale", lr_scale);
  cJSON_AddNumberToObject(j, "samples_per_s", rate);
  /* Which backend and GEMM precision trained (AUTO resolved), on every
   * line: a resume may run another precision, and truncation on resume
   * keeps lines by step, so no header line could say it once. */
  cJSON_AddStringToObject(j, "backend", dlrec_backend_name(r->be));
  cJSON_AddStringToObject(j, "precision", dlrec_precision_name(dlrec_backend_precision(r->be)));
  cJSON_AddBoolToObject(j, "bf16_native", dlrec_backend_bf16_native(r->be));
  if (r->opt.loss_scale > 0) {
    cJSON_AddNumberToObject(j, "loss_scale", r->opt.loss_scale);
    cJSON_AddNumberToObject(j, "skipped_steps", (double)r->opt.skipped_steps);
  }
  const dlrec_store *store = dlrec_net_store(r->model);
  if (dlrec_store_get_kind(store) != DLREC_STORE_RAM) {
    /* The table storage's counters since the run started. */
    dlrec_store_stats st;
    dlrec_store_get_stats(store, &st);
    cJSON *t = cJSON_AddObjectToObject(j, "table_storage");
    cJSON_AddStringToObject(t, "kind", dlrec_store_kind_name(dlrec_store_get_kind(store)));
    cJSON_AddNumberToObject(t, "lookups", (double)st.lookups);
    cJSON_AddNumberToObject(t, "hit_rate", st.lookups ? 1.0 - (double)st.misses / (double)st.lookups : 0.0);
    cJSON_AddNumberToObject(t, "misses", (double)st.misses);
    cJSON_AddNumberToObject(t, "evictions", (double)st.evictions);
    cJSON_AddNumberToObject(t, "bytes_read", (double)st.bytes_read);
    cJSON_AddNumberToObject(t, "bytes_written", (double)st.bytes_written);
    cJSON_AddNumberToObject(t, "resident_rows", (double)st.resident);
    if (dlrec_store_get_kind(store) == DLREC_STORE_HASH) {
      /* Every key that did not get a row is counted, never dropped silently. */
      cJSON_AddNumberToObject(t, "admitted", (double)st.admitted);
      cJSON_AddNumberToObject(t, "not_admitted", (double)st.not_admitted);
      cJSON_AddNumberToObject(t, "dropped", (double)st.dropped);
      cJSON_AddNumberToObject(t, "expired", (double)st.expired);
    }
  }
  if (r->pub) {
    publish_stats ps;
    publisher_stats(r->pub, &ps);
    cJSON *p = cJSON_AddObjectToObject(j, "publish");
    cJSON_AddNumberToObject(p, "rows", (double)ps.rows);
    cJSON_AddNumberToObject(p, "publishes", (double)ps.publishes);
    cJSON_AddNumberToObject(p, "errors", (double)ps.errors);
    cJSON_AddNumberToObject(p, "pending", (double)ps.pending);
  }
  return j;
}

/* Where the training loop's time went, with the rates that compare to the
 * machine's limits (bench/roofline): MLP GFLOP/s against sgemm's, embedding
 * ids per second against a random gather's. */
static cJSON *profile_json(const dlrec_train_result *r) {
  const dlrec_net_profile *p = &r->profile;
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "mlp_seconds", p->mlp);
  cJSON_AddNumberToObject(j, "mlp_gflops", p->mlp > 0 ? p->mlp_flops / p->mlp / 1e9 : 0);
  cJSON_AddNumberToObject(j, "embedding_forward_seconds", p->emb_forward);
  cJSON_AddNumberToObject(j, "embedding_forward_ids_per_s", p->emb_forward > 0 ? p->lookups / p->emb_forward : 0);
  if (p->hot_lookups) cJSON_AddNumberToObject(j, "hot_lookup_share", (double)p->hot_lookups / (double)p->lookups);
  cJSON_AddNumberToObject(j, "embedding_update_seconds", p->emb_update);
  cJSON_AddNumberToObject(j, "interaction_seconds", p->interaction);
  cJSON_AddNumberToObject(j, "other_seconds", p->other);
  cJSON_AddNumberToObject(j, "table_storage_seconds", p->store);
  cJSON_AddNumberToObject(j, "loader_wait_seconds", r->loader_wait);
  return j;
}

/* The run's totals as the CLI prints them and RUN/summary.json keeps them. */
cJSON *dlrec_train_result_to_json(const dlrec_train_args *a, const dlrec_train_result *r) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "steps", (double)r->steps);
  cJSON_AddNumberToObject(j, "samples", (double)r->samples);
  cJSON_AddNumberToObject(j, "steps_this_run", (double)r->steps_this_run);
  cJSON_AddNumberToObject(j, "seconds", r->seconds);
  cJSON_AddNumberToObject(j, "samples_per_s", r->samples_per_s);
  if (isfinite(r->last_loss)) cJSON_AddNumberToObject(j, "train_loss", r->last_loss);
  if (r->loss_scale > 0) {
    cJSON_AddNumberToObject(j, "loss_scale", r->loss_scale);
    cJSON_AddNumberToObject(j, "skipped_steps", (double)r->skipped_steps);
  }
  if (r->has_valid) cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&r->valid));
  cJSON_AddItemToObject(j, "profile", profile_json(r));
  if (r->ranks > 1) {
    /* Rank 0's share of the exchanges (docs/distributed.md). */
    const dlrec_sharded_stats *d = &r->dist;
    const double steps = d->steps ? (double)d->steps : 1;
    cJSON *x = cJSON_AddObjectToObject(j, "distributed");
    cJSON_AddNumberToObject(x, "ranks", r->ranks);
    cJSON_AddNumberToObject(x, "rank0_bytes_sent_per_step", (double)d->bytes_sent / steps);
    cJSON_AddNumberToObject(x, "rank0_lookups_per_step", (double)d->lookups / steps);
    cJSON_AddNumberToObject(x, "rank0_unique_rows_per_step", (double)d->unique_rows / steps);
    cJSON_AddNumberToObject(x, "exchange_seconds", d->exchange_seconds);
    cJSON_AddNumberToObject(x, "compute_seconds", d->compute_seconds);
    cJSON_AddNumberToObject(x, "update_seconds", d->update_seconds);
  }
  if (a->follow_dir) {
    cJSON_AddNumberToObject(j, "idle_seconds", r->idle_seconds);
    cJSON_AddNumberToObject(j, "files_rejected", (double)r->files_rejected);
  }
  if (r->interrupted) cJSON_AddBoolToObject(j, "interrupted", 1);
  if (r->reached_target) cJSON_AddBoolToObject(j, "reached_target_auc", 1);
  if (r->early_stopped) cJSON_AddBoolToObject(j, "early_stopped", 1);
  if (r->restored_best) cJSON_AddNumberToObject(j, "restored_best_step", (double)r->best_step);
  return j;
}

/* RUN/summary.json, then RUN/report.html from it and the rest of RUN. The
 * run itself is saved already, so a failure here is a warning. */
void run_write_summary(const dlrec_train_args *a, const dlrec_train_result *res) {
  char path[4096];
  cJSON *j = dlrec_train_result_to_json(a, res);
  dlrec_status s = dlrec_path_join(path, sizeof path, a->run_dir, "summary.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, j);
  cJSON_Delete(j);
  if (s == DLREC_OK) s = dlrec_report_write(a->run_dir, NULL);
  if (s != DLREC_OK) DLREC_WARN("the run's summary and report were not written: %s", dlrec_last_error());
}
