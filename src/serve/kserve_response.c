/* The KServe v2 / Triton HTTP protocol's responses (serve/kserve.h):
 * written by hand into a growing buffer, since a long float array is most
 * of a response and cJSON would build a node per float; errors and
 * metadata too. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/kserve.h"

/* ---- the output buffer ---- */

void dlrec_kserve_buf_init(dlrec_kserve_buf *b) { *b = (dlrec_kserve_buf){NULL, 0, 0}; }

void dlrec_kserve_buf_free(dlrec_kserve_buf *b) {
  free(b->data);
  dlrec_kserve_buf_init(b);
}

dlrec_status dlrec_kserve_buf_reserve(dlrec_kserve_buf *b, size_t more) {
  /* One byte more than asked, for the NUL after JSON. */
  if (more > SIZE_MAX / 2 - b->len)
    return dlrec_error(DLREC_ERR_NOMEM, "response buffer: %zu bytes is too large", more);
  size_t need = b->len + more + 1;
  if (need <= b->cap) return DLREC_OK;
  size_t cap = b->cap * 2 > need ? b->cap * 2 : need;
  if (cap < 256) cap = 256;
  char *d = realloc(b->data, cap);
  if (!d) return dlrec_error(DLREC_ERR_NOMEM, "response buffer: out of memory for %zu bytes", cap);
  b->data = d;
  b->cap = cap;
  return DLREC_OK;
}

/* The appenders below write into room reserved beforehand. */
static void put(dlrec_kserve_buf *b, const char *s, size_t n) {
  memcpy(b->data + b->len, s, n);
  b->len += n;
}
static void puts_(dlrec_kserve_buf *b, const char *s) { put(b, s, strlen(s)); }

static void put_u64(dlrec_kserve_buf *b, uint64_t v) {
  char t[24];
  int k = 0;
  do t[k++] = (char)('0' + v % 10); while (v /= 10);
  while (k) b->data[b->len++] = t[--k];
}

static void put_i64(dlrec_kserve_buf *b, int64_t v) {
  if (v < 0) {
    b->data[b->len++] = '-';
    put_u64(b, (uint64_t)0 - (uint64_t)v);
  } else {
    put_u64(b, (uint64_t)v);
  }
}

/* Bytes an escaped string may take, quotes included: 6 per input byte
 * (\u00XX; an invalid byte's \ufffd is 6 too). */
static size_t str_room(const char *s) { return 6 * strlen(s) + 2; }

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one
 * (overlong forms, surrogates and values past U+10FFFF included). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
  else return 0;
  if (n < len) return 0;
  unsigned v = c & (0x3f >> (len - 1));
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    v = v << 6 | (s[i] & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  return len;
}

/* A JSON string: quotes, backslashes and control bytes escaped; bytes that
 * are not UTF-8 as U+FFFD. Needs str_room(s) bytes. */
static void put_str(dlrec_kserve_buf *b, const char *s) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  b->data[b->len++] = '"';
  for (size_t i = 0; i < n;) {
    unsigned c = p[i];
    if (c >= 0x80) {
      size_t k = utf8_len(p + i, n - i);
      if (k) put(b, (const char *)p + i, k), i += k;
      else puts_(b, "\\ufffd"), i++;
      continue;
    }
    i++;
    switch (c) {
    case '"': puts_(b, "\\\""); break;
    case '\\': puts_(b, "\\\\"); break;
    case '\n': puts_(b, "\\n"); break;
    case '\r': puts_(b, "\\r"); break;
    case '\t': puts_(b, "\\t"); break;
    case '\b': puts_(b, "\\b"); break;
    case '\f': puts_(b, "\\f"); break;
    default:
      if (c < 0x20) {
        char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        put(b, e, 6);
      } else {
        b->data[b->len++] = (char)c;
      }
    }
  }
  b->data[b->len++] = '"';
}

/* ---- responses ---- */

dlrec_status dlrec_kserve_write_response(dlrec_kserve_buf *b, const dlrec_kserve_response *r, size_t *header_len) {
  b->len = 0;
  if (!r->model_name) return dlrec_error(DLREC_ERR_INVALID, "response: no model name");
  if (r->rows && !r->scores) return dlrec_error(DLREC_ERR_INVALID, "response: no scores");
  for (uint32_t i = 0; i < r->rows; i++)
    if (!isfinite(r->scores[i]))
      return dlrec_error(DLREC_ERR_INTERNAL, "response: score of row %u is not finite (%g)", i, (double)r->scores[i]);
  /* "%.9g" of a float takes at most 15 bytes ("-1.17549435e-38"), 16 with its comma. */
  size_t per_row = r->binary ? 4 : 16;
  if (r->rows > (SIZE_MAX / 2) / per_row) return dlrec_error(DLREC_ERR_NOMEM, "response: too many rows");
  size_t room = 200 + str_room(r->model_name) + (r->model_version ? str_room(r->model_version) : 0) +
                (r->id ? str_room(r->id) : 0) + (size_t)r->rows * per_row;
  dlrec_status st = dlrec_kserve_buf_reserve(b, room);
  if (st != DLREC_OK) return st;
  puts_(b, "{\"model_name\":");
  put_str(b, r->model_name);
  if (r->model_version) {
    puts_(b, ",\"model_version\":");
    put_str(b, r->model_version);
  }
  if (r->id) {
    puts_(b, ",\"id\":");
    put_str(b, r->id);
  }
  puts_(b, ",\"outputs\":[{\"name\":\"" DLREC_KSERVE_OUTPUT "\",\"datatype\":\"FP32\",\"shape\":[");
  put_u64(b, r->rows);
  if (r->binary) {
    puts_(b, "],\"parameters\":{\"binary_data_size\":");
    put_u64(b, (uint64_t)r->rows * 4);
    puts_(b, "}}]}");
    if (header_len) *header_len = b->len;
    if (r->rows) put(b, (const char *)r->scores, (size_t)r->rows * 4); /* little-endian host */
    return DLREC_OK;
  }
  puts_(b, "],\"data\":[");
  for (uint32_t i = 0; i < r->rows; i++) {
    if (i) b->data[b->len++] = ',';
    b->len += (size_t)snprintf(b->data + b->len, 16, "%.9g", (double)r->scores[i]);
  }
  puts_(b, "]}]}");
  b->data[b->len] = '\0';
  if (header_len) *header_len = b->len;
  return DLREC_OK;
}

dlrec_status dlrec_kserve_write_error(dlrec_kserve_buf *b, const char *message) {
  b->len = 0;
  if (!message) message = "";
  dlrec_status st = dlrec_kserve_buf_reserve(b, 16 + str_room(message));
  if (st != DLREC_OK) return st;
  puts_(b, "{\"error\":");
  put_str(b, message);
  puts_(b, "}");
  b->data[b->len] = '\0';
  return DLREC_OK;
}

/* {"name":"N","datatype":"T","shape":[a,b]} with -1 for a negative dim. */
static void put_tensor_meta(dlrec_kserve_buf *b, const char *name, const char *dtype, int64_t d0, int64_t d1,
                            int rank) {
  puts_(b, "{\"name\":\"");
  puts_(b, name);
  puts_(b, "\",\"datatype\":\"");
  puts_(b, dtype);
  puts_(b, "\",\"shape\":[");
  put_i64(b, d0);
  if (rank == 2) {
    b->data[b->len++] = ',';
    put_i64(b, d1);
  }
  puts_(b, "]}");
}

dlrec_status dlrec_kserve_write_model_metadata(dlrec_kserve_buf *b, const char *name, const char *version,
                                               const char *model_type, const dlrec_schema *schema,
                                               const uint32_t *raw) {
  b->len = 0;
  if (!name || !version || !model_type || !schema)
    return dlrec_error(DLREC_ERR_INVALID, "model metadata: NULL argument");
  /* The platform tells a client which model type answers, so that a reload
   * to another type (dlrm -> fm) is visible in the metadata; the type alone
   * is repeated in parameters for clients that do not parse the platform. */
  char platform[DLREC_KSERVE_MAX_TYPE + 8];
  if (snprintf(platform, sizeof platform, "dlrec_%s", model_type) >= (int)sizeof platform)
    return dlrec_error(DLREC_ERR_INVALID, "model metadata: model type '%.40s' too long", model_type);
  dlrec_status st = dlrec_kserve_buf_reserve(b, 1024 + str_room(name) + str_room(version) + 2 * str_room(platform));
  if (st != DLREC_OK) return st;
  puts_(b, "{\"name\":");
  put_str(b, name);
  puts_(b, ",\"versions\":[");
  put_str(b, version);
  puts_(b, "],\"platform\":");
  put_str(b, platform);
  puts_(b, ",\"parameters\":{\"model_type\":");
  put_str(b, model_type);
  puts_(b, "},\"inputs\":[");
  if (raw) {
    /* A model without dense columns takes no dense input (it may be left
     * out of a request), so none is listed. */
    if (raw[0]) {
      put_tensor_meta(b, "dense", "FP32", -1, raw[0], 2);
      b->data[b->len++] = ',';
    }
    put_tensor_meta(b, "categorical", "BYTES", -1, raw[1], 2);
    b->data[b->len++] = ',';
  }
  put_tensor_meta(b, "DES", "FP32", 1, -1, 2);
  b->data[b->len++] = ',';
  put_tensor_meta(b, "CATCOLUMN", "INT64", 1, -1, 2);
  b->data[b->len++] = ',';
  put_tensor_meta(b, "ROWINDEX", "INT32", 1, -1, 2);
  puts_(b, "],\"outputs\":[");
  put_tensor_meta(b, DLREC_KSERVE_OUTPUT, "FP32", -1, 0, 1);
  puts_(b, "]}");
  b->data[b->len] = '\0';
  return DLREC_OK;
}

dlrec_status dlrec_kserve_write_server_metadata(dlrec_kserve_buf *b, const char *name, const char *version,
                                                const char *const *extensions, uint32_t n_extensions) {
  static const char *const dflt[] = {"binary_tensor_data"};
  b->len = 0;
  if (!name || !version) return dlrec_error(DLREC_ERR_INVALID, "server metadata: NULL argument");
  if (!extensions) extensions = dflt, n_extensions = 1;
  size_t room = 64 + str_room(name) + str_room(version);
  for (uint32_t i = 0; i < n_extensions; i++) room += 1 + str_room(extensions[i]);
  dlrec_status st = dlrec_kserve_buf_reserve(b, room);
  if (st != DLREC_OK) return st;
  puts_(b, "{\"name\":");
  put_str(b, name);
  puts_(b, ",\"version\":");
  put_str(b, version);
  puts_(b, ",\"extensions\":[");
  for (uint32_t i = 0; i < n_extensions; i++) {
    if (i) b->data[b->len++] = ',';
    put_str(b, extensions[i]);
  }
  puts_(b, "]}");
  b->data[b->len] = '\0';
  return DLREC_OK;
}
