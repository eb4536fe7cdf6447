/* Table storage: where the rows of the fused embedding table live.
 *
 * The kernels (the bag_forward and bag_backward_update ops) always gather
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
 *           with its optimizer state (through a write-back buffer of a
 *           quarter of the cache's rows, swept to the file in row order).
 *           RSS is the cache, the buffer and at most 32 MiB of the file's
 *           pages per array of the file, not the table.
 *   hash    a dynamic table keyed by raw 64-bit keys (no vocabulary pass):
 *           `cache_rows` rows in RAM, a key gets one when admitted (at its
 *           n-th sighting, or with a probability per sighting), the least
 *           recently (LRU) or least frequently (LFU) used row is given up
 *           for a new key when the table is full, and rows unseen for
 *           `ttl_steps` resolves are freed. Keys that are not admitted, or
 *           that find no row (every row is used by the same batch), are left
 *           out of their bags, and every such key is counted: nothing is
 *           dropped silently.
 *
 * The contract:
 *   - dlrec_store_resolve makes every row a batch names resident and gives
 *     the same batch with its ids rewritten as rows of the resident table
 *     (dlrec_store_table). The rewritten ids, and the residence of those
 *     rows at those places, stay valid until the next resolve, flush, map
 *     or free of the store, and no longer.
 *   - A resolve with `write` set tells the store that the caller will update
 *     those rows (the fused backward): the store writes them back before it
 *     evicts them and when it is mapped. The caller never writes back.
 *   - The sparse optimizer is created through dlrec_store_optim_create, on
 *     the resident table, so that its per-row state (Adagrad's accumulator,
 *     Adam's moments and step counts) moves with the rows, and a 16-bit
 *     row's stochastic rounding is keyed by its logical row
 *     (dlrec_sparse_optim_set_row_keys), so every store trains the same bits.
 *   - One caller at a time: resolve mutates the cache. A network on a tiered
 *     store is not shared between threads.
 *   - A tiered store can record the rows resolves with `write` name
 *     (dlrec_store_track_changes), so that a checkpoint copies only those.
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

#include "embed/embed.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dlrec_store_kind {
  DLREC_STORE_RAM = 0, /* the default */
  DLREC_STORE_TIERED = 1,
  DLREC_STORE_HASH = 2,
} dlrec_store_kind;

typedef enum dlrec_hash_evict {
  DLREC_HASH_EVICT_LRU = 0, /* the row looked up longest ago */
  DLREC_HASH_EVICT_LFU = 1, /* the row looked up the fewest times (then the oldest) */
} dlrec_hash_evict;

/* "ram", "tiered" or "hash" ("?" otherwise); static storage. */
const char *dlrec_store_kind_name(dlrec_store_kind kind);
/* The kind named `name`; DLREC_ERR_INVALID naming the kinds otherwise. */
dlrec_status dlrec_store_kind_parse(const char *name, dlrec_store_kind *kind);

typedef struct dlrec_store_config {
  dlrec_store_kind kind;
  /* tiered: the table's file (created, or truncated and rewritten, by
   * dlrec_store_create; removed by dlrec_store_free). A scratch file of the
   * run, not a format: checkpoints hold the durable copy. */
  const char *path;
  /* tiered: rows resident in RAM, at least one batch's distinct rows;
   * hash: the table's rows. */
  uint64_t cache_rows;
  /* hash: admission. A key gets a row at its admit_min_count-th sighting
   * (0 or 1: the first; counted in a count-min sketch, so possibly a little
   * early, never late) or, when admit_probability is in (0, 1), at each
   * sighting with that probability. */
  uint32_t admit_min_count;
  float admit_probability;
  dlrec_hash_evict evict; /* hash: which row a new key takes when the table is full */
  uint64_t ttl_steps;     /* hash: rows unseen for this many resolves are freed (0: never) */
  float init_range;       /* hash: a new key's row is uniform in [-init_range, init_range] ... */
  dlrec_embed_init init;  /* ... unless this says otherwise (its kind not UNIFORM_SQRT_ROWS; rows: cache_rows) */
  uint64_t seed;          /* hash: admission draws and new rows */
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

/* A batch of raw keys, in dlrec_bag_batch's CSR form. */
typedef struct dlrec_key_batch {
  uint32_t rows, cols;
  const uint32_t *const *offsets; /* F arrays of (B + 1), non-decreasing */
  const uint64_t *const *keys;    /* F arrays of keys */
  const uint8_t *mean_cols;       /* as in dlrec_bag_batch */
} dlrec_key_batch;

/* The hash store's resolve: `out` has in's shape, with its own offsets and
 * the rows of the keys that have one (admitted now or before); the others
 * are left out of their bags and counted (dlrec_store_stats). Valid as for
 * dlrec_store_resolve. dlrec_store_resolve on a hash store takes each id as
 * a key. Other stores refuse keys. */
dlrec_status dlrec_store_resolve_keys(dlrec_store *s, const dlrec_key_batch *in, dlrec_bag_batch *out, int write);

/* hash: the rows of the keys of `in` that have one, written to the caller's
 * offsets (in->cols arrays of rows + 1) and ids (at least as many as in's
 * keys), without admitting, evicting or touching anything: a read-only
 * lookup for scoring, safe on several threads at once (while nothing
 * resolves). Keys without a row are left out of their bags; *missing
 * counts them. DLREC_ERR_INVALID on the other stores. */
dlrec_status dlrec_store_lookup_keys(const dlrec_store *s, const dlrec_key_batch *in, uint32_t *const *offsets,
                                     uint32_t *const *ids, uint64_t *missing);

/* hash: its bookkeeping as arrays of u32 words, for checkpoints: views into
 * the store, written from or read into in place. After reading into them,
 * dlrec_store_hash_rebuild checks them and rebuilds the key index. */
typedef struct dlrec_hash_arrays {
  uint32_t *meta;       /* per row: key, last resolve seen (0: free), lookups, each a u64 */
  uint64_t meta_words;
  uint32_t *free_slots; /* the free rows' stack (the first n_free of n_slots are live) */
  uint64_t n_slots;
  uint32_t *sketch;     /* the admission sketch's counters, two u16 a word; NULL without one */
  uint64_t sketch_words;
  uint32_t *scalars;    /* resolves so far, free rows, the expiry hand, the eviction draws' state */
  uint32_t n_scalars;
} dlrec_hash_arrays;
dlrec_status dlrec_store_hash_arrays(dlrec_store *s, dlrec_hash_arrays *a);
dlrec_status dlrec_store_hash_rebuild(dlrec_store *s);

/* hash: the most entries of its key index a lookup of a resident key reads
 * now (at most SLOT_INDEX_MAX_PROBES, 256, however the keys were chosen: the
 * index is keyed by a random secret; embed/slot_index.h); 0 on the other
 * stores. A statistic for tests: it reads the whole index. */
uint64_t dlrec_store_index_max_probes(const dlrec_store *s);

/* hash: the key that resident row `row` holds into *key, returning 1; 0 for
 * a free row and on the other stores. */
int dlrec_store_key_of(const dlrec_store *s, uint32_t row, uint64_t *key);

/* The whole logical table (hash: its resident rows, keys from
 * dlrec_store_key_of) as dlrec_table_raw and the optimizer state as
 * dlrec_sparse_optim_state_view would show them for a ram store of the same
 * shape: rows * stride elements of the dtype, then the optimizer's arrays
 * (NULL where it has none, or no optimizer was created). Flushes first and
 * empties the cache, so writes through the view are what later resolves
 * read. Valid until dlrec_store_unmap, which every map must be paired with
 * before any other call on the store. */
typedef struct dlrec_store_view {
  uint64_t rows; /* of table and the optimizer's arrays: the logical table's (hash: the resident rows) */
  void *table;
  dlrec_sparse_optim_state optim;
  /* The arrays lie in a shared mapping of the store's file (tiered): a
   * caller passing through them may drop their pages as it goes (madvise
   * MADV_DONTNEED keeps what was written) to keep RSS bounded. */
  int mapped;
} dlrec_store_view;
dlrec_status dlrec_store_map(dlrec_store *s, dlrec_store_view *v);
void dlrec_store_unmap(dlrec_store *s, dlrec_store_view *v);

/* Change tracking, for incremental checkpoints (docs/formats.md): once
 * dlrec_store_track_changes is called, every row that a resolve with
 * `write` names is recorded, until dlrec_store_changes_reset. Tiered stores
 * (rows of the logical table) and hash stores (their resident rows, which
 * the keys' rows are: an admitted key's new row is named by its resolve);
 * DLREC_ERR_UNSUPPORTED for a ram table, whose resolve does not look at its
 * ids. A bit per row of dlrec_store_changes_space. */
dlrec_status dlrec_store_track_changes(dlrec_store *s);
/* The rows change tracking covers: the logical table's (tiered), the
 * resident table's (hash). */
uint64_t dlrec_store_changes_space(const dlrec_store *s);
/* The number of rows recorded (UINT64_MAX when the store does not track
 * changes); with rows non-NULL, also the rows themselves, ascending. */
uint64_t dlrec_store_changes(const dlrec_store *s, uint32_t *rows);
void dlrec_store_changes_reset(dlrec_store *s);
/* Records rows as changed (a resume: the rows its checkpoint's journal
 * holds); a row past the table is refused, and nothing is recorded. */
dlrec_status dlrec_store_changes_mark(dlrec_store *s, const uint32_t *rows, uint64_t n);

/* Counters since the store was created. */
typedef struct dlrec_store_stats {
  uint64_t lookups;       /* ids resolved */
  uint64_t misses;        /* of which not resident: read from the file */
  uint64_t evictions;     /* resident rows given up for others */
  uint64_t bytes_read;    /* from the file (rows and optimizer state) */
  uint64_t bytes_written; /* to the file */
  uint64_t resident;      /* rows resident now */
  /* hash */
  uint64_t admitted;     /* keys given a row */
  uint64_t not_admitted; /* lookups of keys not (yet) admitted: left out of their bags */
  uint64_t dropped;      /* lookups of admitted keys that found no free row: left out, counted */
  uint64_t expired;      /* rows freed by ttl_steps */
} dlrec_store_stats;
void dlrec_store_get_stats(const dlrec_store *s, dlrec_store_stats *st);

/* Bytes of RAM the store holds beyond its resident table and optimizer
 * state: the index (row or key -> slot), per-slot bookkeeping, the
 * admission sketch. */
size_t dlrec_store_overhead_bytes(const dlrec_store *s);

#ifdef __cplusplus
}
#endif
#endif
