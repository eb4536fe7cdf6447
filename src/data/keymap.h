/* Internal: an open-addressing hash map from 64-bit keys to 64-bit values,
 * for categorical counts (ETL fit) and key -> id lookups (ETL apply, serving).
 *
 * Linear probing over (key, value) slots of 16 bytes, so one probe is one
 * cache line; the table doubles at half load. Key 0 marks an empty slot, so
 * the key 0 itself lives in a side slot. Lookups are read-only and may run on
 * many threads at once; updates need one writer.
 */
#ifndef DLREC_DATA_KEYMAP_H
#define DLREC_DATA_KEYMAP_H

#include <stddef.h>
#include <stdint.h>

#include "core/hash.h"
#include "core/status.h"

typedef struct keymap_slot {
  uint64_t key;
  uint64_t val;
} keymap_slot;

typedef struct keymap {
  keymap_slot *slots; /* (mask + 1) */
  uint64_t mask;
  uint64_t n;         /* entries, the key 0 included */
  int has_zero;
  uint64_t zero_val;
} keymap;

/* An empty map sized for about `expect` keys. DLREC_ERR_NOMEM on failure. */
dlrec_status keymap_init(keymap *m, uint64_t expect);
void keymap_free(keymap *m);

static inline uint64_t keymap_hash(uint64_t key) { return dlrec_mix64(key); }

/* A hint to bring the key's first slot into cache ahead of a lookup. */
static inline void keymap_prefetch(const keymap *m, uint64_t hash) {
  __builtin_prefetch(&m->slots[hash & m->mask]);
}

/* The value of key, or NULL when absent. `hash` is keymap_hash(key). */
static inline const uint64_t *keymap_find_h(const keymap *m, uint64_t key, uint64_t hash) {
  if (key == 0) return m->has_zero ? &m->zero_val : NULL;
  for (uint64_t i = hash & m->mask;; i = (i + 1) & m->mask) {
    const keymap_slot *s = &m->slots[i];
    if (s->key == key) return &s->val;
    if (s->key == 0) return NULL;
  }
}

static inline const uint64_t *keymap_find(const keymap *m, uint64_t key) {
  return keymap_find_h(m, key, keymap_hash(key));
}

/* The value slot of key, inserted with value 0 if absent (*added says which);
 * valid until the next insertion. NULL (with an error set) when out of memory. */
uint64_t *keymap_upsert_h(keymap *m, uint64_t key, uint64_t hash, int *added);

/* Adds 1 to key's value (inserting it at 1), the counting step of fit.
 * DLREC_ERR_NOMEM when the table cannot grow. */
static inline dlrec_status keymap_count(keymap *m, uint64_t key, uint64_t hash) {
  if (key != 0) {
    /* The usual case, a key seen before, without a call. */
    for (uint64_t i = hash & m->mask;; i = (i + 1) & m->mask) {
      keymap_slot *s = &m->slots[i];
      if (s->key == key) {
        s->val++;
        return DLREC_OK;
      }
      if (s->key == 0) break;
    }
  }
  int added;
  uint64_t *v = keymap_upsert_h(m, key, hash, &added);
  if (!v) return DLREC_ERR_NOMEM;
  (*v)++;
  return DLREC_OK;
}

/* Adds every (key, value) of src to dst's values. */
dlrec_status keymap_merge_add(keymap *dst, const keymap *src);

/* Calls fn for every entry, in slot order (not sorted). */
void keymap_each(const keymap *m, void (*fn)(void *ctx, uint64_t key, uint64_t val), void *ctx);

#endif
