/* The local embedding stage (model/stage.h): the table where the network's
 * backend reads it. On the CPU that is the network's store (ram, tiered or
 * hash: a batch's ids are first resolved to the store's resident rows); on
 * a device, the table mirrored in its memory (net_device.c), whose rows are
 * the ids. Pooling and the fused update are the backend's bag ops.
 */
#include "core/clock.h"
#include "model/net_ws.h"

dlrec_status dlrec_net_pool(const dlrec_net *n, dlrec_backend *be, const dlrec_table *table, const dlrec_batch *b,
                            float *emb) {
  const dlrec_bag_batch bags = net_bags_of(n, b);
  return BE_OP(be, bag_forward, emb, table, &bags, n->plan.pooling);
}

dlrec_status net_sparse_lr(dlrec_net *n, dlrec_net_optim *opt, float lr) {
  dlrec_status st = dlrec_sparse_optim_set_lr(opt->sparse, lr);
  if (st == DLREC_OK && opt->dev_sparse && opt->dev_be == n->be) st = dlrec_sparse_optim_set_lr(opt->dev_sparse, lr);
  return st;
}

/* The rows for raw keys (schema.keys): each column's pairs of ids become
 * keys; training resolves them in the hash table (admitting new keys),
 * scoring only looks them up. Either way the keys without a row are left
 * out of their bags. */
static dlrec_status resolve_keys(const dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out,
                                 int write) {
  double t = dlrec_now();
  const uint32_t F = n->schema.n_sparse, B = b->rows;
  const uint64_t *keys[DLREC_MAX_SPARSE];
  const uint32_t *offs[DLREC_MAX_SPARSE];
  uint32_t *row_offs[DLREC_MAX_SPARSE], *row_ids[DLREC_MAX_SPARSE];
  uint64_t at = 0;
  for (uint32_t c = 0; c < F; c++) {
    const uint32_t *bo = b->offsets[c], *w = b->ids[c];
    uint32_t *o = ws->key_offsets + (size_t)c * (ws->max_batch + 1);
    o[0] = 0;
    keys[c] = ws->keys + at;
    row_ids[c] = ws->row_ids + at;
    row_offs[c] = ws->row_offsets + (size_t)c * (ws->max_batch + 1);
    for (uint32_t r = 0; r < B; r++) {
      const uint32_t words = bo[r + 1] - bo[r];
      if (bo[r + 1] < bo[r] || words % 2 || at + words / 2 > ws->keys_cap)
        return dlrec_error(DLREC_ERR_INVALID, "column '%s', row %u: %u ids: raw keys come in pairs of ids, at most "
                           "%u a row", n->schema.sparse[c].name, r, words, n->schema.sparse[c].max_hotness);
      for (uint32_t k = bo[r]; k < bo[r + 1]; k += 2) ws->keys[at++] = (uint64_t)w[k] | (uint64_t)w[k + 1] << 32;
      o[r + 1] = o[r] + words / 2;
    }
    offs[c] = o;
  }
  const dlrec_key_batch kb = {B, F, offs, keys, n->mean_cols};
  dlrec_status st;
  if (write) {
    dlrec_bag_batch r;
    st = dlrec_store_resolve_keys(n->store, &kb, &r, 1);
    for (uint32_t c = 0; st == DLREC_OK && c < F; c++) out->offsets[c] = r.offsets[c], out->ids[c] = r.ids[c];
  } else {
    uint64_t missing = 0;
    st = dlrec_store_lookup_keys(n->store, &kb, row_offs, row_ids, &missing);
    ws->keys_missing += missing;
    for (uint32_t c = 0; st == DLREC_OK && c < F; c++) out->offsets[c] = row_offs[c], out->ids[c] = row_ids[c];
  }
  net_lap(&ws->prof.store, &t);
  return st;
}

/* *out = b with its ids rewritten as rows of the network's resident table
 * (embed/store.h), which the kernels then read; write: the pass will update
 * those rows. A ram store's rows are the ids: *out = b. The host and hot
 * stages resolve their batches so too. */
dlrec_status net_stage_resolve(dlrec_stage *s, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out, int write) {
  const dlrec_net *n = s->net;
  *out = *b;
  if (n->schema.keys && n->schema.n_sparse) return resolve_keys(n, ws, b, out, write);
  if (!n->schema.n_sparse || dlrec_store_get_kind(n->store) == DLREC_STORE_RAM) return DLREC_OK;
  double t = dlrec_now();
  dlrec_bag_batch in = net_bags_of(n, b), r;
  dlrec_status st = dlrec_store_resolve(n->store, &in, &r, write);
  for (uint32_t c = 0; st == DLREC_OK && c < n->schema.n_sparse; c++) out->ids[c] = r.ids[c];
  net_lap(&ws->prof.store, &t);
  return st;
}

static dlrec_status local_forward(dlrec_stage *s, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b,
                                  float *emb, int train) {
  (void)ws, (void)train;
  return dlrec_net_pool(s->net, be, net_table(s->net), b, emb);
}

/* The update on the network's backend: the host's optimizer on the CPU, its
 * mirror on a device. */
static dlrec_status local_update(dlrec_stage *s, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *b,
                                 const float *d_emb, const dlrec_stage_update *u) {
  dlrec_net *n = s->net;
  double t = dlrec_now();
  dlrec_status st = net_sparse_lr(n, opt, u->lr);
  dlrec_sparse_optim *sparse = ws->dev_be ? opt->dev_sparse : opt->sparse;
  const dlrec_bag_batch bags = net_bags_of(n, b);
  if (st == DLREC_OK && n->schema.n_sparse) /* no categorical column: no embedding to update */
    st = BE_OP(n->be, bag_backward_update, (dlrec_table *)net_table(n), sparse, &bags, n->plan.pooling, d_emb,
               ws->scratch, ws->scratch_bytes);
  net_lap(&ws->prof.emb_update, &t);
  return st;
}

const dlrec_stage_ops net_stage_local_ops = {
    .name = "local",
    .splits = 1,
    .rows = net_stage_resolve,
    .forward = local_forward,
    .update = local_update,
};
