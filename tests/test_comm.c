/* Communicators (dist/comm.h): the single-process one in any process, and,
 * when an MPI launcher started this test (CTest's comm_mpi runs it under
 * mpirun with 2, 3 and 4 ranks), every collective across the ranks.
 *
 * Each rank's inputs come from a generator seeded with the rank, so every
 * rank computes every other rank's inputs, and so the exact expected result,
 * by itself. A failed check across ranks ends the whole job
 * (dlrec_comm_abort) rather than leave the other ranks waiting in a
 * collective.
 */
#include <time.h>

#include "dist/comm_impl.h" /* max_message_bytes, to exercise the pieces */
#include "dist/comm.h"
#include "core/rng.h"
#include "test.h"

static int launched_by_mpi(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

/* ---- the single-process communicator ---- */

TEST(single_is_rank_0_of_1) {
  dlrec_comm *c = NULL;
  CHECK_OK(dlrec_comm_open_single(&c));
  CHECK_EQ(dlrec_comm_rank(c), 0);
  CHECK_EQ(dlrec_comm_size(c), 1);
  CHECK_STR(dlrec_comm_name(c), "single");
  CHECK_OK(dlrec_comm_barrier(c));
  dlrec_comm_abort(c, 3); /* returns: there is no job to end */
  CHECK_EQ_U64(dlrec_comm_bytes_sent(c), 0);
  /* The timeout: 1800 s until set, 0 (forever) for anything not positive. */
  CHECK(dlrec_comm_timeout(c) == DLREC_COMM_TIMEOUT_DEFAULT_S && DLREC_COMM_TIMEOUT_DEFAULT_S == 1800.0);
  dlrec_comm_set_timeout(c, 2.5);
  CHECK(dlrec_comm_timeout(c) == 2.5);
  dlrec_comm_set_timeout(c, -1);
  CHECK(dlrec_comm_timeout(c) == 0);
  dlrec_comm_free(c);
  dlrec_comm_free(NULL);
}

TEST(single_collectives_copy) {
  dlrec_comm *c = NULL;
  CHECK_OK(dlrec_comm_open_single(&c));
  char buf[32] = "abcdefghijklmnopqrstuvwxyz";
  char out[32] = {0};
  uint64_t n = 10;
  CHECK_OK(dlrec_comm_alltoallv(c, buf, &n, out, &n));
  CHECK(!memcmp(out, "abcdefghij", 10));
  /* Overlapping buffers are copied as by memmove. */
  CHECK_OK(dlrec_comm_alltoallv(c, buf, &n, buf + 2, &n));
  CHECK(!memcmp(buf, "ababcdefghijmn", 14));
  uint64_t m = 9;
  CHECK_ERR(dlrec_comm_alltoallv(c, buf, &n, out, &m), DLREC_ERR_INVALID, "rank 0 sends itself 10 bytes but expects 9");

  uint64_t u = 0x0123456789abcdefULL, v = 0;
  CHECK_OK(dlrec_comm_alltoall_u64(c, &u, &v));
  CHECK_EQ_U64(v, u);

  memset(out, 0, sizeof out);
  CHECK_OK(dlrec_comm_allgather(c, "xyz", 3, out));
  CHECK(!memcmp(out, "xyz", 3));
  CHECK_OK(dlrec_comm_allgather(c, out, 3, out)); /* in place */
  CHECK(!memcmp(out, "xyz", 3));

  CHECK_OK(dlrec_comm_bcast(c, out, 3, 0));
  CHECK(!memcmp(out, "xyz", 3));
  CHECK_ERR(dlrec_comm_bcast(c, out, 3, 1), DLREC_ERR_INVALID, "root 1 is not a rank of 1");

  /* The sum over one rank is the values themselves, bit for bit. */
  float f[3] = {1e8f, -0.0f, 3.25f}, f0[3];
  double d[2] = {1e300, -1e-300}, d0[2];
  memcpy(f0, f, sizeof f);
  memcpy(d0, d, sizeof d);
  CHECK_OK(dlrec_comm_allreduce_f32(c, f, 3));
  CHECK_OK(dlrec_comm_allreduce_f64(c, d, 2));
  CHECK_OK(dlrec_comm_allreduce_f32(c, NULL, 0));
  CHECK(!memcmp(f, f0, sizeof f));
  CHECK(!memcmp(d, d0, sizeof d));
  CHECK_EQ_U64(dlrec_comm_bytes_sent(c), 0);
  dlrec_comm_free(c);
}

/* Without MPI in the build, a launcher's environment alone decides: one
 * process is a single communicator, several are refused (each would train
 * alone and they would race on the same outputs). */
TEST(no_mpi_build_under_launcher) {
  if (dlrec_comm_mpi_built() || launched_by_mpi()) return;
  dlrec_comm *c = NULL;
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  dlrec_status st = dlrec_comm_open(&c);
  setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
  dlrec_status st1 = dlrec_comm_open(&c);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  CHECK_EQ(st1, DLREC_OK);
  CHECK_STR(dlrec_comm_name(c), "single");
  dlrec_comm_free(c);
  CHECK_EQ(st, DLREC_ERR_UNSUPPORTED);
}

/* ---- across ranks ---- */

/* Bytes rank a sends rank b in the alltoallv: uneven, and zero for some
 * pairs, the rank to itself included. */
static uint64_t pair_bytes(int a, int b) { return (a + b) % 3 == 0 ? 0 : (uint64_t)((a * 7 + b * 3) % 5 + 1) * 3; }
static unsigned char pair_byte(int a, int b, uint64_t k) { return (unsigned char)(a * 131 + b * 17 + k * 7 + 1); }

/* Rank r's n inputs: magnitudes 1e8 and 1 (1e17 and 1 in double) mixed, so
 * that the order of the sum changes the bits. */
static void inputs_f32(float *x, size_t n, int r) {
  static const float mag[4] = {1e8f, 1.0f, 3e7f, 0.01f};
  dlrec_rng g;
  dlrec_rng_seed(&g, 1000 + n, (uint64_t)r);
  for (size_t i = 0; i < n; i++) {
    uint64_t u = dlrec_rng_u64(&g);
    x[i] = (float)(mag[u % 4] * (1.0 + (double)((u >> 8) & 0xffff) / 65536.0) * ((u >> 40) & 1 ? -1.0 : 1.0));
  }
}

static void inputs_f64(double *x, size_t n, int r) {
  static const double mag[4] = {1e17, 1.0, 3e16, 0.01};
  dlrec_rng g;
  dlrec_rng_seed(&g, 2000 + n, (uint64_t)r);
  for (size_t i = 0; i < n; i++) {
    uint64_t u = dlrec_rng_u64(&g);
    x[i] = mag[u % 4] * (1.0 + (double)((u >> 8) & 0xffff) / 65536.0) * ((u >> 40) & 1 ? -1.0 : 1.0);
  }
}

/* The left fold in rank order, and (to show that order shows) the fold in
 * reverse rank order, of every rank's inputs. */
#define FOLDS(T, suffix)                                                      \
  static void folds_##suffix(T *left, T *reverse, size_t n, int P) {          \
    T *x = malloc((n ? n : 1) * sizeof *x);                                   \
    for (int r = 0; r < P; r++) {                                             \
      inputs_##suffix(x, n, r);                                               \
      for (size_t i = 0; i < n; i++) left[i] = r == 0 ? x[i] : left[i] + x[i]; \
    }                                                                         \
    for (int r = P - 1; r >= 0; r--) {                                        \
      inputs_##suffix(x, n, r);                                               \
      for (size_t i = 0; i < n; i++) reverse[i] = r == P - 1 ? x[i] : reverse[i] + x[i]; \
    }                                                                         \
    free(x);                                                                  \
  }
FOLDS(float, f32)
FOLDS(double, f64)

/* allreduce_f32 and _f64 of n values against the left fold, bit for bit. */
static void check_allreduce(dlrec_comm *c, size_t n) {
  int P = dlrec_comm_size(c), me = dlrec_comm_rank(c);
  size_t cap = n ? n : 1;
  float *f = malloc(cap * sizeof *f), *fl = malloc(cap * sizeof *fl), *fr = malloc(cap * sizeof *fr);
  double *d = malloc(cap * sizeof *d), *dl = malloc(cap * sizeof *dl), *dr = malloc(cap * sizeof *dr);
  inputs_f32(f, n, me);
  inputs_f64(d, n, me);
  folds_f32(fl, fr, n, P);
  folds_f64(dl, dr, n, P);
  dlrec_status sf = dlrec_comm_allreduce_f32(c, f, n), sd = dlrec_comm_allreduce_f64(c, d, n);
  int f_ok = !memcmp(f, fl, n * sizeof *f), d_ok = !memcmp(d, dl, n * sizeof *d);
  /* On 3+ ranks a different order gives different bits somewhere, so a
   * reduction in another order could not pass. */
  int f_order = memcmp(fl, fr, n * sizeof *f) != 0, d_order = memcmp(dl, dr, n * sizeof *d) != 0;
  size_t bad = 0;
  while (bad < n && !memcmp(&f[bad], &fl[bad], sizeof *f)) bad++;
  float got = bad < n ? f[bad] : 0, want = bad < n ? fl[bad] : 0;
  free(f), free(fl), free(fr), free(d), free(dl), free(dr);
  CHECK_OK(sf);
  CHECK_OK(sd);
  if (!f_ok) {
    test_fail(__FILE__, __LINE__, "allreduce_f32 n=%zu: [%zu] %.9g, left fold %.9g", n, bad, got, want);
    return;
  }
  CHECK(d_ok);
  if (P >= 3 && n >= 100) CHECK(f_order && d_order);
}

static void collectives(dlrec_comm *c) {
  int P = dlrec_comm_size(c), me = dlrec_comm_rank(c);
  /* Rank 0 late by more than the second after which a waiting rank tells
   * its peers where it waits (comm_mpi.c's heartbeats), well within the
   * timeout: the collective completes, and the heartbeat that rank 0 takes
   * in the next one disturbs none of the checks below. Two ranks only, to
   * keep the test short. */
  if (P == 2) {
    unsigned char late[2] = {0};
    if (me == 0) nanosleep(&(struct timespec){.tv_sec = 1, .tv_nsec = 300000000}, NULL);
    late[me] = (unsigned char)(me + 40);
    CHECK_OK(dlrec_comm_allgather(c, late + me, 1, late));
    CHECK(late[0] == 40 && late[1] == 41);
  }
  uint64_t sent0 = dlrec_comm_bytes_sent(c), sent = 0;
  uint64_t *sb = calloc((size_t)P, sizeof *sb), *rb = calloc((size_t)P, sizeof *rb);
  uint64_t stot = 0, rtot = 0;
  for (int r = 0; r < P; r++) {
    sb[r] = pair_bytes(me, r);
    stot += sb[r];
    if (r != me) sent += sb[r];
  }
  /* The counts first, as a caller would: alltoall_u64. */
  CHECK_OK(dlrec_comm_alltoall_u64(c, sb, rb));
  sent += 8 * (uint64_t)(P - 1);
  for (int r = 0; r < P; r++) {
    CHECK_EQ_U64(rb[r], pair_bytes(r, me));
    rtot += rb[r];
  }
  unsigned char *sbuf = malloc(stot + 1), *rbuf = malloc(rtot + 1);
  for (int r = 0, off = 0; r < P; r++)
    for (uint64_t k = 0; k < sb[r]; k++) sbuf[off++] = pair_byte(me, r, k);
  dlrec_status st = dlrec_comm_alltoallv(c, sbuf, sb, rbuf, rb);
  int ok = 1;
  for (int r = 0, off = 0; r < P; r++)
    for (uint64_t k = 0; k < rb[r]; k++) ok &= rbuf[off++] == pair_byte(r, me, k);
  free(sbuf), free(rbuf), free(sb), free(rb);
  CHECK_OK(st);
  CHECK(ok);

  /* allgather: 5 bytes from each rank, into a buffer and in place. */
  unsigned char mine[5], all[5 * 16];
  CHECK(P <= 16);
  for (int k = 0; k < 5; k++) mine[k] = pair_byte(me, 99, (uint64_t)k);
  CHECK_OK(dlrec_comm_allgather(c, mine, 5, all));
  for (int r = 0; r < P; r++)
    for (int k = 0; k < 5; k++) CHECK_EQ(all[r * 5 + k], pair_byte(r, 99, (uint64_t)k));
  memset(all, 0, sizeof all);
  memcpy(all + me * 5, mine, 5);
  CHECK_OK(dlrec_comm_allgather(c, all + me * 5, 5, all));
  for (int r = 0; r < P; r++)
    for (int k = 0; k < 5; k++) CHECK_EQ(all[r * 5 + k], pair_byte(r, 99, (uint64_t)k));
  sent += 2 * 5 * (uint64_t)(P - 1);

  /* bcast from the last rank, which is not 0. */
  char msg[24] = {0};
  int root = P - 1;
  if (me == root) snprintf(msg, sizeof msg, "from rank %d", root);
  CHECK_OK(dlrec_comm_bcast(c, msg, sizeof msg, root));
  char want[24] = {0};
  snprintf(want, sizeof want, "from rank %d", root);
  CHECK(!memcmp(msg, want, sizeof msg));
  if (me == root) sent += sizeof msg * (uint64_t)(P - 1);
  CHECK_ERR(dlrec_comm_bcast(c, msg, sizeof msg, P), DLREC_ERR_INVALID, "is not a rank");
  CHECK_OK(dlrec_comm_barrier(c));
  CHECK_EQ_U64(dlrec_comm_bytes_sent(c) - sent0, sent);

  /* allreduce: n = 12 P is one round of equal segments, whose traffic is
   * (P-1)/P of the values out and back per type. */
  sent0 = dlrec_comm_bytes_sent(c);
  size_t n = 12 * (size_t)P;
  check_allreduce(c, n);
  if (test_failed_now()) return;
  CHECK_EQ_U64(dlrec_comm_bytes_sent(c) - sent0, 2 * (n - n / P) * (sizeof(float) + sizeof(double)));
  /* Empty, fewer values than ranks (some segments empty), and uneven. */
  size_t sizes[] = {0, 1, (size_t)P - 1, (size_t)P + 1, 1003};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !test_failed_now(); i++) check_allreduce(c, sizes[i]);
  if (test_failed_now()) return;

  /* Transfers of at most 40 bytes, as if MPI's int counts were that small:
   * the allreduce goes in rounds, the bcast and allgather in pieces, an
   * alltoallv of more is refused (on every rank here, as every rank sends
   * more). */
  uint64_t max = c->max_message_bytes;
  c->max_message_bytes = 40;
  check_allreduce(c, 1003);
  char big[1000], bigw[1000];
  for (int i = 0; i < 1000; i++) bigw[i] = (char)(i * 13 + 5);
  memcpy(big, bigw, sizeof big);
  if (me != 0) memset(big, 0, sizeof big);
  st = dlrec_comm_bcast(c, big, sizeof big, 0);
  unsigned char g[100 * 16];
  unsigned char gs[100];
  for (int k = 0; k < 100; k++) gs[k] = pair_byte(me, 7, (uint64_t)k);
  dlrec_status st2 = dlrec_comm_allgather(c, gs, 100, g);
  uint64_t b41[16], r41[16];
  for (int r = 0; r < P; r++) b41[r] = r41[r] = 0;
  b41[0] = 41;
  if (me == 0)
    for (int r = 0; r < P; r++) r41[r] = 41;
  char dummy[41 * 16];
  memset(dummy, 0, sizeof dummy);
  dlrec_status st3 = dlrec_comm_alltoallv(c, dummy, b41, dummy, r41);
  c->max_message_bytes = max;
  CHECK_OK(st);
  CHECK(!memcmp(big, bigw, sizeof big));
  CHECK_OK(st2);
  for (int r = 0; r < P; r++)
    for (int k = 0; k < 100; k++) CHECK_EQ(g[r * 100 + k], pair_byte(r, 7, (uint64_t)k));
  CHECK_ERR(st3, DLREC_ERR_UNSUPPORTED, "at most 40 per call");
  CHECK_OK(dlrec_comm_barrier(c));
}

TEST(open_follows_the_launcher) {
  dlrec_comm *c = NULL;
  const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (launched_by_mpi() && !dlrec_comm_mpi_built() && !(ws && atoi(ws) == 1)) {
    CHECK_ERR(dlrec_comm_open(&c), DLREC_ERR_UNSUPPORTED, "this build has no MPI");
    return;
  }
  CHECK_OK(dlrec_comm_open(&c));
  if (!launched_by_mpi()) {
    CHECK_STR(dlrec_comm_name(c), "single");
    CHECK_EQ(dlrec_comm_size(c), 1);
    dlrec_comm_free(c);
    return;
  }
  int size = dlrec_comm_size(c);
  if (ws && atoi(ws) != size) {
    test_fail(__FILE__, __LINE__, "size %d, mpirun started %s", size, ws);
    dlrec_comm_abort(c, 1);
  }
  if (dlrec_comm_mpi_built() && strcmp(dlrec_comm_name(c), "mpi") != 0) {
    test_fail(__FILE__, __LINE__, "under mpirun the communicator is '%s'", dlrec_comm_name(c));
    dlrec_comm_abort(c, 1);
  }
  collectives(c);
  if (test_failed_now()) {
    fprintf(stderr, "rank %d of %d failed: ending the job\n", dlrec_comm_rank(c), size);
    dlrec_comm_abort(c, 1);
  }
  fprintf(stderr, "rank %d of %d (%s): collectives ok\n", dlrec_comm_rank(c), size, dlrec_comm_name(c));
  dlrec_comm_free(c);
}
