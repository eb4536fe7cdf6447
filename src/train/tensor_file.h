/* Tensor files: named arrays of floats, uint32s or 16-bit floats, each with a CRC32C, under
 * a checksummed header (docs/formats.md, "Checkpoint tensor files"). The
 * checkpoint's dense.bin, table.bin and optim.bin are tensor files. */
#ifndef DLREC_TENSOR_FILE_H
#define DLREC_TENSOR_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define TENSOR_NAME_MAX 40

/* BF16 and F16 hold uint16_t bit patterns (a 16-bit embedding table). */
typedef enum tensor_dtype { TENSOR_F32 = 1, TENSOR_U32 = 2, TENSOR_BF16 = 3, TENSOR_F16 = 4 } tensor_dtype;

typedef struct tensor_desc {
  const char *name;   /* < TENSOR_NAME_MAX bytes */
  tensor_dtype dtype;
  uint64_t count;     /* elements */
  void *data;         /* read: the destination; write: the source */
  /* data lies in a shared file mapping (a tiered table's view): the pages
   * of each chunk leave the process once read or written (the page cache
   * keeps them), so a table larger than memory passes through in chunks. */
  int drop_pages;
  /* Gathered (write) or scattered (read) rows: with rows set, the array's
   * count elements are count / row_elems rows of row_elems elements each,
   * row i at data + rows[i]·row_elems. rows ascend, so that a chunk of the
   * array covers one span of data (whose pages drop_pages drops as it goes):
   * a journal's changed rows of a whole table. */
  const uint32_t *rows;
  uint64_t row_elems;
  /* Or streamed (data NULL): a write asks stream(stream_ctx, at, buf, k) for
   * the array's bytes [at, at + k) into buf, chunk by chunk in order, once
   * (the header, which holds the checksums, is written last, and the file's
   * CRC then read back); a read hands each chunk it reads to stream, before
   * the array's checksum is known (a read that fails must make the caller
   * drop what it was given). k is at most 8 MiB, and every chunk but the
   * last is 8 MiB. */
  dlrec_status (*stream)(void *stream_ctx, uint64_t at, void *buf, size_t k);
  void *stream_ctx;
} tensor_desc;

/* A whole, contiguous array (rows unset). */
static inline tensor_desc tensor_array(const char *name, tensor_dtype dtype, uint64_t count, void *data,
                                       int drop_pages) {
  return (tensor_desc){.name = name, .dtype = dtype, .count = count, .data = data, .drop_pages = drop_pages};
}

/* Writes the arrays to path (a new file, replacing any there: a hard link
 * to it keeps the old bytes) and fsyncs it. Sets
 * *file_crc to the CRC32C of the whole file, padding included, so that a
 * checkpoint's manifest can cover every byte. */
dlrec_status tensor_file_write(const char *path, const tensor_desc *arrays, int n, uint32_t *file_crc);

/* Reads exactly the named arrays (any order in the table) into their data,
 * checking the header, that the file holds these arrays with these counts and
 * types and nothing else, and every checksum. Errors name the file and the
 * array ("table.bin: array 'table': checksum mismatch"). Sets *file_crc to
 * the CRC32C of the whole file as read (the caller compares it with the one
 * it recorded: the arrays' own checksums do not cover the padding). An
 * array whose data is NULL is checked and not copied anywhere. */
dlrec_status tensor_file_read(const char *path, const tensor_desc *arrays, int n, uint32_t *file_crc);

/* For a file of the one array `array` (its data unused): checks everything
 * tensor_file_read checks, reading the file through once, then maps it:
 * *data is the array inside a private mapping of the whole file (*map,
 * *map_bytes: the caller munmaps them). Its pages are read on first touch
 * (from the page cache when the check left them there) and count in RSS
 * only once touched, so a table larger than memory can be scored. A write
 * changes the process's copy, never the file. */
dlrec_status tensor_file_map(const char *path, const tensor_desc *array, void **map, size_t *map_bytes, void **data,
                             uint32_t *file_crc);

#endif
