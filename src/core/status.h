/* Status codes and the thread-local error message.
 *
 * Every function that can fail returns a dlrec_status. On failure it leaves a
 * message for dlrec_last_error() that names what went wrong and, where input
 * is at fault, the file, line and field ("day_0.tsv:17: field 3: not an
 * integer: 'abc'"). Library code never exits; executables decide how to die.
 */
#ifndef DLREC_STATUS_H
#define DLREC_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dlrec_status {
  DLREC_OK = 0,
  DLREC_END = 1,                /* not an error: an iteration has finished */
  DLREC_ERR_INVALID = -1,       /* bad argument, option or configuration */
  DLREC_ERR_IO = -2,            /* open/read/write/rename failed */
  DLREC_ERR_PARSE = -3,         /* malformed text input (rows, JSON, schema) */
  DLREC_ERR_CORRUPT = -4,       /* checksum, magic, size or bound mismatch in a binary file */
  DLREC_ERR_VERSION = -5,       /* a file written by an incompatible version */
  DLREC_ERR_NOMEM = -6,         /* allocation failed */
  DLREC_ERR_UNSUPPORTED = -7,   /* valid request this build cannot do */
  DLREC_ERR_INTERNAL = -8,      /* a bug in dlrec */
} dlrec_status;

/* The status's name, e.g. "parse error". Never NULL. */
const char *dlrec_status_name(dlrec_status st);

/* The message left by the last failing call on this thread ("" if none).
 * Valid until the next call that sets an error on this thread. */
const char *dlrec_last_error(void);

/* The status that went with dlrec_last_error(). */
dlrec_status dlrec_last_status(void);

/* Sets this thread's error message (printf-style) and returns st, so that
 * `return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));` works. */
dlrec_status dlrec_error(dlrec_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends context to this thread's message ("loading run/: " + message)
 * and returns the status that went with it. */
dlrec_status dlrec_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Clears this thread's error. */
void dlrec_clear_error(void);

/* Copies of an error, to carry it from a worker thread to the caller's. */
typedef struct dlrec_error_copy {
  dlrec_status status;
  char message[1024];
} dlrec_error_copy;
void dlrec_error_save(dlrec_error_copy *e);            /* this thread's error -> e */
dlrec_status dlrec_error_restore(const dlrec_error_copy *e); /* e -> this thread's error */

#ifdef __cplusplus
}
#endif
#endif
