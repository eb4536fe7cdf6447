/* DNN as a model type ("dnn"): an MLP over the dense features and the
 * pooled embeddings side by side, FuxiCTR's DNN and BARS's "DNN" row:
 *   x = [dense, e_1 .. e_F]                    (B, n_dense + F·D)
 *   logit = MLP(x)                             hidden layers, then Linear to 1
 * The MLP is nn/mlp.c's: each hidden layer of `mlp` Linear -> [BatchNorm]
 * -> ReLU -> [Dropout], then an output Linear to one logit. On data with no
 * dense column x is the embeddings alone, with no categorical column the
 * dense features alone (the table is then a placeholder row).
 *
 * Tensors: "mlp.L.weight", "mlp.L.bias" and, with batch normalization,
 * "mlp.L.bn.weight", "mlp.L.bn.bias" per hidden layer L, the output layer
 * "mlp.N.weight" (1, width) and "mlp.N.bias" (N = the number of hidden
 * layers), then the running statistics "mlp.L.bn.running_mean" and
 * "mlp.L.bn.running_var". The linear layers run through
 * net_linear_forward (the packed batch-invariant kernel when scoring) and
 * the concatenation copies each row on its own, so a row's score has the
 * same bits in any batch.
 */
#include <string.h>

#include "core/clock.h"
#include "core/json.h"
#include "core/onnx.h"
#include "model/model_type.h"

typedef struct dnn_config {
  uint32_t emb_dim;       /* D */
  dlrec_pooling pooling; /* how multi-hot bags pool */
  net_mlp_config mlp;     /* hidden layers, dropout, batch norm */
} dnn_config;

_Static_assert(sizeof(dnn_config) <= DLREC_NET_CONFIG_BYTES, "the DNN config fits a model config");

/* BARS's DNN on Criteo: embeddings of 16, three hidden layers of 400. */
static void config_default(void *cfg) {
  dnn_config *c = cfg;
  c->emb_dim = 16;
  c->pooling = DLREC_POOLING_SUM;
  c->mlp.n_hidden = 3;
  c->mlp.hidden[0] = c->mlp.hidden[1] = c->mlp.hidden[2] = 400;
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "embedding_dim", "pooling", "mlp", "dropout", "batch_norm", NULL};
  dnn_config *c = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_config_u32(o, "embedding_dim", what, 1, DLREC_EMBED_MAX_DIM, &c->emb_dim);
  if (s == DLREC_OK) s = net_config_pooling(o, what, &c->pooling);
  return s == DLREC_OK ? net_mlp_config_parse(&c->mlp, o, what) : s;
}

static void config_to_json(const void *cfg, cJSON *m) {
  const dnn_config *c = cfg;
  cJSON_AddNumberToObject(m, "embedding_dim", c->emb_dim);
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(c->pooling));
  net_mlp_config_to_json(&c->mlp, m);
}

typedef struct dnn {
  uint32_t n_dense, FD; /* the input's two parts: dense features, F·D embedding values */
  net_mlp mlp;
} dnn;

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const dnn_config *c = cfg;
  dnn *m = ctx;
  if (c->emb_dim < 1 || c->emb_dim > DLREC_EMBED_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "DNN embedding dim %u out of range [1, %d]", c->emb_dim,
                       DLREC_EMBED_MAX_DIM);
  const uint64_t in = schema->n_dense + (uint64_t)schema->n_sparse * c->emb_dim;
  if (in < 1) return dlrec_error(DLREC_ERR_INVALID, "DNN needs at least one dense or categorical column");
  if (in > (1u << 24))
    return dlrec_error(DLREC_ERR_INVALID, "DNN MLP input of %llu (n_dense + F x embedding_dim) is too wide",
                       (unsigned long long)in);
  m->n_dense = schema->n_dense;
  m->FD = (uint32_t)(in - schema->n_dense);
  p->emb_dim = c->emb_dim;
  p->pooling = c->pooling;
  return net_mlp_plan(&m->mlp, p, "mlp", (uint32_t)in, &c->mlp, 1);
}

/* The MLP's layers from streams 5000 + l, as wide_deep's. */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  const dnn *m = ctx;
  net_mlp_init(&m->mlp, p, params, seed, 5000);
}

typedef struct dnn_ws {
  dlrec_arena arena;
  float *x, *dx;   /* the MLP's input [dense, emb] and its gradient, with both parts */
  float *mlp;      /* the MLP's workspace */
  const float *in; /* what the MLP read: x, or one part alone */
} dnn_ws;

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const dnn *m = ctx;
  dnn_ws *w = ws;
  if (m->n_dense && m->FD) {
    net_ws_rows(a, &w->x, m->mlp.in);
    net_ws_rows(a, &w->dx, m->mlp.in);
  }
  net_ws_floats(a, &w->mlp, net_mlp_ws_floats(&m->mlp, (uint32_t)a->rows));
}

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const dnn *m = ctx;
  dnn_ws *w = ws;
  double t = dlrec_now();
  dlrec_status st = DLREC_OK;
  w->in = !m->FD ? io->dense : !m->n_dense ? io->emb : w->x;
  if (w->in == w->x) st = net_concat_forward(io->be, w->x, io->dense, m->n_dense, io->emb, m->FD, (size_t)io->B);
  net_lap(&io->prof->interaction, &t);
  if (st == DLREC_OK) st = net_mlp_forward(&m->mlp, io, w->mlp, w->in, logits);
  net_lap(&io->prof->mlp, &t);
  return st;
}

/* The input's gradient goes straight into d_emb when the embeddings are
 * the whole input; the dense features take none. */
static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const dnn *m = ctx;
  dnn_ws *w = ws;
  double t = dlrec_now();
  float *din = !m->FD ? NULL : !m->n_dense ? d_emb : w->dx;
  dlrec_status st = net_mlp_backward(&m->mlp, io, w->mlp, w->in, d_logits, din, g);
  net_lap(&io->prof->mlp, &t);
  if (st == DLREC_OK && din == w->dx)
    st = net_concat_backward(io->be, d_emb, w->dx, m->n_dense, m->FD, (size_t)io->B);
  net_lap(&io->prof->interaction, &t);
  return st;
}

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const dnn *m = ctx;
  return net_mlp_export(&m->mlp, p, params, g, net_concat_export(g, dense, emb));
}

/* The generic tests' configs (net_test_config): small networks for the
 * finite differences, with and without batch normalization and dropout; the
 * defaults, and batch normalization, across backends; batch normalization
 * and dropout for the kept operands. */
#define DNN_SMALL "{\"embedding_dim\": 3, \"mlp\": [5, 4]"
static const net_test_config tests[] = {
    {DNN_SMALL "}", DLREC_NET_TEST_GRADIENTS},
    {DNN_SMALL ", \"batch_norm\": true, \"dropout\": 0.25}", DLREC_NET_TEST_GRADIENTS},
    {"{}", DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
    {"{\"batch_norm\": true}", DLREC_NET_TEST_AGREEMENT},
    {"{\"embedding_dim\": 8, \"mlp\": [32, 16], \"batch_norm\": true, \"dropout\": 0.2}", DLREC_NET_TEST_KEPT},
    {NULL, 0},
};

const net_type net_type_dnn = {
    .name = "dnn",
    .doc = "DNN: an MLP over the dense features and the embeddings side by side",
    .config_default = config_default,
    .config_parse = config_parse,
    .config_to_json = config_to_json,
    .ctx_size = sizeof(dnn),
    .plan = plan,
    .init = init,
    .ws_size = sizeof(dnn_ws),
    .ws_arrays = ws_arrays,
    .forward = forward,
    .backward = backward,
    .export_onnx = export_onnx,
    .tests = tests,
};
