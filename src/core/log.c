/* Leveled logging to stderr. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_level = -1; /* -1: not yet read from the environment */

static dlrec_log_level level_from_env(void) {
  const char *e = getenv("DLREC_LOG");
  if (!e) return DLREC_LOG_INFO;
  if (!strcmp(e, "debug")) return DLREC_LOG_DEBUG;
  if (!strcmp(e, "warn")) return DLREC_LOG_WARN;
  if (!strcmp(e, "error")) return DLREC_LOG_ERROR;
  if (!strcmp(e, "off")) return DLREC_LOG_OFF;
  return DLREC_LOG_INFO;
}

void dlrec_log_set_level(dlrec_log_level level) { __atomic_store_n(&g_level, (int)level, __ATOMIC_RELAXED); }

dlrec_log_level dlrec_log_get_level(void) {
  int l = __atomic_load_n(&g_level, __ATOMIC_RELAXED);
  if (l < 0) {
    l = (int)level_from_env();
    __atomic_store_n(&g_level, l, __ATOMIC_RELAXED);
  }
  return (dlrec_log_level)l;
}

void dlrec_log(dlrec_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warning", "error"};
  if (level < dlrec_log_get_level() || level >= DLREC_LOG_OFF) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per message so lines from several threads do not interleave. */
  fprintf(stderr, "dlrec: %s: %s\n", names[level], line);
}
