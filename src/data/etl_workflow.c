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
 * A dense column's members are its column operators', a list of derived
 * columns is its operator's (etl_op.h's registry; each operator reads its
 * own entries: etl_op_NAME.c); this file frames them: the columns by name,
 * each derived column's name, the limits on columns. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/json.h"

static int find_name(const char (*names)[DLREC_NAME_MAX], uint32_t n, const char *name) {
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return (int)i;
  return -1;
}

int etl_workflow_source(const dlrec_columns *cols, const cJSON *v, int cat, const char *what) {
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

dlrec_status etl_workflow_uint(const cJSON *o, const char *key, const char *what, uint64_t lo, uint64_t hi,
                               uint64_t dflt, uint64_t *out) {
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

/* A dense column's operators: its members, each its column operator's. */
static dlrec_status column_ops(const cJSON *o, const char *what, etl_dense_ops *ops) {
  const char *keys[8];
  int n = 0;
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role == ETL_ROLE_COLUMN) keys[n++] = (*op)->name;
  keys[n] = NULL;
  if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_INVALID, "%s: expected an object of operators", what);
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  for (const etl_op_type *const *op = etl_ops; *op && s == DLREC_OK; op++) {
    const cJSON *v = (*op)->role == ETL_ROLE_COLUMN ? cJSON_GetObjectItemCaseSensitive(o, (*op)->name) : NULL;
    if (v) s = (*op)->column_parse(v, what, 0, ops);
  }
  return s;
}

/* The "dense" object: each input dense column's operators. */
static dlrec_status parse_dense(const cJSON *dense, const dlrec_columns *cols, etl_workflow *wf) {
  if (dense && !cJSON_IsObject(dense))
    return dlrec_error(DLREC_ERR_INVALID, "the workflow: 'dense': expected an object of columns");
  const cJSON *col;
  cJSON_ArrayForEach(col, dense) {
    char what[128];
    snprintf(what, sizeof what, "the workflow: dense column '%.60s'", col->string);
    uint32_t d = 0;
    while (d < cols->n_dense && strcmp(cols->dense[d], col->string)) d++;
    if (d == cols->n_dense) {
      int cat = 0;
      for (uint32_t c = 0; c < cols->n_cat; c++) cat |= !strcmp(cols->cat[c], col->string);
      char names[128];
      etl_op_names(ETL_ROLE_COLUMN, " and ", names, sizeof names);
      return cat ? dlrec_error(DLREC_ERR_INVALID, "%s: is categorical (%s are for dense columns)", what, names)
                 : dlrec_error(DLREC_ERR_INVALID, "%s: no such dense column", what);
    }
    dlrec_status s = column_ops(col, what, &wf->ops[d]);
    if (s != DLREC_OK) return s;
  }
  return DLREC_OK;
}

/* One list of derived columns (op's, op->name in the workflow). */
static dlrec_status parse_list(const cJSON *root, const etl_op_type *op, const dlrec_columns *cols, etl_workflow *wf) {
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, op->name);
  if (!list) return DLREC_OK;
  if (!cJSON_IsArray(list)) return dlrec_error(DLREC_ERR_INVALID, "the workflow: '%s': expected a list", op->name);
  const int dense = op->role == ETL_ROLE_DENSE;
  const cJSON *o;
  int i = 0;
  cJSON_ArrayForEach(o, list) {
    char what[96], dflt[1024];
    snprintf(what, sizeof what, "the workflow: %s[%d]", op->name, i++);
    uint32_t n = dense ? wf->n_dense : wf->n_cat;
    if ((dense ? cols->n_dense : cols->n_cat) + n >= (dense ? DLREC_MAX_DENSE : DLREC_MAX_SPARSE))
      return dlrec_error(DLREC_ERR_INVALID, "%s: more than %d %s columns in all", what,
                         dense ? DLREC_MAX_DENSE : DLREC_MAX_SPARSE, dense ? "dense" : "categorical");
    if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_INVALID, "%s: expected an object", what);
    etl_derived *d = dense ? &wf->dense[n] : &wf->cat[n];
    char *name = dense ? wf->dense_names[n] : wf->cat_names[n];
    d->type = op;
    dlrec_status s = op->parse(o, what, cols, d, dflt, sizeof dflt);
    if (s == DLREC_OK) s = new_name(o, dflt, what, cols, wf, name);
    if (dense) wf->n_dense++;
    else wf->n_cat++;
    if (s != DLREC_OK) return s;
  }
  return DLREC_OK;
}

void etl_workflow_free(etl_workflow *wf) {
  for (uint32_t i = 0; i < wf->n_cat; i++) etl_derived_free(&wf->cat[i]);
  for (uint32_t i = 0; i < wf->n_dense; i++) etl_derived_free(&wf->dense[i]);
  wf->n_cat = wf->n_dense = 0;
}

dlrec_status etl_workflow_parse(const char *text, const dlrec_columns *cols, int raw_keys, etl_workflow *wf) {
  memset(wf, 0, sizeof *wf);
  if (!text) return DLREC_OK;
  const char *keys[16] = {"dense"};
  int n = 1;
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role != ETL_ROLE_COLUMN) keys[n++] = (*op)->name;
  keys[n] = NULL;
  cJSON *root = NULL;
  dlrec_status s = dlrec_json_parse(text, strlen(text), "the workflow", &root);
  if (s == DLREC_OK && !cJSON_IsObject(root)) s = dlrec_error(DLREC_ERR_INVALID, "the workflow: expected an object");
  if (s == DLREC_OK) s = dlrec_json_check_keys(root, "the workflow", keys);
  if (s == DLREC_OK) s = parse_dense(cJSON_GetObjectItemCaseSensitive(root, "dense"), cols, wf);
  /* In the registry's order, the schema's: crosses, then bucketized
   * columns; counts, then targets. */
  for (const etl_op_type *const *op = etl_ops; *op && s == DLREC_OK; op++)
    if ((*op)->role != ETL_ROLE_COLUMN) s = parse_list(root, *op, cols, wf);
  if (s == DLREC_OK && raw_keys && wf->n_dense + wf->n_cat) {
    char names[128];
    etl_op_names(ETL_ROLE_CAT, ", ", names, sizeof names);
    size_t k = strlen(names);
    snprintf(names + k, sizeof names - k, ", ");
    etl_op_names(ETL_ROLE_DENSE, ", ", names + k + 2, sizeof names - k - 2);
    s = dlrec_error(DLREC_ERR_INVALID, "the workflow: --raw-keys takes no derived column (%s): they need the "
                    "vocabularies", names);
  }
  cJSON_Delete(root);
  if (s != DLREC_OK) etl_workflow_free(wf);
  return s;
}
