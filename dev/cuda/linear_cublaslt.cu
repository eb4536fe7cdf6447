// A linear layer through cuBLASLt (issue 11's MLPs): forward with the bias
// and ReLU in the GEMM's epilogue, and the backward GEMMs (dW, din; the bias
// gradient, a column sum, is left to the backend), in TF32 (fp32 operands),
// bf16 or fp16 (operands rounded to nearest even from fp32 master weights and
// activations; fp16's range is the trainer's to keep with loss scaling), fp32
// accumulation and outputs. Row-major like the CPU backend:
//
//   out (B, OUT) = act(in (B, IN) . W^T + bias),  W (OUT, IN)
//   dW = dout^T . in,  din = dout . W
//
// (dout already multiplied by the ReLU's mask, as the CPU backend's
// linear_backward takes it.) cuBLASLt is column-major: a row-major (r, c)
// matrix is its column-major (c, r) transpose, so out^T = W . in^T is
// m = OUT, n = B, k = IN with W transposed.
//
// Checked against a CPU reference in double over the operands as the GPU
// reads them (rounded to bf16 or fp16, or unrounded for TF32): each value
// within tol * sum |a_k b_k| + 1e-6 (tol 1e-4 for bf16 and fp16: exact
// products, fp32 sums of up to 65536 of them; 2e-3 for TF32's 10-bit
// mantissas), and timed.
//
// usage: linear_cublaslt [batch] [in] [out]   (defaults 65536 1024 1024);
//   exits 77 (CTest: skipped) without a CUDA device.
#include <cublasLt.h>
#include <cuda_fp16.h>

#include <cmath>
#include <vector>

#include "common.h"

#define LT_CHECK(call)                                                                                     \
  do {                                                                                                     \
    cublasStatus_t st_ = (call);                                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                    \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)st_);          \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

// D (m, n; ld m) = op(A) . op(B) (+ epilogue), column-major; A, B of type
// ab (CUDA_R_32F with TF32 compute, CUDA_R_16BF or CUDA_R_16F), D fp32.
static void matmul(cublasLtHandle_t lt, void *ws, size_t ws_bytes, float *D, const void *A, int lda, bool ta,
                   const void *B, int ldb, bool tb, int m, int n, int k, cudaDataType_t ab, cublasLtEpilogue_t epi,
                   const float *bias) {
  const cublasComputeType_t compute = ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t op;
  LT_CHECK(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
  const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob));
  LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  cublasLtMatrixLayout_t la, lb, ld;
  LT_CHECK(cublasLtMatrixLayoutCreate(&la, ab, ta ? k : m, ta ? m : k, lda));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lb, ab, tb ? n : k, tb ? k : n, ldb));
  LT_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
  cublasLtMatmulPreference_t pref;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes));
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &h, &found));
  if (!found) {
    std::fprintf(stderr, "cuBLASLt: no algorithm for m=%d n=%d k=%d\n", m, n, k);
    std::exit(1);
  }
  const float one = 1.0f, zero = 0.0f;
  LT_CHECK(cublasLtMatmul(lt, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &h.algo, ws, ws_bytes, 0));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(op);
}

// Within tol * scale + 1e-6 everywhere; scale[i] = sum |a_k b_k| of value i.
static int near(const char *what, const std::vector<float> &got, const std::vector<double> &want,
                const std::vector<double> &scale, double tol) {
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double e = std::fabs(got[i] - want[i]) / (tol * scale[i] + 1e-6);
    if (e > worst) worst = e;
    if (e > 1 && bad++ == 0) first = i;
  }
  if (bad)
    std::printf("  %s: FAIL: %zu values off (first %zu: %.9g, want %.9g)\n", what, bad, first, got[first],
                want[first]);
  else std::printf("  %s: within tolerance (worst at %.2f of it)\n", what, worst);
  return bad != 0;
}

__global__ void to_bf16(uint16_t *dst, const float *src, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const uint32_t u = __float_as_uint(src[i]);
    dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); // finite values: round to nearest even
  }
}

__global__ void to_fp16(uint16_t *dst, const float *src, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

enum Prec { TF32 = 0, BF16 = 1, FP16 = 2 };

static int run(Prec prec, int B, int IN, int OUT) {
  const char *name = prec == BF16 ? "bf16" : prec == FP16 ? "fp16" : "tf32";
  const bool half = prec != TF32; // 16-bit operands, converted on the device
  std::vector<float> in((size_t)B * IN), w((size_t)OUT * IN), bias(OUT), dout((size_t)B * OUT);
  for (size_t i = 0; i < in.size(); i++) in[i] = val(i, 0, 1.0f);
  for (size_t i = 0; i < w.size(); i++) w[i] = val(i, 3, 1.0f / 32);
  for (int i = 0; i < OUT; i++) bias[i] = val(i, 5, 0.1f);
  for (size_t i = 0; i < dout.size(); i++) dout[i] = val(i, 9, 0.125f);
  auto rd = [&](float x) {
    return prec == BF16   ? (double)dtype_bf16_to_f32(dtype_f32_to_bf16(x))
           : prec == FP16 ? (double)dtype_fp16_to_f32(dtype_f32_to_fp16(x))
                          : (double)x;
  };

  float *d_in, *d_w, *d_bias, *d_dout, *d_out, *d_dw, *d_din;
  uint16_t *h_in = nullptr, *h_w = nullptr, *h_dout = nullptr;
  CUDA_CHECK(cudaMalloc(&d_in, in.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_w, w.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_bias, bias.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_dout, dout.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)B * OUT * 4));
  CUDA_CHECK(cudaMalloc(&d_dw, w.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_din, in.size() * 4));
  CUDA_CHECK(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_bias, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dout, dout.data(), dout.size() * 4, cudaMemcpyHostToDevice));
  if (half) {
    CUDA_CHECK(cudaMalloc(&h_in, in.size() * 2));
    CUDA_CHECK(cudaMalloc(&h_w, w.size() * 2));
    CUDA_CHECK(cudaMalloc(&h_dout, dout.size() * 2));
  }
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = 32 << 20;
  void *ws;
  CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  const cudaDataType_t ab = prec == BF16 ? CUDA_R_16BF : prec == FP16 ? CUDA_R_16F : CUDA_R_32F;
  auto convert = [&](uint16_t *dst, const float *src, size_t n) {
    if (prec == BF16) to_bf16<<<(unsigned)((n + 255) / 256), 256>>>(dst, src, n);
    else to_fp16<<<(unsigned)((n + 255) / 256), 256>>>(dst, src, n);
  };
  const void *A_in = half ? (const void *)h_in : d_in, *A_w = half ? (const void *)h_w : d_w,
             *A_dout = half ? (const void *)h_dout : d_dout;
  auto forward = [&]() {
    if (half) convert(h_in, d_in, in.size()), convert(h_w, d_w, w.size());
    matmul(lt, ws, ws_bytes, d_out, A_w, IN, true, A_in, IN, false, OUT, B, IN, ab, CUBLASLT_EPILOGUE_RELU_BIAS,
           d_bias);
  };
  auto backward = [&]() {
    if (half) convert(h_dout, d_dout, dout.size());
    // dW^T (IN, OUT) = in^T (IN, B) . dout (B, OUT)
    matmul(lt, ws, ws_bytes, d_dw, A_in, IN, false, A_dout, OUT, true, IN, OUT, B, ab, CUBLASLT_EPILOGUE_DEFAULT,
           nullptr);
    // din^T (IN, B) = W^T-as-stored (IN, OUT) . dout^T (OUT, B)
    matmul(lt, ws, ws_bytes, d_din, A_w, IN, false, A_dout, OUT, false, IN, B, OUT, ab, CUBLASLT_EPILOGUE_DEFAULT,
           nullptr);
  };
  forward();
  backward();
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out((size_t)B * OUT), dw(w.size()), din(in.size());
  CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(dw.data(), d_dw, dw.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(din.data(), d_din, din.size() * 4, cudaMemcpyDeviceToHost));

  // The reference, on a sample of rows (all of them would take minutes).
  const int rows = B < 256 ? B : 256;
  std::vector<float> out_s((size_t)rows * OUT), din_s((size_t)rows * IN);
  std::vector<double> out_r((size_t)rows * OUT), out_sc(out_r.size()), din_r((size_t)rows * IN), din_sc(din_r.size());
  for (int s = 0; s < rows; s++) {
    const int b = (int)(dlrec_mix64(s) % (uint64_t)B);
    for (int o = 0; o < OUT; o++) {
      double acc = 0, sc = 0;
      for (int k = 0; k < IN; k++) {
        const double p = rd(in[(size_t)b * IN + k]) * rd(w[(size_t)o * IN + k]);
        acc += p, sc += std::fabs(p);
      }
      acc += bias[o];
      out_r[(size_t)s * OUT + o] = acc > 0 ? acc : 0; // ReLU
      out_sc[(size_t)s * OUT + o] = sc + std::fabs(bias[o]);
      out_s[(size_t)s * OUT + o] = out[(size_t)b * OUT + o];
    }
    for (int i = 0; i < IN; i++) {
      double acc = 0, sc = 0;
      for (int o = 0; o < OUT; o++) {
        const double p = rd(dout[(size_t)b * OUT + o]) * rd(w[(size_t)o * IN + i]);
        acc += p, sc += std::fabs(p);
      }
      din_r[(size_t)s * IN + i] = acc;
      din_sc[(size_t)s * IN + i] = sc;
      din_s[(size_t)s * IN + i] = din[(size_t)b * IN + i];
    }
  }
  // dW over a sample of its entries (each a sum over the whole batch).
  const int entries = 256;
  std::vector<float> dw_s(entries);
  std::vector<double> dw_r(entries), dw_sc(entries);
  for (int s = 0; s < entries; s++) {
    const size_t at = dlrec_mix64(s ^ 77) % dw.size();
    const int o = (int)(at / IN), i = (int)(at % IN);
    double acc = 0, sc = 0;
    for (int b = 0; b < B; b++) {
      const double p = rd(dout[(size_t)b * OUT + o]) * rd(in[(size_t)b * IN + i]);
      acc += p, sc += std::fabs(p);
    }
    // dW is stored as dW^T column-major, i.e. dW (OUT, IN) row-major: entry (o, i) at o * IN + i.
    dw_r[s] = acc, dw_sc[s] = sc, dw_s[s] = dw[at];
  }
  const double tol = half ? 1e-4 : 2e-3;
  std::printf(" %s, batch %d, %d -> %d:\n", name, B, IN, OUT);
  int failures = near("forward (bias, ReLU)", out_s, out_r, out_sc, tol) + near("din", din_s, din_r, din_sc, tol) +
                 near("dW", dw_s, dw_r, dw_sc, tol);
  if (!failures) {
    const double flops = 2.0 * B * IN * OUT;
    const float f = time_ms(forward, 20), b = time_ms(backward, 20);
    std::printf("  forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s), conversions included\n", f,
                flops / f / 1e9, b, 2 * flops / b / 1e9);
  }
  cublasLtDestroy(lt);
  cudaFree(ws), cudaFree(d_in), cudaFree(d_w), cudaFree(d_bias), cudaFree(d_dout), cudaFree(d_out), cudaFree(d_dw);
  cudaFree(d_din), cudaFree(h_in), cudaFree(h_w), cudaFree(h_dout);
  return failures;
}

int main(int argc, char **argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 65536, IN = argc > 2 ? std::atoi(argv[2]) : 1024,
            OUT = argc > 3 ? std::atoi(argv[3]) : 1024;
  if (B < 1 || IN < 8 || OUT < 8 || IN % 8 || OUT % 8) {
    std::fprintf(stderr, "usage: linear_cublaslt [batch] [in, a multiple of 8] [out, a multiple of 8]\n");
    return 2;
  }
  require_gpu("linear_cublaslt");
  int failures = run(TF32, B, IN, OUT) + run(BF16, B, IN, OUT) + run(FP16, B, IN, OUT);
  // DLRM's small layers (the bottom MLP's 13 -> 512 pads to 16).
  failures += run(BF16, B, 16, 512) + run(BF16, B, 512, 256) + run(FP16, B, 16, 512);
  return failures ? 1 : 0;
}
