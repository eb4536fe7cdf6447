/* The loader: every row exactly once per epoch, determinism across threads,
 * seeds and epochs, exact resume, drop_last, file order, errors in order.
 *
 * Rows identify themselves: row r of the stream (counted across files) has
 * dense = (r, -r), label r % 2, id r in column "row", and ids derived from r
 * in the multi-hot and variable columns, so every batch is checked against
 * what the row must hold, independently of how the loader got it there. */
#include <sys/resource.h>
#include <unistd.h>

#include "data/dlr.h"
#include "data/loader.h"
#include "test.h"

#define ROW_IDS (1u << 20)

static void schema_for_tests(dlrec_schema *s) {
  memset(s, 0, sizeof *s);
  s->has_label = 1;
  strcpy(s->label_name, "label");
  s->n_dense = 2;
  strcpy(s->dense_names[0], "r");
  strcpy(s->dense_names[1], "minus_r");
  s->n_sparse = 3;
  strcpy(s->sparse[0].name, "row");
  s->sparse[0].hotness = s->sparse[0].max_hotness = 1;
  s->sparse[0].id_begin = 0;
  s->sparse[0].id_end = ROW_IDS;
  strcpy(s->sparse[1].name, "pair");
  s->sparse[1].hotness = s->sparse[1].max_hotness = 2;
  s->sparse[1].id_begin = ROW_IDS;
  s->sparse[1].id_end = ROW_IDS + 1000;
  strcpy(s->sparse[2].name, "var");
  s->sparse[2].hotness = 0;
  s->sparse[2].max_hotness = 3;
  s->sparse[2].id_begin = ROW_IDS + 1000;
  s->sparse[2].id_end = ROW_IDS + 2000;
  s->table_rows = ROW_IDS + 2000;
}

static uint32_t pair_id(uint32_t r, uint32_t j) { return ROW_IDS + (r * 7 + j * 3) % 1000; }
static uint32_t var_n(uint32_t r) { return r % 4; } /* 0..3 ids */
static uint32_t var_id(uint32_t r, uint32_t j) { return ROW_IDS + 1000 + (r * 5 + j) % 1000; }

/* Writes rows [first, first + sum(sizes)) as groups of the given sizes. */
static dlrec_status write_rows(const char *path, uint32_t first, const uint32_t *sizes, int n_groups) {
  dlrec_schema s;
  schema_for_tests(&s);
  dlrec_dlr_writer *w;
  dlrec_status st = dlrec_dlr_writer_open(&w, path, &s);
  if (st != DLREC_OK) return st;
  uint32_t r0 = first;
  for (int gi = 0; gi < n_groups && st == DLREC_OK; gi++) {
    uint32_t n = sizes[gi];
    float *lab = malloc(n * 4), *dense = malloc(n * 8);
    uint32_t *row = malloc(n * 4), *pair = malloc(n * 8), *off = malloc((n + 1) * 4), *var = malloc(n * 12 + 4);
    off[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t r = r0 + i;
      lab[i] = (float)(r % 2);
      dense[2 * i] = (float)r;
      dense[2 * i + 1] = -(float)r;
      row[i] = r;
      pair[2 * i] = pair_id(r, 0);
      pair[2 * i + 1] = pair_id(r, 1);
      off[i + 1] = off[i];
      for (uint32_t j = 0; j < var_n(r); j++) var[off[i + 1]++] = var_id(r, j);
    }
    dlrec_rowgroup rg = {.rows = n, .labels = lab, .dense = dense};
    rg.ids[0] = row;
    rg.ids[1] = pair;
    rg.offsets[2] = off;
    rg.ids[2] = var;
    st = dlrec_dlr_writer_append(w, &rg);
    free(lab), free(dense), free(row), free(pair), free(off), free(var);
    r0 += n;
  }
  if (st != DLREC_OK) {
    dlrec_dlr_writer_abort(w);
    return st;
  }
  return dlrec_dlr_writer_finish(w);
}

/* A stream of `rows` rows in n_files files, with group sizes cycling through
 * an irregular pattern (so windows and slices cut groups unevenly). */
typedef struct stream {
  int n_files;
  const char *paths[4];
  char path_buf[4][2048];
  uint32_t rows;
} stream;

static int make_stream(stream *st, const char *name, uint32_t rows, int n_files) {
  static const uint32_t pattern[] = {50, 13, 100, 1, 77, 64, 31};
  st->n_files = n_files;
  st->rows = rows;
  uint32_t first = 0;
  for (int f = 0; f < n_files; f++) {
    uint32_t want = rows / (uint32_t)n_files + (f == n_files - 1 ? rows % (uint32_t)n_files : 0);
    uint32_t sizes[4096];
    int n = 0;
    for (uint32_t left = want; left;) {
      uint32_t g = pattern[(n + f) % 7];
      sizes[n++] = g < left ? g : left;
      left -= sizes[n - 1];
    }
    char nm[64];
    snprintf(nm, sizeof nm, "%s.%d.dlr", name, f);
    snprintf(st->path_buf[f], sizeof st->path_buf[f], "%s", test_path(nm));
    st->paths[f] = st->path_buf[f];
    if (write_rows(st->paths[f], first, sizes, n) != DLREC_OK) return 0;
    first += want;
  }
  return 1;
}

/* Checks every row of a batch against what row r must hold; appends the
 * row numbers to out. Returns 0 (and reports) on a mismatch. */
static int check_batch(const dlrec_batch *b, uint32_t *out) {
  for (uint32_t i = 0; i < b->rows; i++) {
    uint32_t r = (uint32_t)b->dense[2 * i];
    int ok = b->dense[2 * i + 1] == -(float)r && b->labels[i] == (float)(r % 2) && b->offsets[0][i] == i &&
             b->ids[0][i] == r && b->offsets[1][i] == 2 * i && b->ids[1][2 * i] == pair_id(r, 0) &&
             b->ids[1][2 * i + 1] == pair_id(r, 1);
    uint32_t a = b->offsets[2][i], z = b->offsets[2][i + 1];
    ok = ok && z - a == var_n(r);
    for (uint32_t j = 0; ok && j < var_n(r); j++) ok = b->ids[2][a + j] == var_id(r, j);
    if (!ok) {
      test_fail(__FILE__, __LINE__, "batch row %u (stream row %u) holds wrong values", i, r);
      return 0;
    }
    out[i] = r;
  }
  if (b->offsets[0][b->rows] != b->rows || b->offsets[1][b->rows] != 2 * b->rows) {
    test_fail(__FILE__, __LINE__, "fixed-hotness offsets do not end at rows * hotness");
    return 0;
  }
  return 1;
}

/* Everything a loader hands out until DLREC_END: rows in order, batch sizes,
 * epochs and end positions. */
typedef struct run {
  uint32_t *rows;
  uint64_t n_rows;
  uint32_t *batch_rows;
  uint64_t *batch_epoch;
  dlrec_position *ends;
  uint64_t n_batches;
} run;

static void run_free(run *r) {
  free(r->rows);
  free(r->batch_rows);
  free(r->batch_epoch);
  free(r->ends);
  memset(r, 0, sizeof *r);
}

/* Reads up to max_batches (all when 0); status of the last next(). */
static dlrec_status drain(dlrec_loader *l, run *r, uint64_t max_batches) {
  uint64_t cap = 1 << 16;
  r->rows = malloc(cap * 4);
  r->batch_rows = malloc(cap * 4);
  r->batch_epoch = malloc(cap * 8);
  r->ends = malloc(cap * sizeof(dlrec_position));
  r->n_rows = r->n_batches = 0;
  for (;;) {
    if (max_batches && r->n_batches == max_batches) return DLREC_OK;
    const dlrec_batch *b;
    dlrec_status st = dlrec_loader_next(l, &b);
    if (st != DLREC_OK) return st;
    if (r->n_rows + b->rows > cap || r->n_batches == cap) {
      test_fail(__FILE__, __LINE__, "test run too long");
      return DLREC_ERR_INTERNAL;
    }
    if (!check_batch(b, r->rows + r->n_rows)) return DLREC_ERR_INTERNAL;
    r->n_rows += b->rows;
    r->batch_rows[r->n_batches] = b->rows;
    r->batch_epoch[r->n_batches] = b->epoch;
    r->ends[r->n_batches++] = b->end;
    dlrec_position p = dlrec_loader_position(l);
    if (p.epoch != b->end.epoch || p.row != b->end.row) {
      test_fail(__FILE__, __LINE__, "position is not the last batch's end");
      return DLREC_ERR_INTERNAL;
    }
  }
}

static dlrec_loader_opts opts(uint32_t batch, uint32_t window, uint32_t slice, uint32_t threads, uint32_t epochs) {
  dlrec_loader_opts o;
  dlrec_loader_opts_default(&o);
  o.batch_rows = batch;
  o.window_groups = window;
  o.slice_rows = slice;
  o.threads = threads;
  o.epochs = epochs;
  o.seed = 1234;
  return o;
}

static int same_rows(const run *a, uint64_t a_from, const run *b, uint64_t b_from, uint64_t n) {
  return a->n_rows >= a_from + n && b->n_rows >= b_from + n && memcmp(a->rows + a_from, b->rows + b_from, n * 4) == 0;
}

/* ---- every row once ---- */

TEST(every_row_exactly_once_per_epoch) {
  stream one, three;
  CHECK(make_stream(&one, "one", 1000, 1));
  CHECK(make_stream(&three, "three", 1777, 3));
  const struct {
    uint32_t batch, window, slice, threads;
    int shuffle;
    stream *s;
  } cfg[] = {
      {64, 8, 32, 1, 1, &one},   {100, 3, 7, 2, 1, &one},     {999, 1, 1, 3, 1, &one},    {1, 2, 5, 1, 1, &one},
      {2048, 8, 32, 2, 1, &one}, {77, 100, 1, 3, 1, &three},  {128, 4, 13, 1, 1, &three}, {33, 2, 1000, 2, 1, &three},
      {50, 8, 32, 3, 0, &three}, {1777, 8, 32, 1, 1, &three},
  };
  for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
    dlrec_loader_opts o = opts(cfg[k].batch, cfg[k].window, cfg[k].slice, cfg[k].threads, 2);
    o.shuffle = cfg[k].shuffle;
    dlrec_loader *l;
    CHECK_OK(dlrec_loader_open(&l, cfg[k].s->paths, cfg[k].s->n_files, &o));
    uint32_t N = cfg[k].s->rows;
    CHECK_EQ_U64(dlrec_loader_epoch_rows(l), N);
    run r;
    dlrec_status st = drain(l, &r, 0);
    dlrec_loader_close(l);
    if (st != DLREC_END) {
      test_fail(__FILE__, __LINE__, "config %zu: %s %s", k, dlrec_status_name(st), dlrec_last_error());
      run_free(&r);
      return;
    }
    CHECK_EQ_U64(r.n_rows, 2ull * N);
    uint8_t *seen = calloc(N, 1);
    uint64_t b = 0, in_epoch = 0;
    for (uint64_t e = 0; e < 2; e++) {
      memset(seen, 0, N);
      for (uint64_t i = e * N; i < (e + 1) * N; i++) {
        CHECK(r.rows[i] < N);
        if (seen[r.rows[i]]++) {
          test_fail(__FILE__, __LINE__, "config %zu: row %u twice in epoch %llu", k, r.rows[i], (unsigned long long)e);
          break;
        }
      }
      /* Full batches, except a short last one per epoch; ends count rows. */
      in_epoch = 0;
      while (b < r.n_batches && r.batch_epoch[b] == e) {
        in_epoch += r.batch_rows[b];
        CHECK(r.batch_rows[b] == cfg[k].batch || in_epoch == N);
        CHECK_EQ_U64(r.ends[b].row, in_epoch);
        CHECK_EQ_U64(r.ends[b].epoch, e);
        b++;
      }
      CHECK_EQ_U64(in_epoch, N);
    }
    CHECK_EQ_U64(b, r.n_batches);
    /* Unshuffled: file order, 0..N-1. */
    if (!cfg[k].shuffle)
      for (uint64_t i = 0; i < 2ull * N; i++) CHECK_EQ(r.rows[i], i % N);
    free(seen);
    run_free(&r);
    if (test_failed_now()) return;
  }
}

/* ---- determinism ---- */

TEST(order_depends_only_on_seed_and_epoch) {
  stream s;
  CHECK(make_stream(&s, "det", 1500, 2));
  run r1, r3, again, other;
  dlrec_loader *l;
  dlrec_loader_opts o = opts(96, 4, 16, 1, 2);
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  CHECK_EQ(drain(l, &r1, 0), DLREC_END);
  dlrec_loader_close(l);
  o.threads = 3;
  o.prefetch = 7;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  CHECK_EQ(drain(l, &r3, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK(same_rows(&r1, 0, &r3, 0, r1.n_rows));
  CHECK_EQ_U64(r1.n_rows, r3.n_rows);
  o.threads = 2;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  CHECK_EQ(drain(l, &again, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK(same_rows(&r1, 0, &again, 0, r1.n_rows));
  /* Shuffled at all, and differently per epoch and per seed. */
  uint64_t in_place = 0;
  for (uint32_t i = 0; i < 1500; i++) in_place += r1.rows[i] == i;
  CHECK(in_place < 100);
  CHECK(!same_rows(&r1, 0, &r1, 1500, 1500));
  o.seed = 1235;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  CHECK_EQ(drain(l, &other, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK(!same_rows(&r1, 0, &other, 0, 1500));
  CHECK(!same_rows(&r1, 1500, &other, 1500, 1500));
  run_free(&r1), run_free(&r3), run_free(&again), run_free(&other);
}

/* Each part of the order changes with the epoch on its own: the group order
 * (window 1, one slice per group: only groups move) and the slice order in a
 * window (window 1: the pattern of row offsets inside each group). */
TEST(group_order_and_slice_order_both_change_per_epoch) {
  const char *p = test_path("equal.dlr");
  uint32_t sizes[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  CHECK_OK(write_rows(p, 0, sizes, 8));
  dlrec_loader *l;
  run r;
  dlrec_loader_opts o = opts(64, 1, 64, 1, 2);
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  int groups_moved = 0;
  for (int w = 0; w < 8; w++) {
    for (int i = 0; i < 64; i++) CHECK_EQ(r.rows[64 * w + i] % 64, i); /* whole groups, in order */
    groups_moved |= r.rows[64 * w] != r.rows[512 + 64 * w];
  }
  CHECK(groups_moved);
  run_free(&r);

  o = opts(64, 1, 4, 1, 2);
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  int pattern_changed = 0;
  for (int w = 0; w < 8; w++)
    for (int i = 0; i < 64; i++) pattern_changed |= r.rows[64 * w + i] % 64 != r.rows[512 + 64 * w + i] % 64;
  CHECK(pattern_changed);
  run_free(&r);
}

/* Counts, over `epochs` epochs of a shuffled stream of n rows read in
 * batches of n (so batch e is epoch e's order), how often row r lands at
 * position i: count[i * n + r]. */
static int position_counts(const char *path, uint32_t window, uint32_t slice, uint32_t n, uint32_t epochs,
                           uint32_t *count) {
  dlrec_loader_opts o = opts(n, window, slice, 1, epochs);
  dlrec_loader *l;
  if (dlrec_loader_open(&l, &path, 1, &o) != DLREC_OK) return 0;
  run r;
  dlrec_status st = drain(l, &r, 0);
  dlrec_loader_close(l);
  int ok = st == DLREC_END && r.n_rows == (uint64_t)n * epochs;
  memset(count, 0, (size_t)n * n * sizeof *count);
  for (uint64_t k = 0; ok && k < r.n_rows; k++) count[(k % n) * n + r.rows[k]]++;
  run_free(&r);
  return ok;
}

/* A uniform shuffle of n items leaves one in place per epoch on average and
 * puts each row at each position 1/n of the time. Sattolo's variant of
 * Fisher-Yates (j below i - 1 instead of below i) only makes cycles, never a
 * fixed point, and an off-by-one in the range skews the positions; both pass
 * every determinism and exactly-once test. 800 epochs of 8: each cell's count
 * is binomial(800, 1/8), 100 +- 9.4, so [50, 150] is more than 5 standard
 * deviations wide (and the seed is fixed anyway). */
static void check_uniform(const uint32_t *count, uint32_t n, uint32_t epochs, const char *what) {
  uint64_t fixed = 0;
  for (uint32_t i = 0; i < n; i++) fixed += count[i * n + i];
  if (fixed < epochs / 2)
    test_fail(__FILE__, __LINE__, "%s: %llu rows stayed in place in %u epochs; a uniform shuffle leaves ~%u",
              what, (unsigned long long)fixed, epochs, epochs);
  const double want = (double)epochs / n;
  for (uint32_t i = 0; i < n * n && !test_failed_now(); i++)
    if (count[i] < want / 2 || count[i] > want * 3 / 2)
      test_fail(__FILE__, __LINE__, "%s: row %u at position %u %u times in %u epochs (expected ~%.0f)", what, i % n,
                i / n, count[i], epochs, want);
}

TEST(shuffles_are_uniform_and_can_leave_a_row_in_place) {
  enum { N = 8, EPOCHS = 800 };
  uint32_t count[N * N];
  /* The slice shuffle alone: one group of 8 rows, slices of one row. */
  const char *one = test_path("one_group.dlr");
  uint32_t sizes[N] = {N};
  CHECK_OK(write_rows(one, 0, sizes, 1));
  CHECK(position_counts(one, 1, 1, N, EPOCHS, count));
  check_uniform(count, N, EPOCHS, "slice shuffle");
  /* The group shuffle alone: 8 groups of one row, windows of one group. */
  const char *eight = test_path("eight_groups.dlr");
  for (int g = 0; g < N; g++) sizes[g] = 1;
  CHECK_OK(write_rows(eight, 0, sizes, N));
  CHECK(position_counts(eight, 1, 1, N, EPOCHS, count));
  check_uniform(count, N, EPOCHS, "group shuffle");
}

TEST(slices_keep_consecutive_rows_together) {
  stream s;
  CHECK(make_stream(&s, "slices", 700, 1));
  dlrec_loader_opts o = opts(700, 8, 25, 1, 1);
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  run r;
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  /* Breaks in consecutiveness: at most one per slice (ceil(rows/25) per group). */
  uint32_t breaks = 0;
  for (uint64_t i = 1; i < r.n_rows; i++) breaks += r.rows[i] != r.rows[i - 1] + 1;
  CHECK(breaks < 700 / 25 + 14);
  CHECK(breaks > 10); /* and shuffled */
  run_free(&r);
}

/* ---- drop_last, empty, options ---- */

TEST(drop_last_drops_only_the_short_batch) {
  stream s;
  CHECK(make_stream(&s, "drop", 1000, 1));
  dlrec_loader_opts o = opts(64, 4, 8, 2, 3);
  o.drop_last = 1;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  run r;
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK_EQ_U64(r.n_batches, 3 * 15);
  for (uint64_t b = 0; b < r.n_batches; b++) {
    CHECK_EQ(r.batch_rows[b], 64);
    CHECK_EQ_U64(r.batch_epoch[b], b / 15);
  }
  /* The kept rows of each epoch are distinct and are that epoch's first 960. */
  uint8_t seen[1000];
  for (int e = 0; e < 3; e++) {
    memset(seen, 0, sizeof seen);
    for (uint64_t i = (uint64_t)e * 960; i < (uint64_t)(e + 1) * 960; i++) CHECK(!seen[r.rows[i]]++);
  }
  run_free(&r);

  /* Fewer rows than a batch: no batch ever, and it ends rather than spins. */
  o.batch_rows = 2000;
  o.epochs = 0;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  const dlrec_batch *b;
  CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
  dlrec_loader_close(l);
}

/* With rows an exact multiple of the batch, the last batch of an epoch is
 * full and drop_last must keep it: every row, every epoch. */
TEST(drop_last_keeps_a_full_last_batch) {
  stream s;
  CHECK(make_stream(&s, "exact", 960, 1));
  dlrec_loader_opts o = opts(64, 4, 8, 2, 3);
  o.drop_last = 1;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  run r;
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK_EQ_U64(r.n_batches, 3 * 15);
  CHECK_EQ_U64(r.n_rows, 3 * 960);
  for (uint64_t b = 0; b < r.n_batches; b++) {
    CHECK_EQ(r.batch_rows[b], 64);
    CHECK_EQ_U64(r.batch_epoch[b], b / 15);
  }
  uint8_t seen[960];
  for (int e = 0; e < 3; e++) {
    memset(seen, 0, sizeof seen);
    for (uint64_t i = (uint64_t)e * 960; i < (uint64_t)(e + 1) * 960; i++) CHECK(r.rows[i] < 960 && !seen[r.rows[i]]++);
  }
  run_free(&r);
  /* Exactly one batch's worth of rows: one batch per epoch, not none. */
  o.batch_rows = 960;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  CHECK_EQ(drain(l, &r, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK_EQ_U64(r.n_batches, 3);
  run_free(&r);
}

TEST(empty_file_and_bad_options) {
  dlrec_schema s;
  schema_for_tests(&s);
  const char *p = test_path("empty.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  CHECK_OK(dlrec_dlr_writer_finish(w));
  dlrec_loader_opts o = opts(10, 2, 2, 2, 0);
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  const dlrec_batch *b;
  CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
  CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
  dlrec_loader_close(l);
  o.batch_rows = 0;
  CHECK_ERR(dlrec_loader_open(&l, &p, 1, &o), DLREC_ERR_INVALID, "batch_rows");
  o = opts(10, 2, 2, 0, 1);
  CHECK_ERR(dlrec_loader_open(&l, &p, 1, &o), DLREC_ERR_INVALID, "threads");
  o = opts(10, 0, 2, 1, 1);
  CHECK_ERR(dlrec_loader_open(&l, &p, 1, &o), DLREC_ERR_INVALID, "window_groups");
  o = opts(10, 2, 2, 1, 1);
  o.prefetch = 0;
  CHECK_ERR(dlrec_loader_open(&l, &p, 1, &o), DLREC_ERR_INVALID, "prefetch");
  o.prefetch = 2;
  CHECK_ERR(dlrec_loader_open(&l, &p, 0, &o), DLREC_ERR_INVALID, "no input files");
  const char *missing = test_path("missing.dlr");
  CHECK_ERR(dlrec_loader_open(&l, &missing, 1, &o), DLREC_ERR_IO, "missing.dlr");
}

TEST(files_with_different_schemas_are_refused) {
  stream s;
  CHECK(make_stream(&s, "a", 100, 1));
  dlrec_schema other;
  schema_for_tests(&other);
  other.sparse[1].hotness = other.sparse[1].max_hotness = 3;
  const char *p = test_path("other.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &other));
  CHECK_OK(dlrec_dlr_writer_finish(w));
  const char *paths[2] = {s.paths[0], p};
  dlrec_loader_opts o = opts(10, 2, 2, 1, 1);
  dlrec_loader *l;
  CHECK_ERR(dlrec_loader_open(&l, paths, 2, &o), DLREC_ERR_INVALID, "other.dlr: its schema differs from");
  CHECK(strstr(dlrec_last_error(), "'pair' hotness 2"));
}

/* ---- resume ---- */

TEST(seek_resumes_exactly_at_every_kind_of_cut) {
  stream s;
  CHECK(make_stream(&s, "resume", 1234, 2));
  dlrec_loader_opts o = opts(100, 3, 9, 2, 3);
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  run full;
  CHECK_EQ(drain(l, &full, 0), DLREC_END);
  /* 13 batches per epoch (12 full + 34 rows), 3 epochs. */
  CHECK_EQ_U64(full.n_batches, 39);
  const uint64_t cuts[] = {1, 2, 7, 12, 13, 14, 20, 25, 26, 27, 38, 39};
  for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
    uint64_t c = cuts[k];
    dlrec_position p = full.ends[c - 1];
    uint64_t rows_before = 0;
    for (uint64_t b = 0; b < c; b++) rows_before += full.batch_rows[b];
    /* A fresh loader with another thread count, and the old loader itself
     * (seeking backwards after it reached the end). */
    for (int fresh = 0; fresh < 2; fresh++) {
      dlrec_loader *m = l;
      dlrec_loader_opts o2 = o;
      o2.threads = 1 + (uint32_t)k % 3;
      if (fresh) CHECK_OK(dlrec_loader_open(&m, s.paths, 2, &o2));
      CHECK_OK(dlrec_loader_seek(m, p));
      dlrec_position q = dlrec_loader_position(m);
      CHECK(q.epoch == p.epoch && q.row == p.row);
      run rest;
      dlrec_status st = drain(m, &rest, 0);
      if (fresh) dlrec_loader_close(m);
      CHECK_EQ(st, DLREC_END);
      if (rest.n_batches != full.n_batches - c || !same_rows(&full, rows_before, &rest, 0, full.n_rows - rows_before))
        test_fail(__FILE__, __LINE__, "cut after batch %llu (fresh %d): %llu batches, expected %llu",
                  (unsigned long long)c, fresh, (unsigned long long)rest.n_batches,
                  (unsigned long long)(full.n_batches - c));
      for (uint64_t b = 0; b < rest.n_batches && !test_failed_now(); b++)
        CHECK(rest.ends[b].epoch == full.ends[c + b].epoch && rest.ends[b].row == full.ends[c + b].row);
      run_free(&rest);
      if (test_failed_now()) break;
    }
    if (test_failed_now()) break;
  }
  /* Back to the start: the whole run again. */
  CHECK_OK(dlrec_loader_seek(l, (dlrec_position){0, 0, dlrec_loader_fingerprint(l)}));
  run again;
  CHECK_EQ(drain(l, &again, 0), DLREC_END);
  CHECK(same_rows(&full, 0, &again, 0, full.n_rows));
  run_free(&again);
  dlrec_loader_close(l);

  /* A position is a row of the stream: resuming with another batch size
   * continues the same rows. */
  dlrec_loader_opts o3 = o;
  o3.batch_rows = 37;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o3));
  CHECK_OK(dlrec_loader_seek(l, full.ends[5]));
  run other;
  CHECK_EQ(drain(l, &other, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK(same_rows(&full, 600, &other, 0, full.n_rows - 600));
  run_free(&other);
  run_free(&full);
}

TEST(seek_mid_stream_discards_prefetched_batches) {
  stream s;
  CHECK(make_stream(&s, "mid", 800, 1));
  dlrec_loader_opts o = opts(32, 2, 4, 3, 2);
  o.prefetch = 8;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  run full, head, rest;
  CHECK_EQ(drain(l, &full, 0), DLREC_END);
  CHECK_OK(dlrec_loader_seek(l, (dlrec_position){0, 0, dlrec_loader_fingerprint(l)}));
  CHECK_OK(drain(l, &head, 30)); /* the ring is full of later batches now */
  dlrec_position p = full.ends[9];
  CHECK_OK(dlrec_loader_seek(l, p));
  CHECK_EQ(drain(l, &rest, 0), DLREC_END);
  CHECK(same_rows(&full, 320, &rest, 0, full.n_rows - 320));
  dlrec_loader_close(l);
  run_free(&full), run_free(&head), run_free(&rest);
}

/* A seek recomputes the window's slices and walks them to the row. With
 * slice_rows 1 every row is a slice, so a seek into the middle of a window
 * ends the walk exactly at a slice boundary; a walk that stops one slice
 * short leaves an empty slice in front, and the next full batch then holds
 * batch_rows + 1 segments, one past its segment array (caught by ASan, whose
 * poisoning the arena's unused space makes visible). Seeks to every row of
 * the first epoch, and a few of the second, must continue the stream. */
TEST(seek_to_any_row_with_one_row_slices) {
  stream s;
  CHECK(make_stream(&s, "seek1", 300, 1));
  dlrec_loader_opts o = opts(16, 3, 1, 1, 2);
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  run full;
  CHECK_EQ(drain(l, &full, 0), DLREC_END);
  CHECK_EQ_U64(full.n_rows, 600);
  const uint64_t fp = dlrec_loader_fingerprint(l);
  for (uint64_t at = 0; at < 600 && !test_failed_now(); at += at < 300 ? 1 : 37) {
    CHECK_OK(dlrec_loader_seek(l, (dlrec_position){at / 300, at % 300, fp}));
    run rest;
    dlrec_status st = drain(l, &rest, 0);
    if (st != DLREC_END || rest.n_rows != 600 - at || !same_rows(&full, at, &rest, 0, 600 - at))
      test_fail(__FILE__, __LINE__, "seek to row %llu: %s, %llu rows, expected the %llu after it",
                (unsigned long long)at, dlrec_status_name(st), (unsigned long long)rest.n_rows,
                (unsigned long long)(600 - at));
    for (uint64_t b = 0; b + 1 < rest.n_batches && !test_failed_now(); b++)
      if (rest.batch_rows[b] != 16 && rest.ends[b].row != 300)
        test_fail(__FILE__, __LINE__, "seek to row %llu: batch %llu has %u rows", (unsigned long long)at,
                  (unsigned long long)b, rest.batch_rows[b]);
    run_free(&rest);
  }
  dlrec_loader_close(l);
  run_free(&full);
}

TEST(mismatched_positions_are_refused) {
  stream s;
  CHECK(make_stream(&s, "mismatch", 300, 1));
  dlrec_loader_opts o = opts(32, 2, 4, 1, 2);
  dlrec_loader *l, *m;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  uint64_t fp = dlrec_loader_fingerprint(l);
  CHECK_ERR(dlrec_loader_seek(l, (dlrec_position){0, 10, fp + 1}), DLREC_ERR_INVALID, "does not match");
  CHECK_ERR(dlrec_loader_seek(l, (dlrec_position){0, 301, fp}), DLREC_ERR_INVALID, "past the 300 rows");
  CHECK_ERR(dlrec_loader_seek(l, (dlrec_position){3, 0, fp}), DLREC_ERR_INVALID, "past the last epoch");
  CHECK_ERR(dlrec_loader_seek(l, (dlrec_position){2, 5, fp}), DLREC_ERR_INVALID, "past the last epoch");
  CHECK_OK(dlrec_loader_seek(l, (dlrec_position){2, 0, fp})); /* the very end: next says END */
  const dlrec_batch *b;
  CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
  CHECK_OK(dlrec_loader_seek(l, (dlrec_position){1, 300, fp}));
  CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
  /* Another seed or window: another stream. Another batch size or thread
   * count: the same stream. */
  o.seed = 99;
  CHECK_OK(dlrec_loader_open(&m, s.paths, 1, &o));
  CHECK(dlrec_loader_fingerprint(m) != fp);
  CHECK_ERR(dlrec_loader_seek(m, (dlrec_position){0, 10, fp}), DLREC_ERR_INVALID, "fingerprint");
  dlrec_loader_close(m);
  o = opts(32, 3, 4, 1, 2);
  CHECK_OK(dlrec_loader_open(&m, s.paths, 1, &o));
  CHECK(dlrec_loader_fingerprint(m) != fp);
  dlrec_loader_close(m);
  o = opts(50, 2, 4, 3, 2);
  CHECK_OK(dlrec_loader_open(&m, s.paths, 1, &o));
  CHECK_EQ_U64(dlrec_loader_fingerprint(m), fp);
  dlrec_loader_close(m);
  dlrec_loader_close(l);
}

/* ---- errors ---- */

/* Flips a byte in the dense values of row group g (of the only file). */
static int corrupt_group(const char *path, uint32_t g) {
  dlrec_dlr *f;
  if (dlrec_dlr_open(&f, path) != DLREC_OK) return 0;
  dlrec_dlr_group_info gi;
  dlrec_dlr_group_info_get(f, g, &gi);
  dlrec_dlr_close(f);
  FILE *fp = fopen(path, "r+b");
  if (!fp) return 0;
  unsigned char c;
  long at = (long)(gi.offset + gi.bytes / 2);
  fseek(fp, at, SEEK_SET);
  if (fread(&c, 1, 1, fp) != 1) return fclose(fp), 0;
  c ^= 0x10;
  fseek(fp, at, SEEK_SET);
  fwrite(&c, 1, 1, fp);
  return fclose(fp) == 0;
}

TEST(corrupt_group_fails_in_order_naming_the_group) {
  const char *p = test_path("bad.dlr");
  uint32_t sizes[8] = {10, 10, 10, 10, 10, 10, 10, 10};
  CHECK_OK(write_rows(p, 0, sizes, 8));
  /* The order, from a loader that does not look at checksums. */
  dlrec_loader_opts o = opts(7, 3, 3, 3, 1);
  o.verify = 0;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  run ref;
  CHECK_EQ(drain(l, &ref, 0), DLREC_END);
  dlrec_loader_close(l);
  uint64_t first_bad = 0, at = 0;
  for (; first_bad < ref.n_batches; at += ref.batch_rows[first_bad++]) {
    int touches = 0;
    for (uint32_t i = 0; i < ref.batch_rows[first_bad]; i++) touches |= ref.rows[at + i] / 10 == 5;
    if (touches) break;
  }
  CHECK(first_bad < ref.n_batches);

  CHECK(corrupt_group(p, 5));
  for (uint32_t threads = 1; threads <= 3; threads += 2) {
    o.verify = 1;
    o.threads = threads;
    CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
    run got;
    dlrec_status st = drain(l, &got, 0);
    if (st != DLREC_ERR_CORRUPT || !strstr(dlrec_last_error(), "bad.dlr: row group 5 at offset") ||
        !strstr(dlrec_last_error(), "checksum mismatch"))
      test_fail(__FILE__, __LINE__, "threads %u: %s: %s", threads, dlrec_status_name(st), dlrec_last_error());
    /* Every batch before the bad one came, unchanged. */
    CHECK_EQ_U64(got.n_batches, first_bad);
    CHECK(same_rows(&ref, 0, &got, 0, got.n_rows));
    /* Sticky, and the position is the last good batch's end. */
    const dlrec_batch *b;
    CHECK_ERR(dlrec_loader_next(l, &b), DLREC_ERR_CORRUPT, "row group 5");
    CHECK_EQ_U64(dlrec_loader_position(l).row, got.n_rows);
    /* A seek clears it; the same error comes back at the same batch. */
    CHECK_OK(dlrec_loader_seek(l, (dlrec_position){0, 0, dlrec_loader_fingerprint(l)}));
    run again;
    CHECK_ERR(drain(l, &again, 0), DLREC_ERR_CORRUPT, "row group 5");
    CHECK_EQ_U64(again.n_batches, first_bad);
    run_free(&again);
    run_free(&got);
    dlrec_loader_close(l);
  }
  run_free(&ref);
}

TEST(close_mid_epoch_and_before_any_batch) {
  stream s;
  CHECK(make_stream(&s, "close", 2000, 2));
  dlrec_loader_opts o = opts(16, 4, 4, 3, 0);
  o.prefetch = 16;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  dlrec_loader_close(l);
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  run r;
  CHECK_OK(drain(l, &r, 5));
  usleep(1000); /* let the workers fill the ring and wait */
  dlrec_loader_close(l);
  run_free(&r);
  /* Endless epochs run on past the first. */
  CHECK_OK(dlrec_loader_open(&l, s.paths, 2, &o));
  CHECK_OK(drain(l, &r, 300));
  CHECK_EQ_U64(r.batch_epoch[299], 2);
  dlrec_loader_close(l);
  run_free(&r);
}

/* Unlabeled rows, no dense columns, and a variable column whose batches hold
 * far more ids than the initial buffers (4 per row): they grow, and the
 * content stays right. */
TEST(unlabeled_sparse_only_with_many_ids_per_row) {
  dlrec_schema s;
  memset(&s, 0, sizeof s);
  s.n_sparse = 2;
  strcpy(s.sparse[0].name, "row");
  s.sparse[0].hotness = s.sparse[0].max_hotness = 1;
  s.sparse[0].id_end = 5000;
  strcpy(s.sparse[1].name, "many");
  s.sparse[1].max_hotness = 40;
  s.sparse[1].id_begin = 5000;
  s.sparse[1].id_end = 6000;
  s.table_rows = 6000;
  const char *p = test_path("many.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  uint32_t row[500], off[501], ids[500 * 40];
  for (uint32_t g = 0; g < 6; g++) {
    off[0] = 0;
    for (uint32_t i = 0; i < 500; i++) {
      uint32_t r = g * 500 + i, n = (r * 7) % 41;
      row[i] = r;
      off[i + 1] = off[i] + n;
      for (uint32_t j = 0; j < n; j++) ids[off[i] + j] = 5000 + (r + j) % 1000;
    }
    dlrec_rowgroup rg = {.rows = 500};
    rg.ids[0] = row;
    rg.offsets[1] = off;
    rg.ids[1] = ids;
    CHECK_OK(dlrec_dlr_writer_append(w, &rg));
  }
  CHECK_OK(dlrec_dlr_writer_finish(w));
  dlrec_loader_opts o = opts(256, 3, 5, 2, 2);
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  uint8_t seen[3000] = {0};
  uint64_t n = 0;
  const dlrec_batch *b;
  dlrec_status st;
  while ((st = dlrec_loader_next(l, &b)) == DLREC_OK) {
    CHECK(b->labels == NULL);
    for (uint32_t i = 0; i < b->rows; i++) {
      uint32_t r = b->ids[0][i], a = b->offsets[1][i], z = b->offsets[1][i + 1];
      CHECK(r < 3000);
      CHECK_EQ(z - a, (r * 7) % 41);
      for (uint32_t j = 0; j < z - a; j++) CHECK_EQ(b->ids[1][a + j], 5000 + (r + j) % 1000);
      seen[r]++;
    }
    n += b->rows;
  }
  CHECK_EQ(st, DLREC_END);
  CHECK_EQ_U64(n, 6000);
  for (uint32_t r = 0; r < 3000; r++) CHECK_EQ(seen[r], 2);
  dlrec_loader_close(l);
}

/* Many threads, small batches that touch many groups, several bad groups,
 * and seeks: the group checks are shared between jobs (claimed by the first,
 * awaited by the others), and whatever the interleaving the error comes at
 * the first batch that touches a bad group, with every batch before it. */
TEST(shared_group_checks_under_many_threads_and_seeks) {
  const char *p = test_path("several.dlr");
  uint32_t sizes[30];
  for (int i = 0; i < 30; i++) sizes[i] = 10;
  CHECK_OK(write_rows(p, 0, sizes, 30));
  dlrec_loader_opts o = opts(5, 30, 3, 4, 1);
  o.verify = 0;
  o.prefetch = 12;
  dlrec_loader *l;
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  run ref;
  CHECK_EQ(drain(l, &ref, 0), DLREC_END);
  dlrec_loader_close(l);
  CHECK(corrupt_group(p, 7) && corrupt_group(p, 19) && corrupt_group(p, 23));
  /* For each start batch, the first batch at or after it that touches a bad group. */
  uint64_t first_bad_from[64], starts[64];
  uint64_t at = 0, next_bad = ref.n_batches;
  CHECK(ref.n_batches == 60);
  for (uint64_t b = 0; b < 60; b++) starts[b] = at, at += ref.batch_rows[b];
  for (uint64_t b = 60; b-- > 0;) {
    int bad = 0;
    for (uint32_t i = 0; i < ref.batch_rows[b]; i++) {
      uint32_t g = ref.rows[starts[b] + i] / 10;
      bad |= g == 7 || g == 19 || g == 23;
    }
    if (bad) next_bad = b;
    first_bad_from[b] = next_bad;
  }
  o.verify = 1;
  CHECK_OK(dlrec_loader_open(&l, &p, 1, &o));
  for (int round = 0; round < 12; round++) {
    uint64_t from = (uint64_t)(round * 17) % 60; /* 0, 17, 34, 51, 8, 25, 42, 59, ... */
    if (round)
      CHECK_OK(dlrec_loader_seek(l, from ? ref.ends[from - 1] : (dlrec_position){0, 0, dlrec_loader_fingerprint(l)}));
    run got;
    dlrec_status st = drain(l, &got, 0);
    uint64_t start = round ? from : 0, want = first_bad_from[start] - start;
    dlrec_status want_st = first_bad_from[start] < 60 ? DLREC_ERR_CORRUPT : DLREC_END;
    if (st != want_st || got.n_batches != want || !same_rows(&ref, starts[round ? from : 0], &got, 0, got.n_rows))
      test_fail(__FILE__, __LINE__, "round %d from batch %llu: %s after %llu batches (want %llu): %s", round,
                (unsigned long long)from, dlrec_status_name(st), (unsigned long long)got.n_batches,
                (unsigned long long)want, dlrec_last_error());
    run_free(&got);
    if (test_failed_now()) break;
  }
  dlrec_loader_close(l);
  run_free(&ref);
}

/* Writes a file of one sparse column declaring `hotness` ids per row (row r
 * holds ids 0..hotness-1) and `rows` rows in one group (none when 0). */
static dlrec_status write_wide(const char *path, uint32_t hotness, uint32_t rows) {
  dlrec_schema s;
  memset(&s, 0, sizeof s);
  s.n_dense = 1;
  strcpy(s.dense_names[0], "x");
  s.n_sparse = 1;
  strcpy(s.sparse[0].name, "wide");
  s.sparse[0].hotness = s.sparse[0].max_hotness = hotness;
  s.sparse[0].id_end = hotness;
  s.table_rows = hotness;
  dlrec_dlr_writer *w;
  dlrec_status st = dlrec_dlr_writer_open(&w, path, &s);
  if (st != DLREC_OK) return st;
  if (rows) {
    float *dense = calloc(rows, 4);
    uint32_t *ids = calloc((size_t)rows * hotness, 4);
    dlrec_rowgroup rg = {.rows = rows, .dense = dense};
    rg.ids[0] = ids;
    for (size_t i = 0; ids && i < (size_t)rows * hotness; i++) ids[i] = (uint32_t)(i % hotness);
    st = dense && ids ? dlrec_dlr_writer_append(w, &rg) : DLREC_ERR_NOMEM;
    free(dense), free(ids);
  }
  if (st != DLREC_OK) {
    dlrec_dlr_writer_abort(w);
    return st;
  }
  return dlrec_dlr_writer_finish(w);
}

/* A fuzz finding (fuzz_dlr): a valid 468-byte file of 0 rows declaring a
 * column of 2^24 ids per row made dlrec_loader_open allocate and clear
 * batch_rows x 2^24 ids per prefetched batch, gigabytes for nothing. The
 * buffers must be sized by the rows there are: here a 0-row and a 1-row file
 * of 2^20 ids per row open with batch_rows 2048 (8 GiB per batch the old way)
 * under an address-space limit of 1 GiB more than the process has, and the
 * 1-row file's batch still holds all of its ids. */
TEST(small_file_with_huge_declared_hotness_allocates_little) {
  const uint32_t hot = 1u << 20;
  const char *p0 = test_path("wide0.dlr"), *p1 = test_path("wide1.dlr");
  CHECK_OK(write_wide(p0, hot, 0));
  CHECK_OK(write_wide(p1, hot, 1));
  unsigned long vm_pages = 0;
  FILE *fp = fopen("/proc/self/statm", "r");
  CHECK(fp && fscanf(fp, "%lu", &vm_pages) == 1);
  if (fp) fclose(fp);
  struct rlimit old, lim;
  CHECK(getrlimit(RLIMIT_AS, &old) == 0);
  lim = old;
  rlim_t want = (rlim_t)vm_pages * (rlim_t)sysconf(_SC_PAGESIZE) + (1ull << 30);
  if (old.rlim_cur == RLIM_INFINITY || old.rlim_cur > want) lim.rlim_cur = want;
  CHECK(setrlimit(RLIMIT_AS, &lim) == 0);
  for (int k = 0; k < 2; k++) {
    const char *p = k ? p1 : p0;
    dlrec_loader_opts o = opts(2048, 2, 2, 2, 1);
    dlrec_loader *l;
    dlrec_status st = dlrec_loader_open(&l, &p, 1, &o);
    CHECK_OK(st);
    if (st != DLREC_OK) continue;
    const dlrec_batch *b;
    if (k) {
      CHECK_OK(dlrec_loader_next(l, &b));
      CHECK_EQ(b->rows, 1);
      uint32_t wrong = 0;
      for (uint32_t i = 0; i < hot; i++) wrong += b->ids[0][i] != i;
      CHECK_EQ(wrong, 0);
      CHECK_EQ(b->offsets[0][1], hot);
    }
    CHECK_EQ(dlrec_loader_next(l, &b), DLREC_END);
    dlrec_loader_close(l);
  }
  CHECK(setrlimit(RLIMIT_AS, &old) == 0);
}

/* ---- parts of batches (data parallelism) ---- */

/* Steps a parts=1 loader and `parts` part loaders in lockstep until the
 * reference ends: each part's batch must be its slice [n*p/parts,
 * n*(p+1)/parts) of the reference batch, bit for bit (labels, dense, ids,
 * offsets rebased to 0), with the reference's epoch and end. Counts the
 * global batches and the 0-row parts handed out. Returns 0 on a mismatch
 * (reported). */
static int parts_match(dlrec_loader *ref, dlrec_loader **part, uint32_t parts, const char *what, uint64_t *batches,
                       uint64_t *empty) {
  const dlrec_schema *sc = dlrec_loader_schema(ref);
  uint32_t *rows_seen = malloc(4ull * dlrec_loader_epoch_rows(ref) + 4);
  int ok = rows_seen != NULL;
  *batches = *empty = 0;
  for (;;) {
    const dlrec_batch *r;
    dlrec_status st = dlrec_loader_next(ref, &r);
    if (st != DLREC_OK && st != DLREC_END) {
      test_fail(__FILE__, __LINE__, "%s: reference: %s: %s", what, dlrec_status_name(st), dlrec_last_error());
      ok = 0;
    }
    for (uint32_t p = 0; ok && p < parts; p++) {
      const dlrec_batch *b;
      dlrec_status pst = dlrec_loader_next(part[p], &b);
      if (pst != st) {
        test_fail(__FILE__, __LINE__, "%s: batch %llu part %u/%u: %s (reference %s): %s", what,
                  (unsigned long long)*batches, p, parts, dlrec_status_name(pst), dlrec_status_name(st),
                  dlrec_last_error());
        ok = 0;
        break;
      }
      if (st == DLREC_END) continue;
      const uint32_t n = r->rows, lo = (uint32_t)((uint64_t)n * p / parts),
                     hi = (uint32_t)((uint64_t)n * (p + 1) / parts), m = hi - lo;
      ok = b->rows == m && b->epoch == r->epoch && b->end.epoch == r->end.epoch && b->end.row == r->end.row &&
               b->end.fingerprint == r->end.fingerprint && memcmp(b->labels, r->labels + lo, 4ull * m) == 0 &&
               memcmp(b->dense, r->dense + 2ull * lo, 8ull * m) == 0;
      for (uint32_t c = 0; ok && c < sc->n_sparse; c++) {
        const uint32_t *ro = r->offsets[c], *bo = b->offsets[c];
        for (uint32_t i = 0; ok && i <= m; i++) ok = bo[i] == ro[lo + i] - ro[lo];
        ok = ok && memcmp(b->ids[c], r->ids[c] + ro[lo], 4ull * (ro[hi] - ro[lo])) == 0;
      }
      /* And the rows hold what they must (also on 0-row parts: offsets [0]). */
      ok = ok && check_batch(b, rows_seen);
      if (!ok) {
        test_fail(__FILE__, __LINE__,
                  "%s: batch %llu (%u rows, end %llu) part %u/%u: %u rows, differs from rows [%u, %u)", what,
                  (unsigned long long)*batches, n, (unsigned long long)r->end.row, p, parts, b->rows, lo, hi);
        break;
      }
      *empty += m == 0;
    }
    if (!ok || st == DLREC_END) break;
    ++*batches;
  }
  free(rows_seen);
  return ok;
}

static dlrec_loader_opts part_opts(int shuffle, uint32_t slice, uint32_t part, uint32_t parts) {
  dlrec_loader_opts o = opts(64, 3, slice, 2, 2);
  o.shuffle = shuffle;
  o.part = part;
  o.parts = parts;
  return o;
}

/* 963 rows (two files, irregular groups, a multi-hot and a variable-hotness
 * column) in batches of 64: 15 full batches and one of 3 rows per epoch, so
 * parts 4 and 7 get empty parts. Unshuffled, shuffled by slices of 7 and of
 * one row (the one-row copy path). */
TEST(parts_of_batches_concatenate_to_the_whole_batch) {
  stream s;
  CHECK(make_stream(&s, "parts", 963, 2));
  static const uint32_t part_counts[] = {1, 2, 3, 4, 7};
  static const struct {
    int shuffle;
    uint32_t slice;
  } cfg[] = {{0, 1}, {1, 7}, {1, 1}};
  for (size_t k = 0; k < sizeof cfg / sizeof cfg[0] && !test_failed_now(); k++) {
    for (size_t q = 0; q < sizeof part_counts / sizeof part_counts[0] && !test_failed_now(); q++) {
      const uint32_t parts = part_counts[q];
      dlrec_loader_opts o = part_opts(cfg[k].shuffle, cfg[k].slice, 0, 1);
      dlrec_loader *ref, *part[7] = {0};
      CHECK_OK(dlrec_loader_open(&ref, s.paths, 2, &o));
      for (uint32_t p = 0; p < parts; p++) {
        o = part_opts(cfg[k].shuffle, cfg[k].slice, p, parts);
        o.threads = 1 + p % 3;
        CHECK_OK(dlrec_loader_open(&part[p], s.paths, 2, &o));
        CHECK_EQ_U64(dlrec_loader_fingerprint(part[p]), dlrec_loader_fingerprint(ref));
        CHECK_EQ_U64(dlrec_loader_epoch_rows(part[p]), 963);
      }
      char what[64];
      snprintf(what, sizeof what, "shuffle %d slice %u parts %u", cfg[k].shuffle, cfg[k].slice, parts);
      uint64_t batches = 0, empty = 0;
      int ok = parts_match(ref, part, parts, what, &batches, &empty);
      for (uint32_t p = 0; p < parts; p++) dlrec_loader_close(part[p]);
      dlrec_loader_close(ref);
      CHECK(ok);
      CHECK_EQ_U64(batches, 2 * 16);
      /* The 3-row batch of each epoch leaves 1 of 4 and 4 of 7 parts empty. */
      CHECK_EQ_U64(empty, parts == 4 ? 2 * 1 : parts == 7 ? 2 * 4 : 0);
    }
  }
}

/* A part loader sought to a position (a batch end from another part, or a
 * row inside a batch) continues with the same part rows as one that ran
 * through, and as the parts=1 loader's batches from there, sliced. */
TEST(parts_seek_and_resume_like_the_whole_stream) {
  stream s;
  CHECK(make_stream(&s, "partseek", 963, 2));
  const uint32_t parts = 3;
  for (int shuffle = 0; shuffle < 2 && !test_failed_now(); shuffle++) {
    dlrec_loader_opts o = part_opts(shuffle, 7, 0, 1);
    dlrec_loader *ref, *part[3];
    CHECK_OK(dlrec_loader_open(&ref, s.paths, 2, &o));
    run full[3];
    for (uint32_t p = 0; p < parts; p++) {
      o = part_opts(shuffle, 7, p, parts);
      CHECK_OK(dlrec_loader_open(&part[p], s.paths, 2, &o));
      CHECK_EQ(drain(part[p], &full[p], 0), DLREC_END);
      CHECK_EQ_U64(full[p].n_batches, 32);
    }
    /* Resume every part from part 0's position after batch c (mid first
     * epoch, the epoch's end, mid second epoch). */
    static const uint64_t cuts[] = {5, 16, 23};
    for (size_t k = 0; k < 3 && !test_failed_now(); k++) {
      const uint64_t c = cuts[k];
      const dlrec_position at = full[0].ends[c - 1];
      for (uint32_t p = 0; p < parts && !test_failed_now(); p++) {
        uint64_t before = 0;
        for (uint64_t b = 0; b < c; b++) before += full[p].batch_rows[b];
        dlrec_loader *m;
        o = part_opts(shuffle, 7, p, parts);
        o.threads = 3;
        CHECK_OK(dlrec_loader_open(&m, s.paths, 2, &o));
        CHECK_OK(dlrec_loader_seek(m, at));
        run rest;
        dlrec_status st = drain(m, &rest, 0);
        dlrec_loader_close(m);
        int ok = st == DLREC_END && rest.n_batches == 32 - c && rest.n_rows == full[p].n_rows - before &&
                 same_rows(&full[p], before, &rest, 0, rest.n_rows);
        for (uint64_t b = 0; ok && b < rest.n_batches; b++)
          ok = rest.batch_rows[b] == full[p].batch_rows[c + b] && rest.ends[b].epoch == full[p].ends[c + b].epoch &&
               rest.ends[b].row == full[p].ends[c + b].row;
        if (!ok)
          test_fail(__FILE__, __LINE__, "shuffle %d part %u resumed after batch %llu: %s, %llu batches", shuffle, p,
                    (unsigned long long)c, dlrec_status_name(st), (unsigned long long)rest.n_batches);
        run_free(&rest);
      }
    }
    /* Seeks into the middle of a batch (rows 100 and 961 of epoch 0, row 40
     * of epoch 1): the global batches shift, and the parts follow. */
    static const uint64_t rows_at[][2] = {{0, 100}, {0, 961}, {1, 40}};
    for (size_t k = 0; k < 3 && !test_failed_now(); k++) {
      dlrec_position at = {rows_at[k][0], rows_at[k][1], dlrec_loader_fingerprint(ref)};
      CHECK_OK(dlrec_loader_seek(ref, at));
      for (uint32_t p = 0; p < parts; p++) CHECK_OK(dlrec_loader_seek(part[p], at));
      uint64_t batches = 0, empty = 0;
      char what[64];
      snprintf(what, sizeof what, "shuffle %d seek %llu:%llu", shuffle, (unsigned long long)at.epoch,
               (unsigned long long)at.row);
      CHECK(parts_match(ref, part, parts, what, &batches, &empty));
      CHECK(batches > 0);
    }
    for (uint32_t p = 0; p < parts; p++) dlrec_loader_close(part[p]), run_free(&full[p]);
    dlrec_loader_close(ref);
  }
}

TEST(parts_options_are_checked) {
  stream s;
  CHECK(make_stream(&s, "partopts", 100, 1));
  dlrec_loader_opts o;
  dlrec_loader_opts_default(&o);
  CHECK_EQ(o.part, 0);
  CHECK_EQ(o.parts, 1);
  dlrec_loader *l;
  o = part_opts(1, 7, 2, 2);
  CHECK_ERR(dlrec_loader_open(&l, s.paths, 1, &o), DLREC_ERR_INVALID, "part 2 is out of range for parts 2");
  o.part = 9;
  o.parts = 3;
  CHECK_ERR(dlrec_loader_open(&l, s.paths, 1, &o), DLREC_ERR_INVALID, "part 9 is out of range for parts 3");
  o.part = 0;
  o.parts = 5000;
  CHECK_ERR(dlrec_loader_open(&l, s.paths, 1, &o), DLREC_ERR_INVALID, "parts 5000 is out of range [1, 4096]");
  /* parts 0 counts as 1: part 0 is the whole batch, part 1 is out of range. */
  o.parts = 0;
  o.part = 1;
  CHECK_ERR(dlrec_loader_open(&l, s.paths, 1, &o), DLREC_ERR_INVALID, "part 1 is out of range for parts 1");
  o.part = 0;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  const dlrec_batch *b;
  CHECK_OK(dlrec_loader_next(l, &b));
  CHECK_EQ(b->rows, 64);
  dlrec_loader_close(l);
  /* The largest count: with 64-row batches most parts are empty (part 1
   * gets rows [0, 0) of each), and each is handed out. */
  o.parts = 4096;
  o.part = 1;
  CHECK_OK(dlrec_loader_open(&l, s.paths, 1, &o));
  dlrec_status st;
  uint64_t n = 0, rows = 0;
  while ((st = dlrec_loader_next(l, &b)) == DLREC_OK) n++, rows += b->rows;
  dlrec_loader_close(l);
  CHECK_EQ(st, DLREC_END);
  CHECK_EQ_U64(n, 2 * 2);
  CHECK_EQ_U64(rows, 0);
}
