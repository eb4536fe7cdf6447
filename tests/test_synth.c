/* Synthetic click logs: format, determinism, statistics against Criteo's
 * published shapes and the exact Zipf law, the strength of the hidden signal,
 * atomic output and the CLI. The references here are computed independently
 * of src/data/synth.c: missing rates are the Criteo figures, Zipf
 * probabilities are summed term by term, AUCs are computed by sorting. */
#include <ctype.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "data/synth.h"
#include "test.h"

/* Criteo Kaggle's missing rates (the figures), I1..I13 then C1..C26. */
static const double want_missing[39] = {
    0.45,  0.0, 0.21,  0.22, 0.026, 0.22, 0.04, 0.0005, 0.04, 0.45,  0.04,  0.77, 0.22,  /* I */
    0.0,   0.0, 0.034, 0.034, 0.0,  0.121, 0.0, 0.0,    0.0,  0.0,   0.0,   0.034, 0.0,  /* C1..C13 */
    0.0,   0.0, 0.034, 0.0,  0.0,   0.44, 0.44, 0.034,  0.763, 0.0,  0.034, 0.44, 0.44,  /* C14..C26 */
};

/* ---- Helpers ---- */

typedef struct gen {
  uint32_t rows;
  char *text;
  size_t text_bytes;
  double *prob, *logit_first;
  uint8_t *label;
  uint64_t positives;
} gen;

static void gen_free(gen *g) {
  free(g->text);
  free(g->prob);
  free(g->logit_first);
  free(g->label);
  memset(g, 0, sizeof *g);
}

/* The first `rows` rows of a file of row seed `seed`: whole chunks, in order,
 * the last one cut short, as dlrec_synth_write lays them out. */
static dlrec_status gen_rows(const dlrec_synth_model *m, uint64_t seed, uint32_t rows, gen *g) {
  memset(g, 0, sizeof *g);
  g->rows = rows;
  g->text = malloc((size_t)rows * DLREC_SYNTH_MAX_ROW_BYTES + 1);
  g->prob = malloc(rows * sizeof *g->prob);
  g->logit_first = malloc(rows * sizeof *g->logit_first);
  g->label = malloc(rows);
  if (!g->text || !g->prob || !g->logit_first || !g->label) return DLREC_ERR_NOMEM;
  for (uint32_t done = 0, chunk = 0; done < rows; chunk++) {
    uint32_t n = rows - done < DLREC_SYNTH_CHUNK_ROWS ? rows - done : DLREC_SYNTH_CHUNK_ROWS;
    dlrec_synth_rows out = {.text = g->text + g->text_bytes,
                            .text_cap = (size_t)n * DLREC_SYNTH_MAX_ROW_BYTES,
                            .prob = g->prob + done,
                            .logit_first = g->logit_first + done,
                            .label = g->label + done};
    dlrec_status st = dlrec_synth_generate(m, seed, chunk, n, &out);
    if (st != DLREC_OK) return st;
    g->text_bytes += out.text_bytes;
    g->positives += out.positives;
    done += n;
  }
  g->text[g->text_bytes] = '\0';
  return DLREC_OK;
}

/* Splits one line (without its '\n') at tabs; returns the field count (at
 * most max) and the fields' starts and lengths. */
static int split_tabs(const char *line, size_t len, const char **f, size_t *flen, int max) {
  int n = 0;
  const char *p = line, *end = line + len;
  for (;;) {
    const char *t = memchr(p, '\t', (size_t)(end - p));
    if (n < max) {
      f[n] = p;
      flen[n] = (size_t)((t ? t : end) - p);
    }
    n++;
    if (!t) break;
    p = t + 1;
  }
  return n;
}

/* A Criteo integer: -?[0-9]+ without a leading zero (except "0" itself). */
static int is_int(const char *s, size_t n) {
  size_t i = 0;
  if (n && s[0] == '-') i = 1;
  if (i == n) return 0;
  if (s[i] == '0' && n - i > 1) return 0;
  for (; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

static int is_hex8(const char *s, size_t n) {
  if (n != 8) return 0;
  for (size_t i = 0; i < 8; i++)
    if (!isdigit((unsigned char)s[i]) && !(s[i] >= 'a' && s[i] <= 'f')) return 0;
  return 1;
}

/* Checks every line of a Criteo text: 40 fields, a 0/1 label, integers,
 * 8-digit lowercase hex; the text ends with '\n'. Returns the line count, or
 * -1 after printing the first bad line. When label is not NULL the labels
 * must match it. */
static long check_format(const char *text, size_t n, const uint8_t *label) {
  if (n == 0 || text[n - 1] != '\n') {
    fprintf(stderr, "text does not end with a newline\n");
    return -1;
  }
  long lines = 0;
  const char *p = text, *end = text + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *f[48];
    size_t fl[48];
    int nf = split_tabs(p, (size_t)(nl - p), f, fl, 48);
    int ok = nf == 40 && fl[0] == 1 && (f[0][0] == '0' || f[0][0] == '1');
    if (ok && label) ok = f[0][0] - '0' == label[lines];
    for (int i = 1; ok && i <= 13; i++) ok = fl[i] == 0 || is_int(f[i], fl[i]);
    for (int i = 14; ok && i < 40; i++) ok = fl[i] == 0 || is_hex8(f[i], fl[i]);
    if (!ok) {
      fprintf(stderr, "bad line %ld (%d fields): %.*s\n", lines + 1, nf, (int)(nl - p), p);
      return -1;
    }
    lines++;
    p = nl + 1;
  }
  return lines;
}

/* AUC by sorting: P(score of a random positive > that of a random negative),
 * ties counted as half. */
static const double *auc_scores;
static int auc_cmp(const void *a, const void *b) {
  double x = auc_scores[*(const uint32_t *)a], y = auc_scores[*(const uint32_t *)b];
  return (x > y) - (x < y);
}
static double auc(const double *score, const uint8_t *label, uint32_t n) {
  uint32_t *idx = malloc(n * sizeof *idx);
  if (!idx) return -1;
  for (uint32_t i = 0; i < n; i++) idx[i] = i;
  auc_scores = score;
  qsort(idx, n, sizeof *idx, auc_cmp);
  double rank_sum = 0, pos = 0;
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i;
    while (j < n && score[idx[j]] == score[idx[i]]) j++;
    double mid_rank = (i + 1 + j) / 2.0; /* ranks i+1..j share their mean */
    for (uint32_t k = i; k < j; k++)
      if (label[idx[k]]) rank_sum += mid_rank, pos++;
    i = j;
  }
  free(idx);
  double neg = n - pos;
  return (rank_sum - pos * (pos + 1) / 2) / (pos * neg);
}

static int cmp_u32_desc(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x < y) - (x > y);
}

/* Counts of the distinct strings of one categorical column, most frequent
 * first (a hash set of the 8-digit values; missing values are skipped).
 * Returns the number of distinct values, or -1 when out of memory. */
static long value_counts(const char *text, size_t n, int field, uint32_t **counts_out) {
  size_t cap = 1u << 20;
  uint64_t *keys = calloc(cap, sizeof *keys); /* value + 1, 0 = empty */
  uint32_t *counts = calloc(cap, sizeof *counts);
  if (!keys || !counts) {
    free(keys);
    free(counts);
    return -1;
  }
  long distinct = 0;
  const char *p = text, *end = text + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *f[40];
    size_t fl[40];
    split_tabs(p, (size_t)(nl - p), f, fl, 40);
    if (fl[field] == 8) {
      uint64_t v = strtoull(f[field], NULL, 16) + 1;
      size_t h = (size_t)((v * 0x9e3779b97f4a7c15ULL) >> 44) & (cap - 1);
      while (keys[h] && keys[h] != v) h = (h + 1) & (cap - 1);
      if (!keys[h]) keys[h] = v, distinct++;
      counts[h]++;
    }
    p = nl + 1;
  }
  long k = 0;
  for (size_t i = 0; i < cap; i++)
    if (keys[i]) counts[k++] = counts[i];
  free(keys);
  qsort(counts, (size_t)k, sizeof *counts, cmp_u32_desc);
  *counts_out = counts;
  return distinct;
}

/* ---- Format and the generator's contract ---- */

TEST(synth_format_in_memory) {
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(1, NULL, 0, &m));
  gen g;
  dlrec_status st = gen_rows(m, 5, 40000, &g);
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) gen_free(&g);
  CHECK_OK(st);
  long lines = check_format(g.text, g.text_bytes, g.label);
  gen_free(&g);
  CHECK_EQ(lines, 40000);
}

TEST(synth_generate_prefix_and_buffer_check) {
  /* Fewer rows of a chunk are a prefix of more rows of it; another chunk
   * number is another stream; a short text buffer is refused. */
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(3, NULL, 1000, &m));
  enum { N = 300 };
  char *a = malloc(N * DLREC_SYNTH_MAX_ROW_BYTES), *b = malloc(N * DLREC_SYNTH_MAX_ROW_BYTES);
  char pa[N * DLREC_SYNTH_PROB_BYTES], pb[N * DLREC_SYNTH_PROB_BYTES];
  dlrec_synth_rows ra = {.text = a, .text_cap = N * DLREC_SYNTH_MAX_ROW_BYTES, .prob_text = pa};
  dlrec_synth_rows rb = {.text = b, .text_cap = N * DLREC_SYNTH_MAX_ROW_BYTES, .prob_text = pb};
  int ok = a && b && dlrec_synth_generate(m, 9, 4, N, &ra) == DLREC_OK &&
           dlrec_synth_generate(m, 9, 4, N / 3, &rb) == DLREC_OK;
  int prefix = ok && rb.text_bytes < ra.text_bytes && !memcmp(a, b, rb.text_bytes) &&
               rb.prob_text_bytes == (size_t)(N / 3) * DLREC_SYNTH_PROB_BYTES &&
               !memcmp(pa, pb, rb.prob_text_bytes);
  int other = ok && dlrec_synth_generate(m, 9, 5, N / 3, &rb) == DLREC_OK && memcmp(a, b, rb.text_bytes) != 0;
  dlrec_synth_rows small = {.text = b, .text_cap = 10 * DLREC_SYNTH_MAX_ROW_BYTES - 1};
  dlrec_status st_small = dlrec_synth_generate(m, 9, 4, 10, &small);
  free(a);
  free(b);
  dlrec_synth_model_free(m);
  CHECK(ok);
  CHECK(prefix);
  CHECK(other);
  CHECK_EQ(st_small, DLREC_ERR_INVALID);
  CHECK(strstr(dlrec_last_error(), "too small") != NULL);
}

/* ---- Files: determinism, thread count, atomic replacement ---- */

static int files_equal(const char *x, const char *y) {
  char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  int eq = dlrec_read_file(x, (size_t)1 << 30, &a, &na) == DLREC_OK &&
           dlrec_read_file(y, (size_t)1 << 30, &b, &nb) == DLREC_OK && na == nb && !memcmp(a, b, na);
  free(a);
  free(b);
  return eq;
}

static dlrec_status write_file(const char *out, const char *probs, uint64_t rows, uint64_t seed, int threads,
                               dlrec_synth_stats *stats) {
  dlrec_synth_opts o = dlrec_synth_opts_default();
  o.rows = rows;
  o.seed = seed;
  o.threads = threads;
  o.out = out;
  o.probs = probs;
  o.max_cardinality = 100000;
  o.progress = 0;
  return dlrec_synth_write(&o, stats);
}

TEST(synth_files_deterministic_across_threads) {
  /* 2.5 chunks, so the last chunk is partial. */
  const uint64_t rows = DLREC_SYNTH_CHUNK_ROWS * 2 + DLREC_SYNTH_CHUNK_ROWS / 2;
  const char *a = test_path("a.tsv"), *b = test_path("b.tsv"), *c = test_path("c.tsv"), *d = test_path("d.tsv");
  const char *pa = test_path("a.probs"), *pb = test_path("b.probs");
  dlrec_synth_stats sa, sb;
  CHECK_OK(write_file(a, pa, rows, 11, 1, &sa));
  CHECK_OK(write_file(b, pb, rows, 11, 3, &sb));
  CHECK_OK(write_file(c, NULL, rows, 11, 2, NULL));
  CHECK_OK(write_file(d, NULL, rows, 12, 2, NULL));
  CHECK(files_equal(a, b));
  CHECK(files_equal(pa, pb));
  CHECK(files_equal(a, c));
  CHECK(!files_equal(a, d));
  CHECK_EQ_U64(sa.positives, sb.positives);
  CHECK(sa.auc == sb.auc && sa.mean_prob == sb.mean_prob);

  /* The file is the chunks of dlrec_synth_generate, in order, and the stats
   * describe it. */
  char *text = NULL, *probs = NULL;
  size_t n = 0, np = 0;
  CHECK_OK(dlrec_read_file(a, (size_t)1 << 30, &text, &n));
  dlrec_status st = dlrec_read_file(pa, (size_t)1 << 30, &probs, &np);
  dlrec_synth_model *m = NULL;
  if (st == DLREC_OK) st = dlrec_synth_model_new(1, NULL, 100000, &m);
  gen g = {0};
  if (st == DLREC_OK) st = gen_rows(m, 11, (uint32_t)rows, &g);
  dlrec_synth_model_free(m);
  int same = st == DLREC_OK && g.text_bytes == n && !memcmp(g.text, text, n);
  long lines = st == DLREC_OK ? check_format(text, n, g.label) : -1;
  /* Each probability line is the generator's value to 6 decimals. */
  int probs_ok = st == DLREC_OK && np == rows * DLREC_SYNTH_PROB_BYTES;
  for (uint64_t i = 0; probs_ok && i < rows; i++) {
    const char *line = probs + i * DLREC_SYNTH_PROB_BYTES;
    probs_ok = line[1] == '.' && line[8] == '\n' && fabs(strtod(line, NULL) - g.prob[i]) <= 5.1e-7;
  }
  uint64_t positives = g.positives;
  double exact_auc = st == DLREC_OK ? auc(g.prob, g.label, (uint32_t)rows) : 0, mean_p = 0, logloss = 0;
  for (uint64_t i = 0; st == DLREC_OK && i < rows; i++) {
    mean_p += g.prob[i] / (double)rows;
    logloss -= log(g.label[i] ? g.prob[i] : 1 - g.prob[i]) / (double)rows;
  }
  gen_free(&g);
  free(text);
  free(probs);
  CHECK_OK(st);
  CHECK(same);
  CHECK_EQ(lines, (long)rows);
  CHECK(probs_ok);
  CHECK_EQ_U64(sa.rows, rows);
  CHECK_EQ_U64(sa.bytes, n);
  CHECK_EQ_U64(sa.positives, positives);
  CHECK_NEAR(sa.auc, exact_auc, 1e-4, 0); /* the binned AUC of the summary */
  CHECK_NEAR(sa.mean_prob, mean_p, 1e-9, 0);
  CHECK_NEAR(sa.logloss, logloss, 1e-9, 0);
}

TEST(synth_replaces_atomically_and_cleans_up) {
  const char *out = test_path("x.tsv");
  char tmp[2048];
  snprintf(tmp, sizeof tmp, "%s.tmp", out);
  CHECK(test_write_file(out, "old\n", (size_t)-1) == 0);
  CHECK_OK(write_file(out, NULL, 100, 1, 2, NULL));
  struct stat st;
  CHECK(stat(out, &st) == 0 && st.st_size > 1000);
  CHECK(access(tmp, F_OK) != 0);

  /* A failure after the rows' temporary file was made (the probabilities
   * cannot be created) leaves the old file alone and no .tmp behind. */
  CHECK(test_write_file(out, "old\n", (size_t)-1) == 0);
  CHECK_ERR(write_file(out, "/nonexistent-dir/p.probs", 100, 1, 2, NULL), DLREC_ERR_IO, "/nonexistent-dir/p.probs");
  CHECK(stat(out, &st) == 0 && st.st_size == 4);
  CHECK(access(tmp, F_OK) != 0);

  /* Non-regular files are written directly. */
  CHECK_OK(write_file("/dev/null", NULL, 1000, 1, 2, NULL));
  CHECK(access("/dev/null.tmp", F_OK) != 0);
  CHECK_ERR(write_file(test_tmpdir(), NULL, 10, 1, 1, NULL), DLREC_ERR_IO, "is a directory");
}

TEST(synth_options_checked) {
  dlrec_synth_opts o = dlrec_synth_opts_default();
  o.out = test_path("y.tsv");
  CHECK_ERR(dlrec_synth_write(&o, NULL), DLREC_ERR_INVALID, "row count");
  o.rows = 10;
  o.probs = o.out;
  CHECK_ERR(dlrec_synth_write(&o, NULL), DLREC_ERR_INVALID, "both go to");
  o.probs = NULL;
  o.out = NULL;
  CHECK_ERR(dlrec_synth_write(&o, NULL), DLREC_ERR_INVALID, "output");
}

/* ---- Statistics ---- */

TEST(synth_missing_rates_ctr_and_counts) {
  enum { N = 200000 };
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(1, NULL, 0, &m));
  gen g;
  dlrec_status st = gen_rows(m, 21, N, &g);
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) gen_free(&g);
  CHECK_OK(st);
  long missing[40] = {0}, negative = 0, below_minus3 = 0, big_i5 = 0;
  const char *p = g.text, *end = g.text + g.text_bytes;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *f[40];
    size_t fl[40];
    split_tabs(p, (size_t)(nl - p), f, fl, 40);
    for (int i = 1; i < 40; i++) missing[i] += fl[i] == 0;
    if (fl[2] && f[2][0] == '-') {
      negative++;
      below_minus3 += strtol(f[2], NULL, 10) < -3;
    }
    if (fl[5] && strtol(f[5], NULL, 10) >= 100000) big_i5++;
    p = nl + 1;
  }
  double sum_p = 0;
  for (uint32_t i = 0; i < N; i++) sum_p += g.prob[i];
  double ctr = (double)g.positives / N;
  gen_free(&g);

  /* Binomial standard error at N rows is at most 0.0011: 0.008 is > 7 of them. */
  for (int i = 0; i < 39; i++) {
    double rate = (double)missing[i + 1] / N;
    if (fabs(rate - want_missing[i]) > 0.008) {
      test_fail(__FILE__, __LINE__, "%s%d: missing rate %.4f, want %.4f", i < 13 ? "I" : "C", i < 13 ? i + 1 : i - 12,
                rate, want_missing[i]);
      return;
    }
  }
  CHECK_NEAR(ctr, 0.25, 0.03, 0);
  CHECK_NEAR(sum_p / N, ctr, 0.005, 0); /* labels are drawn from the probabilities */
  CHECK(negative > N / 100);             /* I2 has negatives ... */
  CHECK_EQ(below_minus3, 0);             /* ... down to -3 */
  CHECK(big_i5 > N / 100);               /* I5's counts are heavy-tailed */
}

/* Zipf probabilities summed term by term: p_k = k^-s / sum_{j<=n} j^-s. */
static double zipf_norm(uint32_t n, double s) {
  double z = 0;
  for (uint32_t j = n; j >= 1; j--) z += pow(j, -s); /* smallest first, for accuracy */
  return z;
}

TEST(synth_zipf_matches_the_exact_law) {
  enum { N = 200000 };
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(1, NULL, 0, &m));
  gen g;
  dlrec_status st = gen_rows(m, 31, N, &g);
  uint32_t card[DLREC_SYNTH_CAT];
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) card[c] = dlrec_synth_cardinality(m, c);
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) gen_free(&g);
  CHECK_OK(st);
  /* C3 (10.1M values), C10 (93145), C1 (1460), C6 (24) and C9 (3): the sorted
   * counts of the top values must follow the Zipf probabilities of the top
   * ranks (the most frequent string is rank 1, and so on, up to sampling
   * noise), and be far above uniform. */
  const int cols[] = {2, 9, 0, 5, 8};
  for (size_t ci = 0; ci < sizeof cols / sizeof cols[0]; ci++) {
    int c = cols[ci];
    CHECK_EQ(card[c], dlrec_synth_criteo_cardinality(c));
    uint32_t *counts = NULL;
    long distinct = value_counts(g.text, g.text_bytes, 14 + c, &counts);
    CHECK(distinct > 0);
    CHECK(distinct <= (long)card[c]);
    double s = dlrec_synth_zipf_exponent(c), z = zipf_norm(card[c], s);
    double present = N * (1 - want_missing[13 + c]);
    double chi2 = 0;
    int top = distinct < 8 ? (int)distinct : 8;
    for (int k = 1; k <= top; k++) {
      double expect = present * pow(k, -s) / z;
      chi2 += (counts[k - 1] - expect) * (counts[k - 1] - expect) / expect;
    }
    double head_share = counts[0] / present;
    free(counts);
    /* 8 terms (the order statistics bias it a little for close ranks): chi2(8)
     * passes 30 with probability 2e-4. */
    if (chi2 > 30) {
      test_fail(__FILE__, __LINE__, "C%d: top counts are off the Zipf law (chi2 %.1f)", c + 1, chi2);
      return;
    }
    CHECK(card[c] < 10 || head_share > 3.0 / card[c]);
  }
  gen_free(&g);
}

/* The sampler against the exact law by rank: ranks 1..64 one by one, then
 * octaves [2^j, 2^(j+1)), with probabilities summed term by term, and a
 * chi-square test. The bins see both the sampler's precomputed head and its
 * computed tail. */
enum { NBINS = 64 + 32 };
static int rank_bin(uint32_t k) { return k <= 64 ? (int)k - 1 : 64 + (31 - __builtin_clz(k)) - 6; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

TEST(synth_zipf_ranks_follow_the_law_and_strings_are_a_bijection) {
  enum { N = 200000 };
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(4, NULL, 0, &m));
  uint32_t *rank = malloc((size_t)N * DLREC_SYNTH_CAT * sizeof *rank);
  char *text = malloc((size_t)N * DLREC_SYNTH_MAX_ROW_BYTES);
  uint64_t *pairs = malloc(N * sizeof *pairs);
  uint32_t card[DLREC_SYNTH_CAT];
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) card[c] = dlrec_synth_cardinality(m, c);
  dlrec_status st = rank && text && pairs ? DLREC_OK : DLREC_ERR_NOMEM;
  size_t text_bytes = 0;
  for (uint32_t done = 0, chunk = 0; st == DLREC_OK && done < N; chunk++) {
    uint32_t n = N - done < DLREC_SYNTH_CHUNK_ROWS ? N - done : DLREC_SYNTH_CHUNK_ROWS;
    dlrec_synth_rows out = {.text = text + text_bytes,
                            .text_cap = (size_t)n * DLREC_SYNTH_MAX_ROW_BYTES,
                            .rank = rank + (size_t)done * DLREC_SYNTH_CAT};
    st = dlrec_synth_generate(m, 8, chunk, n, &out);
    text_bytes += out.text_bytes;
    done += n;
  }
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) {
    free(rank);
    free(text);
    free(pairs);
  }
  CHECK_OK(st);

  const int cols[] = {3, 9, 0, 5, 8, 19}; /* C4 (2.2M values), C10, C1, C6, C9, C20 */
  for (size_t ci = 0; ci < sizeof cols / sizeof cols[0] && !test_failed_now(); ci++) {
    int c = cols[ci];
    double s = dlrec_synth_zipf_exponent(c);
    double p_bin[NBINS] = {0}, z = 0;
    long seen[NBINS] = {0}, present = 0;
    for (uint32_t k = card[c]; k >= 1; k--) {
      double t = pow(k, -s);
      p_bin[rank_bin(k)] += t;
      z += t;
    }
    for (uint32_t i = 0; i < N; i++) {
      uint32_t k = rank[(size_t)i * DLREC_SYNTH_CAT + c];
      if (k > card[c]) {
        test_fail(__FILE__, __LINE__, "C%d: rank %u above the cardinality %u", c + 1, k, card[c]);
        break;
      }
      if (k) seen[rank_bin(k)]++, present++;
    }
    /* Bins expecting fewer than 20 draws are pooled into one. */
    double chi2 = 0, pool_e = 0;
    long pool_o = 0;
    int df = -1;
    double worst_z = 0;
    int worst_bin = 0;
    for (int j = 0; j < NBINS; j++) {
      double e = present * p_bin[j] / z;
      if (e < 20) {
        pool_e += e, pool_o += seen[j];
        continue;
      }
      chi2 += (seen[j] - e) * (seen[j] - e) / e, df++;
      if (fabs(seen[j] - e) / sqrt(e) > worst_z) worst_z = fabs(seen[j] - e) / sqrt(e), worst_bin = j;
    }
    /* Each bin alone, too: a bias on one rank hides in a sum over many. */
    if (worst_z > 5.5)
      test_fail(__FILE__, __LINE__, "C%d: bin %d is %.1f standard errors off the Zipf law", c + 1, worst_bin, worst_z);
    if (pool_e > 0) chi2 += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e + 1), df++;
    /* Six standard deviations of a chi-square with df degrees of freedom. */
    if (df > 0 && chi2 > df + 6 * sqrt(2.0 * df)) {
      test_fail(__FILE__, __LINE__, "C%d: rank counts are off the Zipf law: chi2 %.1f, %d degrees of freedom",
                c + 1, chi2, df);
    }
  }

  /* C4's ranks and strings, as (rank, value) pairs: one string per rank and
   * one rank per string. */
  size_t np = 0;
  const char *p = text, *end = text + text_bytes;
  for (uint32_t i = 0; p < end; i++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *f[40];
    size_t fl[40];
    split_tabs(p, (size_t)(nl - p), f, fl, 40);
    uint32_t k = rank[(size_t)i * DLREC_SYNTH_CAT + 3];
    if ((fl[17] == 0) != (k == 0)) {
      test_fail(__FILE__, __LINE__, "row %u: C4 is '%.*s' but its rank is %u", i + 1, (int)fl[17], f[17], k);
      break;
    }
    if (k) pairs[np++] = (uint64_t)k << 32 | strtoul(f[17], NULL, 16);
    p = nl + 1;
  }
  qsort(pairs, np, sizeof *pairs, cmp_u64);
  size_t distinct = 0, clash = 0;
  uint64_t prev = 0; /* ranks start at 1 */
  for (size_t i = 0; i < np; i++) {
    uint64_t cur = pairs[i];
    if (cur >> 32 == prev >> 32) {
      clash += (uint32_t)cur != (uint32_t)prev; /* one rank, two strings */
      continue;
    }
    prev = cur;
    pairs[distinct++] = (uint32_t)cur; /* the string of each distinct rank, in place */
  }
  qsort(pairs, distinct, sizeof *pairs, cmp_u64);
  for (size_t i = 1; i < distinct; i++) clash += pairs[i] == pairs[i - 1]; /* two ranks, one string */
  free(rank);
  free(text);
  free(pairs);
  CHECK(distinct > 10000);
  CHECK_EQ_U64(clash, 0);
}

/* Draws n rows of the model of seed 2 with cardinalities `given` (NULL:
 * Criteo Kaggle's) capped at cap, and checks that each column has exactly
 * min(given, cap) values, as the model reports and as the rows draw them:
 * every value of a small column shows up, and no more (distinct ranks give
 * distinct strings). */
static void check_drawn_cardinalities(const uint32_t *given, uint32_t cap, uint32_t n) {
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(2, given, cap, &m));
  gen g;
  dlrec_status st = gen_rows(m, 1, n, &g);
  uint32_t card[DLREC_SYNTH_CAT];
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) card[c] = dlrec_synth_cardinality(m, c);
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) gen_free(&g);
  CHECK_OK(st);
  for (int c = 0; c < DLREC_SYNTH_CAT && !test_failed_now(); c++) {
    const uint32_t count = given ? given[c] : dlrec_synth_criteo_cardinality(c), want = count < cap ? count : cap;
    uint32_t *counts = NULL;
    long distinct = value_counts(g.text, g.text_bytes, 14 + c, &counts);
    free(counts);
    if (card[c] != want || distinct != (long)want)
      test_fail(__FILE__, __LINE__, "C%d: cardinality %u, %ld distinct values, want %u", c + 1, card[c], distinct,
                want);
  }
  gen_free(&g);
}

/* Criteo's columns capped at 50: the rarest of 50 values has probability
 * > 0.2%, so all show up in 100000 rows. */
TEST(synth_cardinality_cap) { check_drawn_cardinalities(NULL, 50, 100000); }

/* Cardinalities of the caller's: each column draws exactly its own count of
 * distinct values (small ones, all of which show up in 100000 rows), under
 * the cap; the named sets are Criteo Kaggle's and the 1TB vocabularies; a 0
 * is refused, naming its column. */
TEST(synth_cardinalities_given) {
  uint32_t given[DLREC_SYNTH_CAT];
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) given[c] = 2 + (uint32_t)(3 * c); /* 2 .. 77 */
  check_drawn_cardinalities(given, 60, 100000);

  dlrec_synth_model *m;
  const uint32_t *kaggle = dlrec_synth_cardinality_preset("criteo-kaggle");
  const uint32_t *tb = dlrec_synth_cardinality_preset("criteo-1tb");
  CHECK(kaggle && tb && !dlrec_synth_cardinality_preset("criteo") && !dlrec_synth_cardinality_preset(NULL));
  uint64_t rows = 0;
  for (int c = 0; c < DLREC_SYNTH_CAT && kaggle && tb; c++) {
    CHECK_EQ(kaggle[c], dlrec_synth_criteo_cardinality(c));
    rows += tb[c];
  }
  CHECK_EQ_U64(rows, 32709138); /* DeepLearningExamples' FL15 vocabularies: 32.7M rows in all */
  CHECK(tb && tb[0] == 7912889 && tb[19] == 8165896 && tb[25] == 35);
  CHECK_OK(dlrec_synth_model_new(1, tb, 0, &m));
  for (int c = 0; c < DLREC_SYNTH_CAT && tb; c++) CHECK_EQ(dlrec_synth_cardinality(m, c), tb[c]);
  dlrec_synth_model_free(m);
  given[7] = 0;
  m = (dlrec_synth_model *)1;
  CHECK_ERR(dlrec_synth_model_new(1, given, 0, &m), DLREC_ERR_INVALID, "column C8");
  CHECK(m == NULL);
}

/* ---- The hidden signal ---- */

TEST(synth_signal_needs_interactions) {
  enum { N = 200000 };
  dlrec_synth_model *m;
  CHECK_OK(dlrec_synth_model_new(1, NULL, 0, &m));
  gen g;
  dlrec_status st = gen_rows(m, 41, N, &g);
  dlrec_synth_model_free(m);
  if (st != DLREC_OK) gen_free(&g);
  CHECK_OK(st);
  double auc_true = auc(g.prob, g.label, N), auc_first = auc(g.logit_first, g.label, N);
  /* Calibration: within each decile of the probability, the click rate is the
   * mean probability (labels are Bernoulli draws of it). */
  int calibrated = 1;
  for (int b = 0; b < 10; b++) {
    double lo = b / 10.0, hi = (b + 1) / 10.0, sp = 0, sy = 0, cnt = 0;
    for (uint32_t i = 0; i < N; i++)
      if (g.prob[i] >= lo && g.prob[i] < hi) sp += g.prob[i], sy += g.label[i], cnt++;
    if (cnt < 500) continue;
    double se = sqrt(sp / cnt * (1 - sp / cnt) / cnt);
    if (fabs(sy / cnt - sp / cnt) > 5 * se + 1e-3) calibrated = 0;
  }
  gen_free(&g);
  fprintf(stderr, "     AUC of the true probabilities %.4f, of the first-order logit %.4f\n", auc_true, auc_first);
  CHECK(calibrated);
  CHECK(auc_true >= 0.77 && auc_true <= 0.83);
  CHECK(auc_true - auc_first >= 0.03);
  CHECK(auc_first > 0.6); /* the first-order terms carry signal too */
}

TEST(synth_model_seed_changes_the_world) {
  dlrec_synth_model *a, *b;
  CHECK_OK(dlrec_synth_model_new(1, NULL, 0, &a));
  CHECK_OK(dlrec_synth_model_new(2, NULL, 0, &b));
  char ta[20 * DLREC_SYNTH_MAX_ROW_BYTES], tb[20 * DLREC_SYNTH_MAX_ROW_BYTES];
  dlrec_synth_rows ra = {.text = ta, .text_cap = sizeof ta}, rb = {.text = tb, .text_cap = sizeof tb};
  int ok = dlrec_synth_generate(a, 1, 0, 20, &ra) == DLREC_OK && dlrec_synth_generate(b, 1, 0, 20, &rb) == DLREC_OK;
  double bias_a = dlrec_synth_bias(a), bias_b = dlrec_synth_bias(b);
  dlrec_synth_model_free(a);
  dlrec_synth_model_free(b);
  CHECK(ok);
  /* Same row seed, other model: other strings (and weights, so another bias). */
  CHECK(ra.text_bytes != rb.text_bytes || memcmp(ta, tb, ra.text_bytes) != 0);
  CHECK(bias_a != bias_b);
  CHECK(bias_a < 0 && bias_b < 0); /* a 25% click rate needs a negative bias */
}

/* ---- The CLI ---- */

TEST(synth_cli_help_and_usage_errors) {
  char *out = NULL;
  CHECK_EQ(test_run_cli(&out, "synth --help"), 0);
  int has_usage = out && strstr(out, "usage: dlrec synth") && strstr(out, "--max-cardinality");
  free(out);
  CHECK(has_usage);

  static const struct {
    const char *args, *want;
  } bad[] = {
      {"synth --rows abc --out /dev/null", "--rows"},
      {"synth --rows 0 --out /dev/null", "--rows"},
      {"synth --rows 10 --out /dev/null --bogus", "--bogus"},
      {"synth --rows 10", "--out"},
      {"synth --out /dev/null", "--rows"},
      {"synth --rows 10 --out /dev/null --threads 0", "--threads"},
      {"synth --rows 10 --out /dev/null --seed", "--seed"},
      {"synth --rows 10 --out - --probs -", "stdout"},
      {"synth --rows 10 --out /dev/null --cardinalities criteo", "neither a set"},
      {"synth --rows 10 --out /dev/null --cardinalities 5,5", "2 values, C1..C26 need 26"},
      {"synth --rows 10 --out /dev/null --cardinalities 5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5",
       "more than 26"},
      {"synth --rows 10 --out /dev/null --cardinalities 5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,5,0",
       "value 26"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    out = NULL;
    int rc = test_run_cli(&out, "%s", bad[i].args);
    int named = out && strstr(out, bad[i].want) != NULL;
    if (rc != 2 || !named) {
      test_fail(__FILE__, __LINE__, "'%s': exit %d, output: %s", bad[i].args, rc, out ? out : "(none)");
      free(out);
      return;
    }
    free(out);
  }
}

TEST(synth_cli_writes_and_reports) {
  const char *f = test_path("cli.tsv"), *pf = test_path("cli.probs");
  char *out = NULL;
  int rc = test_run_cli(&out, "synth --rows 2k --seed 3 --max-cardinality 1000 --threads 2 --out '%s' --probs '%s'",
                        f, pf);
  int summary = out && strstr(out, "2000 rows") && strstr(out, "AUC");
  free(out);
  CHECK_EQ(rc, 0);
  CHECK(summary);
  char *text = NULL;
  size_t n = 0;
  CHECK_OK(dlrec_read_file(f, (size_t)1 << 28, &text, &n));
  long lines = check_format(text, n, NULL);
  free(text);
  CHECK_EQ(lines, 2000);
  struct stat st;
  CHECK(stat(pf, &st) == 0 && st.st_size == 2000 * DLREC_SYNTH_PROB_BYTES);

  /* stdout, quietly: the rows and nothing else. */
  out = NULL;
  rc = test_run_cli(&out, "synth --rows 5 --out - -q");
  long stdout_lines = out ? check_format(out, strlen(out), NULL) : -1;
  free(out);
  CHECK_EQ(rc, 0);
  CHECK_EQ(stdout_lines, 5);

  /* --cardinalities as counts: C1 takes 3 values, C2 one, C3..C26 two. */
  rc = test_run_cli(&out, "synth --rows 2k -q --cardinalities 3,1,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2 "
                          "--out '%s'", f);
  free(out);
  CHECK_EQ(rc, 0);
  CHECK_OK(dlrec_read_file(f, (size_t)1 << 28, &text, &n));
  for (int c = 0; c < DLREC_SYNTH_CAT; c++) {
    uint32_t *counts = NULL;
    long distinct = value_counts(text, n, 14 + c, &counts);
    free(counts);
    CHECK_EQ(distinct, c == 0 ? 3 : c == 1 ? 1 : 2);
  }
  free(text);
}

TEST(synth_cli_unwritable_output) {
  char *out = NULL;
  int rc = test_run_cli(&out, "synth --rows 10 --out /nonexistent-dir/x.tsv -q");
  int clear = out && strstr(out, "/nonexistent-dir/x.tsv") && strstr(out, "No such file");
  free(out);
  CHECK_EQ(rc, 1);
  CHECK(clear);
}
