/* DCN-v2 (Wang et al. 2021) as a model type ("dcn_v2"), as FuxiCTR's DCNv2
 * and TorchRec's DCN build it. Shapes (B rows, F categorical columns, D =
 * embedding_dim, d = n_dense + F·D, H = the MLP's last width):
 *   x0 = [dense, e_1 .. e_F]                                  (B, d)
 *   x_{l+1} = x0 ⊙ (x_l · W_lᵀ + b_l) + x_l   for l < L        (B, d)
 *   stacked:  logit = output(MLP(x_L))                        MLP (B, H)
 *   parallel: logit = output([x_L, MLP(x0)])                  (B, d + H)
 * W_l is full rank (d, d), or low rank U_l V_l (V (r, d), U (d, r)), or a
 * mixture of K low-rank experts with a softmax gate (DCN-Mix, TorchRec's
 * LowRankMixtureCrossNet; src/backend/cpu/cross_mix.c: ReLU inside each expert).
 * The MLP is net_mlp (Linear -> [BatchNorm] -> ReLU -> [Dropout]); "output"
 * is a Linear to one logit.
 *
 * Tensors: per cross layer l, full rank "cross.l.weight" (d, d) and
 * "cross.l.bias" (d); low rank "cross.l.V" (r, d), "cross.l.U" (d, r),
 * "cross.l.bias"; with K experts "cross.l.V" (K·r, d), "cross.l.C" (K·r,
 * r), "cross.l.U" (K·d, r), "cross.l.gate" (K, d) and "cross.l.bias", each
 * expert's block back to back as src/backend/cpu/cross_mix.c takes them; then the
 * MLP's "mlp.N.*" and "output.weight" (1, d + H or H) and "output.bias".
 *
 * Every product of the cross network is also a planned linear layer (a view
 * onto those tensors, bias-free where the kernel has no bias), so the
 * generic scorer packs it and scoring runs the cross blocks' *_infer
 * kernels: scores keep their bits at any batch size.
 */
#include <stdio.h>
#include <string.h>

#include "core/arena.h"
#include "core/json.h"
#include "core/clock.h"
#include "model/model_type.h"
#include "core/onnx.h"

#define DCN_MAX_LAYERS 16  /* cross layers */
#define DCN_MAX_EXPERTS 16 /* low-rank experts of one layer */

typedef enum dcn_structure { DCN_STACKED = 0, DCN_PARALLEL = 1 } dcn_structure;

typedef struct dcn_config {
  uint32_t emb_dim;       /* D */
  dlrec_pooling pooling; /* how multi-hot bags pool */
  dcn_structure structure;
  uint32_t layers;        /* L, cross layers */
  uint32_t rank;          /* r; 0: full rank */
  uint32_t experts;       /* K; > 1 needs rank > 0 */
  net_mlp_config mlp;     /* the deep network's hidden layers */
} dcn_config;

_Static_assert(sizeof(dcn_config) <= DLREC_NET_CONFIG_BYTES, "the DCN-v2 config fits a model config");

/* ---- config ------------------------------------------------------------------ */

/* FuxiCTR's DCNv2 defaults (its model_structure "parallel", 3 cross
 * layers, full rank, one expert); the cfg was zeroed by the caller, so
 * that configs compare byte for byte. */
static void config_default(void *cfg) {
  dcn_config *c = cfg;
  c->emb_dim = 16;
  c->pooling = DLREC_POOLING_SUM;
  c->structure = DCN_PARALLEL;
  c->layers = 3;
  c->rank = 0;
  c->experts = 1;
  c->mlp.n_hidden = 3;
  c->mlp.hidden[0] = c->mlp.hidden[1] = c->mlp.hidden[2] = 400;
  c->mlp.dropout = 0.0f;
  c->mlp.batch_norm = 0;
}

/* The checks that span keys, shared by config_parse (naming the field) and
 * plan (for a config built in code). */
static dlrec_status check_config(const dcn_config *c, const char *what) {
  if (c->experts > 1 && c->rank == 0)
    return dlrec_error(DLREC_ERR_INVALID,
                       "%s: field 'experts': %u experts need 'low_rank' > 0 (the mixture is of low-rank experts)",
                       what, c->experts);
  if (c->structure == DCN_PARALLEL && c->mlp.n_hidden == 0)
    return dlrec_error(DLREC_ERR_INVALID,
                       "%s: field 'mlp': structure 'parallel' needs at least one MLP layer beside the cross network "
                       "(use 'stacked' for the cross network alone)", what);
  return DLREC_OK;
}

static dlrec_status config_parse(void *cfg, const cJSON *o, const char *what) {
  static const char *keys[] = {"type", "embedding_dim", "pooling", "structure", "cross_layers", "low_rank",
                               "experts", "mlp", "dropout", "batch_norm", NULL};
  dcn_config *c = cfg;
  dlrec_status s = dlrec_json_check_keys(o, what, keys);
  if (s == DLREC_OK) s = net_config_u32(o, "embedding_dim", what, 1, DLREC_EMBED_MAX_DIM, &c->emb_dim);
  if (s == DLREC_OK) s = net_config_u32(o, "cross_layers", what, 1, DCN_MAX_LAYERS, &c->layers);
  if (s == DLREC_OK) s = net_config_u32(o, "low_rank", what, 0, 65536, &c->rank);
  if (s == DLREC_OK) s = net_config_u32(o, "experts", what, 1, DCN_MAX_EXPERTS, &c->experts);
  if (s == DLREC_OK) s = net_config_pooling(o, what, &c->pooling);
  if (s == DLREC_OK) s = net_mlp_config_parse(&c->mlp, o, what);
  if (s != DLREC_OK) return s;
  const char *st = NULL;
  if ((s = dlrec_json_get_string_or(o, "structure", what, NULL, &st)) != DLREC_OK) return s;
  if (st && !strcmp(st, "stacked")) c->structure = DCN_STACKED;
  else if (st && !strcmp(st, "parallel")) c->structure = DCN_PARALLEL;
  else if (st)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field 'structure': '%s' is not one of stacked, parallel", what, st);
  return check_config(c, what);
}

static void config_to_json(const void *cfg, cJSON *m) {
  const dcn_config *c = cfg;
  cJSON_AddNumberToObject(m, "embedding_dim", c->emb_dim);
  cJSON_AddStringToObject(m, "pooling", dlrec_pooling_name(c->pooling));
  cJSON_AddStringToObject(m, "structure", c->structure == DCN_STACKED ? "stacked" : "parallel");
  cJSON_AddNumberToObject(m, "cross_layers", c->layers);
  cJSON_AddNumberToObject(m, "low_rank", c->rank);
  cJSON_AddNumberToObject(m, "experts", c->experts);
  net_mlp_config_to_json(&c->mlp, m);
}

/* ---- plan -------------------------------------------------------------------- */

/* One cross layer's tensors (offsets) and its linear views (plan layer
 * numbers): full rank w (the layer "cross.l"); low rank v and u; with
 * experts v[k], c[k], u[k] (each K consecutive layer numbers from v0, c0,
 * u0) and gate. */
typedef struct dcn_cross {
  size_t W, V, C, U, G, bias;
  int w, v0, c0, u0, gate;
} dcn_cross;

typedef struct dcn {
  dcn_config cfg;
  uint32_t n_dense, F, D, d;
  dcn_cross cross[DCN_MAX_LAYERS];
  net_mlp mlp;     /* no output layer; unused (n_hidden 0) when stacked without one */
  int out;         /* the layer "output" */
  net_linear L_out;
  uint32_t out_in; /* its input width: d + H (parallel), H or d (stacked) */
} dcn;

static dlrec_status plan_cross(dcn *m, net_plan *p, uint32_t l) {
  dcn_cross *x = &m->cross[l];
  uint32_t d = m->d, r = m->cfg.rank, K = m->cfg.experts;
  char name[DLREC_NET_TENSOR_NAME];
  dlrec_status s;
  if (r == 0) {
    snprintf(name, sizeof name, "cross.%u", l);
    s = net_plan_linear(p, name, d, d, &x->w);
    if (s == DLREC_OK) x->W = p->linear[x->w].w, x->bias = p->linear[x->w].b;
    return s;
  }
  snprintf(name, sizeof name, "cross.%u.V", l);
  s = net_plan_tensor(p, name, K * r, d, &x->V);
  if (s == DLREC_OK && K > 1) {
    snprintf(name, sizeof name, "cross.%u.C", l);
    s = net_plan_tensor(p, name, K * r, r, &x->C);
  }
  snprintf(name, sizeof name, "cross.%u.U", l);
  if (s == DLREC_OK) s = net_plan_tensor(p, name, K * d, r, &x->U);
  if (s == DLREC_OK && K > 1) {
    snprintf(name, sizeof name, "cross.%u.gate", l);
    s = net_plan_tensor(p, name, K, d, &x->G);
  }
  snprintf(name, sizeof name, "cross.%u.bias", l);
  if (s == DLREC_OK) s = net_plan_tensor(p, name, d, 0, &x->bias);
  /* The views: every expert's V, then every C, then every U (each with the
   * shared bias), then the gate, so that each kind is an array of K packed
   * layers for cpu_cross_mix_infer. */
  int idx = 0;
  for (uint32_t k = 0; s == DLREC_OK && k < K; k++) {
    s = net_plan_view(p, d, r, x->V + (size_t)k * r * d, NET_NO_BIAS, &idx);
    if (k == 0) x->v0 = idx;
  }
  for (uint32_t k = 0; s == DLREC_OK && K > 1 && k < K; k++) {
    s = net_plan_view(p, r, r, x->C + (size_t)k * r * r, NET_NO_BIAS, &idx);
    if (k == 0) x->c0 = idx;
  }
  for (uint32_t k = 0; s == DLREC_OK && k < K; k++) {
    s = net_plan_view(p, r, d, x->U + (size_t)k * d * r, x->bias, &idx);
    if (k == 0) x->u0 = idx;
  }
  if (s == DLREC_OK && K > 1) s = net_plan_view(p, d, K, x->G, NET_NO_BIAS, &x->gate);
  return s;
}

static dlrec_status plan(const void *cfg, const dlrec_schema *schema, net_plan *p, void *ctx) {
  const dcn_config *c = cfg;
  dcn *m = ctx;
  dlrec_status s = check_config(c, "DCN-v2");
  if (s != DLREC_OK) return s;
  if (c->emb_dim < 1 || c->emb_dim > DLREC_EMBED_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "DCN-v2: embedding dim %u out of range [1, %d]", c->emb_dim,
                       DLREC_EMBED_MAX_DIM);
  if (c->layers < 1 || c->layers > DCN_MAX_LAYERS || c->experts < 1 || c->experts > DCN_MAX_EXPERTS)
    return dlrec_error(DLREC_ERR_INVALID, "DCN-v2: %u cross layers of %u experts, expected 1 to %d of 1 to %d",
                       c->layers, c->experts, DCN_MAX_LAYERS, DCN_MAX_EXPERTS);
  /* The generic stage's embedding table cannot be empty: data with dense
   * columns alone is refused here rather than by the table. */
  if (schema->n_sparse < 1) return dlrec_error(DLREC_ERR_INVALID, "DCN-v2 needs at least one categorical column");
  uint64_t d = schema->n_dense + (uint64_t)schema->n_sparse * c->emb_dim;
  if (d > 65536)
    return dlrec_error(DLREC_ERR_INVALID,
                       "DCN-v2: the cross network's input is %llu wide (n_dense + columns × embedding_dim), at most "
                       "65536", (unsigned long long)d);
  m->cfg = *c;
  m->n_dense = schema->n_dense;
  m->F = schema->n_sparse;
  m->D = c->emb_dim;
  m->d = (uint32_t)d;
  /* Every product of the cross network is a linear layer the scorer packs. */
  const uint32_t views = c->rank == 0 ? 1 : c->experts == 1 ? 2 : 3 * c->experts + 1;
  if ((uint64_t)views * c->layers > NET_MAX_LINEAR)
    return dlrec_error(DLREC_ERR_INVALID,
                       "DCN-v2: the model has more than %d linear layers (each cross layer plans 3·experts + 1 "
                       "with experts); use fewer cross_layers or experts", NET_MAX_LINEAR);
  p->emb_dim = c->emb_dim;
  p->pooling = c->pooling;
  for (uint32_t l = 0; s == DLREC_OK && l < c->layers; l++) s = plan_cross(m, p, l);
  /* Stacked, the MLP reads x_L; parallel, x0. */
  if (s == DLREC_OK && c->mlp.n_hidden) s = net_mlp_plan(&m->mlp, p, "mlp", m->d, &c->mlp, 0);
  uint32_t H = c->mlp.n_hidden ? m->mlp.out : 0;
  m->out_in = c->structure == DCN_PARALLEL ? m->d + H : (H ? H : m->d);
  if (s == DLREC_OK) s = net_plan_linear(p, "output", m->out_in, 1, &m->out);
  if (s == DLREC_OK) m->L_out = p->linear[m->out];
  return s;
}

/* As TorchRec's CrossNet, LowRankCrossNet and LowRankMixtureCrossNet: each
 * weight matrix (each expert's V, C, U, and each expert's gate row, a
 * Linear(d, 1)) Xavier normal, the cross biases zero; one stream per
 * tensor. The MLP and the output layer as net_init_linear (the DLRM
 * reference's Linear init, bias normal). */
static void init(const void *ctx, const net_plan *p, float *params, uint64_t seed) {
  const dcn *m = ctx;
  uint32_t d = m->d, r = m->cfg.rank, K = m->cfg.experts;
  for (uint32_t l = 0; l < m->cfg.layers; l++) {
    const dcn_cross *x = &m->cross[l];
    uint64_t s0 = 6000 + 8 * (uint64_t)l;
    if (r == 0) {
      net_init_xavier(params + x->W, (size_t)d * d, d, d, seed, s0);
    } else {
      net_init_xavier(params + x->V, (size_t)K * r * d, d, r, seed, s0);
      net_init_xavier(params + x->U, (size_t)K * d * r, r, d, seed, s0 + 1);
      if (K > 1) {
        net_init_xavier(params + x->C, (size_t)K * r * r, r, r, seed, s0 + 2);
        net_init_xavier(params + x->G, (size_t)K * d, d, 1, seed, s0 + 3);
      }
    }
    memset(params + x->bias, 0, d * sizeof(float));
  }
  if (m->cfg.mlp.n_hidden) net_mlp_init(&m->mlp, p, params, seed, 5000);
  net_init_linear(&m->L_out, params, seed, 7000);
}

/* ---- workspace --------------------------------------------------------------- */

typedef struct dcn_ws {
  dlrec_arena arena;
  float *x0;                    /* (B, d) */
  float *xc[DCN_MAX_LAYERS];    /* each cross layer's output (B, d) */
  float *act[DCN_MAX_LAYERS];   /* what each layer's backward needs */
  float *scratch;               /* the cross blocks' backward and infer scratch */
  float *mlp;                   /* net_mlp's workspace */
  float *cat, *dcat;            /* the output layer's input (B, out_in) and its gradient */
  float *dh;                    /* parallel: the MLP's output gradient (B, H), split out of dcat */
  float *logits;                /* (B) */
  const float *h;               /* the MLP's output (B, H), in its workspace, after forward */
  float *dx0, *da, *db;         /* (B, d): x0's gradient, ping-pong gradients of x_l */
} dcn_ws;

static size_t act_floats(const dcn *m, int B) {
  int d = (int)m->d, r = (int)m->cfg.rank, K = (int)m->cfg.experts;
  return K > 1 ? dlrec_cross_mix_act_floats(B, d, r, K) : dlrec_cross_act_floats(B, d, r);
}

static size_t scratch_floats(const dcn *m, int B) {
  int d = (int)m->d, r = (int)m->cfg.rank, K = (int)m->cfg.experts;
  if (K > 1) {
    size_t a = dlrec_cross_mix_ws_floats(B, d, r, K), b = dlrec_cross_mix_infer_ws_floats(B, d, r, K);
    return a > b ? a : b;
  }
  return dlrec_cross_ws_floats(B, d, r); /* >= B·r, the low-rank infer's */
}

static void ws_arrays(const void *ctx, void *ws, net_ws_alloc *a) {
  const dcn *m = ctx;
  dcn_ws *w = ws;
  const size_t d = m->d;
  const int B = (int)a->rows;
  net_ws_rows(a, &w->x0, d);
  for (uint32_t l = 0; l < m->cfg.layers; l++) {
    net_ws_rows(a, &w->xc[l], d);
    net_ws_floats(a, &w->act[l], act_floats(m, B));
  }
  net_ws_floats(a, &w->scratch, scratch_floats(m, B));
  if (m->cfg.mlp.n_hidden) net_ws_floats(a, &w->mlp, net_mlp_ws_floats(&m->mlp, (uint32_t)B));
  net_ws_rows(a, &w->cat, m->out_in);
  net_ws_rows(a, &w->dcat, m->out_in);
  if (m->cfg.structure == DCN_PARALLEL) net_ws_rows(a, &w->dh, m->mlp.out); /* parallel always has an MLP */
  net_ws_rows(a, &w->logits, 1);
  net_ws_rows(a, &w->dx0, d);
  net_ws_rows(a, &w->da, d);
  net_ws_rows(a, &w->db, d);
}

/* ---- forward and backward ----------------------------------------------------- */

/* One cross layer, out = x0 ⊙ (xl · Wᵀ + b) + xl: the training kernels
 * (saving act), or when scoring the packed batch-invariant ones. */
static dlrec_status cross_forward(const dcn *m, dcn_ws *w, const net_io *io, uint32_t l, const float *xl) {
  const dcn_cross *x = &m->cross[l];
  const float *P = io->params;
  int B = io->B, d = (int)m->d, r = (int)m->cfg.rank, K = (int)m->cfg.experts;
  float *out = w->xc[l];
  if (io->packed) {
    const dlrec_packed_linear *const *pk = io->packed;
    if (r == 0) return BE_OP(io->be, cross_infer, out, w->x0, xl, pk[x->w], B, d);
    if (K == 1) return BE_OP(io->be, cross_lowrank_infer, out, w->scratch, w->x0, xl, pk[x->v0], pk[x->u0], B, d, r);
    return BE_OP(io->be, cross_mix_infer, out, w->scratch, w->x0, xl, pk + x->v0, pk + x->c0, pk + x->u0, pk[x->gate],
                 B, d, r, K);
  }
  if (r == 0) return BE_OP(io->be, cross_forward, out, w->act[l], w->x0, xl, P + x->W, P + x->bias, B, d);
  if (K == 1)
    return BE_OP(io->be, cross_lowrank_forward, out, w->act[l], w->x0, xl, P + x->V, P + x->U, P + x->bias, B, d, r);
  return BE_OP(io->be, cross_mix_forward, out, w->act[l], w->x0, xl, P + x->V, P + x->C, P + x->U, P + x->G,
               P + x->bias, B, d, r, K);
}

/* The backward of cross layer l from dout (B, d): dx0 accumulated, dxl
 * overwritten, the layer's gradients into g. */
static dlrec_status cross_backward(const dcn *m, dcn_ws *w, const net_io *io, uint32_t l, const float *dout,
                                   float *dxl, float *g) {
  const dcn_cross *x = &m->cross[l];
  const float *P = io->params, *xl = l ? w->xc[l - 1] : w->x0;
  int B = io->B, d = (int)m->d, r = (int)m->cfg.rank, K = (int)m->cfg.experts;
  if (r == 0)
    return BE_OP(io->be, cross_backward, w->dx0, dxl, g + x->W, g + x->bias, dout, w->x0, xl, w->act[l], P + x->W,
                 w->scratch, B, d);
  if (K == 1)
    return BE_OP(io->be, cross_lowrank_backward, w->dx0, dxl, g + x->V, g + x->U, g + x->bias, dout, w->x0, xl,
                 w->act[l], P + x->V, P + x->U, w->scratch, B, d, r);
  return BE_OP(io->be, cross_mix_backward, w->dx0, dxl, g + x->V, g + x->C, g + x->U, g + x->G, g + x->bias, dout,
               w->x0, xl, w->act[l], P + x->V, P + x->C, P + x->U, P + x->G, w->scratch, B, d, r, K);
}

static dlrec_status forward(const void *ctx, void *ws, const net_io *io, const float **logits) {
  const dcn *m = ctx;
  dcn_ws *w = ws;
  size_t B = (size_t)io->B, d = m->d, nd = m->n_dense, FD = (size_t)m->F * m->D;
  dlrec_net_profile *p = io->prof;
  double t = dlrec_now();
  /* x0 = [dense, e_1 .. e_F] per row. */
  dlrec_status st = net_concat_forward(io->be, w->x0, io->dense, nd, io->emb, FD, B);
  const float *xl = w->x0;
  for (uint32_t l = 0; st == DLREC_OK && l < m->cfg.layers; l++) {
    st = cross_forward(m, w, io, l, xl);
    xl = w->xc[l];
  }
  net_lap(&p->interaction, &t);
  /* xl is x_L now. The output layer reads [x_L, MLP(x0)] (parallel) or
   * MLP(x_L) (stacked; x_L itself without an MLP). */
  const float *h = NULL, *in = xl;
  int parallel = m->cfg.structure == DCN_PARALLEL;
  if (st == DLREC_OK && m->cfg.mlp.n_hidden) st = net_mlp_forward(&m->mlp, io, w->mlp, parallel ? w->x0 : xl, &h);
  if (st == DLREC_OK && parallel) {
    size_t H = m->mlp.out, I = m->out_in;
    st = BE_OP(io->be, copy_rows, w->cat, I, xl, d, B, d);
    if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, w->cat + d, I, h, H, B, H);
    in = w->cat;
  } else if (h) {
    in = h;
  }
  w->h = h;
  if (st == DLREC_OK) st = net_linear_forward(io, m->out, w->logits, in, 0);
  p->mlp_flops += 2.0 * (double)B * m->out_in;
  net_lap(&p->mlp, &t);
  *logits = w->logits;
  return st;
}

static dlrec_status backward(const void *ctx, void *ws, const net_io *io, const float *d_logits, float *g,
                             float *d_emb) {
  const dcn *m = ctx;
  dcn_ws *w = ws;
  int B = io->B;
  size_t d = m->d, nd = m->n_dense, FD = (size_t)m->F * m->D, I = m->out_in;
  const float *P = io->params;
  dlrec_net_profile *p = io->prof;
  double t = dlrec_now();
  int parallel = m->cfg.structure == DCN_PARALLEL, has_mlp = m->cfg.mlp.n_hidden > 0;
  const float *xL = w->xc[m->cfg.layers - 1];
  /* The output layer's input, as forward built it. */
  const float *in = parallel ? w->cat : has_mlp ? w->h : xL;
  dlrec_status st = BE_OP(io->be, linear_backward, w->dcat, g + m->L_out.w, g + m->L_out.b, d_logits, in,
                          P + m->L_out.w, B, (int)I, 1);
  p->mlp_flops += 4.0 * B * I;
  float *dxl = w->da; /* dL/dx_L */
  const size_t Bd = (size_t)B * d;
  if (parallel) {
    /* Split dcat into dL/dx_L and dL/dh (parallel always has an MLP); the
     * MLP's din is x0's first gradient term. */
    size_t H = I - d;
    if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, dxl, d, w->dcat, I, (size_t)B, d);
    if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, w->dh, H, w->dcat + d, I, (size_t)B, H);
    if (st == DLREC_OK) st = net_mlp_backward(&m->mlp, io, w->mlp, w->x0, w->dh, w->dx0, g);
  } else {
    /* Stacked: dcat is dL/dh, or dL/dx_L without an MLP. */
    if (st == DLREC_OK) st = BE_OP(io->be, fill_rows, w->dx0, Bd, 1, Bd, 0.0f);
    if (has_mlp && st == DLREC_OK) st = net_mlp_backward(&m->mlp, io, w->mlp, xL, w->dcat, dxl, g);
    else if (st == DLREC_OK) st = BE_OP(io->be, copy_rows, dxl, Bd, w->dcat, Bd, 1, Bd);
  }
  net_lap(&p->mlp, &t);
  /* The cross layers, last to first; layer 0's xl is x0, so its dxl adds
   * into dx0. */
  float *dnext = w->db;
  for (int l = (int)m->cfg.layers - 1; st == DLREC_OK && l >= 0; l--) {
    st = cross_backward(m, w, io, (uint32_t)l, dxl, dnext, g);
    float *tmp = dxl;
    dxl = dnext;
    dnext = tmp;
  }
  if (st == DLREC_OK) st = BE_OP(io->be, add, w->dx0, dxl, Bd);
  /* x0's embedding part is d_emb; the dense features take no gradient. */
  if (st == DLREC_OK) st = net_concat_backward(io->be, d_emb, w->dx0, nd, FD, (size_t)B);
  net_lap(&p->interaction, &t);
  return st;
}

/* ---- ONNX export ---------------------------------------------------------------- */

/* Cross layer l from xl: u (the full- or low-rank linear map, or the
 * mixture of experts), then x0 ⊙ u + xl. */
static const char *export_cross(const dcn *m, const net_plan *p, const float *params, onnx_graph *g, uint32_t l,
                                const char *x0, const char *xl) {
  const dcn_cross *x = &m->cross[l];
  const uint32_t r = m->cfg.rank, K = m->cfg.experts;
  const char *u;
  if (r == 0) {
    u = net_onnx_linear(g, p, params, x->w, xl, 0);
  } else if (K == 1) {
    u = net_onnx_linear(g, p, params, x->u0, net_onnx_linear(g, p, params, x->v0, xl, 0), 0);
  } else {
    const onnx_attr axis[] = {ONNX_INT("axis", 1)};
    const char *logits = net_onnx_linear(g, p, params, x->gate, xl, 0);
    const char *prob = onnx_node(g, "Softmax", NULL, &logits, 1, axis, 1, NULL); /* (N, K) */
    u = NULL;
    for (uint32_t k = 0; k < K; k++) {
      const char *t1 = net_onnx_linear(g, p, params, x->v0 + (int)k, xl, 1);
      const char *t2 = net_onnx_linear(g, p, params, x->c0 + (int)k, t1, 1);
      const char *e = net_onnx_linear(g, p, params, x->u0 + (int)k, t2, 0);
      const char *pe = onnx_op2(g, "Mul", onnx_slice(g, prob, 1, k, k + 1), e);
      u = u ? onnx_op2(g, "Add", u, pe) : pe;
    }
  }
  return onnx_op2(g, "Add", onnx_op2(g, "Mul", x0, u), xl);
}

static const char *export_onnx(const void *ctx, const net_plan *p, const float *params, onnx_graph *g,
                               const char *dense, const char *emb) {
  const dcn *m = ctx;
  const char *x0 = net_concat_export(g, dense, emb);
  const char *xl = x0;
  for (uint32_t l = 0; l < m->cfg.layers; l++) xl = export_cross(m, p, params, g, l, x0, xl);
  const int parallel = m->cfg.structure == DCN_PARALLEL;
  const char *h = m->cfg.mlp.n_hidden ? net_mlp_export(&m->mlp, p, params, g, parallel ? x0 : xl) : NULL;
  const char *cat[2] = {xl, h};
  const char *in = parallel && h ? onnx_concat(g, cat, 2, 1) : h ? h : xl;
  return net_onnx_linear(g, p, params, m->out, in, 0);
}

/* The generic tests' configs (net_test_config): small networks of every
 * cross variant for the finite differences, stacked and parallel, some with
 * dropout and batch normalization; wider ones (x0 of 3 + 3 x 16) for
 * batch-invariant scoring, where sgemm no longer happens to give one row's
 * bits for the batch, and to train across backends. */
#define DCN_SMALL "{\"embedding_dim\": 2, \"cross_layers\": 2, \"mlp\": [4, 3]"
#define DCN_LOW_RANK DCN_SMALL ", \"low_rank\": 2"
#define DCN_MOE DCN_SMALL ", \"low_rank\": 2, \"experts\": 3"
#define DCN_WIDE "{\"embedding_dim\": 16, \"cross_layers\": 2, \"mlp\": [32, 8]"
static const net_test_config tests[] = {
    {DCN_SMALL ", \"structure\": \"stacked\"}", DLREC_NET_TEST_GRADIENTS},
    {DCN_SMALL ", \"structure\": \"parallel\", \"dropout\": 0.3, \"batch_norm\": true}", DLREC_NET_TEST_GRADIENTS},
    {DCN_LOW_RANK ", \"structure\": \"stacked\", \"batch_norm\": true}", DLREC_NET_TEST_GRADIENTS},
    {DCN_LOW_RANK ", \"structure\": \"parallel\"}", DLREC_NET_TEST_GRADIENTS},
    {DCN_MOE ", \"structure\": \"stacked\", \"dropout\": 0.2}", DLREC_NET_TEST_GRADIENTS},
    {DCN_MOE ", \"structure\": \"parallel\"}", DLREC_NET_TEST_GRADIENTS},
    {"{\"embedding_dim\": 2, \"structure\": \"stacked\", \"mlp\": [], \"low_rank\": 1, \"experts\": 2}",
     DLREC_NET_TEST_GRADIENTS},
    {DCN_WIDE ", \"structure\": \"stacked\"}", DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
    {DCN_WIDE ", \"structure\": \"parallel\", \"low_rank\": 8, \"experts\": 3}",
     DLREC_NET_TEST_AGREEMENT | DLREC_NET_TEST_KEPT},
    {DCN_WIDE ", \"structure\": \"stacked\", \"batch_norm\": true, \"dropout\": 0.5}", 0},
    {DCN_WIDE ", \"structure\": \"parallel\", \"low_rank\": 8}", 0},
    {DCN_WIDE ", \"structure\": \"parallel\", \"low_rank\": 8, \"experts\": 4}", 0},
    {DCN_WIDE ", \"structure\": \"stacked\", \"low_rank\": 8, \"experts\": 3}", 0},
    {NULL, 0},
};

const net_type net_type_dcn_v2 = {
    .name = "dcn_v2",
    .doc = "DCN-v2: a cross network (full, low rank or experts) and an MLP",
    .config_default = config_default,
    .config_parse = config_parse,
    .config_to_json = config_to_json,
    .ctx_size = sizeof(dcn),
    .plan = plan,
    .init = init,
    .ws_size = sizeof(dcn_ws),
    .ws_arrays = ws_arrays,
    .forward = forward,
    .backward = backward,
    .export_onnx = export_onnx,
    .tests = tests,
};
