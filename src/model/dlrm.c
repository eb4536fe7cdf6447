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
                         .top = {512, 256, 1}, .pooling = DLREC_BAG_SUM, .interaction = DLREC_DLRM_DOT};
  memcpy(cfg, &sh, sizeof sh);
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "embedding_dim", "bottom_mlp", "top_mlp", "pooling", "interaction", NULL};
  dlrec_dlrm_shape *sh = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_config_u32(o, "embedding_dim", what, 1, DLREC_EMBED_MAX_DIM, &sh->emb_dim);
  if (s == DLREC_OK) s = net_config_widths(o, "bottom_mlp", what, 1, DLREC_MLP_MAX_LAYERS, &sh->n_bottom, sh->bottom);
  if (s == DLREC_OK) s = net_config_widths(o, "top_mlp", what, 1, DLREC_MLP_MAX_LAYERS, &sh->n_top, sh->top);
  if (s == DLREC_OK) s = net_config_pooling(o, what, &sh->pooling);
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
  cJSON_AddStringToObject(m, "pooling", net_pooling_name(sh->pooling));
  cJSON_AddStringToObject(m, "interaction", sh->interaction == DLREC_DLRM_CAT ? "cat" : "dot");
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
  /* Bottom MLP layers planned: shape.n_bottom, or 0 on data with no dense
   * column (then the interaction is over the embeddings alone). */
  uint32_t n_bottom;
  int cat;   /* the concat interaction, else the dot one */
  int pairs; /* the dot interaction over the embeddings alone (no bottom MLP) */
  int bottom[DLREC_MLP_MAX_LAYERS], top[DLREC_MLP_MAX_LAYERS]; /* linear layer numbers */
  net_linear lb[DLREC_MLP_MAX_LAYERS], lt[DLREC_MLP_MAX_LAYERS]; /* the same layers' shapes */
} dlrm;

static dlrec_status plan_mlp(net_plan *p, int *idx, net_linear *ls, uint32_t n, const uint32_t *widths, uint32_t in,
                             const char *which) {
  if (n < 1 || n > DLREC_MLP_MAX_LAYERS)
    return dlrec_error(DLREC_ERR_INVALID, "%s MLP: %u layers, expected 1 to %d", which, n, DLREC_MLP_MAX_LAYERS);
  for (uint32_t l = 0; l < n; l++) {
    if (widths[l] < 1 || widths[l] > 65536)
      return dlrec_error(DLREC_ERR_INVALID, "%s MLP: layer %u width %u out of range [1, 65536]", which, l, widths[l]);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.%u", which, l);
    dlrec_status s = net_plan_linear(p, prefix, l ? widths[l - 1] : in, widths[l], &idx[l]);
    if (s != DLREC_OK) return s;
    ls[l] = p->linear[idx[l]];
  }
  return DLREC_OK;
}

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const dlrec_dlrm_shape *s = cfg;
  dlrm *m = ctx;
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
  m->shape = *s;
  m->n_sparse = schema->n_sparse;
  m->n_bottom = schema->n_dense ? s->n_bottom : 0;
  m->cat = s->interaction == DLREC_DLRM_CAT;
  m->pairs = !m->cat && !m->n_bottom;
  if (m->cat) {
    m->inter_dim = (uint32_t)dlrec_interaction_concat_dim(m->n_bottom ? (int)s->emb_dim : 0,
                                                          (int)schema->n_sparse, (int)s->emb_dim);
  } else if (m->n_bottom) {
    m->inter_dim = (uint32_t)dlrec_interaction_dot_dim((int)schema->n_sparse, (int)s->emb_dim);
  } else {
    /* The kernel's Z is [e_1; e_2 .. e_F]: its output is e_1's copy, then
     * the F(F-1)/2 pairs, of which the model keeps the pairs. */
    size_t w = dlrec_interaction_dot_dim((int)schema->n_sparse - 1, (int)s->emb_dim);
    m->inter_dim = w ? (uint32_t)(w - s->emb_dim) : 0;
  }
  p->emb_dim = s->emb_dim;
  p->pooling = s->pooling;
  dlrec_status st = m->n_bottom ? plan_mlp(p, m->bottom, m->lb, s->n_bottom, s->bottom, schema->n_dense, "bottom")
                                : DLREC_OK;
  if (st == DLREC_OK && m->inter_dim == 0)
    st = dlrec_error(DLREC_ERR_INVALID, "interaction of %u columns of width %u is out of range", schema->n_sparse,
                     s->emb_dim);
  return st == DLREC_OK ? plan_mlp(p, m->top, m->lt, s->n_top, s->top, m->inter_dim, "top") : st;
}

/* As the DLRM reference does (net_init_linear), one random stream per layer. */
static void init_mlp(float *p, const net_linear *ls, uint32_t n, uint64_t seed, uint64_t stream0) {
  for (uint32_t l = 0; l < n; l++) net_init_linear(&ls[l], p, seed, stream0 + l);
}

static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  (void)p;
  const dlrm *m = ctx;
  init_mlp(params, m->lb, m->n_bottom, seed, 1000);
  init_mlp(params, m->lt, m->shape.n_top, seed, 2000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct dlrm_ws {
  dlrec_arena arena;
  float *bot[DLREC_MLP_MAX_LAYERS]; /* bottom outputs (B, bottom[l]) */
  float *inter, *d_inter;           /* (B, I) */
  float *top[DLREC_MLP_MAX_LAYERS]; /* top outputs (B, top[l]); the last holds logits */
  float *d_a, *d_b;                 /* ping-pong activation gradients (B, widest) */
  float *dx;                        /* (B, D) */
  /* With no bottom MLP: the embeddings split as the kernel takes them, e_1
   * (B, D) and e_2 .. e_F (B, F-1, D), its output (B, D + I) and their
   * gradients (dx above is e_1's). */
  float *e1, *rest, *full, *d_full, *d_rest;
} dlrm_ws;

static uint32_t widest(const dlrm *m) {
  uint32_t w = m->inter_dim > m->shape.emb_dim ? m->inter_dim : m->shape.emb_dim;
  for (uint32_t l = 0; l < m->n_bottom; l++) w = m->lb[l].out > w ? m->lb[l].out : w;
  for (uint32_t l = 0; l < m->shape.n_top; l++) w = m->lt[l].out > w ? m->lt[l].out : w;
  return w;
}

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const dlrm *m = ctx;
  dlrm_ws *w = ws;
  for (uint32_t l = 0; l < m->n_bottom; l++) net_ws_rows(a, &w->bot[l], m->lb[l].out);
  net_ws_rows(a, &w->inter, m->inter_dim);
  net_ws_rows(a, &w->d_inter, m->inter_dim);
  for (uint32_t l = 0; l < m->shape.n_top; l++) net_ws_rows(a, &w->top[l], m->lt[l].out);
  net_ws_rows(a, &w->d_a, widest(m));
  net_ws_rows(a, &w->d_b, widest(m));
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

/* Flops (2 per multiply-add) of an MLP's forward for one row. */
static double mlp_flops_row(const net_linear *ls, uint32_t n) {
  double f = 0;
  for (uint32_t l = 0; l < n; l++) f += 2.0 * ls[l].in * ls[l].out;
  return f;
}

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
  dlrec_status st = DLREC_OK;
  const float *in = io->dense;
  for (uint32_t l = 0; st == DLREC_OK && l < m->n_bottom; l++) {
    st = net_linear_forward(io, m->bottom[l], w->bot[l], in, 1);
    in = w->bot[l];
  }
  net_lap(&p->mlp, &t);
  if (st == DLREC_OK && m->cat)
    st = BE_OP(io->be, concat_forward, w->inter, m->n_bottom ? in : NULL, io->emb, B, m->n_bottom ? D : 0, F, D);
  else if (st == DLREC_OK && m->n_bottom) st = BE_OP(io->be, dot_forward, w->inter, in, io->emb, B, F, D);
  else if (st == DLREC_OK) st = pairs_forward(m, w, io, B);
  net_lap(&p->interaction, &t);
  in = w->inter;
  for (uint32_t l = 0; st == DLREC_OK && l < m->shape.n_top; l++) {
    st = net_linear_forward(io, m->top[l], w->top[l], in, l + 1 < m->shape.n_top);
    in = w->top[l];
  }
  net_lap(&p->mlp, &t);
  p->mlp_flops += B * (mlp_flops_row(m->lb, m->n_bottom) + mlp_flops_row(m->lt, m->shape.n_top));
  *logits = w->top[m->shape.n_top - 1];
  return st;
}

static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const dlrm *m = ctx;
  dlrm_ws *w = ws;
  const float *params = io->params;
  int B = io->B, F = (int)m->n_sparse, D = (int)m->shape.emb_dim;
  dlrec_net_profile *p = io->prof;
  double t = dlrec_now();
  dlrec_status st = DLREC_OK;
  /* Every layer but the top's last has a ReLU on its output, whose backward
   * linear_relu_backward folds into the layer's (dout, then a workspace
   * buffer, is its scratch). */
  const float *dout = d_logits;
  float *dnext = w->d_a;
  for (int l = (int)m->shape.n_top - 1; st == DLREC_OK && l >= 0; l--) {
    const net_linear *L = &m->lt[l];
    const float *in = l ? w->top[l - 1] : w->inter;
    float *din = l ? dnext : w->d_inter;
    if (l == (int)m->shape.n_top - 1)
      st = BE_OP(io->be, linear_backward, din, g + L->w, g + L->b, dout, in, params + L->w, B, (int)L->in,
                 (int)L->out);
    else
      st = BE_OP(io->be, linear_relu_backward, din, g + L->w, g + L->b, (float *)dout, w->top[l], in, params + L->w,
                 B, (int)L->in, (int)L->out);
    dout = din;
    dnext = (dnext == w->d_a) ? w->d_b : w->d_a;
  }
  net_lap(&p->mlp, &t);
  if (!m->n_bottom) {
    if (st == DLREC_OK && m->cat) st = BE_OP(io->be, concat_backward, NULL, d_emb, w->d_inter, B, 0, F, D);
    else if (st == DLREC_OK) st = pairs_backward(m, w, io, d_emb, B);
    net_lap(&p->interaction, &t);
    p->mlp_flops += B * 2 * mlp_flops_row(m->lt, m->shape.n_top);
    return st;
  }
  const float *x = w->bot[m->n_bottom - 1];
  if (st == DLREC_OK && m->cat) st = BE_OP(io->be, concat_backward, w->dx, d_emb, w->d_inter, B, D, F, D);
  else if (st == DLREC_OK) st = BE_OP(io->be, dot_backward, w->dx, d_emb, w->d_inter, x, io->emb, B, F, D);
  net_lap(&p->interaction, &t);
  /* Every bottom layer has a ReLU, the last one's included. */
  dout = w->dx;
  dnext = w->d_a;
  for (int l = (int)m->n_bottom - 1; st == DLREC_OK && l >= 0; l--) {
    const net_linear *L = &m->lb[l];
    const float *in = l ? w->bot[l - 1] : io->dense;
    float *din = l ? dnext : NULL; /* nothing flows into the dense features */
    st = BE_OP(io->be, linear_relu_backward, din, g + L->w, g + L->b, (float *)dout, w->bot[l], in, params + L->w, B,
               (int)L->in, (int)L->out);
    dout = din;
    dnext = (dnext == w->d_a) ? w->d_b : w->d_a;
  }
  net_lap(&p->mlp, &t);
  /* Backward: dW everywhere, din everywhere but the first bottom layer. */
  p->mlp_flops += B * (2 * mlp_flops_row(m->lb, m->n_bottom) + 2 * mlp_flops_row(m->lt, m->shape.n_top) -
                       2.0 * m->lb[0].in * m->lb[0].out);
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
  const char *gram = onnx_reshape(g, onnx_op2(g, "MatMul", z, zt), (const int64_t[]){0, -1}, 2);
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
  const char *x = m->n_bottom ? dense : NULL;
  for (uint32_t l = 0; l < m->n_bottom; l++) x = net_onnx_linear(g, p, params, m->bottom[l], x, 1);
  const char *in;
  if (m->cat) {
    const char *parts[] = {x, onnx_reshape(g, emb, (const int64_t[]){0, -1}, 2)};
    in = x ? onnx_concat(g, parts, 2, 1) : parts[1];
  } else {
    in = export_dot(g, x, emb, m->n_sparse);
    if (!in) return "oom";
  }
  for (uint32_t l = 0; l < m->shape.n_top; l++) in = net_onnx_linear(g, p, params, m->top[l], in, l + 1 < m->shape.n_top);
  return in;
}

/* The generic tests' configs (net_test_config): the tiny shape (3 dense ->
 * 5 -> 4 = D; top 6 -> 1) with each interaction for the finite
 * differences; the Kaggle shape (the defaults) across backends. */
#define DLRM_TINY "{\"embedding_dim\": 4, \"bottom_mlp\": [5, 4], \"top_mlp\": [6, 1]"
static const net_test_config tests[] = {
    {DLRM_TINY "}", DLREC_NET_TEST_GRADIENTS},
    {DLRM_TINY ", \"interaction\": \"cat\"}", DLREC_NET_TEST_GRADIENTS},
    {"{}", DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
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
