/* A progress bar on stderr for long work.
 *
 * On a terminal it redraws one line at most 10 times a second with the done
 * count, rate and ETA; when stderr is not a terminal (CI, logs) it prints a
 * plain line every 10 seconds instead. dlrec_progress_add is thread-safe and
 * cheap (an atomic add and a clock read every 4096 calls), so workers can call
 * it per chunk. Disabled by dlrec_progress_enable(0) (the CLI's -q) or by the
 * environment variable DLREC_PROGRESS=0.
 */
#ifndef DLREC_PROGRESS_H
#define DLREC_PROGRESS_H

#include <stdint.h>

typedef struct dlrec_progress dlrec_progress;

void dlrec_progress_enable(int on);

/* Starts a bar for `what` counting `unit`s ("rows", "bytes", "samples");
 * total 0 means unknown (no ETA, no percentage). Returns NULL only when out of
 * memory; every function accepts NULL and does nothing. */
dlrec_progress *dlrec_progress_start(const char *what, uint64_t total, const char *unit);

/* Adds n done units; redraws if it is time. */
void dlrec_progress_add(dlrec_progress *p, uint64_t n);

/* Sets a short text shown after the rate ("loss 0.4512"); thread-safe. */
void dlrec_progress_note(dlrec_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints the final line (done, time, mean rate) and frees the bar. */
void dlrec_progress_finish(dlrec_progress *p);

#endif
