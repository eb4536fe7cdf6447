/* The training configuration: defaults, JSON reading with strict checks
 * (both from the options table, config_options.c), the checks across
 * fields, and the learning-rate schedule. */
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
  /* What the table does not set: the model type's defaults, and the
   * optimizers' (their types' rows set the types, the others keep them). */
  dlrec_net_config_default(&c->model, DLREC_DEFAULT_MODEL_TYPE);
  dlrec_optim_config_default(&c->dense, DLREC_OPTIM_SGD);
  dlrec_sparse_optim_config_default(&c->sparse, DLREC_SPARSE_SGD);
  dlrec_options_defaults(dlrec_train_config_options, 0, c, NULL);
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
  dlrec_status st = dlrec_options_read(dlrec_train_config_options, j, what, c);
  if (st != DLREC_OK) return st;
  if (c->storage == DLREC_STORE_HASH && (c->storage_cache_rows < 1 || c->storage_cache_rows >= UINT32_MAX))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'storage.cache_rows': a hash table needs its size in rows "
                       "(1 to 2^32 - 2)", what);
  if (c->storage == DLREC_STORE_TIERED && c->storage_cache_rows < 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'storage.cache_rows': a tiered table needs its cache's size "
                       "in rows (at least one batch's distinct rows)", what);
  if (c->storage_init_range != 0 && c->model.embedding_init.all.kind != DLREC_INIT_UNIFORM_SQRT_ROWS)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'storage.init_range' bounds the default initializer's draws; "
                       "model.embedding_init names another, whose own parameter applies", what);
  return check_validation(c, what);
}

dlrec_status dlrec_train_config_read(const char *path, dlrec_train_config *c) {
  cJSON *j;
  dlrec_status s = dlrec_json_read(path, &j);
  if (s != DLREC_OK) return s;
  s = dlrec_train_config_from_json(j, path, c);
  cJSON_Delete(j);
  return s;
}

cJSON *dlrec_train_config_to_json(const dlrec_train_config *c) {
  return dlrec_options_write(dlrec_train_config_options, c);
}

char *dlrec_train_config_reference(void) {
  const dlrec_opt_reference r = {0, NULL};
  return dlrec_options_markdown(dlrec_train_config_options, &r);
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
