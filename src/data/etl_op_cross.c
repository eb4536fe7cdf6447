/* cross: a hashed categorical column of 2 to 8 one-hot categorical input
 * columns together (NVTabular's HashedCross):
 *
 *   workflow  {"cross": [{"columns": ["C1", "C2"], "buckets": 100000, "name": "C1_x_C2"}]}
 *   etl.json  "op": {"kind": "cross", "columns": ["C1", "C2"]}; the column
 *             is "hashed" with its "buckets"
 *
 * A row's key mixes its sources' keys in order (an empty field's key is
 * DLREC_ETL_MISSING_KEY); a row whose sources are all empty is missing. Fit
 * counts the keys as it counts an input column's values (spilled within
 * --memory-mb alike), and the buckets are ranked by frequency as any hashed
 * column's; the default name joins the sources' with "_x_". */
#include <stdio.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/json.h"

/* A cross's key from its sources' keys (DLREC_ETL_MISSING_KEY for an empty
 * field), in order. */
static inline uint64_t etl_cross_key(const uint64_t *keys, uint32_t n) {
  uint64_t h = 0;
  for (uint32_t i = 0; i < n; i++) h = dlrec_mix64(h ^ keys[i]);
  return h;
}

static dlrec_status cross_parse(const cJSON *o, const char *what, const dlrec_columns *cols, etl_derived *d,
                                char *dflt, size_t dflt_size) {
  static const char *const keys[] = {"columns", "buckets", "name", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "columns");
  int n = cJSON_IsArray(c) ? cJSON_GetArraySize(c) : 0;
  if (n < 2 || n > ETL_CROSS_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: 'columns' must list 2 to %d categorical columns", what, ETL_CROSS_MAX);
  dflt[0] = '\0';
  for (int i = 0; i < n; i++) {
    int k = etl_workflow_source(cols, cJSON_GetArrayItem(c, i), 1, what);
    if (k < 0) return DLREC_ERR_INVALID;
    d->src[d->n_src++] = (uint32_t)k;
    snprintf(dflt + strlen(dflt), dflt_size - strlen(dflt), "%s%s", i ? "_x_" : "", cols->cat[k]);
  }
  return etl_workflow_uint(o, "buckets", what, 1, UINT32_MAX - 2, UINT64_MAX, &d->buckets);
}

static dlrec_status cross_load(const cJSON *op, const char *what, const dlrec_columns *c, etl_derived *d) {
  const cJSON *cols = cJSON_GetObjectItemCaseSensitive(op, "columns");
  int n = cJSON_IsArray(cols) ? cJSON_GetArraySize(cols) : 0;
  if (n < 2 || n > ETL_CROSS_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: op: 'columns' must list 2 to %d columns", what, ETL_CROSS_MAX);
  for (int k = 0; k < n; k++) {
    int i = etl_input_index((const char(*)[DLREC_NAME_MAX])c->cat, c->n_cat, cJSON_GetArrayItem(cols, k));
    if (i < 0 || c->sep[i])
      return dlrec_error(DLREC_ERR_INVALID, "%s: op: columns[%d] is not a one-hot categorical input column", what, k);
    d->src[d->n_src++] = (uint32_t)i;
  }
  return DLREC_OK;
}

static void cross_save(const dlrec_columns *cols, const etl_derived *d, cJSON *o) {
  cJSON *c = cJSON_AddArrayToObject(o, "columns");
  for (uint32_t k = 0; k < d->n_src; k++) cJSON_AddItemToArray(c, cJSON_CreateString(cols->cat[d->src[k]]));
}

static dlrec_status cross_fit_row(const etl_derived *d, const etl_fit_slot *s, const etl_fit_row *r) {
  uint64_t ks[ETL_CROSS_MAX];
  int any = 0;
  for (uint32_t k = 0; k < d->n_src; k++) {
    const uint32_t c = d->src[k];
    any |= r->row->cat[c].n != 0;
    ks[k] = r->row->cat[c].n ? r->keys[c] : DLREC_ETL_MISSING_KEY;
  }
  if (!any) {
    (*s->missing)++;
    return DLREC_OK;
  }
  const uint64_t h = etl_cross_key(ks, d->n_src);
  return keymap_count(s->map, h, keymap_hash(h));
}

static dlrec_status cross_encode(const etl_row *r, const etl_derived *d, const etl_cat *k, uint64_t *local) {
  uint64_t keys[ETL_CROSS_MAX];
  int any = 0;
  for (uint32_t j = 0; j < d->n_src; j++) {
    any |= r->cin[d->src[j]].n != 0;
    keys[j] = etl_row_key(r, d->src[j]);
  }
  const uint64_t h = etl_cross_key(keys, d->n_src);
  *local = any ? etl_cat_local(k, h, keymap_hash(h)) : ETL_LOCAL_MISSING;
  return DLREC_OK;
}

/* Its buckets are the column's, compared with it. */
static int cross_same(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  (void)a, (void)b, (void)x, (void)y;
  return 1;
}

static const char *const state_keys[] = {"columns", NULL};

const etl_op_type etl_op_cross = {
    .name = "cross",
    .role = ETL_ROLE_CAT,
    .flags = ETL_OP_HASHED | ETL_OP_COUNTS_KEYS,
    .state_keys = state_keys,
    .parse = cross_parse,
    .load = cross_load,
    .save = cross_save,
    .fit_row = cross_fit_row,
    .encode_cat = cross_encode,
    .same = cross_same,
};
