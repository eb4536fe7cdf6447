// Shared by the dev/cuda kernels (llm.c's dev/cuda layout): error checks,
// the no-GPU skip, timing, test data and the bag programs' command line.
// Each kernel file is a program of its own that builds its inputs, runs a
// CPU reference, checks every GPU variant against it, and times them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/hash.h"   // dlrec_mix64
#include "backend/dtype.h"  // dtype_f32_to_bf16, dtype_bf16_to_f32: the CPU's own conversions

#define CUDA_CHECK(call)                                                                                   \
  do {                                                                                                     \
    cudaError_t err_ = (call);                                                                             \
    if (err_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));        \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

// CTest's SKIP_RETURN_CODE: the test says why and counts as skipped.
constexpr int kSkip = 77;

// Exits with kSkip, saying so, when no CUDA device is visible.
inline void require_gpu(const char *what) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("%s: skipped: no CUDA device visible (%s)\n", what,
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    std::exit(kSkip);
  }
  cudaDeviceProp p;
  CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s: %s, %d SMs, %.1f GiB\n", what, p.name, p.multiProcessorCount,
              p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

// Test data: a value in [-scale, scale] in steps of scale / 1000, a pure
// function of (i, salt) through the project's own mix (core/hash.h).
inline float val(uint64_t i, uint64_t salt, float scale) {
  return (float)((int64_t)(dlrec_mix64(i ^ salt) % 2001) - 1000) / 1000.0f * scale;
}

// Embedding bags over a table of `rows`: bag g has 1 id (hot 1) or 1 to
// hot ids; ids skewed toward low rows (a frequency-ordered table's hot
// prefix, so hot rows repeat); offsets (bags + 1) and ids in CSR.
inline void make_bags(uint64_t rows, uint32_t bags, uint32_t hot, std::vector<uint32_t> &off,
                      std::vector<uint32_t> &ids) {
  off.assign(bags + 1, 0);
  ids.clear();
  ids.reserve((size_t)bags * hot);
  for (uint32_t g = 0; g < bags; g++) {
    off[g] = (uint32_t)ids.size();
    const uint32_t n = hot == 1 ? 1 : 1 + (uint32_t)(dlrec_mix64(g) % hot);
    for (uint32_t k = 0; k < n; k++) {
      const double u = (double)(dlrec_mix64(((uint64_t)g << 8) + k + 1) >> 11) * 0x1p-53;
      ids.push_back((uint32_t)(u * u * u * (double)rows));
    }
  }
  off[bags] = (uint32_t)ids.size();
}

// The bag programs' command line: [rows] [dim] [batch] [cols] [hot],
// defaults 2000000 128 65536 26 1; 0, or 2 after the usage (max_dim: the
// largest dim the program takes).
struct BagArgs {
  uint64_t rows = 2000000;
  int D = 128;
  uint32_t B = 65536, F = 26, hot = 1;
};
inline int parse_bag_args(int argc, char **argv, const char *name, int max_dim, BagArgs *a) {
  if (argc > 1) a->rows = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) a->D = std::atoi(argv[2]);
  if (argc > 3) a->B = (uint32_t)std::atoi(argv[3]);
  if (argc > 4) a->F = (uint32_t)std::atoi(argv[4]);
  if (argc > 5) a->hot = (uint32_t)std::atoi(argv[5]);
  if (a->rows < 1 || a->rows > UINT32_MAX || a->D < 1 || a->D > max_dim || a->B < 1 || a->F < 1 || a->hot < 1 ||
      (uint64_t)a->B * a->F > UINT32_MAX / 256) {
    std::fprintf(stderr, "usage: %s [rows < 2^32] [dim <= %d] [batch] [cols] [hot]\n", name, max_dim);
    return 2;
  }
  std::printf("%llu rows x %d, batch %u x %u columns, up to %u ids a bag\n", (unsigned long long)a->rows, a->D, a->B,
              a->F, a->hot);
  return 0;
}

// Milliseconds per call of fn, averaged over reps after one warm-up.
template <class F>
float time_ms(F fn, int reps) {
  fn();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; i++) fn();
  CUDA_CHECK(cudaEventRecord(b));
  CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return ms / reps;
}
