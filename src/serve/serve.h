/* `dlrec serve`: a trained model behind the KServe v2 / Triton HTTP protocol.
 *
 * libmicrohttpd accepts connections, one thread each. A request's headers
 * and body must arrive within request_timeout_s of its start (a client that
 * trickles bytes is answered 408 and cut off), an idle keep-alive connection
 * is closed after timeout_s, and when max_connections are open a new
 * connection makes room by closing the oldest one that is still sending its
 * request or idle (503), so that slow clients cannot take every slot. A request's thread
 * parses the body (kserve.h), encodes its rows with the model it started on
 * (serve_batch.h) and queues them; `threads` workers merge queued requests
 * of the same model into batches of up to max_batch rows, waiting up to
 * max_delay_us for more while other requests are being received, score them
 * with the batch-invariant scorer (model.h) and hand each request its rows'
 * scores. The queue holds at most max_queue_rows rows; beyond that a request
 * gets 503 at once instead of waiting. A body is bounded by max_body_bytes
 * (by default a function of max_batch), its JSON is pre-scanned for its
 * shapes before it is parsed, and the requests in flight together by
 * max_inflight_bytes (503 beyond); a connection holds no request memory
 * between its requests (rows buffers are pooled across connections).
 *
 * Models: RUN's latest checkpoint is loaded at start. With watch, RUN/latest
 * is polled and a new checkpoint is loaded in the background and swapped in
 * atomically; requests keep a reference to the model they started on and
 * finish on it. A checkpoint that fails to load is refused and logged; the
 * old model keeps serving. The repository endpoints do the same on demand
 * when model_control allows them (off by default: 403), optionally only for
 * clients that send the token (Authorization: Bearer); at most one load runs
 * at a time, and concurrent load requests for the same checkpoint share it.
 *
 * SIGINT or SIGTERM drains: the listening socket closes (new connections are
 * refused), idle connections and ones still sending headers are closed,
 * requests whose headers have arrived get up to drain_timeout_s to finish
 * (their responses say Connection: close), then the server stops. A second
 * signal stops it at once.
 */
#ifndef DLREC_SERVE_H
#define DLREC_SERVE_H

#include <stdint.h>

#include "core/status.h"

typedef struct dlrec_serve_opts {
  const char *run_dir;        /* RUN (or a checkpoint directory) */
  const char *host;           /* "127.0.0.1" */
  uint16_t port;              /* 8000; 0: an ephemeral port (see port_file) */
  const char *port_file;      /* NULL, or a file to write the bound port into once listening */
  uint32_t threads;           /* scoring workers; 0: the machine's cores */
  const char *device;         /* where models score: "cpu" (NULL too), "cuda" or "cuda:N" */
  uint32_t max_batch;         /* 1024: rows per merged batch, and per request */
  uint32_t max_delay_us;      /* 500 */
  uint32_t max_queue_rows;    /* 0: 16 x max_batch */
  uint64_t max_body_bytes;    /* 0: 64 KiB + max_batch x 64 x the model's values per row (docs/serving.md) */
  uint64_t max_inflight_bytes; /* 1 GiB: the requests in flight together (bodies and parses); 0: no limit */
  uint32_t max_connections;   /* 256 */
  uint32_t timeout_s;         /* 30: idle connections are closed after this */
  uint32_t request_timeout_s; /* 30: a request's headers and body must arrive within this; 0: no limit */
  uint32_t drain_timeout_s;   /* 10: on SIGINT/SIGTERM, in-flight requests get this long to finish */
  int model_control;          /* 0: repository load/unload answer 403; 1: allowed ("explicit") */
  const char *model_control_token_file; /* NULL, or a file holding the token load/unload must carry */
  int watch;                  /* poll RUN/latest for new checkpoints */
  uint32_t watch_interval_ms; /* 1000 */
  /* The Redis tier (docs/serving.md): rows a trainer publishes, read in
   * front of the checkpoint's table. redis NULL: none. */
  const char *redis;          /* HOST:PORT */
  const char *redis_prefix;   /* NULL: dlrec:NAME, the model's name (the trainer's default) */
  uint32_t redis_timeout_ms;  /* 20: per read; Redis slower than that is taken as down */
  uint32_t redis_max_age_ms;  /* 1000: a row read from Redis is served at most this long */
  uint64_t redis_cache_rows;  /* 1048576 per scoring worker; 0: every row read from Redis */
} dlrec_serve_opts;

void dlrec_serve_opts_default(dlrec_serve_opts *o);

/* Loads the model, starts listening and serves until SIGINT or SIGTERM
 * (draining as above). Returns DLREC_OK after a clean stop; an error when the
 * model cannot be loaded, the token file cannot be read or the address cannot
 * be bound. */
dlrec_status dlrec_serve_run(const dlrec_serve_opts *o);

#endif
