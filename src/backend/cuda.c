/* The CUDA backend: for now, finding the GPU a config names.
 *
 * This file is built whenever CMake finds the CUDA toolkit, and links the
 * static CUDA runtime, which loads the driver (libcuda) only when called:
 * one build/dlrec runs on machines with and without a GPU and says which it
 * found. Its ops (the kernels in dev/cuda/, issue 11) are not here yet, so
 * creating the backend stops after the device checks with an error naming
 * the GPU it would have used; train, eval, predict and serve then say so
 * instead of falling back to the CPU behind the user's back.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"

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

dlrec_status dlrec_backend_cuda_init(dlrec_backend *be, const dlrec_backend_config *c) {
  (void)be;
  dlrec_status s = visible(c->device, DLREC_ERR_INVALID);
  if (s != DLREC_OK) return s;
  char dev[256];
  describe_device((int)c->device, dev, sizeof dev);
  return dlrec_error(DLREC_ERR_UNSUPPORTED,
                     "found %s, but dlrec's CUDA backend has no ops yet (its kernels are in dev/cuda/, issue 11): "
                     "run on --device cpu",
                     dev);
}
