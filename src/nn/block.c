/* The plan helpers every block and model type uses (named tensors, linear
 * layers, buffers, the DLRM reference's linear init, a linear layer's ONNX
 * node) and the config readers the blocks share. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/json.h"
#include "core/onnx.h"
#include "core/rng.h"
#include "nn/block.h"

dlrec_status net_plan_tensor(net_plan *p, const char *name, uint32_t rows, uint32_t cols, size_t *offset) {
  if (p->n_tensors == DLREC_NET_MAX_TENSORS)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d parameter tensors", DLREC_NET_MAX_TENSORS);
  dlrec_net_tensor *t = &p->tensors[p->n_tensors];
  memset(t, 0, sizeof *t);
  if (snprintf(t->name, sizeof t->name, "%s", name) >= (int)sizeof t->name)
    return dlrec_error(DLREC_ERR_INTERNAL, "tensor name '%s' longer than %d bytes", name, DLREC_NET_TENSOR_NAME - 1);
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->offset = p->n_params;
  t->count = (size_t)rows * (cols ? cols : 1);
  p->n_params += t->count;
  p->n_tensors++;
  *offset = t->offset;
  return DLREC_OK;
}

dlrec_status net_plan_view(net_plan *p, uint32_t in, uint32_t out, size_t w, size_t b, int *index) {
  if (p->n_linear == NET_MAX_LINEAR)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d linear layers", NET_MAX_LINEAR);
  p->linear[p->n_linear] = (net_linear){.in = in, .out = out, .w = w, .b = b};
  *index = (int)p->n_linear++;
  return DLREC_OK;
}

dlrec_status net_plan_linear(net_plan *p, const char *prefix, uint32_t in, uint32_t out, int *index) {
  if (p->n_linear == NET_MAX_LINEAR)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d linear layers", NET_MAX_LINEAR);
  char name[DLREC_NET_TENSOR_NAME + 16];
  size_t w, b;
  snprintf(name, sizeof name, "%s.weight", prefix);
  dlrec_status s = net_plan_tensor(p, name, out, in, &w);
  snprintf(name, sizeof name, "%s.bias", prefix);
  if (s == DLREC_OK) s = net_plan_tensor(p, name, out, 0, &b);
  return s == DLREC_OK ? net_plan_view(p, in, out, w, b, index) : s;
}

dlrec_status net_plan_buffer(net_plan *p, const char *name, uint32_t rows, size_t *handle) {
  if (p->n_buffers == NET_MAX_BUFFERS)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d buffers", NET_MAX_BUFFERS);
  dlrec_net_tensor *t = &p->buffers[p->n_buffers];
  memset(t, 0, sizeof *t);
  if (snprintf(t->name, sizeof t->name, "%s", name) >= (int)sizeof t->name)
    return dlrec_error(DLREC_ERR_INTERNAL, "tensor name '%s' longer than %d bytes", name, DLREC_NET_TENSOR_NAME - 1);
  t->ndim = 1;
  t->shape[0] = rows;
  t->offset = p->buffer_floats;
  t->count = rows;
  p->buffer_floats += rows;
  p->n_buffers++;
  *handle = t->offset;
  return DLREC_OK;
}

/* Ends a plan: the buffers go after every trainable tensor. */
dlrec_status net_plan_finish(net_plan *p) {
  p->n_trainable = p->n_params;
  for (uint32_t i = 0; i < p->n_buffers; i++) {
    if (p->n_tensors == DLREC_NET_MAX_TENSORS)
      return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d parameter tensors", DLREC_NET_MAX_TENSORS);
    dlrec_net_tensor *t = &p->tensors[p->n_tensors++];
    *t = p->buffers[i];
    t->offset += p->n_trainable;
  }
  p->n_params += p->buffer_floats;
  return DLREC_OK;
}

void net_init_xavier(float *w, size_t count, uint32_t fan_in, uint32_t fan_out, uint64_t seed, uint64_t stream) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, stream);
  double std = sqrt(2.0 / ((double)fan_in + fan_out));
  for (size_t i = 0; i < count; i++) w[i] = (float)(std * dlrec_rng_normal(&r));
}

void net_init_linear(const net_linear *L, float *params, uint64_t seed, uint64_t stream) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, stream);
  double wstd = sqrt(2.0 / (L->in + L->out)), bstd = sqrt(1.0 / L->out);
  for (size_t i = 0; i < (size_t)L->in * L->out; i++) params[L->w + i] = (float)(wstd * dlrec_rng_normal(&r));
  for (uint32_t i = 0; i < L->out; i++) params[L->b + i] = (float)(bstd * dlrec_rng_normal(&r));
}

dlrec_status net_config_u32(const cJSON *o, const char *key, const char *what, uint64_t lo, uint64_t hi,
                            uint32_t *out) {
  uint64_t v;
  dlrec_status s = dlrec_json_get_u64_or(o, key, what, *out, &v);
  if (s != DLREC_OK) return s;
  if (v < lo || v > hi)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %llu is out of range [%llu, %llu]", what, key,
                       (unsigned long long)v, (unsigned long long)lo, (unsigned long long)hi);
  *out = (uint32_t)v;
  return DLREC_OK;
}

dlrec_status net_config_rate(const cJSON *o, const char *key, const char *what, float *rate) {
  double v = *rate;
  dlrec_status s = dlrec_json_get_double_or(o, key, what, v, &v);
  if (s != DLREC_OK) return s;
  if (!(v >= 0.0 && v < 1.0))
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': %g is out of range [0, 1)", what, key, v);
  *rate = (float)v;
  return DLREC_OK;
}

dlrec_status net_config_widths(const cJSON *o, const char *key, const char *what, uint32_t min_n, uint32_t max_n,
                               uint32_t *n, uint32_t *w) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!a) return DLREC_OK;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < (int)min_n || cJSON_GetArraySize(a) > (int)max_n)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': expected an array of %u to %u layer widths", what, key,
                       min_n, max_n);
  uint32_t i = 0, v[DLREC_MLP_MAX_LAYERS];
  for (const cJSON *e = a->child; e; e = e->next, i++) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 65536 || floor(e->valuedouble) != e->valuedouble)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s[%u]': expected a width in [1, 65536]", what, key, i);
    v[i] = (uint32_t)e->valuedouble;
  }
  memset(w, 0, DLREC_MLP_MAX_LAYERS * sizeof *w);
  memcpy(w, v, i * sizeof *w);
  *n = i;
  return DLREC_OK;
}

cJSON *net_widths_json(const uint32_t *w, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(w[i]));
  return a;
}

const char *net_onnx_linear(onnx_graph *g, const net_plan *p, const float *params, int layer, const char *x,
                            int relu) {
  const net_linear *L = &p->linear[layer];
  const int64_t wd[2] = {L->out, L->in}, bd[1] = {L->out};
  const char *in[3] = {x, onnx_const_f32(g, "weight", params + L->w, wd, 2),
                       L->b == NET_NO_BIAS ? NULL : onnx_const_f32(g, "bias", params + L->b, bd, 1)};
  const onnx_attr a[] = {ONNX_INT("transB", 1)};
  const char *y = onnx_node(g, "Gemm", "linear", in, 3, a, 1, NULL);
  return relu ? onnx_op1(g, "Relu", y) : y;
}
