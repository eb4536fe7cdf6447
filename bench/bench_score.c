/* In-process scoring throughput of a trained model: the limit that
 * `dlrec serve` is measured against (bench/serve_vs_forward.sh).
 *
 *   bench_score --model RUN --rows ROWS.tsv [--batch 64] [--threads 2] [--seconds 3]
 *
 * Encodes the raw rows (label-less, in the model's ETL input format) once,
 * then scores batches of --batch rows, cycling over them, with the
 * batch-invariant scorer the server uses (dlrec_net_predict), for --seconds,
 * and prints {"batch": B, "threads": T, "rows_per_s": R} — the forward only,
 * with no HTTP, parsing or encoding. With --threads T, T threads each score
 * their own batches on one OpenMP thread (a one-thread backend), as the
 * server's workers do. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "model/model.h"
#include "data/etl.h"
#include "core/clock.h"

typedef struct shared {
  const dlrec_model *m;
  const dlrec_net_scorer *scorer;
  uint32_t n_rows, batch, n_dense, n_sparse;
  const float *dense;   /* (n_rows, n_dense) */
  const uint32_t *cols; /* (n_sparse, n_rows) */
  double seconds;
} shared;

typedef struct worker {
  shared *sh;
  uint64_t rows;
  double elapsed;
  int failed;
} worker;

static void *run(void *arg) {
  worker *w = arg;
  shared *sh = w->sh;
  uint32_t B = sh->batch;
  dlrec_net_ws *ws;
  float *prob = malloc(B * sizeof *prob), *dense = malloc((size_t)B * sh->n_dense * sizeof(float));
  uint32_t *ids = malloc((size_t)B * sh->n_sparse * sizeof(uint32_t)), *off = malloc((B + 1) * sizeof(uint32_t));
  if (!prob || !dense || !ids || !off || dlrec_net_ws_create(&ws, sh->m->net, B) != DLREC_OK) {
    w->failed = 1;
    return NULL;
  }
  for (uint32_t i = 0; i <= B; i++) off[i] = i;
  dlrec_batch b;
  memset(&b, 0, sizeof b);
  b.rows = B;
  b.dense = dense;
  for (uint32_t c = 0; c < sh->n_sparse; c++) {
    b.offsets[c] = off;
    b.ids[c] = ids + (size_t)c * B;
  }
  uint32_t at = 0;
  double t0 = dlrec_now(), t = 0;
  do {
    for (uint32_t i = 0; i < B; i++, at = (at + 1) % sh->n_rows) {
      memcpy(dense + (size_t)i * sh->n_dense, sh->dense + (size_t)at * sh->n_dense, sh->n_dense * sizeof(float));
      for (uint32_t c = 0; c < sh->n_sparse; c++) ids[(size_t)c * B + i] = sh->cols[(size_t)c * sh->n_rows + at];
    }
    if (dlrec_net_predict(sh->scorer, ws, &b, prob) != DLREC_OK) {
      w->failed = 1;
      break;
    }
    w->rows += B;
  } while ((t = dlrec_now() - t0) < sh->seconds);
  w->elapsed = t;
  dlrec_net_ws_free(ws);
  free(prob);
  free(dense);
  free(ids);
  free(off);
  return NULL;
}

static void usage(FILE *f) {
  fprintf(f, "usage: bench_score --model RUN --rows ROWS.tsv [--batch 64] [--threads 2] [--seconds 3]\n");
}

int main(int argc, char **argv) {
  const char *model = NULL, *rows_path = NULL;
  uint32_t batch = 64, threads = 2;
  double seconds = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      return 2;
    }
    const char *a = argv[i], *v = argv[++i];
    if (!strcmp(a, "--model")) model = v;
    else if (!strcmp(a, "--rows")) rows_path = v;
    else if (!strcmp(a, "--batch")) batch = (uint32_t)atoi(v);
    else if (!strcmp(a, "--threads")) threads = (uint32_t)atoi(v);
    else if (!strcmp(a, "--seconds")) seconds = atof(v);
    else {
      usage(stderr);
      return 2;
    }
  }
  if (!model || !rows_path || batch < 1 || batch > (1u << 20) || threads < 1 || threads > 256 || seconds <= 0) {
    usage(stderr);
    return 2;
  }
  dlrec_model *m;
  if (dlrec_model_load(model, &m) != DLREC_OK) {
    fprintf(stderr, "bench_score: %s\n", dlrec_last_error());
    return 1;
  }
  const dlrec_schema *s = dlrec_net_schema(m->net);
  shared sh = {.m = m, .batch = batch, .n_dense = s->n_dense, .n_sparse = s->n_sparse, .seconds = seconds};
  FILE *f = fopen(rows_path, "r");
  if (!f) {
    perror(rows_path);
    return 1;
  }
  size_t cap_rows = 1024, n = 0;
  float *dense = malloc(cap_rows * s->n_dense * sizeof(float));
  uint32_t *ids = malloc(cap_rows * s->n_sparse * sizeof(uint32_t));
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    if (n == cap_rows) {
      cap_rows *= 2;
      dense = realloc(dense, cap_rows * s->n_dense * sizeof(float));
      ids = realloc(ids, cap_rows * s->n_sparse * sizeof(uint32_t));
    }
    if (!dense || !ids) return 1;
    if (dlrec_etl_encode_line(m->etl, line, (size_t)len, 0, NULL, dense + n * s->n_dense, ids + n * s->n_sparse) !=
        DLREC_OK) {
      fprintf(stderr, "bench_score: %s:%zu: %s\n", rows_path, n + 1, dlrec_last_error());
      return 1;
    }
    n++;
  }
  fclose(f);
  free(line);
  if (!n) {
    fprintf(stderr, "bench_score: %s: no rows\n", rows_path);
    return 1;
  }
  uint32_t *cols = malloc(n * s->n_sparse * sizeof(uint32_t));
  for (size_t r = 0; r < n; r++)
    for (uint32_t c = 0; c < s->n_sparse; c++) cols[(size_t)c * n + r] = ids[r * s->n_sparse + c];
  sh.n_rows = (uint32_t)n;
  sh.dense = dense;
  sh.cols = cols;
  dlrec_backend_config bc = {1, DLREC_PRECISION_FP32, 0};
  dlrec_backend *be;
  if (dlrec_backend_create(&be, "cpu", &bc) != DLREC_OK) {
    fprintf(stderr, "bench_score: %s\n", dlrec_last_error());
    return 1;
  }
  if (dlrec_net_set_backend(m->net, be) != DLREC_OK) {
    fprintf(stderr, "bench_score: %s\n", dlrec_last_error());
    return 1;
  }
  dlrec_net_scorer *scorer;
  if (dlrec_net_scorer_create(&scorer, m->net) != DLREC_OK) {
    fprintf(stderr, "bench_score: %s\n", dlrec_last_error());
    return 1;
  }
  sh.scorer = scorer;
  worker *w = calloc(threads, sizeof *w);
  pthread_t *tid = calloc(threads, sizeof *tid);
  for (uint32_t i = 0; i < threads; i++) {
    w[i].sh = &sh;
    pthread_create(&tid[i], NULL, run, &w[i]);
  }
  double rate = 0;
  for (uint32_t i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    if (w[i].failed) {
      fprintf(stderr, "bench_score: scoring failed: %s\n", dlrec_last_error());
      return 1;
    }
    rate += w[i].rows / w[i].elapsed;
  }
  printf("{\"batch\": %u, \"threads\": %u, \"rows_per_s\": %.0f}\n", batch, threads, rate);
  dlrec_net_scorer_free(scorer);
  dlrec_model_free(m);
  dlrec_backend_free(be);
  free(dense);
  free(ids);
  free(cols);
  free(w);
  free(tid);
  return 0;
}
