/* What a model type implements, and the helpers the generic code gives it.
 * A type is a small vtable (net_type) registered by name in model.c; the
 * generic code (model.c, net_run.c) owns the embedding stage, the loss, the
 * sparse update and the dense optimizer, so a type only plans its dense
 * tensors and maps (dense features, pooled embeddings) to logits and back.
 *
 * Adding a model type: a new src/model/NAME.c defining a `const net_type`,
 * one line in model.c's registry, its example config and its docs.
 */
#ifndef DLREC_MODEL_TYPE_H
#define DLREC_MODEL_TYPE_H

#include "dlrec/model.h"

#define NET_MAX_LINEAR 30 /* linear layers of one network */

/* A linear layer of the plan: weight (out, in) and bias (out) at these
 * offsets of the flat dense array. The generic scorer packs every planned
 * linear layer for the batch-invariant kernel. */
typedef struct net_linear {
  uint32_t in, out;
  size_t w, b;
} net_linear;

/* The plan of a network: its named tensors, its linear layers, and what the
 * embedding stage must hand it. */
typedef struct net_plan {
  uint32_t emb_dim;         /* D of emb (B, F, D) */
  dlrec_bag_mode pooling;   /* how multi-hot bags pool */
  uint32_t n_tensors;
  dlrec_net_tensor tensors[DLREC_NET_MAX_TENSORS];
  uint32_t n_linear;
  net_linear linear[NET_MAX_LINEAR];
  size_t n_params;          /* floats of the flat dense array */
} net_plan;

/* Adds a tensor of shape (rows) (cols == 0) or (rows, cols) at the end of the
 * flat array and sets *offset to its first float. */
dlrec_status net_plan_tensor(net_plan *p, const char *name, uint32_t rows, uint32_t cols, size_t *offset);
/* Adds a linear layer "PREFIX.weight" (out, in) and "PREFIX.bias" (out) and
 * sets *index to its number, the one net_linear_forward takes. */
dlrec_status net_plan_linear(net_plan *p, const char *prefix, uint32_t in, uint32_t out, int *index);

/* What one pass of the model sees: the batch's inputs, the parameters, the
 * kernel context, and the workspace's profile. */
typedef struct net_io {
  int B;                                     /* rows */
  const float *dense;                        /* (B, n_dense) */
  const float *emb;                          /* (B, F, D) pooled embeddings */
  const float *params;                       /* the flat dense array */
  const net_plan *plan;
  const dlrec_packed_linear *const *packed;  /* per linear layer when scoring; NULL when training */
  dlrec_net_profile *prof;
} net_io;

/* The linear op every model calls: out (B, out) = in (B, in) · Wᵀ + b, with a
 * ReLU if relu. In training it runs sgemm (with the bias-fill trick of
 * dlrec_linear_forward); when scoring, the packed batch-invariant kernel. */
dlrec_status net_linear_forward(const net_io *io, int layer, float *out, const float *in, int relu);

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
  /* The type's own activations for batches of up to max_batch rows. */
  dlrec_status (*ws_create)(const void *ctx, const net_plan *p, uint32_t max_batch, void **ws);
  void (*ws_free)(void *ws);
  /* The forward pass to the logits (B), kept in the type's workspace until
   * the next pass (*logits points there), with every activation backward
   * needs. Written once: training and scoring run it. */
  dlrec_status (*forward)(const void *ctx, void *ws, const net_io *io, const float **logits);
  /* The backward pass from d_logits (B): the dense gradients into grad
   * (zeroed by the caller) and d_emb (B, F, D). */
  dlrec_status (*backward)(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *grad,
                           float *d_emb);
} net_type;

extern const net_type net_type_dlrm;
extern const net_type net_type_lr;
extern const net_type net_type_fm;

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
  dlrec_table *table;
  uint64_t max_ids_per_row; /* sum of the columns' max hotness */
};

#endif
