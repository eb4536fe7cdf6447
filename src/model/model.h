/* The model interface: what the trainer, checkpoints, predict and the server
 * see of a model, whatever its type.
 *
 * A model type ("dlrm", ...) is registered by name in src/model/ and picked
 * by the config's model.type. A network (dlrec_net) of a type is planned
 * from (config, schema) as a set of NAMED dense parameter tensors, each a
 * slice (offset, shape) of one flat float array, so that one dense optimizer
 * call and one checkpoint file cover them all, plus the fused embedding
 * table. The generic code owns the EMBEDDING STAGE (the bags pool the
 * categorical ids into emb (B, F, D)) and the training step (loss, the fused
 * sparse update of the table from d_emb, the dense optimizer); the model type
 * owns only what lies between emb + the dense features and the logits, and
 * its backward.
 *
 * A workspace (dlrec_net_ws) holds every activation and gradient buffer for
 * batches of up to max_batch rows, planned once; the trainer owns one, and
 * each serving thread owns its own while they share one network read-only.
 *
 * Every op of a pass (the linear layers, the interactions, the loss, the
 * embedding bags, the optimizers) runs on the network's compute backend
 * (backend/backend.h), which decides its threads and its precision; a scorer
 * keeps the backend it was created with.
 */
#ifndef DLREC_MODEL_H
#define DLREC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "embed/embed.h"
#include "data/loader.h"
#include "nn/block.h"
#include "backend/ops.h"
#include "data/schema.h"
#include "core/status.h"
#include "embed/store.h"

#define DLREC_NET_TYPE_MAX 32      /* bytes of a type name, NUL included */
#define DLREC_NET_CONFIG_BYTES 512 /* room for a type's parsed config section */
#define DLREC_DEFAULT_MODEL_TYPE "dlrm" /* what a config without model.type trains */

/* model.embedding_init: how the embedding rows are drawn, for every column
 * (`all`) but those named in its "columns" (docs/config.md). Zeroed: the
 * DLRM rule for every column. */
#define DLREC_INIT_MAX_COLUMNS 32
typedef struct dlrec_embedding_init_config {
  dlrec_embed_init all;
  uint32_t n_columns;
  char column[DLREC_INIT_MAX_COLUMNS][DLREC_NAME_MAX];
  dlrec_embed_init column_init[DLREC_INIT_MAX_COLUMNS];
} dlrec_embedding_init_config;

/* A model's config section: its type's name and that type's own parsed
 * settings (opaque here; the type reads and writes them). Zeroed in full
 * before it is filled, so that two configs compare with memcmp. */
typedef struct dlrec_net_config {
  char type[DLREC_NET_TYPE_MAX];
  _Alignas(16) unsigned char params[DLREC_NET_CONFIG_BYTES];
  /* How the embedding table stores its rows (a dlrec_table_dtype; 0, fp32,
   * by default): the config's training.table_dtype, kept with the model so
   * that every program that builds the network from a checkpoint's config
   * builds the table the checkpoint holds. */
  uint32_t table_dtype;
  /* model.embedding_init, which every type takes (parsed and written beside
   * the type's own keys). */
  dlrec_embedding_init_config embedding_init;
  /* model.bias_init, every type's too: the dense layers' biases drawn
   * N(0, 1 / out) as the DLRM reference does (DLREC_BIAS_INIT_NORMAL, 0)
   * or zero as FuxiCTR's (and Keras') layers start them. */
  uint32_t bias_init;
} dlrec_net_config;
enum { DLREC_BIAS_INIT_NORMAL = 0, DLREC_BIAS_INIT_ZEROS = 1 };

/* Sets c to the defaults of model type `type`; DLREC_ERR_INVALID naming the
 * registered types if there is no such type. */
dlrec_status dlrec_net_config_default(dlrec_net_config *c, const char *type);
/* Reads a config's "model" object o into c: its "type" (default: c's
 * current type; another type starts from that type's defaults), then the
 * type's own keys. Errors name `what` and the field. */
dlrec_status dlrec_net_config_parse(dlrec_net_config *c, const cJSON *o, const char *what);
/* Adds c's type and every setting of the type to the JSON object o. */
void dlrec_net_config_to_json(const dlrec_net_config *c, cJSON *o);
/* The table's column ranges for data of `schema`, each with its
 * initializer from c's embedding_init; DLREC_ERR_INVALID naming a column of
 * embedding_init.columns the schema does not have. ranges holds
 * schema->n_sparse entries. */
dlrec_status dlrec_net_config_ranges(const dlrec_net_config *c, const dlrec_schema *schema, dlrec_row_range *ranges);
/* 1 when a and b draw the same rows. */
int dlrec_embedding_init_same(const dlrec_embedding_init_config *a, const dlrec_embedding_init_config *b);
/* The name of the i-th registered model type (from 0), or NULL past the
 * last; valid for the program's life. dlrec_net_type_doc: its one-line
 * description. */
const char *dlrec_net_type_name(size_t i);
const char *dlrec_net_type_doc(size_t i);
/* The j-th (from 0) config the generic tests build model type i from: the
 * JSON object of a model section's keys beside "type", or NULL past the
 * last; *checks (may be NULL) says which heavier checks it joins. Every
 * config joins the light ones (config round trip, batch-invariant scoring,
 * workspace bytes, ONNX export). */
#define DLREC_NET_TEST_GRADIENTS 1u /* finite differences of every parameter (a small network) */
#define DLREC_NET_TEST_AGREEMENT 2u /* trained on every backend, agreeing with the CPU (no dropout:
                                       a split step draws other masks) */
#define DLREC_NET_TEST_KEPT 4u      /* kept operands train the same bits (a network with GEMMs) */
const char *dlrec_net_type_test_config(size_t i, size_t j, unsigned *checks);

typedef struct dlrec_net dlrec_net;
typedef struct dlrec_net_ws dlrec_net_ws;
typedef struct dlrec_stage dlrec_stage; /* model/stage.h */

/* Creates a network of config c's type for data of `schema` (its dense and
 * sparse columns and the fused table's rows), with parameters zeroed. The
 * type checks its config against the schema. The network runs on the
 * default backend (dlrec_backend_default()) until dlrec_net_set_backend. */
dlrec_status dlrec_net_create(dlrec_net **n, const dlrec_net_config *c, const dlrec_schema *schema);
/* The same with a table of one row, for a network whose embedding rows live
 * elsewhere (a rank's shard, src/dist/): its passes must be given a table
 * (a stage of their own: model/stage.h), and dlrec_net_init leaves the rows
 * alone. */
dlrec_status dlrec_net_create_tableless(dlrec_net **n, const dlrec_net_config *c, const dlrec_schema *schema);
/* The same with the embedding table in `storage` (embed/store.h; NULL: ram).
 * Every pass resolves its batch's ids through the store first; a network on
 * a tiered store is used by one thread at a time, scorers included. Data
 * without categorical columns always gets a ram table (of one row). */
dlrec_status dlrec_net_create_stored(dlrec_net **n, const dlrec_net_config *c, const dlrec_schema *schema,
                                     const dlrec_store_config *storage);
void dlrec_net_free(dlrec_net *n); /* accepts NULL */

/* Makes the network's training steps, dlrec_net_gradients and the scorers
 * created from now on run on backend be (NULL: dlrec_backend_default()).
 * The network borrows be: the caller keeps be alive while the network uses
 * it (until the network is freed or given another backend) and while any
 * scorer created on it lives. Scorers created before keep their backend.
 * Not to be called while a pass on the network runs. On a backend whose
 * memory is not the host's (a GPU's) the network's parameters and table
 * are copied there (dlrec_net_sync_host below); leaving it copies them
 * back. DLREC_ERR_UNSUPPORTED, naming the device, for what such a backend
 * cannot run yet (a table stored other than in RAM, a rank's shard); the
 * network then keeps its backend. Workspaces are made for the network's
 * backend at the time (dlrec_net_ws_create). */
dlrec_status dlrec_net_set_backend(dlrec_net *n, dlrec_backend *be);
/* Where the embedding table lives when the network runs on a backend whose
 * memory is not the host's: host 0 (the default), mirrored in the device's
 * memory with its sparse optimizer's state, the bag ops on the device; host
 * 1, in host memory, for tables larger than the device's memory: the bag
 * ops run on the CPU (dlrec_backend_default()), the pooled rows go to the
 * device each pass and their gradient comes back for the CPU's sparse
 * update. Both give the same bits. No effect on a host backend. Set before
 * the network is on a device (dlrec_net_set_backend); DLREC_ERR_INVALID
 * after. */
dlrec_status dlrec_net_set_host_table(dlrec_net *n, int host);
int dlrec_net_host_table(const dlrec_net *n);
/* With the table in host memory on a device, the first ceil(fraction x
 * rows) of each column's rows (its most frequent values, which the ETL puts
 * first) live on the device too, with their sparse optimizer's state: their
 * lookups and updates run there, the others' on the CPU, and a pooled row
 * is the device's part plus the host's: the CPU's bits when a bag's hot ids
 * all come before its cold ones (one-hot columns always), within rounding
 * otherwise. None in a multi-hot column pooled by its mean,
 * nor with raw keys. Set before dlrec_net_set_backend, as the table's
 * place; 0 (the default): none. dlrec_net_hot_rows: how many rows that
 * makes (0 with the table on the device). */
dlrec_status dlrec_net_set_hot_fraction(dlrec_net *n, float fraction);
uint64_t dlrec_net_hot_rows(const dlrec_net *n);
/* Whether a training pass lets a 16-bit backend keep the operands its
 * forward converted for its backward (dispatch.h's keep_operands), and
 * lets a backend write a weight gradient's first product where it would add
 * it to zeros (fresh_gradients); on (1) by default; off, each backward
 * converts the operands again and adds every product. The same bits either
 * way: a switch for tests and for comparing the two. */
void dlrec_net_set_keep_operands(dlrec_net *n, int on);
/* The backend the network runs on; never NULL. */
dlrec_backend *dlrec_net_backend(const dlrec_net *n);

/* Initializes the parameters from seed: the dense tensors as the type says,
 * each column's embedding rows uniform in ±sqrt(1 / its rows). The same for
 * any thread count. */
dlrec_status dlrec_net_init(dlrec_net *n, uint64_t seed);

const dlrec_net_config *dlrec_net_get_config(const dlrec_net *n);
const dlrec_schema *dlrec_net_schema(const dlrec_net *n);
/* The flat dense parameters (n floats), valid for the network's life. */
float *dlrec_net_dense_params(dlrec_net *n, size_t *count);
const float *dlrec_net_dense_params_const(const dlrec_net *n, size_t *count);
/* The resident embedding table (the whole table on a ram store; the cache
 * of a tiered one), and its store, valid for the network's life. */
dlrec_table *dlrec_net_table(dlrec_net *n);
const dlrec_table *dlrec_net_table_const(const dlrec_net *n);
dlrec_store *dlrec_net_store(const dlrec_net *n); /* the store is a handle: passes change its cache */
/* Whether categorical column c pools its bags by their mean (the config's
 * model.pooling "mean", or the ETL schema's mean column), else by their sum. */
int dlrec_net_pools_mean(const dlrec_net *n, uint32_t c);
/* The named tensors, in flat-array order, valid for the network's life. */
uint32_t dlrec_net_n_tensors(const dlrec_net *n);
const dlrec_net_tensor *dlrec_net_tensors(const dlrec_net *n);

/* A workspace for batches of up to max_batch rows of network n's plan. */
dlrec_status dlrec_net_ws_create(dlrec_net_ws **ws, const dlrec_net *n, uint32_t max_batch);
void dlrec_net_ws_free(dlrec_net_ws *ws); /* accepts NULL */
/* About how many bytes training needs beside the parameters and the table:
 * a workspace of `rows` rows (activations, their gradients, the sparse
 * backward's scratch) and, where a step splits across `threads` threads
 * (as a CPU backend's does, at most one way per 32 rows), each way's own
 * activations, dense gradients and logits for its share of the rows.
 * Measured by making workspaces of 64 and 128 rows (their sizes are linear
 * in the rows), so it costs little at any batch size; 0 when the network
 * cannot make one (the error is cleared). */
uint64_t dlrec_net_ws_bytes(const dlrec_net *n, uint32_t rows, uint32_t threads);

/* Where a workspace's forward and backward passes spent their time
 * (dlrec_net_profile, nn/block.h), summed since it was created. */
void dlrec_net_ws_profile(const dlrec_net_ws *ws, dlrec_net_profile *p);

/* How many ways the workspace's last training step split its batch (1: it
 * ran whole). A step splits on a backend that splits (the CPU backend, in
 * as many ways as it has threads) when every way gets at least 32 rows:
 * each way runs the forward and backward of its rows on one thread, batch
 * normalization sums its statistics across the ways, and the dense
 * gradients are summed over the ways in order. This gives one parallel
 * region per step instead of one per kernel. The result equals the whole
 * batch's up to float summation order (dropout aside: each way draws its
 * own masks), and is bitwise reproducible for a given thread count. */
uint32_t dlrec_net_ws_split(const dlrec_net_ws *ws);

/* Raw keys (schema.keys): the keys this workspace scored that the hash table
 * had no row for (left out of their bags), since it was created. */
uint64_t dlrec_net_ws_keys_missing(const dlrec_net_ws *ws);

/* Scoring. A scorer holds the network's linear layers packed for the
 * batch-invariant linear kernel (cpu_packed_forward), so that a
 * row's score is bitwise the same whatever batch it is scored in, at any
 * batch size and thread count: `dlrec predict`, evaluation and the server
 * agree to the bit. The model's forward is the one training runs; only the
 * kernel under its linear op differs. The packed weights are a snapshot of
 * the parameters when the scorer is created (after training steps, create a
 * new one); the embedding table is read live. The scorer packs on, scores
 * on and frees its packed layers through the network's backend at its
 * creation, which must outlive it. */
typedef struct dlrec_net_scorer dlrec_net_scorer;
dlrec_status dlrec_net_scorer_create(dlrec_net_scorer **s, const dlrec_net *n);
void dlrec_net_scorer_free(dlrec_net_scorer *s); /* accepts NULL */

/* Scores a batch: prob[b] = σ(logit_b) for b < batch->rows (<= max_batch).
 * Reads the scorer and its network only, so threads with their own
 * workspaces may share them. A batch with ids outside the table is refused. */
dlrec_status dlrec_net_predict(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch, float *prob);

/* Writes the network as an ONNX model (opset 17, ir_version 8) to path,
 * atomically: inputs "dense" (N, n_dense) float32 and "ids" (N, S) int64,
 * outputs "prob" and "logit" (N, 1); docs/export.md gives the details.
 * DLREC_ERR_UNSUPPORTED for raw-key (hash table) models and tables over
 * protobuf's 2 GB. */
dlrec_status dlrec_net_export_onnx(const dlrec_net *n, const char *path);

/* dlrec_net_predict with rows from elsewhere (a server's Redis tier): fetch
 * is asked once per batch for the rows its bags read, by key (the row's id,
 * or the raw key a hash table's row holds), each key once; it fills the
 * rows it has (dim floats each) and sets found[i], and the others are the
 * network's own. The scores are those of dlrec_net_predict on a table
 * holding the fetched rows (the same bits where they equal the table's). A
 * fetch error is returned as is. */
typedef dlrec_status (*dlrec_row_fetch)(void *ctx, const uint64_t *keys, size_t n, float *rows, uint8_t *found);
dlrec_status dlrec_net_predict_fetch(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch,
                                     float *prob, dlrec_row_fetch fetch, void *ctx);

/* Optimizers of one training run. */
typedef struct dlrec_net_optim {
  dlrec_optim_config dense;   /* dense.lr is the base learning rate */
  float *dense_state;         /* dlrec_optim_state_floats(&dense, n) floats */
  dlrec_sparse_optim *sparse; /* on the network's table (dlrec_store_optim_create on dlrec_net_store) */
  float sparse_lr;            /* the sparse optimizer's base learning rate */
  float clip_grad_norm;       /* > 0: clip the gradients' global norm to this (train/step.h) */
  /* Loss scaling (training.loss_scale; fp16's narrow range needs it): with
   * loss_scale > 0, a training step (train/step.h) multiplies the loss's gradient by
   * it before the backward and divides the gradients by it after, and a
   * step whose gradients are not all finite updates nothing (skipped_steps
   * counts it). A power of two, so that both are exact. 0: none.
   * scale_growth_interval > 0 makes it dynamic: a skipped step halves it,
   * and that many updating steps in a row (scale_good_steps counts them)
   * double it, up to DLREC_LOSS_SCALE_MAX. */
  float loss_scale;
  uint32_t scale_growth_interval;
  uint32_t scale_good_steps;
  uint64_t skipped_steps;
  /* On a backend whose memory is not the host's: the state mirrored there,
   * made by the first training step (dlrec_net_sync_host copies it back;
   * dlrec_net_optim_free_device frees it). Zero-initialize. */
  dlrec_backend *dev_be;
  float *dev_dense_state;
  dlrec_sparse_optim *dev_sparse;
} dlrec_net_optim;

/* A network on a backend whose memory is not the host's (a GPU's) trains
 * and scores on the backend's copies of its parameters, table and (in
 * opt) optimizer state. dlrec_net_sync_host copies them into the host's,
 * for checkpoints, exports and reading them; dlrec_net_sync_device copies
 * the host's into them, after the host's changed (a checkpoint loaded).
 * Both are no-ops on the CPU; opt may be NULL. Made by
 * dlrec_net_set_backend (the network's) and the first training step
 * (opt's). */
dlrec_status dlrec_net_sync_host(dlrec_net *n, dlrec_net_optim *opt);
dlrec_status dlrec_net_sync_device(dlrec_net *n, dlrec_net_optim *opt);
/* Frees opt's mirrors (accepts an opt without them). */
void dlrec_net_optim_free_device(dlrec_net_optim *opt);

/* The network's side of a training step (src/train/step.c runs the step
 * itself, for one process and across ranks alike). */

/* A training pass: the embedding stage's pooling, the forward, the loss
 * and the backward, without any update, split across the backend's threads
 * where it can. */
typedef dlrec_status (*dlrec_sum_fn)(void *ctx, double *v, size_t n);
typedef struct dlrec_pass_opts {
  uint64_t step;                 /* the training step, which dropout's masks depend on */
  /* A part of a data-parallel step (src/dist/): the batch holds rows
   * [row_base, row_base + rows) of a global batch of global_rows rows, so
   * the gradients are this part's share of the global batch's mean-loss
   * gradient (the parts' sum is the whole's). 0: the batch is the whole. */
  uint32_t global_rows, row_base;
  float grad_scale;              /* the loss scale the loss's gradient is multiplied by; 0: none */
  /* With batch normalization, sum (with sum_ctx) sums n doubles over the
   * parts, in part order, into v on every part, making its statistics the
   * global batch's (the part then runs whole: one way). NULL: none. */
  dlrec_sum_fn sum;
  void *sum_ctx;
  int loss_later;                /* on a device: the loss stays there (dlrec_net_ws_loss_sent brings it) */
  float *prob;                   /* not NULL: the batch's predictions before the update */
} dlrec_pass_opts;
/* batch's ids are rows of stage (NULL: the network's own stage) as its
 * `rows` op gave them. *loss: the batch's mean loss, *loss_sum the sum over
 * its rows. A part of 0 rows gives zero gradients. The gradients stay in
 * the workspace until its next pass (dlrec_net_ws_gradients). */
dlrec_status dlrec_net_train_pass(dlrec_net *n, dlrec_net_ws *ws, dlrec_stage *stage, const dlrec_batch *batch,
                                  const dlrec_pass_opts *o, double *loss, double *loss_sum);
/* Whether the model has batch normalization, whose statistics a data-parallel
 * step must sum over the parts (dlrec_pass_opts.sum). */
int dlrec_net_has_batchnorm(const dlrec_net *n);

/* The last pass's gradients, in the memory of the workspace's backend
 * (device: not the host's): the trainable prefix of the dense gradients,
 * and d_emb (rows, F, D). */
typedef struct dlrec_net_grads {
  float *dense;
  size_t n_dense;
  float *emb;
  size_t n_emb;
  int device;
} dlrec_net_grads;
void dlrec_net_ws_gradients(const dlrec_net *n, dlrec_net_ws *ws, uint32_t rows, dlrec_net_grads *g);

/* The dense optimizer's step over the trainable prefix of the flat array,
 * from the workspace's gradients, at its base learning rate times lr_scale;
 * step is the 1-based update number (Adam). */
dlrec_status dlrec_net_dense_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, float lr_scale,
                                  uint64_t step);
/* On a device, opt's copies there, made from the host's on first use. */
dlrec_status dlrec_net_optim_ready(dlrec_net *n, dlrec_net_optim *opt);

/* The losses of steps: each step's loss goes to a slot of the workspace
 * (queue 1: the next of up to two queued steps, refused when two are
 * queued; queue 0: a step taken at once, refused while steps are queued).
 * dlrec_net_ws_loss_sent, after the step's updates are issued, brings a
 * device's loss into the slot (at once, queue 0, or by a copy that does not
 * wait) and counts a queued step; dlrec_net_ws_loss takes the oldest queued
 * step's, waiting for it. */
dlrec_status dlrec_net_ws_loss_slot(dlrec_net_ws *ws, int queue, double **slot);
dlrec_status dlrec_net_ws_loss_sent(dlrec_net *n, dlrec_net_ws *ws, double *slot, int queue);
dlrec_status dlrec_net_ws_loss(dlrec_net_ws *ws, double *loss);
/* Whether the workspace's steps are queued (a device: a GPU, or cpu-mirror,
 * which stands in for one); 0 on the CPU, where queueing gains nothing. */
int dlrec_net_ws_queues(const dlrec_net_ws *ws);

/* The largest dynamic loss scale, and the one a dynamic run starts at
 * (PyTorch's GradScaler's). */
#define DLREC_LOSS_SCALE_MAX 0x1p24f
#define DLREC_LOSS_SCALE_INIT 65536.0f

/* For gradient checks: forward + backward without any update, leaving the
 * dense gradients in *grad (n floats, valid until the next call) and d_emb
 * (B, F, D) in *d_emb. */
dlrec_status dlrec_net_gradients(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, double *loss,
                                 const float **grad, const float **d_emb);

#endif
