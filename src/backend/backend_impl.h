/* What a backend implements (ggml-backend-impl.h's role): a table of ops
 * plus a context, and the one macro the models call them through.
 *
 * The argument convention, shared by every op so that a CUDA twin has the
 * same signature: the backend first, then the outputs, then the inputs, then
 * the sizes; shapes row-major as in nn/nn.h and embed/embed.h, whose
 * contracts (what accumulates, what is overwritten, what may alias, the
 * ranges of the sizes) every backend keeps. Pointers are the backend's
 * memory: host memory on the CPU, device memory on a GPU (alloc/upload/
 * download move data across). Every op returns DLREC_OK or an error with a
 * message (dlrec_last_error()) and touches nothing on a refused call.
 *
 * A backend is used by one calling thread at a time for training; the
 * scoring ops (packed_*, *_infer) may be called from several threads at
 * once, each with its own output buffers.
 */
#ifndef DLREC_BACKEND_IMPL_H
#define DLREC_BACKEND_IMPL_H

#include "backend/backend.h"
#include "embed/embed.h"
#include "backend/cpu/kernels.h"

/* The activation a linear layer fuses after its bias. */
typedef enum dlrec_act {
  DLREC_ACT_NONE = 0,
  DLREC_ACT_RELU = 1,
} dlrec_act;

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

  /* ---- moving rows (nn/nn.h: dlrec_copy_rows and the three after it) ---- */
  dlrec_status (*copy_rows)(dlrec_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld,
                            size_t rows, size_t width);
  dlrec_status (*fill_rows)(dlrec_backend *be, float *dst, size_t dst_ld, size_t rows, size_t width, float value);
  dlrec_status (*add)(dlrec_backend *be, float *y, const float *x, size_t n);
  /* nn/nn.h's gather_rows and scatter_add_rows: idx in host memory. */
  dlrec_status (*gather_rows)(dlrec_backend *be, float *dst, const float *src, size_t rows, const uint32_t *idx,
                              size_t n, size_t width);
  dlrec_status (*scatter_add_rows)(dlrec_backend *be, float *dst, size_t rows, const uint32_t *idx, const float *src,
                                   size_t n, size_t width);
  dlrec_status (*scale)(dlrec_backend *be, float *x, size_t n, float s);
  /* *finite (host memory) = whether all n values are finite; waits for them. */
  dlrec_status (*all_finite)(dlrec_backend *be, int *finite, const float *x, size_t n);
  dlrec_status (*sum_columns)(dlrec_backend *be, float *dst, const float *src, size_t B, size_t C);

  /* ---- dense layers (nn/nn.h) ---- */
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
   * pass, net_run.c) the caller promises that each buffer a backward
   * accumulates a weight gradient into (linear_backward's dweight, the cross
   * layers' dw, dv, du, ...) holds zeros until the first op of the window
   * that writes it. That op may then write its product instead of adding it
   * (a GEMM that does not read its output first); a later op on the same
   * memory adds, as always. Returns 1 where the backend does so; NULL
   * entry: nothing. */
  int (*fresh_gradients)(dlrec_backend *be, int on);
  /* out (B, OUT) = act(in (B, IN) · weightᵀ + bias), in the backend's precision. */
  dlrec_status (*linear_forward)(dlrec_backend *be, float *out, const float *in, const float *weight,
                                 const float *bias, int B, int IN, int OUT, dlrec_act act);
  dlrec_status (*linear_backward)(dlrec_backend *be, float *din, float *dweight, float *dbias, const float *dout,
                                  const float *in, const float *weight, int B, int IN, int OUT);
  /* The backward of linear_forward with DLREC_ACT_RELU, given dout and the
   * forward's out (the ReLU's mask): linear_backward's contract on d = dout
   * where out > 0, else 0. dout is the op's scratch: unspecified afterwards.
   * The same bits as relu_backward(dout, dout, out) then linear_backward,
   * in fewer passes: a 16-bit backend masks, converts and sums the bias
   * columns in one. */
  dlrec_status (*linear_relu_backward)(dlrec_backend *be, float *din, float *dweight, float *dbias, float *dout,
                                       const float *out, const float *in, const float *weight, int B, int IN,
                                       int OUT);
  /* out[i] = max(in[i], 0): the ReLU a layer cannot fuse into linear_forward
   * (after batch normalization); out == in is allowed. */
  dlrec_status (*relu_forward)(dlrec_backend *be, float *out, const float *in, size_t n);
  dlrec_status (*relu_backward)(dlrec_backend *be, float *din, const float *dout, const float *out, size_t n);
  dlrec_status (*sigmoid)(dlrec_backend *be, float *out, const float *in, size_t n);

  dlrec_status (*dot_forward)(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int F, int D);
  dlrec_status (*dot_backward)(dlrec_backend *be, float *dx, float *demb, const float *dout, const float *x,
                               const float *emb, int B, int F, int D);
  dlrec_status (*concat_forward)(dlrec_backend *be, float *out, const float *x, const float *emb, int B, int DX,
                                 int F, int D);
  dlrec_status (*concat_backward)(dlrec_backend *be, float *dx, float *demb, const float *dout, int B, int DX,
                                  int F, int D);

  dlrec_status (*cross_forward)(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                const float *w, const float *bias, int B, int d);
  dlrec_status (*cross_backward)(dlrec_backend *be, float *dx0, float *dxl, float *dw, float *dbias,
                                 const float *dout, const float *x0, const float *xl, const float *act,
                                 const float *w, float *ws, int B, int d);
  dlrec_status (*cross_lowrank_forward)(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                        const float *v, const float *u, const float *bias, int B, int d, int r);
  dlrec_status (*cross_lowrank_backward)(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *du,
                                         float *dbias, const float *dout, const float *x0, const float *xl,
                                         const float *act, const float *v, const float *u, float *ws, int B, int d,
                                         int r);
  dlrec_status (*cross_mix_forward)(dlrec_backend *be, float *out, float *act, const float *x0, const float *xl,
                                    const float *v, const float *c, const float *u, const float *gate,
                                    const float *bias, int B, int d, int r, int K);
  dlrec_status (*cross_mix_backward)(dlrec_backend *be, float *dx0, float *dxl, float *dv, float *dc, float *du,
                                     float *dgate, float *dbias, const float *dout, const float *x0, const float *xl,
                                     const float *act, const float *v, const float *c, const float *u,
                                     const float *gate, float *ws, int B, int d, int r, int K);

  dlrec_status (*fm_forward)(dlrec_backend *be, float *out, const float *emb, int B, int F, int D);
  dlrec_status (*fm_backward)(dlrec_backend *be, float *demb, const float *dout, const float *emb, int B, int F,
                              int D);
  dlrec_status (*wide_forward)(dlrec_backend *be, float *out, const float *w, const float *bias, int B, int F);
  dlrec_status (*wide_backward)(dlrec_backend *be, float *dw, float *dbias, const float *dout, int B, int F);

  dlrec_status (*dropout_forward)(dlrec_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed,
                                  uint64_t step, int train);
  dlrec_status (*dropout_backward)(dlrec_backend *be, float *din, const float *dout, size_t n, float p,
                                   uint64_t seed, uint64_t step);
  dlrec_status (*batchnorm_train_forward)(dlrec_backend *be, float *out, float *saved, const float *in,
                                          const float *gamma, const float *beta, float *running_mean,
                                          float *running_var, float momentum, float eps, int B, int C);
  dlrec_status (*batchnorm_backward)(dlrec_backend *be, float *din, float *dgamma, float *dbeta, const float *dout,
                                     const float *in, const float *gamma, const float *saved, int B, int C);
  /* Batch normalization over the ways of a split step (nn/nn.h's
   * dlrec_batchnorm_stats and the three after it). */
  dlrec_status (*batchnorm_stats)(dlrec_backend *be, double *out, const float *in, const double *sum, double N, int B,
                                  int C);
  dlrec_status (*batchnorm_normalize)(dlrec_backend *be, float *out, float *saved, const float *in, const double *sum,
                                      const double *sqdev, double N, const float *gamma, const float *beta,
                                      float *running_mean, float *running_var, float momentum, float eps, int B, int C);
  dlrec_status (*batchnorm_backward_stats)(dlrec_backend *be, double *sg, double *sgx, const float *dout,
                                           const float *in, const float *saved, int B, int C);
  dlrec_status (*batchnorm_backward_apply)(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                           const float *dout, const float *in, const float *gamma, const float *saved,
                                           const double *sg_way, const double *sgx_way, const double *sg,
                                           const double *sgx, double N, int B, int C);
  dlrec_status (*batchnorm_infer)(dlrec_backend *be, float *out, const float *in, const float *gamma,
                                  const float *beta, const float *running_mean, const float *running_var, float eps,
                                  int B, int C);
  dlrec_status (*batchnorm_infer_backward)(dlrec_backend *be, float *din, float *dgamma, float *dbeta,
                                           const float *dout, const float *in, const float *gamma,
                                           const float *running_mean, const float *running_var, float eps, int B,
                                           int C);

  /* ---- loss and the dense optimizer ---- */
  dlrec_status (*bce_forward)(dlrec_backend *be, double *loss, const float *logits, const float *labels, int B);
  dlrec_status (*bce_backward)(dlrec_backend *be, float *dlogits, const float *logits, const float *labels, int B);
  dlrec_status (*optim_step)(dlrec_backend *be, const dlrec_optim_config *c, float *param, const float *grad,
                             float *state, size_t n, uint64_t step);

  /* ---- embeddings (embed/embed.h) ---- */
  dlrec_status (*bag_forward)(dlrec_backend *be, float *out, const dlrec_table *t, const dlrec_bag_batch *bags,
                              dlrec_bag_mode mode);
  dlrec_status (*bag_backward_update)(dlrec_backend *be, dlrec_table *t, dlrec_sparse_optim *o,
                                      const dlrec_bag_batch *bags, dlrec_bag_mode mode, const float *d_out,
                                      void *scratch, size_t scratch_bytes);

  /* ---- batch-invariant scoring (nn/nn.h's packed layers) ---- */
  dlrec_status (*packed_create)(dlrec_backend *be, dlrec_packed_linear **p, const float *weight, const float *bias,
                                int IN, int OUT);
  void (*packed_free)(dlrec_backend *be, dlrec_packed_linear *p);
  dlrec_status (*packed_forward)(dlrec_backend *be, float *out, const dlrec_packed_linear *p, const float *in, int B,
                                 dlrec_act act);
  dlrec_status (*cross_infer)(dlrec_backend *be, float *out, const float *x0, const float *xl,
                              const dlrec_packed_linear *w, int B, int d);
  dlrec_status (*cross_lowrank_infer)(dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl,
                                      const dlrec_packed_linear *v, const dlrec_packed_linear *u, int B, int d,
                                      int r);
  dlrec_status (*cross_mix_infer)(dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl,
                                  const dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c,
                                  const dlrec_packed_linear *const *u, const dlrec_packed_linear *gate, int B, int d,
                                  int r, int K);
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
 * one-thread LANE of the backend (net_run.c). The CPU backend splits in as
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
