/* Fuzz target for the KServe v2 / Triton request parser and what follows
 * it: arbitrary bytes as an inference request body, with or without the
 * binary tensor data extension, then (when it parses) every element read
 * back, a response and an error written, and the rows built for a small
 * fixed schema the HugeCTR way (the raw way needs an ETL state and stops at
 * its check). Must never crash, hang, read out of bounds or leak, and the
 * rows it accepts must be a well-formed batch.
 *
 * Input: byte 0 and 1 choose Inference-Header-Content-Length, the rest is the
 * body. mode = byte0 & 3: 0 absent (-1); 1 the whole body; 2 and 3
 * ((byte0 >> 2) << 8 | byte1) % (body length + 2), which may also point one
 * past the body. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/kserve.h"
#include "serve/serve_batch.h"

/* dense a, b; sparse c0 [0,10) one-hot, c1 [10,20) up to 3 ids, c2 [20,25)
 * exactly 2 ids. */
static void fuzz_schema(dlrec_schema *s) {
  memset(s, 0, sizeof *s);
  s->n_dense = 2;
  s->n_sparse = 3;
  strcpy(s->dense_names[0], "a");
  strcpy(s->dense_names[1], "b");
  const uint32_t hot[3] = {1, 0, 2}, max[3] = {1, 3, 2};
  for (int c = 0; c < 3; c++) {
    s->sparse[c].name[0] = 'c';
    s->sparse[c].name[1] = (char)('0' + c);
    s->sparse[c].hotness = hot[c];
    s->sparse[c].max_hotness = max[c];
    s->sparse[c].id_begin = (uint64_t)c * 10;
    s->sparse[c].id_end = c == 2 ? 25 : (uint64_t)c * 10 + 10;
  }
  s->table_rows = 25;
}

/* Reads every element, so that a bad pointer or count shows up here. */
static uint64_t touch(const dlrec_kserve_tensor *t) {
  uint64_t h = t->count;
  for (uint64_t i = 0; i < t->count; i++) {
    if (t->dtype == DLREC_KSERVE_BYTES) {
      const dlrec_kserve_str s = t->strs[i];
      h += s.n;
      if (s.n) h += (unsigned char)s.s[0] + (unsigned char)s.s[s.n - 1];
    } else if (t->dtype == DLREC_KSERVE_FP32 || t->dtype == DLREC_KSERVE_FP64) {
      double d = dlrec_kserve_get_f64(t, i);
      h += d == d;
    } else {
      h += (uint64_t)dlrec_kserve_get_i64(t, i);
    }
  }
  return h;
}

/* The batch invariants the model relies on. */
static void check_batch(const dlrec_batch *b, const dlrec_schema *s) {
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    if (b->offsets[c][0] != 0) abort();
    for (uint32_t r = 0; r < b->rows; r++) {
      uint32_t lo = b->offsets[c][r], hi = b->offsets[c][r + 1];
      if (hi < lo || hi - lo > s->sparse[c].max_hotness) abort();
      for (uint32_t q = lo; q < hi; q++)
        if (b->ids[c][q] < s->sparse[c].id_begin || b->ids[c][q] >= s->sparse[c].id_end) abort();
    }
  }
  for (uint64_t i = 0; i < (uint64_t)b->rows * s->n_dense; i++)
    if (!(b->dense[i] - b->dense[i] == 0)) abort(); /* finite */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static dlrec_schema schema;
  static dlrec_serve_rows *rows, *all;
  static dlrec_kserve_buf buf;
  static float scores[1024];
  if (!rows) {
    fuzz_schema(&schema);
    if (dlrec_serve_rows_new(&rows, &schema, NULL) != DLREC_OK) abort();
    if (dlrec_serve_rows_new(&all, &schema, NULL) != DLREC_OK) abort();
    for (int i = 0; i < 1024; i++) scores[i] = (float)i / 1024.0f;
  }
  if (size < 2) return 0;
  const char *body = (const char *)data + 2;
  size_t n = size - 2;
  long long header_len;
  switch (data[0] & 3) {
  case 0: header_len = -1; break;
  case 1: header_len = (long long)n; break;
  default: header_len = (long long)((((size_t)data[0] >> 2) << 8 | data[1]) % (n + 2)); break;
  }
  dlrec_kserve_limits lim;
  dlrec_kserve_limits_default(&lim);
  lim.max_elements = 1 << 16;
  lim.max_string_bytes = 1024;

  dlrec_kserve_request *req;
  if (dlrec_kserve_parse_request(body, n, header_len, &lim, &req) != DLREC_OK) {
    (void)dlrec_kserve_write_error(&buf, dlrec_last_error());
    return 0;
  }
  uint64_t h = 0;
  for (uint32_t i = 0; i < dlrec_kserve_request_n_inputs(req); i++) h += touch(dlrec_kserve_request_input(req, i));
  for (uint32_t i = 0; i < dlrec_kserve_request_n_outputs(req); i++) {
    int bin;
    h += strlen(dlrec_kserve_request_output(req, i, &bin)) + (uint64_t)(bin + 1);
  }
  int binary = 0;
  (void)dlrec_kserve_request_output_binary(req, DLREC_KSERVE_OUTPUT, &binary);

  dlrec_serve_rows_clear(rows);
  uint32_t added = 0;
  if (dlrec_serve_rows_add_request(rows, req, 512, &added) == DLREC_OK) {
    dlrec_batch b;
    dlrec_serve_rows_batch(rows, &b);
    if (b.rows != added || added == 0) abort();
    check_batch(&b, &schema);
    /* Dynamic batching: append into a growing batch, emptied now and then. */
    if (dlrec_serve_rows_count(all) > 4096) dlrec_serve_rows_clear(all);
    if (dlrec_serve_rows_append(all, rows) == DLREC_OK) {
      dlrec_serve_rows_batch(all, &b);
      check_batch(&b, &schema);
    }
  } else {
    if (dlrec_serve_rows_count(rows) != 0) abort(); /* a failed add leaves the rows as they were */
    (void)dlrec_kserve_write_error(&buf, dlrec_last_error());
  }
  dlrec_kserve_response resp = {"fuzz", "1", dlrec_kserve_request_id(req), scores,
                                (uint32_t)((h + added) % 1025), binary};
  size_t hl;
  if (dlrec_kserve_write_response(&buf, &resp, &hl) != DLREC_OK || hl > buf.len) abort();
  dlrec_kserve_request_free(req);
  return 0;
}
