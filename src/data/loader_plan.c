/* The loader's planner (data/loader_impl.h): an epoch's order of row
 * groups, windows and slices (loader.c's opening comment and docs/formats.md
 * give the order), and each batch's segments, in batch order. */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "data/loader_impl.h"

/* ---- planning (under the lock) ---- */

static void plan_epoch(dlrec_loader *l, uint64_t epoch) {
  planner *p = &l->pl;
  for (uint32_t g = 0; g < l->G; g++) p->perm[g] = g;
  if (l->o.shuffle) {
    dlrec_rng r;
    dlrec_rng_seed(&r, l->o.seed, epoch << 32);
    dlrec_rng_shuffle_u32(&r, p->perm, l->G);
  }
  p->n_windows = (uint32_t)((l->G + (uint64_t)l->W - 1) / l->W);
}

static uint32_t window_first(const dlrec_loader *l, uint32_t w) { return (uint32_t)((uint64_t)w * l->W); }
static uint32_t window_end(const dlrec_loader *l, uint32_t w) {
  uint64_t e = ((uint64_t)w + 1) * l->W;
  return e < l->G ? (uint32_t)e : l->G;
}

static void plan_window(dlrec_loader *l, uint64_t epoch, uint32_t w) {
  planner *p = &l->pl;
  uint32_t n = 0;
  for (uint32_t k = window_first(l, w); k < window_end(l, w); k++) {
    uint32_t g = p->perm[k], rows = l->grows[g];
    for (uint64_t start = 0; start < rows; start += l->S) {
      uint64_t len = rows - start < l->S ? rows - start : l->S;
      p->slices[n++] = (slice){g, (uint32_t)start, (uint32_t)len};
    }
    /* Ask the kernel for the window's groups now: on a cold file the reads
     * overlap the copying of earlier slices. */
    dlrec_dlr_prefetch(l->files[l->gfile[g]], l->gindex[g]);
  }
  if (l->o.shuffle && n > 1) {
    dlrec_rng r;
    dlrec_rng_seed(&r, l->o.seed, (epoch << 32) + w + 1);
    for (uint32_t i = n; i > 1; i--) {
      uint32_t j = dlrec_rng_below(&r, i);
      slice t = p->slices[i - 1];
      p->slices[i - 1] = p->slices[j];
      p->slices[j] = t;
    }
  }
  p->window = w;
  p->n_slices = n;
  p->si = p->soff = 0;
}

/* Points the planner at row `row` (< N) of `epoch` without copying anything:
 * recomputes the epoch's group order, finds the window holding the row by
 * summing group rows, rebuilds that window's slices and walks them. */
void loader_plan_locate(dlrec_loader *l, uint64_t epoch, uint64_t row) {
  planner *p = &l->pl;
  plan_epoch(l, epoch);
  uint64_t before = 0;
  uint32_t w = 0;
  for (;; w++) {
    uint64_t rows = 0;
    for (uint32_t k = window_first(l, w); k < window_end(l, w); k++) rows += l->grows[p->perm[k]];
    if (before + rows > row) break;
    before += rows;
  }
  plan_window(l, epoch, w);
  while (before + p->slices[p->si].rows <= row) before += p->slices[p->si++].rows;
  p->soff = (uint32_t)(row - before);
  p->epoch = epoch;
  p->row = row;
  p->epoch_ready = 1;
}

static void note_group(dlrec_loader *l, slot *s, uint32_t g, uint64_t seq) {
  planner *p = &l->pl;
  if (p->mark[g] == seq + 1) return;
  p->mark[g] = seq + 1;
  uint8_t st = l->gstate[g];
  if (st == GROUP_OK) return;
  uint8_t act = ACT_CHECK;
  if (st == GROUP_UNCHECKED) {
    l->gstate[g] = GROUP_CLAIMED;
    act = ACT_CLAIMED_CHECK;
  } else if (st == GROUP_CLAIMED) {
    act = ACT_WAIT;
  }
  s->vgroups[s->n_vgroups] = g;
  s->vact[s->n_vgroups++] = act;
}

/* Plans batch `seq` into s, or returns DLREC_END when there is none. */
dlrec_status loader_plan_batch(dlrec_loader *l, slot *s, uint64_t seq) {
  planner *p = &l->pl;
  const uint64_t B = l->o.batch_rows;
  for (;;) {
    /* With no rows, or drop_last and fewer rows than a batch, no epoch ever
     * yields a batch: end rather than spin through empty epochs. */
    if (l->N == 0 || (l->o.drop_last && l->N < B)) return DLREC_END;
    if (l->o.epochs && p->epoch >= l->o.epochs) return DLREC_END;
    uint64_t rem = l->N - p->row;
    if (rem == 0 || (l->o.drop_last && rem < B)) {
      p->epoch++;
      p->row = 0;
      p->epoch_ready = 0;
      continue;
    }
    break;
  }
  if (!p->epoch_ready) loader_plan_locate(l, p->epoch, p->row);
  uint64_t rem = l->N - p->row;
  uint32_t n = (uint32_t)(rem < B ? rem : B), filled = 0, maxrows = 0;
  /* This part's rows [lo, hi) of the global batch. The planner walks all n
   * rows whatever the part, so that every part stays at the same place in
   * the stream; only the slices' pieces inside [lo, hi) become segments (and
   * only their groups are checked), placed relative to lo. */
  const uint32_t lo = (uint32_t)((uint64_t)n * l->o.part / l->o.parts);
  const uint32_t hi = (uint32_t)((uint64_t)n * (l->o.part + 1) / l->o.parts);
  s->n_segs = 0;
  s->n_vgroups = 0;
  while (filled < n) {
    if (p->si == p->n_slices) plan_window(l, p->epoch, p->window + 1);
    const slice *sl = &p->slices[p->si];
    uint32_t take = sl->rows - p->soff;
    if (take > n - filled) take = n - filled;
    uint32_t a = filled > lo ? filled : lo, z = filled + take < hi ? filled + take : hi;
    if (a < z) {
      uint32_t row = sl->row + p->soff + (a - filled);
      seg *last = s->n_segs ? &s->segs[s->n_segs - 1] : NULL;
      if (last && last->group == sl->group && last->row + last->rows == row) {
        last->rows += z - a; /* adjacent slices stay one copy (always so unshuffled) */
      } else {
        s->segs[s->n_segs++] = (seg){sl->group, row, z - a, a - lo};
        note_group(l, s, sl->group, seq);
      }
      if (s->segs[s->n_segs - 1].rows > maxrows) maxrows = s->segs[s->n_segs - 1].rows;
    }
    filled += take;
    p->soff += take;
    if (p->soff == sl->rows) {
      p->si++;
      p->soff = 0;
    }
  }
  s->singles = maxrows == 1;
  p->row += n;
  s->batch.rows = hi - lo; /* 0 when n < parts; handed out all the same */
  s->batch.epoch = p->epoch;
  s->batch.end = (dlrec_position){p->epoch, p->row, l->fingerprint};
  return DLREC_OK;
}
