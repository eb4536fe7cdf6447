/* A training run made and freed: the config, backend, data, network,
 * workspace, optimizers and step set up; RUN's checkpoint resumed or the
 * parameters initialized; a checkpoint saved; the host's progress callback. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "data/etl.h"
#include "train/trainer_run.h"

/* Whether the host asked the run to stop (args.stop); sticky. */
int run_stop_requested(run *r) {
  if (!r->stop && r->a->stop && *r->a->stop) r->stop = 1;
  return r->stop;
}

/* Calls the host's on_progress (rank 0): always when force, else at most
 * five times a second. A nonzero answer is a stop request. */
void run_report_progress(run *r, const dlrec_train_result *res, int force, int done) {
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

void run_free(run *r) {
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

dlrec_status run_checkpoint_now(run *r) {
  double t0 = dlrec_now();
  const dlrec_store *store = dlrec_net_store(r->model);
  const uint64_t changed = dlrec_store_changes(store, NULL);
  /* Across ranks (rank 0 saves), the rows come from the shards. */
  const dlrec_row_source rows = r->sh ? run_shard_rows(r) : (dlrec_row_source){0};
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


/* What a job of ranks changes or refuses: its threads (ranks on one
 * machine share its cores: without a thread count, each takes its share,
 * mpirun saying how many ranks run here), how long an exchange may wait
 * for a stalled rank, and what trains in one process only. */
static dlrec_status ranks_setup(run *r, const char *what) {
  if (r->ranks < 2) return DLREC_OK;
  dlrec_comm_set_timeout(r->a->comm, r->cfg.dist_timeout_s);
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!r->cfg.threads) r->cfg.threads = run_cores_share(local && atol(local) > 0 ? atol(local) : r->ranks);
  if (r->a->follow_dir)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "--follow trains in one process only (this job has %d ranks)", r->ranks);
  if (r->cfg.storage != DLREC_STORE_RAM)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: storage.kind \"%s\" trains in one process only; across ranks "
                       "the table is sharded in RAM (storage.kind \"ram\")", what,
                       dlrec_store_kind_name(r->cfg.storage));
  if (r->cfg.publish_redis[0])
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: publish.redis publishes from one process only", what);
  return DLREC_OK;
}

/* Dense Adam and a table-wide L2 (dlrec_sparse_optim_sweeps) read and write
 * every row of the table every step: written for a table in one process's
 * RAM on the CPU, and refused elsewhere before anything is made. */
static dlrec_status sweep_setup(const run *r, const char *what) {
  const dlrec_sparse_optim_config *c = &r->cfg.sparse;
  if (!dlrec_sparse_optim_sweeps(c)) return DLREC_OK;
  const int adam = c->kind == DLREC_SPARSE_ADAM;
  const char *field = adam ? "type': \"adam\"" : "l2_scope': \"table\"";
  if (r->cfg.storage != DLREC_STORE_RAM)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: optimizer.sparse: field '%s with storage.kind \"%s\": dense Adam "
                       "and a table-scope L2 read every row every step; use lazy_adam and l2_scope \"touched\" for "
                       "tiered and hash tables", what, field, dlrec_store_kind_name(r->cfg.storage));
  if (strcmp(r->cfg.device, "cpu"))
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: optimizer.sparse: field '%s trains on the CPU only for now "
                       "(training.device \"%s\")", what, field, r->cfg.device);
  if (r->ranks > 1)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: optimizer.sparse: field '%s trains in one process only for now "
                       "(this job has %d ranks, whose shards are updated apart)", what, field, r->ranks);
  return DLREC_OK;
}

/* The run's device, threads and precision are its backend's, not the process's. */
static dlrec_status backend_setup(run *r, const char *what) {
  dlrec_backend_config bc = {r->cfg.threads, r->cfg.precision, r->cfg.device_index};
  char device[32];
  dlrec_train_config_device(&r->cfg, device, sizeof device);
  if (dlrec_backend_create(&r->be, r->cfg.device, &bc) != DLREC_OK)
    return dlrec_error_context("%s: training.device %s, training.threads %u, training.precision %s: ", what, device,
                               r->cfg.threads, dlrec_precision_name(r->cfg.precision));
  DLREC_INFO("compute backend %s", dlrec_backend_describe(r->be));
  /* The backend sizes each op's OpenMP team, but with dynamic adjustment on
   * (OMP_DYNAMIC=true in the environment) the runtime could hand a region
   * fewer threads than asked, which would change how reductions split and
   * so the bits; turning it off keeps deterministic runs deterministic. */
  if (r->cfg.deterministic) omp_set_dynamic(0);
  return DLREC_OK;
}

/* The ETL's schema into r->schema, and the loader over the training files
 * (following a directory: the options each file's loader is opened with). */
static dlrec_status data_setup(run *r) {
  const dlrec_train_args *a = r->a;
  dlrec_etl *etl;
  dlrec_status s = dlrec_etl_load(&etl, a->etl_dir);
  if (s != DLREC_OK) return s;
  const dlrec_schema schema = *dlrec_etl_schema(etl);
  r->etl_crc = dlrec_etl_state_crc(etl);
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
    return DLREC_OK;
  }
  if ((s = dlrec_loader_open(&r->loader, a->train, a->n_train, &lo)) != DLREC_OK) return s;
  if (!dlrec_schema_equal(dlrec_loader_schema(r->loader), &schema))
    return dlrec_error(DLREC_ERR_INVALID, "%s: encoded with another ETL state than %s (the schemas differ)",
                       a->train[0], a->etl_dir);
  if (!schema.has_label) return dlrec_error(DLREC_ERR_INVALID, "%s: has no labels to train on", a->train[0]);
  return DLREC_OK;
}

/* RUN made and locked, and the network with its table in the config's
 * storage (across ranks, a table of one row: each rank holds its shard),
 * its memory checked, on the run's backend, with its workspace. *sc: the
 * storage. */
static dlrec_status network_setup(run *r, const char *what, dlrec_store_config *sc, char *table_path, size_t size) {
  const dlrec_train_args *a = r->a;
  dlrec_status s;
  if (r->rank == 0 && (s = dlrec_mkdirs(a->run_dir)) != DLREC_OK) return s;
  /* One writer per run directory: two runs would overwrite each other's
   * checkpoints, `latest` and metrics.jsonl. The lock comes before anything
   * in RUN is touched, and the process's death releases it. */
  if (r->rank == 0 && (s = dlrec_lock_dir(a->run_dir, "another training run", &r->lock_fd)) != DLREC_OK) return s;
  /* The table's storage: a tiered table's file defaults to RUN/table.tiered,
   * created after the lock so that a second run cannot truncate it. */
  *sc = dlrec_train_config_store(&r->cfg, r->schema.n_sparse, r->cfg.storage_path);
  if (sc->kind == DLREC_STORE_TIERED && !sc->path[0]) {
    if ((s = dlrec_path_join(table_path, size, a->run_dir, "table.tiered")) != DLREC_OK) return s;
    sc->path = table_path;
  }
  s = r->ranks == 1 ? dlrec_net_create_stored(&r->model, &r->cfg.model, &r->schema, sc)
                    : dlrec_net_create_tableless(&r->model, &r->cfg.model, &r->schema);
  if (s != DLREC_OK) return s;
  if (sc->kind == DLREC_STORE_TIERED)
    DLREC_INFO("embedding table: tiered, %s, %llu of %llu rows in RAM", sc->path,
               (unsigned long long)sc->cache_rows, (unsigned long long)r->schema.table_rows);
  if (sc->kind == DLREC_STORE_HASH)
    DLREC_INFO("embedding table: a hash table of %llu rows for raw keys (admitted at sighting %u%s, %s eviction)",
               (unsigned long long)sc->cache_rows, sc->admit_min_count,
               sc->admit_probability > 0 ? ", or by probability" : "",
               sc->evict == DLREC_HASH_EVICT_LFU ? "LFU" : "LRU");
  if (r->ranks > 1 && dlrec_net_has_batchnorm(r->model) && r->cfg.batch_size < (uint32_t)r->ranks)
    return dlrec_error(DLREC_ERR_INVALID, "%s: training.batch_size %u, fewer rows than the %d ranks: batch "
                       "normalization across ranks needs a row on every rank", what, r->cfg.batch_size, r->ranks);
  /* Before the big allocations (a GPU's copies among them); across ranks
   * dist_start prints the plan. */
  if (r->ranks == 1 && (s = run_check_memory(r)) != DLREC_OK) return s;
  if ((s = dlrec_net_set_backend(r->model, r->be)) != DLREC_OK) return s;
  /* Across ranks, a step's pass holds a part of the batch. */
  return dlrec_net_ws_create(&r->ws, r->model, run_rows_per_rank(r->cfg.batch_size, r->ranks));
}

/* The optimizers (across ranks, the sparse one is the shard's) and the
 * step over them; whether rows can be published (the publisher is made
 * with the run's id, in run_start); the journal of a tiered or hash
 * table, which records the rows each step changes so that checkpoints can
 * journal them instead of copying the whole table. */
static dlrec_status optim_setup(run *r, const dlrec_store_config *sc) {
  size_t n_params;
  dlrec_net_dense_params(r->model, &n_params);
  r->opt.dense = r->cfg.dense;
  size_t state = dlrec_optim_state_floats(&r->opt.dense, n_params);
  if (state && !(r->opt.dense_state = malloc(state * sizeof(float))))
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the dense optimizer state");
  dlrec_status s = dlrec_optim_state_init(&r->opt.dense, r->opt.dense_state, n_params);
  if (s != DLREC_OK) return s;
  r->opt.sparse_lr = r->cfg.sparse.lr;
  if (r->ranks == 1 &&
      (s = dlrec_store_optim_create(dlrec_net_store(r->model), &r->cfg.sparse, &r->opt.sparse)) != DLREC_OK)
    return s;
  r->opt.clip_grad_norm = r->cfg.clip_grad_norm;
  if ((s = loss_scaling_setup(r)) != DLREC_OK) return s;
  r->step = (dlrec_step){.net = r->model, .ws = r->ws, .opt = &r->opt, .comm = r->ranks > 1 ? r->a->comm : NULL};
  if (r->cfg.publish_redis[0] && !dlrec_backend_host_memory(r->be))
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: publish.redis publishes from a table in host memory: train on "
                       "the CPU to publish rows", dlrec_backend_describe(r->be));
  r->journal.max_fraction = r->cfg.checkpoint_journal_max_fraction;
  if ((sc->kind == DLREC_STORE_TIERED || sc->kind == DLREC_STORE_HASH) && r->journal.max_fraction > 0)
    return dlrec_store_track_changes(dlrec_net_store(r->model));
  return DLREC_OK;
}

dlrec_status run_setup(run *r) {
  const dlrec_train_args *a = r->a;
  dlrec_status s = run_read_config(a, &r->cfg);
  const char *what = a->config_path ? a->config_path : "the config";
  if (s == DLREC_OK) s = ranks_setup(r, what);
  if (s == DLREC_OK) s = sweep_setup(r, what);
  if (s == DLREC_OK) s = backend_setup(r, what);
  if (s == DLREC_OK) s = data_setup(r);
  const dlrec_train_config *c = &r->cfg;
  if (s == DLREC_OK && !a->valid && (c->early_stop_patience || c->plateau_factor < 1 || c->keep_best))
    return dlrec_error(DLREC_ERR_INVALID, "%s: early stopping, the lr plateau and checkpoint.keep_best need --valid",
                       what);
  dlrec_store_config sc;
  char table_path[1024];
  if (s == DLREC_OK) s = network_setup(r, what, &sc, table_path, sizeof table_path);
  if (s == DLREC_OK) s = optim_setup(r, &sc);
  if (s == DLREC_OK) s = dlrec_path_join(r->metrics_path, sizeof r->metrics_path, a->run_dir, "metrics.jsonl");
  if (s != DLREC_OK) return s;
  r->prog.valid_auc = NAN;
  dlrec_valid_state_init(&r->prog.valid);
  /* Across ranks, the start waits for the shards (dist_start). */
  return r->ranks > 1 ? DLREC_OK : run_start(r, NULL);
}

/* Resumes RUN's latest checkpoint, its rows into `rows` when not NULL
 * (across ranks: the shards), or initializes the parameters (across ranks:
 * the dense ones); then opens metrics.jsonl and, with publish.redis, the
 * publisher, under the run's id (the checkpoint's, else a new one). */
dlrec_status run_start(run *r, const dlrec_row_source *rows) {
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
        (s = run_follow_open(r, r->prog.follow_file)) == DLREC_OK)
      s = dlrec_loader_seek(r->loader, r->prog.position);
    else if (s == DLREC_OK && !a->follow_dir)
      s = dlrec_loader_seek(r->loader, r->prog.position);
    if (s == DLREC_OK) s = run_truncate_metrics(r->metrics_path, r->prog.step);
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
  if (!r->cfg.publish_redis[0]) return DLREC_OK;
  if (!r->prog.run_id) r->prog.run_id = publisher_new_run_id();
  return publisher_create(&r->pub, &r->cfg, r->model, &(dlrec_redis_run){r->prog.run_id, r->etl_crc});
}
