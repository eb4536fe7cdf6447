/* Embeddings: one fused table per width, bag lookups, and the sparse backward
 * fused with the optimizer.
 *
 * Every categorical column owns a contiguous range of rows of one fused
 * table, fp32 or 16-bit (dlrec_table_create_dtype): global id = the column's
 * first row + local id, as the ETL encodes them, so a batch's lookups of all
 * columns are gathers from one array.
 *
 * A training step uses it as:
 *
 *   dlrec_table_create(&t, rows, dim);                 // once
 *   dlrec_table_init_uniform(t, ranges, n_cols, seed); // once
 *   dlrec_sparse_optim_create(&o, t, &optim_config);   // once
 *   scratch = malloc(dlrec_bag_backward_scratch_bytes(t, max_ids)); // once
 *   ...
 *   dlrec_bag_forward(t, &bags, DLREC_BAG_SUM, emb);   // emb (B, F, D)
 *   ... dense forward, loss, dense backward down to d_emb (B, F, D) ...
 *   dlrec_bag_backward_update(t, o, &bags, DLREC_BAG_SUM, d_emb, scratch, bytes);
 *
 * The backward never materializes a dense gradient of the table: it reduces
 * the gradients of the rows the batch touched, per unique row, in a fixed
 * order, and updates only those rows in place. The result is bitwise the
 * same for any number of OpenMP threads.
 */
#ifndef DLREC_EMBED_H
#define DLREC_EMBED_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The widest table: a row's gradient is reduced on the stack. */
#define DLREC_EMBED_MAX_DIM 1024
/* The most columns (bags per sample) in one batch. */
#define DLREC_BAG_MAX_COLS 4096

/* ---- the table ----------------------------------------------------------- */

typedef struct dlrec_table dlrec_table;

/* A column's rows in the fused table: [begin, end). */
typedef struct dlrec_row_range {
  uint64_t begin, end;
} dlrec_row_range;

/* How a table stores its rows. 16-bit rows halve the table's memory and the
 * bytes each lookup gathers; pooling widens them to fp32 and accumulates in
 * fp32, and the sparse update computes in fp32 and writes back with
 * stochastic rounding (embed/dtype.h). Optimizer state stays fp32. */
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

/* Initializes the rows of each column uniformly in [-a_c, a_c] with
 * a_c = sqrt(1 / n_c) and n_c the column's row count (the DLRM reference's
 * initialization, one table per column there). Rows outside every range are
 * set to zero. The values depend only on the seed and the ranges: rows are
 * drawn in fixed chunks, chunk k from dlrec_rng_seed(seed, k), in parallel,
 * so the table is the same for any thread count. Ranges must be non-empty,
 * ascending, non-overlapping and inside the table. */
dlrec_status dlrec_table_init_uniform(dlrec_table *t, const dlrec_row_range *ranges, uint32_t n_ranges,
                                      uint64_t seed);

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

/* ---- bag lookups ---------------------------------------------------------- */

typedef enum dlrec_bag_mode {
  DLREC_BAG_SUM = 0,  /* the sum of the bag's rows */
  DLREC_BAG_MEAN = 1, /* their mean; an empty bag gives zeros */
} dlrec_bag_mode;

/* One batch's bags in CSR form per column, the dlrec_batch layout of
 * loader.h: sample b of column c holds the global ids
 * ids[c][offsets[c][b] .. offsets[c][b+1]). Build it from a batch with
 *   dlrec_bag_batch bags = {batch->rows, F, batch->offsets, batch->ids};   */
typedef struct dlrec_bag_batch {
  uint32_t rows;                  /* B, samples */
  uint32_t cols;                  /* F, columns (bags per sample), 1 to DLREC_BAG_MAX_COLS */
  const uint32_t *const *offsets; /* F arrays of (B + 1), non-decreasing */
  const uint32_t *const *ids;     /* F arrays of ids, each of offsets[c][B] values at least */
  /* F flags, or NULL for none: column c pools by its mean when the mode is
   * DLREC_BAG_MEAN or mean_cols[c] is nonzero (a column the ETL schema
   * declares with mean pooling). */
  const uint8_t *mean_cols;
} dlrec_bag_batch;

/* Checks a batch against a table: shapes, non-decreasing offsets, and every
 * id < rows. Returns DLREC_ERR_INVALID naming the first bad column, sample
 * and id. dlrec_bag_forward and dlrec_bag_backward_update check the same
 * things as they go, so callers need this only to check a batch up front. */
dlrec_status dlrec_bag_check(const dlrec_table *t, const dlrec_bag_batch *bags);

/* Pools each bag: out[b][c] = sum (or mean) of the rows of sample b's ids in
 * column c. out is (B, F, D) with D = dim (not stride), ready for the
 * interaction. A batch that fails dlrec_bag_check is refused with its error;
 * out's contents are then unspecified. */
dlrec_status dlrec_bag_forward(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_bag_mode mode, float *out);

/* dlrec_bag_forward for some of the bags: list[i] = b * F + c names bag c of
 * sample b, which is pooled into out + i * D with the bits dlrec_bag_forward
 * gives it; nothing else is written (n * D floats). For a pass that needs
 * few of a batch's bags, packed: those of a split batch's part that lives
 * in host memory, whose rows cross to a GPU. A list entry past the batch's
 * bags is refused; of the bags, only the listed ones are read, and a bad
 * one is refused with dlrec_bag_check's error for the batch. */
dlrec_status dlrec_bag_forward_rows(const dlrec_table *t, const dlrec_bag_batch *bags, dlrec_bag_mode mode,
                                    const uint32_t *list, size_t n, float *out);

/* ---- sparse optimizers ---------------------------------------------------- */

typedef enum dlrec_sparse_optim_kind {
  DLREC_SPARSE_SGD = 0,
  DLREC_SPARSE_ROWWISE_ADAGRAD = 1, /* one accumulator per row (FBGEMM's row-wise Adagrad) */
  DLREC_SPARSE_LAZY_ADAM = 2,       /* Adam on touched rows only, per-row step counts */
} dlrec_sparse_optim_kind;

/* Hyperparameters. weight_decay is the L2 kind (g += weight_decay * w) and,
 * like every update here, applies only to the rows a batch touches. */
typedef struct dlrec_sparse_optim_config {
  dlrec_sparse_optim_kind kind;
  float lr;
  float weight_decay;
  float beta1, beta2;        /* lazy Adam */
  float eps;                 /* Adagrad and Adam */
  float initial_accumulator; /* row-wise Adagrad */
} dlrec_sparse_optim_config;

/* Defaults for kind: lr 0.01, weight_decay 0, beta1 0.9, beta2 0.999,
 * eps 1e-8 (Adam) or 1e-10 (Adagrad), initial_accumulator 0. */
void dlrec_sparse_optim_config_default(dlrec_sparse_optim_config *c, dlrec_sparse_optim_kind kind);

/* The optimizer of one table, holding its state (mmap'd like the table):
 *   SGD:               none
 *   row-wise Adagrad:  accum (rows): the running sum of the mean over the row
 *                      of the squared gradient
 *   lazy Adam:         m, v (rows, stride) and steps (rows): how many updates
 *                      each row has had, which sets its bias correction
 * The table must outlive the optimizer. */
typedef struct dlrec_sparse_optim dlrec_sparse_optim;

dlrec_status dlrec_sparse_optim_create(dlrec_sparse_optim **o, const dlrec_table *t,
                                       const dlrec_sparse_optim_config *c);
void dlrec_sparse_optim_free(dlrec_sparse_optim *o); /* accepts NULL */

/* Changes the learning rate for later updates (warmup and decay schedules). */
dlrec_status dlrec_sparse_optim_set_lr(dlrec_sparse_optim *o, float lr);

/* For a table that holds rows of a larger logical table (a tiered store's
 * cache): row_keys[r] is the logical row that table row r holds, and keys
 * the stochastic rounding of a 16-bit row instead of r, so that a row rounds
 * the same wherever it is cached. row_keys must stay valid (and current)
 * while updates run; NULL (the default) keys each row by itself. */
void dlrec_sparse_optim_set_row_keys(dlrec_sparse_optim *o, const uint64_t *row_keys);
/* The row keys set, or NULL. For a mirror in a backend's memory (a hot
 * rows' optimizer) they are that memory too. */
const uint64_t *dlrec_sparse_optim_row_keys(const dlrec_sparse_optim *o);

/* The optimizer's state arrays, for checkpoints and tests; NULL where the
 * kind has none. Valid until dlrec_sparse_optim_free. */
typedef struct dlrec_sparse_optim_state {
  uint64_t rows;
  uint32_t stride;
  float *accum;    /* (rows) row-wise Adagrad */
  float *m, *v;    /* (rows, stride) lazy Adam; padding zero */
  uint32_t *steps; /* (rows) lazy Adam */
  /* The number of updates so far, which keys the stochastic rounding of a
   * 16-bit table's rows (so a resumed run rounds as the original would);
   * NULL for an fp32 table, which needs no rounding. */
  uint64_t *updates;
} dlrec_sparse_optim_state;
void dlrec_sparse_optim_state_view(dlrec_sparse_optim *o, dlrec_sparse_optim_state *s);

/* An optimizer of table t (a dlrec_table_wrap mirror) over state arrays the
 * caller owns, as s lays them out for t's shape and c's kind (accum; m, v,
 * steps; NULL where the kind has none), with s->updates' count (0 when
 * NULL). Not touched here: a backend's mirror of an optimizer's state in
 * its own memory. dlrec_sparse_optim_free frees the handle alone. */
dlrec_status dlrec_sparse_optim_wrap(dlrec_sparse_optim **o, const dlrec_table *t, const dlrec_sparse_optim_config *c,
                                     const dlrec_sparse_optim_state *s);
/* The hyperparameters (the learning rate as last set). */
const dlrec_sparse_optim_config *dlrec_sparse_optim_get_config(const dlrec_sparse_optim *o);

/* ---- the fused sparse backward -------------------------------------------- */

/* Bytes of scratch that dlrec_bag_backward_update needs for a batch of at
 * most max_ids ids in all (B times the sum of the columns' max hotness).
 * Plan it once; the scratch holds nothing between calls. */
size_t dlrec_bag_backward_scratch_bytes(const dlrec_table *t, uint64_t max_ids);

/* The backward of dlrec_bag_forward fused with the optimizer step. Given
 * d_out = dL/dout (B, F, D):
 *   1. lists (row, sample, column) for every id of the batch, in column,
 *      sample, position order;
 *   2. sorts the list by row, stably (a parallel radix sort), so that each
 *      row's contributions are contiguous and in that fixed order;
 *   3. for each unique row, sums its gradient contributions in that order
 *      (scaled by 1/|bag| for DLREC_BAG_MEAN) and applies o's update to the
 *      row in place. A 16-bit row is widened, updated in fp32 and stored
 *      with stochastic rounding drawn from (the optimizer's update count,
 *      row, coordinate), so the bits do not depend on the thread count.
 * Rows the batch does not touch are not read or written, nor is their
 * optimizer state. The same row appearing several times in a batch gets one
 * update with the sum of its gradients. Bitwise deterministic for any thread
 * count. A batch that fails dlrec_bag_check, or scratch smaller than
 * dlrec_bag_backward_scratch_bytes for this batch, is refused before any row
 * changes. scratch needs no particular alignment (it is aligned inside, and
 * the size query counts the slack). */
dlrec_status dlrec_bag_backward_update(dlrec_table *t, dlrec_sparse_optim *o, const dlrec_bag_batch *bags,
                                       dlrec_bag_mode mode, const float *d_out, void *scratch, size_t scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif
