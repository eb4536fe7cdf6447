/* target: a dense column of the smoothed mean label of a one-hot
 * categorical input column's group (NVTabular's TargetEncoding), out of
 * fold for the rows fit saw:
 *
 *   workflow  {"target": [{"column": "C4", "folds": 5, "smoothing": 20, "seed": 0}]}
 *   etl.json  "op": {"kind": "target", "column": "C4", "folds": 5, "smoothing": 20, "seed": 0},
 *             and a vocab.bin section of per fold and group the rows and positives
 *
 * Groups are the source's local ids. With N_g, P_g the rows and positives of
 * group g, R, P all rows and positives, m the smoothing and _f counting fold
 * f's rows only (docs/etl.md):
 *   full         (P_g + m P/R) / (N_g + m)
 *   out of fold  (P_g - P_g,f + m p_f) / (N_g - N_g,f + m),  p_f = (P - P_f) / (R - R_f)
 * A row's fold is a hash of the seed, its input's number and its line, so
 * etl apply (given fit's inputs) encodes each row out of its own fold;
 * --target-encoding full, predict and the server use the full encoding.
 * The value skips the dense transform. Fit counts, per worker, each key's
 * rows and positives per fold, then spreads them onto the source's groups.
 * The default name is SOURCE_target. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_op.h"
#include "core/json.h"

#define ETL_FOLDS_MAX 32
#define ETL_FOLD_SALT 0x74617267ull /* "targ": keeps the folds apart from the valid split */

/* Fold of row `line` (1-based) of input `file` for a target column's seed. */
static inline uint32_t etl_fold(uint64_t seed, uint32_t folds, uint32_t file, uint64_t line) {
  return (uint32_t)(dlrec_mix64(dlrec_mix64(dlrec_mix64(seed ^ ETL_FOLD_SALT) ^ file) ^ line) % folds);
}

static dlrec_status target_parse(const cJSON *o, const char *what, const dlrec_columns *cols, etl_derived *d,
                                 char *dflt, size_t dflt_size) {
  static const char *const keys[] = {"column", "name", "folds", "smoothing", "seed", NULL};
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s != DLREC_OK) return s;
  int k = etl_workflow_source(cols, cJSON_GetObjectItemCaseSensitive(o, "column"), 1, what);
  if (k < 0) return DLREC_ERR_INVALID;
  d->src[d->n_src++] = (uint32_t)k;
  uint64_t folds = 0;
  if (!cols->has_label)
    return dlrec_error(DLREC_ERR_INVALID, "%s: a target encoding needs labels, and the input has none", what);
  if ((s = etl_workflow_uint(o, "folds", what, 2, ETL_FOLDS_MAX, 5, &folds)) != DLREC_OK) return s;
  if ((s = etl_workflow_uint(o, "seed", what, 0, (uint64_t)1 << 53, 0, &d->seed)) != DLREC_OK) return s;
  d->folds = (uint32_t)folds;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "smoothing");
  d->smoothing = 20;
  if (m && !(cJSON_IsNumber(m) && m->valuedouble > 0 && isfinite(m->valuedouble)))
    return dlrec_error(DLREC_ERR_INVALID, "%s: 'smoothing' must be a number above 0", what);
  if (m) d->smoothing = m->valuedouble;
  snprintf(dflt, dflt_size, "%s_target", cols->cat[k]);
  return DLREC_OK;
}

static dlrec_status target_load(const cJSON *op, const char *what, const dlrec_columns *c, etl_derived *d) {
  dlrec_status st = etl_state_source(op, what, c, 1, d);
  uint64_t folds = 0;
  if (st == DLREC_OK) st = dlrec_json_get_u64(op, "folds", what, &folds);
  if (st == DLREC_OK) st = dlrec_json_get_double(op, "smoothing", what, &d->smoothing);
  if (st == DLREC_OK) st = dlrec_json_get_u64(op, "seed", what, &d->seed);
  if (st == DLREC_OK && (folds < 2 || folds > ETL_FOLDS_MAX || !(d->smoothing > 0) || !isfinite(d->smoothing)))
    st = dlrec_error(DLREC_ERR_INVALID, "%s: op: expected folds in [2, %d] and a smoothing above 0", what,
                     ETL_FOLDS_MAX);
  d->folds = (uint32_t)folds;
  return st;
}

static void target_save(const dlrec_columns *cols, const etl_derived *d, cJSON *o) {
  cJSON_AddStringToObject(o, "column", cols->cat[d->src[0]]);
  cJSON_AddItemToObject(o, "folds", cJSON_CreateNumber(d->folds));
  cJSON_AddItemToObject(o, "smoothing", cJSON_CreateNumber(d->smoothing));
  cJSON_AddItemToObject(o, "seed", cJSON_CreateNumber((double)d->seed));
}

/* Fills the column's encodings (full and out of fold) from its statistics. */
static dlrec_status target_prepare(etl_derived *t, uint64_t rows, uint64_t positives) {
  const uint64_t n = t->groups, K = t->folds;
  uint64_t fr[ETL_FOLDS_MAX] = {0}, fp[ETL_FOLDS_MAX] = {0}, R = 0, P = 0;
  free(t->full);
  free(t->oof);
  t->full = malloc((n ? n : 1) * sizeof *t->full);
  t->oof = malloc((n ? n : 1) * K * sizeof *t->oof);
  if (!t->full || !t->oof) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for a target encoding");
  for (uint64_t f = 0; f < K; f++)
    for (uint64_t g = 0; g < n; g++) {
      const uint64_t r = t->stats[2 * (f * n + g)], p = t->stats[2 * (f * n + g) + 1];
      if (p > r || r > rows) return dlrec_error(DLREC_ERR_CORRUPT, "more positives than rows in a group");
      fr[f] += r, fp[f] += p;
    }
  for (uint64_t f = 0; f < K; f++) R += fr[f], P += fp[f];
  if (R != rows || P != positives)
    return dlrec_error(DLREC_ERR_CORRUPT, "target statistics of %llu rows and %llu positives, the fit had %llu and %llu",
                       (unsigned long long)R, (unsigned long long)P, (unsigned long long)rows,
                       (unsigned long long)positives);
  const double m = t->smoothing, prior = R ? (double)P / (double)R : 0.5;
  for (uint64_t g = 0; g < n; g++) {
    uint64_t ng = 0, pg = 0;
    for (uint64_t f = 0; f < K; f++) ng += t->stats[2 * (f * n + g)], pg += t->stats[2 * (f * n + g) + 1];
    t->full[g] = ((double)pg + m * prior) / ((double)ng + m);
    for (uint64_t f = 0; f < K; f++) {
      const double pf = R == fr[f] ? 0.5 : (double)(P - fp[f]) / (double)(R - fr[f]);
      const uint64_t nf = t->stats[2 * (f * n + g)], pfg = t->stats[2 * (f * n + g) + 1];
      t->oof[f * n + g] = ((double)(pg - pfg) + m * pf) / ((double)(ng - nf) + m);
    }
  }
  return DLREC_OK;
}

/* ---- fit ---- */

/* A worker's counts: per key, per fold the rows and positives (st, 2 *
 * folds values a key); the missing field's apart (a key may be any 64-bit
 * value). */
typedef struct te_acc {
  keymap map; /* key -> its index in st */
  uint64_t *st;
  uint64_t n, cap;
  uint64_t miss[2 * ETL_FOLDS_MAX];
} te_acc;

static dlrec_status target_acc_new(const etl_derived *d, void **out) {
  (void)d;
  te_acc *a = calloc(1, sizeof *a);
  if (!a) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  dlrec_status st = keymap_init(&a->map, 1024);
  if (st != DLREC_OK) {
    free(a);
    return st;
  }
  *out = a;
  return DLREC_OK;
}

static void target_acc_free(void *p) {
  te_acc *a = p;
  if (!a) return;
  keymap_free(&a->map);
  free(a->st);
  free(a);
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

static dlrec_status target_fit_row(const etl_derived *dv, const etl_fit_slot *s, const etl_fit_row *r) {
  te_acc *a = s->acc;
  const uint32_t c = dv->src[0], fold = etl_fold(dv->seed, dv->folds, r->file, r->line);
  if (r->row->cat[c].n == 0) {
    a->miss[2 * fold]++;
    a->miss[2 * fold + 1] += (uint64_t)r->positive;
    return DLREC_OK;
  }
  uint64_t *st = te_slot(a, dv->folds, r->keys[c], r->hashes[c]);
  if (!st) return dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory for a target encoding's counts");
  st[2 * fold]++;
  st[2 * fold + 1] += (uint64_t)r->positive;
  return DLREC_OK;
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

/* The workers' counts by key (into the first worker's), then by group. */
static dlrec_status target_stats(etl_fit_end *f, etl_cat *c, uint64_t **out) {
  etl_derived *dv = f->d;
  const uint64_t n = c->size;
  te_acc *a = f->acc[0];
  dlrec_status st = DLREC_OK;
  for (int k = 1; k < f->n_acc && st == DLREC_OK; k++) {
    const te_acc *b = f->acc[k];
    te_merge m = {a, b, dv->folds, DLREC_OK};
    keymap_each(&b->map, te_merge_fn, &m);
    st = m.st;
    for (uint32_t i = 0; i < 2 * dv->folds; i++) a->miss[i] += b->miss[i];
  }
  uint64_t *stats = calloc(2 * dv->folds * n, sizeof *stats);
  if (st == DLREC_OK && !stats) st = dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  if (st == DLREC_OK && !c->hashed && !c->map.slots) st = etl_build_map(c, "fit", f->e->cols.cat[dv->src[0]]);
  if (st != DLREC_OK) {
    free(stats);
    return st;
  }
  te_spread t = {c, a, stats, dv->folds};
  keymap_each(&a->map, te_spread_fn, &t);
  for (uint32_t k = 0; k < dv->folds; k++) {
    stats[2 * (k * n)] += a->miss[2 * k];
    stats[2 * (k * n) + 1] += a->miss[2 * k + 1];
  }
  *out = stats;
  return DLREC_OK;
}

/* The column's statistics and encodings, and its full encoding's
 * statistics over fit's rows. */
static dlrec_status target_fit_end(etl_fit_end *f) {
  etl_derived *dv = f->d;
  etl_cat *c = &f->e->cat[dv->src[0]];
  const uint64_t n = c->size;
  dlrec_status st = etl_fit_needs_vocab(f, dv->src[0]);
  if (st != DLREC_OK) return st;
  double *xv = malloc(n * sizeof *xv);
  uint64_t *w = malloc(n * sizeof *w), *stats = NULL;
  st = xv && w ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "fit: out of memory");
  if (st == DLREC_OK) st = target_stats(f, c, &stats);
  if (st == DLREC_OK) {
    f->e->owned[f->e->n_owned++] = stats;
    dv->stats = stats;
    dv->groups = n;
    st = target_prepare(dv, f->rows, f->positives);
  }
  for (uint64_t g = 0; st == DLREC_OK && g < n; g++) {
    xv[g] = dv->full[g];
    w[g] = 0;
    for (uint32_t k = 0; k < dv->folds; k++) w[g] += stats[2 * (k * n + g)];
  }
  if (st == DLREC_OK) etl_group_stats(&f->e->dense[f->col], xv, w, n, f->rows);
  free(xv);
  free(w);
  return st;
}

/* ---- encoding ---- */

static const void *target_locate(const etl_row *r, const etl_derived *dv) {
  const uint64_t g = etl_row_local(r, dv->src[0]);
  if (!r->pos) return &dv->full[g];
  return &dv->oof[(uint64_t)etl_fold(dv->seed, dv->folds, r->pos->file, r->pos->line) * dv->groups + g];
}

static double target_value(const void *at) { return *(const double *)at; }

/* ---- vocab.bin: encoding 2, folds K, n groups; then (K, n, 2) counts ---- */

static dlrec_status target_section_save(const etl_derived *t, dlrec_status (*put)(void *, const void *, size_t),
                                        void *ctx) {
  unsigned char sec[ETL_VOCAB_SECTION] = {0};
  etl_put32(sec, ETL_ENC_TARGET);
  etl_put32(sec + 4, t->folds);
  etl_put64(sec + 8, t->groups);
  dlrec_status st = put(ctx, sec, sizeof sec);
  return st == DLREC_OK ? put(ctx, t->stats, 16 * t->folds * t->groups) : st;
}

static dlrec_status target_section_load(dlrec_etl *e, etl_derived *t, const unsigned char *p, uint64_t avail,
                                        uint64_t *used, const char *vpath, uint32_t d, const char *name) {
  t->groups = e->cat[t->src[0]].size;
  if (avail < ETL_VOCAB_SECTION) return etl_vocab_corrupt(vpath, "dense column %llu: section past the end of the file", d, 0);
  if (etl_get32(p) != ETL_ENC_TARGET || etl_get32(p + 4) != t->folds || etl_get64(p + 8) != t->groups)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': its target statistics do not match etl.json", vpath, name);
  if ((avail - ETL_VOCAB_SECTION) / 16 / t->folds < t->groups)
    return etl_vocab_corrupt(vpath, "dense column %llu: section past the end of the file", d, 0);
  t->stats = (const uint64_t *)(const void *)(p + ETL_VOCAB_SECTION);
  *used = ETL_VOCAB_SECTION + 16 * t->folds * t->groups;
  dlrec_status st = target_prepare(t, e->rows, e->positives);
  if (st != DLREC_OK) return dlrec_error_context("%s: column '%s': ", vpath, name);
  return DLREC_OK;
}

static int target_same(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y) {
  (void)a, (void)b;
  return x->folds == y->folds && x->groups == y->groups && x->seed == y->seed &&
         etl_same_bits(&x->smoothing, &y->smoothing, sizeof x->smoothing) &&
         etl_same_bits(x->stats, y->stats, 16 * x->folds * x->groups);
}

static void target_free(etl_derived *d) {
  free(d->full);
  free(d->oof);
  d->full = d->oof = NULL;
}

static const char *const state_keys[] = {"column", "folds", "smoothing", "seed", NULL};

const etl_op_type etl_op_target = {
    .name = "target",
    .role = ETL_ROLE_DENSE,
    .flags = ETL_OP_RAW_VALUE | ETL_OP_NEEDS_LABEL,
    .state_keys = state_keys,
    .parse = target_parse,
    .load = target_load,
    .save = target_save,
    .fit_acc_new = target_acc_new,
    .fit_acc_free = target_acc_free,
    .fit_row = target_fit_row,
    .fit_end = target_fit_end,
    .locate = target_locate,
    .value = target_value,
    .section_save = target_section_save,
    .section_load = target_section_load,
    .same = target_same,
    .free = target_free,
};
