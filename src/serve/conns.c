/* The connection guard of `dlrec serve` (see serve_internal.h): a deadline
 * for each request's headers and body, a watchdog thread that cuts off
 * connections past theirs, shedding of the oldest slow connection when the
 * slots run out, and the bookkeeping of a drain.
 *
 * A connection is cut off by writing a short response (408 or 503, when a
 * request is pending) and shutting its socket down; libmicrohttpd's thread
 * for it then reads the end of the stream and closes it, and tells us so
 * (serve_conn_closed) before it closes the descriptor. Everything here runs
 * under one lock, and a descriptor is only touched while its connection is
 * in the list, so a shut-down never hits a descriptor that was reused. */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/log.h"
#include "core/clock.h"
#include "serve/serve_internal.h"

/* Writes a one-shot error response (status 0: none) and shuts the socket
 * down. The write does not block: the client has sent its request line and
 * headers so far, and is not reading a response of ours at the same time. */
static void cut(serve_conns *g, serve_conn *c, int status, const char *why) {
  if (status) {
    char body[256], msg[512];
    int bn = snprintf(body, sizeof body, "{\"error\":\"%s\"}", why);
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     status, status == 408 ? "Request Timeout" : "Service Unavailable", bn, body);
    if (n > 0 && (size_t)n < sizeof msg) {
      ssize_t w = send(c->fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)w; /* best effort: the connection is closed either way */
    }
  }
  shutdown(c->fd, SHUT_RDWR);
  c->closing = 1;
  c->deadline = 0;
  g->closing++;
}

static const char *phase_name(serve_conn_phase p) {
  switch (p) {
  case SERVE_CONN_HEADERS: return "headers";
  case SERVE_CONN_BODY: return "body";
  case SERVE_CONN_HANDLING: return "handling";
  default: return "idle";
  }
}

/* serve_conns_sweep with g->mu held. */
static double sweep_locked(serve_conns *g, double now) {
  double next = now + 1.0;
  for (serve_conn *c = g->head; c; c = c->next) {
    if (c->closing || c->deadline <= 0) continue;
    if (now >= c->deadline) {
      DLREC_DEBUG("http: cutting off a connection after %.1f s in phase %s", now - c->started, phase_name(c->phase));
      if (c->phase == SERVE_CONN_IDLE) {
        cut(g, c, 0, NULL);
      } else {
        g->timed_out++;
        cut(g, c, 408, "request not received within --request-timeout-s");
      }
    } else if (c->deadline < next) {
      next = c->deadline;
    }
  }
  return next;
}

double serve_conns_sweep(serve_conns *g, double now) {
  pthread_mutex_lock(&g->mu);
  double next = sweep_locked(g, now);
  pthread_mutex_unlock(&g->mu);
  return next;
}

/* Once connections have closed and no request is in flight, the heap's
 * free pages go back to the system (what the threads of a burst of
 * connections freed stays in glibc's per-thread arenas otherwise: RSS did
 * not come down after they closed). At most once per wake of the
 * watchdog, about a second; called with g->mu held. */
static void give_back(serve_conns *g) {
#ifdef __GLIBC__
  if (!g->closed) return;
  for (serve_conn *c = g->head; c; c = c->next)
    if (!c->closing && (c->phase == SERVE_CONN_BODY || c->phase == SERVE_CONN_HANDLING)) return;
  g->closed = 0;
  pthread_mutex_unlock(&g->mu);
  malloc_trim(0);
  pthread_mutex_lock(&g->mu);
#else
  (void)g;
#endif
}

static void *watchdog_main(void *arg) {
  serve_conns *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->stop) {
    double next = sweep_locked(g, dlrec_now());
    /* Deadlines are at least a second away when set, and the watchdog
     * wakes at least once a second, so a new one is never missed. */
    double wait = next - dlrec_now();
    if (wait < 0.001) wait = 0.001;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    long long ns = (long long)until.tv_nsec + (long long)(wait * 1e9);
    until.tv_sec += (time_t)(ns / 1000000000LL);
    until.tv_nsec = (long)(ns % 1000000000LL);
    pthread_cond_timedwait(&g->cv, &g->mu, &until);
    give_back(g);
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

dlrec_status serve_conns_start(serve_conns *g, uint32_t max, uint32_t request_timeout_s, uint32_t idle_timeout_s) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &a);
  pthread_condattr_destroy(&a);
  g->max = max ? max : 1;
  g->request_timeout_s = request_timeout_s;
  g->idle_timeout_s = idle_timeout_s;
  if (pthread_create(&g->watchdog, NULL, watchdog_main, g) != 0) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    return dlrec_error(DLREC_ERR_INTERNAL, "cannot start the connection watchdog");
  }
  g->started = 1;
  return DLREC_OK;
}

void serve_conns_stop(serve_conns *g) {
  if (!g->started) return;
  pthread_mutex_lock(&g->mu);
  g->stop = 1;
  pthread_cond_signal(&g->cv);
  pthread_mutex_unlock(&g->mu);
  pthread_join(g->watchdog, NULL);
  while (g->head) { /* libmicrohttpd has stopped; nothing else holds these */
    serve_conn *c = g->head;
    g->head = c->next;
    free(c);
  }
  if (g->timed_out || g->shed)
    DLREC_INFO("http: %llu requests cut off by --request-timeout-s, %llu connections shed at --max-connections",
               (unsigned long long)g->timed_out, (unsigned long long)g->shed);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  g->started = 0;
}

/* The connection to shed for a newcomer: idle ones first (nothing is lost),
 * then those still sending headers, then those sending a body; the oldest
 * of a kind first. Never one being answered, nor the newcomer. */
static serve_conn *victim(serve_conns *g, const serve_conn *except) {
  static const serve_conn_phase order[3] = {SERVE_CONN_IDLE, SERVE_CONN_HEADERS, SERVE_CONN_BODY};
  for (int k = 0; k < 3; k++) {
    serve_conn *best = NULL;
    for (serve_conn *c = g->head; c; c = c->next)
      if (c != except && !c->closing && c->phase == order[k] && (!best || c->started < best->started)) best = c;
    if (best) return best;
  }
  return NULL;
}

serve_conn *serve_conn_open(serve_conns *g, int fd) {
  serve_conn *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->fd = fd;
  c->phase = SERVE_CONN_HEADERS;
  c->started = dlrec_now();
  c->deadline = g->request_timeout_s ? c->started + g->request_timeout_s : 0;
  pthread_mutex_lock(&g->mu);
  c->next = g->head;
  if (g->head) g->head->prev = c;
  g->head = c;
  g->open++;
  while (g->open - g->closing > g->max) {
    serve_conn *v = victim(g, c);
    g->shed++;
    if (!v) { /* every other connection is being answered: the newcomer waits elsewhere */
      cut(g, c, 503, "server busy: every connection is being answered (--max-connections)");
      break;
    }
    DLREC_DEBUG("http: shedding a connection in phase %s, %.1f s old, for a new one", phase_name(v->phase),
                c->started - v->started);
    if (v->phase == SERVE_CONN_IDLE) cut(g, v, 0, NULL);
    else cut(g, v, 503, "connection shed: the server is at --max-connections and this request is slow");
  }
  if (g->draining && !c->closing) cut(g, c, 503, "server is shutting down");
  pthread_mutex_unlock(&g->mu);
  return c;
}

void serve_conn_closed(serve_conns *g, serve_conn *c) {
  if (!c) return;
  pthread_mutex_lock(&g->mu);
  if (c->prev) c->prev->next = c->next;
  else g->head = c->next;
  if (c->next) c->next->prev = c->prev;
  g->open--;
  if (c->closing) g->closing--;
  g->closed++;
  pthread_mutex_unlock(&g->mu);
  free(c);
}

void serve_conn_phase_set(serve_conns *g, serve_conn *c, serve_conn_phase phase) {
  if (!c) return;
  pthread_mutex_lock(&g->mu);
  double now = dlrec_now();
  switch (phase) {
  case SERVE_CONN_HEADERS:
    if (c->phase != SERVE_CONN_HEADERS) { /* a keep-alive connection's next request */
      c->started = now;
      c->deadline = g->request_timeout_s ? now + g->request_timeout_s : 0;
    }
    break;
  case SERVE_CONN_BODY: break;
  case SERVE_CONN_HANDLING: c->deadline = 0; break;
  case SERVE_CONN_IDLE:
    c->started = now;
    c->deadline = g->idle_timeout_s ? now + g->idle_timeout_s : 0;
    break;
  }
  c->phase = phase;
  if (phase == SERVE_CONN_IDLE && g->draining && !c->closing) cut(g, c, 0, NULL);
  pthread_mutex_unlock(&g->mu);
}

void serve_conns_drain_begin(serve_conns *g) {
  pthread_mutex_lock(&g->mu);
  g->draining = 1;
  for (serve_conn *c = g->head; c; c = c->next) {
    if (c->closing) continue;
    if (c->phase == SERVE_CONN_IDLE) cut(g, c, 0, NULL);
    else if (c->phase == SERVE_CONN_HEADERS) cut(g, c, 503, "server is shutting down");
  }
  pthread_mutex_unlock(&g->mu);
}

uint32_t serve_conns_in_flight(serve_conns *g) {
  pthread_mutex_lock(&g->mu);
  uint32_t n = 0;
  for (serve_conn *c = g->head; c; c = c->next)
    if (!c->closing && (c->phase == SERVE_CONN_BODY || c->phase == SERVE_CONN_HANDLING)) n++;
  pthread_mutex_unlock(&g->mu);
  return n;
}
