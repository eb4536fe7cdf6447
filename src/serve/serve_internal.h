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
  uint32_t closed;           /* connections closed since the watchdog last gave memory back */
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
/* One pass of the watchdog at time now (monotonic seconds): cuts off each
 * connection past its deadline (408 for one sending its request, silently
 * for an idle one); one being answered has none. Returns the earliest
 * deadline still ahead, at most now + 1. */
double serve_conns_sweep(serve_conns *g, double now);
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
/* Reads the model control token from path into *out (malloc'd, *out_len
 * bytes): one line of printable ASCII without blanks (it travels in an HTTP
 * header), a trailing newline allowed, at least 16 characters. */
dlrec_status serve_read_token(const char *path, char **out, size_t *out_len);

/* Bounds of a request body that follow --max-batch: the values (JSON
 * scalars) one row of a model of this schema can take in either input
 * convention (its dense and categorical columns, each multi-hot one at its
 * max hotness, and a ROWINDEX offset per categorical column), and the body
 * limit when --max-body-bytes is not given: SERVE_BODY_BASE_BYTES +
 * max_batch x values_per_row x SERVE_BODY_VALUE_BYTES (a value of JSON
 * rarely takes 20 bytes; 64 leaves room for long strings). */
#define SERVE_BODY_BASE_BYTES 65536u
#define SERVE_BODY_VALUE_BYTES 64u
uint64_t serve_values_per_row(const dlrec_schema *s); /* 0 for NULL */
uint64_t serve_default_body_limit(uint32_t max_batch, uint64_t values_per_row);

/* What the pre-scan of a request's JSON allows (serve_prescan_json). */
typedef struct serve_prescan_limits {
  uint64_t max_rows;     /* the first dimension of an input of rank 2 or more */
  uint64_t max_elements; /* the product of every input's shape, summed */
  uint64_t max_values;   /* JSON values (scalars and containers) in the whole text */
} serve_prescan_limits;

/* Reads a request's JSON text json[0..n) (not NUL-terminated) without
 * building anything, and refuses it (400, with a message naming the input or
 * the limit in msg) as soon as it has seen too many values, or an input's
 * "shape" with more rows or elements than lim allows: the JSON tree, which
 * costs ten times the text, is built only for a request that could be
 * served. JSON that is not well formed is left to the parser (0). *values
 * (may be NULL) gets the values counted, what the tree will hold. */
int serve_prescan_json(const char *json, size_t n, const serve_prescan_limits *lim, uint64_t *values, char *msg,
                       size_t cap);

/* ---- request memory (reqmem.c) ---- */

/* The memory of the requests in flight, bounded as a whole, and the rows
 * objects (serve_batch.h) they encode into, pooled across connections with
 * a cap, so that memory follows the requests being served, not the
 * connections open (a keep-alive connection holds nothing between its
 * requests).
 *
 * The budget: each request is charged its body as it arrives and, before its
 * JSON is parsed, what parsing takes (serve_parse_cost); a charge that would
 * take the total over budget_bytes is refused, and the request answered 503.
 * The pool keeps at most pool_max rows objects between requests (the most
 * recently returned), each of at most --max-batch rows; a request takes one of
 * its model's or makes one, and returns it once scored. buffer_bytes (the
 * gauge dlrec_serve_request_buffer_bytes) counts the request bodies held and
 * the rows objects in use or pooled: with no request in flight it is the
 * pool's bytes alone. */
typedef struct serve_pooled_rows {
  dlrec_serve_rows *rows;
  uint64_t serial; /* the model's (serve_model.serial) */
  uint64_t bytes;  /* what rows held when counted */
  struct serve_pooled_rows *next;
} serve_pooled_rows;

typedef struct serve_reqmem {
  pthread_mutex_t mu;
  uint64_t budget_bytes;  /* 0: no limit */
  uint64_t charged;       /* bytes charged to the requests in flight */
  uint64_t refused;       /* charges refused (requests answered 503) */
  uint64_t buffer_bytes;
  uint32_t pool_max, pooled;
  serve_pooled_rows *pool; /* most recently returned first */
} serve_reqmem;

/* The parse cost charged for a JSON text of json_len bytes holding values
 * values: its copy, its strings, and SERVE_VALUE_COST_BYTES per value (a
 * tree node and the value converted). */
#define SERVE_VALUE_COST_BYTES 80u
uint64_t serve_parse_cost(uint64_t json_len, uint64_t values);

void serve_reqmem_init(serve_reqmem *m, uint64_t budget_bytes, uint32_t pool_max);
void serve_reqmem_destroy(serve_reqmem *m); /* frees the pool */
/* Charges bytes to the budget: 1 when taken, 0 (and nothing charged) when
 * the total would pass budget_bytes. */
int serve_reqmem_charge(serve_reqmem *m, uint64_t bytes);
void serve_reqmem_uncharge(serve_reqmem *m, uint64_t bytes);
/* Counts a request body's buffer growing (delta > 0) or freed (< 0). */
void serve_reqmem_buffer(serve_reqmem *m, int64_t delta);
/* An empty rows object for model m into *lease (the pool's, or a new one);
 * NULL with the error set when out of memory. */
dlrec_serve_rows *serve_reqmem_rows_take(serve_reqmem *m, const serve_model *model, serve_pooled_rows *lease);
/* Returns a taken rows object: pooled, or freed when the pool is full (the
 * least recently returned one goes). Accepts a lease whose rows is NULL. */
void serve_reqmem_rows_give(serve_reqmem *m, serve_pooled_rows *lease);
uint64_t serve_reqmem_buffer_bytes(serve_reqmem *m);

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
  uint64_t redis_foreign;  /* rows of another run than the served checkpoint's */
  int64_t redis_lag_steps; /* the checkpoint's step past its run's last publish in Redis; -1: none known */
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
  uint64_t foreign;  /* rows Redis held of another run than the checkpoint's (the table answered) */
  int lag_read;      /* PREFIX:run was read since the last take: lag_steps is new */
  int64_t lag_steps; /* the checkpoint's step minus its run's last publish's (0: Redis at or past it); -1: no
                        publish of its run in Redis */
} serve_redis_counts;

typedef struct serve_redis serve_redis;
/* The tier for model m (its run, ETL state and step; its table's dim),
 * under o's prefix, else dlrec:NAME (the trainer's default). */
dlrec_status serve_redis_create(serve_redis **t, const serve_redis_opts *o, const dlrec_model *m);
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
 * registry's model version and load counts, the connections the guard
 * cut off (conns may be NULL: none) and the request memory (mem may be
 * NULL: none). */
dlrec_status serve_metrics_write(serve_metrics *m, dlrec_kserve_buf *b, uint64_t queue_rows, serve_registry *reg,
                                 serve_conns *conns, serve_reqmem *mem);

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
