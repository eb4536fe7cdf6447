/* cuBLASLt loaded with dlopen (cuda_blas.h says why). Descriptors are made
 * per call, and the algorithm is cuBLASLt's first heuristic choice, asked
 * for once per call shape and kept (the query costs the host tens of
 * microseconds, as much as the kernel of a small product). */
#include "backend/cuda/cuda_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>

#define WORKSPACE_BYTES (32u << 20)

/* The entry points used, as pointers of the header's own types. */
#define CUDA_BLAS_FUNCS(X)                                                                                          \
  X(cublasLtCreate)                                                                                                 \
  X(cublasLtDestroy)                                                                                                \
  X(cublasLtMatmulDescCreate)                                                                                       \
  X(cublasLtMatmulDescDestroy)                                                                                      \
  X(cublasLtMatmulDescSetAttribute)                                                                                 \
  X(cublasLtMatrixLayoutCreate)                                                                                     \
  X(cublasLtMatrixLayoutDestroy)                                                                                    \
  X(cublasLtMatmulPreferenceCreate)                                                                                 \
  X(cublasLtMatmulPreferenceDestroy)                                                                                \
  X(cublasLtMatmulPreferenceSetAttribute)                                                                           \
  X(cublasLtMatmulAlgoGetHeuristic)                                                                                 \
  X(cublasLtMatmul)

/* A call shape: everything the heuristic query is given. */
typedef struct algo_key {
  int type, ta, tb, m, n, k, lda, ldb, bias, relu;
  uint32_t align_a, align_b, align_d;
} algo_key;

#define ALGO_CACHE 256

struct cuda_blas {
  void *lib;
#define FIELD(name) __typeof__(name) *name;
  CUDA_BLAS_FUNCS(FIELD)
#undef FIELD
  cublasLtHandle_t handle;
  cudaStream_t stream;
  void *workspace;
  /* The algorithms chosen, by shape; a lock, because scoring may call from
   * several threads. When full, shapes past it are asked for each call. */
  pthread_mutex_t lock;
  int n_algos;
  algo_key keys[ALGO_CACHE];
  cublasLtMatmulAlgo_t algos[ALGO_CACHE];
};

#define STR2(x) #x
#define STR(x) STR2(x)
#define SONAME "libcublasLt.so." STR(CUBLAS_VER_MAJOR)

void cuda_blas_free(cuda_blas *b) {
  if (!b) return;
  if (b->handle) b->cublasLtDestroy(b->handle);
  if (b->workspace) cudaFree(b->workspace);
  if (b->lib) dlclose(b->lib);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

/* The algorithm kept for shape k into *algo: 1, or 0 when none is. */
static int algo_find(cuda_blas *b, const algo_key *k, cublasLtMatmulAlgo_t *algo) {
  int hit = 0;
  pthread_mutex_lock(&b->lock);
  for (int i = 0; i < b->n_algos && !hit; i++)
    if (!memcmp(&b->keys[i], k, sizeof *k)) {
      *algo = b->algos[i];
      hit = 1;
    }
  pthread_mutex_unlock(&b->lock);
  return hit;
}

static void algo_keep(cuda_blas *b, const algo_key *k, const cublasLtMatmulAlgo_t *algo) {
  pthread_mutex_lock(&b->lock);
  if (b->n_algos < ALGO_CACHE) {
    b->keys[b->n_algos] = *k;
    b->algos[b->n_algos++] = *algo;
  }
  pthread_mutex_unlock(&b->lock);
}

dlrec_status cuda_blas_create(cuda_blas **out, cudaStream_t st) {
  *out = NULL;
  cuda_blas *b = calloc(1, sizeof *b);
  if (!b) return dlrec_error(DLREC_ERR_NOMEM, "cuBLASLt: out of memory");
  if (pthread_mutex_init(&b->lock, NULL)) {
    free(b);
    return dlrec_error(DLREC_ERR_NOMEM, "cuBLASLt: cannot create a lock");
  }
  b->stream = st;
  b->lib = dlopen(SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef DLREC_CUDA_LIBDIR
  if (!b->lib) b->lib = dlopen(DLREC_CUDA_LIBDIR "/" SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
  if (!b->lib) {
    pthread_mutex_destroy(&b->lock);
    free(b);
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "the CUDA backend needs cuBLASLt (" SONAME
#ifdef DLREC_CUDA_LIBDIR
                       ", looked for on the library path and in " DLREC_CUDA_LIBDIR
#endif
                       "): %s", dlerror());
  }
#define LOAD(name)                                                                                                  \
  if (!(b->name = (__typeof__(name) *)dlsym(b->lib, #name))) {                                                      \
    cuda_blas_free(b);                                                                                              \
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "cuBLASLt (" SONAME ") has no %s", #name);                            \
  }
  CUDA_BLAS_FUNCS(LOAD)
#undef LOAD
  cublasStatus_t s = b->cublasLtCreate(&b->handle);
  if (s != CUBLAS_STATUS_SUCCESS) {
    b->handle = NULL;
    cuda_blas_free(b);
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "cuBLASLt: cublasLtCreate failed (status %d)", (int)s);
  }
  if (cudaMalloc(&b->workspace, WORKSPACE_BYTES) != cudaSuccess) {
    b->workspace = NULL;
    cuda_blas_free(b);
    return dlrec_error(DLREC_ERR_NOMEM, "cuBLASLt: no GPU memory for its %u MiB workspace", WORKSPACE_BYTES >> 20);
  }
  *out = b;
  return DLREC_OK;
}

/* The largest power of two (up to 256) that p's address is a multiple of:
 * cuBLASLt otherwise assumes 256-byte aligned operands, and an operand at
 * an offset into a buffer (the low-rank cross layer's second product) may
 * not be. */
static uint32_t alignment(const void *p) {
  const uintptr_t x = (uintptr_t)p;
  const uintptr_t a = x & (~x + 1);
  return !x || a > 256 ? 256 : (uint32_t)a;
}

dlrec_status cuda_blas_matmul(cuda_blas *b, float *D, const void *A, int lda, int ta, const void *B, int ldb, int tb,
                              int m, int n, int k, cuda_blas_type type, float beta, const float *bias, int relu) {
  const cudaDataType_t ab = type == CUDA_BLAS_BF16 ? CUDA_R_16BF : type == CUDA_BLAS_FP16 ? CUDA_R_16F : CUDA_R_32F;
  const cublasComputeType_t compute = type == CUDA_BLAS_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                      : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  const size_t ws_bytes = WORKSPACE_BYTES;
  const float alpha = 1.0f;
  const uint32_t align_a = alignment(A), align_b = alignment(B), align_d = alignment(D);
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t heur;
  algo_key key;
  memset(&key, 0, sizeof key); /* compared with memcmp (the struct has no padding: all 4-byte fields) */
  key = (algo_key){(int)type, ta, tb, m, n, k, lda, ldb, bias != NULL, relu != 0, align_a, align_b, align_d};
  const int kept = algo_find(b, &key, &heur.algo);
  int found = kept;
  const char *at = "cublasLtMatmulDescCreate";
  cublasStatus_t s = b->cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F);
#define STEP(call)                                                                                                  \
  if (s == CUBLAS_STATUS_SUCCESS) {                                                                                 \
    at = #call;                                                                                                     \
    s = b->call;                                                                                                    \
  }
  STEP(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa))
  STEP(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob))
  STEP(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi))
  if (bias) STEP(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias))
  STEP(cublasLtMatrixLayoutCreate(&la, ab, ta ? k : m, ta ? m : k, lda))
  STEP(cublasLtMatrixLayoutCreate(&lb, ab, tb ? n : k, tb ? k : n, ldb))
  STEP(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m))
  if (!kept) { /* the heuristic's choice, for a shape not seen before */
    STEP(cublasLtMatmulPreferenceCreate(&pref))
    STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof ws_bytes))
    STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                              sizeof align_a))
    STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                              sizeof align_b))
    STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                              sizeof align_d))
    STEP(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                              sizeof align_d))
    STEP(cublasLtMatmulAlgoGetHeuristic(b->handle, op, la, lb, ld, ld, pref, 1, &heur, &found))
  }
  if (s == CUBLAS_STATUS_SUCCESS && found < 1) {
    at = "cublasLtMatmulAlgoGetHeuristic (no algorithm)";
    s = CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (s == CUBLAS_STATUS_SUCCESS && !kept) algo_keep(b, &key, &heur.algo);
  STEP(cublasLtMatmul(b->handle, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo, b->workspace, ws_bytes,
                      b->stream))
#undef STEP
  if (pref) b->cublasLtMatmulPreferenceDestroy(pref);
  if (ld) b->cublasLtMatrixLayoutDestroy(ld);
  if (lb) b->cublasLtMatrixLayoutDestroy(lb);
  if (la) b->cublasLtMatrixLayoutDestroy(la);
  if (op) b->cublasLtMatmulDescDestroy(op);
  if (s != CUBLAS_STATUS_SUCCESS)
    return dlrec_error(DLREC_ERR_INTERNAL, "cuBLASLt: %s: status %d (%s, m %d n %d k %d)", at, (int)s,
                       type == CUDA_BLAS_BF16   ? "bf16"
                       : type == CUDA_BLAS_TF32 ? "tf32"
                       : type == CUDA_BLAS_FP16 ? "fp16"
                                                : "fp32",
                       m, n, k);
  return DLREC_OK;
}
