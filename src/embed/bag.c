/* Embedding bag lookups: pooling each sample's rows per column (forward), and
 * the checks of a batch against a table. The backward, fused with the
 * optimizer, is in sparse_optim.c.
 *
 * The forward is a gather: for Criteo-like data nearly every id is a random
 * row of a table far larger than the caches, so its speed is the memory
 * system's latency and the number of misses in flight. Rows are padded to
 * 16 bytes (with dim 16, one row is one cache line), samples are split over
 * threads, and the rows of a sample a few places ahead are prefetched so
 * that several misses overlap.
 */
#include <string.h>

#include "dlrec/embed.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Samples ahead whose rows are prefetched. */
#define PREFETCH_SAMPLES 4

/* The checks that need no pass over the data. */
static dlrec_status check_shape(const dlrec_table *t, const dlrec_bag_batch *bags, const char *what) {
  if (!t || !bags) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL argument", what);
  if (bags->cols < 1 || bags->cols > DLREC_BAG_MAX_COLS || !bags->offsets || !bags->ids)
    return dlrec_error(DLREC_ERR_INVALID, "%s: a batch needs 1 to %d columns with offsets and ids (has %u)", what,
                       DLREC_BAG_MAX_COLS, bags->cols);
  /* The backward numbers each bag b * F + c in 32 bits. */
  if ((uint64_t)bags->rows * bags->cols > UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %u samples x %u columns is too many bags", what, bags->rows,
                       bags->cols);
  for (uint32_t c = 0; c < bags->cols; c++)
    if (!bags->offsets[c] || !bags->ids[c])
      return dlrec_error(DLREC_ERR_INVALID, "%s: column %u: NULL offsets or ids", what, c);
  return DLREC_OK;
}

dlrec_status dlrec_bag_check(const dlrec_table *t, const dlrec_bag_batch *bags) {
  dlrec_status st = check_shape(t, bags, "bag_check");
  if (st != DLREC_OK) return st;
  const uint64_t rows = dlrec_table_rows(t);
  for (uint32_t c = 0; c < bags->cols; c++) {
    const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
    for (uint32_t b = 0; b < bags->rows; b++) {
      if (off[b + 1] < off[b])
        return dlrec_error(DLREC_ERR_INVALID, "embedding batch: column %u, sample %u: offsets decrease (%u then %u)",
                           c, b, off[b], off[b + 1]);
      for (uint32_t k = off[b]; k < off[b + 1]; k++)
        if (ids[k] >= rows)
          return dlrec_error(DLREC_ERR_INVALID,
                             "embedding batch: column %u, sample %u: id %u is outside the table of %llu rows", c, b,
                             ids[k], (unsigned long long)rows);
    }
  }
  return DLREC_OK;
}

/* Pools sample b's bags into out (F, D), with D fixed at compile time where
 * the caller passes a constant. Returns nonzero when a bag had offsets out
 * of order or an id out of range; such a bag is skipped (its output is
 * unspecified), never read past. */
static ALWAYS_INLINE int pool_sample(const float *restrict data, uint32_t stride, uint64_t rows,
                                     const dlrec_bag_batch *bags, int mean, uint32_t b, float *restrict out, int D) {
  const uint32_t B = bags->rows, F = bags->cols;
  int bad = 0;
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
    if (b + PREFETCH_SAMPLES < B) {
      const uint32_t k = off[b + PREFETCH_SAMPLES];
      if (k < off[b + PREFETCH_SAMPLES + 1] && k < off[B] && ids[k] < rows)
        __builtin_prefetch(data + (size_t)ids[k] * stride);
    }
    float *restrict o = out + (size_t)c * D;
    const uint32_t lo = off[b], hi = off[b + 1];
    /* Offsets out of order could point past the column's ids: such a bag is
     * reported, never read. */
    if (hi <= lo || lo < off[0] || hi > off[B]) {
      bad |= hi < lo || lo < off[0] || hi > off[B];
      for (int d = 0; d < D; d++) o[d] = 0.0f;
      continue;
    }
    /* The first row is copied, the others added, in the bag's order. */
    int first = 1;
    for (uint32_t k = lo; k < hi; k++) {
      const uint32_t id = ids[k];
      if (id >= rows) {
        bad = 1;
        continue;
      }
      const float *restrict row = data + (size_t)id * stride;
      if (first)
        for (int d = 0; d < D; d++) o[d] = row[d];
      else
        for (int d = 0; d < D; d++) o[d] += row[d];
      first = 0;
    }
    if (mean) {
      const float inv = 1.0f / (float)(hi - lo);
      for (int d = 0; d < D; d++) o[d] *= inv;
    }
  }
  return bad;
}

/* One sample with D a compile-time constant for common widths. The switch
 * sits inside the parallel loop because GCC outlines an OpenMP region before
 * inlining, so a region inside an inlined helper would see D at run time. */
static int pool_one(const float *data, uint32_t stride, uint64_t rows, const dlrec_bag_batch *bags, int mean,
                    uint32_t b, float *out, uint32_t dim) {
  switch (dim) {
  case 16: return pool_sample(data, stride, rows, bags, mean, b, out, 16);
  case 32: return pool_sample(data, stride, rows, bags, mean, b, out, 32);
  case 64: return pool_sample(data, stride, rows, bags, mean, b, out, 64);
  case 128: return pool_sample(data, stride, rows, bags, mean, b, out, 128);
  default: return pool_sample(data, stride, rows, bags, mean, b, out, (int)dim);
  }
}

dlrec_status dlrec_bag_forward(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_bag_mode mode, float *out) {
  dlrec_status st = check_shape(t, bags, "bag_forward");
  if (st != DLREC_OK) return st;
  if (!out) return dlrec_error(DLREC_ERR_INVALID, "bag_forward: NULL output");
  if (mode != DLREC_BAG_SUM && mode != DLREC_BAG_MEAN)
    return dlrec_error(DLREC_ERR_INVALID, "bag_forward: unknown mode %d", (int)mode);
  const float *data = dlrec_table_data_const(t);
  const uint32_t stride = dlrec_table_stride(t), dim = dlrec_table_dim(t);
  const uint64_t rows = dlrec_table_rows(t);
  const int mean = mode == DLREC_BAG_MEAN;
  const uint32_t B = bags->rows, F = bags->cols;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (B > 32)
  for (uint32_t b = 0; b < B; b++) bad |= pool_one(data, stride, rows, bags, mean, b, out + (size_t)b * F * dim, dim);
  /* The lookup checked as it went; the slow pass runs only to name the
   * first bad id in the error. */
  if (bad) {
    if (dlrec_bag_check(t, bags) == DLREC_OK)
      return dlrec_error(DLREC_ERR_INTERNAL, "bag_forward: a bad bag that bag_check accepts");
    return dlrec_error_context("bag_forward: ");
  }
  return DLREC_OK;
}
