/* Schema validation and comparison. */
#include "data/schema.h"

#include <string.h>

static int name_ok(const char *name) { return memchr(name, '\0', DLREC_NAME_MAX) != NULL && name[0]; }

dlrec_status dlrec_schema_validate(const dlrec_schema *s, const char *what) {
  if (s->n_dense > DLREC_MAX_DENSE)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %u dense columns, at most %d", what, s->n_dense, DLREC_MAX_DENSE);
  if (s->n_sparse > DLREC_MAX_SPARSE)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %u sparse columns, at most %d", what, s->n_sparse, DLREC_MAX_SPARSE);
  if (s->n_dense + s->n_sparse == 0) return dlrec_error(DLREC_ERR_INVALID, "%s: no feature columns", what);
  if (s->has_label && !name_ok(s->label_name)) return dlrec_error(DLREC_ERR_INVALID, "%s: bad label name", what);
  for (uint32_t i = 0; i < s->n_dense; i++)
    if (!name_ok(s->dense_names[i])) return dlrec_error(DLREC_ERR_INVALID, "%s: dense column %u: bad name", what, i);
  if (s->keys && s->table_rows != DLREC_KEYS_RANGE)
    return dlrec_error(DLREC_ERR_INVALID, "%s: raw keys, but table rows %llu (expected 2^32)", what,
                       (unsigned long long)s->table_rows);
  for (uint32_t i = 0; i < s->n_sparse; i++) {
    const dlrec_sparse_col *c = &s->sparse[i];
    if (!name_ok(c->name)) return dlrec_error(DLREC_ERR_INVALID, "%s: sparse column %u: bad name", what, i);
    if (s->keys && (c->hotness % 2 || c->max_hotness % 2 || c->id_begin != 0 || c->id_end != DLREC_KEYS_RANGE))
      return dlrec_error(DLREC_ERR_INVALID,
                         "%s: sparse column '%s' of raw keys: hotness %u and max hotness %u must count two ids a key, "
                         "its range [%llu, %llu) must be [0, 2^32)",
                         what, c->name, c->hotness, c->max_hotness, (unsigned long long)c->id_begin,
                         (unsigned long long)c->id_end);
    if (c->max_hotness == 0 || (c->hotness && c->hotness != c->max_hotness))
      return dlrec_error(DLREC_ERR_INVALID, "%s: sparse column '%s': hotness %u, max hotness %u", what, c->name,
                         c->hotness, c->max_hotness);
    if (c->id_begin >= c->id_end || c->id_end > s->table_rows || c->id_end > UINT32_MAX + 1ull)
      return dlrec_error(DLREC_ERR_INVALID,
                         "%s: sparse column '%s': id range [%llu, %llu) is empty or outside the table of %llu rows",
                         what, c->name, (unsigned long long)c->id_begin, (unsigned long long)c->id_end,
                         (unsigned long long)s->table_rows);
  }
  /* Names must be unique across all columns: they are how users refer to them. */
  for (uint32_t i = 0; i < s->n_dense + s->n_sparse; i++) {
    const char *a = i < s->n_dense ? s->dense_names[i] : s->sparse[i - s->n_dense].name;
    for (uint32_t j = i + 1; j < s->n_dense + s->n_sparse; j++) {
      const char *b = j < s->n_dense ? s->dense_names[j] : s->sparse[j - s->n_dense].name;
      if (!strcmp(a, b)) return dlrec_error(DLREC_ERR_INVALID, "%s: column name '%s' appears twice", what, a);
    }
  }
  return DLREC_OK;
}

int dlrec_schema_equal(const dlrec_schema *a, const dlrec_schema *b) {
  if (a->has_label != b->has_label || a->n_dense != b->n_dense || a->n_sparse != b->n_sparse ||
      a->table_rows != b->table_rows || !a->keys != !b->keys)
    return 0;
  if (a->has_label && strcmp(a->label_name, b->label_name)) return 0;
  for (uint32_t i = 0; i < a->n_dense; i++)
    if (strcmp(a->dense_names[i], b->dense_names[i])) return 0;
  for (uint32_t i = 0; i < a->n_sparse; i++) {
    const dlrec_sparse_col *x = &a->sparse[i], *y = &b->sparse[i];
    if (strcmp(x->name, y->name) || x->hotness != y->hotness || x->max_hotness != y->max_hotness ||
        x->id_begin != y->id_begin || x->id_end != y->id_end)
      return 0;
  }
  return 1;
}
