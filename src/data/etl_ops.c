/* The registry of ETL operators (etl_op.h), and what their files share:
 * sources resolved by name, a derived dense column's statistics. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/json.h"

/* The order is the state's: a dense column's members fill_missing then
 * clip; derived columns crosses, then bucketized columns (categorical),
 * counts, then targets (dense). */
const etl_op_type *const etl_ops[] = {
    &etl_op_fill, &etl_op_clip, &etl_op_cross, &etl_op_bucketize, &etl_op_count, &etl_op_target, NULL,
};

const etl_op_type *etl_op_find(const char *name, etl_op_role role) {
  for (const etl_op_type *const *op = etl_ops; *op; op++)
    if ((*op)->role == role && !strcmp((*op)->name, name)) return *op;
  return NULL;
}

void etl_op_names(etl_op_role role, const char *sep, char *out, size_t size) {
  size_t n = 0;
  out[0] = '\0';
  for (const etl_op_type *const *op = etl_ops; *op && n < size; op++)
    if ((*op)->role == role) n += (size_t)snprintf(out + n, size - n, "%s%s", n ? sep : "", (*op)->name);
}

int etl_input_index(const char (*names)[DLREC_NAME_MAX], uint32_t n, const cJSON *v) {
  if (!cJSON_IsString(v)) return -1;
  for (uint32_t i = 0; i < n; i++)
    if (!strcmp(names[i], v->valuestring)) return (int)i;
  return -1;
}

dlrec_status etl_state_source(const cJSON *op, const char *what, const dlrec_columns *c, int cat, etl_derived *d) {
  const cJSON *col = cJSON_GetObjectItemCaseSensitive(op, "column");
  int i = cat ? etl_input_index((const char(*)[DLREC_NAME_MAX])c->cat, c->n_cat, col)
              : etl_input_index((const char(*)[DLREC_NAME_MAX])c->dense, c->n_dense, col);
  if (i < 0 || (cat && c->sep[i]))
    return dlrec_error(DLREC_ERR_INVALID, "%s: op: 'column' is not a %s input column", what,
                       cat ? "one-hot categorical" : "dense");
  d->src[d->n_src++] = (uint32_t)i;
  return DLREC_OK;
}

int etl_cmp_double(const void *pa, const void *pb) {
  const double a = *(const double *)pa, b = *(const double *)pb;
  return (a > b) - (a < b);
}

/* In group order, so deterministic. */
void etl_group_stats(etl_dense *out, const double *xv, const uint64_t *w, uint64_t groups, uint64_t rows) {
  double sum = 0, var = 0, lo = INFINITY, hi = -INFINITY;
  for (uint64_t g = 0; g < groups; g++) {
    if (!w[g]) continue;
    sum += (double)w[g] * etl_transform(out->transform, xv[g]);
    if (xv[g] < lo) lo = xv[g];
    if (xv[g] > hi) hi = xv[g];
  }
  const double mean = sum / (double)rows;
  for (uint64_t g = 0; g < groups; g++) {
    const double dt = etl_transform(out->transform, xv[g]) - mean;
    if (w[g]) var += (double)w[g] * dt * dt;
  }
  out->count = rows;
  out->missing = 0;
  out->min = lo;
  out->max = hi;
  out->mean = mean;
  out->std = sqrt(var / (double)rows);
}

dlrec_status etl_fit_needs_vocab(const etl_fit_end *f, uint32_t src) {
  if (!f->e->cat[src].vocab_file) return DLREC_OK;
  return dlrec_error(DLREC_ERR_NOMEM, "fit: %s: the vocabulary of %s did not fit in --memory-mb, and a count or "
                     "target encoding needs it in memory: raise --memory-mb", f->name, f->e->cols.cat[src]);
}
