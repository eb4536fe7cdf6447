/* Arrow record batches as CSV text (data/arrow.h): the batches of a C
 * stream are read in place, a few hundred rows at a time formatted into a
 * text buffer that the reader (input.c) takes as if read from a file. */
#include "data/arrow.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS_PER_FILL 256

/* How a column's values are stored. */
typedef enum kind {
  K_NULL, K_BOOL, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_U64, K_F32, K_F64, K_STR32, K_STR64
} kind;

typedef struct column {
  int64_t child;     /* index among the batch's children */
  kind k;            /* the values' kind, or the indices' with a dictionary */
  int dict;          /* dictionary-encoded: k is the index kind, vk the values' */
  kind vk;
  const char *name;
} column;

struct dlrec_arrow_csv {
  struct ArrowArrayStream stream;
  struct ArrowSchema schema;
  struct ArrowArray batch; /* batch.release != NULL while held */
  char name[256];
  char sep;
  int header_pending, eof;
  int n_cols;
  column *cols;
  int64_t row;       /* the next row of batch */
  uint64_t rows_before; /* rows of the earlier batches, for messages */
  char *text;        /* formatted, not yet handed out: [pos, len) */
  size_t pos, len, cap;
};

static dlrec_status kind_of(const char *fmt, const char *col, const char *what, kind *k) {
  static const struct {
    const char *f;
    kind k;
  } map[] = {{"n", K_NULL}, {"b", K_BOOL}, {"c", K_I8},  {"C", K_U8},  {"s", K_I16},   {"S", K_U16},   {"i", K_I32},
             {"I", K_U32},  {"l", K_I64},  {"L", K_U64}, {"f", K_F32}, {"g", K_F64}, {"u", K_STR32}, {"U", K_STR64},
             {"z", K_STR32}, {"Z", K_STR64}};
  for (size_t i = 0; fmt && i < sizeof map / sizeof *map; i++)
    if (!strcmp(fmt, map[i].f)) {
      *k = map[i].k;
      return DLREC_OK;
    }
  return dlrec_error(DLREC_ERR_UNSUPPORTED,
                     "column '%s': Arrow type '%s'%s is not read (integers, floats, booleans, strings and "
                     "dictionary-encoded strings are; cast it, or format it as strings)",
                     col, fmt ? fmt : "?", what);
}

void dlrec_arrow_csv_free(dlrec_arrow_csv *a) {
  if (!a) return;
  if (a->batch.release) a->batch.release(&a->batch);
  if (a->schema.release) a->schema.release(&a->schema);
  if (a->stream.release) a->stream.release(&a->stream);
  free(a->cols);
  free(a->text);
  free(a);
}

static dlrec_status stream_error(dlrec_arrow_csv *a, int code, const char *what) {
  const char *m = a->stream.get_last_error ? a->stream.get_last_error(&a->stream) : NULL;
  return dlrec_error(DLREC_ERR_IO, "%s: %s: %s", a->name, what, m ? m : strerror(code));
}

dlrec_status dlrec_arrow_csv_open(dlrec_arrow_csv **out, struct ArrowArrayStream *stream, const char *name, int header,
                                  char sep, const char *const *columns, int n_columns) {
  *out = NULL;
  if (!stream || !stream->release) return dlrec_error(DLREC_ERR_INVALID, "%s: no Arrow stream", name ? name : "table");
  dlrec_arrow_csv *a = calloc(1, sizeof *a);
  if (!a) {
    stream->release(stream);
    return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  a->stream = *stream; /* moved: the caller's is marked released */
  stream->release = NULL;
  snprintf(a->name, sizeof a->name, "%s", name ? name : "table");
  a->sep = sep;
  a->header_pending = header;
  int rc = a->stream.get_schema(&a->stream, &a->schema);
  dlrec_status s = rc ? stream_error(a, rc, "reading the schema") : DLREC_OK;
  if (s == DLREC_OK && (!a->schema.format || strcmp(a->schema.format, "+s")))
    s = dlrec_error(DLREC_ERR_INVALID, "%s: the Arrow stream is not of record batches (format '%s')", a->name,
                    a->schema.format ? a->schema.format : "?");
  const int64_t nc = s == DLREC_OK ? a->schema.n_children : 0;
  a->n_cols = columns ? n_columns : (int)nc;
  if (s == DLREC_OK && (a->cols = calloc((size_t)(a->n_cols ? a->n_cols : 1), sizeof *a->cols)) == NULL)
    s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  for (int c = 0; s == DLREC_OK && c < a->n_cols; c++) {
    int64_t k = columns ? -1 : c;
    for (int64_t j = 0; columns && j < nc; j++)
      if (a->schema.children[j]->name && !strcmp(a->schema.children[j]->name, columns[c])) k = j;
    if (k < 0) {
      s = dlrec_error(DLREC_ERR_INVALID, "%s: no column '%s'", a->name, columns[c]);
      break;
    }
    const struct ArrowSchema *f = a->schema.children[k];
    column *col = &a->cols[c];
    col->child = k;
    col->name = f->name ? f->name : "";
    s = kind_of(f->format, col->name, f->dictionary ? " (dictionary indices)" : "", &col->k);
    if (s == DLREC_OK && f->dictionary) {
      col->dict = 1;
      if (col->k < K_I8 || col->k > K_U64)
        s = dlrec_error(DLREC_ERR_INVALID, "column '%s': dictionary indices of type '%s'", col->name, f->format);
      if (s == DLREC_OK) s = kind_of(f->dictionary->format, col->name, " (dictionary values)", &col->vk);
    }
  }
  if (s != DLREC_OK) {
    dlrec_arrow_csv_free(a);
    return s;
  }
  *out = a;
  return DLREC_OK;
}

int dlrec_arrow_csv_has_column(const dlrec_arrow_csv *a, const char *name) {
  for (int64_t j = 0; j < a->schema.n_children; j++)
    if (a->schema.children[j]->name && !strcmp(a->schema.children[j]->name, name)) return 1;
  return 0;
}

/* ---- formatting ---- */

static int put(dlrec_arrow_csv *a, const char *s, size_t n) {
  if (!n) return 0; /* s may be an empty buffer's NULL */
  if (a->len + n > a->cap) {
    size_t cap = a->cap ? a->cap : 1 << 16;
    while (cap < a->len + n) cap *= 2;
    char *t = realloc(a->text, cap);
    if (!t) return -1;
    a->text = t;
    a->cap = cap;
  }
  memcpy(a->text + a->len, s, n);
  a->len += n;
  return 0;
}

/* A field: as it is, or quoted (quotes doubled) when it holds the
 * separator, a quote or a carriage return; in the Criteo layout (tabs) such
 * a value cannot be written. A line feed cannot be written in either: the
 * reader splits lines before it unquotes (a CSV file with one is refused
 * too), and here the message can name the row and column. */
static dlrec_status put_field(dlrec_arrow_csv *a, const column *c, const char *s, size_t n) {
  if (memchr(s, '\n', n))
    return dlrec_error(DLREC_ERR_PARSE, "%s: row %llu: column '%s': a value holding a line break cannot be read "
                       "(the CSV parser takes none inside quotes)", a->name,
                       (unsigned long long)(a->rows_before + (uint64_t)a->row), c->name);
  int quote = 0;
  for (size_t i = 0; i < n && !quote; i++) quote = s[i] == a->sep || s[i] == '"' || s[i] == '\r';
  if (quote && a->sep == '\t')
    return dlrec_error(DLREC_ERR_PARSE, "%s: row %llu: column '%s': a value holding a tab, quote or line break "
                       "cannot be written in the Criteo layout", a->name,
                       (unsigned long long)(a->rows_before + (uint64_t)a->row), c->name);
  int e = 0;
  if (!quote) return put(a, s, n) ? dlrec_error(DLREC_ERR_NOMEM, "out of memory") : DLREC_OK;
  e |= put(a, "\"", 1);
  for (size_t i = 0; i < n; i++) e |= s[i] == '"' ? put(a, "\"\"", 2) : put(a, s + i, 1);
  e |= put(a, "\"", 1);
  return e ? dlrec_error(DLREC_ERR_NOMEM, "out of memory") : DLREC_OK;
}

static int bit(const void *bits, int64_t i) { return (((const uint8_t *)bits)[i >> 3] >> (i & 7)) & 1; }

/* Decimal digits of v into buf (at least 21 bytes); the length. */
static int fmt_u64(char *buf, uint64_t v) {
  char t[24];
  int n = 0;
  do t[n++] = (char)('0' + v % 10), v /= 10;
  while (v);
  for (int i = 0; i < n; i++) buf[i] = t[n - 1 - i];
  return n;
}

static int fmt_i64(char *buf, int64_t v) {
  if (v >= 0) return fmt_u64(buf, (uint64_t)v);
  buf[0] = '-';
  return 1 + fmt_u64(buf + 1, 0 - (uint64_t)v);
}

/* The shortest %g form that reads back as v; integers below 10^15 (most
 * values of count features) directly, as %.15g writes them. */
static int fmt_double(char *buf, size_t n, double v) {
  if (fabs(v) < 1e15 && v == (double)(int64_t)v && !(v == 0 && signbit(v))) return fmt_i64(buf, (int64_t)v);
  int k = 0;
  for (int p = 15; p <= 17; p++) {
    k = snprintf(buf, n, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
  return k;
}

static int fmt_float(char *buf, size_t n, float v) {
  if (fabsf(v) < 1e6f && v == (float)(int32_t)v && !(v == 0 && signbit(v))) return fmt_i64(buf, (int32_t)v);
  int k = 0;
  for (int p = 6; p <= 9; p++) {
    k = snprintf(buf, n, "%.*g", p, (double)v);
    if (strtof(buf, NULL) == v) break;
  }
  return k;
}

/* Integer i of an array of integer kind k (u64 read as its bits). */
static int64_t index_at(const struct ArrowArray *x, kind k, int64_t i) {
  const void *v = x->buffers[1];
  switch (k) {
  case K_I8: return ((const int8_t *)v)[i];
  case K_U8: return ((const uint8_t *)v)[i];
  case K_I16: return ((const int16_t *)v)[i];
  case K_U16: return ((const uint16_t *)v)[i];
  case K_I32: return ((const int32_t *)v)[i];
  case K_U32: return ((const uint32_t *)v)[i];
  case K_I64: return ((const int64_t *)v)[i];
  default: return (int64_t)((const uint64_t *)v)[i];
  }
}

/* Value i (physical index, the array's offset applied) of an array of kind
 * k as text into buf (numbers) or *s and *n (strings); 0: null or NaN, an
 * empty field. */
static int value_text(const struct ArrowArray *x, kind k, int64_t i, char *buf, size_t cap, const char **s, size_t *n) {
  if (k == K_NULL || (x->null_count != 0 && x->buffers[0] && !bit(x->buffers[0], i))) return 0;
  const void *v = x->n_buffers > 1 ? x->buffers[1] : NULL;
  int len = 0;
  switch (k) {
  case K_BOOL: len = fmt_u64(buf, (uint64_t)bit(v, i)); break;
  case K_I8: case K_U8: case K_I16: case K_U16: case K_I32: case K_U32: case K_I64:
    len = fmt_i64(buf, index_at(x, k, i)); /* every one of them fits an int64 */
    break;
  case K_U64: len = fmt_u64(buf, ((const uint64_t *)v)[i]); break;
  case K_F32: {
    float f = ((const float *)v)[i];
    if (isnan(f)) return 0; /* as pandas writes NaN: missing */
    len = fmt_float(buf, cap, f);
    break;
  }
  case K_F64: {
    double d = ((const double *)v)[i];
    if (isnan(d)) return 0;
    len = fmt_double(buf, cap, d);
    break;
  }
  case K_STR32: {
    const int32_t *off = v;
    *n = (size_t)(off[i + 1] - off[i]);
    *s = *n ? (const char *)x->buffers[2] + off[i] : ""; /* the data of empty strings may be NULL */
    return 1;
  }
  case K_STR64: {
    const int64_t *off = v;
    *n = (size_t)(off[i + 1] - off[i]);
    *s = *n ? (const char *)x->buffers[2] + off[i] : "";
    return 1;
  }
  default: return 0;
  }
  *s = buf;
  *n = (size_t)len;
  return 1;
}


static dlrec_status put_row(dlrec_arrow_csv *a, int64_t r) {
  char buf[64];
  for (int c = 0; c < a->n_cols; c++) {
    const column *col = &a->cols[c];
    const struct ArrowArray *x = a->batch.children[col->child];
    if (c && put(a, &a->sep, 1)) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    const char *s = NULL;
    size_t n = 0;
    int64_t i = a->batch.offset + x->offset + r; /* a struct's offset applies to its children */
    int have;
    if (col->dict) {
      have = !(x->null_count != 0 && x->buffers[0] && !bit(x->buffers[0], i));
      if (have) {
        const struct ArrowArray *d = x->dictionary;
        int64_t j = index_at(x, col->k, i);
        if (j < 0 || j >= d->length) {
          const int len = col->k == K_U64 ? fmt_u64(buf, (uint64_t)j) : fmt_i64(buf, j); /* as stored */
          return dlrec_error(DLREC_ERR_INVALID, "%s: row %llu: column '%s': dictionary index %.*s out of range (the "
                             "dictionary has %lld values)", a->name, (unsigned long long)(a->rows_before + (uint64_t)r),
                             col->name, len, buf, (long long)d->length);
        }
        have = value_text(d, col->vk, d->offset + j, buf, sizeof buf, &s, &n);
      }
    } else {
      have = value_text(x, col->k, i, buf, sizeof buf, &s, &n);
    }
    if (have) {
      dlrec_status st = put_field(a, col, s, n);
      if (st != DLREC_OK) return st;
    }
  }
  return put(a, "\n", 1) ? dlrec_error(DLREC_ERR_NOMEM, "out of memory") : DLREC_OK;
}

/* Whether array x (of kind k) can be read for rows [0, rows) of its own
 * (rows > 0): the buffers its kind needs, and enough of them; a message
 * names what not. */
static const char *array_problem(const struct ArrowArray *x, kind k, int64_t rows) {
  const int64_t need = k == K_NULL ? 0 : k == K_STR32 || k == K_STR64 ? 3 : 2;
  if (!x) return "no array";
  if (x->offset < 0) return "a negative offset";
  if (x->length < rows) return "fewer values than the batch has rows";
  if (x->n_buffers < need || (need && !x->buffers)) return "too few buffers for its type";
  if (need && !x->buffers[1]) return "no values buffer";
  return NULL;
}

/* The columns of a new batch, checked before any of it is read: a broken
 * export is refused, naming the column, rather than read out of bounds. */
static dlrec_status check_batch(dlrec_arrow_csv *a) {
  const struct ArrowArray *b = &a->batch;
  if (b->n_children != a->schema.n_children)
    return dlrec_error(DLREC_ERR_INVALID, "%s: a record batch of %lld columns, the schema has %lld", a->name,
                       (long long)b->n_children, (long long)a->schema.n_children);
  for (int c = 0; b->length > 0 && c < a->n_cols; c++) {
    const column *col = &a->cols[c];
    const struct ArrowArray *x = b->children ? b->children[col->child] : NULL;
    const char *why = b->offset < 0 ? "a negative batch offset" : array_problem(x, col->k, b->offset + b->length);
    if (!why && col->dict) {
      const struct ArrowArray *d = x->dictionary;
      why = !d ? "a dictionary column without its dictionary" : d->length ? array_problem(d, col->vk, d->length) : NULL;
    }
    if (why)
      return dlrec_error(DLREC_ERR_INVALID, "%s: record batch from row %llu: column '%s': %s", a->name,
                         (unsigned long long)a->rows_before, col->name, why);
  }
  return DLREC_OK;
}

/* More text into the buffer: the header, or the next rows (the next batch
 * when this one is done); sets eof after the last. */
static dlrec_status fill(dlrec_arrow_csv *a) {
  a->pos = a->len = 0;
  if (a->header_pending) {
    a->header_pending = 0;
    for (int c = 0; c < a->n_cols; c++) {
      if (c && put(a, &a->sep, 1)) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
      dlrec_status st = put_field(a, &a->cols[c], a->cols[c].name, strlen(a->cols[c].name));
      if (st != DLREC_OK) return st;
    }
    return put(a, "\n", 1) ? dlrec_error(DLREC_ERR_NOMEM, "out of memory") : DLREC_OK;
  }
  while (!a->batch.release || a->row >= a->batch.length) {
    if (a->batch.release) {
      a->rows_before += (uint64_t)a->batch.length;
      a->batch.release(&a->batch);
      a->batch.release = NULL;
    }
    int rc = a->stream.get_next(&a->stream, &a->batch);
    if (rc) return stream_error(a, rc, "reading a record batch");
    if (!a->batch.release) {
      a->eof = 1;
      return DLREC_OK;
    }
    dlrec_status st = check_batch(a);
    if (st != DLREC_OK) return st;
    a->row = 0;
  }
  for (int k = 0; k < ROWS_PER_FILL && a->row < a->batch.length; k++, a->row++) {
    dlrec_status st = put_row(a, a->row);
    if (st != DLREC_OK) return st;
  }
  return DLREC_OK;
}

static dlrec_status read_text(void *ctx, char *buf, size_t want, size_t *got) {
  dlrec_arrow_csv *a = ctx;
  *got = 0;
  while (*got < want) {
    if (a->pos == a->len) {
      if (a->eof) break;
      dlrec_status st = fill(a);
      if (st != DLREC_OK) return st;
      continue;
    }
    size_t n = a->len - a->pos < want - *got ? a->len - a->pos : want - *got;
    memcpy(buf + *got, a->text + a->pos, n);
    a->pos += n;
    *got += n;
  }
  return DLREC_OK;
}

dlrec_source dlrec_arrow_csv_source(dlrec_arrow_csv *a) {
  return (dlrec_source){.name = a->name, .read = read_text, .ctx = a};
}
