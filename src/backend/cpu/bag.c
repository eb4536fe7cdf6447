/* Embedding bag lookups: pooling each sample's rows per column (forward), and
 * the checks of a batch against a table. The backward, fused with the
 * optimizer, is in sparse_optim.c.
 *
 * The forward is a gather: for Criteo-like data nearly every id is a random
 * row of a table far larger than the caches, so its speed is the memory
 * system's latency and the number of misses in flight. Rows are padded to
 * 16 bytes (with dim 16, one row is one cache line) and samples are split
 * over threads in chunks of up to 256. Columns with exactly one id per
 * sample (Criteo's, checked per batch) are pooled sample by sample, reading
 * no per-bag offsets, writing the output in order and prefetching every
 * column's row ONE_HOT_AHEAD samples ahead, so that many misses overlap;
 * multi-hot columns are pooled a column at a time with the bag
 * PREFETCH_SAMPLES ahead prefetched. bench_roofline compares the lookup
 * with a plain prefetching gather of the same ids, warm and cold.
 */
#include <omp.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/dtype.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Samples ahead whose rows are prefetched. */
#define PREFETCH_SAMPLES 8

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

/* Column c's first problem (offsets that decrease, an id outside the
 * table's rows), reported as an error when `report`; 0 when it has none.
 * Without report it touches no error state, so columns check in parallel. */
static int check_column(const dlrec_bag_batch *bags, uint32_t c, uint64_t rows, int report) {
  const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
  for (uint32_t b = 0; b < bags->rows; b++) {
    if (off[b + 1] < off[b]) {
      if (report)
        dlrec_error(DLREC_ERR_INVALID, "embedding batch: column %u, sample %u: offsets decrease (%u then %u)", c, b,
                    off[b], off[b + 1]);
      return 1;
    }
    for (uint32_t k = off[b]; k < off[b + 1]; k++)
      if (ids[k] >= rows) {
        if (report)
          dlrec_error(DLREC_ERR_INVALID,
                      "embedding batch: column %u, sample %u: id %u is outside the table of %llu rows", c, b, ids[k],
                      (unsigned long long)rows);
        return 1;
      }
  }
  return 0;
}

/* The columns in parallel (a GPU's bag ops check every batch on the host
 * before sending it), then the first bad column's first problem reported,
 * the same one as a pass in order would find. */
dlrec_status dlrec_bag_check(const dlrec_table *t, const dlrec_bag_batch *bags) {
  dlrec_status st = check_shape(t, bags, "bag_check");
  if (st != DLREC_OK) return st;
  const uint64_t rows = dlrec_table_rows(t);
  const int F = (int)bags->cols;
  uint8_t bad[DLREC_BAG_MAX_COLS];
#pragma omp parallel for schedule(dynamic) if ((uint64_t)bags->rows * bags->cols >= 32768)
  for (int c = 0; c < F; c++) bad[c] = (uint8_t)check_column(bags, (uint32_t)c, rows, 0);
  for (int c = 0; c < F; c++)
    if (bad[c]) return check_column(bags, (uint32_t)c, rows, 1) ? dlrec_last_status() : DLREC_ERR_INTERNAL;
  return DLREC_OK;
}

/* 1 when every sample of the column has exactly one id (off[b] = off[0] + b),
 * as Criteo's columns do: the lookup then skips the per-bag offsets. One
 * sequential pass over B + 1 offsets, against B random row reads. */
static uint8_t is_one_hot(const uint32_t *off, uint32_t B) {
  uint32_t diff = 0;
  for (uint32_t b = 0; b <= B; b++) diff |= off[b] ^ (off[0] + b);
  return diff == 0;
}

/* A 16-bit element widened: bf16 when bf16 is nonzero (a constant at every
 * call, so each loop is compiled for one format), else fp16. */
static ALWAYS_INLINE float widen(uint16_t h, int bf16) { return bf16 ? dtype_bf16_to_f32(h) : dtype_fp16_to_f32(h); }

/* Pools bag b of a column (its offsets off, B + 1 of them, and ids) into o
 * (D floats): the first row copied, the others added, in the bag's order,
 * then times 1 / count for a mean; zeros for an empty bag. data is an fp32
 * table's, or with is16 rows16 a 16-bit one's, each row widened to fp32
 * (bf16 or fp16 by bf16), so that its pooling is bitwise the fp32 pooling of
 * the widened rows (is16 and bf16 are constants at every call, so each loop
 * is compiled for one format). Returns nonzero when the bag's offsets are
 * out of order (the bag is then not read: they could point past the
 * column's ids) or an id is out of range (skipped); o is then unspecified. */
static ALWAYS_INLINE int pool_bag(const float *restrict data, const uint16_t *restrict rows16, int is16, int bf16,
                                  uint32_t stride, uint64_t rows, const uint32_t *off, const uint32_t *ids,
                                  uint32_t B, uint32_t b, int mean, float *restrict o, int D) {
  const uint32_t lo = off[b], hi = off[b + 1];
  if (hi <= lo || lo < off[0] || hi > off[B]) {
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    return hi < lo || lo < off[0] || hi > off[B];
  }
  int bad = 0, first = 1;
  for (uint32_t k = lo; k < hi; k++) {
    const uint32_t id = ids[k];
    if (id >= rows) {
      bad = 1;
      continue;
    }
    if (is16) {
      const uint16_t *restrict row = rows16 + (size_t)id * stride;
      if (first)
        for (int d = 0; d < D; d++) o[d] = widen(row[d], bf16);
      else
        for (int d = 0; d < D; d++) o[d] += widen(row[d], bf16);
    } else {
      const float *restrict row = data + (size_t)id * stride;
      if (first)
        for (int d = 0; d < D; d++) o[d] = row[d];
      else
        for (int d = 0; d < D; d++) o[d] += row[d];
    }
    first = 0;
  }
  if (mean) {
    const float inv = 1.0f / (float)(hi - lo);
    for (int d = 0; d < D; d++) o[d] *= inv;
  }
  return bad;
}

/* Pools column c (multi-hot) of samples [b0, b1) into out (B, F, D), with D
 * fixed at compile time where the caller passes a constant. Returns nonzero
 * when a bag had offsets out of order or an id out of range (pool_bag). */
static ALWAYS_INLINE int pool_column(const float *restrict data, uint32_t stride, uint64_t rows,
                                     const dlrec_bag_batch *bags, int mean, uint32_t c, uint32_t b0, uint32_t b1,
                                     float *restrict out, int D) {
  const uint32_t B = bags->rows, F = bags->cols;
  const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
  int bad = 0;
  for (uint32_t b = b0; b < b1; b++) {
    if (b + PREFETCH_SAMPLES < b1) {
      const uint32_t k = off[b + PREFETCH_SAMPLES];
      if (k < off[b + PREFETCH_SAMPLES + 1] && k < off[B] && ids[k] < rows)
        __builtin_prefetch(data + (size_t)ids[k] * stride);
    }
    bad |= pool_bag(data, NULL, 0, 0, stride, rows, off, ids, B, b, mean, out + ((size_t)b * F + c) * D, D);
  }
  return bad;
}

/* A thread's samples [b0, b1), column by column, with D a compile-time
 * constant for common widths. The switch sits inside the parallel region
 * because GCC outlines an OpenMP region before inlining, so a region inside
 * an inlined helper would see D at run time. */
/* The one-hot columns (hot[c] != NULL: sample b's id is hot[c][b]) of
 * samples [b0, b1), sample by sample: the output is written in order, and
 * the rows of the sample ONE_HOT_AHEAD places ahead are prefetched across
 * every column, so that many misses are in flight even with cold caches. */
#define ONE_HOT_AHEAD 4
static ALWAYS_INLINE int pool_one_hot(const float *restrict data, uint32_t stride, uint64_t rows,
                                      const uint32_t *const *hot, uint32_t F, uint32_t b0, uint32_t b1,
                                      float *restrict out, int D) {
  int bad = 0;
  for (uint32_t b = b0; b < b1; b++) {
    float *restrict o = out + (size_t)b * F * D;
    const int ahead = b + ONE_HOT_AHEAD < b1;
    for (uint32_t c = 0; c < F; c++) {
      const uint32_t *col = hot[c];
      if (!col) continue;
      if (ahead && col[b + ONE_HOT_AHEAD] < rows) __builtin_prefetch(data + (size_t)col[b + ONE_HOT_AHEAD] * stride);
      const uint32_t id = col[b];
      if (id >= rows) {
        bad = 1;
        continue;
      }
      const float *restrict row = data + (size_t)id * stride;
      for (int d = 0; d < D; d++) o[(size_t)c * D + d] = row[d];
    }
  }
  return bad;
}

static int pool_range(const float *data, uint32_t stride, uint64_t rows, const dlrec_bag_batch *bags,
                      const uint32_t *const *hot, int any_hot, int mean, uint32_t b0, uint32_t b1, float *out,
                      uint32_t dim) {
  int bad = 0;
  const uint32_t F = bags->cols;
  if (any_hot) switch (dim) {
    case 16: bad |= pool_one_hot(data, stride, rows, hot, F, b0, b1, out, 16); break;
    case 32: bad |= pool_one_hot(data, stride, rows, hot, F, b0, b1, out, 32); break;
    case 64: bad |= pool_one_hot(data, stride, rows, hot, F, b0, b1, out, 64); break;
    case 128: bad |= pool_one_hot(data, stride, rows, hot, F, b0, b1, out, 128); break;
    default: bad |= pool_one_hot(data, stride, rows, hot, F, b0, b1, out, (int)dim); break;
    }
  for (uint32_t c = 0; c < F; c++) {
    if (hot[c]) continue;
    const int m = mean || (bags->mean_cols && bags->mean_cols[c]);
    switch (dim) {
    case 16: bad |= pool_column(data, stride, rows, bags, m, c, b0, b1, out, 16); break;
    case 32: bad |= pool_column(data, stride, rows, bags, m, c, b0, b1, out, 32); break;
    case 64: bad |= pool_column(data, stride, rows, bags, m, c, b0, b1, out, 64); break;
    case 128: bad |= pool_column(data, stride, rows, bags, m, c, b0, b1, out, 128); break;
    default: bad |= pool_column(data, stride, rows, bags, m, c, b0, b1, out, (int)dim); break;
    }
  }
  return bad;
}

/* Pools samples [b0, b1) of a 16-bit table sample by sample, every column:
 * each row is widened to fp32 and the bag summed in fp32 in the bag's order,
 * first row copied, exactly as the fp32 path pools, so the output is bitwise
 * the fp32 pooling of the widened rows. One-hot columns (hot[c]) skip the
 * offsets, as there; the rows of the sample ONE_HOT_AHEAD places ahead are
 * prefetched across the columns. Half the bytes of an fp32 row are gathered. */
static ALWAYS_INLINE int pool16(const uint16_t *restrict data, uint32_t stride, uint64_t rows,
                                const dlrec_bag_batch *bags, const uint32_t *const *hot, int mean, int bf16,
                                uint32_t b0, uint32_t b1, float *restrict out, int D) {
  const uint32_t B = bags->rows, F = bags->cols;
  int bad = 0;
  for (uint32_t b = b0; b < b1; b++) {
    const int ahead = b + ONE_HOT_AHEAD < b1;
    for (uint32_t c = 0; c < F; c++) {
      float *restrict o = out + ((size_t)b * F + c) * D;
      const uint32_t *col = hot[c];
      if (col) {
        if (ahead && col[b + ONE_HOT_AHEAD] < rows)
          __builtin_prefetch(data + (size_t)col[b + ONE_HOT_AHEAD] * stride);
        const uint32_t id = col[b];
        if (id >= rows) {
          bad = 1;
          continue;
        }
        const uint16_t *restrict row = data + (size_t)id * stride;
        for (int d = 0; d < D; d++) o[d] = widen(row[d], bf16);
        continue;
      }
      const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
      if (ahead) {
        const uint32_t k = off[b + ONE_HOT_AHEAD];
        if (k < off[b + ONE_HOT_AHEAD + 1] && k < off[B] && ids[k] < rows)
          __builtin_prefetch(data + (size_t)ids[k] * stride);
      }
      bad |= pool_bag(NULL, data, 1, bf16, stride, rows, off, ids, B, b,
                      mean || (bags->mean_cols && bags->mean_cols[c]), o, D);
    }
  }
  return bad;
}

#define POOL16_DIMS(BF)                                                                         \
  switch (dim) {                                                                                \
  case 16: return pool16(data, stride, rows, bags, hot, mean, BF, b0, b1, out, 16);             \
  case 32: return pool16(data, stride, rows, bags, hot, mean, BF, b0, b1, out, 32);             \
  case 64: return pool16(data, stride, rows, bags, hot, mean, BF, b0, b1, out, 64);             \
  case 128: return pool16(data, stride, rows, bags, hot, mean, BF, b0, b1, out, 128);           \
  default: return pool16(data, stride, rows, bags, hot, mean, BF, b0, b1, out, (int)dim);       \
  }

static int pool16_range(const uint16_t *data, uint32_t stride, uint64_t rows, const dlrec_bag_batch *bags,
                        const uint32_t *const *hot, int mean, int bf16, uint32_t b0, uint32_t b1, float *out,
                        uint32_t dim) {
  if (bf16) POOL16_DIMS(1)
  POOL16_DIMS(0)
}

/* The arguments both forwards check (what: the function's name). */
static dlrec_status check_forward(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_pooling mode,
                                  const float *out, const char *what) {
  dlrec_status st = check_shape(t, bags, what);
  if (st != DLREC_OK) return st;
  if (!out) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL output", what);
  if (mode != DLREC_POOLING_SUM && mode != DLREC_POOLING_MEAN)
    return dlrec_error(DLREC_ERR_INVALID, "%s: unknown mode %d", what, (int)mode);
  return DLREC_OK;
}

/* A forward's bad flag turned into its error: the slow check names the
 * first bad id; the lookups check as they go, so this runs only on a bad
 * batch. */
static dlrec_status forward_error(const dlrec_table *t, const dlrec_bag_batch *bags, const char *what) {
  if (dlrec_bag_check(t, bags) == DLREC_OK)
    return dlrec_error(DLREC_ERR_INTERNAL, "%s: a bad bag that bag_check accepts", what);
  return dlrec_error_context("%s: ", what);
}

dlrec_status cpu_bag_forward(float *out, const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_pooling mode) {
  dlrec_status st = check_forward(t, bags, mode, out, "bag_forward");
  if (st != DLREC_OK) return st;
  const float *data = dlrec_table_data_const(t);
  const uint32_t stride = dlrec_table_stride(t), dim = dlrec_table_dim(t);
  const uint64_t rows = dlrec_table_rows(t);
  const int mean = mode == DLREC_POOLING_MEAN;
  const uint32_t B = bags->rows;
  int bad = 0;
  const uint32_t *hot[DLREC_BAG_MAX_COLS]; /* one-hot columns' ids by sample; NULL for the others */
  int any_hot = 0;
  for (uint32_t c = 0; c < bags->cols; c++) {
    hot[c] = is_one_hot(bags->offsets[c], B) ? bags->ids[c] + bags->offsets[c][0] : NULL;
    any_hot |= hot[c] != NULL;
  }
  /* Chunks of up to 256 samples, at least one per thread: each thread runs
   * a column's loop over a chunk. */
  const uint32_t threads = (uint32_t)omp_get_max_threads();
  uint32_t chunk = (B + threads - 1) / threads;
  chunk = chunk > 256 ? 256 : chunk < 16 ? 16 : chunk;
  const uint32_t chunks = (B + chunk - 1) / chunk;
  const dlrec_table_dtype dtype = dlrec_table_get_dtype(t);
  if (dtype == DLREC_TABLE_FP32) {
#pragma omp parallel for schedule(static) reduction(| : bad) if (B > 32)
    for (uint32_t k = 0; k < chunks; k++) {
      uint32_t b0 = k * chunk, b1 = b0 + chunk < B ? b0 + chunk : B;
      bad |= pool_range(data, stride, rows, bags, hot, any_hot, mean, b0, b1, out, dim);
    }
  } else {
    const uint16_t *data16 = dlrec_table_raw_const(t);
    const int bf16 = dtype == DLREC_TABLE_BF16;
#pragma omp parallel for schedule(static) reduction(| : bad) if (B > 32)
    for (uint32_t k = 0; k < chunks; k++) {
      uint32_t b0 = k * chunk, b1 = b0 + chunk < B ? b0 + chunk : B;
      bad |= pool16_range(data16, stride, rows, bags, hot, mean, bf16, b0, b1, out, dim);
    }
  }
  return bad ? forward_error(t, bags, "bag_forward") : DLREC_OK;
}

/* Pools the listed bags [i0, i1) (list[i] = b * F + c, checked) into
 * out + i * D, each as the whole-batch forward pools it (pool_bag: a one-hot
 * bag is a bag of one row, which it copies). The first row of the bag
 * PREFETCH_SAMPLES places ahead in the list is prefetched. */
static ALWAYS_INLINE int pool_list(const float *data, const uint16_t *data16, int is16, int bf16, uint32_t stride,
                                   uint64_t rows, const dlrec_bag_batch *bags, int mean, const uint32_t *list,
                                   size_t i0, size_t i1, float *out, int D) {
  const uint32_t B = bags->rows, F = bags->cols;
  int bad = 0;
  for (size_t i = i0; i < i1; i++) {
    if (i + PREFETCH_SAMPLES < i1) {
      const uint32_t b = list[i + PREFETCH_SAMPLES] / F, c = list[i + PREFETCH_SAMPLES] % F;
      const uint32_t *off = bags->offsets[c], k = off[b];
      if (k < off[b + 1] && k < off[B] && bags->ids[c][k] < rows) {
        const size_t at = (size_t)bags->ids[c][k] * stride;
        if (is16) __builtin_prefetch(data16 + at);
        else __builtin_prefetch(data + at);
      }
    }
    const uint32_t b = list[i] / F, c = list[i] % F;
    bad |= pool_bag(data, data16, is16, bf16, stride, rows, bags->offsets[c], bags->ids[c], B, b,
                    mean || (bags->mean_cols && bags->mean_cols[c]), out + i * D, D);
  }
  return bad;
}

#define POOL_LIST_DIMS(IS16, BF)                                                                          \
  switch (dim) {                                                                                          \
  case 16: return pool_list(data, data16, IS16, BF, stride, rows, bags, mean, list, i0, i1, out, 16);     \
  case 32: return pool_list(data, data16, IS16, BF, stride, rows, bags, mean, list, i0, i1, out, 32);     \
  case 64: return pool_list(data, data16, IS16, BF, stride, rows, bags, mean, list, i0, i1, out, 64);     \
  case 128: return pool_list(data, data16, IS16, BF, stride, rows, bags, mean, list, i0, i1, out, 128);   \
  default: return pool_list(data, data16, IS16, BF, stride, rows, bags, mean, list, i0, i1, out, (int)dim);\
  }

/* pool_list with the format and D constants in each loop: an fp32 table's
 * data, or a 16-bit one's data16 (bf16 or fp16 by bf16). */
static int pool_list_range(const float *data, const uint16_t *data16, int bf16, uint32_t stride, uint64_t rows,
                           const dlrec_bag_batch *bags, int mean, const uint32_t *list, size_t i0, size_t i1,
                           float *out, uint32_t dim) {
  if (!data16) POOL_LIST_DIMS(0, 0)
  if (bf16) POOL_LIST_DIMS(1, 1)
  POOL_LIST_DIMS(1, 0)
}

dlrec_status cpu_bag_forward_rows(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_pooling mode,
                                    const uint32_t *list, size_t n, float *out) {
  dlrec_status st = check_forward(t, bags, mode, out, "bag_forward_rows");
  if (st != DLREC_OK || !n) return st;
  if (!list) return dlrec_error(DLREC_ERR_INVALID, "bag_forward_rows: NULL list of %zu bags", n);
  const uint64_t bags_n = (uint64_t)bags->rows * bags->cols;
  for (size_t i = 0; i < n; i++)
    if (list[i] >= bags_n)
      return dlrec_error(DLREC_ERR_INVALID, "bag_forward_rows: list[%zu] is bag %u of a batch of %llu", i, list[i],
                         (unsigned long long)bags_n);
  const dlrec_table_dtype dtype = dlrec_table_get_dtype(t);
  const float *data = dtype == DLREC_TABLE_FP32 ? dlrec_table_data_const(t) : NULL;
  const uint16_t *data16 = dtype == DLREC_TABLE_FP32 ? NULL : dlrec_table_raw_const(t);
  const uint32_t stride = dlrec_table_stride(t), dim = dlrec_table_dim(t);
  const uint64_t rows = dlrec_table_rows(t);
  const int mean = mode == DLREC_POOLING_MEAN, bf16 = dtype == DLREC_TABLE_BF16;
  const size_t chunk = 256, chunks = (n + chunk - 1) / chunk;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n > 32)
  for (size_t k = 0; k < chunks; k++) {
    const size_t i0 = k * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    bad |= pool_list_range(data, data16, bf16, stride, rows, bags, mean, list, i0, i1, out, dim);
  }
  return bad ? forward_error(t, bags, "bag_forward_rows") : DLREC_OK;
}
