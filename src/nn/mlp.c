/* The MLP the model types share (Wide&Deep's and DeepFM's deep part,
 * DCN-v2's deep network): hidden layers Linear -> [BatchNorm] -> ReLU ->
 * [Dropout], as FuxiCTR's MLP_Block orders them, then optionally an output
 * layer (Linear alone).
 *
 * Each Linear runs through net_linear_forward, so scoring uses the packed
 * batch-invariant kernel; batch normalization scores with its running
 * statistics, elementwise, and dropout is off when scoring: a row's score
 * keeps the same bits in any batch. In training, dropout's mask is a pure
 * function of (the layer, the step, the element), so the backward
 * recomputes it and a resumed run draws the same masks as an uninterrupted
 * one. The running statistics are plan buffers (checkpointed, never
 * optimized) that the training forward moves.
 *
 * A training batch of one row has no variance; batch normalization then
 * normalizes it with the running statistics (as scoring does) and the
 * backward runs through that affine map only.
 *
 * Per hidden layer l the workspace holds z_l (the Linear's output, only
 * with batch normalization) and a_l (the layer's output, the next one's
 * input), and the batch statistics saved for the backward.
 */
#include <stdio.h>
#include <string.h>

#include "backend/dispatch.h"
#include "core/json.h"
#include "core/onnx.h"
#include "nn/block.h"

#define BN_MOMENTUM 0.1f /* PyTorch's BatchNorm1d defaults */
#define BN_EPS 1e-5f

dlrec_status net_mlp_config_parse(net_mlp_config *c, const cJSON *o, const char *what) {
  dlrec_status s = net_config_widths(o, "mlp", what, 0, DLREC_MLP_MAX_LAYERS - 1, &c->n_hidden, c->hidden);
  if (s == DLREC_OK) s = net_config_rate(o, "dropout", what, &c->dropout);
  return s == DLREC_OK ? dlrec_json_get_bool_or(o, "batch_norm", what, c->batch_norm, &c->batch_norm) : s;
}

void net_mlp_config_to_json(const net_mlp_config *c, cJSON *o) {
  cJSON_AddItemToObject(o, "mlp", net_widths_json(c->hidden, c->n_hidden));
  cJSON_AddNumberToObject(o, "dropout", c->dropout);
  cJSON_AddBoolToObject(o, "batch_norm", c->batch_norm);
}

dlrec_status net_mlp_plan(net_mlp *m, net_plan *p, const char *prefix, uint32_t in, const net_mlp_config *c,
                          int output) {
  memset(m, 0, sizeof *m);
  const uint32_t most = DLREC_MLP_MAX_LAYERS - (output ? 1u : 0u);
  if (c->n_hidden > most)
    return dlrec_error(DLREC_ERR_INVALID, "%s MLP: %u hidden layers, at most %u", prefix, c->n_hidden, most);
  if (!(c->dropout >= 0.0f && c->dropout < 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "%s MLP: dropout %g out of range [0, 1)", prefix, (double)c->dropout);
  m->in = in;
  m->n_hidden = c->n_hidden;
  m->output = output;
  m->dropout = c->dropout;
  m->bn = c->batch_norm;
  uint32_t width = in;
  dlrec_status s = DLREC_OK;
  for (uint32_t l = 0; s == DLREC_OK && l < c->n_hidden + (output ? 1u : 0u); l++) {
    int hidden = l < c->n_hidden;
    uint32_t out = hidden ? c->hidden[l] : 1;
    if (out < 1 || out > 65536)
      return dlrec_error(DLREC_ERR_INVALID, "%s MLP: layer %u width %u out of range [1, 65536]", prefix, l, out);
    char name[DLREC_NET_TENSOR_NAME];
    snprintf(name, sizeof name, "%s.%u", prefix, l);
    s = net_plan_linear(p, name, width, out, &m->lin[l]);
    if (s == DLREC_OK) m->L[l] = p->linear[m->lin[l]];
    if (s == DLREC_OK && hidden && m->bn) {
      char t[DLREC_NET_TENSOR_NAME + 24];
      snprintf(t, sizeof t, "%s.%u.bn.weight", prefix, l);
      s = net_plan_tensor(p, t, out, 0, &m->gamma[l]);
      snprintf(t, sizeof t, "%s.%u.bn.bias", prefix, l);
      if (s == DLREC_OK) s = net_plan_tensor(p, t, out, 0, &m->beta[l]);
      snprintf(t, sizeof t, "%s.%u.bn.running_mean", prefix, l);
      if (s == DLREC_OK) s = net_plan_buffer(p, t, out, &m->rmean[l]);
      snprintf(t, sizeof t, "%s.%u.bn.running_var", prefix, l);
      if (s == DLREC_OK) s = net_plan_buffer(p, t, out, &m->rvar[l]);
    }
    width = out;
  }
  m->out = width;
  return s;
}

uint32_t net_mlp_n_layers(const net_mlp *m) { return m->n_hidden + (m->output ? 1u : 0u); }

/* Linear layers as net_init_linear says; batch normalization's weight 1,
 * bias 0, running mean 0 and variance 1, as PyTorch starts them. */
void net_mlp_init(const net_mlp *m, const net_plan *p, float *params, uint64_t seed, uint64_t stream0) {
  for (uint32_t l = 0; l < net_mlp_n_layers(m); l++) {
    net_init_linear(&m->L[l], params, seed, stream0 + l);
    if (l < m->n_hidden && m->bn)
      for (uint32_t i = 0; i < m->L[l].out; i++) {
        params[m->gamma[l] + i] = 1.0f;
        params[m->beta[l] + i] = 0.0f;
        params[net_buffer_offset(p, m->rmean[l]) + i] = 0.0f;
        params[net_buffer_offset(p, m->rvar[l]) + i] = 1.0f;
      }
  }
}

/* Workspace layout: per hidden layer z (B·out, with bn), a (B·out) and
 * saved (2·out, with bn); the output layer's logits (B); then two gradient
 * buffers of the widest layer (B·max(in, widths)). */
size_t net_mlp_ws_floats(const net_mlp *m, uint32_t B) {
  size_t f = 0, wide = m->in;
  for (uint32_t l = 0; l < m->n_hidden; l++) {
    size_t w = m->L[l].out;
    f += (size_t)B * w * (m->bn ? 2 : 1) + (m->bn ? 2 * w : 0);
    wide = w > wide ? w : wide;
  }
  if (m->output) f += B;
  return f + 2 * (size_t)B * wide;
}

typedef struct mlp_bufs {
  float *z[DLREC_MLP_MAX_LAYERS], *a[DLREC_MLP_MAX_LAYERS], *saved[DLREC_MLP_MAX_LAYERS];
  float *logit, *g0, *g1;
} mlp_bufs;

static mlp_bufs bufs_of(const net_mlp *m, float *ws, uint32_t B) {
  mlp_bufs b;
  memset(&b, 0, sizeof b);
  size_t wide = m->in;
  for (uint32_t l = 0; l < m->n_hidden; l++) {
    size_t w = m->L[l].out;
    if (m->bn) {
      b.z[l] = ws, ws += (size_t)B * w;
      b.saved[l] = ws, ws += 2 * w;
    }
    b.a[l] = ws, ws += (size_t)B * w;
    wide = w > wide ? w : wide;
  }
  if (m->output) b.logit = ws, ws += B;
  b.g0 = ws, ws += (size_t)B * wide;
  b.g1 = ws;
  return b;
}

/* The dropout mask's seed for hidden layer l of the MLP that starts at
 * linear layer lin0 of the plan: distinct per layer of the network, and per
 * way of a split step (io->row0), whose element indices restart at 0: else
 * row r of every way would share one mask. A whole step (row0 = 0) keeps
 * the seed it always had. */
static uint64_t dropout_seed(const net_mlp *m, const net_io *io, uint32_t l) {
  return (0x9E3779B97F4A7C15ull * (uint64_t)(m->lin[0] + 1) ^ (0xD1B54A32D192ED03ull * (l + 1))) +
         0xC2B2AE3D27D4EB4Full * io->row0;
}

/* Batch normalization's training forward in one way of a split step: the
 * statistics are the whole batch's, summed across the ways (net_allreduce),
 * and the first way moves the running statistics. s is the pass's status so
 * far: after an error the ops are skipped but the ways still meet. */
static dlrec_status bn_split_forward(const net_io *io, dlrec_status s, float *out, float *saved, const float *z,
                                     const float *gamma, const float *beta, float *rmean, float *rvar, int C) {
  const net_split *sp = io->split;
  double *sum = sp->work, *sqdev = sp->work + C;
  if (s == DLREC_OK) s = BE_OP(io->be, batchnorm_stats, sum, z, NULL, 0, io->B, C);
  net_allreduce(io, sum, (size_t)C);
  if (s == DLREC_OK) s = BE_OP(io->be, batchnorm_stats, sqdev, z, sum, sp->rows, io->B, C);
  net_allreduce(io, sqdev, (size_t)C);
  const int first = sp->way == 0;
  if (s == DLREC_OK)
    s = BE_OP(io->be, batchnorm_normalize, out, saved, z, sum, sqdev, sp->rows, gamma, beta, first ? rmean : NULL,
              first ? rvar : NULL, BN_MOMENTUM, BN_EPS, io->B, C);
  return s;
}

/* Its backward, in place on d (dL/da in, dL/dz out): the sums over the
 * whole batch give d, this way's own give its dgamma and dbeta. */
static dlrec_status bn_split_backward(const net_io *io, dlrec_status s, float *d, float *dgamma, float *dbeta,
                                      const float *z, const float *gamma, const float *saved, int C) {
  const net_split *sp = io->split;
  double *sg_way = sp->work, *sgx_way = sg_way + C, *all = sgx_way + C; /* all: sg then sgx, summed */
  if (s == DLREC_OK) s = BE_OP(io->be, batchnorm_backward_stats, sg_way, sgx_way, d, z, saved, io->B, C);
  memcpy(all, sg_way, 2 * (size_t)C * sizeof(double));
  net_allreduce(io, all, 2 * (size_t)C);
  if (s == DLREC_OK)
    s = BE_OP(io->be, batchnorm_backward_apply, d, dgamma, dbeta, d, z, gamma, saved, sg_way, sgx_way, all,
              all + C, sp->rows, io->B, C);
  return s;
}

dlrec_status net_mlp_forward(const net_mlp *m, const net_io *io, float *ws, const float *in, const float **out) {
  mlp_bufs b = bufs_of(m, ws, (uint32_t)io->B);
  const float *P = io->params;
  size_t n = 0;
  dlrec_status s = DLREC_OK;
  for (uint32_t l = 0; s == DLREC_OK && l < m->n_hidden; l++) {
    int C = (int)m->L[l].out;
    n = (size_t)io->B * (size_t)C;
    if (!m->bn) {
      s = net_linear_forward(io, m->lin[l], b.a[l], in, 1);
    } else {
      const float *gamma = P + m->gamma[l], *beta = P + m->beta[l];
      size_t rm = net_buffer_offset(io->plan, m->rmean[l]), rv = net_buffer_offset(io->plan, m->rvar[l]);
      s = net_linear_forward(io, m->lin[l], b.z[l], in, 0);
      if (s == DLREC_OK && !io->train)
        s = BE_OP(io->be, batchnorm_infer, b.a[l], b.z[l], gamma, beta, P + rm, P + rv, BN_EPS, io->B, C);
      /* A batch of one row (the whole batch's, when this is a part of it)
       * has no variance: the running statistics normalize it, as in scoring. */
      else if (s == DLREC_OK && (io->split ? io->split->rows : (uint32_t)io->B) == 1)
        s = BE_OP(io->be, batchnorm_infer, b.a[l], b.z[l], gamma, beta, P + rm, P + rv, BN_EPS, io->B, C);
      else if (io->split) /* even after an error: the other ways wait in net_allreduce */
        s = bn_split_forward(io, s, b.a[l], b.saved[l], b.z[l], gamma, beta, io->state + rm, io->state + rv, C);
      else if (s == DLREC_OK)
        s = BE_OP(io->be, batchnorm_train_forward, b.a[l], b.saved[l], b.z[l], gamma, beta, io->state + rm,
                  io->state + rv, BN_MOMENTUM, BN_EPS, io->B, C);
      /* Batch normalization sits between the linear layer and its ReLU, so
       * the ReLU cannot be fused into linear_forward and runs as its own op. */
      if (s == DLREC_OK) s = BE_OP(io->be, relu_forward, b.a[l], b.a[l], n);
    }
    if (s == DLREC_OK && m->dropout > 0.0f)
      s = BE_OP(io->be, dropout_forward, b.a[l], b.a[l], n, m->dropout, dropout_seed(m, io, l), io->step, io->train);
    in = b.a[l];
    io->prof->mlp_flops += 2.0 * io->B * m->L[l].in * m->L[l].out;
  }
  if (s == DLREC_OK && m->output) {
    s = net_linear_forward(io, m->lin[m->n_hidden], b.logit, in, 0);
    io->prof->mlp_flops += 2.0 * io->B * m->L[m->n_hidden].in;
    in = b.logit;
  }
  *out = in;
  return s;
}

dlrec_status net_mlp_backward(const net_mlp *m, const net_io *io, float *ws, const float *in, const float *dout,
                              float *din, float *g) {
  mlp_bufs b = bufs_of(m, ws, (uint32_t)io->B);
  const float *P = io->params;
  int B = io->B;
  dlrec_status s = DLREC_OK;
  float *next = b.g0;
  for (int l = (int)net_mlp_n_layers(m) - 1; s == DLREC_OK && l >= 0; l--) {
    const net_linear *L = &m->L[l];
    size_t n = (size_t)B * L->out;
    const float *x = l ? b.a[l - 1] : in;
    float *dx = l ? next : din;
    /* Without batch normalization a hidden layer's ReLU was fused into its
     * linear forward, and its backward fuses the other way: one op masks
     * dout with a_l and runs the linear backward. */
    const int fused = l < (int)m->n_hidden && !m->bn;
    if (l < (int)m->n_hidden) {
      /* dout is dL/da_l: back through dropout, ReLU and batch normalization
       * to dL/dz_l, in place. a_l is the ReLU's mask (dropped elements
       * already have no gradient). */
      float *d = (float *)dout;
      if (m->dropout > 0.0f)
        s = BE_OP(io->be, dropout_backward, d, d, n, m->dropout, dropout_seed(m, io, (uint32_t)l), io->step);
      if (s == DLREC_OK && fused)
        s = BE_OP(io->be, linear_relu_backward, dx, g + L->w, g + L->b, d, b.a[l], x, P + L->w, B, (int)L->in,
                  (int)L->out);
      else if (s == DLREC_OK) s = BE_OP(io->be, relu_backward, d, d, b.a[l], n);
      if (m->bn && io->split && io->split->rows >= 2) /* even after an error: the other ways wait in net_allreduce */
        s = bn_split_backward(io, s, d, g + m->gamma[l], g + m->beta[l], b.z[l], P + m->gamma[l], b.saved[l],
                              (int)L->out);
      else if (s == DLREC_OK && m->bn && B >= 2)
        s = BE_OP(io->be, batchnorm_backward, d, g + m->gamma[l], g + m->beta[l], d, b.z[l], P + m->gamma[l],
                  b.saved[l], B, (int)L->out);
      else if (s == DLREC_OK && m->bn) /* one row, normalized by the running statistics: an affine map */
        s = BE_OP(io->be, batchnorm_infer_backward, d, g + m->gamma[l], g + m->beta[l], d, b.z[l], P + m->gamma[l],
                  P + net_buffer_offset(io->plan, m->rmean[l]), P + net_buffer_offset(io->plan, m->rvar[l]), BN_EPS,
                  B, (int)L->out);
    }
    if (s == DLREC_OK && !fused)
      s = BE_OP(io->be, linear_backward, dx, g + L->w, g + L->b, dout, x, P + L->w, B, (int)L->in, (int)L->out);
    io->prof->mlp_flops += 2.0 * B * L->in * L->out * (dx ? 2 : 1);
    dout = dx;
    next = next == b.g0 ? b.g1 : b.g0;
  }
  return s;
}

const char *net_mlp_export(const net_mlp *m, const net_plan *p, const float *params, onnx_graph *g, const char *x) {
  for (uint32_t l = 0; l < m->n_hidden; l++) {
    x = net_onnx_linear(g, p, params, m->lin[l], x, !m->bn);
    if (!m->bn) continue;
    const int64_t d[1] = {m->L[l].out};
    const char *in[] = {x, onnx_const_f32(g, "bn_gamma", params + m->gamma[l], d, 1),
                        onnx_const_f32(g, "bn_beta", params + m->beta[l], d, 1),
                        onnx_const_f32(g, "bn_mean", params + net_buffer_offset(p, m->rmean[l]), d, 1),
                        onnx_const_f32(g, "bn_var", params + net_buffer_offset(p, m->rvar[l]), d, 1)};
    const onnx_attr eps[] = {ONNX_FLOAT("epsilon", BN_EPS)};
    x = onnx_op1(g, "Relu", onnx_node(g, "BatchNormalization", "bn", in, 5, eps, 1, NULL));
  }
  return m->output ? net_onnx_linear(g, p, params, m->lin[m->n_hidden], x, 0) : x;
}
