/* The building blocks of the CTR models (src/backend/ops.def, "building
 * blocks"): each forward against a naive double-precision loop, each
 * gradient against central finite differences of that loop, and each
 * inference forward for bitwise batch invariance (a row alone against the
 * same row inside a batch of 33). */
#include <omp.h>

#include "backend/cpu/kernels.h"
#include "core/rng.h"
#include "ref/ref.h"
#include "test.h"

/* Uniform values in [lo, hi). */
static void fill(float *v, size_t n, dlrec_rng *r, float lo, float hi) {
  for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)dlrec_rng_uniform(r);
}

static float *fvec(size_t n) { return calloc(n ? n : 1, sizeof(float)); }
static double *dvec(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

/* A scalar loss of double-precision parameters, for finite differences. */
typedef double (*loss_fn)(void *ctx);

/* Compares got[i] - offset with the central difference of L in p[i], for
 * i < n; reports the first mismatch and returns the number of mismatches. */
static int check_grad(const char *name, const float *got, float offset, double *p, size_t n, loss_fn L, void *ctx,
                      double h, double atol, double rtol) {
  for (size_t i = 0; i < n; i++) {
    const double keep = p[i];
    p[i] = keep + h;
    const double lp = L(ctx);
    p[i] = keep - h;
    const double lm = L(ctx);
    p[i] = keep;
    const double g = (lp - lm) / (2 * h), a = (double)got[i] - offset;
    if (!(fabs(a - g) <= atol + rtol * fabs(g))) {
      test_fail(__FILE__, __LINE__, "%s[%zu] = %.7g, finite difference %.7g", name, i, a, g);
      return 1;
    }
  }
  return 0;
}

/* Finite differences re-run the whole reference per parameter, so they are
 * used up to this many parameters; larger shapes (which exist to reach the
 * threaded paths) check their gradients against a closed form in double. */
#define FD_MAX 4000

/* Each got[i] within atol + rtol·|ref[i]|; reports the first miss. */
static int check_close(const char *name, const float *got, const double *ref, size_t n, double atol, double rtol) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(got[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) {
      test_fail(__FILE__, __LINE__, "%s[%zu] = %.9g, reference %.9g", name, i, got[i], ref[i]);
      return 1;
    }
  return 0;
}

/* ---- batch invariance ------------------------------------------------------- */

/* An inference forward over B rows of up to two inputs (widths w0, w1; w1 =
 * 0 for none) into rows of width wout. */
typedef dlrec_status (*infer_fn)(void *ctx, float *out, const float *in0, const float *in1, int B);

static dlrec_status run_threads(infer_fn f, void *ctx, float *out, const float *in0, const float *in1, int B,
                                int threads) {
  const int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  dlrec_status st = f(ctx, out, in0, in1, B);
  omp_set_num_threads(keep);
  return st;
}

/* Scores a batch of 33 random rows on 2 threads, then rows 0, 1, 5, 16, 31
 * and 32 alone (from a misaligned copy, on 1 and on 2 threads) and rows 7 ..
 * 19 as a batch of 13, and requires the same bits for each row. Returns the
 * number of failures, reported. */
static int check_batch_invariant(const char *name, infer_fn f, void *ctx, int w0, int w1, int wout,
                                 uint64_t seed) {
  enum { B = 33 };
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 33);
  float *in0 = fvec((size_t)B * w0), *in1 = fvec((size_t)B * w1 + 1), *out = fvec((size_t)B * wout);
  float *a0 = fvec((size_t)B * w0 + 1), *a1 = fvec((size_t)B * w1 + 1), *one = fvec((size_t)B * wout);
  fill(in0, (size_t)B * w0, &r, -1, 1);
  fill(in1, (size_t)B * w1, &r, -1, 1);
  int fails = 0;
  if (run_threads(f, ctx, out, in0, w1 ? in1 : NULL, B, 2) != DLREC_OK) {
    test_fail(__FILE__, __LINE__, "%s: batch of %d: %s", name, B, dlrec_last_error());
    fails++;
  }
  static const int rows[] = {0, 1, 5, 16, 31, 32};
  for (size_t k = 0; k < sizeof rows / sizeof rows[0] && !fails; k++)
    for (int threads = 1; threads <= 2 && !fails; threads++) {
      const int b = rows[k];
      /* One float past the allocation's start: the row alone is misaligned. */
      memcpy(a0 + 1, in0 + (size_t)b * w0, (size_t)w0 * sizeof(float));
      memcpy(a1 + 1, in1 + (size_t)b * w1, (size_t)w1 * sizeof(float));
      memset(one, 0xff, (size_t)wout * sizeof(float));
      if (run_threads(f, ctx, one, a0 + 1, w1 ? a1 + 1 : NULL, 1, threads) != DLREC_OK ||
          memcmp(one, out + (size_t)b * wout, (size_t)wout * sizeof(float)) != 0) {
        test_fail(__FILE__, __LINE__, "%s: row %d alone (%d threads) differs from the batch of %d: %s", name, b,
                  threads, B, dlrec_last_error());
        fails++;
      }
    }
  if (!fails && (run_threads(f, ctx, one, in0 + 7 * (size_t)w0, w1 ? in1 + 7 * (size_t)w1 : NULL, 13, 1) !=
                     DLREC_OK ||
                 memcmp(one, out + 7 * (size_t)wout, 13 * (size_t)wout * sizeof(float)) != 0)) {
    test_fail(__FILE__, __LINE__, "%s: rows 7 .. 19 as a batch differ from the batch of %d", name, B);
    fails++;
  }
  free(in0), free(in1), free(out), free(a0), free(a1), free(one);
  return fails;
}

/* ---- concat interaction ------------------------------------------------------- */

typedef struct concat_ctx {
  int B, DX, F, D;
  double *x, *emb, *out;
  const float *R;
} concat_ctx;

static double concat_loss(void *p) {
  concat_ctx *c = p;
  ref_concat_forward(c->out, c->x, c->emb, c->B, c->DX, c->F, c->D);
  return ref_weighted_sum(c->out, c->R, (size_t)c->B * (c->DX + c->F * c->D));
}

static void check_concat(int B, int DX, int F, int D) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 11, (uint64_t)(B * 1000 + DX * 100 + F * 10 + D));
  const size_t nx = (size_t)B * DX, ne = (size_t)B * F * D, W = dlrec_interaction_concat_dim(DX, F, D);
  float *x = fvec(nx), *emb = fvec(ne), *out = fvec(B * W), *R = fvec(B * W), *dx = fvec(nx), *demb = fvec(ne);
  double *xd = dvec(nx), *ed = dvec(ne), *ref = dvec(B * W);
  fill(x, nx, &r, -1, 1), fill(emb, ne, &r, -1, 1), fill(R, B * W, &r, -1, 1);
  ref_to_double(xd, x, nx), ref_to_double(ed, emb, ne);
  int fails = W != (size_t)DX + (size_t)F * D;
  if (fails) test_fail(__FILE__, __LINE__, "concat_dim(%d, %d, %d) = %zu", DX, F, D, W);
  fails = fails || cpu_concat_forward(out, DX ? x : NULL, emb, B, DX, F, D) != DLREC_OK;
  ref_concat_forward(ref, xd, ed, B, DX, F, D);
  fails = fails || check_close("concat out", out, ref, B * W, 0, 0);
  fails = fails || cpu_concat_backward(DX ? dx : NULL, demb, R, B, DX, F, D) != DLREC_OK;
  concat_ctx c = {B, DX, F, D, xd, ed, ref, R};
  if (nx + ne <= FD_MAX) {
    fails = fails || check_grad("concat dx", dx, 0, xd, nx, concat_loss, &c, 1e-3, 1e-6, 1e-6);
    fails = fails || check_grad("concat demb", demb, 0, ed, ne, concat_loss, &c, 1e-3, 1e-6, 1e-6);
  } else {
    /* Closed form: the matching slices of dout. */
    double *gx = dvec(nx), *ge = dvec(ne), *Rd = dvec(B * W);
    ref_to_double(Rd, R, B * W);
    ref_concat_backward(gx, ge, Rd, B, DX, F, D);
    fails = fails || check_close("concat dx", dx, gx, nx, 0, 0) || check_close("concat demb", demb, ge, ne, 0, 0);
    free(Rd);
    free(gx), free(ge);
  }
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "concat: %s", dlrec_last_error());
  free(x), free(emb), free(out), free(R), free(dx), free(demb), free(xd), free(ed), free(ref);
}

TEST(concat_matches_reference_and_finite_differences) {
  check_concat(1, 1, 1, 1);
  check_concat(3, 4, 2, 5);
  check_concat(4, 0, 3, 2); /* no dense columns */
  check_concat(300, 13, 26, 16); /* past the parallel threshold */
}

static dlrec_status concat_infer(void *ctx, float *out, const float *x, const float *emb, int B) {
  const int *s = ctx;
  return cpu_concat_forward(out, x, emb, B, s[0], s[1], s[2]);
}

TEST(concat_is_batch_invariant) {
  int s[3] = {13, 26, 16};
  CHECK(!check_batch_invariant("concat", concat_infer, s, 13, 26 * 16, 13 + 26 * 16, 1));
}

TEST(concat_rejects_bad_arguments) {
  float buf[64] = {0};
  CHECK_ERR(cpu_concat_forward(buf, NULL, buf, 1, 2, 1, 1), DLREC_ERR_INVALID, "NULL dense");
  CHECK_ERR(cpu_concat_forward(buf, buf, buf, 1, -1, 1, 1), DLREC_ERR_INVALID, "DX=-1");
  CHECK_ERR(cpu_concat_forward(buf, buf, buf, 0, 1, 1, 1), DLREC_ERR_INVALID, "B=0");
  CHECK_ERR(cpu_concat_backward(buf, NULL, buf, 1, 1, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_concat_backward(buf, buf, buf, 1, 1, 257, 1), DLREC_ERR_INVALID, "F=257");
  CHECK_EQ(dlrec_interaction_concat_dim(0, 0, 4), 0);
}

/* ---- cross layer ------------------------------------------------------------ */

/* The full-rank reference (r = 0, w) or the low-rank one (v, u). */
static void cross_reference(double *out, const double *x0, const double *xl, const double *w, const double *v,
                      const double *u, const double *bias, int B, int d, int r) {
  if (r == 0) ref_cross_forward(out, x0, xl, w, bias, B, d);
  else ref_cross_lowrank_forward(out, x0, xl, v, u, bias, B, d, r);
}

typedef struct cross_ctx {
  int B, d, r, first; /* first: the layer's xl is x0 itself */
  double *x0, *xl, *w, *v, *u, *bias, *out;
  const float *R;
} cross_ctx;

static double cross_loss(void *p) {
  cross_ctx *c = p;
  cross_reference(c->out, c->x0, c->first ? c->x0 : c->xl, c->w, c->v, c->u, c->bias, c->B, c->d, c->r);
  return ref_weighted_sum(c->out, c->R, (size_t)c->B * c->d);
}

/* Forward against the reference, and every gradient against finite
 * differences; parameter gradients and dx0 are pre-filled to check that
 * they accumulate. first: xl is x0 (the first layer of a stack), and
 * dx0 + dxl is checked as x0's gradient. */
static void check_cross(int B, int d, int r, int first) {
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 12, (uint64_t)(B * 10000 + d * 100 + r * 10 + first));
  const size_t n = (size_t)B * d, nw = r ? 0 : (size_t)d * d, nr = (size_t)r * d;
  float *x0 = fvec(n), *xl = fvec(n), *w = fvec(nw), *v = fvec(nr), *u = fvec(nr), *bias = fvec(d);
  float *out = fvec(n), *act = fvec(dlrec_cross_act_floats(B, d, r)), *ws = fvec(dlrec_cross_ws_floats(B, d, r));
  float *R = fvec(n), *dx0 = fvec(n), *dxl = fvec(n), *dw = fvec(nw), *dv = fvec(nr), *du = fvec(nr);
  float *dbias = fvec(d);
  double *x0d = dvec(n), *xld = dvec(n), *wd = dvec(nw), *vd = dvec(nr), *ud = dvec(nr), *bd = dvec(d);
  double *ref = dvec(n);
  fill(x0, n, &rng, -1, 1), fill(xl, n, &rng, -1, 1), fill(w, nw, &rng, -1, 1), fill(v, nr, &rng, -1, 1);
  fill(u, nr, &rng, -1, 1), fill(bias, d, &rng, -1, 1), fill(R, n, &rng, -1, 1);
  const float *xin = first ? x0 : xl;
  ref_to_double(x0d, x0, n), ref_to_double(xld, xin, n), ref_to_double(wd, w, nw), ref_to_double(vd, v, nr);
  ref_to_double(ud, u, nr), ref_to_double(bd, bias, d);
  for (size_t i = 0; i < n; i++) dx0[i] = 0.25f;
  for (size_t i = 0; i < nw; i++) dw[i] = 0.25f;
  for (size_t i = 0; i < nr; i++) dv[i] = 0.25f, du[i] = 0.25f;
  for (int i = 0; i < d; i++) dbias[i] = 0.25f;
  int fails = 0;
  if (r == 0) {
    fails += cpu_cross_forward(NULL, out, act, x0, xin, w, bias, B, d) != DLREC_OK;
    fails = fails || cpu_cross_backward(NULL, dx0, dxl, dw, dbias, R, x0, xin, act, w, ws, B, d) != DLREC_OK;
  } else {
    fails += cpu_cross_lowrank_forward(NULL, out, act, x0, xin, v, u, bias, B, d, r) != DLREC_OK;
    fails = fails ||
            cpu_cross_lowrank_backward(NULL, dx0, dxl, dv, du, dbias, R, x0, xin, act, v, u, ws, B, d, r) != DLREC_OK;
  }
  cross_reference(ref, x0d, xld, wd, vd, ud, bd, B, d, r);
  fails = fails || check_close("cross out", out, ref, n, 1e-5, 1e-5);
  cross_ctx c = {B, d, r, first, x0d, xld, wd, vd, ud, bd, ref, R};
  const double h = 1e-3, atol = 1e-4, rtol = 1e-4; /* the loss is quadratic: central differences are exact */
  fails = fails || check_grad("cross dw", dw, 0.25f, wd, nw, cross_loss, &c, h, atol, rtol);
  fails = fails || check_grad("cross dv", dv, 0.25f, vd, nr, cross_loss, &c, h, atol, rtol);
  fails = fails || check_grad("cross du", du, 0.25f, ud, nr, cross_loss, &c, h, atol, rtol);
  fails = fails || check_grad("cross dbias", dbias, 0.25f, bd, d, cross_loss, &c, h, atol, rtol);
  if (first) {
    for (size_t i = 0; i < n; i++) dx0[i] += dxl[i];
  } else {
    fails = fails || check_grad("cross dxl", dxl, 0, xld, n, cross_loss, &c, h, atol, rtol);
  }
  fails = fails || check_grad("cross dx0", dx0, 0.25f, x0d, n, cross_loss, &c, h, atol, rtol);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "cross: %s", dlrec_last_error());
  free(x0), free(xl), free(w), free(v), free(u), free(bias), free(out), free(act), free(ws), free(R);
  free(dx0), free(dxl), free(dw), free(dv), free(du), free(dbias);
  free(x0d), free(xld), free(wd), free(vd), free(ud), free(bd), free(ref);
}

TEST(cross_full_rank_matches_reference_and_finite_differences) {
  check_cross(1, 1, 0, 0);
  check_cross(4, 5, 0, 0);
  check_cross(3, 7, 0, 1);
  check_cross(70, 9, 0, 0); /* 70 · 9 · 9 > the OpenBLAS small-matrix path */
}

TEST(cross_low_rank_matches_reference_and_finite_differences) {
  check_cross(1, 1, 1, 0);
  check_cross(4, 6, 2, 0);
  check_cross(3, 5, 1, 1);
  check_cross(5, 3, 4, 0); /* r > d is allowed, if wasteful */
  check_cross(70, 9, 3, 0);
}

/* The forward at a larger shape, where sgemm blocks, against the reference. */
TEST(cross_forward_large_matches_reference) {
  enum { B = 300, d = 96, r = 16 };
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 13, 0);
  const size_t n = (size_t)B * d;
  float *x0 = fvec(n), *xl = fvec(n), *w = fvec(d * d), *v = fvec(r * d), *u = fvec(d * r), *bias = fvec(d);
  float *out = fvec(n), *act = fvec(dlrec_cross_act_floats(B, d, r));
  double *x0d = dvec(n), *xld = dvec(n), *wd = dvec(d * d), *vd = dvec(r * d), *ud = dvec(d * r), *bd = dvec(d);
  double *ref = dvec(n);
  fill(x0, n, &rng, -1, 1), fill(xl, n, &rng, -1, 1), fill(w, d * d, &rng, -0.2f, 0.2f);
  fill(v, r * d, &rng, -0.2f, 0.2f), fill(u, d * r, &rng, -0.2f, 0.2f), fill(bias, d, &rng, -1, 1);
  ref_to_double(x0d, x0, n), ref_to_double(xld, xl, n), ref_to_double(wd, w, d * d), ref_to_double(vd, v, r * d);
  ref_to_double(ud, u, d * r), ref_to_double(bd, bias, d);
  int fails = cpu_cross_forward(NULL, out, act, x0, xl, w, bias, B, d) != DLREC_OK;
  cross_reference(ref, x0d, xld, wd, NULL, NULL, bd, B, d, 0);
  fails = fails || check_close("cross out", out, ref, n, 1e-5, 1e-5);
  fails = fails || cpu_cross_lowrank_forward(NULL, out, act, x0, xl, v, u, bias, B, d, r) != DLREC_OK;
  cross_reference(ref, x0d, xld, NULL, vd, ud, bd, B, d, r);
  fails = fails || check_close("cross lowrank out", out, ref, n, 1e-5, 1e-5);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "cross: %s", dlrec_last_error());
  free(x0), free(xl), free(w), free(v), free(u), free(bias), free(out), free(act);
  free(x0d), free(xld), free(wd), free(vd), free(ud), free(bd), free(ref);
}

typedef struct cross_infer_ctx {
  int d, r;
  dlrec_packed_linear *w, *v, *u;
  float *ws; /* (33, r) */
} cross_infer_ctx;

/* in0 is x0 and in1 is xl. */
static dlrec_status cross_infer(void *p, float *out, const float *x0, const float *xl, int B) {
  cross_infer_ctx *c = p;
  if (c->r == 0) return cpu_cross_infer(out, x0, xl, c->w, B, c->d);
  return cpu_cross_lowrank_infer(out, c->ws, x0, xl, c->v, c->u, B, c->d, c->r);
}

/* The inference forwards against the reference and for batch invariance; d
 * = 200 puts the full-rank layer at B = 33 above the packed layer's parallel
 * threshold. */
TEST(cross_infer_is_batch_invariant_and_matches_reference) {
  enum { B = 9, d = 200, r = 24 };
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 14, 0);
  const size_t n = (size_t)B * d;
  float *w = fvec(d * d), *v = fvec(r * d), *u = fvec(d * r), *bias = fvec(d), *x0 = fvec(n), *xl = fvec(n);
  float *out = fvec(n), *ws = fvec(33 * r);
  double *x0d = dvec(n), *xld = dvec(n), *wd = dvec(d * d), *vd = dvec(r * d), *ud = dvec(d * r), *bd = dvec(d);
  double *ref = dvec(n);
  fill(w, d * d, &rng, -0.1f, 0.1f), fill(v, r * d, &rng, -0.1f, 0.1f), fill(u, d * r, &rng, -0.2f, 0.2f);
  fill(bias, d, &rng, -1, 1), fill(x0, n, &rng, -1, 1), fill(xl, n, &rng, -1, 1);
  ref_to_double(x0d, x0, n), ref_to_double(xld, xl, n), ref_to_double(wd, w, d * d), ref_to_double(vd, v, r * d);
  ref_to_double(ud, u, d * r), ref_to_double(bd, bias, d);
  cross_infer_ctx c = {d, 0, NULL, NULL, NULL, ws};
  int fails = cpu_packed_create(&c.w, w, bias, d, d) != DLREC_OK;
  fails = fails || cpu_packed_create(&c.v, v, NULL, d, r) != DLREC_OK;
  fails = fails || cpu_packed_create(&c.u, u, bias, r, d) != DLREC_OK;
  fails = fails || cross_infer(&c, out, x0, xl, B) != DLREC_OK;
  cross_reference(ref, x0d, xld, wd, NULL, NULL, bd, B, d, 0);
  fails = fails || check_close("cross infer", out, ref, n, 1e-5, 1e-5);
  fails = fails || check_batch_invariant("cross infer", cross_infer, &c, d, d, d, 2);
  c.r = r;
  fails = fails || cross_infer(&c, out, x0, xl, B) != DLREC_OK;
  cross_reference(ref, x0d, xld, NULL, vd, ud, bd, B, d, r);
  fails = fails || check_close("cross lowrank infer", out, ref, n, 1e-5, 1e-5);
  fails = fails || check_batch_invariant("cross lowrank infer", cross_infer, &c, d, d, d, 3);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "cross infer: %s", dlrec_last_error());
  cpu_packed_free(c.w), cpu_packed_free(c.v), cpu_packed_free(c.u);
  free(w), free(v), free(u), free(bias), free(x0), free(xl), free(out), free(ws);
  free(x0d), free(xld), free(wd), free(vd), free(ud), free(bd), free(ref);
}

TEST(cross_rejects_bad_arguments) {
  float buf[64] = {0};
  CHECK_ERR(cpu_cross_forward(NULL, buf, buf, buf, buf, buf, NULL, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_cross_forward(NULL, buf, buf, buf, buf, buf, buf, 1, 0), DLREC_ERR_INVALID, "d=0");
  CHECK_ERR(cpu_cross_lowrank_forward(NULL, buf, buf, buf, buf, buf, buf, buf, 1, 2, 0), DLREC_ERR_INVALID, "r=0");
  CHECK_ERR(cpu_cross_backward(NULL, buf, buf, buf, buf, buf, buf, buf, buf, buf, NULL, 1, 1), DLREC_ERR_INVALID,
            "NULL");
  CHECK_ERR(cpu_cross_lowrank_backward(NULL, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, 0, 1, 1),
            DLREC_ERR_INVALID, "B=0");
  CHECK_ERR(cpu_cross_infer(buf, buf, buf, NULL, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_EQ(dlrec_cross_act_floats(2, 3, 0), 6);
  CHECK_EQ(dlrec_cross_act_floats(2, 3, 4), 14);
  CHECK_EQ(dlrec_cross_ws_floats(2, 3, 4), 14);
  CHECK_EQ(dlrec_cross_act_floats(2, 0, 4), 0);
}

/* ---- mixture of low-rank experts ------------------------------------------------ */

typedef struct mix_ctx {
  int B, d, r, K, first;
  double *x0, *xl, *v, *c, *u, *gate, *bias, *out;
  const float *R;
} mix_ctx;

static double mix_loss(void *p) {
  mix_ctx *m = p;
  ref_cross_mix_forward(m->out, NULL, m->x0, m->first ? m->x0 : m->xl, m->v, m->c, m->u, m->gate, m->bias, m->B,
                        m->d, m->r, m->K);
  return ref_weighted_sum(m->out, m->R, (size_t)m->B * m->d);
}

static void check_mix(int B, int d, int r, int K, int first, uint64_t seed) {
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 24, seed);
  const size_t n = (size_t)B * d, nv = (size_t)K * r * d, nc = (size_t)K * r * r, ng = (size_t)K * d;
  float *x0 = fvec(n), *xl = fvec(n), *v = fvec(nv), *c = fvec(nc), *u = fvec(nv), *g = fvec(ng), *bias = fvec(d);
  float *out = fvec(n), *act = fvec(dlrec_cross_mix_act_floats(B, d, r, K));
  float *ws = fvec(dlrec_cross_mix_ws_floats(B, d, r, K)), *R = fvec(n), *dx0 = fvec(n), *dxl = fvec(n);
  float *dv = fvec(nv), *dc = fvec(nc), *du = fvec(nv), *dg = fvec(ng), *dbias = fvec(d);
  double *x0d = dvec(n), *xld = dvec(n), *vd = dvec(nv), *cd = dvec(nc), *ud = dvec(nv), *gd = dvec(ng);
  double *bd = dvec(d), *ref = dvec(n);
  fill(x0, n, &rng, -1, 1), fill(xl, n, &rng, -1, 1), fill(v, nv, &rng, -1, 1), fill(c, nc, &rng, -1, 1);
  fill(u, nv, &rng, -1, 1), fill(g, ng, &rng, -2, 2), fill(bias, d, &rng, -1, 1), fill(R, n, &rng, -1, 1);
  const float *xin = first ? x0 : xl;
  ref_to_double(x0d, x0, n), ref_to_double(xld, xin, n), ref_to_double(vd, v, nv), ref_to_double(cd, c, nc);
  ref_to_double(ud, u, nv), ref_to_double(gd, g, ng), ref_to_double(bd, bias, d);
  for (size_t i = 0; i < n; i++) dx0[i] = 0.25f;
  for (size_t i = 0; i < nv; i++) dv[i] = du[i] = 0.25f;
  for (size_t i = 0; i < nc; i++) dc[i] = 0.25f;
  for (size_t i = 0; i < ng; i++) dg[i] = 0.25f;
  for (int i = 0; i < d; i++) dbias[i] = 0.25f;
  int fails = cpu_cross_mix_forward(NULL, out, act, x0, xin, v, c, u, g, bias, B, d, r, K) != DLREC_OK;
  fails = fails || cpu_cross_mix_backward(NULL, dx0, dxl, dv, dc, du, dg, dbias, R, x0, xin, act, v, c, u, g, ws, B,
                                            d, r, K) != DLREC_OK;
  double min_pre = INFINITY;
  ref_cross_mix_forward(ref, &min_pre, x0d, xld, vd, cd, ud, gd, bd, B, d, r, K);
  fails = fails || check_close("mix out", out, ref, n, 1e-5, 1e-5);
  /* With values within ±2 and r, d <= 6, h = 1e-4 moves a pre-activation by
   * less than 1e-3; a draw that puts one closer to the kink would make the
   * finite difference wrong. The draws are fixed; this says so if a change
   * of seed ever makes it happen. */
  if (!fails && min_pre < 1e-3) {
    test_fail(__FILE__, __LINE__, "test setup: a pre-activation is %.3g, too close to the kink", min_pre);
    fails++;
  }
  mix_ctx m = {B, d, r, K, first, x0d, xld, vd, cd, ud, gd, bd, ref, R};
  const double h = 1e-4, atol = 2e-4, rtol = 2e-4;
  fails = fails || check_grad("mix dv", dv, 0.25f, vd, nv, mix_loss, &m, h, atol, rtol);
  fails = fails || check_grad("mix dc", dc, 0.25f, cd, nc, mix_loss, &m, h, atol, rtol);
  fails = fails || check_grad("mix du", du, 0.25f, ud, nv, mix_loss, &m, h, atol, rtol);
  fails = fails || check_grad("mix dgate", dg, 0.25f, gd, ng, mix_loss, &m, h, atol, rtol);
  fails = fails || check_grad("mix dbias", dbias, 0.25f, bd, d, mix_loss, &m, h, atol, rtol);
  if (first) {
    for (size_t i = 0; i < n; i++) dx0[i] += dxl[i];
  } else {
    fails = fails || check_grad("mix dxl", dxl, 0, xld, n, mix_loss, &m, h, atol, rtol);
  }
  fails = fails || check_grad("mix dx0", dx0, 0.25f, x0d, n, mix_loss, &m, h, atol, rtol);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "cross mix: %s", dlrec_last_error());
  free(x0), free(xl), free(v), free(c), free(u), free(g), free(bias), free(out), free(act), free(ws), free(R);
  free(dx0), free(dxl), free(dv), free(dc), free(du), free(dg), free(dbias);
  free(x0d), free(xld), free(vd), free(cd), free(ud), free(gd), free(bd), free(ref);
}

TEST(cross_mix_matches_reference_and_finite_differences) {
  check_mix(1, 1, 1, 1, 0, 1);
  check_mix(3, 5, 2, 3, 0, 8);
  check_mix(2, 4, 3, 2, 1, 3);
  check_mix(4, 6, 2, 4, 0, 4);
}

typedef struct mix_infer_ctx {
  int d, r, K;
  dlrec_packed_linear *v[4], *c[4], *u[4], *gate;
  float *ws;
} mix_infer_ctx;

static dlrec_status mix_infer(void *p, float *out, const float *x0, const float *xl, int B) {
  mix_infer_ctx *m = p;
  return cpu_cross_mix_infer(out, m->ws, x0, xl, (const dlrec_packed_linear *const *)m->v,
                               (const dlrec_packed_linear *const *)m->c, (const dlrec_packed_linear *const *)m->u,
                               m->gate, B, m->d, m->r, m->K);
}

TEST(cross_mix_infer_is_batch_invariant_and_matches_reference) {
  enum { B = 5, d = 48, r = 8, K = 4 };
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 25, 0);
  const size_t n = (size_t)B * d, nv = (size_t)K * r * d, nc = (size_t)K * r * r, ng = (size_t)K * d;
  float *x0 = fvec(n), *xl = fvec(n), *v = fvec(nv), *c = fvec(nc), *u = fvec(nv), *g = fvec(ng), *bias = fvec(d);
  float *out = fvec(n);
  double *x0d = dvec(n), *xld = dvec(n), *vd = dvec(nv), *cd = dvec(nc), *ud = dvec(nv), *gd = dvec(ng);
  double *bd = dvec(d), *ref = dvec(n);
  fill(x0, n, &rng, -1, 1), fill(xl, n, &rng, -1, 1), fill(v, nv, &rng, -0.3f, 0.3f), fill(c, nc, &rng, -1, 1);
  fill(u, nv, &rng, -1, 1), fill(g, ng, &rng, -0.5f, 0.5f), fill(bias, d, &rng, -1, 1);
  ref_to_double(x0d, x0, n), ref_to_double(xld, xl, n), ref_to_double(vd, v, nv), ref_to_double(cd, c, nc);
  ref_to_double(ud, u, nv), ref_to_double(gd, g, ng), ref_to_double(bd, bias, d);
  mix_infer_ctx m = {d, r, K, {0}, {0}, {0}, NULL, fvec(dlrec_cross_mix_infer_ws_floats(33, d, r, K))};
  int fails = 0;
  for (int k = 0; k < K; k++) {
    fails += cpu_packed_create(&m.v[k], v + (size_t)k * r * d, NULL, d, r) != DLREC_OK;
    fails += cpu_packed_create(&m.c[k], c + (size_t)k * r * r, NULL, r, r) != DLREC_OK;
    fails += cpu_packed_create(&m.u[k], u + (size_t)k * d * r, bias, r, d) != DLREC_OK;
  }
  fails += cpu_packed_create(&m.gate, g, NULL, d, K) != DLREC_OK;
  fails = fails || mix_infer(&m, out, x0, xl, B) != DLREC_OK;
  ref_cross_mix_forward(ref, NULL, x0d, xld, vd, cd, ud, gd, bd, B, d, r, K);
  fails = fails || check_close("mix infer", out, ref, n, 1e-5, 1e-5);
  fails = fails || check_batch_invariant("cross mix infer", mix_infer, &m, d, d, d, 8);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "cross mix infer: %s", dlrec_last_error());
  for (int k = 0; k < K; k++)
    cpu_packed_free(m.v[k]), cpu_packed_free(m.c[k]), cpu_packed_free(m.u[k]);
  cpu_packed_free(m.gate);
  free(m.ws), free(x0), free(xl), free(v), free(c), free(u), free(g), free(bias), free(out);
  free(x0d), free(xld), free(vd), free(cd), free(ud), free(gd), free(bd), free(ref);
}

TEST(cross_mix_rejects_bad_arguments) {
  float buf[64] = {0};
  CHECK_ERR(cpu_cross_mix_forward(NULL, buf, buf, buf, buf, buf, buf, buf, buf, buf, 1, 2, 1, 65), DLREC_ERR_INVALID,
            "K=65");
  CHECK_ERR(cpu_cross_mix_forward(NULL, buf, buf, buf, buf, buf, buf, buf, NULL, buf, 1, 2, 1, 1), DLREC_ERR_INVALID,
            "NULL");
  CHECK_ERR(cpu_cross_mix_backward(NULL, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf, buf,
                                     buf, 1, 2, 0, 1),
            DLREC_ERR_INVALID, "r=0");
  const dlrec_packed_linear *none[1] = {NULL};
  dlrec_packed_linear *gate = NULL;
  CHECK_OK(cpu_packed_create(&gate, buf, NULL, 2, 1));
  dlrec_status st = cpu_cross_mix_infer(buf, buf, buf, buf, none, none, none, gate, 1, 2, 1, 1);
  cpu_packed_free(gate);
  CHECK_ERR(st, DLREC_ERR_INVALID, "NULL layer of expert 0");
  CHECK_EQ(dlrec_cross_mix_act_floats(2, 3, 1, 2), 2 * 2 * (2 + 3) + 2 * 2);
  CHECK_EQ(dlrec_cross_mix_ws_floats(2, 3, 1, 2), 2 * (9 + 2 + 2));
  CHECK_EQ(dlrec_cross_mix_infer_ws_floats(2, 3, 1, 0), 0);
}

/* ---- FM second-order term ------------------------------------------------- */

typedef struct fm_ctx {
  int B, F, D;
  double *emb, *out;
  const float *R;
} fm_ctx;

static double fm_loss(void *p) {
  fm_ctx *c = p;
  ref_fm_forward(c->out, c->emb, c->B, c->F, c->D);
  return ref_weighted_sum(c->out, c->R, (size_t)c->B);
}

static void check_fm(int B, int F, int D) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 15, (uint64_t)(B * 100000 + F * 1000 + D));
  const size_t ne = (size_t)B * F * D;
  float *emb = fvec(ne), *out = fvec(B), *R = fvec(B), *demb = fvec(ne);
  double *ed = dvec(ne), *ref = dvec(B);
  fill(emb, ne, &r, -1, 1), fill(R, B, &r, -1, 1);
  ref_to_double(ed, emb, ne);
  int fails = cpu_fm_forward(out, emb, B, F, D) != DLREC_OK;
  ref_fm_forward(ref, ed, B, F, D);
  /* fp32 sums of F terms per d, each |term| <= 1: an error of order F·D·u·F. */
  fails = fails || check_close("fm out", out, ref, B, 1e-6 * F * F * D / 8 + 1e-6, 1e-5);
  fails = fails || cpu_fm_backward(demb, R, emb, B, F, D) != DLREC_OK;
  fm_ctx c = {B, F, D, ed, ref, R};
  if (ne <= FD_MAX) {
    fails = fails || check_grad("fm demb", demb, 0, ed, ne, fm_loss, &c, 1e-3, 1e-5 * F, 1e-4);
  } else {
    /* Closed form: dout_b · Σ_{g≠f} e_gd, summed in double. */
    double *ge = dvec(ne), *Rd = dvec(B);
    ref_to_double(Rd, R, B);
    ref_fm_backward(ge, Rd, ed, B, F, D);
    free(Rd);
    fails = fails || check_close("fm demb", demb, ge, ne, 1e-5 * F, 1e-4);
    free(ge);
  }
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "fm: %s", dlrec_last_error());
  free(emb), free(out), free(R), free(demb), free(ed), free(ref);
}

TEST(fm_matches_pairwise_reference_and_finite_differences) {
  check_fm(1, 1, 1); /* one field: no pairs, 0 */
  check_fm(3, 4, 5);
  check_fm(2, 3, 300); /* D past the kernel's chunk of 256 */
  check_fm(70, 26, 16); /* past the parallel threshold */
}

static dlrec_status fm_infer(void *ctx, float *out, const float *emb, const float *unused, int B) {
  const int *s = ctx;
  return cpu_fm_forward(out, emb, B, s[0], s[1]);
}

TEST(fm_is_batch_invariant) {
  int s[2] = {26, 64}; /* 33 · 26 · 64 values: the threaded path */
  CHECK(!check_batch_invariant("fm", fm_infer, s, 26 * 64, 0, 1, 4));
}

TEST(fm_rejects_bad_arguments) {
  float buf[16] = {0};
  CHECK_ERR(cpu_fm_forward(NULL, buf, 1, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_fm_forward(buf, buf, 1, 1, 4097), DLREC_ERR_INVALID, "D=4097");
  CHECK_ERR(cpu_fm_backward(buf, buf, NULL, 1, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_fm_backward(buf, buf, buf, 1, 0, 1), DLREC_ERR_INVALID, "F=0");
}

/* ---- first-order term ---------------------------------------------------------- */

typedef struct wide_ctx {
  int B, F;
  double *w, *bias, *out;
  const float *R;
} wide_ctx;

static double wide_loss(void *p) {
  wide_ctx *c = p;
  ref_wide_forward(c->out, c->w, c->bias, c->B, c->F);
  return ref_weighted_sum(c->out, c->R, (size_t)c->B);
}

static void check_wide(int B, int F) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 16, (uint64_t)(B * 1000 + F));
  const size_t n = (size_t)B * F;
  float *w = fvec(n), *out = fvec(B), *R = fvec(B), *dw = fvec(n), bias, dbias = 0.25f;
  double *wd = dvec(n), *ref = dvec(B), bd;
  fill(w, n, &r, -1, 1), fill(R, B, &r, -1, 1), fill(&bias, 1, &r, -1, 1);
  ref_to_double(wd, w, n), bd = bias;
  wide_ctx c = {B, F, wd, &bd, ref, R};
  wide_loss(&c);
  int fails = cpu_wide_forward(out, w, &bias, B, F) != DLREC_OK;
  fails = fails || check_close("wide out", out, ref, B, 1e-6 * F, 1e-6);
  fails = fails || cpu_wide_backward(dw, &dbias, R, B, F) != DLREC_OK;
  if (n <= FD_MAX) {
    fails = fails || check_grad("wide dw", dw, 0, wd, n, wide_loss, &c, 1e-3, 1e-5, 1e-5);
  } else {
    /* Closed form: dout broadcast over the row. */
    double *gw = dvec(n), *Rd = dvec(B), gb;
    ref_to_double(Rd, R, B);
    ref_wide_backward(gw, &gb, Rd, B, F);
    free(Rd);
    fails = fails || check_close("wide dw", dw, gw, n, 0, 0);
    free(gw);
  }
  fails = fails || check_grad("wide dbias", &dbias, 0.25f, &bd, 1, wide_loss, &c, 1e-3, 1e-5 * sqrt(B), 1e-5);
  /* Without a bias: the plain sum. */
  bd = 0;
  wide_loss(&c);
  fails = fails || cpu_wide_forward(out, w, NULL, B, F) != DLREC_OK;
  fails = fails || check_close("wide out without bias", out, ref, B, 1e-6 * F, 1e-6);
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "wide: %s", dlrec_last_error());
  free(w), free(out), free(R), free(dw), free(wd), free(ref);
}

TEST(wide_matches_reference_and_finite_differences) {
  check_wide(1, 1);
  check_wide(5, 3);
  check_wide(2000, 39); /* past the parallel threshold */
}

static dlrec_status wide_infer(void *ctx, float *out, const float *w, const float *unused, int B) {
  return cpu_wide_forward(out, w, ctx, B, 39);
}

TEST(wide_is_batch_invariant) {
  float bias = 0.375f;
  CHECK(!check_batch_invariant("wide", wide_infer, &bias, 39, 0, 1, 5));
}

TEST(wide_rejects_bad_arguments) {
  float buf[4] = {0};
  CHECK_ERR(cpu_wide_forward(buf, NULL, NULL, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_wide_forward(buf, buf, NULL, 1, 0), DLREC_ERR_INVALID, "F=0");
  CHECK_ERR(cpu_wide_backward(buf, NULL, buf, -1, 1), DLREC_ERR_INVALID, "B=-1");
}

/* ---- dropout --------------------------------------------------------------- */

static dlrec_status dropout_threads(float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t step,
                                    int threads) {
  const int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  dlrec_status st = cpu_dropout_forward(out, in, n, p, seed, step, 1);
  omp_set_num_threads(keep);
  return st;
}

TEST(dropout_keeps_one_minus_p_scaled) {
  enum { N = 200000 };
  const float p = 0.3f;
  dlrec_rng r;
  dlrec_rng_seed(&r, 17, 0);
  float *in = fvec(N), *out = fvec(N);
  fill(in, N, &r, 0.5f, 1.5f); /* no zeros: a zero output means dropped */
  CHECK_OK(cpu_dropout_forward(out, in, N, p, 42, 7, 1));
  size_t kept = 0;
  for (size_t i = 0; i < N; i++) {
    if (out[i] == 0.0f) continue;
    kept++;
    CHECK_NEAR(out[i], in[i] / (1.0 - p), 0, 2e-7);
  }
  /* Binomial(N, 0.7): standard deviation ≈ 205; allow 6 of them. */
  CHECK_NEAR((double)kept, 0.7 * N, 1230, 0);
  free(in), free(out);
}

TEST(dropout_mask_is_a_function_of_seed_step_and_index) {
  enum { N = 100000 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 18, 0);
  float *in = fvec(N), *a = fvec(N), *b = fvec(N), *c = fvec(N);
  fill(in, N, &r, 0.5f, 1.5f);
  /* The same key on 1 and 2 threads (N is past the parallel threshold). */
  CHECK_OK(dropout_threads(a, in, N, 0.5f, 1, 2, 1));
  CHECK_OK(dropout_threads(b, in, N, 0.5f, 1, 2, 2));
  CHECK(memcmp(a, b, N * sizeof(float)) == 0);
  /* A prefix alone draws the same mask: element i's draw depends on i only. */
  CHECK_OK(dropout_threads(c, in, 1000, 0.5f, 1, 2, 1));
  CHECK(memcmp(a, c, 1000 * sizeof(float)) == 0);
  /* Another step, or another seed, gives a different mask: about half the
   * elements flip at p = 0.5. */
  CHECK_OK(dropout_threads(b, in, N, 0.5f, 1, 3, 2));
  CHECK_OK(dropout_threads(c, in, N, 0.5f, 2, 2, 2));
  size_t flips_step = 0, flips_seed = 0;
  for (size_t i = 0; i < N; i++) {
    flips_step += (a[i] == 0) != (b[i] == 0);
    flips_seed += (a[i] == 0) != (c[i] == 0);
  }
  CHECK_NEAR((double)flips_step, 0.5 * N, 1000, 0);
  CHECK_NEAR((double)flips_seed, 0.5 * N, 1000, 0);
  /* In place gives the same values. */
  memcpy(c, in, N * sizeof(float));
  CHECK_OK(cpu_dropout_forward(c, c, N, 0.5f, 1, 2, 1));
  CHECK(memcmp(a, c, N * sizeof(float)) == 0);
  free(in), free(a), free(b), free(c);
}

typedef struct dropout_ctx {
  size_t n;
  float p;
  double *x;
  const float *R;
  float *xf, *out;
} dropout_ctx;

/* The loss through the kernel itself: the mask is the kernel's own, so the
 * finite difference checks that the backward applies the forward's mask and
 * scale (the function is linear, and h is large enough for fp32). */
static double dropout_loss(void *p) {
  dropout_ctx *c = p;
  for (size_t i = 0; i < c->n; i++) c->xf[i] = (float)c->x[i];
  if (cpu_dropout_forward(c->out, c->xf, c->n, c->p, 9, 4, 1) != DLREC_OK) return NAN;
  double s = 0;
  for (size_t i = 0; i < c->n; i++) s += (double)c->out[i] * c->R[i];
  return s;
}

TEST(dropout_backward_matches_finite_differences) {
  enum { N = 300 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 19, 0);
  float *in = fvec(N), *R = fvec(N), *din = fvec(N), *xf = fvec(N), *out = fvec(N);
  double *x = dvec(N);
  fill(in, N, &r, -1, 1), fill(R, N, &r, -1, 1);
  ref_to_double(x, in, N);
  CHECK_OK(cpu_dropout_backward(din, R, N, 0.25f, 9, 4));
  dropout_ctx c = {N, 0.25f, x, R, xf, out};
  CHECK(!check_grad("dropout din", din, 0, x, N, dropout_loss, &c, 0.25, 1e-5, 1e-5));
  /* Some elements were dropped and some kept. */
  size_t zeros = 0;
  for (size_t i = 0; i < N; i++) zeros += din[i] == 0.0f;
  CHECK(zeros > 30 && zeros < 120);
  /* In place. */
  memcpy(xf, R, N * sizeof(float));
  CHECK_OK(cpu_dropout_backward(xf, xf, N, 0.25f, 9, 4));
  CHECK(memcmp(xf, din, N * sizeof(float)) == 0);
  free(in), free(R), free(din), free(xf), free(out), free(x);
}

/* At inference (and at p = 0) dropout is the identity: the same bits, for
 * any batch, in place or not. */
static dlrec_status dropout_infer(void *ctx, float *out, const float *in, const float *unused, int B) {
  return cpu_dropout_forward(out, in, (size_t)B * 40, 0.5f, 3, 5, 0);
}

TEST(dropout_inference_is_identity_and_batch_invariant) {
  enum { N = 1000 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 20, 0);
  float *in = fvec(N), *out = fvec(N);
  fill(in, N, &r, -1, 1);
  CHECK_OK(cpu_dropout_forward(out, in, N, 0.5f, 3, 5, 0));
  CHECK(memcmp(in, out, sizeof(float) * N) == 0);
  memset(out, 0, sizeof(float) * N);
  CHECK_OK(cpu_dropout_forward(out, in, N, 0.0f, 3, 5, 1));
  CHECK(memcmp(in, out, sizeof(float) * N) == 0);
  CHECK_OK(cpu_dropout_backward(out, in, N, 0.0f, 3, 5));
  CHECK(memcmp(in, out, sizeof(float) * N) == 0);
  CHECK(!check_batch_invariant("dropout infer", dropout_infer, NULL, 40, 0, 40, 6));
  free(in), free(out);
}

TEST(dropout_rejects_bad_arguments) {
  float buf[4] = {0};
  CHECK_ERR(cpu_dropout_forward(buf, buf, 4, 1.0f, 0, 0, 1), DLREC_ERR_INVALID, "p=1");
  CHECK_ERR(cpu_dropout_forward(buf, buf, 4, -0.1f, 0, 0, 1), DLREC_ERR_INVALID, "not in [0, 1)");
  CHECK_ERR(cpu_dropout_forward(buf, buf, 4, NAN, 0, 0, 0), DLREC_ERR_INVALID, "not in [0, 1)");
  CHECK_ERR(cpu_dropout_backward(NULL, buf, 4, 0.5f, 0, 0), DLREC_ERR_INVALID, "NULL");
}

/* ---- batch normalization ------------------------------------------------------ */

typedef struct bn_ctx {
  int B, C;
  double *x, *gamma, *beta, *out;
  const float *R;
} bn_ctx;

static double bn_loss(void *p) {
  bn_ctx *c = p;
  ref_batchnorm_train_forward(c->out, NULL, c->x, c->gamma, c->beta, NULL, NULL, 0, 1e-5, c->B, c->C);
  return ref_weighted_sum(c->out, c->R, (size_t)c->B * c->C);
}

static void check_bn(int B, int C, int grads) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 21, (uint64_t)(B * 1000 + C));
  const size_t n = (size_t)B * C;
  float *x = fvec(n), *gamma = fvec(C), *beta = fvec(C), *rm = fvec(C), *rv = fvec(C), *out = fvec(n);
  float *saved = fvec(2 * (size_t)C), *R = fvec(n), *din = fvec(n), *dgamma = fvec(C), *dbeta = fvec(C);
  double *xd = dvec(n), *gd = dvec(C), *bd = dvec(C), *rmd = dvec(C), *rvd = dvec(C), *ref = dvec(n);
  fill(x, n, &r, -1, 3), fill(gamma, C, &r, 0.5f, 1.5f), fill(beta, C, &r, -1, 1), fill(R, n, &r, -1, 1);
  fill(rm, C, &r, -1, 1), fill(rv, C, &r, 0.5f, 2);
  ref_to_double(xd, x, n), ref_to_double(gd, gamma, C), ref_to_double(bd, beta, C), ref_to_double(rmd, rm, C);
  ref_to_double(rvd, rv, C);
  for (int c = 0; c < C; c++) dgamma[c] = dbeta[c] = 0.25f;
  int fails = cpu_batchnorm_train_forward(out, saved, x, gamma, beta, rm, rv, 0.1f, 1e-5f, B, C) != DLREC_OK;
  ref_batchnorm_train_forward(ref, NULL, xd, gd, bd, rmd, rvd, 0.1, 1e-5, B, C);
  fails = fails || check_close("bn out", out, ref, n, 1e-5, 1e-5);
  fails = fails || check_close("bn running_mean", rm, rmd, C, 1e-6, 1e-6);
  fails = fails || check_close("bn running_var", rv, rvd, C, 1e-6, 1e-6);
  if (grads) {
    fails = fails || cpu_batchnorm_backward(din, dgamma, dbeta, R, x, gamma, saved, B, C) != DLREC_OK;
    bn_ctx c = {B, C, xd, gd, bd, ref, R};
    fails = fails || check_grad("bn din", din, 0, xd, n, bn_loss, &c, 1e-4, 1e-4, 1e-4);
    fails = fails || check_grad("bn dgamma", dgamma, 0.25f, gd, C, bn_loss, &c, 1e-4, 1e-4, 1e-4);
    fails = fails || check_grad("bn dbeta", dbeta, 0.25f, bd, C, bn_loss, &c, 1e-4, 1e-4, 1e-4);
  }
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "batchnorm: %s", dlrec_last_error());
  free(x), free(gamma), free(beta), free(rm), free(rv), free(out), free(saved), free(R), free(din), free(dgamma);
  free(dbeta), free(xd), free(gd), free(bd), free(rmd), free(rvd), free(ref);
}

TEST(batchnorm_matches_reference_and_finite_differences) {
  check_bn(2, 1, 1);
  check_bn(4, 3, 1);
  check_bn(7, 5, 1);
  check_bn(9, 70, 1); /* two blocks of columns */
  check_bn(300, 130, 0); /* the threaded path: forward and statistics only */
}

/* Training forward and backward give the same bits on 1 and 2 threads. */
TEST(batchnorm_is_thread_count_invariant) {
  enum { B = 64, C = 600 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 22, 0);
  float *x = fvec(B * C), *g = fvec(C), *be = fvec(C), *R = fvec(B * C);
  float *out[2], *sv[2], *rm[2], *rv[2], *din[2], *dg[2], *db[2];
  fill(x, B * C, &r, -1, 1), fill(g, C, &r, 0.5f, 1.5f), fill(be, C, &r, -1, 1), fill(R, B * C, &r, -1, 1);
  int fails = 0;
  for (int t = 0; t < 2; t++) {
    out[t] = fvec(B * C), sv[t] = fvec(2 * C), rm[t] = fvec(C), rv[t] = fvec(C), din[t] = fvec(B * C);
    dg[t] = fvec(C), db[t] = fvec(C);
    const int keep = omp_get_max_threads();
    omp_set_num_threads(t + 1);
    fails += cpu_batchnorm_train_forward(out[t], sv[t], x, g, be, rm[t], rv[t], 0.1f, 1e-5f, B, C) != DLREC_OK;
    fails += cpu_batchnorm_backward(din[t], dg[t], db[t], R, x, g, sv[t], B, C) != DLREC_OK;
    omp_set_num_threads(keep);
  }
  CHECK(!fails);
  CHECK(memcmp(out[0], out[1], sizeof(float) * B * C) == 0);
  CHECK(memcmp(sv[0], sv[1], sizeof(float) * 2 * C) == 0);
  CHECK(memcmp(rv[0], rv[1], sizeof(float) * C) == 0);
  CHECK(memcmp(din[0], din[1], sizeof(float) * B * C) == 0);
  CHECK(memcmp(dg[0], dg[1], sizeof(float) * C) == 0);
  for (int t = 0; t < 2; t++)
    free(out[t]), free(sv[t]), free(rm[t]), free(rv[t]), free(din[t]), free(dg[t]), free(db[t]);
  free(x), free(g), free(be), free(R);
}

typedef struct bn_infer_ctx {
  int C;
  const float *gamma, *beta, *rm, *rv;
} bn_infer_ctx;

static dlrec_status bn_infer(void *p, float *out, const float *in, const float *unused, int B) {
  bn_infer_ctx *c = p;
  return cpu_batchnorm_infer(out, in, c->gamma, c->beta, c->rm, c->rv, 1e-5f, B, c->C);
}

/* Inference uses the running statistics: against the reference formula, for
 * batch invariance (C = 1000 puts a batch of 33 on the threaded path), and
 * for B = 1, which training refuses. */
TEST(batchnorm_infer_uses_running_stats_and_is_batch_invariant) {
  enum { C = 1000, B = 3 };
  dlrec_rng r;
  dlrec_rng_seed(&r, 23, 0);
  float *g = fvec(C), *be = fvec(C), *rm = fvec(C), *rv = fvec(C), *x = fvec(B * C), *out = fvec(B * C);
  double *ref = dvec(B * C);
  fill(g, C, &r, 0.5f, 1.5f), fill(be, C, &r, -1, 1), fill(rm, C, &r, -1, 1), fill(rv, C, &r, 0.1f, 2);
  fill(x, B * C, &r, -2, 2);
  double *gd = dvec(C), *bed = dvec(C), *rmd = dvec(C), *rvd = dvec(C), *xd = dvec(B * C);
  ref_to_double(gd, g, C), ref_to_double(bed, be, C), ref_to_double(rmd, rm, C), ref_to_double(rvd, rv, C);
  ref_to_double(xd, x, B * C);
  ref_batchnorm_infer(ref, xd, gd, bed, rmd, rvd, 1e-5f, B, C);
  free(gd), free(bed), free(rmd), free(rvd), free(xd);
  CHECK_OK(cpu_batchnorm_infer(out, x, g, be, rm, rv, 1e-5f, B, C));
  CHECK(!check_close("bn infer", out, ref, B * C, 1e-6, 1e-6));
  CHECK_OK(cpu_batchnorm_infer(out, x, g, be, rm, rv, 1e-5f, 1, C));
  bn_infer_ctx ctx = {C, g, be, rm, rv};
  CHECK(!check_batch_invariant("batchnorm infer", bn_infer, &ctx, C, 0, C, 7));
  free(g), free(be), free(rm), free(rv), free(x), free(out), free(ref);
}

TEST(batchnorm_rejects_bad_arguments) {
  float buf[16] = {0};
  CHECK_ERR(cpu_batchnorm_train_forward(buf, buf, buf, buf, buf, buf, buf, 0.1f, 1e-5f, 1, 2), DLREC_ERR_INVALID,
            "B >= 2");
  CHECK_ERR(cpu_batchnorm_train_forward(buf, buf, buf, buf, buf, buf, buf, 1.5f, 1e-5f, 2, 2), DLREC_ERR_INVALID,
            "momentum");
  CHECK_ERR(cpu_batchnorm_train_forward(buf, buf, buf, buf, buf, buf, buf, 0.1f, 0.0f, 2, 2), DLREC_ERR_INVALID,
            "eps");
  CHECK_ERR(cpu_batchnorm_train_forward(buf, NULL, buf, buf, buf, buf, buf, 0.1f, 1e-5f, 2, 2), DLREC_ERR_INVALID,
            "NULL");
  CHECK_ERR(cpu_batchnorm_backward(buf, buf, buf, buf, buf, buf, buf, 2, 0), DLREC_ERR_INVALID, "C=0");
  CHECK_ERR(cpu_batchnorm_infer(buf, buf, buf, buf, buf, buf, 1e-5f, 0, 2), DLREC_ERR_INVALID, "B=0");
}
