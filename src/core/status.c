/* Status names and the thread-local error message. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local dlrec_status tl_status = DLREC_OK;
static _Thread_local char tl_message[1024];

const char *dlrec_status_name(dlrec_status st) {
  switch (st) {
  case DLREC_OK: return "ok";
  case DLREC_END: return "end";
  case DLREC_ERR_INVALID: return "invalid argument";
  case DLREC_ERR_IO: return "I/O error";
  case DLREC_ERR_PARSE: return "parse error";
  case DLREC_ERR_CORRUPT: return "corrupt file";
  case DLREC_ERR_VERSION: return "unsupported version";
  case DLREC_ERR_NOMEM: return "out of memory";
  case DLREC_ERR_UNSUPPORTED: return "unsupported";
  case DLREC_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char *dlrec_last_error(void) { return tl_message; }

dlrec_status dlrec_last_status(void) { return tl_status; }

dlrec_status dlrec_error(dlrec_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_message, sizeof tl_message, fmt, ap);
  va_end(ap);
  tl_status = st;
  return st;
}

dlrec_status dlrec_error_context(const char *fmt, ...) {
  char prefix[512], old[sizeof tl_message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, tl_message, sizeof old);
  /* prefix + old, truncated to fit (a long message loses its tail). */
  size_t np = strlen(prefix), no = strlen(old);
  if (np > sizeof tl_message - 1) np = sizeof tl_message - 1;
  if (no > sizeof tl_message - 1 - np) no = sizeof tl_message - 1 - np;
  memcpy(tl_message, prefix, np);
  memcpy(tl_message + np, old, no);
  tl_message[np + no] = '\0';
  return tl_status;
}

void dlrec_clear_error(void) {
  tl_status = DLREC_OK;
  tl_message[0] = '\0';
}

void dlrec_error_save(dlrec_error_copy *e) {
  e->status = tl_status;
  memcpy(e->message, tl_message, sizeof e->message);
}

dlrec_status dlrec_error_restore(const dlrec_error_copy *e) {
  tl_status = e->status;
  memcpy(tl_message, e->message, sizeof tl_message);
  return tl_status;
}
