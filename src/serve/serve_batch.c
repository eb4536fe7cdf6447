/* Parsed inference requests -> encoded model rows (the raw and the
 * HugeCTR-style conventions of serve_batch.h), and the growable rows that
 * several requests share for dynamic batching. */
#include "serve/serve_batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fewest rows a rows object allocates for. */
#define MIN_ROWS 16

struct dlrec_serve_rows {
  dlrec_schema schema;
  const dlrec_etl *etl;
  uint32_t rows, cap_rows;
  float *dense;                              /* (cap_rows, n_dense) */
  uint32_t *offsets[DLREC_MAX_SPARSE];       /* (cap_rows + 1) per column */
  uint32_t *ids[DLREC_MAX_SPARSE];           /* (cap_ids[c]) per column */
  uint32_t n_ids[DLREC_MAX_SPARSE], cap_ids[DLREC_MAX_SPARSE];
};

/* ---- buffers ---- */

static uint32_t grown(uint32_t cap, uint64_t need) {
  uint64_t c = (uint64_t)cap * 2;
  if (c < need) c = need;
  if (c < MIN_ROWS) c = MIN_ROWS;
  return c > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)c;
}

/* Room for `rows` rows in all. */
static dlrec_status grow_rows(dlrec_serve_rows *r, uint64_t rows) {
  if (rows <= r->cap_rows) return DLREC_OK;
  if (rows > UINT32_MAX - 1) return dlrec_error(DLREC_ERR_INVALID, "serve rows: more than 2^32 - 2 rows");
  uint32_t cap = grown(r->cap_rows, rows);
  const dlrec_schema *s = &r->schema;
  /* Each array keeps its old contents; cap_rows changes only once all have grown. */
  float *d = realloc(r->dense, (size_t)cap * (s->n_dense ? s->n_dense : 1) * sizeof *d);
  if (!d) return dlrec_error(DLREC_ERR_NOMEM, "serve rows: out of memory for %u rows", cap);
  r->dense = d;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    uint32_t *o = realloc(r->offsets[c], ((size_t)cap + 1) * sizeof *o);
    if (!o) return dlrec_error(DLREC_ERR_NOMEM, "serve rows: out of memory for %u rows", cap);
    r->offsets[c] = o;
  }
  r->cap_rows = cap;
  return DLREC_OK;
}

/* Room for `n` ids in all in column c. */
static dlrec_status grow_ids(dlrec_serve_rows *r, uint32_t c, uint64_t n) {
  if (n <= r->cap_ids[c]) return DLREC_OK;
  if (n > UINT32_MAX) return dlrec_error(DLREC_ERR_INVALID, "serve rows: column %s: more than 2^32 - 1 ids",
                                         r->schema.sparse[c].name);
  uint32_t cap = grown(r->cap_ids[c], n);
  if (cap < n) cap = (uint32_t)n;
  uint32_t *p = realloc(r->ids[c], (size_t)cap * sizeof *p);
  if (!p) return dlrec_error(DLREC_ERR_NOMEM, "serve rows: out of memory for %u ids", cap);
  r->ids[c] = p;
  r->cap_ids[c] = cap;
  return DLREC_OK;
}

dlrec_status dlrec_serve_rows_new(dlrec_serve_rows **out, const dlrec_schema *schema, const dlrec_etl *etl) {
  *out = NULL;
  if (!schema && etl) schema = dlrec_etl_schema(etl);
  if (!schema) return dlrec_error(DLREC_ERR_INVALID, "serve rows: no schema");
  dlrec_status st = dlrec_schema_validate(schema, "model schema");
  if (st != DLREC_OK) return st;
  if (etl) {
    const dlrec_schema *e = dlrec_etl_schema(etl);
    int same = e->n_dense == schema->n_dense && e->n_sparse == schema->n_sparse;
    for (uint32_t c = 0; same && c < schema->n_sparse; c++)
      same = e->sparse[c].id_begin == schema->sparse[c].id_begin && e->sparse[c].id_end == schema->sparse[c].id_end;
    if (!same)
      return dlrec_error(DLREC_ERR_INVALID, "serve rows: the ETL state does not match the model's schema "
                         "(columns or id ranges differ)");
  }
  dlrec_serve_rows *r = calloc(1, sizeof *r);
  if (!r) return dlrec_error(DLREC_ERR_NOMEM, "serve rows: out of memory");
  r->schema = *schema;
  r->etl = etl;
  if ((st = grow_rows(r, MIN_ROWS)) != DLREC_OK) {
    dlrec_serve_rows_free(r);
    return st;
  }
  for (uint32_t c = 0; c < schema->n_sparse; c++) {
    r->offsets[c][0] = 0;
    if ((st = grow_ids(r, c, MIN_ROWS)) != DLREC_OK) {
      dlrec_serve_rows_free(r);
      return st;
    }
  }
  *out = r;
  return DLREC_OK;
}

void dlrec_serve_rows_free(dlrec_serve_rows *r) {
  if (!r) return;
  free(r->dense);
  for (uint32_t c = 0; c < r->schema.n_sparse; c++) {
    free(r->offsets[c]);
    free(r->ids[c]);
  }
  free(r);
}

void dlrec_serve_rows_clear(dlrec_serve_rows *r) {
  r->rows = 0;
  memset(r->n_ids, 0, sizeof r->n_ids);
}

uint32_t dlrec_serve_rows_count(const dlrec_serve_rows *r) { return r->rows; }

size_t dlrec_serve_rows_bytes(const dlrec_serve_rows *r) {
  const dlrec_schema *s = &r->schema;
  size_t n = sizeof *r + (size_t)r->cap_rows * (s->n_dense ? s->n_dense : 1) * sizeof *r->dense;
  for (uint32_t c = 0; c < s->n_sparse; c++)
    n += ((size_t)r->cap_rows + 1) * sizeof *r->offsets[c] + (size_t)r->cap_ids[c] * sizeof *r->ids[c];
  return n;
}

dlrec_status dlrec_serve_rows_reserve(dlrec_serve_rows *r, uint32_t rows) {
  dlrec_status st = grow_rows(r, rows);
  for (uint32_t c = 0; st == DLREC_OK && c < r->schema.n_sparse; c++) {
    uint32_t h = r->schema.sparse[c].max_hotness ? r->schema.sparse[c].max_hotness : 1;
    st = grow_ids(r, c, (uint64_t)rows * h);
  }
  return st;
}

void dlrec_serve_rows_batch(const dlrec_serve_rows *r, dlrec_batch *b) {
  memset(b, 0, sizeof *b);
  b->rows = r->rows;
  b->labels = NULL;
  b->dense = r->dense;
  for (uint32_t c = 0; c < r->schema.n_sparse; c++) {
    b->offsets[c] = r->offsets[c];
    b->ids[c] = r->ids[c];
  }
}

/* Drops whatever a failed add wrote past the old ends. */
static void rollback(dlrec_serve_rows *r, uint32_t rows, const uint32_t *n_ids) {
  r->rows = rows;
  memcpy(r->n_ids, n_ids, r->schema.n_sparse * sizeof *n_ids);
}

/* ---- shapes ---- */

/* A user-supplied name made safe for a message. */
static const char *shown(const char *s, char *buf, size_t cap) { return dlrec_kserve_shown(s, strlen(s), buf, cap); }


/* A 1-D tensor, or 2-D with a leading 1 (HugeCTR clients send [1, N]). */
static dlrec_status check_flat(const dlrec_kserve_tensor *t) {
  char sb[200];
  if (t->rank == 1 || (t->rank == 2 && t->shape[0] == 1)) return DLREC_OK;
  return dlrec_error(DLREC_ERR_PARSE, "input '%s': shape %s, expected [N] or [1, N]", t->name,
                     dlrec_kserve_shape_str(t, sb, sizeof sb));
}

static dlrec_status check_rows(const dlrec_kserve_tensor *t, uint64_t B, uint32_t max_rows) {
  if (B == 0) return dlrec_error(DLREC_ERR_PARSE, "input '%s': no rows (batch size 0)", t->name);
  if (B > max_rows)
    return dlrec_error(DLREC_ERR_PARSE, "input '%s': %llu rows, more than the limit of %u per request", t->name,
                       (unsigned long long)B, max_rows);
  return DLREC_OK;
}

/* ---- the raw convention ---- */

/* Decimal text of dense element i that dlrec_parse_number reads back as
 * exactly the element's value; 0 when it is not finite. Integers (and
 * integral floats) print as integers, other floats with 17 digits, which
 * round-trip any double (FP32 values as the double they equal). */
static size_t dense_text(const dlrec_kserve_tensor *t, uint64_t i, char *buf, size_t cap) {
  if (t->dtype == DLREC_KSERVE_UINT64)
    return (size_t)snprintf(buf, cap, "%llu", (unsigned long long)((const uint64_t *)t->data)[i]);
  if (dlrec_kserve_dtype_is_int(t->dtype))
    return (size_t)snprintf(buf, cap, "%lld", (long long)dlrec_kserve_get_i64(t, i));
  double d = dlrec_kserve_get_f64(t, i);
  if (!isfinite(d)) return 0;
  if (d == floor(d) && fabs(d) < 1e15) return (size_t)snprintf(buf, cap, "%lld", (long long)d);
  return (size_t)snprintf(buf, cap, "%.17g", d);
}

static int dense_dtype_ok(dlrec_kserve_dtype t) {
  return t == DLREC_KSERVE_FP32 || t == DLREC_KSERVE_FP64 || t == DLREC_KSERVE_BYTES || dlrec_kserve_dtype_is_int(t);
}

/* The raw convention's inputs checked against the model's input columns
 * (nd dense, nc categorical: the ETL's, before the workflow's derived
 * ones); *B their rows. */
static dlrec_status raw_checks(const dlrec_serve_rows *r, const dlrec_kserve_tensor *dense,
                               const dlrec_kserve_tensor *cat, uint32_t max_rows, uint32_t nd, uint32_t nc,
                               uint32_t *B) {
  const dlrec_schema *s = &r->schema;
  char sb[200];
  if ((!dense && nd) || (!cat && nc))
    return dlrec_error(DLREC_ERR_PARSE, "missing input '%s' (the raw convention needs dense and categorical; "
                       "only an input of no model columns may be left out)", !dense && nd ? "dense" : "categorical");
  if (dense && !dense_dtype_ok(dense->dtype))
    return dlrec_error(DLREC_ERR_PARSE, "input 'dense': datatype %s, expected FP32, FP64, an integer type or BYTES",
                       dlrec_kserve_dtype_name(dense->dtype));
  if (cat && cat->dtype != DLREC_KSERVE_BYTES)
    return dlrec_error(DLREC_ERR_PARSE, "input 'categorical': datatype %s, expected BYTES (the raw values)",
                       dlrec_kserve_dtype_name(cat->dtype));
  if (dense && (dense->rank != 2 || dense->shape[1] != nd))
    return dlrec_error(DLREC_ERR_PARSE, "input 'dense': shape %s, expected [B, %u]", dlrec_kserve_shape_str(dense, sb, sizeof sb),
                       nd);
  if (cat && (cat->rank != 2 || cat->shape[1] != nc))
    return dlrec_error(DLREC_ERR_PARSE, "input 'categorical': shape %s, expected [B, %u]",
                       dlrec_kserve_shape_str(cat, sb, sizeof sb), nc);
  if (dense && cat && dense->shape[0] != cat->shape[0])
    return dlrec_error(DLREC_ERR_PARSE, "inputs 'dense' and 'categorical': %lld and %lld rows",
                       (long long)dense->shape[0], (long long)cat->shape[0]);
  const dlrec_kserve_tensor *from = dense ? dense : cat;
  dlrec_status st = check_rows(from, (uint64_t)from->shape[0], max_rows);
  if (st != DLREC_OK) return st;
  *B = (uint32_t)from->shape[0];
  /* The ETL state gives one-hot and variable multi-hot columns only; a
   * column of a fixed hotness above 1 cannot come from its fields. */
  for (uint32_t c = 0; c < nc; c++)
    if (s->sparse[c].hotness > 1 && !s->keys) /* raw keys: one value, two ids */
      return dlrec_error(DLREC_ERR_UNSUPPORTED, "input 'categorical': column %s takes exactly %u ids per row; send "
                         "it as CATCOLUMN and ROWINDEX", s->sparse[c].name, s->sparse[c].hotness);
  return DLREC_OK;
}

/* Row b of the raw inputs encoded as the batch's row `row` (out: its dense
 * features): the input's columns as etl apply encodes them, then the
 * workflow's derived ones (derived: the schema has some). */
static dlrec_status raw_row(dlrec_serve_rows *r, const dlrec_kserve_tensor *dense, const dlrec_kserve_tensor *cat,
                            uint32_t nd, uint32_t nc, int derived, uint32_t b, uint32_t row, float *out) {
  const dlrec_schema *s = &r->schema, *es = dlrec_etl_schema(r->etl);
  char text[DLREC_MAX_DENSE][64];
  dlrec_text din[DLREC_MAX_DENSE], cin[DLREC_MAX_SPARSE];
  dlrec_status st;
  for (uint32_t d = 0; d < nd; d++) {
    uint64_t i = (uint64_t)b * nd + d;
    const char *p = text[d];
    size_t n;
    if (dense->dtype == DLREC_KSERVE_BYTES) {
      p = dense->strs[i].s;
      n = dense->strs[i].n;
    } else if ((n = dense_text(dense, i, text[d], sizeof text[d])) == 0) {
      return dlrec_error(DLREC_ERR_PARSE, "input 'dense': row %u, column %s: not a finite number", b,
                         s->dense_names[d]);
    }
    if ((st = dlrec_etl_encode_dense(r->etl, d, p, n, &out[d])) != DLREC_OK)
      return dlrec_error_context("input 'dense': row %u, column %s: ", b, s->dense_names[d]);
    din[d] = (dlrec_text){p, (uint32_t)n};
  }
  for (uint32_t c = 0; c < nc; c++) {
    const dlrec_kserve_str v = cat->strs[(uint64_t)b * nc + c];
    /* Room for the most ids the field can encode to; geometric growth
     * keeps this a compare in steady state. */
    uint32_t most = es->sparse[c].max_hotness ? es->sparse[c].max_hotness : 1, k = 0;
    if ((st = grow_ids(r, c, (uint64_t)r->n_ids[c] + most)) != DLREC_OK) return st;
    if ((st = dlrec_etl_encode_cat_multi(r->etl, c, v.s, v.n, r->ids[c] + r->n_ids[c], &k, NULL)) != DLREC_OK)
      return dlrec_error_context("input 'categorical': row %u, column %s: ", b, s->sparse[c].name);
    r->n_ids[c] += k;
    r->offsets[c][row + 1] = r->n_ids[c];
    cin[c] = (dlrec_text){v.s, (uint32_t)v.n};
  }
  if (!derived) return DLREC_OK;
  uint32_t ids[DLREC_MAX_SPARSE];
  if ((st = dlrec_etl_encode_derived(r->etl, din, cin, out + nd, ids)) != DLREC_OK)
    return dlrec_error_context("row %u: ", b);
  for (uint32_t c = nc; c < s->n_sparse; c++) {
    r->ids[c][r->n_ids[c]++] = ids[c - nc];
    r->offsets[c][row + 1] = r->n_ids[c];
  }
  return DLREC_OK;
}

/* The raw convention. Either input may be left out when the model has no
 * column of its kind (a categorical-only model takes just categorical, or
 * dense of shape [B, 0]); B comes from the inputs given. Multi-hot columns
 * take the field's raw text, separators and all ("Action|Drama"), and
 * encode as the same field inside a log line would. A row that fails rolls
 * the request's rows back. */
static dlrec_status add_raw(dlrec_serve_rows *r, const dlrec_kserve_tensor *dense, const dlrec_kserve_tensor *cat,
                            uint32_t max_rows, uint32_t *added) {
  const dlrec_schema *s = &r->schema;
  if (!r->etl)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "inputs 'dense' and 'categorical' need the model's ETL state, which "
                       "this server does not have; send DES, CATCOLUMN and ROWINDEX");
  /* The request carries the input's columns; the workflow's derived ones
   * (after them in the schema) are computed from those. */
  uint32_t nd, nc, B = 0;
  dlrec_etl_input_columns(r->etl, &nd, &nc);
  const uint32_t snd = s->n_dense, derived = snd > nd || s->n_sparse > nc;
  dlrec_status st = raw_checks(r, dense, cat, max_rows, nd, nc, &B);
  if (st != DLREC_OK) return st;
  const uint32_t row0 = r->rows;
  uint32_t n_ids0[DLREC_MAX_SPARSE];
  memcpy(n_ids0, r->n_ids, s->n_sparse * sizeof *n_ids0);
  if ((st = grow_rows(r, (uint64_t)row0 + B)) != DLREC_OK) return st;
  for (uint32_t c = 0; c < s->n_sparse; c++) /* a derived column: one id a row */
    if ((st = grow_ids(r, c, (uint64_t)r->n_ids[c] + B)) != DLREC_OK) return st;
  float *out = r->dense + (size_t)row0 * snd;
  for (uint32_t b = 0; b < B; b++, out += snd)
    if ((st = raw_row(r, dense, cat, nd, nc, derived, b, row0 + b, out)) != DLREC_OK) {
      rollback(r, row0, n_ids0); /* the message stands */
      return st;
    }
  r->rows = row0 + B;
  *added = B;
  return DLREC_OK;
}

/* ---- the HugeCTR convention ---- */

/* The HugeCTR convention's inputs' types and shapes; *B the samples (from
 * DES, as HugeCTR derives it, or from ROWINDEX without dense columns). */
static dlrec_status hugectr_batch(const dlrec_serve_rows *r, const dlrec_kserve_tensor *des,
                                  const dlrec_kserve_tensor *cat, const dlrec_kserve_tensor *ri, uint32_t max_rows,
                                  uint64_t *B) {
  const uint32_t nd = r->schema.n_dense, nc = r->schema.n_sparse;
  if (!des || !cat || !ri)
    return dlrec_error(DLREC_ERR_PARSE, "missing input '%s' (the HugeCTR convention needs DES, CATCOLUMN and ROWINDEX)",
                       !des ? "DES" : !cat ? "CATCOLUMN" : "ROWINDEX");
  if (des->dtype != DLREC_KSERVE_FP32)
    return dlrec_error(DLREC_ERR_PARSE, "input 'DES': datatype %s, expected FP32", dlrec_kserve_dtype_name(des->dtype));
  if (!dlrec_kserve_dtype_is_int(cat->dtype))
    return dlrec_error(DLREC_ERR_PARSE, "input 'CATCOLUMN': datatype %s, expected INT64 (or UINT32, INT32, UINT64)",
                       dlrec_kserve_dtype_name(cat->dtype));
  if (ri->dtype != DLREC_KSERVE_INT32 && ri->dtype != DLREC_KSERVE_INT64)
    return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': datatype %s, expected INT32 (or INT64)",
                       dlrec_kserve_dtype_name(ri->dtype));
  dlrec_status st;
  if (!(des->rank == 2 && des->shape[1] == nd) && (st = check_flat(des)) != DLREC_OK) return st;
  if ((st = check_flat(cat)) != DLREC_OK || (st = check_flat(ri)) != DLREC_OK) return st;
  const dlrec_kserve_tensor *from;
  if (nd > 0) {
    if (des->count % nd)
      return dlrec_error(DLREC_ERR_PARSE, "input 'DES': %llu values is not a multiple of the model's %u dense columns",
                         (unsigned long long)des->count, nd);
    *B = des->count / nd;
    from = des;
  } else {
    if (des->count)
      return dlrec_error(DLREC_ERR_PARSE, "input 'DES': %llu values, but the model has no dense columns",
                         (unsigned long long)des->count);
    if (nc == 0 || ri->count == 0 || (ri->count - 1) % nc)
      return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': %llu entries is not samples x %u columns + 1",
                         (unsigned long long)ri->count, nc);
    *B = (ri->count - 1) / nc;
    from = ri;
  }
  if ((st = check_rows(from, *B, max_rows)) != DLREC_OK) return st;
  if (ri->count != *B * nc + 1)
    return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': %llu entries, but %llu samples (from %s) x %u columns + 1 "
                       "= %llu", (unsigned long long)ri->count, (unsigned long long)*B, from->name, nc,
                       (unsigned long long)(*B * nc + 1));
  return DLREC_OK;
}

/* Sample b's keys of column c (CATCOLUMN[lo, hi)): as many as the column
 * takes, each id in the column's range (a raw-keys model takes CATCOLUMN's
 * values as its 64-bit keys, as etl apply writes them: docs/etl.md, two ids
 * each); *words the ids they make. */
static dlrec_status hugectr_bag(const dlrec_serve_rows *r, const dlrec_kserve_tensor *cat, uint64_t b, uint32_t c,
                                int64_t lo, int64_t hi, uint64_t *words) {
  const dlrec_schema *s = &r->schema;
  const uint64_t k = (uint64_t)(hi - lo);
  *words = s->keys ? 2 * k : k;
  const dlrec_sparse_col *col = &s->sparse[c];
  if (col->hotness ? *words != col->hotness : *words > col->max_hotness)
    return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': sample %llu, column %s: %llu keys, the column takes %s %u",
                       (unsigned long long)b, col->name, (unsigned long long)k, col->hotness ? "exactly" : "at most",
                       (col->hotness ? col->hotness : col->max_hotness) / (s->keys ? 2 : 1));
  for (int64_t q = lo; q < hi && !s->keys; q++) {
    int64_t id = dlrec_kserve_get_i64(cat, (uint64_t)q);
    /* Ranges lie inside the table, whose ids are 32-bit; the last check keeps the cast below exact
     * whatever the schema says. */
    if (id < 0 || (uint64_t)id < col->id_begin || (uint64_t)id >= col->id_end || (uint64_t)id > UINT32_MAX) {
      if (cat->dtype == DLREC_KSERVE_UINT64)
        return dlrec_error(DLREC_ERR_PARSE, "input 'CATCOLUMN': element %lld (sample %llu, column %s): id %llu is "
                           "outside the column's ids [%llu, %llu)", (long long)q, (unsigned long long)b, col->name,
                           (unsigned long long)((const uint64_t *)cat->data)[q], (unsigned long long)col->id_begin,
                           (unsigned long long)col->id_end);
      return dlrec_error(DLREC_ERR_PARSE, "input 'CATCOLUMN': element %lld (sample %llu, column %s): id %lld is "
                         "outside the column's ids [%llu, %llu)", (long long)q, (unsigned long long)b, col->name,
                         (long long)id, (unsigned long long)col->id_begin, (unsigned long long)col->id_end);
    }
  }
  return DLREC_OK;
}

/* Everything checked before anything is written: DES finite, ROWINDEX from
 * 0 to CATCOLUMN's length without decreasing, every bag's keys; per_col[c]
 * the ids column c gets. */
static dlrec_status hugectr_check(const dlrec_serve_rows *r, const dlrec_kserve_tensor *des,
                                  const dlrec_kserve_tensor *cat, const dlrec_kserve_tensor *ri, uint64_t B,
                                  uint64_t *per_col) {
  const dlrec_schema *s = &r->schema;
  const uint32_t nd = s->n_dense, nc = s->n_sparse;
  for (uint64_t i = 0; i < des->count; i++) {
    float v = ((const float *)des->data)[i];
    if (!isfinite(v))
      return dlrec_error(DLREC_ERR_PARSE, "input 'DES': sample %llu, column %s: not finite",
                         (unsigned long long)(i / nd), s->dense_names[i % nd]);
  }
  const uint64_t K = cat->count;
  if (dlrec_kserve_get_i64(ri, 0) != 0)
    return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': starts at %lld, expected 0",
                       (long long)dlrec_kserve_get_i64(ri, 0));
  if ((uint64_t)dlrec_kserve_get_i64(ri, ri->count - 1) != K || dlrec_kserve_get_i64(ri, ri->count - 1) < 0)
    return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': ends at %lld, expected %llu (CATCOLUMN's length)",
                       (long long)dlrec_kserve_get_i64(ri, ri->count - 1), (unsigned long long)K);
  for (uint64_t b = 0; b < B; b++)
    for (uint32_t c = 0; c < nc; c++) {
      uint64_t j = b * nc + c, words;
      int64_t lo = dlrec_kserve_get_i64(ri, j), hi = dlrec_kserve_get_i64(ri, j + 1);
      if (hi < lo)
        return dlrec_error(DLREC_ERR_PARSE, "input 'ROWINDEX': decreases at entry %llu (%lld then %lld; sample %llu, "
                           "column %s)", (unsigned long long)(j + 1), (long long)lo, (long long)hi,
                           (unsigned long long)b, s->sparse[c].name);
      /* lo >= 0 and hi <= K: it starts at 0, never decreases and ends at K. */
      dlrec_status st = hugectr_bag(r, cat, b, c, lo, hi, &words);
      if (st != DLREC_OK) return st;
      per_col[c] += words;
    }
  return DLREC_OK;
}

static dlrec_status add_hugectr(dlrec_serve_rows *r, const dlrec_kserve_tensor *des, const dlrec_kserve_tensor *cat,
                                const dlrec_kserve_tensor *ri, uint32_t max_rows, uint32_t *added) {
  const dlrec_schema *s = &r->schema;
  const uint32_t nd = s->n_dense, nc = s->n_sparse;
  /* A model without dense columns takes DES empty or not at all. */
  static const dlrec_kserve_tensor no_des = {.name = "DES", .dtype = DLREC_KSERVE_FP32, .rank = 1};
  if (!des && nd == 0) des = &no_des;
  uint64_t B = 0, per_col[DLREC_MAX_SPARSE] = {0};
  dlrec_status st = hugectr_batch(r, des, cat, ri, max_rows, &B);
  if (st == DLREC_OK) st = hugectr_check(r, des, cat, ri, B, per_col);
  if (st != DLREC_OK) return st;
  const uint32_t row0 = r->rows;
  if ((st = grow_rows(r, (uint64_t)row0 + B)) != DLREC_OK) return st;
  for (uint32_t c = 0; c < nc; c++)
    if ((st = grow_ids(r, c, (uint64_t)r->n_ids[c] + per_col[c])) != DLREC_OK) return st;
  if (nd) memcpy(r->dense + (size_t)row0 * nd, des->data, (size_t)B * nd * sizeof(float));
  for (uint32_t b = 0; b < B; b++)
    for (uint32_t c = 0; c < nc; c++) {
      uint64_t j = (uint64_t)b * nc + c;
      int64_t lo = dlrec_kserve_get_i64(ri, j), hi = dlrec_kserve_get_i64(ri, j + 1);
      uint32_t *ids = r->ids[c];
      uint32_t n = r->n_ids[c];
      for (int64_t q = lo; q < hi; q++) {
        const uint64_t v = (uint64_t)dlrec_kserve_get_i64(cat, (uint64_t)q);
        ids[n++] = (uint32_t)v;
        if (s->keys) ids[n++] = (uint32_t)(v >> 32);
      }
      r->n_ids[c] = n;
      r->offsets[c][row0 + b + 1] = n;
    }
  r->rows = row0 + (uint32_t)B;
  *added = (uint32_t)B;
  return DLREC_OK;
}

dlrec_status dlrec_serve_rows_add_request(dlrec_serve_rows *r, const dlrec_kserve_request *req, uint32_t max_rows,
                                          uint32_t *added) {
  uint32_t dummy;
  if (!added) added = &dummy;
  *added = 0;
  const dlrec_kserve_tensor *dense = NULL, *cat = NULL, *des = NULL, *catcol = NULL, *ri = NULL;
  char b[200];
  for (uint32_t i = 0; i < dlrec_kserve_request_n_inputs(req); i++) {
    const dlrec_kserve_tensor *t = dlrec_kserve_request_input(req, i);
    const dlrec_kserve_tensor **slot = !strcmp(t->name, "dense")       ? &dense
                                       : !strcmp(t->name, "categorical") ? &cat
                                       : !strcmp(t->name, "DES")         ? &des
                                       : !strcmp(t->name, "CATCOLUMN")   ? &catcol
                                       : !strcmp(t->name, "ROWINDEX")    ? &ri
                                                                         : NULL;
    if (!slot)
      return dlrec_error(DLREC_ERR_PARSE, "unknown input '%s' (the model takes dense and categorical, or DES, "
                         "CATCOLUMN and ROWINDEX)", shown(t->name, b, sizeof b));
    *slot = t; /* names are unique: the parser checked */
  }
  int raw = dense || cat, hugectr = des || catcol || ri;
  if (raw && hugectr)
    return dlrec_error(DLREC_ERR_PARSE, "inputs mix the raw convention (dense, categorical) with the HugeCTR one "
                       "(DES, CATCOLUMN, ROWINDEX)");
  if (raw) return add_raw(r, dense, cat, max_rows, added);
  if (hugectr) return add_hugectr(r, des, catcol, ri, max_rows, added);
  return dlrec_error(DLREC_ERR_PARSE, "no inputs (the model takes dense and categorical, or DES, CATCOLUMN and "
                     "ROWINDEX)");
}

/* ---- concatenation ---- */

dlrec_status dlrec_serve_rows_append(dlrec_serve_rows *dst, const dlrec_serve_rows *src) {
  const dlrec_schema *s = &dst->schema;
  int same = s->n_dense == src->schema.n_dense && s->n_sparse == src->schema.n_sparse;
  for (uint32_t c = 0; same && c < s->n_sparse; c++)
    same = s->sparse[c].id_begin == src->schema.sparse[c].id_begin &&
           s->sparse[c].id_end == src->schema.sparse[c].id_end;
  if (!same) return dlrec_error(DLREC_ERR_INVALID, "serve rows: append of rows of another schema");
  if (src->rows == 0) return DLREC_OK;
  const uint32_t row0 = dst->rows, B = src->rows;
  dlrec_status st = grow_rows(dst, (uint64_t)row0 + B);
  for (uint32_t c = 0; st == DLREC_OK && c < s->n_sparse; c++)
    st = grow_ids(dst, c, (uint64_t)dst->n_ids[c] + src->n_ids[c]);
  if (st != DLREC_OK) return st;
  if (s->n_dense) memcpy(dst->dense + (size_t)row0 * s->n_dense, src->dense, (size_t)B * s->n_dense * sizeof(float));
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const uint32_t base = dst->n_ids[c];
    if (src->n_ids[c]) memcpy(dst->ids[c] + base, src->ids[c], (size_t)src->n_ids[c] * sizeof(uint32_t));
    for (uint32_t b = 1; b <= B; b++) dst->offsets[c][row0 + b] = base + src->offsets[c][b];
    dst->n_ids[c] = base + src->n_ids[c];
  }
  dst->rows = row0 + B;
  return DLREC_OK;
}
