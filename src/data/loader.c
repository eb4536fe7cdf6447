/* The loader: batches from mapped .dlr files, shuffled by windows of row
 * groups and slices of rows, assembled ahead by worker threads.
 *
 * Shape of the work. A *planner* (under the loader's lock, run by whichever
 * worker needs the next batch) turns batch number `seq` into a list of
 * segments: runs of consecutive rows of one row group and where they go in
 * the batch. Planning is cheap (one entry per slice) and strictly in `seq`
 * order, so a batch's content depends only on (files, options, seed, epoch,
 * position), never on the number of threads or their timing. Workers then
 * copy the segments column by column into one of the ring's batch buffers,
 * in parallel and outside the lock. The consumer takes buffers in `seq`
 * order. A loader for part p of `parts` (data parallelism) plans the same
 * global batches and keeps only the segments of its rows of each.
 *
 * Order of an epoch (shuffle on): the row groups of all files (numbered
 * file by file) are permuted by rng(seed, stream = epoch << 32); the
 * permutation is cut into windows of window_groups groups; window w's groups
 * are cut into slices of slice_rows consecutive rows (the last slice of a
 * group may be shorter) and the slices are permuted by
 * rng(seed, stream = (epoch << 32) + w + 1). The epoch's row stream is the
 * windows' slices in that order; batches are consecutive batch_rows runs of
 * it, so they cross window boundaries, and only an epoch's last batch can be
 * short. Shuffle off: groups in file order, each one slice.
 *
 * Speed. Per batch the copy is, per column, one memcpy per segment from the
 * mapped group into the batch buffer: no per-row branch, nothing allocated
 * (the id buffers of variable-hotness columns only grow, a few times early
 * on). Roofline for the Criteo shape (label + 13 dense f32 + 26 one-hot
 * u32): 160 bytes per row read from the page cache and 160 written to a
 * batch buffer that stays in L2 (2048 rows = 328 KB). One core copies
 * ~10-20 GB/s from DRAM (bench_loader measured 18.8 GB/s here), so the copy
 * limit is ~60-120M rows/s per core; the goal of 20M rows/s (3.2 GB/s read)
 * leaves room for the per-segment overhead (28 memcpy calls per 32-row
 * slice, ~0.9 calls per row). Measured on a shared 2-core VM (5M rows, 77
 * groups): ~33M rows/s at batch 2048 with one assembling thread (0.3 of the
 * memcpy bandwidth), ~43M with two; ~18M at batch 128 (per-batch handoff).
 * slice_rows 1 is a different regime: every value is a random cache line (a
 * 16x read amplification for 4-byte values), ~3.5M rows/s with a window of
 * 8 groups of 64k rows. bench/bench_loader prints these figures. Row-group
 * checksums are verified once per group, on first use, by the worker that
 * first needs the group.
 *
 * Synchronization. One mutex guards the planner, group states and waiter
 * counts. Slot states are atomics so that the consumer's fast path (the batch
 * is ready, no worker asleep) takes no lock; the consumer spins ~20 us before
 * sleeping, because small batches are ready sooner than a futex round trip.
 */
#include "data/loader.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "data/dlr.h"
#include "core/hash.h"
#include "core/clock.h"
#include "core/rng.h"

#define MAX_BATCH_ROWS (1u << 24)
#define MAX_PREFETCH 1024u
#define MAX_THREADS 256u
#define MAX_PARTS 4096u

typedef unsigned long long ull;

/* A run of consecutive rows of one row group, and where it lands. */
typedef struct seg {
  uint32_t group; /* global group number */
  uint32_t row;   /* first row in the group */
  uint32_t rows;
  uint32_t dest; /* first row in the batch */
} seg;

/* A window's slice; the planner's unit of shuffling. */
typedef struct slice {
  uint32_t group, row, rows;
} slice;

enum { SLOT_FREE, SLOT_FILLING, SLOT_READY };
/* Verification state of a group, guarded by the lock. CLAIMED: the job that
 * first touched the group (in seq order) is checking it; later jobs wait.
 * RECHECK: not known good (its check failed, or its claimant failed before
 * getting to it); every job that needs it checks it itself, without a claim.
 * So a group is claimed at most once between seeks, and a wait always points
 * at an earlier job: no cycles. A seek (nothing in flight) turns RECHECK back
 * into UNCHECKED. */
enum { GROUP_UNCHECKED, GROUP_CLAIMED, GROUP_OK, GROUP_RECHECK };
/* What a job does about a group before copying from it. */
enum { ACT_CHECK, ACT_CLAIMED_CHECK, ACT_WAIT };

typedef struct slot {
  int state; /* SLOT_*; accessed with __atomic builtins only */
  dlrec_status status;
  dlrec_error_copy err;
  dlrec_batch batch;
  seg *segs;
  uint32_t n_segs;
  int singles;       /* every segment is one row (slice_rows 1) */
  uint32_t *vgroups; /* distinct groups of this batch that need a check or a wait */
  uint8_t *vact;
  uint32_t n_vgroups;
  float *labels, *dense;
  uint32_t *ids[DLREC_MAX_SPARSE];
  uint32_t *offs[DLREC_MAX_SPARSE]; /* variable-hotness columns only */
  /* Ids capacity of variable-hotness columns (malloc'd, grown on demand):
   * batch_rows * max_hotness can be far more than batches ever hold. */
  uint64_t ids_cap[DLREC_MAX_SPARSE];
} slot;

/* Slot states are read without the lock by the consumer's spin and by its
 * release of a slot, so every access is atomic; seq_cst where a store must
 * be ordered before a load of a waiter count (see dlrec_loader_next). */
static inline int slot_state(const slot *s) { return __atomic_load_n(&s->state, __ATOMIC_SEQ_CST); }
static inline void slot_set(slot *s, int state) { __atomic_store_n(&s->state, state, __ATOMIC_SEQ_CST); }

typedef struct planner {
  uint64_t epoch, row; /* the next row to plan */
  int epoch_ready;     /* perm/window/cursor describe (epoch, row) */
  uint32_t *perm;      /* (G) the epoch's group order */
  uint32_t n_windows, window;
  slice *slices;               /* (slice_cap) the current window's slices, in order */
  uint32_t n_slices, si, soff; /* cursor: slice index and rows taken from it */
  uint64_t *mark;              /* (G) seq + 1 of the last job that listed the group */
} planner;

struct dlrec_loader {
  dlrec_loader_opts o;
  int n_files;
  dlrec_dlr **files;
  dlrec_schema schema;
  uint32_t G; /* row groups, all files */
  uint32_t *gfile, *gindex, *grows;
  uint32_t P;        /* pointers per group in gptr */
  const void **gptr; /* (G, P): labels, dense, ids[ns], offsets of variable columns */
  uint32_t var_slot[DLREC_MAX_SPARSE];
  int has_variable; /* some column has variable hotness */
  uint64_t N;       /* rows per epoch */
  uint64_t fingerprint;
  uint32_t W, S; /* effective window groups and slice rows */
  uint32_t slice_cap;
  uint8_t *gstate;
  planner pl;
  uint32_t R; /* ring size: prefetch + 1 (one held by the consumer) */
  slot *slots;
  dlrec_arena arena;

  pthread_mutex_t mu;
  pthread_cond_t cv_work;  /* workers wait for a free slot */
  pthread_cond_t cv_ready; /* the consumer, seek and verification waiters */
  pthread_t *threads;
  uint32_t n_threads;
  uint64_t planned, consumed; /* next seq to plan / to hand out */
  int held;                   /* the consumer holds slot (consumed - 1) */
  int plan_end;               /* the planner reached the end at seq end_seq */
  uint64_t end_seq;
  int paused, shutdown;
  uint32_t in_flight; /* jobs being filled */
  /* Waiter counts, so that the common case (nobody asleep) costs no futex
   * call. workers_waiting is also read without the lock (see next). */
  uint32_t workers_waiting, verify_waiting;
  int consumer_waiting;
  int failed; /* a batch failed: next() repeats its error */
  dlrec_error_copy failure;
  dlrec_position pos;
};

void dlrec_loader_opts_default(dlrec_loader_opts *o) {
  memset(o, 0, sizeof *o);
  o->batch_rows = 2048;
  o->shuffle = 1;
  o->window_groups = 8;
  o->slice_rows = 32;
  o->seed = 0;
  o->epochs = 1;
  o->drop_last = 0;
  o->prefetch = 4;
  o->threads = 1;
  o->verify = 1;
  o->part = 0;
  o->parts = 1;
}

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
static void plan_locate(dlrec_loader *l, uint64_t epoch, uint64_t row) {
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
static dlrec_status plan_batch(dlrec_loader *l, slot *s, uint64_t seq) {
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
  if (!p->epoch_ready) plan_locate(l, p->epoch, p->row);
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

/* ---- filling (workers, outside the lock) ---- */

static dlrec_status check_group(dlrec_loader *l, uint32_t g) {
  const dlrec_dlr *f = l->files[l->gfile[g]];
  return l->o.verify ? dlrec_dlr_verify(f, l->gindex[g]) : dlrec_dlr_check_offsets(f, l->gindex[g]);
}

/* Resolves every group of the job: check the ones it claimed (or must check
 * itself), wait for the ones an earlier job is checking. Waits only point at
 * earlier jobs, which are already running, so they end. On failure the job's
 * unresolved claims become RECHECK, so nobody waits on them. */
static dlrec_status resolve_groups(dlrec_loader *l, slot *s) {
  dlrec_status st = DLREC_OK;
  uint32_t k = 0;
  for (; k < s->n_vgroups && st == DLREC_OK; k++) {
    uint32_t g = s->vgroups[k];
    if (s->vact[k] == ACT_WAIT) {
      pthread_mutex_lock(&l->mu);
      l->verify_waiting++;
      while (l->gstate[g] == GROUP_CLAIMED) pthread_cond_wait(&l->cv_ready, &l->mu);
      l->verify_waiting--;
      int ok = l->gstate[g] == GROUP_OK;
      pthread_mutex_unlock(&l->mu);
      if (ok) continue;
    }
    st = check_group(l, g);
    pthread_mutex_lock(&l->mu);
    if (s->vact[k] == ACT_CLAIMED_CHECK) {
      l->gstate[g] = st == DLREC_OK ? GROUP_OK : GROUP_RECHECK;
      if (l->verify_waiting) pthread_cond_broadcast(&l->cv_ready);
    } else if (st == DLREC_OK) {
      l->gstate[g] = GROUP_OK; /* RECHECK, found good after all */
    }
    pthread_mutex_unlock(&l->mu);
  }
  if (st != DLREC_OK) {
    pthread_mutex_lock(&l->mu);
    for (; k < s->n_vgroups; k++)
      if (s->vact[k] == ACT_CLAIMED_CHECK) l->gstate[s->vgroups[k]] = GROUP_RECHECK;
    if (l->verify_waiting) pthread_cond_broadcast(&l->cv_ready);
    pthread_mutex_unlock(&l->mu);
  }
  return st;
}

/* Makes room for this batch's ids in the variable-hotness columns. Buffers
 * only grow (doubling), so after the first batches nothing is allocated. */
static dlrec_status reserve_variable(const dlrec_loader *l, slot *s) {
  const dlrec_schema *sc = &l->schema;
  for (uint32_t c = 0; c < sc->n_sparse; c++) {
    if (sc->sparse[c].hotness) continue;
    uint64_t need = 0;
    for (uint32_t k = 0; k < s->n_segs; k++) {
      const uint32_t *so = (const uint32_t *)l->gptr[(size_t)s->segs[k].group * l->P + l->var_slot[c]] + s->segs[k].row;
      need += so[s->segs[k].rows] - so[0];
    }
    if (need <= s->ids_cap[c]) continue;
    uint64_t cap = s->ids_cap[c] * 2 > need ? s->ids_cap[c] * 2 : need;
    uint32_t *p = realloc(s->ids[c], cap * 4);
    if (!p)
      return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for %llu ids of column '%s'", (ull)cap,
                         sc->sparse[c].name);
    s->ids[c] = p;
    s->batch.ids[c] = p;
    s->ids_cap[c] = cap;
  }
  return DLREC_OK;
}

/* Copies the job's segments, column by column: each column of each segment
 * is one contiguous run in the group and in the batch. */
/* Rows prefetched ahead in the one-row-per-segment loops. */
#define AHEAD 32
/* Segments prefetched ahead in the run loops: the start (and end) of a
 * random slice is a cache miss the hardware prefetcher cannot guess
 * (~15% faster here). */
#define SEG_AHEAD 8
static void copy_segments(const dlrec_loader *l, slot *s) {
  const dlrec_schema *sc = &l->schema;
  const uint32_t P = l->P, nd = sc->n_dense, ns = sc->n_sparse, n = s->n_segs;
  const void *const *gp = l->gptr;
  const seg *sg = s->segs;
  if (s->singles) {
    /* slice_rows 1: a call per value would cost more than the value, and
     * every value is a cache miss (a random row of a window larger than the
     * cache), so the loops prefetch AHEAD rows ahead to keep many misses in
     * flight (about 1.5-2x here). */
    if (sc->has_label) {
      float *dst = s->labels;
      for (uint32_t k = 0; k < n; k++) {
        if (k + AHEAD < n) __builtin_prefetch((const float *)gp[(size_t)sg[k + AHEAD].group * P] + sg[k + AHEAD].row);
        dst[sg[k].dest] = ((const float *)gp[(size_t)sg[k].group * P])[sg[k].row];
      }
    }
    if (nd) {
      float *dst = s->dense;
      for (uint32_t k = 0; k < n; k++) {
        if (k + AHEAD < n)
          __builtin_prefetch((const float *)gp[(size_t)sg[k + AHEAD].group * P + 1] + (size_t)sg[k + AHEAD].row * nd);
        const float *src = (const float *)gp[(size_t)sg[k].group * P + 1] + (size_t)sg[k].row * nd;
        float *d = dst + (size_t)sg[k].dest * nd;
        for (uint32_t j = 0; j < nd; j++) d[j] = src[j];
      }
    }
  } else {
    if (sc->has_label) {
      float *dst = s->labels;
      for (uint32_t k = 0; k < n; k++) {
        if (k + SEG_AHEAD < n)
          __builtin_prefetch((const float *)gp[(size_t)sg[k + SEG_AHEAD].group * P] + sg[k + SEG_AHEAD].row);
        memcpy(dst + sg[k].dest, (const float *)gp[(size_t)sg[k].group * P] + sg[k].row, 4ull * sg[k].rows);
      }
    }
    if (nd) {
      float *dst = s->dense;
      for (uint32_t k = 0; k < n; k++) {
        if (k + SEG_AHEAD < n)
          __builtin_prefetch((const float *)gp[(size_t)sg[k + SEG_AHEAD].group * P + 1] +
                             (size_t)sg[k + SEG_AHEAD].row * nd);
        memcpy(dst + (size_t)sg[k].dest * nd, (const float *)gp[(size_t)sg[k].group * P + 1] + (size_t)sg[k].row * nd,
               4ull * sg[k].rows * nd);
      }
    }
  }
  for (uint32_t c = 0; c < ns; c++) {
    const uint32_t h = sc->sparse[c].hotness;
    uint32_t *dst = s->ids[c];
    if (h == 1 && s->singles) {
      for (uint32_t k = 0; k < n; k++) {
        if (k + AHEAD < n)
          __builtin_prefetch((const uint32_t *)gp[(size_t)sg[k + AHEAD].group * P + 2 + c] + sg[k + AHEAD].row);
        dst[sg[k].dest] = ((const uint32_t *)gp[(size_t)sg[k].group * P + 2 + c])[sg[k].row];
      }
    } else if (h) {
      for (uint32_t k = 0; k < n; k++) {
        if (k + SEG_AHEAD < n) {
          const char *q = (const char *)((const uint32_t *)gp[(size_t)sg[k + SEG_AHEAD].group * P + 2 + c] +
                                         (size_t)sg[k + SEG_AHEAD].row * h);
          __builtin_prefetch(q);
          __builtin_prefetch(q + 4ull * sg[k + SEG_AHEAD].rows * h - 1);
        }
        memcpy(dst + (size_t)sg[k].dest * h,
               (const uint32_t *)gp[(size_t)sg[k].group * P + 2 + c] + (size_t)sg[k].row * h, 4ull * sg[k].rows * h);
      }
    } else {
      /* Variable hotness: the ids of a run are contiguous too; the offsets
       * are rebased onto the batch's running id count. */
      uint32_t *off = s->offs[c], base = 0;
      off[0] = 0;
      for (uint32_t k = 0; k < n; k++) {
        const uint32_t *so = (const uint32_t *)gp[(size_t)sg[k].group * P + l->var_slot[c]] + sg[k].row;
        const uint32_t *sid = (const uint32_t *)gp[(size_t)sg[k].group * P + 2 + c];
        uint32_t a = so[0], z = so[sg[k].rows];
        memcpy(dst + base, sid + a, 4ull * (z - a));
        uint32_t *o = off + sg[k].dest + 1;
        for (uint32_t i = 1; i <= sg[k].rows; i++) o[i - 1] = base + (so[i] - a);
        base += z - a;
      }
    }
  }
}

static dlrec_status fill(dlrec_loader *l, slot *s) {
  dlrec_status st = s->n_vgroups ? resolve_groups(l, s) : DLREC_OK;
  if (st == DLREC_OK && l->has_variable) st = reserve_variable(l, s); /* offsets are sound now */
  if (st != DLREC_OK) return st;
  copy_segments(l, s);
  return DLREC_OK;
}

/* Whether a worker may plan the next batch now (under the lock). */
static int can_plan(const dlrec_loader *l) {
  return !l->paused && !l->plan_end && slot_state(&l->slots[l->planned % l->R]) == SLOT_FREE;
}

static void *worker_main(void *arg) {
  dlrec_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->shutdown && !can_plan(l)) {
      /* Announce, then look again: the consumer frees slots without the
       * lock, storing the state before reading workers_waiting (both
       * seq_cst), so either it sees us waiting or we see the free slot. */
      __atomic_add_fetch(&l->workers_waiting, 1, __ATOMIC_SEQ_CST);
      if (!l->shutdown && !can_plan(l)) pthread_cond_wait(&l->cv_work, &l->mu);
      __atomic_sub_fetch(&l->workers_waiting, 1, __ATOMIC_SEQ_CST);
    }
    if (l->shutdown) break;
    uint64_t seq = l->planned;
    slot *s = &l->slots[seq % l->R];
    if (plan_batch(l, s, seq) == DLREC_END) {
      l->plan_end = 1;
      l->end_seq = seq;
      if (l->consumer_waiting) pthread_cond_broadcast(&l->cv_ready);
      continue;
    }
    slot_set(s, SLOT_FILLING);
    l->planned++;
    l->in_flight++;
    pthread_mutex_unlock(&l->mu);

    dlrec_clear_error();
    dlrec_status st = fill(l, s);
    if (st != DLREC_OK) dlrec_error_save(&s->err);

    pthread_mutex_lock(&l->mu);
    s->status = st;
    slot_set(s, SLOT_READY); /* after status: the consumer's spin reads status once it sees READY */
    l->in_flight--;
    if (l->consumer_waiting || l->paused || l->verify_waiting) pthread_cond_broadcast(&l->cv_ready);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ---- opening ---- */

static dlrec_status check_opts(const dlrec_loader_opts *o) {
  if (o->batch_rows < 1 || o->batch_rows > MAX_BATCH_ROWS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: batch_rows %u is out of range [1, %u]", o->batch_rows,
                       MAX_BATCH_ROWS);
  if (o->shuffle && o->window_groups < 1)
    return dlrec_error(DLREC_ERR_INVALID, "loader: window_groups must be at least 1");
  if (o->shuffle && o->slice_rows < 1) return dlrec_error(DLREC_ERR_INVALID, "loader: slice_rows must be at least 1");
  if (o->prefetch < 1 || o->prefetch > MAX_PREFETCH)
    return dlrec_error(DLREC_ERR_INVALID, "loader: prefetch %u is out of range [1, %u]", o->prefetch, MAX_PREFETCH);
  if (o->threads < 1 || o->threads > MAX_THREADS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: threads %u is out of range [1, %u]", o->threads, MAX_THREADS);
  uint32_t parts = o->parts ? o->parts : 1;
  if (parts > MAX_PARTS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: parts %u is out of range [1, %u]", o->parts, MAX_PARTS);
  if (o->part >= parts)
    return dlrec_error(DLREC_ERR_INVALID, "loader: part %u is out of range for parts %u (part must be below parts)",
                       o->part, parts);
  return DLREC_OK;
}

/* Names the first difference between two schemas, for the error that
 * refuses to mix files. */
static void schema_diff(const dlrec_schema *a, const dlrec_schema *b, char *out, size_t n) {
  if (a->has_label != b->has_label)
    snprintf(out, n, "one has a label, the other not");
  else if (a->n_dense != b->n_dense)
    snprintf(out, n, "%u vs %u dense columns", a->n_dense, b->n_dense);
  else if (a->n_sparse != b->n_sparse)
    snprintf(out, n, "%u vs %u sparse columns", a->n_sparse, b->n_sparse);
  else if (a->table_rows != b->table_rows)
    snprintf(out, n, "table rows %llu vs %llu", (ull)a->table_rows, (ull)b->table_rows);
  else {
    snprintf(out, n, "column names differ");
    for (uint32_t i = 0; i < a->n_sparse; i++) {
      const dlrec_sparse_col *x = &a->sparse[i], *y = &b->sparse[i];
      if (strcmp(x->name, y->name) || x->hotness != y->hotness || x->max_hotness != y->max_hotness ||
          x->id_begin != y->id_begin || x->id_end != y->id_end) {
        snprintf(out, n, "sparse column %u: '%s' hotness %u ids [%llu, %llu) vs '%s' hotness %u ids [%llu, %llu)", i,
                 x->name, x->hotness, (ull)x->id_begin, (ull)x->id_end, y->name, y->hotness, (ull)y->id_begin,
                 (ull)y->id_end);
        break;
      }
    }
  }
}

static int cmp_desc_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static dlrec_status open_files(dlrec_loader *l, const char *const *paths, int n_paths) {
  l->files = calloc((size_t)n_paths, sizeof *l->files);
  if (!l->files) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  l->n_files = n_paths;
  uint64_t groups = 0;
  for (int i = 0; i < n_paths; i++) {
    dlrec_status st = dlrec_dlr_open(&l->files[i], paths[i]);
    if (st != DLREC_OK) return st;
    const dlrec_schema *s = dlrec_dlr_schema(l->files[i]);
    if (i == 0)
      l->schema = *s;
    else if (!dlrec_schema_equal(&l->schema, s)) {
      char diff[400];
      schema_diff(&l->schema, s, diff, sizeof diff);
      return dlrec_error(DLREC_ERR_INVALID, "%s: its schema differs from %s's (%s); one stream needs one encoding",
                         paths[i], paths[0], diff);
    }
    groups += dlrec_dlr_row_groups(l->files[i]);
    l->N += dlrec_dlr_rows(l->files[i]);
  }
  if (groups >= UINT32_MAX)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "loader: %llu row groups in all (at most %u)", (ull)groups,
                       UINT32_MAX - 1);
  l->G = (uint32_t)groups;
  return DLREC_OK;
}

/* The group table: file, index, rows and column pointers of every group,
 * so that copying needs one table lookup per segment and column. */
static dlrec_status build_groups(dlrec_loader *l) {
  const dlrec_schema *s = &l->schema;
  uint32_t nvar = 0;
  for (uint32_t c = 0; c < s->n_sparse; c++)
    if (!s->sparse[c].hotness) l->var_slot[c] = 2 + s->n_sparse + nvar++;
  l->has_variable = nvar > 0;
  l->P = 2 + s->n_sparse + nvar;
  size_t G = l->G ? l->G : 1;
  l->gfile = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->gindex = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->grows = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->gstate = dlrec_arena_alloc(&l->arena, G, 64);
  l->gptr = dlrec_arena_alloc(&l->arena, G * l->P * sizeof(void *), 64);
  if (!l->gfile || !l->gindex || !l->grows || !l->gstate || !l->gptr)
    return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for %u row groups", l->G);
  uint32_t g = 0;
  dlrec_rowgroup rg;
  for (int f = 0; f < l->n_files; f++) {
    for (uint32_t i = 0; i < dlrec_dlr_row_groups(l->files[f]); i++, g++) {
      dlrec_status st = dlrec_dlr_row_group(l->files[f], i, &rg);
      if (st != DLREC_OK) return st;
      l->gfile[g] = (uint32_t)f;
      l->gindex[g] = i;
      l->grows[g] = rg.rows;
      const void **p = l->gptr + (size_t)g * l->P;
      p[0] = rg.labels;
      p[1] = rg.dense;
      for (uint32_t c = 0; c < s->n_sparse; c++) {
        p[2 + c] = rg.ids[c];
        if (!s->sparse[c].hotness) p[l->var_slot[c]] = rg.offsets[c];
      }
    }
  }
  return DLREC_OK;
}

/* Batch buffers, allocated once: labels, dense and per-column ids and
 * offsets; fixed-hotness columns share one precomputed offsets array per
 * hotness (row i starts at i * hotness in every batch). */
static dlrec_status build_slots(dlrec_loader *l) {
  const dlrec_schema *s = &l->schema;
  const uint64_t batch_rows = l->o.batch_rows;
  /* No batch holds more rows than an epoch, so the buffers are sized for
   * min(batch_rows, rows) (0 when there are none: no batch is ever planned).
   * A header may declare any hotness: sized by batch_rows alone, a 0-row
   * file of a few hundred bytes declaring 2^24 ids per row made each slot
   * allocate and clear gigabytes; sized by the rows, the ids a buffer holds
   * are bounded by the ids the files hold. */
  const uint64_t B = l->N < batch_rows ? l->N : batch_rows;
  dlrec_arena *a = &l->arena;
  const uint32_t *fixed[DLREC_MAX_SPARSE] = {0};
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    uint32_t h = s->sparse[c].hotness;
    if (batch_rows * s->sparse[c].max_hotness > UINT32_MAX)
      return dlrec_error(DLREC_ERR_INVALID,
                         "loader: batch_rows %llu times max hotness %u of column '%s' overflows 32-bit offsets",
                         (ull)batch_rows, s->sparse[c].max_hotness, s->sparse[c].name);
    if (!h) continue;
    for (uint32_t d = 0; d < c && !fixed[c]; d++)
      if (s->sparse[d].hotness == h) fixed[c] = fixed[d];
    if (!fixed[c]) {
      uint32_t *o = dlrec_arena_alloc(a, (B + 1) * 4, 64);
      if (!o) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
      for (uint64_t i = 0; i <= B; i++) o[i] = (uint32_t)(i * h);
      fixed[c] = o;
    }
  }
  l->slots = dlrec_arena_alloc(a, l->R * sizeof *l->slots, 64);
  if (!l->slots) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  for (uint32_t k = 0; k < l->R; k++) {
    slot *sl = &l->slots[k];
    sl->segs = dlrec_arena_alloc(a, B * sizeof(seg), 64);
    sl->vgroups = dlrec_arena_alloc(a, B * 4, 64);
    sl->vact = dlrec_arena_alloc(a, B, 64);
    sl->labels = dlrec_arena_alloc(a, B * 4, 64);
    sl->dense = dlrec_arena_alloc(a, B * 4 * (s->n_dense ? s->n_dense : 1), 64);
    if (!sl->segs || !sl->vgroups || !sl->vact || !sl->labels || !sl->dense)
      return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for batch buffers");
    sl->batch.labels = s->has_label ? sl->labels : NULL;
    sl->batch.dense = sl->dense;
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      if (s->sparse[c].hotness) {
        sl->ids[c] = dlrec_arena_alloc(a, B * 4 * s->sparse[c].hotness, 64);
      } else {
        /* Start at up to 4 ids per row; reserve_variable grows it. */
        sl->ids_cap[c] = B * (s->sparse[c].max_hotness < 4 ? s->sparse[c].max_hotness : 4);
        sl->ids[c] = malloc(sl->ids_cap[c] ? sl->ids_cap[c] * 4 : 4);
        sl->offs[c] = dlrec_arena_alloc(a, (B + 1) * 4, 64);
      }
      if (!sl->ids[c] || (!s->sparse[c].hotness && !sl->offs[c]))
        return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for batch buffers");
      sl->batch.ids[c] = sl->ids[c];
      sl->batch.offsets[c] = s->sparse[c].hotness ? fixed[c] : sl->offs[c];
    }
  }
  return DLREC_OK;
}

/* The planner's arrays. The slice array must hold the largest window: the
 * sum of the window_groups largest per-group slice counts. */
static dlrec_status build_planner(dlrec_loader *l) {
  size_t G = l->G ? l->G : 1;
  uint32_t *counts = malloc(G * 4);
  if (!counts) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  for (uint32_t g = 0; g < l->G; g++) counts[g] = (uint32_t)((l->grows[g] + (uint64_t)l->S - 1) / l->S);
  qsort(counts, l->G, 4, cmp_desc_u32);
  uint64_t cap = 0;
  for (uint32_t g = 0; g < l->G && g < l->W; g++) cap += counts[g];
  free(counts);
  if (cap > UINT32_MAX)
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "loader: a window of %u row groups has %llu slices (at most %u): use "
                       "fewer window_groups or larger slice_rows",
                       l->W, (ull)cap, UINT32_MAX);
  l->slice_cap = (uint32_t)(cap ? cap : 1);
  l->pl.perm = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->pl.mark = dlrec_arena_alloc(&l->arena, G * 8, 64);
  l->pl.slices = dlrec_arena_alloc(&l->arena, (size_t)l->slice_cap * sizeof(slice), 64);
  if (!l->pl.perm || !l->pl.mark || !l->pl.slices)
    return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for a window of %u slices", l->slice_cap);
  return DLREC_OK;
}

/* Identity of the row stream: the files' content in order, and the options
 * that shape the order. batch_rows and drop_last are left out on purpose: a
 * position is a row of the stream, valid for any batch size. */
static uint64_t stream_fingerprint(const dlrec_loader *l) {
  uint64_t h = dlrec_hash_bytes("dlrec loader v1", 15, 0);
  for (int i = 0; i < l->n_files; i++) h = dlrec_mix64(h ^ dlrec_dlr_fingerprint(l->files[i])) + (uint64_t)i;
  if (l->o.shuffle) {
    h = dlrec_mix64(h ^ 0x5348554646ull); /* "SHUFF" */
    h = dlrec_mix64(h ^ l->o.window_groups);
    h = dlrec_mix64(h ^ ((uint64_t)l->o.slice_rows << 1));
    h = dlrec_mix64(h ^ l->o.seed);
  }
  return h;
}

static void stop_threads(dlrec_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->shutdown = 1;
  pthread_cond_broadcast(&l->cv_work);
  pthread_cond_broadcast(&l->cv_ready);
  pthread_mutex_unlock(&l->mu);
  for (uint32_t t = 0; t < l->n_threads; t++) pthread_join(l->threads[t], NULL);
  l->n_threads = 0;
}

dlrec_status dlrec_loader_open(dlrec_loader **out, const char *const *paths, int n_paths, const dlrec_loader_opts *o) {
  *out = NULL;
  dlrec_status st = check_opts(o);
  if (st != DLREC_OK) return st;
  if (n_paths < 1) return dlrec_error(DLREC_ERR_INVALID, "loader: no input files");
  dlrec_loader *l = calloc(1, sizeof *l);
  if (!l) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  l->o = *o;
  if (!l->o.parts) l->o.parts = 1;
  dlrec_arena_init(&l->arena, 1 << 20);
  /* Adaptive: critical sections are short (plan a batch, flip a state), so
   * spinning briefly beats sleeping on contention. */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&l->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_cond_init(&l->cv_work, NULL);
  pthread_cond_init(&l->cv_ready, NULL);
  l->W = o->shuffle ? o->window_groups : 1;
  l->S = o->shuffle ? o->slice_rows : UINT32_MAX;
  l->R = o->prefetch + 1;
  st = open_files(l, paths, n_paths);
  if (st == DLREC_OK) st = build_groups(l);
  if (st == DLREC_OK) st = build_planner(l);
  if (st == DLREC_OK) st = build_slots(l);
  if (st == DLREC_OK) {
    l->threads = calloc(o->threads, sizeof *l->threads);
    if (!l->threads) st = dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  }
  if (st == DLREC_OK) {
    l->fingerprint = stream_fingerprint(l);
    l->pos = (dlrec_position){0, 0, l->fingerprint};
    for (; l->n_threads < o->threads; l->n_threads++)
      if (pthread_create(&l->threads[l->n_threads], NULL, worker_main, l) != 0) {
        st = dlrec_error(DLREC_ERR_INTERNAL, "loader: cannot start an assembling thread");
        break;
      }
  }
  if (st != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    dlrec_loader_close(l);
    return dlrec_error_restore(&e);
  }
  *out = l;
  return DLREC_OK;
}

const dlrec_schema *dlrec_loader_schema(const dlrec_loader *l) { return &l->schema; }
uint64_t dlrec_loader_epoch_rows(const dlrec_loader *l) { return l->N; }
uint64_t dlrec_loader_fingerprint(const dlrec_loader *l) { return l->fingerprint; }

/* How long the consumer spins before it sleeps: a small batch is assembled
 * in a few microseconds, less than a futex sleep and wake-up cost; a large
 * one takes longer, and then spinning would only take a core from the
 * workers. */
#define CONSUMER_SPIN_SECONDS 20e-6

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

dlrec_status dlrec_loader_next(dlrec_loader *l, const dlrec_batch **b) {
  *b = NULL;
  if (l->held) {
    /* Free the batch handed out last time, without the lock when no worker
     * sleeps (the seq_cst pair with worker_main's announcement). */
    slot_set(&l->slots[(l->consumed - 1) % l->R], SLOT_FREE);
    l->held = 0;
    if (__atomic_load_n(&l->workers_waiting, __ATOMIC_SEQ_CST)) {
      pthread_mutex_lock(&l->mu);
      pthread_cond_broadcast(&l->cv_work);
      pthread_mutex_unlock(&l->mu);
    }
  }
  if (l->failed) return dlrec_error_restore(&l->failure);
  slot *s = &l->slots[l->consumed % l->R];
  int ready = 0;
  double spin_until = 0;
  for (uint32_t i = 0; !(ready = slot_state(s) == SLOT_READY); i++) {
    if ((i & 63) == 0) {
      double now = dlrec_now();
      if (i == 0)
        spin_until = now + CONSUMER_SPIN_SECONDS;
      else if (now > spin_until)
        break;
    }
    cpu_relax();
  }
  if (!ready) {
    pthread_mutex_lock(&l->mu);
    l->consumer_waiting = 1;
    while (!(ready = slot_state(s) == SLOT_READY) && !(l->plan_end && l->end_seq == l->consumed))
      pthread_cond_wait(&l->cv_ready, &l->mu);
    l->consumer_waiting = 0;
    pthread_mutex_unlock(&l->mu);
    if (!ready) return DLREC_END;
  }
  /* READY with the ring's seq: slot consumed % R can only hold seq consumed
   * (older occupants were handed out, later ones need it free first). */
  if (s->status != DLREC_OK) {
    /* Sticky: the stream cannot go on past a bad batch without losing rows. */
    l->failed = 1;
    l->failure = s->err;
    pthread_mutex_lock(&l->mu);
    slot_set(s, SLOT_FREE);
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    return dlrec_error_restore(&l->failure);
  }
  l->held = 1;
  l->consumed++;
  l->pos = s->batch.end;
  *b = &s->batch;
  return DLREC_OK;
}

/* pos changes only in next and seek, on the consumer's thread: no lock. */
dlrec_position dlrec_loader_position(const dlrec_loader *l) { return l->pos; }

dlrec_status dlrec_loader_seek(dlrec_loader *l, dlrec_position p) {
  if (p.fingerprint != l->fingerprint)
    return dlrec_error(
        DLREC_ERR_INVALID,
        "loader: position fingerprint 0x%016llx does not match this loader's 0x%016llx: the files, their "
        "order or the shuffle options (shuffle, window_groups, slice_rows, seed) differ from the run "
        "that saved it",
        (ull)p.fingerprint, (ull)l->fingerprint);
  if (p.row > l->N)
    return dlrec_error(DLREC_ERR_INVALID, "loader: position row %llu is past the %llu rows of an epoch", (ull)p.row,
                       (ull)l->N);
  if (l->o.epochs && (p.epoch > l->o.epochs || (p.epoch == l->o.epochs && p.row > 0)))
    return dlrec_error(DLREC_ERR_INVALID, "loader: position epoch %llu row %llu is past the last epoch (%u epochs)",
                       (ull)p.epoch, (ull)p.row, l->o.epochs);
  pthread_mutex_lock(&l->mu);
  l->paused = 1;
  while (l->in_flight) pthread_cond_wait(&l->cv_ready, &l->mu);
  for (uint32_t k = 0; k < l->R; k++) slot_set(&l->slots[k], SLOT_FREE);
  l->held = 0;
  l->planned = l->consumed = 0;
  l->plan_end = 0;
  l->failed = 0;
  planner *pl = &l->pl;
  memset(pl->mark, 0, (size_t)(l->G ? l->G : 1) * 8);
  for (uint32_t g = 0; g < l->G; g++)
    if (l->gstate[g] == GROUP_RECHECK) l->gstate[g] = GROUP_UNCHECKED;
  pl->epoch = p.epoch;
  pl->row = p.row;
  pl->epoch_ready = 0;
  if (p.row < l->N) plan_locate(l, p.epoch, p.row);
  l->pos = p;
  l->paused = 0;
  pthread_cond_broadcast(&l->cv_work);
  pthread_mutex_unlock(&l->mu);
  return DLREC_OK;
}

void dlrec_loader_close(dlrec_loader *l) {
  if (!l) return;
  stop_threads(l);
  free(l->threads);
  for (uint32_t k = 0; l->slots && k < l->R; k++)
    for (uint32_t c = 0; c < l->schema.n_sparse; c++)
      if (!l->schema.sparse[c].hotness) free(l->slots[k].ids[c]);
  for (int i = 0; i < l->n_files; i++) dlrec_dlr_close(l->files[i]);
  free(l->files);
  dlrec_arena_free(&l->arena);
  pthread_cond_destroy(&l->cv_work);
  pthread_cond_destroy(&l->cv_ready);
  pthread_mutex_destroy(&l->mu);
  free(l);
}
