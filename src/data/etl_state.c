/* The ETL state on disk (etl.json + vocab.bin): saving, and loading with
 * full validation. docs/etl.md specifies both files. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/etl_internal.h"
#include "core/crc32c.h"
#include "core/fsutil.h"
#include "core/json.h"

/* vocab.bin: a 32-byte header, then one section per categorical column. */
static const char VOCAB_MAGIC[8] = {'D', 'L', 'R', 'V', 'O', 'C', 'A', 'B'};
#define VOCAB_VERSION 1u
#define VOCAB_HEADER 32u
#define VOCAB_SECTION 16u /* encoding u32, reserved u32, n u64 */
enum { ENC_VOCAB = 0, ENC_HASHED = 1, ENC_TARGET = 2 };

static uint64_t section_bytes(int hashed, uint64_t n) {
  return VOCAB_SECTION + (hashed ? ((12 * n + 7) & ~7ull) : 16 * n);
}

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* ---- saving ---- */

/* A buffered writer that checksums what it writes. */
typedef struct vwriter {
  int fd;
  const char *path;
  unsigned char buf[1 << 16];
  size_t n;
  uint32_t crc;
  uint64_t bytes;
} vwriter;

static dlrec_status vw_flush(vwriter *v) {
  dlrec_status st = dlrec_write_all(v->fd, v->buf, v->n, v->path);
  v->n = 0;
  return st;
}

static dlrec_status vw_put(vwriter *v, const void *data, size_t n) {
  v->crc = dlrec_crc32c(v->crc, data, n);
  v->bytes += n;
  const unsigned char *p = data;
  while (n) {
    size_t k = sizeof v->buf - v->n < n ? sizeof v->buf - v->n : n;
    memcpy(v->buf + v->n, p, k);
    v->n += k, p += k, n -= k;
    if (v->n == sizeof v->buf) {
      dlrec_status st = vw_flush(v);
      if (st != DLREC_OK) return st;
    }
  }
  return DLREC_OK;
}

/* A vocabulary fit sorted on disk (keys, then counts): bytes of it. */
static dlrec_status copy_vocab_file(vwriter *v, const etl_runs *f, uint64_t bytes) {
  unsigned char buf[1 << 16];
  for (uint64_t off = 0; off < bytes;) {
    size_t k = bytes - off < sizeof buf ? (size_t)(bytes - off) : sizeof buf;
    dlrec_status st = dlrec_pread_all(f->fd, buf, k, off, f->path);
    if (st == DLREC_OK) st = vw_put(v, buf, k);
    if (st != DLREC_OK) return st;
    off += k;
  }
  return DLREC_OK;
}

static dlrec_status save_vocab(const dlrec_etl *e, const char *path, uint64_t *bytes, uint32_t *crc) {
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  vwriter *v = calloc(1, sizeof *v);
  if (!v) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  v->path = tmp;
  v->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (v->fd < 0) {
    free(v);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", tmp, strerror(errno));
  }
  unsigned char hdr[VOCAB_HEADER] = {0};
  dlrec_status st = dlrec_write_all(v->fd, hdr, sizeof hdr, tmp); /* rewritten at the end */
  for (uint32_t c = 0; st == DLREC_OK && c < e->schema.n_sparse; c++) {
    const etl_cat *k = &e->cat[c];
    uint64_t n = k->hashed ? k->buckets : k->kept;
    unsigned char sec[VOCAB_SECTION] = {0};
    put32(sec, k->hashed ? ENC_HASHED : ENC_VOCAB);
    put64(sec + 8, n);
    st = vw_put(v, sec, sizeof sec);
    if (st == DLREC_OK && k->vocab_file) {
      st = copy_vocab_file(v, k->vocab_file, 16 * n);
    } else if (st == DLREC_OK && !k->hashed) {
      st = vw_put(v, k->keys, 8 * n);
      if (st == DLREC_OK) st = vw_put(v, k->counts, 8 * n);
    } else if (st == DLREC_OK) {
      st = vw_put(v, k->bucket_counts, 8 * n);
      if (st == DLREC_OK) st = vw_put(v, k->bucket_rank, 4 * n);
      static const unsigned char pad[8];
      if (st == DLREC_OK && (4 * n) % 8) st = vw_put(v, pad, 8 - (4 * n) % 8);
    }
  }
  /* Then the target encodings' counts. */
  for (uint32_t d = 0; st == DLREC_OK && d < e->schema.n_dense; d++) {
    const etl_derived *t = &e->dense[d].derived;
    if (t->op != ETL_OP_TARGET) continue;
    unsigned char sec[VOCAB_SECTION] = {0};
    put32(sec, ENC_TARGET);
    put32(sec + 4, t->folds);
    put64(sec + 8, t->groups);
    st = vw_put(v, sec, sizeof sec);
    if (st == DLREC_OK) st = vw_put(v, t->stats, 16 * t->folds * t->groups);
  }
  if (st == DLREC_OK) st = vw_flush(v);
  if (st == DLREC_OK) {
    memcpy(hdr, VOCAB_MAGIC, 8);
    put32(hdr + 8, VOCAB_VERSION);
    put32(hdr + 12, e->schema.n_sparse);
    put64(hdr + 16, VOCAB_HEADER + v->bytes);
    put32(hdr + 24, v->crc);
    put32(hdr + 28, dlrec_crc32c(0, hdr, 28));
    st = dlrec_pwrite_all(v->fd, hdr, sizeof hdr, 0, tmp);
  }
  if (st == DLREC_OK && fsync(v->fd) != 0) st = dlrec_error(DLREC_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
  if (close(v->fd) != 0 && st == DLREC_OK) st = dlrec_error(DLREC_ERR_IO, "%s: close: %s", tmp, strerror(errno));
  if (st == DLREC_OK) st = dlrec_rename_durable(tmp, path);
  if (st != DLREC_OK) unlink(tmp);
  *bytes = VOCAB_HEADER + v->bytes;
  *crc = v->crc;
  free(v);
  return st;
}

static cJSON *num(double v) { return cJSON_CreateNumber(v); }

static const char *const OP_KINDS[] = {"", "cross", "bucketize", "count", "target"};

/* A derived column's "op" member (docs/etl.md). */
static cJSON *op_json(const dlrec_etl *e, const etl_derived *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", OP_KINDS[d->op]);
  if (d->op == ETL_OP_CROSS) {
    cJSON *c = cJSON_AddArrayToObject(o, "columns");
    for (uint32_t k = 0; k < d->n_src; k++) cJSON_AddItemToArray(c, cJSON_CreateString(e->cols.cat[d->src[k]]));
    return o;
  }
  cJSON_AddStringToObject(o, "column", d->op == ETL_OP_BUCKETIZE ? e->cols.dense[d->src[0]] : e->cols.cat[d->src[0]]);
  if (d->op == ETL_OP_BUCKETIZE) {
    cJSON *b = cJSON_AddArrayToObject(o, "boundaries");
    for (uint32_t k = 0; k < d->n_bounds; k++) cJSON_AddItemToArray(b, num(d->bounds[k]));
    if (d->quantiles) cJSON_AddItemToObject(o, "quantiles", num(d->quantiles));
  } else if (d->op == ETL_OP_TARGET) {
    cJSON_AddItemToObject(o, "folds", num(d->folds));
    cJSON_AddItemToObject(o, "smoothing", num(d->smoothing));
    cJSON_AddItemToObject(o, "seed", num((double)d->seed));
  }
  return o;
}

static cJSON *state_json(const dlrec_etl *e, uint64_t vocab_bytes, uint32_t vocab_crc) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "format", ETL_FORMAT_NAME);
  cJSON_AddItemToObject(root, "version", num(DLREC_ETL_VERSION));
  cJSON_AddStringToObject(root, "input_format", dlrec_format_name(e->format));
  if (e->format == DLREC_FORMAT_LIBFM) cJSON_AddItemToObject(root, "fields", num((double)e->libfm_fields));
  if (e->format == DLREC_FORMAT_CSV) {
    cJSON_AddStringToObject(root, "schema_spec", e->spec ? e->spec : "");
    cJSON *h = cJSON_AddArrayToObject(root, "header");
    for (uint32_t i = 0; i < e->n_header; i++) cJSON_AddItemToArray(h, cJSON_CreateString(e->header[i]));
  }
  cJSON_AddBoolToObject(root, "has_label", e->schema.has_label);
  if (e->schema.has_label) cJSON_AddStringToObject(root, "label", e->schema.label_name);
  cJSON_AddItemToObject(root, "min_count", num((double)e->min_count));
  cJSON_AddItemToObject(root, "hash_buckets", num((double)e->hash_buckets));
  cJSON_AddStringToObject(root, "dense_transform", e->transform == DLREC_DENSE_LOG ? "log1p" : "none");
  cJSON_AddBoolToObject(root, "standardize", e->standardize);
  cJSON_AddItemToObject(root, "rows", num((double)e->rows));
  cJSON_AddItemToObject(root, "positives", num((double)e->positives));
  cJSON_AddItemToObject(root, "bad_rows_skipped", num((double)e->bad_rows));
  /* A raw-keys state records its columns' vocabulary layout (no kept
   * values), from which load rebuilds the keys schema. */
  if (e->raw_keys) cJSON_AddBoolToObject(root, "raw_keys", 1);
  cJSON_AddItemToObject(root, "table_rows", num((double)(e->raw_keys ? e->vocab_rows : e->schema.table_rows)));
  cJSON *dense = cJSON_AddArrayToObject(root, "dense");
  for (uint32_t i = 0; i < e->schema.n_dense; i++) {
    const etl_dense *d = &e->dense[i];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", e->schema.dense_names[i]);
    cJSON_AddItemToObject(o, "count", num((double)d->count));
    cJSON_AddItemToObject(o, "missing", num((double)d->missing));
    cJSON_AddItemToObject(o, "min", num(d->min));
    cJSON_AddItemToObject(o, "max", num(d->max));
    cJSON_AddItemToObject(o, "mean", num(d->mean));
    cJSON_AddItemToObject(o, "std", num(d->std));
    if (d->derived.op) cJSON_AddItemToObject(o, "op", op_json(e, &d->derived));
    /* The workflow's operators (etl_workflow.c), when the column has any. */
    if (d->ops.fill) {
      cJSON *f = cJSON_AddObjectToObject(o, "fill_missing");
      cJSON_AddStringToObject(f, "kind", d->ops.fill == ETL_FILL_MEDIAN ? "median" : "constant");
      cJSON_AddItemToObject(f, "value", num(d->ops.fill_value));
    }
    if (d->ops.clip) {
      cJSON *c = cJSON_AddArrayToObject(o, "clip");
      cJSON_AddItemToArray(c, isfinite(d->ops.clip_lo) ? num(d->ops.clip_lo) : cJSON_CreateNull());
      cJSON_AddItemToArray(c, isfinite(d->ops.clip_hi) ? num(d->ops.clip_hi) : cJSON_CreateNull());
    }
    cJSON_AddItemToArray(dense, o);
  }
  cJSON *cats = cJSON_AddArrayToObject(root, "categorical");
  for (uint32_t i = 0; i < e->schema.n_sparse; i++) {
    const etl_cat *c = &e->cat[i];
    const dlrec_sparse_col *s = &e->schema.sparse[i];
    cJSON *o = cJSON_CreateObject();
    char salt[32];
    snprintf(salt, sizeof salt, "0x%016llx", (unsigned long long)c->salt);
    cJSON_AddStringToObject(o, "name", s->name);
    if (c->derived.op) cJSON_AddItemToObject(o, "op", op_json(e, &c->derived));
    else cJSON_AddStringToObject(o, "key", c->key_kind == DLREC_KEY_HEX ? "hex" : c->key_kind == DLREC_KEY_DEC ? "dec" : "hash");
    if (!c->derived.op && c->key_kind == DLREC_KEY_HASH) cJSON_AddStringToObject(o, "salt", salt);
    cJSON_AddStringToObject(o, "encoding", c->hashed ? "hashed" : "vocab");
    cJSON_AddItemToObject(o, "size", num((double)c->size));
    cJSON_AddItemToObject(o, "id_begin", num((double)c->id_begin));
    cJSON_AddItemToObject(o, "id_end", num((double)(c->id_begin + c->size)));
    cJSON_AddItemToObject(o, "distinct", num((double)c->distinct));
    cJSON_AddItemToObject(o, "kept", num((double)c->kept));
    if (c->hashed) cJSON_AddItemToObject(o, "buckets", num((double)c->buckets));
    cJSON_AddItemToObject(o, "missing", num((double)c->missing));
    cJSON_AddItemToObject(o, "oov", num((double)c->oov));
    if (c->sep) {
      char sep[2] = {c->sep, '\0'};
      cJSON_AddStringToObject(o, "multi", sep);
      cJSON_AddItemToObject(o, "max_hotness", num((double)(s->max_hotness / (e->raw_keys ? 2 : 1))));
      cJSON_AddStringToObject(o, "pooling", s->pooling == DLREC_POOLING_MEAN ? "mean" : "sum");
      cJSON_AddItemToObject(o, "values", num((double)c->values));
    }
    cJSON_AddItemToArray(cats, o);
  }
  cJSON *v = cJSON_AddObjectToObject(root, "vocab");
  cJSON_AddStringToObject(v, "file", ETL_VOCAB);
  cJSON_AddItemToObject(v, "bytes", num((double)vocab_bytes));
  cJSON_AddItemToObject(v, "crc32c", num((double)vocab_crc));
  /* Last: etl_save seals the text with the CRC of its bytes, so that a
   * flipped bit in any field (a "mean" changes every score silently) is
   * refused wherever the file is read: the ETL directory, and the copy in
   * each checkpoint. */
  return root;
}

dlrec_status etl_save(const dlrec_etl *e, const char *dir) {
  char vpath[4096], jpath[4096];
  dlrec_status st = dlrec_mkdirs(dir);
  if (st == DLREC_OK) st = dlrec_path_join(vpath, sizeof vpath, dir, ETL_VOCAB);
  if (st == DLREC_OK) st = dlrec_path_join(jpath, sizeof jpath, dir, ETL_JSON);
  uint64_t bytes = 0;
  uint32_t crc = 0;
  if (st == DLREC_OK) st = save_vocab(e, vpath, &bytes, &crc);
  if (st != DLREC_OK) return st;
  cJSON *root = state_json(e, bytes, crc);
  if (!root) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", jpath);
  st = dlrec_json_write_sealed(jpath, root, ETL_CRC_KEY);
  cJSON_Delete(root);
  return st;
}

/* ---- loading ---- */

/* etl.json holds names and statistics of at most 512 columns and a CSV header
 * of at most 4096 names: far below this. */
#define ETL_JSON_MAX_BYTES (64u << 20)

static dlrec_status corrupt(const char *path, const char *fmt, unsigned long long a, unsigned long long b) {
  char msg[300];
  snprintf(msg, sizeof msg, fmt, a, b);
  return dlrec_error(DLREC_ERR_CORRUPT, "%s: %s (the ETL state is damaged: run 'dlrec etl fit' again)", path, msg);
}

static dlrec_status get_name(const cJSON *o, const char *key, const char *what, char *dst) {
  const char *s;
  dlrec_status st = dlrec_json_get_string(o, key, what, &s);
  if (st != DLREC_OK) return st;
  if (!s[0] || strlen(s) >= DLREC_NAME_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': empty or longer than %d bytes", what, key,
                       DLREC_NAME_MAX - 1);
  strcpy(dst, s);
  return DLREC_OK;
}

/* A dense column's operators, as state_json writes them. */
static dlrec_status load_ops(const cJSON *o, const char *what, etl_dense_ops *op) {
  memset(op, 0, sizeof *op);
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fill_missing");
  if (f) {
    static const char *const keys[] = {"kind", "value", NULL};
    const char *kind = NULL;
    dlrec_status st = cJSON_IsObject(f) ? dlrec_json_check_keys(f, what, keys)
                                        : dlrec_error(DLREC_ERR_INVALID, "%s: fill_missing: expected an object", what);
    if (st == DLREC_OK) st = dlrec_json_get_string(f, "kind", what, &kind);
    if (st == DLREC_OK) st = dlrec_json_get_double(f, "value", what, &op->fill_value);
    if (st != DLREC_OK) return st;
    if (!strcmp(kind, "median")) op->fill = ETL_FILL_MEDIAN;
    else if (!strcmp(kind, "constant")) op->fill = ETL_FILL_CONSTANT;
    if (!op->fill || !isfinite(op->fill_value))
      return dlrec_error(DLREC_ERR_INVALID, "%s: fill_missing: expected a median or constant kind and a finite value",
                         what);
  }
  /* As the workflow writes it (etl_workflow.c). */
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "clip");
  return c ? etl_clip_parse(c, what, op) : DLREC_OK;
}

static dlrec_status load_dense(dlrec_etl *e, const cJSON *arr, const char *jpath) {
  int n = cJSON_GetArraySize(arr);
  if (n > DLREC_MAX_DENSE) return dlrec_error(DLREC_ERR_INVALID, "%s: %d dense columns, at most %d", jpath, n, DLREC_MAX_DENSE);
  e->schema.n_dense = (uint32_t)n;
  static const char *const keys[] = {"name", "count", "missing", "min", "max", "mean", "std", "fill_missing", "clip", "op",
                                     NULL};
  for (int i = 0; i < n; i++) {
    const cJSON *o = cJSON_GetArrayItem(arr, i);
    char what[4200];
    snprintf(what, sizeof what, "%s: dense[%d]", jpath, i);
    etl_dense *d = &e->dense[i];
    dlrec_status st = cJSON_IsObject(o) ? dlrec_json_check_keys(o, what, keys)
                                        : dlrec_error(DLREC_ERR_INVALID, "%s: expected an object", what);
    if (st == DLREC_OK) st = get_name(o, "name", what, e->schema.dense_names[i]);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "count", what, &d->count);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "missing", what, &d->missing);
    if (st == DLREC_OK) st = dlrec_json_get_double(o, "min", what, &d->min);
    if (st == DLREC_OK) st = dlrec_json_get_double(o, "max", what, &d->max);
    if (st == DLREC_OK) st = dlrec_json_get_double(o, "mean", what, &d->mean);
    if (st == DLREC_OK) st = dlrec_json_get_double(o, "std", what, &d->std);
    if (st == DLREC_OK) st = load_ops(o, what, &d->ops);
    if (st != DLREC_OK) return st;
    if (d->count + d->missing != e->rows || !(d->std >= 0) || !isfinite(d->std) || !isfinite(d->mean) ||
        !(d->min <= d->max))
      return dlrec_error(DLREC_ERR_INVALID, "%s: inconsistent statistics", what);
    d->inv_std = d->std > 0 ? 1.0 / d->std : 1.0;
    d->transform = e->transform; /* a target encoding's: none (load_derived) */
    if (cJSON_GetObjectItemCaseSensitive(o, "op") && (d->ops.fill || d->ops.clip))
      return dlrec_error(DLREC_ERR_INVALID, "%s: a derived column has no fill_missing or clip", what);
  }
  return DLREC_OK;
}

/* Each dense column's encoding of a missing value, once the transform and
 * statistics are known: a fill's runs through the encoder as any value. */
static dlrec_status prepare_fills(dlrec_etl *e, const char *jpath) {
  for (uint32_t i = 0; i < e->schema.n_dense; i++) {
    etl_dense *d = &e->dense[i];
    d->fill_out = 0.0f;
    const char *why = d->ops.fill ? etl_dense_encode(e, i, d->ops.fill_value, &d->fill_out) : NULL;
    if (why) return dlrec_error(DLREC_ERR_INVALID, "%s: dense[%u]: fill_missing: %s", jpath, i, why);
  }
  return DLREC_OK;
}

static dlrec_status load_cats(dlrec_etl *e, const cJSON *arr, const char *jpath) {
  int n = cJSON_GetArraySize(arr);
  if (n > DLREC_MAX_SPARSE)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %d categorical columns, at most %d", jpath, n, DLREC_MAX_SPARSE);
  e->schema.n_sparse = (uint32_t)n;
  static const char *const keys[] = {"name", "key", "salt", "encoding", "size", "id_begin", "id_end", "distinct",
                                     "kept", "buckets", "missing", "oov", "multi", "max_hotness", "pooling", "values",
                                     "op", NULL};
  uint64_t next = 0;
  for (int i = 0; i < n; i++) {
    const cJSON *o = cJSON_GetArrayItem(arr, i);
    char what[4200];
    snprintf(what, sizeof what, "%s: categorical[%d]", jpath, i);
    etl_cat *c = &e->cat[i];
    dlrec_sparse_col *s = &e->schema.sparse[i];
    const char *key, *enc, *salt = NULL;
    uint64_t id_end;
    dlrec_status st = cJSON_IsObject(o) ? dlrec_json_check_keys(o, what, keys)
                                        : dlrec_error(DLREC_ERR_INVALID, "%s: expected an object", what);
    /* A derived column's keys are its own (a cross's, a bucket number). */
    const int derived = cJSON_GetObjectItemCaseSensitive(o, "op") != NULL;
    if (st == DLREC_OK) st = get_name(o, "name", what, s->name);
    if (st == DLREC_OK)
      st = derived ? dlrec_json_get_string_or(o, "key", what, "dec", &key) : dlrec_json_get_string(o, "key", what, &key);
    if (st == DLREC_OK && derived && cJSON_GetObjectItemCaseSensitive(o, "key"))
      st = dlrec_error(DLREC_ERR_INVALID, "%s: a derived column has no 'key'", what);
    if (st == DLREC_OK) st = dlrec_json_get_string_or(o, "salt", what, NULL, &salt);
    if (st == DLREC_OK) st = dlrec_json_get_string(o, "encoding", what, &enc);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "size", what, &c->size);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "id_begin", what, &c->id_begin);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "id_end", what, &id_end);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "distinct", what, &c->distinct);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "kept", what, &c->kept);
    if (st == DLREC_OK) st = dlrec_json_get_u64_or(o, "buckets", what, 0, &c->buckets);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "missing", what, &c->missing);
    if (st == DLREC_OK) st = dlrec_json_get_u64(o, "oov", what, &c->oov);
    const char *multi = NULL, *pooling = NULL;
    uint64_t max_hotness = 1;
    if (st == DLREC_OK) st = dlrec_json_get_string_or(o, "multi", what, NULL, &multi);
    if (st != DLREC_OK) return st;
    s->hotness = s->max_hotness = 1;
    s->pooling = DLREC_POOLING_SUM;
    if (multi) {
      /* A multi-hot column: all four members, consistent. */
      st = dlrec_json_get_u64(o, "max_hotness", what, &max_hotness);
      if (st == DLREC_OK) st = dlrec_json_get_string(o, "pooling", what, &pooling);
      if (st == DLREC_OK) st = dlrec_json_get_u64(o, "values", what, &c->values);
      if (st != DLREC_OK) return st;
      if (strlen(multi) != 1 || max_hotness < 1 || max_hotness > 65536 ||
          (strcmp(pooling, "sum") && strcmp(pooling, "mean")))
        return dlrec_error(DLREC_ERR_INVALID,
                           "%s: expected 'multi' of one byte, 'max_hotness' in [1, 65536], 'pooling' sum or mean",
                           what);
      c->sep = multi[0];
      s->max_hotness = (uint32_t)max_hotness;
      s->hotness = max_hotness == 1 ? 1 : 0;
      s->pooling = strcmp(pooling, "mean") ? DLREC_POOLING_SUM : DLREC_POOLING_MEAN;
      e->multi = 1;
    } else if (cJSON_GetObjectItemCaseSensitive(o, "max_hotness") || cJSON_GetObjectItemCaseSensitive(o, "pooling") ||
               cJSON_GetObjectItemCaseSensitive(o, "values")) {
      return dlrec_error(DLREC_ERR_INVALID, "%s: 'max_hotness', 'pooling' and 'values' need 'multi'", what);
    }
    e->ids_max += s->max_hotness;
    if (!strcmp(key, "hex") && !salt) c->key_kind = DLREC_KEY_HEX;
    else if (!strcmp(key, "dec") && !salt) c->key_kind = DLREC_KEY_DEC;
    else if (!strcmp(key, "hash") && salt) {
      char *end;
      errno = 0;
      c->key_kind = DLREC_KEY_HASH;
      c->salt = strtoull(salt, &end, 16);
      if (errno || *end || strncmp(salt, "0x", 2) != 0)
        return dlrec_error(DLREC_ERR_INVALID, "%s: field 'salt': expected 0x and 16 hex digits", what);
    } else {
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'key': expected \"hex\", \"dec\", or \"hash\" with a salt",
                         what);
    }
    if (!strcmp(enc, "hashed")) c->hashed = 1;
    else if (strcmp(enc, "vocab") != 0)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field 'encoding': expected \"vocab\" or \"hashed\"", what);
    uint64_t want = ETL_LOCAL_FIRST + (c->hashed ? c->buckets : c->kept);
    if (c->size != want || c->id_begin != next || id_end != next + c->size || (c->hashed && c->buckets == 0) ||
        c->kept > c->distinct || c->missing > e->rows || (c->hashed && !derived && e->hash_buckets != c->buckets))
      return dlrec_error(DLREC_ERR_INVALID, "%s: inconsistent sizes or id range", what);
    s->id_begin = c->id_begin;
    s->id_end = id_end;
    next = id_end;
  }
  e->schema.table_rows = next;
  return DLREC_OK;
}

/* Checks vocab.bin against etl.json and points the columns into buf. */
static dlrec_status load_vocab(dlrec_etl *e, const char *vpath, unsigned char *buf, size_t n, uint64_t want_bytes,
                               uint32_t want_crc) {
  if (n < VOCAB_HEADER) return corrupt(vpath, "%llu bytes, shorter than the header", n, 0);
  if (memcmp(buf, VOCAB_MAGIC, 8) != 0) return corrupt(vpath, "not a vocabulary file (bad magic)", 0, 0);
  if (get32(buf + 28) != dlrec_crc32c(0, buf, 28)) return corrupt(vpath, "header checksum mismatch", 0, 0);
  if (get32(buf + 8) != VOCAB_VERSION)
    return dlrec_error(DLREC_ERR_VERSION, "%s: version %u, this dlrec reads version %u", vpath, get32(buf + 8),
                       VOCAB_VERSION);
  if (get64(buf + 16) != n) return corrupt(vpath, "file is %llu bytes, its header says %llu (truncated?)", n, get64(buf + 16));
  if (dlrec_crc32c(0, buf + VOCAB_HEADER, n - VOCAB_HEADER) != get32(buf + 24))
    return corrupt(vpath, "checksum mismatch in the vocabularies", 0, 0);
  if (n != want_bytes || get32(buf + 24) != want_crc)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s does not belong to etl.json (size or checksum differ): the two files come from different "
                       "fits; run 'dlrec etl fit' again",
                       vpath);
  if (get32(buf + 12) != e->schema.n_sparse)
    return corrupt(vpath, "%llu columns, etl.json has %llu", get32(buf + 12), e->schema.n_sparse);
  uint64_t off = VOCAB_HEADER;
  for (uint32_t i = 0; i < e->schema.n_sparse; i++) {
    etl_cat *c = &e->cat[i];
    const char *name = e->schema.sparse[i].name;
    if (n - off < VOCAB_SECTION) return corrupt(vpath, "column %llu: section past the end of the file", i, 0);
    uint32_t enc = get32(buf + off);
    uint64_t cnt = get64(buf + off + 8);
    uint64_t want = c->hashed ? c->buckets : c->kept;
    if (enc != (c->hashed ? ENC_HASHED : ENC_VOCAB) || cnt != want)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': encoding %u with %llu entries does not match etl.json",
                         vpath, name, enc, (unsigned long long)cnt);
    if (cnt > (n - off) / 12 || section_bytes(c->hashed, cnt) > n - off)
      return corrupt(vpath, "column %llu: section of %llu entries past the end of the file", i, cnt);
    const unsigned char *p = buf + off + VOCAB_SECTION;
    if (!c->hashed) {
      c->keys = (const uint64_t *)(const void *)p;
      c->counts = (const uint64_t *)(const void *)(p + 8 * cnt);
      /* Order and threshold must hold, as fit wrote them: a cheap, strong check. */
      uint64_t oov_floor = c->derived.op == ETL_OP_BUCKETIZE ? 1 : e->min_count;
      for (uint64_t k = 0; k < cnt; k++) {
        int ok = c->counts[k] >= oov_floor && c->counts[k] > 0;
        if (k > 0)
          ok = ok && (c->counts[k] < c->counts[k - 1] || (c->counts[k] == c->counts[k - 1] && c->keys[k] > c->keys[k - 1]));
        if (!ok) return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': entry %llu is out of order", vpath, name,
                                    (unsigned long long)k);
      }
    } else {
      c->bucket_counts = (const uint64_t *)(const void *)p;
      c->bucket_rank = (const uint32_t *)(const void *)(p + 8 * cnt);
      unsigned char *seen = calloc(cnt ? cnt : 1, 1);
      if (!seen) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", vpath);
      for (uint64_t b = 0; b < cnt; b++) {
        uint32_t r = c->bucket_rank[b];
        int ok = r < cnt && !seen[r] && (b == 0 || c->bucket_counts[b] <= c->bucket_counts[b - 1]);
        if (!ok) {
          free(seen);
          return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': bucket %llu: bad rank or order", vpath, name,
                             (unsigned long long)b);
        }
        seen[r] = 1;
      }
      free(seen);
    }
    /* The counts must add up to the rows where the column was present (a
     * multi-hot column's: to the values fit counted). */
    uint64_t total = c->hashed ? 0 : c->oov;
    const uint64_t *cs = c->hashed ? c->bucket_counts : c->counts;
    for (uint64_t k = 0; k < cnt; k++) total += cs[k];
    if (c->sep && (total != c->values || c->missing > e->rows))
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': counts add up to %llu values, etl.json says %llu", vpath,
                         name, (unsigned long long)total, (unsigned long long)c->values);
    if (!c->sep && total + c->missing != e->rows)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': counts add up to %llu rows, etl.json says %llu", vpath,
                         name, (unsigned long long)(total + c->missing), (unsigned long long)e->rows);
    off += section_bytes(c->hashed, cnt);
  }
  for (uint32_t d = 0; d < e->schema.n_dense; d++) {
    etl_derived *t = &e->dense[d].derived;
    if (t->op != ETL_OP_TARGET) continue;
    const char *name = e->schema.dense_names[d];
    t->groups = e->cat[t->src[0]].size;
    if (n - off < VOCAB_SECTION) return corrupt(vpath, "dense column %llu: section past the end of the file", d, 0);
    if (get32(buf + off) != ENC_TARGET || get32(buf + off + 4) != t->folds || get64(buf + off + 8) != t->groups)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': its target statistics do not match etl.json", vpath,
                         name);
    if ((n - off - VOCAB_SECTION) / 16 / t->folds < t->groups)
      return corrupt(vpath, "dense column %llu: section past the end of the file", d, 0);
    t->stats = (const uint64_t *)(const void *)(buf + off + VOCAB_SECTION);
    off += VOCAB_SECTION + 16 * t->folds * t->groups;
    dlrec_status st = etl_target_prepare(t, e->rows, e->positives);
    if (st != DLREC_OK) return dlrec_error_context("%s: column '%s': ", vpath, name);
  }
  if (off != n) return corrupt(vpath, "%llu bytes after the last column", n - off, 0);
  return DLREC_OK;
}

dlrec_status etl_target_prepare(etl_derived *t, uint64_t rows, uint64_t positives) {
  const uint64_t n = t->groups, K = t->folds;
  uint64_t fr[ETL_FOLDS_MAX] = {0}, fp[ETL_FOLDS_MAX] = {0}, R = 0, P = 0;
  free(t->full);
  free(t->oof);
  t->full = malloc((n ? n : 1) * sizeof *t->full);
  t->oof = malloc((n ? n : 1) * K * sizeof *t->oof);
  if (!t->full || !t->oof) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a target encoding");
  for (uint64_t f = 0; f < K; f++)
    for (uint64_t g = 0; g < n; g++) {
      const uint64_t r = t->stats[2 * (f * n + g)], p = t->stats[2 * (f * n + g) + 1];
      if (p > r || r > rows) return dlrec_error(DLREC_ERR_CORRUPT, "more positives than rows in a group");
      fr[f] += r, fp[f] += p;
    }
  for (uint64_t f = 0; f < K; f++) R += fr[f], P += fp[f];
  if (R != rows || P != positives)
    return dlrec_error(DLREC_ERR_CORRUPT, "target statistics of %llu rows and %llu positives, the fit had %llu and %llu",
                       (unsigned long long)R, (unsigned long long)P, (unsigned long long)rows,
                       (unsigned long long)positives);
  const double m = t->smoothing, prior = R ? (double)P / (double)R : 0.5;
  for (uint64_t g = 0; g < n; g++) {
    uint64_t ng = 0, pg = 0;
    for (uint64_t f = 0; f < K; f++) ng += t->stats[2 * (f * n + g)], pg += t->stats[2 * (f * n + g) + 1];
    t->full[g] = ((double)pg + m * prior) / ((double)ng + m);
    for (uint64_t f = 0; f < K; f++) {
      const double pf = R == fr[f] ? 0.5 : (double)(P - fp[f]) / (double)(R - fr[f]);
      const uint64_t nf = t->stats[2 * (f * n + g)], pfg = t->stats[2 * (f * n + g) + 1];
      t->oof[f * n + g] = ((double)(pg - pfg) + m * pf) / ((double)(ng - nf) + m);
    }
  }
  return DLREC_OK;
}

dlrec_status etl_build_map(etl_cat *c, const char *vpath, const char *name) {
  dlrec_status st = keymap_init(&c->map, c->kept);
  if (st != DLREC_OK) return st;
  /* Prefetch a few keys ahead: the inserts land on random slots. */
  for (uint64_t k = 0; k < c->kept; k++) {
    if (k + 8 < c->kept) keymap_prefetch(&c->map, keymap_hash(c->keys[k + 8]));
    int added;
    uint64_t *v = keymap_upsert_h(&c->map, c->keys[k], keymap_hash(c->keys[k]), &added);
    if (!v) return DLREC_ERR_NOMEM;
    if (!added)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': key %llu appears twice", vpath, name,
                         (unsigned long long)c->keys[k]);
    *v = ETL_LOCAL_FIRST + k;
  }
  return DLREC_OK;
}

static dlrec_status build_maps(dlrec_etl *e, const char *vpath) {
  for (uint32_t i = 0; i < e->schema.n_sparse; i++) {
    if (e->cat[i].hashed) continue;
    dlrec_status st = etl_build_map(&e->cat[i], vpath, e->schema.sparse[i].name);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

/* The number of input columns of a "dense" or "categorical" list: the
 * entries before the first derived one (every later one must be derived). */
static dlrec_status count_inputs(const cJSON *arr, const char *what, uint32_t *n) {
  int i = 0, size = cJSON_GetArraySize(arr);
  while (i < size && !cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(arr, i), "op")) i++;
  *n = (uint32_t)i;
  for (; i < size; i++)
    if (!cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(arr, i), "op"))
      return dlrec_error(DLREC_ERR_INVALID, "%s[%d]: an input column after a derived one", what, i);
  return DLREC_OK;
}

static int input_col(const char (*names)[DLREC_NAME_MAX], uint32_t n, const cJSON *v) {
  if (!cJSON_IsString(v)) return -1;
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(names[i], v->valuestring)) return (int)i;
  return -1;
}

/* A derived column's "op", its sources resolved among the input columns. */
static dlrec_status parse_op(const dlrec_etl *e, const cJSON *op, const char *what, int dense, etl_derived *d) {
  static const char *const keys[] = {"kind", "columns", "column", "boundaries", "quantiles", "folds", "smoothing",
                                     "seed", NULL};
  const char *kind;
  dlrec_status st = cJSON_IsObject(op) ? dlrec_json_check_keys(op, what, keys)
                                       : dlrec_error(DLREC_ERR_INVALID, "%s: op: expected an object", what);
  if (st == DLREC_OK) st = dlrec_json_get_string(op, "kind", what, &kind);
  if (st != DLREC_OK) return st;
  memset(d, 0, sizeof *d);
  for (int k = ETL_OP_CROSS; k <= ETL_OP_TARGET; k++)
    if (!strcmp(kind, OP_KINDS[k])) d->op = (etl_op)k;
  if (dense ? d->op != ETL_OP_COUNT && d->op != ETL_OP_TARGET : d->op != ETL_OP_CROSS && d->op != ETL_OP_BUCKETIZE)
    return dlrec_error(DLREC_ERR_INVALID, "%s: op: kind '%s' is not one of a %s column", what, kind,
                       dense ? "dense (count, target)" : "categorical (cross, bucketize)");
  const dlrec_columns *c = &e->cols;
  if (d->op == ETL_OP_CROSS) {
    const cJSON *cols = cJSON_GetObjectItemCaseSensitive(op, "columns");
    int n = cJSON_IsArray(cols) ? cJSON_GetArraySize(cols) : 0;
    if (n < 2 || n > ETL_CROSS_MAX)
      return dlrec_error(DLREC_ERR_INVALID, "%s: op: 'columns' must list 2 to %d columns", what, ETL_CROSS_MAX);
    for (int k = 0; k < n; k++) {
      int i = input_col((const char(*)[DLREC_NAME_MAX])c->cat, c->n_cat, cJSON_GetArrayItem(cols, k));
      if (i < 0 || c->sep[i])
        return dlrec_error(DLREC_ERR_INVALID, "%s: op: columns[%d] is not a one-hot categorical input column", what, k);
      d->src[d->n_src++] = (uint32_t)i;
    }
    return DLREC_OK;
  }
  const cJSON *col = cJSON_GetObjectItemCaseSensitive(op, "column");
  int i = d->op == ETL_OP_BUCKETIZE ? input_col((const char(*)[DLREC_NAME_MAX])c->dense, c->n_dense, col)
                                    : input_col((const char(*)[DLREC_NAME_MAX])c->cat, c->n_cat, col);
  if (i < 0 || (d->op != ETL_OP_BUCKETIZE && c->sep[i]))
    return dlrec_error(DLREC_ERR_INVALID, "%s: op: 'column' is not a %s input column", what,
                       d->op == ETL_OP_BUCKETIZE ? "dense" : "one-hot categorical");
  d->src[d->n_src++] = (uint32_t)i;
  if (d->op == ETL_OP_BUCKETIZE) {
    uint64_t q = 0;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(op, "boundaries");
    st = dlrec_json_get_u64_or(op, "quantiles", what, 0, &q);
    if (st == DLREC_OK && q && (q < 2 || q > ETL_BOUNDS_MAX))
      st = dlrec_error(DLREC_ERR_INVALID, "%s: op: 'quantiles' must be in [2, %d]", what, ETL_BOUNDS_MAX);
    d->quantiles = (uint32_t)q;
    /* Fitted boundaries may be none (a column without values), at most Q - 1. */
    if (st == DLREC_OK && !(q && cJSON_IsArray(b) && cJSON_GetArraySize(b) == 0)) st = etl_bounds_parse(b, what, d);
    if (st == DLREC_OK && q && d->n_bounds >= q)
      st = dlrec_error(DLREC_ERR_INVALID, "%s: op: more boundaries than quantiles", what);
    return st;
  }
  if (d->op == ETL_OP_TARGET) {
    uint64_t folds = 0;
    st = dlrec_json_get_u64(op, "folds", what, &folds);
    if (st == DLREC_OK) st = dlrec_json_get_double(op, "smoothing", what, &d->smoothing);
    if (st == DLREC_OK) st = dlrec_json_get_u64(op, "seed", what, &d->seed);
    if (st == DLREC_OK && (folds < 2 || folds > ETL_FOLDS_MAX || !(d->smoothing > 0) || !isfinite(d->smoothing)))
      st = dlrec_error(DLREC_ERR_INVALID, "%s: op: expected folds in [2, %d] and a smoothing above 0", what,
                       ETL_FOLDS_MAX);
    d->folds = (uint32_t)folds;
  }
  return st;
}

/* The derived columns (after the n_dense and n_cat input columns). */
static dlrec_status load_derived(dlrec_etl *e, const cJSON *dense, const cJSON *cats, uint32_t n_dense, uint32_t n_cat,
                                 const char *jpath) {
  char what[4200];
  if (e->raw_keys && (n_dense < e->schema.n_dense || n_cat < e->schema.n_sparse))
    return dlrec_error(DLREC_ERR_INVALID, "%s: a raw-keys state has no derived column", jpath);
  for (uint32_t i = n_dense; i < e->schema.n_dense; i++) {
    snprintf(what, sizeof what, "%s: dense[%u]", jpath, i);
    etl_dense *d = &e->dense[i];
    dlrec_status st = parse_op(e, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(dense, (int)i), "op"), what, 1,
                               &d->derived);
    if (st != DLREC_OK) return st;
    if (d->derived.op == ETL_OP_TARGET) d->transform = DLREC_DENSE_NONE;
    if (d->derived.op == ETL_OP_TARGET && !e->schema.has_label)
      return dlrec_error(DLREC_ERR_INVALID, "%s: a target encoding in a state without labels", what);
  }
  for (uint32_t i = n_cat; i < e->schema.n_sparse; i++) {
    snprintf(what, sizeof what, "%s: categorical[%u]", jpath, i);
    etl_cat *c = &e->cat[i];
    dlrec_status st = parse_op(e, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cats, (int)i), "op"), what, 0,
                               &c->derived);
    if (st != DLREC_OK) return st;
    if (c->hashed != (c->derived.op == ETL_OP_CROSS) || c->sep)
      return dlrec_error(DLREC_ERR_INVALID, "%s: a %s column must be %s and one-hot", what, OP_KINDS[c->derived.op],
                         c->hashed ? "a vocabulary" : "hashed");
  }
  return DLREC_OK;
}

/* Checks etl.json's checksum of itself (dlrec_json_check_sealed); a state
 * without the field is refused naming it. */
static dlrec_status check_state_crc(const cJSON *root, const char *text, size_t n, const char *jpath) {
  const char *hex;
  dlrec_status st = dlrec_json_get_string(root, ETL_CRC_KEY, jpath, &hex);
  if (st != DLREC_OK) return st;
  return dlrec_json_check_sealed(text, n, ETL_CRC_KEY, jpath,
                                 "the file was changed or damaged after fit; run 'dlrec etl fit' again");
}

static dlrec_status load_json(dlrec_etl *e, const cJSON *root, const char *text, size_t text_bytes, const char *jpath,
                              uint64_t *vbytes, uint32_t *vcrc) {
  static const char *const keys[] = {"format", "version", "input_format", "fields", "schema_spec", "header", "has_label",
                                     "label", "min_count", "hash_buckets", "dense_transform", "standardize", "rows",
                                     "positives", "bad_rows_skipped", "table_rows", "dense", "categorical", "vocab",
                                     "raw_keys", ETL_CRC_KEY, NULL};
  const char *fmt, *input, *transform;
  uint64_t version, table_rows;
  dlrec_status st = dlrec_json_get_string(root, "format", jpath, &fmt);
  if (st == DLREC_OK && strcmp(fmt, ETL_FORMAT_NAME) != 0)
    st = dlrec_error(DLREC_ERR_INVALID, "%s: not an ETL state (format '%s')", jpath, fmt);
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "version", jpath, &version);
  if (st == DLREC_OK && version != DLREC_ETL_VERSION)
    st = dlrec_error(DLREC_ERR_VERSION, "%s: ETL state version %llu, this dlrec reads version %d%s", jpath,
                     (unsigned long long)version, DLREC_ETL_VERSION,
                     version < DLREC_ETL_VERSION ? " (an older state, without a checksum): run 'dlrec etl fit' again"
                                                 : "");
  /* Before any field is believed. */
  if (st == DLREC_OK) st = check_state_crc(root, text, text_bytes, jpath);
  if (st == DLREC_OK) st = dlrec_json_check_keys(root, jpath, keys);
  if (st == DLREC_OK) st = dlrec_json_get_string(root, "input_format", jpath, &input);
  if (st == DLREC_OK && dlrec_format_parse(input, &e->format) != DLREC_OK)
    st = dlrec_error(DLREC_ERR_INVALID, "%s: field 'input_format': '%s' is not criteo, csv, libsvm or libfm", jpath,
                     input);
  int has_label = 0, standardize = 0;
  if (st == DLREC_OK) st = dlrec_json_get_bool_or(root, "has_label", jpath, -1, &has_label);
  if (st == DLREC_OK && has_label < 0) st = dlrec_error(DLREC_ERR_INVALID, "%s: missing field 'has_label'", jpath);
  e->schema.has_label = has_label;
  if (st == DLREC_OK && has_label) st = get_name(root, "label", jpath, e->schema.label_name);
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "min_count", jpath, &e->min_count);
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "hash_buckets", jpath, &e->hash_buckets);
  if (st == DLREC_OK) st = dlrec_json_get_string(root, "dense_transform", jpath, &transform);
  if (st == DLREC_OK) {
    if (!strcmp(transform, "log1p")) e->transform = DLREC_DENSE_LOG;
    else if (!strcmp(transform, "none")) e->transform = DLREC_DENSE_NONE;
    else st = dlrec_error(DLREC_ERR_INVALID, "%s: field 'dense_transform': expected \"log1p\" or \"none\"", jpath);
  }
  if (st == DLREC_OK) st = dlrec_json_get_bool_or(root, "standardize", jpath, 0, &standardize);
  e->standardize = standardize;
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "rows", jpath, &e->rows);
  if (st == DLREC_OK) st = dlrec_json_get_u64_or(root, "positives", jpath, 0, &e->positives);
  if (st == DLREC_OK) st = dlrec_json_get_u64_or(root, "bad_rows_skipped", jpath, 0, &e->bad_rows);
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "table_rows", jpath, &table_rows);
  if (st == DLREC_OK) st = dlrec_json_get_bool_or(root, "raw_keys", jpath, 0, &e->raw_keys);
  const cJSON *dense, *cats, *vocab;
  if (st == DLREC_OK) st = dlrec_json_get_array(root, "dense", jpath, &dense);
  if (st == DLREC_OK) st = dlrec_json_get_array(root, "categorical", jpath, &cats);
  if (st == DLREC_OK) st = dlrec_json_get_object(root, "vocab", jpath, &vocab);
  if (st == DLREC_OK) st = load_dense(e, dense, jpath);
  if (st == DLREC_OK) st = prepare_fills(e, jpath);
  if (st == DLREC_OK) st = load_cats(e, cats, jpath);
  uint32_t n_dense = 0, n_cat = 0; /* the input's columns */
  if (st == DLREC_OK) st = count_inputs(dense, "dense", &n_dense);
  if (st == DLREC_OK) st = count_inputs(cats, "categorical", &n_cat);
  if (st == DLREC_OK && table_rows != e->schema.table_rows)
    st = dlrec_error(DLREC_ERR_INVALID, "%s: table_rows %llu, the columns add up to %llu", jpath,
                     (unsigned long long)table_rows, (unsigned long long)e->schema.table_rows);
  uint64_t crc = 0;
  const char *vfile;
  if (st == DLREC_OK) st = dlrec_json_get_string(vocab, "file", jpath, &vfile);
  if (st == DLREC_OK && strcmp(vfile, ETL_VOCAB) != 0)
    st = dlrec_error(DLREC_ERR_INVALID, "%s: vocab.file must be \"%s\"", jpath, ETL_VOCAB);
  if (st == DLREC_OK) st = dlrec_json_get_u64(vocab, "bytes", jpath, vbytes);
  if (st == DLREC_OK) st = dlrec_json_get_u64(vocab, "crc32c", jpath, &crc);
  if (st == DLREC_OK && crc > UINT32_MAX) st = dlrec_error(DLREC_ERR_INVALID, "%s: vocab.crc32c out of range", jpath);
  *vcrc = (uint32_t)crc;
  if (st != DLREC_OK) return st;
  /* The input side: Criteo's fixed names, or the CSV header and SPEC. */
  if (e->format == DLREC_FORMAT_CRITEO) {
    dlrec_columns_criteo(&e->cols, has_label);
  } else if (e->format != DLREC_FORMAT_CSV) {
    uint64_t fields = 0;
    if (e->format == DLREC_FORMAT_LIBFM) st = dlrec_json_get_u64(root, "fields", jpath, &fields);
    if (st == DLREC_OK && e->format == DLREC_FORMAT_LIBFM && (fields < 1 || fields > DLREC_MAX_SPARSE))
      st = dlrec_error(DLREC_ERR_INVALID, "%s: field 'fields': %llu is not in [1, %d]", jpath,
                       (unsigned long long)fields, DLREC_MAX_SPARSE);
    if (st == DLREC_OK) st = dlrec_columns_svm(&e->cols, e->format, (uint32_t)fields, has_label, 0, 0);
    if (st != DLREC_OK) return st;
    e->libfm_fields = (uint32_t)fields;
  } else {
    const char *spec;
    const cJSON *header;
    st = dlrec_json_get_string(root, "schema_spec", jpath, &spec);
    if (st == DLREC_OK) st = dlrec_json_get_array(root, "header", jpath, &header);
    if (st != DLREC_OK) return st;
    e->spec = strdup(spec);
    int nh = cJSON_GetArraySize(header);
    size_t bytes = 0;
    for (int i = 0; i < nh; i++) {
      const cJSON *h = cJSON_GetArrayItem(header, i);
      if (!cJSON_IsString(h) || !h->valuestring[0])
        return dlrec_error(DLREC_ERR_INVALID, "%s: header[%d]: expected a non-empty string", jpath, i);
      bytes += sizeof(char *) + strlen(h->valuestring) + 1;
    }
    e->header = malloc(bytes ? bytes : 1);
    if (!e->spec || !e->header) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", jpath);
    char *p = (char *)(e->header + nh);
    for (int i = 0; i < nh; i++) {
      e->header[i] = strcpy(p, cJSON_GetArrayItem(header, i)->valuestring);
      p += strlen(p) + 1;
    }
    e->n_header = (uint32_t)nh;
    dlrec_columns *c = &e->cols;
    memset(c, 0, sizeof *c);
    c->has_label = has_label;
    strcpy(c->label, e->schema.label_name);
    c->n_dense = n_dense;
    c->n_cat = n_cat;
    for (uint32_t i = 0; i < c->n_dense; i++) strcpy(c->dense[i], e->schema.dense_names[i]);
    for (uint32_t i = 0; i < c->n_cat; i++) strcpy(c->cat[i], e->schema.sparse[i].name);
    /* The SPEC as given decides which columns are multi-hot; the state must agree. */
    dlrec_columns from_spec;
    st = dlrec_columns_from_spec(&from_spec, e->spec, (const char *const *)e->header, e->n_header);
    if (st != DLREC_OK) return dlrec_error_context("%s: field 'schema_spec': ", jpath);
    for (uint32_t i = 0; i < c->n_cat && i < from_spec.n_cat; i++) c->sep[i] = from_spec.sep[i];
  }
  /* The columns must be the ones this input format gives. */
  if (e->cols.n_dense != n_dense || e->cols.n_cat != n_cat)
    return dlrec_error(DLREC_ERR_INVALID, "%s: column counts do not match input format %s", jpath, input);
  for (uint32_t i = 0; i < n_dense; i++)
    if (strcmp(e->cols.dense[i], e->schema.dense_names[i]))
      return dlrec_error(DLREC_ERR_INVALID, "%s: dense[%u] is '%s', expected '%s'", jpath, i,
                         e->schema.dense_names[i], e->cols.dense[i]);
  for (uint32_t i = 0; i < n_cat; i++) {
    if (strcmp(e->cols.cat[i], e->schema.sparse[i].name))
      return dlrec_error(DLREC_ERR_INVALID, "%s: categorical[%u] is '%s', expected '%s'", jpath, i,
                         e->schema.sparse[i].name, e->cols.cat[i]);
    dlrec_key_kind want = e->format == DLREC_FORMAT_CRITEO ? DLREC_KEY_HEX
                          : e->format == DLREC_FORMAT_CSV  ? DLREC_KEY_HASH
                                                           : DLREC_KEY_DEC;
    if (e->cat[i].sep != e->cols.sep[i])
      return dlrec_error(DLREC_ERR_INVALID, "%s: categorical[%u]: 'multi' does not match the input format or SPEC",
                         jpath, i);
    if (e->cat[i].key_kind != want || (want == DLREC_KEY_HASH && e->cat[i].salt != dlrec_cat_salt(e->cols.cat[i])))
      return dlrec_error(DLREC_ERR_INVALID, "%s: categorical[%u]: key derivation does not match the input format",
                         jpath, i);
    if (e->raw_keys && (e->cat[i].kept || e->cat[i].hashed))
      return dlrec_error(DLREC_ERR_INVALID, "%s: categorical[%u]: a raw-keys state keeps no values", jpath, i);
  }
  st = load_derived(e, dense, cats, n_dense, n_cat, jpath);
  if (st != DLREC_OK) return st;
  if (e->raw_keys) etl_keys_schema(e);
  return dlrec_schema_validate(&e->schema, jpath);
}

dlrec_status dlrec_etl_load(dlrec_etl **out, const char *dir) {
  *out = NULL;
  char jpath[4096], vpath[4096];
  dlrec_status st = dlrec_path_join(jpath, sizeof jpath, dir, ETL_JSON);
  if (st == DLREC_OK) st = dlrec_path_join(vpath, sizeof vpath, dir, ETL_VOCAB);
  if (st != DLREC_OK) return st;
  dlrec_etl *e = calloc(1, sizeof *e);
  if (!e) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", dir);
  cJSON *root = NULL;
  uint64_t vbytes = 0;
  uint32_t vcrc = 0;
  char *text = NULL;
  size_t text_bytes = 0;
  st = dlrec_read_file(jpath, ETL_JSON_MAX_BYTES, &text, &text_bytes);
  if (st == DLREC_OK) st = dlrec_json_parse(text, text_bytes, jpath, &root);
  if (st == DLREC_OK) st = load_json(e, root, text, text_bytes, jpath, &vbytes, &vcrc);
  cJSON_Delete(root);
  free(text);
  char *buf = NULL;
  size_t n = 0;
  if (st == DLREC_OK) st = dlrec_read_file(vpath, (size_t)1 << 46, &buf, &n);
  if (buf) e->owned[e->n_owned++] = buf;
  if (st == DLREC_OK) st = load_vocab(e, vpath, (unsigned char *)buf, n, vbytes, vcrc);
  if (st == DLREC_OK) st = build_maps(e, vpath);
  if (st == DLREC_OK) st = etl_build_layouts(e);
  if (st != DLREC_OK) {
    dlrec_etl_free(e);
    return st;
  }
  *out = e;
  return DLREC_OK;
}

void dlrec_etl_free(dlrec_etl *e) {
  if (!e) return;
  for (uint32_t i = 0; i < DLREC_MAX_SPARSE; i++) {
    keymap_free(&e->cat[i].map);
    free(e->cat[i].derived.bounds);
  }
  for (uint32_t i = 0; i < DLREC_MAX_DENSE; i++) {
    free(e->dense[i].derived.full);
    free(e->dense[i].derived.oof);
  }
  for (int i = 0; i < e->n_owned; i++) free(e->owned[i]);
  dlrec_layout_free(e->layout[0]);
  dlrec_layout_free(e->layout[1]);
  free(e->spec);
  free(e->header);
  free(e);
}

