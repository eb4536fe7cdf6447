/* The hash store (embed/store.h): a dynamic table keyed by raw 64-bit keys.
 *
 * The resident table has cache_rows rows, each free or holding one key. An
 * index (open addressing, linear probing, deletion by backward shift, twice
 * the rows or more, so it never fills; keyed by a random secret and bounded
 * probes, so that chosen keys cannot lengthen them: slot_index.h) maps a key
 * to its row. Per row: its key, the resolve that last looked it up, how
 * often it was looked up.
 *
 * A key without a row is first put to admission: at its n-th sighting,
 * counted in a count-min sketch (4 rows of 16-bit saturating counters; a
 * collision can only make a count larger, so a key is admitted early, never
 * late), or by a draw per sighting keyed by (seed, key, resolve). An admitted
 * key takes a free row, or else the victim of a sampled eviction (Redis's
 * method): SAMPLES rows drawn at random, the one looked up longest ago (LRU)
 * or fewest times (LFU, then longest ago) given up; rows of the current batch
 * are never victims. Tables of at most SAMPLES rows are scanned whole, so
 * small tables evict exactly. A new row is drawn uniform in
 * [-init_range, init_range] (or as cfg.init says) from (seed, key), and its
 * optimizer state reset, so a key re-admitted after eviction starts as it
 * first did.
 *
 * Expiry: each resolve checks the next few rows (a hand going round, fast
 * enough to pass every row twice per ttl_steps) and frees those not looked
 * up for more than ttl_steps resolves.
 *
 * Everything runs in the batch's (column, sample, position) order on one
 * thread, so the table after a sequence of batches is a function of the
 * sequence and the seed alone.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/rng.h"
#include "embed/slot_index.h"
#include "embed/store_impl.h"

#define SAMPLES 8
/* Batches of fewer ids are looked up on one thread. */
#define PARALLEL_FIND_MIN 4096
#define SKETCH_DEPTH 4
#define NO_SLOT SLOT_INDEX_NONE

/* One row's key and use; packed so that a lookup touches one line of it. */
typedef struct row_meta {
  uint64_t key;
  uint64_t seen;  /* the resolve that last looked the row up; 0: the row is free */
  uint64_t count; /* lookups since the key was admitted */
} row_meta;

struct hashed {
  dlrec_store_config cfg;
  float initial_accumulator; /* the optimizer's, for a new row's state */
  uint64_t capacity;
  /* The scalars a checkpoint saves (dlrec_store_hash_arrays), together. */
  struct hash_scalars {
    uint64_t step; /* resolves so far */
    uint64_t n_free;
    uint64_t ttl_hand;
    dlrec_rng victim_rng;
  } st;
  row_meta *meta;       /* (capacity) */
  uint32_t *free_slots; /* a stack */
  slot_index index;     /* key -> row */
  uint16_t *sketch; /* SKETCH_DEPTH rows of sketch_mask + 1 counters */
  uint64_t sketch_mask;
  /* the resolved batch */
  uint32_t *offsets, *ids, *found; /* found: the row each id had before the batch's misses */
  size_t offsets_cap, ids_cap;
  const uint32_t *col_offsets[DLREC_BAG_MAX_COLS], *col_ids[DLREC_BAG_MAX_COLS];
};

/* The admission draws' and the sketch's hash: unkeyed, its values are part
 * of a run's results (a key's admission), unlike the index's keyed one,
 * whose values change none. */
static uint64_t mix(uint64_t x) { return dlrec_mix64(x); }

/* ---- lifetime ------------------------------------------------------------------ */

dlrec_status hashed_create(dlrec_store *s, const dlrec_store_config *c) {
  if (c->cache_rows < 1 || c->cache_rows >= NO_SLOT)
    return dlrec_error(DLREC_ERR_INVALID, "hash table: cache_rows must be 1 to %u, not %llu", NO_SLOT - 1,
                       (unsigned long long)c->cache_rows);
  if (!(c->admit_probability >= 0.0f && c->admit_probability <= 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "hash table: admit_probability %g is not in [0, 1]", c->admit_probability);
  if (!(c->init_range >= 0.0f) || !isfinite(c->init_range))
    return dlrec_error(DLREC_ERR_INVALID, "hash table: bad init_range %g", c->init_range);
  if (c->init.kind >= DLREC_INIT_KINDS || !(c->init.scale >= 0.0f) || !isfinite(c->init.scale))
    return dlrec_error(DLREC_ERR_INVALID, "hash table: unknown initializer (%u, scale %g)", c->init.kind,
                       (double)c->init.scale);
  if (c->evict != DLREC_HASH_EVICT_LRU && c->evict != DLREC_HASH_EVICT_LFU)
    return dlrec_error(DLREC_ERR_INVALID, "hash table: unknown eviction %d", (int)c->evict);
  hashed *h = calloc(1, sizeof *h);
  if (!h) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->hashed = h;
  h->cfg = *c;
  h->cfg.path = NULL;
  h->capacity = c->cache_rows;
  uint64_t width = 64;
  while (width < h->capacity) width *= 2;
  h->sketch_mask = width - 1;
  h->meta = calloc(h->capacity, sizeof *h->meta);
  h->free_slots = malloc(h->capacity * sizeof *h->free_slots);

  h->sketch = c->admit_min_count > 1 ? calloc(SKETCH_DEPTH * width, sizeof *h->sketch) : NULL;
  if (!h->meta || !h->free_slots || (c->admit_min_count > 1 && !h->sketch))
    return dlrec_error(DLREC_ERR_NOMEM, "hash table: out of memory for %llu rows", (unsigned long long)h->capacity);
  dlrec_status st = slot_index_init(&h->index, h->capacity, "hash table");
  if (st != DLREC_OK) return st;
  /* Free rows are taken lowest first. */
  for (uint64_t i = 0; i < h->capacity; i++) h->free_slots[i] = (uint32_t)(h->capacity - 1 - i);
  h->st.n_free = h->capacity;
  dlrec_rng_seed(&h->st.victim_rng, c->seed, 0x76696374696d); /* "victim" */
  st = dlrec_table_create_dtype(&s->table, h->capacity, s->dim, s->dtype);
  if (st != DLREC_OK) return dlrec_error_context("hash table, its rows: ");
  return DLREC_OK;
}

void hashed_free(hashed *h) {
  if (!h) return;
  free(h->meta);
  free(h->free_slots);
  slot_index_free(&h->index);
  free(h->sketch);
  free(h->offsets);
  free(h->ids);
  free(h->found);
  free(h);
}

void hashed_optim_added(dlrec_store *s, const dlrec_sparse_optim_config *c) {
  s->hashed->initial_accumulator = c->initial_accumulator;
}

size_t hashed_overhead_bytes(const dlrec_store *s) {
  const hashed *h = s->hashed;
  return h->capacity * (sizeof *h->meta + sizeof *h->free_slots) + slot_index_bytes(&h->index) +
         (h->sketch ? SKETCH_DEPTH * (h->sketch_mask + 1) * sizeof *h->sketch : 0) +
         h->offsets_cap * sizeof *h->offsets + h->ids_cap * (sizeof *h->ids + sizeof *h->found);
}

/* ---- admission, rows, eviction ---------------------------------------------------- */

/* Counts a sighting of key; true when the key is admitted by it. */
static int admit(hashed *h, uint64_t key) {
  const dlrec_store_config *c = &h->cfg;
  if (c->admit_probability > 0.0f && c->admit_probability < 1.0f) {
    uint64_t r = mix(mix(key ^ c->seed) + h->st.step);
    return (double)(r >> 11) * 0x1.0p-53 < (double)c->admit_probability;
  }
  if (!h->sketch) return 1;
  uint32_t least = UINT16_MAX;
  for (uint32_t d = 0; d < SKETCH_DEPTH; d++) {
    uint16_t *n = &h->sketch[d * (h->sketch_mask + 1) + (mix(key + d * 0x9e3779b97f4a7c15ull) & h->sketch_mask)];
    if (*n < UINT16_MAX) (*n)++;
    if (*n < least) least = *n;
  }
  return least >= c->admit_min_count;
}

/* Frees row `slot` (in use). */
static void release(hashed *h, uint32_t slot) {
  slot_index_remove(&h->index, h->meta[slot].key);
  h->meta[slot].seen = 0;
  h->free_slots[h->st.n_free++] = slot;
}

/* Whether row a is a better victim than row b. */
static int worse(const hashed *h, uint32_t a, uint32_t b) {
  const row_meta *x = &h->meta[a], *y = &h->meta[b];
  if (h->cfg.evict == DLREC_HASH_EVICT_LFU && x->count != y->count) return x->count < y->count;
  return x->seen < y->seen;
}

/* A row for a newly admitted key: a free one, else the sampled victim
 * (evicted). NO_SLOT when every row is in use by this batch. */
static uint32_t take_row(dlrec_store *s) {
  hashed *h = s->hashed;
  if (h->st.n_free) return h->free_slots[--h->st.n_free];
  uint32_t best = NO_SLOT;
  if (h->capacity <= SAMPLES) {
    for (uint32_t i = 0; i < h->capacity; i++)
      if (h->meta[i].seen != h->st.step && (best == NO_SLOT || worse(h, i, best))) best = i;
  } else {
    /* Samples that hit this batch's rows do not count; a batch using most
     * rows falls back to a scan. */
    for (uint32_t tries = 0, got = 0; got < SAMPLES && tries < 16 * SAMPLES; tries++) {
      uint32_t i = (uint32_t)(dlrec_rng_u64(&h->st.victim_rng) % h->capacity);
      if (h->meta[i].seen == h->st.step) continue;
      got++;
      if (best == NO_SLOT || worse(h, i, best)) best = i;
    }
    for (uint32_t i = 0; best == NO_SLOT && i < h->capacity; i++)
      if (h->meta[i].seen != h->st.step) best = i;
  }
  if (best == NO_SLOT) return NO_SLOT;
  release(h, best);
  s->stats.evictions++;
  return h->free_slots[--h->st.n_free];
}

/* Row `slot` as a new key's: drawn from (seed, key), optimizer state reset. */
static void init_row(dlrec_store *s, uint32_t slot, uint64_t key) {
  hashed *h = s->hashed;
  float row[DLREC_EMBED_MAX_DIM];
  dlrec_rng r;
  dlrec_rng_seed(&r, h->cfg.seed, key);
  if (h->cfg.init.kind != DLREC_INIT_UNIFORM_SQRT_ROWS) dlrec_embed_init_row(&h->cfg.init, h->capacity, s->dim, &r, row);
  else
    for (uint32_t d = 0; d < s->dim; d++) row[d] = (float)((2.0 * dlrec_rng_uniform(&r) - 1.0) * h->cfg.init_range);
  dlrec_table_set_row(s->table, slot, row);
  if (!s->optim) return;
  dlrec_sparse_optim_state o;
  dlrec_sparse_optim_state_view(s->optim, &o);
  if (o.accum) o.accum[slot] = h->initial_accumulator;
  if (o.m) memset(o.m + (size_t)slot * o.stride, 0, o.stride * sizeof(float));
  if (o.v) memset(o.v + (size_t)slot * o.stride, 0, o.stride * sizeof(float));
  if (o.steps) o.steps[slot] = 0;
}

/* Frees the rows of the next stretch that have not been looked up for more
 * than ttl_steps resolves: 2 * capacity / ttl_steps rows per resolve, so
 * each row is checked at least twice per ttl_steps. */
static void expire(dlrec_store *s) {
  hashed *h = s->hashed;
  if (!h->cfg.ttl_steps) return;
  uint64_t n = 2 * h->capacity / h->cfg.ttl_steps + 1;
  if (n > h->capacity) n = h->capacity;
  for (uint64_t k = 0; k < n; k++) {
    uint32_t i = (uint32_t)h->st.ttl_hand;
    h->st.ttl_hand = h->st.ttl_hand + 1 == h->capacity ? 0 : h->st.ttl_hand + 1;
    if (h->meta[i].seen && h->st.step - h->meta[i].seen > h->cfg.ttl_steps) {
      release(h, i);
      s->stats.expired++;
    }
  }
}

/* ---- resolving ---------------------------------------------------------------------- */

/* The batch's offsets checked (none decreasing), its ids counted into
 * *n_ids, and the room for its rewritten offsets and ids made. */
static dlrec_status batch_room(hashed *h, uint32_t rows, uint32_t cols, const uint32_t *const *offsets,
                               size_t *n_ids) {
  *n_ids = 0;
  for (uint32_t c = 0; c < cols; c++) {
    for (uint32_t b = 0; b < rows; b++)
      if (offsets[c][b + 1] < offsets[c][b])
        return dlrec_error(DLREC_ERR_INVALID, "column %u: offsets decrease at sample %u (%u, then %u)", c, b,
                           offsets[c][b], offsets[c][b + 1]);
    *n_ids += offsets[c][rows] - offsets[c][0];
  }
  const size_t n_off = (size_t)cols * (rows + 1);
  if (n_off > h->offsets_cap) {
    uint32_t *p = realloc(h->offsets, n_off * sizeof *p);
    if (!p) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    h->offsets = p;
    h->offsets_cap = n_off;
  }
  if (*n_ids > h->ids_cap) {
    uint32_t *p = realloc(h->ids, *n_ids * sizeof *p), *q = p ? realloc(h->found, *n_ids * sizeof *q) : NULL;
    if (p) h->ids = p;
    if (!q) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    h->found = q;
    h->ids_cap = *n_ids;
  }
  return DLREC_OK;
}

/* Every id's row as the table stands into h->found (NO_SLOT: not resident),
 * in parallel: the index is only read, and a row found is marked as used by
 * this batch (so no miss after evicts it) with the same value by every
 * thread that finds it. */
static void find_rows(hashed *h, uint32_t rows, uint32_t cols, const uint32_t *const *offsets,
                      const uint64_t *const *keys, const uint32_t *const *ids, size_t n_ids) {
  uint32_t *found = h->found;
#pragma omp parallel for schedule(dynamic, 1) if (n_ids >= PARALLEL_FIND_MIN)
  for (uint32_t c = 0; c < cols; c++) {
    size_t at = 0; /* where column c's ids start in found */
    for (uint32_t d = 0; d < c; d++) at += offsets[d][rows] - offsets[d][0];
    const uint32_t k0 = offsets[c][0], n = offsets[c][rows] - k0;
#define KEY(k) (keys ? keys[c][k0 + (k)] : ids[c][k0 + (k)])
    /* Index probes are cache misses over a table of gigabytes: the one
     * SLOT_INDEX_AHEAD ids on is fetched while this one waits. */
    slot_index_ahead ahead;
    for (uint32_t k = 0; k < n && k < SLOT_INDEX_AHEAD; k++) slot_index_ahead_put(&h->index, &ahead, k, KEY(k));
    for (uint32_t k = 0; k < n; k++) {
      const uint64_t key = KEY(k), home = slot_index_ahead_home(&ahead, k);
      if (k + SLOT_INDEX_AHEAD < n)
        slot_index_ahead_put(&h->index, &ahead, k + SLOT_INDEX_AHEAD, KEY(k + SLOT_INDEX_AHEAD));
      const uint32_t slot = slot_index_find_from(&h->index, key, home);
      found[at + k] = slot;
      if (slot == NO_SLOT) continue;
      row_meta *m = &h->meta[slot];
#pragma omp atomic write
      m->seen = h->st.step;
#pragma omp atomic update
      m->count++;
    }
#undef KEY
  }
}

/* A key without a row at find_rows: its row if an earlier miss of this
 * batch admitted it, else admitted now (the row drawn), else NO_SLOT
 * (counted as not admitted, or dropped when no row can be had). */
static uint32_t miss_row(dlrec_store *s, hashed *h, uint64_t key) {
  uint32_t slot = slot_index_find(&h->index, key);
  if (slot != NO_SLOT) {
    h->meta[slot].count++;
    return slot;
  }
  s->stats.misses++;
  if (!admit(h, key)) {
    s->stats.not_admitted++;
    return NO_SLOT;
  }
  if ((slot = take_row(s)) == NO_SLOT) {
    s->stats.dropped++;
    return NO_SLOT;
  }
  h->meta[slot] = (row_meta){key, h->st.step, 1};
  slot_index_insert(&h->index, key, slot);
  init_row(s, slot, key);
  s->stats.admitted++;
  return slot;
}

/* One resolve over keys given as 64-bit (keys) or 32-bit (ids) arrays. */
static dlrec_status resolve(dlrec_store *s, uint32_t rows, uint32_t cols, const uint32_t *const *offsets,
                            const uint64_t *const *keys, const uint32_t *const *ids, const uint8_t *mean_cols,
                            dlrec_bag_batch *out, int write) {
  hashed *h = s->hashed;
  if (cols < 1 || cols > DLREC_BAG_MAX_COLS || !offsets || (!keys && !ids))
    return dlrec_error(DLREC_ERR_INVALID, "store_resolve: bad batch (%u columns)", cols);
  size_t n_ids;
  dlrec_status st = batch_room(h, rows, cols, offsets, &n_ids);
  if (st != DLREC_OK) return st;
  h->st.step++;
  expire(s);
  find_rows(h, rows, cols, offsets, keys, ids, n_ids);
  s->stats.lookups += n_ids;
  /* Then the misses, in batch order: admission, rows, eviction. */
  uint32_t *off = h->offsets, *dst = h->ids;
  size_t base = 0;
  for (uint32_t c = 0; c < cols; c++) {
    const uint32_t k0 = offsets[c][0];
    uint32_t k_out = 0;
    off[0] = 0;
    for (uint32_t b = 0; b < rows; b++) {
      for (uint32_t k = offsets[c][b]; k < offsets[c][b + 1]; k++) {
        uint32_t slot = h->found[base + k - k0];
        if (slot == NO_SLOT && (slot = miss_row(s, h, keys ? keys[c][k] : ids[c][k])) == NO_SLOT) continue;
        if (write) store_mark_changed(s, slot);
        dst[k_out++] = slot;
      }
      off[b + 1] = k_out;
    }
    h->col_offsets[c] = off;
    h->col_ids[c] = dst;
    base += offsets[c][rows] - k0;
    off += rows + 1;
    dst += k_out;
  }
  s->stats.resident = h->capacity - h->st.n_free;
  *out = (dlrec_bag_batch){rows, cols, h->col_offsets, h->col_ids, mean_cols};
  return DLREC_OK;
}

dlrec_status hashed_resolve_keys(dlrec_store *s, const dlrec_key_batch *in, dlrec_bag_batch *out, int write) {
  return resolve(s, in->rows, in->cols, in->offsets, in->keys, NULL, in->mean_cols, out, write);
}

dlrec_status hashed_resolve_ids(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write) {
  return resolve(s, in->rows, in->cols, in->offsets, NULL, in->ids, in->mean_cols, out, write);
}

uint64_t dlrec_store_index_max_probes(const dlrec_store *s) {
  return s && s->hashed ? slot_index_max_probes(&s->hashed->index) : 0;
}

int hashed_key_of(const dlrec_store *s, uint32_t row, uint64_t *key) {
  const hashed *h = s->hashed;
  if (row >= h->capacity || !h->meta[row].seen) return 0;
  *key = h->meta[row].key;
  return 1;
}

/* ---- checkpoints ------------------------------------------------------------------------ */

_Static_assert(sizeof(row_meta) == 24, "row_meta is three u64s");
_Static_assert(sizeof(struct hash_scalars) % 4 == 0, "the scalars are u32 words");

void hashed_arrays(dlrec_store *s, dlrec_hash_arrays *a) {
  hashed *h = s->hashed;
  a->meta = (uint32_t *)(void *)h->meta;
  a->meta_words = h->capacity * (sizeof *h->meta / 4);
  a->free_slots = h->free_slots;
  a->n_slots = h->capacity;
  a->sketch = h->sketch ? (uint32_t *)(void *)h->sketch : NULL;
  a->sketch_words = h->sketch ? SKETCH_DEPTH * (h->sketch_mask + 1) / 2 : 0;
  a->scalars = (uint32_t *)(void *)&h->st;
  a->n_scalars = sizeof h->st / 4;
}

dlrec_status hashed_rebuild(dlrec_store *s) {
  hashed *h = s->hashed;
  slot_index_free(&h->index);
  dlrec_status st = slot_index_init(&h->index, h->capacity, "hash table");
  if (st != DLREC_OK) return st;
  if (h->st.n_free > h->capacity || h->st.ttl_hand >= h->capacity)
    return dlrec_error(DLREC_ERR_CORRUPT, "hash table: %llu free rows or hand %llu of %llu rows",
                       (unsigned long long)h->st.n_free, (unsigned long long)h->st.ttl_hand,
                       (unsigned long long)h->capacity);
  uint64_t used = 0;
  for (uint64_t i = 0; i < h->capacity; i++) {
    const row_meta *m = &h->meta[i];
    if (!m->seen) continue;
    if (m->seen > h->st.step || slot_index_find(&h->index, m->key) != NO_SLOT)
      return dlrec_error(DLREC_ERR_CORRUPT, "hash table: row %llu: key %016llx seen at resolve %llu of %llu, or twice",
                         (unsigned long long)i, (unsigned long long)m->key, (unsigned long long)m->seen,
                         (unsigned long long)h->st.step);
    slot_index_insert(&h->index, m->key, (uint32_t)i);
    used++;
  }
  if (used + h->st.n_free != h->capacity)
    return dlrec_error(DLREC_ERR_CORRUPT, "hash table: %llu rows in use and %llu free, of %llu",
                       (unsigned long long)used, (unsigned long long)h->st.n_free, (unsigned long long)h->capacity);
  for (uint64_t k = 0; k < h->st.n_free; k++) {
    const uint32_t r = h->free_slots[k];
    if (r >= h->capacity || h->meta[r].seen)
      return dlrec_error(DLREC_ERR_CORRUPT, "hash table: free row %u is in use or outside the table", r);
  }
  s->stats.resident = used;
  return DLREC_OK;
}

dlrec_status hashed_lookup_keys(const dlrec_store *s, const dlrec_key_batch *in, uint32_t *const *offsets,
                                uint32_t *const *ids, uint64_t *missing) {
  const hashed *h = s->hashed;
  uint64_t miss = 0;
  for (uint32_t c = 0; c < in->cols; c++) {
    const uint32_t *off = in->offsets[c];
    const uint64_t *keys = in->keys[c];
    for (uint32_t b = 0; b < in->rows; b++)
      if (off[b + 1] < off[b])
        return dlrec_error(DLREC_ERR_INVALID, "column %u: offsets decrease at sample %u (%u, then %u)", c, b, off[b],
                           off[b + 1]);
    /* The probe SLOT_INDEX_AHEAD keys on is fetched while this one waits
     * (as in find_rows). */
    const uint32_t k0 = off[0], end = off[in->rows];
    slot_index_ahead ahead;
    for (uint32_t k = k0; k < end && k < k0 + SLOT_INDEX_AHEAD; k++)
      slot_index_ahead_put(&h->index, &ahead, k - k0, keys[k]);
    uint32_t k_out = 0;
    offsets[c][0] = 0;
    for (uint32_t b = 0; b < in->rows; b++) {
      for (uint32_t k = off[b]; k < off[b + 1]; k++) {
        const uint64_t home = slot_index_ahead_home(&ahead, k - k0);
        if (k + SLOT_INDEX_AHEAD < end)
          slot_index_ahead_put(&h->index, &ahead, k - k0 + SLOT_INDEX_AHEAD, keys[k + SLOT_INDEX_AHEAD]);
        const uint32_t slot = slot_index_find_from(&h->index, keys[k], home);
        if (slot == NO_SLOT) miss++;
        else ids[c][k_out++] = slot;
      }
      offsets[c][b + 1] = k_out;
    }
  }
  *missing = miss;
  return DLREC_OK;
}
