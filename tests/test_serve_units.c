/* The server's parts below HTTP (serve/serve_internal.h), at their
 * boundaries: the batch-size histogram's bucket edges (a batch of exactly
 * 2^i rows belongs to the bucket le="2^i") and the batcher's queue bound (a
 * request that exactly fills the queue is taken, one row more is refused).
 * test_serve covers the same parts through a running server, where these
 * edges are hard to hit on purpose. */
#include "model/dlrm.h"
#include "serve/kserve.h"
#include "serve/serve_batch.h"
#include "serve/serve_internal.h"
#include "test.h"

/* The bucket of a batch of `rows` rows, worked out independently of prom.c:
 * the smallest i with rows <= 2^i, i.e. ceil(log2(rows)), or the +Inf bucket
 * (SERVE_BATCH_BUCKETS) past the last bound. */
static int ref_bucket(uint32_t rows) {
  int i = rows <= 1 ? 0 : 32 - __builtin_clz(rows - 1);
  return i < SERVE_BATCH_BUCKETS ? i : SERVE_BATCH_BUCKETS;
}

/* Renders the metrics with an empty registry (no model loaded). */
static int metrics_text(serve_metrics *m, dlrec_kserve_buf *b) {
  serve_registry reg;
  memset(&reg, 0, sizeof reg);
  pthread_mutex_init(&reg.mu, NULL);
  snprintf(reg.name, sizeof reg.name, "units");
  dlrec_status st = serve_metrics_write(m, b, 0, &reg, NULL);
  pthread_mutex_destroy(&reg.mu);
  return st == DLREC_OK;
}

TEST(batch_histogram_puts_exactly_2_pow_i_rows_in_bucket_le_2_pow_i) {
  serve_metrics m;
  serve_metrics_init(&m);
  /* Each power of two, one row more and one row less, so every edge is hit
   * from both sides. */
  uint64_t want[SERVE_BATCH_BUCKETS + 1] = {0}, rows_sum = 0, batches = 0;
  for (int i = 0; i <= SERVE_BATCH_BUCKETS; i++) {
    const uint32_t p = 1u << i, sizes[3] = {p, p + 1, p - 1};
    for (int k = 0; k < 3; k++) {
      if (sizes[k] == 0) continue;
      serve_metrics_batch(&m, sizes[k], 0);
      want[ref_bucket(sizes[k])]++;
      rows_sum += sizes[k];
      batches++;
    }
  }
  for (int i = 0; i <= SERVE_BATCH_BUCKETS; i++)
    if (m.batch[i] != want[i])
      test_fail(__FILE__, __LINE__, "bucket %d: %llu batches, expected %llu", i, (unsigned long long)m.batch[i],
                (unsigned long long)want[i]);
  if (test_failed_now()) return;
  /* The exposition: cumulative counts per bound, +Inf, sum and count. */
  dlrec_kserve_buf b;
  dlrec_kserve_buf_init(&b);
  CHECK(metrics_text(&m, &b));
  char line[160];
  uint64_t cum = 0;
  for (int i = 0; i < SERVE_BATCH_BUCKETS && !test_failed_now(); i++) {
    cum += want[i];
    snprintf(line, sizeof line, "\ndlrec_batch_rows_bucket{le=\"%u\"} %llu\n", 1u << i, (unsigned long long)cum);
    if (!strstr(b.data, line)) test_fail(__FILE__, __LINE__, "missing line: %s", line + 1);
  }
  snprintf(line, sizeof line, "\ndlrec_batch_rows_bucket{le=\"+Inf\"} %llu\ndlrec_batch_rows_sum %llu\n",
           (unsigned long long)batches, (unsigned long long)rows_sum);
  if (!test_failed_now() && !strstr(b.data, line)) test_fail(__FILE__, __LINE__, "missing lines: %s", line + 1);
  dlrec_kserve_buf_free(&b);
  serve_metrics_destroy(&m);
}

/* ---- the batcher's queue bound, with a real (tiny) model ---- */

/* One dense and one one-hot column of 4 ids. */
static void tiny_schema(dlrec_schema *s) {
  memset(s, 0, sizeof *s);
  s->n_dense = 1;
  strcpy(s->dense_names[0], "I1");
  s->n_sparse = 1;
  strcpy(s->sparse[0].name, "C1");
  s->sparse[0].hotness = s->sparse[0].max_hotness = 1;
  s->sparse[0].id_begin = 0;
  s->sparse[0].id_end = 4;
  s->table_rows = 4;
}

/* B rows in the HugeCTR convention, all in JSON: row r has dense r / 4 and
 * id r % 4. */
static dlrec_status make_rows(dlrec_serve_rows **out, const dlrec_schema *s, uint32_t B) {
  test_buf j = {0};
  test_buf_printf(&j, "{\"inputs\":[{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[%u],\"data\":[0", B + 1);
  for (uint32_t r = 1; r <= B; r++) test_buf_printf(&j, ",%u", r);
  test_buf_printf(&j, "]},{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[%u],\"data\":[", B);
  for (uint32_t r = 0; r < B; r++) test_buf_printf(&j, "%s%g", r ? "," : "", r / 4.0);
  test_buf_printf(&j, "]},{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[%u],\"data\":[", B);
  for (uint32_t r = 0; r < B; r++) test_buf_printf(&j, "%s%u", r ? "," : "", r % 4);
  test_buf_printf(&j, "]}]}");
  dlrec_kserve_request *req = NULL;
  dlrec_status st = dlrec_serve_rows_new(out, s, NULL);
  if (st == DLREC_OK) st = dlrec_kserve_parse_request(j.p, j.n, -1, NULL, &req);
  if (st == DLREC_OK) st = dlrec_serve_rows_add_request(*out, req, B, NULL);
  dlrec_kserve_request_free(req);
  test_buf_free(&j);
  return st;
}

/* A raw-keys model takes CATCOLUMN's values as its 64-bit keys: each key
 * becomes its two ids (low, high), and ROWINDEX counts keys. */
TEST(hugectr_catcolumn_carries_raw_keys) {
  dlrec_schema s;
  tiny_schema(&s);
  s.keys = 1;
  s.table_rows = s.sparse[0].id_end = 1ull << 32;
  s.sparse[0].hotness = s.sparse[0].max_hotness = 2;
  const char *body = "{\"inputs\":[{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[3],\"data\":[0,1,2]},"
                     "{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[2],\"data\":[0.5,1.5]},"
                     "{\"name\":\"CATCOLUMN\",\"datatype\":\"UINT64\",\"shape\":[2],"
                     "\"data\":[9007199254740991,7]}]}";
  dlrec_serve_rows *r = NULL;
  dlrec_kserve_request *req = NULL;
  CHECK_OK(dlrec_serve_rows_new(&r, &s, NULL));
  CHECK_OK(dlrec_kserve_parse_request(body, strlen(body), -1, NULL, &req));
  CHECK_OK(dlrec_serve_rows_add_request(r, req, 2, NULL));
  dlrec_batch b;
  dlrec_serve_rows_batch(r, &b);
  CHECK_EQ(b.rows, 2);
  /* 9007199254740991 = 2^53 - 1 = 0x001fffffffffffff (JSON carries integers up to 2^53 exactly) */
  CHECK(b.offsets[0][1] == 2 && b.offsets[0][2] == 4);
  CHECK(b.ids[0][0] == 0xffffffffu && b.ids[0][1] == 0x001fffffu && b.ids[0][2] == 7 && b.ids[0][3] == 0);
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_free(r);
  /* Two keys for a one-key column: refused, counting keys. */
  const char *two = "{\"inputs\":[{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[2],\"data\":[0,2]},"
                    "{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[0.5]},"
                    "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[2],\"data\":[1,2]}]}";
  CHECK_OK(dlrec_serve_rows_new(&r, &s, NULL));
  CHECK_OK(dlrec_kserve_parse_request(two, strlen(two), -1, NULL, &req));
  CHECK_ERR(dlrec_serve_rows_add_request(r, req, 2, NULL), DLREC_ERR_PARSE, "2 keys, the column takes exactly 1");
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_free(r);
}

TEST(batcher_takes_a_request_that_exactly_fills_the_queue) {
  enum { QUEUE = 8 };
  dlrec_schema s;
  tiny_schema(&s);
  dlrec_dlrm_shape sh = {.emb_dim = 2, .n_bottom = 1, .bottom = {2}, .n_top = 1, .top = {1},
                         .pooling = DLREC_POOLING_SUM};
  dlrec_net *dlrm = NULL;
  dlrec_net_scorer *scorer = NULL;
  dlrec_net_ws *ws = NULL;
  CHECK_OK(dlrec_dlrm_create(&dlrm, &sh, &s));
  CHECK_OK(dlrec_net_init(dlrm, 3));
  CHECK_OK(dlrec_net_scorer_create(&scorer, dlrm));
  CHECK_OK(dlrec_net_ws_create(&ws, dlrm, QUEUE + 1));
  dlrec_model model;
  memset(&model, 0, sizeof model);
  model.net = dlrm;
  serve_model sm;
  memset(&sm, 0, sizeof sm);
  atomic_init(&sm.refs, 1);
  sm.serial = 1;
  sm.model = &model;
  sm.scorer = scorer;

  dlrec_serve_rows *full = NULL, *over = NULL;
  CHECK_OK(make_rows(&full, &s, QUEUE));
  CHECK_OK(make_rows(&over, &s, QUEUE + 1));
  /* The reference scores: the scorer called directly on the same rows. */
  float want[QUEUE], got[QUEUE + 1];
  dlrec_batch batch;
  dlrec_serve_rows_batch(full, &batch);
  CHECK_OK(dlrec_net_predict(scorer, ws, &batch, want));

  serve_metrics met;
  serve_metrics_init(&met);
  serve_batcher b;
  /* max_batch is the queue's size too, so one request can fill both. */
  CHECK_OK(serve_batcher_start(&b, 1, QUEUE + 1, 0, QUEUE, &met, NULL));
  serve_job job;
  memset(&job, 0, sizeof job);
  job.model = &sm;
  job.rows = full;
  job.scores = got;
  serve_batcher_receive_begin(&b);
  dlrec_status st = serve_batcher_run(&b, &job);
  if (st != DLREC_OK)
    test_fail(__FILE__, __LINE__, "%u rows into a queue of %u: %s: %s", QUEUE, QUEUE, dlrec_status_name(st),
              dlrec_last_error());
  for (int i = 0; i < QUEUE && st == DLREC_OK; i++) CHECK(got[i] == want[i]);
  /* One row more than the queue holds: refused at once, as overload. */
  if (!test_failed_now()) {
    job.rows = over;
    serve_batcher_receive_begin(&b);
    st = serve_batcher_run(&b, &job);
    if (st != DLREC_ERR_NOMEM || !strstr(dlrec_last_error(), "overloaded: 0 rows queued, the queue holds 8"))
      test_fail(__FILE__, __LINE__, "%u rows into a queue of %u: %s: %s", QUEUE + 1, QUEUE, dlrec_status_name(st),
                dlrec_last_error());
  }
  serve_batcher_stop(&b);
  /* The scored batch of 8 rows was counted once, in bucket le="8". */
  if (!test_failed_now() && (met.batches != 1 || met.batch[3] != 1))
    test_fail(__FILE__, __LINE__, "%llu batches, %llu in bucket le=8", (unsigned long long)met.batches,
              (unsigned long long)met.batch[3]);
  serve_metrics_destroy(&met);
  dlrec_serve_rows_free(full);
  dlrec_serve_rows_free(over);
  dlrec_net_ws_free(ws);
  dlrec_net_scorer_free(scorer);
  dlrec_net_free(dlrm);
}
