/* Row parsing: numbers, hex keys, labels, Criteo TSV and CSV rows, the
 * schema SPEC, and the block reader. */
#include <errno.h>

#include "data/layout.h"
#include "data/parse.h"
#include "core/rng.h"
#include "test.h"

/* ---- values ---- */

TEST(number_accepts_integers_floats_and_signs) {
  static const struct {
    const char *s;
    double v;
  } ok[] = {{"0", 0},          {"7", 7},        {"-1", -1},      {"+12", 12},        {"260.0", 260},
            {"1e3", 1000},     {"-2.5E-1", -0.25}, {".5", 0.5},  {"5.", 5},          {"000123", 123},
            {"123456789012345678", 123456789012345678.0},       {"1234567890123456789", 1234567890123456789.0},
            {"-0", 0},         {"1e-400", 0}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    double v = -99;
    const char *why = dlrec_parse_number(ok[i].s, strlen(ok[i].s), &v);
    if (why) test_fail(__FILE__, __LINE__, "'%s': %s", ok[i].s, why);
    CHECK(why == NULL);
    CHECK_NEAR(v, ok[i].v, 0, 1e-15);
  }
  double z;
  CHECK(dlrec_parse_number("-0", 2, &z) == NULL);
  CHECK(!signbit(z)); /* "-0" and "0" must encode alike */
}

TEST(number_rejects_what_strtod_would_take) {
  static const char *bad[] = {" 1", "1 ", "abc", "0x10", "nan", "inf", "-inf", "1e", "--1", "+", "-", "1.2.3",
                              "1,5", "1e400", ".", "e5", "1e+", "١"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    double v;
    const char *why = dlrec_parse_number(bad[i], strlen(bad[i]), &v);
    if (!why) test_fail(__FILE__, __LINE__, "'%s' was accepted as %g", bad[i], v);
    CHECK(why != NULL);
  }
  double v;
  CHECK(dlrec_parse_number("", 0, &v) != NULL);
  CHECK_STR(dlrec_parse_number("1e400", 5, &v), "number out of range");
}

TEST(number_fast_path_matches_strtod) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 7, 0);
  for (int i = 0; i < 20000; i++) {
    char buf[64];
    int digits = 1 + (int)dlrec_rng_below(&r, 19);
    int k = 0;
    if (dlrec_rng_below(&r, 3) == 0) buf[k++] = '-';
    for (int d = 0; d < digits; d++) buf[k++] = (char)('0' + dlrec_rng_below(&r, 10));
    if (dlrec_rng_below(&r, 4) == 0) {
      buf[k++] = '.';
      buf[k++] = (char)('0' + dlrec_rng_below(&r, 10));
    }
    buf[k] = '\0';
    double v, want = strtod(buf, NULL);
    CHECK(dlrec_parse_number(buf, (size_t)k, &v) == NULL);
    if (want == 0) want = 0; /* no negative zero */
    CHECK(memcmp(&v, &want, sizeof v) == 0); /* bit-identical */
  }
}

/* Integers too long for the fast path (it takes at most 18 digits, which a
 * uint64 holds exactly) go to strtod: 2^64 and above would wrap in a uint64.
 * Explicit edges, then random integers of 19 to 24 digits. */
TEST(number_of_many_digits_matches_strtod) {
  static const char *edge[] = {"9999999999999999999",  "18446744073709551615", "18446744073709551616",
                               "-18446744073709551617", "99999999999999999999", "00000000000000000001",
                               "123456789012345678901234"};
  for (size_t i = 0; i < sizeof edge / sizeof *edge; i++) {
    double v, want = strtod(edge[i], NULL);
    const char *why = dlrec_parse_number(edge[i], strlen(edge[i]), &v);
    if (why || memcmp(&v, &want, sizeof v) != 0)
      test_fail(__FILE__, __LINE__, "'%s': %s, %.17g, strtod %.17g", edge[i], why ? why : "ok", why ? 0.0 : v, want);
  }
  dlrec_rng r;
  dlrec_rng_seed(&r, 8, 0);
  for (int i = 0; i < 2000 && !test_failed_now(); i++) {
    char buf[64];
    int digits = 19 + (int)dlrec_rng_below(&r, 6), k = 0;
    if (dlrec_rng_below(&r, 3) == 0) buf[k++] = '-';
    for (int d = 0; d < digits; d++) buf[k++] = (char)('0' + dlrec_rng_below(&r, 10));
    buf[k] = '\0';
    double v, want = strtod(buf, NULL);
    if (want == 0) want = 0; /* no negative zero */
    CHECK(dlrec_parse_number(buf, (size_t)k, &v) == NULL);
    if (memcmp(&v, &want, sizeof v) != 0) test_fail(__FILE__, __LINE__, "'%s': %.17g, strtod %.17g", buf, v, want);
  }
}

/* An independent reference: one digit at a time. */
static int hex_ref(const char *s, size_t n, uint64_t *out) {
  if (n == 0 || n > 16) return 0;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return 0;
    v = v * 16 + (uint64_t)d;
  }
  *out = v;
  return 1;
}

TEST(hex_keys_match_a_reference_for_every_byte) {
  /* Every byte value at every position of an 8-digit key (the SWAR path). */
  char s[17] = "0a1B2c3D";
  for (int pos = 0; pos < 8; pos++) {
    for (int b = 0; b < 256; b++) {
      char t[8];
      memcpy(t, s, 8);
      t[pos] = (char)b;
      uint64_t got = 0, want = 0;
      int ok = dlrec_parse_hex_key(t, 8, &got) == NULL;
      int ok_ref = hex_ref(t, 8, &want);
      CHECK_EQ(ok, ok_ref);
      if (ok) CHECK_EQ_U64(got, want);
    }
  }
  dlrec_rng r;
  dlrec_rng_seed(&r, 3, 0);
  const char *digits = "0123456789abcdefABCDEF";
  for (int i = 0; i < 20000; i++) {
    size_t n = 1 + dlrec_rng_below(&r, 17);
    for (size_t k = 0; k < n; k++) s[k] = digits[dlrec_rng_below(&r, 22)];
    uint64_t got = 0, want = 0;
    int ok = dlrec_parse_hex_key(s, n, &got) == NULL;
    CHECK_EQ(ok, hex_ref(s, n, &want));
    if (ok) CHECK_EQ_U64(got, want);
  }
  uint64_t k;
  CHECK(dlrec_parse_hex_key("68fd1e64", 8, &k) == NULL);
  CHECK_EQ_U64(k, 0x68fd1e64ull);
  CHECK(dlrec_parse_hex_key("ffffffffffffffff", 16, &k) == NULL);
  CHECK_EQ_U64(k, UINT64_MAX);
  CHECK(dlrec_parse_hex_key("", 0, &k) != NULL);
  CHECK(dlrec_parse_hex_key("1ffffffffffffffff", 17, &k) != NULL);
}

TEST(labels_are_zero_or_one) {
  float v;
  CHECK(dlrec_parse_label("0", 1, &v) == NULL && v == 0);
  CHECK(dlrec_parse_label("1", 1, &v) == NULL && v == 1);
  CHECK(dlrec_parse_label("1.0", 3, &v) == NULL && v == 1);
  CHECK(dlrec_parse_label("2", 1, &v) != NULL);
  CHECK(dlrec_parse_label("-1", 2, &v) != NULL);
  CHECK(dlrec_parse_label("yes", 3, &v) != NULL);
  CHECK_STR(dlrec_parse_label("", 0, &v), "label is empty");
}

TEST(hashed_keys_depend_on_column_salt) {
  uint64_t a, b, c;
  CHECK(dlrec_cat_key(DLREC_KEY_HASH, dlrec_cat_salt("site"), "abc", 3, &a) == NULL);
  CHECK(dlrec_cat_key(DLREC_KEY_HASH, dlrec_cat_salt("app"), "abc", 3, &b) == NULL);
  CHECK(dlrec_cat_key(DLREC_KEY_HASH, dlrec_cat_salt("site"), "abd", 3, &c) == NULL);
  CHECK(a != b && a != c);
  CHECK_EQ_U64(a, dlrec_hash_bytes("abc", 3, dlrec_cat_salt("site")));
}

/* ---- Criteo rows ---- */

static const dlrec_where W = {"day.tsv", 17};

/* "1\t<I1..I13 = 1..13>\t<C1..C26 = 0000000a..>" */
static int criteo_line(char *buf, size_t cap, int label) {
  int k = 0;
  if (label >= 0) k += snprintf(buf + k, cap - (size_t)k, "%d\t", label);
  for (int i = 1; i <= 13; i++) k += snprintf(buf + k, cap - (size_t)k, "%d\t", i);
  for (int i = 1; i <= 26; i++) k += snprintf(buf + k, cap - (size_t)k, "%08x%s", 0xa0 + i, i < 26 ? "\t" : "");
  return k;
}

TEST(criteo_row_fields_by_role) {
  dlrec_layout *L;
  CHECK_OK(dlrec_layout_criteo(&L, 1));
  CHECK_EQ(dlrec_layout_fields(L), 40);
  static dlrec_raw_row row;
  char line[1024], scratch[1024];
  int n = criteo_line(line, sizeof line, 1);
  CHECK_OK(dlrec_parse_row(L, line, (size_t)n, scratch, &row, &W));
  CHECK_EQ(row.n_fields, 40);
  CHECK(row.label.n == 1 && row.label.s[0] == '1');
  for (int i = 0; i < 13; i++) {
    char want[8];
    snprintf(want, sizeof want, "%d", i + 1);
    CHECK(row.dense[i].n == strlen(want) && !memcmp(row.dense[i].s, want, row.dense[i].n));
  }
  for (int i = 0; i < 26; i++) {
    char want[16];
    snprintf(want, sizeof want, "%08x", 0xa1 + i);
    CHECK(row.cat[i].n == 8 && !memcmp(row.cat[i].s, want, 8));
  }
  CHECK_STR(dlrec_layout_field_name(L, 0), "label");
  CHECK_STR(dlrec_layout_field_name(L, 1), "I1");
  CHECK_STR(dlrec_layout_field_name(L, 39), "C26");
  dlrec_layout_free(L);
}

TEST(criteo_crlf_stripped_tail_and_missing) {
  dlrec_layout *L;
  CHECK_OK(dlrec_layout_criteo(&L, 1));
  static dlrec_raw_row row;
  char scratch[256];
  /* CRLF, empty fields in the middle, and the trailing 30 fields stripped. */
  const char *line = "0\t5\t\t-3\t260.0\t\t\t\t\t\t\t\t\t\t68fd1e64\r";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK(row.label.n == 1 && row.label.s[0] == '0');
  CHECK(row.dense[0].n == 1 && row.dense[1].n == 0 && row.dense[2].n == 2 && row.dense[3].n == 5);
  CHECK(row.cat[0].n == 8 && !memcmp(row.cat[0].s, "68fd1e64", 8)); /* no '\r' */
  for (int i = 1; i < 26; i++) CHECK_EQ(row.cat[i].n, 0);
  /* Only a label: every feature missing. */
  CHECK_OK(dlrec_parse_row(L, "1", 1, scratch, &row, &W));
  CHECK_EQ(row.n_fields, 1);
  for (int i = 0; i < 13; i++) CHECK_EQ(row.dense[i].n, 0);
  dlrec_layout_free(L);
}

TEST(criteo_unlabeled_39_fields) {
  dlrec_layout *L;
  CHECK_OK(dlrec_layout_criteo(&L, 0));
  CHECK_EQ(dlrec_layout_fields(L), 39);
  static dlrec_raw_row row;
  char line[1024], scratch[1024];
  int n = criteo_line(line, sizeof line, -1);
  CHECK_OK(dlrec_parse_row(L, line, (size_t)n, scratch, &row, &W));
  CHECK(row.dense[0].n == 1 && row.dense[0].s[0] == '1');
  CHECK(row.cat[25].n == 8);
  CHECK_STR(dlrec_layout_field_name(L, 0), "I1");
  /* A labeled line has one field too many. */
  n = criteo_line(line, sizeof line, 1);
  CHECK_ERR(dlrec_parse_row(L, line, (size_t)n, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: more than 39 fields (field 40 is unexpected)");
  dlrec_layout_free(L);
}

TEST(criteo_errors_name_file_line_and_field) {
  dlrec_layout *L;
  CHECK_OK(dlrec_layout_criteo(&L, 1));
  static dlrec_raw_row row;
  char line[1024], scratch[1024];
  int n = criteo_line(line, sizeof line, 1);
  line[n] = '\t';
  line[n + 1] = 'x';
  CHECK_ERR(dlrec_parse_row(L, line, (size_t)n + 2, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: more than 40 fields (field 41 is unexpected)");
  n = criteo_line(line, sizeof line, 1);
  line[4] = '\0'; /* inside I2's field: "1\t1\t2\t..." */
  CHECK_ERR(dlrec_parse_row(L, line, (size_t)n, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: field 3 (I2): NUL byte in field");
  /* A NUL far into the line (the vector path), in C20. */
  n = criteo_line(line, sizeof line, 1);
  char *c20 = line;
  for (int tabs = 0; tabs < 33; c20++) tabs += *c20 == '\t';
  c20[2] = '\0';
  CHECK_ERR(dlrec_parse_row(L, line, (size_t)n, scratch, &row, &W), DLREC_ERR_PARSE, "field 34 (C20): NUL byte");
  dlrec_layout_free(L);
}

TEST(parse_error_format_escapes_values) {
  CHECK_EQ(dlrec_parse_error(&W, 2, "I2", "not a number", "a\tb\x01", 4), DLREC_ERR_PARSE);
  CHECK_STR(dlrec_last_error(), "day.tsv:17: field 3 (I2): not a number: 'a\\x09b\\x01'");
  char longv[100];
  memset(longv, 'z', sizeof longv);
  dlrec_parse_error(NULL, 0, NULL, "too long", longv, sizeof longv);
  CHECK(!strncmp(dlrec_last_error(), "field 1: too long: 'zzzz", 24));
  CHECK(strstr(dlrec_last_error(), "...'") != NULL);
}

/* ---- CSV ---- */

static dlrec_layout *csv_layout(const char *header, const char *spec, int has_label) {
  char **names;
  uint32_t n;
  if (dlrec_csv_split_header(header, strlen(header), "x.csv", &names, &n) != DLREC_OK) return NULL;
  static dlrec_columns c;
  dlrec_layout *L = NULL;
  if (dlrec_columns_from_spec(&c, spec, (const char *const *)names, n) == DLREC_OK)
    dlrec_layout_csv(&L, &c, has_label, header, strlen(header), "x.csv");
  free(names);
  return L;
}

TEST(csv_quoting_rfc4180) {
  dlrec_layout *L = csv_layout("id,click,\"site,id\",app", "label=click;ignore=id;cat=*", 1);
  CHECK(L != NULL);
  CHECK_EQ(dlrec_layout_n_cat(L), 2);
  CHECK_STR(dlrec_layout_ignored(L), "id");
  static dlrec_raw_row row;
  char scratch[256];
  const char *line = "\"7\",1,\"a,\"\"b\"\"\",\r";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK(row.label.n == 1 && row.label.s[0] == '1');
  CHECK(row.cat[0].n == 5 && !memcmp(row.cat[0].s, "a,\"b\"", 5));
  CHECK_EQ(row.cat[1].n, 0); /* the trailing comma's empty field */
  line = "8,0,\"\",x";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK(row.cat[0].n == 0 && row.cat[1].n == 1);
  dlrec_layout_free(L);
}

/* Two quoted fields with escaped quotes in one row: each keeps its own bytes
 * in the scratch buffer (one written over the other would go unnoticed
 * with only one quoted field checked). */
TEST(csv_two_quoted_fields_in_one_row) {
  dlrec_layout *L = csv_layout("a,b,c", "cat=*", 0);
  CHECK(L != NULL);
  static dlrec_raw_row row;
  char scratch[256];
  const char *line = "\"x\"\"1\",\"y\"\"2\",z";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK(row.cat[0].n == 3 && !memcmp(row.cat[0].s, "x\"1", 3));
  CHECK(row.cat[1].n == 3 && !memcmp(row.cat[1].s, "y\"2", 3));
  CHECK(row.cat[2].n == 1 && row.cat[2].s[0] == 'z');
  line = "\"p\"\"\",q,\"\"\"r,s\"";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK(row.cat[0].n == 2 && !memcmp(row.cat[0].s, "p\"", 2));
  CHECK(row.cat[1].n == 1 && row.cat[1].s[0] == 'q');
  CHECK(row.cat[2].n == 4 && !memcmp(row.cat[2].s, "\"r,s", 4));
  dlrec_layout_free(L);
}

/* A header line as the reader gives it from a CRLF file: its CR is not part
 * of the last column's name. */
TEST(csv_header_with_crlf) {
  char **names;
  uint32_t n;
  CHECK_OK(dlrec_csv_split_header("id,click,site\r", 14, "x.csv", &names, &n));
  CHECK_EQ(n, 3);
  CHECK_STR(names[2], "site");
  free(names);
  dlrec_layout *L = csv_layout("id,click,site\r", "label=click;ignore=id;cat=site", 1);
  CHECK(L != NULL);
  CHECK_STR(dlrec_layout_field_name(L, 2), "site");
  static dlrec_raw_row row;
  char scratch[64];
  CHECK_OK(dlrec_parse_row(L, "1,0,ab\r", 7, scratch, &row, &W));
  CHECK(row.cat[0].n == 2 && !memcmp(row.cat[0].s, "ab", 2));
  dlrec_layout_free(L);
}

TEST(csv_errors) {
  dlrec_layout *L = csv_layout("id,click,site,app", "label=click;ignore=id;cat=*", 1);
  CHECK(L != NULL);
  static dlrec_raw_row row;
  char scratch[256];
  CHECK_ERR(dlrec_parse_row(L, "1,0,\"ab,c", 9, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: field 3 (site): unterminated quoted field");
  CHECK_ERR(dlrec_parse_row(L, "1,0,\"ab\"c,d", 11, scratch, &row, &W), DLREC_ERR_PARSE,
            "field 3 (site): text after a closing quote: 'c,d'");
  CHECK_ERR(dlrec_parse_row(L, "1,0,a\"b,c", 9, scratch, &row, &W), DLREC_ERR_PARSE,
            "field 3 (site): quote inside an unquoted field");
  CHECK_ERR(dlrec_parse_row(L, "1,0,a", 5, scratch, &row, &W), DLREC_ERR_PARSE, "day.tsv:17: 3 fields, expected 4");
  CHECK_ERR(dlrec_parse_row(L, "1,0,a,b,c", 9, scratch, &row, &W), DLREC_ERR_PARSE,
            "more than 4 fields (field 5 is unexpected)");
  CHECK_ERR(dlrec_parse_row(L, "", 0, scratch, &row, &W), DLREC_ERR_PARSE, "1 fields, expected 4");
  dlrec_layout_free(L);
}

TEST(spec_roles_ranges_and_star) {
  const char *header[] = {"label", "I1", "I2", "I3", "C01", "C02", "C03", "extra"};
  static dlrec_columns c;
  CHECK_OK(dlrec_columns_from_spec(&c, " label = label ; dense=I1..I3; cat=C01..C03;ignore=extra", header, 8));
  CHECK(c.has_label);
  CHECK_STR(c.label, "label");
  CHECK_EQ(c.n_dense, 3);
  CHECK_STR(c.dense[2], "I3");
  CHECK_EQ(c.n_cat, 3);
  CHECK_STR(c.cat[0], "C01");
  CHECK_STR(c.cat[2], "C03");
  /* "I1..3" is I1..I3; * takes the rest in header order, where it stands. */
  CHECK_OK(dlrec_columns_from_spec(&c, "dense=I3,I1..2;cat=extra,*", header, 8));
  CHECK(!c.has_label);
  CHECK_STR(c.dense[0], "I3");
  CHECK_STR(c.dense[1], "I1");
  CHECK_EQ(c.n_cat, 5);
  CHECK_STR(c.cat[0], "extra");
  CHECK_STR(c.cat[1], "label");
  CHECK_STR(c.cat[4], "C03");
}

TEST(spec_errors_name_the_problem) {
  const char *header[] = {"click", "a", "b", "c"};
  static dlrec_columns c;
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click;cat=a,b", header, 4), DLREC_ERR_INVALID,
            "header column 'c' (column 4) has no role");
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click;cat=a,b,c,d", header, 4), DLREC_ERR_INVALID,
            "column 'd' is not in the header");
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click;cat=a,*;dense=a", header, 4), DLREC_ERR_INVALID,
            "column 'a' is named twice (cat= and dense=)");
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click;cat=*;dense=*", header, 4), DLREC_ERR_INVALID,
            "'*' may appear only once");
  CHECK_ERR(dlrec_columns_from_spec(&c, "lable=click;cat=*", header, 4), DLREC_ERR_INVALID, "unknown key 'lable'");
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click,a;cat=*", header, 4), DLREC_ERR_INVALID,
            "label= takes exactly one column name");
  CHECK_ERR(dlrec_columns_from_spec(&c, "cat=a3..a1", header, 4), DLREC_ERR_INVALID, "bad range 'a3..a1'");
  CHECK_ERR(dlrec_columns_from_spec(&c, "cat=a1..b3", header, 4), DLREC_ERR_INVALID, "bad range");
  CHECK_ERR(dlrec_columns_from_spec(&c, "cat=a,,b", header, 4), DLREC_ERR_INVALID, "empty column name");
  CHECK_ERR(dlrec_columns_from_spec(&c, "cat", header, 4), DLREC_ERR_INVALID, "is not KEY=VALUE");
  CHECK_ERR(dlrec_columns_from_spec(&c, "label=click;ignore=*", header, 4), DLREC_ERR_INVALID,
            "no dense or categorical columns");
  const char *dup[] = {"a", "b", "a"};
  CHECK_ERR(dlrec_columns_from_spec(&c, "cat=*", dup, 3), DLREC_ERR_INVALID, "column 'a' appears twice");
}

TEST(csv_layout_finds_columns_by_name) {
  static dlrec_columns c;
  const char *fit_header[] = {"click", "a", "x", "b"};
  CHECK_OK(dlrec_columns_from_spec(&c, "label=click;dense=x;cat=a,b", fit_header, 4));
  /* Another file with the columns reordered and one more. */
  dlrec_layout *L;
  const char *h = "b,new,x,a,click";
  CHECK_OK(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"));
  CHECK_STR(dlrec_layout_ignored(L), "new");
  static dlrec_raw_row row;
  char scratch[64];
  CHECK_OK(dlrec_parse_row(L, "B,N,2.5,A,1", 11, scratch, &row, &W));
  CHECK(row.cat[0].s[0] == 'A' && row.cat[1].s[0] == 'B' && row.dense[0].n == 3 && row.label.s[0] == '1');
  dlrec_layout_free(L);
  /* Without a label the label column may be absent; a missing feature column is an error. */
  h = "a,b,x";
  CHECK_OK(dlrec_layout_csv(&L, &c, 0, h, strlen(h), "y.csv"));
  dlrec_layout_free(L);
  h = "a,x,click";
  CHECK_ERR(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"), DLREC_ERR_PARSE,
            "y.csv:1: header has no categorical column 'b'");
}

/* A data file's header is checked as the fit header was: a column named
 * twice (a feature or an ignored one) would leave one of the two unread, and
 * an empty name (",," or a trailing comma) names no column. Both are refused
 * naming the file and the columns. */
TEST(csv_layout_refuses_duplicate_and_empty_header_names) {
  static dlrec_columns c;
  const char *fit_header[] = {"click", "a", "x", "b"};
  CHECK_OK(dlrec_columns_from_spec(&c, "label=click;dense=x;cat=a,b", fit_header, 4));
  dlrec_layout *L = NULL;
  const char *h = "a,x,b,click,a";
  CHECK_ERR(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"), DLREC_ERR_PARSE,
            "y.csv:1: header column 'a' appears twice (columns 1 and 5)");
  CHECK(L == NULL);
  h = "new,a,x,new,b,click";
  CHECK_ERR(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"), DLREC_ERR_PARSE,
            "y.csv:1: header column 'new' appears twice (columns 1 and 4)");
  h = "a,,x,b,click";
  CHECK_ERR(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"), DLREC_ERR_PARSE,
            "y.csv:1: header column 2 has an empty name");
  h = "a,x,b,click,";
  CHECK_ERR(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"), DLREC_ERR_PARSE,
            "y.csv:1: header column 5 has an empty name");
  char **names = NULL;
  uint32_t n = 0;
  CHECK_ERR(dlrec_csv_split_header("id,\"\",site", 10, "x.csv", &names, &n), DLREC_ERR_PARSE,
            "x.csv:1: header column 2 has an empty name");
  CHECK(names == NULL && n == 0);
  h = "a,x,b,click";
  CHECK_OK(dlrec_layout_csv(&L, &c, 1, h, strlen(h), "y.csv"));
  dlrec_layout_free(L);
}

/* ---- the block reader ---- */

/* Reads path with the given block size; checks that blocks hold whole lines,
 * their line numbers add up, and their concatenation is `want`. */
static void check_blocks(const char *path, size_t block, size_t max_line, const char *want, uint64_t want_lines) {
  dlrec_reader *r;
  CHECK_OK(dlrec_reader_open(&r, path, block, max_line));
  dlrec_block b = {0};
  size_t got = 0;
  uint64_t next_line = 1;
  char *all = malloc(strlen(want) + 64);
  dlrec_status st;
  while ((st = dlrec_reader_next(r, &b)) == DLREC_OK) {
    CHECK_EQ_U64(b.first_line, next_line);
    uint64_t nl = 0;
    for (size_t i = 0; i < b.n; i++) nl += b.data[i] == '\n';
    CHECK(b.lines == nl || (b.lines == nl + 1 && b.data[b.n - 1] != '\n'));
    next_line += b.lines;
    memcpy(all + got, b.data, b.n);
    got += b.n;
  }
  CHECK_EQ(st, DLREC_END);
  CHECK_EQ_U64(next_line - 1, want_lines);
  CHECK_EQ(got, strlen(want));
  CHECK(!memcmp(all, want, got));
  CHECK_EQ_U64(dlrec_reader_bytes(r), strlen(want));
  free(all);
  dlrec_block_free(&b);
  dlrec_reader_close(r);
}

TEST(reader_blocks_are_whole_lines_for_any_block_size) {
  const char *text = "a\tb\r\nlonger line here\n\nx\nlast line without newline";
  const char *path = test_path("r.tsv");
  CHECK(test_write_file(path, text, (size_t)-1) == 0);
  for (size_t block = 1; block <= 64; block++) {
    check_blocks(path, block, 1 << 20, text, 5);
    if (test_failed_now()) {
      fprintf(stderr, "block size %zu\n", block);
      return;
    }
  }
  CHECK(test_write_file(path, "one\ntwo\n", (size_t)-1) == 0);
  check_blocks(path, 3, 100, "one\ntwo\n", 2);
  CHECK(test_write_file(path, "", 0) == 0);
  check_blocks(path, 8, 100, "", 0);
}

TEST(reader_cuts_overlong_lines) {
  /* Line 2 is 50 bytes with max 10: it comes back longer than 10 bytes (cut
   * to 11 when it spans blocks), and reading goes on at line 3. */
  char text[200];
  snprintf(text, sizeof text, "short\n%s\nafter\n", "0123456789012345678901234567890123456789012345678X");
  const char *path = test_path("long.tsv");
  CHECK(test_write_file(path, text, (size_t)-1) == 0);
  for (size_t block = 1; block < 70; block += 3) {
    dlrec_reader *r;
    CHECK_OK(dlrec_reader_open(&r, path, block, 10));
    dlrec_block b = {0};
    char all[256];
    size_t got = 0;
    uint64_t lines = 0;
    while (dlrec_reader_next(r, &b) == DLREC_OK) {
      memcpy(all + got, b.data, b.n);
      got += b.n;
      lines += b.lines;
    }
    all[got] = '\0';
    /* Cut when it spans blocks, whole when it fits one: too long either way. */
    if (strcmp(all, text) != 0) CHECK_STR(all, "short\n01234567890\nafter\n");
    CHECK_EQ(lines, 3);
    dlrec_block_free(&b);
    dlrec_reader_close(r);
  }
}

TEST(reader_header_line_then_blocks) {
  const char *path = test_path("h.csv");
  CHECK(test_write_file(path, "a,b\r\n1,2\n3,4", (size_t)-1) == 0);
  dlrec_reader *r;
  CHECK_OK(dlrec_reader_open(&r, path, 2, 100));
  const char *line;
  size_t n;
  CHECK_OK(dlrec_reader_line(r, &line, &n));
  CHECK(n == 4 && !memcmp(line, "a,b\r", 4));
  dlrec_block b = {0};
  CHECK_OK(dlrec_reader_next(r, &b));
  CHECK_EQ_U64(b.first_line, 2);
  dlrec_block_free(&b);
  dlrec_reader_close(r);
  CHECK_ERR(dlrec_reader_open(&r, test_path("missing.tsv"), 8, 8), DLREC_ERR_IO, "missing.tsv");
  CHECK_ERR(dlrec_reader_open(&r, test_tmpdir(), 8, 8), DLREC_ERR_IO, "is a directory");
}

/* Lines read one by one (a CSV header) are read 65,536 bytes at a time:
 * lines of 65535, 65536, 65537 and 131073 bytes come back whole, and the
 * blocks after them start at the next line. */
TEST(reader_lines_past_each_64k_read) {
  const size_t lens[] = {65535, 65536, 65537, 131073, 1};
  test_buf file = {0};
  for (int i = 0; i < 5; i++) {
    for (size_t j = 0; j < lens[i]; j++) test_buf_put(&file, &(char){(char)('a' + (i * 7 + j) % 26)}, 1);
    test_buf_put(&file, "\n", 1);
  }
  test_buf_put(&file, "tail1\ntail2\n", 12);
  const char *path = test_path("long.csv");
  CHECK(test_write_file(path, file.p, file.n) == 0);
  test_buf_free(&file);
  dlrec_reader *r;
  CHECK_OK(dlrec_reader_open(&r, path, 4096, 1u << 20));
  for (int i = 0; i < 5; i++) {
    const char *line;
    size_t n;
    CHECK_OK(dlrec_reader_line(r, &line, &n));
    CHECK_EQ_U64(n, lens[i]);
    for (size_t j = 0; j < n; j++)
      if (line[j] != (char)('a' + (i * 7 + j) % 26)) CHECK_EQ_U64(j, (uint64_t)-1); /* names the first one off */
  }
  dlrec_block b = {0};
  CHECK_OK(dlrec_reader_next(r, &b));
  CHECK_EQ_U64(b.first_line, 6);
  CHECK(b.n == 12 && !memcmp(b.data, "tail1\ntail2\n", 12));
  CHECK_EQ(dlrec_reader_next(r, &b), DLREC_END);
  dlrec_block_free(&b);
  dlrec_reader_close(r);
}

TEST(reader_drops_a_utf8_byte_order_mark) {
  const char *path = test_path("bom.csv");
  /* A CSV header after a BOM: the first name is "a", not "\xef\xbb\xbfa". */
  CHECK(test_write_file(path, "\xef\xbb\xbf" "a,b\r\n1,2\n", (size_t)-1) == 0);
  dlrec_reader *r;
  CHECK_OK(dlrec_reader_open(&r, path, 2, 100));
  const char *line;
  size_t n;
  CHECK_OK(dlrec_reader_line(r, &line, &n));
  CHECK(n == 4 && !memcmp(line, "a,b\r", 4));
  dlrec_reader_close(r);
  /* TSV rows after a BOM, for every block size: the BOM is gone, line 1 is line 1. */
  CHECK(test_write_file(path, "\xef\xbb\xbf" "1\t2\n0\t3", (size_t)-1) == 0);
  for (size_t block = 1; block <= 12; block++) {
    CHECK_OK(dlrec_reader_open(&r, path, block, 100));
    dlrec_block b = {0};
    char all[64];
    size_t got = 0;
    uint64_t lines = 0;
    CHECK_OK(dlrec_reader_next(r, &b));
    CHECK_EQ_U64(b.first_line, 1);
    do {
      memcpy(all + got, b.data, b.n);
      got += b.n;
      lines += b.lines;
    } while (dlrec_reader_next(r, &b) == DLREC_OK);
    all[got] = '\0';
    CHECK_STR(all, "1\t2\n0\t3");
    CHECK_EQ_U64(lines, 2);
    dlrec_block_free(&b);
    dlrec_reader_close(r);
  }
  /* Only a BOM: an empty file. Two of its bytes, or one elsewhere: data. */
  CHECK(test_write_file(path, "\xef\xbb\xbf", 3) == 0);
  CHECK_OK(dlrec_reader_open(&r, path, 8, 100));
  CHECK_EQ(dlrec_reader_line(r, &line, &n), DLREC_END);
  dlrec_reader_close(r);
  CHECK_OK(dlrec_reader_open(&r, path, 8, 100));
  dlrec_block e = {0};
  CHECK_EQ(dlrec_reader_next(r, &e), DLREC_END);
  dlrec_block_free(&e);
  dlrec_reader_close(r);
  CHECK(test_write_file(path, "\xef\xbb", 2) == 0);
  CHECK_OK(dlrec_reader_open(&r, path, 8, 100));
  CHECK_OK(dlrec_reader_line(r, &line, &n));
  CHECK(n == 2 && !memcmp(line, "\xef\xbb", 2));
  dlrec_reader_close(r);
  CHECK(test_write_file(path, "x\n\xef\xbb\xbfy\n", (size_t)-1) == 0);
  CHECK_OK(dlrec_reader_open(&r, path, 64, 100));
  dlrec_block b = {0};
  CHECK_OK(dlrec_reader_next(r, &b));
  CHECK(b.n == 7 && !memcmp(b.data, "x\n\xef\xbb\xbfy\n", 7));
  dlrec_block_free(&b);
  dlrec_reader_close(r);
}

/* ---- libSVM / libFM ---- */

static dlrec_layout *svm_layout(dlrec_input_format f, uint32_t fields, int has_label) {
  static dlrec_columns c;
  dlrec_layout *L = NULL;
  if (dlrec_columns_svm(&c, f, fields, has_label, DLREC_POOLING_SUM, 0) != DLREC_OK) return NULL;
  if (dlrec_layout_svm(&L, &c, f, has_label) != DLREC_OK) return NULL;
  return L;
}

/* The text the parser leaves for a column, as a C string. */
static const char *col_text(const dlrec_raw_row *row, uint32_t c) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%.*s", (int)row->cat[c].n, row->cat[c].s);
  return buf;
}

TEST(libsvm_rows_labels_blanks_crlf_and_duplicates) {
  dlrec_layout *L = svm_layout(DLREC_FORMAT_LIBSVM, 0, 1);
  CHECK(L != NULL);
  CHECK_EQ(dlrec_layout_n_cat(L), 1);
  static dlrec_raw_row row;
  char scratch[256];
  static const struct {
    const char *line, *label, *features;
  } ok[] = {
      {"1 3:1 7:1 12:1", "1", "3 7 12"},
      {"-1 7:1", "0", "7"},             /* -1 reads as 0 */
      {"+1\t5:1.0\t\t99:1  ", "1", "5 99"}, /* tabs, runs of blanks, trailing blanks */
      {"0 3:1 3:1", "0", "3 3"},         /* a repeated index is kept: sum pooling counts it twice */
      {"1 3:1\r", "1", "3"},             /* CRLF */
      {"0", "0", ""},                    /* label only: the column is missing */
      {"1   ", "1", ""},
      {"1.0 0:1 007:1", "1", "0 007"},   /* leading zeros reach the key parser, which reads 7 */
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    dlrec_status st = dlrec_parse_row(L, ok[i].line, strlen(ok[i].line), scratch, &row, &W);
    if (st != DLREC_OK) test_fail(__FILE__, __LINE__, "'%s': %s", ok[i].line, dlrec_last_error());
    CHECK_OK(st);
    CHECK(row.label.n == 1 && row.label.s[0] == ok[i].label[0]);
    CHECK_STR(col_text(&row, 0), ok[i].features);
  }
  uint64_t key;
  CHECK(dlrec_parse_dec_key("007", 3, &key) == NULL);
  CHECK_EQ_U64(key, 7);
  CHECK(dlrec_parse_dec_key("1234567890123456789", 19, &key) != NULL);
  dlrec_layout_free(L);
}

TEST(libsvm_errors_name_file_line_and_item) {
  dlrec_layout *L = svm_layout(DLREC_FORMAT_LIBSVM, 0, 1);
  CHECK(L != NULL);
  static dlrec_raw_row row;
  char scratch[256];
  static const struct {
    const char *line, *err;
  } bad[] = {
      {"2 3:1", "day.tsv:17: field 1 (label): label is not 0, 1, -1 or +1: '2'"},
      {"yes 3:1", "field 1 (label): label is not 0, 1, -1 or +1: 'yes'"},
      {"", "day.tsv:17: field 1 (label): label is empty"},
      {"   ", "field 1 (label): label is empty"},
      {"1 3", "day.tsv:17: field 2 (features): item is not idx:val: '3'"},
      {"1 3:1 7", "field 3 (features): item is not idx:val: '7'"},
      {"1 -3:1", "field 2 (features): index is not a non-negative integer: '-3:1'"},
      {"1 3.5:1", "field 2 (features): index is not a non-negative integer: '3.5:1'"},
      {"1 :1", "field 2 (features): index is empty"},
      {"1 3:", "field 2 (features): value is empty"},
      {"1 3:0.5", "field 2 (features): value is not 1"},
      {"1 3:x", "field 2 (features): not a number: '3:x'"},
      {"1 3:1:1", "field 2 (features): item is not idx:val"},
      {"1 1234567890123456789:1", "index longer than 18 digits"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_ERR(dlrec_parse_row(L, bad[i].line, strlen(bad[i].line), scratch, &row, &W), DLREC_ERR_PARSE, bad[i].err);
  CHECK_ERR(dlrec_parse_row(L, "1 3:1 7\0:1", 10, scratch, &row, &W), DLREC_ERR_PARSE, "field 3: NUL byte in field");
  CHECK_ERR(dlrec_parse_row(L, "1 3:1 \0", 7, scratch, &row, &W), DLREC_ERR_PARSE, "field 3: NUL byte in field");
  dlrec_layout_free(L);
}

/* A line of 100000 items: the scratch buffer of the line's size holds the
 * indices, and every one arrives in order. */
TEST(libsvm_very_long_line) {
  dlrec_layout *L = svm_layout(DLREC_FORMAT_LIBSVM, 0, 1);
  CHECK(L != NULL);
  const int items = 100000;
  size_t cap = (size_t)items * 12 + 8, n = 0;
  char *line = malloc(cap), *scratch = malloc(cap), *want = malloc(cap);
  size_t wn = 0;
  n += (size_t)snprintf(line, cap, "1");
  for (int i = 0; i < items; i++) {
    n += (size_t)snprintf(line + n, cap - n, " %d:1", i * 7);
    wn += (size_t)snprintf(want + wn, cap - wn, "%s%d", i ? " " : "", i * 7);
  }
  static dlrec_raw_row row;
  dlrec_status st = dlrec_parse_row(L, line, n, scratch, &row, &W);
  int same = st == DLREC_OK && row.cat[0].n == wn && !memcmp(row.cat[0].s, want, wn);
  free(line), free(scratch), free(want);
  dlrec_layout_free(L);
  CHECK_OK(st);
  CHECK(same);
}

TEST(libfm_fields_group_items_by_column) {
  dlrec_layout *L = svm_layout(DLREC_FORMAT_LIBFM, 3, 1);
  CHECK(L != NULL);
  CHECK_EQ(dlrec_layout_n_cat(L), 3);
  CHECK_STR(dlrec_layout_field_name(L, dlrec_layout_cat_field(L, 2)), "f2");
  static dlrec_raw_row row;
  char scratch[256];
  const char *line = "1 0:3:1 2:5:1 0:44:1";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK_STR(col_text(&row, 0), "3 44");
  CHECK_STR(col_text(&row, 1), ""); /* field 1 absent: missing */
  CHECK_STR(col_text(&row, 2), "5");
  CHECK_ERR(dlrec_parse_row(L, "1 3:1:1", 7, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: field 2: field 3 is not below --fields 3: '3:1:1'");
  CHECK_ERR(dlrec_parse_row(L, "1 0:3", 5, scratch, &row, &W), DLREC_ERR_PARSE,
            "day.tsv:17: field 2: item is not field:idx:val: '0:3'");
  CHECK_ERR(dlrec_parse_row(L, "1 x:3:1", 7, scratch, &row, &W), DLREC_ERR_PARSE,
            "field 2: field is not a non-negative integer: 'x:3:1'");
  CHECK_ERR(dlrec_parse_row(L, "1 1:3:2", 7, scratch, &row, &W), DLREC_ERR_PARSE, "field 2 (f1): value is not 1");
  CHECK_ERR(dlrec_parse_row(L, "-2 1:3:1", 8, scratch, &row, &W), DLREC_ERR_PARSE, "label is not 0, 1, -1 or +1");
  dlrec_layout_free(L);
  /* Unlabeled: the first token is an item. */
  L = svm_layout(DLREC_FORMAT_LIBFM, 2, 0);
  CHECK(L != NULL);
  CHECK_OK(dlrec_parse_row(L, "1:9:1", 5, scratch, &row, &W));
  CHECK_STR(col_text(&row, 1), "9");
  dlrec_layout_free(L);
  dlrec_columns c;
  CHECK_ERR(dlrec_columns_svm(&c, DLREC_FORMAT_LIBFM, 0, 1, DLREC_POOLING_SUM, 0), DLREC_ERR_INVALID, "--fields");
  CHECK_ERR(dlrec_columns_svm(&c, DLREC_FORMAT_LIBFM, 257, 1, DLREC_POOLING_SUM, 0), DLREC_ERR_INVALID, "--fields");
}

/* ---- multi-hot CSV columns in the SPEC ---- */

TEST(spec_multi_declares_separator_pooling_and_max) {
  const char *header[] = {"movie", "genres", "tags", "rating", "y"};
  dlrec_columns c;
  CHECK_OK(dlrec_columns_from_spec(&c, "label=y;dense=rating;cat=*; multi = genres:|:mean:4 , tags::", header, 5));
  CHECK_EQ(c.n_cat, 3);
  CHECK_STR(c.cat[1], "genres");
  CHECK_EQ(c.sep[0], 0);
  CHECK_EQ(c.sep[1], '|');
  CHECK_EQ(c.pooling[1], DLREC_POOLING_MEAN);
  CHECK_EQ(c.max_hotness[1], 4);
  CHECK_EQ(c.sep[2], ':');
  CHECK_EQ(c.pooling[2], DLREC_POOLING_SUM);
  CHECK_EQ(c.max_hotness[2], 0);
  /* The layout carries the separator to the row parser's caller. */
  dlrec_layout *L = csv_layout("movie,genres,tags,rating,y", "label=y;dense=rating;cat=*;multi=genres:|", 1);
  CHECK(L != NULL);
  static dlrec_raw_row row;
  char scratch[256];
  const char *line = "m1,\"A|B,C\",,4.5,1";
  CHECK_OK(dlrec_parse_row(L, line, strlen(line), scratch, &row, &W));
  CHECK_STR(col_text(&row, 1), "A|B,C");
  CHECK_EQ(L->sep[1], '|');
  CHECK_EQ(L->sep[0], 0);
  dlrec_layout_free(L);
  static const struct {
    const char *spec, *err;
  } bad[] = {
      {"dense=rating;cat=*;multi=rating:|", "multi=rating: not a categorical column"},
      {"cat=movie,genres,tags,y;dense=rating;multi=nope:|", "multi=nope: not a categorical column"},
      {"cat=*;multi=genres", "bad multi= entry 'genres'"},
      {"cat=*;multi=genres:", "bad multi= entry"},
      {"cat=*;multi=genres:||", "bad multi= entry"},
      {"cat=*;multi=genres:|:max", "pooling 'max' is not sum or mean"},
      {"cat=*;multi=genres:|:sum:0", "max hotness '0' is not in [1, 65536]"},
      {"cat=*;multi=genres:|:sum:9x", "max hotness '9x'"},
      {"cat=*;multi=genres: ", "bad multi= entry"},
      {"cat=*;multi=genres:\"", "the separator may not be"},
      {"cat=*;multi=genres:|,genres:/", "multi=genres appears twice"},
      {"cat=*;mult=genres:|", "unknown key 'mult' (keys: label, dense, cat, ignore, multi)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK_ERR(dlrec_columns_from_spec(&c, bad[i].spec, header, 5), DLREC_ERR_INVALID, bad[i].err);
}
