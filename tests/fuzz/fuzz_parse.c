/* Fuzz target for the row parser: arbitrary bytes as Criteo TSV rows (with
 * and without a label), as CSV (first line the header, second line the
 * schema SPEC, which may declare multi-hot columns with multi=), and as
 * libSVM and libFM rows (a first byte, not part of the text, picks which
 * of the three an input goes through: '0' Criteo, '1' CSV, '2' libSVM/libFM,
 * and so on modulo 3; so each execution parses its text with one family of
 * layouts, not all eight);
 * every field through the value parsers, multi-hot fields split into their
 * values. Must never crash, hang, read out of
 * bounds or leak; and a libSVM/libFM row the parser accepts must leave only
 * valid decimal indices and a 0/1 label (checked with abort()). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_internal.h"
#include "data/layout.h"
#include "data/parse.h"

static void values(const dlrec_layout *L, const dlrec_raw_row *row) {
  uint32_t nd = dlrec_layout_n_dense(L), nc = dlrec_layout_n_cat(L);
  int has_label = dlrec_layout_has_label(L);
  int svm = L->format == DLREC_FORMAT_LIBSVM || L->format == DLREC_FORMAT_LIBFM;
  double x;
  float f;
  uint64_t k;
  if (has_label && dlrec_parse_label(row->label.s, row->label.n, &f) != NULL && svm) abort();
  for (uint32_t i = 0; i < nd; i++)
    if (row->dense[i].n) (void)dlrec_parse_number(row->dense[i].s, row->dense[i].n, &x);
  for (uint32_t i = 0; i < nc; i++) {
    if (!row->cat[i].n) continue;
    if (L->sep[i]) {
      /* A multi-hot field: its values as the encoder splits them. */
      const char *p = row->cat[i].s, *end = p + row->cat[i].n, *v;
      size_t vn;
      while (etl_next_value(&p, end, L->sep[i], &v, &vn)) {
        if (vn == 0 || v < row->cat[i].s || v + vn > end) abort();
        if (dlrec_cat_key(svm ? DLREC_KEY_DEC : DLREC_KEY_HASH, 7, v, vn, &k) != NULL && svm) abort();
      }
      continue;
    }
    (void)dlrec_cat_key(DLREC_KEY_HEX, 0, row->cat[i].s, row->cat[i].n, &k);
    (void)dlrec_cat_key(DLREC_KEY_HASH, 7, row->cat[i].s, row->cat[i].n, &k);
  }
}

/* Parses every line of text[0..n) with L. */
static void rows(const dlrec_layout *L, const char *text, size_t n, dlrec_raw_row *row, char *scratch) {
  dlrec_where w = {"fuzz", 1};
  const char *p = text, *end = text + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = (size_t)((nl ? nl : end) - p);
    if (dlrec_parse_row(L, p, len, scratch, row, &w) == DLREC_OK) values(L, row);
    p = nl ? nl + 1 : end;
    w.line++;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dlrec_raw_row row;
  if (size == 0) return 0;
  unsigned family = data[0] % 3u, pick = data[0];
  const char *text = (const char *)data + 1;
  size--;
  char *scratch = malloc(size + 1);
  if (!scratch) return 0;
  /* Criteo, labeled and not. */
  for (int label = 0; label <= 1 && family == 0; label++) {
    dlrec_layout *L;
    if (dlrec_layout_criteo(&L, label) == DLREC_OK) {
      rows(L, text, size, &row, scratch);
      dlrec_layout_free(L);
    }
  }
  /* CSV: line 1 the header, line 2 the SPEC (NUL-terminated copy). */
  const char *nl1 = family == 1 ? memchr(text, '\n', size) : NULL;
  if (nl1) {
    size_t hn = (size_t)(nl1 - text);
    const char *rest = nl1 + 1;
    size_t rn = size - hn - 1;
    const char *nl2 = memchr(rest, '\n', rn);
    size_t sn = nl2 ? (size_t)(nl2 - rest) : rn;
    char *spec = malloc(sn + 1);
    char **names = NULL;
    uint32_t n_names = 0;
    static dlrec_columns cols;
    if (spec && dlrec_csv_split_header(text, hn, "fuzz", &names, &n_names) == DLREC_OK) {
      memcpy(spec, rest, sn);
      spec[sn] = '\0';
      /* The last one makes the first header column a '|'-separated list. */
      char multi[300] = "cat=*";
      if (n_names && strlen(names[0]) < 200) snprintf(multi, sizeof multi, "cat=*;multi=%s:|:mean:3", names[0]);
      const char *specs[] = {spec, "cat=*", "label=click;cat=*", multi};
      for (int i = 0; i < 4; i++) {
        if (i == 0 && strlen(spec) != sn) continue; /* a NUL inside the SPEC line */
        if (dlrec_columns_from_spec(&cols, specs[i], (const char *const *)names, n_names) != DLREC_OK) continue;
        for (int label = 0; label <= cols.has_label; label++) {
          dlrec_layout *L;
          if (dlrec_layout_csv(&L, &cols, label, text, hn, "fuzz") != DLREC_OK) continue;
          rows(L, rest, rn, &row, scratch);
          dlrec_layout_free(L);
        }
      }
      free(names);
    }
    free(spec);
  }
  /* libSVM, and libFM with 1 to 8 fields (from the first byte). */
  for (int fm = 0; fm <= 1 && family == 2; fm++)
    for (int label = 0; label <= 1; label++) {
      dlrec_input_format f = fm ? DLREC_FORMAT_LIBFM : DLREC_FORMAT_LIBSVM;
      uint32_t fields = fm ? 1u + pick / 3u % 8u : 0u;
      dlrec_columns c;
      dlrec_layout *L;
      if (dlrec_columns_svm(&c, f, fields, label, DLREC_POOLING_SUM, 0) != DLREC_OK) continue;
      if (dlrec_layout_svm(&L, &c, f, label) != DLREC_OK) continue;
      rows(L, text, size, &row, scratch);
      dlrec_layout_free(L);
    }
  free(scratch);
  return 0;
}
