/* The CPU backend: the ops of ops.def over their CPU kernels (cpu_<op>,
 * cpu/kernels.h), on the backend's own thread count and, for the GEMMs of
 * the linear and cross layers, in its precision (cpu_gemm.c). Each op's
 * thunk is generated from the table.
 *
 * Threads: the kernels are OpenMP loops and OpenBLAS (its OpenMP build)
 * sizes its team from omp_get_max_threads() of the calling thread, so each
 * op first sets the calling thread's team size to the backend's. That is a
 * per-thread setting (OpenMP's nthreads-var), not process-wide state: a
 * server's scoring threads and a trainer may run backends of different
 * sizes side by side.
 */
#include "backend/backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/ops_table.h"

/* Sets the calling thread's OpenMP team to the backend's size. */
static inline void enter(dlrec_backend *be) {
  if (omp_get_max_threads() != (int)be->threads) omp_set_num_threads((int)be->threads);
}

static cpu_gemm *gemm_of(dlrec_backend *be) { return be->ctx; }

static void cpu_free(dlrec_backend *be) { cpu_gemm_free(gemm_of(be)); }

/* ---- memory: host memory ---- */

static void *cpu_alloc(dlrec_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) ? NULL : p;
}

static void cpu_release(dlrec_backend *be, void *p) {
  (void)be;
  free(p);
}

static dlrec_status cpu_copy(dlrec_backend *be, void *dst, const void *src, size_t bytes) {
  (void)be;
  if (bytes && (!dst || !src)) return dlrec_error(DLREC_ERR_INVALID, "copy of %zu bytes with a NULL buffer", bytes);
  if (bytes) memmove(dst, src, bytes);
  return DLREC_OK;
}

static dlrec_status cpu_synchronize(dlrec_backend *be) {
  (void)be; /* every CPU op has finished when it returns */
  return DLREC_OK;
}

static int cpu_keep_operands(dlrec_backend *be, int on) { return cpu_gemm_keep(gemm_of(be), on); }

static int cpu_fresh_gradients(dlrec_backend *be, int on) { return cpu_gemm_fresh(gemm_of(be), on); }

static void cpu_packed_free_thunk(dlrec_backend *be, dlrec_packed_linear *p) {
  (void)be;
  cpu_packed_free(p);
}

/* ---- the ops (ops.def): each sets the team's size, then runs its kernel ---- */

/* The kernel's arguments: the op's, after the backend's GEMMs where the
 * op's products are GEMMs (ops.def's GEMM). */
#define CPU_ARGS_PLAIN(...) DLREC_OPS_DROP1(__VA_ARGS__)
#define CPU_ARGS_GEMM(...) gemm_of(be) __VA_ARGS__
#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static dlrec_status thunk_##name(dlrec_backend *be DLREC_OPS_PARAMS(args)) {                                      \
    enter(be);                                                                                                      \
    return cpu_##name(CPU_ARGS_##cpu(DLREC_OPS_NAMES(args)));                                                        \
  }
#include "backend/ops.def"
#undef DLREC_OP

static const dlrec_backend_ops cpu_ops = {
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .synchronize = cpu_synchronize,
    .keep_operands = cpu_keep_operands,
    .fresh_gradients = cpu_fresh_gradients,
    .packed_free = cpu_packed_free_thunk,
#define DLREC_OP(name, cpu, args, test) .name = thunk_##name,
#include "backend/ops.def"
#undef DLREC_OP
#undef A
};

dlrec_status dlrec_backend_cpu_init(dlrec_backend *be, const dlrec_backend_config *c) {
  if (c->threads > 4096) return dlrec_error(DLREC_ERR_INVALID, "backend threads %u out of range [0, 4096]", c->threads);
  const dlrec_precision p = dlrec_precision_resolve("cpu", c->precision);
  cpu_gemm *g = NULL;
  int native = 0;
  dlrec_status s = cpu_gemm_create(&g, p, &native);
  if (s != DLREC_OK) return s;
  be->ops = &cpu_ops;
  be->name = "cpu";
  be->threads = c->threads ? c->threads : (uint32_t)omp_get_num_procs();
  be->precision = p;
  be->bf16_native = native;
  be->host_memory = 1;
  be->ctx = g;
  snprintf(be->describe, sizeof be->describe, "cpu: %u thread%s, %s", be->threads, be->threads == 1 ? "" : "s",
           cpu_gemm_describe(g));
  return DLREC_OK;
}
