// Shared by the dev/cuda kernels (llm.c's dev/cuda layout): error checks,
// the no-GPU skip, timing, and a tiny deterministic RNG. Each kernel file is
// a program of its own that builds its inputs, runs a CPU reference, checks
// every GPU variant against it, and times them.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// splitmix64, as dlrec_mix64 and dlrec's RNG seeding.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// fp32 <-> bf16 with round to nearest even, as src/embed/dtype.h.
inline uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
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
