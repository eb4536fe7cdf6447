/* The open-addressing key map: growth, insertion and merging. */
#include "data/keymap.h"

#include <stdlib.h>
#include <sys/mman.h>

/* Tables of 2 MiB and more are mapped with transparent huge pages where the
 * kernel allows: lookups land on random slots, and with 4 KiB pages nearly
 * every one would also miss the TLB. */
#define HUGE_BYTES (2u << 20)

static keymap_slot *slots_new(uint64_t cap) {
  size_t bytes = cap * sizeof(keymap_slot);
  if (bytes < HUGE_BYTES) return calloc(cap, sizeof(keymap_slot));
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE); /* a hint: failure only costs speed */
#endif
  return p;
}

static void slots_delete(keymap_slot *s, uint64_t cap) {
  if (!s) return;
  size_t bytes = cap * sizeof(keymap_slot);
  if (bytes < HUGE_BYTES) free(s);
  else munmap(s, bytes);
}

static dlrec_status alloc_slots(keymap *m, uint64_t cap) {
  m->slots = slots_new(cap);
  if (!m->slots) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a hash map of %llu slots",
                                    (unsigned long long)cap);
  m->mask = cap - 1;
  return DLREC_OK;
}

dlrec_status keymap_init(keymap *m, uint64_t expect) {
  *m = (keymap){0};
  uint64_t cap = 16;
  while (cap < 2 * expect && cap < (1ull << 40)) cap *= 2;
  return alloc_slots(m, cap);
}

void keymap_free(keymap *m) {
  if (m->slots) slots_delete(m->slots, m->mask + 1);
  *m = (keymap){0};
}

/* Doubles the table and reinserts every entry. */
static dlrec_status rehash(keymap *m) {
  keymap_slot *old = m->slots;
  uint64_t old_cap = m->mask + 1;
  dlrec_status st = alloc_slots(m, old_cap * 2);
  if (st != DLREC_OK) {
    m->slots = old;
    m->mask = old_cap - 1;
    return st;
  }
  for (uint64_t i = 0; i < old_cap; i++) {
    if (old[i].key == 0) continue;
    uint64_t j = keymap_hash(old[i].key) & m->mask;
    while (m->slots[j].key != 0) j = (j + 1) & m->mask;
    m->slots[j] = old[i];
  }
  slots_delete(old, old_cap);
  return DLREC_OK;
}

uint64_t *keymap_upsert_h(keymap *m, uint64_t key, uint64_t hash, int *added) {
  *added = 0;
  if (key == 0) {
    if (!m->has_zero) {
      m->has_zero = 1;
      m->zero_val = 0;
      m->n++;
      *added = 1;
    }
    return &m->zero_val;
  }
  for (uint64_t i = hash & m->mask;; i = (i + 1) & m->mask) {
    keymap_slot *s = &m->slots[i];
    if (s->key == key) return &s->val;
    if (s->key != 0) continue;
    /* Absent. Keep the load at most one half so that probes stay short. */
    if (2 * (m->n + 1) > m->mask + 1) {
      if (rehash(m) != DLREC_OK) return NULL;
      return keymap_upsert_h(m, key, hash, added);
    }
    s->key = key;
    s->val = 0;
    m->n++;
    *added = 1;
    return &s->val;
  }
}

dlrec_status keymap_merge_add(keymap *dst, const keymap *src) {
  int added;
  if (src->has_zero) {
    uint64_t *v = keymap_upsert_h(dst, 0, keymap_hash(0), &added);
    if (!v) return DLREC_ERR_NOMEM;
    *v += src->zero_val;
  }
  for (uint64_t i = 0; i <= src->mask; i++) {
    const keymap_slot *s = &src->slots[i];
    if (s->key == 0) continue;
    uint64_t *v = keymap_upsert_h(dst, s->key, keymap_hash(s->key), &added);
    if (!v) return DLREC_ERR_NOMEM;
    *v += s->val;
  }
  return DLREC_OK;
}

void keymap_each(const keymap *m, void (*fn)(void *ctx, uint64_t key, uint64_t val), void *ctx) {
  if (m->has_zero) fn(ctx, 0, m->zero_val);
  for (uint64_t i = 0; i <= m->mask; i++)
    if (m->slots[i].key != 0) fn(ctx, m->slots[i].key, m->slots[i].val);
}
