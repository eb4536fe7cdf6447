/* Comparing two ETL states by the encoding they give, through the public
 * accessors only: the files of two equal states may differ in statistics
 * that no encoding reads. */
#include "train/etl_match.h"

#include <string.h>

static dlrec_status same_dense(const dlrec_etl *a, const dlrec_etl *b, uint32_t col, const char *name) {
  dlrec_etl_dense_info x, y;
  dlrec_status s = dlrec_etl_dense_info_get(a, col, &x);
  if (s == DLREC_OK) s = dlrec_etl_dense_info_get(b, col, &y);
  if (s != DLREC_OK) return s;
  if (x.transform != y.transform || x.standardize != y.standardize)
    return dlrec_error(DLREC_ERR_INVALID, "dense column '%s': another transform or standardization", name);
  /* Means and stds are read only when standardizing; compared bitwise, as
   * the encoder uses them. */
  if (x.standardize && (memcmp(&x.mean, &y.mean, sizeof x.mean) || memcmp(&x.std, &y.std, sizeof x.std)))
    return dlrec_error(DLREC_ERR_INVALID, "dense column '%s': another mean or std", name);
  return DLREC_OK;
}

static dlrec_status same_cat(const dlrec_etl *a, const dlrec_etl *b, uint32_t col, const char *name) {
  dlrec_etl_cat_info x, y;
  dlrec_status s = dlrec_etl_cat_info_get(a, col, &x);
  if (s == DLREC_OK) s = dlrec_etl_cat_info_get(b, col, &y);
  if (s != DLREC_OK) return s;
  if (x.key_kind != y.key_kind || (x.key_kind == DLREC_KEY_HASH && x.salt != y.salt))
    return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': another key kind or salt", name);
  if (x.hashed != y.hashed || x.size != y.size)
    return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': another encoding or size", name);
  if (x.hashed) {
    if (x.buckets != y.buckets)
      return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': another number of hash buckets", name);
    for (uint64_t i = 0; i < x.buckets; i++)
      if (x.bucket_rank[i] != y.bucket_rank[i])
        return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': the hash buckets are ranked differently (bucket %llu)",
                           name, (unsigned long long)i);
    return DLREC_OK;
  }
  if (x.kept != y.kept) return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': another vocabulary size", name);
  for (uint64_t i = 0; i < x.kept; i++)
    if (x.keys[i] != y.keys[i])
      return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': the vocabulary differs at local id %llu", name,
                         (unsigned long long)i + 2);
  return DLREC_OK;
}

dlrec_status etl_same_encoding(const dlrec_etl *a, const dlrec_etl *b) {
  if (dlrec_etl_format(a) != dlrec_etl_format(b))
    return dlrec_error(DLREC_ERR_INVALID, "another input format");
  uint32_t na, nb;
  const char *const *ha = dlrec_etl_header(a, &na), *const *hb = dlrec_etl_header(b, &nb);
  if (na != nb) return dlrec_error(DLREC_ERR_INVALID, "another CSV header (%u columns, not %u)", nb, na);
  for (uint32_t i = 0; i < na; i++)
    if (strcmp(ha[i], hb[i]))
      return dlrec_error(DLREC_ERR_INVALID, "CSV header column %u: '%s', not '%s'", i + 1, hb[i], ha[i]);
  const dlrec_schema *sa = dlrec_etl_schema(a), *sb = dlrec_etl_schema(b);
  if (!dlrec_schema_equal(sa, sb))
    return dlrec_error(DLREC_ERR_INVALID, "another schema (columns, names or id ranges)");
  for (uint32_t i = 0; i < sa->n_dense; i++) {
    dlrec_status s = same_dense(a, b, i, sa->dense_names[i]);
    if (s != DLREC_OK) return s;
  }
  for (uint32_t i = 0; i < sa->n_sparse; i++) {
    /* dlrec_schema_equal leaves pooling out (.dlr files do not record it). */
    if (sa->sparse[i].pooling != sb->sparse[i].pooling)
      return dlrec_error(DLREC_ERR_INVALID, "categorical column '%s': another pooling", sa->sparse[i].name);
    dlrec_status s = same_cat(a, b, i, sa->sparse[i].name);
    if (s != DLREC_OK) return s;
  }
  /* The workflow's operators (fill, clip, derived columns). */
  return dlrec_etl_same_operators(a, b);
}
