/* etl fit's vocabularies: each column's counts, merged over the workers
 * (or, within --memory-mb, spilled to sorted runs on disk and merged
 * there), become its vocabulary in frequency order, or its hash buckets
 * ranked by frequency; a vocabulary too large to sort in memory is sorted
 * in runs into a file that vocab.bin's section is copied from. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_fit.h"
#include "core/fsutil.h"

static int kc_order(const void *pa, const void *pb) {
  const etl_kc *a = pa, *b = pb;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  return (a->key > b->key) - (a->key < b->key);
}

static int key_order(const void *pa, const void *pb) {
  const etl_kc *a = pa, *b = pb;
  return (a->key > b->key) - (a->key < b->key);
}

/* Sorts by count descending, then key ascending (or by key alone): an LSD
 * radix sort on the key bytes and then the inverted count bytes (stable
 * passes), skipping the passes where every item has the same byte (high key
 * bytes of 8-digit hex keys, high count bytes). Much faster than qsort for
 * millions of keys. */
void etl_sort_kc(etl_kc *a, uint64_t n, int by_key) {
  int (*order)(const void *, const void *) = by_key ? key_order : kc_order;
  if (n < 64) {
    qsort(a, n, sizeof *a, order);
    return;
  }
  etl_kc *tmp = malloc(n * sizeof *tmp);
  uint64_t (*hist)[256] = calloc(16, sizeof *hist);
  if (!tmp || !hist) {
    free(tmp), free(hist);
    qsort(a, n, sizeof *a, order);
    return;
  }
  for (uint64_t i = 0; i < n; i++) {
    uint64_t k = a[i].key, c = ~a[i].count;
    for (int b = 0; b < 8; b++) {
      hist[b][(k >> (8 * b)) & 0xff]++;
      hist[8 + b][(c >> (8 * b)) & 0xff]++;
    }
  }
  etl_kc *src = a, *dst = tmp;
  for (int pass = 0; pass < (by_key ? 8 : 16); pass++) {
    int shift = 8 * (pass & 7);
    uint64_t *h = hist[pass];
    int trivial = 0;
    for (int b = 0; b < 256; b++) trivial |= h[b] == n;
    if (trivial) continue;
    uint64_t sum = 0;
    for (int b = 0; b < 256; b++) {
      uint64_t t = h[b];
      h[b] = sum;
      sum += t;
    }
    for (uint64_t i = 0; i < n; i++) {
      uint64_t v = pass < 8 ? src[i].key : ~src[i].count;
      dst[h[(v >> shift) & 0xff]++] = src[i];
    }
    etl_kc *t = src;
    src = dst;
    dst = t;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(tmp);
  free(hist);
}

typedef struct collect {
  etl_kc *v;
  uint64_t n;
} collect;

static void collect_fn(void *ctx, uint64_t key, uint64_t val) {
  collect *c = ctx;
  c->v[c->n++] = (etl_kc){key, val};
}

/* A hashed column from its bucket counts b (b[i] = {i, count of bucket i}),
 * which it sorts: every value, rare ones too, counts toward its bucket;
 * buckets are ranked like values, so the hot ones stay a prefix of the
 * range. own[0..2) receive the arrays it allocates. */
static dlrec_status hash_column(etl_cat *c, etl_kc *b, uint64_t nb, void **own) {
  uint32_t *rank = malloc(nb * sizeof *rank);
  uint64_t *counts = malloc(nb * sizeof *counts);
  if (!rank || !counts) {
    free(rank), free(counts);
    return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu buckets", (unsigned long long)nb);
  }
  etl_sort_kc(b, nb, 0);
  for (uint64_t r = 0; r < nb; r++) {
    rank[b[r].key] = (uint32_t)r;
    counts[r] = b[r].count;
  }
  c->hashed = 1;
  c->buckets = nb;
  c->bucket_rank = rank;
  c->bucket_counts = counts;
  c->size = ETL_LOCAL_FIRST + nb;
  own[0] = rank;
  own[1] = counts;
  return DLREC_OK;
}

static etl_kc *new_buckets(uint64_t nb) {
  etl_kc *b = calloc(nb, sizeof *b);
  for (uint64_t i = 0; b && i < nb; i++) b[i].key = i;
  return b;
}

/* A vocabulary column from its kept values, in vocabulary order. */
static dlrec_status vocab_column(etl_cat *c, const etl_kc *v, uint64_t kept, void **own) {
  uint64_t *keys = malloc((kept ? kept : 1) * sizeof *keys), *counts = malloc((kept ? kept : 1) * sizeof *counts);
  if (!keys || !counts) {
    free(keys), free(counts);
    return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu keys", (unsigned long long)kept);
  }
  for (uint64_t i = 0; i < kept; i++) {
    keys[i] = v[i].key;
    counts[i] = v[i].count;
  }
  c->keys = keys;
  c->counts = counts;
  c->size = ETL_LOCAL_FIRST + kept;
  own[0] = keys;
  own[1] = counts;
  return DLREC_OK;
}

/* force_buckets: hash into that many buckets whatever the count of kept
 * values (a cross). */
dlrec_status etl_finish_column(uint64_t min_count, uint64_t hash_buckets, etl_cat *c, keymap *m, void **own,
                               uint64_t force_buckets) {
  c->distinct = m->n;
  collect all = {malloc((m->n ? m->n : 1) * sizeof(etl_kc)), 0};
  if (!all.v) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu keys", (unsigned long long)m->n);
  keymap_each(m, collect_fn, &all);
  keymap_free(m);
  uint64_t kept = 0;
  c->oov = 0;
  c->values = 0;
  for (uint64_t i = 0; i < all.n; i++) {
    c->values += all.v[i].count;
    if (all.v[i].count >= min_count) kept++;
    else c->oov += all.v[i].count;
  }
  c->kept = kept;
  dlrec_status st;
  if (force_buckets || (hash_buckets && kept > hash_buckets)) {
    uint64_t nb = force_buckets ? force_buckets : hash_buckets;
    etl_kc *b = new_buckets(nb);
    if (b) {
      for (uint64_t i = 0; i < all.n; i++) b[dlrec_mix64(all.v[i].key) % nb].count += all.v[i].count;
      st = hash_column(c, b, nb, own);
    } else {
      st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu buckets", (unsigned long long)nb);
    }
    free(b);
    free(all.v);
    return st;
  }
  uint64_t k = 0;
  for (uint64_t i = 0; i < all.n; i++)
    if (all.v[i].count >= min_count) all.v[k++] = all.v[i];
  etl_sort_kc(all.v, kept, 0);
  st = vocab_column(c, all.v, kept, own);
  free(all.v);
  return st;
}

/* ---- spilling (--memory-mb) ---- */

/* Writes a worker's count table of column c to a run sorted by key and
 * empties it. */
static dlrec_status spill_map(fit_ctx *x, keymap *m, uint32_t c) {
  if (m->n == 0) return DLREC_OK;
  collect all = {malloc(m->n * sizeof(etl_kc)), 0};
  if (!all.v) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory to spill %llu keys", (unsigned long long)m->n);
  keymap_each(m, collect_fn, &all);
  keymap_free(m);
  etl_sort_kc(all.v, all.n, 1);
  dlrec_status st = etl_runs_add(&x->runs[c], all.v, all.n);
  free(all.v);
  if (st == DLREC_OK) st = keymap_init(m, ETL_FIT_BUDGET_MAP);
  atomic_fetch_add(&x->spilled, all.n * sizeof(etl_kc));
  return st;
}

static uint64_t map_bytes(const keymap *m) { return (m->mask + 1) * sizeof(keymap_slot); }

/* After a block: a worker whose tables outgrow a third of its share of the
 * budget (a table doubling, or being sorted, needs three times its size)
 * writes out its biggest tables until they take half of that or less (the
 * small columns' tables stay, so they do not become runs of a few keys). */
dlrec_status etl_fit_spill_check(fit_ctx *x, fit_worker *W) {
  uint64_t bytes = 0;
  const uint64_t limit = x->budget / (uint64_t)x->n_workers / 3;
  const uint32_t n = x->nc + x->wf.n_cat;
  for (uint32_t c = 0; c < n; c++) bytes += map_bytes(&W->maps[c]);
  if (bytes <= limit) return DLREC_OK;
  while (bytes > limit / 2) {
    int big = -1; /* the biggest table with keys */
    for (uint32_t c = 0; c < n; c++)
      if (W->maps[c].n && (big < 0 || map_bytes(&W->maps[c]) > map_bytes(&W->maps[big]))) big = (int)c;
    if (big < 0) break;
    const uint64_t before = map_bytes(&W->maps[big]);
    dlrec_status st = spill_map(x, &W->maps[big], (uint32_t)big);
    if (st != DLREC_OK) return st;
    bytes = bytes - before + map_bytes(&W->maps[big]);
  }
  return DLREC_OK;
}

/* The vocabulary of a spilled column too large to sort in memory: its runs
 * (by count) merged into a file laid out as its vocab.bin section's arrays,
 * keys then counts, which etl_save copies. */
static dlrec_status vocab_to_file(fit_ctx *x, etl_cat *c, uint32_t col, etl_runs *fr, uint64_t kept) {
  char name[64];
  snprintf(name, sizeof name, "c%u.vocab", col);
  etl_runs *out = &x->vocab[col];
  dlrec_status st = etl_runs_open(out, x->spill_dir, name);
  etl_merge *m = NULL;
  if (st == DLREC_OK) st = etl_merge_open(&m, fr, 1, x->budget / 2);
  enum { CHUNK = 1 << 15 };
  uint64_t *keys = malloc(CHUNK * sizeof *keys), *counts = malloc(CHUNK * sizeof *counts), done = 0;
  if (st == DLREC_OK && (!keys || !counts)) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  while (st == DLREC_OK && done < kept) {
    uint64_t k = 0;
    etl_kc p;
    int got = 1;
    while (st == DLREC_OK && k < CHUNK && done + k < kept && (st = etl_merge_next(m, &p, &got)) == DLREC_OK && got) {
      keys[k] = p.key;
      counts[k++] = p.count;
    }
    if (st == DLREC_OK && !got) st = dlrec_error(DLREC_ERR_IO, "%s: fewer values than counted", fr->path);
    if (st == DLREC_OK) st = dlrec_pwrite_all(out->fd, keys, 8 * k, 8 * done, out->path);
    if (st == DLREC_OK) st = dlrec_pwrite_all(out->fd, counts, 8 * k, 8 * (kept + done), out->path);
    done += k;
  }
  etl_merge_close(m);
  free(keys);
  free(counts);
  c->vocab_file = out;
  c->size = ETL_LOCAL_FIRST + kept;
  return st;
}

/* Column col from its runs (every worker's table is written out first):
 * the runs merged in key order, equal keys added up, as etl_finish_column would
 * count them; the kept values sorted in memory when they fit in half the
 * budget, else in runs of their own merged into a file. */
static dlrec_status finish_spilled(fit_ctx *x, const dlrec_etl_fit_opts *o, etl_cat *c, uint32_t col, void **own,
                                   uint64_t force_buckets) {
  dlrec_status st = DLREC_OK;
  for (int w = 0; st == DLREC_OK && w < x->n_workers; w++) st = spill_map(x, &x->workers[w].maps[col], col);
  const uint64_t hb = force_buckets ? force_buckets : o->hash_buckets;
  /* A buffer and its sort's copy in half the budget. */
  const uint64_t cap = x->budget / 4 / sizeof(etl_kc) > 1024 ? x->budget / 4 / sizeof(etl_kc) : 1024;
  etl_kc *buf = malloc(cap * sizeof *buf), *b = hb ? new_buckets(hb) : NULL;
  etl_merge *m = NULL;
  etl_runs fr = {.fd = -1};
  if (st == DLREC_OK && (!buf || (hb && !b))) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  if (st == DLREC_OK) st = etl_merge_open(&m, &x->runs[col], 0, x->budget / 4);
  uint64_t n = 0, kept = 0;
  int hashed = force_buckets != 0, got = 1, have = 0;
  etl_kc cur = {0, 0}, p;
  c->distinct = c->values = c->oov = 0;
  while (st == DLREC_OK && (got || have)) {
    st = etl_merge_next(m, &p, &got);
    if (st != DLREC_OK) break;
    if (got && have && p.key == cur.key) {
      cur.count += p.count;
      continue;
    }
    if (have) { /* cur is complete */
      c->distinct++;
      c->values += cur.count;
      if (b) b[dlrec_mix64(cur.key) % hb].count += cur.count;
      if (cur.count < o->min_count) {
        c->oov += cur.count;
      } else if (++kept > o->hash_buckets && o->hash_buckets) {
        hashed = 1; /* the sorted values are of no use any more */
      } else if (!hashed) {
        buf[n++] = cur;
        if (n == cap) {
          char name[64];
          snprintf(name, sizeof name, "c%u.sort", col);
          if (!fr.open) st = etl_runs_open(&fr, x->spill_dir, name);
          etl_sort_kc(buf, n, 0);
          if (st == DLREC_OK) st = etl_runs_add(&fr, buf, n);
          n = 0;
        }
      }
    }
    cur = p;
    have = got;
  }
  etl_merge_close(m);
  c->kept = kept;
  if (st == DLREC_OK && hashed) {
    st = hash_column(c, b, hb, own);
  } else if (st == DLREC_OK && !fr.open) {
    etl_sort_kc(buf, n, 0);
    st = vocab_column(c, buf, n, own);
  } else if (st == DLREC_OK) {
    etl_sort_kc(buf, n, 0);
    st = etl_runs_add(&fr, buf, n);
    free(buf);
    buf = NULL;
    if (st == DLREC_OK) st = vocab_to_file(x, c, col, &fr, kept);
  }
  etl_runs_close(&fr);
  etl_runs_close(&x->runs[col]);
  free(buf);
  free(b);
  return st;
}

dlrec_status etl_fit_finish_columns(fit_ctx *x, dlrec_etl *e) {
  dlrec_status st = DLREC_OK;
  /* Raw keys: each column's one entry (its value count) is out of vocabulary. */
  dlrec_etl_fit_opts raw = *x->o;
  raw.min_count = UINT64_MAX;
  const dlrec_etl_fit_opts *fo = x->o->raw_keys ? &raw : x->o;
  /* Within a budget, one column at a time: each may take all of it. */
  int nt = x->budget ? 1 : x->n_workers;
  /* The input's columns and the derived ones counted by key (crosses); the
   * others' operators build them later (fit_end). */
  const uint32_t n = x->nc + x->wf.n_cat;
  dlrec_error_copy *errs = calloc(n ? n : 1, sizeof *errs);
  dlrec_status *sts = calloc(n ? n : 1, sizeof *sts);
  if (!errs || !sts) {
    free(errs), free(sts);
    return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
  /* Merging spilled columns takes a while after the pass: its own bar. */
  uint64_t spilled_cols = 0;
  for (uint32_t c = 0; c < n; c++) spilled_cols += x->runs[c].count != 0;
  dlrec_progress *bar =
      x->o->progress && spilled_cols ? dlrec_progress_start("etl fit: merging spilled runs", spilled_cols, "columns") : NULL;
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (uint32_t c = 0; c < n; c++) {
    const etl_derived *dv = c < x->nc ? NULL : &x->wf.cat[c - x->nc];
    if (dv && !(dv->type->flags & ETL_OP_COUNTS_KEYS)) continue;
    etl_cat *k = &e->cat[c];
    dlrec_status s = DLREC_OK;
    k->missing = 0;
    k->key_kind = dv ? DLREC_KEY_DEC : x->in.keys.kind[c];
    k->salt = dv ? 0 : x->in.keys.salt[c];
    for (int w = 0; w < x->n_workers; w++) k->missing += x->workers[w].cat_missing[c];
    if (x->runs[c].count) {
      s = finish_spilled(x, fo, k, c, &e->owned[2 * c], dv ? dv->buckets : 0);
      dlrec_progress_add(bar, 1);
    } else {
      for (int w = 1; w < x->n_workers; w++) {
        if (s == DLREC_OK) s = keymap_merge_add(&x->workers[0].maps[c], &x->workers[w].maps[c]);
        keymap_free(&x->workers[w].maps[c]);
      }
      if (s == DLREC_OK)
        s = etl_finish_column(fo->min_count, fo->hash_buckets, k, &x->workers[0].maps[c], &e->owned[2 * c],
                              dv ? dv->buckets : 0);
    }
    if (x->o->raw_keys) k->distinct = 0; /* not counted */
    sts[c] = s;
    if (s != DLREC_OK) dlrec_error_save(&errs[c]);
  }
  dlrec_progress_finish(bar);
  e->n_owned = (int)(2 * n);
  for (uint32_t c = 0; c < n && st == DLREC_OK; c++)
    if (sts[c] != DLREC_OK) st = dlrec_error_restore(&errs[c]);
  free(errs);
  free(sts);
  return st;
}

