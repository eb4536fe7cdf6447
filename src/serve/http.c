/* The HTTP side of `dlrec serve`: libmicrohttpd with a thread per
 * connection, routing of the KServe v2 / Triton endpoints, bodies bounded by
 * the body limit and the in-flight budget (reqmem.c), and the glue between
 * the protocol (kserve.h), the rows (serve_batch.h), the batcher and the
 * registry.
 *
 *   GET  /v2                                     server metadata
 *   GET  /v2/health/live, /v2/health/ready       200, or 503 when no model is loaded
 *   GET  /v2/models/M[/versions/V]               model metadata
 *   GET  /v2/models/M[/versions/V]/ready         200, or 503 when unloaded
 *   POST /v2/models/M[/versions/V]/infer         inference (JSON or binary tensors)
 *   POST /v2/repository/index                    [{"name","version","state"}]
 *   POST /v2/repository/models/M/load|unload     reload RUN's latest checkpoint / unload
 *                                                (with --model-control explicit only)
 *   GET  /metrics                                Prometheus text
 * Errors are {"error": "..."}: 400 bad request (also a control byte in the
 * path, or ambiguous framing headers), 401 a missing or wrong model control
 * token, 403 model control off, 404 unknown model, version or path, 405 wrong
 * method, 408 a request not received within --request-timeout-s, 413 body
 * over the limit, 501 an unknown Transfer-Encoding, 503 overloaded (the queue,
 * or --max-inflight-bytes), no model, or shutting down.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "core/log.h"
#include "core/clock.h"
#include "core/redis_rows.h"
#include "serve/serve_internal.h"

#ifndef DLREC_VERSION
#define DLREC_VERSION "dev"
#endif

typedef struct server {
  dlrec_serve_opts o;
  serve_registry reg;
  serve_batcher batcher;
  serve_metrics metrics;
  dlrec_kserve_limits limits;
  serve_conns conns;
  serve_reqmem mem; /* the in-flight budget, the rows pool */
  char *token; /* the model control token, or NULL */
  size_t token_len;
  serve_redis_opts redis; /* used when o.redis is set */
} server;

/* Per request state (MHD's con_cls), made when the request line comes. */
typedef struct request {
  double t0;
  const char *uri; /* the raw request target, as the request line had it */
  size_t uri_len;
  int headers_done; /* the handler has seen the headers */
  char *body;
  size_t len, cap;
  uint64_t limit;   /* the body limit: --max-body-bytes, or what follows --max-batch */
  uint64_t charged; /* bytes charged to the in-flight budget (the body's buffer) */
  int refuse;       /* 413 (body over the limit) or 503 (over the budget): answered once the body is read */
} request;

void dlrec_serve_opts_default(dlrec_serve_opts *o) {
  memset(o, 0, sizeof *o);
  o->host = "127.0.0.1";
  o->port = 8000;
  o->max_batch = 1024;
  o->max_delay_us = 500;
  o->max_body_bytes = 0;
  o->max_inflight_bytes = 1ull << 30;
  o->max_connections = 256;
  o->timeout_s = 30;
  o->request_timeout_s = 30;
  o->drain_timeout_s = 10;
  o->watch_interval_ms = 1000;
  o->redis_timeout_ms = 20;
  o->redis_max_age_ms = 1000;
  o->redis_cache_rows = 1u << 20;
}

/* The guard's record of connection c (its socket context), or NULL. */
static serve_conn *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return i ? i->socket_context : NULL;
}

/* Set when a drain begins: from then on every response closes its
 * connection. One server runs per process (it owns SIGINT and SIGTERM). */
static atomic_int g_draining;

/* ---- responses ---- */

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *type, const void *data,
                                 size_t len, long long header_len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
  if (!r) return MHD_NO;
  if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  /* While draining, each answered request ends its connection. */
  if (atomic_load(&g_draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
  if (header_len >= 0) {
    char v[32];
    snprintf(v, sizeof v, "%lld", header_len);
    MHD_add_response_header(r, "Inference-Header-Content-Length", v);
  }
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status, const dlrec_kserve_buf *b) {
  return send_body(c, status, "application/json", b->data, b->len, -1);
}

static enum MHD_Result send_error(server *sv, struct MHD_Connection *c, serve_endpoint ep, request *rq, int status,
                                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(server *sv, struct MHD_Connection *c, serve_endpoint ep, request *rq, int status,
                                  const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dlrec_kserve_buf b;
  dlrec_kserve_buf_init(&b);
  enum MHD_Result ret;
  if (dlrec_kserve_write_error(&b, msg) == DLREC_OK) ret = send_json(c, status, &b);
  else ret = send_body(c, 500, "text/plain", "out of memory\n", 14, -1);
  dlrec_kserve_buf_free(&b);
  serve_metrics_request(&sv->metrics, ep, status, rq ? dlrec_now() - rq->t0 : 0);
  return ret;
}

/* ---- handlers ---- */

/* The model a URL names, with a reference; sends 404/503 and returns NULL
 * when it is unknown, of another version, or unloaded. */
static serve_model *model_for(server *sv, struct MHD_Connection *c, const target *t, request *rq,
                              enum MHD_Result *ret) {
  serve_endpoint ep = serve_endpoint_of(t->r);
  if (strcmp(t->model, sv->reg.name) != 0) {
    *ret = send_error(sv, c, ep, rq, 404, "unknown model '%s' (this server has '%s')", t->model, sv->reg.name);
    return NULL;
  }
  serve_model *m = serve_registry_acquire(&sv->reg);
  if (!m) {
    *ret = send_error(sv, c, ep, rq, 503, "model '%s' is not loaded", t->model);
    return NULL;
  }
  if (t->version[0] && strcmp(t->version, m->version) != 0) {
    *ret = send_error(sv, c, ep, rq, 404, "model '%s' has no version '%s' (serving version %s)", t->model,
                      t->version, m->version);
    serve_model_release(m);
    return NULL;
  }
  return m;
}

/* The pre-scan of the request's JSON against what model m can score (400
 * before the tree is built), then the charge of its parse to the in-flight
 * budget (DLREC_ERR_NOMEM, a 503, when over); *cost is what was charged.
 * lim's max_elements becomes the pre-scan's, for the parse to hold to. */
static dlrec_status prescan_and_charge(server *sv, const serve_model *m, const request *rq, long long header_len,
                                       dlrec_kserve_limits *lim, uint64_t *cost) {
  const uint64_t v = serve_values_per_row(dlrec_net_schema(m->model->net)), b = sv->o.max_batch;
  serve_prescan_limits pl = {.max_rows = b, .max_elements = b * v + 1, .max_values = b * (v + 8) + 1024};
  if (pl.max_elements < lim->max_elements) lim->max_elements = pl.max_elements;
  size_t json_len = header_len >= 0 && (unsigned long long)header_len < rq->len ? (size_t)header_len : rq->len;
  uint64_t values = 0;
  char msg[512];
  if (rq->body && serve_prescan_json(rq->body, json_len, &pl, &values, msg, sizeof msg))
    return dlrec_error(DLREC_ERR_PARSE, "%s", msg);
  uint64_t want = serve_parse_cost(json_len, values);
  if (!serve_reqmem_charge(&sv->mem, want))
    return dlrec_error(DLREC_ERR_NOMEM, "server busy: parsing this request takes about %llu bytes, more than "
                       "--max-inflight-bytes (%llu) leaves beside the requests in flight; retry",
                       (unsigned long long)want, (unsigned long long)sv->mem.budget_bytes);
  *cost = want;
  return DLREC_OK;
}

static enum MHD_Result handle_infer(server *sv, struct MHD_Connection *c, const target *t, request *rq) {
  enum MHD_Result ret = MHD_NO;
  serve_batcher_receive_begin(&sv->batcher);
  serve_model *m = model_for(sv, c, t, rq, &ret);
  if (!m) {
    serve_batcher_receive_abort(&sv->batcher);
    return ret;
  }
  long long header_len = -1;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Inference-Header-Content-Length");
  dlrec_status s = DLREC_OK;
  if (h) {
    char *end;
    errno = 0;
    header_len = strtoll(h, &end, 10);
    if (end == h || *end || errno || header_len < 0)
      s = dlrec_error(DLREC_ERR_PARSE, "Inference-Header-Content-Length: not a byte count: '%.40s'", h);
  }
  dlrec_kserve_request *req = NULL;
  dlrec_serve_rows *rows = NULL;
  serve_pooled_rows lease = {0};
  float *scores = NULL;
  int binary = 0;
  uint64_t parse_cost = 0;
  dlrec_kserve_limits lim = sv->limits;
  if (s == DLREC_OK) s = prescan_and_charge(sv, m, rq, header_len, &lim, &parse_cost);
  if (s == DLREC_OK) s = dlrec_kserve_parse_request(rq->body ? rq->body : "", rq->len, header_len, &lim, &req);
  if (s == DLREC_OK) s = dlrec_kserve_request_output_binary(req, DLREC_KSERVE_OUTPUT, &binary);
  if (s == DLREC_OK && !(rows = serve_reqmem_rows_take(&sv->mem, m, &lease))) s = dlrec_last_status();
  uint32_t n = 0;
  if (s == DLREC_OK) s = dlrec_serve_rows_add_request(rows, req, sv->o.max_batch, &n);
  if (s == DLREC_OK && !(scores = malloc((n ? n : 1) * sizeof *scores)))
    s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (s == DLREC_OK) {
    serve_job job = {.model = m, .rows = rows, .scores = scores};
    s = serve_batcher_run(&sv->batcher, &job); /* ends the receive */
  } else {
    serve_batcher_receive_abort(&sv->batcher);
  }
  /* The rows and the parse's charge go back before the answer: a client
   * that reads it finds the memory its request took released. */
  serve_reqmem_rows_give(&sv->mem, &lease);
  char id[300];
  const char *req_id = req ? dlrec_kserve_request_id(req) : NULL;
  if (req_id) snprintf(id, sizeof id, "%s", req_id); /* at most max_name_bytes */
  dlrec_kserve_request_free(req);
  serve_reqmem_uncharge(&sv->mem, parse_cost);
  if (s == DLREC_OK) {
    dlrec_kserve_buf b;
    dlrec_kserve_buf_init(&b);
    dlrec_kserve_response resp = {.model_name = sv->reg.name, .model_version = m->version,
                                  .id = req_id ? id : NULL, .scores = scores, .rows = n,
                                  .binary = binary};
    size_t hl = 0;
    s = dlrec_kserve_write_response(&b, &resp, &hl);
    if (s == DLREC_OK) {
      ret = send_body(c, 200, binary ? "application/octet-stream" : "application/json", b.data, b.len,
                      binary ? (long long)hl : -1);
      serve_metrics_request(&sv->metrics, EP_INFER, 200, dlrec_now() - rq->t0);
    }
    dlrec_kserve_buf_free(&b);
  }
  if (s != DLREC_OK) {
    int status = dlrec_kserve_http_status(s);
    ret = send_error(sv, c, EP_INFER, rq, status, "%s", dlrec_last_error());
  }
  free(scores);
  serve_model_release(m);
  return ret;
}

static enum MHD_Result handle_repo_index(server *sv, struct MHD_Connection *c, request *rq) {
  pthread_mutex_lock(&sv->reg.mu);
  char version[24] = "";
  if (sv->reg.current) snprintf(version, sizeof version, "%s", sv->reg.current->version);
  char reason[512];
  snprintf(reason, sizeof reason, "%s", sv->reg.current ? "" : sv->reg.last_error[0] ? sv->reg.last_error : "unloaded");
  pthread_mutex_unlock(&sv->reg.mu);
  cJSON *arr = cJSON_CreateArray(), *o = cJSON_CreateObject();
  cJSON_AddItemToArray(arr, o);
  cJSON_AddStringToObject(o, "name", sv->reg.name);
  if (version[0]) cJSON_AddStringToObject(o, "version", version);
  cJSON_AddStringToObject(o, "state", version[0] ? "READY" : "UNAVAILABLE");
  if (!version[0]) cJSON_AddStringToObject(o, "reason", reason);
  char *text = cJSON_PrintUnformatted(arr);
  cJSON_Delete(arr);
  if (!text) return send_error(sv, c, EP_REPOSITORY, rq, 500, "out of memory");
  enum MHD_Result ret = send_body(c, 200, "application/json", text, strlen(text), -1);
  cJSON_free(text);
  serve_metrics_request(&sv->metrics, EP_REPOSITORY, 200, dlrec_now() - rq->t0);
  return ret;
}

static enum MHD_Result send_ok(server *sv, struct MHD_Connection *c, serve_endpoint ep, request *rq,
                               const char *type, const char *body) {
  enum MHD_Result ret = send_body(c, 200, type, body, strlen(body), -1);
  serve_metrics_request(&sv->metrics, ep, 200, dlrec_now() - rq->t0);
  return ret;
}

/* 1 when the request carries the model control token as
 * "Authorization: Bearer TOKEN" (or none is required). */
static int authorized(server *sv, struct MHD_Connection *c) {
  if (!sv->token) return 1;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
  h += 7;
  while (*h == ' ') h++;
  size_t n = strlen(h);
  while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
  return serve_token_equal(h, n, sv->token, sv->token_len);
}

/* POST /v2/repository/models/M/load|unload: only with model control on
 * (403), and with the token when one is set (401). */
static enum MHD_Result handle_repo_control(server *sv, struct MHD_Connection *c, const target *t, request *rq) {
  if (!sv->o.model_control)
    return send_error(sv, c, EP_REPOSITORY, rq, 403,
                      "model control is off: start the server with --model-control explicit to allow %s",
                      t->r == R_REPO_LOAD ? "load" : "unload");
  if (!authorized(sv, c)) {
    char msg[] = "{\"error\":\"model control needs the token: Authorization: Bearer TOKEN "
                 "(--model-control-token-file)\"}";
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(msg), msg, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (atomic_load(&g_draining)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, 401, r);
    MHD_destroy_response(r);
    serve_metrics_request(&sv->metrics, EP_REPOSITORY, 401, dlrec_now() - rq->t0);
    return ret;
  }
  if (strcmp(t->model, sv->reg.name) != 0)
    return send_error(sv, c, EP_REPOSITORY, rq, 404, "unknown model '%s' (this server has '%s')", t->model,
                      sv->reg.name);
  if (t->r == R_REPO_UNLOAD) {
    serve_registry_unload(&sv->reg);
    return send_ok(sv, c, EP_REPOSITORY, rq, "application/json", "{}");
  }
  if (serve_registry_load(&sv->reg) == DLREC_OK) return send_ok(sv, c, EP_REPOSITORY, rq, "application/json", "{}");
  return send_error(sv, c, EP_REPOSITORY, rq, 400, "failed to load '%s': %s", t->model, dlrec_last_error());
}

static enum MHD_Result dispatch(server *sv, struct MHD_Connection *c, const target *t, request *rq) {
  serve_endpoint ep = serve_endpoint_of(t->r);
  enum MHD_Result ret = MHD_NO;
  dlrec_kserve_buf b;
  dlrec_kserve_buf_init(&b);
  switch (t->r) {
  case R_LIVE: ret = send_ok(sv, c, ep, rq, NULL, ""); break;
  case R_READY: {
    serve_model *m = serve_registry_acquire(&sv->reg);
    ret = m ? send_ok(sv, c, ep, rq, NULL, "") : send_error(sv, c, ep, rq, 503, "no model is loaded");
    serve_model_release(m);
    break;
  }
  case R_SERVER_META: {
    static const char *const ext[] = {"binary_tensor_data", "model_repository"};
    if (dlrec_kserve_write_server_metadata(&b, "dlrec", DLREC_VERSION, ext, 2) == DLREC_OK)
      ret = send_ok(sv, c, ep, rq, "application/json", b.data);
    else
      ret = send_error(sv, c, ep, rq, 500, "%s", dlrec_last_error());
    break;
  }
  case R_MODEL_META:
  case R_MODEL_READY: {
    serve_model *m = model_for(sv, c, t, rq, &ret);
    if (!m) break;
    /* The raw convention takes the ETL state's input columns. */
    const dlrec_schema *ms = dlrec_net_schema(m->model->net);
    uint32_t raw[2] = {ms->n_dense, ms->n_sparse};
    if (m->model->etl) dlrec_etl_input_columns(m->model->etl, &raw[0], &raw[1]);
    if (t->r == R_MODEL_READY) ret = send_ok(sv, c, ep, rq, NULL, "");
    else if (dlrec_kserve_write_model_metadata(&b, sv->reg.name, m->version,
                                               dlrec_net_get_config(m->model->net)->type, ms, raw) == DLREC_OK)
      ret = send_ok(sv, c, ep, rq, "application/json", b.data);
    else
      ret = send_error(sv, c, ep, rq, 500, "%s", dlrec_last_error());
    serve_model_release(m);
    break;
  }
  case R_INFER: ret = handle_infer(sv, c, t, rq); break;
  case R_REPO_INDEX: ret = handle_repo_index(sv, c, rq); break;
  case R_REPO_LOAD:
  case R_REPO_UNLOAD: ret = handle_repo_control(sv, c, t, rq); break;
  case R_METRICS:
    if (serve_metrics_write(&sv->metrics, &b, serve_batcher_queued_rows(&sv->batcher), &sv->reg, &sv->conns,
                            &sv->mem) == DLREC_OK) {
      ret = send_body(c, 200, "text/plain; version=0.0.4", b.data, b.len, -1);
      serve_metrics_request(&sv->metrics, ep, 200, 0);
    } else {
      ret = send_error(sv, c, ep, rq, 500, "%s", dlrec_last_error());
    }
    break;
  default: ret = send_error(sv, c, EP_OTHER, rq, 404, "not found"); break;
  }
  dlrec_kserve_buf_free(&b);
  return ret;
}

/* libmicrohttpd's URI log callback: a request line came. Makes the
 * request's state (its con_cls) and restarts the connection's deadline. The
 * raw target is kept to find a NUL byte in it later (libmicrohttpd ends the
 * target's string there, so "/v2\0junk" would read as "/v2"). */
static void *on_request_line(void *cls, const char *uri, struct MHD_Connection *c) {
  server *sv = cls;
  serve_conn_phase_set(&sv->conns, conn_of(c), SERVE_CONN_HEADERS);
  request *rq = calloc(1, sizeof *rq);
  if (!rq) return NULL;
  rq->t0 = dlrec_now();
  rq->uri = uri;
  rq->uri_len = strlen(uri);
  return rq;
}

/* 1 when the request line held a NUL byte in its target. libmicrohttpd
 * parses the line in place: the target starts at url and the version right
 * after the space that ends it, so a target whose string is shorter than
 * that span had a NUL inside. (url is the same pointer as the raw target:
 * the query is cut off and %HH decoded in place after the log callback.) */
static int request_line_has_nul(const request *rq, const char *url, const char *version) {
  if (!rq->uri || url != rq->uri || !version || !version[0]) return 0;
  /* Only a version further on in the same line counts: were libmicrohttpd
   * to keep it elsewhere, every request would look cut. */
  const char *end = rq->uri + rq->uri_len + 1;
  return version > end && version - end < 65536;
}

/* A path that routing must not see: a control byte after decoding (a
 * decoded NUL shows as 0x7f, see serve_unescape), or a NUL in the raw
 * request line. 1 with a message, else 0. */
static int bad_path(const request *rq, const char *url, const char *version, char *msg, size_t cap) {
  size_t at = serve_path_control_byte(url);
  if (at) {
    char shown[64];
    snprintf(msg, cap, "the path '%s' has a control byte at offset %zu (bytes below 0x20 and 0x7f, also as %%HH)",
             dlrec_kserve_shown(url, strlen(url), shown, sizeof shown), at - 1);
    return 1;
  }
  if (request_line_has_nul(rq, url, version)) {
    snprintf(msg, cap, "the request line has a NUL byte in its path");
    return 1;
  }
  return 0;
}

/* The body limit of a request starting now: --max-body-bytes, or by
 * default what follows --max-batch for the model being served. */
static uint64_t body_limit(server *sv) {
  if (sv->o.max_body_bytes) return sv->o.max_body_bytes;
  serve_model *m = serve_registry_acquire(&sv->reg);
  uint64_t v = m ? serve_values_per_row(dlrec_net_schema(m->model->net)) : 0;
  serve_model_release(m);
  return serve_default_body_limit(sv->o.max_batch, v);
}

/* The checks of the framing headers and the declared body size once the
 * headers are in: an error status (with msg), or 0. A declared body is
 * charged to the in-flight budget now (503 when over), before it is read. */
static int check_head(server *sv, struct MHD_Connection *c, request *rq, char *msg, size_t cap) {
  int st = serve_check_framing(c, msg, cap);
  if (st) return st;
  rq->limit = body_limit(sv);
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  uint64_t declared = cl ? strtoull(cl, NULL, 10) : 0;
  if (declared > rq->limit) return 413;
  if (declared && !serve_reqmem_charge(&sv->mem, declared)) return 503;
  rq->charged = declared;
  return 0;
}

/* Appends a piece of the body: 0, or the status to answer once the body is
 * read (413 over the limit, 503 over the in-flight budget), or -1 out of
 * memory. The buffer grows by doubling up to the limit; what it takes
 * beyond the declared length is charged as it grows. */
static int body_append(server *sv, request *rq, const char *data, size_t n) {
  if (rq->len + n > rq->limit) return 413;
  if (rq->len + n > rq->cap) {
    size_t cap = rq->cap ? rq->cap : rq->charged ? (size_t)rq->charged : 4096;
    while (cap < rq->len + n) cap *= 2;
    if (cap > rq->limit) cap = (size_t)rq->limit;
    if (cap > rq->charged) {
      if (!serve_reqmem_charge(&sv->mem, cap - rq->charged)) return 503;
      rq->charged = cap;
    }
    char *p = realloc(rq->body, cap);
    if (!p) return -1;
    serve_reqmem_buffer(&sv->mem, (int64_t)(cap - rq->cap));
    rq->body = p;
    rq->cap = cap;
  }
  memcpy(rq->body + rq->len, data, n);
  rq->len += n;
  return 0;
}

/* The answer to a request refused for its body (rq->refuse). */
static enum MHD_Result send_refusal(server *sv, struct MHD_Connection *c, const char *url, request *rq) {
  target t;
  serve_parse_target(url, &t);
  if (rq->refuse == 503)
    return send_error(sv, c, serve_endpoint_of(t.r), rq, 503, "server busy: the requests in flight hold "
                      "--max-inflight-bytes (%llu); retry", (unsigned long long)sv->mem.budget_bytes);
  if (sv->o.max_body_bytes)
    return send_error(sv, c, serve_endpoint_of(t.r), rq, 413, "request body over the limit of %llu bytes "
                      "(--max-body-bytes)", (unsigned long long)rq->limit);
  return send_error(sv, c, serve_endpoint_of(t.r), rq, 413, "request body over the limit of %llu bytes (%u + %u x "
                    "--max-batch %u x the model's values per row; --max-body-bytes sets another)",
                    (unsigned long long)rq->limit, SERVE_BODY_BASE_BYTES, SERVE_BODY_VALUE_BYTES, sv->o.max_batch);
}

/* Frees the request's body and returns what it was charged. Called once the
 * answer is queued: libmicrohttpd sends it after the handler returns, so a
 * client that has its answer finds the memory released. */
static void release_body(server *sv, request *rq) {
  serve_reqmem_buffer(&sv->mem, -(int64_t)rq->cap);
  serve_reqmem_uncharge(&sv->mem, rq->charged);
  free(rq->body);
  rq->body = NULL;
  rq->cap = rq->len = 0;
  rq->charged = 0;
}

/* A whole request: routed and answered. */
static enum MHD_Result answer(server *sv, struct MHD_Connection *c, const char *url, const char *method, request *rq) {
  target t;
  serve_parse_target(url, &t);
  serve_endpoint ep = serve_endpoint_of(t.r);
  if (t.r == R_NONE) return send_error(sv, c, EP_OTHER, rq, 404, "not found: %s %s", method, url);
  int post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
  if (serve_is_post(t.r) ? !post : !get)
    return send_error(sv, c, ep, rq, 405, "%s %s: use %s", method, url, serve_is_post(t.r) ? "POST" : "GET");
  return dispatch(sv, c, &t, rq);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  server *sv = cls;
  request *rq = *con_cls;
  if (!rq) { /* the log callback ran out of memory */
    if (!(rq = calloc(1, sizeof *rq))) return MHD_NO;
    rq->t0 = dlrec_now();
    *con_cls = rq;
  }
  if (!rq->headers_done) { /* the headers: decide now whether the body may come */
    rq->headers_done = 1;
    serve_conn_phase_set(&sv->conns, conn_of(c), SERVE_CONN_BODY);
    /* An error here is answered before the body is read: libmicrohttpd
     * then closes the connection, as it cannot tell where the next request
     * would start. */
    char msg[512];
    if (bad_path(rq, url, version, msg, sizeof msg)) return send_error(sv, c, EP_OTHER, rq, 400, "%s", msg);
    int st = check_head(sv, c, rq, msg, sizeof msg);
    if (st == 413 || st == 503) {
      rq->refuse = st;
    } else if (st) {
      target t;
      serve_parse_target(url, &t);
      return send_error(sv, c, serve_endpoint_of(t.r), rq, st, "%s", msg);
    }
    if (!rq->refuse) return MHD_YES;
  }
  if (rq->refuse) {
    /* A Content-Length over the limit or the budget is answered at once,
     * before the body is read (MHD then closes the connection). A chunked
     * body found too large on the way is read and dropped, then answered;
     * one that goes on past 16 times the limit is cut off. */
    if (*upload_size) {
      rq->len += *upload_size;
      *upload_size = 0;
      return rq->len / 16 > rq->limit ? MHD_NO : MHD_YES;
    }
    enum MHD_Result ret = send_refusal(sv, c, url, rq);
    release_body(sv, rq);
    return ret;
  }
  if (*upload_size) { /* a piece of the body */
    int st = body_append(sv, rq, upload, *upload_size);
    if (st < 0) return MHD_NO;
    if (st) { /* the rest is read and dropped: the buffer goes now */
      size_t seen = rq->len + *upload_size;
      release_body(sv, rq);
      rq->refuse = st;
      rq->len = seen;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  serve_conn_phase_set(&sv->conns, conn_of(c), SERVE_CONN_HANDLING); /* the whole request is in */
  enum MHD_Result ret = answer(sv, c, url, method, rq);
  release_body(sv, rq);
  return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)toe;
  server *sv = cls;
  request *rq = *con_cls;
  if (rq) {
    release_body(sv, rq);
    free(rq);
    *con_cls = NULL;
  }
  serve_conn_phase_set(&sv->conns, conn_of(c), SERVE_CONN_IDLE);
}

/* libmicrohttpd's connection notifications: the guard tracks each socket. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  server *sv = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *socket_context = i ? serve_conn_open(&sv->conns, i->connect_fd) : NULL;
  } else {
    serve_conn_closed(&sv->conns, *socket_context);
    *socket_context = NULL;
  }
}

/* After SIGINT or SIGTERM: stops accepting, closes idle connections, and
 * waits up to drain_timeout_s for the requests in flight, or until another
 * signal comes. */
static void drain(server *sv, struct MHD_Daemon *d, const sigset_t *stop_signals) {
  atomic_store(&g_draining, 1);
  MHD_socket lfd = MHD_quiesce_daemon(d);
  /* On Linux a listening socket that is shut down stops listening: a new
   * connection is refused at once instead of waiting in the backlog. The
   * descriptor itself stays open until MHD_stop_daemon, as MHD asks. */
  if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR);
  serve_conns_drain_begin(&sv->conns);
  double t0 = dlrec_now(), until = t0 + sv->o.drain_timeout_s;
  uint32_t n = serve_conns_in_flight(&sv->conns);
  if (n) DLREC_INFO("draining: %u requests in flight (up to %u s)", n, sv->o.drain_timeout_s);
  while (n && dlrec_now() < until) {
    struct timespec tick = {.tv_nsec = 20 * 1000000L};
    if (sigtimedwait(stop_signals, NULL, &tick) > 0) {
      DLREC_INFO("a second signal: stopping now");
      break;
    }
    n = serve_conns_in_flight(&sv->conns);
  }
  if (n) DLREC_WARN("drain: %u requests still in flight after %.1f s are cut off", n, dlrec_now() - t0);
  else DLREC_INFO("drained in %.2f s", dlrec_now() - t0);
}

static void log_mhd(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = 0;
  DLREC_DEBUG("http: %s", msg);
}

/* The options' defaults and checks, the token read. */
static dlrec_status check_opts(server *sv, struct sockaddr_in *addr) {
  dlrec_serve_opts *o = &sv->o;
  if (!o->threads) o->threads = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
  if (!o->threads) o->threads = 1;
  if (!o->max_queue_rows) o->max_queue_rows = 16 * o->max_batch;
  dlrec_kserve_limits_default(&sv->limits);
  *addr = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(o->port)};
  if (inet_pton(AF_INET, o->host, &addr->sin_addr) != 1)
    return dlrec_error(DLREC_ERR_INVALID, "--host %s: not an IPv4 address", o->host);
  if (o->max_batch < 1 || o->max_batch > (1u << 20))
    return dlrec_error(DLREC_ERR_INVALID, "--max-batch %u out of range [1, %u]", o->max_batch, 1u << 20);
  if (o->model_control_token_file && !o->model_control)
    return dlrec_error(DLREC_ERR_INVALID, "--model-control-token-file needs --model-control explicit");
  return o->model_control_token_file ? serve_read_token(o->model_control_token_file, &sv->token, &sv->token_len) : DLREC_OK;
}

/* The Redis tier's options (a malformed address or option is an error now,
 * not at the first request), the batcher's workers, the registry's
 * watcher and the connections' guard. */
static dlrec_status start_workers(server *sv) {
  dlrec_serve_opts *o = &sv->o;
  dlrec_status s = DLREC_OK;
  sv->redis = (serve_redis_opts){.addr = o->redis, .prefix = o->redis_prefix, .timeout_ms = o->redis_timeout_ms,
                                 .max_age_ms = o->redis_max_age_ms, .cache_rows = o->redis_cache_rows};
  if (o->redis) {
    dlrec_redis_rows *probe = NULL;
    s = dlrec_redis_rows_open(&probe, o->redis, o->redis_prefix ? o->redis_prefix : "dlrec", 1, o->redis_timeout_ms,
                              1000);
    dlrec_redis_rows_close(probe);
  }
  /* A GPU's backend takes its ops from one thread: its copies of a batch
   * share the backend's scratch, and one stream runs them in order anyway;
   * the batcher's batches keep it busy. */
  const uint32_t workers = dlrec_backend_host_memory(sv->reg.be) ? o->threads : 1;
  if (s == DLREC_OK && o->redis && workers == 1 && !dlrec_backend_host_memory(sv->reg.be))
    s = dlrec_error(DLREC_ERR_UNSUPPORTED, "--redis: %s scores from the table in its own memory; serve with "
                    "--device cpu to read rows from Redis", dlrec_backend_describe(sv->reg.be));
  if (s == DLREC_OK)
    s = serve_batcher_start(&sv->batcher, workers, o->max_batch, o->max_delay_us, o->max_queue_rows, &sv->metrics,
                            o->redis ? &sv->redis : NULL);
  if (s == DLREC_OK && o->watch) s = serve_registry_watch(&sv->reg, o->watch_interval_ms);
  if (s == DLREC_OK) s = serve_conns_start(&sv->conns, o->max_connections, o->request_timeout_s, o->timeout_s);
  return s;
}

/* libmicrohttpd listening on addr; its port into --port-file. */
static dlrec_status listen_on(server *sv, struct sockaddr_in *addr, struct MHD_Daemon **out) {
  dlrec_serve_opts *o = &sv->o;
  /* libmicrohttpd's own limit leaves room above --max-connections: the
   * guard sheds down to the limit, and shed connections take a moment to
   * close (their threads must run). Past this hard limit libmicrohttpd
   * closes new connections unanswered, so the room is generous: on a
   * loaded machine, a quarter of the slots (16 of 16) was too little for a
   * health probe to get in under a slowloris. A connection's own memory is
   * its thread's stack (reserved, resident as far as touched) and its 32 KiB
   * buffer for the request line and headers; request memory is reqmem.c's. */
  unsigned hard_limit = o->max_connections + (o->max_connections > 64 ? o->max_connections : 64);
  struct MHD_Daemon *d =
      MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                           MHD_USE_ERROR_LOG,
                       0, NULL, NULL, on_request, sv, MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL, MHD_OPTION_SOCK_ADDR,
                       (struct sockaddr *)addr, MHD_OPTION_CONNECTION_LIMIT, hard_limit,
                       MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                       on_completed, sv, MHD_OPTION_NOTIFY_CONNECTION, on_connection, sv,
                       MHD_OPTION_URI_LOG_CALLBACK, on_request_line, sv, MHD_OPTION_UNESCAPE_CALLBACK,
                       serve_unescape, NULL, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                       MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(32u << 10), MHD_OPTION_END);
  *out = d;
  if (!d)
    return dlrec_error(DLREC_ERR_IO, "cannot listen on %s:%u (in use, or not an address of this machine)", o->host,
                       o->port);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  unsigned port = info ? info->port : o->port;
  dlrec_status s = DLREC_OK;
  if (o->port_file) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 || rename(tmp, o->port_file) != 0)
      s = dlrec_error(DLREC_ERR_IO, "%s: %s", o->port_file, strerror(errno));
  }
  DLREC_INFO("listening on http://%s:%u (model '%s', %u workers, batches of up to %u rows, delay %u us)", o->host,
             port, sv->reg.name, o->threads, o->max_batch, o->max_delay_us);
  return s;
}

dlrec_status dlrec_serve_run(const dlrec_serve_opts *opts) {
  server *sv = calloc(1, sizeof *sv);
  if (!sv) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  sv->o = *opts;
  struct sockaddr_in addr;
  dlrec_status s = check_opts(sv, &addr);
  if (s != DLREC_OK) {
    free(sv);
    return s;
  }
  atomic_store(&g_draining, 0);
  /* SIGINT and SIGTERM stop the server: blocked here, before any thread
   * starts (threads inherit the mask), and taken by sigwait below. */
  sigset_t stop_signals, old_mask;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old_mask);
  signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
  /* glibc raises its mmap threshold to the largest block freed (up to 32
   * MiB), after which request bodies and JSON trees come from the heaps and
   * stay in the process when freed: RSS kept what a burst of requests
   * took. A fixed threshold keeps every large block mmapped, returned to
   * the system when the request ends. */
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
#endif
  serve_metrics_init(&sv->metrics);
  serve_reqmem_init(&sv->mem, sv->o.max_inflight_bytes, sv->o.threads * 2 > 16 ? sv->o.threads * 2 : 16);
  if ((s = serve_registry_open(&sv->reg, sv->o.run_dir, sv->o.device)) != DLREC_OK) {
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    dlrec_error_context("%s: ", sv->o.run_dir);
    serve_reqmem_destroy(&sv->mem);
    serve_metrics_destroy(&sv->metrics);
    free(sv->token);
    free(sv);
    return s;
  }
  s = start_workers(sv);
  struct MHD_Daemon *d = NULL;
  if (s == DLREC_OK) s = listen_on(sv, &addr, &d);
  if (s == DLREC_OK) {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    DLREC_INFO("stopping (signal %d)", sig);
    drain(sv, d, &stop_signals);
  }
  if (d) MHD_stop_daemon(d); /* waits for the connections' threads */
  serve_conns_stop(&sv->conns);
  if (sv->batcher.workers) serve_batcher_stop(&sv->batcher);
  serve_registry_close(&sv->reg);
  serve_reqmem_destroy(&sv->mem);
  serve_metrics_destroy(&sv->metrics);
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
  free(sv->token);
  free(sv);
  return s;
}
