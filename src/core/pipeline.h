/* An ordered parallel pipeline: produce -> work (parallel) -> consume (in order).
 *
 * The shape of synth, ETL fit and ETL apply: the calling thread produces jobs
 * in order (reads a block of input), worker threads process them in any order
 * (parse, encode, generate), and the calling thread consumes them in the
 * order they were produced (count, write). The caller provides the job slots,
 * so memory is bounded by n_jobs; with n_jobs >= n_workers + 2 the workers
 * never wait for the producer unless it is slower than they are.
 *
 * The first failure (by job order for work and consume) stops the pipeline
 * and is returned, with its message restored on the caller's thread.
 */
#ifndef DLREC_PIPELINE_H
#define DLREC_PIPELINE_H

#include <stdint.h>

#include "core/status.h"

typedef struct dlrec_pipeline_ops {
  /* On the caller's thread, in order. Fills job number seq; returns DLREC_OK,
   * DLREC_END when there is no more input (the job is then unused), or an error. */
  dlrec_status (*produce)(void *ctx, void *job, uint64_t seq);
  /* On a worker thread; `worker` is in [0, n_workers). May be NULL. */
  dlrec_status (*work)(void *ctx, void *job, int worker);
  /* On the caller's thread, in produce order. */
  dlrec_status (*consume)(void *ctx, void *job, uint64_t seq);
} dlrec_pipeline_ops;

/* Runs the pipeline to the end of input. jobs[0..n_jobs) are the caller's job
 * slots (reused; n_jobs >= 1). n_workers 0 runs work on the caller's thread. */
dlrec_status dlrec_pipeline_run(const dlrec_pipeline_ops *ops, void *ctx, void **jobs, int n_jobs,
                                int n_workers);

/* Worker threads to use by default: the number of online CPUs (at least 1). */
int dlrec_default_threads(void);

#endif
