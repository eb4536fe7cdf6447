/* The ETL state on disk (etl.json + vocab.bin): saving, and loading with
 * full validation. docs/etl.md specifies both files; vocab.bin is read and
 * written by etl_vocab.c, and each operator of the workflow reads and
 * writes its own part of them (etl_op.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/fsutil.h"
#include "core/json.h"

static cJSON *num(double v) { return cJSON_CreateNumber(v); }

/* A derived column's "op" member (docs/etl.md): its kind, then its
 * operator's members. */
static cJSON *op_json(const dlrec_etl *e, const etl_derived *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", d->type->name);
  d->type->save(&e->cols, d, o);
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
    if (d->derived.type) cJSON_AddItemToObject(o, "op", op_json(e, &d->derived));
    /* The workflow's column operators, those the column has. */
    for (const etl_op_type *const *op = etl_ops; *op; op++)
      if ((*op)->role == ETL_ROLE_COLUMN && (*op)->column_set(&d->ops))
        cJSON_AddItemToObject(o, (*op)->name, (*op)->column_json(&d->ops));
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
    if (c->derived.type) cJSON_AddItemToObject(o, "op", op_json(e, &c->derived));
    else cJSON_AddStringToObject(o, "key", c->key_kind == DLREC_KEY_HEX ? "hex" : c->key_kind == DLREC_KEY_DEC ? "dec" : "hash");
    if (!c->derived.type && c->key_kind == DLREC_KEY_HASH) cJSON_AddStringToObject(o, "salt", salt);
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
      cJSON_AddStringToObject(o, "pooling", dlrec_pooling_name((dlrec_pooling)s->pooling));
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
  if (st == DLREC_OK) st = etl_vocab_save(e, vpath, &bytes, &crc);
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

/* A dense column's operators, as state_json writes them: each column
 * operator's member. */
static dlrec_status load_ops(const cJSON *o, const char *what, etl_dense_ops *ops) {
  memset(ops, 0, sizeof *ops);
  for (const etl_op_type *const *op = etl_ops; *op; op++) {
    const cJSON *v = (*op)->role == ETL_ROLE_COLUMN ? cJSON_GetObjectItemCaseSensitive(o, (*op)->name) : NULL;
    dlrec_status st = v ? (*op)->column_parse(v, what, 1, ops) : DLREC_OK;
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

/* Whether a column operator is set on ops. */
static int any_ops(const etl_dense_ops *ops) {
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role == ETL_ROLE_COLUMN && (*op)->column_set(ops)) return 1;
  return 0;
}

static dlrec_status load_dense(dlrec_etl *e, const cJSON *arr, const char *jpath) {
  int n = cJSON_GetArraySize(arr);
  if (n > DLREC_MAX_DENSE) return dlrec_error(DLREC_ERR_INVALID, "%s: %d dense columns, at most %d", jpath, n, DLREC_MAX_DENSE);
  e->schema.n_dense = (uint32_t)n;
  const char *keys[16] = {"name", "count", "missing", "min", "max", "mean", "std", "op"};
  int k = 8;
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role == ETL_ROLE_COLUMN) keys[k++] = (*op)->name;
  keys[k] = NULL;
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
    if (cJSON_GetObjectItemCaseSensitive(o, "op") && any_ops(&d->ops)) {
      char names[128];
      etl_op_names(ETL_ROLE_COLUMN, " or ", names, sizeof names);
      return dlrec_error(DLREC_ERR_INVALID, "%s: a derived column has no %s", what, names);
    }
  }
  return DLREC_OK;
}

/* Each dense column's encoding of a missing value (0, unless a column
 * operator changes it), once the transform and statistics are known. */
static dlrec_status prepare_columns(dlrec_etl *e, const char *jpath) {
  for (uint32_t i = 0; i < e->schema.n_dense; i++) {
    e->dense[i].fill_out = 0.0f;
    for (const etl_op_type *const *op = etl_ops; *op; op++) {
      dlrec_status st = (*op)->column_prepare ? (*op)->column_prepare(e, i, jpath) : DLREC_OK;
      if (st != DLREC_OK) return st;
    }
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
      dlrec_pooling pool = DLREC_POOLING_SUM;
      if (strlen(multi) != 1 || max_hotness < 1 || max_hotness > 65536 ||
          dlrec_pooling_parse(pooling, strlen(pooling), &pool) != 0)
        return dlrec_error(DLREC_ERR_INVALID,
                           "%s: expected 'multi' of one byte, 'max_hotness' in [1, 65536], 'pooling' sum or mean",
                           what);
      c->sep = multi[0];
      s->max_hotness = (uint32_t)max_hotness;
      s->hotness = max_hotness == 1 ? 1 : 0;
      s->pooling = pool;
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

/* A derived column's "op": its kind, an operator of the column's role,
 * which reads the rest (its sources resolved among the input columns). */
static dlrec_status parse_op(const dlrec_etl *e, const cJSON *op, const char *what, etl_op_role role,
                             etl_derived *d) {
  const char *keys[32] = {"kind"}, *kind;
  int n = 1;
  for (const etl_op_type *const *t = etl_ops; *t; t++)
    for (const char *const *k = (*t)->state_keys; k && *k; k++) {
      int seen = 0;
      for (int i = 0; i < n; i++) seen |= !strcmp(keys[i], *k);
      if (!seen) keys[n++] = *k;
    }
  keys[n] = NULL;
  dlrec_status st = cJSON_IsObject(op) ? dlrec_json_check_keys(op, what, keys)
                                       : dlrec_error(DLREC_ERR_INVALID, "%s: op: expected an object", what);
  if (st == DLREC_OK) st = dlrec_json_get_string(op, "kind", what, &kind);
  if (st != DLREC_OK) return st;
  etl_derived_free(d);
  memset(d, 0, sizeof *d);
  d->type = etl_op_find(kind, role);
  if (!d->type) {
    char names[128];
    etl_op_names(role, ", ", names, sizeof names);
    return dlrec_error(DLREC_ERR_INVALID, "%s: op: kind '%s' is not one of a %s (%s) column", what, kind,
                       role == ETL_ROLE_DENSE ? "dense" : "categorical", names);
  }
  return d->type->load(op, what, &e->cols, d);
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
    dlrec_status st = parse_op(e, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(dense, (int)i), "op"), what,
                               ETL_ROLE_DENSE, &d->derived);
    if (st != DLREC_OK) return st;
    if (d->derived.type->flags & ETL_OP_RAW_VALUE) d->transform = DLREC_DENSE_NONE;
    if ((d->derived.type->flags & ETL_OP_NEEDS_LABEL) && !e->schema.has_label)
      return dlrec_error(DLREC_ERR_INVALID, "%s: a %s encoding in a state without labels", what,
                         d->derived.type->name);
  }
  for (uint32_t i = n_cat; i < e->schema.n_sparse; i++) {
    snprintf(what, sizeof what, "%s: categorical[%u]", jpath, i);
    etl_cat *c = &e->cat[i];
    dlrec_status st = parse_op(e, cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cats, (int)i), "op"), what,
                               ETL_ROLE_CAT, &c->derived);
    if (st != DLREC_OK) return st;
    const int hashed = (c->derived.type->flags & ETL_OP_HASHED) != 0;
    if (c->hashed != hashed || c->sep)
      return dlrec_error(DLREC_ERR_INVALID, "%s: a %s column must be %s and one-hot", what, c->derived.type->name,
                         hashed ? "hashed" : "a vocabulary");
  }
  return DLREC_OK;
}

uint32_t dlrec_etl_state_crc(const dlrec_etl *e) { return e->state_crc; }

/* Checks etl.json's checksum of itself (dlrec_json_check_sealed); a state
 * without the field is refused naming it. */
static dlrec_status check_state_crc(const cJSON *root, const char *text, size_t n, const char *jpath) {
  const char *hex;
  dlrec_status st = dlrec_json_get_string(root, ETL_CRC_KEY, jpath, &hex);
  if (st != DLREC_OK) return st;
  return dlrec_json_check_sealed(text, n, ETL_CRC_KEY, jpath,
                                 "the file was changed or damaged after fit; run 'dlrec etl fit' again");
}

/* The header of etl.json (format, version, checksum, its keys) and the
 * fit's settings and counts. */
static dlrec_status load_settings(dlrec_etl *e, const cJSON *root, const char *text, size_t text_bytes,
                                  const char *jpath) {
  static const char *const keys[] = {"format", "version", "input_format", "fields", "schema_spec", "header", "has_label",
                                     "label", "min_count", "hash_buckets", "dense_transform", "standardize", "rows",
                                     "positives", "bad_rows_skipped", "table_rows", "dense", "categorical", "vocab",
                                     "raw_keys", ETL_CRC_KEY, NULL};
  const char *fmt, *input, *transform;
  uint64_t version;
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
  /* 8 lowercase hex digits, as the check found them. */
  if (st == DLREC_OK)
    e->state_crc = (uint32_t)strtoul(cJSON_GetObjectItemCaseSensitive(root, ETL_CRC_KEY)->valuestring, NULL, 16);
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
  if (st == DLREC_OK) st = dlrec_json_get_bool_or(root, "raw_keys", jpath, 0, &e->raw_keys);
  return st;
}

/* A CSV state's input columns: fit's header and SPEC, the input's n_dense
 * and n_cat columns named as in the schema. */
static dlrec_status load_csv_columns(dlrec_etl *e, const cJSON *root, const char *jpath, uint32_t n_dense,
                                     uint32_t n_cat) {
  const char *spec;
  const cJSON *header;
  dlrec_status st = dlrec_json_get_string(root, "schema_spec", jpath, &spec);
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
  c->has_label = e->schema.has_label;
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
  return DLREC_OK;
}

/* The input side: Criteo's fixed names, libSVM's and libFM's, or the CSV
 * header and SPEC. */
static dlrec_status load_input_columns(dlrec_etl *e, const cJSON *root, const char *jpath, uint32_t n_dense,
                                       uint32_t n_cat) {
  const int has_label = e->schema.has_label;
  if (e->format == DLREC_FORMAT_CRITEO) {
    dlrec_columns_criteo(&e->cols, has_label);
    return DLREC_OK;
  }
  if (e->format == DLREC_FORMAT_CSV) return load_csv_columns(e, root, jpath, n_dense, n_cat);
  uint64_t fields = 0;
  dlrec_status st = DLREC_OK;
  if (e->format == DLREC_FORMAT_LIBFM) st = dlrec_json_get_u64(root, "fields", jpath, &fields);
  if (st == DLREC_OK && e->format == DLREC_FORMAT_LIBFM && (fields < 1 || fields > DLREC_MAX_SPARSE))
    st = dlrec_error(DLREC_ERR_INVALID, "%s: field 'fields': %llu is not in [1, %d]", jpath,
                     (unsigned long long)fields, DLREC_MAX_SPARSE);
  if (st == DLREC_OK) st = dlrec_columns_svm(&e->cols, e->format, (uint32_t)fields, has_label, 0, 0);
  e->libfm_fields = (uint32_t)fields;
  return st;
}

/* The state's input columns must be the ones its input format gives. */
static dlrec_status check_input_columns(const dlrec_etl *e, const char *jpath, uint32_t n_dense, uint32_t n_cat) {
  if (e->cols.n_dense != n_dense || e->cols.n_cat != n_cat)
    return dlrec_error(DLREC_ERR_INVALID, "%s: column counts do not match input format %s", jpath,
                       dlrec_format_name(e->format));
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
  return DLREC_OK;
}

static dlrec_status load_json(dlrec_etl *e, const cJSON *root, const char *text, size_t text_bytes, const char *jpath,
                              uint64_t *vbytes, uint32_t *vcrc) {
  uint64_t table_rows;
  dlrec_status st = load_settings(e, root, text, text_bytes, jpath);
  if (st == DLREC_OK) st = dlrec_json_get_u64(root, "table_rows", jpath, &table_rows);
  const cJSON *dense, *cats, *vocab;
  if (st == DLREC_OK) st = dlrec_json_get_array(root, "dense", jpath, &dense);
  if (st == DLREC_OK) st = dlrec_json_get_array(root, "categorical", jpath, &cats);
  if (st == DLREC_OK) st = dlrec_json_get_object(root, "vocab", jpath, &vocab);
  if (st == DLREC_OK) st = load_dense(e, dense, jpath);
  if (st == DLREC_OK) st = prepare_columns(e, jpath);
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
  if (st == DLREC_OK) st = load_input_columns(e, root, jpath, n_dense, n_cat);
  if (st == DLREC_OK) st = check_input_columns(e, jpath, n_dense, n_cat);
  if (st == DLREC_OK) st = load_derived(e, dense, cats, n_dense, n_cat, jpath);
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
  if (st == DLREC_OK) st = etl_vocab_load(e, vpath, (unsigned char *)buf, n, vbytes, vcrc);
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
    etl_derived_free(&e->cat[i].derived);
  }
  for (uint32_t i = 0; i < DLREC_MAX_DENSE; i++) etl_derived_free(&e->dense[i].derived);
  for (int i = 0; i < e->n_owned; i++) free(e->owned[i]);
  dlrec_layout_free(e->layout[0]);
  dlrec_layout_free(e->layout[1]);
  free(e->spec);
  free(e->header);
  free(e);
}

