/* Communication between the ranks of a training job: one interface, a
 * single-process implementation (size 1; every collective is a copy) and an
 * MPI one (Open MPI, when the build found it and the process was started by
 * mpirun), designed so that NCCL can implement it for the GPU backend.
 *
 * Every collective is called by every rank, in the same order, with sizes
 * that agree (as MPI's). Errors come back as a dlrec_status naming the
 * operation and, for MPI, its error string; a peer that died does not make a
 * collective hang: mpirun stops the whole job (docs/distributed.md). Nor
 * does a peer that stalls (stopped, hung, or busy alone): a collective that
 * waits longer than the communicator's timeout ends the job (below).
 *
 * The float reductions are deterministic: the result is the left fold in
 * rank order, ((x_0 + x_1) + x_2) + ..., bitwise the same on every rank and
 * for any MPI algorithm, so that N ranks reproduce one process that sums N
 * ways in the same order.
 */
#ifndef DLREC_COMM_H
#define DLREC_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlrec_comm dlrec_comm;

/* The process's communicator: MPI's world when this build has MPI and the
 * process was launched by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
 * PMIx launchers PMIX_RANK, Hydra PMI_RANK), else the single-process one;
 * a plain run never initializes MPI. A launcher that started several
 * processes of a build without MPI is DLREC_ERR_UNSUPPORTED (each would
 * train alone). MPI is initialized here (MPI_THREAD_FUNNELED: make every
 * call on c from the thread that opened it) and finalized by
 * dlrec_comm_free; open it once per process. */
dlrec_status dlrec_comm_open(dlrec_comm **c);
/* The single-process communicator, whatever the build and launcher. */
dlrec_status dlrec_comm_open_single(dlrec_comm **c);
void dlrec_comm_free(dlrec_comm *c); /* accepts NULL */

int dlrec_comm_rank(const dlrec_comm *c);
int dlrec_comm_size(const dlrec_comm *c);
const char *dlrec_comm_name(const dlrec_comm *c); /* "single" or "mpi" */
/* Whether this build can run across processes (was built with MPI). */
int dlrec_comm_mpi_built(void);

/* Each rank sends send_bytes[r] bytes to rank r, packed in rank order in
 * send, and receives recv_bytes[r] bytes from rank r, packed in rank order
 * in recv. The counts must match pairwise (rank a's send_bytes[b] is rank
 * b's recv_bytes[a]); exchange counts first with dlrec_comm_alltoall_u64.
 * send and recv must not overlap. With MPI each rank's send and receive
 * totals are at most INT_MAX bytes (MPI's int counts and displacements);
 * beyond, the call is DLREC_ERR_UNSUPPORTED on the ranks whose totals are
 * too large, and the caller must split the exchange.
 *
 * A collective that fails on one rank may leave the others waiting in it:
 * after an error, end the job with dlrec_comm_abort rather than go on. */
dlrec_status dlrec_comm_alltoallv(dlrec_comm *c, const void *send, const uint64_t *send_bytes, void *recv,
                                  const uint64_t *recv_bytes);
/* send[r] goes to rank r; recv[r] comes from rank r (size() values each). */
dlrec_status dlrec_comm_alltoall_u64(dlrec_comm *c, const uint64_t *send, uint64_t *recv);
/* Every rank's `bytes` bytes, in rank order, into recv (size() * bytes).
 * send may be recv + rank() * bytes (in place); no other overlap. */
dlrec_status dlrec_comm_allgather(dlrec_comm *c, const void *send, size_t bytes, void *recv);
/* root's bytes to every rank. */
dlrec_status dlrec_comm_bcast(dlrec_comm *c, void *buf, size_t bytes, int root);
/* x (n values, the same n on every rank) becomes the sum over ranks, folded
 * left in rank order: bitwise the same on every rank. Any n: large arrays go
 * in rounds of at most 2^24 values, with scratch of about one round kept in
 * c between calls. */
dlrec_status dlrec_comm_allreduce_f32(dlrec_comm *c, float *x, size_t n);
dlrec_status dlrec_comm_allreduce_f64(dlrec_comm *c, double *x, size_t n);
dlrec_status dlrec_comm_barrier(dlrec_comm *c);
/* Ends every rank of the job at once (MPI_Abort), for an error after which
 * the peers could wait forever; returns only in a single process. */
void dlrec_comm_abort(dlrec_comm *c, int code);

/* How long one collective may wait for the other ranks, in seconds (0:
 * forever). A rank that waits longer logs an error naming the collective
 * and the ranks that never reached it (a rank stopped, hung, or working
 * alone for longer than this), and ends the whole job (MPI_Abort): the
 * ranks cannot leave a collective that a peer never joins. A new
 * communicator has DLREC_COMM_TIMEOUT_DEFAULT_S; the single-process one
 * never waits. */
#define DLREC_COMM_TIMEOUT_DEFAULT_S 1800.0
void dlrec_comm_set_timeout(dlrec_comm *c, double seconds);
double dlrec_comm_timeout(const dlrec_comm *c);

/* Bytes this rank has sent through c so far (to other ranks; its own share
 * of a collective is not counted): the payload each collective delivers from
 * this rank (an allgather's `bytes` to each of size()-1 ranks, a bcast's to
 * each from the root; an allreduce counts its alltoallv and allgather),
 * whatever the transport's algorithm forwards on top. */
uint64_t dlrec_comm_bytes_sent(const dlrec_comm *c);

#ifdef __cplusplus
}
#endif
#endif
