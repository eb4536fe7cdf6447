/* The fused embedding table as the backend's kernels see it: a tensor of
 * rows (ggml's tensor: a shape, a dtype and the memory it points into) that
 * the bag ops gather from and the fused sparse update writes. Which rows are
 * resident, and where the rest live (a file, a hash of raw keys), is the
 * stores' business above the backend (src/embed/store.h); the kernels only
 * ever see a dense table of resident rows.
 *
 * Every categorical column owns a contiguous range of rows of one fused
 * table, fp32 or 16-bit (dlrec_table_create_dtype): global id = the column's
 * first row + local id, as the ETL encodes them, so a batch's lookups of all
 * columns are gathers from one array.
 */
#ifndef DLREC_BACKEND_TABLE_H
#define DLREC_BACKEND_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The widest table: a row's gradient is reduced on the stack. */
#define DLREC_EMBED_MAX_DIM 1024

typedef struct dlrec_table dlrec_table;

/* How a column's rows are drawn (model.embedding_init, docs/config.md):
 *   UNIFORM_SQRT_ROWS  uniform in [-a, a], a = sqrt(1 / n) with n the
 *                      column's rows (the DLRM reference's; the default, 0)
 *   NORMAL             normal with mean 0 and standard deviation `scale`
 *                      (FuxiCTR's default: N(0, 1e-4))
 *   UNIFORM            uniform in [-scale, scale]
 *   XAVIER_UNIFORM     uniform in [-a, a], a = sqrt(6 / (n + dim)) (PyTorch's
 *                      xavier_uniform_ on the column's (n, dim) weight)
 *   ZEROS              every element 0 */
typedef enum dlrec_embed_init_kind {
  DLREC_INIT_UNIFORM_SQRT_ROWS = 0,
  DLREC_INIT_NORMAL = 1,
  DLREC_INIT_UNIFORM = 2,
  DLREC_INIT_XAVIER_UNIFORM = 3,
  DLREC_INIT_ZEROS = 4,
} dlrec_embed_init_kind;
#define DLREC_INIT_KINDS 5

typedef struct dlrec_embed_init {
  uint32_t kind; /* a dlrec_embed_init_kind */
  float scale;   /* NORMAL's standard deviation, UNIFORM's bound; 0 for the others */
} dlrec_embed_init;

/* A column's rows in the fused table, [begin, end), and how they are drawn
 * (zeroed: the DLRM rule). */
typedef struct dlrec_row_range {
  uint64_t begin, end;
  dlrec_embed_init init;
} dlrec_row_range;

/* How a table stores its rows. 16-bit rows halve the table's memory and the
 * bytes each lookup gathers; pooling widens them to fp32 and accumulates in
 * fp32, and the sparse update computes in fp32 and writes back with
 * stochastic rounding (backend/dtype.h). Optimizer state stays fp32. */
typedef enum dlrec_table_dtype {
  DLREC_TABLE_FP32 = 0, /* the default */
  DLREC_TABLE_BF16 = 1, /* bfloat16: fp32's exponent range, 8 bits of mantissa */
  DLREC_TABLE_FP16 = 2, /* IEEE binary16: 11 bits of mantissa, magnitudes up to 65504 */
} dlrec_table_dtype;

/* "fp32", "bf16" or "fp16" ("?" for anything else); static storage. */
const char *dlrec_table_dtype_name(dlrec_table_dtype dtype);
/* Bytes of one element: 4 or 2 (0 for an unknown dtype). */
uint32_t dlrec_table_dtype_bytes(dlrec_table_dtype dtype);

/* Creates a zeroed table of `rows` rows of `dim` floats. Each row is padded to
 * `stride` floats, the next multiple of 4 (16 bytes), so that rows are
 * vector-aligned; the padding stays zero. Memory comes from an anonymous
 * mmap with a transparent-huge-page hint, since lookups are random accesses
 * over gigabytes where 4 KiB pages would miss the TLB on nearly every row.
 * 1 <= rows <= 2^32 (ids are 32-bit), 1 <= dim <= DLREC_EMBED_MAX_DIM.
 * On success *t is owned by the caller (dlrec_table_free). */
dlrec_status dlrec_table_create(dlrec_table **t, uint64_t rows, uint32_t dim);
/* The same with rows stored as `dtype` (still `stride` elements a row, each
 * of dlrec_table_dtype_bytes(dtype) bytes). dlrec_table_create is this with
 * DLREC_TABLE_FP32. */
dlrec_status dlrec_table_create_dtype(dlrec_table **t, uint64_t rows, uint32_t dim, dlrec_table_dtype dtype);

/* Initializes the rows of each column as its range's init says (by default
 * uniformly in [-a_c, a_c] with a_c = sqrt(1 / n_c) and n_c the column's row
 * count: the DLRM reference's initialization, one table per column there).
 * Rows outside every range are set to zero. The values depend only on the seed and the ranges: rows are
 * drawn in fixed chunks, chunk k from dlrec_rng_seed(seed, k), in parallel,
 * so the table is the same for any thread count. Ranges must be non-empty,
 * ascending, non-overlapping and inside the table. */
dlrec_status dlrec_table_init_uniform(dlrec_table *t, const dlrec_row_range *ranges, uint32_t n_ranges,
                                      uint64_t seed);
/* Draws one row of `dim` floats into w as `in` says, for a column of `rows`
 * rows, from rng (the hash store's rows, drawn by key, share it). */
struct dlrec_rng;
void dlrec_embed_init_row(const dlrec_embed_init *in, uint64_t rows, uint32_t dim, struct dlrec_rng *rng, float *w);

/* A table over rows the caller owns: (rows, stride) elements of dtype at
 * data, stride as dlrec_table_create pads it. The rows are not touched: a
 * compute backend's mirror of a table in its own memory (a GPU's), which
 * only that backend's ops may read or write. dlrec_table_free frees the
 * handle, not the rows. Shapes as dlrec_table_create_dtype. */
dlrec_status dlrec_table_wrap(dlrec_table **t, uint64_t rows, uint32_t dim, dlrec_table_dtype dtype, void *data);

/* Releases the table (accepts NULL). */
void dlrec_table_free(dlrec_table *t);

uint64_t dlrec_table_rows(const dlrec_table *t);
uint32_t dlrec_table_dim(const dlrec_table *t);
uint32_t dlrec_table_stride(const dlrec_table *t); /* elements from one row to the next */
dlrec_table_dtype dlrec_table_get_dtype(const dlrec_table *t);

/* The rows of an fp32 table: (rows, stride) floats, row r at
 * data + r * stride, valid until dlrec_table_free; NULL for a 16-bit table
 * (use dlrec_table_raw). For checkpoints and tests; writes must keep the
 * padding zero. */
float *dlrec_table_data(dlrec_table *t);
const float *dlrec_table_data_const(const dlrec_table *t);
/* The rows in any dtype: (rows, stride) elements of the table's dtype
 * (uint16_t bit patterns for bf16 and fp16), valid until dlrec_table_free. */
void *dlrec_table_raw(dlrec_table *t);
const void *dlrec_table_raw_const(const dlrec_table *t);
/* Row r widened to fp32 into out (dim floats), and out (dim floats) stored
 * into row r rounded to nearest (ties to even). For initialization, tests
 * and tools, not the hot path. */
void dlrec_table_get_row(const dlrec_table *t, uint64_t r, float *out);
void dlrec_table_set_row(dlrec_table *t, uint64_t r, const float *in);

#ifdef __cplusplus
}
#endif
#endif
