/* The loaded ETL state at work: accessors, the line layouts of
 * encode_line, and the encoders that apply and serving share (the
 * per-value parts are inline in etl_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "data/etl_op.h"

/* A CSV header line for names (each quoted, so any name survives). */
static char *header_line(char *const *names, uint32_t n, const char *skip, size_t *len) {
  size_t cap = 1;
  for (uint32_t i = 0; i < n; i++) cap += 2 * strlen(names[i]) + 3;
  char *s = malloc(cap), *p = s;
  if (!s) return NULL;
  int first = 1;
  for (uint32_t i = 0; i < n; i++) {
    if (skip && !strcmp(names[i], skip)) continue;
    if (!first) *p++ = ',';
    first = 0;
    *p++ = '"';
    for (const char *q = names[i]; *q; q++) {
      if (*q == '"') *p++ = '"';
      *p++ = *q;
    }
    *p++ = '"';
  }
  *p = '\0';
  *len = (size_t)(p - s);
  return s;
}

dlrec_status etl_build_layouts(dlrec_etl *e) {
  for (int with = 0; with <= 1; with++) {
    if (with && !e->schema.has_label) break;
    dlrec_status st;
    if (e->format == DLREC_FORMAT_CRITEO) {
      st = dlrec_layout_criteo(&e->layout[with], with);
    } else if (e->format != DLREC_FORMAT_CSV) {
      st = dlrec_layout_svm(&e->layout[with], &e->cols, e->format, with);
    } else {
      size_t len;
      char *line = header_line(e->header, e->n_header, with ? NULL : e->schema.label_name, &len);
      if (!line) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
      st = dlrec_layout_csv(&e->layout[with], &e->cols, with, line, len, "etl.json header");
      free(line);
    }
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

void etl_keys_schema(dlrec_etl *e) {
  dlrec_schema *s = &e->schema;
  e->vocab_rows = s->table_rows;
  s->keys = 1;
  s->table_rows = DLREC_KEYS_RANGE;
  e->multi = 1;
  e->ids_max = 0;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    dlrec_sparse_col *col = &s->sparse[c];
    col->hotness *= 2;
    col->max_hotness *= 2;
    col->id_begin = 0;
    col->id_end = DLREC_KEYS_RANGE;
    e->ids_max += col->max_hotness;
  }
}

/* ---- accessors ---- */

const dlrec_schema *dlrec_etl_schema(const dlrec_etl *e) { return &e->schema; }
dlrec_input_format dlrec_etl_format(const dlrec_etl *e) { return e->format; }
uint64_t dlrec_etl_rows(const dlrec_etl *e) { return e->rows; }
uint64_t dlrec_etl_positives(const dlrec_etl *e) { return e->positives; }

const char *const *dlrec_etl_header(const dlrec_etl *e, uint32_t *n) {
  *n = e->n_header;
  return (const char *const *)e->header;
}

dlrec_status dlrec_etl_dense_info_get(const dlrec_etl *e, uint32_t col, dlrec_etl_dense_info *out) {
  if (col >= e->schema.n_dense)
    return dlrec_error(DLREC_ERR_INVALID, "dense column %u out of range (%u columns)", col, e->schema.n_dense);
  const etl_dense *d = &e->dense[col];
  *out = (dlrec_etl_dense_info){d->count, d->missing, d->min, d->max, d->mean, d->std, e->transform, e->standardize};
  return DLREC_OK;
}

dlrec_status dlrec_etl_cat_info_get(const dlrec_etl *e, uint32_t col, dlrec_etl_cat_info *out) {
  if (col >= e->schema.n_sparse)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column %u out of range (%u columns)", col, e->schema.n_sparse);
  const etl_cat *c = &e->cat[col];
  *out = (dlrec_etl_cat_info){
      .key_kind = c->key_kind,
      .salt = c->salt,
      .hashed = c->hashed,
      .size = c->size,
      .id_begin = c->id_begin,
      .id_end = c->id_begin + c->size,
      .distinct = c->distinct,
      .kept = c->kept,
      .missing = c->missing,
      .oov = c->oov,
      .keys = c->hashed ? NULL : c->keys,
      .counts = c->hashed ? NULL : c->counts,
      .bucket_rank = c->hashed ? c->bucket_rank : NULL,
      .bucket_counts = c->hashed ? c->bucket_counts : NULL,
      .buckets = c->buckets,
  };
  return DLREC_OK;
}

/* ---- comparing operators ---- */

/* What a's and b's derived column reads to encode, from its definition to
 * its tables (its operator's part). */
static int same_derived(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  if (x->type != y->type || x->n_src != y->n_src || !etl_same_bits(x->src, y->src, x->n_src * sizeof *x->src))
    return 0;
  return !x->type || x->type->same(a, b, x, y);
}

/* Whether dense columns x and y read their fields alike: the transform and
 * every column operator. */
static int same_column_ops(const etl_dense *x, const etl_dense *y) {
  if (x->transform != y->transform) return 0;
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role == ETL_ROLE_COLUMN && !(*op)->column_same(&x->ops, &y->ops)) return 0;
  return 1;
}

dlrec_status dlrec_etl_same_operators(const dlrec_etl *a, const dlrec_etl *b) {
  if (a->schema.n_dense != b->schema.n_dense || a->schema.n_sparse != b->schema.n_sparse ||
      a->cols.n_dense != b->cols.n_dense || a->cols.n_cat != b->cols.n_cat)
    return dlrec_error(DLREC_ERR_INVALID, "other columns");
  for (uint32_t i = 0; i < a->schema.n_dense; i++) {
    const etl_dense *x = &a->dense[i], *y = &b->dense[i];
    if (!same_column_ops(x, y)) {
      char names[128];
      etl_op_names(ETL_ROLE_COLUMN, " or ", names, sizeof names);
      return dlrec_error(DLREC_ERR_INVALID, "dense column '%s': another %s", a->schema.dense_names[i], names);
    }
    if (!same_derived(a, b, &x->derived, &y->derived))
      return dlrec_error(DLREC_ERR_INVALID, "dense column '%s': derived otherwise (its operator or statistics differ)",
                         a->schema.dense_names[i]);
  }
  for (uint32_t i = 0; i < a->schema.n_sparse; i++)
    if (!same_derived(a, b, &a->cat[i].derived, &b->cat[i].derived))
      return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': derived otherwise (its operator or boundaries "
                         "differ)", a->schema.sparse[i].name);
  return DLREC_OK;
}

/* ---- encoders ---- */

double etl_log1p_table[ETL_LOG_TABLE];

__attribute__((constructor)) static void init_log1p_table(void) {
  for (int i = 0; i < ETL_LOG_TABLE; i++) etl_log1p_table[i] = log1p((double)i);
}

static const dlrec_layout *default_layout(const dlrec_etl *e) { return e->layout[e->schema.has_label ? 1 : 0]; }

/* A derived column has no field of its own. */
static dlrec_status no_field(const char *kind, const char *name) {
  return dlrec_error(DLREC_ERR_INVALID, "%s column '%s' is derived from other columns (the ETL workflow): encode whole "
                     "rows (dlrec_etl_encode_line), or the input's fields and then dlrec_etl_encode_derived", kind, name);
}

dlrec_status dlrec_etl_encode_dense(const dlrec_etl *e, uint32_t col, const char *s, size_t n, float *out) {
  if (col >= e->schema.n_dense)
    return dlrec_error(DLREC_ERR_INVALID, "dense column %u out of range (%u columns)", col, e->schema.n_dense);
  if (col >= e->cols.n_dense) return no_field("dense", e->schema.dense_names[col]);
  const char *why = etl_dense_value(e, col, s, n, out);
  if (!why) return DLREC_OK;
  const dlrec_layout *L = default_layout(e);
  return dlrec_parse_error(NULL, dlrec_layout_dense_field(L, col), e->schema.dense_names[col], why, s, n);
}

dlrec_status dlrec_etl_encode_cat(const dlrec_etl *e, uint32_t col, const char *s, size_t n, uint32_t *id) {
  if (col >= e->schema.n_sparse)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column %u out of range (%u columns)", col, e->schema.n_sparse);
  if (col >= e->cols.n_cat) return no_field("categorical", e->schema.sparse[col].name);
  /* Its text would read as one value, separators and all. */
  if (e->cat[col].sep)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s' is multi-hot: use dlrec_etl_encode_line_multi",
                       e->schema.sparse[col].name);
  if (e->raw_keys)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s' holds raw keys, two ids a value: use "
                       "dlrec_etl_encode_cat_multi", e->schema.sparse[col].name);
  const char *why = etl_cat_id(e, col, s, n, id);
  if (!why) return DLREC_OK;
  const dlrec_layout *L = default_layout(e);
  return dlrec_parse_error(NULL, dlrec_layout_cat_field(L, col), e->schema.sparse[col].name, why, s, n);
}

/* Column c's raw key for a value's key, as its two ids (low, high): 2. */
static uint32_t put_raw_key(uint32_t *ids, uint32_t c, uint64_t key) {
  const uint64_t k = etl_raw_key(c, key);
  ids[0] = (uint32_t)k;
  ids[1] = (uint32_t)(k >> 32);
  return 2;
}

/* A multi-hot column's ids: each value's, in order, at most max hotness
 * (raw keys: two ids a value, at most max hotness ids). */
static dlrec_status encode_multi(const dlrec_etl *e, const dlrec_layout *L, uint32_t c, dlrec_text t,
                                 const dlrec_where *w, uint32_t *ids, uint32_t *n_out, uint32_t *truncated) {
  const etl_cat *k = &e->cat[c];
  const uint32_t max = e->schema.sparse[c].max_hotness;
  const char *p = t.s, *end = t.s + t.n, *v;
  size_t vn;
  uint32_t n = 0;
  while (etl_next_value(&p, end, k->sep, &v, &vn)) {
    if (n == max) {
      if (truncated) (*truncated)++;
      break;
    }
    uint64_t key;
    const char *why = dlrec_cat_key(k->key_kind, k->salt, v, vn, &key);
    if (why) return dlrec_parse_error(w, L->cat_field[c], e->schema.sparse[c].name, why, v, vn);
    if (e->raw_keys) n += put_raw_key(ids + n, c, key);
    else ids[n++] = (uint32_t)(k->id_begin + etl_cat_local(k, key, keymap_hash(key)));
  }
  if (n == 0 && e->raw_keys) n = put_raw_key(ids, c, DLREC_ETL_MISSING_KEY);
  if (n == 0) ids[n++] = (uint32_t)(k->id_begin + ETL_LOCAL_MISSING);
  *n_out = n;
  return DLREC_OK;
}

dlrec_status dlrec_etl_encode_cat_multi(const dlrec_etl *e, uint32_t col, const char *s, size_t n, uint32_t *ids,
                                        uint32_t *n_ids, uint32_t *truncated) {
  if (col >= e->schema.n_sparse)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column %u out of range (%u columns)", col, e->schema.n_sparse);
  if (col >= e->cols.n_cat) return no_field("categorical", e->schema.sparse[col].name);
  if (!e->cat[col].sep && e->raw_keys) {
    uint64_t key = DLREC_ETL_MISSING_KEY;
    const char *why = n ? dlrec_cat_key(e->cat[col].key_kind, e->cat[col].salt, s, n, &key) : NULL;
    if (why)
      return dlrec_parse_error(NULL, dlrec_layout_cat_field(default_layout(e), col), e->schema.sparse[col].name, why,
                               s, n);
    *n_ids = put_raw_key(ids, col, key);
    return DLREC_OK;
  }
  if (!e->cat[col].sep) {
    *n_ids = 1;
    return dlrec_etl_encode_cat(e, col, s, n, ids);
  }
  /* The same function a line's multi-hot field goes through, so a field
   * given alone encodes exactly as inside its line. */
  if (n > UINT32_MAX)
    return dlrec_error(DLREC_ERR_PARSE, "categorical column '%s': a field of %zu bytes", e->schema.sparse[col].name, n);
  const dlrec_text t = {.s = s, .n = (uint32_t)n};
  return encode_multi(e, default_layout(e), col, t, NULL, ids, n_ids, truncated);
}

/* The derived columns of row r: dense[i] and ids[i] for the i-th derived
 * dense and categorical column, each from its operator. */
static dlrec_status encode_derived(const etl_row *r, float *dense, uint32_t *ids) {
  const dlrec_etl *e = r->e;
  const uint32_t nd = e->cols.n_dense, nc = e->cols.n_cat, nd_derived = e->schema.n_dense - nd;
  /* The encodings' values are random reads of per-value tables: their
   * addresses first, prefetched, so that the cache misses overlap each other
   * and the categorical columns' work below. */
  const void *val[DLREC_MAX_DENSE];
  for (uint32_t i = 0; i < nd_derived; i++) {
    const etl_derived *dv = &e->dense[nd + i].derived;
    val[i] = dv->type->locate(r, dv);
    __builtin_prefetch(val[i]);
  }
  for (uint32_t i = 0; nc + i < e->schema.n_sparse; i++) {
    const etl_cat *k = &e->cat[nc + i];
    uint64_t local = ETL_LOCAL_MISSING;
    dlrec_status st = k->derived.type->encode_cat(r, &k->derived, k, &local);
    if (st != DLREC_OK) return st;
    ids[i] = (uint32_t)(k->id_begin + local);
  }
  for (uint32_t i = 0; i < nd_derived; i++) {
    const double x = e->dense[nd + i].derived.type->value(val[i]);
    const char *why = etl_dense_encode(e, nd + i, x, &dense[i]);
    if (why) return dlrec_error(DLREC_ERR_PARSE, "column %s: %s", e->schema.dense_names[nd + i], why);
  }
  return DLREC_OK;
}

dlrec_status dlrec_etl_encode_derived(const dlrec_etl *e, const dlrec_text *dense_in, const dlrec_text *cat_in,
                                      float *dense, uint32_t *ids) {
  const etl_row r = {.e = e, .L = default_layout(e), .din = dense_in, .cin = cat_in};
  return encode_derived(&r, dense, ids);
}

void dlrec_etl_input_columns(const dlrec_etl *e, uint32_t *n_dense, uint32_t *n_cat) {
  *n_dense = e->cols.n_dense;
  *n_cat = e->cols.n_cat;
}

dlrec_status etl_encode_row(const dlrec_etl *e, const dlrec_layout *L, const dlrec_raw_row *row, int with_label,
                            const dlrec_where *w, const etl_pos *pos, float *label, float *dense, uint32_t *ids,
                            uint32_t *nids, uint32_t *truncated) {
  const char *why;
  if (with_label && (why = dlrec_parse_label(row->label.s, row->label.n, label)) != NULL)
    return dlrec_parse_error(w, L->label_field, e->schema.label_name, why, row->label.s, row->label.n);
  /* Keys first, with their table slots prefetched, so that the cache misses
   * of a row's lookups overlap each other and the dense parsing. */
  uint64_t keys[DLREC_MAX_SPARSE], hashes[DLREC_MAX_SPARSE];
  const uint32_t nc = e->cols.n_cat, nd = e->cols.n_dense;
  const int derived = nc < e->schema.n_sparse || nd < e->schema.n_dense;
  for (uint32_t c = 0; c < nc; c++) {
    const dlrec_text t = row->cat[c];
    if (t.n == 0 || e->cat[c].sep) continue;
    if ((why = dlrec_cat_key(e->cat[c].key_kind, e->cat[c].salt, t.s, t.n, &keys[c])) != NULL)
      return dlrec_parse_error(w, L->cat_field[c], e->schema.sparse[c].name, why, t.s, t.n);
    hashes[c] = keymap_hash(keys[c]);
    if (!e->cat[c].hashed && !e->raw_keys) keymap_prefetch(&e->cat[c].map, hashes[c]);
  }
  double x[DLREC_MAX_DENSE]; /* the parsed values, for the derived columns */
  for (uint32_t d = 0; d < nd; d++) {
    const dlrec_text t = row->dense[d];
    if ((why = etl_dense_value_x(e, d, t.s, t.n, &dense[d], &x[d])) != NULL)
      return dlrec_parse_error(w, L->dense_field[d], e->schema.dense_names[d], why, t.s, t.n);
  }
  if (!e->multi) {
    for (uint32_t c = 0; c < nc; c++) {
      const etl_cat *k = &e->cat[c];
      ids[c] = (uint32_t)(k->id_begin + (row->cat[c].n == 0 ? ETL_LOCAL_MISSING : etl_cat_local(k, keys[c], hashes[c])));
      if (nids) nids[c] = 1;
    }
    if (!derived) return DLREC_OK;
    uint32_t local[DLREC_MAX_SPARSE];
    for (uint32_t c = 0; c < nc; c++) local[c] = ids[c] - (uint32_t)e->cat[c].id_begin;
    for (uint32_t c = nc; nids && c < e->schema.n_sparse; c++) nids[c] = 1;
    const etl_row r = {e, L, w, row->dense, row->cat, keys, local, x, pos};
    return encode_derived(&r, dense + nd, ids + nc);
  }
  uint32_t at = 0;
  for (uint32_t c = 0; c < nc; c++) {
    const etl_cat *k = &e->cat[c];
    if (k->sep) {
      dlrec_status st = encode_multi(e, L, c, row->cat[c], w, ids + at, &nids[c], truncated);
      if (st != DLREC_OK) return st;
      at += nids[c];
      continue;
    }
    if (e->raw_keys) {
      nids[c] = put_raw_key(ids + at, c, row->cat[c].n == 0 ? DLREC_ETL_MISSING_KEY : keys[c]);
      at += nids[c];
      continue;
    }
    ids[at++] = (uint32_t)(k->id_begin + (row->cat[c].n == 0 ? ETL_LOCAL_MISSING : etl_cat_local(k, keys[c], hashes[c])));
    nids[c] = 1;
  }
  for (uint32_t c = nc; c < e->schema.n_sparse; c++) nids[c] = 1;
  if (!derived) return DLREC_OK;
  /* The sources are one-hot columns: their one id each. */
  uint32_t local[DLREC_MAX_SPARSE];
  for (uint32_t c = 0, k = 0; c < nc; k += nids[c++])
    local[c] = e->cat[c].sep ? 0 : ids[k] - (uint32_t)e->cat[c].id_begin;
  const etl_row r = {e, L, w, row->dense, row->cat, keys, local, x, pos};
  return encode_derived(&r, dense + nd, ids + at);
}

dlrec_status dlrec_etl_encode_line(const dlrec_etl *e, const char *line, size_t n, int with_label, float *label,
                                   float *dense, uint32_t *ids) {
  int short_row;
  return dlrec_etl_encode_line_checked(e, line, n, with_label, 0, label, dense, ids, &short_row);
}

dlrec_status dlrec_etl_encode_line_checked(const dlrec_etl *e, const char *line, size_t n, int with_label,
                                           int strict_fields, float *label, float *dense, uint32_t *ids,
                                           int *short_row) {
  *short_row = 0;
  /* One id per column is all this interface can return. */
  if (e->multi)
    return dlrec_error(DLREC_ERR_INVALID,
                       "encode_line: the ETL state has multi-hot columns: use dlrec_etl_encode_line_multi");
  if (with_label && !e->schema.has_label)
    return dlrec_error(DLREC_ERR_INVALID, "encode_line: the ETL state has no label column");
  const dlrec_layout *L = e->layout[with_label ? 1 : 0];
  /* One row view per thread, and a scratch buffer on the stack for the usual
   * short lines: serving calls this per request row, so no allocation here. */
  static _Thread_local dlrec_raw_row row;
  char small[4096];
  char *scratch = small;
  if (e->format != DLREC_FORMAT_CRITEO && n >= sizeof small) {
    scratch = malloc(n + 1);
    if (!scratch) return dlrec_error(DLREC_ERR_NOMEM, "encode_line: out of memory");
  }
  dlrec_status st = dlrec_parse_row(L, line, n, scratch, &row, NULL);
  if (st == DLREC_OK) *short_row = etl_short_row(L, &row, strict_fields, NULL, &st);
  if (st == DLREC_OK) st = etl_encode_row(e, L, &row, with_label, NULL, NULL, label, dense, ids, NULL, NULL);
  if (scratch != small) free(scratch);
  return st;
}

uint64_t dlrec_etl_ids_max(const dlrec_etl *e) { return e->ids_max; }

dlrec_status dlrec_etl_encode_line_multi(const dlrec_etl *e, const char *line, size_t n, int with_label,
                                         float *label, float *dense, uint32_t *ids, uint32_t *nids,
                                         uint32_t *truncated) {
  return dlrec_etl_encode_line_in(e, NULL, line, n, with_label, label, dense, ids, nids, truncated);
}

dlrec_status dlrec_etl_header_layout(const dlrec_etl *e, const char *header, size_t n, int with_label,
                                     const char *file, dlrec_layout **out) {
  *out = NULL;
  if (e->format != DLREC_FORMAT_CSV)
    return dlrec_error(DLREC_ERR_INVALID, "%s: the ETL state reads %s rows, which have no header", file,
                       dlrec_format_name(e->format));
  if (with_label && !e->schema.has_label)
    return dlrec_error(DLREC_ERR_INVALID, "%s: the ETL state has no label column", file);
  dlrec_status st = dlrec_layout_csv(out, &e->cols, with_label, header, n, file);
  if (st != DLREC_OK) return st;
  dlrec_etl_warn_unknown_columns(e, *out, with_label, file);
  return DLREC_OK;
}

void dlrec_etl_warn_unknown_columns(const dlrec_etl *e, const dlrec_layout *L, int with_label, const char *file) {
  if (e->format != DLREC_FORMAT_CSV) return;
  for (uint32_t f = 0; f < L->n_fields; f++) {
    if (L->role[f] != DLREC_ROLE_IGNORE) continue;
    const char *name = L->names[f];
    int known = 0;
    for (uint32_t h = 0; h < e->n_header && !known; h++) known = !strcmp(e->header[h], name);
    if (!known && !(!with_label && !strcmp(name, e->schema.label_name)))
      DLREC_WARN("%s: column '%s' was not in fit's input; ignored", file, name);
  }
}

dlrec_status dlrec_etl_encode_line_in(const dlrec_etl *e, const dlrec_layout *L, const char *line, size_t n,
                                      int with_label, float *label, float *dense, uint32_t *ids, uint32_t *nids,
                                      uint32_t *truncated) {
  if (with_label && !e->schema.has_label)
    return dlrec_error(DLREC_ERR_INVALID, "encode_line: the ETL state has no label column");
  if (L && dlrec_layout_has_label(L) != (with_label != 0))
    return dlrec_error(DLREC_ERR_INVALID, "encode_line: the layout %s a label column", with_label ? "lacks" : "has");
  if (!L) L = e->layout[with_label ? 1 : 0];
  static _Thread_local dlrec_raw_row row;
  char small[4096];
  char *scratch = small;
  if (e->format != DLREC_FORMAT_CRITEO && n >= sizeof small) {
    scratch = malloc(n + 1);
    if (!scratch) return dlrec_error(DLREC_ERR_NOMEM, "encode_line: out of memory");
  }
  uint32_t tr = 0;
  dlrec_status st = dlrec_parse_row(L, line, n, scratch, &row, NULL);
  if (st == DLREC_OK) st = etl_encode_row(e, L, &row, with_label, NULL, NULL, label, dense, ids, nids, &tr);
  if (truncated) *truncated = tr;
  if (scratch != small) free(scratch);
  return st;
}
