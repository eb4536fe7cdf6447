/* A growing NUL-terminated string, built by printf-style appends (the
 * options' reference tables, the lines ranks compare at the start of a
 * job). */
#ifndef DLREC_STRBUF_H
#define DLREC_STRBUF_H

#include <stddef.h>

typedef struct dlrec_strbuf {
  char *p;   /* the text, NUL-terminated; NULL until the first append; free() it */
  size_t n;  /* its length */
  size_t cap;
  int nomem; /* an append failed for memory: the text ends before it, and later appends add nothing */
} dlrec_strbuf;

/* Appends the formatted text (from {0}: an empty string). */
void dlrec_strbuf_printf(dlrec_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
