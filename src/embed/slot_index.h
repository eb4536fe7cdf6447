/* An index from 64-bit keys to 32-bit slots, for the table stores: the
 * tiered cache (row -> cache slot), its write-back buffer (row -> record)
 * and the hash table (key -> row).
 *
 * Open addressing with linear probing over at least twice as many entries as
 * it will hold, so it never fills and a probe is short; deletion shifts later
 * entries back instead of leaving tombstones, so lookups never slow down as
 * keys come and go. An entry holds its key and slot together: a probe
 * touches one cache line. Not thread-safe for writers; concurrent finds
 * are fine while nothing writes.
 */
#ifndef DLREC_EMBED_SLOT_INDEX_H
#define DLREC_EMBED_SLOT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define SLOT_INDEX_NONE UINT32_MAX /* no slot: the key is absent */

typedef struct slot_index_entry {
  uint64_t key;
  uint32_t slot; /* SLOT_INDEX_NONE: the entry is empty */
  uint32_t pad;
} slot_index_entry;

typedef struct slot_index {
  slot_index_entry *entries; /* mask + 1 of them */
  uint64_t mask;
} slot_index;

/* An empty index for up to max_keys keys; DLREC_ERR_NOMEM naming `what`. */
dlrec_status slot_index_init(slot_index *x, uint64_t max_keys, const char *what);
void slot_index_free(slot_index *x);
void slot_index_clear(slot_index *x);
size_t slot_index_bytes(const slot_index *x);

static inline uint64_t slot_index_hash(uint64_t key) {
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ull;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebull;
  return key ^ (key >> 31);
}

/* The slot of key, SLOT_INDEX_NONE when absent. */
static inline uint32_t slot_index_find(const slot_index *x, uint64_t key) {
  for (uint64_t i = slot_index_hash(key) & x->mask;; i = (i + 1) & x->mask) {
    const slot_index_entry *e = &x->entries[i];
    if (e->slot == SLOT_INDEX_NONE) return SLOT_INDEX_NONE;
    if (e->key == key) return e->slot;
  }
}

/* Starts loading the line where key's probe begins (a probe ahead). */
static inline void slot_index_prefetch(const slot_index *x, uint64_t key) {
  __builtin_prefetch(&x->entries[slot_index_hash(key) & x->mask]);
}

/* Adds key (absent) with its slot. */
void slot_index_insert(slot_index *x, uint64_t key, uint32_t slot);
/* Removes key (present). */
void slot_index_remove(slot_index *x, uint64_t key);

#endif
