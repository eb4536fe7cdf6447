/* Shared pieces of the `dlrec` subcommands. */
#include "cli/cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/log.h"
#include "core/progress.h"

int cli_fail(const char *cmd) {
  fprintf(stderr, "dlrec %s: %s\n", cmd, dlrec_last_error()[0] ? dlrec_last_error() : "failed");
  return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "dlrec %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(see 'dlrec %s --help')\n", cmd);
  return 2;
}

dlrec_status cli_parse_device(const char *s, const char **device) {
  const char *backend;
  uint32_t index;
  if (dlrec_device_parse(s, &backend, &index) != DLREC_OK) return dlrec_error_context("--device: ");
  *device = s;
  return DLREC_OK;
}

dlrec_status cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected an integer, got '%s'", opt, s ? s : "");
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  uint64_t mult = 1;
  if (*end == 'k' || *end == 'K') mult = 1000ull, end++;
  else if (*end == 'M') mult = 1000000ull, end++;
  else if (*end == 'G') mult = 1000000000ull, end++;
  if (errno || end == s || *end || (mult > 1 && v > UINT64_MAX / mult))
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected an integer, got '%s'", opt, s);
  v *= mult;
  if (v < min || v > max)
    return dlrec_error(DLREC_ERR_INVALID, "%s: %llu is out of range [%llu, %llu]", opt, v,
                       (unsigned long long)min, (unsigned long long)max);
  *out = v;
  return DLREC_OK;
}

dlrec_status cli_parse_double(const char *opt, const char *s, double min, double max, double *out) {
  if (!s || !*s) return dlrec_error(DLREC_ERR_INVALID, "%s: expected a number, got ''", opt);
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v))
    return dlrec_error(DLREC_ERR_INVALID, "%s: expected a number, got '%s'", opt, s);
  if (v < min || v > max) return dlrec_error(DLREC_ERR_INVALID, "%s: %g is out of range [%g, %g]", opt, v, min, max);
  *out = v;
  return DLREC_OK;
}

int cli_common_option(const char *arg) {
  if (!strcmp(arg, "-q") || !strcmp(arg, "--quiet")) {
    dlrec_progress_enable(0);
    dlrec_log_set_level(DLREC_LOG_WARN);
    return 1;
  }
  if (!strcmp(arg, "-v") || !strcmp(arg, "--verbose")) {
    dlrec_log_set_level(DLREC_LOG_DEBUG);
    return 1;
  }
  return 0;
}
