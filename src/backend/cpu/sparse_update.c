/* The embedding backward fused with the sparse optimizer's update (the
 * bag_backward_update op; the optimizer's object is sparse_optim.c).
 *
 * A batch touches a few hundred thousand rows of a table of tens of millions,
 * so the backward never forms the table's gradient. It lists one
 * (row, bag) item per id of the batch, sorts the items by row, and walks the
 * sorted list: each run of equal rows is one unique row, whose gradient is
 * the sum of its bags' output gradients, and the optimizer updates that row
 * in place right away, while its gradient is still in L1.
 *
 * Determinism: items are listed in (column, sample, position) order and the
 * radix sort is stable, so the sorted list is unique, whatever the number of
 * threads; each row's gradient is then summed in list order by one thread.
 * Threads split the sorted list into fixed chunks, each handling the runs
 * that start in its chunk, so no two threads ever update the same row and no
 * atomics are needed.
 *
 * Dense Adam and a table-wide L2 (dlrec_sparse_optim_sweeps) then sweep the
 * table: every row the sorted list does not hold gets the same update with
 * the gradient it has in a dense backward, zero (plus weight_decay * w for
 * the table-wide L2). Threads take fixed ranges of rows; each range finds
 * its first touched row in the sorted list by a binary search.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/dtype.h"
#include "backend/sparse_optim_impl.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Radix sort: digits of at most 8 bits, and the list cut into at most
 * SORT_CHUNKS_MAX chunks that are counted and scattered in parallel (their
 * histograms live in the scratch). */
#define RADIX_BITS_MAX 8
#define RADIX_MAX (1u << RADIX_BITS_MAX)
#define SORT_CHUNKS_MAX 64
#define SORT_CHUNK_MIN 2048 /* items: smaller chunks cost more in histograms than they save */
/* Items of the sorted list per unit of work in the update phase. */
#define APPLY_CHUNK 512
/* Items ahead whose table row, optimizer state and output gradient are
 * prefetched: the sorted rows are far apart in a large table, so each is a
 * cache (and often TLB) miss that only overlapping can hide. */
#define PREFETCH_ITEMS 16
/* Lists shorter than this are sorted and applied on one thread. */
#define PARALLEL_MIN 8192
/* Rows per unit of work of the sweep over the table. */
#define SWEEP_ROWS 4096
static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* ---- scratch -------------------------------------------------------------- */

/* The scratch: the histograms, then two item lists of max_ids each (the
 * sort's source and destination), from the first 64-byte boundary. */
static size_t scratch_need(uint64_t n_items) {
  return 64 + align64((size_t)SORT_CHUNKS_MAX * RADIX_MAX * sizeof(uint32_t)) + 2 * align64(n_items * sizeof(uint64_t));
}

size_t dlrec_bag_backward_scratch_bytes(const dlrec_table *t, uint64_t max_ids) {
  (void)t; /* the table's width may matter to later versions (reduced gradients in scratch) */
  if (max_ids > (SIZE_MAX / 4) / sizeof(uint64_t)) return SIZE_MAX;
  return scratch_need(max_ids);
}

/* ---- the backward: list, sort, reduce and update ---------------------------- */

/* An item: the row in the high 32 bits, the bag (b * F + c) in the low 32. */
static ALWAYS_INLINE uint32_t item_row(uint64_t item) { return (uint32_t)(item >> 32); }
static ALWAYS_INLINE uint32_t item_bag(uint64_t item) { return (uint32_t)item; }

/* Lists the batch's items, column by column, into items. Column c's items go
 * to [base[c], base[c+1]), so the list's order is fixed by the batch alone.
 * Returns nonzero when a bag's offsets are out of order or an id is out of
 * range; bad bags are skipped, so nothing is written out of place. */
static int list_items(uint64_t *restrict items, const uint64_t *base, const dlrec_bag_batch *bags, uint64_t rows) {
  const uint32_t B = bags->rows, F = bags->cols;
  int bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad) if (base[F] >= PARALLEL_MIN)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
    const uint32_t first = off[0], last = off[B];
    uint64_t *out = items + base[c];
    for (uint32_t b = 0; b < B; b++) {
      const uint32_t lo = off[b], hi = off[b + 1];
      if (lo > hi || lo < first || hi > last) {
        bad = 1;
        continue;
      }
      const uint64_t bag = (uint64_t)b * F + c;
      for (uint32_t k = lo; k < hi; k++) {
        const uint32_t id = ids[k];
        bad |= id >= rows;
        out[k - first] = ((uint64_t)id << 32) | bag;
      }
    }
  }
  return bad;
}

/* Stable LSD radix sort of n items by their row (the high 32 bits), using
 * only as many bits as rows - 1 needs. Returns the sorted list: items or tmp.
 * hist holds SORT_CHUNKS_MAX x RADIX_MAX counters. */
static uint64_t *sort_items(uint64_t *items, uint64_t *tmp, size_t n, uint64_t rows, uint32_t *hist) {
  const int bits = rows > 1 ? 64 - __builtin_clzll(rows - 1) : 0;
  if (bits == 0 || n < 2) return items;
  const int passes = (bits + RADIX_BITS_MAX - 1) / RADIX_BITS_MAX;
  const int width = (bits + passes - 1) / passes;
  const uint32_t radix = 1u << width, mask = radix - 1;
  size_t chunks = n / SORT_CHUNK_MIN;
  if (chunks < 1) chunks = 1;
  if (chunks > SORT_CHUNKS_MAX) chunks = SORT_CHUNKS_MAX;
  const size_t per = (n + chunks - 1) / chunks;
  /* Every thread runs the pass loop; the worksharing loops split the chunks
   * and their implicit barriers order the passes. The chunking depends only
   * on n, though a stable sort's output would be the same for any. */
#pragma omp parallel if (n >= PARALLEL_MIN)
  {
    uint64_t *src = items, *dst = tmp;
    for (int p = 0; p < passes; p++) {
      const int shift = 32 + p * width;
#pragma omp for schedule(static)
      for (size_t k = 0; k < chunks; k++) {
        uint32_t *h = hist + k * radix;
        memset(h, 0, radix * sizeof(uint32_t));
        const size_t i1 = (k + 1) * per < n ? (k + 1) * per : n;
        for (size_t i = k * per; i < i1; i++) h[(src[i] >> shift) & mask]++;
      }
      /* Exclusive prefix in (digit, chunk) order: chunk k's items of digit d
       * land after every smaller digit and after earlier chunks' items of d,
       * which is what makes the sort stable. */
#pragma omp single
      {
        uint32_t sum = 0;
        for (uint32_t d = 0; d < radix; d++)
          for (size_t k = 0; k < chunks; k++) {
            uint32_t v = hist[k * radix + d];
            hist[k * radix + d] = sum;
            sum += v;
          }
      }
#pragma omp for schedule(static)
      for (size_t k = 0; k < chunks; k++) {
        uint32_t *h = hist + k * radix;
        const size_t i1 = (k + 1) * per < n ? (k + 1) * per : n;
        for (size_t i = k * per; i < i1; i++) dst[h[(src[i] >> shift) & mask]++] = src[i];
      }
      uint64_t *swap = src;
      src = dst;
      dst = swap;
    }
  }
  return passes % 2 ? tmp : items;
}

/* The optimizer's hyperparameters and state pointers, copied into a local
 * for the update loop. Through o, every store to a row's state (a float or
 * uint32_t) could alias o's own fields, and the compiler would reload them
 * for every element; a local whose address never escapes cannot alias. */
typedef struct row_update {
  dlrec_sparse_optim_kind kind;
  float lr, wd, beta1, beta2, eps;
  double log_beta1, log_beta2;
  size_t stride;
  float *accum, *m, *v;
  uint32_t *steps;
  dlrec_table_dtype dtype;
  size_t row_bytes;  /* the table's, stride elements of dtype */
  uint64_t sr_key;   /* this update's number, hashed: keys the stochastic rounding */
  const uint64_t *row_keys; /* dlrec_sparse_optim_set_row_keys's, or NULL */
  struct adam_scale *scale; /* the sweep's: the last step count's bias corrections, or NULL */
} row_update;

/* Adam's scalars for step count t. The sweep over a dense Adam's table,
 * whose rows all share one step count, computes them once per range
 * instead of once per row. */
typedef struct adam_scale {
  uint32_t t; /* 0: none yet */
  float step_size, inv_sqrt_bc2;
} adam_scale;

static ALWAYS_INLINE row_update row_update_of(const dlrec_sparse_optim *o) {
  const row_update u = {o->cfg.kind, o->cfg.lr,  o->cfg.weight_decay, o->cfg.beta1, o->cfg.beta2, o->cfg.eps,
                        o->log_beta1, o->log_beta2, o->stride,         o->accum,      o->m,         o->v,
                        o->steps,     o->dtype,     (size_t)o->stride * dlrec_table_dtype_bytes(o->dtype),
                        dtype_sr_key(o->updates), o->row_keys, NULL};
  return u;
}

/* 1 - beta^t = -expm1(t log beta) keeps the corrections accurate when t is
 * small. */
static adam_scale adam_scale_of(const row_update *u, uint32_t t) {
  const double bc1 = -expm1((double)t * u->log_beta1), bc2 = -expm1((double)t * u->log_beta2);
  const adam_scale s = {t, (float)(u->lr / bc1), (float)(1.0 / sqrt(bc2))};
  return s;
}

/* Applies the optimizer to row r (w, D floats), given its reduced gradient g. */
static ALWAYS_INLINE void update_row(const row_update *u, float *restrict w, const float *restrict g, uint32_t r,
                                     int D) {
  const float lr = u->lr, wd = u->wd;
  switch (u->kind) {
  case DLREC_SPARSE_SGD:
    for (int d = 0; d < D; d++) w[d] -= lr * (g[d] + wd * w[d]);
    break;
  case DLREC_SPARSE_ROWWISE_ADAGRAD: {
    /* One accumulator per row, fed with the row's mean squared gradient
     * (FBGEMM's exact row-wise Adagrad): 1/D of element-wise Adagrad's state. */
    float gw[DLREC_EMBED_MAX_DIM];
    float sq = 0.0f;
    for (int d = 0; d < D; d++) {
      gw[d] = g[d] + wd * w[d];
      sq += gw[d] * gw[d];
    }
    const float acc = u->accum[r] + sq / (float)D;
    u->accum[r] = acc;
    const float step = lr / (sqrtf(acc) + u->eps);
    for (int d = 0; d < D; d++) w[d] -= step * gw[d];
    break;
  }
  case DLREC_SPARSE_LAZY_ADAM:
  case DLREC_SPARSE_ADAM: {
    /* The row's own step count sets its bias correction: its moments have
     * averaged exactly that many gradients (Adam: every row's is the global
     * step, torch.optim.Adam's). The arithmetic is torch's up to float
     * rounding: it updates m by lerp (m + (1-b1)(g - m)) and divides m by the
     * denominator before scaling by the step size. */
    const uint32_t t = ++u->steps[r];
    adam_scale sc;
    if (u->scale && u->scale->t == t) {
      sc = *u->scale;
    } else {
      sc = adam_scale_of(u, t);
      if (u->scale) *u->scale = sc;
    }
    const float step_size = sc.step_size, inv_sqrt_bc2 = sc.inv_sqrt_bc2;
    const float b1 = u->beta1, b2 = u->beta2, eps = u->eps;
    float *restrict m = u->m + (size_t)r * u->stride, *restrict v = u->v + (size_t)r * u->stride;
    for (int d = 0; d < D; d++) {
      const float gd = g[d] + wd * w[d];
      m[d] = b1 * m[d] + (1.0f - b1) * gd;
      v[d] = b2 * v[d] + (1.0f - b2) * gd * gd;
      w[d] -= step_size * m[d] / (sqrtf(v[d]) * inv_sqrt_bc2 + eps);
    }
    break;
  }
  }
}

/* Asks for the memory that an item's row will need. Several items of one
 * row prefetch the same lines, which is cheap: they hit the cache. */
static ALWAYS_INLINE void prefetch_item(const row_update *u, const char *data, const float *d_out, uint64_t item,
                                        int D) {
  const uint32_t r = item_row(item);
  __builtin_prefetch(d_out + (size_t)item_bag(item) * D);
  __builtin_prefetch(data + (size_t)r * u->row_bytes, 1);
  if (u->accum) __builtin_prefetch(u->accum + r, 1);
  if (u->m) {
    __builtin_prefetch(u->m + (size_t)r * u->stride, 1);
    __builtin_prefetch(u->v + (size_t)r * u->stride, 1);
    __builtin_prefetch(u->steps + r, 1);
  }
}

/* Walks the runs of rows that start in chunk q of the sorted items: sums
 * each unique row's gradient in list order and updates the row. D is fixed
 * at compile time where the caller passes a constant. */
/* Updates a 16-bit row (bf16 when bf16 is nonzero, else fp16): widened to
 * fp32, the fp32 update, then stored with stochastic rounding drawn from
 * (counter, row, coordinate) alone, so the result does not depend on which
 * thread takes the row. */
static ALWAYS_INLINE void update_row16(const row_update *u, uint16_t *restrict w16, const float *restrict g,
                                       uint32_t r, int bf16, int D) {
  float w[DLREC_EMBED_MAX_DIM];
  if (bf16)
    for (int d = 0; d < D; d++) w[d] = dtype_bf16_to_f32(w16[d]);
  else
    for (int d = 0; d < D; d++) w[d] = dtype_fp16_to_f32(w16[d]);
  update_row(u, w, g, r, D);
  for (int k = 0; k < D; k += 4) {
    const uint32_t key_row = u->row_keys ? (uint32_t)u->row_keys[r] : r;
    const uint64_t draws = dtype_sr_draws_keyed(u->sr_key, key_row, (uint32_t)k / 4);
    for (int j = 0; j < 4 && k + j < D; j++) {
      const uint32_t draw = (uint32_t)(draws >> (16 * j)) & 0xffffu;
      w16[k + j] = bf16 ? dtype_f32_to_bf16_sr(w[k + j], draw) : dtype_f32_to_fp16_sr(w[k + j], draw);
    }
  }
}

/* Updates table row r, as the table stores it, given its gradient g. */
static ALWAYS_INLINE void update_stored(const row_update *u, char *restrict data, const float *restrict g, uint32_t r,
                                        int D) {
  if (u->dtype == DLREC_TABLE_FP32) update_row(u, (float *)(data + (size_t)r * u->row_bytes), g, r, D);
  else if (u->dtype == DLREC_TABLE_BF16) update_row16(u, (uint16_t *)(data + (size_t)r * u->row_bytes), g, r, 1, D);
  else update_row16(u, (uint16_t *)(data + (size_t)r * u->row_bytes), g, r, 0, D);
}

static ALWAYS_INLINE void reduce_chunk(const row_update *u, char *restrict data, const uint64_t *items, size_t n,
                                       size_t q, const float *restrict d_out, const dlrec_bag_batch *bags, int mean,
                                       int D) {
  const uint32_t F = bags->cols;
  const uint32_t *const *offsets = bags->offsets;
  size_t s = q * APPLY_CHUNK;
  const size_t hi = s + APPLY_CHUNK < n ? s + APPLY_CHUNK : n;
  /* A run that started in the previous chunk belongs to that chunk. */
  while (s < hi && s > 0 && item_row(items[s]) == item_row(items[s - 1])) s++;
  float g[DLREC_EMBED_MAX_DIM];
  while (s < hi) {
    const uint32_t r = item_row(items[s]);
    for (int d = 0; d < D; d++) g[d] = 0.0f;
    size_t e = s;
    for (; e < n && item_row(items[e]) == r; e++) {
      if (e + PREFETCH_ITEMS < n) prefetch_item(u, data, d_out, items[e + PREFETCH_ITEMS], D);
      const uint32_t bag = item_bag(items[e]);
      const float *restrict go = d_out + (size_t)bag * D;
      if (mean || (bags->mean_cols && bags->mean_cols[bag % F])) {
        const uint32_t b = bag / F, c = bag - b * F;
        const float inv = 1.0f / (float)(offsets[c][b + 1] - offsets[c][b]);
        for (int d = 0; d < D; d++) g[d] += inv * go[d];
      } else {
        for (int d = 0; d < D; d++) g[d] += go[d];
      }
    }
    update_stored(u, data, g, r, D);
    s = e;
  }
}

/* One chunk with D a compile-time constant for common widths. The switch
 * sits inside the parallel loop because GCC outlines an OpenMP region before
 * inlining, so a region inside an inlined helper would see D at run time. */
static void reduce_one(const dlrec_sparse_optim *o, char *data, const uint64_t *items, size_t n, size_t q,
                       const float *d_out, const dlrec_bag_batch *bags, int mean) {
  const row_update u = row_update_of(o);
  switch (o->dim) {
  case 16: reduce_chunk(&u, data, items, n, q, d_out, bags, mean, 16); break;
  case 32: reduce_chunk(&u, data, items, n, q, d_out, bags, mean, 32); break;
  case 64: reduce_chunk(&u, data, items, n, q, d_out, bags, mean, 64); break;
  case 128: reduce_chunk(&u, data, items, n, q, d_out, bags, mean, 128); break;
  default: reduce_chunk(&u, data, items, n, q, d_out, bags, mean, (int)o->dim); break;
  }
}

/* ---- the sweep over the untouched rows ---------------------------------------- */

/* The first of the n sorted items whose row is at least r. */
static size_t first_item_from(const uint64_t *items, size_t n, uint64_t r) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (item_row(items[mid]) < r) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Updates the rows of range q (SWEEP_ROWS rows) that the sorted items do
 * not hold, with a zero gradient (u's weight decay adds its own term). */
static ALWAYS_INLINE void sweep_chunk(const row_update *u, char *restrict data, const uint64_t *items, size_t n,
                                      uint64_t rows, size_t q, int D) {
  const uint64_t r0 = (uint64_t)q * SWEEP_ROWS, r1 = r0 + SWEEP_ROWS < rows ? r0 + SWEEP_ROWS : rows;
  float zero[DLREC_EMBED_MAX_DIM];
  for (int d = 0; d < D; d++) zero[d] = 0.0f;
  size_t k = first_item_from(items, n, r0);
  for (uint64_t r = r0; r < r1; r++) {
    if (k < n && item_row(items[k]) == r) {
      while (k < n && item_row(items[k]) == r) k++;
      continue;
    }
    update_stored(u, data, zero, (uint32_t)r, D);
  }
}

/* One range of the sweep, D a constant for common widths (as reduce_one). */
static void sweep_one(const dlrec_sparse_optim *o, char *data, const uint64_t *items, size_t n, size_t q) {
  row_update u = row_update_of(o);
  /* A touched-rows L2 leaves the untouched rows' gradient zero. */
  if (o->cfg.l2_scope != DLREC_SPARSE_L2_TABLE) u.wd = 0.0f;
  adam_scale scale = {0, 0.0f, 0.0f};
  u.scale = &scale;
  switch (o->dim) {
  case 16: sweep_chunk(&u, data, items, n, o->rows, q, 16); break;
  case 32: sweep_chunk(&u, data, items, n, o->rows, q, 32); break;
  case 64: sweep_chunk(&u, data, items, n, o->rows, q, 64); break;
  default: sweep_chunk(&u, data, items, n, o->rows, q, (int)o->dim); break;
  }
}

/* Every row that the n sorted items do not hold, as a dense backward would
 * update it (dlrec_sparse_optim_sweeps). */
static void sweep_untouched(const dlrec_sparse_optim *o, char *data, const uint64_t *sorted, size_t n) {
  const size_t ranges = (size_t)((o->rows + SWEEP_ROWS - 1) / SWEEP_ROWS);
#pragma omp parallel for schedule(static) if (ranges > 1)
  for (size_t q = 0; q < ranges; q++) sweep_one(o, data, sorted, n, q);
}

dlrec_status cpu_bag_backward_update(dlrec_table *t, dlrec_sparse_optim *o, const dlrec_bag_batch *bags,
                                       dlrec_pooling mode, const float *d_out, void *scratch, size_t scratch_bytes) {
  if (!t || !o || !bags || !d_out) return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: NULL argument");
  if (o->table != t) return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: the optimizer is another table's");
  if (mode != DLREC_POOLING_SUM && mode != DLREC_POOLING_MEAN)
    return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: unknown mode %d", (int)mode);
  const uint32_t B = bags->rows, F = bags->cols;
  if (F < 1 || !bags->offsets || !bags->ids || (uint64_t)B * F > UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: bad batch shape (%u samples, %u columns)", B, F);
  if (F > DLREC_BAG_MAX_COLS)
    return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: %u columns, at most %d", F, DLREC_BAG_MAX_COLS);
  /* Where each column's items start in the list; a column whose offsets end
   * before they begin is caught here, before any count is trusted. */
  uint64_t base[DLREC_BAG_MAX_COLS + 1];
  base[0] = 0;
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c];
    if (!off || !bags->ids[c])
      return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: column %u: NULL offsets or ids", c);
    if (off[B] < off[0])
      return dlrec_error(DLREC_ERR_INVALID, "embedding batch: column %u: offsets end (%u) before they begin (%u)", c,
                         off[B], off[0]);
    base[c + 1] = base[c] + (off[B] - off[0]);
  }
  const uint64_t n = base[F];
  const int sweep = dlrec_sparse_optim_sweeps(&o->cfg);
  if (sweep && o->row_keys)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "bag_backward_update: dense Adam and a table-wide L2 update every row of "
                       "the logical table, which this table (a cache, shard or hot part of it) does not hold");
  if (n == 0) {
    if (!sweep) return DLREC_OK;
    sweep_untouched(o, dlrec_table_raw(t), NULL, 0); /* every row untouched, as a dense step has them */
    o->updates++;
    return DLREC_OK;
  }
  if (n > UINT32_MAX) /* the sort counts in 32 bits */
    return dlrec_error(DLREC_ERR_INVALID, "bag_backward_update: %llu ids in one batch, at most 2^32 - 1",
                       (unsigned long long)n);
  const size_t need = scratch_need(n);
  if (!scratch || scratch_bytes < need)
    return dlrec_error(DLREC_ERR_INVALID,
                       "bag_backward_update: scratch of %zu bytes; this batch of %llu ids needs %zu "
                       "(plan it with dlrec_bag_backward_scratch_bytes)",
                       scratch_bytes, (unsigned long long)n, need);
  char *p = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  uint32_t *hist = (uint32_t *)p;
  uint64_t *items = (uint64_t *)(p + align64((size_t)SORT_CHUNKS_MAX * RADIX_MAX * sizeof(uint32_t)));
  uint64_t *tmp = items + align64(n * sizeof(uint64_t)) / sizeof(uint64_t);

  if (list_items(items, base, bags, o->rows)) {
    /* Nothing has changed yet; the slow check names the first bad id. */
    if (dlrec_bag_check(t, bags) == DLREC_OK)
      return dlrec_error(DLREC_ERR_INTERNAL, "bag_backward_update: a bad bag that bag_check accepts");
    return dlrec_error_context("bag_backward_update: ");
  }
  const uint64_t *sorted = sort_items(items, tmp, n, o->rows, hist);
  char *data = dlrec_table_raw(t);
  const int mean = mode == DLREC_POOLING_MEAN;
  /* Chunks are a fixed cut of the sorted list; which thread takes which
   * does not matter, since every row is updated by the chunk its run starts
   * in. */
  const size_t chunks = (n + APPLY_CHUNK - 1) / APPLY_CHUNK;
#pragma omp parallel for schedule(dynamic, 1) if (n >= PARALLEL_MIN)
  for (size_t q = 0; q < chunks; q++) reduce_one(o, data, sorted, n, q, d_out, bags, mean);
  if (sweep) sweep_untouched(o, data, sorted, n);
  o->updates++;
  return DLREC_OK;
}
