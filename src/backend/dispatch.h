/* How the layers above a backend call it (ggml-backend-impl.h's role, made
 * public because the models call ops directly): the table of ops every
 * backend fills, the backend object, and the one macro the models call ops
 * through; with the mirrors of a table in a device's memory.
 *
 * The ops are declared once, in ops.def, with their contracts; the types
 * they take are ops.h's. Pointers are the backend's memory: host memory on
 * the CPU, device memory on a GPU (alloc/upload/download move data across).
 * Every op returns DLREC_OK or an error with a message (dlrec_last_error())
 * and touches nothing on a refused call.
 *
 * A backend is used by one calling thread at a time for training; the
 * scoring ops (packed_*, *_infer) may be called from several threads at
 * once, each with its own output buffers.
 *
 * What only a backend's own files see (how each backend is made) is
 * backend_impl.h's.
 */
#ifndef DLREC_BACKEND_DISPATCH_H
#define DLREC_BACKEND_DISPATCH_H

#include "backend/backend.h"
#include "backend/ops.h"
#include "backend/ops_table.h"

typedef struct dlrec_backend_ops {
  void (*free)(dlrec_backend *be); /* frees ctx, not be */

  /* ---- memory ---- */
  void *(*alloc)(dlrec_backend *be, size_t bytes); /* 64-byte aligned; NULL when out of memory */
  void (*release)(dlrec_backend *be, void *p);     /* accepts NULL */
  dlrec_status (*upload)(dlrec_backend *be, void *dst, const void *host_src, size_t bytes);
  dlrec_status (*download)(dlrec_backend *be, void *host_dst, const void *src, size_t bytes);
  dlrec_status (*synchronize)(dlrec_backend *be); /* waits for every op issued */
  /* Host memory that upload and download move fastest (a GPU's pinned,
   * page-locked memory), 64-byte aligned, for buffers that cross every
   * step; NULL entries: plain host memory will do (the CPU's backends). */
  void *(*alloc_host)(dlrec_backend *be, size_t bytes);
  void (*release_host)(dlrec_backend *be, void *p); /* accepts NULL */
  /* A copy back that does not wait: the bytes are in host_dst (memory from
   * alloc_host) once a fence recorded after it has been waited for, or
   * synchronize has returned. Fences (a GPU's events): fence_record marks
   * the point the backend's queue has reached, and fence_wait returns once
   * every op before the fence's last mark has run. NULL entries (the CPU's
   * backend): ops are done when they return, so download and nothing will
   * do. */
  dlrec_status (*download_async)(dlrec_backend *be, void *host_dst, const void *src, size_t bytes);
  void *(*fence_create)(dlrec_backend *be); /* NULL when out of memory */
  void (*fence_free)(dlrec_backend *be, void *f); /* accepts NULL */
  dlrec_status (*fence_record)(dlrec_backend *be, void *f);
  dlrec_status (*fence_wait)(dlrec_backend *be, void *f);

  /* Kept operands: a 16-bit GEMM converts its operands; between
   * keep_operands(be, 1) and keep_operands(be, 0) the backend keeps the
   * converted copies of what linear_forward (and the cross layers' forward)
   * read, the input and the weights, and the backward reads them instead of
   * converting again. The caller promises that nothing writes those inputs
   * and weights in between (a training pass: forwards, then backwards, then
   * the optimizer after keep_operands(be, 0)); a backward given another
   * buffer, or the same one at another size, converts as usual. Returns 1
   * when this backend keeps copies in its precision, 0 when it has nothing
   * to keep (fp32, emulated bf16); NULL entry: nothing kept. */
  int (*keep_operands)(dlrec_backend *be, int on);
  /* Fresh gradients: between fresh_gradients(be, 1) and (be, 0) (a training
   * pass, model/net_pass.c) the caller promises that each buffer a backward
   * accumulates a weight gradient into (linear_backward's dweight, the cross
   * layers' dw, dv, du, ...) holds zeros until the first op of the window
   * that writes it. That op may then write its product instead of adding it
   * (a GEMM that does not read its output first); a later op on the same
   * memory adds, as always. Returns 1 where the backend does so; NULL
   * entry: nothing. */
  int (*fresh_gradients)(dlrec_backend *be, int on);
  /* Frees a layer of packed_create; accepts NULL. */
  void (*packed_free)(dlrec_backend *be, dlrec_packed_linear *p);

  /* ---- the ops (ops.def): status (*name)(dlrec_backend *be, its arguments) ---- */
#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test) dlrec_status (*name)(dlrec_backend *be DLREC_OPS_PARAMS(args));
#include "backend/ops.def"
#undef DLREC_OP
#undef A
} dlrec_backend_ops;

struct dlrec_backend {
  const dlrec_backend_ops *ops;
  const char *name;
  uint32_t threads;          /* resolved: >= 1 */
  dlrec_precision precision; /* resolved: FP32 or BF16 */
  uint32_t device;           /* the config's: which GPU; 0 on the CPU */
  int bf16_native;
  /* 1: the backend's memory is host memory (alloc is malloc's); 0 (a
   * GPU's, cpu-mirror's): the host does not touch it, and a network keeps
   * copies of its state there (src/model/net_device.c). */
  int host_memory;
  char describe[128];
  void *ctx; /* the backend's own state */
};

/* Calls op NAME of backend BE: BE_OP(be, linear_forward, out, in, ...). */
#define BE_OP(be, name, ...) ((be)->ops->name((be), __VA_ARGS__))

/* How many ways a training step may split its batch across this backend:
 * row ranges that run side by side, each through the whole network on a
 * one-thread LANE of the backend (model/net_pass.c). The CPU backend splits in as
 * many ways as it has threads; a backend whose ops do not run on the
 * calling thread (a GPU's) does not split (1). */
uint32_t backend_split_ways(const dlrec_backend *be);
/* A lane of be: a new backend of the same kind and precision on one thread,
 * which the caller frees. */
dlrec_status backend_lane_create(const dlrec_backend *be, dlrec_backend **lane);

/* Mirrors of a table and its sparse optimizer in be's memory (mirror.c),
 * for a backend whose memory is not the host's: the bag ops take the
 * mirrors; upload copies the host's rows into a mirror, download copies the rows (and the state, with the update count
 * that keys a 16-bit table's rounding) back into the host's. A mirror's
 * optimizer is made for the mirror table and frees before it. */
dlrec_status backend_table_mirror(dlrec_backend *be, const dlrec_table *host, dlrec_table **dev);
dlrec_status backend_table_upload(dlrec_backend *be, dlrec_table *dev, const dlrec_table *host);
dlrec_status backend_table_download(dlrec_backend *be, dlrec_table *host, const dlrec_table *dev);
void backend_table_mirror_free(dlrec_backend *be, dlrec_table *dev); /* accepts NULL */
dlrec_status backend_sparse_optim_mirror(dlrec_backend *be, dlrec_sparse_optim *host, const dlrec_table *dev_table,
                                         dlrec_sparse_optim **dev);
dlrec_status backend_sparse_optim_download(dlrec_backend *be, dlrec_sparse_optim *host, dlrec_sparse_optim *dev);
void backend_sparse_optim_mirror_free(dlrec_backend *be, dlrec_sparse_optim *dev); /* accepts NULL */
/* Mirrors of runs of the host's rows (a table that stays on the host, its
 * hot rows on the device): a run is the host's rows [host, host + count) at
 * the mirror's [dev, dev + count); a mirror of `rows` rows holds the runs
 * (the rest of it is not filled). The state's update count stays the
 * host's. */
typedef struct backend_rows {
  uint64_t host, dev, count;
} backend_rows;
dlrec_status backend_table_mirror_runs(dlrec_backend *be, const dlrec_table *host, const backend_rows *runs,
                                       uint32_t n_runs, uint64_t rows, dlrec_table **dev);
dlrec_status backend_table_copy_runs(dlrec_backend *be, dlrec_table *host, dlrec_table *dev, const backend_rows *runs,
                                     uint32_t n_runs, int to_device);
dlrec_status backend_sparse_optim_mirror_runs(dlrec_backend *be, dlrec_sparse_optim *host, const dlrec_table *dev_table,
                                              const backend_rows *runs, uint32_t n_runs, dlrec_sparse_optim **dev);
dlrec_status backend_sparse_optim_download_runs(dlrec_backend *be, dlrec_sparse_optim *host, dlrec_sparse_optim *dev,
                                                const backend_rows *runs, uint32_t n_runs);

#endif
