/* The sparse optimizer's fields, shared by its object (sparse_optim.c) and
 * the CPU's fused backward (cpu/sparse_update.c), which reads them in its
 * hot loop. Other code goes through sparse_optim.h. */
#ifndef DLREC_BACKEND_SPARSE_OPTIM_IMPL_H
#define DLREC_BACKEND_SPARSE_OPTIM_IMPL_H

#include "backend/sparse_optim.h"

struct dlrec_sparse_optim {
  const dlrec_table *table;
  dlrec_sparse_optim_config cfg;
  uint64_t rows;
  uint32_t dim, stride;
  float *accum;    /* (rows) row-wise Adagrad */
  float *m, *v;    /* (rows, stride) (lazy) Adam */
  uint32_t *steps; /* (rows) (lazy) Adam */
  void *map;       /* one mapping holds all of the state */
  size_t map_bytes;
  double log_beta1, log_beta2; /* for the per-row bias corrections */
  dlrec_table_dtype dtype;     /* the table's */
  uint64_t updates;            /* calls that changed rows: keys a 16-bit table's stochastic rounding */
  const uint64_t *row_keys;    /* each table row's row in the logical table (a tiered cache); NULL: itself */
};

#endif
