/* The ONNX graph builder (onnx.h) and its protobuf encoding. Field numbers
 * are onnx.proto's (ONNX 1.14): ModelProto, GraphProto, NodeProto,
 * AttributeProto, TensorProto, ValueInfoProto, TypeProto. Repeated fields
 * of a message may come in any order on the wire, so the graph keeps its
 * nodes, initializers, inputs and outputs in four buffers, each already
 * encoded as fields of GraphProto, and the file is their concatenation
 * inside the ModelProto. */
#include "core/onnx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- protobuf ------------------------------------------------------------------- */

typedef struct pbuf {
  uint8_t *p;
  size_t n, cap;
  int oom;
} pbuf;

static void pb_raw(pbuf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void pb_varint(pbuf *b, uint64_t v) {
  uint8_t t[10];
  size_t n = 0;
  while (v >= 0x80) t[n++] = (uint8_t)(v | 0x80), v >>= 7;
  t[n++] = (uint8_t)v;
  pb_raw(b, t, n);
}

static void pb_tag(pbuf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }
static void pb_int(pbuf *b, int field, int64_t v) {
  pb_tag(b, field, 0);
  pb_varint(b, (uint64_t)v);
}
static void pb_bytes(pbuf *b, int field, const void *data, size_t n) {
  pb_tag(b, field, 2);
  pb_varint(b, n);
  pb_raw(b, data, n);
}
static void pb_str(pbuf *b, int field, const char *s) { pb_bytes(b, field, s, strlen(s)); }
static void pb_msg(pbuf *b, int field, const pbuf *m) {
  if (m->oom) b->oom = 1;
  pb_bytes(b, field, m->p, m->n);
}
static void pb_float(pbuf *b, int field, float f) {
  pb_tag(b, field, 5);
  uint8_t t[4];
  uint32_t u;
  memcpy(&u, &f, 4);
  for (int i = 0; i < 4; i++) t[i] = (uint8_t)(u >> (8 * i)); /* little-endian on the wire */
  pb_raw(b, t, 4);
}

/* ---- the graph ------------------------------------------------------------------- */

struct onnx_graph {
  char name[128];
  pbuf nodes, inits, inputs, outputs;
  char **names;
  size_t n_names, cap_names;
  unsigned counter;
  int oom;
};

onnx_graph *onnx_graph_create(const char *name) {
  onnx_graph *g = calloc(1, sizeof *g);
  if (g) snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

void onnx_graph_free(onnx_graph *g) {
  if (!g) return;
  free(g->nodes.p);
  free(g->inits.p);
  free(g->inputs.p);
  free(g->outputs.p);
  for (size_t i = 0; i < g->n_names; i++) free(g->names[i]);
  free(g->names);
  free(g);
}

/* A name the graph owns: hint itself when exact, else hint_N. */
static const char *keep_name(onnx_graph *g, const char *hint, int exact) {
  char buf[256];
  if (exact)
    snprintf(buf, sizeof buf, "%s", hint);
  else
    snprintf(buf, sizeof buf, "%s_%u", hint, g->counter++);
  if (g->n_names == g->cap_names) {
    size_t cap = g->cap_names ? 2 * g->cap_names : 64;
    char **p = realloc(g->names, cap * sizeof *p);
    if (!p) {
      g->oom = 1;
      return "oom";
    }
    g->names = p;
    g->cap_names = cap;
  }
  char *s = strdup(buf);
  if (!s) {
    g->oom = 1;
    return "oom";
  }
  g->names[g->n_names++] = s;
  return s;
}

/* TensorProto header fields: dims (1), data_type (2), name (8). */
static void tensor_head(pbuf *t, const char *name, int elem, const int64_t *dims, int nd) {
  for (int i = 0; i < nd; i++) pb_int(t, 1, dims[i]);
  pb_int(t, 2, elem);
  pb_str(t, 8, name);
}

static size_t count(const int64_t *dims, int nd) {
  size_t n = 1;
  for (int i = 0; i < nd; i++) n *= (size_t)dims[i];
  return n;
}

static const char *add_init(onnx_graph *g, const char *hint, int elem, const void *data, size_t bytes,
                            const int64_t *dims, int nd) {
  const char *name = keep_name(g, hint, 0);
  pbuf t = {0};
  tensor_head(&t, name, elem, dims, nd);
  pb_bytes(&t, 9, data, bytes); /* raw_data, little-endian as the host */
  pb_msg(&g->inits, 5, &t);
  free(t.p);
  return name;
}

const char *onnx_const_f32(onnx_graph *g, const char *hint, const float *data, const int64_t *dims, int nd) {
  return add_init(g, hint, 1, data, count(dims, nd) * sizeof(float), dims, nd);
}

const char *onnx_const_i64(onnx_graph *g, const char *hint, const int64_t *data, const int64_t *dims, int nd) {
  return add_init(g, hint, 7, data, count(dims, nd) * sizeof(int64_t), dims, nd);
}

const char *onnx_const_rows(onnx_graph *g, const char *hint, uint64_t rows, uint32_t cols,
                            void (*fill)(void *ctx, uint64_t r, float *out), void *ctx) {
  const char *name = keep_name(g, hint, 0);
  const int64_t dims[2] = {(int64_t)rows, (int64_t)cols};
  const size_t bytes = (size_t)rows * cols * sizeof(float);
  pbuf t = {0};
  tensor_head(&t, name, 1, dims, 2);
  pb_tag(&t, 9, 2);
  pb_varint(&t, bytes);
  /* The rows go straight into the initializers' buffer after the tensor's
   * head: TensorProto (field 5), its length, the head, then raw_data. */
  pb_tag(&g->inits, 5, 2);
  pb_varint(&g->inits, t.n + bytes);
  pb_raw(&g->inits, t.p, t.n);
  free(t.p);
  if (t.oom) g->inits.oom = 1;
  float *row = malloc((cols ? cols : 1) * sizeof(float));
  if (!row) {
    g->oom = 1;
    return name;
  }
  for (uint64_t r = 0; r < rows && !g->inits.oom; r++) {
    fill(ctx, r, row);
    pb_raw(&g->inits, row, cols * sizeof(float));
  }
  free(row);
  return name;
}

const char *onnx_scalar_f32(onnx_graph *g, float v) { return add_init(g, "c", 1, &v, sizeof v, NULL, 0); }

const char *onnx_i64s(onnx_graph *g, const int64_t *v, int n) {
  const int64_t dims[1] = {n};
  return onnx_const_i64(g, "ints", v, dims, 1);
}

static const char *one_i64(onnx_graph *g, int64_t v) { return onnx_i64s(g, &v, 1); }

/* ValueInfoProto: name (1), type (2) { tensor_type (1) { elem_type (1),
 * shape (2) { dim (1) { dim_value (1) | dim_param (2) } } } }, doc (3). */
static void value_info(pbuf *out, int field, const char *name, int elem, const int64_t *dims, int nd,
                       const char *doc) {
  pbuf shape = {0}, tensor = {0}, type = {0}, vi = {0};
  for (int i = 0; i < nd; i++) {
    pbuf dim = {0};
    if (dims[i] < 0)
      pb_str(&dim, 2, "N");
    else
      pb_int(&dim, 1, dims[i]);
    pb_msg(&shape, 1, &dim);
    free(dim.p);
  }
  pb_int(&tensor, 1, elem);
  pb_msg(&tensor, 2, &shape);
  pb_msg(&type, 1, &tensor);
  pb_str(&vi, 1, name);
  pb_msg(&vi, 2, &type);
  if (doc) pb_str(&vi, 3, doc);
  pb_msg(out, field, &vi);
  free(shape.p), free(tensor.p), free(type.p), free(vi.p);
}

void onnx_input(onnx_graph *g, const char *name, int elem, const int64_t *dims, int nd, const char *doc) {
  value_info(&g->inputs, 11, name, elem, dims, nd, doc);
}

void onnx_output(onnx_graph *g, const char *name, int elem, const int64_t *dims, int nd) {
  value_info(&g->outputs, 12, name, elem, dims, nd, NULL);
}

const char *onnx_node(onnx_graph *g, const char *op, const char *hint, const char *const *in, int n_in,
                      const onnx_attr *attrs, int n_attrs, const char *out) {
  const char *name = out ? keep_name(g, out, 1) : keep_name(g, hint ? hint : op, 0);
  pbuf n = {0};
  for (int i = 0; i < n_in; i++)
    if (in[i]) pb_str(&n, 1, in[i]);
  pb_str(&n, 2, name);
  pb_str(&n, 3, name); /* the node named after its output */
  pb_str(&n, 4, op);
  for (int i = 0; i < n_attrs; i++) {
    pbuf a = {0};
    pb_str(&a, 1, attrs[i].name);
    switch (attrs[i].type) {
    case ONNX_ATTR_INT:
      pb_int(&a, 3, attrs[i].i);
      pb_int(&a, 20, 2);
      break;
    case ONNX_ATTR_FLOAT:
      pb_float(&a, 2, attrs[i].f);
      pb_int(&a, 20, 1);
      break;
    case ONNX_ATTR_INTS:
      for (int k = 0; k < attrs[i].n_ints; k++) pb_int(&a, 8, attrs[i].ints[k]);
      pb_int(&a, 20, 7);
      break;
    }
    pb_msg(&n, 5, &a);
    free(a.p);
  }
  pb_msg(&g->nodes, 1, &n);
  free(n.p);
  return name;
}

const char *onnx_op1(onnx_graph *g, const char *op, const char *a) {
  const char *in[] = {a};
  return onnx_node(g, op, NULL, in, 1, NULL, 0, NULL);
}

const char *onnx_op2(onnx_graph *g, const char *op, const char *a, const char *b) {
  const char *in[] = {a, b};
  return onnx_node(g, op, NULL, in, 2, NULL, 0, NULL);
}

const char *onnx_reduce_sum(onnx_graph *g, const char *x, int64_t axis, int keepdims) {
  const char *in[] = {x, one_i64(g, axis)};
  const onnx_attr a[] = {ONNX_INT("keepdims", keepdims)};
  return onnx_node(g, "ReduceSum", NULL, in, 2, a, 1, NULL);
}

const char *onnx_concat(onnx_graph *g, const char *const *xs, int n, int64_t axis) {
  const onnx_attr a[] = {ONNX_INT("axis", axis)};
  return onnx_node(g, "Concat", NULL, xs, n, a, 1, NULL);
}

const char *onnx_flatten(onnx_graph *g, const char *x) {
  const onnx_attr a[] = {ONNX_INT("axis", 1)};
  return onnx_node(g, "Flatten", NULL, &x, 1, a, 1, NULL);
}

const char *onnx_slice(onnx_graph *g, const char *x, int64_t axis, int64_t start, int64_t end) {
  const char *in[] = {x, one_i64(g, start), one_i64(g, end), one_i64(g, axis)};
  return onnx_node(g, "Slice", NULL, in, 4, NULL, 0, NULL);
}

/* ---- the file ---------------------------------------------------------------------- */

dlrec_status onnx_graph_write(onnx_graph *g, const char *path, const char *doc) {
  if (g->oom || g->nodes.oom || g->inits.oom || g->inputs.oom || g->outputs.oom)
    return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory building the ONNX graph", path);
  pbuf head = {0}, name = {0}, opset = {0}, tail = {0};
  pb_int(&head, 1, 8); /* ir_version 8 (ONNX 1.10+; onnxruntime >= 1.10) */
  pb_str(&head, 2, "dlrec");
  pb_str(&head, 3, "1");
  if (doc) pb_str(&head, 6, doc);
  pb_str(&name, 2, g->name);
  const size_t graph_bytes = g->nodes.n + name.n + g->inits.n + g->inputs.n + g->outputs.n;
  pb_tag(&head, 7, 2);
  pb_varint(&head, graph_bytes);
  pb_str(&opset, 1, "");
  pb_int(&opset, 2, 17);
  pb_msg(&tail, 8, &opset);
  dlrec_status s = DLREC_OK;
  if (head.oom || name.oom || tail.oom) s = dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  char tmp[4096];
  if (s == DLREC_OK && snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  FILE *f = s == DLREC_OK ? fopen(tmp, "wb") : NULL;
  if (s == DLREC_OK && !f) s = dlrec_error(DLREC_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
  if (f) {
    const pbuf *parts[] = {&head, &g->nodes, &name, &g->inits, &g->inputs, &g->outputs, &tail};
    int ok = 1;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
      ok &= fwrite(parts[i]->p ? (const void *)parts[i]->p : "", 1, parts[i]->n, f) == parts[i]->n;
    ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
      s = dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", path, strerror(errno));
      unlink(tmp);
    }
  }
  free(head.p), free(name.p), free(opset.p), free(tail.p);
  return s;
}
