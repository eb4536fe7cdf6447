/* The key -> slot index of the table stores (slot_index.h). */
#include "embed/slot_index.h"

#include <stdlib.h>

dlrec_status slot_index_init(slot_index *x, uint64_t max_keys, const char *what) {
  uint64_t cap = 2;
  while (cap < 2 * max_keys) cap *= 2;
  x->mask = cap - 1;
  x->entries = malloc(cap * sizeof *x->entries);
  if (!x->entries)
    return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory for an index of %llu keys", what,
                       (unsigned long long)max_keys);
  slot_index_clear(x);
  return DLREC_OK;
}

void slot_index_free(slot_index *x) {
  free(x->entries);
  x->entries = NULL;
}

void slot_index_clear(slot_index *x) {
  for (uint64_t i = 0; i <= x->mask; i++) x->entries[i] = (slot_index_entry){0, SLOT_INDEX_NONE, 0};
}

size_t slot_index_bytes(const slot_index *x) { return x->entries ? (x->mask + 1) * sizeof *x->entries : 0; }

void slot_index_insert(slot_index *x, uint64_t key, uint32_t slot) {
  uint64_t i = slot_index_hash(key) & x->mask;
  while (x->entries[i].slot != SLOT_INDEX_NONE) i = (i + 1) & x->mask;
  x->entries[i] = (slot_index_entry){key, slot, 0};
}

void slot_index_remove(slot_index *x, uint64_t key) {
  uint64_t i = slot_index_hash(key) & x->mask;
  while (x->entries[i].slot == SLOT_INDEX_NONE || x->entries[i].key != key) i = (i + 1) & x->mask;
  /* Entries after the hole move back into it unless their home position
   * lies cyclically in (hole, their place]: otherwise a probe for them,
   * starting at home, would stop at the hole. */
  for (uint64_t j = (i + 1) & x->mask; x->entries[j].slot != SLOT_INDEX_NONE; j = (j + 1) & x->mask) {
    const uint64_t home = slot_index_hash(x->entries[j].key) & x->mask;
    const int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    x->entries[i] = x->entries[j];
    i = j;
  }
  x->entries[i].slot = SLOT_INDEX_NONE;
}
