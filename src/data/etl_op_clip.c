/* clip: an input dense column's values clipped to [low, high], in the raw
 * units of the input (before the dense transform), a null bound being none:
 *
 *   workflow  {"dense": {"I1": {"clip": [0, 1000]}, "I5": {"clip": [null, 1e6]}}}
 *   etl.json  the dense column's member "clip": [0, 1000], as in the workflow
 *
 * fit clips every value it reads (so the state's min and max are of the
 * clipped values, and a median or quantiles too), and so does every
 * encoder: etl_clip, inline in etl_internal.h since it runs on each dense
 * value. */
#include <math.h>

#include "data/etl_op.h"
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

/* The workflow's and the state's clip share the form. */
static dlrec_status clip_parse(const cJSON *clip, const char *what, int from_state, etl_dense_ops *op) {
  (void)from_state;
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

static int clip_set(const etl_dense_ops *op) { return op->clip; }

static cJSON *clip_json(const etl_dense_ops *op) {
  cJSON *c = cJSON_CreateArray();
  cJSON_AddItemToArray(c, isfinite(op->clip_lo) ? cJSON_CreateNumber(op->clip_lo) : cJSON_CreateNull());
  cJSON_AddItemToArray(c, isfinite(op->clip_hi) ? cJSON_CreateNumber(op->clip_hi) : cJSON_CreateNull());
  return c;
}

/* Bounds compared bitwise, as the encoder uses them. */
static int clip_same(const etl_dense_ops *p, const etl_dense_ops *q) {
  return p->clip == q->clip && (!p->clip || (etl_same_bits(&p->clip_lo, &q->clip_lo, sizeof p->clip_lo) &&
                                             etl_same_bits(&p->clip_hi, &q->clip_hi, sizeof p->clip_hi)));
}

const etl_op_type etl_op_clip = {
    .name = "clip",
    .role = ETL_ROLE_COLUMN,
    .column_parse = clip_parse,
    .column_set = clip_set,
    .column_json = clip_json,
    .column_same = clip_same,
};
