/* The monotonic clock that profiles, rates, deadlines and progress read. */
#ifndef DLREC_CLOCK_H
#define DLREC_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC: only differences mean anything. */
static inline double dlrec_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
