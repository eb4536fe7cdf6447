/* Dynamic batching: requests' rows wait in a FIFO queue; each worker takes
 * the oldest request and the requests behind it that use the same model, up
 * to max_batch rows, scores them as one batch and wakes their threads.
 *
 * A worker waits for more requests (up to max_delay_us after it took the
 * first) only while another request is being received and encoded: a lone
 * client is never delayed on the chance that someone else might arrive. The
 * scorer is batch-invariant (model.h), so how requests are merged never
 * changes a score.
 *
 * Each worker runs its batches on one OpenMP thread (the registry's backend
 * has one, and each op sets the calling worker's team to it) and keeps its
 * own workspace and merge buffer, rebuilt only when the model changes; the
 * workers together use the cores. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_internal.h"

typedef struct worker_state {
  serve_batcher *b;
  uint64_t serial;          /* the model (serve_model.serial) ws and merged were made for; 0: none.
                               Not its address: a freed model's address comes back for the next,
                               which may have another shape */
  dlrec_net_ws *ws;
  dlrec_serve_rows *merged;
  float *scores;
  uint64_t keys_missing; /* of the last batch: raw keys the hash table has no row for */
  serve_redis *redis;    /* the Redis tier, for the model of `serial` */
} worker_state;

static struct timespec deadline_after_us(uint32_t us) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_nsec += (long)us * 1000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  return t;
}

/* Takes the next batch's jobs off the queue (the lock held): the head, then
 * jobs of the same model that fit in max_batch rows, keeping the others in
 * order. Returns the list and its rows. */
static serve_job *take_batch(serve_batcher *b, uint32_t *rows) {
  serve_job *first = b->head, *last = first;
  b->head = first->next;
  first->next = NULL;
  uint32_t n = dlrec_serve_rows_count(first->rows);
  serve_job **link = &b->head, *prev = NULL;
  while (*link) {
    serve_job *j = *link;
    uint32_t jr = dlrec_serve_rows_count(j->rows);
    if (j->model == first->model && n + jr <= b->max_batch) {
      *link = j->next;
      j->next = NULL;
      last->next = j;
      last = j;
      n += jr;
    } else {
      prev = j;
      link = &j->next;
    }
  }
  b->tail = prev;
  b->queued_rows -= n;
  *rows = n;
  return first;
}

/* Scores the jobs (all of one model) as one batch. */
static dlrec_status score(worker_state *w, serve_job *jobs) {
  const serve_model *m = jobs->model;
  dlrec_status s = DLREC_OK;
  if (w->serial != m->serial) {
    dlrec_net_ws_free(w->ws);
    dlrec_serve_rows_free(w->merged);
    w->ws = NULL;
    w->merged = NULL;
    w->serial = 0;
    serve_redis_free(w->redis);
    w->redis = NULL;
    s = dlrec_net_ws_create(&w->ws, m->model->net, w->b->max_batch);
    if (s == DLREC_OK && w->b->redis) s = serve_redis_create(&w->redis, w->b->redis, m->model);
    if (s == DLREC_OK)
      s = dlrec_serve_rows_new(&w->merged, dlrec_net_schema(m->model->net), m->model->etl);
    if (s == DLREC_OK) s = dlrec_serve_rows_reserve(w->merged, w->b->max_batch);
    if (s != DLREC_OK) return s;
    w->serial = m->serial;
  }
  const dlrec_serve_rows *src = jobs->rows;
  if (jobs->next) { /* several requests: merge their rows */
    dlrec_serve_rows_clear(w->merged);
    for (serve_job *j = jobs; s == DLREC_OK && j; j = j->next) s = dlrec_serve_rows_append(w->merged, j->rows);
    src = w->merged;
  }
  if (s != DLREC_OK) return s;
  dlrec_batch batch;
  dlrec_serve_rows_batch(src, &batch);
  const uint64_t missing = dlrec_net_ws_keys_missing(w->ws);
  s = w->redis ? dlrec_net_predict_fetch(m->scorer, w->ws, &batch, w->scores, serve_redis_fetch, w->redis)
               : dlrec_net_predict(m->scorer, w->ws, &batch, w->scores);
  if (s != DLREC_OK) return s;
  w->keys_missing = dlrec_net_ws_keys_missing(w->ws) - missing;
  uint32_t at = 0;
  for (serve_job *j = jobs; j; j = j->next) {
    uint32_t n = dlrec_serve_rows_count(j->rows);
    memcpy(j->scores, w->scores + at, n * sizeof(float));
    at += n;
  }
  return DLREC_OK;
}

static void *worker_main(void *arg) {
  worker_state *w = arg;
  serve_batcher *b = w->b;
  pthread_mutex_lock(&b->mu);
  for (;;) {
    while (!b->stop && !b->head) pthread_cond_wait(&b->work_cv, &b->mu);
    if (b->stop && !b->head) break;
    /* Wait for requests being received, up to the delay, unless the queue
     * already fills a batch. */
    if (b->max_delay_us && atomic_load(&b->receiving) > 0 && b->queued_rows < b->max_batch) {
      struct timespec until = deadline_after_us(b->max_delay_us);
      while (!b->stop && atomic_load(&b->receiving) > 0 && b->queued_rows < b->max_batch &&
             pthread_cond_timedwait(&b->work_cv, &b->mu, &until) != ETIMEDOUT) {
      }
      if (!b->head) continue; /* another worker took them */
    }
    uint32_t rows;
    serve_job *jobs = take_batch(b, &rows);
    pthread_mutex_unlock(&b->mu);

    dlrec_status s = score(w, jobs);
    dlrec_error_copy err;
    if (s != DLREC_OK) dlrec_error_save(&err);
    if (s == DLREC_OK && b->metrics) serve_metrics_batch(b->metrics, rows, w->keys_missing);
    if (w->redis && b->metrics) {
      serve_redis_counts c;
      serve_redis_take_counts(w->redis, &c);
      serve_metrics_redis(b->metrics, &c);
    }

    pthread_mutex_lock(&b->mu);
    for (serve_job *j = jobs, *next; j; j = next) {
      next = j->next;
      j->status = s;
      if (s != DLREC_OK) j->error = err;
      j->done = 1;
    }
    pthread_cond_broadcast(&b->done_cv);
  }
  pthread_mutex_unlock(&b->mu);
  dlrec_net_ws_free(w->ws);
  dlrec_serve_rows_free(w->merged);
  serve_redis_free(w->redis);
  return NULL;
}

dlrec_status serve_batcher_start(serve_batcher *b, uint32_t workers, uint32_t max_batch, uint32_t max_delay_us,
                                 uint64_t max_queue_rows, serve_metrics *metrics, const serve_redis_opts *redis) {
  memset(b, 0, sizeof *b);
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->work_cv, NULL);
  pthread_cond_init(&b->done_cv, NULL);
  atomic_init(&b->receiving, 0);
  b->max_batch = max_batch;
  b->max_delay_us = max_delay_us;
  b->max_queue_rows = max_queue_rows;
  b->metrics = metrics;
  b->redis = redis;
  b->workers = calloc(workers, sizeof *b->workers);
  worker_state *ws = calloc(workers, sizeof *ws);
  float *scores = malloc((size_t)workers * max_batch * sizeof(float));
  if (!b->workers || !ws || !scores) {
    free(b->workers);
    free(ws);
    free(scores);
    b->workers = NULL;
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  for (uint32_t i = 0; i < workers; i++) {
    ws[i].b = b;
    ws[i].scores = scores + (size_t)i * max_batch;
    if (pthread_create(&b->workers[i], NULL, worker_main, &ws[i]) != 0) {
      serve_batcher_stop(b);
      return dlrec_error(DLREC_ERR_INTERNAL, "cannot start scoring worker %u", i);
    }
    b->n_workers++;
  }
  /* The states live as long as the workers; stop frees them. */
  b->workers_state = ws;
  b->scores = scores;
  return DLREC_OK;
}

void serve_batcher_stop(serve_batcher *b) {
  pthread_mutex_lock(&b->mu);
  b->stop = 1;
  pthread_cond_broadcast(&b->work_cv);
  pthread_mutex_unlock(&b->mu);
  for (uint32_t i = 0; i < b->n_workers; i++) pthread_join(b->workers[i], NULL);
  free(b->workers);
  free(b->workers_state);
  free(b->scores);
  b->workers = NULL;
  b->workers_state = NULL;
  b->scores = NULL;
  b->n_workers = 0;
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->work_cv);
  pthread_cond_destroy(&b->done_cv);
}

void serve_batcher_receive_begin(serve_batcher *b) { atomic_fetch_add(&b->receiving, 1); }

void serve_batcher_receive_abort(serve_batcher *b) {
  pthread_mutex_lock(&b->mu);
  atomic_fetch_sub(&b->receiving, 1);
  pthread_cond_broadcast(&b->work_cv);
  pthread_mutex_unlock(&b->mu);
}

dlrec_status serve_batcher_run(serve_batcher *b, serve_job *job) {
  uint32_t n = dlrec_serve_rows_count(job->rows);
  job->done = 0;
  job->next = NULL;
  pthread_mutex_lock(&b->mu);
  atomic_fetch_sub(&b->receiving, 1); /* received: now queued or refused */
  if (b->stop || b->queued_rows + n > b->max_queue_rows) {
    int stopping = b->stop;
    pthread_cond_broadcast(&b->work_cv);
    pthread_mutex_unlock(&b->mu);
    return stopping ? dlrec_error(DLREC_ERR_NOMEM, "the server is shutting down")
                    : dlrec_error(DLREC_ERR_NOMEM, "overloaded: %llu rows queued, the queue holds %llu",
                                  (unsigned long long)b->queued_rows, (unsigned long long)b->max_queue_rows);
  }
  if (b->tail) b->tail->next = job;
  else b->head = job;
  b->tail = job;
  b->queued_rows += n;
  pthread_cond_broadcast(&b->work_cv);
  while (!job->done) pthread_cond_wait(&b->done_cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
  if (job->status != DLREC_OK) return dlrec_error_restore(&job->error);
  return DLREC_OK;
}

uint64_t serve_batcher_queued_rows(serve_batcher *b) {
  pthread_mutex_lock(&b->mu);
  uint64_t n = b->queued_rows;
  pthread_mutex_unlock(&b->mu);
  return n;
}
