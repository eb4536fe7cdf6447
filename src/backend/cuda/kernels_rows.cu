// The CUDA backend's kernels (declared in cuda_kernels.h, called by the ops of
// cuda_*.c): moving rows, the elementwise ops, the 16-bit operands of the GEMMs
// and the column sums of their bias gradients. They came from dev/cuda/, where
// each was checked bit for bit or within its stated bound against a CPU
// reference and timed on an H100; the op-by-op test (tests/test_backend.c)
// checks them here against the same double references as the CPU backend's.
//
// Products and sums that the CPU rounds one by one use the _rn intrinsics
// where the result is compared bit for bit (dropout's masks, the copies);
// elsewhere the compiler may contract into FMA, which the op tests' bounds
// allow. Reductions are fixed trees or in-order loops: two runs give the
// same bits.
#include "backend/cuda/kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

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

} // namespace

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

} // extern "C"
