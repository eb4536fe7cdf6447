/* vocab.bin, the ETL state's binary half (docs/etl.md): written from the
 * state's arrays (or a vocabulary fit sorted on disk), and checked against
 * etl.json when it is loaded, every column's section in turn, then each
 * operator's section (etl_op.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/etl_op.h"
#include "core/crc32c.h"
#include "core/fsutil.h"

/* vocab.bin: a 32-byte header, then one section per categorical column. */
static const char VOCAB_MAGIC[8] = {'D', 'L', 'R', 'V', 'O', 'C', 'A', 'B'};
#define VOCAB_VERSION 1u
#define VOCAB_HEADER 32u
#define VOCAB_SECTION ETL_VOCAB_SECTION /* encoding u32, reserved u32, n u64 */

static uint64_t section_bytes(int hashed, uint64_t n) {
  return VOCAB_SECTION + (hashed ? ((12 * n + 7) & ~7ull) : 16 * n);
}

/* ---- saving ---- */

/* A buffered writer that checksums what it writes. */
typedef struct vwriter {
  int fd;
  const char *path;
  unsigned char buf[1 << 16];
  size_t n;
  uint32_t crc;
  uint64_t bytes;
} vwriter;

static dlrec_status vw_flush(vwriter *v) {
  dlrec_status st = dlrec_write_all(v->fd, v->buf, v->n, v->path);
  v->n = 0;
  return st;
}

static dlrec_status vw_put(void *ctx, const void *data, size_t n) {
  vwriter *v = ctx;
  v->crc = dlrec_crc32c(v->crc, data, n);
  v->bytes += n;
  const unsigned char *p = data;
  while (n) {
    size_t k = sizeof v->buf - v->n < n ? sizeof v->buf - v->n : n;
    memcpy(v->buf + v->n, p, k);
    v->n += k, p += k, n -= k;
    if (v->n == sizeof v->buf) {
      dlrec_status st = vw_flush(v);
      if (st != DLREC_OK) return st;
    }
  }
  return DLREC_OK;
}

/* A vocabulary fit sorted on disk (keys, then counts): bytes of it. */
static dlrec_status copy_vocab_file(vwriter *v, const etl_runs *f, uint64_t bytes) {
  unsigned char buf[1 << 16];
  for (uint64_t off = 0; off < bytes;) {
    size_t k = bytes - off < sizeof buf ? (size_t)(bytes - off) : sizeof buf;
    dlrec_status st = dlrec_pread_all(f->fd, buf, k, off, f->path);
    if (st == DLREC_OK) st = vw_put(v, buf, k);
    if (st != DLREC_OK) return st;
    off += k;
  }
  return DLREC_OK;
}

dlrec_status etl_vocab_save(const dlrec_etl *e, const char *path, uint64_t *bytes, uint32_t *crc) {
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  vwriter *v = calloc(1, sizeof *v);
  if (!v) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", path);
  v->path = tmp;
  v->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (v->fd < 0) {
    free(v);
    return dlrec_error(DLREC_ERR_IO, "%s: %s", tmp, strerror(errno));
  }
  unsigned char hdr[VOCAB_HEADER] = {0};
  dlrec_status st = dlrec_write_all(v->fd, hdr, sizeof hdr, tmp); /* rewritten at the end */
  for (uint32_t c = 0; st == DLREC_OK && c < e->schema.n_sparse; c++) {
    const etl_cat *k = &e->cat[c];
    uint64_t n = k->hashed ? k->buckets : k->kept;
    unsigned char sec[VOCAB_SECTION] = {0};
    etl_put32(sec, k->hashed ? ETL_ENC_HASHED : ETL_ENC_VOCAB);
    etl_put64(sec + 8, n);
    st = vw_put(v, sec, sizeof sec);
    if (st == DLREC_OK && k->vocab_file) {
      st = copy_vocab_file(v, k->vocab_file, 16 * n);
    } else if (st == DLREC_OK && !k->hashed) {
      st = vw_put(v, k->keys, 8 * n);
      if (st == DLREC_OK) st = vw_put(v, k->counts, 8 * n);
    } else if (st == DLREC_OK) {
      st = vw_put(v, k->bucket_counts, 8 * n);
      if (st == DLREC_OK) st = vw_put(v, k->bucket_rank, 4 * n);
      static const unsigned char pad[8];
      if (st == DLREC_OK && (4 * n) % 8) st = vw_put(v, pad, 8 - (4 * n) % 8);
    }
  }
  /* Then the operators' sections (the target encodings' counts). */
  for (uint32_t d = 0; st == DLREC_OK && d < e->schema.n_dense; d++) {
    const etl_derived *t = &e->dense[d].derived;
    if (t->type && t->type->section_save) st = t->type->section_save(t, vw_put, v);
  }
  if (st == DLREC_OK) st = vw_flush(v);
  if (st == DLREC_OK) {
    memcpy(hdr, VOCAB_MAGIC, 8);
    etl_put32(hdr + 8, VOCAB_VERSION);
    etl_put32(hdr + 12, e->schema.n_sparse);
    etl_put64(hdr + 16, VOCAB_HEADER + v->bytes);
    etl_put32(hdr + 24, v->crc);
    etl_put32(hdr + 28, dlrec_crc32c(0, hdr, 28));
    st = dlrec_pwrite_all(v->fd, hdr, sizeof hdr, 0, tmp);
  }
  if (st == DLREC_OK && fsync(v->fd) != 0) st = dlrec_error(DLREC_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
  if (close(v->fd) != 0 && st == DLREC_OK) st = dlrec_error(DLREC_ERR_IO, "%s: close: %s", tmp, strerror(errno));
  if (st == DLREC_OK) st = dlrec_rename_durable(tmp, path);
  if (st != DLREC_OK) unlink(tmp);
  *bytes = VOCAB_HEADER + v->bytes;
  *crc = v->crc;
  free(v);
  return st;
}

dlrec_status etl_vocab_corrupt(const char *path, const char *fmt, unsigned long long a, unsigned long long b) {
  char msg[300];
  snprintf(msg, sizeof msg, fmt, a, b);
  return dlrec_error(DLREC_ERR_CORRUPT, "%s: %s (the ETL state is damaged: run 'dlrec etl fit' again)", path, msg);
}

/* Column i's section at buf + *off: checked against etl.json, the column
 * pointed into it, *off moved past it. */
static dlrec_status load_column(dlrec_etl *e, uint32_t i, const unsigned char *buf, size_t n, uint64_t *off_io,
                                const char *vpath) {
  const uint64_t off = *off_io;
  etl_cat *c = &e->cat[i];
  const char *name = e->schema.sparse[i].name;
  if (n - off < VOCAB_SECTION) return etl_vocab_corrupt(vpath, "column %llu: section past the end of the file", i, 0);
  uint32_t enc = etl_get32(buf + off);
  uint64_t cnt = etl_get64(buf + off + 8);
  uint64_t want = c->hashed ? c->buckets : c->kept;
  if (enc != (c->hashed ? ETL_ENC_HASHED : ETL_ENC_VOCAB) || cnt != want)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': encoding %u with %llu entries does not match etl.json",
                       vpath, name, enc, (unsigned long long)cnt);
  if (cnt > (n - off) / 12 || section_bytes(c->hashed, cnt) > n - off)
    return etl_vocab_corrupt(vpath, "column %llu: section of %llu entries past the end of the file", i, cnt);
  const unsigned char *p = buf + off + VOCAB_SECTION;
  if (!c->hashed) {
    c->keys = (const uint64_t *)(const void *)p;
    c->counts = (const uint64_t *)(const void *)(p + 8 * cnt);
    /* Order and threshold must hold, as fit wrote them: a cheap, strong check. */
    uint64_t oov_floor = c->derived.type && (c->derived.type->flags & ETL_OP_EVERY_VALUE) ? 1 : e->min_count;
    for (uint64_t k = 0; k < cnt; k++) {
      int ok = c->counts[k] >= oov_floor && c->counts[k] > 0;
      if (k > 0)
        ok = ok && (c->counts[k] < c->counts[k - 1] || (c->counts[k] == c->counts[k - 1] && c->keys[k] > c->keys[k - 1]));
      if (!ok) return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': entry %llu is out of order", vpath, name,
                                  (unsigned long long)k);
    }
  } else {
    c->bucket_counts = (const uint64_t *)(const void *)p;
    c->bucket_rank = (const uint32_t *)(const void *)(p + 8 * cnt);
    unsigned char *seen = calloc(cnt ? cnt : 1, 1);
    if (!seen) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", vpath);
    for (uint64_t b = 0; b < cnt; b++) {
      uint32_t r = c->bucket_rank[b];
      int ok = r < cnt && !seen[r] && (b == 0 || c->bucket_counts[b] <= c->bucket_counts[b - 1]);
      if (!ok) {
        free(seen);
        return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': bucket %llu: bad rank or order", vpath, name,
                           (unsigned long long)b);
      }
      seen[r] = 1;
    }
    free(seen);
  }
  /* The counts must add up to the rows where the column was present (a
   * multi-hot column's: to the values fit counted). */
  uint64_t total = c->hashed ? 0 : c->oov;
  const uint64_t *cs = c->hashed ? c->bucket_counts : c->counts;
  for (uint64_t k = 0; k < cnt; k++) total += cs[k];
  if (c->sep && (total != c->values || c->missing > e->rows))
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': counts add up to %llu values, etl.json says %llu", vpath,
                       name, (unsigned long long)total, (unsigned long long)c->values);
  if (!c->sep && total + c->missing != e->rows)
    return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': counts add up to %llu rows, etl.json says %llu", vpath,
                       name, (unsigned long long)(total + c->missing), (unsigned long long)e->rows);
  *off_io = off + section_bytes(c->hashed, cnt);
  return DLREC_OK;
}

/* Checks vocab.bin against etl.json and points the columns into buf. */
dlrec_status etl_vocab_load(dlrec_etl *e, const char *vpath, unsigned char *buf, size_t n, uint64_t want_bytes,
                            uint32_t want_crc) {
  if (n < VOCAB_HEADER) return etl_vocab_corrupt(vpath, "%llu bytes, shorter than the header", n, 0);
  if (memcmp(buf, VOCAB_MAGIC, 8) != 0) return etl_vocab_corrupt(vpath, "not a vocabulary file (bad magic)", 0, 0);
  if (etl_get32(buf + 28) != dlrec_crc32c(0, buf, 28)) return etl_vocab_corrupt(vpath, "header checksum mismatch", 0, 0);
  if (etl_get32(buf + 8) != VOCAB_VERSION)
    return dlrec_error(DLREC_ERR_VERSION, "%s: version %u, this dlrec reads version %u", vpath, etl_get32(buf + 8),
                       VOCAB_VERSION);
  if (etl_get64(buf + 16) != n) return etl_vocab_corrupt(vpath, "file is %llu bytes, its header says %llu (truncated?)", n, etl_get64(buf + 16));
  if (dlrec_crc32c(0, buf + VOCAB_HEADER, n - VOCAB_HEADER) != etl_get32(buf + 24))
    return etl_vocab_corrupt(vpath, "checksum mismatch in the vocabularies", 0, 0);
  if (n != want_bytes || etl_get32(buf + 24) != want_crc)
    return dlrec_error(DLREC_ERR_CORRUPT,
                       "%s does not belong to etl.json (size or checksum differ): the two files come from different "
                       "fits; run 'dlrec etl fit' again",
                       vpath);
  if (etl_get32(buf + 12) != e->schema.n_sparse)
    return etl_vocab_corrupt(vpath, "%llu columns, etl.json has %llu", etl_get32(buf + 12), e->schema.n_sparse);
  uint64_t off = VOCAB_HEADER;
  for (uint32_t i = 0; i < e->schema.n_sparse; i++) {
    dlrec_status st = load_column(e, i, buf, n, &off, vpath);
    if (st != DLREC_OK) return st;
  }
  for (uint32_t d = 0; d < e->schema.n_dense; d++) {
    etl_derived *t = &e->dense[d].derived;
    if (!t->type || !t->type->section_load) continue;
    uint64_t used = 0;
    dlrec_status st = t->type->section_load(e, t, buf + off, n - off, &used, vpath, d, e->schema.dense_names[d]);
    if (st != DLREC_OK) return st;
    off += used;
  }
  if (off != n) return etl_vocab_corrupt(vpath, "%llu bytes after the last column", n - off, 0);
  return DLREC_OK;
}

dlrec_status etl_build_map(etl_cat *c, const char *vpath, const char *name) {
  dlrec_status st = keymap_init(&c->map, c->kept);
  if (st != DLREC_OK) return st;
  /* Prefetch a few keys ahead: the inserts land on random slots. */
  for (uint64_t k = 0; k < c->kept; k++) {
    if (k + 8 < c->kept) keymap_prefetch(&c->map, keymap_hash(c->keys[k + 8]));
    int added;
    uint64_t *v = keymap_upsert_h(&c->map, c->keys[k], keymap_hash(c->keys[k]), &added);
    if (!v) return DLREC_ERR_NOMEM;
    if (!added)
      return dlrec_error(DLREC_ERR_CORRUPT, "%s: column '%s': key %llu appears twice", vpath, name,
                         (unsigned long long)c->keys[k]);
    *v = ETL_LOCAL_FIRST + k;
  }
  return DLREC_OK;
}

