/* The loaded ETL state at work: accessors, the line layouts of
 * encode_line, and the encoders that apply and serving share (the
 * per-value parts are inline in etl_internal.h). */
#include <stdlib.h>
#include <string.h>

#include "data/etl_internal.h"

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

static int same_bits(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

/* What a's and b's derived column d reads to encode, from its definition to
 * its tables: counts of a count encoding's source, a target encoding's
 * statistics, a bucketized column's boundaries. */
static int same_derived(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  if (x->op != y->op || x->n_src != y->n_src || !same_bits(x->src, y->src, x->n_src * sizeof *x->src)) return 0;
  if (x->op == ETL_OP_BUCKETIZE)
    return x->n_bounds == y->n_bounds && same_bits(x->bounds, y->bounds, x->n_bounds * sizeof *x->bounds);
  if (x->op == ETL_OP_TARGET)
    return x->folds == y->folds && x->groups == y->groups && x->seed == y->seed &&
           same_bits(&x->smoothing, &y->smoothing, sizeof x->smoothing) &&
           same_bits(x->stats, y->stats, 16 * x->folds * x->groups);
  if (x->op == ETL_OP_COUNT) {
    const etl_cat *p = &a->cat[x->src[0]], *q = &b->cat[y->src[0]];
    if (p->hashed != q->hashed || p->size != q->size) return 0;
    return same_bits(p->hashed ? p->bucket_counts : p->counts, q->hashed ? q->bucket_counts : q->counts,
                     (p->size - ETL_LOCAL_FIRST) * sizeof(uint64_t));
  }
  return 1; /* a cross: its buckets are the column's, compared with it */
}

dlrec_status dlrec_etl_same_operators(const dlrec_etl *a, const dlrec_etl *b) {
  if (a->schema.n_dense != b->schema.n_dense || a->schema.n_sparse != b->schema.n_sparse ||
      a->cols.n_dense != b->cols.n_dense || a->cols.n_cat != b->cols.n_cat)
    return dlrec_error(DLREC_ERR_INVALID, "other columns");
  for (uint32_t i = 0; i < a->schema.n_dense; i++) {
    const etl_dense *x = &a->dense[i], *y = &b->dense[i];
    const etl_dense_ops *p = &x->ops, *q = &y->ops;
    if (p->fill != q->fill || p->clip != q->clip || x->transform != y->transform ||
        (p->fill && !same_bits(&p->fill_value, &q->fill_value, sizeof p->fill_value)) ||
        (p->clip && (!same_bits(&p->clip_lo, &q->clip_lo, sizeof p->clip_lo) ||
                     !same_bits(&p->clip_hi, &q->clip_hi, sizeof p->clip_hi))))
      return dlrec_error(DLREC_ERR_INVALID, "dense column '%s': another fill_missing or clip", a->schema.dense_names[i]);
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

/* What a row's encoder knows of its input fields already: each one-hot
 * categorical field's key (valid where the field is not empty) and local id,
 * and each dense field's parsed value (valid where it is not empty). */
typedef struct known_cats {
  const uint64_t *keys;
  const uint32_t *local;
  const double *x;
} known_cats;

/* The key of a one-hot input column's field, a derived column's source
 * (DLREC_ETL_MISSING_KEY when empty; the key was checked when the column
 * itself was encoded). */
static uint64_t source_key(const dlrec_etl *e, const known_cats *k, uint32_t c, dlrec_text t) {
  uint64_t key = DLREC_ETL_MISSING_KEY;
  if (t.n && k) key = k->keys[c];
  else if (t.n) dlrec_cat_key(e->cat[c].key_kind, e->cat[c].salt, t.s, t.n, &key);
  return key;
}

/* The derived columns of a row, from its input fields (and what is known of
 * them: NULL, nothing): dense[i] and ids[i] for the i-th derived dense and
 * categorical column. */
static dlrec_status encode_derived(const dlrec_etl *e, const dlrec_layout *L, const dlrec_text *din,
                                   const dlrec_text *cin, const known_cats *known, const dlrec_where *w,
                                   const etl_pos *pos, float *dense, uint32_t *ids) {
  const uint32_t nd = e->cols.n_dense, nc = e->cols.n_cat, nd_derived = e->schema.n_dense - nd;
  /* The encodings' values are random reads of per-value tables: their
   * addresses first, prefetched, so that the cache misses overlap each other
   * and the categorical columns' work below. */
  const void *val[DLREC_MAX_DENSE];
  for (uint32_t i = 0; i < nd_derived; i++) {
    const etl_derived *dv = &e->dense[nd + i].derived;
    const uint32_t c = dv->src[0];
    const etl_cat *src = &e->cat[c];
    uint64_t g = ETL_LOCAL_MISSING;
    if (known) {
      g = known->local[c];
    } else if (cin[c].n) {
      const uint64_t key = source_key(e, NULL, c, cin[c]);
      g = etl_cat_local(src, key, keymap_hash(key));
    }
    if (dv->op == ETL_OP_COUNT)
      val[i] = etl_count_at(src, g);
    else if (pos)
      val[i] = &dv->oof[(uint64_t)etl_fold(dv->seed, dv->folds, pos->file, pos->line) * dv->groups + g];
    else
      val[i] = &dv->full[g];
    __builtin_prefetch(val[i]);
  }
  for (uint32_t i = 0; nc + i < e->schema.n_sparse; i++) {
    const etl_cat *k = &e->cat[nc + i];
    const etl_derived *dv = &k->derived;
    uint64_t local = ETL_LOCAL_MISSING;
    if (dv->op == ETL_OP_CROSS) {
      uint64_t keys[ETL_CROSS_MAX];
      int any = 0;
      for (uint32_t j = 0; j < dv->n_src; j++) {
        any |= cin[dv->src[j]].n != 0;
        keys[j] = source_key(e, known, dv->src[j], cin[dv->src[j]]);
      }
      const uint64_t h = etl_cross_key(keys, dv->n_src);
      if (any) local = etl_cat_local(k, h, keymap_hash(h));
    } else {
      const uint32_t d = dv->src[0];
      const etl_dense_ops *ops = &e->dense[d].ops;
      const dlrec_text t = din[d];
      double x = ops->fill_value;
      const char *why = NULL;
      if (t.n && known) x = known->x[d];
      else if (t.n) why = dlrec_parse_number(t.s, t.n, &x);
      if (why) return dlrec_parse_error(w, L->dense_field[d], e->schema.dense_names[d], why, t.s, t.n);
      if (t.n || ops->fill) {
        const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, etl_clip(ops, x));
        local = etl_cat_local(k, b, keymap_hash(b));
      }
    }
    ids[i] = (uint32_t)(k->id_begin + local);
  }
  for (uint32_t i = 0; i < nd_derived; i++) {
    const double x = e->dense[nd + i].derived.op == ETL_OP_COUNT ? (double)*(const uint64_t *)val[i]
                                                                  : *(const double *)val[i];
    const char *why = etl_dense_encode(e, nd + i, x, &dense[i]);
    if (why) return dlrec_error(DLREC_ERR_PARSE, "column %s: %s", e->schema.dense_names[nd + i], why);
  }
  return DLREC_OK;
}

dlrec_status dlrec_etl_encode_derived(const dlrec_etl *e, const dlrec_text *dense_in, const dlrec_text *cat_in,
                                      float *dense, uint32_t *ids) {
  return encode_derived(e, default_layout(e), dense_in, cat_in, NULL, NULL, NULL, dense, ids);
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
    const known_cats known = {keys, local, x};
    return encode_derived(e, L, row->dense, row->cat, &known, w, pos, dense + nd, ids + nc);
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
  const known_cats known = {keys, local, x};
  return encode_derived(e, L, row->dense, row->cat, &known, w, pos, dense + nd, ids + at);
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
  if (with_label && !e->schema.has_label)
    return dlrec_error(DLREC_ERR_INVALID, "encode_line: the ETL state has no label column");
  const dlrec_layout *L = e->layout[with_label ? 1 : 0];
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
