/* bucketize: a categorical column of a dense input column's bucket
 * numbers (NVTabular's Bucketize), the boundaries given or fitted as
 * quantiles of the column's values:
 *
 *   workflow  {"bucketize": [{"column": "I1", "boundaries": [1, 10, 100]},
 *                            {"column": "I2", "quantiles": 10, "name": "I2_decile"}]}
 *   etl.json  "op": {"kind": "bucketize", "column": "I1", "boundaries": [1, 10, 100]}
 *             (a fitted one also says "quantiles": Q)
 *
 * A value's bucket is how many boundaries are <= it, after the source's
 * clip; a missing value is the missing id, or the fill's bucket when the
 * source has a fill. Quantiles are numpy's (method "linear") of fit's
 * clipped values, equal ones merged, so fit holds the source's values; the
 * bucket numbers then get a vocabulary of every value, ordered by frequency
 * as any column's. The default name is SOURCE_bucket. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "data/etl_op.h"
#include "core/json.h"
#include "core/log.h"

#define ETL_BOUNDS_MAX 1024

/* The bucket of x: how many boundaries are <= x. */
static inline uint64_t etl_bucket(const double *b, uint32_t n, double x) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (b[mid] <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Bucket boundaries (a list of increasing finite numbers) into d->bounds. */
static dlrec_status bounds_parse(const cJSON *b, const char *what, etl_derived *d) {
  int n = cJSON_IsArray(b) ? cJSON_GetArraySize(b) : 0;
  if (n < 1 || n > ETL_BOUNDS_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: 'boundaries' must list 1 to %d numbers", what, ETL_BOUNDS_MAX);
  d->bounds = malloc((size_t)n * sizeof *d->bounds);
  if (!d->bounds) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  d->n_bounds = (uint32_t)n;
  for (int i = 0; i < n; i++) {
    const cJSON *v = cJSON_GetArrayItem(b, i);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || (i && !(v->valuedouble > d->bounds[i - 1])))
      return dlrec_error(DLREC_ERR_INVALID, "%s: boundaries[%d]: expected finite numbers in increasing order", what, i);
    d->bounds[i] = v->valuedouble;
  }
  return DLREC_OK;
}

static dlrec_status bucketize_parse(const cJSON *o, const char *what, const dlrec_columns *cols, etl_derived *d,
                                    char *dflt, size_t dflt_size) {
  static const char *const keys[] = {"column", "boundaries", "quantiles", "name", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  int k = etl_workflow_source(cols, cJSON_GetObjectItemCaseSensitive(o, "column"), 0, what);
  if (k < 0) return DLREC_ERR_INVALID;
  d->src[d->n_src++] = (uint32_t)k;
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "boundaries");
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, "quantiles");
  if (!b == !q) return dlrec_error(DLREC_ERR_INVALID, "%s: give either 'boundaries' or 'quantiles'", what);
  if (q) {
    uint64_t n = 0;
    if ((s = etl_workflow_uint(o, "quantiles", what, 2, ETL_BOUNDS_MAX, UINT64_MAX, &n)) != DLREC_OK) return s;
    d->quantiles = (uint32_t)n;
  } else {
    s = bounds_parse(b, what, d);
    if (s != DLREC_OK) return s;
  }
  snprintf(dflt, dflt_size, "%s_bucket", cols->dense[k]);
  return DLREC_OK;
}

static dlrec_status bucketize_load(const cJSON *op, const char *what, const dlrec_columns *c, etl_derived *d) {
  dlrec_status st = etl_state_source(op, what, c, 0, d);
  if (st != DLREC_OK) return st;
  uint64_t q = 0;
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(op, "boundaries");
  st = dlrec_json_get_u64_or(op, "quantiles", what, 0, &q);
  if (st == DLREC_OK && q && (q < 2 || q > ETL_BOUNDS_MAX))
    st = dlrec_error(DLREC_ERR_INVALID, "%s: op: 'quantiles' must be in [2, %d]", what, ETL_BOUNDS_MAX);
  d->quantiles = (uint32_t)q;
  /* Fitted boundaries may be none (a column without values), at most Q - 1. */
  if (st == DLREC_OK && !(q && cJSON_IsArray(b) && cJSON_GetArraySize(b) == 0)) st = bounds_parse(b, what, d);
  if (st == DLREC_OK && q && d->n_bounds >= q)
    st = dlrec_error(DLREC_ERR_INVALID, "%s: op: more boundaries than quantiles", what);
  return st;
}

static void bucketize_save(const dlrec_columns *cols, const etl_derived *d, cJSON *o) {
  cJSON_AddStringToObject(o, "column", cols->dense[d->src[0]]);
  cJSON *b = cJSON_AddArrayToObject(o, "boundaries");
  for (uint32_t k = 0; k < d->n_bounds; k++) cJSON_AddItemToArray(b, cJSON_CreateNumber(d->bounds[k]));
  if (d->quantiles) cJSON_AddItemToObject(o, "quantiles", cJSON_CreateNumber(d->quantiles));
}

static int bucketize_holds(const etl_derived *d) { return (int)d->src[0]; }

/* numpy.quantile(v, q) of sorted v[0, n), n > 0, by numpy's own arithmetic
 * (method "linear": the virtual index n q + (1 - q) - 1, and its _lerp), so
 * that fitted boundaries are numpy's to the bit. */
static double quantile_sorted(const double *v, size_t n, double q) {
  const double virt = (double)n * q + (1.0 + q * -1.0) - 1.0;
  double prev = floor(virt);
  const double gamma = virt - prev;
  if (prev < 0) prev = 0;
  size_t lo = prev > (double)(n - 1) ? n - 1 : (size_t)prev, hi = lo + 1 > n - 1 ? n - 1 : lo + 1;
  const double a = v[lo], b = v[hi], diff = b - a;
  return gamma >= 0.5 ? b - diff * (1 - gamma) : a + diff * gamma;
}

/* The column: its boundaries (fitted from the held values for quantiles)
 * and its vocabulary of bucket numbers. */
static dlrec_status bucketize_fit_end(etl_fit_end *f) {
  etl_derived *dv = f->d;
  const uint32_t d = dv->src[0];
  double *v = f->held;
  const size_t n = f->n_held;
  if (dv->quantiles) {
    qsort(v, n, sizeof *v, etl_cmp_double);
    dv->bounds = malloc(dv->quantiles * sizeof *dv->bounds);
    if (!dv->bounds) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    dv->n_bounds = 0;
    if (n == 0)
      DLREC_WARN("fit: column %s has no value to fit quantiles of: %s has one bucket", f->e->cols.dense[d], f->name);
    for (uint32_t k = 1; n && k < dv->quantiles; k++) {
      double b = quantile_sorted(v, n, (double)k / dv->quantiles);
      if (dv->n_bounds == 0 || b > dv->bounds[dv->n_bounds - 1]) dv->bounds[dv->n_bounds++] = b;
    }
  }
  keymap m;
  dlrec_status st = keymap_init(&m, dv->n_bounds + 1);
  for (size_t r = 0; st == DLREC_OK && r < n; r++) {
    const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, v[r]);
    st = keymap_count(&m, b, keymap_hash(b));
  }
  /* The filled rows fall into the fill's bucket. */
  const etl_dense_ops *ops = &f->e->dense[d].ops;
  uint64_t missing = f->rows - n;
  if (st == DLREC_OK && ops->fill && missing) {
    const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, etl_clip(ops, ops->fill_value));
    int added;
    uint64_t *c = keymap_upsert_h(&m, b, keymap_hash(b), &added);
    if (c) *c += missing;
    else st = DLREC_ERR_NOMEM;
    missing = 0;
  }
  etl_cat *k = &f->e->cat[f->col];
  k->missing = missing;
  k->key_kind = DLREC_KEY_DEC;
  if (st == DLREC_OK) return etl_finish_column(1, 0, k, &m, &f->e->owned[2 * f->col], 0);
  keymap_free(&m);
  return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for the buckets of %s", f->name);
}

static dlrec_status bucketize_encode(const etl_row *r, const etl_derived *dv, const etl_cat *k, uint64_t *local) {
  const uint32_t d = dv->src[0];
  const etl_dense_ops *ops = &r->e->dense[d].ops;
  const dlrec_text t = r->din[d];
  double x = ops->fill_value;
  const char *why = NULL;
  if (t.n && r->x) x = r->x[d];
  else if (t.n) why = dlrec_parse_number(t.s, t.n, &x);
  if (why) return dlrec_parse_error(r->w, r->L->dense_field[d], r->e->schema.dense_names[d], why, t.s, t.n);
  *local = ETL_LOCAL_MISSING;
  if (t.n || ops->fill) {
    const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, etl_clip(ops, x));
    *local = etl_cat_local(k, b, keymap_hash(b));
  }
  return DLREC_OK;
}

static int bucketize_same(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  (void)a, (void)b;
  return x->n_bounds == y->n_bounds && etl_same_bits(x->bounds, y->bounds, x->n_bounds * sizeof *x->bounds);
}

static void bucketize_free(etl_derived *d) {
  free(d->bounds);
  d->bounds = NULL;
}

static const char *const state_keys[] = {"column", "boundaries", "quantiles", NULL};

const etl_op_type etl_op_bucketize = {
    .name = "bucketize",
    .role = ETL_ROLE_CAT,
    .flags = ETL_OP_EVERY_VALUE,
    .state_keys = state_keys,
    .parse = bucketize_parse,
    .load = bucketize_load,
    .save = bucketize_save,
    .holds = bucketize_holds,
    .fit_end = bucketize_fit_end,
    .encode_cat = bucketize_encode,
    .same = bucketize_same,
    .free = bucketize_free,
};
