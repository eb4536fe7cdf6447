/* Core: status/errors, arena, rng, hashing, CRC32C, JSON, pipeline, fs. */
#include <pthread.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/crc32c.h"
#include "core/fsutil.h"
#include "core/hash.h"
#include "core/json.h"
#include "core/pipeline.h"
#include "core/rng.h"
#include "test.h"

uint32_t dlrec_crc32c_soft(uint32_t crc, const void *data, size_t n);

TEST(error_message_and_context) {
  CHECK_EQ(dlrec_error(DLREC_ERR_PARSE, "f.tsv:%d: field %d: bad", 7, 3), DLREC_ERR_PARSE);
  CHECK_STR(dlrec_last_error(), "f.tsv:7: field 3: bad");
  CHECK_EQ(dlrec_error_context("loading %s: ", "x"), DLREC_ERR_PARSE);
  CHECK_STR(dlrec_last_error(), "loading x: f.tsv:7: field 3: bad");
  dlrec_error_copy c;
  dlrec_error_save(&c);
  dlrec_clear_error();
  CHECK_STR(dlrec_last_error(), "");
  CHECK_EQ(dlrec_error_restore(&c), DLREC_ERR_PARSE);
  CHECK_STR(dlrec_last_error(), "loading x: f.tsv:7: field 3: bad");
}

static void *set_error_thread(void *arg) {
  dlrec_error(DLREC_ERR_IO, "from a thread");
  *(int *)arg = strcmp(dlrec_last_error(), "from a thread") == 0;
  return NULL;
}

TEST(error_is_thread_local) {
  dlrec_error(DLREC_ERR_PARSE, "main");
  pthread_t t;
  int ok = 0;
  pthread_create(&t, NULL, set_error_thread, &ok);
  pthread_join(t, NULL);
  CHECK(ok);
  CHECK_STR(dlrec_last_error(), "main");
}

TEST(arena_alignment_and_growth) {
  dlrec_arena a;
  dlrec_arena_init(&a, 1024);
  char *prev = NULL;
  for (int i = 0; i < 100; i++) {
    size_t align = (size_t)1 << (i % 8);
    char *p = dlrec_arena_alloc(&a, 100 + (size_t)i, align);
    CHECK(p != NULL);
    CHECK(((uintptr_t)p & (align - 1)) == 0);
    for (int k = 0; k < 100 + i; k++) CHECK(p[k] == 0);
    memset(p, 0xab, 100 + (size_t)i); /* ASan catches overlap or overrun */
    CHECK(p != prev);
    prev = p;
  }
  char *big = dlrec_arena_alloc(&a, 1 << 20, 64); /* larger than a block */
  CHECK(big != NULL);
  memset(big, 1, 1 << 20);
  CHECK(dlrec_arena_alloc(&a, 8, 3) == NULL); /* not a power of two */
  CHECK_STR(dlrec_arena_strdup(&a, "hello"), "hello");
  dlrec_arena_free(&a);
}

/* Blocks of 2 MiB and more come from mmap and are not cleared as handed
 * out: every allocation from one must still read zero, after earlier ones
 * in the same block were written, and after an arena was freed and a new
 * one took (maybe) the same pages. */
TEST(arena_mapped_blocks_hand_out_zeros) {
  for (int round = 0; round < 3; round++) {
    dlrec_arena a;
    dlrec_arena_init(&a, (size_t)8 << 20); /* one mapped block for the first allocations */
    for (int i = 0; i < 6; i++) {
      const size_t n = ((size_t)1 << 20) + 4096 * (size_t)i + 13;
      unsigned char *p = dlrec_arena_alloc(&a, n, 64);
      CHECK(p != NULL);
      if (!p) break;
      size_t nonzero = 0;
      for (size_t k = 0; k < n; k++) nonzero += p[k] != 0;
      CHECK_EQ_U64(nonzero, 0);
      memset(p, 0xcd, n); /* dirty it: the next allocation must not see this */
    }
    dlrec_arena_free(&a);
  }
}

/* A request so large that the bump pointer plus its size wraps around the
 * address space must fail, not return a pointer into the current block. */
TEST(arena_refuses_sizes_that_would_wrap) {
  dlrec_arena a;
  dlrec_arena_init(&a, 1024);
  CHECK(dlrec_arena_alloc(&a, 16, 16) != NULL); /* a block exists */
  const size_t huge[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - 4096, SIZE_MAX / 2 + 1};
  for (size_t k = 0; k < sizeof huge / sizeof huge[0]; k++) {
    dlrec_clear_error();
    CHECK(dlrec_arena_alloc(&a, huge[k], 16) == NULL);
    CHECK(strstr(dlrec_last_error(), "arena:"));
  }
  CHECK(dlrec_arena_alloc(&a, 16, 16) != NULL); /* still usable */
  dlrec_arena_free(&a);
}

#ifdef TEST_ASAN
#include <sanitizer/asan_interface.h>

/* Under ASan, what the arena has not handed out is poisoned: the gap after
 * each allocation, the rest of the block, and a later block's tail, so that
 * an overrun of one arena array is reported (the loader's segment arrays, a
 * workspace's activations). What it hands out is addressable. */
TEST(arena_poisons_what_it_has_not_handed_out) {
  dlrec_arena a;
  dlrec_arena_init(&a, 4096);
  char *prev = NULL;
  size_t prev_n = 0;
  for (int i = 0; i < 200; i++) {
    size_t n = 1 + (size_t)(i * 37) % 300, align = (size_t)1 << (i % 7);
    char *p = dlrec_arena_alloc(&a, n, align);
    CHECK(p != NULL);
    CHECK(__asan_region_is_poisoned(p, n) == NULL);
    CHECK(__asan_address_is_poisoned(p + n));     /* one past the end */
    CHECK(__asan_address_is_poisoned(p - 1));     /* the redzone, or the block header */
    if (prev) CHECK(__asan_address_is_poisoned(prev + prev_n)); /* the neighbour stays poisoned */
    prev = p, prev_n = n;
  }
  char *s = dlrec_arena_strdup(&a, "abc");
  CHECK(s && __asan_address_is_poisoned(s + 4));
  dlrec_arena_free(&a);
}
#endif

TEST(rng_deterministic_and_streams_differ) {
  dlrec_rng a, b, c;
  dlrec_rng_seed(&a, 42, 0);
  dlrec_rng_seed(&b, 42, 0);
  dlrec_rng_seed(&c, 42, 1);
  int same_c = 0;
  for (int i = 0; i < 1000; i++) {
    uint64_t x = dlrec_rng_u64(&a), y = dlrec_rng_u64(&b), z = dlrec_rng_u64(&c);
    CHECK_EQ_U64(x, y);
    same_c += x == z;
  }
  CHECK(same_c == 0);
}

TEST(rng_below_uniform) {
  /* Chi-square over 10 buckets, 100k draws: 99.9% quantile of chi2(9) is 27.9. */
  dlrec_rng r;
  dlrec_rng_seed(&r, 7, 3);
  int counts[10] = {0};
  for (int i = 0; i < 100000; i++) {
    uint32_t v = dlrec_rng_below(&r, 10);
    CHECK(v < 10);
    counts[v]++;
  }
  double chi2 = 0;
  for (int k = 0; k < 10; k++) chi2 += (counts[k] - 10000.0) * (counts[k] - 10000.0) / 10000.0;
  CHECK(chi2 < 27.9);
  double sum = 0, sq = 0;
  for (int i = 0; i < 100000; i++) {
    double u = dlrec_rng_uniform(&r);
    CHECK(u >= 0 && u < 1);
    double z = dlrec_rng_normal(&r);
    sum += z;
    sq += z * z;
  }
  CHECK_NEAR(sum / 100000, 0, 0.02, 0);
  CHECK_NEAR(sq / 100000, 1, 0.03, 0);
}

TEST(rng_shuffle_is_permutation) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 1, 0);
  uint32_t v[257];
  for (uint32_t i = 0; i < 257; i++) v[i] = i;
  dlrec_rng_shuffle_u32(&r, v, 257);
  int seen[257] = {0}, moved = 0;
  for (uint32_t i = 0; i < 257; i++) {
    CHECK(v[i] < 257 && !seen[v[i]]);
    seen[v[i]] = 1;
    moved += v[i] != i;
  }
  CHECK(moved > 200);
}

TEST(hash_bytes_stable_and_sensitive) {
  /* Values are part of the file formats: pinned here so a change is noticed. */
  uint64_t h = dlrec_hash_bytes("abc", 3, 0);
  CHECK(h == dlrec_hash_bytes("abc", 3, 0));
  CHECK(h != dlrec_hash_bytes("abd", 3, 0));
  CHECK(h != dlrec_hash_bytes("abc", 3, 1));
  CHECK(dlrec_hash_bytes("", 0, 0) != dlrec_hash_bytes("\0", 1, 0));
  CHECK(dlrec_hash_bytes("12345678", 8, 0) != dlrec_hash_bytes("123456789", 9, 0));
}

TEST(crc32c_known_values) {
  CHECK_EQ_U64(dlrec_crc32c(0, "123456789", 9), 0xE3069283u);
  CHECK_EQ_U64(dlrec_crc32c_soft(0, "123456789", 9), 0xE3069283u);
  unsigned char zeros[32] = {0};
  CHECK_EQ_U64(dlrec_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
  /* Incremental equals one-shot, and hardware equals software, at odd offsets. */
  unsigned char buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 37 + 11);
  for (int off = 0; off < 9; off++) {
    uint32_t one = dlrec_crc32c(0, buf + off, 900);
    uint32_t two = dlrec_crc32c(dlrec_crc32c(0, buf + off, 333), buf + off + 333, 567);
    CHECK_EQ_U64(one, two);
    CHECK_EQ_U64(one, dlrec_crc32c_soft(0, buf + off, 900));
  }
}

TEST(json_errors_name_line_and_field) {
  const char *p = test_path("bad.json");
  CHECK(test_write_file(p, "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n", (size_t)-1) == 0);
  cJSON *j = NULL;
  CHECK_ERR(dlrec_json_read(p, &j), DLREC_ERR_PARSE, "bad.json:3:");
  CHECK_ERR(dlrec_json_read(test_path("missing.json"), &j), DLREC_ERR_IO, "missing.json");

  const char *q = test_path("ok.json");
  CHECK(test_write_file(q, "{\"n\": 3, \"x\": 2.5, \"s\": \"hi\", \"neg\": -1, \"f\": 1.5, \"t\": true}", (size_t)-1) == 0);
  CHECK_OK(dlrec_json_read(q, &j));
  uint64_t n;
  double x;
  const char *s;
  int t;
  CHECK_OK(dlrec_json_get_u64(j, "n", "cfg", &n));
  CHECK_EQ(n, 3);
  CHECK_OK(dlrec_json_get_double(j, "x", "cfg", &x));
  CHECK_NEAR(x, 2.5, 0, 0);
  CHECK_OK(dlrec_json_get_string(j, "s", "cfg", &s));
  CHECK_STR(s, "hi");
  CHECK_OK(dlrec_json_get_bool_or(j, "t", "cfg", 0, &t));
  CHECK(t == 1);
  CHECK_OK(dlrec_json_get_u64_or(j, "absent", "cfg", 9, &n));
  CHECK_EQ(n, 9);
  CHECK_ERR(dlrec_json_get_u64(j, "neg", "cfg", &n), DLREC_ERR_INVALID, "cfg: field 'neg'");
  CHECK_ERR(dlrec_json_get_u64(j, "f", "cfg", &n), DLREC_ERR_INVALID, "field 'f'");
  CHECK_ERR(dlrec_json_get_string(j, "n", "cfg", &s), DLREC_ERR_INVALID, "expected a string");
  CHECK_ERR(dlrec_json_get_u64(j, "nope", "cfg", &n), DLREC_ERR_INVALID, "missing field 'nope'");
  const char *known[] = {"n", "x", "s", "neg", "f", NULL};
  CHECK_ERR(dlrec_json_check_keys(j, "cfg", known), DLREC_ERR_INVALID, "unknown field 't'");
  CHECK_OK(dlrec_json_write(test_path("out.json"), j));
  cJSON_Delete(j);
  CHECK_OK(dlrec_json_read(test_path("out.json"), &j));
  CHECK_OK(dlrec_json_get_u64(j, "n", "cfg", &n));
  CHECK_EQ(n, 3);
  cJSON_Delete(j);
  CHECK(access(test_path("out.json.tmp"), F_OK) != 0); /* no temp left behind */
}

/* A pipeline that squares numbers: the consumer must see them in order. */
typedef struct sq_ctx {
  uint64_t n, fail_at;
  uint64_t next_expected, sum;
  int bad_order;
} sq_ctx;
typedef struct sq_job {
  uint64_t in, out;
} sq_job;

static dlrec_status sq_produce(void *ctx, void *job, uint64_t seq) {
  sq_ctx *c = ctx;
  if (seq >= c->n) return DLREC_END;
  ((sq_job *)job)->in = seq;
  return DLREC_OK;
}
static dlrec_status sq_work(void *ctx, void *job, int worker) {
  sq_job *j = job;
  if (j->in == ((sq_ctx *)ctx)->fail_at) return dlrec_error(DLREC_ERR_PARSE, "job %llu failed", (unsigned long long)j->in);
  if (j->in % 7 == 0) usleep(100); /* perturb completion order */
  j->out = j->in * j->in;
  return DLREC_OK;
}
static dlrec_status sq_consume(void *ctx, void *job, uint64_t seq) {
  sq_ctx *c = ctx;
  sq_job *j = job;
  if (j->in != seq || seq != c->next_expected) c->bad_order = 1;
  c->next_expected++;
  c->sum += j->out;
  return DLREC_OK;
}

TEST(pipeline_orders_and_fails_cleanly) {
  dlrec_pipeline_ops ops = {sq_produce, sq_work, sq_consume};
  sq_job slots[5];
  void *jobs[5];
  for (int i = 0; i < 5; i++) jobs[i] = &slots[i];
  for (int workers = 0; workers <= 3; workers++) {
    sq_ctx c = {.n = 1000, .fail_at = UINT64_MAX};
    CHECK_OK(dlrec_pipeline_run(&ops, &c, jobs, 5, workers));
    CHECK(!c.bad_order);
    CHECK_EQ_U64(c.next_expected, 1000);
    CHECK_EQ_U64(c.sum, 332833500ull); /* sum of squares 0..999 */
    sq_ctx f = {.n = 1000, .fail_at = 500};
    CHECK_ERR(dlrec_pipeline_run(&ops, &f, jobs, 5, workers), DLREC_ERR_PARSE, "job 500 failed");
    CHECK_EQ_U64(f.next_expected, 500); /* everything before the failure was consumed */
  }
  sq_ctx e = {.n = 0, .fail_at = UINT64_MAX};
  CHECK_OK(dlrec_pipeline_run(&ops, &e, jobs, 1, 2));
  CHECK_EQ_U64(e.next_expected, 0);
}

TEST(fs_atomic_write_and_mkdirs) {
  char dir[2048];
  snprintf(dir, sizeof dir, "%s/a/b/c", test_tmpdir());
  CHECK_OK(dlrec_mkdirs(dir));
  CHECK_OK(dlrec_mkdirs(dir)); /* existing is fine */
  char path[2100];
  CHECK_OK(dlrec_path_join(path, sizeof path, dir, "f.bin"));
  CHECK_OK(dlrec_write_file_atomic(path, "hello", 5));
  char *data;
  size_t n;
  CHECK_OK(dlrec_read_file(path, 100, &data, &n));
  CHECK_EQ(n, 5);
  CHECK_STR(data, "hello");
  free(data);
  CHECK_ERR(dlrec_read_file(path, 4, &data, &n), DLREC_ERR_INVALID, "limit");
  CHECK_ERR(dlrec_mkdirs(path), DLREC_ERR_IO, "f.bin");
}
