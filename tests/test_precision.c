/* training.precision on the CPU: the bf16 rounding itself, the linear
 * layers' GEMMs (src/backend/cpu/cpu_gemm.c) against a double-precision
 * reference computed from bf16-rounded operands, the cross layers' products
 * through those GEMMs, the backend's resolution of auto, the oneDNN path
 * forced on a CPU without bf16 instructions, fp32's GEMMs on each of their
 * two engines (oneDNN, OpenBLAS), and a small MLP that must learn as well in
 * bf16 as in fp32.
 *
 * On this project's CPUs without AVX512-BF16 or AMX, bf16 is emulated (the
 * operands rounded into fp32 scratch, then the fp32 GEMMs); on one with them
 * the same tests run the oneDNN path. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "backend/dispatch.h"
#include "backend/cpu/cpu_dnnl.h"
#include "backend/cpu/cpu_gemm.h"
#include "train/metrics.h"
#include "test.h"

static float bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* A small deterministic generator (splitmix64), uniform in [-1, 1). */
static uint64_t rng_state;
static double uniform(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static void fill(float *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++) x[i] = (float)(scale * uniform());
}

TEST(round_bf16_known_values) {
  CHECK(cpu_gemm_round_bf16(1.0f) == 1.0f);
  CHECK(cpu_gemm_round_bf16(-2.5f) == -2.5f);
  /* 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (bf16 keeps 7 fraction
   * bits): ties go to the even mantissa, 1. */
  CHECK(cpu_gemm_round_bf16(1.0f + 0x1p-8f) == 1.0f);
  /* 1 + 3*2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even). */
  CHECK(cpu_gemm_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
  /* Just above the tie rounds up; just below rounds down. */
  CHECK(cpu_gemm_round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
  CHECK(cpu_gemm_round_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 1.0f);
  CHECK(cpu_gemm_round_bf16(-(1.0f + 0x1p-8f + 0x1p-20f)) == -(1.0f + 0x1p-7f));
  /* Not a truncation: 0.1f is 0x3dcccccd, whose bf16 is 0x3dcd, not 0x3dcc. */
  CHECK_EQ(f32_bits(cpu_gemm_round_bf16(0.1f)), 0x3dcd0000u);
  CHECK(isinf(cpu_gemm_round_bf16(INFINITY)) && cpu_gemm_round_bf16(INFINITY) > 0);
  CHECK(isinf(cpu_gemm_round_bf16(-INFINITY)) && cpu_gemm_round_bf16(-INFINITY) < 0);
  CHECK(isnan(cpu_gemm_round_bf16(NAN)));
  /* A NaN whose payload sits only in the low 16 bits must not become inf. */
  CHECK(isnan(cpu_gemm_round_bf16(bits_f32(0x7f800001u))));
  CHECK(isnan(cpu_gemm_round_bf16(bits_f32(0xff800001u))));
  /* The largest bf16 (0x7f7f) is kept; FLT_MAX lies above the midpoint to
   * the next binade and rounds to infinity, as a bf16 conversion does. */
  CHECK_EQ(f32_bits(cpu_gemm_round_bf16(bits_f32(0x7f7f0000u))), 0x7f7f0000u);
  CHECK(isinf(cpu_gemm_round_bf16(FLT_MAX)));
  CHECK(cpu_gemm_round_bf16(0.0f) == 0.0f && !signbit(cpu_gemm_round_bf16(0.0f)));
  CHECK(signbit(cpu_gemm_round_bf16(-0.0f)));
}

/* Sizes odd on purpose: no dimension a multiple of a vector width. */
enum { TB = 37, TIN = 29, TOUT = 13 };

/* The operands' rounding the reference applies: bf16's, or none (fp32). */
static int rounding;
static double r(float x) { return rounding ? cpu_gemm_round_bf16(x) : x; }

/* The fp32 accumulation's slack on a sum of n terms whose magnitudes add to
 * sum_abs: a few ulps per addition. The bf16 rounding of the operands is
 * about 2^-9 relative, hundreds of times larger. */
static double slack(int n, double sum_abs) { return 2.0 * n * FLT_EPSILON * sum_abs + 1e-7; }

/* Forward (both activations) and backward of g's linear layer against a
 * double reference on bf16-rounded operands (bf16 set), and then far from
 * the fp32 result; on the fp32 operands themselves otherwise. */
static void check_linear(cpu_gemm *g, int bf16) {
  rounding = bf16;
  float *in = malloc(sizeof(float) * TB * TIN), *w = malloc(sizeof(float) * TOUT * TIN), bias[TOUT];
  float *out = malloc(sizeof(float) * TB * TOUT), *dout = malloc(sizeof(float) * TB * TOUT);
  float *din = malloc(sizeof(float) * TB * TIN), *dw = malloc(sizeof(float) * TOUT * TIN), db[TOUT];
  float *dw0 = malloc(sizeof(float) * TOUT * TIN), db0[TOUT];
  rng_state = 42;
  fill(in, (size_t)TB * TIN, 2.0);
  fill(w, (size_t)TOUT * TIN, 0.5);
  fill(bias, TOUT, 0.3);
  fill(dout, (size_t)TB * TOUT, 1.0);
  fill(dw0, (size_t)TOUT * TIN, 1.0);
  fill(db0, TOUT, 1.0);

  for (int relu = 0; relu <= 1; relu++) {
    CHECK_OK(cpu_linear_forward(g, out, in, w, bias, TB, TIN, TOUT, relu ? DLREC_ACT_RELU : DLREC_ACT_NONE));
    double max_off_fp32 = 0;
    for (int b = 0; b < TB; b++)
      for (int o = 0; o < TOUT; o++) {
        double ref = bias[o], ref32 = bias[o], sum_abs = fabs(bias[o]);
        for (int i = 0; i < TIN; i++) {
          ref += r(in[b * TIN + i]) * r(w[o * TIN + i]);
          ref32 += (double)in[b * TIN + i] * w[o * TIN + i];
          sum_abs += fabs(r(in[b * TIN + i]) * r(w[o * TIN + i]));
        }
        if (relu) ref = ref > 0 ? ref : 0, ref32 = ref32 > 0 ? ref32 : 0;
        CHECK_NEAR(out[b * TOUT + o], ref, slack(TIN, sum_abs), 0);
        if (fabs(out[b * TOUT + o] - ref32) > max_off_fp32) max_off_fp32 = fabs(out[b * TOUT + o] - ref32);
      }
    /* The rounding really happens: the fp32 result is far outside the slack. */
    if (bf16) CHECK(max_off_fp32 > 1e-3);
  }

  /* Backward: dW and db accumulate onto what is there, din is overwritten
   * (filled with garbage first), db sums the unrounded dout. */
  memcpy(dw, dw0, sizeof(float) * TOUT * TIN);
  memcpy(db, db0, sizeof db);
  for (size_t i = 0; i < (size_t)TB * TIN; i++) din[i] = 1e30f;
  CHECK_OK(cpu_linear_backward(g, din, dw, db, dout, in, w, TB, TIN, TOUT));
  double max_off_fp32 = 0;
  for (int o = 0; o < TOUT; o++) {
    double refb = db0[o], sum_abs_b = fabs(db0[o]);
    for (int b = 0; b < TB; b++) refb += dout[b * TOUT + o], sum_abs_b += fabs(dout[b * TOUT + o]);
    CHECK_NEAR(db[o], refb, slack(TB, sum_abs_b), 0);
    for (int i = 0; i < TIN; i++) {
      double ref = dw0[o * TIN + i], ref32 = ref, sum_abs = fabs(ref);
      for (int b = 0; b < TB; b++) {
        ref += r(dout[b * TOUT + o]) * r(in[b * TIN + i]);
        ref32 += (double)dout[b * TOUT + o] * in[b * TIN + i];
        sum_abs += fabs(r(dout[b * TOUT + o]) * r(in[b * TIN + i]));
      }
      CHECK_NEAR(dw[o * TIN + i], ref, slack(TB, sum_abs), 0);
      if (fabs(dw[o * TIN + i] - ref32) > max_off_fp32) max_off_fp32 = fabs(dw[o * TIN + i] - ref32);
    }
  }
  if (bf16) CHECK(max_off_fp32 > 1e-3);
  for (int b = 0; b < TB; b++)
    for (int i = 0; i < TIN; i++) {
      double ref = 0, sum_abs = 0;
      for (int o = 0; o < TOUT; o++) {
        ref += r(dout[b * TOUT + o]) * r(w[o * TIN + i]);
        sum_abs += fabs(r(dout[b * TOUT + o]) * r(w[o * TIN + i]));
      }
      CHECK_NEAR(din[b * TIN + i], ref, slack(TOUT, sum_abs), 0);
    }
  /* The first layer: no din, no weights needed; dW as before. */
  float *dw_checked = malloc(sizeof(float) * TOUT * TIN);
  memcpy(dw_checked, dw, sizeof(float) * TOUT * TIN);
  memcpy(dw, dw0, sizeof(float) * TOUT * TIN);
  CHECK_OK(cpu_linear_backward(g, NULL, dw, NULL, dout, in, NULL, TB, TIN, TOUT));
  for (int k = 0; k < TOUT * TIN; k++) CHECK_NEAR(dw[k], dw_checked[k], 1e-6, 1e-6);
  free(dw_checked);
  CHECK_ERR(cpu_linear_backward(g, din, dw, NULL, dout, in, NULL, TB, TIN, TOUT), DLREC_ERR_INVALID,
            "din needs the weights");
  CHECK_ERR(cpu_linear_forward(g, out, in, w, bias, 0, TIN, TOUT, DLREC_ACT_NONE), DLREC_ERR_INVALID,
            "bad shape");
  free(in), free(w), free(out), free(dout), free(din), free(dw), free(dw0);
}

TEST(bf16_linear_matches_rounded_reference) {
  cpu_gemm *g;
  int native = -1;
  CHECK_OK(cpu_gemm_create(&g, DLREC_PRECISION_BF16, &native));
  CHECK_EQ(native, cpu_gemm_has_bf16() && cpu_dnnl_available());
  fprintf(stderr, "%s\n", cpu_gemm_describe(g));
  check_linear(g, 1);
  cpu_gemm_free(g);
}

/* oneDNN's bf16 matmul, forced on whatever CPU this is: the same checks
 * where oneDNN accepts; where it has no bf16 kernel for this CPU (oneDNN 2.6
 * has none below AVX512), a clear refusal when the GEMMs are created, never
 * a failure at the first training step. */
TEST(bf16_linear_on_forced_onednn) {
  cpu_gemm *g;
  int native = -1;
  setenv("DLREC_BF16_FORCE_ONEDNN", "1", 1);
  dlrec_status s = cpu_gemm_create(&g, DLREC_PRECISION_BF16, &native);
  unsetenv("DLREC_BF16_FORCE_ONEDNN");
  if (!cpu_dnnl_available()) {
    CHECK_EQ(s, DLREC_ERR_UNSUPPORTED);
    CHECK(strstr(dlrec_last_error(), "this build has no oneDNN") != NULL);
    return;
  }
  if (s != DLREC_OK && !cpu_gemm_has_bf16()) {
    fprintf(stderr, "refused as expected: %s\n", dlrec_last_error());
    CHECK_EQ(s, DLREC_ERR_UNSUPPORTED);
    CHECK(strstr(dlrec_last_error(), "DLREC_BF16_FORCE_ONEDNN=1 on a CPU without AVX512-BF16 or AMX") != NULL);
    CHECK(strstr(dlrec_last_error(), "oneDNN has no bf16 matmul") != NULL);
    CHECK(g == NULL);
    return;
  }
  CHECK_OK(s);
  CHECK_EQ(native, cpu_gemm_has_bf16());
  CHECK(strstr(cpu_gemm_describe(g), "oneDNN") != NULL);
  check_linear(g, 1);
  cpu_gemm_free(g);
}

/* fp32's GEMMs on each engine DLREC_FP32_GEMM names and on the default
 * one (oneDNN exactly where the CPU has AVX-512 and the build oneDNN),
 * against the double reference on the unrounded operands; fp16's emulation
 * multiplies on the chosen engine; any other name is refused. */
TEST(fp32_linear_on_either_engine) {
  const char *engines[3] = {"openblas", "onednn", NULL};
  for (int e = 0; e < 3; e++) {
    cpu_gemm *g = NULL;
    int native = -1;
    if (engines[e]) setenv("DLREC_FP32_GEMM", engines[e], 1);
    dlrec_status s = cpu_gemm_create(&g, DLREC_PRECISION_FP32, &native);
    unsetenv("DLREC_FP32_GEMM");
    if (e == 1 && !cpu_dnnl_available()) {
      CHECK_EQ(s, DLREC_ERR_UNSUPPORTED);
      CHECK(strstr(dlrec_last_error(), "DLREC_FP32_GEMM=onednn: this build has no oneDNN") != NULL);
      continue;
    }
    CHECK_OK(s);
    CHECK_EQ(native, 0);
    const int onednn = e == 1 || (e == 2 && cpu_gemm_has_avx512() && cpu_dnnl_available());
    fprintf(stderr, "%s: %s\n", engines[e] ? engines[e] : "default", cpu_gemm_describe(g));
    CHECK_STR(cpu_gemm_describe(g), onednn ? "fp32 GEMMs (oneDNN)" : "fp32 GEMMs (OpenBLAS sgemm)");
    check_linear(g, 0);
    cpu_gemm_free(g);
  }
  if (cpu_dnnl_available()) {
    /* fp16 rounds 1 + 2^-11 to 1 (a tie, to even) and keeps 1 + 2^-8. */
    cpu_gemm *g;
    int native;
    setenv("DLREC_FP32_GEMM", "onednn", 1);
    dlrec_status s = cpu_gemm_create(&g, DLREC_PRECISION_FP16, &native);
    unsetenv("DLREC_FP32_GEMM");
    CHECK_OK(s);
    CHECK_STR(cpu_gemm_describe(g), "fp16 GEMMs (emulated: fp16-rounded operands on oneDNN)");
    float in[2] = {1.0f + 0x1p-11f, 1.0f + 0x1p-8f}, w[2] = {1.0f, 1.0f}, out = 0;
    CHECK_OK(cpu_linear_forward(g, &out, in, w, NULL, 1, 2, 1, DLREC_ACT_NONE));
    CHECK(out == 2.0f + 0x1p-8f);
    cpu_gemm_free(g);
  }
  cpu_gemm *g = NULL;
  int native;
  setenv("DLREC_FP32_GEMM", "mkl", 1);
  dlrec_status s = cpu_gemm_create(&g, DLREC_PRECISION_FP32, &native);
  unsetenv("DLREC_FP32_GEMM");
  CHECK_ERR(s, DLREC_ERR_INVALID, "DLREC_FP32_GEMM must be openblas or onednn, not \"mkl\"");
  CHECK(g == NULL);
}

TEST(backend_resolves_precision) {
  /* The descriptions below name OpenBLAS: fp32_linear_on_either_engine
   * covers the engine's choice. */
  setenv("DLREC_FP32_GEMM", "openblas", 1);
  dlrec_backend *be;
  dlrec_backend_config c = {.threads = 1, .precision = DLREC_PRECISION_AUTO};
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  /* auto: bf16 only where the CPU has it natively. */
  CHECK_EQ(dlrec_backend_precision(be), cpu_gemm_has_bf16() ? DLREC_PRECISION_BF16 : DLREC_PRECISION_FP32);
  CHECK_EQ(dlrec_backend_bf16_native(be), cpu_gemm_has_bf16() && cpu_dnnl_available());
  dlrec_backend_free(be);

  c.precision = DLREC_PRECISION_FP32;
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  CHECK_STR(dlrec_backend_describe(be), "cpu: 1 thread, fp32 GEMMs (OpenBLAS sgemm)");
  CHECK_EQ(dlrec_backend_bf16_native(be), 0);
  dlrec_backend_free(be);

  c.precision = DLREC_PRECISION_BF16;
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  CHECK_EQ(dlrec_backend_precision(be), DLREC_PRECISION_BF16);
  fprintf(stderr, "%s\n", dlrec_backend_describe(be));
  if (!cpu_gemm_has_bf16())
    CHECK_STR(dlrec_backend_describe(be), "cpu: 1 thread, bf16 GEMMs (emulated: this CPU has no AVX512-BF16 or AMX)");
  else
    CHECK(strstr(dlrec_backend_describe(be), "bf16 GEMMs (") != NULL);
  /* The op goes through the backend's precision: 1.00390625 rounds to 1. */
  float in[2] = {1.0f + 0x1p-8f, 1.0f}, w[2] = {1.0f, 1.0f + 0x1p-8f}, out = 0;
  CHECK_OK(BE_OP(be, linear_forward, &out, in, w, NULL, 1, 2, 1, DLREC_ACT_NONE));
  CHECK(out == 2.0f);
  dlrec_backend_free(be);

  /* tf32, a GPU's unit, is fp32 on the CPU: the same product keeps its bits. */
  c.precision = DLREC_PRECISION_TF32;
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  CHECK_EQ(dlrec_backend_precision(be), DLREC_PRECISION_FP32);
  CHECK_STR(dlrec_backend_describe(be), "cpu: 1 thread, fp32 GEMMs (OpenBLAS sgemm)");
  CHECK_OK(BE_OP(be, linear_forward, &out, in, w, NULL, 1, 2, 1, DLREC_ACT_NONE));
  CHECK(out == 2.0f + 0x1p-7f);
  dlrec_backend_free(be);
  dlrec_precision p;
  CHECK_OK(dlrec_precision_parse("tf32", &p));
  CHECK_EQ(p, DLREC_PRECISION_TF32);
  CHECK_STR(dlrec_precision_name(DLREC_PRECISION_TF32), "tf32");
  CHECK_ERR(dlrec_precision_parse("fp8", &p), DLREC_ERR_INVALID, "not one of fp32, bf16, auto, tf32, fp16");

  /* fp16, emulated on the CPU: 1 + 2^-11 is a tie between 1 and 1 + 2^-10
   * and rounds to even, 1; 1 + 2^-8 (which bf16 also rounds to 1) is an
   * fp16 and stays; 70000 is past fp16's largest, 65504: infinite. */
  CHECK_OK(dlrec_precision_parse("fp16", &p));
  CHECK_EQ(p, DLREC_PRECISION_FP16);
  c.precision = DLREC_PRECISION_FP16;
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  CHECK_EQ(dlrec_backend_precision(be), DLREC_PRECISION_FP16);
  CHECK_EQ(dlrec_backend_bf16_native(be), 0);
  CHECK_STR(dlrec_backend_describe(be), "cpu: 1 thread, fp16 GEMMs (emulated: fp16-rounded operands on OpenBLAS sgemm)");
  float h_in[2] = {1.0f + 0x1p-11f, 1.0f + 0x1p-8f}, h_w[2] = {1.0f, 1.0f};
  CHECK_OK(BE_OP(be, linear_forward, &out, h_in, h_w, NULL, 1, 2, 1, DLREC_ACT_NONE));
  CHECK(out == 2.0f + 0x1p-8f);
  h_in[0] = 70000.0f;
  CHECK_OK(BE_OP(be, linear_forward, &out, h_in, h_w, NULL, 1, 2, 1, DLREC_ACT_NONE));
  CHECK(isinf(out));
  dlrec_backend_free(be);
  unsetenv("DLREC_FP32_GEMM");
}

/* fp16's rounding on F16C and in plain C agree bit for bit on 2^20 random
 * bit patterns (every exponent: subnormals, infinities and NaN among them)
 * and on the edges: ties at 1 + 2^-11 and at the subnormal 2^-25 (to
 * even: 1, and 0), 65504 (the largest), 65519 and 65520 (the last value
 * that rounds down to it, and the first that overflows), 2^-24 (the
 * smallest subnormal). NaN only as NaN. Skipped, saying so, without F16C. */
TEST(fp16_rounding_on_f16c_matches_plain_c) {
  if (!cpu_gemm_has_f16c()) {
    fprintf(stderr, "fp16_rounding_on_f16c_matches_plain_c: skipped: this CPU has no F16C\n");
    return;
  }
  const size_t n = (1u << 20) + 7; /* a tail past the 8-wide bulk */
  float *x = malloc(n * sizeof *x), *hw = malloc(n * sizeof *hw), *sw = malloc(n * sizeof *sw);
  const float edges[] = {1.0f + 0x1p-11f, 0x1p-25f, 65504.0f, 65519.0f, 65520.0f, 0x1p-24f, -0x1p-25f, 0.0f, -0.0f};
  uint64_t z = 12345;
  for (size_t i = 0; i < n; i++) {
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(z >> 32);
    if (i % 4 == 1) u = (u & 0x807fffffu) | ((100u + (uint32_t)(z >> 20) % 60u) << 23); /* near fp16's range */
    memcpy(&x[i], &u, 4);
  }
  memcpy(x, edges, sizeof edges);
  cpu_gemm_round_fp16(hw, x, n, 1);
  cpu_gemm_round_fp16(sw, x, n, 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (isnan(x[i]) ? !(isnan(hw[i]) && isnan(sw[i])) : memcmp(&hw[i], &sw[i], 4)) {
      if (bad++ < 5) fprintf(stderr, "fp16 of %a: F16C %a, C %a\n", (double)x[i], (double)hw[i], (double)sw[i]);
    }
  CHECK_EQ(bad, 0);
  CHECK(sw[0] == 1.0f && sw[1] == 0.0f && sw[2] == 65504.0f && sw[3] == 65504.0f && isinf(sw[4]) &&
        sw[5] == 0x1p-24f);
  free(x), free(hw), free(sw);
}

/* The cross layers' products go through the backend's GEMMs too: with
 * xl[0] = 1 + 2^-8 (not a bf16, rounded to 1) each layer's output and its
 * first weight gradient come out as exact values that only the bf16
 * products give. x0 = 1, biases and gates 0, dout = 1, B = 1, d = 2, r = 1,
 * one expert:
 *   full rank  W = [[1 + 2^-8, 1], ..]: u0 = 1·1 + 1·1 = 2 (fp32: 2.0078125)
 *   low rank   V = [1 + 2^-8, 1], U = [1, 1]: t = 2, u0 = 2
 *   mixture    V as low rank, C = [1], U = [1, 1]: t1 = t2 = e0 = 2, p = 1
 * so out[0] = x0·u0 + xl[0] = 2 + 1.00390625 everywhere, and the gradient of
 * the weight that meets xl[0] (dW[0][0], dV[0][0]) is 1·1 = 1 (full rank)
 * or 2·1 = 2 (dt = dt1 = 2), where fp32 gives 1.00390625 or 2.0078125. */
TEST(bf16_cross_layers_round_their_products) {
  dlrec_backend *be;
  dlrec_backend_config c = {.threads = 1, .precision = DLREC_PRECISION_BF16};
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  const float e = 1.0f + 0x1p-8f, want_out = 2.0f + e;
  float x0[2] = {1, 1}, xl[2] = {e, 1}, dout[2] = {1, 1}, zero[2] = {0, 0}, one[2] = {1, 1};
  float w[4] = {e, 1, 1, e}, v[2] = {e, 1}, cc[1] = {1};
  float out[2], act[16], ws[16], dx0[2], dxl[2], dw[4], dv[2], du[2], dc[1], dg[2], db[2];
  CHECK(dlrec_cross_mix_act_floats(1, 2, 1, 1) <= 16 && dlrec_cross_mix_ws_floats(1, 2, 1, 1) <= 16);

  CHECK_OK(BE_OP(be, cross_forward, out, act, x0, xl, w, zero, 1, 2));
  CHECK(out[0] == want_out);
  memset(dx0, 0, sizeof dx0), memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
  CHECK_OK(BE_OP(be, cross_backward, dx0, dxl, dw, db, dout, x0, xl, act, w, ws, 1, 2));
  CHECK(dw[0] == 1.0f);

  CHECK_OK(BE_OP(be, cross_lowrank_forward, out, act, x0, xl, v, one, zero, 1, 2, 1));
  CHECK(out[0] == want_out);
  memset(dx0, 0, sizeof dx0), memset(dv, 0, sizeof dv), memset(du, 0, sizeof du), memset(db, 0, sizeof db);
  CHECK_OK(BE_OP(be, cross_lowrank_backward, dx0, dxl, dv, du, db, dout, x0, xl, act, v, one, ws, 1, 2, 1));
  CHECK(dv[0] == 2.0f);

  CHECK_OK(BE_OP(be, cross_mix_forward, out, act, x0, xl, v, cc, one, zero, zero, 1, 2, 1, 1));
  CHECK(out[0] == want_out);
  memset(dx0, 0, sizeof dx0), memset(dv, 0, sizeof dv), memset(du, 0, sizeof du), memset(db, 0, sizeof db);
  memset(dc, 0, sizeof dc), memset(dg, 0, sizeof dg);
  CHECK_OK(BE_OP(be, cross_mix_backward, dx0, dxl, dv, dc, du, dg, db, dout, x0, xl, act, v, cc, one, zero, ws, 1,
                 2, 1, 1));
  CHECK(dv[0] == 2.0f);
  dlrec_backend_free(be);
}

/* ---- learning: a small MLP trained in fp32 and in bf16 ------------------ */

/* Teacher: logit = Σ_j v_j relu(u_j · x + c_j) + a, labels drawn from its
 * probability. Student: 16 -> 64 -> 32 -> 1 with ReLUs, Adam, trained with
 * the GEMMs of g; scored in fp32 (as predict and the server score every
 * precision's model), AUC on held-out rows. */
enum { LD = 16, LH = 8, L1 = 64, L2 = 32, N_TRAIN = 32768, N_VALID = 16384, LBATCH = 128, LEPOCHS = 3 };

typedef struct mlp {
  float *p;       /* every parameter, one block */
  float *w1, *b1, *w2, *b2, *w3, *b3;
  size_t n;
} mlp;

static void mlp_init(mlp *m) {
  m->n = (size_t)L1 * LD + L1 + (size_t)L2 * L1 + L2 + L2 + 1;
  m->p = calloc(m->n, sizeof(float));
  m->w1 = m->p, m->b1 = m->w1 + L1 * LD, m->w2 = m->b1 + L1, m->b2 = m->w2 + L2 * L1, m->w3 = m->b2 + L2,
  m->b3 = m->w3 + L2;
  rng_state = 7;
  fill(m->w1, (size_t)L1 * LD, sqrt(6.0 / (LD + L1)));
  fill(m->w2, (size_t)L2 * L1, sqrt(6.0 / (L1 + L2)));
  fill(m->w3, L2, sqrt(6.0 / (L2 + 1)));
}

static void make_data(float *x, float *y, float *p_true, int n) {
  float u[LH * LD], c[LH], v[LH];
  rng_state = 1234;
  fill(u, LH * LD, 0.8), fill(c, LH, 0.5), fill(v, LH, 2.5);
  rng_state = 99 + (uint64_t)n;
  for (int s = 0; s < n; s++) {
    double z = -0.5;
    for (int k = 0; k < LD; k++) x[s * LD + k] = (float)(1.7 * uniform());
    for (int j = 0; j < LH; j++) {
      double h = c[j];
      for (int k = 0; k < LD; k++) h += u[j * LD + k] * x[s * LD + k];
      z += v[j] * (h > 0 ? h : 0);
    }
    double p = 1 / (1 + exp(-z));
    p_true[s] = (float)p;
    y[s] = (uniform() + 1) / 2 < p ? 1.0f : 0.0f;
  }
}

/* Scores every row in fp32 (dlrec_linear_*), returns the AUC. */
static double mlp_auc(const mlp *m, const float *x, const float *y, int n) {
  float *h1 = malloc(sizeof(float) * (size_t)n * L1), *h2 = malloc(sizeof(float) * (size_t)n * L2);
  float *z = malloc(sizeof(float) * (size_t)n);
  double auc = NAN;
  dlrec_metrics met;
  if (cpu_sgemm_linear_relu_forward(h1, x, m->w1, m->b1, n, LD, L1) == DLREC_OK &&
      cpu_sgemm_linear_relu_forward(h2, h1, m->w2, m->b2, n, L1, L2) == DLREC_OK &&
      cpu_sgemm_linear_forward(z, h2, m->w3, m->b3, n, L2, 1) == DLREC_OK &&
      dlrec_metrics_compute(z, y, (size_t)n, &met) == DLREC_OK)
    auc = met.auc;
  free(h1), free(h2), free(z);
  return auc;
}

static dlrec_status mlp_train(mlp *m, cpu_gemm *g, const float *x, const float *y) {
  float *grad = calloc(m->n, sizeof(float)), *m1 = calloc(m->n, sizeof(float)), *m2 = calloc(m->n, sizeof(float));
  float *dw1 = grad, *db1 = dw1 + L1 * LD, *dw2 = db1 + L1, *db2 = dw2 + L2 * L1, *dw3 = db2 + L2, *db3 = dw3 + L2;
  float h1[LBATCH * L1], h2[LBATCH * L2], z[LBATCH], dz[LBATCH], dh1[LBATCH * L1], dh2[LBATCH * L2];
  const double lr = 0.003, beta1 = 0.9, beta2 = 0.999;
  dlrec_status s = DLREC_OK;
  uint64_t t = 0;
  for (int e = 0; e < LEPOCHS && s == DLREC_OK; e++)
    for (int s0 = 0; s0 + LBATCH <= N_TRAIN && s == DLREC_OK; s0 += LBATCH) {
      const float *xb = x + (size_t)s0 * LD;
      if ((s = cpu_linear_forward(g, h1, xb, m->w1, m->b1, LBATCH, LD, L1, DLREC_ACT_RELU)) ||
          (s = cpu_linear_forward(g, h2, h1, m->w2, m->b2, LBATCH, L1, L2, DLREC_ACT_RELU)) ||
          (s = cpu_linear_forward(g, z, h2, m->w3, m->b3, LBATCH, L2, 1, DLREC_ACT_NONE)))
        break;
      for (int b = 0; b < LBATCH; b++) dz[b] = (float)((1 / (1 + exp(-z[b])) - y[s0 + b]) / LBATCH);
      memset(grad, 0, m->n * sizeof(float));
      if ((s = cpu_linear_backward(g, dh2, dw3, db3, dz, h2, m->w3, LBATCH, L2, 1))) break;
      for (int i = 0; i < LBATCH * L2; i++) dh2[i] = h2[i] > 0 ? dh2[i] : 0;
      if ((s = cpu_linear_backward(g, dh1, dw2, db2, dh2, h1, m->w2, LBATCH, L1, L2))) break;
      for (int i = 0; i < LBATCH * L1; i++) dh1[i] = h1[i] > 0 ? dh1[i] : 0;
      if ((s = cpu_linear_backward(g, NULL, dw1, db1, dh1, xb, NULL, LBATCH, LD, L1))) break;
      t++;
      double c1 = 1 - pow(beta1, (double)t), c2 = 1 - pow(beta2, (double)t);
      for (size_t i = 0; i < m->n; i++) {
        m1[i] = (float)(beta1 * m1[i] + (1 - beta1) * grad[i]);
        m2[i] = (float)(beta2 * m2[i] + (1 - beta2) * grad[i] * grad[i]);
        m->p[i] -= (float)(lr * (m1[i] / c1) / (sqrt(m2[i] / c2) + 1e-8));
      }
    }
  free(grad), free(m1), free(m2);
  return s;
}

/* Stated distance: the bf16 run's AUC within 0.003 of the fp32 run's. */
#define MAX_AUC_GAP 0.003

/* The fused cross backward (cpu_gemm_cross_backward, oneDNN's bf16 path)
 * has the bits of cross.c's gate backward, GEMMs, bias pass and residual add
 * run one after another on the same GEMMs (cpu_cross_backward_composed): dx0, dW and dbias accumulated
 * onto nonzero values, dxl overwritten. Shapes: one row, d not a multiple of
 * 16, and B·d large enough that 1 and 3 threads split the columns
 * (nn_column_width). Where bf16 is emulated there is nothing fused: said,
 * and the composition is what runs. */
TEST(bf16_fused_cross_backward_matches_composition) {
  cpu_gemm *g;
  int native = -1;
  CHECK_OK(cpu_gemm_create(&g, DLREC_PRECISION_BF16, &native));
  if (!cpu_gemm_fuses_cross(g)) {
    printf("test_precision: %s: no fused cross backward to compare\n", cpu_gemm_describe(g));
    CHECK_ERR(cpu_gemm_cross_backward(g, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1),
              DLREC_ERR_INTERNAL, "oneDNN's bf16 path only");
    cpu_gemm_free(g);
    return;
  }
  static const int shapes[][3] = {{1, 5, 1}, {9, 37, 1}, {300, 200, 1}, {300, 200, 3}, {129, 429, 2}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int B = shapes[s][0], d = shapes[s][1];
    omp_set_num_threads(shapes[s][2]);
    const size_t n = (size_t)B * d, nw = (size_t)d * d;
    float *x0 = malloc(n * 4), *xl = malloc(n * 4), *u = malloc(n * 4), *dout = malloc(n * 4), *w = malloc(nw * 4);
    float *dx0[2], *dxl[2], *dw[2], *db[2], *ws = malloc(dlrec_cross_ws_floats(B, d, 0) * 4);
    rng_state = 1000 + s;
    fill(x0, n, 1), fill(xl, n, 1), fill(u, n, 2), fill(dout, n, 0.5), fill(w, nw, 0.1);
    for (int k = 0; k < 2; k++) {
      dx0[k] = malloc(n * 4), dxl[k] = malloc(n * 4), dw[k] = malloc(nw * 4), db[k] = malloc((size_t)d * 4);
      rng_state = 2000 + s; /* the same accumulated starting values for both */
      fill(dx0[k], n, 1), fill(dxl[k], n, 1), fill(dw[k], nw, 1), fill(db[k], (size_t)d, 1);
    }
    CHECK_OK(cpu_gemm_cross_backward(g, dx0[0], dxl[0], dw[0], db[0], dout, x0, xl, u, w, ws, B, d));
    CHECK_OK(cpu_cross_backward_composed(g, dx0[1], dxl[1], dw[1], db[1], dout, x0, xl, u, w, ws, B, d));
    CHECK(!memcmp(dx0[0], dx0[1], n * 4));
    CHECK(!memcmp(dxl[0], dxl[1], n * 4));
    CHECK(!memcmp(dw[0], dw[1], nw * 4));
    CHECK(!memcmp(db[0], db[1], (size_t)d * 4));
    for (int k = 0; k < 2; k++) free(dx0[k]), free(dxl[k]), free(dw[k]), free(db[k]);
    free(x0), free(xl), free(u), free(dout), free(w), free(ws);
  }
  omp_set_num_threads(1);
  CHECK_ERR(cpu_gemm_cross_backward(g, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1),
            DLREC_ERR_INVALID, "NULL buffer");
  float one = 1;
  CHECK_ERR(cpu_gemm_cross_backward(g, &one, &one, &one, &one, &one, &one, &one, &one, &one, &one, 0, 1),
            DLREC_ERR_INVALID, "bad shape");
  cpu_gemm_free(g);
}

TEST(bf16_training_reaches_fp32_auc) {
  float *x = malloc(sizeof(float) * N_TRAIN * LD), *y = malloc(sizeof(float) * N_TRAIN);
  float *vx = malloc(sizeof(float) * N_VALID * LD), *vy = malloc(sizeof(float) * N_VALID);
  float *p_train = malloc(sizeof(float) * N_TRAIN), *p_valid = malloc(sizeof(float) * N_VALID);
  make_data(x, y, p_train, N_TRAIN);
  make_data(vx, vy, p_valid, N_VALID);
  dlrec_metrics best;
  CHECK_OK(dlrec_metrics_compute(p_valid, vy, N_VALID, &best));

  double auc[2];
  mlp m[2];
  for (int k = 0; k < 2; k++) {
    cpu_gemm *g;
    int native;
    CHECK_OK(cpu_gemm_create(&g, k ? DLREC_PRECISION_BF16 : DLREC_PRECISION_FP32, &native));
    mlp_init(&m[k]);
    double before = mlp_auc(&m[k], vx, vy, N_VALID);
    CHECK_OK(mlp_train(&m[k], g, x, y));
    auc[k] = mlp_auc(&m[k], vx, vy, N_VALID);
    fprintf(stderr, "%s: AUC %.4f -> %.4f\n", cpu_gemm_describe(g), before, auc[k]);
    cpu_gemm_free(g);
  }
  double max_dw = 0;
  for (size_t i = 0; i < m[0].n; i++) max_dw = fmax(max_dw, fabs(m[0].p[i] - m[1].p[i]));
  fprintf(stderr, "best possible AUC %.4f; fp32 %.4f, bf16 %.4f; largest weight difference %.4g\n", best.auc,
          auc[0], auc[1], max_dw);
  /* Both learned (close to the teacher's own AUC), along different paths. */
  CHECK(auc[0] > best.auc - 0.02);
  CHECK(max_dw > 1e-3);
  CHECK(fabs(auc[1] - auc[0]) <= MAX_AUC_GAP);
  free(m[0].p), free(m[1].p);
  free(x), free(y), free(vx), free(vy), free(p_train), free(p_valid);
}

/* The oneDNN matmul wrapper in fp32, on every CPU: what the native bf16 path
 * shares with it (the strided views of transposed operands, the bias, the
 * ReLU and sum post-ops, the per-shape cache) runs here against a naive
 * double loop, for every combination of transpositions, bias, activation
 * and accumulation, each shape called twice (the second from the cache).
 * Only the operands' data type differs on a CPU with native bf16. */
TEST(onednn_f32_matmul_matches_reference) {
  if (!cpu_dnnl_available()) {
    printf("test_precision: no oneDNN in this build: onednn_f32_matmul skipped\n");
    return;
  }
  cpu_dnnl *d;
  CHECK_OK(cpu_dnnl_create(&d, 0));
  enum { M = 7, N = 5, K = 9 };
  float a[M * K], b[K * N], bias[N], out[M * N], before[M * N];
  rng_state = 77;
  for (int i = 0; i < M * K; i++) a[i] = (float)(uniform() * 2 - 1);
  for (int i = 0; i < K * N; i++) b[i] = (float)(uniform() * 2 - 1);
  for (int i = 0; i < N; i++) bias[i] = (float)(uniform() * 2 - 1);
  for (int combo = 0; combo < 32; combo++) {
    const int at = combo & 1, bt = (combo >> 1) & 1, has_bias = (combo >> 2) & 1, relu = (combo >> 3) & 1,
              acc = (combo >> 4) & 1;
    if (acc && (has_bias || relu)) continue; /* accumulate goes without bias and act (cpu_dnnl.h) */
    for (int rep = 0; rep < 2; rep++) {
      for (int i = 0; i < M * N; i++) before[i] = out[i] = (float)(uniform() * 2 - 1);
      CHECK_OK(cpu_dnnl_matmul(d, out, a, at, b, bt, has_bias ? bias : NULL, M, N, K,
                               relu ? DLREC_ACT_RELU : DLREC_ACT_NONE, acc));
      for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
          double s = has_bias ? bias[n] : 0;
          for (int k = 0; k < K; k++) s += (double)a[at ? k * M + m : m * K + k] * b[bt ? n * K + k : k * N + n];
          if (relu && s < 0) s = 0;
          if (acc) s += before[m * N + n];
          CHECK_NEAR(out[m * N + n], s, 1e-5, 1e-5);
        }
    }
  }
  cpu_dnnl_free(d);
}
