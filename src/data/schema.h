/* The schema of an encoded dataset: a label, dense (float) columns and sparse
 * (categorical) columns whose ids index one fused embedding table.
 *
 * Shared by the ETL (which writes it), .dlr files (which store it) and the
 * loader and models (which read it). Plain data: copy it freely.
 */
#ifndef DLREC_SCHEMA_H
#define DLREC_SCHEMA_H

#include <stdint.h>

#include "core/pooling.h"
#include "core/status.h"

#define DLREC_MAX_DENSE 256
#define DLREC_MAX_SPARSE 256
#define DLREC_NAME_MAX 48 /* bytes, NUL included */

typedef struct dlrec_sparse_col {
  char name[DLREC_NAME_MAX];
  /* Ids per row when every row has the same number (1 for one-hot Criteo
   * columns: a missing value has an id of its own); 0 when rows vary, in which
   * case each row group stores offsets for the column. */
  uint32_t hotness;
  uint32_t max_hotness; /* the most ids any row has (== hotness when fixed) */
  /* The column's rows in the fused table: global ids are in [id_begin, id_end).
   * Its most frequent values come first, so a hot cache is a prefix check. */
  uint64_t id_begin, id_end;
  /* How a model pools the embeddings of a row's ids (dlrec_pooling,
   * core/pooling.h). Recorded
   * in the ETL state, not in .dlr files: the trainer and server take the
   * schema from the state, and one-hot columns pool the same either way. */
  uint32_t pooling;
} dlrec_sparse_col;

typedef struct dlrec_schema {
  int has_label;              /* 0 for unlabeled (prediction) data */
  char label_name[DLREC_NAME_MAX];
  uint32_t n_dense;
  uint32_t n_sparse;
  char dense_names[DLREC_MAX_DENSE][DLREC_NAME_MAX];
  dlrec_sparse_col sparse[DLREC_MAX_SPARSE];
  uint64_t table_rows;        /* rows of the fused table: every id_end <= table_rows */
  /* Raw keys instead of ids (dlrec etl fit --raw-keys; a hash table trains
   * on them): each value of a sparse column is a 64-bit key stored as two
   * ids, its low then its high 32 bits, so hotness, max_hotness and offsets
   * count two per value; every column's range is [0, 2^32) and table_rows
   * is 2^32 (nothing indexes a table by these words). */
  int keys;
} dlrec_schema;

/* The range and table_rows of a keys schema's columns. */
#define DLREC_KEYS_RANGE (1ull << 32)

/* Checks internal consistency (counts within limits, names NUL-terminated and
 * unique, ranges ordered and inside table_rows, hotness <= max_hotness).
 * `what` names the schema's source in the error. */
dlrec_status dlrec_schema_validate(const dlrec_schema *s, const char *what);

/* 1 when two schemas describe the same encoding (names, counts, ranges). */
int dlrec_schema_equal(const dlrec_schema *a, const dlrec_schema *b);

#endif
