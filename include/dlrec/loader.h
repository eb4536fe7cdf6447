/* The loader: batches from .dlr files for training and evaluation.
 *
 * Rows of one or more .dlr files (same schema) are cut into batches of
 * batch_rows. With shuffling, each epoch visits the row groups in a random
 * order, takes them window_groups at a time, and emits the window's rows in
 * a random order of slices of slice_rows consecutive rows (slice_rows 1 is a
 * full row shuffle; larger slices copy faster). Every row appears exactly
 * once per epoch. The order depends only on (seed, epoch), never on timing
 * or thread count.
 *
 * A prefetch thread (or several) assembles batches ahead into a bounded queue
 * so that loading overlaps compute.
 *
 * The position after the last batch handed out is exact and plain data: a
 * checkpoint stores it, and dlrec_loader_seek on a loader opened with the same
 * files and options continues with the next row, none lost or repeated.
 */
#ifndef DLREC_LOADER_H
#define DLREC_LOADER_H

#include <stdint.h>

#include "dlrec/schema.h"
#include "dlrec/status.h"

typedef struct dlrec_loader_opts {
  uint32_t batch_rows;     /* rows per batch (the last of an epoch may be short) */
  int shuffle;             /* 0: file order (evaluation, prediction) */
  uint32_t window_groups;  /* row groups mixed together when shuffling */
  uint32_t slice_rows;     /* consecutive rows kept together when shuffling */
  uint64_t seed;
  uint32_t epochs;         /* epochs to run; 0 = without end */
  int drop_last;           /* skip each epoch's short final batch */
  uint32_t prefetch;       /* batches assembled ahead (queue bound) */
  uint32_t threads;        /* assembling threads (>= 1) */
  int verify;              /* check each row group's checksum before first use */
} dlrec_loader_opts;

/* batch 2048, shuffle on, window 8 groups, slices of 32 rows, seed 0,
 * 1 epoch, prefetch 4, 1 thread, verify on. */
void dlrec_loader_opts_default(dlrec_loader_opts *o);

/* Where the next batch starts: `row` rows of epoch `epoch` have been handed
 * out. fingerprint identifies the files and the options that shape the order,
 * so that a position is not applied to a different stream. */
typedef struct dlrec_position {
  uint64_t epoch;
  uint64_t row;
  uint64_t fingerprint;
} dlrec_position;

typedef struct dlrec_batch {
  uint32_t rows;
  const float *labels;                       /* (rows); NULL when unlabeled */
  const float *dense;                        /* (rows, n_dense) */
  const uint32_t *offsets[DLREC_MAX_SPARSE]; /* (rows + 1) per column, from 0 (CSR) */
  const uint32_t *ids[DLREC_MAX_SPARSE];     /* global ids */
  uint64_t epoch;                            /* the epoch the rows belong to */
  dlrec_position end;                        /* the position after this batch */
} dlrec_batch;

typedef struct dlrec_loader dlrec_loader;

/* Opens the files and starts prefetching from the beginning. */
dlrec_status dlrec_loader_open(dlrec_loader **l, const char *const *paths, int n_paths,
                               const dlrec_loader_opts *o);

const dlrec_schema *dlrec_loader_schema(const dlrec_loader *l);
/* Rows in one epoch (all files; before drop_last). */
uint64_t dlrec_loader_epoch_rows(const dlrec_loader *l);

/* The next batch, valid until the next call of next, seek or close.
 * Returns DLREC_END after the last epoch, or an error (e.g. a corrupt row
 * group, naming the file and group). */
dlrec_status dlrec_loader_next(dlrec_loader *l, const dlrec_batch **b);

/* The position after the last batch handed out (the start before any). */
dlrec_position dlrec_loader_position(const dlrec_loader *l);

/* Continues from p (see dlrec_position). Refuses a position whose
 * fingerprint or range does not match this loader. */
dlrec_status dlrec_loader_seek(dlrec_loader *l, dlrec_position p);

void dlrec_loader_close(dlrec_loader *l); /* accepts NULL */

#endif
