/* What a model type implements, and the helpers the generic code gives it.
 * A type is a small vtable (net_type) registered by name in registry.c; the
 * generic code (model.c, net_pass.c, the stages, train/step.c) owns the
 * embedding stage, the loss, the sparse update and the dense optimizer, so
 * a type only plans its dense tensors and maps (dense features, pooled
 * embeddings) to logits and back.
 *
 * Adding a model type: a new src/model/NAME.c defining a `const net_type`
 * (its export_onnx and its test configs too: the generic tests, the ONNX
 * check and the benchmark iterate the registry), one line in registry.c,
 * its example config and its docs. The vtable's optional entries and the
 * default workspace keep the file to what the model computes.
 */
#ifndef DLREC_MODEL_TYPE_H
#define DLREC_MODEL_TYPE_H

#include "backend/dispatch.h"
#include "core/arena.h"
#include "model/dlrm.h"
#include "model/model.h"
#include "model/stage.h"
#include "nn/block.h"

struct onnx_graph; /* core/onnx.h */

/* A model section's optional "pooling" ("sum" or "mean"; absent: *pooling
 * stays); config_to_json writes it back with dlrec_pooling_name. */
dlrec_status net_config_pooling(const cJSON *o, const char *what, dlrec_pooling *pooling);
/* model.embedding_init (embedding_init.c): reads the key's value v (the
 * model section named model_what) into c, or adds it to the section m when
 * it is not the default. */
dlrec_status net_embedding_init_parse(dlrec_embedding_init_config *c, const cJSON *v, const char *model_what);
void net_embedding_init_to_json(const dlrec_embedding_init_config *c, cJSON *m);

/* A model section the generic tests build the type from (tests/test_models.c
 * and tests/onnx/run.sh read them through dlrec_net_type_test_config): the
 * JSON object of its keys beside "type", and which of the heavier checks it
 * joins (DLREC_NET_TEST_*); every one of them runs the light ones. */
typedef struct net_test_config {
  const char *model;
  unsigned checks;
} net_test_config;

/* The workspace a type describes by its arrays (net_type.ws_arrays): each
 * net_ws_rows call carves rows x per_row floats out of the workspace's arena
 * (rows: the largest batch), each net_ws_floats call n floats, 64-byte
 * aligned, in the order of the calls; a failure leaves the pointer NULL and
 * fails the workspace. */
typedef struct net_ws_alloc {
  dlrec_arena *arena;
  size_t rows;
  int failed;
} net_ws_alloc;
void net_ws_rows(net_ws_alloc *a, float **ptr, size_t per_row);
void net_ws_floats(net_ws_alloc *a, float **ptr, size_t n);

/* A model type. Entries marked optional may be NULL: the registry's copy of
 * the type (the one networks hold, registry.c) has the default there. */
typedef struct net_type {
  const char *name;
  const char *doc; /* one line: what the model is (`dlrec models`, `dlrec train --help`) */
  /* Config: defaults, the type's keys of the "model" object (which also
   * holds "type"; keys the type does not know are errors), and to JSON. The
   * config is the type's own struct in dlrec_net_config.params, zeroed
   * before config_default fills it. */
  void (*config_default)(void *cfg);
  dlrec_status (*config_parse)(void *cfg, const cJSON *o, const char *what);
  void (*config_to_json)(const void *cfg, cJSON *o);
  /* The type's context: ctx_size bytes, zeroed, which plan fills and the
   * network frees (an error from plan frees it too). plan adds the tensors
   * and linear layers for schema to p, checking cfg against schema. */
  size_t ctx_size;
  dlrec_status (*plan)(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx);
  /* Initializes the dense tensors from seed. */
  void (*init)(const void *ctx, const net_plan *p, float *params, uint64_t seed);
  /* The type's own activations for batches of up to a->rows rows: a struct
   * of ws_size bytes whose first member is a dlrec_arena (the default
   * workspace's, zeroed), and whose arrays ws_arrays carves out of it with
   * net_ws_rows and net_ws_floats. */
  size_t ws_size;
  void (*ws_arrays)(const void *ctx, void *ws, net_ws_alloc *a);
  /* Optional, both or neither, for a workspace that is more than arrays:
   * its activations for batches of up to max_batch rows, in an arena of
   * memory mem (NULL: the host's; else the backend's, which the host must
   * not touch). Default: the struct and arrays above. */
  dlrec_status (*ws_create)(const void *ctx, const net_plan *p, uint32_t max_batch, const dlrec_arena_memory *mem,
                            void **ws);
  void (*ws_free)(void *ws);
  /* The forward pass to the logits (B), kept in the type's workspace until
   * the next pass (*logits points there), with every activation backward
   * needs. Written once: training and scoring run it. */
  dlrec_status (*forward)(const void *ctx, void *ws, const net_io *io, const float **logits);
  /* The backward pass from d_logits (B): the dense gradients into grad
   * (zeroed by the caller) and d_emb (B, F, D). */
  dlrec_status (*backward)(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *grad,
                           float *d_emb);
  /* Optional: the ONNX export (export_onnx.c): adds to g the nodes from the
   * tensors named dense ((N, n_dense) float32; NULL without dense columns)
   * and emb ((N, F, D) pooled embeddings; NULL without categorical columns)
   * to the logits (N, 1), whose name it returns; the same function as
   * forward when scoring. Default: none (dlrec export refuses the type). */
  const char *(*export_onnx)(const void *ctx, const net_plan *p, const float *params, struct onnx_graph *g,
                             const char *dense, const char *emb);
  /* The generic tests' configs of the type, ended by one whose model is NULL. */
  const net_test_config *tests;
} net_type;

/* The registered type of that name (the registry's copy, every optional
 * entry set), or NULL; net_type_unknown is the error naming the known ones. */
const net_type *net_type_find(const char *name);
dlrec_status net_type_unknown(const char *what, const char *type);

/* The model's parsed settings inside a config. */
static inline void *net_config_params(dlrec_net_config *c) { return c->params; }

/* The network: its type, context, plan, parameters and table (model.c). */
struct dlrec_net {
  const net_type *type;
  void *ctx;
  dlrec_net_config config;
  dlrec_schema schema;
  net_plan plan;
  float *params;
  dlrec_store *store;  /* where the embedding rows live (embed/store.h) */
  dlrec_table *table;  /* the store's resident table, which the kernels gather from */
  dlrec_backend *be;        /* borrowed (dlrec_net_set_backend); the default backend unless set */
  uint64_t max_ids_per_row; /* sum of the columns' max hotness */
  /* On a backend whose memory is not the host's (net_device.c): the dense
   * parameters and the table mirrored in it, which the passes use; the
   * host's params and table are the checkpoints' copies, current after
   * dlrec_net_sync_host. NULL otherwise. */
  dlrec_backend *dev_be;
  float *dparams;
  dlrec_table *dtable;
  int host_table;           /* dlrec_net_set_host_table: on a device, the table stays in host memory */
  int keep_off;             /* dlrec_net_set_keep_operands(n, 0) */
  /* With the table in host memory, its hot rows on the device
   * (dlrec_net_set_hot_fraction): column c's first hot_rows[c] rows (the
   * most frequent values: the ETL orders them so) at hot_base[c] of dhot,
   * a run of `hot` (hot_runs of them, the columns with any); the bag ops
   * split each batch (stage_host.c). dhot is NULL without hot rows. */
  float hot_fraction;
  uint64_t hot_rows[DLREC_MAX_SPARSE], hot_base[DLREC_MAX_SPARSE], hot_total;
  backend_rows hot[DLREC_MAX_SPARSE];
  uint32_t hot_runs;
  dlrec_table *dhot;
  /* Hot row i's row in the host's table (the backend's memory): keys a
   * 16-bit row's rounding as the host table's row (the optimizer's row keys). */
  uint64_t *hot_keys;
  int tableless;            /* dlrec_net_create_tableless: the table is a placeholder row */
  /* Per column: pools by its mean because the ETL schema declares it so
   * (multi=NAME:SEP:mean); the config's pooling applies to the others. */
  uint8_t mean_cols[DLREC_MAX_SPARSE];
  /* The network's embedding stage (model/stage.h), local or host, picked by
   * net_stage_pick whenever the backend or the table's placement changes. */
  dlrec_stage stage;
};

/* Picks the network's own stage from its backend and table placement. */
void net_stage_pick(dlrec_net *n);

/* In a ws_create: ptr = `floats` floats from arena, 64-byte aligned, or
 * goto nomem. */
#define NET_WS_ALLOC(arena, ptr, floats)                                                  \
  do {                                                                                    \
    if (!((ptr) = dlrec_arena_alloc((arena), (floats) * sizeof(float), 64))) goto nomem; \
  } while (0)

/* ---- a network on a backend whose memory is not the host's (net_device.c) ---- */

/* The parameters and table the passes use: the device's mirrors, or the host's. */
static inline float *net_params(const dlrec_net *n) { return n->dparams ? n->dparams : n->params; }
static inline const dlrec_table *net_table(const dlrec_net *n) { return n->dtable ? n->dtable : n->table; }
/* The bytes of the dense parameters' array (one float when there are none). */
static inline size_t net_params_bytes(const dlrec_net *n) {
  return (n->plan.n_params ? n->plan.n_params : 1) * sizeof(float);
}
/* What a network on backend be needs that this one may lack (a RAM table,
 * one process, no raw keys): DLREC_OK or why not. */
dlrec_status net_device_check(const dlrec_net *n, const dlrec_backend *be);
/* Frees the mirrors, without copying them back. */
void net_device_drop(dlrec_net *n);
/* The optimizer's state mirrored for n's backend, made from the host's on
 * first use. */
dlrec_status net_optim_device(dlrec_net *n, dlrec_net_optim *opt);
/* Host memory for an arena of be's memory (the workspaces). */
dlrec_arena_memory net_arena_memory(dlrec_backend *be);
/* An arena's memory from be's alloc_host (be must have one): host memory
 * for what crosses to and from be each step. */
dlrec_arena_memory net_host_arena_memory(dlrec_backend *be);

#endif
