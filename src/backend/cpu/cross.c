/* DCN-v2's cross layer, full rank and low rank: forward, backward, and a
 * batch-invariant inference forward.
 *
 * The layer is a linear map of xl followed by an elementwise gate with x0:
 *   u   = xl · Wᵀ + bias                 (B, d), W = U V in the low-rank case
 *   out = x0 ⊙ u + xl
 * so in training the products go through the backend's GEMMs (cpu_gemm, in
 * its precision; NULL: fp32 sgemm), and the backward is the linear layer's
 * backward fed with du = dout ⊙ x0, plus the two direct terms: dxl += dout
 * (the residual) and dx0 += dout ⊙ u.
 *
 * sgemm's summation order depends on the matrix sizes, so for scoring the
 * products run through the packed layer (ops.h), whose order is fixed per output;
 * the elementwise step is then the same multiply and add for every row.
 * Contraction is turned off for Clang (as in linear_packed.c), so that
 * x0 ⊙ u + xl is two roundings wherever the loop is vectorized or not.
 */
#include <stddef.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"
#include "backend/cpu/cpu_gemm.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#define MAX_DIM 65536
/* Elementwise passes smaller than this run on one thread (see linear.c). */
#define PARALLEL_MIN 32768

dlrec_status nn_check_cross(const char *what, int B, int d, int r) {
  if (B < 1 || d < 1 || d > MAX_DIM || r < 0 || r > MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bad shape B=%d d=%d r=%d (1 <= d, r <= %d)", what, B, d, r, MAX_DIM);
  return DLREC_OK;
}

dlrec_status nn_check_cross_lowrank(const char *what, int B, int d, int r) {
  dlrec_status st = nn_check_cross(what, B, d, r);
  if (st == DLREC_OK && r < 1) st = dlrec_error(DLREC_ERR_INVALID, "%s: rank r=%d < 1", what, r);
  return st;
}

size_t dlrec_cross_act_floats(int B, int d, int r) {
  if (B < 1 || d < 1 || d > MAX_DIM || r < 0 || r > MAX_DIM) return 0;
  return (size_t)B * ((size_t)d + (size_t)r);
}

size_t dlrec_cross_ws_floats(int B, int d, int r) { return dlrec_cross_act_floats(B, d, r); }

/* out = x0 ⊙ u + xl over n values. */
static void gate(float *restrict out, const float *restrict x0, const float *restrict u, const float *xl, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    float p = x0[i] * u[i];
    out[i] = p + xl[i];
  }
}

/* The same with u read from out itself (the inference forward keeps u in
 * out to need no scratch). */
static void gate_inplace(float *out, const float *x0, const float *xl, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    float p = x0[i] * out[i];
    out[i] = p + xl[i];
  }
}

/* du = dout ⊙ x0; dxl = dout (the residual, before the linear part adds on);
 * dx0 += dout ⊙ u. */
static void gate_backward(float *restrict du, float *restrict dx0, const float *restrict dout,
                          const float *restrict x0, const float *restrict u, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    du[i] = dout[i] * x0[i];
    dx0[i] += dout[i] * u[i];
  }
}

/* ---- full rank ------------------------------------------------------------ */

dlrec_status cpu_cross_forward(cpu_gemm *g, float *out, float *act, const float *x0, const float *xl,
                                 const float *w, const float *bias, int B, int d) {
  if (!out || !act || !x0 || !xl || !w || !bias) return dlrec_error(DLREC_ERR_INVALID, "cross_forward: NULL buffer");
  dlrec_status st = nn_check_cross("cross_forward", B, d, 0);
  if (st != DLREC_OK) return st;
  st = cpu_linear_forward(g, act, xl, w, bias, B, d, d, DLREC_ACT_NONE); // u (B, d)
  if (st != DLREC_OK) return st;
  gate(out, x0, act, xl, (size_t)B * d);
  return DLREC_OK;
}

dlrec_status cpu_cross_backward(cpu_gemm *g, float *dx0, float *dxl, float *dw, float *dbias, const float *dout,
                                const float *x0, const float *xl, const float *act, const float *w, float *ws, int B,
                                int d) {
  /* oneDNN's bf16 path fuses the gate's backward with the conversion its
   * GEMM needs (cpu_gemm.c), with the same bits. */
  if (cpu_gemm_fuses_cross(g)) return cpu_gemm_cross_backward(g, dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws, B, d);
  return cpu_cross_backward_composed(g, dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws, B, d);
}

dlrec_status cpu_cross_backward_composed(cpu_gemm *g, float *dx0, float *dxl, float *dw, float *dbias,
                                         const float *dout, const float *x0, const float *xl, const float *act,
                                         const float *w, float *ws, int B, int d) {
  if (!dx0 || !dxl || !dw || !dbias || !dout || !x0 || !xl || !act || !w || !ws)
    return dlrec_error(DLREC_ERR_INVALID, "cross_backward: NULL buffer");
  dlrec_status st = nn_check_cross("cross_backward", B, d, 0);
  if (st != DLREC_OK) return st;
  const size_t n = (size_t)B * d;
  float *du = ws; // (B, d)
  gate_backward(du, dx0, dout, x0, act, n);
  st = cpu_linear_backward(g, dxl, dw, dbias, du, xl, w, B, d, d);
  return st == DLREC_OK ? cpu_add(dxl, dout, n) : st;
}

dlrec_status cpu_cross_infer(float *out, const float *x0, const float *xl, const dlrec_packed_linear *w, int B,
                               int d) {
  if (!out || !x0 || !xl || !w) return dlrec_error(DLREC_ERR_INVALID, "cross_infer: NULL argument");
  dlrec_status st = nn_check_cross("cross_infer", B, d, 0);
  if (st != DLREC_OK) return st;
  st = cpu_packed_forward(out, w, xl, B, DLREC_ACT_NONE); // u (B, d), in out
  if (st != DLREC_OK) return st;
  gate_inplace(out, x0, xl, (size_t)B * d);
  return DLREC_OK;
}

/* ---- low rank ----------------------------------------------------------------- */

dlrec_status cpu_cross_lowrank_forward(cpu_gemm *g, float *out, float *act, const float *x0,
                                         const float *xl, const float *v, const float *u, const float *bias, int B,
                                         int d, int r) {
  if (!out || !act || !x0 || !xl || !v || !u || !bias)
    return dlrec_error(DLREC_ERR_INVALID, "cross_lowrank_forward: NULL buffer");
  dlrec_status st = nn_check_cross_lowrank("cross_lowrank_forward", B, d, r);
  if (st != DLREC_OK) return st;
  float *t = act, *uu = act + (size_t)B * r;
  st = cpu_linear_forward(g, t, xl, v, NULL, B, d, r, DLREC_ACT_NONE);                     // t (B, r) = xl · Vᵀ
  if (st == DLREC_OK) st = cpu_linear_forward(g, uu, t, u, bias, B, r, d, DLREC_ACT_NONE); // u (B, d) = t · Uᵀ + bias
  if (st != DLREC_OK) return st;
  gate(out, x0, uu, xl, (size_t)B * d);
  return DLREC_OK;
}

dlrec_status cpu_cross_lowrank_backward(cpu_gemm *g, float *dx0, float *dxl, float *dv, float *du,
                                          float *dbias, const float *dout, const float *x0, const float *xl,
                                          const float *act, const float *v, const float *u, float *ws, int B, int d,
                                          int r) {
  if (!dx0 || !dxl || !dv || !du || !dbias || !dout || !x0 || !xl || !act || !v || !u || !ws)
    return dlrec_error(DLREC_ERR_INVALID, "cross_lowrank_backward: NULL buffer");
  dlrec_status st = nn_check_cross_lowrank("cross_lowrank_backward", B, d, r);
  if (st != DLREC_OK) return st;
  const size_t n = (size_t)B * d;
  const float *t = act, *uu = act + (size_t)B * r;
  float *dpre = ws, *dt = ws + n; // (B, d), (B, r)
  gate_backward(dpre, dx0, dout, x0, uu, n);
  st = cpu_linear_backward(g, dt, du, dbias, dpre, t, u, B, r, d);
  if (st == DLREC_OK) st = cpu_linear_backward(g, dxl, dv, NULL, dt, xl, v, B, d, r);
  return st == DLREC_OK ? cpu_add(dxl, dout, n) : st;
}

dlrec_status cpu_cross_lowrank_infer(float *out, float *ws, const float *x0, const float *xl,
                                       const dlrec_packed_linear *v, const dlrec_packed_linear *u, int B, int d,
                                       int r) {
  if (!out || !ws || !x0 || !xl || !v || !u)
    return dlrec_error(DLREC_ERR_INVALID, "cross_lowrank_infer: NULL argument");
  dlrec_status st = nn_check_cross_lowrank("cross_lowrank_infer", B, d, r);
  if (st != DLREC_OK) return st;
  st = cpu_packed_forward(ws, v, xl, B, DLREC_ACT_NONE); // t (B, r)
  if (st == DLREC_OK) st = cpu_packed_forward(out, u, ws, B, DLREC_ACT_NONE); // u (B, d), in out
  if (st != DLREC_OK) return st;
  gate_inplace(out, x0, xl, (size_t)B * d);
  return DLREC_OK;
}
