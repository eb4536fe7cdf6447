/* Reading .dlr files: map, validate everything that locates data against the
 * file size before any column is touched, hand out views into the mapping,
 * and verify row-group checksums on request (layout: dlr_format.h and
 * docs/formats.md).
 *
 * Validation order matters for the messages: magic, then version (a newer
 * file gets "upgrade", not "corrupt"), then sizes, then checksums, then the
 * meaning of the fields. Every error names the file and a byte offset. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dlr_format.h"
#include "core/crc32c.h"
#include "core/hash.h"

struct dlrec_dlr {
  char *path;
  const unsigned char *base;
  uint64_t size;
  int mapped; /* munmap on close (else the caller's buffer) */
  dlrec_schema schema;
  uint32_t version;
  uint64_t rows;
  uint32_t n_groups;
  uint64_t header_bytes, index_offset;
  const unsigned char *index; /* the first index entry */
  uint64_t *first_row;        /* (n_groups + 1) prefix sums of group rows */
  uint64_t fingerprint;
};

typedef unsigned long long ull;

/* Re-issues this thread's error with status st and prefix `what`: the schema
 * validator says INVALID about arguments; in a file it means CORRUPT. */
static dlrec_status restatus(dlrec_status st, const char *what) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", dlrec_last_error());
  return dlrec_error(st, "%s%s", what, msg);
}

static dlrec_status parse_header(dlrec_dlr *f) {
  const unsigned char *h = f->base;
  const char *p = f->path;
  uint64_t size = f->size;
  if (size < 8 || memcmp(h, DLR_MAGIC, 8) != 0) {
    if (size >= 8 || memcmp(h, DLR_MAGIC, size) != 0)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: not a .dlr file (bad magic at offset 0)", p);
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated: %llu bytes, shorter than a .dlr header", p, (ull)size);
  }
  if (size < DLR_HDR_FIXED)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated: %llu bytes, shorter than a .dlr header (%d bytes at least)",
                       p, (ull)size, DLR_HDR_FIXED);
  f->version = dlr_get32(h + DLR_HDR_VERSION);
  if (f->version > DLREC_DLR_VERSION)
    return dlrec_error(DLREC_ERR_VERSION,
                       "%s: .dlr format version %u; this build of dlrec reads version %d (the file was written by a "
                       "newer dlrec: upgrade to read it)",
                       p, f->version, DLREC_DLR_VERSION);
  if (f->version == 0)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: format version 0 is not valid", p, DLR_HDR_VERSION);

  uint32_t nd = dlr_get32(h + DLR_HDR_N_DENSE), ns = dlr_get32(h + DLR_HDR_N_SPARSE);
  uint32_t hb = dlr_get32(h + DLR_HDR_BYTES);
  if (nd > DLREC_MAX_DENSE || ns > DLREC_MAX_SPARSE)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: %u dense and %u sparse columns (at most %d and %d)", p,
                       DLR_HDR_N_DENSE, nd, ns, DLREC_MAX_DENSE, DLREC_MAX_SPARSE);
  f->header_bytes = dlr_header_bytes(nd, ns);
  if (hb != f->header_bytes)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: at offset %d: header size %u does not match its %u dense and %u sparse columns "
                       "(expected %llu)",
                       p, DLR_HDR_BYTES, hb, nd, ns, (ull)f->header_bytes);
  if (size < f->header_bytes)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: truncated: the header needs %llu bytes, file has %llu bytes", p,
                       (ull)f->header_bytes, (ull)size);
  uint32_t stored = dlr_get32(h + hb - 4), computed = dlrec_crc32c(0, h, hb - 4);
  if (stored != computed)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: header at offset 0: checksum mismatch (stored 0x%08x, computed 0x%08x)",
                       p, stored, computed);

  uint32_t flags = dlr_get32(h + DLR_HDR_FLAGS);
  if (flags & ~DLR_FLAGS_KNOWN)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: unknown flags 0x%x", p, DLR_HDR_FLAGS, flags);
  if (!(flags & DLR_FLAG_COMPLETE))
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: incomplete file: its writer did not finish (a crashed or still running writer's .tmp?)", p);
  if (dlr_get32(h + DLR_HDR_RESERVED) != 0)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: reserved field is not 0", p, DLR_HDR_RESERVED);

  dlrec_schema *s = &f->schema;
  memset(s, 0, sizeof *s);
  s->has_label = (flags & DLR_FLAG_HAS_LABEL) != 0;
  s->keys = (flags & DLR_FLAG_KEYS) != 0;
  s->n_dense = nd;
  s->n_sparse = ns;
  s->table_rows = dlr_get64(h + DLR_HDR_TABLE_ROWS);
  /* Names are fixed 48-byte fields; copying all 48 keeps a missing NUL
   * visible to the validator instead of reading past the field. */
  memcpy(s->label_name, h + DLR_HDR_LABEL_NAME, DLREC_NAME_MAX);
  const unsigned char *q = h + DLR_HDR_FIXED;
  for (uint32_t i = 0; i < nd; i++, q += DLREC_NAME_MAX) memcpy(s->dense_names[i], q, DLREC_NAME_MAX);
  for (uint32_t i = 0; i < ns; i++, q += DLR_SPARSE_REC) {
    dlrec_sparse_col *c = &s->sparse[i];
    memcpy(c->name, q, DLREC_NAME_MAX);
    c->hotness = dlr_get32(q + 48);
    c->max_hotness = dlr_get32(q + 52);
    c->id_begin = dlr_get64(q + 56);
    c->id_end = dlr_get64(q + 64);
  }
  char what[600];
  snprintf(what, sizeof what, "%s: header: ", p);
  if (dlrec_schema_validate(s, "schema") != DLREC_OK) return restatus(DLREC_ERR_CORRUPT, what);
  if (!s->has_label) memset(s->label_name, 0, sizeof s->label_name);

  f->rows = dlr_get64(h + DLR_HDR_ROWS);
  uint64_t groups = dlr_get64(h + DLR_HDR_GROUPS);
  f->index_offset = dlr_get64(h + DLR_HDR_INDEX_OFFSET);
  if (groups >= UINT32_MAX)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: %llu row groups (at most %u)", p, DLR_HDR_GROUPS,
                       (ull)groups, UINT32_MAX - 1);
  f->n_groups = (uint32_t)groups;
  if (f->rows > groups * DLREC_DLR_MAX_GROUP_ROWS)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: at offset %d: %llu rows cannot fit in %llu row groups", p, DLR_HDR_ROWS,
                       (ull)f->rows, (ull)groups);
  if (f->index_offset < f->header_bytes || f->index_offset % DLR_ALIGN)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: at offset %d: index offset %llu is not a multiple of 64 after the header", p,
                       DLR_HDR_INDEX_OFFSET, (ull)f->index_offset);
  uint64_t ib = dlr_index_bytes(groups);
  if (f->index_offset > UINT64_MAX - ib || f->index_offset + ib > size)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: truncated: header says %llu rows in %llu row groups ending at offset %llu, file has "
                       "%llu bytes",
                       p, (ull)f->rows, (ull)groups,
                       (ull)(f->index_offset > UINT64_MAX - ib ? UINT64_MAX : f->index_offset + ib), (ull)size);
  if (f->index_offset + ib < size)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: %llu unexpected bytes after the index, which ends at offset %llu", p,
                       (ull)(size - f->index_offset - ib), (ull)(f->index_offset + ib));
  return DLREC_OK;
}

/* The group header's nnz per column, checked against the rows and hotness,
 * and the section layout they give. */
static dlrec_status group_layout(const dlrec_dlr *f, uint32_t i, uint64_t off, uint32_t rows, dlr_layout *lay) {
  const dlrec_schema *s = &f->schema;
  const unsigned char *g = f->base + off;
  uint64_t nnz[DLREC_MAX_SPARSE];
  if (dlr_get32(g) != DLR_GROUP_MAGIC)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: row group %u at offset %llu: bad group magic", f->path, i, (ull)off);
  if (dlr_get32(g + 4) != rows || dlr_get32(g + 8) != i || dlr_get32(g + 12) != 0)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: row group %u at offset %llu: group header says %u rows, number %u (index: %u rows, "
                       "number %u)",
                       f->path, i, (ull)off, dlr_get32(g + 4), dlr_get32(g + 8), rows, i);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    nnz[c] = dlr_get64(g + DLR_GROUP_FIXED + 8 * c);
    uint64_t at = off + DLR_GROUP_FIXED + 8ull * c;
    if (col->hotness ? nnz[c] != (uint64_t)rows * col->hotness
                     : (nnz[c] > (uint64_t)rows * col->max_hotness || nnz[c] > UINT32_MAX))
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: row group %u at offset %llu: at offset %llu: sparse column '%s' has %llu ids for %u "
                         "rows (hotness %u, max %u)",
                         f->path, i, (ull)off, (ull)at, col->name, (ull)nnz[c], rows, col->hotness, col->max_hotness);
  }
  dlr_layout_compute(lay, s, rows, nnz);
  return DLREC_OK;
}

static dlrec_status parse_index(dlrec_dlr *f) {
  const char *p = f->path;
  const unsigned char *ix = f->base + f->index_offset;
  uint64_t ib = dlr_index_bytes(f->n_groups);
  uint64_t io = f->index_offset;
  if (dlr_get32(ix) != DLR_INDEX_MAGIC || dlr_get32(ix + 4) != 0)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: index at offset %llu: bad index magic", p, (ull)io);
  uint32_t stored = dlr_get32(ix + ib - 4), computed = dlrec_crc32c(0, ix, ib - 4);
  if (stored != computed)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: index at offset %llu: checksum mismatch (stored 0x%08x, computed 0x%08x)", p, (ull)io,
                       stored, computed);
  if (dlr_get64(ix + 8) != f->n_groups)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: index at offset %llu: %llu row groups, the header says %u", p, (ull)io,
                       (ull)dlr_get64(ix + 8), f->n_groups);
  f->index = ix + DLR_INDEX_FIXED;
  f->first_row = malloc(((size_t)f->n_groups + 1) * sizeof *f->first_row);
  if (!f->first_row) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory for %u row groups", p, f->n_groups);
  /* Groups are contiguous and in order, from the end of the header to the
   * index: one rule that bounds every group by the file. */
  uint64_t expect = f->header_bytes, rows = 0;
  for (uint32_t i = 0; i < f->n_groups; i++) {
    const unsigned char *e = f->index + (uint64_t)DLR_INDEX_ENTRY * i;
    uint64_t off = dlr_get64(e), bytes = dlr_get64(e + 8);
    uint32_t r = dlr_get32(e + 16);
    uint64_t at = io + DLR_INDEX_FIXED + (uint64_t)DLR_INDEX_ENTRY * i;
    if (off != expect)
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: index entry %u at offset %llu: row group %u at offset %llu, expected %llu", p, i, (ull)at,
                         i, (ull)off, (ull)expect);
    if (bytes % DLR_ALIGN || bytes < dlr_group_header_bytes(f->schema.n_sparse) || bytes > io - off)
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: row group %u at offset %llu: %llu bytes does not fit between its offset and the index "
                         "at %llu",
                         p, i, (ull)off, (ull)bytes, (ull)io);
    if (r < 1 || r > DLREC_DLR_MAX_GROUP_ROWS)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: row group %u at offset %llu: %u rows (must be 1..%u)", p, i, (ull)off,
                         r, DLREC_DLR_MAX_GROUP_ROWS);
    dlr_layout lay;
    dlrec_status st = group_layout(f, i, off, r, &lay);
    if (st != DLREC_OK) return st;
    if (lay.bytes != bytes)
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: row group %u at offset %llu: its columns take %llu bytes, the index says %llu", p, i,
                         (ull)off, (ull)lay.bytes, (ull)bytes);
    f->first_row[i] = rows;
    rows += r;
    expect = off + bytes;
  }
  f->first_row[f->n_groups] = rows;
  if (expect != io)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: the last row group ends at offset %llu, the index starts at %llu", p,
                       (ull)expect, (ull)io);
  if (rows != f->rows)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: the row groups hold %llu rows, the header says %llu", p, (ull)rows,
                       (ull)f->rows);
  f->fingerprint = dlrec_hash_bytes(ix, ib, dlrec_hash_bytes(f->base, f->header_bytes, 0x646c72));
  return DLREC_OK;
}

static dlrec_status open_common(dlrec_dlr *f) {
  dlrec_status st = parse_header(f);
  if (st == DLREC_OK) st = parse_index(f);
  return st;
}

static dlrec_dlr *alloc_reader(const char *name) {
  dlrec_dlr *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->path = strdup(name);
  if (!f->path) {
    free(f);
    return NULL;
  }
  return f;
}

dlrec_status dlrec_dlr_open(dlrec_dlr **out, const char *path) {
  *out = NULL;
  dlrec_dlr *f = alloc_reader(path);
  if (!f) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    dlrec_status st = dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
    dlrec_dlr_close(f);
    return st;
  }
  struct stat sb;
  dlrec_status st = DLREC_OK;
  if (fstat(fd, &sb) != 0)
    st = dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    st = dlrec_error(DLREC_ERR_IO, "%s: not a regular file", path);
  else if (sb.st_size == 0)
    st = dlrec_error(DLREC_ERR_CORRUPT, "%s: empty file (0 bytes), not a .dlr file", path);
  if (st == DLREC_OK) {
    f->size = (uint64_t)sb.st_size;
    /* No MAP_POPULATE: inspect and the loader touch groups in their own
     * order, and a file larger than memory must still open at once. */
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED)
      st = dlrec_error(DLREC_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    else {
      f->base = m;
      f->mapped = 1;
    }
  }
  close(fd); /* the mapping keeps the file */
  if (st == DLREC_OK) st = open_common(f);
  if (st != DLREC_OK) {
    dlrec_dlr_close(f);
    return st;
  }
  *out = f;
  return DLREC_OK;
}

dlrec_status dlrec_dlr_open_buffer(dlrec_dlr **out, const void *data, size_t n, const char *name) {
  *out = NULL;
  if ((uintptr_t)data % DLR_ALIGN) return dlrec_error(DLREC_ERR_INVALID, "%s: buffer is not 64-byte aligned", name);
  if (n == 0) return dlrec_error(DLREC_ERR_CORRUPT, "%s: empty file (0 bytes), not a .dlr file", name);
  dlrec_dlr *f = alloc_reader(name);
  if (!f) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", name);
  f->base = data;
  f->size = n;
  dlrec_status st = open_common(f);
  if (st != DLREC_OK) {
    dlrec_dlr_close(f);
    return st;
  }
  *out = f;
  return DLREC_OK;
}

void dlrec_dlr_close(dlrec_dlr *f) {
  if (!f) return;
  if (f->mapped) munmap((void *)f->base, (size_t)f->size);
  free(f->first_row);
  free(f->path);
  free(f);
}

/* The writer puts out an incomplete header first and sets the flag last
 * (dlr_write.c), so a file caught mid-write is the start of a header, or a
 * whole header that checks but lacks DLR_FLAG_COMPLETE; a finished file
 * caught while it is copied in place has its whole header but not yet the
 * bytes up to the index's end that the header promises. O_NONBLOCK: a FIFO
 * under a .dlr name must not hang the caller (it is not regular: 0). */
int dlrec_dlr_unfinished(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  struct stat sb;
  unsigned char fixed[DLR_HDR_FIXED], *h = NULL;
  int res = 0;
  ssize_t n = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? pread(fd, fixed, sizeof fixed, 0) : -1;
  if (n >= 0 && n < 8) {
    res = memcmp(fixed, DLR_MAGIC, (size_t)n) == 0; /* empty, or the magic's first bytes */
  } else if (n > 0 && memcmp(fixed, DLR_MAGIC, 8) == 0) {
    const uint32_t nd = n == DLR_HDR_FIXED ? dlr_get32(fixed + DLR_HDR_N_DENSE) : 0;
    const uint32_t ns = n == DLR_HDR_FIXED ? dlr_get32(fixed + DLR_HDR_N_SPARSE) : 0;
    const uint64_t hb = dlr_header_bytes(nd, ns);
    if (n < DLR_HDR_FIXED || (uint64_t)sb.st_size < hb) {
      /* The header's fixed fields or its names are still to come: its size
       * field must fit its columns once it is there. */
      res = n < DLR_HDR_FIXED ||
            (nd <= DLREC_MAX_DENSE && ns <= DLREC_MAX_SPARSE && dlr_get32(fixed + DLR_HDR_BYTES) == hb);
    } else if (nd <= DLREC_MAX_DENSE && ns <= DLREC_MAX_SPARSE && dlr_get32(fixed + DLR_HDR_BYTES) == hb &&
               (h = malloc(hb)) && pread(fd, h, hb, 0) == (ssize_t)hb) {
      const uint64_t groups = dlr_get64(h + DLR_HDR_GROUPS), index = dlr_get64(h + DLR_HDR_INDEX_OFFSET);
      const int arriving = groups < UINT32_MAX && index <= UINT64_MAX - dlr_index_bytes(groups) &&
                           (uint64_t)sb.st_size < index + dlr_index_bytes(groups);
      res = dlr_get32(h + hb - 4) == dlrec_crc32c(0, h, hb - 4) &&
            (!(dlr_get32(h + DLR_HDR_FLAGS) & DLR_FLAG_COMPLETE) || arriving);
    }
  }
  free(h);
  close(fd);
  return res;
}

const char *dlrec_dlr_path(const dlrec_dlr *f) { return f->path; }
const dlrec_schema *dlrec_dlr_schema(const dlrec_dlr *f) { return &f->schema; }
uint64_t dlrec_dlr_rows(const dlrec_dlr *f) { return f->rows; }
uint32_t dlrec_dlr_row_groups(const dlrec_dlr *f) { return f->n_groups; }
uint32_t dlrec_dlr_version(const dlrec_dlr *f) { return f->version; }
uint64_t dlrec_dlr_file_bytes(const dlrec_dlr *f) { return f->size; }
uint64_t dlrec_dlr_fingerprint(const dlrec_dlr *f) { return f->fingerprint; }

uint32_t dlrec_dlr_group_rows(const dlrec_dlr *f, uint32_t i) {
  return dlr_get32(f->index + (uint64_t)DLR_INDEX_ENTRY * i + 16);
}

uint64_t dlrec_dlr_group_first_row(const dlrec_dlr *f, uint32_t i) { return f->first_row[i]; }

void dlrec_dlr_group_info_get(const dlrec_dlr *f, uint32_t i, dlrec_dlr_group_info *out) {
  const unsigned char *e = f->index + (uint64_t)DLR_INDEX_ENTRY * i;
  out->offset = dlr_get64(e);
  out->bytes = dlr_get64(e + 8);
  out->rows = dlr_get32(e + 16);
  out->crc = dlr_get32(e + 20);
  out->first_row = f->first_row[i];
}

dlrec_status dlrec_dlr_row_group(const dlrec_dlr *f, uint32_t i, dlrec_rowgroup *out) {
  if (i >= f->n_groups)
    return dlrec_error(DLREC_ERR_INVALID, "%s: row group %u does not exist (%u row groups)", f->path, i, f->n_groups);
  dlrec_dlr_group_info gi;
  dlrec_dlr_group_info_get(f, i, &gi);
  dlr_layout lay;
  /* Validated at open; checked again because it costs little and a view
   * must never point outside the file. */
  dlrec_status st = group_layout(f, i, gi.offset, gi.rows, &lay);
  if (st != DLREC_OK) return st;
  if (lay.bytes != gi.bytes)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: row group %u at offset %llu: layout changed since open", f->path, i,
                       (ull)gi.offset);
  const dlrec_schema *s = &f->schema;
  const unsigned char *g = f->base + gi.offset;
  memset(out, 0, sizeof *out);
  out->rows = gi.rows;
  out->labels = s->has_label ? (const float *)(const void *)(g + lay.labels) : NULL;
  out->dense = (const float *)(const void *)(g + lay.dense);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    out->offsets[c] = s->sparse[c].hotness ? NULL : (const uint32_t *)(const void *)(g + lay.offsets[c]);
    out->ids[c] = (const uint32_t *)(const void *)(g + lay.ids[c]);
  }
  return DLREC_OK;
}

/* Offsets of variable columns: start at 0, never decrease, at most
 * max_hotness per row, end at nnz. The fast loop only detects; the slow one
 * finds the row for the message. */
static dlrec_status check_offsets(const dlrec_dlr *f, uint32_t i, const dlrec_rowgroup *rg, uint64_t goff) {
  const dlrec_schema *s = &f->schema;
  const unsigned char *g = f->base + goff;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    if (col->hotness) continue;
    const uint32_t *off = rg->offsets[c];
    uint64_t nnz = dlr_get64(g + DLR_GROUP_FIXED + 8 * c);
    uint32_t maxh = col->max_hotness, bad = 0;
    /* Both tests: with a max hotness near 2^32 a decrease would pass the
     * second alone (the difference wraps). */
    for (uint32_t r = 0; r < rg->rows; r++) bad |= (off[r + 1] < off[r]) | (off[r + 1] - off[r] > maxh);
    if (!bad && off[0] == 0 && off[rg->rows] == nnz) continue;
    uint64_t at = (uint64_t)((const unsigned char *)off - f->base);
    if (off[0] != 0)
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: row group %u at offset %llu: sparse column '%s': offsets at offset %llu start at %u, "
                         "not 0",
                         f->path, i, (ull)goff, col->name, (ull)at, off[0]);
    for (uint32_t r = 0; r < rg->rows; r++)
      if (off[r + 1] < off[r] || off[r + 1] - off[r] > maxh)
        return dlrec_error(DLREC_ERR_CORRUPT,
                           "%s: row group %u at offset %llu: sparse column '%s': row %u (file row %llu) at offset "
                           "%llu: offsets go from %u to %u (more than max hotness %u, or decreasing)",
                           f->path, i, (ull)goff, col->name, r, (ull)(f->first_row[i] + r), (ull)(at + 4ull * r),
                           off[r], off[r + 1], maxh);
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: row group %u at offset %llu: sparse column '%s': offsets at offset %llu end at %u, the "
                       "group header says %llu ids",
                       f->path, i, (ull)goff, col->name, (ull)at, off[rg->rows], (ull)nnz);
  }
  return DLREC_OK;
}

dlrec_status dlrec_dlr_check_offsets(const dlrec_dlr *f, uint32_t i) {
  dlrec_rowgroup rg;
  dlrec_status st = dlrec_dlr_row_group(f, i, &rg);
  if (st != DLREC_OK) return st;
  dlrec_dlr_group_info gi;
  dlrec_dlr_group_info_get(f, i, &gi);
  return check_offsets(f, i, &rg, gi.offset);
}

dlrec_status dlrec_dlr_verify(const dlrec_dlr *f, uint32_t i) {
  dlrec_rowgroup rg;
  dlrec_status st = dlrec_dlr_row_group(f, i, &rg);
  if (st != DLREC_OK) return st;
  dlrec_dlr_group_info gi;
  dlrec_dlr_group_info_get(f, i, &gi);
  uint32_t computed = dlrec_crc32c(0, f->base + gi.offset, gi.bytes);
  if (computed != gi.crc)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s: row group %u at offset %llu: checksum mismatch (stored 0x%08x, computed 0x%08x)", f->path,
                       i, (ull)gi.offset, gi.crc, computed);
  /* A matching checksum proves the bytes are what the writer wrote; these
   * checks catch a writer that wrote something wrong (or a forged CRC). */
  st = check_offsets(f, i, &rg, gi.offset);
  if (st != DLREC_OK) return st;
  const dlrec_schema *s = &f->schema;
  const unsigned char *g = f->base + gi.offset;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    uint64_t nnz = dlr_get64(g + DLR_GROUP_FIXED + 8 * c);
    const uint32_t *ids = rg.ids[c];
    /* Ranges fit in 32 bits (the validator checks id_end <= 2^32), so
     * a min/max pass that vectorizes decides, and a slow one locates. */
    uint32_t lo = UINT32_MAX, hi = 0;
    for (uint64_t k = 0; k < nnz; k++) {
      lo = ids[k] < lo ? ids[k] : lo;
      hi = ids[k] > hi ? ids[k] : hi;
    }
    if (nnz == 0 || (lo >= col->id_begin && hi < col->id_end)) continue;
    for (uint64_t k = 0; k < nnz; k++) {
      if (ids[k] >= col->id_begin && ids[k] < col->id_end) continue;
      uint64_t r = 0;
      if (col->hotness)
        r = k / col->hotness;
      else
        while (rg.offsets[c][r + 1] <= k) r++;
      return dlrec_error(DLREC_ERR_CORRUPT,
                         "%s: row group %u at offset %llu: sparse column '%s': row %llu (file row %llu) at offset "
                         "%llu: id %u is outside the column's range [%llu, %llu)",
                         f->path, i, (ull)gi.offset, col->name, (ull)r, (ull)(gi.first_row + r),
                         (ull)((const unsigned char *)(ids + k) - f->base), ids[k], (ull)col->id_begin,
                         (ull)col->id_end);
    }
  }
  return DLREC_OK;
}

void dlrec_dlr_prefetch(const dlrec_dlr *f, uint32_t i) {
  if (!f->mapped || i >= f->n_groups) return;
  dlrec_dlr_group_info gi;
  dlrec_dlr_group_info_get(f, i, &gi);
  long page = sysconf(_SC_PAGESIZE);
  uint64_t start = gi.offset & ~(uint64_t)(page - 1);
  (void)madvise((void *)(f->base + start), (size_t)(gi.offset + gi.bytes - start), MADV_WILLNEED);
}
