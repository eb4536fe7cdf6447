/* The .dlr byte layout, shared by the writer (dlr_write.c) and the reader
 * (dlr_read.c). docs/formats.md is the specification; this file is its
 * transcription, and the two must change together (with the version).
 *
 *   file   = header | row group 0 | ... | row group G-1 | index
 *   header = fixed fields (DLR_HDR_FIXED bytes) | dense names | sparse records
 *            | zero padding | CRC32C of everything before it (last 4 bytes)
 *   group  = group header (magic, rows, number, nnz per sparse column)
 *            | labels f32 | dense f32 (rows, n_dense) | per sparse column:
 *              offsets u32 (rows + 1, variable hotness only), ids u32 (nnz)
 *   index  = magic, group count, per group (offset, bytes, rows, crc), CRC32C
 *
 * Every header, group and section starts at a multiple of 64 bytes from the
 * start of the file, so a mapping (page-aligned) gives aligned columns.
 */
#ifndef DLREC_DLR_FORMAT_H
#define DLREC_DLR_FORMAT_H

#include <stdint.h>
#include <string.h>

#include "data/dlr.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error ".dlr files are little-endian and are used in place: dlrec needs a little-endian host"
#endif

/* "\x89DLR\r\n\x1a\n": the high byte catches 7-bit transfers and the line
 * endings catch text-mode conversions, as in PNG. */
static const unsigned char DLR_MAGIC[8] = {0x89, 'D', 'L', 'R', '\r', '\n', 0x1a, '\n'};

#define DLR_ALIGN 64u

/* Header fields (byte offsets). */
#define DLR_HDR_MAGIC 0
#define DLR_HDR_VERSION 8
#define DLR_HDR_BYTES 12
#define DLR_HDR_FLAGS 16
#define DLR_HDR_N_DENSE 20
#define DLR_HDR_N_SPARSE 24
#define DLR_HDR_RESERVED 28
#define DLR_HDR_ROWS 32
#define DLR_HDR_GROUPS 40
#define DLR_HDR_INDEX_OFFSET 48
#define DLR_HDR_TABLE_ROWS 56
#define DLR_HDR_LABEL_NAME 64
#define DLR_HDR_FIXED 112 /* the dense names follow */

#define DLR_FLAG_COMPLETE 1u /* set only by dlrec_dlr_writer_finish */
#define DLR_FLAG_HAS_LABEL 2u
#define DLR_FLAG_KEYS 4u /* the sparse columns hold raw 64-bit keys (dlrec_schema.keys) */
#define DLR_FLAGS_KNOWN (DLR_FLAG_COMPLETE | DLR_FLAG_HAS_LABEL | DLR_FLAG_KEYS)

/* A sparse column record: name[48], hotness u32, max_hotness u32,
 * id_begin u64, id_end u64. */
#define DLR_SPARSE_REC 72

/* Group header: magic u32, rows u32, group number u32, reserved u32, then
 * nnz u64 per sparse column. */
#define DLR_GROUP_MAGIC 0x47524c44u /* "DLRG" */
#define DLR_GROUP_FIXED 16

/* Index: magic u32, reserved u32, group count u64, entries, CRC32C u32. */
#define DLR_INDEX_MAGIC 0x49524c44u /* "DLRI" */
#define DLR_INDEX_FIXED 16
#define DLR_INDEX_ENTRY 24 /* offset u64, bytes u64, rows u32, crc u32 */

static inline uint64_t dlr_align(uint64_t x) { return (x + DLR_ALIGN - 1) & ~(uint64_t)(DLR_ALIGN - 1); }

static inline uint64_t dlr_header_bytes(uint32_t n_dense, uint32_t n_sparse) {
  return dlr_align(DLR_HDR_FIXED + (uint64_t)n_dense * DLREC_NAME_MAX + (uint64_t)n_sparse * DLR_SPARSE_REC + 4);
}

static inline uint64_t dlr_group_header_bytes(uint32_t n_sparse) {
  return dlr_align(DLR_GROUP_FIXED + 8ull * n_sparse);
}

static inline uint64_t dlr_index_bytes(uint64_t groups) { return DLR_INDEX_FIXED + DLR_INDEX_ENTRY * groups + 4; }

/* Unaligned little-endian field access: header bytes come from files. */
static inline uint32_t dlr_get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t dlr_get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline void dlr_put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void dlr_put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Byte offsets of a group's sections relative to the group's start, from its
 * row count and per-column nnz. Shared so that the writer lays out exactly
 * what the reader expects. All sums fit easily in 64 bits: rows <= 2^24,
 * nnz < 2^32, at most 256 columns of each kind. */
typedef struct dlr_layout {
  uint64_t labels, dense;
  uint64_t offsets[DLREC_MAX_SPARSE]; /* 0 (unused) for fixed-hotness columns */
  uint64_t ids[DLREC_MAX_SPARSE];
  uint64_t bytes; /* the whole group, padded to 64 */
} dlr_layout;

static inline void dlr_layout_compute(dlr_layout *l, const dlrec_schema *s, uint32_t rows, const uint64_t *nnz) {
  uint64_t at = dlr_group_header_bytes(s->n_sparse);
  l->labels = at;
  if (s->has_label) at = dlr_align(at + 4ull * rows);
  l->dense = at;
  at = dlr_align(at + 4ull * rows * s->n_dense);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    l->offsets[c] = 0;
    if (s->sparse[c].hotness == 0) {
      l->offsets[c] = at;
      at = dlr_align(at + 4ull * (rows + 1ull));
    }
    l->ids[c] = at;
    at = dlr_align(at + 4ull * nnz[c]);
  }
  l->bytes = at;
}

#endif
