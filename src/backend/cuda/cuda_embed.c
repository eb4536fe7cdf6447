/* The CUDA backend's bag ops: a table and its optimizer mirrored in device
 * memory (mirror.c), a batch from the host, checked as the CPU's ops check
 * it and sent over once for the forward and the update of a step. */
#include "backend/cuda/cuda_impl.h"

#include <math.h>
#include <string.h>

#include "backend/dtype.h"

/* ---- embedding bags: tables and optimizer state in device memory (the
 * mirrors of mirror.c), batches from the host ---- */

/* The ids of a batch (checked by check_bags) in all. */
static uint64_t bag_ids(const dlrec_bag_batch *bags) {
  uint64_t ids = 0;
  for (uint32_t c = 0; c < bags->cols; c++) ids += bags->offsets[c][bags->rows] - bags->offsets[c][0];
  return ids;
}

/* A batch of `ids` ids laid out as cuk_bags reads it: per column its B + 1
 * offsets, then the F + 1 column bases into ids, the ids column after
 * column, and a mean flag per column. Offsets' bytes into *offs and the
 * bases' into *base. */
static size_t bags_layout(const dlrec_bag_batch *bags, uint64_t ids, size_t *offs, size_t *base) {
  *offs = (size_t)bags->cols * (bags->rows + 1) * 4;
  *base = ((size_t)bags->cols + 1) * 4;
  return *offs + *base + ids * 4 + bags->cols;
}

/* The batch's mean flags: the mode's, or the column's own. */
static uint8_t bag_mean(const dlrec_bag_batch *bags, dlrec_pooling mode, uint32_t c) {
  return mode == DLREC_POOLING_MEAN || (bags->mean_cols && bags->mean_cols[c]);
}

/* Whether the batch equals the one last sent (x->bags_host), which was
 * checked against table t: the same shape, flags, offsets and ids. */
static int bags_same(const cuda_ctx *x, const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_pooling mode) {
  if (!x->bags_len || x->bags_table != t || x->bags_table_rows != dlrec_table_rows(t) || x->bags.B != bags->rows ||
      x->bags.F != bags->cols || !bags->offsets || !bags->ids)
    return 0;
  const uint32_t B = bags->rows, F = bags->cols;
  const uint32_t *h = x->bags_host, *h_base = h + (size_t)F * (B + 1), *h_ids = h_base + F + 1;
  const uint8_t *h_mean = (const uint8_t *)(h_ids + h_base[F]);
  for (uint32_t c = 0; c < F; c++)
    if (!bags->offsets[c] || !bags->ids[c] || h_mean[c] != bag_mean(bags, mode, c)) return 0;
  int diff = 0;
#pragma omp parallel for schedule(dynamic) reduction(| : diff) if ((uint64_t)B * F >= 32768)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c];
    /* The offsets first: equal to checked ones, they bound the ids read. */
    if (memcmp(h + (size_t)c * (B + 1), off, (size_t)(B + 1) * 4)) diff |= 1;
    else diff |= memcmp(h_ids + h_base[c], bags->ids[c] + off[0], (size_t)(h_base[c + 1] - h_base[c]) * 4) != 0;
  }
  return !diff;
}

/* The batch (checked by check_bags against t, `ids` ids) laid out in pinned
 * host memory, copied to the device, and kept as the last batch sent;
 * *out is its device view. */
static dlrec_status bags_send(dlrec_backend *be, const dlrec_table *t, const dlrec_bag_batch *bags, uint64_t ids,
                              dlrec_pooling mode, cuk_bags *out, const char *what) {
  cuda_ctx *x = ctx_of(be);
  const uint32_t B = bags->rows, F = bags->cols;
  if (ids > UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %llu ids in one batch, at most 2^32 - 1", what, (unsigned long long)ids);
  size_t offs, base;
  const size_t bytes = bags_layout(bags, ids, &offs, &base);
  x->bags_len = 0; /* until this batch is whole on both sides */
  /* bags_host is free to rewrite (or free) once the last copy from it has
   * landed (at the start of the last step: no wait in a training loop); the
   * kernels that read bags_dev run on the stream the next copy is queued on. */
  TRY(cuda_status(cudaEventSynchronize(x->bags_sent), what));
  if (bytes > x->bags_cap) {
    enter(be);
    if (x->bags_dev) cudaFree(x->bags_dev); /* waits for the ops that used it */
    if (x->bags_host) cudaFreeHost(x->bags_host);
    x->bags_dev = x->bags_host = NULL;
    x->bags_cap = 0;
    const size_t want = bytes + bytes / 4;
    if (cudaMalloc(&x->bags_dev, want) != cudaSuccess || cudaHostAlloc(&x->bags_host, want, 0) != cudaSuccess) {
      if (x->bags_dev) cudaFree(x->bags_dev);
      x->bags_dev = x->bags_host = NULL;
      return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for a batch of %zu bytes on the GPU or pinned on the host",
                         what, bytes);
    }
    x->bags_cap = want;
  }
  /* Both buffers are free to overwrite (see above). */
  uint32_t *h = x->bags_host, *h_base = h + (size_t)F * (B + 1), *h_ids = h_base + F + 1;
  h_base[0] = 0;
  for (uint32_t c = 0; c < F; c++) h_base[c + 1] = h_base[c] + (bags->offsets[c][B] - bags->offsets[c][0]);
#pragma omp parallel for schedule(dynamic) if ((uint64_t)B * F >= 32768)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c];
    memcpy(h + (size_t)c * (B + 1), off, (size_t)(B + 1) * 4);
    memcpy(h_ids + h_base[c], bags->ids[c] + off[0], (size_t)(h_base[c + 1] - h_base[c]) * 4);
  }
  uint8_t *h_mean = (uint8_t *)(h_ids + ids);
  for (uint32_t c = 0; c < F; c++) h_mean[c] = bag_mean(bags, mode, c);
  TRY(cuda_status(cudaMemcpyAsync(x->bags_dev, x->bags_host, bytes, cudaMemcpyHostToDevice, enter(be)), what));
  TRY(cuda_status(cudaEventRecord(x->bags_sent, enter(be)), what));
  const char *d = x->bags_dev;
  x->bags = (cuk_bags){(const uint32_t *)d, (const uint32_t *)(d + offs), (const uint32_t *)(d + offs + base),
                       (const uint8_t *)(d + offs + base + ids * 4), B, F};
  x->bags_table = t;
  x->bags_table_rows = dlrec_table_rows(t);
  x->bags_ids = ids;
  x->bags_len = bytes;
  *out = x->bags;
  return DLREC_OK;
}

static cuk_rows rows_of(const dlrec_table *t) {
  const cuk_rows r = {(void *)dlrec_table_raw_const(t), dlrec_table_rows(t), dlrec_table_stride(t), dlrec_table_dim(t),
                      (int)dlrec_table_get_dtype(t)};
  return r;
}

/* The CPU's checks of a batch against table t (dlrec_bag_check: shape,
 * offsets in order, ids in the table), before anything is sized or sent. */
static dlrec_status check_bags(const char *what, const void *a, const dlrec_table *t, const dlrec_bag_batch *bags,
                               dlrec_pooling mode) {
  if (!a) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  if (mode != DLREC_POOLING_SUM && mode != DLREC_POOLING_MEAN)
    return dlrec_error(DLREC_ERR_INVALID, "%s: unknown mode %d", what, (int)mode);
  return dlrec_bag_check(t, bags) == DLREC_OK ? DLREC_OK : dlrec_error_context("%s: ", what);
}

/* The batch on the device, *ids its ids: the last one sent when this equals
 * it (checked then against the same table), else checked and sent. */
static dlrec_status bags_on_device(dlrec_backend *be, const char *what, const void *a, const dlrec_table *t,
                                   const dlrec_bag_batch *bags, dlrec_pooling mode, uint64_t *ids, cuk_bags *out) {
  cuda_ctx *x = ctx_of(be);
  if (a && t && bags && (mode == DLREC_POOLING_SUM || mode == DLREC_POOLING_MEAN) && bags_same(x, t, bags, mode)) {
    *ids = x->bags_ids;
    *out = x->bags;
    return DLREC_OK;
  }
  TRY(check_bags(what, a, t, bags, mode));
  *ids = bag_ids(bags);
  return bags_send(be, t, bags, *ids, mode, out, what);
}

dlrec_status cuda_bag_forward(dlrec_backend *be, float *out, const dlrec_table *t, const dlrec_bag_batch *bags,
                              dlrec_pooling mode) {
  const char *what = "bag_forward";
  uint64_t ids;
  cuk_bags bg;
  TRY(bags_on_device(be, what, out, t, bags, mode, &ids, &bg));
  return cuda_status(cuk_bag_forward(enter(be), out, rows_of(t), bg), what);
}

dlrec_status cuda_bag_backward_update(dlrec_backend *be, dlrec_table *t, dlrec_sparse_optim *o,
                                      const dlrec_bag_batch *bags, dlrec_pooling mode, const float *d_out,
                                      void *scratch_in, size_t scratch_bytes) {
  const char *what = "bag_backward_update";
  uint64_t ids;
  cuk_bags bg;
  TRY(bags_on_device(be, what, d_out, t, bags, mode, &ids, &bg)); /* the forward's batch: neither checked nor sent */
  if (!o) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  if (dlrec_sparse_optim_sweeps(dlrec_sparse_optim_get_config(o))) /* the CPU's sweep has no kernel here yet */
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: dense Adam and a table-wide L2 (optimizer.sparse) train on the "
                       "CPU only", what);
  dlrec_sparse_optim_state s;
  dlrec_sparse_optim_state_view(o, &s);
  if (s.rows != dlrec_table_rows(t) || s.stride != dlrec_table_stride(t))
    return dlrec_error(DLREC_ERR_INVALID, "%s: the optimizer is another table's", what);
  const size_t need = dlrec_bag_backward_scratch_bytes(t, ids);
  if (!scratch_in || scratch_bytes < need) /* the caller's, sized as for the CPU: the contract's check */
    return dlrec_error(DLREC_ERR_INVALID,
                       "%s: scratch of %zu bytes; this batch of %llu ids needs %zu (plan it with "
                       "dlrec_bag_backward_scratch_bytes)",
                       what, scratch_bytes, (unsigned long long)ids, need);
  if (dlrec_table_dim(t) > 1024) return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: rows wider than 1024", what);
  if (ids == 0) return DLREC_OK; /* no row to update */
  const size_t update = cuk_bag_update_scratch((uint32_t)ids, dlrec_table_dim(t), dlrec_table_rows(t));
  char *at = cuda_scratch(be, update);
  if (!at) return dlrec_error(DLREC_ERR_NOMEM, "%s: no GPU memory for %zu bytes of scratch", what, update);
  const dlrec_sparse_optim_config *c = dlrec_sparse_optim_get_config(o);
  const cuk_sparse_opt opt = {c->kind == DLREC_SPARSE_SGD ? 0 : c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 1 : 2,
                              c->lr, c->weight_decay, c->beta1, c->beta2, c->eps, log((double)c->beta1),
                              log((double)c->beta2), s.accum, s.m, s.v, s.steps,
                              dtype_sr_key(s.updates ? *s.updates : 0), dlrec_sparse_optim_row_keys(o)};
  TRY(cuda_status(cuk_bag_update(enter(be), rows_of(t), bg, (uint32_t)ids, d_out, opt, at, update), what));
  if (s.updates) ++*s.updates; /* the next update's rounding key, as the CPU's count */
  return DLREC_OK;
}

