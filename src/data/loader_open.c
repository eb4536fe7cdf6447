/* Opening the loader (data/loader.h): the files mapped and checked against
 * one schema, their row groups indexed, the ring's slots, the planner, the
 * fingerprint a position is checked against, and the worker threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "data/loader_impl.h"

/* ---- opening ---- */

static dlrec_status check_opts(const dlrec_loader_opts *o) {
  if (o->batch_rows < 1 || o->batch_rows > MAX_BATCH_ROWS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: batch_rows %u is out of range [1, %u]", o->batch_rows,
                       MAX_BATCH_ROWS);
  if (o->shuffle && o->window_groups < 1)
    return dlrec_error(DLREC_ERR_INVALID, "loader: window_groups must be at least 1");
  if (o->shuffle && o->slice_rows < 1) return dlrec_error(DLREC_ERR_INVALID, "loader: slice_rows must be at least 1");
  if (o->prefetch < 1 || o->prefetch > MAX_PREFETCH)
    return dlrec_error(DLREC_ERR_INVALID, "loader: prefetch %u is out of range [1, %u]", o->prefetch, MAX_PREFETCH);
  if (o->threads < 1 || o->threads > MAX_THREADS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: threads %u is out of range [1, %u]", o->threads, MAX_THREADS);
  uint32_t parts = o->parts ? o->parts : 1;
  if (parts > MAX_PARTS)
    return dlrec_error(DLREC_ERR_INVALID, "loader: parts %u is out of range [1, %u]", o->parts, MAX_PARTS);
  if (o->part >= parts)
    return dlrec_error(DLREC_ERR_INVALID, "loader: part %u is out of range for parts %u (part must be below parts)",
                       o->part, parts);
  return DLREC_OK;
}

/* Names the first difference between two schemas, for the error that
 * refuses to mix files. */
static void schema_diff(const dlrec_schema *a, const dlrec_schema *b, char *out, size_t n) {
  if (a->has_label != b->has_label)
    snprintf(out, n, "one has a label, the other not");
  else if (a->n_dense != b->n_dense)
    snprintf(out, n, "%u vs %u dense columns", a->n_dense, b->n_dense);
  else if (a->n_sparse != b->n_sparse)
    snprintf(out, n, "%u vs %u sparse columns", a->n_sparse, b->n_sparse);
  else if (a->table_rows != b->table_rows)
    snprintf(out, n, "table rows %llu vs %llu", (ull)a->table_rows, (ull)b->table_rows);
  else {
    snprintf(out, n, "column names differ");
    for (uint32_t i = 0; i < a->n_sparse; i++) {
      const dlrec_sparse_col *x = &a->sparse[i], *y = &b->sparse[i];
      if (strcmp(x->name, y->name) || x->hotness != y->hotness || x->max_hotness != y->max_hotness ||
          x->id_begin != y->id_begin || x->id_end != y->id_end) {
        snprintf(out, n, "sparse column %u: '%s' hotness %u ids [%llu, %llu) vs '%s' hotness %u ids [%llu, %llu)", i,
                 x->name, x->hotness, (ull)x->id_begin, (ull)x->id_end, y->name, y->hotness, (ull)y->id_begin,
                 (ull)y->id_end);
        break;
      }
    }
  }
}

static int cmp_desc_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

static dlrec_status open_files(dlrec_loader *l, const char *const *paths, int n_paths) {
  l->files = calloc((size_t)n_paths, sizeof *l->files);
  if (!l->files) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  l->n_files = n_paths;
  uint64_t groups = 0;
  for (int i = 0; i < n_paths; i++) {
    dlrec_status st = dlrec_dlr_open(&l->files[i], paths[i]);
    if (st != DLREC_OK) return st;
    const dlrec_schema *s = dlrec_dlr_schema(l->files[i]);
    if (i == 0)
      l->schema = *s;
    else if (!dlrec_schema_equal(&l->schema, s)) {
      char diff[400];
      schema_diff(&l->schema, s, diff, sizeof diff);
      return dlrec_error(DLREC_ERR_INVALID, "%s: its schema differs from %s's (%s); one stream needs one encoding",
                         paths[i], paths[0], diff);
    }
    groups += dlrec_dlr_row_groups(l->files[i]);
    l->N += dlrec_dlr_rows(l->files[i]);
  }
  if (groups >= UINT32_MAX)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "loader: %llu row groups in all (at most %u)", (ull)groups,
                       UINT32_MAX - 1);
  l->G = (uint32_t)groups;
  return DLREC_OK;
}

/* The group table: file, index, rows and column pointers of every group,
 * so that copying needs one table lookup per segment and column. */
static dlrec_status build_groups(dlrec_loader *l) {
  const dlrec_schema *s = &l->schema;
  uint32_t nvar = 0;
  for (uint32_t c = 0; c < s->n_sparse; c++)
    if (!s->sparse[c].hotness) l->var_slot[c] = 2 + s->n_sparse + nvar++;
  l->has_variable = nvar > 0;
  l->P = 2 + s->n_sparse + nvar;
  size_t G = l->G ? l->G : 1;
  l->gfile = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->gindex = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->grows = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->gstate = dlrec_arena_alloc(&l->arena, G, 64);
  l->gptr = dlrec_arena_alloc(&l->arena, G * l->P * sizeof(void *), 64);
  if (!l->gfile || !l->gindex || !l->grows || !l->gstate || !l->gptr)
    return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for %u row groups", l->G);
  uint32_t g = 0;
  dlrec_rowgroup rg;
  for (int f = 0; f < l->n_files; f++) {
    for (uint32_t i = 0; i < dlrec_dlr_row_groups(l->files[f]); i++, g++) {
      dlrec_status st = dlrec_dlr_row_group(l->files[f], i, &rg);
      if (st != DLREC_OK) return st;
      l->gfile[g] = (uint32_t)f;
      l->gindex[g] = i;
      l->grows[g] = rg.rows;
      const void **p = l->gptr + (size_t)g * l->P;
      p[0] = rg.labels;
      p[1] = rg.dense;
      for (uint32_t c = 0; c < s->n_sparse; c++) {
        p[2 + c] = rg.ids[c];
        if (!s->sparse[c].hotness) p[l->var_slot[c]] = rg.offsets[c];
      }
    }
  }
  return DLREC_OK;
}

/* Batch buffers, allocated once: labels, dense and per-column ids and
 * offsets; fixed-hotness columns share one precomputed offsets array per
 * hotness (row i starts at i * hotness in every batch). */
static dlrec_status build_slots(dlrec_loader *l) {
  const dlrec_schema *s = &l->schema;
  const uint64_t batch_rows = l->o.batch_rows;
  /* No batch holds more rows than an epoch, so the buffers are sized for
   * min(batch_rows, rows) (0 when there are none: no batch is ever planned).
   * A header may declare any hotness: sized by batch_rows alone, a 0-row
   * file of a few hundred bytes declaring 2^24 ids per row made each slot
   * allocate and clear gigabytes; sized by the rows, the ids a buffer holds
   * are bounded by the ids the files hold. */
  const uint64_t B = l->N < batch_rows ? l->N : batch_rows;
  dlrec_arena *a = &l->arena;
  const uint32_t *fixed[DLREC_MAX_SPARSE] = {0};
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    uint32_t h = s->sparse[c].hotness;
    if (batch_rows * s->sparse[c].max_hotness > UINT32_MAX)
      return dlrec_error(DLREC_ERR_INVALID,
                         "loader: batch_rows %llu times max hotness %u of column '%s' overflows 32-bit offsets",
                         (ull)batch_rows, s->sparse[c].max_hotness, s->sparse[c].name);
    if (!h) continue;
    for (uint32_t d = 0; d < c && !fixed[c]; d++)
      if (s->sparse[d].hotness == h) fixed[c] = fixed[d];
    if (!fixed[c]) {
      uint32_t *o = dlrec_arena_alloc(a, (B + 1) * 4, 64);
      if (!o) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
      for (uint64_t i = 0; i <= B; i++) o[i] = (uint32_t)(i * h);
      fixed[c] = o;
    }
  }
  l->slots = dlrec_arena_alloc(a, l->R * sizeof *l->slots, 64);
  if (!l->slots) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  for (uint32_t k = 0; k < l->R; k++) {
    slot *sl = &l->slots[k];
    sl->segs = dlrec_arena_alloc(a, B * sizeof(seg), 64);
    sl->vgroups = dlrec_arena_alloc(a, B * 4, 64);
    sl->vact = dlrec_arena_alloc(a, B, 64);
    sl->labels = dlrec_arena_alloc(a, B * 4, 64);
    sl->dense = dlrec_arena_alloc(a, B * 4 * (s->n_dense ? s->n_dense : 1), 64);
    if (!sl->segs || !sl->vgroups || !sl->vact || !sl->labels || !sl->dense)
      return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for batch buffers");
    sl->batch.labels = s->has_label ? sl->labels : NULL;
    sl->batch.dense = sl->dense;
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      if (s->sparse[c].hotness) {
        sl->ids[c] = dlrec_arena_alloc(a, B * 4 * s->sparse[c].hotness, 64);
      } else {
        /* Start at up to 4 ids per row; reserve_variable grows it. */
        sl->ids_cap[c] = B * (s->sparse[c].max_hotness < 4 ? s->sparse[c].max_hotness : 4);
        sl->ids[c] = malloc(sl->ids_cap[c] ? sl->ids_cap[c] * 4 : 4);
        sl->offs[c] = dlrec_arena_alloc(a, (B + 1) * 4, 64);
      }
      if (!sl->ids[c] || (!s->sparse[c].hotness && !sl->offs[c]))
        return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for batch buffers");
      sl->batch.ids[c] = sl->ids[c];
      sl->batch.offsets[c] = s->sparse[c].hotness ? fixed[c] : sl->offs[c];
    }
  }
  return DLREC_OK;
}

/* The planner's arrays. The slice array must hold the largest window: the
 * sum of the window_groups largest per-group slice counts. */
static dlrec_status build_planner(dlrec_loader *l) {
  size_t G = l->G ? l->G : 1;
  uint32_t *counts = malloc(G * 4);
  if (!counts) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  for (uint32_t g = 0; g < l->G; g++) counts[g] = (uint32_t)((l->grows[g] + (uint64_t)l->S - 1) / l->S);
  qsort(counts, l->G, 4, cmp_desc_u32);
  uint64_t cap = 0;
  for (uint32_t g = 0; g < l->G && g < l->W; g++) cap += counts[g];
  free(counts);
  if (cap > UINT32_MAX)
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "loader: a window of %u row groups has %llu slices (at most %u): use "
                       "fewer window_groups or larger slice_rows",
                       l->W, (ull)cap, UINT32_MAX);
  l->slice_cap = (uint32_t)(cap ? cap : 1);
  l->pl.perm = dlrec_arena_alloc(&l->arena, G * 4, 64);
  l->pl.mark = dlrec_arena_alloc(&l->arena, G * 8, 64);
  l->pl.slices = dlrec_arena_alloc(&l->arena, (size_t)l->slice_cap * sizeof(slice), 64);
  if (!l->pl.perm || !l->pl.mark || !l->pl.slices)
    return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory for a window of %u slices", l->slice_cap);
  return DLREC_OK;
}

/* Identity of the row stream: the files' content in order, and the options
 * that shape the order. batch_rows and drop_last are left out on purpose: a
 * position is a row of the stream, valid for any batch size. */
static uint64_t stream_fingerprint(const dlrec_loader *l) {
  uint64_t h = dlrec_hash_bytes("dlrec loader v1", 15, 0);
  for (int i = 0; i < l->n_files; i++) h = dlrec_mix64(h ^ dlrec_dlr_fingerprint(l->files[i])) + (uint64_t)i;
  if (l->o.shuffle) {
    h = dlrec_mix64(h ^ 0x5348554646ull); /* "SHUFF" */
    h = dlrec_mix64(h ^ l->o.window_groups);
    h = dlrec_mix64(h ^ ((uint64_t)l->o.slice_rows << 1));
    h = dlrec_mix64(h ^ l->o.seed);
  }
  return h;
}

dlrec_status dlrec_loader_open(dlrec_loader **out, const char *const *paths, int n_paths, const dlrec_loader_opts *o) {
  *out = NULL;
  dlrec_status st = check_opts(o);
  if (st != DLREC_OK) return st;
  if (n_paths < 1) return dlrec_error(DLREC_ERR_INVALID, "loader: no input files");
  dlrec_loader *l = calloc(1, sizeof *l);
  if (!l) return dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  l->o = *o;
  if (!l->o.parts) l->o.parts = 1;
  dlrec_arena_init(&l->arena, 1 << 20);
  /* Adaptive: critical sections are short (plan a batch, flip a state), so
   * spinning briefly beats sleeping on contention. */
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(&l->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_cond_init(&l->cv_work, NULL);
  pthread_cond_init(&l->cv_ready, NULL);
  l->W = o->shuffle ? o->window_groups : 1;
  l->S = o->shuffle ? o->slice_rows : UINT32_MAX;
  l->R = o->prefetch + 1;
  st = open_files(l, paths, n_paths);
  if (st == DLREC_OK) st = build_groups(l);
  if (st == DLREC_OK) st = build_planner(l);
  if (st == DLREC_OK) st = build_slots(l);
  if (st == DLREC_OK) {
    l->threads = calloc(o->threads, sizeof *l->threads);
    if (!l->threads) st = dlrec_error(DLREC_ERR_NOMEM, "loader: out of memory");
  }
  if (st == DLREC_OK) {
    l->fingerprint = stream_fingerprint(l);
    l->pos = (dlrec_position){0, 0, l->fingerprint};
    for (; l->n_threads < o->threads; l->n_threads++)
      if (pthread_create(&l->threads[l->n_threads], NULL, loader_worker_main, l) != 0) {
        st = dlrec_error(DLREC_ERR_INTERNAL, "loader: cannot start an assembling thread");
        break;
      }
  }
  if (st != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    dlrec_loader_close(l);
    return dlrec_error_restore(&e);
  }
  *out = l;
  return DLREC_OK;
}
