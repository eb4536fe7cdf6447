/* cuBLASLt for the CUDA backend's GEMMs, loaded at run time.
 *
 * build/dlrec links no CUDA library (it must start where there is none),
 * so cuBLASLt is opened with dlopen when a CUDA backend is created: the
 * soname of the toolkit it was built with, then that toolkit's library
 * folder. Without it the backend is refused, saying what was looked for.
 */
#ifndef DLREC_CUDA_BLAS_H
#define DLREC_CUDA_BLAS_H

#include <cuda_runtime_api.h>

#include "core/status.h"

typedef struct cuda_blas cuda_blas;

/* Opens cuBLASLt and makes a handle and a workspace for stream st. */
dlrec_status cuda_blas_create(cuda_blas **out, cudaStream_t st);
void cuda_blas_free(cuda_blas *b); /* accepts NULL */

/* What the operands are and how they are multiplied: fp32 computed in
 * fp32; bfloat16 operands; fp32 operands on the TF32 tensor cores; IEEE
 * half operands. The accumulation is fp32 in all four. */
typedef enum cuda_blas_type { CUDA_BLAS_FP32 = 0, CUDA_BLAS_BF16 = 1, CUDA_BLAS_TF32 = 2, CUDA_BLAS_FP16 = 3 } cuda_blas_type;

/* Column-major D (m, n; leading dimension m) = op(A) · op(B) + beta · D, A
 * (lda) and B (ldb) transposed where ta, tb; with bias (m, or NULL) added
 * to each column and the ReLU after it where relu. Operands as type says;
 * D fp32. */
dlrec_status cuda_blas_matmul(cuda_blas *b, float *D, const void *A, int lda, int ta, const void *B, int ldb, int tb,
                              int m, int n, int k, cuda_blas_type type, float beta, const float *bias, int relu);

#endif
