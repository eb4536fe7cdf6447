/* The embedding rows of the models with a first-order term per id (fm,
 * wide_deep, deepfm): D + 1 wide, the first D coordinates an id's factors,
 * the last its first-order weight, so that one lookup fetches both and one
 * sparse optimizer state per row serves both. The generic stage pools these
 * rows into emb (B, F, D + 1); the models split each pooled row into its
 * factors and its weight for the blocks of src/nn, and join the two
 * gradients back into d_emb.
 */
#include "backend/dispatch.h"
#include "core/onnx.h"
#include "nn/block.h"

/* One more coordinate holds the first-order weight. */
dlrec_status net_fm_config_dim(const cJSON *o, const char *what, uint32_t *emb_dim) {
  return net_config_u32(o, "embedding_dim", what, 1, DLREC_EMBED_MAX_DIM - 1, emb_dim);
}

dlrec_status net_fm_split(dlrec_backend *be, float *v, float *w, const float *emb, size_t n, uint32_t D) {
  dlrec_status s = BE_OP(be, copy_rows, v, D, emb, (size_t)D + 1, n, D);
  return s == DLREC_OK ? BE_OP(be, copy_rows, w, 1, emb + D, (size_t)D + 1, n, 1) : s;
}

dlrec_status net_fm_join(dlrec_backend *be, float *d_emb, const float *dv, size_t dv_stride, const float *dv2,
                         const float *dw, float *tmp, int B, int F, uint32_t D) {
  const size_t FD = (size_t)F * D, BF = (size_t)B * F;
  dlrec_status s = DLREC_OK;
  const float *a = dv;
  if (dv_stride != FD || dv2) {
    /* The factors' gradient gathered into one (B, F·D) block, dv2 added. */
    s = BE_OP(be, copy_rows, tmp, FD, dv, dv_stride, (size_t)B, FD);
    if (s == DLREC_OK && dv2) s = BE_OP(be, add, tmp, dv2, BF * D);
    a = tmp;
  }
  if (s == DLREC_OK) s = BE_OP(be, copy_rows, d_emb, (size_t)D + 1, a, D, BF, D);
  if (s == DLREC_OK) s = BE_OP(be, copy_rows, d_emb + D, (size_t)D + 1, dw, 1, BF, 1);
  return s;
}

void net_fm_split_export(onnx_graph *g, const char *emb, uint32_t D, const char **v, const char **w) {
  *v = onnx_slice(g, emb, 2, 0, D);
  *w = onnx_slice(g, emb, 2, D, D + 1);
}

const char *net_wide_export(onnx_graph *g, const char *w) {
  return onnx_reduce_sum(g, onnx_flatten(g, w), 1, 1);
}

const char *net_fm_export(onnx_graph *g, const char *v) {
  /* Σ_{f<g} <v_f, v_g> = ½ Σ_d ((Σ_f v_fd)² − Σ_f v_fd²), as src/backend/cpu/fm.c. */
  const char *s = onnx_reduce_sum(g, v, 1, 0);
  const char *q = onnx_reduce_sum(g, onnx_op2(g, "Mul", v, v), 1, 0);
  const char *diff = onnx_op2(g, "Sub", onnx_op2(g, "Mul", s, s), q);
  return onnx_op2(g, "Mul", onnx_reduce_sum(g, diff, 1, 1), onnx_scalar_f32(g, 0.5f));
}
