/* The CUDA backend's insides, shared by its files: the context of a
 * backend on one GPU, the helpers every op uses, and the functions the ops
 * table of cuda.c names. cuda.c: the devices, the context and the table;
 * cuda_memory.c: memory, copies, staging and fences; cuda_dense.c: the
 * elementwise, row, interaction, FM, dropout, batch normalization, loss and
 * optimizer ops; cuda_gemm.c: the linear and cross layers on cuBLASLt and
 * the packed scoring layers; cuda_embed.c: the bag ops. */
#ifndef DLREC_CUDA_IMPL_H
#define DLREC_CUDA_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/dispatch.h"
#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/fresh_grads.h"
#include "backend/ops_table.h"

/* More 16-bit operands than this in one pass are converted again in the backward. */
#define MAX_KEPT 64

typedef struct cuda_ctx {
  int device;
  cudaStream_t stream;
  cuda_blas *blas;
  void *scratch; /* device memory the ops carve up for the call (16-bit operands, partial sums) */
  size_t scratch_bytes;
  /* The last batch of bags sent over (bags_send): laid out in pinned host
   * memory and copied to its own device buffer, with the table it was
   * checked against. A bag op on a batch equal to it (the update after the
   * forward of the same step) reuses it: no check, no packing, no copy. */
  void *bags_host, *bags_dev;
  size_t bags_cap, bags_len; /* both buffers' bytes; the last batch's (0: none) */
  const dlrec_table *bags_table;
  uint64_t bags_table_rows; /* its rows then: a new table at a freed one's address is another */
  uint64_t bags_ids;
  cuk_bags bags;
  cudaEvent_t bags_sent; /* recorded after the copy from bags_host: rewrite it once that has run */
  /* Pinned staging for uploads (stage_upload): the caller's bytes are copied
   * here and sent by an async copy, so that an upload returns without
   * waiting for the ops before it. A ring: stage_next and stage_free count
   * bytes handed out and bytes known landed since the start (a region at
   * stage_next % stage_cap), moved on by a wait for the stream (drain) or
   * for a fence, which notes stage_next when it is recorded. A lock,
   * because a server's reload uploads a model while its worker scores. */
  pthread_mutex_t stage_lock;
  char *stage;
  size_t stage_cap;
  uint64_t stage_next, stage_free;
  /* Kept operands (keep_operands): the 16-bit copies a forward converted,
   * each with its source and shape, for the backward to read; the slots'
   * device buffers stay between passes, reused in the same order. */
  int keep;
  uint32_t n_kept;
  struct cuda_kept {
    const float *src;
    size_t rows, width, ld;
    uint16_t *h;
    size_t cap; /* h's bytes */
  } kept[MAX_KEPT];
  /* Fresh gradients (fresh_gradients): a first product into memory no GEMM
   * wrote since is written (beta 0), not added. */
  fresh_grads fresh;
} cuda_ctx;

static inline cuda_ctx *ctx_of(dlrec_backend *be) { return be->ctx; }

/* Selects the backend's GPU on the calling thread (a server calls from
 * several) and returns its stream. */
static inline cudaStream_t enter(dlrec_backend *be) {
  cudaSetDevice(ctx_of(be)->device);
  return ctx_of(be)->stream;
}

/* DLREC_OK, or the CUDA error of `what` as a status. */
static inline dlrec_status cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return DLREC_OK;
  return dlrec_error(e == cudaErrorMemoryAllocation ? DLREC_ERR_NOMEM : DLREC_ERR_INTERNAL, "cuda: %s: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

#define TRY(expr)                                                                                                   \
  do {                                                                                                              \
    dlrec_status try_ = (expr);                                                                                     \
    if (try_ != DLREC_OK) return try_;                                                                              \
  } while (0)

/* At least `bytes` of scratch device memory, grown when short (cudaFree
 * waits for the ops that used the old one); NULL when out of memory. */
void *cuda_scratch(dlrec_backend *be, size_t bytes);
/* The next piece of `bytes` from *at, 256-byte aligned. */
void *cuda_carve(char **at, size_t bytes);
/* Waits for every op on the stream, then takes back what the upload
 * staging had in flight. */
cudaError_t cuda_drain(dlrec_backend *be);
/* The host's idx in device memory: the staging's copy into scratch, which
 * the op's kernel reads next on the stream; NULL with *st on failure. */
const uint32_t *cuda_idx_on_device(dlrec_backend *be, const uint32_t *idx, size_t n, dlrec_status *st);

/* The memory entries of the ops table (cuda_memory.c). */
void *cuda_alloc(dlrec_backend *be, size_t bytes);
void cuda_release(dlrec_backend *be, void *p);
void *cuda_alloc_host(dlrec_backend *be, size_t bytes);
void cuda_release_host(dlrec_backend *be, void *p);
dlrec_status cuda_upload(dlrec_backend *be, void *dst, const void *host_src, size_t bytes);
dlrec_status cuda_download(dlrec_backend *be, void *host_dst, const void *src, size_t bytes);
dlrec_status cuda_synchronize(dlrec_backend *be);
dlrec_status cuda_download_async(dlrec_backend *be, void *host_dst, const void *src, size_t bytes);
void *cuda_fence_create(dlrec_backend *be);
void cuda_fence_free(dlrec_backend *be, void *f);
dlrec_status cuda_fence_record(dlrec_backend *be, void *f);
dlrec_status cuda_fence_wait(dlrec_backend *be, void *f);
/* Kept operands, fresh gradients and packed layers (cuda_gemm.c). */
int cuda_keep_operands(dlrec_backend *be, int on);
int cuda_fresh_gradients(dlrec_backend *be, int on);
void cuda_packed_free(dlrec_backend *be, dlrec_packed_linear *p);

/* Every op of ops.def: dlrec_status cuda_<op>(dlrec_backend *be, its arguments). */
#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test) dlrec_status cuda_##name(dlrec_backend *be DLREC_OPS_PARAMS(args));
#include "backend/ops.def"
#undef DLREC_OP
#undef A

#endif
