/* The server's parts: the model registry (loading, hot reload), the batcher
 * (queue and scoring workers) and the Prometheus metrics. http.c ties them
 * to libmicrohttpd. */
#ifndef DLREC_SERVE_INTERNAL_H
#define DLREC_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "dlrec/checkpoint.h"
#include "dlrec/dlrm.h"
#include "dlrec/kserve.h"
#include "dlrec/serve.h"
#include "dlrec/serve_batch.h"

/* ---- models (registry.c) ---- */

/* A loaded checkpoint, shared by reference count: the registry holds one
 * reference while it is current, each request one while it runs. */
typedef struct serve_model {
  atomic_uint refs;
  uint64_t serial; /* unique per load in this process (a freed model's address can come back) */
  dlrec_model *model;
  dlrec_dlrm_scorer *scorer;
  uint64_t step;
  char version[24]; /* the checkpoint's step, the protocol's version string */
} serve_model;

void serve_model_release(serve_model *m); /* accepts NULL */

typedef struct serve_registry {
  pthread_mutex_t mu;
  char run_dir[1024];
  char name[64];           /* the config's name: the model's name in URLs */
  serve_model *current;    /* NULL when unloaded */
  char current_dir[1024];  /* the checkpoint directory of current */
  char failed_dir[1024];   /* the last checkpoint that failed to load (not retried) */
  char last_error[512];
  uint64_t loads_ok, loads_failed;
  /* the watcher */
  pthread_t watcher;
  int watching;
  uint32_t interval_ms;
  pthread_mutex_t stop_mu;
  pthread_cond_t stop_cv;
  int stop;
} serve_registry;

/* Loads RUN's latest checkpoint; fails when it cannot. */
dlrec_status serve_registry_open(serve_registry *r, const char *run_dir);
void serve_registry_close(serve_registry *r);
/* Starts polling RUN/latest every interval_ms. */
dlrec_status serve_registry_watch(serve_registry *r, uint32_t interval_ms);
/* The current model with a reference the caller releases; NULL when none. */
serve_model *serve_registry_acquire(serve_registry *r);
/* Loads RUN's latest checkpoint now and makes it current (also after an
 * unload, and also when it is the current one: a reload). On failure the
 * current model stays. */
dlrec_status serve_registry_load(serve_registry *r);
void serve_registry_unload(serve_registry *r);

/* ---- metrics (prom.c) ---- */

typedef enum serve_endpoint {
  EP_HEALTH, EP_SERVER_META, EP_MODEL_META, EP_MODEL_READY, EP_INFER, EP_REPOSITORY, EP_METRICS, EP_OTHER,
  EP_COUNT
} serve_endpoint;

#define SERVE_LATENCY_BUCKETS 14
#define SERVE_BATCH_BUCKETS 16

typedef struct serve_metrics {
  pthread_mutex_t mu;
  uint64_t requests[EP_COUNT][6]; /* by status class: 2xx, 400, 404, 413, 503, other */
  uint64_t latency[SERVE_LATENCY_BUCKETS + 1];
  double latency_sum;
  uint64_t latency_count;
  uint64_t batch[SERVE_BATCH_BUCKETS + 1];
  uint64_t batch_rows_sum, batches;
  uint64_t rows_scored;
} serve_metrics;

void serve_metrics_init(serve_metrics *m);
void serve_metrics_destroy(serve_metrics *m);
void serve_metrics_request(serve_metrics *m, serve_endpoint ep, int status, double seconds);
void serve_metrics_batch(serve_metrics *m, uint32_t rows);
/* The Prometheus text exposition of everything, with the queue depth, the
 * registry's model version and load counts. */
dlrec_status serve_metrics_write(serve_metrics *m, dlrec_kserve_buf *b, uint64_t queue_rows, serve_registry *reg);

/* ---- dynamic batching (batcher.c) ---- */

/* One request's rows waiting to be scored. */
typedef struct serve_job {
  serve_model *model;     /* the request's reference; rows score on it */
  dlrec_serve_rows *rows;
  float *scores;          /* (rows) written by a worker */
  dlrec_status status;
  dlrec_error_copy error; /* when status is not DLREC_OK */
  int done;
  struct serve_job *next;
} serve_job;

typedef struct serve_batcher {
  pthread_mutex_t mu;
  pthread_cond_t work_cv, done_cv;
  serve_job *head, *tail;
  uint64_t queued_rows, max_queue_rows;
  uint32_t max_batch, max_delay_us;
  atomic_uint receiving; /* requests being parsed and encoded: a worker waits for them */
  int stop;
  uint32_t n_workers;
  pthread_t *workers;
  void *workers_state;
  float *scores;
  serve_metrics *metrics;
} serve_batcher;

dlrec_status serve_batcher_start(serve_batcher *b, uint32_t workers, uint32_t max_batch, uint32_t max_delay_us,
                                 uint64_t max_queue_rows, serve_metrics *metrics);
void serve_batcher_stop(serve_batcher *b);
/* A request's rows are being received and encoded: workers holding a
 * partial batch wait for it (up to the delay). Each begin ends with exactly
 * one serve_batcher_run or serve_batcher_receive_abort. */
void serve_batcher_receive_begin(serve_batcher *b);
void serve_batcher_receive_abort(serve_batcher *b);
/* Queues the job and waits until a worker has scored it; DLREC_ERR_NOMEM
 * (503) at once when the queue is full. */
dlrec_status serve_batcher_run(serve_batcher *b, serve_job *job);
uint64_t serve_batcher_queued_rows(serve_batcher *b);

#endif
