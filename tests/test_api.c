/* The host API (dlrec.h) from C, so that it runs under the sanitizers
 * too (the Python package's tests cover it from Python): options refused
 * with their field named, a training run stopped by its progress callback
 * with a checkpoint, scores and metrics equal to the CLI's, and the
 * caller's OpenMP thread count left as it was. */
#include <omp.h>

#include "dlrec.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "core/clock.h"
#include "test.h"

static int make_rows(void) {
  char *out = NULL;
  int rc = test_run_cli(&out, "synth -q --rows 3000 --seed 5 --max-cardinality 200 --out '%s'", test_path("rows.tsv"));
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  return rc;
}

static char *json_paths(const char *a) {
  static char buf[2][4096];
  static int k;
  char *b = buf[k++ & 1];
  snprintf(b, 4096, "[\"%s\"]", a);
  return b;
}

TEST(bad_options_are_refused_with_the_field_named) {
  CHECK(make_rows() == 0);
  CHECK_EQ(dlrec_api_version(), DLREC_API_VERSION);
  const char *in = json_paths(test_path("rows.tsv"));
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl"), "{\"min_cont\": 2}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "min_cont") != NULL);
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl"), "{\"format\": \"xml\"}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "xml") != NULL);
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl"), "[1", NULL), -1);
  CHECK_EQ(dlrec_api_etl_fit("[]", test_path("etl"), NULL, NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "non-empty array") != NULL);
  CHECK_EQ(dlrec_api_etl_fit("[\"\"]", test_path("etl"), NULL, NULL), -1);
  CHECK_EQ(dlrec_api_etl_fit(in, NULL, NULL, NULL), -1);
  CHECK_EQ(dlrec_api_etl_apply(test_path("etl"), in, test_path("x.dlr"), "{\"valid_fraction\": 0.5}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "valid_out") != NULL);
  CHECK_EQ(dlrec_api_train(NULL, "{\"etl\": \"e\", \"out\": \"o\"}", NULL, NULL, NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "train") != NULL);
  CHECK_EQ(dlrec_api_train("{\"model\": {\"type\": \"nope\"}}", "{\"train\": [\"a.dlr\"], \"etl\": \"e\", \"out\": \"o\"}",
                           NULL, NULL, NULL),
           -1);
  CHECK(dlrec_api_model_load(test_path("nothing"), NULL, 1, NULL) == NULL);
  CHECK(strlen(dlrec_api_last_error()) > 0);
}

typedef struct seen {
  int calls, stop_at, done;
  uint64_t last_step;
} seen;

static int on_progress(void *ctx, const dlrec_api_progress *p) {
  seen *s = ctx;
  s->calls++;
  s->last_step = p->step;
  s->done += p->done;
  return s->stop_at && p->step >= (uint64_t)s->stop_at;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

TEST(train_stop_predict_evaluate_through_the_api) {
  CHECK(make_rows() == 0);
  const char *in = json_paths(test_path("rows.tsv"));
  char *rep = NULL;
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl"), "{\"min_count\": 2}", &rep), 0);
  CHECK(rep && strstr(rep, "\"rows\":3000"));
  dlrec_api_free(rep);
  char opts[4096];
  snprintf(opts, sizeof opts, "{\"valid_fraction\": 0.2, \"valid_out\": \"%s\", \"seed\": 1}", test_path("valid.dlr"));
  CHECK_EQ(dlrec_api_etl_apply(test_path("etl"), in, test_path("train.dlr"), opts, NULL), 0);

  omp_set_num_threads(3);
  const char *cfg = "{\"model\": {\"type\": \"lr\"}, \"training\": {\"batch_size\": 8, \"epochs\": 3}}";
  char args[4096];
  snprintf(args, sizeof args, "{\"train\": [\"%s\"], \"etl\": \"%s\", \"out\": \"%s\", \"threads\": 1}",
           test_path("train.dlr"), test_path("etl"), test_path("run"));
  /* A callback that asks to stop at its first call (after step 1): the run
   * ends at that step, saved, and the callback's last call says so. */
  seen s = {.stop_at = 1};
  char *res = NULL;
  CHECK_EQ(dlrec_api_train(cfg, args, on_progress, &s, &res), 0);
  CHECK_EQ(omp_get_max_threads(), 3);
  cJSON *j = cJSON_Parse(res);
  dlrec_api_free(res);
  CHECK(j != NULL);
  const double steps = num(j, "steps");
  const int interrupted = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "interrupted"));
  cJSON_Delete(j);
  CHECK(interrupted);
  CHECK_EQ(s.calls, 2); /* the stop, then the last call */
  CHECK_EQ(s.done, 1);
  CHECK_EQ(steps, 1);
  CHECK_EQ(s.last_step, 1);
  char latest[64], *text = NULL;
  size_t n;
  snprintf(latest, sizeof latest, "ckpt-%012llu\n", (unsigned long long)steps);
  CHECK_OK(dlrec_read_file(test_path("run/latest"), 64, &text, &n));
  CHECK(!strncmp(text, latest, strlen(latest) - 1));
  free(text);

  /* Resumed to the end without a callback, then scored. */
  snprintf(args, sizeof args,
           "{\"train\": [\"%s\"], \"valid\": \"%s\", \"etl\": \"%s\", \"out\": \"%s\", \"resume\": true, \"threads\": 1}",
           test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"), test_path("run"));
  seen s2 = {0};
  double t0 = dlrec_now();
  CHECK_EQ(dlrec_api_train(cfg, args, on_progress, &s2, NULL), 0);
  const double secs = dlrec_now() - t0;
  CHECK_EQ(s2.done, 1);
  /* At most five calls a second (plus the first and the last), not one a
   * step: the run had about 900 steps. */
  if (s2.calls > 2 + (int)(secs / 0.2) + 1)
    test_fail(__FILE__, __LINE__, "%d progress calls in %.2f s", s2.calls, secs);
  dlrec_api_model *m = dlrec_api_model_load(test_path("run"), "latest", 1, "cpu");
  CHECK(m != NULL);
  char *info = dlrec_api_model_info(m);
  CHECK(info && strstr(info, "\"type\":\"lr\"") && strstr(info, "\"format\":\"criteo\""));
  dlrec_api_free(info);
  float *prob = NULL;
  uint64_t rows = 0;
  CHECK_EQ(dlrec_api_predict(m, test_path("valid.dlr"), 0, &prob, &rows), 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --out -", test_path("run"), test_path("valid.dlr"));
  CHECK_EQ(rc, 0);
  uint64_t k = 0;
  for (char *p = out, *e; k < rows && (e = strchr(p, '\n')); p = e + 1, k++) {
    float want = strtof(p, NULL);
    if (want != prob[k]) {
      test_fail(__FILE__, __LINE__, "row %llu: api %.9g, cli %.9g", (unsigned long long)k, prob[k], want);
      break;
    }
  }
  free(out);
  dlrec_api_free(prob);
  CHECK(rows > 400 && k == rows);
  char *met = NULL;
  CHECK_EQ(dlrec_api_evaluate(m, test_path("valid.dlr"), 0, &met), 0);
  CHECK(met && strstr(met, "\"auc\""));
  dlrec_api_free(met);
  CHECK_EQ(dlrec_api_predict(m, test_path("missing.dlr"), 0, &prob, &rows), -1);
  CHECK(strstr(dlrec_api_last_error(), "missing.dlr") != NULL);
  CHECK_EQ(dlrec_api_export_onnx(m, test_path("m.onnx")), 0);
  dlrec_api_model_free(m);
  CHECK_EQ(dlrec_api_report(test_path("run"), NULL), 0);
  CHECK_EQ(omp_get_max_threads(), 3);
}

static int same_bytes(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  int same = dlrec_read_file(a, 1u << 26, &x, &nx) == DLREC_OK && dlrec_read_file(b, 1u << 26, &y, &ny) == DLREC_OK &&
             nx == ny && !memcmp(x, y, nx);
  free(x);
  free(y);
  return same;
}

/* The host API takes the command line's ETL options, by one table: a fit
 * through the API with pooling, max_line_bytes and block_bytes (which it
 * once refused as unknown fields) writes the CLI's state byte for byte, and
 * a max_line_bytes below the rows' length makes them bad rows alike. */
TEST(api_etl_options_are_the_cli_s) {
  test_buf svm = {0};
  for (int i = 0; i < 400; i++) {
    test_buf_printf(&svm, "%d", i % 3 == 0);
    for (int k = 0; k <= i % 5; k++) test_buf_printf(&svm, " %d:1", (i * 7 + k * 13) % 50);
    test_buf_printf(&svm, "\n");
  }
  CHECK_EQ(test_write_file(test_path("a.svm"), svm.p, svm.n), 0);
  test_buf_free(&svm);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit -q --format libsvm --pooling mean --max-hotness 3 --max-line-bytes 100 "
                        "--block-bytes 64 --input '%s' --out '%s'", test_path("a.svm"), test_path("etl_cli"));
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  CHECK_EQ(rc, 0);
  const char *in = json_paths(test_path("a.svm"));
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl_api"),
                             "{\"format\": \"libsvm\", \"pooling\": \"mean\", \"max_hotness\": 3, "
                             "\"max_line_bytes\": 100, \"block_bytes\": 64}", NULL),
           0);
  CHECK(same_bytes(test_path("etl_cli/etl.json"), test_path("etl_api/etl.json")));
  CHECK(same_bytes(test_path("etl_cli/vocab.bin"), test_path("etl_api/vocab.bin")));
  /* An option of the other subcommand is refused, as on the command line. */
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl_x"), "{\"format\": \"libsvm\", \"seed\": 3}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "unknown field 'seed'") != NULL);
  CHECK_EQ(dlrec_api_etl_fit(in, test_path("etl_x"), "{\"format\": \"libsvm\", \"pooling\": \"max\"}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "pooling: expected sum or mean") != NULL);
  /* Criteo rows are longer than 16 bytes. */
  CHECK(make_rows() == 0);
  const char *rows = json_paths(test_path("rows.tsv"));
  CHECK_EQ(dlrec_api_etl_fit(rows, test_path("etl_y"), "{\"max_line_bytes\": 16}", NULL), -1);
  CHECK(strstr(dlrec_api_last_error(), "longer than 16 bytes") != NULL);
  rc = test_run_cli(&out, "etl fit -q --max-line-bytes 16 --input '%s' --out '%s'", test_path("rows.tsv"),
                    test_path("etl_z"));
  CHECK_EQ(rc, 1);
  CHECK(out && strstr(out, "longer than 16 bytes"));
  free(out);
  /* Unlabeled rows: --no-label, "no_label" and the API's older "has_label". */
  char *text = NULL;
  size_t n = 0;
  CHECK_OK(dlrec_read_file(test_path("rows.tsv"), 1u << 26, &text, &n));
  test_buf unl = {0};
  for (char *p = text, *nl; text && (nl = memchr(p, '\n', (size_t)(text + n - p))); p = nl + 1) {
    const char *tab = memchr(p, '\t', (size_t)(nl - p));
    test_buf_put(&unl, tab + 1, (size_t)(nl - tab));
  }
  free(text);
  CHECK_EQ(test_write_file(test_path("unlabeled.tsv"), unl.p, unl.n), 0);
  test_buf_free(&unl);
  rc = test_run_cli(&out, "etl fit -q --no-label --input '%s' --out '%s'", test_path("unlabeled.tsv"),
                    test_path("etl_nl_cli"));
  free(out);
  CHECK_EQ(rc, 0);
  const char *unlabeled = json_paths(test_path("unlabeled.tsv"));
  CHECK_EQ(dlrec_api_etl_fit(unlabeled, test_path("etl_nl_api"), "{\"no_label\": true}", NULL), 0);
  CHECK_EQ(dlrec_api_etl_fit(unlabeled, test_path("etl_hl_api"), "{\"has_label\": false}", NULL), 0);
  CHECK(same_bytes(test_path("etl_nl_cli/etl.json"), test_path("etl_nl_api/etl.json")));
  CHECK(same_bytes(test_path("etl_nl_cli/etl.json"), test_path("etl_hl_api/etl.json")));
}
