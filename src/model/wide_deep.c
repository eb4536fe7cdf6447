/* Wide & Deep (Cheng et al. 2016) and DeepFM (Guo et al. 2017) as model
 * types ("wide_deep", "deepfm"). DeepFM is Wide & Deep whose wide part is a
 * factorization machine, so both are this one file and differ by one flag
 * of the config (set by the type's defaults, not a key):
 *   wide_deep: logit_b = linear(dense_b) + Σ_f w_bf + MLP([dense_b, v_b1 .. v_bF])
 *   deepfm:    logit_b = linear(dense_b) + Σ_f w_bf + Σ_{f<g} <v_bf, v_bg>
 *                        + MLP([dense_b, v_b1 .. v_bF])
 * where, for column f of row b, w_bf is the pooled first-order weight of its
 * ids and v_bf (D) their pooled embedding, the wide part and the deep part
 * sharing the embeddings as DeepFM does. As in fm, both live in one table
 * of rows D + 1 wide (nn/fm_split.c). The MLP (nn/mlp.c) has the hidden
 * layers `mlp`, each Linear -> [BatchNorm] -> ReLU -> [Dropout], and an
 * output Linear to one logit.
 *
 * Shapes: dense (B, n_dense), emb (B, F, D + 1) -> v (B, F, D), w (B, F);
 * the MLP reads x (B, n_dense + F·D). On data with no dense column the
 * linear term is a lone bias and the MLP reads v alone (F·D). Data with no
 * categorical column is refused: both models are built on the embeddings
 * (without them Wide & Deep would be a plain MLP, and DeepFM's FM term
 * would have nothing to interact).
 *
 * Tensors: the linear term's ("linear.weight" (1, n_dense) and
 * "linear.bias" (1), or "bias" (1) alone), then the MLP's "mlp.L.weight",
 * "mlp.L.bias" and, with batch normalization, "mlp.L.bn.weight",
 * "mlp.L.bn.bias" and the buffers "mlp.L.bn.running_mean",
 * "mlp.L.bn.running_var" (L = n_hidden is the output layer).
 *
 * The linear layers run through net_linear_forward (the packed
 * batch-invariant kernel when scoring), batch normalization scores with its
 * running statistics and dropout is off when scoring; the wide and FM terms
 * are per row in a fixed order, and the terms are summed in the order of
 * the formulas above: a row's score has the same bits in any batch.
 */
#include <string.h>

#include "core/arena.h"
#include "core/json.h"
#include "core/clock.h"
#include "model/model_type.h"
#include "core/onnx.h"

typedef struct wd_config {
  uint32_t emb_dim;       /* D, the embeddings' width (the table's rows are D + 1) */
  dlrec_pooling pooling; /* how multi-hot bags pool */
  net_mlp_config mlp;     /* the deep part's hidden layers, dropout, batch norm */
  int fm;                 /* deepfm: the FM second-order term too */
} wd_config;

_Static_assert(sizeof(wd_config) <= DLREC_NET_CONFIG_BYTES, "the Wide & Deep config fits a model config");

/* ---- config ------------------------------------------------------------------ */

/* Built in place on a zeroed struct, so that two configs compare with memcmp. */
static void defaults(void *cfg, int fm) {
  wd_config *c = cfg;
  memset(c, 0, sizeof *c);
  c->emb_dim = 16;
  c->pooling = DLREC_POOLING_SUM;
  c->mlp.n_hidden = 3;
  for (int l = 0; l < 3; l++) c->mlp.hidden[l] = 400;
  c->fm = fm;
}

static void wide_deep_default(void *cfg) { defaults(cfg, 0); }
static void deepfm_default(void *cfg) { defaults(cfg, 1); }

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "embedding_dim", "pooling", "mlp", "dropout", "batch_norm", NULL};
  wd_config *c = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_fm_config_dim(o, what, &c->emb_dim);
  if (s == DLREC_OK) s = net_config_pooling(o, what, &c->pooling);
  return s == DLREC_OK ? net_mlp_config_parse(&c->mlp, o, what) : s;
}

static void config_to_json(const void *cfg, cJSON *m) {
  const wd_config *c = cfg;
  cJSON_AddNumberToObject(m, "embedding_dim", c->emb_dim);
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(c->pooling));
  net_mlp_config_to_json(&c->mlp, m);
}

/* ---- plan -------------------------------------------------------------------- */

typedef struct wide_deep {
  uint32_t n_dense, n_sparse, D;
  int fm;
  net_dense_term dense; /* the linear layer on the dense features, or the lone bias */
  net_mlp mlp;          /* the deep part, on x (n_dense + F·D) */
} wide_deep;

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const wd_config *c = cfg;
  wide_deep *m = ctx;
  const char *name = c->fm ? "DeepFM" : "Wide & Deep";
  if (schema->n_sparse < 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s needs at least one categorical column (it is built on their "
                       "embeddings)", name);
  if (c->emb_dim < 1 || c->emb_dim > DLREC_EMBED_MAX_DIM - 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s embedding dim %u out of range [1, %d]", name, c->emb_dim,
                       DLREC_EMBED_MAX_DIM - 1);
  uint64_t in = schema->n_dense + (uint64_t)schema->n_sparse * c->emb_dim;
  if (in > (1u << 24))
    return dlrec_error(DLREC_ERR_INVALID, "%s MLP input of %llu (n_dense + F x embedding_dim) is too wide", name,
                       (unsigned long long)in);
  m->n_dense = schema->n_dense;
  m->n_sparse = schema->n_sparse;
  m->D = c->emb_dim;
  m->fm = c->fm;
  p->emb_dim = c->emb_dim + 1;
  p->pooling = c->pooling;
  dlrec_status st = net_dense_term_plan(&m->dense, p, schema->n_dense);
  return st == DLREC_OK ? net_mlp_plan(&m->mlp, p, "mlp", (uint32_t)in, &c->mlp, 1) : st;
}

/* The linear term as fm's (stream 4000), the MLP's layers from streams
 * 5000 + l; the table is the generic embedding init. */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  const wide_deep *m = ctx;
  net_dense_term_init(&m->dense, params, seed, 4000);
  net_mlp_init(&m->mlp, p, params, seed, 5000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct wd_ws {
  dlrec_arena arena;
  float *logits, *first, *second; /* (B) each: the result, the wide term, the FM term */
  float *d_deep;                  /* (B) the MLP's d_logits, which its backward overwrites */
  float *v, *w, *dw;              /* factors (B, F, D); weights and their gradient (B, F) */
  float *dv_fm;                   /* the FM term's gradient of v (B, F, D), deepfm only */
  float *x, *dx;                  /* the MLP's input and its gradient (B, n_dense + F·D) */
  float *dv;                      /* the factors' gradient gathered (B, F·D), net_fm_join's scratch */
  const float *in;                /* what the MLP read: x, v or the dense features */
  float *mlp;                     /* the MLP's workspace */
} wd_ws;

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const wide_deep *m = ctx;
  wd_ws *w = ws;
  const size_t F = m->n_sparse, FD = F * m->D;
  net_ws_rows(a, &w->logits, 1);
  net_ws_rows(a, &w->first, 1);
  net_ws_rows(a, &w->second, 1);
  net_ws_rows(a, &w->d_deep, 1);
  net_ws_rows(a, &w->v, FD);
  net_ws_rows(a, &w->w, F);
  net_ws_rows(a, &w->dw, F);
  if (m->fm) net_ws_rows(a, &w->dv_fm, FD);
  net_ws_rows(a, &w->x, m->mlp.in);
  net_ws_rows(a, &w->dx, m->mlp.in);
  if (m->n_dense || m->fm) net_ws_rows(a, &w->dv, FD);
  net_ws_floats(a, &w->mlp, net_mlp_ws_floats(&m->mlp, (uint32_t)a->rows));
}

/* ---- forward and backward ----------------------------------------------------- */

/* The MLP's input x (B, n_dense + F·D): each row's dense features, then its
 * factors, into *in. With no dense column x is v itself. */
static dlrec_status deep_input(const wide_deep *m, wd_ws *w, const net_io *io, const float **in) {
  *in = m->n_dense ? w->x : w->v;
  return m->n_dense ? net_concat_forward(io->be, w->x, io->dense, m->n_dense, w->v, (size_t)m->n_sparse * m->D,
                                         (size_t)io->B)
                    : DLREC_OK;
}

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const wide_deep *m = ctx;
  wd_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->D;
  double t = dlrec_now();
  dlrec_status st = net_fm_split(io->be, w->v, w->w, io->emb, (size_t)B * F, m->D);
  if (st == DLREC_OK) st = BE_OP(io->be, wide_forward, w->first, w->w, NULL, B, F);
  if (st == DLREC_OK && m->fm) st = BE_OP(io->be, fm_forward, w->second, w->v, B, F, D);
  net_lap(&io->prof->interaction, &t);
  const float *deep = NULL;
  if (st == DLREC_OK) st = net_dense_term_forward(&m->dense, io, w->logits);
  if (st == DLREC_OK) st = deep_input(m, w, io, &w->in);
  if (st == DLREC_OK) st = net_mlp_forward(&m->mlp, io, w->mlp, w->in, &deep);
  /* linear + first order [+ second order] + deep, in that order for every row. */
  if (st == DLREC_OK) st = BE_OP(io->be, add, w->logits, w->first, (size_t)B);
  if (st == DLREC_OK && m->fm) st = BE_OP(io->be, add, w->logits, w->second, (size_t)B);
  if (st == DLREC_OK) st = BE_OP(io->be, add, w->logits, deep, (size_t)B);
  net_lap(&io->prof->mlp, &t);
  *logits = w->logits;
  return st;
}

static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const wide_deep *m = ctx;
  wd_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->D;
  double t = dlrec_now();
  /* The MLP's input gradient is needed only where it is v; the dense
   * features' part is computed and left unused. */
  dlrec_status st = BE_OP(io->be, copy_rows, w->d_deep, (size_t)B, d_logits, (size_t)B, 1, (size_t)B);
  if (st == DLREC_OK) st = net_mlp_backward(&m->mlp, io, w->mlp, w->in, w->d_deep, w->dx, g);
  if (st == DLREC_OK) st = net_dense_term_backward(&m->dense, io, d_logits, g);
  net_lap(&io->prof->mlp, &t);
  if (st == DLREC_OK) st = BE_OP(io->be, wide_backward, w->dw, NULL, d_logits, B, F);
  if (st == DLREC_OK && m->fm) st = BE_OP(io->be, fm_backward, w->dv_fm, d_logits, w->v, B, F, D);
  if (st == DLREC_OK)
    st = net_fm_join(io->be, d_emb, w->dx + m->n_dense, m->mlp.in, m->fm ? w->dv_fm : NULL, w->dw, w->dv, B, F, m->D);
  net_lap(&io->prof->interaction, &t);
  return st;
}

/* ---- ONNX export ---------------------------------------------------------------- */

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const wide_deep *m = ctx;
  const char *v, *w;
  net_fm_split_export(g, emb, m->D, &v, &w);
  const char *z = onnx_op2(g, "Add", net_dense_term_export(&m->dense, p, params, g, dense), net_wide_export(g, w));
  if (m->fm) z = onnx_op2(g, "Add", z, net_fm_export(g, v));
  const char *in = net_concat_export(g, m->n_dense ? dense : NULL, v); /* [dense, v_1 .. v_F] */
  return onnx_op2(g, "Add", z, net_mlp_export(&m->mlp, p, params, g, in));
}

/* The generic tests' configs (net_test_config): small networks for the
 * finite differences, with and without batch normalization and dropout; the
 * defaults, and batch normalization, across backends; batch normalization
 * and dropout for the kept operands. */
#define WIDE_DEEP_SMALL "{\"embedding_dim\": 3, \"mlp\": [5, 4]"
static const net_test_config tests[] = {
    {WIDE_DEEP_SMALL "}", DLREC_NET_TEST_GRADIENTS},
    {WIDE_DEEP_SMALL ", \"batch_norm\": true, \"dropout\": 0.25}", DLREC_NET_TEST_GRADIENTS},
    {"{}", DLREC_NET_TEST_AGREEMENT},
    {"{\"batch_norm\": true}", DLREC_NET_TEST_AGREEMENT},
    {"{\"batch_norm\": true, \"dropout\": 0.2}", DLREC_NET_TEST_KEPT},
    {NULL, 0},
};
static const net_test_config deepfm_tests[] = {
    {WIDE_DEEP_SMALL "}", DLREC_NET_TEST_GRADIENTS},
    {WIDE_DEEP_SMALL ", \"batch_norm\": true, \"dropout\": 0.25}", DLREC_NET_TEST_GRADIENTS},
    {"{}", DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
    {NULL, 0},
};

#define WIDE_DEEP_TYPE(NAME, DOC, DEFAULTS, TESTS)                                                    \
  {                                                                                                   \
    .name = NAME, .doc = DOC, .config_default = DEFAULTS, .config_parse = config_parse,               \
    .config_to_json = config_to_json, .ctx_size = sizeof(wide_deep), .plan = plan, .init = init,      \
    .ws_size = sizeof(wd_ws), .ws_arrays = ws_arrays, .forward = forward, .backward = backward,       \
    .export_onnx = export_onnx, .tests = TESTS,                                                       \
  }

const net_type net_type_wide_deep =
    WIDE_DEEP_TYPE("wide_deep", "Wide & Deep: a linear part beside an MLP over dense features and embeddings",
                   wide_deep_default, tests);
const net_type net_type_deepfm =
    WIDE_DEEP_TYPE("deepfm", "DeepFM: Wide & Deep whose wide part is a factorization machine",
                   deepfm_default, deepfm_tests);
