/* Mirrors of an embedding table and its sparse optimizer in a backend's
 * memory (dispatch.h): what a GPU's bag ops read and update. A mirror
 * is a dlrec_table_wrap / dlrec_sparse_optim_wrap handle over arrays from
 * the backend's alloc, filled by upload and read back by download. A
 * mirror holds the host's rows whole, or runs of them (backend_rows: the
 * hot rows of a table that stays on the host). */
#include "backend/dispatch.h"

#include <string.h>

static size_t row_bytes(const dlrec_table *t) {
  return (size_t)dlrec_table_stride(t) * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
}

/* Rows `runs` of host's into dev (to_device) or back. */
static dlrec_status copy_table_runs(dlrec_backend *be, dlrec_table *host, dlrec_table *dev, const backend_rows *runs,
                                    uint32_t n_runs, int to_device) {
  const size_t rb = row_bytes(host);
  char *h = dlrec_table_raw(host), *d = dlrec_table_raw(dev);
  dlrec_status s = DLREC_OK;
  for (uint32_t i = 0; s == DLREC_OK && i < n_runs; i++) {
    char *hp = h + runs[i].host * rb, *dp = d + runs[i].dev * rb;
    const size_t bytes = runs[i].count * rb;
    s = to_device ? be->ops->upload(be, dp, hp, bytes) : be->ops->download(be, hp, dp, bytes);
  }
  return s;
}

void backend_table_mirror_free(dlrec_backend *be, dlrec_table *dev) {
  if (!dev) return;
  be->ops->release(be, dlrec_table_raw(dev));
  dlrec_table_free(dev);
}

dlrec_status backend_table_mirror_runs(dlrec_backend *be, const dlrec_table *host, const backend_rows *runs,
                                       uint32_t n_runs, uint64_t rows, dlrec_table **dev) {
  *dev = NULL;
  const size_t bytes = (size_t)rows * row_bytes(host);
  void *data = be->ops->alloc(be, bytes ? bytes : 1);
  if (!data)
    return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the embedding table's %zu bytes", be->describe, bytes);
  dlrec_status s = dlrec_table_wrap(dev, rows, dlrec_table_dim(host), dlrec_table_get_dtype(host), data);
  if (s == DLREC_OK) s = copy_table_runs(be, (dlrec_table *)host, *dev, runs, n_runs, 1);
  if (s != DLREC_OK && *dev) {
    backend_table_mirror_free(be, *dev);
    *dev = NULL;
  } else if (s != DLREC_OK) {
    be->ops->release(be, data);
  }
  return s;
}

dlrec_status backend_table_copy_runs(dlrec_backend *be, dlrec_table *host, dlrec_table *dev, const backend_rows *runs,
                                     uint32_t n_runs, int to_device) {
  return copy_table_runs(be, host, dev, runs, n_runs, to_device);
}

/* The whole table: one run. */
static backend_rows whole(const dlrec_table *t) { return (backend_rows){0, 0, dlrec_table_rows(t)}; }

dlrec_status backend_table_mirror(dlrec_backend *be, const dlrec_table *host, dlrec_table **dev) {
  const backend_rows all = whole(host);
  return backend_table_mirror_runs(be, host, &all, 1, all.count, dev);
}

dlrec_status backend_table_upload(dlrec_backend *be, dlrec_table *dev, const dlrec_table *host) {
  const backend_rows all = whole(host);
  return copy_table_runs(be, (dlrec_table *)host, dev, &all, 1, 1);
}

dlrec_status backend_table_download(dlrec_backend *be, dlrec_table *host, const dlrec_table *dev) {
  const backend_rows all = whole(host);
  return copy_table_runs(be, host, (dlrec_table *)dev, &all, 1, 0);
}

/* The per-row sizes of the state arrays of s's kind, in bytes (0: none). */
static void state_row_bytes(const dlrec_sparse_optim_state *s, size_t *accum, size_t *mv, size_t *steps) {
  *accum = s->accum ? sizeof(float) : 0;
  *mv = s->m ? (size_t)s->stride * sizeof(float) : 0;
  *steps = s->steps ? sizeof(uint32_t) : 0;
}

/* Rows `runs` of the host's state h into the device's d (to_device) or back. */
static dlrec_status copy_state_runs(dlrec_backend *be, const dlrec_sparse_optim_state *h,
                                    const dlrec_sparse_optim_state *d, const backend_rows *runs, uint32_t n_runs,
                                    int to_device) {
  size_t accum, mv, steps;
  state_row_bytes(h, &accum, &mv, &steps);
  struct {
    char *h, *d;
    size_t row;
  } arr[4] = {{(char *)h->accum, (char *)d->accum, accum},
              {(char *)h->m, (char *)d->m, mv},
              {(char *)h->v, (char *)d->v, mv},
              {(char *)h->steps, (char *)d->steps, steps}};
  dlrec_status s = DLREC_OK;
  for (int a = 0; a < 4; a++)
    for (uint32_t i = 0; s == DLREC_OK && arr[a].row && i < n_runs; i++) {
      char *hp = arr[a].h + runs[i].host * arr[a].row, *dp = arr[a].d + runs[i].dev * arr[a].row;
      const size_t bytes = runs[i].count * arr[a].row;
      s = to_device ? be->ops->upload(be, dp, hp, bytes) : be->ops->download(be, hp, dp, bytes);
    }
  return s;
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

dlrec_status backend_sparse_optim_mirror_runs(dlrec_backend *be, dlrec_sparse_optim *host, const dlrec_table *dev_table,
                                              const backend_rows *runs, uint32_t n_runs, dlrec_sparse_optim **dev) {
  *dev = NULL;
  dlrec_sparse_optim_state h, d;
  dlrec_sparse_optim_state_view(host, &h);
  d = h;
  d.rows = dlrec_table_rows(dev_table);
  d.accum = d.m = d.v = NULL;
  d.steps = NULL;
  size_t accum, mv, steps;
  state_row_bytes(&h, &accum, &mv, &steps);
  const size_t rows = (size_t)d.rows ? (size_t)d.rows : 1;
  dlrec_status s = DLREC_OK;
  if (accum && !(d.accum = be->ops->alloc(be, rows * accum))) s = DLREC_ERR_NOMEM;
  if (mv && (!(d.m = be->ops->alloc(be, rows * mv)) || !(d.v = be->ops->alloc(be, rows * mv)))) s = DLREC_ERR_NOMEM;
  if (steps && !(d.steps = be->ops->alloc(be, rows * steps))) s = DLREC_ERR_NOMEM;
  if (s != DLREC_OK)
    s = dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the sparse optimizer's state", be->describe);
  if (s == DLREC_OK) s = copy_state_runs(be, &h, &d, runs, n_runs, 1);
  if (s == DLREC_OK) s = dlrec_sparse_optim_wrap(dev, dev_table, dlrec_sparse_optim_get_config(host), &d);
  if (s != DLREC_OK) {
    be->ops->release(be, d.accum);
    be->ops->release(be, d.m);
    be->ops->release(be, d.v);
    be->ops->release(be, d.steps);
  }
  return s;
}

dlrec_status backend_sparse_optim_download_runs(dlrec_backend *be, dlrec_sparse_optim *host, dlrec_sparse_optim *dev,
                                                const backend_rows *runs, uint32_t n_runs) {
  dlrec_sparse_optim_state h, d;
  dlrec_sparse_optim_state_view(host, &h);
  dlrec_sparse_optim_state_view(dev, &d);
  return copy_state_runs(be, &h, &d, runs, n_runs, 0);
}

dlrec_status backend_sparse_optim_mirror(dlrec_backend *be, dlrec_sparse_optim *host, const dlrec_table *dev_table,
                                         dlrec_sparse_optim **dev) {
  const backend_rows all = whole(dev_table);
  return backend_sparse_optim_mirror_runs(be, host, dev_table, &all, 1, dev);
}

dlrec_status backend_sparse_optim_download(dlrec_backend *be, dlrec_sparse_optim *host, dlrec_sparse_optim *dev) {
  dlrec_sparse_optim_state h, d;
  dlrec_sparse_optim_state_view(host, &h);
  dlrec_sparse_optim_state_view(dev, &d);
  const backend_rows all = {0, 0, h.rows};
  dlrec_status s = copy_state_runs(be, &h, &d, &all, 1, 0);
  if (s == DLREC_OK && h.updates && d.updates) *h.updates = *d.updates;
  return s;
}
