/* The server's parts: the model registry (loading, hot reload), the batcher
 * (queue and scoring workers), the Prometheus metrics, the connection
 * guard (request deadlines, shedding, draining) and the HTTP request checks.
 * http.c ties them to libmicrohttpd. */
#ifndef DLREC_SERVE_INTERNAL_H
#define DLREC_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "model/model.h"
#include "serve/kserve.h"
#include "serve/serve.h"
#include "serve/serve_batch.h"

/* ---- models (registry.c) ---- */

/* A loaded checkpoint, shared by reference count: the registry holds one
 * reference while it is current, each request one while it runs. */
typedef struct serve_model {
  atomic_uint refs;
  uint64_t serial; /* unique per load in this process (a freed model's address can come back) */
  dlrec_model *model;
  dlrec_net_scorer *scorer;
  uint64_t step;
  char version[24]; /* the checkpoint's step, the protocol's version string */
} serve_model;

void serve_model_release(serve_model *m); /* accepts NULL */

typedef struct serve_registry {
  pthread_mutex_t mu;
  /* The scoring workers' backend: one thread per op, as each worker scores
   * its batches alone and the workers together use the cores. Every model
   * loaded runs on it; it outlives them all (freed by close). */
  dlrec_backend *be;
  char run_dir[1024];
  char name[64];           /* the config's name: the model's name in URLs */
  serve_model *current;    /* NULL when unloaded */
  char current_dir[1024];  /* the checkpoint directory of current */
  char failed_dir[1024];   /* the last checkpoint that failed to load (not retried) */
  char last_error[512];
  uint64_t loads_ok, loads_failed;
  /* Loads run one at a time (each holds a whole model in memory); a load of
   * the checkpoint already loading waits for that one and shares its result
   * (a storm of load requests costs one load). Guarded by mu. */
  pthread_cond_t load_cv;
  int loading;
  char loading_dir[1024];
  uint64_t loads_finished;   /* bumped as each load ends */
  dlrec_status load_status;  /* the last load's result, for the requests folded into it */
  char load_error[512];
  uint32_t load_waiters;     /* requests waiting for the running load's result */
  /* Called (outside the lock) just before a load reads the checkpoint; NULL
   * in the server. Tests use it to hold a load open while requests pile up. */
  void (*load_hook)(struct serve_registry *r);
  /* the watcher */
  pthread_t watcher;
  int watching;
  uint32_t interval_ms;
  pthread_mutex_t stop_mu;
  pthread_cond_t stop_cv;
  int stop;
} serve_registry;

/* Loads RUN's latest checkpoint; fails when it cannot. */
dlrec_status serve_registry_open(serve_registry *r, const char *run_dir, const char *device);
void serve_registry_close(serve_registry *r);
/* Starts polling RUN/latest every interval_ms. */
dlrec_status serve_registry_watch(serve_registry *r, uint32_t interval_ms);
/* The current model with a reference the caller releases; NULL when none. */
serve_model *serve_registry_acquire(serve_registry *r);
/* Loads RUN's latest checkpoint now and makes it current (also after an
 * unload, and also when it is the current one: a reload). On failure the
 * current model stays. When that checkpoint is already being loaded, waits
 * for that load and returns its result instead of loading again; a load of
 * another checkpoint is waited for first. */
dlrec_status serve_registry_load(serve_registry *r);
void serve_registry_unload(serve_registry *r);

/* ---- connections (conns.c) ---- */

/* Where a connection is in its current request. */
typedef enum serve_conn_phase {
  SERVE_CONN_HEADERS,  /* connected, or its request line came: headers on the way */
  SERVE_CONN_BODY,     /* headers complete, the body on the way */
  SERVE_CONN_HANDLING, /* the whole request came: being answered */
  SERVE_CONN_IDLE,     /* answered; a keep-alive connection waits for the next request */
} serve_conn_phase;

/* One open TCP connection (libmicrohttpd's socket context). */
typedef struct serve_conn {
  int fd;
  serve_conn_phase phase;
  double started;  /* when the current request (or the idle wait) began, monotonic seconds */
  double deadline; /* when it is cut off in its phase; 0: never */
  int closing;     /* shut down by the guard; libmicrohttpd has yet to close it */
  struct serve_conn *prev, *next;
} serve_conn;

/* The connection guard. libmicrohttpd's own timeout counts idle time only,
 * so a client that sends a byte now and then would hold its connection (and
 * thread) for ever, and a few hundred such clients every slot. The guard
 * gives each request a deadline for its headers and body, and a watchdog
 * thread cuts off connections past theirs: it writes a short 408 and shuts
 * the socket down, which wakes the connection's thread to close it. When
 * more than max connections are open, the oldest connection still sending
 * its request (or idle) is cut off (503) to make room, so a new client is
 * served while slow ones wait their turn to be shed. */
typedef struct serve_conns {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  serve_conn *head;
  uint32_t open;     /* connections in the list */
  uint32_t closing;  /* of those, shut down and waiting for libmicrohttpd */
  uint32_t max;      /* more open (not closing) than this: shed one */
  double request_timeout_s, idle_timeout_s; /* 0: no limit */
  int draining, stop, started;
  uint64_t timed_out, shed; /* counts, for the log and /metrics */
  pthread_t watchdog;
} serve_conns;

/* Starts the watchdog; request_timeout_s bounds the headers and body of a
 * request, idle_timeout_s a keep-alive connection's wait for the next
 * request line (0: no limit). */
dlrec_status serve_conns_start(serve_conns *g, uint32_t max, uint32_t request_timeout_s, uint32_t idle_timeout_s);
/* Stops the watchdog and frees what is left (after libmicrohttpd stopped). */
void serve_conns_stop(serve_conns *g);
/* A new connection on socket fd (in phase HEADERS); sheds the oldest slow
 * one when over the limit. NULL when out of memory (the connection is then
 * not guarded). */
serve_conn *serve_conn_open(serve_conns *g, int fd);
void serve_conn_closed(serve_conns *g, serve_conn *c);
/* Moves c (may be NULL) to a phase: HEADERS restarts the request deadline
 * unless the request is already in HEADERS, BODY keeps it, HANDLING drops
 * it, IDLE starts the idle one. While draining, a connection that turns
 * idle is shut down. */
void serve_conn_phase_set(serve_conns *g, serve_conn *c, serve_conn_phase phase);
/* Begins a drain: shuts down idle connections and those still sending
 * headers (503), and every one that turns idle from now on. */
void serve_conns_drain_begin(serve_conns *g);
/* Connections with a request in flight (BODY or HANDLING, not closing). */
uint32_t serve_conns_in_flight(serve_conns *g);

/* ---- request checks (http_check.c) ---- */

struct MHD_Connection;

/* libmicrohttpd's unescape callback: decodes %HH in place like its default,
 * but writes a decoded NUL as 0x7f, so that "/v2/models/m%00x" is refused
 * for its control byte instead of being cut short to "/v2/models/m". */
size_t serve_unescape(void *cls, struct MHD_Connection *c, char *s);
/* 0 when url (decoded, as the handler gets it) holds no control byte
 * (below 0x20, or 0x7f); else the offset of the first plus one. */
size_t serve_path_control_byte(const char *url);
/* Checks the request's framing headers: Transfer-Encoding other than
 * "chunked" is 501; Content-Length together with chunked, Content-Length
 * headers that disagree or are not a plain number, and chunked given twice
 * are 400. Returns the status (0: fine) with a message in msg. */
int serve_check_framing(struct MHD_Connection *c, char *msg, size_t cap);
/* Compares a client's token with the expected one in time that does not
 * depend on where they differ; 1 when equal. */
int serve_token_equal(const char *given, size_t given_len, const char *want, size_t want_len);

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
  uint64_t keys_missing; /* raw keys scored without a row in the hash table */
  uint64_t redis_rows[3]; /* the Redis tier: rows from the cache, from Redis, from the table */
  uint64_t redis_errors;  /* MGETs that could not reach Redis */
  uint64_t redis_rejected; /* values under a row's key that were not a row (dlrec_redis_rows_get) */
} serve_metrics;

/* ---- the Redis tier (redis_tier.c): one per scoring worker ---- */

typedef struct serve_redis_opts {
  const char *addr;    /* HOST:PORT */
  const char *prefix;  /* the rows' key prefix */
  uint32_t timeout_ms; /* per MGET */
  uint32_t max_age_ms; /* a cached row is read again after this long */
  uint64_t cache_rows; /* 0: no cache (every row from Redis) */
} serve_redis_opts;

/* Rows served since the last take, by where they came from, and failed MGETs. */
typedef struct serve_redis_counts {
  uint64_t cache, redis, table, errors;
  uint64_t rejected; /* values Redis held under a row's key that were not a row (the table answered) */
} serve_redis_counts;

typedef struct serve_redis serve_redis;
dlrec_status serve_redis_create(serve_redis **t, const serve_redis_opts *o, uint32_t dim);
void serve_redis_free(serve_redis *t); /* accepts NULL */
/* dlrec_row_fetch (model/model.h) over the tier; ctx is the serve_redis. */
dlrec_status serve_redis_fetch(void *ctx, const uint64_t *keys, size_t n, float *rows, uint8_t *found);
void serve_redis_take_counts(serve_redis *t, serve_redis_counts *out);

void serve_metrics_init(serve_metrics *m);
void serve_metrics_destroy(serve_metrics *m);
void serve_metrics_request(serve_metrics *m, serve_endpoint ep, int status, double seconds);

/* ---- routes (routes.c) ---- */

/* What a request target asks for. */
typedef enum route {
  R_NONE, R_SERVER_META, R_LIVE, R_READY, R_MODEL_META, R_MODEL_READY, R_INFER, R_REPO_INDEX, R_REPO_LOAD,
  R_REPO_UNLOAD, R_METRICS
} route;

typedef struct target {
  route r;
  char model[128];
  char version[32]; /* "" when the URL names none */
} target;
/* The target's route (R_NONE: no endpoint of ours), with the model and
 * version it names into *t. */
route serve_parse_target(const char *url, target *t);
/* The metrics' endpoint of a route. */
serve_endpoint serve_endpoint_of(route r);
/* Whether the route's method is POST (else GET). */
int serve_is_post(route r);
void serve_metrics_batch(serve_metrics *m, uint32_t rows, uint64_t keys_missing);
void serve_metrics_redis(serve_metrics *m, const serve_redis_counts *c);
/* The Prometheus text exposition of everything, with the queue depth, the
 * registry's model version and load counts, and the connections the guard
 * cut off (conns may be NULL: none). */
dlrec_status serve_metrics_write(serve_metrics *m, dlrec_kserve_buf *b, uint64_t queue_rows, serve_registry *reg,
                                 serve_conns *conns);

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
  const serve_redis_opts *redis; /* NULL: no Redis tier */
} serve_batcher;

/* redis (NULL: none) must outlive the batcher. */
dlrec_status serve_batcher_start(serve_batcher *b, uint32_t workers, uint32_t max_batch, uint32_t max_delay_us,
                                 uint64_t max_queue_rows, serve_metrics *metrics, const serve_redis_opts *redis);
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
