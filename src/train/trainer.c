/* The training loop: loader -> train step -> logging, evaluation and
 * checkpoints at intervals; resume; graceful stop on SIGINT/SIGTERM. */
#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "dist/dist.h"
#include "train/step.h"
#include "data/etl.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "data/loader.h"
#include "core/log.h"
#include "core/clock.h"
#include "core/progress.h"
#include "train/report.h"
#include "train/publish.h"

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
static dlrec_status open_scoring(dlrec_loader **ld, const dlrec_net *m, const char *const *paths, int n_paths,
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
  dlrec_status s = prob ? open_scoring(&ld, m, paths, n_paths, batch, 0, 1) : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
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

/* ---- the run ---- */

typedef struct run {
  const dlrec_train_args *a;
  dlrec_train_config cfg;
  char metrics_path[4096];
  FILE *metrics;
  dlrec_backend *be; /* the run's: training.threads and training.precision; the model borrows it */
  dlrec_net *model;
  dlrec_net_ws *ws;
  dlrec_net_optim opt;
  dlrec_step step; /* what each training step runs on (train/step.h) */
  dlrec_checkpoint_journal journal; /* journaled checkpoints of a tiered table */
  dlrec_loader *loader; /* following a directory: the current file's, or NULL between files */
  dlrec_train_progress prog;
  /* --follow: the options and schema each file's loader is opened with, and
   * the current file's rows. */
  dlrec_loader_opts lo;
  dlrec_schema schema;
  uint64_t follow_rows;
  double follow_idle; /* seconds spent waiting for a new file */
  publisher *pub;     /* publish.redis: trained rows to the Redis tier; NULL: off */
  /* Across ranks (a->comm of more than one rank): this rank's part of each
   * batch, its shard of the table and the exchanges (dist/dist.h). No
   * rank holds the whole table; rank 0 alone writes into RUN. */
  int rank, ranks;
  dlrec_shard_plan plan;
  dlrec_sharded *sh;
  int lock_fd; /* RUN/lock, held while the run writes into RUN; -1 if not */
  /* The last validation of this run (its step and metrics), so that the
   * final report reuses one made at the last step rather than repeating it,
   * and the step of the last checkpoint this run saved (UINT64_MAX: none). */
  int has_last_valid;
  uint64_t last_valid_step, last_ckpt_step;
  dlrec_metrics last_valid;
  int stop;             /* a stop was requested (sticky) */
  /* on_progress: when it was last called, and the loop's start, its
   * samples then and the planned total. */
  double last_progress, loop_start;
  uint64_t start_samples, total_samples;
} run;

/* Whether the host asked the run to stop (args.stop); sticky. */
static int stop_requested(run *r) {
  if (!r->stop && r->a->stop && *r->a->stop) r->stop = 1;
  return r->stop;
}

/* Calls the host's on_progress (rank 0): always when force, else at most
 * five times a second. A nonzero answer is a stop request. */
static void report_progress(run *r, const dlrec_train_result *res, int force, int done) {
  if (!r->a->on_progress || r->rank != 0) return;
  const double now = dlrec_now();
  if (!force && now - r->last_progress < 0.2) return;
  r->last_progress = now;
  dlrec_train_progress_info info = {
      .step = r->prog.step,
      .samples = r->prog.samples,
      .total_samples = r->total_samples,
      .epoch = (uint32_t)r->prog.position.epoch,
      .loss = res->last_loss,
      .valid_auc = r->has_last_valid ? r->last_valid.auc : NAN,
      .samples_per_s = now > r->loop_start ? (double)(r->prog.samples - r->start_samples) / (now - r->loop_start) : 0,
      .done = done,
  };
  if (r->a->on_progress(r->a->progress_ctx, &info)) r->stop = 1;
}

static void run_free(run *r) {
  if (r->metrics) fclose(r->metrics);
  dlrec_step_free(&r->step);
  dlrec_sharded_free(r->sh);
  dlrec_shard_plan_free(&r->plan);
  publisher_free(r->pub);
  dlrec_loader_close(r->loader);
  dlrec_net_ws_free(r->ws);
  dlrec_net_optim_free_device(&r->opt);
  dlrec_sparse_optim_free(r->opt.sparse);
  free(r->opt.dense_state);
  dlrec_net_free(r->model);
  dlrec_backend_free(r->be); /* after the model, which borrows it */
  dlrec_unlock_dir(r->lock_fd);
}

/* training.loss_scale into the optimizer: auto is dynamic in fp16 and none
 * otherwise. Across ranks, the step agrees on a step's overflow. */
static dlrec_status loss_scaling_setup(run *r) {
  dlrec_loss_scaling m = r->cfg.loss_scaling;
  if (m == DLREC_LOSS_SCALING_AUTO)
    m = r->cfg.precision == DLREC_PRECISION_FP16 ? DLREC_LOSS_SCALING_DYNAMIC : DLREC_LOSS_SCALING_NONE;
  r->opt.loss_scale = m == DLREC_LOSS_SCALING_DYNAMIC ? DLREC_LOSS_SCALE_INIT
                      : m == DLREC_LOSS_SCALING_FIXED ? r->cfg.loss_scale
                                                      : 0.0f;
  r->opt.scale_growth_interval = m == DLREC_LOSS_SCALING_DYNAMIC ? r->cfg.loss_scale_growth_interval : 0;
  return DLREC_OK;
}

/* The loss scaling's state between the optimizer, which steps it, and the
 * progress a checkpoint keeps: copied in when a checkpoint is saved, out
 * when one is resumed. A resumed dynamic scale continues where it was; a
 * fixed one, or none, is the config's. */
static void loss_scaling_resume(run *r) {
  if (r->opt.scale_growth_interval && r->prog.loss_scale > 0) {
    r->opt.loss_scale = r->prog.loss_scale;
    r->opt.scale_good_steps = r->prog.loss_scale_good_steps;
  }
  r->opt.skipped_steps = r->prog.skipped_steps;
}

static void loss_scaling_save(run *r) {
  r->prog.loss_scale = r->opt.loss_scale;
  r->prog.loss_scale_good_steps = r->opt.scale_good_steps;
  r->prog.skipped_steps = r->opt.skipped_steps;
}

static dlrec_status log_json(run *r, cJSON *j) {
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
static dlrec_status truncate_metrics(const char *path, uint64_t step) {
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

/* Across ranks (the definitions are with the rest, below dlrec_train's helpers). */
static dlrec_status dist_evaluate(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out);
static dlrec_status dist_checkpoint(run *r);
static dlrec_status dist_status(run *r, dlrec_status s, void *shared, size_t bytes);

/* The metrics of the model on the first max_rows rows (0: all) of the file
 * at path. Across ranks, collective: every rank scores its part and gets
 * the metrics. */
static dlrec_status evaluate_file(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out) {
  const char *paths[] = {path};
  dlrec_status s = r->sh ? dist_evaluate(r, path, max_rows, out)
                         : dlrec_evaluate(r->model, paths, 1, r->cfg.eval_batch_size, max_rows, out);
  return s == DLREC_OK ? DLREC_OK : dlrec_error_context("evaluating on %s: ", path);
}

/* The validation metrics. */
static dlrec_status evaluate_now(run *r, dlrec_metrics *out) {
  dlrec_status s = evaluate_file(r, r->a->valid, r->cfg.eval_max_rows, out);
  if (s == DLREC_OK) r->prog.valid_auc = out->auc;
  return s;
}

/* eval.train_rows: the metrics of the first rows of the (first) training
 * file, which the report plots beside the validation's; *has is 0 when off
 * or when the run follows a directory (no fixed training file). */
static dlrec_status evaluate_train(run *r, dlrec_metrics *out, int *has) {
  *has = r->cfg.eval_train_rows && r->a->n_train;
  return *has ? evaluate_file(r, r->a->train[0], r->cfg.eval_train_rows, out) : DLREC_OK;
}

/* Across ranks: the checkpoint's rows, from and to the shards. Data without
 * categorical columns has a table of one row that nothing reads (as one
 * process's network keeps), which no shard holds: zeros. */
static dlrec_row_source shard_rows(run *r) {
  return dlrec_sharded_rows(r->sh, r->schema.n_sparse ? r->schema.table_rows : 1);
}

static dlrec_status checkpoint_now(run *r) {
  double t0 = dlrec_now();
  const dlrec_store *store = dlrec_net_store(r->model);
  const uint64_t changed = dlrec_store_changes(store, NULL);
  /* Across ranks (rank 0 saves), the rows come from the shards. */
  const dlrec_row_source rows = r->sh ? shard_rows(r) : (dlrec_row_source){0};
  /* On a GPU its copies come back first. */
  dlrec_status s = dlrec_net_sync_host(r->model, &r->opt);
  loss_scaling_save(r);
  if (s == DLREC_OK)
    s = dlrec_checkpoint_save_rows(r->a->run_dir, &r->cfg, r->a->etl_dir, r->model, &r->opt, &r->prog,
                                   r->cfg.checkpoint_keep, &r->journal, r->sh ? &rows : NULL);
  if (s == DLREC_OK && changed != UINT64_MAX && r->journal.base_step != r->prog.step)
    DLREC_DEBUG("checkpoint at step %llu in %.2f s: a journal of %llu rows (%.1f%% of the table)",
                (unsigned long long)r->prog.step, dlrec_now() - t0, (unsigned long long)changed,
                100.0 * (double)changed / (double)dlrec_store_rows(store));
  else if (s == DLREC_OK)
    DLREC_DEBUG("checkpoint at step %llu in %.2f s: full", (unsigned long long)r->prog.step, dlrec_now() - t0);
  if (s == DLREC_OK) r->last_ckpt_step = r->prog.step;
  return s;
}

/* The metric that early stopping, the plateau and RUN/best watch. */
static double watched(const dlrec_train_config *c, const dlrec_metrics *m) {
  return c->eval_metric == DLREC_VALID_LOGLOSS ? m->logloss : m->auc;
}

/* ---- following a directory ---- */

/* The smallest name after `after` (any, when it is "") of a .dlr file in
 * dir, into out: 1; 0 when there is none; -1 when dir cannot be read. */
static int next_file(const char *dir, const char *after, char *out, size_t n) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int found = 0;
  for (struct dirent *e; (e = readdir(d));) {
    const size_t len = strlen(e->d_name);
    if (len < 5 || len >= n || strcmp(e->d_name + len - 4, ".dlr")) continue;
    if (after[0] && strcmp(e->d_name, after) <= 0) continue;
    if (!found || strcmp(e->d_name, out) < 0) {
      memcpy(out, e->d_name, len + 1);
      found = 1;
    }
  }
  closedir(d);
  return found;
}

/* Opens the loader on the followed directory's file `name` (the run's
 * schema, labeled), which becomes the progress's follow_file. */
static dlrec_status follow_open(run *r, const char *file) {
  char path[4096], name[sizeof r->prog.follow_file];
  snprintf(name, sizeof name, "%s", file); /* file may be r->prog.follow_file itself */
  dlrec_status s = dlrec_path_join(path, sizeof path, r->a->follow_dir, name);
  const char *paths[] = {path};
  dlrec_loader_close(r->loader);
  r->loader = NULL;
  if (s == DLREC_OK) s = dlrec_loader_open(&r->loader, paths, 1, &r->lo);
  if (s == DLREC_OK && !dlrec_schema_equal(dlrec_loader_schema(r->loader), &r->schema))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than %s (the schemas differ)", path,
                    r->a->etl_dir);
  if (s == DLREC_OK && !r->schema.has_label) s = dlrec_error(DLREC_ERR_INVALID, "%s: has no labels to train on", path);
  if (s != DLREC_OK) return s;
  snprintf(r->prog.follow_file, sizeof r->prog.follow_file, "%s", name);
  r->follow_rows = dlrec_loader_epoch_rows(r->loader);
  DLREC_INFO("following %s: training on %s (%llu rows)", r->a->follow_dir, name, (unsigned long long)r->follow_rows);
  return DLREC_OK;
}

/* The next batch of the followed directory: from the current file, then
 * from the next file after it as it appears. DLREC_END when the run is to
 * stop: a signal, or follow_idle seconds without a new file. */
static dlrec_status follow_next(run *r, const dlrec_batch **b) {
  for (;;) {
    if (r->loader) {
      dlrec_status s = dlrec_loader_next(r->loader, b);
      if (s != DLREC_END) return s;
      dlrec_loader_close(r->loader);
      r->loader = NULL;
    }
    char name[sizeof r->prog.follow_file];
    int found;
    const double since = dlrec_now();
    while ((found = next_file(r->a->follow_dir, r->prog.follow_file, name, sizeof name)) == 0) {
      const double waited = dlrec_now() - since;
      if (stop_requested(r) || (r->a->follow_idle > 0 && waited >= r->a->follow_idle)) {
        r->follow_idle += waited;
        return DLREC_END;
      }
      usleep(200000);
    }
    r->follow_idle += dlrec_now() - since;
    if (found < 0) return dlrec_error(DLREC_ERR_IO, "--follow %s: %s", r->a->follow_dir, strerror(errno));
    dlrec_status s = follow_open(r, name);
    if (s != DLREC_OK) return s;
  }
}

static dlrec_status start_run(run *r, const dlrec_row_source *rows);

/* The most rows of a batch of `batch` rows that one of `ranks` ranks holds
 * (the loader's parts). */
static uint32_t rows_per_rank(uint32_t batch, int ranks) {
  return (uint32_t)(((uint64_t)batch + (uint64_t)ranks - 1) / (uint64_t)ranks);
}

/* The run's config: a->config_json, a->config_path, or the defaults; then
 * the arguments that override it (--deterministic, --threads, --device,
 * --max-steps), for a run and for its plan alike. */
static dlrec_status read_config(const dlrec_train_args *a, dlrec_train_config *cfg) {
  dlrec_status s = DLREC_OK;
  if (a->config_path) {
    s = dlrec_train_config_read(a->config_path, cfg);
  } else if (!a->config_json) {
    dlrec_train_config_default(cfg);
  } else {
    cJSON *j = NULL;
    s = dlrec_json_parse(a->config_json, strlen(a->config_json), "the config", &j);
    if (s == DLREC_OK) s = dlrec_train_config_from_json(j, "the config", cfg);
    cJSON_Delete(j);
  }
  if (s != DLREC_OK) return s;
  if (a->deterministic) cfg->deterministic = 1;
  if (a->threads) cfg->threads = a->threads;
  if (a->device && dlrec_device_parse(a->device, &cfg->device, &cfg->device_index) != DLREC_OK)
    return dlrec_error_context("--device: ");
  if (a->max_steps) cfg->max_steps = a->max_steps;
  return DLREC_OK;
}

/* The threads of each of `ranks` ranks on one machine that share its cores. */
static uint32_t cores_share(long ranks) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus / ranks > 1 ? (uint32_t)(cpus / ranks) : 1;
}

static dlrec_status check_memory(run *r);

static dlrec_status setup(run *r) {
  const dlrec_train_args *a = r->a;
  dlrec_status s = DLREC_OK;
  if ((s = read_config(a, &r->cfg)) != DLREC_OK) return s;
  const char *what = a->config_path ? a->config_path : "the config";
  if (r->ranks > 1) {
    /* Ranks share the machine's cores: without a thread count, each takes
     * its share of the cores (mpirun says how many ranks run here). */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!r->cfg.threads) r->cfg.threads = cores_share(local && atol(local) > 0 ? atol(local) : r->ranks);
    if (a->follow_dir)
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "--follow trains in one process only (this job has %d ranks)",
                         r->ranks);
    if (r->cfg.storage != DLREC_STORE_RAM)
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: storage.kind \"%s\" trains in one process only; across ranks "
                         "the table is sharded in RAM (storage.kind \"ram\")", what,
                         dlrec_store_kind_name(r->cfg.storage));
    if (r->cfg.publish_redis[0])
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: publish.redis publishes from one process only", what);
  }
  /* The run's device, threads and precision are its backend's, not the process's. */
  dlrec_backend_config bc = {r->cfg.threads, r->cfg.precision, r->cfg.device_index};
  char device[32];
  dlrec_train_config_device(&r->cfg, device, sizeof device);
  if ((s = dlrec_backend_create(&r->be, r->cfg.device, &bc)) != DLREC_OK)
    return dlrec_error_context("%s: training.device %s, training.threads %u, training.precision %s: ",
                               a->config_path ? a->config_path : "the config", device, r->cfg.threads,
                               dlrec_precision_name(r->cfg.precision));
  DLREC_INFO("compute backend %s", dlrec_backend_describe(r->be));
  /* The backend sizes each op's OpenMP team, but with dynamic adjustment on
   * (OMP_DYNAMIC=true in the environment) the runtime could hand a region
   * fewer threads than asked, which would change how reductions split and
   * so the bits; turning it off keeps deterministic runs deterministic. */
  if (r->cfg.deterministic) omp_set_dynamic(0);

  dlrec_etl *etl;
  if ((s = dlrec_etl_load(&etl, a->etl_dir)) != DLREC_OK) return s;
  dlrec_schema schema = *dlrec_etl_schema(etl);
  dlrec_etl_free(etl);

  dlrec_loader_opts lo;
  dlrec_loader_opts_default(&lo);
  lo.batch_rows = r->cfg.batch_size;
  lo.shuffle = r->cfg.shuffle;
  lo.window_groups = r->cfg.window_groups;
  lo.slice_rows = r->cfg.slice_rows;
  lo.seed = r->cfg.seed;
  lo.epochs = r->cfg.epochs;
  lo.prefetch = r->cfg.prefetch;
  lo.part = (uint32_t)r->rank;
  lo.parts = (uint32_t)r->ranks;
  r->schema = schema;
  if (a->follow_dir) {
    /* Each file gets its own loader, for one pass, as it comes. */
    lo.epochs = 1;
    r->lo = lo;
    DIR *d = opendir(a->follow_dir);
    if (!d) return dlrec_error(DLREC_ERR_IO, "--follow %s: %s", a->follow_dir, strerror(errno));
    closedir(d);
  } else {
    if ((s = dlrec_loader_open(&r->loader, a->train, a->n_train, &lo)) != DLREC_OK) return s;
    if (!dlrec_schema_equal(dlrec_loader_schema(r->loader), &schema))
      return dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than %s (the schemas differ)",
                         a->train[0], a->etl_dir);
    if (!schema.has_label) return dlrec_error(DLREC_ERR_INVALID, "%s: has no labels to train on", a->train[0]);
  }

  const dlrec_train_config *c = &r->cfg;
  if (!a->valid && (c->early_stop_patience || c->plateau_factor < 1 || c->keep_best))
    return dlrec_error(DLREC_ERR_INVALID, "%s: early stopping, the lr plateau and checkpoint.keep_best need --valid",
                       a->config_path ? a->config_path : "the config");

  if (r->rank == 0 && (s = dlrec_mkdirs(a->run_dir)) != DLREC_OK) return s;
  /* One writer per run directory: two runs would overwrite each other's
   * checkpoints, `latest` and metrics.jsonl. The lock comes before anything
   * in RUN is touched, and the process's death releases it. */
  if (r->rank == 0 && (s = dlrec_lock_dir(a->run_dir, "another training run", &r->lock_fd)) != DLREC_OK) return s;
  /* The table's storage: a tiered table's file defaults to RUN/table.tiered,
   * created after the lock so that a second run cannot truncate it. */
  dlrec_store_config sc = dlrec_train_config_store(&r->cfg, schema.n_sparse, r->cfg.storage_path);
  char table_path[1024];
  if (sc.kind == DLREC_STORE_TIERED && !sc.path[0]) {
    if ((s = dlrec_path_join(table_path, sizeof table_path, a->run_dir, "table.tiered")) != DLREC_OK) return s;
    sc.path = table_path;
  }
  /* Across ranks, each holds only its shard of the table (dlrec_sharded_create). */
  s = r->ranks == 1 ? dlrec_net_create_stored(&r->model, &r->cfg.model, &schema, &sc)
                    : dlrec_net_create_tableless(&r->model, &r->cfg.model, &schema);
  if (s != DLREC_OK) return s;
  if (sc.kind == DLREC_STORE_TIERED)
    DLREC_INFO("embedding table: tiered, %s, %llu of %llu rows in RAM", sc.path,
               (unsigned long long)sc.cache_rows, (unsigned long long)schema.table_rows);
  if (sc.kind == DLREC_STORE_HASH)
    DLREC_INFO("embedding table: a hash table of %llu rows for raw keys (admitted at sighting %u%s, %s eviction)",
               (unsigned long long)sc.cache_rows, sc.admit_min_count,
               sc.admit_probability > 0 ? ", or by probability" : "", sc.evict == DLREC_HASH_EVICT_LFU ? "LFU" : "LRU");
  if (r->ranks > 1 && dlrec_net_has_batchnorm(r->model) && r->cfg.batch_size < (uint32_t)r->ranks)
    return dlrec_error(DLREC_ERR_INVALID, "%s: training.batch_size %u, fewer rows than the %d ranks: batch "
                       "normalization across ranks needs a row on every rank", what, r->cfg.batch_size, r->ranks);
  /* Before the big allocations (a GPU's copies among them); across ranks
   * dist_start prints the plan. */
  if (r->ranks == 1 && (s = check_memory(r)) != DLREC_OK) return s;
  if ((s = dlrec_net_set_backend(r->model, r->be)) != DLREC_OK) return s;
  /* Across ranks, a step's pass holds a part of the batch. */
  if ((s = dlrec_net_ws_create(&r->ws, r->model, rows_per_rank(r->cfg.batch_size, r->ranks))) != DLREC_OK) return s;
  size_t n_params;
  dlrec_net_dense_params(r->model, &n_params);
  r->opt.dense = r->cfg.dense;
  size_t state = dlrec_optim_state_floats(&r->opt.dense, n_params);
  if (state && !(r->opt.dense_state = malloc(state * sizeof(float))))
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the dense optimizer state");
  if ((s = dlrec_optim_state_init(&r->opt.dense, r->opt.dense_state, n_params)) != DLREC_OK) return s;
  r->opt.sparse_lr = r->cfg.sparse.lr;
  if (r->ranks == 1 &&
      (s = dlrec_store_optim_create(dlrec_net_store(r->model), &r->cfg.sparse, &r->opt.sparse)) != DLREC_OK)
    return s;
  r->opt.clip_grad_norm = r->cfg.clip_grad_norm;
  if ((s = loss_scaling_setup(r)) != DLREC_OK) return s;
  r->step = (dlrec_step){.net = r->model, .ws = r->ws, .opt = &r->opt, .comm = r->ranks > 1 ? a->comm : NULL};
  if (r->cfg.publish_redis[0] && !dlrec_backend_host_memory(r->be))
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: publish.redis publishes from a table in host memory: train on "
                       "the CPU to publish rows", dlrec_backend_describe(r->be));
  if (r->cfg.publish_redis[0] && (s = publisher_create(&r->pub, &r->cfg, r->model)) != DLREC_OK) return s;
  /* A tiered or hash table records the rows each step changes, so that
   * checkpoints can journal them instead of copying the whole table. */
  r->journal.max_fraction = r->cfg.checkpoint_journal_max_fraction;
  if ((sc.kind == DLREC_STORE_TIERED || sc.kind == DLREC_STORE_HASH) && r->journal.max_fraction > 0 &&
      (s = dlrec_store_track_changes(dlrec_net_store(r->model))) != DLREC_OK)
    return s;

  if ((s = dlrec_path_join(r->metrics_path, sizeof r->metrics_path, a->run_dir, "metrics.jsonl")) != DLREC_OK) return s;
  r->prog.valid_auc = NAN;
  dlrec_valid_state_init(&r->prog.valid);
  /* Across ranks, the start waits for the shards (dist_start). */
  return r->ranks > 1 ? DLREC_OK : start_run(r, NULL);
}

/* Resumes RUN's latest checkpoint, its rows into `rows` when not NULL
 * (across ranks: the shards), or initializes the parameters (across ranks:
 * the dense ones); then opens metrics.jsonl. */
static dlrec_status start_run(run *r, const dlrec_row_source *rows) {
  const dlrec_train_args *a = r->a;
  dlrec_status s;
  if (a->resume) {
    s = dlrec_checkpoint_load_training_rows(a->run_dir, &r->cfg, a->etl_dir, r->model, &r->opt, &r->prog,
                                            &r->journal, rows);
    /* On a GPU the loaded state goes over to its copies. */
    if (s == DLREC_OK) s = dlrec_net_sync_device(r->model, &r->opt);
    if (s == DLREC_OK && !a->follow_dir && r->prog.follow_file[0])
      s = dlrec_error(DLREC_ERR_INVALID, "%s was training on files of a followed directory (last %s): resume it "
                      "with --follow", a->run_dir, r->prog.follow_file);
    /* Following: back into the checkpoint's file, where it stopped; a run
     * that trained on --train files follows from the directory's first. */
    if (s == DLREC_OK && a->follow_dir && r->prog.follow_file[0] &&
        (s = follow_open(r, r->prog.follow_file)) == DLREC_OK)
      s = dlrec_loader_seek(r->loader, r->prog.position);
    else if (s == DLREC_OK && !a->follow_dir)
      s = dlrec_loader_seek(r->loader, r->prog.position);
    if (s == DLREC_OK) s = truncate_metrics(r->metrics_path, r->prog.step);
    /* A crash between saving a best checkpoint and pointing RUN/best at it
     * leaves the state saying "best here": point at it now. */
    if (s == DLREC_OK && r->cfg.keep_best && r->prog.valid.validations && r->prog.valid.best_step == r->prog.step)
      s = dlrec_checkpoint_mark_best(a->run_dir, r->prog.step);
    if (s != DLREC_OK) return s;
    DLREC_INFO("resuming from step %llu (epoch %llu, row %llu)", (unsigned long long)r->prog.step,
               (unsigned long long)r->prog.position.epoch, (unsigned long long)r->prog.position.row);
    loss_scaling_resume(r);
  } else {
    if ((s = dlrec_net_init(r->model, r->cfg.seed)) != DLREC_OK) return s;
    if (r->loader) r->prog.position = dlrec_loader_position(r->loader);
    remove(r->metrics_path); /* a fresh run starts a fresh log */
  }
  r->metrics = fopen(r->metrics_path, "a");
  if (!r->metrics) return dlrec_error(DLREC_ERR_IO, "%s: %s", r->metrics_path, strerror(errno));
  return DLREC_OK;
}

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
  report_progress(r, res, 0, 0);
  if (loss_out) *loss_out = loss;
  return DLREC_OK;
}

static cJSON *step_json(const run *r, double loss, double lr_scale, double rate) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "step", (double)r->prog.step);
  cJSON_AddNumberToObject(j, "samples", (double)r->prog.samples);
  cJSON_AddNumberToObject(j, "epoch", (double)r->prog.position.epoch);
  if (r->a->follow_dir) cJSON_AddStringToObject(j, "file", r->prog.follow_file);
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

/* A scheduled validation (eval.interval_steps or the end of an epoch) after
 * the step trained with lr scale `scale`: evaluates, feeds the metric to the
 * validation state (best, early stopping, plateau), logs the line, and saves
 * the best checkpoint. *stop is set when the run must end here. Across
 * ranks every rank calls it: the evaluation is collective, rank 0 decides
 * and logs, and every rank takes its decisions. */
static dlrec_status validate(run *r, dlrec_train_result *res, double scale, double loss, int epoch_end,
                             dlrec_progress *bar, int *stop) {
  const dlrec_train_config *c = &r->cfg;
  dlrec_metrics m, train;
  int has_train;
  dlrec_status s = evaluate_now(r, &m);
  if (s == DLREC_OK) s = evaluate_train(r, &train, &has_train);
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
    cJSON *j = step_json(r, NAN, scale, 0);
    cJSON_DeleteItemFromObject(j, "samples_per_s");
    if (epoch_end) cJSON_AddBoolToObject(j, "epoch_end", 1);
    cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&m));
    if (has_train) cJSON_AddItemToObject(j, "train", dlrec_metrics_to_json(&train));
    if (d.o.improved && c->keep_best) cJSON_AddBoolToObject(j, "best", 1);
    if (c->plateau_factor < 1) cJSON_AddNumberToObject(j, "plateau_scale", r->prog.valid.plateau_scale);
    if (d.o.stop) cJSON_AddBoolToObject(j, "early_stop", 1);
    s = log_json(r, j);
    d.valid = r->prog.valid;
  }
  /* Rank 0's decisions (and the plateau's lr factor) to every rank. */
  if ((s = dist_status(r, s, &d, sizeof d)) != DLREC_OK) return s;
  const dlrec_valid_outcome o = d.o;
  r->prog.valid = d.valid;
  dlrec_progress_note(bar, "loss %.4f auc %.4f", isfinite(res->last_loss) ? res->last_loss : loss, m.auc);
  /* The best checkpoint: saved (which makes it `latest` too), then named by
   * RUN/best; a crash between the two is repaired on resume. */
  if (c->keep_best && o.improved) {
    if ((s = dist_checkpoint(r)) != DLREC_OK) return s;
    if (r->rank == 0) s = dlrec_checkpoint_mark_best(r->a->run_dir, r->prog.step);
    if ((s = dist_status(r, s, NULL, 0)) != DLREC_OK) return s;
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
static dlrec_status evaluate_best(run *r, dlrec_train_result *res) {
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
    cJSON *j = step_json(r, res->last_loss, 0, 0);
    cJSON_DeleteItemFromObject(j, "samples_per_s");
    cJSON_DeleteItemFromObject(j, "lr_scale");
    cJSON_AddNumberToObject(j, "restored_best_step", (double)res->best_step);
    cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&res->valid));
    cJSON_AddBoolToObject(j, "final", 1);
    s = log_json(r, j);
  }
  dlrec_model_free(best);
  return s;
}

/* ---- across ranks ---- */

/* Every rank's status, so that all go on or all stop: one that failed alone
 * would leave the others waiting in the next collective. Returns this
 * rank's error, or one naming the first rank that failed. */
static dlrec_status dist_agree(run *r, dlrec_status s) {
  if (r->ranks < 2) return s;
  int32_t mine = s, all[DLREC_DIST_MAX_RANKS];
  dlrec_status c = dlrec_comm_allgather(r->a->comm, &mine, sizeof mine, all);
  if (c != DLREC_OK) return c;
  if (s != DLREC_OK) return s;
  for (int q = 0; q < r->ranks; q++)
    if (all[q] != DLREC_OK && all[q] != DLREC_END)
      return dlrec_error((dlrec_status)all[q], "rank %d failed (its error is in its log)", q);
  return DLREC_OK;
}

/* A table row's bytes and its sparse optimizer state's, and the dense
 * parameters' bytes with their optimizer state's. */
static void row_and_dense_bytes(const dlrec_train_config *cfg, const dlrec_net *net, uint32_t *row_bytes,
                                uint32_t *optim_bytes, uint64_t *dense_bytes) {
  size_t n_params;
  dlrec_net_dense_params_const(net, &n_params);
  const dlrec_table *t = dlrec_net_table_const(net); /* its dim, stride and dtype are the whole table's */
  const uint32_t stride = dlrec_table_stride(t);
  *row_bytes = stride * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
  *optim_bytes = cfg->sparse.kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 4
                 : cfg->sparse.kind == DLREC_SPARSE_LAZY_ADAM  ? 8 * stride + 4
                                                                : 0;
  *dense_bytes = (uint64_t)(n_params + dlrec_optim_state_floats(&cfg->dense, n_params)) * sizeof(float);
}

/* The shard plan of net's table over `ranks` ranks with the config's sparse
 * optimizer, and the bytes of the dense parameters with their state. */
static dlrec_status make_plan(const dlrec_train_config *cfg, dlrec_net *net, int ranks, dlrec_shard_plan *p,
                              uint64_t *dense_bytes) {
  uint32_t row_bytes, optim_bytes;
  row_and_dense_bytes(cfg, net, &row_bytes, &optim_bytes, dense_bytes);
  return dlrec_shard_plan_make(p, dlrec_net_schema(net), ranks, dlrec_table_dim(dlrec_net_table_const(net)), row_bytes,
                               optim_bytes, cfg->dist_rowwise_share);
}

/* The most rows a rank's part holds: ceil(batch / ranks), of a training or
 * a validation batch. */
static uint32_t part_rows(const dlrec_train_config *cfg, int ranks) {
  return rows_per_rank(cfg->batch_size > cfg->eval_batch_size ? cfg->batch_size : cfg->eval_batch_size, ranks);
}

/* The model's activations and workspaces on every rank (dlrec_net_ws_bytes):
 * a step's part of the batch, split across the rank's threads where the
 * device is the CPU, and an evaluation's part beside it. threads: the
 * rank's, resolved. With 16-bit GEMMs (`precision`, resolved
 * (dlrec_precision_resolve), bf16 or fp16) the step also keeps the 16-bit
 * copies of its layers' inputs and weights from the forward for the
 * backward (backend_impl.h's keep_operands): at most half the step's
 * activations and 2 bytes a dense parameter, each way. */
static uint64_t run_ws_bytes(const dlrec_train_config *cfg, const dlrec_net *net, int ranks, uint32_t threads,
                             dlrec_precision precision) {
  const uint32_t ways = strcmp(cfg->device, "cpu") ? 1 : threads;
  const uint64_t step = dlrec_net_ws_bytes(net, rows_per_rank(cfg->batch_size, ranks), ways);
  const int half = precision == DLREC_PRECISION_BF16 || precision == DLREC_PRECISION_FP16;
  size_t n_params = 0;
  dlrec_net_dense_params_const(net, &n_params);
  const uint64_t kept = half ? step / 2 + (uint64_t)ways * n_params * 2 : 0;
  return step + kept + dlrec_net_ws_bytes(net, rows_per_rank(cfg->eval_batch_size, ranks), 1);
}

/* A rank's threads when the config leaves them to the machine: its share
 * of the cores (setup's rule, with every rank on this machine). */
static uint32_t plan_threads(const dlrec_train_config *cfg, int ranks) {
  return cfg->threads ? cfg->threads : cores_share(ranks);
}

/* Whether `need` bytes fit the memory of cfg's device, in one line into
 * buf (what the device has, or why it is unknown); 1 when it does not fit. */
static int device_fit(const dlrec_train_config *cfg, uint64_t need, char *buf, size_t size) {
  char device[32];
  dlrec_train_config_device(cfg, device, sizeof device);
  uint64_t total = 0, available = 0;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (dlrec_device_memory(device, &total, &available) != DLREC_OK) {
    snprintf(buf, size, "%s: its memory is unknown here (%s)", device, dlrec_last_error());
    dlrec_clear_error();
    return 0;
  }
  const int over = need > available;
  snprintf(buf, size, "%s has %.1f GiB available of %.1f GiB: %s", device, (double)available / gib,
           (double)total / gib,
           !over ? "it fits"
           : !strcmp(cfg->device, "cpu")
               ? "it does NOT fit (storage.kind \"tiered\" keeps the table on disk; smaller batches need less)"
               : "it does NOT fit (smaller batches need less)");
  return over;
}

/* The device bytes of a batch's pooled rows: the hot rows' buffer. */
static uint64_t pool_bytes(const dlrec_train_config *cfg, const dlrec_net *net) {
  return (uint64_t)cfg->batch_size * dlrec_net_schema(net)->n_sparse *
         dlrec_table_dim(dlrec_net_table_const(net)) * sizeof(float);
}

/* dlrec_table_on_host's rule for net on cfg's device, where the run needs
 * `need` bytes with its table and `rest` without it, the table's `rows`
 * taking row_bytes each with their optimizer state; *hot the hot rows'
 * share. Never on the CPU, nor without categorical columns. */
static int table_on_host(const dlrec_train_config *cfg, const dlrec_net *net, uint64_t need, uint64_t rest,
                         uint64_t rows, uint64_t row_bytes, float *hot) {
  *hot = 0.0f;
  if (!strcmp(cfg->device, "cpu") || !dlrec_net_schema(net)->n_sparse) return 0;
  char device[32];
  dlrec_train_config_device(cfg, device, sizeof device);
  return dlrec_table_on_host(device, cfg->table_placement, cfg->storage, cfg->hot_fraction, need, rest,
                             pool_bytes(cfg, net), rows, row_bytes, hot);
}

/* The table in host memory (set on net), with a `fraction` of each
 * column's rows on the device too; *bytes the device bytes those take
 * (row_bytes each, with their optimizer state, and a batch's packed
 * pooled rows), 0 without any. */
static dlrec_status place_hot_rows(const dlrec_train_config *cfg, dlrec_net *net, float fraction, uint64_t row_bytes,
                                   uint64_t *bytes) {
  *bytes = 0;
  dlrec_status s = dlrec_net_set_host_table(net, 1);
  if (s == DLREC_OK) s = dlrec_net_set_hot_fraction(net, fraction);
  const uint64_t rows = s == DLREC_OK ? dlrec_net_hot_rows(net) : 0;
  if (rows) *bytes = rows * row_bytes + pool_bytes(cfg, net);
  return s;
}

/* One process's memory, up front (--plan prints it without training; a
 * job of several ranks logs its whole plan in dist_start). When the device
 * does not have it: a warning on the CPU, whose page cache and swap make
 * "available" soft; on a GPU a refusal, before cudaMalloc would fail in the
 * middle of setting up. On a GPU it also places the table
 * (training.table_placement): in host memory when asked, or when auto and
 * the run does not fit the device with it. Measured on the host's
 * workspaces: the network is not on its device yet. */
static dlrec_status check_memory(run *r) {
  uint32_t row_bytes, optim_bytes;
  uint64_t dense;
  row_and_dense_bytes(&r->cfg, r->model, &row_bytes, &optim_bytes, &dense);
  const double mib = 1024.0 * 1024.0;
  const uint64_t table = dlrec_table_rows(dlrec_net_table_const(r->model)) * (uint64_t)(row_bytes + optim_bytes);
  const uint64_t ws = run_ws_bytes(&r->cfg, r->model, 1, dlrec_backend_threads(r->be), dlrec_backend_precision(r->be));
  DLREC_INFO("memory: the table and its optimizer state %.1f MiB%s, the dense parameters and theirs %.1f MiB, "
             "activations and workspaces about %.1f MiB", (double)table / mib,
             r->cfg.storage == DLREC_STORE_RAM ? "" : " (the store's cache in memory)", (double)dense / mib,
             (double)ws / mib);
  char fit[512];
  const int device = !dlrec_backend_host_memory(r->be);
  const uint32_t n_sparse = dlrec_net_schema(r->model)->n_sparse;
  float fraction;
  const int host = table_on_host(&r->cfg, r->model, table + dense + ws, dense + ws,
                                 dlrec_table_rows(dlrec_net_table_const(r->model)), row_bytes + optim_bytes, &fraction);
  if (host && r->cfg.table_placement == DLREC_TABLE_PLACEMENT_DEVICE)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "training.table_placement \"device\": storage.kind \"%s\" keeps its "
                       "table in host memory (its rows move between RAM and its file or keys): set \"host\" or "
                       "\"auto\"", dlrec_store_kind_name(r->cfg.storage));
  uint64_t hot = 0; /* the hot rows' bytes on the device, with their optimizer state and a pool's copy */
  if (host) {
    DLREC_INFO("memory: the table stays in host memory (training.table_placement %s); its bag ops run on the "
               "CPU, and the pooled rows and their gradient cross over each step",
               r->cfg.table_placement == DLREC_TABLE_PLACEMENT_HOST ? "host"
               : r->cfg.storage != DLREC_STORE_RAM                 ? "auto: a store's table stays there"
                                                                   : "auto: the device cannot hold it too");
    dlrec_status s = place_hot_rows(&r->cfg, r->model, fraction, row_bytes + optim_bytes, &hot);
    if (s != DLREC_OK) return s;
    const uint64_t rows = dlrec_net_hot_rows(r->model);
    if (rows) {
      DLREC_INFO("memory: %llu hot rows (training.hot_fraction %s%.3g of each column's, its most frequent values) "
                 "on the device too, %.1f MiB with their optimizer state; their lookups and updates run there",
                 (unsigned long long)rows, r->cfg.hot_fraction < 0 ? "auto: " : "", (double)fraction,
                 (double)hot / mib);
    }
  }
  const uint64_t need = dense + ws + (host ? hot : table);
  if (!device_fit(&r->cfg, need, fit, sizeof fit)) return DLREC_OK;
  if (device)
    return dlrec_error(DLREC_ERR_NOMEM, "memory: the run needs about %.1f MiB%s; %s%s", (double)need / mib,
                       host ? " besides the table, which is in host memory" : "", fit,
                       host || !n_sparse ? "" : "; training.table_placement \"host\" keeps the table in host memory");
  DLREC_WARN("memory: %s", fit);
  return DLREC_OK;
}

dlrec_status dlrec_train_print_plan(const dlrec_train_args *a, int ranks, FILE *out) {
  dlrec_train_config cfg;
  dlrec_status s = read_config(a, &cfg);
  dlrec_etl *etl = NULL;
  if (s == DLREC_OK) s = dlrec_etl_load(&etl, a->etl_dir);
  if (s != DLREC_OK) return s;
  dlrec_schema schema = *dlrec_etl_schema(etl);
  dlrec_etl_free(etl);
  dlrec_net *net = NULL;
  dlrec_shard_plan p = {0};
  uint64_t dense = 0;
  s = dlrec_net_create_tableless(&net, &cfg.model, &schema);
  if (s == DLREC_OK) s = make_plan(&cfg, net, ranks, &p, &dense);
  if (s == DLREC_OK) {
    const uint64_t step = dlrec_shard_plan_step_bytes(&p, &schema, part_rows(&cfg, ranks));
    const char *backend = "cpu";
    uint32_t index;
    if (dlrec_device_parse(cfg.device, &backend, &index) != DLREC_OK) dlrec_clear_error(); /* read_config checked it */
    const uint64_t ws = run_ws_bytes(&cfg, net, ranks, plan_threads(&cfg, ranks),
                                     dlrec_precision_resolve(backend, cfg.precision));
    dlrec_shard_plan_print(&p, &schema, dense, step, ws, out);
    uint64_t most = 0; /* the largest rank's total */
    for (int r = 0; r < ranks; r++) {
      const uint64_t total = p.rows[r] * (uint64_t)(p.row_bytes + p.optim_bytes) + dense + step + ws;
      most = total > most ? total : most;
    }
    char fit[512];
    device_fit(&cfg, most, fit, sizeof fit);
    fprintf(out, "  device: the largest rank needs about %.1f MiB; %s%s\n", (double)most / (1024.0 * 1024.0), fit,
            ranks > 1 ? " (ranks on one machine share it)" : "");
    /* One process on a GPU: the table in host memory instead, by check_memory's rule. */
    float fraction;
    if (ranks == 1 && table_on_host(&cfg, net, most, dense + step + ws, schema.table_rows,
                                    p.row_bytes + p.optim_bytes, &fraction)) {
      uint64_t hot = 0;
      if (place_hot_rows(&cfg, net, fraction, p.row_bytes + p.optim_bytes, &hot) != DLREC_OK)
        dlrec_clear_error(); /* the plan without hot rows */
      const uint64_t rest = dense + step + ws + hot;
      device_fit(&cfg, rest, fit, sizeof fit);
      fprintf(out, "  device: with the table in host memory (training.table_placement %s)%s, about %.1f MiB; %s\n",
              cfg.table_placement == DLREC_TABLE_PLACEMENT_HOST ? "host" : "auto",
              hot ? " and its hot rows on the device (training.hot_fraction)" : "",
              (double)rest / (1024.0 * 1024.0), fit);
    }
  }
  dlrec_shard_plan_free(&p);
  dlrec_net_free(net);
  return s;
}

/* After setup, across ranks: the shard plan and this rank's shard; then
 * rank 0 resumes RUN's checkpoint (its rows going to the shards) or every
 * rank draws its shard's rows as one process draws the table, and every
 * rank takes rank 0's progress, dense parameters and their optimizer state
 * and seeks its loader to the progress's position. */
static dlrec_status dist_start(run *r) {
  dlrec_comm *c = r->a->comm;
  size_t n_params;
  float *params = dlrec_net_dense_params(r->model, &n_params);
  const size_t state = dlrec_optim_state_floats(&r->opt.dense, n_params);
  uint64_t dense = 0;
  dlrec_status s = make_plan(&r->cfg, r->model, r->ranks, &r->plan, &dense);
  const uint32_t rows = part_rows(&r->cfg, r->ranks);
  if (s == DLREC_OK) s = dlrec_sharded_create(&r->sh, c, &r->plan, r->model, &r->cfg.sparse, rows);
  if (s == DLREC_OK) r->step.stage = dlrec_sharded_stage(r->sh);
  if ((s = dist_agree(r, s)) != DLREC_OK) return s;
  if (r->rank == 0) {
    DLREC_INFO("%d ranks (%s), %u thread%s each; the table sharded:", r->ranks, dlrec_comm_name(c), r->cfg.threads,
               r->cfg.threads == 1 ? "" : "s");
    if (dlrec_log_get_level() <= DLREC_LOG_INFO)
      dlrec_shard_plan_print(&r->plan, &r->schema, dense, dlrec_shard_plan_step_bytes(&r->plan, &r->schema, rows),
                             run_ws_bytes(&r->cfg, r->model, r->ranks, r->cfg.threads,
                                          dlrec_backend_precision(r->be)),
                             stderr);
  }
  if (r->a->resume && r->rank == 0) {
    const dlrec_row_source rows = shard_rows(r);
    s = dlrec_sharded_rows_end(r->sh, start_run(r, &rows));
  } else if (r->a->resume) {
    s = dlrec_sharded_rows_serve(r->sh);
  } else {
    s = dlrec_sharded_init(r->sh, &r->schema, r->cfg.seed);
    if (s == DLREC_OK && r->rank == 0) s = start_run(r, NULL);
  }
  if ((s = dist_agree(r, s)) != DLREC_OK) return s;
  s = dlrec_comm_bcast(c, &r->prog, sizeof r->prog, 0);
  if (s == DLREC_OK) s = dlrec_comm_bcast(c, params, n_params * sizeof(float), 0);
  if (s == DLREC_OK && state) s = dlrec_comm_bcast(c, r->opt.dense_state, state * sizeof(float), 0);
  if (s == DLREC_OK && r->rank != 0) s = dlrec_loader_seek(r->loader, r->prog.position);
  return dist_agree(r, s);
}

/* Something rank 0 did alone (logging, saving): its status, and `bytes`
 * bytes of `shared` (what it decided), to every rank. Returns this rank's
 * status on rank 0, rank 0's on the others. */
static dlrec_status dist_status(run *r, dlrec_status s, void *shared, size_t bytes) {
  if (!r->sh) return s;
  int32_t st = s;
  dlrec_status c = dlrec_comm_bcast(r->a->comm, &st, sizeof st, 0);
  if (c == DLREC_OK && bytes) c = dlrec_comm_bcast(r->a->comm, shared, bytes, 0);
  if (c != DLREC_OK) return c;
  if (r->rank == 0) return s;
  return st == DLREC_OK ? DLREC_OK : dlrec_error((dlrec_status)st, "rank 0 failed (its error is in its log)");
}

/* A checkpoint, collectively across ranks: rank 0 writes it, taking the
 * rows from the shards a chunk at a time, while the others serve them. */
static dlrec_status dist_checkpoint(run *r) {
  if (!r->sh) return checkpoint_now(r);
  const dlrec_status s =
      r->rank == 0 ? dlrec_sharded_rows_end(r->sh, checkpoint_now(r)) : dlrec_sharded_rows_serve(r->sh);
  return dist_status(r, s, &r->last_ckpt_step, sizeof r->last_ckpt_step);
}

/* The step's agreement: every rank's loader outcome (its part of the same
 * batch, or the end), its stop request and its part's rows. *global and
 * *base: the batch's rows and where this part starts in it; each (when not
 * NULL): every rank's rows; *stop: some rank was asked to stop (a signal
 * reaches the ranks at different steps). */
static dlrec_status dist_step_agree(run *r, dlrec_status ls, uint32_t rows, uint32_t *global, uint32_t *base,
                                    int *stop, uint32_t *each) {
  uint32_t mine[3] = {(uint32_t)(int32_t)ls, (uint32_t)stop_requested(r), rows}, all[3 * DLREC_DIST_MAX_RANKS];
  dlrec_status s = dlrec_comm_allgather(r->a->comm, mine, sizeof mine, all);
  if (s != DLREC_OK) return s;
  *global = *base = 0;
  *stop = 0;
  int ends = 0;
  for (int q = 0; q < r->ranks; q++) {
    const dlrec_status qs = (dlrec_status)(int32_t)all[3 * q];
    if (qs != DLREC_OK && qs != DLREC_END)
      return q == r->rank ? ls : dlrec_error(qs, "rank %d failed to load its part of the batch (its error is in its log)", q);
    ends += qs == DLREC_END;
    *stop |= all[3 * q + 1] != 0;
    if (q < r->rank) *base += all[3 * q + 2];
    *global += all[3 * q + 2];
    if (each) each[q] = all[3 * q + 2];
  }
  if (ends && ends != r->ranks)
    return dlrec_error(DLREC_ERR_INTERNAL, "the ranks' loaders disagree on the end of the data");
  return ends ? DLREC_END : DLREC_OK;
}

/* Across ranks: every rank scores its part of each validation batch, with
 * the rows its lookups need from their owners, and sends its scores and
 * labels to rank 0, which computes the metrics over all of them in the
 * file's order (the exact global AUC) and shares them. */
static dlrec_status dist_evaluate(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out) {
  const char *paths[] = {path};
  dlrec_comm *c = r->a->comm;
  const uint32_t N = (uint32_t)r->ranks, B = r->cfg.eval_batch_size;
  const uint32_t part = rows_per_rank(B, r->ranks);
  dlrec_loader *ld = NULL;
  dlrec_net_ws *ws = NULL;
  dlrec_net_scorer *sc = NULL;
  dlrec_evaluator *ev = NULL;
  float *pairs = malloc((size_t)part * 2 * sizeof(float)); /* (score, label) of each row of the part */
  float *prob = malloc((size_t)part * sizeof(float));
  /* Rank 0: every part's pairs, then the batch's scores and labels. */
  float *all = r->rank == 0 ? malloc((size_t)B * 4 * sizeof(float)) : NULL;
  uint64_t *sb = calloc(N, sizeof *sb), *rb = calloc(N, sizeof *rb);
  dlrec_status s = pairs && prob && sb && rb && (r->rank != 0 || all) ? DLREC_OK
                                                                      : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (s == DLREC_OK) s = open_scoring(&ld, r->model, paths, 1, B, (uint32_t)r->rank, N);
  if (s == DLREC_OK && !dlrec_loader_schema(ld)->has_label)
    s = dlrec_error(DLREC_ERR_INVALID, "evaluation needs labeled data");
  if (s == DLREC_OK) s = dlrec_net_ws_create(&ws, r->model, part);
  if (s == DLREC_OK) s = dlrec_net_scorer_create(&sc, r->model);
  if (s == DLREC_OK && r->rank == 0) s = dlrec_evaluator_create(&ev, 0);
  s = dist_agree(r, s);
  uint64_t done = 0;
  while (s == DLREC_OK) {
    const dlrec_batch *b = NULL;
    const dlrec_status ls = dlrec_loader_next(ld, &b);
    uint32_t global, base_rows, each[DLREC_DIST_MAX_RANKS];
    int stop; /* a stop request waits for the training loop's next step */
    s = dist_step_agree(r, ls, ls == DLREC_OK ? b->rows : 0, &global, &base_rows, &stop, each);
    if (s == DLREC_END) s = DLREC_OK;
    if (s != DLREC_OK || ls == DLREC_END) break;
    if ((s = dlrec_sharded_score(r->sh, sc, ws, b, prob)) != DLREC_OK) {
      DLREC_ERROR("rank %d: scoring %s: %s", r->rank, paths[0], dlrec_last_error());
      dlrec_comm_abort(c, 1);
      break;
    }
    /* The rows within eval.max_rows, each rank's, in the file's order. */
    uint64_t base = done;
    for (uint32_t q = 0; q < N; q++) {
      const uint64_t rows = each[q];
      const uint64_t keep = !max_rows ? rows : base >= max_rows ? 0 : max_rows - base < rows ? max_rows - base : rows;
      sb[q] = 0;
      rb[q] = r->rank == 0 ? keep * 2 * sizeof(float) : 0;
      if ((int)q == r->rank) {
        sb[0] = keep * 2 * sizeof(float);
        for (uint64_t i = 0; i < keep; i++) pairs[2 * i] = prob[i], pairs[2 * i + 1] = b->labels[i];
      }
      base += rows;
    }
    if ((s = dlrec_comm_alltoallv(c, pairs, sb, all, rb)) != DLREC_OK) break;
    dlrec_status es = DLREC_OK;
    if (r->rank == 0) {
      uint64_t n = 0;
      for (uint32_t q = 0; q < N; q++) n += rb[q] / (2 * sizeof(float));
      float *scores = all + 2 * (size_t)B, *labels = scores + B;
      for (uint64_t i = 0; i < n; i++) scores[i] = all[2 * i], labels[i] = all[2 * i + 1];
      if (n) es = dlrec_evaluator_add(ev, scores, labels, n);
    }
    if ((s = dist_status(r, es, NULL, 0)) != DLREC_OK) break;
    done = base;
    if (max_rows && done >= max_rows) break;
  }
  if (s == DLREC_OK) s = dist_status(r, r->rank == 0 ? dlrec_evaluator_compute(ev, out) : DLREC_OK, out, sizeof *out);
  free(sb);
  free(rb);
  dlrec_evaluator_free(ev);
  dlrec_net_scorer_free(sc);
  dlrec_net_ws_free(ws);
  dlrec_loader_close(ld);
  free(pairs);
  free(all);
  free(prob);
  return s;
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
  if (a->follow_dir) cJSON_AddNumberToObject(j, "idle_seconds", r->idle_seconds);
  if (r->interrupted) cJSON_AddBoolToObject(j, "interrupted", 1);
  if (r->reached_target) cJSON_AddBoolToObject(j, "reached_target_auc", 1);
  if (r->early_stopped) cJSON_AddBoolToObject(j, "early_stopped", 1);
  if (r->restored_best) cJSON_AddNumberToObject(j, "restored_best_step", (double)r->best_step);
  return j;
}

/* RUN/summary.json, then RUN/report.html from it and the rest of RUN. The
 * run itself is saved already, so a failure here is a warning. */
static void write_summary(const dlrec_train_args *a, const dlrec_train_result *res) {
  char path[4096];
  cJSON *j = dlrec_train_result_to_json(a, res);
  dlrec_status s = dlrec_path_join(path, sizeof path, a->run_dir, "summary.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, j);
  cJSON_Delete(j);
  if (s == DLREC_OK) s = dlrec_report_write(a->run_dir, NULL);
  if (s != DLREC_OK) DLREC_WARN("the run's summary and report were not written: %s", dlrec_last_error());
}

dlrec_status dlrec_train(const dlrec_train_args *a, dlrec_train_result *res) {
  memset(res, 0, sizeof *res);
  res->last_loss = NAN;
  run r = {.a = a, .lock_fd = -1, .last_ckpt_step = UINT64_MAX};
  r.rank = a->comm ? dlrec_comm_rank(a->comm) : 0;
  r.ranks = a->comm ? dlrec_comm_size(a->comm) : 1;
  dlrec_status s = setup(&r);
  if (r.ranks > 1 && (s = dist_agree(&r, s)) == DLREC_OK) s = dist_start(&r);
  if (s != DLREC_OK) {
    run_free(&r);
    return s;
  }
  const dlrec_train_config *c = &r.cfg;

  /* Following, the rows to come are unknown: the bar has no total unless
   * max_steps gives one. */
  const int follow = a->follow_dir != NULL;
  uint64_t epoch_rows = follow ? 0 : dlrec_loader_epoch_rows(r.loader);
  uint64_t total = follow ? UINT64_MAX : epoch_rows * c->epochs;
  if (c->max_steps && c->max_steps * c->batch_size < total) total = c->max_steps * c->batch_size;
  if (total == UINT64_MAX) total = 0;
  dlrec_progress *bar = r.rank == 0 ? dlrec_progress_start("train", total, "samples") : NULL;
  dlrec_progress_add(bar, r.prog.samples < total ? r.prog.samples : total);
  double t0 = dlrec_now(), t_log = t0;
  uint64_t rows_log = 0, start_samples = r.prog.samples, start_step = r.prog.step;
  r.loop_start = t0, r.start_samples = start_samples, r.total_samples = total;
  double eval_seconds = 0;
  int state_ok = 1; /* the parameters are those after r.prog.step whole steps */
  int split_said = r.rank != 0;
  /* Across ranks, an error of rank 0's own (writing metrics.jsonl) waits for
   * the next step's agreement, so that every rank stops together. */
  dlrec_status pending = DLREC_OK;
  /* Across ranks, the loop's stop (a signal) is agreed on at each step. */
  queued_step queued = {0};
  while ((r.sh || !stop_requested(&r)) && (!c->max_steps || r.prog.step + queued.on < c->max_steps)) {
    const dlrec_batch *b = NULL;
    double tw = dlrec_now();
    s = follow ? follow_next(&r, &b) : dlrec_loader_next(r.loader, &b);
    res->loader_wait += dlrec_now() - tw;
    uint32_t rows = s == DLREC_OK ? b->rows : 0, row_base = 0;
    if (r.sh) {
      int stop = 0;
      uint32_t part = rows;
      s = dist_step_agree(&r, pending != DLREC_OK ? pending : s, part, &rows, &row_base, &stop, NULL);
      if (stop) r.stop = 1;
      if (stop && s == DLREC_OK) break;
    }
    if (s == DLREC_END) {
      s = DLREC_OK;
      break;
    }
    if (s != DLREC_OK) break;
    /* The schedule's scale times the plateau's factor (1 without one). */
    const uint64_t step = r.prog.step + queued.on + 1;
    double loss = NAN, scale = dlrec_lr_scale(c, step) * r.prog.valid.plateau_scale;
    /* The last batch of an epoch (following: of a file) ends at its last row. */
    const int epoch_end = b->end.row >= (follow ? r.follow_rows : epoch_rows);
    const int validates = a->valid && ((c->eval_interval_steps && step % c->eval_interval_steps == 0) ||
                                       (c->eval_every_epoch && epoch_end));
    const queued_step cur = {1, step, rows, b->end};
    /* Queued: on a device it runs while the host readies the next batch,
     * and the step before it is taken once this one is on its way (so a
     * stop asked for after step k lands after step k + 1 there). */
    s = dlrec_step_queue(&r.step, b, rows, row_base, (float)scale, step);
    if (s != DLREC_OK && r.sh) {
      /* The other ranks may be waiting in this step's exchanges: the job
       * ends here; its last checkpoint stands. */
      DLREC_ERROR("rank %d: step %llu: %s", r.rank, (unsigned long long)step, dlrec_last_error());
      dlrec_comm_abort(a->comm, 1);
    }
    if (s != DLREC_OK) {
      state_ok = 0;
      break;
    }
    /* Once, so a user sees how the threads share a step (dlrec_net_ws_split). */
    if (!split_said) {
      const uint32_t ways = dlrec_net_ws_split(r.ws);
      const uint32_t t = dlrec_backend_threads(r.be);
      if (ways > 1)
        DLREC_INFO("training steps split %u ways, one per thread", ways);
      else
        DLREC_INFO("training steps run whole on %u thread%s (a split needs 32 rows a thread)", t, t == 1 ? "" : "s");
      split_said = 1;
    }
    queued_step prev = queued;
    queued = cur;
    if (prev.on && (s = step_taken(&r, &prev, res, bar, &rows_log, &state_ok, NULL)) != DLREC_OK) break;
    if (r.pub && (s = publisher_note(r.pub, b, dlrec_net_schema(r.model)->n_sparse)) != DLREC_OK) break;
    /* What reads the model, or logs, waits for the step: the rest does not. */
    const int logs = step % c->log_interval_steps == 0;
    const int publishes = r.pub && step % c->publish_interval_steps == 0;
    const int checkpoints = c->checkpoint_interval_steps && step % c->checkpoint_interval_steps == 0;
    if (dlrec_step_queues(&r.step) && !logs && !publishes && !checkpoints && !validates) continue;
    if ((s = step_taken(&r, &queued, res, bar, &rows_log, &state_ok, &loss)) != DLREC_OK) break;
    if (publishes) publisher_publish(r.pub, r.model, r.prog.step);
    if (logs) {
      double now = dlrec_now();
      res->last_loss = r.prog.loss_sum / (double)r.prog.loss_rows;
      dlrec_progress_note(bar, "loss %.4f", res->last_loss);
      if (r.rank == 0) s = log_json(&r, step_json(&r, res->last_loss, scale, rows_log / (now - t_log)));
      r.prog.loss_sum = 0;
      r.prog.loss_rows = rows_log = 0;
      t_log = now;
      if (s != DLREC_OK && r.sh) pending = s, s = DLREC_OK;
      if (s != DLREC_OK) break;
    }
    if (validates) {
      double te = dlrec_now();
      int stop = 0;
      s = validate(&r, res, scale, loss, epoch_end, bar, &stop);
      report_progress(&r, res, 1, 0);
      const double dt = dlrec_now() - te;
      eval_seconds += dt;
      t_log += dt; /* an interval's samples_per_s leaves its evaluations out */
      if (s != DLREC_OK || stop) break;
    }
    if (checkpoints && r.last_ckpt_step != r.prog.step && (s = dist_checkpoint(&r)) != DLREC_OK) break;
  }
  /* A step still queued when the loop ended (the data's end, max_steps, a
   * signal, an error of the data's) is trained: it counts, and is
   * checkpointed below. After a failed or diverged step it is only waited
   * for. */
  if (queued.on && state_ok) {
    dlrec_status ts = step_taken(&r, &queued, res, bar, &rows_log, &state_ok, NULL);
    if (s == DLREC_OK) s = ts;
  } else if (queued.on) {
    double ignored;
    (void)dlrec_step_loss(&r.step, &ignored);
  }
  /* Waiting for a followed directory's next file is neither training nor
   * loading. */
  double loop_seconds = dlrec_now() - t0 - eval_seconds - r.follow_idle;
  res->loader_wait -= r.follow_idle;
  res->idle_seconds = r.follow_idle;
  dlrec_progress_finish(bar);
  if (s == DLREC_OK && r.prog.loss_rows) res->last_loss = r.prog.loss_sum / (double)r.prog.loss_rows;
  res->interrupted = r.stop && s == DLREC_OK;
  /* Across ranks, an error rank 0 met logging reaches every rank. */
  if (r.sh && s == DLREC_OK) s = dist_agree(&r, pending);
  /* From here across ranks every rank takes part (the evaluation and the
   * checkpoint are collective) and rank 0 reports. */
  if (s == DLREC_OK && a->valid && !res->interrupted && r.has_last_valid && r.last_valid_step == r.prog.step) {
    /* The last step was validated (and logged) already. */
    res->has_valid = 1;
    res->valid = r.last_valid;
  } else if (s == DLREC_OK && a->valid && !res->interrupted) {
    dlrec_metrics train;
    int has_train = 0;
    s = evaluate_now(&r, &res->valid);
    if (s == DLREC_OK) s = evaluate_train(&r, &train, &has_train);
    if (s == DLREC_OK) {
      res->has_valid = 1;
      if (r.rank == 0) {
        cJSON *j = step_json(&r, res->last_loss, dlrec_lr_scale(c, r.prog.step) * r.prog.valid.plateau_scale, 0);
        cJSON_DeleteItemFromObject(j, "samples_per_s");
        cJSON_AddItemToObject(j, "valid", dlrec_metrics_to_json(&res->valid));
        if (has_train) cJSON_AddItemToObject(j, "train", dlrec_metrics_to_json(&train));
        cJSON_AddBoolToObject(j, "final", 1);
        s = log_json(&r, j);
      }
      s = dist_status(&r, s, NULL, 0);
    }
  }
  if (s == DLREC_OK && a->valid && !res->interrupted && c->restore_best && r.prog.valid.validations &&
      !isnan(r.prog.valid.best)) {
    /* RUN/best, loaded and scored in this process (its table mapped). */
    if (r.rank == 0) s = evaluate_best(&r, res);
    s = dist_status(&r, s, NULL, 0);
  }
  /* The last trained rows reach the Redis tier too. */
  if (r.pub && state_ok) publisher_publish(r.pub, r.model, r.prog.step);
  /* The final checkpoint: also after a signal or an error in the data or the
   * evaluation, so that the steps trained are not lost; never after a failed
   * or diverged step, whose parameters must not replace a good checkpoint. */
  if (state_ok) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    /* A checkpoint of this very state exists when the last step was both
     * validated and checkpointed (a best one, say): writing it again would
     * only replace RUN/best's directory under it. */
    int saved = r.last_ckpt_step == r.prog.step && r.has_last_valid && r.last_valid_step == r.prog.step;
    dlrec_status cs = (r.prog.step > start_step || !a->resume) && !saved ? dist_checkpoint(&r) : DLREC_OK;
    if (s == DLREC_OK) s = cs;
    else dlrec_error_restore(&e);
  }
  res->steps = r.prog.step;
  res->samples = r.prog.samples;
  res->steps_this_run = r.prog.step - start_step;
  res->seconds = loop_seconds;
  res->samples_per_s = loop_seconds > 0 ? (double)(r.prog.samples - start_samples) / loop_seconds : 0;
  res->loss_scale = r.opt.loss_scale;
  res->skipped_steps = r.opt.skipped_steps;
  if (r.ws) dlrec_net_ws_profile(r.ws, &res->profile);
  res->ranks = r.ranks;
  if (r.sh) {
    dlrec_sharded_get_stats(r.sh, &res->dist);
    res->dist.bytes_sent = r.step.stats.bytes_sent;
    res->dist.exchange_seconds = r.step.stats.exchange_seconds;
    res->dist.compute_seconds = r.step.stats.compute_seconds;
    res->dist.update_seconds = r.step.stats.update_seconds;
  }
  if (s == DLREC_OK) report_progress(&r, res, 1, 1);
  const int rank = r.rank;
  run_free(&r); /* closes metrics.jsonl, which the report reads */
  if (s == DLREC_OK && rank == 0) write_summary(a, res);
  return s;
}
