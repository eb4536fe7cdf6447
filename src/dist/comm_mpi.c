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
 * Built only when CMake found MPI (DLREC_HAVE_MPI).
 */
#ifdef DLREC_HAVE_MPI

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dist/comm_impl.h"

typedef struct mpi_ctx {
  MPI_Comm comm;
  int owns_init; /* MPI_Init_thread was ours, so MPI_Finalize is too */
  int *send_counts, *send_displs, *recv_counts, *recv_displs; /* (size) each, one block */
} mpi_ctx;

static dlrec_status mpi_error(const char *call, int err) {
  char msg[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
  msg[len] = '\0';
  return dlrec_error(DLREC_ERR_IO, "%s: %s", call, len ? msg : "unknown MPI error");
}

/* Calls an MPI function; on failure returns its error as a dlrec_status. */
#define MPI_TRY(call, ...)                                  \
  do {                                                      \
    int err_ = call(__VA_ARGS__);                           \
    if (err_ != MPI_SUCCESS) return mpi_error(#call, err_); \
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
  MPI_TRY(MPI_Alltoallv, send, m->send_counts, m->send_displs, MPI_BYTE, recv, m->recv_counts, m->recv_displs,
          MPI_BYTE, m->comm);
  return DLREC_OK;
}

static dlrec_status mpi_bcast(dlrec_comm *c, void *buf, size_t bytes, int root) {
  mpi_ctx *m = c->ctx;
  for (size_t off = 0; off < bytes; off += (size_t)c->max_message_bytes) {
    size_t n = bytes - off < c->max_message_bytes ? bytes - off : (size_t)c->max_message_bytes;
    MPI_TRY(MPI_Bcast, (char *)buf + off, (int)n, MPI_BYTE, root, m->comm);
  }
  return DLREC_OK;
}

static dlrec_status mpi_allgather(dlrec_comm *c, const void *send, size_t bytes, void *recv) {
  mpi_ctx *m = c->ctx;
  char *mine = (char *)recv + (size_t)c->rank * bytes;
  if (bytes <= c->max_message_bytes) {
    MPI_TRY(MPI_Allgather, send == mine ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
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
  MPI_TRY(MPI_Barrier, m->comm);
  return DLREC_OK;
}

static void mpi_abort(dlrec_comm *c, int code) {
  mpi_ctx *m = c->ctx;
  MPI_Abort(m->comm, code);
}

static void mpi_free_ctx(mpi_ctx *m) {
  if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  if (m->owns_init) MPI_Finalize();
  free(m->send_counts);
  free(m);
}

static void mpi_free(dlrec_comm *c) { mpi_free_ctx(c->ctx); }

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
  m->send_displs = m->send_counts + size;
  m->recv_counts = m->send_counts + 2 * (size_t)size;
  m->recv_displs = m->send_counts + 3 * (size_t)size;
  st = dlrec__comm_new(out, &mpi_ops, m, rank, size, INT_MAX);
  if (st != DLREC_OK) goto err;
  return DLREC_OK;
err:
  mpi_free_ctx(m);
  return st;
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int dlrec_comm_mpi_not_built;
#endif
