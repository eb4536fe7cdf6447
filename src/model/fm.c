/* The factorization machine (Rendle 2010) as a model type ("fm"): first and
 * second order over the categorical ids, plus a linear layer over the dense
 * features:
 *   logit_b = linear(dense_b) + Σ_f w_bf + Σ_{f<g} <v_bf, v_bg>
 * where, for column f of row b, w_bf is the pooled first-order weight of its
 * ids and v_bf (D) their pooled factor vector.
 *
 * Both live in the one embedding table, whose rows are D + 1 wide: the first
 * D coordinates are an id's factors, the last its first-order weight. The
 * generic stage pools the rows into emb (B, F, D + 1); this type splits each
 * row into v (B, F, D) and w (B, F) for the FM and wide blocks of src/nn,
 * and joins their gradients back into d_emb (nn/fm_split.c, which wide_deep
 * and deepfm share). One table means one lookup per id and one sparse
 * optimizer state per row (shared by an id's factors and weight).
 *
 * Tensors: "linear.weight" (1, n_dense) and "linear.bias" (1), whose bias is
 * the model's; on data with no dense column, "bias" (1) alone. The dense
 * part runs through net_linear_forward (the packed batch-invariant kernel
 * when scoring); the FM and wide blocks are per row in fixed order, so a
 * row's score has the same bits in any batch.
 */
#include <string.h>

#include "core/arena.h"
#include "core/json.h"
#include "core/clock.h"
#include "model/model_type.h"
#include "core/onnx.h"

typedef struct fm_config {
  uint32_t emb_dim;       /* D, the factors' width (the table's rows are D + 1) */
  dlrec_pooling pooling; /* how multi-hot bags pool */
} fm_config;

_Static_assert(sizeof(fm_config) <= DLREC_NET_CONFIG_BYTES, "the FM config fits a model config");

/* ---- config ------------------------------------------------------------------ */

static void config_default(void *cfg) {
  fm_config c = {.emb_dim = 16, .pooling = DLREC_POOLING_SUM};
  memcpy(cfg, &c, sizeof c);
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "embedding_dim", "pooling", NULL};
  fm_config *c = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_fm_config_dim(o, what, &c->emb_dim);
  return s == DLREC_OK ? net_config_pooling(o, what, &c->pooling) : s;
}

static void config_to_json(const void *cfg, cJSON *m) {
  const fm_config *c = cfg;
  cJSON_AddNumberToObject(m, "embedding_dim", c->emb_dim);
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(c->pooling));
}

/* ---- plan -------------------------------------------------------------------- */

typedef struct fm {
  uint32_t n_sparse, D;
  net_dense_term dense; /* the linear layer on the dense features, or the lone bias */
} fm;

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const fm_config *c = cfg;
  fm *m = ctx;
  if (schema->n_sparse < 1) return dlrec_error(DLREC_ERR_INVALID, "FM needs at least one categorical column");
  if (c->emb_dim < 1 || c->emb_dim > DLREC_EMBED_MAX_DIM - 1)
    return dlrec_error(DLREC_ERR_INVALID, "FM embedding dim %u out of range [1, %d]", c->emb_dim,
                       DLREC_EMBED_MAX_DIM - 1);
  m->n_sparse = schema->n_sparse;
  m->D = c->emb_dim;
  p->emb_dim = c->emb_dim + 1;
  p->pooling = c->pooling;
  return net_dense_term_plan(&m->dense, p, schema->n_dense);
}

/* The dense term as net_dense_term_init says; the table (factors and
 * first-order weights) is the generic embedding init. */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  (void)p;
  const fm *m = ctx;
  net_dense_term_init(&m->dense, params, seed, 4000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct fm_ws {
  dlrec_arena arena;              /* where the buffers live (what dlrec_net_ws_bytes counts) */
  float *logits, *second, *first; /* (B) each: the result, the FM term, the wide term */
  float *v, *w;                   /* the split emb: factors (B, F, D), weights (B, F) */
  float *dv, *dw;                 /* their gradients */
} fm_ws;

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const fm *m = ctx;
  fm_ws *w = ws;
  const size_t FD = (size_t)m->n_sparse * m->D;
  net_ws_rows(a, &w->logits, 1);
  net_ws_rows(a, &w->second, 1);
  net_ws_rows(a, &w->first, 1);
  net_ws_rows(a, &w->v, FD);
  net_ws_rows(a, &w->dv, FD);
  net_ws_rows(a, &w->w, m->n_sparse);
  net_ws_rows(a, &w->dw, m->n_sparse);
}

/* ---- forward and backward ----------------------------------------------------- */

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const fm *m = ctx;
  fm_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->D;
  double t = dlrec_now();
  dlrec_status st = net_dense_term_forward(&m->dense, io, w->logits);
  net_lap(&io->prof->mlp, &t);
  if (st == DLREC_OK) st = net_fm_split(io->be, w->v, w->w, io->emb, (size_t)B * F, m->D);
  if (st == DLREC_OK) st = BE_OP(io->be, fm_forward, w->second, w->v, B, F, D);
  if (st == DLREC_OK) st = BE_OP(io->be, wide_forward, w->first, w->w, NULL, B, F);
  /* linear + first order + second order, in that order for every row. */
  if (st == DLREC_OK) st = BE_OP(io->be, add, w->logits, w->first, (size_t)B);
  if (st == DLREC_OK) st = BE_OP(io->be, add, w->logits, w->second, (size_t)B);
  net_lap(&io->prof->interaction, &t);
  *logits = w->logits;
  return st;
}

static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const fm *m = ctx;
  fm_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->D;
  double t = dlrec_now();
  dlrec_status st = BE_OP(io->be, fm_backward, w->dv, d_logits, w->v, B, F, D);
  if (st == DLREC_OK) st = BE_OP(io->be, wide_backward, w->dw, NULL, d_logits, B, F);
  if (st == DLREC_OK) st = net_fm_join(io->be, d_emb, w->dv, (size_t)F * D, NULL, w->dw, NULL, B, F, m->D);
  net_lap(&io->prof->interaction, &t);
  if (st == DLREC_OK) st = net_dense_term_backward(&m->dense, io, d_logits, g);
  net_lap(&io->prof->mlp, &t);
  return st;
}

/* ---- ONNX export ---------------------------------------------------------------- */

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const fm *m = ctx;
  const char *v, *w;
  net_fm_split_export(g, emb, m->D, &v, &w);
  const char *z = onnx_op2(g, "Add", net_dense_term_export(&m->dense, p, params, g, dense), net_wide_export(g, w));
  return onnx_op2(g, "Add", z, net_fm_export(g, v));
}

const net_type net_type_fm = {
    .name = "fm",
    .doc = "factorization machine: first and second order over the ids, a dense term",
    .config_default = config_default,
    .config_parse = config_parse,
    .config_to_json = config_to_json,
    .ctx_size = sizeof(fm),
    .plan = plan,
    .init = init,
    .ws_size = sizeof(fm_ws),
    .ws_arrays = ws_arrays,
    .forward = forward,
    .backward = backward,
    .export_onnx = export_onnx,
    .tests = (const net_test_config[]){{"{\"embedding_dim\": 3}", DLREC_NET_TEST_GRADIENTS | DLREC_NET_TEST_AGREEMENT},
                                       {NULL, 0}},
};
