/* "cpu-mirror": the CPU backend saying its memory is not the host's
 * (backend_impl.h), so that a network on it takes the path it takes on a
 * GPU, with the CPU's ops. Its memory is made inaccessible to the host
 * between ops: each op opens it, runs the CPU backend's op, and closes it,
 * so host code that reads or writes a buffer of the backend's memory (which
 * on a GPU would be a device pointer) faults here at once, on any machine.
 * The other way round, an op given a buffer outside that memory (a host
 * pointer, which a GPU's kernel could not read) is refused, saying which.
 *
 * The memory is one reservation (PROT_NONE, no swap reserved), handed out
 * by pages from its start and never reused: released allocations give their
 * pages back to the kernel (MADV_DONTNEED) but keep their addresses, which
 * a test's lifetime cannot run out of. Opening and closing protect the used
 * range in one call each. For one thread at a time (tests).
 */
#include "backend/backend_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define RESERVE_BYTES ((size_t)64 << 30)
#define PAGE ((size_t)4096)

typedef struct mirror {
  dlrec_backend inner; /* the CPU backend whose ops run */
  char *base;
  size_t used; /* bytes handed out from base, whole pages */
  /* Each live allocation's size, to give its pages back on release. */
  struct alloc_entry {
    char *p;
    size_t bytes;
  } *live;
  size_t n_live, cap_live;
} mirror;

static mirror *mir(dlrec_backend *be) { return be->ctx; }

static void open_all(mirror *m) {
  if (m->used) mprotect(m->base, m->used, PROT_READ | PROT_WRITE);
}
static void close_all(mirror *m) {
  if (m->used) mprotect(m->base, m->used, PROT_NONE);
}

/* The op's pointers into the backend's memory (NULLs pass: whether one
 * may be NULL is the op's to say), or why not: on a GPU a host pointer
 * given to an op is the kernel's illegal address. */
static dlrec_status in_memory(const mirror *m, const char *op, const void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] && ((const char *)p[i] < m->base || (const char *)p[i] >= m->base + m->used))
      return dlrec_error(DLREC_ERR_INVALID, "cpu-mirror: %s given memory that is not the backend's (its pointer "
                         "argument %zu): on a GPU, a host pointer", op, i + 1);
  return DLREC_OK;
}

#define UNPAREN(...) __VA_ARGS__
#define WRAP(name, params, args, ptrs)                                                                              \
  static dlrec_status m_##name params {                                                                            \
    mirror *m = mir(be);                                                                                            \
    const void *const p_[] = {UNPAREN ptrs};                                                                        \
    dlrec_status st_ = in_memory(m, #name, p_, sizeof p_ / sizeof p_[0]);                                           \
    if (st_ != DLREC_OK) return st_;                                                                                \
    open_all(m);                                                                                                    \
    st_ = m->inner.ops->name args;                                                                                  \
    close_all(m);                                                                                                   \
    return st_;                                                                                                     \
  }
#define WRAP_VOID(name, params, args)                                                                               \
  static void m_##name params {                                                                                    \
    mirror *m = mir(be);                                                                                            \
    open_all(m);                                                                                                    \
    m->inner.ops->name args;                                                                                        \
    close_all(m);                                                                                                   \
  }

/* Keeping touches no buffer of the backend's memory: the kept copies are
 * the inner backend's own. */
static int m_keep_operands(dlrec_backend *be, int on) {
  mirror *m = mir(be);
  return m->inner.ops->keep_operands(&m->inner, on);
}

/* Nor does knowing the gradients fresh. */
static int m_fresh_gradients(dlrec_backend *be, int on) {
  mirror *m = mir(be);
  return m->inner.ops->fresh_gradients(&m->inner, on);
}

WRAP(copy_rows, (dlrec_backend *be, float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t
     width), (&m->inner, dst, dst_ld, src, src_ld, rows, width), (dst, src))
WRAP(fill_rows, (dlrec_backend *be, float *dst, size_t dst_ld, size_t rows, size_t width, float value), (&m->inner,
     dst, dst_ld, rows, width, value), (dst))
WRAP(add, (dlrec_backend *be, float *y, const float *x, size_t n), (&m->inner, y, x, n), (y, x))
WRAP(gather_rows, (dlrec_backend *be, float *dst, const float *src, size_t rows, const uint32_t *idx, size_t n, size_t
     width), (&m->inner, dst, src, rows, idx, n, width), (dst, src))
WRAP(scatter_add_rows, (dlrec_backend *be, float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
     size_t width), (&m->inner, dst, rows, idx, src, n, width), (dst, src))
WRAP(scale, (dlrec_backend *be, float *x, size_t n, float s), (&m->inner, x, n, s), (x))
WRAP(all_finite, (dlrec_backend *be, int *finite, const float *x, size_t n), (&m->inner, finite, x, n), (x))
WRAP(sum_columns, (dlrec_backend *be, float *dst, const float *src, size_t B, size_t C), (&m->inner, dst, src, B, C),
     (dst, src))
WRAP(linear_forward, (dlrec_backend *be, float *out, const float *in, const float *weight, const float *bias, int B,
     int IN, int OUT, dlrec_act act), (&m->inner, out, in, weight, bias, B, IN, OUT, act), (out, in, weight, bias))
WRAP(linear_backward, (dlrec_backend *be, float *din, float *dweight, float *dbias, const float *dout, const float
     *in, const float *weight, int B, int IN, int OUT), (&m->inner, din, dweight, dbias, dout, in, weight, B, IN,
     OUT), (din, dweight, dbias, dout, in, weight))
WRAP(linear_relu_backward, (dlrec_backend *be, float *din, float *dweight, float *dbias, float *dout, const float
     *out, const float *in, const float *weight, int B, int IN, int OUT), (&m->inner, din, dweight, dbias, dout, out,
     in, weight, B, IN, OUT), (din, dweight, dbias, dout, out, in, weight))
WRAP(relu_forward, (dlrec_backend *be, float *out, const float *in, size_t n), (&m->inner, out, in, n), (out, in))
WRAP(relu_backward, (dlrec_backend *be, float *din, const float *dout, const float *out, size_t n), (&m->inner, din,
     dout, out, n), (din, dout, out))
WRAP(sigmoid, (dlrec_backend *be, float *out, const float *in, size_t n), (&m->inner, out, in, n), (out, in))
WRAP(dot_forward, (dlrec_backend *be, float *out, const float *x, const float *emb, int B, int F, int D), (&m->inner,
     out, x, emb, B, F, D), (out, x, emb))
WRAP(dot_backward, (dlrec_backend *be, float *dx, float *demb, const float *dout, const float *x, const float *emb,
     int B, int F, int D), (&m->inner, dx, demb, dout, x, emb, B, F, D), (dx, demb, dout, x, emb))
WRAP(concat_forward, (dlrec_backend *be, float *out, const float *x, const float *emb, int B, int DX, int F, int D),
     (&m->inner, out, x, emb, B, DX, F, D), (out, x, emb))
WRAP(concat_backward, (dlrec_backend *be, float *dx, float *demb, const float *dout, int B, int DX, int F, int D),
     (&m->inner, dx, demb, dout, B, DX, F, D), (dx, demb, dout))
WRAP(cross_forward, (dlrec_backend *be, float *out, float *act, const float *x0, const float *xl, const float *w,
     const float *bias, int B, int d), (&m->inner, out, act, x0, xl, w, bias, B, d), (out, act, x0, xl, w, bias))
WRAP(cross_backward, (dlrec_backend *be, float *dx0, float *dxl, float *dw, float *dbias, const float *dout, const
     float *x0, const float *xl, const float *act, const float *w, float *ws, int B, int d), (&m->inner, dx0, dxl, dw,
     dbias, dout, x0, xl, act, w, ws, B, d), (dx0, dxl, dw, dbias, dout, x0, xl, act, w, ws))
WRAP(cross_lowrank_forward, (dlrec_backend *be, float *out, float *act, const float *x0, const float *xl, const float
     *v, const float *u, const float *bias, int B, int d, int r), (&m->inner, out, act, x0, xl, v, u, bias, B, d, r),
     (out, act, x0, xl, v, u, bias))
WRAP(cross_lowrank_backward, (dlrec_backend *be, float *dx0, float *dxl, float *dv, float *du, float *dbias, const
     float *dout, const float *x0, const float *xl, const float *act, const float *v, const float *u, float *ws, int
     B, int d, int r), (&m->inner, dx0, dxl, dv, du, dbias, dout, x0, xl, act, v, u, ws, B, d, r), (dx0, dxl, dv, du,
     dbias, dout, x0, xl, act, v, u, ws))
WRAP(cross_mix_forward, (dlrec_backend *be, float *out, float *act, const float *x0, const float *xl, const float *v,
     const float *c, const float *u, const float *gate, const float *bias, int B, int d, int r, int K), (&m->inner,
     out, act, x0, xl, v, c, u, gate, bias, B, d, r, K), (out, act, x0, xl, v, c, u, gate, bias))
WRAP(cross_mix_backward, (dlrec_backend *be, float *dx0, float *dxl, float *dv, float *dc, float *du, float *dgate,
     float *dbias, const float *dout, const float *x0, const float *xl, const float *act, const float *v, const float
     *c, const float *u, const float *gate, float *ws, int B, int d, int r, int K), (&m->inner, dx0, dxl, dv, dc, du,
     dgate, dbias, dout, x0, xl, act, v, c, u, gate, ws, B, d, r, K), (dx0, dxl, dv, dc, du, dgate, dbias, dout, x0,
     xl, act, v, c, u, gate, ws))
WRAP(fm_forward, (dlrec_backend *be, float *out, const float *emb, int B, int F, int D), (&m->inner, out, emb, B, F,
     D), (out, emb))
WRAP(fm_backward, (dlrec_backend *be, float *demb, const float *dout, const float *emb, int B, int F, int D),
     (&m->inner, demb, dout, emb, B, F, D), (demb, dout, emb))
WRAP(wide_forward, (dlrec_backend *be, float *out, const float *w, const float *bias, int B, int F), (&m->inner, out,
     w, bias, B, F), (out, w, bias))
WRAP(wide_backward, (dlrec_backend *be, float *dw, float *dbias, const float *dout, int B, int F), (&m->inner, dw,
     dbias, dout, B, F), (dw, dbias, dout))
WRAP(dropout_forward, (dlrec_backend *be, float *out, const float *in, size_t n, float p, uint64_t seed, uint64_t
     step, int train), (&m->inner, out, in, n, p, seed, step, train), (out, in))
WRAP(dropout_backward, (dlrec_backend *be, float *din, const float *dout, size_t n, float p, uint64_t seed, uint64_t
     step), (&m->inner, din, dout, n, p, seed, step), (din, dout))
WRAP(batchnorm_train_forward, (dlrec_backend *be, float *out, float *saved, const float *in, const float *gamma, const
     float *beta, float *running_mean, float *running_var, float momentum, float eps, int B, int C), (&m->inner, out,
     saved, in, gamma, beta, running_mean, running_var, momentum, eps, B, C), (out, saved, in, gamma, beta,
     running_mean, running_var))
WRAP(batchnorm_backward, (dlrec_backend *be, float *din, float *dgamma, float *dbeta, const float *dout, const float
     *in, const float *gamma, const float *saved, int B, int C), (&m->inner, din, dgamma, dbeta, dout, in, gamma,
     saved, B, C), (din, dgamma, dbeta, dout, in, gamma, saved))
WRAP(batchnorm_stats, (dlrec_backend *be, double *out, const float *in, const double *sum, double N, int B, int C),
     (&m->inner, out, in, sum, N, B, C), (out, in, sum))
WRAP(batchnorm_normalize, (dlrec_backend *be, float *out, float *saved, const float *in, const double *sum, const
     double *sqdev, double N, const float *gamma, const float *beta, float *running_mean, float *running_var, float
     momentum, float eps, int B, int C), (&m->inner, out, saved, in, sum, sqdev, N, gamma, beta, running_mean,
     running_var, momentum, eps, B, C), (out, saved, in, sum, sqdev, gamma, beta, running_mean, running_var))
WRAP(batchnorm_backward_stats, (dlrec_backend *be, double *sg, double *sgx, const float *dout, const float *in, const
     float *saved, int B, int C), (&m->inner, sg, sgx, dout, in, saved, B, C), (sg, sgx, dout, in, saved))
WRAP(batchnorm_backward_apply, (dlrec_backend *be, float *din, float *dgamma, float *dbeta, const float *dout, const
     float *in, const float *gamma, const float *saved, const double *sg_way, const double *sgx_way, const double *sg,
     const double *sgx, double N, int B, int C), (&m->inner, din, dgamma, dbeta, dout, in, gamma, saved, sg_way,
     sgx_way, sg, sgx, N, B, C), (din, dgamma, dbeta, dout, in, gamma, saved, sg_way, sgx_way, sg, sgx))
WRAP(batchnorm_infer, (dlrec_backend *be, float *out, const float *in, const float *gamma, const float *beta, const
     float *running_mean, const float *running_var, float eps, int B, int C), (&m->inner, out, in, gamma, beta,
     running_mean, running_var, eps, B, C), (out, in, gamma, beta, running_mean, running_var))
WRAP(batchnorm_infer_backward, (dlrec_backend *be, float *din, float *dgamma, float *dbeta, const float *dout, const
     float *in, const float *gamma, const float *running_mean, const float *running_var, float eps, int B, int C),
     (&m->inner, din, dgamma, dbeta, dout, in, gamma, running_mean, running_var, eps, B, C), (din, dgamma, dbeta,
     dout, in, gamma, running_mean, running_var))
WRAP(bce_forward, (dlrec_backend *be, double *loss, const float *logits, const float *labels, int B), (&m->inner,
     loss, logits, labels, B), (loss, logits, labels))
WRAP(bce_backward, (dlrec_backend *be, float *dlogits, const float *logits, const float *labels, int B), (&m->inner,
     dlogits, logits, labels, B), (dlogits, logits, labels))
WRAP(optim_step, (dlrec_backend *be, const dlrec_optim_config *c, float *param, const float *grad, float *state,
     size_t n, uint64_t step), (&m->inner, c, param, grad, state, n, step), (param, grad, state))
WRAP(bag_forward, (dlrec_backend *be, float *out, const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_bag_mode
     mode), (&m->inner, out, t, bags, mode), (out, dlrec_table_raw_const(t)))
WRAP(bag_backward_update, (dlrec_backend *be, dlrec_table *t, dlrec_sparse_optim *o, const dlrec_bag_batch *bags,
     dlrec_bag_mode mode, const float *d_out, void *scratch, size_t scratch_bytes), (&m->inner, t, o, bags, mode,
     d_out, scratch, scratch_bytes), (dlrec_table_raw_const(t), d_out, scratch))
WRAP(packed_create, (dlrec_backend *be, dlrec_packed_linear **p, const float *weight, const float *bias, int IN, int
     OUT), (&m->inner, p, weight, bias, IN, OUT), (NULL))
WRAP_VOID(packed_free, (dlrec_backend *be, dlrec_packed_linear *p), (&m->inner, p))
WRAP(packed_forward, (dlrec_backend *be, float *out, const dlrec_packed_linear *p, const float *in, int B, dlrec_act
     act), (&m->inner, out, p, in, B, act), (out, in))
WRAP(cross_infer, (dlrec_backend *be, float *out, const float *x0, const float *xl, const dlrec_packed_linear *w, int
     B, int d), (&m->inner, out, x0, xl, w, B, d), (out, x0, xl))
WRAP(cross_lowrank_infer, (dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl, const
     dlrec_packed_linear *v, const dlrec_packed_linear *u, int B, int d, int r), (&m->inner, out, ws, x0, xl, v, u, B,
     d, r), (out, ws, x0, xl))
WRAP(cross_mix_infer, (dlrec_backend *be, float *out, float *ws, const float *x0, const float *xl, const
     dlrec_packed_linear *const *v, const dlrec_packed_linear *const *c, const dlrec_packed_linear *const *u, const
     dlrec_packed_linear *gate, int B, int d, int r, int K), (&m->inner, out, ws, x0, xl, v, c, u, gate, B, d, r, K),
     (out, ws, x0, xl))

/* ---- memory ---- */

static void *m_alloc(dlrec_backend *be, size_t bytes) {
  mirror *m = mir(be);
  const size_t size = ((bytes ? bytes : 1) + PAGE - 1) / PAGE * PAGE;
  if (size > RESERVE_BYTES - m->used) return NULL;
  if (m->n_live == m->cap_live) {
    size_t cap = m->cap_live ? 2 * m->cap_live : 64;
    struct alloc_entry *l = realloc(m->live, cap * sizeof *l);
    if (!l) return NULL;
    m->live = l, m->cap_live = cap;
  }
  char *p = m->base + m->used;
  m->used += size;
  m->live[m->n_live++] = (struct alloc_entry){p, size};
  return p;
}

static void m_release(dlrec_backend *be, void *p) {
  mirror *m = mir(be);
  for (size_t i = 0; p && i < m->n_live; i++)
    if (m->live[i].p == p) {
      madvise(p, m->live[i].bytes, MADV_DONTNEED);
      m->live[i] = m->live[--m->n_live];
      return;
    }
}

/* Host memory for copies (a GPU's pinned memory): the host's own, so that a
 * network here takes the GPU's path for the buffers that cross each step. */
static void *m_alloc_host(dlrec_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}

static void m_release_host(dlrec_backend *be, void *p) {
  (void)be;
  free(p);
}

static dlrec_status m_copy(dlrec_backend *be, void *dst, const void *src, size_t bytes) {
  if (bytes && (!dst || !src)) return dlrec_error(DLREC_ERR_INVALID, "copy of %zu bytes with a NULL buffer", bytes);
  mirror *m = mir(be);
  open_all(m);
  if (bytes) memmove(dst, src, bytes);
  close_all(m);
  return DLREC_OK;
}

static dlrec_status m_synchronize(dlrec_backend *be) {
  (void)be;
  return DLREC_OK;
}

/* A GPU's copies back without a wait, and its fences, as the CPU has them:
 * the copy is done when it returns, so a fence has nothing to wait for. They
 * are here so that a network on the mirror takes the GPU's path. */
static void *m_fence_create(dlrec_backend *be) {
  (void)be;
  return malloc(1);
}

static void m_fence_free(dlrec_backend *be, void *f) {
  (void)be;
  free(f);
}

static dlrec_status m_fence(dlrec_backend *be, void *f) {
  (void)be;
  return f ? DLREC_OK : dlrec_error(DLREC_ERR_INVALID, "NULL fence");
}

static void m_free(dlrec_backend *be) {
  mirror *m = mir(be);
  if (!m) return;
  if (m->inner.ops && m->inner.ops->free) m->inner.ops->free(&m->inner);
  if (m->base) munmap(m->base, RESERVE_BYTES);
  free(m->live);
  free(m);
  be->ctx = NULL;
}

static const dlrec_backend_ops mirror_ops = {
    .free = m_free,
    .alloc = m_alloc,
    .release = m_release,
    .alloc_host = m_alloc_host,
    .release_host = m_release_host,
    .upload = m_copy,
    .download = m_copy,
    .synchronize = m_synchronize,
    .download_async = m_copy,
    .fence_create = m_fence_create,
    .fence_free = m_fence_free,
    .fence_record = m_fence,
    .fence_wait = m_fence,
    .copy_rows = m_copy_rows,
    .fill_rows = m_fill_rows,
    .add = m_add,
    .gather_rows = m_gather_rows,
    .scatter_add_rows = m_scatter_add_rows,
    .sum_columns = m_sum_columns,
    .scale = m_scale,
    .all_finite = m_all_finite,
    .keep_operands = m_keep_operands,
    .fresh_gradients = m_fresh_gradients,
    .linear_forward = m_linear_forward,
    .linear_backward = m_linear_backward,
    .linear_relu_backward = m_linear_relu_backward,
    .relu_forward = m_relu_forward,
    .relu_backward = m_relu_backward,
    .sigmoid = m_sigmoid,
    .dot_forward = m_dot_forward,
    .dot_backward = m_dot_backward,
    .concat_forward = m_concat_forward,
    .concat_backward = m_concat_backward,
    .cross_forward = m_cross_forward,
    .cross_backward = m_cross_backward,
    .cross_lowrank_forward = m_cross_lowrank_forward,
    .cross_lowrank_backward = m_cross_lowrank_backward,
    .cross_mix_forward = m_cross_mix_forward,
    .cross_mix_backward = m_cross_mix_backward,
    .fm_forward = m_fm_forward,
    .fm_backward = m_fm_backward,
    .wide_forward = m_wide_forward,
    .wide_backward = m_wide_backward,
    .dropout_forward = m_dropout_forward,
    .dropout_backward = m_dropout_backward,
    .batchnorm_train_forward = m_batchnorm_train_forward,
    .batchnorm_backward = m_batchnorm_backward,
    .batchnorm_stats = m_batchnorm_stats,
    .batchnorm_normalize = m_batchnorm_normalize,
    .batchnorm_backward_stats = m_batchnorm_backward_stats,
    .batchnorm_backward_apply = m_batchnorm_backward_apply,
    .batchnorm_infer = m_batchnorm_infer,
    .batchnorm_infer_backward = m_batchnorm_infer_backward,
    .bce_forward = m_bce_forward,
    .bce_backward = m_bce_backward,
    .optim_step = m_optim_step,
    .bag_forward = m_bag_forward,
    .bag_backward_update = m_bag_backward_update,
    .packed_create = m_packed_create,
    .packed_free = m_packed_free,
    .packed_forward = m_packed_forward,
    .cross_infer = m_cross_infer,
    .cross_lowrank_infer = m_cross_lowrank_infer,
    .cross_mix_infer = m_cross_mix_infer,
};

dlrec_status dlrec_backend_cpu_mirror_init(dlrec_backend *be, const dlrec_backend_config *c) {
  mirror *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  dlrec_status s = dlrec_backend_cpu_init(&m->inner, c);
  if (s != DLREC_OK) {
    free(m);
    return s;
  }
  m->base = mmap(NULL, RESERVE_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m->base == MAP_FAILED) {
    m->inner.ops->free(&m->inner);
    free(m);
    return dlrec_error(DLREC_ERR_NOMEM, "cpu-mirror: cannot reserve its address range");
  }
  *be = m->inner;
  be->ops = &mirror_ops;
  be->name = "cpu-mirror";
  be->host_memory = 0; /* what a GPU's backend says: networks copy their state in and out */
  be->ctx = m;
  snprintf(be->describe, sizeof be->describe, "cpu-mirror (the CPU as a device) %.90s", m->inner.describe + 5);
  return DLREC_OK;
}
