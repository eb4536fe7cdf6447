/* The store's inside, shared by the interface (store.c) and the tiered and
 * hash implementations (store_tiered.c, store_hash.c). */
#ifndef DLREC_EMBED_STORE_IMPL_H
#define DLREC_EMBED_STORE_IMPL_H

#include "embed/store.h"

typedef struct tiered tiered;
typedef struct hashed hashed;

struct dlrec_store {
  dlrec_store_kind kind;
  uint64_t rows; /* of the logical table */
  uint32_t dim, stride;
  dlrec_table_dtype dtype;
  dlrec_table *table;        /* resident: the whole table (ram) or the cache (tiered) */
  dlrec_sparse_optim *optim; /* borrowed from its creator, on table */
  dlrec_store_stats stats;
  /* Change tracking (tiered, after dlrec_store_track_changes): a bit per
   * logical row that a resolve with `write` named since the last reset. */
  uint64_t *changed;
  uint64_t n_changed, changed_rows; /* the rows the bits cover: the logical table's, or a hash table's own */
  tiered *tiered; /* the tiered store's own state; NULL for the others */
  hashed *hashed; /* the hash store's own state; NULL for the others */
};

/* Records row as changed when the store tracks changes. */
static inline void store_mark_changed(dlrec_store *s, uint64_t row) {
  if (!s->changed) return;
  uint64_t *w = &s->changed[row >> 6], bit = 1ull << (row & 63);
  s->n_changed += !(*w & bit);
  *w |= bit;
}

dlrec_status tiered_create(dlrec_store *s, const dlrec_store_config *c);
void tiered_free(tiered *t);
dlrec_status tiered_init_uniform(dlrec_store *s, const dlrec_row_range *ranges, uint32_t n_ranges, uint64_t seed);
/* Lays out the optimizer's state in the file, initialized as
 * dlrec_sparse_optim_create initializes its own. */
dlrec_status tiered_optim_added(dlrec_store *s, dlrec_sparse_optim *o, const dlrec_sparse_optim_config *c);
dlrec_status tiered_resolve(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write);
dlrec_status tiered_map(dlrec_store *s, dlrec_store_view *v);
void tiered_unmap(dlrec_store *s, dlrec_store_view *v);
size_t tiered_overhead_bytes(const dlrec_store *s);

dlrec_status hashed_create(dlrec_store *s, const dlrec_store_config *c);
void hashed_free(hashed *h);
void hashed_optim_added(dlrec_store *s, const dlrec_sparse_optim_config *c);
dlrec_status hashed_resolve_ids(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write);
dlrec_status hashed_resolve_keys(dlrec_store *s, const dlrec_key_batch *in, dlrec_bag_batch *out, int write);
int hashed_key_of(const dlrec_store *s, uint32_t row, uint64_t *key);
void hashed_arrays(dlrec_store *s, dlrec_hash_arrays *a);
dlrec_status hashed_rebuild(dlrec_store *s);
dlrec_status hashed_lookup_keys(const dlrec_store *s, const dlrec_key_batch *in, uint32_t *const *offsets,
                                uint32_t *const *ids, uint64_t *missing);
size_t hashed_overhead_bytes(const dlrec_store *s);

#endif
