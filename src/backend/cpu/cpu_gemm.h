/* The CPU backend's linear layers: their GEMMs in the backend's precision.
 * FP32 runs oneDNN's fp32 matmul where the CPU has AVX-512, else OpenBLAS
 * sgemm (cpu_sgemm_linear_*, linear.c); DLREC_FP32_GEMM=openblas or onednn
 * in the environment decides instead (cpu_gemm.c says why). BF16 rounds the
 * operands to bfloat16 and accumulates in fp32, on oneDNN where the CPU has
 * AMX-BF16 or AVX512-BF16 and emulated on the fp32 GEMMs elsewhere (cpu_gemm.c says
 * why the two agree). Setting DLREC_BF16_FORCE_ONEDNN=1 runs BF16 on oneDNN
 * even without those instructions (slow reference kernels; for testing that
 * path on any machine). Created once per backend;
 * whatever it caches per shape (primitives, scratch) is made on a shape's
 * first call and reused, never per batch. */
#ifndef DLREC_CPU_GEMM_H
#define DLREC_CPU_GEMM_H

#include "backend/backend.h"
#include "backend/cpu/kernels.h"

typedef struct cpu_gemm cpu_gemm;

/* precision is FP32 or BF16 (resolved); *native says whether BF16 runs on
 * the CPU's own instructions (0 in FP32, or when emulated). */
dlrec_status cpu_gemm_create(cpu_gemm **g, dlrec_precision precision, int *native);
void cpu_gemm_free(cpu_gemm *g); /* accepts NULL */
/* Whether this CPU has AMX-BF16 or AVX512-BF16 (what AUTO picks BF16 for). */
int cpu_gemm_has_bf16(void);
/* Whether this CPU has AVX512F (where fp32 GEMMs go to oneDNN by default). */
int cpu_gemm_has_avx512(void);
/* x rounded to the nearest bf16 (ties to even; NaN stays NaN, overflow goes
 * to infinity), as an fp32: the rounding BF16 applies to every operand. */
float cpu_gemm_round_bf16(float x);
/* dst[i] = src[i] rounded to fp16 (to nearest even), kept as fp32: with
 * f16c on the CPU's F16C instructions (cpu_gemm_has_f16c says whether it
 * has them), else in plain C (dtype.h); the same values either way, a NaN's
 * payload aside. */
void cpu_gemm_round_fp16(float *dst, const float *src, size_t n, int f16c);
int cpu_gemm_has_f16c(void);
/* What runs the GEMMs, for the backend's description: "fp32 GEMMs (OpenBLAS
 * sgemm)", "bf16 GEMMs (oneDNN, AMX)", "bf16 GEMMs (emulated: ...)". */
const char *cpu_gemm_describe(const cpu_gemm *g);

/* The linear layer's ops (linear_forward, linear_backward,
 * linear_relu_backward) in g's precision are the kernels cpu_linear_*
 * (cpu/kernels.h): on oneDNN's bf16 path, linear_relu_backward masks,
 * converts and sums the bias in one pass; elsewhere it runs the ReLU's
 * backward in place in dout, then the linear backward. */

/* The backend's keep_operands (dispatch.h): on oneDNN's bf16 path,
 * starts (on) or ends (off) keeping the bf16 copies a forward converts for
 * the backward to read, and returns 1; elsewhere (sgemm, emulated) keeps
 * nothing and returns 0. */
int cpu_gemm_keep(cpu_gemm *g, int on);

/* The backend's fresh_gradients (dispatch.h): while on, a dW GEMM on
 * oneDNN (bf16, or fp32 where oneDNN runs it) writes the first product into
 * memory no GEMM wrote since it was turned on, and adds the later ones.
 * Returns 1 there; 0 on OpenBLAS's sgemm (whose beta = 1 costs nothing
 * extra: it reads C anyway). */
int cpu_gemm_fresh(cpu_gemm *g, int on);

/* Whether g runs cpu_cross_backward fused (cpu_gemm_cross_backward): on
 * oneDNN's bf16 path, where the gate's backward writes the bf16 operand and
 * the bias gradient in one pass (and the input and weights are the kept
 * copies, while keeping). Elsewhere the backward is cross.c's, over g's GEMMs. */
int cpu_gemm_fuses_cross(const cpu_gemm *g);
/* cpu_cross_backward's contract (ws: dlrec_cross_ws_floats(B, d, 0) floats)
 * and its bits, fused; only where cpu_gemm_fuses_cross(g). */
dlrec_status cpu_gemm_cross_backward(cpu_gemm *g, float *dx0, float *dxl, float *dw, float *dbias, const float *dout,
                                     const float *x0, const float *xl, const float *u, const float *w, float *ws,
                                     int B, int d);

#endif
