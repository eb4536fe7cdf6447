/* Table storage: where the rows of the fused embedding table live.
 *
 * The kernels (dlrec_bag_forward, dlrec_bag_backward_update) always gather
 * from and update a dense, resident dlrec_table. A store decides which rows
 * of the logical table are resident, and where:
 *
 *   ram     the whole table is resident, row r at row r (today's fused
 *           table); resolving a batch changes nothing.
 *   tiered  the table and its optimizer state live in a file on disk; a RAM
 *           cache of a configured number of rows holds the rows batches
 *           touch, chosen by CLOCK (second chance). A row missing from the
 *           cache is read from the file into a free or evicted slot; an
 *           evicted row that a training step changed is written back first,
 *           with its optimizer state. RSS is the cache (plus the file's
 *           pages in flight: under 64 MiB and one batch's), not the table.
 *
 * The contract:
 *   - dlrec_store_resolve makes every row a batch names resident and gives
 *     the same batch with its ids rewritten as rows of the resident table
 *     (dlrec_store_table). The rewritten ids, and the residence of those
 *     rows at those places, stay valid until the next resolve, flush, map
 *     or free of the store, and no longer.
 *   - A resolve with `write` set tells the store that the caller will update
 *     those rows (the fused backward): the store writes them back before it
 *     evicts them and at dlrec_store_flush. The caller never writes back.
 *   - The sparse optimizer is created through dlrec_store_optim_create, on
 *     the resident table, so that its per-row state (Adagrad's accumulator,
 *     Adam's moments and step counts) moves with the rows. 16-bit tables key
 *     their stochastic rounding by the resident row, so a tiered 16-bit table
 *     rounds differently from a ram one (fp32 tables are bitwise the same).
 *   - One caller at a time: resolve mutates the cache. A network on a tiered
 *     store is not shared between threads.
 *   - Checkpoints see the whole logical table through dlrec_store_map: the
 *     table and optimizer state as arrays of the ram layout (for tiered, the
 *     file's mapping after a flush; its pages leave RSS at unmap), written
 *     or read in place, then dlrec_store_unmap.
 *   - A tiered file lives on a disk that keeps working: its blocks are
 *     allocated when it is created (a full disk is an error then), but an
 *     I/O error of the disk under the mapping is a SIGBUS, as for any
 *     mapped file.
 */
#ifndef DLREC_STORE_H
#define DLREC_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "dlrec/embed.h"
#include "dlrec/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dlrec_store_kind {
  DLREC_STORE_RAM = 0, /* the default */
  DLREC_STORE_TIERED = 1,
} dlrec_store_kind;

/* "ram" or "tiered" ("?" otherwise); static storage. */
const char *dlrec_store_kind_name(dlrec_store_kind kind);
/* The kind named `name`; DLREC_ERR_INVALID naming the kinds otherwise. */
dlrec_status dlrec_store_kind_parse(const char *name, dlrec_store_kind *kind);

typedef struct dlrec_store_config {
  dlrec_store_kind kind;
  /* tiered: the table's file (created, or truncated and rewritten, by
   * dlrec_store_create; removed by dlrec_store_free). A scratch file of the
   * run, not a format: checkpoints hold the durable copy. */
  const char *path;
  /* tiered: rows resident in RAM, at least one batch's distinct rows. */
  uint64_t cache_rows;
} dlrec_store_config;

typedef struct dlrec_store dlrec_store;

/* A store of `rows` rows of `dim` elements of `dtype` (the bounds of
 * dlrec_table_create_dtype), zeroed. Tiered sizes its file for the table
 * only; dlrec_store_optim_create adds the optimizer's state. On success *s
 * is owned by the caller (dlrec_store_free). */
dlrec_status dlrec_store_create(dlrec_store **s, const dlrec_store_config *c, uint64_t rows, uint32_t dim,
                                dlrec_table_dtype dtype);
/* Releases the store (accepts NULL); a tiered store removes its file. */
void dlrec_store_free(dlrec_store *s);

/* The rows of the logical table, and the resident table the kernels use
 * (the whole table for ram, the cache for tiered), valid for the store's
 * life. */
uint64_t dlrec_store_rows(const dlrec_store *s);
dlrec_table *dlrec_store_table(dlrec_store *s);
const dlrec_table *dlrec_store_table_const(const dlrec_store *s);
dlrec_store_kind dlrec_store_get_kind(const dlrec_store *s);

/* dlrec_table_init_uniform over the logical table, the same values for the
 * same seed and ranges whatever the store (tiered writes the file chunk by
 * chunk and empties the cache). */
dlrec_status dlrec_store_init_uniform(dlrec_store *s, const dlrec_row_range *ranges, uint32_t n_ranges,
                                      uint64_t seed);

/* Creates the sparse optimizer of the store's table (at most one per
 * store; the store keeps a reference and writes its state back with the
 * rows). The caller frees it with dlrec_sparse_optim_free before the store. */
dlrec_status dlrec_store_optim_create(dlrec_store *s, const dlrec_sparse_optim_config *c, dlrec_sparse_optim **o);

/* Makes the rows of `in` resident and writes `out`: in's shape with ids
 * rewritten as rows of dlrec_store_table (for ram, out = in). Ids at or past
 * dlrec_store_rows are refused naming the column, sample and id, as
 * dlrec_bag_check does; so is a batch with more distinct rows than the
 * cache holds, naming both counts. write: see the contract above. */
dlrec_status dlrec_store_resolve(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write);

/* Writes back every row changed since it was loaded (tiered; ram: nothing). */
dlrec_status dlrec_store_flush(dlrec_store *s);

/* The whole logical table as dlrec_table_raw and the optimizer state as
 * dlrec_sparse_optim_state_view would show them for a ram store of the same
 * shape: rows * stride elements of the dtype, then the optimizer's arrays
 * (NULL where it has none, or no optimizer was created). Flushes first and
 * empties the cache, so writes through the view are what later resolves
 * read. Valid until dlrec_store_unmap, which every map must be paired with
 * before any other call on the store. */
typedef struct dlrec_store_view {
  void *table;
  dlrec_sparse_optim_state optim;
  /* The arrays lie in a shared mapping of the store's file (tiered): a
   * caller passing through them may drop their pages as it goes (madvise
   * MADV_DONTNEED keeps what was written) to keep RSS bounded. */
  int mapped;
} dlrec_store_view;
dlrec_status dlrec_store_map(dlrec_store *s, dlrec_store_view *v);
void dlrec_store_unmap(dlrec_store *s, dlrec_store_view *v);

/* Counters since the store was created. */
typedef struct dlrec_store_stats {
  uint64_t lookups;       /* ids resolved */
  uint64_t misses;        /* of which not resident: read from the file */
  uint64_t evictions;     /* resident rows given up for others */
  uint64_t bytes_read;    /* from the file (rows and optimizer state) */
  uint64_t bytes_written; /* to the file */
  uint64_t resident;      /* rows resident now */
} dlrec_store_stats;
void dlrec_store_get_stats(const dlrec_store *s, dlrec_store_stats *st);

/* Bytes of RAM the store holds beyond its resident table and optimizer
 * state: the tiered cache's index (row -> slot) and per-slot bookkeeping. */
size_t dlrec_store_overhead_bytes(const dlrec_store *s);

#ifdef __cplusplus
}
#endif
#endif
