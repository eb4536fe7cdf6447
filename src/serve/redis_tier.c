/* The server's Redis tier (docs/serving.md, "The Redis tier"): per scoring
 * worker, an in-process cache of rows read from Redis, in front of one
 * MGET per batch for the rest; what neither has comes from the
 * checkpoint's own table (dlrec_net_predict_fetch).
 *
 * The cache holds cache_rows rows by key, each with the time it was read
 * and whether Redis had it (a row Redis lacks is remembered as absent, so
 * the table answers it without a round trip). An entry older than
 * max_age_ms is read again: a row the trainer publishes is served within
 * max_age_ms (plus one MGET) of reaching Redis. When full, the oldest
 * entry (FIFO) gives way. Redis down or slow: the MGET fails within its
 * timeout, the batch is scored from the cache and the table, nothing is
 * cached as absent, and the client retries at most once per second.
 *
 * Rows are the checkpoint's run's only: a row another run published under
 * the prefix is refused (counted as foreign; the table answers). PREFIX:run,
 * the last publish, is read when the tier is made (the first batch after a
 * load or a reload) and then at most once a second: the checkpoint's step
 * past its run's last publish is the lag (dlrec_redis_lag_steps), and a
 * publish of another run, or a lag, is logged (at most once a minute).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/log.h"
#include "core/redis_rows.h"
#include "embed/slot_index.h"
#include "serve/serve_internal.h"

#define PUBLISH_CHECK_S 1.0 /* PREFIX:run read at most this often */
#define LOG_EVERY_S 60.0     /* a warning repeated at most this often */

struct serve_redis {
  dlrec_redis_rows *client;
  char prefix[208];
  dlrec_redis_run run; /* the checkpoint's */
  uint64_t step;       /* the checkpoint's */
  uint32_t dim;
  double max_age_s;
  uint64_t cap, used, hand; /* FIFO: the next slot to reuse once full */
  slot_index index;         /* key -> slot */
  uint64_t *keys;           /* (cap) */
  double *when;             /* (cap) read at */
  uint8_t *present;         /* (cap) Redis had the row */
  float *rows;              /* (cap, dim) */
  /* the misses of a fetch */
  uint64_t *miss_keys;
  uint32_t *miss_at;
  float *miss_rows;
  uint8_t *miss_found;
  size_t miss_cap;
  serve_redis_counts counts;
  uint64_t rejected_seen, foreign_seen; /* the client's counts, as last read */
  double rejected_logged, foreign_logged; /* when they were last logged (0: never) */
  double publish_checked, publish_logged; /* when PREFIX:run was last read, and a finding about it logged */
  int publish_said;                       /* that finding (a PUB_ value) */
};

/* What PREFIX:run says, when it is worth a warning. */
enum { PUB_BAD = 1, PUB_NO_ID, PUB_NONE, PUB_FOREIGN, PUB_LAG, PUB_ETL };

/* A finding about PREFIX:run: logged when it changes, and at most once a
 * minute while it holds. */
static void publish_warn(serve_redis *t, double now, int kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void publish_warn(serve_redis *t, double now, int kind, const char *fmt, ...) {
  if (kind == t->publish_said && now - t->publish_logged < LOG_EVERY_S) return;
  t->publish_said = kind;
  t->publish_logged = now;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  DLREC_WARN("redis %s: %s", t->prefix, msg);
}

/* Reads PREFIX:run: the lag, and whose publish Redis holds. Redis down: the
 * lag stays as it was (the MGETs count the outage). */
static void check_publish(serve_redis *t, double now) {
  t->publish_checked = now;
  dlrec_redis_publish p;
  int found;
  const dlrec_status s = dlrec_redis_rows_last_publish(t->client, &p, &found);
  if (s == DLREC_ERR_IO) return;
  t->counts.lag_read = 1;
  t->counts.lag_steps = -1;
  if (s != DLREC_OK) {
    publish_warn(t, now, PUB_BAD, "%s", dlrec_last_error());
  } else if (!t->run.id) {
    publish_warn(t, now, PUB_NO_ID,
                 "the checkpoint (step %llu) has no run id: its run never published to Redis, so every row under the "
                 "prefix is another run's and the table answers for it", (unsigned long long)t->step);
  } else if (!found) {
    publish_warn(t, now, PUB_NONE, "no publish yet (%s:run is absent): the table answers for the rows Redis lacks",
                 t->prefix);
  } else if (p.run.id != t->run.id) {
    publish_warn(t, now, PUB_FOREIGN,
                 "the last publish is run %016" PRIx64 "'s (ETL state %08" PRIx32 ", step %llu), not run %016" PRIx64
                 "'s, the checkpoint's: another run's rows are refused and the table answers for them "
                 "(dlrec_redis_foreign_total)", p.run.id, p.run.etl_crc, (unsigned long long)p.step, t->run.id);
  } else {
    t->counts.lag_steps = p.step >= t->step ? 0 : (int64_t)(t->step - p.step);
    if (t->counts.lag_steps > 0)
      publish_warn(t, now, PUB_LAG,
                   "the run's last publish is step %llu, %lld steps behind the served checkpoint (step %llu): rows "
                   "Redis holds may be older than the checkpoint's (dlrec_redis_lag_steps)",
                   (unsigned long long)p.step, (long long)t->counts.lag_steps, (unsigned long long)t->step);
    else if (p.run.etl_crc != t->run.etl_crc)
      publish_warn(t, now, PUB_ETL, "the run published with ETL state %08" PRIx32 ", the checkpoint holds %08" PRIx32
                   " (a resume with another --etl of the same encoding)", p.run.etl_crc, t->run.etl_crc);
    else
      t->publish_said = 0; /* all well: the next finding is logged at once */
  }
}

dlrec_status serve_redis_create(serve_redis **out, const serve_redis_opts *o, const dlrec_model *m) {
  *out = NULL;
  serve_redis *t = calloc(1, sizeof *t);
  if (!t) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  const uint32_t dim = dlrec_table_dim(dlrec_net_table_const(m->net));
  t->dim = dim;
  t->max_age_s = o->max_age_ms / 1000.0;
  t->cap = o->cache_rows;
  /* The rows' prefix: the option's, else dlrec:NAME (the trainer's default). */
  if (o->prefix && *o->prefix) snprintf(t->prefix, sizeof t->prefix, "%s", o->prefix);
  else snprintf(t->prefix, sizeof t->prefix, "dlrec:%s", m->config.name);
  t->run = (dlrec_redis_run){m->progress.run_id, dlrec_etl_state_crc(m->etl)};
  t->step = m->progress.step;
  dlrec_status s = dlrec_redis_rows_open(&t->client, o->addr, t->prefix, dim, o->timeout_ms, 1000);
  if (s == DLREC_OK) dlrec_redis_rows_set_run(t->client, &t->run);
  if (s == DLREC_OK && t->cap) {
    s = slot_index_init(&t->index, t->cap, "redis cache");
    t->keys = malloc(t->cap * sizeof *t->keys);
    t->when = malloc(t->cap * sizeof *t->when);
    t->present = malloc(t->cap);
    t->rows = malloc(t->cap * dim * sizeof *t->rows);
    if (s == DLREC_OK && (!t->keys || !t->when || !t->present || !t->rows))
      s = dlrec_error(DLREC_ERR_NOMEM, "out of memory for a Redis cache of %llu rows", (unsigned long long)t->cap);
  }
  if (s != DLREC_OK) {
    serve_redis_free(t);
    return s;
  }
  check_publish(t, dlrec_now());
  *out = t;
  return DLREC_OK;
}

void serve_redis_free(serve_redis *t) {
  if (!t) return;
  dlrec_redis_rows_close(t->client);
  if (t->cap) slot_index_free(&t->index);
  free(t->keys), free(t->when), free(t->present), free(t->rows);
  free(t->miss_keys), free(t->miss_at), free(t->miss_rows), free(t->miss_found);
  free(t);
}

void serve_redis_take_counts(serve_redis *t, serve_redis_counts *out) {
  *out = t->counts;
  memset(&t->counts, 0, sizeof t->counts);
}

/* Remembers key's row (NULL: Redis has none) as read at now. */
static void remember(serve_redis *t, uint64_t key, const float *row, double now) {
  if (!t->cap) return;
  uint32_t slot = slot_index_find(&t->index, key);
  if (slot == SLOT_INDEX_NONE) {
    if (t->used < t->cap) {
      slot = (uint32_t)t->used++;
    } else {
      slot = (uint32_t)t->hand;
      t->hand = t->hand + 1 == t->cap ? 0 : t->hand + 1;
      slot_index_remove(&t->index, t->keys[slot]);
    }
    slot_index_insert(&t->index, key, slot);
    t->keys[slot] = key;
  }
  t->when[slot] = now;
  t->present[slot] = row != NULL;
  if (row) memcpy(t->rows + (size_t)slot * t->dim, row, t->dim * sizeof(float));
}

static dlrec_status reserve_misses(serve_redis *t, size_t n) {
  if (n <= t->miss_cap) return DLREC_OK;
  free(t->miss_keys), free(t->miss_at), free(t->miss_rows), free(t->miss_found);
  t->miss_keys = malloc(n * sizeof *t->miss_keys);
  t->miss_at = malloc(n * sizeof *t->miss_at);
  t->miss_rows = malloc(n * t->dim * sizeof *t->miss_rows);
  t->miss_found = malloc(n);
  t->miss_cap = 0;
  if (!t->miss_keys || !t->miss_at || !t->miss_rows || !t->miss_found)
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory for %zu rows", n);
  t->miss_cap = n;
  return DLREC_OK;
}

/* Values Redis held under a row's key that were not a row (another table's,
 * another tool's, not finite) or were another run's row: counted, and each
 * logged at most once a minute. */
static void note_refused(serve_redis *t, double now) {
  dlrec_redis_stats st;
  dlrec_redis_rows_stats(t->client, &st);
  const uint64_t rejected = st.rejected - t->rejected_seen, foreign = st.foreign - t->foreign_seen;
  t->rejected_seen = st.rejected;
  t->foreign_seen = st.foreign;
  t->counts.rejected += rejected;
  t->counts.foreign += foreign;
  if (rejected && (t->rejected_logged == 0 || now - t->rejected_logged >= LOG_EVERY_S)) {
    t->rejected_logged = now;
    DLREC_WARN("redis %s: %llu values under rows' keys were not rows of this table (size, checksum or a value not "
               "finite); the table answered for them (dlrec_redis_rejected_total counts them all)", t->prefix,
               (unsigned long long)rejected);
  }
  if (foreign && (t->foreign_logged == 0 || now - t->foreign_logged >= LOG_EVERY_S)) {
    t->foreign_logged = now;
    DLREC_WARN("redis %s: %llu rows were another run's, not run %016" PRIx64 "'s (the served checkpoint's); the "
               "table answered for them (dlrec_redis_foreign_total counts them all)", t->prefix,
               (unsigned long long)foreign, t->run.id);
  }
}

dlrec_status serve_redis_fetch(void *ctx, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
  serve_redis *t = ctx;
  const double now = dlrec_now();
  if (now - t->publish_checked >= PUBLISH_CHECK_S) check_publish(t, now);
  dlrec_status s = reserve_misses(t, n);
  if (s != DLREC_OK) return s;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    const uint32_t slot = t->cap ? slot_index_find(&t->index, keys[i]) : SLOT_INDEX_NONE;
    if (slot != SLOT_INDEX_NONE && now - t->when[slot] <= t->max_age_s) {
      found[i] = t->present[slot];
      if (found[i]) {
        memcpy(rows + i * t->dim, t->rows + (size_t)slot * t->dim, t->dim * sizeof(float));
        t->counts.cache++;
      } else {
        t->counts.table++;
      }
      continue;
    }
    t->miss_keys[m] = keys[i];
    t->miss_at[m++] = (uint32_t)i;
  }
  if (!m) return DLREC_OK;
  /* Redis down or slow: the table answers the misses, and nothing is
   * remembered (an absent row would hide the real one once Redis is back). */
  if (dlrec_redis_rows_get(t->client, t->miss_keys, m, t->miss_rows, t->miss_found) != DLREC_OK) {
    for (size_t j = 0; j < m; j++) found[t->miss_at[j]] = 0;
    t->counts.table += m;
    t->counts.errors++;
    return DLREC_OK;
  }
  note_refused(t, now);
  for (size_t j = 0; j < m; j++) {
    const size_t i = t->miss_at[j];
    const float *row = t->miss_found[j] ? t->miss_rows + j * t->dim : NULL;
    found[i] = row != NULL;
    if (row) memcpy(rows + i * t->dim, row, t->dim * sizeof(float));
    if (row) t->counts.redis++;
    else t->counts.table++;
    remember(t, t->miss_keys[j], row, now);
  }
  return DLREC_OK;
}
