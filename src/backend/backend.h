/* Compute backends: where a network's ops run, on how many threads, in
 * which precision.
 *
 * A backend is an interface of ops plus a context (ggml-backend's design):
 * the models call ops (linear forward and backward with fused bias and
 * activation, the interactions, the cross layers, FM, the loss, the
 * embedding bag forward, the fused sparse backward + update, the dense
 * optimizer step) on a backend, and the backend owns its memory, its threads
 * and its precision. Nothing of that is process-wide state: two backends
 * with different thread counts or precisions may live in one process.
 *
 * The ops themselves and the interface a backend implements are internal
 * (src/backend/backend.h); a host program only creates a backend, hands it
 * to a network (dlrec_net_set_backend) and asks what it resolved to.
 *
 * Backends of a build: "cpu" always (fp32 GEMMs on oneDNN where the CPU has
 * AVX-512, else OpenBLAS sgemm; oneDNN for bf16 ones; OpenMP threads);
 * "cuda" in a build with the CUDA toolkit (CMake found nvcc; a build
 * without it holds no CUDA symbol), created on a
 * machine with a GPU, where a network keeps its state in the GPU's memory
 * (model/model.h: dlrec_net_sync_host). Not listed: "cpu-mirror", the CPU
 * run as a device, for tests (src/backend/backend_impl.h).
 */
#ifndef DLREC_BACKEND_H
#define DLREC_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The precision of the dense layers' GEMMs. Master weights, gradients,
 * optimizer state and every accumulation stay fp32 in all of them.
 *   FP32  fp32 operands
 *   BF16  operands rounded to bfloat16 (round to nearest even), products
 *         accumulated in fp32: on the CPU's own instructions where it has
 *         AMX or AVX512-BF16, emulated (slower, same rounding of the
 *         operands) elsewhere
 *   AUTO  BF16 where the CPU has AMX or AVX512-BF16 (and on a GPU), FP32
 *         elsewhere
 *   TF32  a GPU's TensorFloat-32 tensor cores (fp32 operands read with 10
 *         mantissa bits, fp32 accumulation; cuBLASLt's FAST_TF32); FP32 on
 *         the CPU, which has no such unit, as PyTorch's allow_tf32 is
 *   FP16  operands rounded to IEEE half (round to nearest even; beyond
 *         65504 infinite, below 2^-14 subnormal), products accumulated in
 *         fp32: a GPU's fp16 tensor cores, emulated on the CPU (slower, the
 *         same rounding). fp16's narrow range is why training in it scales
 *         the loss (training.loss_scale, dlrec_net_optim's loss_scale).
 * Scoring (predict, evaluation, the server) runs the batch-invariant fp32
 * kernel in every precision, so a row's score never depends on its batch. */
typedef enum dlrec_precision {
  DLREC_PRECISION_FP32 = 0,
  DLREC_PRECISION_BF16 = 1,
  DLREC_PRECISION_AUTO = 2,
  DLREC_PRECISION_TF32 = 3,
  DLREC_PRECISION_FP16 = 4,
} dlrec_precision;

/* "fp32", "bf16", "auto", "tf32", "fp16"; "?" for a value out of range. */
const char *dlrec_precision_name(dlrec_precision p);
/* The inverse of dlrec_precision_name; DLREC_ERR_INVALID (naming the
 * accepted values) for anything else. */
dlrec_status dlrec_precision_parse(const char *s, dlrec_precision *p);
/* The precision a backend named `backend` ("cpu", "cuda", ...) runs `p`
 * in on this machine, as dlrec_backend_precision reports it once created:
 * AUTO as BF16 on a GPU and on a CPU with AMX or AVX512-BF16, else FP32;
 * TF32 as FP32 on the CPU. Without creating the backend. */
dlrec_precision dlrec_precision_resolve(const char *backend, dlrec_precision p);

typedef struct dlrec_backend dlrec_backend;

typedef struct dlrec_backend_config {
  uint32_t threads;          /* compute threads; 0: every core the process may use */
  dlrec_precision precision; /* of the GEMMs (default FP32) */
  uint32_t device;           /* which of the backend's devices (a GPU's index); 0 on the CPU */
} dlrec_backend_config;

/* A device as training.device and --device name it: "cpu", "cuda" (GPU 0)
 * or "cuda:N". *backend gets the backend's name ("cpu" or "cuda", static
 * strings) and *index the device's. DLREC_ERR_INVALID, naming the accepted
 * forms, for anything else. */
dlrec_status dlrec_device_parse(const char *s, const char **backend, uint32_t *index);

/* dlrec_backend_create on a device string (dlrec_device_parse's; NULL:
 * "cpu"): the backend it names, on its device index, with c's threads and
 * precision (NULL: all cores, fp32). */
dlrec_status dlrec_backend_create_on(dlrec_backend **be, const char *device, const dlrec_backend_config *c);

/* The memory of a device (dlrec_device_parse's names): the machine's RAM
 * for "cpu" (MemTotal and MemAvailable of /proc/meminfo), the GPU's for
 * "cuda:N" (cudaMemGetInfo). DLREC_ERR_UNSUPPORTED, saying why, where it
 * cannot be read (no such GPU, a build without CUDA). */
dlrec_status dlrec_device_memory(const char *device, uint64_t *total, uint64_t *available);

/* One line on the devices backend `name` can see, for `dlrec version`:
 * for the CPU its cores and what runs its fp32 and bf16 GEMMs ("2 cores;
 * fp32 GEMMs (oneDNN); bf16 GEMMs (oneDNN, AVX512-BF16)", the CPU backend's
 * own descriptions); the GPUs for "cuda" ("cuda:0 NVIDIA H100 80GB HBM3,
 * 79.1 GiB") or why there is none ("no CUDA device visible: ..."). Never
 * fails: a name this build lacks says so. */
void dlrec_backend_devices(const char *name, char *buf, size_t size);

/* The backends compiled into this build, by index (0 is "cpu"); NULL past
 * the last. */
const char *dlrec_backend_name_at(size_t i);

/* Creates the backend called name ("cpu", ...) with config c (NULL: all
 * cores, fp32). DLREC_ERR_INVALID for a name this build lacks (the message
 * lists those it has) or a bad config; *be is NULL on failure. */
dlrec_status dlrec_backend_create(dlrec_backend **be, const char *name, const dlrec_backend_config *c);
void dlrec_backend_free(dlrec_backend *be); /* accepts NULL */

const char *dlrec_backend_name(const dlrec_backend *be);
uint32_t dlrec_backend_threads(const dlrec_backend *be);
/* The device it was created on: the N of "cuda:N"; 0 on the CPU. */
uint32_t dlrec_backend_device_index(const dlrec_backend *be);
/* The precision the GEMMs run in: AUTO resolved to FP32 or BF16, TF32 to
 * FP32 on the CPU. */
dlrec_precision dlrec_backend_precision(const dlrec_backend *be);
/* Whether BF16 runs on the machine's own bf16 instructions (1) or is
 * emulated (0). 0 in FP32. */
int dlrec_backend_bf16_native(const dlrec_backend *be);
/* 1 when the backend's memory is the host's (the CPU's); 0 for a GPU's,
 * where a network keeps copies (model/model.h's dlrec_net_sync_host). */
int dlrec_backend_host_memory(const dlrec_backend *be);
/* One line for logs: "cpu: 2 threads, bf16 GEMMs (oneDNN, AMX)" and the like. */
const char *dlrec_backend_describe(const dlrec_backend *be);

/* The process's default backend: "cpu" on every core in fp32, created on
 * first use and never freed. A network without a backend of its own runs
 * on it. */
dlrec_backend *dlrec_backend_default(void);

#ifdef __cplusplus
}
#endif
#endif
