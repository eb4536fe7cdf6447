/* Tensor files. Layout (little-endian):
 *   0   magic "DLRTNSR1"
 *   8   u32 version (1)
 *   12  u32 number of arrays n
 *   16  u64 file size in bytes
 *   24  u32 CRC32C of the array table
 *   28  u32 CRC32C of bytes 0..28
 *   32  n entries of 64 bytes: name[40] (NUL-padded), u32 dtype, u32 CRC32C
 *       of the data, u64 count, u64 offset
 *   data of each array at its offset (64-byte aligned), in table order,
 *   zeros between arrays and after the last up to the file size
 * The arrays' checksums do not cover the zeros; the CRC32C of the whole file,
 * which write and read report, does (a checkpoint's manifest records it).
 */
#include "train/tensor_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fsutil.h"

#define MAGIC "DLRTNSR1"
#define VERSION 1
#define HEADER_BYTES 32
#define ENTRY_BYTES 64
#define MAX_ARRAYS 64
#define CHUNK (8u << 20)

typedef struct entry {
  char name[TENSOR_NAME_MAX];
  uint32_t dtype, crc;
  uint64_t count, offset;
} entry;
_Static_assert(sizeof(entry) == ENTRY_BYTES, "entry layout");

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

/* The whole pages of [p, p + n) leave the process (tensor_desc.drop_pages). */
static void drop_pages(const void *p, size_t n) {
  const uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1), b = ((uintptr_t)p + n) & ~(page - 1);
  if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Bytes per element of a dtype; 0 for none this build knows. */
static uint64_t elem_bytes(uint32_t dtype) {
  switch (dtype) {
  case TENSOR_F32:
  case TENSOR_U32: return 4;
  case TENSOR_BF16:
  case TENSOR_F16: return 2;
  }
  return 0;
}

/* The array's bytes [at, at + k), k within one chunk, copied from (gather)
 * or to (scatter) its rows; drop_pages then drops the span they cover. */
static void move_rows(const tensor_desc *a, char *buf, uint64_t at, size_t k, int scatter) {
  const uint64_t eb = elem_bytes(a->dtype), rb = a->row_elems * eb;
  char *data = a->data;
  uint64_t first = at / rb, done = 0;
  for (uint64_t i = first; done < k; i++) {
    const uint64_t from = i == first ? at - i * rb : 0, n = rb - from < k - done ? rb - from : k - done;
    char *row = data + (uint64_t)a->rows[i] * rb + from;
    if (scatter) memcpy(row, buf + done, n);
    else memcpy(buf + done, row, n);
    done += n;
  }
  if (a->drop_pages) {
    const uint64_t last = first + (at + k - 1 - first * rb) / rb;
    drop_pages(data + (uint64_t)a->rows[first] * rb, (size_t)(((uint64_t)a->rows[last] - a->rows[first] + 1) * rb));
  }
}

/* The CRC32C of the whole file goes through its bytes in file order: the
 * writer lays the arrays out in table order, each 64-byte aligned, so the
 * gaps before each array are zeros shorter than 64 bytes. */
static uint32_t crc_zeros(uint32_t crc, uint64_t n) {
  static const unsigned char zeros[64];
  while (n) {
    size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
    crc = dlrec_crc32c(crc, zeros, k);
    n -= k;
  }
  return crc;
}

/* Extends *crc with the file's bytes [from, to), read through buf (cap
 * bytes): a whole file written, or the gaps between arrays (crc_range). */
static dlrec_status crc_read(int fd, uint64_t from, uint64_t to, uint32_t *crc, const char *path, char *buf,
                             size_t cap) {
  while (from < to) {
    size_t k = to - from > cap ? cap : (size_t)(to - from);
    dlrec_status s = dlrec_pread_all(fd, buf, k, from, path);
    if (s != DLREC_OK) return s;
    *crc = dlrec_crc32c(*crc, buf, k);
    from += k;
  }
  return DLREC_OK;
}

static dlrec_status crc_range(int fd, uint64_t from, uint64_t to, uint32_t *crc, const char *path) {
  char buf[4096];
  return crc_read(fd, from, to, crc, path, buf, sizeof buf);
}

/* The header for the array table (its CRCs as they are) of a file of `size` bytes. */
static void make_header(unsigned char *header, const entry *table, int n, uint64_t size) {
  memset(header, 0, HEADER_BYTES);
  memcpy(header, MAGIC, 8);
  uint32_t version = VERSION, count = (uint32_t)n, table_crc = dlrec_crc32c(0, table, (size_t)n * ENTRY_BYTES);
  memcpy(header + 8, &version, 4);
  memcpy(header + 12, &count, 4);
  memcpy(header + 16, &size, 8);
  memcpy(header + 24, &table_crc, 4);
  uint32_t header_crc = dlrec_crc32c(0, header, 28);
  memcpy(header + 28, &header_crc, 4);
}

dlrec_status tensor_file_write(const char *path, const tensor_desc *arrays, int n, uint32_t *file_crc) {
  if (n < 0 || n > MAX_ARRAYS) return dlrec_error(DLREC_ERR_INTERNAL, "%s: %d arrays", path, n);
  entry table[MAX_ARRAYS];
  memset(table, 0, sizeof table);
  char *staging = NULL; /* a chunk of gathered rows */
  int streamed = 0;
  uint64_t off = align64(HEADER_BYTES + (uint64_t)n * ENTRY_BYTES);
  for (int i = 0; i < n; i++) {
    if (strlen(arrays[i].name) >= TENSOR_NAME_MAX || (arrays[i].rows && (!arrays[i].row_elems ||
                                                                         arrays[i].count % arrays[i].row_elems))) {
      free(staging);
      return dlrec_error(DLREC_ERR_INTERNAL, "%s: array '%.40s': name too long, or %llu elements not rows of %llu",
                         path, arrays[i].name, (unsigned long long)arrays[i].count,
                         (unsigned long long)arrays[i].row_elems);
    }
    memcpy(table[i].name, arrays[i].name, strlen(arrays[i].name));
    table[i].dtype = arrays[i].dtype;
    table[i].count = arrays[i].count;
    table[i].offset = off;
    if ((arrays[i].rows || arrays[i].stream) && !staging && !(staging = malloc(CHUNK)))
      return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    const uint64_t bytes = arrays[i].count * elem_bytes(arrays[i].dtype);
    streamed |= arrays[i].stream != NULL; /* its checksum comes with the write pass */
    if (!arrays[i].rows && !arrays[i].stream) table[i].crc = dlrec_crc32c(0, arrays[i].data, bytes);
    for (uint64_t at = 0; arrays[i].rows && at < bytes; at += CHUNK) {
      const size_t k = bytes - at > CHUNK ? CHUNK : (size_t)(bytes - at);
      tensor_desc gather = arrays[i];
      gather.drop_pages = 0; /* the write pass below reads them again */
      move_rows(&gather, staging, at, k, 0);
      table[i].crc = dlrec_crc32c(table[i].crc, staging, k);
    }
    off = align64(off + bytes);
  }
  unsigned char header[HEADER_BYTES];
  make_header(header, table, n, off);
  uint32_t fcrc = dlrec_crc32c(0, header, HEADER_BYTES);
  fcrc = dlrec_crc32c(fcrc, table, (size_t)n * ENTRY_BYTES);
  uint64_t at_crc = HEADER_BYTES + (uint64_t)n * ENTRY_BYTES; /* where fcrc has got to */

  /* A new file, never the old one truncated: the old may be a hard link of
   * another checkpoint's file (a journaled checkpoint's base). */
  if (unlink(path) != 0 && errno != ENOENT) {
    free(staging);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  }
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(staging);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  }
  dlrec_status s = dlrec_pwrite_all(fd, header, HEADER_BYTES, 0, path);
  if (s == DLREC_OK) s = dlrec_pwrite_all(fd, table, (size_t)n * ENTRY_BYTES, HEADER_BYTES, path);
  for (int i = 0; s == DLREC_OK && i < n; i++) {
    const char *p = arrays[i].data;
    uint64_t left = arrays[i].count * elem_bytes(arrays[i].dtype), at = table[i].offset, done = 0;
    fcrc = crc_zeros(fcrc, at - at_crc);
    while (s == DLREC_OK && left) {
      size_t k = left > CHUNK ? CHUNK : (size_t)left;
      if (arrays[i].rows) move_rows(&arrays[i], staging, done, k, 0);
      if (arrays[i].stream) {
        if ((s = arrays[i].stream(arrays[i].stream_ctx, done, staging, k)) != DLREC_OK) break;
        table[i].crc = dlrec_crc32c(table[i].crc, staging, k);
      }
      const char *src = arrays[i].rows || arrays[i].stream ? staging : p;
      s = dlrec_pwrite_all(fd, src, k, at, path);
      fcrc = dlrec_crc32c(fcrc, src, k);
      if (arrays[i].drop_pages && !arrays[i].rows && p) drop_pages(p, k);
      if (p) p += k; /* a streamed array has no data */
      at += k;
      done += k;
      left -= k;
    }
    at_crc = at;
  }
  fcrc = crc_zeros(fcrc, off - at_crc); /* the padding after the last array */
  *file_crc = fcrc;
  if (s == DLREC_OK && ftruncate(fd, (off_t)off) != 0)
    s = dlrec_error(DLREC_ERR_IO, "%s: cannot set size: %s", path, strerror(errno));
  /* A streamed array's checksum is known only now: the header and table
   * again, and the file's CRC read back (the header leads it). */
  if (s == DLREC_OK && streamed) {
    make_header(header, table, n, off);
    s = dlrec_pwrite_all(fd, header, HEADER_BYTES, 0, path);
    if (s == DLREC_OK) s = dlrec_pwrite_all(fd, table, (size_t)n * ENTRY_BYTES, HEADER_BYTES, path);
    fcrc = 0;
    if (s == DLREC_OK) s = crc_read(fd, 0, off, &fcrc, path, staging, CHUNK);
    *file_crc = fcrc;
  }
  if (s == DLREC_OK && fsync(fd) != 0) s = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
  if (close(fd) != 0 && s == DLREC_OK) s = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", path, strerror(errno));
  free(staging);
  return s;
}

static const char *dtype_name(uint32_t t) {
  switch (t) {
  case TENSOR_F32: return "f32";
  case TENSOR_U32: return "u32";
  case TENSOR_BF16: return "bf16";
  case TENSOR_F16: return "fp16";
  }
  return "?";
}

static dlrec_status check_layout(const char *path, int fd, unsigned char *header, entry *table, uint32_t *n_out,
                                 uint64_t *size_out) {
  struct stat st;
  if (fstat(fd, &st) != 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  if ((uint64_t)st.st_size < HEADER_BYTES)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated: %lld bytes, shorter than the header", path, (long long)st.st_size);
  dlrec_status s = dlrec_pread_all(fd, header, HEADER_BYTES, 0, path);
  if (s != DLREC_OK) return s;
  if (memcmp(header, MAGIC, 8) != 0) return dlrec_error(DLREC_ERR_CORRUPT, "%s: not a dlrec tensor file (bad magic)", path);
  uint32_t version, n, table_crc, header_crc;
  uint64_t size;
  memcpy(&version, header + 8, 4);
  memcpy(&n, header + 12, 4);
  memcpy(&size, header + 16, 8);
  memcpy(&table_crc, header + 24, 4);
  memcpy(&header_crc, header + 28, 4);
  if (dlrec_crc32c(0, header, 28) != header_crc)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: header checksum mismatch at offset 0", path);
  if (version != VERSION)
    return dlrec_error(DLREC_ERR_VERSION, "%s: tensor file version %u, this build reads version %d", path, version, VERSION);
  if (size != (uint64_t)st.st_size)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated or extended: header says %llu bytes, file has %lld", path,
                       (unsigned long long)size, (long long)st.st_size);
  if (n > MAX_ARRAYS) return dlrec_error(DLREC_ERR_CORRUPT, "%s: %u arrays, at most %d", path, n, MAX_ARRAYS);
  s = dlrec_pread_all(fd, table, (size_t)n * ENTRY_BYTES, HEADER_BYTES, path);
  if (s != DLREC_OK) return s;
  if (dlrec_crc32c(0, table, (size_t)n * ENTRY_BYTES) != table_crc)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: array table checksum mismatch at offset %d", path, HEADER_BYTES);
  /* The arrays lie in table order without overlapping, as the writer puts
   * them, so that one pass in file order reads every byte once. */
  uint64_t end = HEADER_BYTES + (uint64_t)n * ENTRY_BYTES;
  for (uint32_t i = 0; i < n; i++) {
    entry *e = &table[i];
    const uint64_t eb = elem_bytes(e->dtype);
    if (!memchr(e->name, '\0', TENSOR_NAME_MAX) || !eb || e->count > size / eb || e->offset > size ||
        e->offset + e->count * eb > size || e->offset < end)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: array %u: bad entry (outside the file, overlapping or unknown type)",
                         path, i);
    end = e->offset + e->count * eb;
  }
  *n_out = n;
  *size_out = size;
  return DLREC_OK;
}

/* tensor_file_read, where an array whose data is NULL is only checked (read
 * through a scratch buffer); each array's offset in the file goes to
 * offsets[i] when offsets is not NULL. */
static dlrec_status read_arrays(const char *path, const tensor_desc *arrays, int n, uint32_t *file_crc,
                                uint64_t *offsets) {
  char *scratch = NULL;
  for (int i = 0; i < n; i++) {
    if (arrays[i].rows && (!arrays[i].row_elems || arrays[i].count % arrays[i].row_elems))
      return dlrec_error(DLREC_ERR_INTERNAL, "%s: array '%s': %llu elements are not rows of %llu", path,
                         arrays[i].name, (unsigned long long)arrays[i].count, (unsigned long long)arrays[i].row_elems);
    if ((!arrays[i].data || arrays[i].rows || arrays[i].stream) && !scratch && !(scratch = malloc(CHUNK)))
      return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    free(scratch);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  }
  unsigned char header[HEADER_BYTES];
  entry table[MAX_ARRAYS];
  uint32_t have = 0;
  uint64_t size = 0;
  dlrec_status s = check_layout(path, fd, header, table, &have, &size);
  if (s == DLREC_OK && have != (uint32_t)n)
    s = dlrec_error(DLREC_ERR_INVALID, "%s: holds %u arrays, expected %d (a checkpoint of another configuration?)", path,
                    have, n);
  uint32_t fcrc = dlrec_crc32c(0, header, HEADER_BYTES);
  fcrc = dlrec_crc32c(fcrc, table, (size_t)have * ENTRY_BYTES);
  uint64_t at_crc = HEADER_BYTES + (uint64_t)have * ENTRY_BYTES;
  int done[MAX_ARRAYS] = {0};
  for (uint32_t k = 0; s == DLREC_OK && k < have; k++) {
    const entry *e = &table[k];
    int i = 0;
    while (i < n && (done[i] || strcmp(e->name, arrays[i].name))) i++;
    if (i == n) {
      s = dlrec_error(DLREC_ERR_INVALID, "%s: unexpected array '%s' (a checkpoint of another configuration?)", path,
                      e->name);
      break;
    }
    done[i] = 1;
    if (e->dtype != arrays[i].dtype || e->count != arrays[i].count) {
      s = dlrec_error(DLREC_ERR_INVALID, "%s: array '%s' holds %llu %s values, the model needs %llu %s", path, e->name,
                      (unsigned long long)e->count, dtype_name(e->dtype), (unsigned long long)arrays[i].count,
                      dtype_name(arrays[i].dtype));
      break;
    }
    s = crc_range(fd, at_crc, e->offset, &fcrc, path);
    if (offsets) offsets[i] = e->offset;
    /* Scattered rows are read into scratch and copied out only once the
     * array's checksum holds: a damaged journal never reaches the table. So
     * they are read twice, the second time for the copy. */
    const int scatter = arrays[i].rows && arrays[i].data, direct = arrays[i].data && !arrays[i].rows;
    char *p = direct ? arrays[i].data : scratch;
    const uint64_t bytes = e->count * elem_bytes(e->dtype);
    uint64_t left = bytes, at = e->offset;
    uint32_t crc = 0;
    while (s == DLREC_OK && left) {
      size_t k = left > CHUNK ? CHUNK : (size_t)left;
      s = dlrec_pread_all(fd, p, k, at, path);
      if (s == DLREC_OK) {
        crc = dlrec_crc32c(crc, p, k);
        fcrc = dlrec_crc32c(fcrc, p, k);
        if (arrays[i].drop_pages && direct) drop_pages(p, k);
        if (arrays[i].stream) s = arrays[i].stream(arrays[i].stream_ctx, at - e->offset, p, k);
      }
      if (direct) p += k;
      at += k;
      left -= k;
    }
    for (uint64_t done = 0; s == DLREC_OK && scatter && crc == e->crc && done < bytes; done += CHUNK) {
      size_t k = bytes - done > CHUNK ? CHUNK : (size_t)(bytes - done);
      s = dlrec_pread_all(fd, scratch, k, e->offset + done, path);
      if (s == DLREC_OK) move_rows(&arrays[i], scratch, done, k, 1);
    }
    at_crc = at;
    if (s == DLREC_OK && crc != e->crc)
      s = dlrec_error(DLREC_ERR_CORRUPT, "%s: array '%s' at offset %llu: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                      path, e->name, (unsigned long long)e->offset, e->crc, crc);
  }
  if (s == DLREC_OK) s = crc_range(fd, at_crc, size, &fcrc, path); /* the padding after the last array */
  close(fd);
  free(scratch);
  *file_crc = fcrc;
  return s;
}

dlrec_status tensor_file_read(const char *path, const tensor_desc *arrays, int n, uint32_t *file_crc) {
  return read_arrays(path, arrays, n, file_crc, NULL);
}

dlrec_status tensor_file_map(const char *path, const tensor_desc *array, void **map, size_t *map_bytes, void **data,
                             uint32_t *file_crc) {
  *map = *data = NULL;
  *map_bytes = 0;
  tensor_desc check = *array;
  check.data = NULL;
  uint64_t offset = 0;
  dlrec_status s = read_arrays(path, &check, 1, file_crc, &offset);
  if (s != DLREC_OK) return s;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(e));
  }
  /* Private: a stray write is the process's own copy, never the file's. */
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED) return dlrec_error(DLREC_ERR_IO, "%s: cannot map %lld bytes: %s", path, (long long)st.st_size, strerror(e));
  (void)madvise(p, (size_t)st.st_size, MADV_RANDOM);
  *map = p;
  *map_bytes = (size_t)st.st_size;
  *data = (char *)p + offset;
  return DLREC_OK;
}
