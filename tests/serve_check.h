/* `dlrec serve` scores a run as `dlrec predict` does: the check every
 * learning test that ends in a servable run shares (test_models for each
 * model type, test_checkpoint for a bf16 run). Header only: each test
 * executable is one source file. */
#ifndef DLREC_TEST_SERVE_CHECK_H
#define DLREC_TEST_SERVE_CHECK_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "test.h"

#define SERVE_ROWS 8

/* POSTs body to 127.0.0.1:port/path with Connection: close and returns the
 * response (malloc'd, headers included) or NULL; every wait bounded by 10 s. */
static inline char *http_post(int port, const char *path, const char *body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return NULL;
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  test_buf req = {0};
  test_buf_printf(&req,
                  "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                  path, strlen(body), body);
  char *resp = NULL;
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && write(fd, req.p, req.n) == (ssize_t)req.n) {
    test_buf in = {0};
    char chunk[4096];
    ssize_t r;
    while ((r = read(fd, chunk, sizeof chunk)) > 0) test_buf_put(&in, chunk, (size_t)r);
    if (in.n) resp = strdup(in.p);
    test_buf_free(&in);
  }
  test_buf_free(&req);
  close(fd);
  return resp;
}

/* The raw-feature request (dense and categorical as BYTES, as a client
 * logs them, missing values "") of the first n rows of DIR/clicks.tsv
 * (Criteo TSV), as JSON (malloc'd), or NULL when the file cannot be read. */
static inline char *serve_raw_request(const char *dir, int n) {
  char path[2048];
  snprintf(path, sizeof path, "%s/clicks.tsv", dir);
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  cJSON *dense = cJSON_CreateArray(), *cat = cJSON_CreateArray();
  char line[4096];
  for (int r = 0; r < n && fgets(line, sizeof line, f); r++) {
    line[strcspn(line, "\n")] = 0;
    char *p = line;
    for (int k = 0; k < 40; k++) {
      char *tab = strchr(p, '\t');
      if (tab) *tab = 0;
      if (k >= 1) cJSON_AddItemToArray(k <= 13 ? dense : cat, cJSON_CreateString(p));
      p = tab ? tab + 1 : p + strlen(p);
    }
  }
  fclose(f);
  cJSON *req = cJSON_CreateObject(), *inputs = cJSON_AddArrayToObject(req, "inputs");
  const char *names[2] = {"dense", "categorical"};
  cJSON *data[2] = {dense, cat};
  for (int i = 0; i < 2; i++) {
    cJSON *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "name", names[i]);
    cJSON_AddStringToObject(in, "datatype", "BYTES");
    int shape[2] = {n, i ? 26 : 13};
    cJSON_AddItemToObject(in, "shape", cJSON_CreateIntArray(shape, 2));
    cJSON_AddItemToObject(in, "data", data[i]);
    cJSON_AddItemToArray(inputs, in);
  }
  char *body = cJSON_PrintUnformatted(req);
  cJSON_Delete(req);
  return body;
}

/* `dlrec serve` on the run DIR/run of the named model (a learning test's,
 * whose directory the harness removes after the test): the scores of raw
 * rows (dense values as text, missing ones "") bitwise equal to `dlrec
 * predict`'s of the same rows. The server listens on loopback, on a free
 * port, and is stopped whatever happens. */
static inline void check_served_equals_predict(const char *dir, const char *model) {
  const char *d = dir;
  char *out = NULL;
  int rc = test_run_cli(&out, "predict -q --model '%s/run' --input '%s/clicks.tsv' --out '%s/ref.txt'", d,
                        d, d);
  CHECK_EQ(rc, 0);
  free(out);
  /* The first SERVE_ROWS raw rows and predict's scores of them. */
  char *body = serve_raw_request(d, SERVE_ROWS);
  CHECK(body != NULL);
  if (!body) return;
  char path[2048];
  float ref[SERVE_ROWS];
  snprintf(path, sizeof path, "%s/ref.txt", d);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL);
  for (int r = 0; f && r < SERVE_ROWS; r++) CHECK(fscanf(f, "%f", &ref[r]) == 1);
  if (f) fclose(f);

  /* The server, on a free loopback port written to a file. */
  char run[1100], port_file[1100], log[1100];
  snprintf(run, sizeof run, "%s/run", d);
  snprintf(port_file, sizeof port_file, "%s/port", d);
  snprintf(log, sizeof log, "%s/serve.log", d);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
    execl(getenv("DLREC_BIN"), "dlrec", "serve", "--model", run, "--host", "127.0.0.1", "--port", "0", "--port-file",
          port_file, "--threads", "1", (char *)NULL);
    _exit(127);
  }
  CHECK(pid > 0);
  int port = 0;
  for (int i = 0; pid > 0 && i < 200 && !port; i++) { /* at most 10 s */
    FILE *pf = fopen(port_file, "r");
    if (pf) {
      if (fscanf(pf, "%d", &port) != 1) port = 0;
      fclose(pf);
    }
    if (!port) nanosleep(&(struct timespec){0, 50000000}, NULL);
  }
  char infer[128];
  snprintf(infer, sizeof infer, "/v2/models/%s/infer", model);
  char *resp = port ? http_post(port, infer, body) : NULL;
  if (pid > 0) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
  }
  free(body);
  CHECK(port > 0);
  CHECK(resp != NULL);
  const char *json = resp ? strstr(resp, "\r\n\r\n") : NULL;
  cJSON *o = json ? cJSON_Parse(json + 4) : NULL;
  if (!o) fprintf(stderr, "response: %s\n", resp ? resp : "(none)");
  CHECK(o != NULL);
  cJSON *outs = cJSON_GetObjectItemCaseSensitive(o, "outputs");
  cJSON *got = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(outs, 0), "data");
  CHECK_EQ(cJSON_GetArraySize(got), SERVE_ROWS);
  for (int r = 0; got && r < SERVE_ROWS && r < cJSON_GetArraySize(got); r++) {
    float v = (float)cJSON_GetArrayItem(got, r)->valuedouble;
    if (memcmp(&v, &ref[r], sizeof v)) fprintf(stderr, "row %d: served %.9g, predict %.9g\n", r, v, ref[r]);
    CHECK(memcmp(&v, &ref[r], sizeof v) == 0);
  }
  cJSON_Delete(o);
  free(resp);
}

#endif
