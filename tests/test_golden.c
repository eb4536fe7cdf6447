/* DLRM, Wide & Deep, DeepFM and DCN-v2 against golden files: the forward
 * (probabilities, loss) and the gradients (every dense parameter and the
 * pooled embeddings d_emb) of tiny models, computed in float64 by
 * independent NumPy implementations (tests/golden/make_dlrm_golden.py,
 * make_wide_deep_golden.py, make_dcn_v2_golden.py) and committed as the .txt
 * files of tests/golden/, so the test needs no Python. A file gives the
 * model's shape, the batch, the table rows and the flat dense parameters;
 * dlrec runs in fp32, hence the tolerances.
 *
 * The file: '#' comments, the line "dlrec-MODEL-golden 1" (MODEL: dlrm,
 * dcn_v2), then sections "@NAME TYPE COUNT" (TYPE i or f) each followed by
 * COUNT values. */
#include <ctype.h>
#include <errno.h>

#include "model/dlrm.h"
#include "model/model.h"
#include "test.h"

#define GOLDEN_MAX_SECTIONS 64
#define GOLDEN_MAX_BYTES (1u << 20)
#define GOLDEN_NAME_MAX 32

typedef struct golden_section {
  char name[GOLDEN_NAME_MAX];
  char type;      /* 'i' or 'f' */
  size_t n;
  double *v;      /* n values (integers are exact in a double) */
} golden_section;

typedef struct golden {
  char format[GOLDEN_NAME_MAX]; /* MODEL of the header "dlrec-MODEL-golden 1" */
  golden_section s[GOLDEN_MAX_SECTIONS];
  int n;
  char err[512];
} golden;

static void golden_free(golden *g) {
  for (int i = 0; i < g->n; i++) free(g->s[i].v);
  g->n = 0;
}

/* A cursor over the file's text: tokens separated by white space, '#' to the
 * end of a line is a comment. */
typedef struct cursor {
  const char *p, *end;
  int line;
} cursor;

static int next_token(cursor *c, char *tok, size_t cap) {
  for (;;) {
    while (c->p < c->end && isspace((unsigned char)*c->p)) {
      if (*c->p == '\n') c->line++;
      c->p++;
    }
    if (c->p < c->end && *c->p == '#') {
      while (c->p < c->end && *c->p != '\n') c->p++;
      continue;
    }
    break;
  }
  if (c->p >= c->end) return 0;
  size_t n = 0;
  while (c->p < c->end && !isspace((unsigned char)*c->p) && *c->p != '#') {
    if (n + 1 < cap) tok[n] = *c->p;
    n++;
    c->p++;
  }
  if (n + 1 > cap) tok[cap - 1] = '\0';
  else tok[n] = '\0';
  return n + 1 > cap ? -1 : 1; /* -1: too long */
}

/* Parses the whole file into g; 0 on success, else -1 with g->err set and
 * nothing left allocated. */
static int golden_load(golden *g, const char *path) {
  memset(g, 0, sizeof *g);
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(g->err, sizeof g->err, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  char *buf = malloc(GOLDEN_MAX_BYTES + 1);
  size_t len = buf ? fread(buf, 1, GOLDEN_MAX_BYTES + 1, f) : 0;
  int read_err = ferror(f);
  fclose(f);
  if (!buf || read_err || len > GOLDEN_MAX_BYTES) {
    snprintf(g->err, sizeof g->err, "%s: %s", path,
             !buf ? "out of memory" : read_err ? "read error" : "larger than 1 MiB");
    free(buf);
    return -1;
  }
  cursor c = {buf, buf + len, 1};
  char tok[128], ver[16];
  int r = next_token(&c, tok, sizeof tok);
  size_t tl = r == 1 ? strlen(tok) : 0;
  if (r != 1 || tl <= 13 || strncmp(tok, "dlrec-", 6) != 0 || strcmp(tok + tl - 7, "-golden") != 0 ||
      tl - 13 >= GOLDEN_NAME_MAX || next_token(&c, ver, sizeof ver) != 1 || strcmp(ver, "1") != 0) {
    snprintf(g->err, sizeof g->err, "%s: line %d: expected the header \"dlrec-MODEL-golden 1\"", path, c.line);
    goto fail;
  }
  snprintf(g->format, sizeof g->format, "%.*s", (int)(tl - 13), tok + 6);
  while ((r = next_token(&c, tok, sizeof tok)) != 0) {
    if (r < 0 || tok[0] != '@' || tok[1] == '\0' || strlen(tok + 1) >= GOLDEN_NAME_MAX) {
      snprintf(g->err, sizeof g->err, "%s: line %d: expected a section header \"@NAME TYPE COUNT\", got \"%s\"",
               path, c.line, tok);
      goto fail;
    }
    if (g->n == GOLDEN_MAX_SECTIONS) {
      snprintf(g->err, sizeof g->err, "%s: line %d: more than %d sections", path, c.line, GOLDEN_MAX_SECTIONS);
      goto fail;
    }
    golden_section *s = &g->s[g->n];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", tok + 1);
    for (int i = 0; i < g->n; i++)
      if (strcmp(g->s[i].name, s->name) == 0) {
        snprintf(g->err, sizeof g->err, "%s: line %d: section \"%s\" appears twice", path, c.line, s->name);
        goto fail;
      }
    if (next_token(&c, tok, sizeof tok) != 1 || (strcmp(tok, "i") != 0 && strcmp(tok, "f") != 0)) {
      snprintf(g->err, sizeof g->err, "%s: line %d: section \"%s\": expected the type i or f", path, c.line, s->name);
      goto fail;
    }
    s->type = tok[0];
    char *e;
    errno = 0;
    unsigned long long n = 0;
    if (next_token(&c, tok, sizeof tok) == 1 && isdigit((unsigned char)tok[0])) n = strtoull(tok, &e, 10);
    else e = tok;
    if (e == tok || *e || errno || n > GOLDEN_MAX_BYTES / 2) {
      snprintf(g->err, sizeof g->err, "%s: line %d: section \"%s\": bad count", path, c.line, s->name);
      goto fail;
    }
    s->n = (size_t)n;
    s->v = malloc((s->n ? s->n : 1) * sizeof *s->v);
    if (!s->v) {
      snprintf(g->err, sizeof g->err, "%s: out of memory", path);
      goto fail;
    }
    g->n++; /* owns s->v from here */
    for (size_t i = 0; i < s->n; i++) {
      r = next_token(&c, tok, sizeof tok);
      if (r == 0 || (r == 1 && tok[0] == '@')) {
        snprintf(g->err, sizeof g->err, "%s: line %d: section \"%s\": %zu values, its header says %zu", path, c.line,
                 s->name, i, s->n);
        goto fail;
      }
      errno = 0;
      double v = 0;
      if (r == 1) v = s->type == 'i' ? (double)strtoll(tok, &e, 10) : strtod(tok, &e);
      if (r != 1 || e == tok || *e || errno || !isfinite(v)) {
        snprintf(g->err, sizeof g->err, "%s: line %d: section \"%s\"[%zu]: bad %s \"%s\"", path, c.line, s->name, i,
                 s->type == 'i' ? "integer" : "number", tok);
        goto fail;
      }
      s->v[i] = v;
    }
  }
  free(buf);
  return 0;
fail:
  free(buf);
  golden_free(g);
  return -1;
}

/* The section `name` of type `type` with `n` values (any count when n is
 * SIZE_MAX), else NULL with g->err set. */
static const golden_section *golden_get(golden *g, const char *name, char type, size_t n) {
  for (int i = 0; i < g->n; i++) {
    const golden_section *s = &g->s[i];
    if (strcmp(s->name, name) != 0) continue;
    if (s->type != type || (n != SIZE_MAX && s->n != n)) {
      snprintf(g->err, sizeof g->err, "section \"%s\": type %c with %zu values, expected type %c with %zu", name,
               s->type, s->n, type, n);
      return NULL;
    }
    return s;
  }
  snprintf(g->err, sizeof g->err, "section \"%s\" missing", name);
  return NULL;
}

/* The single integer of section `name` in [lo, hi], or -1 with g->err set. */
static long long golden_int(golden *g, const char *name, long long lo, long long hi) {
  const golden_section *s = golden_get(g, name, 'i', 1);
  if (!s) return -1;
  if (s->v[0] < (double)lo || s->v[0] > (double)hi) {
    snprintf(g->err, sizeof g->err, "section \"%s\": %.17g out of range [%lld, %lld]", name, s->v[0], lo, hi);
    return -1;
  }
  return (long long)s->v[0];
}

/* Compares dlrec's values (gotf, fp32, or gotd when gotf is NULL) against
 * the reference want[i] as CHECK_NEAR does (|got - want| <= atol + rtol
 * |want|); reports the first few mismatches by section and index, and the
 * largest errors. Returns the mismatch count. */
static int compare(const char *section, const float *gotf, const double *gotd, const double *want, size_t n,
                   double atol, double rtol) {
  int bad = 0;
  double max_abs = 0, max_rel = 0;
  for (size_t i = 0; i < n; i++) {
    double got = gotf ? (double)gotf[i] : gotd[i];
    double err = fabs(got - want[i]);
    if (err > max_abs) max_abs = err;
    if (want[i] != 0 && err / fabs(want[i]) > max_rel) max_rel = err / fabs(want[i]);
    if (!(err <= atol + rtol * fabs(want[i]))) {
      if (bad < 5)
        test_fail(__FILE__, __LINE__, "%s[%zu]: dlrec %.9g, golden %.9g (|diff| %.3g > %.3g + %.3g * |golden|)",
                  section, i, got, want[i], err, atol, rtol);
      bad++;
    }
  }
  if (bad > 5) test_fail(__FILE__, __LINE__, "%s: %d of %zu values differ", section, bad, n);
  printf("golden %-6s %4zu values: max |diff| %.3g, max relative %.3g\n", section, n, max_abs, max_rel);
  return bad;
}

/* fp32 against float64: the observed errors are ~1e-8 absolute (values up to
 * ~0.3), so these leave a wide margin for other BLAS kernels and compilers. */
#define ATOL 1e-6
#define RTOL 1e-4

/* Everything the model run needs, freed in one place. */
typedef struct golden_run {
  golden g;
  dlrec_net *m;
  dlrec_net_ws *ws;
  dlrec_net_scorer *scorer;
  uint32_t *off[DLREC_MAX_SPARSE], *ids[DLREC_MAX_SPARSE];
  float *dense, *labels, *prob;
} golden_run;

static void golden_run_free(golden_run *r) {
  for (int c = 0; c < DLREC_MAX_SPARSE; c++) {
    free(r->off[c]);
    free(r->ids[c]);
  }
  free(r->dense);
  free(r->labels);
  free(r->prob);
  dlrec_net_scorer_free(r->scorer);
  dlrec_net_ws_free(r->ws);
  dlrec_net_free(r->m);
  golden_free(&r->g);
}

static float *to_floats(const golden_section *s) {
  float *f = malloc((s->n ? s->n : 1) * sizeof *f);
  if (f)
    for (size_t i = 0; i < s->n; i++) f[i] = (float)s->v[i];
  return f;
}

/* Fails the test with the file's name, the failed lookup's message (g->err
 * is set only by a failed golden_get or golden_int, which the next
 * condition catches) and the condition. */
#define GOLDEN_REQUIRE(cond)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      test_fail(__FILE__, __LINE__, "golden file %s: %s%s%s", path, r->g.err,             \
                r->g.err[0] ? "; " : "", "failed: " #cond);                         \
      return;                                                                             \
    }                                                                                     \
  } while (0)

/* DLRM of the file's bottom and top MLPs, into r->m (NULL on failure, reported). */
static void dlrm_from_golden(golden_run *r, const char *path, const dlrec_schema *s, long long D, long long pooling) {
  golden *g = &r->g;
  const golden_section *bottom = golden_get(g, "bottom", 'i', SIZE_MAX), *top = golden_get(g, "top", 'i', SIZE_MAX);
  GOLDEN_REQUIRE(bottom && top);
  GOLDEN_REQUIRE(bottom->n >= 1 && bottom->n <= DLREC_MLP_MAX_LAYERS && top->n >= 1 && top->n <= DLREC_MLP_MAX_LAYERS);

  dlrec_dlrm_shape sh = {.emb_dim = (uint32_t)D, .n_bottom = (uint32_t)bottom->n, .n_top = (uint32_t)top->n,
                         .pooling = pooling ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM};
  for (size_t l = 0; l < bottom->n; l++) {
    GOLDEN_REQUIRE(bottom->v[l] >= 1 && bottom->v[l] <= 65536);
    sh.bottom[l] = (uint32_t)bottom->v[l];
  }
  for (size_t l = 0; l < top->n; l++) {
    GOLDEN_REQUIRE(top->v[l] >= 1 && top->v[l] <= 65536);
    sh.top[l] = (uint32_t)top->v[l];
  }
  CHECK_OK(dlrec_dlrm_create(&r->m, &sh, s));
}

/* A wide_deep or deepfm (the file's MODEL) of the file's mlp widths and
 * batch_norm, into r->m (NULL on failure, reported). */
static void mlp_net_from_golden(golden_run *r, const char *path, const dlrec_schema *s, long long D,
                                long long pooling) {
  golden *g = &r->g;
  const char *type = g->format;
  const golden_section *mlp = golden_get(g, "mlp", 'i', SIZE_MAX);
  long long bn = golden_int(g, "batch_norm", 0, 1);
  GOLDEN_REQUIRE(mlp && mlp->n < DLREC_MLP_MAX_LAYERS && bn >= 0);
  cJSON *o = cJSON_CreateObject(), *widths = cJSON_AddArrayToObject(o, "mlp");
  cJSON_AddStringToObject(o, "type", type);
  cJSON_AddNumberToObject(o, "embedding_dim", (double)D);
  cJSON_AddStringToObject(o, "pooling", pooling ? "mean" : "sum");
  cJSON_AddBoolToObject(o, "batch_norm", bn == 1);
  for (size_t l = 0; l < mlp->n; l++) cJSON_AddItemToArray(widths, cJSON_CreateNumber(mlp->v[l]));
  dlrec_net_config c;
  dlrec_status st = dlrec_net_config_default(&c, type);
  if (st == DLREC_OK) st = dlrec_net_config_parse(&c, o, "golden model");
  cJSON_Delete(o);
  CHECK_OK(st);
  CHECK_OK(dlrec_net_create(&r->m, &c, s));
}


/* The model of file `path` (its header's MODEL) into r->m: NULL on failure,
 * reported. */
typedef void (*golden_model_fn)(golden_run *r, const char *path, const dlrec_schema *s, long long D,
                                long long pooling);

static void run_golden(golden_run *r, const char *path, const char *format, golden_model_fn make_model) {
  golden *g = &r->g;
  if (golden_load(g, path) != 0) {
    test_fail(__FILE__, __LINE__, "cannot parse the golden file: %s", g->err);
    return;
  }
  if (strcmp(g->format, format) != 0) {
    test_fail(__FILE__, __LINE__, "golden file %s holds a %s model, expected %s", path, g->format, format);
    return;
  }
  long long n_dense = golden_int(g, "n_dense", 1, DLREC_MAX_DENSE);
  GOLDEN_REQUIRE(n_dense > 0);
  long long F = golden_int(g, "n_sparse", 1, DLREC_MAX_SPARSE);
  GOLDEN_REQUIRE(F > 0);
  long long D = golden_int(g, "emb_dim", 1, DLREC_EMBED_MAX_DIM);
  GOLDEN_REQUIRE(D > 0);
  long long B = golden_int(g, "batch", 1, 4096);
  GOLDEN_REQUIRE(B > 0);
  long long pooling = golden_int(g, "pooling", 0, 1);
  GOLDEN_REQUIRE(pooling >= 0);
  long long rows = golden_int(g, "table_rows", 1, 1 << 20);
  GOLDEN_REQUIRE(rows > 0);

  dlrec_schema s;
  memset(&s, 0, sizeof s);
  s.has_label = 1;
  strcpy(s.label_name, "label");
  s.n_dense = (uint32_t)n_dense;
  for (long long i = 0; i < n_dense; i++) snprintf(s.dense_names[i], DLREC_NAME_MAX, "I%lld", i + 1);
  s.n_sparse = (uint32_t)F;
  s.table_rows = (uint64_t)rows;
  const golden_section *ranges = golden_get(g, "id_ranges", 'i', (size_t)(2 * F));
  const golden_section *maxh = golden_get(g, "max_hotness", 'i', (size_t)F);
  GOLDEN_REQUIRE(ranges && maxh);
  for (long long c = 0; c < F; c++) {
    snprintf(s.sparse[c].name, DLREC_NAME_MAX, "C%lld", c + 1);
    GOLDEN_REQUIRE(ranges->v[2 * c] >= 0 && ranges->v[2 * c] < ranges->v[2 * c + 1] &&
                   ranges->v[2 * c + 1] <= (double)rows && maxh->v[c] >= 1 && maxh->v[c] <= 1024);
    s.sparse[c].id_begin = (uint64_t)ranges->v[2 * c];
    s.sparse[c].id_end = (uint64_t)ranges->v[2 * c + 1];
    s.sparse[c].max_hotness = (uint32_t)maxh->v[c];
    s.sparse[c].hotness = maxh->v[c] == 1 ? 1 : 0; /* fixed one-hot, or multi-hot */
  }
  CHECK_OK(dlrec_schema_validate(&s, "golden schema"));
  make_model(r, path, &s, D, pooling);
  if (!r->m) return;
  CHECK_OK(dlrec_net_ws_create(&r->ws, r->m, (uint32_t)B));

  /* Parameters and table rows, into the model (the table's row padding stays zero). */
  size_t n_params;
  float *params = dlrec_net_dense_params(r->m, &n_params);
  const golden_section *p = golden_get(g, "params", 'f', n_params);
  GOLDEN_REQUIRE(p);
  for (size_t i = 0; i < n_params; i++) params[i] = (float)p->v[i];
  dlrec_table *t = dlrec_net_table(r->m);
  CHECK_EQ_U64(dlrec_table_rows(t), (uint64_t)rows);
  /* dlrm's and dcn_v2's rows are D wide; wide_deep's and deepfm's D + 1 (the
   * first-order weight last). */
  long long TW = D + (!strcmp(format, "wide_deep") || !strcmp(format, "deepfm") ? 1 : 0);
  CHECK_EQ(dlrec_table_dim(t), TW);
  GOLDEN_REQUIRE(dlrec_table_dim(t) == TW);
  uint32_t stride = dlrec_table_stride(t);
  float *data = dlrec_table_data(t);
  const golden_section *tab = golden_get(g, "table", 'f', (size_t)(rows * TW));
  GOLDEN_REQUIRE(tab);
  for (long long row = 0; row < rows; row++)
    for (long long k = 0; k < TW; k++) data[(size_t)row * stride + (size_t)k] = (float)tab->v[row * TW + k];

  /* The batch. */
  const golden_section *dense = golden_get(g, "dense", 'f', (size_t)(B * n_dense));
  const golden_section *labels = golden_get(g, "labels", 'f', (size_t)B);
  GOLDEN_REQUIRE(dense && labels);
  r->dense = to_floats(dense);
  r->labels = to_floats(labels);
  r->prob = malloc((size_t)B * sizeof *r->prob);
  CHECK(r->dense && r->labels && r->prob);
  dlrec_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.rows = (uint32_t)B;
  batch.dense = r->dense;
  batch.labels = r->labels;
  for (long long c = 0; c < F; c++) {
    char name[32];
    snprintf(name, sizeof name, "offsets%lld", c);
    const golden_section *off = golden_get(g, name, 'i', (size_t)(B + 1));
    GOLDEN_REQUIRE(off);
    snprintf(name, sizeof name, "ids%lld", c);
    const golden_section *ids = golden_get(g, name, 'i', SIZE_MAX);
    GOLDEN_REQUIRE(ids);
    r->off[c] = malloc((size_t)(B + 1) * sizeof(uint32_t));
    r->ids[c] = malloc((ids->n ? ids->n : 1) * sizeof(uint32_t));
    CHECK(r->off[c] && r->ids[c]);
    for (long long b = 0; b <= B; b++) {
      GOLDEN_REQUIRE(off->v[b] >= 0 && off->v[b] <= (double)ids->n && (b == 0 ? off->v[b] == 0 : off->v[b] >= off->v[b - 1]));
      r->off[c][b] = (uint32_t)off->v[b];
    }
    GOLDEN_REQUIRE(off->v[B] == (double)ids->n);
    for (size_t j = 0; j < ids->n; j++) {
      GOLDEN_REQUIRE(ids->v[j] >= 0 && ids->v[j] < (double)rows);
      r->ids[c][j] = (uint32_t)ids->v[j];
    }
    batch.offsets[c] = r->off[c];
    batch.ids[c] = r->ids[c];
  }

  /* The reference outputs, all checked present before anything runs. */
  const golden_section *probs = golden_get(g, "probs", 'f', (size_t)B);
  const golden_section *loss = golden_get(g, "loss", 'f', 1);
  const golden_section *grad = golden_get(g, "grad", 'f', n_params);
  const golden_section *d_emb = golden_get(g, "d_emb", 'f', (size_t)(B * F * TW));
  GOLDEN_REQUIRE(probs && loss && grad && d_emb);

  int bad = 0;
  /* Scoring packs the weights as they are now, after they were set above. */
  CHECK_OK(dlrec_net_scorer_create(&r->scorer, r->m));
  CHECK_OK(dlrec_net_predict(r->scorer, r->ws, &batch, r->prob));
  bad += compare("probs", r->prob, NULL, probs->v, (size_t)B, ATOL, RTOL);
  double got_loss = NAN;
  const float *got_grad, *got_demb;
  CHECK_OK(dlrec_net_gradients(r->m, r->ws, &batch, &got_loss, &got_grad, &got_demb));
  bad += compare("loss", NULL, &got_loss, loss->v, 1, ATOL, RTOL);
  bad += compare("grad", got_grad, NULL, grad->v, n_params, ATOL, RTOL);
  bad += compare("d_emb", got_demb, NULL, d_emb->v, (size_t)(B * F * TW), ATOL, RTOL);
  /* Only a file that has it: the running statistics after the training pass. */
  for (int i = 0; i < g->n; i++)
    if (!strcmp(g->s[i].name, "state_after")) {
      const golden_section *after = golden_get(g, "state_after", 'f', n_params);
      GOLDEN_REQUIRE(after);
      bad += compare("state", params, NULL, after->v, n_params, ATOL, RTOL);
    }
  CHECK_EQ(bad, 0);
}

TEST(golden_dlrm_forward_and_gradients_match_numpy) {
  golden_run r;
  memset(&r, 0, sizeof r);
  run_golden(&r, test_source_path("tests/golden/dlrm_tiny.txt"), "dlrm", dlrm_from_golden);
  golden_run_free(&r);
}

/* Wide & Deep with batch normalization (sum pooling) and DeepFM without
 * (mean pooling), against tests/golden/make_wide_deep_golden.py. */
TEST(golden_wide_deep_and_deepfm_forward_and_gradients_match_numpy) {
  const char *types[2] = {"wide_deep", "deepfm"};
  for (int i = 0; i < 2; i++) {
    char path[64];
    snprintf(path, sizeof path, "tests/golden/%s_tiny.txt", types[i]);
    golden_run r;
    memset(&r, 0, sizeof r);
    run_golden(&r, test_source_path(path), types[i], mlp_net_from_golden);
    golden_run_free(&r);
  }
}

/* A damaged file is refused with a message naming the problem, not a crash. */
TEST(golden_parser_rejects_damaged_files) {
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"", "header"},
      {"dlrec-dlrm-golden 2\n", "header"},
      {"dlrec-dlrm-golden 1\n@a f 3\n1 2\n", "2 values, its header says 3"},
      {"dlrec-dlrm-golden 1\n@a f 2\n1 2\n@b i 1\n", "0 values, its header says 1"},
      {"dlrec-dlrm-golden 1\n@a f 3\n1 2 x\n", "bad number \"x\""},
      {"dlrec-dlrm-golden 1\n@a f 1\nnan\n", "bad number"},
      {"dlrec-dlrm-golden 1\n@a i 1\n1.5\n", "bad integer"},
      {"dlrec-dlrm-golden 1\n@a q 1\n1\n", "type i or f"},
      {"dlrec-dlrm-golden 1\n@a f -1\n", "bad count"},
      {"dlrec-dlrm-golden 1\n@a f 99999999999999999999\n", "bad count"},
      {"dlrec-dlrm-golden 1\n@a f 1\n1\n@a f 1\n2\n", "appears twice"},
      {"dlrec-dlrm-golden 1\n1 2 3\n", "section header"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *path = test_path("bad.txt");
    CHECK_EQ(test_write_file(path, cases[i].text, (size_t)-1), 0);
    golden g;
    if (golden_load(&g, path) == 0) {
      golden_free(&g);
      test_fail(__FILE__, __LINE__, "case %zu: a damaged file was accepted", i);
      return;
    }
    if (!strstr(g.err, cases[i].want)) {
      test_fail(__FILE__, __LINE__, "case %zu: error \"%s\" lacks \"%s\"", i, g.err, cases[i].want);
      return;
    }
  }
  golden g;
  CHECK(golden_load(&g, test_path("missing.txt")) != 0 && strstr(g.err, "cannot open"));
  /* A good one with a comment, and a lookup of a wrong count. */
  CHECK_EQ(test_write_file(test_path("ok.txt"), "# c\ndlrec-dlrm-golden 1\n@a f 2 # two\n1 -2.5\n@b i 0\n", (size_t)-1), 0);
  CHECK_EQ(golden_load(&g, test_path("ok.txt")), 0);
  const golden_section *a = golden_get(&g, "a", 'f', 2), *wrong = golden_get(&g, "a", 'f', 3);
  int ok = a && a->v[1] == -2.5 && !wrong && strstr(g.err, "expected type f with 3") && golden_get(&g, "b", 'i', 0);
  golden_free(&g);
  CHECK(ok);
}

/* ---- dcn_v2 -------------------------------------------------------------- */

/* DCN-v2 of the file's structure, cross layers, rank, experts and MLP, into
 * r->m (NULL on failure, reported), through the model config as a user
 * would write it. */
static void dcn_v2_from_golden(golden_run *r, const char *path, const dlrec_schema *s, long long D,
                               long long pooling) {
  golden *g = &r->g;
  long long structure = golden_int(g, "structure", 0, 1);
  GOLDEN_REQUIRE(structure >= 0);
  long long layers = golden_int(g, "cross_layers", 1, 16), rank = golden_int(g, "low_rank", 0, 65536);
  GOLDEN_REQUIRE(layers > 0 && rank >= 0);
  long long experts = golden_int(g, "experts", 1, 16);
  GOLDEN_REQUIRE(experts > 0);
  const golden_section *mlp = golden_get(g, "mlp", 'i', SIZE_MAX);
  GOLDEN_REQUIRE(mlp && mlp->n < DLREC_MLP_MAX_LAYERS);
  char text[512], widths[256] = "";
  for (size_t l = 0; l < mlp->n; l++) {
    GOLDEN_REQUIRE(mlp->v[l] >= 1 && mlp->v[l] <= 65536);
    snprintf(widths + strlen(widths), sizeof widths - strlen(widths), "%s%lld", l ? ", " : "", (long long)mlp->v[l]);
  }
  snprintf(text, sizeof text,
           "{\"type\": \"dcn_v2\", \"embedding_dim\": %lld, \"pooling\": \"%s\", \"structure\": \"%s\", "
           "\"cross_layers\": %lld, \"low_rank\": %lld, \"experts\": %lld, \"mlp\": [%s]}",
           D, pooling ? "mean" : "sum", structure ? "parallel" : "stacked", layers, rank, experts, widths);
  dlrec_net_config c;
  CHECK_OK(dlrec_net_config_default(&c, "dcn_v2"));
  cJSON *o = cJSON_Parse(text);
  CHECK(o != NULL);
  dlrec_status st = dlrec_net_config_parse(&c, o, "golden model");
  cJSON_Delete(o);
  CHECK_OK(st);
  CHECK_OK(dlrec_net_create(&r->m, &c, s));
}

/* Full rank, stacked, sum pooling: two cross layers, an MLP of [5, 4]. */
TEST(golden_dcn_v2_stacked_full_rank_matches_numpy) {
  golden_run r;
  memset(&r, 0, sizeof r);
  run_golden(&r, test_source_path("tests/golden/dcn_v2_stacked_full.txt"), "dcn_v2", dcn_v2_from_golden);
  golden_run_free(&r);
}

/* A mixture of 3 experts of rank 3, parallel, mean pooling, an MLP of [6]. */
TEST(golden_dcn_v2_parallel_mixture_matches_numpy) {
  golden_run r;
  memset(&r, 0, sizeof r);
  run_golden(&r, test_source_path("tests/golden/dcn_v2_parallel_moe.txt"), "dcn_v2", dcn_v2_from_golden);
  golden_run_free(&r);
}
