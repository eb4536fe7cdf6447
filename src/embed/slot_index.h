/* An index from 64-bit keys to 32-bit slots, for the table stores: the
 * tiered cache (row -> cache slot), its write-back buffer (row -> record),
 * the hash table (key -> row) and the server's Redis cache (key -> slot).
 *
 * Open addressing with linear probing over at least twice as many entries as
 * it will hold, so it never fills and a probe is short; deletion shifts later
 * entries back instead of leaving tombstones, so lookups never slow down as
 * keys come and go. An entry holds its key and slot together: a probe
 * touches one cache line. Not thread-safe for writers; concurrent finds
 * are fine while nothing writes.
 *
 * The keys may be an outsider's (raw keys of requests and training data), so
 * the hash that places them is keyed: SipHash-1-3 under a 128-bit secret
 * drawn at random for each index (slot_index_init), never stored, never the
 * same twice. Keys chosen without the secret spread as random keys do,
 * whatever their values. And a probe is bounded: no key lies more than
 * SLOT_INDEX_MAX_PROBES - 1 entries past its home, so a find reads at most
 * SLOT_INDEX_MAX_PROBES entries, for a key present or absent. An insert that
 * would break the bound draws a new secret and rehashes the index in place
 * (no allocation; counted in `rekeys`); at a load of at most one half that
 * happens for random keys with a probability under 10^-10 for the largest
 * index. Only an index filled past the keys it was made for could fail to
 * get back under the bound: after SLOT_INDEX_MAX_REKEYS tries in a row the
 * bound is lifted (probe_limit), and finds probe to the first empty entry.
 *
 * Where a key lands is invisible to callers (a find returns the key's slot,
 * wherever its entry lies), so a random secret changes no result: training
 * stays deterministic, and a checkpoint holds no index to load.
 */
#ifndef DLREC_EMBED_SLOT_INDEX_H
#define DLREC_EMBED_SLOT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/hash.h"
#include "core/status.h"

#define SLOT_INDEX_NONE UINT32_MAX /* no slot: the key is absent */
#define SLOT_INDEX_MAX_PROBES 256u /* entries a find reads at most */
#define SLOT_INDEX_MAX_REKEYS 16u  /* new secrets one insert tries */

typedef struct slot_index_entry {
  uint64_t key;
  uint32_t slot; /* SLOT_INDEX_NONE: the entry is empty */
  uint32_t pad;  /* 0; 1 while a rehash has yet to place the entry */
} slot_index_entry;

typedef struct slot_index {
  slot_index_entry *entries; /* mask + 1 of them */
  uint64_t mask;
  uint64_t secret[2];   /* the index hash's key */
  uint64_t probe_limit; /* entries a find reads at most: SLOT_INDEX_MAX_PROBES, or mask + 1 once lifted */
  uint64_t rekeys;      /* new secrets drawn since init, because an insert hit the bound */
} slot_index;

/* An empty index for up to max_keys keys, under a fresh random secret;
 * DLREC_ERR_NOMEM naming `what`. */
dlrec_status slot_index_init(slot_index *x, uint64_t max_keys, const char *what);
void slot_index_free(slot_index *x);
/* Empties the index (the secret stays; the bound is restored). */
void slot_index_clear(slot_index *x);
size_t slot_index_bytes(const slot_index *x);

/* Where key's probe begins. */
static inline uint64_t slot_index_home(const slot_index *x, uint64_t key) {
  return dlrec_siphash13_u64(key, x->secret[0], x->secret[1]) & x->mask;
}

/* The slot of key, whose home is `home` (slot_index_home), SLOT_INDEX_NONE
 * when absent. */
static inline uint32_t slot_index_find_from(const slot_index *x, uint64_t key, uint64_t home) {
  uint64_t i = home;
  for (uint64_t n = 0; n < x->probe_limit; n++, i = (i + 1) & x->mask) {
    const slot_index_entry *e = &x->entries[i];
    if (e->slot == SLOT_INDEX_NONE) return SLOT_INDEX_NONE;
    if (e->key == key) return e->slot;
  }
  return SLOT_INDEX_NONE;
}

/* The slot of key, SLOT_INDEX_NONE when absent. */
static inline uint32_t slot_index_find(const slot_index *x, uint64_t key) {
  return slot_index_find_from(x, key, slot_index_home(x, key));
}

/* Probes over a sequence of keys, each a cache miss over a large index,
 * with the one SLOT_INDEX_AHEAD keys on already loading: key number k's home
 * is hashed once, when its line is prefetched (slot_index_ahead_put), and
 * kept for its turn (slot_index_ahead_home). */
#define SLOT_INDEX_AHEAD 8u
typedef struct slot_index_ahead {
  uint64_t home[SLOT_INDEX_AHEAD];
} slot_index_ahead;

static inline void slot_index_ahead_put(const slot_index *x, slot_index_ahead *a, uint64_t k, uint64_t key) {
  const uint64_t home = slot_index_home(x, key);
  a->home[k % SLOT_INDEX_AHEAD] = home;
  __builtin_prefetch(&x->entries[home]);
}

static inline uint64_t slot_index_ahead_home(const slot_index_ahead *a, uint64_t k) {
  return a->home[k % SLOT_INDEX_AHEAD];
}

/* Adds key (absent) with its slot. */
void slot_index_insert(slot_index *x, uint64_t key, uint32_t slot);
/* Removes key (present). */
void slot_index_remove(slot_index *x, uint64_t key);

/* The most entries a find of a key present reads now (1 + the longest
 * distance of an entry from its home; 0 for an empty index): a statistic
 * for tests, reading the whole index. */
uint64_t slot_index_max_probes(const slot_index *x);
/* Rehashes the index in place under `secret` (a test's fixed secret), then
 * as an insert does if the bound is broken. */
void slot_index_set_secret(slot_index *x, const uint64_t secret[2]);

#endif
