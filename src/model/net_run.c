/* The passes over a network, for every model type: the embedding stage, the
 * model's forward (one, for training and scoring alike), the loss and the
 * model's backward, and the training step (the fused sparse update of the
 * table from d_emb, the dense optimizer over the flat array).
 *   ids -> bags -> emb (B, F, D)
 *   (dense (B, n_dense), emb) -> model forward -> logits (B)
 * Every op runs on a backend (BE_OP): the network's in training, the one a
 * scorer was created with when scoring.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dlrec/arena.h"
#include "dlrec/progress.h"
#include "model/model_type.h"

struct dlrec_net_ws {
  uint32_t max_batch;
  dlrec_arena arena;
  float *emb, *d_emb; /* (B, F, D) */
  float *d_logits;    /* (B) */
  float *grad;        /* (n_params) */
  void *scratch;      /* the sparse backward's */
  size_t scratch_bytes;
  void *model_ws;     /* the model type's own activations */
  /* The type frees model_ws: a workspace may outlive its network (a server
   * thread frees its workspace after a reload has freed the old network),
   * so it keeps the type, which is static, and not the network. */
  const net_type *type;
  dlrec_net_profile prof;
};

struct dlrec_net_scorer {
  const dlrec_net *net;
  /* The backend that packed the layers: it scores with them and frees them,
   * whatever backend the network is given later. */
  dlrec_backend *be;
  dlrec_packed_linear *packed[NET_MAX_LINEAR];
};

void net_lap(double *acc, double *t) {
  double now = dlrec_now();
  *acc += now - *t;
  *t = now;
}

dlrec_status net_linear_forward(const net_io *io, int layer, float *out, const float *in, int relu) {
  const dlrec_act act = relu ? DLREC_ACT_RELU : DLREC_ACT_NONE;
  if (io->packed) return BE_OP(io->be, packed_forward, out, io->packed[layer], in, io->B, act);
  const net_linear *L = &io->plan->linear[layer];
  const float *w = io->params + L->w, *b = L->b == NET_NO_BIAS ? NULL : io->params + L->b;
  return BE_OP(io->be, linear_forward, out, in, w, b, io->B, (int)L->in, (int)L->out, act);
}

void dlrec_net_ws_profile(const dlrec_net_ws *ws, dlrec_net_profile *p) { *p = ws->prof; }

dlrec_status dlrec_net_ws_create(dlrec_net_ws **out, const dlrec_net *n, uint32_t max_batch) {
  *out = NULL;
  if (max_batch < 1 || max_batch > (1u << 22))
    return dlrec_error(DLREC_ERR_INVALID, "batch size %u out of range [1, %u]", max_batch, 1u << 22);
  dlrec_net_ws *ws = calloc(1, sizeof *ws);
  if (!ws) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  ws->max_batch = max_batch;
  ws->type = n->type;
  dlrec_arena_init(&ws->arena, 1u << 20);
  size_t B = max_batch, F = n->schema.n_sparse, D = n->plan.emb_dim;
  /* A model may have no categorical column; the arena wants a size. */
  size_t emb_floats = B * F * D > 0 ? B * F * D : 1;
  dlrec_status s;
#define WS_ALLOC(ptr, floats)                                                               \
  do {                                                                                      \
    if (!((ptr) = dlrec_arena_alloc(&ws->arena, (floats) * sizeof(float), 64))) goto nomem; \
  } while (0)
  WS_ALLOC(ws->emb, emb_floats);
  WS_ALLOC(ws->d_emb, emb_floats);
  WS_ALLOC(ws->d_logits, B);
  WS_ALLOC(ws->grad, n->plan.n_params ? n->plan.n_params : 1);
#undef WS_ALLOC
  ws->scratch_bytes = dlrec_bag_backward_scratch_bytes(n->table, (uint64_t)B * n->max_ids_per_row);
  if (!(ws->scratch = dlrec_arena_alloc(&ws->arena, ws->scratch_bytes ? ws->scratch_bytes : 1, 64))) goto nomem;
  if ((s = n->type->ws_create(n->ctx, &n->plan, max_batch, &ws->model_ws)) != DLREC_OK) {
    dlrec_net_ws_free(ws);
    return s;
  }
  *out = ws;
  return DLREC_OK;
nomem:
  dlrec_net_ws_free(ws);
  return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the workspace for batches of %u rows", max_batch);
}

void dlrec_net_ws_free(dlrec_net_ws *ws) {
  if (!ws) return;
  if (ws->model_ws) ws->type->ws_free(ws->model_ws);
  dlrec_arena_free(&ws->arena);
  free(ws);
}

static dlrec_bag_batch bags_of(const dlrec_net *n, const dlrec_batch *b) {
  dlrec_bag_batch bags = {b->rows, n->schema.n_sparse, b->offsets, b->ids, n->mean_cols};
  return bags;
}

/* A pass's view on backend be; state (the writable parameters) only in training. */
static net_io io_of(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                    const dlrec_packed_linear *const *packed, float *state, uint64_t step) {
  net_io io = {.be = be,
               .B = (int)b->rows,
               .dense = b->dense,
               .emb = ws->emb,
               .params = n->params,
               .plan = &n->plan,
               .packed = packed,
               .prof = &ws->prof,
               .train = state != NULL,
               .step = step,
               .state = state};
  return io;
}

/* The embedding stage and the model's forward up to the logits on backend
 * be, keeping every activation for the backward. Scoring passes packed (and
 * no state); training passes the network's writable parameters as state and
 * the step. */
static dlrec_status run_forward(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                                const dlrec_packed_linear *const *packed, float *state, uint64_t step,
                                const float **logits) {
  if (b->rows < 1 || b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  int B = (int)b->rows, F = (int)n->schema.n_sparse;
  dlrec_net_profile *p = &ws->prof;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(n, b);
  dlrec_status st = F ? BE_OP(be, bag_forward, ws->emb, n->table, &bags, n->plan.pooling) : DLREC_OK;
  for (int c = 0; st == DLREC_OK && c < F; c++) p->lookups += b->offsets[c][B] - b->offsets[c][0];
  net_lap(&p->emb_forward, &t);
  net_io io = io_of(n, be, ws, b, packed, state, step);
  if (st == DLREC_OK) st = n->type->forward(n->ctx, ws->model_ws, &io, logits);
  p->forward_rows += (uint64_t)B;
  return st;
}

/* Loss and backward down to ws->grad (dense) and ws->d_emb, on the network's backend. */
static dlrec_status run_backward(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, const float *logits,
                                 uint64_t step, double *loss) {
  if (!b->labels) return dlrec_error(DLREC_ERR_INVALID, "training needs labeled data");
  int B = (int)b->rows;
  dlrec_net_profile *p = &ws->prof;
  double t = dlrec_now();
  dlrec_status st = BE_OP(n->be, bce_forward, loss, logits, b->labels, B);
  if (st == DLREC_OK) st = BE_OP(n->be, bce_backward, ws->d_logits, logits, b->labels, B);
  memset(ws->grad, 0, n->plan.n_params * sizeof(float));
  net_lap(&p->other, &t);
  net_io io = io_of(n, n->be, ws, b, NULL, n->params, step);
  if (st == DLREC_OK) st = n->type->backward(n->ctx, ws->model_ws, &io, ws->d_logits, ws->grad, ws->d_emb);
  p->backward_rows += (uint64_t)B;
  return st;
}

/* ---- batch-invariant scoring ---------------------------------------------- */

void dlrec_net_scorer_free(dlrec_net_scorer *s) {
  if (!s) return;
  for (uint32_t l = 0; l < NET_MAX_LINEAR; l++)
    if (s->packed[l]) BE_OP(s->be, packed_free, s->packed[l]);
  free(s);
}

dlrec_status dlrec_net_scorer_create(dlrec_net_scorer **out, const dlrec_net *n) {
  *out = NULL;
  dlrec_net_scorer *s = calloc(1, sizeof *s);
  if (!s) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->net = n;
  s->be = n->be;
  dlrec_status st = DLREC_OK;
  for (uint32_t l = 0; st == DLREC_OK && l < n->plan.n_linear; l++) {
    const net_linear *L = &n->plan.linear[l];
    const float *bias = L->b == NET_NO_BIAS ? NULL : n->params + L->b;
    st = BE_OP(s->be, packed_create, &s->packed[l], n->params + L->w, bias, (int)L->in, (int)L->out);
  }
  if (st != DLREC_OK) {
    dlrec_net_scorer_free(s);
    return st;
  }
  *out = s;
  return DLREC_OK;
}

dlrec_status dlrec_net_predict(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *b, float *prob) {
  const float *logits = NULL;
  dlrec_status st =
      run_forward(s->net, s->be, ws, b, (const dlrec_packed_linear *const *)s->packed, NULL, 0, &logits);
  if (st == DLREC_OK) st = BE_OP(s->be, sigmoid, prob, logits, (size_t)b->rows);
  return st;
}

/* ---- training --------------------------------------------------------------- */

dlrec_status dlrec_net_gradients(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, double *loss,
                                 const float **grad, const float **d_emb) {
  const float *logits = NULL;
  dlrec_status st = run_forward(n, n->be, ws, batch, NULL, n->params, 0, &logits);
  if (st == DLREC_OK) st = run_backward(n, ws, batch, logits, 0, loss);
  *grad = ws->grad;
  *d_emb = ws->d_emb;
  return st;
}

/* Gradient-norm clipping with PyTorch clip_grad_norm_'s semantics: the L2
 * norm of all gradients together (the dense ones and d_emb (B, F, D), the
 * per-lookup embedding gradients), and if it exceeds max_norm, every
 * gradient times max_norm / (norm + 1e-6). The norm is summed in double in
 * a fixed order, so a step stays bitwise reproducible. */
static dlrec_status clip_gradients(float *grad, size_t n_grad, float *d_emb, size_t n_emb, float max_norm,
                                   uint64_t step) {
  double sq = 0;
  for (size_t i = 0; i < n_grad; i++) sq += (double)grad[i] * grad[i];
  for (size_t i = 0; i < n_emb; i++) sq += (double)d_emb[i] * d_emb[i];
  const double norm = sqrt(sq);
  if (!isfinite(norm))
    return dlrec_error(DLREC_ERR_INVALID, "training diverged at step %llu (the gradient norm is %g): lower the "
                       "learning rates or add warmup", (unsigned long long)step, norm);
  const double coef = (double)max_norm / (norm + 1e-6);
  if (coef >= 1.0) return DLREC_OK;
  const float c = (float)coef;
  for (size_t i = 0; i < n_grad; i++) grad[i] *= c;
  for (size_t i = 0; i < n_emb; i++) d_emb[i] *= c;
  return DLREC_OK;
}

dlrec_status dlrec_net_train_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, const dlrec_batch *batch,
                                  float lr_scale, uint64_t step, double *loss, float *prob) {
  const float *logits = NULL;
  dlrec_status st = run_forward(n, n->be, ws, batch, NULL, n->params, step, &logits);
  if (st == DLREC_OK && prob) st = BE_OP(n->be, sigmoid, prob, logits, batch->rows);
  if (st == DLREC_OK) st = run_backward(n, ws, batch, logits, step, loss);
  if (st == DLREC_OK && opt->clip_grad_norm > 0)
    st = clip_gradients(ws->grad, n->plan.n_trainable, ws->d_emb,
                        (size_t)batch->rows * n->schema.n_sparse * n->plan.emb_dim, opt->clip_grad_norm, step);
  if (st != DLREC_OK) return st;
  double t = dlrec_now();
  dlrec_bag_batch bags = bags_of(n, batch);
  st = dlrec_sparse_optim_set_lr(opt->sparse, opt->sparse_lr * lr_scale);
  if (st == DLREC_OK && n->schema.n_sparse) /* no categorical column: no embedding to update */
    st = BE_OP(n->be, bag_backward_update, n->table, opt->sparse, &bags, n->plan.pooling, ws->d_emb, ws->scratch,
               ws->scratch_bytes);
  net_lap(&ws->prof.emb_update, &t);
  if (st != DLREC_OK) return st;
  dlrec_optim_config dense = opt->dense;
  dense.lr = opt->dense.lr * lr_scale;
  /* The trainable prefix only: buffers have no gradient and are not stepped. */
  st = BE_OP(n->be, optim_step, &dense, n->params, ws->grad, opt->dense_state, n->plan.n_trainable, step);
  net_lap(&ws->prof.other, &t);
  return st;
}
