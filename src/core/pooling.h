/* How a bag of embedding rows (a multi-hot column's ids in one row) pools
 * into one vector. One enum for everything that says it: the ETL schema
 * (multi=NAME:SEP:mean, --pooling), a model's config (model.pooling) and
 * the bag kernels that do it. */
#ifndef DLREC_CORE_POOLING_H
#define DLREC_CORE_POOLING_H

#include <string.h>

#include "core/status.h"

typedef enum dlrec_pooling {
  DLREC_POOLING_SUM = 0, /* the sum of the bag's rows (the default) */
  DLREC_POOLING_MEAN = 1 /* their mean; an empty bag gives zeros */
} dlrec_pooling;

/* "sum" or "mean". */
static inline const char *dlrec_pooling_name(dlrec_pooling p) { return p == DLREC_POOLING_MEAN ? "mean" : "sum"; }

/* The pooling named s[0, n) ("sum" or "mean"): 0 and *out, or -1. */
static inline int dlrec_pooling_parse(const char *s, size_t n, dlrec_pooling *out) {
  if (n == 3 && !memcmp(s, "sum", 3)) *out = DLREC_POOLING_SUM;
  else if (n == 4 && !memcmp(s, "mean", 4)) *out = DLREC_POOLING_MEAN;
  else return -1;
  return 0;
}

#endif
