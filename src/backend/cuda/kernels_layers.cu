// The CUDA backend's kernels (declared in cuda_kernels.h, called by the ops of
// cuda_*.c): the cross layers' gates, dropout, the mixture of experts' per-row
// parts, the packed scoring layer, batch normalization, the loss and the dense
// optimizers. They came from dev/cuda/, where each was checked bit for bit or
// within its stated bound against a CPU reference and timed on an H100; the
// op-by-op test (tests/test_backend.c) checks them here against the same double
// references as the CPU backend's.
//
// Products and sums that the CPU rounds one by one use the _rn intrinsics
// where the result is compared bit for bit (dropout's masks, the copies);
// elsewhere the compiler may contract into FMA, which the op tests' bounds
// allow. Reductions are fixed trees or in-order loops: two runs give the
// same bits.
#include "backend/cuda/kernels.cuh"

#include "backend/dtype.h"
#include "core/hash.h"

namespace {

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

// src/backend/cpu/dropout.c's draw: element i is kept when the top 32 bits of
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

extern "C" {

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
