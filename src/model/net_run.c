/* The passes over a network, for every model type: the embedding stage, the
 * model's forward (one, for training and scoring alike), the loss and the
 * model's backward, and the training step (the fused sparse update of the
 * table from d_emb, the dense optimizer over the flat array).
 *   ids -> bags -> emb (B, F, D)
 *   (dense (B, n_dense), emb) -> model forward -> logits (B)
 * Every op runs on a backend (BE_OP): the network's in training, the one a
 * scorer was created with when scoring.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>

#include "backend/cpu/kernels.h"
#include "core/arena.h"
#include "core/clock.h"
#include "model/model_type.h"

/* Where the ways of a split step meet (net_allreduce): a counting barrier
 * that a failed way releases. A way whose pass fails stops making the calls
 * the others wait in; it sets `failed`, and every wait then returns at once,
 * so the step ends with that way's error instead of hanging. */
struct net_sync {
  _Atomic uint32_t arrived, generation;
  _Atomic int failed;
  uint32_t ways;
};

/* How many training steps may be queued before their losses are taken. */
#define NET_QUEUED 2

struct dlrec_net_ws {
  uint32_t max_batch;
  dlrec_arena arena;
  /* Made for a network on a backend whose memory is not the host's: that
   * backend, whose memory the arenas hold (mem), and the pass's dense
   * features, labels, scores and loss copied there and back. */
  dlrec_backend *dev_be;
  dlrec_arena_memory mem;
  float *d_dense, *d_labels, *d_prob;
  double *d_loss;
  float *emb, *d_emb; /* (B, F, D) */
  /* A network whose table stays on the host (dlrec_net_set_host_table) on a
   * device: host memory (its own arena) for the pooled rows on their way
   * over and their gradient on its way back, and scratch below is the host's
   * too, for the CPU's sparse update. NULL otherwise. */
  dlrec_arena host;
  dlrec_arena_memory host_mem; /* the backend's alloc_host, where it has one (pinned on a GPU) */
  float *h_emb;
  /* With hot rows on the device too (n->dhot): the batch's bags split in
   * two (split_bags), each column's offsets (max_batch + 1) and ids (its
   * most), host memory; and d_cold, the device's copy of the packed pooled
   * cold rows (added into the hot ones' pool), then of their gradient. */
  uint32_t *hot_offsets[DLREC_MAX_SPARSE], *hot_ids[DLREC_MAX_SPARSE];
  uint32_t *cold_offsets[DLREC_MAX_SPARSE], *cold_ids[DLREC_MAX_SPARSE];
  float *d_cold;
  /* The pooled rows (b * F + c) whose bags have cold ids, n_cold of them,
   * and their rows packed together (host memory): what crosses over. */
  uint32_t *cold_rows, n_cold;
  float *h_pack;
  int split_kept; /* the forward's split stands for the training step's update (split_bags) */
  void *d_scratch; /* the hot rows' sparse backward's, the device's memory */
  size_t d_scratch_bytes;
  float *d_logits;    /* (B) */
  float *grad;        /* (n_params) */
  void *scratch;      /* the sparse backward's */
  size_t scratch_bytes;
  void *model_ws;     /* the model type's own activations */
  /* The type frees model_ws: a workspace may outlive its network (a server
   * thread frees its workspace after a reload has freed the old network),
   * so it keeps the type, which is static, and not the network. */
  const net_type *type;
  dlrec_net_profile prof;
  /* Split training steps (split_step): one shard per way, made on the first
   * step that splits, for the backend they were made for. */
  uint32_t n_shards;
  struct net_shard *shards;
  double **slots; /* each shard's slot, for net_split */
  struct net_sync sync;
  const dlrec_backend *shards_be;
  uint32_t last_split; /* the ways of the last training step */
  /* Raw keys (schema.keys): a batch's keys, from its pairs of ids, with their
   * offsets (F arrays of max_batch + 1), and for scoring the rows the keys
   * have (offsets and ids, as many); keys_missing counts the scored keys
   * that had none. */
  uint64_t *keys;
  uint32_t *key_offsets, *row_offsets, *row_ids;
  uint64_t keys_cap, keys_missing;
  /* dlrec_net_predict_fetch: the batch's rows, fetched or copied into a
   * table of their own (made on first use), which the forward then reads
   * (table_override) through rewritten ids. */
  dlrec_table *fetch_table;
  const dlrec_table *table_override;
  /* dlrec_net_train_pass: the pass's rows are [row_base, row_base + rows)
   * of a global batch of global_rows rows (0: the batch is the whole), and
   * with a sum across the parts, the whole pass's one way (part_split),
   * whose batch normalization sums over the parts. */
  uint32_t row_base, global_rows;
  /* dlrec_net_train_step's loss scale for the pass (0: none): the loss's
   * gradient is multiplied by it. */
  float grad_scale;
  /* On a device, a training step's loss comes back once the whole step is
   * queued (loss_later), so that the GPU runs the step without waiting for
   * the host in its middle; it lands in h_loss, one slot for each step
   * queued and not yet taken (dlrec_net_train_step_queue), with a fence
   * each where the backend has them. queued steps from slot queue_head. */
  int loss_later;
  double *h_loss;
  void *loss_fence[NET_QUEUED];
  uint32_t queue_head, queued;
  net_split part_split;
  const net_split *pass_split;
  double *part_work, *part_slot;
  uint64_t fetch_cap;
  uint32_t *fetch_rows, *fetch_ids;
  uint64_t *fetch_keys;
  float *fetch_buf;
  uint8_t *fetch_found;
};

/* One way of a split training step: a one-thread lane of the network's
 * backend, its rows' activations and d_logits, and its own dense gradients,
 * which the step sums over the shards after the backward. */
typedef struct net_shard {
  dlrec_backend *lane;
  void *model_ws;
  float *grad;     /* (n_params) */
  float *d_logits; /* (rows) */
  net_split split; /* for models that sum across the ways; its work and the slot in ws->slots are this shard's */
  dlrec_net_profile prof;
} net_shard;


struct dlrec_net_scorer {
  const dlrec_net *net;
  /* The backend that packed the layers: it scores with them and frees them,
   * whatever backend the network is given later. */
  dlrec_backend *be;
  dlrec_packed_linear *packed[NET_MAX_LINEAR];
};

void net_lap(double *acc, double *t) {
  double now = dlrec_now();
  *acc += now - *t;
  *t = now;
}

dlrec_status net_linear_forward(const net_io *io, int layer, float *out, const float *in, int relu) {
  const dlrec_act act = relu ? DLREC_ACT_RELU : DLREC_ACT_NONE;
  if (io->packed) return BE_OP(io->be, packed_forward, out, io->packed[layer], in, io->B, act);
  const net_linear *L = &io->plan->linear[layer];
  const float *w = io->params + L->w, *b = L->b == NET_NO_BIAS ? NULL : io->params + L->b;
  return BE_OP(io->be, linear_forward, out, in, w, b, io->B, (int)L->in, (int)L->out, act);
}

void dlrec_net_ws_profile(const dlrec_net_ws *ws, dlrec_net_profile *p) { *p = ws->prof; }

uint32_t dlrec_net_ws_split(const dlrec_net_ws *ws) { return ws->last_split; }

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
    NET_WS_ALLOC(&ws->host, ws->h_emb, emb_floats);
  }
  if (ws->dev_be && n->host_table && F && n->dhot) {
    NET_WS_ALLOC(&ws->arena, ws->d_cold, emb_floats);
    NET_WS_ALLOC(&ws->host, ws->h_pack, emb_floats);
    if (!(ws->cold_rows = dlrec_arena_alloc(&ws->host, (B * F + 1) * sizeof(uint32_t), 64))) goto nomem;
    ws->d_scratch_bytes = dlrec_bag_backward_scratch_bytes(n->dhot, (uint64_t)B * n->max_ids_per_row);
    if (!(ws->d_scratch = dlrec_arena_alloc(&ws->arena, ws->d_scratch_bytes ? ws->d_scratch_bytes : 1, 64)))
      goto nomem;
    for (size_t c = 0; c < F; c++) {
      const size_t offs = (B + 1) * sizeof(uint32_t);
      const size_t ids = (B * n->schema.sparse[c].max_hotness + 1) * sizeof(uint32_t);
      if (!(ws->hot_offsets[c] = dlrec_arena_alloc(&ws->host, offs, 64)) ||
          !(ws->cold_offsets[c] = dlrec_arena_alloc(&ws->host, offs, 64)) ||
          !(ws->hot_ids[c] = dlrec_arena_alloc(&ws->host, ids, 64)) ||
          !(ws->cold_ids[c] = dlrec_arena_alloc(&ws->host, ids, 64)))
        goto nomem;
    }
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

static void shards_free(dlrec_net_ws *ws) {
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
  shards_free(ws);
  if (ws->model_ws) ws->type->ws_free(ws->model_ws);
  for (int q = 0; q < NET_QUEUED; q++)
    if (ws->loss_fence[q]) ws->dev_be->ops->fence_free(ws->dev_be, ws->loss_fence[q]);
  dlrec_arena_free(&ws->arena);
  dlrec_arena_free(&ws->host);
  free(ws->part_work), free(ws->part_slot);
  dlrec_table_free(ws->fetch_table);
  free(ws->fetch_rows), free(ws->fetch_ids), free(ws->fetch_keys), free(ws->fetch_buf), free(ws->fetch_found);
  free(ws);
}

static dlrec_bag_batch bags_of(const dlrec_net *n, const dlrec_batch *b) {
  dlrec_bag_batch bags = {b->rows, n->schema.n_sparse, b->offsets, b->ids, n->mean_cols};
  return bags;
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
  for (uint32_t c = 0; c < F; c++) { /* the parts' room: max_hotness ids a row (out of order: below) */
    const uint64_t ids = bags->offsets[c][B] >= bags->offsets[c][0] ? bags->offsets[c][B] - bags->offsets[c][0] : 0;
    if (ids > (uint64_t)ws->max_batch * n->schema.sparse[c].max_hotness)
      return dlrec_error(DLREC_ERR_INVALID, "column %s: %llu ids in a batch of %u rows, more than its max hotness "
                         "(%u a row) allows", n->schema.sparse[c].name, (unsigned long long)ids, B,
                         n->schema.sparse[c].max_hotness);
  }
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
  /* The list in bag order, b * F + c ascending, made in up to COLD_CHUNKS
   * runs of samples (threaded on a large batch): each run's bags counted,
   * the counts summed into each run's start, then each run's bags listed
   * from there. */
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
  return DLREC_OK;
}

/* resolve for raw keys (schema.keys): each column's pairs of ids become
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

uint64_t dlrec_net_ws_keys_missing(const dlrec_net_ws *ws) { return ws->keys_missing; }

/* *out = b with its ids rewritten as rows of the network's resident table
 * (embed/store.h), which the kernels then read; write: the pass will update
 * those rows. A ram store's rows are the ids: *out = b. */
static dlrec_status resolve(const dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out,
                            int write) {
  *out = *b;
  if (n->schema.keys && n->schema.n_sparse) return resolve_keys(n, ws, b, out, write);
  if (!n->schema.n_sparse || dlrec_store_get_kind(n->store) == DLREC_STORE_RAM) return DLREC_OK;
  double t = dlrec_now();
  dlrec_bag_batch in = bags_of(n, b), r;
  dlrec_status st = dlrec_store_resolve(n->store, &in, &r, write);
  for (uint32_t c = 0; st == DLREC_OK && c < n->schema.n_sparse; c++) out->ids[c] = r.ids[c];
  net_lap(&ws->prof.store, &t);
  return st;
}

/* A pass's view on backend be; state (the writable parameters) only in training. */
static net_io io_of(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                    const dlrec_packed_linear *const *packed, float *state, uint64_t step) {
  net_io io = {.be = be,
               .B = (int)b->rows,
               .dense = b->dense,
               .emb = ws->emb,
               .params = net_params(n),
               .plan = &n->plan,
               .packed = packed,
               .prof = &ws->prof,
               .train = state != NULL,
               .step = step,
               .row0 = ws->row_base,
               .split = state ? ws->pass_split : NULL,
               .state = state ? net_params(n) : NULL};
  return io;
}

/* ---- a workspace on a backend whose memory is not the host's ---- */

/* DLREC_OK when ws was made for backend be's memory (the host's, or be's own). */
static dlrec_status ws_fits(const dlrec_net_ws *ws, const dlrec_backend *be) {
  if (ws->dev_be == (be->host_memory ? NULL : be)) return DLREC_OK;
  return dlrec_error(DLREC_ERR_INVALID, "a workspace made for %s used on %s: make it after dlrec_net_set_backend",
                     ws->dev_be ? ws->dev_be->describe : "host memory", be->describe);
}

/* Copies n floats from the host to dst in ws's backend. */
static dlrec_status ws_upload(const dlrec_net_ws *ws, float *dst, const float *src, size_t n) {
  return n ? ws->dev_be->ops->upload(ws->dev_be, dst, src, n * sizeof(float)) : DLREC_OK;
}

/* prob (B, host) = sigmoid(logits) on be: through ws's copy on a device. */
static dlrec_status scores_out(dlrec_backend *be, const dlrec_net_ws *ws, float *prob, const float *logits, uint32_t B) {
  if (!ws->dev_be) return BE_OP(be, sigmoid, prob, logits, (size_t)B);
  dlrec_status st = BE_OP(be, sigmoid, ws->d_prob, logits, (size_t)B);
  return st == DLREC_OK ? be->ops->download(be, prob, ws->d_prob, (size_t)B * sizeof(float)) : st;
}

static dlrec_status device_refuses(const dlrec_net_ws *ws, const char *what) {
  return ws->dev_be ? dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: %s runs on the CPU only for now", ws->dev_be->describe,
                                  what)
                    : DLREC_OK;
}

/* The embedding stage and the model's forward up to the logits on backend
 * be, keeping every activation for the backward. Scoring passes packed (and
 * no state); training passes the network's writable parameters as state and
 * the step. */
static dlrec_status run_forward(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                                const dlrec_packed_linear *const *packed, float *state, uint64_t step,
                                const float **logits) {
  if (b->rows < 1 || b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  dlrec_status st = ws_fits(ws, be);
  if (st == DLREC_OK && ws->table_override) st = device_refuses(ws, "scoring with rows from elsewhere");
  if (st != DLREC_OK) return st;
  int B = (int)b->rows, F = (int)n->schema.n_sparse;
  if (ws->dev_be && !ws->h_emb != !(n->host_table && F))
    return dlrec_error(DLREC_ERR_INVALID, "a workspace made for a table in %s used with one in %s",
                       ws->h_emb ? "host memory" : "device memory", ws->h_emb ? "device memory" : "host memory");
  if (ws->dev_be && ws->h_emb && !ws->d_cold != !n->dhot)
    return dlrec_error(DLREC_ERR_INVALID, "a workspace made %s hot rows on the device used with a network %s them",
                       ws->d_cold ? "for" : "without", n->dhot ? "with" : "without");
  dlrec_net_profile *p = &ws->prof;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(n, b);
  const dlrec_table *table = ws->table_override ? ws->table_override : net_table(n);
  /* On a device the dense features travel first; the bags' ids go with the bag op. */
  dlrec_batch db = *b;
  if (ws->dev_be && b->dense) {
    st = ws_upload(ws, ws->d_dense, b->dense, (size_t)B * n->schema.n_dense);
    db.dense = ws->d_dense;
  }
  if (st == DLREC_OK && F && ws->d_cold) { /* hot rows on the device, the rest on the host: the two pools added */
    dlrec_bag_batch hot, cold;
    const size_t D = n->plan.emb_dim, bags_n = (size_t)B * F;
    ws->split_kept = 0; /* a forward splits its own batch */
    st = split_bags(n, ws, &bags, &hot, &cold);
    ws->split_kept = st == DLREC_OK && state; /* a training pass: its update takes this split */
    /* Only the pooled rows with cold ids cross over, pooled packed: the
     * host writes n_cold rows, not the batch's (B, F, D). */
    if (st == DLREC_OK)
      st = cpu_bag_forward_rows(table, &cold, n->plan.pooling, ws->cold_rows, ws->n_cold, ws->h_pack);
    if (st == DLREC_OK) st = ws_upload(ws, ws->d_cold, ws->h_pack, ws->n_cold * D);
    if (st == DLREC_OK) st = BE_OP(be, bag_forward, ws->emb, n->dhot, &hot, n->plan.pooling);
    for (int c = 0; st == DLREC_OK && c < F; c++) p->hot_lookups += hot.offsets[c][B];
    if (st == DLREC_OK) st = BE_OP(be, scatter_add_rows, ws->emb, bags_n, ws->cold_rows, ws->d_cold, ws->n_cold, D);
  } else if (st == DLREC_OK && F && ws->h_emb) { /* the table on the host: pooled there, the rows sent over */
    st = BE_OP(dlrec_backend_default(), bag_forward, ws->h_emb, table, &bags, n->plan.pooling);
    if (st == DLREC_OK) st = ws_upload(ws, ws->emb, ws->h_emb, (size_t)B * F * n->plan.emb_dim);
  } else if (st == DLREC_OK && F) {
    st = BE_OP(be, bag_forward, ws->emb, table, &bags, n->plan.pooling);
  }
  for (int c = 0; st == DLREC_OK && c < F; c++) p->lookups += b->offsets[c][B] - b->offsets[c][0];
  net_lap(&p->emb_forward, &t);
  net_io io = io_of(n, be, ws, &db, packed, state, step);
  if (st == DLREC_OK) st = n->type->forward(n->ctx, ws->model_ws, &io, logits);
  p->forward_rows += (uint64_t)B;
  return st;
}

/* Loss and backward down to ws->grad (dense) and ws->d_emb, on the network's backend. */
static dlrec_status run_backward(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, const float *logits,
                                 uint64_t step, double *loss) {
  if (!b->labels) return dlrec_error(DLREC_ERR_INVALID, "training needs labeled data");
  int B = (int)b->rows;
  dlrec_net_profile *p = &ws->prof;
  double t = dlrec_now();
  const float *labels = b->labels;
  double *l = loss;
  dlrec_status st = DLREC_OK;
  if (ws->dev_be) { /* the labels there, the loss back */
    st = ws_upload(ws, ws->d_labels, b->labels, (size_t)B);
    labels = ws->d_labels;
    l = ws->d_loss;
  }
  if (st == DLREC_OK) st = BE_OP(n->be, bce_forward, l, logits, labels, B);
  if (st == DLREC_OK && ws->dev_be && !ws->loss_later) st = n->be->ops->download(n->be, loss, l, sizeof *loss);
  if (st == DLREC_OK) st = BE_OP(n->be, bce_backward, ws->d_logits, logits, labels, B);
  /* A part of a global batch: its gradient is its own mean's times its
   * share of the rows, as a way of split_step scales it; times the loss
   * scale (a power of two: the product is exact). */
  float factor = ws->global_rows && ws->global_rows != (uint32_t)B ? (float)B / (float)ws->global_rows : 1.0f;
  if (ws->grad_scale > 0) factor *= ws->grad_scale;
  if (st == DLREC_OK && factor != 1.0f) st = BE_OP(n->be, scale, ws->d_logits, (size_t)B, factor);
  if (st == DLREC_OK) st = BE_OP(n->be, fill_rows, ws->grad, n->plan.n_params, 1, n->plan.n_params, 0.0f);
  net_lap(&p->other, &t);
  dlrec_batch db = *b; /* on a device, the dense features run_forward copied there */
  if (ws->dev_be && b->dense) db.dense = ws->d_dense;
  net_io io = io_of(n, n->be, ws, &db, NULL, n->params, step);
  if (st == DLREC_OK) st = n->type->backward(n->ctx, ws->model_ws, &io, ws->d_logits, ws->grad, ws->d_emb);
  p->backward_rows += (uint64_t)B;
  return st;
}

/* ---- batch-invariant scoring ---------------------------------------------- */

void dlrec_net_scorer_free(dlrec_net_scorer *s) {
  if (!s) return;
  for (uint32_t l = 0; l < NET_MAX_LINEAR; l++)
    if (s->packed[l]) BE_OP(s->be, packed_free, s->packed[l]);
  free(s);
}

dlrec_status dlrec_net_scorer_create(dlrec_net_scorer **out, const dlrec_net *n) {
  *out = NULL;
  dlrec_net_scorer *s = calloc(1, sizeof *s);
  if (!s) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->net = n;
  s->be = n->be;
  dlrec_status st = DLREC_OK;
  /* Layers are packed from host arrays: on a device, its parameters' copy
   * brought over (the host's may be older). */
  const float *params = n->params;
  float *fetched = NULL;
  if (n->dparams) {
    const size_t bytes = net_params_bytes(n);
    if (!(fetched = malloc(bytes))) st = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    if (st == DLREC_OK) st = n->dev_be->ops->download(n->dev_be, fetched, n->dparams, bytes);
    params = fetched;
  }
  for (uint32_t l = 0; st == DLREC_OK && l < n->plan.n_linear; l++) {
    const net_linear *L = &n->plan.linear[l];
    const float *bias = L->b == NET_NO_BIAS ? NULL : params + L->b;
    st = BE_OP(s->be, packed_create, &s->packed[l], params + L->w, bias, (int)L->in, (int)L->out);
  }
  free(fetched);
  if (st != DLREC_OK) {
    dlrec_net_scorer_free(s);
    return st;
  }
  *out = s;
  return DLREC_OK;
}

dlrec_status dlrec_net_predict(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch, float *prob) {
  const float *logits = NULL;
  dlrec_batch rb, *b = &rb;
  dlrec_status st = resolve(s->net, ws, batch, &rb, 0);
  if (st == DLREC_OK)
    st = run_forward(s->net, s->be, ws, b, (const dlrec_packed_linear *const *)s->packed, NULL, 0, &logits);
  if (st == DLREC_OK) st = scores_out(s->be, ws, prob, logits, b->rows);
  return st;
}

dlrec_status dlrec_net_predict_rows(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch,
                                    const dlrec_table *table, float *prob) {
  ws->table_override = table;
  dlrec_status st = dlrec_net_predict(s, ws, batch, prob);
  ws->table_override = NULL;
  return st;
}

static int cmp_u32(const void *a, const void *b) {
  const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* The fetch scratch for n rows of the table's dim, made or grown once. */
static dlrec_status fetch_reserve(const dlrec_net *n, dlrec_net_ws *ws, uint64_t rows) {
  if (rows <= ws->fetch_cap) return DLREC_OK;
  const uint32_t D = n->plan.emb_dim;
  dlrec_table_free(ws->fetch_table);
  free(ws->fetch_rows), free(ws->fetch_ids), free(ws->fetch_keys), free(ws->fetch_buf), free(ws->fetch_found);
  ws->fetch_table = NULL;
  ws->fetch_cap = 0;
  ws->fetch_rows = malloc(rows * sizeof *ws->fetch_rows);
  ws->fetch_ids = malloc(rows * sizeof *ws->fetch_ids);
  ws->fetch_keys = malloc(rows * sizeof *ws->fetch_keys);
  ws->fetch_buf = malloc(rows * D * sizeof *ws->fetch_buf);
  ws->fetch_found = malloc(rows);
  dlrec_status st = ws->fetch_rows && ws->fetch_ids && ws->fetch_keys && ws->fetch_buf && ws->fetch_found
                        ? dlrec_table_create(&ws->fetch_table, rows, D)
                        : dlrec_error(DLREC_ERR_NOMEM, "out of memory for the rows of a batch");
  if (st == DLREC_OK) ws->fetch_cap = rows;
  return st;
}

dlrec_status dlrec_net_predict_fetch(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch,
                                     float *prob, dlrec_row_fetch fetch, void *ctx) {
  const dlrec_net *n = s->net;
  const uint32_t F = n->schema.n_sparse, D = n->plan.emb_dim;
  dlrec_batch rb;
  dlrec_status st = fetch ? device_refuses(ws, "scoring with rows fetched from the Redis tier") : DLREC_OK;
  if (st == DLREC_OK) st = resolve(n, ws, batch, &rb, 0);
  if (st != DLREC_OK || !F || !fetch) return st == DLREC_OK ? dlrec_net_predict(s, ws, batch, prob) : st;
  /* The rows the bags read, each once, in row order. */
  uint64_t total = 0;
  for (uint32_t c = 0; c < F; c++) total += rb.offsets[c][rb.rows] - rb.offsets[c][0];
  if ((st = fetch_reserve(n, ws, total ? total : 1)) != DLREC_OK) return st;
  uint64_t at = 0;
  for (uint32_t c = 0; c < F; c++)
    for (uint32_t k = rb.offsets[c][0]; k < rb.offsets[c][rb.rows]; k++) ws->fetch_rows[at++] = rb.ids[c][k];
  qsort(ws->fetch_rows, total, sizeof *ws->fetch_rows, cmp_u32);
  uint64_t u = 0;
  for (uint64_t i = 0; i < total; i++)
    if (!u || ws->fetch_rows[i] != ws->fetch_rows[u - 1]) ws->fetch_rows[u++] = ws->fetch_rows[i];
  /* Their keys: the ids, or a hash table's raw keys. */
  const dlrec_store *store = dlrec_net_store(n);
  const int hash = dlrec_store_get_kind(store) == DLREC_STORE_HASH;
  for (uint64_t j = 0; j < u; j++)
    if (!hash || !dlrec_store_key_of(store, ws->fetch_rows[j], &ws->fetch_keys[j])) ws->fetch_keys[j] = ws->fetch_rows[j];
  double t = dlrec_now();
  st = fetch(ctx, ws->fetch_keys, u, ws->fetch_buf, ws->fetch_found);
  net_lap(&ws->prof.store, &t);
  if (st != DLREC_OK) return st;
  /* Fetched rows, or the table's own. */
  float row[DLREC_EMBED_MAX_DIM];
  for (uint64_t j = 0; j < u; j++) {
    const float *r = ws->fetch_buf + j * D;
    if (!ws->fetch_found[j]) {
      dlrec_table_get_row(n->table, ws->fetch_rows[j], row);
      r = row;
    }
    dlrec_table_set_row(ws->fetch_table, j, r);
  }
  /* The bags' ids, as rows of that table. */
  at = 0;
  for (uint32_t c = 0; c < F; c++) {
    uint32_t *ids = ws->fetch_ids + at;
    for (uint32_t k = rb.offsets[c][0]; k < rb.offsets[c][rb.rows]; k++) {
      const uint32_t *p = bsearch(&rb.ids[c][k], ws->fetch_rows, u, sizeof *ws->fetch_rows, cmp_u32);
      ids[k - rb.offsets[c][0]] = (uint32_t)(p - ws->fetch_rows);
    }
    at += rb.offsets[c][rb.rows] - rb.offsets[c][0];
    rb.ids[c] = ids - rb.offsets[c][0];
  }
  const float *logits = NULL;
  ws->table_override = ws->fetch_table;
  st = run_forward(n, s->be, ws, &rb, (const dlrec_packed_linear *const *)s->packed, NULL, 0, &logits);
  ws->table_override = NULL;
  if (st == DLREC_OK) st = BE_OP(s->be, sigmoid, prob, logits, (size_t)rb.rows);
  return st;
}

/* ---- split training steps ------------------------------------------------------------ */

/* Fewer rows than this per thread and a step runs whole. */
#define SHARD_MIN_ROWS 32
#define MAX_SHARDS 64

/* Whether the model's pass sums across the ways (net_allreduce): it has
 * buffers, i.e. batch normalization. */
static int needs_sync(const dlrec_net *n) { return n->plan.n_params > n->plan.n_trainable; }

/* The output width of the plan's widest linear layer: what batch
 * normalization's scratch is sized by (4 doubles a column of work, 2 of slot). */
static size_t widest_linear(const dlrec_net *n) {
  size_t widest = 1;
  for (uint32_t l = 0; l < n->plan.n_linear; l++)
    if (n->plan.linear[l].out > widest) widest = n->plan.linear[l].out;
  return widest;
}

static dlrec_status shards_create(const dlrec_net *n, dlrec_net_ws *ws, uint32_t T) {
  uint32_t rows = (ws->max_batch + T - 1) / T;
  ws->shards = calloc(T, sizeof *ws->shards);
  if (!ws->shards) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  ws->n_shards = T;
  ws->shards_be = n->be;
  for (uint32_t i = 0; i < T; i++) {
    net_shard *sh = &ws->shards[i];
    dlrec_status s = backend_lane_create(n->be, &sh->lane);
    if (s == DLREC_OK) s = n->type->ws_create(n->ctx, &n->plan, rows, NULL, &sh->model_ws);
    if (s != DLREC_OK) {
      shards_free(ws);
      return s;
    }
    sh->grad = calloc(n->plan.n_params ? n->plan.n_params : 1, sizeof(float)); /* zero between steps */
    sh->d_logits = malloc(rows * sizeof(float));
    if (!sh->grad || !sh->d_logits) {
      shards_free(ws);
      return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the split step's workspaces");
    }
  }
  if (!needs_sync(n)) return DLREC_OK;
  /* Batch normalization sums its statistics across the ways: scratch and a
   * slot per way, sized by the widest layer it could normalize. */
  const size_t widest = widest_linear(n);
  ws->slots = calloc(T, sizeof *ws->slots);
  for (uint32_t i = 0; ws->slots && i < T; i++) {
    net_shard *sh = &ws->shards[i];
    sh->split = (net_split){.ways = T, .way = i, .work = malloc(4 * widest * sizeof(double)), .slots = ws->slots,
                            .sync = &ws->sync};
    ws->slots[i] = malloc(2 * widest * sizeof(double));
    if (!sh->split.work || !ws->slots[i]) break;
  }
  if (!ws->slots || !ws->shards[T - 1].split.work || !ws->slots[T - 1]) {
    shards_free(ws);
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the split step's batch-normalization scratch");
  }
  ws->sync.ways = T;
  return DLREC_OK;
}

/* Waits until every way arrives; 0 when a way failed (it will not come). */
static int sync_wait(struct net_sync *y) {
  const uint32_t gen = atomic_load_explicit(&y->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&y->arrived, 1, memory_order_acq_rel) + 1 == y->ways) {
    atomic_store_explicit(&y->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&y->generation, 1, memory_order_release);
    return 1;
  }
  for (unsigned spins = 0; atomic_load_explicit(&y->generation, memory_order_acquire) == gen; spins++) {
    if (atomic_load_explicit(&y->failed, memory_order_acquire)) return 0;
    if (spins >= 64) sched_yield();
  }
  return 1;
}

void net_allreduce(const net_io *io, double *v, size_t n) {
  const net_split *sp = io->split;
  /* One way of a part of a step across processes (dlrec_net_train_pass):
   * the processes' sum. A failed sum leaves the job to end (the caller's
   * communicator aborts); the statistics here are then the part's own. */
  if (sp && sp->ways == 1 && sp->sum) {
    (void)sp->sum(sp->sum_ctx, v, n);
    return;
  }
  if (!sp || sp->ways < 2) return;
  memcpy(sp->slots[sp->way], v, n * sizeof(double));
  if (!sync_wait(sp->sync)) return;
  for (size_t i = 0; i < n; i++) {
    double acc = sp->slots[0][i];
    for (uint32_t k = 1; k < sp->ways; k++) acc += sp->slots[k][i];
    v[i] = acc;
  }
  sync_wait(sp->sync); /* no way overwrites its slot before every way has read it */
}

/* The rows [r0, r1) of batch b as a batch of their own. */
static dlrec_batch sub_batch(const dlrec_batch *b, uint32_t F, uint32_t n_dense, uint32_t r0, uint32_t r1) {
  dlrec_batch s = *b;
  s.rows = r1 - r0;
  s.labels = b->labels ? b->labels + r0 : NULL;
  s.dense = b->dense ? b->dense + (size_t)r0 * n_dense : NULL;
  for (uint32_t c = 0; c < F; c++) s.offsets[c] = b->offsets[c] + r0;
  return s;
}

/* The ways a step splits: the backend's (backend_split_ways), unless the
 * batch gives a way fewer than SHARD_MIN_ROWS rows. */
static uint32_t ways_of(uint32_t T, uint32_t B) {
  if (T > MAX_SHARDS) T = MAX_SHARDS;
  if (T > B / SHARD_MIN_ROWS) T = B / SHARD_MIN_ROWS;
  return T < 1 ? 1 : T;
}

static uint32_t split_ways(const dlrec_net *n, uint32_t B) { return ways_of(backend_split_ways(n->be), B); }

uint64_t dlrec_net_ws_bytes(const dlrec_net *n, uint32_t rows, uint32_t threads) {
  uint64_t bytes, way;
  if (!ws_linear_bytes(n, rows, 0, &bytes)) return 0;
  const uint32_t ways = ways_of(threads, rows);
  if (ways < 2) return bytes;
  const uint32_t share = (rows + ways - 1) / ways;
  if (!ws_linear_bytes(n, share, 1, &way)) return 0;
  return bytes + (uint64_t)ways * (way + ((uint64_t)n->plan.n_params + share) * sizeof(float));
}

/* Starts (on) or ends a training pass's shortcuts on be (backend_impl.h),
 * unless dlrec_net_set_keep_operands turned them off: kept operands (the
 * pass writes no layer's input or weights between its forward and its
 * backward) and fresh gradients (the backward finds them zeroed: a split
 * step's shards are zeroed as they are summed, and run_backward fills
 * ws->grad with zeros before the model's backward). */
static void keep_operands(const dlrec_net *n, dlrec_backend *be, int on) {
  if (n->keep_off) return;
  if (be->ops->keep_operands) be->ops->keep_operands(be, on);
  if (be->ops->fresh_gradients) be->ops->fresh_gradients(be, on);
}

/* The forward, loss and backward of a training step with the batch split
 * into T contiguous row ranges, one per thread, each through the whole
 * network on one thread; then every thread sums its slice of the dense
 * gradients over the shards, in shard order. One parallel region instead of
 * one per kernel: at small batches waking the team for each kernel cost
 * more than the kernels. Results are bitwise reproducible for a given T. */
static dlrec_status split_step(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, uint64_t step, uint32_t T,
                               double *loss_sum, float *prob, int *whole) {
  if (b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  if (!b->labels) return dlrec_error(DLREC_ERR_INVALID, "training needs labeled data");
  dlrec_status s = DLREC_OK;
  if (ws->n_shards != T || ws->shards_be != n->be) {
    shards_free(ws);
    if ((s = shards_create(n, ws, T)) != DLREC_OK) return s;
  }
  const uint32_t B = b->rows, F = n->schema.n_sparse, D = n->plan.emb_dim, nd = n->schema.n_dense;
  /* A part of a global batch (dlrec_net_train_pass) scales by its share of
   * the global batch, and its rows' dropout masks are the global rows'. */
  const uint32_t G = ws->global_rows ? ws->global_rows : B, row_base = ws->row_base;
  const dlrec_table *table = ws->table_override ? ws->table_override : n->table;
  const size_t n_params = n->plan.n_params;
  dlrec_status st[MAX_SHARDS];
  double part[MAX_SHARDS];
  char msg[MAX_SHARDS][256];
  dlrec_bag_batch all = bags_of(n, b);
  const int sync = needs_sync(n);
  *whole = 0; /* set when the team came smaller than the ways that must meet: the caller runs the step whole */
  atomic_store(&ws->sync.arrived, 0);
  atomic_store(&ws->sync.failed, 0);
  double t = dlrec_now();
#pragma omp parallel num_threads(T)
  {
    /* A team smaller than asked for (OMP_DYNAMIC, a thread limit) runs
     * several shards per thread: the shards, not the team, fix the bits.
     * Ways that meet (batch normalization) need one thread each. */
    const uint32_t tid = (uint32_t)omp_get_thread_num(), nth = (uint32_t)omp_get_num_threads();
    if (sync && nth != T && tid == 0) *whole = 1;
    for (uint32_t i = tid; i < T && !(sync && nth != T); i += nth) {
      const uint32_t r0 = (uint32_t)((uint64_t)B * i / T), r1 = (uint32_t)((uint64_t)B * (i + 1) / T);
      const int rows = (int)(r1 - r0);
      net_shard *sh = &ws->shards[i];
      dlrec_backend *lane = sh->lane;
      dlrec_batch sb = sub_batch(b, F, nd, r0, r1);
      dlrec_bag_batch bags = bags_of(n, &sb);
      float *emb = ws->emb + (size_t)r0 * F * D, *d_emb = ws->d_emb + (size_t)r0 * F * D;
      const float *logits = NULL;
      double l = 0, t1 = dlrec_now();
      dlrec_status s1 = F ? BE_OP(lane, bag_forward, emb, table, &bags, n->plan.pooling) : DLREC_OK;
      net_lap(&sh->prof.emb_forward, &t1);
      net_io io = {.be = lane, .B = rows, .dense = sb.dense, .emb = emb, .params = n->params, .plan = &n->plan,
                   .prof = &sh->prof, .train = 1, .step = step, .row0 = row_base + r0, .state = n->params,
                   .split = sync ? &sh->split : NULL};
      sh->split.rows = B;
      keep_operands(n, lane, 1);
      if (s1 == DLREC_OK) s1 = n->type->forward(n->ctx, sh->model_ws, &io, &logits);
      if (s1 == DLREC_OK && prob) s1 = BE_OP(lane, sigmoid, prob + r0, logits, (size_t)rows);
      if (s1 == DLREC_OK) s1 = BE_OP(lane, bce_forward, &l, logits, sb.labels, rows);
      if (s1 == DLREC_OK) s1 = BE_OP(lane, bce_backward, sh->d_logits, logits, sb.labels, rows);
      /* The loss is the whole batch's mean: each shard's gradient is its
       * own mean's times its share of the rows (times the loss scale). */
      const float share = (float)rows / (float)G * (ws->grad_scale > 0 ? ws->grad_scale : 1.0f);
      if (s1 == DLREC_OK) s1 = BE_OP(lane, scale, sh->d_logits, (size_t)rows, share);
      if (s1 == DLREC_OK) s1 = n->type->backward(n->ctx, sh->model_ws, &io, sh->d_logits, sh->grad, d_emb);
      keep_operands(n, lane, 0);
      part[i] = l * rows;
      st[i] = s1;
      if (s1 != DLREC_OK) {
        snprintf(msg[i], sizeof msg[i], "%s", dlrec_last_error());
        atomic_store(&ws->sync.failed, 1); /* releases the ways waiting for this one */
      }
    }
#pragma omp barrier
    /* Each thread sums a slice of the gradients over the shards, in shard
     * order, and zeroes the shards' slices as it goes, so that the next
     * step's backward finds them zeroed without a pass of its own. */
    const size_t j0 = n_params * tid / nth, j1 = n_params * (tid + 1) / nth;
    float *restrict out = ws->grad;
    float *restrict g0 = ws->shards[0].grad;
    for (size_t j = j0; j < j1; j++) {
      out[j] = g0[j];
      g0[j] = 0.0f;
    }
    for (uint32_t k = 1; k < T; k++) {
      float *restrict gk = ws->shards[k].grad;
      for (size_t j = j0; j < j1; j++) {
        out[j] += gk[j];
        gk[j] = 0.0f;
      }
    }
  }
  if (*whole) return DLREC_OK;
  double sum = 0;
  for (uint32_t i = 0; i < T; i++) {
    if (st[i] != DLREC_OK) return dlrec_error(st[i], "%s", msg[i]);
    sum += part[i];
  }
  *loss_sum = sum;
  dlrec_net_profile *p = &ws->prof, *p0 = &ws->shards[0].prof;
  for (int c = 0; c < (int)F; c++) p->lookups += all.offsets[c][B] - all.offsets[c][0];
  p->forward_rows += B;
  p->backward_rows += B;
  /* The shards ran side by side: shard 0's phases stand for the step's,
   * and the rest of the region (the loss, the gradients' sum) counts as
   * other. */
  const double region = dlrec_now() - t, inner = p0->emb_forward + p0->mlp + p0->interaction;
  p->emb_forward += p0->emb_forward;
  p->mlp += p0->mlp;
  p->interaction += p0->interaction;
  p->other += region > inner ? region - inner : 0;
  for (uint32_t i = 0; i < T; i++) {
    p->mlp_flops += ws->shards[i].prof.mlp_flops;
    memset(&ws->shards[i].prof, 0, sizeof ws->shards[i].prof);
  }
  return DLREC_OK;
}

/* ---- training --------------------------------------------------------------- */

dlrec_status dlrec_net_gradients(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, double *loss,
                                 const float **grad, const float **d_emb) {
  const float *logits = NULL;
  dlrec_batch rb;
  dlrec_status st = device_refuses(ws, "dlrec_net_gradients (host pointers)");
  if (st == DLREC_OK) st = resolve(n, ws, batch, &rb, 0);
  if (st == DLREC_OK) st = run_forward(n, n->be, ws, &rb, NULL, n->params, 0, &logits);
  if (st == DLREC_OK) st = run_backward(n, ws, &rb, logits, 0, loss);
  *grad = ws->grad;
  *d_emb = ws->d_emb;
  return st;
}

/* The forward, loss and backward of a training step, split T ways across
 * the threads (split_ways) or whole (T = 1): the dense gradients in
 * ws->grad, d_emb, and the loss: the batch's mean into *loss, or the sum
 * over its rows into *loss_sum. */
static dlrec_status step_pass(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, uint64_t step, uint32_t T,
                              double *loss, double *loss_sum, float *prob) {
  int whole = 0;
  double sum = 0, mean = 0;
  dlrec_status st = DLREC_OK;
  if (T > 1) st = split_step(n, ws, batch, step, T, &sum, prob, &whole);
  if (whole) T = 1; /* the ways that must meet had no thread each */
  ws->last_split = T;
  if (T > 1) mean = sum / batch->rows;
  if (T == 1) {
    const float *logits = NULL;
    keep_operands(n, n->be, 1);
    st = run_forward(n, n->be, ws, batch, NULL, n->params, step, &logits);
    if (st == DLREC_OK && prob) st = scores_out(n->be, ws, prob, logits, batch->rows);
    if (st == DLREC_OK) st = run_backward(n, ws, batch, logits, step, &mean);
    keep_operands(n, n->be, 0);
    sum = mean * batch->rows;
  }
  if (loss) *loss = mean;
  if (loss_sum) *loss_sum = sum;
  return st;
}

int dlrec_net_has_batchnorm(const dlrec_net *n) { return needs_sync(n); }

dlrec_status dlrec_net_train_pass(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, const dlrec_table *table,
                                  uint32_t global_rows, uint32_t row_base, uint64_t step, dlrec_sum_fn sum,
                                  void *sum_ctx, double *loss_sum, float **grad, float **d_emb) {
  *grad = ws->grad;
  *d_emb = ws->d_emb;
  *loss_sum = 0;
  dlrec_status refused = device_refuses(ws, "training across ranks");
  if (refused != DLREC_OK) return refused;
  if (batch->rows > global_rows || (uint64_t)row_base + batch->rows > global_rows)
    return dlrec_error(DLREC_ERR_INVALID, "train_pass: rows [%u, %u) outside a global batch of %u", row_base,
                       row_base + batch->rows, global_rows);
  const int sync = needs_sync(n) && sum;
  if (sync && !ws->part_work) {
    /* The one way's scratch and slot, sized as a split step's (shards_create). */
    const size_t widest = widest_linear(n);
    ws->part_work = malloc(4 * widest * sizeof(double));
    ws->part_slot = malloc(2 * widest * sizeof(double));
    if (!ws->part_work || !ws->part_slot)
      return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the batch normalization's scratch");
  }
  if (batch->rows == 0) {
    /* A part with no rows adds nothing; with batch normalization the other
     * parts would wait for its sums, so the caller must not get here. */
    memset(ws->grad, 0, n->plan.n_params * sizeof(float));
    return sync ? dlrec_error(DLREC_ERR_INTERNAL, "train_pass: a part of 0 rows with batch normalization")
                : DLREC_OK;
  }
  ws->table_override = table;
  ws->row_base = row_base;
  ws->global_rows = global_rows;
  if (sync) {
    ws->part_split = (net_split){.ways = 1, .way = 0, .rows = global_rows, .work = ws->part_work,
                                 .slots = &ws->part_slot, .sync = &ws->sync, .sum = sum, .sum_ctx = sum_ctx};
    ws->pass_split = &ws->part_split;
  }
  /* With sums across the parts the pass runs whole: its one way meets the
   * other parts' through ws->pass_split. */
  const uint32_t T = sync ? 1 : split_ways(n, batch->rows);
  dlrec_status st = step_pass(n, ws, batch, step, T, NULL, loss_sum, NULL);
  ws->table_override = NULL;
  ws->pass_split = NULL;
  ws->row_base = ws->global_rows = 0;
  return st;
}

dlrec_status net_clip_scale(double sq, float max_norm, uint64_t step, float *scale) {
  const double norm = sqrt(sq);
  *scale = 1.0f;
  if (!isfinite(norm))
    return dlrec_error(DLREC_ERR_INVALID, "training diverged at step %llu (the gradient norm is %g): lower the "
                       "learning rates or add warmup", (unsigned long long)step, norm);
  const double coef = (double)max_norm / (norm + 1e-6);
  if (coef < 1.0) *scale = (float)coef;
  return DLREC_OK;
}

dlrec_status net_clip(float *grad, size_t n_grad, float *d_emb, size_t n_emb, double sq, float max_norm,
                      uint64_t step) {
  float c;
  dlrec_status st = net_clip_scale(sq, max_norm, step, &c);
  if (st != DLREC_OK || c == 1.0f) return st;
  for (size_t i = 0; i < n_grad; i++) grad[i] *= c;
  for (size_t i = 0; i < n_emb; i++) d_emb[i] *= c;
  return DLREC_OK;
}

/* Gradient-norm clipping of the step's dense gradients and d_emb (B rows):
 * the squares summed in double on the host, in order (on a device, over
 * copies brought back), then both scaled by the backend where the norm is
 * over. */
static dlrec_status clip(dlrec_net *n, dlrec_net_ws *ws, uint32_t B, float max_norm, uint64_t step) {
  const size_t n_grad = n->plan.n_trainable, n_emb = (size_t)B * n->schema.n_sparse * n->plan.emb_dim;
  const float *grad = ws->grad, *d_emb = ws->d_emb;
  float *host = NULL;
  dlrec_status st = DLREC_OK;
  if (ws->dev_be) {
    if (!(host = malloc((n_grad + n_emb + 1) * sizeof(float)))) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    st = ws->dev_be->ops->download(ws->dev_be, host, ws->grad, n_grad * sizeof(float));
    if (st == DLREC_OK) st = ws->dev_be->ops->download(ws->dev_be, host + n_grad, ws->d_emb, n_emb * sizeof(float));
    grad = host, d_emb = host + n_grad;
  }
  double sq = 0;
  for (size_t i = 0; st == DLREC_OK && i < n_grad; i++) sq += (double)grad[i] * grad[i];
  for (size_t i = 0; st == DLREC_OK && i < n_emb; i++) sq += (double)d_emb[i] * d_emb[i];
  free(host);
  float c = 1.0f;
  if (st == DLREC_OK) st = net_clip_scale(sq, max_norm, step, &c);
  if (st != DLREC_OK || c == 1.0f) return st;
  st = BE_OP(n->be, scale, ws->grad, n_grad, c);
  return st == DLREC_OK ? BE_OP(n->be, scale, ws->d_emb, n_emb, c) : st;
}

dlrec_status dlrec_net_loss_scale_update(dlrec_net_optim *opt, int finite, uint64_t step) {
  if (finite) {
    if (opt->scale_growth_interval && ++opt->scale_good_steps >= opt->scale_growth_interval) {
      opt->scale_good_steps = 0;
      if (opt->loss_scale < DLREC_LOSS_SCALE_MAX) opt->loss_scale *= 2.0f;
    }
    return DLREC_OK;
  }
  opt->skipped_steps++;
  opt->scale_good_steps = 0;
  if (!opt->scale_growth_interval) return DLREC_OK;
  if (opt->loss_scale <= 1.0f)
    return dlrec_error(DLREC_ERR_INVALID, "training diverged at step %llu: the gradients are not finite at a loss "
                       "scale of %g; lower the learning rates or add warmup", (unsigned long long)step,
                       (double)opt->loss_scale);
  opt->loss_scale *= 0.5f;
  return DLREC_OK;
}

/* A loss-scaled step's gradients: *finite whether the dense gradients and
 * d_emb (B rows) all are, and if so both divided by the scale. */
static dlrec_status unscale(dlrec_net *n, dlrec_net_ws *ws, uint32_t B, float scale, int *finite) {
  const size_t n_grad = n->plan.n_trainable, n_emb = (size_t)B * n->schema.n_sparse * n->plan.emb_dim;
  dlrec_status st = BE_OP(n->be, all_finite, finite, ws->grad, n_grad);
  if (st == DLREC_OK && *finite) st = BE_OP(n->be, all_finite, finite, ws->d_emb, n_emb);
  if (st != DLREC_OK || !*finite || scale == 1.0f) return st;
  st = BE_OP(n->be, scale, ws->grad, n_grad, 1.0f / scale);
  return st == DLREC_OK ? BE_OP(n->be, scale, ws->d_emb, n_emb, 1.0f / scale) : st;
}

static dlrec_status update(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *batch,
                           float lr_scale, uint64_t step);

/* The step: its pass, update and (a host's) loss into *loss; on a device,
 * its loss on its way to *loss (host memory), there once the backend's
 * queue has run to its end. */
static dlrec_status train_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *given,
                               float lr_scale, uint64_t step, double *loss, float *prob) {
  dlrec_batch resolved;
  dlrec_status st = resolve(n, ws, given, &resolved, 1);
  if (st == DLREC_OK && ws->dev_be) st = net_optim_device(n, opt);
  ws->grad_scale = opt->loss_scale;
  ws->loss_later = ws->dev_be != NULL;
  if (st == DLREC_OK) st = step_pass(n, ws, &resolved, step, split_ways(n, resolved.rows), loss, NULL, prob);
  ws->grad_scale = 0;
  ws->loss_later = 0;
  if (st == DLREC_OK) st = update(n, ws, opt, &resolved, lr_scale, step);
  /* On a device, the loss once the step is queued (a skipped step's too). */
  if (st == DLREC_OK && ws->dev_be)
    st = n->be->ops->download_async ? n->be->ops->download_async(n->be, loss, ws->d_loss, sizeof *loss)
                                    : n->be->ops->download(n->be, loss, ws->d_loss, sizeof *loss);
  return st;
}

dlrec_status dlrec_net_train_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *given,
                                  float lr_scale, uint64_t step, double *loss, float *prob) {
  if (ws->queued)
    return dlrec_error(DLREC_ERR_INVALID, "train_step: %u step%s queued: take %s loss first", ws->queued,
                       ws->queued == 1 ? "" : "s", ws->queued == 1 ? "its" : "their");
  dlrec_status st = train_step(n, ws, opt, given, lr_scale, step, ws->h_loss, prob);
  if (st == DLREC_OK && ws->dev_be) st = n->be->ops->synchronize(n->be);
  if (st == DLREC_OK) *loss = ws->h_loss[0];
  return st;
}

dlrec_status dlrec_net_train_step_queue(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt,
                                        const dlrec_batch *batch, float lr_scale, uint64_t step) {
  if (ws->queued >= NET_QUEUED)
    return dlrec_error(DLREC_ERR_INVALID, "train_step_queue: %u steps queued already: take a loss first", ws->queued);
  const uint32_t q = (ws->queue_head + ws->queued) % NET_QUEUED;
  dlrec_status st = train_step(n, ws, opt, batch, lr_scale, step, &ws->h_loss[q], NULL);
  if (st == DLREC_OK && ws->loss_fence[q]) st = n->be->ops->fence_record(n->be, ws->loss_fence[q]);
  if (st == DLREC_OK) ws->queued++;
  return st;
}

int dlrec_net_ws_queues(const dlrec_net_ws *ws) { return ws->dev_be != NULL; }

dlrec_status dlrec_net_train_step_loss(dlrec_net_ws *ws, double *loss) {
  if (!ws->queued) return dlrec_error(DLREC_ERR_INVALID, "train_step_loss: no step queued");
  const uint32_t q = ws->queue_head;
  dlrec_status st = DLREC_OK;
  if (ws->loss_fence[q]) st = ws->dev_be->ops->fence_wait(ws->dev_be, ws->loss_fence[q]);
  else if (ws->dev_be) st = ws->dev_be->ops->synchronize(ws->dev_be);
  ws->queue_head = (q + 1) % NET_QUEUED;
  ws->queued--;
  if (st == DLREC_OK) *loss = ws->h_loss[q];
  return st;
}

/* The step's update after its pass: the loss scale's check, clipping, the
 * sparse update and the dense optimizer's step. */
static dlrec_status update(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *batch,
                           float lr_scale, uint64_t step) {
  dlrec_status st = DLREC_OK;
  if (opt->loss_scale > 0) {
    int finite = 0;
    st = unscale(n, ws, batch->rows, opt->loss_scale, &finite);
    if (st == DLREC_OK) st = dlrec_net_loss_scale_update(opt, finite, step);
    if (st != DLREC_OK || !finite) return st; /* skipped: nothing updated */
  }
  if (opt->clip_grad_norm > 0) st = clip(n, ws, batch->rows, opt->clip_grad_norm, step);
  if (st != DLREC_OK) return st;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(n, batch);
  /* On a device the optimizers' copies there step (the host's keep the
   * learning rate in step); a table on the host has its optimizer there. */
  dlrec_sparse_optim *sparse = ws->dev_be && !ws->h_emb ? opt->dev_sparse : opt->sparse;
  st = dlrec_sparse_optim_set_lr(opt->sparse, opt->sparse_lr * lr_scale);
  if (st == DLREC_OK && opt->dev_sparse && opt->dev_be == n->be)
    st = dlrec_sparse_optim_set_lr(opt->dev_sparse, opt->sparse_lr * lr_scale);
  if (st == DLREC_OK && n->schema.n_sparse && ws->d_cold) { /* hot rows updated there, the others here */
    dlrec_bag_batch hot, cold;
    const size_t D = n->plan.emb_dim, bags_n = (size_t)batch->rows * n->schema.n_sparse;
    st = split_bags(n, ws, &bags, &hot, &cold);
    if (st == DLREC_OK)
      st = BE_OP(n->be, bag_backward_update, n->dhot, opt->dev_sparse, &hot, n->plan.pooling, ws->d_emb,
                 ws->d_scratch, ws->d_scratch_bytes);
    /* The gradient of the pooled rows with cold ids only, packed; the cold
     * bags read no other row of it. */
    if (st == DLREC_OK) st = BE_OP(n->be, gather_rows, ws->d_cold, ws->d_emb, bags_n, ws->cold_rows, ws->n_cold, D);
    if (st == DLREC_OK) st = n->be->ops->download(n->be, ws->h_pack, ws->d_cold, ws->n_cold * D * sizeof(float));
    if (st == DLREC_OK) st = cpu_scatter_rows(ws->h_emb, bags_n, ws->cold_rows, ws->h_pack, ws->n_cold, D);
    if (st == DLREC_OK)
      st = BE_OP(dlrec_backend_default(), bag_backward_update, n->table, opt->sparse, &cold, n->plan.pooling,
                 ws->h_emb, ws->scratch, ws->scratch_bytes);
    /* One update count for the two parts, as one table's: it moves when
     * either part updated rows (a 16-bit table's rounding is keyed by it,
     * and the checkpoint keeps the host's). */
    dlrec_sparse_optim_state sh, sd;
    dlrec_sparse_optim_state_view(opt->sparse, &sh);
    dlrec_sparse_optim_state_view(opt->dev_sparse, &sd);
    if (st == DLREC_OK && sh.updates && sd.updates)
      *sh.updates = *sd.updates = *sh.updates > *sd.updates ? *sh.updates : *sd.updates;
  } else if (st == DLREC_OK && n->schema.n_sparse && ws->h_emb) { /* the gradient back to the table on the host */
    const size_t floats = (size_t)batch->rows * n->schema.n_sparse * n->plan.emb_dim;
    st = n->be->ops->download(n->be, ws->h_emb, ws->d_emb, floats * sizeof(float));
    if (st == DLREC_OK)
      st = BE_OP(dlrec_backend_default(), bag_backward_update, n->table, sparse, &bags, n->plan.pooling, ws->h_emb,
                 ws->scratch, ws->scratch_bytes);
  } else if (st == DLREC_OK && n->schema.n_sparse) { /* no categorical column: no embedding to update */
    st = BE_OP(n->be, bag_backward_update, (dlrec_table *)net_table(n), sparse, &bags, n->plan.pooling, ws->d_emb,
               ws->scratch, ws->scratch_bytes);
  }
  net_lap(&ws->prof.emb_update, &t);
  if (st != DLREC_OK) return st;
  dlrec_optim_config dense = opt->dense;
  dense.lr = opt->dense.lr * lr_scale;
  /* The trainable prefix only: buffers have no gradient and are not stepped. */
  st = BE_OP(n->be, optim_step, &dense, net_params(n), ws->grad, ws->dev_be ? opt->dev_dense_state : opt->dense_state,
             n->plan.n_trainable, step);
  net_lap(&ws->prof.other, &t);
  return st;
}
