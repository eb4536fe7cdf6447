/* A network's workspaces (model/net_ws.h): made for the network's backend
 * and table placement at the time, freed, and sized in advance for the
 * memory a run reports. */
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "model/net_ws.h"

void dlrec_net_ws_profile(const dlrec_net_ws *ws, dlrec_net_profile *p) { *p = ws->prof; }

uint32_t dlrec_net_ws_split(const dlrec_net_ws *ws) { return ws->last_split; }

uint64_t dlrec_net_ws_keys_missing(const dlrec_net_ws *ws) { return ws->keys_missing; }

int dlrec_net_ws_queues(const dlrec_net_ws *ws) { return ws->dev_be != NULL; }

dlrec_status net_ws_device_refuses(const dlrec_net_ws *ws, const char *what) {
  return ws->dev_be ? dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: %s runs on the CPU only for now", ws->dev_be->describe,
                                  what)
                    : DLREC_OK;
}

/* The buffers of a network whose table stays on the host while it runs on
 * a device (stage_host.c): the pooled rows' host copy, and with hot rows
 * the split bags, the packed cold rows and the hot rows' scratch. */
static int host_table_buffers(const dlrec_net *n, dlrec_net_ws *ws, size_t B, size_t emb_floats) {
  const size_t F = n->schema.n_sparse;
  NET_WS_ALLOC(&ws->host, ws->h_emb, emb_floats);
  if (!n->dhot) return 1;
  NET_WS_ALLOC(&ws->arena, ws->d_cold, emb_floats);
  NET_WS_ALLOC(&ws->host, ws->h_pack, emb_floats);
  if (!(ws->cold_rows = dlrec_arena_alloc(&ws->host, (B * F + 1) * sizeof(uint32_t), 64))) return 0;
  ws->d_scratch_bytes = dlrec_bag_backward_scratch_bytes(n->dhot, (uint64_t)B * n->max_ids_per_row);
  if (!(ws->d_scratch = dlrec_arena_alloc(&ws->arena, ws->d_scratch_bytes ? ws->d_scratch_bytes : 1, 64))) return 0;
  for (size_t c = 0; c < F; c++) {
    const size_t offs = (B + 1) * sizeof(uint32_t);
    const size_t ids = (B * n->schema.sparse[c].max_hotness + 1) * sizeof(uint32_t);
    if (!(ws->hot_offsets[c] = dlrec_arena_alloc(&ws->host, offs, 64)) ||
        !(ws->cold_offsets[c] = dlrec_arena_alloc(&ws->host, offs, 64)) ||
        !(ws->hot_ids[c] = dlrec_arena_alloc(&ws->host, ids, 64)) ||
        !(ws->cold_ids[c] = dlrec_arena_alloc(&ws->host, ids, 64)))
      return 0;
  }
  return 1;
nomem:
  return 0;
}

dlrec_status dlrec_net_ws_create(dlrec_net_ws **out, const dlrec_net *n, uint32_t max_batch) {
  *out = NULL;
  if (max_batch < 1 || max_batch > (1u << 22))
    return dlrec_error(DLREC_ERR_INVALID, "batch size %u out of range [1, %u]", max_batch, 1u << 22);
  dlrec_net_ws *ws = calloc(1, sizeof *ws);
  if (!ws) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  ws->max_batch = max_batch;
  ws->type = n->type;
  const dlrec_arena_memory *mem = NULL;
  if (!n->be->host_memory) {
    ws->dev_be = n->be;
    ws->mem = net_arena_memory(n->be);
    mem = &ws->mem;
  }
  dlrec_arena_init_in(&ws->arena, 1u << 20, mem);
  size_t B = max_batch, F = n->schema.n_sparse, D = n->plan.emb_dim;
  /* A model may have no categorical column; the arena wants a size. */
  size_t emb_floats = B * F * D > 0 ? B * F * D : 1;
  dlrec_status s;
  NET_WS_ALLOC(&ws->arena, ws->emb, emb_floats);
  NET_WS_ALLOC(&ws->arena, ws->d_emb, emb_floats);
  NET_WS_ALLOC(&ws->arena, ws->d_logits, B);
  NET_WS_ALLOC(&ws->arena, ws->grad, n->plan.n_params ? n->plan.n_params : 1);
  if (ws->dev_be) {
    NET_WS_ALLOC(&ws->arena, ws->d_dense, B * (n->schema.n_dense ? n->schema.n_dense : 1));
    NET_WS_ALLOC(&ws->arena, ws->d_labels, B);
    NET_WS_ALLOC(&ws->arena, ws->d_prob, B);
    if (!(ws->d_loss = dlrec_arena_alloc(&ws->arena, sizeof(double), 64))) goto nomem;
  }
  ws->host_mem = net_host_arena_memory(n->be);
  dlrec_arena_init_in(&ws->host, 1u << 20, n->be->ops->alloc_host ? &ws->host_mem : NULL);
  if (!(ws->h_loss = dlrec_arena_alloc(&ws->host, NET_QUEUED * sizeof(double), 64))) goto nomem;
  for (int q = 0; ws->dev_be && n->be->ops->fence_create && q < NET_QUEUED; q++)
    if (!(ws->loss_fence[q] = n->be->ops->fence_create(n->be))) goto nomem;
  if (n->schema.keys) { /* the CPU resolves the keys: host memory, on a device too */
    ws->keys_cap = (uint64_t)B * (n->max_ids_per_row / 2);
    const size_t offs = F * (B + 1) * sizeof(uint32_t);
    if (!(ws->keys = dlrec_arena_alloc(&ws->host, (ws->keys_cap + 1) * sizeof *ws->keys, 64)) ||
        !(ws->key_offsets = dlrec_arena_alloc(&ws->host, offs, 64)) ||
        !(ws->row_offsets = dlrec_arena_alloc(&ws->host, offs, 64)) ||
        !(ws->row_ids = dlrec_arena_alloc(&ws->host, (ws->keys_cap + 1) * sizeof *ws->row_ids, 64)))
      goto nomem;
  }
  dlrec_arena *scratch_arena = &ws->arena;
  if (ws->dev_be && n->host_table && F) {
    scratch_arena = &ws->host;
    if (!host_table_buffers(n, ws, B, emb_floats)) goto nomem;
  }
  ws->scratch_bytes = dlrec_bag_backward_scratch_bytes(n->table, (uint64_t)B * n->max_ids_per_row);
  if (!(ws->scratch = dlrec_arena_alloc(scratch_arena, ws->scratch_bytes ? ws->scratch_bytes : 1, 64))) goto nomem;
  if ((s = n->type->ws_create(n->ctx, &n->plan, max_batch, mem, &ws->model_ws)) != DLREC_OK) {
    dlrec_net_ws_free(ws);
    return s;
  }
  *out = ws;
  return DLREC_OK;
nomem:
  dlrec_net_ws_free(ws);
  return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the workspace for batches of %u rows", max_batch);
}

void net_shards_free(dlrec_net_ws *ws) {
  for (uint32_t i = 0; ws->shards && i < ws->n_shards; i++) {
    net_shard *sh = &ws->shards[i];
    if (sh->model_ws) ws->type->ws_free(sh->model_ws);
    dlrec_backend_free(sh->lane);
    free(sh->grad);
    free(sh->d_logits);
    free(sh->split.work);
    if (ws->slots) free(ws->slots[i]);
  }
  free(ws->shards);
  free(ws->slots);
  ws->slots = NULL;
  ws->shards = NULL;
  ws->n_shards = 0;
  ws->shards_be = NULL;
}

void dlrec_net_ws_free(dlrec_net_ws *ws) {
  if (!ws) return;
  net_shards_free(ws);
  if (ws->model_ws) ws->type->ws_free(ws->model_ws);
  for (int q = 0; q < NET_QUEUED; q++)
    if (ws->loss_fence[q]) ws->dev_be->ops->fence_free(ws->dev_be, ws->loss_fence[q]);
  dlrec_arena_free(&ws->arena);
  dlrec_arena_free(&ws->host);
  free(ws->part_work), free(ws->part_slot);
  dlrec_table_free(ws->fetch_table);
  dlrec_unique_free(&ws->fetch_unique);
  free(ws->fetch_lookups), free(ws->fetch_ids), free(ws->fetch_rows), free(ws->fetch_keys);
  free(ws->fetch_buf), free(ws->fetch_found);
  free(ws);
}

/* The arena bytes of a workspace of `rows` rows into *bytes: the whole one,
 * or the model type's own (a way's); 0 when it cannot be made. */
static int ws_arena_bytes(const dlrec_net *n, uint32_t rows, int model_only, uint64_t *bytes) {
  const size_t before = dlrec_arena_thread_bytes();
  dlrec_status s;
  if (model_only) {
    void *mws = NULL;
    s = n->type->ws_create(n->ctx, &n->plan, rows, NULL, &mws);
    if (mws) n->type->ws_free(mws);
  } else {
    dlrec_net_ws *ws = NULL;
    s = dlrec_net_ws_create(&ws, n, rows);
    dlrec_net_ws_free(ws);
  }
  if (s != DLREC_OK) dlrec_clear_error();
  *bytes = dlrec_arena_thread_bytes() - before;
  return s == DLREC_OK;
}

/* bytes(rows), from bytes(64) and bytes(128): every array a workspace holds
 * is a constant or a multiple of the rows, and at multiples of 64 rows each
 * multiple keeps its alignment, so the line through the two is exact there
 * (and within the padding elsewhere). 0 when a workspace cannot be made. */
static int ws_linear_bytes(const dlrec_net *n, uint32_t rows, int model_only, uint64_t *bytes) {
  uint64_t a, b;
  if (!ws_arena_bytes(n, 64, model_only, &a) || !ws_arena_bytes(n, 128, model_only, &b)) return 0;
  const double at = (double)a + ((double)b - (double)a) / 64.0 * ((double)rows - 64.0);
  *bytes = at > 0 ? (uint64_t)at : 0;
  return 1;
}

uint32_t net_ways_of(uint32_t T, uint32_t B) {
  if (T > MAX_SHARDS) T = MAX_SHARDS;
  if (T > B / SHARD_MIN_ROWS) T = B / SHARD_MIN_ROWS;
  return T < 1 ? 1 : T;
}

uint64_t dlrec_net_ws_bytes(const dlrec_net *n, uint32_t rows, uint32_t threads) {
  uint64_t bytes, way;
  if (!ws_linear_bytes(n, rows, 0, &bytes)) return 0;
  const uint32_t ways = net_ways_of(threads, rows);
  if (ways < 2) return bytes;
  const uint32_t share = (rows + ways - 1) / ways;
  if (!ws_linear_bytes(n, share, 1, &way)) return 0;
  return bytes + (uint64_t)ways * (way + ((uint64_t)n->plan.n_params + share) * sizeof(float));
}
