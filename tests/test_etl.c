/* ETL fit/apply: vocabularies, hashing, dense statistics, determinism, the
 * round trip against a naive re-encoding done here, the train/valid split,
 * bad rows, CSV, the state files and the CLI. */
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "data/dlr.h"
#include "data/etl.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "serve/kserve.h"
#include "core/rng.h"
#include "serve/serve_batch.h"
#include "test.h"

/* ---- helpers ---- */

/* test_path's buffers rotate after 8 calls: keep a path for a whole test. */
static const char *keep(const char *p) {
  static char pool[64][1024];
  static int next;
  char *b = pool[next++ & 63];
  snprintf(b, sizeof pool[0], "%s", p);
  return b;
}

/* A Criteo line: label, I1 = dense, I2..I13 empty, C1 = c1, C2 = c2, C3.. empty
 * (written out, not stripped). */
static void crow(char *buf, size_t cap, const char *label, const char *i1, const char *c1, const char *c2) {
  int k = snprintf(buf, cap, "%s\t%s", label, i1);
  for (int i = 2; i <= 13; i++) k += snprintf(buf + k, cap - (size_t)k, "\t");
  k += snprintf(buf + k, cap - (size_t)k, "\t%s\t%s", c1, c2);
  for (int i = 3; i <= 26; i++) k += snprintf(buf + k, cap - (size_t)k, "\t");
  snprintf(buf + k, cap - (size_t)k, "\n");
}

static char *read_all(const char *path, size_t *n) {
  char *s = NULL;
  size_t m = 0;
  if (dlrec_read_file(path, 1u << 30, &s, &m) != DLREC_OK) return NULL;
  if (n) *n = m;
  return s;
}

static int same_file(const char *a, const char *b) {
  size_t na, nb;
  char *x = read_all(a, &na), *y = read_all(b, &nb);
  int same = x && y && na == nb && !memcmp(x, y, na);
  free(x);
  free(y);
  return same;
}

static dlrec_etl_fit_opts fit_opts(void) {
  dlrec_etl_fit_opts o;
  dlrec_etl_fit_opts_default(&o);
  o.progress = 0;
  o.threads = 2;
  return o;
}

static dlrec_etl_apply_opts apply_opts(void) {
  dlrec_etl_apply_opts o;
  dlrec_etl_apply_opts_default(&o);
  o.progress = 0;
  o.threads = 2;
  return o;
}

/* The hand-built input of the vocabulary tests: C1 counts a:3, b:3 ("b" and
 * "B" are one key), d:2 ("d" and "0d" too), c:1, e:1, f0:1, one missing;
 * C2 holds 12 values seen once, for hashing. */
static const char *small_input(void) {
  static const char *rows[][4] = {
      {"1", "5", "a", "1"},   {"0", "", "b", "2"},   {"0", "-3", "a", "3"}, {"1", "260.0", "b", "4"},
      {"0", "7", "c", "5"},   {"0", "0", "d", "6"},  {"1", "12", "0d", "7"}, {"0", "1e2", "a", "8"},
      {"0", "", "B", "9"},    {"1", "2", "", "a"},   {"0", "3", "e", "b"},  {"0", "99999", "f0", "c"},
  };
  const char *path = keep(test_path("small.tsv"));
  char buf[8192] = "";
  size_t k = 0;
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    crow(buf + k, sizeof buf - k, rows[i][0], rows[i][1], rows[i][2], rows[i][3]);
    k += strlen(buf + k);
  }
  if (test_write_file(path, buf, k) != 0) return NULL;
  return path;
}

/* ---- fit on a small hand-built input ---- */

TEST(fit_frequency_order_tie_break_min_count_and_missing) {
  const char *in = small_input();
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.min_count = 2;
  const char *dir = keep(test_path("etl"));
  CHECK_OK(dlrec_etl_fit(&in, 1, dir, &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, dir));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_dense, 13);
  CHECK_EQ(s->n_sparse, 26);
  CHECK(s->has_label);
  CHECK_EQ_U64(dlrec_etl_rows(e), 12);
  CHECK_EQ_U64(dlrec_etl_positives(e), 4);
  dlrec_etl_cat_info c1;
  CHECK_OK(dlrec_etl_cat_info_get(e, 0, &c1));
  /* a:3 and b:3 tie (the smaller key first), d:2 kept; c, e, f0 fold into OOV. */
  CHECK_EQ_U64(c1.kept, 3);
  CHECK_EQ_U64(c1.distinct, 6);
  CHECK_EQ_U64(c1.missing, 1);
  CHECK_EQ_U64(c1.oov, 3);
  CHECK_EQ_U64(c1.keys[0], 0xa);
  CHECK_EQ_U64(c1.counts[0], 3);
  CHECK_EQ_U64(c1.keys[1], 0xb);
  CHECK_EQ_U64(c1.counts[1], 3);
  CHECK_EQ_U64(c1.keys[2], 0xd);
  CHECK_EQ_U64(c1.counts[2], 2);
  CHECK_EQ_U64(c1.id_begin, 0);
  CHECK_EQ_U64(c1.size, 5);
  uint32_t id;
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "", 0, &id));
  CHECK_EQ(id, 0); /* missing */
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "c", 1, &id));
  CHECK_EQ(id, 1); /* rare */
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "1234", 4, &id));
  CHECK_EQ(id, 1); /* unseen */
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "B", 1, &id));
  CHECK_EQ(id, 3);
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "0000000a", 8, &id));
  CHECK_EQ(id, 2);
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "D", 1, &id));
  CHECK_EQ(id, 4);
  CHECK_ERR(dlrec_etl_encode_cat(e, 0, "xyz", 3, &id), DLREC_ERR_PARSE, "field 15 (C1): not a hex key: 'xyz'");
  /* C2: 12 distinct values seen once each, all below min-count 2. */
  dlrec_etl_cat_info c2;
  CHECK_OK(dlrec_etl_cat_info_get(e, 1, &c2));
  CHECK_EQ_U64(c2.kept, 0);
  CHECK_EQ_U64(c2.oov, 12);
  CHECK_EQ_U64(c2.id_begin, 5);
  CHECK_EQ_U64(c2.size, 2);
  CHECK_OK(dlrec_etl_encode_cat(e, 1, "1", 1, &id));
  CHECK_EQ(id, 6);
  /* Columns never present: just the missing and OOV ids. */
  dlrec_etl_cat_info c26;
  CHECK_OK(dlrec_etl_cat_info_get(e, 25, &c26));
  CHECK_EQ_U64(c26.missing, 12);
  CHECK_EQ_U64(c26.id_end, s->table_rows);
  CHECK_EQ_U64(s->table_rows, 5 + 2 + 24 * 2);
  CHECK_EQ(s->sparse[3].hotness, 1);
  dlrec_etl_free(e);
}

TEST(fit_hashing_ranks_buckets_by_frequency) {
  const char *in = small_input();
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.hash_buckets = 4; /* C2 has 12 kept values: hashed; C1 has 6: hashed too */
  const char *dir = keep(test_path("etl"));
  CHECK_OK(dlrec_etl_fit(&in, 1, dir, &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, dir));
  dlrec_etl_cat_info c2;
  CHECK_OK(dlrec_etl_cat_info_get(e, 1, &c2));
  CHECK(c2.hashed);
  CHECK_EQ_U64(c2.size, 6);
  /* Reference: the 12 keys 1..c each once, bucket = mix64(key) % 4, ranked
   * by count descending then bucket ascending. */
  uint64_t count[4] = {0};
  for (uint64_t k = 1; k <= 12; k++) count[dlrec_mix64(k) % 4]++;
  uint32_t rank[4];
  for (int b = 0; b < 4; b++) {
    rank[b] = 0;
    for (int o2 = 0; o2 < 4; o2++)
      if (count[o2] > count[b] || (count[o2] == count[b] && o2 < b)) rank[b]++;
  }
  for (int b = 0; b < 4; b++) {
    CHECK_EQ(c2.bucket_rank[b], rank[b]);
    CHECK_EQ_U64(c2.bucket_counts[rank[b]], count[b]);
  }
  for (uint64_t k = 1; k <= 12; k++) {
    char s[8];
    snprintf(s, sizeof s, "%llx", (unsigned long long)k);
    uint32_t id;
    CHECK_OK(dlrec_etl_encode_cat(e, 1, s, strlen(s), &id));
    CHECK_EQ(id, c2.id_begin + 2 + rank[dlrec_mix64(k) % 4]);
  }
  /* An unseen value still lands in a bucket; missing keeps id 0. */
  uint32_t id;
  CHECK_OK(dlrec_etl_encode_cat(e, 1, "abcdef", 6, &id));
  CHECK_EQ(id, c2.id_begin + 2 + rank[dlrec_mix64(0xabcdef) % 4]);
  CHECK_OK(dlrec_etl_encode_cat(e, 1, "", 0, &id));
  CHECK_EQ(id, c2.id_begin);
  /* C3 has no values: kept 0 <= 4, not hashed. */
  dlrec_etl_cat_info c3;
  CHECK_OK(dlrec_etl_cat_info_get(e, 2, &c3));
  CHECK(!c3.hashed);
  dlrec_etl_free(e);
}

TEST(fit_dense_stats_match_a_naive_computation) {
  const char *in = small_input();
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.standardize = 1;
  const char *dir = keep(test_path("etl"));
  CHECK_OK(dlrec_etl_fit(&in, 1, dir, &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, dir));
  /* I1 values: 5, -, -3, 260.0, 7, 0, 12, 1e2, -, 2, 3, 99999 */
  const double x[] = {5, -3, 260, 7, 0, 12, 100, 2, 3, 99999};
  double sum = 0, sum2 = 0;
  for (int i = 0; i < 10; i++) sum += log(1 + (x[i] > 0 ? x[i] : 0));
  double mean = sum / 10;
  for (int i = 0; i < 10; i++) {
    double d = log(1 + (x[i] > 0 ? x[i] : 0)) - mean;
    sum2 += d * d;
  }
  double sd = sqrt(sum2 / 10);
  dlrec_etl_dense_info d;
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_EQ_U64(d.count, 10);
  CHECK_EQ_U64(d.missing, 2);
  CHECK_NEAR(d.min, -3, 0, 0);
  CHECK_NEAR(d.max, 99999, 0, 0);
  CHECK_NEAR(d.mean, mean, 1e-12, 1e-12);
  CHECK_NEAR(d.std, sd, 1e-12, 1e-12);
  float v;
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "12", 2, &v));
  CHECK_NEAR(v, (log(13.0) - mean) / sd, 1e-6, 1e-6);
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "", 0, &v));
  CHECK_EQ(v, 0); /* missing -> 0 after the transform */
  CHECK_ERR(dlrec_etl_encode_dense(e, 0, "1x", 2, &v), DLREC_ERR_PARSE, "field 2 (I1): not a number: '1x'");
  /* I2 is always missing: count 0, and standardizing cannot divide by 0. */
  CHECK_OK(dlrec_etl_dense_info_get(e, 1, &d));
  CHECK_EQ_U64(d.count, 0);
  CHECK_OK(dlrec_etl_encode_dense(e, 1, "3", 1, &v));
  CHECK(isfinite(v));
  dlrec_etl_free(e);
  /* --dense-transform none: t = x. */
  o.standardize = 0;
  o.dense_transform = DLREC_DENSE_NONE;
  CHECK_OK(dlrec_etl_fit(&in, 1, dir, &o, NULL));
  CHECK_OK(dlrec_etl_load(&e, dir));
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_NEAR(d.mean, (5 - 3 + 260 + 7 + 0 + 12 + 100 + 2 + 3 + 99999) / 10.0, 1e-9, 1e-12);
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "-3", 2, &v));
  CHECK_EQ(v, -3);
  dlrec_etl_free(e);
}

/* Writes Criteo rows whose I1 values are vals (C1 = "a", C2 = "b"). */
static const char *dense_file(const char *name, const char *const *vals, int n) {
  char buf[16384] = "", row[1024];
  for (int i = 0; i < n; i++) {
    crow(row, sizeof row, "0", vals[i], "a", "b");
    strcat(buf, row);
  }
  const char *path = keep(test_path(name));
  return test_write_file(path, buf, (size_t)-1) == 0 ? path : NULL;
}

TEST(dense_values_beyond_float32_are_refused) {
  const char *big[] = {"1", "2", "1e308", "4"};
  const char *in = dense_file("big.tsv", big, 4);
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.dense_transform = DLREC_DENSE_NONE;
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL), DLREC_ERR_PARSE,
            "big.tsv:3: field 2 (I1): value beyond float32 range (|t| > 3.4e38): '1e308'");
  const char *neg[] = {"-3.5e38"};
  const char *in2 = dense_file("neg.tsv", neg, 1);
  CHECK_ERR(dlrec_etl_fit(&in2, 1, test_path("etl"), &o, NULL), DLREC_ERR_PARSE, "neg.tsv:1: field 2 (I1): value beyond");
  /* The log transform brings 1e308 to 709: fine. */
  o.dense_transform = DLREC_DENSE_LOG;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  /* Up to float32's largest value the statistics hold, checked against a
   * two-pass mean and std of values scaled by 2^-120. */
  const char *edge[] = {"3.4e38", "-3.4e38", "1e38", "-2e38", "3e38", ""};
  const double xs[] = {3.4e38, -3.4e38, 1e38, -2e38, 3e38};
  const char *in3 = dense_file("edge.tsv", edge, 6);
  o.dense_transform = DLREC_DENSE_NONE;
  CHECK_OK(dlrec_etl_fit(&in3, 1, test_path("edge"), &o, NULL));
  double scale = 0x1p-120, m = 0, var = 0;
  for (int i = 0; i < 5; i++) m += xs[i] * scale / 5;
  for (int i = 0; i < 5; i++) var += (xs[i] * scale - m) * (xs[i] * scale - m) / 5;
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("edge")));
  dlrec_etl_dense_info d;
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_EQ_U64(d.count, 5);
  CHECK_NEAR(d.mean, m / scale, 1e-12 * 3.4e38, 0);
  CHECK_NEAR(d.std, sqrt(var) / scale, 0, 1e-12);
  CHECK_NEAR(d.max, 3.4e38, 0, 0);
  /* apply, and the encoder predict and serve use, refuse it alike. */
  float v;
  CHECK_ERR(dlrec_etl_encode_dense(e, 0, "1e308", 5, &v), DLREC_ERR_PARSE,
            "field 2 (I1): value beyond float32 range (|t| > 3.4e38): '1e308'");
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "-3.4e38", 7, &v));
  CHECK(isfinite(v) && v < -3.3e38f);
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_ERR(dlrec_etl_apply(e, &in, 1, test_path("o.dlr"), &ao, NULL), DLREC_ERR_PARSE,
            "big.tsv:3: field 2 (I1): value beyond float32 range");
  dlrec_etl_free(e);
  /* A tiny std in fit: a value fit never saw would standardize to inf. */
  const char *tiny[] = {"1", "1.0000000000000002", "1"};
  const char *in4 = dense_file("tiny.tsv", tiny, 3);
  o.standardize = 1;
  CHECK_OK(dlrec_etl_fit(&in4, 1, test_path("tiny"), &o, NULL));
  CHECK_OK(dlrec_etl_load(&e, test_path("tiny")));
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "1", 1, &v));
  CHECK(isfinite(v));
  CHECK_ERR(dlrec_etl_encode_dense(e, 0, "1e30", 4, &v), DLREC_ERR_PARSE,
            "field 2 (I1): standardized value beyond float32 range: '1e30'");
  dlrec_etl_free(e);
  /* The CLI says where. */
  char *out = NULL;
  CHECK_EQ(test_run_cli(&out, "etl fit --input '%s' --out '%s' --dense-transform none -q", in, test_path("c")), 1);
  CHECK(strstr(out, "big.tsv:3: field 2 (I1): value beyond float32 range") != NULL);
  free(out);
}

/* Small integers take a table of log1p; a value that is not an integer must
 * not (2.5 is not log1p(2)). Checked against log1p itself, in fit's mean and
 * in the encoder. */
TEST(log_transform_of_non_integers_matches_log1p) {
  const char *vals[] = {"2.5", "0.5", "1023.5", "7.000001", "1e-3", "5"};
  const double xs[] = {2.5, 0.5, 1023.5, 7.000001, 1e-3, 5};
  const char *in = dense_file("frac.tsv", vals, 6);
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  double mean = 0;
  for (int i = 0; i < 6; i++) mean += log1p(xs[i]) / 6;
  dlrec_etl_dense_info d;
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_NEAR(d.mean, mean, 0, 1e-12);
  for (int i = 0; i < 6; i++) {
    float v;
    CHECK_OK(dlrec_etl_encode_dense(e, 0, vals[i], strlen(vals[i]), &v));
    if (!(fabs(v - log1p(xs[i])) <= 1e-6 * log1p(xs[i]))) test_fail(__FILE__, __LINE__, "x = %s", vals[i]);
    CHECK_NEAR(v, log1p(xs[i]), 0, 1e-6);
  }
  dlrec_etl_free(e);
}

/* The table of log1p covers the integers 0..1023; 1024 and above take
 * log1p itself. Every integer near the edge, in the encoder and in fit's
 * mean, against log1p. */
TEST(log_transform_at_the_table_edge_matches_log1p) {
  const char *vals[] = {"0", "1", "1022", "1023", "1024", "1025", "4096"};
  const double xs[] = {0, 1, 1022, 1023, 1024, 1025, 4096};
  const int n = (int)(sizeof xs / sizeof *xs);
  const char *in = dense_file("edge.tsv", vals, n);
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.dense_transform = DLREC_DENSE_LOG;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  double mean = 0;
  for (int i = 0; i < n; i++) mean += log1p(xs[i]) / n;
  dlrec_etl_dense_info d;
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_NEAR(d.mean, mean, 0, 1e-12);
  for (int i = 0; i < n; i++) {
    float v;
    CHECK_OK(dlrec_etl_encode_dense(e, 0, vals[i], strlen(vals[i]), &v));
    if (!(fabs(v - log1p(xs[i])) <= 1e-6 * log1p(xs[i])))
      test_fail(__FILE__, __LINE__, "x = %s: %.9g, log1p %.9g", vals[i], v, log1p(xs[i]));
  }
  dlrec_etl_free(e);
}

/* --standardize divides a constant column (std 0) by 1, as docs/etl.md says:
 * a value fit never saw keeps its distance from the mean, instead of
 * collapsing to 0 with every other value. */
TEST(standardize_divides_a_constant_column_by_one) {
  const char *vals[] = {"5", "5", "", "5"};
  const char *in = dense_file("const.tsv", vals, 4);
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.dense_transform = DLREC_DENSE_NONE;
  o.standardize = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  dlrec_etl_dense_info d;
  CHECK_OK(dlrec_etl_dense_info_get(e, 0, &d));
  CHECK_NEAR(d.mean, 5.0, 0, 0);
  CHECK_NEAR(d.std, 0.0, 0, 0);
  float v;
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "5", 1, &v));
  CHECK(v == 0.0f);
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "7.5", 3, &v));
  CHECK(v == 2.5f);
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "-1", 2, &v));
  CHECK(v == -6.0f);
  dlrec_etl_free(e);
}

/* ---- synthetic data through the CLI ---- */

/* Writes `rows` synthetic rows to path; 0 on success. */
static int synth(const char *path, int rows, int seed, int max_card) {
  char *out = NULL;
  int rc = test_run_cli(&out, "synth --rows %d --seed %d --max-cardinality %d --out '%s' -q", rows, seed, max_card,
                        path);
  if (rc != 0) fprintf(stderr, "synth failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc;
}

TEST(fit_is_independent_of_threads_and_blocks) {
  const char *in = keep(test_path("s.tsv"));
  CHECK_EQ(synth(in, 5000, 11, 300), 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.min_count = 2;
  o.hash_buckets = 100;
  o.threads = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("a"), &o, NULL));
  o.threads = 3;
  o.block_bytes = 777; /* lines (~240 bytes) span blocks */
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("b"), &o, NULL));
  o.threads = 2;
  o.block_bytes = 100000;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("c"), &o, NULL));
  CHECK(same_file(test_path("a/etl.json"), test_path("b/etl.json")));
  CHECK(same_file(test_path("a/vocab.bin"), test_path("b/vocab.bin")));
  CHECK(same_file(test_path("a/etl.json"), test_path("c/etl.json")));
  CHECK(same_file(test_path("a/vocab.bin"), test_path("c/vocab.bin")));
  /* And apply writes the same bytes too. */
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("a")));
  dlrec_etl_apply_opts ao = apply_opts();
  ao.threads = 1;
  ao.row_group_rows = 1000;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("a.dlr"), &ao, NULL));
  ao.threads = 3;
  ao.block_bytes = 500;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("b.dlr"), &ao, NULL));
  CHECK(same_file(test_path("a.dlr"), test_path("b.dlr")));
  dlrec_etl_free(e);
}

/* Entries of a directory besides . and .. (-1 when it cannot be read). */
static int dir_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* A fit within a memory budget (memory_mb) writes the state an unbounded
 * fit writes, byte for byte: a 1 MiB budget spills the count tables of
 * every block (the big columns have tens of thousands of values), and the
 * biggest vocabularies are sorted on disk too; with a cross, min_count,
 * hash_buckets (a column hashed while its values are being sorted), and
 * any threads. The spill directory is gone afterwards. */
TEST(fit_within_a_memory_budget_equals_the_unbounded_fit) {
  const char *in = keep(test_path("m.tsv"));
  CHECK_EQ(synth(in, 150000, 12, 1000000), 0);
  static const struct {
    uint64_t min_count, hash_buckets;
    int threads;
    const char *workflow;
  } runs[] = {
      {1, 0, 2, "{\"cross\": [{\"columns\": [\"C3\", \"C4\"], \"buckets\": 1000}]}"},
      {2, 0, 1, NULL},
      {1, 20000, 3, NULL},
  };
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    dlrec_etl_fit_opts o = fit_opts();
    o.min_count = runs[i].min_count;
    o.hash_buckets = runs[i].hash_buckets;
    o.workflow = runs[i].workflow;
    o.threads = runs[i].threads;
    CHECK_OK(dlrec_etl_fit(&in, 1, test_path("mem"), &o, NULL));
    o.memory_mb = 1;
    o.spill_dir = test_path("spill");
    o.block_bytes = 200000;
    dlrec_etl_report rep;
    CHECK_OK(dlrec_etl_fit(&in, 1, test_path("disk"), &o, &rep));
    CHECK(rep.spilled_bytes > (1u << 20));
    CHECK(same_file(test_path("mem/etl.json"), test_path("disk/etl.json")));
    CHECK(same_file(test_path("mem/vocab.bin"), test_path("disk/vocab.bin")));
    CHECK_EQ(dir_entries(test_path("spill")), 0); /* its own directory was removed */
  }
  /* hash_buckets exactly the biggest column's kept values: that column
   * stays a vocabulary (it is not above the limit), spilled or not. */
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("mem")));
  uint64_t most = 0;
  for (uint32_t c = 0; c < 26; c++) {
    dlrec_etl_cat_info ci;
    CHECK_OK(dlrec_etl_cat_info_get(e, c, &ci));
    if (ci.kept > most) most = ci.kept;
  }
  dlrec_etl_free(e);
  CHECK(most > 20000);
  dlrec_etl_fit_opts o = fit_opts();
  o.hash_buckets = most;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("mem"), &o, NULL));
  o.memory_mb = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("disk"), &o, NULL));
  CHECK(same_file(test_path("mem/vocab.bin"), test_path("disk/vocab.bin")));
  /* A count encoding needs its source's vocabulary in memory. */
  o = fit_opts();
  o.memory_mb = 1;
  o.workflow = "{\"count\": [{\"column\": \"C3\"}]}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_NOMEM, "raise --memory-mb");
}

TEST(several_inputs_read_as_one_stream) {
  const char *in = keep(test_path("s.tsv"));
  CHECK_EQ(synth(in, 2000, 8, 100), 0);
  size_t n;
  char *text = read_all(in, &n);
  CHECK(text != NULL);
  char *mid = text + n / 2;
  while (*mid != '\n') mid++;
  mid++;
  CHECK(test_write_file(test_path("p1.tsv"), text, (size_t)(mid - text)) == 0);
  CHECK(test_write_file(test_path("p2.tsv"), mid, n - (size_t)(mid - text)) == 0);
  free(text);
  const char *parts[] = {keep(test_path("p1.tsv")), keep(test_path("p2.tsv"))};
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("one"), &o, NULL));
  CHECK_OK(dlrec_etl_fit(parts, 2, test_path("two"), &o, NULL));
  CHECK(same_file(test_path("one/etl.json"), test_path("two/etl.json")));
  CHECK(same_file(test_path("one/vocab.bin"), test_path("two/vocab.bin")));
  /* apply over both parts writes the same rows as over the whole file. */
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("one")));
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("one.dlr"), &ao, NULL));
  CHECK_OK(dlrec_etl_apply(e, parts, 2, test_path("two.dlr"), &ao, NULL));
  CHECK(same_file(test_path("one.dlr"), test_path("two.dlr")));
  dlrec_etl_free(e);
  /* A missing input fails before any work. */
  const char *bad[] = {parts[0], keep(test_path("nope.tsv"))};
  CHECK_ERR(dlrec_etl_fit(bad, 2, test_path("x"), &o, NULL), DLREC_ERR_IO, "nope.tsv");
}

/* The naive reference: per column, the sorted distinct keys with counts. */
typedef struct ref_col {
  uint64_t *keys; /* sorted ascending */
  uint64_t *counts;
  uint32_t *local;
  uint64_t n;
  int hashed;
  uint32_t rank[64];
  uint64_t begin, size;
} ref_col;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Splits text into lines and each line into 40 fields (tabs; missing tail
 * empty). Returns the number of lines; fields[l][f] point into text. */
static int split_rows(char *text, char *(*fields)[40], int max_rows) {
  int n = 0;
  char *p = text;
  while (*p && n < max_rows) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    int f = 0;
    char *q = p;
    for (; f < 40; f++) {
      fields[n][f] = q;
      char *tab = q ? strchr(q, '\t') : NULL;
      if (tab) *tab = '\0';
      q = tab ? tab + 1 : NULL;
    }
    for (f = 0; f < 40; f++)
      if (!fields[n][f]) fields[n][f] = "";
    n++;
    if (!nl) break;
    p = nl + 1;
  }
  return n;
}

static void ref_build(ref_col *rc, char *(*fields)[40], int rows, int col, uint64_t min_count, uint64_t buckets) {
  uint64_t *all = malloc(sizeof(uint64_t) * (size_t)rows), m = 0;
  for (int r = 0; r < rows; r++)
    if (fields[r][14 + col][0]) all[m++] = strtoull(fields[r][14 + col], NULL, 16);
  qsort(all, m, sizeof *all, cmp_u64);
  rc->keys = malloc(sizeof(uint64_t) * (m + 1));
  rc->counts = malloc(sizeof(uint64_t) * (m + 1));
  rc->local = malloc(sizeof(uint32_t) * (m + 1));
  rc->n = 0;
  for (uint64_t i = 0; i < m; i++) {
    if (rc->n && rc->keys[rc->n - 1] == all[i]) {
      rc->counts[rc->n - 1]++;
    } else {
      rc->keys[rc->n] = all[i];
      rc->counts[rc->n++] = 1;
    }
  }
  uint64_t kept = 0;
  for (uint64_t i = 0; i < rc->n; i++) kept += rc->counts[i] >= min_count;
  rc->hashed = buckets && kept > buckets;
  if (rc->hashed) {
    uint64_t bc[64] = {0};
    for (uint64_t i = 0; i < rc->n; i++) bc[dlrec_mix64(rc->keys[i]) % buckets] += rc->counts[i];
    for (uint64_t b = 0; b < buckets; b++) {
      rc->rank[b] = 0;
      for (uint64_t o = 0; o < buckets; o++)
        if (bc[o] > bc[b] || (bc[o] == bc[b] && o < b)) rc->rank[b]++;
    }
    rc->size = 2 + buckets;
  } else {
    /* Local id of a kept key: 2 + the number of kept keys ordered before it. */
    for (uint64_t i = 0; i < rc->n; i++) {
      rc->local[i] = 1;
      if (rc->counts[i] < min_count) continue;
      uint32_t before = 0;
      for (uint64_t j = 0; j < rc->n; j++)
        if (rc->counts[j] >= min_count &&
            (rc->counts[j] > rc->counts[i] || (rc->counts[j] == rc->counts[i] && rc->keys[j] < rc->keys[i])))
          before++;
      rc->local[i] = 2 + before;
    }
    rc->size = 2 + kept;
  }
  free(all);
}

static uint32_t ref_id(const ref_col *rc, const char *s, uint64_t buckets) {
  if (!s[0]) return (uint32_t)rc->begin;
  uint64_t key = strtoull(s, NULL, 16);
  if (rc->hashed) return (uint32_t)(rc->begin + 2 + rc->rank[dlrec_mix64(key) % buckets]);
  uint64_t *hit = bsearch(&key, rc->keys, rc->n, sizeof key, cmp_u64);
  return (uint32_t)(rc->begin + (hit ? rc->local[hit - rc->keys] : 1));
}

/* Valid membership by the documented formula, written out here. */
static int ref_valid(uint64_t seed, uint32_t file, uint64_t line, double f) {
  uint64_t h = dlrec_mix64(dlrec_mix64(dlrec_mix64(seed) ^ file) ^ line);
  return (double)(h >> 11) / 9007199254740992.0 < f;
}

/* One decoded row of a .dlr file. */
typedef struct dec_row {
  float label, dense[13];
  uint32_t ids[26];
} dec_row;

static dec_row *read_dlr(const char *path, uint64_t *rows) {
  dlrec_dlr *f;
  if (dlrec_dlr_open(&f, path) != DLREC_OK) return NULL;
  uint64_t n = dlrec_dlr_rows(f), k = 0;
  dec_row *out = calloc(n + 1, sizeof *out);
  for (uint32_t g = 0; g < dlrec_dlr_row_groups(f); g++) {
    dlrec_rowgroup rg;
    if (dlrec_dlr_verify(f, g) != DLREC_OK || dlrec_dlr_row_group(f, g, &rg) != DLREC_OK) {
      free(out);
      dlrec_dlr_close(f);
      return NULL;
    }
    for (uint32_t r = 0; r < rg.rows; r++, k++) {
      out[k].label = rg.labels ? rg.labels[r] : -1;
      for (int d = 0; d < 13; d++) out[k].dense[d] = rg.dense[(size_t)r * 13 + d];
      for (int c = 0; c < 26; c++) out[k].ids[c] = rg.ids[c][r];
    }
  }
  dlrec_dlr_close(f);
  *rows = k;
  return out;
}

/* One output per input (per_input): each input's file holds the rows a
 * merged apply writes for it, in order (so concatenated they are the merged
 * file's rows); an empty input gets an empty file, in the middle and last; the validation rows of
 * all inputs go to the one valid_out, the same bytes as the merged run's;
 * two inputs of one name, or stdin, are refused. */
TEST(apply_writes_one_file_per_input) {
  const char *a = keep(test_path("day_0.tsv")), *b = keep(test_path("day_1.tsv"));
  CHECK_EQ(synth(a, 3000, 21, 200), 0);
  CHECK_EQ(synth(b, 2000, 22, 200), 0);
  CHECK(test_write_file(test_path("day_2"), "", 0) == 0);
  CHECK(test_write_file(test_path("day_3.tsv"), "", 0) == 0);
  const char *in[] = {a, keep(test_path("day_2")), b, keep(test_path("day_3.tsv"))};
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(in, 4, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  dlrec_etl_apply_opts ao = apply_opts();
  ao.valid_fraction = 0.25;
  ao.seed = 5;
  ao.row_group_rows = 700; /* a file's last group is partial */
  ao.valid_out = keep(test_path("merged_valid.dlr"));
  dlrec_etl_report rm, rp;
  CHECK_OK(dlrec_etl_apply(e, in, 4, test_path("merged.dlr"), &ao, &rm));
  CHECK(mkdir(test_path("out"), 0755) == 0);
  ao.valid_out = keep(test_path("valid.dlr"));
  ao.per_input = 1;
  ao.threads = 3;
  ao.block_bytes = 4096; /* many blocks per file */
  CHECK_OK(dlrec_etl_apply(e, in, 4, test_path("out"), &ao, &rp));
  CHECK_EQ(rp.rows, rm.rows);
  CHECK_EQ(rp.valid_rows, rm.valid_rows);
  CHECK(same_file(test_path("valid.dlr"), test_path("merged_valid.dlr")));
  uint64_t n_merged, n0, n1, n2;
  dec_row *merged = read_dlr(test_path("merged.dlr"), &n_merged);
  uint64_t n3;
  dec_row *f0 = read_dlr(test_path("out/day_0.dlr"), &n0), *f1 = read_dlr(test_path("out/day_2.dlr"), &n1),
          *f2 = read_dlr(test_path("out/day_1.dlr"), &n2), *f3 = read_dlr(test_path("out/day_3.dlr"), &n3);
  CHECK(merged && f0 && f1 && f2 && f3);
  CHECK_EQ(n1, 0);
  CHECK_EQ(n3, 0); /* a last input without rows gets its file too */
  free(f3);
  CHECK(n0 > 2000 && n2 > 1300);
  CHECK_EQ(n0 + n2, n_merged);
  CHECK(!memcmp(f0, merged, n0 * sizeof *f0));
  CHECK(!memcmp(f2, merged + n0, n2 * sizeof *f2));
  free(merged), free(f0), free(f1), free(f2);
  /* Refused: two inputs named alike, and stdin. */
  const char *twice[] = {a, a};
  CHECK_ERR(dlrec_etl_apply(e, twice, 2, test_path("out"), &ao, NULL), DLREC_ERR_INVALID, "would both be written");
  const char *stdin_in[] = {"-"};
  ao.valid_fraction = 0, ao.valid_out = NULL;
  CHECK_ERR(dlrec_etl_apply(e, stdin_in, 1, test_path("out"), &ao, NULL), DLREC_ERR_INVALID, "stdin");
  dlrec_etl_free(e);
}

TEST(round_trip_matches_naive_reencoding_with_valid_split) {
  const int rows = 4000;
  const uint64_t min_count = 3, buckets = 24, seed = 9;
  const double frac = 0.2;
  const char *in = keep(test_path("s.tsv")), *etl = test_path("etl");
  const char *train = keep(test_path("train.dlr")), *valid = test_path("valid.dlr");
  CHECK_EQ(synth(in, rows, 5, 60), 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit --input '%s' --out '%s' --min-count %llu --hash-buckets %llu --threads 2 -q",
                        in, etl, (unsigned long long)min_count, (unsigned long long)buckets);
  if (rc) fprintf(stderr, "%s\n", out);
  free(out);
  CHECK_EQ(rc, 0);
  rc = test_run_cli(&out,
                    "etl apply --etl '%s' --input '%s' --out '%s' --valid-fraction %g --valid-out '%s' --seed %llu "
                    "--row-group-rows 333 -q",
                    etl, in, train, frac, valid, (unsigned long long)seed);
  if (rc) fprintf(stderr, "%s\n", out);
  free(out);
  CHECK_EQ(rc, 0);

  /* The reference, from the text alone. */
  size_t n;
  char *text = read_all(in, &n);
  CHECK(text != NULL);
  char *copy = malloc(n + 1);
  memcpy(copy, text, n + 1);
  char *(*fields)[40] = calloc((size_t)rows + 1, sizeof *fields);
  CHECK_EQ(split_rows(text, fields, rows + 1), rows);
  ref_col *ref = calloc(26, sizeof *ref);
  uint64_t next = 0;
  int hashed = 0;
  for (int c = 0; c < 26; c++) {
    ref_build(&ref[c], fields, rows, c, min_count, buckets);
    ref[c].begin = next;
    next += ref[c].size;
    hashed += ref[c].hashed;
  }
  CHECK(hashed > 0 && hashed < 26); /* both kinds of column are exercised */

  uint64_t nt = 0, nv = 0;
  dec_row *t = read_dlr(train, &nt), *v = read_dlr(valid, &nv);
  CHECK(t && v);
  CHECK_EQ_U64(nt + nv, rows);
  CHECK(nv > rows * frac * 0.7 && nv < rows * frac * 1.3);
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  CHECK_EQ_U64(dlrec_etl_schema(e)->table_rows, next);
  /* Every row, every value: rows of each output in input order. */
  uint64_t ti = 0, vi = 0;
  char *line = copy;
  for (int r = 0; r < rows && !test_failed_now(); r++) {
    char *nl = strchr(line, '\n');
    int is_valid = ref_valid(seed, 0, (uint64_t)r + 1, frac);
    const dec_row *got = is_valid ? &v[vi++] : &t[ti++];
    CHECK(is_valid ? vi <= nv : ti <= nt);
    CHECK_EQ(got->label, atoi(fields[r][0]));
    for (int d = 0; d < 13; d++) {
      const char *s = fields[r][1 + d];
      float want = s[0] ? (float)log1p(fmax(strtod(s, NULL), 0.0)) : 0.0f;
      CHECK(got->dense[d] == want);
    }
    for (int c = 0; c < 26; c++) CHECK_EQ(got->ids[c], ref_id(&ref[c], fields[r][14 + c], buckets));
    /* Serving encodes the raw line to the same values. */
    float label, dense[13];
    uint32_t ids[26];
    CHECK_OK(dlrec_etl_encode_line(e, line, (size_t)(nl - line), 1, &label, dense, ids));
    CHECK(label == got->label && !memcmp(dense, got->dense, sizeof dense) && !memcmp(ids, got->ids, sizeof ids));
    line = nl + 1;
  }
  CHECK_EQ_U64(ti, nt);
  CHECK_EQ_U64(vi, nv);
  dlrec_etl_free(e);
  for (int c = 0; c < 26; c++) free(ref[c].keys), free(ref[c].counts), free(ref[c].local);
  free(ref);
  free(fields);
  free(text);
  free(copy);
  free(t);
  free(v);
}

TEST(valid_split_is_deterministic_per_seed) {
  const char *in = keep(test_path("s.tsv"));
  CHECK_EQ(synth(in, 3000, 2, 50), 0);
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  dlrec_etl_apply_opts ao = apply_opts();
  ao.valid_fraction = 0.3;
  ao.seed = 4;
  ao.valid_out = keep(test_path("v1.dlr"));
  dlrec_etl_report rep;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("t1.dlr"), &ao, &rep));
  CHECK_EQ_U64(rep.rows, 3000);
  ao.valid_out = keep(test_path("v2.dlr"));
  ao.threads = 1;
  ao.block_bytes = 1000;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("t2.dlr"), &ao, NULL));
  CHECK(same_file(test_path("t1.dlr"), test_path("t2.dlr")));
  CHECK(same_file(test_path("v1.dlr"), test_path("v2.dlr")));
  ao.seed = 5;
  ao.valid_out = keep(test_path("v3.dlr"));
  dlrec_etl_report rep3;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("t3.dlr"), &ao, &rep3));
  CHECK(!same_file(test_path("v1.dlr"), test_path("v3.dlr")));
  CHECK_EQ_U64(rep3.rows, 3000);
  /* The documented formula decides membership. */
  uint64_t want = 0;
  for (uint64_t line = 1; line <= 3000; line++) want += ref_valid(4, 0, line, 0.3);
  CHECK_EQ_U64(rep.valid_rows, want);
  for (uint64_t line = 1; line <= 3000; line++) CHECK_EQ(dlrec_etl_is_valid_row(4, 0, line, 0.3), ref_valid(4, 0, line, 0.3));
  dlrec_etl_free(e);
}

/* ---- bad rows ---- */

/* A file whose lines 3, 5, 7, 8, 9 and 10 are bad in different ways. */
static const char *bad_input(void) {
  char good[1024], buf[16384] = "";
  crow(good, sizeof good, "1", "3", "aa", "bb");
  strcat(buf, good);
  strcat(buf, good);
  char b[1024];
  crow(b, sizeof b, "0", "3", "aa", "xyz!"); /* line 3: C2 not hex */
  strcat(buf, b);
  strcat(buf, good);
  crow(b, sizeof b, "0", "3.5.1", "aa", "bb"); /* line 5: I1 not a number */
  strcat(buf, b);
  strcat(buf, good);
  crow(b, sizeof b, "2", "3", "aa", "bb"); /* line 7: label */
  strcat(buf, b);
  strcat(buf, "1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t14\ta\tb\tc\td\te\tf\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t14\t15\t16\t17\t18\t19\t20\t21\n"); /* line 8: 41 fields */
  strcat(buf, "1\t");
  for (int i = 0; i < 400; i++) strcat(buf, "9"); /* line 9: 402 bytes > --max-line-bytes 300 */
  strcat(buf, "\n");
  size_t k = strlen(buf);
  memcpy(buf + k, "1\t2\0\t3\n", 7); /* line 10: NUL */
  k += 7;
  memcpy(buf + k, good, strlen(good));
  k += strlen(good);
  const char *path = keep(test_path("bad.tsv"));
  return test_write_file(path, buf, k) == 0 ? path : NULL;
}

TEST(bad_rows_stop_or_are_skipped_and_counted) {
  const char *in = bad_input();
  CHECK(in != NULL);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit --input '%s' --out '%s' --max-line-bytes 300", in, test_path("etl"));
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "bad.tsv:3: field 16 (C2): not a hex key: 'xyz!'") != NULL);
  free(out);
  /* Six bad rows: allowing six works, with a warning for each and a total. */
  rc = test_run_cli(&out, "etl fit --input '%s' --out '%s' --max-line-bytes 300 --skip-bad-rows 6", in,
                    test_path("etl"));
  CHECK_EQ(rc, 0);
  static const char *want[] = {"bad.tsv:3: field 16 (C2): not a hex key",
                               "bad.tsv:5: field 2 (I1): not a number: '3.5.1'",
                               "bad.tsv:7: field 1 (label): label is not 0 or 1: '2'",
                               "bad.tsv:8: more than 40 fields (field 41 is unexpected)",
                               "bad.tsv:9: line longer than 300 bytes",
                               "bad.tsv:10: field 2 (I1): NUL byte in field",
                               "skipped 6 bad rows in all"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (!strstr(out, want[i])) test_fail(__FILE__, __LINE__, "missing '%s' in:\n%s", want[i], out);
    CHECK(strstr(out, want[i]) != NULL);
  }
  free(out);
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  CHECK_EQ_U64(dlrec_etl_rows(e), 5);
  dlrec_etl_free(e);
  /* Allowing two: the third bad row (line 7) is the error. */
  rc = test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s' --max-line-bytes 300 --skip-bad-rows 2",
                    test_path("etl"), in, test_path("o.dlr"));
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "bad.tsv:7: field 1 (label): label is not 0 or 1: '2' (bad row 3; --skip-bad-rows allows 2)"));
  free(out);
  struct stat st;
  CHECK(stat(test_path("o.dlr"), &st) != 0); /* nothing left behind */
  /* apply skips the same six. */
  dlrec_etl_report rep;
  dlrec_etl_apply_opts ao = apply_opts();
  ao.skip_bad_rows = 6;
  ao.max_line_bytes = 300;
  ao.block_bytes = 64;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("o.dlr"), &ao, &rep));
  CHECK_EQ_U64(rep.rows, 5);
  CHECK_EQ_U64(rep.bad_rows, 6);
  dlrec_etl_free(e);
}

TEST(empty_input_fit_fails_apply_writes_empty_file) {
  const char *empty = keep(test_path("empty.tsv"));
  CHECK(test_write_file(empty, "", 0) == 0);
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_ERR(dlrec_etl_fit(&empty, 1, test_path("etl"), &o, NULL), DLREC_ERR_PARSE, "no rows");
  const char *in = small_input();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  char *out = NULL;
  int rc = test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s'", test_path("etl"), empty,
                        test_path("e.dlr"));
  CHECK_EQ(rc, 0);
  CHECK(strstr(out, "no rows") != NULL);
  free(out);
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, test_path("e.dlr")));
  CHECK_EQ_U64(dlrec_dlr_rows(f), 0);
  dlrec_dlr_close(f);
}

/* Rows of fewer than 40 fields are valid (stripped empty tails) but may be
 * torn lines: runs count them and name the first; --strict-fields refuses. */
TEST(short_criteo_rows_are_counted_or_refused) {
  char full[1024], text[8192] = "";
  crow(full, sizeof full, "1", "3", "aa", "bb"); /* 40 fields, written out */
  const char *lines[] = {full, "1\t5\t\t3\n", full, "0\n", full, "1\t2\t\t\t\t\t\t\t\t\t\t\t\t\taa\n"};
  for (int i = 0; i < 6; i++) strcat(text, lines[i]);
  const char *in = keep(test_path("short.tsv")), *whole = keep(test_path("whole.tsv"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  CHECK(test_write_file(whole, full, (size_t)-1) == 0);
  /* The reference: lines of fewer than 39 tabs, and the first of them. */
  int want = 0, first = 0;
  for (int i = 0; i < 6; i++) {
    int tabs = 0;
    for (const char *p = lines[i]; *p; p++) tabs += *p == '\t';
    if (tabs + 1 < 40 && !want++) first = i + 1;
  }
  CHECK_EQ(want, 3);
  char where[1200];
  snprintf(where, sizeof where, "%s:%d", in, first);
  dlrec_etl_fit_opts o = fit_opts();
  dlrec_etl_report rep;
  /* Any block size and thread count: the count, and the first in input order. */
  for (size_t block = 8; block <= 4096; block *= 8) {
    o.block_bytes = block;
    CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, &rep));
    CHECK_EQ_U64(rep.rows, 6);
    CHECK_EQ_U64(rep.short_rows, (uint64_t)want);
    CHECK_STR(rep.first_short, where);
  }
  /* Several inputs: the first short row is in the second file. */
  const char *two[] = {whole, in};
  CHECK_OK(dlrec_etl_fit(two, 2, test_path("etl2"), &o, &rep));
  CHECK_EQ_U64(rep.short_rows, (uint64_t)want);
  CHECK_STR(rep.first_short, where);
  CHECK_OK(dlrec_etl_fit(&whole, 1, test_path("etl3"), &o, &rep));
  CHECK_EQ_U64(rep.short_rows, 0);
  CHECK_STR(rep.first_short, "");
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  dlrec_etl_apply_opts ao = apply_opts();
  ao.block_bytes = 64;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("o.dlr"), &ao, &rep));
  CHECK_EQ_U64(rep.rows, 6);
  CHECK_EQ_U64(rep.short_rows, (uint64_t)want);
  CHECK_STR(rep.first_short, where);
  /* --strict-fields: the first short row is the error. */
  ao.strict_fields = 1;
  CHECK_ERR(dlrec_etl_apply(e, &in, 1, test_path("o.dlr"), &ao, &rep), DLREC_ERR_PARSE,
            "short.tsv:2: 4 fields, expected 40 (--strict-fields)");
  dlrec_etl_free(e);
  o.strict_fields = 1;
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("etl4"), &o, &rep), DLREC_ERR_PARSE,
            "short.tsv:2: 4 fields, expected 40 (--strict-fields)");
  CHECK_OK(dlrec_etl_fit(&whole, 1, test_path("etl4"), &o, &rep));
  /* The CLI: the summary names the count and the first; the flag refuses. */
  char *out = NULL;
  CHECK_EQ(test_run_cli(&out, "etl fit --input '%s' --out '%s'", in, test_path("c")), 0);
  char line[1400];
  snprintf(line, sizeof line, "etl fit: 3 rows had fewer fields than Criteo's 40 (39 unlabeled), the first at %s", where);
  if (!strstr(out, line)) test_fail(__FILE__, __LINE__, "no '%s' in: %s", line, out);
  CHECK(strstr(out, line) != NULL);
  free(out);
  CHECK_EQ(test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s'", test_path("c"), in, test_path("c.dlr")), 0);
  CHECK(strstr(out, "etl apply: 3 rows had fewer fields") != NULL);
  free(out);
  CHECK_EQ(test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s' --strict-fields", test_path("c"), in,
                        test_path("c.dlr")),
           1);
  CHECK(strstr(out, "short.tsv:2: 4 fields, expected 40 (--strict-fields)") != NULL);
  free(out);
  CHECK_EQ(test_run_cli(&out, "-q etl fit --input '%s' --out '%s' --strict-fields --skip-bad-rows 3", in,
                        test_path("d")),
           0);
  CHECK(strstr(out, "skipped 3 bad rows") != NULL);
  free(out);
}

/* ---- formats and inputs ---- */

TEST(criteo_unlabeled_crlf_and_stdin) {
  const char *in = small_input();
  CHECK(in != NULL);
  char *out = NULL;
  /* fit from stdin gives the same state as from the file. */
  int rc = test_run_cli(&out, "etl fit --input - --out '%s' -q < '%s'", test_path("a"), in);
  CHECK_EQ(rc, 0);
  free(out);
  rc = test_run_cli(&out, "etl fit --input '%s' --out '%s' -q", in, test_path("b"));
  CHECK_EQ(rc, 0);
  free(out);
  CHECK(same_file(test_path("a/vocab.bin"), test_path("b/vocab.bin")));
  /* The same rows without labels, with CRLF and stripped tails, no final newline. */
  size_t n;
  char *text = read_all(in, &n);
  CHECK(text != NULL);
  char *unl = malloc(2 * n + 1), *p = unl;
  for (char *line = text; *line;) {
    char *nl = strchr(line, '\n');
    char *tab = strchr(line, '\t');
    size_t len = (size_t)(nl - tab - 1);
    while (len && tab[len] == '\t') len--; /* strip trailing empty fields */
    memcpy(p, tab + 1, len);
    p += len;
    if (nl[1]) p += sprintf(p, "\r\n");
    line = nl + 1;
  }
  *p = '\0';
  CHECK(test_write_file(test_path("u.tsv"), unl, (size_t)-1) == 0);
  rc = test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s' --no-label -q", test_path("a"),
                    test_path("u.tsv"), test_path("u.dlr"));
  if (rc) fprintf(stderr, "%s\n", out);
  CHECK_EQ(rc, 0);
  free(out);
  rc = test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s' -q", test_path("a"), in, test_path("l.dlr"));
  CHECK_EQ(rc, 0);
  free(out);
  uint64_t nu, nl;
  dec_row *u = read_dlr(test_path("u.dlr"), &nu), *l = read_dlr(test_path("l.dlr"), &nl);
  CHECK(u && l);
  CHECK_EQ_U64(nu, 12);
  CHECK_EQ_U64(nl, 12);
  for (int r = 0; r < 12; r++) {
    CHECK(u[r].label == -1); /* no label column */
    CHECK(!memcmp(u[r].dense, l[r].dense, sizeof u[r].dense) && !memcmp(u[r].ids, l[r].ids, sizeof u[r].ids));
  }
  free(u), free(l), free(text), free(unl);
}

TEST(csv_with_schema_quotes_and_reordered_header) {
  const char *fit_csv =
      "id,click,hour,site,app,\"dev,ice\"\n"
      "1,0,14102100,s1,a1,\"d\"\"1\"\n"
      "2,1,14102101,s2,a1,\n"
      "3,0,14102100,s1,\"a,2\",x\r\n"
      "4,1,,s1,a1,\"d\"\"1\"\n";
  CHECK(test_write_file(test_path("f.csv"), fit_csv, (size_t)-1) == 0);
  const char *in = keep(test_path("f.csv"));
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=click;ignore=id;dense=hour;cat=*";
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_dense, 1);
  CHECK_EQ(s->n_sparse, 3);
  CHECK_STR(s->sparse[2].name, "dev,ice");
  CHECK_STR(s->label_name, "click");
  /* site: s1 x3, s2 x1 -> s1 = 2, s2 = 3; keys are salted hashes of the text. */
  dlrec_etl_cat_info site, dev;
  CHECK_OK(dlrec_etl_cat_info_get(e, 0, &site));
  CHECK_EQ(site.key_kind, DLREC_KEY_HASH);
  CHECK_EQ_U64(site.salt, dlrec_cat_salt("site"));
  CHECK_EQ_U64(site.keys[0], dlrec_hash_bytes("s1", 2, dlrec_cat_salt("site")));
  uint32_t id;
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "s2", 2, &id));
  CHECK_EQ(id, site.id_begin + 3);
  CHECK_OK(dlrec_etl_cat_info_get(e, 2, &dev));
  CHECK_EQ_U64(dev.keys[0], dlrec_hash_bytes("d\"1", 3, dlrec_cat_salt("dev,ice"))); /* unescaped */
  CHECK_EQ_U64(dev.missing, 1);
  /* A line in fit's column order encodes like apply. */
  float label, dense[1];
  uint32_t ids[3];
  CHECK_OK(dlrec_etl_encode_line(e, "9,1,14102100,s2,\"a,2\",zz", 24, 1, &label, dense, ids));
  CHECK(label == 1);
  CHECK_NEAR(dense[0], log1p(14102100.0), 0, 1e-7);
  CHECK_EQ(ids[0], site.id_begin + 3);
  CHECK_EQ(ids[2], dev.id_begin + 1); /* zz: unseen */
  /* apply on a file with the columns in another order and no id column. */
  const char *apply_csv = "app,\"dev,ice\",site,click,hour\n\"a,2\",zz,s2,1,14102100\n";
  CHECK(test_write_file(test_path("g.csv"), apply_csv, (size_t)-1) == 0);
  const char *in2 = keep(test_path("g.csv"));
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &in2, 1, test_path("g.dlr"), &ao, NULL));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, test_path("g.dlr")));
  dlrec_rowgroup rg;
  CHECK_OK(dlrec_dlr_row_group(f, 0, &rg));
  CHECK(rg.labels[0] == 1 && rg.dense[0] == dense[0]);
  for (int c = 0; c < 3; c++) CHECK_EQ(rg.ids[c][0], ids[c]);
  dlrec_dlr_close(f);
  /* A file missing a feature column is refused at its header. */
  CHECK(test_write_file(test_path("h.csv"), "site,click,hour\ns1,0,1\n", (size_t)-1) == 0);
  const char *in3 = keep(test_path("h.csv"));
  CHECK_ERR(dlrec_etl_apply(e, &in3, 1, test_path("h.dlr"), &ao, NULL), DLREC_ERR_PARSE,
            "h.csv:1: header has no categorical column 'app'");
  dlrec_etl_free(e);
  /* CSV row errors name the column. */
  CHECK(test_write_file(test_path("b.csv"), "id,click,hour,site,app,\"dev,ice\"\n1,0,x1,s,a,d\n", (size_t)-1) == 0);
  const char *in4 = keep(test_path("b.csv"));
  CHECK_ERR(dlrec_etl_fit(&in4, 1, test_path("etl2"), &o, NULL), DLREC_ERR_PARSE,
            "b.csv:2: field 3 (hour): not a number: 'x1'");
}

/* A UTF-8 byte-order mark (spreadsheet exports) is not part of the first
 * column's name or the first label: the files encode as without it. */
TEST(utf8_byte_order_mark_is_dropped) {
  const char *csv = "click,site,hour\r\n1,a,3\r\n0,b,4\r\n1,a,5\r\n";
  const char *plain = keep(test_path("plain.csv")), *bom = keep(test_path("bom.csv"));
  char buf[256];
  snprintf(buf, sizeof buf, "\xef\xbb\xbf%s", csv);
  CHECK(test_write_file(plain, csv, (size_t)-1) == 0);
  CHECK(test_write_file(bom, buf, (size_t)-1) == 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=click;cat=site;dense=hour";
  CHECK_OK(dlrec_etl_fit(&plain, 1, test_path("p"), &o, NULL));
  CHECK_OK(dlrec_etl_fit(&bom, 1, test_path("b"), &o, NULL));
  CHECK(same_file(test_path("p/vocab.bin"), test_path("b/vocab.bin")));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("p")));
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &plain, 1, test_path("p.dlr"), &ao, NULL));
  CHECK_OK(dlrec_etl_apply(e, &bom, 1, test_path("b.dlr"), &ao, NULL));
  dlrec_etl_free(e);
  CHECK(same_file(test_path("p.dlr"), test_path("b.dlr")));
  /* Criteo TSV: the first line's label. */
  const char *in = small_input();
  size_t n;
  char *text = read_all(in, &n);
  CHECK(text != NULL);
  char *t = malloc(n + 3);
  memcpy(t, "\xef\xbb\xbf", 3);
  memcpy(t + 3, text, n);
  const char *tb = keep(test_path("bom.tsv"));
  CHECK(test_write_file(tb, t, n + 3) == 0);
  free(text);
  free(t);
  o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("tp"), &o, NULL));
  CHECK_OK(dlrec_etl_fit(&tb, 1, test_path("tb"), &o, NULL));
  CHECK(same_file(test_path("tp/vocab.bin"), test_path("tb/vocab.bin")));
}

/* ---- the state files ---- */

static void copy_state(const char *from, const char *to) {
  dlrec_mkdirs(to);
  const char *names[] = {"etl.json", "vocab.bin"};
  for (int i = 0; i < 2; i++) {
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/%s", from, names[i]);
    snprintf(b, sizeof b, "%s/%s", to, names[i]);
    size_t n = 0;
    char *d = read_all(a, &n);
    if (d) test_write_file(b, d, n);
    free(d);
  }
}

static dlrec_status load_status(const char *dir) {
  dlrec_etl *e = NULL;
  dlrec_status st = dlrec_etl_load(&e, dir);
  dlrec_etl_free(e);
  return st;
}

/* Replaces the first `from` in path's text with `to`. */
static int edit_file(const char *path, const char *from, const char *to) {
  size_t n;
  char *s = read_all(path, &n);
  char *p = s ? strstr(s, from) : NULL;
  if (!p) {
    free(s);
    return -1;
  }
  char *t = malloc(n + strlen(to) + 1);
  size_t k = (size_t)(p - s);
  memcpy(t, s, k);
  strcpy(t + k, to);
  strcat(t, p + strlen(from));
  int rc = test_write_file(path, t, (size_t)-1);
  free(s);
  free(t);
  return rc;
}

/* Recomputes etl.json's checksum of itself as docs/etl.md specifies (the
 * CRC32C of the text with the value's 8 digits read as zeros), so that a
 * test can edit a field and reach the checks behind the checksum. */
static int seal_json(const char *path) {
  size_t n;
  char *s = read_all(path, &n);
  const char *key = "\"state_crc32c\":\t\"";
  char *p = s ? strstr(s, key) : NULL;
  if (!p) {
    free(s);
    return -1;
  }
  p += strlen(key);
  memset(p, '0', 8);
  char hex[9];
  snprintf(hex, sizeof hex, "%08x", dlrec_crc32c(0, s, n));
  memcpy(p, hex, 8);
  int rc = test_write_file(path, s, n);
  free(s);
  return rc;
}

/* edit_file, then seal_json. */
static int edit_sealed(const char *path, const char *from, const char *to) {
  return edit_file(path, from, to) == 0 ? seal_json(path) : -1;
}

TEST(corrupt_or_mismatched_state_is_refused) {
  const char *in = small_input();
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("good"), &o, NULL));
  CHECK_OK(load_status(test_path("good")));
  /* A flipped byte anywhere in vocab.bin. */
  size_t n;
  char *v = read_all(test_path("good/vocab.bin"), &n);
  CHECK(v && n > 64);
  size_t offs[] = {0, 9, 20, 30, 40, n / 2, n - 1};
  for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
    copy_state(test_path("good"), test_path("bad"));
    v[offs[i]] ^= 0x10;
    CHECK(test_write_file(test_path("bad/vocab.bin"), v, n) == 0);
    v[offs[i]] ^= 0x10;
    dlrec_status st = load_status(test_path("bad"));
    if (st != DLREC_ERR_CORRUPT) test_fail(__FILE__, __LINE__, "offset %zu: %s", offs[i], dlrec_last_error());
    CHECK_EQ(st, DLREC_ERR_CORRUPT);
    CHECK(strstr(dlrec_last_error(), "vocab.bin") != NULL);
  }
  /* Truncated. */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(test_write_file(test_path("bad/vocab.bin"), v, n - 8) == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "truncated");
  free(v);
  /* vocab.bin of another fit. */
  o.min_count = 2;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("other"), &o, NULL));
  copy_state(test_path("good"), test_path("bad"));
  size_t m = 0;
  char *ov = read_all(test_path("other/vocab.bin"), &m);
  CHECK(ov != NULL);
  CHECK(test_write_file(test_path("bad/vocab.bin"), ov, m) == 0);
  free(ov);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "different fits");
  /* etl.json: syntax, version, unknown field, inconsistent numbers. */
  char jp[2048];
  snprintf(jp, sizeof jp, "%s", test_path("bad/etl.json"));
  /* Each edit is sealed with a fresh checksum, so that it reaches the check
   * behind the checksum that it is about. */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_sealed(jp, "\"rows\":", "\"rows\"::") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_PARSE, "etl.json:");
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_sealed(jp, "\"version\":\t2", "\"version\":\t3") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_VERSION, "version 3");
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_sealed(jp, "\"standardize\"", "\"standardise\"") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_INVALID, "standardise");
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_sealed(jp, "\"size\":\t8", "\"size\":\t9") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_INVALID, "inconsistent");
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_sealed(jp, "\"rows\":\t12", "\"rows\":\t13") == 0);
  CHECK(load_status(test_path("bad")) != DLREC_OK);
  CHECK_ERR(load_status(test_path("nowhere")), DLREC_ERR_IO, "etl.json");
}

TEST(state_checksum_refuses_any_flipped_bit) {
  const char *in = small_input();
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  o.standardize = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("good"), &o, NULL));
  CHECK_OK(load_status(test_path("good")));
  char jp[2048];
  snprintf(jp, sizeof jp, "%s", test_path("bad/etl.json"));
  size_t n;
  char *j = read_all(test_path("good/etl.json"), &n);
  CHECK(j != NULL);
  /* The issue's case: one bit of a "mean" digit, still a valid number (a
   * digit xor 1 is a digit), changed every standardized value silently. */
  char *mean = strstr(j, "\"mean\":\t3.");
  CHECK(mean != NULL);
  size_t at = (size_t)(mean - j) + strlen("\"mean\":\t3.") + 2;
  copy_state(test_path("good"), test_path("bad"));
  j[at] ^= 0x01;
  CHECK(test_write_file(jp, j, n) == 0);
  j[at] ^= 0x01;
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "etl.json: checksum mismatch");
  CHECK(strstr(dlrec_last_error(), "etl fit") != NULL);
  /* A flipped bit anywhere (whitespace, names, the checksum itself) is refused. */
  for (size_t i = 0; i < n; i += 7) {
    for (int bit = 0; bit < 8; bit += 3) {
      j[i] ^= (char)(1 << bit);
      unlink(jp); /* a new file: truncating one (ext4) waits for its old blocks */
      CHECK(test_write_file(jp, j, n) == 0);
      j[i] ^= (char)(1 << bit);
      dlrec_status st = load_status(test_path("bad"));
      if (st == DLREC_OK) test_fail(__FILE__, __LINE__, "byte %zu bit %d: accepted", i, bit);
      CHECK(st != DLREC_OK);
    }
  }
  /* The copy a checkpoint makes is the same bytes: it loads. */
  CHECK(test_write_file(jp, j, n) == 0);
  CHECK_OK(load_status(test_path("bad")));
  free(j);
  /* A state of version 1 (no checksum) is refused with what to do. */
  CHECK(edit_file(jp, "\"version\":\t2", "\"version\":\t1") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_VERSION, "version 1");
  CHECK(strstr(dlrec_last_error(), "etl fit") != NULL);
  /* Without the member. */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(edit_file(jp, "\"state_crc32c\"", "\"state_crc32x\"") == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_INVALID, "state_crc32c");
}

/* Recomputes vocab.bin's two CRCs and etl.json's record of it, and reseals
 * etl.json, as a careful forger would: only the semantic checks are left. */
static int reseal_vocab(const char *dir) {
  char vp[2048], jp[2048];
  snprintf(vp, sizeof vp, "%s/vocab.bin", dir);
  snprintf(jp, sizeof jp, "%s/etl.json", dir);
  size_t n;
  char *v = read_all(vp, &n);
  if (!v || n < 32) return -1;
  uint32_t body = dlrec_crc32c(0, v + 32, n - 32);
  memcpy(v + 24, &body, 4);
  uint32_t head = dlrec_crc32c(0, v, 28);
  memcpy(v + 28, &head, 4);
  int rc = test_write_file(vp, v, n);
  free(v);
  char *j = read_all(jp, &n);
  char *p = j ? strstr(j, "\"crc32c\":\t") : NULL;
  if (rc || !p) {
    free(j);
    return -1;
  }
  p += strlen("\"crc32c\":\t");
  char *e = p;
  while (*e >= '0' && *e <= '9') e++;
  char *t = malloc(n + 16);
  int k = snprintf(t, n + 16, "%.*s%u%s", (int)(p - j), j, body, e);
  rc = test_write_file(jp, t, (size_t)k);
  free(j);
  free(t);
  return rc ? rc : seal_json(jp);
}

TEST(vocab_order_is_checked_behind_the_checksums) {
  const char *in = small_input();
  CHECK(in != NULL);
  dlrec_etl_fit_opts o = fit_opts();
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("good"), &o, NULL));
  /* C1, the first section: keys a, b (count 3 each), d (2), c, e, f0 (1). */
  size_t n;
  char *v = read_all(test_path("good/vocab.bin"), &n);
  CHECK(v != NULL);
  const size_t keys = 32 + 16, counts = keys + 8 * 6;
  uint64_t k[6], c[6];
  memcpy(k, v + keys, sizeof k);
  memcpy(c, v + counts, sizeof c);
  CHECK(k[0] == 0xa && k[1] == 0xb && k[2] == 0xd && c[0] == 3 && c[1] == 3 && c[2] == 2);
  /* Resealed untouched: still loads (the forger's tools work). */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(reseal_vocab(test_path("bad")) == 0);
  CHECK_OK(load_status(test_path("bad")));
  /* Equal counts, keys out of order (b before a). */
  uint64_t t = k[0];
  memcpy(v + keys, &k[1], 8);
  memcpy(v + keys + 8, &t, 8);
  CHECK(test_write_file(test_path("bad/vocab.bin"), v, n) == 0);
  CHECK(reseal_vocab(test_path("bad")) == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "column 'C1': entry 1 is out of order");
  /* Counts rising (d:2 before b:3), keys and counts swapped together. */
  memcpy(v + keys, k, sizeof k);
  memcpy(v + keys + 8, &k[2], 8);
  memcpy(v + keys + 16, &k[1], 8);
  memcpy(v + counts + 8, &c[2], 8);
  memcpy(v + counts + 16, &c[1], 8);
  copy_state(test_path("good"), test_path("bad"));
  CHECK(test_write_file(test_path("bad/vocab.bin"), v, n) == 0);
  CHECK(reseal_vocab(test_path("bad")) == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "column 'C1': entry 2 is out of order");
  free(v);
}

/* A state's derived columns are checked like its others: a resealed
 * etl.json whose operators were edited, and target statistics that do not
 * add up behind resealed checksums, are refused naming the column. */
TEST(derived_columns_of_a_damaged_state_are_refused) {
  const char *in = keep(test_path("d.tsv"));
  CHECK_EQ(synth(in, 2000, 3, 50), 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.workflow = "{\"cross\": [{\"columns\": [\"C1\", \"C2\"], \"buckets\": 9}],"
               " \"bucketize\": [{\"column\": \"I1\", \"boundaries\": [1, 10, 100]}],"
               " \"count\": [{\"column\": \"C6\"}], \"target\": [{\"column\": \"C7\"}]}";
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("good"), &o, NULL));
  CHECK_OK(load_status(test_path("good")));
  static const struct {
    const char *from, *to, *error;
  } edits[] = {
      {"\"kind\":\t\"count\"", "\"kind\":\t\"cross\"", "kind 'cross' is not one of a dense"},
      {"\"column\":\t\"C6\"", "\"column\":\t\"C99\"", "'column' is not a one-hot categorical input column"},
      {"\"column\":\t\"I1\"", "\"column\":\t\"C1\"", "'column' is not a dense input column"},
      {"\"columns\":\t[\"C1\", \"C2\"]", "\"columns\":\t[\"C1\"]", "'columns' must list 2 to 8"},
      {"\"folds\":\t5", "\"folds\":\t4", "its target statistics do not match etl.json"},
      {"\"boundaries\":\t[1, 10, 100]", "\"boundaries\":\t[10, 1, 100]", "increasing order"},
      {"\"smoothing\":\t20", "\"smoothing\":\t0", "smoothing above 0"},
      {"\"encoding\":\t\"hashed\"", "\"encoding\":\t\"vocab\"", "inconsistent sizes"},
  };
  char jp[2048], vp[2048];
  snprintf(jp, sizeof jp, "%s", test_path("bad/etl.json"));
  snprintf(vp, sizeof vp, "%s", test_path("bad/vocab.bin"));
  for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
    copy_state(test_path("good"), test_path("bad"));
    CHECK(edit_sealed(jp, edits[i].from, edits[i].to) == 0);
    dlrec_status st = load_status(test_path("bad"));
    CHECK(st == DLREC_ERR_INVALID || st == DLREC_ERR_CORRUPT);
    if (!strstr(dlrec_last_error(), edits[i].error))
      test_fail(__FILE__, __LINE__, "edit %zu: '%s' does not say '%s'", i, dlrec_last_error(), edits[i].error);
  }
  /* The target section is last: its last pair is (rows, positives) of the
   * last fold's last group. */
  size_t n;
  char *v = read_all(test_path("good/vocab.bin"), &n);
  CHECK(v != NULL && n > 64);
  uint64_t rows, pos;
  memcpy(&rows, v + n - 16, 8);
  memcpy(&pos, v + n - 8, 8);
  uint64_t more = rows + 1;
  memcpy(v + n - 8, &more, 8); /* more positives than rows */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(test_write_file(vp, v, n) == 0);
  CHECK(reseal_vocab(test_path("bad")) == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "'C7_target': more positives than rows");
  memcpy(v + n - 8, &pos, 8);
  memcpy(v + n - 16, &more, 8); /* one row too many */
  copy_state(test_path("good"), test_path("bad"));
  CHECK(test_write_file(vp, v, n) == 0);
  CHECK(reseal_vocab(test_path("bad")) == 0);
  CHECK_ERR(load_status(test_path("bad")), DLREC_ERR_CORRUPT, "rows and");
  free(v);
}

/* ---- the CLI ---- */

TEST(cli_help_and_usage_errors) {
  char *out = NULL;
  CHECK_EQ(test_run_cli(&out, "etl --help"), 0);
  CHECK(strstr(out, "dlrec etl fit") && strstr(out, "dlrec etl apply"));
  free(out);
  CHECK_EQ(test_run_cli(&out, "etl fit --help"), 0);
  CHECK(strstr(out, "--min-count") && strstr(out, "--schema"));
  free(out);
  CHECK_EQ(test_run_cli(&out, "etl apply --help"), 0);
  CHECK(strstr(out, "--valid-fraction"));
  free(out);
  struct {
    const char *args, *want;
  } bad[] = {
      {"etl", "usage"},
      {"etl frob", "unknown subcommand 'frob'"},
      {"etl fit --out x", "--input is required"},
      {"etl fit --input a", "--out is required"},
      {"etl fit --input a --out x --min-count x", "--min-count"},
      {"etl fit --input a --out x --min-count 0", "--min-count"},
      {"etl fit --input a --out x --bogus", "unknown option '--bogus'"},
      {"etl fit --input a --out x --format tsv", "--format"},
      {"etl fit --input a --out x --format csv", "--format csv needs --schema"},
      {"etl fit --input a --out x --dense-transform sqrt", "--dense-transform"},
      {"etl fit --input a --out x --seed 3", "unknown option '--seed'"},
      {"etl apply --input a --out x", "--etl is required"},
      {"etl apply --etl e --input a --out x --valid-fraction 0.1", "go together"},
      {"etl apply --etl e --input a --out x --valid-fraction 1.5 --valid-out v", "--valid-fraction"},
      {"etl apply --etl e --input a --out x --min-count 3", "unknown option '--min-count'"},
      {"etl apply --etl e --input a --out x --memory-mb 3", "unknown option '--memory-mb'"},
      {"etl apply --etl e --input a --out x --target-encoding half", "--target-encoding: expected oof or full"},
      {"etl fit --input a --out x --target-encoding full", "unknown option '--target-encoding'"},
      {"etl fit --input a --out x --memory-mb 0", "--memory-mb"},
      {"etl fit --input a --out x --spill-dir d", "--spill-dir needs --memory-mb"},
      {"etl apply --etl e --input --out x", "--input needs at least one file"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = test_run_cli(&out, "%s", bad[i].args);
    if (rc != 2 || !strstr(out, bad[i].want))
      test_fail(__FILE__, __LINE__, "'%s': exit %d, output: %s", bad[i].args, rc, out);
    free(out);
    CHECK_EQ(rc, 2);
  }
  /* Failures exit 1 with the error. */
  CHECK_EQ(test_run_cli(&out, "etl fit --input '%s' --out '%s'", test_path("none.tsv"), test_path("x")), 1);
  CHECK(strstr(out, "none.tsv: No such file"));
  free(out);
  CHECK_EQ(test_run_cli(&out, "etl apply --etl '%s' --input a --out b", test_path("none")), 1);
  CHECK(strstr(out, "etl.json"));
  free(out);
}

/* -q and -v before the command, as git takes them. */
TEST(cli_global_options_before_the_command) {
  const char *in = small_input();
  CHECK(in != NULL);
  char *out = NULL;
  CHECK_EQ(test_run_cli(&out, "etl fit --input '%s' --out '%s'", in, test_path("a")), 0);
  CHECK(strstr(out, "etl fit: 12 rows") != NULL); /* the summary, without -q */
  free(out);
  CHECK_EQ(test_run_cli(&out, "-q etl fit --input '%s' --out '%s'", in, test_path("b")), 0);
  CHECK_STR(out, ""); /* quiet: no summary */
  free(out);
  CHECK(same_file(test_path("a/vocab.bin"), test_path("b/vocab.bin")));
  CHECK_EQ(test_run_cli(&out, "--quiet -v etl apply --etl '%s' --input '%s' --out '%s'", test_path("b"), in,
                        test_path("o.dlr")),
           0);
  CHECK(strstr(out, "etl apply: 12 rows") != NULL); /* -v after -q: verbose again */
  free(out);
  CHECK_EQ(test_run_cli(&out, "-q --version"), 0);
  CHECK(strncmp(out, "dlrec ", 6) == 0);
  free(out);
  /* Only options, or an unknown one, is still a usage error. */
  CHECK_EQ(test_run_cli(&out, "-q"), 2);
  CHECK(strstr(out, "usage: dlrec") != NULL);
  free(out);
  CHECK_EQ(test_run_cli(&out, "-x etl"), 2);
  CHECK(strstr(out, "unknown command '-x'") != NULL);
  free(out);
}

/* predict reads raw rows too: the same count of short rows, the same
 * --strict-fields, and a BOM dropped; stripped rows score as written-out ones. */
TEST(predict_counts_short_rows_and_drops_a_bom) {
  CHECK(synth(test_path("clicks.tsv"), 3000, 3, 200) == 0);
  char *out = NULL;
  const char *cfg =
      "{\"model\": {\"embedding_dim\": 4, \"bottom_mlp\": [8, 4], \"top_mlp\": [8, 1]},"
      " \"training\": {\"batch_size\": 256, \"epochs\": 1, \"threads\": 1, \"seed\": 1}}";
  /* One path per variable: the order in which arguments are evaluated is
   * unspecified, and test_path's buffers rotate. */
  const char *clicks = keep(test_path("clicks.tsv")), *etl = keep(test_path("etl")), *dlr = keep(test_path("t.dlr"));
  const char *cfg_path = keep(test_path("cfg.json")), *run = keep(test_path("run")), *bin = getenv("DLREC_BIN");
  CHECK(test_write_file(cfg_path, cfg, (size_t)-1) == 0);
  int rc = test_run_cli(&out,
                        "-q etl fit --input '%s' --out '%s' && '%s' -q etl apply --etl '%s' --input '%s' --out '%s' && "
                        "'%s' -q train --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 3",
                        clicks, etl, bin, etl, clicks, dlr, bin, cfg_path, dlr, etl, run);
  if (rc) fprintf(stderr, "%s\n", out);
  free(out);
  CHECK_EQ(rc, 0);
  /* Rows written out (40 fields), then with their empty tails stripped and a BOM. */
  const char *rows[][4] = {{"1", "3", "68fd1e64", "80e26c9b"}, {"0", "", "", "0c"}, {"1", "7", "05db9164", ""}};
  char full[4096] = "", stripped[4096] = "\xef\xbb\xbf", row[1024];
  for (int i = 0; i < 3; i++) {
    crow(row, sizeof row, rows[i][0], rows[i][1], rows[i][2], rows[i][3]);
    strcat(full, row);
    size_t k = strlen(row) - 1; /* before the newline */
    while (k && row[k - 1] == '\t') k--;
    row[k] = '\n', row[k + 1] = '\0';
    strcat(stripped, row);
  }
  const char *f = keep(test_path("full.tsv")), *sh = keep(test_path("short.tsv"));
  CHECK(test_write_file(f, full, (size_t)-1) == 0);
  CHECK(test_write_file(sh, stripped, (size_t)-1) == 0);
  CHECK_EQ(test_run_cli(&out, "predict --model '%s' --input '%s' --out '%s'", test_path("run"), f, test_path("f.txt")), 0);
  CHECK(strstr(out, "fewer fields") == NULL);
  free(out);
  CHECK_EQ(test_run_cli(&out, "predict --model '%s' --input '%s' --out '%s'", test_path("run"), sh, test_path("s.txt")), 0);
  char want[1400];
  snprintf(want, sizeof want, "predict: 3 rows had fewer fields than Criteo's 40 (39 unlabeled), the first at %s:1", sh);
  if (!strstr(out, want)) test_fail(__FILE__, __LINE__, "no '%s' in: %s", want, out);
  CHECK(strstr(out, want) != NULL);
  free(out);
  CHECK(same_file(test_path("f.txt"), test_path("s.txt")));
  CHECK_EQ(test_run_cli(&out, "predict --model '%s' --input '%s' --out '%s' --strict-fields", test_path("run"), sh,
                        test_path("x.txt")),
           1);
  CHECK(strstr(out, "short.tsv:1: 16 fields, expected 40 (--strict-fields)") != NULL);
  free(out);
}

/* ---- libSVM, libFM and multi-hot CSV columns ---- */

/* The ids of row r of sparse column c of a .dlr file, as "[a b c]". */
static const char *dlr_ids(const char *path, uint32_t c, uint32_t r) {
  static char buf[512];
  snprintf(buf, sizeof buf, "(unreadable)");
  dlrec_dlr *f;
  if (dlrec_dlr_open(&f, path) != DLREC_OK) return buf;
  dlrec_rowgroup rg;
  if (dlrec_dlr_verify(f, 0) == DLREC_OK && dlrec_dlr_row_group(f, 0, &rg) == DLREC_OK && r < rg.rows) {
    const dlrec_sparse_col *col = &dlrec_dlr_schema(f)->sparse[c];
    uint32_t b = col->hotness ? r * col->hotness : rg.offsets[c][r];
    uint32_t e = col->hotness ? b + col->hotness : rg.offsets[c][r + 1];
    size_t k = (size_t)snprintf(buf, sizeof buf, "[");
    /* A raw-keys file's ids are keys, two ids each: shown as 16 hex digits. */
    const int keys = dlrec_dlr_schema(f)->keys;
    for (uint32_t i = b; i < e && !keys; i++)
      k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%u", i > b ? " " : "", rg.ids[c][i]);
    for (uint32_t i = b; i + 1 < e && keys; i += 2)
      k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%016llx", i > b ? " " : "",
                            (unsigned long long)rg.ids[c][i] | (unsigned long long)rg.ids[c][i + 1] << 32);
    snprintf(buf + k, sizeof buf - k, "%s]", keys && (e - b) % 2 ? " (odd)" : "");
  }
  dlrec_dlr_close(f);
  return buf;
}

TEST(libsvm_fit_apply_inspect_end_to_end) {
  /* Index counts: 3 x4 (one row repeats it), 7 x2, 5, 12, 99 x1; so by
   * descending count, then ascending index: 3 -> 2, 7 -> 3, 5 -> 4, 12 -> 5,
   * 99 -> 6 (0 is missing, 1 out of vocabulary). Line 4 has only a label. */
  const char *text = "1 3:1 7:1 12:1\n"
                     "-1 7:1\n"
                     "+1 3:1 3:1   \r\n"
                     "0\n"
                     "1 5:1.0\t99:1 3:1\n";
  const char *in = keep(test_path("a.svm")), *etl = keep(test_path("etl")), *out = keep(test_path("a.dlr"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_LIBSVM;
  o.block_bytes = 16; /* several blocks, so the workers' maxima must merge */
  dlrec_etl_report rep;
  CHECK_OK(dlrec_etl_fit(&in, 1, etl, &o, &rep));
  CHECK_EQ_U64(rep.rows, 5);
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_dense, 0);
  CHECK_EQ(s->n_sparse, 1);
  CHECK_STR(s->sparse[0].name, "features");
  CHECK_EQ(s->sparse[0].hotness, 0);
  CHECK_EQ(s->sparse[0].max_hotness, 3);
  CHECK_EQ(s->sparse[0].pooling, DLREC_POOLING_SUM);
  CHECK_EQ_U64(dlrec_etl_ids_max(e), 3);
  dlrec_etl_cat_info ci;
  CHECK_OK(dlrec_etl_cat_info_get(e, 0, &ci));
  CHECK_EQ(ci.key_kind, DLREC_KEY_DEC);
  CHECK_EQ_U64(ci.kept, 5);
  CHECK_EQ_U64(ci.missing, 1);
  static const uint64_t want_keys[] = {3, 7, 5, 12, 99}, want_counts[] = {4, 2, 1, 1, 1};
  for (int i = 0; i < 5; i++) {
    CHECK_EQ_U64(ci.keys[i], want_keys[i]);
    CHECK_EQ_U64(ci.counts[i], want_counts[i]);
  }
  /* encode_line has room for one id a column: it refuses; the multi version works. */
  float label;
  uint32_t ids[3], nids[1], truncated = 9;
  CHECK_ERR(dlrec_etl_encode_line(e, "1 3:1", 5, 1, &label, NULL, ids), DLREC_ERR_INVALID,
            "dlrec_etl_encode_line_multi");
  CHECK_OK(dlrec_etl_encode_line_multi(e, "-1 99:1 42:1 3:1 7:1", 20, 1, &label, NULL, ids, nids, &truncated));
  CHECK_EQ(label, 0);
  CHECK_EQ(nids[0], 3); /* the fourth value is beyond the max hotness of 3 */
  CHECK_EQ(truncated, 1);
  CHECK(ids[0] == 6 && ids[1] == 1 && ids[2] == 2); /* 42 is out of vocabulary */
  dlrec_etl_apply_opts ao = apply_opts();
  ao.block_bytes = 16;
  ao.row_group_rows = 5;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, &rep));
  CHECK_EQ_U64(rep.rows, 5);
  CHECK_EQ_U64(rep.truncated_rows, 0);
  dlrec_etl_free(e);
  static const char *want_ids[] = {"[2 3 5]", "[3]", "[2 2]", "[0]", "[4 6 2]"};
  for (uint32_t r = 0; r < 5; r++) CHECK_STR(dlr_ids(out, 0, r), want_ids[r]);
  /* inspect shows the variable column and its rows. */
  char *cli = NULL;
  int rc = test_run_cli(&cli, "inspect '%s' --head 5", out);
  CHECK_EQ(rc, 0);
  CHECK(strstr(cli, "variable, max 3") != NULL);
  CHECK(strstr(cli, "row 2: label 1 | | features [2 2]") != NULL);
  CHECK(strstr(cli, "verify    ok") != NULL);
  free(cli);
}

TEST(libsvm_bad_rows_stop_or_are_skipped) {
  const char *text = "1 3:1\n"
                     "1 3\n"
                     "2 3:1\n"
                     "0 -4:1\n"
                     "0 4:0.5\n"
                     "1 4:1\n";
  const char *in = keep(test_path("bad.svm"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit --format libsvm --input '%s' --out '%s'", in, test_path("etl"));
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "bad.svm:2: field 2 (features): item is not idx:val: '3'") != NULL);
  free(out);
  rc = test_run_cli(&out, "etl fit --format libsvm --input '%s' --out '%s' --skip-bad-rows 4", in, test_path("etl"));
  CHECK_EQ(rc, 0);
  static const char *want[] = {"bad.svm:3: field 1 (label): label is not 0, 1, -1 or +1: '2'",
                               "bad.svm:4: field 2 (features): index is not a non-negative integer: '-4:1'",
                               "bad.svm:5: field 2 (features): value is not 1", "skipped 4 bad rows in all"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (!strstr(out, want[i])) test_fail(__FILE__, __LINE__, "missing '%s' in:\n%s", want[i], out);
    CHECK(strstr(out, want[i]) != NULL);
  }
  free(out);
  rc = test_run_cli(&out, "etl apply --etl '%s' --input '%s' --out '%s' --skip-bad-rows 3", test_path("etl"), in,
                    test_path("o.dlr"));
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "bad.svm:5: field 2 (features): value is not 1") != NULL);
  CHECK(strstr(out, "(bad row 4; --skip-bad-rows allows 3)") != NULL);
  free(out);
  /* The options that need their format. */
  rc = test_run_cli(&out, "etl fit --format libfm --input '%s' --out '%s'", in, test_path("etl2"));
  CHECK_EQ(rc, 2);
  CHECK(strstr(out, "--format libfm needs --fields N") != NULL);
  free(out);
  rc = test_run_cli(&out, "etl fit --input '%s' --out '%s' --max-hotness 3", in, test_path("etl2"));
  CHECK_EQ(rc, 1);
  CHECK(strstr(out, "--max-hotness and --pooling are for --format libsvm and libfm") != NULL);
  free(out);
}

TEST(libfm_one_hot_fields_and_max_hotness) {
  /* Fields 0 and 2 appear once a row: one-hot columns, like Criteo's. Field 1
   * appears twice in row 2, so f1 is multi-hot with max hotness 2. */
  const char *text = "1 0:10:1 1:20:1 2:30:1\n"
                     "0 2:31:1 0:11:1 1:20:1 1:21:1\n"
                     "1 0:10:1\n";
  const char *in = keep(test_path("a.fm")), *etl = keep(test_path("etl")), *out = keep(test_path("a.dlr"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  char *cli = NULL;
  int rc = test_run_cli(&cli, "etl fit --format libfm --fields 3 --pooling mean --input '%s' --out '%s'", in, etl);
  CHECK_EQ(rc, 0);
  free(cli);
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_sparse, 3);
  CHECK_STR(s->sparse[1].name, "f1");
  CHECK_EQ(s->sparse[0].hotness, 1);
  CHECK_EQ(s->sparse[1].hotness, 0);
  CHECK_EQ(s->sparse[1].max_hotness, 2);
  CHECK_EQ(s->sparse[2].hotness, 1);
  CHECK_EQ(s->sparse[1].pooling, DLREC_POOLING_MEAN);
  /* f0: 10 x2 -> 2, 11 -> 3 (size 4); f1: 20 x2 -> 2, 21 -> 3 (ids from 4);
   * f2: 30 -> 2, 31 -> 3 (ids from 8); row 3 misses f1 and f2. */
  dlrec_etl_apply_opts ao = apply_opts();
  dlrec_etl_report rep;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, &rep));
  dlrec_etl_free(e);
  static const char *want[3][3] = {{"[2]", "[6]", "[10]"}, {"[3]", "[6 7]", "[11]"}, {"[2]", "[4]", "[8]"}};
  for (uint32_t r = 0; r < 3; r++)
    for (uint32_t c = 0; c < 3; c++) CHECK_STR(dlr_ids(out, c, r), want[r][c]);
  /* With --max-hotness 1 every column is one-hot: row 2 keeps its first f1
   * value, and both fit and apply count the row. */
  rc = test_run_cli(&cli, "etl fit --format libfm --fields 3 --max-hotness 1 --input '%s' --out '%s'", in, etl);
  CHECK_EQ(rc, 0);
  CHECK(strstr(cli, "1 rows had more values in a multi-hot field than its max hotness") != NULL);
  free(cli);
  CHECK_OK(dlrec_etl_load(&e, etl));
  CHECK_EQ(dlrec_etl_schema(e)->sparse[1].hotness, 1);
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, &rep));
  CHECK_EQ_U64(rep.truncated_rows, 1);
  dlrec_etl_free(e);
  CHECK_STR(dlr_ids(out, 1, 1), "[6]"); /* 20 (f1's only kept value; 21 was never counted) */
  /* A field beyond --fields is a bad row naming it. */
  CHECK(test_write_file(in, "1 0:10:1 3:1:1\n", (size_t)-1) == 0);
  rc = test_run_cli(&cli, "etl apply --etl '%s' --input '%s' --out '%s'", etl, in, out);
  CHECK_EQ(rc, 1);
  CHECK(strstr(cli, "a.fm:1: field 3: field 3 is not below --fields 3: '3:1:1'") != NULL);
  free(cli);
}

TEST(csv_multi_hot_column_with_mean_pooling_and_max) {
  /* genres values: Drama x4, Comedy x2, War x1 (the fourth value of row 4 is
   * beyond max 3 and is neither counted nor encoded); "" and "|" are missing;
   * empty values between separators are skipped. */
  const char *text = "movie,genres,y\n"
                     "m1,Drama|Comedy,1\n"
                     "m2,,0\n"
                     "m3,\"Drama||War\",1\n"
                     "m1,Drama|Comedy|Drama|Noir,0\n"
                     "m4,|,1\n";
  const char *in = keep(test_path("movies.csv")), *etl = keep(test_path("etl")), *out = keep(test_path("m.dlr"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=y;cat=movie,genres;multi=genres:|:mean:3";
  dlrec_etl_report rep;
  CHECK_OK(dlrec_etl_fit(&in, 1, etl, &o, &rep));
  CHECK_EQ_U64(rep.truncated_rows, 1);
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->sparse[0].hotness, 1);
  CHECK_EQ(s->sparse[1].hotness, 0);
  CHECK_EQ(s->sparse[1].max_hotness, 3);
  CHECK_EQ(s->sparse[1].pooling, DLREC_POOLING_MEAN);
  CHECK_EQ_U64(dlrec_etl_ids_max(e), 4);
  dlrec_etl_cat_info g;
  CHECK_OK(dlrec_etl_cat_info_get(e, 1, &g));
  CHECK_EQ_U64(g.kept, 3);
  CHECK_EQ_U64(g.missing, 2);
  uint64_t salt = dlrec_cat_salt("genres");
  CHECK_EQ_U64(g.keys[0], dlrec_hash_bytes("Drama", 5, salt));
  CHECK_EQ_U64(g.counts[0], 4);
  CHECK_EQ_U64(g.keys[1], dlrec_hash_bytes("Comedy", 6, salt));
  CHECK_EQ_U64(g.counts[1], 2);
  uint32_t gb = (uint32_t)g.id_begin;
  dlrec_etl_apply_opts ao = apply_opts();
  ao.block_bytes = 8;
  ao.row_group_rows = 5;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, &rep));
  CHECK_EQ_U64(rep.truncated_rows, 1);
  char want[5][64];
  snprintf(want[0], 64, "[%u %u]", gb + 2, gb + 3);
  snprintf(want[1], 64, "[%u]", gb);
  snprintf(want[2], 64, "[%u %u]", gb + 2, gb + 4);
  snprintf(want[3], 64, "[%u %u %u]", gb + 2, gb + 3, gb + 2);
  snprintf(want[4], 64, "[%u]", gb);
  for (uint32_t r = 0; r < 5; r++) CHECK_STR(dlr_ids(out, 1, r), want[r]);
  /* A served line encodes as apply did. */
  float label;
  uint32_t ids[4], nids[2];
  const char *line = "m1,Drama|Comedy|Drama|Noir,0";
  CHECK_OK(dlrec_etl_encode_line_multi(e, line, strlen(line), 1, &label, NULL, ids, nids, NULL));
  CHECK(nids[0] == 1 && nids[1] == 3 && ids[1] == gb + 2 && ids[2] == gb + 3 && ids[3] == gb + 2);
  uint32_t one;
  CHECK_ERR(dlrec_etl_encode_cat(e, 1, "Drama|War", 9, &one), DLREC_ERR_INVALID, "'genres' is multi-hot");
  CHECK_OK(dlrec_etl_encode_cat(e, 0, "m1", 2, &one)); /* one-hot columns still encode alone */
  dlrec_etl_free(e);
  /* etl.json records the column, and a state whose multi= disagrees with its SPEC is refused. */
  char *json = read_all(test_path("etl/etl.json"), NULL);
  CHECK(json != NULL);
  int has = strstr(json, "\"multi\":\t\"|\"") && strstr(json, "\"pooling\":\t\"mean\"") &&
            strstr(json, "\"max_hotness\":\t3");
  free(json);
  CHECK(has);
  /* The state does not depend on threads or blocks (the workers' maxima and
   * counts merge). */
  o.threads = 1;
  o.block_bytes = 0;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl1"), &o, NULL));
  CHECK(same_file(test_path("etl/etl.json"), test_path("etl1/etl.json")));
  CHECK(same_file(test_path("etl/vocab.bin"), test_path("etl1/vocab.bin")));
  /* A multi-hot column's counts add up to its values. */
  CHECK(edit_sealed(test_path("etl1/etl.json"), "\"values\":\t7", "\"values\":\t8") == 0);
  CHECK_ERR(load_status(test_path("etl1")), DLREC_ERR_CORRUPT, "counts add up to 7 values, etl.json says 8");
  CHECK(edit_sealed(test_path("etl/etl.json"), "multi=genres:|:mean:3", "multi=movie:|:mean:3") == 0);
  CHECK_ERR(load_status(etl), DLREC_ERR_INVALID, "'multi' does not match the input format or SPEC");
}

/* ---- raw keys (fit --raw-keys) ---- */

/* Column c's raw key for text s as the docs state it, computed here:
 * mix64(key + (c + 1) * 0x9e3779b97f4a7c15), the empty field's key all ones. */
static uint64_t want_raw_key(dlrec_key_kind kind, uint64_t salt, uint32_t c, const char *s) {
  uint64_t key = UINT64_MAX;
  if (*s && dlrec_cat_key(kind, salt, s, strlen(s), &key)) return 0;
  return dlrec_mix64(key + (uint64_t)(c + 1) * 0x9e3779b97f4a7c15ull);
}

/* No vocabulary: every value encodes to its raw key, as two ids, in apply,
 * in the encoders a server uses and in the .dlr header's keys flag; the
 * state says so and loads back the same; the options that shape
 * vocabularies are refused with it. */
TEST(raw_keys_encode_each_value_to_its_column_mixed_key) {
  const char *in = small_input(), *etl = keep(test_path("etl")), *out = keep(test_path("k.dlr"));
  dlrec_etl_fit_opts o = fit_opts();
  o.raw_keys = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, etl, &o, NULL));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK(s->keys && s->table_rows == 1ull << 32);
  CHECK(s->sparse[0].hotness == 2 && s->sparse[0].id_begin == 0 && s->sparse[0].id_end == 1ull << 32);
  CHECK_EQ_U64(dlrec_etl_ids_max(e), 52);
  dlrec_etl_cat_info g;
  CHECK_OK(dlrec_etl_cat_info_get(e, 0, &g));
  CHECK_EQ_U64(g.kept, 0);
  CHECK_EQ_U64(g.missing, 1);
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, NULL));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, out));
  CHECK(dlrec_dlr_schema(f)->keys);
  dlrec_dlr_close(f);
  /* C1 of rows 0 ("a"), 2 ("a"), 8 ("B" = "b") and 9 (missing); C2 of row 1 ("2"). */
  const char *texts[] = {"a", "", "a", "", "", "", "", "", "B", ""};
  for (uint32_t r = 0; r < 10; r++) {
    if (r != 0 && r != 2 && r != 8 && r != 9) continue;
    char want[64];
    snprintf(want, sizeof want, "[%016llx]", (unsigned long long)want_raw_key(DLREC_KEY_HEX, 0, 0, texts[r]));
    CHECK_STR(dlr_ids(out, 0, r), want);
  }
  char want[64];
  snprintf(want, sizeof want, "[%016llx]", (unsigned long long)want_raw_key(DLREC_KEY_HEX, 0, 1, "2"));
  CHECK_STR(dlr_ids(out, 1, 1), want);
  /* "a" in column 0 and in column 1: two keys. */
  CHECK(want_raw_key(DLREC_KEY_HEX, 0, 0, "a") != want_raw_key(DLREC_KEY_HEX, 0, 1, "a"));
  /* The encoders a server uses: two ids a value; one id cannot hold a key. */
  uint32_t ids[2], n_ids, one;
  CHECK_OK(dlrec_etl_encode_cat_multi(e, 0, "b", 1, ids, &n_ids, NULL));
  const uint64_t kb = want_raw_key(DLREC_KEY_HEX, 0, 0, "b");
  CHECK(n_ids == 2 && ids[0] == (uint32_t)kb && ids[1] == (uint32_t)(kb >> 32));
  CHECK_ERR(dlrec_etl_encode_cat(e, 0, "b", 1, &one), DLREC_ERR_INVALID, "holds raw keys");
  float label, dense[13];
  uint32_t all[52];
  char line[512];
  crow(line, sizeof line, "1", "5", "a", "1");
  CHECK_ERR(dlrec_etl_encode_line(e, line, strlen(line) - 1, 1, &label, dense, all), DLREC_ERR_INVALID,
            "encode_line_multi");
  dlrec_etl_free(e);
  /* The state records raw keys and reloads as it was written. */
  char *json = read_all(test_path("etl/etl.json"), NULL);
  CHECK(json && strstr(json, "\"raw_keys\":\ttrue"));
  free(json);
  o.threads = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl1"), &o, NULL));
  CHECK(same_file(test_path("etl/etl.json"), test_path("etl1/etl.json")));
  /* Vocabulary options do not go with it. */
  o.min_count = 2;
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("etl2"), &o, NULL), DLREC_ERR_INVALID, "--raw-keys keeps no vocabulary");
  o.min_count = 1;
  o.hash_buckets = 4;
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("etl2"), &o, NULL), DLREC_ERR_INVALID, "--raw-keys keeps no vocabulary");
}

/* A multi-hot CSV column of raw keys: each value's key, at most max values,
 * the missing key for an empty field. */
TEST(raw_keys_multi_hot_csv_column) {
  const char *text = "movie,genres,y\n"
                     "m1,Drama|Comedy,1\n"
                     "m2,,0\n"
                     "m1,Drama|Comedy|Drama|Noir,0\n";
  const char *in = keep(test_path("movies.csv")), *etl = keep(test_path("etl")), *out = keep(test_path("m.dlr"));
  CHECK(test_write_file(in, text, (size_t)-1) == 0);
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=y;cat=movie,genres;multi=genres:|:sum:3";
  o.raw_keys = 1;
  dlrec_etl_report rep;
  CHECK_OK(dlrec_etl_fit(&in, 1, etl, &o, &rep));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, etl));
  CHECK(dlrec_etl_schema(e)->sparse[1].max_hotness == 6 && dlrec_etl_schema(e)->sparse[1].hotness == 0);
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &in, 1, out, &ao, &rep));
  CHECK_EQ_U64(rep.truncated_rows, 1);
  const uint64_t salt = dlrec_cat_salt("genres");
  char want[3][128];
  snprintf(want[0], 128, "[%016llx %016llx]", (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, "Drama"),
           (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, "Comedy"));
  snprintf(want[1], 128, "[%016llx]", (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, ""));
  snprintf(want[2], 128, "[%016llx %016llx %016llx]", (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, "Drama"),
           (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, "Comedy"),
           (unsigned long long)want_raw_key(DLREC_KEY_HASH, salt, 1, "Drama"));
  for (uint32_t r = 0; r < 3; r++) CHECK_STR(dlr_ids(out, 1, r), want[r]);
  dlrec_etl_free(e);
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Column operators (etl fit --workflow) against a naive computation: a CSV
 * of random values with missing ones, column a filled by its median (an
 * even count of values) and clipped above, b filled by a constant and
 * clipped on both sides (its fill above the clip), c left alone; with the log transform and
 * standardize. The expected value of a row is transform(clip(x or fill)),
 * standardized by the mean and std of those values over all rows (the
 * filled ones included), each computed here in double from the text. Every
 * encoder agrees: apply's .dlr, encode_line (predict) and encode_dense (the
 * server), after the state's round trip through its files. */
TEST(workflow_fill_and_clip_match_a_naive_computation) {
  enum { ROWS = 1001, COLS = 3 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 77, 0);
  size_t cap = ROWS * 64 + 64, n = 0;
  char *csv = malloc(cap);
  static char cell[ROWS][COLS][32];
  n += (size_t)snprintf(csv + n, cap - n, "y,a,b,c,k\n");
  for (int i = 0; i < ROWS; i++) {
    for (int c = 0; c < COLS; c++) {
      /* About 20% missing; b's values around its clip bounds. */
      if (dlrec_rng_uniform(&r) < 0.2) cell[i][c][0] = 0;
      else snprintf(cell[i][c], 32, "%.4f", c == 1 ? dlrec_rng_uniform(&r) * 10 - 2 : dlrec_rng_uniform(&r) * 1000);
    }
    n += (size_t)snprintf(csv + n, cap - n, "%d,%.31s,%.31s,%.31s,k%d\n", i % 3 == 0, cell[i][0], cell[i][1],
                          cell[i][2], i % 7);
  }
  CHECK(test_write_file(test_path("w.csv"), csv, n) == 0);
  free(csv);
  const char *in = keep(test_path("w.csv"));
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=y;dense=a,b,c;cat=k";
  o.standardize = 1;
  o.workflow = "{\"dense\": {\"a\": {\"fill_missing\": \"median\", \"clip\": [null, 800]},"
               " \"b\": {\"fill_missing\": 9, \"clip\": [0, 6.5]}}}";
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl"), &o, NULL));
  /* The naive side. */
  double want[ROWS][COLS];
  for (int c = 0; c < COLS; c++) {
    double vals[ROWS], fill = 0, lo = -INFINITY, hi = INFINITY;
    int k = 0, has_fill = c < 2;
    if (c == 0) hi = 800;
    if (c == 1) lo = 0, hi = 6.5, fill = 9; /* above high: the fill is clipped too */
    for (int i = 0; i < ROWS; i++)
      if (cell[i][c][0]) {
        double x = strtod(cell[i][c], NULL);
        vals[k++] = x < lo ? lo : x > hi ? hi : x;
      }
    if (c == 0) {
      CHECK_EQ(k % 2, 0); /* the even case: the mean of the middle two */
      qsort(vals, (size_t)k, sizeof *vals, cmp_dbl);
      fill = (vals[k / 2 - 1] + vals[k / 2]) / 2;
    }
    double sum = 0, sq = 0;
    int m = 0;
    for (int i = 0; i < ROWS; i++) {
      double t;
      if (!cell[i][c][0] && !has_fill) {
        want[i][c] = NAN; /* missing: 0, not standardized */
        continue;
      }
      double x = cell[i][c][0] ? strtod(cell[i][c], NULL) : fill;
      x = x < lo ? lo : x > hi ? hi : x;
      t = log1p(x > 0 ? x : 0);
      want[i][c] = t;
      sum += t, sq += t * t, m++;
    }
    double mean = sum / m, sd = sqrt(sq / m - mean * mean);
    for (int i = 0; i < ROWS; i++) want[i][c] = isnan(want[i][c]) ? 0 : (want[i][c] - mean) / sd;
  }
  /* apply's rows. */
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl")));
  dlrec_etl_apply_opts ao = apply_opts();
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("w.dlr"), &ao, NULL));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, test_path("w.dlr")));
  dlrec_rowgroup rg;
  CHECK_OK(dlrec_dlr_row_group(f, 0, &rg));
  CHECK_EQ(rg.rows, ROWS);
  for (int i = 0; i < ROWS; i++)
    for (int c = 0; c < COLS; c++) CHECK_NEAR(rg.dense[(size_t)i * COLS + c], want[i][c], 1e-6, 1e-6);
  dlrec_dlr_close(f);
  /* encode_line (predict) and encode_dense (the server). */
  for (int i = 0; i < ROWS; i++) {
    char line[256];
    float label, dense[COLS], one;
    uint32_t ids[1];
    snprintf(line, sizeof line, "%d,%.31s,%.31s,%.31s,k%d", i % 3 == 0, cell[i][0], cell[i][1], cell[i][2], i % 7);
    CHECK_OK(dlrec_etl_encode_line(e, line, strlen(line), 1, &label, dense, ids));
    for (int c = 0; c < COLS; c++) {
      CHECK_NEAR(dense[c], want[i][c], 1e-6, 1e-6);
      CHECK_OK(dlrec_etl_encode_dense(e, (uint32_t)c, cell[i][c], strlen(cell[i][c]), &one));
      CHECK(one == dense[c]);
    }
  }
  dlrec_etl_free(e);
  /* An odd count: the middle value (of 7, 1, 4: 4), its encoding precomputed. */
  const char *small = "y,a,b,c,k\n1,7,,,x\n0,,,,x\n1,1,,,x\n0,4,,,x\n";
  CHECK(test_write_file(test_path("odd.csv"), small, (size_t)-1) == 0);
  const char *odd = keep(test_path("odd.csv"));
  o.standardize = 0;
  o.workflow = "{\"dense\": {\"a\": {\"fill_missing\": \"median\"}}}";
  CHECK_OK(dlrec_etl_fit(&odd, 1, test_path("etl_odd"), &o, NULL));
  CHECK_OK(dlrec_etl_load(&e, test_path("etl_odd")));
  float filled;
  CHECK_OK(dlrec_etl_encode_dense(e, 0, "", 0, &filled));
  CHECK_NEAR(filled, log1p(4.0), 1e-7, 1e-7);
  dlrec_etl_free(e);
  /* Refused, with the column and the operator named. */
  o.workflow = "{\"dense\": {\"k\": {\"clip\": [0, 1]}}}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "'k': is categorical");
  o.workflow = "{\"dense\": {\"zz\": {\"clip\": [0, 1]}}}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "no such dense column");
  o.workflow = "{\"dense\": {\"a\": {\"clip\": [3, 1]}}}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "low 3 is above high 1");
  o.workflow = "{\"dense\": {\"a\": {\"fill_missing\": \"mean\"}}}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "fill_missing");
  o.workflow = "{\"crosses\": []}";
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "crosses");
}

/* Derived columns (the workflow's cross, bucketize, count and target) on CSV
 * rows of two dense and three categorical columns, some fields missing. The
 * encoders agree row by row: apply (with the full target encoding), encode_line
 * (predict) and a raw KServe request through the server's rows; the state
 * does not depend on threads; the out-of-fold encoding of apply differs from
 * the full one; a derived column has no field of its own. tests/etl_ops
 * checks every value against a NumPy re-implementation. */
TEST(derived_columns_encode_alike_in_apply_predict_and_the_server) {
  enum { ROWS = 600 };
  static char a[ROWS][24], b[ROWS][24], k[ROWS][3][8];
  static int y[ROWS];
  dlrec_rng r;
  dlrec_rng_seed(&r, 5, 0);
  test_buf csv = {0};
  test_buf_printf(&csv, "y,a,b,k1,k2,k3\n");
  for (int i = 0; i < ROWS; i++) {
    y[i] = dlrec_rng_uniform(&r) < 0.3;
    if (dlrec_rng_uniform(&r) < 0.1) a[i][0] = 0;
    else snprintf(a[i], sizeof a[i], "%d", (int)(dlrec_rng_uniform(&r) * 100));
    snprintf(b[i], sizeof b[i], "%.3f", dlrec_rng_uniform(&r) * 10 - 1);
    for (int c = 0; c < 3; c++) {
      if (dlrec_rng_uniform(&r) < 0.08) k[i][c][0] = 0;
      else snprintf(k[i][c], sizeof k[i][c], "v%d", (int)(dlrec_rng_uniform(&r) * (c == 2 ? 40 : 9)));
    }
    test_buf_printf(&csv, "%d,%s,%s,%s,%s,%s\n", y[i], a[i], b[i], k[i][0], k[i][1], k[i][2]);
  }
  CHECK(test_write_file(test_path("d.csv"), csv.p, csv.n) == 0);
  test_buf_free(&csv);
  const char *in = keep(test_path("d.csv"));
  dlrec_etl_fit_opts o = fit_opts();
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = "label=y;dense=a,b;cat=k1,k2,k3";
  o.min_count = 2;
  o.workflow = "{\"dense\": {\"a\": {\"fill_missing\": \"median\"}},"
               " \"cross\": [{\"columns\": [\"k1\", \"k2\"], \"buckets\": 5}],"
               " \"bucketize\": [{\"column\": \"a\", \"quantiles\": 4}, {\"column\": \"b\", \"boundaries\": [0, 2.5, 5]}],"
               " \"count\": [{\"column\": \"k3\"}],"
               " \"target\": [{\"column\": \"k1\", \"folds\": 3, \"smoothing\": 4}]}";
  o.threads = 1;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl1"), &o, NULL));
  o.threads = 2;
  o.block_bytes = 700;
  CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl2"), &o, NULL));
  CHECK(same_file(test_path("etl1/etl.json"), test_path("etl2/etl.json")));
  CHECK(same_file(test_path("etl1/vocab.bin"), test_path("etl2/vocab.bin")));
  dlrec_etl *e;
  CHECK_OK(dlrec_etl_load(&e, test_path("etl2")));
  const dlrec_schema *sc = dlrec_etl_schema(e);
  uint32_t nd, nc;
  dlrec_etl_input_columns(e, &nd, &nc);
  CHECK(nd == 2 && nc == 3 && sc->n_dense == 4 && sc->n_sparse == 6);
  CHECK_STR(sc->dense_names[2], "k3_count");
  CHECK_STR(sc->dense_names[3], "k1_target");
  CHECK_STR(sc->sparse[3].name, "k1_x_k2");
  CHECK_STR(sc->sparse[4].name, "a_bucket");
  CHECK_EQ(sc->sparse[3].id_end - sc->sparse[3].id_begin, 7); /* 5 buckets */
  CHECK_EQ(sc->sparse[5].id_end - sc->sparse[5].id_begin, 6);  /* b: 4 buckets, all seen */
  /* apply, full and out of fold. */
  dlrec_etl_apply_opts ao = apply_opts();
  ao.target_full = 1;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("full.dlr"), &ao, NULL));
  ao.target_full = 0;
  CHECK_OK(dlrec_etl_apply(e, &in, 1, test_path("oof.dlr"), &ao, NULL));
  dlrec_dlr *f, *g;
  dlrec_rowgroup rf, rg;
  CHECK_OK(dlrec_dlr_open(&f, test_path("full.dlr")));
  CHECK_OK(dlrec_dlr_open(&g, test_path("oof.dlr")));
  CHECK_OK(dlrec_dlr_row_group(f, 0, &rf));
  CHECK_OK(dlrec_dlr_row_group(g, 0, &rg));
  CHECK_EQ(rf.rows, ROWS);
  /* One raw request of every row: dense as BYTES (the text as is). */
  test_buf j = {0};
  test_buf_printf(&j, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[%d,2],\"data\":[", ROWS);
  for (int i = 0; i < ROWS; i++) test_buf_printf(&j, "%s\"%s\",\"%s\"", i ? "," : "", a[i], b[i]);
  test_buf_printf(&j, "]},{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,3],\"data\":[", ROWS);
  for (int i = 0; i < ROWS; i++) test_buf_printf(&j, "%s\"%s\",\"%s\",\"%s\"", i ? "," : "", k[i][0], k[i][1], k[i][2]);
  test_buf_printf(&j, "]}]}");
  dlrec_serve_rows *sr = NULL;
  dlrec_kserve_request *req = NULL;
  CHECK_OK(dlrec_serve_rows_new(&sr, sc, e));
  CHECK_OK(dlrec_kserve_parse_request(j.p, j.n, -1, NULL, &req));
  CHECK_OK(dlrec_serve_rows_add_request(sr, req, ROWS, NULL));
  dlrec_batch sb;
  dlrec_serve_rows_batch(sr, &sb);
  CHECK_EQ(sb.rows, ROWS);
  int oof_differs = 0;
  for (int i = 0; i < ROWS && !test_failed_now(); i++) {
    char line[128];
    float label, dense[4];
    uint32_t ids[6];
    snprintf(line, sizeof line, "%d,%.23s,%.23s,%.7s,%.7s,%.7s", y[i], a[i], b[i], k[i][0], k[i][1], k[i][2]);
    CHECK_OK(dlrec_etl_encode_line(e, line, strlen(line), 1, &label, dense, ids));
    for (int d = 0; d < 4; d++) {
      CHECK(dense[d] == rf.dense[(size_t)i * 4 + d]);
      CHECK(sb.dense[(size_t)i * 4 + d] == dense[d]);
      if (d < 3) CHECK(rg.dense[(size_t)i * 4 + d] == dense[d]);
    }
    oof_differs += rg.dense[(size_t)i * 4 + 3] != dense[3];
    for (int c = 0; c < 6; c++) {
      CHECK_EQ(rf.ids[c][i], ids[c]);
      CHECK_EQ(rg.ids[c][i], ids[c]);
      CHECK_EQ(sb.ids[c][sb.offsets[c][i]], ids[c]);
    }
  }
  CHECK(oof_differs > ROWS / 2);
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_free(sr);
  test_buf_free(&j);
  dlrec_dlr_close(f);
  dlrec_dlr_close(g);
  /* Operators compare by what they apply: the same workflow again is the
   * same; another smoothing, clip or boundaries are not. */
  dlrec_etl *e1;
  CHECK_OK(dlrec_etl_load(&e1, test_path("etl1")));
  CHECK_OK(dlrec_etl_same_operators(e, e1));
  dlrec_etl_free(e1);
  const char *wf = o.workflow;
  static const struct {
    const char *from, *to, *error;
  } other[] = {
      {"\"smoothing\": 4", "\"smoothing\": 5", "dense column 'k1_target': derived otherwise"},
      {"\"boundaries\": [0, 2.5, 5]", "\"boundaries\": [0, 2.5, 6]", "categorical column 'b_bucket': derived otherwise"},
      {"\"fill_missing\": \"median\"}", "\"fill_missing\": \"median\", \"clip\": [null, 90]}", "dense column 'a': another fill_missing or clip"},
  };
  for (size_t i = 0; i < sizeof other / sizeof *other; i++) {
    char w2[1024];
    const char *at = strstr(wf, other[i].from);
    CHECK(at != NULL);
    if (!at) break;
    snprintf(w2, sizeof w2, "%.*s%s%s", (int)(at - wf), wf, other[i].to, at + strlen(other[i].from));
    o.workflow = w2;
    CHECK_OK(dlrec_etl_fit(&in, 1, test_path("etl3"), &o, NULL));
    CHECK_OK(dlrec_etl_load(&e1, test_path("etl3")));
    CHECK_ERR(dlrec_etl_same_operators(e, e1), DLREC_ERR_INVALID, other[i].error);
    dlrec_etl_free(e1);
  }
  o.workflow = wf;
  /* A derived column has no field of its own. */
  float x;
  uint32_t id;
  CHECK_ERR(dlrec_etl_encode_dense(e, 2, "3", 1, &x), DLREC_ERR_INVALID, "'k3_count' is derived");
  CHECK_ERR(dlrec_etl_encode_cat(e, 4, "3", 1, &id), DLREC_ERR_INVALID, "'a_bucket' is derived");
  dlrec_etl_free(e);
  /* Workflows refused, naming the entry and the reason. */
  static const struct {
    const char *workflow, *error;
  } bad[] = {
      {"{\"cross\": [{\"columns\": [\"k1\"], \"buckets\": 5}]}", "cross[0]: 'columns' must list 2 to 8"},
      {"{\"cross\": [{\"columns\": [\"k1\", \"a\"], \"buckets\": 5}]}", "'a' is dense"},
      {"{\"cross\": [{\"columns\": [\"k1\", \"k2\"]}]}", "missing 'buckets'"},
      {"{\"cross\": [{\"columns\": [\"k1\", \"k2\"], \"buckets\": 0}]}", "'buckets' must be an integer"},
      {"{\"bucketize\": [{\"column\": \"k1\", \"quantiles\": 4}]}", "'k1' is categorical"},
      {"{\"bucketize\": [{\"column\": \"a\"}]}", "either 'boundaries' or 'quantiles'"},
      {"{\"bucketize\": [{\"column\": \"a\", \"boundaries\": [1, 1]}]}", "increasing order"},
      {"{\"bucketize\": [{\"column\": \"a\", \"quantiles\": 1}]}", "'quantiles' must be"},
      {"{\"count\": [{\"column\": \"zz\"}]}", "'zz' is not a column of the input"},
      {"{\"count\": [{\"column\": \"k3\", \"name\": \"a\"}]}", "a column named 'a' exists"},
      {"{\"count\": [{\"column\": \"k3\"}, {\"column\": \"k3\"}]}", "'k3_count' exists"},
      {"{\"target\": [{\"column\": \"k1\", \"folds\": 1}]}", "'folds' must be"},
      {"{\"target\": [{\"column\": \"k1\", \"smoothing\": 0}]}", "'smoothing' must be"},
      {"{\"target\": [{\"column\": \"k1\", \"fold\": 3}]}", "fold"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    o.workflow = bad[i].workflow;
    CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, bad[i].error);
  }
  o.workflow = "{\"target\": [{\"column\": \"k1\"}]}";
  o.schema_spec = "ignore=y;dense=a,b;cat=k1,k2,k3";
  o.has_label = 0;
  CHECK_ERR(dlrec_etl_fit(&in, 1, test_path("bad"), &o, NULL), DLREC_ERR_INVALID, "needs labels");
}

/* ---- the options table ---- */

/* The defaults of fit and apply come from the options table: the ones
 * dlrec_etl_fit_opts_default and dlrec_etl_apply_opts_default set by hand
 * before it, and every default it states reads. */
TEST(option_table_defaults) {
  dlrec_etl_fit_opts f;
  dlrec_etl_apply_opts a;
  dlrec_etl_fit_opts_default(&f);
  dlrec_etl_apply_opts_default(&a);
  CHECK_EQ(f.format, DLREC_FORMAT_CRITEO);
  CHECK(f.schema_spec == NULL && f.workflow == NULL && f.spill_dir == NULL && f.sources == NULL);
  CHECK_EQ(f.has_label, 1);
  CHECK_EQ_U64(f.min_count, 1);
  CHECK_EQ_U64(f.hash_buckets, 0);
  CHECK_EQ(f.dense_transform, DLREC_DENSE_LOG);
  CHECK(!f.standardize && !f.strict_fields && !f.raw_keys && !f.threads && !f.skip_bad_rows);
  CHECK_EQ_U64(f.max_line_bytes, DLREC_MAX_LINE_BYTES_DEFAULT);
  CHECK_EQ_U64(f.block_bytes, 0);
  CHECK(f.libfm_fields == 0 && f.max_hotness == 0 && f.memory_mb == 0);
  CHECK_EQ(f.pooling, DLREC_POOLING_SUM);
  CHECK_EQ(f.progress, 1);
  CHECK(!a.no_label && !a.per_input && !a.strict_fields && !a.threads && !a.target_full && !a.skip_bad_rows);
  CHECK(a.valid_fraction == 0 && a.valid_out == NULL && a.seed == 0 && a.sources == NULL);
  CHECK_EQ(a.row_group_rows, 65536);
  CHECK_EQ_U64(a.max_line_bytes, DLREC_MAX_LINE_BYTES_DEFAULT);
  CHECK_EQ_U64(a.block_bytes, 0);
  CHECK_EQ(a.progress, 1);
  for (const dlrec_option *o = dlrec_etl_options; o->key; o++) {
    CHECK(o->flag == NULL || !strncmp(o->flag, "--", 2));
    if (o->dflt && dlrec_option_from_text(o, o->dflt, o->key, &f, &a) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "%s: default '%s': %s", o->key, o->dflt, dlrec_last_error());
  }
}

/* docs/etl.md's option reference is the table's (`dlrec options etl`). */
TEST(option_reference_in_the_docs_is_current) {
  char *doc = NULL, *want = dlrec_etl_options_reference(), *out = NULL;
  size_t n = 0;
  CHECK(want != NULL);
  CHECK_OK(dlrec_read_file(test_source_path("docs/etl.md"), 1u << 22, &doc, &n));
  static const char begin[] = "<!-- options-reference: dlrec options etl -->\n", end[] = "<!-- end options-reference -->";
  const char *a = doc ? strstr(doc, begin) : NULL, *b = a ? strstr(a, end) : NULL;
  CHECK(a && b);
  if (a && b && ((size_t)(b - a) - strlen(begin) != strlen(want) || strncmp(a + strlen(begin), want, strlen(want))))
    test_fail(__FILE__, __LINE__, "docs/etl.md's option reference is out of date: regenerate it with "
              "`build/dlrec options etl` and paste it between the markers");
  /* The command prints the same. */
  CHECK_EQ(test_run_cli(&out, "options etl"), 0);
  CHECK_STR(out, want);
  free(out);
  free(doc);
  free(want);
}
