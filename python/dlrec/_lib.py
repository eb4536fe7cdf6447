"""The cffi binding of libdlrec's host API (include/dlrec/api.h), in ABI
mode: the declarations below are that header's, and the library is the
libdlrec.so installed beside this file (or $DLREC_LIBRARY)."""
import os

from cffi import FFI

CDEF = """
int dlrec_api_version(void);
const char *dlrec_api_last_error(void);
void dlrec_api_free(void *p);
int dlrec_api_etl_fit(const char *inputs_json, const char *out_dir, const char *opts_json, char **report_json);
int dlrec_api_etl_apply(const char *etl_dir, const char *inputs_json, const char *out, const char *opts_json,
                        char **report_json);
typedef struct dlrec_api_progress {
  uint64_t step, samples, total_samples;
  double loss, valid_auc, samples_per_s;
  int done;
} dlrec_api_progress;
typedef int (*dlrec_api_progress_fn)(void *ctx, const dlrec_api_progress *p);
int dlrec_api_train(const char *config_json, const char *args_json, dlrec_api_progress_fn fn, void *ctx,
                    char **result_json);
typedef struct dlrec_api_model dlrec_api_model;
dlrec_api_model *dlrec_api_model_load(const char *path, const char *which, uint32_t threads);
void dlrec_api_model_free(dlrec_api_model *m);
char *dlrec_api_model_info(const dlrec_api_model *m);
int dlrec_api_evaluate(dlrec_api_model *m, const char *dlr_path, uint64_t max_rows, char **metrics_json);
int dlrec_api_predict(dlrec_api_model *m, const char *input, int no_label, float **prob, uint64_t *n);
int dlrec_api_export_onnx(dlrec_api_model *m, const char *path);
struct ArrowSchema {
  const char *format;
  const char *name;
  const char *metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema **children;
  struct ArrowSchema *dictionary;
  void (*release)(struct ArrowSchema *);
  void *private_data;
};
struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void **buffers;
  struct ArrowArray **children;
  struct ArrowArray *dictionary;
  void (*release)(struct ArrowArray *);
  void *private_data;
};
struct ArrowArrayStream {
  int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
  int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
  const char *(*get_last_error)(struct ArrowArrayStream *);
  void (*release)(struct ArrowArrayStream *);
  void *private_data;
};
int dlrec_api_etl_fit_arrow(struct ArrowArrayStream *streams, int n, const char *names_json, const char *out_dir,
                            const char *opts_json, char **report_json);
int dlrec_api_etl_apply_arrow(const char *etl_dir, struct ArrowArrayStream *streams, int n, const char *names_json,
                              const char *out, const char *opts_json, char **report_json);
int dlrec_api_predict_arrow(dlrec_api_model *m, struct ArrowArrayStream *stream, const char *name, float **prob,
                            uint64_t *n);
int dlrec_api_report(const char *run_dir, const char *out);
"""

API_VERSION = 1  # include/dlrec/api.h's DLREC_API_VERSION

ffi = FFI()
ffi.cdef(CDEF)


def _load():
    path = os.environ.get("DLREC_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "libdlrec.so")
    lib = ffi.dlopen(path)
    if lib.dlrec_api_version() != API_VERSION:
        raise ImportError(f"dlrec: {path} has API version {lib.dlrec_api_version()}, this package wants {API_VERSION}")
    return lib


lib = _load()
