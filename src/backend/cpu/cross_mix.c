/* DCN-v2's mixture of low-rank experts (DCN-Mix): forward, backward and a
 * batch-invariant inference forward.
 *
 * Each of the K experts is a small low-rank MLP of xl, gated by x0:
 *   e_k = relu(relu(xl · V_kᵀ) · C_kᵀ) · U_kᵀ + bias
 * and the layer mixes them with a softmax over per-expert linear gates:
 *   out = x0 ⊙ Σ_k p_k e_k + xl,   p = softmax_k(xl · G_kᵀ)
 * (TorchRec's LowRankMixtureCrossNet, with ReLU as g). In training the
 * products go through the backend's GEMMs (cpu_gemm, in its precision;
 * NULL: fp32 sgemm), one expert at a time; the softmax and the mixture are per
 * row, with the experts summed in k order.
 *
 * The backward, with m = Σ_k p_k e_k and dm = dout ⊙ x0:
 *   dx0 += dout ⊙ m          de_k = p_k dm         dp_k = <dm, e_k>
 *   dlogit_k = p_k (dp_k − Σ_j p_j dp_j)             (the softmax's backward)
 * then each expert's chain of linear layers and ReLUs backwards from de_k,
 * and the gate's linear layer from dlogit; xl's gradient collects the
 * residual, the gate's and every expert's terms.
 *
 * For scoring, every product runs through a packed layer (fixed summation
 * order per output), so a row's value depends on the row alone.
 */
#include <math.h>
#include <stddef.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define MAX_DIM 65536
#define MAX_K 64

dlrec_status nn_check_cross_mix(const char *what, int B, int d, int r, int K) {
  if (B < 1 || d < 1 || d > MAX_DIM || r < 1 || r > MAX_DIM || K < 1 || K > MAX_K)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d d=%d r=%d K=%d (1 <= d, r <= %d, 1 <= K <= %d)", what,
                       B, d, r, K, MAX_DIM, MAX_K);
  return DLREC_OK;
}

static int shape_ok(int B, int d, int r, int K) {
  return B >= 1 && d >= 1 && d <= MAX_DIM && r >= 1 && r <= MAX_DIM && K >= 1 && K <= MAX_K;
}

size_t dlrec_cross_mix_act_floats(int B, int d, int r, int K) {
  if (!shape_ok(B, d, r, K)) return 0;
  return (size_t)K * B * (2 * (size_t)r + d) + (size_t)B * K;
}

size_t dlrec_cross_mix_ws_floats(int B, int d, int r, int K) {
  if (!shape_ok(B, d, r, K)) return 0;
  return (size_t)B * (3 * (size_t)d + 2 * (size_t)r + K);
}

size_t dlrec_cross_mix_infer_ws_floats(int B, int d, int r, int K) {
  if (!shape_ok(B, d, r, K)) return 0;
  return (size_t)B * (2 * (size_t)r + d + K);
}

/* p (B, K) = softmax of logits (B, K) per row, in place; max-shifted so that
 * exp cannot overflow, summed in k order. */
static void softmax_rows(float *p, int B, int K) {
  for (int b = 0; b < B; b++) {
    float *row = p + (size_t)b * K;
    float mx = row[0];
    for (int k = 1; k < K; k++) mx = row[k] > mx ? row[k] : mx;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += row[k] = expf(row[k] - mx);
    for (int k = 0; k < K; k++) row[k] /= sum;
  }
}

/* m (B, d) = Σ_k p[b][k] e_k[b] in k order; e is (K, B, d). */
static void mixture(float *restrict m, const float *restrict p, const float *restrict e, int B, int d, int K) {
#pragma omp parallel for schedule(static) if ((size_t)B * d * K >= 32768)
  for (int b = 0; b < B; b++) {
    float *row = m + (size_t)b * d;
    for (int j = 0; j < d; j++) row[j] = 0.0f;
    for (int k = 0; k < K; k++) {
      const float pk = p[(size_t)b * K + k], *ek = e + ((size_t)k * B + b) * d;
      for (int j = 0; j < d; j++) {
        const float t = pk * ek[j];
        row[j] += t;
      }
    }
  }
}

/* out = x0 ⊙ out + xl, with out holding the mixture. */
static void gate_inplace(float *out, const float *x0, const float *xl, size_t n) {
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (size_t i = 0; i < n; i++) {
    const float t = x0[i] * out[i];
    out[i] = t + xl[i];
  }
}

dlrec_status cpu_cross_mix_forward(cpu_gemm *g, float *out, float *act, const float *x0, const float *xl,
                                     const float *v, const float *c, const float *u, const float *gate,
                                     const float *bias, int B, int d, int r, int K) {
  if (!out || !act || !x0 || !xl || !v || !c || !u || !gate || !bias)
    return dlrec_error(DLREC_ERR_INVALID, "cross_mix_forward: NULL buffer");
  dlrec_status st = nn_check_cross_mix("cross_mix_forward", B, d, r, K);
  if (st != DLREC_OK) return st;
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  for (int k = 0; k < K && st == DLREC_OK; k++) {
    st = cpu_linear_forward(g, t1 + k * Br, xl, v + (size_t)k * r * d, NULL, B, d, r, DLREC_ACT_RELU);
    if (st == DLREC_OK) st = cpu_linear_forward(g, t2 + k * Br, t1 + k * Br, c + (size_t)k * r * r, NULL, B, r, r, DLREC_ACT_RELU);
    if (st == DLREC_OK) st = cpu_linear_forward(g, e + k * Bd, t2 + k * Br, u + (size_t)k * d * r, bias, B, r, d, DLREC_ACT_NONE);
  }
  if (st == DLREC_OK) st = cpu_linear_forward(g, p, xl, gate, NULL, B, d, K, DLREC_ACT_NONE); // logits (B, K)
  if (st != DLREC_OK) return st;
  softmax_rows(p, B, K);
  mixture(out, p, e, B, d, K);
  gate_inplace(out, x0, xl, Bd);
  return DLREC_OK;
}

dlrec_status cpu_cross_mix_backward(cpu_gemm *g, float *dx0, float *dxl, float *dv, float *dc, float *du,
                                      float *dgate, float *dbias, const float *dout, const float *x0, const float *xl,
                                      const float *act, const float *v, const float *c, const float *u,
                                      const float *gate, float *ws, int B, int d, int r, int K) {
  if (!dx0 || !dxl || !dv || !dc || !du || !dgate || !dbias || !dout || !x0 || !xl || !act || !v || !c || !u || !gate ||
      !ws)
    return dlrec_error(DLREC_ERR_INVALID, "cross_mix_backward: NULL buffer");
  dlrec_status st = nn_check_cross_mix("cross_mix_backward", B, d, r, K);
  if (st != DLREC_OK) return st;
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  const float *t1 = act, *t2 = t1 + K * Br, *e = t2 + K * Br, *p = e + K * Bd;
  float *m = ws, *de = m + Bd, *tmp = de + Bd, *dt2 = tmp + Bd, *dt1 = dt2 + Br, *dlogit = dt1 + Br;
  /* m and dm (kept in m's place once dx0 has used m), and dx0 += dout ⊙ m. */
  mixture(m, p, e, B, d, K);
  for (size_t i = 0; i < Bd; i++) {
    dx0[i] += dout[i] * m[i];
    m[i] = dout[i] * x0[i];
  }
  const float *dm = m;
  /* dp_k = <dm, e_k> per row, then the softmax's backward, into dlogit. */
  for (int b = 0; b < B; b++) {
    float *dl = dlogit + (size_t)b * K;
    const float *pr = p + (size_t)b * K;
    double s = 0.0;
    for (int k = 0; k < K; k++) {
      const float *ek = e + ((size_t)k * B + b) * d, *g = dm + (size_t)b * d;
      double dp = 0.0;
      for (int j = 0; j < d; j++) dp += (double)g[j] * ek[j];
      dl[k] = (float)dp;
      s += pr[k] * dp;
    }
    for (int k = 0; k < K; k++) dl[k] = (float)(pr[k] * (dl[k] - s));
  }
  /* The residual, then the gate's term. */
  st = cpu_linear_backward(g, tmp, dgate, NULL, dlogit, xl, gate, B, d, K);
  if (st != DLREC_OK) return st;
  for (size_t i = 0; i < Bd; i++) dxl[i] = dout[i] + tmp[i];
  for (int k = 0; k < K && st == DLREC_OK; k++) {
    const float *t1k = t1 + k * Br, *t2k = t2 + k * Br;
    for (int b = 0; b < B; b++) {
      const float pk = p[(size_t)b * K + k];
      for (int j = 0; j < d; j++) de[(size_t)b * d + j] = pk * dm[(size_t)b * d + j];
    }
    st = cpu_linear_backward(g, dt2, du + (size_t)k * d * r, dbias, de, t2k, u + (size_t)k * d * r, B, r, d);
    if (st == DLREC_OK) st = cpu_relu_backward(dt2, dt2, t2k, Br);
    if (st == DLREC_OK)
      st = cpu_linear_backward(g, dt1, dc + (size_t)k * r * r, NULL, dt2, t1k, c + (size_t)k * r * r, B, r, r);
    if (st == DLREC_OK) st = cpu_relu_backward(dt1, dt1, t1k, Br);
    if (st == DLREC_OK)
      st = cpu_linear_backward(g, tmp, dv + (size_t)k * r * d, NULL, dt1, xl, v + (size_t)k * r * d, B, d, r);
    if (st == DLREC_OK)
      for (size_t i = 0; i < Bd; i++) dxl[i] += tmp[i];
  }
  return st;
}

dlrec_status cpu_cross_mix_infer(float *out, float *ws, const float *x0, const float *xl,
                                   const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                   const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B,
                                   int d, int r, int K) {
  if (!out || !ws || !x0 || !xl || !v || !c || !u || !gate)
    return dlrec_error(DLREC_ERR_INVALID, "cross_mix_infer: NULL argument");
  dlrec_status st = nn_check_cross_mix("cross_mix_infer", B, d, r, K);
  if (st != DLREC_OK) return st;
  for (int k = 0; k < K; k++)
    if (!v[k] || !c[k] || !u[k]) return dlrec_error(DLREC_ERR_INVALID, "cross_mix_infer: NULL layer of expert %d", k);
  const size_t Br = (size_t)B * r, Bd = (size_t)B * d;
  float *t1 = ws, *t2 = t1 + Br, *e = t2 + Br, *p = e + Bd;
  st = cpu_packed_forward(p, gate, xl, B, DLREC_ACT_NONE);
  if (st != DLREC_OK) return st;
  softmax_rows(p, B, K);
  /* The mixture accumulates in out, expert by expert in k order: per output
   * the same chain as mixture() in training. */
  for (size_t i = 0; i < Bd; i++) out[i] = 0.0f;
  for (int k = 0; k < K; k++) {
    st = cpu_packed_forward(t1, v[k], xl, B, DLREC_ACT_RELU);
    if (st == DLREC_OK) st = cpu_packed_forward(t2, c[k], t1, B, DLREC_ACT_RELU);
    if (st == DLREC_OK) st = cpu_packed_forward(e, u[k], t2, B, DLREC_ACT_NONE);
    if (st != DLREC_OK) return st;
    for (int b = 0; b < B; b++) {
      const float pk = p[(size_t)b * K + k];
      for (int j = 0; j < d; j++) {
        const float t = pk * e[(size_t)b * d + j];
        out[(size_t)b * d + j] += t;
      }
    }
  }
  gate_inplace(out, x0, xl, Bd);
  return DLREC_OK;
}
