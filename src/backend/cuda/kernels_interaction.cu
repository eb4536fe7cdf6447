// The CUDA backend's kernels (declared in cuda_kernels.h, called by the ops of
// cuda_*.c): the dot interaction, the FM term and the wide term. They came from
// dev/cuda/, where each was checked bit for bit or within its stated bound
// against a CPU reference and timed on an H100; the op-by-op test
// (tests/test_backend.c) checks them here against the same double references as
// the CPU backend's.
//
// Products and sums that the CPU rounds one by one use the _rn intrinsics
// where the result is compared bit for bit (dropout's masks, the copies);
// elsewhere the compiler may contract into FMA, which the op tests' bounds
// allow. Reductions are fixed trees or in-order loops: two runs give the
// same bits.
#include "backend/cuda/kernels.cuh"

namespace {

// ---- the dot interaction ----

// The pair index p = i (i - 1) / 2 + j, 0 <= j < i, back to (i, j).
__device__ inline void pair_of(int p, int *i, int *j) {
  int r = (int)((1.0f + sqrtf(1.0f + 8.0f * (float)p)) / 2.0f);
  while (r * (r - 1) / 2 > p) r--;
  while ((r + 1) * r / 2 <= p) r++;
  *i = r;
  *j = p - r * (r - 1) / 2;
}

__device__ inline float pair_grad(const float *g, int i, int k) {
  const int hi = i > k ? i : k, lo = i > k ? k : i;
  return g[hi * (hi - 1) / 2 + lo];
}

// Rows [0, rows) of a sample's Z = [x; e_1 .. e_F] into shared memory, rows
// S floats apart (S = D + 1 where lanes read a column: without the pad every
// lane of a warp read the same bank), rows past F zero; nt threads from
// thread t0, 16-byte loads where D allows (the loads, not the arithmetic,
// bound these kernels).
__device__ inline void load_z_rows(float *z, int S, const float *x, const float *emb, size_t b, int F, int D,
                                   int rows, int t0, int nt) {
  if (D % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)emb % 16 == 0) {
    const int Q = D / 4;
#pragma unroll 4
    for (int t = t0; t < rows * Q; t += nt) {
      const int r = t / Q, c = 4 * (t - r * Q);
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r <= F) v = *reinterpret_cast<const float4 *>(r == 0 ? x + b * D + c : emb + (b * F + r - 1) * D + c);
      float *o = z + r * S + c;
      o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    }
    return;
  }
#pragma unroll 4
  for (int t = t0; t < rows * D; t += nt) {
    const int r = t / D, c = t - r * D;
    z[r * S + c] = r == 0 ? x[b * D + c] : r <= F ? emb[(b * F + r - 1) * D + c] : 0.0f;
  }
}

// A block a sample, Z and the pair gradients in shared memory; a thread per
// (i, d), k in order.
__global__ void dot_backward_shared_k(float *dx, float *demb, const float *dout, const float *x, const float *emb,
                                      int F, int D) {
  extern __shared__ float z[];
  const int b = blockIdx.x, S = D + 1, pairs = F * (F + 1) / 2;
  const size_t O = (size_t)D + pairs;
  float *g = z + (F + 1) * S;
  load_z_rows(z, S, x, emb, b, F, D, F + 1, threadIdx.x, blockDim.x);
  for (int t = threadIdx.x; t < pairs; t += blockDim.x) g[t] = dout[(size_t)b * O + D + t];
  __syncthreads();
  for (int t = threadIdx.x; t < (F + 1) * D; t += blockDim.x) {
    const int i = t / D, d = t % D;
    float acc = 0.0f;
    for (int k = 0; k <= F; k++)
      if (k != i) acc += pair_grad(g, i, k) * z[k * S + d];
    if (i == 0) dx[(size_t)b * D + d] = dout[(size_t)b * O + d] + acc;
    else demb[((size_t)b * F + i - 1) * D + d] = acc;
  }
}

// The tiled forward: a block a sample, Z in shared memory padded to whole
// tiles (rows of S = D + 1 floats, the pad rows zero); a thread a tile of
// kDotTile x kDotTile pairs (i, j) of the lower triangle, each summed over
// d in order as above, so each value read from shared memory feeds
// kDotTile products.
constexpr int kDotTile = 2;

__global__ void dot_forward_tiled_k(float *out, const float *x, const float *emb, int F, int D) {
  extern __shared__ float z[];
  const int N = F + 1, S = D + 1, NT = (N + kDotTile - 1) / kDotTile, pairs = F * (F + 1) / 2;
  const size_t b = blockIdx.x;
  load_z_rows(z, S, x, emb, b, F, D, NT * kDotTile, threadIdx.x, blockDim.x);
  __syncthreads();
  float *o = out + b * (D + pairs);
  for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = z[d];
  for (int tt = threadIdx.x; tt < NT * (NT + 1) / 2; tt += blockDim.x) {
    int ti = 0;
    while ((ti + 1) * (ti + 2) / 2 <= tt) ti++;
    const int tj = tt - ti * (ti + 1) / 2; // tj <= ti
    const float *zi = z + ti * kDotTile * S, *zj = z + tj * kDotTile * S;
    float acc[kDotTile][kDotTile] = {};
    for (int d = 0; d < D; d++) {
      float a[kDotTile], c[kDotTile];
#pragma unroll
      for (int r = 0; r < kDotTile; r++) a[r] = zi[r * S + d], c[r] = zj[r * S + d];
#pragma unroll
      for (int r = 0; r < kDotTile; r++)
#pragma unroll
        for (int q = 0; q < kDotTile; q++) acc[r][q] = fmaf(a[r], c[q], acc[r][q]);
    }
#pragma unroll
    for (int r = 0; r < kDotTile; r++)
#pragma unroll
      for (int q = 0; q < kDotTile; q++) {
        const int i = ti * kDotTile + r, j = tj * kDotTile + q;
        if (i < N && j < i) o[D + i * (i - 1) / 2 + j] = acc[r][q];
      }
  }
}

// The backward by rows: dZ = G Z, G the symmetric (N, N) matrix of the
// pair gradients with a zero diagonal (rows of NP floats in shared memory,
// the pad zero). A block a sample, a thread a d: it reads each z_k[d] once
// and keeps all NP sums in registers, each summed over k in order as above
// (the diagonal's zero adds nothing); Z in shared memory. N <= NP.
template <int NP>
__global__ void dot_backward_rows_k(float *dx, float *demb, const float *dout, const float *x, const float *emb, int F,
                                    int D) {
  __shared__ __align__(16) float G[NP * NP];
  extern __shared__ float z[]; /* (N, D) */
  const int N = F + 1, pairs = F * (F + 1) / 2;
  const size_t b = blockIdx.x, O = (size_t)D + pairs;
  const float *g = dout + b * O + D;
  load_z_rows(z, D, x, emb, b, F, D, N, threadIdx.x, blockDim.x);
  for (int t = threadIdx.x; t < N * NP; t += blockDim.x) {
    const int k = t / NP, i = t - k * NP, hi = i > k ? i : k, lo = i > k ? k : i;
    G[t] = i < N && i != k ? g[hi * (hi - 1) / 2 + lo] : 0.0f;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc[NP] = {};
    for (int k = 0; k < N; k++) {
      const float zk = z[k * D + d];
      const float4 *g4 = reinterpret_cast<const float4 *>(G + k * NP);
#pragma unroll
      for (int q = 0; q < NP / 4; q++) {
        const float4 v = g4[q];
        acc[4 * q] = fmaf(v.x, zk, acc[4 * q]);
        acc[4 * q + 1] = fmaf(v.y, zk, acc[4 * q + 1]);
        acc[4 * q + 2] = fmaf(v.z, zk, acc[4 * q + 2]);
        acc[4 * q + 3] = fmaf(v.w, zk, acc[4 * q + 3]);
      }
    }
    dx[b * D + d] = dout[b * O + d] + acc[0];
#pragma unroll
    for (int i = 1; i < NP; i++)
      if (i < N) demb[(b * F + i - 1) * D + d] = acc[i];
  }
}

// Shapes too large for shared memory: the same sums from global memory.
__device__ inline const float *z_row(const float *x, const float *emb, size_t b, int F, int D, int k) {
  return k == 0 ? x + b * D : emb + (b * F + k - 1) * D;
}

__global__ void dot_forward_global_k(float *out, const float *x, const float *emb, int B, int F, int D) {
  const int pairs = F * (F + 1) / 2;
  const size_t O = (size_t)D + pairs;
  GRID_STRIDE(t, (size_t)B * pairs) {
    const size_t b = t / pairs;
    int i, j;
    pair_of((int)(t % pairs), &i, &j);
    const float *zi = z_row(x, emb, b, F, D, i), *zj = z_row(x, emb, b, F, D, j);
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += zi[d] * zj[d];
    out[b * O + D + t % pairs] = s;
  }
}

__global__ void dot_backward_global_k(float *dx, float *demb, const float *dout, const float *x, const float *emb,
                                      int B, int F, int D) {
  const int pairs = F * (F + 1) / 2;
  const size_t O = (size_t)D + pairs;
  GRID_STRIDE(t, (size_t)B * (F + 1) * D) {
    const size_t b = t / ((size_t)(F + 1) * D);
    const int i = (int)(t / D % (F + 1)), d = (int)(t % D);
    const float *g = dout + b * O + D;
    float acc = 0.0f;
    for (int k = 0; k <= F; k++)
      if (k != i) acc += pair_grad(g, i, k) * z_row(x, emb, b, F, D, k)[d];
    if (i == 0) dx[b * D + d] = dout[b * O + d] + acc;
    else demb[(b * F + i - 1) * D + d] = acc;
  }
}

// ---- FM, wide ----

// A block a sample: per d the sums over f in order (fp32), then the sum over
// d in double by a fixed tree.
__global__ void fm_forward_k(float *out, const float *emb, int F, int D) {
  __shared__ double part[kThreads];
  const int b = blockIdx.x;
  const float *e = emb + (size_t)b * F * D;
  double acc = 0.0;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f, q = 0.0f;
    for (int f = 0; f < F; f++) {
      const float v = e[(size_t)f * D + d];
      s += v;
      q += v * v;
    }
    acc += (double)s * s - q;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if ((int)threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[b] = (float)(0.5 * part[0]);
}

__global__ void fm_backward_k(float *demb, const float *dout, const float *emb, int F, int D) {
  const int b = blockIdx.x;
  const float *e = emb + (size_t)b * F * D;
  float *de = demb + (size_t)b * F * D;
  const float g = dout[b];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.0f;
    for (int f = 0; f < F; f++) s += e[(size_t)f * D + d];
    for (int f = 0; f < F; f++) de[(size_t)f * D + d] = g * (s - e[(size_t)f * D + d]);
  }
}

__global__ void wide_forward_k(float *out, const float *w, const float *bias, int B, int F) {
  GRID_STRIDE(b, (size_t)B) {
    const float *row = w + b * F;
    float acc = 0.0f;
    for (int f = 0; f < F; f++) acc = __fadd_rn(acc, row[f]);
    out[b] = __fadd_rn(acc, bias ? *bias : 0.0f);
  }
}

__global__ void wide_backward_k(float *dw, const float *dout, int B, int F) {
  GRID_STRIDE(i, (size_t)B * F) dw[i] = dout[i / F];
}

} // namespace

extern "C" {

// Shared memory dot_backward_shared_k needs (bytes), or 0 when it exceeds
// the default 48 KiB a block: the global-memory kernel takes those shapes.
static size_t dot_shared(int F, int D) {
  const size_t bytes = ((size_t)(F + 1) * (D + 1) + (size_t)F * (F + 1) / 2) * sizeof(float);
  return bytes <= 48 * 1024 ? bytes : 0;
}

cudaError_t cuk_dot_forward(cudaStream_t st, float *out, const float *x, const float *emb, int B, int F, int D) {
  const int NT = (F + kDotTile) / kDotTile; /* tiles a side for N = F + 1 rows */
  const size_t zb = (size_t)NT * kDotTile * (D + 1) * sizeof(float);
  if (zb <= 48 * 1024) {
    dot_forward_tiled_k<<<(unsigned)B, 128, zb, st>>>(out, x, emb, F, D);
    return cudaGetLastError();
  }
  const size_t O = (size_t)D + (size_t)F * (F + 1) / 2;
  cudaError_t e = cuk_copy_rows(st, out, O, x, D, B, D);
  if (e != cudaSuccess) return e;
  return LAUNCH(dot_forward_global_k, (size_t)B * F * (F + 1) / 2, st, out, x, emb, B, F, D);
}

cudaError_t cuk_dot_backward(cudaStream_t st, float *dx, float *demb, const float *dout, const float *x,
                             const float *emb, int B, int F, int D) {
  const unsigned threads = D < 128 ? (unsigned)(D + 31) / 32 * 32 : 128;
  const size_t zb = (size_t)(F + 1) * D * sizeof(float);
#define ROWS(NP)                                                                                                    \
  if (F + 1 <= NP && zb + NP * NP * sizeof(float) <= 48 * 1024) {                                                   \
    dot_backward_rows_k<NP><<<(unsigned)B, threads, zb, st>>>(dx, demb, dout, x, emb, F, D);                        \
    return cudaGetLastError();                                                                                      \
  }
  ROWS(8)
  ROWS(16)
  ROWS(32)
  ROWS(64)
#undef ROWS
  const size_t sh = dot_shared(F, D);
  if (sh) {
    dot_backward_shared_k<<<B, 128, sh, st>>>(dx, demb, dout, x, emb, F, D);
    return cudaGetLastError();
  }
  return LAUNCH(dot_backward_global_k, (size_t)B * (F + 1) * D, st, dx, demb, dout, x, emb, B, F, D);
}

cudaError_t cuk_fm_forward(cudaStream_t st, float *out, const float *emb, int B, int F, int D) {
  fm_forward_k<<<B, kThreads, 0, st>>>(out, emb, F, D);
  return cudaGetLastError();
}

cudaError_t cuk_fm_backward(cudaStream_t st, float *demb, const float *dout, const float *emb, int B, int F, int D) {
  fm_backward_k<<<B, 128, 0, st>>>(demb, dout, emb, F, D);
  return cudaGetLastError();
}

cudaError_t cuk_wide_forward(cudaStream_t st, float *out, const float *w, const float *bias, int B, int F) {
  return LAUNCH(wide_forward_k, (size_t)B, st, out, w, bias, B, F);
}

cudaError_t cuk_wide_backward(cudaStream_t st, float *dw, const float *dout, int B, int F) {
  return LAUNCH(wide_backward_k, (size_t)B * F, st, dw, dout, B, F);
}

} // extern "C"
