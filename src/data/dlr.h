/* .dlr files: encoded rows in columnar row groups, checksummed, mmap-able.
 * The byte layout is specified in docs/formats.md ("## .dlr data files").
 *
 * Writing is append-only and atomic: rows go to PATH.tmp, and only
 * dlrec_dlr_writer_finish makes PATH appear, complete. Reading maps the file
 * and validates the header, the row-group index and every row group's layout
 * against the file size up front; each row group's payload checksum is
 * checked by dlrec_dlr_verify (the loader verifies each row group before
 * first use).
 *
 * Files are little-endian; dlrec builds only for little-endian hosts, so the
 * mapped columns are used in place.
 */
#ifndef DLREC_DLR_H
#define DLREC_DLR_H

#include <stddef.h>
#include <stdint.h>

#include "data/schema.h"
#include "core/status.h"

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

/* Starts PATH.tmp for rows of schema s (validated); a stale PATH.tmp from a
 * crashed writer is replaced. On success the caller owns *w and must end it
 * with dlrec_dlr_writer_finish or dlrec_dlr_writer_abort. */
dlrec_status dlrec_dlr_writer_open(dlrec_dlr_writer **w, const char *path, const dlrec_schema *s);

/* Appends one row group (1 <= rows <= DLREC_DLR_MAX_GROUP_ROWS). Ids are
 * checked against their column's range and offsets against the hotness; a
 * bad one is an error naming the column and row, and leaves the writer usable
 * (nothing was written). An I/O error leaves it failed: later calls return
 * the error again, and only abort remains useful. The caller's buffers are
 * not kept. */
#define DLREC_DLR_MAX_GROUP_ROWS (1u << 24)
dlrec_status dlrec_dlr_writer_append(dlrec_dlr_writer *w, const dlrec_rowgroup *rg);

/* Rows appended so far. */
uint64_t dlrec_dlr_writer_rows(const dlrec_dlr_writer *w);

/* Writes the index and the final header, fsyncs, renames PATH.tmp to PATH,
 * and frees w (also on failure, when PATH.tmp is removed and PATH untouched). */
dlrec_status dlrec_dlr_writer_finish(dlrec_dlr_writer *w);

/* Discards PATH.tmp and frees w. Accepts NULL. */
void dlrec_dlr_writer_abort(dlrec_dlr_writer *w);

/* ---- reading ---- */
typedef struct dlrec_dlr dlrec_dlr;

/* Maps PATH and validates header, schema, index and the layout of every row
 * group against the file size; no pointer handed out later can leave the
 * file. Errors name the file and the byte offset of what is wrong: a newer
 * format version is DLREC_ERR_VERSION, anything else wrong in the bytes
 * DLREC_ERR_CORRUPT (a file whose writer never finished included). */
dlrec_status dlrec_dlr_open(dlrec_dlr **f, const char *path);

/* As dlrec_dlr_open, on n bytes at data (not copied: they must stay valid
 * and unchanged until dlrec_dlr_close). data must be 64-byte aligned, as a
 * mapping is, so that the columns can be used in place. `name` names the
 * bytes in errors. For tests, fuzzing and files already in memory. */
dlrec_status dlrec_dlr_open_buffer(dlrec_dlr **f, const void *data, size_t n, const char *name);

void dlrec_dlr_close(dlrec_dlr *f); /* accepts NULL */

/* Whether PATH is a .dlr file that its writer has not finished (yet): empty,
 * the first bytes of a header, or a whole header whose checksum holds but
 * whose complete flag is unset (dlrec_dlr_writer_finish sets it last) or
 * that promises more bytes than the file has so far (a finished file still
 * being copied in). 1: unfinished; 0: anything else (whole, not a .dlr
 * file, not a regular file, unreadable), which dlrec_dlr_open then judges.
 * Reads the header only. */
int dlrec_dlr_unfinished(const char *path);

const char *dlrec_dlr_path(const dlrec_dlr *f);
const dlrec_schema *dlrec_dlr_schema(const dlrec_dlr *f);
uint64_t dlrec_dlr_rows(const dlrec_dlr *f);
uint32_t dlrec_dlr_row_groups(const dlrec_dlr *f);
/* Rows of row group i, and the row number of its first row in the file. */
uint32_t dlrec_dlr_group_rows(const dlrec_dlr *f, uint32_t i);
uint64_t dlrec_dlr_group_first_row(const dlrec_dlr *f, uint32_t i);

/* The file's format version and size in bytes. */
uint32_t dlrec_dlr_version(const dlrec_dlr *f);
uint64_t dlrec_dlr_file_bytes(const dlrec_dlr *f);

/* Where row group i lies in the file, and its stored checksum. */
typedef struct dlrec_dlr_group_info {
  uint64_t offset;    /* byte offset of the group in the file */
  uint64_t bytes;     /* bytes of the group, padding included (what the CRC covers) */
  uint64_t first_row; /* row number of its first row in the file */
  uint32_t rows;
  uint32_t crc; /* CRC32C stored in the index */
} dlrec_dlr_group_info;
void dlrec_dlr_group_info_get(const dlrec_dlr *f, uint32_t i, dlrec_dlr_group_info *out);

/* A 64-bit identity of the file's content: a hash of its header and index,
 * which holds every row group's checksum. Two files with the same schema and
 * rows have the same fingerprint wherever they live; the loader uses it to
 * tie a saved position to its files. */
uint64_t dlrec_dlr_fingerprint(const dlrec_dlr *f);

/* Views of row group i's columns (no copy; layout validated, checksum not).
 * i < dlrec_dlr_row_groups(f). */
dlrec_status dlrec_dlr_row_group(const dlrec_dlr *f, uint32_t i, dlrec_rowgroup *out);

/* Checks row group i's CRC32C and that every id lies in its column's range
 * and offsets are monotone, start at 0 and give no row more than max_hotness
 * ids; the error names the file, row group and byte offset. O(group bytes). */
dlrec_status dlrec_dlr_verify(const dlrec_dlr *f, uint32_t i);

/* The part of dlrec_dlr_verify that reading needs to stay in bounds: the
 * offsets of variable-hotness columns are monotone and each row has at most
 * max_hotness ids (no checksum, no id ranges). O(rows) per variable column;
 * DLREC_OK at once when every column has a fixed hotness. */
dlrec_status dlrec_dlr_check_offsets(const dlrec_dlr *f, uint32_t i);

/* Hints the kernel to read row group i ahead (madvise WILLNEED); a no-op for
 * buffers. Never fails: it is only advice. */
void dlrec_dlr_prefetch(const dlrec_dlr *f, uint32_t i);

#endif
