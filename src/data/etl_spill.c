/* Sorted runs on disk, for `etl fit --memory-mb`: count tables that outgrow
 * their share of the budget are written out as runs of (key, count) pairs
 * sorted by key, and a column's runs are merged back in key order when the
 * pass ends; a vocabulary too large to sort in memory is sorted the same way,
 * in runs ordered by (count desc, key asc), merged into a file that holds
 * the column's vocab.bin section (keys, then counts).
 *
 * Each etl_runs is one file of runs appended by any thread (offsets are
 * reserved atomically, the run list under a mutex). A merge reads every
 * run through a buffer of its own and picks the least head from a binary
 * heap. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/etl_internal.h"
#include "core/fsutil.h"

dlrec_status etl_runs_open(etl_runs *r, const char *dir, const char *name) {
  memset(r, 0, sizeof *r);
  r->fd = -1;
  if (snprintf(r->path, sizeof r->path, "%s/%s", dir, name) >= (int)sizeof r->path)
    return dlrec_error(DLREC_ERR_INVALID, "%s: spill path too long", dir);
  r->fd = open(r->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (r->fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", r->path, strerror(errno));
  pthread_mutex_init(&r->mu, NULL);
  r->open = 1;
  return DLREC_OK;
}

void etl_runs_close(etl_runs *r) {
  if (!r->open) return;
  close(r->fd);
  unlink(r->path);
  pthread_mutex_destroy(&r->mu);
  free(r->off);
  free(r->n);
  memset(r, 0, sizeof *r);
  r->fd = -1;
}

dlrec_status etl_runs_add(etl_runs *r, const etl_kc *pairs, uint64_t n) {
  if (n == 0) return DLREC_OK;
  const uint64_t bytes = n * sizeof *pairs, off = atomic_fetch_add(&r->end, bytes);
  dlrec_status st = dlrec_pwrite_all(r->fd, pairs, bytes, off, r->path);
  if (st != DLREC_OK) return st;
  pthread_mutex_lock(&r->mu);
  if (r->count == r->cap) {
    uint32_t cap = r->cap ? 2 * r->cap : 16;
    uint64_t *o = realloc(r->off, cap * sizeof *o), *c = o ? realloc(r->n, cap * sizeof *c) : NULL;
    if (o) r->off = o;
    if (c) r->n = c;
    if (!o || !c) {
      pthread_mutex_unlock(&r->mu);
      return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory for the list of runs", r->path);
    }
    r->cap = cap;
  }
  r->off[r->count] = off;
  r->n[r->count++] = n;
  pthread_mutex_unlock(&r->mu);
  return DLREC_OK;
}

/* ---- merging ---- */

typedef struct cursor {
  uint64_t next, left; /* file offset of the next unread pair, pairs not yet read */
  etl_kc *buf;
  uint32_t at, have;
} cursor;

struct etl_merge {
  const etl_runs *r;
  int by_count;
  uint32_t buf_pairs;
  cursor *c;
  uint32_t *heap, n_heap;
};

static int before(const etl_merge *m, const etl_kc *a, const etl_kc *b) {
  if (m->by_count && a->count != b->count) return a->count > b->count;
  return a->key < b->key;
}

static const etl_kc *head(const etl_merge *m, uint32_t i) { return &m->c[i].buf[m->c[i].at]; }

static void sift_down(etl_merge *m, uint32_t i) {
  for (;;) {
    uint32_t l = 2 * i + 1, r = l + 1, best = i;
    if (l < m->n_heap && before(m, head(m, m->heap[l]), head(m, m->heap[best]))) best = l;
    if (r < m->n_heap && before(m, head(m, m->heap[r]), head(m, m->heap[best]))) best = r;
    if (best == i) return;
    uint32_t t = m->heap[i];
    m->heap[i] = m->heap[best];
    m->heap[best] = t;
    i = best;
  }
}

/* Refills cursor i's buffer; 0 when the run is done. */
static dlrec_status refill(etl_merge *m, uint32_t i, int *more) {
  cursor *c = &m->c[i];
  *more = 0;
  if (c->left == 0) return DLREC_OK;
  uint32_t k = c->left < m->buf_pairs ? (uint32_t)c->left : m->buf_pairs;
  dlrec_status st = dlrec_pread_all(m->r->fd, c->buf, k * sizeof *c->buf, c->next, m->r->path);
  if (st != DLREC_OK) return st;
  c->next += k * sizeof *c->buf;
  c->left -= k;
  c->at = 0;
  c->have = k;
  *more = 1;
  return DLREC_OK;
}

dlrec_status etl_merge_open(etl_merge **out, const etl_runs *r, int by_count, uint64_t memory) {
  *out = NULL;
  etl_merge *m = calloc(1, sizeof *m);
  uint32_t n = r->count;
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  m->r = r;
  m->by_count = by_count;
  /* The buffers share the memory, 256 pairs (4 KiB) each at least. */
  uint64_t per = memory / sizeof(etl_kc) / (n ? n : 1);
  m->buf_pairs = per < 256 ? 256 : per > 65536 ? 65536 : (uint32_t)per;
  m->c = calloc(n ? n : 1, sizeof *m->c);
  m->heap = calloc(n ? n : 1, sizeof *m->heap);
  dlrec_status st = m->c && m->heap ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  for (uint32_t i = 0; st == DLREC_OK && i < n; i++) {
    m->c[i] = (cursor){.next = r->off[i], .left = r->n[i]};
    m->c[i].buf = malloc(m->buf_pairs * sizeof(etl_kc));
    int more = 0;
    if (!m->c[i].buf) st = dlrec_error(DLREC_ERR_NOMEM, "out of memory for the merge of %u runs", n);
    if (st == DLREC_OK) st = refill(m, i, &more);
    if (st == DLREC_OK && more) m->heap[m->n_heap++] = i;
  }
  for (uint32_t i = m->n_heap; st == DLREC_OK && i-- > 0;) sift_down(m, i);
  if (st != DLREC_OK) {
    etl_merge_close(m);
    return st;
  }
  *out = m;
  return DLREC_OK;
}

dlrec_status etl_merge_next(etl_merge *m, etl_kc *out, int *got) {
  *got = 0;
  if (m->n_heap == 0) return DLREC_OK;
  const uint32_t i = m->heap[0];
  cursor *c = &m->c[i];
  *out = c->buf[c->at++];
  *got = 1;
  if (c->at == c->have) {
    int more;
    dlrec_status st = refill(m, i, &more);
    if (st != DLREC_OK) return st;
    if (!more) m->heap[0] = m->heap[--m->n_heap];
  }
  if (m->n_heap) sift_down(m, 0);
  return DLREC_OK;
}

void etl_merge_close(etl_merge *m) {
  if (!m) return;
  for (uint32_t i = 0; m->c && i < m->r->count; i++) free(m->c[i].buf);
  free(m->c);
  free(m->heap);
  free(m);
}
