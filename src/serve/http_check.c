/* Checks on a request before it is routed: control bytes in the path, the
 * framing headers (the request-smuggling shapes a proxy in front could read
 * differently from us), and the constant-time comparison of the model
 * control token. */
#include <microhttpd.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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
