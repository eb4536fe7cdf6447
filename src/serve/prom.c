/* The server's metrics in the Prometheus text exposition format (version
 * 0.0.4): request counts by endpoint and status, the inference latency and
 * batch-size histograms, queue depth, and the served model's version and
 * load counts. One mutex guards the counters; an update is a few adds. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "serve/serve_internal.h"
#include "train/loaded_model.h"

static const char *const endpoint_names[EP_COUNT] = {"health",  "server_metadata", "model_metadata", "model_ready",
                                                     "infer",   "repository",      "metrics",        "other"};
static const char *const status_names[6] = {"2xx", "400", "404", "413", "503", "other"};
/* Upper bounds in seconds: 50 us to 5 s. */
static const double latency_le[SERVE_LATENCY_BUCKETS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005,
                                                         0.01,    0.025,  0.05,    0.1,    0.25,  1.0,   5.0};

void serve_metrics_init(serve_metrics *m) {
  memset(m, 0, sizeof *m);
  m->redis_lag_steps = -1;
  pthread_mutex_init(&m->mu, NULL);
}

void serve_metrics_destroy(serve_metrics *m) { pthread_mutex_destroy(&m->mu); }

static int status_class(int status) {
  if (status >= 200 && status < 300) return 0;
  switch (status) {
  case 400: return 1;
  case 404: return 2;
  case 413: return 3;
  case 503: return 4;
  default: return 5;
  }
}

void serve_metrics_request(serve_metrics *m, serve_endpoint ep, int status, double seconds) {
  pthread_mutex_lock(&m->mu);
  m->requests[ep][status_class(status)]++;
  if (ep == EP_INFER) {
    int i = 0;
    while (i < SERVE_LATENCY_BUCKETS && seconds > latency_le[i]) i++;
    m->latency[i]++;
    m->latency_sum += seconds;
    m->latency_count++;
  }
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_batch(serve_metrics *m, uint32_t rows, uint64_t keys_missing) {
  int i = 0; /* bucket i holds batches of at most 2^i rows */
  while (i < SERVE_BATCH_BUCKETS && rows > (1u << i)) i++;
  pthread_mutex_lock(&m->mu);
  m->batch[i]++;
  m->batch_rows_sum += rows;
  m->batches++;
  m->rows_scored += rows;
  m->keys_missing += keys_missing;
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_redis(serve_metrics *m, const serve_redis_counts *c) {
  pthread_mutex_lock(&m->mu);
  m->redis_rows[0] += c->cache;
  m->redis_rows[1] += c->redis;
  m->redis_rows[2] += c->table;
  m->redis_errors += c->errors;
  m->redis_rejected += c->rejected;
  m->redis_foreign += c->foreign;
  if (c->lag_read) m->redis_lag_steps = c->lag_steps;
  pthread_mutex_unlock(&m->mu);
}

/* printf into b, growing it. */
static dlrec_status put(dlrec_kserve_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dlrec_status put(dlrec_kserve_buf *b, const char *fmt, ...) {
  for (;;) {
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) return dlrec_error(DLREC_ERR_INTERNAL, "metrics: format failed");
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return DLREC_OK;
    }
    dlrec_status s = dlrec_kserve_buf_reserve(b, (size_t)n + 1);
    if (s != DLREC_OK) return s;
  }
}

/* The request memory's gauges (reqmem.c). */
static dlrec_status put_request_memory(dlrec_kserve_buf *b, serve_reqmem *mem) {
  pthread_mutex_lock(&mem->mu);
  uint64_t buf = mem->buffer_bytes, charged = mem->charged, refused = mem->refused;
  pthread_mutex_unlock(&mem->mu);
  return put(b,
             "# HELP dlrec_serve_request_buffer_bytes Bytes of request buffers held: bodies being received, and "
             "rows buffers in use or pooled (with no request in flight, the pool alone).\n"
             "# TYPE dlrec_serve_request_buffer_bytes gauge\ndlrec_serve_request_buffer_bytes %llu\n"
             "# HELP dlrec_serve_inflight_bytes Bytes the requests in flight are charged (--max-inflight-bytes).\n"
             "# TYPE dlrec_serve_inflight_bytes gauge\ndlrec_serve_inflight_bytes %llu\n"
             "# HELP dlrec_serve_inflight_refused_total Requests answered 503 for --max-inflight-bytes.\n"
             "# TYPE dlrec_serve_inflight_refused_total counter\ndlrec_serve_inflight_refused_total %llu\n",
             (unsigned long long)buf, (unsigned long long)charged, (unsigned long long)refused);
}

/* The connections the guard cut off (conns may be NULL: none). */
static void conns_counts(serve_conns *conns, uint64_t *timed_out, uint64_t *shed) {
  if (!conns) return;
  pthread_mutex_lock(&conns->mu);
  *timed_out = conns->timed_out;
  *shed = conns->shed;
  pthread_mutex_unlock(&conns->mu);
}

dlrec_status serve_metrics_write(serve_metrics *m, dlrec_kserve_buf *b, uint64_t queue_rows, serve_registry *reg,
                                 serve_conns *conns, serve_reqmem *mem) {
  b->len = 0;
  serve_metrics c;
  pthread_mutex_lock(&m->mu);
  c = *m;
  pthread_mutex_unlock(&m->mu);
  pthread_mutex_lock(&reg->mu);
  int loaded = reg->current != NULL;
  double version = loaded ? (double)reg->current->step : -1;
  uint64_t loads_ok = reg->loads_ok, loads_failed = reg->loads_failed;
  char name[64];
  snprintf(name, sizeof name, "%s", reg->name);
  pthread_mutex_unlock(&reg->mu);
  uint64_t timed_out = 0, shed = 0;
  conns_counts(conns, &timed_out, &shed);

  dlrec_status s = put(b, "# HELP dlrec_requests_total HTTP requests by endpoint and status.\n"
                          "# TYPE dlrec_requests_total counter\n");
  for (int e = 0; e < EP_COUNT; e++)
    for (int k = 0; k < 6; k++)
      if (s == DLREC_OK && c.requests[e][k])
        s = put(b, "dlrec_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", endpoint_names[e], status_names[k],
                (unsigned long long)c.requests[e][k]);
  if (s == DLREC_OK)
    s = put(b, "# HELP dlrec_request_errors_total Failed requests (status 4xx or 5xx) by endpoint.\n"
               "# TYPE dlrec_request_errors_total counter\n");
  for (int e = 0; e < EP_COUNT && s == DLREC_OK; e++) {
    uint64_t n = 0;
    for (int k = 1; k < 6; k++) n += c.requests[e][k];
    s = put(b, "dlrec_request_errors_total{endpoint=\"%s\"} %llu\n", endpoint_names[e], (unsigned long long)n);
  }
  if (s == DLREC_OK)
    s = put(b, "# HELP dlrec_infer_latency_seconds Inference latency, request headers received to response queued.\n"
               "# TYPE dlrec_infer_latency_seconds histogram\n");
  uint64_t cum = 0;
  for (int i = 0; i < SERVE_LATENCY_BUCKETS && s == DLREC_OK; i++) {
    cum += c.latency[i];
    s = put(b, "dlrec_infer_latency_seconds_bucket{le=\"%g\"} %llu\n", latency_le[i], (unsigned long long)cum);
  }
  if (s == DLREC_OK)
    s = put(b,
            "dlrec_infer_latency_seconds_bucket{le=\"+Inf\"} %llu\ndlrec_infer_latency_seconds_sum %.9g\n"
            "dlrec_infer_latency_seconds_count %llu\n",
            (unsigned long long)c.latency_count, c.latency_sum, (unsigned long long)c.latency_count);
  if (s == DLREC_OK)
    s = put(b, "# HELP dlrec_batch_rows Rows per scored batch (requests merged by the dynamic batcher).\n"
               "# TYPE dlrec_batch_rows histogram\n");
  cum = 0;
  for (int i = 0; i < SERVE_BATCH_BUCKETS && s == DLREC_OK; i++) {
    cum += c.batch[i];
    s = put(b, "dlrec_batch_rows_bucket{le=\"%u\"} %llu\n", 1u << i, (unsigned long long)cum);
  }
  if (s == DLREC_OK)
    s = put(b,
            "dlrec_batch_rows_bucket{le=\"+Inf\"} %llu\ndlrec_batch_rows_sum %llu\ndlrec_batch_rows_count %llu\n"
            "# HELP dlrec_rows_scored_total Rows scored.\n# TYPE dlrec_rows_scored_total counter\n"
            "dlrec_rows_scored_total %llu\n"
            "# HELP dlrec_keys_missing_total Raw keys scored that the hash table has no row for (left out of "
            "their rows' bags).\n# TYPE dlrec_keys_missing_total counter\ndlrec_keys_missing_total %llu\n"
            "# HELP dlrec_redis_rows_total Embedding rows scored with the Redis tier, by where they came from.\n"
            "# TYPE dlrec_redis_rows_total counter\ndlrec_redis_rows_total{source=\"cache\"} %llu\n"
            "dlrec_redis_rows_total{source=\"redis\"} %llu\ndlrec_redis_rows_total{source=\"table\"} %llu\n"
            "# HELP dlrec_redis_errors_total Reads of the Redis tier that failed (Redis down, slow or wrong); "
            "their rows came from the table.\n# TYPE dlrec_redis_errors_total counter\ndlrec_redis_errors_total %llu\n"
            "# HELP dlrec_redis_rejected_total Values under a row's key in Redis that were not a row of this "
            "table (size, checksum, a value not finite); their rows came from the table.\n"
            "# TYPE dlrec_redis_rejected_total counter\ndlrec_redis_rejected_total %llu\n"
            "# HELP dlrec_queue_rows Rows waiting to be scored.\n# TYPE dlrec_queue_rows gauge\n"
            "dlrec_queue_rows %llu\n"
            "# HELP dlrec_model_version The served checkpoint's step (-1: unloaded).\n"
            "# TYPE dlrec_model_version gauge\ndlrec_model_version{model=\"%s\"} %.0f\n"
            "# HELP dlrec_model_loads_total Checkpoint loads by result.\n# TYPE dlrec_model_loads_total counter\n"
            "dlrec_model_loads_total{result=\"ok\"} %llu\ndlrec_model_loads_total{result=\"error\"} %llu\n"
            "# HELP dlrec_connections_cut_total Slow connections closed: request past --request-timeout-s (408), "
            "or shed at --max-connections (503).\n"
            "# TYPE dlrec_connections_cut_total counter\n"
            "dlrec_connections_cut_total{reason=\"request_timeout\"} %llu\n"
            "dlrec_connections_cut_total{reason=\"shed\"} %llu\n",
            (unsigned long long)c.batches, (unsigned long long)c.batch_rows_sum, (unsigned long long)c.batches,
            (unsigned long long)c.rows_scored, (unsigned long long)c.keys_missing,
            (unsigned long long)c.redis_rows[0], (unsigned long long)c.redis_rows[1],
            (unsigned long long)c.redis_rows[2], (unsigned long long)c.redis_errors, (unsigned long long)c.redis_rejected, (unsigned long long)queue_rows,
            name, version,
            (unsigned long long)loads_ok, (unsigned long long)loads_failed, (unsigned long long)timed_out,
            (unsigned long long)shed);
  if (s == DLREC_OK)
    s = put(b,
            "# HELP dlrec_redis_foreign_total Rows in Redis of another training run than the served checkpoint's "
            "(another seed, config or ETL state publishing under the same prefix); their rows came from the table.\n"
            "# TYPE dlrec_redis_foreign_total counter\ndlrec_redis_foreign_total %llu\n"
            "# HELP dlrec_redis_lag_steps The served checkpoint's step minus the step of its run's last publish "
            "in Redis (0: Redis at or past the checkpoint; -1: Redis holds no publish of its run).\n"
            "# TYPE dlrec_redis_lag_steps gauge\ndlrec_redis_lag_steps %lld\n",
            (unsigned long long)c.redis_foreign, (long long)c.redis_lag_steps);
  if (s == DLREC_OK && mem) s = put_request_memory(b, mem);
  return s;
}
