/* Internal: etl fit's pass (etl_fit.c) and its vocabularies (etl_fit_vocab.c):
 * the run's context, what each worker counts, and the spill of count tables
 * within --memory-mb. */
#ifndef DLREC_DATA_ETL_FIT_H
#define DLREC_DATA_ETL_FIT_H

#include "data/etl_op.h"
#include "core/progress.h"

/* Within --memory-mb (docs/etl.md, Memory): the most blocks in flight, and
 * the keys an empty count table starts with (small: every worker has one per
 * column, and the big ones grow anyway). */
#define ETL_FIT_BUDGET_JOBS 8
#define ETL_FIT_BUDGET_MAP 32

typedef struct fit_worker {
  keymap maps[DLREC_MAX_SPARSE]; /* the input's columns, then the derived categorical ones */
  uint64_t cat_missing[DLREC_MAX_SPARSE];
  /* The derived columns' accumulators (etl_op_type.fit_acc_new), by their
   * index among the workflow's categorical and dense columns. */
  void *cat_acc[DLREC_MAX_SPARSE], *dense_acc[DLREC_MAX_DENSE];
  dlrec_raw_row row;
  char *scratch; /* CSV unescaping, max_line_bytes + 1 */
  /* Multi-hot columns: the row's keys (grown as needed), and the most values
   * a row had in each column. */
  uint64_t *mkeys;
  size_t mcap;
  uint32_t mbegin[DLREC_MAX_SPARSE], mcount[DLREC_MAX_SPARSE];
  uint32_t max_values[DLREC_MAX_SPARSE];
} fit_worker;

/* Shifted sums of one dense column (shift = its first value), for a mean and
 * variance without the cancellation of raw sums of squares. Values are
 * within float32's range (fit_row refuses others), so a shifted square is
 * below 4.7e77 and 2^64 of them below 1e97: the sums cannot overflow. */
typedef struct dense_acc {
  int started;
  double shift, s1, s2;
  uint64_t count;
  double min, max;
} dense_acc;

typedef struct fit_ctx {
  etl_inputs in;
  const dlrec_etl_fit_opts *o;
  dlrec_columns cols;
  uint32_t nd, nc;
  int multi; /* some column is multi-hot */
  fit_worker *workers;
  int n_workers;
  uint64_t rows, positives, bad, bytes, truncated;
  etl_shorts shorts;
  dense_acc acc[DLREC_MAX_DENSE];
  /* The workflow; for the columns an operator holds (a median fill, a
   * bucketized column), the column's clipped values so far (every one: an
   * exact median or quantile needs them). */
  etl_workflow wf;
  int any_held, held[DLREC_MAX_DENSE];
  double *med[DLREC_MAX_DENSE];
  size_t med_n[DLREC_MAX_DENSE], med_cap[DLREC_MAX_DENSE];
  dlrec_progress *progress;
  /* --memory-mb: the budget of the count tables (0: none), the runs they
   * spill to (per column, in spill_dir), and vocabularies sorted on disk. */
  uint64_t budget;
  char spill_dir[4096];
  int made_spill_dir;
  etl_runs runs[DLREC_MAX_SPARSE], vocab[DLREC_MAX_SPARSE];
  _Atomic uint64_t spilled; /* bytes of runs written */
} fit_ctx;

/* After a block: a worker's count tables beyond its share of the budget
 * are written out (etl_fit_vocab.c). */
dlrec_status etl_fit_spill_check(fit_ctx *x, fit_worker *W);

/* Merges the workers' counts and builds every input column's vocabulary
 * (or ranked buckets), and those of the derived columns counted by key,
 * columns in parallel (one at a time within a budget). */
dlrec_status etl_fit_finish_columns(fit_ctx *x, dlrec_etl *e);

#endif
