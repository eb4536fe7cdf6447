/* model.embedding_init: how a model's embedding rows are drawn, read from
 * and written to a config's model section beside the type's own keys, and
 * turned into the table's column ranges (backend/table.h draws them).
 *
 *   "embedding_init": "xavier_uniform"
 *   "embedding_init": {"type": "normal", "std": 1e-4,
 *                      "columns": {"user_id": {"type": "uniform", "range": 0.05}}}
 *
 * A config without it writes nothing, so its checkpoints' config.json is
 * what it was before the option existed. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "model/model_type.h"

static const char *const KIND_NAMES[DLREC_INIT_KINDS] = {"uniform_sqrt_rows", "normal", "uniform", "xavier_uniform",
                                                         "zeros"};
#define KIND_LIST "uniform_sqrt_rows, normal, uniform, xavier_uniform, zeros"

/* The parameter a kind takes ("std", "range") or NULL. */
static const char *kind_param(uint32_t kind) {
  return kind == DLREC_INIT_NORMAL ? "std" : kind == DLREC_INIT_UNIFORM ? "range" : NULL;
}

/* One initializer: a kind's name, or an object {"type", and "std" or "range"}
 * (and "columns" where columns_ok). */
static dlrec_status parse_one(dlrec_embed_init *out, const cJSON *v, const char *what, int columns_ok) {
  const char *name = NULL;
  if (cJSON_IsString(v)) name = v->valuestring;
  else if (cJSON_IsObject(v)) {
    static const char *const keys_all[] = {"type", "std", "range", "columns", NULL};
    dlrec_status s = dlrec_json_check_keys(v, what, keys_all);
    if (s == DLREC_OK && !columns_ok && cJSON_GetObjectItemCaseSensitive(v, "columns"))
      s = dlrec_error(DLREC_ERR_INVALID, "%s: unknown field 'columns' (a column's initializer has no columns)", what);
    if (s == DLREC_OK) s = dlrec_json_get_string(v, "type", what, &name);
    if (s != DLREC_OK) return s;
  } else
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected one of " KIND_LIST ", or an object {\"type\": ...}", what);
  uint32_t k = 0;
  while (k < DLREC_INIT_KINDS && strcmp(name, KIND_NAMES[k])) k++;
  if (k == DLREC_INIT_KINDS)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'type': '%s' is not one of " KIND_LIST, what, name);
  *out = (dlrec_embed_init){.kind = k};
  const char *param = kind_param(k);
  for (uint32_t j = 0; cJSON_IsObject(v) && j < DLREC_INIT_KINDS; j++) {
    const char *other = kind_param(j);
    if (other && other != param && cJSON_GetObjectItemCaseSensitive(v, other))
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s' means nothing to '%s'", what, other, name);
  }
  if (!param) return DLREC_OK;
  if (!cJSON_IsObject(v))
    return dlrec_error(DLREC_ERR_INVALID, "%s: '%s' needs its '%s': {\"type\": \"%s\", \"%s\": ...}", what, name,
                       param, name, param);
  double x = 0;
  dlrec_status s = dlrec_json_get_double(v, param, what, &x);
  if (s != DLREC_OK) return s;
  if (!(x > 0.0 && x <= 1000.0))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %g is not in (0, 1000]", what, param, x);
  out->scale = (float)x;
  return DLREC_OK;
}

dlrec_status net_embedding_init_parse(dlrec_embedding_init_config *c, const cJSON *v, const char *model_what) {
  char what[320];
  snprintf(what, sizeof what, "%s.embedding_init", model_what);
  dlrec_embedding_init_config e = {0};
  dlrec_status s = parse_one(&e.all, v, what, 1);
  const cJSON *cols = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "columns") : NULL;
  if (s == DLREC_OK && cols && !cJSON_IsObject(cols))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'columns': expected an object of column names", what);
  for (const cJSON *col = cols ? cols->child : NULL; s == DLREC_OK && col; col = col->next) {
    if (e.n_columns == DLREC_INIT_MAX_COLUMNS)
      return dlrec_error(DLREC_ERR_INVALID, "%s: more than %d columns", what, DLREC_INIT_MAX_COLUMNS);
    if (strlen(col->string) >= DLREC_NAME_MAX)
      return dlrec_error(DLREC_ERR_INVALID, "%s.columns: '%.60s...' is longer than a column name can be", what,
                         col->string);
    for (uint32_t i = 0; i < e.n_columns; i++)
      if (!strcmp(e.column[i], col->string))
        return dlrec_error(DLREC_ERR_INVALID, "%s.columns: field '%s' given twice", what, col->string);
    char cwhat[400];
    snprintf(cwhat, sizeof cwhat, "%s.columns.%s", what, col->string);
    snprintf(e.column[e.n_columns], DLREC_NAME_MAX, "%s", col->string);
    s = parse_one(&e.column_init[e.n_columns++], col, cwhat, 0);
  }
  if (s == DLREC_OK) *c = e;
  return s;
}

static cJSON *one_json(const dlrec_embed_init *in) {
  const char *param = kind_param(in->kind);
  if (!param) return cJSON_CreateString(KIND_NAMES[in->kind]);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", KIND_NAMES[in->kind]);
  cJSON_AddNumberToObject(o, param, in->scale);
  return o;
}

void net_embedding_init_to_json(const dlrec_embedding_init_config *c, cJSON *m) {
  if (c->all.kind == DLREC_INIT_UNIFORM_SQRT_ROWS && !c->n_columns) return;
  cJSON *o = one_json(&c->all);
  if (c->n_columns) {
    if (cJSON_IsString(o)) {
      cJSON *obj = cJSON_CreateObject();
      cJSON_AddStringToObject(obj, "type", o->valuestring);
      cJSON_Delete(o);
      o = obj;
    }
    cJSON *cols = cJSON_AddObjectToObject(o, "columns");
    for (uint32_t i = 0; i < c->n_columns; i++) cJSON_AddItemToObject(cols, c->column[i], one_json(&c->column_init[i]));
  }
  cJSON_AddItemToObject(m, "embedding_init", o);
}

dlrec_status dlrec_net_config_ranges(const dlrec_net_config *c, const dlrec_schema *schema, dlrec_row_range *ranges) {
  const dlrec_embedding_init_config *e = &c->embedding_init;
  for (uint32_t k = 0; k < schema->n_sparse; k++)
    ranges[k] = (dlrec_row_range){.begin = schema->sparse[k].id_begin, .end = schema->sparse[k].id_end, .init = e->all};
  for (uint32_t i = 0; i < e->n_columns; i++) {
    uint32_t k = 0;
    while (k < schema->n_sparse && strcmp(schema->sparse[k].name, e->column[i])) k++;
    if (k == schema->n_sparse)
      return dlrec_error(DLREC_ERR_INVALID,
                         "model.embedding_init.columns: '%s' is not a categorical column of the data (`dlrec inspect` "
                         "lists them)",
                         e->column[i]);
    ranges[k].init = e->column_init[i];
  }
  return DLREC_OK;
}

int dlrec_embedding_init_same(const dlrec_embedding_init_config *a, const dlrec_embedding_init_config *b) {
  return !memcmp(a, b, sizeof *a);
}
