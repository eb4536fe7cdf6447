/* Checks on a request before it is routed: control bytes in the path, the
 * framing headers (the request-smuggling shapes a proxy in front could read
 * differently from us), the model control token (read, and compared in
 * constant time), and the bounds of a body that follow --max-batch, with
 * the pre-scan of its JSON. */
#include <ctype.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/fsutil.h"
#include "serve/serve_internal.h"

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

size_t serve_unescape(void *cls, struct MHD_Connection *c, char *s) {
  (void)cls;
  (void)c;
  char *w = s;
  for (const char *r = s; *r;) {
    int hi, lo;
    if (r[0] == '%' && (hi = hexval(r[1])) >= 0 && (lo = hexval(r[2])) >= 0) {
      int v = hi * 16 + lo;
      *w++ = (char)(v ? v : 0x7f); /* a NUL would end the string: keep it visible as a control byte */
      r += 3;
    } else {
      *w++ = *r++;
    }
  }
  *w = 0;
  return (size_t)(w - s);
}

size_t serve_path_control_byte(const char *url) {
  for (size_t i = 0; url[i]; i++) {
    unsigned char b = (unsigned char)url[i];
    if (b < 0x20 || b == 0x7f) return i + 1;
  }
  return 0;
}

typedef struct framing {
  int n_length;          /* Content-Length headers */
  char length[32];       /* the first one's value */
  int length_differs;    /* another one disagrees */
  int length_bad;        /* one is not a plain decimal number */
  int n_chunked;         /* "chunked" codings over all Transfer-Encoding headers */
  char unknown[64];      /* the first other coding */
} framing;

/* The token of s[0..n) without surrounding blanks, into out. */
static void trimmed(const char *s, size_t n, char *out, size_t cap) {
  while (n && (*s == ' ' || *s == '\t')) s++, n--;
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  if (n >= cap) n = cap - 1;
  memcpy(out, s, n);
  out[n] = 0;
}

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  (void)kind;
  framing *f = cls;
  if (!value) value = "";
  if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    char v[32];
    trimmed(value, strlen(value), v, sizeof v);
    if (!v[0] || strspn(v, "0123456789") != strlen(v)) f->length_bad = 1;
    if (f->n_length++ == 0) snprintf(f->length, sizeof f->length, "%s", v);
    else if (strcmp(f->length, v) != 0) f->length_differs = 1;
  } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    /* A comma-separated list of codings, possibly over several headers. */
    for (const char *p = value;;) {
      const char *e = strchr(p, ',');
      size_t n = e ? (size_t)(e - p) : strlen(p);
      char coding[64];
      trimmed(p, n, coding, sizeof coding);
      if (!strcasecmp(coding, "chunked")) f->n_chunked++;
      else if (!f->unknown[0]) snprintf(f->unknown, sizeof f->unknown, "%s", coding[0] ? coding : "(empty)");
      if (!e) break;
      p = e + 1;
    }
  }
  return MHD_YES;
}

int serve_check_framing(struct MHD_Connection *c, char *msg, size_t cap) {
  framing f;
  memset(&f, 0, sizeof f);
  MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
  if (f.unknown[0]) {
    snprintf(msg, cap, "Transfer-Encoding '%s' is not supported (only chunked)", f.unknown);
    return 501;
  }
  if (f.n_chunked > 1) {
    snprintf(msg, cap, "Transfer-Encoding: chunked given %d times", f.n_chunked);
    return 400;
  }
  if (f.n_length && f.n_chunked) {
    snprintf(msg, cap, "Content-Length together with Transfer-Encoding: chunked (the body's length is ambiguous)");
    return 400;
  }
  if (f.length_differs) {
    snprintf(msg, cap, "%d Content-Length headers that disagree", f.n_length);
    return 400;
  }
  if (f.length_bad) {
    snprintf(msg, cap, "Content-Length '%.20s' is not a byte count", f.length);
    return 400;
  }
  return 0;
}

int serve_token_equal(const char *given, size_t given_len, const char *want, size_t want_len) {
  /* Every byte of the expected token is compared whatever the client sent,
   * so the time taken says nothing about how much of it was right. */
  volatile unsigned char diff = (unsigned char)(given_len != want_len);
  for (size_t i = 0; i < want_len; i++) {
    unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
    diff |= (unsigned char)(g ^ (unsigned char)want[i]);
  }
  return diff == 0;
}

dlrec_status serve_read_token(const char *path, char **out, size_t *out_len) {
  char *text = NULL;
  size_t n = 0;
  dlrec_status s = dlrec_read_file(path, 4096, &text, &n);
  if (s != DLREC_OK) return s;
  while (n && (text[n - 1] == '\n' || text[n - 1] == '\r')) text[--n] = 0;
  for (size_t i = 0; i < n && s == DLREC_OK; i++)
    if ((unsigned char)text[i] <= 0x20 || (unsigned char)text[i] >= 0x7f)
      s = dlrec_error(DLREC_ERR_INVALID, "%s: byte %zu of the model control token is not printable ASCII (or is "
                      "a blank)", path, i);
  if (s == DLREC_OK && n < 16)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: the model control token has %zu characters; use at least 16", path, n);
  if (s != DLREC_OK) {
    free(text);
    return s;
  }
  *out = text;
  *out_len = n;
  return DLREC_OK;
}

/* ---- body bounds that follow --max-batch ---- */

uint64_t serve_values_per_row(const dlrec_schema *s) {
  if (!s) return 0;
  uint64_t v = (uint64_t)s->n_dense + s->n_sparse; /* DES and the raw columns; ROWINDEX */
  for (uint32_t c = 0; c < s->n_sparse; c++) v += s->sparse[c].max_hotness ? s->sparse[c].max_hotness : 1;
  return v;
}

uint64_t serve_default_body_limit(uint32_t max_batch, uint64_t values_per_row) {
  return SERVE_BODY_BASE_BYTES + (uint64_t)max_batch * values_per_row * SERVE_BODY_VALUE_BYTES;
}

/* ---- the pre-scan of a request's JSON ----
 *
 * A tokenizer that keeps a stack of the containers it is in and what each
 * is (the request object, its "inputs" array, an input object, an input's
 * "shape" array), counts values and sums the shapes as it goes. It needs no
 * memory of its own, and stops at the first byte it does not expect,
 * leaving that JSON for cJSON to refuse with its position. */

#define PRESCAN_DEPTH 64

enum { ROLE_OTHER, ROLE_ROOT, ROLE_INPUTS, ROLE_INPUT, ROLE_SHAPE };

typedef struct prescan {
  const char *p, *end;
  const serve_prescan_limits *lim;
  uint32_t depth;
  char kind[PRESCAN_DEPTH];      /* '{' or '[' */
  unsigned char role[PRESCAN_DEPTH];
  uint32_t input;                /* the index of the input being read */
  uint64_t values, elements;
  /* the shape being read */
  uint64_t dims, first, product;
  int shape_ok;
  char *msg;
  size_t cap;
} prescan;

static void skip_ws(prescan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) s->p++;
}

/* A string token (s->p at its quote): 1 past its end, with whether its
 * text is exactly want (no escapes); 0 when unterminated. */
static int scan_string(prescan *s, const char *want, int *is_want) {
  const char *start = ++s->p;
  int escaped = 0;
  while (s->p < s->end && *s->p != '"') {
    if (*s->p == '\\') {
      escaped = 1;
      if (++s->p == s->end) return 0;
    }
    s->p++;
  }
  if (s->p == s->end) return 0;
  size_t n = (size_t)(s->p - start);
  *is_want = want && !escaped && n == strlen(want) && !memcmp(start, want, n);
  s->p++;
  return 1;
}

/* A scalar that is not a string: a number or a literal. Returns 0 on
 * nothing of the kind. A dimension of the shape being read is a plain
 * non-negative integer; anything else makes the shape one for cJSON. */
static int scan_scalar(prescan *s, int in_shape) {
  const char *start = s->p;
  uint64_t v = 0;
  int digits_only = 1, over = 0;
  while (s->p < s->end && (isalnum((unsigned char)*s->p) || *s->p == '-' || *s->p == '+' || *s->p == '.')) {
    if (*s->p >= '0' && *s->p <= '9')
      over |= __builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s->p - '0'), &v);
    else
      digits_only = 0;
    s->p++;
  }
  if (s->p == start) return 0;
  if (in_shape) {
    if (!digits_only) s->shape_ok = 0;
    if (over) v = UINT64_MAX;
    if (s->dims++ == 0) s->first = v;
    if (__builtin_mul_overflow(s->product, v, &s->product)) s->product = UINT64_MAX;
  }
  return 1;
}

/* A shape array has closed: its rows and elements against the limits. */
static int shape_done(prescan *s) {
  if (!s->shape_ok) return 0;
  if (s->dims >= 2 && s->first > s->lim->max_rows) {
    snprintf(s->msg, s->cap, "inputs[%u]: shape [%llu, ...]: %llu rows, more than the limit of %llu per request "
             "(--max-batch; refused before parsing)", s->input, (unsigned long long)s->first,
             (unsigned long long)s->first, (unsigned long long)s->lim->max_rows);
    return 400;
  }
  uint64_t count = s->dims ? s->product : 1;
  if (count > s->lim->max_elements || s->elements > s->lim->max_elements - count) {
    snprintf(s->msg, s->cap, "inputs[%u]: shape with %llu elements: the request's inputs exceed the limit of %llu "
             "elements (--max-batch rows of the model's values; refused before parsing)", s->input,
             (unsigned long long)count, (unsigned long long)s->lim->max_elements);
    return 400;
  }
  s->elements += count;
  return 0;
}

/* One value begins at s->p (a container is pushed); key is the key it is
 * under when its parent is an object. 0: go on; 400: refused; -1: not JSON
 * we follow (stop and leave it to cJSON). */
static int begin_value(prescan *s, int key_inputs, int key_shape) {
  if (++s->values > s->lim->max_values) {
    snprintf(s->msg, s->cap, "request: more than %llu JSON values (--max-batch rows of the model's values; "
             "refused before parsing)", (unsigned long long)s->lim->max_values);
    return 400;
  }
  unsigned char parent = s->depth ? s->role[s->depth - 1] : ROLE_OTHER;
  char c = *s->p;
  if (parent == ROLE_SHAPE && (c == '{' || c == '[' || c == '"')) s->shape_ok = 0; /* a dimension of no number */
  if (c == '{' || c == '[') {
    if (s->depth == PRESCAN_DEPTH) return -1;
    unsigned char role = ROLE_OTHER;
    if (!s->depth && c == '{') role = ROLE_ROOT;
    else if (parent == ROLE_ROOT && key_inputs && c == '[') role = ROLE_INPUTS;
    else if (parent == ROLE_INPUTS && c == '{') role = ROLE_INPUT;
    else if (parent == ROLE_INPUT && key_shape && c == '[') role = ROLE_SHAPE;
    if (role == ROLE_SHAPE) {
      s->dims = 0;
      s->product = 1;
      s->shape_ok = 1;
    }
    s->kind[s->depth] = c;
    s->role[s->depth++] = role;
    s->p++;
    return 0;
  }
  int dummy;
  if (c == '"') return scan_string(s, NULL, &dummy) ? 0 : -1;
  return scan_scalar(s, parent == ROLE_SHAPE) ? 0 : -1;
}

int serve_prescan_json(const char *json, size_t n, const serve_prescan_limits *lim, uint64_t *values, char *msg,
                       size_t cap) {
  prescan s = {.p = json, .end = json + n, .lim = lim, .msg = msg, .cap = cap};
  int st = 0, key_inputs = 0, key_shape = 0, inputs_seen = 0;
  skip_ws(&s);
  if (s.p < s.end) st = begin_value(&s, 0, 0);
  while (!st && s.depth) {
    skip_ws(&s);
    if (s.p == s.end) break;
    char c = *s.p;
    uint32_t top = s.depth - 1;
    if (c == '}' || c == ']') {
      if (c != (s.kind[top] == '{' ? '}' : ']')) break;
      s.p++;
      s.depth--;
      if (s.role[top] == ROLE_SHAPE) st = shape_done(&s);
      if (s.role[top] == ROLE_INPUT) s.input++;
      continue;
    }
    if (c == ',') {
      s.p++;
      continue;
    }
    if (s.kind[top] == '{') { /* a key, a colon, a value */
      if (c != '"') break;
      int known = 0; /* the key is "inputs" in the request, "shape" in an input */
      if (!scan_string(&s, s.role[top] == ROLE_ROOT ? "inputs" : "shape", &known)) break;
      key_inputs = s.role[top] == ROLE_ROOT && known && !inputs_seen; /* cJSON refuses a second one */
      inputs_seen |= key_inputs;
      key_shape = s.role[top] == ROLE_INPUT && known;
      skip_ws(&s);
      if (s.p == s.end || *s.p != ':') break;
      s.p++;
      skip_ws(&s);
      if (s.p == s.end) break;
      st = begin_value(&s, key_inputs, key_shape);
    } else {
      st = begin_value(&s, 0, 0);
    }
  }
  if (values) *values = s.values;
  return st > 0 ? st : 0;
}
