/* The communicator's generic layer (dist/comm.h): argument checks, byte
 * counts, the collectives built on an implementation's primitives, and the
 * single-process implementation.
 *
 * The float allreduce is built here once, on alltoallv + allgather, so that
 * every transport gives the same bits: the n values are cut into size()
 * contiguous segments; an alltoallv brings segment j of every rank to rank
 * j, which folds them left in rank order (acc = x_0; acc += x_1; ...); an
 * allgather returns the folded segments to everyone. Each value is summed
 * once, by one rank, in rank order, so the result does not depend on the
 * transport's reduction algorithm, and all ranks hold the same bits.
 */
#include "dist/comm_impl.h"

#include <stdlib.h>
#include <string.h>

/* Values per allreduce round: bounds the scratch (about one round's worth)
 * whatever n is. */
#define ALLREDUCE_ROUND_VALUES ((size_t)1 << 24)

dlrec_status dlrec__comm_new(dlrec_comm **out, const dlrec_comm_ops *ops, void *ctx, int rank, int size,
                             uint64_t max_message_bytes) {
  *out = NULL;
  dlrec_comm *c = calloc(1, sizeof *c);
  uint64_t *counts = calloc(2 * (size_t)size, sizeof *counts);
  if (!c || !counts) {
    free(c);
    free(counts);
    return dlrec_error(DLREC_ERR_NOMEM, "communicator of %d ranks: out of memory", size);
  }
  c->ops = ops;
  c->ctx = ctx;
  c->rank = rank;
  c->size = size;
  c->max_message_bytes = max_message_bytes;
  c->timeout_s = DLREC_COMM_TIMEOUT_DEFAULT_S;
  c->send_bytes = counts;
  c->recv_bytes = counts + size;
  *out = c;
  return DLREC_OK;
}

void dlrec_comm_free(dlrec_comm *c) {
  if (!c) return;
  c->ops->free(c);
  free(c->send_bytes); /* recv_bytes shares its block */
  free(c->scratch);
  free(c);
}

int dlrec_comm_rank(const dlrec_comm *c) { return c->rank; }
int dlrec_comm_size(const dlrec_comm *c) { return c->size; }
const char *dlrec_comm_name(const dlrec_comm *c) { return c->ops->name; }
uint64_t dlrec_comm_bytes_sent(const dlrec_comm *c) { return c->bytes_sent; }
void dlrec_comm_set_timeout(dlrec_comm *c, double seconds) { c->timeout_s = seconds > 0 ? seconds : 0; }
double dlrec_comm_timeout(const dlrec_comm *c) { return c->timeout_s; }

int dlrec_comm_mpi_built(void) {
#ifdef DLREC_HAVE_MPI
  return 1;
#else
  return 0;
#endif
}

/* ---- the single-process communicator ---- */

static dlrec_status single_alltoallv(dlrec_comm *c, const void *send, const uint64_t *send_bytes, void *recv,
                                     const uint64_t *recv_bytes) {
  if (send_bytes[0]) memmove(recv, send, (size_t)send_bytes[0]);
  return DLREC_OK;
}

static dlrec_status single_allgather(dlrec_comm *c, const void *send, size_t bytes, void *recv) {
  if (bytes) memmove(recv, send, bytes);
  return DLREC_OK;
}

static dlrec_status single_bcast(dlrec_comm *c, void *buf, size_t bytes, int root) { return DLREC_OK; }
static dlrec_status single_barrier(dlrec_comm *c) { return DLREC_OK; }
static void single_abort(dlrec_comm *c, int code) {}
static void single_free(dlrec_comm *c) {}

static const dlrec_comm_ops single_ops = {
    .name = "single",
    .alltoallv = single_alltoallv,
    .allgather = single_allgather,
    .bcast = single_bcast,
    .barrier = single_barrier,
    .abort = single_abort,
    .free = single_free,
};

dlrec_status dlrec_comm_open_single(dlrec_comm **c) { return dlrec__comm_new(c, &single_ops, NULL, 0, 1, UINT64_MAX); }

/* Whether an MPI launcher started this process, and how many processes it
 * started (0 where its environment does not say). Open MPI's mpirun sets
 * OMPI_COMM_WORLD_SIZE, PMIx launchers (srun --mpi=pmix, prterun) PMIX_RANK,
 * Hydra (MPICH's mpiexec) PMI_RANK and PMI_SIZE. */
static int launched_by_mpi(long *world) {
  const char *ompi = getenv("OMPI_COMM_WORLD_SIZE"), *pmi = getenv("PMI_SIZE");
  *world = ompi ? atol(ompi) : pmi ? atol(pmi) : 0;
  return ompi || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

dlrec_status dlrec_comm_open(dlrec_comm **c) {
  *c = NULL;
  long world = 0;
  if (!launched_by_mpi(&world)) return dlrec_comm_open_single(c);
#ifdef DLREC_HAVE_MPI
  return dlrec__comm_open_mpi(c);
#else
  /* Each of N processes training alone as "rank 0 of 1" would race on the
   * same outputs; one process under a launcher is harmless. */
  if (world != 1)
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "started by an MPI launcher (%ld processes) but this build has no MPI: install Open MPI "
                       "(Debian: libopenmpi-dev) and rebuild, or run without mpirun",
                       world);
  return dlrec_comm_open_single(c);
#endif
}

/* ---- the collectives ---- */

dlrec_status dlrec_comm_alltoallv(dlrec_comm *c, const void *send, const uint64_t *send_bytes, void *recv,
                                  const uint64_t *recv_bytes) {
  uint64_t sent = 0, send_total = 0, recv_total = 0;
  for (int r = 0; r < c->size; r++) {
    /* Each count and each offset into the packed buffers must fit one
     * transfer; the offsets grow to the totals. */
    send_total += send_bytes[r];
    recv_total += recv_bytes[r];
    if (r != c->rank) sent += send_bytes[r];
  }
  if (send_bytes[c->rank] != recv_bytes[c->rank])
    return dlrec_error(DLREC_ERR_INVALID, "alltoallv: rank %d sends itself %llu bytes but expects %llu", c->rank,
                       (unsigned long long)send_bytes[c->rank], (unsigned long long)recv_bytes[c->rank]);
  if (send_total > c->max_message_bytes || recv_total > c->max_message_bytes)
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "alltoallv: %llu bytes to send and %llu to receive; %s takes at most %llu per call "
                       "(split the exchange)",
                       (unsigned long long)send_total, (unsigned long long)recv_total, c->ops->name,
                       (unsigned long long)c->max_message_bytes);
  dlrec_status st = c->ops->alltoallv(c, send, send_bytes, recv, recv_bytes);
  if (st == DLREC_OK) c->bytes_sent += sent;
  return st;
}

dlrec_status dlrec_comm_alltoall_u64(dlrec_comm *c, const uint64_t *send, uint64_t *recv) {
  for (int r = 0; r < c->size; r++) c->send_bytes[r] = c->recv_bytes[r] = sizeof(uint64_t);
  return dlrec_comm_alltoallv(c, send, c->send_bytes, recv, c->recv_bytes);
}

dlrec_status dlrec_comm_allgather(dlrec_comm *c, const void *send, size_t bytes, void *recv) {
  dlrec_status st = c->ops->allgather(c, send, bytes, recv);
  if (st == DLREC_OK) c->bytes_sent += (uint64_t)bytes * (uint64_t)(c->size - 1);
  return st;
}

dlrec_status dlrec_comm_bcast(dlrec_comm *c, void *buf, size_t bytes, int root) {
  if (root < 0 || root >= c->size)
    return dlrec_error(DLREC_ERR_INVALID, "bcast: root %d is not a rank of %d", root, c->size);
  dlrec_status st = c->ops->bcast(c, buf, bytes, root);
  if (st == DLREC_OK && root == c->rank) c->bytes_sent += (uint64_t)bytes * (uint64_t)(c->size - 1);
  return st;
}

dlrec_status dlrec_comm_barrier(dlrec_comm *c) { return c->ops->barrier(c); }

void dlrec_comm_abort(dlrec_comm *c, int code) { c->ops->abort(c, code); }

/* ---- the deterministic allreduce ---- */

static void fold_f32(void *acc, const void *x, size_t n) {
  float *a = acc;
  const float *b = x;
  for (size_t i = 0; i < n; i++) a[i] += b[i];
}

static void fold_f64(void *acc, const void *x, size_t n) {
  double *a = acc;
  const double *b = x;
  for (size_t i = 0; i < n; i++) a[i] += b[i];
}

static dlrec_status scratch_reserve(dlrec_comm *c, size_t bytes) {
  if (bytes <= c->scratch_bytes) return DLREC_OK;
  void *p = realloc(c->scratch, bytes);
  if (!p) return dlrec_error(DLREC_ERR_NOMEM, "allreduce: %zu bytes of scratch: out of memory", bytes);
  c->scratch = p;
  c->scratch_bytes = bytes;
  return DLREC_OK;
}

/* One round: x (n values of elem bytes) becomes the left fold over ranks.
 * Segment j, which rank j folds, is values [lo_j, lo_j + len_j) with
 * len_j = n / size, plus one for the first n % size segments. */
static dlrec_status allreduce_round(dlrec_comm *c, char *x, size_t n, size_t elem,
                                    void (*fold)(void *, const void *, size_t)) {
  size_t P = (size_t)c->size, me = (size_t)c->rank;
  size_t base = n / P, rem = n % P, seg_max = base + (rem > 0);
  size_t my_len = base + (me < rem);
  /* recv (P, my_len) from the alltoallv, later (P, seg_max) from the
   * allgather, then acc (seg_max). */
  dlrec_status st = scratch_reserve(c, (P + 1) * seg_max * elem);
  if (st != DLREC_OK) return st;
  char *recv = c->scratch, *acc = recv + P * seg_max * elem;
  for (size_t r = 0; r < P; r++) {
    c->send_bytes[r] = (base + (r < rem)) * elem; /* x is already packed in rank order */
    c->recv_bytes[r] = my_len * elem;
  }
  st = dlrec_comm_alltoallv(c, x, c->send_bytes, recv, c->recv_bytes);
  if (st != DLREC_OK) return st;
  memcpy(acc, recv, my_len * elem);
  for (size_t r = 1; r < P; r++) fold(acc, recv + r * my_len * elem, my_len);
  /* The allgather needs equal sizes: the short segments send padding. */
  memset(acc + my_len * elem, 0, (seg_max - my_len) * elem);
  st = dlrec_comm_allgather(c, acc, seg_max * elem, recv);
  if (st != DLREC_OK) return st;
  for (size_t r = 0, lo = 0; r < P; r++) {
    size_t len = base + (r < rem);
    memcpy(x + lo * elem, recv + r * seg_max * elem, len * elem);
    lo += len;
  }
  return DLREC_OK;
}

static dlrec_status allreduce(dlrec_comm *c, void *x, size_t n, size_t elem, void (*fold)(void *, const void *, size_t),
                              const char *what) {
  if (c->size == 1) return DLREC_OK;
  /* Every rank has the same n, so every rank cuts the same rounds. A round
   * sends its whole x and receives size() segments of up to ceil(m / size)
   * values: a multiple of size() keeps both within one transfer. */
  size_t P = (size_t)c->size, round = ALLREDUCE_ROUND_VALUES;
  if (round > c->max_message_bytes / elem) round = (size_t)(c->max_message_bytes / elem);
  round = round / P * P;
  if (round < P) round = P;
  for (size_t done = 0; done < n; done += round) {
    size_t m = n - done < round ? n - done : round;
    dlrec_status st = allreduce_round(c, (char *)x + done * elem, m, elem, fold);
    if (st != DLREC_OK) return dlrec_error_context("%s of %zu values: ", what, n);
  }
  return DLREC_OK;
}

dlrec_status dlrec_comm_allreduce_f32(dlrec_comm *c, float *x, size_t n) {
  return allreduce(c, x, n, sizeof(float), fold_f32, "allreduce_f32");
}

dlrec_status dlrec_comm_allreduce_f64(dlrec_comm *c, double *x, size_t n) {
  return allreduce(c, x, n, sizeof(double), fold_f64, "allreduce_f64");
}
