/* The distinct keys of a batch's lookups, in the order they are first seen,
 * and each lookup's place among them: how a stage gathers the rows a batch
 * reads into a small table of their own and rewrites the batch's ids as
 * rows of it (the remote tier's rows, src/model/stage_remote.c; a rank's
 * rows fetched from their owners, src/dist/sharded.c).
 *
 * An open-addressing set sized for the lookups, emptied after each run by
 * walking the keys it was given, so a run costs O(lookups) however large
 * the set.
 */
#ifndef DLREC_EMBED_UNIQUE_H
#define DLREC_EMBED_UNIQUE_H

#include <stdint.h>

#include "core/status.h"

typedef struct dlrec_unique {
  uint64_t cap;      /* keys a run may hold */
  uint64_t set_cap;  /* slots: a power of two, at least twice cap */
  uint64_t *set_key; /* UINT64_MAX: an empty slot */
  uint32_t *set_val;
} dlrec_unique;

/* Room for runs of up to n keys (grows, never shrinks); zero-initialize u
 * before the first call. */
dlrec_status dlrec_unique_reserve(dlrec_unique *u, uint64_t n);
void dlrec_unique_free(dlrec_unique *u); /* accepts a zeroed u */

/* The distinct values of keys[0, n) (n <= the reserved room, none
 * UINT64_MAX) into uniq, in first-seen order, *n_uniq of them; pos[k] = the
 * place of keys[k] in uniq. */
void dlrec_unique_run(dlrec_unique *u, const uint64_t *keys, uint64_t n, uint64_t *uniq, uint64_t *n_uniq,
                      uint32_t *pos);

#endif
