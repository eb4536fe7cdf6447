/* The CUDA backend: the GPU a config names, its memory, and the ops of
 * backend_impl.h on it (kernels in cuda_kernels.cu, GEMMs on cuBLASLt).
 *
 * This file is built whenever CMake finds the CUDA toolkit, and links the
 * static CUDA runtime, which loads the driver (libcuda) only when called,
 * and opens cuBLASLt only when a backend is created (cuda_blas.c): one
 * build/dlrec runs on machines with and without a GPU and says which it
 * found.
 *
 * Ops run in order on the backend's own stream and return once enqueued;
 * download and synchronize wait for them, and report a kernel's failure.
 * Uploads return once enqueued too: a batch's bytes go through pinned
 * staging (stage_upload), so a training step waits for the GPU once, when
 * its loss comes back.
 * Every op checks its arguments as the CPU kernel does before it enqueues
 * anything, so a refused call touches nothing.
 *
 * The bag ops take a table and optimizer mirrored in device memory
 * (mirror.c) and a batch in host memory, which they check as the CPU's ops
 * do and copy over. A network on the backend keeps its state in the
 * GPU's memory (src/model/net_device.c: be->host_memory is 0).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/fresh_grads.h"
#include "core/hash.h"
#include "backend/dtype.h"
#include "backend/checks.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The number of visible GPUs, or -1 with why there is none in why. */
static int device_count(char *why, size_t size) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver) {
    snprintf(why, size, "no CUDA device visible: no NVIDIA driver, or one older than this build's CUDA %d.%d runtime "
             "(cudaErrorInsufficientDriver)", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    return -1;
  }
  if (e != cudaSuccess) {
    snprintf(why, size, "no CUDA device visible (%s: %s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
  }
  if (n < 1) {
    snprintf(why, size, "no CUDA device visible (the driver reports none)");
    return -1;
  }
  return n;
}

/* "cuda:I NAME, X GiB, compute capability M.m" into buf. */
static void describe_device(int i, char *buf, size_t size) {
  struct cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, i);
  if (e != cudaSuccess) {
    snprintf(buf, size, "cuda:%d (its properties: %s)", i, cudaGetErrorString(e));
    return;
  }
  snprintf(buf, size, "cuda:%d %.200s, %.1f GiB, compute capability %d.%d", i, p.name, (double)p.totalGlobalMem / GIB,
           p.major, p.minor);
}

void backend_cuda_devices(char *buf, size_t size) {
  int n = device_count(buf, size);
  if (n < 0) return;
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && at + 1 < size; i++) {
    char one[256];
    describe_device(i, one, sizeof one);
    snprintf(buf + at, size - at, "%s%s", i ? "; " : "", one);
    at += strlen(buf + at);
  }
}

/* DLREC_OK when GPU `index` is visible; else why not: `missing` when there
 * is none or the index is past the machine's GPUs (naming them). */
static dlrec_status visible(uint32_t index, dlrec_status missing) {
  char why[256];
  int n = device_count(why, sizeof why);
  if (n < 0) return dlrec_error(DLREC_ERR_UNSUPPORTED, "cuda:%u: %s", index, why);
  if (index < (uint32_t)n) return DLREC_OK;
  char last[32] = "";
  if (n > 1) snprintf(last, sizeof last, " to cuda:%d", n - 1);
  return dlrec_error(missing, "cuda:%u: this machine has %d CUDA device%s (cuda:0%s)", index, n, n == 1 ? "" : "s",
                     last);
}

dlrec_status backend_cuda_memory(uint32_t index, uint64_t *total, uint64_t *available) {
  dlrec_status s = visible(index, DLREC_ERR_UNSUPPORTED);
  if (s != DLREC_OK) return s;
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaSetDevice((int)index);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "cuda:%u: its memory (%s: %s)", index, cudaGetErrorName(e),
                       cudaGetErrorString(e));
  *total = total_b;
  *available = free_b;
  return DLREC_OK;
}

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

static cuda_ctx *ctx_of(dlrec_backend *be) { return be->ctx; }

/* Selects the backend's GPU on the calling thread (a server calls from
 * several) and returns its stream. */
static cudaStream_t enter(dlrec_backend *be) {
  cudaSetDevice(ctx_of(be)->device);
  return ctx_of(be)->stream;
}

/* DLREC_OK, or the CUDA error of `what` as a status. */
static dlrec_status cuda_status(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return DLREC_OK;
  return dlrec_error(e == cudaErrorMemoryAllocation ? DLREC_ERR_NOMEM : DLREC_ERR_INTERNAL, "cuda: %s: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

#define TRY(expr)                                                                                                   \
  do {                                                                                                              \
    dlrec_status try_ = (expr);                                                                                     \
    if (try_ != DLREC_OK) return try_;                                                                              \
  } while (0)

/* At least `bytes` of scratch, grown when short (cudaFree waits for the ops
 * that used the old one). */
static void *scratch(dlrec_backend *be, size_t bytes) {
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
static void *carve(char **at, size_t bytes) {
  void *p = *at;
  *at += (bytes + 255) / 256 * 256;
  return p;
}

static void cuda_free_ctx(dlrec_backend *be) {
  cuda_ctx *x = ctx_of(be);
  if (!x) return;
  cudaSetDevice(x->device);
  if (x->stream) cudaStreamSynchronize(x->stream);
  cuda_blas_free(x->blas);
  if (x->scratch) cudaFree(x->scratch);
  for (uint32_t i = 0; i < MAX_KEPT; i++)
    if (x->kept[i].h) cudaFree(x->kept[i].h);
  if (x->bags_dev) cudaFree(x->bags_dev);
  if (x->bags_host) cudaFreeHost(x->bags_host);
  if (x->stage) cudaFreeHost(x->stage);
  if (x->bags_sent) cudaEventDestroy(x->bags_sent);
  pthread_mutex_destroy(&x->stage_lock);
  if (x->stream) cudaStreamDestroy(x->stream);
  free(x);
  be->ctx = NULL;
}

/* ---- memory: the GPU's ---- */

static void *cuda_alloc(dlrec_backend *be, size_t bytes) {
  enter(be);
  void *p = NULL;
  return cudaMalloc(&p, bytes ? bytes : 64) == cudaSuccess ? p : NULL; /* 256-byte aligned */
}

static void cuda_release(dlrec_backend *be, void *p) {
  if (!p) return;
  enter(be);
  cudaFree(p); /* waits for the ops that may still use it */
}

/* Pinned host memory: copies from and to it run at the bus's rate without
 * the driver's staging through a pinned bounce buffer. */
static void *cuda_alloc_host(dlrec_backend *be, size_t bytes) {
  enter(be);
  void *p = NULL;
  return cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocDefault) == cudaSuccess ? p : NULL; /* page aligned */
}

static void cuda_release_host(dlrec_backend *be, void *p) {
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
static cudaError_t drain(dlrec_backend *be) {
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
  if (e == cudaSuccess) e = drain(be);
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

static dlrec_status cuda_upload(dlrec_backend *be, void *dst, const void *host_src, size_t bytes) {
  TRY(copy_args(dst, host_src, bytes));
  if (!bytes) return DLREC_OK;
  int staged = 0;
  cudaError_t e = stage_upload(be, dst, host_src, bytes, &staged);
  if (e != cudaSuccess) return cuda_status(e, "upload");
  return staged ? DLREC_OK : copy_sync(be, dst, host_src, bytes, cudaMemcpyHostToDevice, "upload");
}

static dlrec_status cuda_download(dlrec_backend *be, void *host_dst, const void *src, size_t bytes) {
  return copy_sync(be, host_dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}

static dlrec_status cuda_synchronize(dlrec_backend *be) { return cuda_status(drain(be), "synchronize"); }

static dlrec_status cuda_download_async(dlrec_backend *be, void *host_dst, const void *src, size_t bytes) {
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

static void *cuda_fence_create(dlrec_backend *be) {
  enter(be);
  cuda_fence *f = calloc(1, sizeof *f);
  if (f && cudaEventCreateWithFlags(&f->ev, cudaEventDisableTiming) != cudaSuccess) {
    free(f);
    f = NULL;
  }
  return f;
}

static void cuda_fence_free(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return;
  enter(be);
  cudaEventDestroy(f->ev);
  free(f);
}

static dlrec_status cuda_fence_record(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return dlrec_error(DLREC_ERR_INVALID, "NULL fence");
  cudaStream_t st = enter(be);
  f->staged = stage_mark(ctx_of(be));
  return cuda_status(cudaEventRecord(f->ev, st), "fence");
}

static dlrec_status cuda_fence_wait(dlrec_backend *be, void *p) {
  cuda_fence *f = p;
  if (!f) return dlrec_error(DLREC_ERR_INVALID, "NULL fence");
  enter(be);
  TRY(cuda_status(cudaEventSynchronize(f->ev), "fence"));
  stage_landed(ctx_of(be), f->staged);
  return DLREC_OK;
}

/* ---- moving rows ---- */

static dlrec_status cuda_copy_rows(dlrec_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                                   size_t rows, size_t width) {
  if (!rows || !width) return DLREC_OK;
  TRY(nn_check_rows("copy_rows", dst, src, dst_ld, src_ld, width));
  return cuda_status(cuk_copy_rows(enter(be), dst, dst_ld, src, src_ld, rows, width), "copy_rows");
}

static dlrec_status cuda_fill_rows(dlrec_backend *be, float *dst, size_t dst_ld, size_t rows, size_t width,
                                   float value) {
  if (!rows || !width) return DLREC_OK;
  TRY(nn_check_rows("fill_rows", dst, dst, dst_ld, dst_ld, width));
  return cuda_status(cuk_fill_rows(enter(be), dst, dst_ld, rows, width, value), "fill_rows");
}

static dlrec_status cuda_add(dlrec_backend *be, float *y, const float *x, size_t n) {
  if (!n) return DLREC_OK;
  TRY(NN_NONNULL("add", y, x));
  return cuda_status(cuk_add(enter(be), y, x, n), "add");
}

/* The host's idx in device memory: the staging's copy into scratch, which
 * the op's kernel reads next on the stream. */
static const uint32_t *idx_on_device(dlrec_backend *be, const uint32_t *idx, size_t n, dlrec_status *st) {
  uint32_t *d = scratch(be, n * sizeof(uint32_t));
  *st = d ? cuda_upload(be, d, idx, n * sizeof(uint32_t))
          : dlrec_error(DLREC_ERR_NOMEM, "no GPU memory for %zu row indices", n);
  return *st == DLREC_OK ? d : NULL;
}

static dlrec_status cuda_gather_rows(dlrec_backend *be, float *dst, const float *src, size_t rows, const uint32_t *idx,
                                     size_t n, size_t width) {
  if (!n || !width) return DLREC_OK;
  TRY(nn_check_indexed_rows("gather_rows", dst, src, rows, idx, n));
  dlrec_status st;
  const uint32_t *d_idx = idx_on_device(be, idx, n, &st);
  return d_idx ? cuda_status(cuk_gather_rows(enter(be), dst, src, d_idx, n, width), "gather_rows") : st;
}

static dlrec_status cuda_scatter_add_rows(dlrec_backend *be, float *dst, size_t rows, const uint32_t *idx,
                                          const float *src, size_t n, size_t width) {
  if (!n || !width) return DLREC_OK;
  TRY(nn_check_indexed_rows("scatter_add_rows", dst, src, rows, idx, n));
  dlrec_status st;
  const uint32_t *d_idx = idx_on_device(be, idx, n, &st);
  return d_idx ? cuda_status(cuk_scatter_add_rows(enter(be), dst, d_idx, src, n, width), "scatter_add_rows") : st;
}

static dlrec_status cuda_scale(dlrec_backend *be, float *x, size_t n, float s) {
  if (!n) return DLREC_OK;
  TRY(NN_NONNULL("scale", x));
  return cuda_status(cuk_scale(enter(be), x, n, s), "scale");
}

static dlrec_status cuda_all_finite(dlrec_backend *be, int *finite, const float *x, size_t n) {
  if (!finite || (n && !x)) return dlrec_error(DLREC_ERR_INVALID, "all_finite: NULL buffer");
  *finite = 1;
  if (!n) return DLREC_OK;
  cudaStream_t st = enter(be);
  int *flag = scratch(be, sizeof(int)), bad = 0;
  if (!flag) return dlrec_error(DLREC_ERR_NOMEM, "all_finite: no GPU memory for a flag");
  TRY(cuda_status(cudaMemsetAsync(flag, 0, sizeof(int), st), "all_finite"));
  TRY(cuda_status(cuk_any_nonfinite(st, flag, x, n), "all_finite"));
  TRY(cuda_status(cudaMemcpyAsync(&bad, flag, sizeof(int), cudaMemcpyDeviceToHost, st), "all_finite"));
  TRY(cuda_status(drain(be), "all_finite"));
  *finite = !bad;
  return DLREC_OK;
}

static dlrec_status cuda_sum_columns(dlrec_backend *be, float *dst, const float *src, size_t B, size_t C) {
  if (!C) return DLREC_OK;
  if (!dst || (B && !src)) return dlrec_error(DLREC_ERR_INVALID, "sum_columns: NULL buffer");
  return cuda_status(cuk_sum_columns(enter(be), dst, src, B, C), "sum_columns");
}

/* ---- activations ---- */

static dlrec_status cuda_relu_forward(dlrec_backend *be, float *out, const float *in, size_t n) {
  TRY(NN_NONNULL("relu_forward", out, in));
  return n ? cuda_status(cuk_relu_forward(enter(be), out, in, n), "relu_forward") : DLREC_OK;
}

static dlrec_status cuda_relu_backward(dlrec_backend *be, float *din, const float *dout, const float *out, size_t n) {
  TRY(NN_NONNULL("relu_backward", din, dout, out));
  return n ? cuda_status(cuk_relu_backward(enter(be), din, dout, out, n), "relu_backward") : DLREC_OK;
}

static dlrec_status cuda_sigmoid(dlrec_backend *be, float *out, const float *in, size_t n) {
  TRY(NN_NONNULL("sigmoid_forward", out, in));
  return n ? cuda_status(cuk_sigmoid(enter(be), out, in, n), "sigmoid_forward") : DLREC_OK;
}

/* ---- linear layers: cuBLASLt, fp32, bf16 or fp16 operands ---- */

/* Row-major (r, c) is cuBLASLt's column-major (c, r): out (B, OUT) is
 * computed as outᵀ (OUT, B) = W (stored (OUT, IN), read transposed) · inᵀ. */

static cuda_blas_type gemm_type(const dlrec_backend *be) {
  return be->precision == DLREC_PRECISION_BF16   ? CUDA_BLAS_BF16
         : be->precision == DLREC_PRECISION_FP16 ? CUDA_BLAS_FP16
         : be->precision == DLREC_PRECISION_TF32 ? CUDA_BLAS_TF32
                                                 : CUDA_BLAS_FP32;
}

/* The operands a GEMM reads: the fp32 arrays themselves, or (bf16, fp16)
 * their rounded copies in scratch, and the scratch the GEMM writes. */
typedef struct operands {
  const void *a[3];
  float *partial;     /* the bias gradient's chunk sums */
  float *out;         /* a result of rows pad(IN) wide (gemm_backward) */
  const float *mask;  /* set by the caller: a[0] is converted through this ReLU mask, its sums into partial */
} operands;

/* Whether the GEMMs read 16-bit copies of their operands. */
static int half_operands(const dlrec_backend *be) {
  return gemm_type(be) == CUDA_BLAS_BF16 || gemm_type(be) == CUDA_BLAS_FP16;
}

/* 16-bit operands whose rows are not a multiple of 16 bytes leave cuBLASLt
 * only its slow unaligned kernels (DLRM's 479-wide interaction ran 5x slower
 * in them): the rows of IN values a bf16 or fp16 GEMM reads are made
 * pad(IN) wide, the pad zero, and the fp32 results IN wide are made pad(IN)
 * wide in scratch and copied out. */
static int pad_in(const dlrec_backend *be, int IN) { return half_operands(be) ? (IN + 7) / 8 * 8 : IN; }

static int cuda_keep_operands(dlrec_backend *be, int on) {
  cuda_ctx *x = ctx_of(be);
  if (!half_operands(be)) return 0;
  x->keep = on;
  for (uint32_t i = 0; i < x->n_kept; i++) x->kept[i].src = NULL;
  x->n_kept = 0;
  return 1;
}

static int cuda_fresh_gradients(dlrec_backend *be, int on) {
  fresh_grads_set(&ctx_of(be)->fresh, on);
  return 1;
}

/* The kept copy of src (rows x width, in rows of ld), or NULL. */
static const uint16_t *kept_find(const cuda_ctx *x, const float *src, size_t rows, size_t width, size_t ld) {
  for (uint32_t i = 0; i < x->n_kept; i++) {
    const struct cuda_kept *k = &x->kept[i];
    if (k->src == src && k->rows == rows && k->width == width && k->ld == ld) return k->h;
  }
  return NULL;
}

/* Where a forward converts src while keeping: its slot (the one of the same
 * source and shape, or the next one, grown as needed); NULL when not
 * keeping, out of slots or out of memory (then scratch will do). */
static uint16_t *kept_slot(cuda_ctx *x, const float *src, size_t rows, size_t width, size_t ld) {
  if (!x->keep) return NULL;
  uint16_t *h = (uint16_t *)kept_find(x, src, rows, width, ld);
  if (h || x->n_kept == MAX_KEPT) return h;
  struct cuda_kept *k = &x->kept[x->n_kept];
  const size_t bytes = rows * ld * 2;
  if (k->cap < bytes) {
    if (k->h) cudaFree(k->h); /* waits for the ops queued before: the last pass's readers */
    k->h = NULL;
    k->cap = 0;
    if (cudaMalloc((void **)&k->h, bytes) != cudaSuccess) {
      (void)cudaGetLastError(); /* out of memory is not sticky: this operand goes through scratch */
      k->h = NULL;
      return NULL;
    }
    k->cap = bytes;
  }
  *k = (struct cuda_kept){src, rows, width, ld, k->h, k->cap};
  x->n_kept++;
  return k->h;
}

/* How prepare treats an operand while keeping: as a forward's input or
 * weights (converted into its kept slot), as a backward's (its kept copy
 * read when there is one), or neither (dout: converted every time). */
enum { KEEP_NONE, KEEP_STORE, KEEP_READ };

/* Converts (bf16, fp16) or passes on the count operands src[i], rows[i] of
 * width[i] floats (rows of ld[i] in the copies), and carves partial_floats
 * and out_floats of scratch; keep[i] says what keeping does with src[i]. */
static dlrec_status prepare(dlrec_backend *be, operands *o, const float *const *src, const size_t *rows,
                            const size_t *width, const size_t *ld, const int *keep, int count,
                            size_t partial_floats, size_t out_floats, const char *what) {
  cuda_ctx *x = ctx_of(be);
  const int half = half_operands(be), fp16 = gemm_type(be) == CUDA_BLAS_FP16;
  const uint16_t *found[3] = {NULL, NULL, NULL};
  size_t bytes = (partial_floats + out_floats) * sizeof(float) + 512;
  for (int i = 0; half && i < count; i++) {
    if (src[i] && keep[i] == KEEP_READ) found[i] = kept_find(x, src[i], rows[i], width[i], ld[i]);
    if (!found[i]) bytes += (rows[i] * ld[i] * 2 + 255) / 256 * 256;
  }
  char *at = scratch(be, bytes);
  if (!at) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for %zu bytes of scratch", what, bytes);
  o->partial = partial_floats ? carve(&at, partial_floats * sizeof(float)) : NULL;
  o->out = out_floats ? carve(&at, out_floats * sizeof(float)) : NULL;
  for (int i = 0; i < count; i++) {
    if (!half || !src[i] || found[i]) {
      o->a[i] = found[i] ? (const void *)found[i] : (const void *)src[i];
      continue;
    }
    uint16_t *h = keep[i] == KEEP_STORE ? kept_slot(x, src[i], rows[i], width[i], ld[i]) : NULL;
    if (!h) h = carve(&at, rows[i] * ld[i] * 2);
    if (i == 0 && o->mask && ld[0] == width[0])
      TRY(cuda_status(cuk_relu_to_half_chunks(x->stream, h, o->partial, src[0], o->mask, rows[0], width[0], fp16),
                      what));
    else if (i == 0 && o->mask)
      return dlrec_error(DLREC_ERR_INTERNAL, "%s: a masked operand must be unpadded", what);
    else
      TRY(cuda_status(cuk_to_half(x->stream, h, ld[i], src[i], rows[i], width[i], fp16), what));
    o->a[i] = h;
  }
  return DLREC_OK;
}

static dlrec_status gemm_forward(dlrec_backend *be, float *out, const float *in, const float *weight,
                                 const float *bias, int B, int IN, int OUT, int relu) {
  enter(be);
  operands o = {0};
  const size_t P = (size_t)pad_in(be, IN);
  TRY(prepare(be, &o, (const float *[]){in, weight}, (size_t[]){(size_t)B, (size_t)OUT},
              (size_t[]){(size_t)IN, (size_t)IN}, (size_t[]){P, P}, (const int[]){KEEP_STORE, KEEP_STORE}, 2, 0, 0,
              "linear_forward"));
  return cuda_blas_matmul(ctx_of(be)->blas, out, o.a[1], (int)P, 1, o.a[0], (int)P, 0, OUT, B, (int)P, gemm_type(be),
                          0.0f, bias, relu);
}

/* mask: the ReLU's (linear_relu_backward) where the operands are 16-bit,
 * folded into dout's conversion and the bias sums; NULL otherwise. */
static dlrec_status gemm_backward(dlrec_backend *be, float *din, float *dweight, float *dbias, const float *dout,
                                  const float *mask, const float *in, const float *weight, int B, int IN, int OUT) {
  cudaStream_t st = enter(be);
  operands o = {.mask = mask};
  const int P = pad_in(be, IN);
  const size_t out_floats = P == IN ? 0 : (size_t)P * ((size_t)OUT > (size_t)B ? (size_t)OUT : (size_t)B);
  TRY(prepare(be, &o, (const float *[]){dout, in, din ? weight : NULL}, (size_t[]){(size_t)B, (size_t)B, (size_t)OUT},
              (size_t[]){(size_t)OUT, (size_t)IN, (size_t)IN}, (size_t[]){(size_t)OUT, (size_t)P, (size_t)P},
              (const int[]){KEEP_NONE, KEEP_READ, KEEP_READ}, 3,
              dbias ? cuk_colsum_partials((size_t)B, (size_t)OUT) : 0, out_floats, "linear_backward"));
  cuda_blas *blas = ctx_of(be)->blas;
  /* dWᵀ (IN, OUT) += inᵀ (IN, B) · dout (B, OUT), through rows of P; = where fresh */
  const int add = fresh_grads_accumulates(&ctx_of(be)->fresh, dweight, (size_t)OUT * IN);
  float *dw = P == IN ? dweight : o.out;
  if (P != IN && add) TRY(cuda_status(cuk_copy_rows(st, dw, P, dweight, IN, OUT, IN), "linear_backward"));
  TRY(cuda_blas_matmul(blas, dw, o.a[1], P, 0, o.a[0], OUT, 1, P, OUT, B, gemm_type(be), add ? 1.0f : 0.0f, NULL,
                       0));
  if (P != IN) TRY(cuda_status(cuk_copy_rows(st, dweight, IN, dw, P, OUT, IN), "linear_backward"));
  if (dbias && mask) TRY(cuda_status(cuk_colsum_finish(st, dbias, o.partial, (size_t)B, (size_t)OUT), "bias gradient"));
  else if (dbias)
    TRY(cuda_status(cuk_colsum_accumulate(st, dbias, dout, (size_t)B, (size_t)OUT, o.partial), "bias gradient"));
  /* dinᵀ (IN, B) = W (IN, OUT as stored) · doutᵀ (OUT, B), through rows of P */
  if (!din) return DLREC_OK;
  float *di = P == IN ? din : o.out;
  TRY(cuda_blas_matmul(blas, di, o.a[2], P, 0, o.a[0], OUT, 0, P, B, OUT, gemm_type(be), 0.0f, NULL, 0));
  return P == IN ? DLREC_OK : cuda_status(cuk_copy_rows(st, din, IN, di, P, B, IN), "linear_backward");
}

static dlrec_status cuda_linear_forward(dlrec_backend *be, float *out, const float *in, const float *weight,
                                        const float *bias, int B, int IN, int OUT, dlrec_act act) {
  TRY(nn_check_linear("linear_forward", out, in, weight, B, IN, OUT));
  return gemm_forward(be, out, in, weight, bias, B, IN, OUT, act == DLREC_ACT_RELU);
}

static dlrec_status cuda_linear_backward(dlrec_backend *be, float *din, float *dweight, float *dbias,
                                         const float *dout, const float *in, const float *weight, int B, int IN,
                                         int OUT) {
  TRY(nn_check_linear("linear_backward", dweight, dout, in, B, IN, OUT));
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_backward: din needs the weights");
  return gemm_backward(be, din, dweight, dbias, dout, NULL, in, weight, B, IN, OUT);
}

/* With 16-bit operands the mask rides on dout's conversion and the bias's
 * chunk sums (cuk_relu_to_half_chunks), dout untouched; in fp32 and tf32
 * the ReLU's backward runs in place, then the linear backward. */
static dlrec_status cuda_linear_relu_backward(dlrec_backend *be, float *din, float *dweight, float *dbias, float *dout,
                                              const float *out, const float *in, const float *weight, int B, int IN,
                                              int OUT) {
  TRY(nn_check_linear("linear_relu_backward", dweight, dout, in, B, IN, OUT));
  TRY(NN_NONNULL("linear_relu_backward", out));
  if (din && !weight) return dlrec_error(DLREC_ERR_INVALID, "linear_relu_backward: din needs the weights");
  if (half_operands(be)) return gemm_backward(be, din, dweight, dbias, dout, out, in, weight, B, IN, OUT);
  TRY(cuda_status(cuk_relu_backward(enter(be), dout, dout, out, (size_t)B * OUT), "linear_relu_backward"));
  return gemm_backward(be, din, dweight, dbias, dout, NULL, in, weight, B, IN, OUT);
}

/* ---- interactions ---- */

static dlrec_status cuda_dot_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int F,
                                     int D) {
  TRY(nn_check_dot("interaction_dot_forward", out, x, emb, B, F, D));
  return cuda_status(cuk_dot_forward(enter(be), out, x, emb, B, F, D), "interaction_dot_forward");
}

static dlrec_status cuda_dot_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, const float *x,
                                      const float *emb, int B, int F, int D) {
  TRY(nn_check_dot("interaction_dot_backward", dx, demb, dout, B, F, D));
  TRY(NN_NONNULL("interaction_dot_backward", x, emb));
  return cuda_status(cuk_dot_backward(enter(be), dx, demb, dout, x, emb, B, F, D), "interaction_dot_backward");
}

/* The concatenation is two strided copies: x into each row's first DX
 * values, emb into the rest. */
static dlrec_status cuda_concat_forward(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int DX,
                                        int F, int D) {
  TRY(nn_check_concat("interaction_concat_forward", out, emb, B, DX, F, D));
  if (DX > 0 && !x)
    return dlrec_error(DLREC_ERR_INVALID, "interaction_concat_forward: NULL dense buffer with DX=%d", DX);
  cudaStream_t st = enter(be);
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
  if (DX > 0) TRY(cuda_status(cuk_copy_rows(st, out, W, x, DX, B, DX), "interaction_concat_forward"));
  return cuda_status(cuk_copy_rows(st, out + DX, W, emb, FD, B, FD), "interaction_concat_forward");
}

static dlrec_status cuda_concat_backward(dlrec_backend *be, float *dx, float *demb, const float *dout, int B, int DX,
                                         int F, int D) {
  TRY(nn_check_concat("interaction_concat_backward", demb, dout, B, DX, F, D));
  cudaStream_t st = enter(be);
  const size_t FD = (size_t)F * D, W = (size_t)DX + FD;
  if (dx && DX > 0) TRY(cuda_status(cuk_copy_rows(st, dx, DX, dout, W, B, DX), "interaction_concat_backward"));
  return cuda_status(cuk_copy_rows(st, demb, FD, dout + DX, W, B, FD), "interaction_concat_backward");
}

/* ---- DCN-v2's cross layers: the products on cuBLASLt, the gate a kernel
 * (the composition of src/nn/cross.c) ---- */

static dlrec_status cuda_cross_forward(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                       const float *w, const float *bias, int B, int d) {
  TRY(NN_NONNULL("cross_forward", out, act, x0, xl, w, bias));
  TRY(nn_check_cross("cross_forward", B, d, 0));
  TRY(gemm_forward(be, act, xl, w, bias, B, d, d, 0)); /* u (B, d) */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, act, xl, (size_t)B * d), "cross_forward");
}

static dlrec_status cuda_cross_backward(dlrec_backend *be, float *dx0, float *dxl, float *dw, float *dbias,
                                        const float *dout, const float *x0, const float *xl, const float *act,
                                        const float *w, float *ws, int B, int d) {
  TRY(NN_NONNULL("cross_backward", dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws));
  TRY(nn_check_cross("cross_backward", B, d, 0));
  const size_t n = (size_t)B * d;
  float *du = ws; /* (B, d) */
  TRY(cuda_status(cuk_cross_gate_backward(enter(be), du, dx0, dout, x0, act, n), "cross_backward"));
  TRY(gemm_backward(be, dxl, dw, dbias, du, NULL, xl, w, B, d, d));
  return cuda_status(cuk_add(enter(be), dxl, dout, n), "cross_backward");
}

static dlrec_status cuda_cross_lowrank_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                               const float *xl, const float *v, const float *u, const float *bias,
                                               int B, int d, int r) {
  TRY(NN_NONNULL("cross_lowrank_forward", out, act, x0, xl, v, u, bias));
  TRY(nn_check_cross_lowrank("cross_lowrank_forward", B, d, r));
  float *t = act, *uu = act + (size_t)B * r;
  TRY(gemm_forward(be, t, xl, v, NULL, B, d, r, 0));   /* t (B, r) = xl · Vᵀ */
  TRY(gemm_forward(be, uu, t, u, bias, B, r, d, 0));   /* u (B, d) = t · Uᵀ + bias */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, uu, xl, (size_t)B * d), "cross_lowrank_forward");
}

static dlrec_status cuda_cross_lowrank_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *du,
                                                float *dbias, const float *dout, const float *x0, const float *xl,
                                                const float *act, const float *v, const float *u, float *ws, int B,
                                                int d, int r) {
  TRY(NN_NONNULL("cross_lowrank_backward", dx0, dxl, dv, du, dbias, dout, x0, xl, act, v, u, ws));
  TRY(nn_check_cross_lowrank("cross_lowrank_backward", B, d, r));
  const size_t n = (size_t)B * d;
  const float *t = act, *uu = act + (size_t)B * r;
  float *dpre = ws, *dt = ws + n; /* (B, d), (B, r) */
  TRY(cuda_status(cuk_cross_gate_backward(enter(be), dpre, dx0, dout, x0, uu, n), "cross_lowrank_backward"));
  TRY(gemm_backward(be, dt, du, dbias, dpre, NULL, t, u, B, r, d));
  TRY(gemm_backward(be, dxl, dv, NULL, dt, NULL, xl, v, B, d, r));
  return cuda_status(cuk_add(enter(be), dxl, dout, n), "cross_lowrank_backward");
}

/* ---- the mixture of low-rank experts (src/nn/cross_mix.c's composition) ---- */

static dlrec_status cuda_cross_mix_forward(dlrec_backend *be, float *out, float *act, const float *x0,
                                           const float *xl, const float *v, const float *c, const float *u,
                                           const float *gate, const float *bias, int B, int d, int r, int K) {
  const char *what = "cross_mix_forward";
  TRY(NN_NONNULL(what, out, act, x0, xl, v, c, u, gate, bias));
  TRY(nn_check_cross_mix(what, B, d, r, K));
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  for (int k = 0; k < K; k++) {
    TRY(gemm_forward(be, t1 + k * Br, xl, v + (size_t)k * r * d, NULL, B, d, r, 1));
    TRY(gemm_forward(be, t2 + k * Br, t1 + k * Br, c + (size_t)k * r * r, NULL, B, r, r, 1));
    TRY(gemm_forward(be, e + k * Bd, t2 + k * Br, u + (size_t)k * d * r, bias, B, r, d, 0));
  }
  TRY(gemm_forward(be, p, xl, gate, NULL, B, d, K, 0)); /* logits (B, K) */
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_softmax_rows(st, p, B, K), what));
  TRY(cuda_status(cuk_mixture(st, out, p, e, B, d, K), what));
  return cuda_status(cuk_cross_gate(st, out, x0, out, xl, Bd), what);
}

static dlrec_status cuda_cross_mix_backward(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *dc, float *du,
                                            float *dgate, float *dbias, const float *dout, const float *x0,
                                            const float *xl, const float *act, const float *v, const float *c,
                                            const float *u, const float *gate, float *ws, int B, int d, int r,
                                            int K) {
  const char *what = "cross_mix_backward";
  TRY(NN_NONNULL(what, dx0, dxl, dv, dc, du, dgate, dbias, dout, x0, xl, act, v, c, u, gate, ws));
  TRY(nn_check_cross_mix(what, B, d, r, K));
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  const float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  float *m = ws, *de = m + Bd, *tmp = de + Bd, *dt2 = tmp + Bd, *dt1 = dt2 + Br, *dlogit = dt1 + Br;
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_mixture(st, m, p, e, B, d, K), what));
  TRY(cuda_status(cuk_mix_dx0(st, dx0, m, dout, x0, Bd), what)); /* m is dm from here */
  TRY(cuda_status(cuk_mix_dlogit(st, dlogit, m, e, p, B, d, K), what));
  TRY(gemm_backward(be, tmp, dgate, NULL, dlogit, NULL, xl, gate, B, d, K));
  TRY(cuda_status(cuk_copy_rows(st, dxl, Bd, dout, Bd, 1, Bd), what));
  TRY(cuda_status(cuk_add(st, dxl, tmp, Bd), what)); /* dxl = dout + the gate's term */
  for (int k = 0; k < K; k++) {
    const float *t1k = t1 + k * Br, *t2k = t2 + k * Br;
    TRY(cuda_status(cuk_mix_scale(st, de, m, p, B, d, K, k), what));
    TRY(gemm_backward(be, dt2, du + (size_t)k * d * r, dbias, de, NULL, t2k, u + (size_t)k * d * r, B, r, d));
    TRY(cuda_status(cuk_relu_backward(st, dt2, dt2, t2k, Br), what));
    TRY(gemm_backward(be, dt1, dc + (size_t)k * r * r, NULL, dt2, NULL, t1k, c + (size_t)k * r * r, B, r, r));
    TRY(cuda_status(cuk_relu_backward(st, dt1, dt1, t1k, Br), what));
    TRY(gemm_backward(be, tmp, dv + (size_t)k * r * d, NULL, dt1, NULL, xl, v + (size_t)k * r * d, B, d, r));
    TRY(cuda_status(cuk_add(st, dxl, tmp, Bd), what));
  }
  return DLREC_OK;
}

/* ---- batch-invariant scoring: packed layers ----
 *
 * A packed layer here is the weight transposed to (IN, OUT) and the bias in
 * device memory; each output is the fma chain of nn/nn.h's contract,
 * which the CPU's packed layer computes with the same roundings where it
 * has FMA, so the two score alike bit for bit. */

typedef struct cuda_packed {
  int in, out;
  float *wt;   /* (IN, OUT) */
  float *bias; /* (OUT), or NULL */
} cuda_packed;

static void cuda_packed_free(dlrec_backend *be, dlrec_packed_linear *pl) {
  cuda_packed *p = (cuda_packed *)pl;
  if (!p) return;
  enter(be);
  cudaFree(p->wt);
  cudaFree(p->bias);
  free(p);
}

static dlrec_status cuda_packed_create(dlrec_backend *be, dlrec_packed_linear **out, const float *weight,
                                       const float *bias, int IN, int OUT) {
  TRY(nn_check_packed(out, weight, IN, OUT));
  cuda_packed *p = calloc(1, sizeof *p);
  float *wt = malloc((size_t)IN * OUT * sizeof(float));
  dlrec_status s = DLREC_OK;
  if (!p || !wt) s = dlrec_error(DLREC_ERR_NOMEM, "packed_linear_create: out of memory");
  if (s == DLREC_OK) {
    for (int o = 0; o < OUT; o++)
      for (int k = 0; k < IN; k++) wt[(size_t)k * OUT + o] = weight[(size_t)o * IN + k];
    p->in = IN, p->out = OUT;
    p->wt = cuda_alloc(be, (size_t)IN * OUT * sizeof(float));
    p->bias = bias ? cuda_alloc(be, (size_t)OUT * sizeof(float)) : NULL;
    if (!p->wt || (bias && !p->bias))
      s = dlrec_error(DLREC_ERR_NOMEM, "packed_linear_create: no GPU memory for a %dx%d layer", IN, OUT);
  }
  if (s == DLREC_OK) s = cuda_upload(be, p->wt, wt, (size_t)IN * OUT * sizeof(float));
  if (s == DLREC_OK && bias) s = cuda_upload(be, p->bias, bias, (size_t)OUT * sizeof(float));
  free(wt);
  if (s != DLREC_OK) {
    if (p) cuda_packed_free(be, (dlrec_packed_linear *)p);
    return s;
  }
  *out = (dlrec_packed_linear *)p;
  return DLREC_OK;
}

static dlrec_status packed_run(dlrec_backend *be, float *out, const dlrec_packed_linear *pl, const float *in, int B,
                               int relu, const char *what) {
  const cuda_packed *p = (const cuda_packed *)pl;
  return cuda_status(cuk_packed_forward(enter(be), out, p->wt, p->bias, in, B, p->in, p->out, relu), what);
}

static dlrec_status cuda_packed_forward(dlrec_backend *be, float *out, const dlrec_packed_linear *p, const float *in,
                                        int B, dlrec_act act) {
  if (!p || !in || !out) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: NULL argument");
  if (B < 1) return dlrec_error(DLREC_ERR_INVALID, "packed_linear_forward: bad batch size B=%d", B);
  return packed_run(be, out, p, in, B, act == DLREC_ACT_RELU, "packed_linear_forward");
}

static dlrec_status cuda_cross_infer(dlrec_backend *be, float *out, const float *x0, const float *xl,
                                     const dlrec_packed_linear *w, int B, int d) {
  if (!out || !x0 || !xl || !w) return dlrec_error(DLREC_ERR_INVALID, "cross_infer: NULL argument");
  TRY(nn_check_cross("cross_infer", B, d, 0));
  TRY(packed_run(be, out, w, xl, B, 0, "cross_infer")); /* u (B, d), in out */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, out, xl, (size_t)B * d), "cross_infer");
}

static dlrec_status cuda_cross_lowrank_infer(dlrec_backend *be, float *out, float *ws, const float *x0,
                                             const float *xl, const dlrec_packed_linear *v,
                                             const dlrec_packed_linear *u, int B, int d, int r) {
  if (!out || !ws || !x0 || !xl || !v || !u)
    return dlrec_error(DLREC_ERR_INVALID, "cross_lowrank_infer: NULL argument");
  TRY(nn_check_cross_lowrank("cross_lowrank_infer", B, d, r));
  TRY(packed_run(be, ws, v, xl, B, 0, "cross_lowrank_infer"));  /* t (B, r) */
  TRY(packed_run(be, out, u, ws, B, 0, "cross_lowrank_infer")); /* u (B, d), in out */
  return cuda_status(cuk_cross_gate(enter(be), out, x0, out, xl, (size_t)B * d), "cross_lowrank_infer");
}

static dlrec_status cuda_cross_mix_infer(dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl,
                                         const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                         const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B,
                                         int d, int r, int K) {
  const char *what = "cross_mix_infer";
  if (!out || !ws || !x0 || !xl || !v || !c || !u || !gate)
    return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  TRY(nn_check_cross_mix(what, B, d, r, K));
  for (int k = 0; k < K; k++)
    if (!v[k] || !c[k] || !u[k]) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL layer of expert %d", what, k);
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = ws, *t2 = t1 + Br, *e = t2 + Br, *p = e + Bd;
  cudaStream_t st = enter(be);
  TRY(packed_run(be, p, gate, xl, B, 0, what));
  TRY(cuda_status(cuk_softmax_rows(st, p, B, K), what));
  TRY(cuda_status(cuk_fill_rows(st, out, Bd, 1, Bd, 0.0f), what));
  for (int k = 0; k < K; k++) { /* the experts into out in k order, as the training forward's mixture */
    TRY(packed_run(be, t1, v[k], xl, B, 1, what));
    TRY(packed_run(be, t2, c[k], t1, B, 1, what));
    TRY(packed_run(be, e, u[k], t2, B, 0, what));
    TRY(cuda_status(cuk_mixture_add(st, out, p, e, B, d, K, k), what));
  }
  return cuda_status(cuk_cross_gate(st, out, x0, out, xl, Bd), what);
}

/* ---- FM, wide ---- */

static dlrec_status cuda_fm_forward(dlrec_backend *be, float *out, const float *emb, int B, int F, int D) {
  TRY(nn_check_fm("fm_forward", out, emb, B, F, D));
  return cuda_status(cuk_fm_forward(enter(be), out, emb, B, F, D), "fm_forward");
}

static dlrec_status cuda_fm_backward(dlrec_backend *be, float *demb, const float *dout, const float *emb, int B, int F,
                                     int D) {
  TRY(nn_check_fm("fm_backward", demb, dout, B, F, D));
  TRY(NN_NONNULL("fm_backward", emb));
  return cuda_status(cuk_fm_backward(enter(be), demb, dout, emb, B, F, D), "fm_backward");
}

static dlrec_status cuda_wide_forward(dlrec_backend *be, float *out, const float *w, const float *bias, int B, int F) {
  TRY(nn_check_wide("wide_forward", out, w, B, F));
  return cuda_status(cuk_wide_forward(enter(be), out, w, bias, B, F), "wide_forward");
}

static dlrec_status cuda_wide_backward(dlrec_backend *be, float *dw, float *dbias, const float *dout, int B, int F) {
  TRY(nn_check_wide("wide_backward", dw, dout, B, F));
  cudaStream_t st = enter(be);
  float *partial = NULL;
  if (dbias && !(partial = scratch(be, cuk_colsum_partials((size_t)B, 1) * sizeof(float))))
    return dlrec_error(DLREC_ERR_NOMEM, "wide_backward: no GPU memory for its scratch");
  TRY(cuda_status(cuk_wide_backward(st, dw, dout, B, F), "wide_backward"));
  if (dbias) TRY(cuda_status(cuk_colsum_accumulate(st, dbias, dout, (size_t)B, 1, partial), "wide_backward"));
  return DLREC_OK;
}

/* ---- dropout: src/nn/dropout.c's masks ---- */

static dlrec_status dropout_apply(dlrec_backend *be, float *y, const float *x, size_t n, const nn_dropout_mask *m,
                                  int copy, const char *what) {
  if (!n) return DLREC_OK;
  cudaStream_t st = enter(be);
  if (copy)
    return y == x ? DLREC_OK
                  : cuda_status(cudaMemcpyAsync(y, x, n * sizeof(float), cudaMemcpyDeviceToDevice, st), what);
  return cuda_status(cuk_dropout(st, y, x, n, m->key, m->threshold, m->scale), what);
}

static dlrec_status cuda_dropout_forward(dlrec_backend *be, float *out, const float *in, size_t n, float p,
                                         uint64_t seed, uint64_t step, int train) {
  nn_dropout_mask m;
  TRY(nn_dropout_mask_make(&m, "dropout_forward", out, in, p, seed, step));
  return dropout_apply(be, out, in, n, &m, !train || p == 0.0f, "dropout_forward");
}

static dlrec_status cuda_dropout_backward(dlrec_backend *be, float *din, const float *dout, size_t n, float p,
                                          uint64_t seed, uint64_t step) {
  nn_dropout_mask m;
  TRY(nn_dropout_mask_make(&m, "dropout_backward", din, dout, p, seed, step));
  return dropout_apply(be, din, dout, n, &m, p == 0.0f, "dropout_backward");
}

/* ---- batch normalization (src/nn/batchnorm.c's steps) ---- */

static dlrec_status cuda_batchnorm_train_forward(dlrec_backend *be, float *out, float *saved, const float *in,
                                                 const float *gamma, const float *beta, float *running_mean,
                                                 float *running_var, float momentum, float eps, int B, int C) {
  const char *what = "batchnorm_train_forward";
  TRY(NN_NONNULL(what, out, saved, in, gamma, beta, running_mean, running_var));
  TRY(nn_check_batchnorm(what, B, 2, C));
  TRY(nn_check_momentum(what, momentum, eps));
  double *sum = scratch(be, 2 * (size_t)C * sizeof(double)), *sqdev = sum + C;
  if (!sum) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for its scratch", what);
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_bn_stats(st, sum, in, NULL, B, B, C), what));
  TRY(cuda_status(cuk_bn_stats(st, sqdev, in, sum, B, B, C), what));
  return cuda_status(cuk_bn_normalize(st, out, saved, in, sum, sqdev, B, gamma, beta, running_mean, running_var,
                                      momentum, eps, B, C),
                     what);
}

static dlrec_status cuda_batchnorm_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma, const float *saved,
                                            int B, int C) {
  const char *what = "batchnorm_backward";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, saved));
  TRY(nn_check_batchnorm(what, B, 2, C));
  double *sg = scratch(be, 2 * (size_t)C * sizeof(double)), *sgx = sg + C;
  if (!sg) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for its scratch", what);
  cudaStream_t st = enter(be);
  TRY(cuda_status(cuk_bn_backward_stats(st, sg, sgx, dout, in, saved, B, C), what));
  return cuda_status(cuk_bn_backward_apply(st, din, dgamma, dbeta, dout, in, gamma, saved, sg, sgx, sg, sgx, B, B, C),
                     what);
}

static dlrec_status cuda_batchnorm_stats(dlrec_backend *be, double *out, const float *in, const double *sum, double N,
                                         int B, int C) {
  TRY(NN_NONNULL("batchnorm_stats", out, in));
  TRY(nn_check_batchnorm("batchnorm_stats", B, 1, C));
  if (sum && !(N >= 1)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_stats: N=%g rows, expected at least 1", N);
  return cuda_status(cuk_bn_stats(enter(be), out, in, sum, N, B, C), "batchnorm_stats");
}

static dlrec_status cuda_batchnorm_normalize(dlrec_backend *be, float *out, float *saved, const float *in,
                                             const double *sum, const double *sqdev, double N, const float *gamma,
                                             const float *beta, float *running_mean, float *running_var,
                                             float momentum, float eps, int B, int C) {
  const char *what = "batchnorm_normalize";
  TRY(NN_NONNULL(what, out, saved, in, sum, sqdev, gamma, beta));
  if (!running_mean != !running_var) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  TRY(nn_check_batchnorm(what, B, 1, C));
  TRY(nn_check_momentum(what, momentum, eps));
  if (!(N >= 2)) return dlrec_error(DLREC_ERR_INVALID, "%s: N=%g rows, expected at least 2", what, N);
  return cuda_status(cuk_bn_normalize(enter(be), out, saved, in, sum, sqdev, N, gamma, beta, running_mean,
                                      running_var, momentum, eps, B, C),
                     what);
}

static dlrec_status cuda_batchnorm_backward_stats(dlrec_backend *be, double *sg, double *sgx, const float *dout,
                                                  const float *in, const float *saved, int B, int C) {
  TRY(NN_NONNULL("batchnorm_backward_stats", sg, sgx, dout, in, saved));
  TRY(nn_check_batchnorm("batchnorm_backward_stats", B, 1, C));
  return cuda_status(cuk_bn_backward_stats(enter(be), sg, sgx, dout, in, saved, B, C), "batchnorm_backward_stats");
}

static dlrec_status cuda_batchnorm_backward_apply(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                                  const float *dout, const float *in, const float *gamma,
                                                  const float *saved, const double *sg_way, const double *sgx_way,
                                                  const double *sg, const double *sgx, double N, int B, int C) {
  const char *what = "batchnorm_backward_apply";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg, sgx));
  TRY(nn_check_batchnorm(what, B, 1, C));
  if (!(N >= 2)) return dlrec_error(DLREC_ERR_INVALID, "%s: N=%g rows, expected at least 2", what, N);
  return cuda_status(cuk_bn_backward_apply(enter(be), din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg,
                                           sgx, N, B, C),
                     what);
}

static dlrec_status cuda_batchnorm_infer(dlrec_backend *be, float *out, const float *in, const float *gamma,
                                         const float *beta, const float *running_mean, const float *running_var,
                                         float eps, int B, int C) {
  TRY(NN_NONNULL("batchnorm_infer", out, in, gamma, beta, running_mean, running_var));
  TRY(nn_check_batchnorm("batchnorm_infer", B, 1, C));
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "batchnorm_infer: eps=%g must be > 0", eps);
  return cuda_status(cuk_bn_infer(enter(be), out, in, gamma, beta, running_mean, running_var, eps, B, C),
                     "batchnorm_infer");
}

static dlrec_status cuda_batchnorm_infer_backward(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                                  const float *dout, const float *in, const float *gamma,
                                                  const float *running_mean, const float *running_var, float eps,
                                                  int B, int C) {
  const char *what = "batchnorm_infer_backward";
  TRY(NN_NONNULL(what, din, dgamma, dbeta, dout, in, gamma, running_mean, running_var));
  TRY(nn_check_batchnorm(what, B, 1, C));
  if (!(eps > 0.0f)) return dlrec_error(DLREC_ERR_INVALID, "%s: eps=%g must be > 0", what, eps);
  return cuda_status(
      cuk_bn_infer_backward(enter(be), din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C),
      what);
}

/* ---- embedding bags: tables and optimizer state in device memory (the
 * mirrors of mirror.c), batches from the host ---- */

/* The ids of a batch (checked by check_bags) in all. */
static uint64_t bag_ids(const dlrec_bag_batch *bags) {
  uint64_t ids = 0;
  for (uint32_t c = 0; c < bags->cols; c++) ids += bags->offsets[c][bags->rows] - bags->offsets[c][0];
  return ids;
}

/* A batch of `ids` ids laid out as cuk_bags reads it: per column its B + 1
 * offsets, then the F + 1 column bases into ids, the ids column after
 * column, and a mean flag per column. Offsets' bytes into *offs and the
 * bases' into *base. */
static size_t bags_layout(const dlrec_bag_batch *bags, uint64_t ids, size_t *offs, size_t *base) {
  *offs = (size_t)bags->cols * (bags->rows + 1) * 4;
  *base = ((size_t)bags->cols + 1) * 4;
  return *offs + *base + ids * 4 + bags->cols;
}

/* The batch's mean flags: the mode's, or the column's own. */
static uint8_t bag_mean(const dlrec_bag_batch *bags, dlrec_bag_mode mode, uint32_t c) {
  return mode == DLREC_BAG_MEAN || (bags->mean_cols && bags->mean_cols[c]);
}

/* Whether the batch equals the one last sent (x->bags_host), which was
 * checked against table t: the same shape, flags, offsets and ids. */
static int bags_same(const cuda_ctx *x, const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_bag_mode mode) {
  if (!x->bags_len || x->bags_table != t || x->bags_table_rows != dlrec_table_rows(t) || x->bags.B != bags->rows ||
      x->bags.F != bags->cols || !bags->offsets || !bags->ids)
    return 0;
  const uint32_t B = bags->rows, F = bags->cols;
  const uint32_t *h = x->bags_host, *h_base = h + (size_t)F * (B + 1), *h_ids = h_base + F + 1;
  const uint8_t *h_mean = (const uint8_t *)(h_ids + h_base[F]);
  for (uint32_t c = 0; c < F; c++)
    if (!bags->offsets[c] || !bags->ids[c] || h_mean[c] != bag_mean(bags, mode, c)) return 0;
  int diff = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : diff) if ((uint64_t)B * F >= 32768)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c];
    /* The offsets first: equal to checked ones, they bound the ids read. */
    if (memcmp(h + (size_t)c * (B + 1), off, (size_t)(B + 1) * 4)) diff |= 1;
    else diff |= memcmp(h_ids + h_base[c], bags->ids[c] + off[0], (size_t)(h_base[c + 1] - h_base[c]) * 4) != 0;
  }
  return !diff;
}

/* The batch (checked by check_bags against t, `ids` ids) laid out in pinned
 * host memory, copied to the device, and kept as the last batch sent;
 * *out is its device view. */
static dlrec_status bags_send(dlrec_backend *be, const dlrec_table *t, const dlrec_bag_batch *bags, uint64_t ids,
                              dlrec_bag_mode mode, cuk_bags *out, const char *what) {
  cuda_ctx *x = ctx_of(be);
  const uint32_t B = bags->rows, F = bags->cols;
  if (ids > UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %llu ids in one batch, at most 2^32 - 1", what, (unsigned long long)ids);
  size_t offs, base;
  const size_t bytes = bags_layout(bags, ids, &offs, &base);
  x->bags_len = 0; /* until this batch is whole on both sides */
  /* bags_host is free to rewrite (or free) once the last copy from it has
   * landed (at the start of the last step: no wait in a training loop); the
   * kernels that read bags_dev run on the stream the next copy is queued on. */
  TRY(cuda_status(cudaEventSynchronize(x->bags_sent), what));
  if (bytes > x->bags_cap) {
    enter(be);
    if (x->bags_dev) cudaFree(x->bags_dev); /* waits for the ops that used it */
    if (x->bags_host) cudaFreeHost(x->bags_host);
    x->bags_dev = x->bags_host = NULL;
    x->bags_cap = 0;
    const size_t want = bytes + bytes / 4;
    if (cudaMalloc(&x->bags_dev, want) != cudaSuccess || cudaHostAlloc(&x->bags_host, want, 0) != cudaSuccess) {
      if (x->bags_dev) cudaFree(x->bags_dev);
      x->bags_dev = x->bags_host = NULL;
      return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for a batch of %zu bytes on the GPU or pinned on the host",
                         what, bytes);
    }
    x->bags_cap = want;
  }
  /* Both buffers are free to overwrite (see above). */
  uint32_t *h = x->bags_host, *h_base = h + (size_t)F * (B + 1), *h_ids = h_base + F + 1;
  h_base[0] = 0;
  for (uint32_t c = 0; c < F; c++) h_base[c + 1] = h_base[c] + (bags->offsets[c][B] - bags->offsets[c][0]);
#pragma omp parallel for schedule(dynamic) if ((uint64_t)B * F >= 32768)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c];
    memcpy(h + (size_t)c * (B + 1), off, (size_t)(B + 1) * 4);
    memcpy(h_ids + h_base[c], bags->ids[c] + off[0], (size_t)(h_base[c + 1] - h_base[c]) * 4);
  }
  uint8_t *h_mean = (uint8_t *)(h_ids + ids);
  for (uint32_t c = 0; c < F; c++) h_mean[c] = bag_mean(bags, mode, c);
  TRY(cuda_status(cudaMemcpyAsync(x->bags_dev, x->bags_host, bytes, cudaMemcpyHostToDevice, enter(be)), what));
  TRY(cuda_status(cudaEventRecord(x->bags_sent, enter(be)), what));
  const char *d = x->bags_dev;
  x->bags = (cuk_bags){(const uint32_t *)d, (const uint32_t *)(d + offs), (const uint32_t *)(d + offs + base),
                       (const uint8_t *)(d + offs + base + ids * 4), B, F};
  x->bags_table = t;
  x->bags_table_rows = dlrec_table_rows(t);
  x->bags_ids = ids;
  x->bags_len = bytes;
  *out = x->bags;
  return DLREC_OK;
}

static cuk_rows rows_of(const dlrec_table *t) {
  const cuk_rows r = {(void *)dlrec_table_raw_const(t), dlrec_table_rows(t), dlrec_table_stride(t), dlrec_table_dim(t),
                      (int)dlrec_table_get_dtype(t)};
  return r;
}

/* The CPU's checks of a batch against table t (dlrec_bag_check: shape,
 * offsets in order, ids in the table), before anything is sized or sent. */
static dlrec_status check_bags(const char *what, const void *a, const dlrec_table *t, const dlrec_bag_batch *bags,
                               dlrec_bag_mode mode) {
  if (!a) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  if (mode != DLREC_BAG_SUM && mode != DLREC_BAG_MEAN)
    return dlrec_error(DLREC_ERR_INVALID, "%s: unknown mode %d", what, (int)mode);
  return dlrec_bag_check(t, bags) == DLREC_OK ? DLREC_OK : dlrec_error_context("%s: ", what);
}

/* The batch on the device, *ids its ids: the last one sent when this equals
 * it (checked then against the same table), else checked and sent. */
static dlrec_status bags_on_device(dlrec_backend *be, const char *what, const void *a, const dlrec_table *t,
                                   const dlrec_bag_batch *bags, dlrec_bag_mode mode, uint64_t *ids, cuk_bags *out) {
  cuda_ctx *x = ctx_of(be);
  if (a && t && bags && (mode == DLREC_BAG_SUM || mode == DLREC_BAG_MEAN) && bags_same(x, t, bags, mode)) {
    *ids = x->bags_ids;
    *out = x->bags;
    return DLREC_OK;
  }
  TRY(check_bags(what, a, t, bags, mode));
  *ids = bag_ids(bags);
  return bags_send(be, t, bags, *ids, mode, out, what);
}

static dlrec_status cuda_bag_forward(dlrec_backend *be, float *out, const dlrec_table *t, const dlrec_bag_batch *bags,
                                     dlrec_bag_mode mode) {
  const char *what = "bag_forward";
  uint64_t ids;
  cuk_bags bg;
  TRY(bags_on_device(be, what, out, t, bags, mode, &ids, &bg));
  return cuda_status(cuk_bag_forward(enter(be), out, rows_of(t), bg), what);
}

static dlrec_status cuda_bag_backward_update(dlrec_backend *be, dlrec_table *t, dlrec_sparse_optim *o,
                                             const dlrec_bag_batch *bags, dlrec_bag_mode mode, const float *d_out,
                                             void *scratch_in, size_t scratch_bytes) {
  const char *what = "bag_backward_update";
  uint64_t ids;
  cuk_bags bg;
  TRY(bags_on_device(be, what, d_out, t, bags, mode, &ids, &bg)); /* the forward's batch: neither checked nor sent */
  if (!o) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  dlrec_sparse_optim_state s;
  dlrec_sparse_optim_state_view(o, &s);
  if (s.rows != dlrec_table_rows(t) || s.stride != dlrec_table_stride(t))
    return dlrec_error(DLREC_ERR_INVALID, "%s: the optimizer is another table's", what);
  const size_t need = dlrec_bag_backward_scratch_bytes(t, ids);
  if (!scratch_in || scratch_bytes < need) /* the caller's, sized as for the CPU: the contract's check */
    return dlrec_error(DLREC_ERR_INVALID,
                       "%s: scratch of %zu bytes; this batch of %llu ids needs %zu (plan it with "
                       "dlrec_bag_backward_scratch_bytes)",
                       what, scratch_bytes, (unsigned long long)ids, need);
  if (dlrec_table_dim(t) > 1024) return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: rows wider than 1024", what);
  if (ids == 0) return DLREC_OK; /* no row to update */
  const size_t update = cuk_bag_update_scratch((uint32_t)ids, dlrec_table_dim(t), dlrec_table_rows(t));
  char *at = scratch(be, update);
  if (!at) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for %zu bytes of scratch", what, update);
  const dlrec_sparse_optim_config *c = dlrec_sparse_optim_get_config(o);
  const cuk_sparse_opt opt = {c->kind == DLREC_SPARSE_SGD ? 0 : c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 1 : 2,
                              c->lr, c->weight_decay, c->beta1, c->beta2, c->eps, log((double)c->beta1),
                              log((double)c->beta2), s.accum, s.m, s.v, s.steps,
                              dtype_sr_key(s.updates ? *s.updates : 0), dlrec_sparse_optim_row_keys(o)};
  TRY(cuda_status(cuk_bag_update(enter(be), rows_of(t), bg, (uint32_t)ids, d_out, opt, at, update), what));
  if (s.updates) ++*s.updates; /* the next update's rounding key, as the CPU's count */
  return DLREC_OK;
}

/* ---- loss, dense optimizer ---- */

/* *loss is the backend's memory, like every other output. */
static dlrec_status cuda_bce_forward(dlrec_backend *be, double *loss, const float *logits, const float *labels,
                                     int B) {
  TRY(nn_check_bce("bce_logits_forward", loss, logits, labels, B));
  double *terms = scratch(be, (size_t)B * sizeof(double));
  if (!terms) return dlrec_error(DLREC_ERR_NOMEM, "bce_logits_forward: no GPU memory for its scratch");
  return cuda_status(cuk_bce_forward(enter(be), loss, logits, labels, B, terms), "bce_logits_forward");
}

static dlrec_status cuda_bce_backward(dlrec_backend *be, float *dlogits, const float *logits, const float *labels,
                                      int B) {
  TRY(nn_check_bce("bce_logits_backward", dlogits, logits, labels, B));
  return cuda_status(cuk_bce_backward(enter(be), dlogits, logits, labels, B), "bce_logits_backward");
}

static dlrec_status cuda_optim_step(dlrec_backend *be, const dlrec_optim_config *c, float *param, const float *grad,
                                    float *state, size_t n, uint64_t step) {
  /* The config's checks are the CPU's own: initializing no state runs them
   * and touches nothing. */
  TRY(dlrec_optim_state_init(c, NULL, 0));
  TRY(NN_NONNULL("optim_step", param, grad));
  if (dlrec_optim_state_floats(c, n) && !state) return dlrec_error(DLREC_ERR_INVALID, "optim_step: NULL state");
  float step_size = 0, inv_sqrt_bc2 = 0;
  if (c->kind == DLREC_OPTIM_ADAM) {
    if (step < 1) return dlrec_error(DLREC_ERR_INVALID, "optim_step: Adam's step counts from 1");
    const double bc1 = 1.0 - pow(c->beta1, (double)step), bc2 = 1.0 - pow(c->beta2, (double)step);
    step_size = (float)(c->lr / bc1);
    inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
  }
  if (!n) return DLREC_OK;
  const int kind = c->kind == DLREC_OPTIM_SGD ? 0 : c->kind == DLREC_OPTIM_ADAM ? 1 : 2;
  return cuda_status(cuk_optim_step(enter(be), kind, param, grad, state, n, c->lr, c->weight_decay, c->beta1,
                                    c->beta2, c->eps, step_size, inv_sqrt_bc2),
                     "optim_step");
}

static const dlrec_backend_ops cuda_ops = {
    .free = cuda_free_ctx,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .alloc_host = cuda_alloc_host,
    .release_host = cuda_release_host,
    .upload = cuda_upload,
    .download = cuda_download,
    .synchronize = cuda_synchronize,
    .gather_rows = cuda_gather_rows,
    .scatter_add_rows = cuda_scatter_add_rows,
    .download_async = cuda_download_async,
    .fence_create = cuda_fence_create,
    .fence_free = cuda_fence_free,
    .fence_record = cuda_fence_record,
    .fence_wait = cuda_fence_wait,
    .copy_rows = cuda_copy_rows,
    .fill_rows = cuda_fill_rows,
    .add = cuda_add,
    .scale = cuda_scale,
    .all_finite = cuda_all_finite,
    .sum_columns = cuda_sum_columns,
    .keep_operands = cuda_keep_operands,
    .fresh_gradients = cuda_fresh_gradients,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .linear_relu_backward = cuda_linear_relu_backward,
    .relu_forward = cuda_relu_forward,
    .relu_backward = cuda_relu_backward,
    .sigmoid = cuda_sigmoid,
    .dot_forward = cuda_dot_forward,
    .dot_backward = cuda_dot_backward,
    .concat_forward = cuda_concat_forward,
    .concat_backward = cuda_concat_backward,
    .cross_forward = cuda_cross_forward,
    .cross_backward = cuda_cross_backward,
    .cross_lowrank_forward = cuda_cross_lowrank_forward,
    .cross_lowrank_backward = cuda_cross_lowrank_backward,
    .fm_forward = cuda_fm_forward,
    .fm_backward = cuda_fm_backward,
    .wide_forward = cuda_wide_forward,
    .wide_backward = cuda_wide_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .batchnorm_train_forward = cuda_batchnorm_train_forward,
    .batchnorm_backward = cuda_batchnorm_backward,
    .batchnorm_stats = cuda_batchnorm_stats,
    .batchnorm_normalize = cuda_batchnorm_normalize,
    .batchnorm_backward_stats = cuda_batchnorm_backward_stats,
    .batchnorm_backward_apply = cuda_batchnorm_backward_apply,
    .batchnorm_infer = cuda_batchnorm_infer,
    .batchnorm_infer_backward = cuda_batchnorm_infer_backward,
    .bce_forward = cuda_bce_forward,
    .bce_backward = cuda_bce_backward,
    .optim_step = cuda_optim_step,
    .cross_mix_forward = cuda_cross_mix_forward,
    .cross_mix_backward = cuda_cross_mix_backward,
    .packed_create = cuda_packed_create,
    .packed_free = cuda_packed_free,
    .packed_forward = cuda_packed_forward,
    .cross_infer = cuda_cross_infer,
    .cross_lowrank_infer = cuda_cross_lowrank_infer,
    .cross_mix_infer = cuda_cross_mix_infer,
    .bag_forward = cuda_bag_forward,
    .bag_backward_update = cuda_bag_backward_update,
};

dlrec_status dlrec_backend_cuda_init(dlrec_backend *be, const dlrec_backend_config *c) {
  TRY(visible(c->device, DLREC_ERR_INVALID));
  cuda_ctx *x = calloc(1, sizeof *x);
  if (!x) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (pthread_mutex_init(&x->stage_lock, NULL)) {
    free(x);
    return dlrec_error(DLREC_ERR_NOMEM, "cannot create a lock");
  }
  x->device = (int)c->device;
  char dev[256];
  describe_device(x->device, dev, sizeof dev);
  cudaError_t e = cudaSetDevice(x->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&x->bags_sent, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (x->stream) cudaStreamDestroy(x->stream);
    pthread_mutex_destroy(&x->stage_lock);
    free(x);
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: %s (%s)", dev, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  dlrec_status s = cuda_blas_create(&x->blas, x->stream);
  if (s != DLREC_OK) {
    cudaEventDestroy(x->bags_sent);
    cudaStreamDestroy(x->stream);
    pthread_mutex_destroy(&x->stage_lock);
    free(x);
    return dlrec_error_context("%s: ", dev);
  }
  /* bf16 where asked, and for auto: every GPU this build targets (compute
   * capability 8.0 and up) has bf16, fp16 and TF32 tensor cores. */
  be->precision = dlrec_precision_resolve("cuda", c->precision);
  be->ops = &cuda_ops;
  be->name = "cuda";
  be->threads = c->threads ? c->threads : 1; /* host threads: the ops run on the GPU */
  be->device = c->device;
  be->bf16_native = be->precision == DLREC_PRECISION_BF16;
  be->host_memory = 0;
  be->ctx = x;
  snprintf(be->describe, sizeof be->describe, "%.100s, %s GEMMs on cuBLASLt", dev,
           dlrec_precision_name(be->precision));
  return DLREC_OK;
}
