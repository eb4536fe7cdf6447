/* The pieces under checkpoints, in-process: tensor files (a grown file is
 * refused; the whole-file checksum covers the padding the arrays' own
 * checksums miss) and the run directory's lock. */
#include <sys/stat.h>
#include <unistd.h>

#include "dlrec/crc32c.h"
#include "dlrec/fsutil.h"
#include "test.h"
#include "train/tensor_file.h"

/* The CRC32C of a whole file, read here: the reference for what the tensor
 * file functions report. */
static uint32_t crc_of_file(const char *path) {
  char *text;
  size_t n;
  if (dlrec_read_file(path, 1u << 26, &text, &n) != DLREC_OK) return 0;
  uint32_t crc = dlrec_crc32c(0, text, n);
  free(text);
  return crc;
}

static int flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return 0;
  int c = fseek(f, offset, SEEK_SET) == 0 ? fgetc(f) : EOF;
  int ok = c != EOF && fseek(f, offset, SEEK_SET) == 0 && fputc(c ^ 0x40, f) != EOF;
  return fclose(f) == 0 && ok;
}

/* Two arrays whose byte counts are not multiples of 64, so that the file has
 * padding after each. */
TEST(tensor_file_checksum_covers_every_byte) {
  float a[3] = {1.5f, -2.0f, 3.25f};
  uint32_t b[5] = {1, 2, 3, 4, 5};
  tensor_desc w[2] = {{"a", TENSOR_F32, 3, a}, {"b", TENSOR_U32, 5, b}};
  const char *path = test_path("t.bin");
  uint32_t wrote = 0, read = 0;
  CHECK_OK(tensor_file_write(path, w, 2, &wrote));
  CHECK_EQ_U64(wrote, crc_of_file(path));
  /* Header 32 + table 128 = 160: a at 192, b at 256, the file ends at 320. */
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK_EQ(st.st_size, 320);
  float ra[3];
  uint32_t rb[5];
  tensor_desc r[2] = {{"b", TENSOR_U32, 5, rb}, {"a", TENSOR_F32, 3, ra}}; /* any order */
  CHECK_OK(tensor_file_read(path, r, 2, &read));
  CHECK_EQ_U64(read, wrote);
  CHECK(memcmp(ra, a, sizeof a) == 0 && memcmp(rb, b, sizeof b) == 0);
  /* A flip in the padding after a (bytes 204..256) and after the last array
   * (276..320): the arrays read fine, the whole-file checksum changes. */
  const long pads[] = {210, 319};
  for (int i = 0; i < 2; i++) {
    CHECK(flip_byte(path, pads[i]));
    CHECK_OK(tensor_file_read(path, r, 2, &read));
    CHECK_EQ_U64(read, crc_of_file(path));
    CHECK(read != wrote);
    CHECK(flip_byte(path, pads[i]));
  }
  CHECK_OK(tensor_file_read(path, r, 2, &read));
  CHECK_EQ_U64(read, wrote);
}

TEST(tensor_file_that_has_grown_is_refused) {
  float a[16] = {0};
  tensor_desc w = {"a", TENSOR_F32, 16, a};
  const char *path = test_path("t.bin");
  uint32_t crc;
  CHECK_OK(tensor_file_write(path, &w, 1, &crc));
  FILE *f = fopen(path, "ab");
  CHECK(f);
  fputs("extra bytes", f);
  fclose(f);
  CHECK_ERR(tensor_file_read(path, &w, 1, &crc), DLREC_ERR_CORRUPT, "t.bin: truncated or extended");
}

TEST(lock_dir_refuses_a_second_holder_naming_the_pid) {
  const char *dir = test_tmpdir();
  int a = -1, b = -1;
  CHECK_OK(dlrec_lock_dir(dir, "a test", &a));
  CHECK(a >= 0);
  /* flock conflicts between two open files even within one process. */
  char want[64];
  snprintf(want, sizeof want, "in use by a test (pid %ld,", (long)getpid());
  CHECK_ERR(dlrec_lock_dir(dir, "a test", &b), DLREC_ERR_INVALID, want);
  CHECK_EQ(b, -1);
  dlrec_unlock_dir(a);
  CHECK_OK(dlrec_lock_dir(dir, "a test", &b));
  dlrec_unlock_dir(b);
}
