/* The loader: batches from .dlr files for training and evaluation.
 *
 * Rows of one or more .dlr files (same schema; the files' rows form one
 * stream, file after file) are cut into batches of batch_rows. With
 * shuffling, each epoch visits the row groups of all files in a random
 * order, takes them window_groups at a time, and emits each window's rows in
 * a random order of slices of slice_rows consecutive rows (slice_rows 1 is a
 * full row shuffle inside the window, and costs a cache miss per value;
 * larger slices copy contiguous runs). Batches continue across windows; only
 * an epoch's last batch may be short. Every row appears exactly once per
 * epoch. The order depends only on (files, window_groups, slice_rows, seed,
 * epoch), never on timing or the thread count; docs/formats.md specifies it.
 *
 * `threads` assembling threads fill a ring of prefetch + 1 batch buffers
 * (allocated at open; one is the batch the caller holds) ahead of the
 * caller, so that loading overlaps compute. Each row group is verified once,
 * before its first use, by the thread that first needs it; an error reaches
 * the caller in batch order, from dlrec_loader_next.
 *
 * The position after the last batch handed out is exact and plain data: a
 * checkpoint stores it, and dlrec_loader_seek on a loader opened with the same
 * files and shuffle options continues with the next row, none lost or
 * repeated.
 */
#ifndef DLREC_LOADER_H
#define DLREC_LOADER_H

#include <stdint.h>

#include "data/schema.h"
#include "core/status.h"

typedef struct dlrec_loader_opts {
  uint32_t batch_rows;    /* rows per batch (the last of an epoch may be short) */
  int shuffle;            /* 0: file order (evaluation, prediction) */
  uint32_t window_groups; /* row groups mixed together when shuffling */
  uint32_t slice_rows;    /* consecutive rows kept together when shuffling */
  uint64_t seed;          /* the shuffle's seed (with the epoch) */
  uint32_t epochs;        /* epochs to run; 0 = without end */
  int drop_last;          /* skip each epoch's short final batch */
  uint32_t prefetch;      /* batches assembled ahead (queue bound) */
  uint32_t threads;       /* assembling threads (>= 1) */
  int verify;             /* check each row group's checksum (and id ranges) before first use;
                             with 0, only the offsets that copying relies on are checked */
  /* Data parallelism: this loader hands out part `part` of `parts` of every
   * batch (parts 0 counts as 1; parts in [1, 4096], part < parts). Every
   * part plans the same global batches, in the same order, as parts 1; of a
   * global batch of n rows, part p gets rows [n*p/parts, n*(p+1)/parts), in
   * their order in the batch, as a batch of that many rows (0 when n <
   * parts, still handed out so that the ranks stay in step). batch.end,
   * positions, seek, epoch_rows and the fingerprint are the global stream's,
   * the same on every part, so one saved position resumes every rank. */
  uint32_t part, parts;
} dlrec_loader_opts;

/* batch 2048, shuffle on, window 8 groups, slices of 32 rows, seed 0,
 * 1 epoch, prefetch 4, 1 thread, verify on, part 0 of 1. */
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
  uint32_t rows; /* this part's rows of the global batch (may be 0 with parts > 1) */
  const float *labels;                       /* (rows); NULL when unlabeled */
  const float *dense;                        /* (rows, n_dense) */
  const uint32_t *offsets[DLREC_MAX_SPARSE]; /* (rows + 1) per column, from 0 (CSR); generated
                                                for fixed-hotness columns (row i at i * hotness) */
  const uint32_t *ids[DLREC_MAX_SPARSE];     /* global ids */
  uint64_t epoch;                            /* the epoch the rows belong to */
  dlrec_position end;                        /* the position after this (global) batch, on every part */
} dlrec_batch;

typedef struct dlrec_loader dlrec_loader;

/* Opens the files (all with one schema: dlrec_schema_equal), allocates the
 * ring of prefetch + 1 batch buffers and starts the assembling threads at
 * position (0, 0). Errors name the file (a corrupt header or index, a
 * different schema) or the option out of range. The caller closes *l. */
dlrec_status dlrec_loader_open(dlrec_loader **l, const char *const *paths, int n_paths, const dlrec_loader_opts *o);

const dlrec_schema *dlrec_loader_schema(const dlrec_loader *l);
/* Rows in one epoch (all files; before drop_last). */
uint64_t dlrec_loader_epoch_rows(const dlrec_loader *l);

/* The fingerprint that positions of this loader carry: a hash of the files'
 * content (dlrec_dlr_fingerprint, in order) and, when shuffling, of
 * window_groups, slice_rows and seed. batch_rows, drop_last, epochs, prefetch,
 * threads and verify are not part of it: a position is a row of the stream,
 * so a run may resume with another batch size or thread count. */
uint64_t dlrec_loader_fingerprint(const dlrec_loader *l);

/* The next batch, valid until the next call of next, seek or close.
 * Returns DLREC_END after the last epoch (and at once when no epoch can
 * yield a batch: no rows, or drop_last with fewer rows than a batch), or an
 * error (e.g. a corrupt row group, naming the file, group and offset). An
 * error is sticky: later calls return it again until a seek. Call next,
 * position and seek from one thread (the consumer's). */
dlrec_status dlrec_loader_next(dlrec_loader *l, const dlrec_batch **b);

/* The position after the last batch handed out (the start, or the position
 * given to seek, before any). */
dlrec_position dlrec_loader_position(const dlrec_loader *l);

/* Continues from p (see dlrec_position): the next batch starts at row p.row
 * of epoch p.epoch (the next epoch when that epoch has no batch left). The
 * order is recomputed, no data is read to get there. Refuses, with
 * DLREC_ERR_INVALID, a position whose fingerprint differs from this loader's
 * or that lies past the epoch's rows or the last epoch. Batches handed out
 * before are no longer valid. */
dlrec_status dlrec_loader_seek(dlrec_loader *l, dlrec_position p);

void dlrec_loader_close(dlrec_loader *l); /* accepts NULL */

#endif
