// The CUDA backend's kernels (declared in cuda_kernels.h, called by cuda.c's
// ops). They came from dev/cuda/, where each was checked bit for bit or
// within its stated bound against a CPU reference and timed on an H100; the
// op-by-op test (tests/test_backend.c) checks them here against the same
// double references as the CPU backend's.
//
// Products and sums that the CPU rounds one by one use the _rn intrinsics
// where the result is compared bit for bit (dropout's masks, the copies);
// elsewhere the compiler may contract into FMA, which the op tests' bounds
// allow. Reductions are fixed trees or in-order loops: two runs give the
// same bits.
#include "backend/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/cub.cuh>

#include "core/hash.h"
#include "backend/dtype.h"

namespace {

constexpr int kThreads = 256;

// Blocks for n threads' worth of work, capped: the kernels stride over the rest.
unsigned blocks_for(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return (unsigned)(b < 1 ? 1 : b > (1u << 20) ? (1u << 20) : b);
}

#define GRID_STRIDE(i, n)                                                                                             \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ---- moving rows, elementwise ----

__global__ void copy_rows_k(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t width) {
  GRID_STRIDE(i, rows * width) {
    const size_t r = i / width, c = i % width;
    dst[r * dst_ld + c] = src[r * src_ld + c];
  }
}

__global__ void fill_rows_k(float *dst, size_t dst_ld, size_t rows, size_t width, float value) {
  GRID_STRIDE(i, rows * width) dst[(i / width) * dst_ld + i % width] = value;
}

__global__ void gather_rows_k(float *dst, const float *src, const uint32_t *idx, size_t n, size_t width) {
  GRID_STRIDE(i, n * width) dst[i] = src[(size_t)idx[i / width] * width + i % width];
}

__global__ void scatter_add_rows_k(float *dst, const uint32_t *idx, const float *src, size_t n, size_t width) {
  GRID_STRIDE(i, n * width) {
    float *d = dst + (size_t)idx[i / width] * width + i % width;
    *d = __fadd_rn(*d, src[i]); /* the idx are distinct: no other thread writes d */
  }
}

__global__ void add_k(float *y, const float *x, size_t n) {
  GRID_STRIDE(i, n) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void scale_k(float *x, size_t n, float s) {
  GRID_STRIDE(i, n) x[i] = __fmul_rn(x[i], s);
}

__global__ void sum_columns_k(float *dst, const float *src, size_t B, size_t C) {
  GRID_STRIDE(c, C) {
    double acc = 0;
    for (size_t b = 0; b < B; b++) acc += src[b * C + c];
    dst[c] = __fadd_rn(dst[c], (float)acc);
  }
}

__global__ void any_nonfinite_k(int *flag, const float *x, size_t n) {
  int bad = 0;
  GRID_STRIDE(i, n) bad |= !isfinite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

__global__ void relu_forward_k(float *out, const float *in, size_t n) {
  GRID_STRIDE(i, n) out[i] = in[i] > 0.0f ? in[i] : 0.0f;
}

__global__ void relu_backward_k(float *din, const float *dout, const float *out, size_t n) {
  GRID_STRIDE(i, n) din[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

// The same, 4 values a thread (n a multiple of 4, the arrays 16-byte aligned).
__global__ void relu_backward4_k(float4 *din, const float4 *dout, const float4 *out, size_t n4) {
  GRID_STRIDE(i, n4) {
    const float4 o = out[i], g = dout[i];
    din[i] = make_float4(o.x > 0.0f ? g.x : 0.0f, o.y > 0.0f ? g.y : 0.0f, o.z > 0.0f ? g.z : 0.0f,
                         o.w > 0.0f ? g.w : 0.0f);
  }
}

// σ(z) from exp(-|z|), as src/nn/activation.c: no overflow for any finite z.
__device__ inline float sigmoid(float z) {
  const float e = expf(-fabsf(z)), s = 1.0f / (1.0f + e);
  return z >= 0.0f ? s : e * s;
}

__global__ void sigmoid_k(float *out, const float *in, size_t n) {
  GRID_STRIDE(i, n) out[i] = sigmoid(in[i]);
}

// A float as a 16-bit GEMM operand's bits: bf16 or (FP16) IEEE half,
// rounded to nearest even.
template <bool FP16>
__device__ inline uint16_t half_bits(float x) {
  if (FP16) return __half_as_ushort(__float2half_rn(x));
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <bool FP16>
__global__ void to_half_k(uint16_t *dst, const float *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = half_bits<FP16>(src[i]);
}

// The same, 4 values a thread (n a multiple of 4, src 16-byte and dst
// 8-byte aligned).
template <bool FP16>
__global__ void to_half4_k(uint2 *dst, const float4 *src, size_t n4) {
  GRID_STRIDE(i, n4) {
    const float4 v = src[i];
    dst[i] = make_uint2((uint32_t)half_bits<FP16>(v.x) | (uint32_t)half_bits<FP16>(v.y) << 16,
                        (uint32_t)half_bits<FP16>(v.z) | (uint32_t)half_bits<FP16>(v.w) << 16);
  }
}

template <bool FP16>
__global__ void to_half_rows_k(uint16_t *dst, size_t dst_ld, const float *src, size_t rows, size_t width) {
  GRID_STRIDE(i, rows * dst_ld) {
    const size_t r = i / dst_ld, c = i - r * dst_ld;
    dst[i] = c < width ? half_bits<FP16>(src[r * width + c]) : 0;
  }
}

// partial[k][c] = sum of rows [k * CHUNK, ...) of column c, in row order.
__global__ void colsum_chunks_k(float *partial, const float *src, size_t B, size_t C) {
  const size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  const size_t b1 = (k + 1) * CUK_COLSUM_CHUNK < B ? (k + 1) * CUK_COLSUM_CHUNK : B;
  float acc = 0.0f;
  for (size_t b = k * CUK_COLSUM_CHUNK; b < b1; b++) acc = __fadd_rn(acc, src[b * C + c]);
  partial[k * C + c] = acc;
}

// colsum_chunks_k's partial sums of d = dout where mask > 0 (else 0, as
// relu_backward_k), with d written as a 16-bit operand (as to_half_k);
// partial NULL: no sums.
template <bool FP16>
__global__ void relu_half_chunks_k(uint16_t *dst, float *partial, const float *dout, const float *mask, size_t B,
                                   size_t C) {
  const size_t c = (size_t)blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  const size_t b1 = (k + 1) * CUK_COLSUM_CHUNK < B ? (k + 1) * CUK_COLSUM_CHUNK : B;
  float acc = 0.0f;
  for (size_t b = k * CUK_COLSUM_CHUNK; b < b1; b++) {
    const float d = mask[b * C + c] > 0.0f ? dout[b * C + c] : 0.0f;
    dst[b * C + c] = half_bits<FP16>(d);
    acc = __fadd_rn(acc, d);
  }
  if (partial) partial[k * C + c] = acc;
}

__global__ void colsum_finish_k(float *dst, const float *partial, size_t chunks, size_t C) {
  GRID_STRIDE(c, C) {
    float acc = 0.0f;
    for (size_t k = 0; k < chunks; k++) acc = __fadd_rn(acc, partial[k * C + c]);
    dst[c] = __fadd_rn(dst[c], acc);
  }
}

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

// ---- cross layers, dropout ----

__global__ void cross_gate_k(float *out, const float *x0, const float *u, const float *xl, size_t n) {
  GRID_STRIDE(i, n) out[i] = __fadd_rn(__fmul_rn(x0[i], u[i]), xl[i]);
}

__global__ void cross_gate_backward_k(float *du, float *dx0, const float *dout, const float *x0, const float *u,
                                      size_t n) {
  GRID_STRIDE(i, n) {
    du[i] = __fmul_rn(dout[i], x0[i]);
    dx0[i] = __fadd_rn(dx0[i], __fmul_rn(dout[i], u[i]));
  }
}

// src/nn/dropout.c's draw: element i is kept when the top 32 bits of
// mix64(key + (i + 1) * golden) reach the threshold.
__global__ void dropout_k(float *y, const float *x, size_t n, uint64_t key, uint32_t threshold, float scale) {
  const uint64_t golden = 0x9e3779b97f4a7c15ULL;
  GRID_STRIDE(i, n) {
    const int kept = (uint32_t)(dlrec_mix64(key + (uint64_t)(i + 1) * golden) >> 32) >= threshold;
    y[i] = kept ? __fmul_rn(x[i], scale) : 0.0f;
  }
}

// ---- the mixture of experts' per-row parts ----

__global__ void softmax_rows_k(float *p, int B, int K) {
  GRID_STRIDE(b, (size_t)B) {
    float *row = p + b * K;
    float mx = row[0];
    for (int k = 1; k < K; k++) mx = row[k] > mx ? row[k] : mx;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum = __fadd_rn(sum, row[k] = expf(__fsub_rn(row[k], mx)));
    for (int k = 0; k < K; k++) row[k] = __fdiv_rn(row[k], sum);
  }
}

__global__ void mixture_k(float *m, const float *p, const float *e, int B, int d, int K) {
  GRID_STRIDE(i, (size_t)B * d) {
    const size_t b = i / d;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) acc = __fadd_rn(acc, __fmul_rn(p[b * K + k], e[(size_t)k * B * d + i]));
    m[i] = acc;
  }
}

__global__ void mixture_add_k(float *out, const float *p, const float *e, int B, int d, int K, int k) {
  GRID_STRIDE(i, (size_t)B * d) out[i] = __fadd_rn(out[i], __fmul_rn(p[i / d * K + k], e[i]));
}

__global__ void mix_dx0_k(float *dx0, float *m, const float *dout, const float *x0, size_t n) {
  GRID_STRIDE(i, n) {
    dx0[i] = __fadd_rn(dx0[i], __fmul_rn(dout[i], m[i]));
    m[i] = __fmul_rn(dout[i], x0[i]);
  }
}

// A thread a row: dp_k in double over d in order, as the CPU's loop.
__global__ void mix_dlogit_k(float *dlogit, const float *dm, const float *e, const float *p, int B, int d, int K) {
  GRID_STRIDE(b, (size_t)B) {
    float *dl = dlogit + b * K;
    const float *pr = p + b * K, *g = dm + b * d;
    double s = 0.0;
    for (int k = 0; k < K; k++) {
      const float *ek = e + ((size_t)k * B + b) * d;
      double dp = 0.0;
      for (int j = 0; j < d; j++) dp += (double)g[j] * ek[j];
      dl[k] = (float)dp;
      s += pr[k] * dp;
    }
    for (int k = 0; k < K; k++) dl[k] = (float)(pr[k] * (dl[k] - s));
  }
}

__global__ void mix_scale_k(float *de, const float *dm, const float *p, int B, int d, int K, int k) {
  GRID_STRIDE(i, (size_t)B * d) de[i] = __fmul_rn(p[i / d * K + k], dm[i]);
}

// ---- the packed (scoring) layer: a thread per (row, output), k in order ----

__global__ void packed_forward_k(float *out, const float *wt, const float *bias, const float *in, int B, int IN,
                                 int OUT, int relu) {
  GRID_STRIDE(i, (size_t)B * OUT) {
    const size_t b = i / OUT, o = i % OUT;
    const float *x = in + b * IN;
    float acc = bias ? bias[o] : 0.0f;
    for (int k = 0; k < IN; k++) acc = __fmaf_rn(x[k], wt[(size_t)k * OUT + o], acc);
    out[i] = relu ? (acc > 0.0f ? acc : 0.0f) : acc;
  }
}

// ---- embedding bags ----

__device__ inline float row_elem(const cuk_rows &t, size_t i) {
  if (t.dtype == 0) return static_cast<const float *>(t.data)[i];
  const uint16_t h = static_cast<const uint16_t *>(t.data)[i];
  return t.dtype == 1 ? dtype_bf16_to_f32(h) : dtype_fp16_to_f32(h);
}

// A thread per (bag, d), bag = b F + c: the bag's rows in id order, as the
// CPU's pooling adds them; mean multiplies the sum by 1 / the bag's size.
__global__ void bag_forward_k(float *out, cuk_rows t, cuk_bags bg) {
  GRID_STRIDE(i, (size_t)bg.B * bg.F * t.D) {
    const size_t g = i / t.D;
    const uint32_t d = (uint32_t)(i % t.D), b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    const uint32_t lo = off[b], hi = off[b + 1], *ids = bg.ids + bg.idbase[c];
    float s = 0.0f;
    for (uint32_t k = lo; k < hi; k++) s = __fadd_rn(s, row_elem(t, (size_t)ids[k - off[0]] * t.stride + d));
    if (bg.mean[c] && hi > lo) s = __fmul_rn(s, __fdiv_rn(1.0f, (float)(hi - lo)));
    out[i] = s;
  }
}

// The same, 4 elements of a row at a time (one 16-byte load of fp32, one
// 8-byte load of bf16 or fp16): a thread per (bag, 4 d's). D and the stride
// are multiples of 4, the rows and out aligned to 16 bytes.
template <int DTYPE>
__device__ inline void row_elems4(float *v, const cuk_rows &t, size_t i) {
  if (DTYPE == 0) {
    const float4 x = *reinterpret_cast<const float4 *>(static_cast<const float *>(t.data) + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    return;
  }
  const uint2 h = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(t.data) + i);
  const uint16_t e[4] = {(uint16_t)(h.x & 0xffff), (uint16_t)(h.x >> 16), (uint16_t)(h.y & 0xffff),
                         (uint16_t)(h.y >> 16)};
  for (int j = 0; j < 4; j++) v[j] = DTYPE == 1 ? dtype_bf16_to_f32(e[j]) : dtype_fp16_to_f32(e[j]);
}

template <int DTYPE>
__global__ void bag_forward4_k(float *out, cuk_rows t, cuk_bags bg) {
  const uint32_t Q = t.D / 4;
  GRID_STRIDE(i, (size_t)bg.B * bg.F * Q) {
    const size_t g = i / Q;
    const uint32_t d = (uint32_t)(i % Q) * 4, b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    const uint32_t lo = off[b], hi = off[b + 1], *ids = bg.ids + bg.idbase[c];
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
    for (uint32_t k = lo; k < hi; k++) {
      row_elems4<DTYPE>(v, t, (size_t)ids[k - off[0]] * t.stride + d);
      for (int j = 0; j < 4; j++) s[j] = __fadd_rn(s[j], v[j]);
    }
    if (bg.mean[c] && hi > lo) {
      const float inv = __fdiv_rn(1.0f, (float)(hi - lo));
      for (int j = 0; j < 4; j++) s[j] = __fmul_rn(s[j], inv);
    }
    *reinterpret_cast<float4 *>(out + g * t.D + d) = make_float4(s[0], s[1], s[2], s[3]);
  }
}

// ---- the fused sparse update (dev/cuda/sparse_update.cu's, on the CPU
// op's item order: column, sample, position) ----

// A run of more than kShortRun items is summed in segments of seg_len(n).
constexpr uint32_t kShortRun = 64;

__device__ inline uint32_t seg_len(uint32_t n) {
  uint32_t L = (uint32_t)sqrtf((float)n);
  while (L * L < n) L++;
  while (L > 1 && (L - 1) * (L - 1) >= n) L--;
  return L < 32 ? 32 : L;
}

// vals[item] = the item's bag, for every item of bag g = b F + c.
__global__ void item_bags_k(uint32_t *vals, cuk_bags bg) {
  GRID_STRIDE(g, (size_t)bg.B * bg.F) {
    const uint32_t b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    for (uint32_t k = off[b]; k < off[b + 1]; k++) vals[bg.idbase[c] + (k - off[0])] = (uint32_t)g;
  }
}

struct Runs {
  const uint32_t *rows_u, *count, *start, *n_unique, *nseg, *seg_start, *seg_row, *sorted_vals;
  const float *dout;
  float *partial;
  cuk_bags bg;
  uint32_t D;
};

// An item's gradient at the lane's d (lane, lane + 32, ...): its bag's
// d_out row, times 1 / the bag's size where the column pools by its mean.
template <int PER_LANE>
__device__ inline void item_grad(float *v, uint32_t i, int lane, const Runs &R) {
  const uint32_t bag = R.sorted_vals[i], c = bag % R.bg.F, s = bag / R.bg.F;
  const float *go = R.dout + (size_t)bag * R.D;
  const uint32_t *off = R.bg.offs + (size_t)c * (R.bg.B + 1);
  const float inv = R.bg.mean[c] ? __fdiv_rn(1.0f, (float)(off[s + 1] - off[s])) : 1.0f;
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    v[j] = d < R.D ? (R.bg.mean[c] ? __fmul_rn(inv, go[d]) : go[d]) : 0.0f;
  }
}

// g (lane's d) += the items [a, b) in order, four items' loads in flight.
template <int PER_LANE>
__device__ inline void sum_items(float *g, uint32_t a, uint32_t b, int lane, const Runs &R) {
  uint32_t i = a;
  for (; i + 4 <= b; i += 4) {
    float v[4][PER_LANE];
#pragma unroll
    for (int u = 0; u < 4; u++) item_grad<PER_LANE>(v[u], i + u, lane, R);
#pragma unroll
    for (int u = 0; u < 4; u++)
      for (int j = 0; j < PER_LANE; j++)
        if (lane + 32 * j < R.D) g[j] = __fadd_rn(g[j], v[u][j]);
  }
  for (; i < b; i++) {
    float v[PER_LANE];
    item_grad<PER_LANE>(v, i, lane, R);
    for (int j = 0; j < PER_LANE; j++)
      if (lane + 32 * j < R.D) g[j] = __fadd_rn(g[j], v[j]);
  }
}

__global__ void seg_plan_k(uint32_t *nseg, const uint32_t *count, const uint32_t *n_unique, uint32_t n) {
  GRID_STRIDE(u, (size_t)n) {
    const uint32_t k = u < *n_unique ? count[u] : 0;
    nseg[u] = k > kShortRun ? (k + seg_len(k) - 1) / seg_len(k) : 0;
  }
}

__global__ void seg_rows_k(uint32_t *seg_row, const uint32_t *nseg, const uint32_t *seg_start,
                           const uint32_t *n_unique, uint32_t n) {
  GRID_STRIDE(u, (size_t)n) {
    if (u >= *n_unique) break;
    for (uint32_t k = 0; k < nseg[u]; k++) seg_row[seg_start[u] + k] = (uint32_t)u;
  }
}

template <int PER_LANE>
__global__ void seg_sum_k(Runs R, uint32_t seg_cap) {
  const uint32_t s = (uint32_t)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (s >= seg_cap) return;
  const uint32_t u = R.seg_row[s];
  if (u == 0xffffffffu) return;
  const uint32_t n = R.count[u], L = seg_len(n), a = R.start[u] + (s - R.seg_start[u]) * L;
  const uint32_t b = a + L < R.start[u] + n ? a + L : R.start[u] + n;
  float g[PER_LANE];
  for (int j = 0; j < PER_LANE; j++) g[j] = 0.0f;
  sum_items<PER_LANE>(g, a, b, lane, R);
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    if (d < R.D) R.partial[(size_t)s * R.D + d] = g[j];
  }
}

// A warp per unique row: its gradient, then src/embed/sparse_optim.c's
// update with each product and sum rounded as the CPU's (Adagrad's sum of
// squares by lanes, then a butterfly), a 16-bit row widened, updated in
// fp32 and stored with the CPU's stochastic rounding.
template <int PER_LANE>
__global__ void reduce_update_k(cuk_rows t, Runs R, cuk_sparse_opt o) {
  const uint32_t u = (uint32_t)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (u >= *R.n_unique) return;
  const uint32_t r = R.rows_u[u], n = R.count[u], D = R.D;
  float g[PER_LANE], w[PER_LANE];
  const size_t row = (size_t)r * t.stride;
  for (int j = 0; j < PER_LANE; j++) { /* the row's loads first: they overlap the gradient's */
    const uint32_t d = lane + 32 * j;
    w[j] = d < D ? row_elem(t, row + d) : 0.0f;
    g[j] = 0.0f;
  }
  if (n <= kShortRun) {
    sum_items<PER_LANE>(g, R.start[u], R.start[u] + n, lane, R);
  } else {
    for (uint32_t k = 0; k < R.nseg[u]; k++) {
      const float *p = R.partial + (size_t)(R.seg_start[u] + k) * D;
      for (int j = 0; j < PER_LANE; j++) {
        const uint32_t d = lane + 32 * j;
        if (d < D) g[j] = __fadd_rn(g[j], p[d]);
      }
    }
  }
  if (o.kind == 0) {
    for (int j = 0; j < PER_LANE; j++) w[j] = __fsub_rn(w[j], __fmul_rn(o.lr, __fadd_rn(g[j], __fmul_rn(o.wd, w[j]))));
  } else if (o.kind == 1) {
    float sq = 0.0f;
    for (int j = 0; j < PER_LANE; j++) {
      g[j] = lane + 32 * j < D ? __fadd_rn(g[j], __fmul_rn(o.wd, w[j])) : 0.0f; /* gw */
      sq = __fadd_rn(sq, __fmul_rn(g[j], g[j]));
    }
    for (int m = 16; m > 0; m /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, m));
    const float acc = __fadd_rn(o.accum[r], __fdiv_rn(sq, (float)D));
    const float step = __fdiv_rn(o.lr, __fadd_rn(__fsqrt_rn(acc), o.eps));
    __syncwarp();
    if (lane == 0) o.accum[r] = acc;
    for (int j = 0; j < PER_LANE; j++) w[j] = __fsub_rn(w[j], __fmul_rn(step, g[j]));
  } else {
    const uint32_t ts = o.steps[r] + 1; /* the row is this warp's alone */
    const double bc1 = -expm1((double)ts * o.log_b1), bc2 = -expm1((double)ts * o.log_b2);
    const float step_size = (float)(o.lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    __syncwarp();
    if (lane == 0) o.steps[r] = ts;
    float *m = o.m + row, *v = o.v + row;
    for (int j = 0; j < PER_LANE; j++) {
      const uint32_t d = lane + 32 * j;
      if (d >= D) continue;
      const float gd = __fadd_rn(g[j], __fmul_rn(o.wd, w[j]));
      m[d] = __fadd_rn(__fmul_rn(o.b1, m[d]), __fmul_rn(__fsub_rn(1.0f, o.b1), gd));
      v[d] = __fadd_rn(__fmul_rn(o.b2, v[d]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, o.b2), gd), gd));
      const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v[d]), inv_sqrt_bc2), o.eps);
      w[j] = __fsub_rn(w[j], __fdiv_rn(__fmul_rn(step_size, m[d]), den));
    }
  }
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    if (d >= D) continue;
    if (t.dtype == 0) {
      static_cast<float *>(t.data)[row + d] = w[j];
    } else {
      const uint64_t draws = dtype_sr_draws_keyed(o.sr_key, o.row_keys ? (uint32_t)o.row_keys[r] : r, d / 4);
      const uint32_t draw = (uint32_t)(draws >> (16 * (d % 4))) & 0xffffu;
      static_cast<uint16_t *>(t.data)[row + d] =
          t.dtype == 1 ? dtype_f32_to_bf16_sr(w[j], draw) : dtype_f32_to_fp16_sr(w[j], draw);
    }
  }
}

// The scratch's pieces for n items (cuk_bag_update_scratch sizes them).
struct UpdateScratch {
  uint32_t *vals, *sorted_rows, *sorted_vals, *rows_u, *count, *start, *n_unique, *nseg, *seg_start, *seg_row;
  float *partial;
  void *tmp;
  size_t tmp_bytes;
  uint32_t seg_cap;
  int key_bits;
};

size_t carve_update(UpdateScratch *u, char *base, uint32_t n, uint32_t D, uint64_t rows) {
  u->key_bits = 1;
  while (u->key_bits < 32 && ((rows - 1) >> u->key_bits)) u->key_bits++;
  u->seg_cap = (uint32_t)(3 * (uint64_t)n / 64 + 1);
  size_t a = 0, b = 0, c = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, a, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                                  (const uint32_t *)nullptr, (uint32_t *)nullptr, (int)n, 0, u->key_bits);
  cub::DeviceRunLengthEncode::Encode(nullptr, b, (const uint32_t *)nullptr, (uint32_t *)nullptr, (uint32_t *)nullptr,
                                     (uint32_t *)nullptr, (int)n);
  cub::DeviceScan::ExclusiveSum(nullptr, c, (const uint32_t *)nullptr, (uint32_t *)nullptr, (int)n);
  u->tmp_bytes = a > b ? (a > c ? a : c) : (b > c ? b : c);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    void *p = base ? base + at : nullptr;
    at += (bytes + 255) / 256 * 256;
    return p;
  };
  uint32_t **lists[] = {&u->vals, &u->sorted_rows, &u->sorted_vals, &u->rows_u, &u->count, &u->start, &u->nseg,
                        &u->seg_start};
  for (uint32_t **l : lists) *l = static_cast<uint32_t *>(take((size_t)n * 4));
  u->n_unique = static_cast<uint32_t *>(take(4));
  u->seg_row = static_cast<uint32_t *>(take((size_t)u->seg_cap * 4));
  u->partial = static_cast<float *>(take((size_t)u->seg_cap * D * 4));
  u->tmp = take(u->tmp_bytes);
  return at;
}

template <int PER_LANE>
cudaError_t launch_bag_update(cudaStream_t st, cuk_rows t, const Runs &R, const UpdateScratch &u, uint32_t n,
                              cuk_sparse_opt o) {
  seg_sum_k<PER_LANE><<<(unsigned)(((uint64_t)u.seg_cap * 32 + 255) / 256), 256, 0, st>>>(R, u.seg_cap);
  reduce_update_k<PER_LANE><<<(unsigned)(((uint64_t)n * 32 + 255) / 256), 256, 0, st>>>(t, R, o);
  return cudaGetLastError();
}

// ---- batch normalization: a thread a column ----

__global__ void bn_stats_k(double *out, const float *in, const double *sum, double N, int B, int C) {
  GRID_STRIDE(c, (size_t)C) {
    double acc = 0;
    if (!sum) {
      for (int b = 0; b < B; b++) acc += in[(size_t)b * C + c];
    } else {
      const double mean = sum[c] / N;
      for (int b = 0; b < B; b++) {
        const double dev = in[(size_t)b * C + c] - mean;
        acc += dev * dev;
      }
    }
    out[c] = acc;
  }
}

__global__ void bn_normalize_k(float *out, float *saved, const float *in, const double *sum, const double *sqdev,
                               double N, const float *gamma, const float *beta, float *running_mean,
                               float *running_var, float momentum, float eps, int B, int C) {
  GRID_STRIDE(c, (size_t)C) {
    const double mean = sum[c] / N, v = sqdev[c] / N;
    const float m = (float)mean, inv = (float)(1.0 / sqrt(v + eps));
    saved[c] = m;
    saved[C + c] = inv;
    if (running_mean) {
      running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = (float)((1.0 - momentum) * running_var[c] + momentum * (sqdev[c] / (N - 1)));
    }
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      out[i] = gamma[c] * ((in[i] - m) * inv) + beta[c];
    }
  }
}

__global__ void bn_backward_stats_k(double *sg, double *sgx, const float *dout, const float *in, const float *saved,
                                    int B, int C) {
  GRID_STRIDE(c, (size_t)C) {
    const float mean = saved[c], invstd = saved[C + c];
    double a = 0, ax = 0;
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      const float xhat = (in[i] - mean) * invstd;
      a += dout[i];
      ax += (double)dout[i] * xhat;
    }
    sg[c] = a;
    sgx[c] = ax;
  }
}

__global__ void bn_backward_apply_k(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                                    const float *gamma, const float *saved, const double *sg_way,
                                    const double *sgx_way, const double *sg, const double *sgx, double N, int B,
                                    int C) {
  GRID_STRIDE(c, (size_t)C) {
    const float mean = saved[c], invstd = saved[C + c];
    dbeta[c] += (float)sg_way[c];
    dgamma[c] += (float)sgx_way[c];
    const float s = gamma[c] * invstd, a = (float)(s * sg[c] / N), k = (float)(s * sgx[c] / N);
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      const float xhat = (in[i] - mean) * invstd;
      din[i] = s * dout[i] - a - k * xhat;
    }
  }
}

__global__ void bn_infer_k(float *out, const float *in, const float *gamma, const float *beta,
                           const float *running_mean, const float *running_var, float eps, int B, int C) {
  GRID_STRIDE(i, (size_t)B * C) {
    const size_t c = i % C;
    const float inv = 1.0f / sqrtf(running_var[c] + eps);
    out[i] = gamma[c] * ((in[i] - running_mean[c]) * inv) + beta[c];
  }
}

__global__ void bn_infer_backward_k(float *din, float *dgamma, float *dbeta, const float *dout, const float *in,
                                    const float *gamma, const float *running_mean, const float *running_var,
                                    float eps, int B, int C) {
  GRID_STRIDE(c, (size_t)C) {
    const float inv = 1.0f / sqrtf(running_var[c] + eps);
    float db = dbeta[c], dg = dgamma[c];
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      const float d = dout[i], xhat = (in[i] - running_mean[c]) * inv;
      db += d;
      dg += d * xhat;
      din[i] = d * (gamma[c] * inv);
    }
    dbeta[c] = db;
    dgamma[c] = dg;
  }
}

// ---- loss, optimizers ----

__global__ void bce_terms_k(double *terms, const float *logits, const float *labels, int B) {
  GRID_STRIDE(b, (size_t)B) {
    const double z = logits[b], y = labels[b];
    terms[b] = fmax(z, 0.0) - z * y + log1p(exp(-fabs(z)));
  }
}

// One block: each thread sums a strided share in order, then a fixed tree.
__global__ void bce_sum_k(double *loss, const double *terms, int B) {
  __shared__ double part[1024];
  double acc = 0;
  for (int b = threadIdx.x; b < B; b += blockDim.x) acc += terms[b];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if ((int)threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss = part[0] / B;
}

__global__ void bce_backward_k(float *dlogits, const float *logits, const float *labels, int B, float inv_b) {
  GRID_STRIDE(b, (size_t)B) dlogits[b] = (sigmoid(logits[b]) - labels[b]) * inv_b;
}

__global__ void sgd_k(float *w, const float *grad, size_t n, float lr, float wd) {
  GRID_STRIDE(i, n) w[i] -= lr * (grad[i] + wd * w[i]);
}

__global__ void adam_k(float *w, const float *grad, float *m, float *v, size_t n, float wd, float b1, float b2,
                       float eps, float step_size, float inv_sqrt_bc2) {
  GRID_STRIDE(i, n) {
    const float g = grad[i] + wd * w[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    w[i] -= step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
  }
}

__global__ void adagrad_k(float *w, const float *grad, float *s, size_t n, float lr, float wd, float eps) {
  GRID_STRIDE(i, n) {
    const float g = grad[i] + wd * w[i];
    s[i] += g * g;
    w[i] -= lr * g / (sqrtf(s[i]) + eps);
  }
}

} // namespace

// ---- launchers ----

#define LAUNCH(kernel, n, st, ...) (kernel<<<blocks_for(n), kThreads, 0, (st)>>>(__VA_ARGS__), cudaGetLastError())

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

template <bool FP16>
static cudaError_t to_half(cudaStream_t st, uint16_t *dst, size_t dst_ld, const float *src, size_t rows,
                           size_t width) {
  const size_t n = rows * width;
  if (dst_ld == width && n % 4 == 0 && aligned16(src) && (uintptr_t)dst % 8 == 0)
    return LAUNCH(to_half4_k<FP16>, n / 4, st, (uint2 *)dst, (const float4 *)src, n / 4);
  if (dst_ld == width) return LAUNCH(to_half_k<FP16>, n, st, dst, src, n);
  return LAUNCH(to_half_rows_k<FP16>, rows * dst_ld, st, dst, dst_ld, src, rows, width);
}

extern "C" {

cudaError_t cuk_copy_rows(cudaStream_t st, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows,
                          size_t width) {
  if (dst_ld == width && src_ld == width)
    return cudaMemcpyAsync(dst, src, rows * width * sizeof(float), cudaMemcpyDeviceToDevice, st);
  return LAUNCH(copy_rows_k, rows * width, st, dst, dst_ld, src, src_ld, rows, width);
}

cudaError_t cuk_fill_rows(cudaStream_t st, float *dst, size_t dst_ld, size_t rows, size_t width, float value) {
  return LAUNCH(fill_rows_k, rows * width, st, dst, dst_ld, rows, width, value);
}

cudaError_t cuk_add(cudaStream_t st, float *y, const float *x, size_t n) { return LAUNCH(add_k, n, st, y, x, n); }

cudaError_t cuk_gather_rows(cudaStream_t st, float *dst, const float *src, const uint32_t *idx, size_t n,
                            size_t width) {
  return LAUNCH(gather_rows_k, n * width, st, dst, src, idx, n, width);
}

cudaError_t cuk_scatter_add_rows(cudaStream_t st, float *dst, const uint32_t *idx, const float *src, size_t n,
                                 size_t width) {
  return LAUNCH(scatter_add_rows_k, n * width, st, dst, idx, src, n, width);
}

cudaError_t cuk_scale(cudaStream_t st, float *x, size_t n, float s) { return LAUNCH(scale_k, n, st, x, n, s); }

cudaError_t cuk_any_nonfinite(cudaStream_t st, int *flag, const float *x, size_t n) {
  return LAUNCH(any_nonfinite_k, n, st, flag, x, n);
}

cudaError_t cuk_sum_columns(cudaStream_t st, float *dst, const float *src, size_t B, size_t C) {
  return LAUNCH(sum_columns_k, C, st, dst, src, B, C);
}

cudaError_t cuk_relu_forward(cudaStream_t st, float *out, const float *in, size_t n) {
  return LAUNCH(relu_forward_k, n, st, out, in, n);
}

cudaError_t cuk_relu_backward(cudaStream_t st, float *din, const float *dout, const float *out, size_t n) {
  if (n % 4 == 0 && aligned16(din) && aligned16(dout) && aligned16(out))
    return LAUNCH(relu_backward4_k, n / 4, st, (float4 *)din, (const float4 *)dout, (const float4 *)out, n / 4);
  return LAUNCH(relu_backward_k, n, st, din, dout, out, n);
}

cudaError_t cuk_sigmoid(cudaStream_t st, float *out, const float *in, size_t n) {
  return LAUNCH(sigmoid_k, n, st, out, in, n);
}

cudaError_t cuk_to_half(cudaStream_t st, uint16_t *dst, size_t dst_ld, const float *src, size_t rows, size_t width,
                        int fp16) {
  return fp16 ? to_half<true>(st, dst, dst_ld, src, rows, width) : to_half<false>(st, dst, dst_ld, src, rows, width);
}

size_t cuk_colsum_partials(size_t B, size_t C) { return (B + CUK_COLSUM_CHUNK - 1) / CUK_COLSUM_CHUNK * C; }

cudaError_t cuk_colsum_finish(cudaStream_t st, float *dst, const float *partial, size_t B, size_t C) {
  const size_t chunks = (B + CUK_COLSUM_CHUNK - 1) / CUK_COLSUM_CHUNK;
  return LAUNCH(colsum_finish_k, C, st, dst, partial, chunks, C);
}

cudaError_t cuk_colsum_accumulate(cudaStream_t st, float *dst, const float *src, size_t B, size_t C, float *partial) {
  const size_t chunks = (B + CUK_COLSUM_CHUNK - 1) / CUK_COLSUM_CHUNK;
  if (chunks > 65535) return cudaErrorInvalidValue; /* the grid's y; B < 16.7M rows */
  const dim3 grid((unsigned)((C + kThreads - 1) / kThreads), (unsigned)chunks);
  colsum_chunks_k<<<grid, kThreads, 0, st>>>(partial, src, B, C);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return cuk_colsum_finish(st, dst, partial, B, C);
}

cudaError_t cuk_relu_to_half_chunks(cudaStream_t st, uint16_t *dst, float *partial, const float *dout,
                                    const float *mask, size_t B, size_t C, int fp16) {
  const size_t chunks = (B + CUK_COLSUM_CHUNK - 1) / CUK_COLSUM_CHUNK;
  if (chunks > 65535) return cudaErrorInvalidValue; /* the grid's y, as cuk_colsum_accumulate */
  const dim3 grid((unsigned)((C + kThreads - 1) / kThreads), (unsigned)chunks);
  if (fp16) relu_half_chunks_k<true><<<grid, kThreads, 0, st>>>(dst, partial, dout, mask, B, C);
  else relu_half_chunks_k<false><<<grid, kThreads, 0, st>>>(dst, partial, dout, mask, B, C);
  return cudaGetLastError();
}

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

cudaError_t cuk_cross_gate(cudaStream_t st, float *out, const float *x0, const float *u, const float *xl, size_t n) {
  return LAUNCH(cross_gate_k, n, st, out, x0, u, xl, n);
}

cudaError_t cuk_cross_gate_backward(cudaStream_t st, float *du, float *dx0, const float *dout, const float *x0,
                                    const float *u, size_t n) {
  return LAUNCH(cross_gate_backward_k, n, st, du, dx0, dout, x0, u, n);
}

cudaError_t cuk_softmax_rows(cudaStream_t st, float *p, int B, int K) {
  return LAUNCH(softmax_rows_k, (size_t)B, st, p, B, K);
}

cudaError_t cuk_mixture(cudaStream_t st, float *m, const float *p, const float *e, int B, int d, int K) {
  return LAUNCH(mixture_k, (size_t)B * d, st, m, p, e, B, d, K);
}

cudaError_t cuk_mixture_add(cudaStream_t st, float *out, const float *p, const float *e, int B, int d, int K, int k) {
  return LAUNCH(mixture_add_k, (size_t)B * d, st, out, p, e, B, d, K, k);
}

cudaError_t cuk_mix_dx0(cudaStream_t st, float *dx0, float *m, const float *dout, const float *x0, size_t n) {
  return LAUNCH(mix_dx0_k, n, st, dx0, m, dout, x0, n);
}

cudaError_t cuk_mix_dlogit(cudaStream_t st, float *dlogit, const float *dm, const float *e, const float *p, int B,
                           int d, int K) {
  return LAUNCH(mix_dlogit_k, (size_t)B, st, dlogit, dm, e, p, B, d, K);
}

cudaError_t cuk_mix_scale(cudaStream_t st, float *de, const float *dm, const float *p, int B, int d, int K, int k) {
  return LAUNCH(mix_scale_k, (size_t)B * d, st, de, dm, p, B, d, K, k);
}

cudaError_t cuk_packed_forward(cudaStream_t st, float *out, const float *wt, const float *bias, const float *in, int B,
                               int IN, int OUT, int relu) {
  return LAUNCH(packed_forward_k, (size_t)B * OUT, st, out, wt, bias, in, B, IN, OUT, relu);
}

cudaError_t cuk_bag_forward(cudaStream_t st, float *out, cuk_rows t, cuk_bags bags) {
  const size_t esz = t.dtype == 0 ? 4 : 2;
  if (t.D % 4 == 0 && t.stride % 4 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)t.data % (4 * esz) == 0) {
    const size_t n = (size_t)bags.B * bags.F * (t.D / 4);
    if (t.dtype == 0) return LAUNCH(bag_forward4_k<0>, n, st, out, t, bags);
    if (t.dtype == 1) return LAUNCH(bag_forward4_k<1>, n, st, out, t, bags);
    return LAUNCH(bag_forward4_k<2>, n, st, out, t, bags);
  }
  return LAUNCH(bag_forward_k, (size_t)bags.B * bags.F * t.D, st, out, t, bags);
}

size_t cuk_bag_update_scratch(uint32_t n, uint32_t D, uint64_t rows) {
  UpdateScratch u;
  return carve_update(&u, nullptr, n, D, rows);
}

cudaError_t cuk_bag_update(cudaStream_t st, cuk_rows t, cuk_bags bags, uint32_t n, const float *d_out,
                           cuk_sparse_opt o, void *scratch, size_t scratch_bytes) {
  UpdateScratch u;
  if (carve_update(&u, static_cast<char *>(scratch), n, t.D, t.rows) > scratch_bytes) return cudaErrorInvalidValue;
  cudaError_t e = LAUNCH(item_bags_k, (size_t)bags.B * bags.F, st, u.vals, bags);
  size_t bytes = u.tmp_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(u.tmp, bytes, bags.ids, u.sorted_rows, u.vals, u.sorted_vals, (int)n, 0,
                                        u.key_bits, st);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRunLengthEncode::Encode(u.tmp, bytes, u.sorted_rows, u.rows_u, u.count, u.n_unique, (int)n, st);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(u.tmp, bytes, u.count, u.start, (int)n, st);
  if (e == cudaSuccess) e = LAUNCH(seg_plan_k, (size_t)n, st, u.nseg, u.count, u.n_unique, n);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(u.tmp, bytes, u.nseg, u.seg_start, (int)n, st);
  if (e == cudaSuccess) e = cudaMemsetAsync(u.seg_row, 0xff, (size_t)u.seg_cap * 4, st);
  if (e == cudaSuccess) e = LAUNCH(seg_rows_k, (size_t)n, st, u.seg_row, u.nseg, u.seg_start, u.n_unique, n);
  if (e != cudaSuccess) return e;
  const Runs R = {u.rows_u, u.count, u.start, u.n_unique, u.nseg, u.seg_start, u.seg_row, u.sorted_vals,
                  d_out,    u.partial, bags, t.D};
  if (t.D <= 32) return launch_bag_update<1>(st, t, R, u, n, o);
  if (t.D <= 64) return launch_bag_update<2>(st, t, R, u, n, o);
  if (t.D <= 128) return launch_bag_update<4>(st, t, R, u, n, o);
  if (t.D <= 256) return launch_bag_update<8>(st, t, R, u, n, o);
  if (t.D <= 512) return launch_bag_update<16>(st, t, R, u, n, o);
  return launch_bag_update<32>(st, t, R, u, n, o);
}

cudaError_t cuk_dropout(cudaStream_t st, float *y, const float *x, size_t n, uint64_t key, uint32_t threshold,
                        float scale) {
  return LAUNCH(dropout_k, n, st, y, x, n, key, threshold, scale);
}

cudaError_t cuk_bn_stats(cudaStream_t st, double *out, const float *in, const double *sum, double N, int B, int C) {
  return LAUNCH(bn_stats_k, (size_t)C, st, out, in, sum, N, B, C);
}

cudaError_t cuk_bn_normalize(cudaStream_t st, float *out, float *saved, const float *in, const double *sum,
                             const double *sqdev, double N, const float *gamma, const float *beta,
                             float *running_mean, float *running_var, float momentum, float eps, int B, int C) {
  return LAUNCH(bn_normalize_k, (size_t)C, st, out, saved, in, sum, sqdev, N, gamma, beta, running_mean, running_var,
                momentum, eps, B, C);
}

cudaError_t cuk_bn_backward_stats(cudaStream_t st, double *sg, double *sgx, const float *dout, const float *in,
                                  const float *saved, int B, int C) {
  return LAUNCH(bn_backward_stats_k, (size_t)C, st, sg, sgx, dout, in, saved, B, C);
}

cudaError_t cuk_bn_backward_apply(cudaStream_t st, float *din, float *dgamma, float *dbeta, const float *dout,
                                  const float *in, const float *gamma, const float *saved, const double *sg_way,
                                  const double *sgx_way, const double *sg, const double *sgx, double N, int B, int C) {
  return LAUNCH(bn_backward_apply_k, (size_t)C, st, din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg,
                sgx, N, B, C);
}

cudaError_t cuk_bn_infer(cudaStream_t st, float *out, const float *in, const float *gamma, const float *beta,
                         const float *running_mean, const float *running_var, float eps, int B, int C) {
  return LAUNCH(bn_infer_k, (size_t)B * C, st, out, in, gamma, beta, running_mean, running_var, eps, B, C);
}

cudaError_t cuk_bn_infer_backward(cudaStream_t st, float *din, float *dgamma, float *dbeta, const float *dout,
                                  const float *in, const float *gamma, const float *running_mean,
                                  const float *running_var, float eps, int B, int C) {
  return LAUNCH(bn_infer_backward_k, (size_t)C, st, din, dgamma, dbeta, dout, in, gamma, running_mean, running_var,
                eps, B, C);
}

cudaError_t cuk_bce_forward(cudaStream_t st, double *loss, const float *logits, const float *labels, int B,
                            double *terms) {
  cudaError_t e = LAUNCH(bce_terms_k, (size_t)B, st, terms, logits, labels, B);
  if (e != cudaSuccess) return e;
  bce_sum_k<<<1, 1024, 0, st>>>(loss, terms, B);
  return cudaGetLastError();
}

cudaError_t cuk_bce_backward(cudaStream_t st, float *dlogits, const float *logits, const float *labels, int B) {
  return LAUNCH(bce_backward_k, (size_t)B, st, dlogits, logits, labels, B, 1.0f / (float)B);
}

cudaError_t cuk_optim_step(cudaStream_t st, int kind, float *w, const float *grad, float *state, size_t n, float lr,
                           float wd, float b1, float b2, float eps, float step_size, float inv_sqrt_bc2) {
  switch (kind) {
  case 0: return LAUNCH(sgd_k, n, st, w, grad, n, lr, wd);
  case 1: return LAUNCH(adam_k, n, st, w, grad, state, state + n, n, wd, b1, b2, eps, step_size, inv_sqrt_bc2);
  default: return LAUNCH(adagrad_k, n, st, w, grad, state, n, lr, wd, eps);
  }
}

} // extern "C"
