/* The concatenation of two row blocks, the input of the models whose MLP or
 * cross network reads the dense features and the embeddings side by side
 * (dcn_v2's x0, wide_deep's and deepfm's MLP input, dnn's): each row of out
 * is a row of a followed by the same row of b. Rows are copied by the
 * backend's copy_rows, each on its own, so the result does not depend on
 * the batch. */
#include "backend/dispatch.h"
#include "core/onnx.h"
#include "nn/block.h"

dlrec_status net_concat_forward(dlrec_backend *be, float *out, const float *a, size_t na, const float *b, size_t nb,
                                size_t rows) {
  const size_t n = na + nb;
  dlrec_status s = na ? BE_OP(be, copy_rows, out, n, a, na, rows, na) : DLREC_OK;
  return s == DLREC_OK && nb ? BE_OP(be, copy_rows, out + na, n, b, nb, rows, nb) : s;
}

dlrec_status net_concat_backward(dlrec_backend *be, float *db, const float *dout, size_t na, size_t nb, size_t rows) {
  return nb ? BE_OP(be, copy_rows, db, nb, dout + na, na + nb, rows, nb) : DLREC_OK;
}

const char *net_concat_export(onnx_graph *g, const char *a, const char *b) {
  const char *parts[2] = {a, b ? onnx_flatten(g, b) : NULL};
  return a && b ? onnx_concat(g, parts, 2, 1) : a ? a : parts[1];
}
