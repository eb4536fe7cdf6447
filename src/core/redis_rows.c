/* Embedding rows in Redis over hiredis (core/redis_rows.h): pipelined SETs,
 * one MGET per read, every call bounded by a timeout, reconnection at most
 * once per retry interval; each row tagged with its run. */
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
#define TAIL_BYTES 12 /* after a row's floats: the run id (8), the CRC (4) */

struct dlrec_redis_rows {
  char host[256];
  int port;
  char prefix[208];
  uint32_t dim;
  dlrec_redis_run run;
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

void dlrec_redis_rows_set_run(dlrec_redis_rows *r, const dlrec_redis_run *run) { r->run = *run; }

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

static void put_le(char *dst, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) dst[i] = (char)(uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const char *src, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)(uint8_t)src[i] << (8 * i);
  return v;
}

/* The checksum a row's value ends with: CRC-32C of the key's 8 bytes and
 * the value's bytes before it (the floats, little-endian as the host's are
 * on the machines dlrec builds for, and the run id). */
static uint32_t row_crc(uint64_t key, const void *value, size_t bytes) {
  char k[8];
  put_le(k, key, 8);
  return dlrec_crc32c(dlrec_crc32c(0, k, sizeof k), value, bytes);
}

/* What a value read under key is (the format above): a row of dim floats
 * of run `run` (ROW_OK), another run's row (ROW_FOREIGN), or not a row. */
enum { ROW_OK, ROW_FOREIGN, ROW_BAD };
static int classify(uint64_t key, const char *v, size_t len, uint32_t dim, uint64_t run) {
  const size_t bytes = (size_t)dim * sizeof(float);
  if (len != bytes + TAIL_BYTES) return ROW_BAD;
  if ((uint32_t)get_le(v + bytes + 8, 4) != row_crc(key, v, bytes + 8)) return ROW_BAD;
  for (uint32_t j = 0; j < dim; j++) {
    float x;
    memcpy(&x, v + (size_t)j * sizeof x, sizeof x);
    if (!isfinite(x)) return ROW_BAD;
  }
  return get_le(v + bytes, 8) == run ? ROW_OK : ROW_FOREIGN;
}

dlrec_status dlrec_redis_rows_put(dlrec_redis_rows *r, const uint64_t *keys, const float *rows, size_t n,
                                  uint64_t step) {
  if (!r->run.id)
    return dlrec_error(DLREC_ERR_INVALID, "redis %s: rows are published with a run id (none given)", r->prefix);
  dlrec_status s = reserve(r, 1);
  if (s == DLREC_OK) s = connected(r);
  if (s != DLREC_OK) return s;
  const size_t bytes = (size_t)r->dim * sizeof(float);
  size_t sent = 0;
  for (size_t i = 0; i < n; i++, sent++) {
    char key[KEY_MAX], val[DLREC_REDIS_MAX_DIM * sizeof(float) + TAIL_BYTES];
    memcpy(val, rows + i * r->dim, bytes);
    put_le(val + bytes, r->run.id, 8);
    put_le(val + bytes + 8, row_crc(keys[i], val, bytes + 8), 4);
    const char *argv[3] = {"SET", key, val};
    size_t len[3] = {3, key_text(r, key, keys[i]), bytes + TAIL_BYTES};
    if (redisAppendCommandArgv(r->c, 3, argv, len) != REDIS_OK) return down(r, "cannot queue a SET");
  }
  if (step != UINT64_MAX) { /* the step and the run, together (MSET is atomic) */
    char skey[KEY_MAX], sval[32], rkey[KEY_MAX], rval[64];
    const char *argv[5] = {"MSET", skey, sval, rkey, rval};
    size_t len[5] = {4, (size_t)snprintf(skey, sizeof skey, "%s:step", r->prefix),
                     (size_t)snprintf(sval, sizeof sval, "%" PRIu64, step),
                     (size_t)snprintf(rkey, sizeof rkey, "%s:run", r->prefix),
                     (size_t)snprintf(rval, sizeof rval, "%016" PRIx64 " %08" PRIx32 " %" PRIu64, r->run.id,
                                      r->run.etl_crc, step)};
    if (redisAppendCommandArgv(r->c, 5, argv, len) != REDIS_OK) return down(r, "cannot queue an MSET");
    sent++;
  }
  for (size_t i = 0; i < sent; i++) {
    redisReply *rep = NULL;
    if (redisGetReply(r->c, (void **)&rep) != REDIS_OK || !rep) return down(r, r->c->errstr[0] ? r->c->errstr : "no reply");
    const int ok = rep->type == REDIS_REPLY_STATUS;
    char why[200];
    if (!ok)
      snprintf(why, sizeof why, "a write answered %s", rep->type == REDIS_REPLY_ERROR ? rep->str : "something else");
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
    if (e->type == REDIS_REPLY_NIL) continue;
    const int kind = e->type == REDIS_REPLY_STRING ? classify(keys[i], e->str, e->len, r->dim, r->run.id) : ROW_BAD;
    if (kind == ROW_OK) {
      memcpy(rows + i * r->dim, e->str, bytes);
      found[i] = 1;
      r->st.hits++;
    } else if (kind == ROW_FOREIGN) {
      r->st.foreign++; /* another run's: the caller's table answers */
    } else {
      r->st.rejected++; /* not a row of this table: the caller's table answers */
    }
  }
  freeReplyObject(rep);
  return DLREC_OK;
}

dlrec_status dlrec_redis_rows_last_publish(dlrec_redis_rows *r, dlrec_redis_publish *out, int *found) {
  *found = 0;
  memset(out, 0, sizeof *out);
  dlrec_status s = connected(r);
  if (s != DLREC_OK) return s;
  char key[KEY_MAX];
  const char *argv[2] = {"GET", key};
  size_t len[2] = {3, (size_t)snprintf(key, sizeof key, "%s:run", r->prefix)};
  redisReply *rep = redisCommandArgv(r->c, 2, argv, len);
  if (!rep) return down(r, r->c->errstr[0] ? r->c->errstr : "no reply");
  if (rep->type == REDIS_REPLY_NIL) {
    freeReplyObject(rep);
    return DLREC_OK;
  }
  /* "RUN ETL STEP": 16 and 8 hex digits, a decimal step; anything else
   * (another type of key, an error answered) is not a record. */
  char text[64] = "", tail;
  if (rep->type == REDIS_REPLY_STRING && rep->len < sizeof text) memcpy(text, rep->str, rep->len);
  freeReplyObject(rep);
  uint64_t id, step;
  uint32_t etl;
  int n1 = 0, n2 = 0;
  if (sscanf(text, "%16" SCNx64 "%n %8" SCNx32 "%n %" SCNu64 " %c", &id, &n1, &etl, &n2, &step, &tail) != 3 ||
      n1 != 16 || n2 != 25)
    return dlrec_error(DLREC_ERR_CORRUPT, "redis %s:%d: %s holds '%.40s', not \"RUN ETL STEP\"", r->host, r->port, key,
                       text);
  *out = (dlrec_redis_publish){{id, etl}, step};
  *found = 1;
  return DLREC_OK;
}
