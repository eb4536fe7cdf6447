/* Leveled logging to stderr.
 *
 * The level comes from dlrec_log_set_level() (the CLI's -v / -q) or the
 * environment variable DLREC_LOG=debug|info|warn|error. Messages below the
 * level cost one comparison.
 */
#ifndef DLREC_LOG_H
#define DLREC_LOG_H

typedef enum dlrec_log_level {
  DLREC_LOG_DEBUG = 0,
  DLREC_LOG_INFO = 1,
  DLREC_LOG_WARN = 2,
  DLREC_LOG_ERROR = 3,
  DLREC_LOG_OFF = 4,
} dlrec_log_level;

void dlrec_log_set_level(dlrec_log_level level);
dlrec_log_level dlrec_log_get_level(void);
void dlrec_log(dlrec_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DLREC_DEBUG(...) do { if (dlrec_log_get_level() <= DLREC_LOG_DEBUG) dlrec_log(DLREC_LOG_DEBUG, __VA_ARGS__); } while (0)
#define DLREC_INFO(...) do { if (dlrec_log_get_level() <= DLREC_LOG_INFO) dlrec_log(DLREC_LOG_INFO, __VA_ARGS__); } while (0)
#define DLREC_WARN(...) do { if (dlrec_log_get_level() <= DLREC_LOG_WARN) dlrec_log(DLREC_LOG_WARN, __VA_ARGS__); } while (0)
#define DLREC_ERROR(...) dlrec_log(DLREC_LOG_ERROR, __VA_ARGS__)

#endif
