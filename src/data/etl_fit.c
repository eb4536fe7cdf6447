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
 *
 * The counts become vocabularies in etl_fit_vocab.c (spilled to disk within
 * --memory-mb); the workflow's operators count what they need per row
 * (fit_row) and build their columns when the pass is over (fit_end), each in
 * its own file (etl_op.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/etl_fit.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/pipeline.h"
#include "core/clock.h"
#include "core/progress.h"

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

/* Counts a good row into its derived columns' operators (the others are
 * built from the held values or other columns when the pass ends). */
static __attribute__((noinline)) dlrec_status fit_derived(fit_ctx *x, fit_worker *W, const fit_job *j,
                                                          const dlrec_raw_row *row, const uint64_t *keys,
                                                          const uint64_t *hashes, int positive, uint64_t line) {
  const etl_fit_row r = {row, keys, hashes, positive, j->file, line};
  for (uint32_t i = 0; i < x->wf.n_cat; i++) {
    const etl_derived *dv = &x->wf.cat[i];
    const etl_fit_slot slot = {&W->maps[x->nc + i], &W->cat_missing[x->nc + i], W->cat_acc[i]};
    if (dv->type->fit_row && dv->type->fit_row(dv, &slot, &r) != DLREC_OK)
      return dlrec_error_context("fit: column %s: ", x->wf.cat_names[i]);
  }
  for (uint32_t i = 0; i < x->wf.n_dense; i++) {
    const etl_derived *dv = &x->wf.dense[i];
    const etl_fit_slot slot = {NULL, NULL, W->dense_acc[i]};
    if (dv->type->fit_row && dv->type->fit_row(dv, &slot, &r) != DLREC_OK)
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
  return x->budget ? etl_fit_spill_check(x, W) : DLREC_OK;
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

/* Input dense column d's statistics, after its column operators learned
 * from its held values (a median fill); the values a fill gives the missing
 * rows count in the mean and std that standardize uses. */
static void dense_column(fit_ctx *x, dlrec_etl *e, uint32_t d) {
  dense_acc *a = &x->acc[d];
  etl_dense *out = &e->dense[d];
  out->count = a->count;
  out->missing = x->rows - a->count;
  out->ops = x->wf.ops[d];
  out->transform = x->o->dense_transform;
  double fill = 0;
  int fills = 0;
  for (const etl_op_type *const *op = etl_ops; *op; op++) {
    if ((*op)->column_fit_end) (*op)->column_fit_end(&out->ops, x->med[d], x->med_n[d], x->cols.dense[d]);
    if ((*op)->column_fills) fills |= (*op)->column_fills(&out->ops, &fill);
  }
  const uint64_t filled = fills ? out->missing : 0;
  if (filled) {
    double tf = etl_transform(x->o->dense_transform, etl_clip(&out->ops, fill));
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

/* The derived columns their operators build when the pass is over
 * (categorical ones, then dense ones, as the schema orders them), then
 * moved into the state, definitions and all. */
static dlrec_status derived_columns(fit_ctx *x, dlrec_etl *e) {
  void **acc = calloc((size_t)x->n_workers, sizeof *acc);
  dlrec_status st = acc ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  for (int dense = 0; dense <= 1 && st == DLREC_OK; dense++) {
    for (uint32_t i = 0; i < (dense ? x->wf.n_dense : x->wf.n_cat) && st == DLREC_OK; i++) {
      etl_derived *dv = dense ? &x->wf.dense[i] : &x->wf.cat[i];
      const uint32_t col = dense ? x->nd + i : x->nc + i;
      if (dense)
        e->dense[col].transform = dv->type->flags & ETL_OP_RAW_VALUE ? DLREC_DENSE_NONE : x->o->dense_transform;
      if (!dv->type->fit_end) continue;
      for (int w = 0; w < x->n_workers; w++) acc[w] = dense ? x->workers[w].dense_acc[i] : x->workers[w].cat_acc[i];
      const int h = dv->type->holds ? dv->type->holds(dv) : -1;
      etl_fit_end f = {e, dv, col, dense ? x->wf.dense_names[i] : x->wf.cat_names[i], x->rows, x->positives,
                       h >= 0 ? x->med[h] : NULL, h >= 0 ? x->med_n[h] : 0, acc, x->n_workers};
      st = dv->type->fit_end(&f);
    }
  }
  free(acc);
  if (st != DLREC_OK) return st;
  /* The state owns what the definitions own from now on; the workflow
   * keeps their operators, for the workers' accumulators. */
  for (uint32_t i = 0; i < x->wf.n_dense; i++) {
    e->dense[x->nd + i].derived = x->wf.dense[i];
    x->wf.dense[i] = (etl_derived){.type = x->wf.dense[i].type};
    strcpy(e->schema.dense_names[x->nd + i], x->wf.dense_names[i]);
  }
  for (uint32_t i = 0; i < x->wf.n_cat; i++) {
    e->cat[x->nc + i].derived = x->wf.cat[i];
    x->wf.cat[i] = (etl_derived){.type = x->wf.cat[i].type};
  }
  e->schema.n_dense = x->nd + x->wf.n_dense;
  return DLREC_OK;
}

/* The categorical columns in the schema: names, hotness, pooling and id
 * ranges. */
static dlrec_status cat_schema(fit_ctx *x, dlrec_etl *e) {
  dlrec_schema *s = &e->schema;
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
  return DLREC_OK;
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
    dense_column(x, e, d);
  }
  dlrec_status st = etl_fit_finish_columns(x, e);
  if (st == DLREC_OK) st = derived_columns(x, e);
  if (st == DLREC_OK) st = cat_schema(x, e);
  if (st != DLREC_OK) return st;
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

/* The inputs opened, their columns known, the workflow parsed, and which
 * dense columns' values fit holds for an operator. */
static dlrec_status fit_open(fit_ctx *x, const char *const *inputs, int n_inputs) {
  const dlrec_etl_fit_opts *o = x->o;
  dlrec_columns svm_cols;
  const dlrec_columns *given = NULL;
  dlrec_status st = DLREC_OK;
  if (o->format == DLREC_FORMAT_LIBSVM || o->format == DLREC_FORMAT_LIBFM) {
    st = dlrec_columns_svm(&svm_cols, o->format, o->libfm_fields, o->has_label, o->pooling, o->max_hotness);
    given = &svm_cols;
  }
  if (st == DLREC_OK)
    st = etl_inputs_init(&x->in, inputs, o->sources, n_inputs, o->format, o->schema_spec, given, o->has_label, o->block_bytes,
                         o->max_line_bytes);
  if (st != DLREC_OK) return st;
  x->cols = x->in.cols;
  x->nd = x->cols.n_dense;
  x->nc = x->cols.n_cat;
  for (uint32_t c = 0; c < x->nc; c++) x->multi |= x->cols.sep[c] != 0;
  st = etl_workflow_parse(o->workflow, &x->cols, o->raw_keys, &x->wf);
  for (uint32_t d = 0; d < x->nd; d++)
    for (const etl_op_type *const *op = etl_ops; *op; op++)
      if ((*op)->column_holds && (*op)->column_holds(&x->wf.ops[d])) x->held[d] = 1;
  for (uint32_t i = 0; i < x->wf.n_cat + x->wf.n_dense; i++) {
    const etl_derived *dv = i < x->wf.n_cat ? &x->wf.cat[i] : &x->wf.dense[i - x->wf.n_cat];
    const int h = dv->type->holds ? dv->type->holds(dv) : -1;
    if (h >= 0) x->held[h] = 1;
  }
  for (uint32_t d = 0; d < x->nd; d++) x->any_held |= x->held[d];
  return st;
}

/* Each worker's scratch, count tables and the operators' accumulators. */
static dlrec_status workers_init(fit_ctx *x) {
  const dlrec_etl_fit_opts *o = x->o;
  dlrec_status st = DLREC_OK;
  for (int w = 0; st == DLREC_OK && w < x->n_workers; w++) {
    fit_worker *W = &x->workers[w];
    W->scratch = malloc(o->max_line_bytes + 1);
    if (!W->scratch) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
    for (uint32_t c = 0; st == DLREC_OK && c < x->nc + x->wf.n_cat; c++)
      st = keymap_init(&W->maps[c], o->memory_mb ? ETL_FIT_BUDGET_MAP : 1024);
    for (uint32_t i = 0; st == DLREC_OK && i < x->wf.n_cat; i++)
      if (x->wf.cat[i].type->fit_acc_new) st = x->wf.cat[i].type->fit_acc_new(&x->wf.cat[i], &W->cat_acc[i]);
    for (uint32_t i = 0; st == DLREC_OK && i < x->wf.n_dense; i++)
      if (x->wf.dense[i].type->fit_acc_new) st = x->wf.dense[i].type->fit_acc_new(&x->wf.dense[i], &W->dense_acc[i]);
  }
  return st;
}

static void workers_free(fit_ctx *x) {
  for (int w = 0; x->workers && w < x->n_workers; w++) {
    fit_worker *W = &x->workers[w];
    for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) keymap_free(&W->maps[c]);
    free(W->scratch);
    free(W->mkeys);
    for (uint32_t i = 0; i < x->wf.n_cat; i++)
      if (W->cat_acc[i]) x->wf.cat[i].type->fit_acc_free(W->cat_acc[i]);
    for (uint32_t i = 0; i < x->wf.n_dense; i++)
      if (W->dense_acc[i]) x->wf.dense[i].type->fit_acc_free(W->dense_acc[i]);
  }
}

static dlrec_status jobs_init(fit_ctx *x, fit_job *jobs, void **slots, int n_jobs) {
  for (int i = 0; i < n_jobs; i++) {
    fit_job *j = &jobs[i];
    slots[i] = j;
    j->dmin = malloc((x->nd + 1) * sizeof(double));
    j->dmax = malloc((x->nd + 1) * sizeof(double));
    j->dcount = malloc((x->nd + 1) * sizeof(uint64_t));
    if (!j->dmin || !j->dmax || !j->dcount) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  }
  return DLREC_OK;
}

static void jobs_free(fit_job *jobs, int n_jobs) {
  for (int i = 0; jobs && i < n_jobs; i++) {
    dlrec_block_free(&jobs[i].block);
    free(jobs[i].t);
    free(jobs[i].raw);
    free(jobs[i].dmin);
    free(jobs[i].dmax);
    free(jobs[i].dcount);
    etl_badlist_free(&jobs[i].bad);
  }
  free(jobs);
}

/* The pass over the inputs (fit_produce, fit_work, fit_consume). */
static dlrec_status fit_pass(fit_ctx *x, void **slots, int n_jobs, int n_inputs) {
  if (x->o->progress) x->progress = dlrec_progress_start("etl fit", x->in.total_bytes, "bytes");
  dlrec_pipeline_ops ops = {fit_produce, fit_work, fit_consume};
  dlrec_status st = dlrec_pipeline_run(&ops, x, slots, n_jobs, x->n_workers);
  if (x->progress) dlrec_progress_note(x->progress, "%llu rows", (unsigned long long)x->rows);
  dlrec_progress_finish(x->progress);
  if (st == DLREC_OK && x->rows == 0)
    st = x->bad ? dlrec_error(DLREC_ERR_PARSE, "no rows in the input: all %llu rows were bad", (unsigned long long)x->bad)
                : dlrec_error(DLREC_ERR_PARSE, "no rows in the input (%s%s): nothing to fit", x->in.names[0],
                              n_inputs > 1 ? ", ..." : "");
  return st;
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
  if (st == DLREC_OK) st = fit_open(x, inputs, n_inputs);
  for (uint32_t d = 0; d < x->nd; d++) x->acc[d] = (dense_acc){.min = INFINITY, .max = -INFINITY};
  if (st == DLREC_OK) st = workers_init(x);
  if (st == DLREC_OK) st = jobs_init(x, jobs, slots, n_jobs);
  if (st == DLREC_OK && o->memory_mb) st = spill_setup(x, out_dir);
  if (st == DLREC_OK) st = fit_pass(x, slots, n_jobs, n_inputs);
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
  workers_free(x);
  jobs_free(jobs, n_jobs);
  etl_inputs_free(&x->in);
  for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) {
    etl_runs_close(&x->runs[c]);
    etl_runs_close(&x->vocab[c]);
  }
  if (x->made_spill_dir) rmdir(x->spill_dir);
  for (uint32_t d = 0; d < DLREC_MAX_DENSE; d++) free(x->med[d]);
  etl_workflow_free(&x->wf);
  dlrec_etl_free(e);
  free(slots);
  free(x->workers);
  free(x);
  return st;
}
