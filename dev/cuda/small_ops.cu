// The small ops of issue 11's list, each the CUDA twin of its CPU op with the
// CPU op's arithmetic written out (the _rn intrinsics: no FMA contraction),
// so that each must match its reference here bit for bit, except where a
// transcendental function or a reduction order differs (said per op):
//
//   fm       the factorization machine's second-order term (src/backend/cpu/fm.c):
//            per sample, s_d and q_d summed over f in order in fp32, then
//            0.5 * sum over d in order, in double, of s_d^2 - q_d; backward
//            de_fd = g * (s_d - e_fd)
//   cross    DCN-v2's gate (src/backend/cpu/cross.c): out = x0 * u + xl; backward
//            du = dout * x0, dx0 += dout * u
//   bce      binary cross-entropy on logits (src/backend/cpu/loss.c): the loss, the
//            mean of max(z, 0) - z y + log1p(exp(-|z|)) in double (CUDA's exp
//            and log1p, a tree sum against a sequential one: within 1e-10
//            relative), and dz =
//            (sigmoid(z) - y) / B in float from expf(-|z|) as the CPU does
//            (CUDA's expf is within 2 ulp, so dz within 4 ulp of 1 over B,
//            absolute: sigmoid(z) - y cancels)
//   adam     the dense Adam step (src/backend/cpu/optim.c): PyTorch's bias
//            corrections folded into a step size and a denominator scale
//   sgd, adagrad  the other dense optimizers (src/backend/cpu/optim.c), with L2
//            weight decay: w -= lr (g + wd w); s += g^2, w -= lr g / (sqrt(s) + eps)
//
// usage: small_ops [n]   (default 1 << 24 elements; the fm and bce batches
//   are n / 416 and n samples); exits 77 (CTest: skipped) without a CUDA
//   device.
#include <cmath>
#include <vector>

#include "common.h"

static int same_bits(const char *what, const float *got, const float *want, size_t n) {
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && diff++ == 0) first = i;
  if (diff)
    std::printf("  %s: FAIL: %zu of %zu differ (first %zu: %.9g, want %.9g)\n", what, diff, n, first, got[first],
                want[first]);
  else std::printf("  %s: bitwise equal (%zu values)\n", what, n);
  return diff != 0;
}

template <class T>
static T *upload(const std::vector<T> &v) {
  T *d;
  CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
static std::vector<T> download(const T *d, size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// ---- fm ----

__global__ void fm_forward(float *out, const float *emb, int B, int F, int D) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const float *e = emb + (size_t)b * F * D;
  double acc = 0.0;
  for (int d = 0; d < D; d++) {
    float s = 0.0f, q = 0.0f;
    for (int f = 0; f < F; f++) {
      const float x = e[(size_t)f * D + d];
      s = __fadd_rn(s, x);
      q = __fadd_rn(q, __fmul_rn(x, x));
    }
    acc = __dadd_rn(acc, __dsub_rn(__dmul_rn((double)s, (double)s), (double)q));
  }
  out[b] = (float)(0.5 * acc);
}

__global__ void fm_backward(float *demb, const float *dout, const float *emb, int B, int F, int D) {
  const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; // one (b, d)
  if (t >= (size_t)B * D) return;
  const int b = (int)(t / D), d = (int)(t % D);
  const float *e = emb + (size_t)b * F * D;
  float s = 0.0f;
  for (int f = 0; f < F; f++) s = __fadd_rn(s, e[(size_t)f * D + d]);
  for (int f = 0; f < F; f++)
    demb[((size_t)b * F + f) * D + d] = __fmul_rn(dout[b], __fsub_rn(s, e[(size_t)f * D + d]));
}

static int test_fm(size_t n) {
  const int F = 26, D = 16, B = (int)(n / (F * D)) > 0 ? (int)(n / (F * D)) : 1;
  std::vector<float> emb((size_t)B * F * D), dout(B), out_r(B), demb_r(emb.size());
  for (size_t i = 0; i < emb.size(); i++) emb[i] = val(i, 1, 0.5f);
  for (int b = 0; b < B; b++) dout[b] = val(b, 2, 0.01f);
  for (int b = 0; b < B; b++) {
    const float *e = &emb[(size_t)b * F * D];
    double acc = 0.0;
    for (int d = 0; d < D; d++) {
      float s = 0.0f, q = 0.0f;
      for (int f = 0; f < F; f++) s += e[f * D + d], q += e[f * D + d] * e[f * D + d];
      acc += (double)s * s - q;
      for (int f = 0; f < F; f++) demb_r[((size_t)b * F + f) * D + d] = dout[b] * (s - e[f * D + d]);
    }
    out_r[b] = (float)(0.5 * acc);
  }
  float *d_emb = upload(emb), *d_dout = upload(dout), *d_out, *d_demb;
  CUDA_CHECK(cudaMalloc(&d_out, (size_t)B * 4));
  CUDA_CHECK(cudaMalloc(&d_demb, emb.size() * 4));
  auto fwd = [&]() { fm_forward<<<(B + 127) / 128, 128>>>(d_out, d_emb, B, F, D); };
  auto bwd = [&]() { fm_backward<<<(unsigned)(((size_t)B * D + 255) / 256), 256>>>(d_demb, d_dout, d_emb, B, F, D); };
  fwd(), bwd();
  CUDA_CHECK(cudaGetLastError());
  int failures = same_bits("fm forward", download(d_out, B).data(), out_r.data(), B) +
                 same_bits("fm backward", download(d_demb, emb.size()).data(), demb_r.data(), emb.size());
  if (!failures)
    std::printf("  fm: batch %d: forward %.3f ms, backward %.3f ms\n", B, time_ms(fwd, 20), time_ms(bwd, 20));
  cudaFree(d_emb), cudaFree(d_dout), cudaFree(d_out), cudaFree(d_demb);
  return failures;
}

// ---- cross gate ----

__global__ void cross_gate(float *out, const float *x0, const float *u, const float *xl, size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __fadd_rn(__fmul_rn(x0[i], u[i]), xl[i]);
}

__global__ void cross_gate_backward(float *du, float *dx0, const float *dout, const float *x0, const float *u,
                                    size_t n) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  du[i] = __fmul_rn(dout[i], x0[i]);
  dx0[i] = __fadd_rn(dx0[i], __fmul_rn(dout[i], u[i]));
}

static int test_cross(size_t n) {
  std::vector<float> x0(n), u(n), xl(n), dout(n), dx0(n), out_r(n), du_r(n), dx0_r(n);
  for (size_t i = 0; i < n; i++)
    x0[i] = val(i, 3, 1), u[i] = val(i, 4, 1), xl[i] = val(i, 5, 1), dout[i] = val(i, 6, 0.1f), dx0[i] = val(i, 7, 1);
  for (size_t i = 0; i < n; i++) {
    const float p = x0[i] * u[i];
    out_r[i] = p + xl[i];
    du_r[i] = dout[i] * x0[i];
    const float q = dout[i] * u[i];
    dx0_r[i] = dx0[i] + q;
  }
  float *d_x0 = upload(x0), *d_u = upload(u), *d_xl = upload(xl), *d_dout = upload(dout), *d_dx0 = upload(dx0);
  float *d_out, *d_du;
  CUDA_CHECK(cudaMalloc(&d_out, n * 4));
  CUDA_CHECK(cudaMalloc(&d_du, n * 4));
  const unsigned blocks = (unsigned)((n + 255) / 256);
  cross_gate<<<blocks, 256>>>(d_out, d_x0, d_u, d_xl, n);
  cross_gate_backward<<<blocks, 256>>>(d_du, d_dx0, d_dout, d_x0, d_u, n);
  CUDA_CHECK(cudaGetLastError());
  int failures = same_bits("cross gate", download(d_out, n).data(), out_r.data(), n) +
                 same_bits("cross gate backward du", download(d_du, n).data(), du_r.data(), n) +
                 same_bits("cross gate backward dx0", download(d_dx0, n).data(), dx0_r.data(), n);
  if (!failures) {
    const float ms = time_ms([&]() { cross_gate<<<blocks, 256>>>(d_out, d_x0, d_u, d_xl, n); }, 20);
    std::printf("  cross gate: %.3f ms, %.0f GB/s\n", ms, 16.0 * n / ms / 1e6);
  }
  cudaFree(d_x0), cudaFree(d_u), cudaFree(d_xl), cudaFree(d_dout), cudaFree(d_dx0), cudaFree(d_out), cudaFree(d_du);
  return failures;
}

// ---- bce ----

// Per sample: the loss term (double), and dz; the terms summed by a tree.
__global__ void bce(double *terms, float *dz, const float *z, const float *y, int B) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const double x = z[b], t = y[b];
  terms[b] = fmax(x, 0.0) - x * t + log1p(exp(-fabs(x)));
  const float e = expf(-fabsf(z[b])), s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e)), sig = z[b] >= 0.0f ? s : __fmul_rn(e, s);
  dz[b] = __fmul_rn(__fsub_rn(sig, y[b]), __fdiv_rn(1.0f, (float)B));
}

__global__ void sum_tree(double *v, int n, int stride) {
  // 64-bit: the last level's index runs past 2^31 on a large batch.
  const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 2 * (size_t)stride;
  if (i + stride < (size_t)n) v[i] += v[i + stride];
}

static int test_bce(size_t n) {
  const int B = (int)n;
  std::vector<float> z(B), y(B), dz_r(B);
  double loss_r = 0;
  for (int b = 0; b < B; b++) z[b] = val(b, 8, 20.0f), y[b] = (float)(dlrec_mix64(b ^ 9) & 1);
  const float inv_b = 1.0f / (float)B;
  for (int b = 0; b < B; b++) {
    const double x = z[b], t = y[b];
    loss_r += std::fmax(x, 0.0) - x * t + std::log1p(std::exp(-std::fabs(x)));
    const float e = std::exp(-std::fabs(z[b])), s = 1.0f / (1.0f + e), sig = z[b] >= 0.0f ? s : e * s;
    dz_r[b] = (sig - y[b]) * inv_b;
  }
  loss_r /= B;
  float *d_z = upload(z), *d_y = upload(y), *d_dz;
  double *d_terms;
  CUDA_CHECK(cudaMalloc(&d_dz, (size_t)B * 4));
  CUDA_CHECK(cudaMalloc(&d_terms, (size_t)B * 8));
  auto run = [&]() {
    bce<<<(B + 255) / 256, 256>>>(d_terms, d_dz, d_z, d_y, B);
    for (int s = 1; s < B; s *= 2) {
      const int pairs = (B + 2 * s - 1) / (2 * s);
      sum_tree<<<(pairs + 255) / 256, 256>>>(d_terms, B, s);
    }
  };
  run();
  CUDA_CHECK(cudaGetLastError());
  double loss = 0;
  CUDA_CHECK(cudaMemcpy(&loss, d_terms, 8, cudaMemcpyDeviceToHost));
  loss /= B;
  const std::vector<float> dz = download(d_dz, B);
  size_t bad = 0;
  for (int b = 0; b < B; b++) bad += !(std::fabs((double)dz[b] - dz_r[b]) <= 4 * 0x1p-24 * inv_b);
  int failures = bad != 0;
  std::printf("  bce dz: %s (%zu of %d beyond 4 ulp of 1 over B)\n", bad ? "FAIL" : "ok", bad, B);
  if (!(std::fabs(loss - loss_r) <= 1e-10 * std::fabs(loss_r))) {
    std::printf("  bce loss: FAIL: %.17g, want %.17g\n", loss, loss_r);
    failures++;
  } else {
    std::printf("  bce loss: %.12g, within 1e-10 of the reference\n", loss);
  }
  if (!failures) std::printf("  bce: %d samples, %.3f ms\n", B, time_ms(run, 20));
  cudaFree(d_z), cudaFree(d_y), cudaFree(d_dz), cudaFree(d_terms);
  return failures;
}

// ---- adam ----

__global__ void adam(float *w, const float *grad, float *m, float *v, size_t n, float b1, float b2, float eps,
                     float wd, float step_size, float inv_sqrt_bc2) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = __fadd_rn(grad[i], __fmul_rn(wd, w[i]));
  m[i] = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(__fsub_rn(1.0f, b1), g));
  v[i] = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, b2), g), g));
  w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(step_size, m[i]),
                                   __fadd_rn(__fmul_rn(__fsqrt_rn(v[i]), inv_sqrt_bc2), eps)));
}

static int test_adam(size_t n) {
  const float lr = 0.002f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-5f;
  const uint64_t step = 7;
  const double bc1 = 1.0 - std::pow(b1, (double)step), bc2 = 1.0 - std::pow(b2, (double)step);
  const float step_size = (float)(lr / bc1), inv_sqrt_bc2 = (float)(1.0 / std::sqrt(bc2));
  std::vector<float> w(n), g(n), m(n), v(n);
  for (size_t i = 0; i < n; i++)
    w[i] = val(i, 10, 1), g[i] = val(i, 11, 0.01f), m[i] = val(i, 12, 0.001f), v[i] = std::fabs(val(i, 13, 1e-5f));
  float *d_w = upload(w), *d_g = upload(g), *d_m = upload(m), *d_v = upload(v);
  std::vector<float> wr = w, mr = m, vr = v;
  for (size_t i = 0; i < n; i++) {
    const float gi = g[i] + wd * wr[i];
    mr[i] = b1 * mr[i] + (1.0f - b1) * gi;
    vr[i] = b2 * vr[i] + (1.0f - b2) * gi * gi;
    wr[i] -= step_size * mr[i] / (std::sqrt(vr[i]) * inv_sqrt_bc2 + eps);
  }
  const unsigned blocks = (unsigned)((n + 255) / 256);
  adam<<<blocks, 256>>>(d_w, d_g, d_m, d_v, n, b1, b2, eps, wd, step_size, inv_sqrt_bc2);
  CUDA_CHECK(cudaGetLastError());
  int failures = same_bits("adam w", download(d_w, n).data(), wr.data(), n) +
                 same_bits("adam m", download(d_m, n).data(), mr.data(), n) +
                 same_bits("adam v", download(d_v, n).data(), vr.data(), n);
  if (!failures) {
    const float ms =
        time_ms([&]() { adam<<<blocks, 256>>>(d_w, d_g, d_m, d_v, n, b1, b2, eps, wd, step_size, inv_sqrt_bc2); }, 20);
    std::printf("  adam: %zu parameters, %.3f ms, %.0f GB/s\n", n, ms, 28.0 * n / ms / 1e6);
  }
  cudaFree(d_w), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v);
  return failures;
}

// ---- sgd, adagrad ----

__global__ void sgd(float *w, const float *grad, size_t n, float lr, float wd) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) w[i] = __fsub_rn(w[i], __fmul_rn(lr, __fadd_rn(grad[i], __fmul_rn(wd, w[i]))));
}

__global__ void adagrad(float *w, const float *grad, float *s, size_t n, float lr, float wd, float eps) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = __fadd_rn(grad[i], __fmul_rn(wd, w[i]));
  s[i] = __fadd_rn(s[i], __fmul_rn(g, g));
  w[i] = __fsub_rn(w[i], __fdiv_rn(__fmul_rn(lr, g), __fadd_rn(__fsqrt_rn(s[i]), eps)));
}

static int test_sgd_adagrad(size_t n) {
  const float lr = 0.05f, wd = 1e-5f, eps = 1e-10f;
  std::vector<float> w(n), g(n), st(n);
  for (size_t i = 0; i < n; i++) w[i] = val(i, 20, 1), g[i] = val(i, 21, 0.01f), st[i] = std::fabs(val(i, 22, 0.1f));
  std::vector<float> w_sgd = w, w_ada = w, s_ada = st;
  for (size_t i = 0; i < n; i++) {
    w_sgd[i] -= lr * (g[i] + wd * w_sgd[i]);
    const float gi = g[i] + wd * w_ada[i];
    s_ada[i] += gi * gi;
    w_ada[i] -= lr * gi / (std::sqrt(s_ada[i]) + eps);
  }
  float *d_w = upload(w), *d_g = upload(g), *d_s = upload(st);
  const unsigned blocks = (unsigned)((n + 255) / 256);
  sgd<<<blocks, 256>>>(d_w, d_g, n, lr, wd);
  CUDA_CHECK(cudaGetLastError());
  int failures = same_bits("sgd w", download(d_w, n).data(), w_sgd.data(), n);
  CUDA_CHECK(cudaMemcpy(d_w, w.data(), n * 4, cudaMemcpyHostToDevice));
  adagrad<<<blocks, 256>>>(d_w, d_g, d_s, n, lr, wd, eps);
  CUDA_CHECK(cudaGetLastError());
  failures += same_bits("adagrad w", download(d_w, n).data(), w_ada.data(), n) +
              same_bits("adagrad s", download(d_s, n).data(), s_ada.data(), n);
  cudaFree(d_w), cudaFree(d_g), cudaFree(d_s);
  return failures;
}

int main(int argc, char **argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t)1 << 24;
  if (n < 1024 || n > ((size_t)1 << 30)) {
    std::fprintf(stderr, "usage: small_ops [n in [1024, 2^30]]\n");
    return 2;
  }
  require_gpu("small_ops");
  const int failures = test_fm(n) + test_cross(n) + test_bce(n < ((size_t)1 << 26) ? n : (size_t)1 << 26) +
                       test_adam(n) + test_sgd_adagrad(n);
  return failures ? 1 : 0;
}
