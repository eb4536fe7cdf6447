/* Shared pieces of the `dlrec` subcommands. */
#ifndef DLREC_CLI_H
#define DLREC_CLI_H

#include <stdint.h>

#include "core/status.h"

/* Each subcommand: argv[0] is its name; returns the process exit code. */
int cmd_synth(int argc, char **argv);
int cmd_etl(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_options(int argc, char **argv);
int cmd_models(int argc, char **argv);

/* Prints "dlrec CMD: " + dlrec_last_error() to stderr and returns 1. */
int cli_fail(const char *cmd);
/* Prints "dlrec CMD: " + message (printf-style) to stderr and returns 2 (usage error). */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Strict number parsing for option values: the whole string must be a number
 * in range; the error names the option ("--rows: expected a positive integer,
 * got 'x'"). Accepts k/M/G suffixes (powers of 1000) for counts. */
/* --device D: D checked by dlrec_device_parse, then *device = D. */
dlrec_status cli_parse_device(const char *s, const char **device);
dlrec_status cli_parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out);
dlrec_status cli_parse_double(const char *opt, const char *s, double min, double max, double *out);

/* Applies the options every subcommand takes: -q/--quiet (no progress, warnings
 * only) and -v/--verbose (debug logs). Returns 1 if argv[i] was one of them. */
int cli_common_option(const char *arg);

#endif
