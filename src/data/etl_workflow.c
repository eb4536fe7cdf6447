/* The ETL workflow (`dlrec etl fit --workflow W.json`): column operators
 * declared per column, recorded in the ETL state and applied wherever rows
 * are encoded (etl_dense_value: apply, predict and the server alike).
 *
 *   {"dense": {"I1": {"fill_missing": "median", "clip": [0, 1000]},
 *              "I2": {"fill_missing": 0, "clip": [null, 50]}}}
 *
 * fill_missing: a number, or "median" (of the column's clipped values in
 * fit, numpy's median: the mean of the two middle values of an even count);
 * clip: [low, high], either null for no bound. Both are in the raw units of
 * the input, before the dense transform. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "data/etl_internal.h"
#include "dlrec/json.h"

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

dlrec_status etl_workflow_parse(const char *text, const dlrec_columns *cols, etl_dense_ops *ops) {
  memset(ops, 0, DLREC_MAX_DENSE * sizeof *ops);
  if (!text) return DLREC_OK;
  static const char *const keys[] = {"dense", NULL};
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
    s = column_ops(col, what, &ops[d]);
  }
  cJSON_Delete(root);
  return s;
}
