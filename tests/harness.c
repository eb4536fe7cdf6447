/* The test harness behind test.h. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

#define MAX_TESTS 512

static struct {
  const char *name;
  test_fn fn;
} tests[MAX_TESTS];
static int n_tests;
static int current_failed;
static const char *current_name = "";
static char current_dir[1024];

void test_register(const char *name, test_fn fn) {
  if (n_tests < MAX_TESTS) {
    tests[n_tests].name = name;
    tests[n_tests++].fn = fn;
  }
}

void test_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "FAIL %s (%s:%d): ", current_name, file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  current_failed = 1;
}

int test_failed_now(void) { return current_failed; }

static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (!d) {
    unlink(path);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[2048];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    struct stat st;
    if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(sub);
    else unlink(sub);
  }
  closedir(d);
  rmdir(path);
}

const char *test_tmpdir(void) {
  if (current_dir[0]) return current_dir;
  const char *base = getenv("DLREC_TEST_TMP");
  if (!base) base = "/tmp/dlrec-test";
  mkdir(base, 0755);
  snprintf(current_dir, sizeof current_dir, "%s/%s.%d", base, current_name, (int)getpid());
  remove_tree(current_dir);
  if (mkdir(current_dir, 0755) != 0) {
    fprintf(stderr, "cannot create %s: %s\n", current_dir, strerror(errno));
    exit(2);
  }
  return current_dir;
}

const char *test_path(const char *name) {
  static char bufs[8][2048];
  static int next;
  char *b = bufs[next++ & 7];
  snprintf(b, 2048, "%s/%s", test_tmpdir(), name);
  return b;
}

int test_write_file(const char *path, const char *data, size_t n) {
  if (n == (size_t)-1) n = strlen(data);
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(data, 1, n, f);
  return (fclose(f) != 0 || w != n) ? -1 : 0;
}

const char *test_source_path(const char *rel) {
  static char buf[2048];
  const char *src = getenv("DLREC_SOURCE_DIR");
  snprintf(buf, sizeof buf, "%s/%s", src ? src : ".", rel);
  return buf;
}

int test_run_cli(char **out, const char *args_fmt, ...) {
  const char *bin = getenv("DLREC_BIN");
  if (!bin) bin = "./dlrec";
  char args[8192], cmd[9000];
  va_list ap;
  va_start(ap, args_fmt);
  vsnprintf(args, sizeof args, args_fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", bin, args);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t r;
  while (buf && (r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += r;
    if (cap - n < 1024) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) break;
      buf = nb;
      cap *= 2;
    }
  }
  if (buf) buf[n] = '\0';
  int status = pclose(p);
  if (out) *out = buf;
  else free(buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int main(int argc, char **argv) {
  int passed = 0, failed = 0;
  for (int i = 0; i < n_tests; i++) {
    if (argc > 1 && !strstr(tests[i].name, argv[1])) continue;
    current_name = tests[i].name;
    current_failed = 0;
    current_dir[0] = '\0';
    dlrec_clear_error();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tests[i].fn();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (current_failed) {
      failed++;
    } else {
      passed++;
      if (current_dir[0]) remove_tree(current_dir); /* kept on failure, for a look */
      fprintf(stderr, "ok   %s (%.1f s)\n", current_name, secs);
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

/* Room for `more` bytes and the NUL after b->n. */
static void test_buf_reserve(test_buf *b, size_t more) {
  if (b->n + more + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->n + more + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) abort();
  b->p = p;
  b->cap = cap;
}

void test_buf_put(test_buf *b, const void *d, size_t n) {
  test_buf_reserve(b, n);
  if (n) memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
}

void test_buf_printf(test_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) abort();
  test_buf_reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

void test_buf_free(test_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}
