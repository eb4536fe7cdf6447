/* The host embedding stage (model/stage.h): a network on a device whose
 * table stays in host memory (dlrec_net_set_host_table), for tables larger
 * than the device's memory and for the stores that move or key their rows
 * on the CPU (tiered, hash). The CPU pools (dlrec_backend_default()), the
 * pooled rows (B, F, D) cross to the device, and their gradient comes back
 * for the CPU's sparse update.
 *
 * With hot rows (dlrec_net_set_hot_fraction, "hot" below): the first rows
 * of each column's range, its most frequent values, are mirrored on the
 * device with their optimizer state. Each batch's bags are split in two on
 * the host (split_bags): the hot part pooled and updated on the device, the
 * cold part on the CPU, which pools only the bags that hold cold ids,
 * straight into the packed rows that cross, and adds them into the hot
 * pool there. A row is either hot or cold, so each row's update is the one
 * a single table would get.
 */
#include <string.h>

#include <omp.h>

#include "backend/cpu/kernels.h"
#include "core/clock.h"
#include "model/net_ws.h"

static dlrec_status host_forward(dlrec_stage *s, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b,
                                 float *emb, int train) {
  (void)be, (void)train;
  const dlrec_net *n = s->net;
  dlrec_status st = dlrec_net_pool(n, dlrec_backend_default(), n->table, b, ws->h_emb);
  return st == DLREC_OK ? net_ws_upload(ws, emb, ws->h_emb, (size_t)b->rows * n->schema.n_sparse * n->plan.emb_dim)
                        : st;
}

/* The gradient back to the table on the host, and the CPU's update. */
static dlrec_status host_update(dlrec_stage *s, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *b,
                                const float *d_emb, const dlrec_stage_update *u) {
  dlrec_net *n = s->net;
  double t = dlrec_now();
  dlrec_status st = net_sparse_lr(n, opt, u->lr);
  const size_t floats = (size_t)b->rows * n->schema.n_sparse * n->plan.emb_dim;
  const dlrec_bag_batch bags = net_bags_of(n, b);
  if (st == DLREC_OK) st = n->be->ops->download(n->be, ws->h_emb, d_emb, floats * sizeof(float));
  if (st == DLREC_OK)
    st = BE_OP(dlrec_backend_default(), bag_backward_update, n->table, opt->sparse, &bags, n->plan.pooling, ws->h_emb,
               ws->scratch, ws->scratch_bytes);
  net_lap(&ws->prof.emb_update, &t);
  return st;
}

/* The checks of the bags' sizes before the split: the parts' room holds
 * max_hotness ids a row. */
static dlrec_status split_room(const dlrec_net *n, const dlrec_net_ws *ws, const dlrec_bag_batch *bags) {
  const uint32_t B = bags->rows;
  for (uint32_t c = 0; c < bags->cols; c++) {
    const uint64_t ids = bags->offsets[c][B] >= bags->offsets[c][0] ? bags->offsets[c][B] - bags->offsets[c][0] : 0;
    if (ids > (uint64_t)ws->max_batch * n->schema.sparse[c].max_hotness)
      return dlrec_error(DLREC_ERR_INVALID, "column %s: %llu ids in a batch of %u rows, more than its max hotness "
                         "(%u a row) allows", n->schema.sparse[c].name, (unsigned long long)ids, B,
                         n->schema.sparse[c].max_hotness);
  }
  return DLREC_OK;
}

/* The list of the bags (b * F + c ascending) that have cold ids, made in up
 * to COLD_CHUNKS runs of samples (threaded on a large batch): each run's
 * bags counted, the counts summed into each run's start, then each run's
 * bags listed from there. */
static void list_cold(dlrec_net_ws *ws, uint32_t B, uint32_t F) {
  enum { COLD_CHUNKS = 64 };
  uint32_t start[COLD_CHUNKS + 1] = {0};
  const uint32_t runs = B < COLD_CHUNKS ? B : COLD_CHUNKS;
  const int threaded = (uint64_t)B * F >= 32768;
#pragma omp parallel for schedule(static) if (threaded)
  for (uint32_t r = 0; r < runs; r++) {
    uint32_t k = 0;
    for (uint32_t b = (uint32_t)((uint64_t)B * r / runs); b < (uint64_t)B * (r + 1) / runs; b++)
      for (uint32_t c = 0; c < F; c++) k += ws->cold_offsets[c][b + 1] > ws->cold_offsets[c][b];
    start[r + 1] = k;
  }
  for (uint32_t r = 0; r < runs; r++) start[r + 1] += start[r];
#pragma omp parallel for schedule(static) if (threaded)
  for (uint32_t r = 0; r < runs; r++) {
    uint32_t k = start[r];
    for (uint32_t b = (uint32_t)((uint64_t)B * r / runs); b < (uint64_t)B * (r + 1) / runs; b++)
      for (uint32_t c = 0; c < F; c++)
        if (ws->cold_offsets[c][b + 1] > ws->cold_offsets[c][b]) ws->cold_rows[k++] = b * F + c;
  }
  ws->n_cold = start[runs];
}

/* The batch's bags split by where their rows live (n->dhot): hot, the ids
 * of the rows on the device, as that table's rows; cold, the others, as the
 * host table's. Each part keeps its bags' order, and an id's place within
 * its bag. ws->cold_rows lists the bags (b * F + c) that have cold ids. */
static dlrec_status split_bags(const dlrec_net *n, dlrec_net_ws *ws, const dlrec_bag_batch *bags,
                               dlrec_bag_batch *hot, dlrec_bag_batch *cold) {
  const uint32_t B = bags->rows, F = bags->cols;
  *hot = *cold = *bags;
  hot->offsets = (const uint32_t *const *)ws->hot_offsets;
  hot->ids = (const uint32_t *const *)ws->hot_ids;
  cold->offsets = (const uint32_t *const *)ws->cold_offsets;
  cold->ids = (const uint32_t *const *)ws->cold_ids;
  if (ws->split_kept) { /* the update after the forward of the same batch */
    ws->split_kept = 0;
    return DLREC_OK;
  }
  dlrec_status st = split_room(n, ws, bags);
  if (st != DLREC_OK) return st;
  int disordered = 0;
#pragma omp parallel for schedule(dynamic) if ((uint64_t)B * F >= 32768) reduction(| : disordered)
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *off = bags->offsets[c], *ids = bags->ids[c];
    int ordered = 1;
    for (uint32_t b = 0; b < B && ordered; b++) ordered = off[b] <= off[b + 1];
    if (!ordered) { /* the bag ops refuse it, naming what is wrong */
      disordered = 1;
      continue;
    }
    const uint64_t begin = n->schema.sparse[c].id_begin, rows = n->hot_rows[c], base = n->hot_base[c];
    uint32_t *ho = ws->hot_offsets[c], *hi = ws->hot_ids[c], *co = ws->cold_offsets[c], *ci = ws->cold_ids[c];
    uint32_t nh = 0, nc = 0;
    for (uint32_t b = 0; b < B; b++) {
      ho[b] = nh;
      co[b] = nc;
      for (uint32_t k = off[b]; k < off[b + 1]; k++) {
        const uint64_t local = (uint64_t)ids[k] - begin; /* wraps past `rows` below the column's range */
        if (local < rows) hi[nh++] = (uint32_t)(base + local);
        else ci[nc++] = ids[k];
      }
    }
    ho[B] = nh;
    co[B] = nc;
  }
  if (disordered) {
    const dlrec_status e = dlrec_bag_check(n->table, bags);
    return e != DLREC_OK ? e : dlrec_error(DLREC_ERR_INVALID, "a batch's bag offsets are out of order");
  }
  list_cold(ws, B, F);
  return DLREC_OK;
}

/* The two pools added: only the pooled rows with cold ids cross over,
 * pooled packed, so the host writes n_cold rows, not the batch's (B, F, D). */
static dlrec_status hot_forward(dlrec_stage *s, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b,
                                float *emb, int train) {
  const dlrec_net *n = s->net;
  const uint32_t B = b->rows, F = n->schema.n_sparse;
  const size_t D = n->plan.emb_dim, bags_n = (size_t)B * F;
  const dlrec_bag_batch bags = net_bags_of(n, b);
  dlrec_bag_batch hot, cold;
  ws->split_kept = 0; /* a forward splits its own batch */
  dlrec_status st = split_bags(n, ws, &bags, &hot, &cold);
  ws->split_kept = st == DLREC_OK && train; /* a training pass: its update takes this split */
  if (st == DLREC_OK)
    st = cpu_bag_forward_rows(n->table, &cold, n->plan.pooling, ws->cold_rows, ws->n_cold, ws->h_pack);
  if (st == DLREC_OK) st = net_ws_upload(ws, ws->d_cold, ws->h_pack, ws->n_cold * D);
  if (st == DLREC_OK) st = BE_OP(be, bag_forward, emb, n->dhot, &hot, n->plan.pooling);
  for (uint32_t c = 0; st == DLREC_OK && c < F; c++) ws->prof.hot_lookups += hot.offsets[c][B];
  if (st == DLREC_OK) st = BE_OP(be, scatter_add_rows, emb, bags_n, ws->cold_rows, ws->d_cold, ws->n_cold, D);
  return st;
}

/* Hot rows updated there, the others here: the gradient of the pooled rows
 * with cold ids only, packed (the cold bags read no other row of it). */
static dlrec_status hot_update(dlrec_stage *s, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *b,
                               const float *d_emb, const dlrec_stage_update *u) {
  dlrec_net *n = s->net;
  double t = dlrec_now();
  dlrec_status st = net_sparse_lr(n, opt, u->lr);
  const size_t D = n->plan.emb_dim, bags_n = (size_t)b->rows * n->schema.n_sparse;
  const dlrec_bag_batch bags = net_bags_of(n, b);
  dlrec_bag_batch hot, cold;
  if (st == DLREC_OK) st = split_bags(n, ws, &bags, &hot, &cold);
  if (st == DLREC_OK)
    st = BE_OP(n->be, bag_backward_update, n->dhot, opt->dev_sparse, &hot, n->plan.pooling, d_emb, ws->d_scratch,
               ws->d_scratch_bytes);
  if (st == DLREC_OK) st = BE_OP(n->be, gather_rows, ws->d_cold, d_emb, bags_n, ws->cold_rows, ws->n_cold, D);
  if (st == DLREC_OK) st = n->be->ops->download(n->be, ws->h_pack, ws->d_cold, ws->n_cold * D * sizeof(float));
  if (st == DLREC_OK) st = cpu_scatter_rows(ws->h_emb, bags_n, ws->cold_rows, ws->h_pack, ws->n_cold, D);
  if (st == DLREC_OK)
    st = BE_OP(dlrec_backend_default(), bag_backward_update, n->table, opt->sparse, &cold, n->plan.pooling, ws->h_emb,
               ws->scratch, ws->scratch_bytes);
  /* One update count for the two parts, as one table's: it moves when
   * either part updated rows (a 16-bit table's rounding is keyed by it,
   * and the checkpoint keeps the host's). */
  dlrec_sparse_optim_state sh, sd;
  dlrec_sparse_optim_state_view(opt->sparse, &sh);
  dlrec_sparse_optim_state_view(opt->dev_sparse, &sd);
  if (st == DLREC_OK && sh.updates && sd.updates)
    *sh.updates = *sd.updates = *sh.updates > *sd.updates ? *sh.updates : *sd.updates;
  net_lap(&ws->prof.emb_update, &t);
  return st;
}

const dlrec_stage_ops net_stage_host_ops = {
    .name = "host",
    .rows = net_stage_resolve,
    .forward = host_forward,
    .update = host_update,
};

const dlrec_stage_ops net_stage_hot_ops = {
    .name = "hot",
    .rows = net_stage_resolve,
    .forward = hot_forward,
    .update = hot_update,
};
