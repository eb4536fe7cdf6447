/* Checkpoints: an atomic directory per save, a `latest` pointer, pruning,
 * and loading for resume, evaluation, prediction and serving. */
#include "dlrec/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dlrec/fsutil.h"
#include "dlrec/json.h"
#include "dlrec/log.h"
#include "train/tensor_file.h"

#define TRY(expr)                    \
  do {                               \
    dlrec_status st_ = (expr);       \
    if (st_ != DLREC_OK) return st_; \
  } while (0)

static const char *const ETL_FILES[] = {"etl.json", "vocab.bin", NULL};

/* The arrays of optim.bin for this optimizer setup (none for SGD + SGD). */
static int optim_arrays(const dlrec_dlrm_optim *opt, size_t n_params, tensor_desc *out) {
  int n = 0;
  size_t dense_floats = dlrec_optim_state_floats(&opt->dense, n_params);
  if (dense_floats) out[n++] = (tensor_desc){"dense_state", TENSOR_F32, dense_floats, opt->dense_state};
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(opt->sparse, &st);
  if (st.accum) out[n++] = (tensor_desc){"sparse_accum", TENSOR_F32, st.rows, st.accum};
  if (st.m) out[n++] = (tensor_desc){"sparse_m", TENSOR_F32, st.rows * st.stride, st.m};
  if (st.v) out[n++] = (tensor_desc){"sparse_v", TENSOR_F32, st.rows * st.stride, st.v};
  if (st.steps) out[n++] = (tensor_desc){"sparse_steps", TENSOR_U32, st.rows, st.steps};
  return n;
}

static dlrec_status join(char *out, size_t n, const char *dir, const char *name) {
  return dlrec_path_join(out, n, dir, name);
}

static int file_size(const char *path, uint64_t *bytes) {
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  *bytes = (uint64_t)st.st_size;
  return 0;
}

static dlrec_status write_manifest(const char *dir, const dlrec_train_progress *p, const char *const *files) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "format", "dlrec-checkpoint");
  cJSON_AddNumberToObject(j, "version", DLREC_CHECKPOINT_VERSION);
  cJSON_AddNumberToObject(j, "step", (double)p->step);
  cJSON_AddNumberToObject(j, "samples", (double)p->samples);
  cJSON *pos = cJSON_AddObjectToObject(j, "position");
  cJSON_AddNumberToObject(pos, "epoch", (double)p->position.epoch);
  cJSON_AddNumberToObject(pos, "row", (double)p->position.row);
  /* The fingerprint is a full 64-bit value: JSON numbers are doubles, so it
   * is stored as a hex string. */
  char fp[32];
  snprintf(fp, sizeof fp, "%016" PRIx64, p->position.fingerprint);
  cJSON_AddStringToObject(pos, "fingerprint", fp);
  if (!isnan(p->valid_auc)) cJSON_AddNumberToObject(j, "valid_auc", p->valid_auc);
  cJSON *fl = cJSON_AddObjectToObject(j, "files");
  dlrec_status s = DLREC_OK;
  for (int i = 0; files[i] && s == DLREC_OK; i++) {
    char path[4096];
    uint64_t bytes = 0;
    s = join(path, sizeof path, dir, files[i]);
    if (s == DLREC_OK && file_size(path, &bytes) != 0) s = dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
    if (s == DLREC_OK) cJSON_AddNumberToObject(fl, files[i], (double)bytes);
  }
  char path[4096];
  if (s == DLREC_OK) s = join(path, sizeof path, dir, "manifest.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, j);
  cJSON_Delete(j);
  return s;
}

/* Checkpoint names sort by step: ckpt-%012llu. */
static int ckpt_step(const char *name, uint64_t *step) {
  unsigned long long v;
  int len = 0;
  if (sscanf(name, "ckpt-%12llu%n", &v, &len) != 1 || len != 17 || name[len]) return 0;
  *step = v;
  return 1;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Removes all but the newest `keep` checkpoints (by step). */
static void prune(const char *run_dir, uint32_t keep) {
  DIR *d = opendir(run_dir);
  if (!d) return;
  uint64_t steps[4096];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 4096)
    if (ckpt_step(e->d_name, &steps[n])) n++;
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_u64);
  for (size_t i = 0; i + keep < n; i++) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/ckpt-%012" PRIu64, run_dir, steps[i]) >= (int)sizeof path) continue;
    if (dlrec_remove_tree(path) != DLREC_OK) DLREC_WARN("could not remove old checkpoint: %s", dlrec_last_error());
  }
}

dlrec_status dlrec_checkpoint_save(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                   const dlrec_dlrm *m, const dlrec_dlrm_optim *opt,
                                   const dlrec_train_progress *p, uint32_t keep) {
  char name[64], final_dir[4096], tmp[4096], path[4096], src[4096];
  snprintf(name, sizeof name, "ckpt-%012" PRIu64, p->step);
  TRY(dlrec_mkdirs(run_dir));
  TRY(join(final_dir, sizeof final_dir, run_dir, name));
  if (snprintf(tmp, sizeof tmp, "%s.tmp", final_dir) >= (int)sizeof tmp) return dlrec_error(DLREC_ERR_INVALID, "path too long");
  TRY(dlrec_remove_tree(tmp)); /* a leftover of a crash mid-save */
  TRY(dlrec_mkdirs(tmp));

  cJSON *cj = dlrec_train_config_to_json(cfg);
  dlrec_status s = join(path, sizeof path, tmp, "config.json");
  if (s == DLREC_OK) s = dlrec_json_write(path, cj);
  cJSON_Delete(cj);
  char etl_out[4096];
  if (s == DLREC_OK) s = join(etl_out, sizeof etl_out, tmp, "etl");
  if (s == DLREC_OK) s = dlrec_mkdirs(etl_out);
  for (int i = 0; s == DLREC_OK && ETL_FILES[i]; i++) {
    s = join(src, sizeof src, etl_dir, ETL_FILES[i]);
    if (s == DLREC_OK) s = join(path, sizeof path, etl_out, ETL_FILES[i]);
    if (s == DLREC_OK) s = dlrec_copy_file(src, path);
  }
  if (s == DLREC_OK) s = dlrec_fsync_dir(etl_out);

  size_t n_params;
  const float *params = dlrec_dlrm_dense_params_const(m, &n_params);
  tensor_desc dense = {"dense", TENSOR_F32, n_params, (void *)params};
  if (s == DLREC_OK) s = join(path, sizeof path, tmp, "dense.bin");
  if (s == DLREC_OK) s = tensor_file_write(path, &dense, 1);
  const dlrec_table *t = dlrec_dlrm_table_const(m);
  tensor_desc table = {"table", TENSOR_F32, dlrec_table_rows(t) * dlrec_table_stride(t),
                       (void *)dlrec_table_data_const(t)};
  if (s == DLREC_OK) s = join(path, sizeof path, tmp, "table.bin");
  if (s == DLREC_OK) s = tensor_file_write(path, &table, 1);
  const char *files[] = {"config.json", "dense.bin", "table.bin", "etl/etl.json", "etl/vocab.bin", NULL, NULL};
  if (opt) {
    tensor_desc arrays[8];
    int n = optim_arrays(opt, n_params, arrays);
    if (s == DLREC_OK) s = join(path, sizeof path, tmp, "optim.bin");
    if (s == DLREC_OK) s = tensor_file_write(path, arrays, n);
    files[5] = "optim.bin";
  }
  if (s == DLREC_OK) s = write_manifest(tmp, p, files);
  if (s == DLREC_OK) s = dlrec_fsync_dir(tmp);
  /* Saving a step that exists (a resumed run reaching it again) replaces it. */
  if (s == DLREC_OK) s = dlrec_remove_tree(final_dir);
  if (s == DLREC_OK) s = dlrec_rename_durable(tmp, final_dir);
  if (s == DLREC_OK) {
    char latest[128];
    int n = snprintf(latest, sizeof latest, "%s\n", name);
    s = join(path, sizeof path, run_dir, "latest");
    if (s == DLREC_OK) s = dlrec_write_file_atomic(path, latest, (size_t)n);
  }
  if (s != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    dlrec_remove_tree(tmp);
    return dlrec_error_restore(&e);
  }
  prune(run_dir, keep ? keep : 1);
  return DLREC_OK;
}

dlrec_status dlrec_checkpoint_resolve(const char *path, char *out, size_t out_size) {
  char probe[4096];
  struct stat st;
  TRY(join(probe, sizeof probe, path, "manifest.json"));
  if (stat(probe, &st) == 0) {
    if (snprintf(out, out_size, "%s", path) >= (int)out_size) return dlrec_error(DLREC_ERR_INVALID, "path too long");
    return DLREC_OK;
  }
  TRY(join(probe, sizeof probe, path, "latest"));
  char *text;
  size_t n;
  if (dlrec_read_file(probe, 4096, &text, &n) != DLREC_OK)
    return dlrec_error(DLREC_ERR_IO, "%s: neither a checkpoint (no manifest.json) nor a run directory (no 'latest')", path);
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = '\0';
  uint64_t step;
  dlrec_status s = DLREC_OK;
  if (!ckpt_step(text, &step)) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: does not name a checkpoint: '%s'", probe, text);
  else s = join(out, out_size, path, text);
  free(text);
  return s;
}

/* Reads manifest.json: format, version, progress, and every listed file's size. */
static dlrec_status read_manifest(const char *dir, dlrec_train_progress *p, int *has_optim) {
  char path[4096];
  TRY(join(path, sizeof path, dir, "manifest.json"));
  cJSON *j;
  TRY(dlrec_json_read(path, &j));
  const char *format, *fp;
  uint64_t version;
  const cJSON *pos, *files;
  dlrec_status s = dlrec_json_get_string(j, "format", path, &format);
  if (s == DLREC_OK && strcmp(format, "dlrec-checkpoint"))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: not a dlrec checkpoint manifest", path);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "version", path, &version);
  if (s == DLREC_OK && version != DLREC_CHECKPOINT_VERSION)
    s = dlrec_error(DLREC_ERR_VERSION, "%s: checkpoint version %llu, this build reads version %d", path,
                    (unsigned long long)version, DLREC_CHECKPOINT_VERSION);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "step", path, &p->step);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "samples", path, &p->samples);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "position", path, &pos);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "epoch", path, &p->position.epoch);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "row", path, &p->position.row);
  if (s == DLREC_OK) s = dlrec_json_get_string(pos, "fingerprint", path, &fp);
  if (s == DLREC_OK) {
    char *end;
    p->position.fingerprint = strtoull(fp, &end, 16);
    if (*end || strlen(fp) != 16) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: bad position fingerprint '%s'", path, fp);
  }
  if (s == DLREC_OK) s = dlrec_json_get_double_or(j, "valid_auc", path, NAN, &p->valid_auc);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "files", path, &files);
  *has_optim = 0;
  for (const cJSON *f = s == DLREC_OK ? files->child : NULL; f && s == DLREC_OK; f = f->next) {
    char fpath[4096];
    uint64_t want = 0, have = 0;
    s = dlrec_json_get_u64(files, f->string, path, &want);
    if (s == DLREC_OK) s = join(fpath, sizeof fpath, dir, f->string);
    if (s == DLREC_OK && file_size(fpath, &have) != 0)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: missing (the checkpoint is incomplete)", fpath);
    if (s == DLREC_OK && have != want)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu bytes, the manifest says %llu (torn or modified checkpoint)", fpath,
                      (unsigned long long)have, (unsigned long long)want);
    if (s == DLREC_OK && !strcmp(f->string, "optim.bin")) *has_optim = 1;
  }
  cJSON_Delete(j);
  return s;
}

void dlrec_model_free(dlrec_model *m) {
  if (!m) return;
  dlrec_dlrm_free(m->dlrm);
  dlrec_etl_free(m->etl);
  free(m);
}

dlrec_status dlrec_model_load(const char *path, dlrec_model **out) {
  *out = NULL;
  dlrec_model *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  char p[4096];
  int has_optim;
  dlrec_status s = dlrec_checkpoint_resolve(path, m->dir, sizeof m->dir);
  if (s == DLREC_OK) s = read_manifest(m->dir, &m->progress, &has_optim);
  if (s == DLREC_OK) s = join(p, sizeof p, m->dir, "config.json");
  if (s == DLREC_OK) s = dlrec_train_config_read(p, &m->config);
  if (s == DLREC_OK) s = join(p, sizeof p, m->dir, "etl");
  if (s == DLREC_OK) s = dlrec_etl_load(&m->etl, p);
  if (s == DLREC_OK) s = dlrec_dlrm_create(&m->dlrm, &m->config.shape, dlrec_etl_schema(m->etl));
  size_t n_params = 0;
  float *params = s == DLREC_OK ? dlrec_dlrm_dense_params(m->dlrm, &n_params) : NULL;
  tensor_desc dense = {"dense", TENSOR_F32, n_params, params};
  if (s == DLREC_OK) s = join(p, sizeof p, m->dir, "dense.bin");
  if (s == DLREC_OK) s = tensor_file_read(p, &dense, 1);
  if (s == DLREC_OK) {
    dlrec_table *t = dlrec_dlrm_table(m->dlrm);
    tensor_desc table = {"table", TENSOR_F32, dlrec_table_rows(t) * dlrec_table_stride(t), dlrec_table_data(t)};
    s = join(p, sizeof p, m->dir, "table.bin");
    if (s == DLREC_OK) s = tensor_file_read(p, &table, 1);
  }
  if (s != DLREC_OK) {
    dlrec_error_context("loading checkpoint %s: ", path);
    dlrec_model_free(m);
    return dlrec_last_status();
  }
  *out = m;
  return DLREC_OK;
}

/* The settings that shape the parameters or the data order must match on
 * resume; epochs, intervals, threads and the like may change. */
static dlrec_status same_training(const dlrec_train_config *a, const dlrec_train_config *b, const char *dir) {
  const char *field = NULL;
  if (memcmp(&a->shape, &b->shape, sizeof a->shape)) field = "model";
  else if (memcmp(&a->dense, &b->dense, sizeof a->dense)) field = "optimizer.dense";
  else if (memcmp(&a->sparse, &b->sparse, sizeof a->sparse)) field = "optimizer.sparse";
  else if (a->batch_size != b->batch_size) field = "training.batch_size";
  else if (a->seed != b->seed) field = "training.seed";
  else if (a->shuffle != b->shuffle || a->window_groups != b->window_groups || a->slice_rows != b->slice_rows)
    field = "loader";
  if (field)
    return dlrec_error(DLREC_ERR_INVALID,
                       "cannot resume from %s: the config's '%s' differs from the one the checkpoint was written with",
                       dir, field);
  return DLREC_OK;
}

dlrec_status dlrec_checkpoint_load_training(const char *path, const dlrec_train_config *cfg, dlrec_dlrm *m,
                                            dlrec_dlrm_optim *opt, dlrec_train_progress *prog) {
  char dir[1024], p[4096];
  int has_optim;
  dlrec_train_config saved;
  TRY(dlrec_checkpoint_resolve(path, dir, sizeof dir));
  dlrec_status s = read_manifest(dir, prog, &has_optim);
  if (s == DLREC_OK && !has_optim)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: a model-only checkpoint (no optimizer state) cannot be resumed", dir);
  if (s == DLREC_OK) s = join(p, sizeof p, dir, "config.json");
  if (s == DLREC_OK) s = dlrec_train_config_read(p, &saved);
  if (s == DLREC_OK) s = same_training(cfg, &saved, dir);
  size_t n_params = 0;
  float *params = dlrec_dlrm_dense_params(m, &n_params);
  tensor_desc dense = {"dense", TENSOR_F32, n_params, params};
  if (s == DLREC_OK) s = join(p, sizeof p, dir, "dense.bin");
  if (s == DLREC_OK) s = tensor_file_read(p, &dense, 1);
  dlrec_table *t = dlrec_dlrm_table(m);
  tensor_desc table = {"table", TENSOR_F32, dlrec_table_rows(t) * dlrec_table_stride(t), dlrec_table_data(t)};
  if (s == DLREC_OK) s = join(p, sizeof p, dir, "table.bin");
  if (s == DLREC_OK) s = tensor_file_read(p, &table, 1);
  tensor_desc arrays[8];
  int n = optim_arrays(opt, n_params, arrays);
  if (s == DLREC_OK) s = join(p, sizeof p, dir, "optim.bin");
  if (s == DLREC_OK) s = tensor_file_read(p, arrays, n);
  if (s != DLREC_OK) return dlrec_error_context("resuming from %s: ", dir);
  return DLREC_OK;
}
