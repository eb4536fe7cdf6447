/* The KServe v2 / Triton HTTP inference protocol: request bodies in, response
 * bodies out. No sockets here: the HTTP layer hands over a body and the value
 * of its Inference-Header-Content-Length header, and sends back what the
 * writers produce.
 *
 * A request is a JSON object (KServe's "Open Inference Protocol", v2):
 *
 *   {"id": "42",                                   optional, echoed back
 *    "parameters": {"binary_data_output": true},   optional
 *    "inputs": [{"name": "dense", "datatype": "FP32", "shape": [2, 13],
 *                "data": [[...13 numbers...], [...]]},          nested or flat
 *               {"name": "categorical", "datatype": "BYTES", "shape": [2, 26],
 *                "parameters": {"binary_data_size": 812}}],    binary, see below
 *    "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]}
 *
 * Triton's binary tensor data extension: when the HTTP request carries
 * Inference-Header-Content-Length: N, the first N bytes of the body are the
 * JSON above and the rest holds, back to back in the order of `inputs`, the
 * data of every input whose parameters give "binary_data_size": little-endian,
 * row-major, no padding; BOOL one byte (0 or 1) per element; BYTES a 4-byte
 * little-endian length before each element's bytes. The sizes must add up to
 * the rest of the body exactly.
 *
 * Parsing is strict, since a request that is quietly misread scores the wrong
 * rows: unknown keys, duplicate keys or input names, a datatype this build does
 * not know, a shape that does not match the data, a number that does not fit
 * its datatype (3.5 for INT64, 1e40 for FP32, 2^53 + 1 for INT64 in JSON) and
 * every size mismatch are refused, with a message that names the field
 * ("inputs[1] (categorical): shape [2,26] needs 52 elements, data has 51").
 * Every such error is DLREC_ERR_PARSE or DLREC_ERR_UNSUPPORTED, an HTTP 400
 * (dlrec_kserve_http_status). Nothing here reads outside the body it is
 * given, and the body need not be NUL-terminated.
 *
 * Thread-safety: the functions keep no global state; a request or a buffer is
 * used by one thread at a time, and distinct ones by any number of threads.
 *
 * docs: https://github.com/kserve/kserve/blob/master/docs/predict-api/v2/required_api.md
 * and Triton's docs/protocol/extension_binary_data.md.
 */
#ifndef DLREC_KSERVE_H
#define DLREC_KSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "data/schema.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most dimensions of a tensor's shape. */
#define DLREC_KSERVE_MAX_RANK 8

/* The one output of a dlrec model: a click probability per row, FP32 [B]. */
#define DLREC_KSERVE_OUTPUT "OUTPUT0"

/* Tensor element types, as the protocol spells them ("FP32", ...). */
typedef enum dlrec_kserve_dtype {
  DLREC_KSERVE_BOOL = 0, /* uint8_t 0 or 1 */
  DLREC_KSERVE_UINT8,
  DLREC_KSERVE_UINT16,
  DLREC_KSERVE_UINT32,
  DLREC_KSERVE_UINT64,
  DLREC_KSERVE_INT8,
  DLREC_KSERVE_INT16,
  DLREC_KSERVE_INT32,
  DLREC_KSERVE_INT64,
  DLREC_KSERVE_FP16,  /* known, but refused as unsupported */
  DLREC_KSERVE_FP32,
  DLREC_KSERVE_FP64,
  DLREC_KSERVE_BYTES, /* byte strings, read as dlrec_kserve_str */
} dlrec_kserve_dtype;

/* "FP32" for DLREC_KSERVE_FP32; "?" for a value out of range. */
const char *dlrec_kserve_dtype_name(dlrec_kserve_dtype t);
/* Parses a datatype name (exact, upper case); -1 when unknown. */
int dlrec_kserve_dtype_parse(const char *name, dlrec_kserve_dtype *out);
/* Bytes per element in binary form; 0 for BYTES (variable). */
size_t dlrec_kserve_dtype_size(dlrec_kserve_dtype t);

/* What one request may hold; requests beyond a limit are refused (400) with
 * the limit named, before anything of their size is allocated. */
typedef struct dlrec_kserve_limits {
  uint32_t max_inputs;       /* 16 */
  uint32_t max_outputs;      /* 16 */
  uint64_t max_elements;     /* 1 << 26: elements of all inputs together */
  uint32_t max_string_bytes; /* 65536: one BYTES element */
  uint32_t max_name_bytes;   /* 256: a tensor name, and the request id */
} dlrec_kserve_limits;

/* Fills l with the defaults above. */
void dlrec_kserve_limits_default(dlrec_kserve_limits *l);

/* One BYTES element: s[0..n), not NUL-terminated. */
typedef struct dlrec_kserve_str {
  const char *s;
  size_t n;
} dlrec_kserve_str;

/* An input tensor of a parsed request (read-only view; valid as long as the
 * request). Element i is at row-major position i of shape. */
typedef struct dlrec_kserve_tensor {
  const char *name;         /* NUL-terminated */
  dlrec_kserve_dtype dtype;
  uint32_t rank;            /* 0 (a scalar) .. DLREC_KSERVE_MAX_RANK */
  int64_t shape[DLREC_KSERVE_MAX_RANK];
  uint64_t count;           /* elements: the product of shape (1 for a scalar) */
  int binary;               /* 1: the data came from the binary section */
  /* Numeric and BOOL tensors: count elements of the dtype's C type
   * (uint8_t .. int64_t, float, double; BOOL as uint8_t 0/1), in host order
   * and aligned for that type. NULL for BYTES. */
  const void *data;
  /* BYTES tensors: count strings. NULL otherwise. */
  const dlrec_kserve_str *strs;
} dlrec_kserve_tensor;

/* Element i of a numeric or BOOL tensor as a double (exact for every type
 * but 64-bit integers beyond 2^53). 0 for BYTES and FP16. */
static inline double dlrec_kserve_get_f64(const dlrec_kserve_tensor *t, uint64_t i) {
  switch (t->dtype) {
  case DLREC_KSERVE_BOOL:
  case DLREC_KSERVE_UINT8: return ((const uint8_t *)t->data)[i];
  case DLREC_KSERVE_UINT16: return ((const uint16_t *)t->data)[i];
  case DLREC_KSERVE_UINT32: return ((const uint32_t *)t->data)[i];
  case DLREC_KSERVE_UINT64: return (double)((const uint64_t *)t->data)[i];
  case DLREC_KSERVE_INT8: return ((const int8_t *)t->data)[i];
  case DLREC_KSERVE_INT16: return ((const int16_t *)t->data)[i];
  case DLREC_KSERVE_INT32: return ((const int32_t *)t->data)[i];
  case DLREC_KSERVE_INT64: return (double)((const int64_t *)t->data)[i];
  case DLREC_KSERVE_FP32: return ((const float *)t->data)[i];
  case DLREC_KSERVE_FP64: return ((const double *)t->data)[i];
  default: return 0.0;
  }
}

/* Element i of an integer or BOOL tensor as an int64_t; UINT64 values above
 * INT64_MAX saturate to INT64_MAX (callers range-check anyway). Floating
 * tensors: 0 (use dlrec_kserve_get_f64). */
static inline int64_t dlrec_kserve_get_i64(const dlrec_kserve_tensor *t, uint64_t i) {
  switch (t->dtype) {
  case DLREC_KSERVE_BOOL:
  case DLREC_KSERVE_UINT8: return ((const uint8_t *)t->data)[i];
  case DLREC_KSERVE_UINT16: return ((const uint16_t *)t->data)[i];
  case DLREC_KSERVE_UINT32: return ((const uint32_t *)t->data)[i];
  case DLREC_KSERVE_UINT64: {
    uint64_t v = ((const uint64_t *)t->data)[i];
    return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
  }
  case DLREC_KSERVE_INT8: return ((const int8_t *)t->data)[i];
  case DLREC_KSERVE_INT16: return ((const int16_t *)t->data)[i];
  case DLREC_KSERVE_INT32: return ((const int32_t *)t->data)[i];
  case DLREC_KSERVE_INT64: return ((const int64_t *)t->data)[i];
  default: return 0;
  }
}

/* 1 for the integer types (signed and unsigned, not BOOL). */
static inline int dlrec_kserve_dtype_is_int(dlrec_kserve_dtype t) {
  return t >= DLREC_KSERVE_UINT8 && t <= DLREC_KSERVE_INT64;
}

/* A client's string s[0..n) made safe for a message in buf (cap bytes, at
 * least 1): at most 40 bytes, bytes outside printable ASCII as \xNN, "..."
 * when cut; returns buf. */
const char *dlrec_kserve_shown(const char *s, size_t n, char *buf, size_t cap);

/* The tensor's shape for messages, "[2,13]", in buf (cap bytes, at least 1);
 * returns buf. */
const char *dlrec_kserve_shape_str(const dlrec_kserve_tensor *t, char *buf, size_t cap);

/* ---- requests ---- */

typedef struct dlrec_kserve_request dlrec_kserve_request;

/* Parses an inference request body[0..body_len) (not NUL-terminated).
 * header_len is the value of Inference-Header-Content-Length, or -1 when the
 * request has none: then the whole body is the JSON and no input may use
 * binary_data_size. With header_len >= 0, body[0..header_len) is the JSON and
 * body[header_len..body_len) the binary tensor data, which must be exactly
 * the inputs' binary_data_size bytes. lim may be NULL (the defaults).
 *
 * On success *out is owned by the caller (dlrec_kserve_request_free). The
 * request BORROWS body: strings and (aligned) numeric data of binary inputs
 * point into it, so body must stay unchanged until the request is freed.
 * Data given in JSON is converted to the tensor's type and owned by the
 * request. On failure *out is NULL and the error names the field. */
dlrec_status dlrec_kserve_parse_request(const char *body, size_t body_len, long long header_len,
                                        const dlrec_kserve_limits *lim, dlrec_kserve_request **out);

void dlrec_kserve_request_free(dlrec_kserve_request *r); /* accepts NULL */

/* The request's "id", or NULL when it has none. Valid as long as r. */
const char *dlrec_kserve_request_id(const dlrec_kserve_request *r);

/* The inputs, in request order. */
uint32_t dlrec_kserve_request_n_inputs(const dlrec_kserve_request *r);
const dlrec_kserve_tensor *dlrec_kserve_request_input(const dlrec_kserve_request *r, uint32_t i);
/* The input called name, or NULL. */
const dlrec_kserve_tensor *dlrec_kserve_request_find_input(const dlrec_kserve_request *r, const char *name);

/* The requested outputs ("outputs": names, with parameters.binary_data
 * -1 when not given, else 0 or 1); 0 when the request names none. */
uint32_t dlrec_kserve_request_n_outputs(const dlrec_kserve_request *r);
const char *dlrec_kserve_request_output(const dlrec_kserve_request *r, uint32_t i, int *binary_data);

/* The top-level parameters.binary_data_output: 1 when true, else 0. */
int dlrec_kserve_request_binary_output(const dlrec_kserve_request *r);

/* Decides how to return the output called `output` (DLREC_KSERVE_OUTPUT)
 * for this request: as binary data when the request's entry for it says
 * binary_data, or else when binary_data_output is true. A request whose
 * "outputs" names an output other than `output` is refused (400, naming it);
 * one that names none gets every output. */
dlrec_status dlrec_kserve_request_output_binary(const dlrec_kserve_request *r, const char *output, int *binary);

/* ---- responses ---- */

/* A growable byte buffer for response bodies. Writers replace its contents
 * and keep its capacity, so a buffer reused per connection allocates only
 * while responses grow. Zero-initialized is a valid empty buffer. */
typedef struct dlrec_kserve_buf {
  char *data; /* len bytes; NUL-terminated after a JSON-only write, for logging */
  size_t len, cap;
} dlrec_kserve_buf;

void dlrec_kserve_buf_init(dlrec_kserve_buf *b);
void dlrec_kserve_buf_free(dlrec_kserve_buf *b); /* leaves an empty buffer */
/* Makes room for `more` bytes after len (DLREC_ERR_NOMEM on failure). */
dlrec_status dlrec_kserve_buf_reserve(dlrec_kserve_buf *b, size_t more);

/* What an inference response says. */
typedef struct dlrec_kserve_response {
  const char *model_name;    /* required */
  const char *model_version; /* NULL: omitted */
  const char *id;            /* the request's id (NULL: omitted) */
  const float *scores;       /* (rows) OUTPUT0, each finite */
  uint32_t rows;
  int binary;                /* 1: OUTPUT0 as binary data (dlrec_kserve_request_output_binary) */
} dlrec_kserve_response;

/* Writes the response body into b:
 *   {"model_name":"m","model_version":"1","id":"42","outputs":[{"name":"OUTPUT0",
 *    "datatype":"FP32","shape":[B],"data":[0.25,...]}]}
 * with each score printed as "%.9g" (strtof reads back the same float), or,
 * with binary, "parameters":{"binary_data_size":4B} in place of "data" and
 * the B little-endian floats after the JSON. *header_len (may be NULL) is the
 * JSON's length: with binary, the HTTP layer sends it as
 * Inference-Header-Content-Length. A score that is NaN or infinite is a bug
 * upstream and refused (DLREC_ERR_INTERNAL, naming the row, an HTTP 500):
 * JSON cannot carry it, and a client should not get it in binary either. Strings are escaped;
 * bytes that are not UTF-8 become U+FFFD. */
dlrec_status dlrec_kserve_write_response(dlrec_kserve_buf *b, const dlrec_kserve_response *r, size_t *header_len);

/* Writes {"error":"message"} (escaped) into b. */
dlrec_status dlrec_kserve_write_error(dlrec_kserve_buf *b, const char *message);

/* The longest model type name the metadata writer takes (bytes, without
 * the NUL). */
#define DLREC_KSERVE_MAX_TYPE 64

/* Writes the model metadata of GET /v2/models/{name}[/versions/{v}]:
 *   {"name":..,"versions":[version],"platform":"dlrec_<model_type>",
 *    "parameters":{"model_type":"<model_type>"},"inputs":[..],
 *    "outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[-1]}]}
 * model_type is the served network's type ("dlrm", "fm", ..; at most
 * DLREC_KSERVE_MAX_TYPE bytes). inputs lists the HugeCTR-style convention
 * (DES FP32 [1,-1], CATCOLUMN INT64 [1,-1], ROWINDEX INT32 [1,-1]) and, when
 * raw is not NULL (the server has the model's ETL state), the raw one with
 * raw[0] dense and raw[1] categorical input columns (the ETL state's input
 * columns: derived ones are computed from them): dense FP32 [-1,raw[0]],
 * left out when there is no dense input column, and categorical BYTES
 * [-1,raw[1]]; see serve_batch.h. */
dlrec_status dlrec_kserve_write_model_metadata(dlrec_kserve_buf *b, const char *name, const char *version,
                                               const char *model_type, const dlrec_schema *schema,
                                               const uint32_t *raw);

/* Writes the server metadata of GET /v2:
 *   {"name":name,"version":version,"extensions":[...]}
 * extensions NULL: ["binary_tensor_data"]. */
dlrec_status dlrec_kserve_write_server_metadata(dlrec_kserve_buf *b, const char *name, const char *version,
                                                const char *const *extensions, uint32_t n_extensions);

/* The HTTP status for a failed request: 400 for DLREC_ERR_PARSE,
 * DLREC_ERR_INVALID and DLREC_ERR_UNSUPPORTED (the client's fault), 503 for
 * DLREC_ERR_NOMEM, 500 otherwise; 200 for DLREC_OK. */
int dlrec_kserve_http_status(dlrec_status st);

#ifdef __cplusplus
}
#endif
#endif
