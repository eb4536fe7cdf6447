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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "data/loader_impl.h"

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

void *loader_worker_main(void *arg) {
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
    if (loader_plan_batch(l, s, seq) == DLREC_END) {
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

static void stop_threads(dlrec_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->shutdown = 1;
  pthread_cond_broadcast(&l->cv_work);
  pthread_cond_broadcast(&l->cv_ready);
  pthread_mutex_unlock(&l->mu);
  for (uint32_t t = 0; t < l->n_threads; t++) pthread_join(l->threads[t], NULL);
  l->n_threads = 0;
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
     * sleeps (the seq_cst pair with loader_worker_main's announcement). */
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
  if (p.row < l->N) loader_plan_locate(l, p.epoch, p.row);
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
