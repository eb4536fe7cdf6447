/* A small test harness: TEST(name) functions registered at load time, CHECK
 * macros that print both values, and helpers for temp files and running the
 * CLI. Each test executable prints "N passed, N failed" and exits non-zero
 * on any failure. `./test_x NAME` runs only the tests whose name contains NAME.
 */
#ifndef DLREC_TEST_H
#define DLREC_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"

/* TEST_ASAN: defined in a build with AddressSanitizer (clang's
 * __has_feature, gcc's __SANITIZE_ADDRESS__). */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TEST_ASAN)
#define TEST_ASAN 1
#endif

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int test_failed_now(void); /* the current test has failed */

#define TEST(name)                                                          \
  static void test_##name(void);                                            \
  __attribute__((constructor)) static void test_register_##name(void) {     \
    test_register(#name, test_##name);                                      \
  }                                                                         \
  static void test_##name(void)

/* Each CHECK reports and returns from the test on failure. */
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond);                    \
      return;                                                               \
    }                                                                       \
  } while (0)

#define CHECK_EQ(a, b)                                                      \
  do {                                                                      \
    long long va_ = (long long)(a), vb_ = (long long)(b);                   \
    if (va_ != vb_) {                                                       \
      test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b, va_, vb_); \
      return;                                                               \
    }                                                                       \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                  \
  do {                                                                      \
    uint64_t va_ = (uint64_t)(a), vb_ = (uint64_t)(b);                      \
    if (va_ != vb_) {                                                       \
      test_fail(__FILE__, __LINE__, "%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, va_, vb_); \
      return;                                                               \
    }                                                                       \
  } while (0)

#define CHECK_STR(a, b)                                                     \
  do {                                                                      \
    const char *va_ = (a), *vb_ = (b);                                      \
    if (strcmp(va_, vb_) != 0) {                                            \
      test_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b, va_, vb_); \
      return;                                                               \
    }                                                                       \
  } while (0)

/* |a - b| <= atol + rtol * |b|, with b the reference. */
#define CHECK_NEAR(a, b, atol, rtol)                                        \
  do {                                                                      \
    double va_ = (double)(a), vb_ = (double)(b);                            \
    if (!(fabs(va_ - vb_) <= (atol) + (rtol) * fabs(vb_))) {                \
      test_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g", #a, #b, va_, vb_); \
      return;                                                               \
    }                                                                       \
  } while (0)

/* The expression must return DLREC_OK; otherwise prints dlrec_last_error(). */
#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    dlrec_status st_ = (expr);                                              \
    if (st_ != DLREC_OK) {                                                  \
      test_fail(__FILE__, __LINE__, "%s: %s: %s", #expr, dlrec_status_name(st_), dlrec_last_error()); \
      return;                                                               \
    }                                                                       \
  } while (0)

/* The expression must fail with status `want` and a message containing `substr`. */
#define CHECK_ERR(expr, want, substr)                                       \
  do {                                                                      \
    dlrec_status st_ = (expr);                                              \
    if (st_ != (want) || !strstr(dlrec_last_error(), (substr))) {           \
      test_fail(__FILE__, __LINE__, "%s: expected %s containing \"%s\", got %s: \"%s\"", #expr, \
                dlrec_status_name(want), (substr), dlrec_status_name(st_), dlrec_last_error()); \
      return;                                                               \
    }                                                                       \
  } while (0)

/* A fresh directory for this test under $DLREC_TEST_TMP (or /tmp); the
 * returned string is static per test. */
const char *test_tmpdir(void);
/* tmpdir/name into a static rotating buffer. */
const char *test_path(const char *name);
/* Writes n bytes (or strlen when n == (size_t)-1) to path; 0 on success. */
int test_write_file(const char *path, const char *data, size_t n);
/* Runs the dlrec CLI ($DLREC_BIN) with args through sh; captures stdout and
 * stderr together into *out (malloc'd, may be NULL) and returns the exit code. */
int test_run_cli(char **out, const char *args_fmt, ...) __attribute__((format(printf, 2, 3)));
/* $DLREC_SOURCE_DIR/rel */
const char *test_source_path(const char *rel);

/* A growable byte string, NUL-terminated after its n bytes, for building
 * request bodies; zero-initialized is empty. Aborts when out of memory (a
 * test cannot go on). */
typedef struct test_buf {
  char *p;
  size_t n, cap;
} test_buf;
void test_buf_put(test_buf *b, const void *d, size_t n);
void test_buf_printf(test_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void test_buf_free(test_buf *b); /* back to empty */

#endif
