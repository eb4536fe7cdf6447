/* The Redis tier with a real redis-server on a loopback port (started and
 * stopped here): the rows client (round trip, a foreign value, an outage
 * and the recovery), a trainer publishing its rows, and a server reading
 * them: the same scores as predict with and without the tier, a published
 * change seen within the freshness bound, and Redis killed under load
 * without a failed request. Skipped, saying so, where redis-server is not
 * installed (scripts/deps.sh test installs it). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "train/publish.h"
#include "core/fsutil.h"
#include "core/redis_rows.h"
#include "serve_check.h"
#include "test.h"

#define REDIS "/usr/bin/redis-server"

/* A free loopback TCP port (bound and released: another process could take
 * it in between, which the callers' checks would report). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

/* redis-server on port, without persistence; its pid once it answers. */
static pid_t redis_start(int port) {
  char p[16];
  snprintf(p, sizeof p, "%d", port);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test, however it ends */
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 1), dup2(null, 2);
    execl(REDIS, "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
          (char *)NULL);
    _exit(127);
  }
  /* Up once it answers PING (a plain socket: no client warnings meanwhile). */
  int up = 0;
  for (int i = 0; i < 200 && !up; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char reply[16] = {0};
    up = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6 &&
         read(fd, reply, sizeof reply - 1) > 0 && !strncmp(reply, "+PONG", 5);
    if (fd >= 0) close(fd);
    if (!up) usleep(25000);
  }
  return up ? pid : -1;
}

static void redis_stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static int have_redis(void) {
  if (access(REDIS, X_OK) == 0) return 1;
  printf("test_redis: skipped: %s is not installed (scripts/deps.sh test installs redis-server)\n", REDIS);
  return 0;
}

TEST(rows_round_trip_and_survive_an_outage) {
  if (!have_redis()) return;
  const int port = free_port();
  pid_t pid = redis_start(port);
  CHECK(pid > 0);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  dlrec_redis_rows *r = NULL, *other = NULL;
  CHECK_OK(dlrec_redis_rows_open(&r, addr, "t:rows", 3, 500, 200));
  const dlrec_redis_run run = {0x0123456789abcdefull, 0xfeedbeef};
  dlrec_redis_rows_set_run(r, &run);
  const uint64_t keys[3] = {1, 1ull << 40, 7};
  const float rows[9] = {1, 2, 3, -4, 5.5f, 6, 7, 8, 9e-9f};
  CHECK_OK(dlrec_redis_rows_put(r, keys, rows, 2, 42));
  float got[9];
  uint8_t found[3];
  CHECK_OK(dlrec_redis_rows_get(r, keys, 3, got, found));
  CHECK(found[0] && found[1] && !found[2]);
  CHECK(memcmp(got, rows, 6 * sizeof(float)) == 0);
  /* A value of another size under a row's key is not a row. */
  CHECK_OK(dlrec_redis_rows_open(&other, addr, "t:rows", 2, 500, 200));
  dlrec_redis_rows_set_run(other, &run);
  CHECK_OK(dlrec_redis_rows_put(other, &keys[2], rows, 1, UINT64_MAX));
  CHECK_OK(dlrec_redis_rows_get(r, keys, 3, got, found));
  CHECK(found[0] && found[1] && !found[2]);
  dlrec_redis_stats st;
  dlrec_redis_rows_stats(r, &st);
  CHECK_EQ_U64(st.rejected, 1);
  CHECK_EQ_U64(st.errors, 0);
  /* A row under another row's key fails its checksum (it is keyed), so
   * does a row with a byte flipped: neither is used. */
  CHECK_OK(dlrec_redis_rows_put(r, &keys[2], rows, 1, UINT64_MAX)); /* key 7's row, right */
  CHECK_OK(dlrec_redis_rows_get(r, &keys[2], 1, got, found));
  CHECK(found[0] && memcmp(got, rows, 3 * sizeof(float)) == 0);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "redis-cli -p %d --raw GET t:rows:1 > '%s'", port, test_path("row1"));
  CHECK(system(cmd) == 0);
  snprintf(cmd, sizeof cmd, "head -c 24 '%s' | redis-cli -p %d -x SET t:rows:7 > /dev/null", test_path("row1"), port);
  CHECK(system(cmd) == 0);
  CHECK_OK(dlrec_redis_rows_get(r, &keys[2], 1, got, found));
  CHECK(!found[0]);
  dlrec_redis_rows_stats(r, &st);
  CHECK_EQ_U64(st.rejected, 2);
  /* Rows and publishes are a run's (issue 36, finding 2): the last publish
   * is PREFIX:run; a client of another run reads r's rows as foreign, not
   * as its own, and writes nothing under a run id of 0. */
  dlrec_redis_publish pub;
  int has = -1;
  CHECK_OK(dlrec_redis_rows_last_publish(r, &pub, &has));
  CHECK(has == 1 && pub.run.id == run.id && pub.run.etl_crc == run.etl_crc && pub.step == 42);
  dlrec_redis_rows *stranger = NULL;
  CHECK_OK(dlrec_redis_rows_open(&stranger, addr, "t:rows", 3, 500, 200));
  CHECK_ERR(dlrec_redis_rows_put(stranger, keys, rows, 1, 5), DLREC_ERR_INVALID, "run id");
  const dlrec_redis_run run2 = {run.id ^ 1, run.etl_crc};
  dlrec_redis_rows_set_run(stranger, &run2);
  CHECK_OK(dlrec_redis_rows_get(stranger, keys, 2, got, found));
  CHECK(!found[0] && !found[1]);
  dlrec_redis_rows_stats(stranger, &st);
  CHECK_EQ_U64(st.foreign, 2);
  CHECK_EQ_U64(st.rejected, 0);
  CHECK_OK(dlrec_redis_rows_put(stranger, keys, rows + 3, 1, 9)); /* key 1: now run2's, and the last publish */
  CHECK_OK(dlrec_redis_rows_get(r, keys, 2, got, found));
  CHECK(!found[0] && found[1]);
  dlrec_redis_rows_stats(r, &st);
  CHECK_EQ_U64(st.foreign, 1);
  CHECK_OK(dlrec_redis_rows_last_publish(r, &pub, &has));
  CHECK(has == 1 && pub.run.id == run2.id && pub.step == 9);
  snprintf(cmd, sizeof cmd, "redis-cli -p %d SET t:rows:run 'not a record' > /dev/null", port);
  CHECK(system(cmd) == 0);
  CHECK_ERR(dlrec_redis_rows_last_publish(r, &pub, &has), DLREC_ERR_CORRUPT, "t:rows:run holds 'not a record'");
  CHECK(has == 0);
  dlrec_redis_rows_close(stranger);
  /* The largest rows round-trip; a dim out of range is refused, saying the range. */
  dlrec_redis_rows *wide = NULL;
  CHECK_OK(dlrec_redis_rows_open(&wide, addr, "t:wide", DLREC_REDIS_MAX_DIM, 500, 200));
  dlrec_redis_rows_set_run(wide, &run);
  float *big = malloc(2 * DLREC_REDIS_MAX_DIM * sizeof *big);
  for (int i = 0; big && i < DLREC_REDIS_MAX_DIM; i++) big[i] = (float)i - 0.5f;
  uint8_t big_found = 0;
  CHECK_OK(dlrec_redis_rows_put(wide, &keys[0], big, 1, UINT64_MAX));
  CHECK_OK(dlrec_redis_rows_get(wide, &keys[0], 1, big + DLREC_REDIS_MAX_DIM, &big_found));
  CHECK(big_found && memcmp(big, big + DLREC_REDIS_MAX_DIM, DLREC_REDIS_MAX_DIM * sizeof *big) == 0);
  free(big);
  dlrec_redis_rows_close(wide);
  dlrec_redis_rows *none = NULL;
  CHECK_ERR(dlrec_redis_rows_open(&none, addr, "t:x", 0, 500, 200), DLREC_ERR_INVALID, "(1 to 1024)");
  CHECK_ERR(dlrec_redis_rows_open(&none, addr, "t:x", DLREC_REDIS_MAX_DIM + 1, 500, 200), DLREC_ERR_INVALID,
            "1025 floats");
  /* Down: an error, not a hang; then back. */
  redis_stop(pid);
  CHECK_ERR(dlrec_redis_rows_get(r, keys, 2, got, found), DLREC_ERR_IO, "redis");
  CHECK(!found[0] && !found[1]);
  CHECK_ERR(dlrec_redis_rows_put(r, keys, rows, 1, 1), DLREC_ERR_IO, "redis");
  pid = redis_start(port);
  CHECK(pid > 0);
  usleep(250000); /* past the retry interval */
  CHECK_OK(dlrec_redis_rows_put(r, keys, rows, 1, 43));
  CHECK_OK(dlrec_redis_rows_get(r, keys, 1, got, found));
  CHECK(found[0] && memcmp(got, rows, 3 * sizeof(float)) == 0);
  dlrec_redis_rows_stats(r, &st);
  CHECK(st.connects >= 2);
  dlrec_redis_rows_close(r);
  dlrec_redis_rows_close(other);
  redis_stop(pid);
  CHECK_ERR(dlrec_redis_rows_open(&r, "localhost", "p", 3, 100, 0), DLREC_ERR_INVALID, "HOST:PORT");
  CHECK_ERR(dlrec_redis_rows_open(&r, "127.0.0.1:0", "p", 3, 100, 0), DLREC_ERR_INVALID, "HOST:PORT");
}

/* ---- a trainer publishing, a server reading ---- */

static pid_t server_pid;
static int server_port;

/* `dlrec serve` of dir/run with extra arguments (NULL-terminated). */
static int serve_start(const char *dir, const char *const *extra) {
  char run[1100], port_file[1100], log[1100];
  snprintf(run, sizeof run, "%s/run", dir);
  snprintf(port_file, sizeof port_file, "%s/port", dir);
  snprintf(log, sizeof log, "%s/serve.log", dir);
  unlink(port_file);
  server_pid = fork();
  if (server_pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test, however it ends */
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    const char *argv[32] = {"dlrec", "serve", "--model", run, "--host", "127.0.0.1", "--port", "0", "--port-file",
                            port_file, "--threads", "1"};
    int n = 12;
    for (int i = 0; extra && extra[i] && n < 31; i++) argv[n++] = extra[i];
    execv(getenv("DLREC_BIN"), (char *const *)argv);
    _exit(127);
  }
  server_port = 0;
  for (int i = 0; i < 200 && !server_port; i++) {
    FILE *pf = fopen(port_file, "r");
    if (pf) {
      if (fscanf(pf, "%d", &server_port) != 1) server_port = 0;
      fclose(pf);
    }
    if (!server_port) usleep(50000);
  }
  return server_port > 0;
}

static void serve_stop(void) {
  if (server_pid <= 0) return;
  kill(server_pid, SIGTERM);
  waitpid(server_pid, NULL, 0);
  server_pid = 0;
}

/* The server's scores of body (n rows) into out; 1 on a 200 answer. */
static int scores(const char *body, int n, float *out) {
  char *resp = http_post(server_port, "/v2/models/dlrm/infer", body);
  const char *json = resp ? strstr(resp, "\r\n\r\n") : NULL;
  cJSON *o = json && !strncmp(resp, "HTTP/1.1 200", 12) ? cJSON_Parse(json + 4) : NULL;
  cJSON *got = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "outputs"), 0),
                                                "data");
  int ok = got && cJSON_GetArraySize(got) == n;
  for (int r = 0; ok && r < n; r++) out[r] = (float)cJSON_GetArrayItem(got, r)->valuedouble;
  if (!ok) fprintf(stderr, "response: %.300s\n", resp ? resp : "(none)");
  cJSON_Delete(o);
  free(resp);
  return ok;
}

/* A Prometheus counter of the server's /metrics (-1 if absent). */
static double metric(const char *name) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)server_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  double v = -1;
  const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
    test_buf in = {0};
    char chunk[4096];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof chunk)) > 0) test_buf_put(&in, chunk, (size_t)r);
    char key[200];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = in.n ? strstr(in.p, key) : NULL;
    if (p) v = strtod(p + strlen(key), NULL);
    test_buf_free(&in);
  }
  close(fd);
  return v;
}

/* In the test's directory: ROWS synthetic rows (seed, cardinality cap),
 * the ETL state (fit_extra: more fit options), train.dlr, and a run "run"
 * trained with config cfg (JSON). 0 on success. */
static int make_run(int rows, int seed, int card, const char *fit_extra, const char *cfg) {
  const char *d = test_tmpdir();
  char *out = NULL, cfg_path[1100];
  int rc = test_run_cli(&out, "synth -q --rows %d --seed %d --max-cardinality %d --out '%s/clicks.tsv' && '%s' etl "
                        "fit -q %s --input '%s/clicks.tsv' --out '%s/etl'",
                        rows, seed, card, d, getenv("DLREC_BIN"), fit_extra, d, d);
  free(out);
  if (rc == 0) rc = test_run_cli(&out, "etl apply -q --etl '%s/etl' --input '%s/clicks.tsv' --out '%s/train.dlr'", d, d, d);
  if (rc == 0) free(out);
  snprintf(cfg_path, sizeof cfg_path, "%s/cfg.json", d);
  if (rc == 0 && test_write_file(cfg_path, cfg, (size_t)-1) != 0) rc = -1;
  if (rc == 0)
    rc = test_run_cli(&out, "train -q --config '%s' --train '%s/train.dlr' --etl '%s/etl' --out '%s/run'", cfg_path, d,
                      d, d);
  if (rc != 0) fprintf(stderr, "make_run: %s\n", out ? out : "");
  free(out);
  return rc;
}

#define ROWS 64

TEST(trainer_publishes_and_server_reads_within_the_freshness_bound) {
  if (!have_redis()) return;
  const int port = free_port();
  pid_t pid = redis_start(port);
  CHECK(pid > 0);
  char addr[64], cfg[1024];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  const char *d = test_tmpdir();
  snprintf(cfg, sizeof cfg,
           "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]}, "
           "\"training\": {\"batch_size\": 128, \"threads\": 2}, \"log\": {\"interval_steps\": 10}, "
           "\"publish\": {\"redis\": \"%s\", \"interval_steps\": 10}}",
           addr);
  CHECK_EQ(make_run(6000, 3, 500, "", cfg), 0);
  char *out = NULL;
  int rc;
  /* Redis holds the trained rows as the final checkpoint has them, and its step. */
  dlrec_model *m = NULL;
  char run[1100];
  snprintf(run, sizeof run, "%s/run", d);
  CHECK_OK(dlrec_model_load(run, &m));
  if (!m) return;
  const uint32_t dim = dlrec_table_dim(dlrec_net_table_const(m->net));
  const uint64_t rows = dlrec_table_rows(dlrec_net_table_const(m->net));
  dlrec_redis_rows *r = NULL;
  CHECK_OK(dlrec_redis_rows_open(&r, addr, "dlrec:dlrm", dim, 500, 0));
  /* The run's rows: its id (drawn as it first published) and ETL state. */
  const dlrec_redis_run ident = {m->progress.run_id, dlrec_etl_state_crc(m->etl)};
  CHECK(ident.id != 0);
  dlrec_redis_rows_set_run(r, &ident);
  uint64_t *keys = malloc(rows * sizeof *keys);
  float *got = malloc(rows * dim * sizeof *got), want[64];
  uint8_t *found = malloc(rows);
  for (uint64_t i = 0; i < rows; i++) keys[i] = i;
  CHECK_OK(dlrec_redis_rows_get(r, keys, rows, got, found));
  uint64_t published = 0, same = 0;
  for (uint64_t i = 0; i < rows; i++) {
    if (!found[i]) continue;
    published++;
    dlrec_table_get_row(dlrec_net_table_const(m->net), i, want);
    same += memcmp(want, got + i * dim, dim * sizeof(float)) == 0;
  }
  CHECK(published > rows / 4);
  CHECK_EQ_U64(same, published);
  const uint64_t final_step = m->progress.step;
  /* The last publish: this run's, on the ETL state its checkpoint holds, at its last step. */
  dlrec_redis_publish last;
  int has = 0;
  CHECK_OK(dlrec_redis_rows_last_publish(r, &last, &has));
  CHECK(has && last.run.id == ident.id && last.run.etl_crc == ident.etl_crc && ident.etl_crc != 0);
  CHECK_EQ_U64(last.step, final_step);
  dlrec_model_free(m);
  /* The server: predict's scores with the tier, and without it. */
  check_served_equals_predict(d, "dlrm");
  rc = test_run_cli(&out, "predict -q --model '%s/run' --input '%s/clicks.tsv' --out '%s/ref.txt'", d, d, d);
  CHECK_EQ(rc, 0);
  free(out);
  float ref[ROWS], s[ROWS];
  char path[1100];
  snprintf(path, sizeof path, "%s/ref.txt", d);
  FILE *f = fopen(path, "r");
  for (int i = 0; f && i < ROWS; i++) CHECK(fscanf(f, "%f", &ref[i]) == 1);
  if (f) fclose(f);
  char *body = serve_raw_request(d, ROWS);
  const char *extra[] = {"--redis", addr, "--redis-max-age-ms", "200", "--redis-timeout-ms", "100", NULL};
  CHECK(serve_start(d, extra));
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  CHECK(metric("dlrec_redis_rows_total{source=\"redis\"}") > 0);
  CHECK(scores(body, ROWS, s)); /* again: from the cache now */
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  CHECK(metric("dlrec_redis_rows_total{source=\"cache\"}") > 0);
  /* A published change (every published row zeroed): seen once the
   * cached rows are older than the bound, then the original again. */
  float *zero = calloc(published * dim, sizeof *zero);
  uint64_t *pk = malloc(published * sizeof *pk), np = 0;
  for (uint64_t i = 0; i < rows; i++)
    if (found[i]) pk[np++] = i;
  CHECK_OK(dlrec_redis_rows_put(r, pk, zero, np, final_step + 1));
  usleep(300000);
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) != 0);
  float *orig = malloc(published * dim * sizeof *orig);
  for (uint64_t i = 0; i < np; i++) memcpy(orig + i * dim, got + pk[i] * dim, dim * sizeof(float));
  CHECK_OK(dlrec_redis_rows_put(r, pk, orig, np, final_step));
  usleep(300000);
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  /* Values that are not rows (issue 36, finding 4): NaN and inf rows with
   * a good checksum, rows of another dimension, and bytes of a row's size
   * written by another tool. Each is refused and counted; the table
   * answers, so the scores are predict's. */
  CHECK(metric("dlrec_redis_rejected_total") == 0);
  float *bad = malloc(np * dim * sizeof *bad);
  for (uint64_t i = 0; i < np * dim; i++) bad[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : 1.0f;
  const uint64_t third = np / 3;
  CHECK_OK(dlrec_redis_rows_put(r, pk, bad, third, final_step));
  dlrec_redis_rows *narrow = NULL;
  CHECK_OK(dlrec_redis_rows_open(&narrow, addr, "dlrec:dlrm", dim - 1, 500, 0));
  dlrec_redis_rows_set_run(narrow, &ident);
  CHECK_OK(dlrec_redis_rows_put(narrow, pk + third, orig + third * dim, third, final_step));
  dlrec_redis_rows_close(narrow);
  /* One redis-cli for them all (a process per key takes seconds). */
  char junk[4 * 64 + 13], cmd[2300];
  memset(junk, 'x', dim * 4 + 12);
  junk[dim * 4 + 12] = '\0';
  FILE *sets = fopen(test_path("junk.redis"), "w");
  for (uint64_t i = 2 * third; sets && i < np; i++)
    fprintf(sets, "SET dlrec:dlrm:%llu %s\n", (unsigned long long)pk[i], junk);
  CHECK(sets && fclose(sets) == 0);
  snprintf(cmd, sizeof cmd, "redis-cli -p %d < '%s' > /dev/null", port, test_path("junk.redis"));
  CHECK(system(cmd) == 0);
  usleep(300000);
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  const double rejected = metric("dlrec_redis_rejected_total");
  CHECK(rejected > 0);
  CHECK_OK(dlrec_redis_rows_put(r, pk, orig, np, final_step));
  usleep(300000);
  CHECK(scores(body, ROWS, s)); /* good rows again: nothing more refused */
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  CHECK(metric("dlrec_redis_rejected_total") == rejected);
  free(bad);
  /* Redis killed while requests keep coming: every one answered, with
   * predict's scores (Redis held the checkpoint's rows), the failed reads
   * counted; Redis back, the rows come from it again. */
  redis_stop(pid);
  int all_ok = 1;
  for (int i = 0; i < 20; i++) {
    all_ok &= scores(body, ROWS, s) && memcmp(s, ref, sizeof ref) == 0;
    usleep(30000);
  }
  CHECK(all_ok);
  CHECK(metric("dlrec_redis_errors_total") > 0);
  pid = redis_start(port);
  CHECK(pid > 0);
  /* This client's connection died with the old server: its next call finds
   * out, the one after reconnects. */
  if (dlrec_redis_rows_put(r, pk, orig, np, final_step) != DLREC_OK) CHECK_OK(dlrec_redis_rows_put(r, pk, orig, np, final_step));
  const double before = metric("dlrec_redis_rows_total{source=\"redis\"}");
  usleep(1300000); /* the retry interval and the bound */
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  CHECK(metric("dlrec_redis_rows_total{source=\"redis\"}") > before);
  serve_stop();
  redis_stop(pid);
  dlrec_redis_rows_close(r);
  free(keys), free(got), free(found), free(zero), free(pk), free(orig), free(body);
}

/* A hash table publishes by raw key: Redis's row of each key the table
 * holds is the table's row. */
TEST(hash_table_publishes_its_rows_by_raw_key) {
  if (!have_redis()) return;
  const int port = free_port();
  pid_t pid = redis_start(port);
  CHECK(pid > 0);
  char addr[64], cfg[1024];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  const char *d = test_tmpdir();
  snprintf(cfg, sizeof cfg,
           "{\"name\": \"hashed\", \"model\": {\"embedding_dim\": 4, \"bottom_mlp\": [8, 4], \"top_mlp\": [8, 1]}, "
           "\"training\": {\"batch_size\": 64, \"threads\": 1}, \"storage\": {\"kind\": \"hash\", \"cache_rows\": 3000}, "
           "\"publish\": {\"redis\": \"%s\", \"interval_steps\": 7}}",
           addr);
  CHECK_EQ(make_run(4000, 5, 300, "--raw-keys", cfg), 0);
  dlrec_model *m = NULL;
  char run[1100];
  snprintf(run, sizeof run, "%s/run", d);
  CHECK_OK(dlrec_model_load(run, &m));
  if (!m) return;
  const dlrec_store *st = dlrec_net_store(m->net);
  dlrec_redis_rows *r = NULL;
  CHECK_OK(dlrec_redis_rows_open(&r, addr, "dlrec:hashed", 4, 500, 0));
  dlrec_redis_rows_set_run(r, &(dlrec_redis_run){m->progress.run_id, dlrec_etl_state_crc(m->etl)});
  uint64_t held = 0, same = 0;
  for (uint32_t row = 0; row < 3000; row++) {
    uint64_t key;
    if (!dlrec_store_key_of(st, row, &key)) continue;
    float want[4], got[4];
    uint8_t found;
    dlrec_table_get_row(dlrec_net_table_const(m->net), row, want);
    CHECK_OK(dlrec_redis_rows_get(r, &key, 1, got, &found));
    held++;
    same += found && memcmp(want, got, sizeof want) == 0;
  }
  CHECK(held > 100);
  CHECK_EQ_U64(same, held);
  dlrec_redis_rows_close(r);
  dlrec_model_free(m);
  redis_stop(pid);
}

/* ---- runs, and what a server takes of theirs ---- */

/* Trains TEST/NAME on the test's train.dlr and etl with config cfg (JSON,
 * written to NAME.json) and extra arguments. 0 on success. */
static int train_run(const char *name, const char *cfg, const char *extra) {
  const char *d = test_tmpdir();
  char cfg_path[1100], *out = NULL;
  snprintf(cfg_path, sizeof cfg_path, "%s/%s.json", d, name);
  if (test_write_file(cfg_path, cfg, (size_t)-1) != 0) return -1;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s/train.dlr' --etl '%s/etl' --out '%s/%s' %s", cfg_path,
                        d, d, d, name, extra);
  if (rc != 0) fprintf(stderr, "train_run %s: %s\n", name, out ? out : "");
  free(out);
  return rc;
}

/* The run of TEST/NAME's latest checkpoint (its id, its ETL state's) and its step. */
static dlrec_redis_run run_of(const char *name, uint64_t *step) {
  dlrec_model *m = NULL;
  dlrec_redis_run id = {0, 0};
  if (dlrec_model_load(test_path(name), &m) != DLREC_OK) return id;
  id = (dlrec_redis_run){m->progress.run_id, dlrec_etl_state_crc(m->etl)};
  if (step) *step = m->progress.step;
  dlrec_model_free(m);
  return id;
}

/* Writes every row of TEST/run's table, times scale, to Redis as run id's
 * (the publish's step `step`); the rows written. */
static uint64_t put_all_rows(const char *addr, const char *prefix, const dlrec_redis_run *id, float scale,
                             uint64_t step) {
  dlrec_model *m = NULL;
  if (dlrec_model_load(test_path("run"), &m) != DLREC_OK) return 0;
  const dlrec_table *t = dlrec_net_table_const(m->net);
  const uint32_t dim = dlrec_table_dim(t);
  const uint64_t rows = dlrec_table_rows(t);
  uint64_t *keys = malloc(rows * sizeof *keys), put = 0;
  float *v = malloc(rows * dim * sizeof *v);
  dlrec_redis_rows *r = NULL;
  if (keys && v && dlrec_redis_rows_open(&r, addr, prefix, dim, 500, 0) == DLREC_OK) {
    dlrec_redis_rows_set_run(r, id);
    for (uint64_t i = 0; i < rows; i++) {
      keys[i] = i;
      dlrec_table_get_row(t, i, v + i * dim);
      for (uint32_t j = 0; j < dim; j++) v[i * dim + j] *= scale;
    }
    if (dlrec_redis_rows_put(r, keys, v, rows, step) == DLREC_OK) put = rows;
  }
  dlrec_redis_rows_close(r);
  free(keys), free(v);
  dlrec_model_free(m);
  return put;
}

/* predict's scores of TEST/run on the first ROWS rows of clicks.tsv. */
static int predict_ref(float *ref) {
  const char *d = test_tmpdir();
  char *out = NULL, path[1100];
  int rc = test_run_cli(&out, "predict -q --model '%s/run' --input '%s/clicks.tsv' --out '%s/ref.txt'", d, d, d);
  free(out);
  snprintf(path, sizeof path, "%s/ref.txt", d);
  FILE *f = rc == 0 ? fopen(path, "r") : NULL;
  int n = 0;
  while (f && n < ROWS && fscanf(f, "%f", &ref[n]) == 1) n++;
  if (f) fclose(f);
  return n == ROWS;
}

/* Whether TEST/serve.log holds text. */
static int served_log_has(const char *text) {
  char *log = NULL;
  size_t n;
  int has = dlrec_read_file(test_path("serve.log"), 1u << 24, &log, &n) == DLREC_OK && strstr(log, text) != NULL;
  if (!has) fprintf(stderr, "serve.log lacks '%s':\n%s\n", text, log ? log : "");
  free(log);
  return has;
}

#define SMALL_CFG                                                                                                      \
  "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]}, \"training\": {\"batch_size\": " \
  "128, \"threads\": 1%s}, \"log\": {\"interval_steps\": 10}, \"publish\": {\"redis\": \"%s\", \"interval_steps\": 10}}"

/* Issue 36, finding 2: two runs of one name publish under one prefix. A
 * server of run A refuses run B's rows, counts and logs them, and scores
 * exactly as without Redis; A's own rows, published at a step behind its
 * checkpoint, are used and the lag is reported. */
TEST(another_runs_rows_are_refused_and_a_lag_reported) {
  if (!have_redis()) return;
  const int port = free_port();
  pid_t pid = redis_start(port);
  CHECK(pid > 0);
  char addr[64], cfg[1024];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  const char *d = test_tmpdir();
  snprintf(cfg, sizeof cfg, SMALL_CFG, "", addr);
  CHECK_EQ(make_run(3000, 3, 300, "", cfg), 0);
  /* Run B: another seed, stopped and resumed (it keeps its id); it publishes last. */
  snprintf(cfg, sizeof cfg, SMALL_CFG, ", \"seed\": 7", addr);
  CHECK_EQ(train_run("run-b", cfg, "--max-steps 5"), 0);
  const dlrec_redis_run b5 = run_of("run-b", NULL);
  CHECK_EQ(train_run("run-b", cfg, "--max-steps 10 --resume"), 0);
  uint64_t step_a = 0, step_b = 0;
  const dlrec_redis_run a = run_of("run", &step_a), b = run_of("run-b", &step_b);
  CHECK(b.id == b5.id);
  CHECK(a.id != 0 && b.id != 0 && a.id != b.id);
  CHECK(a.etl_crc == b.etl_crc && a.etl_crc != 0);
  CHECK(step_a > 10 && step_b == 10);
  float ref[ROWS], s[ROWS];
  CHECK(predict_ref(ref));
  char *body = serve_raw_request(d, ROWS);
  const char *extra[] = {"--redis", addr, "--redis-max-age-ms", "200", NULL};
  CHECK(serve_start(d, extra));
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0); /* B's rows refused: the table's scores */
  const double foreign = metric("dlrec_redis_foreign_total");
  CHECK(foreign > 0);
  CHECK_EQ(metric("dlrec_redis_rows_total{source=\"redis\"}"), 0);
  CHECK_EQ(metric("dlrec_redis_rejected_total"), 0);
  CHECK_EQ(metric("dlrec_redis_lag_steps"), -1);
  char said[128];
  snprintf(said, sizeof said, "the last publish is run %016llx's", (unsigned long long)b.id);
  CHECK(served_log_has(said));
  CHECK(served_log_has("rows were another run's"));
  /* A's rows, as its checkpoint has them, published 4 steps behind it. */
  CHECK(put_all_rows(addr, "dlrec:dlrm", &a, 1.0f, step_a - 4) > 0);
  usleep(1100000); /* past the cache's bound and the next read of PREFIX:run */
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, ref, sizeof ref) == 0);
  CHECK(metric("dlrec_redis_rows_total{source=\"redis\"}") > 0);
  CHECK_EQ(metric("dlrec_redis_foreign_total"), foreign);
  CHECK_EQ(metric("dlrec_redis_lag_steps"), 4);
  CHECK(served_log_has("4 steps behind the served checkpoint"));
  serve_stop();
  redis_stop(pid);
  free(body);
}

/* The publish counts of the last line of TEST/NAME/metrics.jsonl. */
static int publish_counts(const char *name, double *publishes, double *errors, double *pending) {
  char path[1100], *text = NULL;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(name));
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) return 0;
  while (n && text[n - 1] == '\n') text[--n] = '\0';
  const char *last = strrchr(text, '\n');
  cJSON *j = cJSON_Parse(last ? last + 1 : text);
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "publish");
  int ok = cJSON_IsObject(p);
  if (ok) {
    *publishes = cJSON_GetObjectItemCaseSensitive(p, "publishes")->valuedouble;
    *errors = cJSON_GetObjectItemCaseSensitive(p, "errors")->valuedouble;
    *pending = cJSON_GetObjectItemCaseSensitive(p, "pending")->valuedouble;
  }
  cJSON_Delete(j);
  free(text);
  return ok;
}

/* The serving cache smaller than the rows a request touches: every batch
 * evicts, and the scores stay those of the rows Redis holds, exactly; the
 * cache answers exactly its size of a repeated request's rows. And the
 * publisher's failures: a trainer whose Redis is unreachable trains as one
 * without it, bit for bit, counting each failed publish; a publish Redis
 * answers with errors keeps its rows for the next one, which writes them. */
TEST(small_cache_evicts_exactly_and_failed_publishes_lose_nothing) {
  if (!have_redis()) return;
  const int port = free_port(), dead = free_port();
  pid_t pid = redis_start(port);
  CHECK(pid > 0);
  char addr[64], nowhere[64], cfg[1024];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(nowhere, sizeof nowhere, "127.0.0.1:%d", dead);
  const char *d = test_tmpdir();
  /* Publishing into nowhere: every publish fails, and is counted. */
  snprintf(cfg, sizeof cfg, SMALL_CFG, "", nowhere);
  CHECK_EQ(make_run(3000, 3, 300, "", cfg), 0);
  double publishes = -1, errors = -1, pending = -1;
  CHECK(publish_counts("run", &publishes, &errors, &pending));
  CHECK_EQ(publishes, 0);
  CHECK_EQ(errors, 2); /* steps 10 and 20, the last line's */
  CHECK(pending > 0);
  CHECK(train_run("plain", "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [16, 8], \"top_mlp\": [16, 1]}, "
                           "\"training\": {\"batch_size\": 128, \"threads\": 1}}", "") == 0);
  uint64_t step = 0;
  const dlrec_redis_run a = run_of("run", &step), plain = run_of("plain", NULL);
  CHECK(a.id != 0 && plain.id == 0); /* a run that never publishes has no id */
  const char *files[] = {"dense.bin", "table.bin"};
  for (int i = 0; i < 2; i++) {
    char x[1100], y[1100], *bx = NULL, *by = NULL;
    size_t nx = 0, ny = 1;
    snprintf(x, sizeof x, "%s/run/ckpt-%012llu/%s", d, (unsigned long long)step, files[i]);
    snprintf(y, sizeof y, "%s/plain/ckpt-%012llu/%s", d, (unsigned long long)step, files[i]);
    CHECK_OK(dlrec_read_file(x, 1u << 26, &bx, &nx));
    CHECK_OK(dlrec_read_file(y, 1u << 26, &by, &ny));
    CHECK(nx == ny && bx && by && memcmp(bx, by, nx) == 0);
    free(bx), free(by);
  }
  /* A cache of 16 rows, none expiring, in front of Redis holding every row
   * at half its value: the first request's rows all come from Redis (U of
   * them), a repeat's 16 from the cache and the other U - 16 from Redis. */
  const uint64_t all = put_all_rows(addr, "dlrec:dlrm", &a, 0.5f, step);
  CHECK(all > 100);
  float ref[ROWS], s1[ROWS], s[ROWS];
  CHECK(predict_ref(ref));
  char *body = serve_raw_request(d, ROWS), *other = serve_raw_request(d, 2 * ROWS);
  const char *extra[] = {"--redis", addr, "--redis-max-age-ms", "600000", "--redis-cache-rows", "16", NULL};
  CHECK(serve_start(d, extra));
  CHECK(scores(body, ROWS, s1));
  CHECK(memcmp(s1, ref, sizeof ref) != 0); /* Redis's rows, not the table's */
  const double u = metric("dlrec_redis_rows_total{source=\"redis\"}");
  CHECK(u > 16);
  CHECK_EQ(metric("dlrec_redis_rows_total{source=\"cache\"}"), 0);
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, s1, sizeof s) == 0);
  CHECK_EQ(metric("dlrec_redis_rows_total{source=\"cache\"}"), 16);
  CHECK_EQ(metric("dlrec_redis_rows_total{source=\"redis\"}"), 2 * u - 16);
  float s2[2 * ROWS];
  CHECK(scores(other, 2 * ROWS, s2)); /* more rows through the cache, then the first again */
  CHECK(memcmp(s2, s1, sizeof s1) == 0);
  CHECK(scores(body, ROWS, s));
  CHECK(memcmp(s, s1, sizeof s) == 0);
  CHECK_EQ(metric("dlrec_redis_rows_total{source=\"table\"}"), 0);
  serve_stop();
  free(body), free(other);
  /* A publish Redis answers with errors (out of memory): counted, its rows
   * kept; the next one, Redis well again, writes them all. */
  dlrec_model *m = NULL;
  CHECK_OK(dlrec_model_load(test_path("run"), &m));
  if (!m) return;
  dlrec_train_config c = m->config;
  snprintf(c.publish_redis, sizeof c.publish_redis, "%s", addr);
  snprintf(c.publish_prefix, sizeof c.publish_prefix, "t:pub");
  publisher *p = NULL;
  CHECK_OK(publisher_create(&p, &c, m->net, &a));
  enum { N = 50 };
  uint32_t offsets[N + 1], ids[N];
  for (uint32_t i = 0; i <= N; i++) offsets[i] = i;
  for (uint32_t i = 0; i < N; i++) ids[i] = 3 * i;
  dlrec_batch b = {.rows = N};
  b.offsets[0] = offsets;
  b.ids[0] = ids;
  CHECK_OK(publisher_note(p, &b, 1));
  char cmd[256];
  snprintf(cmd, sizeof cmd, "redis-cli -p %d CONFIG SET maxmemory 1 > /dev/null", port);
  CHECK(system(cmd) == 0);
  publisher_publish(p, m->net, 1);
  publish_stats ps;
  publisher_stats(p, &ps);
  CHECK_EQ_U64(ps.errors, 1);
  CHECK_EQ_U64(ps.publishes, 0);
  CHECK_EQ_U64(ps.pending, N);
  snprintf(cmd, sizeof cmd, "redis-cli -p %d CONFIG SET maxmemory 0 > /dev/null", port);
  CHECK(system(cmd) == 0);
  CHECK_OK(publisher_note(p, &b, 1)); /* the same rows trained again */
  usleep(1050000);                    /* past the client's retry interval */
  publisher_publish(p, m->net, 2);
  publisher_stats(p, &ps);
  CHECK_EQ_U64(ps.errors, 1);
  CHECK_EQ_U64(ps.publishes, 1);
  CHECK_EQ_U64(ps.rows, N);
  CHECK_EQ_U64(ps.pending, 0);
  const uint32_t dim = dlrec_table_dim(dlrec_net_table_const(m->net));
  dlrec_redis_rows *r = NULL;
  CHECK_OK(dlrec_redis_rows_open(&r, addr, "t:pub", dim, 500, 0));
  dlrec_redis_rows_set_run(r, &a);
  uint64_t keys[N], same = 0;
  uint8_t found[N];
  float *got = malloc(N * dim * sizeof *got), *want = malloc(dim * sizeof *want);
  for (uint32_t i = 0; i < N; i++) keys[i] = ids[i];
  CHECK_OK(dlrec_redis_rows_get(r, keys, N, got, found));
  for (uint32_t i = 0; got && want && i < N; i++) {
    dlrec_table_get_row(dlrec_net_table_const(m->net), ids[i], want);
    same += found[i] && memcmp(want, got + (size_t)i * dim, dim * sizeof *want) == 0;
  }
  CHECK_EQ_U64(same, N);
  dlrec_redis_publish last;
  int has = 0;
  CHECK_OK(dlrec_redis_rows_last_publish(r, &last, &has));
  CHECK(has && last.run.id == a.id && last.step == 2);
  free(got), free(want);
  dlrec_redis_rows_close(r);
  publisher_free(p);
  dlrec_model_free(m);
  redis_stop(pid);
}
