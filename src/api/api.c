/* The host API (dlrec.h): JSON options onto the library's option
 * structs, results back to JSON, errors to -1 and the thread's message. */
#include "dlrec.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "data/arrow.h"
#include "backend/backend.h"
#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "data/etl.h"
#include "core/json.h"
#include "data/parse.h"
#include "train/predict.h"
#include "core/progress.h"
#include "train/report.h"
#include "train/trainer.h"

int dlrec_api_version(void) { return DLREC_API_VERSION; }
const char *dlrec_api_last_error(void) { return dlrec_last_error(); }
void dlrec_api_free(void *p) { free(p); }

/* A call's result, the host's OpenMP thread count restored: the library
 * sets it to the call's "threads" (as the CLI does) while it works. */
static int done(dlrec_status s, int host_threads) {
  omp_set_num_threads(host_threads);
  return s == DLREC_OK ? 0 : -1;
}
#define fail(s) done((s), host_threads)

/* opts_json parsed (NULL: an empty object), its keys checked. */
static dlrec_status parse_opts(const char *text, const char *what, const char *const *keys, cJSON **out) {
  *out = NULL;
  dlrec_status s = dlrec_json_parse(text ? text : "{}", text ? strlen(text) : 2, what, out);
  if (s == DLREC_OK && !cJSON_IsObject(*out)) s = dlrec_error(DLREC_ERR_INVALID, "%s: expected a JSON object", what);
  if (s == DLREC_OK) s = dlrec_json_check_keys(*out, what, keys);
  return s;
}

/* A JSON array of strings: the strings (living in *json) in a new array. */
static dlrec_status parse_paths(const char *text, const char *what, cJSON **json, const char ***paths, int *n) {
  *paths = NULL;
  *n = 0;
  dlrec_status s = dlrec_json_parse(text ? text : "", text ? strlen(text) : 0, what, json);
  if (s != DLREC_OK) return s;
  int k = cJSON_GetArraySize(*json);
  if (!cJSON_IsArray(*json) || k < 1) return dlrec_error(DLREC_ERR_INVALID, "%s: expected a non-empty array of paths", what);
  *paths = calloc((size_t)k, sizeof **paths);
  if (!*paths) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  for (int i = 0; i < k; i++) {
    const char *p = cJSON_GetStringValue(cJSON_GetArrayItem(*json, i));
    if (!p || !*p) return dlrec_error(DLREC_ERR_INVALID, "%s: item %d is not a path", what, i);
    (*paths)[i] = p;
  }
  *n = k;
  return DLREC_OK;
}

static dlrec_status get_int(const cJSON *o, const char *key, const char *what, int *v) {
  uint64_t x;
  dlrec_status s = dlrec_json_get_u64_or(o, key, what, (uint64_t)*v, &x);
  if (s == DLREC_OK && x > 1u << 20) s = dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %llu is too large", what, key,
                                                     (unsigned long long)x);
  if (s == DLREC_OK) *v = (int)x;
  return s;
}

static char *report_json(const dlrec_etl_report *r) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddNumberToObject(j, "rows", (double)r->rows);
  cJSON_AddNumberToObject(j, "valid_rows", (double)r->valid_rows);
  cJSON_AddNumberToObject(j, "bad_rows", (double)r->bad_rows);
  cJSON_AddNumberToObject(j, "truncated_rows", (double)r->truncated_rows);
  cJSON_AddNumberToObject(j, "short_rows", (double)r->short_rows);
  cJSON_AddNumberToObject(j, "bytes", (double)r->bytes);
  char *t = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  return t;
}

/* Returns text as a malloc'd string the caller frees with dlrec_api_free
 * (cJSON may use another allocator). */
static char *own(char *text) {
  if (!text) return NULL;
  char *c = strdup(text);
  cJSON_free(text);
  return c;
}

/* etl fit's options from JSON into f. */
static dlrec_status fit_opts(const char *opts_json, dlrec_etl_fit_opts *f, cJSON **o) {
  static const char *keys[] = {"format",        "schema",       "has_label",    "min_count",   "hash_buckets",
                               "dense_transform", "standardize", "skip_bad_rows", "strict_fields", "libfm_fields",
                               "max_hotness",   "raw_keys",     "threads",      "progress",    "workflow",
                               "memory_mb",     "spill_dir",    NULL};
  const char *what = "etl fit options";
  dlrec_etl_fit_opts_default(f);
  const char *format = NULL, *transform = NULL;
  uint64_t u;
  dlrec_status s = parse_opts(opts_json, what, keys, o);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "format", what, "criteo", &format);
  if (s == DLREC_OK) s = dlrec_format_parse(format, &f->format);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "schema", what, NULL, &f->schema_spec);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "has_label", what, f->has_label, &f->has_label);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "min_count", what, f->min_count, &f->min_count);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "hash_buckets", what, f->hash_buckets, &f->hash_buckets);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "dense_transform", what, "log", &transform);
  if (s == DLREC_OK) {
    if (!strcmp(transform, "log") || !strcmp(transform, "log1p")) f->dense_transform = DLREC_DENSE_LOG;
    else if (!strcmp(transform, "none")) f->dense_transform = DLREC_DENSE_NONE;
    else s = dlrec_error(DLREC_ERR_INVALID, "%s: dense_transform: expected log or none, got '%s'", what, transform);
  }
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "standardize", what, f->standardize, &f->standardize);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "skip_bad_rows", what, f->skip_bad_rows, &f->skip_bad_rows);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "strict_fields", what, f->strict_fields, &f->strict_fields);
  if (s == DLREC_OK && (s = dlrec_json_get_u64_or(*o, "libfm_fields", what, f->libfm_fields, &u)) == DLREC_OK)
    f->libfm_fields = (uint32_t)(u > 256 ? 257 : u); /* the fit refuses over 256 */
  if (s == DLREC_OK && (s = dlrec_json_get_u64_or(*o, "max_hotness", what, f->max_hotness, &u)) == DLREC_OK)
    f->max_hotness = (uint32_t)(u > 65536 ? 65537 : u);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "raw_keys", what, f->raw_keys, &f->raw_keys);
  if (s == DLREC_OK) s = get_int(*o, "threads", what, &f->threads);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "progress", what, 0, &f->progress);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "memory_mb", what, 0, &f->memory_mb);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "spill_dir", what, NULL, &f->spill_dir);
  /* The workflow object, as the text the fit parses (freed with *o). */
  const cJSON *w = s == DLREC_OK ? cJSON_GetObjectItemCaseSensitive(*o, "workflow") : NULL;
  if (w) {
    char *text = cJSON_PrintUnformatted(w);
    if (!text) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    cJSON_AddItemToObject(*o, "workflow_text", cJSON_CreateString(text));
    cJSON_free(text);
    f->workflow = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(*o, "workflow_text"));
  }
  return s;
}

/* etl apply's options from JSON into a. */
static dlrec_status apply_opts(const char *opts_json, dlrec_etl_apply_opts *a, cJSON **o) {
  static const char *keys[] = {"no_label",       "valid_fraction", "valid_out", "seed",     "row_group_rows",
                               "skip_bad_rows", "strict_fields",  "threads",   "progress", "target_encoding",
                               NULL};
  const char *what = "etl apply options";
  dlrec_etl_apply_opts_default(a);
  uint64_t u;
  dlrec_status s = parse_opts(opts_json, what, keys, o);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "no_label", what, a->no_label, &a->no_label);
  if (s == DLREC_OK) s = dlrec_json_get_double_or(*o, "valid_fraction", what, a->valid_fraction, &a->valid_fraction);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "valid_out", what, NULL, &a->valid_out);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "seed", what, a->seed, &a->seed);
  if (s == DLREC_OK && (s = dlrec_json_get_u64_or(*o, "row_group_rows", what, a->row_group_rows, &u)) == DLREC_OK)
    a->row_group_rows = (uint32_t)(u > UINT32_MAX ? UINT32_MAX : u);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(*o, "skip_bad_rows", what, a->skip_bad_rows, &a->skip_bad_rows);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "strict_fields", what, a->strict_fields, &a->strict_fields);
  if (s == DLREC_OK) s = get_int(*o, "threads", what, &a->threads);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(*o, "progress", what, 0, &a->progress);
  const char *te = NULL;
  if (s == DLREC_OK) s = dlrec_json_get_string_or(*o, "target_encoding", what, "oof", &te);
  if (s == DLREC_OK && strcmp(te, "oof") && strcmp(te, "full"))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: target_encoding: expected oof or full, got '%s'", what, te);
  a->target_full = s == DLREC_OK && !strcmp(te, "full");
  if (s == DLREC_OK && !(a->valid_fraction >= 0 && a->valid_fraction < 1))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: valid_fraction must be in [0, 1)", what);
  if (s == DLREC_OK && a->valid_fraction > 0 && !a->valid_out)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: valid_fraction needs valid_out", what);
  return s;
}

/* Arrow streams as CSV sources: tables[i] opened over streams[i], named
 * names[i]; every stream is released, also on failure. */
typedef struct tables {
  int n;
  dlrec_arrow_csv **t;
  dlrec_source *src;
  const char **names;
  cJSON *json;
} tables;

static void tables_free(tables *t) {
  for (int i = 0; t->t && i < t->n; i++) dlrec_arrow_csv_free(t->t[i]);
  free(t->t);
  free(t->src);
  free(t->names);
  cJSON_Delete(t->json);
}

static dlrec_status tables_open(tables *t, struct ArrowArrayStream *streams, int n, const char *names_json) {
  memset(t, 0, sizeof *t);
  int k = 0;
  dlrec_status s = n >= 1 && streams ? DLREC_OK : dlrec_error(DLREC_ERR_INVALID, "no Arrow streams");
  if (s == DLREC_OK) s = parse_paths(names_json, "the tables' names", &t->json, &t->names, &k);
  if (s == DLREC_OK && k != n) s = dlrec_error(DLREC_ERR_INVALID, "%d Arrow streams, %d names", n, k);
  if (s == DLREC_OK) {
    t->t = calloc((size_t)n, sizeof *t->t);
    t->src = calloc((size_t)n, sizeof *t->src);
    if (!t->t || !t->src) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  t->n = n;
  for (int i = 0; i < n && streams; i++) {
    if (s == DLREC_OK) s = dlrec_arrow_csv_open(&t->t[i], &streams[i], t->names[i], 1, ',', NULL, 0);
    else if (streams[i].release) streams[i].release(&streams[i]);
    if (s == DLREC_OK) t->src[i] = dlrec_arrow_csv_source(t->t[i]);
  }
  return s;
}

int dlrec_api_etl_fit(const char *inputs_json, const char *out_dir, const char *opts_json, char **report) {
  const int host_threads = omp_get_max_threads();
  cJSON *o = NULL, *pj = NULL;
  const char **paths = NULL;
  int n = 0;
  dlrec_etl_fit_opts f;
  dlrec_status s = fit_opts(opts_json, &f, &o);
  if (s == DLREC_OK) s = parse_paths(inputs_json, "etl fit inputs", &pj, &paths, &n);
  if (s == DLREC_OK && !out_dir) s = dlrec_error(DLREC_ERR_INVALID, "etl fit: no output directory");
  dlrec_etl_report rep = {0};
  if (s == DLREC_OK) s = dlrec_etl_fit(paths, n, out_dir, &f, &rep);
  if (s == DLREC_OK && report) *report = own(report_json(&rep));
  free(paths);
  cJSON_Delete(pj);
  cJSON_Delete(o);
  return fail(s);
}

int dlrec_api_etl_fit_arrow(struct ArrowArrayStream *streams, int n, const char *names_json, const char *out_dir,
                            const char *opts_json, char **report) {
  const int host_threads = omp_get_max_threads();
  cJSON *o = NULL;
  tables t;
  dlrec_etl_fit_opts f;
  dlrec_status s = tables_open(&t, streams, n, names_json);
  if (s == DLREC_OK) s = fit_opts(opts_json, &f, &o);
  if (s == DLREC_OK && f.format != DLREC_FORMAT_CSV)
    s = dlrec_error(DLREC_ERR_INVALID, "etl fit: tables are read as CSV (format \"csv\", with a schema)");
  if (s == DLREC_OK && !out_dir) s = dlrec_error(DLREC_ERR_INVALID, "etl fit: no output directory");
  f.sources = t.src;
  dlrec_etl_report rep = {0};
  if (s == DLREC_OK) s = dlrec_etl_fit(t.names, n, out_dir, &f, &rep);
  if (s == DLREC_OK && report) *report = own(report_json(&rep));
  tables_free(&t);
  cJSON_Delete(o);
  return fail(s);
}

int dlrec_api_etl_apply(const char *etl_dir, const char *inputs_json, const char *out, const char *opts_json,
                        char **report) {
  const int host_threads = omp_get_max_threads();
  cJSON *o = NULL, *pj = NULL;
  const char **paths = NULL;
  int n = 0;
  dlrec_etl *e = NULL;
  dlrec_etl_apply_opts a;
  dlrec_status s = apply_opts(opts_json, &a, &o);
  if (s == DLREC_OK) s = parse_paths(inputs_json, "etl apply inputs", &pj, &paths, &n);
  if (s == DLREC_OK && (!etl_dir || !out)) s = dlrec_error(DLREC_ERR_INVALID, "etl apply: an ETL state and an output are required");
  if (s == DLREC_OK) s = dlrec_etl_load(&e, etl_dir);
  dlrec_etl_report rep = {0};
  if (s == DLREC_OK) s = dlrec_etl_apply(e, paths, n, out, &a, &rep);
  if (s == DLREC_OK && report) *report = own(report_json(&rep));
  dlrec_etl_free(e);
  free(paths);
  cJSON_Delete(pj);
  cJSON_Delete(o);
  return fail(s);
}

int dlrec_api_etl_apply_arrow(const char *etl_dir, struct ArrowArrayStream *streams, int n, const char *names_json,
                              const char *out, const char *opts_json, char **report) {
  const int host_threads = omp_get_max_threads();
  cJSON *o = NULL;
  tables t;
  dlrec_etl *e = NULL;
  dlrec_etl_apply_opts a;
  dlrec_status s = tables_open(&t, streams, n, names_json);
  if (s == DLREC_OK) s = apply_opts(opts_json, &a, &o);
  if (s == DLREC_OK && (!etl_dir || !out)) s = dlrec_error(DLREC_ERR_INVALID, "etl apply: an ETL state and an output are required");
  if (s == DLREC_OK) s = dlrec_etl_load(&e, etl_dir);
  if (s == DLREC_OK && dlrec_etl_format(e) != DLREC_FORMAT_CSV)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: fit on %s rows; tables are read as CSV (fit the ETL on tables or CSV)",
                    etl_dir, dlrec_format_name(dlrec_etl_format(e)));
  a.sources = t.src;
  dlrec_etl_report rep = {0};
  if (s == DLREC_OK) s = dlrec_etl_apply(e, t.names, n, out, &a, &rep);
  if (s == DLREC_OK && report) *report = own(report_json(&rep));
  dlrec_etl_free(e);
  tables_free(&t);
  cJSON_Delete(o);
  return fail(s);
}

/* ---- training ---- */

typedef struct progress_bridge {
  dlrec_api_progress_fn fn;
  void *ctx;
} progress_bridge;

static int bridge(void *ctx, const dlrec_train_progress_info *i) {
  const progress_bridge *b = ctx;
  const dlrec_api_progress p = {.step = i->step,
                                .samples = i->samples,
                                .total_samples = i->total_samples,
                                .loss = i->loss,
                                .valid_auc = i->valid_auc,
                                .samples_per_s = i->samples_per_s,
                                .done = i->done};
  return b->fn(b->ctx, &p);
}

int dlrec_api_train(const char *config_json, const char *args_json, dlrec_api_progress_fn fn, void *ctx,
                    char **result) {
  const int host_threads = omp_get_max_threads();
  static const char *keys[] = {"train", "valid", "etl", "out", "resume", "threads", "device", "max_steps",
                               "deterministic", "progress", NULL};
  const char *what = "train arguments";
  cJSON *o = NULL, *pj = NULL;
  const char **paths = NULL;
  int n = 0, progress = 0;
  dlrec_train_args a = {.config_json = config_json};
  uint64_t threads = 0;
  dlrec_status s = parse_opts(args_json, what, keys, &o);
  if (s == DLREC_OK) {
    char *t = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(o, "train"));
    s = t ? parse_paths(t, "train: the training files", &pj, &paths, &n)
          : dlrec_error(DLREC_ERR_INVALID, "%s: 'train' (an array of .dlr paths) is required", what);
    cJSON_free(t);
  }
  if (s == DLREC_OK) s = dlrec_json_get_string_or(o, "valid", what, NULL, &a.valid);
  if (s == DLREC_OK) s = dlrec_json_get_string(o, "etl", what, &a.etl_dir);
  if (s == DLREC_OK) s = dlrec_json_get_string(o, "out", what, &a.run_dir);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(o, "resume", what, 0, &a.resume);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(o, "deterministic", what, 0, &a.deterministic);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(o, "threads", what, 0, &threads);
  if (s == DLREC_OK && threads > 4096) s = dlrec_error(DLREC_ERR_INVALID, "%s: threads: at most 4096", what);
  if (s == DLREC_OK) s = dlrec_json_get_string_or(o, "device", what, NULL, &a.device);
  if (s == DLREC_OK) s = dlrec_json_get_u64_or(o, "max_steps", what, 0, &a.max_steps);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(o, "progress", what, 0, &progress);
  a.train = paths;
  a.n_train = n;
  a.threads = (uint32_t)threads;
  progress_bridge b = {fn, ctx};
  if (fn) a.on_progress = bridge, a.progress_ctx = &b;
  dlrec_train_result r;
  if (s == DLREC_OK) {
    dlrec_progress_enable(progress);
    s = dlrec_train(&a, &r);
  }
  if (s == DLREC_OK && result) {
    cJSON *j = dlrec_train_result_to_json(&a, &r);
    *result = own(cJSON_PrintUnformatted(j));
    cJSON_Delete(j);
  }
  free(paths);
  cJSON_Delete(pj);
  cJSON_Delete(o);
  return fail(s);
}

/* ---- models ---- */

struct dlrec_api_model {
  dlrec_model *m;
  dlrec_backend *be;
};

dlrec_api_model *dlrec_api_model_load(const char *path, const char *which, uint32_t threads, const char *device) {
  const int host_threads = omp_get_max_threads();
  char dir[4096];
  dlrec_api_model *am = calloc(1, sizeof *am);
  if (!am) {
    dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    return NULL;
  }
  /* Scoring runs fp32 in every precision (backend/backend.h). */
  dlrec_backend_config bc = {threads, DLREC_PRECISION_FP32, 0};
  dlrec_status s = path ? dlrec_checkpoint_select(path, which, dir, sizeof dir)
                        : dlrec_error(DLREC_ERR_INVALID, "no model path");
  if (s == DLREC_OK) s = dlrec_backend_create_on(&am->be, device, &bc);
  if (s == DLREC_OK) s = dlrec_model_load(dir, &am->m);
  if (s == DLREC_OK) s = dlrec_model_set_backend(am->m, am->be);
  if (s != DLREC_OK) {
    dlrec_api_model_free(am);
    am = NULL;
  }
  fail(s);
  return am;
}

void dlrec_api_model_free(dlrec_api_model *am) {
  if (!am) return;
  dlrec_model_free(am->m);
  dlrec_backend_free(am->be);
  free(am);
}

char *dlrec_api_model_info(const dlrec_api_model *am) {
  const dlrec_model *m = am->m;
  const dlrec_schema *sc = dlrec_etl_schema(m->etl);
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "type", m->config.model.type);
  cJSON_AddStringToObject(j, "checkpoint", m->dir);
  cJSON_AddNumberToObject(j, "step", (double)m->progress.step);
  cJSON_AddStringToObject(j, "format", dlrec_format_name(dlrec_etl_format(m->etl)));
  cJSON_AddBoolToObject(j, "has_label", sc->has_label);
  if (sc->has_label) cJSON_AddStringToObject(j, "label", sc->label_name);
  /* The model's columns, and the input's (the rows to score carry those;
   * the workflow's derived columns follow them in the model's). */
  uint32_t nd, nc;
  dlrec_etl_input_columns(m->etl, &nd, &nc);
  cJSON *d = cJSON_AddArrayToObject(j, "dense"), *c = cJSON_AddArrayToObject(j, "sparse");
  cJSON *id = cJSON_AddArrayToObject(j, "input_dense"), *ic = cJSON_AddArrayToObject(j, "input_sparse");
  for (uint32_t i = 0; i < sc->n_dense; i++) {
    cJSON_AddItemToArray(d, cJSON_CreateString(sc->dense_names[i]));
    if (i < nd) cJSON_AddItemToArray(id, cJSON_CreateString(sc->dense_names[i]));
  }
  for (uint32_t i = 0; i < sc->n_sparse; i++) {
    cJSON_AddItemToArray(c, cJSON_CreateString(sc->sparse[i].name));
    if (i < nc) cJSON_AddItemToArray(ic, cJSON_CreateString(sc->sparse[i].name));
  }
  char *t = own(cJSON_PrintUnformatted(j));
  cJSON_Delete(j);
  return t;
}

int dlrec_api_evaluate(dlrec_api_model *am, const char *dlr_path, uint64_t max_rows, char **metrics_json) {
  const int host_threads = omp_get_max_threads();
  dlrec_metrics met;
  const char *paths[] = {dlr_path};
  dlrec_status s = dlr_path ? dlrec_evaluate(am->m->net, paths, 1, 4096, max_rows, &met)
                            : dlrec_error(DLREC_ERR_INVALID, "evaluate: no data");
  if (s == DLREC_OK && metrics_json) {
    cJSON *j = dlrec_metrics_to_json(&met);
    *metrics_json = own(cJSON_PrintUnformatted(j));
    cJSON_Delete(j);
  }
  return fail(s);
}

typedef struct scores {
  float *p;
  uint64_t n, cap;
} scores;

static dlrec_status keep_scores(void *ctx, const float *prob, const float *label, uint32_t n) {
  (void)label;
  scores *s = ctx;
  if (s->n + n > s->cap) {
    uint64_t cap = s->cap ? s->cap : 4096;
    while (cap < s->n + n) cap *= 2;
    float *p = realloc(s->p, cap * sizeof *p);
    if (!p) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for %llu scores", (unsigned long long)cap);
    s->p = p;
    s->cap = cap;
  }
  memcpy(s->p + s->n, prob, n * sizeof *prob);
  s->n += n;
  return DLREC_OK;
}

/* The scores kept, to the caller (*prob is theirs to dlrec_api_free) when
 * the run succeeded, else dropped. */
static dlrec_status hand_over(scores *sc, dlrec_status s, float **prob, uint64_t *n) {
  if (s != DLREC_OK) {
    free(sc->p);
    return s;
  }
  *prob = sc->p ? sc->p : malloc(1);
  *n = sc->n;
  return DLREC_OK;
}

int dlrec_api_predict(dlrec_api_model *am, const char *input, int no_label, float **prob, uint64_t *n) {
  const int host_threads = omp_get_max_threads();
  dlrec_predict_opts o;
  dlrec_predict_opts_default(&o);
  o.no_label = no_label;
  o.progress = 0;
  scores sc = {0};
  dlrec_status s = input ? dlrec_predict_each(am->m, input, &o, keep_scores, &sc)
                         : dlrec_error(DLREC_ERR_INVALID, "predict: no input");
  return fail(hand_over(&sc, s, prob, n));
}

/* A source as a stdio stream (glibc's fopencookie), for predict's reader. */
static ssize_t cookie_read(void *c, char *buf, size_t n) {
  dlrec_source *src = c;
  size_t got = 0;
  return src->read(src->ctx, buf, n, &got) == DLREC_OK ? (ssize_t)got : -1;
}

int dlrec_api_predict_arrow(dlrec_api_model *am, struct ArrowArrayStream *stream, const char *name, float **prob,
                            uint64_t *n) {
  const int host_threads = omp_get_max_threads();
  const dlrec_model *m = am->m;
  const dlrec_schema *sc = dlrec_etl_schema(m->etl);
  const dlrec_input_format format = dlrec_etl_format(m->etl);
  dlrec_arrow_csv *t = NULL;
  dlrec_status s = DLREC_OK;
  dlrec_predict_opts o;
  dlrec_predict_opts_default(&o);
  o.progress = 0;
  if (format == DLREC_FORMAT_CSV) {
    /* The CSV's header names the columns; a label column is read if there. */
    s = dlrec_arrow_csv_open(&t, stream, name, 1, ',', NULL, 0);
    o.no_label = s == DLREC_OK && !(sc->has_label && dlrec_arrow_csv_has_column(t, sc->label_name));
  } else if (format == DLREC_FORMAT_CRITEO) {
    /* The Criteo layout: the dense, then the categorical columns, by name. */
    const char *cols[DLREC_MAX_DENSE + DLREC_MAX_SPARSE];
    int k = 0;
    uint32_t nd, nc;
    dlrec_etl_input_columns(m->etl, &nd, &nc);
    for (uint32_t i = 0; i < nd; i++) cols[k++] = sc->dense_names[i];
    for (uint32_t i = 0; i < nc; i++) cols[k++] = sc->sparse[i].name;
    s = dlrec_arrow_csv_open(&t, stream, name, 0, '\t', cols, k);
    o.no_label = 1;
  } else {
    if (stream && stream->release) stream->release(stream);
    s = dlrec_error(DLREC_ERR_UNSUPPORTED, "predict: a model fit on %s rows scores files, not tables",
                    dlrec_format_name(format));
  }
  dlrec_source src = {0};
  FILE *in = NULL;
  if (s == DLREC_OK) {
    src = dlrec_arrow_csv_source(t);
    in = fopencookie(&src, "r", (cookie_io_functions_t){.read = cookie_read});
    if (!in) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  scores sco = {0};
  if (s == DLREC_OK) s = dlrec_predict_stream(m, in, name, &o, keep_scores, &sco);
  if (in) fclose(in);
  dlrec_arrow_csv_free(t);
  return fail(hand_over(&sco, s, prob, n));
}

int dlrec_api_export_onnx(dlrec_api_model *am, const char *path) {
  const int host_threads = omp_get_max_threads();
  return fail(path ? dlrec_net_export_onnx(am->m->net, path) : dlrec_error(DLREC_ERR_INVALID, "export: no path"));
}

int dlrec_api_report(const char *run_dir, const char *out) {
  const int host_threads = omp_get_max_threads();
  return fail(run_dir ? dlrec_report_write(run_dir, out) : dlrec_error(DLREC_ERR_INVALID, "report: no run"));
}
