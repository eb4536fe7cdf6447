/* fill_missing: an input dense column's missing values replaced by a
 * number, or by "median", the median of the column's values in fit after
 * clipping (numpy's: the mean of the two middle values of an even count):
 *
 *   workflow  {"dense": {"I1": {"fill_missing": "median"}, "I5": {"fill_missing": 0}}}
 *   etl.json  the dense column's member "fill_missing": {"kind": "median", "value": 3}
 *             ("constant" for a number)
 *
 * A missing value then encodes as the fill does (clipped, transformed,
 * standardized: computed once when the state loads), and fit counts the
 * filled rows in the mean and std that standardize uses. A median needs
 * every value of its column held in fit's memory until the pass ends. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/json.h"
#include "core/log.h"

static dlrec_status fill_parse_workflow(const cJSON *fill, const char *what, etl_dense_ops *op) {
  if (cJSON_IsString(fill) && !strcmp(fill->valuestring, "median")) {
    op->fill = ETL_FILL_MEDIAN;
  } else if (cJSON_IsNumber(fill) && isfinite(fill->valuedouble)) {
    op->fill = ETL_FILL_CONSTANT;
    op->fill_value = fill->valuedouble;
  } else {
    return dlrec_error(DLREC_ERR_INVALID, "%s: fill_missing: expected a number or \"median\"", what);
  }
  return DLREC_OK;
}

/* As fill_json writes it: the kind, and the value (a median's, fitted). */
static dlrec_status fill_parse(const cJSON *f, const char *what, int from_state, etl_dense_ops *op) {
  if (!from_state) return fill_parse_workflow(f, what, op);
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
  return DLREC_OK;
}

static int fill_set(const etl_dense_ops *op) { return op->fill != ETL_FILL_NONE; }

static cJSON *fill_json(const etl_dense_ops *op) {
  cJSON *f = cJSON_CreateObject();
  cJSON_AddStringToObject(f, "kind", op->fill == ETL_FILL_MEDIAN ? "median" : "constant");
  cJSON_AddItemToObject(f, "value", cJSON_CreateNumber(op->fill_value));
  return f;
}

static int fill_holds(const etl_dense_ops *op) { return op->fill == ETL_FILL_MEDIAN; }

/* Reorders v[0, n) so that v[k] is the value a sort would put there, every
 * value before it <= it and every one after >= it: quickselect on a
 * median-of-three pivot (Hoare's partition), falling back to a sort of what
 * is left when the partitions shrink slowly (an adversarial order). */
static void select_kth(double *v, size_t n, size_t k) {
  size_t lo = 0, hi = n, budget = 64;
  while (hi - lo > 16) {
    if (budget-- == 0) {
      qsort(v + lo, hi - lo, sizeof *v, etl_cmp_double);
      return;
    }
    double a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
    double p = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
    size_t i = lo, j = hi - 1;
    for (;;) {
      while (v[i] < p) i++;
      while (v[j] > p) j--;
      if (i >= j) break;
      double t = v[i];
      v[i++] = v[j];
      v[j--] = t;
    }
    /* [lo, j] <= p <= [j + 1, hi) */
    if (k <= j) hi = j + 1;
    else lo = j + 1;
  }
  qsort(v + lo, hi - lo, sizeof *v, etl_cmp_double);
}

/* numpy's median of n values (reordered here): the middle one, or the mean
 * of the two middle ones; 0 (and a warning) without values. */
static double median(double *v, size_t n, const char *name) {
  if (n == 0) {
    DLREC_WARN("fit: column %s has no value to take a median of: missing values are filled with 0", name);
    return 0.0;
  }
  select_kth(v, n, n / 2);
  if (n % 2) return v[n / 2];
  double below = v[0]; /* the largest of v[0, n/2), all <= v[n/2] */
  for (size_t i = 1; i < n / 2; i++)
    if (v[i] > below) below = v[i];
  return (below + v[n / 2]) / 2;
}

static void fill_fit_end(etl_dense_ops *op, double *held, size_t n, const char *name) {
  if (op->fill == ETL_FILL_MEDIAN) op->fill_value = median(held, n, name);
}

static int fill_fills(const etl_dense_ops *op, double *x) {
  *x = op->fill_value;
  return op->fill != ETL_FILL_NONE;
}

/* A missing value's encoding, once the transform and statistics are known:
 * the fill's runs through the encoder as any value. */
static dlrec_status fill_prepare(dlrec_etl *e, uint32_t i, const char *what) {
  etl_dense *d = &e->dense[i];
  const char *why = d->ops.fill ? etl_dense_encode(e, i, d->ops.fill_value, &d->fill_out) : NULL;
  if (why) return dlrec_error(DLREC_ERR_INVALID, "%s: dense[%u]: fill_missing: %s", what, i, why);
  return DLREC_OK;
}

static int fill_same(const etl_dense_ops *p, const etl_dense_ops *q) {
  return p->fill == q->fill && (!p->fill || etl_same_bits(&p->fill_value, &q->fill_value, sizeof p->fill_value));
}

const etl_op_type etl_op_fill = {
    .name = "fill_missing",
    .role = ETL_ROLE_COLUMN,
    .column_parse = fill_parse,
    .column_set = fill_set,
    .column_json = fill_json,
    .column_holds = fill_holds,
    .column_fit_end = fill_fit_end,
    .column_fills = fill_fills,
    .column_prepare = fill_prepare,
    .column_same = fill_same,
};
