/* DLRM as a model type: its config section, plan, init, and its forward and
 * backward between the embedding stage and the logits. Shapes (B = batch
 * rows, F = sparse columns, D = emb_dim, I = D + F(F+1)/2 the dot
 * interaction's width, or D + F·D the concat interaction's):
 *   dense (B, n_dense) -> bottom MLP -> x (B, D)
 *   [x, emb (B, F, D)] -> interaction -> inter (B, I) -> top MLP -> logit (B, 1)
 * On data with no dense column there is no bottom MLP and no x: the dot
 * interaction runs over the F embeddings alone, I = F(F-1)/2 (their pairs),
 * as the DLRM reference does when its bottom MLP has nothing to read, or
 * with "cat" the F embeddings concatenated, I = F·D. The config's
 * bottom_mlp is then unused.
 *
 * Both MLPs are nn/mlp.c's: the bottom one of hidden layers alone (a ReLU
 * on each, its last's included), the top one of hidden layers and the
 * logit's output layer (no ReLU), with top_mlp_dropout and
 * top_mlp_batch_norm in its hidden layers (BARS's DLRM protocol; off by
 * default).
 */
#include "model/dlrm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/json.h"
#include "core/clock.h"
#include "core/rng.h"
#include "model/model_type.h"
#include "core/onnx.h"

_Static_assert(sizeof(dlrec_dlrm_shape) <= DLREC_NET_CONFIG_BYTES, "the DLRM shape fits a model config");

/* ---- config ------------------------------------------------------------------ */

/* The Criteo Kaggle DLRM. */
static void config_default(void *cfg) {
  dlrec_dlrm_shape sh = {.emb_dim = 16, .n_bottom = 4, .bottom = {512, 256, 64, 16}, .n_top = 3,
                         .top = {512, 256, 1}, .pooling = DLREC_POOLING_SUM, .interaction = DLREC_DLRM_DOT};
  memcpy(cfg, &sh, sizeof sh);
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type",        "embedding_dim",   "bottom_mlp",         "top_mlp", "pooling",
                               "interaction", "top_mlp_dropout", "top_mlp_batch_norm", NULL};
  dlrec_dlrm_shape *sh = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_config_u32(o, "embedding_dim", what, 1, DLREC_EMBED_MAX_DIM, &sh->emb_dim);
  if (s == DLREC_OK) s = net_config_widths(o, "bottom_mlp", what, 1, DLREC_MLP_MAX_LAYERS, &sh->n_bottom, sh->bottom);
  if (s == DLREC_OK) s = net_config_widths(o, "top_mlp", what, 1, DLREC_MLP_MAX_LAYERS, &sh->n_top, sh->top);
  if (s == DLREC_OK) s = net_config_pooling(o, what, &sh->pooling);
  if (s == DLREC_OK) s = net_config_rate(o, "top_mlp_dropout", what, &sh->top_dropout);
  if (s == DLREC_OK) s = dlrec_json_get_bool_or(o, "top_mlp_batch_norm", what, sh->top_batch_norm, &sh->top_batch_norm);
  if (s != DLREC_OK) return s;
  const char *inter = NULL;
  if ((s = dlrec_json_get_string_or(o, "interaction", what, NULL, &inter)) != DLREC_OK) return s;
  if (inter && !strcmp(inter, "dot")) sh->interaction = DLREC_DLRM_DOT;
  else if (inter && !strcmp(inter, "cat")) sh->interaction = DLREC_DLRM_CAT;
  else if (inter)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'interaction': '%s' is not one of dot, cat", what, inter);
  if (sh->bottom[sh->n_bottom - 1] != sh->emb_dim)
    return dlrec_error(DLREC_ERR_INVALID, "%s: bottom_mlp must end with embedding_dim (%u), not %u", what, sh->emb_dim,
                       sh->bottom[sh->n_bottom - 1]);
  if (sh->top[sh->n_top - 1] != 1)
    return dlrec_error(DLREC_ERR_INVALID, "%s: top_mlp must end with 1 (the logit), not %u", what,
                       sh->top[sh->n_top - 1]);
  return DLREC_OK;
}

static void config_to_json(const void *cfg, cJSON *m) {
  const dlrec_dlrm_shape *sh = cfg;
  cJSON_AddNumberToObject(m, "embedding_dim", sh->emb_dim);
  cJSON_AddItemToObject(m, "bottom_mlp", net_widths_json(sh->bottom, sh->n_bottom));
  cJSON_AddItemToObject(m, "top_mlp", net_widths_json(sh->top, sh->n_top));
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(sh->pooling));
  cJSON_AddStringToObject(m, "interaction", sh->interaction == DLREC_DLRM_CAT ? "cat" : "dot");
  /* The top MLP's options only when set: a config without them writes what
   * it did before they existed, byte for byte. */
  if (sh->top_dropout > 0.0f) cJSON_AddNumberToObject(m, "top_mlp_dropout", sh->top_dropout);
  if (sh->top_batch_norm) cJSON_AddBoolToObject(m, "top_mlp_batch_norm", 1);
}

void dlrec_dlrm_config(dlrec_net_config *c, const dlrec_dlrm_shape *shape) {
  memset(c, 0, sizeof *c);
  snprintf(c->type, sizeof c->type, "dlrm");
  memcpy(c->params, shape, sizeof *shape);
}

const dlrec_dlrm_shape *dlrec_dlrm_shape_of(const dlrec_net_config *c) {
  return strcmp(c->type, "dlrm") ? NULL : (const dlrec_dlrm_shape *)(const void *)c->params;
}

dlrec_status dlrec_dlrm_create(dlrec_net **n, const dlrec_dlrm_shape *shape, const dlrec_schema *schema) {
  dlrec_net_config c;
  dlrec_dlrm_config(&c, shape);
  return dlrec_net_create(n, &c, schema);
}

/* ---- plan -------------------------------------------------------------------- */

typedef struct dlrm {
  dlrec_dlrm_shape shape;
  uint32_t n_sparse, inter_dim;
  /* The bottom MLP is planned on data with dense columns; without, the
   * interaction is over the embeddings alone. */
  int has_bottom;
  int cat;          /* the concat interaction, else the dot one */
  int pairs;        /* the dot interaction over the embeddings alone (no bottom MLP) */
  net_mlp bottom;   /* shape.n_bottom hidden layers, no output layer */
  net_mlp top;      /* shape.n_top - 1 hidden layers and the logit's */
} dlrm;

/* The checks of a shape that plan makes for a config built in code
 * (dlrec_dlrm_create), which config_parse has not seen. */
static dlrec_status check_shape(const dlrec_dlrm_shape *s, const dlrec_schema *schema) {
  if (s->emb_dim < 1 || s->emb_dim > DLREC_EMBED_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "embedding dim %u out of range [1, %d]", s->emb_dim, DLREC_EMBED_MAX_DIM);
  if (schema->n_sparse < 1) return dlrec_error(DLREC_ERR_INVALID, "DLRM needs at least one categorical column");
  /* Without dense columns the interaction is over the embeddings' pairs
   * alone, and one embedding has none. */
  if (s->interaction != DLREC_DLRM_DOT && s->interaction != DLREC_DLRM_CAT)
    return dlrec_error(DLREC_ERR_INVALID, "DLRM interaction %d is not dot or cat", (int)s->interaction);
  if (s->interaction == DLREC_DLRM_DOT && schema->n_dense < 1 && schema->n_sparse < 2)
    return dlrec_error(DLREC_ERR_INVALID,
                       "DLRM on data with no dense column needs at least two categorical columns (the dot "
                       "interaction of %u has no pairs)", schema->n_sparse);
  if (s->n_bottom >= 1 && s->n_bottom <= DLREC_MLP_MAX_LAYERS && s->bottom[s->n_bottom - 1] != s->emb_dim)
    return dlrec_error(DLREC_ERR_INVALID, "bottom MLP ends with width %u, but the embedding dim is %u (they must match)",
                       s->bottom[s->n_bottom - 1], s->emb_dim);
  if (s->n_top >= 1 && s->n_top <= DLREC_MLP_MAX_LAYERS && s->top[s->n_top - 1] != 1)
    return dlrec_error(DLREC_ERR_INVALID, "top MLP ends with width %u, expected 1 (the logit)", s->top[s->n_top - 1]);
  /* The bottom MLP only where there are dense columns for it to read. */
  const uint32_t n[2] = {s->n_bottom, s->n_top};
  for (int k = schema->n_dense ? 0 : 1; k < 2; k++)
    if (n[k] < 1 || n[k] > DLREC_MLP_MAX_LAYERS)
      return dlrec_error(DLREC_ERR_INVALID, "%s MLP: %u layers, expected 1 to %d", k ? "top" : "bottom", n[k],
                         DLREC_MLP_MAX_LAYERS);
  return DLREC_OK;
}

/* The width of the interaction's output: [x, the pairs] or [x, e_1 .. e_F],
 * without x when there is no bottom MLP. */
static uint32_t inter_width(const dlrm *m) {
  const int F = (int)m->n_sparse, D = (int)m->shape.emb_dim;
  if (m->cat) return (uint32_t)dlrec_interaction_concat_dim(m->has_bottom ? D : 0, F, D);
  if (m->has_bottom) return (uint32_t)dlrec_interaction_dot_dim(F, D);
  /* The kernel's Z is [e_1; e_2 .. e_F]: its output is e_1's copy, then
   * the F(F-1)/2 pairs, of which the model keeps the pairs. */
  size_t w = dlrec_interaction_dot_dim(F - 1, D);
  return w ? (uint32_t)(w - (size_t)D) : 0;
}

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const dlrec_dlrm_shape *s = cfg;
  dlrm *m = ctx;
  dlrec_status st = check_shape(s, schema);
  if (st != DLREC_OK) return st;
  m->shape = *s;
  m->n_sparse = schema->n_sparse;
  m->has_bottom = schema->n_dense > 0;
  m->cat = s->interaction == DLREC_DLRM_CAT;
  m->pairs = !m->cat && !m->has_bottom;
  m->inter_dim = inter_width(m);
  p->emb_dim = s->emb_dim;
  p->pooling = s->pooling;
  net_mlp_config bottom = {.n_hidden = s->n_bottom}, top = {.n_hidden = s->n_top - 1, .dropout = s->top_dropout,
                                                            .batch_norm = s->top_batch_norm};
  memcpy(bottom.hidden, s->bottom, sizeof s->bottom);
  memcpy(top.hidden, s->top, (s->n_top - 1) * sizeof *s->top);
  if (m->has_bottom) st = net_mlp_plan(&m->bottom, p, "bottom", schema->n_dense, &bottom, 0);
  if (st == DLREC_OK && m->inter_dim == 0)
    st = dlrec_error(DLREC_ERR_INVALID, "interaction of %u columns of width %u is out of range", schema->n_sparse,
                     s->emb_dim);
  return st == DLREC_OK ? net_mlp_plan(&m->top, p, "top", m->inter_dim, &top, 1) : st;
}

/* As the DLRM reference does (net_init_linear), one random stream per
 * layer: the bottom MLP's from 1000, the top's from 2000. */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  const dlrm *m = ctx;
  if (m->has_bottom) net_mlp_init(&m->bottom, p, params, seed, 1000);
  net_mlp_init(&m->top, p, params, seed, 2000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct dlrm_ws {
  dlrec_arena arena;
  float *bot, *top;       /* the MLPs' workspaces */
  const float *x;         /* the bottom MLP's output (B, D), in its workspace, after forward */
  float *inter, *d_inter; /* (B, I) */
  float *dx;              /* (B, D) */
  /* With no bottom MLP: the embeddings split as the kernel takes them, e_1
   * (B, D) and e_2 .. e_F (B, F-1, D), its output (B, D + I) and their
   * gradients (dx above is e_1's). */
  float *e1, *rest, *full, *d_full, *d_rest;
} dlrm_ws;

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const dlrm *m = ctx;
  dlrm_ws *w = ws;
  if (m->has_bottom) net_ws_floats(a, &w->bot, net_mlp_ws_floats(&m->bottom, (uint32_t)a->rows));
  net_ws_rows(a, &w->inter, m->inter_dim);
  net_ws_rows(a, &w->d_inter, m->inter_dim);
  net_ws_floats(a, &w->top, net_mlp_ws_floats(&m->top, (uint32_t)a->rows));
  net_ws_rows(a, &w->dx, m->shape.emb_dim);
  if (m->pairs) {
    size_t D = m->shape.emb_dim, rest = (size_t)(m->n_sparse - 1) * D;
    net_ws_rows(a, &w->e1, D);
    net_ws_rows(a, &w->rest, rest);
    net_ws_rows(a, &w->d_rest, rest);
    net_ws_rows(a, &w->full, D + m->inter_dim);
    net_ws_rows(a, &w->d_full, D + m->inter_dim);
  }
}

/* ---- forward and backward ----------------------------------------------------- */

/* The dot interaction over the F embeddings alone (no bottom MLP): the
 * kernel runs on Z = [e_1; e_2 .. e_F], gathered out of emb (B, F, D), and
 * the pairs of its output, past e_1's copy, go to w->inter (B, I). Each row
 * is computed on its own, so scoring stays batch-invariant. */
static dlrec_status pairs_forward(const dlrm *m, dlrm_ws *w, const net_io *io, int B) {
  const float *emb = io->emb;
  size_t F = m->n_sparse, D = m->shape.emb_dim, I = m->inter_dim;
  dlrec_status st = BE_OP(io->be, copy_rows, w->e1, D, emb, F * D, (size_t)B, D);
  if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, w->rest, (F - 1) * D, emb + D, F * D, (size_t)B, (F - 1) * D);
  if (st == DLREC_OK) st = BE_OP(io->be, dot_forward, w->full, w->e1, w->rest, B, (int)F - 1, (int)D);
  if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, w->inter, I, w->full + D, D + I, (size_t)B, I);
  return st;
}

/* The backward of pairs_forward: d_inter back through the kernel (e_1's
 * copy gets no gradient) into d_emb (B, F, D). */
static dlrec_status pairs_backward(const dlrm *m, dlrm_ws *w, const net_io *io, float *d_emb, int B) {
  size_t F = m->n_sparse, D = m->shape.emb_dim, I = m->inter_dim;
  dlrec_status st = BE_OP(io->be, fill_rows, w->d_full, D + I, (size_t)B, D, 0.0f);
  if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, w->d_full + D, D + I, w->d_inter, I, (size_t)B, I);
  if (st == DLREC_OK)
    st = BE_OP(io->be, dot_backward, w->dx, w->d_rest, w->d_full, w->e1, w->rest, B, (int)F - 1, (int)D);
  if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, d_emb, F * D, w->dx, D, (size_t)B, D);
  if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, d_emb + D, F * D, w->d_rest, (F - 1) * D, (size_t)B, (F - 1) * D);
  return st;
}

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const dlrm *m = ctx;
  dlrm_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->shape.emb_dim;
  dlrec_net_profile *p = io->prof;
  double t = dlrec_now();
  w->x = NULL;
  dlrec_status st = m->has_bottom ? net_mlp_forward(&m->bottom, io, w->bot, io->dense, &w->x) : DLREC_OK;
  net_lap(&p->mlp, &t);
  if (st == DLREC_OK && m->cat) st = BE_OP(io->be, concat_forward, w->inter, w->x, io->emb, B, w->x ? D : 0, F, D);
  else if (st == DLREC_OK && m->has_bottom) st = BE_OP(io->be, dot_forward, w->inter, w->x, io->emb, B, F, D);
  else if (st == DLREC_OK) st = pairs_forward(m, w, io, B);
  net_lap(&p->interaction, &t);
  if (st == DLREC_OK) st = net_mlp_forward(&m->top, io, w->top, w->inter, logits);
  net_lap(&p->mlp, &t);
  return st;
}

/* Every layer but the top's last has a ReLU on its output, whose backward
 * the MLPs fold into the layer's (linear_relu_backward); nothing flows into
 * the dense features. */
static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const dlrm *m = ctx;
  dlrm_ws *w = ws;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->shape.emb_dim;
  dlrec_net_profile *p = io->prof;
  double t = dlrec_now();
  dlrec_status st = net_mlp_backward(&m->top, io, w->top, w->inter, d_logits, w->d_inter, g);
  net_lap(&p->mlp, &t);
  if (!m->has_bottom) {
    if (st == DLREC_OK && m->cat) st = BE_OP(io->be, concat_backward, NULL, d_emb, w->d_inter, B, 0, F, D);
    else if (st == DLREC_OK) st = pairs_backward(m, w, io, d_emb, B);
    net_lap(&p->interaction, &t);
    return st;
  }
  if (st == DLREC_OK && m->cat) st = BE_OP(io->be, concat_backward, w->dx, d_emb, w->d_inter, B, D, F, D);
  else if (st == DLREC_OK) st = BE_OP(io->be, dot_backward, w->dx, d_emb, w->d_inter, w->x, io->emb, B, F, D);
  net_lap(&p->interaction, &t);
  if (st == DLREC_OK) st = net_mlp_backward(&m->bottom, io, w->bot, io->dense, w->dx, NULL, g);
  net_lap(&p->mlp, &t);
  return st;
}

/* ---- ONNX export ---------------------------------------------------------------- */

/* The dot interaction: Z = [x; e_1 .. e_F] (or the embeddings alone), its
 * Gram matrix by MatMul, and the strictly lower triangle gathered in the
 * kernel's order (row i, then column j < i). */
static const char *export_dot(onnx_graph *g, const char *x, const char *emb, uint32_t F) {
  const char *z = emb;
  uint32_t T = F;
  if (x) {
    const char *parts[] = {onnx_op2(g, "Unsqueeze", x, onnx_i64s(g, (const int64_t[]){1}, 1)), emb};
    z = onnx_concat(g, parts, 2, 1);
    T = F + 1;
  }
  const onnx_attr perm[] = {ONNX_INTS("perm", ((const int64_t[]){0, 2, 1}), 3)};
  const char *zt = onnx_node(g, "Transpose", NULL, &z, 1, perm, 1, NULL);
  const char *gram = onnx_flatten(g, onnx_op2(g, "MatMul", z, zt));
  const int64_t n = (int64_t)T * (T - 1) / 2;
  int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof *idx);
  if (!idx) return NULL;
  int64_t k = 0;
  for (uint32_t i = 1; i < T; i++)
    for (uint32_t j = 0; j < i; j++) idx[k++] = (int64_t)i * T + j;
  const char *gin[] = {gram, onnx_const_i64(g, "pairs", idx, &n, 1)};
  free(idx);
  const onnx_attr axis[] = {ONNX_INT("axis", 1)};
  const char *pairs = onnx_node(g, "Gather", NULL, gin, 2, axis, 1, NULL);
  if (!x) return pairs;
  const char *cat[] = {x, pairs};
  return onnx_concat(g, cat, 2, 1);
}

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const dlrm *m = ctx;
  const char *x = m->has_bottom ? net_mlp_export(&m->bottom, p, params, g, dense) : NULL;
  const char *in = m->cat ? net_concat_export(g, x, emb) : export_dot(g, x, emb, m->n_sparse);
  return in ? net_mlp_export(&m->top, p, params, g, in) : "oom";
}

/* The generic tests' configs (net_test_config): the tiny shape (3 dense ->
 * 5 -> 4 = D; top 6 -> 1) with each interaction and with the top MLP's
 * dropout and batch normalization for the finite differences; the Kaggle
 * shape (the defaults) across backends, and a small one with the top MLP's
 * batch normalization (with its dropout too for the kept operands: a split
 * step draws other masks). */
#define DLRM_TINY "{\"embedding_dim\": 4, \"bottom_mlp\": [5, 4], \"top_mlp\": [6, 1]"
#define DLRM_SMALL "{\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [32, 16, 1]"
static const net_test_config tests[] = {
    {DLRM_TINY "}", DLREC_NET_TEST_GRADIENTS},
    {DLRM_TINY ", \"interaction\": \"cat\"}", DLREC_NET_TEST_GRADIENTS},
    {DLRM_TINY ", \"top_mlp_dropout\": 0.25, \"top_mlp_batch_norm\": true}", DLREC_NET_TEST_GRADIENTS},
    {"{}", DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
    {DLRM_SMALL ", \"top_mlp_batch_norm\": true}", DLREC_NET_TEST_AGREEMENT},
    {DLRM_SMALL ", \"top_mlp_dropout\": 0.2, \"top_mlp_batch_norm\": true}", DLREC_NET_TEST_KEPT},
    {NULL, 0},
};

const net_type net_type_dlrm = {
    .name = "dlrm",
    .doc = "DLRM: bottom MLP, dot (or concat) interaction with the embeddings, top MLP",
    .config_default = config_default,
    .config_parse = config_parse,
    .config_to_json = config_to_json,
    .ctx_size = sizeof(dlrm),
    .plan = plan,
    .init = init,
    .ws_size = sizeof(dlrm_ws),
    .ws_arrays = ws_arrays,
    .forward = forward,
    .backward = backward,
    .export_onnx = export_onnx,
    .tests = tests,
};
