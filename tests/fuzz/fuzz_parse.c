/* Fuzz target for the row parser: arbitrary bytes as Criteo TSV rows (with
 * and without a label) and as CSV (first line the header, second line the
 * schema SPEC), every field through the value parsers. Must never crash,
 * hang, read out of bounds or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dlrec/parse.h"

static void values(const dlrec_raw_row *row, uint32_t nd, uint32_t nc, int has_label) {
  double x;
  float f;
  uint64_t k;
  if (has_label) (void)dlrec_parse_label(row->label.s, row->label.n, &f);
  for (uint32_t i = 0; i < nd; i++)
    if (row->dense[i].n) (void)dlrec_parse_number(row->dense[i].s, row->dense[i].n, &x);
  for (uint32_t i = 0; i < nc; i++) {
    if (!row->cat[i].n) continue;
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
    if (dlrec_parse_row(L, p, len, scratch, row, &w) == DLREC_OK)
      values(row, dlrec_layout_n_dense(L), dlrec_layout_n_cat(L), dlrec_layout_has_label(L));
    p = nl ? nl + 1 : end;
    w.line++;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dlrec_raw_row row;
  const char *text = (const char *)data;
  char *scratch = malloc(size + 1);
  if (!scratch) return 0;
  /* Criteo, labeled and not. */
  for (int label = 0; label <= 1; label++) {
    dlrec_layout *L;
    if (dlrec_layout_criteo(&L, label) == DLREC_OK) {
      rows(L, text, size, &row, scratch);
      dlrec_layout_free(L);
    }
  }
  /* CSV: line 1 the header, line 2 the SPEC (NUL-terminated copy). */
  const char *nl1 = memchr(text, '\n', size);
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
      const char *specs[] = {spec, "cat=*", "label=click;cat=*"};
      for (int i = 0; i < 3; i++) {
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
  free(scratch);
  return 0;
}
