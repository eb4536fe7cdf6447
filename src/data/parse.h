/* Raw text rows: Criteo TSV and CSV with a header, cut into typed fields.
 *
 * Three layers, each usable on its own:
 *   - value parsers: one field's text -> a number, a 0/1 label or a 64-bit
 *     categorical key (dlrec_parse_number, dlrec_parse_hex_key, dlrec_cat_key);
 *   - layouts: which field of a line is the label, which are dense and which
 *     are categorical columns (fixed for Criteo, from a header and a schema
 *     SPEC for CSV; see docs/etl.md for the SPEC syntax);
 *   - row splitting: one line -> views of its label, dense and categorical
 *     fields (dlrec_parse_row), without copying unless CSV quotes need
 *     unescaping;
 * and a block reader that streams a file (or stdin) as blocks of whole lines
 * with their line numbers, for the ETL's parallel pipeline.
 *
 * Errors on rows read "FILE:LINE: field N (NAME): reason: 'value'", with N
 * counted from 1, so a user can open the file at the right place.
 */
#ifndef DLREC_PARSE_H
#define DLREC_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "data/schema.h"
#include "core/status.h"

/* ---- value parsers (no error state: they return NULL or a static reason) ---- */

/* Parses a decimal number: [+-]digits[.digits][(e|E)[+-]digits] (also ".5"
 * and "5."), nothing else: no spaces, hex, "nan" or "inf". Integers of up to
 * 18 digits take a fast path that does not call strtod. Returns NULL and sets
 * *out on success, otherwise a static reason ("not a number", "out of range").
 * n must be > 0 (an empty field is "missing", decided by the caller). */
const char *dlrec_parse_number(const char *s, size_t n, double *out);

/* Parses 1 to 16 hex digits (either case) into *out. Returns NULL on success
 * or a static reason. */
const char *dlrec_parse_hex_key(const char *s, size_t n, uint64_t *out);

/* How a categorical column turns its text into a 64-bit key. Stored in the
 * ETL state, so that serving derives keys exactly as the ETL did. */
typedef enum dlrec_key_kind {
  DLREC_KEY_HEX = 0,  /* 1-16 hex digits; the key is their value (Criteo) */
  DLREC_KEY_HASH = 1, /* any bytes; the key is dlrec_hash_bytes(s, n, salt) (CSV) */
  DLREC_KEY_DEC = 2,  /* 1-18 decimal digits; the key is their value (libSVM/libFM indices) */
} dlrec_key_kind;

/* Parses 1 to 18 decimal digits into *out. NULL on success, else a reason. */
const char *dlrec_parse_dec_key(const char *s, size_t n, uint64_t *out);

/* The key of a non-empty categorical value. NULL on success, else a reason. */
static inline const char *dlrec_cat_key(dlrec_key_kind kind, uint64_t salt, const char *s, size_t n,
                                        uint64_t *key);

/* The salt of a hashed (CSV) categorical column: a hash of its name, so that
 * equal strings in different columns get different keys. */
uint64_t dlrec_cat_salt(const char *column_name);

/* ---- layouts ---- */

typedef enum dlrec_input_format {
  DLREC_FORMAT_CRITEO = 0, /* label?, I1..I13, C1..C26; tab-separated; no header */
  DLREC_FORMAT_CSV = 1,    /* comma-separated, RFC 4180 quoting, a header line */
  DLREC_FORMAT_LIBSVM = 2, /* label idx:val ...: one multi-hot column "features" */
  DLREC_FORMAT_LIBFM = 3,  /* label field:idx:val ...: one column per field, f0..f<N-1> */
} dlrec_input_format;

/* "criteo" / "csv" / "libsvm" / "libfm"; NULL for an unknown value. */
const char *dlrec_format_name(dlrec_input_format f);
/* Parses one of the names above; an error names the value. */
dlrec_status dlrec_format_parse(const char *s, dlrec_input_format *out);

/* Which named columns play which role: the label (optional), dense columns
 * and categorical columns, in the order the encoded rows hold them. */
typedef struct dlrec_columns {
  int has_label;
  char label[DLREC_NAME_MAX];
  uint32_t n_dense, n_cat;
  char dense[DLREC_MAX_DENSE][DLREC_NAME_MAX];
  char cat[DLREC_MAX_SPARSE][DLREC_NAME_MAX];
  /* Multi-hot columns: the byte that separates a field's values (0: one-hot),
   * the pooling (dlrec_pooling) and the most values a row keeps (0: the most
   * any row had in fit). Set by the SPEC's multi= and for libSVM/libFM. */
  char sep[DLREC_MAX_SPARSE];
  uint8_t pooling[DLREC_MAX_SPARSE];
  uint32_t max_hotness[DLREC_MAX_SPARSE];
} dlrec_columns;

/* The Criteo columns: label "label" (when has_label), I1..I13, C1..C26. */
void dlrec_columns_criteo(dlrec_columns *c, int has_label);

/* The libSVM columns (one multi-hot column "features") or the libFM ones
 * (fields columns "f0".."f<fields-1>", each multi-hot), with label "label"
 * when has_label; every column pools with `pooling` and keeps at most
 * max_hotness values a row (0: as many as fit saw). */
dlrec_status dlrec_columns_svm(dlrec_columns *c, dlrec_input_format f, uint32_t fields, int has_label,
                               dlrec_pooling pooling, uint32_t max_hotness);

/* Resolves a schema SPEC ("label=click;ignore=id;cat=*") against a CSV
 * header's column names: a named column must exist, each column gets at most
 * one role, `*` takes every column not named elsewhere, NAME1..NAME9 expands
 * a numbered range, and a column left without a role is an error (name it in
 * ignore= or use *). Errors name the SPEC item or column. */
dlrec_status dlrec_columns_from_spec(dlrec_columns *c, const char *spec, const char *const *header,
                                     uint32_t n_header);

/* A SPEC may also declare multi-hot CSV columns: multi=NAME:SEP[:POOL[:MAX]]
 * (e.g. multi=genres:|:mean:8) makes categorical column NAME a list of values
 * separated by the byte SEP, pooled by sum (the default) or mean, at most MAX
 * values a row (the rest dropped and counted). */

/* Where each field of a line goes. Opaque; built by the constructors below. */
typedef struct dlrec_layout dlrec_layout;

/* Role of a field in a line. */
typedef enum dlrec_role { DLREC_ROLE_IGNORE = 0, DLREC_ROLE_LABEL, DLREC_ROLE_DENSE, DLREC_ROLE_CAT } dlrec_role;

/* The Criteo TSV layout: 40 fields (39 without a label). Rows may have fewer
 * fields when their tail is empty (Criteo's files strip trailing empty
 * fields); more is an error. */
dlrec_status dlrec_layout_criteo(dlrec_layout **L, int has_label);

/* The libSVM / libFM layout for columns c (from dlrec_columns_svm). A line is
 * a label (unless has_label is 0) and items separated by spaces or tabs:
 * libSVM `idx:val`, libFM `field:idx:val`, with idx and field decimal
 * integers (field < c->n_cat) and val a number equal to 1 (one-hot data).
 * The label is 0 or 1, or -1 or +1 (read as 0 and 1). */
dlrec_status dlrec_layout_svm(dlrec_layout **L, const dlrec_columns *c, dlrec_input_format f, int has_label);

/* A CSV layout for a file whose header line (the text of line 1, without its
 * line end) is `header`: columns of c are found by name; header columns not in
 * c are ignored (reported by dlrec_layout_ignored). With has_label 0 the
 * label column need not exist (and is ignored if it does). `file` names the
 * file in errors. */
dlrec_status dlrec_layout_csv(dlrec_layout **L, const dlrec_columns *c, int has_label, const char *header,
                              size_t header_bytes, const char *file);

/* Splits a CSV header line into names (RFC 4180 quoting). *names is one
 * malloc'd block (free it with free()); names are NUL-terminated. */
dlrec_status dlrec_csv_split_header(const char *line, size_t n, const char *file, char ***names,
                                    uint32_t *n_names);

void dlrec_layout_free(dlrec_layout *L); /* accepts NULL */

int dlrec_layout_has_label(const dlrec_layout *L);
uint32_t dlrec_layout_fields(const dlrec_layout *L);   /* fields per line */
uint32_t dlrec_layout_n_dense(const dlrec_layout *L);
uint32_t dlrec_layout_n_cat(const dlrec_layout *L);
/* The name of field i (0-based) as errors show it. */
const char *dlrec_layout_field_name(const dlrec_layout *L, uint32_t i);
/* Header columns the layout ignores, comma-separated ("" if none); valid as
 * long as L. */
const char *dlrec_layout_ignored(const dlrec_layout *L);

/* ---- rows ---- */

/* A view of one field's text (not NUL-terminated). n == 0 means missing. */
typedef struct dlrec_text {
  const char *s;
  uint32_t n;
} dlrec_text;

/* One line's fields by role, as views into the line (or into the scratch
 * buffer for unescaped CSV fields). Large: keep one per thread and reuse it. */
typedef struct dlrec_raw_row {
  uint32_t n_fields; /* fields the line had: a Criteo line may have fewer than
                        dlrec_layout_fields (its tail then reads as empty) */
  dlrec_text label;
  dlrec_text dense[DLREC_MAX_DENSE];
  dlrec_text cat[DLREC_MAX_SPARSE];
} dlrec_raw_row;

/* Where a line comes from, for error messages. Functions taking a
 * `const dlrec_where *` accept NULL for text of no file (a served request):
 * their messages then start at "field N". */
typedef struct dlrec_where {
  const char *file; /* "stdin" for standard input */
  uint64_t line;    /* 1-based */
} dlrec_where;

/* Splits one line (without its '\n'; a trailing '\r' is dropped here) into
 * row. A multi-hot column's text is its values separated by the column's
 * separator (libSVM / libFM: the indices of its items, separated by ' ', in
 * scratch; a column with no item is missing). `scratch` must hold at least n bytes; it receives unescaped CSV
 * fields, so the views stay valid until scratch is reused. Checks the field
 * count, NUL bytes and CSV quoting; does not look at values. On error returns
 * DLREC_ERR_PARSE with "FILE:LINE: reason" or "FILE:LINE: field N (NAME): reason". */
dlrec_status dlrec_parse_row(const dlrec_layout *L, const char *line, size_t n, char *scratch, dlrec_raw_row *row,
                             const dlrec_where *w);

/* Reads a label field: "0" or "1" (a number equal to 0 or 1, e.g. "1.0").
 * libSVM / libFM labels of -1 and +1 reach it already mapped to "0" and "1".
 * NULL on success, else a static reason. */
const char *dlrec_parse_label(const char *s, size_t n, float *out);

/* Sets a parse error "FILE:LINE: field N (NAME): reason: 'value'" (value
 * shown up to 40 bytes, non-printable bytes escaped) and returns
 * DLREC_ERR_PARSE. `field` is 0-based; field_name may be NULL. */
dlrec_status dlrec_parse_error(const dlrec_where *w, uint32_t field, const char *field_name, const char *reason,
                               const char *value, size_t value_bytes);

/* The 0-based field index of dense column i / categorical column i in the
 * layout's lines (for messages). */
uint32_t dlrec_layout_dense_field(const dlrec_layout *L, uint32_t i);
uint32_t dlrec_layout_cat_field(const dlrec_layout *L, uint32_t i);

/* ---- block reader ---- */

/* A block of whole lines: data[0..n) holds `lines` lines, each ending in
 * '\n' except possibly the last one of a file without a final newline. Line
 * numbers start at first_line. The caller owns the block and its buffer
 * (grown by the reader as needed); free it with dlrec_block_free. */
typedef struct dlrec_block {
  char *data;
  size_t n, cap;
  uint64_t first_line;
  uint64_t lines;
} dlrec_block;

void dlrec_block_free(dlrec_block *b);

typedef struct dlrec_reader dlrec_reader;

#define DLREC_BLOCK_BYTES_DEFAULT (4u << 20)
#define DLREC_MAX_LINE_BYTES_DEFAULT (1u << 20)

/* Opens path ("-" for standard input) for reading blocks of about
 * block_bytes (>= 1; small values are for tests). A UTF-8 byte-order mark
 * at the start of the file is dropped (line numbers are unchanged). A line longer than
 * max_line_bytes that does not fit in one block is cut to max_line_bytes + 1
 * bytes (the rest is skipped), so memory stays bounded; either way it reaches
 * the caller longer than max_line_bytes, for the caller to report. */
dlrec_status dlrec_reader_open(dlrec_reader **r, const char *path, size_t block_bytes, size_t max_line_bytes);

/* A stream of bytes that is not a file (an Arrow table formatted as CSV,
 * src/data/arrow_csv.c): read fills up to want bytes of buf and sets *got,
 * 0 at the end; name names it in messages. */
typedef dlrec_status (*dlrec_source_read_fn)(void *ctx, char *buf, size_t want, size_t *got);
typedef struct dlrec_source {
  const char *name;
  dlrec_source_read_fn read;
  void *ctx;
} dlrec_source;

/* dlrec_reader_open on a source instead of a file (its size unknown). */
dlrec_status dlrec_reader_open_source(dlrec_reader **r, const dlrec_source *src, size_t block_bytes,
                                      size_t max_line_bytes);

/* Bytes read so far. */
uint64_t dlrec_reader_bytes(const dlrec_reader *r);

/* Reads one line (for a CSV header) into *line / *n, valid until the next
 * call on r; the line end is not included. DLREC_END on an empty file. */
dlrec_status dlrec_reader_line(dlrec_reader *r, const char **line, size_t *n);

/* Fills b with the next block of whole lines. DLREC_END at end of file. */
dlrec_status dlrec_reader_next(dlrec_reader *r, dlrec_block *b);

void dlrec_reader_close(dlrec_reader *r); /* accepts NULL */

/* ---- inline definitions ---- */

#include "core/hash.h"

static inline const char *dlrec_cat_key(dlrec_key_kind kind, uint64_t salt, const char *s, size_t n,
                                        uint64_t *key) {
  if (kind == DLREC_KEY_HEX) return dlrec_parse_hex_key(s, n, key);
  if (kind == DLREC_KEY_DEC) return dlrec_parse_dec_key(s, n, key);
  *key = dlrec_hash_bytes(s, n, salt);
  return NULL;
}

#endif
