/* The CUDA backend's memory: device and pinned allocations, the copies
 * across the bus (uploads through a pinned staging ring, so that they
 * return without waiting for the GPU), scratch, and fences. */
#include "backend/cuda/cuda_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* At least `bytes` of scratch, grown when short (cudaFree waits for the ops
 * that used the old one). */
void *cuda_scratch(dlrec_backend *be, size_t bytes) {
  cuda_ctx *x = ctx_of(be);
  if (bytes <= x->scratch_bytes) return x->scratch;
  if (x->scratch) cudaFree(x->scratch);
  x->scratch = NULL;
  x->scratch_bytes = 0;
  size_t want = bytes < (1u << 20) ? (1u << 20) : bytes + bytes / 4;
  if (cudaMalloc(&x->scratch, want) != cudaSuccess) {
    x->scratch = NULL;
    return NULL;
  }
  x->scratch_bytes = want;
  return x->scratch;
}

/* The next piece of `bytes` from *at, 256-byte aligned. */
void *cuda_carve(char **at, size_t bytes) {
  void *p = *at;
  *at += (bytes + 255) / 256 * 256;
  return p;
}

/* ---- memory: the GPU's ---- */

void *cuda_alloc(dlrec_backend *be, size_t bytes) {
  enter(be);
  void *p = NULL;
  return cudaMalloc(&p, bytes ? bytes : 64) == cudaSuccess ? p : NULL; /* 256-byte aligned */
}

void cuda_release(dlrec_backend *be, void *p) {
  if (!p) return;
  enter(be);
  cudaFree(p); /* waits for the ops that may still use it */
}

/* Pinned host memory: copies from and to it run at the bus's rate without
 * the driver's staging through a pinned bounce buffer. */
void *cuda_alloc_host(dlrec_backend *be, size_t bytes) {
  enter(be);
  void *p = NULL;
  return cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault) == cudaSuccess ? p : NULL; /* page aligned */
}

void cuda_release_host(dlrec_backend *be, void *p) {
  if (!p) return;
  enter(be);
  cudaFreeHost(p);
}

/* Where the staging's hand-outs stand before a wait; after the wait,
 * stage_landed(x, mark) frees what was handed out before it (what was
 * handed out since is queued behind the wait's end, maybe not landed). */
static uint64_t stage_mark(cuda_ctx *x) {
  pthread_mutex_lock(&x->stage_lock);
  const uint64_t m = x->stage_next;
  pthread_mutex_unlock(&x->stage_lock);
  return m;
}

static void stage_landed(cuda_ctx *x, uint64_t mark) {
  pthread_mutex_lock(&x->stage_lock);
  if (mark > x->stage_free) x->stage_free = mark;
  pthread_mutex_unlock(&x->stage_lock);
}

/* Waits for every op on the stream, then takes back what it had in flight. */
cudaError_t cuda_drain(dlrec_backend *be) {
  cuda_ctx *x = ctx_of(be);
  const uint64_t mark = stage_mark(x);
  cudaError_t e = cudaStreamSynchronize(enter(be));
  if (e == cudaSuccess) stage_landed(x, mark);
  return e;
}

/* A copy's arguments: refused with a NULL buffer and bytes to move. */
static dlrec_status copy_args(const void *dst, const void *src, size_t bytes) {
  return bytes && (!dst || !src) ? dlrec_error(DLREC_ERR_INVALID, "copy of %zu bytes with a NULL buffer", bytes)
                                 : DLREC_OK;
}

/* A copy in `kind`'s direction that has landed when it returns (the host
 * buffer may be reused at once). */
static dlrec_status copy_sync(dlrec_backend *be, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                              const char *what) {
  TRY(copy_args(dst, src, bytes));
  if (!bytes) return DLREC_OK;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, enter(be));
  if (e == cudaSuccess) e = cuda_drain(be);
  return cuda_status(e, what);
}

/* Uploads up to this size go through the staging (a batch's dense features
 * and labels, layers' parameters); larger ones (tables) copy directly and
 * wait. */
#define STAGE_MAX ((size_t)64 << 20)

/* host_src's bytes copied into the staging and sent from there: done when
 * this returns as far as the caller's buffer goes, landed before any later
 * op on the stream runs. *staged is 0 when they are too many for it. */
static cudaError_t stage_upload(dlrec_backend *be, void *dst, const void *host_src, size_t bytes, int *staged) {
  cuda_ctx *x = ctx_of(be);
  const size_t need = (bytes + 255) / 256 * 256;
  *staged = 0;
  if (need > STAGE_MAX / 2) return cudaSuccess;
  cudaStream_t st = enter(be);
  cudaError_t e = cudaSuccess;
  pthread_mutex_lock(&x->stage_lock);
  if (need > x->stage_cap / 2) { /* too small for two of these: a larger one, once nothing is in flight */
    e = cudaStreamSynchronize(st);
    if (e == cudaSuccess) {
      size_t want = x->stage_cap * 2 > need * 2 ? x->stage_cap * 2 : need * 2;
      if (want < ((size_t)8 << 20)) want = (size_t)8 << 20;
      if (want > STAGE_MAX) want = STAGE_MAX;
      if (x->stage) cudaFreeHost(x->stage);
      x->stage = NULL;
      x->stage_cap = 0;
      x->stage_free = x->stage_next = 0;
      void *p = NULL;
      if (cudaHostAlloc(&p, want, cudaHostAllocDefault) == cudaSuccess) x->stage = p, x->stage_cap = want;
    }
  }
  if (e == cudaSuccess && need <= x->stage_cap / 2) {
    size_t at = (size_t)(x->stage_next % x->stage_cap);
    const size_t skip = at + need > x->stage_cap ? x->stage_cap - at : 0; /* to the ring's start */
    if (x->stage_next + skip + need - x->stage_free > x->stage_cap) {
      /* Full: wait for everything sent from it. */
      e = cudaStreamSynchronize(st);
      if (e == cudaSuccess) x->stage_free = x->stage_next;
    }
    if (e == cudaSuccess) {
      x->stage_next += skip;
      at = (size_t)(x->stage_next % x->stage_cap);
      memcpy(x->stage + at, host_src, bytes);
      e = cudaMemcpyAsync(dst, x->stage + at, bytes, cudaMemcpyHostToDevice, st);
      if (e == cudaSuccess) {
        x->stage_next += need;
        *staged = 1;
      }
    }
  }
  pthread_mutex_unlock(&x->stage_lock);
  return e;
}

dlrec_status cuda_upload(dlrec_backend *be, void *dst, const void *host_src, size_t bytes) {
  TRY(copy_args(dst, host_src, bytes));
  if (!bytes) return DLREC_OK;
  int staged = 0;
  cudaError_t e = stage_upload(be, dst, host_src, bytes, &staged);
  if (e != cudaSuccess) return cuda_status(e, "upload");
  return staged ? DLREC_OK : copy_sync(be, dst, host_src, bytes, cudaMemcpyHostToDevice, "upload");
}

dlrec_status cuda_download(dlrec_backend *be, void *host_dst, const void *src, size_t bytes) {
  return copy_sync(be, host_dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}

dlrec_status cuda_synchronize(dlrec_backend *be) { return cuda_status(cuda_drain(be), "synchronize"); }

dlrec_status cuda_download_async(dlrec_backend *be, void *host_dst, const void *src, size_t bytes) {
  TRY(copy_args(host_dst, src, bytes));
  if (!bytes) return DLREC_OK;
  return cuda_status(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, enter(be)), "download");
}

/* A fence: an event, and where the staging's hand-outs stood when it was
 * recorded (what a wait for it frees). */
typedef struct cuda_fence {
  cudaEvent_t ev;
  uint64_t staged;
} cuda_fence;

void *cuda_fence_create(dlrec_backend *be) {
  enter(be);
  cuda_fence *f = calloc(1, sizeof *f);
  if (f && cudaEventCreateWithFlags(&f->ev, cudaEventDisableTiming) != cudaSuccess) {
    free(f);
    f = NULL;
  }
  return f;
}

void cuda_fence_free(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return;
  enter(be);
  cudaEventDestroy(f->ev);
  free(f);
}

dlrec_status cuda_fence_record(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return dlrec_error(DLREC_ERR_INVALID, "NULL fence");
  cudaStream_t st = enter(be);
  f->staged = stage_mark(ctx_of(be));
  return cuda_status(cudaEventRecord(f->ev, st), "fence");
}

dlrec_status cuda_fence_wait(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return dlrec_error(DLREC_ERR_INVALID, "NULL fence");
  enter(be);
  TRY(cuda_status(cudaEventSynchronize(f->ev), "fence"));
  stage_landed(ctx_of(be), f->staged);
  return DLREC_OK;
}

/* The host's idx in device memory: the staging's copy into scratch, which
 * the op's kernel reads next on the stream. */
const uint32_t *cuda_idx_on_device(dlrec_backend *be, const uint32_t *idx, size_t n, dlrec_status *st) {
  uint32_t *d = cuda_scratch(be, n * sizeof(uint32_t));
  *st = d ? cuda_upload(be, d, idx, n * sizeof(uint32_t))
          : dlrec_error(DLREC_ERR_NOMEM, "no GPU memory for %zu row indices", n);
  return *st == DLREC_OK ? d : NULL;
}

