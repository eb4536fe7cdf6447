/* ETL: fit vocabularies and dense statistics on raw rows, then encode rows
 * into .dlr files with them — NVTabular's fit/apply model, in C.
 *
 * fit streams the input once and writes the ETL state, a directory holding
 * etl.json (settings, columns, statistics, id ranges) and vocab.bin (per
 * categorical column the kept keys in id order with their counts, or a
 * hashed column's bucket order). apply, and any server, loads the state and
 * encodes raw text with the same functions, so that a row encodes the same
 * in training and serving. docs/etl.md describes the options, the id layout
 * and both files byte by byte.
 *
 * Id layout of categorical column c, local ids (global = id_begin + local):
 *   0      missing (empty field)
 *   1      out of vocabulary (seen fewer than min_count times in fit, or unseen)
 *   2..    kept values by descending fit frequency (ties: smaller key first),
 * or, for a column hashed because its kept cardinality exceeded hash_buckets
 * N: 2 + rank(dlrec_mix64(key) % N), the buckets ranked by descending fit
 * frequency (ties: smaller bucket first); id 1 is then never used.
 *
 * Raw keys (fit with raw_keys, for hash tables): no vocabulary; each value
 * encodes to its 64-bit key mixed with its column,
 *   dlrec_mix64(key + (c + 1) * 0x9e3779b97f4a7c15)  (an empty field: key
 *   DLREC_ETL_MISSING_KEY), stored as two ids, low then high 32 bits (the
 *   schema's `keys`; docs/formats.md).
 *
 * Dense values: t = log(1 + max(x, 0)) (log transform, the default) or t = x;
 * with standardize, (t - mean) / std using fit's mean and population std of
 * t (std 0 divides by 1); a missing value encodes as 0.
 */
#ifndef DLREC_ETL_H
#define DLREC_ETL_H

#include <stddef.h>
#include <stdint.h>

#include "data/parse.h"
#include "data/schema.h"
#include "core/options.h"
#include "core/status.h"

/* 2: etl.json carries a checksum of itself (version 1 did not). */
#define DLREC_ETL_VERSION 2

typedef enum dlrec_dense_transform {
  DLREC_DENSE_LOG = 0,  /* log(1 + max(x, 0)) */
  DLREC_DENSE_NONE = 1, /* x */
} dlrec_dense_transform;

/* What a fit or apply run did. */
typedef struct dlrec_etl_report {
  uint64_t rows;       /* rows counted (fit) or written (apply, both outputs) */
  uint64_t valid_rows; /* apply: rows written to the validation output */
  uint64_t bad_rows;   /* rows skipped under skip_bad_rows (each was warned about) */
  uint64_t truncated_rows; /* rows with a multi-hot field of more values than its max
                              hotness (the first ones kept; see docs/etl.md) */
  uint64_t short_rows; /* good Criteo rows of fewer fields than the layout's (their
                          missing tail read as empty; see strict_fields) */
  char first_short[1100]; /* "FILE:LINE" of the first of them in input order, or "" */
  uint64_t spilled_bytes; /* fit with memory_mb: count-table bytes written to disk */
  uint64_t bytes;      /* input bytes read */
  double seconds;
} dlrec_etl_report;

/* ---- fit ---- */

typedef struct dlrec_etl_fit_opts {
  dlrec_input_format format;  /* DLREC_FORMAT_CRITEO */
  const char *schema_spec;    /* CSV only (required there): "label=click;ignore=id;cat=*" */
  int has_label;              /* 1; 0 for unlabeled rows (Criteo: 39 fields). For CSV the
                                 SPEC decides (label= or not); 0 with label= is an error */
  uint64_t min_count;         /* 1: keep every value; K: values seen < K times -> OOV */
  uint64_t hash_buckets;      /* 0: never hash; N: hash columns of more than N kept values */
  dlrec_dense_transform dense_transform; /* DLREC_DENSE_LOG */
  int standardize;            /* 0 */
  uint64_t skip_bad_rows;     /* 0: the first bad row fails the run */
  int strict_fields;          /* 0: short Criteo rows are valid (counted in the report);
                                 1: they are bad rows */
  int threads;                /* worker threads; 0: dlrec_default_threads() */
  size_t max_line_bytes;      /* DLREC_MAX_LINE_BYTES_DEFAULT */
  size_t block_bytes;         /* read size; 0: DLREC_BLOCK_BYTES_DEFAULT (tests use tiny ones) */
  int progress;               /* 1: a progress bar (see progress.h) */
  uint32_t libfm_fields;      /* libFM: the number of fields (columns f0..f<N-1>), required */
  dlrec_pooling pooling;      /* libSVM / libFM columns' pooling (DLREC_POOLING_SUM) */
  uint32_t max_hotness;       /* libSVM / libFM: values kept a row; 0: the most fit saw */
  int raw_keys;               /* 0; 1: no vocabularies, rows encode to raw keys (above) */
  const dlrec_source *sources; /* NULL; else n_inputs byte sources read instead of the input
                                 files (a host's tables as CSV: data/arrow.h), the inputs'
                                 names unused */
  const char *workflow;       /* NULL; else column operators as JSON text (etl fit --workflow,
                                 docs/etl.md): fill_missing and clip of dense columns, and
                                 derived columns (cross, bucketize, count, target) */
  uint64_t memory_mb;         /* 0: count tables in memory; M: they spill to disk beyond
                                 about M MiB (docs/etl.md, "Memory"), whatever the threads */
  const char *spill_dir;      /* NULL: the state directory; else where the spill goes */
} dlrec_etl_fit_opts;

/* The key an empty categorical field stands for, before the column mix. */
#define DLREC_ETL_MISSING_KEY 0xffffffffffffffffull

/* Fills o with the defaults above (the options table's, below). */
void dlrec_etl_fit_opts_default(dlrec_etl_fit_opts *o);

/* Reads inputs[0..n_inputs) ("-" for stdin) once and writes the ETL state
 * to out_dir (created if needed; etl.json and vocab.bin replaced atomically).
 * The result does not depend on threads or block_bytes. Bad rows fail the run
 * with "FILE:LINE: field N (NAME): reason" unless skip_bad_rows allows them;
 * no rows at all is an error. rep may be NULL. */
dlrec_status dlrec_etl_fit(const char *const *inputs, int n_inputs, const char *out_dir,
                           const dlrec_etl_fit_opts *o, dlrec_etl_report *rep);

/* ---- the state ---- */

typedef struct dlrec_etl dlrec_etl;

/* Loads and validates the state in dir. Corrupt (both files carry checksums
 * of all their bytes), truncated, mismatched (etl.json and vocab.bin of
 * different fits) or other-version files are refused with an error naming
 * the file. Free with dlrec_etl_free. */
dlrec_status dlrec_etl_load(dlrec_etl **e, const char *dir);
void dlrec_etl_free(dlrec_etl *e); /* accepts NULL */

/* The encoded schema: label (if fit had one), dense columns, categorical
 * columns (hotness 1, or 0 with a max hotness for multi-hot ones, and their
 * pooling) with their global id ranges. Valid as long as e. */
const dlrec_schema *dlrec_etl_schema(const dlrec_etl *e);

/* The input format fit read; apply and encode_line expect the same. */
dlrec_input_format dlrec_etl_format(const dlrec_etl *e);
/* The CSV header names fit read (NULL and 0 for Criteo); valid as long as e. */
const char *const *dlrec_etl_header(const dlrec_etl *e, uint32_t *n);
/* Rows, positive labels and skipped bad rows of the fit. */
uint64_t dlrec_etl_rows(const dlrec_etl *e);
uint64_t dlrec_etl_positives(const dlrec_etl *e);
/* etl.json's state_crc32c (docs/etl.md) of a loaded state: what ties rows a
 * trainer publishes to Redis to the ETL state they were trained on. */
uint32_t dlrec_etl_state_crc(const dlrec_etl *e);

typedef struct dlrec_etl_dense_info {
  uint64_t count, missing; /* non-missing and missing values in fit */
  double min, max;         /* of the raw values (0 when count is 0) */
  double mean, std;        /* of the transformed values t (population std) */
  dlrec_dense_transform transform;
  int standardize;
} dlrec_etl_dense_info;

/* Statistics of dense column col (< schema n_dense). */
dlrec_status dlrec_etl_dense_info_get(const dlrec_etl *e, uint32_t col, dlrec_etl_dense_info *out);

typedef struct dlrec_etl_cat_info {
  dlrec_key_kind key_kind;  /* how text becomes a key */
  uint64_t salt;            /* DLREC_KEY_HASH's seed */
  int hashed;               /* 1: ids are ranked hash buckets */
  uint64_t size;            /* local ids: 2 + kept, or 2 + buckets */
  uint64_t id_begin, id_end;
  uint64_t distinct;        /* distinct values seen in fit */
  uint64_t kept;            /* values with count >= min_count */
  uint64_t missing, oov;    /* fit rows with the value missing / below min_count */
  /* Vocabulary columns: kept keys and their counts in id order (local id 2 + i). */
  const uint64_t *keys, *counts;
  /* Hashed columns: bucket -> rank, and counts in rank order (local id 2 + rank). */
  const uint32_t *bucket_rank;
  const uint64_t *bucket_counts;
  uint64_t buckets;
} dlrec_etl_cat_info;

/* Vocabulary and counts of categorical column col (< schema n_sparse); the
 * arrays stay valid as long as e. */
dlrec_status dlrec_etl_cat_info_get(const dlrec_etl *e, uint32_t col, dlrec_etl_cat_info *out);

/* DLREC_OK when a and b (of one schema) apply the same column operators
 * with the same statistics: fill_missing and clip, and every derived
 * column's definition and what it reads (a count encoding's counts, a target
 * encoding's statistics, a bucketized column's boundaries); else
 * DLREC_ERR_INVALID naming the first column that differs. The vocabularies
 * themselves are compared through dlrec_etl_cat_info_get. */
dlrec_status dlrec_etl_same_operators(const dlrec_etl *a, const dlrec_etl *b);

/* ---- encoding (thread-safe: the state is read-only) ---- */

/* Encodes dense column col's raw text s[0..n) (n == 0: missing -> 0). A value
 * that is not a number, or whose transformed (or standardized) value is
 * beyond float32's range, is DLREC_ERR_PARSE ("field 3 (I3): not a number:
 * 'x'", the field counted as in a fit line). */
dlrec_status dlrec_etl_encode_dense(const dlrec_etl *e, uint32_t col, const char *s, size_t n, float *out);

/* Encodes categorical column col's raw text to its global id: missing (n ==
 * 0), out of vocabulary, a kept value or a bucket. A value the column's key
 * kind refuses (not hex, for Criteo) is DLREC_ERR_PARSE. A multi-hot column
 * (several ids) is DLREC_ERR_INVALID. */
dlrec_status dlrec_etl_encode_cat(const dlrec_etl *e, uint32_t col, const char *s, size_t n, uint32_t *id);

/* Encodes categorical column col's raw field text s[0..n) to its global ids,
 * for one-hot and multi-hot columns alike: ids (room for the column's
 * max_hotness, at least 1) receives *n_ids ids (at least 1; a field with no
 * value is the missing id), exactly as the field encodes inside a line
 * (dlrec_etl_encode_line_multi). A multi-hot field of more values than the
 * max hotness keeps the first ones and adds 1 to *truncated (may be NULL).
 * A value the column's key kind refuses is DLREC_ERR_PARSE. */
dlrec_status dlrec_etl_encode_cat_multi(const dlrec_etl *e, uint32_t col, const char *s, size_t n, uint32_t *ids,
                                        uint32_t *n_ids, uint32_t *truncated);

/* Encodes one raw line in fit's input format (without its line end): for
 * Criteo, 40 fields (39 when with_label is 0); for CSV, the fit header's
 * columns in its order (without the label column when with_label is 0).
 * Writes *label (when with_label), dense[n_dense] and ids[n_sparse] (global
 * ids). This is exactly what apply does to each row. A state with multi-hot
 * columns is DLREC_ERR_INVALID: use dlrec_etl_encode_line_multi. */
dlrec_status dlrec_etl_encode_line(const dlrec_etl *e, const char *line, size_t n, int with_label, float *label,
                                   float *dense, uint32_t *ids);

/* dlrec_etl_encode_line, for callers that count short rows as apply does:
 * *short_row is set to 1 when a Criteo line had fewer fields than the
 * format's (valid: its missing tail reads as empty), else 0; with
 * strict_fields such a line is DLREC_ERR_PARSE ("4 fields, expected 40
 * (--strict-fields)") instead. */
dlrec_status dlrec_etl_encode_line_checked(const dlrec_etl *e, const char *line, size_t n, int with_label,
                                           int strict_fields, float *label, float *dense, uint32_t *ids,
                                           int *short_row);

/* The most ids one row encodes to: the sum of the columns' max hotness (the
 * number of columns when every column is one-hot). */
uint64_t dlrec_etl_ids_max(const dlrec_etl *e);

/* dlrec_etl_encode_line for states with multi-hot columns (it works for any
 * state; dlrec_etl_encode_line refuses multi-hot ones): ids (room for
 * dlrec_etl_ids_max) receives each column's global ids in column order and
 * nids[n_sparse] how many each column has (at least 1: a field with no value
 * encodes as its missing id). A field of more values than the column's max
 * hotness keeps the first ones; *truncated (may be NULL) is the number of
 * such columns in the line. */
dlrec_status dlrec_etl_encode_line_multi(const dlrec_etl *e, const char *line, size_t n, int with_label,
                                         float *label, float *dense, uint32_t *ids, uint32_t *nids,
                                         uint32_t *truncated);

/* The columns of a CSV input named by its header line (n bytes, without
 * its line end), mapped to the state's by name: the one mapping etl apply,
 * predict and the Python package read a header with. A column the state
 * needs and the header lacks is refused by name (file:1: header has no ...
 * column 'NAME'), a repeated one too; a column fit never saw is ignored
 * with a warning (dlrec_etl_warn_unknown_columns). Free *out with
 * dlrec_layout_free. */
dlrec_status dlrec_etl_header_layout(const dlrec_etl *e, const char *header, size_t n, int with_label,
                                     const char *file, dlrec_layout **out);
/* Warns of each column of L that fit's input did not have (CSV; the label
 * is known when the rows are unlabeled). */
void dlrec_etl_warn_unknown_columns(const dlrec_etl *e, const dlrec_layout *L, int with_label, const char *file);
/* dlrec_etl_encode_line_multi over the fields of layout L (from
 * dlrec_etl_header_layout; its label column must match with_label), or the
 * fit header's order when L is NULL. */
dlrec_status dlrec_etl_encode_line_in(const dlrec_etl *e, const dlrec_layout *L, const char *line, size_t n,
                                      int with_label, float *label, float *dense, uint32_t *ids, uint32_t *nids,
                                      uint32_t *truncated);

/* The input's columns (a derived column of the workflow comes after them
 * in the schema and has no field of its own): the first *n_dense dense and
 * *n_cat categorical columns of the schema. */
void dlrec_etl_input_columns(const dlrec_etl *e, uint32_t *n_dense, uint32_t *n_cat);

/* The derived columns of a row given as its input columns' field texts,
 * dense_in[n_dense] and cat_in[n_cat] of dlrec_etl_input_columns (an empty
 * text is a missing field), once each input field has encoded without error
 * (dlrec_etl_encode_dense, dlrec_etl_encode_cat_multi): dense[i] receives
 * the i-th derived dense column (schema column n_dense + i), ids[i] the id of
 * the i-th derived categorical one (one-hot). Target encodings are the full
 * ones. The server encodes a request's raw fields this way, as a line
 * encodes inside dlrec_etl_encode_line. */
dlrec_status dlrec_etl_encode_derived(const dlrec_etl *e, const dlrec_text *dense_in, const dlrec_text *cat_in,
                                      float *dense, uint32_t *ids);

/* ---- apply ---- */

typedef struct dlrec_etl_apply_opts {
  int no_label;             /* 0; 1: the input has no label column (unlabeled output) */
  double valid_fraction;    /* 0: no split; F in (0, 1): about F of the rows go to valid_out */
  const char *valid_out;    /* the validation .dlr (required when valid_fraction > 0) */
  int per_input;            /* 0; 1: `out` is a directory and input i is written to
                               OUT/NAME.dlr, NAME its file name without its extension (one
                               pass, one progress bar; the validation rows of every input
                               still go to valid_out) */
  uint64_t seed;            /* the split's seed */
  uint32_t row_group_rows;  /* 65536 */
  uint64_t skip_bad_rows;   /* 0 */
  int strict_fields;        /* 0; 1: short Criteo rows are bad rows (see the fit options) */
  int threads;              /* 0: dlrec_default_threads() */
  size_t max_line_bytes;    /* DLREC_MAX_LINE_BYTES_DEFAULT */
  size_t block_bytes;       /* 0: DLREC_BLOCK_BYTES_DEFAULT */
  int progress;             /* 1 */
  const dlrec_source *sources; /* NULL; else n_inputs byte sources read instead of the inputs */
  int target_full;          /* 0: target encodings out of fold (the inputs are fit's, in its
                               order); 1: the full encodings (rows fit did not see) */
} dlrec_etl_apply_opts;

void dlrec_etl_apply_opts_default(dlrec_etl_apply_opts *o);

/* ---- the options of fit and apply, for the command line and the host API ---- */

/* Which subcommand takes an option (dlrec_option.where). */
enum { DLREC_ETL_FIT = 1, DLREC_ETL_APPLY = 2 };

/* One row per option (etl_options.c): the CLI's flag and the host API's
 * key, the fields it sets in the fit and apply options, its range, default
 * and doc (docs/etl.md's reference). */
extern const dlrec_option dlrec_etl_options[];

/* Reads the host API's options (a JSON object; what names it in errors) of
 * a subcommand (DLREC_ETL_FIT or DLREC_ETL_APPLY) into its struct: every key
 * must be one of its options, or one of extra (NULL-terminated; the caller
 * reads those). TEXT options point into o. */
dlrec_status dlrec_etl_options_read(const cJSON *o, const char *what, unsigned command, const char *const *extra,
                                    dlrec_etl_fit_opts *fit, dlrec_etl_apply_opts *apply);

/* The options' reference, the Markdown table of docs/etl.md's "Option
 * reference" (`dlrec options etl`); malloc'd, NULL when out of memory. */
char *dlrec_etl_options_reference(void);

/* 1 when line `line` (1-based) of input file `file_index` (0-based, in the
 * order given to apply) goes to the validation output: the top 53 bits of
 * mix(mix(mix(seed) ^ file_index) ^ line), as a fraction of 2^53, are below
 * fraction. Independent of threads and block sizes. */
int dlrec_etl_is_valid_row(uint64_t seed, uint32_t file_index, uint64_t line, double fraction);

/* Encodes inputs (in order; "-" for stdin) with e into the .dlr file out
 * (and valid_out), rows in input order, or one file per input (per_input).
 * Written atomically: nothing appears at out unless the run succeeds (per
 * input: each file appears once complete; after an error, the inputs before
 * the failing one have theirs). An input of no rows writes an empty file
 * and warns. rep may be NULL. */
dlrec_status dlrec_etl_apply(const dlrec_etl *e, const char *const *inputs, int n_inputs, const char *out,
                             const dlrec_etl_apply_opts *o, dlrec_etl_report *rep);

#endif
