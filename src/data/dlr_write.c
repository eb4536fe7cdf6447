/* Writing .dlr files: row groups appended to PATH.tmp, then the index and the
 * final header, fsync and an atomic rename (layout: dlr_format.h and
 * docs/formats.md). Readers never see a partial file under PATH: the header
 * carries a "complete" flag that only dlrec_dlr_writer_finish sets. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "data/dlr_format.h"
#include "core/crc32c.h"
#include "core/fsutil.h"

typedef struct index_entry {
  uint64_t offset, bytes;
  uint32_t rows, crc;
} index_entry;

struct dlrec_dlr_writer {
  char *path, *tmp;
  int fd;
  dlrec_schema schema;
  uint64_t header_bytes;
  uint64_t end; /* bytes written so far: where the next group starts */
  uint64_t rows;
  index_entry *groups;
  uint64_t n_groups, cap_groups;
  dlrec_status failed; /* an I/O error poisoned the file; DLREC_OK otherwise */
  dlrec_error_copy failure;
  unsigned char *header; /* header_bytes, rebuilt by finish */
};

static const unsigned char zeros[DLR_ALIGN];

/* Fills w->header from the schema and the counts so far. */
static void build_header(dlrec_dlr_writer *w, int complete, uint64_t index_offset) {
  const dlrec_schema *s = &w->schema;
  unsigned char *h = w->header;
  memset(h, 0, w->header_bytes);
  memcpy(h + DLR_HDR_MAGIC, DLR_MAGIC, 8);
  dlr_put32(h + DLR_HDR_VERSION, DLREC_DLR_VERSION);
  dlr_put32(h + DLR_HDR_BYTES, (uint32_t)w->header_bytes);
  dlr_put32(h + DLR_HDR_FLAGS, (complete ? DLR_FLAG_COMPLETE : 0) | (s->has_label ? DLR_FLAG_HAS_LABEL : 0) |
                                   (s->keys ? DLR_FLAG_KEYS : 0));
  dlr_put32(h + DLR_HDR_N_DENSE, s->n_dense);
  dlr_put32(h + DLR_HDR_N_SPARSE, s->n_sparse);
  dlr_put64(h + DLR_HDR_ROWS, w->rows);
  dlr_put64(h + DLR_HDR_GROUPS, w->n_groups);
  dlr_put64(h + DLR_HDR_INDEX_OFFSET, index_offset);
  dlr_put64(h + DLR_HDR_TABLE_ROWS, s->table_rows);
  /* Names are copied up to their NUL so that bytes after it (whatever the
   * caller's struct held) never reach the file: equal schemas, equal bytes. */
  if (s->has_label) memcpy(h + DLR_HDR_LABEL_NAME, s->label_name, strlen(s->label_name));
  unsigned char *p = h + DLR_HDR_FIXED;
  for (uint32_t i = 0; i < s->n_dense; i++, p += DLREC_NAME_MAX)
    memcpy(p, s->dense_names[i], strlen(s->dense_names[i]));
  for (uint32_t i = 0; i < s->n_sparse; i++, p += DLR_SPARSE_REC) {
    const dlrec_sparse_col *c = &s->sparse[i];
    memcpy(p, c->name, strlen(c->name));
    dlr_put32(p + 48, c->hotness);
    dlr_put32(p + 52, c->max_hotness);
    dlr_put64(p + 56, c->id_begin);
    dlr_put64(p + 64, c->id_end);
  }
  dlr_put32(h + w->header_bytes - 4, dlrec_crc32c(0, h, w->header_bytes - 4));
}

dlrec_status dlrec_dlr_writer_open(dlrec_dlr_writer **out, const char *path, const dlrec_schema *s) {
  *out = NULL;
  dlrec_status st = dlrec_schema_validate(s, path);
  if (st != DLREC_OK) return st;
  dlrec_dlr_writer *w = calloc(1, sizeof *w);
  if (!w) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  w->fd = -1;
  w->schema = *s;
  w->header_bytes = dlr_header_bytes(s->n_dense, s->n_sparse);
  size_t n = strlen(path);
  w->path = malloc(n + 1);
  w->tmp = malloc(n + 5);
  w->header = malloc(w->header_bytes);
  if (!w->path || !w->tmp || !w->header) {
    dlrec_dlr_writer_abort(w);
    return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  }
  memcpy(w->path, path, n + 1);
  memcpy(w->tmp, path, n);
  memcpy(w->tmp + n, ".tmp", 5);
  /* O_TRUNC, not O_EXCL: a .tmp left by a crashed writer must not block the
   * next run; two live writers of one path are a usage error either way. */
  w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd < 0) {
    st = dlrec_error(DLREC_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    free(w->tmp);
    w->tmp = NULL; /* nothing to remove */
    dlrec_dlr_writer_abort(w);
    return st;
  }
  /* The header goes out now, incomplete, so that the groups land at their
   * final offsets; finish rewrites it in place with the counts. */
  build_header(w, 0, 0);
  st = dlrec_write_all(w->fd, w->header, w->header_bytes, w->tmp);
  if (st != DLREC_OK) {
    dlrec_dlr_writer_abort(w);
    return st;
  }
  w->end = w->header_bytes;
  *out = w;
  return DLREC_OK;
}

uint64_t dlrec_dlr_writer_rows(const dlrec_dlr_writer *w) { return w->rows; }

/* Checks a caller's row group before any byte is written, and computes each
 * column's nnz. Errors name the file, the group about to be written, the
 * column and the row (in the group and in the file). */
static dlrec_status check_group(const dlrec_dlr_writer *w, const dlrec_rowgroup *rg, uint64_t *nnz) {
  const dlrec_schema *s = &w->schema;
  const char *path = w->path;
  uint64_t g = w->n_groups;
  if (rg->rows < 1 || rg->rows > DLREC_DLR_MAX_GROUP_ROWS)
    return dlrec_error(DLREC_ERR_INVALID, "%s: row group %llu: %u rows (must be 1..%u)", path, (unsigned long long)g,
                       rg->rows, DLREC_DLR_MAX_GROUP_ROWS);
  if (s->has_label && !rg->labels)
    return dlrec_error(DLREC_ERR_INVALID, "%s: row group %llu: no labels, but the schema has label '%s'", path,
                       (unsigned long long)g, s->label_name);
  if (s->n_dense && !rg->dense)
    return dlrec_error(DLREC_ERR_INVALID, "%s: row group %llu: no dense values for %u dense columns", path,
                       (unsigned long long)g, s->n_dense);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    const uint32_t *off = rg->offsets[c], *ids = rg->ids[c];
    if (col->hotness) {
      nnz[c] = (uint64_t)rg->rows * col->hotness;
    } else {
      if (!off)
        return dlrec_error(DLREC_ERR_INVALID,
                           "%s: row group %llu: sparse column '%s' has variable hotness but no offsets", path,
                           (unsigned long long)g, col->name);
      if (off[0] != 0)
        return dlrec_error(DLREC_ERR_INVALID, "%s: row group %llu: sparse column '%s': offsets[0] is %u, must be 0",
                           path, (unsigned long long)g, col->name, off[0]);
      for (uint32_t r = 0; r < rg->rows; r++) {
        if (off[r + 1] < off[r])
          return dlrec_error(DLREC_ERR_INVALID,
                             "%s: row group %llu: sparse column '%s': row %u (file row %llu): offsets decrease "
                             "(%u after %u)",
                             path, (unsigned long long)g, col->name, r, (unsigned long long)(w->rows + r), off[r + 1],
                             off[r]);
        if (off[r + 1] - off[r] > col->max_hotness)
          return dlrec_error(DLREC_ERR_INVALID,
                             "%s: row group %llu: sparse column '%s': row %u (file row %llu): %u ids, more than "
                             "max hotness %u",
                             path, (unsigned long long)g, col->name, r, (unsigned long long)(w->rows + r),
                             off[r + 1] - off[r], col->max_hotness);
      }
      nnz[c] = off[rg->rows];
    }
    if (nnz[c] && !ids)
      return dlrec_error(DLREC_ERR_INVALID, "%s: row group %llu: sparse column '%s': no ids", path,
                         (unsigned long long)g, col->name);
    uint32_t hot = col->hotness;
    for (uint64_t k = 0; k < nnz[c]; k++) {
      if (ids[k] < col->id_begin || ids[k] >= col->id_end) {
        /* Find the row of id k for the message; only on the error path. */
        uint64_t r = hot ? k / hot : 0;
        if (!hot)
          while (off[r + 1] <= k) r++;
        return dlrec_error(DLREC_ERR_INVALID,
                           "%s: row group %llu: sparse column '%s': row %llu (file row %llu): id %u is outside the "
                           "column's range [%llu, %llu)",
                           path, (unsigned long long)g, col->name, (unsigned long long)r,
                           (unsigned long long)(w->rows + r), ids[k], (unsigned long long)col->id_begin,
                           (unsigned long long)col->id_end);
      }
    }
  }
  return DLREC_OK;
}

/* Queues one section (and the zero padding that aligns the next) for writev,
 * extending the group's CRC. */
typedef struct gather {
  struct iovec iov[2 * DLREC_MAX_SPARSE * 2 + 8];
  int n;
  uint64_t bytes;
  uint32_t crc;
} gather;

static void gather_add(gather *g, const void *p, uint64_t n) {
  if (!n) return;
  g->iov[g->n].iov_base = (void *)p;
  g->iov[g->n].iov_len = n;
  g->n++;
  g->bytes += n;
  g->crc = dlrec_crc32c(g->crc, p, n);
}

static void gather_pad(gather *g, uint64_t to) {
  if (to > g->bytes) gather_add(g, zeros, to - g->bytes);
}

/* writev until done: sections are large, and one call per group keeps small
 * groups cheap too. */
static dlrec_status writev_all(int fd, struct iovec *iov, int n, const char *path) {
  while (n > 0) {
    int batch = n < IOV_MAX ? n : IOV_MAX;
    ssize_t wr = writev(fd, iov, batch);
    if (wr < 0) {
      if (errno == EINTR) continue;
      return dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    size_t left = (size_t)wr;
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      iov++;
      n--;
    }
    if (n > 0 && left) {
      iov->iov_base = (char *)iov->iov_base + left;
      iov->iov_len -= left;
    }
  }
  return DLREC_OK;
}

static dlrec_status fail_io(dlrec_dlr_writer *w, dlrec_status st) {
  w->failed = st;
  dlrec_error_save(&w->failure);
  return st;
}

dlrec_status dlrec_dlr_writer_append(dlrec_dlr_writer *w, const dlrec_rowgroup *rg) {
  if (w->failed != DLREC_OK) return dlrec_error_restore(&w->failure);
  const dlrec_schema *s = &w->schema;
  uint64_t nnz[DLREC_MAX_SPARSE];
  dlrec_status st = check_group(w, rg, nnz);
  if (st != DLREC_OK) return st;
  if (w->n_groups >= UINT32_MAX)
    return dlrec_error(DLREC_ERR_INVALID, "%s: more than %u row groups", w->path, UINT32_MAX - 1);
  if (w->n_groups == w->cap_groups) {
    uint64_t cap = w->cap_groups ? 2 * w->cap_groups : 64;
    index_entry *g = realloc(w->groups, cap * sizeof *g);
    if (!g) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", w->path);
    w->groups = g;
    w->cap_groups = cap;
  }

  dlr_layout lay;
  dlr_layout_compute(&lay, s, rg->rows, nnz);
  unsigned char gh[DLR_GROUP_FIXED + 8 * DLREC_MAX_SPARSE];
  memset(gh, 0, sizeof gh);
  dlr_put32(gh, DLR_GROUP_MAGIC);
  dlr_put32(gh + 4, rg->rows);
  dlr_put32(gh + 8, (uint32_t)w->n_groups);
  for (uint32_t c = 0; c < s->n_sparse; c++) dlr_put64(gh + DLR_GROUP_FIXED + 8 * c, nnz[c]);

  gather g = {.n = 0};
  gather_add(&g, gh, DLR_GROUP_FIXED + 8ull * s->n_sparse);
  gather_pad(&g, lay.labels);
  if (s->has_label) gather_add(&g, rg->labels, 4ull * rg->rows);
  gather_pad(&g, lay.dense);
  gather_add(&g, rg->dense, 4ull * rg->rows * s->n_dense);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    if (s->sparse[c].hotness == 0) {
      gather_pad(&g, lay.offsets[c]);
      gather_add(&g, rg->offsets[c], 4ull * (rg->rows + 1ull));
    }
    gather_pad(&g, lay.ids[c]);
    gather_add(&g, rg->ids[c], 4ull * nnz[c]);
  }
  gather_pad(&g, lay.bytes);
  if (g.bytes != lay.bytes) return dlrec_error(DLREC_ERR_INTERNAL, "%s: group layout mismatch", w->path);

  st = writev_all(w->fd, g.iov, g.n, w->tmp);
  if (st != DLREC_OK) return fail_io(w, st);
  w->groups[w->n_groups++] = (index_entry){w->end, lay.bytes, rg->rows, g.crc};
  w->end += lay.bytes;
  w->rows += rg->rows;
  return DLREC_OK;
}

dlrec_status dlrec_dlr_writer_finish(dlrec_dlr_writer *w) {
  if (w->failed != DLREC_OK) {
    dlrec_status st = dlrec_error_restore(&w->failure);
    dlrec_dlr_writer_abort(w);
    return st;
  }
  uint64_t index_offset = w->end; /* groups end on a multiple of 64 */
  size_t ib = (size_t)dlr_index_bytes(w->n_groups);
  unsigned char *idx = malloc(ib);
  if (!idx) {
    dlrec_dlr_writer_abort(w);
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory writing the index");
  }
  dlr_put32(idx, DLR_INDEX_MAGIC);
  dlr_put32(idx + 4, 0);
  dlr_put64(idx + 8, w->n_groups);
  for (uint64_t i = 0; i < w->n_groups; i++) {
    unsigned char *e = idx + DLR_INDEX_FIXED + DLR_INDEX_ENTRY * i;
    dlr_put64(e, w->groups[i].offset);
    dlr_put64(e + 8, w->groups[i].bytes);
    dlr_put32(e + 16, w->groups[i].rows);
    dlr_put32(e + 20, w->groups[i].crc);
  }
  dlr_put32(idx + ib - 4, dlrec_crc32c(0, idx, ib - 4));
  dlrec_status st = dlrec_write_all(w->fd, idx, ib, w->tmp);
  free(idx);
  /* The index and groups reach the disk before the header says "complete":
   * a crash between the two leaves an incomplete file, never a wrong one. */
  if (st == DLREC_OK && fdatasync(w->fd) != 0)
    st = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
  if (st == DLREC_OK) {
    build_header(w, 1, index_offset);
    st = dlrec_pwrite_all(w->fd, w->header, w->header_bytes, 0, w->tmp);
  }
  if (st == DLREC_OK && fsync(w->fd) != 0)
    st = dlrec_error(DLREC_ERR_IO, "%s: fsync failed: %s", w->tmp, strerror(errno));
  if (close(w->fd) != 0 && st == DLREC_OK)
    st = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", w->tmp, strerror(errno));
  w->fd = -1;
  if (st == DLREC_OK) st = dlrec_rename_durable(w->tmp, w->path);
  if (st != DLREC_OK) {
    dlrec_error_copy e;
    dlrec_error_save(&e);
    dlrec_dlr_writer_abort(w); /* removes the .tmp if the rename did not happen */
    return dlrec_error_restore(&e);
  }
  free(w->tmp);
  w->tmp = NULL;
  dlrec_dlr_writer_abort(w); /* frees what is left; the file is in place */
  return DLREC_OK;
}

void dlrec_dlr_writer_abort(dlrec_dlr_writer *w) {
  if (!w) return;
  if (w->fd >= 0) close(w->fd);
  if (w->tmp) unlink(w->tmp);
  free(w->path);
  free(w->tmp);
  free(w->groups);
  free(w->header);
  free(w);
}
