/* count: a dense column of how often a one-hot categorical input column's
 * value was seen in fit (count encoding, NVTabular's JoinGroupby count):
 *
 *   workflow  {"count": [{"column": "C3", "name": "C3_count"}]}
 *   etl.json  "op": {"kind": "count", "column": "C3"}
 *
 * The value of a row is the fit count of its value or bucket: 0 for a
 * missing field and for a value out of the vocabulary (below --min-count,
 * or unseen). That count then goes through the dense transform and
 * standardization as any dense value; its statistics are over fit's rows.
 * The counts are the source column's own (vocab.bin), so the source's
 * vocabulary must be in memory in fit. The default name is SOURCE_count. */
#include <stdio.h>
#include <stdlib.h>

#include "data/etl_op.h"
#include "core/json.h"

/* Where a count encoding's value of local id g is: the fit count of the
 * value or bucket; a 0 for the missing and out-of-vocabulary ids. */
static inline const uint64_t *etl_count_at(const etl_cat *c, uint64_t g) {
  static const uint64_t zero = 0;
  if (g < ETL_LOCAL_FIRST) return &zero;
  return (c->hashed ? c->bucket_counts : c->counts) + (g - ETL_LOCAL_FIRST);
}

static inline uint64_t etl_count_of(const etl_cat *c, uint64_t g) { return *etl_count_at(c, g); }

static dlrec_status count_parse(const cJSON *o, const char *what, const dlrec_columns *cols, etl_derived *d,
                                char *dflt, size_t dflt_size) {
  static const char *const keys[] = {"column", "name", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  int k = etl_workflow_source(cols, cJSON_GetObjectItemCaseSensitive(o, "column"), 1, what);
  if (k < 0) return DLREC_ERR_INVALID;
  d->src[d->n_src++] = (uint32_t)k;
  snprintf(dflt, dflt_size, "%s_count", cols->cat[k]);
  return DLREC_OK;
}

static dlrec_status count_load(const cJSON *op, const char *what, const dlrec_columns *c, etl_derived *d) {
  return etl_state_source(op, what, c, 1, d);
}

static void count_save(const dlrec_columns *cols, const etl_derived *d, cJSON *o) {
  cJSON_AddStringToObject(o, "column", cols->cat[d->src[0]]);
}

/* Each local id's count, weighted by the rows that had it. */
static dlrec_status count_fit_end(etl_fit_end *f) {
  const etl_cat *c = &f->e->cat[f->d->src[0]];
  const uint64_t n = c->size;
  dlrec_status st = etl_fit_needs_vocab(f, f->d->src[0]);
  if (st != DLREC_OK) return st;
  double *xv = malloc(n * sizeof *xv);
  uint64_t *w = malloc(n * sizeof *w);
  st = xv && w ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  for (uint64_t g = 0; st == DLREC_OK && g < n; g++) {
    xv[g] = (double)etl_count_of(c, g);
    w[g] = g >= ETL_LOCAL_FIRST ? (uint64_t)xv[g] : g == ETL_LOCAL_MISSING ? c->missing : c->hashed ? 0 : c->oov;
  }
  if (st == DLREC_OK) etl_group_stats(&f->e->dense[f->col], xv, w, n, f->rows);
  free(xv);
  free(w);
  return st;
}

static const void *count_locate(const etl_row *r, const etl_derived *d) {
  return etl_count_at(&r->e->cat[d->src[0]], etl_row_local(r, d->src[0]));
}

static double count_value(const void *at) { return (double)*(const uint64_t *)at; }

/* The source's counts, compared bitwise. */
static int count_same(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  const etl_cat *p = &a->cat[x->src[0]], *q = &b->cat[y->src[0]];
  if (p->hashed != q->hashed || p->size != q->size) return 0;
  return etl_same_bits(p->hashed ? p->bucket_counts : p->counts, q->hashed ? q->bucket_counts : q->counts,
                       (p->size - ETL_LOCAL_FIRST) * sizeof(uint64_t));
}

static const char *const state_keys[] = {"column", NULL};

const etl_op_type etl_op_count = {
    .name = "count",
    .role = ETL_ROLE_DENSE,
    .state_keys = state_keys,
    .parse = count_parse,
    .load = count_load,
    .save = count_save,
    .fit_end = count_fit_end,
    .locate = count_locate,
    .value = count_value,
    .same = count_same,
};
