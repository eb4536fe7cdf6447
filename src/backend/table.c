/* The fused embedding table: anonymous-mmap storage, padded rows, and the
 * DLRM reference initialization drawn in thread-independent chunks.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/table.h"
#include "core/rng.h"
#include "backend/dtype.h"
#include "backend/table_store.h"

/* Rows drawn from one random stream during initialization. The value is part
 * of what a seed means: changing it changes every initial table. */
#define INIT_CHUNK_ROWS TABLE_INIT_CHUNK_ROWS

struct dlrec_table {
  uint64_t rows;
  uint32_t dim;
  uint32_t stride;
  dlrec_table_dtype dtype;
  void *data;       /* (rows, stride) elements of dtype, inside map */
  void *map;        /* the mapping that holds data, for munmap */
  size_t map_bytes; /* its length */
};

const char *dlrec_table_dtype_name(dlrec_table_dtype dtype) {
  switch (dtype) {
  case DLREC_TABLE_FP32: return "fp32";
  case DLREC_TABLE_BF16: return "bf16";
  case DLREC_TABLE_FP16: return "fp16";
  }
  return "?";
}

uint32_t dlrec_table_dtype_bytes(dlrec_table_dtype dtype) {
  switch (dtype) {
  case DLREC_TABLE_FP32: return 4;
  case DLREC_TABLE_BF16:
  case DLREC_TABLE_FP16: return 2;
  }
  return 0;
}

dlrec_status dlrec_table_create(dlrec_table **out, uint64_t rows, uint32_t dim) {
  return dlrec_table_create_dtype(out, rows, dim, DLREC_TABLE_FP32);
}

/* A handle for `rows` rows of dim values of dtype (stride: dim padded to a
 * multiple of 4), in *out, its shape checked; what == the caller's name.
 * The caller gives it its rows. */
static dlrec_status table_new(const char *what, dlrec_table **out, uint64_t rows, uint32_t dim,
                              dlrec_table_dtype dtype) {
  if (!out) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL result pointer", what);
  *out = NULL;
  if (!dlrec_table_dtype_bytes(dtype)) return dlrec_error(DLREC_ERR_INVALID, "%s: unknown dtype %d", what, (int)dtype);
  if (rows < 1 || rows > (1ull << 32))
    return dlrec_error(DLREC_ERR_INVALID, "%s: %llu rows; ids are 32-bit, so 1 to 2^32", what,
                       (unsigned long long)rows);
  if (dim < 1 || dim > DLREC_EMBED_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "%s: dim %u, must be 1 to %d", what, dim, DLREC_EMBED_MAX_DIM);
  dlrec_table *t = calloc(1, sizeof *t);
  if (!t) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", what);
  t->rows = rows;
  t->dim = dim;
  t->stride = (dim + 3) & ~3u;
  t->dtype = dtype;
  *out = t;
  return DLREC_OK;
}

dlrec_status dlrec_table_create_dtype(dlrec_table **out, uint64_t rows, uint32_t dim, dlrec_table_dtype dtype) {
  dlrec_status s = table_new("table_create", out, rows, dim, dtype);
  if (s != DLREC_OK) return s;
  dlrec_table *t = *out;
  /* rows <= 2^32 and stride <= 1024: the product fits in 64 bits, though not
   * necessarily in the address space. */
  const unsigned long long bytes = (unsigned long long)rows * t->stride * dlrec_table_dtype_bytes(dtype);
  /* Anonymous mappings are zero-filled (the padding's zeros come free) and
   * their pages are only backed when first touched, so a table larger than
   * what a run touches costs only what it touches. */
  void *p = MAP_FAILED;
  if (bytes > (unsigned long long)(SIZE_MAX / 2))
    s = dlrec_error(DLREC_ERR_NOMEM, "table_create: %llu bytes do not fit the address space", bytes);
  else if ((p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                     0)) == MAP_FAILED)
    s = dlrec_error(DLREC_ERR_NOMEM, "table_create: mmap of %llu bytes (%llu rows x %u %s): %s", bytes,
                    (unsigned long long)rows, t->stride, dlrec_table_dtype_name(dtype), strerror(errno));
  if (s != DLREC_OK) {
    free(t);
    *out = NULL;
    return s;
  }
#ifdef MADV_HUGEPAGE
  (void)madvise(p, (size_t)bytes, MADV_HUGEPAGE); /* a hint: without THP it fails harmlessly */
#endif
  t->data = p;
  t->map = p;
  t->map_bytes = (size_t)bytes;
  return DLREC_OK;
}

dlrec_status dlrec_table_wrap(dlrec_table **out, uint64_t rows, uint32_t dim, dlrec_table_dtype dtype, void *data) {
  dlrec_status s = table_new("table_wrap", out, rows, dim, dtype);
  if (s == DLREC_OK && !data) {
    free(*out);
    *out = NULL;
    s = dlrec_error(DLREC_ERR_INVALID, "table_wrap: NULL rows");
  }
  if (s == DLREC_OK) (*out)->data = data; /* map stays NULL: the rows are the caller's */
  return s;
}

void dlrec_table_free(dlrec_table *t) {
  if (!t) return;
  if (t->map) munmap(t->map, t->map_bytes);
  free(t);
}

void table_adopt(dlrec_table *t, void *map, size_t map_bytes, void *data) {
  munmap(t->map, t->map_bytes);
  t->map = map;
  t->map_bytes = map_bytes;
  t->data = data;
}

uint64_t dlrec_table_rows(const dlrec_table *t) { return t->rows; }
uint32_t dlrec_table_dim(const dlrec_table *t) { return t->dim; }
uint32_t dlrec_table_stride(const dlrec_table *t) { return t->stride; }
dlrec_table_dtype dlrec_table_get_dtype(const dlrec_table *t) { return t->dtype; }
float *dlrec_table_data(dlrec_table *t) { return t->dtype == DLREC_TABLE_FP32 ? t->data : NULL; }
const float *dlrec_table_data_const(const dlrec_table *t) { return t->dtype == DLREC_TABLE_FP32 ? t->data : NULL; }
void *dlrec_table_raw(dlrec_table *t) { return t->data; }
const void *dlrec_table_raw_const(const dlrec_table *t) { return t->data; }

void dlrec_table_get_row(const dlrec_table *t, uint64_t r, float *out) {
  const size_t at = (size_t)r * t->stride;
  const float *f = (const float *)t->data + at;
  const uint16_t *h = (const uint16_t *)t->data + at;
  switch (t->dtype) {
  case DLREC_TABLE_FP32: memcpy(out, f, t->dim * sizeof(float)); break;
  case DLREC_TABLE_BF16:
    for (uint32_t d = 0; d < t->dim; d++) out[d] = dtype_bf16_to_f32(h[d]);
    break;
  case DLREC_TABLE_FP16:
    for (uint32_t d = 0; d < t->dim; d++) out[d] = dtype_fp16_to_f32(h[d]);
    break;
  }
}

void dlrec_table_set_row(dlrec_table *t, uint64_t r, const float *in) {
  const size_t at = (size_t)r * t->stride;
  float *f = (float *)t->data + at;
  uint16_t *h = (uint16_t *)t->data + at;
  switch (t->dtype) {
  case DLREC_TABLE_FP32: memcpy(f, in, t->dim * sizeof(float)); break;
  case DLREC_TABLE_BF16:
    for (uint32_t d = 0; d < t->dim; d++) h[d] = dtype_f32_to_bf16(in[d]);
    break;
  case DLREC_TABLE_FP16:
    for (uint32_t d = 0; d < t->dim; d++) h[d] = dtype_f32_to_fp16(in[d]);
    break;
  }
}

/* The index of the first range whose end is above row r (n when none). */
static uint32_t first_range_after(const dlrec_row_range *ranges, uint32_t n, uint64_t r) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (ranges[mid].end <= r) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

dlrec_status table_check_ranges(const dlrec_row_range *ranges, uint32_t n_ranges, uint64_t rows) {
  if (!ranges && n_ranges) return dlrec_error(DLREC_ERR_INVALID, "table_init_uniform: NULL ranges");
  for (uint32_t i = 0; i < n_ranges; i++) {
    const dlrec_row_range *g = &ranges[i];
    if (g->init.kind >= DLREC_INIT_KINDS || !(g->init.scale >= 0.0f) || !isfinite(g->init.scale))
      return dlrec_error(DLREC_ERR_INVALID, "table_init_uniform: range %u has an unknown initializer (%u, scale %g)", i,
                         g->init.kind, (double)g->init.scale);
    if (g->begin >= g->end || g->end > rows || (i > 0 && g->begin < ranges[i - 1].end))
      return dlrec_error(DLREC_ERR_INVALID,
                         "table_init_uniform: range %u [%llu, %llu) is empty, overlaps the previous one, or "
                         "is outside the table of %llu rows",
                         i, (unsigned long long)g->begin, (unsigned long long)g->end, (unsigned long long)rows);
  }
  return DLREC_OK;
}

dlrec_status dlrec_table_init_uniform(dlrec_table *t, const dlrec_row_range *ranges, uint32_t n_ranges,
                                      uint64_t seed) {
  if (!t) return dlrec_error(DLREC_ERR_INVALID, "table_init_uniform: NULL argument");
  dlrec_status s = table_check_ranges(ranges, n_ranges, t->rows);
  if (s == DLREC_OK) table_init_window(t, 0, ranges, n_ranges, seed);
  return s;
}

void dlrec_embed_init_row(const dlrec_embed_init *in, uint64_t rows, uint32_t dim, struct dlrec_rng *rng, float *w) {
  double a = 0.0;
  switch ((dlrec_embed_init_kind)in->kind) {
  /* DLRM: np.random.uniform(-sqrt(1/n), sqrt(1/n)) */
  case DLREC_INIT_UNIFORM_SQRT_ROWS: a = sqrt(1.0 / (double)rows); break;
  case DLREC_INIT_UNIFORM: a = in->scale; break;
  case DLREC_INIT_XAVIER_UNIFORM: a = sqrt(6.0 / ((double)rows + dim)); break;
  case DLREC_INIT_NORMAL:
    for (uint32_t d = 0; d < dim; d++) w[d] = (float)(dlrec_rng_normal(rng) * in->scale);
    return;
  case DLREC_INIT_ZEROS: break;
  }
  if (a == 0.0) memset(w, 0, dim * sizeof *w);
  else
    for (uint32_t d = 0; d < dim; d++) w[d] = (float)((2.0 * dlrec_rng_uniform(rng) - 1.0) * a);
}

void table_init_window(dlrec_table *t, uint64_t first, const dlrec_row_range *ranges, uint32_t n_ranges,
                       uint64_t seed) {
  const uint64_t chunks = (t->rows + INIT_CHUNK_ROWS - 1) / INIT_CHUNK_ROWS, chunk0 = first / INIT_CHUNK_ROWS;
  const uint32_t dim = t->dim;
  /* Chunks are independent random streams, so any thread may draw any chunk
   * and the table does not depend on the schedule. Writing in parallel also
   * spreads the first touch of the pages over the threads' NUMA nodes. */
#pragma omp parallel for schedule(dynamic, 4)
  for (uint64_t k = 0; k < chunks; k++) {
    dlrec_rng rng;
    dlrec_rng_seed(&rng, seed, chunk0 + k);
    const uint64_t r0 = k * INIT_CHUNK_ROWS;
    const uint64_t r1 = r0 + INIT_CHUNK_ROWS < t->rows ? r0 + INIT_CHUNK_ROWS : t->rows;
    uint32_t ri = first_range_after(ranges, n_ranges, first + r0);
    float row[DLREC_EMBED_MAX_DIM + 4];
    const int f32 = t->dtype == DLREC_TABLE_FP32;
    for (uint64_t r = r0; r < r1; r++) {
      /* An fp32 table is drawn into in place, as it always was; a 16-bit
       * one through a row of floats. g is the row's number in the whole
       * table, which the ranges are in. */
      const uint64_t g = first + r;
      float *w = f32 ? (float *)t->data + r * t->stride : row;
      while (ri < n_ranges && ranges[ri].end <= g) ri++;
      if (ri < n_ranges && g >= ranges[ri].begin) {
        dlrec_embed_init_row(&ranges[ri].init, ranges[ri].end - ranges[ri].begin, dim, &rng, w);
      } else {
        for (uint32_t d = 0; d < dim; d++) w[d] = 0.0f;
      }
      /* A 16-bit table stores the fp32 draw rounded to nearest, so its
       * initial rows are the fp32 table's, rounded. The padding is zeroed,
       * whatever a caller wrote there: zero bits are 0.0 in every dtype. */
      if (!f32) dlrec_table_set_row(t, r, row);
      const size_t elem = dlrec_table_dtype_bytes(t->dtype);
      memset((char *)t->data + ((size_t)r * t->stride + dim) * elem, 0, (t->stride - dim) * elem);
    }
  }
}
