/* The KServe v2 / Triton HTTP protocol: request parsing (JSON through cJSON,
 * and Triton's binary tensor data extension) and response writing (by hand,
 * since a long float array is most of a response and cJSON would build a
 * node per float). */
#include "serve/kserve.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/arena.h"

/* Binary tensors are little-endian and are borrowed or copied as they lie. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kserve.c reads little-endian binary tensors in place: a big-endian host needs byte swapping here"
#endif

/* Integers beyond 2^53 lose digits in a JSON parser that reads doubles
 * (cJSON's does); such values must come as binary data. */
#define JSON_INT_MAX 9007199254740992.0

/* Bounds on the sizes of the small objects of a request, so that checking
 * them for duplicates stays cheap. */
#define MAX_PARAMETERS 64

/* ---- datatypes ---- */

static const char *const dtype_names[] = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                          "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES"};
static const uint8_t dtype_sizes[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 0};
#define N_DTYPES (sizeof dtype_names / sizeof dtype_names[0])

const char *dlrec_kserve_dtype_name(dlrec_kserve_dtype t) {
  return (unsigned)t < N_DTYPES ? dtype_names[t] : "?";
}

int dlrec_kserve_dtype_parse(const char *name, dlrec_kserve_dtype *out) {
  for (unsigned i = 0; i < N_DTYPES; i++)
    if (!strcmp(name, dtype_names[i])) {
      *out = (dlrec_kserve_dtype)i;
      return 0;
    }
  return -1;
}

size_t dlrec_kserve_dtype_size(dlrec_kserve_dtype t) { return (unsigned)t < N_DTYPES ? dtype_sizes[t] : 0; }

void dlrec_kserve_limits_default(dlrec_kserve_limits *l) {
  l->max_inputs = 16;
  l->max_outputs = 16;
  l->max_elements = (uint64_t)1 << 26;
  l->max_string_bytes = 65536;
  l->max_name_bytes = 256;
}

int dlrec_kserve_http_status(dlrec_status st) {
  switch (st) {
  case DLREC_OK: return 200;
  case DLREC_ERR_PARSE:
  case DLREC_ERR_INVALID:
  case DLREC_ERR_UNSUPPORTED: return 400;
  case DLREC_ERR_NOMEM: return 503;
  default: return 500;
  }
}

/* ---- the JSON tree's memory ----
 *
 * A request's JSON holds thousands of small strings (26 categorical values a
 * row), and cJSON makes two heap allocations for each: a third of the
 * server's time went to malloc and free. While this thread parses a
 * request, cJSON's allocations come from the request's own dlrec_arena
 * (whose unused space AddressSanitizer watches) and its frees do nothing;
 * the tree is released with the arena, in one go.
 * cJSON's hooks are process-wide, so they are set once, before main, and
 * behave as malloc and free everywhere else and on every other thread. */

static _Thread_local dlrec_arena *tl_arena; /* set only around this thread's cJSON_Parse */

/* The tree's arena, allocated on the heap since the request keeps it. */
static void arena_free(dlrec_arena *a) {
  if (!a) return;
  dlrec_arena_free(a);
  free(a);
}

static void *hook_malloc(size_t n) { return tl_arena ? dlrec_arena_alloc(tl_arena, n, 16) : malloc(n); }
static void hook_free(void *p) {
  if (!tl_arena) free(p);
}

__attribute__((constructor)) static void install_cjson_hooks(void) {
  cJSON_Hooks h = {hook_malloc, hook_free};
  cJSON_InitHooks(&h);
}

/* ---- the request ---- */

typedef struct kserve_output {
  const char *name;
  int binary; /* -1: not given */
} kserve_output;

struct dlrec_kserve_request {
  cJSON *root;            /* names, the id and JSON strings point into it */
  dlrec_arena *arena;     /* root's memory */
  const char *id;
  int binary_output;
  uint32_t n_inputs, n_outputs;
  dlrec_kserve_tensor *inputs;
  void **owned;           /* (n_inputs) data converted from JSON or copied from the body */
  kserve_output *outputs;
};

void dlrec_kserve_request_free(dlrec_kserve_request *r) {
  if (!r) return;
  if (r->owned)
    for (uint32_t i = 0; i < r->n_inputs; i++) free(r->owned[i]);
  free(r->owned);
  free(r->inputs);
  free(r->outputs);
  arena_free(r->arena); /* the tree, never cJSON_Delete: its frees would be free() outside a parse */
  free(r);
}

const char *dlrec_kserve_request_id(const dlrec_kserve_request *r) { return r->id; }
uint32_t dlrec_kserve_request_n_inputs(const dlrec_kserve_request *r) { return r->n_inputs; }
uint32_t dlrec_kserve_request_n_outputs(const dlrec_kserve_request *r) { return r->n_outputs; }
int dlrec_kserve_request_binary_output(const dlrec_kserve_request *r) { return r->binary_output; }

const dlrec_kserve_tensor *dlrec_kserve_request_input(const dlrec_kserve_request *r, uint32_t i) {
  return i < r->n_inputs ? &r->inputs[i] : NULL;
}

const dlrec_kserve_tensor *dlrec_kserve_request_find_input(const dlrec_kserve_request *r, const char *name) {
  for (uint32_t i = 0; i < r->n_inputs; i++)
    if (!strcmp(r->inputs[i].name, name)) return &r->inputs[i];
  return NULL;
}

const char *dlrec_kserve_request_output(const dlrec_kserve_request *r, uint32_t i, int *binary_data) {
  if (i >= r->n_outputs) return NULL;
  if (binary_data) *binary_data = r->outputs[i].binary;
  return r->outputs[i].name;
}

const char *dlrec_kserve_shown(const char *s, size_t n, char *buf, size_t cap) {
  size_t k = 0, lim = n < 40 ? n : 40;
  for (size_t i = 0; i < lim && k + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') buf[k++] = (char)c;
    else k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
  }
  if (lim < n && k + 4 < cap) memcpy(buf + k, "...", 3), k += 3;
  buf[k] = '\0';
  return buf;
}

dlrec_status dlrec_kserve_request_output_binary(const dlrec_kserve_request *r, const char *output, int *binary) {
  *binary = r->binary_output;
  int found = r->n_outputs == 0;
  for (uint32_t i = 0; i < r->n_outputs; i++) {
    if (strcmp(r->outputs[i].name, output) != 0) {
      char b[200];
      return dlrec_error(DLREC_ERR_PARSE, "outputs[%u]: unknown output '%s' (the model has %s)", i,
                         dlrec_kserve_shown(r->outputs[i].name, strlen(r->outputs[i].name), b, sizeof b), output);
    }
    found = 1;
    if (r->outputs[i].binary >= 0) *binary = r->outputs[i].binary;
  }
  return found ? DLREC_OK : dlrec_error(DLREC_ERR_PARSE, "outputs: '%s' is not requested", output);
}

/* ---- parsing: helpers ---- */

/* What the parse of one request carries around. */
typedef struct parse_ctx {
  dlrec_kserve_limits lim;
  const char *bin;      /* the binary section */
  size_t bin_len, bin_pos;
  int has_header;       /* Inference-Header-Content-Length was given */
  uint64_t elements;    /* of the inputs so far */
} parse_ctx;

/* "inputs[3] ('dense')" into buf, for messages. */
static const char *input_what(char *buf, size_t cap, uint32_t i, const char *name) {
  if (!name) {
    snprintf(buf, cap, "inputs[%u]", i);
  } else {
    char b[200];
    snprintf(buf, cap, "inputs[%u] (%s)", i, dlrec_kserve_shown(name, strlen(name), b, sizeof b));
  }
  return buf;
}

/* A JSON number that must be an integer in [0, max]. */
static dlrec_status get_count(const cJSON *v, double max, const char *what, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return dlrec_error(DLREC_ERR_PARSE, "%s: expected an integer", what);
  double d = v->valuedouble;
  if (!(d == floor(d))) return dlrec_error(DLREC_ERR_PARSE, "%s: expected an integer, got %.17g", what, d);
  if (d < 0) return dlrec_error(DLREC_ERR_PARSE, "%s: negative (%.17g)", what, d);
  if (d > max) return dlrec_error(DLREC_ERR_PARSE, "%s: %.17g is too large (at most %.17g)", what, d, max);
  *out = (uint64_t)d;
  return DLREC_OK;
}

/* Walks a parameters object: every value must be a string, number or
 * boolean (the protocol's $parameter), keys unique. cb looks at the ones it
 * knows. */
typedef dlrec_status (*param_fn)(void *arg, const cJSON *p, const char *what);

static dlrec_status walk_parameters(const cJSON *obj, const char *what, param_fn fn, void *arg) {
  char w[512], b[200];
  if (!cJSON_IsObject(obj)) return dlrec_error(DLREC_ERR_PARSE, "%s.parameters: expected an object", what);
  int n = 0;
  for (const cJSON *p = obj->child; p; p = p->next) {
    if (++n > MAX_PARAMETERS)
      return dlrec_error(DLREC_ERR_PARSE, "%s.parameters: more than %d parameters", what, MAX_PARAMETERS);
    const char *key = p->string ? p->string : "";
    snprintf(w, sizeof w, "%s.parameters.%s", what, dlrec_kserve_shown(key, strlen(key), b, sizeof b));
    for (const cJSON *q = obj->child; q != p; q = q->next)
      if (q->string && !strcmp(q->string, key)) return dlrec_error(DLREC_ERR_PARSE, "%s: given twice", w);
    if (!cJSON_IsString(p) && !cJSON_IsNumber(p) && !cJSON_IsBool(p))
      return dlrec_error(DLREC_ERR_PARSE, "%s: expected a string, number or boolean", w);
    dlrec_status st = fn(arg, p, w);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

static dlrec_status top_param(void *arg, const cJSON *p, const char *what) {
  dlrec_kserve_request *r = arg;
  if (!strcmp(p->string, "binary_data_output")) {
    if (!cJSON_IsBool(p)) return dlrec_error(DLREC_ERR_PARSE, "%s: expected true or false", what);
    r->binary_output = cJSON_IsTrue(p);
  }
  return DLREC_OK; /* others (priority, timeout, sequence_id, ...) do not change a dlrec result */
}

typedef struct input_params {
  int has_size;
  uint64_t size;
} input_params;

static dlrec_status input_param(void *arg, const cJSON *p, const char *what) {
  input_params *ip = arg;
  if (!strcmp(p->string, "binary_data_size")) {
    ip->has_size = 1;
    return get_count(p, JSON_INT_MAX, what, &ip->size);
  }
  return DLREC_OK;
}

static dlrec_status output_param(void *arg, const cJSON *p, const char *what) {
  kserve_output *o = arg;
  if (!strcmp(p->string, "binary_data")) {
    if (!cJSON_IsBool(p)) return dlrec_error(DLREC_ERR_PARSE, "%s: expected true or false", what);
    o->binary = cJSON_IsTrue(p);
  } else if (!strcmp(p->string, "classification")) {
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: the classification extension is not supported", what);
  }
  return DLREC_OK;
}

const char *dlrec_kserve_shape_str(const dlrec_kserve_tensor *t, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (uint32_t d = 0; d < t->rank && k < cap; d++)
    k += (size_t)snprintf(buf + k, cap - k, d ? ",%lld" : "%lld", (long long)t->shape[d]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

/* Elements of shape[from..rank). Cannot overflow: the full product was
 * checked against max_elements. */
static uint64_t tail_count(const dlrec_kserve_tensor *t, uint32_t from) {
  uint64_t n = 1;
  for (uint32_t d = from; d < t->rank; d++) n *= (uint64_t)t->shape[d];
  return n;
}

/* ---- JSON data ---- */

/* Converts one JSON value to element i of t (into dst); NULL or a reason. */
static const char *json_value(const dlrec_kserve_tensor *t, const cJSON *v, void *dst, uint64_t i,
                              const dlrec_kserve_limits *lim) {
  if (t->dtype == DLREC_KSERVE_BYTES) {
    if (!cJSON_IsString(v)) return "expected a string";
    size_t n = strlen(v->valuestring);
    if (n > lim->max_string_bytes) return "string longer than the limit (max_string_bytes)";
    if (dst) ((dlrec_kserve_str *)dst)[i] = (dlrec_kserve_str){v->valuestring, n};
    return NULL;
  }
  if (t->dtype == DLREC_KSERVE_BOOL) {
    if (!cJSON_IsBool(v)) return "expected true or false";
    if (dst) ((uint8_t *)dst)[i] = cJSON_IsTrue(v) ? 1 : 0;
    return NULL;
  }
  if (!cJSON_IsNumber(v)) return "expected a number";
  double d = v->valuedouble;
  if (t->dtype == DLREC_KSERVE_FP64) {
    if (!isfinite(d)) return "out of range for FP64";
    if (dst) ((double *)dst)[i] = d;
    return NULL;
  }
  if (t->dtype == DLREC_KSERVE_FP32) {
    float f = (float)d;
    if (!isfinite(f)) return "out of range for FP32";
    if (dst) ((float *)dst)[i] = f;
    return NULL;
  }
  /* Integers: exact, and in the type's range. */
  if (!(d == floor(d))) return "not an integer";
  double lo, hi;
  switch (t->dtype) {
  case DLREC_KSERVE_UINT8: lo = 0, hi = UINT8_MAX; break;
  case DLREC_KSERVE_UINT16: lo = 0, hi = UINT16_MAX; break;
  case DLREC_KSERVE_UINT32: lo = 0, hi = UINT32_MAX; break;
  case DLREC_KSERVE_UINT64: lo = 0, hi = JSON_INT_MAX; break;
  case DLREC_KSERVE_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
  case DLREC_KSERVE_INT16: lo = INT16_MIN, hi = INT16_MAX; break;
  case DLREC_KSERVE_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
  case DLREC_KSERVE_INT64: lo = -JSON_INT_MAX, hi = JSON_INT_MAX; break;
  default: return "unsupported datatype";
  }
  if (d < lo || d > hi) {
    if (t->dtype == DLREC_KSERVE_INT64 || t->dtype == DLREC_KSERVE_UINT64)
      return "beyond 2^53, which JSON numbers do not carry exactly (send it as binary data)";
    return "out of range for the datatype";
  }
  if (!dst) return NULL;
  switch (t->dtype) {
  case DLREC_KSERVE_UINT8: ((uint8_t *)dst)[i] = (uint8_t)d; break;
  case DLREC_KSERVE_UINT16: ((uint16_t *)dst)[i] = (uint16_t)d; break;
  case DLREC_KSERVE_UINT32: ((uint32_t *)dst)[i] = (uint32_t)d; break;
  case DLREC_KSERVE_UINT64: ((uint64_t *)dst)[i] = (uint64_t)d; break;
  case DLREC_KSERVE_INT8: ((int8_t *)dst)[i] = (int8_t)d; break;
  case DLREC_KSERVE_INT16: ((int16_t *)dst)[i] = (int16_t)d; break;
  case DLREC_KSERVE_INT32: ((int32_t *)dst)[i] = (int32_t)d; break;
  default: ((int64_t *)dst)[i] = (int64_t)d; break;
  }
  return NULL;
}

/* Walks the data array `a` at nesting depth `depth`: an array of arrays
 * must have shape[depth] of them (each walked at depth + 1), an array of
 * values must hold every element of shape[depth..] (flat, or the innermost
 * level of a nested array). With dst NULL only checks; otherwise converts
 * into dst from element *k on. */
static dlrec_status walk_data(const dlrec_kserve_tensor *t, const cJSON *a, uint32_t depth, void *dst, uint64_t *k,
                              const dlrec_kserve_limits *lim, const char *what) {
  char sb[200];
  const cJSON *first = a->child;
  if (first && cJSON_IsArray(first)) {
    /* Its arrays sit at depth + 1 and hold values at depth + 2 at least. */
    if (depth + 1 >= t->rank)
      return dlrec_error(DLREC_ERR_PARSE, "%s.data: nested deeper than shape %s", what, dlrec_kserve_shape_str(t, sb, sizeof sb));
    uint64_t n = 0;
    for (const cJSON *c = first; c; c = c->next) {
      if (!cJSON_IsArray(c))
        return dlrec_error(DLREC_ERR_PARSE, "%s.data: mixes arrays and values at depth %u", what, depth + 1);
      if (++n > (uint64_t)t->shape[depth])
        return dlrec_error(DLREC_ERR_PARSE, "%s.data: more than %lld arrays at depth %u, shape %s", what,
                           (long long)t->shape[depth], depth + 1, dlrec_kserve_shape_str(t, sb, sizeof sb));
      dlrec_status st = walk_data(t, c, depth + 1, dst, k, lim, what);
      if (st != DLREC_OK) return st;
    }
    if (n != (uint64_t)t->shape[depth])
      return dlrec_error(DLREC_ERR_PARSE, "%s.data: %llu arrays at depth %u, shape %s needs %lld", what,
                         (unsigned long long)n, depth + 1, dlrec_kserve_shape_str(t, sb, sizeof sb), (long long)t->shape[depth]);
    return DLREC_OK;
  }
  uint64_t want = tail_count(t, depth), n = 0;
  const cJSON *c = first;
  for (; c && n < want; c = c->next, n++) {
    if (cJSON_IsArray(c))
      return dlrec_error(DLREC_ERR_PARSE, "%s.data: mixes arrays and values at depth %u", what, depth + 1);
    const char *why = json_value(t, c, dst, *k + n, lim);
    if (why) return dlrec_error(DLREC_ERR_PARSE, "%s.data[%llu]: %s", what, (unsigned long long)(*k + n), why);
  }
  if (n != want || c) {
    /* Count them all for the message, in one cheap pass. */
    n = 0;
    for (const cJSON *c = first; c; c = c->next) n++;
    if (depth == 0)
      return dlrec_error(DLREC_ERR_PARSE, "%s: shape %s needs %llu elements, data has %llu", what,
                         dlrec_kserve_shape_str(t, sb, sizeof sb), (unsigned long long)want, (unsigned long long)n);
    return dlrec_error(DLREC_ERR_PARSE, "%s.data: %llu values in an array at depth %u, shape %s needs %llu", what,
                       (unsigned long long)n, depth + 1, dlrec_kserve_shape_str(t, sb, sizeof sb), (unsigned long long)want);
  }
  *k += n;
  return DLREC_OK;
}

/* Fills t's data from the JSON array `data`; the buffer goes to *owned. */
static dlrec_status json_data(dlrec_kserve_tensor *t, const cJSON *data, const dlrec_kserve_limits *lim,
                              const char *what, void **owned) {
  if (!cJSON_IsArray(data)) return dlrec_error(DLREC_ERR_PARSE, "%s.data: expected an array", what);
  uint64_t k = 0;
  /* Checked first, so that a shape far larger than the data allocates nothing. */
  dlrec_status st = walk_data(t, data, 0, NULL, &k, lim, what);
  if (st != DLREC_OK) return st;
  size_t esize = t->dtype == DLREC_KSERVE_BYTES ? sizeof(dlrec_kserve_str) : dlrec_kserve_dtype_size(t->dtype);
  void *buf = malloc(t->count ? t->count * esize : 1);
  if (!buf) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory for %llu elements", what,
                               (unsigned long long)t->count);
  *owned = buf;
  k = 0;
  st = walk_data(t, data, 0, buf, &k, lim, what);
  if (st != DLREC_OK) return st;
  if (t->dtype == DLREC_KSERVE_BYTES) t->strs = buf;
  else t->data = buf;
  return DLREC_OK;
}

/* ---- binary data ---- */

static uint32_t le32(const char *p) {
  const unsigned char *u = (const unsigned char *)p;
  return (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
}

/* Takes `size` bytes of the binary section for t. */
static dlrec_status binary_data(parse_ctx *x, dlrec_kserve_tensor *t, uint64_t size, const char *what,
                                void **owned) {
  char sb[200];
  if (!x->has_header)
    return dlrec_error(DLREC_ERR_PARSE,
                       "%s.parameters.binary_data_size: binary data needs the Inference-Header-Content-Length header",
                       what);
  if (size > x->bin_len - x->bin_pos)
    return dlrec_error(DLREC_ERR_PARSE,
                       "%s: binary data truncated: binary_data_size %llu at offset %zu, but only %zu bytes follow",
                       what, (unsigned long long)size, x->bin_pos, x->bin_len - x->bin_pos);
  const char *p = x->bin + x->bin_pos;
  t->binary = 1;
  if (t->dtype == DLREC_KSERVE_BYTES) {
    /* Each element takes at least its 4-byte length. */
    if (t->count > size / 4)
      return dlrec_error(DLREC_ERR_PARSE, "%s: binary_data_size %llu cannot hold %llu BYTES elements of shape %s",
                         what, (unsigned long long)size, (unsigned long long)t->count, dlrec_kserve_shape_str(t, sb, sizeof sb));
    dlrec_kserve_str *s = malloc(t->count ? t->count * sizeof *s : 1);
    if (!s) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", what);
    *owned = s;
    uint64_t pos = 0;
    for (uint64_t i = 0; i < t->count; i++) {
      if (size - pos < 4)
        return dlrec_error(DLREC_ERR_PARSE, "%s: binary element %llu: truncated length (binary_data_size %llu)", what,
                           (unsigned long long)i, (unsigned long long)size);
      uint32_t n = le32(p + pos);
      pos += 4;
      if (n > x->lim.max_string_bytes)
        return dlrec_error(DLREC_ERR_PARSE, "%s: binary element %llu: %u bytes, more than the limit of %u "
                           "(max_string_bytes)", what, (unsigned long long)i, n, x->lim.max_string_bytes);
      if (size - pos < n)
        return dlrec_error(DLREC_ERR_PARSE, "%s: binary element %llu: %u bytes, but binary_data_size leaves %llu",
                           what, (unsigned long long)i, n, (unsigned long long)(size - pos));
      s[i] = (dlrec_kserve_str){p + pos, n};
      pos += n;
    }
    if (pos != size)
      return dlrec_error(DLREC_ERR_PARSE, "%s: binary_data_size %llu, but its %llu elements take %llu bytes", what,
                         (unsigned long long)size, (unsigned long long)t->count, (unsigned long long)pos);
    t->strs = s;
  } else {
    size_t esize = dlrec_kserve_dtype_size(t->dtype);
    if (t->count > UINT64_MAX / esize || size != t->count * esize)
      return dlrec_error(DLREC_ERR_PARSE, "%s: binary_data_size %llu does not match shape %s of %s (%llu bytes)", what,
                         (unsigned long long)size, dlrec_kserve_shape_str(t, sb, sizeof sb), dlrec_kserve_dtype_name(t->dtype),
                         (unsigned long long)(t->count * esize));
    if (t->dtype == DLREC_KSERVE_BOOL)
      for (uint64_t i = 0; i < t->count; i++)
        if ((unsigned char)p[i] > 1)
          return dlrec_error(DLREC_ERR_PARSE, "%s: binary BOOL element %llu is %u, not 0 or 1", what,
                             (unsigned long long)i, (unsigned char)p[i]);
    /* The body's bytes when they are aligned for the type, else a copy. */
    if ((uintptr_t)p % esize == 0) {
      t->data = p;
    } else {
      void *c = malloc(size ? size : 1);
      if (!c) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", what);
      if (size) memcpy(c, p, size);
      *owned = c;
      t->data = c;
    }
  }
  x->bin_pos += size;
  return DLREC_OK;
}

/* ---- inputs and outputs ---- */

static dlrec_status parse_input(parse_ctx *x, dlrec_kserve_request *r, uint32_t i, const cJSON *in) {
  char what[300], b[200];
  dlrec_kserve_tensor *t = &r->inputs[i];
  input_what(what, sizeof what, i, NULL);
  if (!cJSON_IsObject(in)) return dlrec_error(DLREC_ERR_PARSE, "%s: expected an object", what);
  const cJSON *name = NULL, *shape = NULL, *dtype = NULL, *params = NULL, *data = NULL;
  for (const cJSON *c = in->child; c; c = c->next) {
    const char *key = c->string ? c->string : "";
    const cJSON **slot = !strcmp(key, "name")         ? &name
                         : !strcmp(key, "shape")      ? &shape
                         : !strcmp(key, "datatype")   ? &dtype
                         : !strcmp(key, "parameters") ? &params
                         : !strcmp(key, "data")       ? &data
                                                      : NULL;
    if (!slot) return dlrec_error(DLREC_ERR_PARSE, "%s: unknown key '%s'", what, dlrec_kserve_shown(key, strlen(key), b, sizeof b));
    if (*slot) return dlrec_error(DLREC_ERR_PARSE, "%s: key '%s' given twice", what, key);
    *slot = c;
  }
  /* The name first, so that later messages carry it. */
  if (!name) return dlrec_error(DLREC_ERR_PARSE, "%s: missing 'name'", what);
  if (!cJSON_IsString(name)) return dlrec_error(DLREC_ERR_PARSE, "%s.name: expected a string", what);
  size_t nlen = strlen(name->valuestring);
  if (nlen == 0) return dlrec_error(DLREC_ERR_PARSE, "%s.name: empty", what);
  if (nlen > x->lim.max_name_bytes)
    return dlrec_error(DLREC_ERR_PARSE, "%s.name: longer than %u bytes", what, x->lim.max_name_bytes);
  t->name = name->valuestring;
  for (uint32_t j = 0; j < i; j++)
    if (!strcmp(r->inputs[j].name, t->name))
      return dlrec_error(DLREC_ERR_PARSE, "inputs[%u]: input name '%s' given twice (also inputs[%u])", i,
                         dlrec_kserve_shown(t->name, nlen, b, sizeof b), j);
  input_what(what, sizeof what, i, t->name);

  if (!dtype) return dlrec_error(DLREC_ERR_PARSE, "%s: missing 'datatype'", what);
  if (!cJSON_IsString(dtype)) return dlrec_error(DLREC_ERR_PARSE, "%s.datatype: expected a string", what);
  if (dlrec_kserve_dtype_parse(dtype->valuestring, &t->dtype) != 0)
    return dlrec_error(DLREC_ERR_PARSE,
                       "%s.datatype: unknown datatype '%s' (BOOL, UINT8..UINT64, INT8..INT64, FP32, FP64, BYTES)",
                       what, dlrec_kserve_shown(dtype->valuestring, strlen(dtype->valuestring), b, sizeof b));
  if (t->dtype == DLREC_KSERVE_FP16)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s.datatype: FP16 is not supported (send FP32)", what);

  if (!shape) return dlrec_error(DLREC_ERR_PARSE, "%s: missing 'shape'", what);
  if (!cJSON_IsArray(shape)) return dlrec_error(DLREC_ERR_PARSE, "%s.shape: expected an array", what);
  uint64_t count = 1;
  int zero = 0, over = 0;
  t->rank = 0;
  for (const cJSON *d = shape->child; d; d = d->next) {
    char w[340];
    snprintf(w, sizeof w, "%s.shape[%u]", what, t->rank);
    if (t->rank == DLREC_KSERVE_MAX_RANK)
      return dlrec_error(DLREC_ERR_PARSE, "%s.shape: more than %d dimensions", what, DLREC_KSERVE_MAX_RANK);
    if (cJSON_IsNumber(d) && d->valuedouble < 0)
      return dlrec_error(DLREC_ERR_PARSE, "%s: negative dimension %.17g", w, d->valuedouble);
    uint64_t v;
    dlrec_status st = get_count(d, JSON_INT_MAX, w, &v);
    if (st != DLREC_OK) return st;
    t->shape[t->rank++] = (int64_t)v;
    zero |= v == 0;
    over |= __builtin_mul_overflow(count, v, &count);
  }
  if (zero) count = 0;
  else if (over) count = UINT64_MAX;
  if (count > x->lim.max_elements - x->elements) {
    char sb[200];
    return dlrec_error(DLREC_ERR_PARSE, "%s: shape %s: the request's inputs exceed the limit of %llu elements "
                       "(max_elements)", what, dlrec_kserve_shape_str(t, sb, sizeof sb), (unsigned long long)x->lim.max_elements);
  }
  t->count = count;
  x->elements += count;

  input_params ip = {0, 0};
  if (params) {
    dlrec_status st = walk_parameters(params, what, input_param, &ip);
    if (st != DLREC_OK) return st;
  }
  if (ip.has_size && data)
    return dlrec_error(DLREC_ERR_PARSE, "%s: both 'data' and parameters.binary_data_size given", what);
  if (ip.has_size) return binary_data(x, t, ip.size, what, &r->owned[i]);
  if (!data) return dlrec_error(DLREC_ERR_PARSE, "%s: missing 'data' (or parameters.binary_data_size)", what);
  return json_data(t, data, &x->lim, what, &r->owned[i]);
}

static dlrec_status parse_output(parse_ctx *x, dlrec_kserve_request *r, uint32_t i, const cJSON *o) {
  char what[64], b[200];
  snprintf(what, sizeof what, "outputs[%u]", i);
  kserve_output *out = &r->outputs[i];
  out->binary = -1;
  if (!cJSON_IsObject(o)) return dlrec_error(DLREC_ERR_PARSE, "%s: expected an object", what);
  const cJSON *name = NULL, *params = NULL;
  for (const cJSON *c = o->child; c; c = c->next) {
    const char *key = c->string ? c->string : "";
    const cJSON **slot = !strcmp(key, "name") ? &name : !strcmp(key, "parameters") ? &params : NULL;
    if (!slot) return dlrec_error(DLREC_ERR_PARSE, "%s: unknown key '%s'", what, dlrec_kserve_shown(key, strlen(key), b, sizeof b));
    if (*slot) return dlrec_error(DLREC_ERR_PARSE, "%s: key '%s' given twice", what, key);
    *slot = c;
  }
  if (!name) return dlrec_error(DLREC_ERR_PARSE, "%s: missing 'name'", what);
  if (!cJSON_IsString(name) || !name->valuestring[0])
    return dlrec_error(DLREC_ERR_PARSE, "%s.name: expected a non-empty string", what);
  if (strlen(name->valuestring) > x->lim.max_name_bytes)
    return dlrec_error(DLREC_ERR_PARSE, "%s.name: longer than %u bytes", what, x->lim.max_name_bytes);
  out->name = name->valuestring;
  for (uint32_t j = 0; j < i; j++)
    if (!strcmp(r->outputs[j].name, out->name))
      return dlrec_error(DLREC_ERR_PARSE, "%s: output name '%s' given twice", what,
                         dlrec_kserve_shown(out->name, strlen(out->name), b, sizeof b));
  return params ? walk_parameters(params, what, output_param, out) : DLREC_OK;
}

/* Parses the NUL-terminated JSON text of n bytes; the tree goes to *root. */
static dlrec_status parse_json(const char *text, size_t n, int has_header, cJSON **root) {
  const char *end = NULL;
  *root = cJSON_ParseWithOpts(text, &end, 0);
  if (!*root) {
    size_t pos = end && end >= text && end <= text + n ? (size_t)(end - text) : 0;
    int line = 1;
    for (size_t i = 0; i < pos; i++) line += text[i] == '\n';
    return dlrec_error(DLREC_ERR_PARSE, "request: invalid JSON at byte %zu (line %d)", pos, line);
  }
  const char *p = end && end >= text && end <= text + n ? end : text + n;
  while (p < text + n && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  if (p == text + n) return DLREC_OK;
  size_t pos = (size_t)(p - text);
  if (*p == '\0') return dlrec_error(DLREC_ERR_PARSE, "request: NUL byte in the JSON at byte %zu", pos);
  return dlrec_error(DLREC_ERR_PARSE, "request: unexpected bytes after the JSON at byte %zu%s", pos,
                     has_header ? " (inside Inference-Header-Content-Length)"
                                : " (binary tensor data needs the Inference-Header-Content-Length header)");
}

/* The request's JSON part (all of the body, or its first header_len bytes,
 * the rest binary tensor data for x) parsed into *root, its nodes in
 * *arena's blocks. */
static dlrec_status read_json(const char *body, size_t body_len, long long header_len, parse_ctx *x, cJSON **root,
                              dlrec_arena **arena_out) {
  *arena_out = NULL;
  if (!body && body_len) return dlrec_error(DLREC_ERR_INVALID, "request: NULL body");
  size_t json_len = body_len;
  if (header_len >= 0) {
    if ((unsigned long long)header_len > body_len)
      return dlrec_error(DLREC_ERR_PARSE, "Inference-Header-Content-Length: %lld is more than the body's %zu bytes",
                         header_len, body_len);
    json_len = (size_t)header_len;
    x->has_header = 1;
    x->bin = body + json_len;
    x->bin_len = body_len - json_len;
  } else if (header_len != -1) {
    return dlrec_error(DLREC_ERR_PARSE, "Inference-Header-Content-Length: negative (%lld)", header_len);
  }
  if (json_len == 0) return dlrec_error(DLREC_ERR_PARSE, "request: empty, expected a JSON object");
  /* cJSON reads a NUL-terminated copy: then no parser bug can read past the
   * body, whose end is not ours to read. The tree keeps its own strings. */
  char *text = malloc(json_len + 1);
  if (!text) return dlrec_error(DLREC_ERR_NOMEM, "request: out of memory for %zu bytes of JSON", json_len);
  memcpy(text, body, json_len);
  text[json_len] = '\0';
  dlrec_arena *arena = malloc(sizeof *arena);
  if (!arena) {
    free(text);
    return dlrec_error(DLREC_ERR_NOMEM, "request: out of memory");
  }
  /* About a node and a string per few bytes of JSON: one block for a small
   * request, 1 MiB blocks for a large one. */
  dlrec_arena_init(arena, json_len < (1u << 17) ? 8 * json_len + 4096 : (size_t)1 << 20);
  tl_arena = arena;
  dlrec_status st = parse_json(text, json_len, x->has_header, root);
  tl_arena = NULL;
  free(text);
  if (st != DLREC_OK) {
    arena_free(arena);
    return st;
  }
  *arena_out = arena;
  return DLREC_OK;
}

/* The request object's four keys, each at most once, no other. */
static dlrec_status top_keys(const cJSON *root, const cJSON **id, const cJSON **params, const cJSON **inputs,
                             const cJSON **outputs) {
  char b[200];
  if (!cJSON_IsObject(root)) return dlrec_error(DLREC_ERR_PARSE, "request: expected a JSON object");
  for (const cJSON *c = root->child; c; c = c->next) {
    const char *key = c->string ? c->string : "";
    const cJSON **slot = !strcmp(key, "id")           ? id
                         : !strcmp(key, "parameters") ? params
                         : !strcmp(key, "inputs")     ? inputs
                         : !strcmp(key, "outputs")    ? outputs
                                                      : NULL;
    if (!slot)
      return dlrec_error(DLREC_ERR_PARSE, "request: unknown key '%s'", dlrec_kserve_shown(key, strlen(key), b, sizeof b));
    if (*slot) return dlrec_error(DLREC_ERR_PARSE, "request: key '%s' given twice", key);
    *slot = c;
  }
  return DLREC_OK;
}

/* The "inputs" array, each input parsed, the binary data used up exactly. */
static dlrec_status parse_inputs(parse_ctx *x, dlrec_kserve_request *r, const cJSON *inputs) {
  if (!inputs) return dlrec_error(DLREC_ERR_PARSE, "request: missing 'inputs'");
  if (!cJSON_IsArray(inputs)) return dlrec_error(DLREC_ERR_PARSE, "inputs: expected an array");
  uint32_t n = 0;
  for (const cJSON *c = inputs->child; c; c = c->next)
    if (++n > x->lim.max_inputs)
      return dlrec_error(DLREC_ERR_PARSE, "inputs: more than %u inputs (max_inputs)", x->lim.max_inputs);
  if (n == 0) return dlrec_error(DLREC_ERR_PARSE, "inputs: empty");
  r->inputs = calloc(n, sizeof *r->inputs);
  r->owned = calloc(n, sizeof *r->owned);
  if (!r->inputs || !r->owned) return dlrec_error(DLREC_ERR_NOMEM, "request: out of memory");
  r->n_inputs = n;
  uint32_t i = 0;
  dlrec_status st;
  for (const cJSON *c = inputs->child; c; c = c->next, i++)
    if ((st = parse_input(x, r, i, c)) != DLREC_OK) return st;
  if (x->bin_pos != x->bin_len)
    return dlrec_error(DLREC_ERR_PARSE, "binary data: %zu trailing bytes after the inputs' binary_data_size (%zu)",
                       x->bin_len - x->bin_pos, x->bin_pos);
  return DLREC_OK;
}

/* The optional "outputs" array. */
static dlrec_status parse_outputs(parse_ctx *x, dlrec_kserve_request *r, const cJSON *outputs) {
  if (!outputs) return DLREC_OK;
  if (!cJSON_IsArray(outputs)) return dlrec_error(DLREC_ERR_PARSE, "outputs: expected an array");
  uint32_t n = 0;
  for (const cJSON *c = outputs->child; c; c = c->next)
    if (++n > x->lim.max_outputs)
      return dlrec_error(DLREC_ERR_PARSE, "outputs: more than %u outputs (max_outputs)", x->lim.max_outputs);
  if (!n) return DLREC_OK;
  r->outputs = calloc(n, sizeof *r->outputs);
  if (!r->outputs) return dlrec_error(DLREC_ERR_NOMEM, "request: out of memory");
  r->n_outputs = n;
  uint32_t i = 0;
  dlrec_status st;
  for (const cJSON *c = outputs->child; c; c = c->next, i++)
    if ((st = parse_output(x, r, i, c)) != DLREC_OK) return st;
  return DLREC_OK;
}

dlrec_status dlrec_kserve_parse_request(const char *body, size_t body_len, long long header_len,
                                        const dlrec_kserve_limits *lim, dlrec_kserve_request **out) {
  *out = NULL;
  parse_ctx x = {0};
  if (lim) x.lim = *lim;
  else dlrec_kserve_limits_default(&x.lim);
  cJSON *root = NULL;
  dlrec_arena *arena = NULL;
  dlrec_status st = read_json(body, body_len, header_len, &x, &root, &arena);
  if (st != DLREC_OK) return st;
  dlrec_kserve_request *r = calloc(1, sizeof *r);
  if (!r) {
    arena_free(arena);
    return dlrec_error(DLREC_ERR_NOMEM, "request: out of memory");
  }
  r->root = root;
  r->arena = arena;
  const cJSON *id = NULL, *params = NULL, *inputs = NULL, *outputs = NULL;
  st = top_keys(root, &id, &params, &inputs, &outputs);
  if (st == DLREC_OK && id) {
    if (!cJSON_IsString(id)) st = dlrec_error(DLREC_ERR_PARSE, "id: expected a string");
    else if (strlen(id->valuestring) > x.lim.max_name_bytes)
      st = dlrec_error(DLREC_ERR_PARSE, "id: longer than %u bytes", x.lim.max_name_bytes);
    else r->id = id->valuestring;
  }
  if (st == DLREC_OK && params) st = walk_parameters(params, "request", top_param, r);
  if (st == DLREC_OK) st = parse_inputs(&x, r, inputs);
  if (st == DLREC_OK) st = parse_outputs(&x, r, outputs);
  if (st != DLREC_OK) {
    dlrec_kserve_request_free(r);
    return st;
  }
  *out = r;
  return DLREC_OK;
}

