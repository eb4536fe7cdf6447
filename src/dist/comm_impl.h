/* What a communicator implements (the backend_impl.h pattern): a table of
 * the few primitives that differ between transports, and the state that the
 * generic layer (comm.c) keeps for every one of them.
 *
 * comm.c checks arguments, counts bytes_sent and builds everything else on
 * these primitives: alltoall_u64 on alltoallv, the deterministic allreduce on
 * alltoallv + allgather. An implementation therefore only moves bytes; it is
 * called with arguments that comm.c has already checked (root in range,
 * send_bytes[rank] == recv_bytes[rank], byte counts within
 * max_message_bytes where the implementation set one).
 */
#ifndef DLREC_COMM_IMPL_H
#define DLREC_COMM_IMPL_H

#include "dist/comm.h"

typedef struct dlrec_comm_ops {
  const char *name; /* what dlrec_comm_name() returns */
  dlrec_status (*alltoallv)(dlrec_comm *c, const void *send, const uint64_t *send_bytes, void *recv,
                            const uint64_t *recv_bytes);
  /* send may be recv + rank * bytes (in place); no other overlap. */
  dlrec_status (*allgather)(dlrec_comm *c, const void *send, size_t bytes, void *recv);
  dlrec_status (*bcast)(dlrec_comm *c, void *buf, size_t bytes, int root);
  dlrec_status (*barrier)(dlrec_comm *c);
  void (*abort)(dlrec_comm *c, int code); /* returns only where there is no job to end */
  void (*free)(dlrec_comm *c);            /* frees ctx and ends the transport, not c */
} dlrec_comm_ops;

struct dlrec_comm {
  const dlrec_comm_ops *ops;
  void *ctx; /* the implementation's own state */
  int rank, size;
  uint64_t bytes_sent;
  /* The largest byte count or offset one transfer may have: MPI's counts
   * and displacements are ints. The allreduce works in rounds small enough
   * for it; alltoallv refuses more (every rank would have to agree to chunk
   * it, and a rank knows only its own counts). Tests lower it to exercise
   * the rounds and the chunked broadcasts. */
  uint64_t max_message_bytes;
  double timeout_s; /* dlrec_comm_set_timeout's; 0: wait forever */
  /* Scratch of the generic layer, grown on demand, kept between calls so
   * that a training step allocates nothing. */
  uint64_t *send_bytes, *recv_bytes; /* (size) */
  void *scratch;
  size_t scratch_bytes;
};

/* A communicator of `size` ranks on ops/ctx, with the generic layer's
 * scratch; on failure ctx is left to the caller. */
dlrec_status dlrec__comm_new(dlrec_comm **out, const dlrec_comm_ops *ops, void *ctx, int rank, int size,
                             uint64_t max_message_bytes);

#ifdef DLREC_HAVE_MPI
/* MPI's world (comm_mpi.c): initializes MPI; dlrec_comm_free finalizes it. */
dlrec_status dlrec__comm_open_mpi(dlrec_comm **out);
#endif

#endif
