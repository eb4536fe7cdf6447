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
#include "core/options.h"
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
  return dlrec_opt_parse_u64(opt, s, min, max, out);
}

dlrec_status cli_parse_double(const char *opt, const char *s, double min, double max, double *out) {
  return dlrec_opt_parse_double(opt, s, min, max, out);
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
