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
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/etl_internal.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/pipeline.h"
#include "core/clock.h"
#include "core/progress.h"

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

/* A target encoding's counts in one worker: per key, per fold the rows and
 * positives (st, 2 * folds values a key); the missing field's apart (a key
 * may be any 64-bit value). */
typedef struct te_acc {
  keymap map; /* key -> its index in st */
  uint64_t *st;
  uint64_t n, cap;
  uint64_t miss[2 * ETL_FOLDS_MAX];
} te_acc;

/* Within --memory-mb (docs/etl.md, Memory): the most blocks in flight, and
 * the keys an empty count table starts with (small: every worker has one per
 * column, and the big ones grow anyway). */
#define ETL_FIT_BUDGET_JOBS 8
#define ETL_FIT_BUDGET_MAP 32

typedef struct fit_worker {
  keymap maps[DLREC_MAX_SPARSE]; /* the input's columns, then the crosses */
  uint64_t cat_missing[DLREC_MAX_SPARSE];
  te_acc te[DLREC_MAX_DENSE]; /* the derived dense columns' (targets only) */
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
  double *raw;         /* (n_dense, cap) when some column's values are held: the clipped raw values,
                          NAN when missing */
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
  /* The workflow; for a median fill or a bucketized column, the column's
   * clipped values so far (every one: an exact median or quantile needs
   * them). */
  etl_workflow wf;
  int any_held, held[DLREC_MAX_DENSE];
  double *med[DLREC_MAX_DENSE];
  size_t med_n[DLREC_MAX_DENSE], med_cap[DLREC_MAX_DENSE];
  dlrec_progress *progress;
  /* --memory-mb: the budget of the count tables (0: none), the runs they
   * spill to (per column, in spill_dir), and vocabularies sorted on disk. */
  uint64_t budget;
  char spill_dir[4096];
  int made_spill_dir;
  etl_runs runs[DLREC_MAX_SPARSE], vocab[DLREC_MAX_SPARSE];
  _Atomic uint64_t spilled; /* bytes of runs written */
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

/* The counts of key (2 * folds values, zero when new); NULL when out of memory. */
static uint64_t *te_slot(te_acc *a, uint32_t folds, uint64_t key, uint64_t hash) {
  int added;
  uint64_t *v = keymap_upsert_h(&a->map, key, hash, &added);
  if (!v) return NULL;
  if (added) {
    if (a->n == a->cap) {
      uint64_t cap = a->cap ? 2 * a->cap : 1024;
      uint64_t *st = realloc(a->st, cap * 2 * folds * sizeof *st);
      if (!st) return NULL;
      a->st = st;
      a->cap = cap;
    }
    memset(a->st + a->n * 2 * folds, 0, 2 * folds * sizeof *a->st);
    *v = a->n++;
  }
  return a->st + *v * 2 * folds;
}

static dlrec_status te_add(te_acc *a, uint32_t folds, uint64_t key, uint64_t hash, uint32_t fold, int positive) {
  uint64_t *st = te_slot(a, folds, key, hash);
  if (!st) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for a target encoding's counts");
  st[2 * fold]++;
  st[2 * fold + 1] += (uint64_t)positive;
  return DLREC_OK;
}

/* Counts a good row's crosses and target encodings (bucketized columns are
 * counted from the held values when the pass ends). */
static __attribute__((noinline)) dlrec_status fit_derived(fit_ctx *x, fit_worker *W, const fit_job *j,
                                                          const dlrec_raw_row *row, const uint64_t *keys,
                                                          const uint64_t *hashes, int positive, uint64_t line) {
  for (uint32_t i = 0; i < x->wf.n_cat; i++) {
    const etl_derived *dv = &x->wf.cat[i];
    if (dv->op != ETL_OP_CROSS) continue;
    uint64_t ks[ETL_CROSS_MAX];
    int any = 0;
    for (uint32_t k = 0; k < dv->n_src; k++) {
      const uint32_t c = dv->src[k];
      any |= row->cat[c].n != 0;
      ks[k] = row->cat[c].n ? keys[c] : DLREC_ETL_MISSING_KEY;
    }
    if (!any) {
      W->cat_missing[x->nc + i]++;
      continue;
    }
    const uint64_t h = etl_cross_key(ks, dv->n_src);
    if (keymap_count(&W->maps[x->nc + i], h, keymap_hash(h)) != DLREC_OK)
      return dlrec_error_context("fit: column %s: ", x->wf.cat_names[i]);
  }
  for (uint32_t i = 0; i < x->wf.n_dense; i++) {
    const etl_derived *dv = &x->wf.dense[i];
    if (dv->op != ETL_OP_TARGET) continue;
    const uint32_t c = dv->src[0], fold = etl_fold(dv->seed, dv->folds, j->file, line);
    if (row->cat[c].n == 0) {
      W->te[i].miss[2 * fold]++;
      W->te[i].miss[2 * fold + 1] += (uint64_t)positive;
      continue;
    }
    if (te_add(&W->te[i], dv->folds, keys[c], hashes[c], fold, positive) != DLREC_OK)
      return dlrec_error_context("fit: column %s: ", x->wf.dense_names[i]);
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
    vals[d] = etl_clip(&x->wf.ops[d], vals[d]);
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
  return x->wf.n_dense + x->wf.n_cat ? fit_derived(x, W, j, row, keys, hashes, label != 0, w->line) : DLREC_OK;
}

static dlrec_status maybe_spill(fit_ctx *x, fit_worker *W);

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
  dlrec_status st = job_reserve(j, j->block.lines, x->nd, x->any_held);
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
  return x->budget ? maybe_spill(x, W) : DLREC_OK;
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
  for (uint32_t d = 0; x->any_held && d < x->nd; d++) {
    if (!x->held[d]) continue;
    const double *v = j->raw + d * j->cap;
    if (x->med_n[d] + j->rows > x->med_cap[d]) {
      size_t cap = x->med_cap[d] ? x->med_cap[d] : 1 << 16;
      while (cap < x->med_n[d] + j->rows) cap *= 2;
      double *m = realloc(x->med[d], cap * sizeof *m);
      if (!m) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for the values of %s (a median or buckets)",
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

/* Builds column c's vocabulary (or bucket ranks) from its counts in m, which
 * it frees; own[0..2) receive the arrays it allocates. force_buckets: hash
 * into that many buckets whatever the count of kept values (a cross). */
static dlrec_status finish_column(const dlrec_etl_fit_opts *o, etl_cat *c, keymap *m, void **own,
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
    if (all.v[i].count >= o->min_count) kept++;
    else c->oov += all.v[i].count;
  }
  c->kept = kept;
  dlrec_status st;
  if (force_buckets || (o->hash_buckets && kept > o->hash_buckets)) {
    uint64_t nb = force_buckets ? force_buckets : o->hash_buckets;
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
    if (all.v[i].count >= o->min_count) all.v[k++] = all.v[i];
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
static dlrec_status maybe_spill(fit_ctx *x, fit_worker *W) {
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
 * the runs merged in key order, equal keys added up, as finish_column would
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

/* Merges the workers' counts and builds every column, columns in parallel. */
static dlrec_status finish_columns(fit_ctx *x, dlrec_etl *e) {
  dlrec_status st = DLREC_OK;
  /* Raw keys: each column's one entry (its value count) is out of vocabulary. */
  dlrec_etl_fit_opts raw = *x->o;
  raw.min_count = UINT64_MAX;
  const dlrec_etl_fit_opts *fo = x->o->raw_keys ? &raw : x->o;
  /* Within a budget, one column at a time: each may take all of it. */
  int nt = x->budget ? 1 : x->n_workers;
  /* The input's columns and the crosses (bucketized columns come later). */
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
    if (dv && dv->op != ETL_OP_CROSS) continue;
    etl_cat *k = &e->cat[c];
    dlrec_status s = DLREC_OK;
    k->missing = 0;
    k->key_kind = dv ? DLREC_KEY_DEC : x->in.keys.kind[c];
    k->salt = dv ? 0 : x->in.keys.salt[c];
    for (int w = 0; w < x->n_workers; w++) k->missing += x->workers[w].cat_missing[c];
    if (x->runs[c].count) {
      s = finish_spilled(x, fo, k, c, &e->owned[2 * c], dv ? dv->groups : 0);
      dlrec_progress_add(bar, 1);
    } else {
      for (int w = 1; w < x->n_workers; w++) {
        if (s == DLREC_OK) s = keymap_merge_add(&x->workers[0].maps[c], &x->workers[w].maps[c]);
        keymap_free(&x->workers[w].maps[c]);
      }
      if (s == DLREC_OK) s = finish_column(fo, k, &x->workers[0].maps[c], &e->owned[2 * c], dv ? dv->groups : 0);
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

/* ---- derived columns ---- */

/* numpy.quantile(v, q) of sorted v[0, n), n > 0, by numpy's own arithmetic
 * (method "linear": the virtual index n q + (1 - q) - 1, and its _lerp), so
 * that fitted boundaries are numpy's to the bit. */
static double quantile_sorted(const double *v, size_t n, double q) {
  const double virt = (double)n * q + (1.0 + q * -1.0) - 1.0;
  double prev = floor(virt);
  const double gamma = virt - prev;
  if (prev < 0) prev = 0;
  size_t lo = prev > (double)(n - 1) ? n - 1 : (size_t)prev, hi = lo + 1 > n - 1 ? n - 1 : lo + 1;
  const double a = v[lo], b = v[hi], diff = b - a;
  return gamma >= 0.5 ? b - diff * (1 - gamma) : a + diff * gamma;
}

/* Derived categorical column i, a bucketized dense column: its boundaries
 * (fitted from the held values for quantiles) and its vocabulary of bucket
 * numbers. */
static dlrec_status build_bucketize(fit_ctx *x, dlrec_etl *e, uint32_t i) {
  etl_derived *dv = &x->wf.cat[i];
  const uint32_t d = dv->src[0], col = x->nc + i;
  double *v = x->med[d];
  const size_t n = x->med_n[d];
  if (dv->quantiles) {
    qsort(v, n, sizeof *v, cmp_double);
    dv->bounds = malloc(dv->quantiles * sizeof *dv->bounds);
    if (!dv->bounds) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    dv->n_bounds = 0;
    if (n == 0)
      DLREC_WARN("fit: column %s has no value to fit quantiles of: %s has one bucket", x->cols.dense[d],
                 x->wf.cat_names[i]);
    for (uint32_t k = 1; n && k < dv->quantiles; k++) {
      double b = quantile_sorted(v, n, (double)k / dv->quantiles);
      if (dv->n_bounds == 0 || b > dv->bounds[dv->n_bounds - 1]) dv->bounds[dv->n_bounds++] = b;
    }
  }
  keymap m;
  dlrec_status st = keymap_init(&m, dv->n_bounds + 1);
  for (size_t r = 0; st == DLREC_OK && r < n; r++) {
    const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, v[r]);
    st = keymap_count(&m, b, keymap_hash(b));
  }
  /* The filled rows fall into the fill's bucket. */
  const etl_dense_ops *ops = &e->dense[d].ops;
  uint64_t missing = x->rows - n;
  if (st == DLREC_OK && ops->fill && missing) {
    const uint64_t b = etl_bucket(dv->bounds, dv->n_bounds, etl_clip(ops, ops->fill_value));
    int added;
    uint64_t *c = keymap_upsert_h(&m, b, keymap_hash(b), &added);
    if (c) *c += missing;
    else st = DLREC_ERR_NOMEM;
    missing = 0;
  }
  etl_cat *k = &e->cat[col];
  k->missing = missing;
  k->key_kind = DLREC_KEY_DEC;
  dlrec_etl_fit_opts every = *x->o;
  every.min_count = 1;
  every.hash_buckets = 0;
  if (st == DLREC_OK) return finish_column(&every, k, &m, &e->owned[2 * col], 0);
  keymap_free(&m);
  return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for the buckets of %s", x->wf.cat_names[i]);
}

/* Statistics of a derived dense column whose value is xv[g] on w[g] of fit's
 * rows (groups of equal value): in group order, so deterministic. */
static void group_stats(etl_dense *out, const double *xv, const uint64_t *w, uint64_t groups, uint64_t rows) {
  double sum = 0, var = 0, lo = INFINITY, hi = -INFINITY;
  for (uint64_t g = 0; g < groups; g++) {
    if (!w[g]) continue;
    sum += (double)w[g] * etl_transform(out->transform, xv[g]);
    if (xv[g] < lo) lo = xv[g];
    if (xv[g] > hi) hi = xv[g];
  }
  const double mean = sum / (double)rows;
  for (uint64_t g = 0; g < groups; g++) {
    const double dt = etl_transform(out->transform, xv[g]) - mean;
    if (w[g]) var += (double)w[g] * dt * dt;
  }
  out->count = rows;
  out->missing = 0;
  out->min = lo;
  out->max = hi;
  out->mean = mean;
  out->std = sqrt(var / (double)rows);
}

typedef struct te_merge {
  te_acc *dst;
  const te_acc *src;
  uint32_t folds;
  dlrec_status st;
} te_merge;

static void te_merge_fn(void *ctx, uint64_t key, uint64_t idx) {
  te_merge *m = ctx;
  if (m->st != DLREC_OK) return;
  const uint64_t *from = m->src->st + idx * 2 * m->folds;
  uint64_t *to = te_slot(m->dst, m->folds, key, keymap_hash(key));
  if (!to) {
    m->st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for a target encoding's counts");
    return;
  }
  for (uint32_t f = 0; f < 2 * m->folds; f++) to[f] += from[f];
}

typedef struct te_spread {
  const etl_cat *c;
  const te_acc *a;
  uint64_t *stats;
  uint32_t folds;
} te_spread;

/* A key's counts onto its group, the source column's local id. */
static void te_spread_fn(void *ctx, uint64_t key, uint64_t idx) {
  te_spread *t = ctx;
  const uint64_t g = etl_cat_local(t->c, key, keymap_hash(key)), n = t->c->size;
  for (uint32_t f = 0; f < t->folds; f++) {
    t->stats[2 * (f * n + g)] += t->a->st[idx * 2 * t->folds + 2 * f];
    t->stats[2 * (f * n + g) + 1] += t->a->st[idx * 2 * t->folds + 2 * f + 1];
  }
}

/* Derived dense column i: a count or a target encoding of a finished
 * categorical column, with its statistics. */
static dlrec_status build_encoding(fit_ctx *x, dlrec_etl *e, uint32_t i) {
  etl_derived *dv = &x->wf.dense[i];
  etl_dense *out = &e->dense[x->nd + i];
  etl_cat *c = &e->cat[dv->src[0]];
  const uint64_t n = c->size;
  out->transform = dv->op == ETL_OP_TARGET ? DLREC_DENSE_NONE : x->o->dense_transform;
  if (c->vocab_file)
    return dlrec_error(DLREC_ERR_NOMEM, "fit: %s: the vocabulary of %s did not fit in --memory-mb, and a count or "
                       "target encoding needs it in memory: raise --memory-mb", x->wf.dense_names[i],
                       x->cols.cat[dv->src[0]]);
  double *xv = malloc(n * sizeof *xv);
  uint64_t *w = malloc(n * sizeof *w);
  dlrec_status st = xv && w ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  if (st == DLREC_OK && dv->op == ETL_OP_COUNT) {
    for (uint64_t g = 0; g < n; g++) {
      xv[g] = (double)etl_count_of(c, g);
      w[g] = g >= ETL_LOCAL_FIRST ? (uint64_t)xv[g] : g == ETL_LOCAL_MISSING ? c->missing : c->hashed ? 0 : c->oov;
    }
  } else if (st == DLREC_OK) {
    /* The workers' counts by key, then by group. */
    te_acc *a = &x->workers[0].te[i];
    for (int k = 1; k < x->n_workers && st == DLREC_OK; k++) {
      te_merge m = {a, &x->workers[k].te[i], dv->folds, DLREC_OK};
      keymap_each(&x->workers[k].te[i].map, te_merge_fn, &m);
      st = m.st;
      for (uint32_t f = 0; f < 2 * dv->folds; f++) a->miss[f] += x->workers[k].te[i].miss[f];
    }
    uint64_t *stats = calloc(2 * dv->folds * n, sizeof *stats);
    if (st == DLREC_OK && !stats) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    if (st == DLREC_OK && !c->hashed && !c->map.slots) st = etl_build_map(c, "fit", x->cols.cat[dv->src[0]]);
    if (st == DLREC_OK) {
      e->owned[e->n_owned++] = stats;
      te_spread t = {c, a, stats, dv->folds};
      keymap_each(&a->map, te_spread_fn, &t);
      for (uint32_t f = 0; f < dv->folds; f++) {
        stats[2 * (f * n)] += a->miss[2 * f];
        stats[2 * (f * n) + 1] += a->miss[2 * f + 1];
      }
      dv->stats = stats;
      dv->groups = n;
      st = etl_target_prepare(dv, x->rows, x->positives);
    } else {
      free(stats);
    }
    for (uint64_t g = 0; st == DLREC_OK && g < n; g++) {
      xv[g] = dv->full[g];
      w[g] = 0;
      for (uint32_t f = 0; f < dv->folds; f++) w[g] += stats[2 * (f * n + g)];
    }
  }
  if (st == DLREC_OK) group_stats(out, xv, w, n, x->rows);
  free(xv);
  free(w);
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
    out->ops = x->wf.ops[d];
    out->transform = o->dense_transform;
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
  for (uint32_t i = 0; st == DLREC_OK && i < x->wf.n_cat; i++)
    if (x->wf.cat[i].op == ETL_OP_BUCKETIZE) st = build_bucketize(x, e, i);
  for (uint32_t i = 0; st == DLREC_OK && i < x->wf.n_dense; i++) st = build_encoding(x, e, i);
  if (st != DLREC_OK) return st;
  /* The derived columns' definitions move into the state (bounds and all). */
  for (uint32_t i = 0; i < x->wf.n_dense; i++) {
    e->dense[x->nd + i].derived = x->wf.dense[i];
    x->wf.dense[i].full = x->wf.dense[i].oof = NULL;
    strcpy(s->dense_names[x->nd + i], x->wf.dense_names[i]);
  }
  for (uint32_t i = 0; i < x->wf.n_cat; i++) {
    e->cat[x->nc + i].derived = x->wf.cat[i];
    x->wf.cat[i].bounds = NULL;
  }
  s->n_dense = x->nd + x->wf.n_dense;
  uint64_t next = 0;
  for (uint32_t c = 0; c < x->nc + x->wf.n_cat; c++) {
    dlrec_sparse_col *col = &s->sparse[c];
    strcpy(col->name, c < x->nc ? x->cols.cat[c] : x->wf.cat_names[c - x->nc]);
    col->hotness = col->max_hotness = 1;
    col->pooling = DLREC_POOLING_SUM;
    e->cat[c].sep = c < x->nc ? x->cols.sep[c] : 0;
    if (e->cat[c].sep) {
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
  s->n_sparse = x->nc + x->wf.n_cat;
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

/* --memory-mb: a directory of its own for the runs (in --spill-dir, or
 * beside the state), and one file of runs per column. */
static dlrec_status spill_setup(fit_ctx *x, const char *out_dir) {
  const dlrec_etl_fit_opts *o = x->o;
  x->budget = o->memory_mb << 20;
  const char *dir = o->spill_dir ? o->spill_dir : out_dir;
  dlrec_status st = dlrec_mkdirs(dir);
  if (st != DLREC_OK) return st;
  if (snprintf(x->spill_dir, sizeof x->spill_dir, "%s/.spill-%ld", dir, (long)getpid()) >= (int)sizeof x->spill_dir)
    return dlrec_error(DLREC_ERR_INVALID, "--spill-dir: path too long");
  if (mkdir(x->spill_dir, 0700) != 0 && errno != EEXIST)
    return dlrec_error(DLREC_ERR_IO, "%s: %s", x->spill_dir, strerror(errno));
  x->made_spill_dir = 1;
  for (uint32_t c = 0; st == DLREC_OK && c < x->nc + x->wf.n_cat; c++) {
    char name[32];
    snprintf(name, sizeof name, "c%u.runs", c);
    st = etl_runs_open(&x->runs[c], x->spill_dir, name);
  }
  return st;
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
  if (o->memory_mb > (1ull << 30)) return dlrec_error(DLREC_ERR_INVALID, "--memory-mb must be below 2^30");
  if (o->spill_dir && !o->memory_mb) return dlrec_error(DLREC_ERR_INVALID, "--spill-dir needs --memory-mb");
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
  /* Within a budget, the blocks in flight do not grow with the threads. */
  int n_jobs = 2 * threads + 2;
  if (o->memory_mb && n_jobs > ETL_FIT_BUDGET_JOBS) n_jobs = ETL_FIT_BUDGET_JOBS;
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
    st = etl_workflow_parse(o->workflow, &x->cols, o->raw_keys, &x->wf);
    for (uint32_t d = 0; d < x->nd; d++) x->held[d] = x->wf.ops[d].fill == ETL_FILL_MEDIAN;
    for (uint32_t i = 0; i < x->wf.n_cat; i++)
      if (x->wf.cat[i].op == ETL_OP_BUCKETIZE) x->held[x->wf.cat[i].src[0]] = 1;
    for (uint32_t d = 0; d < x->nd; d++) x->any_held |= x->held[d];
  }
  for (uint32_t d = 0; d < x->nd; d++) x->acc[d] = (dense_acc){.min = INFINITY, .max = -INFINITY};
  for (int w = 0; st == DLREC_OK && w < threads; w++) {
    fit_worker *W = &x->workers[w];
    W->scratch = malloc(o->max_line_bytes + 1);
    if (!W->scratch) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    for (uint32_t c = 0; st == DLREC_OK && c < x->nc + x->wf.n_cat; c++)
      st = keymap_init(&W->maps[c], o->memory_mb ? ETL_FIT_BUDGET_MAP : 1024);
    for (uint32_t i = 0; st == DLREC_OK && i < x->wf.n_dense; i++)
      if (x->wf.dense[i].op == ETL_OP_TARGET) st = keymap_init(&W->te[i].map, 1024);
  }
  for (int i = 0; st == DLREC_OK && i < n_jobs; i++) {
    fit_job *j = &jobs[i];
    slots[i] = j;
    j->dmin = malloc((x->nd + 1) * sizeof(double));
    j->dmax = malloc((x->nd + 1) * sizeof(double));
    j->dcount = malloc((x->nd + 1) * sizeof(uint64_t));
    if (!j->dmin || !j->dmax || !j->dcount) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
  if (st == DLREC_OK && o->memory_mb) st = spill_setup(x, out_dir);
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
                              .spilled_bytes = x->spilled,
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
    for (uint32_t i = 0; i < DLREC_MAX_DENSE; i++) {
      keymap_free(&x->workers[w].te[i].map);
      free(x->workers[w].te[i].st);
    }
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
  for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) {
    etl_runs_close(&x->runs[c]);
    etl_runs_close(&x->vocab[c]);
  }
  if (x->made_spill_dir) rmdir(x->spill_dir);
  for (uint32_t d = 0; d < DLREC_MAX_DENSE; d++) free(x->med[d]);
  etl_workflow_free(&x->wf);
  dlrec_etl_free(e);
  free(jobs);
  free(slots);
  free(x->workers);
  free(x);
  return st;
}
