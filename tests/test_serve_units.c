/* The server's parts below HTTP (serve/serve_internal.h), at their
 * boundaries: the batch-size histogram's bucket edges (a batch of exactly
 * 2^i rows belongs to the bucket le="2^i") and the batcher's queue bound (a
 * request that exactly fills the queue is taken, one row more is refused).
 * Also the request memory (the in-flight budget, the rows pool), the
 * pre-scan of a request's JSON, and the connection guard's choices (which
 * connection is shed, which is cut at its deadline) on socket pairs with
 * the clock given. test_serve covers the same parts through a running
 * server, where these edges are hard to hit on purpose. */
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

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
  dlrec_status st = serve_metrics_write(m, b, 0, &reg, NULL, NULL);
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

/* ---- request memory: the in-flight budget and the rows pool ---- */

TEST(inflight_budget_takes_up_to_the_budget_and_refuses_past_it) {
  serve_reqmem m;
  serve_reqmem_init(&m, 1000, 2);
  CHECK(serve_reqmem_charge(&m, 600));
  CHECK(!serve_reqmem_charge(&m, 401)); /* 1001 > 1000: refused, nothing charged */
  CHECK_EQ_U64(m.charged, 600);
  CHECK(serve_reqmem_charge(&m, 400)); /* exactly the budget */
  CHECK(!serve_reqmem_charge(&m, 1));
  CHECK(!serve_reqmem_charge(&m, UINT64_MAX)); /* no wrap-around */
  CHECK_EQ_U64(m.refused, 3);
  serve_reqmem_uncharge(&m, 600);
  CHECK_EQ_U64(m.charged, 400);
  CHECK(!serve_reqmem_charge(&m, 601));
  CHECK(serve_reqmem_charge(&m, 600));
  serve_reqmem_uncharge(&m, 1000);
  CHECK_EQ_U64(m.charged, 0);
  CHECK(!serve_reqmem_charge(&m, 1001)); /* one request over the whole budget */
  serve_reqmem_destroy(&m);
  /* 0: no budget */
  serve_reqmem_init(&m, 0, 2);
  CHECK(serve_reqmem_charge(&m, UINT64_MAX));
  serve_reqmem_destroy(&m);
  /* What parsing is charged: the JSON twice and 80 bytes a value. */
  CHECK_EQ_U64(serve_parse_cost(1000, 10), 2 * 1000 + 80 * 10);
}

TEST(rows_pool_keeps_at_most_pool_max_and_counts_their_bytes) {
  enum { POOL = 2, TAKEN = 5 };
  dlrec_schema s;
  tiny_schema(&s);
  dlrec_dlrm_shape sh = {.emb_dim = 2, .n_bottom = 1, .bottom = {2}, .n_top = 1, .top = {1},
                         .pooling = DLREC_POOLING_SUM};
  dlrec_net *dlrm = NULL;
  CHECK_OK(dlrec_dlrm_create(&dlrm, &sh, &s));
  dlrec_model model;
  memset(&model, 0, sizeof model);
  model.net = dlrm;
  serve_model sm, other;
  memset(&sm, 0, sizeof sm);
  sm.serial = 1;
  sm.model = &model;
  other = sm;
  other.serial = 2;
  serve_reqmem m;
  serve_reqmem_init(&m, 0, POOL);
  /* Five requests in flight at once (five connections): five rows objects. */
  serve_pooled_rows lease[TAKEN];
  uint64_t one = 0;
  for (int i = 0; i < TAKEN; i++) {
    CHECK(serve_reqmem_rows_take(&m, &sm, &lease[i]) != NULL);
    one = dlrec_serve_rows_bytes(lease[i].rows);
  }
  CHECK_EQ_U64(serve_reqmem_buffer_bytes(&m), TAKEN * one);
  /* One grows while in use (a larger request): counted when returned. */
  CHECK_OK(dlrec_serve_rows_reserve(lease[0].rows, 1000));
  const uint64_t big = dlrec_serve_rows_bytes(lease[0].rows);
  CHECK(big > one);
  for (int i = TAKEN - 1; i >= 0; i--) serve_reqmem_rows_give(&m, &lease[i]);
  /* Returned in the order 4, 3, 2, 1, 0: the pool keeps the last two (1
   * and the grown 0); the others were freed. */
  CHECK_EQ(m.pooled, POOL);
  CHECK_EQ_U64(serve_reqmem_buffer_bytes(&m), big + one);
  /* The next request of the model takes the most recently returned (the
   * grown one, now empty); another model's gets a new one. */
  serve_pooled_rows a, b;
  CHECK(serve_reqmem_rows_take(&m, &sm, &a) != NULL);
  CHECK_EQ_U64(dlrec_serve_rows_bytes(a.rows), big);
  CHECK_EQ(dlrec_serve_rows_count(a.rows), 0);
  CHECK(serve_reqmem_rows_take(&m, &other, &b) != NULL);
  CHECK_EQ(m.pooled, 1);
  CHECK_EQ_U64(serve_reqmem_buffer_bytes(&m), big + 2 * one);
  serve_reqmem_rows_give(&m, &a);
  serve_reqmem_rows_give(&m, &b); /* the pool is full: the least recent (the model 1 small one) goes */
  CHECK_EQ(m.pooled, POOL);
  CHECK_EQ_U64(serve_reqmem_buffer_bytes(&m), big + one);
  CHECK(m.pool && m.pool->serial == 2 && m.pool->next && m.pool->next->serial == 1 &&
        m.pool->next->bytes == big);
  serve_reqmem_destroy(&m);
  dlrec_net_free(dlrm);
}

/* ---- the pre-scan of a request's JSON ---- */

TEST(prescan_refuses_shapes_and_values_over_the_limits_before_parsing) {
  const serve_prescan_limits lim = {.max_rows = 8, .max_elements = 100, .max_values = 60};
  char msg[512];
  uint64_t values = 0;
  /* A request within the limits: every value counted (objects, arrays,
   * keys' values, the data). */
  const char *ok = "{\"id\":\"a\",\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[8,2],"
                   "\"data\":[[1,2],[3,4],[5,6],[7,8],[9,10],[11,12],[13,14],[15,16]]}]}";
  CHECK_EQ(serve_prescan_json(ok, strlen(ok), &lim, &values, msg, sizeof msg), 0);
  /* root, id, inputs, the input, name, datatype, shape + 2 dims, data + 8 rows + 16 values */
  CHECK_EQ_U64(values, 1 + 1 + 1 + 1 + 1 + 1 + 3 + 1 + 8 + 16);
  /* 9 rows: refused, though the JSON goes on malformed after the shape:
   * cJSON, which would refuse the JSON, never sees it. */
  const char *rows = "{\"inputs\":[{\"name\":\"dense\",\"shape\":[9, 2],\"data\":[###";
  CHECK_EQ(serve_prescan_json(rows, strlen(rows), &lim, NULL, msg, sizeof msg), 400);
  CHECK(strstr(msg, "inputs[0]: shape [9, ...]: 9 rows, more than the limit of 8") != NULL);
  /* [1, 101] (HugeCTR's layout, one "row"): its elements; the second input is counted with the first. */
  const char *els = "{\"inputs\":[{\"shape\":[1,60]},{\"name\":\"x\",\"shape\":[41]}]}";
  CHECK_EQ(serve_prescan_json(els, strlen(els), &lim, NULL, msg, sizeof msg), 400);
  CHECK(strstr(msg, "inputs[1]: shape with 41 elements: the request's inputs exceed the limit of 100") != NULL);
  const char *els_ok = "{\"inputs\":[{\"shape\":[1,60]},{\"name\":\"x\",\"shape\":[40]}]}";
  CHECK_EQ(serve_prescan_json(els_ok, strlen(els_ok), &lim, NULL, msg, sizeof msg), 0);
  /* Overflowing dimensions saturate. */
  const char *huge = "{\"inputs\":[{\"shape\":[1,4294967296,4294967296]}]}";
  CHECK_EQ(serve_prescan_json(huge, strlen(huge), &lim, NULL, msg, sizeof msg), 400);
  /* Values: 61 in a data array whose shape says 1. */
  test_buf j = {0};
  test_buf_printf(&j, "{\"inputs\":[{\"shape\":[1],\"data\":[0");
  for (int i = 1; i < 61; i++) test_buf_printf(&j, ",%d", i);
  test_buf_printf(&j, "]}]}");
  CHECK_EQ(serve_prescan_json(j.p, j.n, &lim, NULL, msg, sizeof msg), 400);
  CHECK(strstr(msg, "more than 60 JSON values") != NULL);
  test_buf_free(&j);
  /* "shape" only counts in an input of "inputs"; strings and escapes are
   * skipped whole (a "]" or a quote inside one ends nothing). */
  const char *elsewhere = "{\"parameters\":{\"shape\":[99,99]},\"id\":\"[\\\"]\",\"inputs\":[{\"shape\":[2,2]}]}";
  CHECK_EQ(serve_prescan_json(elsewhere, strlen(elsewhere), &lim, NULL, msg, sizeof msg), 0);
  /* Malformed JSON is cJSON's to refuse (with its position). */
  const char *bad[] = {"", "{", "{\"inputs\":[{\"shape\":[2,", "[1,2}", "{\"inputs\" 1}", "\"abc"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    CHECK_EQ(serve_prescan_json(bad[i], strlen(bad[i]), &lim, NULL, msg, sizeof msg), 0);
  /* It reads nothing past n: a body cut inside a string. */
  const char cut[] = "{\"inputs\":[{\"shape\":[9,2]}]}";
  CHECK_EQ(serve_prescan_json(cut, 24, &lim, NULL, msg, sizeof msg), 0);
}

TEST(body_limit_follows_max_batch_and_the_model_values) {
  dlrec_schema s;
  tiny_schema(&s);
  s.n_sparse = 2;
  s.sparse[1] = s.sparse[0];
  s.sparse[1].max_hotness = 5;
  /* 1 dense + 2 columns (raw values, ROWINDEX) + hotness 1 + 5 */
  CHECK_EQ_U64(serve_values_per_row(&s), 1 + 2 + 1 + 5);
  CHECK_EQ_U64(serve_values_per_row(NULL), 0);
  CHECK_EQ_U64(serve_default_body_limit(1024, 9), 65536 + 1024ull * 9 * 64);
  CHECK_EQ_U64(serve_default_body_limit(1, 0), 65536);
}

/* ---- the connection guard: who is shed, who is cut ---- */

typedef struct guard_peer {
  int ours, theirs; /* a socket pair: the server's end and the client's */
  serve_conn *c;
} guard_peer;

static int peer_open(serve_conns *g, guard_peer *p) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
  p->ours = sv[0];
  p->theirs = sv[1];
  fcntl(p->theirs, F_SETFL, fcntl(p->theirs, F_GETFL) | O_NONBLOCK);
  p->c = serve_conn_open(g, p->ours);
  return p->c != NULL;
}

/* What the client end got: "" while open and silent, "EOF" when shut down
 * without a word, else the status line's code ("408", "503"). */
static const char *peer_heard(guard_peer *p, char *buf, size_t cap) {
  char in[1024];
  ssize_t n = recv(p->theirs, in, sizeof in - 1, 0);
  if (n < 0) return snprintf(buf, cap, "%s", ""), buf;
  if (n == 0) return snprintf(buf, cap, "EOF"), buf;
  in[n] = 0;
  snprintf(buf, cap, "%.3s", strncmp(in, "HTTP/1.1 ", 9) ? "?" : in + 9);
  return buf;
}

static void peer_close(serve_conns *g, guard_peer *p) {
  serve_conn_closed(g, p->c);
  close(p->ours);
  close(p->theirs);
}

TEST(guard_sheds_the_oldest_idle_then_headers_then_body_never_one_being_answered) {
  enum { N = 6 };
  /* static: a failed CHECK returns with the watchdog running on it, and the
   * next test's guard must not land where this one was */
  static serve_conns g;
  CHECK_OK(serve_conns_start(&g, 4, 30, 30));
  guard_peer p[N];
  char heard[16];
  for (int i = 0; i < 4; i++) CHECK(peer_open(&g, &p[i]));
  /* 0 answered, 1 sending its body, 2 and 3 idle (3 the older idle one). */
  serve_conn_phase_set(&g, p[0].c, SERVE_CONN_HANDLING);
  serve_conn_phase_set(&g, p[1].c, SERVE_CONN_BODY);
  serve_conn_phase_set(&g, p[2].c, SERVE_CONN_IDLE);
  serve_conn_phase_set(&g, p[3].c, SERVE_CONN_IDLE);
  p[2].c->started = 200;
  p[3].c->started = 100;
  p[1].c->started = 50;
  /* A fifth: the oldest idle one (3) goes, without a word. */
  CHECK(peer_open(&g, &p[4]));
  CHECK_STR(peer_heard(&p[3], heard, sizeof heard), "EOF");
  for (int i = 0; i < 3; i++) CHECK_STR(peer_heard(&p[i], heard, sizeof heard), "");
  CHECK_EQ_U64(g.shed, 1);
  /* A sixth: the other idle one (2), though 4, sending headers, is newer
   * and 1, sending its body, older. */
  CHECK(peer_open(&g, &p[5]));
  CHECK_STR(peer_heard(&p[2], heard, sizeof heard), "EOF");
  /* Then the oldest of those still sending headers (4 before 5) gets 503. */
  p[4].c->started = 300;
  p[5].c->started = 400;
  guard_peer q;
  CHECK(peer_open(&g, &q));
  CHECK_STR(peer_heard(&p[4], heard, sizeof heard), "503");
  CHECK_STR(peer_heard(&p[5], heard, sizeof heard), "");
  CHECK_STR(peer_heard(&q, heard, sizeof heard), "");
  /* Then one sending its body (1), before the newcomer's own headers: make
   * q and 5 the body senders' juniors by answering them. */
  serve_conn_phase_set(&g, p[5].c, SERVE_CONN_HANDLING);
  serve_conn_phase_set(&g, q.c, SERVE_CONN_HANDLING);
  guard_peer r;
  CHECK(peer_open(&g, &r));
  CHECK_STR(peer_heard(&p[1], heard, sizeof heard), "503");
  CHECK_STR(peer_heard(&r, heard, sizeof heard), "");
  /* Every other connection being answered: the newcomer itself is turned away. */
  serve_conn_phase_set(&g, r.c, SERVE_CONN_HANDLING);
  guard_peer late;
  CHECK(peer_open(&g, &late));
  CHECK_STR(peer_heard(&late, heard, sizeof heard), "503");
  CHECK_STR(peer_heard(&p[0], heard, sizeof heard), "");
  CHECK_EQ_U64(g.shed, 5);
  for (int i = 0; i < N; i++) peer_close(&g, &p[i]);
  peer_close(&g, &q);
  peer_close(&g, &r);
  peer_close(&g, &late);
  CHECK_EQ(g.open, 0);
  CHECK_EQ(g.closing, 0);
  serve_conns_stop(&g);
}

TEST(guard_cuts_past_the_deadline_by_phase_never_a_request_being_answered) {
  static serve_conns g; /* static: see above */
  CHECK_OK(serve_conns_start(&g, 16, 5, 7)); /* request deadline 5 s, idle 7 s */
  guard_peer hdr, body, busy, idle;
  char heard[16];
  CHECK(peer_open(&g, &hdr));
  CHECK(peer_open(&g, &body));
  CHECK(peer_open(&g, &busy));
  CHECK(peer_open(&g, &idle));
  /* The body keeps the deadline of its request's start: its headers took
   * a while (20 ms), and the body does not get 5 s more from their end. */
  const double body_deadline = body.c->deadline;
  usleep(20000);
  serve_conn_phase_set(&g, body.c, SERVE_CONN_BODY);
  CHECK(body.c->deadline == body_deadline);
  serve_conn_phase_set(&g, busy.c, SERVE_CONN_BODY);
  serve_conn_phase_set(&g, busy.c, SERVE_CONN_HANDLING); /* the whole request came: being scored */
  serve_conn_phase_set(&g, idle.c, SERVE_CONN_IDLE);
  const double t = idle.c->started; /* the latest start */
  /* Just before the request deadline: nobody is cut; the next deadline is
   * the earliest request's. */
  double next = serve_conns_sweep(&g, hdr.c->started + 4.9);
  CHECK(next == hdr.c->deadline);
  CHECK_STR(peer_heard(&hdr, heard, sizeof heard), "");
  /* Past it (and the body keeps the deadline of its request's start):
   * headers and body get 408, the request being scored nothing. */
  serve_conns_sweep(&g, t + 5.0);
  CHECK_STR(peer_heard(&hdr, heard, sizeof heard), "408");
  CHECK_STR(peer_heard(&body, heard, sizeof heard), "408");
  CHECK_STR(peer_heard(&busy, heard, sizeof heard), "");
  CHECK_STR(peer_heard(&idle, heard, sizeof heard), "");
  CHECK_EQ_U64(g.timed_out, 2);
  /* Past the idle deadline, long past any request deadline: the idle one
   * is closed without a word, the one being scored still stands. */
  serve_conns_sweep(&g, t + 7.0);
  CHECK_STR(peer_heard(&idle, heard, sizeof heard), "EOF");
  serve_conns_sweep(&g, t + 1e6);
  CHECK_STR(peer_heard(&busy, heard, sizeof heard), "");
  CHECK_EQ_U64(g.timed_out, 2);
  /* Answered, it turns idle: now its idle deadline counts. */
  serve_conn_phase_set(&g, busy.c, SERVE_CONN_IDLE);
  serve_conns_sweep(&g, busy.c->started + 7.0);
  CHECK_STR(peer_heard(&busy, heard, sizeof heard), "EOF");
  peer_close(&g, &hdr);
  peer_close(&g, &body);
  peer_close(&g, &busy);
  peer_close(&g, &idle);
  serve_conns_stop(&g);
}

/* The model control token file: one line of printable ASCII without blanks,
 * a trailing newline (or CRLF) allowed, at least 16 characters; a bad byte
 * anywhere in it is named by its position. */
TEST(token_file_is_one_printable_line_of_16_or_more) {
  static const struct {
    const char *text, *want; /* want: the token, or NULL with err */
    const char *err;
  } cases[] = {
      {"k3y-0f-the-m0del-c0ntrol\n", "k3y-0f-the-m0del-c0ntrol", NULL},
      {"0123456789abcdef\r\n", "0123456789abcdef", NULL},
      {"0123456789abcdef", "0123456789abcdef", NULL},
      {"0123456789abcde\n", NULL, "has 15 characters; use at least 16"},
      {" 123456789abcdefgh", NULL, "byte 0 of the model control token"},
      {"01234 6789abcdefgh", NULL, "byte 5 of the model control token"},
      {"0123456789abcdefg\x7f", NULL, "byte 17 of the model control token"},
      {"0123456789abcdef\nsecond-line-here", NULL, "byte 16 of the model control token"},
  };
  const char *path = test_path("token");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    CHECK(test_write_file(path, cases[i].text, strlen(cases[i].text)) == 0);
    char *tok = NULL;
    size_t len = 0;
    dlrec_status s = serve_read_token(path, &tok, &len);
    if (cases[i].want) {
      CHECK_OK(s);
      CHECK(tok && len == strlen(cases[i].want) && memcmp(tok, cases[i].want, len) == 0);
    } else {
      CHECK_ERR(s, DLREC_ERR_INVALID, cases[i].err);
      CHECK(strstr(dlrec_last_error(), path) != NULL);
    }
    free(tok);
  }
}
