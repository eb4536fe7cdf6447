/* The KServe v2 / Triton protocol codec (kserve.h) and requests -> rows
 * (serve_batch.h): JSON and binary requests, every kind of hostile request
 * refused with the field named, responses that round-trip floats bitwise,
 * and rows that match direct calls of the ETL encoders, in both input
 * conventions, concatenated as one request would give them. */
#include <float.h>
#include <stdarg.h>

#include <cjson/cJSON.h>

#include "data/etl.h"
#include "serve/kserve.h"
#include "core/rng.h"
#include "serve/serve_batch.h"
#include "test.h"

/* ---- helpers ---- */

/* A growable byte string for building request bodies. */
typedef test_buf sbuf;

static void sb_u32(sbuf *b, uint32_t v) {
  unsigned char le[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  test_buf_put(b, le, 4);
}

/* Parses a NUL-terminated JSON body (no binary section). */
static dlrec_status parse(const char *json, dlrec_kserve_request **r) {
  return dlrec_kserve_parse_request(json, strlen(json), -1, NULL, r);
}

/* Parses and must fail with `want` and a message containing `substr`;
 * returns 1 when it did. */
static int refused(const char *body, size_t n, long long header_len, const dlrec_kserve_limits *lim, dlrec_status want,
                   const char *substr) {
  dlrec_kserve_request *r = NULL;
  dlrec_status st = dlrec_kserve_parse_request(body, n, header_len, lim, &r);
  dlrec_kserve_request_free(r);
  if (st == want && strstr(dlrec_last_error(), substr) && r == NULL) return 1;
  fprintf(stderr, "  request %.200s\n  expected %s containing \"%s\", got %s: \"%s\"\n", body, dlrec_status_name(want),
          substr, dlrec_status_name(st), dlrec_last_error());
  return 0;
}

/* ---- parsing JSON ---- */

TEST(parse_json_nested_and_flat_give_the_same_tensors) {
  const char *nested =
      "{\"id\":\"r1\",\"parameters\":{\"binary_data_output\":false,\"priority\":3},"
      "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,3],"
      "\"data\":[[1,2.5,-3],[4e2,0.125,6]]},"
      "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[2,1],\"data\":[[\"a\"],[\"\\u00e9\\\"\"]]}],"
      "\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":true}}]}";
  const char *flat =
      "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2,3],"
      "\"data\":[1,2.5,-3,4e2,0.125,6]},"
      "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[2,1],\"data\":[\"a\",\"\\u00e9\\\"\"]}]}";
  dlrec_kserve_request *a, *b;
  CHECK_OK(parse(nested, &a));
  dlrec_status st = parse(flat, &b);
  if (st != DLREC_OK) dlrec_kserve_request_free(a);
  CHECK_OK(st);
  int ok = 1;
  for (int k = 0; k < 2 && ok; k++) {
    const dlrec_kserve_request *r = k ? b : a;
    ok = dlrec_kserve_request_n_inputs(r) == 2;
    const dlrec_kserve_tensor *x = dlrec_kserve_request_find_input(r, "x");
    const dlrec_kserve_tensor *s = dlrec_kserve_request_find_input(r, "s");
    ok = ok && x && s && x->dtype == DLREC_KSERVE_FP32 && x->rank == 2 && x->shape[0] == 2 && x->shape[1] == 3 &&
         x->count == 6 && !x->binary && x->data && !x->strs;
    const float want[] = {1, 2.5f, -3, 400, 0.125f, 6};
    for (int i = 0; ok && i < 6; i++)
      ok = ((const float *)x->data)[i] == want[i] && dlrec_kserve_get_f64(x, i) == want[i];
    ok = ok && s->dtype == DLREC_KSERVE_BYTES && s->count == 2 && s->strs && s->strs[0].n == 1 &&
         !memcmp(s->strs[0].s, "a", 1) && s->strs[1].n == 3 && !memcmp(s->strs[1].s, "\xc3\xa9\"", 3);
  }
  CHECK(ok || (dlrec_kserve_request_free(a), dlrec_kserve_request_free(b), 0));
  CHECK_STR(dlrec_kserve_request_id(a), "r1");
  CHECK(dlrec_kserve_request_id(b) == NULL);
  int bin = -2;
  CHECK_EQ(dlrec_kserve_request_n_outputs(a), 1);
  CHECK_STR(dlrec_kserve_request_output(a, 0, &bin), "OUTPUT0");
  CHECK_EQ(bin, 1);
  CHECK_OK(dlrec_kserve_request_output_binary(a, "OUTPUT0", &bin));
  CHECK_EQ(bin, 1);
  CHECK_OK(dlrec_kserve_request_output_binary(b, "OUTPUT0", &bin));
  CHECK_EQ(bin, 0);
  dlrec_kserve_request_free(a);
  dlrec_kserve_request_free(b);
}

TEST(parse_json_every_datatype_converts_exactly) {
  const char *json =
      "{\"inputs\":["
      "{\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[3],\"data\":[true,false,true]},"
      "{\"name\":\"u8\",\"datatype\":\"UINT8\",\"shape\":[2],\"data\":[0,255]},"
      "{\"name\":\"u16\",\"datatype\":\"UINT16\",\"shape\":[1],\"data\":[65535]},"
      "{\"name\":\"u32\",\"datatype\":\"UINT32\",\"shape\":[1],\"data\":[4294967295]},"
      "{\"name\":\"u64\",\"datatype\":\"UINT64\",\"shape\":[1],\"data\":[9007199254740992]},"
      "{\"name\":\"i8\",\"datatype\":\"INT8\",\"shape\":[2],\"data\":[-128,127]},"
      "{\"name\":\"i16\",\"datatype\":\"INT16\",\"shape\":[1],\"data\":[-32768]},"
      "{\"name\":\"i32\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[-2147483648]},"
      "{\"name\":\"i64\",\"datatype\":\"INT64\",\"shape\":[2],\"data\":[-9007199254740992,12345678901]},"
      "{\"name\":\"f64\",\"datatype\":\"FP64\",\"shape\":[1],\"data\":[0.1]},"
      "{\"name\":\"f32\",\"datatype\":\"FP32\",\"shape\":[],\"data\":[1e-40]}]}";
  dlrec_kserve_request *r;
  CHECK_OK(parse(json, &r));
  const dlrec_kserve_tensor *t;
  int ok = (t = dlrec_kserve_request_find_input(r, "b")) && dlrec_kserve_get_i64(t, 0) == 1 &&
           dlrec_kserve_get_i64(t, 1) == 0 && ((const uint8_t *)t->data)[2] == 1;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "u8")) && ((const uint8_t *)t->data)[1] == 255;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "u16")) && ((const uint16_t *)t->data)[0] == 65535;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "u32")) && ((const uint32_t *)t->data)[0] == UINT32_MAX;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "u64")) && ((const uint64_t *)t->data)[0] == 9007199254740992ull;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "i8")) && ((const int8_t *)t->data)[0] == -128 &&
       dlrec_kserve_get_i64(t, 1) == 127;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "i16")) && ((const int16_t *)t->data)[0] == -32768;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "i32")) && ((const int32_t *)t->data)[0] == INT32_MIN;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "i64")) && ((const int64_t *)t->data)[0] == -9007199254740992ll &&
       dlrec_kserve_get_i64(t, 1) == 12345678901ll;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "f64")) && ((const double *)t->data)[0] == 0.1;
  ok = ok && (t = dlrec_kserve_request_find_input(r, "f32")) && t->rank == 0 && t->count == 1 &&
       ((const float *)t->data)[0] == (float)1e-40;
  dlrec_kserve_request_free(r);
  CHECK(ok);
}

TEST(parse_json_hostile_requests_name_the_field) {
#define REST(dt, shape, data) \
  "\"inputs\":[{\"name\":\"x\",\"datatype\":\"" dt "\",\"shape\":" shape ",\"data\":" data "}]}"
#define IN(dt, shape, data) "{" REST(dt, shape, data)
  static const struct {
    const char *body;
    dlrec_status st;
    const char *msg;
  } cases[] = {
      {"", DLREC_ERR_PARSE, "empty"},
      {"{\"inputs\":[", DLREC_ERR_PARSE, "invalid JSON"},
      {"[1,2]", DLREC_ERR_PARSE, "expected a JSON object"},
      {"{\"inputs\":[]}", DLREC_ERR_PARSE, "inputs: empty"},
      {"{\"id\":\"a\"}", DLREC_ERR_PARSE, "missing 'inputs'"},
      {"{\"inputs\":{}}", DLREC_ERR_PARSE, "inputs: expected an array"},
      {"{\"inputs\":[1]}", DLREC_ERR_PARSE, "inputs[0]: expected an object"},
      {"{\"input\":[]}", DLREC_ERR_PARSE, "unknown key 'input'"},
      {"{\"id\":\"a\",\"id\":\"b\",\"inputs\":[]}", DLREC_ERR_PARSE, "key 'id' given twice"},
      {"{\"id\":5," REST("FP32", "[1]", "[1]"), DLREC_ERR_PARSE, "id: expected a string"},
      {"{\"inputs\":[{\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0]: missing 'name'"},
      {"{\"inputs\":[{\"name\":\"\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0].name: empty"},
      {"{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"data\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0] (x): missing 'datatype'"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"data\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0] (x): missing 'shape'"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0] (x): missing 'data'"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1],\"dat\":1}]}", DLREC_ERR_PARSE,
       "inputs[0]: unknown key 'dat'"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]},"
       "{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}",
       DLREC_ERR_PARSE, "input name 'x' given twice"},
      {IN("FP17", "[1]", "[1]"), DLREC_ERR_PARSE, "inputs[0] (x).datatype: unknown datatype 'FP17'"},
      {IN("fp32", "[1]", "[1]"), DLREC_ERR_PARSE, "unknown datatype 'fp32'"},
      {IN("FP16", "[1]", "[1]"), DLREC_ERR_UNSUPPORTED, "inputs[0] (x).datatype: FP16 is not supported"},
      {IN("FP32", "[-1]", "[1]"), DLREC_ERR_PARSE, "inputs[0] (x).shape[0]: negative dimension -1"},
      {IN("FP32", "[1.5]", "[1]"), DLREC_ERR_PARSE, "inputs[0] (x).shape[0]: expected an integer"},
      {IN("FP32", "[\"2\"]", "[1]"), DLREC_ERR_PARSE, "inputs[0] (x).shape[0]: expected an integer"},
      {IN("FP32", "[1,1,1,1,1,1,1,1,1]", "[1]"), DLREC_ERR_PARSE, "more than 8 dimensions"},
      {IN("FP32", "[4294967296,4294967296,4294967296]", "[1]"), DLREC_ERR_PARSE, "(max_elements)"},
      {IN("FP32", "[1e300]", "[1]"), DLREC_ERR_PARSE, "shape[0]: 1.0000000000000001e+300 is too large"},
      {IN("FP32", "[2,3]", "[1,2,3,4,5]"), DLREC_ERR_PARSE, "inputs[0] (x): shape [2,3] needs 6 elements, data has 5"},
      {IN("FP32", "[2,3]", "[1,2,3,4,5,6,7]"), DLREC_ERR_PARSE, "needs 6 elements, data has 7"},
      {IN("FP32", "[2,3]", "[[1,2,3],[4,5]]"), DLREC_ERR_PARSE, "inputs[0] (x).data: 2 values in an array at depth 2"},
      {IN("FP32", "[2,3]", "[[1,2,3]]"), DLREC_ERR_PARSE,
       "inputs[0] (x).data: 1 arrays at depth 1, shape [2,3] needs 2"},
      {IN("FP32", "[2,3]", "[[1,2,3],[4,5,6],[7,8,9]]"), DLREC_ERR_PARSE, "more than 2 arrays at depth 1"},
      {IN("FP32", "[2,3]", "[[1,2,3],4,5,6]"), DLREC_ERR_PARSE, "mixes arrays and values"},
      {IN("FP32", "[2,3]", "[1,2,3,[4],5,6]"), DLREC_ERR_PARSE, "mixes arrays and values"},
      {IN("FP32", "[2]", "[[1],[2]]"), DLREC_ERR_PARSE, "nested deeper than shape [2]"},
      {IN("FP32", "[1]", "1"), DLREC_ERR_PARSE, "inputs[0] (x).data: expected an array"},
      {IN("FP32", "[2]", "[1,\"2\"]"), DLREC_ERR_PARSE, "inputs[0] (x).data[1]: expected a number"},
      {IN("FP32", "[2]", "[1,null]"), DLREC_ERR_PARSE, "inputs[0] (x).data[1]: expected a number"},
      {IN("FP32", "[1]", "[1e40]"), DLREC_ERR_PARSE, "inputs[0] (x).data[0]: out of range for FP32"},
      {IN("FP64", "[1]", "[1e400]"), DLREC_ERR_PARSE, "inputs[0] (x).data[0]: out of range for FP64"},
      {IN("INT64", "[2]", "[1,3.5]"), DLREC_ERR_PARSE, "inputs[0] (x).data[1]: not an integer"},
      {IN("INT64", "[1]", "[9007199254740994]"), DLREC_ERR_PARSE, "beyond 2^53"},
      {IN("INT32", "[1]", "[2147483648]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      {IN("UINT8", "[1]", "[-1]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      /* One past each end of the small types (128 would wrap to -128 in an INT8). */
      {IN("INT8", "[2]", "[127,128]"), DLREC_ERR_PARSE, "data[1]: out of range for the datatype"},
      {IN("INT8", "[2]", "[-128,-129]"), DLREC_ERR_PARSE, "data[1]: out of range for the datatype"},
      {IN("UINT8", "[1]", "[256]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      {IN("INT16", "[1]", "[32768]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      {IN("UINT16", "[1]", "[65536]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      {IN("UINT32", "[1]", "[1e10]"), DLREC_ERR_PARSE, "data[0]: out of range for the datatype"},
      {IN("BOOL", "[1]", "[1]"), DLREC_ERR_PARSE, "data[0]: expected true or false"},
      {IN("BYTES", "[1]", "[1]"), DLREC_ERR_PARSE, "data[0]: expected a string"},
      {IN("INT8", "[1]", "[true]"), DLREC_ERR_PARSE, "data[0]: expected a number"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1],\"parameters\":[]}]}",
       DLREC_ERR_PARSE, "inputs[0] (x).parameters: expected an object"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1],"
       "\"parameters\":{\"a\":{}}}]}",
       DLREC_ERR_PARSE, "inputs[0] (x).parameters.a: expected a string, number or boolean"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1],"
       "\"parameters\":{\"binary_data_size\":4}}]}",
       DLREC_ERR_PARSE, "both 'data' and parameters.binary_data_size"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],"
       "\"parameters\":{\"binary_data_size\":4}}]}",
       DLREC_ERR_PARSE, "needs the Inference-Header-Content-Length header"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],"
       "\"parameters\":{\"binary_data_size\":-4}}]}",
       DLREC_ERR_PARSE, "inputs[0] (x).parameters.binary_data_size: negative"},
      {"{\"parameters\":{\"binary_data_output\":1}," REST("FP32", "[1]", "[1]"), DLREC_ERR_PARSE,
       "request.parameters.binary_data_output: expected true or false"},
      {"{\"parameters\":{\"a\":1,\"a\":2}," REST("FP32", "[1]", "[1]"), DLREC_ERR_PARSE,
       "request.parameters.a: given twice"},
      {"{\"outputs\":[{\"parameters\":{}}]," REST("FP32", "[1]", "[1]"), DLREC_ERR_PARSE, "outputs[0]: missing 'name'"},
      {"{\"outputs\":[{\"name\":\"OUTPUT0\"},{\"name\":\"OUTPUT0\"}]," REST("FP32", "[1]", "[1]"), DLREC_ERR_PARSE,
       "outputs[1]: output name 'OUTPUT0' given twice"},
      {"{\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"binary_data\":\"yes\"}}]," REST("FP32", "[1]", "[1]"),
       DLREC_ERR_PARSE, "outputs[0].parameters.binary_data: expected true or false"},
      {"{\"outputs\":[{\"name\":\"OUTPUT0\",\"parameters\":{\"classification\":2}}]," REST("FP32", "[1]", "[1]"),
       DLREC_ERR_UNSUPPORTED, "classification extension is not supported"},
      {IN("FP32", "[1]", "[1]") "x", DLREC_ERR_PARSE, "unexpected bytes after the JSON"},
      {IN("FP32", "[1]", "[1]") "\n\n{}", DLREC_ERR_PARSE, "needs the Inference-Header-Content-Length"},
      {"{\"inputs\":[{\"name\":\"x\\u0001\\\"\",\"datatype\":\"FP17\",\"shape\":[1],\"data\":[1]}]}", DLREC_ERR_PARSE,
       "inputs[0] (x\\x01\").datatype: unknown datatype 'FP17'"},
  };
#undef IN
#undef REST
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    if (!refused(cases[i].body, strlen(cases[i].body), -1, NULL, cases[i].st, cases[i].msg)) bad++;
  CHECK_EQ(bad, 0);
  /* Whitespace after the JSON is fine; a NUL inside it is not. */
  dlrec_kserve_request *r;
  const char *ws = "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]} \r\n\t";
  CHECK_OK(parse(ws, &r));
  dlrec_kserve_request_free(r);
  char nul[] = "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}\0}";
  CHECK(refused(nul, sizeof nul - 1, -1, NULL, DLREC_ERR_PARSE, "NUL byte in the JSON"));
  /* Every status of these is a 400. */
  CHECK_EQ(dlrec_kserve_http_status(DLREC_ERR_PARSE), 400);
  CHECK_EQ(dlrec_kserve_http_status(DLREC_ERR_UNSUPPORTED), 400);
  CHECK_EQ(dlrec_kserve_http_status(DLREC_ERR_INVALID), 400);
  CHECK_EQ(dlrec_kserve_http_status(DLREC_ERR_INTERNAL), 500);
  CHECK_EQ(dlrec_kserve_http_status(DLREC_OK), 200);
}

TEST(parse_limits_are_enforced_with_their_names) {
  dlrec_kserve_limits lim;
  dlrec_kserve_limits_default(&lim);
  lim.max_inputs = 2;
  lim.max_elements = 10;
  lim.max_string_bytes = 3;
  lim.max_name_bytes = 4;
  lim.max_outputs = 1;
  const char *three =
      "{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]},"
      "{\"name\":\"b\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]},"
      "{\"name\":\"c\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}";
  CHECK(refused(three, strlen(three), -1, &lim, DLREC_ERR_PARSE, "(max_inputs)"));
  const char *many =
      "{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[6],\"data\":[1,2,3,4,5,6]},"
      "{\"name\":\"b\",\"datatype\":\"FP32\",\"shape\":[5],\"data\":[1,2,3,4,5]}]}";
  CHECK(refused(many, strlen(many), -1, &lim, DLREC_ERR_PARSE,
                "inputs[1] (b): shape [5]: the request's inputs exceed "
                "the limit of 10 elements (max_elements)"));
  const char *str = "{\"inputs\":[{\"name\":\"a\",\"datatype\":\"BYTES\",\"shape\":[2],\"data\":[\"abc\",\"abcd\"]}]}";
  CHECK(refused(str, strlen(str), -1, &lim, DLREC_ERR_PARSE, "inputs[0] (a).data[1]: string longer than the limit"));
  const char *name = "{\"inputs\":[{\"name\":\"abcde\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}";
  CHECK(refused(name, strlen(name), -1, &lim, DLREC_ERR_PARSE, "inputs[0].name: longer than 4 bytes"));
  const char *id = "{\"id\":\"abcde\",\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}";
  CHECK(refused(id, strlen(id), -1, &lim, DLREC_ERR_PARSE, "id: longer than 4 bytes"));
  const char *outs =
      "{\"outputs\":[{\"name\":\"a\"},{\"name\":\"b\"}],"
      "\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1]}]}";
  CHECK(refused(outs, strlen(outs), -1, &lim, DLREC_ERR_PARSE, "(max_outputs)"));
  /* Within the limits it passes. */
  dlrec_kserve_request *r;
  const char *fits =
      "{\"inputs\":[{\"name\":\"abcd\",\"datatype\":\"BYTES\",\"shape\":[2,5],"
      "\"data\":[\"abc\",\"\",\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\"]}]}";
  CHECK_OK(dlrec_kserve_parse_request(fits, strlen(fits), -1, &lim, &r));
  dlrec_kserve_request_free(r);
}

/* ---- the binary extension ---- */

/* A request of three binary inputs and one JSON input: FP32 [2,2] (at an odd
 * offset: copied), BYTES [3] ("", "ab", "\0z"), INT64 [2] and BOOL [2]. */
static void binary_body(sbuf *b, size_t *header_len, int misalign) {
  sbuf j = {0};
  test_buf_printf(&j,
            "{\"inputs\":[{\"name\":\"f\",\"datatype\":\"FP32\",\"shape\":[2,2],"
            "\"parameters\":{\"binary_data_size\":16}},"
            "{\"name\":\"s\",\"datatype\":\"BYTES\",\"shape\":[3],\"parameters\":{\"binary_data_size\":16}},"
            "{\"name\":\"j\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[7]},"
            "{\"name\":\"i\",\"datatype\":\"INT64\",\"shape\":[2],\"parameters\":{\"binary_data_size\":16}},"
            "{\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[2],\"parameters\":{\"binary_data_size\":2}}],"
            "\"outputs\":[{\"name\":\"OUTPUT0\"}],\"parameters\":{\"binary_data_output\":true}}");
  /* Pads the JSON with spaces so that the binary section starts 8-aligned
   * in the body, or one past it. */
  while ((j.n + (size_t)misalign) % 8) test_buf_put(&j, " ", 1);
  test_buf_put(b, j.p, j.n);
  *header_len = j.n;
  free(j.p);
  const float f[4] = {1.5f, -2.0f, 3.25e-20f, 0.1f};
  test_buf_put(b, f, sizeof f);
  sb_u32(b, 0);
  sb_u32(b, 2);
  test_buf_put(b, "ab", 2);
  sb_u32(b, 2);
  test_buf_put(b, "\0z", 2);
  const int64_t i[2] = {-5, (int64_t)1 << 62};
  test_buf_put(b, i, sizeof i);
  test_buf_put(b, "\1\0", 2);
}

TEST(parse_binary_extension_aligned_and_not) {
  for (int misalign = 0; misalign <= 1; misalign++) {
    sbuf b = {0};
    size_t hl;
    /* A body at an 8-aligned address (malloc's), with the binary section at
     * offset hl: aligned when misalign is 0. */
    binary_body(&b, &hl, misalign);
    dlrec_kserve_request *r;
    dlrec_status st = dlrec_kserve_parse_request(b.p, b.n, (long long)hl, NULL, &r);
    if (st != DLREC_OK) free(b.p);
    CHECK_OK(st);
    const dlrec_kserve_tensor *f = dlrec_kserve_request_find_input(r, "f");
    const dlrec_kserve_tensor *s = dlrec_kserve_request_find_input(r, "s");
    const dlrec_kserve_tensor *j = dlrec_kserve_request_find_input(r, "j");
    const dlrec_kserve_tensor *i = dlrec_kserve_request_find_input(r, "i");
    const dlrec_kserve_tensor *bo = dlrec_kserve_request_find_input(r, "b");
    int ok = f && s && j && i && bo && f->binary && s->binary && !j->binary && i->binary;
    ok = ok && ((const float *)f->data)[0] == 1.5f && ((const float *)f->data)[2] == 3.25e-20f &&
         ((const float *)f->data)[3] == 0.1f;
    /* Aligned data is read in place; misaligned data is copied. */
    ok = ok && ((const char *)f->data == b.p + hl) == !misalign;
    ok = ok && s->strs[0].n == 0 && s->strs[1].n == 2 && !memcmp(s->strs[1].s, "ab", 2) && s->strs[2].n == 2 &&
         !memcmp(s->strs[2].s, "\0z", 2);
    ok = ok && dlrec_kserve_get_i64(j, 0) == 7 && dlrec_kserve_get_i64(i, 0) == -5 &&
         dlrec_kserve_get_i64(i, 1) == (int64_t)1 << 62;
    ok = ok && dlrec_kserve_get_i64(bo, 0) == 1 && dlrec_kserve_get_i64(bo, 1) == 0;
    int bin = 0;
    ok = ok && dlrec_kserve_request_binary_output(r) == 1 &&
         dlrec_kserve_request_output_binary(r, "OUTPUT0", &bin) == DLREC_OK && bin == 1;
    ok = ok && dlrec_kserve_request_output_binary(r, "OUTPUT1", &bin) == DLREC_ERR_PARSE &&
         strstr(dlrec_last_error(), "outputs[0]: unknown output 'OUTPUT0'");
    dlrec_kserve_request_free(r);
    free(b.p);
    CHECK(ok);
  }
}

TEST(parse_binary_hostile_sizes) {
  sbuf b = {0};
  size_t hl;
  binary_body(&b, &hl, 0);
  int ok = 1;
  /* Truncated by one byte, one trailing byte, the header past the body,
   * a negative header, the header cutting the JSON. */
  ok &= refused(b.p, b.n - 1, (long long)hl, NULL, DLREC_ERR_PARSE,
                "inputs[4] (b): binary data truncated: binary_data_size 2 at offset 48, but only 1 bytes follow");
  sbuf c = {0};
  test_buf_put(&c, b.p, b.n);
  test_buf_put(&c, "!", 1);
  ok &= refused(c.p, c.n, (long long)hl, NULL, DLREC_ERR_PARSE, "binary data: 1 trailing bytes");
  ok &= refused(b.p, b.n, (long long)b.n + 1, NULL, DLREC_ERR_PARSE, "is more than the body's");
  ok &= refused(b.p, b.n, -5, NULL, DLREC_ERR_PARSE, "Inference-Header-Content-Length: negative");
  ok &= refused(b.p, b.n, (long long)hl - 10, NULL, DLREC_ERR_PARSE, "invalid JSON");
  ok &= refused(b.p, b.n, 0, NULL, DLREC_ERR_PARSE, "empty");
  ok &= refused(b.p, b.n, -1, NULL, DLREC_ERR_PARSE, "NUL byte in the JSON"); /* 1.5f starts with a zero byte */
  free(c.p);
  free(b.p);
  CHECK(ok);

  /* Sizes that do not match the shape or the data. */
  static const struct {
    const char *json;
    const char *bin;
    size_t bin_len;
    const char *msg;
  } cases[] = {
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2],\"parameters\":{\"binary_data_size\":4}}]}",
       "\0\0\0\0", 4, "inputs[0] (x): binary_data_size 4 does not match shape [2] of FP32 (8 bytes)"},
      /* Too large as well as too small: the surplus is no element of the
       * tensor, and taking it would hide a client's wrong shape. */
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[2],\"parameters\":{\"binary_data_size\":12}}]}",
       "\0\0\0\0\0\0\0\0\0\0\0\0", 12, "inputs[0] (x): binary_data_size 12 does not match shape [2] of FP32 (8 bytes)"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[2],\"parameters\":{\"binary_data_size\":3}}]}",
       "\1\2\3", 3, "inputs[0] (x): binary_data_size 3 does not match shape [2] of INT8 (2 bytes)"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[2],\"parameters\":{\"binary_data_size\":10}}]}",
       "\3\0\0\0abc\0\0\0", 10, "inputs[0] (x): binary element 1: truncated length"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[1],\"parameters\":{\"binary_data_size\":6}}]}",
       "\3\0\0\0ab", 6, "inputs[0] (x): binary element 0: 3 bytes, but binary_data_size leaves 2"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[1],\"parameters\":{\"binary_data_size\":6}}]}",
       "\1\0\0\0ab", 6, "inputs[0] (x): binary_data_size 6, but its 1 elements take 5 bytes"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[3],\"parameters\":{\"binary_data_size\":8}}]}",
       "\0\0\0\0\0\0\0\0", 8, "binary_data_size 8 cannot hold 3 BYTES elements"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[1],\"parameters\":{\"binary_data_size\":4}}]}",
       "\377\377\377\377", 4, "inputs[0] (x): binary element 0: 4294967295 bytes, more than the limit"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BOOL\",\"shape\":[2],\"parameters\":{\"binary_data_size\":2}}]}",
       "\1\2", 2, "inputs[0] (x): binary BOOL element 1 is 2, not 0 or 1"},
      {"{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[2],\"parameters\":{\"binary_data_size\":2.5}}]}",
       "\1\2", 2, "inputs[0] (x).parameters.binary_data_size: expected an integer"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sbuf d = {0};
    test_buf_put(&d, cases[i].json, strlen(cases[i].json));
    test_buf_put(&d, cases[i].bin, cases[i].bin_len);
    if (!refused(d.p, d.n, (long long)strlen(cases[i].json), NULL, DLREC_ERR_PARSE, cases[i].msg)) bad++;
    free(d.p);
  }
  CHECK_EQ(bad, 0);
}

/* ---- responses ---- */

/* The numbers of the response's "data" array, read with strtof. */
static int response_floats(const char *json, float *out, uint32_t n) {
  const char *p = strstr(json, "\"data\":[");
  if (!p) return 0;
  p += 8;
  for (uint32_t i = 0; i < n; i++) {
    char *end;
    out[i] = strtof(p, &end);
    if (end == p) return 0;
    p = end;
    if (*p != (i + 1 < n ? ',' : ']')) return 0;
    p++;
  }
  return 1;
}

TEST(response_json_round_trips_floats_bitwise) {
  enum { N = 5000 };
  float *s = malloc(N * sizeof *s), *back = malloc(N * sizeof *back);
  CHECK(s && back);
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 7, 0);
  /* Probabilities, their neighbours one ulp away, extremes, denormals. */
  for (uint32_t i = 0; i < N; i++) {
    uint32_t u = (uint32_t)dlrec_rng_u64(&rng);
    float f;
    if (i % 3 == 0)
      f = (float)((u >> 8) * (1.0 / 16777216.0));
    else if (i % 3 == 1)
      memcpy(&f, &u, 4);
    else
      f = nextafterf((float)((u >> 8) * (1.0 / 16777216.0)), 1.0f);
    if (!isfinite(f)) f = 0.5f;
    s[i] = f;
  }
  s[0] = 0.0f, s[1] = -0.0f, s[2] = 1.0f, s[3] = FLT_MIN, s[4] = FLT_MAX, s[5] = 1.4e-45f, s[6] = -FLT_MAX;
  s[7] = 0.1f, s[8] = 1.17549421e-38f;
  dlrec_kserve_buf b;
  dlrec_kserve_buf_init(&b);
  size_t hl = 0;
  dlrec_kserve_response resp = {"dlrm \"v\"", "3", "req-\n1", s, N, 0};
  dlrec_status st = dlrec_kserve_write_response(&b, &resp, &hl);
  int ok = st == DLREC_OK && hl == b.len && strlen(b.data) == b.len && response_floats(b.data, back, N);
  for (uint32_t i = 0; ok && i < N; i++) ok = !memcmp(&s[i], &back[i], 4);
  /* And it is JSON with the fields expected. */
  cJSON *j = ok ? cJSON_ParseWithLength(b.data, b.len) : NULL;
  const cJSON *o = j ? cJSON_GetArrayItem(cJSON_GetObjectItem(j, "outputs"), 0) : NULL;
  ok = ok && o && !strcmp(cJSON_GetObjectItem(j, "model_name")->valuestring, "dlrm \"v\"") &&
       !strcmp(cJSON_GetObjectItem(j, "model_version")->valuestring, "3") &&
       !strcmp(cJSON_GetObjectItem(j, "id")->valuestring, "req-\n1") &&
       !strcmp(cJSON_GetObjectItem(o, "name")->valuestring, "OUTPUT0") &&
       !strcmp(cJSON_GetObjectItem(o, "datatype")->valuestring, "FP32") &&
       cJSON_GetArrayItem(cJSON_GetObjectItem(o, "shape"), 0)->valuedouble == N &&
       cJSON_GetArraySize(cJSON_GetObjectItem(o, "data")) == N;
  cJSON_Delete(j);
  /* Without version and id, those keys are left out. */
  dlrec_kserve_response bare = {"m", NULL, NULL, s, 2, 0};
  ok = ok && dlrec_kserve_write_response(&b, &bare, NULL) == DLREC_OK && !strstr(b.data, "model_version") &&
       !strstr(b.data, "\"id\"");
  /* A NaN score is a bug upstream: refused, naming the row. */
  s[3] = NAN;
  ok = ok && dlrec_kserve_write_response(&b, &resp, &hl) == DLREC_ERR_INTERNAL && strstr(dlrec_last_error(), "row 3");
  s[3] = INFINITY;
  resp.binary = 1;
  ok = ok && dlrec_kserve_write_response(&b, &resp, &hl) == DLREC_ERR_INTERNAL;
  dlrec_kserve_buf_free(&b);
  free(s);
  free(back);
  CHECK(ok);
}

TEST(response_binary_layout) {
  const float s[3] = {0.25f, 0.125f, 1e-7f};
  dlrec_kserve_buf b = {0};
  size_t hl = 0;
  dlrec_kserve_response resp = {"m", "1", "7", s, 3, 1};
  CHECK_OK(dlrec_kserve_write_response(&b, &resp, &hl));
  CHECK_EQ(b.len, hl + 12);
  CHECK(!memcmp(b.data + hl, s, 12));
  const char *want =
      "{\"model_name\":\"m\",\"model_version\":\"1\",\"id\":\"7\",\"outputs\":[{\"name\":\"OUTPUT0\","
      "\"datatype\":\"FP32\",\"shape\":[3],\"parameters\":{\"binary_data_size\":12}}]}";
  CHECK_EQ(hl, strlen(want));
  CHECK(!memcmp(b.data, want, hl));
  /* The buffer is reused: a smaller response keeps the capacity. */
  size_t cap = b.cap;
  resp.rows = 1;
  CHECK_OK(dlrec_kserve_write_response(&b, &resp, &hl));
  CHECK_EQ(b.cap, cap);
  CHECK_EQ(b.len, hl + 4);
  /* Zero rows. */
  resp.rows = 0;
  resp.binary = 0;
  CHECK_OK(dlrec_kserve_write_response(&b, &resp, &hl));
  CHECK(strstr(b.data, "\"shape\":[0],\"data\":[]") != NULL);
  dlrec_kserve_buf_free(&b);
}

TEST(error_json_escapes_quotes_newlines_control_and_bad_utf8) {
  dlrec_kserve_buf b = {0};
  const char *msg = "field \"x\"\nline2\\ \t\x01 caf\xc3\xa9 bad\xff\xc3 end";
  CHECK_OK(dlrec_kserve_write_error(&b, msg));
  CHECK_STR(b.data, "{\"error\":\"field \\\"x\\\"\\nline2\\\\ \\t\\u0001 caf\xc3\xa9 bad\\ufffd\\ufffd end\"}");
  cJSON *j = cJSON_Parse(b.data);
  CHECK(j != NULL);
  const cJSON *e = cJSON_GetObjectItem(j, "error");
  int ok = cJSON_IsString(e) &&
           !strcmp(e->valuestring, "field \"x\"\nline2\\ \t\x01 caf\xc3\xa9 bad\xef\xbf\xbd\xef\xbf\xbd end");
  cJSON_Delete(j);
  CHECK(ok);
  /* Overlong forms and surrogates are not UTF-8 either. */
  CHECK_OK(dlrec_kserve_write_error(&b, "\xc0\xaf\xed\xa0\x80\xf0\x9f\x98\x80"));
  CHECK_STR(b.data, "{\"error\":\"\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\xf0\x9f\x98\x80\"}");
  dlrec_kserve_buf_free(&b);
}

TEST(metadata_json) {
  dlrec_schema s;
  memset(&s, 0, sizeof s);
  /* The raw inputs are the ETL state's input columns; the model has two
   * derived columns more of each kind. */
  s.n_dense = 15;
  s.n_sparse = 28;
  uint32_t raw[2] = {13, 26};
  dlrec_kserve_buf b = {0};
  CHECK_OK(dlrec_kserve_write_model_metadata(&b, "dlrm", "2", "dlrm", &s, raw));
  cJSON *j = cJSON_Parse(b.data);
  CHECK(j != NULL);
  const cJSON *in = cJSON_GetObjectItem(j, "inputs");
  int ok = !strcmp(cJSON_GetObjectItem(j, "name")->valuestring, "dlrm") &&
           !strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "versions"), 0)->valuestring, "2") &&
           !strcmp(cJSON_GetObjectItem(j, "platform")->valuestring, "dlrec_dlrm") && cJSON_GetArraySize(in) == 5 &&
           !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 1), "datatype")->valuestring, "BYTES") &&
           cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 0), "shape"), 0)->valuedouble == -1 &&
           cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 0), "shape"), 1)->valuedouble == 13 &&
           cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 1), "shape"), 1)->valuedouble == 26 &&
           !strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "outputs"), 0), "name")->valuestring,
                   "OUTPUT0");
  cJSON_Delete(j);
  CHECK(ok);
  CHECK_OK(dlrec_kserve_write_model_metadata(&b, "dlrm", "2", "dlrm", &s, NULL));
  CHECK(strstr(b.data, "\"categorical\"") == NULL && strstr(b.data, "\"ROWINDEX\"") != NULL);
  /* The metadata names the model's type (it used to say dlrec_dlrm for an
   * fm model too), in the platform and in parameters. */
  CHECK_OK(dlrec_kserve_write_model_metadata(&b, "ctr", "7", "fm", &s, raw));
  j = cJSON_Parse(b.data);
  CHECK(j != NULL);
  const cJSON *platform = cJSON_GetObjectItem(j, "platform");
  const cJSON *mt = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "parameters"), "model_type");
  CHECK(cJSON_IsString(platform) && cJSON_IsString(mt));
  if (cJSON_IsString(platform) && cJSON_IsString(mt)) {
    CHECK_STR(platform->valuestring, "dlrec_fm");
    CHECK_STR(mt->valuestring, "fm");
  }
  cJSON_Delete(j);
  /* A model without dense columns lists no dense input. */
  s.n_dense = 0;
  raw[0] = 0;
  CHECK_OK(dlrec_kserve_write_model_metadata(&b, "ctr", "7", "lr", &s, raw));
  j = cJSON_Parse(b.data);
  CHECK(j != NULL);
  in = cJSON_GetObjectItem(j, "inputs");
  CHECK_EQ(cJSON_GetArraySize(in), 4);
  CHECK_STR(cJSON_GetObjectItem(cJSON_GetArrayItem(in, 0), "name")->valuestring, "categorical");
  cJSON_Delete(j);
  CHECK(dlrec_kserve_write_model_metadata(&b, "ctr", "7", NULL, &s, raw) == DLREC_ERR_INVALID);
  CHECK_OK(dlrec_kserve_write_server_metadata(&b, "dlrec", "0.1.0", NULL, 0));
  CHECK_STR(b.data, "{\"name\":\"dlrec\",\"version\":\"0.1.0\",\"extensions\":[\"binary_tensor_data\"]}");
  const char *ext[] = {"binary_tensor_data", "model_repository"};
  CHECK_OK(dlrec_kserve_write_server_metadata(&b, "dlrec", "1", ext, 2));
  CHECK_STR(b.data,
            "{\"name\":\"dlrec\",\"version\":\"1\",\"extensions\":[\"binary_tensor_data\",\"model_repository\"]}");
  dlrec_kserve_buf_free(&b);
}

/* ---- requests -> rows ---- */

#define ND 13
#define NC 26

/* Raw dense text of row r, column d (as a JSON number and as log text),
 * and categorical value of row r, column c ("" for missing). */
static const char *dense_val(int r, int d) {
  static char buf[8][32];
  static int k;
  char *p = buf[k++ & 7];
  int v = (r * 7 + d * 3) % 20;
  if (d == 2)
    snprintf(p, 32, "-%d", v);
  else if (d == 5)
    snprintf(p, 32, "%d.5", v);
  else if (d == 7)
    snprintf(p, 32, "%de3", v);
  else
    snprintf(p, 32, "%d", v);
  return p;
}

static const char *cat_val(int r, int c) {
  static char buf[8][32];
  static int k;
  char *p = buf[k++ & 7];
  if ((r + c) % 9 == 0)
    p[0] = '\0';
  else if (r >= 30)
    snprintf(p, 32, "%x", 0xabc000 + r * 31 + c); /* unseen in fit: out of vocabulary */
  else
    snprintf(p, 32, "%x", ((r + c) % 4) * 17 + c);
  return p;
}

/* Fits an ETL state on 30 Criteo rows made of the values above. */
static dlrec_etl *small_etl(void) {
  sbuf t = {0};
  for (int r = 0; r < 30; r++) {
    test_buf_printf(&t, "%d", r % 2);
    for (int d = 0; d < ND; d++) test_buf_printf(&t, "\t%s", dense_val(r, d));
    for (int c = 0; c < NC; c++) test_buf_printf(&t, "\t%s", cat_val(r, c));
    test_buf_put(&t, "\n", 1);
  }
  char in[1024], dir[1024];
  snprintf(in, sizeof in, "%s", test_path("clicks.tsv"));
  snprintf(dir, sizeof dir, "%s", test_path("etl"));
  int w = test_write_file(in, t.p, t.n);
  free(t.p);
  if (w != 0) return NULL;
  dlrec_etl_fit_opts o;
  dlrec_etl_fit_opts_default(&o);
  o.progress = 0;
  o.threads = 1;
  o.standardize = 1;
  const char *ins[] = {in};
  dlrec_etl *e = NULL;
  if (dlrec_etl_fit(ins, 1, dir, &o, NULL) != DLREC_OK || dlrec_etl_load(&e, dir) != DLREC_OK) {
    fprintf(stderr, "small_etl: %s\n", dlrec_last_error());
    return NULL;
  }
  return e;
}

/* A raw request of rows [r0, r0 + B): dense as JSON numbers of `dtype`
 * (FP64, FP32 in binary, INT64 when every value is an integer, or BYTES). */
static void raw_request(sbuf *b, long long *header_len, int r0, int B, const char *dtype) {
  int binary = !strcmp(dtype, "FP32");
  sbuf j = {0};
  test_buf_printf(&j, "{\"id\":\"raw\",\"inputs\":[{\"name\":\"dense\",\"datatype\":\"%s\",\"shape\":[%d,%d],", dtype, B, ND);
  if (binary) {
    test_buf_printf(&j, "\"parameters\":{\"binary_data_size\":%d}},", B * ND * 4);
  } else {
    test_buf_printf(&j, "\"data\":[");
    for (int r = 0; r < B; r++)
      for (int d = 0; d < ND; d++) {
        const char *v = dense_val(r0 + r, d);
        if (!strcmp(dtype, "BYTES"))
          test_buf_printf(&j, "%s\"%s\"", r || d ? "," : "", (r + d) % 5 ? v : "");
        else
          test_buf_printf(&j, "%s%s", r || d ? "," : "", v);
      }
    test_buf_printf(&j, "]},");
  }
  test_buf_printf(&j, "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[%d,%d],\"data\":[", B, NC);
  for (int r = 0; r < B; r++) {
    test_buf_put(&j, r ? ",[" : "[", r ? 2 : 1);
    for (int c = 0; c < NC; c++) test_buf_printf(&j, "%s\"%s\"", c ? "," : "", cat_val(r0 + r, c));
    test_buf_put(&j, "]", 1);
  }
  test_buf_printf(&j, "]}]}");
  test_buf_put(b, j.p, j.n);
  *header_len = binary ? (long long)j.n : -1;
  free(j.p);
  if (binary)
    for (int r = 0; r < B; r++)
      for (int d = 0; d < ND; d++) {
        float f = strtof(dense_val(r0 + r, d), NULL);
        test_buf_put(b, &f, 4);
      }
}

/* Rows of a request built by raw_request, added to rows. */
static dlrec_status add_raw(dlrec_serve_rows *rows, int r0, int B, const char *dtype, uint32_t max_rows) {
  sbuf b = {0};
  long long hl;
  raw_request(&b, &hl, r0, B, dtype);
  dlrec_kserve_request *req;
  dlrec_status st = dlrec_kserve_parse_request(b.p, b.n, hl, NULL, &req);
  if (st == DLREC_OK) {
    uint32_t added = 0;
    st = dlrec_serve_rows_add_request(rows, req, max_rows, &added);
    if (st == DLREC_OK && added != (uint32_t)B) st = dlrec_error(DLREC_ERR_INTERNAL, "added %u rows, not %d", added, B);
    dlrec_kserve_request_free(req);
  }
  free(b.p);
  return st;
}

/* 1 when two batches hold the same rows bitwise. */
static int same_rows(const dlrec_batch *a, const dlrec_batch *b, uint32_t nd, uint32_t nc) {
  if (a->rows != b->rows || a->labels || b->labels) return 0;
  if (nd && memcmp(a->dense, b->dense, (size_t)a->rows * nd * sizeof(float))) return 0;
  for (uint32_t c = 0; c < nc; c++) {
    if (memcmp(a->offsets[c], b->offsets[c], (a->rows + 1) * sizeof(uint32_t))) return 0;
    if (memcmp(a->ids[c], b->ids[c], a->offsets[c][a->rows] * sizeof(uint32_t))) return 0;
  }
  return 1;
}

TEST(raw_rows_match_direct_etl_encoding_in_every_dense_type) {
  dlrec_etl *e = small_etl();
  CHECK(e != NULL);
  const dlrec_schema *s = dlrec_etl_schema(e);
  dlrec_serve_rows *rows = NULL;
  dlrec_status st = dlrec_serve_rows_new(&rows, s, e);
  int ok = st == DLREC_OK;
  const char *dtypes[] = {"FP64", "FP32", "BYTES"};
  for (int k = 0; ok && k < 3; k++) {
    dlrec_serve_rows_clear(rows);
    /* Rows 25..34: the last five hold unseen (OOV) categorical values. */
    st = add_raw(rows, 25, 10, dtypes[k], 64);
    ok = st == DLREC_OK;
    if (!ok) fprintf(stderr, "%s: %s\n", dtypes[k], dlrec_last_error());
    dlrec_batch b;
    dlrec_serve_rows_batch(rows, &b);
    ok = ok && b.rows == 10 && dlrec_serve_rows_count(rows) == 10 && !b.labels;
    for (int r = 0; ok && r < 10; r++) {
      for (int d = 0; ok && d < ND; d++) {
        const char *v = dense_val(25 + r, d);
        if (!strcmp(dtypes[k], "BYTES") && (r + d) % 5 == 0) v = "";
        float want;
        ok = dlrec_etl_encode_dense(e, (uint32_t)d, v, strlen(v), &want) == DLREC_OK &&
             !memcmp(&want, &b.dense[r * ND + d], 4);
        if (!ok) fprintf(stderr, "%s: row %d dense %d: %.9g vs %.9g\n", dtypes[k], r, d, want, b.dense[r * ND + d]);
      }
      for (int c = 0; ok && c < NC; c++) {
        const char *v = cat_val(25 + r, c);
        uint32_t want;
        ok = dlrec_etl_encode_cat(e, (uint32_t)c, v, strlen(v), &want) == DLREC_OK && b.offsets[c][r] == (uint32_t)r &&
             b.offsets[c][r + 1] == (uint32_t)r + 1 && b.ids[c][r] == want;
      }
    }
  }
  /* Integers as INT64: rows whose dense values are all integers (column 5
   * is x.5, so it is left as FP64 above; here a request of its own). */
  const char *ints =
      "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"INT64\",\"shape\":[1,13],"
      "\"data\":[0,1,-2,3,4,5,6,7000,8,9,10,11,12]},"
      "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,26],"
      "\"data\":[\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"\",\"\",\"\",\"\",\"\",\"11\"]}]}";
  dlrec_kserve_request *req = NULL;
  ok = ok && parse(ints, &req) == DLREC_OK;
  dlrec_serve_rows_clear(rows);
  ok = ok && dlrec_serve_rows_add_request(rows, req, 4, NULL) == DLREC_OK;
  dlrec_kserve_request_free(req);
  dlrec_batch b;
  dlrec_serve_rows_batch(rows, &b);
  const char *itext[ND] = {"0", "1", "-2", "3", "4", "5", "6", "7000", "8", "9", "10", "11", "12"};
  for (int d = 0; ok && d < ND; d++) {
    float want;
    ok = dlrec_etl_encode_dense(e, (uint32_t)d, itext[d], strlen(itext[d]), &want) == DLREC_OK &&
         !memcmp(&want, &b.dense[d], 4);
  }
  dlrec_serve_rows_free(rows);
  dlrec_etl_free(e);
  CHECK(ok);
}

TEST(raw_rows_hostile_inputs_and_rollback) {
  dlrec_etl *e = small_etl();
  CHECK(e != NULL);
  dlrec_serve_rows *rows = NULL, *no_etl = NULL;
  CHECK_OK(dlrec_serve_rows_new(&rows, dlrec_etl_schema(e), e));
  dlrec_status st = dlrec_serve_rows_new(&no_etl, dlrec_etl_schema(e), NULL);
  int ok = st == DLREC_OK && add_raw(rows, 0, 3, "FP64", 8) == DLREC_OK;
  dlrec_batch before;
  dlrec_serve_rows_batch(rows, &before);
  float dense0[3 * ND];
  if (ok) memcpy(dense0, before.dense, sizeof dense0);
  /* Each request fails with its message and leaves the rows as they were. */
  static const struct {
    const char *body;
    dlrec_status st;
    const char *msg;
  } cases[] = {
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,13],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0]}]"
       "}",
       DLREC_ERR_PARSE, "missing input 'categorical'"},
      {"{\"inputs\":[{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,1],\"data\":[\"\"]}]}",
       DLREC_ERR_PARSE, "missing input 'dense'"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,12],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,1],\"data\":[\"\"]}]}",
       DLREC_ERR_PARSE, "input 'dense': shape [1,12], expected [B, 13]"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BOOL\",\"shape\":[1,1],\"data\":[true]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,1],\"data\":[\"\"]}]}",
       DLREC_ERR_PARSE, "input 'dense': datatype BOOL"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[0,13],\"data\":[]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[0,26],\"data\":[]}]}",
       DLREC_ERR_PARSE, "input 'dense': no rows"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,13],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0]},"
       "{\"name\":\"categorical\",\"datatype\":\"INT64\",\"shape\":[1,26],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,"
       "0,0,"
       "0,0,0,0,0,0,0]}]}",
       DLREC_ERR_PARSE, "input 'categorical': datatype INT64, expected BYTES"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,13],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[2,26],\"data\":["
       "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
       "\"\",\"\",\"\",\"\","
       "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
       "\"\",\"\",\"\",\"\""
       "]}]}",
       DLREC_ERR_PARSE, "inputs 'dense' and 'categorical': 1 and 2 rows"},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[1,13],"
       "\"data\":[\"1\",\"\",\"\",\"\",\"x7\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\"]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,26],\"data\":["
       "\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
       "\"\",\"\",\"\",\"\""
       "]}]}",
       DLREC_ERR_PARSE, "input 'dense': row 0, column I5: "},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,13],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0]},"
       "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,26],\"data\":["
       "\"\",\"\",\"\",\"zz\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
       "\"\",\"\",\"\",\"\",\"\""
       "]}]}",
       DLREC_ERR_PARSE, "input 'categorical': row 0, column C4: "},
      {"{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP64\",\"shape\":[1,13],\"data\":[0,0,0,0,0,0,0,0,0,0,0,0,0]},"
       "{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,1],\"data\":[0]}]}",
       DLREC_ERR_PARSE, "inputs mix the raw convention"},
      {"{\"inputs\":[{\"name\":\"Dense\",\"datatype\":\"FP64\",\"shape\":[1],\"data\":[0]}]}", DLREC_ERR_PARSE,
       "unknown input 'Dense'"},
  };
  int bad = 0;
  for (size_t i = 0; ok && i < sizeof cases / sizeof cases[0]; i++) {
    dlrec_kserve_request *req;
    if (parse(cases[i].body, &req) != DLREC_OK) {
      fprintf(stderr, "case %zu does not parse: %s\n", i, dlrec_last_error());
      bad++;
      continue;
    }
    st = dlrec_serve_rows_add_request(rows, req, 8, NULL);
    if (st != cases[i].st || !strstr(dlrec_last_error(), cases[i].msg)) {
      fprintf(stderr, "case %zu: expected \"%s\", got %s: %s\n", i, cases[i].msg, dlrec_status_name(st),
              dlrec_last_error());
      bad++;
    }
    dlrec_kserve_request_free(req);
  }
  /* Too many rows for the limit; the raw convention without an ETL state. */
  ok = ok && add_raw(rows, 0, 9, "FP64", 8) == DLREC_ERR_PARSE &&
       strstr(dlrec_last_error(), "input 'dense': 9 rows, more than the limit of 8 per request");
  ok = ok && add_raw(no_etl, 0, 1, "FP64", 8) == DLREC_ERR_UNSUPPORTED &&
       strstr(dlrec_last_error(), "need the model's ETL state");
  /* A request whose third row is bad writes nothing. */
  const char *late =
      "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[3,13],\"data\":["
      "\"1\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"2\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"3\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"nan\"]},"
      "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[3,26],\"data\":["
      "\"1\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"\",\"\",\"\",\"\","
      "\"2\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"\",\"\",\"\",\"\","
      "\"3\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\",\"\","
      "\"\",\"\",\"\",\"\""
      "]}]}";
  dlrec_kserve_request *req = NULL;
  ok = ok && parse(late, &req) == DLREC_OK;
  ok = ok && dlrec_serve_rows_add_request(rows, req, 8, NULL) == DLREC_ERR_PARSE &&
       strstr(dlrec_last_error(), "input 'dense': row 2, column I13");
  dlrec_kserve_request_free(req);
  dlrec_batch after;
  dlrec_serve_rows_batch(rows, &after);
  ok = ok && after.rows == 3 && !memcmp(after.dense, dense0, sizeof dense0);
  for (int c = 0; ok && c < NC; c++) ok = after.offsets[c][3] == 3;
  /* The next good request continues where the rows were. */
  ok = ok && add_raw(rows, 3, 2, "FP64", 8) == DLREC_OK && dlrec_serve_rows_count(rows) == 5;
  dlrec_serve_rows_batch(rows, &after);
  for (int c = 0; ok && c < NC; c++) ok = after.offsets[c][5] == 5;
  dlrec_serve_rows_free(rows);
  dlrec_serve_rows_free(no_etl);
  dlrec_etl_free(e);
  CHECK_EQ(bad, 0);
  CHECK(ok);
}

/* A HugeCTR-style request: DES (FP32 binary), CATCOLUMN (INT64 binary) and
 * ROWINDEX (INT32 JSON) for B rows of a batch view. */
static void hugectr_request(sbuf *b, long long *hl, const dlrec_batch *src, uint32_t r0, uint32_t B, uint32_t nd,
                            uint32_t nc) {
  uint32_t K = 0;
  for (uint32_t r = r0; r < r0 + B; r++)
    for (uint32_t c = 0; c < nc; c++) K += src->offsets[c][r + 1] - src->offsets[c][r];
  sbuf j = {0};
  test_buf_printf(&j, "{\"inputs\":[{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,%u],\"data\":[0", B * nc + 1);
  uint32_t k = 0;
  for (uint32_t r = r0; r < r0 + B; r++)
    for (uint32_t c = 0; c < nc; c++) {
      k += src->offsets[c][r + 1] - src->offsets[c][r];
      test_buf_printf(&j, ",%u", k);
    }
  test_buf_printf(
      &j,
      "]},{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,%u],\"parameters\":{\"binary_data_size\":%u}},"
      "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,%u],\"parameters\":{\"binary_data_size\":%u}}]}",
      B * nd, B * nd * 4, K, K * 8);
  test_buf_put(b, j.p, j.n);
  *hl = (long long)j.n;
  free(j.p);
  test_buf_put(b, src->dense + (size_t)r0 * nd, (size_t)B * nd * 4);
  for (uint32_t r = r0; r < r0 + B; r++)
    for (uint32_t c = 0; c < nc; c++)
      for (uint32_t q = src->offsets[c][r]; q < src->offsets[c][r + 1]; q++) {
        int64_t id = src->ids[c][q];
        test_buf_put(b, &id, 8);
      }
}

static dlrec_status add_body(dlrec_serve_rows *rows, const sbuf *b, long long hl, uint32_t max_rows) {
  dlrec_kserve_request *req;
  dlrec_status st = dlrec_kserve_parse_request(b->p, b->n, hl, NULL, &req);
  if (st != DLREC_OK) return st;
  st = dlrec_serve_rows_add_request(rows, req, max_rows, NULL);
  dlrec_kserve_request_free(req);
  return st;
}

TEST(hugectr_rows_equal_raw_rows_and_append_equals_one_request) {
  dlrec_etl *e = small_etl();
  CHECK(e != NULL);
  const dlrec_schema *s = dlrec_etl_schema(e);
  dlrec_serve_rows *raw = NULL, *hc = NULL, *x = NULL, *y = NULL, *z = NULL;
  int ok = dlrec_serve_rows_new(&raw, s, e) == DLREC_OK && dlrec_serve_rows_new(&hc, s, NULL) == DLREC_OK &&
           dlrec_serve_rows_new(&x, s, e) == DLREC_OK && dlrec_serve_rows_new(&y, s, e) == DLREC_OK &&
           dlrec_serve_rows_new(&z, s, e) == DLREC_OK;
  /* One raw request of rows 20..34, and the same rows sent the HugeCTR way. */
  ok = ok && add_raw(raw, 20, 15, "FP64", 64) == DLREC_OK;
  dlrec_batch a, b;
  dlrec_serve_rows_batch(raw, &a);
  sbuf body = {0};
  long long hl;
  hugectr_request(&body, &hl, &a, 0, 15, ND, NC);
  ok = ok && add_body(hc, &body, hl, 64) == DLREC_OK;
  if (!ok) fprintf(stderr, "%s\n", dlrec_last_error());
  dlrec_serve_rows_batch(hc, &b);
  ok = ok && same_rows(&a, &b, ND, NC);
  /* Two requests (rows 20..24 and 25..34) appended equal the one request. */
  ok = ok && add_raw(x, 20, 5, "FP64", 64) == DLREC_OK && add_raw(y, 25, 10, "BYTES", 64) == DLREC_OK;
  ok = ok && dlrec_serve_rows_append(z, x) == DLREC_OK && dlrec_serve_rows_append(z, y) == DLREC_OK;
  dlrec_serve_rows_batch(z, &b);
  /* BYTES blanked some dense values of y: compare the sparse side fully and
   * the dense side of x's rows. */
  int same_sparse = b.rows == 15;
  for (int c = 0; same_sparse && c < NC; c++)
    same_sparse = !memcmp(a.offsets[c], b.offsets[c], 16 * 4) && !memcmp(a.ids[c], b.ids[c], 15 * 4);
  ok = ok && same_sparse && !memcmp(a.dense, b.dense, 5 * ND * 4);
  /* And appending into rows that already hold rows equals adding there. */
  dlrec_serve_rows_clear(z);
  dlrec_serve_rows_clear(y);
  ok = ok && add_raw(z, 20, 5, "FP64", 64) == DLREC_OK && add_raw(y, 25, 10, "FP64", 64) == DLREC_OK &&
       dlrec_serve_rows_append(z, y) == DLREC_OK;
  dlrec_serve_rows_batch(z, &b);
  ok = ok && same_rows(&a, &b, ND, NC);
  /* The HugeCTR request split in two, appended, equals it too. */
  dlrec_serve_rows_clear(x);
  dlrec_serve_rows_clear(y);
  sbuf p1 = {0}, p2 = {0};
  long long h1, h2;
  hugectr_request(&p1, &h1, &a, 0, 7, ND, NC);
  hugectr_request(&p2, &h2, &a, 7, 8, ND, NC);
  ok = ok && add_body(x, &p1, h1, 64) == DLREC_OK && add_body(y, &p2, h2, 64) == DLREC_OK &&
       dlrec_serve_rows_append(x, y) == DLREC_OK;
  dlrec_serve_rows_batch(x, &b);
  ok = ok && same_rows(&a, &b, ND, NC);
  free(p1.p);
  free(p2.p);
  free(body.p);
  dlrec_serve_rows_free(raw);
  dlrec_serve_rows_free(hc);
  dlrec_serve_rows_free(x);
  dlrec_serve_rows_free(y);
  dlrec_serve_rows_free(z);
  dlrec_etl_free(e);
  CHECK(ok);
}

/* A small schema: dense a, b; sparse c0 [0,10) one-hot, c1 [10,20) up to 3
 * ids, c2 [20,25) exactly 2 ids. */
static void small_schema(dlrec_schema *s) {
  memset(s, 0, sizeof *s);
  s->n_dense = 2;
  s->n_sparse = 3;
  strcpy(s->dense_names[0], "a");
  strcpy(s->dense_names[1], "b");
  const uint32_t hot[3] = {1, 0, 2}, max[3] = {1, 3, 2};
  for (int c = 0; c < 3; c++) {
    snprintf(s->sparse[c].name, DLREC_NAME_MAX, "c%d", c);
    s->sparse[c].hotness = hot[c];
    s->sparse[c].max_hotness = max[c];
    s->sparse[c].id_begin = (uint64_t)c * 10;
    s->sparse[c].id_end = c == 2 ? 25 : (uint64_t)c * 10 + 10;
  }
  s->table_rows = 25;
}

#define HC(des, cat, ri)                                                \
  "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":" des \
  "},{\"name\":\"CATCOLUMN\",\"datatype\":"                             \
  "\"INT64\",\"shape\":" cat "},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":" ri "}]}"

TEST(hugectr_multi_hot_and_hostile_inputs) {
  dlrec_schema s;
  small_schema(&s);
  dlrec_serve_rows *rows;
  CHECK_OK(dlrec_serve_rows_new(&rows, &s, NULL));
  /* Two samples: c1 gets 3 keys then 0 keys; c2 always 2. */
  const char *good = HC("[1,4],\"data\":[[0.5,-1,2,3]]", "[1,9],\"data\":[[1,10,11,12,20,21,9,24,20]]",
                        "[1,7],\"data\":[[0,1,4,6,7,7,9]]");
  dlrec_kserve_request *req;
  dlrec_status st = parse(good, &req);
  int ok = st == DLREC_OK;
  uint32_t added = 0;
  ok = ok && dlrec_serve_rows_add_request(rows, req, 4, &added) == DLREC_OK && added == 2;
  if (!ok) fprintf(stderr, "%s\n", dlrec_last_error());
  dlrec_kserve_request_free(req);
  dlrec_batch b;
  dlrec_serve_rows_batch(rows, &b);
  const float dense[4] = {0.5f, -1, 2, 3};
  const uint32_t off1[3] = {0, 3, 3}, ids1[3] = {10, 11, 12}, off2[3] = {0, 2, 4}, ids2[4] = {20, 21, 24, 20};
  ok = ok && b.rows == 2 && !memcmp(b.dense, dense, sizeof dense) && b.offsets[0][1] == 1 && b.offsets[0][2] == 2 &&
       b.ids[0][0] == 1 && b.ids[0][1] == 9 && !memcmp(b.offsets[1], off1, sizeof off1) &&
       !memcmp(b.ids[1], ids1, sizeof ids1) && !memcmp(b.offsets[2], off2, sizeof off2) &&
       !memcmp(b.ids[2], ids2, sizeof ids2);
  /* Shapes [N] and [B, n_dense] are accepted too. */
  const char *flat =
      HC("[2,2],\"data\":[0.5,-1,2,3]", "[9],\"data\":[2,10,11,12,20,21,8,24,22]", "[7],\"data\":[0,1,4,6,7,7,9]");
  ok = ok && parse(flat, &req) == DLREC_OK;
  ok = ok && dlrec_serve_rows_add_request(rows, req, 4, NULL) == DLREC_OK && dlrec_serve_rows_count(rows) == 4;
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_batch(rows, &b);
  ok = ok && b.offsets[1][4] == 6 && b.offsets[2][4] == 8 && b.ids[2][7] == 22 && b.ids[0][3] == 8 &&
       b.offsets[0][4] == 4;
  CHECK(ok);

  static const struct {
    const char *body;
    const char *msg;
  } cases[] = {
      {HC("[1,3],\"data\":[[0,0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'DES': 3 values is not a multiple of the model's 2 dense columns"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,3],\"data\":[[0,1,4]]"),
       "input 'ROWINDEX': 3 entries, but 1 samples (from DES) x 3 columns + 1 = 4"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[1,1,2,4]]"),
       "input 'ROWINDEX': starts at 1, expected 0"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,1,2,3]]"),
       "input 'ROWINDEX': ends at 3, expected 4 (CATCOLUMN's length)"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,1,0,4]]"),
       "input 'ROWINDEX': decreases at entry 2 (1 then 0; sample 0, column c1)"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,0,2,4]]"),
       "input 'ROWINDEX': sample 0, column c0: 0 keys, the column takes exactly 1"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,7],\"data\":[[0,10,11,12,13,20,21]]", "[1,4],\"data\":[[0,1,5,7]]"),
       "input 'ROWINDEX': sample 0, column c1: 4 keys, the column takes at most 3"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,3],\"data\":[[0,10,20]]", "[1,4],\"data\":[[0,1,2,3]]"),
       "sample 0, column c2: 1 keys, the column takes exactly 2"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[10,10,20,21]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'CATCOLUMN': element 0 (sample 0, column c0): id 10 is outside the column's ids [0, 10)"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,-1]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'CATCOLUMN': element 3 (sample 0, column c2): id -1 is outside"},
      {HC("[1,2],\"data\":[[0,0]]", "[1,4],\"data\":[[0,10,20,25]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "id 25 is outside the column's ids [20, 25)"},
      {HC("[1,0],\"data\":[[]]", "[1,0],\"data\":[[]]", "[1,1],\"data\":[[0]]"), "input 'DES': no rows"},
      {HC("[2,1,2],\"data\":[[[0,0]],[[0,0]]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'DES': shape [2,1,2], expected [N] or [1, N]"},
      {HC("[1,2],\"data\":[[0,0]]", "[2,2],\"data\":[[0,10],[20,21]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'CATCOLUMN': shape [2,2], expected [N] or [1, N]"},
      {"{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[[0,0]]},"
       "{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,4],\"data\":[[0,1,2,4]]}]}",
       "missing input 'CATCOLUMN'"},
      {"{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP64\",\"shape\":[1,2],\"data\":[[0,0]]},"
       "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,4],\"data\":[[0,10,20,21]]},"
       "{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,4],\"data\":[[0,1,2,4]]}]}",
       "input 'DES': datatype FP64, expected FP32"},
      {"{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[[0,0]]},"
       "{\"name\":\"CATCOLUMN\",\"datatype\":\"FP32\",\"shape\":[1,4],\"data\":[[0,10,20,21]]},"
       "{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,4],\"data\":[[0,1,2,4]]}]}",
       "input 'CATCOLUMN': datatype FP32, expected INT64"},
      {"{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[[0,0]]},"
       "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,4],\"data\":[[0,10,20,21]]},"
       "{\"name\":\"ROWINDEX\",\"datatype\":\"UINT8\",\"shape\":[1,4],\"data\":[[0,1,2,4]]}]}",
       "input 'ROWINDEX': datatype UINT8, expected INT32"},
      {HC("[1,6],\"data\":[[0,0,0,0,0,0]]", "[1,4],\"data\":[[0,10,20,21]]", "[1,4],\"data\":[[0,1,2,4]]"),
       "input 'DES': 3 rows, more than the limit of 2 per request"},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (parse(cases[i].body, &req) != DLREC_OK) {
      fprintf(stderr, "case %zu does not parse: %s\n", i, dlrec_last_error());
      bad++;
      continue;
    }
    st = dlrec_serve_rows_add_request(rows, req, 2, NULL);
    if (st != DLREC_ERR_PARSE || !strstr(dlrec_last_error(), cases[i].msg)) {
      fprintf(stderr, "case %zu: expected \"%s\", got %s: %s\n", i, cases[i].msg, dlrec_status_name(st),
              dlrec_last_error());
      bad++;
    }
    dlrec_kserve_request_free(req);
  }
  /* DES must be finite: NaN can only come in binary. */
  sbuf nb = {0};
  const char *j =
      "{\"inputs\":[{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[1,2],"
      "\"parameters\":{\"binary_data_size\":8}},"
      "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,4],\"data\":[[0,10,20,21]]},"
      "{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,4],\"data\":[[0,1,2,4]]}]}";
  test_buf_put(&nb, j, strlen(j));
  const float des[2] = {1, NAN};
  test_buf_put(&nb, des, sizeof des);
  st = add_body(rows, &nb, (long long)strlen(j), 2);
  free(nb.p);
  if (st != DLREC_ERR_PARSE || !strstr(dlrec_last_error(), "input 'DES': sample 0, column b: not finite")) {
    fprintf(stderr, "NaN DES: %s: %s\n", dlrec_status_name(st), dlrec_last_error());
    bad++;
  }
  /* None of it changed the rows. */
  dlrec_serve_rows_batch(rows, &b);
  ok = b.rows == 4 && b.offsets[1][4] == 6 && b.offsets[2][4] == 8;
  dlrec_serve_rows_free(rows);
  CHECK_EQ(bad, 0);
  CHECK(ok);
}

TEST(rows_reserve_means_no_reallocation_in_steady_state) {
  dlrec_schema s;
  small_schema(&s);
  dlrec_serve_rows *rows, *other;
  CHECK_OK(dlrec_serve_rows_new(&rows, &s, NULL));
  dlrec_status st = dlrec_serve_rows_new(&other, &s, NULL);
  if (st != DLREC_OK) dlrec_serve_rows_free(rows);
  CHECK_OK(st);
  int ok = dlrec_serve_rows_reserve(rows, 300) == DLREC_OK;
  dlrec_batch b0, b1;
  dlrec_serve_rows_batch(rows, &b0);
  const char *one = HC("[1,2],\"data\":[[0.5,1]]", "[1,6],\"data\":[[3,10,11,12,20,21]]", "[1,4],\"data\":[[0,1,4,6]]");
  dlrec_kserve_request *req;
  ok = ok && parse(one, &req) == DLREC_OK;
  for (int round = 0; ok && round < 3; round++) {
    dlrec_serve_rows_clear(rows);
    for (int i = 0; ok && i < 100; i++) ok = dlrec_serve_rows_add_request(rows, req, 1, NULL) == DLREC_OK;
    dlrec_serve_rows_clear(other);
    ok = ok && dlrec_serve_rows_add_request(other, req, 1, NULL) == DLREC_OK &&
         dlrec_serve_rows_append(rows, other) == DLREC_OK;
  }
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_batch(rows, &b1);
  ok = ok && b1.rows == 101 && b1.dense == b0.dense;
  for (int c = 0; ok && c < 3; c++) ok = b1.offsets[c] == b0.offsets[c] && b1.ids[c] == b0.ids[c];
  ok = ok && b1.offsets[1][101] == 303 && b1.ids[1][302] == 12 && b1.dense[201] == 1.0f;
  /* Rows of another schema do not append. */
  dlrec_schema t = s;
  t.sparse[2].id_end = 24;
  dlrec_serve_rows *alien = NULL;
  ok = ok && dlrec_serve_rows_new(&alien, &t, NULL) == DLREC_OK &&
       dlrec_serve_rows_append(rows, alien) == DLREC_ERR_INVALID;
  dlrec_serve_rows_free(alien);
  dlrec_serve_rows_free(rows);
  dlrec_serve_rows_free(other);
  CHECK(ok);
}

/* ---- multi-hot and categorical-only models in the raw convention ---- */

/* Fits a CSV ETL state with `spec` on the lines (header first) and loads it. */
static dlrec_etl *csv_etl(const char *name, const char *spec, const char *const *lines, int n) {
  sbuf t = {0};
  for (int i = 0; i < n; i++) test_buf_printf(&t, "%s\n", lines[i]);
  char in[1024], dir[1024];
  snprintf(in, sizeof in, "%s.csv", test_path(name));
  snprintf(dir, sizeof dir, "%s.etl", test_path(name));
  int w = test_write_file(in, t.p, t.n);
  free(t.p);
  if (w != 0) return NULL;
  dlrec_etl_fit_opts o;
  dlrec_etl_fit_opts_default(&o);
  o.format = DLREC_FORMAT_CSV;
  o.schema_spec = spec;
  o.progress = 0;
  o.threads = 1;
  const char *ins[] = {in};
  dlrec_etl *e = NULL;
  if (dlrec_etl_fit(ins, 1, dir, &o, NULL) != DLREC_OK || dlrec_etl_load(&e, dir) != DLREC_OK) {
    fprintf(stderr, "csv_etl: %s\n", dlrec_last_error());
    return NULL;
  }
  return e;
}

/* Appends a JSON array of strings to b. */
static void json_strs(sbuf *b, const char *const *v, int n) {
  test_buf_put(b, "[", 1);
  for (int i = 0; i < n; i++) test_buf_printf(b, "%s\"%s\"", i ? "," : "", v[i]);
  test_buf_put(b, "]", 1);
}

/* The rows of unlabeled CSV lines as dlrec_etl_encode_line_multi encodes
 * them, gathered per column: the reference a server's rows must equal. */
typedef struct ref_rows {
  float dense[16];
  uint32_t offsets[DLREC_MAX_SPARSE][9], ids[DLREC_MAX_SPARSE][64];
} ref_rows;

static int encode_ref(const dlrec_etl *e, const char *const *lines, int B, ref_rows *ref, dlrec_batch *b) {
  const dlrec_schema *s = dlrec_etl_schema(e);
  memset(ref, 0, sizeof *ref);
  memset(b, 0, sizeof *b);
  for (int r = 0; r < B; r++) {
    uint32_t ids[64], nids[DLREC_MAX_SPARSE];
    if (dlrec_etl_encode_line_multi(e, lines[r], strlen(lines[r]), 0, NULL, ref->dense + r * s->n_dense, ids, nids,
                                    NULL) != DLREC_OK) {
      fprintf(stderr, "encode_ref: line %d: %s\n", r, dlrec_last_error());
      return 0;
    }
    const uint32_t *at = ids;
    for (uint32_t c = 0; c < s->n_sparse; c++) {
      memcpy(ref->ids[c] + ref->offsets[c][r], at, nids[c] * sizeof *at);
      ref->offsets[c][r + 1] = ref->offsets[c][r] + nids[c];
      at += nids[c];
    }
  }
  b->rows = (uint32_t)B;
  b->dense = ref->dense;
  for (uint32_t c = 0; c < s->n_sparse; c++) {
    b->offsets[c] = ref->offsets[c];
    b->ids[c] = ref->ids[c];
  }
  return 1;
}

/* Adds a NUL-terminated JSON request to rows; prints the error. */
static dlrec_status add_json(dlrec_serve_rows *rows, const char *json) {
  dlrec_kserve_request *req;
  dlrec_status st = parse(json, &req);
  if (st == DLREC_OK) {
    st = dlrec_serve_rows_add_request(rows, req, 8, NULL);
    dlrec_kserve_request_free(req);
  }
  if (st != DLREC_OK) fprintf(stderr, "  %s\n", dlrec_last_error());
  return st;
}

/* The HugeCTR request of the reference rows: DES (left out when nd is 0
 * and omit_des), CATCOLUMN and ROWINDEX sample-major. */
static void hugectr_of(sbuf *j, const dlrec_batch *b, uint32_t nd, uint32_t nc, int omit_des) {
  test_buf_printf(j, "{\"inputs\":[");
  if (!omit_des) {
    test_buf_printf(j, "{\"name\":\"DES\",\"datatype\":\"FP32\",\"shape\":[%u],\"data\":[", b->rows * nd);
    for (uint32_t i = 0; i < b->rows * nd; i++) test_buf_printf(j, "%s%.9g", i ? "," : "", b->dense[i]);
    test_buf_printf(j, "]},");
  }
  uint32_t K = 0;
  for (uint32_t c = 0; c < nc; c++) K += b->offsets[c][b->rows];
  test_buf_printf(j, "{\"name\":\"CATCOLUMN\",\"datatype\":\"INT64\",\"shape\":[1,%u],\"data\":[[", K);
  int first = 1;
  for (uint32_t r = 0; r < b->rows; r++)
    for (uint32_t c = 0; c < nc; c++)
      for (uint32_t k = b->offsets[c][r]; k < b->offsets[c][r + 1]; k++, first = 0)
        test_buf_printf(j, "%s%u", first ? "" : ",", b->ids[c][k]);
  test_buf_printf(j, "]]},{\"name\":\"ROWINDEX\",\"datatype\":\"INT32\",\"shape\":[1,%u],\"data\":[[0", b->rows * nc + 1);
  uint32_t at = 0;
  for (uint32_t r = 0; r < b->rows; r++)
    for (uint32_t c = 0; c < nc; c++) {
      at += b->offsets[c][r + 1] - b->offsets[c][r];
      test_buf_printf(j, ",%u", at);
    }
  test_buf_printf(j, "]]}]}");
  test_buf_put(j, "", 1);
}

/* Multi-hot fields in raw requests used to be refused ("takes 0 ids per row;
 * send it as CATCOLUMN and ROWINDEX"). Now each field's text encodes as in
 * its line: several values, none (the missing id), empty values skipped,
 * more than the max hotness cut to the first ones, unseen ones OOV. */
TEST(raw_rows_multi_hot_fields_encode_as_their_lines) {
  static const char *const fit[] = {"click,price,user,genres", "1,3,u1,a|b", "0,,u2,b", "1,7,u1,c|a|b", "0,2,u3,",
                                    "1,5,u2,b|c"};
  dlrec_etl *e = csv_etl("multi", "label=click;dense=price;cat=*;multi=genres:|:sum:2", fit, 6);
  CHECK(e != NULL);
  if (!e) return;
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_dense, 1u);
  CHECK_EQ(s->n_sparse, 2u);
  CHECK_EQ(s->sparse[1].max_hotness, 2u);
  /* Unlabeled lines, and the same fields as a request. */
  static const char *const lines[] = {"4,u1,a|b", ",u2,", "1,u9,c|b|a", "0,u3,||a||", "2,u2,zz|b"};
  static const char *const dense[] = {"4", "", "1", "0", "2"};
  static const char *const cats[] = {"u1", "a|b", "u2", "", "u9", "c|b|a", "u3", "||a||", "u2", "zz|b"};
  ref_rows ref;
  dlrec_batch want;
  CHECK(encode_ref(e, lines, 5, &ref, &want));
  /* The reference is itself multi-hot: 2, 1, 2 (cut), 1 and 2 ids. */
  const uint32_t want_off[6] = {0, 2, 3, 5, 6, 8};
  CHECK(!memcmp(ref.offsets[1], want_off, sizeof want_off));
  sbuf j = {0};
  test_buf_printf(&j, "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[5,1],\"data\":");
  json_strs(&j, dense, 5);
  test_buf_printf(&j, "},{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[5,2],\"data\":");
  json_strs(&j, cats, 10);
  test_buf_printf(&j, "}]}");
  test_buf_put(&j, "", 1);
  dlrec_serve_rows *rows = NULL;
  CHECK_OK(dlrec_serve_rows_new(&rows, s, e));
  CHECK_OK(add_json(rows, j.p));
  dlrec_batch got;
  dlrec_serve_rows_batch(rows, &got);
  CHECK(same_rows(&want, &got, 1, 2));
  /* The HugeCTR convention carries the same multi-hot rows. */
  dlrec_serve_rows *hc = NULL;
  CHECK_OK(dlrec_serve_rows_new(&hc, s, NULL));
  sbuf h = {0};
  hugectr_of(&h, &want, 1, 2, 0);
  CHECK_OK(add_json(hc, h.p));
  dlrec_serve_rows_batch(hc, &got);
  CHECK(same_rows(&want, &got, 1, 2));
  /* A request after a refused one: a bad dense value in row 1 leaves the
   * rows as they were, even with row 0's multi-hot ids written. */
  dlrec_kserve_request *req;
  CHECK_OK(parse("{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[2,1],\"data\":[\"1\",\"x\"]},"
                 "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[2,2],\"data\":[\"u1\",\"a|b\",\"u2\",\"b\"]}]}",
                 &req));
  CHECK_ERR(dlrec_serve_rows_add_request(rows, req, 8, NULL), DLREC_ERR_PARSE, "input 'dense': row 1, column price");
  dlrec_kserve_request_free(req);
  dlrec_serve_rows_batch(rows, &got);
  CHECK(same_rows(&want, &got, 1, 2));
  /* A model with dense columns still needs its dense input. */
  CHECK_OK(parse("{\"inputs\":[{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[1,2],\"data\":[\"u1\",\"a\"]}]}",
                 &req));
  CHECK_ERR(dlrec_serve_rows_add_request(rows, req, 8, NULL), DLREC_ERR_PARSE, "missing input 'dense'");
  dlrec_kserve_request_free(req);
  free(j.p);
  free(h.p);
  dlrec_serve_rows_free(rows);
  dlrec_serve_rows_free(hc);
  dlrec_etl_free(e);
}

/* A model without dense columns: the raw convention takes categorical alone
 * or with dense of shape [B, 0]; the HugeCTR one takes DES empty or left
 * out (it used to answer "missing input 'dense'" and "missing input 'DES'"). */
TEST(categorical_only_model_takes_no_dense_input) {
  static const char *const fit[] = {"click,user,genres", "1,u1,a|b", "0,u2,b", "1,u1,c", "0,u3,"};
  dlrec_etl *e = csv_etl("catonly", "label=click;cat=*;multi=genres:|", fit, 5);
  CHECK(e != NULL);
  if (!e) return;
  const dlrec_schema *s = dlrec_etl_schema(e);
  CHECK_EQ(s->n_dense, 0u);
  static const char *const lines[] = {"u1,b|c", "u7,", "u3,a"};
  static const char *const cats[] = {"u1", "b|c", "u7", "", "u3", "a"};
  ref_rows ref;
  dlrec_batch want;
  CHECK(encode_ref(e, lines, 3, &ref, &want));
  sbuf cat = {0};
  test_buf_printf(&cat, "{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[3,2],\"data\":");
  json_strs(&cat, cats, 6);
  test_buf_put(&cat, "}", 1);
  char body[3][1024];
  snprintf(body[0], sizeof body[0], "{\"inputs\":[%.*s]}", (int)cat.n, cat.p);
  snprintf(body[1], sizeof body[1],
           "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[3,0],\"data\":[]},%.*s]}", (int)cat.n,
           cat.p);
  snprintf(body[2], sizeof body[2],
           "{\"inputs\":[%.*s,{\"name\":\"dense\",\"datatype\":\"BYTES\",\"shape\":[3,0],\"data\":[[],[],[]]}]}",
           (int)cat.n, cat.p);
  for (int k = 0; k < 3; k++) {
    dlrec_serve_rows *rows = NULL;
    CHECK_OK(dlrec_serve_rows_new(&rows, s, e));
    CHECK_OK(add_json(rows, body[k]));
    dlrec_batch got;
    dlrec_serve_rows_batch(rows, &got);
    if (!same_rows(&want, &got, 0, 2)) test_fail(__FILE__, __LINE__, "raw request %d: rows differ", k);
    dlrec_serve_rows_free(rows);
  }
  for (int omit = 0; omit < 2; omit++) {
    dlrec_serve_rows *rows = NULL;
    CHECK_OK(dlrec_serve_rows_new(&rows, s, NULL));
    sbuf h = {0};
    hugectr_of(&h, &want, 0, 2, omit);
    CHECK_OK(add_json(rows, h.p));
    dlrec_batch got;
    dlrec_serve_rows_batch(rows, &got);
    if (!same_rows(&want, &got, 0, 2)) test_fail(__FILE__, __LINE__, "HugeCTR request (DES %s): rows differ",
                                                 omit ? "left out" : "empty");
    free(h.p);
    dlrec_serve_rows_free(rows);
  }
  /* Rows of [B, 0] dense must agree with categorical's B, and a request
   * with neither input is still refused. */
  dlrec_serve_rows *rows = NULL;
  CHECK_OK(dlrec_serve_rows_new(&rows, s, e));
  snprintf(body[0], sizeof body[0],
           "{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[2,0],\"data\":[]},%.*s]}", (int)cat.n,
           cat.p);
  dlrec_kserve_request *req;
  CHECK_OK(parse(body[0], &req));
  CHECK_ERR(dlrec_serve_rows_add_request(rows, req, 8, NULL), DLREC_ERR_PARSE, "inputs 'dense' and 'categorical': 2 and 3 rows");
  dlrec_kserve_request_free(req);
  CHECK_OK(parse("{\"inputs\":[{\"name\":\"dense\",\"datatype\":\"FP32\",\"shape\":[2,0],\"data\":[]}]}", &req));
  CHECK_ERR(dlrec_serve_rows_add_request(rows, req, 8, NULL), DLREC_ERR_PARSE, "missing input 'categorical'");
  dlrec_kserve_request_free(req);
  CHECK_EQ(dlrec_serve_rows_count(rows), 0u);
  free(cat.p);
  dlrec_serve_rows_free(rows);
  dlrec_etl_free(e);
}

/* A libSVM model's one column "features": a raw request gives a row's
 * indices separated by spaces, and they encode as the row's line does. */
TEST(raw_rows_libsvm_features_encode_as_their_lines) {
  const char *text = "1 3:1 7:1 12:1\n0 3:1 9:1\n1 7:1\n0\n1 12:1 3:1 3:1\n";
  char in[1024], dir[1024];
  snprintf(in, sizeof in, "%s", test_path("a.svm"));
  snprintf(dir, sizeof dir, "%s", test_path("svm.etl"));
  CHECK(test_write_file(in, text, strlen(text)) == 0);
  dlrec_etl_fit_opts o;
  dlrec_etl_fit_opts_default(&o);
  o.format = DLREC_FORMAT_LIBSVM;
  o.progress = 0;
  o.threads = 1;
  const char *ins[] = {in};
  dlrec_etl *e = NULL;
  CHECK_OK(dlrec_etl_fit(ins, 1, dir, &o, NULL));
  CHECK_OK(dlrec_etl_load(&e, dir));
  static const char *const lines[] = {"3:1 7:1 12:1", "", "12:1 99:1 3:1"};
  ref_rows ref;
  dlrec_batch want, got;
  CHECK(encode_ref(e, lines, 3, &ref, &want));
  dlrec_serve_rows *rows = NULL;
  CHECK_OK(dlrec_serve_rows_new(&rows, dlrec_etl_schema(e), e));
  CHECK_OK(add_json(rows, "{\"inputs\":[{\"name\":\"categorical\",\"datatype\":\"BYTES\",\"shape\":[3,1],"
                          "\"data\":[\"3 7 12\",\"\",\"12 99 3\"]}]}"));
  dlrec_serve_rows_batch(rows, &got);
  CHECK_EQ(got.offsets[0][3], 7u); /* 3 ids, the missing id, 3 ids */
  CHECK(same_rows(&want, &got, 0, 1));
  dlrec_serve_rows_free(rows);
  dlrec_etl_free(e);
}
