// DLRM's pairwise dot interaction on the GPU, forward and backward (the CUDA
// twin of src/backend/cpu/interaction.c, issue 11). Per sample, Z = [x; e_1 .. e_F]
// is (F+1, D);
//
//   out  = concat(x, [Z_i . Z_j for i in 1..F for j in 0..i-1])   (D + F(F+1)/2)
//   dZ_i = sum over k != i of S_ik Z_k,  S the symmetric (F+1, F+1) matrix of
//          the pair gradients;  dx = dout_x + dZ_0,  de_i = dZ_i
//
// One block per sample: Z (and, backward, the sample's pair gradients) in
// shared memory, rows padded against bank conflicts; forward, a thread per
// pair computes its dot product over d in order; backward, a thread per
// (i, d), or per (i, 4 d's) when D is a multiple of 4, sums over k in order. Products and
// sums use the _rn intrinsics (no FMA contraction), so both directions must
// match the CPU reference here bit for bit. (src/backend/cpu/interaction.c's
// vectorized loops may contract; the backend port will follow whichever
// order the CPU backend settles on.)
//
// usage: dot_interaction [batch] [F] [D]   (defaults 65536 26 128; Criteo
//   Kaggle's DLRM is F = 26, D = 16); exits 77 (CTest: skipped) without a
//   CUDA device.
#include <vector>

#include "common.h"

static size_t out_dim(int F, int D) { return (size_t)D + (size_t)F * (F + 1) / 2; }

// ---- CPU reference ----

static void forward_cpu(float *out, const float *x, const float *emb, int B, int F, int D) {
  const size_t O = out_dim(F, D);
  for (int b = 0; b < B; b++) {
    const float *xb = x + (size_t)b * D, *eb = emb + (size_t)b * F * D;
    float *o = out + (size_t)b * O;
    for (int d = 0; d < D; d++) o[d] = xb[d];
    size_t p = D;
    for (int i = 1; i <= F; i++)
      for (int j = 0; j < i; j++) {
        const float *zi = eb + (size_t)(i - 1) * D, *zj = j ? eb + (size_t)(j - 1) * D : xb;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += zi[d] * zj[d];
        o[p++] = s;
      }
  }
}

static void backward_cpu(float *dx, float *demb, const float *dout, const float *x, const float *emb, int B, int F,
                         int D) {
  const size_t O = out_dim(F, D);
  for (int b = 0; b < B; b++) {
    const float *xb = x + (size_t)b * D, *eb = emb + (size_t)b * F * D, *g = dout + (size_t)b * O;
    auto z = [&](int k) { return k ? eb + (size_t)(k - 1) * D : xb; };
    auto s = [&](int i, int k) { // the pair gradient of (i, k), i != k
      const int hi = i > k ? i : k, lo = i > k ? k : i;
      return g[D + (size_t)hi * (hi - 1) / 2 + lo];
    };
    for (int i = 0; i <= F; i++) {
      float *o = i ? demb + ((size_t)b * F + i - 1) * D : dx + (size_t)b * D;
      for (int d = 0; d < D; d++) {
        float acc = 0.0f;
        for (int k = 0; k <= F; k++)
          if (k != i) acc += s(i, k) * z(k)[d];
        o[d] = i ? acc : g[d] + acc;
      }
    }
  }
}

// ---- GPU ----

// Z of sample b into shared memory: F+1 rows of D, each row S floats apart.
// S is D + 4 when D is a multiple of 4 (rows 16-byte aligned for float4
// loads, and 8 consecutive rows fall in 8 distinct 16-byte bank groups), else
// D + 1. Unpadded (S = D = 128) every lane of a warp read the same bank,
// and the forward ran at 137 GB/s on an H100.
__device__ inline void load_z(float *z, const float *x, const float *emb, int b, int F, int D, int S) {
  for (int t = threadIdx.x; t < (F + 1) * D; t += blockDim.x) {
    const int r = t / D, c = t % D;
    z[r * S + c] = r == 0 ? x[(size_t)b * D + c] : emb[(size_t)b * F * D + (t - D)];
  }
}

// The pair gradient of (i, k), i != k, in the sample's pairs g.
__device__ inline float pair_grad(const float *g, int i, int k) {
  const int hi = i > k ? i : k, lo = i > k ? k : i;
  return g[hi * (hi - 1) / 2 + lo];
}

// VEC: D a multiple of 4, 16-byte loads of Z (4 products a load, added in d
// order as the scalar loop does).
template <bool VEC>
__global__ void forward_gpu(float *out, const float *x, const float *emb, int F, int D, int S) {
  extern __shared__ float4 shared4[];
  float *z = reinterpret_cast<float *>(shared4);
  const int b = blockIdx.x;
  const size_t O = (size_t)D + (size_t)F * (F + 1) / 2;
  load_z(z, x, emb, b, F, D, S);
  __syncthreads();
  float *o = out + (size_t)b * O;
  for (int d = threadIdx.x; d < D; d += blockDim.x) o[d] = z[d];
  const int pairs = F * (F + 1) / 2;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    // p = i (i - 1) / 2 + j with 0 <= j < i: invert the triangle.
    int i = (int)((1.0f + sqrtf(1.0f + 8.0f * (float)p)) / 2.0f);
    while (i * (i - 1) / 2 > p) i--;
    while ((i + 1) * i / 2 <= p) i++;
    const int j = p - i * (i - 1) / 2;
    const float *zi = z + i * S, *zj = z + j * S;
    float s = 0.0f;
    if constexpr (VEC) {
      const float4 *a4 = reinterpret_cast<const float4 *>(zi), *c4 = reinterpret_cast<const float4 *>(zj);
      for (int q = 0; q < D / 4; q++) {
        const float4 a = a4[q], c = c4[q];
        s = __fadd_rn(s, __fmul_rn(a.x, c.x));
        s = __fadd_rn(s, __fmul_rn(a.y, c.y));
        s = __fadd_rn(s, __fmul_rn(a.z, c.z));
        s = __fadd_rn(s, __fmul_rn(a.w, c.w));
      }
    } else {
      for (int d = 0; d < D; d++) s = __fadd_rn(s, __fmul_rn(zi[d], zj[d]));
    }
    o[D + p] = s;
  }
}

// A thread per (i, d), or with VEC per (i, 4 consecutive d); k in order.
template <bool VEC>
__global__ void backward_gpu(float *dx, float *demb, const float *dout, const float *x, const float *emb, int F,
                             int D, int S) {
  extern __shared__ float4 shared4[];
  float *z = reinterpret_cast<float *>(shared4), *g = z + (F + 1) * S;
  const int b = blockIdx.x;
  const int pairs = F * (F + 1) / 2;
  const size_t O = (size_t)D + pairs;
  load_z(z, x, emb, b, F, D, S);
  for (int t = threadIdx.x; t < pairs; t += blockDim.x) g[t] = dout[(size_t)b * O + D + t];
  __syncthreads();
  constexpr int W = VEC ? 4 : 1;
  const int per_row = D / W;
  for (int t = threadIdx.x; t < (F + 1) * per_row; t += blockDim.x) {
    const int i = t / per_row, d = (t % per_row) * W;
    float acc[W];
    for (int w = 0; w < W; w++) acc[w] = 0.0f;
    for (int k = 0; k <= F; k++) {
      if (k == i) continue;
      const float gk = pair_grad(g, i, k);
      if constexpr (VEC) {
        const float4 zk = *reinterpret_cast<const float4 *>(z + k * S + d);
        acc[0] = __fadd_rn(acc[0], __fmul_rn(gk, zk.x));
        acc[1] = __fadd_rn(acc[1], __fmul_rn(gk, zk.y));
        acc[2] = __fadd_rn(acc[2], __fmul_rn(gk, zk.z));
        acc[3] = __fadd_rn(acc[3], __fmul_rn(gk, zk.w));
      } else {
        acc[0] = __fadd_rn(acc[0], __fmul_rn(gk, z[k * S + d]));
      }
    }
    for (int w = 0; w < W; w++) {
      if (i == 0) dx[(size_t)b * D + d + w] = __fadd_rn(dout[(size_t)b * O + d + w], acc[w]);
      else demb[((size_t)b * F + i - 1) * D + d + w] = acc[w];
    }
  }
}

// ---- driver ----

static int check(const char *what, const std::vector<float> &got, const std::vector<float> &want) {
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && diff++ == 0) first = i;
  if (diff)
    std::printf("  %s: FAIL: %zu values differ (first %zu: %.9g, want %.9g)\n", what, diff, first, got[first],
                want[first]);
  return diff != 0;
}

int main(int argc, char **argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 65536, F = argc > 2 ? std::atoi(argv[2]) : 26,
            D = argc > 3 ? std::atoi(argv[3]) : 128;
  const bool vec = D % 4 == 0;
  const int S = vec ? D + 4 : D + 1; // shared memory's row stride (load_z)
  if (B < 1 || F < 1 || F > 256 || D < 1 || D > 1024 || (size_t)(F + 1) * S * 4 + (size_t)F * (F + 1) * 2 > 96 * 1024) {
    std::fprintf(stderr, "usage: dot_interaction [batch] [F <= 256] [D <= 1024], Z and the pairs within 96 KiB\n");
    return 2;
  }
  require_gpu("dot_interaction");
  const size_t O = out_dim(F, D);
  std::printf("batch %d, F %d, D %d: %zu outputs a sample\n", B, F, D, O);
  std::vector<float> x((size_t)B * D), emb((size_t)B * F * D), dout((size_t)B * O);
  for (size_t i = 0; i < x.size(); i++) x[i] = val(i, 0, 1.0f);
  for (size_t i = 0; i < emb.size(); i++) emb[i] = val(i, 1, 1.0f);
  for (size_t i = 0; i < dout.size(); i++) dout[i] = val(i, 2, 0.25f);
  std::vector<float> out_ref((size_t)B * O), dx_ref(x.size()), demb_ref(emb.size());
  forward_cpu(out_ref.data(), x.data(), emb.data(), B, F, D);
  backward_cpu(dx_ref.data(), demb_ref.data(), dout.data(), x.data(), emb.data(), B, F, D);

  float *d_x, *d_emb, *d_out, *d_dout, *d_dx, *d_demb;
  CUDA_CHECK(cudaMalloc(&d_x, x.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_emb, emb.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_out, out_ref.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_dout, dout.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_dx, x.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_demb, emb.size() * 4));
  CUDA_CHECK(cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_emb, emb.data(), emb.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_dout, dout.data(), dout.size() * 4, cudaMemcpyHostToDevice));
  const size_t fwd_shared = (size_t)(F + 1) * S * 4, bwd_shared = fwd_shared + (size_t)F * (F + 1) / 2 * 4;
  auto fwd_k = vec ? forward_gpu<true> : forward_gpu<false>;
  auto bwd_k = vec ? backward_gpu<true> : backward_gpu<false>;
  CUDA_CHECK(cudaFuncSetAttribute(fwd_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fwd_shared));
  CUDA_CHECK(cudaFuncSetAttribute(bwd_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bwd_shared));
  auto fwd = [&]() { fwd_k<<<B, 128, fwd_shared>>>(d_out, d_x, d_emb, F, D, S); };
  auto bwd = [&]() { bwd_k<<<B, 128, bwd_shared>>>(d_dx, d_demb, d_dout, d_x, d_emb, F, D, S); };
  fwd();
  bwd();
  CUDA_CHECK(cudaGetLastError());
  std::vector<float> out(out_ref.size()), dx(x.size()), demb(emb.size());
  CUDA_CHECK(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(dx.data(), d_dx, dx.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(demb.data(), d_demb, demb.size() * 4, cudaMemcpyDeviceToHost));
  int failures = check("forward", out, out_ref) + check("backward dx", dx, dx_ref) + check("backward demb", demb, demb_ref);
  if (!failures) {
    const double flops = (double)B * F * (F + 1) / 2 * 2 * D;
    const float f_ms = time_ms(fwd, 20), b_ms = time_ms(bwd, 20);
    const double f_bytes = (double)(x.size() + emb.size() + out.size()) * 4,
                 b_bytes = (double)(x.size() + emb.size() + dout.size() + dx.size() + demb.size()) * 4;
    std::printf("  forward: bitwise equal; %.3f ms, %.0f GB/s, %.0f GFLOP/s\n", f_ms, f_bytes / f_ms / 1e6,
                flops / f_ms / 1e6);
    std::printf("  backward: bitwise equal; %.3f ms, %.0f GB/s, %.0f GFLOP/s\n", b_ms, b_bytes / b_ms / 1e6,
                2 * flops / b_ms / 1e6);
  }
  cudaFree(d_x), cudaFree(d_emb), cudaFree(d_out), cudaFree(d_dout), cudaFree(d_dx), cudaFree(d_demb);
  return failures ? 1 : 0;
}
