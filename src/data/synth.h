/* Synthetic click logs in the Criteo display-ads layout, with known click
 * probabilities.
 *
 * Each row is `label \t I1..I13 \t C1..C26 \n`: a 0/1 label, 13 integer
 * counts (empty = missing) and 26 categorical values written as 8 lowercase
 * hex digits (empty = missing), the layout of Criteo's Kaggle and Terabyte
 * click logs. Missing rates, cardinalities and Zipf-shaped value frequencies
 * follow Criteo Kaggle's; labels are drawn from a hidden model whose logit
 * has first-order terms, nonlinear terms of the counts, and FM-style pairwise
 * interactions of categorical values, so a linear model is clearly beaten by
 * one with embeddings and dot interactions (DLRM). docs/synth.md describes
 * the model.
 *
 * Two seeds: the model seed fixes the hidden world (value strings, weights,
 * latent vectors, the calibrated bias), the row seed fixes which rows are
 * drawn from it. Files written with the same model seed and different row
 * seeds are independent samples of one world (train and test sets).
 *
 * Rows come in chunks of DLREC_SYNTH_CHUNK_ROWS: chunk i of a file is the
 * first rows of the random stream (seed, i), so output is byte-identical for
 * a seed whatever the thread count.
 */
#ifndef DLREC_SYNTH_H
#define DLREC_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define DLREC_SYNTH_DENSE 13  /* I1..I13 */
#define DLREC_SYNTH_CAT 26    /* C1..C26 */
#define DLREC_SYNTH_FIELDS 40 /* label + dense + categorical */
/* Rows per chunk (one random stream each). Part of the output's definition:
 * changing it changes every file. */
#define DLREC_SYNTH_CHUNK_ROWS 16384
/* An upper bound on one row's text, newline included (label, 13 integers of
 * at most 11 characters, 26 x 8 hex digits, 39 tabs, the newline). */
#define DLREC_SYNTH_MAX_ROW_BYTES 400
/* Bytes of one line of a probabilities file ("0.123456\n"). */
#define DLREC_SYNTH_PROB_BYTES 9

typedef struct dlrec_synth_opts {
  uint64_t rows;            /* rows to write, >= 1 */
  uint64_t seed;            /* which rows are drawn (default 1) */
  uint64_t model_seed;      /* the hidden world: strings, weights, bias (default 1) */
  /* Each column's distinct values, DLREC_SYNTH_CAT of them, each >= 1
   * (dlrec_synth_cardinality_preset names two sets), or NULL for Criteo
   * Kaggle's (default); max_cardinality then caps them. */
  const uint32_t *cardinalities;
  uint64_t max_cardinality; /* cap on every column's distinct values; 0 = none (default) */
  int threads;              /* worker threads; 0 = dlrec_default_threads() (default) */
  const char *out;          /* the click log: a path, or "-" for stdout (required) */
  const char *probs;        /* each row's true click probability ("%.6f\n"): a path, "-" or NULL */
  int progress;             /* show a progress bar on stderr (default 1; -q and
                               DLREC_PROGRESS=0 turn every bar off anyway) */
} dlrec_synth_opts;

/* What dlrec_synth_write wrote. */
typedef struct dlrec_synth_stats {
  uint64_t rows;
  uint64_t bytes;     /* of the click log */
  uint64_t positives; /* rows with label 1 */
  double seconds;     /* wall time, model set-up included */
  double mean_prob;   /* mean true click probability */
  double logloss;     /* mean logloss of the true probabilities: the best any model can expect */
  /* AUC of the true probabilities against the drawn labels: the best any
   * model can reach on this sample (computed on probabilities binned to
   * 1/65536, which moves it by less than 1e-4). */
  double auc;
} dlrec_synth_stats;

/* Defaults: seed 1, model seed 1, no cardinality cap, all cores, progress on;
 * rows 0 and out NULL must be set by the caller. */
dlrec_synth_opts dlrec_synth_opts_default(void);

/* Writes o->rows rows to o->out and, if o->probs is set, their true click
 * probabilities to o->probs, in the same order. A regular-file output is
 * written to PATH.tmp, fsync'd and renamed, so an interrupted or failed run
 * never leaves a partial file under the final name (a failed run removes the
 * .tmp file too); "-" and non-regular files (pipes, /dev/null) are written
 * directly. Fills *stats when stats is not NULL. Returns DLREC_ERR_INVALID for
 * bad options, DLREC_ERR_IO when a file cannot be written. */
dlrec_status dlrec_synth_write(const dlrec_synth_opts *o, dlrec_synth_stats *stats);

/* ---- The generator, for tests and for callers that want rows in memory ---- */

/* The hidden model: per-column samplers and keys, and the bias calibrated so
 * that the mean click probability is 0.25. Immutable once made, so any number
 * of threads may generate from one model at once. */
typedef struct dlrec_synth_model dlrec_synth_model;

/* Makes the model of model_seed with the columns' cardinalities
 * (DLREC_SYNTH_CAT values, each >= 1, or NULL for Criteo Kaggle's), each
 * capped at max_cardinality (0 = no cap). Takes tens of milliseconds (the
 * calibration). *out is the caller's, freed with dlrec_synth_model_free.
 * DLREC_ERR_INVALID for a cardinality of 0, naming the column. */
dlrec_status dlrec_synth_model_new(uint64_t model_seed, const uint32_t *cardinalities, uint64_t max_cardinality,
                                   dlrec_synth_model **out);

/* Frees a model; NULL is fine. */
void dlrec_synth_model_free(dlrec_synth_model *m);

/* Criteo Kaggle's distinct-value count of column C(col+1), col in [0, 26);
 * 0 for a col out of range. */
uint32_t dlrec_synth_criteo_cardinality(int col);

/* The DLREC_SYNTH_CAT cardinalities of a named set: "criteo-kaggle" (Criteo
 * Kaggle's distinct values, the default) or "criteo-1tb" (Criteo 1TB's
 * vocabularies at frequency threshold 15, as NVIDIA DeepLearningExamples'
 * DLRM preprocessing makes them: 32.7M rows, the table of NVIDIA's DLRM
 * benchmark). NULL for another name. */
const uint32_t *dlrec_synth_cardinality_preset(const char *name);

/* The Zipf exponent s of column C(col+1), col in [0, 26): its value of rank k
 * has probability k^-s / sum_j j^-s; 0 for a col out of range. */
double dlrec_synth_zipf_exponent(int col);

/* The number of distinct values column C(col+1) can take in this model (the
 * Criteo count, capped); 0 for a col out of range. */
uint32_t dlrec_synth_cardinality(const dlrec_synth_model *m, int col);

/* The calibrated bias of the hidden logit. */
double dlrec_synth_bias(const dlrec_synth_model *m);

/* Where dlrec_synth_generate puts a chunk's rows; every pointer may be NULL
 * (that output is skipped). The arrays hold at least `rows` entries. */
typedef struct dlrec_synth_rows {
  char *text;          /* rows as Criteo text; text_cap >= rows * DLREC_SYNTH_MAX_ROW_BYTES */
  size_t text_cap;
  size_t text_bytes;   /* out: bytes written to text */
  double *prob;        /* out: each row's true click probability */
  char *prob_text;     /* out: the probabilities as "%.6f\n" lines, DLREC_SYNTH_PROB_BYTES a row */
  size_t prob_text_bytes; /* out: bytes written to prob_text */
  double *logit_first; /* out: the logit without the pairwise interaction terms
                          (bias, first-order and count terms): a test hook that
                          measures how much of the signal the interactions carry */
  uint8_t *label;      /* out: each row's label */
  uint32_t *rank;      /* out: a test hook: the frequency rank (1 = most frequent)
                          of each categorical value, 0 when missing; (rows, 26) */
  uint64_t positives;  /* out: rows with label 1 */
} dlrec_synth_rows;

/* Generates the first `rows` rows of chunk number `chunk` of row seed `seed`
 * (a file's rows [chunk * DLREC_SYNTH_CHUNK_ROWS, ...)). The same arguments
 * give the same rows on any thread; fewer rows give a prefix. Returns
 * DLREC_ERR_INVALID when text is set and text_cap is too small. */
dlrec_status dlrec_synth_generate(const dlrec_synth_model *m, uint64_t seed, uint64_t chunk, uint32_t rows,
                                  dlrec_synth_rows *out);

#endif
