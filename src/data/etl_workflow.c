/* The ETL workflow (`dlrec etl fit --workflow W.json`): column operators
 * declared per column, recorded in the ETL state and applied wherever rows
 * are encoded (etl_encode_row: apply, predict and the server alike).
 *
 *   {"dense": {"I1": {"fill_missing": "median", "clip": [0, 1000]},
 *              "I2": {"fill_missing": 0, "clip": [null, 50]}},
 *    "cross": [{"columns": ["C1", "C2"], "buckets": 1000}],
 *    "bucketize": [{"column": "I1", "boundaries": [1, 10]}, {"column": "I2", "quantiles": 4}],
 *    "count": [{"column": "C3"}],
 *    "target": [{"column": "C4", "folds": 5, "smoothing": 20, "seed": 0}]}
 *
 * fill_missing: a number, or "median" (of the column's clipped values in
 * fit, numpy's median: the mean of the two middle values of an even count);
 * clip: [low, high], either null for no bound. Both are in the raw units of
 * the input, before the dense transform. The other four add derived columns
 * (docs/etl.md, "Derived columns"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_internal.h"
#include "core/json.h"

static dlrec_status bound(const cJSON *v, const char *what, int i, double none, double *out) {
  if (cJSON_IsNull(v)) {
    *out = none;
    return DLREC_OK;
  }
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return dlrec_error(DLREC_ERR_INVALID, "%s: clip[%d]: expected a number or null", what, i);
  *out = v->valuedouble;
  return DLREC_OK;
}

dlrec_status etl_clip_parse(const cJSON *clip, const char *what, etl_dense_ops *op) {
  if (!cJSON_IsArray(clip) || cJSON_GetArraySize(clip) != 2)
    return dlrec_error(DLREC_ERR_INVALID, "%s: clip: expected [low, high]", what);
  dlrec_status s;
  if ((s = bound(cJSON_GetArrayItem(clip, 0), what, 0, -INFINITY, &op->clip_lo)) != DLREC_OK ||
      (s = bound(cJSON_GetArrayItem(clip, 1), what, 1, INFINITY, &op->clip_hi)) != DLREC_OK)
    return s;
  if (!(op->clip_lo <= op->clip_hi))
    return dlrec_error(DLREC_ERR_INVALID, "%s: clip: low %g is above high %g", what, op->clip_lo, op->clip_hi);
  op->clip = 1;
  return DLREC_OK;
}

static dlrec_status column_ops(const cJSON *o, const char *what, etl_dense_ops *op) {
  static const char *const keys[] = {"fill_missing", "clip", NULL};
  if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_INVALID, "%s: expected an object of operators", what);
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  const cJSON *fill = cJSON_GetObjectItemCaseSensitive(o, "fill_missing");
  if (cJSON_IsString(fill) && !strcmp(fill->valuestring, "median")) {
    op->fill = ETL_FILL_MEDIAN;
  } else if (cJSON_IsNumber(fill) && isfinite(fill->valuedouble)) {
    op->fill = ETL_FILL_CONSTANT;
    op->fill_value = fill->valuedouble;
  } else if (fill) {
    return dlrec_error(DLREC_ERR_INVALID, "%s: fill_missing: expected a number or \"median\"", what);
  }
  const cJSON *clip = cJSON_GetObjectItemCaseSensitive(o, "clip");
  return clip ? etl_clip_parse(clip, what, op) : DLREC_OK;
}

static int find_name(const char (*names)[DLREC_NAME_MAX], uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return (int)i;
  return -1;
}

/* An input column's index by name: categorical (cat) or dense; -1 with an
 * error naming what is wrong. */
static int source(const dlrec_columns *cols, const cJSON *v, int cat, const char *what) {
  if (!cJSON_IsString(v)) {
    dlrec_error(DLREC_ERR_INVALID, "%s: expected a column name", what);
    return -1;
  }
  const char *name = v->valuestring;
  int c = find_name((const char(*)[DLREC_NAME_MAX])cols->cat, cols->n_cat, name);
  int d = find_name((const char(*)[DLREC_NAME_MAX])cols->dense, cols->n_dense, name);
  if (cat && c >= 0 && cols->sep[c]) {
    dlrec_error(DLREC_ERR_INVALID, "%s: '%s' is multi-hot (a source must be one-hot)", what, name);
    return -1;
  }
  if (cat ? c >= 0 : d >= 0) return cat ? c : d;
  dlrec_error(DLREC_ERR_INVALID, "%s: '%s' is %s", what, name,
              (cat ? d : c) >= 0 ? (cat ? "dense (expected a categorical column)" : "categorical (expected a dense column)")
                                 : "not a column of the input");
  return -1;
}

static dlrec_status get_uint(const cJSON *o, const char *key, const char *what, uint64_t lo, uint64_t hi, uint64_t dflt,
                             uint64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v) {
    if (dflt == UINT64_MAX) return dlrec_error(DLREC_ERR_INVALID, "%s: missing '%s'", what, key);
    *out = dflt;
    return DLREC_OK;
  }
  double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
  if (!(x >= (double)lo && x <= (double)hi) || x != floor(x))
    return dlrec_error(DLREC_ERR_INVALID, "%s: '%s' must be an integer in [%llu, %llu]", what, key,
                       (unsigned long long)lo, (unsigned long long)hi);
  *out = (uint64_t)x;
  return DLREC_OK;
}

/* The new column's name: given, or the default; new among every column. */
static dlrec_status new_name(const cJSON *o, const char *dflt, const char *what, const dlrec_columns *cols,
                             const etl_workflow *wf, char *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "name");
  if (v && (!cJSON_IsString(v) || !v->valuestring[0]))
    return dlrec_error(DLREC_ERR_INVALID, "%s: 'name' must be a non-empty string", what);
  const char *name = v ? v->valuestring : dflt;
  if (strlen(name) >= DLREC_NAME_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: name '%.60s' is longer than %d bytes", what, name, DLREC_NAME_MAX - 1);
  if (find_name((const char(*)[DLREC_NAME_MAX])cols->cat, cols->n_cat, name) >= 0 ||
      find_name((const char(*)[DLREC_NAME_MAX])cols->dense, cols->n_dense, name) >= 0 || !strcmp(name, cols->label) ||
      find_name((const char(*)[DLREC_NAME_MAX])wf->dense_names, wf->n_dense, name) >= 0 ||
      find_name((const char(*)[DLREC_NAME_MAX])wf->cat_names, wf->n_cat, name) >= 0)
    return dlrec_error(DLREC_ERR_INVALID, "%s: a column named '%s' exists already (give it another 'name')", what, name);
  strcpy(out, name);
  return DLREC_OK;
}

static dlrec_status parse_cross(const cJSON *o, const char *what, const dlrec_columns *cols, etl_workflow *wf,
                                etl_derived *d, char *name) {
  static const char *const keys[] = {"columns", "buckets", "name", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "columns");
  int n = cJSON_IsArray(c) ? cJSON_GetArraySize(c) : 0;
  if (n < 2 || n > ETL_CROSS_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: 'columns' must list 2 to %d categorical columns", what, ETL_CROSS_MAX);
  char dflt[1024] = "";
  for (int i = 0; i < n; i++) {
    int k = source(cols, cJSON_GetArrayItem(c, i), 1, what);
    if (k < 0) return DLREC_ERR_INVALID;
    d->src[d->n_src++] = (uint32_t)k;
    snprintf(dflt + strlen(dflt), sizeof dflt - strlen(dflt), "%s%s", i ? "_x_" : "", cols->cat[k]);
  }
  uint64_t b = 0;
  if ((s = get_uint(o, "buckets", what, 1, UINT32_MAX - 2, UINT64_MAX, &b)) != DLREC_OK) return s;
  d->op = ETL_OP_CROSS;
  d->n_bounds = 0;
  d->groups = b; /* the buckets, until fit sets the column up */
  return new_name(o, dflt, what, cols, wf, name);
}

static dlrec_status parse_bucketize(const cJSON *o, const char *what, const dlrec_columns *cols, etl_workflow *wf,
                                    etl_derived *d, char *name) {
  static const char *const keys[] = {"column", "boundaries", "quantiles", "name", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  int k = source(cols, cJSON_GetObjectItemCaseSensitive(o, "column"), 0, what);
  if (k < 0) return DLREC_ERR_INVALID;
  d->op = ETL_OP_BUCKETIZE;
  d->src[d->n_src++] = (uint32_t)k;
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "boundaries");
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, "quantiles");
  if (!b == !q) return dlrec_error(DLREC_ERR_INVALID, "%s: give either 'boundaries' or 'quantiles'", what);
  if (q) {
    uint64_t n = 0;
    if ((s = get_uint(o, "quantiles", what, 2, ETL_BOUNDS_MAX, UINT64_MAX, &n)) != DLREC_OK) return s;
    d->quantiles = (uint32_t)n;
  } else {
    s = etl_bounds_parse(b, what, d);
    if (s != DLREC_OK) return s;
  }
  char dflt[DLREC_NAME_MAX + 8];
  snprintf(dflt, sizeof dflt, "%s_bucket", cols->dense[k]);
  return new_name(o, dflt, what, cols, wf, name);
}

dlrec_status etl_bounds_parse(const cJSON *b, const char *what, etl_derived *d) {
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

static dlrec_status parse_encoding(const cJSON *o, const char *what, const dlrec_columns *cols, etl_workflow *wf,
                                   etl_derived *d, char *name, int target) {
  static const char *const count_keys[] = {"column", "name", NULL};
  static const char *const target_keys[] = {"column", "name", "folds", "smoothing", "seed", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, target ? target_keys : count_keys);
  if (s != DLREC_OK) return s;
  int k = source(cols, cJSON_GetObjectItemCaseSensitive(o, "column"), 1, what);
  if (k < 0) return DLREC_ERR_INVALID;
  d->op = target ? ETL_OP_TARGET : ETL_OP_COUNT;
  d->src[d->n_src++] = (uint32_t)k;
  if (target) {
    uint64_t folds = 0;
    if (!cols->has_label)
      return dlrec_error(DLREC_ERR_INVALID, "%s: a target encoding needs labels, and the input has none", what);
    if ((s = get_uint(o, "folds", what, 2, ETL_FOLDS_MAX, 5, &folds)) != DLREC_OK) return s;
    if ((s = get_uint(o, "seed", what, 0, (uint64_t)1 << 53, 0, &d->seed)) != DLREC_OK) return s;
    d->folds = (uint32_t)folds;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "smoothing");
    d->smoothing = 20;
    if (m && !(cJSON_IsNumber(m) && m->valuedouble > 0 && isfinite(m->valuedouble)))
      return dlrec_error(DLREC_ERR_INVALID, "%s: 'smoothing' must be a number above 0", what);
    if (m) d->smoothing = m->valuedouble;
  }
  char dflt[DLREC_NAME_MAX + 8];
  snprintf(dflt, sizeof dflt, "%s_%s", cols->cat[k], target ? "target" : "count");
  return new_name(o, dflt, what, cols, wf, name);
}

/* One list of derived columns ("cross", ...): each entry parsed by kind. */
static dlrec_status parse_list(const cJSON *root, const char *key, const dlrec_columns *cols, etl_workflow *wf) {
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!list) return DLREC_OK;
  if (!cJSON_IsArray(list)) return dlrec_error(DLREC_ERR_INVALID, "the workflow: '%s': expected a list", key);
  int dense = !strcmp(key, "count") || !strcmp(key, "target");
  const cJSON *o;
  int i = 0;
  cJSON_ArrayForEach(o, list) {
    char what[96];
    snprintf(what, sizeof what, "the workflow: %s[%d]", key, i++);
    uint32_t n = dense ? wf->n_dense : wf->n_cat;
    if ((dense ? cols->n_dense : cols->n_cat) + n >= (dense ? DLREC_MAX_DENSE : DLREC_MAX_SPARSE))
      return dlrec_error(DLREC_ERR_INVALID, "%s: more than %d %s columns in all", what,
                         dense ? DLREC_MAX_DENSE : DLREC_MAX_SPARSE, dense ? "dense" : "categorical");
    if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_INVALID, "%s: expected an object", what);
    etl_derived *d = dense ? &wf->dense[n] : &wf->cat[n];
    char *name = dense ? wf->dense_names[n] : wf->cat_names[n];
    dlrec_status s = !strcmp(key, "cross")       ? parse_cross(o, what, cols, wf, d, name)
                     : !strcmp(key, "bucketize") ? parse_bucketize(o, what, cols, wf, d, name)
                                                 : parse_encoding(o, what, cols, wf, d, name, !strcmp(key, "target"));
    if (dense) wf->n_dense++;
    else wf->n_cat++;
    if (s != DLREC_OK) return s;
  }
  return DLREC_OK;
}

void etl_workflow_free(etl_workflow *wf) {
  for (uint32_t i = 0; i < wf->n_cat; i++) free(wf->cat[i].bounds);
  for (uint32_t i = 0; i < wf->n_dense; i++) {
    free(wf->dense[i].full);
    free(wf->dense[i].oof);
  }
  wf->n_cat = wf->n_dense = 0;
}

dlrec_status etl_workflow_parse(const char *text, const dlrec_columns *cols, int raw_keys, etl_workflow *wf) {
  memset(wf, 0, sizeof *wf);
  if (!text) return DLREC_OK;
  static const char *const keys[] = {"dense", "cross", "bucketize", "count", "target", NULL};
  cJSON *root = NULL;
  dlrec_status s = dlrec_json_parse(text, strlen(text), "the workflow", &root);
  if (s == DLREC_OK && !cJSON_IsObject(root)) s = dlrec_error(DLREC_ERR_INVALID, "the workflow: expected an object");
  if (s == DLREC_OK) s = dlrec_json_check_keys(root, "the workflow", keys);
  const cJSON *dense = s == DLREC_OK ? cJSON_GetObjectItemCaseSensitive(root, "dense") : NULL;
  if (s == DLREC_OK && dense && !cJSON_IsObject(dense))
    s = dlrec_error(DLREC_ERR_INVALID, "the workflow: 'dense': expected an object of columns");
  const cJSON *col;
  cJSON_ArrayForEach(col, dense) {
    if (s != DLREC_OK) break;
    char what[128];
    snprintf(what, sizeof what, "the workflow: dense column '%.60s'", col->string);
    uint32_t d = 0;
    while (d < cols->n_dense && strcmp(cols->dense[d], col->string)) d++;
    if (d == cols->n_dense) {
      int cat = 0;
      for (uint32_t c = 0; c < cols->n_cat; c++) cat |= !strcmp(cols->cat[c], col->string);
      s = dlrec_error(DLREC_ERR_INVALID, "%s: %s", what,
                      cat ? "is categorical (fill_missing and clip are for dense columns)" : "no such dense column");
      break;
    }
    s = column_ops(col, what, &wf->ops[d]);
  }
  /* Schema order: crosses, then bucketized columns; counts, then targets. */
  static const char *const lists[] = {"cross", "bucketize", "count", "target"};
  for (int i = 0; i < 4 && s == DLREC_OK; i++) s = parse_list(root, lists[i], cols, wf);
  if (s == DLREC_OK && raw_keys && wf->n_dense + wf->n_cat)
    s = dlrec_error(DLREC_ERR_INVALID, "the workflow: --raw-keys takes no derived column (cross, bucketize, count, "
                    "target): they need the vocabularies");
  cJSON_Delete(root);
  if (s != DLREC_OK) etl_workflow_free(wf);
  return s;
}
