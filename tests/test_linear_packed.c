/* The batch-invariant linear layer (src/backend/cpu/linear_packed.c): values against a
 * naive double-precision loop, and bitwise invariance of each row's output
 * under the batch size, the row's neighbours and position, and the thread
 * count. */
#include <float.h>
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

/* A layer's random parameters and input. */
typedef struct case_data {
  int B, IN, OUT;
  float *in, *w, *bias; /* (B, IN), (OUT, IN), (OUT) */
} case_data;

static case_data make_case(int B, int IN, int OUT, uint64_t seed) {
  case_data c = {B, IN, OUT, fvec((size_t)B * IN), fvec((size_t)OUT * IN), fvec((size_t)OUT)};
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, (uint64_t)B * 1000003u + (uint64_t)IN * 1009u + (uint64_t)OUT);
  fill(c.in, (size_t)B * IN, &r, -1, 1);
  fill(c.w, (size_t)OUT * IN, &r, -1, 1);
  fill(c.bias, (size_t)OUT, &r, -1, 1);
  return c;
}

static void free_case(case_data *c) { free(c->in), free(c->w), free(c->bias); }

/* Runs the packed forward with the given OpenMP thread count; 0 on success. */
static int run_forward(const dlrec_packed_linear *p, const float *in, float *out, int B, int relu, int threads) {
  int keep = omp_get_max_threads();
  omp_set_num_threads(threads);
  dlrec_status st = cpu_packed_forward(out, p, in, B, (relu) ? DLREC_ACT_RELU : DLREC_ACT_NONE);
  omp_set_num_threads(keep);
  if (st != DLREC_OK) test_fail(__FILE__, __LINE__, "packed_linear_forward: %s", dlrec_last_error());
  return st == DLREC_OK ? 0 : -1;
}

/* ---- against the naive reference ---------------------------------------------- */

/* Widens n floats to a new double array (the reference library's type). */
static double *widen(const float *v, size_t n) {
  double *d = malloc((n ? n : 1) * sizeof(double));
  for (size_t i = 0; d && i < n; i++) d[i] = v[i];
  return d;
}

/* Compares out (B, OUT) with the reference library's double-precision
 * linear layer. The tolerance is the error bound of a sum of IN + 1 terms
 * in fp32, (IN + 1) u Σ|term| with u = 2^-24, which any summation order
 * meets; a ReLU does not widen it. */
static int check_against_reference(const case_data *c, const float *out, int with_bias, int relu) {
  const size_t n_out = (size_t)c->B * c->OUT;
  double *in = widen(c->in, (size_t)c->B * c->IN), *w = widen(c->w, (size_t)c->OUT * c->IN);
  double *bias = widen(c->bias, (size_t)c->OUT), *ref = malloc(n_out * sizeof(double));
  double *mag = malloc(n_out * sizeof(double));
  int bad = !in || !w || !bias || !ref || !mag;
  if (bad) test_fail(__FILE__, __LINE__, "out of memory for the reference of B=%d IN=%d OUT=%d", c->B, c->IN, c->OUT);
  if (!bad) {
    ref_linear_forward(ref, in, w, with_bias ? bias : NULL, c->B, c->IN, c->OUT, relu);
    ref_linear_forward_abs(mag, in, w, with_bias ? bias : NULL, c->B, c->IN, c->OUT);
  }
  for (size_t i = 0; !bad && i < n_out; i++) {
    const double tol = (c->IN + 1) * (FLT_EPSILON / 2) * mag[i] + 1e-30;
    const float v = out[i];
    if (!(fabs(v - ref[i]) <= tol) || (relu && !(v >= 0))) {
      test_fail(__FILE__, __LINE__, "B=%d IN=%d OUT=%d bias=%d relu=%d: out[%zu][%zu] = %.9g, reference %.9g (tol %.3g)",
                c->B, c->IN, c->OUT, with_bias, relu, i / c->OUT, i % c->OUT, v, ref[i], tol);
      bad = 1;
    }
  }
  free(in), free(w), free(bias), free(ref), free(mag);
  return bad ? -1 : 0;
}

static int check_shape(int B, int IN, int OUT, int with_bias, int relu, int threads) {
  case_data c = make_case(B, IN, OUT, 1);
  float *out = fvec((size_t)B * OUT);
  dlrec_packed_linear *p = NULL;
  int rc = -1;
  dlrec_status st = cpu_packed_create(&p, c.w, with_bias ? c.bias : NULL, IN, OUT);
  if (st != DLREC_OK)
    test_fail(__FILE__, __LINE__, "packed_linear_create: %s", dlrec_last_error());
  else if (run_forward(p, c.in, out, B, relu, threads) == 0)
    rc = check_against_reference(&c, out, with_bias, relu);
  cpu_packed_free(p);
  free(out);
  free_case(&c);
  return rc;
}

TEST(packed_linear_matches_naive) {
  /* Odd widths, every row tail (B mod 6) and output tail (OUT mod 16). */
  const int ins[] = {1, 3, 17, 64, 367};
  const int outs[] = {1, 3, 16, 17, 33, 100};
  const int bs[] = {1, 3, 5, 6, 10, 64, 1000};
  for (int i = 0; i < 5; i++)
    for (int o = 0; o < 6; o++)
      for (int b = 0; b < 7; b++) {
        const int B = bs[b], IN = ins[i], OUT = outs[o];
        if ((double)B * IN * OUT > 4e6 && !(IN == 367 && OUT == 100)) continue; /* keep the sanitizer run short */
        CHECK(check_shape(B, IN, OUT, 1, 0, 2) == 0);
      }
  /* Random shapes, with and without bias and ReLU, on 1 and 2 threads. */
  dlrec_rng r;
  dlrec_rng_seed(&r, 7, 0);
  for (int t = 0; t < 24; t++) {
    const int B = 1 + (int)dlrec_rng_below(&r, 300), IN = 1 + (int)dlrec_rng_below(&r, 400);
    const int OUT = 1 + (int)dlrec_rng_below(&r, 200);
    CHECK(check_shape(B, IN, OUT, t & 1, (t >> 1) & 1, 1 + (t & 2) / 2) == 0);
  }
  /* Past the parallel threshold, with both thread splits (rows, panels). */
  CHECK(check_shape(1, 1100, 1000, 1, 1, 2) == 0);
  CHECK(check_shape(40, 700, 130, 1, 0, 2) == 0);
  CHECK(check_shape(300, 257, 300, 1, 0, 2) == 0);
}

/* ---- bitwise invariance ----------------------------------------------------------- */

/* For one layer: out of the whole batch (2 threads) against each row alone
 * (B = 1, from its own misaligned buffer), the rows in a random order, the
 * batch on 1 and 3 threads, and every sub-batch of 1 .. 13 rows starting at
 * each of the first 7 rows (every row tail at every position). */
static void check_invariance(int B, int IN, int OUT, int relu) {
  case_data c = make_case(B, IN, OUT, 2);
  const size_t row_bytes = (size_t)OUT * sizeof(float);
  float *ref = fvec((size_t)B * OUT), *out = fvec((size_t)B * OUT), *perm_in = fvec((size_t)B * IN);
  float *one_in = fvec((size_t)IN + 1), *one_out = fvec((size_t)OUT + 1);
  uint32_t *perm = calloc((size_t)B, sizeof *perm);
  dlrec_packed_linear *p = NULL;
  dlrec_status st = cpu_packed_create(&p, c.w, c.bias, IN, OUT);
  int fails = st != DLREC_OK;
  if (st != DLREC_OK) test_fail(__FILE__, __LINE__, "packed_linear_create: %s", dlrec_last_error());
  if (!fails) fails += run_forward(p, c.in, ref, B, relu, 2) != 0;
  if (!fails) fails += check_against_reference(&c, ref, 1, relu) != 0;

  /* Each row alone, its input and output one float off the allocation's alignment. */
  for (int b = 0; b < B && !fails; b++) {
    memcpy(one_in + 1, c.in + (size_t)b * IN, (size_t)IN * sizeof(float));
    fails += run_forward(p, one_in + 1, one_out + 1, 1, relu, 2) != 0;
    if (!fails && memcmp(one_out + 1, ref + (size_t)b * OUT, row_bytes) != 0) {
      test_fail(__FILE__, __LINE__, "B=%d IN=%d OUT=%d relu=%d: row %d alone differs from the batch", B, IN, OUT, relu,
                b);
      fails++;
    }
  }
  /* The rows permuted: out row i is the batch's row perm[i]. */
  dlrec_rng r;
  dlrec_rng_seed(&r, 3, (uint64_t)B);
  for (int b = 0; b < B; b++) perm[b] = (uint32_t)b;
  dlrec_rng_shuffle_u32(&r, perm, (uint32_t)B);
  for (int b = 0; b < B; b++)
    memcpy(perm_in + (size_t)b * IN, c.in + (size_t)perm[b] * IN, (size_t)IN * sizeof(float));
  if (!fails) fails += run_forward(p, perm_in, out, B, relu, 2) != 0;
  for (int b = 0; b < B && !fails; b++)
    if (memcmp(out + (size_t)b * OUT, ref + (size_t)perm[b] * OUT, row_bytes) != 0) {
      test_fail(__FILE__, __LINE__, "B=%d IN=%d OUT=%d: row %u moved to %d differs", B, IN, OUT, perm[b], b);
      fails++;
    }
  /* Other thread counts. */
  for (int threads = 1; threads <= 3 && !fails; threads += 2) {
    memset(out, 0, (size_t)B * row_bytes);
    fails += run_forward(p, c.in, out, B, relu, threads) != 0;
    if (!fails && memcmp(out, ref, (size_t)B * row_bytes) != 0) {
      test_fail(__FILE__, __LINE__, "B=%d IN=%d OUT=%d: %d thread(s) differ from 2", B, IN, OUT, threads);
      fails++;
    }
  }
  /* Sub-batches. */
  for (int start = 0; start < 7 && start < B && !fails; start++)
    for (int n = 1; n <= 13 && start + n <= B && !fails; n++) {
      fails += run_forward(p, c.in + (size_t)start * IN, out, n, relu, 2) != 0;
      if (!fails && memcmp(out, ref + (size_t)start * OUT, (size_t)n * row_bytes) != 0) {
        test_fail(__FILE__, __LINE__, "B=%d IN=%d OUT=%d: rows %d .. %d as a batch of %d differ", B, IN, OUT, start,
                  start + n - 1, n);
        fails++;
      }
    }
  cpu_packed_free(p);
  free(ref), free(out), free(perm_in), free(one_in), free(one_out), free(perm);
  free_case(&c);
}

TEST(packed_linear_bitwise_invariant) {
  check_invariance(64, 367, 100, 0);
  check_invariance(64, 367, 100, 1);
  check_invariance(1000, 17, 130, 0); /* many row blocks: threads split the rows */
  check_invariance(13, 3, 1, 1);
  check_invariance(37, 1100, 1000, 0); /* past the parallel threshold at B = 1: threads split the panels */
  check_invariance(200, 512, 256, 1);  /* a Kaggle layer, split by rows */
}

/* ---- ReLU and bias ----------------------------------------------------------------- */

TEST(packed_linear_relu_and_null_bias) {
  const int B = 50, IN = 37, OUT = 45;
  case_data c = make_case(B, IN, OUT, 4);
  const size_t n = (size_t)B * OUT;
  float *lin = fvec(n), *act = fvec(n), *nob = fvec(n), *zb = fvec(n), *zeros = fvec((size_t)OUT);
  dlrec_packed_linear *p = NULL, *q = NULL, *z = NULL;
  CHECK_OK(cpu_packed_create(&p, c.w, c.bias, IN, OUT));
  CHECK_OK(cpu_packed_create(&q, c.w, NULL, IN, OUT));
  CHECK_OK(cpu_packed_create(&z, c.w, zeros, IN, OUT));
  int ok = run_forward(p, c.in, lin, B, 0, 2) == 0 && run_forward(p, c.in, act, B, 1, 2) == 0 &&
           run_forward(q, c.in, nob, B, 0, 2) == 0 && run_forward(z, c.in, zb, B, 0, 2) == 0;
  /* The ReLU is max(x, 0) of the same sums, bitwise; some of each sign. */
  size_t neg = 0, pos = 0;
  for (size_t i = 0; ok && i < n; i++) {
    const float want = lin[i] > 0 ? lin[i] : 0.0f;
    if (memcmp(&act[i], &want, sizeof want) != 0) {
      test_fail(__FILE__, __LINE__, "relu out[%zu] = %.9g, linear %.9g", i, act[i], lin[i]);
      ok = 0;
    }
    neg += lin[i] < 0, pos += lin[i] > 0;
  }
  if (ok && (neg == 0 || pos == 0)) test_fail(__FILE__, __LINE__, "test setup: %zu negative, %zu positive", neg, pos);
  /* No bias: the reference without one, and the same bits as a zero bias. */
  if (ok) ok = check_against_reference(&c, nob, 0, 0) == 0 && check_against_reference(&c, lin, 1, 0) == 0;
  if (ok && memcmp(nob, zb, n * sizeof(float)) != 0) test_fail(__FILE__, __LINE__, "NULL bias differs from zeros");
  cpu_packed_free(p), cpu_packed_free(q), cpu_packed_free(z);
  free(lin), free(act), free(nob), free(zb), free(zeros);
  free_case(&c);
}

TEST(packed_linear_bad_arguments) {
  float w[6] = {1, 2, 3, 4, 5, 6}, b[2] = {0}, in[3] = {1, 1, 1}, out[2] = {7, 7};
  dlrec_packed_linear *p = (dlrec_packed_linear *)w; /* must be reset to NULL on failure */
  CHECK_ERR(cpu_packed_create(NULL, w, b, 3, 2), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_packed_create(&p, NULL, b, 3, 2), DLREC_ERR_INVALID, "NULL");
  CHECK(p == NULL);
  p = (dlrec_packed_linear *)w;
  CHECK_ERR(cpu_packed_create(&p, w, b, 0, 2), DLREC_ERR_INVALID, "IN=0");
  CHECK(p == NULL);
  CHECK_ERR(cpu_packed_create(&p, w, b, 3, 0), DLREC_ERR_INVALID, "OUT=0");
  CHECK_ERR(cpu_packed_create(&p, w, b, -3, 2), DLREC_ERR_INVALID, "bad shape");
  CHECK_ERR(cpu_packed_create(&p, w, b, 3, 65537), DLREC_ERR_INVALID, "bad shape");
  CHECK_ERR(cpu_packed_create(&p, w, b, 1 << 20, 2), DLREC_ERR_INVALID, "bad shape");
  CHECK(p == NULL);
  CHECK_OK(cpu_packed_create(&p, w, b, 3, 2));
  CHECK_ERR(cpu_packed_forward(out, NULL, in, 1, DLREC_ACT_NONE), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_packed_forward(out, p, NULL, 1, DLREC_ACT_NONE), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_packed_forward(NULL, p, in, 1, DLREC_ACT_NONE), DLREC_ERR_INVALID, "NULL");
  CHECK_ERR(cpu_packed_forward(out, p, in, 0, DLREC_ACT_NONE), DLREC_ERR_INVALID, "B=0");
  CHECK_ERR(cpu_packed_forward(out, p, in, -5, DLREC_ACT_RELU), DLREC_ERR_INVALID, "B=-5");
  CHECK(out[0] == 7 && out[1] == 7); /* refused calls touch nothing */
  /* The valid call still works: W = [[1 2 3] [4 5 6]], x = [1 1 1]. */
  CHECK_OK(cpu_packed_forward(out, p, in, 1, DLREC_ACT_NONE));
  CHECK(out[0] == 6 && out[1] == 15);
  cpu_packed_free(p);
  cpu_packed_free(NULL);
}
