/* The training report (train/report.h): what a run writes holds every plot
 * with as many points as the run logged (counted independently from
 * metrics.jsonl), `dlrec report` rebuilds the same bytes, strings from the
 * run are escaped, and a damaged or partial run still gets a report that
 * says what is missing. tests/report/chromium.sh renders one in a browser. */
#include <sys/stat.h>

#include "core/fsutil.h"
#include "core/json.h"
#include "test.h"

static char *read_text(const char *path) {
  char *text = NULL;
  size_t n;
  return dlrec_read_file(path, 1u << 26, &text, &n) == DLREC_OK ? text : NULL;
}

static int count(const char *hay, const char *needle) {
  int k = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) k++;
  return k;
}

/* The points of the idx-th polyline inside the element that starts at
 * `<figure id="ID"`: -1 if there is no such polyline. */
static int polyline_points(const char *html, const char *id, int idx) {
  char key[128];
  snprintf(key, sizeof key, "<figure id=\"%s\"", id);
  const char *fig = strstr(html, key), *end = fig ? strstr(fig, "</figure>") : NULL;
  if (!fig || !end) return -1;
  const char *p = fig;
  for (int i = 0; i <= idx; i++) {
    p = strstr(p, "<polyline");
    if (!p || p > end) return -1;
    p += 9;
  }
  p = strstr(p, "points=\"");
  if (!p) return -1;
  p += 8;
  int n = 0;
  for (const char *q = p; *q && *q != '"'; q++) n += *q == ',';
  return n;
}

/* Lines of metrics.jsonl with a loss and no evaluation (the logging lines),
 * and lines with an evaluation that has a train part of train_rows rows. */
static int count_lines(const char *run, int *logging, int *evaluations, int *with_train, double train_rows) {
  char path[2048];
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(run));
  char *text = read_text(path);
  if (!text) return -1;
  *logging = *evaluations = *with_train = 0;
  for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    cJSON *j = cJSON_Parse(line);
    if (!j) continue;
    if (cJSON_GetObjectItemCaseSensitive(j, "valid")) {
      ++*evaluations;
      const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "train");
      const cJSON *rows = t ? cJSON_GetObjectItemCaseSensitive(t, "rows") : NULL;
      *with_train += cJSON_IsNumber(rows) && rows->valuedouble == train_rows;
    } else if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "loss"))) {
      ++*logging;
    }
    cJSON_Delete(j);
  }
  free(text);
  return 0;
}

#define RUN "run<i>&x"

TEST(training_writes_a_report_with_every_plot) {
  char *out = NULL;
  int rc = test_run_cli(&out,
                        "synth -q --rows 6000 --seed 3 --max-cardinality 500 --out '%s' && '%s' etl fit -q "
                        "--input '%s' --out '%s' --min-count 2 && '%s' etl apply -q --etl '%s' --input '%s' --out "
                        "'%s' --valid-fraction 0.2 --valid-out '%s' --seed 1",
                        test_path("clicks.tsv"), getenv("DLREC_BIN"), test_path("clicks.tsv"), test_path("etl"),
                        getenv("DLREC_BIN"), test_path("etl"), test_path("clicks.tsv"), test_path("train.dlr"),
                        test_path("valid.dlr"));
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  CHECK_EQ(rc, 0);
  const char *cfg =
      "{\"name\": \"report_test\", \"model\": {\"type\": \"dlrm\", \"embedding_dim\": 4, "
      "\"bottom_mlp\": [8, 4], \"top_mlp\": [8, 1]}, \"training\": {\"batch_size\": 64, \"epochs\": 1, \"threads\": 1},"
      " \"eval\": {\"interval_steps\": 20, \"train_rows\": 1000}, \"log\": {\"interval_steps\": 5}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  /* A run directory whose name is markup, which the report must escape. */
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s'", test_path("cfg.json"),
                    test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"), test_path(RUN));
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  CHECK_EQ(rc, 0);

  char *html = read_text(test_path(RUN "/report.html"));
  CHECK(html != NULL);
  char *summary = read_text(test_path(RUN "/summary.json"));
  CHECK(summary && strstr(summary, "\"profile\""));
  free(summary);
  int logging, evaluations, with_train;
  CHECK_EQ(count_lines(RUN, &logging, &evaluations, &with_train, 1000), 0); /* eval.train_rows */
  CHECK(logging >= 10 && evaluations >= 3);
  CHECK_EQ(with_train, evaluations);
  /* loss: the training loss, the scored training rows, the validation. */
  CHECK_EQ(polyline_points(html, "loss", 0), logging);
  CHECK_EQ(polyline_points(html, "loss", 1), evaluations);
  CHECK_EQ(polyline_points(html, "loss", 2), evaluations);
  CHECK_EQ(polyline_points(html, "loss", 3), -1);
  CHECK_EQ(polyline_points(html, "auc", 0), evaluations);
  CHECK_EQ(polyline_points(html, "auc", 1), evaluations);
  CHECK_EQ(polyline_points(html, "calibration", 0), 20);
  CHECK_EQ(polyline_points(html, "throughput", 0), logging);
  CHECK_EQ(count(html, "<rect class=\"bar\""), 7);
  CHECK(!strstr(html, "class=\"empty\""));
  /* Every column of the ETL state has its row. */
  char col[16];
  for (int i = 1; i <= 26; i++) {
    snprintf(col, sizeof col, "<td>C%d</td>", i);
    CHECK_EQ(count(html, col), 1);
  }
  for (int i = 1; i <= 13; i++) {
    snprintf(col, sizeof col, "<td>I%d</td>", i);
    CHECK_EQ(count(html, col), 1);
  }
  CHECK(!strstr(html, "<i>"));
  CHECK(strstr(html, "run&lt;i&gt;&amp;x") != NULL);
  CHECK(!strstr(html, "nan") && !strstr(html, "inf\""));

  /* dlrec report rebuilds the same bytes, here and elsewhere. */
  rc = test_run_cli(&out, "report -q '%s' --out '%s'", test_path(RUN), test_path("again.html"));
  CHECK(rc == 0 && out && strstr(out, "again.html"));
  free(out);
  char *again = read_text(test_path("again.html"));
  CHECK(again && !strcmp(again, html));
  free(again);
  free(html);
}

TEST(damaged_or_partial_run_still_gets_a_report) {
  CHECK(mkdir(test_path("run"), 0755) == 0);
  /* Two good lines, garbage, a line without a step, and a torn last line;
   * one value each that is not a number. */
  const char *lines =
      "{\"step\":10,\"loss\":0.5,\"samples_per_s\":1000}\n"
      "not json at all\n"
      "{\"loss\":0.4}\n"
      "{\"step\":20,\"loss\":null,\"samples_per_s\":1200}\n"
      "{\"step\":20,\"valid\":{\"auc\":0.7,\"logloss\":0.45,\"reliability\":{\"mean_prediction\":[0.1,0.2],"
      "\"ctr\":[0.12]}}}\n"
      "{\"step\":30,\"loss\":0.3,\"sampl";
  CHECK(test_write_file(test_path("run/metrics.jsonl"), lines, (size_t)-1) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "report '%s'", test_path("run"));
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  free(out);
  CHECK_EQ(rc, 0);
  char *html = read_text(test_path("run/report.html"));
  CHECK(html != NULL);
  CHECK(strstr(html, "3 torn or unknown lines skipped") != NULL);
  CHECK(strstr(html, "no checkpoint yet") != NULL);
  CHECK(strstr(html, "No time profile") != NULL);
  CHECK_EQ(polyline_points(html, "loss", 0), 1);      /* the null loss is no point */
  CHECK_EQ(polyline_points(html, "throughput", 0), 2);
  CHECK_EQ(polyline_points(html, "calibration", 0), 1); /* the shorter of the two arrays */
  CHECK_EQ(polyline_points(html, "auc", 0), 1);       /* one point: a range is still drawn */
  CHECK(!strstr(html, "nan") && !strstr(html, "inf"));
  free(html);

  /* A directory that is no run: refused, naming the file. */
  rc = test_run_cli(&out, "report '%s'", test_path("nothing"));
  CHECK(rc == 1 && out && strstr(out, "nothing/metrics.jsonl"));
  free(out);
  rc = test_run_cli(&out, "report");
  CHECK_EQ(rc, 2);
  free(out);
}
