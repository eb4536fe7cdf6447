/* Evaluation metrics of click predictions: exact AUC (ties counted as half),
 * logloss, normalized entropy and calibration.
 *
 * An evaluator collects (prediction, label) pairs batch by batch and computes
 * everything at the end in O(n log n) time (a radix sort of the scores).
 */
#ifndef DLREC_METRICS_H
#define DLREC_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DLREC_RELIABILITY_BINS 20

typedef struct dlrec_metrics {
  uint64_t count;      /* rows evaluated */
  double auc;          /* P(score of a random positive > a random negative), ties 1/2; NaN without both classes */
  double logloss;      /* mean binary cross-entropy, predictions clipped to [1e-7, 1 - 1e-7] */
  double ne;           /* normalized entropy: logloss / entropy of the observed CTR (lower is better, 1 = prior) */
  double calibration;  /* mean prediction / observed CTR (1 is calibrated) */
  double ctr;          /* observed click rate */
  double mean_pred;    /* mean prediction */
  /* The reliability (calibration) curve: the rows sorted by prediction and
   * cut into K = min(count, DLREC_RELIABILITY_BINS) bins of equal count
   * (bin b: the sorted rows [b count / K, (b + 1) count / K)), each bin's
   * mean prediction against its observed click rate. Bins past K are zero. */
  struct {
    uint64_t rows;
    double mean_pred, ctr;
  } reliability[DLREC_RELIABILITY_BINS];
} dlrec_metrics;

typedef struct dlrec_evaluator dlrec_evaluator;

/* An evaluator with room for `expected_rows` (it grows if more come). */
dlrec_status dlrec_evaluator_create(dlrec_evaluator **ev, size_t expected_rows);
void dlrec_evaluator_free(dlrec_evaluator *ev); /* accepts NULL */
/* Forgets the rows collected so far, keeping the memory. */
void dlrec_evaluator_reset(dlrec_evaluator *ev);

/* Adds n predicted probabilities in [0, 1] and labels (0 or 1; a label > 0.5 is
 * a click). A NaN prediction is an error (it would poison every metric). */
dlrec_status dlrec_evaluator_add(dlrec_evaluator *ev, const float *pred, const float *label, size_t n);

/* Computes the metrics of every row added since create or reset. */
dlrec_status dlrec_evaluator_compute(dlrec_evaluator *ev, dlrec_metrics *out);

/* One-shot: the metrics of n predictions. */
dlrec_status dlrec_metrics_compute(const float *pred, const float *label, size_t n, dlrec_metrics *out);

#endif
