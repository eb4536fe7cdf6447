/* Arrow record batches as CSV text (data/arrow.h) against hand-built C
 * Data Interface streams: every supported type, nulls in bitmaps, array
 * offsets, dictionaries, quoting, two batches; the exact text expected;
 * columns picked by name; the errors (an unsupported type, a missing
 * column, a tab in the Criteo layout, a failing stream) named; and every
 * batch, schema and stream released. */
#include <errno.h>

#include "data/arrow.h"
#include "test.h"

static int released; /* release callbacks run */

static void release_schema(struct ArrowSchema *s) {
  s->release = NULL;
  released++;
}
static void release_array(struct ArrowArray *a) {
  a->release = NULL;
  released++;
}

/* The table: columns i (int32), g (float64), u (utf8), d (dictionary of
 * int8 into utf8), b (bool), f (float32), U (large utf8), in two batches
 * of 3 and 2 rows. */
static struct ArrowSchema f_i = {.format = "i", .name = "i"}, f_g = {.format = "g", .name = "g"},
                          f_u = {.format = "u", .name = "u"}, f_dv = {.format = "u", .name = ""},
                          f_d = {.format = "c", .name = "d", .dictionary = &f_dv}, f_b = {.format = "b", .name = "b"},
                          f_f = {.format = "f", .name = "f"}, f_U = {.format = "U", .name = "U"},
                          f_ts = {.format = "tsn:", .name = "when"};
static struct ArrowSchema *fields[] = {&f_i, &f_g, &f_u, &f_d, &f_b, &f_f, &f_U};

/* Batch 1 (3 rows); i has an offset of 1 into its buffers and a null. */
static const uint8_t i1_valid[] = {0x0b}; /* physical rows 0,1,3 valid: with offset 1 -> rows 0 (valid), 1 (null), 2 */
static const int32_t i1_vals[] = {99, -7, 0, 42};
static const double g1_vals[] = {0.1, 3.0, 1e20};
static const int32_t u1_off[] = {0, 4, 8, 8};
static const char u1_data[] = "a,bcd\"ef";
static const int8_t d1_idx[] = {1, 0, 1};
static const int32_t dv_off[] = {0, 3, 6};
static const char dv_data[] = "iosweb";
static const uint8_t b1_vals[] = {0x05}; /* 1, 0, 1 */
static const float f1_vals[] = {0.5f, 1.0f / 3.0f, -2.0f};
static const int64_t U1_off[] = {0, 1, 2, 3};
static const char U1_data[] = "xyz";

static struct ArrowArray dict_vals = {.length = 2, .n_buffers = 3, .buffers = (const void *[]){NULL, dv_off, dv_data}};

static struct ArrowArray col(int64_t len, int64_t nulls, int64_t off, const void *b0, const void *b1, const void *b2) {
  struct ArrowArray a = {.length = len, .null_count = nulls, .offset = off, .n_buffers = b2 ? 3 : 2};
  a.buffers = malloc(3 * sizeof *a.buffers);
  a.buffers[0] = b0, a.buffers[1] = b1, a.buffers[2] = b2;
  return a;
}

typedef struct stream_state {
  int batch, fail_at;
  int with_ts;
  struct ArrowArray cols[2][8];
  struct ArrowArray *ptrs[2][8];
} stream_state;

static int get_schema(struct ArrowArrayStream *st, struct ArrowSchema *out) {
  stream_state *ss = st->private_data;
  static struct ArrowSchema *with_ts[] = {&f_i, &f_g, &f_u, &f_d, &f_b, &f_f, &f_U, &f_ts};
  *out = (struct ArrowSchema){.format = "+s", .name = "", .n_children = ss->with_ts ? 8 : 7,
                              .children = ss->with_ts ? with_ts : fields, .release = release_schema};
  return 0;
}

static int get_next(struct ArrowArrayStream *st, struct ArrowArray *out) {
  stream_state *ss = st->private_data;
  if (ss->fail_at && ss->batch + 1 == ss->fail_at) return EIO;
  if (ss->batch == 2) {
    out->release = NULL;
    return 0;
  }
  const int b = ss->batch++;
  const int64_t n = b == 0 ? 3 : 2;
  *out = (struct ArrowArray){.length = n, .n_buffers = 1, .n_children = 7, .children = ss->ptrs[b],
                             .release = release_array};
  return 0;
}

static const char *last_error(struct ArrowArrayStream *st) { return "the disk went away"; }

static void release_stream(struct ArrowArrayStream *st) {
  stream_state *ss = st->private_data;
  for (int b = 0; b < 2; b++)
    for (int c = 0; c < 7; c++) free((void *)ss->cols[b][c].buffers);
  free(ss);
  st->release = NULL;
  released++;
}

static struct ArrowArrayStream make_stream(int fail_at, int with_ts) {
  stream_state *ss = calloc(1, sizeof *ss);
  ss->fail_at = fail_at;
  ss->with_ts = with_ts;
  ss->cols[0][0] = col(3, 1, 1, i1_valid, i1_vals, NULL);
  ss->cols[0][1] = col(3, 0, 0, NULL, g1_vals, NULL);
  ss->cols[0][2] = col(3, 0, 0, NULL, u1_off, u1_data);
  ss->cols[0][3] = col(3, 0, 0, NULL, d1_idx, NULL);
  ss->cols[0][3].dictionary = &dict_vals;
  ss->cols[0][4] = col(3, 0, 0, NULL, b1_vals, NULL);
  ss->cols[0][5] = col(3, 0, 0, NULL, f1_vals, NULL);
  ss->cols[0][6] = col(3, 0, 0, NULL, U1_off, U1_data);
  /* Batch 2: the same buffers from row 1 on (offsets), NaN and nulls. */
  static const double g2_vals[] = {-2.5, NAN};
  static const uint8_t none_valid[] = {0x00};
  ss->cols[1][0] = col(2, 0, 2, NULL, i1_vals, NULL);
  ss->cols[1][1] = col(2, 0, 0, NULL, g2_vals, NULL);
  ss->cols[1][2] = col(2, 2, 1, none_valid, u1_off, u1_data);
  ss->cols[1][3] = col(2, 0, 1, NULL, d1_idx, NULL);
  ss->cols[1][3].dictionary = &dict_vals;
  ss->cols[1][4] = col(2, 0, 1, NULL, b1_vals, NULL);
  ss->cols[1][5] = col(2, 0, 1, NULL, f1_vals, NULL);
  ss->cols[1][6] = col(2, 0, 1, NULL, U1_off, U1_data);
  for (int b = 0; b < 2; b++)
    for (int c = 0; c < 7; c++) ss->ptrs[b][c] = &ss->cols[b][c];
  return (struct ArrowArrayStream){.get_schema = get_schema, .get_next = get_next, .get_last_error = last_error,
                                   .release = release_stream, .private_data = ss};
}

/* All the text of a source, read through a reader of tiny blocks. */
static char *read_all(dlrec_arrow_csv *a, dlrec_status *st) {
  dlrec_source src = dlrec_arrow_csv_source(a);
  dlrec_reader *r;
  *st = dlrec_reader_open_source(&r, &src, 7, 1 << 10);
  if (*st != DLREC_OK) return NULL;
  size_t cap = 4096, n = 0;
  char *out = calloc(cap, 1);
  dlrec_block b = {0};
  while ((*st = dlrec_reader_next(r, &b)) == DLREC_OK) {
    memcpy(out + n, b.data, b.n);
    n += b.n;
  }
  if (*st == DLREC_END) *st = DLREC_OK;
  dlrec_block_free(&b);
  dlrec_reader_close(r);
  return out;
}

TEST(batches_become_the_csv_text_writers_produce) {
  released = 0;
  struct ArrowArrayStream s = make_stream(0, 0);
  dlrec_arrow_csv *a;
  CHECK_OK(dlrec_arrow_csv_open(&a, &s, "<table>", 1, ',', NULL, 0));
  CHECK(s.release == NULL); /* taken over */
  dlrec_status st;
  char *text = read_all(a, &st);
  CHECK_OK(st);
  CHECK(dlrec_arrow_csv_has_column(a, "d") && !dlrec_arrow_csv_has_column(a, "zz"));
  dlrec_arrow_csv_free(a);
  const char *want =
      "i,g,u,d,b,f,U\n"
      "-7,0.1,\"a,bc\",web,1,0.5,x\n"
      ",3,\"d\"\"ef\",ios,0,0.33333334,y\n"
      "42,1e+20,,web,1,-2,z\n"
      "0,-2.5,,ios,0,0.33333334,y\n"
      "42,,,web,1,-2,z\n";
  CHECK_STR(text, want);
  free(text);
  CHECK_EQ(released, 4); /* two batches, the schema, the stream */
}

TEST(columns_are_picked_by_name_in_the_criteo_layout) {
  released = 0;
  struct ArrowArrayStream s = make_stream(0, 0);
  const char *cols[] = {"U", "i", "d"};
  dlrec_arrow_csv *a;
  CHECK_OK(dlrec_arrow_csv_open(&a, &s, "<table>", 0, '\t', cols, 3));
  dlrec_status st;
  char *text = read_all(a, &st);
  CHECK_OK(st);
  dlrec_arrow_csv_free(a);
  CHECK_STR(text, "x\t-7\tweb\ny\t\tios\nz\t42\tweb\ny\t0\tios\nz\t42\tweb\n");
  free(text);
  CHECK_EQ(released, 4);
}

TEST(errors_name_the_column_or_the_stream) {
  released = 0;
  dlrec_arrow_csv *a;
  struct ArrowArrayStream s = make_stream(0, 1);
  CHECK_ERR(dlrec_arrow_csv_open(&a, &s, "<t>", 1, ',', NULL, 0), DLREC_ERR_UNSUPPORTED, "column 'when': Arrow type 'tsn:'");
  CHECK(s.release == NULL);
  CHECK_EQ(released, 2); /* the schema and the stream, on failure too */
  s = make_stream(0, 0);
  const char *missing[] = {"i", "nope"};
  CHECK_ERR(dlrec_arrow_csv_open(&a, &s, "<t>", 0, '\t', missing, 2), DLREC_ERR_INVALID, "<t>: no column 'nope'");
  /* The Criteo layout (tabs, no quoting) cannot carry a quote: row 1 of u. */
  s = make_stream(0, 0);
  const char *u[] = {"u"};
  CHECK_OK(dlrec_arrow_csv_open(&a, &s, "<t>", 0, '\t', u, 1));
  dlrec_status st;
  char *text = read_all(a, &st);
  free(text);
  dlrec_arrow_csv_free(a);
  CHECK_ERR(st, DLREC_ERR_PARSE, "row 1: column 'u'");
  s = make_stream(2, 0);
  CHECK_OK(dlrec_arrow_csv_open(&a, &s, "<t>", 1, ',', NULL, 0));
  text = read_all(a, &st);
  free(text);
  dlrec_arrow_csv_free(a);
  CHECK_ERR(st, DLREC_ERR_IO, "the disk went away");
  CHECK_ERR(dlrec_arrow_csv_open(&a, NULL, "<t>", 1, ',', NULL, 0), DLREC_ERR_INVALID, "no Arrow stream");
}
