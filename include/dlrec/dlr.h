/* .dlr files: encoded rows in columnar row groups, checksummed, mmap-able.
 * The byte layout is specified in docs/formats.md.
 *
 * Writing is append-only and atomic: rows go to PATH.tmp, and only
 * dlrec_dlr_writer_finish makes PATH appear, complete. Reading maps the file
 * and validates the header and row-group index up front; each row group's
 * payload checksum is checked by dlrec_dlr_verify (the loader verifies each
 * row group before first use).
 */
#ifndef DLREC_DLR_H
#define DLREC_DLR_H

#include <stdint.h>

#include "dlrec/schema.h"
#include "dlrec/status.h"

#define DLREC_DLR_VERSION 1

/* A view of one row group's columns. For writing, the caller's buffers; for
 * reading, pointers into the mapped file (valid until dlrec_dlr_close). */
typedef struct dlrec_rowgroup {
  uint32_t rows;
  const float *labels;                       /* (rows); NULL when the schema has no label */
  const float *dense;                        /* (rows, n_dense), row-major */
  const uint32_t *offsets[DLREC_MAX_SPARSE]; /* (rows + 1), starting at 0; NULL for fixed-hotness columns */
  const uint32_t *ids[DLREC_MAX_SPARSE];     /* (nnz) global ids, nnz = offsets[rows] or rows * hotness */
} dlrec_rowgroup;

/* ---- writing ---- */
typedef struct dlrec_dlr_writer dlrec_dlr_writer;

/* Starts PATH.tmp for rows of schema s (validated). */
dlrec_status dlrec_dlr_writer_open(dlrec_dlr_writer **w, const char *path, const dlrec_schema *s);

/* Appends one row group (1 <= rows <= DLREC_DLR_MAX_GROUP_ROWS). Ids are
 * checked against their column's range and offsets against the hotness; a
 * bad one is an error naming the column and row. */
#define DLREC_DLR_MAX_GROUP_ROWS (1u << 24)
dlrec_status dlrec_dlr_writer_append(dlrec_dlr_writer *w, const dlrec_rowgroup *rg);

/* Rows appended so far. */
uint64_t dlrec_dlr_writer_rows(const dlrec_dlr_writer *w);

/* Writes the index and the final header, fsyncs, renames PATH.tmp to PATH,
 * and frees w (also on failure). */
dlrec_status dlrec_dlr_writer_finish(dlrec_dlr_writer *w);

/* Discards PATH.tmp and frees w. Accepts NULL. */
void dlrec_dlr_writer_abort(dlrec_dlr_writer *w);

/* ---- reading ---- */
typedef struct dlrec_dlr dlrec_dlr;

/* Maps PATH and validates header, schema and index against the file size.
 * Errors name the file and the byte offset of what is wrong. */
dlrec_status dlrec_dlr_open(dlrec_dlr **f, const char *path);
void dlrec_dlr_close(dlrec_dlr *f); /* accepts NULL */

const char *dlrec_dlr_path(const dlrec_dlr *f);
const dlrec_schema *dlrec_dlr_schema(const dlrec_dlr *f);
uint64_t dlrec_dlr_rows(const dlrec_dlr *f);
uint32_t dlrec_dlr_row_groups(const dlrec_dlr *f);
/* Rows of row group i, and the row number of its first row in the file. */
uint32_t dlrec_dlr_group_rows(const dlrec_dlr *f, uint32_t i);
uint64_t dlrec_dlr_group_first_row(const dlrec_dlr *f, uint32_t i);

/* Views of row group i's columns (no copy; structure validated, checksum not). */
dlrec_status dlrec_dlr_row_group(const dlrec_dlr *f, uint32_t i, dlrec_rowgroup *out);

/* Checks row group i's CRC32C and that every id lies in its column's range
 * and offsets are monotone; the error names the file, row group and offset. */
dlrec_status dlrec_dlr_verify(const dlrec_dlr *f, uint32_t i);

#endif
