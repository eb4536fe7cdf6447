/* The building blocks model types are made of, and what a block sees of a
 * network: its plan (named tensors in one flat array, linear layers,
 * buffers), one pass's inputs (net_io) and one way of a split training step
 * (net_split).
 *
 * Blocks: the MLP (mlp.c: Linear -> [BatchNorm] -> ReLU -> [Dropout] per
 * hidden layer, then an optional output Linear), the first-order term on
 * the dense features (dense_term.c), the split of embedding rows into FM
 * factors and a first-order weight (fm_split.c) and the concatenation of
 * two row blocks (concat.c). Each writes its forward once (training and
 * scoring run it), its backward, and its ONNX export beside them.
 *
 * The plan helpers and the shared config readers live in block.c; what
 * every block calls of its pass (net_linear_forward, net_allreduce,
 * net_lap) in pass.c.
 *
 * Layers: nn/ sits on core/ and backend/ (the ops and their types); it
 * includes nothing of src/model/, which builds model types out of it.
 */
#ifndef DLREC_NN_BLOCK_H
#define DLREC_NN_BLOCK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "backend/ops.h"
#include "core/status.h"

#define DLREC_NET_MAX_TENSORS 60 /* named dense tensors of one network */
#define DLREC_NET_TENSOR_NAME 40 /* bytes of a tensor name, NUL included */
#define DLREC_MLP_MAX_LAYERS 8   /* linear layers of one MLP, its output layer included */

/* Linear layers of one network: DCN-v2's mixture of K low-rank experts
 * plans 3K + 1 per cross layer (each packed for scoring). */
#define NET_MAX_LINEAR 128
#define NET_MAX_BUFFERS 16 /* buffers of one network */

/* One named dense parameter tensor: floats [offset, offset + count) of the
 * flat dense array, of shape (shape[0], .., shape[ndim - 1]). */
typedef struct dlrec_net_tensor {
  char name[DLREC_NET_TENSOR_NAME];
  uint32_t ndim;
  uint32_t shape[2];
  size_t offset, count;
} dlrec_net_tensor;

/* Where a workspace's forward and backward passes spent their time, summed
 * since the workspace was created (wall seconds, read with dlrec_now()
 * around each phase; the clock reads cost ~0.1 us a phase). The embedding,
 * loss and optimizer phases are timed by the generic code; mlp and
 * interaction by the model type and its blocks (a type without one leaves
 * it 0). */
typedef struct dlrec_net_profile {
  uint64_t forward_rows;  /* rows through the forward pass */
  uint64_t backward_rows; /* rows through the backward pass */
  uint64_t lookups;       /* ids pooled by the embedding forward */
  uint64_t hot_lookups;   /* of which on hot rows on the device (dlrec_net_set_hot_fraction) */
  double mlp_flops;       /* the MLPs' flops (2 per multiply-add), forward and backward */
  double mlp;             /* the MLPs: GEMMs, bias, ReLU, forward and backward */
  double emb_forward;     /* embedding bag lookups and pooling */
  double emb_update;      /* the fused sparse backward + optimizer update */
  double interaction;     /* feature interaction, forward and backward */
  double other;           /* loss, sigmoid, dense optimizer step */
  double store;           /* resolving ids through a tiered table storage: cache lookups, file reads,
                             write-backs (0 on a ram store, where ids are rows) */
} dlrec_net_profile;

/* Sums n doubles over the parts of a data-parallel step, in part order, into
 * v on every part (src/dist/: an allreduce across the ranks). */
typedef dlrec_status (*dlrec_sum_fn)(void *ctx, double *v, size_t n);

/* ---- the plan ---------------------------------------------------------------- */

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

struct net_type; /* src/model/model_type.h */

/* The plan of a network: its named tensors, its linear layers, and what the
 * embedding stage must hand it.
 *
 * Besides the trainable tensors a plan may hold BUFFERS (batch
 * normalization's running statistics): named tensors that checkpoints store
 * and the training forward moves, but that have no gradient and that the
 * dense optimizer never steps. They sit after every trainable tensor in the
 * flat array, [n_trainable, n_params), so the optimizer steps one prefix;
 * the network places them there once the type's plan is done. */
typedef struct net_plan {
  const struct net_type *type; /* the model type that made it (which describes its workspace) */
  uint32_t emb_dim;         /* D of emb (B, F, D) */
  dlrec_pooling pooling;    /* how multi-hot bags pool */
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
/* Adds a linear layer over tensors already planned (weight (out, in) at w,
 * bias at b or NET_NO_BIAS), so that the scorer packs it, and sets *index
 * to its number (DCN-v2's cross products are such views). */
dlrec_status net_plan_view(net_plan *p, uint32_t in, uint32_t out, size_t w, size_t b, int *index);
/* Adds a buffer of `rows` floats named `name` and sets *handle to what
 * net_buffer_offset takes. */
dlrec_status net_plan_buffer(net_plan *p, const char *name, uint32_t rows, size_t *handle);
/* The offset in the flat array of the buffer behind handle. */
static inline size_t net_buffer_offset(const net_plan *p, size_t handle) { return p->n_trainable + handle; }
/* Ends a plan: the buffers go after every trainable tensor. */
dlrec_status net_plan_finish(net_plan *p);

/* Initializes a linear layer as the DLRM reference does: the weight normal
 * with std sqrt(2 / (in + out)) (Xavier), the bias normal with std
 * sqrt(1 / out), from the random stream (seed, stream). */
void net_init_linear(const net_linear *L, float *params, uint64_t seed, uint64_t stream);

/* count floats normal with std sqrt(2 / (fan_in + fan_out)) (Xavier) from
 * the random stream (seed, stream). */
void net_init_xavier(float *w, size_t count, uint32_t fan_in, uint32_t fan_out, uint64_t seed, uint64_t stream);

/* ---- a pass ------------------------------------------------------------------ */

/* Where the ways of a split step meet (net_allreduce): a counting barrier
 * that a failed way releases. A way whose pass fails stops making the calls
 * the others wait in; it sets `failed`, and every wait then returns at once,
 * so the step ends with that way's error instead of hanging. */
struct net_sync {
  _Atomic uint32_t arrived, generation;
  _Atomic int failed;
  uint32_t ways;
};

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

/* Adds the seconds since *t to *acc and restarts *t. */
void net_lap(double *acc, double *t);

/* ---- config readers ------------------------------------------------------------ */

/* A model section's optional unsigned `key`, in [lo, hi] (errors name the
 * field); absent: *out unchanged. */
dlrec_status net_config_u32(const cJSON *o, const char *key, const char *what, uint64_t lo, uint64_t hi,
                            uint32_t *out);
/* A model section's optional rate `key` in [0, 1) (a dropout rate; errors
 * name the field); absent: *rate unchanged. */
dlrec_status net_config_rate(const cJSON *o, const char *key, const char *what, float *rate);
/* A model section's optional array `key` of layer widths, each in [1,
 * 65536], min_n to max_n of them, into w (unused slots zeroed, so that two
 * configs of one shape compare equal byte for byte) and *n; absent: both
 * unchanged. */
dlrec_status net_config_widths(const cJSON *o, const char *key, const char *what, uint32_t min_n, uint32_t max_n,
                               uint32_t *n, uint32_t *w);
cJSON *net_widths_json(const uint32_t *w, uint32_t n);

/* ---- the first-order term on the dense features (dense_term.c) ---------------- */

/* out (B) = dense (B, n_dense) · w + b through net_linear_forward when
 * n_dense > 0, else a lone "bias" tensor. Backward adds its gradients into
 * g; both count their flops in the profile's mlp_flops. */
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

/* ---- embedding rows of FM factors and a first-order weight (fm_split.c) -------- */

/* Embedding rows D + 1 wide, an id's D factors then its first-order weight
 * (fm, wide_deep and deepfm). net_fm_config_dim reads a model section's
 * optional "embedding_dim" (D, in [1, DLREC_EMBED_MAX_DIM - 1]; absent:
 * unchanged). net_fm_split splits n pooled rows emb (n, D + 1) into the
 * factors v (n, D) and the weights w (n). net_fm_join writes d_emb
 * (B, F, D + 1): the factors' gradient is dv (row b's F·D values at
 * dv + b·dv_stride), plus dv2 (B, F·D) when not NULL, and the weights' is
 * dw (B, F); tmp (B, F·D) is its scratch unless dv is contiguous
 * (dv_stride F·D) and dv2 NULL. Both run on backend be's ops. */
dlrec_status net_fm_config_dim(const cJSON *o, const char *what, uint32_t *emb_dim);
dlrec_status net_fm_split(dlrec_backend *be, float *v, float *w, const float *emb, size_t n, uint32_t D);
dlrec_status net_fm_join(dlrec_backend *be, float *d_emb, const float *dv, size_t dv_stride, const float *dv2,
                         const float *dw, float *tmp, int B, int F, uint32_t D);

/* ---- the concatenation of two row blocks (concat.c) --------------------------------- */

/* out (rows, na + nb) = [a, b] row by row, from a (rows, na) and b (rows,
 * nb); an empty part is left out (a may be NULL when na is 0). The
 * backward: db (rows, nb) = the b columns of dout (rows, na + nb), a's
 * gradient being dout's first na columns, which the caller reads in place. */
dlrec_status net_concat_forward(dlrec_backend *be, float *out, const float *a, size_t na, const float *b, size_t nb,
                                size_t rows);
dlrec_status net_concat_backward(dlrec_backend *be, float *db, const float *dout, size_t na, size_t nb, size_t rows);

/* ---- the MLP (mlp.c) ------------------------------------------------------------- */

/* n_hidden layers Linear -> [BatchNorm] -> ReLU -> [Dropout], then, if
 * planned with an output, a Linear to one logit. */
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

/* Plans the MLP's tensors as PREFIX.L.weight / .bias (and PREFIX.L.bn.*):
 * c's hidden layers, at most DLREC_MLP_MAX_LAYERS with the output layer. */
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
 * (B, m->out): the parameters' gradients are accumulated into g, and din
 * (B, m->in) is overwritten (NULL to skip). dout is read only when the MLP
 * has an output layer; without one its last hidden layer's backward runs in
 * place on it. */
dlrec_status net_mlp_backward(const net_mlp *m, const net_io *io, float *ws, const float *in, const float *dout,
                              float *din, float *g);
/* The "mlp", "dropout" and "batch_norm" keys of a model section into c (absent: unchanged), and back. */
dlrec_status net_mlp_config_parse(net_mlp_config *c, const cJSON *o, const char *what);
void net_mlp_config_to_json(const net_mlp_config *c, cJSON *o);

/* ---- ONNX export of the blocks (core/onnx.h builds the graph) --------------------- */

struct onnx_graph;
/* The plan's linear layer as Gemm (transB) [+ Relu] of x (N, in) -> (N, out). */
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
/* [a, b flattened to (N, -1)]: a (N, na) or NULL, b (N, ...) or NULL. */
const char *net_concat_export(struct onnx_graph *g, const char *a, const char *b);
/* The MLP from x (N, m->in) to (N, m->out): Linear -> [BatchNorm with the
 * running statistics] -> ReLU per hidden layer (dropout is off when
 * scoring), then the output Linear if planned. */
const char *net_mlp_export(const net_mlp *m, const net_plan *p, const float *params, struct onnx_graph *g,
                           const char *x);

#endif
