/* The CPU backend's linear layers (cpu_gemm.h). FP32 only so far: BF16 is
 * refused at creation until its GEMMs exist. */
#include "backend/cpu_gemm.h"

#include <stdlib.h>

struct cpu_gemm {
  dlrec_precision precision;
};

int cpu_gemm_has_bf16(void) { return 0; }

dlrec_status cpu_gemm_create(cpu_gemm **out, dlrec_precision precision, int *native) {
  *out = NULL;
  *native = 0;
  if (precision != DLREC_PRECISION_FP32)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "bf16 GEMMs are not built yet: use precision fp32");
  cpu_gemm *g = calloc(1, sizeof *g);
  if (!g) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  g->precision = precision;
  *out = g;
  return DLREC_OK;
}

void cpu_gemm_free(cpu_gemm *g) { free(g); }

const char *cpu_gemm_describe(const cpu_gemm *g) {
  (void)g;
  return "fp32 GEMMs (OpenBLAS sgemm)";
}

dlrec_status cpu_gemm_linear_forward(cpu_gemm *g, float *out, const float *in, const float *weight,
                                     const float *bias, int B, int IN, int OUT, dlrec_act act) {
  (void)g;
  return act == DLREC_ACT_RELU ? dlrec_linear_relu_forward(out, in, weight, bias, B, IN, OUT)
                               : dlrec_linear_forward(out, in, weight, bias, B, IN, OUT);
}

dlrec_status cpu_gemm_linear_backward(cpu_gemm *g, float *din, float *dweight, float *dbias, const float *dout,
                                      const float *in, const float *weight, int B, int IN, int OUT) {
  (void)g;
  return dlrec_linear_backward(din, dweight, dbias, dout, in, weight, B, IN, OUT);
}
