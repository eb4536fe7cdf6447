/* The sparse optimizer of a table: its hyperparameters and its state,
 * mmap'd like the table and faulted in at creation; or, for a backend's
 * mirror, state arrays in that backend's memory (dlrec_sparse_optim_wrap).
 * The update that reads and writes the state is the bag_backward_update
 * op (cpu/sparse_update.c on the CPU). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/sparse_optim_impl.h"

/* ---- the optimizer's state ------------------------------------------------ */

void dlrec_sparse_optim_config_default(dlrec_sparse_optim_config *c, dlrec_sparse_optim_kind kind) {
  c->kind = kind;
  c->lr = 0.01f;
  c->weight_decay = 0.0f;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->eps = kind == DLREC_SPARSE_ROWWISE_ADAGRAD ? 1e-10f : 1e-8f;
  c->initial_accumulator = 0.0f;
  c->l2_scope = DLREC_SPARSE_L2_TOUCHED;
}

int dlrec_sparse_optim_sweeps(const dlrec_sparse_optim_config *c) {
  return c->kind == DLREC_SPARSE_ADAM || (c->l2_scope == DLREC_SPARSE_L2_TABLE && c->weight_decay > 0.0f);
}

/* Whether kind keeps Adam's moments and step counts. */
static int has_moments(dlrec_sparse_optim_kind kind) {
  return kind == DLREC_SPARSE_LAZY_ADAM || kind == DLREC_SPARSE_ADAM;
}

static dlrec_status check_config(const dlrec_sparse_optim_config *c) {
  if (c->kind != DLREC_SPARSE_SGD && c->kind != DLREC_SPARSE_ROWWISE_ADAGRAD && !has_moments(c->kind))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: unknown kind %d", (int)c->kind);
  if (c->l2_scope != DLREC_SPARSE_L2_TOUCHED && c->l2_scope != DLREC_SPARSE_L2_TABLE)
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: unknown l2_scope %d", (int)c->l2_scope);
  if (!(c->lr >= 0.0f) || !isfinite(c->lr))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: bad lr %g", c->lr);
  if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: bad weight_decay %g", c->weight_decay);
  if (has_moments(c->kind) && !(c->beta1 >= 0.0f && c->beta1 < 1.0f && c->beta2 >= 0.0f && c->beta2 < 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: Adam betas must be in [0, 1): %g, %g", c->beta1,
                       c->beta2);
  if (c->kind != DLREC_SPARSE_SGD && !(c->eps > 0.0f))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: eps must be > 0: %g", c->eps);
  if (c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD && !(c->initial_accumulator >= 0.0f))
    return dlrec_error(DLREC_ERR_INVALID, "sparse optimizer: bad initial_accumulator %g", c->initial_accumulator);
  return DLREC_OK;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* An optimizer of t with config c and no state yet; NULL when out of memory. */
static dlrec_sparse_optim *optim_new(const dlrec_table *t, const dlrec_sparse_optim_config *c) {
  dlrec_sparse_optim *o = calloc(1, sizeof *o);
  if (!o) return NULL;
  o->table = t;
  o->cfg = *c;
  o->rows = dlrec_table_rows(t);
  o->dim = dlrec_table_dim(t);
  o->stride = dlrec_table_stride(t);
  o->dtype = dlrec_table_get_dtype(t);
  o->log_beta1 = log((double)c->beta1);
  o->log_beta2 = log((double)c->beta2);
  return o;
}

dlrec_status dlrec_sparse_optim_create(dlrec_sparse_optim **out, const dlrec_table *t,
                                       const dlrec_sparse_optim_config *c) {
  if (!out) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_create: NULL result pointer");
  *out = NULL;
  if (!t || !c) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_create: NULL argument");
  dlrec_status st = check_config(c);
  if (st != DLREC_OK) return st;
  dlrec_sparse_optim *o = optim_new(t, c);
  if (!o) return dlrec_error(DLREC_ERR_NOMEM, "sparse_optim_create: out of memory");
  /* The table's size was checked at its creation; the state is at most twice
   * that plus a counter per row. */
  size_t bytes = 0, accum_at = 0, m_at = 0, v_at = 0, steps_at = 0;
  const size_t elems = (size_t)o->rows * o->stride;
  if (c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD) {
    accum_at = 0;
    bytes = align64((size_t)o->rows * sizeof(float));
  } else if (has_moments(c->kind)) {
    m_at = 0;
    v_at = align64(elems * sizeof(float));
    steps_at = v_at + align64(elems * sizeof(float));
    bytes = steps_at + align64((size_t)o->rows * sizeof(uint32_t));
  }
  if (bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      free(o);
      return dlrec_error(DLREC_ERR_NOMEM, "sparse_optim_create: mmap of %zu bytes of optimizer state: %s", bytes,
                         strerror(e));
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    o->map = p;
    o->map_bytes = bytes;
    char *base = p;
    if (c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD) {
      o->accum = (float *)(base + accum_at);
      /* Written even when zero, to fault the pages in now (see below). */
      const float init = c->initial_accumulator;
#pragma omp parallel for schedule(static)
      for (uint64_t r = 0; r < o->rows; r++) o->accum[r] = init;
    } else {
      /* Adam's moments and counters start at zero: the mapping's own zeros.
       * They are still written once here, in parallel like the table's
       * initialization, so that pages are faulted in now (spread over the
       * threads' NUMA nodes) rather than by the first batches, whose steps
       * would otherwise be many times slower than the rest. */
      o->m = (float *)(base + m_at);
      o->v = (float *)(base + v_at);
      o->steps = (uint32_t *)(base + steps_at);
      const size_t pages = bytes / 4096;
#pragma omp parallel for schedule(static)
      for (size_t pg = 0; pg < pages; pg++) base[pg * 4096] = 0;
    }
  }
  *out = o;
  return DLREC_OK;
}

dlrec_status dlrec_sparse_optim_wrap(dlrec_sparse_optim **out, const dlrec_table *t, const dlrec_sparse_optim_config *c,
                                     const dlrec_sparse_optim_state *s) {
  if (!out) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_wrap: NULL result pointer");
  *out = NULL;
  if (!t || !c || !s) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_wrap: NULL argument");
  dlrec_status st = check_config(c);
  if (st != DLREC_OK) return st;
  if ((c->kind == DLREC_SPARSE_ROWWISE_ADAGRAD && !s->accum) ||
      (has_moments(c->kind) && (!s->m || !s->v || !s->steps)))
    return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_wrap: the state arrays of kind %d are missing", (int)c->kind);
  dlrec_sparse_optim *o = optim_new(t, c);
  if (!o) return dlrec_error(DLREC_ERR_NOMEM, "sparse_optim_wrap: out of memory");
  o->accum = s->accum;
  o->m = s->m;
  o->v = s->v;
  o->steps = s->steps;
  o->updates = s->updates ? *s->updates : 0; /* map stays NULL: the state is the caller's */
  *out = o;
  return DLREC_OK;
}

const dlrec_sparse_optim_config *dlrec_sparse_optim_get_config(const dlrec_sparse_optim *o) { return &o->cfg; }

void dlrec_sparse_optim_free(dlrec_sparse_optim *o) {
  if (!o) return;
  if (o->map) munmap(o->map, o->map_bytes);
  free(o);
}

dlrec_status dlrec_sparse_optim_set_lr(dlrec_sparse_optim *o, float lr) {
  if (!o) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_set_lr: NULL optimizer");
  if (!(lr >= 0.0f) || !isfinite(lr)) return dlrec_error(DLREC_ERR_INVALID, "sparse_optim_set_lr: bad lr %g", lr);
  o->cfg.lr = lr;
  return DLREC_OK;
}

void dlrec_sparse_optim_set_row_keys(dlrec_sparse_optim *o, const uint64_t *row_keys) { o->row_keys = row_keys; }
const uint64_t *dlrec_sparse_optim_row_keys(const dlrec_sparse_optim *o) { return o->row_keys; }

void dlrec_sparse_optim_state_view(dlrec_sparse_optim *o, dlrec_sparse_optim_state *s) {
  s->rows = o->rows;
  s->stride = o->stride;
  s->accum = o->accum;
  s->m = o->m;
  s->v = o->v;
  s->steps = o->steps;
  s->updates = o->dtype == DLREC_TABLE_FP32 ? NULL : &o->updates;
}

