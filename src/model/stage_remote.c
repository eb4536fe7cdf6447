/* The remote embedding stage (model/stage.h): read-only rows from another
 * process, a server's Redis tier (src/serve/redis_tier.c), in front of the
 * network's own table. Per batch, the rows its bags read are gathered,
 * each once (embed/unique.h), asked of the fetch callback by key (the row's
 * id, or the raw key a hash table's row holds), and written into a small
 * table of the workspace's, the network's own rows standing in for those
 * not fetched; the batch's ids are rewritten as rows of that table, which
 * the bag forward then reads. Scoring only, on the CPU.
 */
#include <stdlib.h>

#include "core/clock.h"
#include "model/net_ws.h"

typedef struct remote {
  dlrec_row_fetch fetch;
  void *ctx;
} remote;

/* The fetch scratch for n lookups of the table's dim, made or grown once. */
static dlrec_status fetch_reserve(const dlrec_net *n, dlrec_net_ws *ws, uint64_t n_lookups) {
  if (n_lookups <= ws->fetch_cap) return DLREC_OK;
  const uint32_t D = n->plan.emb_dim;
  dlrec_table_free(ws->fetch_table);
  free(ws->fetch_lookups), free(ws->fetch_ids), free(ws->fetch_rows), free(ws->fetch_keys);
  free(ws->fetch_buf), free(ws->fetch_found);
  ws->fetch_table = NULL;
  ws->fetch_cap = 0;
  ws->fetch_lookups = malloc(n_lookups * sizeof *ws->fetch_lookups);
  ws->fetch_ids = malloc(n_lookups * sizeof *ws->fetch_ids);
  ws->fetch_rows = malloc(n_lookups * sizeof *ws->fetch_rows);
  ws->fetch_keys = malloc(n_lookups * sizeof *ws->fetch_keys);
  ws->fetch_buf = malloc(n_lookups * D * sizeof *ws->fetch_buf);
  ws->fetch_found = malloc(n_lookups);
  dlrec_status st = ws->fetch_lookups && ws->fetch_ids && ws->fetch_rows && ws->fetch_keys && ws->fetch_buf &&
                            ws->fetch_found
                        ? dlrec_table_create(&ws->fetch_table, n_lookups, D)
                        : dlrec_error(DLREC_ERR_NOMEM, "out of memory for the rows of a batch");
  if (st == DLREC_OK) st = dlrec_unique_reserve(&ws->fetch_unique, n_lookups);
  if (st == DLREC_OK) ws->fetch_cap = n_lookups;
  return st;
}

/* The distinct rows' keys: the ids, or a hash table's raw keys. */
static void fetch_keys(const dlrec_net *n, dlrec_net_ws *ws, uint64_t u) {
  const dlrec_store *store = n->store;
  const int hash = dlrec_store_get_kind(store) == DLREC_STORE_HASH;
  for (uint64_t j = 0; j < u; j++)
    if (!hash || !dlrec_store_key_of(store, (uint32_t)ws->fetch_rows[j], &ws->fetch_keys[j]))
      ws->fetch_keys[j] = ws->fetch_rows[j];
}

static dlrec_status remote_rows(dlrec_stage *s, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out, int write) {
  const dlrec_net *n = s->net;
  const remote *r = s->ctx;
  const uint32_t F = n->schema.n_sparse, D = n->plan.emb_dim;
  if (write) return dlrec_error(DLREC_ERR_INTERNAL, "the remote tier's rows are read-only");
  dlrec_status st = net_ws_device_refuses(ws, "scoring with rows fetched from the Redis tier");
  if (st == DLREC_OK) st = net_stage_resolve(s, ws, b, out, 0);
  if (st != DLREC_OK || !F) return st;
  /* The rows the bags read, each once, in the order they come. */
  uint64_t total = 0;
  for (uint32_t c = 0; c < F; c++) total += out->offsets[c][out->rows] - out->offsets[c][0];
  if ((st = fetch_reserve(n, ws, total ? total : 1)) != DLREC_OK) return st;
  uint64_t at = 0, u = 0;
  for (uint32_t c = 0; c < F; c++)
    for (uint32_t k = out->offsets[c][0]; k < out->offsets[c][out->rows]; k++) ws->fetch_lookups[at++] = out->ids[c][k];
  dlrec_unique_run(&ws->fetch_unique, ws->fetch_lookups, total, ws->fetch_rows, &u, ws->fetch_ids);
  fetch_keys(n, ws, u);
  double t = dlrec_now();
  st = r->fetch(r->ctx, ws->fetch_keys, u, ws->fetch_buf, ws->fetch_found);
  net_lap(&ws->prof.store, &t);
  if (st != DLREC_OK) return st;
  /* Fetched rows, or the table's own. */
  float row[DLREC_EMBED_MAX_DIM];
  for (uint64_t j = 0; j < u; j++) {
    const float *x = ws->fetch_buf + j * D;
    if (!ws->fetch_found[j]) {
      dlrec_table_get_row(n->table, ws->fetch_rows[j], row);
      x = row;
    }
    dlrec_table_set_row(ws->fetch_table, j, x);
  }
  /* The bags' ids, as rows of that table. */
  at = 0;
  for (uint32_t c = 0; c < F; c++) {
    out->ids[c] = ws->fetch_ids + at - out->offsets[c][0];
    at += out->offsets[c][out->rows] - out->offsets[c][0];
  }
  return DLREC_OK;
}

static dlrec_status remote_forward(dlrec_stage *s, dlrec_net_ws *ws, dlrec_backend *be, const dlrec_batch *b,
                                   float *emb, int train) {
  (void)train;
  dlrec_status st = net_ws_device_refuses(ws, "scoring with rows from elsewhere");
  return st == DLREC_OK ? dlrec_net_pool(s->net, be, ws->fetch_table, b, emb) : st;
}

static const dlrec_stage_ops remote_ops = {
    .name = "remote",
    .rows = remote_rows,
    .forward = remote_forward,
};

dlrec_status dlrec_net_predict_fetch(const dlrec_net_scorer *sc, dlrec_net_ws *ws, const dlrec_batch *batch,
                                     float *prob, dlrec_row_fetch fetch, void *ctx) {
  dlrec_stage *own = dlrec_net_stage(net_scorer_net(sc));
  if (!fetch) return dlrec_net_predict_stage(sc, ws, own, batch, prob);
  remote r = {fetch, ctx};
  dlrec_stage s = {.ops = &remote_ops, .net = own->net, .ctx = &r};
  return dlrec_net_predict_stage(sc, ws, &s, batch, prob);
}
