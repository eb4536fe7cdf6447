/* Table storage (embed/store.h): the interface, and the ram store, whose
 * resident table is the whole table and whose resolve is the identity. */
#include "embed/store_impl.h"

#include <stdlib.h>
#include <string.h>

#include "backend/table_store.h"

const char *dlrec_store_kind_name(dlrec_store_kind kind) {
  switch (kind) {
  case DLREC_STORE_RAM: return "ram";
  case DLREC_STORE_TIERED: return "tiered";
  case DLREC_STORE_HASH: return "hash";
  }
  return "?";
}

dlrec_status dlrec_store_kind_parse(const char *name, dlrec_store_kind *kind) {
  for (int k = DLREC_STORE_RAM; k <= DLREC_STORE_HASH; k++)
    if (name && !strcmp(name, dlrec_store_kind_name((dlrec_store_kind)k))) {
      *kind = (dlrec_store_kind)k;
      return DLREC_OK;
    }
  return dlrec_error(DLREC_ERR_INVALID, "unknown table storage \"%s\" (one of: ram, tiered, hash)", name ? name : "");
}

dlrec_status dlrec_store_create(dlrec_store **out, const dlrec_store_config *c, uint64_t rows, uint32_t dim,
                                dlrec_table_dtype dtype) {
  if (!out || !c) return dlrec_error(DLREC_ERR_INVALID, "store_create: NULL argument");
  *out = NULL;
  if (c->kind != DLREC_STORE_RAM && c->kind != DLREC_STORE_TIERED && c->kind != DLREC_STORE_HASH)
    return dlrec_error(DLREC_ERR_INVALID, "store_create: unknown kind %d", (int)c->kind);
  /* The logical table's bounds are the resident table's: checked by creating
   * a ram table, or a one-row table for the others, whose rows come later. */
  dlrec_table *probe = NULL;
  dlrec_status st = dlrec_table_create_dtype(&probe, c->kind == DLREC_STORE_RAM ? rows : 1, dim, dtype);
  if (st != DLREC_OK) return st;
  if (c->kind != DLREC_STORE_RAM && (rows < 1 || rows > (1ull << 32))) {
    dlrec_table_free(probe);
    return dlrec_error(DLREC_ERR_INVALID, "store_create: %llu rows; ids are 32-bit, so 1 to 2^32",
                       (unsigned long long)rows);
  }
  dlrec_store *s = calloc(1, sizeof *s);
  if (!s) {
    dlrec_table_free(probe);
    return dlrec_error(DLREC_ERR_NOMEM, "store_create: out of memory");
  }
  s->kind = c->kind;
  s->rows = rows;
  s->dim = dim;
  s->stride = dlrec_table_stride(probe);
  s->dtype = dtype;
  if (c->kind == DLREC_STORE_RAM) {
    s->table = probe;
    s->stats.resident = rows;
  } else {
    dlrec_table_free(probe);
    if ((st = c->kind == DLREC_STORE_TIERED ? tiered_create(s, c) : hashed_create(s, c)) != DLREC_OK) {
      dlrec_store_free(s);
      return st;
    }
  }
  *out = s;
  return DLREC_OK;
}

void dlrec_store_free(dlrec_store *s) {
  if (!s) return;
  tiered_free(s->tiered);
  hashed_free(s->hashed);
  dlrec_table_free(s->table);
  free(s->changed);
  free(s);
}

uint64_t dlrec_store_rows(const dlrec_store *s) { return s->rows; }
dlrec_table *dlrec_store_table(dlrec_store *s) { return s->table; }
dlrec_store_kind dlrec_store_get_kind(const dlrec_store *s) { return s->kind; }

dlrec_status dlrec_store_init_uniform(dlrec_store *s, const dlrec_row_range *ranges, uint32_t n_ranges,
                                      uint64_t seed) {
  if (!s) return dlrec_error(DLREC_ERR_INVALID, "store_init_uniform: NULL store");
  if (s->kind == DLREC_STORE_RAM) return dlrec_table_init_uniform(s->table, ranges, n_ranges, seed);
  dlrec_status st = table_check_ranges(ranges, n_ranges, s->rows);
  /* A hash table draws each row when its key is admitted. */
  return st == DLREC_OK && s->tiered ? tiered_init_uniform(s, ranges, n_ranges, seed) : st;
}

dlrec_status dlrec_store_optim_create(dlrec_store *s, const dlrec_sparse_optim_config *c, dlrec_sparse_optim **o) {
  if (!s || !c || !o) return dlrec_error(DLREC_ERR_INVALID, "store_optim_create: NULL argument");
  *o = NULL;
  if (s->optim) return dlrec_error(DLREC_ERR_INVALID, "store_optim_create: the store already has an optimizer");
  dlrec_status st = dlrec_sparse_optim_create(o, s->table, c);
  if (st == DLREC_OK && s->hashed) hashed_optim_added(s, c);
  if (st == DLREC_OK && s->tiered && (st = tiered_optim_added(s, *o, c)) != DLREC_OK) {
    dlrec_sparse_optim_free(*o);
    *o = NULL;
  }
  if (st == DLREC_OK) s->optim = *o;
  return st;
}

dlrec_status dlrec_store_resolve(dlrec_store *s, const dlrec_bag_batch *in, dlrec_bag_batch *out, int write) {
  if (!s || !in || !out) return dlrec_error(DLREC_ERR_INVALID, "store_resolve: NULL argument");
  if (s->tiered) return tiered_resolve(s, in, out, write);
  if (s->hashed) return hashed_resolve_ids(s, in, out, write);
  *out = *in;
  for (uint32_t c = 0; c < in->cols; c++) s->stats.lookups += in->offsets[c][in->rows] - in->offsets[c][0];
  return DLREC_OK;
}

dlrec_status dlrec_store_resolve_keys(dlrec_store *s, const dlrec_key_batch *in, dlrec_bag_batch *out, int write) {
  if (!s || !in || !out) return dlrec_error(DLREC_ERR_INVALID, "store_resolve_keys: NULL argument");
  if (!s->hashed)
    return dlrec_error(DLREC_ERR_INVALID, "raw keys need a hash table, not a %s one", dlrec_store_kind_name(s->kind));
  return hashed_resolve_keys(s, in, out, write);
}

int dlrec_store_key_of(const dlrec_store *s, uint32_t row, uint64_t *key) {
  return s->hashed ? hashed_key_of(s, row, key) : 0;
}


dlrec_status dlrec_store_lookup_keys(const dlrec_store *s, const dlrec_key_batch *in, uint32_t *const *offsets,
                                     uint32_t *const *ids, uint64_t *missing) {
  if (!s || !in || !offsets || !ids || !missing) return dlrec_error(DLREC_ERR_INVALID, "store_lookup_keys: NULL argument");
  if (!s->hashed)
    return dlrec_error(DLREC_ERR_INVALID, "raw keys need a hash table, not a %s one", dlrec_store_kind_name(s->kind));
  if (in->cols < 1 || in->cols > DLREC_BAG_MAX_COLS || !in->offsets || !in->keys)
    return dlrec_error(DLREC_ERR_INVALID, "store_lookup_keys: bad batch (%u columns)", in->cols);
  return hashed_lookup_keys(s, in, offsets, ids, missing);
}

dlrec_status dlrec_store_hash_arrays(dlrec_store *s, dlrec_hash_arrays *a) {
  memset(a, 0, sizeof *a);
  if (!s->hashed) return dlrec_error(DLREC_ERR_INVALID, "not a hash table");
  hashed_arrays(s, a);
  return DLREC_OK;
}

dlrec_status dlrec_store_hash_rebuild(dlrec_store *s) {
  if (!s->hashed) return dlrec_error(DLREC_ERR_INVALID, "not a hash table");
  return hashed_rebuild(s);
}

dlrec_status dlrec_store_map(dlrec_store *s, dlrec_store_view *v) {
  memset(v, 0, sizeof *v);
  v->rows = s->hashed ? dlrec_table_rows(s->table) : s->rows;
  if (s->tiered) return tiered_map(s, v);
  v->table = dlrec_table_raw(s->table);
  if (s->optim) dlrec_sparse_optim_state_view(s->optim, &v->optim);
  return DLREC_OK;
}

void dlrec_store_unmap(dlrec_store *s, dlrec_store_view *v) {
  if (s->tiered) tiered_unmap(s, v);
  memset(v, 0, sizeof *v);
}

void dlrec_store_get_stats(const dlrec_store *s, dlrec_store_stats *st) { *st = s->stats; }

size_t dlrec_store_overhead_bytes(const dlrec_store *s) {
  return s->tiered ? tiered_overhead_bytes(s) : s->hashed ? hashed_overhead_bytes(s) : 0;
}

dlrec_status dlrec_store_track_changes(dlrec_store *s) {
  if (!s->tiered && !s->hashed)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "change tracking: a %s table is not tracked (tiered and hash tables are)",
                       dlrec_store_kind_name(s->kind));
  if (s->changed) return DLREC_OK;
  s->changed_rows = dlrec_store_changes_space(s);
  if (!(s->changed = calloc((s->changed_rows + 63) / 64, sizeof *s->changed)))
    return dlrec_error(DLREC_ERR_NOMEM, "change tracking of %llu rows: out of memory",
                       (unsigned long long)s->changed_rows);
  s->n_changed = 0;
  return DLREC_OK;
}

uint64_t dlrec_store_changes_space(const dlrec_store *s) {
  return s->hashed ? dlrec_table_rows(s->table) : s->rows;
}

uint64_t dlrec_store_changes(const dlrec_store *s, uint32_t *rows) {
  if (!s->changed) return UINT64_MAX;
  if (rows) {
    uint64_t n = 0;
    for (uint64_t w = 0; w < (s->changed_rows + 63) / 64; w++)
      for (uint64_t bits = s->changed[w]; bits; bits &= bits - 1)
        rows[n++] = (uint32_t)(w * 64 + (uint64_t)__builtin_ctzll(bits));
  }
  return s->n_changed;
}

void dlrec_store_changes_reset(dlrec_store *s) {
  if (!s->changed) return;
  memset(s->changed, 0, (s->changed_rows + 63) / 64 * sizeof *s->changed);
  s->n_changed = 0;
}

dlrec_status dlrec_store_changes_mark(dlrec_store *s, const uint32_t *rows, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (rows[i] >= s->changed_rows)
      return dlrec_error(DLREC_ERR_INVALID, "change tracking: row %u is outside the table of %llu rows", rows[i],
                         (unsigned long long)s->changed_rows);
  for (uint64_t i = 0; i < n; i++) store_mark_changed(s, rows[i]);
  return DLREC_OK;
}
