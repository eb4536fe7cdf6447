/* The CUDA backend: the GPU a config names, its context, and the table of
 * its ops (ops.def's, each in cuda_*.c: cuda_impl.h says which file holds
 * what; kernels in kernels_*.cu, GEMMs on cuBLASLt).
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
#include "backend/cuda/cuda_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

