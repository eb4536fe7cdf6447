/* What makes each backend (private to backend/): their init functions,
 * which backend.c's registry calls. The ops table a backend fills, and how
 * callers call it, are dispatch.h's.
 */
#ifndef DLREC_BACKEND_IMPL_H
#define DLREC_BACKEND_IMPL_H

#include "backend/dispatch.h"

/* The CPU backend (cpu.c): fills be (ops, name, threads, precision) from c. */
dlrec_status dlrec_backend_cpu_init(dlrec_backend *be, const dlrec_backend_config *c);
/* "cpu-mirror": the CPU backend saying its memory is not the host's, so
 * that a network on it runs the way it runs on a GPU (its parameters,
 * table, optimizer state and workspaces in the backend's memory, batches
 * copied over, results copied back) with the CPU's ops: the device path's
 * test where no GPU is (tests/test_models.c). Created by name; not listed. */
dlrec_status dlrec_backend_cpu_mirror_init(dlrec_backend *be, const dlrec_backend_config *c);

#ifdef DLREC_HAVE_CUDA
/* The CUDA backend (cuda.c) on GPU c->device; some ops are NULL (cuda.c
 * says which). */
dlrec_status dlrec_backend_cuda_init(dlrec_backend *be, const dlrec_backend_config *c);
/* dlrec_backend_devices for "cuda". */
void backend_cuda_devices(char *buf, size_t size);
/* dlrec_device_memory for GPU index. */
dlrec_status backend_cuda_memory(uint32_t index, uint64_t *total, uint64_t *available);
#endif

#endif
