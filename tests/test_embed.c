/* Embeddings: table layout and initialization, bag forward against a naive
 * loop, the fused backward against finite differences and against naive
 * reference optimizers over several steps, determinism across thread counts,
 * and refusal of corrupt batches. */
#include <omp.h>

#include "backend/cpu/kernels.h"
#include "backend/table_store.h"
#include "embed/embed.h"
#include "core/rng.h"
#include "ref/ref.h"
#include "test.h"

/* ---- a test batch: CSR bags per column, owned by the struct --------------- */

typedef struct test_batch {
  uint32_t B, F;
  uint32_t *offsets[8];
  uint32_t *ids[8];
  dlrec_bag_batch bags;
} test_batch;

/* B samples x F columns (F <= 8), each bag 0..max_hot ids (at least min_hot),
 * ids drawn from [0, rows) with a skew toward small ids, so that rows repeat
 * within and across bags as hot rows do. */
static void batch_make(test_batch *tb, uint32_t B, uint32_t F, uint32_t min_hot, uint32_t max_hot, uint64_t rows,
                       uint64_t seed) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  tb->B = B;
  tb->F = F;
  for (uint32_t c = 0; c < F; c++) {
    tb->offsets[c] = malloc((B + 1) * sizeof(uint32_t));
    tb->ids[c] = malloc(((size_t)B * max_hot + 1) * sizeof(uint32_t));
    tb->offsets[c][0] = 0;
    for (uint32_t b = 0; b < B; b++) {
      uint32_t n = min_hot + dlrec_rng_below(&r, max_hot - min_hot + 1);
      for (uint32_t k = 0; k < n; k++) {
        double u = dlrec_rng_uniform(&r);
        tb->ids[c][tb->offsets[c][b] + k] = (uint32_t)((double)rows * u * u * u); /* skewed */
      }
      tb->offsets[c][b + 1] = tb->offsets[c][b] + n;
    }
  }
  tb->bags.rows = B;
  tb->bags.cols = F;
  tb->bags.offsets = (const uint32_t *const *)tb->offsets;
  tb->bags.ids = (const uint32_t *const *)tb->ids;
  tb->bags.mean_cols = NULL;
}

static uint64_t batch_ids(const test_batch *tb) {
  uint64_t n = 0;
  for (uint32_t c = 0; c < tb->F; c++) n += tb->offsets[c][tb->B];
  return n;
}

static void batch_free(test_batch *tb) {
  for (uint32_t c = 0; c < tb->F; c++) free(tb->offsets[c]), free(tb->ids[c]);
}

static void fill(float *v, size_t n, dlrec_rng *r, float lo, float hi) {
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)dlrec_rng_uniform(r);
}

static dlrec_pooling bag_mode(int mean) { return mean ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM; }

static dlrec_table *table_random(uint64_t rows, uint32_t dim, uint64_t seed) {
  dlrec_table *t = NULL;
  if (dlrec_table_create(&t, rows, dim) != DLREC_OK) return NULL;
  dlrec_row_range all = {.begin = 0, .end = rows};
  if (dlrec_table_init_uniform(t, &all, 1, seed) != DLREC_OK) {
    dlrec_table_free(t);
    return NULL;
  }
  return t;
}

static size_t table_bytes(dlrec_table *t) {
  return (size_t)dlrec_table_rows(t) * dlrec_table_stride(t) * sizeof(float);
}

/* ---- the table ------------------------------------------------------------- */

TEST(table_layout_and_zero_padding) {
  dlrec_table *t;
  CHECK_OK(dlrec_table_create(&t, 100, 5));
  CHECK_EQ(dlrec_table_rows(t), 100);
  CHECK_EQ(dlrec_table_dim(t), 5);
  CHECK_EQ(dlrec_table_stride(t), 8);
  CHECK(((uintptr_t)dlrec_table_data(t) & 63) == 0);
  for (size_t i = 0; i < 100 * 8; i++) CHECK(dlrec_table_data(t)[i] == 0.0f);
  dlrec_table_free(t);
  CHECK_OK(dlrec_table_create(&t, 1, 16));
  CHECK_EQ(dlrec_table_stride(t), 16);
  dlrec_table_free(t);
  CHECK_ERR(dlrec_table_create(&t, 0, 16), DLREC_ERR_INVALID, "rows");
  CHECK_ERR(dlrec_table_create(&t, (1ull << 32) + 1, 16), DLREC_ERR_INVALID, "rows");
  CHECK_ERR(dlrec_table_create(&t, 10, 0), DLREC_ERR_INVALID, "dim");
  CHECK_ERR(dlrec_table_create(&t, 10, DLREC_EMBED_MAX_DIM + 1), DLREC_ERR_INVALID, "dim");
  dlrec_table_free(NULL);
}

TEST(table_init_bounds_per_column_and_thread_independent) {
  /* Three columns of very different sizes, a gap of rows in no column, and
   * rows past the last column. */
  const uint64_t rows = 30000;
  const uint32_t dim = 5;
  const dlrec_row_range ranges[] = {{.begin = 0, .end = 3},
                                    {.begin = 3, .end = 10003},
                                    {.begin = 10003, .end = 20000},
                                    {.begin = 20100, .end = 29000}};
  const int n_ranges = 4;
  const int threads = omp_get_max_threads();
  dlrec_table *t1, *t3, *t4;
  CHECK_OK(dlrec_table_create(&t1, rows, dim));
  CHECK_OK(dlrec_table_create(&t3, rows, dim));
  CHECK_OK(dlrec_table_create(&t4, rows, dim));
  /* Dirty the tables first: init must write every value, padding included. */
  memset(dlrec_table_data(t1), 0x7f, table_bytes(t1));
  memset(dlrec_table_data(t3), 0x7f, table_bytes(t3));
  omp_set_num_threads(1);
  dlrec_status s1 = dlrec_table_init_uniform(t1, ranges, n_ranges, 42);
  omp_set_num_threads(3);
  dlrec_status s3 = dlrec_table_init_uniform(t3, ranges, n_ranges, 42);
  omp_set_num_threads(threads);
  CHECK_OK(s1);
  CHECK_OK(s3);
  CHECK(memcmp(dlrec_table_data(t1), dlrec_table_data(t3), table_bytes(t1)) == 0);
  CHECK_OK(dlrec_table_init_uniform(t4, ranges, n_ranges, 43));
  CHECK(memcmp(dlrec_table_data(t1), dlrec_table_data(t4), table_bytes(t1)) != 0);

  const float *data = dlrec_table_data(t1);
  const uint32_t stride = dlrec_table_stride(t1);
  for (int g = 0; g < n_ranges; g++) {
    const float a = (float)sqrt(1.0 / (double)(ranges[g].end - ranges[g].begin));
    double sum = 0, maxabs = 0;
    for (uint64_t r = ranges[g].begin; r < ranges[g].end; r++)
      for (uint32_t d = 0; d < dim; d++) {
        float v = data[r * stride + d];
        CHECK(fabsf(v) <= a);
        sum += v;
        if (fabs(v) > maxabs) maxabs = fabs(v);
      }
    const double n = (double)(ranges[g].end - ranges[g].begin) * dim;
    /* The values fill the range: the largest is near a, the mean near 0
     * (standard error a / sqrt(3n)). */
    if (n > 100) {
      CHECK(maxabs > 0.99 * a);
      CHECK(fabs(sum / n) < 5 * a / sqrt(3 * n));
    }
  }
  /* Rows in no column are zero; the padding is zero everywhere. */
  for (uint64_t r = 0; r < rows; r++) {
    int in_col = 0;
    for (int g = 0; g < n_ranges; g++) in_col |= r >= ranges[g].begin && r < ranges[g].end;
    for (uint32_t d = 0; d < stride; d++)
      if (!in_col || d >= dim) CHECK(data[r * stride + d] == 0.0f);
  }
  const dlrec_row_range overlap[] = {{.begin = 0, .end = 10}, {.begin = 5, .end = 20}};
  CHECK_ERR(dlrec_table_init_uniform(t1, overlap, 2, 1), DLREC_ERR_INVALID, "range 1");
  const dlrec_row_range outside[] = {{.begin = 0, .end = rows + 1}};
  CHECK_ERR(dlrec_table_init_uniform(t1, outside, 1, 1), DLREC_ERR_INVALID, "range 0");
  dlrec_table_free(t1);
  dlrec_table_free(t3);
  dlrec_table_free(t4);
}

/* model.embedding_init's kinds, one per column of a table whose columns
 * cross the init chunks: each column's values have its distribution's
 * bound, mean, variance and share within one standard deviation (which
 * tells a normal, 0.683, from a uniform of the same variance, 0.577); the
 * table is the same for 1 and 3 threads and for the same seed, and another
 * seed draws another. */
TEST(table_init_draws_each_columns_initializer) {
  enum { DIM = 7 };
  const dlrec_row_range ranges[] = {
      {.begin = 0, .end = 5000, .init = {DLREC_INIT_NORMAL, 1e-4f}},
      {.begin = 5000, .end = 9000, .init = {DLREC_INIT_UNIFORM, 0.05f}},
      {.begin = 9000, .end = 9002, .init = {DLREC_INIT_ZEROS, 0}}, /* a 2-row column */
      {.begin = 9002, .end = 9202, .init = {DLREC_INIT_XAVIER_UNIFORM, 0}}, /* small: dim counts in its bound */
      {.begin = 15000, .end = 21000, .init = {DLREC_INIT_UNIFORM_SQRT_ROWS, 0}},
      {.begin = 21000, .end = 30000, .init = {DLREC_INIT_NORMAL, 0.3f}},
  };
  enum { N_RANGES = sizeof ranges / sizeof *ranges, ROWS = 30001 };
  const int threads = omp_get_max_threads();
  dlrec_table *t[4];
  for (int i = 0; i < 4; i++) {
    CHECK_OK(dlrec_table_create(&t[i], ROWS, DIM));
    memset(dlrec_table_data(t[i]), 0x7f, table_bytes(t[i]));
  }
  omp_set_num_threads(1);
  CHECK_OK(dlrec_table_init_uniform(t[0], ranges, N_RANGES, 9));
  omp_set_num_threads(3);
  CHECK_OK(dlrec_table_init_uniform(t[1], ranges, N_RANGES, 9));
  omp_set_num_threads(threads);
  CHECK_OK(dlrec_table_init_uniform(t[2], ranges, N_RANGES, 9));
  CHECK_OK(dlrec_table_init_uniform(t[3], ranges, N_RANGES, 10));
  CHECK(memcmp(dlrec_table_data(t[0]), dlrec_table_data(t[1]), table_bytes(t[0])) == 0);
  CHECK(memcmp(dlrec_table_data(t[0]), dlrec_table_data(t[2]), table_bytes(t[0])) == 0);
  CHECK(memcmp(dlrec_table_data(t[0]), dlrec_table_data(t[3]), table_bytes(t[0])) != 0);
  const float *data = dlrec_table_data(t[0]);
  const uint32_t stride = dlrec_table_stride(t[0]);
  for (int g = 0; g < N_RANGES; g++) {
    const dlrec_row_range *c = &ranges[g];
    const double rows = (double)(c->end - c->begin), n = rows * DIM;
    /* The stated distribution: its bound (0: unbounded) and standard deviation. */
    double bound = 0, sd = 0;
    switch ((dlrec_embed_init_kind)c->init.kind) {
    case DLREC_INIT_NORMAL: sd = c->init.scale; break;
    case DLREC_INIT_UNIFORM: bound = c->init.scale; break;
    case DLREC_INIT_XAVIER_UNIFORM: bound = sqrt(6.0 / (rows + DIM)); break;
    case DLREC_INIT_UNIFORM_SQRT_ROWS: bound = sqrt(1.0 / rows); break;
    case DLREC_INIT_ZEROS: break;
    }
    if (bound > 0) sd = bound / sqrt(3.0);
    double sum = 0, sq = 0, within = 0, maxabs = 0;
    for (uint64_t r = c->begin; r < c->end; r++)
      for (uint32_t d = 0; d < DIM; d++) {
        const double v = data[r * stride + d];
        sum += v;
        sq += v * v;
        within += fabs(v) <= sd;
        if (fabs(v) > maxabs) maxabs = fabs(v);
      }
    if (c->init.kind == DLREC_INIT_ZEROS) {
      CHECK(maxabs == 0.0);
      continue;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    CHECK(fabs(mean) < 5 * sd / sqrt(n));
    /* Within 6 standard errors (a normal's variance has the larger one). */
    CHECK(fabs(var / (sd * sd) - 1) < 6 * sqrt(2 / n));
    const double share = c->init.kind == DLREC_INIT_NORMAL ? 0.682689 : 1 / sqrt(3.0);
    CHECK(fabs(within / n - share) < 6 * sqrt(0.25 / n));
    if (bound > 0) {
      CHECK(maxabs <= (double)(float)bound);
      CHECK(maxabs > 0.99 * bound);
    } else {
      CHECK(maxabs > 3 * sd); /* a normal's tails: P(|z| > 3) = 0.0027 of 35000 values or more */
    }
  }
  const dlrec_row_range bad[] = {{.begin = 0, .end = 10, .init = {DLREC_INIT_KINDS, 0}}};
  CHECK_ERR(dlrec_table_init_uniform(t[0], bad, 1, 1), DLREC_ERR_INVALID, "initializer");
  for (int i = 0; i < 4; i++) dlrec_table_free(t[i]);
}

/* Tables of 4095, 4096, 4097 and 8193 rows (a chunk of TABLE_INIT_CHUNK_ROWS
 * rows draws from its own stream), columns across the chunk boundaries:
 * every value is the plain loop's, and a window of the table initialized
 * from a chunk's first row on (as the tiered and sharded stores do) holds
 * the whole table's rows. */
TEST(table_init_draws_each_chunk_from_its_stream_and_windows_agree) {
  enum { C = TABLE_INIT_CHUNK_ROWS, DIM = 3 };
  const uint64_t sizes[] = {C - 1, C, C + 1, 2 * C + 1};
  for (int z = 0; z < 4; z++) {
    const uint64_t rows = sizes[z];
    /* row 0 and row C - 2 in no column */
    const dlrec_row_range ranges[] = {{.begin = 1, .end = C - 2}, {.begin = C - 1, .end = rows}};
    const uint32_t n_ranges = rows > C - 1 ? 2 : 1;
    dlrec_table *t, *w;
    CHECK_OK(dlrec_table_create(&t, rows, DIM));
    CHECK_OK(dlrec_table_init_uniform(t, ranges, n_ranges, 7));
    const float *data = dlrec_table_data(t);
    const uint32_t stride = dlrec_table_stride(t);
    dlrec_rng rng;
    for (uint64_t r = 0; r < rows; r++) {
      if (r % C == 0) dlrec_rng_seed(&rng, 7, r / C);
      const int g = r >= ranges[0].begin && r < ranges[0].end ? 0 : n_ranges > 1 && r >= ranges[1].begin ? 1 : -1;
      for (uint32_t d = 0; d < DIM; d++) {
        const double a = g < 0 ? 0 : sqrt(1.0 / (double)(ranges[g].end - ranges[g].begin));
        const float want = g < 0 ? 0.0f : (float)((2.0 * dlrec_rng_uniform(&rng) - 1.0) * a);
        if (data[r * stride + d] != want) CHECK_EQ(r * 10 + d, (uint64_t)-1); /* names the first one off */
      }
    }
    /* Windows of C rows from each chunk on, the last one past the end. */
    CHECK_OK(dlrec_table_create(&w, C, DIM));
    for (uint64_t first = 0; first < rows; first += C) {
      table_init_window(w, first, ranges, n_ranges, 7);
      const uint64_t k = rows - first < C ? rows - first : C;
      CHECK(memcmp(dlrec_table_data(w), data + first * stride, (size_t)(k * stride) * sizeof(float)) == 0);
    }
    dlrec_table_free(w);
    dlrec_table_free(t);
  }
}

/* ---- bag forward ------------------------------------------------------------ */

static void check_bag_forward(uint64_t rows, uint32_t dim, uint32_t B, uint32_t F, uint32_t min_hot, uint32_t max_hot,
                              int mean) {
  dlrec_table *t = table_random(rows, dim, 5);
  if (!t) {
    test_fail(__FILE__, __LINE__, "table: %s", dlrec_last_error());
    return;
  }
  test_batch tb;
  batch_make(&tb, B, F, min_hot, max_hot, rows, dim * 31 + B);
  float *out = malloc((size_t)B * F * dim * sizeof(float));
  double *ref = malloc((size_t)B * F * dim * sizeof(double));
  for (size_t i = 0; i < (size_t)B * F * dim; i++) out[i] = NAN; /* empty bags must write zeros */
  ref_bag_forward(ref, dlrec_table_data(t), dlrec_table_stride(t), dim, &tb.bags, bag_mode(mean));
  if (cpu_bag_forward(out, t, &tb.bags, bag_mode(mean)) != DLREC_OK)
    test_fail(__FILE__, __LINE__, "bag_forward: %s", dlrec_last_error());
  for (size_t i = 0; i < (size_t)B * F * dim && !test_failed_now(); i++)
    if (!(fabs(out[i] - ref[i]) <= 1e-6 + 1e-6 * fabs(ref[i])))
      test_fail(__FILE__, __LINE__, "bag dim %u mean %d: out[%zu] = %.9g, reference %.9g", dim, mean, i, out[i],
                ref[i]);
  free(out);
  free(ref);
  batch_free(&tb);
  dlrec_table_free(t);
}

TEST(bag_forward_matches_naive) {
  for (int mean = 0; mean <= 1; mean++) {
    check_bag_forward(1000, 16, 37, 5, 0, 4, mean);
    check_bag_forward(1000, 5, 37, 3, 0, 3, mean);   /* padded rows, generic width */
    check_bag_forward(50, 32, 300, 8, 0, 2, mean);   /* threaded, heavy repeats */
    check_bag_forward(200, 128, 9, 2, 0, 6, mean);
    check_bag_forward(1, 3, 4, 1, 0, 3, mean);        /* a one-row table */
    check_bag_forward(5000, 16, 1000, 8, 1, 1, mean); /* one-hot columns: the fast path, threaded */
    check_bag_forward(5000, 7, 300, 3, 1, 1, mean);
  }
}

/* The lookup takes a fast path for columns whose every sample has exactly
 * one id, decided from the offsets alone. A column that is one-hot except
 * for its last sample (two or three ids, or none) is valid and must pool
 * like any multi-hot column: a detection that ignores the last offset would
 * pool only the last sample's first id (or read one id past the column's
 * ids), with no id out of range to trip the error path. Serial (B = 5) and
 * threaded (B = 300) batches, so the last sample sits in the last chunk. */
TEST(bag_forward_one_hot_but_the_last_sample_matches_naive) {
  const uint64_t rows = 500;
  const uint32_t Bs[] = {5, 300}, dims[] = {16, 7}, last_hot[] = {0, 2, 3};
  for (int mean = 0; mean <= 1; mean++)
    for (size_t bi = 0; bi < 2; bi++)
      for (size_t di = 0; di < 2; di++)
        for (size_t li = 0; li < 3 && !test_failed_now(); li++) {
          const uint32_t B = Bs[bi], dim = dims[di], F = 2, n_last = last_hot[li];
          dlrec_table *t = table_random(rows, dim, 40 + di);
          CHECK(t != NULL);
          test_batch tb;
          batch_make(&tb, B, F, 1, 1, rows, 77 + B);
          /* Column 1's last sample gets n_last ids; its ids array is sized
           * exactly, so that reading past it is a heap overflow under ASan. */
          const uint32_t n_ids = B - 1 + n_last;
          uint32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof(uint32_t));
          memcpy(ids, tb.ids[1], (B - 1) * sizeof(uint32_t));
          for (uint32_t k = 0; k < n_last; k++) ids[B - 1 + k] = (uint32_t)(rows - 1 - 13 * k); /* distinct rows */
          free(tb.ids[1]);
          tb.ids[1] = ids;
          tb.offsets[1][B] = n_ids;
          float *out = malloc((size_t)B * F * dim * sizeof(float));
          double *ref = malloc((size_t)B * F * dim * sizeof(double));
          for (size_t i = 0; i < (size_t)B * F * dim; i++) out[i] = NAN;
          ref_bag_forward(ref, dlrec_table_data(t), dlrec_table_stride(t), dim, &tb.bags, bag_mode(mean));
          if (cpu_bag_forward(out, t, &tb.bags, bag_mode(mean)) != DLREC_OK)
            test_fail(__FILE__, __LINE__, "bag_forward: %s", dlrec_last_error());
          for (size_t i = 0; i < (size_t)B * F * dim && !test_failed_now(); i++)
            if (!(fabs(out[i] - ref[i]) <= 1e-6 + 1e-6 * fabs(ref[i])))
              test_fail(__FILE__, __LINE__, "B %u dim %u mean %d, last bag of %u: out[%zu] = %.9g, reference %.9g", B,
                        dim, mean, n_last, i, out[i], ref[i]);
          free(out);
          free(ref);
          batch_free(&tb);
          dlrec_table_free(t);
        }
}

/* ---- the fused backward ------------------------------------------------------ */

typedef struct backward_ctx {
  dlrec_sparse_optim *o;
  void *scratch;
  size_t scratch_bytes;
} backward_ctx;

static dlrec_status ctx_open(backward_ctx *x, dlrec_table *t, const dlrec_sparse_optim_config *c, uint64_t max_ids) {
  x->scratch_bytes = dlrec_bag_backward_scratch_bytes(t, max_ids);
  x->scratch = malloc(x->scratch_bytes);
  return dlrec_sparse_optim_create(&x->o, t, c);
}

static void ctx_close(backward_ctx *x) {
  dlrec_sparse_optim_free(x->o);
  free(x->scratch);
}

/* The gradient of L = Σ R ⊙ bag(table) with respect to the table, read off
 * an SGD step with lr = 1 (the row's change), against central differences of
 * the double-precision reference. */
static void check_bag_gradient(int mean) {
  const uint64_t rows = 40;
  const uint32_t dim = 6, B = 7, F = 3;
  dlrec_table *t = table_random(rows, dim, 9);
  test_batch tb;
  batch_make(&tb, B, F, 0, 4, rows, 100 + mean);
  dlrec_rng r;
  dlrec_rng_seed(&r, 10, 0);
  float *R = malloc((size_t)B * F * dim * sizeof(float));
  fill(R, (size_t)B * F * dim, &r, -1, 1);
  const uint32_t stride = dlrec_table_stride(t);
  const size_t n = rows * stride;
  float *before = malloc(n * sizeof(float));
  memcpy(before, dlrec_table_data(t), n * sizeof(float));
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_SGD);
  c.lr = 1.0f;
  backward_ctx x;
  if (ctx_open(&x, t, &c, batch_ids(&tb)) != DLREC_OK ||
      cpu_bag_backward_update(t, x.o, &tb.bags, bag_mode(mean), R, x.scratch,
                                x.scratch_bytes) != DLREC_OK)
    test_fail(__FILE__, __LINE__, "backward: %s", dlrec_last_error());
  double *out = malloc((size_t)B * F * dim * sizeof(double));
  float *pert = malloc(n * sizeof(float));
  memcpy(pert, before, n * sizeof(float));
  /* L is linear in the table, so central differences are exact up to
   * rounding; h is a power of two so that w ± h is exact in float. */
  const float h = 0.125f;
  for (uint64_t row = 0; row < rows && !test_failed_now(); row++)
    for (uint32_t d = 0; d < dim; d++) {
      size_t i = row * stride + d;
      pert[i] = before[i] + h;
      ref_bag_forward(out, pert, stride, dim, &tb.bags, bag_mode(mean));
      double lp = 0, lm = 0;
      for (size_t k = 0; k < (size_t)B * F * dim; k++) lp += out[k] * R[k];
      pert[i] = before[i] - h;
      ref_bag_forward(out, pert, stride, dim, &tb.bags, bag_mode(mean));
      for (size_t k = 0; k < (size_t)B * F * dim; k++) lm += out[k] * R[k];
      pert[i] = before[i];
      double fd = (lp - lm) / (2 * h), got = (double)before[i] - dlrec_table_data(t)[i];
      if (!(fabs(got - fd) <= 1e-5 + 1e-5 * fabs(fd))) {
        test_fail(__FILE__, __LINE__, "mean %d: d table[%llu][%u] = %.7g, finite difference %.7g", mean,
                  (unsigned long long)row, d, got, fd);
        break;
      }
    }
  ctx_close(&x);
  free(R), free(before), free(out), free(pert);
  batch_free(&tb);
  dlrec_table_free(t);
}

TEST(bag_backward_gradient_matches_finite_differences) {
  check_bag_gradient(0);
  check_bag_gradient(1);
}

TEST(bag_backward_sums_repeated_rows_exactly) {
  /* From a zero table, SGD with lr = 1 leaves -g in each row: with sum
   * pooling that is the float sum of the row's output gradients in (column,
   * sample, position) order, bitwise. Rows 0 and 1 repeat within bags and
   * across columns; row 2 is never touched. */
  dlrec_table *t;
  CHECK_OK(dlrec_table_create(&t, 4, 3));
  uint32_t off0[] = {0, 3, 4}, ids0[] = {1, 0, 1, 3};
  uint32_t off1[] = {0, 0, 2}, ids1[] = {1, 1};
  const uint32_t *offs[] = {off0, off1}, *idss[] = {ids0, ids1};
  dlrec_bag_batch bags = {2, 2, offs, idss, NULL};
  /* d_out (B=2, F=2, D=3) */
  float dout[12] = {0.1f, 0.2f, 0.3f, /* b0 c0 */ 9, 9, 9, /* b0 c1: empty bag */
                    1e7f, -1.0f, 0.5f, /* b1 c0 */ 1.0f, 3.0f, -2.0f /* b1 c1 */};
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_SGD);
  c.lr = 1.0f;
  backward_ctx x;
  CHECK_OK(ctx_open(&x, t, &c, 6));
  CHECK_OK(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes));
  const float *w = dlrec_table_data(t);
  for (int d = 0; d < 3; d++) {
    float g0 = 0.0f + dout[d];                                      /* row 0: b0 c0 */
    float g1 = ((((0.0f + dout[d]) + dout[d]) + dout[9 + d]) + dout[9 + d]); /* b0c0 x2, b1c1 x2 */
    float g3 = 0.0f + dout[6 + d];                                  /* row 3: b1 c0 */
    CHECK(w[0 * 4 + d] == -g0);
    CHECK(w[1 * 4 + d] == -g1);
    CHECK(w[2 * 4 + d] == 0.0f);
    CHECK(w[3 * 4 + d] == -g3);
  }
  /* Mean pooling scales each bag's gradient by 1/|bag|. */
  memset(dlrec_table_data(t), 0, table_bytes(t));
  CHECK_OK(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_MEAN, dout, x.scratch, x.scratch_bytes));
  for (int d = 0; d < 3; d++) {
    CHECK_NEAR(-w[0 * 4 + d], dout[d] / 3.0, 1e-7, 1e-6);
    CHECK_NEAR(-w[1 * 4 + d], 2 * dout[d] / 3.0 + dout[9 + d], 1e-7, 1e-6);
    CHECK(w[2 * 4 + d] == 0.0f);
    CHECK_NEAR(-w[3 * 4 + d], dout[6 + d], 1e-7, 1e-6);
  }
  /* Per-column pooling: column 0 by its mean (as an ETL schema may declare
   * it), column 1 by the mode's sum. */
  const uint8_t mean_cols[2] = {1, 0};
  bags.mean_cols = mean_cols;
  memset(dlrec_table_data(t), 0, table_bytes(t));
  CHECK_OK(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes));
  for (int d = 0; d < 3; d++) {
    CHECK_NEAR(-w[0 * 4 + d], dout[d] / 3.0, 1e-7, 1e-6);
    CHECK_NEAR(-w[1 * 4 + d], 2 * dout[d] / 3.0 + 2 * dout[9 + d], 1e-7, 1e-6);
    CHECK_NEAR(-w[3 * 4 + d], dout[6 + d], 1e-7, 1e-6);
  }
  /* The forward pools the same way: rows 0..3 set to r + 1 in every coordinate. */
  for (int r = 0; r < 4; r++)
    for (int d = 0; d < 3; d++) dlrec_table_data(t)[r * 4 + d] = (float)(r + 1);
  float out[12];
  CHECK_OK(cpu_bag_forward(out, t, &bags, DLREC_POOLING_SUM));
  CHECK_NEAR(out[0], (2 + 1 + 2) / 3.0, 1e-7, 1e-6); /* b0 c0: mean of rows 1, 0, 1 */
  CHECK(out[3] == 0.0f);                              /* b0 c1: empty */
  CHECK(out[6] == 4.0f);                              /* b1 c0: row 3 */
  CHECK(out[9] == 4.0f);                              /* b1 c1: sum of rows 1, 1 */
  ctx_close(&x);
  dlrec_table_free(t);
}

/* The naive reference of the three sparse optimizers is ref.c's
 * ref_bag_backward_update: per batch, a dense gradient of the table summed in
 * float in the promised order, then an update in double of the touched rows. */

/* B = 64 gives a list of a few hundred items; B = 2048 one of ~15000, where
 * runs of a hot row cross the update phase's chunks, the radix sort cuts the
 * list into chunks, and OpenMP threads share the work. */
static void check_sparse_optimizer_eps(dlrec_sparse_optim_kind kind, float wd, int mean, uint32_t B, float eps,
                                       float accum0) {
  const uint64_t rows = 300;
  const uint32_t D = 16, F = 3, STEPS = 4;
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  c.lr = 0.05f;
  c.weight_decay = wd;
  c.eps = eps;
  c.initial_accumulator = accum0;
  dlrec_table *t = table_random(rows, D, 11);
  const uint32_t stride = dlrec_table_stride(t);
  ref_sparse_state s = {calloc(rows * D, sizeof(double)), calloc(rows, sizeof(double)), calloc(rows * D, sizeof(double)),
                 calloc(rows * D, sizeof(double)), calloc(rows, sizeof(uint32_t)), 0};
  for (uint64_t r = 0; r < rows; r++) {
    s.accum[r] = c.initial_accumulator;
    for (uint32_t d = 0; d < D; d++) s.w[r * D + d] = dlrec_table_data(t)[r * stride + d];
  }
  backward_ctx x;
  if (ctx_open(&x, t, &c, (uint64_t)B * F * 4) != DLREC_OK) test_fail(__FILE__, __LINE__, "%s", dlrec_last_error());
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(x.o, &st);
  dlrec_rng r;
  dlrec_rng_seed(&r, 12, (uint64_t)kind);
  float *dout = malloc((size_t)B * F * D * sizeof(float));
  float *before = malloc(rows * stride * sizeof(float));
  for (uint32_t step = 0; step < STEPS && !test_failed_now(); step++) {
    test_batch tb;
    /* Ids from the lower 2/3 of the table only (skewed, so rows repeat): the
     * top third is never touched and must never change. */
    batch_make(&tb, B, F, 0, 4, rows * 2 / 3, 1000 + step);
    fill(dout, (size_t)B * F * D, &r, -1, 1);
    memcpy(before, dlrec_table_data(t), rows * stride * sizeof(float));
    ref_bag_backward_update(&s, &c, &tb.bags, bag_mode(mean), dout, rows, D);
    if (cpu_bag_backward_update(t, x.o, &tb.bags, bag_mode(mean), dout, x.scratch,
                                  x.scratch_bytes) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "backward: %s", dlrec_last_error());
    const float *w = dlrec_table_data(t);
    for (uint64_t row = 0; row < rows && !test_failed_now(); row++) {
      for (uint32_t d = 0; d < D; d++) {
        const double ref = s.w[row * D + d], got = w[row * stride + d];
        if (row >= rows * 2 / 3 && got != before[row * stride + d])
          test_fail(__FILE__, __LINE__, "untouched row %llu changed", (unsigned long long)row);
        else if (!(fabs(got - ref) <= 1e-6 + 1e-5 * fabs(ref)))
          test_fail(__FILE__, __LINE__, "kind %d step %u: w[%llu][%u] = %.9g, reference %.9g", kind, step,
                    (unsigned long long)row, d, got, ref);
        if (test_failed_now()) break;
        if (kind == DLREC_SPARSE_LAZY_ADAM &&
            !(fabs(st.m[row * stride + d] - s.m[row * D + d]) <= 1e-6 &&
              fabs(st.v[row * stride + d] - s.v[row * D + d]) <= 1e-7 + 1e-5 * s.v[row * D + d]))
          test_fail(__FILE__, __LINE__, "Adam state [%llu][%u]: m %.9g vs %.9g, v %.9g vs %.9g",
                    (unsigned long long)row, d, st.m[row * stride + d], s.m[row * D + d], st.v[row * stride + d],
                    s.v[row * D + d]);
      }
      if (kind == DLREC_SPARSE_LAZY_ADAM && st.steps[row] != s.steps[row])
        test_fail(__FILE__, __LINE__, "row %llu: %u Adam steps, reference %u", (unsigned long long)row,
                  st.steps[row], s.steps[row]);
      if (kind == DLREC_SPARSE_ROWWISE_ADAGRAD && !(fabs(st.accum[row] - s.accum[row]) <= 1e-6 * s.accum[row]))
        test_fail(__FILE__, __LINE__, "row %llu: accumulator %.9g, reference %.9g", (unsigned long long)row,
                  st.accum[row], s.accum[row]);
    }
    batch_free(&tb);
  }
  /* Lazy Adam: rows touched in some steps only have fewer steps, and the
   * untouched third none. */
  if (kind == DLREC_SPARSE_LAZY_ADAM && !test_failed_now()) {
    int partial = 0;
    for (uint64_t row = 0; row < rows; row++) {
      partial += st.steps[row] > 0 && st.steps[row] < STEPS;
      if (row >= rows * 2 / 3 && (st.steps[row] != 0 || st.m[row * stride] != 0.0f))
        test_fail(__FILE__, __LINE__, "untouched row %llu has Adam state", (unsigned long long)row);
    }
    if (partial == 0 && B <= 64) test_fail(__FILE__, __LINE__, "test setup: no row skipped a step");
  }
  ctx_close(&x);
  free(dout), free(before);
  free(s.w), free(s.accum), free(s.m), free(s.v), free(s.steps);
  dlrec_table_free(t);
}

/* The same with the default eps, and Adagrad's accumulators starting at 0.1. */
static void check_sparse_optimizer(dlrec_sparse_optim_kind kind, float wd, int mean, uint32_t B) {
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  check_sparse_optimizer_eps(kind, wd, mean, B, c.eps, kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 0.1f : 0.0f);
}

TEST(sparse_sgd_matches_reference) {
  check_sparse_optimizer(DLREC_SPARSE_SGD, 0.0f, 0, 64);
  check_sparse_optimizer(DLREC_SPARSE_SGD, 0.02f, 1, 64);
  check_sparse_optimizer(DLREC_SPARSE_SGD, 0.0f, 0, 2048);
}

TEST(sparse_rowwise_adagrad_matches_reference) {
  check_sparse_optimizer(DLREC_SPARSE_ROWWISE_ADAGRAD, 0.0f, 0, 64);
  check_sparse_optimizer(DLREC_SPARSE_ROWWISE_ADAGRAD, 0.02f, 1, 64);
  check_sparse_optimizer(DLREC_SPARSE_ROWWISE_ADAGRAD, 0.0f, 1, 2048);
}

/* The default eps (1e-10) is far below sqrt(0.1), so eps outside or inside the
 * square root agree to float precision there. An eps of 0.1 against
 * accumulators starting at zero, fed mean squared gradients of about 1/3 per
 * step, changes the step by several percent if eps moves inside the root. */
TEST(sparse_rowwise_adagrad_eps_that_matters_matches_reference) {
  check_sparse_optimizer_eps(DLREC_SPARSE_ROWWISE_ADAGRAD, 0.0f, 0, 64, 0.1f, 0.0f);
  check_sparse_optimizer_eps(DLREC_SPARSE_ROWWISE_ADAGRAD, 0.02f, 1, 64, 0.1f, 0.0f);
}

TEST(sparse_lazy_adam_matches_reference) {
  check_sparse_optimizer(DLREC_SPARSE_LAZY_ADAM, 0.0f, 0, 64);
  check_sparse_optimizer(DLREC_SPARSE_LAZY_ADAM, 0.02f, 1, 64);
  check_sparse_optimizer(DLREC_SPARSE_LAZY_ADAM, 0.0f, 0, 2048);
}

/* Three steps of backward + update from the same start with `threads`
 * threads; returns the table and the optimizer's state concatenated. */
static char *run_steps(dlrec_sparse_optim_kind kind, uint64_t rows, uint32_t dim, int threads, size_t *bytes) {
  dlrec_table *t = table_random(rows, dim, 21);
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  c.weight_decay = 1e-3f;
  const uint32_t B = 2048, F = 6;
  backward_ctx x;
  if (!t || ctx_open(&x, t, &c, (uint64_t)B * F * 3) != DLREC_OK) return NULL;
  float *dout = malloc((size_t)B * F * dim * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, 22, 0);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  int ok = 1;
  for (int step = 0; step < 3 && ok; step++) {
    test_batch tb;
    batch_make(&tb, B, F, 1, 3, rows, 500 + step);
    fill(dout, (size_t)B * F * dim, &r, -1, 1);
    ok = cpu_bag_backward_update(t, x.o, &tb.bags, step == 1 ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM, dout, x.scratch,
                                   x.scratch_bytes) == DLREC_OK;
    batch_free(&tb);
  }
  omp_set_num_threads(keep);
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(x.o, &st);
  const size_t tb_bytes = table_bytes(t);
  size_t extra = 0;
  if (st.accum) extra = rows * sizeof(float);
  if (st.m) extra = 2 * rows * dim * sizeof(float) + rows * sizeof(uint32_t);
  char *all = ok ? malloc(tb_bytes + extra) : NULL;
  if (all) {
    memcpy(all, dlrec_table_data(t), tb_bytes);
    if (st.accum) memcpy(all + tb_bytes, st.accum, rows * sizeof(float));
    if (st.m) {
      memcpy(all + tb_bytes, st.m, rows * dim * sizeof(float));
      memcpy(all + tb_bytes + rows * dim * sizeof(float), st.v, rows * dim * sizeof(float));
      memcpy(all + tb_bytes + 2 * rows * dim * sizeof(float), st.steps, rows * sizeof(uint32_t));
    }
    *bytes = tb_bytes + extra;
  }
  free(dout);
  ctx_close(&x);
  dlrec_table_free(t);
  return all;
}

TEST(sparse_update_bitwise_identical_across_thread_counts) {
  /* 36k ids per batch (threaded paths); rows of 16 and 19 bits, so the radix
   * sort runs 2 passes (result in place) and 3 passes (result in the copy). */
  const uint64_t rows_list[] = {50000, 300000};
  const uint32_t dims[] = {16, 24};
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_LAZY_ADAM; kind++)
    for (int i = 0; i < 2; i++) {
      size_t n1 = 0, n4 = 0;
      char *a = run_steps((dlrec_sparse_optim_kind)kind, rows_list[i], dims[i], 1, &n1);
      char *b = run_steps((dlrec_sparse_optim_kind)kind, rows_list[i], dims[i], 4, &n4);
      int same = a && b && n1 == n4 && memcmp(a, b, n1) == 0;
      free(a);
      free(b);
      if (!a || !b) test_fail(__FILE__, __LINE__, "run failed: %s", dlrec_last_error());
      if (!same) test_fail(__FILE__, __LINE__, "kind %d rows %llu: 1 and 4 threads differ", kind,
                           (unsigned long long)rows_list[i]);
      if (test_failed_now()) return;
    }
}

TEST(one_row_table_needs_no_sort) {
  dlrec_table *t;
  CHECK_OK(dlrec_table_create(&t, 1, 2));
  uint32_t off[] = {0, 2, 3}, ids[] = {0, 0, 0};
  const uint32_t *offs[] = {off}, *idss[] = {ids};
  dlrec_bag_batch bags = {2, 1, offs, idss, NULL};
  float dout[4] = {1, 2, 3, 4};
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_SGD);
  c.lr = 1.0f;
  backward_ctx x;
  CHECK_OK(ctx_open(&x, t, &c, 3));
  CHECK_OK(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes));
  CHECK(dlrec_table_data(t)[0] == -(1.0f + 1.0f + 3.0f));
  CHECK(dlrec_table_data(t)[1] == -(2.0f + 2.0f + 4.0f));
  ctx_close(&x);
  dlrec_table_free(t);
}

/* The backward sorts a batch's items by row with only as many bits as
 * rows - 1 needs; a sort one bit short would leave rows r and r + 2^(bits-1)
 * interleaved, and a row met in two runs is updated twice, which row-wise
 * Adagrad's accumulator shows. Tables of 2, 3 and 257 rows (1, 2 and 9 bits)
 * with ids over the whole table, against the reference. */
TEST(sparse_update_sorts_by_every_bit_of_the_row) {
  static const uint64_t rows_list[] = {2, 3, 257};
  const uint32_t D = 8, B = 64, F = 2;
  for (size_t i = 0; i < sizeof rows_list / sizeof *rows_list && !test_failed_now(); i++) {
    const uint64_t rows = rows_list[i];
    dlrec_sparse_optim_config c;
    dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_ROWWISE_ADAGRAD);
    c.lr = 0.05f;
    dlrec_table *t = table_random(rows, D, 31 + i);
    CHECK(t != NULL);
    const uint32_t stride = dlrec_table_stride(t);
    ref_sparse_state s = {calloc(rows * D, sizeof(double)), calloc(rows, sizeof(double)), calloc(rows * D, sizeof(double)),
                   calloc(rows * D, sizeof(double)), calloc(rows, sizeof(uint32_t)), 0};
    for (uint64_t r = 0; r < rows; r++) {
      s.accum[r] = c.initial_accumulator;
      for (uint32_t d = 0; d < D; d++) s.w[r * D + d] = dlrec_table_data(t)[r * stride + d];
    }
    test_batch tb;
    batch_make(&tb, B, F, 1, 3, rows, 40 + i);
    /* Mirror every other id, so that the skew toward small ids also reaches
     * the top of the table. */
    for (uint32_t cc = 0; cc < F; cc++)
      for (uint32_t k = 1; k < tb.offsets[cc][B]; k += 2) tb.ids[cc][k] = (uint32_t)(rows - 1 - tb.ids[cc][k]);
    /* The setup must reach the top bit: some id at or above 2^(bits-1). */
    const uint64_t top = rows == 2 ? 1 : (uint64_t)1 << (63 - __builtin_clzll(rows - 1));
    int reached = 0;
    for (uint32_t cc = 0; cc < F; cc++)
      for (uint32_t k = 0; k < tb.offsets[cc][B]; k++) reached |= tb.ids[cc][k] >= top;
    if (!reached) test_fail(__FILE__, __LINE__, "test setup: no id of %llu rows has its top bit", (unsigned long long)rows);
    dlrec_rng r;
    dlrec_rng_seed(&r, 50 + i, 0);
    float *dout = malloc((size_t)B * F * D * sizeof(float));
    fill(dout, (size_t)B * F * D, &r, -1, 1);
    ref_bag_backward_update(&s, &c, &tb.bags, DLREC_POOLING_SUM, dout, rows, D);
    backward_ctx x;
    if (ctx_open(&x, t, &c, batch_ids(&tb)) != DLREC_OK ||
        cpu_bag_backward_update(t, x.o, &tb.bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "backward: %s", dlrec_last_error());
    dlrec_sparse_optim_state st;
    dlrec_sparse_optim_state_view(x.o, &st);
    const float *w = dlrec_table_data(t);
    for (uint64_t row = 0; row < rows && !test_failed_now(); row++) {
      if (!(fabs(st.accum[row] - s.accum[row]) <= 1e-6 * s.accum[row]))
        test_fail(__FILE__, __LINE__, "%llu rows: row %llu: accumulator %.9g, reference %.9g",
                  (unsigned long long)rows, (unsigned long long)row, st.accum[row], s.accum[row]);
      for (uint32_t d = 0; d < D && !test_failed_now(); d++) {
        const double ref = s.w[row * D + d], got = w[row * stride + d];
        if (!(fabs(got - ref) <= 1e-6 + 1e-5 * fabs(ref)))
          test_fail(__FILE__, __LINE__, "%llu rows: w[%llu][%u] = %.9g, reference %.9g", (unsigned long long)rows,
                    (unsigned long long)row, d, got, ref);
      }
    }
    ctx_close(&x);
    free(dout);
    free(s.w), free(s.accum), free(s.m), free(s.v), free(s.steps);
    batch_free(&tb);
    dlrec_table_free(t);
  }
}

/* ---- corrupt input ------------------------------------------------------------ */

/* dlrec_bag_check runs a large batch's columns in parallel; what it
 * reports is still the first problem in column order, as a pass in order
 * finds it, and a batch without one passes. */
TEST(bag_check_reports_the_first_bad_column_of_a_large_batch) {
  enum { B = 4096, F = 16 };
  dlrec_table *t = table_random(100, 4, 5);
  CHECK(t != NULL);
  static uint32_t off[F][B + 1], ids[F][B];
  const uint32_t *offs[F], *idss[F];
  for (int c = 0; c < F; c++) {
    for (int b = 0; b <= B; b++) off[c][b] = (uint32_t)b;
    for (int b = 0; b < B; b++) ids[c][b] = (uint32_t)(b * 7 + c) % 100;
    offs[c] = off[c], idss[c] = ids[c];
  }
  dlrec_bag_batch bags = {B, F, offs, idss, NULL};
  CHECK_OK(dlrec_bag_check(t, &bags));
  ids[11][3] = 100;
  ids[5][4000] = 200;
  CHECK_ERR(dlrec_bag_check(t, &bags), DLREC_ERR_INVALID, "column 5, sample 4000: id 200 is outside");
  ids[5][4000] = 0;
  CHECK_ERR(dlrec_bag_check(t, &bags), DLREC_ERR_INVALID, "column 11, sample 3: id 100 is outside");
  ids[11][3] = 0;
  off[15][100] = 50; /* after 99: decreasing */
  CHECK_ERR(dlrec_bag_check(t, &bags), DLREC_ERR_INVALID, "column 15, sample 99: offsets decrease (99 then 50)");
  off[15][100] = 100;
  CHECK_OK(dlrec_bag_check(t, &bags));
  dlrec_table_free(t);
}

TEST(corrupt_batches_are_errors_and_change_nothing) {
  dlrec_table *t = table_random(10, 4, 3);
  CHECK(t != NULL);
  uint32_t off0[] = {0, 1, 3}, ids0[] = {2, 9, 10}; /* 10 is one past the table */
  const uint32_t *offs[] = {off0}, *idss[] = {ids0};
  dlrec_bag_batch bags = {2, 1, offs, idss, NULL};
  float out[8], dout[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_ERR(dlrec_bag_check(t, &bags), DLREC_ERR_INVALID, "column 0, sample 1: id 10 is outside the table of 10 rows");
  CHECK_ERR(cpu_bag_forward(out, t, &bags, DLREC_POOLING_SUM), DLREC_ERR_INVALID, "bag_forward: embedding batch: column 0, sample 1: id 10");
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_LAZY_ADAM);
  backward_ctx x;
  CHECK_OK(ctx_open(&x, t, &c, 3));
  float before[40];
  memcpy(before, dlrec_table_data(t), sizeof before);
  CHECK_ERR(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes),
            DLREC_ERR_INVALID, "id 10 is outside");
  CHECK(memcmp(before, dlrec_table_data(t), sizeof before) == 0);
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(x.o, &st);
  for (int r = 0; r < 10; r++) CHECK(st.steps[r] == 0);

  /* A bad id in a one-hot column (the lookup's fast path). */
  uint32_t hot_off[] = {0, 1, 2}, hot_ids[] = {3, 10};
  const uint32_t *hot_offs[] = {hot_off}, *hot_idss[] = {hot_ids};
  dlrec_bag_batch hot = {2, 1, hot_offs, hot_idss, NULL};
  CHECK_ERR(cpu_bag_forward(out, t, &hot, DLREC_POOLING_SUM), DLREC_ERR_INVALID, "column 0, sample 1: id 10");

  /* Offsets that decrease, or run past the column's end. */
  uint32_t bad_off[] = {0, 3, 1};
  offs[0] = bad_off;
  ids0[2] = 1;
  CHECK_ERR(dlrec_bag_check(t, &bags), DLREC_ERR_INVALID, "offsets decrease");
  CHECK_ERR(cpu_bag_forward(out, t, &bags, DLREC_POOLING_SUM), DLREC_ERR_INVALID, "offsets decrease");
  CHECK_ERR(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes),
            DLREC_ERR_INVALID, "offsets");
  uint32_t bad_off2[] = {2, 3, 1};
  offs[0] = bad_off2;
  CHECK_ERR(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes),
            DLREC_ERR_INVALID, "offsets end (1) before they begin (2)");
  CHECK(memcmp(before, dlrec_table_data(t), sizeof before) == 0);

  /* Scratch planned for a smaller batch, an optimizer of another table. */
  offs[0] = off0;
  CHECK_ERR(cpu_bag_backward_update(t, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, 100), DLREC_ERR_INVALID,
            "scratch of 100 bytes");
  dlrec_table *t2 = table_random(10, 4, 3);
  CHECK_ERR(cpu_bag_backward_update(t2, x.o, &bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes),
            DLREC_ERR_INVALID, "another table");
  CHECK_ERR(cpu_bag_forward(out, t, &bags, (dlrec_pooling)7), DLREC_ERR_INVALID, "mode");
  dlrec_sparse_optim *o2;
  c.beta2 = 1.0f;
  CHECK_ERR(dlrec_sparse_optim_create(&o2, t, &c), DLREC_ERR_INVALID, "betas");
  CHECK_ERR(dlrec_sparse_optim_set_lr(x.o, -1.0f), DLREC_ERR_INVALID, "lr");
  dlrec_table_free(t2);
  ctx_close(&x);
  dlrec_table_free(t);
}

/* ---- 16-bit tables (bf16, fp16) ---------------------------------------------- */

#include "backend/dtype.h"

/* Independent decoders: the value of a bit pattern by the formats'
 * definitions, with ldexp (no bit tricks shared with backend/dtype.h). */
static double ref_bf16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
  double v = e == 0 ? ldexp(m / 128.0, -126) : ldexp(1.0 + m / 128.0, e - 127);
  return s ? -v : v;
}
static double ref_fp16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp((double)m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}

/* The reference rounding to nearest, ties to the even pattern: a search over
 * every finite pattern of the format (the positive ones, in increasing
 * order: bf16 up to 0x7f7f, fp16 up to 0x7bff). Beyond the largest finite
 * value, IEEE gives infinity from half a last place above it (max_half_ulp). */
static uint16_t ref_round(double x, int bf16) {
  const uint16_t sign = x < 0 ? 0x8000 : 0, top = bf16 ? 0x7f7f : 0x7bff;
  const double ax = fabs(x), max = bf16 ? ref_bf16_value(top) : ref_fp16_value(top);
  const double half_ulp = bf16 ? ldexp(1.0, 127 - 8) : 16.0;
  if (ax >= max + half_ulp) return sign | (bf16 ? 0x7f80 : 0x7c00);
  if (ax >= max) return sign | top;
  uint16_t lo = 0, hi = top; /* the largest pattern whose value <= ax */
  while (lo < hi) {
    uint16_t mid = (uint16_t)(lo + (hi - lo + 1) / 2);
    if ((bf16 ? ref_bf16_value(mid) : ref_fp16_value(mid)) <= ax) lo = mid;
    else hi = (uint16_t)(mid - 1);
  }
  const double a = bf16 ? ref_bf16_value(lo) : ref_fp16_value(lo);
  const double b = bf16 ? ref_bf16_value((uint16_t)(lo + 1)) : ref_fp16_value((uint16_t)(lo + 1));
  if (ax == a) return sign | lo;
  if (ax - a < b - ax || (ax - a == b - ax && !(lo & 1))) return sign | lo;
  return sign | (uint16_t)(lo + 1);
}

TEST(dtype_widening_matches_the_formats_definition) {
  for (uint32_t h = 0; h < 65536; h++) {
    const double b = dtype_bf16_to_f32((uint16_t)h), f = dtype_fp16_to_f32((uint16_t)h);
    const int bnan = ((h >> 7) & 0xff) == 0xff, fnan = ((h >> 10) & 0x1f) == 0x1f;
    if (!bnan && b != ref_bf16_value((uint16_t)h)) test_fail(__FILE__, __LINE__, "bf16 %04x: %.9g", h, b);
    if (!fnan && f != ref_fp16_value((uint16_t)h)) test_fail(__FILE__, __LINE__, "fp16 %04x: %.9g", h, f);
    if (test_failed_now()) return;
  }
}

TEST(dtype_round_to_nearest_known_values_and_reference) {
  /* Known values: ties go to the even pattern. */
  CHECK_EQ(dtype_f32_to_bf16(1.0f), 0x3f80);
  CHECK_EQ(dtype_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);        /* tie, even below */
  CHECK_EQ(dtype_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);    /* tie, even above */
  CHECK_EQ(dtype_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  CHECK_EQ(dtype_f32_to_bf16(-2.5f), 0xc020);
  CHECK_EQ(dtype_f32_to_fp16(1.0f), 0x3c00);
  CHECK_EQ(dtype_f32_to_fp16(1.0f + 0x1p-11f), 0x3c00);       /* tie, even below */
  CHECK_EQ(dtype_f32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);   /* tie, even above */
  CHECK_EQ(dtype_f32_to_fp16(-2.5f), 0xc100);
  CHECK_EQ(dtype_f32_to_fp16(65504.0f), 0x7bff);
  CHECK_EQ(dtype_f32_to_fp16(65519.0f), 0x7bff);
  CHECK_EQ(dtype_f32_to_fp16(65520.0f), 0x7c00);              /* rounds to infinity */
  CHECK_EQ(dtype_f32_to_fp16(0x1p-24f), 0x0001);              /* the smallest subnormal */
  CHECK_EQ(dtype_f32_to_fp16(0x1p-25f), 0x0000);              /* tie, even below */
  CHECK_EQ(dtype_f32_to_fp16(3 * 0x1p-25f), 0x0002);          /* tie, even above */
  CHECK_EQ(dtype_f32_to_fp16(0x1p-14f - 0x1p-26f), 0x0400);   /* up into the normals */
  CHECK(isnan(dtype_bf16_to_f32(dtype_f32_to_bf16(NAN))));
  CHECK(isnan(dtype_fp16_to_f32(dtype_f32_to_fp16(NAN))));
  CHECK_EQ(dtype_f32_to_bf16(INFINITY), 0x7f80);
  /* Random values over each format's whole range, and the exact midpoints
   * between random neighbours, against the reference search. */
  dlrec_rng r;
  dlrec_rng_seed(&r, 77, 0);
  for (int i = 0; i < 200000 && !test_failed_now(); i++) {
    const int bf16 = i & 1;
    float x;
    if (i % 4 < 2) {
      const int e = bf16 ? (int)dlrec_rng_below(&r, 250) - 130 : (int)dlrec_rng_below(&r, 44) - 28;
      x = (float)ldexp(1.0 + dlrec_rng_uniform(&r), e);
    } else {
      const uint16_t h = (uint16_t)dlrec_rng_below(&r, bf16 ? 0x7f7f : 0x7bff);
      x = bf16 ? (float)((ref_bf16_value(h) + ref_bf16_value((uint16_t)(h + 1))) / 2)
               : (float)((ref_fp16_value(h) + ref_fp16_value((uint16_t)(h + 1))) / 2);
    }
    if (dlrec_rng_below(&r, 2)) x = -x;
    const uint16_t got = bf16 ? dtype_f32_to_bf16(x) : dtype_f32_to_fp16(x), want = ref_round(x, bf16);
    if (got != want) test_fail(__FILE__, __LINE__, "%s(%.9g) = %04x, reference %04x", bf16 ? "bf16" : "fp16", x, got, want);
  }
}

/* Stochastic rounding: always one of the two neighbours, the upper one with
 * probability equal to the dropped fraction, so the mean of many roundings
 * is the value. With N draws the mean's standard deviation is at most
 * ulp / (2 sqrt N) = 0.0011 ulp for N = 200000: the tolerance, 0.01 ulp, is
 * 9 of those; round to nearest would miss by 0.3 ulp or more here. */
TEST(dtype_stochastic_rounding_is_unbiased_and_deterministic) {
  const float fracs[] = {0.3f, 0.7f, 0.05f, 0.5f};
  const int N = 200000;
  for (int bf16 = 0; bf16 <= 1; bf16++)
    for (int i = 0; i < 4; i++)
      for (int neg = 0; neg <= 1; neg++) {
        /* Between the neighbours lo and hi, at fraction fracs[i]; one pair
         * with fp16 subnormals. */
        const uint16_t lo = bf16 ? (i == 3 ? 0x0010 : 0x3fa5) : (i == 3 ? 0x0123 : 0x3d37);
        const double a = bf16 ? ref_bf16_value(lo) : ref_fp16_value(lo);
        const double b = bf16 ? ref_bf16_value((uint16_t)(lo + 1)) : ref_fp16_value((uint16_t)(lo + 1));
        const float x = (float)((a + fracs[i] * (b - a)) * (neg ? -1 : 1));
        const double ulp = b - a;
        double sum = 0;
        for (int k = 0; k < N; k++) {
          const uint32_t draw = (uint32_t)(dtype_sr_draws((uint64_t)k, 5, 0) & 0xffff);
          const uint16_t h = bf16 ? dtype_f32_to_bf16_sr(x, draw) : dtype_f32_to_fp16_sr(x, draw);
          const double v = bf16 ? ref_bf16_value(h) : ref_fp16_value(h);
          if (fabs(v) != a && fabs(v) != b) {
            test_fail(__FILE__, __LINE__, "%.9g rounded to %04x, not a neighbour", x, h);
            return;
          }
          sum += v;
        }
        const double bias = (sum / N - x) / ulp;
        if (!(fabs(bias) <= 0.01))
          test_fail(__FILE__, __LINE__, "%s, %.9g: mean off by %.4f ulp", bf16 ? "bf16" : "fp16", x, bias);
        /* Deterministic: the same draw gives the same bits. */
        const uint32_t d0 = (uint32_t)(dtype_sr_draws(42, 9, 3) & 0xffff);
        CHECK_EQ(bf16 ? dtype_f32_to_bf16_sr(x, d0) : dtype_f32_to_fp16_sr(x, d0),
                 bf16 ? dtype_f32_to_bf16_sr(x, d0) : dtype_f32_to_fp16_sr(x, d0));
      }
  /* A representable value is never moved. */
  for (uint32_t d = 0; d < 65536; d += 4099) {
    CHECK_EQ(dtype_f32_to_bf16_sr(1.5f, d), 0x3fc0);
    CHECK_EQ(dtype_f32_to_fp16_sr(1.5f, d), 0x3e00);
  }
  /* The draws are a pure function of (counter, row, group) and differ
   * between neighbouring keys. */
  CHECK_EQ_U64(dtype_sr_draws(7, 3, 1), dtype_sr_draws(7, 3, 1));
  CHECK(dtype_sr_draws(7, 3, 1) != dtype_sr_draws(8, 3, 1));
  CHECK(dtype_sr_draws(7, 3, 1) != dtype_sr_draws(7, 4, 1));
  CHECK(dtype_sr_draws(7, 3, 1) != dtype_sr_draws(7, 3, 2));
}

/* An fp32 table holding a 16-bit table's rows, widened. */
static dlrec_table *table_widened(dlrec_table *t16) {
  dlrec_table *t = NULL;
  if (dlrec_table_create(&t, dlrec_table_rows(t16), dlrec_table_dim(t16)) != DLREC_OK) return NULL;
  float row[DLREC_EMBED_MAX_DIM];
  for (uint64_t r = 0; r < dlrec_table_rows(t16); r++) {
    dlrec_table_get_row(t16, r, row);
    dlrec_table_set_row(t, r, row);
  }
  return t;
}

static dlrec_table *table_random16(uint64_t rows, uint32_t dim, dlrec_table_dtype dtype, uint64_t seed) {
  dlrec_table *t = NULL;
  if (dlrec_table_create_dtype(&t, rows, dim, dtype) != DLREC_OK) return NULL;
  dlrec_row_range all = {.begin = 0, .end = rows};
  if (dlrec_table_init_uniform(t, &all, 1, seed) != DLREC_OK) {
    dlrec_table_free(t);
    return NULL;
  }
  return t;
}

TEST(table_16bit_halves_the_memory_and_rounds_the_initial_rows) {
  dlrec_table *t16 = table_random16(1000, 16, DLREC_TABLE_BF16, 4), *t32 = table_random(1000, 16, 4);
  CHECK(t16 && t32);
  CHECK_EQ(dlrec_table_get_dtype(t16), DLREC_TABLE_BF16);
  CHECK(dlrec_table_data(t16) == NULL); /* no float view of 16-bit rows */
  CHECK_EQ(dlrec_table_dtype_bytes(DLREC_TABLE_BF16) * 2, dlrec_table_dtype_bytes(DLREC_TABLE_FP32));
  /* The initial rows are the fp32 table's, rounded to nearest. */
  const uint16_t *raw = dlrec_table_raw_const(t16);
  const uint32_t stride = dlrec_table_stride(t16);
  for (uint64_t r = 0; r < 1000 && !test_failed_now(); r++)
    for (uint32_t d = 0; d < 16; d++) CHECK_EQ(raw[r * stride + d], ref_round(dlrec_table_data(t32)[r * stride + d], 1));
  dlrec_table *bad = NULL;
  CHECK_ERR(dlrec_table_create_dtype(&bad, 10, 16, (dlrec_table_dtype)7), DLREC_ERR_INVALID, "unknown dtype");
  CHECK(bad == NULL);
  dlrec_table_free(t16);
  dlrec_table_free(t32);
}

TEST(bag_forward_16bit_equals_fp32_pooling_of_the_widened_rows) {
  const dlrec_table_dtype dtypes[] = {DLREC_TABLE_BF16, DLREC_TABLE_FP16};
  const uint32_t dims[] = {16, 19};
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 2; i++)
      for (int hot = 0; hot <= 1; hot++)
        for (int mean = 0; mean <= 1; mean++) {
          const uint64_t rows = 5000;
          const uint32_t D = dims[i], B = 300, F = 4;
          dlrec_table *t16 = table_random16(rows, D, dtypes[k], 8 + i);
          dlrec_table *t32 = t16 ? table_widened(t16) : NULL;
          CHECK(t16 && t32);
          test_batch tb;
          batch_make(&tb, B, F, hot ? 1 : 0, hot ? 1 : 5, rows, 90 + i);
          uint8_t mean_cols[4] = {0, 1, 0, 0};
          tb.bags.mean_cols = mean_cols;
          float *a = malloc((size_t)B * F * D * sizeof(float)), *b = malloc((size_t)B * F * D * sizeof(float));
          const dlrec_pooling mode = mean ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM;
          CHECK_OK(cpu_bag_forward(a, t16, &tb.bags, mode));
          CHECK_OK(cpu_bag_forward(b, t32, &tb.bags, mode));
          if (memcmp(a, b, (size_t)B * F * D * sizeof(float)))
            test_fail(__FILE__, __LINE__, "%s dim %u hot %d mean %d: pooling differs from fp32's",
                      dlrec_table_dtype_name(dtypes[k]), D, hot, mean);
          /* And a bad id is refused as on fp32. */
          tb.ids[2][0] = (uint32_t)rows;
          CHECK_ERR(cpu_bag_forward(a, t16, &tb.bags, mode), DLREC_ERR_INVALID, "outside the table");
          free(a), free(b);
          batch_free(&tb);
          dlrec_table_free(t16);
          dlrec_table_free(t32);
          if (test_failed_now()) return;
        }
}

/* cpu_bag_forward_rows pools each listed bag with the bits the whole-batch
 * forward gives it, into its place in the list, and writes nothing else:
 * fp32, bf16 and fp16 tables; sum and mean, a mean column; one-hot columns
 * (the whole batch's fast path) beside multi-hot ones with empty bags;
 * lists out of order with repeats, threaded (over 32 bags) and not. A bad
 * id is refused in a listed bag and not read in an unlisted one; a list
 * entry past the batch is refused. */
TEST(bag_forward_rows_pools_the_listed_bags_as_the_batch_does) {
  const dlrec_table_dtype dtypes[] = {DLREC_TABLE_FP32, DLREC_TABLE_BF16, DLREC_TABLE_FP16};
  const uint32_t dims[] = {16, 7, 128};
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 3; i++)
      for (int mean = 0; mean <= 1; mean++) {
        const uint64_t rows = 3000;
        const uint32_t D = dims[i], B = 200, F = 4;
        dlrec_table *t = dtypes[k] == DLREC_TABLE_FP32 ? table_random(rows, D, 3 + i)
                                                       : table_random16(rows, D, dtypes[k], 3 + i);
        CHECK(t != NULL);
        test_batch tb, one;
        batch_make(&tb, B, F, 0, 4, rows, 60 + i);
        batch_make(&one, B, F, 1, 1, rows, 61 + i); /* columns 0 and 2 one-hot */
        for (uint32_t c = 0; c < F; c += 2) {
          uint32_t *o = tb.offsets[c], *d = tb.ids[c];
          tb.offsets[c] = one.offsets[c], tb.ids[c] = one.ids[c];
          one.offsets[c] = o, one.ids[c] = d;
        }
        uint8_t mean_cols[4] = {0, 1, 1, 0};
        tb.bags.mean_cols = mean_cols;
        const dlrec_pooling mode = bag_mode(mean);
        float *all = malloc((size_t)B * F * D * sizeof(float));
        CHECK_OK(cpu_bag_forward(all, t, &tb.bags, mode));
        dlrec_rng r;
        dlrec_rng_seed(&r, 70 + i, 0);
        const size_t ns[] = {1, 31, 500};
        for (size_t q = 0; q < 3 && !test_failed_now(); q++) {
          const size_t n = ns[q];
          uint32_t *list = malloc(n * sizeof(uint32_t));
          for (size_t j = 0; j < n; j++) list[j] = (uint32_t)dlrec_rng_below(&r, B * F);
          float *out = malloc((n * D + 8) * sizeof(float));
          for (size_t j = 0; j < n * D + 8; j++) out[j] = -7.0f;
          CHECK_OK(cpu_bag_forward_rows(t, &tb.bags, mode, list, n, out));
          for (size_t j = 0; j < n && !test_failed_now(); j++)
            if (memcmp(out + j * D, all + (size_t)list[j] * D, D * sizeof(float)))
              test_fail(__FILE__, __LINE__, "%s dim %u mean %d: listed bag %zu (bag %u) differs from the batch's",
                        dlrec_table_dtype_name(dtypes[k]), D, mean, j, list[j]);
          for (size_t j = n * D; j < n * D + 8; j++) CHECK(out[j] == -7.0f);
          /* A bad id where the list does not look is not read; where it
           * does, it is refused. */
          const uint32_t b = list[0] / F, c = list[0] % F, other = (list[0] + 1) % (B * F);
          int listed = 0;
          for (size_t j = 0; j < n; j++) listed |= list[j] == other;
          if (!listed && tb.offsets[other % F][other / F + 1] > tb.offsets[other % F][other / F]) {
            uint32_t *id = &tb.ids[other % F][tb.offsets[other % F][other / F]], keep = *id;
            *id = (uint32_t)rows;
            CHECK_OK(cpu_bag_forward_rows(t, &tb.bags, mode, list, n, out));
            *id = keep;
          }
          if (tb.offsets[c][b + 1] > tb.offsets[c][b]) {
            uint32_t *id = &tb.ids[c][tb.offsets[c][b]], keep = *id;
            *id = (uint32_t)rows;
            CHECK_ERR(cpu_bag_forward_rows(t, &tb.bags, mode, list, n, out), DLREC_ERR_INVALID,
                      "outside the table");
            *id = keep;
          }
          list[n - 1] = B * F;
          CHECK_ERR(cpu_bag_forward_rows(t, &tb.bags, mode, list, n, out), DLREC_ERR_INVALID, "bag 800 of a batch");
          free(list), free(out);
        }
        CHECK_ERR(cpu_bag_forward_rows(t, &tb.bags, mode, NULL, 3, all), DLREC_ERR_INVALID, "NULL list");
        CHECK_OK(cpu_bag_forward_rows(t, &tb.bags, mode, NULL, 0, all));
        free(all);
        batch_free(&tb);
        batch_free(&one);
        dlrec_table_free(t);
        if (test_failed_now()) return;
      }
}

/* The sparse update of a 16-bit table is the fp32 update of its widened rows
 * (the fp32 engine, itself checked against the naive reference above, and
 * here against it again to a 16-bit last place), then stochastic rounding
 * with the draw of (update number, row, coordinate). Untouched rows keep
 * their bits. Three steps, so later steps start from rounded rows. */
static void check_sparse_16bit(dlrec_sparse_optim_kind kind, dlrec_table_dtype dtype, uint32_t D, uint32_t B) {
  const uint64_t rows = 400;
  const uint32_t F = 3;
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  c.lr = 0.05f;
  c.weight_decay = 1e-3f;
  dlrec_table *t16 = table_random16(rows, D, dtype, 31), *t32 = NULL;
  backward_ctx x16, x32;
  float *dout = malloc((size_t)B * F * D * sizeof(float));
  uint16_t *before = malloc(rows * dlrec_table_stride(t16) * sizeof(uint16_t));
  const uint32_t stride = dlrec_table_stride(t16);
  ref_sparse_state s = {calloc(rows * D, sizeof(double)), calloc(rows, sizeof(double)), calloc(rows * D, sizeof(double)),
                 calloc(rows * D, sizeof(double)), calloc(rows, sizeof(uint32_t)), 0};
  CHECK_OK(ctx_open(&x16, t16, &c, (uint64_t)B * F * 4));
  dlrec_rng r;
  dlrec_rng_seed(&r, 32, 0);
  for (uint64_t step = 0; step < 3 && !test_failed_now(); step++) {
    /* The fp32 side restarts from the 16-bit rows (and the same optimizer
     * state, so only the first step's Adam/Adagrad state is compared: start
     * each step's fp32 optimizer as a copy of the 16-bit one's). */
    t32 = table_widened(t16);
    CHECK_OK(ctx_open(&x32, t32, &c, (uint64_t)B * F * 4));
    dlrec_sparse_optim_state s16, s32;
    dlrec_sparse_optim_state_view(x16.o, &s16);
    dlrec_sparse_optim_state_view(x32.o, &s32);
    if (s16.accum) memcpy(s32.accum, s16.accum, rows * sizeof(float));
    if (s16.m) {
      memcpy(s32.m, s16.m, rows * stride * sizeof(float));
      memcpy(s32.v, s16.v, rows * stride * sizeof(float));
      memcpy(s32.steps, s16.steps, rows * sizeof(uint32_t));
    }
    CHECK(s16.updates && *s16.updates == step && s32.updates == NULL);
    for (uint64_t row = 0; row < rows; row++) {
      float w[DLREC_EMBED_MAX_DIM];
      dlrec_table_get_row(t16, row, w);
      for (uint32_t d = 0; d < D; d++) s.w[row * D + d] = w[d];
      if (s16.accum) s.accum[row] = s16.accum[row];
      if (s16.m) {
        for (uint32_t d = 0; d < D; d++) s.m[row * D + d] = s16.m[row * stride + d], s.v[row * D + d] = s16.v[row * stride + d];
        s.steps[row] = s16.steps[row];
      }
    }
    memcpy(before, dlrec_table_raw_const(t16), rows * stride * sizeof(uint16_t));
    test_batch tb;
    batch_make(&tb, B, F, 0, 4, rows / 2, 700 + step); /* the upper half is never touched */
    fill(dout, (size_t)B * F * D, &r, -1, 1);
    ref_bag_backward_update(&s, &c, &tb.bags, DLREC_POOLING_SUM, dout, rows, D);
    CHECK_OK(cpu_bag_backward_update(t16, x16.o, &tb.bags, DLREC_POOLING_SUM, dout, x16.scratch, x16.scratch_bytes));
    CHECK_OK(cpu_bag_backward_update(t32, x32.o, &tb.bags, DLREC_POOLING_SUM, dout, x32.scratch, x32.scratch_bytes));
    const uint16_t *got = dlrec_table_raw_const(t16);
    const float *w32 = dlrec_table_data(t32);
    for (uint64_t row = 0; row < rows && !test_failed_now(); row++)
      for (uint32_t d = 0; d < D && !test_failed_now(); d++) {
        const size_t at = row * stride + d;
        const int touched = w32[at] != (dtype == DLREC_TABLE_BF16 ? dtype_bf16_to_f32(before[at]) : dtype_fp16_to_f32(before[at]));
        const uint32_t draw = (uint32_t)(dtype_sr_draws(step, (uint32_t)row, d / 4) >> (16 * (d % 4))) & 0xffff;
        const uint16_t want = !touched ? before[at]
                              : dtype == DLREC_TABLE_BF16 ? dtype_f32_to_bf16_sr(w32[at], draw)
                                                          : dtype_f32_to_fp16_sr(w32[at], draw);
        if (row >= rows / 2 && got[at] != before[at])
          test_fail(__FILE__, __LINE__, "untouched row %llu changed", (unsigned long long)row);
        else if (got[at] != want)
          test_fail(__FILE__, __LINE__, "%s kind %d step %llu: [%llu][%u] = %04x, fp32 update then rounding %04x",
                    dlrec_table_dtype_name(dtype), kind, (unsigned long long)step, (unsigned long long)row, d, got[at],
                    want);
        /* Against the naive reference: within one 16-bit last place. */
        const double v = dtype == DLREC_TABLE_BF16 ? ref_bf16_value(got[at]) : ref_fp16_value(got[at]);
        const double ulp = fabs(v) * (dtype == DLREC_TABLE_BF16 ? 0x1p-7 : 0x1p-10) + 0x1p-24;
        if (!(fabs(v - s.w[row * D + d]) <= ulp * 1.01 + 1e-6))
          test_fail(__FILE__, __LINE__, "[%llu][%u] = %.9g, naive reference %.9g", (unsigned long long)row, d, v,
                    s.w[row * D + d]);
      }
    batch_free(&tb);
    ctx_close(&x32);
    dlrec_table_free(t32);
  }
  ctx_close(&x16);
  free(dout), free(before);
  free(s.w), free(s.accum), free(s.m), free(s.v), free(s.steps);
  dlrec_table_free(t16);
}

TEST(sparse_update_16bit_is_the_fp32_update_then_stochastic_rounding) {
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_LAZY_ADAM; kind++) {
    check_sparse_16bit((dlrec_sparse_optim_kind)kind, DLREC_TABLE_BF16, 16, 64);
    check_sparse_16bit((dlrec_sparse_optim_kind)kind, DLREC_TABLE_FP16, 19, 2048);
    if (test_failed_now()) return;
  }
}

/* A bf16 table's updates are bitwise the same at 1 and 4 threads. */
static uint16_t *run_steps16(dlrec_table_dtype dtype, int threads, size_t *n) {
  const uint64_t rows = 50000;
  const uint32_t D = 16, B = 2048, F = 6;
  dlrec_table *t = table_random16(rows, D, dtype, 21);
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_ROWWISE_ADAGRAD);
  backward_ctx x;
  if (!t || ctx_open(&x, t, &c, (uint64_t)B * F * 3) != DLREC_OK) return NULL;
  float *dout = malloc((size_t)B * F * D * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, 22, 0);
  const int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  int ok = 1;
  for (int step = 0; step < 3 && ok; step++) {
    test_batch tb;
    batch_make(&tb, B, F, 1, 3, rows, 500 + step);
    fill(dout, (size_t)B * F * D, &r, -1, 1);
    ok = cpu_bag_backward_update(t, x.o, &tb.bags, DLREC_POOLING_SUM, dout, x.scratch, x.scratch_bytes) == DLREC_OK;
    batch_free(&tb);
  }
  omp_set_num_threads(keep);
  *n = rows * dlrec_table_stride(t);
  uint16_t *all = ok ? malloc(*n * sizeof(uint16_t)) : NULL;
  if (all) memcpy(all, dlrec_table_raw_const(t), *n * sizeof(uint16_t));
  free(dout);
  ctx_close(&x);
  dlrec_table_free(t);
  return all;
}

TEST(sparse_update_16bit_bitwise_identical_across_thread_counts) {
  for (int k = DLREC_TABLE_BF16; k <= DLREC_TABLE_FP16; k++) {
    size_t n1 = 0, n4 = 0;
    uint16_t *a = run_steps16((dlrec_table_dtype)k, 1, &n1), *b = run_steps16((dlrec_table_dtype)k, 4, &n4);
    CHECK(a && b && n1 == n4);
    if (a && b) CHECK(memcmp(a, b, n1 * sizeof(uint16_t)) == 0);
    free(a), free(b);
  }
}
