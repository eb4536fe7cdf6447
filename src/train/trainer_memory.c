/* A run's config (with the arguments that override it) and its memory:
 * the table, the dense parameters and the workspaces, against the device's
 * memory, for a run (check_memory, which also places the table on a GPU)
 * and for --plan (dlrec_train_print_plan), one process or a job of ranks. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/json.h"
#include "core/log.h"
#include "data/etl.h"
#include "train/trainer_run.h"

/* The most rows of a batch of `batch` rows that one of `ranks` ranks holds
 * (the loader's parts). */
uint32_t run_rows_per_rank(uint32_t batch, int ranks) {
  return (uint32_t)(((uint64_t)batch + (uint64_t)ranks - 1) / (uint64_t)ranks);
}

/* The run's config: a->config_json, a->config_path, or the defaults; then
 * the arguments that override it (--deterministic, --threads, --device,
 * --max-steps), for a run and for its plan alike. */
dlrec_status run_read_config(const dlrec_train_args *a, dlrec_train_config *cfg) {
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
uint32_t run_cores_share(long ranks) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus / ranks > 1 ? (uint32_t)(cpus / ranks) : 1;
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
  const dlrec_sparse_optim_kind kind = cfg->sparse.kind;
  *optim_bytes = kind == DLREC_SPARSE_ROWWISE_ADAGRAD                          ? 4
                 : kind == DLREC_SPARSE_LAZY_ADAM || kind == DLREC_SPARSE_ADAM ? 8 * stride + 4 /* m, v, steps */
                                                                               : 0;
  *dense_bytes = (uint64_t)(n_params + dlrec_optim_state_floats(&cfg->dense, n_params)) * sizeof(float);
}

/* The shard plan of net's table over `ranks` ranks with the config's sparse
 * optimizer, and the bytes of the dense parameters with their state. */
dlrec_status run_make_plan(const dlrec_train_config *cfg, dlrec_net *net, int ranks, dlrec_shard_plan *p,
                           uint64_t *dense_bytes) {
  uint32_t row_bytes, optim_bytes;
  row_and_dense_bytes(cfg, net, &row_bytes, &optim_bytes, dense_bytes);
  return dlrec_shard_plan_make(p, dlrec_net_schema(net), ranks, dlrec_table_dim(dlrec_net_table_const(net)), row_bytes,
                               optim_bytes, cfg->dist_rowwise_share);
}

/* The most rows a rank's part holds: ceil(batch / ranks), of a training or
 * a validation batch. */
uint32_t run_part_rows(const dlrec_train_config *cfg, int ranks) {
  return run_rows_per_rank(cfg->batch_size > cfg->eval_batch_size ? cfg->batch_size : cfg->eval_batch_size, ranks);
}

/* The model's activations and workspaces on every rank (dlrec_net_ws_bytes):
 * a step's part of the batch, split across the rank's threads where the
 * device is the CPU, and an evaluation's part beside it. threads: the
 * rank's, resolved. With 16-bit GEMMs (`precision`, resolved
 * (dlrec_precision_resolve), bf16 or fp16) the step also keeps the 16-bit
 * copies of its layers' inputs and weights from the forward for the
 * backward (dispatch.h's keep_operands): at most half the step's
 * activations and 2 bytes a dense parameter, each way. */
uint64_t run_ws_bytes(const dlrec_train_config *cfg, const dlrec_net *net, int ranks, uint32_t threads,
                      dlrec_precision precision) {
  const uint32_t ways = strcmp(cfg->device, "cpu") ? 1 : threads;
  const uint64_t step = dlrec_net_ws_bytes(net, run_rows_per_rank(cfg->batch_size, ranks), ways);
  const int half = precision == DLREC_PRECISION_BF16 || precision == DLREC_PRECISION_FP16;
  size_t n_params = 0;
  dlrec_net_dense_params_const(net, &n_params);
  const uint64_t kept = half ? step / 2 + (uint64_t)ways * n_params * 2 : 0;
  return step + kept + dlrec_net_ws_bytes(net, run_rows_per_rank(cfg->eval_batch_size, ranks), 1);
}

/* A rank's threads when the config leaves them to the machine: its share
 * of the cores (setup's rule, with every rank on this machine). */
static uint32_t plan_threads(const dlrec_train_config *cfg, int ranks) {
  return cfg->threads ? cfg->threads : run_cores_share(ranks);
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
dlrec_status run_check_memory(run *r) {
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
  dlrec_status s = run_read_config(a, &cfg);
  dlrec_etl *etl = NULL;
  if (s == DLREC_OK) s = dlrec_etl_load(&etl, a->etl_dir);
  if (s != DLREC_OK) return s;
  dlrec_schema schema = *dlrec_etl_schema(etl);
  dlrec_etl_free(etl);
  dlrec_net *net = NULL;
  dlrec_shard_plan p = {0};
  uint64_t dense = 0;
  s = dlrec_net_create_tableless(&net, &cfg.model, &schema);
  if (s == DLREC_OK) s = run_make_plan(&cfg, net, ranks, &p, &dense);
  if (s == DLREC_OK) {
    const uint64_t step = dlrec_shard_plan_step_bytes(&p, &schema, run_part_rows(&cfg, ranks));
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
