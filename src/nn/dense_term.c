/* The first-order term on the dense features that lr, fm, wide_deep and
 * deepfm share: a linear layer (n_dense -> 1) when the
 * data has dense columns, else a lone bias, so that a model over
 * categorical columns alone still has its intercept. */
#include <math.h>

#include "core/rng.h"
#include "backend/dispatch.h"
#include "core/onnx.h"
#include "nn/block.h"

dlrec_status net_dense_term_plan(net_dense_term *t, net_plan *p, uint32_t n_dense) {
  t->n_dense = n_dense;
  if (!n_dense) return net_plan_tensor(p, "bias", 1, 0, &t->bias);
  dlrec_status st = net_plan_linear(p, "linear", n_dense, 1, &t->linear);
  if (st == DLREC_OK) t->L = p->linear[t->linear];
  return st;
}

/* The weights normal with std sqrt(2 / (n_dense + 1)) (Xavier, as DLRM's
 * layers), the bias zero. */
void net_dense_term_init(const net_dense_term *t, float *params, uint64_t seed, uint64_t stream) {
  if (!t->n_dense) {
    params[t->bias] = 0;
    return;
  }
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, stream);
  double std = sqrt(2.0 / (t->n_dense + 1));
  for (uint32_t i = 0; i < t->n_dense; i++) params[t->L.w + i] = (float)(std * dlrec_rng_normal(&r));
  params[t->L.b] = 0;
}

dlrec_status net_dense_term_forward(const net_dense_term *t, const net_io *io, float *out) {
  if (!t->n_dense) /* the bias, broadcast (src_ld 0) */
    return BE_OP(io->be, copy_rows, out, 1, io->params + t->bias, 0, (size_t)io->B, 1);
  io->prof->mlp_flops += 2.0 * io->B * t->n_dense;
  return net_linear_forward(io, t->linear, out, io->dense, 0);
}

dlrec_status net_dense_term_backward(const net_dense_term *t, const net_io *io, const float *d_out, float *g) {
  if (!t->n_dense) /* the bias's gradient: the sum in double, in order */
    return BE_OP(io->be, sum_columns, g + t->bias, d_out, (size_t)io->B, 1);
  io->prof->mlp_flops += 2.0 * io->B * t->n_dense;
  return BE_OP(io->be, linear_backward, NULL, g + t->L.w, g + t->L.b, d_out, io->dense, io->params + t->L.w, io->B,
               (int)t->n_dense, 1);
}

const char *net_dense_term_export(const net_dense_term *t, const net_plan *p, const float *params, onnx_graph *g,
                                  const char *dense) {
  if (t->n_dense) return net_onnx_linear(g, p, params, t->linear, dense, 0);
  const int64_t d[2] = {1, 1};
  return onnx_const_f32(g, "bias", params + t->bias, d, 2);
}
