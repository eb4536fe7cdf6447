/* The op-by-op backend test (issue 10; ggml's test-backend-ops), a loop over
 * the op table: every op of src/backend/ops.def, on every backend in the
 * build (dlrec_backend_name_at) and on cpu-mirror (the CPU run as a
 * device), in every precision each can be created in, against the naive
 * double-precision references of tests/ref/ref.c. What each op's test
 * needs is data on its table line (the shapes, how inputs are drawn, each
 * output's tolerance, its reference, the forward a backward is the
 * gradient of); the registry below expands it, and one loop runs it:
 *   - forward outputs against the reference forward;
 *   - backward outputs against the reference backward AND against central
 *     differences of the reference forward (and the reference backward
 *     against those differences too, so the two cannot share a mistake),
 *     the backward run after its forward on the backend, on the forward's
 *     inputs and saved activations;
 *   - what accumulates and what is overwritten: accumulated outputs are
 *     pre-filled with random values that must survive under the sum,
 *     overwritten ones with NaN that must not; nothing written past an
 *     output's end, an optional output passed as NULL left alone;
 *   - in-place uses the op allows, and arguments it must refuse (touching
 *     nothing);
 *   - bitwise batch invariance of the scoring ops (a row scored alone has
 *     the bits it has inside a batch).
 * An op whose arguments the loop cannot draw (tables, optimizers, packed
 * layers) names a CUSTOM case, below. So do the behaviours that are not one
 * op's: the memory ops, kept operands, fresh gradients, mirrored tables,
 * cpu-mirror refusing host pointers, the split batch normalization's
 * protocol. Inputs live in the backend's memory (alloc + upload, download
 * to check), so a device backend runs the same test. Shapes include B = 1
 * and odd sizes, and sizes past each kernel's threaded threshold; the
 * finite differences run on the small ones.
 *
 * Tolerances, per dtype: |got − want| <= bound, with mag the sum of the
 * absolute values of the terms that make the output (Σ_k |a_k b_k| for a
 * product; a stated size where the test does not sum them exactly):
 *
 *   comparison                         bound
 *   ---------------------------------  ------------------------------------------------
 *   bits (copies, fills, one rounding) the same bits (any NaN for a NaN)
 *   exact (copies, masks, selects)     0
 *   fp32, any op                       FP32_REL · (|want| + mag) + FP32_ABS
 *   bf16 backend, GEMM ops             BF16_TERMS_REL · mag + the fp32 bound
 *   tf32 backend (a GPU's), GEMM ops   TF32_TERMS_REL · mag + the fp32 bound
 *   fp16 backend, GEMM ops             FP16_TERMS_REL · mag + the fp32 bound
 *   against a finite difference        the bound above + FD_ABS
 *   reference backward vs differences  REF_FD_REL · (1 + |difference|)
 *
 * The GEMM ops (the linear layers' forward and backward) round each operand
 * to bfloat16 in a bf16 backend: with 8 significant bits, round to nearest
 * has relative error u <= 2^-8 per operand, so a product a_k b_k is off by
 * at most (2u + u²) |a_k b_k| = (2^-7 + 2^-16) |a_k b_k| and the fp32 sum by
 * BF16_TERMS_REL · Σ_k |a_k b_k| plus fp32's own rounding. TF32 keeps 11
 * significant bits; taken as truncated (u <= 2^-10, cuBLASLt does not say
 * how it rounds), TF32_TERMS_REL = 2u + u². fp16 keeps 11 significant bits
 * and rounds to nearest (u <= 2^-11): FP16_TERMS_REL = 2u + u² (the cases'
 * operands are far from fp16's overflow, and the few below its normal range
 * weigh nothing against the other terms of their sums). The cross
 * layers' products are such GEMMs (and so is whatever their outputs feed);
 * every other op stays fp32 in a bf16 backend and keeps the fp32 bound.
 * A bit-for-bit comparison holds where the op's result is one rounding of
 * its inputs (a copy, an add, a product, a sum taken in double and rounded
 * once): a double reference rounded to float is then float arithmetic's
 * (the double has more than twice the float's bits).
 */
#include <omp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/ops_table.h"
#include "core/rng.h"
#include "ref/ref.h"
#include "test.h"

#define FP32_REL 1e-5
#define FP32_ABS 1e-6
#define BF16_TERMS_REL (0x1p-7 + 0x1p-16)
#define TF32_TERMS_REL (0x1p-9 + 0x1p-20)
#define FP16_TERMS_REL (0x1p-10 + 0x1p-22)
#define FD_ABS 1e-6
#define REF_FD_REL 1e-6

typedef enum cmp_kind {
  CMP_BITS,  /* the same bits */
  CMP_EXACT, /* the same value */
  CMP_FP32,  /* fp32 in every backend */
  CMP_GEMM,  /* a GEMM: bf16 operands in a bf16 backend */
} cmp_kind;

/* ---- the backend under test, and what a case allocates ---------------------------- */

static dlrec_backend *g_be;
static char g_tag[64]; /* "cpu fp32", for the messages */
static double g_terms_rel; /* the GEMMs' per-term bound: 0 in fp32, *_TERMS_REL in bf16 and tf32 */
static dlrec_rng g_rng;

#define ARENA_MAX 4096
static void *g_host[ARENA_MAX], *g_dev[ARENA_MAX];
static int g_nhost, g_ndev;

static void fail_at(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_at(int line, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  test_fail(__FILE__, line, "[%s] %s", g_tag, msg);
}
#define FAIL(...) fail_at(__LINE__, __VA_ARGS__)

static void *hkeep(void *p) {
  if (!p || g_nhost == ARENA_MAX) abort(); /* a test cannot go on */
  return g_host[g_nhost++] = p;
}
static float *hf(size_t n) { return hkeep(calloc(n ? n : 1, sizeof(float))); }
static double *hd(size_t n) { return hkeep(calloc(n ? n : 1, sizeof(double))); }

/* n floats uniform in [lo, hi). */
static float *hrand(size_t n, float lo, float hi) {
  float *p = hf(n);
  for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)dlrec_rng_uniform(&g_rng);
  return p;
}
/* n integers drawn from lo .. hi, as floats: exact in bf16 for |x| <= 256. */
static float *hrand_int(size_t n, int lo, int hi) {
  float *p = hf(n);
  for (size_t i = 0; i < n; i++) p[i] = (float)(lo + (int)(dlrec_rng_uniform(&g_rng) * (hi - lo + 1) * 0.999999));
  return p;
}
static double *hdbl(const float *f, size_t n) {
  double *d = hd(n);
  ref_to_double(d, f, n);
  return d;
}

static void *dalloc(size_t bytes) {
  void *p = g_be->ops->alloc(g_be, bytes);
  if (!p || g_ndev == ARENA_MAX) abort();
  return g_dev[g_ndev++] = p;
}
/* A copy of host floats in the backend's memory. */
static float *dup(const float *h, size_t n) {
  float *d = dalloc((n ? n : 1) * sizeof(float));
  if (n && g_be->ops->upload(g_be, d, h, n * sizeof(float)) != DLREC_OK) FAIL("upload: %s", dlrec_last_error());
  return d;
}
/* n floats of NaN in the backend's memory: an output the op must overwrite. */
static float *dnan(size_t n) {
  float *h = hf(n);
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  return dup(h, n);
}
/* The backend's floats back on the host. */
static float *down(const float *d, size_t n) {
  float *h = hf(n);
  if (n && g_be->ops->download(g_be, h, d, n * sizeof(float)) != DLREC_OK) FAIL("download: %s", dlrec_last_error());
  return h;
}

static void case_end(void) {
  while (g_ndev) g_be->ops->release(g_be, g_dev[--g_ndev]);
  while (g_nhost) free(g_host[--g_nhost]);
}

/* Runs an op. The CPU backend runs each op on its own thread count by
 * setting the calling thread's OpenMP team size (src/backend/cpu/cpu.c), so the
 * caller's setting is moved away first and must come back as the
 * backend's. */
static int op_done(int line, const char *name, dlrec_status st) {
  if (st != DLREC_OK) {
    fail_at(line, "%s: %s", name, dlrec_last_error());
    return 1;
  }
  if (!strcmp(g_be->name, "cpu") && omp_get_max_threads() != (int)g_be->threads) {
    fail_at(line, "%s ran on the caller's %d threads, not the backend's %u", name, omp_get_max_threads(),
            g_be->threads);
    return 1;
  }
  return 0;
}
/* An op the backend does not have yet (a NULL entry; src/backend/cuda/cuda.c
 * says which) is skipped, said once per backend, precision and op. */
static int lacks(const char *name, int missing) {
  if (!missing) return 0;
  static char said[64][96];
  static int n_said;
  char key[96];
  snprintf(key, sizeof key, "%s %s", g_tag, name);
  for (int i = 0; i < n_said; i++)
    if (!strcmp(said[i], key)) return 1;
  if (n_said < 64) snprintf(said[n_said++], sizeof said[0], "%s", key);
  printf("test_backend: %s: %s skipped: not in this backend yet\n", g_tag, name);
  return 1;
}
#define HAS(name) (!lacks(#name, g_be->ops->name == NULL))
#define OP(name, ...)                                                                                              \
  (!HAS(name) ? 1                                                                                                  \
              : (omp_set_num_threads((int)g_be->threads + 1),                                                      \
                 op_done(__LINE__, #name, BE_OP(g_be, name, __VA_ARGS__))))

/* ---- comparisons ------------------------------------------------------------------------- */

static double bound(cmp_kind k, double want, double mag) {
  if (k == CMP_EXACT || k == CMP_BITS) return 0;
  double b = FP32_REL * (fabs(want) + mag) + FP32_ABS;
  if (k == CMP_GEMM) b += g_terms_rel * mag;
  return b;
}

/* got[i] against ref[i] + pre[i] (pre: what an accumulated output held
 * before, or NULL), with magnitude mag[i] (or mag0 when mag is NULL) plus
 * |pre[i]|. Reports the first miss; returns the number of misses (0 or 1). */
static int check_vals(int line, const char *what, const float *got, const float *pre, const double *ref,
                      const double *mag, double mag0, size_t n, cmp_kind k) {
  for (size_t i = 0; i < n; i++) {
    const double p = pre ? pre[i] : 0, want = ref[i] + p, m = (mag ? mag[i] : mag0) + fabs(p);
    const double b = bound(k, want, m);
    if (k == CMP_EXACT ? !((float)want == got[i] || (isnan(want) && isnan(got[i]))) : !(fabs(got[i] - want) <= b)) {
      fail_at(line, "%s[%zu] = %.9g, reference %.9g (bound %.3g)", what, i, got[i], want, b);
      return 1;
    }
  }
  return 0;
}
#define CHECKV(...) check_vals(__LINE__, __VA_ARGS__)

/* The gradient in param[0 .. n) three ways: the central difference of the
 * reference's loss L, the reference backward refb, and the backend's got
 * (minus pre, its value before an accumulating op). */
static int check_fd(int line, const char *what, const float *got, const float *pre, const double *refb,
                    const double *mag, double mag0, double *param, size_t n, ref_loss_fn L, void *ctx, double h,
                    cmp_kind k) {
  for (size_t i = 0; i < n; i++) {
    const double fd = ref_central_difference(L, ctx, &param[i], h);
    if (!(fabs(refb[i] - fd) <= REF_FD_REL * (1 + fabs(fd)))) {
      fail_at(line, "reference backward %s[%zu] = %.9g, finite difference %.9g", what, i, refb[i], fd);
      return 1;
    }
    const double p = pre ? pre[i] : 0, b = bound(k, fd, (mag ? mag[i] : mag0) + fabs(p)) + FD_ABS;
    if (!(fabs(got[i] - p - fd) <= b)) {
      fail_at(line, "%s[%zu] = %.9g, finite difference %.9g (bound %.3g)", what, i, got[i] - p, fd, b);
      return 1;
    }
  }
  return 0;
}
#define CHECKFD(...) check_fd(__LINE__, __VA_ARGS__)

/* ---- every backend, every precision ------------------------------------------------------ */

/* Runs body on each backend of the build in fp32 and, where it can be
 * created, bf16 and fp16, and tf32 where the backend has it (a GPU; the CPU
 * runs tf32 as fp32, which is checked, not run twice), on 2 threads; says
 * once per backend why bf16 or tf32 is skipped. */
static void each_backend(void (*body)(void), uint64_t seed) {
  static char skipped_said[8], tf32_said[8];
  /* The listed backends, then cpu-mirror: the CPU's ops on memory the host
   * cannot touch between them, which refuse host pointers, so every case
   * also runs the way it runs on a GPU (the bag cases through mirrors). */
  for (size_t i = 0; i == 0 || dlrec_backend_name_at(i - 1); i++) {
    const char *name = dlrec_backend_name_at(i) ? dlrec_backend_name_at(i) : "cpu-mirror";
    static const dlrec_precision precisions[] = {DLREC_PRECISION_FP32, DLREC_PRECISION_BF16, DLREC_PRECISION_TF32,
                                                 DLREC_PRECISION_FP16};
    for (size_t pi = 0; pi < sizeof precisions / sizeof precisions[0]; pi++) {
      const dlrec_precision p = precisions[pi];
      dlrec_backend_config c = {2, p, 0};
      dlrec_backend *be = NULL;
      dlrec_status st = dlrec_backend_create(&be, name, &c);
      /* A GPU backend with no GPU visible (or, for now, no ops) is skipped,
       * saying why; the CPU backend must always be there. */
      if (st == DLREC_ERR_UNSUPPORTED && strcmp(name, "cpu") && p == DLREC_PRECISION_FP32) {
        printf("test_backend: %s: skipped: %s\n", name, dlrec_last_error());
        break;
      }
      if (st != DLREC_OK && p == DLREC_PRECISION_BF16) {
        if (i < sizeof skipped_said && !skipped_said[i]++)
          printf("test_backend: %s: bf16 skipped: the backend cannot be created in bf16 (%s: %s)\n", name,
                 dlrec_status_name(st), dlrec_last_error());
        continue;
      }
      if (st != DLREC_OK) {
        test_fail(__FILE__, __LINE__, "backend %s in %s: %s", name, dlrec_precision_name(c.precision),
                  dlrec_last_error());
        continue;
      }
      const dlrec_precision got = dlrec_backend_precision(be);
      if (p == DLREC_PRECISION_TF32 && got != DLREC_PRECISION_TF32) {
        if (got != DLREC_PRECISION_FP32)
          test_fail(__FILE__, __LINE__, "backend %s: tf32 resolved to %s, not fp32", name, dlrec_precision_name(got));
        else if (i < sizeof tf32_said && !tf32_said[i]++)
          printf("test_backend: %s: tf32 resolves to fp32 here (no TF32 unit): not run twice\n", name);
        dlrec_backend_free(be);
        continue;
      }
      g_be = be;
      g_terms_rel = got == DLREC_PRECISION_BF16   ? BF16_TERMS_REL
                    : got == DLREC_PRECISION_TF32 ? TF32_TERMS_REL
                    : got == DLREC_PRECISION_FP16 ? FP16_TERMS_REL
                                                  : 0;
      snprintf(g_tag, sizeof g_tag, "%s %s", name, dlrec_precision_name(dlrec_backend_precision(be)));
      /* The same draws on every backend and in every precision: the cases'
       * fixed inputs (finite differences that keep clear of ReLU's kink
       * among them) were chosen on these draws. */
      dlrec_rng_seed(&g_rng, seed, 0);
      const int threads = omp_get_max_threads();
      body();
      case_end();
      omp_set_num_threads(threads);
      dlrec_backend_free(be);
      g_be = NULL;
    }
  }
}

/* ---- the backend itself and its memory ------------------------------------------------------ */

TEST(backends_are_listed_and_describe_themselves) {
  CHECK(dlrec_backend_name_at(0) != NULL);
  CHECK_STR(dlrec_backend_name_at(0), "cpu");
  for (size_t i = 0; dlrec_backend_name_at(i); i++) {
    dlrec_backend *be = NULL;
    dlrec_backend_config c = {3, DLREC_PRECISION_FP32, 0};
    dlrec_status st = dlrec_backend_create(&be, dlrec_backend_name_at(i), &c);
    if (i > 0 && st == DLREC_ERR_UNSUPPORTED) {
      printf("test_backend: %s: skipped: %s\n", dlrec_backend_name_at(i), dlrec_last_error());
      continue;
    }
    CHECK_OK(st);
    const int ok = dlrec_backend_threads(be) == 3 && dlrec_backend_precision(be) == DLREC_PRECISION_FP32 &&
                   !dlrec_backend_bf16_native(be) && dlrec_backend_describe(be)[0] &&
                   !strcmp(dlrec_backend_name(be), dlrec_backend_name_at(i));
    dlrec_backend_free(be);
    CHECK(ok);
  }
  dlrec_backend *be = (dlrec_backend *)1;
  CHECK_ERR(dlrec_backend_create(&be, "no-such-backend", NULL), DLREC_ERR_INVALID, "cpu");
  CHECK(be == NULL);
}

/* Devices by name: "cpu", "cuda", "cuda:N" parsed; dlrec_backend_create_on
 * makes the CPU backend from "cpu" or NULL, refuses a malformed name, and
 * for "cuda" either refuses saying why (a build without the toolkit, no GPU
 * visible, an index past the machine's GPUs) or makes a backend called
 * "cuda". `dlrec version`'s lines say the same. */
TEST(devices_are_parsed_and_cuda_says_why_it_is_missing) {
  const char *name = NULL;
  uint32_t index = 9;
  CHECK_OK(dlrec_device_parse("cpu", &name, &index));
  CHECK(!strcmp(name, "cpu") && index == 0);
  CHECK_OK(dlrec_device_parse("cuda", &name, &index));
  CHECK(!strcmp(name, "cuda") && index == 0);
  CHECK_OK(dlrec_device_parse("cuda:7", &name, &index));
  CHECK(!strcmp(name, "cuda") && index == 7);
  CHECK_ERR(dlrec_device_parse("cuda:x", &name, &index), DLREC_ERR_INVALID, "cpu, cuda, cuda:N");
  CHECK_ERR(dlrec_device_parse(NULL, &name, &index), DLREC_ERR_INVALID, "(null)");
  dlrec_backend_config c = {2, DLREC_PRECISION_FP32, 0};
  dlrec_backend *be = NULL;
  CHECK_OK(dlrec_backend_create_on(&be, NULL, &c));
  CHECK(be && !strcmp(dlrec_backend_name(be), "cpu") && dlrec_backend_threads(be) == 2);
  dlrec_backend_free(be);
  CHECK_OK(dlrec_backend_create_on(&be, "cpu", NULL));
  CHECK(be && !strcmp(dlrec_backend_name(be), "cpu"));
  dlrec_backend_free(be);
  CHECK_ERR(dlrec_backend_create_on(&be, "tpu", &c), DLREC_ERR_INVALID, "device 'tpu'");
  CHECK(be == NULL);
  char cpu[256], cuda[1024];
  dlrec_backend_devices("cpu", cpu, sizeof cpu);
  dlrec_backend_devices("cuda", cuda, sizeof cuda);
  CHECK(strstr(cpu, "cores; fp32 GEMMs (") != NULL && strstr(cpu, "; bf16 GEMMs (") != NULL);
  /* The fp32 GEMMs it names are those a CPU backend of that precision runs. */
  CHECK_OK(dlrec_backend_create_on(&be, "cpu", &c));
  const char *gemms = strstr(dlrec_backend_describe(be), "fp32 GEMMs (");
  CHECK(gemms && strstr(cpu, gemms));
  dlrec_backend_free(be);
  int has_cuda = 0;
  for (size_t i = 0; dlrec_backend_name_at(i); i++) has_cuda |= !strcmp(dlrec_backend_name_at(i), "cuda");
  dlrec_status st = dlrec_backend_create_on(&be, "cuda:3", &c);
  if (!has_cuda) {
    CHECK_ERR(st, DLREC_ERR_INVALID, "built without the CUDA toolkit");
    CHECK_STR(cuda, "not in this build (built without the CUDA toolkit)");
  } else if (st == DLREC_OK) {
    CHECK(!strcmp(dlrec_backend_name(be), "cuda"));
    dlrec_backend_free(be);
  } else if (strstr(cuda, "no CUDA device visible")) {
    CHECK_ERR(st, DLREC_ERR_UNSUPPORTED, "cuda:3: no CUDA device visible");
  } else {
    /* GPUs listed: device 3 is either beyond them or found and refused. */
    CHECK(strstr(cuda, "cuda:0 ") == cuda);
    CHECK(st == DLREC_ERR_INVALID || st == DLREC_ERR_UNSUPPORTED);
    CHECK(strstr(dlrec_last_error(), "cuda:3") != NULL);
  }
  /* Where a GPU is listed, its backend is made, and names it. */
  if (strstr(cuda, "cuda:0 ") == cuda) {
    CHECK_OK(dlrec_backend_create_on(&be, "cuda", &c));
    CHECK(be && strstr(dlrec_backend_describe(be), "cuda:0 ") == dlrec_backend_describe(be));
    dlrec_backend_free(be);
  }
  /* The memory of each: the machine's RAM, a GPU's, or why not. */
  uint64_t total = 0, avail = 0;
  CHECK_OK(dlrec_device_memory("cpu", &total, &avail));
  CHECK(total > ((uint64_t)64 << 20) && avail > 0 && avail <= total);
  CHECK_ERR(dlrec_device_memory("ram", &total, &avail), DLREC_ERR_INVALID, "device 'ram'");
  st = dlrec_device_memory("cuda:0", &total, &avail);
  if (strstr(cuda, "cuda:0 ") == cuda) CHECK(st == DLREC_OK && avail <= total && total > 0);
  else CHECK_ERR(st, DLREC_ERR_UNSUPPORTED, has_cuda ? "no CUDA device visible" : "built without the CUDA toolkit");
  printf("test_backend: devices: cpu: %s; cuda: %s\n", cpu, cuda);
}

static void case_memory(void) {
  static const size_t sizes[] = {0, 1, 3, 63, 64, 65, 4097, 1 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const size_t n = sizes[s];
    unsigned char *d = dalloc(n);
    if ((uintptr_t)d % 64) {
      FAIL("alloc(%zu) = %p: not 64-byte aligned", n, (void *)d);
      return;
    }
    unsigned char *h = hkeep(malloc(n + 1)), *back = hkeep(malloc(n + 1));
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 131 + s);
    memset(back, 0xa5, n + 1);
    if (g_be->ops->upload(g_be, d, h, n) != DLREC_OK || g_be->ops->synchronize(g_be) != DLREC_OK ||
        g_be->ops->download(g_be, back, d, n) != DLREC_OK || g_be->ops->synchronize(g_be) != DLREC_OK) {
      FAIL("round trip of %zu bytes: %s", n, dlrec_last_error());
      return;
    }
    if (memcmp(h, back, n) || back[n] != 0xa5) {
      FAIL("round trip of %zu bytes: the bytes differ, or a byte past them was written", n);
      return;
    }
    /* A part in the middle, at an odd offset, both ways. */
    if (n > 8 && (g_be->ops->upload(g_be, d + 3, h, n - 5) != DLREC_OK ||
                  g_be->ops->download(g_be, back, d + 3, n - 5) != DLREC_OK || memcmp(h, back, n - 5))) {
      FAIL("round trip of %zu bytes at offset 3 differs", n - 5);
      return;
    }
  }
  g_be->ops->release(g_be, NULL);
  unsigned char b[4] = {0};
  if (g_be->ops->upload(g_be, NULL, b, 4) == DLREC_OK || g_be->ops->download(g_be, b, NULL, 4) == DLREC_OK)
    FAIL("a copy with a NULL buffer succeeded");
}

/* ---- the op registry, expanded from src/backend/ops.def ----------------------------------- */

/* The dims an op's sizes and values are expressions of (ops.def's SHAPES
 * name them); the ones an op does not use stay 0. */
typedef struct op_dims {
  int64_t B, IN, OUT, F, D, DX, d, r, K, C, n, rows, width, src_ld, dst_ld;
  int64_t relu, bias, first, nodin, fd, q, train, bc, bad;
} op_dims;
#define DIMS_LOCALS(s)                                                                                              \
  const int64_t B = (s)->B, IN = (s)->IN, OUT = (s)->OUT, F = (s)->F, D = (s)->D, DX = (s)->DX, d = (s)->d,         \
                r = (s)->r, K = (s)->K, C = (s)->C, n = (s)->n, rows = (s)->rows, width = (s)->width,               \
                src_ld = (s)->src_ld, dst_ld = (s)->dst_ld, relu = (s)->relu, bias = (s)->bias,                     \
                first = (s)->first, nodin = (s)->nodin, fd = (s)->fd, q = (s)->q, train = (s)->train, bc = (s)->bc,  \
                bad = (s)->bad;                                                                                     \
  (void)B;                                                                                                          \
  (void)IN;                                                                                                         \
  (void)OUT;                                                                                                        \
  (void)F;                                                                                                          \
  (void)D;                                                                                                          \
  (void)DX;                                                                                                         \
  (void)d;                                                                                                          \
  (void)r;                                                                                                          \
  (void)K;                                                                                                          \
  (void)C;                                                                                                          \
  (void)n;                                                                                                          \
  (void)rows;                                                                                                       \
  (void)width;                                                                                                      \
  (void)src_ld;                                                                                                     \
  (void)dst_ld;                                                                                                     \
  (void)relu;                                                                                                       \
  (void)bias;                                                                                                       \
  (void)first;                                                                                                      \
  (void)nodin;                                                                                                      \
  (void)fd;                                                                                                         \
  (void)q;                                                                                                          \
  (void)train;                                                                                                      \
  (void)bc;                                                                                                         \
  (void)bad

typedef enum op_role {
  ROLE_IN, ROLE_OUT, ROLE_ACC, ROLE_INOUT, ROLE_WS, ROLE_ACT, ROLE_TABLE, ROLE_DIM, ROLE_VAL, ROLE_HOST, ROLE_OBJ,
} op_role;
static int is_buffer(op_role r) { return r <= ROLE_ACT; }
static int is_compared(op_role r) { return r == ROLE_OUT || r == ROLE_ACC || r == ROLE_INOUT; }
static int is_written(op_role r) { return r != ROLE_IN && is_buffer(r); }

/* One argument of an op: its name, role, and the bytes of a buffer's
 * element (4: float, 8: double; a host index list's 4). */
typedef struct op_arg {
  const char *name;
  op_role role;
  size_t elem;
} op_arg;

/* A value of an argument: a pointer, a size or a scalar (both ways). */
typedef struct test_val {
  void *p;
  int64_t i;
  double f;
} test_val;

/* How an input is drawn: uniform in [lo, hi); UINT as integers in lo .. hi
 * where the backend's GEMMs round their operands (so that they are exact),
 * else uniform; SPECIAL uniform with v[] at positions at, at + 1, ...;
 * LABELS uniform in [0, 1) with every third a hard 0 or 1; PERM a host list
 * of distinct rows below dims.rows, shuffled (the last one rows itself, past
 * the end, where dims.bad). */
typedef enum draw_kind { DRAW_U, DRAW_UINT, DRAW_SPECIAL, DRAW_LABELS, DRAW_PERM } draw_kind;
typedef struct draw_spec {
  draw_kind kind;
  double lo, hi;
  int at, n;
  double v[8];
} draw_spec;
#define U(lo, hi) ((draw_spec){DRAW_U, (lo), (hi), 0, 0, {0}})
#define UINT(lo, hi) ((draw_spec){DRAW_UINT, (lo), (hi), 0, 0, {0}})
#define SPECIAL(lo, hi, at, ...)                                                                                    \
  ((draw_spec){DRAW_SPECIAL, (lo), (hi), (at), (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)), {__VA_ARGS__}})
#define LABELS ((draw_spec){DRAW_LABELS, 0, 1, 0, 0, {0}})
#define PERM ((draw_spec){DRAW_PERM, 0, 0, 0, 0, {0}})

typedef enum link_kind { LINK_WRT, LINK_INPLACE, LINK_ALIAS } link_kind;
#define SPEC_MAX 24

struct op_case;
/* What ops.def's test column says of an op, for one set of dims. */
typedef struct op_spec {
  const op_dims *shapes;
  int n_shapes;
  struct {
    size_t off;
    int n;
    int64_t v[8];
  } vary[4];
  int n_vary;
  struct {
    size_t off;
    int64_t v;
  } fix[4];
  int n_fix;
  struct {
    const char *arg;
    draw_spec d;
  } draws[SPEC_MAX];
  int n_draws;
  struct {
    const char *arg;
    cmp_kind kind;
    double mag;
  } tols[SPEC_MAX];
  int n_tols;
  struct {
    link_kind kind;
    const char *a, *b;
    double mag;
  } links[SPEC_MAX];
  int n_links;
  struct {
    const char *arg;
    op_dims dims;
  } refuse[4];
  int n_refuse;
  const char *grad_of, *seed; /* GRAD: the forward, the argument holding dL/dout ("_": none, the loss itself) */
  double fd_h, kink;          /* FD: the step, and how far from a ReLU's kink a value must keep */
  int fd_unrounded;           /* FD only where the GEMMs keep fp32 operands */
  int invariant;
  op_dims inv_dims;
  void (*custom)(void);
  void (*extra)(struct op_case *c);
  const char *setup_fail;
} op_spec;

static void spec_vary(op_spec *s, size_t off, const int64_t *v, int n) {
  s->vary[s->n_vary].off = off, s->vary[s->n_vary].n = n;
  memcpy(s->vary[s->n_vary++].v, v, (size_t)n * sizeof *v);
}
static void spec_fix(op_spec *s, size_t off, int64_t v) {
  s->fix[s->n_fix].off = off, s->fix[s->n_fix++].v = v;
}
static void spec_draw(op_spec *s, const char *arg, draw_spec d) {
  s->draws[s->n_draws].arg = arg, s->draws[s->n_draws++].d = d;
}
static void spec_tol(op_spec *s, const char *arg, cmp_kind kind, double mag) {
  s->tols[s->n_tols].arg = arg, s->tols[s->n_tols].kind = kind, s->tols[s->n_tols++].mag = mag;
}
static void spec_link(op_spec *s, link_kind kind, const char *a, const char *b, double mag) {
  s->links[s->n_links].kind = kind, s->links[s->n_links].a = a, s->links[s->n_links].b = b;
  s->links[s->n_links++].mag = mag;
}
static void spec_refuse(op_spec *s, const char *arg, op_dims dims) {
  s->refuse[s->n_refuse].arg = arg, s->refuse[s->n_refuse++].dims = dims;
}

/* What a reference sees besides its arguments: the dims, the magnitudes it
 * may fill (MAG), the forward's arguments (FWD), scratch (TMP) and how far
 * its ReLUs' inputs keep from the kink (KINK, KINKS). */
typedef struct ref_ctx {
  op_dims dims;
  struct op_case *c;
  double *mag[SPEC_MAX];
  double kink, slack;
  int fd; /* a finite difference's evaluation: no magnitudes (MAG is NULL) */
} ref_ctx;
static double *ref_mag(ref_ctx *x, const char *name);
static double *ref_fwd(ref_ctx *x, const char *name);
static double *ref_tmp(ref_ctx *x, size_t n);
static void ref_kink(ref_ctx *x, double v) {
  if (v < x->kink) x->kink = v;
}
/* Whether the backend's GEMMs round their operands (bf16, tf32, fp16). */
#define ROUNDED (g_terms_rel > 0)

typedef struct op_test {
  const char *name;
  const op_arg *args;
  int n_args;
  int (*has)(const dlrec_backend *be);
  void (*eval)(const op_dims *dims, test_val *v);
  dlrec_status (*call)(dlrec_backend *be, const test_val *v);
  void (*ref)(ref_ctx *ctx, const test_val *v);
  void (*describe)(op_spec *s, const op_dims *dims);
} op_test;

/* The custom cases ops.def names, and the one EXTRA check. */
static void case_all_finite(void);
static void case_bn_split(void);
static void case_optim(void);
static void case_bag_forward(void);
static void case_sparse(void);
static void case_packed(void);
static void case_cross_infer(void);
static void case_cross_mix_infer(void);
static void fused_relu_is_the_composition(struct op_case *c);

/* Each expansion below turns every op's table line into one function or
 * one array entry. The roles' helpers: */
#define ROLE_OF_(role) ROLE_##role
#define ELEM_OF_(type)                                                                                              \
  _Generic((type)0, float *: 4, const float *: 4, double *: 8, const double *: 8, const uint32_t *: 4, int *: 4,    \
           default: 0)
#define OPT(c, n) ((c) ? (int64_t)(n) : -(int64_t)(n)-1) /* a negative count: NULL, of the count -count - 1 */
#define VAL_OF_(type, v) _Generic((type)0, float: (type)(v).f, double: (type)(v).f, default: (type)(v).i)
#define CONV_IN(type, v) ((type)(v).p)
#define CONV_OUT CONV_IN
#define CONV_ACC CONV_IN
#define CONV_INOUT CONV_IN
#define CONV_WS CONV_IN
#define CONV_ACT CONV_IN
#define CONV_TABLE CONV_IN
#define CONV_HOST CONV_IN
#define CONV_OBJ CONV_IN
#define CONV_DIM(type, v) ((type)(v).i)
#define CONV_VAL(type, v) VAL_OF_(type, v)
/* In a reference every buffer is doubles. */
#define REFTYPE_IN(type) double *
#define REFTYPE_OUT REFTYPE_IN
#define REFTYPE_ACC REFTYPE_IN
#define REFTYPE_INOUT REFTYPE_IN
#define REFTYPE_WS REFTYPE_IN
#define REFTYPE_ACT REFTYPE_IN
#define REFTYPE_TABLE(type) type
#define REFTYPE_HOST(type) type
#define REFTYPE_OBJ(type) type
#define REFTYPE_DIM(type) type
#define REFTYPE_VAL(type) type
#define REFCONV_IN(type, v) ((double *)(v).p)
#define REFCONV_OUT REFCONV_IN
#define REFCONV_ACC REFCONV_IN
#define REFCONV_INOUT REFCONV_IN
#define REFCONV_WS REFCONV_IN
#define REFCONV_ACT REFCONV_IN
#define REFCONV_TABLE CONV_IN
#define REFCONV_HOST CONV_IN
#define REFCONV_OBJ CONV_IN
#define REFCONV_DIM CONV_DIM
#define REFCONV_VAL CONV_VAL

#define ARG_DESC_(role, type, name, size) {#name, ROLE_OF_(role), ELEM_OF_(type)},
#define EVAL_(role, type, name, size)                                                                               \
  v_[i_].i = (int64_t)(size), v_[i_].f = (double)(size), i_++;
#define CALL_DECL_(role, type, name, size)                                                                          \
  type name = CONV_##role(type, v_[i_]);                                                                            \
  i_++;
#define REF_DECL_(role, type, name, size)                                                                           \
  REFTYPE_##role(type) name = REFCONV_##role(type, v_[i_]);                                                          \
  (void)name;                                                                                                       \
  i_++;

#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static const op_arg args_##name[] = {DLREC_OPS_EACH(ARG_DESC_, args)};                                            \
  static int has_##name(const dlrec_backend *be) { return be->ops->name != NULL; }                                  \
  static void eval_##name(const op_dims *s_, test_val *v_) {                                                        \
    DIMS_LOCALS(s_);                                                                                                \
    int i_ = 0;                                                                                                     \
    DLREC_OPS_EACH(EVAL_, args)                                                                                     \
    (void)i_;                                                                                                       \
  }                                                                                                                 \
  static dlrec_status call_##name(dlrec_backend *be, const test_val *v_) {                                          \
    int i_ = 0;                                                                                                     \
    DLREC_OPS_EACH(CALL_DECL_, args)                                                                                \
    (void)i_;                                                                                                       \
    return be->ops->name(be DLREC_OPS_NAMES(args));                                                                 \
  }
#include "backend/ops.def"
#undef DLREC_OP

/* The references: only REF of the test column expands. */
#define SHAPES(...)
#define VARY(...)
#define FIX(...)
#define DRAW(...)
#define TOL(...)
#define GRAD(...)
#define WRT(...)
#define FD(...)
#define FD_UNROUNDED(...)
#define INPLACE(...)
#define ALIAS(...)
#define REFUSE(...)
#define INVARIANT(...)
#define CUSTOM(...)
#define EXTRA(...)
#define REQUIRE(...)
#define REF(...) __VA_ARGS__;
#define MAG(x) ref_mag(ctx_, #x)
#define FWD(x) ref_fwd(ctx_, #x)
#define TMP(n) ref_tmp(ctx_, (size_t)(n))
#define KINK(v) ref_kink(ctx_, (v))
#define KINKS &ctx_->kink, ctx_->slack
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static void refop_##name(ref_ctx *ctx_, const test_val *v_) {                                                       \
    DIMS_LOCALS(&ctx_->dims);                                                                                       \
    {                                                                                                               \
      int i_ = 0;                                                                                                   \
      DLREC_OPS_EACH(REF_DECL_, args)                                                                               \
      (void)i_;                                                                                                     \
      test                                                                                                          \
    }                                                                                                               \
  }
#include "backend/ops.def"
#undef DLREC_OP
#include "op_spec_undef.h"

/* The descriptions: everything but REF, evaluated for the case's dims. */
#define SHAPES(...)                                                                                                 \
  {                                                                                                                 \
    static const op_dims shapes_[] = {__VA_ARGS__};                                                                 \
    s_->shapes = shapes_, s_->n_shapes = (int)(sizeof shapes_ / sizeof shapes_[0]);                                 \
  }
#define VARY(dim, ...)                                                                                              \
  spec_vary(s_, offsetof(op_dims, dim), (const int64_t[]){__VA_ARGS__},                                             \
            (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)));
#define FIX(dim, v) spec_fix(s_, offsetof(op_dims, dim), (v));
#define DRAW(arg, spec) spec_draw(s_, #arg, spec);
#define TOL(arg, kind, mag) spec_tol(s_, #arg, (kind), (double)(mag));
#define GRAD(fwd_, seed_) s_->grad_of = #fwd_, s_->seed = #seed_;
#define WRT(out, in) spec_link(s_, LINK_WRT, #out, #in, 0);
#define FD(h, k) s_->fd_h = (h), s_->kink = (k);
#define FD_UNROUNDED(h, k) s_->fd_h = (h), s_->kink = (k), s_->fd_unrounded = 1;
#define INPLACE(a, b) spec_link(s_, LINK_INPLACE, #a, #b, 0);
#define ALIAS(a, b, mag) spec_link(s_, LINK_ALIAS, #a, #b, (double)(mag));
#define REFUSE(arg, ...) spec_refuse(s_, #arg, (op_dims)__VA_ARGS__);
#define INVARIANT(...) s_->invariant = 1, s_->inv_dims = (op_dims)__VA_ARGS__;
#define CUSTOM(fn) s_->custom = fn;
#define EXTRA(fn) s_->extra = fn;
#define REQUIRE(cond)                                                                                               \
  if (!(cond)) s_->setup_fail = #cond;
#define REF(...)
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static void describe_##name(op_spec *s_, const op_dims *dims_) {                                                  \
    DIMS_LOCALS(dims_);                                                                                             \
    memset(s_, 0, sizeof *s_);                                                                                      \
    test                                                                                                            \
  }
#include "backend/ops.def"
#undef DLREC_OP
#include "op_spec_undef.h"

/* The registry: every op of the table. */
#define DLREC_OP(name, cpu, args, test)                                                                             \
  {#name,         args_##name, (int)(sizeof args_##name / sizeof args_##name[0]), has_##name, eval_##name,         \
   call_##name,   refop_##name, describe_##name},
static const op_test g_ops[] = {
#include "backend/ops.def"
};
#undef DLREC_OP
#define N_OPS (sizeof g_ops / sizeof g_ops[0])

static const op_test *op_find(const char *name) {
  for (size_t i = 0; i < N_OPS; i++)
    if (!strcmp(g_ops[i].name, name)) return &g_ops[i];
  return NULL;
}

static int arg_index(const op_test *t, const char *name) {
  for (int i = 0; i < t->n_args; i++)
    if (!strcmp(t->args[i].name, name)) return i;
  return -1;
}

/* ---- one case: an op on one set of dims ------------------------------------------------ */

/* Floats past each buffer the op writes, NaN, which it must not touch. */
#define GUARD 4

typedef struct op_case {
  const op_test *t;
  op_spec spec;
  op_dims dims;
  test_val v[SPEC_MAX];   /* the evaluated sizes and values */
  test_val dev[SPEC_MAX]; /* what the op gets */
  test_val ref[SPEC_MAX]; /* what the reference gets (buffers in double) */
  void *host[SPEC_MAX];   /* a buffer's contents before the op: drawn, pre-filled, or the forward's result */
  void *nulled[SPEC_MAX]; /* an optional output passed as NULL: the buffer it would have been, which stays */
  int64_t count[SPEC_MAX];
  int null[SPEC_MAX];
  int own[SPEC_MAX]; /* allocated by this case (not the forward's, not an alias's) */
  struct op_case *fwd;
  ref_ctx ctx;
} op_case;

static double *ref_mag(ref_ctx *x, const char *name) {
  const int i = arg_index(x->c->t, name);
  if (i < 0 || x->c->null[i] || x->fd) return NULL;
  if (!x->mag[i]) x->mag[i] = hd((size_t)x->c->count[i]);
  return x->mag[i];
}
static double *ref_fwd(ref_ctx *x, const char *name) {
  const op_case *f = x->c->fwd;
  const int i = f ? arg_index(f->t, name) : -1;
  return i < 0 ? NULL : f->ref[i].p;
}
static double *ref_tmp(ref_ctx *x, size_t n) {
  (void)x;
  return hd(n);
}

static const draw_spec *spec_draw_of(const op_spec *s, const char *name) {
  for (int i = 0; i < s->n_draws; i++)
    if (!strcmp(s->draws[i].arg, name)) return &s->draws[i].d;
  return NULL;
}

/* n elements of elem bytes drawn by d (NULL: uniform in [-1, 1)). */
static void *draw(const draw_spec *d, size_t n, size_t elem, const op_dims *dims) {
  static const draw_spec uniform = {DRAW_U, -1, 1, 0, 0, {0}};
  if (!d) d = &uniform;
  if (d->kind == DRAW_PERM) {
    uint32_t *idx = hkeep(malloc((n + 1) * sizeof *idx));
    const size_t rows = (size_t)dims->rows;
    uint32_t *all = hkeep(malloc((rows + 1) * sizeof *all));
    for (size_t i = 0; i < rows; i++) all[i] = (uint32_t)i;
    for (size_t i = rows ? rows - 1 : 0; i > 0; i--) {
      const size_t j = dlrec_rng_below(&g_rng, (uint32_t)(i + 1));
      const uint32_t t = all[i];
      all[i] = all[j], all[j] = t;
    }
    memcpy(idx, all, n * sizeof *idx);
    if (dims->bad && n) idx[n - 1] = (uint32_t)rows; /* one past the array */
    return idx;
  }
  const int ints = d->kind == DRAW_UINT && g_terms_rel > 0;
  float *f = ints ? hrand_int(n, (int)d->lo, (int)d->hi) : hrand(n, (float)d->lo, (float)d->hi);
  if (d->kind == DRAW_SPECIAL)
    for (int k = 0; k < d->n && (size_t)(d->at + k) < n; k++) f[d->at + k] = (float)d->v[k];
  if (d->kind == DRAW_LABELS)
    for (size_t i = 0; i < n; i += 3) f[i] = (float)(i % 2);
  if (elem == 4) return f;
  double *x = hd(n);
  ref_to_double(x, f, n);
  return x;
}

/* n elements of NaN. */
static void *nans(size_t n, size_t elem) {
  if (elem == 8) {
    double *x = hd(n);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
  }
  float *x = hf(n);
  for (size_t i = 0; i < n; i++) x[i] = NAN;
  return x;
}

/* A copy of n elements of host memory in the backend's, with GUARD floats
 * of NaN after them. */
static void *dup_guarded(const void *h, size_t n, size_t elem) {
  const size_t bytes = n * elem;
  char *d = dalloc(bytes + GUARD * sizeof(float));
  const float guard[GUARD] = {NAN, NAN, NAN, NAN};
  if ((bytes && g_be->ops->upload(g_be, d, h, bytes) != DLREC_OK) ||
      g_be->ops->upload(g_be, d + bytes, guard, sizeof guard) != DLREC_OK)
    FAIL("upload: %s", dlrec_last_error());
  return d;
}

/* The host's copy of n elements of the backend's memory. */
static void *down_any(const void *d, size_t n, size_t elem) {
  void *h = hkeep(calloc(n ? n : 1, elem));
  if (n && g_be->ops->download(g_be, h, d, n * elem) != DLREC_OK) FAIL("download: %s", dlrec_last_error());
  return h;
}

/* Argument i of a case as a buffer: drawn, pre-filled or NaN as its role
 * says, in the backend's memory and, in double, the reference's. */
static void case_buffer(op_case *c, int i) {
  const op_arg *a = &c->t->args[i];
  int64_t count = c->v[i].i;
  c->null[i] = count < 0;
  if (count < 0) count = -count - 1;
  c->count[i] = count;
  const size_t n = (size_t)count, e = a->elem ? a->elem : 4;
  void *h = a->role == ROLE_IN || a->role == ROLE_INOUT || a->role == ROLE_ACC
                ? draw(spec_draw_of(&c->spec, a->name), n, e, &c->dims)
                : nans(n, e);
  c->host[i] = h;
  double *r = a->role == ROLE_ACC ? hd(n) : (e == 8 ? memcpy(hd(n), h, n * 8) : hdbl(h, n));
  void *d = dup_guarded(h, n, e);
  if (c->null[i]) {
    c->nulled[i] = d;
    d = NULL, r = NULL;
  }
  c->dev[i].p = d, c->ref[i].p = r;
  c->own[i] = 1;
}

/* The link of kind k whose first name is name, in s; NULL when none. */
static const char *spec_linked(const op_spec *s, link_kind k, const char *name, double *mag) {
  for (int i = 0; i < s->n_links; i++)
    if (s->links[i].kind == k && !strcmp(s->links[i].a, name)) {
      if (mag) *mag = s->links[i].mag;
      return s->links[i].b;
    }
  return NULL;
}

/* Sets up case c of op t on dims: every argument drawn, pre-filled or taken
 * from the forward fwd (a backward's inputs of the same name: its saved
 * activations, its inputs, its output as a mask). 1 on failure (said). */
static int case_setup(op_case *c, const op_test *t, const op_dims *dims, op_case *fwd) {
  memset(c, 0, sizeof *c);
  c->t = t, c->dims = *dims, c->fwd = fwd;
  t->describe(&c->spec, dims);
  if (c->spec.setup_fail) {
    FAIL("%s: test setup: %s does not hold", t->name, c->spec.setup_fail);
    return 1;
  }
  t->eval(dims, c->v);
  c->ctx = (ref_ctx){.dims = *dims, .c = c, .kink = INFINITY, .slack = ROUNDED ? g_terms_rel + FP32_REL : 0};
  for (int i = 0; i < t->n_args; i++) {
    const op_arg *a = &t->args[i];
    const int j = fwd && (is_buffer(a->role) || a->role == ROLE_HOST) ? arg_index(fwd->t, a->name) : -1;
    const char *alias = dims->first ? spec_linked(&c->spec, LINK_ALIAS, a->name, NULL) : NULL;
    const int k = alias ? arg_index(t, alias) : -1;
    if (j >= 0 || k >= 0) { /* the forward's, or an earlier argument's */
      const op_case *from = j >= 0 ? fwd : c;
      const int at = j >= 0 ? j : k;
      c->dev[i] = from->dev[at], c->ref[i] = from->ref[at], c->host[i] = from->host[at];
      c->count[i] = from->count[at], c->null[i] = from->null[at];
    } else if (is_buffer(a->role)) {
      case_buffer(c, i);
    } else if (a->role == ROLE_HOST && spec_draw_of(&c->spec, a->name)) {
      c->count[i] = c->v[i].i;
      c->dev[i].p = c->ref[i].p = c->host[i] = draw(spec_draw_of(&c->spec, a->name), (size_t)c->v[i].i, 4, dims);
    } else if (a->role == ROLE_DIM || a->role == ROLE_VAL) {
      c->dev[i] = c->ref[i] = c->v[i];
    } else {
      FAIL("%s: argument %s: the generic loop cannot make it; give the op a CUSTOM case", t->name, a->name);
      return 1;
    }
  }
  return test_failed_now();
}

/* Runs the case's op on its device arguments (dev: another set of them). */
static int case_run(op_case *c, const test_val *dev) {
  omp_set_num_threads((int)g_be->threads + 1);
  return op_done(__LINE__, c->t->name, c->t->call(g_be, dev ? dev : c->dev));
}

/* The tolerance ops.def gives output name of the case (CMP_FP32, no
 * magnitude, where it gives none). */
static void case_tol(const op_case *c, const char *name, cmp_kind *kind, double *mag) {
  *kind = CMP_FP32, *mag = 0;
  for (int i = 0; i < c->spec.n_tols; i++)
    if (!strcmp(c->spec.tols[i].arg, name)) *kind = c->spec.tols[i].kind, *mag = c->spec.tols[i].mag;
}

/* got[k] (floats or doubles) against the reference ref[k] (+ pre[k], what
 * an accumulated output held, or NULL) within the bound of kind for the
 * magnitude mag0 + mag[k] + |pre[k]|. BITS compares the float's bits (any
 * NaN for a NaN), an accumulated one's as the float sum of pre and the
 * rounded reference. 1 on the first miss (said). */
static int compare(const char *op, const char *what, const void *got, size_t elem, const float *pre,
                   const double *ref, const double *mag, double mag0, size_t n, cmp_kind kind) {
  for (size_t k = 0; k < n; k++) {
    const double g = elem == 8 ? ((const double *)got)[k] : ((const float *)got)[k];
    const double p = pre ? pre[k] : 0, want = ref[k] + p, m = mag0 + (mag ? mag[k] : 0) + fabs(p);
    int ok;
    double b = 0;
    if (kind == CMP_BITS) {
      const float w = pre ? pre[k] + (float)ref[k] : (float)ref[k], gf = ((const float *)got)[k];
      ok = isnan(w) ? isnan(gf) : !memcmp(&w, &gf, sizeof w);
    } else if (kind == CMP_EXACT) {
      ok = (float)want == (float)g || (isnan(want) && isnan(g));
    } else {
      b = bound(kind, want, m);
      ok = fabs(g - want) <= b;
    }
    if (!ok) {
      FAIL("%s: %s[%zu] = %.9g, reference %.9g (bound %.3g)", op, what, k, g, want, b);
      return 1;
    }
  }
  return 0;
}

/* The case's outputs against its reference, and every buffer it writes
 * checked for writes past its end; an optional output left NULL is left
 * as it was. */
static int case_check(op_case *c) {
  c->t->ref(&c->ctx, c->ref);
  for (int i = 0; i < c->t->n_args && !test_failed_now(); i++) {
    const op_arg *a = &c->t->args[i];
    if (!is_buffer(a->role) || !c->own[i]) continue;
    const size_t n = (size_t)c->count[i], e = a->elem ? a->elem : 4;
    if (c->null[i]) {
      if (memcmp(down_any(c->nulled[i], n, e), c->host[i], n * e))
        FAIL("%s: %s (passed NULL) changed", c->t->name, a->name);
      continue;
    }
    if (is_written(a->role)) {
      const float *guard = down_any((char *)c->dev[i].p + n * e, GUARD, 4);
      for (int k = 0; k < GUARD; k++)
        if (!isnan(guard[k])) FAIL("%s: %s: written past its %zu values", c->t->name, a->name, n);
    }
    if (!is_compared(a->role) || test_failed_now()) continue;
    cmp_kind kind;
    double mag;
    case_tol(c, a->name, &kind, &mag);
    compare(c->t->name, a->name, down_any(c->dev[i].p, n, e), e, a->role == ROLE_ACC ? c->host[i] : NULL,
            c->ref[i].p, c->ctx.mag[i], mag, n, kind);
  }
  return test_failed_now();
}

/* A fresh set of device arguments with the contents of c's own buffers
 * before the op (inputs drawn, outputs pre-filled); the forward's and the
 * values as they are. */
static void case_fresh_args(const op_case *c, test_val *dev) {
  for (int i = 0; i < c->t->n_args; i++) {
    dev[i] = c->dev[i];
    const op_arg *a = &c->t->args[i];
    if (is_buffer(a->role) && dev[i].p && c->host[i])
      dev[i].p = dup_guarded(c->host[i], (size_t)c->count[i], a->elem ? a->elem : 4);
  }
}

/* INPLACE(out, in): the op again with out's buffer the input's, and out
 * against the same reference. */
static void case_inplace(op_case *c) {
  for (int l = 0; l < c->spec.n_links && !test_failed_now(); l++) {
    if (c->spec.links[l].kind != LINK_INPLACE) continue;
    const int o = arg_index(c->t, c->spec.links[l].a), in = arg_index(c->t, c->spec.links[l].b);
    if (o < 0 || in < 0) {
      FAIL("%s: INPLACE(%s, %s): no such arguments", c->t->name, c->spec.links[l].a, c->spec.links[l].b);
      return;
    }
    test_val dev[SPEC_MAX];
    case_fresh_args(c, dev);
    dev[o] = dev[in];
    if (case_run(c, dev)) return;
    cmp_kind kind;
    double mag;
    case_tol(c, c->t->args[o].name, &kind, &mag);
    char what[64];
    snprintf(what, sizeof what, "%s in place", c->t->args[o].name);
    compare(c->t->name, what, down_any(dev[o].p, (size_t)c->count[o], 4), 4, NULL, c->ref[o].p, c->ctx.mag[o], mag,
            (size_t)c->count[o], kind);
  }
}

/* ---- backwards: the forward first, then finite differences of its reference ----------------- */

/* The reference forward as a loss L = Σ R ⊙ out, R the backward's dL/dout
 * (NULL: L is the forward's output itself, the loss). */
typedef struct fd_ctx {
  op_case *fwd;
  test_val ref[SPEC_MAX];
  int out;
  const float *R;
  ref_ctx ctx; /* its own: the magnitudes a reference fills are allocated once */
} fd_ctx;

static double fd_loss(void *p) {
  fd_ctx *x = p;
  x->fwd->t->ref(&x->ctx, x->ref);
  const size_t n = (size_t)x->fwd->count[x->out];
  const double *out = x->ref[x->out].p;
  if (!x->R) return out[0];
  return ref_weighted_sum(out, x->R, n);
}

/* The forward's reference arguments with every output in scratch of its
 * own, so that calling it leaves the forward's results (what the backward
 * reads) alone; out gets the first output, the one the loss weighs. */
static void fd_prepare(fd_ctx *x, op_case *fwd, const float *R) {
  x->fwd = fwd, x->R = R, x->out = -1;
  x->ctx = (ref_ctx){.dims = fwd->dims, .c = fwd, .kink = INFINITY, .fd = 1};
  for (int i = 0; i < fwd->t->n_args; i++) {
    x->ref[i] = fwd->ref[i];
    const op_role role = fwd->t->args[i].role;
    if (role == ROLE_OUT || role == ROLE_ACT || role == ROLE_WS) {
      x->ref[i].p = fwd->null[i] ? NULL : hd((size_t)fwd->count[i]);
      if (role == ROLE_OUT && x->out < 0) x->out = i;
    }
  }
}

/* Runs forward f of a backward on the backend and reads back what it wrote
 * (the backward's inputs of the same name see the backend's results, as a
 * training pass's would); its reference, run aside, says how far its
 * ReLUs keep from their kinks (f->ctx.kink). */
static int case_forward(op_case *f) {
  if (case_run(f, NULL)) return 1;
  for (int i = 0; i < f->t->n_args; i++) {
    const op_arg *a = &f->t->args[i];
    if (!is_written(a->role) || f->null[i]) continue;
    const size_t n = (size_t)f->count[i], e = a->elem ? a->elem : 4;
    f->host[i] = down_any(f->dev[i].p, n, e);
    f->ref[i].p = e == 8 ? memcpy(hd(n), f->host[i], n * 8) : hdbl(f->host[i], n);
  }
  fd_ctx x;
  fd_prepare(&x, f, NULL);
  f->t->ref(&f->ctx, x.ref);
  return test_failed_now();
}

/* The gradients of backward case c against central differences of its
 * forward's reference (and its reference against them too): each WRT
 * output of the input it names; two outputs of one input (an ALIAS, the
 * first cross layer's xl = x0) summed. */
static void case_fd(op_case *c) {
  op_case *f = c->fwd;
  const op_spec *s = &c->spec;
  if (!(s->fd_h > 0) || !c->dims.fd || (s->fd_unrounded && ROUNDED)) return;
  if (f->ctx.kink < s->kink) {
    if (ROUNDED) return; /* a rounded mask may differ there: the comparisons above used the layer's own */
    FAIL("%s: test setup: a pre-activation is %.3g from the kink, closer than %g", c->t->name, f->ctx.kink, s->kink);
    return;
  }
  const int seed = arg_index(c->t, s->seed);
  fd_ctx x;
  fd_prepare(&x, f, seed >= 0 ? c->host[seed] : NULL);
  int done[SPEC_MAX] = {0};
  for (int l = 0; l < s->n_links && !test_failed_now(); l++) {
    if (s->links[l].kind != LINK_WRT) continue;
    const int o = arg_index(c->t, s->links[l].a), p = arg_index(f->t, s->links[l].b);
    if (o < 0 || p < 0) {
      FAIL("%s: WRT(%s, %s): no such arguments", c->t->name, s->links[l].a, s->links[l].b);
      return;
    }
    if (done[o] || c->null[o] || !x.ref[p].p) continue;
    /* Another output of the same input: their sum is its gradient. */
    int o2 = -1;
    for (int m = l + 1; m < s->n_links && o2 < 0; m++) {
      const int p2 = s->links[m].kind == LINK_WRT ? arg_index(f->t, s->links[m].b) : -1;
      if (p2 >= 0 && p2 != p && x.ref[p2].p == x.ref[p].p) o2 = arg_index(c->t, s->links[m].a);
    }
    const size_t n = (size_t)c->count[o];
    const float *got = down_any(c->dev[o].p, n, 4);
    const double *refb = c->ref[o].p, *mag = c->ctx.mag[o];
    cmp_kind kind;
    double mag0;
    case_tol(c, c->t->args[o].name, &kind, &mag0);
    char what[96];
    snprintf(what, sizeof what, "%s: %s", c->t->name, c->t->args[o].name);
    if (o2 >= 0) { /* the aliased input's gradient: both outputs summed */
      float *sum = hf(n);
      double *rsum = hd(n);
      const float *got2 = down_any(c->dev[o2].p, n, 4);
      for (size_t k = 0; k < n; k++) sum[k] = got[k] + got2[k], rsum[k] = refb[k] + ((double *)c->ref[o2].p)[k];
      for (int m = 0; m < f->spec.n_links; m++)
        if (f->spec.links[m].kind == LINK_ALIAS) mag0 = f->spec.links[m].mag; /* the stated sum's magnitude */
      snprintf(what, sizeof what, "%s: %s + %s", c->t->name, c->t->args[o].name, c->t->args[o2].name);
      got = sum, refb = rsum, mag = NULL, done[o2] = 1;
    }
    done[o] = 1;
    check_fd(__LINE__, what, got, c->t->args[o].role == ROLE_ACC ? c->host[o] : NULL, refb, mag, mag0, x.ref[p].p, n,
             fd_loss, &x, s->fd_h, kind < CMP_FP32 ? CMP_FP32 : kind);
  }
}

/* ---- refusals and batch invariance ---------------------------------------------------------- */

/* REFUSE: on dims that break the op's contract (or with one argument
 * NULL) the op must say DLREC_ERR_INVALID and touch nothing. */
static void op_refusals(const op_test *t, const op_spec *s) {
  for (int k = 0; k < s->n_refuse && !test_failed_now(); k++) {
    op_case c;
    if (case_setup(&c, t, &s->refuse[k].dims, NULL)) return;
    const int i = arg_index(t, s->refuse[k].arg);
    if (i >= 0) c.dev[i].p = NULL;
    const dlrec_status st = t->call(g_be, c.dev);
    if (st != DLREC_ERR_INVALID) {
      FAIL("%s: refusal %d (%s NULL): %s, not DLREC_ERR_INVALID", t->name, k, s->refuse[k].arg,
           dlrec_status_name(st));
      return;
    }
    dlrec_clear_error();
    for (int j = 0; j < t->n_args; j++) {
      const op_arg *a = &t->args[j];
      if (j == i || !is_written(a->role) || !c.dev[j].p) continue;
      const size_t n = (size_t)c.count[j], e = a->elem ? a->elem : 4;
      if (memcmp(down_any(c.dev[j].p, n, e), c.host[j], n * e))
        FAIL("%s: refusal %d touched %s", t->name, k, a->name);
    }
  }
}

/* INVARIANT: the op on 33 rows, then rows 0, 1, 16 and 32 alone (each
 * from an input one float past an allocation's start) and rows 7 .. 19 as a
 * batch of 13: each row must have the batch's bits. An argument is a row's
 * when its size is B times its size at B = 1. */
static void op_invariant(const op_test *t, const op_spec *s) {
  enum { BIG = 33 };
  op_case c;
  op_dims dims = s->inv_dims;
  dims.B = BIG;
  if (case_setup(&c, t, &dims, NULL) || case_run(&c, NULL)) return;
  test_val one[SPEC_MAX], dev[SPEC_MAX];
  dims.B = 1;
  t->eval(&dims, one);
  int per_row[SPEC_MAX];
  for (int i = 0; i < t->n_args; i++)
    per_row[i] = is_buffer(t->args[i].role) && one[i].i > 0 && c.count[i] == BIG * one[i].i;
  static const int alone[] = {0, 1, 16, 32, -7};
  for (size_t k = 0; k < sizeof alone / sizeof alone[0] && !test_failed_now(); k++) {
    const int b = alone[k] >= 0 ? alone[k] : -alone[k], rows = alone[k] >= 0 ? 1 : 13;
    dims.B = rows;
    t->eval(&dims, dev);
    for (int i = 0; i < t->n_args; i++) {
      if (!is_buffer(t->args[i].role)) continue;
      const size_t w = (size_t)one[i].i, at = (size_t)b * w;
      if (!per_row[i]) dev[i] = c.dev[i];
      else if (t->args[i].role != ROLE_IN) dev[i].p = dup_guarded(nans(rows * w, 4), rows * w, 4);
      else if (rows > 1) dev[i].p = (float *)c.dev[i].p + at;
      else {
        float *p = dalloc((w + 1) * sizeof(float));
        if (g_be->ops->upload(g_be, p + 1, (float *)c.host[i] + at, w * sizeof(float)) != DLREC_OK) FAIL("upload");
        dev[i].p = p + 1;
      }
    }
    if (case_run(&c, dev)) return;
    for (int i = 0; i < t->n_args; i++) {
      if (!per_row[i] || t->args[i].role != ROLE_OUT) continue;
      const size_t w = (size_t)one[i].i;
      if (memcmp(down_any(dev[i].p, rows * w, 4), (const float *)down_any(c.dev[i].p, BIG * w, 4) + (size_t)b * w,
                 rows * w * sizeof(float)))
        FAIL("%s: %s of row%s %d%s differs from the batch of %d", t->name, t->args[i].name, rows > 1 ? "s" : "", b,
             rows > 1 ? " .. 19 as a batch" : " alone", BIG);
    }
  }
}

/* ---- the loop: every shape of an op, on the backend under test ---------------------------------- */

/* One case of op t on dims: a forward's (or a backward's after its forward
 * on the same dims), checked, in place, its gradients by differences, the
 * spec's EXTRA. */
static void op_case_run(const op_test *t, const op_dims *dims) {
  op_spec s;
  t->describe(&s, dims);
  op_case fwd, c;
  op_case *f = NULL;
  if (s.grad_of) {
    if (case_setup(&fwd, op_find(s.grad_of), dims, NULL) || case_forward(&fwd)) return;
    f = &fwd;
  }
  if (case_setup(&c, t, dims, f) || case_run(&c, NULL) || case_check(&c)) return;
  case_inplace(&c);
  if (f && !test_failed_now()) case_fd(&c);
  if (s.extra && !test_failed_now()) s.extra(&c);
}

/* The dims of every case of op t: its shapes (a backward's are its
 * forward's unless it names its own), each with every combination of the
 * VARY values (the forward's and its own), then the FIX values. */
static void op_cases(const op_test *t) {
  op_spec s, fs;
  const op_dims zero = {0};
  t->describe(&s, &zero);
  const op_test *f = s.grad_of ? op_find(s.grad_of) : NULL;
  if (s.grad_of && !f) {
    FAIL("%s: GRAD(%s): no such op", t->name, s.grad_of);
    return;
  }
  if (f) f->describe(&fs, &zero);
  const op_spec *shapes = s.n_shapes || !f ? &s : &fs;
  /* VARYs of both, fixed dims dropped */
  struct {
    size_t off;
    int n;
    const int64_t *v;
  } vary[8];
  int n_vary = 0;
  for (int w = 0; w < 2; w++) {
    const op_spec *from = w ? &s : f ? &fs : NULL;
    for (int k = 0; from && k < from->n_vary; k++) {
      int fixed = 0;
      for (int x = 0; x < s.n_fix; x++) fixed |= s.fix[x].off == from->vary[k].off;
      if (!fixed) vary[n_vary].off = from->vary[k].off, vary[n_vary].n = from->vary[k].n, vary[n_vary++].v = from->vary[k].v;
    }
  }
  for (int k = 0; k < shapes->n_shapes && !test_failed_now(); k++) {
    int combos = 1;
    for (int x = 0; x < n_vary; x++) combos *= vary[x].n;
    for (int m = 0; m < combos && !test_failed_now(); m++) {
      op_dims dims = shapes->shapes[k];
      for (int x = 0, rest = m; x < n_vary; rest /= vary[x].n, x++)
        *(int64_t *)((char *)&dims + vary[x].off) = vary[x].v[rest % vary[x].n];
      for (int x = 0; x < s.n_fix; x++) *(int64_t *)((char *)&dims + s.fix[x].off) = s.fix[x].v;
      op_case_run(t, &dims);
      case_end();
    }
  }
}

/* Every test of op t on the backend under test: its cases, refusals and
 * batch invariance, or its CUSTOM case. An op the backend lacks (a NULL
 * entry) is skipped, saying so. */
static const op_test *g_op;
static void op_all(void) {
  const op_test *t = g_op;
  op_spec s;
  const op_dims zero = {0};
  t->describe(&s, &zero);
  if (lacks(t->name, !t->has(g_be))) return;
  if (s.grad_of && op_find(s.grad_of) && lacks(s.grad_of, !op_find(s.grad_of)->has(g_be))) return;
  if (s.custom) {
    /* Several ops may share one case (the packed layer's create and
     * forward, the split batch normalization's four): the first runs it. */
    for (const op_test *o = g_ops; o < t; o++) {
      op_spec so;
      o->describe(&so, &zero);
      if (so.custom == s.custom) return;
    }
    s.custom();
    return;
  }
  op_cases(t);
  if (!test_failed_now()) op_refusals(t, &s);
  case_end();
  if (!test_failed_now() && s.invariant) op_invariant(t, &s);
  case_end();
}

/* The same draws on every backend and in every precision, different for
 * each op: the seed is the op's name hashed. */
static uint64_t op_seed(const char *name) {
  uint64_t h = 1469598103934665603ull;
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return h;
}

static void op_test_run(const char *name) {
  g_op = op_find(name);
  each_backend(op_all, op_seed(name));
}

/* One TEST per op of the table, "op_NAME": ./test_backend op_linear runs
 * the linear ones. */
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static void test_op_##name(void) { op_test_run(#name); }                                                          \
  __attribute__((constructor)) static void test_register_op_##name(void) { test_register("op_" #name, test_op_##name); }
#include "backend/ops.def"
#undef DLREC_OP
#undef A

/* Every op of the table is tested: it names shapes, or is the gradient of
 * an op that does, or names its CUSTOM case; every name its test column
 * gives is one of its arguments (or of its forward's). */
TEST(every_op_in_the_table_has_a_test) {
  const op_dims zero = {0};
  for (size_t i = 0; i < N_OPS; i++) {
    const op_test *t = &g_ops[i];
    op_spec s, fs;
    t->describe(&s, &zero);
    const op_test *f = s.grad_of ? op_find(s.grad_of) : NULL;
    if (f) f->describe(&fs, &zero);
    if (!s.custom && !s.n_shapes && !(f && fs.n_shapes)) test_fail(__FILE__, __LINE__, "%s: no test", t->name);
    for (int k = 0; k < s.n_tols; k++)
      if (arg_index(t, s.tols[k].arg) < 0) test_fail(__FILE__, __LINE__, "%s: TOL(%s): no such argument", t->name, s.tols[k].arg);
    for (int k = 0; k < s.n_draws; k++)
      if (arg_index(t, s.draws[k].arg) < 0 && !(f && arg_index(f, s.draws[k].arg) >= 0))
        test_fail(__FILE__, __LINE__, "%s: DRAW(%s): no such argument", t->name, s.draws[k].arg);
    for (int k = 0; k < s.n_links; k++)
      if (arg_index(t, s.links[k].a) < 0 ||
          (s.links[k].kind == LINK_WRT ? !f || arg_index(f, s.links[k].b) < 0 : arg_index(t, s.links[k].b) < 0))
        test_fail(__FILE__, __LINE__, "%s: %s, %s: no such arguments", t->name, s.links[k].a, s.links[k].b);
    if (s.grad_of && !f) test_fail(__FILE__, __LINE__, "%s: GRAD(%s): no such op", t->name, s.grad_of);
    if (s.grad_of && strcmp(s.seed, "_") && arg_index(t, s.seed) < 0)
      test_fail(__FILE__, __LINE__, "%s: GRAD: no argument %s", t->name, s.seed);
  }
  CHECK(N_OPS >= 48);
}

/* ---- all_finite: every place of a non-finite value ------------------------------------------ */

/* *finite of each of +inf, -inf and NaN at the first, a middle and the last
 * place of 1, 1000 and 100003 values (the last past the threaded size), and
 * of none; no values are all finite; a NULL result is refused. */
static void case_all_finite(void) {
  float *d = dnan(64);
  if (BE_OP(g_be, all_finite, NULL, d, 4) != DLREC_ERR_INVALID) FAIL("all_finite with a NULL result was not refused");
  dlrec_clear_error();
  static const size_t sizes[] = {1, 1000, 100003};
  const float bad[] = {INFINITY, -INFINITY, NAN};
  int finite = -1;
  if (OP(all_finite, &finite, d, 0) || finite != 1) FAIL("all_finite of no values gave %d, not 1", finite);
  for (size_t s = 0; s < 3 && !test_failed_now(); s++) {
    const size_t n = sizes[s];
    float *x = hrand(n, -1.5e38f, 1.5e38f), *d_x = dup(x, n); /* up to near float's largest */
    if (OP(all_finite, &finite, d_x, n)) return;
    if (finite != 1) FAIL("all_finite of %zu finite values gave %d", n, finite);
    const size_t at[] = {0, n / 2, n - 1};
    for (size_t a = 0; a < 3 && !test_failed_now(); a++)
      for (size_t v = 0; v < 3 && !test_failed_now(); v++) {
        float *y = dup(x, n);
        if (BE_OP(g_be, upload, y + at[a], &bad[v], sizeof(float)) != DLREC_OK) FAIL("upload");
        finite = -1;
        if (OP(all_finite, &finite, y, n)) return;
        if (finite != 0) FAIL("all_finite of %zu values with %g at %zu gave %d", n, (double)bad[v], at[a], finite);
      }
  }
}

/* ---- the fused ReLU backward is the composition ---------------------------------------------- */

/* linear_relu_backward (checked against the reference by the loop) gives
 * the bits of relu_backward then linear_backward on the same backend: run
 * on the case's own inputs and pre-filled outputs, the composition's din,
 * dweight and dbias (each where not NULL) are the fused op's. */
static void fused_relu_is_the_composition(op_case *c) {
  const op_test *t = c->t;
  const int din = arg_index(t, "din"), dw = arg_index(t, "dweight"), db = arg_index(t, "dbias");
  const int dout = arg_index(t, "dout"), out = arg_index(t, "out"), in = arg_index(t, "in");
  const int w = arg_index(t, "weight");
  const int B = (int)c->dims.B, IN = (int)c->dims.IN, OUT = (int)c->dims.OUT;
  test_val dev[SPEC_MAX];
  case_fresh_args(c, dev);
  float *g = dev[dout].p;
  if (OP(relu_backward, g, g, dev[out].p, (size_t)B * OUT) ||
      OP(linear_backward, dev[din].p, dev[dw].p, dev[db].p, g, dev[in].p, dev[w].p, B, IN, OUT))
    return;
  const int outs[] = {din, dw, db};
  for (int k = 0; k < 3; k++) {
    const int i = outs[k];
    if (!dev[i].p) continue;
    const size_t bytes = (size_t)c->count[i] * sizeof(float);
    if (memcmp(down_any(dev[i].p, (size_t)c->count[i], 4), down_any(c->dev[i].p, (size_t)c->count[i], 4), bytes))
      FAIL("linear_relu_backward %s: not the bits of relu_backward then linear_backward", t->args[i].name);
  }
}

/* ---- kept operands ------------------------------------------------------------------------- */

/* Writes n host floats over device buffer d; 1 on failure (said). */
static int up(float *d, const float *h, size_t n) {
  if (g_be->ops->upload(g_be, d, h, n * sizeof(float)) == DLREC_OK) return 0;
  FAIL("upload: %s", dlrec_last_error());
  return 1;
}

/* Whether n floats at a and b have the same bits. */
static int same_bits(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

/* One backward of a linear layer (cross 0) or a full-rank cross layer
 * (cross 1) on the device buffers, its results copied back into *got (din
 * or dxl, then dW, then db; dx0 after them for the cross layer). */
static void kept_backward(int cross, float *got, const float *dout, const float *in, const float *w,
                          const float *x0, const float *act, int B, int d) {
  const size_t n = (size_t)B * d, nw = (size_t)d * d;
  float *d_din = dnan(n), *d_dw = dup(hf(nw), nw), *d_db = dup(hf(d), d), *d_dx0 = dup(hf(n), n);
  if (cross ? OP(cross_backward, d_dx0, d_din, d_dw, d_db, dout, x0, in, act, w, dnan(dlrec_cross_ws_floats(B, d, 0)),
                 B, d)
            : OP(linear_backward, d_din, d_dw, d_db, dout, in, w, B, d, d))
    return;
  memcpy(got, down(d_din, n), n * sizeof(float));
  memcpy(got + n, down(d_dw, nw), nw * sizeof(float));
  memcpy(got + n + nw, down(d_db, d), d * sizeof(float));
  if (cross) memcpy(got + n + nw + d, down(d_dx0, n), n * sizeof(float));
}

/* One forward of the same layer as kept_backward; 1 on failure (said). */
static int kept_forward(int cross, float *out, float *act, const float *x0, const float *in, const float *w,
                        const float *bias, int B, int d) {
  return cross ? OP(cross_forward, out, act, x0, in, w, bias, B, d)
               : OP(linear_forward, act, in, w, bias, B, d, d, DLREC_ACT_NONE);
}

/* keep_operands: between keep_operands(1) and (0) a backward reads the
 * copies its forward converted. Shown by writing other values into the
 * layer's input and weights between the forward and the backward: a
 * backend that keeps (a 16-bit GEMM: bf16 on oneDNN here, bf16 and fp16 on
 * a GPU) computes the backward of the values the forward saw, bit for bit,
 * and one that does not the backward of the new values; after
 * keep_operands(0) every backend computes the new values' backward. */
static void case_kept(void) {
  const char *name = dlrec_backend_name(g_be);
  const dlrec_precision p = dlrec_backend_precision(g_be);
  const int cpu = !strcmp(name, "cpu") || !strcmp(name, "cpu-mirror");
  const int expect = cpu ? p == DLREC_PRECISION_BF16 && dlrec_backend_bf16_native(g_be)
                         : p == DLREC_PRECISION_BF16 || p == DLREC_PRECISION_FP16;
  if (!g_be->ops->keep_operands) {
    if (expect) FAIL("no keep_operands, where its GEMMs convert their operands");
    return;
  }
  for (int cross = 0; cross <= 1 && !test_failed_now(); cross++) {
    const int B = 37, d = 19;
    const size_t n = (size_t)B * d, nw = (size_t)d * d, ng = 2 * n + nw + d;
    float *in = hrand(n, -1, 1), *w = hrand(nw, -1, 1), *in2 = hrand(n, -1, 1), *w2 = hrand(nw, -1, 1);
    float *d_in = dup(in, n), *d_w = dup(w, nw), *d_b = dup(hrand(d, -1, 1), d), *d_x0 = dup(hrand(n, -1, 1), n);
    float *d_out = dnan(n), *d_act = dnan(dlrec_cross_act_floats(B, d, 0)), *d_dout = dup(hrand(n, -1, 1), n);
    float *old = hf(ng), *fresh = hf(ng), *got = hf(ng);
    /* The two references, without keeping: the old values' backward, the new ones'. */
    if (kept_forward(cross, d_out, d_act, d_x0, d_in, d_w, d_b, B, d)) return;
    kept_backward(cross, old, d_dout, d_in, d_w, d_x0, d_act, B, d);
    float *d_in2 = dup(in2, n), *d_w2 = dup(w2, nw);
    kept_backward(cross, fresh, d_dout, d_in2, d_w2, d_x0, d_act, B, d);
    /* Keeping: the forward, then the new values written over the old. */
    const int kept = g_be->ops->keep_operands(g_be, 1);
    if (kept != expect) {
      FAIL("keep_operands says %d, expected %d", kept, expect);
      g_be->ops->keep_operands(g_be, 0);
      return;
    }
    int st = kept_forward(cross, d_out, d_act, d_x0, d_in, d_w, d_b, B, d);
    if (!st && (up(d_in, in2, n) || up(d_w, w2, nw))) st = 1;
    if (!st) kept_backward(cross, got, d_dout, d_in, d_w, d_x0, d_act, B, d);
    g_be->ops->keep_operands(g_be, 0);
    if (st || test_failed_now()) return;
    if (!same_bits(got, kept ? old : fresh, ng)) {
      FAIL("%s backward while keeping: not the bits of the %s values' backward", cross ? "cross" : "linear",
           kept ? "forward's" : "new");
      return;
    }
    if (kept && same_bits(old, fresh, ng)) FAIL("test setup: the old and new values' backwards are the same");
    /* Not keeping any more: the new values are read. */
    if (up(d_in, in, n) || up(d_w, w, nw) || kept_forward(cross, d_out, d_act, d_x0, d_in, d_w, d_b, B, d)) return;
    if (up(d_in, in2, n) || up(d_w, w2, nw)) return;
    kept_backward(cross, got, d_dout, d_in, d_w, d_x0, d_act, B, d);
    if (!test_failed_now() && !same_bits(got, fresh, ng))
      FAIL("%s backward after keep_operands(0): not the new values' bits", cross ? "cross" : "linear");
  }
}


/* ---- fresh gradients --------------------------------------------------------------------- */

/* Three backwards of a linear layer (cross 0) or a full-rank cross layer
 * (cross 1) into weight gradients that start at zero: two into dW, then one
 * into dW one row further on (overlapping the first's rows but its own
 * first), between fresh_gradients(1) and (0) when fresh. *got receives dW
 * (d + 1 rows), then db, then din or dxl. */
static void fresh_run(int cross, int fresh, float *got, const float *dout, const float *in, const float *w,
                      const float *x0, const float *act, int B, int d) {
  const size_t n = (size_t)B * d, nw = (size_t)d * d;
  float *d_dw = dup(hf(nw + d), nw + d), *d_db = dup(hf(d), d), *d_din = dnan(n), *d_dx0 = dup(hf(n), n);
  float *ws = dnan(dlrec_cross_ws_floats(B, d, 0));
  if (fresh) g_be->ops->fresh_gradients(g_be, 1);
  for (int k = 0, bad = 0; k < 3 && !bad; k++) {
    float *dw = d_dw + (k == 2 ? d : 0);
    bad = cross ? OP(cross_backward, d_dx0, d_din, dw, d_db, dout, x0, in, act, w, ws, B, d)
                : OP(linear_backward, d_din, dw, d_db, dout, in, w, B, d, d);
  }
  if (fresh) g_be->ops->fresh_gradients(g_be, 0);
  memcpy(got, down(d_dw, nw + d), (nw + d) * sizeof(float));
  memcpy(got + nw + d, down(d_db, d), d * sizeof(float));
  memcpy(got + nw + 2 * d, down(d_din, n), n * sizeof(float));
}

/* One backward (no window open) onto dW = pre, nonzero; dW into *got. */
static void onto(int cross, const float *pre, float *got, const float *dout, const float *in, const float *w,
                 const float *x0, const float *act, int B, int d) {
  const size_t n = (size_t)B * d, nw = (size_t)d * d;
  float *d_dw = dup(pre, nw), *d_db = dup(hf(d), d), *d_din = dnan(n), *d_dx0 = dup(hf(n), n);
  if (cross ? OP(cross_backward, d_dx0, d_din, d_dw, d_db, dout, x0, in, act, w, dnan(dlrec_cross_ws_floats(B, d, 0)),
                 B, d)
            : OP(linear_backward, d_din, d_dw, d_db, dout, in, w, B, d, d))
    return;
  memcpy(got, down(d_dw, nw), nw * sizeof(float));
}

/* fresh_gradients: while on, a backward may write a weight gradient's first
 * product where it would add it to zeros, and must add every later product
 * into memory written since, the same memory or overlapping it. The same
 * three backwards with and without it must give the same bits; a backend
 * that wrote every product, or recognized only the same pointer, would lose
 * the first backward's dW; and after fresh_gradients(0) a backward onto a
 * nonzero dW adds to it again. */
static void case_fresh(void) {
  if (!g_be->ops->fresh_gradients) return; /* nothing to check: every product is added */
  for (int cross = 0; cross <= 1 && !test_failed_now(); cross++) {
    const int B = 37, d = 19;
    const size_t n = (size_t)B * d, nw = (size_t)d * d, ng = nw + 2 * d + n;
    float *d_in = dup(hrand(n, -1, 1), n), *d_w = dup(hrand(nw, -1, 1), nw), *d_b = dup(hrand(d, -1, 1), d);
    float *d_x0 = dup(hrand(n, -1, 1), n), *d_dout = dup(hrand(n, -1, 1), n);
    float *d_out = dnan(n), *d_act = dnan(dlrec_cross_act_floats(B, d, 0));
    if (kept_forward(cross, d_out, d_act, d_x0, d_in, d_w, d_b, B, d)) return;
    float *added = hf(ng), *got = hf(ng), *pre = hrand(nw, -1, 1), *before = hf(nw), *after = hf(nw);
    onto(cross, pre, before, d_dout, d_in, d_w, d_x0, d_act, B, d);
    fresh_run(cross, 0, added, d_dout, d_in, d_w, d_x0, d_act, B, d);
    fresh_run(cross, 1, got, d_dout, d_in, d_w, d_x0, d_act, B, d);
    onto(cross, pre, after, d_dout, d_in, d_w, d_x0, d_act, B, d);
    if (test_failed_now()) return;
    if (!same_bits(got, added, ng))
      FAIL("%s backwards with fresh gradients: not the bits of adding every product", cross ? "cross" : "linear");
    else if (!same_bits(after, before, nw))
      FAIL("%s backward after fresh_gradients(0): its product not added to dW", cross ? "cross" : "linear");
  }
}

/* ---- batch normalization split in ways (the protocol of four ops) --------------------------- */

/* C doubles of the backend's memory back on the host, summed into acc. */
static void add_down(double *acc, const double *d, int C) {
  double *h = hd(C);
  if (g_be->ops->download(g_be, h, d, (size_t)C * sizeof(double)) != DLREC_OK) FAIL("download: %s", dlrec_last_error());
  for (int c = 0; c < C; c++) acc[c] += h[c];
}
static double *dup_d(const double *h, int C) {
  double *d = dalloc((size_t)C * sizeof(double));
  if (g_be->ops->upload(g_be, d, h, (size_t)C * sizeof(double)) != DLREC_OK) FAIL("upload: %s", dlrec_last_error());
  return d;
}

/* Batch normalization split into W ways of B rows in all (a split training
 * step): each way's statistics summed on the host in way order between the
 * ops give the whole batch's forward, running statistics (moved by way 0
 * alone), din, dgamma and dbeta of the reference. One way (W = 1) gives
 * bitwise what the whole-batch ops give. */
static void bn_split_case(int B, int C, int W) {
  const size_t n = (size_t)B * C;
  float *x = hrand(n, -1, 3), *gamma = hrand(C, 0.5f, 1.5f), *beta = hrand(C, -1, 1), *R = hrand(n, -1, 1);
  float *rm = hrand(C, -1, 1), *rv = hrand(C, 0.5f, 2), *pre_dg = hrand(C, -1, 1), *pre_db = hrand(C, -1, 1);
  double *ref = hd(n), *saved = hd(2 * (size_t)C), *rmd = hdbl(rm, C), *rvd = hdbl(rv, C);
  double *xd = hdbl(x, n), *gd = hdbl(gamma, C), *bd = hdbl(beta, C);
  ref_batchnorm_train_forward(ref, saved, xd, gd, bd, rmd, rvd, 0.1, 1e-5, B, C);
  float *d_x = dup(x, n), *d_g = dup(gamma, C), *d_b = dup(beta, C), *d_R = dup(R, n), *d_rm = dup(rm, C);
  float *d_rv = dup(rv, C), *d_out = dnan(n), *d_saved[8], *d_din = dnan(n), *d_dg = dup(pre_dg, C);
  float *d_db = dup(pre_db, C);
  double *d_part = dalloc((size_t)C * sizeof(double));
  double *sum = hd(C), *sqdev = hd(C), *sg = hd(C), *sgx = hd(C);
  for (int w = 0; w < W; w++) { /* Σ x per way, summed */
    const int r0 = B * w / W, r1 = B * (w + 1) / W;
    if (OP(batchnorm_stats, d_part, d_x + (size_t)r0 * C, NULL, 0, r1 - r0, C)) return;
    add_down(sum, d_part, C);
  }
  double *d_sum = dup_d(sum, C);
  for (int w = 0; w < W; w++) { /* Σ (x − mean)² per way, summed */
    const int r0 = B * w / W, r1 = B * (w + 1) / W;
    if (OP(batchnorm_stats, d_part, d_x + (size_t)r0 * C, d_sum, B, r1 - r0, C)) return;
    add_down(sqdev, d_part, C);
  }
  double *d_sqdev = dup_d(sqdev, C);
  for (int w = 0; w < W; w++) {
    const int r0 = B * w / W, r1 = B * (w + 1) / W;
    d_saved[w] = dnan(2 * (size_t)C);
    if (OP(batchnorm_normalize, d_out + (size_t)r0 * C, d_saved[w], d_x + (size_t)r0 * C, d_sum, d_sqdev, B, d_g,
           d_b, w ? NULL : d_rm, w ? NULL : d_rv, 0.1f, 1e-5f, r1 - r0, C))
      return;
  }
  if (CHECKV("bn split out", down(d_out, n), NULL, ref, NULL, 4, n, CMP_FP32) ||
      CHECKV("bn split saved", down(d_saved[W - 1], 2 * (size_t)C), NULL, saved, NULL, 4, 2 * (size_t)C, CMP_FP32) ||
      CHECKV("bn split running_mean", down(d_rm, C), NULL, rmd, NULL, 1, C, CMP_FP32) ||
      CHECKV("bn split running_var", down(d_rv, C), NULL, rvd, NULL, 1, C, CMP_FP32))
    return;
  double *rdin = hd(n), *rdg = hd(C), *rdb = hd(C);
  ref_batchnorm_backward(rdin, rdg, rdb, hdbl(R, n), xd, gd, 1e-5, B, C);
  double *way_sg[8], *way_sgx[8];
  for (int w = 0; w < W; w++) {
    const int r0 = B * w / W, r1 = B * (w + 1) / W;
    way_sg[w] = dalloc((size_t)C * sizeof(double));
    way_sgx[w] = dalloc((size_t)C * sizeof(double));
    if (OP(batchnorm_backward_stats, way_sg[w], way_sgx[w], d_R + (size_t)r0 * C, d_x + (size_t)r0 * C, d_saved[w],
           r1 - r0, C))
      return;
    add_down(sg, way_sg[w], C);
    add_down(sgx, way_sgx[w], C);
  }
  double *d_sg = dup_d(sg, C), *d_all_sgx = dup_d(sgx, C);
  for (int w = 0; w < W; w++) {
    const int r0 = B * w / W, r1 = B * (w + 1) / W;
    if (OP(batchnorm_backward_apply, d_din + (size_t)r0 * C, d_dg, d_db, d_R + (size_t)r0 * C, d_x + (size_t)r0 * C,
           d_g, d_saved[w], way_sg[w], way_sgx[w], d_sg, d_all_sgx, B, r1 - r0, C))
      return;
  }
  const float *din = down(d_din, n), *dg = down(d_dg, C), *db = down(d_db, C);
  if (CHECKV("bn split din", din, NULL, rdin, NULL, 12, n, CMP_FP32) ||
      CHECKV("bn split dgamma", dg, pre_dg, rdg, NULL, 4.0 * B, C, CMP_FP32) ||
      CHECKV("bn split dbeta", db, pre_db, rdb, NULL, B, C, CMP_FP32) || W != 1)
    return;
  /* One way: bitwise the whole-batch ops, which run the same steps. */
  float *w_out = dnan(n), *w_saved = dnan(2 * (size_t)C), *w_rm = dup(rm, C), *w_rv = dup(rv, C), *w_din = dnan(n);
  float *w_dg = dup(pre_dg, C), *w_db = dup(pre_db, C);
  if (OP(batchnorm_train_forward, w_out, w_saved, d_x, d_g, d_b, w_rm, w_rv, 0.1f, 1e-5f, B, C) ||
      OP(batchnorm_backward, w_din, w_dg, w_db, d_R, d_x, d_g, w_saved, B, C))
    return;
  if (memcmp(down(w_out, n), down(d_out, n), n * sizeof(float)) || memcmp(down(w_din, n), din, n * sizeof(float)) ||
      memcmp(down(w_rm, C), down(d_rm, C), (size_t)C * sizeof(float)) ||
      memcmp(down(w_dg, C), dg, (size_t)C * sizeof(float)) || memcmp(down(w_db, C), db, (size_t)C * sizeof(float)))
    FAIL("bn with one way (B=%d C=%d) differs from the whole-batch ops", B, C);
}

/* The four ops of a split step's batch normalization, through their
 * protocol (ops.def's batchnorm_stats): ways of 1 to 8, one row a way. */
static void case_bn_split(void) {
  static const int split_shapes[][3] = {{2, 1, 1}, {9, 70, 1}, {9, 70, 2}, {300, 130, 3}, {64, 5, 8}};
  for (size_t s = 0; s < sizeof split_shapes / sizeof split_shapes[0] && !test_failed_now(); s++) {
    bn_split_case(split_shapes[s][0], split_shapes[s][1], split_shapes[s][2]);
    case_end();
  }
}

/* ---- the dense optimizer ---------------------------------------------------------------------- */

static void case_optim(void) {
  static const size_t sizes[] = {1, 37, 40000};
  for (int kind = DLREC_OPTIM_SGD; kind <= DLREC_OPTIM_ADAGRAD && !test_failed_now(); kind++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0] && !test_failed_now(); s++) {
      const size_t n = sizes[s];
      dlrec_optim_config c;
      dlrec_optim_config_default(&c, (dlrec_optim_kind)kind);
      c.lr = 0.05f;
      c.weight_decay = s == 1 ? 0.01f : 0.0f;
      c.initial_accumulator = kind == DLREC_OPTIM_ADAGRAD ? 0.1f : 0.0f;
      const size_t ns = dlrec_optim_state_floats(&c, n);
      float *w = hrand(n, -1, 1), *state = hf(ns);
      if (dlrec_optim_state_init(&c, ns ? state : NULL, n) != DLREC_OK) FAIL("%s", dlrec_last_error());
      /* The reference's state starts from the config, not from the op's
       * initialization, so that a wrong start is noticed. */
      double *wr = hdbl(w, n), *sr = hd(ns);
      for (size_t i = 0; kind == DLREC_OPTIM_ADAGRAD && i < ns; i++) sr[i] = c.initial_accumulator;
      float *d_w = dup(w, n), *d_s = ns ? dup(state, ns) : NULL;
      for (uint64_t t = 1; t <= 3 && !test_failed_now(); t++) {
        float *g = hrand(n, -1, 1);
        if (t == 2) g[0] = 0.0f; /* a zero gradient still moves Adam's moments */
        ref_optim_step(&c, wr, hdbl(g, n), sr, n, t);
        if (OP(optim_step, &c, d_w, dup(g, n), d_s, n, t) ||
            CHECKV("optim param", down(d_w, n), NULL, wr, NULL, 1, n, CMP_FP32) ||
            CHECKV("optim state", down(d_s, ns), NULL, sr, NULL, 0.1, ns, CMP_FP32))
          return;
      }
      case_end();
    }
}

/* ---- embeddings ------------------------------------------------------------------------------- */

/* B samples, F <= 4 columns, bags of min_hot .. max_hot ids below rows, skewed
 * toward small ids so that rows repeat. Owned by the case's arena. */
typedef struct bag_data {
  uint32_t *off[4], *ids[4];
  uint8_t mean_cols[4];
  dlrec_bag_batch bags;
} bag_data;

static void bags_make(bag_data *bd, uint32_t B, uint32_t F, uint32_t min_hot, uint32_t max_hot, uint64_t rows) {
  for (uint32_t c = 0; c < F; c++) {
    bd->off[c] = hkeep(malloc((B + 1) * sizeof(uint32_t)));
    bd->ids[c] = hkeep(malloc(((size_t)B * max_hot + 1) * sizeof(uint32_t)));
    bd->off[c][0] = 0;
    for (uint32_t b = 0; b < B; b++) {
      const uint32_t k = min_hot + dlrec_rng_below(&g_rng, max_hot - min_hot + 1);
      for (uint32_t j = 0; j < k; j++) {
        const double u = dlrec_rng_uniform(&g_rng);
        bd->ids[c][bd->off[c][b] + j] = (uint32_t)((double)rows * u * u * u);
      }
      bd->off[c][b + 1] = bd->off[c][b] + k;
    }
    bd->mean_cols[c] = (uint8_t)(c % 2);
  }
  dlrec_bag_batch b = {B, F, (const uint32_t *const *)bd->off, (const uint32_t *const *)bd->ids, NULL};
  bd->bags = b;
}

/* A table and its optimizer as the backend's bag ops take them: themselves
 * on a backend of host memory, else mirrors in the backend's memory, whose
 * rows and state tbl_back copies into the host's after an op (for the
 * checks, which read the host's). */
typedef struct tbl {
  dlrec_table *dev;
  dlrec_sparse_optim *dev_o;
  dlrec_table *host;
  dlrec_sparse_optim *host_o;
} tbl;

static int tbl_open(int line, tbl *x, dlrec_table *t, dlrec_sparse_optim *o) {
  *x = (tbl){t, o, t, o};
  if (g_be->host_memory) return 0;
  x->dev = NULL, x->dev_o = NULL;
  if (backend_table_mirror(g_be, t, &x->dev) == DLREC_OK &&
      (!o || backend_sparse_optim_mirror(g_be, o, x->dev, &x->dev_o) == DLREC_OK))
    return 0;
  fail_at(line, "the table's mirror: %s", dlrec_last_error());
  return 1;
}

static int tbl_back(int line, tbl *x) {
  if (g_be->host_memory) return 0;
  if (backend_table_download(g_be, x->host, x->dev) == DLREC_OK &&
      (!x->host_o || backend_sparse_optim_download(g_be, x->host_o, x->dev_o) == DLREC_OK))
    return 0;
  fail_at(line, "the table back from the backend: %s", dlrec_last_error());
  return 1;
}

static void tbl_close(tbl *x) {
  if (g_be->host_memory) return;
  backend_sparse_optim_mirror_free(g_be, x->dev_o);
  backend_table_mirror_free(g_be, x->dev);
  *x = (tbl){0};
}

/* The rows of any table widened to fp32: (rows, stride). */
static float *table_rows(const dlrec_table *t) {
  const uint32_t stride = dlrec_table_stride(t);
  float *r = hf(dlrec_table_rows(t) * stride);
  for (uint64_t i = 0; i < dlrec_table_rows(t); i++) dlrec_table_get_row(t, i, r + i * stride);
  return r;
}

static void case_bag_forward(void) {
  if (!HAS(bag_forward)) return;
  static const uint32_t shapes[][6] = {{1000, 16, 37, 4, 0, 4}, {1000, 5, 1, 3, 0, 3}, {50, 32, 300, 4, 0, 2},
                                       {1, 3, 4, 1, 0, 3},      {5000, 7, 300, 3, 1, 1}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !test_failed_now(); s++)
    for (int dtype = DLREC_TABLE_FP32; dtype <= DLREC_TABLE_BF16 && !test_failed_now(); dtype++)
      for (int mode = 0; mode < 3 && !test_failed_now(); mode++) { /* sum, mean, per-column flags */
        const uint64_t rows = shapes[s][0];
        const uint32_t D = shapes[s][1], B = shapes[s][2], F = shapes[s][3];
        dlrec_table *t = NULL;
        dlrec_row_range all = {.begin = 0, .end = rows};
        if (dlrec_table_create_dtype(&t, rows, D, (dlrec_table_dtype)dtype) != DLREC_OK ||
            dlrec_table_init_uniform(t, &all, 1, 5 + s) != DLREC_OK) {
          FAIL("table: %s", dlrec_last_error());
          dlrec_table_free(t);
          return;
        }
        bag_data bd;
        bags_make(&bd, B, F, shapes[s][4], shapes[s][5], rows);
        if (mode == 2) bd.bags.mean_cols = bd.mean_cols;
        const dlrec_pooling m = mode == 1 ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM;
        const size_t n = (size_t)B * F * D;
        double *ref = hd(n);
        ref_bag_forward(ref, table_rows(t), dlrec_table_stride(t), D, &bd.bags, m);
        float *d_out = dnan(n);
        tbl x;
        if (!tbl_open(__LINE__, &x, t, NULL) && !OP(bag_forward, d_out, x.dev, &bd.bags, m))
          CHECKV(dtype ? "bag out (bf16 table)" : "bag out", down(d_out, n), NULL, ref, NULL, shapes[s][5], n,
                 CMP_FP32);
        tbl_close(&x);
        dlrec_table_free(t);
        case_end();
      }
}


/* Three steps of the fused backward + update against the reference's
 * optimizer, with the optimizer's state; rows the batches never touch must
 * keep their bits. */
static void sparse_case(dlrec_sparse_optim_kind kind, int mode, uint32_t B) {
  const uint64_t rows = 300;
  const uint32_t D = 16, F = 3, STEPS = 3;
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, kind);
  c.lr = 0.05f;
  c.weight_decay = mode == 1 ? 0.01f : 0.0f;
  c.initial_accumulator = kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 0.1f : 0.0f;
  dlrec_table *t = NULL;
  dlrec_sparse_optim *o = NULL;
  tbl x = {0};
  dlrec_row_range all = {.begin = 0, .end = rows};
  if (dlrec_table_create(&t, rows, D) != DLREC_OK || dlrec_table_init_uniform(t, &all, 1, 11) != DLREC_OK ||
      dlrec_sparse_optim_create(&o, t, &c) != DLREC_OK) {
    FAIL("table: %s", dlrec_last_error());
    goto out;
  }
  const uint32_t stride = dlrec_table_stride(t);
  ref_sparse_state s = {hd(rows * D), hd(rows), hd(rows * D), hd(rows * D), hkeep(calloc(rows, sizeof(uint32_t))), 0};
  for (uint64_t r = 0; r < rows; r++) {
    s.accum[r] = c.initial_accumulator;
    for (uint32_t d = 0; d < D; d++) s.w[r * D + d] = dlrec_table_data(t)[r * stride + d];
  }
  dlrec_sparse_optim_state st;
  dlrec_sparse_optim_state_view(o, &st);
  const size_t scratch_bytes = dlrec_bag_backward_scratch_bytes(t, (uint64_t)B * F * 4);
  void *scratch = dalloc(scratch_bytes);
  float *before = hf(rows * stride);
  if (tbl_open(__LINE__, &x, t, o)) goto out;
  for (uint32_t step = 0; step < STEPS && !test_failed_now(); step++) {
    bag_data bd;
    /* Ids from the lower 2/3 of the table only: the top third never changes. */
    bags_make(&bd, B, F, 0, 4, rows * 2 / 3);
    if (mode == 2) bd.bags.mean_cols = bd.mean_cols;
    const dlrec_pooling m = mode == 1 ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM;
    float *dout = hrand((size_t)B * F * D, -1, 1);
    memcpy(before, dlrec_table_data(t), rows * stride * sizeof(float));
    ref_bag_backward_update(&s, &c, &bd.bags, m, dout, rows, D);
    if (OP(bag_backward_update, x.dev, x.dev_o, &bd.bags, m, dup(dout, (size_t)B * F * D), scratch, scratch_bytes) ||
        tbl_back(__LINE__, &x))
      goto out;
    const float *w = dlrec_table_data(t);
    for (uint64_t r = 0; r < rows; r++) {
      const float *got = w + r * stride;
      if (r >= rows * 2 / 3 && memcmp(got, before + r * stride, D * sizeof(float))) {
        FAIL("kind %d step %u: untouched row %llu changed", kind, step, (unsigned long long)r);
        goto out;
      }
      char what[64];
      snprintf(what, sizeof what, "kind %d mode %d step %u row %llu", kind, mode, step, (unsigned long long)r);
      if (CHECKV(what, got, NULL, s.w + r * D, NULL, 0.1, D, CMP_FP32)) goto out;
      if (kind == DLREC_SPARSE_ROWWISE_ADAGRAD && CHECKV(what, st.accum + r, NULL, s.accum + r, NULL, 0, 1, CMP_FP32))
        goto out;
      if (kind == DLREC_SPARSE_LAZY_ADAM &&
          (CHECKV(what, st.m + r * stride, NULL, s.m + r * D, NULL, 0.1, D, CMP_FP32) ||
           CHECKV(what, st.v + r * stride, NULL, s.v + r * D, NULL, 0, D, CMP_FP32)))
        goto out;
      if (kind == DLREC_SPARSE_LAZY_ADAM && st.steps[r] != s.steps[r]) {
        FAIL("%s: %u Adam steps, reference %u", what, st.steps[r], s.steps[r]);
        goto out;
      }
    }
  }
out:
  tbl_close(&x);
  dlrec_sparse_optim_free(o);
  dlrec_table_free(t);
}

/* The gradient the update applies, read off SGD with lr = 1 (a row's
 * change), against central differences of the reference forward: L = Σ R ⊙
 * bag(table) is linear in the table, and h is a power of two, so the
 * differences are exact up to rounding. */
typedef struct bag_ctx {
  const dlrec_bag_batch *bags;
  dlrec_pooling mode;
  uint32_t stride, D;
  float *rows;
  double *out;
  const float *R;
  size_t nout;
} bag_ctx;

static void bag_gradient_case(int mode) {
  const uint64_t rows = 40;
  const uint32_t D = 6, B = 7, F = 3;
  dlrec_table *t = NULL;
  dlrec_sparse_optim *o = NULL;
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_SGD);
  c.lr = 1.0f;
  tbl x = {0};
  dlrec_row_range all = {.begin = 0, .end = rows};
  if (dlrec_table_create(&t, rows, D) != DLREC_OK || dlrec_table_init_uniform(t, &all, 1, 9) != DLREC_OK ||
      dlrec_sparse_optim_create(&o, t, &c) != DLREC_OK) {
    FAIL("table: %s", dlrec_last_error());
    goto out;
  }
  const uint32_t stride = dlrec_table_stride(t);
  const size_t n = rows * stride, nout = (size_t)B * F * D;
  bag_data bd;
  bags_make(&bd, B, F, 0, 4, rows);
  if (mode == 2) bd.bags.mean_cols = bd.mean_cols;
  const dlrec_pooling m = mode == 1 ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM;
  float *R = hrand(nout, -1, 1), *before = hf(n), *pert = hf(n);
  memcpy(before, dlrec_table_data(t), n * sizeof(float));
  memcpy(pert, before, n * sizeof(float));
  const size_t scratch_bytes = dlrec_bag_backward_scratch_bytes(t, (uint64_t)B * F * 4);
  if (tbl_open(__LINE__, &x, t, o) ||
      OP(bag_backward_update, x.dev, x.dev_o, &bd.bags, m, dup(R, nout), dalloc(scratch_bytes), scratch_bytes) ||
      tbl_back(__LINE__, &x))
    goto out;
  double *out = hd(nout);
  for (uint64_t r = 0; r < rows; r++)
    for (uint32_t d = 0; d < D; d++) {
      const size_t i = r * stride + d;
      const float h = 0.125f;
      double l[2];
      for (int k = 0; k < 2; k++) {
        pert[i] = before[i] + (k ? -h : h);
        ref_bag_forward(out, pert, stride, D, &bd.bags, m);
        l[k] = ref_weighted_sum(out, R, nout);
      }
      pert[i] = before[i];
      const double fd = (l[0] - l[1]) / (2 * h), got = (double)before[i] - dlrec_table_data(t)[i];
      if (!(fabs(got - fd) <= bound(CMP_FP32, fd, 4) + FD_ABS)) {
        FAIL("mode %d: d table[%llu][%u] = %.9g, finite difference %.9g", mode, (unsigned long long)r, d, got, fd);
        goto out;
      }
    }
out:
  tbl_close(&x);
  dlrec_sparse_optim_free(o);
  dlrec_table_free(t);
}

static void case_sparse(void) {
  if (!HAS(bag_backward_update)) return;
  for (int kind = DLREC_SPARSE_SGD; kind <= DLREC_SPARSE_LAZY_ADAM && !test_failed_now(); kind++)
    for (int mode = 0; mode < 3 && !test_failed_now(); mode++) {
      sparse_case((dlrec_sparse_optim_kind)kind, mode, mode == 0 ? 1 : 64);
      case_end();
    }
  for (int mode = 0; mode < 3 && !test_failed_now(); mode++) {
    bag_gradient_case(mode);
    case_end();
  }
}


/* A bf16 table with lazy Adam, updated through mirrors in the backend's
 * memory (mirror.c; on the CPU too, whose memory makes them plain copies)
 * and copied back, against the CPU's own op on a copy of the table: on the
 * CPU the same bits; elsewhere each row within one bf16 place (the fp32
 * value before the stochastic rounding may differ in its last bits, the
 * draw not), the moments to fp32's bound, the step counts and the update
 * count exactly. */
static void case_mirror(void) {
  const uint64_t rows = 200;
  const uint32_t D = 13, B = 9, F = 2, STEPS = 3; /* a padded stride */
  dlrec_sparse_optim_config c;
  dlrec_sparse_optim_config_default(&c, DLREC_SPARSE_LAZY_ADAM);
  c.lr = 0.05f;
  dlrec_table *t = NULL, *ref = NULL, *mt = NULL;
  dlrec_sparse_optim *o = NULL, *ro = NULL, *mo = NULL;
  dlrec_row_range all = {.begin = 0, .end = rows};
  if (dlrec_table_create_dtype(&t, rows, D, DLREC_TABLE_BF16) != DLREC_OK ||
      dlrec_table_create_dtype(&ref, rows, D, DLREC_TABLE_BF16) != DLREC_OK ||
      dlrec_table_init_uniform(t, &all, 1, 3) != DLREC_OK || dlrec_table_init_uniform(ref, &all, 1, 3) != DLREC_OK ||
      dlrec_sparse_optim_create(&o, t, &c) != DLREC_OK || dlrec_sparse_optim_create(&ro, ref, &c) != DLREC_OK) {
    FAIL("tables: %s", dlrec_last_error());
    goto out;
  }
  const size_t scratch_bytes = dlrec_bag_backward_scratch_bytes(t, (uint64_t)B * F * 4);
  void *host_scratch = hkeep(malloc(scratch_bytes)), *dev_scratch = dalloc(scratch_bytes);
  /* One update on the host first, to both: the mirror must carry its
   * state and its count (which keys the rounding) over. */
  bag_data b0;
  bags_make(&b0, B, F, 1, 4, rows);
  float *d0 = hrand((size_t)B * F * D, -1, 1);
  if (cpu_bag_backward_update(t, o, &b0.bags, DLREC_POOLING_SUM, d0, host_scratch, scratch_bytes) != DLREC_OK ||
      cpu_bag_backward_update(ref, ro, &b0.bags, DLREC_POOLING_SUM, d0, host_scratch, scratch_bytes) != DLREC_OK ||
      backend_table_mirror(g_be, t, &mt) != DLREC_OK || backend_sparse_optim_mirror(g_be, o, mt, &mo) != DLREC_OK) {
    FAIL("the first update and the mirrors: %s", dlrec_last_error());
    goto out;
  }
  for (uint32_t step = 0; step < STEPS; step++) {
    bag_data bd;
    bags_make(&bd, B, F, 1, 4, rows);
    float *dout = hrand((size_t)B * F * D, -1, 1);
    if (OP(bag_backward_update, mt, mo, &bd.bags, DLREC_POOLING_SUM, dup(dout, (size_t)B * F * D), dev_scratch,
           scratch_bytes))
      goto out;
    if (cpu_bag_backward_update(ref, ro, &bd.bags, DLREC_POOLING_SUM, dout, host_scratch, scratch_bytes) != DLREC_OK) {
      FAIL("the CPU's update: %s", dlrec_last_error());
      goto out;
    }
  }
  if (backend_table_download(g_be, t, mt) != DLREC_OK || backend_sparse_optim_download(g_be, o, mo) != DLREC_OK) {
    FAIL("download: %s", dlrec_last_error());
    goto out;
  }
  const int exact = !strcmp(g_be->name, "cpu");
  const uint16_t *got = dlrec_table_raw(t), *want = dlrec_table_raw(ref);
  const uint32_t stride = dlrec_table_stride(t);
  for (size_t i = 0; i < rows * stride; i++) {
    const int apart = abs((int)got[i] - (int)want[i]); /* same-signed neighbours differ by 1 as integers */
    if (exact ? got[i] != want[i] : apart > 1) {
      FAIL("row %zu [%zu]: bf16 0x%04x, the CPU's 0x%04x", i / stride, i % stride, got[i], want[i]);
      goto out;
    }
  }
  dlrec_sparse_optim_state gs, ws;
  dlrec_sparse_optim_state_view(o, &gs);
  dlrec_sparse_optim_state_view(ro, &ws);
  if (!gs.updates || *gs.updates != *ws.updates || memcmp(gs.steps, ws.steps, rows * sizeof(uint32_t))) {
    FAIL("update count %llu or step counts differ from the CPU's (%llu)",
         gs.updates ? (unsigned long long)*gs.updates : 0ull, (unsigned long long)*ws.updates);
    goto out;
  }
  double *m = hd(rows * stride), *v = hd(rows * stride);
  ref_to_double(m, ws.m, rows * stride);
  ref_to_double(v, ws.v, rows * stride);
  if (exact ? memcmp(gs.m, ws.m, rows * stride * sizeof(float)) || memcmp(gs.v, ws.v, rows * stride * sizeof(float))
            : CHECKV("mirror m", gs.m, NULL, m, NULL, 1, rows * stride, CMP_FP32) ||
                  CHECKV("mirror v", gs.v, NULL, v, NULL, 1, rows * stride, CMP_FP32))
    FAIL("the moments differ from the CPU's");
out:
  backend_sparse_optim_mirror_free(g_be, mo);
  backend_table_mirror_free(g_be, mt);
  dlrec_sparse_optim_free(o);
  dlrec_sparse_optim_free(ro);
  dlrec_table_free(t);
  dlrec_table_free(ref);
}


/* cpu-mirror (the CPU as a device, unlisted) refuses an op a buffer that
 * is not its memory, naming the op and the argument, as a GPU's kernel
 * could not read a host pointer; its own buffers pass. */
TEST(cpu_mirror_refuses_host_pointers) {
  dlrec_backend *be = NULL;
  dlrec_backend_config c = {1, DLREC_PRECISION_FP32, 0};
  CHECK_OK(dlrec_backend_create(&be, "cpu-mirror", &c));
  if (!be) return;
  CHECK(!dlrec_backend_host_memory(be));
  float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8];
  float *x = be->ops->alloc(be, sizeof host), *y = be->ops->alloc(be, sizeof host);
  CHECK(x && y);
  CHECK_OK(be->ops->upload(be, x, host, sizeof host));
  CHECK_OK(be->ops->upload(be, y, host, sizeof host));
  CHECK_ERR(BE_OP(be, add, y, host, 8), DLREC_ERR_INVALID, "add given memory that is not the backend's (its pointer "
                                                            "argument 2)");
  CHECK_OK(BE_OP(be, add, y, x, 8));
  CHECK_OK(be->ops->download(be, back, y, sizeof back));
  CHECK(back[0] == 2 && back[7] == 16);
  be->ops->release(be, x);
  be->ops->release(be, y);
  dlrec_backend_free(be);
}

/* ---- scoring: the packed layers and the *_infer ops, batch-invariant -------------------------- */

/* A scoring op over B rows of up to two inputs (widths w0, w1; w1 = 0 for
 * none), in the backend's memory. */
typedef struct infer_op {
  const char *name;
  int w0, w1, wout;
  dlrec_status (*run)(const struct infer_op *op, float *out, const float *in0, const float *in1, int B);
  int d, r, K, relu;
  dlrec_packed_linear *p[3 * 4 + 1];
  float *ws; /* scratch for 33 rows */
  const float *gamma, *beta, *rm, *rv;
} infer_op;

/* Scores 33 random rows, then rows 0, 1, 16 and 32 alone, from an input one
 * float past an allocation's start, and rows 7 .. 19 as a batch of 13; each
 * row must have the batch's bits. */
static int check_batch_invariant(int line, infer_op *op) {
  enum { B = 33 };
  const size_t n0 = (size_t)B * op->w0, n1 = (size_t)B * op->w1, no = (size_t)B * op->wout;
  float *in0 = hrand(n0, -1, 1), *in1 = hrand(n1, -1, 1);
  float *d_in0 = dup(in0, n0), *d_in1 = op->w1 ? dup(in1, n1) : NULL, *d_out = dnan(no);
  omp_set_num_threads((int)g_be->threads + 1);
  if (op_done(line, op->name, op->run(op, d_out, d_in0, d_in1, B))) return 1;
  const float *all = down(d_out, no);
  float *d_a0 = dalloc(((size_t)op->w0 + 1) * sizeof(float)), *d_a1 = dalloc(((size_t)op->w1 + 1) * sizeof(float));
  float *d_one = dnan(no);
  static const int alone[] = {0, 1, 16, 32};
  for (size_t k = 0; k < sizeof alone / sizeof alone[0]; k++) {
    const int b = alone[k];
    if (g_be->ops->upload(g_be, d_a0 + 1, in0 + (size_t)b * op->w0, (size_t)op->w0 * sizeof(float)) != DLREC_OK ||
        (op->w1 &&
         g_be->ops->upload(g_be, d_a1 + 1, in1 + (size_t)b * op->w1, (size_t)op->w1 * sizeof(float)) != DLREC_OK) ||
        op_done(line, op->name, op->run(op, d_one, d_a0 + 1, op->w1 ? d_a1 + 1 : NULL, 1)))
      return 1;
    if (memcmp(down(d_one, op->wout), all + (size_t)b * op->wout, (size_t)op->wout * sizeof(float))) {
      fail_at(line, "%s: row %d alone differs from the batch of %d", op->name, b, B);
      return 1;
    }
  }
  if (op_done(line, op->name,
              op->run(op, d_one, d_in0 + 7 * (size_t)op->w0, op->w1 ? d_in1 + 7 * (size_t)op->w1 : NULL, 13)))
    return 1;
  if (memcmp(down(d_one, 13 * (size_t)op->wout), all + 7 * (size_t)op->wout, 13 * (size_t)op->wout * sizeof(float))) {
    fail_at(line, "%s: rows 7 .. 19 as a batch differ from the batch of %d", op->name, B);
    return 1;
  }
  return 0;
}
#define CHECK_INVARIANT(op) check_batch_invariant(__LINE__, op)

static dlrec_status run_packed(const infer_op *op, float *out, const float *in, const float *unused, int B) {
  (void)unused;
  return BE_OP(g_be, packed_forward, out, op->p[0], in, B, op->relu ? DLREC_ACT_RELU : DLREC_ACT_NONE);
}
static dlrec_status run_cross(const infer_op *op, float *out, const float *x0, const float *xl, int B) {
  return BE_OP(g_be, cross_infer, out, x0, xl, op->p[0], B, op->d);
}
static dlrec_status run_lowrank(const infer_op *op, float *out, const float *x0, const float *xl, int B) {
  return BE_OP(g_be, cross_lowrank_infer, out, op->ws, x0, xl, op->p[0], op->p[1], B, op->d, op->r);
}
static dlrec_status run_mix(const infer_op *op, float *out, const float *x0, const float *xl, int B) {
  return BE_OP(g_be, cross_mix_infer, out, op->ws, x0, xl, (const dlrec_packed_linear *const *)op->p,
               (const dlrec_packed_linear *const *)op->p + op->K, (const dlrec_packed_linear *const *)op->p + 2 * op->K,
               op->p[3 * op->K], B, op->d, op->r, op->K);
}
/* Packing computes nothing in parallel, so it is not held to the thread check. */
static int packed(dlrec_packed_linear **p, const float *w, const float *bias, int IN, int OUT) {
  if (!HAS(packed_create)) return 1;
  if (BE_OP(g_be, packed_create, p, w, bias, IN, OUT) == DLREC_OK) return 0;
  FAIL("packed_create %dx%d: %s", IN, OUT, dlrec_last_error());
  return 1;
}

static void free_packed(infer_op *op) {
  for (size_t i = 0; i < sizeof op->p / sizeof op->p[0]; i++)
    if (op->p[i]) BE_OP(g_be, packed_free, op->p[i]);
  memset(op->p, 0, sizeof op->p);
}

/* Another backend's packed layer scores as the CPU's bit for bit: both
 * compute ops.h's fma chain, which the CPU rounds once per step where
 * it has FMA (a build without FMA rounds twice, and is not compared). */
static int same_as_cpu(int line, const float *got, const float *w, const float *bias, const float *in, int B, int IN,
                       int OUT, int relu) {
#if defined(__FMA__)
  if (!strcmp(g_be->name, "cpu")) return 0;
  dlrec_packed_linear *p = NULL;
  float *want = hf((size_t)B * OUT);
  dlrec_status st = cpu_packed_create(&p, w, bias, IN, OUT);
  if (st == DLREC_OK) st = cpu_packed_forward(want, p, in, B, (relu) ? DLREC_ACT_RELU : DLREC_ACT_NONE);
  cpu_packed_free(p);
  if (st != DLREC_OK) {
    fail_at(line, "the CPU's packed layer: %s", dlrec_last_error());
    return 1;
  }
  for (size_t i = 0; i < (size_t)B * OUT; i++)
    if (memcmp(&got[i], &want[i], sizeof(float))) {
      fail_at(line, "packed out[%zu] = %.9g, the CPU's %.9g: not the same bits", i, got[i], want[i]);
      return 1;
    }
#else
  (void)line, (void)got, (void)w, (void)bias, (void)in, (void)B, (void)IN, (void)OUT, (void)relu;
#endif
  return 0;
}

/* The packed linear layer: against the reference (its fixed order is not
 * the reference's, so to fp32's bound), the same bits as the CPU's on
 * another backend, then for batch invariance. IN = 300 and OUT = 200 put a
 * batch of 33 past the layer's parallel threshold. */
static void case_packed(void) {
  static const int shapes[][2] = {{1, 1}, {7, 3}, {13, 9}, {300, 200}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && !test_failed_now(); s++)
    for (int v = 0; v < 4 && !test_failed_now(); v++) {
      const int IN = shapes[s][0], OUT = shapes[s][1], relu = v & 1, with_bias = v < 2, B = 5;
      float *w = hrand((size_t)OUT * IN, -1, 1), *bias = hrand(OUT, -1, 1), *in = hrand((size_t)B * IN, -1, 1);
      infer_op op = {.name = "packed_forward", .w0 = IN, .wout = OUT, .run = run_packed, .relu = relu};
      /* The weights are the caller's host arrays, copied at packing. */
      if (packed(&op.p[0], w, with_bias ? bias : NULL, IN, OUT)) return;
      double *ref = hd((size_t)B * OUT), *mag = hd((size_t)B * OUT);
      double *ind = hdbl(in, (size_t)B * IN), *wd = hdbl(w, (size_t)OUT * IN), *bd = with_bias ? hdbl(bias, OUT) : NULL;
      ref_linear_forward(ref, ind, wd, bd, B, IN, OUT, relu);
      ref_linear_forward_abs(mag, ind, wd, bd, B, IN, OUT);
      float *d_out = dnan((size_t)B * OUT);
      if (!OP(packed_forward, d_out, op.p[0], dup(in, (size_t)B * IN), B, relu ? DLREC_ACT_RELU : DLREC_ACT_NONE) &&
          !CHECKV("packed out", down(d_out, (size_t)B * OUT), NULL, ref, mag, 0, (size_t)B * OUT, CMP_FP32) &&
          !same_as_cpu(__LINE__, down(d_out, (size_t)B * OUT), w, with_bias ? bias : NULL, in, B, IN, OUT, relu))
        CHECK_INVARIANT(&op);
      free_packed(&op);
      case_end();
    }
}


static void case_cross_infer(void) {
  enum { B = 9, d = 200, r = 24 };
  const size_t n = (size_t)B * d;
  float *w = hrand(d * d, -0.1f, 0.1f), *v = hrand(r * d, -0.1f, 0.1f), *u = hrand(d * r, -0.2f, 0.2f);
  float *bias = hrand(d, -1, 1), *x0 = hrand(n, -1, 1), *xl = hrand(n, -1, 1);
  double *x0d = hdbl(x0, n), *xld = hdbl(xl, n), *ref = hd(n);
  float *d_x0 = dup(x0, n), *d_xl = dup(xl, n), *d_out = dnan(n);
  infer_op op = {.name = "cross_infer", .w0 = d, .w1 = d, .wout = d, .run = run_cross, .d = d};
  if (packed(&op.p[0], w, bias, d, d)) return;
  ref_cross_forward(ref, x0d, xld, hdbl(w, d * d), hdbl(bias, d), B, d);
  if (!OP(cross_infer, d_out, d_x0, d_xl, op.p[0], B, d) &&
      !CHECKV("cross infer", down(d_out, n), NULL, ref, NULL, 0.1 * d + 3, n, CMP_FP32))
    CHECK_INVARIANT(&op);
  free_packed(&op);
  if (test_failed_now()) return;
  op = (infer_op){.name = "cross_lowrank_infer", .w0 = d, .w1 = d, .wout = d, .run = run_lowrank, .d = d, .r = r,
                  .ws = dnan(33 * r)};
  if (packed(&op.p[0], v, NULL, d, r) || packed(&op.p[1], u, bias, r, d)) {
    free_packed(&op);
    return;
  }
  ref_cross_lowrank_forward(ref, x0d, xld, hdbl(v, r * d), hdbl(u, d * r), hdbl(bias, d), B, d, r);
  if (!OP(cross_lowrank_infer, d_out, op.ws, d_x0, d_xl, op.p[0], op.p[1], B, d, r) &&
      !CHECKV("cross lowrank infer", down(d_out, n), NULL, ref, NULL, 0.1 * d * r + 3, n, CMP_FP32))
    CHECK_INVARIANT(&op);
  free_packed(&op);
}

static void case_cross_mix_infer(void) {
  enum { B = 5, d = 48, r = 8, K = 4 };
  const size_t n = (size_t)B * d, nv = (size_t)K * r * d, nc = (size_t)K * r * r, ng = (size_t)K * d;
  float *x0 = hrand(n, -1, 1), *xl = hrand(n, -1, 1), *v = hrand(nv, -0.3f, 0.3f), *c = hrand(nc, -1, 1);
  float *u = hrand(nv, -1, 1), *g = hrand(ng, -0.5f, 0.5f), *bias = hrand(d, -1, 1);
  double *ref = hd(n);
  infer_op op = {.name = "cross_mix_infer", .w0 = d, .w1 = d, .wout = d, .run = run_mix, .d = d, .r = r, .K = K,
                 .ws = dnan(dlrec_cross_mix_infer_ws_floats(33, d, r, K))};
  int bad = 0;
  for (int k = 0; k < K && !bad; k++)
    bad = packed(&op.p[k], v + (size_t)k * r * d, NULL, d, r) ||
          packed(&op.p[K + k], c + (size_t)k * r * r, NULL, r, r) ||
          packed(&op.p[2 * K + k], u + (size_t)k * d * r, bias, r, d);
  bad = bad || packed(&op.p[3 * K], g, NULL, d, K);
  if (!bad) {
    ref_cross_mix_forward(ref, NULL, hdbl(x0, n), hdbl(xl, n), hdbl(v, nv), hdbl(c, nc), hdbl(u, nv), hdbl(g, ng),
                          hdbl(bias, d), B, d, r, K);
    float *d_out = dnan(n);
    omp_set_num_threads((int)g_be->threads + 1);
    if (!op_done(__LINE__, "cross_mix_infer", run_mix(&op, d_out, dup(x0, n), dup(xl, n), B)) &&
        !CHECKV("cross mix infer", down(d_out, n), NULL, ref, NULL, 0.3 * d * r * r + 3, n, CMP_FP32))
      CHECK_INVARIANT(&op);
  }
  free_packed(&op);
}

/* ---- the behaviours that are not one op's ------------------------------------------------------ */

TEST(memory_ops_align_round_trip_and_synchronize) { each_backend(case_memory, 1); }
TEST(kept_operands_are_read_between_forward_and_backward) { each_backend(case_kept, 20); }
TEST(fresh_gradients_write_only_the_first_product) { each_backend(case_fresh, 21); }
TEST(mirrored_tables_update_as_the_cpu_does) { each_backend(case_mirror, 19); }
