/* The rows of a network's embedding table and their sparse optimizer
 * state, when they live outside the network (across ranks, in the ranks'
 * shards: src/dist/sharded.c): what a checkpoint reads them from and
 * writes them to (train/checkpoint.h). */
#ifndef DLREC_MODEL_ROW_SOURCE_H
#define DLREC_MODEL_ROW_SOURCE_H

#include <stdint.h>

#include "core/status.h"

/* A checkpoint takes table.bin's rows and optim.bin's per-row arrays from
 * get, and a resume hands them to put, in row order, a chunk of rows at a
 * time; a put
 * gets rows before their file's checksum is checked, so a failed resume
 * leaves them unusable. The network is a tableless one of the same config
 * (dlrec_net_create_tableless) and opt's sparse optimizer unused. */
typedef enum dlrec_row_array {
  DLREC_ROWS_TABLE, /* the rows, as the table stores them */
  DLREC_ROWS_ACCUM, /* row-wise Adagrad's accumulator (a float a row) */
  DLREC_ROWS_M,     /* lazy Adam's moments (stride floats a row) */
  DLREC_ROWS_V,
  DLREC_ROWS_STEPS  /* lazy Adam's steps (a uint32 a row) */
} dlrec_row_array;
typedef struct dlrec_row_source {
  uint64_t rows; /* the whole table's */
  dlrec_status (*get)(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, void *out);
  dlrec_status (*put)(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, const void *in);
  void *ctx;
  /* The sparse optimizer's update count (it keys a 16-bit table's rounding):
   * saved from and loaded into *updates; NULL for an fp32 table. */
  uint64_t *updates;
} dlrec_row_source;

#endif
