/* The sparse optimizer's table-wide updates (docs/config.md, "Table-wide
 * updates"): optimizer.sparse.type "adam" (torch.optim.Adam over an
 * nn.Embedding: every row every step, one global step count) and l2_scope
 * "table" (g += weight_decay * w on every row every step, for every type),
 * each through the fused update and its sweep over the untouched rows, over
 * several steps against a naive double-precision reference written as
 * torch.optim writes its updates; the same bits on 1 and 4 threads; "table"
 * with weight_decay 0 the same bits as "touched"; the refusals; and a run
 * of `dlrec train` stopped and resumed that ends with the uninterrupted
 * run's bits. (tests/optim_ref checks whole runs against NumPy;
 * test_train_config the config keys.) */
#include <omp.h>

#include "backend/cpu/kernels.h"
#include "backend/sparse_optim_impl.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "ref/ref.h"
#include "test.h"

/* ---- batches ------------------------------------------------------------------ */

enum { MAX_F = 4 };

typedef struct batch {
  uint32_t B, F;
  uint32_t *offsets[MAX_F], *ids[MAX_F];
  dlrec_bag_batch bags;
} batch;

/* B samples x F columns, bags of 0..3 ids from [0, hi), skewed toward small
 * ids so that rows repeat within and across bags; rows from hi up are never
 * touched. */
static void batch_make(batch *x, uint32_t B, uint32_t F, uint64_t hi, uint64_t seed) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 7);
  x->B = B, x->F = F;
  for (uint32_t c = 0; c < F; c++) {
    x->offsets[c] = malloc((B + 1) * sizeof(uint32_t));
    x->ids[c] = malloc(((size_t)B * 3 + 1) * sizeof(uint32_t));
    x->offsets[c][0] = 0;
    for (uint32_t b = 0; b < B; b++) {
      const uint32_t n = dlrec_rng_below(&r, 4);
      for (uint32_t k = 0; k < n; k++) {
        const double u = dlrec_rng_uniform(&r);
        x->ids[c][x->offsets[c][b] + k] = (uint32_t)((double)hi * u * u);
      }
      x->offsets[c][b + 1] = x->offsets[c][b] + n;
    }
  }
  x->bags = (dlrec_bag_batch){B, F, (const uint32_t *const *)x->offsets, (const uint32_t *const *)x->ids, NULL};
}

static void batch_free(batch *x) {
  for (uint32_t c = 0; c < x->F; c++) free(x->offsets[c]), free(x->ids[c]);
}

/* ---- the reference ------------------------------------------------------------ */

/* The reference (tests/ref/ref.c: torch.optim over the table's dense
 * gradient) holding the table's initial rows; rows and D beside it. */
typedef struct ref {
  ref_sparse_state st;
  uint64_t rows;
  uint32_t D;
} ref;

static void ref_open(ref *s, const dlrec_table *t, const dlrec_sparse_optim_config *c) {
  s->rows = dlrec_table_rows(t), s->D = dlrec_table_dim(t);
  const size_t n = s->rows * s->D;
  s->st = (ref_sparse_state){malloc(n * sizeof(double)), malloc(s->rows * sizeof(double)), calloc(n, sizeof(double)),
                             calloc(n, sizeof(double)), calloc(s->rows, sizeof(uint32_t)), 0};
  const uint32_t stride = dlrec_table_stride(t);
  for (uint64_t r = 0; r < s->rows; r++) {
    s->st.accum[r] = c->initial_accumulator;
    for (uint32_t d = 0; d < s->D; d++) s->st.w[r * s->D + d] = dlrec_table_data_const(t)[r * stride + d];
  }
}

static void ref_close(ref *s) { free(s->st.w), free(s->st.m), free(s->st.v), free(s->st.accum), free(s->st.steps); }

static void ref_step(ref *s, const dlrec_sparse_optim_config *c, const dlrec_bag_batch *bags, int mean,
                     const float *dout) {
  ref_bag_backward_update(&s->st, c, bags, mean ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM, dout, s->rows, s->D);
}

/* ---- the fused update against it ------------------------------------------------ */

typedef struct run {
  dlrec_table *t;
  dlrec_sparse_optim *o;
  void *scratch;
  size_t scratch_bytes;
} run;

static dlrec_status run_open(run *x, uint64_t rows, uint32_t D, dlrec_table_dtype dtype,
                             const dlrec_sparse_optim_config *c, uint64_t max_ids) {
  memset(x, 0, sizeof *x);
  dlrec_status st = dlrec_table_create_dtype(&x->t, rows, D, dtype);
  const dlrec_row_range all = {.begin = 0, .end = rows};
  if (st == DLREC_OK) st = dlrec_table_init_uniform(x->t, &all, 1, 31);
  if (st == DLREC_OK) st = dlrec_sparse_optim_create(&x->o, x->t, c);
  x->scratch_bytes = dlrec_bag_backward_scratch_bytes(x->t, max_ids);
  x->scratch = malloc(x->scratch_bytes);
  return st;
}

static void run_close(run *x) {
  dlrec_sparse_optim_free(x->o);
  dlrec_table_free(x->t);
  free(x->scratch);
}

static dlrec_status run_step(run *x, const batch *b, int mean, const float *dout) {
  return cpu_bag_backward_update(x->t, x->o, &b->bags, mean ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM, dout, x->scratch,
                                 x->scratch_bytes);
}

/* The table and state against the reference after a step; untouched rows
 * (from `cold` up) changed or kept as the config says. */
static void compare(const run *x, const ref *s, const dlrec_sparse_optim_config *c, const float *before, uint64_t cold,
                    int step) {
  const uint32_t D = s->D, stride = dlrec_table_stride(x->t);
  const float *w = dlrec_table_data_const(x->t);
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(x->o, &st);
  for (uint64_t r = 0; r < s->rows && !test_failed_now(); r++) {
    int moved = 0;
    for (uint32_t d = 0; d < D && !test_failed_now(); d++) {
      const size_t i = r * stride + d, j = r * D + d;
      moved |= w[i] != before[i];
      if (!(fabs(w[i] - s->st.w[j]) <= 1e-6 + 2e-5 * fabs(s->st.w[j])))
        test_fail(__FILE__, __LINE__, "kind %d scope %d wd %g step %d: w[%llu][%u] = %.9g, reference %.9g", c->kind,
                  c->l2_scope, c->weight_decay, step, (unsigned long long)r, d, w[i], s->st.w[j]);
      else if (st.m && !(fabs(st.m[i] - s->st.m[j]) <= 1e-7 + 1e-5 * fabs(s->st.m[j]) &&
                         fabs(st.v[i] - s->st.v[j]) <= 1e-9 + 1e-5 * s->st.v[j]))
        test_fail(__FILE__, __LINE__, "kind %d step %d: Adam state [%llu][%u]: m %.9g vs %.9g, v %.9g vs %.9g",
                  c->kind, step, (unsigned long long)r, d, st.m[i], s->st.m[j], st.v[i], s->st.v[j]);
    }
    if (st.steps && st.steps[r] != s->st.steps[r])
      test_fail(__FILE__, __LINE__, "kind %d row %llu: %u steps, reference %u", c->kind, (unsigned long long)r,
                st.steps[r], s->st.steps[r]);
    if (st.accum && !(fabs(st.accum[r] - s->st.accum[r]) <= 1e-9 + 1e-5 * s->st.accum[r]))
      test_fail(__FILE__, __LINE__, "row %llu: accumulator %.9g, reference %.9g", (unsigned long long)r, st.accum[r],
                s->st.accum[r]);
    /* A row never touched has no gradient but the table-wide L2's, and no
     * momentum without it. */
    const int must_move = c->l2_scope == DLREC_SPARSE_L2_TABLE && c->weight_decay > 0;
    if (r >= cold && !test_failed_now() && moved != must_move)
      test_fail(__FILE__, __LINE__, "kind %d scope %d step %d: untouched row %llu %s", c->kind, c->l2_scope, step,
                (unsigned long long)r, moved ? "moved" : "kept still");
  }
}

/* STEPS steps on a table of `rows` rows of width D (ids below 3/4 of the
 * rows, so the top quarter is never touched) against the reference. */
static void check_kind(dlrec_sparse_optim_kind kind, dlrec_sparse_l2_scope scope, float wd, int mean, uint64_t rows,
                       uint32_t D, uint32_t B) {
  enum { STEPS = 4, F = 3 };
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  c.lr = kind == DLREC_SPARSE_SGD ? 0.2f : 0.01f;
  c.weight_decay = wd;
  c.l2_scope = scope;
  if (kind == DLREC_SPARSE_ROWWISE_ADAGRAD) c.initial_accumulator = 0.1f;
  run x;
  if (run_open(&x, rows, D, DLREC_TABLE_FP32, &c, (uint64_t)B * F * 3) != DLREC_OK) {
    test_fail(__FILE__, __LINE__, "setup: %s", dlrec_last_error());
    run_close(&x);
    return;
  }
  ref s;
  ref_open(&s, x.t, &c);
  const size_t floats = rows * dlrec_table_stride(x.t);
  float *before = malloc(floats * sizeof(float)), *dout = malloc((size_t)B * F * D * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, 5, (uint64_t)kind);
  for (int step = 0; step < STEPS && !test_failed_now(); step++) {
    batch b;
    batch_make(&b, B, F, rows * 3 / 4, 100 + (uint64_t)step);
    for (size_t i = 0; i < (size_t)B * F * D; i++) dout[i] = (float)(2 * dlrec_rng_uniform(&r) - 1);
    memcpy(before, dlrec_table_data_const(x.t), floats * sizeof(float));
    ref_step(&s, &c, &b.bags, mean, dout);
    if (run_step(&x, &b, mean, dout) != DLREC_OK) test_fail(__FILE__, __LINE__, "update: %s", dlrec_last_error());
    else compare(&x, &s, &c, before, rows * 3 / 4, step);
    batch_free(&b);
  }
  free(before), free(dout);
  ref_close(&s);
  run_close(&x);
}

/* 20000 rows are five ranges of the sweep (threads share them), with ranges
 * holding no touched row; B = 2048 gives lists long enough for the threaded
 * sort and update. D = 5 is a width without its own compiled copy (and a
 * stride with padding). */
TEST(dense_adam_matches_torch_reference) {
  for (int scope = 0; scope < 2; scope++)
    for (int mean = 0; mean < 2; mean++) {
      check_kind(DLREC_SPARSE_ADAM, (dlrec_sparse_l2_scope)scope, 0.0f, mean, 300, 16, 64);
      check_kind(DLREC_SPARSE_ADAM, (dlrec_sparse_l2_scope)scope, 0.05f, mean, 300, 5, 64);
    }
  check_kind(DLREC_SPARSE_ADAM, DLREC_SPARSE_L2_TABLE, 0.05f, 0, 20000, 16, 2048);
  check_kind(DLREC_SPARSE_ADAM, DLREC_SPARSE_L2_TOUCHED, 0.05f, 1, 20000, 32, 2048);
}

TEST(table_scope_l2_matches_reference_for_every_type) {
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_ADAM && !test_failed_now(); kind++) {
    check_kind((dlrec_sparse_optim_kind)kind, DLREC_SPARSE_L2_TABLE, 0.05f, 0, 300, 16, 64);
    check_kind((dlrec_sparse_optim_kind)kind, DLREC_SPARSE_L2_TABLE, 0.05f, 1, 300, 7, 64);
    check_kind((dlrec_sparse_optim_kind)kind, DLREC_SPARSE_L2_TABLE, 0.05f, 0, 20000, 16, 2048);
  }
}

/* The touched scope, for the reference's sake (the other tests of
 * test_embed.c check it against ref.c's own reference). */
TEST(touched_scope_matches_reference_for_every_type) {
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_LAZY_ADAM && !test_failed_now(); kind++)
    check_kind((dlrec_sparse_optim_kind)kind, DLREC_SPARSE_L2_TOUCHED, 0.05f, 0, 300, 16, 64);
}

/* ---- bits ---------------------------------------------------------------------- */

/* Three steps from the same start; the table and state concatenated. */
static char *run_bits(const dlrec_sparse_optim_config *c, dlrec_table_dtype dtype, uint64_t rows, uint32_t D,
                      int threads, size_t *bytes) {
  enum { B = 2048, F = 4 };
  run x;
  char *all = NULL;
  float *dout = malloc((size_t)B * F * D * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, 9, 0);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  dlrec_status st = run_open(&x, rows, D, dtype, c, (uint64_t)B * F * 3);
  for (int step = 0; step < 3 && st == DLREC_OK; step++) {
    batch b;
    batch_make(&b, B, F, rows / 2, 40 + (uint64_t)step);
    for (size_t i = 0; i < (size_t)B * F * D; i++) dout[i] = (float)(2 * dlrec_rng_uniform(&r) - 1);
    st = run_step(&x, &b, step == 1, dout);
    batch_free(&b);
  }
  omp_set_num_threads(keep);
  if (st == DLREC_OK) {
    dlrec_sparse_optim_state s;
    dlrec_sparse_optim_state_view(x.o, &s);
    const size_t tb = rows * dlrec_table_stride(x.t) * dlrec_table_dtype_bytes(dtype);
    const size_t mv = s.m ? rows * s.stride * sizeof(float) : 0, acc = s.accum ? rows * sizeof(float) : 0;
    const size_t steps = s.steps ? rows * sizeof(uint32_t) : 0;
    *bytes = tb + 2 * mv + acc + steps;
    all = malloc(*bytes);
    memcpy(all, dlrec_table_raw(x.t), tb);
    if (mv) memcpy(all + tb, s.m, mv), memcpy(all + tb + mv, s.v, mv);
    if (acc) memcpy(all + tb + 2 * mv, s.accum, acc);
    if (steps) memcpy(all + tb + 2 * mv + acc, s.steps, steps);
  }
  free(dout);
  run_close(&x);
  return all;
}

static int same_bits(const dlrec_sparse_optim_config *a, const dlrec_sparse_optim_config *b, dlrec_table_dtype dtype,
                     int threads_a, int threads_b) {
  size_t na = 0, nb = 0;
  char *x = run_bits(a, dtype, 30000, 16, threads_a, &na), *y = run_bits(b, dtype, 30000, 16, threads_b, &nb);
  const int same = x && y && na == nb && !memcmp(x, y, na);
  if (!x || !y) test_fail(__FILE__, __LINE__, "run failed: %s", dlrec_last_error());
  free(x), free(y);
  return same;
}

TEST(table_wide_updates_same_bits_on_1_and_4_threads) {
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_ADAM && !test_failed_now(); kind++)
    for (int dtype = DLREC_TABLE_FP32; dtype <= DLREC_TABLE_FP16 && !test_failed_now(); dtype++) {
      dlrec_sparse_optim_config c;
      dlrec_sparse_optim_config_default(&c, (dlrec_sparse_optim_kind)kind);
      c.weight_decay = 0.01f;
      c.l2_scope = DLREC_SPARSE_L2_TABLE;
      if (!same_bits(&c, &c, (dlrec_table_dtype)dtype, 1, 4))
        test_fail(__FILE__, __LINE__, "kind %d dtype %d: 1 and 4 threads differ", kind, dtype);
    }
}

/* weight_decay 0 reaches no row, whatever its scope: "table" is "touched". */
TEST(table_scope_without_weight_decay_is_touched_bit_for_bit) {
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_ADAM && !test_failed_now(); kind++) {
    dlrec_sparse_optim_config a, b;
    dlrec_sparse_optim_config_default(&a, (dlrec_sparse_optim_kind)kind);
    b = a;
    b.l2_scope = DLREC_SPARSE_L2_TABLE;
    CHECK(dlrec_sparse_optim_sweeps(&b) == (kind == DLREC_SPARSE_ADAM));
    if (!same_bits(&a, &b, DLREC_TABLE_FP32, 2, 2)) test_fail(__FILE__, __LINE__, "kind %d: the scopes differ", kind);
  }
}

/* A 16-bit table takes the fp32 update and stochastic rounding on every
 * row; after a few steps it stays within a few bf16 ulps of fp32's. */
TEST(dense_adam_bf16_table_near_fp32) {
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_ADAM);
  c.weight_decay = 0.01f;
  c.l2_scope = DLREC_SPARSE_L2_TABLE;
  size_t n32 = 0, n16 = 0;
  char *a = run_bits(&c, DLREC_TABLE_FP32, 3000, 16, 2, &n32), *b = run_bits(&c, DLREC_TABLE_BF16, 3000, 16, 2, &n16);
  CHECK(a && b);
  const float *w32 = (const float *)a;
  const uint16_t *w16 = (const uint16_t *)b;
  double worst = 0;
  for (size_t i = 0; i < (size_t)3000 * 16; i++) {
    uint32_t bits = (uint32_t)w16[i] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    const double e = fabs((double)f - w32[i]);
    if (e > worst) worst = e;
  }
  /* rows are uniform in +-1/sqrt(3000) ~ 0.018: a bf16 ulp there is ~1.2e-4 */
  CHECK(worst < 1e-3);
  CHECK(worst > 0); /* it is rounded */
  free(a), free(b);
}

/* ---- edges and refusals ------------------------------------------------------------ */

/* A batch with no id still steps every row of a dense Adam. */
TEST(dense_adam_steps_every_row_on_an_empty_batch) {
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_ADAM);
  c.weight_decay = 0.1f;
  c.l2_scope = DLREC_SPARSE_L2_TABLE;
  run x;
  CHECK_OK(run_open(&x, 5000, 8, DLREC_TABLE_FP32, &c, 16));
  uint32_t off[3] = {0, 0, 0}, id[1] = {0};
  const uint32_t *offs[1] = {off}, *ids[1] = {id};
  const dlrec_bag_batch bags = {2, 1, offs, ids, NULL};
  float dout[16] = {0};
  const float w0 = dlrec_table_data_const(x.t)[4999 * 8];
  CHECK_OK(cpu_bag_backward_update(x.t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes));
  dlrec_sparse_optim_state s;
  dlrec_sparse_optim_state_view(x.o, &s);
  for (uint64_t r = 0; r < 5000; r++) CHECK_EQ(s.steps[r], 1);
  /* The first step of Adam moves by lr * sign(g): here g = wd * w. */
  CHECK_NEAR(dlrec_table_data_const(x.t)[4999 * 8], w0 - (w0 > 0 ? c.lr : -c.lr), 1e-6, 1e-4);
  run_close(&x);
}

TEST(table_wide_updates_refused_on_a_cache_and_bad_scope) {
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_ADAM);
  run x;
  CHECK_OK(run_open(&x, 100, 8, DLREC_TABLE_FP32, &c, 16));
  uint64_t keys[100];
  for (int i = 0; i < 100; i++) keys[i] = 1000 + (uint64_t)i;
  dlrec_sparse_optim_set_row_keys(x.o, keys); /* a tiered store's cache, a shard, hot rows */
  uint32_t off[2] = {0, 1}, id[1] = {3};
  const uint32_t *offs[1] = {off}, *ids[1] = {id};
  const dlrec_bag_batch bags = {1, 1, offs, ids, NULL};
  float dout[8] = {1};
  CHECK_ERR(cpu_bag_backward_update(x.t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes),
            DLREC_ERR_UNSUPPORTED, "every row");
  run_close(&x);
  dlrec_table *t;
  CHECK_OK(dlrec_table_create(&t, 10, 4));
  dlrec_sparse_optim *o = NULL;
  c.l2_scope = (dlrec_sparse_l2_scope)2;
  CHECK_ERR(dlrec_sparse_optim_create(&o, t, &c), DLREC_ERR_INVALID, "l2_scope");
  c.l2_scope = DLREC_SPARSE_L2_TOUCHED;
  c.kind = (dlrec_sparse_optim_kind)4;
  CHECK_ERR(dlrec_sparse_optim_create(&o, t, &c), DLREC_ERR_INVALID, "kind");
  dlrec_table_free(t);
}

/* ---- training runs ------------------------------------------------------------------ */

static int make_data(void) {
  char *out = NULL;
  const char *bin = getenv("DLREC_BIN");
  int rc = test_run_cli(&out, "synth -q --rows 6000 --seed 3 --max-cardinality 500 --out '%s' && '%s' etl fit -q "
                        "--input '%s' --out '%s' && '%s' etl apply -q --etl '%s' --input '%s' --out '%s'",
                        test_path("clicks.tsv"), bin, test_path("clicks.tsv"), test_path("etl"), bin, test_path("etl"),
                        test_path("clicks.tsv"), test_path("train.dlr"));
  if (rc != 0) fprintf(stderr, "data setup failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc;
}

/* cfg-NAME.json: a small DLRM with the sparse section and training keys
 * given; its path in one of two buffers of its own. */
static const char *write_config(const char *name, const char *sparse, const char *training) {
  static char paths[2][2048];
  static int next;
  char file[64], text[1024];
  snprintf(file, sizeof file, "cfg-%s.json", name);
  snprintf(text, sizeof text,
           "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]},"
           " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": %s},"
           " \"training\": {\"batch_size\": 128, \"threads\": 2, \"seed\": 5, \"deterministic\": true%s},"
           " \"checkpoint\": {\"interval_steps\": 20, \"keep\": 3}, \"log\": {\"interval_steps\": 20},"
           " \"eval\": {\"train_rows\": 0}}",
           sparse, training);
  char *path = paths[next++ % 2];
  snprintf(path, sizeof paths[0], "%s", test_path(file));
  return test_write_file(path, text, (size_t)-1) == 0 ? path : NULL;
}

static int train(const char *cfg, const char *run, const char *extra, char **out) {
  char *o = NULL;
  int rc = test_run_cli(&o, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' %s", cfg, test_path("train.dlr"),
                        test_path("etl"), test_path(run), extra);
  if (rc != 0 && !out) fprintf(stderr, "train %s %s -> %d: %s\n", run, extra, rc, o ? o : "");
  if (out) *out = o;
  else free(o);
  return rc;
}

static int same_file(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  const int eq = dlrec_read_file(a, 1u << 30, &x, &nx) == DLREC_OK && dlrec_read_file(b, 1u << 30, &y, &ny) == DLREC_OK &&
                 nx == ny && memcmp(x, y, nx) == 0;
  free(x), free(y);
  return eq;
}

/* RUN/latest's checkpoint directory into buf. */
static const char *latest(const char *run, char *buf, size_t size) {
  char path[2048], *name = NULL;
  size_t n = 0;
  snprintf(path, sizeof path, "%s/latest", test_path(run));
  if (dlrec_read_file(path, 256, &name, &n) != DLREC_OK) return "";
  while (n && (name[n - 1] == '\n' || name[n - 1] == ' ')) name[--n] = '\0';
  snprintf(buf, size, "%s/%s", test_path(run), name);
  free(name);
  return buf;
}

/* Stopped at step 30 (between the checkpoints at 20 and 40) and resumed, a
 * run ends with the uninterrupted one's bits: the table, Adam's state (every
 * row's step count the global step) and, for a bf16 table, the update count
 * that keys its rounding. */
static void check_resume(const char *dtype) {
  char training[128];
  snprintf(training, sizeof training, ", \"max_steps\": 47, \"table_dtype\": \"%s\"", dtype);
  const char *cfg = write_config(dtype, "{\"type\": \"adam\", \"lr\": 0.005, \"weight_decay\": 0.001, "
                                        "\"l2_scope\": \"table\"}", training);
  CHECK(cfg);
  CHECK(train(cfg, "straight", "", NULL) == 0);
  CHECK(train(cfg, "resumed", "--max-steps 30", NULL) == 0);
  CHECK(train(cfg, "resumed", "--resume", NULL) == 0);
  char a[2048], b[2048];
  latest("straight", a, sizeof a);
  latest("resumed", b, sizeof b);
  CHECK(strstr(a, "ckpt-000000000047") && strstr(b, "ckpt-000000000047"));
  const char *files[] = {"dense.bin", "table.bin", "optim.bin", "config.json"};
  for (int i = 0; i < 4; i++) {
    char x[2200], y[2200];
    snprintf(x, sizeof x, "%s/%s", a, files[i]);
    snprintf(y, sizeof y, "%s/%s", b, files[i]);
    if (!same_file(x, y)) test_fail(__FILE__, __LINE__, "%s table: %s differs after resume", dtype, files[i]);
  }
}

TEST(dense_adam_run_resumes_bitwise_and_refuses_what_it_cannot_train) {
  CHECK(make_data() == 0);
  check_resume("fp32");
  if (test_failed_now()) return;
  check_resume("bf16");
  if (test_failed_now()) return;
  /* Refused before training, naming the field and why. */
  const char *adam = write_config("adam", "{\"type\": \"adam\"}", "");
  const char *l2 = write_config("l2", "{\"type\": \"sgd\", \"weight_decay\": 0.01, \"l2_scope\": \"table\"}",
                                ", \"max_steps\": 1");
  CHECK(adam && l2);
  struct {
    const char *cfg, *extra, *want;
  } cases[] = {
      {l2, "--device cuda", "optimizer.sparse: field 'l2_scope': \"table\" trains on the CPU only"},
      {adam, "--device cuda:1", "optimizer.sparse: field 'type': \"adam\" trains on the CPU only"},
  };
  for (int i = 0; i < 2; i++) {
    char *out = NULL;
    const int rc = train(cases[i].cfg, "refused", cases[i].extra, &out);
    if (rc == 0 || !out || !strstr(out, cases[i].want))
      test_fail(__FILE__, __LINE__, "%s: exit %d, expected an error containing '%s': %s", cases[i].extra, rc,
                cases[i].want, out ? out : "");
    free(out);
  }
  /* storage tiered: the same config, with a tiered table. */
  char text[1024];
  snprintf(text, sizeof text,
           "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]},"
           " \"optimizer\": {\"sparse\": {\"type\": \"adam\"}}, \"storage\": {\"kind\": \"tiered\", "
           "\"cache_rows\": 100000}}");
  CHECK(test_write_file(test_path("tiered.json"), text, (size_t)-1) == 0);
  char *out = NULL;
  const int rc = train(test_path("tiered.json"), "refused", "", &out);
  if (rc == 0 || !out || !strstr(out, "field 'type': \"adam\" with storage.kind \"tiered\": dense Adam and a "
                                      "table-scope L2 read every row every step; use lazy_adam"))
    test_fail(__FILE__, __LINE__, "tiered: exit %d: %s", rc, out ? out : "");
  free(out);
  /* A sgd with a table-wide L2 of one step trains (the tables refused above are refused for what they are). */
  CHECK(train(l2, "l2", "", NULL) == 0);
}
