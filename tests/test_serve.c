/* `dlrec serve` end to end: a real server process on loopback, spoken to
 * over HTTP/1.1 by a small client in this file.
 *
 * A fixture, built once per run and shared by the tests (they run in file
 * order and build on each other): synthetic rows, ETL, a 5-step training run
 * RUN, reference scores of 48 raw rows from `dlrec predict`, and
 * `dlrec serve --model RUN --watch --model-control explicit` as a child
 * process (some tests start servers of their own with other options). The
 * tests check:
 *   01  the endpoints, 404s and 405s;
 *   02  served scores bitwise equal to predict's: raw rows in JSON (nested,
 *       flat, one per request, 7 per request, dense values as text with
 *       missing ones), the request id echoed;
 *   03  the same with binary tensors in and out;
 *   04  the HugeCTR convention (DES, CATCOLUMN, ROWINDEX), JSON and binary;
 *   05  hostile requests (each a 4xx with a JSON error, the server fine
 *       after it), bodies over the limit, max-batch, slow clients;
 *   05b keep-alive connections and Expect: 100-continue;
 *   05c control bytes in the path (%00, a raw NUL) are 400s;
 *   05d ambiguous framing headers are 400s, an unknown Transfer-Encoding 501;
 *   05e slowloris: slow clients are cut off (408) and shed, probes answered;
 *   06  the repository endpoints (index, unload, load);
 *   06b model control off by default (403), and its token (401);
 *   06c concurrent loads of one checkpoint share one load (the registry);
 *   07  hot reload under 8 concurrent clients, by `train --resume` and then
 *       by RUN/latest flipping between versions: no response mixes versions;
 *   08  a corrupt checkpoint is refused and the old model keeps serving;
 *   09  the Prometheus counters match what the clients saw;
 *   09b a reload to a checkpoint of another architecture;
 *   10  SIGTERM drains: requests in flight are answered, new connections
 *       refused, an idle connection closed, then a clean exit.
 * A second fixture (CSV rows with a multi-hot column, with and without a
 * dense column) serves each model type from servers of its own:
 *   11  every registered model type scores bitwise as `dlrec predict`, raw
 *       rows and HugeCTR requests, and its metadata names its type;
 *   12  categorical-only models (the dlrm_categorical, lr and fm examples)
 *       take requests without dense input;
 *   13  hot reload dlrm -> fm -> lr -> dlrm under two clients: no error, no
 *       response mixing models.
 * The server is killed at exit whatever happens, so a failing test never
 * leaves a process behind; the fixture's directory (with the server's log)
 * is kept when a test failed.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "data/etl.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "core/log.h"
#include "serve/serve_internal.h"
#include "test.h"

#define ND 13
#define NC 26
#define NF (ND + NC)
#define N_FULL 40 /* rows with every dense value present: sent as FP32 */
#define N_MISS 8  /* rows with missing dense values: sent as BYTES ("" = missing) */
#define N_ALL (N_FULL + N_MISS)
#define MAX_FIELD 32
#define MAX_SCORES 1024
#define MAX_BODY 200000 /* --max-body-bytes */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the fixture ---- */

static struct {
  int state; /* 0: not built, 1: ready, -1: failed */
  char bin[1024];
  char dir[1024];
  char run[1100];
  char field[N_ALL][NF][MAX_FIELD]; /* the rows' raw fields, label dropped */
  float ref5[N_ALL], ref10[N_ALL];  /* predict's scores of each version */
  const float *ref;                 /* the served version's */
  char version[16];                 /* the version the server should serve */
  pid_t pid;
  int port;
  int any_failed;
  int talk_port;  /* when not 0, the client talks to this port (a test's own server) */
  pid_t extra[4]; /* servers of single tests, killed at exit */
} fx;

/* Infer responses this process received, by the status classes of
 * /metrics: 2xx, 400, 404, 413, 503, other. */
static const char *const status_class_names[6] = {"2xx", "400", "404", "413", "503", "other"};
static atomic_ullong n_infer[6], n_infer_all;

static void count_infer(int status) {
  int k = status >= 200 && status < 300 ? 0 : status == 400 ? 1 : status == 404 ? 2 : status == 413 ? 3
          : status == 503 ? 4 : 5;
  atomic_fetch_add(&n_infer[k], 1);
  atomic_fetch_add(&n_infer_all, 1);
}

static const char *fxp(const char *name) {
  static char bufs[8][1400];
  static int next;
  char *b = bufs[next++ & 7];
  snprintf(b, sizeof bufs[0], "%s/%s", fx.dir, name);
  return b;
}

/* Runs the CLI; on failure prints what it said. */
static int cli(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int cli(const char *fmt, ...) {
  char args[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  char *out = NULL;
  int rc = test_run_cli(&out, "%s", args);
  if (rc != 0) fprintf(stderr, "dlrec %s -> %d:\n%s\n", args, rc, out ? out : "");
  free(out);
  return rc;
}

static const char *log_tail(const char *name);

/* The last bytes of the server's log, for failure messages. */
static const char *server_log_tail(void) { return log_tail("serve.log"); }

static void kill_server(void) {
  if (fx.pid > 0) {
    kill(fx.pid, SIGKILL);
    waitpid(fx.pid, NULL, 0);
    fx.pid = 0;
  }
}

static void at_exit(void) {
  kill_server();
  for (int i = 0; i < 4; i++)
    if (fx.extra[i] > 0) {
      kill(fx.extra[i], SIGKILL);
      waitpid(fx.extra[i], NULL, 0);
    }
  if (fx.dir[0] && !fx.any_failed) dlrec_remove_tree(fx.dir); /* kept on failure, for a look */
}

/* Reads n scores ("%.9g" lines) of a predict output. */
static int read_scores(const char *path, float *out, int n) {
  char *text;
  size_t len;
  if (dlrec_read_file(path, 1u << 20, &text, &len) != DLREC_OK) {
    fprintf(stderr, "%s\n", dlrec_last_error());
    return 0;
  }
  char *p = text;
  int i = 0;
  for (; i < n; i++) {
    char *end;
    out[i] = strtof(p, &end);
    if (end == p || *end != '\n') break;
    p = end + 1;
  }
  int ok = i == n && *p == 0;
  if (!ok) fprintf(stderr, "%s: expected %d scores, read %d\n", path, n, i);
  free(text);
  return ok;
}

/* Splits a click-log line into fields; 0 when it is not 40 fields. */
static int split_line(char *line, char **f) {
  int n = 0;
  for (char *p = line;; p++) {
    if (n == 40) return 0;
    f[n++] = p;
    p = strchr(p, '\t');
    if (!p) break;
    *p = 0;
  }
  char *nl = strchr(f[n - 1], '\n');
  if (nl) *nl = 0;
  return n == 40;
}

/* An integer that FP32 holds exactly. */
static int small_int(const char *s) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  return *s && !*end && !errno && v >= -(1LL << 24) && v <= (1LL << 24);
}

/* Picks N_FULL rows with all dense values present and N_MISS with some
 * missing, writes them without labels to rows.tsv. */
static int pick_rows(void) {
  FILE *in = fopen(fxp("clicks.tsv"), "r");
  if (!in) return 0;
  char line[4096];
  int full = 0, miss = 0;
  while ((full < N_FULL || miss < N_MISS) && fgets(line, sizeof line, in)) {
    char *f[40];
    if (!split_line(line, f)) continue;
    int all = 1, ok = 1;
    for (int d = 1; d <= ND; d++) {
      if (!*f[d]) all = 0;
      else if (!small_int(f[d])) ok = 0;
    }
    for (int k = 1; k < 40; k++)
      if (strlen(f[k]) >= MAX_FIELD) ok = 0;
    if (!ok) continue;
    int row;
    if (all && full < N_FULL) row = full++;
    else if (!all && miss < N_MISS) row = N_FULL + miss++;
    else continue;
    for (int k = 0; k < NF; k++) snprintf(fx.field[row][k], MAX_FIELD, "%s", f[k + 1]);
  }
  fclose(in);
  if (full < N_FULL || miss < N_MISS) {
    fprintf(stderr, "clicks.tsv: only %d rows with all dense values and %d with missing ones\n", full, miss);
    return 0;
  }
  FILE *out = fopen(fxp("rows.tsv"), "w");
  if (!out) return 0;
  for (int r = 0; r < N_ALL; r++)
    for (int k = 0; k < NF; k++) fprintf(out, "%s%c", fx.field[r][k], k + 1 < NF ? '\t' : '\n');
  return fclose(out) == 0;
}

/* The last bytes of a log file, for failure messages. */
static const char *log_tail(const char *name) {
  static char tail[4096];
  tail[0] = 0;
  FILE *f = fopen(fxp(name), "rb");
  if (!f) return "(no log)";
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, n > (long)sizeof tail - 1 ? n - (long)sizeof tail + 1 : 0, SEEK_SET);
  size_t r = fread(tail, 1, sizeof tail - 1, f);
  tail[r] = 0;
  fclose(f);
  return tail;
}

/* Starts `dlrec serve --model RUN --port 0` with the NULL-terminated extra
 * arguments, its output in the fixture's file `log`, and waits until it
 * listens: 1 with *pid and *port, or 0 (reported). RUN is fx.run unless
 * serve_run names another run. */
static const char *serve_run;
static int spawn_server(const char *log, const char *const *extra, pid_t *pid_out, int *port_out) {
  char portfile[1400], logfile[1400];
  snprintf(portfile, sizeof portfile, "%s.port", fxp(log));
  snprintf(logfile, sizeof logfile, "%s", fxp(log));
  unlink(portfile);
  const char *argv[48] = {"dlrec", "serve", "--model", serve_run ? serve_run : fx.run, "--port", "0", "--port-file",
                          portfile};
  int argc = 8;
  for (int i = 0; extra[i] && argc < 47; i++) argv[argc++] = extra[i];
  argv[argc] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return 0;
  if (pid == 0) {
    int fd = open(logfile, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(fx.bin, (char *const *)argv);
    _exit(127);
  }
  double t0 = now_s();
  while (now_s() - t0 < 20) {
    FILE *f = fopen(portfile, "r");
    if (f) {
      int port = 0;
      int got = fscanf(f, "%d", &port);
      fclose(f);
      if (got == 1 && port > 0 && port < 65536) {
        *pid_out = pid;
        *port_out = port;
        return 1;
      }
    }
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      fprintf(stderr, "dlrec serve exited before listening (status 0x%x); its log:\n%s\n", status, log_tail(log));
      return 0;
    }
    usleep(20000);
  }
  fprintf(stderr, "dlrec serve did not write %s within 20 s; its log:\n%s\n", portfile, log_tail(log));
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return 0;
}

static int start_server(void) {
  static const char *const args[] = {"--threads", "2", "--max-body-bytes", "200000", "--watch",
                                     "--watch-interval-ms", "100", "--model-control", "explicit", "-q", NULL};
  return spawn_server("serve.log", args, &fx.pid, &fx.port);
}

/* A server of a single test, killed at exit if the test does not stop it. */
static int start_extra(const char *log, const char *const *extra, pid_t *pid, int *port) {
  int slot = 0;
  while (slot < 4 && fx.extra[slot] > 0) slot++;
  if (slot == 4 || !spawn_server(log, extra, pid, port)) return 0;
  fx.extra[slot] = *pid;
  return 1;
}

/* Stops a server of start_extra with SIGTERM: 1 when it exits 0 within
 * 15 s with no sanitizer report in its log (else reported and killed). */
static int stop_extra(pid_t pid, const char *log) {
  int slot = 0;
  while (slot < 4 && fx.extra[slot] != pid) slot++;
  kill(pid, SIGTERM);
  int status = 0, exited = 0;
  for (double t0 = now_s(); now_s() - t0 < 15; usleep(10000))
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = 1;
      break;
    }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  if (slot < 4) fx.extra[slot] = 0;
  const char *tail = log_tail(log);
  if (!exited) test_fail(__FILE__, __LINE__, "%s: still running 15 s after SIGTERM; killed. Log:\n%s", log, tail);
  else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    test_fail(__FILE__, __LINE__, "%s: exited with status 0x%x after SIGTERM; log:\n%s", log, status, tail);
  else if (strstr(tail, "Sanitizer") || strstr(tail, "runtime error"))
    test_fail(__FILE__, __LINE__, "%s: sanitizer reports in the log:\n%s", log, tail);
  else
    return 1;
  return 0;
}

/* The fixture's directory and the CLI, shared by both fixtures. */
static int base_fixture(void) {
  static int state;
  if (state) return state == 1;
  state = -1;
  const char *bin = getenv("DLREC_BIN");
  if (!bin) {
    fprintf(stderr, "DLREC_BIN is not set\n");
    return 0;
  }
  snprintf(fx.bin, sizeof fx.bin, "%s", bin);
  const char *base = getenv("DLREC_TEST_TMP");
  if (!base) base = "/tmp/dlrec-test";
  mkdir(base, 0755);
  snprintf(fx.dir, sizeof fx.dir, "%s/serve_fixture.%d", base, (int)getpid());
  dlrec_remove_tree(fx.dir);
  if (dlrec_mkdirs(fx.dir) != DLREC_OK) {
    fprintf(stderr, "%s\n", dlrec_last_error());
    return 0;
  }
  snprintf(fx.run, sizeof fx.run, "%s/run", fx.dir);
  signal(SIGPIPE, SIG_IGN);
  atexit(at_exit);
  state = 1;
  return 1;
}

static int build_fixture(void) {
  if (!base_fixture()) return 0;
  double t0 = now_s();
  if (cli("synth -q --rows 20000 --seed 3 --max-cardinality 2000 --out '%s'", fxp("clicks.tsv")) ||
      cli("etl fit -q --input '%s' --out '%s' --min-count 2", fxp("clicks.tsv"), fxp("etl")) ||
      cli("etl apply -q --etl '%s' --input '%s' --out '%s'", fxp("etl"), fxp("clicks.tsv"), fxp("train.dlr")) ||
      cli("train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 5",
          test_source_path("examples/dlrm_synth.json"), fxp("train.dlr"), fxp("etl"), fx.run))
    return 0;
  if (!pick_rows()) return 0;
  if (cli("predict -q --model '%s' --input '%s' --no-label --out '%s'", fx.run, fxp("rows.tsv"),
          fxp("scores5.txt")) ||
      !read_scores(fxp("scores5.txt"), fx.ref5, N_ALL))
    return 0;
  fx.ref = fx.ref5;
  snprintf(fx.version, sizeof fx.version, "5");
  double t1 = now_s();
  if (!start_server()) return 0;
  fprintf(stderr, "fixture: data, training and references %.2f s, server up after %.2f s more (port %d)\n", t1 - t0,
          now_s() - t1, fx.port);
  return 1;
}

static int fixture(void) {
  if (fx.state == 0) fx.state = build_fixture() ? 1 : -1;
  return fx.state == 1;
}

/* Each test runs on the fixture and records whether it failed (a failure
 * keeps the fixture's directory). */
#define SERVE_TEST(name)                                                        \
  static void body_##name(void);                                                \
  TEST(name) {                                                                  \
    fx.talk_port = 0;                                                           \
    if (!fixture()) test_fail(__FILE__, __LINE__, "the fixture could not be built");  \
    else body_##name();                                                         \
    fx.talk_port = 0;                                                           \
    if (test_failed_now()) fx.any_failed = 1;                                   \
  }                                                                             \
  static void body_##name(void)

/* ---- a growable byte string ---- */

typedef test_buf sb;

static void sb_str(sb *s, const char *str) { test_buf_put(s, str, strlen(str)); }

static void sb_json_string(sb *s, const char *str) {
  test_buf_put(s, "\"", 1);
  for (const char *p = str; *p; p++) {
    if (*p == '"' || *p == '\\') test_buf_put(s, "\\", 1);
    test_buf_put(s, p, 1);
  }
  test_buf_put(s, "\"", 1);
}

static void sb_u32le(sb *s, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  test_buf_put(s, b, 4);
}

static void sb_u64le(sb *s, uint64_t v) {
  sb_u32le(s, (uint32_t)v);
  sb_u32le(s, (uint32_t)(v >> 32));
}

static void sb_f32le(sb *s, float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  sb_u32le(s, u);
}

/* ---- the HTTP client ---- */

typedef struct http_resp {
  int status;       /* 0 when no response came */
  char *raw;        /* the whole response, NUL-terminated */
  size_t raw_len;
  size_t head_len;  /* status line and headers, with the blank line */
  const char *body; /* into raw (NUL-terminated there) */
  size_t body_len;
  char err[512];    /* why there is no response */
} http_resp;

static void http_free(http_resp *r) {
  free(r->raw);
  memset(r, 0, sizeof *r);
}

static int http_connect(char *err, size_t cap) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, cap, "socket: %s", strerror(errno));
    return -1;
  }
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int port = fx.talk_port ? fx.talk_port : fx.port;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    snprintf(err, cap, "connect to 127.0.0.1:%d: %s", port, strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Value of header `name` (case-insensitive) into out; NULL when absent. */
static const char *http_header(const http_resp *r, const char *name, char *out, size_t cap) {
  if (!r->raw) return NULL;
  size_t nl = strlen(name);
  const char *p = strstr(r->raw, "\r\n"), *end = r->raw + r->head_len;
  while (p && p + 2 < end) {
    p += 2;
    const char *e = strstr(p, "\r\n");
    if (!e || e > end) break;
    if ((size_t)(e - p) > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
      const char *v = p + nl + 1;
      while (v < e && (*v == ' ' || *v == '\t')) v++;
      size_t n = (size_t)(e - v);
      while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
      if (n >= cap) n = cap - 1;
      memcpy(out, v, n);
      out[n] = 0;
      return out;
    }
    p = e;
  }
  return NULL;
}

/* Splits r->raw into head and body; the status, or 0 while the head is
 * incomplete. *complete: the body holds Content-Length bytes. */
static int parse_head(http_resp *r, int *complete) {
  *complete = 0;
  const char *eoh = strstr(r->raw, "\r\n\r\n");
  if (!eoh) return 0;
  int st = 0;
  if (sscanf(r->raw, "HTTP/1.%*d %d", &st) != 1) return -1;
  r->head_len = (size_t)(eoh + 4 - r->raw);
  r->body = r->raw + r->head_len;
  r->body_len = r->raw_len - r->head_len;
  char v[64];
  *complete = http_header(r, "Content-Length", v, sizeof v) && r->body_len >= strtoull(v, NULL, 10);
  return st;
}

/* Sends req as it is on a new connection while reading what comes back
 * (a server may answer before it has read the whole request, as with 413),
 * until the server closes the connection or a response with its whole
 * Content-Length has come. 1 with r->status set, or 0 with r->err. Ten
 * seconds without progress fail it, so a hung server fails the test
 * instead of hanging it. */
static int http_raw(const void *req, size_t len, http_resp *r) {
  memset(r, 0, sizeof *r);
  int fd = http_connect(r->err, sizeof r->err);
  if (fd < 0) return 0;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  size_t cap = 8192, sent = 0;
  r->raw = malloc(cap);
  if (!r->raw) abort();
  r->raw[0] = 0;
  int send_errno = 0, eof = 0, complete = 0, st = 0;
  while (!eof && !complete) {
    struct pollfd p = {.fd = fd, .events = (short)(POLLIN | (sent < len && !send_errno ? POLLOUT : 0))};
    int pr = poll(&p, 1, 10000);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      snprintf(r->err, sizeof r->err, "%s after sending %zu of %zu bytes and receiving %zu: %s",
               pr == 0 ? "no progress for 10 s" : "poll failed", sent, len, r->raw_len,
               pr == 0 ? "the server hangs" : strerror(errno));
      close(fd);
      return 0;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      for (;;) {
        if (cap - r->raw_len < 4096) {
          char *q = realloc(r->raw, cap * 2);
          if (!q) abort();
          r->raw = q;
          cap *= 2;
        }
        ssize_t n = recv(fd, r->raw + r->raw_len, cap - r->raw_len - 1, 0);
        if (n > 0) {
          r->raw_len += (size_t)n;
          r->raw[r->raw_len] = 0;
          continue;
        }
        if (n == 0) eof = 1;
        else if (errno == EINTR) continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) {
          st = parse_head(r, &complete);
          if (!complete) {
            snprintf(r->err, sizeof r->err, "recv after sending %zu of %zu bytes and receiving %zu: %s%s%s", sent, len,
                     r->raw_len, strerror(errno), send_errno ? "; send failed before: " : "",
                     send_errno ? strerror(send_errno) : "");
            close(fd);
            return 0;
          }
        }
        break;
      }
      st = parse_head(r, &complete);
    }
    if (!eof && !complete && sent < len && !send_errno && (p.revents & POLLOUT)) {
      ssize_t w = send(fd, (const char *)req + sent, len - sent, MSG_NOSIGNAL);
      if (w > 0) sent += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) send_errno = errno;
    }
  }
  close(fd);
  st = parse_head(r, &complete);
  if (st < 100 || st > 599) {
    snprintf(r->err, sizeof r->err, "not an HTTP response (%zu bytes after sending %zu of %zu%s%s): '%.100s'",
             r->raw_len, sent, len, send_errno ? "; send: " : "", send_errno ? strerror(send_errno) : "", r->raw);
    return 0;
  }
  char v[64];
  if (http_header(r, "Transfer-Encoding", v, sizeof v)) {
    snprintf(r->err, sizeof r->err, "unexpected Transfer-Encoding: %s", v);
    return 0;
  }
  if (http_header(r, "Content-Length", v, sizeof v) && strtoull(v, NULL, 10) != r->body_len) {
    snprintf(r->err, sizeof r->err, "Content-Length %s, but %zu body bytes came", v, r->body_len);
    return 0;
  }
  r->status = st;
  return 1;
}

/* One request (Connection: close); extra_headers end in "\r\n" each. */
static int http_do(const char *method, const char *path, const char *extra_headers, const void *body, size_t len,
                   http_resp *r) {
  sb req = {0};
  test_buf_printf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n", method, path, fx.port);
  if (body || !strcmp(method, "POST")) test_buf_printf(&req, "Content-Length: %zu\r\n", len);
  if (extra_headers) sb_str(&req, extra_headers);
  sb_str(&req, "\r\n");
  if (body && len) test_buf_put(&req, body, len);
  int ok = http_raw(req.p, req.n, r);
  test_buf_free(&req);
  if (ok && strstr(path, "/infer")) count_infer(r->status);
  return ok;
}

/* ---- checks on responses (main thread) ---- */

#define REQ(method, path, hdrs, body, len, r)                                                     \
  do {                                                                                            \
    if (!http_do(method, path, hdrs, body, len, r)) {                                            \
      test_fail(__FILE__, __LINE__, "%s %s: no response: %s", method, path, (r)->err);            \
      return;                                                                                     \
    }                                                                                             \
  } while (0)

static int expect_status(const http_resp *r, int want, const char *what) {
  if (r->status == want) return 1;
  test_fail(__FILE__, __LINE__, "%s: status %d, expected %d; body: %.400s", what, r->status, want,
            r->body ? r->body : "");
  return 0;
}

/* The status, Content-Type application/json, and a body {"error": "..."}
 * whose message contains substr (when not NULL). */
static int expect_error(const http_resp *r, int want, const char *substr, const char *what) {
  if (!expect_status(r, want, what)) return 0;
  char type[128];
  if (!http_header(r, "Content-Type", type, sizeof type) || strncmp(type, "application/json", 16)) {
    test_fail(__FILE__, __LINE__, "%s: Content-Type '%s', expected application/json", what,
              http_header(r, "Content-Type", type, sizeof type) ? type : "(none)");
    return 0;
  }
  cJSON *j = cJSON_ParseWithLength(r->body, r->body_len);
  const cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
  int ok = cJSON_IsObject(j) && cJSON_IsString(e) && e->valuestring[0] && cJSON_GetArraySize(j) == 1;
  int has = ok && (!substr || strstr(e->valuestring, substr));
  cJSON_Delete(j);
  if (!ok) test_fail(__FILE__, __LINE__, "%s: body is not {\"error\": \"...\"}: %.400s", what, r->body);
  else if (!has) test_fail(__FILE__, __LINE__, "%s: error does not mention '%s': %.400s", what, substr, r->body);
  return has;
}

/* ---- inference requests and responses ---- */

/* Raw convention, JSON: dense FP32 (full rows) or BYTES (dense_bytes),
 * categorical BYTES; nested rows or flat data. top: extra top-level members
 * ("\"id\":\"x\"," style, with the comma) or NULL. */
static void build_raw_json(sb *s, const int *idx, int n, int flat, int dense_bytes, const char *top) {
  sb_str(s, "{");
  if (top) sb_str(s, top);
  test_buf_printf(s, "\"inputs\":[{\"name\":\"dense\",\"datatype\":\"%s\",\"shape\":[%d,%d],\"data\":[",
            dense_bytes ? "BYTES" : "FP32", n, ND);
  for (int i = 0; i < n; i++) {
    sb_str(s, i ? (flat ? "," : ",[") : (flat ? "" : "["));
    for (int d = 0; d < ND; d++) {
      if (d) sb_str(s, ",");
      if (dense_bytes) sb_json_string(s, fx.field[idx[i]][d]);
      else sb_str(s, fx.field[idx[i]][d]);
    }
    if (!flat) sb_str(s, "]");
  }
  test_buf_printf(s, "]},{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,%d],\"data\":[", n, NC);
  for (int i = 0; i < n; i++) {
    sb_str(s, i ? (flat ? "," : ",[") : (flat ? "" : "["));
    for (int c = 0; c < NC; c++) {
      if (c) sb_str(s, ",");
      sb_json_string(s, fx.field[idx[i]][ND + c]);
    }
    if (!flat) sb_str(s, "]");
  }
  sb_str(s, "]}]}");
}

/* Raw convention with binary tensors: dense FP32 [n,13] (n*13 floats) and
 * categorical BYTES [n,26] (n*26 strings), output as binary when out_binary.
 * *hl: the JSON's length, for Inference-Header-Content-Length. */
static void build_raw_binary_from(sb *s, int n, const float *dense, const char *const *cats, int out_binary,
                                  size_t *hl) {
  size_t cat_bytes = 0;
  for (int k = 0; k < n * NC; k++) cat_bytes += 4 + strlen(cats[k]);
  test_buf_printf(s,
            "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[%d,%d],\"parameters\":"
            "{\"binary_data_size\":%zu}},{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,%d],"
            "\"parameters\":{\"binary_data_size\":%zu}}]",
            n, ND, (size_t)n * ND * 4, n, NC, cat_bytes);
  if (out_binary) sb_str(s, ",\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]");
  sb_str(s, "}");
  *hl = s->n;
  for (int k = 0; k < n * ND; k++) sb_f32le(s, dense[k]);
  for (int k = 0; k < n * NC; k++) {
    sb_u32le(s, (uint32_t)strlen(cats[k]));
    sb_str(s, cats[k]);
  }
}

static void build_raw_binary(sb *s, const int *idx, int n, int out_binary, size_t *hl) {
  float *dense = malloc((size_t)n * ND * sizeof *dense);
  const char **cats = malloc((size_t)n * NC * sizeof *cats);
  if (!dense || !cats) abort();
  for (int i = 0; i < n; i++) {
    for (int d = 0; d < ND; d++) dense[i * ND + d] = (float)strtoll(fx.field[idx[i]][d], NULL, 10);
    for (int c = 0; c < NC; c++) cats[i * NC + c] = fx.field[idx[i]][ND + c];
  }
  build_raw_binary_from(s, n, dense, cats, out_binary, hl);
  free(dense);
  free(cats);
}

/* HugeCTR convention: DES [1, n*13] FP32, CATCOLUMN [1, n*26] INT64,
 * ROWINDEX [1, n*26+1] INT32 (one id per row and column), in JSON or as
 * binary tensors (then *hl is set). */
static void build_hugectr(sb *s, int n, const float *dense, const uint32_t *ids, int binary, size_t *hl) {
  const int K = n * NC;
  if (binary) {
    test_buf_printf(s,
              "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
              ":%d}},{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
              ":%d}},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
              ":%d}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}",
              n * ND, n * ND * 4, K, K * 8, K + 1, (K + 1) * 4);
    *hl = s->n;
    for (int k = 0; k < n * ND; k++) sb_f32le(s, dense[k]);
    for (int k = 0; k < K; k++) sb_u64le(s, ids[k]);
    for (int k = 0; k <= K; k++) sb_u32le(s, (uint32_t)k);
    return;
  }
  test_buf_printf(s, "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,%d],\"data\":[", n * ND);
  for (int k = 0; k < n * ND; k++) test_buf_printf(s, k ? ",%.9g" : "%.9g", (double)dense[k]);
  test_buf_printf(s, "]},{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,%d],\"data\":[", K);
  for (int k = 0; k < K; k++) test_buf_printf(s, k ? ",%u" : "%u", ids[k]);
  test_buf_printf(s, "]},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,%d],\"data\":[", K + 1);
  for (int k = 0; k <= K; k++) test_buf_printf(s, k ? ",%d" : "%d", k);
  sb_str(s, "]}]}");
}

typedef struct infer_out {
  char version[32];
  char id[300];
  int has_id;
  int n;
  float s[MAX_SCORES];
} infer_out;

/* Parses a 200 inference response, JSON or binary (want_binary); scores
 * from JSON are read with strtof from the response text. 0 and err on any
 * deviation from the protocol. Thread-safe. */
static int parse_infer(const http_resp *r, int want_binary, infer_out *o, char *err, size_t cap) {
  memset(o, 0, sizeof *o);
  if (r->status != 200) {
    snprintf(err, cap, "status %d: %.300s", r->status, r->body ? r->body : "");
    return 0;
  }
  char v[64], type[128];
  size_t json_len = r->body_len;
  const char *ihcl = http_header(r, "Inference-Header-Content-Length", v, sizeof v);
  if (want_binary != (ihcl != NULL)) {
    snprintf(err, cap, "Inference-Header-Content-Length %s in a %s response", ihcl ? ihcl : "missing",
             want_binary ? "binary" : "JSON");
    return 0;
  }
  if (!http_header(r, "Content-Type", type, sizeof type)) type[0] = 0;
  if (!want_binary && strncmp(type, "application/json", 16)) {
    snprintf(err, cap, "Content-Type '%s' for a JSON response", type);
    return 0;
  }
  if (ihcl) {
    char *end;
    unsigned long long h = strtoull(ihcl, &end, 10);
    if (*end || h > r->body_len) {
      snprintf(err, cap, "Inference-Header-Content-Length '%s' with a body of %zu bytes", ihcl, r->body_len);
      return 0;
    }
    json_len = (size_t)h;
  }
  cJSON *j = cJSON_ParseWithLength(r->body, json_len);
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "model_name");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "model_version");
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
  const cJSON *outs = cJSON_GetObjectItemCaseSensitive(j, "outputs");
  const cJSON *out0 = cJSON_IsArray(outs) && cJSON_GetArraySize(outs) == 1 ? cJSON_GetArrayItem(outs, 0) : NULL;
  const cJSON *oname = cJSON_GetObjectItemCaseSensitive(out0, "name");
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(out0, "datatype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(out0, "shape");
  const cJSON *dim = cJSON_IsArray(shape) && cJSON_GetArraySize(shape) == 1 ? cJSON_GetArrayItem(shape, 0) : NULL;
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(out0, "parameters");
  const cJSON *bds = cJSON_GetObjectItemCaseSensitive(params, "binary_data_size");
  const cJSON *data = cJSON_GetObjectItemCaseSensitive(out0, "data");
  int ok = cJSON_IsObject(j) && cJSON_IsString(name) && !strcmp(name->valuestring, "dlrm") && cJSON_IsString(ver) &&
           strlen(ver->valuestring) < sizeof o->version && (!id || cJSON_IsString(id)) && cJSON_IsString(oname) &&
           !strcmp(oname->valuestring, "OUTPUT0") && cJSON_IsString(dt) && !strcmp(dt->valuestring, "FP32") &&
           cJSON_IsNumber(dim) && dim->valuedouble >= 1 && dim->valuedouble <= MAX_SCORES;
  if (ok) {
    snprintf(o->version, sizeof o->version, "%s", ver->valuestring);
    if (id) {
      o->has_id = 1;
      snprintf(o->id, sizeof o->id, "%s", id->valuestring);
    }
    o->n = (int)dim->valuedouble;
  }
  if (ok && want_binary) {
    ok = !data && cJSON_IsNumber(bds) && bds->valuedouble == 4.0 * o->n && r->body_len == json_len + 4u * (size_t)o->n;
    for (int i = 0; ok && i < o->n; i++) {
      const unsigned char *b = (const unsigned char *)r->body + json_len + 4 * i;
      uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
      memcpy(&o->s[i], &u, 4);
    }
  } else if (ok) {
    ok = !bds && cJSON_IsArray(data) && cJSON_GetArraySize(data) == o->n;
    const char *p = ok ? strstr(r->body, "\"data\":[") : NULL;
    ok = p != NULL;
    if (p) p += 8;
    for (int i = 0; ok && i < o->n; i++) {
      char *end;
      o->s[i] = strtof(p, &end);
      ok = end != p && *end == (i + 1 < o->n ? ',' : ']');
      p = end + 1;
    }
  }
  cJSON_Delete(j);
  if (!ok) snprintf(err, cap, "malformed inference response (%s): %.400s", want_binary ? "binary" : "JSON", r->body);
  return ok;
}

/* Bitwise equality of n scores with ref[idx[i]]; 0 and err on a difference. */
static int scores_equal(const infer_out *o, const int *idx, int n, const float *ref, char *err, size_t cap) {
  if (o->n != n) {
    snprintf(err, cap, "%d scores for %d rows", o->n, n);
    return 0;
  }
  for (int i = 0; i < n; i++) {
    uint32_t a, b;
    memcpy(&a, &o->s[i], 4);
    memcpy(&b, &ref[idx[i]], 4);
    if (a != b) {
      snprintf(err, cap, "row %d of the request (fixture row %d): served %.9g (0x%08x), predict %.9g (0x%08x)", i,
               idx[i], (double)o->s[i], a, (double)ref[idx[i]], b);
      return 0;
    }
  }
  return 1;
}

/* Sends an inference request and checks: 200, the served version, scores
 * bitwise equal to the reference of rows idx (and the id when given). */
static int infer_check(const char *what, const char *hdrs, const void *body, size_t len, int want_binary,
                       const int *idx, int n, const char *want_id) {
  http_resp r;
  if (!http_do("POST", "/v2/models/dlrm/infer", hdrs, body, len, &r)) {
    test_fail(__FILE__, __LINE__, "%s: no response: %s", what, r.err);
    http_free(&r);
    return 0;
  }
  infer_out o;
  char err[1024];
  int ok = parse_infer(&r, want_binary, &o, err, sizeof err);
  if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", what, err);
  if (ok && strcmp(o.version, fx.version)) {
    test_fail(__FILE__, __LINE__, "%s: model_version \"%s\", expected \"%s\"", what, o.version, fx.version);
    ok = 0;
  }
  if (ok && want_id && (!o.has_id || strcmp(o.id, want_id))) {
    test_fail(__FILE__, __LINE__, "%s: id %s%s%s, expected \"%s\"", what, o.has_id ? "\"" : "",
              o.has_id ? o.id : "missing", o.has_id ? "\"" : "", want_id);
    ok = 0;
  }
  if (ok && !want_id && o.has_id) {
    test_fail(__FILE__, __LINE__, "%s: an id \"%s\" in the response of a request without one", what, o.id);
    ok = 0;
  }
  if (ok && !scores_equal(&o, idx, n, fx.ref, err, sizeof err)) {
    test_fail(__FILE__, __LINE__, "%s: %s", what, err);
    ok = 0;
  }
  http_free(&r);
  return ok;
}

/* A JSON inference response holds the reference scores of rows idx,
 * bitwise; reports what failed under `what`. */
static int scores_match(const http_resp *r, const int *idx, int n, const char *what) {
  infer_out o;
  char err[1024];
  int ok = parse_infer(r, 0, &o, err, sizeof err) && scores_equal(&o, idx, n, fx.ref, err, sizeof err);
  if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", what, err);
  return ok;
}

static int infer_json_check(const char *what, const int *idx, int n, int flat, int dense_bytes, const char *top,
                            const char *want_id) {
  sb s = {0};
  build_raw_json(&s, idx, n, flat, dense_bytes, top);
  int ok = infer_check(what, NULL, s.p, s.n, 0, idx, n, want_id);
  test_buf_free(&s);
  return ok;
}

/* A small normal request that must succeed (after hostile ones). */
static int normal_ok(const char *after) {
  static const int idx[3] = {3, 17, 29};
  char what[256];
  snprintf(what, sizeof what, "a normal request after %s", after);
  return infer_json_check(what, idx, 3, 0, 0, NULL, NULL);
}

static const char *ihcl_header(size_t hl, char *buf, size_t cap) {
  snprintf(buf, cap, "Inference-Header-Content-Length: %zu\r\n", hl);
  return buf;
}

/* ---- /metrics ---- */

/* The value of the sample `series` (name with labels, exactly as printed);
 * 0 when absent (counters with no events are not printed). */
static double metric(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
  return 0;
}

static int has_series(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (!strncmp(p, series, n) && p[n] == ' ') return 1;
  return 0;
}

static int get_metrics(char **text) {
  http_resp r;
  *text = NULL;
  if (!http_do("GET", "/metrics", NULL, NULL, 0, &r)) {
    test_fail(__FILE__, __LINE__, "GET /metrics: no response: %s", r.err);
    http_free(&r);
    return 0;
  }
  int ok = expect_status(&r, 200, "GET /metrics");
  if (ok) {
    *text = strdup(r.body);
    if (!*text) abort();
  }
  http_free(&r);
  return ok;
}

/* ================= the tests, in order ================= */

SERVE_TEST(serve_01_endpoints) {
  http_resp r;
  REQ("GET", "/v2/health/live", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2/health/live"));
  http_free(&r);
  REQ("GET", "/v2/health/ready", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2/health/ready"));
  http_free(&r);

  REQ("GET", "/v2", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2"));
  cJSON *j = cJSON_ParseWithLength(r.body, r.body_len);
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
  const cJSON *ext = cJSON_GetObjectItemCaseSensitive(j, "extensions");
  int ok = cJSON_IsString(name) && name->valuestring[0] && cJSON_IsArray(ext);
  cJSON_Delete(j);
  if (!ok) test_fail(__FILE__, __LINE__, "GET /v2: no name or extensions: %s", r.body);
  http_free(&r);
  CHECK(ok);

  const char *meta[] = {"/v2/models/dlrm", "/v2/models/dlrm/versions/5"};
  for (int k = 0; k < 2; k++) {
    REQ("GET", meta[k], NULL, NULL, 0, &r);
    CHECK(expect_status(&r, 200, meta[k]));
    j = cJSON_ParseWithLength(r.body, r.body_len);
    name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *versions = cJSON_GetObjectItemCaseSensitive(j, "versions");
    const cJSON *v0 = cJSON_GetArrayItem(versions, 0);
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(j, "inputs");
    const cJSON *outputs = cJSON_GetObjectItemCaseSensitive(j, "outputs");
    const cJSON *o0 = cJSON_GetArrayItem(outputs, 0);
    const cJSON *o0name = cJSON_GetObjectItemCaseSensitive(o0, "name");
    int seen = 0; /* bit per input name */
    const cJSON *in;
    cJSON_ArrayForEach(in, inputs) {
      const cJSON *n = cJSON_GetObjectItemCaseSensitive(in, "name");
      const char *names[] = {"dense", "categorical", "DES", "CATCOLUMN", "ROWINDEX"};
      for (int i = 0; i < 5; i++)
        if (cJSON_IsString(n) && !strcmp(n->valuestring, names[i])) seen |= 1 << i;
    }
    ok = cJSON_IsString(name) && !strcmp(name->valuestring, "dlrm") && cJSON_IsString(v0) &&
         !strcmp(v0->valuestring, "5") && seen == 31 && cJSON_IsString(o0name) &&
         !strcmp(o0name->valuestring, "OUTPUT0");
    cJSON_Delete(j);
    if (!ok)
      test_fail(__FILE__, __LINE__, "GET %s: metadata without name dlrm, version 5, the 5 inputs and OUTPUT0: %s",
                meta[k], r.body);
    http_free(&r);
    CHECK(ok);
  }
  const char *ready[] = {"/v2/models/dlrm/ready", "/v2/models/dlrm/versions/5/ready"};
  for (int k = 0; k < 2; k++) {
    REQ("GET", ready[k], NULL, NULL, 0, &r);
    CHECK(expect_status(&r, 200, ready[k]));
    http_free(&r);
  }

  /* Unknown models, versions and paths. */
  const char *missing[] = {"/v2/models/nosuch", "/v2/models/nosuch/ready", "/v2/models/dlrm/versions/999",
                           "/v2/models/dlrm/versions/999/ready", "/v2/nothing", "/nothing", "/v2/models/dlrm/explain",
                           "/v2/health/dead"};
  for (int k = 0; k < 8; k++) {
    REQ("GET", missing[k], NULL, NULL, 0, &r);
    CHECK(expect_error(&r, 404, NULL, missing[k]));
    http_free(&r);
  }
  REQ("GET", "/v2/models/nosuch", NULL, NULL, 0, &r);
  CHECK(expect_error(&r, 404, "nosuch", "GET /v2/models/nosuch"));
  http_free(&r);
  REQ("GET", "/v2/models/dlrm/versions/999", NULL, NULL, 0, &r);
  CHECK(expect_error(&r, 404, "999", "GET /v2/models/dlrm/versions/999"));
  http_free(&r);
  /* Inference on an unknown model or version: 404 (with a valid body). */
  static const int idx[2] = {0, 1};
  sb s = {0};
  build_raw_json(&s, idx, 2, 0, 0, NULL);
  REQ("POST", "/v2/models/nosuch/infer", NULL, s.p, s.n, &r);
  CHECK(expect_error(&r, 404, "nosuch", "POST /v2/models/nosuch/infer"));
  http_free(&r);
  REQ("POST", "/v2/models/dlrm/versions/999/infer", NULL, s.p, s.n, &r);
  CHECK(expect_error(&r, 404, "999", "POST /v2/models/dlrm/versions/999/infer"));
  http_free(&r);
  /* The version URL scores too. */
  REQ("POST", "/v2/models/dlrm/versions/5/infer", NULL, s.p, s.n, &r);
  ok = scores_match(&r, idx, 2, "POST /v2/models/dlrm/versions/5/infer");
  http_free(&r);
  test_buf_free(&s);
  CHECK(ok);

  /* Wrong methods. */
  REQ("GET", "/v2/models/dlrm/infer", NULL, NULL, 0, &r);
  CHECK(expect_error(&r, 405, NULL, "GET /v2/models/dlrm/infer"));
  http_free(&r);
  REQ("POST", "/v2/health/live", NULL, "", 0, &r);
  CHECK(expect_error(&r, 405, NULL, "POST /v2/health/live"));
  http_free(&r);
  REQ("GET", "/v2/repository/index", NULL, NULL, 0, &r);
  CHECK(expect_error(&r, 405, NULL, "GET /v2/repository/index"));
  http_free(&r);
}

SERVE_TEST(serve_02_scores_json) {
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  CHECK(infer_json_check("40 rows in one request", all, N_FULL, 0, 0, NULL, NULL));
  for (int i = 0; i < N_FULL; i++) {
    char what[64];
    snprintf(what, sizeof what, "row %d alone", i);
    CHECK(infer_json_check(what, &all[i], 1, 0, 0, NULL, NULL));
  }
  for (int i = 0; i < N_FULL; i += 7) {
    char what[64];
    int n = N_FULL - i < 7 ? N_FULL - i : 7;
    snprintf(what, sizeof what, "rows %d..%d", i, i + n - 1);
    CHECK(infer_json_check(what, &all[i], n, 0, 0, NULL, NULL));
  }
  CHECK(infer_json_check("40 rows with an id", all, N_FULL, 0, 0, "\"id\":\"req-42 \\\"q\\\"\",", "req-42 \"q\""));
  CHECK(infer_json_check("40 rows, flat data", all, N_FULL, 1, 0, NULL, NULL));
  /* Rows in another order, one of them twice. */
  int mixed[6] = {39, 0, 21, 0, 8, 13};
  CHECK(infer_json_check("rows reordered and repeated", mixed, 6, 0, 0, NULL, NULL));
  /* Dense values as their raw text (BYTES), "" for the missing ones. */
  int miss[N_MISS + 2];
  for (int i = 0; i < N_MISS; i++) miss[i] = N_FULL + i;
  miss[N_MISS] = 5;
  miss[N_MISS + 1] = 6;
  CHECK(infer_json_check("dense as BYTES with missing values", miss, N_MISS + 2, 0, 1, NULL, NULL));
  CHECK(infer_json_check("dense as BYTES, flat", miss, N_MISS + 2, 1, 1, NULL, NULL));
}

SERVE_TEST(serve_03_binary) {
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  char h[128];
  sb s = {0};
  size_t hl;
  build_raw_binary(&s, all, N_FULL, 1, &hl);
  int ok = infer_check("binary in, binary out", ihcl_header(hl, h, sizeof h), s.p, s.n, 1, all, N_FULL, NULL);
  test_buf_free(&s);
  CHECK(ok);
  /* Binary in, JSON out (no outputs asked for). */
  build_raw_binary(&s, all, N_FULL, 0, &hl);
  ok = infer_check("binary in, JSON out", ihcl_header(hl, h, sizeof h), s.p, s.n, 0, all, N_FULL, NULL);
  test_buf_free(&s);
  CHECK(ok);
  /* JSON in, binary out through parameters.binary_data_output. */
  build_raw_json(&s, all, N_FULL, 0, 0, "\"parameters\":{\"binary_data_output\":true},");
  ok = infer_check("JSON in, binary_data_output", NULL, s.p, s.n, 1, all, N_FULL, NULL);
  test_buf_free(&s);
  CHECK(ok);
  /* Binary in chunks of 7. */
  for (int i = 0; i < N_FULL; i += 7) {
    int n = N_FULL - i < 7 ? N_FULL - i : 7;
    build_raw_binary(&s, &all[i], n, 1, &hl);
    ok = infer_check("binary, 7 rows", ihcl_header(hl, h, sizeof h), s.p, s.n, 1, &all[i], n, NULL);
    test_buf_free(&s);
    CHECK(ok);
  }
}

/* Encodes the N_FULL rows with the ETL state in etl_dir, as apply does:
 * dense[N_FULL * ND] transformed values, ids[N_FULL * NC] global ids. */
static dlrec_status encode_rows(const char *etl_dir, float *dense, uint32_t *ids) {
  dlrec_etl *etl = NULL;
  dlrec_status st = dlrec_etl_load(&etl, etl_dir);
  for (int i = 0; i < N_FULL && st == DLREC_OK; i++) {
    char line[2048];
    size_t n = 0;
    for (int k = 0; k < NF; k++) n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", k ? "\t" : "", fx.field[i][k]);
    float label;
    st = dlrec_etl_encode_line(etl, line, n, 0, &label, dense + i * ND, ids + i * NC);
  }
  dlrec_etl_free(etl);
  return st;
}

SERVE_TEST(serve_04_hugectr) {
  /* Encode the rows as the checkpoint's ETL state does. */
  char ckpt[1024], etl_dir[1100];
  CHECK_OK(dlrec_checkpoint_resolve(fx.run, ckpt, sizeof ckpt));
  snprintf(etl_dir, sizeof etl_dir, "%s/etl", ckpt);
  float dense[N_FULL * ND];
  uint32_t ids[N_FULL * NC];
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  CHECK_OK(encode_rows(etl_dir, dense, ids));
  char h[128];
  sb s = {0};
  size_t hl = 0;
  build_hugectr(&s, N_FULL, dense, ids, 0, &hl);
  int ok = infer_check("HugeCTR DES/CATCOLUMN/ROWINDEX in JSON", NULL, s.p, s.n, 0, all, N_FULL, NULL);
  test_buf_free(&s);
  CHECK(ok);
  build_hugectr(&s, N_FULL, dense, ids, 1, &hl);
  ok = infer_check("HugeCTR inputs as binary tensors", ihcl_header(hl, h, sizeof h), s.p, s.n, 1, all, N_FULL, NULL);
  test_buf_free(&s);
  CHECK(ok);
  for (int i = 0; i < N_FULL; i += 7) {
    int n = N_FULL - i < 7 ? N_FULL - i : 7;
    build_hugectr(&s, n, dense + i * ND, ids + i * NC, 0, &hl);
    ok = infer_check("HugeCTR, 7 rows", NULL, s.p, s.n, 0, &all[i], n, NULL);
    test_buf_free(&s);
    CHECK(ok);
  }
  /* An id outside its column's range. */
  ids[5] = 0xfffffff0u;
  build_hugectr(&s, 1, dense, ids, 0, &hl);
  http_resp r;
  REQ("POST", "/v2/models/dlrm/infer", NULL, s.p, s.n, &r);
  test_buf_free(&s);
  CHECK(expect_error(&r, 400, "CATCOLUMN", "HugeCTR id out of range"));
  http_free(&r);
  CHECK(normal_ok("an id out of range"));
}

/* Posts body (with optional extra headers) to infer and expects an error. */
static int hostile(const char *what, const char *hdrs, const void *body, size_t len, int status, const char *substr) {
  http_resp r;
  if (!http_do("POST", "/v2/models/dlrm/infer", hdrs, body, len, &r)) {
    test_fail(__FILE__, __LINE__, "%s: no response: %s", what, r.err);
    http_free(&r);
    return 0;
  }
  int ok = expect_error(&r, status, substr, what);
  http_free(&r);
  return ok && normal_ok(what);
}

SERVE_TEST(serve_05_hostile_input) {
  static const char *one_cat = "\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,26],\"data\":[[\"\",\"\",\"\","
                               "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
                               "\"\",\"\",\"\",\"\",\"\",\"\"]]";
  static const char *one_dense = "\"dense\",\"datatype\":\"FP32\",\"shape\":[1,13],\"data\":[[1,2,3,4,5,6,7,8,9,10,"
                                 "11,12,13]]";
  char body[4096], h[128];
  CHECK(hostile("invalid JSON", NULL, "{\"inputs\": [", 12, 400, NULL));
  CHECK(hostile("garbage", NULL, "\x01\x02\xff", 3, 400, NULL));
  CHECK(hostile("an empty body", NULL, "", 0, 400, NULL));
  CHECK(hostile("JSON that is not an object", NULL, "[1,2,3]", 7, 400, "object"));
  /* The shape says 2 rows, the data has 1. */
  snprintf(body, sizeof body,
           "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[2,13],\"data\":[[1,2,3,4,5,6,7,8,9,10,11,"
           "12,13]]},{\"name\":%s}]}",
           one_cat);
  CHECK(hostile("a shape that does not match the data", NULL, body, strlen(body), 400, "dense"));
  /* dense and categorical disagree on rows. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s},{\"name\":\"categorical\",\"datatype\":\"BYTES\","
           "\"shape\":[2,13],\"data\":[[\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"],[\"\",\"\","
           "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"]]}]}", one_dense);
  CHECK(hostile("categorical of the wrong width", NULL, body, strlen(body), 400, "categorical"));
  /* categorical as FP32. */
  snprintf(body, sizeof body,
           "{\"inputs\":[{\"name\":%s},{\"name\":\"categorical\",\"datatype\":\"FP32\",\"shape\":[1,26],\"data\":[[0,0,"
           "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]}]}",
           one_dense);
  CHECK(hostile("categorical as FP32", NULL, body, strlen(body), 400, "BYTES"));
  /* An unknown datatype. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP33\",\"shape\":[1,13],\"data\":[[1,2,"
           "3,4,5,6,7,8,9,10,11,12,13]]},{\"name\":%s}]}", one_cat);
  CHECK(hostile("an unknown datatype", NULL, body, strlen(body), 400, "FP33"));
  /* A missing tensor. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s}]}", one_dense);
  CHECK(hostile("categorical missing", NULL, body, strlen(body), 400, "categorical"));
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,13],\"data\":[1,2,3,"
           "4,5,6,7,8,9,10,11,12,13]}]}");
  CHECK(hostile("CATCOLUMN and ROWINDEX missing", NULL, body, strlen(body), 400, "CATCOLUMN"));
  CHECK(hostile("no inputs at all", NULL, "{\"inputs\":[]}", 13, 400, "inputs"));
  /* An unknown input, an unknown key. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s},{\"name\":%s},{\"name\":\"extra\",\"datatype\":\"FP32\","
           "\"shape\":[1],\"data\":[1]}]}", one_dense, one_cat);
  CHECK(hostile("an unknown input", NULL, body, strlen(body), 400, "extra"));
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s},{\"name\":%s}],\"colour\":1}", one_dense, one_cat);
  CHECK(hostile("an unknown key", NULL, body, strlen(body), 400, "colour"));
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s},{\"name\":%s}],\"outputs\":[{\"name\":\"OUTPUT1\"}]}",
           one_dense, one_cat);
  CHECK(hostile("an unknown output", NULL, body, strlen(body), 400, "OUTPUT1"));
  /* Values the ETL refuses: dense text that is no number, a categorical
   * value that is not hex. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[1,13],\"data\":[[\"1\","
           "\"zz\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"]]},{\"name\":%s}]}", one_cat);
  CHECK(hostile("dense text that is not a number", NULL, body, strlen(body), 400, "dense"));
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":%s},{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":"
           "[1,26],\"data\":[[\"not hex\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
           "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"]]}]}", one_dense);
  CHECK(hostile("a categorical value that is not hex", NULL, body, strlen(body), 400, "categorical"));
  /* 1e40 does not fit FP32. */
  snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[1,13],\"data\":[[1e40,"
           "2,3,4,5,6,7,8,9,10,11,12,13]]},{\"name\":%s}]}", one_cat);
  CHECK(hostile("1e40 as FP32", NULL, body, strlen(body), 400, NULL));

  /* Bodies over --max-body-bytes: 413, by Content-Length and chunked. */
  size_t big = MAX_BODY + 50000;
  char *junk = malloc(big);
  CHECK(junk);
  memset(junk, ' ', big);
  junk[0] = '{';
  int ok = hostile("a body over --max-body-bytes", NULL, junk, big, 413, "max-body-bytes");
  if (ok) {
    sb req = {0};
    test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
              "Transfer-Encoding: chunked\r\n\r\n", fx.port);
    for (size_t at = 0; at < big; at += 10000) {
      test_buf_printf(&req, "%zx\r\n", (size_t)10000);
      test_buf_put(&req, junk + at, 10000);
      sb_str(&req, "\r\n");
    }
    sb_str(&req, "0\r\n\r\n");
    http_resp r;
    ok = http_raw(req.p, req.n, &r);
    test_buf_free(&req);
    if (!ok) test_fail(__FILE__, __LINE__, "a chunked body over the limit: no response: %s", r.err);
    else count_infer(r.status);
    ok = ok && expect_error(&r, 413, "max-body-bytes", "a chunked body over --max-body-bytes");
    http_free(&r);
    ok = ok && normal_ok("a chunked body over the limit");
  }
  free(junk);
  CHECK(ok);
  /* A body just under the limit is read (and refused as bad JSON, not 413). */
  junk = malloc(MAX_BODY);
  CHECK(junk);
  memset(junk, ' ', MAX_BODY);
  junk[0] = '{';
  ok = hostile("a body of exactly --max-body-bytes", NULL, junk, MAX_BODY, 400, NULL);
  free(junk);
  CHECK(ok);

  /* Binary sections that do not add up. */
  static const int idx[3] = {0, 1, 2};
  sb s = {0};
  size_t hl;
  build_raw_binary(&s, idx, 3, 1, &hl);
  snprintf(h, sizeof h, "Inference-Header-Content-Length: %zu\r\n", s.n + 10);
  ok = hostile("Inference-Header-Content-Length beyond the body", h, s.p, s.n, 400, "Inference-Header-Content-Length");
  ok = ok && hostile("a binary section 4 bytes short", ihcl_header(hl, h, sizeof h), s.p, s.n - 4, 400, "categorical");
  ok = ok && hostile("a binary section cut inside dense", ihcl_header(hl, h, sizeof h), s.p, hl + 100, 400, "dense");
  if (ok) {
    test_buf_put(&s, "xyz", 3);
    ok = hostile("3 bytes after the binary section", ihcl_header(hl, h, sizeof h), s.p, s.n, 400, "trailing");
    s.n -= 3;
  }
  ok = ok && hostile("binary data without Inference-Header-Content-Length", NULL, s.p, s.n, 400, NULL);
  ok = ok && hostile("Inference-Header-Content-Length: abc", "Inference-Header-Content-Length: abc\r\n", s.p, s.n, 400,
                     "Inference-Header-Content-Length");
  ok = ok && hostile("Inference-Header-Content-Length: -5", "Inference-Header-Content-Length: -5\r\n", s.p, s.n, 400,
                     "Inference-Header-Content-Length");
  ok = ok && hostile("Inference-Header-Content-Length: 12abc", "Inference-Header-Content-Length: 12abc\r\n", s.p, s.n,
                     400, "Inference-Header-Content-Length");
  /* Binary tensor data with a JSON header that cuts the JSON short. */
  ok = ok && hostile("Inference-Header-Content-Length inside the JSON", ihcl_header(hl - 5, h, sizeof h), s.p, s.n, 400,
                     NULL);
  test_buf_free(&s);
  CHECK(ok);

  /* More rows than --max-batch (1024): binary, so that it fits the body limit. */
  {
    const int n = 1025;
    float *dense = calloc((size_t)n * ND, sizeof *dense);
    const char **cats = malloc((size_t)n * NC * sizeof *cats);
    CHECK(dense && cats);
    for (int k = 0; k < n * NC; k++) cats[k] = "";
    build_raw_binary_from(&s, n, dense, cats, 0, &hl);
    ok = s.n < MAX_BODY;
    if (!ok) test_fail(__FILE__, __LINE__, "1025 rows take %zu bytes, over the body limit", s.n);
    ok = ok && hostile("1025 rows (max-batch 1024)", ihcl_header(hl, h, sizeof h), s.p, s.n, 400, "1024");
    test_buf_free(&s);
    /* And 1024 rows are fine. */
    if (ok) {
      build_raw_binary_from(&s, 1024, dense, cats, 1, &hl);
      http_resp r;
      ok = http_do("POST", "/v2/models/dlrm/infer", ihcl_header(hl, h, sizeof h), s.p, s.n, &r);
      if (!ok) test_fail(__FILE__, __LINE__, "1024 rows: no response: %s", r.err);
      ok = ok && expect_status(&r, 200, "1024 rows (max-batch)");
      char v[64];
      if (ok && !(http_header(&r, "Inference-Header-Content-Length", v, sizeof v) &&
                  r.body_len == strtoull(v, NULL, 10) + 4096)) {
        test_fail(__FILE__, __LINE__, "1024 rows: a binary response of %zu bytes", r.body_len);
        ok = 0;
      }
      http_free(&r);
      test_buf_free(&s);
    }
    free(dense);
    free(cats);
    CHECK(ok);
  }

  /* Slow clients hold only their own connection: half the headers, and
   * full headers with half the body, while normal requests go through. */
  char err[256];
  int slow1 = http_connect(err, sizeof err);
  if (slow1 < 0) test_fail(__FILE__, __LINE__, "slow client: %s", err);
  CHECK(slow1 >= 0);
  const char *half = "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le";
  ok = send_all(slow1, half, strlen(half)) == 0;
  if (!ok) test_fail(__FILE__, __LINE__, "slow client: send failed: %s", strerror(errno));
  ok = ok && normal_ok("half the headers on another connection");
  int slow2 = ok ? http_connect(err, sizeof err) : -1;
  if (ok && slow2 < 0) {
    test_fail(__FILE__, __LINE__, "slow client 2: %s", err);
    ok = 0;
  }
  if (ok) {
    char head[256];
    snprintf(head, sizeof head,
             "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [");
    ok = send_all(slow2, head, strlen(head)) == 0;
    if (!ok) test_fail(__FILE__, __LINE__, "slow client 2: send failed: %s", strerror(errno));
  }
  ok = ok && normal_ok("half a body on another connection");
  ok = ok && normal_ok("two slow connections open");
  if (slow2 >= 0) close(slow2);
  close(slow1);
  CHECK(ok);
  usleep(50000);
  CHECK(normal_ok("the slow connections closed"));
}

/* ---- keep-alive and Expect: 100-continue ---- */

/* Takes the response at buf[*at..) into r (a copy) once it is complete:
 * 1 and *at moved past it, 0 when more bytes are needed, -1 and r->err
 * when it is malformed. Interim 1xx responses have no body. */
static int take_response(const sb *buf, size_t *at, http_resp *r) {
  memset(r, 0, sizeof *r);
  const char *p = buf->p ? buf->p + *at : "";
  size_t left = buf->n - *at;
  const char *eoh = memmem(p, left, "\r\n\r\n", 4);
  if (!eoh) return 0;
  size_t head = (size_t)(eoh + 4 - p);
  r->raw = malloc(left + 1);
  if (!r->raw) abort();
  memcpy(r->raw, p, left);
  r->raw[left] = 0;
  r->raw_len = left;
  int complete;
  int st = parse_head(r, &complete);
  char v[64];
  size_t body = 0;
  if (st < 100 || st > 599) {
    snprintf(r->err, sizeof r->err, "not an HTTP response: '%.100s'", r->raw);
    return -1;
  }
  if (st >= 200) {
    if (!http_header(r, "Content-Length", v, sizeof v)) {
      snprintf(r->err, sizeof r->err, "a %d response without Content-Length", st);
      return -1;
    }
    body = strtoull(v, NULL, 10);
  }
  if (head + body > left) {
    http_free(r);
    return 0;
  }
  r->raw_len = head + body;
  r->raw[r->raw_len] = 0;
  r->body_len = body;
  r->status = st;
  *at += head + body;
  return 1;
}

/* Reads from fd into buf until a whole response is at buf[*at..). */
static int read_response(int fd, sb *buf, size_t *at, http_resp *r) {
  for (;;) {
    int t = take_response(buf, at, r);
    if (t) return t > 0;
    char chunk[16384];
    ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n > 0) {
      test_buf_put(buf, chunk, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    snprintf(r->err, sizeof r->err, "%s with %zu bytes of a response", n == 0 ? "connection closed"
             : errno == EAGAIN || errno == EWOULDBLOCK ? "no data for 10 s" : strerror(errno), buf->n - *at);
    return 0;
  }
}

/* Sends n bytes on the open connection fd and reads one response into r
 * (buf and *at carry what was read past it); reports a failure as `what`. */
static int exchange(int fd, const void *p, size_t n, sb *buf, size_t *at, http_resp *r, const char *what) {
  int ok = send_all(fd, p, n) == 0 && read_response(fd, buf, at, r);
  if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", what, r->err);
  return ok;
}

SERVE_TEST(serve_05b_keepalive_and_expect_continue) {
  static const int idx[3] = {4, 9, 33};
  sb good = {0}, req = {0}, buf = {0};
  build_raw_json(&good, idx, 3, 0, 0, NULL);
  char err[1024];
  size_t at = 0;
  http_resp r;
  /* One keep-alive connection: a bad request, a good one, a GET. */
  int fd = http_connect(err, sizeof err);
  if (fd < 0) test_fail(__FILE__, __LINE__, "%s", err);
  CHECK(fd >= 0);
  const char *bad = "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n{bad}";
  int ok = exchange(fd, bad, strlen(bad), &buf, &at, &r, "keep-alive, request 1");
  if (ok) count_infer(r.status);
  ok = ok && expect_error(&r, 400, NULL, "keep-alive, request 1 (bad JSON)");
  http_free(&r);
  if (ok) {
    test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n\r\n", good.n);
    test_buf_put(&req, good.p, good.n);
    ok = exchange(fd, req.p, req.n, &buf, &at, &r, "keep-alive, request 2 on the same connection");
    if (ok) count_infer(r.status);
    ok = ok && scores_match(&r, idx, 3, "keep-alive, request 2 (after a bad one)");
    http_free(&r);
  }
  if (ok) {
    const char *live = "GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    ok = exchange(fd, live, strlen(live), &buf, &at, &r, "keep-alive, request 3");
    ok = ok && expect_status(&r, 200, "keep-alive, request 3 (GET live)");
    http_free(&r);
  }
  close(fd);
  test_buf_free(&req);
  test_buf_free(&buf);
  CHECK(ok);

  /* Expect: 100-continue, as curl sends for larger bodies: 100, then the body, then 200. */
  at = 0;
  fd = http_connect(err, sizeof err);
  if (fd < 0) test_fail(__FILE__, __LINE__, "%s", err);
  CHECK(fd >= 0);
  test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            "Expect: 100-continue\r\nContent-Length: %zu\r\n\r\n", good.n);
  ok = exchange(fd, req.p, req.n, &buf, &at, &r, "Expect: 100-continue: no interim response");
  ok = ok && expect_status(&r, 100, "Expect: 100-continue, before the body");
  http_free(&r);
  if (ok) {
    ok = exchange(fd, good.p, good.n, &buf, &at, &r, "Expect: 100-continue: no final response");
    if (ok) count_infer(r.status);
    ok = ok && scores_match(&r, idx, 3, "Expect: 100-continue");
    http_free(&r);
  }
  close(fd);
  test_buf_free(&req);
  test_buf_free(&buf);
  CHECK(ok);

  /* A Content-Length over the limit with Expect: 100-continue: 413 before
   * the body is sent. */
  at = 0;
  fd = http_connect(err, sizeof err);
  if (fd < 0) test_fail(__FILE__, __LINE__, "%s", err);
  CHECK(fd >= 0);
  test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n", MAX_BODY + 1);
  ok = exchange(fd, req.p, req.n, &buf, &at, &r, "Expect: 100-continue over the limit: no response");
  if (ok && r.status != 100) count_infer(r.status);
  ok = ok && expect_error(&r, 413, "max-body-bytes", "Expect: 100-continue with a body over the limit");
  http_free(&r);
  close(fd);
  test_buf_free(&req);
  test_buf_free(&buf);
  test_buf_free(&good);
  CHECK(ok);
  CHECK(normal_ok("the keep-alive and Expect requests"));
}

/* ---- the request line and the framing headers ---- */

/* Sends raw bytes as one request on a new connection and expects status
 * with a JSON error mentioning substr (NULL: any), then a normal request. */
static int raw_expect(const char *what, const void *req, size_t len, int status, const char *substr) {
  http_resp r;
  if (!http_raw(req, len, &r)) {
    test_fail(__FILE__, __LINE__, "%s: no response: %s", what, r.err);
    http_free(&r);
    return 0;
  }
  int ok = status == 200 ? expect_status(&r, 200, what) : expect_error(&r, status, substr, what);
  http_free(&r);
  return ok && normal_ok(what);
}

#define RAW(lit) lit, sizeof lit - 1

SERVE_TEST(serve_05c_control_bytes_in_path) {
  /* A decoded NUL used to end the path early (dlrm%00x served dlrm's
   * metadata), and a raw NUL in the request line cut it too ("/v2"). */
  CHECK(raw_expect("GET /v2/models/dlrm%00x", RAW("GET /v2/models/dlrm%00x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
                   400, "control byte"));
  CHECK(raw_expect("GET /v2/models/dlrm%00", RAW("GET /v2/models/dlrm%00 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
                   400, "control byte"));
  CHECK(raw_expect("GET /v2/models/dlrm%0a/ready",
                   RAW("GET /v2/models/dlrm%0a/ready HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), 400,
                   "control byte"));
  CHECK(raw_expect("GET /v2/health/live%7f", RAW("GET /v2/health/live%7f HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
                   400, "control byte"));
  CHECK(raw_expect("a raw 0x01 in the path", RAW("GET /v2/he\x01" "alth/live HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
                   400, "control byte"));
  CHECK(raw_expect("a raw NUL after /v2", RAW("GET /v2\0xyz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), 400, "NUL"));
  CHECK(raw_expect("a raw NUL inside a model path",
                   RAW("GET /v2/models/dlrm\0/ready HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), 400, "NUL"));
  static const char infer_nul[] = "POST /v2/models/dlrm%00/infer HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                                  "Content-Length: 2\r\n\r\n{}";
  CHECK(raw_expect("POST to dlrm%00/infer", RAW(infer_nul), 400, "control byte"));
  /* Escapes of ordinary bytes still decode, and the query is not the path. */
  CHECK(raw_expect("GET /v2/health/%6Cive", RAW("GET /v2/health/%6Cive HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
                   200, NULL));
  CHECK(raw_expect("GET /v2/health/live?x=%00",
                   RAW("GET /v2/health/live?x=%00 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), 200, NULL));
}

/* An infer request of rows idx with the given framing headers (each ending
 * in \r\n) and body as given (chunked or not, as the headers say); checks
 * the status (and the scores on 200). */
static int framing_case(const char *what, const char *headers, const char *body, size_t len, int status,
                        const char *substr, const int *idx, int n) {
  sb req = {0};
  test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: a\r\nConnection: close\r\n%s\r\n", headers);
  test_buf_put(&req, body, len);
  http_resp r;
  int ok = http_raw(req.p, req.n, &r);
  test_buf_free(&req);
  if (!ok) {
    test_fail(__FILE__, __LINE__, "%s: no response: %s", what, r.err);
    http_free(&r);
    return 0;
  }
  count_infer(r.status);
  ok = status == 200 ? scores_match(&r, idx, n, what) : expect_error(&r, status, substr, what);
  http_free(&r);
  return ok && normal_ok(what);
}

SERVE_TEST(serve_05d_framing_headers) {
  /* Request-smuggling shapes: a proxy in front may read the body's length
   * one way and the server another. Each used to be served (the first
   * Content-Length won, chunked won over Content-Length), and an unknown
   * Transfer-Encoding got no answer at all. */
  static const int idx[3] = {5, 6, 7};
  sb body = {0}, chunked = {0};
  build_raw_json(&body, idx, 3, 0, 0, NULL);
  test_buf_printf(&chunked, "%zx\r\n", body.n);
  test_buf_put(&chunked, body.p, body.n);
  sb_str(&chunked, "\r\n0\r\n\r\n");
  char h[256];
  int ok = 1;
  snprintf(h, sizeof h, "Content-Length: %zu\r\nTransfer-Encoding: chunked\r\n", chunked.n);
  ok = ok && framing_case("Content-Length with Transfer-Encoding: chunked", h, chunked.p, chunked.n, 400,
                          "Content-Length together with Transfer-Encoding", idx, 3);
  snprintf(h, sizeof h, "Content-Length: %zu\r\nContent-Length: %zu\r\n", body.n, body.n + 5);
  ok = ok && framing_case("two different Content-Length headers", h, body.p, body.n, 400, "Content-Length", idx, 3);
  ok = ok && framing_case("Transfer-Encoding: gzip", "Transfer-Encoding: gzip\r\n", body.p, body.n, 501, "gzip", idx, 3);
  ok = ok && framing_case("Transfer-Encoding: gzip, chunked", "Transfer-Encoding: gzip, chunked\r\n", chunked.p,
                          chunked.n, 501, "gzip", idx, 3);
  ok = ok && framing_case("Transfer-Encoding: chunked twice",
                          "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", chunked.p, chunked.n, 400,
                          "chunked", idx, 3);
  /* What stays fine: chunked alone (any case), and the same length twice
   * (RFC 9110 allows a recipient to take identical values as one). */
  ok = ok && framing_case("Transfer-Encoding: Chunked", "Transfer-Encoding: Chunked\r\n", chunked.p, chunked.n, 200,
                          NULL, idx, 3);
  snprintf(h, sizeof h, "Content-Length: %zu\r\nContent-Length: %zu\r\n", body.n, body.n);
  ok = ok && framing_case("the same Content-Length twice", h, body.p, body.n, 200, NULL, idx, 3);
  test_buf_free(&body);
  test_buf_free(&chunked);
  CHECK(ok);
}

/* ---- slow clients (slowloris) ---- */

/* A connection to port that has sent a request line and no more (or -1). */
static int slow_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const char *line = "GET /v2/health/live HTTP/1.1\r\n";
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send_all(fd, line, strlen(line)) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

/* One more header line on a slow connection; 0 once the server has
 * answered or closed it (what it said, if anything, goes to said). */
static int slow_tick(int fd, char *said, size_t cap) {
  said[0] = 0;
  ssize_t n = recv(fd, said, cap - 1, 0);
  if (n > 0) said[n] = 0;
  if (n >= 0) return 0; /* an answer, or the end of the stream */
  if (errno != EAGAIN && errno != EWOULDBLOCK) return 0;
  return send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL) == 11;
}

SERVE_TEST(serve_05e_slowloris) {
  /* A server of its own with 16 connection slots and a 1 s request timeout.
   * Slow clients used to keep their connections as long as they sent a
   * byte now and then (the idle timeout never fired), so 16 of them took
   * every slot and health probes were refused. */
  static const char *const args[] = {"--threads", "1", "--max-connections", "16", "--request-timeout-s", "1",
                                     "-q", NULL};
  pid_t pid;
  int port;
  CHECK(start_extra("slowloris.log", args, &pid, &port));
  fx.talk_port = port;
  char said[512];
  /* One slow client alone: 408 after about a second, then closed. */
  int fd = slow_open(port);
  CHECK(fd >= 0);
  double t0 = now_s(), took = -1;
  while (now_s() - t0 < 5) {
    usleep(200000);
    if (!slow_tick(fd, said, sizeof said)) {
      took = now_s() - t0;
      break;
    }
  }
  if (said[0]) { /* the rest of the answer until the end of the stream */
    usleep(50000);
    size_t have = strlen(said);
    ssize_t n = recv(fd, said + have, sizeof said - 1 - have, 0);
    if (n > 0) said[have + (size_t)n] = 0;
  }
  close(fd);
  if (took < 0) test_fail(__FILE__, __LINE__, "a slow client still connected after 5 s (request timeout 1 s)");
  else if (took < 0.8 || took > 2.5) test_fail(__FILE__, __LINE__, "a slow client cut off after %.2f s, expected ~1 s", took);
  else if (strncmp(said, "HTTP/1.1 408", 12) != 0)
    test_fail(__FILE__, __LINE__, "a slow client got '%.80s', expected a 408 response", said);
  CHECK(!test_failed_now());

  /* 24 slow clients (more than the slots), each sending a header line every
   * 200 ms and coming back when cut off, while health probes must each be
   * answered within a second, and no slow connection lives past ~2 s. */
  enum { N_SLOW = 24 };
  int fds[N_SLOW];
  double born[N_SLOW], oldest = 0;
  int opened = 0, probes = 0, probes_ok = 0;
  for (int i = 0; i < N_SLOW; i++) {
    fds[i] = slow_open(port);
    born[i] = now_s();
    opened += fds[i] >= 0;
  }
  char why[512] = "";
  for (t0 = now_s(); now_s() - t0 < 2.5 && opened < 600;) {
    usleep(200000);
    for (int i = 0; i < N_SLOW; i++) {
      if (fds[i] >= 0 && slow_tick(fds[i], said, sizeof said)) continue;
      double life = now_s() - born[i];
      if (fds[i] >= 0 && life > oldest) oldest = life;
      if (fds[i] >= 0) close(fds[i]);
      fds[i] = slow_open(port); /* back for more */
      born[i] = now_s();
      opened++;
    }
    http_resp r;
    double p0 = now_s();
    int got = http_do("GET", "/v2/health/ready", NULL, NULL, 0, &r);
    double pt = now_s() - p0;
    probes++;
    if (got && r.status == 200 && pt < 1.0) probes_ok++;
    else if (!why[0] && got)
      snprintf(why, sizeof why, "probe %d: status %d after %.2f s", probes, r.status, pt);
    else if (!why[0])
      snprintf(why, sizeof why, "probe %d: %.400s after %.2f s", probes, r.err, pt);
    http_free(&r);
  }
  for (int i = 0; i < N_SLOW; i++) {
    if (fds[i] < 0) continue;
    double life = now_s() - born[i];
    if (life > oldest) oldest = life;
    close(fds[i]);
  }
  fx.talk_port = 0;
  fprintf(stderr, "slowloris: %d slow connections opened, %d of %d health probes answered within 1 s, the longest "
          "slow connection lived %.2f s\n", opened, probes_ok, probes, oldest);
  if (probes_ok != probes) test_fail(__FILE__, __LINE__, "health probes under slowloris: %d of %d ok; first failure: %s",
                                     probes_ok, probes, why);
  if (oldest > 2.5) test_fail(__FILE__, __LINE__, "a slow connection lived %.2f s (request timeout 1 s)", oldest);
  CHECK(!test_failed_now());
  /* Operators see the cut-offs: the lone client's 408 at least, and the
   * 24 clients over 16 slots were shed. */
  fx.talk_port = port;
  char *m = NULL;
  int got = get_metrics(&m);
  fx.talk_port = 0;
  CHECK(got);
  double timed_out = metric(m, "dlrec_connections_cut_total{reason=\"request_timeout\"}");
  double shed = metric(m, "dlrec_connections_cut_total{reason=\"shed\"}");
  free(m);
  if (timed_out < 1 || shed < 1)
    test_fail(__FILE__, __LINE__, "/metrics counts %.0f request timeouts and %.0f sheds, expected at least 1 of each",
              timed_out, shed);
  CHECK(!test_failed_now());
  CHECK(stop_extra(pid, "slowloris.log"));
}

/* ---- request memory: the body limit, the pre-scan, the in-flight budget, idle connections ---- */

/* The request memory gauges of the server at fx.talk_port. */
static int memory_gauges(double *buffer, double *inflight) {
  char *m = NULL;
  if (!get_metrics(&m)) return 0;
  int ok = has_series(m, "dlrec_serve_request_buffer_bytes") && has_series(m, "dlrec_serve_inflight_bytes");
  if (!ok) test_fail(__FILE__, __LINE__, "/metrics has no dlrec_serve_request_buffer_bytes or dlrec_serve_inflight_bytes");
  *buffer = metric(m, "dlrec_serve_request_buffer_bytes");
  *inflight = metric(m, "dlrec_serve_inflight_bytes");
  free(m);
  return ok;
}

/* POST .../infer with this body (Content-Length: declared, the body may be
 * shorter: then the server is to answer from the headers alone). */
static int infer_raw(const char *body, size_t len, size_t declared, http_resp *r) {
  sb req = {0};
  test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                  "Content-Length: %zu\r\n\r\n", declared);
  test_buf_put(&req, body, len);
  int ok = http_raw(req.p, req.n, r);
  test_buf_free(&req);
  if (!ok) test_fail(__FILE__, __LINE__, "POST infer (%zu bytes): no response: %s", declared, r->err);
  return ok;
}

/* body padded with blanks (inside its outer object) to exactly n bytes. */
static void pad_to(sb *body, size_t n) {
  if (body->n >= n) return;
  body->n--; /* the closing brace */
  while (body->n + 1 < n) sb_str(body, " ");
  sb_str(body, "}");
}

SERVE_TEST(serve_05f_request_memory) {
  /* The default body limit follows --max-batch: 64 KiB + 64 bytes x 8 rows
   * x the model's values per row (its dense and categorical columns, each
   * multi-hot one at its max hotness, and a ROWINDEX offset per column). */
  char ckpt[1024], etl_dir[1100];
  CHECK_OK(dlrec_checkpoint_resolve(fx.run, ckpt, sizeof ckpt));
  snprintf(etl_dir, sizeof etl_dir, "%s/etl", ckpt);
  dlrec_etl *etl = NULL;
  CHECK_OK(dlrec_etl_load(&etl, etl_dir));
  const dlrec_schema *es = dlrec_etl_schema(etl);
  uint64_t values = es->n_dense + es->n_sparse;
  for (uint32_t c = 0; c < es->n_sparse; c++) values += es->sparse[c].max_hotness ? es->sparse[c].max_hotness : 1;
  dlrec_etl_free(etl);
  const size_t limit = 65536 + 64 * 8 * values;
  /* The budget lets one body of the limit be parsed when it holds few
   * values (the body, its JSON twice, 80 bytes a value), not when it holds
   * many. */
  const uint64_t budget = 3 * (uint64_t)limit + 4096;
  char budget_arg[32];
  snprintf(budget_arg, sizeof budget_arg, "%llu", (unsigned long long)budget);
  const char *const args[] = {"--threads", "1", "--max-batch", "8", "--max-inflight-bytes", budget_arg, "-q", NULL};
  pid_t pid;
  int port;
  CHECK(start_extra("memory.log", args, &pid, &port));
  fx.talk_port = port;
  http_resp r;
  char want[160];
  /* One byte over the limit: 413 from the headers alone, naming the limit. */
  snprintf(want, sizeof want, "over the limit of %zu bytes (65536 + 64 x --max-batch 8", limit);
  int ok = infer_raw("", 0, limit + 1, &r) && expect_error(&r, 413, want, "a body one byte over the default limit");
  http_free(&r);
  /* Exactly the limit, few values: read and parsed ("inputs" is empty: 400). */
  sb body = {0};
  sb_str(&body, "{\"inputs\":[]}");
  pad_to(&body, limit);
  ok = ok && infer_raw(body.p, body.n, body.n, &r) && expect_error(&r, 400, "inputs: empty", "a body of the limit");
  http_free(&r);
  /* The limit again with 1400 values (fewer than the pre-scan's 8 x (65 +
   * 8) + 1024; the shape, which the parse would find wrong, is within its
   * limits): parsing it would pass the budget: 503. */
  test_buf_free(&body);
  sb_str(&body, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[0");
  for (int i = 1; i < 1400; i++) sb_str(&body, ",0");
  sb_str(&body, "]}]}");
  pad_to(&body, limit);
  ok = ok && infer_raw(body.p, body.n, body.n, &r) &&
       expect_error(&r, 503, "--max-inflight-bytes", "a body whose parse passes the in-flight budget");
  http_free(&r);
  test_buf_free(&body);
  /* 9 rows for --max-batch 8: refused from the shape, before the JSON is
   * parsed: what follows the shape is not JSON at all, and cJSON would have
   * said so. */
  sb_str(&body, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[9,13],\"data\":[###");
  ok = ok && infer_raw(body.p, body.n, body.n, &r) &&
       expect_error(&r, 400, "inputs[0]: shape [9, ...]: 9 rows, more than the limit of 8 per request (--max-batch; "
                    "refused before parsing)", "9 rows, then bytes that are not JSON");
  http_free(&r);
  test_buf_free(&body);
  CHECK(ok);
  /* Refused requests hold nothing once answered. */
  double buffer = -1, inflight = -1;
  CHECK(memory_gauges(&buffer, &inflight));
  if (buffer != 0 || inflight != 0)
    test_fail(__FILE__, __LINE__, "after refused requests: %.0f request buffer bytes, %.0f in flight, expected 0",
              buffer, inflight);
  /* Requests of 8 rows on 6 keep-alive connections, one after another, the
   * connections left open: they share one pooled rows object, and hold
   * nothing more while idle (each connection used to keep its own). */
  enum { CONNS = 6 };
  static const int idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  sb good = {0}, req = {0}, buf[CONNS] = {{0}};
  build_raw_json(&good, idx, 8, 0, 0, NULL);
  test_buf_printf(&req, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n\r\n",
                  good.n);
  test_buf_put(&req, good.p, good.n);
  int fds[CONNS];
  double one = -1;
  char err[512];
  for (int i = 0; i < CONNS; i++) {
    size_t at = 0;
    fds[i] = http_connect(err, sizeof err);
    if (fds[i] < 0) test_fail(__FILE__, __LINE__, "%s", err);
    for (int k = 0; k < 2 && fds[i] >= 0 && !test_failed_now(); k++) {
      if (exchange(fds[i], req.p, req.n, &buf[i], &at, &r, "8 rows on a keep-alive connection"))
        scores_match(&r, idx, 8, "8 rows on a keep-alive connection");
      http_free(&r);
    }
    if (i == 0 && !test_failed_now() && memory_gauges(&one, &inflight) && (one <= 0 || inflight != 0))
      test_fail(__FILE__, __LINE__, "after one request: %.0f request buffer bytes (expected a rows object's), "
                "%.0f in flight (expected 0)", one, inflight);
  }
  if (!test_failed_now() && memory_gauges(&buffer, &inflight) && (buffer != one || inflight != 0))
    test_fail(__FILE__, __LINE__, "%d idle keep-alive connections after %d requests: %.0f request buffer bytes "
              "(expected %.0f, one pooled rows object), %.0f in flight (expected 0)", CONNS, 2 * CONNS, buffer, one,
              inflight);
  for (int i = 0; i < CONNS; i++) {
    if (fds[i] >= 0) close(fds[i]);
    test_buf_free(&buf[i]);
  }
  test_buf_free(&good);
  test_buf_free(&req);
  fx.talk_port = 0;
  CHECK(!test_failed_now());
  CHECK(stop_extra(pid, "memory.log"));
}

/* POST /v2/repository/index: the one model's state and version ("" when
 * absent). 0 and err when the answer is not a one-model index of dlrm. */
static int repo_index(char *state, char *version, size_t cap, char *err, size_t errcap) {
  http_resp r;
  state[0] = version[0] = 0;
  if (!http_do("POST", "/v2/repository/index", NULL, "", 0, &r)) {
    snprintf(err, errcap, "no response: %.400s", r.err);
    http_free(&r);
    return 0;
  }
  cJSON *j = r.status == 200 ? cJSON_ParseWithLength(r.body, r.body_len) : NULL;
  const cJSON *m = cJSON_IsArray(j) && cJSON_GetArraySize(j) == 1 ? cJSON_GetArrayItem(j, 0) : NULL;
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(m, "version");
  const cJSON *st = cJSON_GetObjectItemCaseSensitive(m, "state");
  int ok = cJSON_IsString(name) && !strcmp(name->valuestring, "dlrm") && cJSON_IsString(st) &&
           (!ver || cJSON_IsString(ver));
  if (ok) {
    snprintf(state, cap, "%s", st->valuestring);
    if (ver) snprintf(version, cap, "%s", ver->valuestring);
  } else {
    snprintf(err, errcap, "status %d, not a one-model index of dlrm: %.300s", r.status, r.body ? r.body : "");
  }
  cJSON_Delete(j);
  http_free(&r);
  return ok;
}

/* The index must say READY with version. */
static int index_ready(const char *version) {
  char state[64], ver[64], err[512];
  if (!repo_index(state, ver, sizeof state, err, sizeof err)) {
    test_fail(__FILE__, __LINE__, "repository index: %s", err);
    return 0;
  }
  if (strcmp(state, "READY") || strcmp(ver, version)) {
    test_fail(__FILE__, __LINE__, "repository index: state %s, version \"%s\"; expected READY, \"%s\"", state, ver,
              version);
    return 0;
  }
  return 1;
}

SERVE_TEST(serve_06_repository) {
  CHECK(index_ready("5"));
  http_resp r;
  REQ("POST", "/v2/repository/models/dlrm/unload", NULL, "", 0, &r);
  CHECK(expect_status(&r, 200, "unload dlrm"));
  http_free(&r);
  REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 503, "GET /v2/models/dlrm/ready after unload"));
  http_free(&r);
  REQ("GET", "/v2/health/ready", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 503, "GET /v2/health/ready after unload"));
  http_free(&r);
  REQ("GET", "/v2/health/live", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2/health/live after unload"));
  http_free(&r);
  static const int idx[3] = {0, 1, 2};
  sb s = {0};
  build_raw_json(&s, idx, 3, 0, 0, NULL);
  REQ("POST", "/v2/models/dlrm/infer", NULL, s.p, s.n, &r);
  test_buf_free(&s);
  CHECK(expect_error(&r, 503, "dlrm", "infer after unload"));
  http_free(&r);
  char state[64], ver[64], err[512];
  if (!repo_index(state, ver, sizeof state, err, sizeof err)) test_fail(__FILE__, __LINE__, "index after unload: %s", err);
  CHECK(!test_failed_now());
  if (!strcmp(state, "READY")) test_fail(__FILE__, __LINE__, "index after unload: state READY, version \"%s\"", ver);
  CHECK(strcmp(state, "READY") != 0);

  REQ("POST", "/v2/repository/models/dlrm/load", NULL, "", 0, &r);
  CHECK(expect_status(&r, 200, "load dlrm"));
  http_free(&r);
  REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2/models/dlrm/ready after load"));
  http_free(&r);
  CHECK(index_ready("5"));
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  CHECK(infer_json_check("40 rows after unload and load", all, N_FULL, 0, 0, NULL, NULL));

  REQ("POST", "/v2/repository/models/nosuch/load", NULL, "", 0, &r);
  CHECK(expect_error(&r, 404, "nosuch", "load of an unknown model"));
  http_free(&r);
  REQ("POST", "/v2/repository/models/nosuch/unload", NULL, "", 0, &r);
  CHECK(expect_error(&r, 404, "nosuch", "unload of an unknown model"));
  http_free(&r);
  REQ("POST", "/v2/repository/models/dlrm/reload", NULL, "", 0, &r);
  CHECK(expect_error(&r, 404, NULL, "an unknown repository action"));
  http_free(&r);
  CHECK(normal_ok("the repository requests"));
}

/* ---- model control: off by default, a token, one load at a time ---- */

/* POST path with extra headers (or NULL); the status, 0 when no response. */
static int post_status(const char *path, const char *hdrs, http_resp *r) {
  if (!http_do("POST", path, hdrs, "", 0, r)) {
    test_fail(__FILE__, __LINE__, "POST %s: no response: %s", path, r->err);
    return 0;
  }
  return r->status;
}

typedef struct load_client {
  int port;
  const char *auth;
  int status;
  char err[256];
} load_client;

/* One POST .../load with the token, on its own connection. */
static void *load_main(void *arg) {
  load_client *c = arg;
  char req[512];
  int n = snprintf(req, sizeof req, "POST /v2/repository/models/dlrm/load HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                   "Content-Length: 0\r\n%s\r\n", c->auth);
  http_resp r;
  if (http_raw(req, (size_t)n, &r)) c->status = r.status;
  else snprintf(c->err, sizeof c->err, "%.200s", r.err);
  http_free(&r);
  return NULL;
}

SERVE_TEST(serve_06b_model_control) {
  /* Off by default: load and unload used to be open to any client. */
  static const char *const off_args[] = {"--threads", "1", "-q", NULL};
  pid_t pid;
  int port;
  CHECK(start_extra("control-off.log", off_args, &pid, &port));
  fx.talk_port = port;
  http_resp r;
  int st = post_status("/v2/repository/models/dlrm/unload", NULL, &r);
  int ok = st && expect_error(&r, 403, "--model-control explicit", "unload with model control off");
  http_free(&r);
  st = ok ? post_status("/v2/repository/models/dlrm/load", NULL, &r) : 0;
  ok = ok && st && expect_error(&r, 403, "--model-control explicit", "load with model control off");
  http_free(&r);
  if (ok) {
    REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
    ok = expect_status(&r, 200, "the model after a refused unload");
    http_free(&r);
  }
  fx.talk_port = 0;
  CHECK(ok);
  CHECK(stop_extra(pid, "control-off.log"));

  /* The token: refused options first (they fail before listening). */
  char *out = NULL;
  int rc = test_run_cli(&out, "serve --model '%s' --port 0 --port-file /nonexistent/port --model-control-token-file '%s'",
                        fx.run, fxp("token"));
  ok = rc != 0 && out && strstr(out, "needs --model-control explicit");
  if (!ok) test_fail(__FILE__, __LINE__, "a token file without --model-control explicit: rc %d: %s", rc, out ? out : "");
  free(out);
  CHECK(ok);
  CHECK(test_write_file(fxp("token"), "short\n", 6) == 0);
  out = NULL;
  rc = test_run_cli(&out, "serve --model '%s' --port 0 --port-file /nonexistent/port --model-control explicit "
                    "--model-control-token-file '%s'", fx.run, fxp("token"));
  ok = rc != 0 && out && strstr(out, fxp("token")) && strstr(out, "at least 16");
  if (!ok) test_fail(__FILE__, __LINE__, "a 5-character token: rc %d: %s", rc, out ? out : "");
  free(out);
  CHECK(ok);

  static const char token[] = "k3y-0f-the-m0del-c0ntrol";
  char token_line[64];
  snprintf(token_line, sizeof token_line, "%s\n", token);
  CHECK(test_write_file(fxp("token"), token_line, strlen(token_line)) == 0);
  const char *const tok_args[] = {"--threads", "1", "--model-control", "explicit", "--model-control-token-file",
                                  fxp("token"), "-q", NULL};
  CHECK(start_extra("control-token.log", tok_args, &pid, &port));
  fx.talk_port = port;
  static const char *const wrong[] = {
      NULL,
      "Authorization: Bearer wrong\r\n",
      "Authorization: Bearer k3y-0f-the-m0del-c0ntro\r\n",   /* a prefix */
      "Authorization: Bearer k3y-0f-the-m0del-c0ntrolx\r\n", /* one more */
      "Authorization: Basic k3y-0f-the-m0del-c0ntrol\r\n",
      "Authorization: Bearer\r\n",
  };
  ok = 1;
  for (int i = 0; ok && i < (int)(sizeof wrong / sizeof *wrong); i++) {
    char what[160], v[64];
    snprintf(what, sizeof what, "unload with %s", wrong[i] ? wrong[i] : "no Authorization header");
    st = post_status("/v2/repository/models/dlrm/unload", wrong[i], &r);
    ok = st && expect_error(&r, 401, "token", what);
    if (ok && !(http_header(&r, "WWW-Authenticate", v, sizeof v) && !strcmp(v, "Bearer"))) {
      test_fail(__FILE__, __LINE__, "%s: no WWW-Authenticate: Bearer", what);
      ok = 0;
    }
    http_free(&r);
  }
  char auth[128];
  snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
  if (ok) {
    REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
    ok = expect_status(&r, 200, "the model after refused unloads");
    http_free(&r);
  }
  ok = ok && post_status("/v2/repository/models/dlrm/unload", auth, &r) == 200;
  if (!ok && r.status) test_fail(__FILE__, __LINE__, "unload with the token: %d %s", r.status, r.body);
  http_free(&r);
  if (ok) {
    REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
    ok = expect_status(&r, 503, "the model after an unload with the token");
    http_free(&r);
  }

  /* 32 loads at once, each with the token: every one answers 200. */
  enum { N_LOADS = 32 };
  load_client lc[N_LOADS];
  pthread_t th[N_LOADS];
  int started = 0;
  for (; ok && started < N_LOADS; started++) {
    lc[started] = (load_client){.port = port, .auth = auth};
    if (pthread_create(&th[started], NULL, load_main, &lc[started]) != 0) break;
  }
  for (int i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    if (lc[i].status != 200) {
      test_fail(__FILE__, __LINE__, "concurrent load %d: status %d %s", i, lc[i].status, lc[i].err);
      ok = 0;
    }
  }
  if (ok) {
    REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
    ok = expect_status(&r, 200, "the model after 32 concurrent loads");
    http_free(&r);
  }
  fx.talk_port = 0;
  CHECK(ok);
  CHECK(stop_extra(pid, "control-token.log"));
}

/* serve_06c's hook: holds the one load open until every other request has
 * folded into it (or 3 s passed), so that the test does not depend on how
 * the threads are scheduled. */
static atomic_int fold_hook_calls;
static int fold_expected_waiters;

static void fold_hold(serve_registry *r) {
  atomic_fetch_add(&fold_hook_calls, 1);
  for (double t0 = now_s(); now_s() - t0 < 3; usleep(1000)) {
    pthread_mutex_lock(&r->mu);
    int w = (int)r->load_waiters;
    pthread_mutex_unlock(&r->mu);
    if (w >= fold_expected_waiters) break;
  }
}

static void *fold_main(void *arg) {
  void **a = arg;
  *(dlrec_status *)a[1] = serve_registry_load(a[0]);
  return NULL;
}

SERVE_TEST(serve_06c_concurrent_loads_fold) {
  /* The registry in process: 16 load requests at once used to load 16
   * copies of the model side by side; they must share one load. */
  enum { N = 16 };
  serve_registry reg;
  dlrec_log_level level = dlrec_log_get_level();
  dlrec_log_set_level(DLREC_LOG_WARN); /* no "serving ..." line per load */
  CHECK_OK(serve_registry_open(&reg, fx.run, NULL));
  reg.load_hook = fold_hold;
  fold_expected_waiters = N - 1;
  atomic_store(&fold_hook_calls, 0);
  pthread_t th[N];
  dlrec_status st[N];
  void *args[N][2];
  int started = 0;
  for (; started < N; started++) {
    args[started][0] = &reg;
    args[started][1] = &st[started];
    if (pthread_create(&th[started], NULL, fold_main, args[started]) != 0) break;
  }
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  uint64_t loads = reg.loads_ok;
  int calls = atomic_load(&fold_hook_calls), all_ok = 1;
  for (int i = 0; i < started; i++) all_ok &= st[i] == DLREC_OK;
  /* A later request is a load of its own (a reload), not an old result. */
  fold_expected_waiters = 0;
  dlrec_status later = serve_registry_load(&reg);
  uint64_t loads_later = reg.loads_ok;
  serve_registry_close(&reg);
  dlrec_log_set_level(level);
  CHECK_EQ(started, N);
  CHECK(all_ok);
  CHECK_EQ(calls, 1);
  CHECK_EQ_U64(loads, 2); /* the open's and the one shared load */
  CHECK_OK(later);
  CHECK_EQ_U64(loads_later, 3);
}

/* ---- hot reload under concurrency ---- */

#define N_CLIENTS 8
#define MAX_CLIENT_ERRORS 50

typedef struct rec {
  int phase;   /* 1: the reload by training, 2: the flip-flop, 0: sent in 1, answered in 2 */
  int status;  /* 0: no response */
  int version; /* 5, 10, or -1 for anything else */
  int n;
  int idx[7];
  float s[7];
} rec;

typedef struct client {
  pthread_t th;
  unsigned seed;
  rec *recs;
  size_t n, cap;
  int errors;
  char err[1024]; /* the first error */
  atomic_int done_one, seen10;
} client;

static atomic_int hr_stop, hr_seen10, hr_phase;

static void client_error(client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void client_error(client *c, const char *fmt, ...) {
  if (!c->errors++) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
  }
}

static void *client_main(void *arg) {
  client *c = arg;
  sb s = {0};
  while (!atomic_load(&hr_stop) && c->errors < MAX_CLIENT_ERRORS) {
    rec rc = {0};
    rc.phase = atomic_load(&hr_phase);
    rc.n = 1 + (int)(rand_r(&c->seed) % 7);
    int perm[N_FULL];
    for (int i = 0; i < N_FULL; i++) perm[i] = i;
    for (int i = 0; i < rc.n; i++) {
      int j = i + (int)(rand_r(&c->seed) % (unsigned)(N_FULL - i));
      int t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
      rc.idx[i] = perm[i];
    }
    s.n = 0;
    build_raw_json(&s, rc.idx, rc.n, rand_r(&c->seed) & 1, 0, NULL);
    http_resp r;
    if (!http_do("POST", "/v2/models/dlrm/infer", NULL, s.p, s.n, &r)) {
      client_error(c, "no response: %s", r.err);
    } else {
      rc.status = r.status;
      infer_out o;
      char err[1024];
      if (!parse_infer(&r, 0, &o, err, sizeof err)) {
        client_error(c, "%s", err);
      } else if (o.n != rc.n) {
        client_error(c, "%d scores for %d rows", o.n, rc.n);
      } else {
        rc.version = !strcmp(o.version, "5") ? 5 : !strcmp(o.version, "10") ? 10 : -1;
        if (rc.version < 0) client_error(c, "model_version \"%s\"", o.version);
        memcpy(rc.s, o.s, (size_t)rc.n * sizeof(float));
      }
    }
    http_free(&r);
    /* A request in flight when phase 2 began (its first flip is back to
     * version 5) belongs to neither phase: only the scores are checked. */
    if (atomic_load(&hr_phase) != rc.phase) rc.phase = 0;
    if (c->n == c->cap) {
      size_t cap = c->cap ? c->cap * 2 : 1024;
      rec *p = realloc(c->recs, cap * sizeof *p);
      if (!p) abort();
      c->recs = p;
      c->cap = cap;
    }
    c->recs[c->n++] = rc;
    if (rc.version == 10 && !atomic_exchange(&c->seen10, 1)) atomic_fetch_add(&hr_seen10, 1);
    atomic_store(&c->done_one, 1);
  }
  test_buf_free(&s);
  return NULL;
}

/* Points RUN/latest at checkpoint `step`, atomically, as a save does. */
static dlrec_status point_latest_in(const char *run, uint64_t step) {
  char path[1200], text[64];
  snprintf(path, sizeof path, "%s/latest", run);
  int n = snprintf(text, sizeof text, "ckpt-%012llu\n", (unsigned long long)step);
  return dlrec_write_file_atomic(path, text, (size_t)n);
}

static dlrec_status point_latest(uint64_t step) { return point_latest_in(fx.run, step); }

/* Phase 1: 8 clients send requests of 1-7 random rows while `train
 * --resume` writes version 10, until each has seen it. Phase 2: RUN/latest
 * flips between versions 5 and 10 (a rollback and back, again and again)
 * while they go on, so that many swaps happen with requests in flight.
 * Every response must carry one version and only that version's scores. */
SERVE_TEST(serve_07_hot_reload_under_load) {
  static client cl[N_CLIENTS];
  memset(cl, 0, sizeof cl);
  atomic_store(&hr_stop, 0);
  atomic_store(&hr_seen10, 0);
  atomic_store(&hr_phase, 1);
  int started = 0;
  for (; started < N_CLIENTS; started++) {
    cl[started].seed = 1234u + 77u * (unsigned)started;
    if (pthread_create(&cl[started].th, NULL, client_main, &cl[started]) != 0) break;
  }
  /* Every client has a response of version 5 before the new version is trained. */
  double t0 = now_s();
  int ready = 0;
  while (started == N_CLIENTS && now_s() - t0 < 30) {
    ready = 0;
    for (int i = 0; i < N_CLIENTS; i++) ready += atomic_load(&cl[i].done_one);
    if (ready == N_CLIENTS) break;
    usleep(5000);
  }
  int train_rc = -1, seen = 0, flips = 0, back_on_10 = 0;
  double t_train = 0, t_seen = 0, loads_before = 0, loads_after = 0;
  if (started == N_CLIENTS && ready == N_CLIENTS) {
    double t1 = now_s();
    train_rc = cli("train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
                   test_source_path("examples/dlrm_synth.json"), fxp("train.dlr"), fxp("etl"), fx.run);
    t_train = now_s() - t1;
    while (train_rc == 0 && atomic_load(&hr_seen10) < N_CLIENTS && now_s() - t1 < 30) usleep(2000);
    t_seen = now_s() - t1;
    seen = atomic_load(&hr_seen10);
    usleep(100000); /* some more requests on version 10 */
  }
  if (train_rc == 0 && seen == N_CLIENTS) {
    char *m;
    if (get_metrics(&m)) loads_before = metric(m, "dlrec_model_loads_total{result=\"ok\"}");
    free(m);
    atomic_store(&hr_phase, 2);
    for (; flips < 10; flips++) {
      if (point_latest(flips % 2 ? 10 : 5) != DLREC_OK) {
        test_fail(__FILE__, __LINE__, "%s", dlrec_last_error());
        break;
      }
      usleep(150000);
    }
    /* Back on 10 (the last flip): wait until the server says so. */
    for (double t2 = now_s(); now_s() - t2 < 10 && !back_on_10; usleep(20000)) {
      char state[64], ver[64], err[512];
      back_on_10 = repo_index(state, ver, sizeof state, err, sizeof err) && !strcmp(ver, "10");
    }
    if (get_metrics(&m)) loads_after = metric(m, "dlrec_model_loads_total{result=\"ok\"}");
    free(m);
  }
  atomic_store(&hr_stop, 1);
  for (int i = 0; i < started; i++) pthread_join(cl[i].th, NULL);

  size_t total = 0, v5 = 0, v10 = 0;
  for (int i = 0; i < started; i++) {
    total += cl[i].n;
    for (size_t k = 0; k < cl[i].n; k++) {
      v5 += cl[i].recs[k].version == 5;
      v10 += cl[i].recs[k].version == 10;
    }
  }
  fprintf(stderr, "hot reload: %zu responses (%zu of version 5, %zu of version 10); resumed training took %.2f s, "
          "all clients saw version 10 %.2f s after it started; %d flips of RUN/latest, %.0f loads\n", total, v5, v10,
          t_train, t_seen, flips, loads_after - loads_before);
  int ok = started == N_CLIENTS && ready == N_CLIENTS && train_rc == 0 && !test_failed_now();
  if (started < N_CLIENTS) test_fail(__FILE__, __LINE__, "started %d of %d client threads", started, N_CLIENTS);
  else if (ready < N_CLIENTS) test_fail(__FILE__, __LINE__, "only %d of %d clients got a response in 30 s", ready, N_CLIENTS);
  else if (train_rc != 0) test_fail(__FILE__, __LINE__, "train --resume --max-steps 10 failed (%d)", train_rc);
  if (ok && seen < N_CLIENTS) {
    test_fail(__FILE__, __LINE__, "only %d of %d clients saw version 10 within 30 s; server log:\n%s", seen,
              N_CLIENTS, server_log_tail());
    ok = 0;
  }
  if (ok && !back_on_10) {
    test_fail(__FILE__, __LINE__, "the server does not serve version 10 again 10 s after RUN/latest named it; log:\n%s",
              server_log_tail());
    ok = 0;
  }
  if (ok && loads_after - loads_before < 3) {
    test_fail(__FILE__, __LINE__, "%d flips of RUN/latest, but the server loaded only %.0f checkpoints", flips,
              loads_after - loads_before);
    ok = 0;
  }
  for (int i = 0; ok && i < started; i++)
    if (cl[i].errors) {
      test_fail(__FILE__, __LINE__, "client %d: %d bad responses; the first: %s", i, cl[i].errors, cl[i].err);
      ok = 0;
    }
  /* References of version 10. */
  if (ok) {
    char ckpt[1200];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-000000000010", fx.run);
    ok = cli("predict -q --model '%s' --input '%s' --no-label --out '%s'", ckpt, fxp("rows.tsv"),
             fxp("scores10.txt")) == 0 &&
         read_scores(fxp("scores10.txt"), fx.ref10, N_ALL);
    if (!ok) test_fail(__FILE__, __LINE__, "predict with version 10 failed");
  }
  if (ok) {
    fx.ref = fx.ref10;
    snprintf(fx.version, sizeof fx.version, "10");
    int differ = 0;
    for (int i = 0; i < N_FULL; i++) differ += memcmp(&fx.ref5[i], &fx.ref10[i], 4) != 0;
    if (differ < N_FULL / 2) {
      test_fail(__FILE__, __LINE__, "versions 5 and 10 differ in only %d of %d scores: the check cannot tell them apart",
                differ, N_FULL);
      ok = 0;
    }
  }
  /* Every response: 200, one version, all scores that version's; and in
   * phase 1 a client that got version 10 never gets 5 again (its next
   * request starts after the swap). */
  for (int i = 0; ok && i < started; i++)
    for (size_t k = 0, got10 = 0; ok && k < cl[i].n; k++) {
      const rec *rc = &cl[i].recs[k];
      if (rc->phase == 1 && rc->version == 10 && !got10) got10 = k + 1;
      if (rc->phase == 1 && got10 && rc->version == 5) {
        test_fail(__FILE__, __LINE__, "client %d: request %zu got version 5 after request %zu got 10", i, k, got10 - 1);
        ok = 0;
        break;
      }
      infer_out o = {.n = rc->n};
      memcpy(o.s, rc->s, sizeof rc->s);
      char err[1024];
      if (rc->status != 200) {
        test_fail(__FILE__, __LINE__, "client %d, request %zu: status %d", i, k, rc->status);
        ok = 0;
      } else if (!scores_equal(&o, rc->idx, rc->n, rc->version == 5 ? fx.ref5 : fx.ref10, err, sizeof err)) {
        char other[1024];
        int other_ok = scores_equal(&o, rc->idx, rc->n, rc->version == 5 ? fx.ref10 : fx.ref5, other, sizeof other);
        test_fail(__FILE__, __LINE__, "client %d, request %zu (phase %d, %d rows, model_version %d): %s%s", i, k,
                  rc->phase, rc->n, rc->version, err, other_ok ? " -- the scores are the OTHER version's" : "");
        ok = 0;
      }
    }
  for (int i = 0; i < started; i++) free(cl[i].recs);
  CHECK(ok);
  CHECK(v5 > 0 && v10 > 0);
  /* And now the server serves 10. */
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  CHECK(infer_json_check("40 rows after the reloads", all, N_FULL, 0, 0, NULL, NULL));
  CHECK(index_ready("10"));
}

/* ---- a corrupt checkpoint ---- */

static int copy_dir(const char *src, const char *dst) {
  if (mkdir(dst, 0755) != 0) {
    fprintf(stderr, "mkdir %s: %s\n", dst, strerror(errno));
    return 0;
  }
  DIR *d = opendir(src);
  if (!d) return 0;
  struct dirent *e;
  int ok = 1;
  while (ok && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/%s", src, e->d_name);
    snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
    struct stat st;
    if (stat(a, &st) != 0) ok = 0;
    else if (S_ISDIR(st.st_mode)) ok = copy_dir(a, b);
    else if (dlrec_copy_file(a, b) != DLREC_OK) {
      fprintf(stderr, "%s\n", dlrec_last_error());
      ok = 0;
    }
  }
  closedir(d);
  return ok;
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return 0;
  int ok = fseek(f, offset, SEEK_SET) == 0;
  int c = ok ? fgetc(f) : EOF;
  ok = c != EOF && fseek(f, offset, SEEK_SET) == 0 && fputc(c ^ 0x40, f) != EOF;
  return fclose(f) == 0 && ok;
}

SERVE_TEST(serve_08_corrupt_checkpoint_is_refused) {
  char cur[1024], bad[1200], path[1400];
  CHECK_OK(dlrec_checkpoint_resolve(fx.run, cur, sizeof cur));
  snprintf(bad, sizeof bad, "%s/ckpt-000000000099", fx.run);
  CHECK(copy_dir(cur, bad));
  /* A flipped byte in the largest file that serving reads (optim.bin is
   * bigger, but a model for scoring does not load it). */
  char dense[1400], table[1400];
  snprintf(dense, sizeof dense, "%s/dense.bin", bad);
  snprintf(table, sizeof table, "%s/table.bin", bad);
  const char *victim = file_size(dense) >= file_size(table) ? dense : table;
  CHECK(file_size(victim) > 1000);
  CHECK(flip_byte(victim, file_size(victim) / 2));
  /* The copy says step 99, so that were it served, its responses would say so. */
  snprintf(path, sizeof path, "%s/manifest.json", bad);
  cJSON *man;
  CHECK_OK(dlrec_json_read(path, &man));
  cJSON *step = cJSON_GetObjectItemCaseSensitive(man, "step");
  if (cJSON_IsNumber(step)) cJSON_SetNumberValue(step, 99);
  /* Sealed again, so that the flipped byte is what the loader refuses. */
  dlrec_status st = cJSON_IsNumber(step) ? dlrec_json_write_sealed(path, man, "checksum") : DLREC_ERR_CORRUPT;
  cJSON_Delete(man);
  CHECK_OK(st);
  /* The loader refuses it (the CLI says so). */
  char *out = NULL;
  int rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --no-label --out '%s'", bad, fxp("rows.tsv"),
                        fxp("scores99.txt"));
  int refused = rc != 0 && out && strstr(out, "checksum");
  if (!refused) test_fail(__FILE__, __LINE__, "predict on the corrupt checkpoint: %d: %s", rc, out ? out : "");
  free(out);
  CHECK(refused);

  char *m;
  CHECK(get_metrics(&m));
  double oks0 = metric(m, "dlrec_model_loads_total{result=\"ok\"}");
  double errors0 = metric(m, "dlrec_model_loads_total{result=\"error\"}");
  free(m);
  CHECK_EQ(errors0, 0);
  /* Point RUN/latest at it, as a checkpoint save does. */
  CHECK_OK(point_latest(99));
  double t0 = now_s(), waited = -1;
  int rows[5];
  for (int iter = 0; now_s() - t0 < 5; iter++) {
    for (int i = 0; i < 5; i++) rows[i] = (iter * 5 + i) % N_FULL;
    CHECK(infer_json_check("a request while the corrupt checkpoint is refused", rows, 5, 0, 0, NULL, NULL));
    char *m;
    CHECK(get_metrics(&m));
    double errors = metric(m, "dlrec_model_loads_total{result=\"error\"}");
    free(m);
    if (errors >= 1) {
      waited = now_s() - t0;
      break;
    }
    usleep(20000);
  }
  if (waited < 0)
    test_fail(__FILE__, __LINE__, "no failed load in /metrics 5 s after RUN/latest named the corrupt checkpoint; "
              "server log:\n%s", server_log_tail());
  CHECK(waited >= 0);
  fprintf(stderr, "corrupt checkpoint: refused within %.2f s\n", waited);
  /* It is not retried, and the old version keeps serving. */
  usleep(500000);
  CHECK(get_metrics(&m));
  double errors = metric(m, "dlrec_model_loads_total{result=\"error\"}");
  double oks = metric(m, "dlrec_model_loads_total{result=\"ok\"}");
  double version = metric(m, "dlrec_model_version{model=\"dlrm\"}");
  free(m);
  CHECK_EQ(errors, 1);
  CHECK_EQ(oks, oks0); /* nothing loaded since */
  CHECK_EQ(version, atoi(fx.version));
  int all[N_FULL];
  for (int i = 0; i < N_FULL; i++) all[i] = i;
  CHECK(infer_json_check("40 rows after the refused checkpoint", all, N_FULL, 0, 0, NULL, NULL));
  CHECK(index_ready(fx.version));
  http_resp r;
  REQ("GET", "/v2/models/dlrm/ready", NULL, NULL, 0, &r);
  CHECK(expect_status(&r, 200, "GET /v2/models/dlrm/ready after the refused checkpoint"));
  http_free(&r);
  const char *log = server_log_tail();
  if (!strstr(log, "ckpt-000000000099")) test_fail(__FILE__, __LINE__, "the server log does not name the refused "
                                                   "checkpoint:\n%s", log);
  /* A repository load of the corrupt checkpoint fails, and changes nothing. */
  REQ("POST", "/v2/repository/models/dlrm/load", NULL, "", 0, &r);
  int failed = r.status >= 400 && r.status < 600;
  if (!failed) test_fail(__FILE__, __LINE__, "repository load of a corrupt checkpoint: status %d: %s", r.status, r.body);
  CHECK(failed);
  CHECK(expect_error(&r, r.status, "checksum", "repository load of a corrupt checkpoint"));
  http_free(&r);
  CHECK(get_metrics(&m));
  errors = metric(m, "dlrec_model_loads_total{result=\"error\"}");
  oks = metric(m, "dlrec_model_loads_total{result=\"ok\"}");
  free(m);
  CHECK_EQ(errors, 2);
  CHECK_EQ(oks, oks0);
  CHECK(index_ready(fx.version));
  CHECK(infer_json_check("40 rows after a failed repository load", all, N_FULL, 0, 0, NULL, NULL));
}

SERVE_TEST(serve_09_metrics) {
  char *m;
  CHECK(get_metrics(&m));
  /* Requests counted by the server must be those this client got answers to. */
  int ok = 1;
  unsigned long long all = atomic_load(&n_infer_all), good = atomic_load(&n_infer[0]), bad = atomic_load(&n_infer[1]);
  for (int k = 0; k < 6; k++) {
    char series[128];
    snprintf(series, sizeof series, "dlrec_requests_total{endpoint=\"infer\",status=\"%s\"}", status_class_names[k]);
    double got = metric(m, series), want = (double)atomic_load(&n_infer[k]);
    if (got != want) {
      test_fail(__FILE__, __LINE__, "%s = %.17g, but the tests got %.17g such responses", series, got, want);
      ok = 0;
    }
  }
  struct {
    const char *series;
    double want; /* < 0: just > 0 */
  } c[] = {
      {"dlrec_infer_latency_seconds_count", (double)all},
      {"dlrec_infer_latency_seconds_bucket{le=\"+Inf\"}", (double)all},
      {"dlrec_request_errors_total{endpoint=\"infer\"}", (double)(all - good)},
      {"dlrec_batch_rows_count", -1},
      {"dlrec_batch_rows_sum", -1},
      {"dlrec_rows_scored_total", -1},
      {"dlrec_requests_total{endpoint=\"health\",status=\"2xx\"}", -1},
      {"dlrec_model_version{model=\"dlrm\"}", atoi(fx.version)},
      {"dlrec_model_loads_total{result=\"error\"}", 2},
  };
  for (int i = 0; i < (int)(sizeof c / sizeof c[0]); i++) {
    double got = metric(m, c[i].series);
    int present = has_series(m, c[i].series);
    if (!present || (c[i].want < 0 ? !(got > 0) : got != c[i].want)) {
      test_fail(__FILE__, __LINE__, "%s = %.17g (%s), expected %s%.17g", c[i].series, got, present ? "present" : "absent",
                c[i].want < 0 ? "> " : "", c[i].want < 0 ? 0 : c[i].want);
      ok = 0;
    }
  }
  if (good == 0 || bad == 0) {
    test_fail(__FILE__, __LINE__, "the tests made %llu good and %llu bad (400) requests: both must be > 0", good, bad);
    ok = 0;
  }
  double sum = metric(m, "dlrec_batch_rows_sum"), scored = metric(m, "dlrec_rows_scored_total");
  if (sum != scored) {
    test_fail(__FILE__, __LINE__, "dlrec_batch_rows_sum %.17g != dlrec_rows_scored_total %.17g", sum, scored);
    ok = 0;
  }
  if (!ok) fprintf(stderr, "--- /metrics ---\n%s\n", m);
  free(m);
  CHECK(ok);
}

/* ---- a reload that changes the architecture ---- */

/* HugeCTR inputs for n rows cycling through the N_FULL encoded rows, as
 * binary tensors with CATCOLUMN as INT32 (to fit 600 rows in the body limit). */
static void build_hugectr_cycled(sb *s, int n, const float *dense, const uint32_t *ids, size_t *hl) {
  const int K = n * NC;
  test_buf_printf(s,
            "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
            ":%d}},{\"name\":\"CATCOLUMN\",\"datatype\":\"INT32\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
            ":%d}},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,%d],\"parameters\":{\"binary_data_size\""
            ":%d}}],\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}",
            n * ND, n * ND * 4, K, K * 4, K + 1, (K + 1) * 4);
  *hl = s->n;
  for (int r = 0; r < n; r++)
    for (int d = 0; d < ND; d++) sb_f32le(s, dense[(r % N_FULL) * ND + d]);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < NC; c++) sb_u32le(s, ids[(r % N_FULL) * NC + c]);
  for (int k = 0; k <= K; k++) sb_u32le(s, (uint32_t)k);
}

typedef struct big_req {
  const sb *body;
  size_t hl;
  http_resp r;
  int ok;
} big_req;

static void *big_main(void *arg) {
  big_req *b = arg;
  char h[128];
  b->ok = http_do("POST", "/v2/models/dlrm/infer", ihcl_header(b->hl, h, sizeof h), b->body->p, b->body->n, &b->r);
  return NULL;
}

/* Two concurrent requests of the same 600 rows (so that both scoring
 * workers get one); each must be 200, of `version`, and bitwise ref. */
static int big_round(const sb *body, size_t hl, const int *idx, int n, const char *version, const float *ref,
                     const char *what) {
  big_req b[2] = {{.body = body, .hl = hl}, {.body = body, .hl = hl}};
  pthread_t th[2];
  int started = 0;
  for (; started < 2; started++)
    if (pthread_create(&th[started], NULL, big_main, &b[started]) != 0) break;
  for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
  int ok = started == 2;
  if (!ok) test_fail(__FILE__, __LINE__, "%s: cannot start threads", what);
  for (int i = 0; ok && i < 2; i++) {
    infer_out *o = malloc(sizeof *o);
    char err[1024];
    if (!o) abort();
    if (!b[i].ok) {
      test_fail(__FILE__, __LINE__, "%s: no response: %s", what, b[i].r.err);
      ok = 0;
    } else if (!parse_infer(&b[i].r, 1, o, err, sizeof err)) {
      test_fail(__FILE__, __LINE__, "%s: %s", what, err);
      ok = 0;
    } else if (strcmp(o->version, version)) {
      test_fail(__FILE__, __LINE__, "%s: model_version \"%s\", expected \"%s\"", what, o->version, version);
      ok = 0;
    } else if (!scores_equal(o, idx, n, ref, err, sizeof err)) {
      test_fail(__FILE__, __LINE__, "%s: %s", what, err);
      ok = 0;
    }
    free(o);
  }
  for (int i = 0; i < 2; i++)
    if (b[i].ok) count_infer(b[i].r.status);
  http_free(&b[0].r);
  http_free(&b[1].r);
  return ok;
}

static int wait_version(const char *want, double timeout_s) {
  char state[64], ver[64] = "", err[512];
  for (double t0 = now_s(); now_s() - t0 < timeout_s; usleep(20000))
    if (repo_index(state, ver, sizeof state, err, sizeof err) && !strcmp(ver, want)) return 1;
  test_fail(__FILE__, __LINE__, "the server does not serve version %s %.0f s after RUN/latest named it (it serves \"%s\"); "
            "log:\n%s", want, timeout_s, ver, server_log_tail());
  return 0;
}

/* Copies checkpoint directory src into run as the checkpoint of `step`. */
static int copy_checkpoint_into(const char *run, const char *src, uint64_t step) {
  char dst[1300], man[1400];
  snprintf(dst, sizeof dst, "%s/ckpt-%012llu", run, (unsigned long long)step);
  if (!copy_dir(src, dst)) return 0;
  snprintf(man, sizeof man, "%s/manifest.json", dst);
  cJSON *j;
  if (dlrec_json_read(man, &j) != DLREC_OK) return 0;
  cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
  int ok = cJSON_IsNumber(st);
  if (ok) cJSON_SetNumberValue(st, (double)step);
  ok = ok && dlrec_json_write_sealed(man, j, "checksum") == DLREC_OK;
  cJSON_Delete(j);
  return ok;
}

static int copy_checkpoint_as(const char *src, uint64_t step) { return copy_checkpoint_into(fx.run, src, step); }

/* RUN/latest moves to checkpoints of another architecture (the same model
 * name, a top MLP 4 times as wide), twice in a row without requests in
 * between; then requests of 600 rows must get the new model's scores. The
 * scoring workers keep a workspace per model: it must be rebuilt for the
 * new architecture, whatever address the new model got. */
SERVE_TEST(serve_09b_reload_to_another_architecture) {
  static const char *wide =
      "{\"name\": \"dlrm\", \"model\": {\"type\": \"dlrm\", \"embedding_dim\": 16, \"bottom_mlp\": [512, 256, 64, 16],"
      " \"top_mlp\": [2048, 256, 1], \"pooling\": \"sum\"}, \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002},"
      " \"sparse\": {\"type\": \"lazy_adam\", \"lr\": 0.003}}, \"training\": {\"batch_size\": 1024, \"epochs\": 1,"
      " \"threads\": 0, \"seed\": 1}}";
  CHECK(test_write_file(fxp("wide.json"), wide, (size_t)-1) == 0);
  CHECK(cli("train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 5", fxp("wide.json"),
            fxp("train.dlr"), fxp("etl"), fxp("run_wide")) == 0);
  static float ref_wide[N_ALL];
  CHECK(cli("predict -q --model '%s' --input '%s' --no-label --out '%s'", fxp("run_wide"), fxp("rows.tsv"),
            fxp("scores_wide.txt")) == 0);
  CHECK(read_scores(fxp("scores_wide.txt"), ref_wide, N_ALL));
  char src[1400];
  snprintf(src, sizeof src, "%s/ckpt-000000000005", fxp("run_wide"));
  CHECK(copy_checkpoint_as(src, 300));
  CHECK(copy_checkpoint_as(src, 301));

  float dense[N_FULL * ND];
  uint32_t ids[N_FULL * NC];
  CHECK_OK(encode_rows(fxp("etl"), dense, ids));
  enum { N = 600 };
  static int idx[N];
  for (int i = 0; i < N; i++) idx[i] = i % N_FULL;
  sb body = {0};
  size_t hl;
  build_hugectr_cycled(&body, N, dense, ids, &hl);
  int ok = body.n < MAX_BODY;
  if (!ok) test_fail(__FILE__, __LINE__, "600 rows take %zu bytes", body.n);
  /* Three times: the current (narrow) model scores on both workers, then
   * two wide checkpoints load one after the other with no request in
   * between (the second model may get the first's freed address), then
   * the wide one scores. */
  char narrow[16];
  snprintf(narrow, sizeof narrow, "%s", fx.version);
  const float *narrow_ref = fx.ref;
  for (int cycle = 0; ok && cycle < 3; cycle++) {
    char what[160];
    if (cycle) ok = point_latest((uint64_t)atoll(narrow)) == DLREC_OK && wait_version(narrow, 10);
    snprintf(what, sizeof what, "cycle %d: 600 rows on version %s", cycle, narrow);
    for (int k = 0; ok && k < 2; k++) ok = big_round(&body, hl, idx, N, narrow, narrow_ref, what);
    ok = ok && point_latest(300) == DLREC_OK && wait_version("300", 10);
    ok = ok && point_latest(301) == DLREC_OK && wait_version("301", 10);
    snprintf(what, sizeof what, "cycle %d: 600 rows after reloads to a 4x wider top MLP (version 301)", cycle);
    for (int k = 0; ok && k < 3; k++) ok = big_round(&body, hl, idx, N, "301", ref_wide, what);
  }
  if (ok) {
    fx.ref = ref_wide;
    snprintf(fx.version, sizeof fx.version, "301");
  }
  test_buf_free(&body);
  CHECK(ok);
  static const int few[3] = {0, 1, 2};
  CHECK(infer_json_check("3 rows on the wide model", few, 3, 0, 0, NULL, NULL));
}

SERVE_TEST(serve_10_sigterm_drains) {
  /* SIGTERM used to stop the server at once: requests in flight got an
   * empty reply or a reset. Now it drains: 12 requests whose headers are in
   * (each got its 100 Continue) and whose bodies come only after the signal
   * must each get their full answer; new connections are refused meanwhile;
   * an idle connection (half a request) does not hold up the stop. */
  CHECK(fx.pid > 0);
  pid_t pid = fx.pid;
  enum { N_FLIGHT = 12 };
  static const int idx[3] = {8, 21, 33};
  sb good = {0}, head = {0};
  build_raw_json(&good, idx, 3, 0, 0, NULL);
  test_buf_printf(&head, "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\n"
                  "Content-Length: %zu\r\n\r\n", good.n);
  int fds[N_FLIGHT];
  sb bufs[N_FLIGHT];
  size_t at[N_FLIGHT];
  memset(bufs, 0, sizeof bufs);
  char err[256];
  int ok = 1, n_open = 0;
  for (; ok && n_open < N_FLIGHT; n_open++) {
    at[n_open] = 0;
    fds[n_open] = http_connect(err, sizeof err);
    if (fds[n_open] < 0) {
      test_fail(__FILE__, __LINE__, "in-flight request %d: %s", n_open, err);
      ok = 0;
      break;
    }
    http_resp r;
    ok = exchange(fds[n_open], head.p, head.n, &bufs[n_open], &at[n_open], &r, "headers of an in-flight request");
    ok = ok && expect_status(&r, 100, "headers of an in-flight request");
    http_free(&r);
  }
  int idle = ok ? http_connect(err, sizeof err) : -1;
  if (ok && idle < 0) {
    test_fail(__FILE__, __LINE__, "%s", err);
    ok = 0;
  }
  const char *half = "GET /v2/health/live HTTP/1.1\r\nHo";
  ok = ok && send_all(idle, half, strlen(half)) == 0;
  usleep(50000);
  ok = ok && kill(pid, SIGTERM) == 0;
  double t0 = now_s();
  /* New connections are refused (soon), while the server still runs. */
  int refused = 0;
  while (ok && !refused && now_s() - t0 < 3) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fx.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    refused = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
    close(fd);
    if (!refused) usleep(20000);
  }
  if (ok && !refused) test_fail(__FILE__, __LINE__, "new connections still accepted 3 s after SIGTERM");
  ok = ok && refused;
  if (ok && waitpid(pid, NULL, WNOHANG) != 0) {
    test_fail(__FILE__, __LINE__, "the server exited with %d requests in flight; log:\n%s", N_FLIGHT,
              server_log_tail());
    fx.pid = 0;
    ok = 0;
  }
  /* The idle connection is closed (perhaps with a 503), not kept. */
  if (ok) {
    char said[256];
    struct pollfd p = {.fd = idle, .events = POLLIN};
    if (poll(&p, 1, 3000) != 1 || recv(idle, said, sizeof said, 0) < 0) {
      test_fail(__FILE__, __LINE__, "the idle connection was not closed on SIGTERM");
      ok = 0;
    }
  }
  /* The bodies, and a full answer to each. */
  for (int i = 0; ok && i < n_open; i++) {
    http_resp r;
    ok = exchange(fds[i], good.p, good.n, &bufs[i], &at[i], &r, "an in-flight request after SIGTERM");
    if (ok) count_infer(r.status);
    ok = ok && scores_match(&r, idx, 3, "an in-flight request after SIGTERM");
    char v[32];
    if (ok && !(http_header(&r, "Connection", v, sizeof v) && !strcasecmp(v, "close"))) {
      test_fail(__FILE__, __LINE__, "an answer while draining without Connection: close");
      ok = 0;
    }
    http_free(&r);
  }
  for (int i = 0; i < n_open; i++) {
    close(fds[i]);
    test_buf_free(&bufs[i]);
  }
  if (idle >= 0) close(idle);
  test_buf_free(&good);
  test_buf_free(&head);
  if (!ok) {
    kill_server();
    return;
  }
  int status = 0, exited = 0;
  while (now_s() - t0 < 15) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = 1;
      break;
    }
    usleep(10000);
  }
  if (!exited) {
    kill_server();
    test_fail(__FILE__, __LINE__, "dlrec serve still runs 15 s after SIGTERM; killed. Log:\n%s", server_log_tail());
    return;
  }
  fx.pid = 0;
  fprintf(stderr, "SIGTERM: %d in-flight requests answered, the server exited after %.2f s\n", N_FLIGHT, now_s() - t0);
  const char *log = server_log_tail();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    test_fail(__FILE__, __LINE__, "dlrec serve exited with %s %d after SIGTERM; log:\n%s",
              WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), log);
  else if (strstr(log, "Sanitizer") || strstr(log, "runtime error"))
    test_fail(__FILE__, __LINE__, "sanitizer reports in the server log:\n%s", log);
}

/* ---- every model type, multi-hot and categorical-only data ---- */

/* A second fixture, of CSV data with a multi-hot column (MovieLens-like
 * genres), in two versions: with a dense column (price) and categorical
 * only. Each model type is trained on it by the CLI, scored by `dlrec
 * predict` and served; served scores must equal predict's bitwise, for raw
 * rows (multi-hot fields as their text) and for the HugeCTR convention. */
#define MX_ROWS 400 /* training rows */
#define MX_N 40     /* rows scored: 34 from training, 6 with unseen values */
#define MX_TYPES 16

typedef struct mx_data {
  const char *name;     /* "mixed" or "catonly" */
  int has_dense;
  char field[MX_N][4][48]; /* the scored rows' fields: price (when has_dense), user, item, genres */
} mx_data;

typedef struct mx_model {
  char type[DLREC_NET_TYPE_MAX];
  char run[1200];
  float ref[MX_N]; /* predict's scores */
  int state;       /* 0: not trained, 1: ready, -1: failed */
} mx_model;

static struct {
  int state;
  mx_data data[2];
  mx_model mixed[MX_TYPES]; /* one per registered type, on the mixed data */
} mx;

/* Writes the CSV (with labels, header first) of MX_ROWS training rows and
 * the MX_N scored rows, deterministic. */
static int mx_write(mx_data *d) {
  static const char *const genres[] = {"Action", "Drama", "Comedy", "Horror", "SciFi", "Kids", "Noir", "War"};
  sb train = {0}, score = {0};
  const char *head = d->has_dense ? "click,price,user,item,genres\n" : "click,user,item,genres\n";
  sb_str(&train, head);
  sb_str(&score, head);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int r = 0; r < MX_ROWS + 6; r++) {
    char f[4][48], g[48] = "";
    uint32_t k[8];
    for (int i = 0; i < 8; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      k[i] = (uint32_t)(x >> 32);
    }
    int novel = r >= MX_ROWS; /* the scored rows past training: unseen values */
    if (k[0] % 10 == 0) f[0][0] = 0;
    else if (k[0] % 10 == 1) snprintf(f[0], 48, "%u.5", k[1] % 300);
    else snprintf(f[0], 48, "%u", k[1] % 500);
    snprintf(f[1], 48, "u%u", novel ? 1000 + (unsigned)r : k[2] % 40);
    if (k[3] % 17 == 0) f[2][0] = 0;
    else snprintf(f[2], 48, "i%u", k[3] % 60);
    /* 0 to 4 genres, sometimes with empty values between separators. */
    size_t gn = 0;
    for (uint32_t i = 0, n = k[4] % 5; i < n; i++)
      gn += (size_t)snprintf(g + gn, sizeof g - gn, "%s%s", i ? (k[5] % 7 == i ? "||" : "|") : "",
                             novel && i == 0 ? "Western" : genres[(k[6] >> (3 * i)) % 8]);
    snprintf(f[3], 48, "%s", g);
    int label = (k[2] % 40) % 3 == 0 || strstr(g, "Horror") ? (k[7] % 4 != 0) : (k[7] % 4 == 0);
    char line[256];
    if (d->has_dense) snprintf(line, sizeof line, "%d,%s,%s,%s,%s\n", label, f[0], f[1], f[2], f[3]);
    else snprintf(line, sizeof line, "%d,%s,%s,%s\n", label, f[1], f[2], f[3]);
    if (r < MX_ROWS) sb_str(&train, line);
    int slot = r < MX_N - 6 ? r : novel ? MX_N - 6 + (r - MX_ROWS) : -1;
    if (slot >= 0) {
      sb_str(&score, line);
      int nf = 0;
      for (int i = d->has_dense ? 0 : 1; i < 4; i++) snprintf(d->field[slot][nf++], 48, "%s", f[i]);
    }
  }
  char name[64];
  snprintf(name, sizeof name, "%s.csv", d->name);
  int ok = test_write_file(fxp(name), train.p, train.n) == 0;
  snprintf(name, sizeof name, "%s_rows.csv", d->name);
  ok = ok && test_write_file(fxp(name), score.p, score.n) == 0;
  test_buf_free(&train);
  test_buf_free(&score);
  return ok;
}

static int mx_build(void) {
  if (!base_fixture()) return 0;
  mx.data[0].name = "mixed";
  mx.data[0].has_dense = 1;
  mx.data[1].name = "catonly";
  const char *spec[2] = {"label=click;dense=price;cat=*;multi=genres:|:mean",
                         "label=click;cat=*;multi=genres:|"};
  for (int i = 0; i < 2; i++) {
    const char *n = mx.data[i].name;
    char csv[64], etl[64], dlr[64];
    snprintf(csv, sizeof csv, "%s.csv", n);
    snprintf(etl, sizeof etl, "%s_etl", n);
    snprintf(dlr, sizeof dlr, "%s.dlr", n);
    if (!mx_write(&mx.data[i]) ||
        cli("etl fit -q --format csv --schema '%s' --input '%s' --out '%s'", spec[i], fxp(csv), fxp(etl)) ||
        cli("etl apply -q --etl '%s' --input '%s' --out '%s'", fxp(etl), fxp(csv), fxp(dlr)))
      return 0;
  }
  return 1;
}

static int mx_fixture(void) {
  if (mx.state == 0) mx.state = mx_build() ? 1 : -1;
  return mx.state == 1;
}

#define MODELS_TEST(name)                                                       \
  static void body_##name(void);                                                \
  TEST(name) {                                                                  \
    fx.talk_port = 0;                                                           \
    if (!mx_fixture()) test_fail(__FILE__, __LINE__, "the models fixture could not be built"); \
    else body_##name();                                                         \
    fx.talk_port = 0;                                                           \
    serve_run = NULL;                                                           \
    if (test_failed_now()) fx.any_failed = 1;                                   \
  }                                                                             \
  static void body_##name(void)

/* Per-type settings that keep a model small; a type not listed trains with
 * its defaults, so types registered later are covered as they come. */
static const struct {
  const char *type, *model;
} mx_overrides[] = {
    {"dlrm", ", \"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]"},
    {"fm", ", \"embedding_dim\": 8"},
};

/* Trains `config` (a file) on data d for 3 steps into fxp(run) and scores
 * d's rows with predict into ref. */
static int mx_train(const mx_data *d, const char *config, const char *run, float *ref) {
  char dlr[64], etl[64], rows[64], out[160];
  snprintf(dlr, sizeof dlr, "%s.dlr", d->name);
  snprintf(etl, sizeof etl, "%s_etl", d->name);
  snprintf(rows, sizeof rows, "%s_rows.csv", d->name);
  snprintf(out, sizeof out, "%s.scores", run);
  char *said = NULL;
  int rc = test_run_cli(&said, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 3", config,
                        fxp(dlr), fxp(etl), fxp(run));
  if (rc != 0) fprintf(stderr, "train %s -> %d:\n%s\n", run, rc, said ? said : "");
  free(said);
  return rc == 0 && cli("predict -q --model '%s' --input '%s' --out '%s'", fxp(run), fxp(rows), fxp(out)) == 0 &&
         read_scores(fxp(out), ref, MX_N);
}

/* The mixed-data model of type i (dlrec_net_type_name(i)), trained once. */
static mx_model *mx_model_of(size_t i) {
  mx_model *m = &mx.mixed[i];
  if (m->state) return m->state == 1 ? m : NULL;
  m->state = -1;
  const char *type = dlrec_net_type_name(i);
  snprintf(m->type, sizeof m->type, "%s", type);
  const char *extra = "";
  for (size_t k = 0; k < sizeof mx_overrides / sizeof mx_overrides[0]; k++)
    if (!strcmp(mx_overrides[k].type, type)) extra = mx_overrides[k].model;
  char config[2048], file[64], run[64];
  snprintf(config, sizeof config,
           "{\"name\": \"dlrm\", \"model\": {\"type\": \"%s\"%s}, \"training\": {\"batch_size\": 64, \"seed\": 1}}",
           type, extra);
  snprintf(file, sizeof file, "mx_%s.json", type);
  snprintf(run, sizeof run, "mx_run_%s", type);
  snprintf(m->run, sizeof m->run, "%s", fxp(run));
  if (test_write_file(fxp(file), config, strlen(config)) != 0 || !mx_train(&mx.data[0], fxp(file), run, m->ref))
    return NULL;
  m->state = 1;
  return m;
}

/* The JSON raw request of d's rows [0, n): dense as the log's text (absent
 * when dense_shape is 0; [n, 0] when it is 2 and d has no dense column). */
static void mx_raw_json(sb *s, const mx_data *d, int n, int dense_shape) {
  int nc = 3, nd = d->has_dense;
  sb_str(s, "{\"id\":\"mx\",\"inputs\":[");
  if (nd) {
    test_buf_printf(s, "{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[%d,1],\"data\":[", n);
    for (int r = 0; r < n; r++) {
      sb_str(s, r ? "," : "");
      sb_json_string(s, d->field[r][0]);
    }
    sb_str(s, "]},");
  } else if (dense_shape == 2) {
    test_buf_printf(s, "{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[%d,0],\"data\":[]},", n);
  }
  test_buf_printf(s, "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,%d],\"data\":[", n, nc);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < nc; c++) {
      sb_str(s, r || c ? "," : "");
      sb_json_string(s, d->field[r][nd + c]);
    }
  sb_str(s, "]}]}");
}

/* The HugeCTR request of d's rows [0, n), encoded with the run's ETL state
 * by the line encoder: DES (left out when omit_des and d has no dense
 * column), CATCOLUMN and ROWINDEX with each multi-hot slot's keys. */
static dlrec_status mx_hugectr_json(sb *s, const mx_data *d, const char *run, int n, int omit_des) {
  char ckpt[1024], etl_dir[1100];
  dlrec_status st = dlrec_checkpoint_resolve(run, ckpt, sizeof ckpt);
  if (st != DLREC_OK) return st;
  snprintf(etl_dir, sizeof etl_dir, "%s/etl", ckpt);
  dlrec_etl *e = NULL;
  if ((st = dlrec_etl_load(&e, etl_dir)) != DLREC_OK) return st;
  const uint32_t nd = dlrec_etl_schema(e)->n_dense, nc = dlrec_etl_schema(e)->n_sparse;
  static float dense[MX_N];
  static uint32_t ids[MX_N][64], nids[MX_N][DLREC_MAX_SPARSE];
  for (int r = 0; r < n && st == DLREC_OK; r++) {
    char line[256];
    int len = d->has_dense ? snprintf(line, sizeof line, "%s,%s,%s,%s", d->field[r][0], d->field[r][1], d->field[r][2],
                                      d->field[r][3])
                           : snprintf(line, sizeof line, "%s,%s,%s", d->field[r][0], d->field[r][1], d->field[r][2]);
    if (dlrec_etl_ids_max(e) > 64) st = dlrec_error(DLREC_ERR_INTERNAL, "more than 64 ids a row");
    else st = dlrec_etl_encode_line_multi(e, line, (size_t)len, 0, NULL, dense + r * nd, ids[r], nids[r], NULL);
  }
  dlrec_etl_free(e);
  if (st != DLREC_OK) return st;
  sb_str(s, "{\"inputs\":[");
  if (nd || !omit_des) {
    test_buf_printf(s, "{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,%u],\"data\":[[", n * nd);
    for (uint32_t i = 0; i < n * nd; i++) test_buf_printf(s, "%s%.9g", i ? "," : "", (double)dense[i]);
    sb_str(s, "]]},");
  }
  uint32_t K = 0;
  for (int r = 0; r < n; r++)
    for (uint32_t c = 0; c < nc; c++) K += nids[r][c];
  test_buf_printf(s, "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[%u],\"data\":[", K);
  uint32_t k = 0;
  for (int r = 0; r < n; r++)
    for (uint32_t c = 0, at = 0; c < nc; at += nids[r][c], c++)
      for (uint32_t q = 0; q < nids[r][c]; q++) test_buf_printf(s, "%s%u", k++ ? "," : "", ids[r][at + q]);
  test_buf_printf(s, "]},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[%u],\"data\":[0", n * nc + 1);
  k = 0;
  for (int r = 0; r < n; r++)
    for (uint32_t c = 0; c < nc; c++) test_buf_printf(s, ",%u", k += nids[r][c]);
  sb_str(s, "]}]}");
  return DLREC_OK;
}

/* Posts body to the talk port's model and checks the scores of rows
 * [0, n) against ref bitwise. */
static int mx_infer(const char *what, const sb *body, int n, const float *ref, int binary_out) {
  int idx[MX_N];
  for (int i = 0; i < n; i++) idx[i] = i;
  char err[600];
  http_resp r;
  int ok = http_do("POST", "/v2/models/dlrm/infer", NULL, body->p, body->n, &r);
  infer_out o;
  if (!ok) snprintf(err, sizeof err, "no response: %s", r.err);
  ok = ok && parse_infer(&r, binary_out, &o, err, sizeof err) && scores_equal(&o, idx, n, ref, err, sizeof err);
  if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", what, err);
  http_free(&r);
  return ok;
}

/* The model metadata's platform and parameters.model_type must name type. */
static int mx_metadata_names(const char *type) {
  http_resp r;
  char want[64];
  snprintf(want, sizeof want, "dlrec_%s", type);
  if (!http_do("GET", "/v2/models/dlrm", NULL, NULL, 0, &r)) {
    test_fail(__FILE__, __LINE__, "model metadata: no response: %s", r.err);
    return 0;
  }
  cJSON *j = r.status == 200 ? cJSON_ParseWithLength(r.body, r.body_len) : NULL;
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "platform");
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "parameters"), "model_type");
  int ok = cJSON_IsString(p) && !strcmp(p->valuestring, want) && cJSON_IsString(t) && !strcmp(t->valuestring, type);
  if (!ok) test_fail(__FILE__, __LINE__, "model metadata of a %s model: expected platform %s: %.400s", type, want,
                     r.body ? r.body : "");
  cJSON_Delete(j);
  http_free(&r);
  return ok;
}

/* Serves run (on device, or the CPU when NULL), checks its metadata names
 * type and that d's rows score as ref through both conventions; stops the
 * server. */
static int mx_serve_check_on(const mx_data *d, const char *run, const char *type, const float *ref,
                             const char *device) {
  const char *const args[] = {"--threads", "2", "-q", device ? "--device" : NULL, device, NULL};
  pid_t pid;
  int port;
  serve_run = run;
  int ok = start_extra("serve_mx.log", args, &pid, &port);
  serve_run = NULL;
  if (!ok) {
    test_fail(__FILE__, __LINE__, "%s: the server did not start", run);
    return 0;
  }
  fx.talk_port = port;
  char what[200];
  ok = mx_metadata_names(type);
  for (int variant = 0; ok && variant < (d->has_dense ? 1 : 2); variant++) {
    sb body = {0};
    mx_raw_json(&body, d, MX_N, variant ? 2 : 0);
    snprintf(what, sizeof what, "%s on %s data: raw rows in JSON%s", type, d->name,
             d->has_dense ? "" : variant ? ", dense [B, 0]" : ", no dense input");
    ok = mx_infer(what, &body, MX_N, ref, 0);
    test_buf_free(&body);
  }
  /* The same with the scores as binary data. */
  if (ok) {
    sb body = {0};
    mx_raw_json(&body, d, MX_N, 0);
    body.n -= 1; /* the closing brace: add the binary output parameter */
    sb_str(&body, ",\"parameters\":{\"binary_data_output\":true}}");
    snprintf(what, sizeof what, "%s on %s data: raw rows, binary output", type, d->name);
    ok = mx_infer(what, &body, MX_N, ref, 1);
    test_buf_free(&body);
  }
  for (int omit = 0; ok && omit < (d->has_dense ? 1 : 2); omit++) {
    sb body = {0};
    dlrec_status st = mx_hugectr_json(&body, d, run, MX_N, omit);
    if (st != DLREC_OK) {
      test_fail(__FILE__, __LINE__, "encoding the HugeCTR request: %s", dlrec_last_error());
      ok = 0;
    } else {
      snprintf(what, sizeof what, "%s on %s data: DES/CATCOLUMN/ROWINDEX%s", type, d->name,
               d->has_dense ? "" : omit ? " without DES" : " with an empty DES");
      ok = mx_infer(what, &body, MX_N, ref, 0);
    }
    test_buf_free(&body);
  }
  fx.talk_port = 0;
  return stop_extra(pid, "serve_mx.log") && ok;
}

static int mx_serve_check(const mx_data *d, const char *run, const char *type, const float *ref) {
  return mx_serve_check_on(d, run, type, ref, NULL);
}

/* Every registered model type, trained on data with a dense column, a
 * one-hot column with missing values and a multi-hot column (mean pooled,
 * values unseen in fit among the scored rows), scores through the server
 * bitwise as `dlrec predict` scores the same raw rows, on the CPU and on
 * cpu-mirror (the GPU's path: the model's state in the backend's memory,
 * one batcher worker). predict refused such states, and the server refused
 * multi-hot raw fields. */
MODELS_TEST(serve_11_every_model_type_scores_as_predict) {
  size_t n = 0;
  for (; dlrec_net_type_name(n); n++) {
  }
  CHECK(n >= 3 && n <= MX_TYPES);
  for (size_t i = 0; i < n && i < MX_TYPES; i++) {
    mx_model *m = mx_model_of(i);
    if (!m) {
      test_fail(__FILE__, __LINE__, "model type %s: training or predict failed", dlrec_net_type_name(i));
      continue;
    }
    if (mx_serve_check(&mx.data[0], m->run, m->type, m->ref) &&
        mx_serve_check_on(&mx.data[0], m->run, m->type, m->ref, "cpu-mirror"))
      fprintf(stderr, "model type %s: %d rows served bitwise as predict scores them\n", m->type, MX_N);
  }
}

/* Categorical-only data (no dense column), with the example configs of
 * the models meant for it: served with no dense input, with dense [B, 0],
 * and HugeCTR requests without or with an empty DES. */
MODELS_TEST(serve_12_categorical_only_models) {
  static const char *const examples[] = {"dlrm_categorical", "lr", "fm"};
  for (int i = 0; i < 3; i++) {
    char src[64], file[64], run[64];
    snprintf(src, sizeof src, "examples/%s.json", examples[i]);
    snprintf(file, sizeof file, "cat_%s.json", examples[i]);
    snprintf(run, sizeof run, "cat_run_%s", examples[i]);
    /* The example, under the name the test client asks for. */
    cJSON *j = NULL;
    CHECK_OK(dlrec_json_read(test_source_path(src), &j));
    cJSON_ReplaceItemInObjectCaseSensitive(j, "name", cJSON_CreateString("dlrm"));
    char *text = cJSON_Print(j);
    const char *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "type")
                           ->valuestring;
    char type_name[DLREC_NET_TYPE_MAX];
    snprintf(type_name, sizeof type_name, "%s", type);
    int w = text ? test_write_file(fxp(file), text, strlen(text)) : -1;
    free(text);
    cJSON_Delete(j);
    CHECK(w == 0);
    static float ref[MX_N];
    if (!mx_train(&mx.data[1], fxp(file), run, ref)) {
      test_fail(__FILE__, __LINE__, "%s on categorical-only data: training or predict failed", examples[i]);
      continue;
    }
    if (mx_serve_check(&mx.data[1], fxp(run), type_name, ref))
      fprintf(stderr, "%s (%s) on categorical-only data: served bitwise as predict scores\n", examples[i], type_name);
  }
}

/* Hot reload between models of different types. */
typedef struct mx_client {
  pthread_t t;
  const char *const *versions; /* NULL-terminated */
  const float *const *refs;    /* each version's scores */
  atomic_int seen[8];          /* responses of each version */
  atomic_int errors;
  char first_error[600];
} mx_client;

static atomic_int mx_stop;

static void *mx_client_main(void *arg) {
  mx_client *c = arg;
  sb body = {0};
  mx_raw_json(&body, &mx.data[0], MX_N, 0);
  int idx[MX_N];
  for (int i = 0; i < MX_N; i++) idx[i] = i;
  while (!atomic_load(&mx_stop)) {
    http_resp r;
    infer_out o;
    char err[500];
    int ok = http_do("POST", "/v2/models/dlrm/infer", NULL, body.p, body.n, &r);
    if (!ok) snprintf(err, sizeof err, "no response: %.400s", r.err);
    ok = ok && parse_infer(&r, 0, &o, err, sizeof err);
    int v = -1;
    for (int k = 0; ok && c->versions[k]; k++)
      if (!strcmp(c->versions[k], o.version)) v = k;
    if (ok && v < 0) snprintf(err, sizeof err, "an unexpected version '%s'", o.version);
    ok = ok && v >= 0 && scores_equal(&o, idx, MX_N, c->refs[v], err, sizeof err);
    if (ok) atomic_fetch_add(&c->seen[v], 1);
    else if (atomic_fetch_add(&c->errors, 1) == 0)
      snprintf(c->first_error, sizeof c->first_error, "%s", err);
    http_free(&r);
  }
  test_buf_free(&body);
  return NULL;
}

/* RUN/latest moves from a dlrm checkpoint to an fm one, to an lr one and
 * back to dlrm, while two clients keep sending the same rows: every
 * response must carry one version and exactly that model's scores, with no
 * error in between, and the metadata must name each type in turn. */
MODELS_TEST(serve_13_reload_between_model_types) {
  static const char *const types[] = {"dlrm", "fm", "lr", "dlrm"};
  static const char *const versions[] = {"100", "200", "300", "400", NULL};
  const float *refs[4];
  const char *src[4];
  for (int k = 0; k < 4; k++) {
    size_t i = 0;
    while (dlrec_net_type_name(i) && strcmp(dlrec_net_type_name(i), types[k])) i++;
    mx_model *m = dlrec_net_type_name(i) ? mx_model_of(i) : NULL;
    if (!m) {
      test_fail(__FILE__, __LINE__, "no trained %s model", types[k]);
      return;
    }
    refs[k] = m->ref;
    src[k] = m->run;
  }
  /* The models differ, or the test would prove nothing. */
  CHECK(memcmp(refs[0], refs[1], sizeof mx.mixed[0].ref) && memcmp(refs[1], refs[2], sizeof mx.mixed[0].ref));
  const char *run = fxp("mx_reload_run");
  CHECK(mkdir(run, 0755) == 0);
  char ck[1400];
  snprintf(ck, sizeof ck, "%s/ckpt-000000000003", src[0]);
  CHECK(copy_checkpoint_into(run, ck, 100));
  CHECK_OK(point_latest_in(run, 100));
  static const char *const args[] = {"--threads", "2", "--watch", "--watch-interval-ms", "50", "--max-delay-us", "2000",
                                     "-q", NULL};
  pid_t pid;
  int port;
  serve_run = run;
  CHECK(start_extra("serve_reload.log", args, &pid, &port));
  fx.talk_port = port;
  static mx_client cl[2];
  memset(cl, 0, sizeof cl);
  atomic_store(&mx_stop, 0);
  int started = 0, ok = 1;
  for (; started < 2; started++) {
    cl[started].versions = versions;
    cl[started].refs = refs;
    if (pthread_create(&cl[started].t, NULL, mx_client_main, &cl[started]) != 0) break;
  }
  ok = started == 2;
  for (int k = 0; ok && k < 4; k++) {
    if (k) {
      snprintf(ck, sizeof ck, "%s/ckpt-000000000003", src[k]);
      ok = copy_checkpoint_into(run, ck, (uint64_t)atoll(versions[k])) &&
           point_latest_in(run, (uint64_t)atoll(versions[k])) == DLREC_OK;
    }
    /* Both clients get answers of this version (bounded: 20 s). */
    double t0 = now_s();
    while (ok && (atomic_load(&cl[0].seen[k]) < 3 || atomic_load(&cl[1].seen[k]) < 3) && now_s() - t0 < 20 &&
           !atomic_load(&cl[0].errors) && !atomic_load(&cl[1].errors))
      usleep(10000);
    if (ok && (atomic_load(&cl[0].seen[k]) < 3 || atomic_load(&cl[1].seen[k]) < 3)) {
      test_fail(__FILE__, __LINE__, "version %s (%s) not served to both clients within 20 s", versions[k], types[k]);
      ok = 0;
    }
    ok = ok && mx_metadata_names(types[k]);
  }
  atomic_store(&mx_stop, 1);
  for (int i = 0; i < started; i++) pthread_join(cl[i].t, NULL);
  fx.talk_port = 0;
  for (int i = 0; i < started; i++)
    if (atomic_load(&cl[i].errors))
      test_fail(__FILE__, __LINE__, "client %d: %d bad responses during the reloads, the first: %s", i,
                atomic_load(&cl[i].errors), cl[i].first_error);
  fprintf(stderr, "reloads dlrm -> fm -> lr -> dlrm: responses per version %d/%d/%d/%d (two clients)\n",
          cl[0].seen[0] + cl[1].seen[0], cl[0].seen[1] + cl[1].seen[1], cl[0].seen[2] + cl[1].seen[2],
          cl[0].seen[3] + cl[1].seen[3]);
  CHECK(stop_extra(pid, "serve_reload.log"));
  CHECK(ok);
}
