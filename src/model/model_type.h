/* What a model type implements, and the helpers the generic code gives it.
 * A type is a small vtable (net_type) registered by name in model.c; the
 * generic code (model.c, net_pass.c, the stages, train/step.c) owns the embedding stage, the loss, the
 * sparse update and the dense optimizer, so a type only plans its dense
 * tensors and maps (dense features, pooled embeddings) to logits and back.
 *
 * Adding a model type: a new src/model/NAME.c defining a `const net_type`
 * (its export_onnx too, which tests/onnx/run.sh checks), one line in
 * model.c's registry, its example config and its docs.
 */
#ifndef DLREC_MODEL_TYPE_H
#define DLREC_MODEL_TYPE_H

#include "backend/backend_impl.h"
#include "core/arena.h"
#include "model/dlrm.h"
#include "model/model.h"
#include "model/stage.h"

struct onnx_graph; /* model/onnx.h */

/* Linear layers of one network: DCN-v2's mixture of K low-rank experts
 * plans 3K + 1 per cross layer (each packed for scoring). */
#define NET_MAX_LINEAR 128
#define NET_MAX_BUFFERS 16 /* buffers of one network */

/* A linear layer of the plan: weight (out, in) and bias (out) at these
 * offsets of the flat dense array. The generic scorer packs every planned
 * linear layer for the batch-invariant kernel. */
typedef struct net_linear {
  uint32_t in, out;
  size_t w, b; /* b is NET_NO_BIAS for a layer without a bias */
} net_linear;

/* A linear layer's b when it has no bias (a type that registers a layer
 * over its own tensors, as DCN-v2's cross layers, may set it). */
#define NET_NO_BIAS SIZE_MAX

/* The plan of a network: its named tensors, its linear layers, and what the
 * embedding stage must hand it.
 *
 * Besides the trainable tensors a plan may hold BUFFERS (batch
 * normalization's running statistics): named tensors that checkpoints store
 * and the training forward moves, but that have no gradient and that the
 * dense optimizer never steps. They sit after every trainable tensor in the
 * flat array, [n_trainable, n_params), so the optimizer steps one prefix;
 * model.c places them there once the type's plan is done. */
typedef struct net_plan {
  uint32_t emb_dim;         /* D of emb (B, F, D) */
  dlrec_bag_mode pooling;   /* how multi-hot bags pool */
  uint32_t n_tensors;
  dlrec_net_tensor tensors[DLREC_NET_MAX_TENSORS];
  uint32_t n_linear;
  net_linear linear[NET_MAX_LINEAR];
  size_t n_params;          /* floats of the flat dense array */
  size_t n_trainable;       /* its trainable prefix (set when the plan is done) */
  uint32_t n_buffers;       /* buffers waiting to be placed */
  dlrec_net_tensor buffers[NET_MAX_BUFFERS]; /* their offsets relative to n_trainable */
  size_t buffer_floats;
} net_plan;

/* Adds a tensor of shape (rows) (cols == 0) or (rows, cols) at the end of the
 * flat array and sets *offset to its first float. */
dlrec_status net_plan_tensor(net_plan *p, const char *name, uint32_t rows, uint32_t cols, size_t *offset);
/* Adds a linear layer "PREFIX.weight" (out, in) and "PREFIX.bias" (out) and
 * sets *index to its number, the one net_linear_forward takes. */
dlrec_status net_plan_linear(net_plan *p, const char *prefix, uint32_t in, uint32_t out, int *index);

/* Adds a buffer of `rows` floats named `name` and sets *handle to what
 * net_buffer_offset takes. */
dlrec_status net_plan_buffer(net_plan *p, const char *name, uint32_t rows, size_t *handle);
/* The offset in the flat array of the buffer behind handle. */
static inline size_t net_buffer_offset(const net_plan *p, size_t handle) { return p->n_trainable + handle; }

/* One way of a split training step (net_pass.c), for what a model must sum
 * across the ways: batch normalization's statistics. */
typedef struct net_split {
  uint32_t ways, way;   /* way in [0, ways) */
  uint32_t rows;        /* the whole batch's rows (N) */
  double *work;         /* this way's scratch: 4 doubles per column of the widest linear layer */
  double *const *slots; /* every way's slot for net_allreduce: 2 doubles per such column */
  struct net_sync *sync;
  /* Across processes (dlrec_net_train_pass with a sum): the ways' total is
   * then summed over the processes too, in process order. */
  dlrec_sum_fn sum;
  void *sum_ctx;
} net_split;

/* What one pass of the model sees: the batch's inputs, the parameters, the
 * backend every op of the pass runs on, and the workspace's profile. */
typedef struct net_io {
  dlrec_backend *be;                         /* the network's, or the scorer's when scoring */
  int B;                                     /* rows */
  const float *dense;                        /* (B, n_dense) */
  const float *emb;                          /* (B, F, D) pooled embeddings */
  const float *params;                       /* the flat dense array */
  const net_plan *plan;
  const dlrec_packed_linear *const *packed;  /* per linear layer when scoring; NULL when training */
  dlrec_net_profile *prof;
  int train;        /* a training pass: dropout on, batch statistics (scoring: neither) */
  uint64_t step;    /* the training step, which dropout's masks depend on */
  uint32_t row0;    /* the pass's first row in the step's batch (> 0 in a split step's later ways) */
  const net_split *split; /* this way of a split step that sums across its ways; NULL otherwise */
  float *state;     /* the flat array, writable, when training (buffers move); NULL when scoring */
} net_io;

/* The linear op every model calls: out (B, out) = in (B, in) · Wᵀ + b, with a
 * ReLU if relu, on io->be. In training it runs the backend's linear_forward
 * (on the CPU in fp32, sgemm with the bias-fill trick of
 * cpu_sgemm_linear_forward); when scoring, its packed batch-invariant kernel. */
dlrec_status net_linear_forward(const net_io *io, int layer, float *out, const float *in, int relu);

/* Sums v (n doubles, at most 2 per column of the plan's widest linear
 * layer) over the ways of io's split step,
 * in way order, into v on every way; leaves v alone when io->split is NULL.
 * Every way must make the same calls with the same n, errors or not: the
 * ways wait for each other at each one. */
void net_allreduce(const net_io *io, double *v, size_t n);

/* The first-order term on the dense features (dense_term.c): out (B) =
 * dense (B, n_dense) · w + b through net_linear_forward when n_dense > 0,
 * else a lone "bias" tensor. Backward adds its gradients into g; both
 * count their flops in the profile's mlp_flops. */
typedef struct net_dense_term {
  uint32_t n_dense;
  int linear;   /* the layer "linear", when n_dense > 0 */
  net_linear L; /* its shape and offsets */
  size_t bias;  /* the tensor "bias", when n_dense == 0 */
} net_dense_term;
dlrec_status net_dense_term_plan(net_dense_term *t, net_plan *p, uint32_t n_dense);
/* Weights normal (Xavier) from (seed, stream), bias zero. */
void net_dense_term_init(const net_dense_term *t, float *params, uint64_t seed, uint64_t stream);
dlrec_status net_dense_term_forward(const net_dense_term *t, const net_io *io, float *out);
dlrec_status net_dense_term_backward(const net_dense_term *t, const net_io *io, const float *d_out, float *g);

/* Embedding rows D + 1 wide, an id's D factors then its first-order weight
 * (fm_split.c; fm, wide_deep and deepfm). net_fm_config_dim reads a model
 * section's optional "embedding_dim" (D, in [1, DLREC_EMBED_MAX_DIM - 1];
 * absent: unchanged). net_fm_split splits n pooled rows emb (n, D + 1) into
 * the factors v (n, D) and the weights w (n). net_fm_join writes d_emb
 * (B, F, D + 1): the factors' gradient is dv (row b's F·D values at
 * dv + b·dv_stride), plus dv2 (B, F·D) when not NULL, and the weights' is
 * dw (B, F); tmp (B, F·D) is its scratch unless dv is contiguous
 * (dv_stride F·D) and dv2 NULL. Both run on backend be's ops. */
dlrec_status net_fm_config_dim(const cJSON *o, const char *what, uint32_t *emb_dim);
dlrec_status net_fm_split(dlrec_backend *be, float *v, float *w, const float *emb, size_t n, uint32_t D);
dlrec_status net_fm_join(dlrec_backend *be, float *d_emb, const float *dv, size_t dv_stride, const float *dv2,
                         const float *dw, float *tmp, int B, int F, uint32_t D);

/* Initializes a linear layer as the DLRM reference does: the weight normal
 * with std sqrt(2 / (in + out)) (Xavier), the bias normal with std
 * sqrt(1 / out), from the random stream (seed, stream). */
void net_init_linear(const net_linear *L, float *params, uint64_t seed, uint64_t stream);

/* An MLP (net_mlp.c): n_hidden layers Linear -> [BatchNorm] -> ReLU ->
 * [Dropout], then, if planned with an output, a Linear to one logit. */
typedef struct net_mlp_config {
  uint32_t n_hidden;
  uint32_t hidden[DLREC_MLP_MAX_LAYERS]; /* their widths; unused slots zero */
  float dropout;                         /* rate after each hidden layer, [0, 1) */
  int batch_norm;                        /* batch normalization in each hidden layer */
} net_mlp_config;

typedef struct net_mlp {
  uint32_t in, out, n_hidden; /* input width, output width (1 with an output layer) */
  int output;                 /* a last Linear to one logit */
  float dropout;
  int bn;
  int lin[DLREC_MLP_MAX_LAYERS];    /* the plan's linear layer numbers */
  net_linear L[DLREC_MLP_MAX_LAYERS];
  size_t gamma[DLREC_MLP_MAX_LAYERS], beta[DLREC_MLP_MAX_LAYERS]; /* offsets, with bn */
  size_t rmean[DLREC_MLP_MAX_LAYERS], rvar[DLREC_MLP_MAX_LAYERS]; /* buffer handles, with bn */
} net_mlp;

/* Plans the MLP's tensors as PREFIX.L.weight / .bias (and PREFIX.L.bn.*). */
dlrec_status net_mlp_plan(net_mlp *m, net_plan *p, const char *prefix, uint32_t in, const net_mlp_config *c,
                          int output);
uint32_t net_mlp_n_layers(const net_mlp *m);
/* Linear layers from streams stream0 + l (net_init_linear); batch
 * normalization as PyTorch starts it. */
void net_mlp_init(const net_mlp *m, const net_plan *p, float *params, uint64_t seed, uint64_t stream0);
/* Floats of workspace the MLP needs for batches of up to B rows. */
size_t net_mlp_ws_floats(const net_mlp *m, uint32_t B);
/* The forward from in (B, m->in) to *out (B, m->out), which points into ws. */
dlrec_status net_mlp_forward(const net_mlp *m, const net_io *io, float *ws, const float *in, const float **out);
/* The backward after net_mlp_forward on the same ws and in, given dout
 * (B, m->out), which it may overwrite: the parameters' gradients are
 * accumulated into g, and din (B, m->in) is overwritten (NULL to skip). */
dlrec_status net_mlp_backward(const net_mlp *m, const net_io *io, float *ws, const float *in, const float *dout,
                              float *din, float *g);
/* The "mlp", "dropout" and "batch_norm" keys of a model section into c (absent: unchanged), and back. */
dlrec_status net_mlp_config_parse(net_mlp_config *c, const cJSON *o, const char *what);
void net_mlp_config_to_json(const net_mlp_config *c, cJSON *o);

/* A model section's optional array `key` of layer widths, each in [1,
 * 65536], min_n to max_n of them, into w (unused slots zeroed, so that two
 * configs of one shape compare equal byte for byte) and *n; absent: both
 * unchanged. */
dlrec_status net_config_widths(const cJSON *o, const char *key, const char *what, uint32_t min_n, uint32_t max_n,
                               uint32_t *n, uint32_t *w);
cJSON *net_widths_json(const uint32_t *w, uint32_t n);

/* A model section's optional "pooling" ("sum" or "mean"; absent: *pooling
 * stays), and its name for config_to_json (model.c). */
dlrec_status net_config_pooling(const cJSON *o, const char *what, dlrec_bag_mode *pooling);
const char *net_pooling_name(dlrec_bag_mode pooling);

/* Adds the seconds since *t to *acc and restarts *t. */
void net_lap(double *acc, double *t);

typedef struct net_type {
  const char *name;
  /* Config: defaults, the type's keys of the "model" object (which also
   * holds "type"; keys the type does not know are errors), and to JSON. The
   * config is the type's own struct in dlrec_net_config.params. */
  void (*config_default)(void *cfg);
  dlrec_status (*config_parse)(void *cfg, const cJSON *o, const char *what);
  void (*config_to_json)(const void *cfg, cJSON *o);
  /* Plans the tensors and linear layers for schema into p and creates the
   * type's context (*ctx, freed with free_ctx), checking cfg against schema. */
  dlrec_status (*plan)(const void *cfg, const dlrec_schema *schema, net_plan *p, void **ctx);
  void (*free_ctx)(void *ctx);
  /* Initializes the dense tensors from seed. */
  void (*init)(const void *ctx, const net_plan *p, float *params, uint64_t seed);
  /* The type's own activations for batches of up to max_batch rows, in an
   * arena of memory mem (NULL: the host's; else the backend's, which the
   * host must not touch). */
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
  /* ONNX export (export_onnx.c): adds to g the nodes from the tensors named
   * dense ((N, n_dense) float32; NULL without dense columns) and emb ((N,
   * F, D) pooled embeddings; NULL without categorical columns) to the
   * logits (N, 1), whose name it returns; the same function as forward
   * when scoring. */
  const char *(*export_onnx)(const void *ctx, const net_plan *p, const float *params, struct onnx_graph *g,
                             const char *dense, const char *emb);
} net_type;

/* ONNX export helpers (export_onnx.c; onnx.h builds the graph). The plan's
 * linear layer as Gemm (transB) [+ Relu] of x (N, in) -> (N, out). */
const char *net_onnx_linear(struct onnx_graph *g, const net_plan *p, const float *params, int layer, const char *x,
                            int relu);
/* The dense term (N, 1), or its lone bias (1, 1) without dense columns. */
const char *net_dense_term_export(const net_dense_term *t, const net_plan *p, const float *params,
                                  struct onnx_graph *g, const char *dense);
/* emb (N, F, D + 1) -> the factors v (N, F, D) and the weights w (N, F, 1). */
void net_fm_split_export(struct onnx_graph *g, const char *emb, uint32_t D, const char **v, const char **w);
/* The first-order term Σ_f w_f (N, 1) and the FM's second-order term (N, 1). */
const char *net_wide_export(struct onnx_graph *g, const char *w);
const char *net_fm_export(struct onnx_graph *g, const char *v);
/* The MLP from x (N, m->in) to (N, m->out): Linear -> [BatchNorm with the
 * running statistics] -> ReLU per hidden layer (dropout is off when
 * scoring), then the output Linear if planned. */
const char *net_mlp_export(const net_mlp *m, const net_plan *p, const float *params, struct onnx_graph *g,
                           const char *x);

extern const net_type net_type_dlrm;
extern const net_type net_type_lr;
extern const net_type net_type_fm;
extern const net_type net_type_wide_deep; /* wide_deep.c, with deepfm */
extern const net_type net_type_deepfm;
extern const net_type net_type_dcn_v2;

/* The registered type of that name, or NULL. */
const net_type *net_type_find(const char *name);

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
