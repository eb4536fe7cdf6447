/* A network's workspace (dlrec_net_ws), private to src/model/: the buffers
 * of its passes, planned once for batches of up to max_batch rows, those of
 * its embedding stage among them, and the state of a split training step.
 * net_ws.c makes and frees it; net_pass.c, net_score.c and the stages
 * (stage_*.c) use it.
 */
#ifndef DLREC_MODEL_NET_WS_H
#define DLREC_MODEL_NET_WS_H

#include <stdatomic.h>

#include "embed/unique.h"
#include "model/model_type.h"
#include "model/stage.h"

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

/* Fewer rows than this per thread and a step runs whole. */
#define SHARD_MIN_ROWS 32
#define MAX_SHARDS 64

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
   * two (stage_host.c), each column's offsets (max_batch + 1) and ids (its
   * most), host memory; and d_cold, the device's copy of the packed pooled
   * cold rows (added into the hot ones' pool), then of their gradient. */
  uint32_t *hot_offsets[DLREC_MAX_SPARSE], *hot_ids[DLREC_MAX_SPARSE];
  uint32_t *cold_offsets[DLREC_MAX_SPARSE], *cold_ids[DLREC_MAX_SPARSE];
  float *d_cold;
  /* The pooled rows (b * F + c) whose bags have cold ids, n_cold of them,
   * and their rows packed together (host memory): what crosses over. */
  uint32_t *cold_rows, n_cold;
  float *h_pack;
  int split_kept; /* the forward's split stands for the training step's update (stage_host.c) */
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
  /* Split training steps (net_pass.c): one shard per way, made on the first
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
  /* The remote stage (stage_remote.c): the batch's rows, fetched or copied
   * into a table of their own (made on first use), which its forward then
   * reads through rewritten ids. */
  dlrec_table *fetch_table;
  dlrec_unique fetch_unique;
  uint64_t fetch_cap;         /* lookups the arrays below hold */
  uint64_t *fetch_lookups;    /* each lookup's row */
  uint32_t *fetch_ids;        /* each lookup's row of fetch_table */
  uint64_t *fetch_rows;       /* the distinct rows, fetch_table's order */
  uint64_t *fetch_keys;       /* their keys: the row, or a hash table's raw key */
  float *fetch_buf;           /* the rows fetched */
  uint8_t *fetch_found;
  /* The pass under way (net_pass.c): its stage; its rows are [row_base,
   * row_base + rows) of a global batch of global_rows rows (0: the batch is
   * the whole), and with a sum across the parts, the whole pass's one way
   * (part_split), whose batch normalization sums over the parts. */
  dlrec_stage *stage;
  uint32_t row_base, global_rows;
  /* The loss scale for the pass (0: none): the loss's gradient is
   * multiplied by it. */
  float grad_scale;
  /* On a device, a training step's loss comes back once the whole step is
   * queued (loss_later), so that the GPU runs the step without waiting for
   * the host in its middle; it lands in h_loss, one slot for each step
   * queued and not yet taken, with a fence each where the backend has
   * them. queued steps from slot queue_head. */
  int loss_later;
  double *h_loss;
  void *loss_fence[NET_QUEUED];
  uint32_t queue_head, queued;
  net_split part_split;
  const net_split *pass_split;
  double *part_work, *part_slot;
};

/* The batch's bags: its columns' offsets and ids, the network's mean columns. */
static inline dlrec_bag_batch net_bags_of(const dlrec_net *n, const dlrec_batch *b) {
  dlrec_bag_batch bags = {b->rows, n->schema.n_sparse, b->offsets, b->ids, n->mean_cols};
  return bags;
}

/* Copies n floats from the host to dst in ws's backend. */
static inline dlrec_status net_ws_upload(const dlrec_net_ws *ws, float *dst, const float *src, size_t n) {
  return n ? ws->dev_be->ops->upload(ws->dev_be, dst, src, n * sizeof(float)) : DLREC_OK;
}

/* Frees a workspace's split-step shards (net_pass.c makes them). */
void net_shards_free(dlrec_net_ws *ws);
/* The ways a step of B rows splits on a backend that splits T ways: fewer
 * when a way would get less than SHARD_MIN_ROWS rows. */
uint32_t net_ways_of(uint32_t T, uint32_t B);

/* The embedding stage (ws->stage, set by the caller) and the model's
 * forward up to the logits on backend be, keeping every activation for the
 * backward. Scoring passes packed (and no state); training passes the
 * network's writable parameters as state and the step. */
dlrec_status net_run_forward(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                             const dlrec_packed_linear *const *packed, float *state, uint64_t step,
                             const float **logits);
/* prob (B, host) = sigmoid(logits) on be: through ws's copy on a device. */
dlrec_status net_scores_out(dlrec_backend *be, const dlrec_net_ws *ws, float *prob, const float *logits, uint32_t B);

/* The network a scorer scores. */
const dlrec_net *net_scorer_net(const dlrec_net_scorer *s);

/* DLREC_ERR_UNSUPPORTED naming what, on a workspace of a device. */
dlrec_status net_ws_device_refuses(const dlrec_net_ws *ws, const char *what);

/* The local stage's rows (a store's resolve), which the host and hot
 * stages and the remote one resolve their batches with too. */
dlrec_status net_stage_resolve(dlrec_stage *s, dlrec_net_ws *ws, const dlrec_batch *b, dlrec_batch *out, int write);

/* The stages a network picks from (stage_local.c, stage_host.c). */
extern const dlrec_stage_ops net_stage_local_ops, net_stage_host_ops, net_stage_hot_ops;

/* The sparse optimizer's learning rate set for a step (the host's, and the
 * device's copy where the network has one). */
dlrec_status net_sparse_lr(dlrec_net *n, dlrec_net_optim *opt, float lr);

#endif
