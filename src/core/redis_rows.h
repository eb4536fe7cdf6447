/* Embedding rows in Redis: the tier a trainer publishes updated rows to and
 * servers read them from (docs/serving.md, "The Redis tier").
 *
 * A row is the Redis string PREFIX:KEY (KEY in decimal: the row's id, or a
 * hash table's raw key) holding its dim floats as little-endian fp32, then
 * a 4-byte little-endian CRC-32C of the key (8 bytes, little-endian) and
 * those floats' bytes; the step of the last publish is PREFIX:step. A value
 * read back is a row only when its size, its checksum and every value's
 * finiteness hold: anything else under a row's key (another table's row,
 * a value written by another tool, random bytes, NaN or inf) is refused,
 * counted as rejected, and the caller's table answers for it. Writes are
 * pipelined SETs, reads one MGET per call, each bounded by the timeout.
 *
 * Redis being down or slow is not an error of the caller's work: a call that
 * cannot reach it returns DLREC_ERR_IO (found nothing, wrote nothing), and
 * the client reconnects on a later call, at most once per retry interval,
 * so a dead server costs one timeout per interval, not one per call. One
 * client per thread: it is not thread-safe.
 */
#ifndef DLREC_REDIS_ROWS_H
#define DLREC_REDIS_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dlrec_redis_rows dlrec_redis_rows;

#define DLREC_REDIS_MAX_DIM 1024 /* floats of a row */

typedef struct dlrec_redis_stats {
  uint64_t gets, hits;  /* rows asked for, and found */
  uint64_t puts;        /* rows written */
  uint64_t errors;      /* calls that could not reach Redis (or got a bad answer) */
  uint64_t rejected;    /* values under a row's key that were not a row: size, checksum, not finite */
  uint64_t connects;    /* connections made (the first, then reconnections) */
} dlrec_redis_stats;

/* addr "HOST:PORT" (an IPv4 address or a name; PORT 1..65535); prefix at
 * most 200 bytes; dim the floats per row (1..1024); timeout_ms bounds the
 * connect and each call (1..60000); retry_ms is the least time between two
 * connection attempts. A malformed argument is DLREC_ERR_INVALID; an
 * unreachable server is not an error here (the first call finds out). */
dlrec_status dlrec_redis_rows_open(dlrec_redis_rows **r, const char *addr, const char *prefix, uint32_t dim,
                                   uint32_t timeout_ms, uint32_t retry_ms);
void dlrec_redis_rows_close(dlrec_redis_rows *r); /* accepts NULL */

/* SETs n rows (row i: keys[i] -> rows + i * dim) and, when step is not
 * UINT64_MAX, PREFIX:step, in one pipeline. */
dlrec_status dlrec_redis_rows_put(dlrec_redis_rows *r, const uint64_t *keys, const float *rows, size_t n,
                                  uint64_t step);

/* MGETs n rows: for each key Redis holds a row of (the checks above),
 * found[i] = 1 and the row copied to rows + i * dim; else found[i] = 0 (a
 * value that is not a row counts as rejected and is not used). */
dlrec_status dlrec_redis_rows_get(dlrec_redis_rows *r, const uint64_t *keys, size_t n, float *rows, uint8_t *found);

void dlrec_redis_rows_stats(const dlrec_redis_rows *r, dlrec_redis_stats *out);

#endif
