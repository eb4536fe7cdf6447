/* The block reader: a file (or stdin) as blocks of whole lines.
 *
 * Each block is about block_bytes; the partial line at its end is carried
 * into the next block, so a line may span any number of reads. A line longer
 * than max_line_bytes is cut to max_line_bytes + 1 bytes and the rest of it
 * dropped while reading, so memory stays bounded and the row parser can
 * still report it (with its line number) as over-long.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/parse.h"

struct dlrec_reader {
  int fd;                  /* -1 when reading src */
  dlrec_source src;
  char name[1024];
  size_t block_bytes, max_line_bytes;
  char *carry; /* the partial line after the last block */
  size_t carry_n, carry_cap;
  char *line_buf; /* dlrec_reader_line's result */
  size_t line_cap;
  int started;    /* the file's first bytes were checked for a byte-order mark */
  int eof;        /* read() has returned 0 */
  int discarding; /* dropping the rest of an over-long line */
  uint64_t next_line;
  uint64_t bytes;
};

void dlrec_block_free(dlrec_block *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

static dlrec_status grow(char **buf, size_t *cap, size_t need, const char *name) {
  if (need <= *cap) return DLREC_OK;
  size_t nc = *cap ? *cap : 4096;
  while (nc < need) nc *= 2;
  char *nb = realloc(*buf, nc);
  if (!nb) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory for a %zu-byte block", name, nc);
  *buf = nb;
  *cap = nc;
  return DLREC_OK;
}

/* What a file's and a source's readers start from: the sizes checked, the
 * name for messages set, no file yet (fd -1). */
static dlrec_status reader_new(dlrec_reader **out, const char *name, size_t block_bytes, size_t max_line_bytes) {
  *out = NULL;
  if (block_bytes == 0 || max_line_bytes == 0)
    return dlrec_error(DLREC_ERR_INVALID, "reader: block and line sizes must be positive");
  dlrec_reader *r = calloc(1, sizeof *r);
  if (!r) return dlrec_error(DLREC_ERR_NOMEM, "%s: out of memory", name);
  r->block_bytes = block_bytes;
  r->max_line_bytes = max_line_bytes;
  r->next_line = 1;
  r->fd = -1;
  snprintf(r->name, sizeof r->name, "%s", name);
  *out = r;
  return DLREC_OK;
}

dlrec_status dlrec_reader_open(dlrec_reader **out, const char *path, size_t block_bytes, size_t max_line_bytes) {
  const int std_in = !strcmp(path, "-");
  dlrec_status s = reader_new(out, std_in ? "stdin" : path, block_bytes, max_line_bytes);
  if (s != DLREC_OK) return s;
  dlrec_reader *r = *out;
  *out = NULL;
  if (std_in) {
    r->fd = STDIN_FILENO;
  } else {
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
      dlrec_status st = dlrec_error(DLREC_ERR_IO, "%s: %s", path, strerror(errno));
      free(r);
      return st;
    }
  }
  struct stat st;
  if (fstat(r->fd, &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      dlrec_reader_close(r);
      return dlrec_error(DLREC_ERR_IO, "%s: is a directory", path);
    }
  }
  *out = r;
  return DLREC_OK;
}

dlrec_status dlrec_reader_open_source(dlrec_reader **out, const dlrec_source *src, size_t block_bytes,
                                      size_t max_line_bytes) {
  *out = NULL;
  if (!src || !src->read) return dlrec_error(DLREC_ERR_INVALID, "reader: no source to read");
  dlrec_status s = reader_new(out, src->name ? src->name : "(source)", block_bytes, max_line_bytes);
  if (s == DLREC_OK) (*out)->src = *src;
  return s;
}

uint64_t dlrec_reader_bytes(const dlrec_reader *r) { return r->bytes; }

void dlrec_reader_close(dlrec_reader *r) {
  if (!r) return;
  if (r->fd != STDIN_FILENO && r->fd >= 0) close(r->fd);
  free(r->carry);
  free(r->line_buf);
  free(r);
}

/* Appends up to `want` bytes of input to dst[*len..], first dropping what is
 * left of an over-long line. Stops early only at end of file. */
static dlrec_status fill(dlrec_reader *r, char *dst, size_t *len, size_t want) {
  while (want > 0 && !r->eof) {
    ssize_t k;
    if (r->fd < 0) {
      size_t got = 0;
      dlrec_status st = r->src.read(r->src.ctx, dst + *len, want, &got);
      if (st != DLREC_OK) return st;
      k = (ssize_t)got;
    } else {
      k = read(r->fd, dst + *len, want);
    }
    if (k < 0) {
      if (errno == EINTR) continue;
      return dlrec_error(DLREC_ERR_IO, "%s: read failed: %s", r->name, strerror(errno));
    }
    if (k == 0) {
      r->eof = 1;
      break;
    }
    r->bytes += (uint64_t)k;
    size_t got = (size_t)k;
    if (r->discarding) {
      char *nl = memchr(dst + *len, '\n', got);
      if (!nl) continue; /* all of it belongs to the over-long line */
      r->discarding = 0;
      size_t keep = (size_t)(dst + *len + got - (nl + 1));
      memmove(dst + *len, nl + 1, keep);
      got = keep;
    }
    *len += got;
    want -= got;
  }
  return DLREC_OK;
}

/* Drops a UTF-8 byte-order mark at the start of the file: editors and
 * spreadsheet exports write one, and it would otherwise glue itself to the
 * first header name of a CSV ("column 'click' is not in the header") or the
 * first label of a TSV. The bytes after it stay in the carry, as input not
 * yet handed out. */
static dlrec_status skip_bom(dlrec_reader *r) {
  static const char bom[3] = {'\xef', '\xbb', '\xbf'};
  if (r->started) return DLREC_OK;
  r->started = 1;
  dlrec_status st = grow(&r->carry, &r->carry_cap, r->carry_n + sizeof bom, r->name);
  if (st == DLREC_OK) st = fill(r, r->carry, &r->carry_n, sizeof bom - r->carry_n);
  if (st == DLREC_OK && r->carry_n == sizeof bom && !memcmp(r->carry, bom, sizeof bom)) r->carry_n = 0;
  return st;
}

static uint64_t count_newlines(const char *p, size_t n) {
  uint64_t c = 0;
  for (size_t i = 0; i < n; i++) c += p[i] == '\n'; /* vectorized by the compiler */
  return c;
}

dlrec_status dlrec_reader_next(dlrec_reader *r, dlrec_block *b) {
  b->n = 0;
  b->lines = 0;
  b->first_line = r->next_line;
  dlrec_status st = skip_bom(r);
  if (st != DLREC_OK) return st;
  if (r->eof && r->carry_n == 0) return DLREC_END;
  st = grow(&b->data, &b->cap, (r->carry_n > r->block_bytes ? r->carry_n : r->block_bytes) + 1, r->name);
  if (st != DLREC_OK) return st;
  if (r->carry_n) memcpy(b->data, r->carry, r->carry_n);
  size_t n = r->carry_n, scanned = 0;
  r->carry_n = 0;
  size_t target = r->block_bytes;
  for (;;) {
    if (n < target) {
      st = grow(&b->data, &b->cap, target + 2, r->name);
      if (st == DLREC_OK) st = fill(r, b->data, &n, target - n);
      if (st != DLREC_OK) return st;
    }
    const char *last = n > scanned ? memrchr(b->data + scanned, '\n', n - scanned) : NULL;
    if (last) {
      /* Whole lines go out; the partial line after them waits for more input. */
      size_t keep = (size_t)(last + 1 - b->data), tail = n - keep;
      st = grow(&r->carry, &r->carry_cap, tail, r->name);
      if (st != DLREC_OK) return st;
      if (tail) memcpy(r->carry, b->data + keep, tail);
      r->carry_n = tail;
      n = keep;
      break;
    }
    scanned = n;
    if (r->eof) break; /* the last line, without a final newline */
    if (n > r->max_line_bytes) {
      /* Keep max + 1 bytes, enough for the parser to see an over-long line. */
      n = r->max_line_bytes + 1;
      b->data[n++] = '\n';
      r->discarding = 1;
      break;
    }
    target = n + (n > r->block_bytes ? n : r->block_bytes); /* one line spans blocks: grow */
  }
  if (n == 0) return DLREC_END;
  b->n = n;
  b->lines = count_newlines(b->data, n) + (b->data[n - 1] != '\n');
  r->next_line += b->lines;
  return DLREC_OK;
}

dlrec_status dlrec_reader_line(dlrec_reader *r, const char **line, size_t *n) {
  dlrec_status bst = skip_bom(r);
  if (bst != DLREC_OK) return bst;
  size_t scanned = 0;
  for (;;) {
    char *nl = r->carry_n > scanned ? memchr(r->carry + scanned, '\n', r->carry_n - scanned) : NULL;
    if (nl || r->eof) {
      size_t len = nl ? (size_t)(nl - r->carry) : r->carry_n;
      if (!nl && len == 0) return DLREC_END;
      dlrec_status st = grow(&r->line_buf, &r->line_cap, len + 1, r->name);
      if (st != DLREC_OK) return st;
      memcpy(r->line_buf, r->carry, len);
      r->line_buf[len] = '\0';
      size_t used = nl ? len + 1 : len;
      memmove(r->carry, r->carry + used, r->carry_n - used);
      r->carry_n -= used;
      r->next_line++;
      *line = r->line_buf;
      *n = len;
      return DLREC_OK;
    }
    scanned = r->carry_n;
    if (r->carry_n > r->max_line_bytes)
      return dlrec_error(DLREC_ERR_PARSE, "%s:%llu: line longer than %zu bytes (--max-line-bytes)", r->name,
                         (unsigned long long)r->next_line, r->max_line_bytes);
    dlrec_status st = grow(&r->carry, &r->carry_cap, r->carry_n + 65536, r->name);
    if (st == DLREC_OK) st = fill(r, r->carry, &r->carry_n, 65536);
    if (st != DLREC_OK) return st;
  }
}
