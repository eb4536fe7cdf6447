/* The MPI communicator (dist/comm.h): a duplicate of MPI_COMM_WORLD whose
 * errors return instead of killing the process, so that each becomes a
 * dlrec_status naming the call and MPI's own error string.
 *
 * MPI is initialized with MPI_THREAD_FUNNELED: the thread that opened the
 * communicator makes every call on it; OpenMP and the loader's threads never
 * touch MPI. Data moves as MPI_BYTE with int counts, so one transfer holds
 * at most INT_MAX bytes (max_message_bytes): broadcasts and allgathers of
 * more go in pieces (every rank has the same sizes, so every rank cuts the
 * same pieces); an alltoallv of more is refused by comm.c, since a rank
 * knows only its own counts and the ranks would have to agree to cut.
 *
 * Every collective is started non-blocking and waited for here (mpi_wait),
 * so that a rank never waits forever for a peer that stalled: past the
 * communicator's timeout it names the ranks that never reached the
 * collective and ends the job. To know them, a rank that has waited a
 * while (HEARTBEAT_AFTER_S) tells every peer the number of the collective
 * it waits in, a point-to-point message of its own tag, and again each
 * HEARTBEAT_AFTER_S while it waits; a peer neither heard waiting in it (or
 * a later one) nor heard waiting lately (in an earlier collective that the
 * stalled rank holds up too: a broadcast's root runs ahead) never reached
 * it. Fast collectives send nothing.
 *
 * Built only when CMake found MPI (DLREC_HAVE_MPI).
 */
#ifdef DLREC_HAVE_MPI

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "core/log.h"
#include "dist/comm_impl.h"

/* A rank that waits in a collective this long (or a quarter of the
 * timeout, if less) tells its peers which one; the tag of those messages. */
#define HEARTBEAT_AFTER_S 1.0
#define HEARTBEAT_TAG 0x646c

typedef struct mpi_ctx {
  MPI_Comm comm;
  int owns_init; /* MPI_Init_thread was ours, so MPI_Finalize is too */
  int *send_counts, *send_displs, *recv_counts, *recv_displs; /* (size) each, one block */
  /* The collectives this rank has started (the one it waits in is number
   * seq), the latest each peer said it waited in, and the heartbeats out,
   * one buffer and request per peer. */
  uint64_t seq, *peer_seq, *hb_out;
  double *peer_heard; /* when each peer's latest heartbeat came (monotonic seconds; 0: never) */
  MPI_Request *hb_req;
} mpi_ctx;

static dlrec_status mpi_error(const char *call, int err) {
  char msg[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  return dlrec_error(DLREC_ERR_IO, "%s: %s", call, len ? msg : "unknown MPI error");
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The peers' heartbeats received so far into peer_seq (best effort: a
 * failed probe leaves them as they were). */
static void heartbeats_drain(mpi_ctx *m) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, HEARTBEAT_TAG, m->comm, &flag, &st) != MPI_SUCCESS || !flag) return;
    uint64_t seq = 0;
    if (MPI_Recv(&seq, 1, MPI_UINT64_T, st.MPI_SOURCE, HEARTBEAT_TAG, m->comm, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    if (seq > m->peer_seq[st.MPI_SOURCE]) m->peer_seq[st.MPI_SOURCE] = seq;
    m->peer_heard[st.MPI_SOURCE] = now_s();
  }
}

/* "Waiting in collective seq" to every peer whose last heartbeat has gone
 * (one that does not drain them keeps its old one). */
static void heartbeats_send(dlrec_comm *c) {
  mpi_ctx *m = c->ctx;
  for (int q = 0; q < c->size; q++) {
    int done = 1;
    if (q == c->rank) continue;
    if (m->hb_req[q] != MPI_REQUEST_NULL && (MPI_Test(&m->hb_req[q], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done))
      continue;
    m->hb_out[q] = m->seq;
    if (MPI_Isend(&m->hb_out[q], 1, MPI_UINT64_T, q, HEARTBEAT_TAG, m->comm, &m->hb_req[q]) != MPI_SUCCESS)
      m->hb_req[q] = MPI_REQUEST_NULL;
  }
}

/* The timeout passed in collective `op`: names the peers neither heard
 * waiting in it (or a later one) nor heard waiting at all lately (a rank
 * that waits, in this collective or an earlier one that the stalled rank
 * also holds up, says so every hb_every seconds: 3 of them of slack), and
 * ends the job; they cannot be waited for (returns only if MPI_Abort
 * does). */
static dlrec_status stalled(dlrec_comm *c, const char *op, double waited, double hb_every) {
  mpi_ctx *m = c->ctx;
  heartbeats_drain(m);
  const double now = now_s();
  char ranks[256] = "";
  size_t len = 0;
  int n = 0;
  for (int q = 0; q < c->size && len + 16 < sizeof ranks; q++)
    if (q != c->rank && m->peer_seq[q] < m->seq && !(m->peer_heard[q] > 0 && now - m->peer_heard[q] <= 3 * hb_every))
      len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", n++ ? ", " : "", q);
  if (n)
    DLREC_ERROR("rank %d: %s (collective %llu) waited %.1f s, past the ranks' timeout of %g s "
                "(distributed.timeout_s): rank%s %s never reached it (stopped, hung, or busy alone for longer "
                "than the timeout); ending the job",
                c->rank, op, (unsigned long long)m->seq, waited, c->timeout_s, n > 1 ? "s" : "", ranks);
  else
    DLREC_ERROR("rank %d: %s (collective %llu) waited %.1f s, past the ranks' timeout of %g s "
                "(distributed.timeout_s), although every rank reached it; ending the job",
                c->rank, op, (unsigned long long)m->seq, waited, c->timeout_s);
  MPI_Abort(m->comm, 1);
  return dlrec_error(DLREC_ERR_IO, "%s: the other ranks did not come within %g s", op, c->timeout_s);
}

/* Waits for the collective `op` started as req, at most c->timeout_s of
 * this rank's own waiting: a gap between two looks at the clock counts at
 * most MAX_GAP_S, so that a rank that was itself stopped (SIGSTOP, then
 * SIGCONT) does not blame its peers for the time it did not run. */
#define MAX_GAP_S 1.0
static dlrec_status mpi_wait(dlrec_comm *c, MPI_Request *req, const char *op) {
  mpi_ctx *m = c->ctx;
  const double hb_after = c->timeout_s > 0 && c->timeout_s < 4 * HEARTBEAT_AFTER_S ? c->timeout_s / 4
                                                                                  : HEARTBEAT_AFTER_S;
  double last = now_s(), waited = 0, next_hb = hb_after;
  int done = 0;
  for (unsigned i = 1;; i++) {
    int err = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return mpi_error(op, err);
    if (done) return DLREC_OK;
    if (i < 64) continue; /* most collectives end here, without a system call */
    /* A rank that waits gives its core to whoever else can run there (the
     * rank it waits for, on a machine of more ranks or jobs than cores);
     * on an idle core sched_yield returns at once. */
    sched_yield();
    const double now = now_s();
    waited += now - last < MAX_GAP_S ? now - last : MAX_GAP_S;
    last = now;
    if (waited < hb_after) continue;
    if (waited >= next_hb) { /* every hb_after while it waits */
      heartbeats_send(c);
      next_hb = waited + hb_after;
    }
    heartbeats_drain(m);
    if (c->timeout_s > 0 && waited >= c->timeout_s) return stalled(c, op, waited, hb_after);
  }
}

/* Starts the collective `call` (its arguments end in the request) and waits
 * for it; on failure returns its error as a dlrec_status. */
#define MPI_COLL(call, ...)                                       \
  do {                                                            \
    MPI_Request req_;                                             \
    m->seq++;                                                     \
    heartbeats_drain(m);                                          \
    int err_ = call(__VA_ARGS__, &req_);                          \
    if (err_ != MPI_SUCCESS) return mpi_error(#call, err_);       \
    dlrec_status st_ = mpi_wait(c, &req_, #call);                 \
    if (st_ != DLREC_OK) return st_;                              \
  } while (0)

static dlrec_status mpi_alltoallv(dlrec_comm *c, const void *send, const uint64_t *send_bytes, void *recv,
                                  const uint64_t *recv_bytes) {
  mpi_ctx *m = c->ctx;
  /* comm.c has checked that the totals, and so every count and offset, fit
   * max_message_bytes <= INT_MAX. */
  int soff = 0, roff = 0;
  for (int r = 0; r < c->size; r++) {
    m->send_counts[r] = (int)send_bytes[r];
    m->send_displs[r] = soff;
    soff += (int)send_bytes[r];
    m->recv_counts[r] = (int)recv_bytes[r];
    m->recv_displs[r] = roff;
    roff += (int)recv_bytes[r];
  }
  MPI_COLL(MPI_Ialltoallv, send, m->send_counts, m->send_displs, MPI_BYTE, recv, m->recv_counts, m->recv_displs,
           MPI_BYTE, m->comm);
  return DLREC_OK;
}

static dlrec_status mpi_bcast(dlrec_comm *c, void *buf, size_t bytes, int root) {
  mpi_ctx *m = c->ctx;
  for (size_t off = 0; off < bytes; off += (size_t)c->max_message_bytes) {
    size_t n = bytes - off < c->max_message_bytes ? bytes - off : (size_t)c->max_message_bytes;
    MPI_COLL(MPI_Ibcast, (char *)buf + off, (int)n, MPI_BYTE, root, m->comm);
  }
  return DLREC_OK;
}

static dlrec_status mpi_allgather(dlrec_comm *c, const void *send, size_t bytes, void *recv) {
  mpi_ctx *m = c->ctx;
  char *mine = (char *)recv + (size_t)c->rank * bytes;
  if (bytes <= c->max_message_bytes) {
    MPI_COLL(MPI_Iallgather, send == mine ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
             m->comm);
    return DLREC_OK;
  }
  /* Beyond one transfer: each rank broadcasts its share in pieces. */
  if (send != mine) memmove(mine, send, bytes);
  for (int r = 0; r < c->size; r++) {
    dlrec_status st = mpi_bcast(c, (char *)recv + (size_t)r * bytes, bytes, r);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

static dlrec_status mpi_barrier(dlrec_comm *c) {
  mpi_ctx *m = c->ctx;
  MPI_COLL(MPI_Ibarrier, m->comm);
  return DLREC_OK;
}

static void mpi_abort(dlrec_comm *c, int code) {
  mpi_ctx *m = c->ctx;
  MPI_Abort(m->comm, code);
}

static void mpi_free_ctx(mpi_ctx *m, int size) {
  if (m->comm != MPI_COMM_NULL) {
    /* Heartbeats still out go on alone; those that came in are taken. */
    for (int q = 0; m->hb_req && q < size; q++)
      if (m->hb_req[q] != MPI_REQUEST_NULL) MPI_Request_free(&m->hb_req[q]);
    if (m->peer_seq) heartbeats_drain(m);
    MPI_Comm_free(&m->comm);
  }
  if (m->owns_init) MPI_Finalize();
  free(m->send_counts);
  free(m->peer_seq);
  free(m->peer_heard);
  free(m->hb_req);
  free(m);
}

static void mpi_free(dlrec_comm *c) { mpi_free_ctx(c->ctx, c->size); }

static const dlrec_comm_ops mpi_ops = {
    .name = "mpi",
    .alltoallv = mpi_alltoallv,
    .allgather = mpi_allgather,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .free = mpi_free,
};

dlrec_status dlrec__comm_open_mpi(dlrec_comm **out) {
  *out = NULL;
  int inited = 0, finalized = 0, provided = 0, rank = 0, size = 0, err;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    return dlrec_error(DLREC_ERR_INVALID, "MPI was finalized already: open the communicator once per process");
  mpi_ctx *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  m->comm = MPI_COMM_NULL;
  if (!inited) {
    if ((err = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
      free(m);
      return mpi_error("MPI_Init_thread", err);
    }
    m->owns_init = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  dlrec_status st = DLREC_OK;
  if (provided < MPI_THREAD_FUNNELED) {
    st = dlrec_error(DLREC_ERR_UNSUPPORTED, "MPI provides thread level %d, below MPI_THREAD_FUNNELED (%d)", provided,
                     MPI_THREAD_FUNNELED);
    goto err;
  }
  /* A communicator of our own, so that no other library's messages can
   * match ours, and whose errors return. */
  if ((err = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm)) != MPI_SUCCESS) {
    st = mpi_error("MPI_Comm_dup", err);
    goto err;
  }
  if ((err = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
      (err = MPI_Comm_rank(m->comm, &rank)) != MPI_SUCCESS || (err = MPI_Comm_size(m->comm, &size)) != MPI_SUCCESS) {
    st = mpi_error("MPI communicator setup", err);
    goto err;
  }
  m->send_counts = calloc(4 * (size_t)size, sizeof(int));
  if (!m->send_counts) {
    st = dlrec_error(DLREC_ERR_NOMEM, "MPI communicator of %d ranks: out of memory", size);
    goto err;
  }
  m->peer_seq = calloc(2 * (size_t)size, sizeof *m->peer_seq);
  m->peer_heard = calloc((size_t)size, sizeof *m->peer_heard);
  m->hb_req = malloc((size_t)size * sizeof *m->hb_req);
  if (!m->peer_seq || !m->peer_heard || !m->hb_req) {
    st = dlrec_error(DLREC_ERR_NOMEM, "MPI communicator of %d ranks: out of memory", size);
    goto err;
  }
  m->hb_out = m->peer_seq + size;
  for (int q = 0; q < size; q++) m->hb_req[q] = MPI_REQUEST_NULL;
  m->send_displs = m->send_counts + size;
  m->recv_counts = m->send_counts + 2 * (size_t)size;
  m->recv_displs = m->send_counts + 3 * (size_t)size;
  st = dlrec__comm_new(out, &mpi_ops, m, rank, size, INT_MAX);
  if (st != DLREC_OK) goto err;
  return DLREC_OK;
err:
  mpi_free_ctx(m, size);
  return st;
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int dlrec_comm_mpi_not_built;
#endif
