/* Embedding rows in Redis over hiredis (core/redis_rows.h): pipelined SETs,
 * one MGET per read, every call bounded by a timeout, reconnection at most
 * once per retry interval. */
#include "core/redis_rows.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "core/crc32c.h"
#include "core/log.h"
#include "core/clock.h"

#define KEY_MAX 240

struct dlrec_redis_rows {
  char host[256];
  int port;
  char prefix[208];
  uint32_t dim;
  struct timeval timeout;
  double retry_s, last_try;
  redisContext *c;
  int said_down; /* a warning per outage, not per call */
  dlrec_redis_stats st;
  /* scratch for a call's keys: n strings of KEY_MAX bytes, argv and lengths */
  char *keys;
  const char **argv;
  size_t *argvlen;
  size_t cap;
};

dlrec_status dlrec_redis_rows_open(dlrec_redis_rows **out, const char *addr, const char *prefix, uint32_t dim,
                                   uint32_t timeout_ms, uint32_t retry_ms) {
  *out = NULL;
  const char *colon = addr ? strrchr(addr, ':') : NULL;
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : 0;
  if (!colon || colon == addr || (size_t)(colon - addr) >= 256 || !end || *end || port < 1 || port > 65535)
    return dlrec_error(DLREC_ERR_INVALID, "redis address '%s': expected HOST:PORT", addr ? addr : "");
  if (!prefix || strlen(prefix) > 200)
    return dlrec_error(DLREC_ERR_INVALID, "redis key prefix: at most 200 bytes");
  if (dim < 1 || dim > DLREC_REDIS_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "redis rows of %u floats (1 to %u)", dim, DLREC_REDIS_MAX_DIM);
  if (timeout_ms < 1 || timeout_ms > 60000)
    return dlrec_error(DLREC_ERR_INVALID, "redis timeout %u ms (1 to 60000)", timeout_ms);
  dlrec_redis_rows *r = calloc(1, sizeof *r);
  if (!r) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  memcpy(r->host, addr, (size_t)(colon - addr));
  r->port = (int)port;
  snprintf(r->prefix, sizeof r->prefix, "%s", prefix);
  r->dim = dim;
  r->timeout = (struct timeval){timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000};
  r->retry_s = retry_ms / 1000.0;
  r->last_try = -1e9;
  *out = r;
  return DLREC_OK;
}

void dlrec_redis_rows_close(dlrec_redis_rows *r) {
  if (!r) return;
  if (r->c) redisFree(r->c);
  free(r->keys);
  free(r->argv);
  free(r->argvlen);
  free(r);
}

void dlrec_redis_rows_stats(const dlrec_redis_rows *r, dlrec_redis_stats *out) { *out = r->st; }

/* The connection is lost: drop it, so that a later call reconnects. why
 * may point into the connection: it is copied first. */
static dlrec_status down(dlrec_redis_rows *r, const char *why) {
  char msg[256];
  snprintf(msg, sizeof msg, "%s", why);
  r->st.errors++;
  if (!r->said_down)
    DLREC_WARN("redis %s:%d: %s; going on without it, retrying every %.1f s", r->host, r->port, msg, r->retry_s);
  r->said_down = 1;
  if (r->c) redisFree(r->c);
  r->c = NULL;
  return dlrec_error(DLREC_ERR_IO, "redis %s:%d: %s", r->host, r->port, msg);
}

/* A live connection, made now if the retry interval allows. */
static dlrec_status connected(dlrec_redis_rows *r) {
  if (r->c) return DLREC_OK;
  const double now = dlrec_now();
  if (now - r->last_try < r->retry_s) {
    r->st.errors++;
    return dlrec_error(DLREC_ERR_IO, "redis %s:%d: down (next try in %.1f s)", r->host, r->port,
                       r->retry_s - (now - r->last_try));
  }
  r->last_try = now;
  redisContext *c = redisConnectWithTimeout(r->host, r->port, r->timeout);
  if (!c || c->err) {
    char why[200];
    snprintf(why, sizeof why, "cannot connect: %s", c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    return down(r, why);
  }
  if (redisSetTimeout(c, r->timeout) != REDIS_OK) {
    redisFree(c);
    return down(r, "cannot set the timeout");
  }
  r->c = c;
  r->st.connects++;
  if (r->said_down) DLREC_INFO("redis %s:%d: connected again", r->host, r->port);
  r->said_down = 0;
  return DLREC_OK;
}

/* Room for n keys (and one more argument) in the scratch. */
static dlrec_status reserve(dlrec_redis_rows *r, size_t n) {
  if (n + 2 <= r->cap) return DLREC_OK;
  size_t cap = n + 2 > 2 * r->cap ? n + 2 : 2 * r->cap;
  char *k = realloc(r->keys, cap * KEY_MAX);
  if (k) r->keys = k;
  const char **a = realloc(r->argv, cap * sizeof *a);
  if (a) r->argv = a;
  size_t *l = realloc(r->argvlen, cap * sizeof *l);
  if (l) r->argvlen = l;
  if (!k || !a || !l) return dlrec_error(DLREC_ERR_NOMEM, "redis: out of memory for %zu keys", n);
  r->cap = cap;
  return DLREC_OK;
}

static size_t key_text(const dlrec_redis_rows *r, char *buf, uint64_t key) {
  return (size_t)snprintf(buf, KEY_MAX, "%s:%" PRIu64, r->prefix, key);
}

/* The checksum a row's value ends with: CRC-32C of the key's 8 bytes and
 * the row's, little-endian (the host's order on the machines dlrec builds
 * for, as the floats are). */
static uint32_t row_crc(uint64_t key, const void *row, size_t bytes) {
  uint8_t k[8];
  for (int i = 0; i < 8; i++) k[i] = (uint8_t)(key >> (8 * i));
  return dlrec_crc32c(dlrec_crc32c(0, k, sizeof k), row, bytes);
}

/* Whether a value read under key is a row of dim floats (the format above). */
static int is_row(uint64_t key, const char *v, size_t len, uint32_t dim) {
  const size_t bytes = (size_t)dim * sizeof(float);
  if (len != bytes + 4) return 0;
  const uint8_t *c = (const uint8_t *)v + bytes;
  const uint32_t crc = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
  if (crc != row_crc(key, v, bytes)) return 0;
  for (uint32_t j = 0; j < dim; j++) {
    float x;
    memcpy(&x, v + (size_t)j * sizeof x, sizeof x);
    if (!isfinite(x)) return 0;
  }
  return 1;
}

dlrec_status dlrec_redis_rows_put(dlrec_redis_rows *r, const uint64_t *keys, const float *rows, size_t n,
                                  uint64_t step) {
  dlrec_status s = reserve(r, 1);
  if (s == DLREC_OK) s = connected(r);
  if (s != DLREC_OK) return s;
  const size_t bytes = (size_t)r->dim * sizeof(float);
  size_t sent = 0;
  for (size_t i = 0; i < n; i++, sent++) {
    char key[KEY_MAX], val[DLREC_REDIS_MAX_DIM * sizeof(float) + 4];
    memcpy(val, rows + i * r->dim, bytes);
    const uint32_t crc = row_crc(keys[i], val, bytes);
    for (int b = 0; b < 4; b++) val[bytes + (size_t)b] = (char)(uint8_t)(crc >> (8 * b));
    const char *argv[3] = {"SET", key, val};
    size_t len[3] = {3, key_text(r, key, keys[i]), bytes + 4};
    if (redisAppendCommandArgv(r->c, 3, argv, len) != REDIS_OK) return down(r, "cannot queue a SET");
  }
  if (step != UINT64_MAX) {
    char key[KEY_MAX], val[32];
    const char *argv[3] = {"SET", key, val};
    size_t len[3] = {3, (size_t)snprintf(key, sizeof key, "%s:step", r->prefix),
                     (size_t)snprintf(val, sizeof val, "%" PRIu64, step)};
    if (redisAppendCommandArgv(r->c, 3, argv, len) != REDIS_OK) return down(r, "cannot queue a SET");
    sent++;
  }
  for (size_t i = 0; i < sent; i++) {
    redisReply *rep = NULL;
    if (redisGetReply(r->c, (void **)&rep) != REDIS_OK || !rep) return down(r, r->c->errstr[0] ? r->c->errstr : "no reply");
    const int ok = rep->type == REDIS_REPLY_STATUS;
    char why[200];
    if (!ok) snprintf(why, sizeof why, "SET answered %s", rep->type == REDIS_REPLY_ERROR ? rep->str : "something else");
    freeReplyObject(rep);
    if (!ok) return down(r, why);
  }
  r->st.puts += n;
  return DLREC_OK;
}

dlrec_status dlrec_redis_rows_get(dlrec_redis_rows *r, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
  memset(found, 0, n);
  r->st.gets += n;
  if (n == 0) return DLREC_OK;
  dlrec_status s = reserve(r, n);
  if (s == DLREC_OK) s = connected(r);
  if (s != DLREC_OK) return s;
  r->argv[0] = "MGET";
  r->argvlen[0] = 4;
  for (size_t i = 0; i < n; i++) {
    char *k = r->keys + i * KEY_MAX;
    r->argvlen[i + 1] = key_text(r, k, keys[i]);
    r->argv[i + 1] = k;
  }
  redisReply *rep = redisCommandArgv(r->c, (int)(n + 1), r->argv, r->argvlen);
  if (!rep) return down(r, r->c->errstr[0] ? r->c->errstr : "no reply");
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n) {
    freeReplyObject(rep);
    return down(r, "MGET answered something else than one value per key");
  }
  const size_t bytes = (size_t)r->dim * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    const redisReply *e = rep->element[i];
    if (e->type == REDIS_REPLY_STRING && is_row(keys[i], e->str, e->len, r->dim)) {
      memcpy(rows + i * r->dim, e->str, bytes);
      found[i] = 1;
      r->st.hits++;
    } else if (e->type != REDIS_REPLY_NIL) {
      r->st.rejected++; /* not a row of this table: the caller's table answers */
    }
  }
  freeReplyObject(rep);
  return DLREC_OK;
}
