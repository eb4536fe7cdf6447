/* A growing string (strbuf.h). */
#include "core/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void dlrec_strbuf_printf(dlrec_strbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (len < 0 || b->nomem) return;
  if (b->n + (size_t)len + 1 > b->cap) {
    const size_t cap = 2 * (b->n + (size_t)len + 1);
    char *p = realloc(b->p, cap);
    if (!p) {
      b->nomem = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)len + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)len;
}
