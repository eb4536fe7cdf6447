/* The CPU kernels: the reference implementation of every op of ops.def, in
 * the style of llm.c, `cpu_<op>(outputs, inputs, sizes)` with the op's own
 * arguments in the op's order, so that the CPU backend's thunks
 * (cpu/cpu.c) are generated from the table. An op whose products are GEMMs
 * (marked GEMM there) takes the backend's cpu_gemm first, which runs them
 * in the backend's precision; NULL runs them in fp32 on OpenBLAS's sgemm.
 * Each kernel's contract is its op's (ops.def); OpenMP loops split the
 * work, and the results do not depend on the thread count unless ops.def
 * says otherwise.
 *
 * Below the generated prototypes: the CPU kernels that are not ops, which
 * the backend's thunks and the hot-row path of a network on a GPU
 * (model/net_run.c) call directly.
 */
#ifndef DLREC_CPU_KERNELS_H
#define DLREC_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"
#include "backend/ops_table.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_gemm cpu_gemm;

/* ---- the ops' kernels: dlrec_status cpu_<op>([cpu_gemm *g, ] the op's arguments) ---- */

#define CPU_KERNEL_PARAMS_PLAIN(...) DLREC_OPS_DROP1(__VA_ARGS__)
#define CPU_KERNEL_PARAMS_GEMM(...) cpu_gemm *g __VA_ARGS__
#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test) dlrec_status cpu_##name(CPU_KERNEL_PARAMS_##cpu(DLREC_OPS_PARAMS(args)));
#include "backend/ops.def"
#undef DLREC_OP
#undef A
#undef CPU_KERNEL_PARAMS_PLAIN
#undef CPU_KERNEL_PARAMS_GEMM

/* ---- kernels that are not ops ------------------------------------------------ */

/* The linear layer on OpenBLAS's sgemm in fp32 (linear.c), which
 * cpu_linear_forward and cpu_linear_backward run when given no cpu_gemm:
 * out (B, OUT) = in (B, IN) · weightᵀ + bias, its ReLU fused in
 * (cpu_sgemm_linear_relu_forward); the backward's dweight and dbias
 * accumulate and din (NULL to skip) is overwritten, as the ops'. */
dlrec_status cpu_sgemm_linear_forward(float *out, const float *in, const float *weight, const float *bias, int B,
                                      int IN, int OUT);
dlrec_status cpu_sgemm_linear_relu_forward(float *out, const float *in, const float *weight, const float *bias, int B,
                                           int IN, int OUT);
dlrec_status cpu_sgemm_linear_backward(float *din, float *dweight, float *dbias, const float *dout, const float *in,
                                       const float *weight, int B, int IN, int OUT);

/* dbias (OUT) += the column sums of dout (B, OUT), each summed over b in
 * order, so the result does not depend on the thread count (the bias part of
 * the linear backward, for GEMMs that run elsewhere). */
void cpu_bias_backward(float *dbias, const float *dout, int B, int OUT);

/* dst's row idx[i] = src's row i (rows of width floats), for i < n, the idx
 * distinct, host memory, each < rows, checked before anything is touched:
 * the inverse of gather_rows, for the host's part of a batch whose hot rows
 * pooled on a device. */
dlrec_status cpu_scatter_rows(float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
                              size_t width);

/* bag_forward for some of the bags: list[i] = b * F + c names bag c of
 * sample b, which is pooled into out + i * D with the bits bag_forward
 * gives it; nothing else is written (n * D floats). For a pass that needs
 * few of a batch's bags, packed: those of a split batch's part that lives
 * in host memory, whose rows cross to a GPU. A list entry past the batch's
 * bags is refused; of the bags, only the listed ones are read, and a bad
 * one is refused with dlrec_bag_check's error for the batch. */
dlrec_status cpu_bag_forward_rows(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_pooling mode,
                                  const uint32_t *list, size_t n, float *out);

/* cpu_cross_backward as the gate's backward, the GEMMs on g, the bias pass
 * and the residual add one after another, which it runs unless g fuses them
 * (cpu_gemm_fuses_cross): what the fused one is tested against. */
dlrec_status cpu_cross_backward_composed(cpu_gemm *g, float *dx0, float *dxl, float *dw, float *dbias,
                                         const float *dout, const float *x0, const float *xl, const float *act,
                                         const float *w, float *ws, int B, int d);

/* Frees a layer of cpu_packed_create; NULL is allowed. */
void cpu_packed_free(dlrec_packed_linear *p);

#ifdef __cplusplus
}
#endif
#endif
