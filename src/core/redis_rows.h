/* Embedding rows in Redis: the tier a trainer publishes updated rows to and
 * servers read them from (docs/serving.md, "The Redis tier").
 *
 * A row is the Redis string PREFIX:KEY (KEY in decimal: the row's id, or a
 * hash table's raw key) holding its dim floats as little-endian fp32, then
 * the 8-byte little-endian id of the run that wrote it, then a 4-byte
 * little-endian CRC-32C of the key (8 bytes, little-endian) and the bytes
 * before the CRC (the floats and the run id). A publish's step and run are
 * PREFIX:step (the step, decimal) and PREFIX:run ("RUN ETL STEP": the run id
 * in 16 hex digits, its ETL state's checksum in 8, the step in decimal),
 * set together. A value read back is a row only when its size, its checksum
 * and every value's finiteness hold (anything else under a row's key,
 * another table's row, a value written by another tool, random bytes, NaN
 * or inf, is counted as rejected), and when its run is the client's: a row
 * of another run (another seed, another config, a run trained on another
 * ETL state, all publishing under one prefix) is counted as foreign. Either
 * way the caller's table answers for it. Writes are pipelined SETs, reads
 * one MGET per call, each bounded by the timeout.
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
  uint64_t foreign;     /* rows of another run (size and checksum right, another run id) */
  uint64_t connects;    /* connections made (the first, then reconnections) */
} dlrec_redis_stats;

/* Whose rows: a training run's id (64 random bits drawn when a run first
 * publishes, kept by its checkpoints' manifests as run_id and by a resumed
 * run; 0: a run that never published, which no row matches) and the
 * checksum of the ETL state it trained on (etl.json's state_crc32c). */
typedef struct dlrec_redis_run {
  uint64_t id;
  uint32_t etl_crc;
} dlrec_redis_run;

/* A publish, as PREFIX:run records the last one. */
typedef struct dlrec_redis_publish {
  dlrec_redis_run run;
  uint64_t step;
} dlrec_redis_publish;

/* addr "HOST:PORT" (an IPv4 address or a name; PORT 1..65535); prefix at
 * most 200 bytes; dim the floats per row (1..1024); timeout_ms bounds the
 * connect and each call (1..60000); retry_ms is the least time between two
 * connection attempts. A malformed argument is DLREC_ERR_INVALID; an
 * unreachable server is not an error here (the first call finds out). The
 * client's run is id 0 (it writes no rows, and reads none as its own)
 * until dlrec_redis_rows_set_run. */
dlrec_status dlrec_redis_rows_open(dlrec_redis_rows **r, const char *addr, const char *prefix, uint32_t dim,
                                   uint32_t timeout_ms, uint32_t retry_ms);
void dlrec_redis_rows_close(dlrec_redis_rows *r); /* accepts NULL */
/* The run whose rows the client writes and reads (copied). */
void dlrec_redis_rows_set_run(dlrec_redis_rows *r, const dlrec_redis_run *run);

/* SETs n rows (row i: keys[i] -> rows + i * dim) as the client's run's and,
 * when step is not UINT64_MAX, PREFIX:step and PREFIX:run, in one pipeline.
 * A client of run id 0 writes nothing (DLREC_ERR_INVALID). */
dlrec_status dlrec_redis_rows_put(dlrec_redis_rows *r, const uint64_t *keys, const float *rows, size_t n,
                                  uint64_t step);

/* MGETs n rows: for each key Redis holds a row of the client's run (the
 * checks above), found[i] = 1 and the row copied to rows + i * dim; else
 * found[i] = 0 (a value that is not a row counts as rejected, another
 * run's row as foreign, and neither is used). */
dlrec_status dlrec_redis_rows_get(dlrec_redis_rows *r, const uint64_t *keys, size_t n, float *rows, uint8_t *found);

/* GETs PREFIX:run: *found = 1 and the last publish into *out, or *found = 0
 * when Redis holds none. A value that is not a publish record is
 * DLREC_ERR_CORRUPT (*found = 0), Redis unreachable DLREC_ERR_IO. */
dlrec_status dlrec_redis_rows_last_publish(dlrec_redis_rows *r, dlrec_redis_publish *out, int *found);

void dlrec_redis_rows_stats(const dlrec_redis_rows *r, dlrec_redis_stats *out);

#endif
