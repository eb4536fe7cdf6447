/* Mirrors of an embedding table and its sparse optimizer in a backend's
 * memory (backend_impl.h): what a GPU's bag ops read and update. A mirror
 * is a dlrec_table_wrap / dlrec_sparse_optim_wrap handle over arrays from
 * the backend's alloc, filled by upload and read back by download. */
#include "backend/backend_impl.h"

#include <string.h>

static size_t table_bytes(const dlrec_table *t) {
  return (size_t)dlrec_table_rows(t) * dlrec_table_stride(t) * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
}

void backend_table_mirror_free(dlrec_backend *be, dlrec_table *dev) {
  if (!dev) return;
  be->ops->release(be, dlrec_table_raw(dev));
  dlrec_table_free(dev);
}

dlrec_status backend_table_mirror(dlrec_backend *be, const dlrec_table *host, dlrec_table **dev) {
  *dev = NULL;
  const size_t bytes = table_bytes(host);
  void *rows = be->ops->alloc(be, bytes);
  if (!rows)
    return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the embedding table's %zu bytes", be->describe, bytes);
  dlrec_status s = be->ops->upload(be, rows, dlrec_table_raw_const(host), bytes);
  if (s == DLREC_OK)
    s = dlrec_table_wrap(dev, dlrec_table_rows(host), dlrec_table_dim(host), dlrec_table_get_dtype(host), rows);
  if (s != DLREC_OK) be->ops->release(be, rows);
  return s;
}

dlrec_status backend_table_upload(dlrec_backend *be, dlrec_table *dev, const dlrec_table *host) {
  return be->ops->upload(be, dlrec_table_raw(dev), dlrec_table_raw_const(host), table_bytes(host));
}

dlrec_status backend_table_download(dlrec_backend *be, dlrec_table *host, const dlrec_table *dev) {
  return be->ops->download(be, dlrec_table_raw(host), dlrec_table_raw_const(dev), table_bytes(host));
}

/* The state arrays of o's kind: their sizes in bytes (0: none). */
static void state_bytes(const dlrec_sparse_optim_state *s, size_t *accum, size_t *mv, size_t *steps) {
  *accum = s->accum ? (size_t)s->rows * sizeof(float) : 0;
  *mv = s->m ? (size_t)s->rows * s->stride * sizeof(float) : 0;
  *steps = s->steps ? (size_t)s->rows * sizeof(uint32_t) : 0;
}

void backend_sparse_optim_mirror_free(dlrec_backend *be, dlrec_sparse_optim *dev) {
  if (!dev) return;
  dlrec_sparse_optim_state s;
  dlrec_sparse_optim_state_view(dev, &s);
  be->ops->release(be, s.accum);
  be->ops->release(be, s.m);
  be->ops->release(be, s.v);
  be->ops->release(be, s.steps);
  dlrec_sparse_optim_free(dev);
}

dlrec_status backend_sparse_optim_mirror(dlrec_backend *be, dlrec_sparse_optim *host, const dlrec_table *dev_table,
                                         dlrec_sparse_optim **dev) {
  *dev = NULL;
  dlrec_sparse_optim_state h, d;
  dlrec_sparse_optim_state_view(host, &h);
  d = h;
  d.accum = d.m = d.v = NULL;
  d.steps = NULL;
  size_t accum, mv, steps;
  state_bytes(&h, &accum, &mv, &steps);
  dlrec_status s = DLREC_OK;
  if (accum && !(d.accum = be->ops->alloc(be, accum))) s = DLREC_ERR_NOMEM;
  if (mv && (!(d.m = be->ops->alloc(be, mv)) || !(d.v = be->ops->alloc(be, mv)))) s = DLREC_ERR_NOMEM;
  if (steps && !(d.steps = be->ops->alloc(be, steps))) s = DLREC_ERR_NOMEM;
  if (s != DLREC_OK)
    s = dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the sparse optimizer's state", be->describe);
  if (s == DLREC_OK && accum) s = be->ops->upload(be, d.accum, h.accum, accum);
  if (s == DLREC_OK && mv) s = be->ops->upload(be, d.m, h.m, mv);
  if (s == DLREC_OK && mv) s = be->ops->upload(be, d.v, h.v, mv);
  if (s == DLREC_OK && steps) s = be->ops->upload(be, d.steps, h.steps, steps);
  if (s == DLREC_OK) s = dlrec_sparse_optim_wrap(dev, dev_table, dlrec_sparse_optim_get_config(host), &d);
  if (s != DLREC_OK) {
    be->ops->release(be, d.accum);
    be->ops->release(be, d.m);
    be->ops->release(be, d.v);
    be->ops->release(be, d.steps);
  }
  return s;
}

dlrec_status backend_sparse_optim_download(dlrec_backend *be, dlrec_sparse_optim *host, dlrec_sparse_optim *dev) {
  dlrec_sparse_optim_state h, d;
  dlrec_sparse_optim_state_view(host, &h);
  dlrec_sparse_optim_state_view(dev, &d);
  size_t accum, mv, steps;
  state_bytes(&h, &accum, &mv, &steps);
  dlrec_status s = DLREC_OK;
  if (accum) s = be->ops->download(be, h.accum, d.accum, accum);
  if (s == DLREC_OK && mv) s = be->ops->download(be, h.m, d.m, mv);
  if (s == DLREC_OK && mv) s = be->ops->download(be, h.v, d.v, mv);
  if (s == DLREC_OK && steps) s = be->ops->download(be, h.steps, d.steps, steps);
  if (s == DLREC_OK && h.updates && d.updates) *h.updates = *d.updates;
  return s;
}
