/* oneDNN matmul for the CPU backend's GEMMs: one call shape,
 *   out (M, N) = act(A (M, K) · B (K, N) + bias) [+ out before the call],
 * with A and B in bf16 (uint16_t, the top half of an fp32) or fp32, and out,
 * bias and the accumulation in fp32. A primitive is created on a shape's
 * first call (M, N, K, transpositions, bias or not, act, accumulate) and
 * cached; later calls only point its memory at the caller's buffers.
 *
 * In a build without oneDNN (DLREC_HAVE_DNNL undefined) cpu_dnnl_create
 * refuses with DLREC_ERR_UNSUPPORTED and nothing else is reachable.
 */
#ifndef DLREC_CPU_DNNL_H
#define DLREC_CPU_DNNL_H

#include "backend/dispatch.h"

typedef struct cpu_dnnl cpu_dnnl;

/* Whether this build links oneDNN. */
int cpu_dnnl_available(void);

/* bf16: 1 for bf16 A and B, 0 for fp32. */
dlrec_status cpu_dnnl_create(cpu_dnnl **d, int bf16);
void cpu_dnnl_free(cpu_dnnl *d); /* accepts NULL */

/* A is (M, K) row-major, or its transpose stored (K, M) row-major when
 * a_trans; B is (K, N) row-major, or stored (N, K) when b_trans. bias (N) or
 * NULL. accumulate: out += the product (bias and act must then be off).
 * DLREC_ERR_UNSUPPORTED, naming the shape and oneDNN's status, when oneDNN
 * has no implementation for it; out is untouched then. */
dlrec_status cpu_dnnl_matmul(cpu_dnnl *d, float *out, const void *a, int a_trans, const void *b, int b_trans,
                             const float *bias, int M, int N, int K, dlrec_act act, int accumulate);

/* oneDNN's implementation of the last primitive created ("brg:avx512_core_amx",
 * "ref:any", ...); "" before the first. Valid until the next call on d. */
const char *cpu_dnnl_impl(const cpu_dnnl *d);

#endif
