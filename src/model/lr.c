/* Logistic regression as a model type ("lr"): one weight per categorical id
 * (an embedding of width 1, so a bag's pooled embedding is the sum, or mean,
 * of its ids' weights), a linear layer over the dense features, and a bias:
 *   logit_b = linear(dense_b) + emb[b][0][0] + .. + emb[b][F-1][0]
 * Its tensors are "linear.weight" (1, n_dense) and "linear.bias" (1), whose
 * bias is the model's; on data with no dense column, "bias" (1) alone. The
 * id weights live in the embedding table, updated by the sparse optimizer.
 *
 * The dense part runs through net_linear_forward, so that scoring uses the
 * batch-invariant packed kernel; the sum over columns is per row and in
 * column order, so a row's score has the same bits in any batch.
 */
#include <string.h>

#include "core/arena.h"
#include "core/json.h"
#include "core/clock.h"
#include "model/model_type.h"
#include "core/onnx.h"

typedef struct lr_config {
  dlrec_pooling pooling; /* how multi-hot bags pool their ids' weights */
} lr_config;

_Static_assert(sizeof(lr_config) <= DLREC_NET_CONFIG_BYTES, "the LR config fits a model config");

/* ---- config ------------------------------------------------------------------ */

static void config_default(void *cfg) {
  lr_config c = {.pooling = DLREC_POOLING_SUM};
  memcpy(cfg, &c, sizeof c);
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "pooling", NULL};
  lr_config *c = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  return s == DLREC_OK ? net_config_pooling(o, what, &c->pooling) : s;
}

static void config_to_json(const void *cfg, cJSON *m) {
  const lr_config *c = cfg;
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(c->pooling));
}

/* ---- plan -------------------------------------------------------------------- */

typedef struct lr {
  uint32_t n_sparse;
  net_dense_term dense; /* the linear layer on the dense features, or the lone bias */
} lr;

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const lr_config *c = cfg;
  lr *m = ctx;
  if (schema->n_sparse + schema->n_dense < 1)
    return dlrec_error(DLREC_ERR_INVALID, "LR needs at least one dense or categorical column");
  m->n_sparse = schema->n_sparse;
  p->emb_dim = 1;
  p->pooling = c->pooling;
  return net_dense_term_plan(&m->dense, p, schema->n_dense);
}

/* The dense term as net_dense_term_init says; the id weights are the
 * generic embedding init. */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  (void)p;
  const lr *m = ctx;
  net_dense_term_init(&m->dense, params, seed, 3000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct lr_ws {
  dlrec_arena arena; /* where the buffers live (what dlrec_net_ws_bytes counts) */
  float *logits;     /* (B) */
  float *col;        /* (B): one column's id weights, gathered */
} lr_ws;

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  (void)ctx;
  lr_ws *w = ws;
  net_ws_rows(a, &w->logits, 1);
  net_ws_rows(a, &w->col, 1);
}

/* ---- forward and backward ----------------------------------------------------- */

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const lr *m = ctx;
  lr_ws *w = ws;
  int B = io->B;
  double t = dlrec_now();
  dlrec_status st = net_dense_term_forward(&m->dense, io, w->logits);
  net_lap(&io->prof->mlp, &t);
  /* The id weights added column by column, each sample's in column order:
   * a gather of the column, then an add (ops, so the emb stays where the
   * backend keeps it). */
  for (uint32_t c = 0; st == DLREC_OK && c < m->n_sparse; c++) {
    st = BE_OP(io->be, copy_rows, w->col, 1, io->emb + c, m->n_sparse, (size_t)B, 1);
    if (st == DLREC_OK) st = BE_OP(io->be, add, w->logits, w->col, (size_t)B);
  }
  net_lap(&io->prof->interaction, &t);
  *logits = w->logits;
  return st;
}

static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const lr *m = ctx;
  (void)ws;
  int B = io->B;
  double t = dlrec_now();
  /* Every id weight of a row gets the row's logit gradient (the bag's
   * pooling backward spreads it over the bag's ids): the wide term's
   * backward, without its bias. */
  dlrec_status st = m->n_sparse ? BE_OP(io->be, wide_backward, d_emb, NULL, d_logits, B, (int)m->n_sparse) : DLREC_OK;
  net_lap(&io->prof->interaction, &t);
  if (st == DLREC_OK) st = net_dense_term_backward(&m->dense, io, d_logits, g);
  net_lap(&io->prof->mlp, &t);
  return st;
}

/* ---- ONNX export ---------------------------------------------------------------- */

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const lr *m = ctx;
  const char *z = net_dense_term_export(&m->dense, p, params, g, dense);
  if (emb) z = onnx_op2(g, "Add", z, net_wide_export(g, emb)); /* emb (N, F, 1): Σ_f of the id weights */
  return z;
}

const net_type net_type_lr = {
    .name = "lr",
    .doc = "logistic regression: a weight per id, a linear term on the dense features",
    .config_default = config_default,
    .config_parse = config_parse,
    .config_to_json = config_to_json,
    .ctx_size = sizeof(lr),
    .plan = plan,
    .init = init,
    .ws_size = sizeof(lr_ws),
    .ws_arrays = ws_arrays,
    .forward = forward,
    .backward = backward,
    .export_onnx = export_onnx,
    .tests = (const net_test_config[]){{"{}", DLREC_NET_TEST_GRADIENTS | DLREC_NET_TEST_AGREEMENT}, {NULL, 0}},
};
