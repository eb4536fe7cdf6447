/* Value parsers, row splitting and parse errors for Criteo TSV and CSV rows.
 * Layout construction and the schema SPEC live in layout.c; the block reader
 * in input.c. */
#include "data/parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/layout.h"

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif

/* ---- numbers ---- */

/* The slow path: validates the grammar by hand (strtod alone would accept
 * spaces, hex, "nan" and "inf"), then lets strtod round correctly. */
static const char *parse_number_slow(const char *s, size_t n, double *out) {
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-') i++;
  size_t int_digits = 0, frac_digits = 0;
  while (i < n && s[i] >= '0' && s[i] <= '9') i++, int_digits++;
  if (i < n && s[i] == '.') {
    i++;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++, frac_digits++;
  }
  if (int_digits + frac_digits == 0) return "not a number";
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    size_t exp_digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++, exp_digits++;
    if (!exp_digits) return "not a number";
  }
  if (i != n) return "not a number";
  char buf[128];
  if (n >= sizeof buf) return "number longer than 127 characters";
  memcpy(buf, s, n);
  buf[n] = '\0';
  errno = 0;
  double v = strtod(buf, NULL);
  /* ERANGE on underflow returns a tiny or zero value, which is fine; on
   * overflow it returns HUGE_VAL, which is not. */
  if (!isfinite(v)) return "number out of range";
  *out = v == 0 ? 0.0 : v; /* no negative zero: "-0" and "0" encode alike */
  return NULL;
}

const char *dlrec_parse_number(const char *s, size_t n, double *out) {
  if (n == 0) return "empty";
  size_t i = 0;
  int neg = 0;
  if (s[0] == '-' || s[0] == '+') {
    neg = s[0] == '-';
    i = 1;
  }
  /* Fast path: plain integers of up to 18 digits are exact in a uint64 and
   * convert to the nearest double, as strtod would. */
  if (n - i >= 1 && n - i <= 18) {
    uint64_t v = 0;
    size_t j = i;
    for (; j < n; j++) {
      unsigned d = (unsigned)(unsigned char)s[j] - '0';
      if (d > 9) break;
      v = v * 10 + d;
    }
    if (j == n) {
      *out = v == 0 ? 0.0 : (neg ? -(double)v : (double)v);
      return NULL;
    }
  }
  return parse_number_slow(s, n, out);
}

/* ---- hex keys ---- */

static const signed char hex_value[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
    ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
}; /* digit value + 1; 0 marks a non-hex byte */

/* Exactly 8 hex digits (Criteo's categories) at once, SWAR style: classify
 * all 8 bytes as digit or letter with carry-free byte arithmetic, then pack
 * the nibbles. Returns 0 when a byte is not a hex digit. */
static inline int hex8(const char *s, uint64_t *out) {
  const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
  uint64_t w;
  memcpy(&w, s, 8); /* little-endian: s[0] is the low byte */
  if (w & high) return 0;
  uint64_t l = w | 0x2020202020202020ULL; /* 'A'..'F' -> 'a'..'f' */
  /* Bytes are < 0x80, so adding up to 0x50 never carries into the next byte. */
  uint64_t digit = ((w + (0x80 - 0x30) * ones) & ~(w + (0x80 - 0x3a) * ones)) & high;
  uint64_t alpha = ((l + (0x80 - 0x61) * ones) & ~(l + (0x80 - 0x67) * ones)) & high;
  if ((digit | alpha) != high) return 0;
  uint64_t v = (w & 0x0f0f0f0f0f0f0f0fULL) + (alpha >> 7) * 9; /* nibble values */
  v = __builtin_bswap64(v);                                      /* s[0] -> the top byte */
  v = (v | (v >> 4)) & 0x00ff00ff00ff00ffULL;
  v = (v | (v >> 8)) & 0x0000ffff0000ffffULL;
  v = (v | (v >> 16)) & 0x00000000ffffffffULL;
  *out = v;
  return 1;
}

const char *dlrec_parse_hex_key(const char *s, size_t n, uint64_t *out) {
  if (n == 8 && hex8(s, out)) return NULL;
  if (n == 0) return "empty";
  if (n > 16) return "not a hex key (more than 16 digits)";
  uint64_t v = 0;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    int d = hex_value[(unsigned char)s[i]];
    bad |= d == 0;
    v = (v << 4) | (uint64_t)(d - 1);
  }
  if (bad) return "not a hex key";
  *out = v;
  return NULL;
}

const char *dlrec_parse_dec_key(const char *s, size_t n, uint64_t *out) {
  if (n == 0) return "empty";
  if (n > 18) return "index longer than 18 digits";
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned d = (unsigned)(unsigned char)s[i] - '0';
    if (d > 9) return "index is not a non-negative integer";
    v = v * 10 + d;
  }
  *out = v;
  return NULL;
}

uint64_t dlrec_cat_salt(const char *column_name) {
  /* The constant is "dlrecsal" read as a little-endian word: any fixed value
   * would do, it just must never change within a state format version. */
  return dlrec_hash_bytes(column_name, strlen(column_name), 0x6c61736365726c64ULL);
}

const char *dlrec_parse_label(const char *s, size_t n, float *out) {
  if (n == 1 && (s[0] == '0' || s[0] == '1')) {
    *out = (float)(s[0] - '0');
    return NULL;
  }
  if (n == 0) return "label is empty";
  double v;
  if (dlrec_parse_number(s, n, &v) != NULL || (v != 0.0 && v != 1.0)) return "label is not 0 or 1";
  *out = (float)v;
  return NULL;
}

/* ---- errors ---- */

dlrec_status dlrec_parse_error(const dlrec_where *w, uint32_t field, const char *field_name, const char *reason,
                               const char *value, size_t value_bytes) {
  char shown[200];
  size_t k = 0;
  if (value) {
    /* Show at most 40 bytes, escaping what would garble a terminal. */
    size_t lim = value_bytes < 40 ? value_bytes : 40;
    for (size_t i = 0; i < lim && k + 5 < sizeof shown; i++) {
      unsigned char c = (unsigned char)value[i];
      if (c >= 0x20 && c < 0x7f && c != '\\') shown[k++] = (char)c;
      else k += (size_t)snprintf(shown + k, sizeof shown - k, "\\x%02x", c);
    }
    if (lim < value_bytes && k + 4 < sizeof shown) memcpy(shown + k, "...", 3), k += 3;
  }
  shown[k] = '\0';
  char where[1100] = ""; /* "FILE:LINE: ", or nothing for a line of no file (serving) */
  if (w) snprintf(where, sizeof where, "%s:%llu: ", w->file ? w->file : "input", (unsigned long long)w->line);
  char name[80] = "";
  if (field_name && field_name[0]) snprintf(name, sizeof name, " (%s)", field_name);
  if (value) return dlrec_error(DLREC_ERR_PARSE, "%sfield %u%s: %s: '%s'", where, field + 1, name, reason, shown);
  return dlrec_error(DLREC_ERR_PARSE, "%sfield %u%s: %s", where, field + 1, name, reason);
}

static dlrec_status line_error(const dlrec_where *w, const char *fmt, unsigned long long a, unsigned long long b) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, a, b);
  if (!w) return dlrec_error(DLREC_ERR_PARSE, "%s", msg);
  return dlrec_error(DLREC_ERR_PARSE, "%s:%llu: %s", w->file ? w->file : "input", (unsigned long long)w->line, msg);
}

/* ---- splitting ---- */

/* Finds the separators in p[0..n): writes the offsets of up to max + 1 of
 * them to pos and returns how many it wrote; sets *nul to the offset of the
 * first NUL byte, or n when there is none. */
static uint32_t find_tabs(const char *p, size_t n, uint32_t *pos, uint32_t max, size_t *nul) {
  uint32_t k = 0;
  size_t i = 0;
  *nul = n;
#if defined(__AVX2__)
  const __m256i tab32 = _mm256_set1_epi8('\t'), zero32 = _mm256_setzero_si256();
  for (; i + 32 <= n; i += 32) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(p + i));
    unsigned m = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, tab32));
    unsigned z = (unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, zero32));
    if (z) m &= (1u << __builtin_ctz(z)) - 1; /* tabs before the NUL still count */
    while (m) {
      if (k > max) return k;
      pos[k++] = (uint32_t)(i + (size_t)__builtin_ctz(m));
      m &= m - 1;
    }
    if (z) {
      *nul = i + (size_t)__builtin_ctz(z);
      return k;
    }
  }
#endif
#if defined(__SSE2__)
  const __m128i tab = _mm_set1_epi8('\t'), zero = _mm_setzero_si128();
  for (; i + 16 <= n; i += 16) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
    unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, tab));
    unsigned z = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero));
    if (z) m &= (1u << __builtin_ctz(z)) - 1; /* tabs before the NUL still count */
    while (m) {
      if (k > max) return k;
      pos[k++] = (uint32_t)(i + (size_t)__builtin_ctz(m));
      m &= m - 1;
    }
    if (z) {
      *nul = i + (size_t)__builtin_ctz(z);
      return k;
    }
  }
#endif
  for (; i < n; i++) {
    if (p[i] == '\t') {
      if (k > max) return k;
      pos[k++] = (uint32_t)i;
    } else if (p[i] == '\0') {
      *nul = i;
      return k;
    }
  }
  return k;
}

/* The field that byte `off` of the line falls in, given separator positions. */
static uint32_t field_of(const uint32_t *pos, uint32_t k, size_t off) {
  uint32_t f = 0;
  while (f < k && pos[f] < off) f++;
  return f;
}

/* Criteo TSV: the fixed layout label?, dense, categorical, in this order. */
static dlrec_status parse_tsv(const dlrec_layout *L, const char *line, size_t n, dlrec_raw_row *row,
                              const dlrec_where *w) {
  uint32_t pos[DLREC_CRITEO_FIELDS + 2];
  dlrec_text t[DLREC_CRITEO_FIELDS];
  uint32_t nf = L->n_fields;
  size_t nul;
  uint32_t k = find_tabs(line, n, pos, nf, &nul);
  if (nul < n) {
    uint32_t f = field_of(pos, k, nul);
    return dlrec_parse_error(w, f, f < nf ? L->names[f] : NULL, "NUL byte in field", NULL, 0);
  }
  if (k >= nf)
    return line_error(w, "more than %llu fields (field %llu is unexpected)", nf, (unsigned long long)nf + 1);
  uint32_t start = 0;
  for (uint32_t f = 0; f < k; f++) {
    t[f] = (dlrec_text){line + start, pos[f] - start};
    start = pos[f] + 1;
  }
  t[k] = (dlrec_text){line + start, (uint32_t)(n - start)};
  row->n_fields = k + 1;
  /* Fields past the last tab are empty: Criteo's files strip trailing empty fields. */
  for (uint32_t f = k + 1; f < nf; f++) t[f] = (dlrec_text){line, 0};
  uint32_t off = 0;
  if (L->has_label) row->label = t[off++];
  memcpy(row->dense, t + off, L->n_dense * sizeof t[0]);
  memcpy(row->cat, t + off + L->n_dense, L->n_cat * sizeof t[0]);
  return DLREC_OK;
}

/* RFC 4180 fields: "a","b""c",d -> a | b"c | d. Quoted fields are unescaped
 * into scratch; unquoted ones are views of the line. A newline inside quotes
 * cannot occur here (lines are split first) and reads as an unterminated
 * quote. Writes at most max fields; more is an error. `names` (may be NULL)
 * name the fields in errors. */
dlrec_status dlrec__csv_split(const char *line, size_t n, char *scratch, dlrec_text *fields, uint32_t max,
                              uint32_t *count, char *const *names, const dlrec_where *w) {
  uint32_t f = 0;
  size_t i = 0;
  char *out = scratch;
#define NAME_OF(f) (names && (f) < max ? names[f] : NULL)
  for (;;) {
    const char *s;
    uint32_t len;
    if (f >= max)
      return line_error(w, "more than %llu fields (field %llu is unexpected)", max, (unsigned long long)max + 1);
    if (i < n && line[i] == '"') {
      s = out;
      i++;
      for (;;) {
        if (i >= n)
          return dlrec_parse_error(w, f, NAME_OF(f),
                                   "unterminated quoted field (newlines inside quotes are not supported)", NULL, 0);
        char c = line[i++];
        if (c == '"') {
          if (i < n && line[i] == '"') {
            *out++ = '"';
            i++;
            continue;
          }
          break;
        }
        if (c == '\0') return dlrec_parse_error(w, f, NAME_OF(f), "NUL byte in field", NULL, 0);
        *out++ = c;
      }
      len = (uint32_t)(out - s);
      if (i < n && line[i] != ',')
        return dlrec_parse_error(w, f, NAME_OF(f), "text after a closing quote", line + i, n - i);
    } else {
      size_t b = i;
      while (i < n && line[i] != ',') {
        if (line[i] == '"')
          return dlrec_parse_error(w, f, NAME_OF(f), "quote inside an unquoted field", line + b, n - b);
        if (line[i] == '\0') return dlrec_parse_error(w, f, NAME_OF(f), "NUL byte in field", NULL, 0);
        i++;
      }
      s = line + b;
      len = (uint32_t)(i - b);
    }
    fields[f++] = (dlrec_text){s, len};
    if (i >= n) break;
    i++; /* the comma */
    if (i == n) {
      /* A trailing comma ends with one more, empty field. */
      if (f >= max)
        return line_error(w, "more than %llu fields (field %llu is unexpected)", max, (unsigned long long)max + 1);
      fields[f++] = (dlrec_text){line + n, 0};
      break;
    }
  }
#undef NAME_OF
  *count = f;
  return DLREC_OK;
}

static dlrec_status parse_csv(const dlrec_layout *L, const char *line, size_t n, char *scratch, dlrec_raw_row *row,
                              const dlrec_where *w) {
  dlrec_text fields[DLREC_LAYOUT_MAX_FIELDS];
  uint32_t nf = L->n_fields, got;
  dlrec_status st = dlrec__csv_split(line, n, scratch, fields, nf, &got, L->names, w);
  if (st != DLREC_OK) return st;
  if (got != nf) return line_error(w, "%llu fields, expected %llu", got, nf);
  row->n_fields = nf;
  for (uint32_t f = 0; f < nf; f++) {
    uint16_t idx = L->index[f];
    switch (L->role[f]) {
    case DLREC_ROLE_LABEL: row->label = fields[f]; break;
    case DLREC_ROLE_DENSE: row->dense[idx] = fields[f]; break;
    case DLREC_ROLE_CAT: row->cat[idx] = fields[f]; break;
    default: break;
    }
  }
  return DLREC_OK;
}

/* ---- libSVM / libFM ---- */

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* The next blank-separated token at or after *i; 0 at the end of the line. */
static int next_token(const char *line, size_t n, size_t *i, size_t *b, size_t *e) {
  while (*i < n && is_blank(line[*i])) (*i)++;
  if (*i >= n) return 0;
  *b = *i;
  while (*i < n && !is_blank(line[*i])) (*i)++;
  *e = *i;
  return 1;
}

/* Checks one item token: [field:]idx:val. Sets the column and the idx text. */
static dlrec_status svm_item(const dlrec_layout *L, const char *t, size_t len, uint32_t pos, uint32_t *col,
                             const char **idx, size_t *idx_len, const dlrec_where *w) {
  const int fm = L->format == DLREC_FORMAT_LIBFM;
  const char *c1 = memchr(t, ':', len);
  const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(t + len - c1 - 1)) : NULL;
  const char *name = fm ? NULL : L->names[L->cat_field[0]];
  if (!c1 || (fm && !c2) || (!fm && c2))
    return dlrec_parse_error(w, pos, name, fm ? "item is not field:idx:val" : "item is not idx:val", t, len);
  const char *why;
  uint64_t v;
  *col = 0;
  if (fm) {
    if ((why = dlrec_parse_dec_key(t, (size_t)(c1 - t), &v)) != NULL)
      return dlrec_parse_error(w, pos, NULL, c1 == t ? "field is empty" : "field is not a non-negative integer", t,
                               len);
    if (v >= L->n_cat) {
      char reason[80];
      snprintf(reason, sizeof reason, "field %llu is not below --fields %u", (unsigned long long)v, L->n_cat);
      return dlrec_parse_error(w, pos, NULL, reason, t, len);
    }
    *col = (uint32_t)v;
    name = L->names[L->cat_field[*col]];
    *idx = c1 + 1;
    *idx_len = (size_t)(c2 - c1 - 1);
  } else {
    *idx = t;
    *idx_len = (size_t)(c1 - t);
    c2 = c1;
  }
  if (*idx_len == 0) return dlrec_parse_error(w, pos, name, "index is empty", t, len);
  if ((why = dlrec_parse_dec_key(*idx, *idx_len, &v)) != NULL) return dlrec_parse_error(w, pos, name, why, t, len);
  double val;
  size_t vlen = (size_t)(t + len - c2 - 1);
  if (vlen == 0) return dlrec_parse_error(w, pos, name, "value is empty", t, len);
  if ((why = dlrec_parse_number(c2 + 1, vlen, &val)) != NULL) return dlrec_parse_error(w, pos, name, why, t, len);
  if (val != 1.0)
    return dlrec_parse_error(w, pos, name, "value is not 1 (only one-hot libSVM/libFM items are supported)", t, len);
  return DLREC_OK;
}

/* label? item item ...: validates every token, then writes each column's
 * indices, blank-separated, into scratch (they take fewer bytes than the
 * items did, so n bytes are enough). */
static dlrec_status parse_svm(const dlrec_layout *L, const char *line, size_t n, char *scratch, dlrec_raw_row *row,
                              const dlrec_where *w) {
  const char *nul = memchr(line, '\0', n);
  if (nul) {
    uint32_t k = 0;
    size_t i = 0, b, e;
    while (next_token(line, (size_t)(nul - line), &i, &b, &e)) k++;
    if (i == (size_t)(nul - line) && i > 0 && !is_blank(line[i - 1])) k--; /* the NUL is inside that token */
    return dlrec_parse_error(w, k, NULL, "NUL byte in field", NULL, 0);
  }
  uint32_t bytes[DLREC_MAX_SPARSE] = {0};
  size_t i = 0, b, e;
  uint32_t pos = 0;
  row->label = (dlrec_text){NULL, 0};
  if (L->has_label) {
    if (!next_token(line, n, &i, &b, &e)) return dlrec_parse_error(w, 0, "label", "label is empty", NULL, 0);
    double v;
    if (dlrec_parse_number(line + b, e - b, &v) != NULL || (v != 0 && v != 1 && v != -1))
      return dlrec_parse_error(w, 0, "label", "label is not 0, 1, -1 or +1", line + b, e - b);
    row->label = (dlrec_text){v == 1 ? "1" : "0", 1};
    pos = 1;
  }
  size_t items_at = i;
  for (; next_token(line, n, &i, &b, &e); pos++) {
    uint32_t col;
    const char *idx;
    size_t idx_len;
    dlrec_status st = svm_item(L, line + b, e - b, pos, &col, &idx, &idx_len, w);
    if (st != DLREC_OK) return st;
    bytes[col] += (uint32_t)idx_len + 1;
  }
  row->n_fields = pos;
  uint32_t at[DLREC_MAX_SPARSE], off = 0;
  for (uint32_t c = 0; c < L->n_cat; c++) {
    at[c] = off;
    row->cat[c] = (dlrec_text){scratch + off, bytes[c] ? bytes[c] - 1 : 0};
    off += bytes[c];
  }
  /* The second pass cannot fail: the first checked every token. */
  for (i = items_at; next_token(line, n, &i, &b, &e);) {
    uint32_t col;
    const char *idx;
    size_t idx_len;
    (void)svm_item(L, line + b, e - b, 0, &col, &idx, &idx_len, NULL);
    memcpy(scratch + at[col], idx, idx_len);
    scratch[at[col] + idx_len] = ' ';
    at[col] += (uint32_t)idx_len + 1;
  }
  return DLREC_OK;
}

dlrec_status dlrec_parse_row(const dlrec_layout *L, const char *line, size_t n, char *scratch, dlrec_raw_row *row,
                             const dlrec_where *w) {
  if (n >= UINT32_MAX) return line_error(w, "line of %llu bytes is too long", (unsigned long long)n, 0);
  if (n && line[n - 1] == '\r') n--; /* CRLF line ends */
  if (L->format == DLREC_FORMAT_CRITEO) return parse_tsv(L, line, n, row, w);
  if (L->format == DLREC_FORMAT_LIBSVM || L->format == DLREC_FORMAT_LIBFM) return parse_svm(L, line, n, scratch, row, w);
  return parse_csv(L, line, n, scratch, row, w);
}
