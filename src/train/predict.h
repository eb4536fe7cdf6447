/* Batch prediction: scores rows with a checkpoint's model, one probability
 * per line in input order. Raw rows (the format the model's ETL state was fit
 * on) are encoded with that state, exactly as `etl apply` encodes them;
 * .dlr files are scored as they are. */
#ifndef DLREC_PREDICT_H
#define DLREC_PREDICT_H

#include <stdint.h>
#include <stdio.h>

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "core/status.h"
#include "train/trainer.h"

typedef struct dlrec_predict_opts {
  uint32_t batch_rows;  /* rows per forward pass; 4096 */
  int no_label;         /* raw input rows have no label column */
  int strict_fields;    /* raw Criteo rows of fewer than 40 fields (39 unlabeled) are
                           errors; 0: valid, counted and named in an info line */
  int progress;         /* show a progress bar; 1 */
} dlrec_predict_opts;

void dlrec_predict_opts_default(dlrec_predict_opts *o);

/* Scores `input` (raw rows, "-" for stdin, or a .dlr file) and writes one
 * probability per line ("%.9g", exact for a float) to `output` ("-" for
 * stdout; a file is written atomically). A bad raw row stops the run with
 * "FILE:LINE: field N (NAME): reason" and nothing is written at output. */
dlrec_status dlrec_predict_file(const dlrec_model *m, const char *input, const char *output,
                                const dlrec_predict_opts *o, uint64_t *rows);

/* The same scores, passed in input order to fn (labels NULL for raw rows)
 * instead of written: a host keeps them in memory. */
dlrec_status dlrec_predict_each(const dlrec_model *m, const char *input, const dlrec_predict_opts *o, dlrec_score_fn fn,
                                void *ctx);

/* Raw rows read from in (named `input` in messages), scored as
 * dlrec_predict_each scores a file of them. */
dlrec_status dlrec_predict_stream(const dlrec_model *m, FILE *in, const char *input, const dlrec_predict_opts *o,
                                  dlrec_score_fn fn, void *ctx);

#endif
