/* ETL fit: one streaming pass over the input that counts every categorical
 * value and gathers dense statistics, then the vocabularies (frequency
 * order, min-count threshold, hashing of oversized columns) and the state.
 *
 * The pipeline: the caller's thread reads blocks of whole lines; workers
 * parse them and count values into their own hash maps (counting commutes,
 * so the totals do not depend on which worker saw which block); the caller's
 * thread then takes each block's transformed dense values in input order,
 * so that floating-point sums, and the state, are the same for any thread
 * count and block size.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/etl_internal.h"
#include "dlrec/log.h"
#include "dlrec/pipeline.h"
#include "dlrec/progress.h"

void dlrec_etl_fit_opts_default(dlrec_etl_fit_opts *o) {
  *o = (dlrec_etl_fit_opts){
      .format = DLREC_FORMAT_CRITEO,
      .has_label = 1,
      .min_count = 1,
      .dense_transform = DLREC_DENSE_LOG,
      .max_line_bytes = DLREC_MAX_LINE_BYTES_DEFAULT,
      .progress = 1,
  };
}

typedef struct fit_worker {
  keymap maps[DLREC_MAX_SPARSE];
  uint64_t cat_missing[DLREC_MAX_SPARSE];
  dlrec_raw_row row;
  char *scratch; /* CSV unescaping, max_line_bytes + 1 */
  /* Multi-hot columns: the row's keys (grown as needed), and the most values
   * a row had in each column. */
  uint64_t *mkeys;
  size_t mcap;
  uint32_t mbegin[DLREC_MAX_SPARSE], mcount[DLREC_MAX_SPARSE];
  uint32_t max_values[DLREC_MAX_SPARSE];
} fit_worker;

typedef struct fit_job {
  dlrec_block block;
  uint32_t file;
  uint64_t bytes; /* input bytes the block stands for (progress) */
  uint64_t rows, positives;
  uint64_t cap;        /* rows t has room for */
  double *t;           /* (n_dense, cap): transformed values, NAN when missing */
  double *raw;         /* (n_dense, cap) with a median fill: the clipped raw values, NAN when missing */
  double *dmin, *dmax; /* (n_dense) of the raw values */
  uint64_t *dcount;    /* (n_dense) non-missing values */
  etl_badlist bad;
  etl_shorts shorts;
  uint64_t truncated; /* rows with a multi-hot field cut to its max hotness */
} fit_job;

/* Shifted sums of one dense column (shift = its first value), for a mean and
 * variance without the cancellation of raw sums of squares. Values are
 * within float32's range (fit_row refuses others), so a shifted square is
 * below 4.7e77 and 2^64 of them below 1e97: the sums cannot overflow. */
typedef struct dense_acc {
  int started;
  double shift, s1, s2;
  uint64_t count;
  double min, max;
} dense_acc;

typedef struct fit_ctx {
  etl_inputs in;
  const dlrec_etl_fit_opts *o;
  dlrec_columns cols;
  uint32_t nd, nc;
  int multi; /* some column is multi-hot */
  fit_worker *workers;
  int n_workers;
  uint64_t rows, positives, bad, bytes, truncated;
  etl_shorts shorts;
  dense_acc acc[DLREC_MAX_DENSE];
  /* The workflow's operators; for a median fill, the column's clipped
   * values so far (every one: the exact median needs them). */
  etl_dense_ops ops[DLREC_MAX_DENSE];
  int any_median;
  double *med[DLREC_MAX_DENSE];
  size_t med_n[DLREC_MAX_DENSE], med_cap[DLREC_MAX_DENSE];
  dlrec_progress *progress;
} fit_ctx;

static dlrec_status fit_produce(void *vctx, void *vjob, uint64_t seq) {
  fit_ctx *x = vctx;
  fit_job *j = vjob;
  (void)seq;
  return etl_inputs_next(&x->in, &j->block, &j->file, &j->bytes);
}

static dlrec_status job_reserve(fit_job *j, uint64_t rows, uint32_t nd, int raw) {
  if (rows <= j->cap) return DLREC_OK;
  uint64_t cap = rows + rows / 4 + 64;
  double *t = realloc(j->t, (size_t)(cap * nd + 1) * sizeof *t);
  if (!t) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for a block of %llu rows", (unsigned long long)rows);
  j->t = t;
  if (raw) {
    double *r = realloc(j->raw, (size_t)(cap * nd + 1) * sizeof *r);
    if (!r) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for a block of %llu rows", (unsigned long long)rows);
    j->raw = r;
  }
  j->cap = cap;
  return DLREC_OK;
}

/* The keys of a row's multi-hot fields, each up to its column's max
 * hotness, into W->mkeys (column c's at W->mbegin[c], W->mcount[c] of them);
 * *truncated is set when a field had more values. */
static __attribute__((noinline)) dlrec_status fit_multi_keys(const fit_ctx *x, fit_worker *W, const dlrec_layout *L,
                                                             const dlrec_raw_row *row, const dlrec_where *w,
                                                             int *truncated) {
  const etl_column_keys *ck = &x->in.keys;
  uint32_t nm = 0;
  for (uint32_t c = 0; c < x->nc; c++) {
    if (!x->cols.sep[c]) continue;
    const dlrec_text t = row->cat[c];
    const char *p = t.s, *end = t.s + t.n, *v, *why;
    size_t vn;
    uint32_t max = x->cols.max_hotness[c] ? x->cols.max_hotness[c] : UINT32_MAX;
    W->mbegin[c] = nm;
    while (etl_next_value(&p, end, x->cols.sep[c], &v, &vn)) {
      if (nm - W->mbegin[c] == max) {
        *truncated = 1;
        break;
      }
      if (nm == W->mcap) {
        size_t cap = W->mcap ? 2 * W->mcap : 256;
        uint64_t *k = realloc(W->mkeys, cap * sizeof *k);
        if (!k) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
        W->mkeys = k;
        W->mcap = cap;
      }
      if ((why = dlrec_cat_key(ck->kind[c], ck->salt[c], v, vn, &W->mkeys[nm])) != NULL)
        return dlrec_parse_error(w, L->cat_field[c], x->cols.cat[c], why, v, vn);
      nm++;
    }
    W->mcount[c] = nm - W->mbegin[c];
  }
  return DLREC_OK;
}

/* Parses and counts one line; nothing of a bad row is counted. */
static dlrec_status fit_row(fit_ctx *x, fit_worker *W, fit_job *j, const dlrec_layout *L, const char *s, size_t n,
                            const dlrec_where *w) {
  const etl_column_keys *ck = &x->in.keys;
  if (n > x->o->max_line_bytes) return etl_line_too_long(w, x->o->max_line_bytes);
  dlrec_status st = dlrec_parse_row(L, s, n, W->scratch, &W->row, w);
  if (st != DLREC_OK) return st;
  const dlrec_raw_row *row = &W->row;
  int is_short = etl_short_row(L, row, x->o->strict_fields, w, &st);
  if (st != DLREC_OK) return st;
  const char *why;
  float label = 0;
  if (L->has_label && (why = dlrec_parse_label(row->label.s, row->label.n, &label)) != NULL)
    return dlrec_parse_error(w, L->label_field, x->cols.label, why, row->label.s, row->label.n);
  uint64_t keys[DLREC_MAX_SPARSE], hashes[DLREC_MAX_SPARSE];
  double vals[DLREC_MAX_DENSE], tvals[DLREC_MAX_DENSE]; /* raw and transformed */
  int truncated = 0;
  for (uint32_t c = 0; c < x->nc; c++) {
    const dlrec_text t = row->cat[c];
    if (t.n == 0 || (x->multi && x->cols.sep[c])) continue;
    if ((why = dlrec_cat_key(ck->kind[c], ck->salt[c], t.s, t.n, &keys[c])) != NULL)
      return dlrec_parse_error(w, L->cat_field[c], x->cols.cat[c], why, t.s, t.n);
    hashes[c] = keymap_hash(keys[c]);
    keymap_prefetch(&W->maps[c], hashes[c]);
  }
  /* Multi-hot fields out of line: one-hot inputs (Criteo) never pay for them. */
  if (x->multi && (st = fit_multi_keys(x, W, L, row, w, &truncated)) != DLREC_OK) return st;
  for (uint32_t d = 0; d < x->nd; d++) {
    const dlrec_text t = row->dense[d];
    if (!t.n) continue;
    if ((why = dlrec_parse_number(t.s, t.n, &vals[d])) != NULL)
      return dlrec_parse_error(w, L->dense_field[d], x->cols.dense[d], why, t.s, t.n);
    vals[d] = etl_clip(&x->ops[d], vals[d]);
    tvals[d] = etl_transform(x->o->dense_transform, vals[d]);
    if (!(fabs(tvals[d]) <= FLT_MAX))
      return dlrec_parse_error(w, L->dense_field[d], x->cols.dense[d], ETL_BEYOND_FLOAT32, t.s, t.n);
  }
  /* The row is good: count it. */
  if (is_short) etl_shorts_add_line(&j->shorts, j->file, w->line);
  uint64_t r = j->rows++;
  j->positives += label != 0;
  j->truncated += truncated;
  for (uint32_t d = 0; d < x->nd; d++) {
    double *t = &j->t[d * j->cap + r];
    if (j->raw) j->raw[d * j->cap + r] = row->dense[d].n ? vals[d] : NAN;
    if (row->dense[d].n == 0) {
      *t = NAN;
      continue;
    }
    double v = vals[d];
    *t = tvals[d];
    if (v < j->dmin[d]) j->dmin[d] = v;
    if (v > j->dmax[d]) j->dmax[d] = v;
    j->dcount[d]++;
  }
  for (uint32_t c = 0; c < x->nc; c++) {
    if (x->multi && x->cols.sep[c]) {
      uint32_t n = W->mcount[c];
      if (n == 0) W->cat_missing[c]++;
      if (n > W->max_values[c]) W->max_values[c] = n;
      for (uint32_t i = 0; i < n; i++) {
        /* Raw keys: values counted, not kept (one entry per column). */
        uint64_t k = x->o->raw_keys ? 0 : W->mkeys[W->mbegin[c] + i];
        if (keymap_count(&W->maps[c], k, keymap_hash(k)) != DLREC_OK)
          return dlrec_error_context("fit: column %s: ", x->cols.cat[c]);
      }
      continue;
    }
    if (row->cat[c].n == 0) {
      W->cat_missing[c]++;
      continue;
    }
    const uint64_t key = x->o->raw_keys ? 0 : keys[c];
    if (keymap_count(&W->maps[c], key, x->o->raw_keys ? keymap_hash(0) : hashes[c]) != DLREC_OK)
      return dlrec_error_context("fit: column %s: ", x->cols.cat[c]);
  }
  return DLREC_OK;
}

static dlrec_status fit_work(void *vctx, void *vjob, int worker) {
  fit_ctx *x = vctx;
  fit_job *j = vjob;
  fit_worker *W = &x->workers[worker];
  j->rows = j->positives = j->truncated = 0;
  j->shorts = (etl_shorts){0};
  etl_badlist_clear(&j->bad);
  for (uint32_t d = 0; d < x->nd; d++) {
    j->dmin[d] = INFINITY;
    j->dmax[d] = -INFINITY;
    j->dcount[d] = 0;
  }
  dlrec_status st = job_reserve(j, j->block.lines, x->nd, x->any_median);
  if (st != DLREC_OK) return st;
  const dlrec_layout *L = x->in.layouts[j->file];
  dlrec_where w = {x->in.names[j->file], j->block.first_line};
  const char *p = j->block.data, *end = p + j->block.n;
  for (; p < end; w.line++) {
    const char *s;
    size_t n;
    etl_next_line(&p, end, &s, &n);
    st = fit_row(x, W, j, L, s, n, &w);
    if (st == DLREC_OK) continue;
    if (st != DLREC_ERR_PARSE || x->o->skip_bad_rows == 0) return st;
    st = etl_badlist_add(&j->bad, dlrec_last_error());
    if (st != DLREC_OK) return st;
    if (j->bad.n > x->o->skip_bad_rows) break; /* the run fails at the consumer */
  }
  return DLREC_OK;
}

static dlrec_status fit_consume(void *vctx, void *vjob, uint64_t seq) {
  fit_ctx *x = vctx;
  fit_job *j = vjob;
  (void)seq;
  dlrec_status st = etl_badlist_report(&j->bad, &x->bad, x->o->skip_bad_rows);
  if (st != DLREC_OK) return st;
  /* In input order: the sums below are the same for any threads and blocks. */
  for (uint32_t d = 0; d < x->nd; d++) {
    dense_acc *a = &x->acc[d];
    const double *t = j->t + d * j->cap;
    uint64_t r = 0;
    if (!a->started) {
      for (; r < j->rows && isnan(t[r]); r++) {
      }
      if (r < j->rows) {
        a->started = 1;
        a->shift = t[r];
      }
    }
    /* One running sum across blocks: partial sums per block would make the
     * rounding depend on where blocks end. */
    double shift = a->shift, s1 = a->s1, s2 = a->s2;
    for (; r < j->rows; r++) {
      double v = t[r] - shift;
      if (isnan(v)) continue;
      s1 += v;
      s2 += v * v;
    }
    a->s1 = s1;
    a->s2 = s2;
    a->count += j->dcount[d];
    if (j->dmin[d] < a->min) a->min = j->dmin[d];
    if (j->dmax[d] > a->max) a->max = j->dmax[d];
  }
  for (uint32_t d = 0; x->any_median && d < x->nd; d++) {
    if (x->ops[d].fill != ETL_FILL_MEDIAN) continue;
    const double *v = j->raw + d * j->cap;
    if (x->med_n[d] + j->rows > x->med_cap[d]) {
      size_t cap = x->med_cap[d] ? x->med_cap[d] : 1 << 16;
      while (cap < x->med_n[d] + j->rows) cap *= 2;
      double *m = realloc(x->med[d], cap * sizeof *m);
      if (!m) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for the values of %s (its median fill)",
                                 x->cols.dense[d]);
      x->med[d] = m;
      x->med_cap[d] = cap;
    }
    for (uint64_t r = 0; r < j->rows; r++)
      if (!isnan(v[r])) x->med[d][x->med_n[d]++] = v[r];
  }
  x->rows += j->rows;
  x->positives += j->positives;
  x->truncated += j->truncated;
  etl_shorts_add(&x->shorts, &j->shorts);
  x->bytes += j->bytes;
  dlrec_progress_add(x->progress, j->bytes);
  return DLREC_OK;
}

static int cmp_double(const void *pa, const void *pb) {
  const double a = *(const double *)pa, b = *(const double *)pb;
  return (a > b) - (a < b);
}

/* Reorders v[0, n) so that v[k] is the value a sort would put there, every
 * value before it <= it and every one after >= it: quickselect on a
 * median-of-three pivot (Hoare's partition), falling back to a sort of what
 * is left when the partitions shrink slowly (an adversarial order). */
static void select_kth(double *v, size_t n, size_t k) {
  size_t lo = 0, hi = n, budget = 64;
  while (hi - lo > 16) {
    if (budget-- == 0) {
      qsort(v + lo, hi - lo, sizeof *v, cmp_double);
      return;
    }
    double a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi - 1];
    double p = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
    size_t i = lo, j = hi - 1;
    for (;;) {
      while (v[i] < p) i++;
      while (v[j] > p) j--;
      if (i >= j) break;
      double t = v[i];
      v[i++] = v[j];
      v[j--] = t;
    }
    /* [lo, j] <= p <= [j + 1, hi) */
    if (k <= j) hi = j + 1;
    else lo = j + 1;
  }
  qsort(v + lo, hi - lo, sizeof *v, cmp_double);
}

/* numpy's median of n values (reordered here): the middle one, or the mean
 * of the two middle ones; 0 (and a warning) without values. */
static double median(double *v, size_t n, const char *name) {
  if (n == 0) {
    DLREC_WARN("fit: column %s has no value to take a median of: missing values are filled with 0", name);
    return 0.0;
  }
  select_kth(v, n, n / 2);
  if (n % 2) return v[n / 2];
  double below = v[0]; /* the largest of v[0, n/2), all <= v[n/2] */
  for (size_t i = 1; i < n / 2; i++)
    if (v[i] > below) below = v[i];
  return (below + v[n / 2]) / 2;
}

/* ---- vocabularies ---- */

typedef struct kc {
  uint64_t key, count;
} kc;

static int kc_order(const void *pa, const void *pb) {
  const kc *a = pa, *b = pb;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  return (a->key > b->key) - (a->key < b->key);
}

/* Sorts by count descending, then key ascending: an LSD radix sort on the
 * key bytes and then the inverted count bytes (stable passes), skipping the
 * passes where every item has the same byte (high key bytes of 8-digit hex
 * keys, high count bytes). Much faster than qsort for millions of keys. */
static void sort_kc(kc *a, uint64_t n) {
  if (n < 64) {
    qsort(a, n, sizeof *a, kc_order);
    return;
  }
  kc *tmp = malloc(n * sizeof *tmp);
  uint64_t (*hist)[256] = calloc(16, sizeof *hist);
  if (!tmp || !hist) {
    free(tmp), free(hist);
    qsort(a, n, sizeof *a, kc_order);
    return;
  }
  for (uint64_t i = 0; i < n; i++) {
    uint64_t k = a[i].key, c = ~a[i].count;
    for (int b = 0; b < 8; b++) {
      hist[b][(k >> (8 * b)) & 0xff]++;
      hist[8 + b][(c >> (8 * b)) & 0xff]++;
    }
  }
  kc *src = a, *dst = tmp;
  for (int pass = 0; pass < 16; pass++) {
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
    kc *t = src;
    src = dst;
    dst = t;
  }
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(tmp);
  free(hist);
}

typedef struct collect {
  kc *v;
  uint64_t n;
} collect;

static void collect_fn(void *ctx, uint64_t key, uint64_t val) {
  collect *c = ctx;
  c->v[c->n++] = (kc){key, val};
}

/* Builds column c's vocabulary (or bucket ranks) from its counts in m, which
 * it frees; own[0..2) receive the arrays it allocates. */
static dlrec_status finish_column(const dlrec_etl_fit_opts *o, etl_cat *c, keymap *m, void **own) {
  c->distinct = m->n;
  collect all = {malloc((m->n ? m->n : 1) * sizeof(kc)), 0};
  if (!all.v) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu keys", (unsigned long long)m->n);
  keymap_each(m, collect_fn, &all);
  keymap_free(m);
  uint64_t kept = 0;
  c->oov = 0;
  c->values = 0;
  for (uint64_t i = 0; i < all.n; i++) {
    c->values += all.v[i].count;
    if (all.v[i].count >= o->min_count) kept++;
    else c->oov += all.v[i].count;
  }
  c->kept = kept;
  if (o->hash_buckets && kept > o->hash_buckets) {
    /* Hashed: every value, rare ones too, counts toward its bucket; buckets
     * are ranked like values, so the hot ones stay a prefix of the range. */
    uint64_t nb = o->hash_buckets;
    kc *b = calloc(nb, sizeof *b);
    uint32_t *rank = malloc(nb * sizeof *rank);
    uint64_t *counts = malloc(nb * sizeof *counts);
    if (!b || !rank || !counts) {
      free(b), free(rank), free(counts), free(all.v);
      return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu buckets", (unsigned long long)nb);
    }
    for (uint64_t i = 0; i < nb; i++) b[i].key = i;
    for (uint64_t i = 0; i < all.n; i++) b[dlrec_mix64(all.v[i].key) % nb].count += all.v[i].count;
    free(all.v);
    sort_kc(b, nb);
    for (uint64_t r = 0; r < nb; r++) {
      rank[b[r].key] = (uint32_t)r;
      counts[r] = b[r].count;
    }
    free(b);
    c->hashed = 1;
    c->buckets = nb;
    c->bucket_rank = rank;
    c->bucket_counts = counts;
    c->size = ETL_LOCAL_FIRST + nb;
    own[0] = rank;
    own[1] = counts;
    return DLREC_OK;
  }
  uint64_t k = 0;
  for (uint64_t i = 0; i < all.n; i++)
    if (all.v[i].count >= o->min_count) all.v[k++] = all.v[i];
  sort_kc(all.v, kept);
  uint64_t *keys = malloc((kept ? kept : 1) * sizeof *keys), *counts = malloc((kept ? kept : 1) * sizeof *counts);
  if (!keys || !counts) {
    free(keys), free(counts), free(all.v);
    return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for %llu keys", (unsigned long long)kept);
  }
  for (uint64_t i = 0; i < kept; i++) {
    keys[i] = all.v[i].key;
    counts[i] = all.v[i].count;
  }
  free(all.v);
  c->keys = keys;
  c->counts = counts;
  c->size = ETL_LOCAL_FIRST + kept;
  own[0] = keys;
  own[1] = counts;
  return DLREC_OK;
}

/* Merges the workers' counts and builds every column, columns in parallel. */
static dlrec_status finish_columns(fit_ctx *x, dlrec_etl *e) {
  dlrec_status st = DLREC_OK;
  /* Raw keys: each column's one entry (its value count) is out of vocabulary. */
  dlrec_etl_fit_opts raw = *x->o;
  raw.min_count = UINT64_MAX;
  const dlrec_etl_fit_opts *fo = x->o->raw_keys ? &raw : x->o;
  int nt = x->n_workers;
  dlrec_error_copy *errs = calloc(x->nc ? x->nc : 1, sizeof *errs);
  dlrec_status *sts = calloc(x->nc ? x->nc : 1, sizeof *sts);
  if (!errs || !sts) {
    free(errs), free(sts);
    return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
#pragma omp parallel for schedule(dynamic) num_threads(nt)
  for (uint32_t c = 0; c < x->nc; c++) {
    etl_cat *k = &e->cat[c];
    dlrec_status s = DLREC_OK;
    k->missing = 0;
    for (int w = 0; w < x->n_workers; w++) {
      k->missing += x->workers[w].cat_missing[c];
      if (w > 0 && s == DLREC_OK) s = keymap_merge_add(&x->workers[0].maps[c], &x->workers[w].maps[c]);
      if (w > 0) keymap_free(&x->workers[w].maps[c]);
    }
    k->key_kind = x->in.keys.kind[c];
    k->salt = x->in.keys.salt[c];
    if (s == DLREC_OK) s = finish_column(fo, k, &x->workers[0].maps[c], &e->owned[2 * c]);
    if (x->o->raw_keys) k->distinct = 0; /* not counted */
    sts[c] = s;
    if (s != DLREC_OK) dlrec_error_save(&errs[c]);
  }
  e->n_owned = (int)(2 * x->nc);
  for (uint32_t c = 0; c < x->nc && st == DLREC_OK; c++)
    if (sts[c] != DLREC_OK) st = dlrec_error_restore(&errs[c]);
  free(errs);
  free(sts);
  return st;
}

/* Fills e from the counts and sums gathered by the run. */
static dlrec_status build_state(fit_ctx *x, dlrec_etl *e) {
  const dlrec_etl_fit_opts *o = x->o;
  e->format = o->format;
  e->cols = x->in.cols;
  e->min_count = o->min_count;
  e->hash_buckets = o->hash_buckets;
  e->transform = o->dense_transform;
  e->standardize = o->standardize;
  e->rows = x->rows;
  e->positives = x->positives;
  e->bad_rows = x->bad;
  e->libfm_fields = o->format == DLREC_FORMAT_LIBFM ? o->libfm_fields : 0;
  if (o->format == DLREC_FORMAT_CSV) {
    e->spec = strdup(o->schema_spec);
    e->header = x->in.header; /* handed over */
    e->n_header = x->in.n_header;
    x->in.header = NULL;
    if (!e->spec) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
  dlrec_schema *s = &e->schema;
  s->has_label = x->cols.has_label;
  strcpy(s->label_name, x->cols.label);
  s->n_dense = x->nd;
  s->n_sparse = x->nc;
  for (uint32_t d = 0; d < x->nd; d++) {
    strcpy(s->dense_names[d], x->cols.dense[d]);
    dense_acc *a = &x->acc[d];
    etl_dense *out = &e->dense[d];
    out->count = a->count;
    out->missing = x->rows - a->count;
    out->ops = x->ops[d];
    if (out->ops.fill == ETL_FILL_MEDIAN) out->ops.fill_value = median(x->med[d], x->med_n[d], x->cols.dense[d]);
    /* The filled values count in the mean and std that standardize uses. */
    const uint64_t filled = out->ops.fill ? out->missing : 0;
    if (filled) {
      double tf = etl_transform(x->o->dense_transform, etl_clip(&out->ops, out->ops.fill_value));
      if (!a->started) a->started = 1, a->shift = tf;
      a->s1 += (double)filled * (tf - a->shift);
      a->s2 += (double)filled * (tf - a->shift) * (tf - a->shift);
    }
    if (a->count + filled) {
      double n = (double)(a->count + filled), m1 = a->s1 / n;
      out->mean = a->shift + m1;
      double var = a->s2 / n - m1 * m1;
      out->std = var > 0 ? sqrt(var) : 0.0;
    }
    if (a->count) {
      out->min = a->min;
      out->max = a->max;
    }
  }
  dlrec_status st = finish_columns(x, e);
  if (st != DLREC_OK) return st;
  uint64_t next = 0;
  for (uint32_t c = 0; c < x->nc; c++) {
    dlrec_sparse_col *col = &s->sparse[c];
    strcpy(col->name, x->cols.cat[c]);
    col->hotness = col->max_hotness = 1;
    col->pooling = DLREC_POOLING_SUM;
    e->cat[c].sep = x->cols.sep[c];
    if (x->cols.sep[c]) {
      /* Multi-hot: at most the declared max, else the most fit saw (and at
       * least 1: a row without values has its missing id). A max of 1 is a
       * one-hot column that drops extra values. */
      uint32_t max = x->cols.max_hotness[c];
      for (int w = 0; !max && w < x->n_workers; w++)
        if (x->workers[w].max_values[c] > col->max_hotness) col->max_hotness = x->workers[w].max_values[c];
      if (max) col->max_hotness = max;
      col->hotness = col->max_hotness == 1 ? 1 : 0;
      col->pooling = x->cols.pooling[c];
      e->multi = 1;
    }
    e->ids_max += col->max_hotness;
    col->id_begin = e->cat[c].id_begin = next;
    next += e->cat[c].size;
    col->id_end = next;
  }
  s->table_rows = next;
  if (next > (uint64_t)UINT32_MAX + 1)
    return dlrec_error(DLREC_ERR_INVALID,
                       "fit: the columns need %llu ids, more than 2^32: raise --min-count or set --hash-buckets",
                       (unsigned long long)next);
  dlrec_status vs = dlrec_schema_validate(s, "fit");
  if (vs != DLREC_OK || !o->raw_keys) return vs;
  e->raw_keys = 1;
  etl_keys_schema(e);
  return dlrec_schema_validate(s, "fit");
}

static dlrec_status check_opts(const dlrec_etl_fit_opts *o) {
  if (o->min_count < 1) return dlrec_error(DLREC_ERR_INVALID, "--min-count must be at least 1");
  if (o->hash_buckets > UINT32_MAX - 2)
    return dlrec_error(DLREC_ERR_INVALID, "--hash-buckets must be below 2^32 - 2");
  if (o->format == DLREC_FORMAT_CSV && !o->schema_spec)
    return dlrec_error(DLREC_ERR_INVALID, "--format csv needs --schema (e.g. 'label=click;ignore=id;cat=*')");
  if (o->format != DLREC_FORMAT_CSV && o->schema_spec)
    return dlrec_error(DLREC_ERR_INVALID, "--schema is for --format csv (the columns of %s are fixed)",
                       dlrec_format_name(o->format));
  if (o->format == DLREC_FORMAT_LIBFM && (o->libfm_fields < 1 || o->libfm_fields > DLREC_MAX_SPARSE))
    return dlrec_error(DLREC_ERR_INVALID, "--format libfm needs --fields N, N in [1, %d]", DLREC_MAX_SPARSE);
  if (o->format != DLREC_FORMAT_LIBFM && o->libfm_fields)
    return dlrec_error(DLREC_ERR_INVALID, "--fields is for --format libfm");
  if (o->format != DLREC_FORMAT_LIBSVM && o->format != DLREC_FORMAT_LIBFM &&
      (o->max_hotness || o->pooling != DLREC_POOLING_SUM))
    return dlrec_error(DLREC_ERR_INVALID,
                       "--max-hotness and --pooling are for --format libsvm and libfm (CSV: multi= in --schema)");
  if (o->max_hotness > 65536) return dlrec_error(DLREC_ERR_INVALID, "--max-hotness must be in [1, 65536]");
  if (o->raw_keys && (o->hash_buckets || o->min_count > 1))
    return dlrec_error(DLREC_ERR_INVALID, "--raw-keys keeps no vocabulary: --min-count and --hash-buckets do not apply "
                                          "(a hash table admits keys: storage.admit_min_count)");
  if (o->max_line_bytes == 0 || o->max_line_bytes > (1u << 30))
    return dlrec_error(DLREC_ERR_INVALID, "--max-line-bytes must be in [1, 2^30]");
  return DLREC_OK;
}

dlrec_status dlrec_etl_fit(const char *const *inputs, int n_inputs, const char *out_dir,
                           const dlrec_etl_fit_opts *o, dlrec_etl_report *rep) {
  double t0 = dlrec_now();
  dlrec_status st = check_opts(o);
  if (st != DLREC_OK) return st;
  fit_ctx *x = calloc(1, sizeof *x);
  if (!x) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  x->o = o;
  int threads = o->threads > 0 ? o->threads : dlrec_default_threads();
  x->n_workers = threads;
  int n_jobs = 2 * threads + 2;
  fit_job *jobs = calloc((size_t)n_jobs, sizeof *jobs);
  void **slots = calloc((size_t)n_jobs, sizeof *slots);
  x->workers = calloc((size_t)threads, sizeof *x->workers);
  dlrec_etl *e = calloc(1, sizeof *e);
  if (!jobs || !slots || !x->workers || !e) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  dlrec_columns svm_cols;
  const dlrec_columns *given = NULL;
  if (st == DLREC_OK && (o->format == DLREC_FORMAT_LIBSVM || o->format == DLREC_FORMAT_LIBFM)) {
    st = dlrec_columns_svm(&svm_cols, o->format, o->libfm_fields, o->has_label, o->pooling, o->max_hotness);
    given = &svm_cols;
  }
  if (st == DLREC_OK)
    st = etl_inputs_init(&x->in, inputs, o->sources, n_inputs, o->format, o->schema_spec, given, o->has_label, o->block_bytes,
                         o->max_line_bytes);
  if (st == DLREC_OK) {
    x->cols = x->in.cols;
    x->nd = x->cols.n_dense;
    x->nc = x->cols.n_cat;
    for (uint32_t c = 0; c < x->nc; c++) x->multi |= x->cols.sep[c] != 0;
    st = etl_workflow_parse(o->workflow, &x->cols, x->ops);
    for (uint32_t d = 0; d < x->nd; d++) x->any_median |= x->ops[d].fill == ETL_FILL_MEDIAN;
  }
  for (uint32_t d = 0; d < x->nd; d++) x->acc[d] = (dense_acc){.min = INFINITY, .max = -INFINITY};
  for (int w = 0; st == DLREC_OK && w < threads; w++) {
    fit_worker *W = &x->workers[w];
    W->scratch = malloc(o->max_line_bytes + 1);
    if (!W->scratch) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    for (uint32_t c = 0; st == DLREC_OK && c < x->nc; c++) st = keymap_init(&W->maps[c], 1024);
  }
  for (int i = 0; st == DLREC_OK && i < n_jobs; i++) {
    fit_job *j = &jobs[i];
    slots[i] = j;
    j->dmin = malloc((x->nd + 1) * sizeof(double));
    j->dmax = malloc((x->nd + 1) * sizeof(double));
    j->dcount = malloc((x->nd + 1) * sizeof(uint64_t));
    if (!j->dmin || !j->dmax || !j->dcount) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
  if (st == DLREC_OK) {
    if (o->progress) x->progress = dlrec_progress_start("etl fit", x->in.total_bytes, "bytes");
    dlrec_pipeline_ops ops = {fit_produce, fit_work, fit_consume};
    st = dlrec_pipeline_run(&ops, x, slots, n_jobs, threads);
    if (x->progress) dlrec_progress_note(x->progress, "%llu rows", (unsigned long long)x->rows);
    dlrec_progress_finish(x->progress);
  }
  if (st == DLREC_OK && x->rows == 0)
    st = x->bad ? dlrec_error(DLREC_ERR_PARSE, "no rows in the input: all %llu rows were bad", (unsigned long long)x->bad)
                : dlrec_error(DLREC_ERR_PARSE, "no rows in the input (%s%s): nothing to fit", x->in.names[0],
                              n_inputs > 1 ? ", ..." : "");
  if (st == DLREC_OK) st = build_state(x, e);
  if (st == DLREC_OK) st = etl_save(e, out_dir);
  if (st == DLREC_OK && x->bad) DLREC_WARN("fit: skipped %llu bad rows in all", (unsigned long long)x->bad);
  if (st == DLREC_OK && x->truncated)
    DLREC_WARN("fit: %llu rows had more values in a multi-hot field than its max hotness; only the first were counted",
               (unsigned long long)x->truncated);
  if (rep) {
    *rep = (dlrec_etl_report){.rows = x->rows,
                              .bad_rows = x->bad,
                              .truncated_rows = x->truncated,
                              .bytes = x->bytes,
                              .seconds = dlrec_now() - t0};
    etl_shorts_report(&x->shorts, &x->in, rep);
  }
  /* Cleanup. */
  for (int w = 0; x->workers && w < threads; w++) {
    for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) keymap_free(&x->workers[w].maps[c]);
    free(x->workers[w].scratch);
    free(x->workers[w].mkeys);
  }
  for (int i = 0; jobs && i < n_jobs; i++) {
    dlrec_block_free(&jobs[i].block);
    free(jobs[i].t);
    free(jobs[i].raw);
    free(jobs[i].dmin);
    free(jobs[i].dmax);
    free(jobs[i].dcount);
    etl_badlist_free(&jobs[i].bad);
  }
  etl_inputs_free(&x->in);
  for (uint32_t d = 0; d < DLREC_MAX_DENSE; d++) free(x->med[d]);
  dlrec_etl_free(e);
  free(jobs);
  free(slots);
  free(x->workers);
  free(x);
  return st;
}
