/* The key -> slot index of the table stores (slot_index.h). */
#include "embed/slot_index.h"

#include <stdlib.h>

dlrec_status slot_index_init(slot_index *x, uint64_t max_keys, const char *what) {
  uint64_t cap = 2;
  while (cap < 2 * max_keys) cap *= 2;
  x->mask = cap - 1;
  x->rekeys = 0;
  dlrec_random_secret(x->secret);
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
  x->probe_limit = SLOT_INDEX_MAX_PROBES;
}

size_t slot_index_bytes(const slot_index *x) { return x->entries ? (x->mask + 1) * sizeof *x->entries : 0; }

uint64_t slot_index_max_probes(const slot_index *x) {
  uint64_t most = 0;
  for (uint64_t i = 0; i <= x->mask; i++)
    if (x->entries[i].slot != SLOT_INDEX_NONE) {
      const uint64_t probes = ((i - slot_index_home(x, x->entries[i].key)) & x->mask) + 1;
      if (probes > most) most = probes;
    }
  return most;
}

/* Places every entry again under the current secret, in place: each entry
 * is marked unplaced, then, in index order, an unplaced entry goes to the
 * first entry from its new home that is empty (it moves there) or unplaced
 * (it swaps with it, and the entry it displaced is placed next). Placed
 * entries never move again, and an entry passes only placed ones on its way
 * home, so every probe path ends up unbroken, as linear probing needs. */
static void rehash(slot_index *x) {
  slot_index_entry *e = x->entries;
  for (uint64_t i = 0; i <= x->mask; i++) e[i].pad = e[i].slot != SLOT_INDEX_NONE;
  for (uint64_t i = 0; i <= x->mask; i++) {
    while (e[i].slot != SLOT_INDEX_NONE && e[i].pad) {
      uint64_t j = slot_index_home(x, e[i].key);
      while (e[j].slot != SLOT_INDEX_NONE && !e[j].pad) j = (j + 1) & x->mask;
      if (j == i) {
        e[i].pad = 0;
      } else if (e[j].slot == SLOT_INDEX_NONE) {
        e[j] = (slot_index_entry){e[i].key, e[i].slot, 0};
        e[i] = (slot_index_entry){0, SLOT_INDEX_NONE, 0};
      } else {
        const slot_index_entry moved = e[j];
        e[j] = (slot_index_entry){e[i].key, e[i].slot, 0};
        e[i] = moved;
      }
    }
  }
}

/* New random secrets until every key lies within the bound again (the
 * bound is lifted after SLOT_INDEX_MAX_REKEYS tries: see slot_index.h). */
static void rekey(slot_index *x) {
  for (uint32_t t = 0; t < SLOT_INDEX_MAX_REKEYS; t++) {
    dlrec_random_secret(x->secret);
    rehash(x);
    x->rekeys++;
    if (slot_index_max_probes(x) <= SLOT_INDEX_MAX_PROBES) return;
  }
  x->probe_limit = x->mask + 1;
}

void slot_index_set_secret(slot_index *x, const uint64_t secret[2]) {
  x->secret[0] = secret[0];
  x->secret[1] = secret[1];
  rehash(x);
  if (slot_index_max_probes(x) > x->probe_limit) rekey(x);
}

void slot_index_insert(slot_index *x, uint64_t key, uint32_t slot) {
  uint64_t i = slot_index_home(x, key), probes = 1;
  for (; x->entries[i].slot != SLOT_INDEX_NONE; i = (i + 1) & x->mask) probes++;
  x->entries[i] = (slot_index_entry){key, slot, 0};
  if (probes > x->probe_limit) rekey(x);
}

void slot_index_remove(slot_index *x, uint64_t key) {
  uint64_t i = slot_index_home(x, key);
  while (x->entries[i].slot == SLOT_INDEX_NONE || x->entries[i].key != key) i = (i + 1) & x->mask;
  /* Entries after the hole move back into it unless their home position
   * lies cyclically in (hole, their place]: otherwise a probe for them,
   * starting at home, would stop at the hole. Moving back brings an entry
   * nearer its home, so the bound on probes holds. */
  for (uint64_t j = (i + 1) & x->mask; x->entries[j].slot != SLOT_INDEX_NONE; j = (j + 1) & x->mask) {
    const uint64_t home = slot_index_home(x, x->entries[j].key);
    const int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    x->entries[i] = x->entries[j];
    i = j;
  }
  x->entries[i].slot = SLOT_INDEX_NONE;
}
