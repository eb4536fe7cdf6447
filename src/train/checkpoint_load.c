/* Loading a checkpoint: its manifest read and checked, its tensor files
 * read (a table mapped, a journal applied), and a resume's checks that the
 * config and the ETL state train as the checkpoint's did; a resume of a run
 * falls back past damaged checkpoints to the newest one that loads. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/json.h"
#include "core/log.h"
#include "backend/table_store.h"
#include "train/checkpoint_impl.h"
#include "train/etl_match.h"

/* "(3, 4)" or "(4)": a tensor's shape for messages. */
static const char *shape_str(const dlrec_net_tensor *t, char *buf, size_t n) {
  if (t->ndim == 2) snprintf(buf, n, "(%u, %u)", t->shape[0], t->shape[1]);
  else snprintf(buf, n, "(%u)", t->shape[0]);
  return buf;
}


static dlrec_status parse_hex(const char *text, int digits, const char *what, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 16);
  if (*end || (int)strlen(text) != digits || errno || !strchr("0123456789abcdefABCDEF", text[0]))
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: '%s' is not %d hex digits", what, text, digits);
  *out = v;
  return DLREC_OK;
}

/* Reads the files member: each known file with its size and CRC32C, each
 * present with that size. */
static dlrec_status read_files(const char *dir, const char *path, const cJSON *files, manifest *m) {
  dlrec_status s = DLREC_OK;
  for (const cJSON *f = files->child; f && s == DLREC_OK; f = f->next) {
    int i = 0;
    while (i < N_FILES && (!f->string || strcmp(f->string, ckpt_file_names[i]))) i++;
    if (i == N_FILES) return dlrec_error(DLREC_ERR_CORRUPT, "%s: files: unknown file '%s'", path, f->string ? f->string : "");
    if (m->has[i]) return dlrec_error(DLREC_ERR_CORRUPT, "%s: files: '%s' given twice", path, f->string);
    m->has[i] = 1;
    char what[4200], fpath[4096];
    const char *hex;
    uint64_t crc = 0, have = 0;
    snprintf(what, sizeof what, "%s: files.%s", path, f->string);
    s = dlrec_json_get_u64(f, "bytes", what, &m->bytes[i]);
    if (s == DLREC_OK) s = dlrec_json_get_string(f, "crc32c", what, &hex);
    if (s == DLREC_OK) s = parse_hex(hex, 8, what, &crc);
    m->crc[i] = (uint32_t)crc;
    if (s == DLREC_OK) s = ckpt_join(fpath, sizeof fpath, dir, f->string);
    if (s == DLREC_OK && ckpt_file_size(fpath, &have) != 0)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: missing (the checkpoint is incomplete)", fpath);
    if (s == DLREC_OK && have != m->bytes[i])
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu bytes, the manifest says %llu (torn or modified checkpoint)", fpath,
                      (unsigned long long)have, (unsigned long long)m->bytes[i]);
  }
  for (int i = 0; s == DLREC_OK && i < N_FILES; i++)
    if (!m->has[i] && i != F_OPTIM && i != F_JOURNAL && i != F_JOURNAL_OPTIM && i != F_HASH) /* optional */
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: files: '%s' is missing", path, ckpt_file_names[i]);
  return s;
}

/* Reads the manifest's model member: the type and each tensor's name and
 * shape (1 or 2 dimensions). */
static dlrec_status read_model_section(const cJSON *j, const char *path, manifest *m) {
  const cJSON *model, *tensors;
  const char *type;
  char what[4200];
  snprintf(what, sizeof what, "%s: model", path);
  dlrec_status s = dlrec_json_get_object(j, "model", path, &model);
  if (s == DLREC_OK) s = dlrec_json_get_string(model, "type", what, &type);
  if (s == DLREC_OK && snprintf(m->type, sizeof m->type, "%s", type) >= (int)sizeof m->type)
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: field 'type': '%s' is too long", what, type);
  if (s == DLREC_OK) s = dlrec_json_get_array(model, "tensors", what, &tensors);
  if (s == DLREC_OK && cJSON_GetArraySize(tensors) > DLREC_NET_MAX_TENSORS)
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: %d tensors, at most %d", what, cJSON_GetArraySize(tensors),
                    DLREC_NET_MAX_TENSORS);
  for (const cJSON *t = s == DLREC_OK ? tensors->child : NULL; t && s == DLREC_OK; t = t->next) {
    dlrec_net_tensor *d = &m->tensors[m->n_tensors];
    char tw[4300];
    snprintf(tw, sizeof tw, "%s.tensors[%u]", what, m->n_tensors);
    const char *name;
    const cJSON *shape;
    s = dlrec_json_get_string(t, "name", tw, &name);
    if (s == DLREC_OK && snprintf(d->name, sizeof d->name, "%s", name) >= (int)sizeof d->name)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: name '%s' is too long", tw, name);
    if (s == DLREC_OK) s = dlrec_json_get_array(t, "shape", tw, &shape);
    int nd = s == DLREC_OK ? cJSON_GetArraySize(shape) : 0;
    if (s == DLREC_OK && (nd < 1 || nd > 2)) s = dlrec_error(DLREC_ERR_CORRUPT, "%s: shape: %d dimensions, expected 1 or 2", tw, nd);
    d->ndim = (uint32_t)nd;
    for (int k = 0; s == DLREC_OK && k < nd; k++) {
      const cJSON *e = cJSON_GetArrayItem(shape, k);
      if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 4294967295.0 ||
          e->valuedouble != (double)(uint32_t)e->valuedouble)
        s = dlrec_error(DLREC_ERR_CORRUPT, "%s: shape[%d]: expected a positive integer", tw, k);
      else d->shape[k] = (uint32_t)e->valuedouble;
    }
    m->n_tensors++;
  }
  return s;
}

/* The checkpoint's model must be the one the config plans: the same type and
 * the same tensors, by name and shape, in the same order. */
static dlrec_status same_tensors(const char *dir, const manifest *m, const dlrec_net *n) {
  const char *type = dlrec_net_get_config(n)->type;
  if (strcmp(m->type, type))
    return dlrec_error(DLREC_ERR_INVALID, "%s: a checkpoint of a '%s' model, the config's model.type is '%s'", dir,
                       m->type, type);
  const dlrec_net_tensor *t = dlrec_net_tensors(n);
  uint32_t k = dlrec_net_n_tensors(n);
  if (m->n_tensors != k)
    return dlrec_error(DLREC_ERR_INVALID, "%s: the checkpoint holds %u dense tensors, the model plans %u", dir,
                       m->n_tensors, k);
  for (uint32_t i = 0; i < k; i++) {
    const dlrec_net_tensor *a = &m->tensors[i], *b = &t[i];
    if (strcmp(a->name, b->name) || a->ndim != b->ndim || a->shape[0] != b->shape[0] ||
        (a->ndim == 2 && a->shape[1] != b->shape[1]))
    {
      char sa[48], sb[48];
      return dlrec_error(DLREC_ERR_INVALID, "%s: tensor %u is '%s' of shape %s, the model plans '%s' of shape %s", dir,
                         i, a->name, shape_str(a, sa, sizeof sa), b->name, shape_str(b, sb, sizeof sb));
    }
  }
  return DLREC_OK;
}

/* A model-only load (eval, predict, serve) maps table.bin in place of
 * reading it: after the same checks (the file read through once, from the
 * page cache afterwards), the network's ram table becomes the array inside a
 * private mapping of the file, whose pages are read on first touch. A table
 * larger than memory is then scored from the page cache, and a server's RSS
 * holds the rows it looks up, not the table. */
static dlrec_status map_table_file(const char *dir, const manifest *m, dlrec_net *n) {
  char path[4096];
  uint32_t crc = 0;
  void *map = NULL, *data = NULL;
  size_t bytes = 0;
  dlrec_store_view none = {0};
  tensor_desc want = ckpt_table_array(n, &none);
  TRY(ckpt_join(path, sizeof path, dir, ckpt_file_names[F_TABLE]));
  TRY(tensor_file_map(path, &want, &map, &bytes, &data, &crc));
  if (crc != m->crc[F_TABLE]) {
    munmap(map, bytes);
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[F_TABLE]);
  }
  table_adopt(dlrec_net_table(n), map, bytes, data);
  return DLREC_OK;
}

/* Applies a journaled checkpoint's journal over the base's arrays in v
 * (the table; with opt, the optimizer state too): first a pass that checks
 * journal.bin whole and reads its rows (ascending, inside the table), then
 * the rows copied to their places. *rows_out receives the rows (the caller
 * frees them). */
static dlrec_status apply_journal(const char *dir, const manifest *man, const dlrec_net *n, const dlrec_net_optim *opt,
                                  const dlrec_store_view *v, size_t n_params, uint32_t **rows_out) {
  const uint64_t table_rows = dlrec_store_changes_space(dlrec_net_store(n)), k = man->journal_rows;
  char path[4096];
  TRY(ckpt_join(path, sizeof path, dir, ckpt_file_names[F_JOURNAL]));
  if (k > table_rows)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu rows, the table has %llu", path, (unsigned long long)k,
                       (unsigned long long)table_rows);
  uint32_t *rows = malloc((k ? k : 1) * sizeof *rows);
  if (!rows) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a journal of %llu rows", (unsigned long long)k);
  tensor_desc a[8];
  int na = ckpt_journal_table_arrays(n, NULL, 0, rows, k, 1, a);
  dlrec_status s = ckpt_read_tensors(dir, man, F_JOURNAL, a, na);
  for (uint64_t i = 0; s == DLREC_OK && i < k; i++)
    if (rows[i] >= table_rows || (i && rows[i] <= rows[i - 1]))
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: array 'rows': row %u at %llu is outside the table of %llu rows or "
                      "out of order", path, rows[i], (unsigned long long)i, (unsigned long long)table_rows);
  if (s == DLREC_OK) {
    na = ckpt_journal_table_arrays(n, v->table, v->mapped, rows, k, 0, a);
    a[0].data = NULL; /* read above */
    s = ckpt_read_tensors(dir, man, F_JOURNAL, a, na);
  }
  if (s == DLREC_OK && opt) {
    na = ckpt_journal_optim_arrays(opt, v, n_params, table_rows, rows, k, a);
    s = ckpt_read_tensors(dir, man, F_JOURNAL_OPTIM, a, na);
  }
  if (s == DLREC_OK && rows_out) *rows_out = rows;
  else free(rows);
  return s;
}

/* Reads the dense tensors and the table of the checkpoint into n, and with
 * opt the optimizer state, after checking that they are the ones n plans.
 * Without opt (a model-only load) the table is mapped (map_table_file). A
 * journaled checkpoint's journal is applied over them; its rows go to
 * *journal_rows when that is not NULL (NULL for a full checkpoint). */
dlrec_status ckpt_read_params(const char *dir, const manifest *man, dlrec_net *n, dlrec_net_optim *opt,
                              uint32_t **journal_rows, const dlrec_train_config *cfg, const dlrec_row_source *src) {
  TRY(same_tensors(dir, man, n));
  size_t n_params = 0;
  tensor_desc dense[DLREC_NET_MAX_TENSORS];
  int k = ckpt_dense_arrays(n, dlrec_net_dense_params(n, &n_params), dense);
  TRY(ckpt_read_tensors(dir, man, F_DENSE, dense, k));
  if (journal_rows) *journal_rows = NULL;
  if (src) {
    /* The rows go to src (a training resume: opt is there). */
    if (man->has[F_JOURNAL] || man->has[F_HASH])
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: a checkpoint of a tiered or hash table cannot be resumed across "
                         "ranks", dir);
    source_stream streams[5];
    tensor_desc table = ckpt_source_table(n, src, 0, &streams[4]), arrays[8];
    TRY(ckpt_read_tensors(dir, man, F_TABLE, &table, 1));
    const int na = ckpt_source_optim_arrays(cfg, n, opt, src, n_params, 0, streams, arrays);
    return ckpt_read_tensors(dir, man, F_OPTIM, arrays, na);
  }
  dlrec_store *store = dlrec_net_store(n);
  const int hash = dlrec_store_get_kind(store) == DLREC_STORE_HASH;
  if (hash != man->has[F_HASH])
    return dlrec_error(DLREC_ERR_INVALID, "%s: %s", dir,
                       hash ? "not a checkpoint of a hash table (no hash.bin), but the model's table is one"
                            : "a checkpoint of a hash table (hash.bin): its model needs storage.kind \"hash\"");
  if (hash) {
    /* The bookkeeping first: the rows of table.bin are the keys' it names. */
    tensor_desc arrays[4];
    const int k = ckpt_hash_arrays(n, arrays);
    TRY(ckpt_read_tensors(dir, man, F_HASH, arrays, k));
    TRY(dlrec_store_hash_rebuild(store));
  }
  if (!opt && dlrec_store_get_kind(dlrec_net_store(n)) == DLREC_STORE_RAM) {
    TRY(map_table_file(dir, man, n));
    const dlrec_store_view mapped = {.table = dlrec_table_raw(dlrec_net_table(n))};
    return man->has[F_JOURNAL] ? apply_journal(dir, man, n, NULL, &mapped, n_params, journal_rows) : DLREC_OK;
  }
  dlrec_store_view view;
  TRY(ckpt_map_table(n, opt, &view));
  tensor_desc table = ckpt_table_array(n, &view);
  dlrec_status s = ckpt_read_tensors(dir, man, F_TABLE, &table, 1);
  if (s == DLREC_OK && opt) {
    tensor_desc arrays[8];
    int na = ckpt_optim_arrays(opt, &view, n_params, arrays);
    s = ckpt_read_tensors(dir, man, F_OPTIM, arrays, na);
  }
  if (s == DLREC_OK && man->has[F_JOURNAL]) s = apply_journal(dir, man, n, opt, &view, n_params, journal_rows);
  dlrec_store_unmap(dlrec_net_store(n), &view);
  return s;
}

/* Reads the manifest's optional valid member (absent: no validation yet, as
 * in checkpoints written before it existed). */
/* The loss scaling's state, where the run had one (else none). */
static dlrec_status read_loss_scale(const cJSON *j, const char *path, dlrec_train_progress *p) {
  p->loss_scale = 0;
  p->loss_scale_good_steps = 0;
  p->skipped_steps = 0;
  if (!cJSON_GetObjectItemCaseSensitive(j, "loss_scale")) return DLREC_OK;
  const cJSON *ls;
  double scale;
  uint64_t good;
  dlrec_status s = dlrec_json_get_object(j, "loss_scale", path, &ls);
  if (s == DLREC_OK) s = dlrec_json_get_double(ls, "scale", path, &scale);
  if (s == DLREC_OK) s = dlrec_json_get_u64(ls, "good_steps", path, &good);
  if (s == DLREC_OK) s = dlrec_json_get_u64(ls, "skipped_steps", path, &p->skipped_steps);
  if (s == DLREC_OK && (!(scale >= 0 && scale <= DLREC_LOSS_SCALE_MAX) || good > UINT32_MAX))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: loss_scale: scale %g or good_steps %llu out of range", path, scale,
                    (unsigned long long)good);
  if (s != DLREC_OK) return s;
  p->loss_scale = (float)scale;
  p->loss_scale_good_steps = (uint32_t)good;
  return DLREC_OK;
}

static dlrec_status read_valid(const cJSON *j, const char *path, dlrec_valid_state *v) {
  dlrec_valid_state_init(v);
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "valid");
  if (!o) return DLREC_OK;
  char what[4200];
  snprintf(what, sizeof what, "%s: valid", path);
  if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_CORRUPT, "%s: expected an object", what);
  uint64_t stop_bad = 0, plateau_bad = 0, cooldown = 0;
  dlrec_status s = dlrec_json_get_u64(o, "validations", what, &v->validations);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "best", what, NAN, &v->best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "best_step", what, &v->best_step);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "stop_best", what, NAN, &v->stop_best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "stop_bad", what, &stop_bad);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(o, "plateau_best", what, NAN, &v->plateau_best);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "plateau_bad", what, &plateau_bad);
  if (s == DLREC_OK) s = dlrec_json_get_u64(o, "plateau_cooldown", what, &cooldown);
  if (s == DLREC_OK) s = dlrec_json_get_double(o, "plateau_scale", what, &v->plateau_scale);
  if (s == DLREC_OK && (stop_bad > UINT32_MAX || plateau_bad > UINT32_MAX || cooldown > UINT32_MAX))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: a counter beyond 2^32 - 1", what);
  if (s == DLREC_OK && !(v->plateau_scale > 0 && v->plateau_scale <= 1))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: field 'plateau_scale': %g is not in (0, 1]", what, v->plateau_scale);
  v->stop_bad = (uint32_t)stop_bad;
  v->plateau_bad = (uint32_t)plateau_bad;
  v->plateau_cooldown = (uint32_t)cooldown;
  return s;
}

/* Reads manifest.json: format, version, its own checksum, progress, and
 * every listed file's size and CRC32C (the sizes are checked here). */
dlrec_status ckpt_read_manifest(const char *dir, manifest *m) {
  memset(m, 0, sizeof *m);
  dlrec_train_progress *p = &m->p;
  char path[4096];
  TRY(ckpt_join(path, sizeof path, dir, "manifest.json"));
  /* The text is kept for the checksum of its own bytes. A manifest lists
   * a few files and tensors: a few KiB. */
  char *text;
  size_t n;
  TRY(dlrec_read_file(path, 16u << 20, &text, &n));
  cJSON *j;
  dlrec_status s = dlrec_json_parse(text, n, path, &j);
  if (s != DLREC_OK) {
    free(text);
    return s;
  }
  const char *format, *fp;
  uint64_t version, fingerprint = 0;
  const cJSON *pos, *files, *loss;
  s = dlrec_json_get_string(j, "format", path, &format);
  if (s == DLREC_OK && strcmp(format, "dlrec-checkpoint"))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: not a dlrec checkpoint manifest", path);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "version", path, &version);
  if (s == DLREC_OK && version == 1)
    s = dlrec_error(DLREC_ERR_VERSION,
                    "%s: checkpoint version 1, written by an older dlrec without checksums on the manifest and "
                    "config; this build reads version %d: load it with the dlrec that wrote it, or train again",
                    path, DLREC_CHECKPOINT_VERSION);
  else if (s == DLREC_OK && version == 2)
    s = dlrec_error(DLREC_ERR_VERSION,
                    "%s: checkpoint version 2, written by an older dlrec that stored the dense parameters as one "
                    "unnamed array; this build reads version %d (named tensors): load it with the dlrec that wrote "
                    "it, or train again",
                    path, DLREC_CHECKPOINT_VERSION);
  else if (s == DLREC_OK && version != DLREC_CHECKPOINT_VERSION)
    s = dlrec_error(DLREC_ERR_VERSION, "%s: checkpoint version %llu, this build reads version %d", path,
                    (unsigned long long)version, DLREC_CHECKPOINT_VERSION);
  /* The checksum before any other field, so that an edited manifest is
   * reported as such rather than read. */
  if (s == DLREC_OK) s = dlrec_json_check_sealed(text, n, "checksum", path, "the manifest was edited or damaged");
  free(text);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "step", path, &p->step);
  if (s == DLREC_OK) s = dlrec_json_get_u64(j, "samples", path, &p->samples);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "position", path, &pos);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "epoch", path, &p->position.epoch);
  if (s == DLREC_OK) s = dlrec_json_get_u64(pos, "row", path, &p->position.row);
  if (s == DLREC_OK) s = dlrec_json_get_string(pos, "fingerprint", path, &fp);
  if (s == DLREC_OK) s = parse_hex(fp, 16, path, &fingerprint);
  p->position.fingerprint = fingerprint;
  const char *follow = "";
  if (s == DLREC_OK) s = dlrec_json_get_string_or(pos, "follow_file", path, "", &follow);
  if (s == DLREC_OK && (strlen(follow) >= sizeof p->follow_file || strchr(follow, '/')))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: position: 'follow_file' is not a file name: '%s'", path, follow);
  if (s == DLREC_OK) snprintf(p->follow_file, sizeof p->follow_file, "%s", follow);
  const char *run_id = NULL; /* absent: a run that never published */
  if (s == DLREC_OK) s = dlrec_json_get_string_or(j, "run_id", path, NULL, &run_id);
  char run_what[4200];
  snprintf(run_what, sizeof run_what, "%s: field 'run_id'", path);
  if (s == DLREC_OK && run_id) s = parse_hex(run_id, 16, run_what, &p->run_id);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(j, "valid_auc", path, NAN, &p->valid_auc);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "loss", path, &loss);
  if (s == DLREC_OK) s = dlrec_json_get_double(loss, "sum", path, &p->loss_sum);
  if (s == DLREC_OK) s = dlrec_json_get_u64(loss, "rows", path, &p->loss_rows);
  if (s == DLREC_OK) s = read_loss_scale(j, path, p);
  if (s == DLREC_OK) s = read_valid(j, path, &p->valid);
  if (s == DLREC_OK) s = read_model_section(j, path, m);
  if (s == DLREC_OK) s = dlrec_json_get_object(j, "files", path, &files);
  if (s == DLREC_OK) s = read_files(dir, path, files, m);
  if (s == DLREC_OK && (m->has[F_JOURNAL] || m->has[F_JOURNAL_OPTIM]) &&
      !(m->has[F_JOURNAL] && m->has[F_JOURNAL_OPTIM] && m->has[F_OPTIM]))
    s = dlrec_error(DLREC_ERR_CORRUPT, "%s: files: a journal needs journal.bin, journal_optim.bin and optim.bin", path);
  const cJSON *jo;
  if (s == DLREC_OK && m->has[F_JOURNAL] && (s = dlrec_json_get_object(j, "journal", path, &jo)) == DLREC_OK) {
    s = dlrec_json_get_u64(jo, "base_step", path, &m->journal_base);
    if (s == DLREC_OK) s = dlrec_json_get_u64(jo, "rows", path, &m->journal_rows);
  }
  cJSON_Delete(j);
  return s;
}

/* Checks the CRC32C of file i (read whole here: the small files). */
dlrec_status ckpt_check_file(const char *dir, const manifest *m, int i) {
  char path[4096];
  uint64_t bytes;
  uint32_t crc;
  TRY(ckpt_join(path, sizeof path, dir, ckpt_file_names[i]));
  TRY(ckpt_file_crc(path, &bytes, &crc));
  if (bytes != m->bytes[i] || crc != m->crc[i])
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[i]);
  return DLREC_OK;
}

/* Reads tensor file i into its arrays and checks its whole-file CRC32C,
 * which covers the padding the arrays' own checksums do not. */
dlrec_status ckpt_read_tensors(const char *dir, const manifest *m, int i, const tensor_desc *arrays, int n) {
  char path[4096];
  uint32_t crc = 0;
  TRY(ckpt_join(path, sizeof path, dir, ckpt_file_names[i]));
  TRY(tensor_file_read(path, arrays, n, &crc));
  if (crc != m->crc[i])
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: checksum mismatch (CRC32C %08x, the manifest says %08x): modified or damaged",
                       path, crc, m->crc[i]);
  return DLREC_OK;
}

/* Reads the checkpoint's config.json after checking its checksum. */
dlrec_status ckpt_read_config(const char *dir, const manifest *m, dlrec_train_config *c) {
  char path[4096];
  TRY(ckpt_check_file(dir, m, F_CONFIG));
  TRY(ckpt_join(path, sizeof path, dir, ckpt_file_names[F_CONFIG]));
  return dlrec_train_config_read(path, c);
}

/* Loads the checkpoint's etl/ after checking both files' checksums. */
dlrec_status ckpt_load_etl(const char *dir, const manifest *m, dlrec_etl **etl) {
  char path[4096];
  TRY(ckpt_check_file(dir, m, F_ETL_JSON));
  TRY(ckpt_check_file(dir, m, F_ETL_VOCAB));
  TRY(ckpt_join(path, sizeof path, dir, "etl"));
  return dlrec_etl_load(etl, path);
}

/* The settings that shape the parameters or the data order must match on
 * resume; epochs, intervals, threads and the like may change. */
static dlrec_status same_training(const dlrec_train_config *a, const dlrec_train_config *b, const char *dir) {
  const char *field = NULL;
  if (a->model.table_dtype != b->model.table_dtype)
    return dlrec_error(DLREC_ERR_INVALID,
                       "cannot resume from %s: its embedding table is %s, the config's 'training.table_dtype' is %s",
                       dir, dlrec_table_dtype_name((dlrec_table_dtype)b->model.table_dtype),
                       dlrec_table_dtype_name((dlrec_table_dtype)a->model.table_dtype));
  /* The initializer drew the rows the checkpoint holds: only a hash table,
   * which draws a row when a new key comes, draws with it again. */
  dlrec_net_config ma = a->model, mb = b->model;
  const int same_init = dlrec_embedding_init_same(&ma.embedding_init, &mb.embedding_init);
  memset(&ma.embedding_init, 0, sizeof ma.embedding_init);
  memset(&mb.embedding_init, 0, sizeof mb.embedding_init);
  ma.bias_init = mb.bias_init = 0; /* it drew the dense parameters the checkpoint holds */
  if (strcmp(a->model.type, b->model.type)) field = "model.type";
  else if (memcmp(&ma, &mb, sizeof ma)) field = "model";
  else if (!same_init && a->storage == DLREC_STORE_HASH) field = "model.embedding_init";
  else if (memcmp(&a->dense, &b->dense, sizeof a->dense)) field = "optimizer.dense";
  else if (memcmp(&a->sparse, &b->sparse, sizeof a->sparse)) field = "optimizer.sparse";
  else if (a->clip_grad_norm != b->clip_grad_norm) field = "optimizer.clip_grad_norm";
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

/* The --etl state must encode rows as the checkpoint's own does: the table
 * was trained on that encoding, and later checkpoints copy --etl's files. */
static dlrec_status same_etl(const char *dir, const manifest *m, const char *etl_dir) {
  dlrec_etl *mine = NULL, *given = NULL;
  dlrec_status s = ckpt_load_etl(dir, m, &mine);
  if (s == DLREC_OK) s = dlrec_etl_load(&given, etl_dir);
  if (s == DLREC_OK && etl_same_encoding(mine, given) != DLREC_OK)
    s = dlrec_error_context("cannot resume from %s: --etl %s encodes rows differently from the ETL state the "
                            "checkpoint was trained with (%s/etl): ", dir, etl_dir, dir);
  dlrec_etl_free(mine);
  dlrec_etl_free(given);
  return s;
}

dlrec_status dlrec_checkpoint_load_training(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                            dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                                            dlrec_checkpoint_journal *j) {
  return dlrec_checkpoint_load_training_rows(path, cfg, etl_dir, m, opt, prog, j, NULL);
}

/* A resume from the checkpoint directory `dir`, without falling back. */
static dlrec_status resume_from(const char *dir, const dlrec_train_config *cfg, const char *etl_dir, dlrec_net *m,
                                dlrec_net_optim *opt, dlrec_train_progress *prog, dlrec_checkpoint_journal *j,
                                const dlrec_row_source *src) {
  manifest man;
  dlrec_train_config saved;
  dlrec_status s = ckpt_read_manifest(dir, &man);
  if (s == DLREC_OK && !man.has[F_OPTIM])
    s = dlrec_error(DLREC_ERR_INVALID, "%s: a model-only checkpoint (no optimizer state) cannot be resumed", dir);
  if (s == DLREC_OK) s = ckpt_read_config(dir, &man, &saved);
  if (s == DLREC_OK) s = same_training(cfg, &saved, dir);
  if (s == DLREC_OK) s = same_etl(dir, &man, etl_dir);
  uint32_t *rows = NULL;
  if (s == DLREC_OK) s = ckpt_read_params(dir, &man, m, opt, &rows, cfg, src);
  /* The store now holds the base plus the journal: its changes are the
   * journal's rows, relative to the loaded checkpoint's base files. */
  dlrec_store *store = dlrec_net_store(m);
  if (s == DLREC_OK && j) {
    snprintf(j->base, sizeof j->base, "%s", dir);
    j->base_step = man.has[F_JOURNAL] ? man.journal_base : man.p.step;
    if (dlrec_store_changes(store, NULL) != UINT64_MAX) {
      dlrec_store_changes_reset(store);
      if (rows) s = dlrec_store_changes_mark(store, rows, man.journal_rows);
    }
  }
  free(rows);
  if (s != DLREC_OK) return dlrec_error_context("resuming from %s: ", dir);
  *prog = man.p;
  return DLREC_OK;
}

/* A checkpoint that fails to load as damaged (a checksum, a size, a read,
 * a torn manifest), not as one of another config or ETL state. */
static int damaged(dlrec_status s) {
  return s == DLREC_ERR_CORRUPT || s == DLREC_ERR_IO || s == DLREC_ERR_PARSE;
}

/* RUN's latest checkpoint, of step `step`, is damaged: resumes from the
 * newest older checkpoint that loads, saying which were skipped and why;
 * when none does, the latest's error. The damaged ones stay on disk. */
static dlrec_status fall_back(const char *run_dir, uint64_t step, const dlrec_train_config *cfg, const char *etl_dir,
                              dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                              dlrec_checkpoint_journal *j) {
  dlrec_error_copy latest;
  dlrec_error_save(&latest);
  DLREC_WARN("skipping a damaged checkpoint: %s", latest.message);
  uint64_t steps[4096];
  unsigned skipped = 1;
  for (size_t i = ckpt_list_steps(run_dir, steps, 4096); i-- > 0;) {
    char dir[1024];
    if (steps[i] >= step || ckpt_step_dir(run_dir, steps[i], dir, sizeof dir) != DLREC_OK) continue;
    dlrec_status s = resume_from(dir, cfg, etl_dir, m, opt, prog, j, NULL);
    if (s == DLREC_OK) {
      DLREC_WARN("resuming from %s, the newest checkpoint that loads: %u newer one(s) skipped as damaged (left in "
                 "place); the steps after %llu are trained again",
                 dir, skipped, (unsigned long long)steps[i]);
      return DLREC_OK;
    }
    if (!damaged(s)) return s;
    DLREC_WARN("skipping a damaged checkpoint: %s", dlrec_last_error());
    skipped++;
  }
  dlrec_error_restore(&latest);
  return dlrec_error_context("no checkpoint of %s loads: ", run_dir);
}

dlrec_status dlrec_checkpoint_load_training_rows(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                                 dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                                                 dlrec_checkpoint_journal *j, const dlrec_row_source *src) {
  char dir[1024];
  uint64_t step;
  TRY(dlrec_checkpoint_resolve(path, dir, sizeof dir));
  dlrec_status s = resume_from(dir, cfg, etl_dir, m, opt, prog, j, src);
  /* A run directory's resume falls back past damaged checkpoints; one of a
   * checkpoint named itself does not, nor one through src (across ranks),
   * whose rows went to the shards as they were read. */
  const char *name = strrchr(dir, '/');
  if (s == DLREC_OK || !damaged(s) || src || !strcmp(dir, path) || !name || !ckpt_step(name + 1, &step)) return s;
  return fall_back(path, step, cfg, etl_dir, m, opt, prog, j);
}
