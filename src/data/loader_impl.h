/* The loader's state (data/loader.h), private to src/data/'s loader files:
 *   loader.c       the batches' assembly by the workers, the consumer, seek
 *   loader_plan.c  the planner: an epoch's order, a batch's segments
 *   loader_open.c  opening: the files, their row groups, the ring, the threads
 * loader.c's opening comment says how the work is shaped. */
#ifndef DLREC_DATA_LOADER_IMPL_H
#define DLREC_DATA_LOADER_IMPL_H

#include <pthread.h>

#include "core/arena.h"
#include "data/dlr.h"
#include "data/loader.h"

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

/* loader_plan.c: the segments of batch `seq` (the planner at its next row)
 * into s; and the planner moved to the loader's position. */
void loader_plan_locate(dlrec_loader *l, uint64_t epoch, uint64_t row);
dlrec_status loader_plan_batch(dlrec_loader *l, slot *s, uint64_t seq);

/* loader.c: a worker's loop (the threads dlrec_loader_open starts). */
void *loader_worker_main(void *arg);

#endif
