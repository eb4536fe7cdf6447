/* ONNX export of a network (dlrec_net_export_onnx, model/model.h): the
 * generic part (inputs, the embedding stage, the sigmoid). Each type's hook
 * (net_type.export_onnx) maps the dense features and pooled embeddings to
 * the logits, as its forward does, with the exports of the blocks it is
 * built of (nn/block.h: linear layers, the MLP, the dense term, the FM
 * split and terms); the export test scores the graph with onnxruntime
 * against `dlrec predict`.
 *
 * The graph's inputs:
 *   dense (N, n_dense) float32: the dense features as the .dlr file holds
 *         them (after the ETL's transform); absent without dense columns;
 *   ids   (N, S) int64: each categorical column's ids in the fused table
 *         (the .dlr file's ids), the columns in schema order, a one-hot
 *         column one slot and a multi-hot column max_hotness slots, unused
 *         slots -1; an id outside the table (-1 or any other) pools as a
 *         zero row; absent without categorical columns.
 * N may be 0 (every node is defined for an empty batch).
 * Outputs: prob (N, 1), the click probability, and logit (N, 1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed/embed.h"
#include "model/model_type.h"
#include "core/onnx.h"

/* The rows of the table as float32, D of each row's stride, and after them
 * one zero row (row `rows`), the row every id outside the table reads. */
typedef struct table_rows {
  const dlrec_table *t;
  float *row; /* stride floats */
  uint64_t rows;
  uint32_t D;
} table_rows;

static void fill_row(void *ctx, uint64_t r, float *out) {
  table_rows *tr = ctx;
  if (r == tr->rows) {
    memset(out, 0, tr->D * sizeof(float));
    return;
  }
  dlrec_table_get_row(tr->t, r, tr->row);
  memcpy(out, tr->row, tr->D * sizeof(float));
}

/* The pooled embeddings (N, F, D) from the ids input. Every id outside
 * [0, table_rows) gathers the zero row: the padding -1 of a multi-hot
 * column's unused slots, and any other negative or too large id (a bare
 * Gather would wrap a negative id to a row counted from the end and refuse
 * a too large one). Each column's slots are summed, and a mean column
 * divided by its count of ids in the table (an empty bag pools to zeros,
 * as src/backend/cpu/bag.c). */
static const char *embedding_stage(const dlrec_net *n, onnx_graph *g, const char *ids) {
  const dlrec_schema *sc = &n->schema;
  const uint32_t D = n->plan.emb_dim;
  const int64_t R = (int64_t)sc->table_rows;
  table_rows tr = {.t = n->table, .rows = sc->table_rows, .D = D,
                   .row = malloc(dlrec_table_stride(n->table) * sizeof(float))};
  if (!tr.row) return NULL;
  const char *table = onnx_const_rows(g, "table", sc->table_rows + 1, D, fill_row, &tr); /* (R + 1, D) */
  free(tr.row);
  const char *valid = onnx_op2(g, "And", onnx_op2(g, "GreaterOrEqual", ids, onnx_i64s(g, (const int64_t[]){0}, 1)),
                               onnx_op2(g, "Less", ids, onnx_i64s(g, &R, 1))); /* (N, S) */
  const char *where_in[] = {valid, ids, onnx_i64s(g, &R, 1)};
  const char *safe = onnx_node(g, "Where", NULL, where_in, 3, NULL, 0, NULL);
  const char *rows = onnx_op2(g, "Gather", table, safe); /* (N, S, D) */
  int one_hot = 1;
  for (uint32_t c = 0; c < sc->n_sparse; c++) one_hot &= sc->sparse[c].hotness == 1;
  if (one_hot) return rows; /* S = F */
  const onnx_attr to_float[] = {ONNX_INT("to", 1)};
  const char *mf = onnx_node(g, "Cast", NULL, &valid, 1, to_float, 1, NULL);
  mf = onnx_op2(g, "Unsqueeze", mf, onnx_i64s(g, (const int64_t[]){2}, 1)); /* (N, S, 1) */
  const char **cols = malloc(sc->n_sparse * sizeof *cols);
  if (!cols) return NULL;
  uint64_t s0 = 0;
  for (uint32_t c = 0; c < sc->n_sparse; c++) {
    const uint64_t H = sc->sparse[c].max_hotness ? sc->sparse[c].max_hotness : 1;
    const char *x = onnx_reduce_sum(g, onnx_slice(g, rows, 1, (int64_t)s0, (int64_t)(s0 + H)), 1, 1);
    if (n->mean_cols[c] || n->plan.pooling == DLREC_POOLING_MEAN) {
      const char *k = onnx_reduce_sum(g, onnx_slice(g, mf, 1, (int64_t)s0, (int64_t)(s0 + H)), 1, 1);
      x = onnx_op2(g, "Div", x, onnx_op2(g, "Max", k, onnx_scalar_f32(g, 1.0f)));
    }
    cols[c] = x;
    s0 += H;
  }
  const char *emb = onnx_concat(g, cols, (int)sc->n_sparse, 1);
  free(cols);
  return emb;
}

dlrec_status dlrec_net_export_onnx(const dlrec_net *n, const char *path) {
  const dlrec_schema *sc = &n->schema;
  if (!n->type->export_onnx)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "model type '%s' has no ONNX export", n->type->name);
  if (sc->keys)
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "ONNX export: this model reads raw keys through a hash table (storage.kind \"hash\"), "
                       "which an ONNX graph cannot look up; export a model trained on an ETL vocabulary");
  const uint64_t table_bytes = (sc->table_rows + 1) * (uint64_t)n->plan.emb_dim * sizeof(float);
  if (sc->n_sparse && table_bytes > ((uint64_t)1 << 31) - ((uint64_t)64 << 20))
    return dlrec_error(DLREC_ERR_UNSUPPORTED,
                       "ONNX export: the embedding table is %.2f GB as float32, over protobuf's 2 GB limit on "
                       "one ONNX file (external data is not written yet)",
                       (double)table_bytes / 1e9);
  onnx_graph *g = onnx_graph_create(n->type->name);
  if (!g) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  const char *dense = NULL, *emb = NULL;
  if (sc->n_dense) {
    const int64_t d[2] = {-1, sc->n_dense};
    onnx_input(g, "dense", 1, d, 2, "dense features as in the .dlr file (after the ETL transform)");
    dense = "dense";
  }
  uint64_t S = 0;
  for (uint32_t c = 0; c < sc->n_sparse; c++) S += sc->sparse[c].max_hotness ? sc->sparse[c].max_hotness : 1;
  if (sc->n_sparse) {
    const int64_t d[2] = {-1, (int64_t)S};
    onnx_input(g, "ids", 7, d, 2,
               "each categorical column's ids in the fused table, columns in schema order, max_hotness slots "
               "per column, unused slots -1; an id outside [0, table rows) pools as a zero row");
    emb = embedding_stage(n, g, "ids");
    if (!emb) {
      onnx_graph_free(g);
      return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    }
  }
  const char *logit = n->type->export_onnx(n->ctx, &n->plan, n->params, g, dense, emb);
  const char *ident[] = {logit};
  onnx_node(g, "Identity", NULL, ident, 1, NULL, 0, "logit");
  onnx_node(g, "Sigmoid", NULL, ident, 1, NULL, 0, "prob");
  const int64_t od[2] = {-1, 1};
  onnx_output(g, "prob", 1, od, 2);
  onnx_output(g, "logit", 1, od, 2);
  char doc[256];
  snprintf(doc, sizeof doc, "dlrec %s model: inputs dense (N, %u) float32, ids (N, %llu) int64; outputs prob, logit",
           n->type->name, sc->n_dense, (unsigned long long)S);
  dlrec_status s = onnx_graph_write(g, path, doc);
  onnx_graph_free(g);
  return s;
}
