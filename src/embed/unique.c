/* The distinct keys of a batch's lookups (embed/unique.h). */
#include "embed/unique.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

dlrec_status dlrec_unique_reserve(dlrec_unique *u, uint64_t n) {
  if (n <= u->cap && u->set_key) return DLREC_OK;
  uint64_t cap = 64;
  while (cap < 2 * n) cap *= 2;
  uint64_t *key = malloc(cap * sizeof *key);
  uint32_t *val = malloc(cap * sizeof *val);
  if (!key || !val) {
    free(key), free(val);
    return dlrec_error(DLREC_ERR_NOMEM, "cannot hold the distinct rows of %llu lookups", (unsigned long long)n);
  }
  memset(key, 0xff, cap * sizeof *key);
  dlrec_unique_free(u);
  *u = (dlrec_unique){.cap = n, .set_cap = cap, .set_key = key, .set_val = val};
  return DLREC_OK;
}

void dlrec_unique_free(dlrec_unique *u) {
  free(u->set_key);
  free(u->set_val);
  *u = (dlrec_unique){0};
}

void dlrec_unique_run(dlrec_unique *u, const uint64_t *keys, uint64_t n, uint64_t *uniq, uint64_t *n_uniq,
                      uint32_t *pos) {
  const uint64_t mask = u->set_cap - 1;
  uint64_t m = 0;
  for (uint64_t k = 0; k < n; k++) {
    const uint64_t key = keys[k];
    uint64_t h = mix(key) & mask;
    while (u->set_key[h] != UINT64_MAX && u->set_key[h] != key) h = (h + 1) & mask;
    if (u->set_key[h] == UINT64_MAX) {
      u->set_key[h] = key;
      u->set_val[h] = (uint32_t)m;
      uniq[m++] = key;
    }
    pos[k] = u->set_val[h];
  }
  /* Empty the set for the next run: each key's probe run, from its home. */
  for (uint64_t k = 0; k < n; k++) {
    uint64_t h = mix(keys[k]) & mask;
    while (u->set_key[h] != UINT64_MAX) {
      u->set_key[h] = UINT64_MAX;
      h = (h + 1) & mask;
    }
  }
  *n_uniq = m;
}
