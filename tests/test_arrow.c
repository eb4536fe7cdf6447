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
  test_buf out = {0};
  test_buf_put(&out, "", 0);
  dlrec_block b = {0};
  while ((*st = dlrec_reader_next(r, &b)) == DLREC_OK) test_buf_put(&out, b.data, b.n);
  if (*st == DLREC_END) *st = DLREC_OK;
  dlrec_block_free(&b);
  dlrec_reader_close(r);
  return out.p;
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
  CHECK(dlrec_arrow_csv_has_column(a, "i") && dlrec_arrow_csv_has_column(a, "U"));
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

/* ---- hand-built streams of any columns ---- */

/* An array of len rows from offset off, null_count nulls, nb buffers. */
#define ARR(len, nulls, off, nb, ...)                                                                                \
  ((struct ArrowArray){.length = (len), .null_count = (nulls), .offset = (off), .n_buffers = (nb),                   \
                       .buffers = (const void *[]){__VA_ARGS__}})

/* A stream of up to 6 batches (batch[b]: its length, offset and, when not
 * 0, n_children; kids[b]: its columns, up to 10) over the schema's fields;
 * the test owns the arrays. */
typedef struct hand {
  int n_fields, n_batches, next;
  struct ArrowSchema **fields;
  struct ArrowArray batch[6];
  struct ArrowArray *kids[6][10];
} hand;

static int hand_schema(struct ArrowArrayStream *st, struct ArrowSchema *out) {
  hand *h = st->private_data;
  *out = (struct ArrowSchema){.format = "+s", .name = "", .n_children = h->n_fields, .children = h->fields,
                              .release = release_schema};
  return 0;
}

static int hand_next(struct ArrowArrayStream *st, struct ArrowArray *out) {
  static const void *no_validity[] = {NULL};
  hand *h = st->private_data;
  if (h->next == h->n_batches) {
    out->release = NULL;
    return 0;
  }
  const int b = h->next++;
  *out = h->batch[b];
  out->n_buffers = 1, out->buffers = no_validity;
  out->n_children = h->batch[b].n_children ? h->batch[b].n_children : h->n_fields, out->children = h->kids[b];
  out->release = release_array;
  return 0;
}

static void hand_release(struct ArrowArrayStream *st) {
  st->release = NULL;
  released++;
}

/* All of h's text, read straight from the source in reads of 777 bytes (no
 * line reader, so lines of any length); NULL with *st set on an error. */
static char *hand_text(hand *h, int header, char sep, const char *const *cols, int n_cols, dlrec_status *st) {
  struct ArrowArrayStream s = {.get_schema = hand_schema, .get_next = hand_next, .release = hand_release,
                               .private_data = h};
  dlrec_arrow_csv *a;
  h->next = 0;
  if ((*st = dlrec_arrow_csv_open(&a, &s, "<h>", header, sep, cols, n_cols)) != DLREC_OK) return NULL;
  dlrec_source src = dlrec_arrow_csv_source(a);
  test_buf out = {0};
  char buf[777];
  size_t got = 1;
  test_buf_put(&out, "", 0);
  while ((*st = src.read(src.ctx, buf, sizeof buf, &got)) == DLREC_OK && got) test_buf_put(&out, buf, got);
  dlrec_arrow_csv_free(a);
  if (*st != DLREC_OK) test_buf_free(&out);
  return out.p;
}

/* Offsets on arrays, on dictionary indices and values, and on the batch (a
 * struct's offset applies to its children); null counts of -1 (count the
 * bitmap) and of 0 (no nulls, whatever a bitmap says); a null index holding
 * garbage; a null dictionary value; empty batches first and between. */
TEST(offsets_null_counts_and_empty_batches_as_the_interface_allows) {
  static struct ArrowSchema fv = {.format = "u", .name = ""}, fn = {.format = "l", .name = "n"},
                            fz = {.format = "i", .name = "z"}, fk = {.format = "i", .name = "k"},
                            fd = {.format = "s", .name = "d", .dictionary = &fv}, fb = {.format = "b", .name = "b"};
  static struct ArrowSchema *fields[] = {&fn, &fz, &fk, &fd, &fb};
  static const int64_t n_vals[] = {10, 11, 12, 13, 14, 15}, n3[] = {INT64_MIN};
  static const int32_t z_vals[] = {7, 8, 9}, k_vals[] = {1, 2, 3, 4}, z3[] = {INT32_MIN}, k3[] = {INT32_MAX};
  static const uint8_t n_valid[] = {0x37}, zeros[] = {0, 0}, d_valid[] = {0x0b}, v_valid[] = {0x17};
  static const int16_t d_idx[] = {5, 2, 999, 0}, d3[] = {1};
  static const int32_t v_off[] = {0, 2, 4, 7, 7, 10};
  static const uint8_t b_bits[] = {0x40, 0x01}, b3[] = {0x01};
  struct ArrowArray dict = ARR(3, -1, 2, 3, v_valid, v_off, "zzyywebios");
  struct ArrowArray n = ARR(3, -1, 2, 2, n_valid, n_vals), z = ARR(3, 0, 0, 2, NULL, z_vals),
                    k = ARR(3, 0, 1, 2, zeros, k_vals), d = ARR(3, -1, 1, 2, d_valid, d_idx),
                    b = ARR(3, 0, 6, 2, NULL, b_bits);
  struct ArrowArray n_3 = ARR(1, 0, 0, 2, NULL, n3), z_3 = ARR(1, 0, 0, 2, NULL, z3), k_3 = ARR(1, 0, 0, 2, NULL, k3),
                    d_3 = ARR(1, 0, 0, 2, NULL, d3), b_3 = ARR(1, 0, 0, 2, NULL, b3);
  d.dictionary = d_3.dictionary = &dict;
  hand h = {.n_fields = 5, .n_batches = 5, .fields = fields};
  const int64_t len[] = {0, 3, 0, 2, 1}, off[] = {0, 0, 0, 1, 0};
  for (int i = 0; i < 5; i++) {
    h.batch[i] = (struct ArrowArray){.length = len[i], .offset = off[i]};
    struct ArrowArray *row[] = {&n, &z, &k, &d, &b}, *last[] = {&n_3, &z_3, &k_3, &d_3, &b_3};
    memcpy(h.kids[i], i == 4 ? last : row, sizeof row);
  }
  released = 0;
  dlrec_status st;
  char *text = hand_text(&h, 1, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "n,z,k,d,b\n"
                  "12,7,2,ios,1\n"
                  ",8,3,,0\n"
                  "14,9,4,web,1\n"
                  ",8,3,,0\n" /* the batch from row 1 of the same arrays */
                  "14,9,4,web,1\n"
                  "-9223372036854775808,-2147483648,2147483647,,1\n");
  free(text);
  CHECK_EQ(released, 7); /* five batches, the schema, the stream */
}

/* A dictionary of 40000 strings "v0".."v39999" (so that unsigned 8- and
 * 16-bit indices reach past the signed range); free *data after. */
static struct ArrowArray big_dict(int32_t **off, char **data) {
  *off = malloc(40001 * sizeof **off);
  *data = malloc(40000 * 7);
  (*off)[0] = 0;
  for (int i = 0; i < 40000; i++) (*off)[i + 1] = (*off)[i] + sprintf(*data + (*off)[i], "v%d", i);
  struct ArrowArray d = {.length = 40000, .n_buffers = 3, .buffers = malloc(3 * sizeof(void *))};
  d.buffers[0] = NULL, d.buffers[1] = *off, d.buffers[2] = *data;
  return d;
}

/* Every integer type of dictionary index, each at the top of its range;
 * an index past the end (the dictionary's offset not counted in its length)
 * or negative, or beyond int32/int64 as stored, is an error naming the row
 * across batches, the column and the index; a null slot's garbage is not. */
TEST(dictionary_indices_of_every_integer_type_and_out_of_range) {
  static struct ArrowSchema fv = {.format = "u", .name = ""};
  static struct ArrowSchema f[8] = {{.format = "c", .name = "c"}, {.format = "C", .name = "C"},
                                    {.format = "s", .name = "s"}, {.format = "S", .name = "S"},
                                    {.format = "i", .name = "i"}, {.format = "I", .name = "I"},
                                    {.format = "l", .name = "l"}, {.format = "L", .name = "L"}};
  static struct ArrowSchema *fields[] = {&f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7]};
  for (int i = 0; i < 8; i++) f[i].dictionary = &fv;
  int32_t *off;
  char *data;
  struct ArrowArray dict = big_dict(&off, &data);
  static const int8_t c[] = {127, 0, -1};
  static const uint8_t C[] = {255, 128, 0};
  static const int16_t s[] = {32767, 1, 0};
  static const uint16_t S[] = {39999, 32768, 0};
  static const int32_t i32[] = {39999, 2, 40000};
  static const uint32_t u32[] = {39998, 3, 0x80000000u};
  static const int64_t i64[] = {39997, 4, 0};
  static const uint64_t u64[] = {39996, 5, 0x8000000000000005ull};
  const void *vals[] = {c, C, s, S, i32, u32, i64, u64};
  static const uint8_t third_null[] = {0x03};
  struct ArrowArray a[8];
  hand h = {.n_fields = 8, .n_batches = 2, .fields = fields};
  h.batch[0] = (struct ArrowArray){.length = 2};
  h.batch[1] = (struct ArrowArray){.length = 1, .offset = 1};
  h.batch[2] = (struct ArrowArray){.length = 2, .offset = 1}; /* rows 3 and 4, the bad indices in 4 */
  const void *bufs[8][2];
  for (int i = 0; i < 8; i++) {
    bufs[i][0] = third_null, bufs[i][1] = vals[i]; /* l: the third is null */
    a[i] = (struct ArrowArray){.length = 3, .null_count = i == 6 ? -1 : 0, .n_buffers = 2, .buffers = bufs[i],
                               .dictionary = &dict};
    h.kids[0][i] = h.kids[1][i] = h.kids[2][i] = &a[i];
  }
  dlrec_status st;
  h.n_batches = 1;
  char *text = hand_text(&h, 1, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "c,C,s,S,i,I,l,L\nv127,v255,v32767,v39999,v39999,v39998,v39997,v39996\nv0,v128,v1,v32768,v2,v3,v4,v5\n");
  free(text);
  h.n_batches = 3;
  const char *pick[] = {"c", "i", "I", "L", "C", "l"};
  const char *want[] = {"row 4: column 'c': dictionary index -1 out of range (the dictionary has 40000 values)",
                        "row 4: column 'i': dictionary index 40000 out of range",
                        "row 4: column 'I': dictionary index 2147483648 out of range",
                        "row 4: column 'L': dictionary index 9223372036854775813 out of range"};
  for (int i = 0; i < 4; i++) {
    CHECK(hand_text(&h, 0, ',', &pick[i], 1, &st) == NULL);
    CHECK_ERR(st, DLREC_ERR_INVALID, want[i]);
  }
  text = hand_text(&h, 0, '\t', &pick[4], 2, &st); /* C: 0 is in range; l: the null's index is not read */
  CHECK_OK(st);
  CHECK_STR(text, "v255\tv39997\nv128\tv4\nv128\tv4\nv128\tv4\nv0\t\n");
  free(text);
  /* The dictionary's offset moves its start, not its end. */
  dict.offset = 1, dict.length = 39998;
  CHECK(hand_text(&h, 0, ',', &pick[0], 1, &st) == NULL); /* 127 -> v128 */
  CHECK_ERR(st, DLREC_ERR_INVALID, "row 4: column 'c': dictionary index -1 out of range (the dictionary has 39998");
  CHECK(hand_text(&h, 0, ',', &pick[2], 1, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "row 0: column 'I': dictionary index 39998 out of range");
  h.n_batches = 1;
  text = hand_text(&h, 0, ',', &pick[0], 1, &st);
  CHECK_OK(st);
  CHECK_STR(text, "v128\nv1\n");
  free(text);
  free((void *)dict.buffers), free(off), free(data);
  /* Indices of a type that is not an integer, values of a type not read. */
  static struct ArrowSchema ts = {.format = "tsn:", .name = ""}, ff = {.format = "f", .name = "x", .dictionary = &fv},
                            ft = {.format = "i", .name = "y", .dictionary = &ts};
  static struct ArrowSchema *bad_idx[] = {&ff}, *bad_val[] = {&ft};
  h = (hand){.n_fields = 1, .fields = bad_idx};
  CHECK(hand_text(&h, 1, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "column 'x': dictionary indices of type 'f'");
  h.fields = bad_val;
  CHECK(hand_text(&h, 1, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_UNSUPPORTED, "column 'y': Arrow type 'tsn:' (dictionary values) is not read");
}

/* The values of the strings test, a null at row 5. */
static const char *const str_vals[] = {"plain", "\rmid", "a,b", "say \"hi\"", "", NULL, "tab\there", "end\r", "x"};

/* Offsets (int32 or int64 by wide) and data of str_vals from physical row
 * skip on (rows before it hold "JUNK"), the null as null_as; free both. */
static void str_buffers(int wide, int skip, const char *null_as, void **off, char **data) {
  const int n = 9 + skip;
  *off = malloc((size_t)(n + 1) * 8);
  *data = malloc(256);
  int64_t at = 0;
  for (int i = 0; i <= n; i++) {
    if (wide) ((int64_t *)*off)[i] = at;
    else ((int32_t *)*off)[i] = (int32_t)at;
    const char *v = i == n ? "" : i < skip ? "JUNK" : str_vals[i - skip] ? str_vals[i - skip] : null_as;
    memcpy(*data + at, v, strlen(v));
    at += (int64_t)strlen(v);
  }
}

/* Strings holding the separator, quotes and carriage returns are quoted as
 * RFC 4180 writers do and read back by the CSV parser as they were, in
 * utf8, large utf8 (from an offset) and binary columns; an empty string and
 * a null are both an empty field; a line feed is refused, naming the row and
 * column; the Criteo layout writes a comma as it is and refuses the rest. */
TEST(strings_are_quoted_as_csv_writers_do_and_read_back_by_the_parser) {
  static struct ArrowSchema fu = {.format = "u", .name = "u"}, fU = {.format = "U", .name = "a,b"},
                            fz = {.format = "z", .name = "bin"};
  static struct ArrowSchema *fields[] = {&fu, &fU, &fz};
  static const uint8_t u_valid[] = {0xdf, 0x01}, U_valid[] = {0xbf, 0x03}; /* row 5 null; U from physical 1 */
  void *off[3];
  char *data[3];
  str_buffers(0, 0, "NULL", &off[0], &data[0]); /* the bitmap hides it */
  str_buffers(1, 1, "NULL", &off[1], &data[1]);
  str_buffers(0, 0, "", &off[2], &data[2]); /* bin has no nulls: an empty string */
  struct ArrowArray u = ARR(9, 1, 0, 3, u_valid, off[0], data[0]), U = ARR(9, -1, 1, 3, U_valid, off[1], data[1]),
                    z = ARR(9, 0, 0, 3, NULL, off[2], data[2]);
  hand h = {.n_fields = 3, .n_batches = 1, .fields = fields};
  h.batch[0].length = 9;
  h.kids[0][0] = &u, h.kids[0][1] = &U, h.kids[0][2] = &z;
  dlrec_status st;
  char *text = hand_text(&h, 1, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "u,\"a,b\",bin\n"
                  "plain,plain,plain\n"
                  "\"\rmid\",\"\rmid\",\"\rmid\"\n"
                  "\"a,b\",\"a,b\",\"a,b\"\n"
                  "\"say \"\"hi\"\"\",\"say \"\"hi\"\"\",\"say \"\"hi\"\"\"\n"
                  ",,\n"
                  ",,\n"
                  "tab\there,tab\there,tab\there\n"
                  "\"end\r\",\"end\r\",\"end\r\"\n"
                  "x,x,x\n");
  /* The CSV parser reads each line back to the values. */
  dlrec_columns cols = {.n_cat = 3};
  strcpy(cols.cat[0], "u"), strcpy(cols.cat[1], "a,b"), strcpy(cols.cat[2], "bin");
  dlrec_layout *L;
  char *line = strchr(text, '\n') + 1;
  CHECK_OK(dlrec_layout_csv(&L, &cols, 0, text, (size_t)(line - 1 - text), "<h>"));
  dlrec_raw_row *row = malloc(sizeof *row);
  char scratch[64];
  for (int r = 0; r < 9; r++) {
    char *end = strchr(line, '\n');
    dlrec_where w = {"<h>", (uint64_t)r + 2};
    CHECK_OK(dlrec_parse_row(L, line, (size_t)(end - line), scratch, row, &w));
    const char *v = str_vals[r] ? str_vals[r] : "";
    for (int c = 0; c < 3; c++) {
      CHECK_EQ(row->cat[c].n, strlen(v));
      CHECK(!memcmp(row->cat[c].s, v, strlen(v)));
    }
    line = end + 1;
  }
  free(row);
  dlrec_layout_free(L);
  free(text);
  /* The Criteo layout: a comma as it is; a quote or a carriage return, and a
   * line feed in either layout, refused with the row and column. */
  const char *pick[] = {"bin", "u"};
  h.batch[0].offset = 2, h.batch[0].length = 1; /* "a,b" */
  text = hand_text(&h, 0, '\t', pick, 1, &st);
  CHECK_OK(st);
  CHECK_STR(text, "a,b\n");
  free(text);
  h.batch[0].offset = 1; /* row 0 is "\rmid" */
  CHECK(hand_text(&h, 0, '\t', pick, 1, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_PARSE, "row 0: column 'bin': a value holding a tab, quote or line break");
  data[0][5] = '\n'; /* u's row 1 "\rmid" -> "\nmid" */
  h.batch[0].offset = 0, h.batch[0].length = 9;
  for (int sep = 0; sep < 2; sep++) {
    CHECK(hand_text(&h, 0, sep ? '\t' : ',', &pick[1], 1, &st) == NULL);
    CHECK_ERR(st, DLREC_ERR_PARSE, "<h>: row 1: column 'u': a value holding a line break cannot be read");
  }
  for (int i = 0; i < 3; i++) free(off[i]), free(data[i]);
  /* Empty strings whose data buffer is NULL. */
  static const int32_t empty_off[] = {0, 0, 0};
  struct ArrowArray e = ARR(2, 0, 0, 3, NULL, empty_off, NULL);
  h = (hand){.n_fields = 1, .n_batches = 1, .fields = fields};
  h.batch[0].length = 2;
  h.kids[0][0] = &e;
  text = hand_text(&h, 1, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "u\n\n\n");
  free(text);
}

/* Batches of 255, 256, 257 and 513 rows (a fill formats 256) from one set
 * of arrays at offsets, rows of 4 KiB (a fill of 256 passes the text
 * buffer's first 64 KiB by far) and a value of 140,001 bytes (two doublings
 * at once): the text is what a plain loop writes. */
TEST(rows_past_a_fill_and_text_past_the_first_buffer) {
  enum { ROWS = 255 + 256 + 257 + 513, BIG = 140001, BIG_ROW = 600 };
  static struct ArrowSchema fv = {.format = "u", .name = ""}, fn = {.format = "l", .name = "n"},
                            fd = {.format = "S", .name = "d", .dictionary = &fv}, fs = {.format = "u", .name = "s"};
  static struct ArrowSchema *fields[] = {&fn, &fd, &fs};
  static const int32_t v_off[] = {0, 1, 3, 6};
  int64_t *n = malloc(ROWS * sizeof *n);
  uint16_t *d = malloc(ROWS * sizeof *d);
  int32_t *s_off = malloc((ROWS + 1) * sizeof *s_off);
  char *s_data = malloc(ROWS * 4096 + BIG);
  test_buf want = {0};
  test_buf_printf(&want, "n,d,s\n");
  s_off[0] = 0;
  for (int r = 0; r < ROWS; r++) {
    n[r] = 3 * (int64_t)r - 1000, d[r] = (uint16_t)(r % 3);
    const int len = r == BIG_ROW ? BIG : r % 2 ? 4096 : sprintf(s_data + s_off[r], "s%d", r);
    if (r % 2 || r == BIG_ROW) memset(s_data + s_off[r], 'a' + r % 26, (size_t)len);
    s_off[r + 1] = s_off[r] + len;
    test_buf_printf(&want, "%lld,%s,%.*s\n", (long long)n[r], (const char *[]){"a", "bb", "ccc"}[r % 3], len,
                    s_data + s_off[r]);
  }
  struct ArrowArray dict = ARR(3, 0, 0, 3, NULL, v_off, "abbccc");
  struct ArrowArray a[4][3];
  const void *bufs[3][3] = {{NULL, n}, {NULL, d}, {NULL, s_off, s_data}};
  hand h = {.n_fields = 3, .n_batches = 4, .fields = fields};
  const int64_t len[] = {255, 256, 257, 513};
  for (int b = 0, at = 0; b < 4; at += (int)len[b++]) {
    h.batch[b].length = len[b];
    for (int c = 0; c < 3; c++) {
      a[b][c] = (struct ArrowArray){.length = len[b], .offset = at, .n_buffers = c == 2 ? 3 : 2, .buffers = bufs[c]};
      h.kids[b][c] = &a[b][c];
    }
    a[b][1].dictionary = &dict;
  }
  dlrec_status st;
  char *text = hand_text(&h, 1, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_EQ(strlen(text), want.n);
  CHECK(!strcmp(text, want.p));
  free(text), test_buf_free(&want);
  free(n), free(d), free(s_off), free(s_data);
}

/* A batch whose arrays cannot be read as the schema says is refused,
 * naming the column and the batch's first row, before any of it is read. */
TEST(malformed_batches_are_refused_naming_the_column) {
  static struct ArrowSchema fv = {.format = "u", .name = ""}, fi = {.format = "i", .name = "i"},
                            fs = {.format = "u", .name = "s"}, fd = {.format = "c", .name = "d", .dictionary = &fv};
  static struct ArrowSchema *fields[] = {&fi, &fs, &fd};
  static const int32_t vals[] = {0, 1, 2}, off[] = {0, 1, 2, 3};
  static const int8_t idx[] = {0, 1, 2};
  struct ArrowArray dict = ARR(3, 0, 0, 3, NULL, off, "abc");
  struct ArrowArray i = ARR(3, 0, 0, 2, NULL, vals), s = ARR(3, 0, 0, 3, NULL, off, "xyz"),
                    d = ARR(3, 0, 0, 2, NULL, idx);
  d.dictionary = &dict;
  hand h = {.n_fields = 3, .n_batches = 2, .fields = fields};
  h.batch[0].length = 2, h.batch[1].length = 1, h.batch[1].offset = 2;
  for (int b = 0; b < 2; b++) h.kids[b][0] = &i, h.kids[b][1] = &s, h.kids[b][2] = &d;
  dlrec_status st;
  char *text = hand_text(&h, 0, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "0,x,a\n1,y,b\n2,z,c\n");
  free(text);
  h.batch[1].offset = 3; /* past the arrays' 3 rows */
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "<h>: record batch from row 2: column 'i': fewer values than the batch has rows");
  h.batch[1].offset = 2;
  s.n_buffers = 2;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "record batch from row 0: column 's': too few buffers for its type");
  s.n_buffers = 3, i.buffers[1] = NULL;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "column 'i': no values buffer");
  i.buffers[1] = vals, d.dictionary = NULL;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "column 'd': a dictionary column without its dictionary");
  d.dictionary = &dict, dict.n_buffers = 2;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "column 'd': too few buffers for its type");
  dict.n_buffers = 3, h.kids[1][1] = NULL;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "record batch from row 2: column 's': no array");
  h.kids[1][1] = &s, i.offset = -1;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "record batch from row 0: column 'i': a negative offset");
  i.offset = 0, h.batch[1].n_children = 2;
  CHECK(hand_text(&h, 0, ',', NULL, 0, &st) == NULL);
  CHECK_ERR(st, DLREC_ERR_INVALID, "<h>: a record batch of 2 columns, the schema has 3");
}

/* Integers at the ends of their types; doubles and floats that need each
 * precision (and -0, inf, the smallest subnormal, the integers' fast path
 * up to 10^15 and 10^6); NaN and the null type as empty fields. */
TEST(numbers_at_the_edges_of_their_types_and_precisions) {
  static struct ArrowSchema f[] = {{.format = "c", .name = "c"}, {.format = "C", .name = "C"},
                                   {.format = "s", .name = "s"}, {.format = "S", .name = "S"},
                                   {.format = "I", .name = "I"}, {.format = "L", .name = "L"},
                                   {.format = "l", .name = "l"}, {.format = "g", .name = "g"},
                                   {.format = "f", .name = "f"}, {.format = "n", .name = "n"}};
  static struct ArrowSchema *fields[] = {&f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9]};
  static const int8_t c[] = {-128, 127, 0, -1, 1, 2, 3, 4};
  static const uint8_t C[] = {255, 0, 128, 1, 2, 3, 4, 5};
  static const int16_t s[] = {-32768, 32767, 0, 1, 2, 3, 4, 5};
  static const uint16_t S[] = {65535, 0, 32768, 1, 2, 3, 4, 5};
  static const uint32_t I[] = {4294967295u, 0, 2147483648u, 1, 2, 3, 4, 5};
  static const uint64_t L[] = {UINT64_MAX, 0, 9223372036854775808ull, 1, 2, 3, 4, 5};
  static const int64_t l[] = {INT64_MAX, INT64_MIN, -1, 1, 2, 3, 4, 5};
  const double g[] = {0.1 + 0.2, 1e15, 999999999999999.0, -0.0, INFINITY, 5e-324, 1.0 / 3, NAN};
  const float fl[] = {1e6f, 999999.0f, -0.0f, 1.00000012f, 16777216.0f, 1.00192186e-36f, -INFINITY, NAN};
  const void *vals[] = {c, C, s, S, I, L, l, g, fl};
  const void *bufs[10][2];
  struct ArrowArray a[10];
  hand h = {.n_fields = 10, .n_batches = 1, .fields = fields};
  h.batch[0].length = 8;
  for (int i = 0; i < 10; i++) {
    bufs[i][0] = NULL, bufs[i][1] = i < 9 ? vals[i] : NULL;
    a[i] = (struct ArrowArray){.length = 8, .null_count = i == 9 ? 8 : 0, .n_buffers = i < 9 ? 2 : 0,
                               .buffers = bufs[i]};
    h.kids[0][i] = &a[i];
  }
  dlrec_status st;
  char *text = hand_text(&h, 0, ',', NULL, 0, &st);
  CHECK_OK(st);
  CHECK_STR(text, "-128,255,-32768,65535,4294967295,18446744073709551615,9223372036854775807,0.30000000000000004,1e+06,\n"
                  "127,0,32767,0,0,0,-9223372036854775808,1e+15,999999,\n"
                  "0,128,0,32768,2147483648,9223372036854775808,-1,999999999999999,-0,\n"
                  "-1,1,1,1,1,1,1,-0,1.0000001,\n"
                  "1,2,2,2,2,2,2,inf,16777216,\n"
                  "2,3,3,3,3,3,3,4.94065645841247e-324,1.00192186e-36,\n"
                  "3,4,4,4,4,4,4,0.3333333333333333,-inf,\n"
                  "4,5,5,5,5,5,5,,,\n");
  free(text);
}
