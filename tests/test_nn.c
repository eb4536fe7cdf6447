/* Dense layers: each forward against a naive double-precision loop, each
 * backward against central finite differences of that reference, and each
 * optimizer against a naive reference update over several steps. */
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

/* The references (double precision, the obvious loops) are tests/ref/ref.c's. */

static double bce(const double *z, const double *y, int B) {
  double loss;
  ref_bce_forward(&loss, z, y, B);
  return loss;
}

/* ---- linear --------------------------------------------------------------- */

static void check_linear_forward(int B, int IN, int OUT, int with_bias, int relu) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 1, (uint64_t)(B * 1000 + IN * 10 + OUT));
  float *in = fvec((size_t)B * IN), *w = fvec((size_t)OUT * IN), *bias = fvec(OUT), *out = fvec((size_t)B * OUT);
  double *din = dvec((size_t)B * IN), *dw = dvec((size_t)OUT * IN), *db = dvec(OUT), *ref = dvec((size_t)B * OUT);
  fill(in, (size_t)B * IN, &r, -1, 1);
  fill(w, (size_t)OUT * IN, &r, -1, 1);
  fill(bias, OUT, &r, -1, 1);
  ref_to_double(din, in, (size_t)B * IN);
  ref_to_double(dw, w, (size_t)OUT * IN);
  ref_to_double(db, bias, OUT);
  ref_linear_forward(ref, din, dw, with_bias ? db : NULL, B, IN, OUT, relu);
  dlrec_status st = relu ? cpu_sgemm_linear_relu_forward(out, in, w, with_bias ? bias : NULL, B, IN, OUT)
                         : cpu_sgemm_linear_forward(out, in, w, with_bias ? bias : NULL, B, IN, OUT);
  int ok = st == DLREC_OK;
  for (int i = 0; ok && i < B * OUT; i++) {
    ok = fabs(out[i] - ref[i]) <= 1e-5 + 1e-5 * fabs(ref[i]);
    if (!ok) test_fail(__FILE__, __LINE__, "linear %dx%dx%d out[%d] = %.9g, reference %.9g", B, IN, OUT, i, out[i],
                       ref[i]);
    if (relu) ok = ok && out[i] >= 0;
  }
  if (st != DLREC_OK) test_fail(__FILE__, __LINE__, "linear forward: %s", dlrec_last_error());
  free(in), free(w), free(bias), free(out), free(din), free(dw), free(db), free(ref);
}

TEST(linear_forward_matches_naive) {
  check_linear_forward(1, 1, 1, 1, 0);
  check_linear_forward(5, 7, 3, 1, 0);
  check_linear_forward(5, 7, 3, 0, 0);
  check_linear_forward(33, 65, 17, 1, 0);
  check_linear_forward(257, 13, 64, 1, 0); /* past the parallel threshold */
  check_linear_forward(5, 7, 3, 1, 1);
  check_linear_forward(257, 13, 130, 1, 1);
  check_linear_forward(9, 4, 2, 0, 1);
}

/* L = Σ R ⊙ relu?(in Wᵀ + b) in double, for finite differences. */
static double linear_loss(const double *in, const double *w, const double *b, const float *R, int B, int IN, int OUT,
                          int relu, double *scratch) {
  ref_linear_forward(scratch, in, w, b, B, IN, OUT, relu);
  return ref_weighted_sum(scratch, R, (size_t)B * OUT);
}

/* Central difference of linear_loss in parameter p (a double array). */
static double fd(double *p, size_t i, const double *in, const double *w, const double *b, const float *R, int B,
                 int IN, int OUT, int relu, double *scratch) {
  const double h = 1e-4, keep = p[i];
  p[i] = keep + h;
  double lp = linear_loss(in, w, b, R, B, IN, OUT, relu, scratch);
  p[i] = keep - h;
  double lm = linear_loss(in, w, b, R, B, IN, OUT, relu, scratch);
  p[i] = keep;
  return (lp - lm) / (2 * h);
}

/* The layer's backward (through the ReLU when relu) against finite
 * differences, with dW and db pre-filled to check that they accumulate. */
static void check_linear_backward(int B, int IN, int OUT, int relu) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 2, (uint64_t)(B * 1000 + IN * 10 + OUT + relu));
  const size_t nin = (size_t)B * IN, nw = (size_t)OUT * IN, nout = (size_t)B * OUT;
  float *in = fvec(nin), *w = fvec(nw), *bias = fvec(OUT), *out = fvec(nout), *R = fvec(nout), *dout = fvec(nout);
  float *din = fvec(nin), *dw = fvec(nw), *db = fvec(OUT);
  double *in_d = dvec(nin), *w_d = dvec(nw), *b_d = dvec(OUT), *scratch = dvec(nout);
  fill(in, nin, &r, -1, 1);
  fill(w, nw, &r, -1, 1);
  fill(bias, OUT, &r, -0.5f, 0.5f);
  fill(R, nout, &r, -1, 1);
  ref_to_double(in_d, in, nin);
  ref_to_double(w_d, w, nw);
  ref_to_double(b_d, bias, OUT);
  for (size_t i = 0; i < nw; i++) dw[i] = 0.25f;
  for (int o = 0; o < OUT; o++) db[o] = -0.5f;
  for (size_t i = 0; i < nin; i++) din[i] = NAN; /* overwritten, not accumulated */
  int fails = 0;
  if (relu) {
    fails += cpu_sgemm_linear_relu_forward(out, in, w, bias, B, IN, OUT) != DLREC_OK;
    fails += cpu_relu_backward(dout, R, out, nout) != DLREC_OK;
  } else {
    memcpy(dout, R, nout * sizeof(float));
  }
  fails += cpu_sgemm_linear_backward(din, dw, db, dout, in, w, B, IN, OUT) != DLREC_OK;
  /* A perturbation of h = 1e-4 moves a pre-activation by at most 1e-4
   * (inputs and weights are within ±1), so a pre-activation that close to
   * zero would put the ReLU's kink inside the finite difference. The draw is
   * fixed; this says so if a change of seed ever makes it happen. */
  ref_linear_forward(scratch, in_d, w_d, b_d, B, IN, OUT, 0);
  for (size_t i = 0; relu && i < nout; i++)
    if (fabs(scratch[i]) < 2e-4) {
      test_fail(__FILE__, __LINE__, "test setup: pre-activation %zu is %.3g, too close to the kink", i, scratch[i]);
      fails++;
    }
  for (size_t i = 0; i < nw && !fails; i++) {
    double g = fd(w_d, i, in_d, w_d, b_d, R, B, IN, OUT, relu, scratch);
    if (!(fabs(dw[i] - 0.25 - g) <= 1e-4 + 1e-4 * fabs(g))) {
      test_fail(__FILE__, __LINE__, "dW[%zu] = %.7g, finite difference %.7g", i, dw[i] - 0.25, g);
      fails++;
    }
  }
  for (int o = 0; o < OUT && !fails; o++) {
    double g = fd(b_d, (size_t)o, in_d, w_d, b_d, R, B, IN, OUT, relu, scratch);
    if (!(fabs(db[o] + 0.5 - g) <= 1e-4 + 1e-4 * fabs(g))) {
      test_fail(__FILE__, __LINE__, "db[%d] = %.7g, finite difference %.7g", o, db[o] + 0.5, g);
      fails++;
    }
  }
  for (size_t i = 0; i < nin && !fails; i++) {
    double g = fd(in_d, i, in_d, w_d, b_d, R, B, IN, OUT, relu, scratch);
    if (!(fabs(din[i] - g) <= 1e-4 + 1e-4 * fabs(g))) {
      test_fail(__FILE__, __LINE__, "din[%zu] = %.7g, finite difference %.7g", i, din[i], g);
      fails++;
    }
  }
  /* din NULL (the first layer) still accumulates the same dW. */
  float *dw2 = fvec(nw);
  for (size_t i = 0; i < nw; i++) dw2[i] = 0.25f;
  if (!fails && cpu_sgemm_linear_backward(NULL, dw2, NULL, dout, in, w, B, IN, OUT) != DLREC_OK) fails++;
  for (size_t i = 0; i < nw && !fails; i++)
    if (dw2[i] != dw[i]) {
      test_fail(__FILE__, __LINE__, "dW without din differs at %zu: %.9g vs %.9g", i, dw2[i], dw[i]);
      fails++;
    }
  if (fails && !test_failed_now()) test_fail(__FILE__, __LINE__, "linear backward: %s", dlrec_last_error());
  free(in), free(w), free(bias), free(out), free(R), free(dout), free(din), free(dw), free(db), free(dw2);
  free(in_d), free(w_d), free(b_d), free(scratch);
}

TEST(linear_backward_matches_finite_differences) {
  check_linear_backward(1, 1, 1, 0);
  check_linear_backward(4, 5, 3, 0);
  check_linear_backward(7, 3, 9, 0);
  check_linear_backward(70, 9, 150, 0); /* bias gradient over several column blocks, threaded */
}

TEST(linear_relu_chain_matches_finite_differences) {
  check_linear_backward(4, 5, 3, 1);
  check_linear_backward(6, 8, 7, 1);
}

TEST(relu_forward_backward) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 3, 0);
  enum { N = 100000 }; /* threaded */
  float *x = fvec(N), *y = fvec(N), *dy = fvec(N), *dx = fvec(N);
  fill(x, N, &r, -1, 1);
  fill(dy, N, &r, -1, 1);
  x[0] = 0.0f;
  CHECK_OK(cpu_relu_forward(y, x, N));
  for (int i = 0; i < N; i++) CHECK(y[i] == (x[i] > 0 ? x[i] : 0.0f));
  CHECK_OK(cpu_relu_backward(dx, dy, y, N));
  /* d relu / dx is 1 above zero and 0 below (and 0 at the kink, by convention). */
  for (int i = 0; i < N; i++) CHECK(dx[i] == (x[i] > 0 ? dy[i] : 0.0f));
  CHECK_OK(cpu_relu_backward(dy, dy, y, N)); /* in place */
  CHECK(memcmp(dy, dx, N * sizeof(float)) == 0);
  CHECK_OK(cpu_relu_forward(x, x, N));
  CHECK(memcmp(x, y, N * sizeof(float)) == 0);
  free(x), free(y), free(dy), free(dx);
}

TEST(sigmoid_stable) {
  float z[] = {0.0f, 1.0f, -1.0f, 20.0f, -20.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f};
  const int n = (int)(sizeof z / sizeof z[0]);
  float s[sizeof z / sizeof z[0]];
  CHECK_OK(cpu_sigmoid(s, z, (size_t)n));
  for (int i = 0; i < n; i++) {
    double ref = 1.0 / (1.0 + exp(-(double)z[i]));
    CHECK(isfinite(s[i]) && s[i] >= 0 && s[i] <= 1);
    CHECK_NEAR(s[i], ref, 1e-30, 1e-6);
  }
  CHECK(s[0] == 0.5f);
}

TEST(invalid_arguments_are_errors) {
  float a[4] = {0}, b[4] = {0}, c[4] = {0};
  CHECK_ERR(cpu_sgemm_linear_forward(a, b, c, NULL, 0, 1, 1), DLREC_ERR_INVALID, "bad shape");
  CHECK_ERR(cpu_sgemm_linear_forward(NULL, b, c, NULL, 1, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_sgemm_linear_backward(a, NULL, NULL, b, c, c, 1, 1, 1), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_sgemm_linear_backward(a, b, NULL, b, c, NULL, 1, 1, 1), DLREC_ERR_INVALID, "weights");
  CHECK_ERR(cpu_dot_forward(a, b, c, 1, 0, 1), DLREC_ERR_INVALID, "bad shape");
  CHECK_ERR(cpu_dot_forward(a, b, c, 1, 257, 1), DLREC_ERR_INVALID, "bad shape");
  CHECK_EQ(dlrec_interaction_dot_dim(26, 16), 16 + 351);
  CHECK_EQ(dlrec_interaction_dot_dim(0, 16), 0);
  double loss;
  CHECK_ERR(cpu_bce_forward(&loss, a, b, 0), DLREC_ERR_INVALID, "batch");
  dlrec_optim_config oc;
  dlrec_optim_config_default(&oc, DLREC_OPTIM_ADAM);
  oc.beta1 = 1.0f;
  CHECK_ERR(cpu_optim_step(&oc, a, b, c, 1, 1), DLREC_ERR_INVALID, "betas");
  dlrec_optim_config_default(&oc, DLREC_OPTIM_ADAM);
  CHECK_ERR(cpu_optim_step(&oc, a, b, NULL, 1, 1), DLREC_ERR_INVALID, "state");
  CHECK_ERR(cpu_optim_step(&oc, a, b, c, 1, 0), DLREC_ERR_INVALID, "step");
  oc.lr = NAN;
  CHECK_ERR(cpu_optim_step(&oc, a, b, c, 1, 1), DLREC_ERR_INVALID, "lr");
}

/* ---- interaction ----------------------------------------------------------- */

static void check_interaction_forward(int B, int F, int D) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 4, (uint64_t)(B * 10000 + F * 100 + D));
  const size_t W = dlrec_interaction_dot_dim(F, D);
  float *x = fvec((size_t)B * D), *emb = fvec((size_t)B * F * D), *out = fvec((size_t)B * W);
  double *xd = dvec((size_t)B * D), *ed = dvec((size_t)B * F * D), *ref = dvec((size_t)B * W);
  fill(x, (size_t)B * D, &r, -1, 1);
  fill(emb, (size_t)B * F * D, &r, -1, 1);
  ref_to_double(xd, x, (size_t)B * D);
  ref_to_double(ed, emb, (size_t)B * F * D);
  ref_dot_forward(ref, xd, ed, B, F, D);
  for (size_t i = 0; i < (size_t)B * W; i++) out[i] = NAN; /* every output must be written */
  if (cpu_dot_forward(out, x, emb, B, F, D) != DLREC_OK)
    test_fail(__FILE__, __LINE__, "interaction forward: %s", dlrec_last_error());
  for (size_t i = 0; i < (size_t)B * W && !test_failed_now(); i++)
    if (!(fabs(out[i] - ref[i]) <= 1e-5 + 1e-5 * fabs(ref[i])))
      test_fail(__FILE__, __LINE__, "interaction B=%d F=%d D=%d: out[%zu] = %.9g, reference %.9g", B, F, D, i, out[i],
                ref[i]);
  free(x), free(emb), free(out), free(xd), free(ed), free(ref);
}

TEST(interaction_forward_matches_naive) {
  check_interaction_forward(1, 1, 1);
  check_interaction_forward(3, 5, 4);
  check_interaction_forward(2, 26, 16);   /* Criteo Kaggle */
  check_interaction_forward(130, 26, 16); /* threaded */
  check_interaction_forward(3, 9, 32);
  check_interaction_forward(2, 8, 40);  /* two chunks of D, generic width */
  check_interaction_forward(2, 17, 33); /* a one-wide second chunk */
  check_interaction_forward(2, 3, 128);
  check_interaction_forward(2, 5, 48);
  check_interaction_forward(1, 256, 3); /* the most embeddings */
}

TEST(interaction_output_order_is_the_reference_order) {
  /* Hand-made: x = (1, 0), e1 = (0, 2), e2 = (3, 1). Pairs in the order
   * (1,0), (2,0), (2,1): e1·x = 0, e2·x = 3, e2·e1 = 2. */
  float x[2] = {1, 0}, emb[4] = {0, 2, 3, 1}, out[5];
  CHECK_OK(cpu_dot_forward(out, x, emb, 1, 2, 2));
  CHECK(out[0] == 1 && out[1] == 0 && out[2] == 0 && out[3] == 3 && out[4] == 2);
}

static void check_interaction_backward(int B, int F, int D) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 5, (uint64_t)(B * 10000 + F * 100 + D));
  const size_t W = dlrec_interaction_dot_dim(F, D), nx = (size_t)B * D, ne = (size_t)B * F * D;
  float *x = fvec(nx), *emb = fvec(ne), *R = fvec((size_t)B * W), *dx = fvec(nx), *demb = fvec(ne);
  double *xd = dvec(nx), *ed = dvec(ne), *out = dvec((size_t)B * W);
  fill(x, nx, &r, -1, 1);
  fill(emb, ne, &r, -1, 1);
  fill(R, (size_t)B * W, &r, -1, 1);
  ref_to_double(xd, x, nx);
  ref_to_double(ed, emb, ne);
  for (size_t i = 0; i < nx; i++) dx[i] = NAN; /* overwritten, not accumulated */
  for (size_t i = 0; i < ne; i++) demb[i] = NAN;
  if (cpu_dot_backward(dx, demb, R, x, emb, B, F, D) != DLREC_OK)
    test_fail(__FILE__, __LINE__, "interaction backward: %s", dlrec_last_error());
  /* L = Σ R ⊙ out is quadratic in the inputs: central differences are exact
   * up to rounding. */
  const double h = 1e-3;
  for (size_t i = 0; i < nx + ne && !test_failed_now(); i++) {
    double *p = i < nx ? &xd[i] : &ed[i - nx];
    const double keep = *p;
    *p = keep + h;
    ref_dot_forward(out, xd, ed, B, F, D);
    double lp = ref_weighted_sum(out, R, (size_t)B * W);
    *p = keep - h;
    ref_dot_forward(out, xd, ed, B, F, D);
    double lm = ref_weighted_sum(out, R, (size_t)B * W);
    *p = keep;
    double g = (lp - lm) / (2 * h), got = i < nx ? dx[i] : demb[i - nx];
    if (!(fabs(got - g) <= 1e-4 + 1e-4 * fabs(g)))
      test_fail(__FILE__, __LINE__, "interaction B=%d F=%d D=%d: %s[%zu] = %.7g, finite difference %.7g", B, F, D,
                i < nx ? "dx" : "demb", i < nx ? i : i - nx, got, g);
  }
  free(x), free(emb), free(R), free(dx), free(demb), free(xd), free(ed), free(out);
}

TEST(interaction_backward_matches_finite_differences) {
  check_interaction_backward(1, 1, 1);
  check_interaction_backward(2, 3, 5);
  check_interaction_backward(2, 4, 16);
  check_interaction_backward(1, 26, 16);
  check_interaction_backward(1, 3, 40);
  check_interaction_backward(1, 2, 64);
  check_interaction_backward(1, 5, 48); /* a multiple of 16 without its own instance */
  check_interaction_backward(1, 9, 128);
}

TEST(interaction_backward_threaded_matches_serial) {
  /* A batch large enough for OpenMP gives bitwise what one thread gives:
   * samples are independent. */
  const int B = 300, F = 26, D = 16;
  const size_t W = dlrec_interaction_dot_dim(F, D);
  dlrec_rng r;
  dlrec_rng_seed(&r, 6, 0);
  float *x = fvec((size_t)B * D), *emb = fvec((size_t)B * F * D), *dout = fvec((size_t)B * W);
  float *dx1 = fvec((size_t)B * D), *de1 = fvec((size_t)B * F * D), *dx2 = fvec((size_t)B * D),
        *de2 = fvec((size_t)B * F * D);
  fill(x, (size_t)B * D, &r, -1, 1);
  fill(emb, (size_t)B * F * D, &r, -1, 1);
  fill(dout, (size_t)B * W, &r, -1, 1);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  dlrec_status s1 = cpu_dot_backward(dx1, de1, dout, x, emb, B, F, D);
  omp_set_num_threads(4);
  dlrec_status s2 = cpu_dot_backward(dx2, de2, dout, x, emb, B, F, D);
  omp_set_num_threads(threads);
  CHECK_OK(s1);
  CHECK_OK(s2);
  CHECK(memcmp(dx1, dx2, (size_t)B * D * sizeof(float)) == 0);
  CHECK(memcmp(de1, de2, (size_t)B * F * D * sizeof(float)) == 0);
  free(x), free(emb), free(dout), free(dx1), free(de1), free(dx2), free(de2);
}

/* ---- loss ------------------------------------------------------------------ */

TEST(bce_forward_matches_reference) {
  float z[] = {0.0f, 2.0f, -3.0f, 50.0f, -50.0f, 100.0f, -100.0f, 0.5f};
  float y[] = {1.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 0.3f};
  const int B = (int)(sizeof z / sizeof z[0]);
  double zd[sizeof z / sizeof z[0]], yd[sizeof z / sizeof z[0]], loss;
  ref_to_double(zd, z, (size_t)B);
  ref_to_double(yd, y, (size_t)B);
  CHECK_OK(cpu_bce_forward(&loss, z, y, B));
  CHECK(isfinite(loss));
  CHECK_NEAR(loss, bce(zd, yd, B), 1e-12, 1e-12);
  /* Known values: z = 0 costs log 2; a confident wrong answer costs |z|. */
  CHECK_OK(cpu_bce_forward(&loss, z, y, 1));
  CHECK_NEAR(loss, log(2.0), 1e-12, 0);
  float zw = 100.0f, yw = 0.0f;
  CHECK_OK(cpu_bce_forward(&loss, &zw, &yw, 1));
  CHECK_NEAR(loss, 100.0, 1e-9, 0);
}

TEST(bce_backward_matches_finite_differences) {
  float z[] = {0.0f, 2.0f, -3.0f, 30.0f, -30.0f, 0.7f, -0.2f};
  float y[] = {1.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 0.5f};
  const int B = (int)(sizeof z / sizeof z[0]);
  float dz[sizeof z / sizeof z[0]];
  double zd[sizeof z / sizeof z[0]], yd[sizeof z / sizeof z[0]];
  ref_to_double(zd, z, (size_t)B);
  ref_to_double(yd, y, (size_t)B);
  CHECK_OK(cpu_bce_backward(dz, z, y, B));
  for (int b = 0; b < B; b++) {
    const double h = 1e-5, keep = zd[b];
    zd[b] = keep + h;
    double lp = bce(zd, yd, B);
    zd[b] = keep - h;
    double lm = bce(zd, yd, B);
    zd[b] = keep;
    CHECK_NEAR(dz[b], (lp - lm) / (2 * h), 1e-7, 1e-5);
  }
  CHECK_OK(cpu_bce_backward(z, z, y, B)); /* in place */
  CHECK(memcmp(z, dz, sizeof dz) == 0);
}

/* ---- dense optimizers ------------------------------------------------------ */

/* Several steps of the optimizer against the formulas written out in double,
 * with the given eps and Adagrad's initial accumulator. */
static void check_optimizer_eps(dlrec_optim_kind kind, float wd, float eps, float accum0) {
  enum { N = 40000, STEPS = 5 }; /* threaded */
  dlrec_optim_config c;
  dlrec_optim_config_default(&c, kind);
  c.lr = 0.05f;
  c.weight_decay = wd;
  c.eps = eps;
  c.initial_accumulator = accum0;
  dlrec_rng r;
  dlrec_rng_seed(&r, 7, (uint64_t)kind);
  float *w = fvec(N), *g = fvec(N), *state = fvec(dlrec_optim_state_floats(&c, N));
  /* The reference's state, laid out as the op's: Adam's m then v, or
   * Adagrad's sums. */
  double *wr = dvec(N), *gd = dvec(N), *rs = dvec(2 * (size_t)N);
  const double *m = rs, *v = rs + N, *s = rs;
  fill(w, N, &r, -1, 1);
  ref_to_double(wr, w, N);
  if (kind == DLREC_OPTIM_ADAGRAD)
    for (int i = 0; i < N; i++) rs[i] = c.initial_accumulator;
  if (dlrec_optim_state_init(&c, state, N) != DLREC_OK) test_fail(__FILE__, __LINE__, "%s", dlrec_last_error());
  for (int t = 1; t <= STEPS && !test_failed_now(); t++) {
    fill(g, N, &r, -1, 1);
    if (t == 3) g[0] = 0.0f; /* a zero gradient still moves Adam's moments */
    if (cpu_optim_step(&c, w, g, state, N, (uint64_t)t) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "%s", dlrec_last_error());
    ref_to_double(gd, g, N);
    ref_optim_step(&c, wr, gd, rs, N, (uint64_t)t);
    for (int i = 0; i < N && !test_failed_now(); i++) {
      if (!(fabs(w[i] - wr[i]) <= 1e-5 + 1e-5 * fabs(wr[i])))
        test_fail(__FILE__, __LINE__, "kind %d step %d: w[%d] = %.9g, reference %.9g", kind, t, i, w[i], wr[i]);
      if (kind == DLREC_OPTIM_ADAM && !(fabs(state[i] - m[i]) <= 1e-6 && fabs(state[N + i] - v[i]) <= 1e-6))
        test_fail(__FILE__, __LINE__, "Adam state %d: m %.9g vs %.9g, v %.9g vs %.9g", i, state[i], m[i],
                  state[N + i], v[i]);
      if (kind == DLREC_OPTIM_ADAGRAD && !(fabs(state[i] - s[i]) <= 1e-5 * s[i]))
        test_fail(__FILE__, __LINE__, "Adagrad state %d: %.9g vs %.9g", i, state[i], s[i]);
    }
  }
  free(w), free(g), free(state), free(wr), free(gd), free(rs);
}

/* The same with the default eps, and Adagrad's accumulator starting at 0.1. */
static void check_optimizer(dlrec_optim_kind kind, float wd) {
  dlrec_optim_config c;
  dlrec_optim_config_default(&c, kind);
  check_optimizer_eps(kind, wd, c.eps, kind == DLREC_OPTIM_ADAGRAD ? 0.1f : 0.0f);
}

TEST(sgd_matches_reference) {
  check_optimizer(DLREC_OPTIM_SGD, 0.0f);
  check_optimizer(DLREC_OPTIM_SGD, 0.01f);
}

TEST(adam_matches_reference) {
  check_optimizer(DLREC_OPTIM_ADAM, 0.0f);
  check_optimizer(DLREC_OPTIM_ADAM, 0.01f);
}

TEST(adagrad_matches_reference) {
  check_optimizer(DLREC_OPTIM_ADAGRAD, 0.0f);
  check_optimizer(DLREC_OPTIM_ADAGRAD, 0.01f);
}

/* With the default eps (1e-10) against accumulators of 0.1 and more, eps
 * added outside or inside the square root agree to float precision, so the
 * reference above cannot tell where eps goes. An eps of 0.1 against
 * accumulators that start at zero (so sqrt(s) is about |g|, often below 0.1)
 * changes the step by tens of percent if eps moves inside the root. */
TEST(adagrad_eps_that_matters_matches_reference) {
  check_optimizer_eps(DLREC_OPTIM_ADAGRAD, 0.0f, 0.1f, 0.0f);
  check_optimizer_eps(DLREC_OPTIM_ADAGRAD, 0.01f, 0.1f, 0.001f);
}

TEST(optimizer_state_sizes) {
  dlrec_optim_config c;
  dlrec_optim_config_default(&c, DLREC_OPTIM_SGD);
  CHECK_EQ(dlrec_optim_state_floats(&c, 10), 0);
  CHECK_OK(dlrec_optim_state_init(&c, NULL, 10));
  dlrec_optim_config_default(&c, DLREC_OPTIM_ADAM);
  CHECK_EQ(dlrec_optim_state_floats(&c, 10), 20);
  dlrec_optim_config_default(&c, DLREC_OPTIM_ADAGRAD);
  CHECK_EQ(dlrec_optim_state_floats(&c, 10), 10);
  c.initial_accumulator = 0.5f;
  float s[10];
  CHECK_OK(dlrec_optim_state_init(&c, s, 10));
  for (int i = 0; i < 10; i++) CHECK(s[i] == 0.5f);
}

/* ---- rows picked by index ------------------------------------------------ */

/* scatter_rows sets each named row of dst to its row of src, bit for bit,
 * and no other row, threaded (over PARALLEL_MIN values) and not; gather_rows
 * brings the same rows back; an index past dst's rows is refused before
 * anything is written. */
TEST(scatter_rows_sets_the_named_rows_only) {
  const size_t widths[] = {3, 128};
  for (int w = 0; w < 2; w++) {
    const size_t W = widths[w], rows = 1000, n = 400;
    dlrec_rng r;
    dlrec_rng_seed(&r, 9, (uint64_t)w);
    uint32_t *idx = malloc(n * sizeof *idx);
    for (size_t i = 0; i < n; i++) idx[i] = (uint32_t)(i * 7 % rows); /* distinct: 7 and 1000 coprime */
    float *dst = fvec(rows * W), *src = fvec(n * W), *want = fvec(rows * W), *back = fvec(n * W);
    fill(dst, rows * W, &r, -1, 1);
    fill(src, n * W, &r, -1, 1);
    memcpy(want, dst, rows * W * sizeof(float));
    for (size_t i = 0; i < n; i++)
      for (size_t c = 0; c < W; c++) want[(size_t)idx[i] * W + c] = src[i * W + c];
    CHECK_OK(cpu_scatter_rows(dst, rows, idx, src, n, W));
    CHECK(!memcmp(dst, want, rows * W * sizeof(float)));
    CHECK_OK(cpu_gather_rows(back, dst, rows, idx, n, W));
    CHECK(!memcmp(back, src, n * W * sizeof(float)));
    idx[n - 1] = (uint32_t)rows;
    fill(src, n * W, &r, 2, 3);
    CHECK_ERR(cpu_scatter_rows(dst, rows, idx, src, n, W), DLREC_ERR_INVALID, "scatter_rows: index 399 is row 1000");
    CHECK(!memcmp(dst, want, rows * W * sizeof(float)));
    free(idx), free(dst), free(src), free(want), free(back);
  }
}
