/* The shard plan: which rank holds which rows of the fused table. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist.h"

/* A column's rows on rank r: all or none table-wise, every ranks-th row-wise. */
static uint64_t col_rows_on(const dlrec_shard_plan *p, uint32_t c, int r) {
  const dlrec_shard_col *col = &p->cols[c];
  const uint64_t n = col->end - col->begin;
  if (col->owner >= 0) return col->owner == r ? n : 0;
  return n > (uint64_t)r ? (n - (uint64_t)r + (uint64_t)p->ranks - 1) / (uint64_t)p->ranks : 0;
}

/* Lookups a batch row makes in column c: its hotness, or for a column whose
 * rows vary, half its most (the schema knows no mean). */
static double col_lookups(const dlrec_sparse_col *c) {
  if (c->hotness) return c->hotness;
  return c->max_hotness > 1 ? c->max_hotness / 2.0 : 1.0;
}

void dlrec_shard_plan_free(dlrec_shard_plan *p) {
  if (!p) return;
  free(p->base);
  free(p->rows);
  free(p->lookups);
  p->base = p->rows = NULL;
  p->lookups = NULL;
}

dlrec_status dlrec_shard_plan_make(dlrec_shard_plan *p, const dlrec_schema *schema, int ranks, uint32_t dim,
                                   uint32_t row_bytes, uint32_t optim_bytes, double rowwise_share) {
  memset(p, 0, sizeof *p);
  if (ranks < 1 || ranks > DLREC_DIST_MAX_RANKS)
    return dlrec_error(DLREC_ERR_INVALID, "%d ranks: at most %d", ranks, DLREC_DIST_MAX_RANKS);
  p->ranks = ranks;
  p->n_cols = schema->n_sparse;
  p->dim = dim;
  p->row_bytes = row_bytes;
  p->optim_bytes = optim_bytes;
  p->base = calloc((size_t)(p->n_cols ? p->n_cols : 1) * ranks, sizeof *p->base);
  p->rows = calloc((size_t)ranks, sizeof *p->rows);
  p->lookups = calloc((size_t)ranks, sizeof *p->lookups);
  double *bytes = calloc((size_t)ranks, sizeof *bytes);
  if (!p->base || !p->rows || !p->lookups || !bytes) {
    free(bytes);
    dlrec_shard_plan_free(p);
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  const double per_row = (double)row_bytes + optim_bytes;
  double total = 0;
  for (uint32_t c = 0; c < p->n_cols; c++) total += (double)(schema->sparse[c].id_end - schema->sparse[c].id_begin);
  total *= per_row;
  /* Row-wise: a column larger than rowwise_share of a rank's fair part of the bytes. */
  uint32_t order[DLREC_MAX_SPARSE], n_table = 0;
  for (uint32_t c = 0; c < p->n_cols; c++) {
    const dlrec_sparse_col *sc = &schema->sparse[c];
    const double b = (double)(sc->id_end - sc->id_begin) * per_row;
    p->cols[c] = (dlrec_shard_col){sc->id_begin, sc->id_end, 0};
    if (ranks > 1 && b > total / ranks * rowwise_share) {
      p->cols[c].owner = -1;
      for (int r = 0; r < ranks; r++) {
        bytes[r] += b / ranks;
        p->lookups[r] += col_lookups(sc) / ranks;
      }
    } else {
      order[n_table++] = c;
    }
  }
  /* Table-wise columns, the largest first, each to the rank with the fewest
   * lookups so far (every column of a one-hot dataset costs a batch the same
   * lookups, whatever its size), then the fewest bytes. */
  for (uint32_t i = 1; i < n_table; i++)
    for (uint32_t j = i; j > 0; j--) {
      const dlrec_sparse_col *a = &schema->sparse[order[j - 1]], *b = &schema->sparse[order[j]];
      if (b->id_end - b->id_begin <= a->id_end - a->id_begin) break;
      uint32_t t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (uint32_t i = 0; i < n_table; i++) {
    const uint32_t c = order[i];
    const dlrec_sparse_col *sc = &schema->sparse[c];
    int best = 0;
    for (int r = 1; r < ranks; r++)
      if (p->lookups[r] < p->lookups[best] || (p->lookups[r] == p->lookups[best] && bytes[r] < bytes[best])) best = r;
    p->cols[c].owner = best;
    p->lookups[best] += col_lookups(sc);
    bytes[best] += (double)(sc->id_end - sc->id_begin) * per_row;
  }
  free(bytes);
  for (int r = 0; r < ranks; r++)
    for (uint32_t c = 0; c < p->n_cols; c++) {
      p->base[(size_t)c * ranks + r] = p->rows[r];
      p->rows[r] += col_rows_on(p, c, r);
    }
  for (int r = 0; r < ranks; r++)
    if (p->rows[r] > UINT32_MAX) {
      dlrec_shard_plan_free(p);
      return dlrec_error(DLREC_ERR_INVALID, "rank %d would hold %llu rows, more than a table's 2^32: use more ranks", r,
                         (unsigned long long)p->rows[r]);
    }
  return DLREC_OK;
}

dlrec_status dlrec_shard_plan_runs(const dlrec_shard_plan *p, int r, dlrec_shard_run_fn fn, void *ctx) {
  for (uint32_t c = 0; c < p->n_cols; c++) {
    const uint64_t n = col_rows_on(p, c, r);
    if (!n) continue;
    const dlrec_shard_col *col = &p->cols[c];
    const uint64_t local = p->base[(size_t)c * p->ranks + r];
    dlrec_status s = col->owner >= 0 ? fn(ctx, local, col->begin, 1, n)
                                     : fn(ctx, local, col->begin + (uint64_t)r, (uint64_t)p->ranks, n);
    if (s != DLREC_OK) return s;
  }
  return DLREC_OK;
}

uint64_t dlrec_shard_plan_step_bytes(const dlrec_shard_plan *p, const dlrec_schema *schema, uint32_t max_rows) {
  uint64_t ids = 0;
  for (uint32_t c = 0; c < schema->n_sparse; c++) ids += schema->sparse[c].max_hotness;
  const uint64_t lookups = (uint64_t)max_rows * (ids ? ids : 1), grad = 4 + 4 * (uint64_t)p->dim;
  uint64_t set = 64;
  while (set < 2 * lookups) set *= 2;
  /* fetch, keys, fetch ids, unique keys (two lists), requests, gradients
   * out; the hash set; about as many gradients received, twice (as they
   * come and unpacked). */
  return lookups * (p->row_bytes + 8 + 4 + 16 + 4 + grad) + set * 12 + 2 * lookups * grad;
}

/* b bytes in a unit, padded to a table's column unless inline. */
static void print_bytes(FILE *out, double b, int inline_) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  if (inline_) fprintf(out, "%.1f %s", b, u[i]);
  else fprintf(out, "%8.1f %-3s", b, u[i]);
}

void dlrec_shard_plan_print(const dlrec_shard_plan *p, const dlrec_schema *schema, uint64_t dense_bytes,
                            uint64_t step_bytes, uint64_t ws_bytes, FILE *out) {
  fprintf(out, "shard plan: %d rank%s, %u columns, dim %u, %u table + %u optimizer bytes a row\n", p->ranks,
          p->ranks == 1 ? "" : "s", p->n_cols, p->dim, p->row_bytes, p->optim_bytes);
  fprintf(out, "  %-24s %12s  %s\n", "column", "rows", "placement");
  for (uint32_t c = 0; c < p->n_cols; c++) {
    const dlrec_shard_col *col = &p->cols[c];
    fprintf(out, "  %-24s %12llu  ", schema->sparse[c].name, (unsigned long long)(col->end - col->begin));
    if (col->owner >= 0) fprintf(out, "table-wise on rank %d\n", col->owner);
    else fprintf(out, "row-wise over all ranks (row k on rank k mod %d)\n", p->ranks);
  }
  fprintf(out, "  %-6s %12s %13s %13s %9s\n", "rank", "rows", "shard", "total", "lookups");
  for (int r = 0; r < p->ranks; r++) {
    const double shard = (double)p->rows[r] * ((double)p->row_bytes + p->optim_bytes);
    fprintf(out, "  %-6d %12llu ", r, (unsigned long long)p->rows[r]);
    print_bytes(out, shard, 0);
    fprintf(out, "  ");
    print_bytes(out, shard + (double)dense_bytes + (double)step_bytes + (double)ws_bytes, 0);
    fprintf(out, " %8.2f\n", p->lookups[r]);
  }
  fprintf(out, "  total: the shard, the dense parameters and their optimizer state (");
  print_bytes(out, (double)dense_bytes, 1);
  fprintf(out, "), the step's buffers (about ");
  print_bytes(out, (double)step_bytes, 1);
  fprintf(out, ") and the model's activations and workspaces (about ");
  print_bytes(out, (double)ws_bytes, 1);
  fprintf(out, "), on every rank; lookups: expected per batch row\n");
}
