/* A small ONNX graph builder (onnx.c) for `dlrec export --onnx`: nodes,
 * float and int64 initializers, the graph's inputs and outputs, written as
 * an ONNX ModelProto (opset 17) with a hand-rolled protobuf encoder: the
 * format is a few nested messages of varints and length-delimited fields,
 * not worth a protobuf dependency.
 *
 * Names: every function that adds a tensor returns its name, owned by the
 * graph (valid until onnx_graph_free). Errors (out of memory) are sticky:
 * the builder keeps going with placeholder names and onnx_graph_write
 * reports the first one, so exporters need not check every call.
 */
#ifndef DLREC_CORE_ONNX_H
#define DLREC_CORE_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct onnx_graph onnx_graph;

/* One attribute of a node: an int, a float or a list of ints. */
typedef struct onnx_attr {
  const char *name;
  enum { ONNX_ATTR_INT, ONNX_ATTR_FLOAT, ONNX_ATTR_INTS } type;
  int64_t i;
  float f;
  const int64_t *ints;
  int n_ints;
} onnx_attr;

#define ONNX_INT(n, v) ((onnx_attr){.name = (n), .type = ONNX_ATTR_INT, .i = (v)})
#define ONNX_FLOAT(n, v) ((onnx_attr){.name = (n), .type = ONNX_ATTR_FLOAT, .f = (v)})
#define ONNX_INTS(n, p, k) ((onnx_attr){.name = (n), .type = ONNX_ATTR_INTS, .ints = (p), .n_ints = (k)})

onnx_graph *onnx_graph_create(const char *name);
void onnx_graph_free(onnx_graph *g); /* accepts NULL */

/* A graph input or output: float32 (elem 1) or int64 (elem 7), dims of
 * which -1 is the symbolic batch dimension "N". */
void onnx_input(onnx_graph *g, const char *name, int elem, const int64_t *dims, int nd, const char *doc);
void onnx_output(onnx_graph *g, const char *name, int elem, const int64_t *dims, int nd);

/* Initializers: n = product of dims floats (or int64s), copied. */
const char *onnx_const_f32(onnx_graph *g, const char *hint, const float *data, const int64_t *dims, int nd);
const char *onnx_const_i64(onnx_graph *g, const char *hint, const int64_t *data, const int64_t *dims, int nd);
/* A float initializer whose rows come from a callback: rows x cols floats,
 * row r written by fill(ctx, r, out) (the embedding table, read row by row
 * from its store without a second copy in memory). */
const char *onnx_const_rows(onnx_graph *g, const char *hint, uint64_t rows, uint32_t cols,
                            void (*fill)(void *ctx, uint64_t r, float *out), void *ctx);
const char *onnx_scalar_f32(onnx_graph *g, float v);   /* a 0-d float */
const char *onnx_i64s(onnx_graph *g, const int64_t *v, int n); /* a 1-d int64 of n values (axes, shapes) */

/* A node of op_type with inputs (NULL entries: omitted optional inputs at
 * the end) and one output, named from hint; returns the output's name.
 * `out` (not NULL) names the output instead (the graph's outputs). */
const char *onnx_node(onnx_graph *g, const char *op, const char *hint, const char *const *in, int n_in,
                      const onnx_attr *attrs, int n_attrs, const char *out);

/* Shorthands for common nodes (one output each). */
const char *onnx_op1(onnx_graph *g, const char *op, const char *a);
const char *onnx_op2(onnx_graph *g, const char *op, const char *a, const char *b);
/* ReduceSum of x over one axis (keepdims 0 or 1). */
const char *onnx_reduce_sum(onnx_graph *g, const char *x, int64_t axis, int keepdims);
/* Concat along axis. */
const char *onnx_concat(onnx_graph *g, const char *const *xs, int n, int64_t axis);
/* x (N, d1, d2, ...) flattened to (N, d1·d2·...) by Flatten (axis 1):
 * unlike Reshape to (0, -1), whose -1 cannot be inferred from 0 elements,
 * it holds for a batch of 0 rows. */
const char *onnx_flatten(onnx_graph *g, const char *x);
/* Slice of x along one axis, [start, end). */
const char *onnx_slice(onnx_graph *g, const char *x, int64_t axis, int64_t start, int64_t end);

/* Writes the model (ir_version 8, opset 17) to path atomically; the first
 * error the builder met, if any, instead. */
dlrec_status onnx_graph_write(onnx_graph *g, const char *path, const char *doc);

#endif
