/* .dlr files: round trips against the values written, the writer's checks,
 * corruption and truncation anywhere, versions, incomplete files, the byte
 * layout as docs/formats.md specifies it, and `dlrec inspect`. */
#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "data/dlr.h"
#include "core/rng.h"
#include "test.h"

/* ---- test data: random row groups whose values we keep ---- */

typedef struct tgroup {
  uint32_t rows;
  float *labels, *dense;
  uint32_t *offsets[4], *ids[4];
  uint64_t nnz[4];
} tgroup;

/* label + 3 dense + 4 sparse: one-hot, fixed 3-hot, variable (max 4, never
 * empty), variable (max 2, often empty). */
static void test_schema(dlrec_schema *s, int with_label, uint32_t n_dense) {
  memset(s, 0, sizeof *s);
  s->has_label = with_label;
  if (with_label) strcpy(s->label_name, "click");
  s->n_dense = n_dense;
  for (uint32_t i = 0; i < n_dense; i++) snprintf(s->dense_names[i], DLREC_NAME_MAX, "I%u", i + 1);
  s->n_sparse = 4;
  const struct {
    const char *name;
    uint32_t hot, maxh;
    uint64_t b, e;
  } cols[4] = {{"C1", 1, 1, 0, 100}, {"C2", 3, 3, 100, 1100}, {"C3", 0, 4, 1100, 1200}, {"C4", 0, 2, 1200, 5000}};
  for (int c = 0; c < 4; c++) {
    snprintf(s->sparse[c].name, DLREC_NAME_MAX, "%s", cols[c].name);
    s->sparse[c].hotness = cols[c].hot;
    s->sparse[c].max_hotness = cols[c].maxh;
    s->sparse[c].id_begin = cols[c].b;
    s->sparse[c].id_end = cols[c].e;
  }
  s->table_rows = 5000;
}

static void tgroup_make(tgroup *g, const dlrec_schema *s, uint32_t rows, dlrec_rng *r) {
  memset(g, 0, sizeof *g);
  g->rows = rows;
  g->labels = malloc(rows * sizeof(float));
  g->dense = malloc((size_t)rows * (s->n_dense ? s->n_dense : 1) * sizeof(float));
  for (uint32_t i = 0; i < rows; i++) g->labels[i] = (float)dlrec_rng_below(r, 2);
  for (uint32_t i = 0; i < rows * s->n_dense; i++) g->dense[i] = (float)dlrec_rng_normal(r);
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    const dlrec_sparse_col *col = &s->sparse[c];
    uint32_t span = (uint32_t)(col->id_end - col->id_begin);
    if (col->hotness) {
      g->nnz[c] = (uint64_t)rows * col->hotness;
    } else {
      g->offsets[c] = malloc((rows + 1) * sizeof(uint32_t));
      g->offsets[c][0] = 0;
      for (uint32_t i = 0; i < rows; i++) {
        uint32_t n = c == 2 ? 1 + dlrec_rng_below(r, col->max_hotness) : dlrec_rng_below(r, col->max_hotness + 1);
        g->offsets[c][i + 1] = g->offsets[c][i] + n;
      }
      g->nnz[c] = g->offsets[c][rows];
    }
    g->ids[c] = malloc((g->nnz[c] + 1) * sizeof(uint32_t));
    for (uint64_t k = 0; k < g->nnz[c]; k++) g->ids[c][k] = (uint32_t)col->id_begin + dlrec_rng_below(r, span);
  }
}

static void tgroup_free(tgroup *g) {
  free(g->labels);
  free(g->dense);
  for (int c = 0; c < 4; c++) {
    free(g->offsets[c]);
    free(g->ids[c]);
  }
}

static dlrec_rowgroup tgroup_view(const tgroup *g, const dlrec_schema *s) {
  dlrec_rowgroup rg;
  memset(&rg, 0, sizeof rg);
  rg.rows = g->rows;
  rg.labels = s->has_label ? g->labels : NULL;
  rg.dense = g->dense;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    rg.offsets[c] = g->offsets[c];
    rg.ids[c] = g->ids[c];
  }
  return rg;
}

/* Writes groups of the given sizes; keeps them in *out (caller frees). */
static dlrec_status write_file(const char *path, const dlrec_schema *s, const uint32_t *sizes, int n, uint64_t seed,
                               tgroup *out) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  dlrec_dlr_writer *w;
  dlrec_status st = dlrec_dlr_writer_open(&w, path, s);
  if (st != DLREC_OK) return st;
  for (int i = 0; i < n; i++) {
    tgroup_make(&out[i], s, sizes[i], &r);
    dlrec_rowgroup rg = tgroup_view(&out[i], s);
    st = dlrec_dlr_writer_append(w, &rg);
    if (st != DLREC_OK) {
      dlrec_dlr_writer_abort(w);
      return st;
    }
  }
  return dlrec_dlr_writer_finish(w);
}

/* Compares every value of a file with what was written (bitwise floats). */
static int compare_file(const dlrec_dlr *f, const dlrec_schema *s, const tgroup *g, int n) {
  if (dlrec_dlr_row_groups(f) != (uint32_t)n) return 0;
  uint64_t first = 0;
  for (int i = 0; i < n; i++) {
    dlrec_rowgroup rg;
    if (dlrec_dlr_row_group(f, (uint32_t)i, &rg) != DLREC_OK) return 0;
    if (rg.rows != g[i].rows || dlrec_dlr_group_rows(f, (uint32_t)i) != g[i].rows) return 0;
    if (dlrec_dlr_group_first_row(f, (uint32_t)i) != first) return 0;
    first += g[i].rows;
    if (s->has_label ? memcmp(rg.labels, g[i].labels, 4ull * rg.rows) != 0 : rg.labels != NULL) return 0;
    if (memcmp(rg.dense, g[i].dense, 4ull * rg.rows * s->n_dense)) return 0;
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      if (s->sparse[c].hotness == 0) {
        if (!rg.offsets[c] || memcmp(rg.offsets[c], g[i].offsets[c], 4ull * (rg.rows + 1))) return 0;
      } else if (rg.offsets[c]) {
        return 0;
      }
      if (memcmp(rg.ids[c], g[i].ids[c], 4 * g[i].nnz[c])) return 0;
    }
  }
  return dlrec_dlr_rows(f) == first;
}

static void free_groups(tgroup *g, int n) {
  for (int i = 0; i < n; i++) tgroup_free(&g[i]);
}

/* Reads a whole file into a 64-byte aligned buffer (for open_buffer). */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *buf = aligned_alloc(64, ((size_t)len + 64) & ~(size_t)63);
  if (buf && fread(buf, 1, (size_t)len, fp) != (size_t)len) {
    free(buf);
    buf = NULL;
  }
  fclose(fp);
  *n = (size_t)len;
  return buf;
}

/* open + verify every group; the first error's status. */
static dlrec_status open_verify_buffer(const unsigned char *buf, size_t n) {
  dlrec_dlr *f;
  dlrec_status st = dlrec_dlr_open_buffer(&f, buf, n, "mem.dlr");
  if (st != DLREC_OK) return st;
  for (uint32_t i = 0; i < dlrec_dlr_row_groups(f) && st == DLREC_OK; i++) st = dlrec_dlr_verify(f, i);
  dlrec_dlr_close(f);
  return st;
}

static uint32_t get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

/* ---- round trips ---- */

TEST(roundtrip_random_with_label) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  const uint32_t sizes[] = {1, 7, 100, 333, 64, 2};
  tgroup g[6];
  const char *p = test_path("a.dlr");
  CHECK_OK(write_file(p, &s, sizes, 6, 42, g));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, p));
  CHECK(dlrec_schema_equal(dlrec_dlr_schema(f), &s));
  CHECK_EQ(dlrec_dlr_rows(f), 507);
  CHECK_EQ(dlrec_dlr_version(f), DLREC_DLR_VERSION);
  CHECK(compare_file(f, &s, g, 6));
  for (uint32_t i = 0; i < 6; i++) CHECK_OK(dlrec_dlr_verify(f, i));
  for (uint32_t i = 0; i < 6; i++) CHECK_OK(dlrec_dlr_check_offsets(f, i));
  CHECK_ERR(dlrec_dlr_row_group(f, 6, &(dlrec_rowgroup){0}), DLREC_ERR_INVALID, "row group 6");
  CHECK_STR(dlrec_dlr_path(f), p);
  uint64_t fp = dlrec_dlr_fingerprint(f);
  dlrec_dlr_close(f);
  CHECK(access(test_path("a.dlr.tmp"), F_OK) != 0); /* no temp left behind */

  /* Same content elsewhere: same fingerprint; other content: another. */
  tgroup g2[6];
  CHECK_OK(write_file(test_path("b.dlr"), &s, sizes, 6, 42, g2));
  CHECK_OK(dlrec_dlr_open(&f, test_path("b.dlr")));
  CHECK_EQ_U64(dlrec_dlr_fingerprint(f), fp);
  dlrec_dlr_close(f);
  free_groups(g2, 6);
  CHECK_OK(write_file(test_path("c.dlr"), &s, sizes, 6, 43, g2));
  CHECK_OK(dlrec_dlr_open(&f, test_path("c.dlr")));
  CHECK(dlrec_dlr_fingerprint(f) != fp);
  dlrec_dlr_close(f);
  free_groups(g2, 6);
  free_groups(g, 6);
}

TEST(roundtrip_no_label_no_dense) {
  dlrec_schema s;
  test_schema(&s, 0, 0);
  const uint32_t sizes[] = {5, 1000, 3};
  tgroup g[3];
  const char *p = test_path("nolabel.dlr");
  CHECK_OK(write_file(p, &s, sizes, 3, 7, g));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, p));
  CHECK(!dlrec_dlr_schema(f)->has_label);
  CHECK(compare_file(f, &s, g, 3));
  for (uint32_t i = 0; i < 3; i++) CHECK_OK(dlrec_dlr_verify(f, i));
  dlrec_dlr_close(f);
  free_groups(g, 3);
}

TEST(roundtrip_empty_file) {
  dlrec_schema s;
  test_schema(&s, 1, 2);
  const char *p = test_path("empty.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  CHECK_EQ(dlrec_dlr_writer_rows(w), 0);
  CHECK_OK(dlrec_dlr_writer_finish(w));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, p));
  CHECK_EQ(dlrec_dlr_rows(f), 0);
  CHECK_EQ(dlrec_dlr_row_groups(f), 0);
  CHECK(dlrec_schema_equal(dlrec_dlr_schema(f), &s));
  dlrec_dlr_close(f);
}

/* The layout facts of docs/formats.md, checked on the bytes. */
TEST(layout_matches_the_spec) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  const uint32_t sizes[] = {10, 3};
  tgroup g[2];
  const char *p = test_path("layout.dlr");
  CHECK_OK(write_file(p, &s, sizes, 2, 1, g));
  size_t n;
  unsigned char *b = slurp(p, &n);
  CHECK(b != NULL);
  static const unsigned char magic[8] = {0x89, 'D', 'L', 'R', '\r', '\n', 0x1a, '\n'};
  CHECK(memcmp(b, magic, 8) == 0);
  CHECK_EQ(get32(b + 8), 1);
  uint32_t hb = get32(b + 12);
  CHECK_EQ(hb, (112 + 48 * 3 + 72 * 4 + 4 + 63) / 64 * 64);
  CHECK_EQ(get32(b + 16), 3); /* complete | has_label */
  CHECK_EQ(get32(b + 20), 3);
  CHECK_EQ(get32(b + 24), 4);
  CHECK_EQ_U64(get64(b + 32), 13);
  CHECK_EQ_U64(get64(b + 40), 2);
  CHECK_EQ_U64(get64(b + 56), 5000);
  CHECK_STR((const char *)b + 64, "click");
  CHECK_STR((const char *)b + 112 + 48 * 2, "I3");
  CHECK_STR((const char *)b + 112 + 48 * 3 + 72 * 2, "C3");
  CHECK_EQ(get32(b + 112 + 48 * 3 + 72 * 2 + 52), 4); /* C3 max hotness */
  CHECK_EQ_U64(get32(b + hb - 4), dlrec_crc32c(0, b, hb - 4));
  uint64_t io = get64(b + 48);
  CHECK_EQ_U64(n, io + 16 + 24 * 2 + 4);
  CHECK_EQ(get32(b + io), 0x49524c44u); /* "DLRI" */
  CHECK_EQ_U64(get64(b + io + 16), hb); /* group 0 right after the header */
  uint64_t g0_bytes = get64(b + io + 24);
  CHECK_EQ_U64(get64(b + io + 40), hb + g0_bytes);
  CHECK_EQ(get32(b + io + 32), 10);
  CHECK_EQ_U64(get32(b + io + 36), dlrec_crc32c(0, b + hb, g0_bytes));
  CHECK_EQ_U64(get32(b + n - 4), dlrec_crc32c(0, b + io, 16 + 24 * 2));
  CHECK_EQ(get32(b + hb), 0x47524c44u); /* "DLRG" */
  CHECK_EQ(get32(b + hb + 4), 10);
  CHECK_EQ_U64(get64(b + hb + 16), 10); /* C1 nnz */
  CHECK_EQ_U64(get64(b + hb + 24), 30); /* C2 nnz */
  CHECK_EQ_U64(get64(b + hb + 32), g[0].nnz[2]);
  /* Sections in order, each 64-aligned: labels right after the 64-byte group
   * header (16 + 4 * 8 bytes), then dense. */
  CHECK(memcmp(b + hb + 64, g[0].labels, 40) == 0);
  CHECK(memcmp(b + hb + 128, g[0].dense, 120) == 0);
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open_buffer(&f, b, n, "layout"));
  for (uint32_t i = 0; i < 2; i++) {
    dlrec_rowgroup rg;
    CHECK_OK(dlrec_dlr_row_group(f, i, &rg));
    CHECK(((const unsigned char *)rg.labels - b) % 64 == 0);
    CHECK(((const unsigned char *)rg.dense - b) % 64 == 0);
    for (uint32_t c = 0; c < 4; c++) {
      CHECK(((const unsigned char *)rg.ids[c] - b) % 64 == 0);
      CHECK(c >= 2 ? ((const unsigned char *)rg.offsets[c] - b) % 64 == 0 : rg.offsets[c] == NULL);
      CHECK(c >= 2 ? (const unsigned char *)rg.offsets[c] < (const unsigned char *)rg.ids[c] : 1);
    }
  }
  dlrec_dlr_close(f);
  CHECK(dlrec_dlr_open_buffer(&f, b + 8, n - 8, "x") == DLREC_ERR_INVALID); /* unaligned */
  free(b);
  free_groups(g, 2);
}

/* ---- the writer's checks ---- */

TEST(writer_rejects_bad_ids_and_stays_usable) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  dlrec_rng r;
  dlrec_rng_seed(&r, 3, 0);
  tgroup g;
  tgroup_make(&g, &s, 20, &r);
  const char *p = test_path("ids.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  dlrec_rowgroup rg = tgroup_view(&g, &s);

  g.ids[0][5] = 100; /* C1 is [0, 100) */
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID,
            "sparse column 'C1': row 5 (file row 5): id 100 is outside the column's range [0, 100)");
  g.ids[0][5] = 0;
  g.ids[1][3 * 7 + 2] = 99; /* C2 is [100, 1100): row 7 */
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "'C2': row 7 (file row 7): id 99");
  g.ids[1][3 * 7 + 2] = 100;
  uint32_t k = g.offsets[3][11]; /* C4's first id at or after row 11 */
  uint32_t row = 11;
  while (g.offsets[3][row + 1] == k) row++;
  g.ids[3][k] = 5000;
  char want[128];
  snprintf(want, sizeof want, "'C4': row %u (file row %u): id 5000", row, row);
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, want);
  g.ids[3][k] = 4999;

  /* Nothing was written: a good group still goes in, and the file reads. */
  CHECK_OK(dlrec_dlr_writer_append(w, &rg));
  CHECK_EQ(dlrec_dlr_writer_rows(w), 20);
  /* The file row in messages counts earlier groups. */
  uint32_t keep = g.ids[0][2];
  g.ids[0][2] = 1000;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "row group 1: sparse column 'C1': row 2 (file row 22)");
  g.ids[0][2] = keep;
  CHECK_OK(dlrec_dlr_writer_finish(w));
  dlrec_dlr *f;
  CHECK_OK(dlrec_dlr_open(&f, p));
  CHECK_EQ(dlrec_dlr_row_groups(f), 1);
  CHECK(compare_file(f, &s, &g, 1));
  dlrec_dlr_close(f);
  tgroup_free(&g);
}

TEST(writer_rejects_bad_offsets_and_shapes) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  dlrec_rng r;
  dlrec_rng_seed(&r, 4, 0);
  tgroup g;
  tgroup_make(&g, &s, 10, &r);
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, test_path("off.dlr"), &s));
  dlrec_rowgroup rg = tgroup_view(&g, &s);
  uint32_t saved[11];
  memcpy(saved, g.offsets[2], sizeof saved);

  g.offsets[2][0] = 1;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "'C3': offsets[0] is 1, must be 0");
  memcpy(g.offsets[2], saved, sizeof saved);
  g.offsets[2][4] = g.offsets[2][3] - 1;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "'C3': row 3 (file row 3): offsets decrease");
  memcpy(g.offsets[2], saved, sizeof saved);
  for (int i = 7; i <= 10; i++) g.offsets[2][i] += 4; /* row 6 gets 4 more ids: 5 or more */
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "'C3': row 6 (file row 6):");
  CHECK(strstr(dlrec_last_error(), "max hotness 4"));
  memcpy(g.offsets[2], saved, sizeof saved);

  rg.offsets[2] = NULL;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "'C3' has variable hotness but no offsets");
  rg = tgroup_view(&g, &s);
  rg.labels = NULL;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "no labels");
  rg = tgroup_view(&g, &s);
  rg.rows = 0;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "0 rows");
  rg.rows = DLREC_DLR_MAX_GROUP_ROWS + 1;
  CHECK_ERR(dlrec_dlr_writer_append(w, &rg), DLREC_ERR_INVALID, "rows (must be 1..");
  dlrec_dlr_writer_abort(w);
  CHECK(access(test_path("off.dlr.tmp"), F_OK) != 0);
  CHECK(access(test_path("off.dlr"), F_OK) != 0);

  /* A bad schema is refused at open, and no file is created. */
  s.sparse[1].id_end = 6000;
  CHECK_ERR(dlrec_dlr_writer_open(&w, test_path("bad.dlr"), &s), DLREC_ERR_INVALID, "'C2'");
  CHECK(access(test_path("bad.dlr.tmp"), F_OK) != 0);
  CHECK_ERR(dlrec_dlr_writer_open(&w, "/nonexistent-dir/x.dlr", &(dlrec_schema){0}), DLREC_ERR_INVALID, "");
  test_schema(&s, 1, 3);
  CHECK_ERR(dlrec_dlr_writer_open(&w, "/nonexistent-dir/x.dlr", &s), DLREC_ERR_IO, "/nonexistent-dir/x.dlr.tmp");
  tgroup_free(&g);
}

/* ---- damage: every byte, every length ---- */

static const char *make_small_file(tgroup *g) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  const uint32_t sizes[] = {9, 4, 17, 5};
  const char *p = test_path("small.dlr");
  if (write_file(p, &s, sizes, 4, 11, g) != DLREC_OK) return NULL;
  return p;
}

/* make_small_file's bytes (*n of them; free() them), its path in *path
 * unless path is NULL; NULL when it cannot be written or read. */
static unsigned char *small_file_bytes(tgroup *g, const char **path, size_t *n) {
  const char *p = make_small_file(g);
  if (path) *path = p;
  return p ? slurp(p, n) : NULL;
}

TEST(every_flipped_byte_is_detected) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  CHECK_OK(open_verify_buffer(b, n));
  unsigned char *c = aligned_alloc(64, (n + 63) & ~(size_t)63);
  for (size_t i = 0; i < n; i++) {
    memcpy(c, b, n);
    c[i] ^= (unsigned char)(1u << (i % 8));
    dlrec_status st = open_verify_buffer(c, n);
    if (st != DLREC_ERR_CORRUPT && st != DLREC_ERR_VERSION) {
      test_fail(__FILE__, __LINE__, "byte %zu of %zu flipped: %s: %s", i, n, dlrec_status_name(st), dlrec_last_error());
      break;
    }
  }
  free(c);
  free(b);
  free_groups(g, 4);
}

TEST(flipped_bytes_name_the_region) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  uint32_t hb = get32(b + 12);
  uint64_t io = get64(b + 48);
  uint64_t g2 = get64(b + io + 16 + 24 * 2), g2_bytes = get64(b + io + 16 + 24 * 2 + 8);
  char want[200];
  const char *q = test_path("flip.dlr");
  dlrec_dlr *f;

  /* Header: a byte of a dense name. */
  b[112 + 48 + 1] ^= 0x20;
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "flip.dlr: header at offset 0: checksum mismatch (stored 0x");
  b[112 + 48 + 1] ^= 0x20;

  /* Row group 2's dense values: open is fine, verify names group and offset. */
  b[g2 + g2_bytes - 200] ^= 0x01;
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_OK(dlrec_dlr_open(&f, q));
  CHECK_OK(dlrec_dlr_verify(f, 1));
  snprintf(want, sizeof want, "flip.dlr: row group 2 at offset %llu: checksum mismatch (stored 0x%08x, computed 0x",
           (unsigned long long)g2, get32(b + io + 16 + 24 * 2 + 20));
  CHECK_ERR(dlrec_dlr_verify(f, 2), DLREC_ERR_CORRUPT, want);
  dlrec_dlr_close(f);
  b[g2 + g2_bytes - 200] ^= 0x01;

  /* Row group 2's header (its nnz): caught at open, by layout. */
  b[g2 + 16] ^= 0x01;
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  snprintf(want, sizeof want, "row group 2 at offset %llu", (unsigned long long)g2);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, want);
  b[g2 + 16] ^= 0x01;

  /* The index: an entry's crc. */
  b[io + 16 + 24 + 20] ^= 0x80;
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  snprintf(want, sizeof want, "flip.dlr: index at offset %llu: checksum mismatch", (unsigned long long)io);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, want);
  b[io + 16 + 24 + 20] ^= 0x80;

  /* Unchanged again: reads. */
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_OK(dlrec_dlr_open(&f, q));
  dlrec_dlr_close(f);
  (void)hb;
  free(b);
  free_groups(g, 4);
}

TEST(truncation_at_every_length) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  for (size_t len = 1; len < n; len++) {
    dlrec_dlr *f = NULL;
    dlrec_status st = dlrec_dlr_open_buffer(&f, b, len, "cut.dlr");
    if (st != DLREC_ERR_CORRUPT || !strstr(dlrec_last_error(), "truncated")) {
      test_fail(__FILE__, __LINE__, "length %zu of %zu: %s: %s", len, n, dlrec_status_name(st), dlrec_last_error());
      dlrec_dlr_close(f);
      break;
    }
  }
  /* Through real files, with the message the spec promises. */
  const char *q = test_path("cut.dlr");
  dlrec_dlr *f;
  CHECK(test_write_file(q, (const char *)b, n - 1) == 0);
  char want[200];
  snprintf(want, sizeof want,
           "cut.dlr: truncated: header says 35 rows in 4 row groups ending at offset %zu, file has %zu bytes", n,
           n - 1);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, want);
  CHECK(test_write_file(q, (const char *)b, 5) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "truncated");
  CHECK(test_write_file(q, "", 0) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "empty file");
  /* Bytes after the index are refused too. */
  unsigned char *longer = calloc(1, n + 64);
  memcpy(longer, b, n);
  CHECK(test_write_file(q, (const char *)longer, n + 7) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "7 unexpected bytes after the index");
  free(longer);
  free(b);
  free_groups(g, 4);
}

/* dlrec_dlr_unfinished (what `train --follow` waits for): every prefix of
 * a finished file is a file still being written or copied in (its first
 * bytes of magic, its fixed fields, its names, its row groups, its index),
 * the whole file is not, and neither is anything whose bytes no writer
 * would leave: text, another magic, a header size that does not fit its
 * columns, a header whose checksum fails. A header that says "not
 * complete" with a good checksum is a writer still at it. */
TEST(unfinished_tells_a_file_being_written_from_a_bad_one) {
  tgroup g[4];
  const char *p;
  size_t n;
  unsigned char *b = small_file_bytes(g, &p, &n);
  CHECK(b != NULL);
  const uint32_t hb = get32(b + 12);
  CHECK(hb > 112 + 8 && hb < n);
  const char *q = test_path("growing.dlr");
  CHECK(dlrec_dlr_unfinished(p) == 0);
  for (size_t len = 0; len < n; len = len < hb + 16 || len + 1 == n ? len + 1 : len + 13 < n ? len + 13 : n - 1) {
    CHECK(test_write_file(q, (const char *)b, len) == 0);
    if (dlrec_dlr_unfinished(q) != 1) {
      test_fail(__FILE__, __LINE__, "a prefix of %zu of %zu bytes is not taken as unfinished", len, n);
      break;
    }
  }
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  /* The fixed fields alone, their header size one that no columns have. */
  unsigned char *c = malloc(n);
  CHECK(c != NULL);
  memcpy(c, b, n);
  put32(c + 12, hb + 64);
  CHECK(test_write_file(q, (const char *)c, 112) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  CHECK(test_write_file(q, (const char *)c, hb - 8) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  /* Not complete: with its checksum a writer's file (whole or cut), with a
   * stale one a damaged file. */
  memcpy(c, b, n);
  put32(c + 16, get32(c + 16) & ~1u);
  CHECK(test_write_file(q, (const char *)c, n) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  put32(c + hb - 4, dlrec_crc32c(0, c, hb - 4));
  CHECK(test_write_file(q, (const char *)c, n) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 1);
  CHECK(test_write_file(q, (const char *)c, hb) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 1);
  /* Another magic, text, a directory, no file. */
  memcpy(c, b, n);
  c[3] ^= 0x01;
  CHECK(test_write_file(q, (const char *)c, 6) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  CHECK(test_write_file(q, (const char *)c, n) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  CHECK(test_write_file(q, "label\tI1\n1\t2\n", (size_t)-1) == 0);
  CHECK(dlrec_dlr_unfinished(q) == 0);
  CHECK(dlrec_dlr_unfinished(test_path("")) == 0);
  CHECK(dlrec_dlr_unfinished(test_path("no-such.dlr")) == 0);
  free(c);
  free(b);
  free_groups(g, 4);
}

TEST(wrong_magic_and_future_version) {
  const char *q = test_path("text.dlr");
  dlrec_dlr *f;
  CHECK(test_write_file(q, "label\tI1\tI2\n1\t2\t3\n", (size_t)-1) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "text.dlr: not a .dlr file");
  CHECK_ERR(dlrec_dlr_open(&f, test_path("missing.dlr")), DLREC_ERR_IO, "missing.dlr");
  CHECK_ERR(dlrec_dlr_open(&f, test_tmpdir()), DLREC_ERR_IO, "not a regular file");

  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  uint32_t hb = get32(b + 12);
  /* A newer version with a valid checksum, and one whose header changed
   * shape entirely: both say "version", not "corrupt". */
  put32(b + 8, 2);
  put32(b + hb - 4, dlrec_crc32c(0, b, hb - 4));
  q = test_path("future.dlr");
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_VERSION,
            "future.dlr: .dlr format version 2; this build of dlrec reads version 1");
  memset(b + 12, 0xff, 40);
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_VERSION, "version 2");
  put32(b + 8, 0);
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, q), DLREC_ERR_CORRUPT, "version 0");
  free(b);
  free_groups(g, 4);
}

TEST(tmp_of_unfinished_writer_is_not_a_file) {
  dlrec_schema s;
  test_schema(&s, 1, 3);
  dlrec_rng r;
  dlrec_rng_seed(&r, 5, 0);
  tgroup g;
  tgroup_make(&g, &s, 50, &r);
  const char *p = test_path("run.dlr");
  dlrec_dlr_writer *w;
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  dlrec_rowgroup rg = tgroup_view(&g, &s);
  CHECK_OK(dlrec_dlr_writer_append(w, &rg));
  CHECK_OK(dlrec_dlr_writer_append(w, &rg));
  /* While the writer runs (or after it crashed), PATH does not exist and
   * PATH.tmp is refused as incomplete. A copy stands for the crash. */
  dlrec_dlr *f;
  CHECK_ERR(dlrec_dlr_open(&f, p), DLREC_ERR_IO, "run.dlr");
  char tmp[2048];
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  CHECK_ERR(dlrec_dlr_open(&f, tmp), DLREC_ERR_CORRUPT, "incomplete file");
  size_t n;
  unsigned char *b = slurp(tmp, &n);
  CHECK(b != NULL);
  const char *crashed = test_path("crashed.dlr");
  CHECK(test_write_file(crashed, (const char *)b, n) == 0);
  CHECK_ERR(dlrec_dlr_open(&f, crashed), DLREC_ERR_CORRUPT, "crashed.dlr: incomplete file: its writer did not finish");
  free(b);
  dlrec_dlr_writer_abort(w);
  CHECK(access(tmp, F_OK) != 0);
  CHECK(access(p, F_OK) != 0);

  /* A new writer replaces a stale .tmp and produces a good file. */
  CHECK(test_write_file(tmp, "stale", 5) == 0);
  CHECK_OK(dlrec_dlr_writer_open(&w, p, &s));
  CHECK_OK(dlrec_dlr_writer_append(w, &rg));
  CHECK_OK(dlrec_dlr_writer_finish(w));
  CHECK(access(tmp, F_OK) != 0);
  CHECK_OK(dlrec_dlr_open(&f, p));
  CHECK(compare_file(f, &s, &g, 1));
  dlrec_dlr_close(f);
  tgroup_free(&g);
}

/* A writer bug (or a forged checksum) that passes the CRC is still caught by
 * verify's id and offset checks. */
TEST(verify_checks_ids_and_offsets_behind_a_good_crc) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  uint64_t io = get64(b + 48);
  unsigned char *c = aligned_alloc(64, (n + 63) & ~(size_t)63);
  for (int kind = 0; kind < 2; kind++) {
    memcpy(c, b, n);
    dlrec_dlr *f;
    CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
    dlrec_rowgroup rg;
    CHECK_OK(dlrec_dlr_row_group(f, 1, &rg));
    dlrec_dlr_close(f);
    unsigned char *at;
    if (kind == 0)
      at = (unsigned char *)(rg.ids[1] + 3 * 2 + 1); /* C2 row 2 */
    else
      at = (unsigned char *)(rg.offsets[2] + 2); /* C3 offsets[2] */
    put32(at, kind == 0 ? 7u : 0u);
    uint64_t e = io + 16 + 24;
    uint64_t off = get64(c + e), bytes = get64(c + e + 8);
    put32(c + e + 20, dlrec_crc32c(0, c + off, bytes));
    put32(c + n - 4, dlrec_crc32c(0, c + io, n - 4 - io));
    CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
    char want[200];
    if (kind == 0)
      snprintf(want, sizeof want,
               "row group 1 at offset %llu: sparse column 'C2': row 2 (file row 11) at offset %llu: id 7",
               (unsigned long long)off, (unsigned long long)(at - c));
    else
      snprintf(want, sizeof want, "row group 1 at offset %llu: sparse column 'C3': row 1 (file row 10)",
               (unsigned long long)off);
    CHECK_ERR(dlrec_dlr_verify(f, 1), DLREC_ERR_CORRUPT, want);
    if (kind == 1)
      CHECK_ERR(dlrec_dlr_check_offsets(f, 1), DLREC_ERR_CORRUPT, "'C3': row 1");
    else
      CHECK_OK(dlrec_dlr_check_offsets(f, 1));
    dlrec_dlr_close(f);
  }
  free(c);
  free(b);
  free_groups(g, 4);
}

/* Puts v at `at` (inside row group `group` of the buffer c of n bytes) and
 * recomputes the group's and the index's checksums, as a buggy writer would
 * have written them. */
static void forge32(unsigned char *c, size_t n, uint32_t group, unsigned char *at, uint32_t v) {
  uint64_t io = get64(c + 48), e = io + 16 + 24ull * group;
  put32(at, v);
  put32(c + e + 20, dlrec_crc32c(0, c + get64(c + e), get64(c + e + 8)));
  put32(c + n - 4, dlrec_crc32c(0, c + io, n - 4 - io));
}

/* The edges of verify's checks behind a good CRC: an id equal to its
 * column's id_end is outside the half-open range, and offsets that end short
 * of or past the group header's id count are refused even when every row's
 * count is within max hotness. */
TEST(verify_refuses_id_end_and_offsets_not_ending_at_nnz) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  unsigned char *c = aligned_alloc(64, (n + 63) & ~(size_t)63);
  dlrec_dlr *f;
  dlrec_rowgroup rg;
  char want[300];

  /* C2's range is [100, 1100): 1100 itself is out. */
  memcpy(c, b, n);
  CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
  CHECK_OK(dlrec_dlr_row_group(f, 1, &rg));
  dlrec_dlr_close(f);
  unsigned char *at = (unsigned char *)(rg.ids[1] + 3 * 2 + 1); /* C2 row 2 */
  forge32(c, n, 1, at, 1100);
  CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
  snprintf(want, sizeof want, "sparse column 'C2': row 2 (file row 11) at offset %llu: id 1100 is outside the "
           "column's range [100, 1100)", (unsigned long long)(at - c));
  CHECK_ERR(dlrec_dlr_verify(f, 1), DLREC_ERR_CORRUPT, want);
  dlrec_dlr_close(f);
  /* 1099, the last id inside, passes. */
  forge32(c, n, 1, at, 1099);
  CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
  CHECK_OK(dlrec_dlr_verify(f, 1));
  dlrec_dlr_close(f);

  /* C3's last offset one off its nnz, in either direction, with the last
   * row's count still in 0..max hotness (4). */
  for (int dir = 0; dir < 2; dir++) {
    memcpy(c, b, n);
    CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
    CHECK_OK(dlrec_dlr_row_group(f, 1, &rg));
    dlrec_dlr_close(f);
    uint32_t rows = rg.rows, last = rg.offsets[2][rows], count = last - rg.offsets[2][rows - 1];
    uint32_t v = dir == 0 ? last - 1 : last + 1;
    if (dir == 0 ? count < 1 : count >= 4) continue; /* that direction would also break the per-row check */
    at = (unsigned char *)(rg.offsets[2] + rows);
    forge32(c, n, 1, at, v);
    CHECK_OK(dlrec_dlr_open_buffer(&f, c, n, "forged.dlr"));
    snprintf(want, sizeof want, "sparse column 'C3': offsets at offset %llu end at %u, the group header says %u ids",
             (unsigned long long)((const unsigned char *)rg.offsets[2] - c), v, last);
    CHECK_ERR(dlrec_dlr_check_offsets(f, 1), DLREC_ERR_CORRUPT, want);
    CHECK_ERR(dlrec_dlr_verify(f, 1), DLREC_ERR_CORRUPT, want);
    dlrec_dlr_close(f);
  }
  free(c);
  free(b);
  free_groups(g, 4);
}

/* A row group of 0 rows is refused at open (the spec says 1 <= rows), even
 * one whose header, sections and checksums are otherwise consistent: here
 * appended to a good file as group 4, with the 0-row layout of docs/formats.md
 * (GH = 64; the variable columns C3 and C4 hold one offset each, at 64 and
 * 128; 192 bytes in all). */
TEST(zero_row_group_is_refused) {
  tgroup g[4];
  size_t n;
  unsigned char *b = small_file_bytes(g, NULL, &n);
  CHECK(b != NULL);
  uint32_t hb = get32(b + 12);
  uint64_t io = get64(b + 48), groups = get64(b + 40);
  CHECK_EQ_U64(groups, 4);
  const uint64_t zb = 192;
  size_t m = n + zb + 24;
  unsigned char *c = aligned_alloc(64, (m + 63) & ~(size_t)63);
  memset(c, 0, m);
  memcpy(c, b, io);
  unsigned char *z = c + io;
  put32(z, 0x47524c44u); /* "DLRG" */
  put32(z + 8, 4);       /* rows 0, number 4, every nnz 0, every offset 0 */
  uint64_t io2 = io + zb;
  memcpy(c + io2, b + io, 16 + 24 * groups);
  unsigned char *e = c + io2 + 16 + 24 * groups;
  memcpy(e, &io, 8);
  memcpy(e + 8, &zb, 8);
  put32(e + 20, dlrec_crc32c(0, z, zb));
  groups++;
  memcpy(c + io2 + 8, &groups, 8);
  put32(c + m - 4, dlrec_crc32c(0, c + io2, m - 4 - io2));
  memcpy(c + 40, &groups, 8);
  memcpy(c + 48, &io2, 8);
  put32(c + hb - 4, dlrec_crc32c(0, c, hb - 4));
  dlrec_dlr *f;
  char want[200];
  snprintf(want, sizeof want, "forged.dlr: row group 4 at offset %llu: 0 rows (must be 1..", (unsigned long long)io);
  CHECK_ERR(dlrec_dlr_open_buffer(&f, c, m, "forged.dlr"), DLREC_ERR_CORRUPT, want);
  free(c);
  free(b);
  free_groups(g, 4);
}

/* ---- dlrec inspect ---- */

TEST(inspect_prints_schema_groups_head_and_verifies) {
  tgroup g[4];
  const char *p = make_small_file(g);
  CHECK(p != NULL);
  char *out = NULL;
  int rc = test_run_cli(&out, "inspect -q '%s'", p);
  CHECK(out != NULL);
  if (rc != 0 || !strstr(out, "rows      35 in 4 row groups") || !strstr(out, "click") || !strstr(out, "I3") ||
      !strstr(out, "C3") || !strstr(out, "variable, max 4") || !strstr(out, "[1100, 1200)") ||
      !strstr(out, "4 row groups verified")) {
    test_fail(__FILE__, __LINE__, "rc %d, output:\n%s", rc, out);
    free(out);
    return;
  }
  free(out);

  rc = test_run_cli(&out, "inspect -q '%s' --groups --head 2", p);
  char line[200];
  snprintf(line, sizeof line, "C1 %u", g[0].ids[0][1]);
  if (rc != 0 || !strstr(out, "group") || !strstr(out, "row 1:") || !strstr(out, line)) {
    test_fail(__FILE__, __LINE__, "rc %d, output:\n%s", rc, out);
    free(out);
    return;
  }
  free(out);

  rc = test_run_cli(&out, "inspect -q --json '%s' --head 1", p);
  CHECK_EQ(rc, 0);
  cJSON *j = cJSON_Parse(out);
  free(out);
  CHECK(j != NULL);
  CHECK_EQ(cJSON_GetObjectItem(j, "rows")->valuedouble, 35);
  CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "ok")));
  CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(j, "row_groups")), 4);
  CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(j, "sparse")), 4);
  cJSON_Delete(j);

  /* Corrupt group 1: exit 1, naming the group and its offset. */
  size_t n;
  unsigned char *b = slurp(p, &n);
  uint64_t io = get64(b + 48), off = get64(b + io + 16 + 24);
  b[off + 100] ^= 4;
  const char *q = test_path("bad.dlr");
  CHECK(test_write_file(q, (const char *)b, n) == 0);
  free(b);
  rc = test_run_cli(&out, "inspect -q '%s'", q);
  snprintf(line, sizeof line, "row group 1 at offset %llu: checksum mismatch", (unsigned long long)off);
  if (rc != 1 || !strstr(out, line)) test_fail(__FILE__, __LINE__, "rc %d, output:\n%s", rc, out);
  free(out);
  rc = test_run_cli(&out, "inspect -q --json '%s'", q);
  CHECK_EQ(rc, 1);
  j = cJSON_Parse(out);
  free(out);
  CHECK(j != NULL);
  CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "ok")));
  cJSON_Delete(j);

  CHECK_EQ(test_run_cli(NULL, "inspect"), 2);
  CHECK_EQ(test_run_cli(NULL, "inspect '%s' --head x", p), 2);
  CHECK_EQ(test_run_cli(NULL, "inspect '%s' --bogus", p), 2);
  CHECK_EQ(test_run_cli(NULL, "inspect '%s' '%s'", p, p), 2);
  CHECK_EQ(test_run_cli(NULL, "inspect --help"), 0);
  CHECK_EQ(test_run_cli(NULL, "inspect '%s'", test_path("missing.dlr")), 1);
  free_groups(g, 4);
}
