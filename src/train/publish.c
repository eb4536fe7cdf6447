/* Publishing trained rows to the Redis tier (publish.h). */
#include "train/publish.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/log.h"
#include "embed/store.h"

struct publisher {
  dlrec_redis_rows *client;
  uint32_t dim;
  int keys;            /* raw keys (a hash table), else ids */
  uint64_t *pending;   /* keys of rows trained since the last publish that reached Redis */
  size_t n, cap, unique; /* unique: n after the last dedupe */
  float *rows;         /* a publish's rows */
  uint32_t *offsets, *ids;
  size_t rows_cap;
  publish_stats st;
  int failing; /* the last publish failed (warned once, until one succeeds) */
};

dlrec_status publisher_create(publisher **out, const dlrec_train_config *c, const dlrec_net *net,
                              const dlrec_redis_run *run) {
  *out = NULL;
  const dlrec_store_kind kind = dlrec_store_get_kind(dlrec_net_store(net));
  if (kind == DLREC_STORE_TIERED)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "publish.redis: a tiered table's rows are not in RAM to publish; use "
                                              "storage.kind \"ram\" or \"hash\"");
  publisher *p = calloc(1, sizeof *p);
  if (!p) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  p->dim = dlrec_table_dim(dlrec_net_table_const(net));
  p->keys = kind == DLREC_STORE_HASH;
  char prefix[256];
  if (c->publish_prefix[0]) snprintf(prefix, sizeof prefix, "%s", c->publish_prefix);
  else snprintf(prefix, sizeof prefix, "dlrec:%s", c->name);
  dlrec_status s = dlrec_redis_rows_open(&p->client, c->publish_redis, prefix, p->dim, c->publish_timeout_ms, 1000);
  if (s != DLREC_OK) {
    publisher_free(p);
    return dlrec_error_context("publish.redis: ");
  }
  dlrec_redis_rows_set_run(p->client, run);
  DLREC_INFO("publishing rows to redis %s under %s as run %016" PRIx64 " (ETL state %08" PRIx32 ")", c->publish_redis,
             prefix, run->id, run->etl_crc);
  *out = p;
  return DLREC_OK;
}

void publisher_free(publisher *p) {
  if (!p) return;
  dlrec_redis_rows_close(p->client);
  free(p->pending), free(p->rows), free(p->offsets), free(p->ids);
  free(p);
}

static int cmp_u64(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* pending, sorted and each key once. */
static void dedupe(publisher *p) {
  qsort(p->pending, p->n, sizeof *p->pending, cmp_u64);
  size_t u = 0;
  for (size_t i = 0; i < p->n; i++)
    if (!u || p->pending[i] != p->pending[u - 1]) p->pending[u++] = p->pending[i];
  p->n = p->unique = u;
}

dlrec_status publisher_note(publisher *p, const dlrec_batch *b, uint32_t n_sparse) {
  size_t add = 0;
  for (uint32_t c = 0; c < n_sparse; c++) add += b->offsets[c][b->rows] - b->offsets[c][0];
  if (p->keys) add /= 2;
  /* Repeats pile up between publishes: deduped when they double the keys. */
  if (p->n + add > p->cap && p->n > 2 * p->unique + 1024) dedupe(p);
  if (p->n + add > p->cap) {
    size_t cap = (p->n + add) * 2;
    uint64_t *q = realloc(p->pending, cap * sizeof *q);
    if (!q) return dlrec_error(DLREC_ERR_NOMEM, "publish: out of memory for %zu rows", cap);
    p->pending = q;
    p->cap = cap;
  }
  for (uint32_t c = 0; c < n_sparse; c++) {
    const uint32_t *w = b->ids[c];
    for (uint32_t k = b->offsets[c][0]; k < b->offsets[c][b->rows]; k += p->keys ? 2 : 1)
      p->pending[p->n++] = p->keys ? (uint64_t)w[k] | (uint64_t)w[k + 1] << 32 : w[k];
  }
  return DLREC_OK;
}

void publisher_publish(publisher *p, const dlrec_net *net, uint64_t step) {
  dedupe(p);
  const size_t n = p->n;
  if (n > p->rows_cap) {
    free(p->rows), free(p->offsets), free(p->ids);
    p->rows = malloc(n * p->dim * sizeof *p->rows);
    p->offsets = malloc((n + 1) * sizeof *p->offsets);
    p->ids = malloc(n * sizeof *p->ids);
    p->rows_cap = p->rows && p->offsets && p->ids ? n : 0;
    if (!p->rows_cap) {
      DLREC_WARN("publish: out of memory for %zu rows; they go with the next publish", n);
      p->st.errors++;
      return;
    }
  }
  /* The rows' values now: the table's rows by id, or a hash table's rows of
   * the keys it holds (keys it let go of are not published). */
  const dlrec_table *t = dlrec_net_table_const(net);
  size_t m = 0;
  if (!p->keys) {
    for (size_t i = 0; i < n; i++) dlrec_table_get_row(t, p->pending[i], p->rows + i * p->dim);
    m = n;
  } else if (n) {
    /* One key a sample: a sample's output bag says whether its key has a row. */
    for (size_t i = 0; i <= n; i++) p->offsets[i] = (uint32_t)i;
    uint32_t *found = malloc((n + 1) * sizeof *found);
    const uint32_t *offp[1] = {p->offsets};
    const uint64_t *kp[1] = {p->pending};
    uint32_t *rop[1] = {found}, *rip[1] = {p->ids};
    const dlrec_key_batch kb = {(uint32_t)n, 1, offp, kp, NULL};
    uint64_t missing;
    if (!found || dlrec_store_lookup_keys(dlrec_net_store(net), &kb, rop, rip, &missing) != DLREC_OK) {
      free(found);
      p->st.errors++;
      return;
    }
    for (size_t i = 0; i < n; i++)
      if (found[i + 1] > found[i]) {
        p->pending[m] = p->pending[i];
        dlrec_table_get_row(t, p->ids[found[i]], p->rows + m * p->dim);
        m++;
      }
    free(found);
  }
  if (dlrec_redis_rows_put(p->client, p->pending, p->rows, m, step) != DLREC_OK) {
    p->n = p->unique = m; /* kept for the next publish */
    p->st.errors++;
    if (!p->failing)
      DLREC_WARN("publish at step %llu: %s; its %zu rows wait for the next publish (metrics.jsonl: publish.errors)",
                 (unsigned long long)step, dlrec_last_error(), m);
    p->failing = 1;
    return;
  }
  if (p->failing) DLREC_INFO("publish at step %llu: %zu rows published again", (unsigned long long)step, m);
  p->failing = 0;
  p->st.rows += m;
  p->st.publishes++;
  p->n = p->unique = 0;
}

void publisher_stats(const publisher *p, publish_stats *out) {
  *out = p->st;
  out->pending = p->n;
}

/* 64 bits of a fresh random secret (dlrec_random_secret: getrandom, else
 * /dev/urandom, else the clock, the pid and a counter mixed), never 0 (0
 * stands for "no run id"): two runs started apart get different ids. */
uint64_t publisher_new_run_id(void) {
  uint64_t secret[2];
  dlrec_random_secret(secret);
  return secret[0] ? secret[0] : 1;
}
