/* DLRM forward, backward and training step on the CPU kernels of nn.h and
 * embed.h. Shapes (B = batch rows, F = sparse columns, D = emb_dim,
 * I = D + F(F+1)/2 the interaction's width):
 *   dense (B, n_dense) -> bottom MLP -> x (B, D)
 *   ids -> bags -> emb (B, F, D)
 *   [x, emb] -> dot interaction -> inter (B, I) -> top MLP -> logit (B, 1)
 */
#include "dlrec/dlrm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dlrec/arena.h"
#include "dlrec/progress.h"
#include "dlrec/rng.h"

typedef struct layer {
  uint32_t in, out;
  size_t w, b; /* offsets of the weight (out, in) and bias (out) in the flat arrays */
} layer;

struct dlrec_dlrm {
  dlrec_dlrm_shape shape;
  dlrec_schema schema;
  layer bottom[DLREC_MLP_MAX_LAYERS], top[DLREC_MLP_MAX_LAYERS];
  uint32_t inter_dim;
  size_t n_params;
  float *params;
  dlrec_table *table;
  uint64_t max_ids_per_row; /* sum of the columns' max hotness */
};

struct dlrec_dlrm_ws {
  uint32_t max_batch;
  dlrec_arena arena;
  float *emb, *d_emb;                      /* (B, F, D) */
  float *bot[DLREC_MLP_MAX_LAYERS];        /* bottom outputs (B, bottom[l]) */
  float *inter, *d_inter;                  /* (B, I) */
  float *top[DLREC_MLP_MAX_LAYERS];        /* top outputs (B, top[l]); the last holds logits */
  float *d_a, *d_b;                        /* ping-pong activation gradients (B, widest) */
  float *dx;                               /* (B, D) */
  float *grad;                             /* (n_params) */
  void *scratch;                           /* the sparse backward's */
  size_t scratch_bytes;
  dlrec_dlrm_profile prof;
};

/* Adds the seconds since *t to *acc and restarts *t. */
static void lap(double *acc, double *t) {
  double now = dlrec_now();
  *acc += now - *t;
  *t = now;
}

/* Flops (2 per multiply-add) of an MLP's forward for one row. */
static double mlp_flops_row(const layer *ls, uint32_t n) {
  double f = 0;
  for (uint32_t l = 0; l < n; l++) f += 2.0 * ls[l].in * ls[l].out;
  return f;
}

void dlrec_dlrm_ws_profile(const dlrec_dlrm_ws *ws, dlrec_dlrm_profile *p) { *p = ws->prof; }

static dlrec_status plan_mlp(layer *ls, uint32_t n, const uint32_t *widths, uint32_t in, size_t *off,
                             const char *which) {
  if (n < 1 || n > DLREC_MLP_MAX_LAYERS)
    return dlrec_error(DLREC_ERR_INVALID, "%s MLP: %u layers, expected 1 to %d", which, n, DLREC_MLP_MAX_LAYERS);
  for (uint32_t l = 0; l < n; l++) {
    if (widths[l] < 1 || widths[l] > 65536)
      return dlrec_error(DLREC_ERR_INVALID, "%s MLP: layer %u width %u out of range [1, 65536]", which, l, widths[l]);
    ls[l].in = l ? widths[l - 1] : in;
    ls[l].out = widths[l];
    ls[l].w = *off;
    *off += (size_t)ls[l].in * ls[l].out;
    ls[l].b = *off;
    *off += ls[l].out;
  }
  return DLREC_OK;
}

dlrec_status dlrec_dlrm_create(dlrec_dlrm **out, const dlrec_dlrm_shape *shape, const dlrec_schema *schema) {
  *out = NULL;
  const dlrec_dlrm_shape *s = shape;
  if (s->emb_dim < 1 || s->emb_dim > DLREC_EMBED_MAX_DIM)
    return dlrec_error(DLREC_ERR_INVALID, "embedding dim %u out of range [1, %d]", s->emb_dim, DLREC_EMBED_MAX_DIM);
  if (schema->n_sparse < 1) return dlrec_error(DLREC_ERR_INVALID, "DLRM needs at least one categorical column");
  if (schema->n_dense < 1) return dlrec_error(DLREC_ERR_INVALID, "DLRM needs at least one dense column");
  if (s->n_bottom >= 1 && s->n_bottom <= DLREC_MLP_MAX_LAYERS && s->bottom[s->n_bottom - 1] != s->emb_dim)
    return dlrec_error(DLREC_ERR_INVALID, "bottom MLP ends with width %u, but the embedding dim is %u (they must match)",
                       s->bottom[s->n_bottom - 1], s->emb_dim);
  if (s->n_top >= 1 && s->n_top <= DLREC_MLP_MAX_LAYERS && s->top[s->n_top - 1] != 1)
    return dlrec_error(DLREC_ERR_INVALID, "top MLP ends with width %u, expected 1 (the logit)", s->top[s->n_top - 1]);
  dlrec_dlrm *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  m->shape = *s;
  m->schema = *schema;
  m->inter_dim = (uint32_t)dlrec_interaction_dot_dim((int)schema->n_sparse, (int)s->emb_dim);
  size_t off = 0;
  dlrec_status st = plan_mlp(m->bottom, s->n_bottom, s->bottom, schema->n_dense, &off, "bottom");
  if (st == DLREC_OK && m->inter_dim == 0)
    st = dlrec_error(DLREC_ERR_INVALID, "interaction of %u columns of width %u is out of range", schema->n_sparse,
                     s->emb_dim);
  if (st == DLREC_OK) st = plan_mlp(m->top, s->n_top, s->top, m->inter_dim, &off, "top");
  if (st == DLREC_OK) {
    m->n_params = off;
    m->params = calloc(off, sizeof(float));
    if (!m->params) st = dlrec_error(DLREC_ERR_NOMEM, "cannot allocate %zu dense parameters", off);
  }
  if (st == DLREC_OK) st = dlrec_table_create(&m->table, schema->table_rows, s->emb_dim);
  for (uint32_t c = 0; c < schema->n_sparse; c++) m->max_ids_per_row += schema->sparse[c].max_hotness;
  if (st != DLREC_OK) {
    dlrec_dlrm_free(m);
    return st;
  }
  *out = m;
  return DLREC_OK;
}

void dlrec_dlrm_free(dlrec_dlrm *m) {
  if (!m) return;
  dlrec_table_free(m->table);
  free(m->params);
  free(m);
}

static void init_mlp(float *p, const layer *ls, uint32_t n, uint64_t seed, uint64_t stream0) {
  for (uint32_t l = 0; l < n; l++) {
    dlrec_rng r;
    dlrec_rng_seed(&r, seed, stream0 + l);
    double wstd = sqrt(2.0 / (ls[l].in + ls[l].out)), bstd = sqrt(1.0 / ls[l].out);
    for (size_t i = 0; i < (size_t)ls[l].in * ls[l].out; i++) p[ls[l].w + i] = (float)(wstd * dlrec_rng_normal(&r));
    for (uint32_t i = 0; i < ls[l].out; i++) p[ls[l].b + i] = (float)(bstd * dlrec_rng_normal(&r));
  }
}

dlrec_status dlrec_dlrm_init(dlrec_dlrm *m, uint64_t seed) {
  init_mlp(m->params, m->bottom, m->shape.n_bottom, seed, 1000);
  init_mlp(m->params, m->top, m->shape.n_top, seed, 2000);
  dlrec_row_range ranges[DLREC_MAX_SPARSE];
  for (uint32_t c = 0; c < m->schema.n_sparse; c++)
    ranges[c] = (dlrec_row_range){m->schema.sparse[c].id_begin, m->schema.sparse[c].id_end};
  return dlrec_table_init_uniform(m->table, ranges, m->schema.n_sparse, seed);
}

const dlrec_dlrm_shape *dlrec_dlrm_get_shape(const dlrec_dlrm *m) { return &m->shape; }
const dlrec_schema *dlrec_dlrm_schema(const dlrec_dlrm *m) { return &m->schema; }
float *dlrec_dlrm_dense_params(dlrec_dlrm *m, size_t *n) {
  *n = m->n_params;
  return m->params;
}
const float *dlrec_dlrm_dense_params_const(const dlrec_dlrm *m, size_t *n) {
  *n = m->n_params;
  return m->params;
}
dlrec_table *dlrec_dlrm_table(dlrec_dlrm *m) { return m->table; }
const dlrec_table *dlrec_dlrm_table_const(const dlrec_dlrm *m) { return m->table; }

static uint32_t widest(const dlrec_dlrm *m) {
  uint32_t w = m->inter_dim > m->shape.emb_dim ? m->inter_dim : m->shape.emb_dim;
  for (uint32_t l = 0; l < m->shape.n_bottom; l++) w = m->bottom[l].out > w ? m->bottom[l].out : w;
  for (uint32_t l = 0; l < m->shape.n_top; l++) w = m->top[l].out > w ? m->top[l].out : w;
  return w;
}

dlrec_status dlrec_dlrm_ws_create(dlrec_dlrm_ws **out, const dlrec_dlrm *m, uint32_t max_batch) {
  *out = NULL;
  if (max_batch < 1 || max_batch > (1u << 22))
    return dlrec_error(DLREC_ERR_INVALID, "batch size %u out of range [1, %u]", max_batch, 1u << 22);
  dlrec_dlrm_ws *ws = calloc(1, sizeof *ws);
  if (!ws) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  ws->max_batch = max_batch;
  dlrec_arena_init(&ws->arena, 1u << 20);
  size_t B = max_batch, F = m->schema.n_sparse, D = m->shape.emb_dim;
#define WS_ALLOC(ptr, floats)                                                        \
  do {                                                                               \
    if (!((ptr) = dlrec_arena_alloc(&ws->arena, (floats) * sizeof(float), 64))) goto nomem; \
  } while (0)
  WS_ALLOC(ws->emb, B * F * D);
  WS_ALLOC(ws->d_emb, B * F * D);
  for (uint32_t l = 0; l < m->shape.n_bottom; l++) WS_ALLOC(ws->bot[l], B * m->bottom[l].out);
  WS_ALLOC(ws->inter, B * m->inter_dim);
  WS_ALLOC(ws->d_inter, B * m->inter_dim);
  for (uint32_t l = 0; l < m->shape.n_top; l++) WS_ALLOC(ws->top[l], B * m->top[l].out);
  WS_ALLOC(ws->d_a, B * widest(m));
  WS_ALLOC(ws->d_b, B * widest(m));
  WS_ALLOC(ws->dx, B * D);
  WS_ALLOC(ws->grad, m->n_params);
#undef WS_ALLOC
  ws->scratch_bytes = dlrec_bag_backward_scratch_bytes(m->table, (uint64_t)B * m->max_ids_per_row);
  if (!(ws->scratch = dlrec_arena_alloc(&ws->arena, ws->scratch_bytes, 64))) goto nomem;
  *out = ws;
  return DLREC_OK;
nomem:
  dlrec_dlrm_ws_free(ws);
  return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the workspace for batches of %u rows", max_batch);
}

void dlrec_dlrm_ws_free(dlrec_dlrm_ws *ws) {
  if (!ws) return;
  dlrec_arena_free(&ws->arena);
  free(ws);
}

static dlrec_bag_batch bags_of(const dlrec_dlrm *m, const dlrec_batch *b) {
  dlrec_bag_batch bags = {b->rows, m->schema.n_sparse, b->offsets, b->ids};
  return bags;
}

static dlrec_status check_batch(const dlrec_dlrm_ws *ws, const dlrec_batch *b) {
  if (b->rows < 1 || b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  return DLREC_OK;
}

/* The forward pass up to the logits (ws->top[n_top - 1]), keeping every
 * activation for the backward. */
static dlrec_status forward(const dlrec_dlrm *m, dlrec_dlrm_ws *ws, const dlrec_batch *b) {
  dlrec_status st = check_batch(ws, b);
  if (st != DLREC_OK) return st;
  int B = (int)b->rows, F = (int)m->schema.n_sparse, D = (int)m->shape.emb_dim;
  dlrec_dlrm_profile *p = &ws->prof;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(m, b);
  st = dlrec_bag_forward(m->table, &bags, m->shape.pooling, ws->emb);
  for (int c = 0; st == DLREC_OK && c < F; c++) p->lookups += b->offsets[c][B] - b->offsets[c][0];
  lap(&p->emb_forward, &t);
  const float *in = b->dense;
  for (uint32_t l = 0; st == DLREC_OK && l < m->shape.n_bottom; l++) {
    const layer *L = &m->bottom[l];
    st = dlrec_linear_relu_forward(ws->bot[l], in, m->params + L->w, m->params + L->b, B, (int)L->in, (int)L->out);
    in = ws->bot[l];
  }
  lap(&p->mlp, &t);
  if (st == DLREC_OK) st = dlrec_interaction_dot_forward(ws->inter, in, ws->emb, B, F, D);
  lap(&p->interaction, &t);
  in = ws->inter;
  for (uint32_t l = 0; st == DLREC_OK && l < m->shape.n_top; l++) {
    const layer *L = &m->top[l];
    if (l + 1 < m->shape.n_top)
      st = dlrec_linear_relu_forward(ws->top[l], in, m->params + L->w, m->params + L->b, B, (int)L->in, (int)L->out);
    else
      st = dlrec_linear_forward(ws->top[l], in, m->params + L->w, m->params + L->b, B, (int)L->in, (int)L->out);
    in = ws->top[l];
  }
  lap(&p->mlp, &t);
  p->forward_rows += (uint64_t)B;
  p->mlp_flops += B * (mlp_flops_row(m->bottom, m->shape.n_bottom) + mlp_flops_row(m->top, m->shape.n_top));
  return st;
}

/* ---- batch-invariant scoring ---------------------------------------------- */

struct dlrec_dlrm_scorer {
  const dlrec_dlrm *m;
  dlrec_packed_linear *bottom[DLREC_MLP_MAX_LAYERS], *top[DLREC_MLP_MAX_LAYERS];
};

void dlrec_dlrm_scorer_free(dlrec_dlrm_scorer *s) {
  if (!s) return;
  for (uint32_t l = 0; l < DLREC_MLP_MAX_LAYERS; l++) {
    dlrec_packed_linear_free(s->bottom[l]);
    dlrec_packed_linear_free(s->top[l]);
  }
  free(s);
}

/* Packs the n layers ls of the flat params into dst. */
static dlrec_status pack_mlp(dlrec_packed_linear **dst, const float *params, const layer *ls, uint32_t n) {
  dlrec_status st = DLREC_OK;
  for (uint32_t l = 0; st == DLREC_OK && l < n; l++)
    st = dlrec_packed_linear_create(&dst[l], params + ls[l].w, params + ls[l].b, (int)ls[l].in, (int)ls[l].out);
  return st;
}

dlrec_status dlrec_dlrm_scorer_create(dlrec_dlrm_scorer **out, const dlrec_dlrm *m) {
  *out = NULL;
  dlrec_dlrm_scorer *s = calloc(1, sizeof *s);
  if (!s) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->m = m;
  dlrec_status st = pack_mlp(s->bottom, m->params, m->bottom, m->shape.n_bottom);
  if (st == DLREC_OK) st = pack_mlp(s->top, m->params, m->top, m->shape.n_top);
  if (st != DLREC_OK) {
    dlrec_dlrm_scorer_free(s);
    return st;
  }
  *out = s;
  return DLREC_OK;
}

dlrec_status dlrec_dlrm_predict(const dlrec_dlrm_scorer *s, dlrec_dlrm_ws *ws, const dlrec_batch *b, float *prob) {
  const dlrec_dlrm *m = s->m;
  dlrec_status st = check_batch(ws, b);
  if (st != DLREC_OK) return st;
  int B = (int)b->rows, F = (int)m->schema.n_sparse, D = (int)m->shape.emb_dim;
  dlrec_bag_batch bags = bags_of(m, b);
  st = dlrec_bag_forward(m->table, &bags, m->shape.pooling, ws->emb);
  const float *in = b->dense;
  for (uint32_t l = 0; st == DLREC_OK && l < m->shape.n_bottom; l++) {
    st = dlrec_packed_linear_forward(s->bottom[l], in, ws->bot[l], B, 1);
    in = ws->bot[l];
  }
  if (st == DLREC_OK) st = dlrec_interaction_dot_forward(ws->inter, in, ws->emb, B, F, D);
  in = ws->inter;
  for (uint32_t l = 0; st == DLREC_OK && l < m->shape.n_top; l++) {
    st = dlrec_packed_linear_forward(s->top[l], in, ws->top[l], B, l + 1 < m->shape.n_top);
    in = ws->top[l];
  }
  if (st == DLREC_OK) st = dlrec_sigmoid_forward(prob, ws->top[m->shape.n_top - 1], (size_t)B);
  return st;
}

/* Loss and backward down to ws->grad (dense) and ws->d_emb. */
static dlrec_status backward(dlrec_dlrm *m, dlrec_dlrm_ws *ws, const dlrec_batch *b, double *loss) {
  if (!b->labels) return dlrec_error(DLREC_ERR_INVALID, "training needs labeled data");
  int B = (int)b->rows, F = (int)m->schema.n_sparse, D = (int)m->shape.emb_dim;
  dlrec_dlrm_profile *p = &ws->prof;
  double t = dlrec_now();
  const float *logits = ws->top[m->shape.n_top - 1];
  dlrec_status st = dlrec_bce_logits_forward(loss, logits, b->labels, B);
  float *dout = ws->d_a, *dnext = ws->d_b;
  if (st == DLREC_OK) st = dlrec_bce_logits_backward(dout, logits, b->labels, B);
  memset(ws->grad, 0, m->n_params * sizeof(float));
  lap(&p->other, &t);
  float *g = ws->grad;
  for (int l = (int)m->shape.n_top - 1; st == DLREC_OK && l >= 0; l--) {
    const layer *L = &m->top[l];
    const float *in = l ? ws->top[l - 1] : ws->inter;
    float *din = l ? dnext : ws->d_inter;
    st = dlrec_linear_backward(din, g + L->w, g + L->b, dout, in, m->params + L->w, B, (int)L->in, (int)L->out);
    if (st == DLREC_OK && l) st = dlrec_relu_backward(din, din, in, (size_t)B * L->in);
    float *t = dout;
    dout = dnext;
    dnext = t;
  }
  const float *x = ws->bot[m->shape.n_bottom - 1];
  lap(&p->mlp, &t);
  if (st == DLREC_OK) st = dlrec_interaction_dot_backward(ws->dx, ws->d_emb, ws->d_inter, x, ws->emb, B, F, D);
  lap(&p->interaction, &t);
  /* The bottom MLP's last layer has a ReLU too: mask dx with its output. */
  if (st == DLREC_OK) st = dlrec_relu_backward(ws->dx, ws->dx, x, (size_t)B * D);
  dout = ws->dx;
  dnext = ws->d_a;
  for (int l = (int)m->shape.n_bottom - 1; st == DLREC_OK && l >= 0; l--) {
    const layer *L = &m->bottom[l];
    const float *in = l ? ws->bot[l - 1] : b->dense;
    float *din = l ? dnext : NULL; /* nothing flows into the dense features */
    st = dlrec_linear_backward(din, g + L->w, g + L->b, dout, in, m->params + L->w, B, (int)L->in, (int)L->out);
    if (st == DLREC_OK && l) st = dlrec_relu_backward(din, din, in, (size_t)B * L->in);
    dout = din;
    dnext = (dnext == ws->d_a) ? ws->d_b : ws->d_a;
  }
  lap(&p->mlp, &t);
  p->backward_rows += (uint64_t)B;
  /* Backward: dW everywhere, din everywhere but the first bottom layer. */
  p->mlp_flops += B * (2 * mlp_flops_row(m->bottom, m->shape.n_bottom) + 2 * mlp_flops_row(m->top, m->shape.n_top) -
                       2.0 * m->bottom[0].in * m->bottom[0].out);
  return st;
}

dlrec_status dlrec_dlrm_gradients(dlrec_dlrm *m, dlrec_dlrm_ws *ws, const dlrec_batch *batch, double *loss,
                                  const float **grad, const float **d_emb) {
  dlrec_status st = forward(m, ws, batch);
  if (st == DLREC_OK) st = backward(m, ws, batch, loss);
  *grad = ws->grad;
  *d_emb = ws->d_emb;
  return st;
}

dlrec_status dlrec_dlrm_train_step(dlrec_dlrm *m, dlrec_dlrm_ws *ws, dlrec_dlrm_optim *opt, const dlrec_batch *batch,
                                   float lr_scale, uint64_t step, double *loss, float *prob) {
  dlrec_status st = forward(m, ws, batch);
  if (st == DLREC_OK && prob) st = dlrec_sigmoid_forward(prob, ws->top[m->shape.n_top - 1], batch->rows);
  if (st == DLREC_OK) st = backward(m, ws, batch, loss);
  if (st != DLREC_OK) return st;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(m, batch);
  st = dlrec_sparse_optim_set_lr(opt->sparse, opt->sparse_lr * lr_scale);
  if (st == DLREC_OK)
    st = dlrec_bag_backward_update(m->table, opt->sparse, &bags, m->shape.pooling, ws->d_emb, ws->scratch,
                                   ws->scratch_bytes);
  lap(&ws->prof.emb_update, &t);
  if (st != DLREC_OK) return st;
  dlrec_optim_config dense = opt->dense;
  dense.lr = opt->dense.lr * lr_scale;
  st = dlrec_optim_step(&dense, m->params, ws->grad, opt->dense_state, m->n_params, step);
  lap(&ws->prof.other, &t);
  return st;
}
