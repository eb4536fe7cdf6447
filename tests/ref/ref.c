/* The naive double-precision references (ref.h): the formulas, loop by loop. */
#include "ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scratch of n doubles, zeroed; a test cannot go on without it. */
static double *dz(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  if (!p) abort();
  return p;
}

void ref_to_double(double *d, const float *f, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = f[i];
}

double ref_weighted_sum(const double *a, const float *r, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += a[i] * r[i];
  return s;
}

double ref_central_difference(ref_loss_fn loss, void *ctx, double *p, double h) {
  const double keep = *p;
  *p = keep + h;
  const double up = loss(ctx);
  *p = keep - h;
  const double down = loss(ctx);
  *p = keep;
  return (up - down) / (2 * h);
}

/* ---- moving rows ------------------------------------------------------------ */

void ref_copy_rows(double *dst, size_t dst_ld, const double *src, size_t src_ld, size_t rows, size_t width) {
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < width; c++) dst[r * dst_ld + c] = src[r * src_ld + c];
}

void ref_fill_rows(double *dst, size_t dst_ld, size_t rows, size_t width, double value) {
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < width; c++) dst[r * dst_ld + c] = value;
}

void ref_add(double *y, const double *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void ref_scale(double *x, size_t n, double s) {
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

void ref_gather_rows(double *dst, const double *src, size_t rows, const uint32_t *idx, size_t n, size_t width) {
  (void)rows;
  for (size_t i = 0; i < n; i++)
    for (size_t c = 0; c < width; c++) dst[i * width + c] = src[(size_t)idx[i] * width + c];
}

void ref_scatter_add_rows(double *dst, size_t rows, const uint32_t *idx, const double *src, size_t n, size_t width) {
  memset(dst, 0, rows * width * sizeof *dst);
  for (size_t i = 0; i < n; i++)
    for (size_t c = 0; c < width; c++) dst[(size_t)idx[i] * width + c] += src[i * width + c];
}

void ref_sum_columns(double *dst, const double *src, size_t B, size_t C) {
  for (size_t c = 0; c < C; c++) {
    double s = 0;
    for (size_t b = 0; b < B; b++) s += src[b * C + c];
    dst[c] = s;
  }
}

/* ---- linear ---------------------------------------------------------------- */

void ref_linear_forward(double *out, const double *in, const double *w, const double *bias, int B, int IN, int OUT,
                        int relu) {
  for (int b = 0; b < B; b++)
    for (int o = 0; o < OUT; o++) {
      double s = bias ? bias[o] : 0.0;
      for (int i = 0; i < IN; i++) s += in[(size_t)b * IN + i] * w[(size_t)o * IN + i];
      out[(size_t)b * OUT + o] = relu && s < 0 ? 0.0 : s;
    }
}

void ref_linear_forward_abs(double *mag, const double *in, const double *w, const double *bias, int B, int IN,
                            int OUT) {
  if (!mag) return;
  for (int b = 0; b < B; b++)
    for (int o = 0; o < OUT; o++) {
      double s = bias ? fabs(bias[o]) : 0.0;
      for (int i = 0; i < IN; i++) s += fabs(in[(size_t)b * IN + i] * w[(size_t)o * IN + i]);
      mag[(size_t)b * OUT + o] = s;
    }
}

void ref_linear_kinks(double *kink, double slack, const double *in, const double *w, const double *bias, int B,
                      int IN, int OUT, const double *mag) {
  if (!mag) return;
  double *pre = dz((size_t)B * OUT);
  ref_linear_forward(pre, in, w, bias, B, IN, OUT, 0);
  for (size_t i = 0; i < (size_t)B * OUT; i++) {
    const double room = fabs(pre[i]) - slack * mag[i];
    if (room < *kink) *kink = room;
  }
  free(pre);
}

/* The backward's three sums, of the terms themselves or (absolute != 0) of
 * their absolute values. */
static void linear_backward_sums(double *din, double *dw, double *dbias, const double *dout, const double *in,
                                 const double *w, int B, int IN, int OUT, int absolute) {
#define TERM(x) (absolute ? fabs(x) : (x))
  for (int o = 0; dw && o < OUT; o++)
    for (int i = 0; i < IN; i++) {
      double s = 0;
      for (int b = 0; b < B; b++) s += TERM(dout[(size_t)b * OUT + o] * in[(size_t)b * IN + i]);
      dw[(size_t)o * IN + i] = s;
    }
  for (int o = 0; dbias && o < OUT; o++) {
    double s = 0;
    for (int b = 0; b < B; b++) s += TERM(dout[(size_t)b * OUT + o]);
    dbias[o] = s;
  }
  for (int b = 0; din && b < B; b++)
    for (int i = 0; i < IN; i++) {
      double s = 0;
      for (int o = 0; o < OUT; o++) s += TERM(dout[(size_t)b * OUT + o] * w[(size_t)o * IN + i]);
      din[(size_t)b * IN + i] = s;
    }
#undef TERM
}

void ref_linear_backward(double *din, double *dw, double *dbias, const double *dout, const double *in,
                         const double *w, int B, int IN, int OUT) {
  linear_backward_sums(din, dw, dbias, dout, in, w, B, IN, OUT, 0);
}

void ref_linear_backward_abs(double *din, double *dw, double *dbias, const double *dout, const double *in,
                             const double *w, int B, int IN, int OUT) {
  linear_backward_sums(din, dw, dbias, dout, in, w, B, IN, OUT, 1);
}

/* ---- activations --------------------------------------------------------------- */

void ref_relu_forward(double *out, const double *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = in[i] > 0 ? in[i] : 0.0;
}

void ref_relu_backward(double *din, const double *dout, const double *out, size_t n) {
  for (size_t i = 0; i < n; i++) din[i] = out[i] > 0 ? dout[i] : 0.0;
}

void ref_sigmoid(double *out, const double *in, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = 1.0 / (1.0 + exp(-in[i]));
}

/* ---- interactions ---------------------------------------------------------------- */

/* Row i of Z = [x; e_1 .. e_F] for sample b. */
static const double *zrow(const double *x, const double *emb, int b, int i, int F, int D) {
  return i == 0 ? x + (size_t)b * D : emb + ((size_t)b * F + i - 1) * D;
}

void ref_dot_forward(double *out, const double *x, const double *emb, int B, int F, int D) {
  const size_t W = (size_t)D + (size_t)F * (F + 1) / 2;
  for (int b = 0; b < B; b++) {
    double *o = out + (size_t)b * W;
    for (int d = 0; d < D; d++) o[d] = x[(size_t)b * D + d];
    size_t k = (size_t)D;
    for (int i = 1; i <= F; i++)
      for (int j = 0; j < i; j++) {
        const double *zi = zrow(x, emb, b, i, F, D), *zj = zrow(x, emb, b, j, F, D);
        double s = 0;
        for (int d = 0; d < D; d++) s += zi[d] * zj[d];
        o[k++] = s;
      }
  }
}

void ref_dot_backward(double *dx, double *demb, const double *dout, const double *x, const double *emb, int B, int F,
                      int D) {
  const size_t W = (size_t)D + (size_t)F * (F + 1) / 2;
  for (int b = 0; b < B; b++) {
    const double *g = dout + (size_t)b * W;
    /* dZ (F+1, D): row 0 is dx, rows 1..F are demb. */
    double *dZ = dz((size_t)(F + 1) * D);
    for (int d = 0; d < D; d++) dZ[d] = g[d];
    size_t k = (size_t)D;
    for (int i = 1; i <= F; i++)
      for (int j = 0; j < i; j++, k++) {
        const double *zi = zrow(x, emb, b, i, F, D), *zj = zrow(x, emb, b, j, F, D);
        for (int d = 0; d < D; d++) {
          dZ[(size_t)i * D + d] += g[k] * zj[d];
          dZ[(size_t)j * D + d] += g[k] * zi[d];
        }
      }
    memcpy(dx + (size_t)b * D, dZ, (size_t)D * sizeof *dZ);
    memcpy(demb + (size_t)b * F * D, dZ + D, (size_t)F * D * sizeof *dZ);
    free(dZ);
  }
}

void ref_concat_forward(double *out, const double *x, const double *emb, int B, int DX, int F, int D) {
  const size_t W = (size_t)DX + (size_t)F * D;
  for (int b = 0; b < B; b++) {
    for (int i = 0; i < DX; i++) out[b * W + i] = x[(size_t)b * DX + i];
    for (int f = 0; f < F; f++)
      for (int d = 0; d < D; d++) out[b * W + DX + (size_t)f * D + d] = emb[((size_t)b * F + f) * D + d];
  }
}

void ref_concat_backward(double *dx, double *demb, const double *dout, int B, int DX, int F, int D) {
  const size_t W = (size_t)DX + (size_t)F * D;
  for (int b = 0; b < B; b++) {
    for (int i = 0; dx && i < DX; i++) dx[(size_t)b * DX + i] = dout[b * W + i];
    for (int i = 0; i < F * D; i++) demb[(size_t)b * F * D + i] = dout[b * W + DX + i];
  }
}

/* ---- DCN-v2 cross layers -------------------------------------------------------------- */

/* s (d) = M · a + bias for one row, M (d, d) when r = 0, else U (V a). */
static void cross_inner(double *s, double *t, const double *a, const double *w, const double *v, const double *u,
                        const double *bias, int d, int r) {
  for (int k = 0; k < r; k++) {
    t[k] = 0;
    for (int i = 0; i < d; i++) t[k] += v[(size_t)k * d + i] * a[i];
  }
  for (int o = 0; o < d; o++) {
    double acc = bias[o];
    if (r == 0)
      for (int i = 0; i < d; i++) acc += w[(size_t)o * d + i] * a[i];
    else
      for (int k = 0; k < r; k++) acc += u[(size_t)o * r + k] * t[k];
    s[o] = acc;
  }
}

static void cross_any_forward(double *out, const double *x0, const double *xl, const double *w, const double *v,
                              const double *u, const double *bias, int B, int d, int r) {
  double *s = dz((size_t)d), *t = dz((size_t)r);
  for (int b = 0; b < B; b++) {
    const double *a = xl + (size_t)b * d;
    cross_inner(s, t, a, w, v, u, bias, d, r);
    for (int o = 0; o < d; o++) out[(size_t)b * d + o] = x0[(size_t)b * d + o] * s[o] + a[o];
  }
  free(s), free(t);
}

void ref_cross_forward(double *out, const double *x0, const double *xl, const double *w, const double *bias, int B,
                       int d) {
  cross_any_forward(out, x0, xl, w, NULL, NULL, bias, B, d, 0);
}

void ref_cross_lowrank_forward(double *out, const double *x0, const double *xl, const double *v, const double *u,
                               const double *bias, int B, int d, int r) {
  cross_any_forward(out, x0, xl, NULL, v, u, bias, B, d, r);
}

/* The backward of either layer: dw for r = 0, dv and du otherwise. */
static void cross_any_backward(double *dx0, double *dxl, double *dw, double *dv, double *du, double *dbias,
                               const double *dout, const double *x0, const double *xl, const double *w,
                               const double *v, const double *u, const double *bias, int B, int d, int r) {
  double *s = dz((size_t)d), *t = dz((size_t)r), *g = dz((size_t)d), *dt = dz((size_t)r);
  if (dw) memset(dw, 0, (size_t)d * d * sizeof *dw);
  if (dv) memset(dv, 0, (size_t)r * d * sizeof *dv);
  if (du) memset(du, 0, (size_t)d * r * sizeof *du);
  memset(dbias, 0, (size_t)d * sizeof *dbias);
  for (int b = 0; b < B; b++) {
    const double *a = xl + (size_t)b * d, *go = dout + (size_t)b * d, *z = x0 + (size_t)b * d;
    cross_inner(s, t, a, w, v, u, bias, d, r);
    for (int o = 0; o < d; o++) {
      g[o] = go[o] * z[o];
      dx0[(size_t)b * d + o] = go[o] * s[o];
      dbias[o] += g[o];
      dxl[(size_t)b * d + o] = go[o];
    }
    if (r == 0) {
      for (int o = 0; o < d; o++)
        for (int i = 0; i < d; i++) {
          dw[(size_t)o * d + i] += g[o] * a[i];
          dxl[(size_t)b * d + i] += g[o] * w[(size_t)o * d + i];
        }
    } else {
      for (int k = 0; k < r; k++) {
        dt[k] = 0;
        for (int o = 0; o < d; o++) {
          du[(size_t)o * r + k] += g[o] * t[k];
          dt[k] += g[o] * u[(size_t)o * r + k];
        }
      }
      for (int k = 0; k < r; k++)
        for (int i = 0; i < d; i++) {
          dv[(size_t)k * d + i] += dt[k] * a[i];
          dxl[(size_t)b * d + i] += dt[k] * v[(size_t)k * d + i];
        }
    }
  }
  free(s), free(t), free(g), free(dt);
}

void ref_cross_backward(double *dx0, double *dxl, double *dw, double *dbias, const double *dout, const double *x0,
                        const double *xl, const double *w, const double *bias, int B, int d) {
  cross_any_backward(dx0, dxl, dw, NULL, NULL, dbias, dout, x0, xl, w, NULL, NULL, bias, B, d, 0);
}

void ref_cross_lowrank_backward(double *dx0, double *dxl, double *dv, double *du, double *dbias, const double *dout,
                                const double *x0, const double *xl, const double *v, const double *u,
                                const double *bias, int B, int d, int r) {
  cross_any_backward(dx0, dxl, NULL, dv, du, dbias, dout, x0, xl, NULL, v, u, bias, B, d, r);
}

/* One row of DCN-Mix's forward, keeping what the backward needs:
 * pre1, pre2 (K, r) the experts' pre-activations, e (K, d), p (K), m (d). */
typedef struct mix_row {
  double *pre1, *pre2, *e, *p, *m;
} mix_row;

static void mix_row_alloc(mix_row *w, int d, int r, int K) {
  w->pre1 = dz((size_t)K * r), w->pre2 = dz((size_t)K * r), w->e = dz((size_t)K * d), w->p = dz((size_t)K);
  w->m = dz((size_t)d);
}

static void mix_row_free(mix_row *w) { free(w->pre1), free(w->pre2), free(w->e), free(w->p), free(w->m); }

static void mix_row_forward(mix_row *w, double *min_pre, const double *a, const double *v, const double *c,
                            const double *u, const double *gate, const double *bias, int d, int r, int K) {
  double mx = -INFINITY, sum = 0;
  for (int k = 0; k < K; k++) {
    double s = 0;
    for (int i = 0; i < d; i++) s += gate[(size_t)k * d + i] * a[i];
    w->p[k] = s;
    mx = fmax(mx, s);
  }
  for (int k = 0; k < K; k++) sum += exp(w->p[k] - mx);
  for (int k = 0; k < K; k++) w->p[k] = exp(w->p[k] - mx) / sum;
  for (int j = 0; j < d; j++) w->m[j] = 0;
  for (int k = 0; k < K; k++) {
    double *p1 = w->pre1 + (size_t)k * r, *p2 = w->pre2 + (size_t)k * r, *e = w->e + (size_t)k * d;
    for (int q = 0; q < r; q++) {
      double s = 0;
      for (int i = 0; i < d; i++) s += v[((size_t)k * r + q) * d + i] * a[i];
      if (min_pre) *min_pre = fmin(*min_pre, fabs(s));
      p1[q] = s;
    }
    for (int q = 0; q < r; q++) {
      double s = 0;
      for (int i = 0; i < r; i++) s += c[((size_t)k * r + q) * r + i] * fmax(p1[i], 0);
      /* Exactly 0 when the first layer is all zero (far from its kinks): no
       * perturbation moves it then. */
      if (min_pre && s != 0) *min_pre = fmin(*min_pre, fabs(s));
      p2[q] = s;
    }
    for (int j = 0; j < d; j++) {
      double s = bias[j];
      for (int i = 0; i < r; i++) s += u[((size_t)k * d + j) * r + i] * fmax(p2[i], 0);
      e[j] = s;
      w->m[j] += w->p[k] * s;
    }
  }
}

void ref_cross_mix_forward(double *out, double *min_pre, const double *x0, const double *xl, const double *v,
                           const double *c, const double *u, const double *gate, const double *bias, int B, int d,
                           int r, int K) {
  mix_row w;
  mix_row_alloc(&w, d, r, K);
  for (int b = 0; b < B; b++) {
    const double *a = xl + (size_t)b * d;
    mix_row_forward(&w, min_pre, a, v, c, u, gate, bias, d, r, K);
    for (int j = 0; j < d; j++) out[(size_t)b * d + j] = x0[(size_t)b * d + j] * w.m[j] + a[j];
  }
  mix_row_free(&w);
}

void ref_cross_mix_backward(double *dx0, double *dxl, double *dv, double *dc, double *du, double *dgate,
                            double *dbias, const double *dout, const double *x0, const double *xl, const double *v,
                            const double *c, const double *u, const double *gate, const double *bias, int B, int d,
                            int r, int K) {
  mix_row w;
  mix_row_alloc(&w, d, r, K);
  double *dm = dz((size_t)d), *dp = dz((size_t)K), *dt2 = dz((size_t)r), *dt1 = dz((size_t)r);
  memset(dv, 0, (size_t)K * r * d * sizeof *dv);
  memset(dc, 0, (size_t)K * r * r * sizeof *dc);
  memset(du, 0, (size_t)K * d * r * sizeof *du);
  memset(dgate, 0, (size_t)K * d * sizeof *dgate);
  memset(dbias, 0, (size_t)d * sizeof *dbias);
  for (int b = 0; b < B; b++) {
    const double *a = xl + (size_t)b * d, *g = dout + (size_t)b * d, *z = x0 + (size_t)b * d;
    double *da = dxl + (size_t)b * d;
    mix_row_forward(&w, NULL, a, v, c, u, gate, bias, d, r, K);
    /* out = x0 ⊙ m + a. */
    for (int j = 0; j < d; j++) {
      dm[j] = g[j] * z[j];
      dx0[(size_t)b * d + j] = g[j] * w.m[j];
      da[j] = g[j];
    }
    /* m = Σ_k p_k e_k, and the softmax's backward. */
    double pdp = 0;
    for (int k = 0; k < K; k++) {
      dp[k] = 0;
      for (int j = 0; j < d; j++) dp[k] += w.e[(size_t)k * d + j] * dm[j];
      pdp += w.p[k] * dp[k];
    }
    for (int k = 0; k < K; k++) {
      const double dlogit = w.p[k] * (dp[k] - pdp);
      for (int i = 0; i < d; i++) {
        dgate[(size_t)k * d + i] += dlogit * a[i];
        da[i] += dlogit * gate[(size_t)k * d + i];
      }
    }
    /* Each expert: e_k = U_k relu(pre2) + bias, pre2 = C_k relu(pre1), pre1 = V_k a. */
    for (int k = 0; k < K; k++) {
      const double *p1 = w.pre1 + (size_t)k * r, *p2 = w.pre2 + (size_t)k * r;
      for (int i = 0; i < r; i++) dt2[i] = 0;
      for (int j = 0; j < d; j++) {
        const double de = w.p[k] * dm[j];
        dbias[j] += de;
        for (int i = 0; i < r; i++) {
          du[((size_t)k * d + j) * r + i] += de * fmax(p2[i], 0);
          dt2[i] += de * u[((size_t)k * d + j) * r + i];
        }
      }
      for (int q = 0; q < r; q++) dt2[q] = p2[q] > 0 ? dt2[q] : 0; /* now d pre2 */
      for (int i = 0; i < r; i++) dt1[i] = 0;
      for (int q = 0; q < r; q++)
        for (int i = 0; i < r; i++) {
          dc[((size_t)k * r + q) * r + i] += dt2[q] * fmax(p1[i], 0);
          dt1[i] += dt2[q] * c[((size_t)k * r + q) * r + i];
        }
      for (int q = 0; q < r; q++) dt1[q] = p1[q] > 0 ? dt1[q] : 0; /* now d pre1 */
      for (int q = 0; q < r; q++)
        for (int i = 0; i < d; i++) {
          dv[((size_t)k * r + q) * d + i] += dt1[q] * a[i];
          da[i] += dt1[q] * v[((size_t)k * r + q) * d + i];
        }
    }
  }
  free(dm), free(dp), free(dt2), free(dt1);
  mix_row_free(&w);
}

/* ---- FM and wide ------------------------------------------------------------------------- */

void ref_fm_forward(double *out, const double *emb, int B, int F, int D) {
  for (int b = 0; b < B; b++) {
    double s = 0;
    for (int f = 0; f < F; f++)
      for (int g = f + 1; g < F; g++)
        for (int d = 0; d < D; d++) s += emb[((size_t)b * F + f) * D + d] * emb[((size_t)b * F + g) * D + d];
    out[b] = s;
  }
}

void ref_fm_backward(double *demb, const double *dout, const double *emb, int B, int F, int D) {
  for (int b = 0; b < B; b++)
    for (int f = 0; f < F; f++)
      for (int d = 0; d < D; d++) {
        double s = 0;
        for (int g = 0; g < F; g++)
          if (g != f) s += emb[((size_t)b * F + g) * D + d];
        demb[((size_t)b * F + f) * D + d] = dout[b] * s;
      }
}

void ref_wide_forward(double *out, const double *w, const double *bias, int B, int F) {
  for (int b = 0; b < B; b++) {
    double s = bias ? *bias : 0.0;
    for (int f = 0; f < F; f++) s += w[(size_t)b * F + f];
    out[b] = s;
  }
}

void ref_wide_backward(double *dw, double *dbias, const double *dout, int B, int F) {
  double s = 0;
  for (int b = 0; b < B; b++) {
    for (int f = 0; f < F; f++) dw[(size_t)b * F + f] = dout[b];
    s += dout[b];
  }
  if (dbias) *dbias = s;
}

/* ---- dropout ------------------------------------------------------------------------------ */

/* SplitMix64's finalizer. */
static uint64_t splitmix_mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int ref_dropout_keep(float p, uint64_t seed, uint64_t step, size_t i) {
  const uint64_t phi = 0x9e3779b97f4a7c15ULL;
  const uint64_t key = splitmix_mix(seed ^ 0x6a09e667f3bcc909ULL) ^ splitmix_mix(step + phi);
  const uint64_t draw = splitmix_mix(key + (uint64_t)(i + 1) * phi);
  return (draw >> 32) >= (uint64_t)floor((double)p * 4294967296.0);
}

void ref_dropout_forward(double *out, const double *in, size_t n, float p, uint64_t seed, uint64_t step, int train) {
  for (size_t i = 0; i < n; i++)
    out[i] = !train ? in[i] : ref_dropout_keep(p, seed, step, i) ? in[i] / (1.0 - (double)p) : 0.0;
}

void ref_dropout_backward(double *din, const double *dout, size_t n, float p, uint64_t seed, uint64_t step) {
  ref_dropout_forward(din, dout, n, p, seed, step, 1);
}

/* ---- batch normalization ----------------------------------------------------------------- */

/* Column c's batch mean and 1/sqrt(biased variance + eps). */
static void bn_stats(double *mean, double *inv, double *var_sum, const double *x, int B, int C, int c, double eps) {
  double m = 0, v = 0;
  for (int b = 0; b < B; b++) m += x[(size_t)b * C + c];
  m /= B;
  for (int b = 0; b < B; b++) v += (x[(size_t)b * C + c] - m) * (x[(size_t)b * C + c] - m);
  *mean = m;
  *inv = 1.0 / sqrt(v / B + eps);
  if (var_sum) *var_sum = v;
}

void ref_batchnorm_train_forward(double *out, double *saved, const double *in, const double *gamma,
                                 const double *beta, double *running_mean, double *running_var, double momentum,
                                 double eps, int B, int C) {
  for (int c = 0; c < C; c++) {
    double mean, inv, vs;
    bn_stats(&mean, &inv, &vs, in, B, C, c, eps);
    for (int b = 0; b < B; b++) out[(size_t)b * C + c] = gamma[c] * (in[(size_t)b * C + c] - mean) * inv + beta[c];
    if (saved) saved[c] = mean, saved[C + c] = inv;
    if (running_mean) running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean;
    if (running_var) running_var[c] = (1 - momentum) * running_var[c] + momentum * vs / (B - 1);
  }
}

void ref_batchnorm_backward(double *din, double *dgamma, double *dbeta, const double *dout, const double *in,
                            const double *gamma, double eps, int B, int C) {
  for (int c = 0; c < C; c++) {
    double mean, inv, sg = 0, sgx = 0;
    bn_stats(&mean, &inv, NULL, in, B, C, c, eps);
    for (int b = 0; b < B; b++) {
      const double g = dout[(size_t)b * C + c], xh = (in[(size_t)b * C + c] - mean) * inv;
      sg += g;
      sgx += g * xh;
    }
    dbeta[c] = sg;
    dgamma[c] = sgx;
    for (int b = 0; b < B; b++) {
      const double g = dout[(size_t)b * C + c], xh = (in[(size_t)b * C + c] - mean) * inv;
      din[(size_t)b * C + c] = gamma[c] * inv / B * (B * g - sg - xh * sgx);
    }
  }
}

void ref_batchnorm_infer(double *out, const double *in, const double *gamma, const double *beta,
                         const double *running_mean, const double *running_var, double eps, int B, int C) {
  for (int b = 0; b < B; b++)
    for (int c = 0; c < C; c++)
      out[(size_t)b * C + c] =
          gamma[c] * (in[(size_t)b * C + c] - running_mean[c]) / sqrt(running_var[c] + eps) + beta[c];
}

/* The backward from the running statistics, its terms' values or (absolute
 * != 0) their absolute values: din = dout · gamma · inv is a single term,
 * so its magnitude is |din|. */
static void bn_infer_backward_terms(double *din, double *dgamma, double *dbeta, const double *dout, const double *in,
                                    const double *gamma, const double *running_mean, const double *running_var,
                                    double eps, int B, int C, int absolute) {
  for (int c = 0; c < C; c++) {
    const double inv = 1.0 / sqrt(running_var[c] + eps);
    double sg = 0, sb = 0;
    for (int b = 0; b < B; b++) {
      const size_t i = (size_t)b * C + c;
      const double xhat = (in[i] - running_mean[c]) * inv, d = dout[i] * gamma[c] * inv;
      din[i] = absolute ? fabs(d) : d;
      sg += absolute ? fabs(dout[i] * xhat) : dout[i] * xhat;
      sb += absolute ? fabs(dout[i]) : dout[i];
    }
    dgamma[c] = sg, dbeta[c] = sb;
  }
}

void ref_batchnorm_infer_backward(double *din, double *dgamma, double *dbeta, const double *dout, const double *in,
                                  const double *gamma, const double *running_mean, const double *running_var,
                                  double eps, int B, int C) {
  bn_infer_backward_terms(din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C, 0);
}

void ref_batchnorm_infer_backward_abs(double *din, double *dgamma, double *dbeta, const double *dout,
                                      const double *in, const double *gamma, const double *running_mean,
                                      const double *running_var, double eps, int B, int C) {
  bn_infer_backward_terms(din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C, 1);
}

/* ---- loss and the dense optimizers ----------------------------------------------------------- */

void ref_bce_forward(double *loss, const double *z, const double *y, int B) {
  double s = 0;
  for (int b = 0; b < B; b++) {
    /* log σ(z) = −log1p(e^−z), log(1 − σ(z)) = −z − log1p(e^−z), each
     * rewritten for z < 0 so that exp never overflows. */
    const double log_p = z[b] >= 0 ? -log1p(exp(-z[b])) : z[b] - log1p(exp(z[b]));
    const double log_q = z[b] >= 0 ? -z[b] - log1p(exp(-z[b])) : -log1p(exp(z[b]));
    s += -y[b] * log_p - (1 - y[b]) * log_q;
  }
  *loss = s / B;
}

void ref_bce_backward(double *dz_out, const double *z, const double *y, int B) {
  for (int b = 0; b < B; b++) dz_out[b] = (1.0 / (1.0 + exp(-z[b])) - y[b]) / B;
}

void ref_optim_step(const dlrec_optim_config *c, double *w, const double *grad, double *state, size_t n,
                    uint64_t t) {
  for (size_t i = 0; i < n; i++) {
    const double g = grad[i] + (double)c->weight_decay * w[i];
    switch (c->kind) {
    case DLREC_OPTIM_SGD: w[i] -= (double)c->lr * g; break;
    case DLREC_OPTIM_ADAM: {
      double *m = state, *v = state + n;
      m[i] = c->beta1 * m[i] + (1 - (double)c->beta1) * g;
      v[i] = c->beta2 * v[i] + (1 - (double)c->beta2) * g * g;
      const double mh = m[i] / (1 - pow(c->beta1, (double)t)), vh = v[i] / (1 - pow(c->beta2, (double)t));
      w[i] -= c->lr * mh / (sqrt(vh) + c->eps);
      break;
    }
    case DLREC_OPTIM_ADAGRAD:
      state[i] += g * g;
      w[i] -= c->lr * g / (sqrt(state[i]) + c->eps);
      break;
    }
  }
}

/* ---- embeddings ---------------------------------------------------------------------------- */

static int pools_by_mean(const dlrec_bag_batch *bags, dlrec_pooling mode, uint32_t c) {
  return mode == DLREC_POOLING_MEAN || (bags->mean_cols && bags->mean_cols[c]);
}

void ref_bag_forward(double *out, const float *rows, uint32_t stride, uint32_t D, const dlrec_bag_batch *bags,
                     dlrec_pooling mode) {
  const uint32_t B = bags->rows, F = bags->cols;
  for (uint32_t b = 0; b < B; b++)
    for (uint32_t c = 0; c < F; c++) {
      double *o = out + ((size_t)b * F + c) * D;
      const uint32_t lo = bags->offsets[c][b], hi = bags->offsets[c][b + 1];
      for (uint32_t d = 0; d < D; d++) {
        double s = 0;
        for (uint32_t k = lo; k < hi; k++) s += rows[(size_t)bags->ids[c][k] * stride + d];
        o[d] = pools_by_mean(bags, mode, c) && hi > lo ? s / (hi - lo) : s;
      }
    }
}

void ref_bag_backward_update(ref_sparse_state *s, const dlrec_sparse_optim_config *c, const dlrec_bag_batch *bags,
                             dlrec_pooling mode, const float *dout, uint64_t rows, uint32_t D) {
  const uint32_t B = bags->rows, F = bags->cols;
  float *g = calloc(rows * D, sizeof *g);
  char *touched = calloc(rows, 1);
  double *gr = calloc(D, sizeof *gr);
  if (!g || !touched || !gr) abort();
  for (uint32_t cc = 0; cc < F; cc++)
    for (uint32_t b = 0; b < B; b++) {
      const uint32_t lo = bags->offsets[cc][b], hi = bags->offsets[cc][b + 1];
      const int mean = pools_by_mean(bags, mode, cc);
      const float inv = mean ? 1.0f / (float)(hi - lo) : 1.0f;
      for (uint32_t k = lo; k < hi; k++) {
        const uint32_t r = bags->ids[cc][k];
        touched[r] = 1;
        for (uint32_t d = 0; d < D; d++) {
          const float go = dout[((size_t)b * F + cc) * D + d];
          g[(size_t)r * D + d] += mean ? inv * go : go;
        }
      }
    }
  s->t++;
  const int table_l2 = c->l2_scope == DLREC_SPARSE_L2_TABLE && c->weight_decay > 0;
  for (uint64_t r = 0; r < rows; r++) {
    /* An untouched row: updated only by dense Adam and a table-wide L2. */
    if (!touched[r] && c->kind != DLREC_SPARSE_ADAM && !table_l2) continue;
    const int l2 = touched[r] || table_l2;
    double *w = s->w + r * D;
    for (uint32_t d = 0; d < D; d++) gr[d] = g[r * D + d] + (l2 ? (double)c->weight_decay * w[d] : 0.0);
    if (c->kind == DLREC_SPARSE_SGD) {
      for (uint32_t d = 0; d < D; d++) w[d] -= c->lr * gr[d];
    } else if (c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD) {
      double sq = 0;
      for (uint32_t d = 0; d < D; d++) sq += gr[d] * gr[d];
      s->accum[r] += sq / D;
      for (uint32_t d = 0; d < D; d++) w[d] -= c->lr * gr[d] / (sqrt(s->accum[r]) + c->eps);
    } else {
      const uint32_t t = c->kind == DLREC_SPARSE_ADAM ? s->t : s->steps[r] + 1;
      s->steps[r] = t;
      double *m = s->m + r * D, *v = s->v + r * D;
      for (uint32_t d = 0; d < D; d++) {
        m[d] = c->beta1 * m[d] + (1 - (double)c->beta1) * gr[d];
        v[d] = c->beta2 * v[d] + (1 - (double)c->beta2) * gr[d] * gr[d];
        const double mh = m[d] / (1 - pow(c->beta1, t)), vh = v[d] / (1 - pow(c->beta2, t));
        w[d] -= c->lr * mh / (sqrt(vh) + c->eps);
      }
    }
  }
  free(g), free(touched), free(gr);
}
