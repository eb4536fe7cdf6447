/* The passes over a network, for every model type and every embedding
 * stage: the stage's pooling, the model's forward (one, for training and
 * scoring alike), the loss and the model's backward.
 *   ids -> stage rows -> stage forward -> emb (B, F, D)
 *   (dense (B, n_dense), emb) -> model forward -> logits (B)
 * A training pass splits its batch across the backend's threads where it
 * can (split_step): one parallel region a step, each way through the whole
 * network on a one-thread lane. Every op runs on a backend (BE_OP): the
 * network's in training, the one a scorer was created with when scoring.
 * The step around a training pass (the updates) is src/train/step.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "core/arena.h"
#include "core/clock.h"
#include "model/net_ws.h"

/* A pass's view on backend be; state (the writable parameters) only in training. */
static net_io io_of(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                    const dlrec_packed_linear *const *packed, float *state, uint64_t step) {
  net_io io = {.be = be,
               .B = (int)b->rows,
               .dense = b->dense,
               .emb = ws->emb,
               .params = net_params(n),
               .plan = &n->plan,
               .packed = packed,
               .prof = &ws->prof,
               .train = state != NULL,
               .step = step,
               .row0 = ws->row_base,
               .split = state ? ws->pass_split : NULL,
               .state = state ? net_params(n) : NULL};
  return io;
}

/* DLREC_OK when ws was made for backend be's memory (the host's, or be's own). */
static dlrec_status ws_fits(const dlrec_net_ws *ws, const dlrec_backend *be) {
  if (ws->dev_be == (be->host_memory ? NULL : be)) return DLREC_OK;
  return dlrec_error(DLREC_ERR_INVALID, "a workspace made for %s used on %s: make it after dlrec_net_set_backend",
                     ws->dev_be ? ws->dev_be->describe : "host memory", be->describe);
}

dlrec_status net_scores_out(dlrec_backend *be, const dlrec_net_ws *ws, float *prob, const float *logits,
                            uint32_t B) {
  if (!ws->dev_be) return BE_OP(be, sigmoid, prob, logits, (size_t)B);
  dlrec_status st = BE_OP(be, sigmoid, ws->d_prob, logits, (size_t)B);
  return st == DLREC_OK ? be->ops->download(be, prob, ws->d_prob, (size_t)B * sizeof(float)) : st;
}

/* The workspace against the network's table placement, on a device. */
static dlrec_status ws_placed(const dlrec_net *n, const dlrec_net_ws *ws) {
  const int F = (int)n->schema.n_sparse;
  if (ws->dev_be && !ws->h_emb != !(n->host_table && F))
    return dlrec_error(DLREC_ERR_INVALID, "a workspace made for a table in %s used with one in %s",
                       ws->h_emb ? "host memory" : "device memory", ws->h_emb ? "device memory" : "host memory");
  if (ws->dev_be && ws->h_emb && !ws->d_cold != !n->dhot)
    return dlrec_error(DLREC_ERR_INVALID, "a workspace made %s hot rows on the device used with a network %s them",
                       ws->d_cold ? "for" : "without", n->dhot ? "with" : "without");
  return DLREC_OK;
}

dlrec_status net_run_forward(const dlrec_net *n, dlrec_backend *be, dlrec_net_ws *ws, const dlrec_batch *b,
                             const dlrec_packed_linear *const *packed, float *state, uint64_t step,
                             const float **logits) {
  if (b->rows < 1 || b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  dlrec_status st = ws_fits(ws, be);
  if (st == DLREC_OK && ws->stage->net != n) st = dlrec_error(DLREC_ERR_INTERNAL, "a pass given another network's stage");
  if (st == DLREC_OK) st = ws_placed(n, ws);
  if (st != DLREC_OK) return st;
  int B = (int)b->rows, F = (int)n->schema.n_sparse;
  dlrec_net_profile *p = &ws->prof;
  double t = dlrec_now();
  /* On a device the dense features travel first; the bags' ids go with the bag op. */
  dlrec_batch db = *b;
  if (ws->dev_be && b->dense) {
    st = net_ws_upload(ws, ws->d_dense, b->dense, (size_t)B * n->schema.n_dense);
    db.dense = ws->d_dense;
  }
  if (st == DLREC_OK && F) st = ws->stage->ops->forward(ws->stage, ws, be, b, ws->emb, state != NULL);
  for (int c = 0; st == DLREC_OK && c < F; c++) p->lookups += b->offsets[c][B] - b->offsets[c][0];
  net_lap(&p->emb_forward, &t);
  net_io io = io_of(n, be, ws, &db, packed, state, step);
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
  const float *labels = b->labels;
  double *l = loss;
  dlrec_status st = DLREC_OK;
  if (ws->dev_be) { /* the labels there, the loss back */
    st = net_ws_upload(ws, ws->d_labels, b->labels, (size_t)B);
    labels = ws->d_labels;
    l = ws->d_loss;
  }
  if (st == DLREC_OK) st = BE_OP(n->be, bce_forward, l, logits, labels, B);
  if (st == DLREC_OK && ws->dev_be && !ws->loss_later) st = n->be->ops->download(n->be, loss, l, sizeof *loss);
  if (st == DLREC_OK) st = BE_OP(n->be, bce_backward, ws->d_logits, logits, labels, B);
  /* A part of a global batch: its gradient is its own mean's times its
   * share of the rows, as a way of split_step scales it; times the loss
   * scale (a power of two: the product is exact). */
  float factor = ws->global_rows && ws->global_rows != (uint32_t)B ? (float)B / (float)ws->global_rows : 1.0f;
  if (ws->grad_scale > 0) factor *= ws->grad_scale;
  if (st == DLREC_OK && factor != 1.0f) st = BE_OP(n->be, scale, ws->d_logits, (size_t)B, factor);
  if (st == DLREC_OK) st = BE_OP(n->be, fill_rows, ws->grad, n->plan.n_params, 1, n->plan.n_params, 0.0f);
  net_lap(&p->other, &t);
  dlrec_batch db = *b; /* on a device, the dense features net_run_forward copied there */
  if (ws->dev_be && b->dense) db.dense = ws->d_dense;
  net_io io = io_of(n, n->be, ws, &db, NULL, n->params, step);
  if (st == DLREC_OK) st = n->type->backward(n->ctx, ws->model_ws, &io, ws->d_logits, ws->grad, ws->d_emb);
  p->backward_rows += (uint64_t)B;
  return st;
}

/* ---- split training steps ------------------------------------------------------------ */

/* Whether the model's pass sums across the ways (net_allreduce): it has
 * buffers, i.e. batch normalization. */
static int needs_sync(const dlrec_net *n) { return n->plan.n_params > n->plan.n_trainable; }

int dlrec_net_has_batchnorm(const dlrec_net *n) { return needs_sync(n); }

/* The output width of the plan's widest linear layer: what batch
 * normalization's scratch is sized by (4 doubles a column of work, 2 of slot). */
static size_t widest_linear(const dlrec_net *n) {
  size_t widest = 1;
  for (uint32_t l = 0; l < n->plan.n_linear; l++)
    if (n->plan.linear[l].out > widest) widest = n->plan.linear[l].out;
  return widest;
}

static dlrec_status ways_create(const dlrec_net *n, dlrec_net_ws *ws, uint32_t T) {
  uint32_t rows = (ws->max_batch + T - 1) / T;
  ws->ways = calloc(T, sizeof *ws->ways);
  if (!ws->ways) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  ws->n_ways = T;
  ws->ways_be = n->be;
  for (uint32_t i = 0; i < T; i++) {
    net_way *way = &ws->ways[i];
    dlrec_status s = backend_lane_create(n->be, &way->lane);
    if (s == DLREC_OK) s = n->type->ws_create(n->ctx, &n->plan, rows, NULL, &way->model_ws);
    if (s != DLREC_OK) {
      net_ways_free(ws);
      return s;
    }
    way->grad = calloc(n->plan.n_params ? n->plan.n_params : 1, sizeof(float)); /* zero between steps */
    way->d_logits = malloc(rows * sizeof(float));
    if (!way->grad || !way->d_logits) {
      net_ways_free(ws);
      return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the split step's workspaces");
    }
  }
  if (!needs_sync(n)) return DLREC_OK;
  /* Batch normalization sums its statistics across the ways: scratch and a
   * slot per way, sized by the widest layer it could normalize. */
  const size_t widest = widest_linear(n);
  ws->slots = calloc(T, sizeof *ws->slots);
  for (uint32_t i = 0; ws->slots && i < T; i++) {
    net_way *way = &ws->ways[i];
    way->split = (net_split){.ways = T, .way = i, .work = malloc(4 * widest * sizeof(double)), .slots = ws->slots,
                            .sync = &ws->sync};
    ws->slots[i] = malloc(2 * widest * sizeof(double));
    if (!way->split.work || !ws->slots[i]) break;
  }
  if (!ws->slots || !ws->ways[T - 1].split.work || !ws->slots[T - 1]) {
    net_ways_free(ws);
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the split step's batch-normalization scratch");
  }
  ws->sync.ways = T;
  return DLREC_OK;
}

/* The rows [r0, r1) of batch b as a batch of their own. */
static dlrec_batch sub_batch(const dlrec_batch *b, uint32_t F, uint32_t n_dense, uint32_t r0, uint32_t r1) {
  dlrec_batch s = *b;
  s.rows = r1 - r0;
  s.labels = b->labels ? b->labels + r0 : NULL;
  s.dense = b->dense ? b->dense + (size_t)r0 * n_dense : NULL;
  for (uint32_t c = 0; c < F; c++) s.offsets[c] = b->offsets[c] + r0;
  return s;
}

/* The ways a step splits: the backend's (backend_split_ways), unless the
 * batch gives a way fewer than WAY_MIN_ROWS rows or the stage cannot
 * pool on lanes. */
static uint32_t split_ways(const dlrec_net *n, const dlrec_stage *stage, uint32_t B) {
  return stage->ops->splits ? net_ways_of(backend_split_ways(n->be), B) : 1;
}

/* Starts (on) or ends a training pass's shortcuts on be (dispatch.h),
 * unless dlrec_net_set_keep_operands turned them off: kept operands (the
 * pass writes no layer's input or weights between its forward and its
 * backward) and fresh gradients (the backward finds them zeroed: a split
 * step's ways are zeroed as they are summed, and run_backward fills
 * ws->grad with zeros before the model's backward). */
static void keep_operands(const dlrec_net *n, dlrec_backend *be, int on) {
  if (n->keep_off) return;
  if (be->ops->keep_operands) be->ops->keep_operands(be, on);
  if (be->ops->fresh_gradients) be->ops->fresh_gradients(be, on);
}

/* One way of a split step: rows [r0, r1) of b through the whole network on
 * the way's lane; its loss sum into *part. */
static dlrec_status split_way(dlrec_net *n, dlrec_net_ws *ws, net_way *way, const dlrec_batch *b, uint32_t r0,
                              uint32_t r1, uint64_t step, int sync, float *prob, double *part) {
  const uint32_t B = b->rows, F = n->schema.n_sparse, D = n->plan.emb_dim, nd = n->schema.n_dense;
  /* A part of a global batch (dlrec_net_train_pass) scales by its share of
   * the global batch, and its rows' dropout masks are the global rows'. */
  const uint32_t G = ws->global_rows ? ws->global_rows : B;
  const int rows = (int)(r1 - r0);
  dlrec_backend *lane = way->lane;
  dlrec_batch sb = sub_batch(b, F, nd, r0, r1);
  float *emb = ws->emb + (size_t)r0 * F * D, *d_emb = ws->d_emb + (size_t)r0 * F * D;
  const float *logits = NULL;
  double l = 0, t1 = dlrec_now();
  dlrec_status s1 = F ? ws->stage->ops->forward(ws->stage, ws, lane, &sb, emb, 1) : DLREC_OK;
  net_lap(&way->prof.emb_forward, &t1);
  net_io io = {.be = lane, .B = rows, .dense = sb.dense, .emb = emb, .params = n->params, .plan = &n->plan,
               .prof = &way->prof, .train = 1, .step = step, .row0 = ws->row_base + r0, .state = n->params,
               .split = sync ? &way->split : NULL};
  way->split.rows = B;
  keep_operands(n, lane, 1);
  if (s1 == DLREC_OK) s1 = n->type->forward(n->ctx, way->model_ws, &io, &logits);
  if (s1 == DLREC_OK && prob) s1 = BE_OP(lane, sigmoid, prob + r0, logits, (size_t)rows);
  if (s1 == DLREC_OK) s1 = BE_OP(lane, bce_forward, &l, logits, sb.labels, rows);
  if (s1 == DLREC_OK) s1 = BE_OP(lane, bce_backward, way->d_logits, logits, sb.labels, rows);
  /* The loss is the whole batch's mean: each way's gradient is its own
   * mean's times its share of the rows (times the loss scale). */
  const float share = (float)rows / (float)G * (ws->grad_scale > 0 ? ws->grad_scale : 1.0f);
  if (s1 == DLREC_OK) s1 = BE_OP(lane, scale, way->d_logits, (size_t)rows, share);
  if (s1 == DLREC_OK) s1 = n->type->backward(n->ctx, way->model_ws, &io, way->d_logits, way->grad, d_emb);
  keep_operands(n, lane, 0);
  *part = l * rows;
  return s1;
}

/* Every thread's slice [j0, j1) of the dense gradients summed over the
 * ways, in way order, zeroing the ways' slices as it goes, so that
 * the next step's backward finds them zeroed without a pass of its own. */
static void sum_ways(dlrec_net_ws *ws, uint32_t T, size_t j0, size_t j1) {
  float *restrict out = ws->grad;
  float *restrict g0 = ws->ways[0].grad;
  for (size_t j = j0; j < j1; j++) {
    out[j] = g0[j];
    g0[j] = 0.0f;
  }
  for (uint32_t k = 1; k < T; k++) {
    float *restrict gk = ws->ways[k].grad;
    for (size_t j = j0; j < j1; j++) {
      out[j] += gk[j];
      gk[j] = 0.0f;
    }
  }
}

/* The ways ran side by side: way 0's phases stand for the step's, and
 * the rest of the region (the loss, the gradients' sum) counts as other. */
static void split_profile(const dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, uint32_t T, double t) {
  const uint32_t B = b->rows;
  dlrec_net_profile *p = &ws->prof, *p0 = &ws->ways[0].prof;
  for (uint32_t c = 0; c < n->schema.n_sparse; c++) p->lookups += b->offsets[c][B] - b->offsets[c][0];
  p->forward_rows += B;
  p->backward_rows += B;
  const double region = dlrec_now() - t, inner = p0->emb_forward + p0->mlp + p0->interaction;
  p->emb_forward += p0->emb_forward;
  p->mlp += p0->mlp;
  p->interaction += p0->interaction;
  p->other += region > inner ? region - inner : 0;
  for (uint32_t i = 0; i < T; i++) {
    p->mlp_flops += ws->ways[i].prof.mlp_flops;
    memset(&ws->ways[i].prof, 0, sizeof ws->ways[i].prof);
  }
}

/* The forward, loss and backward of a training step with the batch split
 * into T contiguous row ranges, one per thread, each through the whole
 * network on one thread; then every thread sums its slice of the dense
 * gradients over the ways, in way order. One parallel region instead of
 * one per kernel: at small batches waking the team for each kernel cost
 * more than the kernels. Results are bitwise reproducible for a given T. */
static dlrec_status split_step(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *b, uint64_t step, uint32_t T,
                               double *loss_sum, float *prob, int *whole) {
  if (b->rows > ws->max_batch)
    return dlrec_error(DLREC_ERR_INVALID, "batch of %u rows, the workspace holds 1 to %u", b->rows, ws->max_batch);
  if (!b->labels) return dlrec_error(DLREC_ERR_INVALID, "training needs labeled data");
  dlrec_status s = DLREC_OK;
  if (ws->n_ways != T || ws->ways_be != n->be) {
    net_ways_free(ws);
    if ((s = ways_create(n, ws, T)) != DLREC_OK) return s;
  }
  const uint32_t B = b->rows;
  const size_t n_params = n->plan.n_params;
  dlrec_status st[MAX_WAYS];
  double part[MAX_WAYS];
  char msg[MAX_WAYS][256];
  const int sync = needs_sync(n);
  *whole = 0; /* set when the team came smaller than the ways that must meet: the caller runs the step whole */
  atomic_store(&ws->sync.arrived, 0);
  atomic_store(&ws->sync.failed, 0);
  double t = dlrec_now();
#pragma omp parallel num_threads(T)
  {
    /* A team smaller than asked for (OMP_DYNAMIC, a thread limit) runs
     * several ways per thread: the ways, not the team, fix the bits.
     * Ways that meet (batch normalization) need one thread each. */
    const uint32_t tid = (uint32_t)omp_get_thread_num(), nth = (uint32_t)omp_get_num_threads();
    if (sync && nth != T && tid == 0) *whole = 1;
    for (uint32_t i = tid; i < T && !(sync && nth != T); i += nth) {
      const uint32_t r0 = (uint32_t)((uint64_t)B * i / T), r1 = (uint32_t)((uint64_t)B * (i + 1) / T);
      st[i] = split_way(n, ws, &ws->ways[i], b, r0, r1, step, sync, prob, &part[i]);
      if (st[i] != DLREC_OK) {
        snprintf(msg[i], sizeof msg[i], "%s", dlrec_last_error());
        atomic_store(&ws->sync.failed, 1); /* releases the ways waiting for this one */
      }
    }
#pragma omp barrier
    sum_ways(ws, T, n_params * tid / nth, n_params * (tid + 1) / nth);
  }
  if (*whole) return DLREC_OK;
  double sum = 0;
  for (uint32_t i = 0; i < T; i++) {
    if (st[i] != DLREC_OK) return dlrec_error(st[i], "%s", msg[i]);
    sum += part[i];
  }
  *loss_sum = sum;
  split_profile(n, ws, b, T, t);
  return DLREC_OK;
}

/* ---- training passes -------------------------------------------------------- */

/* The forward, loss and backward of a training step, split T ways across
 * the threads (split_ways) or whole (T = 1): the dense gradients in
 * ws->grad, d_emb, and the loss: the batch's mean into *loss, or the sum
 * over its rows into *loss_sum. */
static dlrec_status step_pass(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, uint64_t step, uint32_t T,
                              double *loss, double *loss_sum, float *prob) {
  int whole = 0;
  double sum = 0, mean = 0;
  dlrec_status st = DLREC_OK;
  if (T > 1) st = split_step(n, ws, batch, step, T, &sum, prob, &whole);
  if (whole) T = 1; /* the ways that must meet had no thread each */
  ws->last_split = T;
  if (T > 1) mean = sum / batch->rows;
  if (T == 1) {
    const float *logits = NULL;
    keep_operands(n, n->be, 1);
    st = net_run_forward(n, n->be, ws, batch, NULL, n->params, step, &logits);
    if (st == DLREC_OK && prob) st = net_scores_out(n->be, ws, prob, logits, batch->rows);
    if (st == DLREC_OK) st = run_backward(n, ws, batch, logits, step, &mean);
    keep_operands(n, n->be, 0);
    sum = mean * batch->rows;
  }
  if (loss) *loss = mean;
  if (loss_sum) *loss_sum = sum;
  return st;
}

/* The one way's batch normalization scratch and slot of a part that sums
 * across processes, sized as a split step's (ways_create). */
static dlrec_status part_scratch(const dlrec_net *n, dlrec_net_ws *ws) {
  if (ws->part_work) return DLREC_OK;
  const size_t widest = widest_linear(n);
  ws->part_work = malloc(4 * widest * sizeof(double));
  ws->part_slot = malloc(2 * widest * sizeof(double));
  if (!ws->part_work || !ws->part_slot)
    return dlrec_error(DLREC_ERR_NOMEM, "cannot allocate the batch normalization's scratch");
  return DLREC_OK;
}

dlrec_status dlrec_net_train_pass(dlrec_net *n, dlrec_net_ws *ws, dlrec_stage *stage, const dlrec_batch *batch,
                                  const dlrec_pass_opts *o, double *loss, double *loss_sum) {
  *loss = *loss_sum = 0;
  const uint32_t G = o->global_rows;
  const int part = G != 0; /* a part of a global batch (across ranks) */
  if (part) {
    dlrec_status refused = net_ws_device_refuses(ws, "training across ranks");
    if (refused != DLREC_OK) return refused;
    if (batch->rows > G || (uint64_t)o->row_base + batch->rows > G)
      return dlrec_error(DLREC_ERR_INVALID, "train_pass: rows [%u, %u) outside a global batch of %u", o->row_base,
                         o->row_base + batch->rows, G);
  }
  const int sync = needs_sync(n) && o->sum;
  if (sync) {
    dlrec_status s = part_scratch(n, ws);
    if (s != DLREC_OK) return s;
  }
  if (part && batch->rows == 0) {
    /* A part with no rows adds nothing; with batch normalization the other
     * parts would wait for its sums, so the caller must not get here. */
    memset(ws->grad, 0, n->plan.n_params * sizeof(float));
    return sync ? dlrec_error(DLREC_ERR_INTERNAL, "train_pass: a part of 0 rows with batch normalization")
                : DLREC_OK;
  }
  ws->stage = stage ? stage : dlrec_net_stage(n);
  ws->row_base = o->row_base;
  ws->global_rows = G;
  ws->grad_scale = o->grad_scale;
  ws->loss_later = o->loss_later;
  if (sync) {
    ws->part_split = (net_split){.ways = 1, .way = 0, .rows = G, .work = ws->part_work, .slots = &ws->part_slot,
                                 .sync = &ws->sync, .sum = o->sum, .sum_ctx = o->sum_ctx};
    ws->pass_split = &ws->part_split;
  }
  /* With sums across the parts the pass runs whole: its one way meets the
   * other parts' through ws->pass_split. */
  const uint32_t T = sync ? 1 : split_ways(n, ws->stage, batch->rows);
  dlrec_status st = step_pass(n, ws, batch, o->step, T, loss, loss_sum, o->prob);
  ws->pass_split = NULL;
  ws->row_base = ws->global_rows = 0;
  ws->grad_scale = 0;
  ws->loss_later = 0;
  return st;
}

dlrec_status dlrec_net_gradients(dlrec_net *n, dlrec_net_ws *ws, const dlrec_batch *batch, double *loss,
                                 const float **grad, const float **d_emb) {
  const float *logits = NULL;
  dlrec_batch rb;
  dlrec_stage *s = ws->stage = dlrec_net_stage(n);
  dlrec_status st = net_ws_device_refuses(ws, "dlrec_net_gradients (host pointers)");
  if (st == DLREC_OK) st = s->ops->rows(s, ws, batch, &rb, 0);
  if (st == DLREC_OK) st = net_run_forward(n, n->be, ws, &rb, NULL, n->params, 0, &logits);
  if (st == DLREC_OK) st = run_backward(n, ws, &rb, logits, 0, loss);
  *grad = ws->grad;
  *d_emb = ws->d_emb;
  return st;
}

void dlrec_net_ws_gradients(const dlrec_net *n, dlrec_net_ws *ws, uint32_t rows, dlrec_net_grads *g) {
  *g = (dlrec_net_grads){.dense = ws->grad, .n_dense = n->plan.n_trainable, .emb = ws->d_emb,
                         .n_emb = (size_t)rows * n->schema.n_sparse * n->plan.emb_dim,
                         .device = ws->dev_be != NULL};
}
