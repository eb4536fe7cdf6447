// What the CUDA backend's kernel files share: the launch shape (a grid of
// kThreads-thread blocks striding over the rest) and the macros that launch
// a kernel and loop over its elements. Included by each kernels_*.cu; its
// helpers have internal linkage in each.
#ifndef DLREC_CUDA_KERNELS_CUH
#define DLREC_CUDA_KERNELS_CUH

#include <stdint.h>

#include "backend/cuda/cuda_kernels.h"

namespace {

constexpr int kThreads = 256;

// Blocks for n threads' worth of work, capped: the kernels stride over the rest.
inline unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

#define GRID_STRIDE(i, n)                                                                                             \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

inline bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

// σ(z) from exp(-|z|), as the CPU's (cpu/activation.c): no overflow for
// any finite z. The sigmoid op's and the loss's.
__device__ inline float sigmoid(float z) {
  const float e = expf(-fabsf(z)), s = 1.0f / (1.0f + e);
  return z >= 0.0f ? s : e * s;
}

} // namespace

#define LAUNCH(kernel, n, st, ...) (kernel<<<blocks_for(n), kThreads, 0, (st)>>>(__VA_ARGS__), cudaGetLastError())

#endif
