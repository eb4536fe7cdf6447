/* The training config's options (docs/config.md): one row each, read by
 * dlrec_train_config_from_json, written by dlrec_train_config_to_json, set
 * by dlrec_train_config_default and printed by `dlrec options config` as the
 * reference table of docs/config.md (which test_train_config compares).
 * The row order is the one config.json is written in. The model section
 * belongs to the model type it names: its row hands the object to it. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "train/train_config.h"
#include "core/json.h"

#define SIZE(f) sizeof(((dlrec_train_config *)0)->f)
#define ROW(sec, k, t, f) .section = sec, .key = k, .type = t, .offset = offsetof(dlrec_train_config, f), \
                          .offset2 = DLREC_OPT_NO_FIELD, .size = SIZE(f)
#define U32(sec, k, f, lo, hi, d, text) {ROW(sec, k, DLREC_OPT_UINT, f), .min = lo, .max = hi, .dflt = d, .doc = text}
#define U64(sec, k, f, lo, d, text) {ROW(sec, k, DLREC_OPT_UINT, f), .min = lo, .max = UINT64_MAX, .dflt = d, .doc = text}
#define FLT(sec, k, f, l, h, d, text) {ROW(sec, k, DLREC_OPT_FLOAT, f), .lo = l, .hi = h, .dflt = d, .doc = text}
#define DBL(sec, k, f, l, h, d, text) {ROW(sec, k, DLREC_OPT_DOUBLE, f), .lo = l, .hi = h, .dflt = d, .doc = text}
#define BOOL(sec, k, f, d, text) {ROW(sec, k, DLREC_OPT_BOOL, f), .dflt = d, .doc = text}
#define CHOICE(sec, k, f, c, d, text) {ROW(sec, k, DLREC_OPT_CHOICE, f), .choices = c, .dflt = d, .doc = text}
#define STR(sec, k, f, d, text) {ROW(sec, k, DLREC_OPT_STRING, f), .dflt = d, .doc = text}
#define CUSTOM(sec, k, f, c, d, text) {ROW(sec, k, DLREC_OPT_CUSTOM, f), .custom = &c, .dflt = d, .doc = text}

/* ---- the options read by their own functions ---- */

/* A custom option's default, read as the JSON string it would be. */
static dlrec_status from_text(const dlrec_option *o, const char *text, const char *what, void *obj) {
  cJSON *v = cJSON_CreateString(text);
  dlrec_status st = v ? o->custom->from_json(o, v, what, obj) : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  cJSON_Delete(v);
  return st;
}

static dlrec_status need_string(const dlrec_option *o, const cJSON *v, const char *what) {
  return cJSON_IsString(v) ? DLREC_OK : dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': expected a string", what, o->key);
}

static dlrec_status name_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_train_config *c = obj;
  dlrec_status st = need_string(o, v, what);
  if (st != DLREC_OK) return st;
  const char *name = v->valuestring;
  if (!name[0] || strlen(name) >= sizeof c->name ||
      strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != strlen(name))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'name': '%s' must be 1 to %zu letters, digits, '_', '-' or '.'",
                       what, name, sizeof c->name - 1);
  memmove(c->name, name, strlen(name) + 1);
  return DLREC_OK;
}

static cJSON *name_out(const dlrec_option *o, const void *obj) {
  (void)o;
  return cJSON_CreateString(((const dlrec_train_config *)obj)->name);
}

static const dlrec_opt_custom name_opt = {"string of letters, digits, `_-.`", name_json, from_text, name_out};

/* The model type reads its own section (model.h). */
static dlrec_status model_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  char where[320];
  snprintf(where, sizeof where, "%.300s: %s", what, o->key);
  return dlrec_net_config_parse(&((dlrec_train_config *)obj)->model, v, where);
}

static cJSON *model_out(const dlrec_option *o, const void *obj) {
  (void)o;
  cJSON *m = cJSON_CreateObject();
  if (m) dlrec_net_config_to_json(&((const dlrec_train_config *)obj)->model, m);
  return m;
}

static const dlrec_opt_custom model_opt = {"object", model_json, from_text, model_out};

/* An optimizer's type: a new one brings its own defaults (keeping the lr),
 * which the section's other keys then override. */
static const char *const dense_types[] = {"sgd", "adam", "adagrad", NULL};
static const char *const sparse_types[] = {"sgd", "rowwise_adagrad", "lazy_adam", "adam", NULL};

static dlrec_status type_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_train_config *c = obj;
  const int dense = o->offset == offsetof(dlrec_train_config, dense.kind);
  const char *const *types = dense ? dense_types : sparse_types;
  dlrec_status st = need_string(o, v, what);
  int kind = -1;
  for (int i = 0; st == DLREC_OK && types[i]; i++)
    if (!strcmp(v->valuestring, types[i])) kind = i;
  if (st == DLREC_OK && kind < 0) {
    char list[96] = "";
    for (int i = 0; types[i]; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", types[i]);
    st = dlrec_error(DLREC_ERR_INVALID, "%s: field 'type': '%s' is not one of %s", what, v->valuestring, list);
  }
  if (st != DLREC_OK || kind == (dense ? (int)c->dense.kind : (int)c->sparse.kind)) return st;
  if (dense) {
    const float lr = c->dense.lr;
    dlrec_optim_config_default(&c->dense, (dlrec_optim_kind)kind);
    c->dense.lr = lr;
  } else {
    const float lr = c->sparse.lr;
    const dlrec_sparse_l2_scope scope = c->sparse.l2_scope; /* not the type's: read before or after it */
    dlrec_sparse_optim_config_default(&c->sparse, (dlrec_sparse_optim_kind)kind);
    c->sparse.lr = lr;
    c->sparse.l2_scope = scope;
  }
  return DLREC_OK;
}

static cJSON *type_out(const dlrec_option *o, const void *obj) {
  const dlrec_train_config *c = obj;
  return o->offset == offsetof(dlrec_train_config, dense.kind) ? cJSON_CreateString(dense_types[c->dense.kind])
                                                                : cJSON_CreateString(sparse_types[c->sparse.kind]);
}

static const dlrec_opt_custom dense_type_opt = {"`\"sgd\"`, `\"adam\"` or `\"adagrad\"`", type_json, from_text,
                                                type_out};
static const dlrec_opt_custom sparse_type_opt = {"`\"sgd\"`, `\"rowwise_adagrad\"`, `\"lazy_adam\"` or `\"adam\"`",
                                                 type_json, from_text, type_out};

static dlrec_status precision_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_status st = need_string(o, v, what);
  if (st == DLREC_OK && dlrec_precision_parse(v->valuestring, &((dlrec_train_config *)obj)->precision) != DLREC_OK)
    st = dlrec_error_context("%s: field 'precision': ", what);
  return st;
}

static cJSON *precision_out(const dlrec_option *o, const void *obj) {
  (void)o;
  return cJSON_CreateString(dlrec_precision_name(((const dlrec_train_config *)obj)->precision));
}

static const dlrec_opt_custom precision_opt = {"`\"fp32\"`, `\"bf16\"`, `\"auto\"`, `\"tf32\"` or `\"fp16\"`",
                                               precision_json, from_text, precision_out};

static dlrec_status device_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_train_config *c = obj;
  dlrec_status st = need_string(o, v, what);
  if (st == DLREC_OK && dlrec_device_parse(v->valuestring, &c->device, &c->device_index) != DLREC_OK)
    st = dlrec_error_context("%s: field 'device': ", what);
  return st;
}

static cJSON *device_out(const dlrec_option *o, const void *obj) {
  (void)o;
  char device[32];
  dlrec_train_config_device(obj, device, sizeof device);
  return cJSON_CreateString(device);
}

static const dlrec_opt_custom device_opt = {"`\"cpu\"`, `\"cuda\"` or `\"cuda:N\"`", device_json, from_text,
                                            device_out};

/* training.hot_fraction: a share in [0, 1], or "auto". */
static dlrec_status hot_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_train_config *c = obj;
  (void)o;
  if (cJSON_IsString(v) && !strcmp(v->valuestring, "auto")) {
    c->hot_fraction = DLREC_HOT_FRACTION_AUTO;
    return DLREC_OK;
  }
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 1))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'hot_fraction': not a share in [0, 1] or \"auto\"", what);
  c->hot_fraction = (float)v->valuedouble;
  return DLREC_OK;
}

static cJSON *hot_out(const dlrec_option *o, const void *obj) {
  (void)o;
  const float f = ((const dlrec_train_config *)obj)->hot_fraction;
  return f < 0 ? cJSON_CreateString("auto") : cJSON_CreateNumber(f);
}

static const dlrec_opt_custom hot_opt = {"`\"auto\"` or a number in [0, 1]", hot_json, from_text, hot_out};

/* In dlrec_loss_scaling's order, FIXED (a number) excepted. */
static const char *const loss_scaling_names[] = {"auto", "dynamic", "none", NULL};

/* training.loss_scale: one of loss_scaling_names, or a power of two in [1, 2^24]. */
static dlrec_status loss_scale_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_train_config *c = obj;
  if (cJSON_IsNumber(v)) {
    const double d = v->valuedouble;
    int e;
    if (!(d >= 1 && d <= DLREC_LOSS_SCALE_MAX) || frexp(d, &e) != 0.5)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'loss_scale': %g is not a power of two in [1, 2^24] (or "
                         "\"auto\", \"dynamic\", \"none\")", what, d);
    c->loss_scaling = DLREC_LOSS_SCALING_FIXED;
    c->loss_scale = (float)d;
    return DLREC_OK;
  }
  dlrec_status st = need_string(o, v, what);
  for (int i = 0; st == DLREC_OK && loss_scaling_names[i]; i++)
    if (!strcmp(v->valuestring, loss_scaling_names[i])) {
      c->loss_scaling = (dlrec_loss_scaling)i;
      return DLREC_OK;
    }
  if (st != DLREC_OK) return st;
  return dlrec_error(DLREC_ERR_INVALID, "%s: field 'loss_scale': '%s' is not one of auto, dynamic, none", what,
                     v->valuestring);
}

static cJSON *loss_scale_out(const dlrec_option *o, const void *obj) {
  (void)o;
  const dlrec_train_config *c = obj;
  if (c->loss_scaling == DLREC_LOSS_SCALING_FIXED) return cJSON_CreateNumber(c->loss_scale);
  return cJSON_CreateString(loss_scaling_names[c->loss_scaling]);
}

static const dlrec_opt_custom loss_scale_opt = {"`\"auto\"`, `\"dynamic\"`, `\"none\"` or a power of two in [1, 2^24]",
                                                loss_scale_json, from_text, loss_scale_out};

static dlrec_status store_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj) {
  dlrec_status st = need_string(o, v, what);
  if (st == DLREC_OK && dlrec_store_kind_parse(v->valuestring, &((dlrec_train_config *)obj)->storage) != DLREC_OK)
    st = dlrec_error_context("%s: field 'kind': ", what);
  return st;
}

static cJSON *store_out(const dlrec_option *o, const void *obj) {
  (void)o;
  return cJSON_CreateString(dlrec_store_kind_name(((const dlrec_train_config *)obj)->storage));
}

static const dlrec_opt_custom store_opt = {"`\"ram\"`, `\"tiered\"` or `\"hash\"`", store_json, from_text, store_out};

/* ---- the choices ---- */

/* In dlrec_table_dtype's order. */
static const dlrec_opt_choice dtypes[] = {{"fp32", 0, 0}, {"bf16", 1, 0}, {"fp16", 2, 0}, {NULL, 0, 0}};
static const dlrec_opt_choice placements[] = {{"auto", DLREC_TABLE_PLACEMENT_AUTO, 0},
                                              {"device", DLREC_TABLE_PLACEMENT_DEVICE, 0},
                                              {"host", DLREC_TABLE_PLACEMENT_HOST, 0},
                                              {NULL, 0, 0}};
static const dlrec_opt_choice metrics[] = {{"auc", DLREC_VALID_AUC, 0}, {"logloss", DLREC_VALID_LOGLOSS, 0}, {NULL, 0, 0}};
static const dlrec_opt_choice l2_scopes[] = {{"touched", DLREC_SPARSE_L2_TOUCHED, 0},
                                              {"table", DLREC_SPARSE_L2_TABLE, 0},
                                              {NULL, 0, 0}};
static const dlrec_opt_choice evicts[] = {{"lru", DLREC_HASH_EVICT_LRU, 0}, {"lfu", DLREC_HASH_EVICT_LFU, 0}, {NULL, 0, 0}};

/* ---- the table ---- */

#define HYPER(sec, s, decay_doc)                                                                                      \
  {ROW(sec, "weight_decay", DLREC_OPT_FLOAT, s.weight_decay), .lo = 0, .hi = 1e3, .dflt_doc = "`0`", .doc = decay_doc}, \
  {ROW(sec, "beta1", DLREC_OPT_FLOAT, s.beta1), .lo = 0, .hi = 0.999999, .dflt_doc = "`0.9`",                         \
   .doc = "Adam's first moment decay"},                                                                               \
  {ROW(sec, "beta2", DLREC_OPT_FLOAT, s.beta2), .lo = 0, .hi = 0.9999999, .dflt_doc = "`0.999`",                      \
   .doc = "Adam's second moment decay"},                                                                              \
  {ROW(sec, "eps", DLREC_OPT_FLOAT, s.eps), .lo = 0, .hi = 1, .dflt_doc = "`1e-8`; `1e-10` for Adagrad",              \
   .doc = "added to the denominator (Adam, Adagrad)"},                                                                \
  {ROW(sec, "initial_accumulator", DLREC_OPT_FLOAT, s.initial_accumulator), .lo = 0, .hi = 1e6, .dflt_doc = "`0`",    \
   .doc = "Adagrad's accumulators at the start"}

const dlrec_option dlrec_train_config_options[] = {
    CUSTOM("", "name", name, name_opt, DLREC_DEFAULT_MODEL_TYPE,
           "the model's name; the server serves it under this name"),
    {ROW("", "model", DLREC_OPT_CUSTOM, model), .custom = &model_opt, .dflt_doc = "`{\"type\": \"dlrm\"}`",
     .doc = "the model type (`model.type`) and that type's own keys, which it reads (the model keys below)"},
    CUSTOM("optimizer.dense", "type", dense.kind, dense_type_opt, "sgd",
           "the dense parameters' optimizer (PyTorch's definitions); a type brings its own defaults of the keys below"),
    FLT("optimizer.dense", "lr", dense.lr, 0, 1e3, "0.1", "base learning rate"),
    HYPER("optimizer.dense", dense, "L2 regularization of the dense parameters, every step: `g += weight_decay · w`"),
    CUSTOM("optimizer.sparse", "type", sparse.kind, sparse_type_opt, "sgd",
           "the embeddings' optimizer: `sgd`, `rowwise_adagrad` (one accumulator per row) and `lazy_adam` update "
           "the rows a batch touches only; `adam` is torch.optim.Adam over the whole table, every row every step "
           "(RAM tables on the CPU); below"),
    FLT("optimizer.sparse", "lr", sparse.lr, 0, 1e3, "0.1", "base learning rate"),
    HYPER("optimizer.sparse", sparse,
          "L2 regularization of the embeddings: `g += weight_decay · w` on the rows `l2_scope` says"),
    /* Written only when not the default, so that the config.json of a run
     * that never set it stays as it was before the option existed. */
    {ROW("optimizer.sparse", "l2_scope", DLREC_OPT_CHOICE, sparse.l2_scope), .choices = l2_scopes, .dflt = "touched",
     .omit_default = 1,
     .doc = "the rows `weight_decay` reaches: `touched` (the batch's rows) or `table` (every row every step: "
            "FuxiCTR's `embedding_regularizer`; RAM tables on the CPU); below"},
    FLT("optimizer", "clip_grad_norm", clip_grad_norm, 0, 1e9, "0",
        "clip the global gradient norm to this (0: off); below"),
    U64("schedule", "warmup_steps", warmup_steps, 0, "0", "learning rates rise linearly over these steps"),
    U64("schedule", "decay_start_step", decay_start_step, 0, "0", "the step after which the decay starts"),
    U64("schedule", "decay_steps", decay_steps, 0, "0",
        "polynomial decay `(1 - t)^decay_power` to `min_lr_scale` over this many steps (0: none)"),
    DBL("schedule", "decay_power", decay_power, 0, 100, "2", "the decay's power"),
    DBL("schedule", "min_lr_scale", min_lr_scale, 0, 1, "0", "the decay's floor"),
    DBL("schedule", "plateau_factor", plateau_factor, 1e-9, 1, "1",
        "on a validation plateau, multiply both learning rates by this (1: off); below"),
    U32("schedule", "plateau_patience", plateau_patience, 0, 1000000, "0", "bad validations tolerated before a cut"),
    U32("schedule", "plateau_cooldown", plateau_cooldown, 0, 1000000, "0", "validations ignored after a cut"),
    DBL("schedule", "plateau_min_delta", plateau_min_delta, 0, 1e6, "0", "the improvement that counts"),
    DBL("schedule", "plateau_min_scale", plateau_min_scale, 0, 1, "0", "the lowest plateau factor"),
    U32("training", "batch_size", batch_size, 1, 1u << 20, "128", "rows per step"),
    U32("training", "epochs", epochs, 1, 100000, "1", "passes over the training files"),
    U64("training", "max_steps", max_steps, 0, "0", "stop after this many steps in all (0: no limit); `--max-steps` overrides"),
    U32("training", "threads", threads, 0, 4096, "0", "compute threads (0: all cores); `--threads` overrides"),
    U64("training", "seed", seed, 0, "1", "initialization and data order"),
    BOOL("training", "deterministic", deterministic, "false",
         "bitwise reproducible runs: the same config and thread count give the same parameters, also across "
         "`--resume`; `--deterministic` forces it"),
    DBL("training", "target_auc", target_auc, 0, 1, "0", "stop once the validation AUC reaches it (0: off)"),
    U32("training", "early_stopping_patience", early_stop_patience, 0, 1000000, "0",
        "stop after this many validations in a row without improvement (0: off); below"),
    DBL("training", "early_stopping_min_delta", early_stop_min_delta, 0, 1e6, "0", "an improvement must exceed this"),
    BOOL("training", "restore_best", restore_best, "false",
         "the end-of-run report (stdout and `metrics.jsonl`) evaluates `RUN/best` instead of the last parameters; "
         "needs `checkpoint.keep_best`"),
    CHOICE("training", "table_dtype", model.table_dtype, dtypes, "fp32", "how the embedding table stores its rows; below"),
    CUSTOM("training", "precision", precision, precision_opt, "fp32",
           "the dense layers' GEMMs: `tf32` is a GPU's TF32 tensor cores (fp32 on the CPU), `fp16` IEEE half "
           "operands (emulated on the CPU); below"),
    CUSTOM("training", "device", device, device_opt, "cpu",
           "where the run computes (GPU 0, or GPU N); `--device` overrides it; GPUs, below"),
    CHOICE("training", "table_placement", table_placement, placements, "auto",
           "where the embedding table lives when the run is on a GPU; GPUs, below"),
    CUSTOM("training", "hot_fraction", hot_fraction, hot_opt, "auto",
           "with the table in host memory on a GPU, the share of each column's rows (its most frequent) that also "
           "live in the GPU's memory; GPUs, below"),
    CUSTOM("training", "loss_scale", loss_scaling, loss_scale_opt, "auto",
           "loss scaling: `auto` is dynamic in fp16 and none otherwise; below"),
    U32("training", "loss_scale_growth_interval", loss_scale_growth_interval, 1, 1000000000, "2000",
        "a dynamic scale doubles after this many steps in a row without overflow"),
    BOOL("loader", "shuffle", shuffle, "true", "shuffle row groups and slices of rows each epoch"),
    U32("loader", "window_groups", window_groups, 1, 1u << 20, "8", "row groups mixed together"),
    U32("loader", "slice_rows", slice_rows, 1, 1u << 24, "32", "consecutive rows kept together (1: a full row shuffle, slower)"),
    U32("loader", "prefetch", prefetch, 1, 64, "4", "batches assembled ahead"),
    U64("eval", "interval_steps", eval_interval_steps, 0, "0", "evaluate on `--valid` every N steps (0: at the end only)"),
    U32("eval", "batch_size", eval_batch_size, 1, 1u << 20, "4096", "rows per evaluation batch"),
    U64("eval", "max_rows", eval_max_rows, 0, "0", "evaluate on at most this many rows (0: all)"),
    U64("eval", "train_rows", eval_train_rows, 0, "65536",
        "at each evaluation, also score the first N rows of the first `--train` file: the line's `train` metrics, the "
        "report's training AUC and loss (0: off; not with `--follow`)"),
    BOOL("eval", "every_epoch", eval_every_epoch, "false", "also evaluate on `--valid` after every epoch"),
    CHOICE("eval", "metric", eval_metric, metrics, "auc",
           "the metric early stopping, the plateau and `RUN/best` watch: `auc` (higher is better) or `logloss` "
           "(lower is better)"),
    U64("checkpoint", "interval_steps", checkpoint_interval_steps, 0, "0", "checkpoint every N steps (0: at the end only)"),
    U32("checkpoint", "keep", checkpoint_keep, 1, 1000, "2", "checkpoints kept, newest first (`RUN/best` besides); journaled ones stand on at least two full ones when "
        "2 or more: `keep` K makes every (K - 1)th checkpoint full"),
    BOOL("checkpoint", "keep_best", keep_best, "false", "keep `RUN/best`, the checkpoint of the best validation; below"),
    DBL("checkpoint", "journal_max_fraction", checkpoint_journal_max_fraction, 0, 1, "0.25",
        "(`tiered` and `hash` tables) a checkpoint writes only the rows changed since the last full one while they "
        "are at most this fraction of the table; 0: every checkpoint full (docs/formats.md, \"Journaled checkpoints\")"),
    U64("log", "interval_steps", log_interval_steps, 1, "1000",
        "a line in `RUN/metrics.jsonl` every N steps; every line also names the compute `backend`, the GEMMs' "
        "`precision` as resolved and `bf16_native`"),
    CUSTOM("storage", "kind", storage, store_opt, "ram",
           "where the embedding table lives: in memory, in a file with a RAM cache of its hot rows (`tiered`), or a "
           "dynamic table keyed by raw keys (`hash`); below"),
    U64("storage", "cache_rows", storage_cache_rows, 0, "0",
        "(`tiered`) rows kept in RAM, at least one batch's distinct rows; (`hash`) the table's rows"),
    STR("storage", "path", storage_path, "", "(`tiered`) the table's file (`\"\"`: `RUN/table.tiered`); put it on a fast local disk"),
    U32("storage", "admit_min_count", storage_admit_min_count, 1, 65535, "1",
        "(`hash`) a key gets a row at its n-th sighting (counted in a count-min sketch: possibly early, never late)"),
    DBL("storage", "admit_probability", storage_admit_probability, 0, 1, "0",
        "(`hash`) or, when in (0, 1), with this probability per sighting"),
    CHOICE("storage", "evict", storage_evict, evicts, "lru",
           "(`hash`) the row a new key takes from a full table: the least recently (`lru`) or least frequently "
           "(`lfu`) looked up, among 8 sampled"),
    U64("storage", "ttl_steps", storage_ttl_steps, 0, "0", "(`hash`) rows not looked up for this many steps are freed (0: never)"),
    DBL("storage", "init_range", storage_init_range, 0, 1e6, "0",
        "(`hash`) a new key's row is uniform in ±this; 0: sqrt(columns / `cache_rows`), DLRM's scale for a column "
        "holding an equal share (with the default `model.embedding_init` only)"),
    STR("publish", "redis", publish_redis, "",
        "`HOST:PORT` of a Redis the trained rows are published to, for servers reading them (`dlrec serve --redis`; "
        "docs/serving.md, \"The Redis tier\"); `\"\"`: off"),
    STR("publish", "prefix", publish_prefix, "", "the rows' key prefix; `\"\"`: `dlrec:NAME`, NAME the config's `name`"),
    U64("publish", "interval_steps", publish_interval_steps, 1, "10",
        "publish the rows trained since the last publish every N steps, and at the end"),
    U32("publish", "timeout_ms", publish_timeout_ms, 1, 60000, "200", "a publish slower than this is retried with the next one"),
    DBL("distributed", "rowwise_share", dist_rowwise_share, 0, 1e9, "0.5",
        "across ranks (`mpirun`; docs/distributed.md): a column holding more than this share of a rank's fair part "
        "of the table's bytes is split row-wise over all ranks, the others go whole to one rank; 0: every column "
        "row-wise; the trained model is the same whatever the plan"),
    DBL("distributed", "timeout_s", dist_timeout_s, 0, 1e9, "1800",
        "across ranks: the seconds a rank may wait in one exchange for the others (a rank stopped, hung, or busy "
        "alone, as rank 0 writing a checkpoint or scoring `RUN/best`) before the job ends with an error naming the "
        "ranks that never came; 0: wait forever"),
    {.key = NULL},
};
