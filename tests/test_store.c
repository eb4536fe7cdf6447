/* Table storage (embed/store.h): the tiered store against the ram store on the
 * same batches, bit for bit, through eviction and write-back; its view for
 * checkpoints; and what it refuses. The hash store's admission, eviction
 * and expiry, and its key index's keyed hash (embed/slot_index.h) against
 * keys crafted to collide. Also the distinct rows of a batch
 * (embed/unique.h), which the stages that fetch rows gather. */
#include <sys/stat.h>

#include "backend/cpu/kernels.h"
#include "core/hash.h"
#include "core/rng.h"
#include "embed/slot_index.h"
#include "embed/store.h"
#include "embed/unique.h"
#include "test.h"

enum { COLS = 3, DIM = 6, ROWS_PER_COL = 700, ROWS = COLS * ROWS_PER_COL, B = 24, MAX_HOT = 3 };

/* A batch of B samples, each column 0 to MAX_HOT ids drawn mostly from the
 * column's first rows (as frequency-ordered ids are) and sometimes from
 * anywhere in it. */
typedef struct batch_buf {
  uint32_t offsets[COLS][B + 1];
  uint32_t ids[COLS][B * MAX_HOT];
  const uint32_t *off_p[COLS], *ids_p[COLS];
  dlrec_bag_batch bags;
} batch_buf;

static void make_batch(batch_buf *bb, dlrec_rng *rng) {
  for (uint32_t c = 0; c < COLS; c++) {
    uint32_t k = 0;
    bb->offsets[c][0] = 0;
    for (uint32_t b = 0; b < B; b++) {
      uint32_t hot = (uint32_t)(dlrec_rng_uniform(rng) * (MAX_HOT + 1)) % (MAX_HOT + 1);
      for (uint32_t h = 0; h < hot; h++) {
        double u = dlrec_rng_uniform(rng);
        uint32_t local = u < 0.7 ? (uint32_t)(u * u * 60) : (uint32_t)(dlrec_rng_uniform(rng) * ROWS_PER_COL);
        bb->ids[c][k++] = c * ROWS_PER_COL + local % ROWS_PER_COL;
      }
      bb->offsets[c][b + 1] = k;
    }
    bb->off_p[c] = bb->offsets[c];
    bb->ids_p[c] = bb->ids[c];
  }
  bb->bags = (dlrec_bag_batch){B, COLS, bb->off_p, bb->ids_p, NULL};
}

static const dlrec_row_range ranges[COLS] = {{.begin = 0, .end = ROWS_PER_COL},
                                             {.begin = ROWS_PER_COL, .end = 2 * ROWS_PER_COL},
                                             {.begin = 2 * ROWS_PER_COL, .end = 3 * ROWS_PER_COL}};

static dlrec_status make_store_dtype(dlrec_store **s, dlrec_store_kind kind, uint64_t cache_rows, const char *name,
                                     dlrec_table_dtype dtype) {
  dlrec_store_config c = {.kind = kind, .path = name ? test_path(name) : NULL, .cache_rows = cache_rows};
  dlrec_status st = dlrec_store_create(s, &c, ROWS, DIM, dtype);
  return st == DLREC_OK ? dlrec_store_init_uniform(*s, ranges, COLS, 42) : st;
}

static dlrec_status make_store(dlrec_store **s, dlrec_store_kind kind, uint64_t cache_rows, const char *name) {
  return make_store_dtype(s, kind, cache_rows, name, DLREC_TABLE_FP32);
}

/* Trains `steps` batches on a ram and a tiered store with the same
 * optimizer, checking each forward bitwise, then the whole tables and
 * optimizer state through dlrec_store_map. */
static void tiered_matches_ram_dtype(dlrec_sparse_optim_kind kind, uint64_t cache_rows, int steps,
                                     dlrec_table_dtype dtype) {
  dlrec_store *ram = NULL, *tier = NULL;
  dlrec_sparse_optim *o_ram = NULL, *o_tier = NULL;
  float *out_ram = NULL, *out_tier = NULL, *d_out = NULL;
  void *scratch = NULL;
  dlrec_sparse_optim_config oc;
  dlrec_sparse_optim_config_default(&oc, kind);
  oc.lr = 0.05f;
  oc.initial_accumulator = 0.1f;
  CHECK_OK(make_store_dtype(&ram, DLREC_STORE_RAM, 0, NULL, dtype));
  CHECK_OK(make_store_dtype(&tier, DLREC_STORE_TIERED, cache_rows, "tiered.table", dtype));
  CHECK_OK(dlrec_store_optim_create(ram, &oc, &o_ram));
  CHECK_OK(dlrec_store_optim_create(tier, &oc, &o_tier));
  const size_t n_out = (size_t)B * COLS * DIM;
  out_ram = malloc(n_out * sizeof(float));
  out_tier = malloc(n_out * sizeof(float));
  d_out = malloc(n_out * sizeof(float));
  size_t scratch_bytes = dlrec_bag_backward_scratch_bytes(dlrec_store_table(ram), B * COLS * MAX_HOT);
  scratch = malloc(scratch_bytes);
  CHECK(out_ram && out_tier && d_out && scratch);
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 7, 0);
  batch_buf bb;
  for (int step = 0; step < steps && !test_failed_now(); step++) {
    make_batch(&bb, &rng);
    dlrec_bag_batch r_ram, r_tier;
    CHECK_OK(dlrec_store_resolve(ram, &bb.bags, &r_ram, 1));
    CHECK_OK(dlrec_store_resolve(tier, &bb.bags, &r_tier, 1));
    CHECK_OK(cpu_bag_forward(out_ram, dlrec_store_table(ram), &r_ram, DLREC_POOLING_SUM));
    CHECK_OK(cpu_bag_forward(out_tier, dlrec_store_table(tier), &r_tier, DLREC_POOLING_SUM));
    CHECK(memcmp(out_ram, out_tier, n_out * sizeof(float)) == 0);
    for (size_t i = 0; i < n_out; i++) d_out[i] = (float)(dlrec_rng_uniform(&rng) - 0.5);
    CHECK_OK(cpu_bag_backward_update(dlrec_store_table(ram), o_ram, &r_ram, DLREC_POOLING_SUM, d_out, scratch,
                                       scratch_bytes));
    CHECK_OK(cpu_bag_backward_update(dlrec_store_table(tier), o_tier, &r_tier, DLREC_POOLING_SUM, d_out, scratch,
                                       scratch_bytes));
  }
  dlrec_store_stats st;
  dlrec_store_get_stats(tier, &st);
  /* The cache was too small for the rows the batches touched: rows were
   * evicted and read back, so the comparison went through the file. */
  if (cache_rows < ROWS) {
    CHECK(st.evictions > 0);
    CHECK(st.bytes_written > 0);
  }
  if (steps >= 1500) CHECK(st.evictions > 2 * 4096);
  CHECK(st.misses > 0 && st.misses < st.lookups);
  CHECK(st.resident <= cache_rows);
  dlrec_store_view v_ram, v_tier;
  CHECK_OK(dlrec_store_map(ram, &v_ram));
  CHECK_OK(dlrec_store_map(tier, &v_tier));
  CHECK(memcmp(v_ram.table, v_tier.table, (size_t)ROWS * 8 * dlrec_table_dtype_bytes(dtype)) == 0);
  CHECK((v_ram.optim.accum == NULL) == (v_tier.optim.accum == NULL));
  CHECK((v_ram.optim.m == NULL) == (v_tier.optim.m == NULL));
  CHECK_EQ_U64(v_tier.optim.rows, ROWS);
  if (v_ram.optim.accum) CHECK(memcmp(v_ram.optim.accum, v_tier.optim.accum, ROWS * sizeof(float)) == 0);
  if (v_ram.optim.m) {
    CHECK(memcmp(v_ram.optim.m, v_tier.optim.m, (size_t)ROWS * 8 * sizeof(float)) == 0);
    CHECK(memcmp(v_ram.optim.v, v_tier.optim.v, (size_t)ROWS * 8 * sizeof(float)) == 0);
    CHECK(memcmp(v_ram.optim.steps, v_tier.optim.steps, ROWS * sizeof(uint32_t)) == 0);
  }
  dlrec_store_unmap(ram, &v_ram);
  dlrec_store_unmap(tier, &v_tier);
  free(out_ram), free(out_tier), free(d_out), free(scratch);
  dlrec_sparse_optim_free(o_ram);
  dlrec_sparse_optim_free(o_tier);
  dlrec_store_free(ram);
  dlrec_store_free(tier);
}

static void tiered_matches_ram(dlrec_sparse_optim_kind kind, uint64_t cache_rows, int steps) {
  tiered_matches_ram_dtype(kind, cache_rows, steps, DLREC_TABLE_FP32);
}

TEST(tiered_sgd_matches_ram_through_evictions) { tiered_matches_ram(DLREC_SPARSE_SGD, 120, 60); }
/* A 16-bit row's stochastic rounding is keyed by its row in the table, not
 * by the cache slot it happens to sit in. */
TEST(tiered_bf16_table_matches_ram_through_evictions) {
  tiered_matches_ram_dtype(DLREC_SPARSE_ROWWISE_ADAGRAD, 120, 60, DLREC_TABLE_BF16);
}
TEST(tiered_adagrad_matches_ram_through_evictions) { tiered_matches_ram(DLREC_SPARSE_ROWWISE_ADAGRAD, 120, 60); }
TEST(tiered_adam_matches_ram_through_evictions) { tiered_matches_ram(DLREC_SPARSE_LAZY_ADAM, 120, 60); }
TEST(tiered_with_room_for_every_row_matches_ram) { tiered_matches_ram(DLREC_SPARSE_LAZY_ADAM, 4 * ROWS, 20); }
/* Long enough for the write-back buffer (4096 records at least) to fill and
 * be swept to the file mid-run, more than once. */
TEST(tiered_matches_ram_through_write_back_sweeps) {
  tiered_matches_ram(DLREC_SPARSE_ROWWISE_ADAGRAD, 216, 1500);
}

TEST(tiered_initial_rows_are_rams) {
  dlrec_store *ram = NULL, *tier = NULL;
  CHECK_OK(make_store(&ram, DLREC_STORE_RAM, 0, NULL));
  /* More rows than one initialization window of the tiered store. */
  CHECK_OK(make_store(&tier, DLREC_STORE_TIERED, 10, "init.table"));
  dlrec_store_view a, b;
  CHECK_OK(dlrec_store_map(ram, &a));
  CHECK_OK(dlrec_store_map(tier, &b));
  CHECK(memcmp(a.table, b.table, (size_t)ROWS * 8 * sizeof(float)) == 0);
  CHECK(b.optim.accum == NULL && b.optim.m == NULL);
  dlrec_store_unmap(ram, &a);
  dlrec_store_unmap(tier, &b);
  dlrec_store_free(ram);
  dlrec_store_free(tier);
}

/* The tiered store initializes its file a window of 65,536 rows at a time:
 * at 65535, 65536, 65537 and 131073 rows, columns across the windows, its
 * rows are the ram store's. */
TEST(tiered_initial_rows_are_rams_past_each_init_window) {
  enum { W = 65536, D = 8 };
  const uint64_t sizes[] = {W - 1, W, W + 1, 2 * W + 1};
  dlrec_table *one;
  CHECK_OK(dlrec_table_create(&one, 1, D));
  const size_t stride = dlrec_table_stride(one);
  dlrec_table_free(one);
  for (int z = 0; z < 4; z++) {
    const uint64_t rows = sizes[z];
    /* the last 5 rows in no column */
    const dlrec_row_range cols[] = {{.begin = 0, .end = 1000}, {.begin = 1000, .end = rows - 5}};
    dlrec_store *st[2] = {NULL, NULL};
    dlrec_store_view v[2];
    for (int k = 0; k < 2; k++) {
      dlrec_store_config c = {.kind = k ? DLREC_STORE_TIERED : DLREC_STORE_RAM, .path = k ? test_path("w.table") : NULL,
                              .cache_rows = 64};
      CHECK_OK(dlrec_store_create(&st[k], &c, rows, D, DLREC_TABLE_FP32));
      CHECK_OK(dlrec_store_init_uniform(st[k], cols, 2, 42));
      CHECK_OK(dlrec_store_map(st[k], &v[k]));
    }
    const int same = memcmp(v[0].table, v[1].table, rows * stride * sizeof(float)) == 0;
    for (int k = 0; k < 2; k++) dlrec_store_unmap(st[k], &v[k]), dlrec_store_free(st[k]);
    CHECK(same);
  }
}

/* What is written through the view is what the next resolve reads, and the
 * file is gone once the store is freed. */
TEST(tiered_view_writes_reach_resolved_rows) {
  dlrec_store *s = NULL;
  CHECK_OK(make_store(&s, DLREC_STORE_TIERED, 16, "view.table"));
  uint32_t off[2] = {0, 1}, id[1] = {ROWS - 1};
  const uint32_t *offp[1] = {off}, *idp[1] = {id};
  dlrec_bag_batch in = {1, 1, offp, idp, NULL}, out;
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 0));
  dlrec_store_view v;
  CHECK_OK(dlrec_store_map(s, &v));
  float *row = (float *)v.table + (size_t)(ROWS - 1) * 8;
  for (int d = 0; d < DIM; d++) row[d] = (float)d + 0.5f;
  dlrec_store_unmap(s, &v);
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 0));
  float pooled[DIM];
  CHECK_OK(cpu_bag_forward(pooled, dlrec_store_table(s), &out, DLREC_POOLING_SUM));
  for (int d = 0; d < DIM; d++) CHECK(pooled[d] == (float)d + 0.5f);
  struct stat stt;
  CHECK(stat(test_path("view.table"), &stt) == 0);
  dlrec_store_free(s);
  CHECK(stat(test_path("view.table"), &stt) != 0);
}

TEST(tiered_refuses_bad_ids_and_batches_larger_than_its_cache) {
  dlrec_store *s = NULL;
  CHECK_OK(make_store(&s, DLREC_STORE_TIERED, 4, "bad.table"));
  uint32_t off[2] = {0, 5}, ids[5] = {1, 2, 3, 4, 5};
  const uint32_t *offp[1] = {off}, *idp[1] = {ids};
  dlrec_bag_batch in = {1, 1, offp, idp, NULL}, out;
  CHECK_ERR(dlrec_store_resolve(s, &in, &out, 1), DLREC_ERR_INVALID, "more distinct rows than the cache's 4");
  /* Repeats of one row need one slot. */
  uint32_t same[5] = {9, 9, 9, 9, 9};
  idp[0] = same;
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 1));
  CHECK(out.ids[0][0] == out.ids[0][4]);
  uint32_t far[5] = {1, 2, ROWS, 3, 4};
  idp[0] = far;
  CHECK_ERR(dlrec_store_resolve(s, &in, &out, 1), DLREC_ERR_INVALID, "id 2100 is outside the table of 2100 rows");
  uint32_t down[3] = {0, 2, 1};
  const uint32_t *downp[1] = {down};
  dlrec_bag_batch bad = {2, 1, downp, idp, NULL};
  CHECK_ERR(dlrec_store_resolve(s, &bad, &out, 1), DLREC_ERR_INVALID, "offsets decrease at sample 1");
  /* After the refusals the store still works. */
  uint32_t ok[5] = {1, 2, 3, 4, 4};
  idp[0] = ok;
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 1));
  dlrec_store_free(s);
}

TEST(store_config_errors_name_the_problem) {
  dlrec_store *s = NULL;
  dlrec_store_config c = {.kind = DLREC_STORE_TIERED, .cache_rows = 10};
  CHECK_ERR(dlrec_store_create(&s, &c, ROWS, DIM, DLREC_TABLE_FP32), DLREC_ERR_INVALID, "no file path");
  c.path = test_path("x.table");
  c.cache_rows = 0;
  CHECK_ERR(dlrec_store_create(&s, &c, ROWS, DIM, DLREC_TABLE_FP32), DLREC_ERR_INVALID, "cache_rows");
  c.path = "/nonexistent-dir/x.table";
  c.cache_rows = 10;
  CHECK_ERR(dlrec_store_create(&s, &c, ROWS, DIM, DLREC_TABLE_FP32), DLREC_ERR_IO, "/nonexistent-dir/x.table");
  dlrec_store_kind k;
  CHECK_ERR(dlrec_store_kind_parse("disk", &k), DLREC_ERR_INVALID, "ram, tiered");
  CHECK_OK(dlrec_store_kind_parse("tiered", &k));
  CHECK_EQ(k, DLREC_STORE_TIERED);
  CHECK(s == NULL);
}

/* A row evicted by one batch and wanted by the next comes back with what
 * training wrote into it (from the write-back buffer: no sweep has written
 * it to the file yet). Rows a batch finds resident are never its victims. */
TEST(tiered_row_evicted_and_wanted_again_keeps_its_update) {
  dlrec_store *s = NULL;
  CHECK_OK(make_store(&s, DLREC_STORE_TIERED, 2, "again.table"));
  uint32_t off[3] = {0, 1, 2}, first[2] = {5, 6};
  const uint32_t *offp[1] = {off}, *idp[1] = {first};
  dlrec_bag_batch in = {2, 1, offp, idp, NULL}, out;
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 1));
  /* "Training" changes both rows in the cache. */
  float mark[DIM];
  for (int d = 0; d < DIM; d++) mark[d] = 100.0f + (float)d;
  dlrec_table_set_row(dlrec_store_table(s), out.ids[0][0], mark);
  dlrec_table_set_row(dlrec_store_table(s), out.ids[0][1], mark);
  /* 7 evicts one of them; the next batch wants both back. */
  uint32_t seven[1] = {7}, off1[2] = {0, 1};
  const uint32_t *off1p[1] = {off1}, *sevenp[1] = {seven};
  dlrec_bag_batch one = {1, 1, off1p, sevenp, NULL};
  CHECK_OK(dlrec_store_resolve(s, &one, &out, 0));
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 0));
  for (int i = 0; i < 2; i++) {
    float got[DIM];
    dlrec_table_get_row(dlrec_store_table(s), out.ids[0][i], got);
    for (int d = 0; d < DIM; d++) CHECK(got[d] == mark[d]);
  }
  dlrec_store_stats st;
  dlrec_store_get_stats(s, &st);
  CHECK_EQ_U64(st.evictions, 2);
  /* A batch that finds 5 resident and misses 8 gives up the other row, never 5. */
  uint32_t keep[2] = {5, 8};
  idp[0] = keep;
  CHECK_OK(dlrec_store_resolve(s, &in, &out, 0));
  CHECK(out.ids[0][0] != out.ids[0][1]);
  float got[DIM];
  dlrec_table_get_row(dlrec_store_table(s), out.ids[0][0], got);
  for (int d = 0; d < DIM; d++) CHECK(got[d] == mark[d]);
  dlrec_store_free(s);
}

/* ---- the hash store on scripted key streams ------------------------------------ */

static dlrec_status make_hash(dlrec_store **s, uint64_t rows, uint32_t min_count, dlrec_hash_evict evict,
                              uint64_t ttl) {
  dlrec_store_config c = {.kind = DLREC_STORE_HASH, .cache_rows = rows, .admit_min_count = min_count,
                          .evict = evict, .ttl_steps = ttl, .init_range = 0.5f, .seed = 9};
  return dlrec_store_create(s, &c, 1ull << 32, DIM, DLREC_TABLE_FP32);
}

/* Resolves one sample whose one bag holds keys[0..n), returning how many
 * rows the bag got (-1 on error). */
static int resolve_keys(dlrec_store *s, const uint64_t *keys, uint32_t n, dlrec_bag_batch *out) {
  uint32_t off[2] = {0, n};
  const uint32_t *offp[1] = {off};
  const uint64_t *kp[1] = {keys};
  dlrec_key_batch in = {1, 1, offp, kp, NULL};
  if (dlrec_store_resolve_keys(s, &in, out, 1) != DLREC_OK) return -1;
  return (int)(out->offsets[0][1] - out->offsets[0][0]);
}

/* The keys resident now, as a bit set over keys 0..63. */
static uint64_t resident_keys(const dlrec_store *s, uint32_t rows) {
  uint64_t set = 0, key;
  for (uint32_t r = 0; r < rows; r++)
    if (dlrec_store_key_of(s, r, &key)) set |= 1ull << key;
  return set;
}

TEST(hash_admits_a_key_at_its_min_count) {
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, 16, 3, DLREC_HASH_EVICT_LRU, 0));
  uint64_t k = 100;
  dlrec_bag_batch out;
  CHECK_EQ(resolve_keys(s, &k, 1, &out), 0);
  CHECK_EQ(resolve_keys(s, &k, 1, &out), 0);
  CHECK_EQ(resolve_keys(s, &k, 1, &out), 1);
  uint64_t key = 0;
  CHECK(dlrec_store_key_of(s, out.ids[0][0], &key) && key == 100);
  CHECK_EQ(resolve_keys(s, &k, 1, &out), 1);
  dlrec_store_stats st;
  dlrec_store_get_stats(s, &st);
  CHECK_EQ_U64(st.not_admitted, 2);
  CHECK_EQ_U64(st.admitted, 1);
  CHECK_EQ_U64(st.lookups, 4);
  dlrec_store_free(s);
}

TEST(hash_lru_and_lfu_evict_the_right_row) {
  for (int lfu = 0; lfu <= 1; lfu++) {
    dlrec_store *s = NULL;
    CHECK_OK(make_hash(&s, 4, 0, lfu ? DLREC_HASH_EVICT_LFU : DLREC_HASH_EVICT_LRU, 0));
    dlrec_bag_batch out;
    /* Seen: 1 three times, 2 twice, 3 once, 4 twice; 1 longest ago but for 2. */
    const uint64_t b1[] = {1, 1, 1}, b2[] = {2, 2}, b3[] = {3}, b4[] = {4, 4}, b5[] = {5};
    CHECK_EQ(resolve_keys(s, b2, 2, &out), 2);
    CHECK_EQ(resolve_keys(s, b1, 3, &out), 3);
    CHECK_EQ(resolve_keys(s, b3, 1, &out), 1);
    CHECK_EQ(resolve_keys(s, b4, 2, &out), 2);
    CHECK_EQ(resolve_keys(s, b5, 1, &out), 1);
    /* LRU gives up 2 (looked up first); LFU gives up 3 (looked up once). */
    uint64_t want = lfu ? (1u << 1 | 1u << 2 | 1u << 4 | 1u << 5) : (1u << 1 | 1u << 3 | 1u << 4 | 1u << 5);
    CHECK_EQ_U64(resident_keys(s, 4), want);
    dlrec_store_stats st;
    dlrec_store_get_stats(s, &st);
    CHECK_EQ_U64(st.evictions, 1);
    dlrec_store_free(s);
  }
}

TEST(hash_ttl_frees_unseen_rows_and_readmits_them_as_new) {
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, 4, 0, DLREC_HASH_EVICT_LRU, 2));
  dlrec_bag_batch out;
  const uint64_t one = 1, two = 2;
  CHECK_EQ(resolve_keys(s, &one, 1, &out), 1);
  float first[DIM];
  dlrec_table_get_row(dlrec_store_table(s), out.ids[0][0], first);
  /* Training changes it. */
  float changed[DIM] = {0};
  dlrec_table_set_row(dlrec_store_table(s), out.ids[0][0], changed);
  /* Unseen for 2 resolves: kept; for 3: freed (a table this small is
   * swept whole at every resolve). */
  for (int i = 0; i < 2; i++) CHECK_EQ(resolve_keys(s, &two, 1, &out), 1);
  CHECK_EQ_U64(resident_keys(s, 4), 1u << 1 | 1u << 2);
  CHECK_EQ(resolve_keys(s, &two, 1, &out), 1);
  CHECK_EQ_U64(resident_keys(s, 4), 1u << 2);
  dlrec_store_stats st;
  dlrec_store_get_stats(s, &st);
  CHECK_EQ_U64(st.expired, 1);
  CHECK_EQ_U64(st.evictions, 0);
  /* Back as a new key: its row drawn again from (seed, key). */
  CHECK_EQ(resolve_keys(s, &one, 1, &out), 1);
  float again[DIM];
  dlrec_table_get_row(dlrec_store_table(s), out.ids[0][0], again);
  CHECK(memcmp(first, again, sizeof first) == 0);
  for (int d = 0; d < DIM; d++) CHECK(fabsf(first[d]) <= 0.5f && first[d] != 0.0f);
  dlrec_store_free(s);
}

TEST(hash_counts_every_key_left_without_a_row) {
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, 2, 0, DLREC_HASH_EVICT_LRU, 0));
  dlrec_bag_batch out;
  const uint64_t keys[] = {1ull << 40, (1ull << 40) + 1, 7, 1ull << 40};
  /* Two rows for three distinct keys in one batch: the third is left out
   * and counted; the repeat of the first key finds its row. */
  CHECK_EQ(resolve_keys(s, keys, 4, &out), 3);
  CHECK(out.ids[0][0] == out.ids[0][2]);
  CHECK(out.ids[0][0] != out.ids[0][1]);
  dlrec_store_stats st;
  dlrec_store_get_stats(s, &st);
  CHECK_EQ_U64(st.dropped, 1);
  CHECK_EQ_U64(st.admitted, 2);
  CHECK_EQ_U64(st.lookups, 4);
  /* The next batch takes 7 in, giving up the older of the two. */
  CHECK_EQ(resolve_keys(s, keys + 2, 1, &out), 1);
  dlrec_store_get_stats(s, &st);
  CHECK_EQ_U64(st.evictions, 1);
  dlrec_store_free(s);
}

TEST(hash_admits_by_probability_at_its_rate) {
  dlrec_store *s = NULL;
  dlrec_store_config c = {.kind = DLREC_STORE_HASH, .cache_rows = 20000, .admit_probability = 0.25f, .seed = 3};
  CHECK_OK(dlrec_store_create(&s, &c, 1ull << 32, DIM, DLREC_TABLE_FP32));
  enum { N = 8000 };
  uint64_t *keys = malloc(N * sizeof *keys);
  CHECK(keys);
  for (uint64_t i = 0; i < N; i++) keys[i] = i * 0x9e3779b97f4a7c15ull;
  dlrec_bag_batch out;
  int got = resolve_keys(s, keys, N, &out);
  free(keys);
  /* 2000 expected, standard deviation about 39. */
  CHECK(got > 2000 - 200 && got < 2000 + 200);
  dlrec_store_free(s);
}

TEST(hash_new_row_resets_its_optimizer_state) {
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, 1, 0, DLREC_HASH_EVICT_LRU, 0));
  dlrec_sparse_optim_config oc;
  dlrec_sparse_optim_config_default(&oc, DLREC_SPARSE_ROWWISE_ADAGRAD);
  oc.initial_accumulator = 0.25f;
  dlrec_sparse_optim *o = NULL;
  CHECK_OK(dlrec_store_optim_create(s, &oc, &o));
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(o, &st);
  dlrec_bag_batch out;
  const uint64_t a = 7, b = 8;
  CHECK_EQ(resolve_keys(s, &a, 1, &out), 1);
  CHECK(st.accum[0] == 0.25f);
  st.accum[0] = 5.0f; /* as training would */
  CHECK_EQ(resolve_keys(s, &b, 1, &out), 1);
  CHECK(st.accum[0] == 0.25f);
  dlrec_sparse_optim_free(o);
  dlrec_store_free(s);
}

/* Scoring looks keys up without changing the table: known keys get their
 * rows, unknown ones are counted and left out, nothing is admitted. */
TEST(hash_lookup_reads_without_admitting) {
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, 8, 0, DLREC_HASH_EVICT_LRU, 0));
  dlrec_bag_batch out;
  const uint64_t known[3] = {5, 6, 7};
  CHECK_EQ(resolve_keys(s, known, 3, &out), 3);
  uint32_t rows_of[3] = {out.ids[0][0], out.ids[0][1], out.ids[0][2]};
  dlrec_store_stats before, after;
  dlrec_store_get_stats(s, &before);
  const uint64_t keys[5] = {6, 40, 5, 41, 7};
  uint32_t koff[3] = {0, 3, 5}, roff[3], rids[5];
  const uint32_t *kop[1] = {koff};
  const uint64_t *kp[1] = {keys};
  uint32_t *rop[1] = {roff}, *rip[1] = {rids};
  dlrec_key_batch in = {2, 1, kop, kp, NULL};
  uint64_t missing = 0;
  CHECK_OK(dlrec_store_lookup_keys(s, &in, rop, rip, &missing));
  CHECK_EQ_U64(missing, 2);
  CHECK(roff[0] == 0 && roff[1] == 2 && roff[2] == 3);
  CHECK(rids[0] == rows_of[1] && rids[1] == rows_of[0] && rids[2] == rows_of[2]);
  dlrec_store_get_stats(s, &after);
  CHECK(memcmp(&before, &after, sizeof before) == 0);
  CHECK_EQ_U64(resident_keys(s, 8), 1u << 5 | 1u << 6 | 1u << 7);
  dlrec_store_free(s);
}

/* A checkpoint's view of the bookkeeping: copied into a fresh store and
 * rebuilt, the table looks keys up and resolves the next ones exactly as the original
 * (admission counts, recency, free rows and the eviction draws included);
 * damaged bookkeeping is refused. */
TEST(hash_arrays_restore_a_table_that_then_resolves_the_same) {
  dlrec_store *a = NULL, *b = NULL;
  CHECK_OK(make_hash(&a, 6, 2, DLREC_HASH_EVICT_LRU, 5));
  CHECK_OK(make_hash(&b, 6, 2, DLREC_HASH_EVICT_LRU, 5));
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 4, 0);
  dlrec_bag_batch out;
  for (int i = 0; i < 40; i++) {
    uint64_t k = dlrec_rng_u64(&rng) % 12;
    CHECK(resolve_keys(a, &k, 1, &out) >= 0);
  }
  dlrec_hash_arrays x, y;
  CHECK_OK(dlrec_store_hash_arrays(a, &x));
  CHECK_OK(dlrec_store_hash_arrays(b, &y));
  CHECK(x.meta_words == y.meta_words && x.n_slots == y.n_slots && x.sketch_words == y.sketch_words && x.sketch);
  memcpy(y.meta, x.meta, x.meta_words * 4);
  memcpy(y.free_slots, x.free_slots, x.n_slots * 4);
  memcpy(y.sketch, x.sketch, x.sketch_words * 4);
  memcpy(y.scalars, x.scalars, x.n_scalars * 4);
  CHECK_OK(dlrec_store_hash_rebuild(b));
  /* b's index is rebuilt under its own random secret (a checkpoint holds
   * none): every key is looked up to the same row as in a, or missing in
   * both. */
  for (uint64_t k = 0; k < 12; k++) {
    uint32_t off[2] = {0, 1}, roff_a[2], roff_b[2], row_a = 0, row_b = 0;
    const uint32_t *offp[1] = {off};
    const uint64_t *kp[1] = {&k};
    uint32_t *ra[1] = {roff_a}, *rb[1] = {roff_b}, *ia[1] = {&row_a}, *ib[1] = {&row_b};
    dlrec_key_batch in = {1, 1, offp, kp, NULL};
    uint64_t miss_a = 0, miss_b = 0;
    CHECK_OK(dlrec_store_lookup_keys(a, &in, ra, ia, &miss_a));
    CHECK_OK(dlrec_store_lookup_keys(b, &in, rb, ib, &miss_b));
    CHECK_EQ_U64(miss_a, miss_b);
    if (!miss_a) CHECK_EQ(row_a, row_b);
  }
  for (int i = 0; i < 60; i++) {
    uint64_t k = dlrec_rng_u64(&rng) % 12;
    dlrec_bag_batch oa, ob;
    int na = resolve_keys(a, &k, 1, &oa), nb = resolve_keys(b, &k, 1, &ob);
    CHECK_EQ(na, nb);
    if (na == 1 && nb == 1) CHECK_EQ(oa.ids[0][0], ob.ids[0][0]);
  }
  for (uint32_t r = 0; r < 6; r++) {
    uint64_t ka = 0, kb = 0;
    CHECK_EQ(dlrec_store_key_of(a, r, &ka), dlrec_store_key_of(b, r, &kb));
    CHECK_EQ_U64(ka, kb);
  }
  /* The same key in two rows, a free row in use: refused. */
  CHECK_OK(dlrec_store_hash_arrays(b, &y));
  uint64_t *meta = (uint64_t *)(void *)y.meta;
  int used0 = -1, used1 = -1;
  for (int r = 0; r < 6; r++)
    if (meta[3 * r + 1]) used1 = used0 < 0 ? used1 : r, used0 = used0 < 0 ? r : used0;
  CHECK(used0 >= 0 && used1 >= 0);
  const uint64_t saved = meta[3 * used1];
  meta[3 * used1] = meta[3 * used0];
  CHECK_ERR(dlrec_store_hash_rebuild(b), DLREC_ERR_CORRUPT, "twice");
  meta[3 * used1] = saved;
  CHECK_OK(dlrec_store_hash_rebuild(b));
  y.scalars[2] = 7; /* free rows: 7 of 6 */
  CHECK_ERR(dlrec_store_hash_rebuild(b), DLREC_ERR_CORRUPT, "free rows");
  dlrec_store_free(a);
  dlrec_store_free(b);
}

TEST(hash_config_errors_and_keys_on_other_stores) {
  dlrec_store *s = NULL;
  dlrec_store_config c = {.kind = DLREC_STORE_HASH, .cache_rows = 0};
  CHECK_ERR(dlrec_store_create(&s, &c, 100, DIM, DLREC_TABLE_FP32), DLREC_ERR_INVALID, "cache_rows");
  c.cache_rows = 10;
  c.admit_probability = 2;
  CHECK_ERR(dlrec_store_create(&s, &c, 100, DIM, DLREC_TABLE_FP32), DLREC_ERR_INVALID, "admit_probability");
  CHECK_OK(make_store(&s, DLREC_STORE_RAM, 0, NULL));
  dlrec_bag_batch out;
  const uint64_t k = 1;
  CHECK_EQ(resolve_keys(s, &k, 1, &out), -1);
  CHECK(strstr(dlrec_last_error(), "raw keys need a hash table, not a ram one") != NULL);
  dlrec_store_free(s);
}

/* Admission by probability at several rates, over N keys each seen once (the
 * draws are seeded: the counts are fixed, and asserted within 4 standard
 * deviations of N·p), then seen again in a second resolve, where a key left
 * out draws again (1 - (1 - p)^2 of them in by then). 0 and 1 are not
 * probabilities in (0, 1): admission falls back to the count (admit_min_count
 * 0: the first sighting), so every key is admitted. */
TEST(hash_admission_by_probability_follows_its_rate) {
  enum { N = 20000 };
  uint64_t *keys = malloc(N * sizeof *keys);
  CHECK(keys);
  for (uint64_t i = 0; i < N; i++) keys[i] = (i + 1) * 0x9e3779b97f4a7c15ull;
  const float rates[] = {0.0f, 0.01f, 0.1f, 0.5f, 0.9f, 1.0f};
  for (size_t r = 0; r < sizeof rates / sizeof *rates; r++) {
    const double p = rates[r] > 0.0f && rates[r] < 1.0f ? rates[r] : 1.0;
    dlrec_store *s = NULL;
    dlrec_store_config c = {.kind = DLREC_STORE_HASH, .cache_rows = N, .admit_probability = rates[r], .seed = 3};
    CHECK_OK(dlrec_store_create(&s, &c, 1ull << 32, DIM, DLREC_TABLE_FP32));
    dlrec_bag_batch out;
    dlrec_store_stats st;
    uint64_t first = 0;
    for (int pass = 1; pass <= 2; pass++) {
      CHECK(resolve_keys(s, keys, N, &out) >= 0);
      dlrec_store_get_stats(s, &st);
      const double q = 1.0 - pow(1.0 - p, pass), sd = sqrt(N * q * (1.0 - q));
      if (fabs((double)st.resident - N * q) > 4.0 * sd + 0.5)
        fprintf(stderr, "rate %g, pass %d: %llu admitted, %g expected\n", rates[r], pass,
                (unsigned long long)st.resident, N * q);
      CHECK(fabs((double)st.resident - N * q) <= 4.0 * sd + 0.5);
      CHECK_EQ_U64(st.admitted, st.resident);
      if (pass == 1) first = st.admitted;
    }
    /* The second pass finds the first's keys; every other sighting is a miss,
     * admitted or counted as left out. */
    CHECK_EQ_U64(st.lookups, 2ull * N);
    CHECK_EQ_U64(st.misses, 2ull * N - first);
    CHECK_EQ_U64(st.not_admitted, st.misses - st.admitted);
    CHECK_EQ_U64(st.dropped, 0);
    dlrec_store_free(s);
  }
  free(keys);
}

/* The expiry sweep of a table of C rows with ttl_steps T: each resolve first
 * checks the next min(C, 2C/T + 1) rows from the hand (which starts at row 0
 * and goes round) and frees those whose key was last looked up more than T
 * resolves before. A model of that rule predicts, resolve by resolve,
 * exactly which rows are freed, while resident keys are looked up at random
 * resolves, so that rows are checked at ages T - 1 and T (kept) and T + 1
 * (freed), then no more, until all have expired. */
static void ttl_sweep_case(uint32_t C, uint64_t T, uint64_t draw_seed) {
  enum { MAX_C = 32 };
  CHECK(C <= MAX_C);
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, C, 0, DLREC_HASH_EVICT_LRU, T));
  const uint64_t n = 2 * C / T + 1 > C ? C : 2 * C / T + 1;
  uint64_t keys[MAX_C], seen[MAX_C], hand = 0, expired = 0, at[3] = {0, 0, 0}; /* checked at T - 1, T, T + 1 */
  int resident[MAX_C];
  /* Resolve 1 checks n empty rows, then admits key k into row k. */
  for (uint32_t k = 0; k < C; k++) keys[k] = k, seen[k] = 1, resident[k] = 1;
  dlrec_bag_batch out;
  CHECK_EQ(resolve_keys(s, keys, C, &out), (int)C);
  for (uint32_t k = 0; k < C; k++) CHECK_EQ(out.ids[0][k], k);
  hand = n % C;
  dlrec_rng rng;
  dlrec_rng_seed(&rng, draw_seed, C);
  /* Random lookups, then none, until every row has expired. */
  const uint64_t lookups_until = 6 * T + 10, last = lookups_until + 2 * T + C + 2;
  for (uint64_t step = 2; step <= last; step++) {
    for (uint64_t j = 0; j < n; j++) {
      const uint64_t i = (hand + j) % C, age = step - seen[i];
      if (!resident[i]) continue;
      if (age + 1 >= T && age <= T + 1) at[age + 1 - T]++;
      if (age > T) resident[i] = 0, expired++;
    }
    hand = (hand + n) % C;
    uint32_t nb = 0;
    for (uint32_t k = 0; k < C; k++)
      if (resident[k] && step <= lookups_until && dlrec_rng_u64(&rng) % (T / 2 + 2) == 0) keys[nb++] = k, seen[k] = step;
    CHECK_EQ(resolve_keys(s, keys, nb, &out), (int)nb);
    for (uint32_t r = 0; r < C; r++) {
      uint64_t key = UINT64_MAX;
      const int held = dlrec_store_key_of(s, r, &key);
      if (held != resident[r] || (held && key != r))
        fprintf(stderr, "C %u, ttl %llu, resolve %llu: row %u %s\n", C, (unsigned long long)T,
                (unsigned long long)step, r, held ? "kept" : "freed");
      CHECK_EQ(held, resident[r]);
      if (held) CHECK_EQ_U64(key, r);
    }
    dlrec_store_stats st;
    dlrec_store_get_stats(s, &st);
    CHECK_EQ_U64(st.expired, expired);
    CHECK_EQ_U64(st.admitted, C);
  }
  if (T > 1) CHECK(at[0] > 0);
  CHECK(at[1] > 0 && at[2] > 0);
  CHECK_EQ_U64(expired, C); /* every key expired in the end */
  dlrec_store_free(s);
}

TEST(hash_ttl_sweep_frees_exactly_the_rows_past_their_ttl) {
  ttl_sweep_case(4, 2, 1);   /* the whole table each resolve */
  ttl_sweep_case(5, 1, 2);   /* 2C/T + 1 past the table: the whole table */
  ttl_sweep_case(12, 4, 3);  /* 7 rows a resolve */
  ttl_sweep_case(7, 3, 4);   /* 5 rows a resolve, the hand at a new row each time round */
  ttl_sweep_case(16, 8, 5);  /* 5 rows a resolve */
  ttl_sweep_case(10, 20, 6); /* 2 rows a resolve */
  ttl_sweep_case(32, 6, 7);  /* 11 rows a resolve */
}

/* ---- the index's keyed hash ------------------------------------------------------ */

/* The inverse of the stores' old, unkeyed index hash (the SplitMix64
 * finalizer, dlrec_mix64, which they used until issue 36): the attacker's
 * tool of the tests below. */
static uint64_t unshift(uint64_t x, int s) {
  uint64_t y = x;
  for (int k = 0; k <= 64 / s; k++) y = x ^ (y >> s);
  return y;
}

static uint64_t inverse_mod_2_64(uint64_t a) {
  uint64_t x = a; /* right to 3 bits for odd a; Newton's step doubles them */
  for (int i = 0; i < 5; i++) x *= 2 - a * x;
  return x;
}

/* Key i of n whose old hash is (i + 1) << 32: under it, every key's home in
 * an index of up to 2^32 entries is entry 0, one probe chain for them all. */
static void keys_crafted_against_the_old_hash(uint64_t *keys, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    uint64_t h = unshift((uint64_t)(i + 1) << 32, 31) * inverse_mod_2_64(0x94d049bb133111ebull);
    keys[i] = unshift(unshift(h, 27) * inverse_mod_2_64(0xbf58476d1ce4e5b9ull), 30);
  }
}

/* Every key of keys[0..n) found with slot i, and `absent` ones not. */
static void index_holds(const slot_index *x, const uint64_t *keys, uint32_t n, const uint64_t *absent, uint32_t n_absent) {
  for (uint32_t i = 0; i < n; i++) CHECK_EQ(slot_index_find(x, keys[i]), i);
  for (uint32_t i = 0; i < n_absent; i++) CHECK_EQ(slot_index_find(x, absent[i]), SLOT_INDEX_NONE);
}

/* Keys that all share one home under the old hash spread under the keyed
 * one as random keys do: under a fixed secret (so that the counts are
 * fixed), the longest probe of either set is within the same bound, far
 * below the one chain of N the old hash made of them. */
TEST(slot_index_spreads_keys_crafted_against_the_old_hash) {
  enum { N = 4096, ABSENT = 512 };
  uint64_t *crafted = malloc((N + ABSENT) * sizeof *crafted), *random = malloc(N * sizeof *random);
  CHECK(crafted && random);
  keys_crafted_against_the_old_hash(crafted, N + ABSENT);
  for (uint32_t i = 0; i < N + ABSENT; i++) CHECK_EQ_U64(dlrec_mix64(crafted[i]) & 0xffffffffull, 0);
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 11, 0);
  for (uint32_t i = 0; i < N; i++) random[i] = dlrec_rng_u64(&rng);
  const uint64_t secret[2] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull};
  slot_index a, b;
  CHECK_OK(slot_index_init(&a, N, "crafted"));
  CHECK_OK(slot_index_init(&b, N, "random"));
  slot_index_set_secret(&a, secret);
  slot_index_set_secret(&b, secret);
  for (uint32_t i = 0; i < N; i++) slot_index_insert(&a, crafted[i], i), slot_index_insert(&b, random[i], i);
  const uint64_t pa = slot_index_max_probes(&a), pb = slot_index_max_probes(&b);
  fprintf(stderr, "longest probe of %d keys in %llu entries: crafted %llu, random %llu\n", N,
          (unsigned long long)a.mask + 1, (unsigned long long)pa, (unsigned long long)pb);
  CHECK(pa >= 1 && pa <= 40);
  CHECK(pb >= 1 && pb <= 40);
  /* Without a new secret: the keyed hash did it, not the bound. */
  CHECK_EQ_U64(a.rekeys, 0);
  CHECK_EQ_U64(b.rekeys, 0);
  CHECK(a.secret[0] == secret[0] && a.secret[1] == secret[1]);
  index_holds(&a, crafted, N, crafted + N, ABSENT);
  index_holds(&b, random, N, crafted, 16);
  /* Rehashed in place under other secrets, with half the keys removed in
   * between: every key still found, probes as short. */
  const uint64_t other[2] = {0xbe5466cf34e90c6cull, 0xc0ac29b7c97c50ddull}, third[2] = {1, 2};
  slot_index_set_secret(&b, other);
  CHECK(slot_index_max_probes(&b) <= 40);
  index_holds(&b, random, N, crafted, 16);
  for (uint32_t i = N / 2; i < N; i++) slot_index_remove(&b, random[i]);
  slot_index_set_secret(&b, third);
  CHECK(slot_index_max_probes(&b) <= 40);
  index_holds(&b, random, N / 2, random + N / 2, N / 2);
  CHECK_EQ_U64(b.rekeys, 0);
  slot_index_free(&a);
  slot_index_free(&b);
  free(crafted);
  free(random);
}

/* One who knows the secret can make keys share a home; the 257th of them
 * would need 257 probes: the insert draws a new secret and rehashes in
 * place, the keys keep their slots, probes are short again, and removal
 * (backward shift) works on the new layout. */
TEST(slot_index_insert_past_the_probe_bound_draws_a_new_secret) {
  enum { N = 300 };
  const uint64_t secret[2] = {0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  slot_index x;
  CHECK_OK(slot_index_init(&x, 512, "bounded"));
  slot_index_set_secret(&x, secret);
  uint64_t keys[N], other[64];
  uint32_t n = 0, n_other = 0;
  for (uint64_t k = 1; n < N; k++) {
    if (slot_index_home(&x, k) == 0) keys[n++] = k;
    else if (n_other < 64) other[n_other++] = k;
  }
  for (uint32_t i = 0; i < SLOT_INDEX_MAX_PROBES; i++) slot_index_insert(&x, keys[i], i);
  CHECK_EQ_U64(slot_index_max_probes(&x), SLOT_INDEX_MAX_PROBES); /* at the bound, not past it */
  CHECK_EQ_U64(x.rekeys, 0);
  index_holds(&x, keys, SLOT_INDEX_MAX_PROBES, other, 64);
  slot_index_insert(&x, keys[SLOT_INDEX_MAX_PROBES], SLOT_INDEX_MAX_PROBES);
  CHECK_EQ_U64(x.rekeys, 1);
  CHECK(x.secret[0] != secret[0] || x.secret[1] != secret[1]);
  CHECK_EQ_U64(x.probe_limit, SLOT_INDEX_MAX_PROBES);
  for (uint32_t i = SLOT_INDEX_MAX_PROBES + 1; i < N; i++) slot_index_insert(&x, keys[i], i);
  CHECK(slot_index_max_probes(&x) <= 64);
  index_holds(&x, keys, N, other, 64);
  /* Every other key out: the rest still found, the removed ones not. */
  for (uint32_t i = 0; i < N; i += 2) slot_index_remove(&x, keys[i]);
  for (uint32_t i = 0; i < N; i++) CHECK_EQ(slot_index_find(&x, keys[i]), i % 2 ? i : SLOT_INDEX_NONE);
  /* Rehashed under the first secret again: the odd keys are one chain of
   * 150 from entry 0, within the bound; each found. */
  slot_index_set_secret(&x, secret);
  CHECK_EQ_U64(slot_index_max_probes(&x), N / 2);
  CHECK_EQ_U64(x.rekeys, 1);
  for (uint32_t i = 0; i < N; i++) CHECK_EQ(slot_index_find(&x, keys[i]), i % 2 ? i : SLOT_INDEX_NONE);
  slot_index_free(&x);
}

/* An index filled past what any secret can keep within the bound (all but
 * one of its entries taken: one run of them all): a rehash that finds the
 * bound broken tries exactly SLOT_INDEX_MAX_REKEYS new secrets, then lifts
 * the bound, and every key is still found. */
TEST(slot_index_overfilled_tries_every_secret_then_lifts_the_bound) {
  slot_index x;
  CHECK_OK(slot_index_init(&x, 300, "overfilled"));
  const uint64_t n = x.mask; /* every entry but one */
  CHECK(n > SLOT_INDEX_MAX_PROBES && n < 4096);
  x.probe_limit = x.mask + 1; /* filled without the bound */
  uint64_t keys[4096], absent[8];
  for (uint64_t i = 0; i < n; i++) {
    keys[i] = 0x9e3779b97f4a7c15ull * (i + 1);
    slot_index_insert(&x, keys[i], (uint32_t)i);
  }
  for (uint32_t i = 0; i < 8; i++) absent[i] = 0x9e3779b97f4a7c15ull * (n + 1 + i);
  CHECK_EQ_U64(x.rekeys, 0);
  x.probe_limit = SLOT_INDEX_MAX_PROBES;
  const uint64_t secret[2] = {1, 2};
  slot_index_set_secret(&x, secret);
  CHECK_EQ_U64(x.rekeys, SLOT_INDEX_MAX_REKEYS);
  CHECK_EQ_U64(x.probe_limit, x.mask + 1);
  CHECK(slot_index_max_probes(&x) > SLOT_INDEX_MAX_PROBES);
  index_holds(&x, keys, (uint32_t)n, absent, 8);
  slot_index_free(&x);
}

/* Each index draws its own secret; the keyed hash is SipHash: the reference
 * implementation's vector for SipHash-2-4 (key 00..0f, message 00..07), and
 * CPython's SipHash-1-3 under its zero key (PYTHONHASHSEED=0 python3 -c
 * 'print(hex(hash(bytes(range(8))) % 2**64))'). */
TEST(slot_index_secrets_differ_and_the_hash_is_siphash) {
  slot_index a, b;
  CHECK_OK(slot_index_init(&a, 8, "a"));
  CHECK_OK(slot_index_init(&b, 8, "b"));
  CHECK(a.secret[0] != b.secret[0] || a.secret[1] != b.secret[1]);
  slot_index_free(&a);
  slot_index_free(&b);
  const uint64_t m = 0x0706050403020100ull;
  CHECK_EQ_U64(dlrec_siphash_u64(m, 0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull, 2, 4), 0x93f5f5799a932462ull);
  CHECK_EQ_U64(dlrec_siphash13_u64(m, 0, 0), 0xead411e67ebe2eeaull);
}

/* The same attack on a hash store (one column of keys crafted against the
 * old hash, scaled down from the 60,000 that made training 15 times slower):
 * under its random secret the index's longest probe is as short as random
 * keys', and absent crafted keys are looked up as missing. */
TEST(hash_store_index_spreads_keys_crafted_against_the_old_hash) {
  enum { N = 4096 };
  uint64_t *keys = malloc(2 * N * sizeof *keys);
  CHECK(keys);
  keys_crafted_against_the_old_hash(keys, 2 * N);
  dlrec_store *s = NULL;
  CHECK_OK(make_hash(&s, N, 0, DLREC_HASH_EVICT_LRU, 0));
  dlrec_bag_batch out;
  CHECK_EQ(resolve_keys(s, keys, N, &out), N);
  const uint64_t probes = dlrec_store_index_max_probes(s);
  fprintf(stderr, "longest probe of %d crafted keys: %llu\n", N, (unsigned long long)probes);
  /* Random keys at this load: 11 to 54 in 20,000 draws; past 128 about once
   * in 10^10. */
  CHECK(probes >= 1 && probes <= 128);
  uint32_t off[2] = {0, N}, roff[2], *rids = malloc(N * sizeof *rids);
  const uint32_t *offp[1] = {off};
  const uint64_t *kp[1] = {keys + N};
  uint32_t *rop[1] = {roff}, *rip[1] = {rids};
  dlrec_key_batch in = {1, 1, offp, kp, NULL};
  uint64_t missing = 0;
  CHECK_OK(dlrec_store_lookup_keys(s, &in, rop, rip, &missing));
  CHECK_EQ_U64(missing, N);
  kp[0] = keys;
  CHECK_OK(dlrec_store_lookup_keys(s, &in, rop, rip, &missing));
  CHECK_EQ_U64(missing, 0);
  for (uint32_t i = 0; i < N; i++) CHECK_EQ(rids[i], out.ids[0][i]);
  CHECK_EQ_U64(dlrec_store_index_max_probes(NULL), 0);
  free(rids);
  free(keys);
  dlrec_store_free(s);
}

/* ---- memory ----------------------------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif

#ifndef UNDER_ASAN
/* The process's resident set now: the "Rss:" of /proc/self/smaps_rollup
 * (the pages mapped now, file pages included). */
static uint64_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Rss: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}
#endif

/* A tiered table ten times its cache, trained on ids spread over all of it
 * and then read whole as a checkpoint does: RSS grows by the cache, its
 * bookkeeping and the pages in flight (store.h), not by the table. */
TEST(tiered_rss_stays_within_the_cache_and_its_stated_overhead) {
#ifdef UNDER_ASAN
  fprintf(stderr, "skipped under AddressSanitizer: its shadow memory counts in RSS\n");
  return;
#else
  enum { BIG_ROWS = 4 << 20, BIG_DIM = 16, BB = 2048, BF = 26, STEPS = 30 };
  const uint64_t cache = BIG_ROWS / 10, table_bytes = (uint64_t)BIG_ROWS * BIG_DIM * 4;
  uint32_t *off = malloc((BB + 1) * sizeof *off), *ids = malloc((size_t)BB * BF * sizeof *ids);
  float *out = malloc((size_t)BB * BF * BIG_DIM * sizeof *out);
  void *scratch = NULL;
  CHECK(off && ids && out);
  for (uint32_t b = 0; b <= BB; b++) off[b] = b;
  const uint64_t before = rss_bytes();
  dlrec_store *s = NULL;
  dlrec_store_config c = {.kind = DLREC_STORE_TIERED, .path = test_path("big.table"), .cache_rows = cache};
  CHECK_OK(dlrec_store_create(&s, &c, BIG_ROWS, BIG_DIM, DLREC_TABLE_FP32));
  const dlrec_row_range all = {.begin = 0, .end = BIG_ROWS};
  CHECK_OK(dlrec_store_init_uniform(s, &all, 1, 5));
  dlrec_sparse_optim_config oc;
  dlrec_sparse_optim_config_default(&oc, DLREC_SPARSE_ROWWISE_ADAGRAD);
  dlrec_sparse_optim *o = NULL;
  CHECK_OK(dlrec_store_optim_create(s, &oc, &o));
  size_t scratch_bytes = dlrec_bag_backward_scratch_bytes(dlrec_store_table(s), (uint64_t)BB * BF);
  scratch = malloc(scratch_bytes);
  CHECK(scratch);
  const uint32_t *offp[BF], *idp[BF];
  for (int c2 = 0; c2 < BF; c2++) offp[c2] = off, idp[c2] = ids + (size_t)c2 * BB;
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 11, 0);
  uint64_t peak = 0;
  for (int step = 0; step < STEPS && !test_failed_now(); step++) {
    for (size_t i = 0; i < (size_t)BB * BF; i++) ids[i] = dlrec_rng_below(&rng, BIG_ROWS);
    dlrec_bag_batch in = {BB, BF, offp, idp, NULL}, r;
    CHECK_OK(dlrec_store_resolve(s, &in, &r, 1));
    CHECK_OK(cpu_bag_forward(out, dlrec_store_table(s), &r, DLREC_POOLING_SUM));
    CHECK_OK(cpu_bag_backward_update(dlrec_store_table(s), o, &r, DLREC_POOLING_SUM, out, scratch, scratch_bytes));
    uint64_t now = rss_bytes();
    if (now > peak) peak = now;
  }
  /* A checkpoint's pass over the whole table, then the unmap. */
  dlrec_store_view v;
  CHECK_OK(dlrec_store_map(s, &v));
  double sum = 0;
  for (size_t i = 0; i < (size_t)BIG_ROWS * BIG_DIM; i += 1024) sum += ((const float *)v.table)[i];
  dlrec_store_unmap(s, &v);
  const uint64_t after_view = rss_bytes();
  /* The budget: the cache's rows and Adagrad state, the store's bookkeeping
   * and write-back buffer, the scratch, the pages in flight that store.h
   * states (32 MiB of each of the file's 2 arrays, the accumulators' far
   * fewer), and 16 MiB of slack for the allocator. */
  const uint64_t budget = cache * (BIG_DIM * 4 + 4) + dlrec_store_overhead_bytes(s) + scratch_bytes +
                          2 * (32ull << 20) + (16ull << 20);
  fprintf(stderr, "table %llu MiB, budget %llu MiB; RSS growth: peak %llu MiB, after a full view %llu MiB (sum %g)\n",
          (unsigned long long)(table_bytes >> 20), (unsigned long long)(budget >> 20),
          (unsigned long long)((peak - before) >> 20), (unsigned long long)((after_view - before) >> 20), sum);
  CHECK(budget < table_bytes); /* the bound means something */
  CHECK(peak - before <= budget);
  CHECK(after_view - before <= budget);
  dlrec_store_stats st;
  dlrec_store_get_stats(s, &st);
  CHECK(st.evictions > 0);
  dlrec_sparse_optim_free(o);
  dlrec_store_free(s);
  free(off), free(ids), free(out), free(scratch);
#endif
}

/* ---- the distinct rows of a batch (embed/unique.h) ---- */

/* dlrec_unique_run against a naive quadratic search, over runs of several
 * sizes (past the set's first 64 slots, with many repeats and with none)
 * through one set that must come back empty each time; and the room grown
 * between runs. */
TEST(unique_keys_are_first_seen_and_each_lookup_finds_its_own) {
  dlrec_unique u = {0};
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 11, 0);
  const uint64_t sizes[] = {0, 1, 7, 64, 65, 500, 4096};
  uint64_t *keys = malloc(4096 * sizeof *keys), *uniq = malloc(4096 * sizeof *uniq);
  uint32_t *pos = malloc(4096 * sizeof *pos);
  CHECK(keys && uniq && pos);
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    const uint64_t n = sizes[si];
    CHECK_OK(dlrec_unique_reserve(&u, n));
    for (int repeats = 0; repeats < 2; repeats++) {
      /* Few distinct values (many repeats), or values from a wide range
       * with high words set (keys such as owner << 32 | row). */
      for (uint64_t k = 0; k < n; k++)
        keys[k] = repeats ? (uint64_t)(dlrec_rng_uniform(&rng) * 13) : dlrec_rng_u64(&rng) >> 1;
      uint64_t m = UINT64_MAX;
      dlrec_unique_run(&u, keys, n, uniq, &m, pos);
      uint64_t want = 0;
      for (uint64_t k = 0; k < n; k++) {
        uint64_t j = 0;
        while (j < want && uniq[j] != keys[k]) j++;
        if (j == want) {
          CHECK_EQ_U64(uniq[want], keys[k]); /* a new key comes next, in first-seen order */
          want++;
        }
        CHECK_EQ_U64(pos[k], j);
      }
      CHECK_EQ_U64(m, want);
      for (uint64_t s = 0; s < u.set_cap; s++) CHECK_EQ_U64(u.set_key[s], UINT64_MAX); /* emptied */
    }
  }
  CHECK(u.set_cap >= 2 * 4096);
  dlrec_unique_free(&u);
  CHECK(!u.set_key && !u.cap);
  free(keys), free(uniq), free(pos);
}

/* A hash table draws each admitted key's row as its init says (here
 * N(0, 0.01)): the rows' variance and their share within one standard
 * deviation are the normal's, and the draw depends on the key alone. */
TEST(hash_draws_new_rows_with_its_initializer) {
  enum { N = 2000 };
  dlrec_store_config c = {.kind = DLREC_STORE_HASH, .cache_rows = N, .init = {DLREC_INIT_NORMAL, 0.01f}, .seed = 9};
  dlrec_store *s = NULL, *again = NULL;
  CHECK_OK(dlrec_store_create(&s, &c, 1ull << 32, DIM, DLREC_TABLE_FP32));
  CHECK_OK(dlrec_store_create(&again, &c, 1ull << 32, DIM, DLREC_TABLE_FP32));
  static uint64_t keys[N];
  for (int i = 0; i < N; i++) keys[i] = 1000003ull * (uint64_t)i + 17;
  dlrec_bag_batch out;
  CHECK_EQ(resolve_keys(s, keys, N, &out), N);
  double sq = 0, within = 0;
  float row[DIM], other[DIM];
  for (uint32_t r = 0; r < N; r++) {
    dlrec_table_get_row(dlrec_store_table(s), r, row);
    for (int d = 0; d < DIM; d++) {
      sq += (double)row[d] * row[d];
      within += fabsf(row[d]) <= 0.01f;
    }
  }
  const double n = (double)N * DIM;
  CHECK(fabs(sq / n / 1e-4 - 1) < 6 * sqrt(2 / n));
  CHECK(fabs(within / n - 0.682689) < 6 * sqrt(0.25 / n));
  /* Key 42's row is the same whenever it is admitted. */
  const uint64_t k42 = keys[42];
  CHECK_EQ(resolve_keys(again, &k42, 1, &out), 1);
  dlrec_table_get_row(dlrec_store_table(again), out.ids[0][0], other);
  uint64_t key = 0;
  for (uint32_t r = 0; r < N; r++)
    if (dlrec_store_key_of(s, r, &key) && key == k42) dlrec_table_get_row(dlrec_store_table(s), r, row);
  CHECK(memcmp(row, other, sizeof row) == 0);
  dlrec_store_free(s);
  dlrec_store_free(again);
  /* The default kind: uniform in +-init_range (variance init_range^2 / 3). */
  c.init = (dlrec_embed_init){DLREC_INIT_UNIFORM_SQRT_ROWS, 0};
  c.init_range = 0.5f;
  CHECK_OK(dlrec_store_create(&s, &c, 1ull << 32, DIM, DLREC_TABLE_FP32));
  CHECK_EQ(resolve_keys(s, keys, N, &out), N);
  double maxabs = 0;
  sq = 0;
  for (uint32_t r = 0; r < N; r++) {
    dlrec_table_get_row(dlrec_store_table(s), r, row);
    for (int d = 0; d < DIM; d++) {
      sq += (double)row[d] * row[d];
      if (fabsf(row[d]) > maxabs) maxabs = fabsf(row[d]);
    }
  }
  CHECK(maxabs <= 0.5 && maxabs > 0.49);
  CHECK(fabs(sq / n / (0.25 / 3) - 1) < 6 * sqrt(0.8 / n));
  dlrec_store_free(s);
}
