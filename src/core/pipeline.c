/* Ordered parallel pipeline: jobs live in a ring of caller slots, indexed by
 * sequence number modulo the ring size. Sequence numbers only grow:
 *   consumed <= worked-on <= produced <= consumed + n_jobs. */
#include "core/pipeline.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

enum { SLOT_EMPTY, SLOT_QUEUED, SLOT_DONE };

typedef struct slot {
  int state;
  dlrec_status status;
  dlrec_error_copy err;
} slot;

typedef struct pipe_state {
  const dlrec_pipeline_ops *ops;
  void *ctx;
  void **jobs;
  slot *slots;
  int n_jobs;
  uint64_t produced, taken; /* next sequence to produce / to hand to a worker */
  int end;                  /* producer said DLREC_END */
  int stop;                 /* failure: workers exit */
  pthread_mutex_t lock;
  pthread_cond_t work_ready; /* workers wait here */
  pthread_cond_t job_done;   /* the caller waits here */
} pipe_state;

typedef struct worker_arg {
  pipe_state *p;
  int id;
} worker_arg;

static void *worker_main(void *arg) {
  worker_arg *wa = arg;
  pipe_state *p = wa->p;
  pthread_mutex_lock(&p->lock);
  for (;;) {
    while (!p->stop && p->taken == p->produced && !p->end) pthread_cond_wait(&p->work_ready, &p->lock);
    if (p->stop || p->taken == p->produced) break; /* failure, or end with nothing left */
    uint64_t seq = p->taken++;
    int i = (int)(seq % (uint64_t)p->n_jobs);
    pthread_mutex_unlock(&p->lock);
    dlrec_clear_error();
    dlrec_status st = p->ops->work(p->ctx, p->jobs[i], wa->id);
    pthread_mutex_lock(&p->lock);
    p->slots[i].status = st;
    if (st != DLREC_OK) dlrec_error_save(&p->slots[i].err);
    p->slots[i].state = SLOT_DONE;
    pthread_cond_signal(&p->job_done);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

dlrec_status dlrec_pipeline_run(const dlrec_pipeline_ops *ops, void *ctx, void **jobs, int n_jobs, int n_workers) {
  if (n_jobs < 1 || n_workers < 0) return dlrec_error(DLREC_ERR_INTERNAL, "pipeline: bad sizes");
  if (!ops->work) n_workers = 0;
  pipe_state p = {.ops = ops, .ctx = ctx, .jobs = jobs, .n_jobs = n_jobs};
  p.slots = calloc((size_t)n_jobs, sizeof *p.slots);
  pthread_t *threads = calloc((size_t)(n_workers ? n_workers : 1), sizeof *threads);
  worker_arg *args = calloc((size_t)(n_workers ? n_workers : 1), sizeof *args);
  if (!p.slots || !threads || !args) {
    free(p.slots);
    free(threads);
    free(args);
    return dlrec_error(DLREC_ERR_NOMEM, "pipeline: out of memory");
  }
  pthread_mutex_init(&p.lock, NULL);
  pthread_cond_init(&p.work_ready, NULL);
  pthread_cond_init(&p.job_done, NULL);
  int started = 0;
  dlrec_status result = DLREC_OK;
  for (; started < n_workers; started++) {
    args[started] = (worker_arg){&p, started};
    if (pthread_create(&threads[started], NULL, worker_main, &args[started]) != 0) {
      result = dlrec_error(DLREC_ERR_INTERNAL, "pipeline: cannot start a thread");
      break;
    }
  }

  uint64_t consumed = 0;
  pthread_mutex_lock(&p.lock);
  while (result == DLREC_OK) {
    int i = (int)(consumed % (uint64_t)n_jobs);
    if (consumed < p.produced && p.slots[i].state == SLOT_DONE) {
      /* The oldest job is finished: hand it to consume, in order. */
      pthread_mutex_unlock(&p.lock);
      dlrec_status st = p.slots[i].status;
      if (st != DLREC_OK) st = dlrec_error_restore(&p.slots[i].err);
      else if (ops->consume) st = ops->consume(ctx, jobs[i], consumed);
      pthread_mutex_lock(&p.lock);
      if (st != DLREC_OK) {
        result = st;
        break;
      }
      p.slots[i].state = SLOT_EMPTY;
      consumed++;
      continue;
    }
    if (!p.end && p.produced < consumed + (uint64_t)n_jobs) {
      uint64_t seq = p.produced;
      int j = (int)(seq % (uint64_t)n_jobs);
      pthread_mutex_unlock(&p.lock);
      dlrec_status st = ops->produce(ctx, jobs[j], seq);
      if (st == DLREC_OK && n_workers == 0 && ops->work) {
        st = ops->work(ctx, jobs[j], 0);
        if (st == DLREC_OK) p.slots[j].status = DLREC_OK;
      }
      pthread_mutex_lock(&p.lock);
      if (st == DLREC_END) {
        p.end = 1;
        pthread_cond_broadcast(&p.work_ready);
      } else if (st != DLREC_OK) {
        result = st;
        break;
      } else {
        p.slots[j].status = DLREC_OK;
        p.slots[j].state = n_workers ? SLOT_QUEUED : SLOT_DONE;
        p.produced++;
        if (!n_workers) p.taken = p.produced;
        pthread_cond_signal(&p.work_ready);
      }
      continue;
    }
    if (p.end && consumed == p.produced) break;
    pthread_cond_wait(&p.job_done, &p.lock);
  }
  p.stop = 1;
  pthread_cond_broadcast(&p.work_ready);
  pthread_mutex_unlock(&p.lock);
  /* Workers finish the job in hand (its result is dropped) and exit. The
   * error message of `result` is this thread's, untouched by them. */
  for (int t = 0; t < started; t++) pthread_join(threads[t], NULL);
  pthread_cond_destroy(&p.work_ready);
  pthread_cond_destroy(&p.job_done);
  pthread_mutex_destroy(&p.lock);
  free(p.slots);
  free(threads);
  free(args);
  return result;
}

int dlrec_default_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}
