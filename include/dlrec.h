/* dlrec's API for host processes: the functions libdlrec.so exports for the
 * Python package (python/dlrec, bound with cffi) and any other binding.
 *
 * Flat C over opaque handles, so that a binding declares a page of types:
 * options and results are JSON text, a call returns 0 on success and -1 on
 * failure with the message (file, line, field, as the CLI prints it) in
 * dlrec_api_last_error(), which is per thread. Strings and arrays the API
 * returns are freed with dlrec_api_free.
 *
 * The library owns no process-wide state a host owns: it installs no signal
 * handler (a training run stops when its progress callback says so, which a
 * host's Ctrl-C handling decides), sets no allocator hooks, and changes no
 * environment. Progress bars on stderr are off unless asked for
 * ("progress": true), since a host draws its own from the callback.
 * OpenMP's thread count is set from the "threads" options while a call
 * works, as the CLI sets it, and the host's is restored when it returns.
 */
#ifndef DLREC_API_H
#define DLREC_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DLREC_API_VERSION 2

int dlrec_api_version(void);
const char *dlrec_api_last_error(void);
void dlrec_api_free(void *p);

/* ETL (docs/etl.md). inputs_json: a JSON array of input paths. opts_json
 * (NULL or "{}": the CLI's defaults): the options of `dlrec etl fit` and
 * `dlrec etl apply`, each flag by its key (one table for both: docs/etl.md's
 * "Option reference"), and "progress" (a progress bar; default false).
 * fit {"format": "criteo" | "csv" | "libsvm" | "libfm", "schema": SPEC,
 * "workflow" (the object of docs/etl.md's column operators),
 * "libfm_fields", "pooling": "sum" | "mean", "max_hotness", "no_label" (or
 * "has_label"), "min_count", "hash_buckets", "raw_keys", "dense_transform":
 * "log" | "none", "standardize", "skip_bad_rows", "strict_fields",
 * "max_line_bytes", "block_bytes", "threads", "memory_mb", "spill_dir"};
 * apply {"no_label", "skip_bad_rows", "strict_fields", "max_line_bytes",
 * "block_bytes", "threads", "valid_fraction", "valid_out", "seed",
 * "row_group_rows", "target_encoding": "oof" | "full"}. An option of the
 * other subcommand is an unknown field. *report_json (when not NULL): the
 * run's report. */
int dlrec_api_etl_fit(const char *inputs_json, const char *out_dir, const char *opts_json, char **report_json);
int dlrec_api_etl_apply(const char *etl_dir, const char *inputs_json, const char *out, const char *opts_json,
                        char **report_json);

/* The same from tables: n Arrow C streams of record batches (pyarrow
 * exports them without a copy; data/arrow.h), read in place as CSV with
 * their column names as the header, each named in messages by its entry of
 * names_json (a JSON array of n strings). fit needs "format": "csv" and a
 * "schema"; apply an ETL state fit on CSV. Every stream is released, also
 * when the call fails. */
struct ArrowArrayStream;
int dlrec_api_etl_fit_arrow(struct ArrowArrayStream *streams, int n, const char *names_json, const char *out_dir,
                            const char *opts_json, char **report_json);
int dlrec_api_etl_apply_arrow(const char *etl_dir, struct ArrowArrayStream *streams, int n, const char *names_json,
                              const char *out, const char *opts_json, char **report_json);

/* What a training run's progress callback sees. */
typedef struct dlrec_api_progress {
  uint64_t step, samples, total_samples; /* total 0: unknown */
  double loss, valid_auc, samples_per_s; /* NaN: none yet */
  int done;
} dlrec_api_progress;

/* Returning nonzero stops the run after its current step, with a checkpoint. */
typedef int (*dlrec_api_progress_fn)(void *ctx, const dlrec_api_progress *p);

/* Trains (docs/config.md) with the config as JSON text (NULL: the
 * defaults) and args_json {"train": [paths], "valid": path, "etl": dir,
 * "out": run dir, "resume", "threads", "device" ("cpu", "cuda", "cuda:N";
 * absent: the config's training.device), "max_steps", "deterministic",
 * "progress"}. *result_json: what `dlrec train` prints, "interrupted"
 * included. fn may be NULL. */
int dlrec_api_train(const char *config_json, const char *args_json, dlrec_api_progress_fn fn, void *ctx,
                    char **result_json);

/* A trained model: a run directory's "latest" or "best" checkpoint (which:
 * NULL is latest), or a checkpoint directory, scoring on device ("cpu",
 * "cuda", "cuda:N"; NULL: the CPU). threads 0: every core. */
typedef struct dlrec_api_model dlrec_api_model;
dlrec_api_model *dlrec_api_model_load(const char *path, const char *which, uint32_t threads, const char *device);
void dlrec_api_model_free(dlrec_api_model *m); /* accepts NULL */
/* {"type", "checkpoint" (its directory, whose etl/etl.json is the ETL
 * state), "step", "format" (the ETL's input format), "has_label",
 * "dense": [names], "sparse": [names] (the model's columns),
 * "input_dense", "input_sparse": [names] (the input's columns, which rows to
 * score carry: the model's without the ETL workflow's derived ones)} */
char *dlrec_api_model_info(const dlrec_api_model *m);
/* Metrics on a labeled .dlr file (max_rows 0: all), as `dlrec eval`. */
int dlrec_api_evaluate(dlrec_api_model *m, const char *dlr_path, uint64_t max_rows, char **metrics_json);
/* Scores a .dlr file or raw rows in the ETL's input format (as `dlrec
 * predict`), in input order: *prob (dlrec_api_free) gets *n floats. */
int dlrec_api_predict(dlrec_api_model *m, const char *input, int no_label, float **prob, uint64_t *n);
/* Scores the rows of an Arrow stream (released by the call) named name:
 * for a model fit on CSV, by its columns' names (a label column, if there,
 * is read and ignored); on Criteo rows, the columns named as the schema's
 * dense and categorical columns. */
int dlrec_api_predict_arrow(dlrec_api_model *m, struct ArrowArrayStream *stream, const char *name, float **prob,
                            uint64_t *n);
/* Writes the model as ONNX (docs/export.md). */
int dlrec_api_export_onnx(dlrec_api_model *m, const char *path);
/* Rebuilds RUN/report.html (train/report.h); out NULL: there. */
int dlrec_api_report(const char *run_dir, const char *out);

#ifdef __cplusplus
}
#endif

#endif
