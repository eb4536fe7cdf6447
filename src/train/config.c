/* The training configuration: defaults, JSON reading with strict checks, and
 * the learning-rate schedule. */
#include "train/train_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"

void dlrec_train_config_device(const dlrec_train_config *c, char *buf, size_t size) {
  if (strcmp(c->device, "cuda")) snprintf(buf, size, "%s", c->device); /* cpu, cpu-mirror */
  else snprintf(buf, size, "%s:%u", c->device, c->device_index);
}

void dlrec_train_config_default(dlrec_train_config *c) {
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", DLREC_DEFAULT_MODEL_TYPE);
  dlrec_net_config_default(&c->model, DLREC_DEFAULT_MODEL_TYPE);
  dlrec_optim_config_default(&c->dense, DLREC_OPTIM_SGD);
  c->dense.lr = 0.1f;
  dlrec_sparse_optim_config_default(&c->sparse, DLREC_SPARSE_SGD);
  c->sparse.lr = 0.1f;
  c->decay_power = 2.0;
  c->batch_size = 128;
  c->epochs = 1;
  c->seed = 1;
  c->device = "cpu";
  c->eval_batch_size = 4096;
  c->eval_train_rows = 65536;
  c->checkpoint_keep = 2;
  c->checkpoint_journal_max_fraction = 0.25;
  c->storage_admit_min_count = 1;
  c->publish_interval_steps = 10;
  c->publish_timeout_ms = 200;
  c->dist_rowwise_share = 0.5;
  c->log_interval_steps = 1000;
  c->shuffle = 1;
  c->window_groups = 8;
  c->slice_rows = 32;
  c->prefetch = 4;
  c->plateau_factor = 1.0;
  c->loss_scale_growth_interval = 2000;
  c->hot_fraction = DLREC_HOT_FRACTION_AUTO;
}

/* Field readers that name the path ("cfg.json: training") in errors. */
typedef struct ctx {
  char what[256];
} ctx;

static ctx sub(const ctx *parent, const char *key) {
  ctx c;
  snprintf(c.what, sizeof c.what, "%.200s%s%.48s", parent->what, strchr(parent->what, ':') ? "." : ": ", key);
  return c;
}

static dlrec_status get_u32(const cJSON *o, const char *key, const ctx *x, uint64_t lo, uint64_t hi, uint32_t *out) {
  uint64_t v;
  dlrec_status s = dlrec_json_get_u64_or(o, key, x->what, *out, &v);
  if (s != DLREC_OK) return s;
  if (v < lo || v > hi)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %llu is out of range [%llu, %llu]", x->what, key,
                       (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
  *out = (uint32_t)v;
  return DLREC_OK;
}

static dlrec_status get_u64(const cJSON *o, const char *key, const ctx *x, uint64_t *out) {
  return dlrec_json_get_u64_or(o, key, x->what, *out, out);
}

static dlrec_status get_float(const cJSON *o, const char *key, const ctx *x, double lo, double hi, float *out) {
  double v;
  dlrec_status s = dlrec_json_get_double_or(o, key, x->what, *out, &v);
  if (s != DLREC_OK) return s;
  if (!(v >= lo && v <= hi))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %g is out of range [%g, %g]", x->what, key, v, lo, hi);
  *out = (float)v;
  return DLREC_OK;
}

static dlrec_status get_double(const cJSON *o, const char *key, const ctx *x, double lo, double hi, double *out) {
  float f = (float)*out;
  dlrec_status s = get_float(o, key, x, lo, hi, &f);
  if (s == DLREC_OK && cJSON_GetObjectItemCaseSensitive(o, key)) *out = cJSON_GetObjectItemCaseSensitive(o, key)->valuedouble;
  return s;
}

/* training.table_placement's names, in dlrec_table_placement's order. */
static const char *const placement_names[] = {"auto", "device", "host", NULL};
/* In dlrec_loss_scaling's order, FIXED (a number) excepted. */
static const char *const loss_scaling_names[] = {"auto", "dynamic", "none", NULL};



static dlrec_status get_choice(const cJSON *o, const char *key, const ctx *x, const char *const *names, int *out) {
  const char *v;
  dlrec_status s = dlrec_json_get_string_or(o, key, x->what, NULL, &v);
  if (s != DLREC_OK || !v) return s;
  for (int i = 0; names[i]; i++)
    if (!strcmp(v, names[i])) {
      *out = i;
      return DLREC_OK;
    }
  char list[256] = "";
  for (int i = 0; names[i]; i++) {
    strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, names[i], sizeof list - strlen(list) - 1);
  }
  return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': '%s' is not one of %s", x->what, key, v, list);
}

/* training.loss_scale: one of loss_scaling_names, or a power of two in [1, 2^24]. */
static dlrec_status get_loss_scale(const cJSON *o, const ctx *x, dlrec_train_config *c) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "loss_scale");
  if (!v) return DLREC_OK;
  if (cJSON_IsNumber(v)) {
    const double d = v->valuedouble;
    int e;
    if (!(d >= 1 && d <= DLREC_LOSS_SCALE_MAX) || frexp(d, &e) != 0.5)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'loss_scale': %g is not a power of two in [1, 2^24] (or "
                         "\"auto\", \"dynamic\", \"none\")", x->what, d);
    c->loss_scaling = DLREC_LOSS_SCALING_FIXED;
    c->loss_scale = (float)d;
    return DLREC_OK;
  }
  int mode = (int)DLREC_LOSS_SCALING_AUTO;
  dlrec_status s = get_choice(o, "loss_scale", x, loss_scaling_names, &mode);
  if (s != DLREC_OK) return s;
  c->loss_scaling = (dlrec_loss_scaling)mode;
  return DLREC_OK;
}

/* training.hot_fraction: a share in [0, 1], or "auto". */
static dlrec_status get_hot_fraction(const cJSON *o, const ctx *x, dlrec_train_config *c) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "hot_fraction");
  if (!v) return DLREC_OK;
  if (cJSON_IsString(v) && !strcmp(v->valuestring, "auto")) {
    c->hot_fraction = DLREC_HOT_FRACTION_AUTO;
    return DLREC_OK;
  }
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'hot_fraction': not a share in [0, 1] or \"auto\"", x->what);
  c->hot_fraction = (float)v->valuedouble;
  return DLREC_OK;
}

#define TRY(expr)                            \
  do {                                       \
    dlrec_status st_ = (expr);               \
    if (st_ != DLREC_OK) return st_;         \
  } while (0)

static const cJSON *section(const cJSON *j, const char *key) { return cJSON_GetObjectItemCaseSensitive(j, key); }

/* The model section belongs to the model type it names (model.h): the type
 * reads its own keys. */
static dlrec_status read_model(const cJSON *o, const ctx *x, dlrec_train_config *c) {
  return dlrec_net_config_parse(&c->model, o, x->what);
}

/* The hyperparameters the dense and sparse optimizers share, by name. */
typedef struct hyper {
  float *lr, *weight_decay, *beta1, *beta2, *eps, *initial_accumulator;
} hyper;

static dlrec_status read_hyper(const cJSON *o, const ctx *x, const hyper *h) {
  static const char *keys[] = {"type", "lr", "weight_decay", "beta1", "beta2", "eps", "initial_accumulator", NULL};
  TRY(dlrec_json_check_keys(o, x->what, keys));
  TRY(get_float(o, "lr", x, 0, 1e3, h->lr));
  TRY(get_float(o, "weight_decay", x, 0, 1e3, h->weight_decay));
  TRY(get_float(o, "beta1", x, 0, 0.999999, h->beta1));
  TRY(get_float(o, "beta2", x, 0, 0.9999999, h->beta2));
  TRY(get_float(o, "eps", x, 0, 1, h->eps));
  return get_float(o, "initial_accumulator", x, 0, 1e6, h->initial_accumulator);
}

/* A new kind brings its own defaults (keeping the lr), then the fields override. */
static dlrec_status read_dense_optim(const cJSON *o, const ctx *x, dlrec_optim_config *d) {
  static const char *types[] = {"sgd", "adam", "adagrad", NULL};
  int kind = (int)d->kind;
  TRY(get_choice(o, "type", x, types, &kind));
  if (kind != (int)d->kind) {
    float lr = d->lr;
    dlrec_optim_config_default(d, (dlrec_optim_kind)kind);
    d->lr = lr;
  }
  hyper h = {&d->lr, &d->weight_decay, &d->beta1, &d->beta2, &d->eps, &d->initial_accumulator};
  return read_hyper(o, x, &h);
}

static dlrec_status read_sparse_optim(const cJSON *o, const ctx *x, dlrec_sparse_optim_config *s) {
  static const char *types[] = {"sgd", "rowwise_adagrad", "lazy_adam", NULL};
  int kind = (int)s->kind;
  TRY(get_choice(o, "type", x, types, &kind));
  if (kind != (int)s->kind) {
    float lr = s->lr;
    dlrec_sparse_optim_config_default(s, (dlrec_sparse_optim_kind)kind);
    s->lr = lr;
  }
  hyper h = {&s->lr, &s->weight_decay, &s->beta1, &s->beta2, &s->eps, &s->initial_accumulator};
  return read_hyper(o, x, &h);
}

/* Early stopping, the plateau and the best checkpoint act on scheduled
 * validations only: without any, they would silently never act. */
static dlrec_status check_validation(const dlrec_train_config *c, const char *what) {
  const char *needs = c->early_stop_patience ? "training.early_stopping_patience"
                      : c->plateau_factor < 1 ? "schedule.plateau_factor"
                      : c->keep_best          ? "checkpoint.keep_best"
                                              : NULL;
  if (needs && !c->eval_every_epoch && !c->eval_interval_steps)
    return dlrec_error(DLREC_ERR_INVALID,
                       "%s: field '%s' acts on validations: set eval.every_epoch or eval.interval_steps", what, needs);
  if (c->restore_best && !c->keep_best)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'training.restore_best' needs checkpoint.keep_best", what);
  return DLREC_OK;
}

dlrec_status dlrec_train_config_from_json(const cJSON *j, const char *what, dlrec_train_config *c) {
  dlrec_train_config_default(c);
  ctx top;
  snprintf(top.what, sizeof top.what, "%s", what);
  static const char *keys[] = {"name", "model", "optimizer", "schedule", "training", "loader", "eval", "checkpoint",
                               "publish", "distributed",
                               "log", "storage", NULL};
  TRY(dlrec_json_check_keys(j, what, keys));
  const char *name;
  TRY(dlrec_json_get_string_or(j, "name", what, c->name, &name));
  if (!name[0] || strlen(name) >= sizeof c->name || strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != strlen(name))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'name': '%s' must be 1 to %zu letters, digits, '_', '-' or '.'",
                       what, name, sizeof c->name - 1);
  memmove(c->name, name, strlen(name) + 1);
  const cJSON *o;
  ctx x;
  if ((o = section(j, "model"))) {
    x = sub(&top, "model");
    TRY(read_model(o, &x, c));
  }
  if ((o = section(j, "optimizer"))) {
    x = sub(&top, "optimizer");
    static const char *okeys[] = {"dense", "sparse", "clip_grad_norm", NULL};
    TRY(dlrec_json_check_keys(o, x.what, okeys));
    TRY(get_float(o, "clip_grad_norm", &x, 0, 1e9, &c->clip_grad_norm));
    const cJSON *d = section(o, "dense"), *s = section(o, "sparse");
    ctx xd = sub(&x, "dense"), xs = sub(&x, "sparse");
    if (d) TRY(read_dense_optim(d, &xd, &c->dense));
    if (s) TRY(read_sparse_optim(s, &xs, &c->sparse));
  }
  if ((o = section(j, "schedule"))) {
    x = sub(&top, "schedule");
    static const char *k[] = {"warmup_steps",    "decay_start_step", "decay_steps",      "decay_power",
                              "min_lr_scale",    "plateau_factor",   "plateau_patience", "plateau_cooldown",
                              "plateau_min_delta", "plateau_min_scale", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(get_double(o, "plateau_factor", &x, 1e-9, 1, &c->plateau_factor));
    TRY(get_u32(o, "plateau_patience", &x, 0, 1000000, &c->plateau_patience));
    TRY(get_u32(o, "plateau_cooldown", &x, 0, 1000000, &c->plateau_cooldown));
    TRY(get_double(o, "plateau_min_delta", &x, 0, 1e6, &c->plateau_min_delta));
    TRY(get_double(o, "plateau_min_scale", &x, 0, 1, &c->plateau_min_scale));
    TRY(get_u64(o, "warmup_steps", &x, &c->warmup_steps));
    TRY(get_u64(o, "decay_start_step", &x, &c->decay_start_step));
    TRY(get_u64(o, "decay_steps", &x, &c->decay_steps));
    TRY(get_double(o, "decay_power", &x, 0, 100, &c->decay_power));
    TRY(get_double(o, "min_lr_scale", &x, 0, 1, &c->min_lr_scale));
  }
  if ((o = section(j, "training"))) {
    x = sub(&top, "training");
    static const char *k[] = {"batch_size", "epochs", "max_steps", "threads", "seed", "deterministic", "target_auc",
                              "early_stopping_patience", "early_stopping_min_delta", "restore_best", "table_dtype",
                              "precision", "device", "table_placement", "hot_fraction", "loss_scale",
                              "loss_scale_growth_interval", NULL};
    /* In dlrec_table_dtype's order. */
    static const char *dtypes[] = {"fp32", "bf16", "fp16", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    int dtype = (int)c->model.table_dtype;
    TRY(get_choice(o, "table_dtype", &x, dtypes, &dtype));
    c->model.table_dtype = (uint32_t)dtype;
    const char *precision;
    TRY(dlrec_json_get_string_or(o, "precision", x.what, NULL, &precision));
    if (precision && dlrec_precision_parse(precision, &c->precision) != DLREC_OK)
      return dlrec_error_context("%s: field 'precision': ", x.what);
    const char *device;
    TRY(dlrec_json_get_string_or(o, "device", x.what, NULL, &device));
    if (device && dlrec_device_parse(device, &c->device, &c->device_index) != DLREC_OK)
      return dlrec_error_context("%s: field 'device': ", x.what);
    int placement = (int)c->table_placement;
    TRY(get_choice(o, "table_placement", &x, placement_names, &placement));
    c->table_placement = (dlrec_table_placement)placement;
    TRY(get_hot_fraction(o, &x, c));
    TRY(get_loss_scale(o, &x, c));
    TRY(get_u32(o, "loss_scale_growth_interval", &x, 1, 1000000000, &c->loss_scale_growth_interval));
    TRY(get_u32(o, "early_stopping_patience", &x, 0, 1000000, &c->early_stop_patience));
    TRY(get_double(o, "early_stopping_min_delta", &x, 0, 1e6, &c->early_stop_min_delta));
    TRY(dlrec_json_get_bool_or(o, "restore_best", x.what, c->restore_best, &c->restore_best));
    TRY(get_u32(o, "batch_size", &x, 1, 1u << 20, &c->batch_size));
    TRY(get_u32(o, "epochs", &x, 1, 100000, &c->epochs));
    TRY(get_u64(o, "max_steps", &x, &c->max_steps));
    TRY(get_u32(o, "threads", &x, 0, 4096, &c->threads));
    TRY(get_u64(o, "seed", &x, &c->seed));
    TRY(dlrec_json_get_bool_or(o, "deterministic", x.what, c->deterministic, &c->deterministic));
    TRY(get_double(o, "target_auc", &x, 0, 1, &c->target_auc));
  }
  if ((o = section(j, "loader"))) {
    x = sub(&top, "loader");
    static const char *k[] = {"shuffle", "window_groups", "slice_rows", "prefetch", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(dlrec_json_get_bool_or(o, "shuffle", x.what, c->shuffle, &c->shuffle));
    TRY(get_u32(o, "window_groups", &x, 1, 1u << 20, &c->window_groups));
    TRY(get_u32(o, "slice_rows", &x, 1, 1u << 24, &c->slice_rows));
    TRY(get_u32(o, "prefetch", &x, 1, 64, &c->prefetch));
  }
  if ((o = section(j, "eval"))) {
    x = sub(&top, "eval");
    static const char *k[] = {"interval_steps", "batch_size", "max_rows", "train_rows", "every_epoch", "metric", NULL};
    static const char *metrics[] = {"auc", "logloss", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(dlrec_json_get_bool_or(o, "every_epoch", x.what, c->eval_every_epoch, &c->eval_every_epoch));
    TRY(get_choice(o, "metric", &x, metrics, &c->eval_metric));
    TRY(get_u64(o, "interval_steps", &x, &c->eval_interval_steps));
    TRY(get_u32(o, "batch_size", &x, 1, 1u << 20, &c->eval_batch_size));
    TRY(get_u64(o, "max_rows", &x, &c->eval_max_rows));
    TRY(get_u64(o, "train_rows", &x, &c->eval_train_rows));
  }
  if ((o = section(j, "checkpoint"))) {
    x = sub(&top, "checkpoint");
    static const char *k[] = {"interval_steps", "keep", "keep_best", "journal_max_fraction", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(get_double(o, "journal_max_fraction", &x, 0, 1, &c->checkpoint_journal_max_fraction));
    TRY(dlrec_json_get_bool_or(o, "keep_best", x.what, c->keep_best, &c->keep_best));
    TRY(get_u64(o, "interval_steps", &x, &c->checkpoint_interval_steps));
    TRY(get_u32(o, "keep", &x, 1, 1000, &c->checkpoint_keep));
  }
  if ((o = section(j, "log"))) {
    x = sub(&top, "log");
    static const char *k[] = {"interval_steps", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(get_u64(o, "interval_steps", &x, &c->log_interval_steps));
    if (c->log_interval_steps == 0) return dlrec_error(DLREC_ERR_INVALID, "%s: field 'interval_steps' must be >= 1", x.what);
  }
  if ((o = section(j, "storage"))) {
    x = sub(&top, "storage");
    static const char *k[] = {"kind",      "cache_rows", "path",       "admit_min_count", "admit_probability",
                              "evict",     "ttl_steps",  "init_range", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    const char *kind, *path;
    TRY(dlrec_json_get_string_or(o, "kind", x.what, dlrec_store_kind_name(c->storage), &kind));
    if (dlrec_store_kind_parse(kind, &c->storage) != DLREC_OK)
      return dlrec_error_context("%s: field 'kind': ", x.what);
    TRY(get_u64(o, "cache_rows", &x, &c->storage_cache_rows));
    TRY(get_u32(o, "admit_min_count", &x, 1, 65535, &c->storage_admit_min_count));
    TRY(get_double(o, "admit_probability", &x, 0, 1, &c->storage_admit_probability));
    static const char *const evicts[] = {"lru", "lfu", NULL};
    TRY(get_choice(o, "evict", &x, evicts, &c->storage_evict));
    TRY(get_u64(o, "ttl_steps", &x, &c->storage_ttl_steps));
    TRY(get_double(o, "init_range", &x, 0, 1e6, &c->storage_init_range));
    TRY(dlrec_json_get_string_or(o, "path", x.what, c->storage_path, &path));
    if (strlen(path) >= sizeof c->storage_path)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'path': longer than %zu bytes", x.what,
                         sizeof c->storage_path - 1);
    memmove(c->storage_path, path, strlen(path) + 1);
  }
  if ((o = section(j, "publish"))) {
    x = sub(&top, "publish");
    static const char *k[] = {"redis", "prefix", "interval_steps", "timeout_ms", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    const char *redis, *prefix;
    TRY(dlrec_json_get_string_or(o, "redis", x.what, c->publish_redis, &redis));
    TRY(dlrec_json_get_string_or(o, "prefix", x.what, c->publish_prefix, &prefix));
    if (strlen(redis) >= sizeof c->publish_redis || strlen(prefix) >= sizeof c->publish_prefix)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': too long", x.what,
                         strlen(redis) >= sizeof c->publish_redis ? "redis" : "prefix");
    memmove(c->publish_redis, redis, strlen(redis) + 1);
    memmove(c->publish_prefix, prefix, strlen(prefix) + 1);
    TRY(get_u64(o, "interval_steps", &x, &c->publish_interval_steps));
    TRY(get_u32(o, "timeout_ms", &x, 1, 60000, &c->publish_timeout_ms));
    if (c->publish_interval_steps < 1)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'interval_steps' must be >= 1", x.what);
  }
  if ((o = section(j, "distributed"))) {
    x = sub(&top, "distributed");
    static const char *k[] = {"rowwise_share", NULL};
    TRY(dlrec_json_check_keys(o, x.what, k));
    TRY(get_double(o, "rowwise_share", &x, 0, 1e9, &c->dist_rowwise_share));
  }
  if (c->storage == DLREC_STORE_HASH && (c->storage_cache_rows < 1 || c->storage_cache_rows >= UINT32_MAX))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'storage.cache_rows': a hash table needs its size in rows "
                       "(1 to 2^32 - 2)", what);
  if (c->storage == DLREC_STORE_TIERED && c->storage_cache_rows < 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'storage.cache_rows': a tiered table needs its cache's size "
                       "in rows (at least one batch's distinct rows)", what);
  return check_validation(c, what);
}

dlrec_status dlrec_train_config_read(const char *path, dlrec_train_config *c) {
  cJSON *j;
  TRY(dlrec_json_read(path, &j));
  dlrec_status s = dlrec_train_config_from_json(j, path, c);
  cJSON_Delete(j);
  return s;
}

cJSON *dlrec_train_config_to_json(const dlrec_train_config *c) {
  static const char *dense_types[] = {"sgd", "adam", "adagrad"};
  static const char *sparse_types[] = {"sgd", "rowwise_adagrad", "lazy_adam"};
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "name", c->name);
  cJSON *m = cJSON_AddObjectToObject(j, "model");
  dlrec_net_config_to_json(&c->model, m);
  cJSON *o = cJSON_AddObjectToObject(j, "optimizer");
  cJSON *d = cJSON_AddObjectToObject(o, "dense");
  cJSON_AddStringToObject(d, "type", dense_types[c->dense.kind]);
  cJSON_AddNumberToObject(d, "lr", c->dense.lr);
  cJSON_AddNumberToObject(d, "weight_decay", c->dense.weight_decay);
  cJSON_AddNumberToObject(d, "beta1", c->dense.beta1);
  cJSON_AddNumberToObject(d, "beta2", c->dense.beta2);
  cJSON_AddNumberToObject(d, "eps", c->dense.eps);
  cJSON_AddNumberToObject(d, "initial_accumulator", c->dense.initial_accumulator);
  cJSON *s = cJSON_AddObjectToObject(o, "sparse");
  cJSON_AddStringToObject(s, "type", sparse_types[c->sparse.kind]);
  cJSON_AddNumberToObject(s, "lr", c->sparse.lr);
  cJSON_AddNumberToObject(s, "weight_decay", c->sparse.weight_decay);
  cJSON_AddNumberToObject(s, "beta1", c->sparse.beta1);
  cJSON_AddNumberToObject(s, "beta2", c->sparse.beta2);
  cJSON_AddNumberToObject(s, "eps", c->sparse.eps);
  cJSON_AddNumberToObject(s, "initial_accumulator", c->sparse.initial_accumulator);
  cJSON_AddNumberToObject(o, "clip_grad_norm", c->clip_grad_norm);
  cJSON *sc = cJSON_AddObjectToObject(j, "schedule");
  cJSON_AddNumberToObject(sc, "warmup_steps", (double)c->warmup_steps);
  cJSON_AddNumberToObject(sc, "decay_start_step", (double)c->decay_start_step);
  cJSON_AddNumberToObject(sc, "decay_steps", (double)c->decay_steps);
  cJSON_AddNumberToObject(sc, "decay_power", c->decay_power);
  cJSON_AddNumberToObject(sc, "min_lr_scale", c->min_lr_scale);
  cJSON_AddNumberToObject(sc, "plateau_factor", c->plateau_factor);
  cJSON_AddNumberToObject(sc, "plateau_patience", c->plateau_patience);
  cJSON_AddNumberToObject(sc, "plateau_cooldown", c->plateau_cooldown);
  cJSON_AddNumberToObject(sc, "plateau_min_delta", c->plateau_min_delta);
  cJSON_AddNumberToObject(sc, "plateau_min_scale", c->plateau_min_scale);
  cJSON *t = cJSON_AddObjectToObject(j, "training");
  cJSON_AddNumberToObject(t, "batch_size", c->batch_size);
  cJSON_AddNumberToObject(t, "epochs", c->epochs);
  cJSON_AddNumberToObject(t, "max_steps", (double)c->max_steps);
  cJSON_AddNumberToObject(t, "threads", c->threads);
  cJSON_AddNumberToObject(t, "seed", (double)c->seed);
  cJSON_AddBoolToObject(t, "deterministic", c->deterministic);
  cJSON_AddNumberToObject(t, "target_auc", c->target_auc);
  cJSON_AddNumberToObject(t, "early_stopping_patience", c->early_stop_patience);
  cJSON_AddNumberToObject(t, "early_stopping_min_delta", c->early_stop_min_delta);
  cJSON_AddBoolToObject(t, "restore_best", c->restore_best);
  cJSON_AddStringToObject(t, "table_dtype", dlrec_table_dtype_name((dlrec_table_dtype)c->model.table_dtype));
  cJSON_AddStringToObject(t, "precision", dlrec_precision_name(c->precision));
  char device[32];
  dlrec_train_config_device(c, device, sizeof device);
  cJSON_AddStringToObject(t, "device", device);
  cJSON_AddStringToObject(t, "table_placement", placement_names[c->table_placement]);
  if (c->hot_fraction < 0) cJSON_AddStringToObject(t, "hot_fraction", "auto");
  else cJSON_AddNumberToObject(t, "hot_fraction", c->hot_fraction);
  if (c->loss_scaling == DLREC_LOSS_SCALING_FIXED) cJSON_AddNumberToObject(t, "loss_scale", c->loss_scale);
  else cJSON_AddStringToObject(t, "loss_scale", loss_scaling_names[c->loss_scaling]);
  cJSON_AddNumberToObject(t, "loss_scale_growth_interval", c->loss_scale_growth_interval);
  cJSON *l = cJSON_AddObjectToObject(j, "loader");
  cJSON_AddBoolToObject(l, "shuffle", c->shuffle);
  cJSON_AddNumberToObject(l, "window_groups", c->window_groups);
  cJSON_AddNumberToObject(l, "slice_rows", c->slice_rows);
  cJSON_AddNumberToObject(l, "prefetch", c->prefetch);
  cJSON *e = cJSON_AddObjectToObject(j, "eval");
  cJSON_AddNumberToObject(e, "interval_steps", (double)c->eval_interval_steps);
  cJSON_AddNumberToObject(e, "batch_size", c->eval_batch_size);
  cJSON_AddNumberToObject(e, "max_rows", (double)c->eval_max_rows);
  cJSON_AddNumberToObject(e, "train_rows", (double)c->eval_train_rows);
  cJSON_AddBoolToObject(e, "every_epoch", c->eval_every_epoch);
  cJSON_AddStringToObject(e, "metric", c->eval_metric == DLREC_VALID_LOGLOSS ? "logloss" : "auc");
  cJSON *k = cJSON_AddObjectToObject(j, "checkpoint");
  cJSON_AddNumberToObject(k, "interval_steps", (double)c->checkpoint_interval_steps);
  cJSON_AddNumberToObject(k, "keep", c->checkpoint_keep);
  cJSON_AddBoolToObject(k, "keep_best", c->keep_best);
  cJSON_AddNumberToObject(k, "journal_max_fraction", c->checkpoint_journal_max_fraction);
  cJSON *g = cJSON_AddObjectToObject(j, "log");
  cJSON_AddNumberToObject(g, "interval_steps", (double)c->log_interval_steps);
  cJSON *st = cJSON_AddObjectToObject(j, "storage");
  cJSON_AddStringToObject(st, "kind", dlrec_store_kind_name(c->storage));
  cJSON_AddNumberToObject(st, "cache_rows", (double)c->storage_cache_rows);
  cJSON_AddStringToObject(st, "path", c->storage_path);
  cJSON_AddNumberToObject(st, "admit_min_count", c->storage_admit_min_count);
  cJSON_AddNumberToObject(st, "admit_probability", c->storage_admit_probability);
  cJSON_AddStringToObject(st, "evict", c->storage_evict == DLREC_HASH_EVICT_LFU ? "lfu" : "lru");
  cJSON_AddNumberToObject(st, "ttl_steps", (double)c->storage_ttl_steps);
  cJSON_AddNumberToObject(st, "init_range", c->storage_init_range);
  cJSON *pb = cJSON_AddObjectToObject(j, "publish");
  cJSON_AddStringToObject(pb, "redis", c->publish_redis);
  cJSON_AddStringToObject(pb, "prefix", c->publish_prefix);
  cJSON_AddNumberToObject(pb, "interval_steps", (double)c->publish_interval_steps);
  cJSON_AddNumberToObject(pb, "timeout_ms", c->publish_timeout_ms);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(j, "distributed"), "rowwise_share", c->dist_rowwise_share);
  return j;
}

dlrec_store_config dlrec_train_config_store(const dlrec_train_config *c, uint32_t n_sparse, const char *path) {
  dlrec_store_config sc = {.kind = c->storage,
                           .path = path,
                           .cache_rows = c->storage_cache_rows,
                           .admit_min_count = c->storage_admit_min_count,
                           .admit_probability = (float)c->storage_admit_probability,
                           .evict = (dlrec_hash_evict)c->storage_evict,
                           .ttl_steps = c->storage_ttl_steps,
                           .init_range = (float)c->storage_init_range,
                           .seed = c->seed};
  /* DLRM's scale, sqrt(1 / rows), for a column holding an equal share. */
  if (sc.init_range == 0 && c->storage_cache_rows)
    sc.init_range = (float)sqrt((double)(n_sparse ? n_sparse : 1) / (double)c->storage_cache_rows);
  return sc;
}

double dlrec_lr_scale(const dlrec_train_config *c, uint64_t step) {
  if (c->warmup_steps && step <= c->warmup_steps) return (double)step / (double)c->warmup_steps;
  if (c->decay_steps && step > c->decay_start_step) {
    double t = (double)(step - c->decay_start_step) / (double)c->decay_steps;
    if (t >= 1) return c->min_lr_scale;
    double s = pow(1 - t, c->decay_power);
    return s > c->min_lr_scale ? s : c->min_lr_scale;
  }
  return 1.0;
}

float dlrec_hot_fraction_fit(uint64_t available, uint64_t rest, uint64_t fixed, uint64_t rows, uint64_t row_bytes) {
  const double room = 0.9 * ((double)available - (double)rest) - (double)fixed;
  if (!rows || !row_bytes || room <= 0) return 0.0f;
  const double f = room / ((double)rows * (double)row_bytes);
  return f >= 1.0 ? 1.0f : (float)f;
}

int dlrec_table_on_host(const char *device, dlrec_table_placement place, dlrec_store_kind kind, float hot_fraction,
                        uint64_t need, uint64_t rest, uint64_t fixed, uint64_t rows, uint64_t row_bytes, float *hot) {
  int host = place == DLREC_TABLE_PLACEMENT_HOST || kind != DLREC_STORE_RAM;
  float f = hot_fraction < 0 ? 0.0f : hot_fraction;
  if (!host && place == DLREC_TABLE_PLACEMENT_AUTO) {
    uint64_t total = 0, available = 0;
    if (dlrec_device_memory(device, &total, &available) == DLREC_OK) {
      host = need > available;
      if (host && hot_fraction < 0) f = dlrec_hot_fraction_fit(available, rest, fixed, rows, row_bytes);
    } else {
      dlrec_clear_error(); /* unknown: the device holds it */
    }
  }
  *hot = host ? f : 0.0f;
  return host;
}
