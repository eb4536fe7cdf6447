/* The pieces under checkpoints, in-process: tensor files (a grown file is
 * refused; the whole-file checksum covers the padding the arrays' own
 * checksums miss) and the run directory's lock. Then runs through the
 * trainer and the CLI in 16 bits: bf16 and fp16 embedding tables
 * (training.table_dtype) and bf16 GEMMs (training.precision), each learning
 * as well as fp32, saved, resumed bitwise and scored. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/crc32c.h"
#include "core/fsutil.h"
#include "test.h"
#include "train/tensor_file.h"

/* The CRC32C of a whole file, read here: the reference for what the tensor
 * file functions report. */
static uint32_t crc_of_file(const char *path) {
  char *text;
  size_t n;
  if (dlrec_read_file(path, 1u << 26, &text, &n) != DLREC_OK) return 0;
  uint32_t crc = dlrec_crc32c(0, text, n);
  free(text);
  return crc;
}

static int flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return 0;
  int c = fseek(f, offset, SEEK_SET) == 0 ? fgetc(f) : EOF;
  int ok = c != EOF && fseek(f, offset, SEEK_SET) == 0 && fputc(c ^ 0x40, f) != EOF;
  return fclose(f) == 0 && ok;
}

/* Two arrays whose byte counts are not multiples of 64, so that the file has
 * padding after each. */
TEST(tensor_file_checksum_covers_every_byte) {
  float a[3] = {1.5f, -2.0f, 3.25f};
  uint32_t b[5] = {1, 2, 3, 4, 5};
  tensor_desc w[2] = {tensor_array("a", TENSOR_F32, 3, a, 0), tensor_array("b", TENSOR_U32, 5, b, 0)};
  const char *path = test_path("t.bin");
  uint32_t wrote = 0, read = 0;
  CHECK_OK(tensor_file_write(path, w, 2, &wrote));
  CHECK_EQ_U64(wrote, crc_of_file(path));
  /* Header 32 + table 128 = 160: a at 192, b at 256, the file ends at 320. */
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK_EQ(st.st_size, 320);
  float ra[3];
  uint32_t rb[5];
  tensor_desc r[2] = {tensor_array("b", TENSOR_U32, 5, rb, 0), tensor_array("a", TENSOR_F32, 3, ra, 0)}; /* any order */
  CHECK_OK(tensor_file_read(path, r, 2, &read));
  CHECK_EQ_U64(read, wrote);
  CHECK(memcmp(ra, a, sizeof a) == 0 && memcmp(rb, b, sizeof b) == 0);
  /* A flip in the padding after a (bytes 204..256) and after the last array
   * (276..320): the arrays read fine, the whole-file checksum changes. */
  const long pads[] = {210, 319};
  for (int i = 0; i < 2; i++) {
    CHECK(flip_byte(path, pads[i]));
    CHECK_OK(tensor_file_read(path, r, 2, &read));
    CHECK_EQ_U64(read, crc_of_file(path));
    CHECK(read != wrote);
    CHECK(flip_byte(path, pads[i]));
  }
  CHECK_OK(tensor_file_read(path, r, 2, &read));
  CHECK_EQ_U64(read, wrote);
}

/* Gathered rows (a journal's changed rows of a table): written from their
 * places in a larger array, read back contiguous and scattered to their
 * places, with rows of 3 floats so that 8 MiB chunks end inside a row. A
 * damaged array is refused before any row is scattered. */
TEST(tensor_file_gathers_and_scatters_rows) {
  enum { ROWS = 2000000, ELEMS = 3, PICK = 900000 };
  float *table = malloc(sizeof(float) * ROWS * ELEMS), *back = malloc(sizeof(float) * ROWS * ELEMS);
  float *flat = malloc(sizeof(float) * PICK * ELEMS);
  uint32_t *rows = malloc(sizeof(uint32_t) * PICK);
  CHECK(table && back && flat && rows);
  for (size_t i = 0; i < (size_t)ROWS * ELEMS; i++) table[i] = (float)i;
  for (uint32_t i = 0; i < PICK; i++) rows[i] = i * 2 + (i % 3 == 0); /* ascending, gaps of 1 to 3 */
  tensor_desc g = tensor_array("rows_of_table", TENSOR_F32, (uint64_t)PICK * ELEMS, table, 0);
  g.rows = rows, g.row_elems = ELEMS;
  const char *path = test_path("g.bin");
  uint32_t wrote, read;
  CHECK_OK(tensor_file_write(path, &g, 1, &wrote));
  tensor_desc f = tensor_array("rows_of_table", TENSOR_F32, (uint64_t)PICK * ELEMS, flat, 0);
  CHECK_OK(tensor_file_read(path, &f, 1, &read));
  CHECK_EQ_U64(read, wrote);
  int bad = 0;
  for (uint32_t i = 0; i < PICK; i++)
    for (int e = 0; e < ELEMS; e++) bad += flat[(size_t)i * ELEMS + e] != table[(size_t)rows[i] * ELEMS + e];
  CHECK_EQ(bad, 0);
  for (size_t i = 0; i < (size_t)ROWS * ELEMS; i++) back[i] = -1.0f;
  tensor_desc sc = g;
  sc.data = back;
  CHECK_OK(tensor_file_read(path, &sc, 1, &read));
  size_t placed = 0, untouched = 0;
  for (uint32_t r = 0, i = 0; r < ROWS; r++) {
    const int picked = i < PICK && rows[i] == r;
    for (int e = 0; e < ELEMS; e++) {
      const size_t k = (size_t)r * ELEMS + e;
      if (picked) placed += back[k] == table[k];
      else untouched += back[k] == -1.0f;
    }
    i += picked;
  }
  CHECK_EQ_U64(placed, (uint64_t)PICK * ELEMS);
  CHECK_EQ_U64(untouched, (uint64_t)(ROWS - PICK) * ELEMS);
  /* A flipped byte in the array: refused, and no row written. */
  for (size_t i = 0; i < (size_t)ROWS * ELEMS; i++) back[i] = -1.0f;
  CHECK(flip_byte(path, 64 + 5000000));
  CHECK_ERR(tensor_file_read(path, &sc, 1, &read), DLREC_ERR_CORRUPT, "checksum mismatch");
  size_t changed = 0;
  for (size_t i = 0; i < (size_t)ROWS * ELEMS; i++) changed += back[i] != -1.0f;
  CHECK_EQ_U64(changed, 0);
  free(table), free(back), free(flat), free(rows);
}

TEST(tensor_file_that_has_grown_is_refused) {
  float a[16] = {0};
  tensor_desc w = tensor_array("a", TENSOR_F32, 16, a, 0);
  const char *path = test_path("t.bin");
  uint32_t crc;
  CHECK_OK(tensor_file_write(path, &w, 1, &crc));
  FILE *f = fopen(path, "ab");
  CHECK(f);
  fputs("extra bytes", f);
  fclose(f);
  CHECK_ERR(tensor_file_read(path, &w, 1, &crc), DLREC_ERR_CORRUPT, "t.bin: truncated or extended");
}

TEST(lock_dir_refuses_a_second_holder_naming_the_pid) {
  const char *dir = test_tmpdir();
  int a = -1, b = -1;
  CHECK_OK(dlrec_lock_dir(dir, "a test", &a));
  CHECK(a >= 0);
  /* flock conflicts between two open files even within one process. */
  char want[64];
  snprintf(want, sizeof want, "in use by a test (pid %ld,", (long)getpid());
  CHECK_ERR(dlrec_lock_dir(dir, "a test", &b), DLREC_ERR_INVALID, want);
  CHECK_EQ(b, -1);
  dlrec_unlock_dir(a);
  CHECK_OK(dlrec_lock_dir(dir, "a test", &b));
  dlrec_unlock_dir(b);
}

/* ---- 16-bit embedding tables: train, save, resume, load ---------------------- */

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "embed/embed.h"
#include "core/fsutil.h"
#include "train/train_config.h"
#include "train/trainer.h"

/* Synthesizes rows, fits the ETL and encodes train/valid files in tmpdir. */
static int make_data(int rows, int cardinality) {
  char *out = NULL;
  const char *bin = getenv("DLREC_BIN");
  int rc = test_run_cli(&out, "synth -q --rows %d --seed 3 --max-cardinality %d --out '%s' && '%s' etl fit -q --input '%s' "
                        "--out '%s' --min-count 2 && '%s' etl apply -q --etl '%s' --input '%s' --out '%s' "
                        "--valid-fraction 0.2 --valid-out '%s' --seed 1",
                        rows, cardinality, test_path("clicks.tsv"), bin, test_path("clicks.tsv"), test_path("etl"), bin,
                        test_path("etl"), test_path("clicks.tsv"), test_path("train.dlr"), test_path("valid.dlr"));
  if (rc != 0) fprintf(stderr, "data setup failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc;
}

/* Writes cfg-DTYPE[-PRECISION].json, a small DLRM whose table stores dtype
 * and whose GEMMs run in training.precision `precision` (NULL: the key is
 * left out, the default), and returns its path (test_path's buffers are
 * reused, so the path is copied into one of three of its own). */
static const char *write_config(const char *dtype, const char *precision, const char *sparse) {
  static char paths[3][2048];
  static int next;
  char name[64], text[1024], prec[64] = "";
  snprintf(name, sizeof name, "cfg-%s%s%s.json", dtype, precision ? "-" : "", precision ? precision : "");
  if (precision) snprintf(prec, sizeof prec, ", \"precision\": \"%s\"", precision);
  snprintf(text, sizeof text,
           "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
           " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": %s},"
           " \"training\": {\"batch_size\": 128, \"epochs\": 1, \"threads\": 2, \"seed\": 5, \"deterministic\": true,"
           " \"table_dtype\": \"%s\"%s},"
           " \"checkpoint\": {\"interval_steps\": 50, \"keep\": 3}, \"log\": {\"interval_steps\": 50}}",
           sparse, dtype, prec);
  char *path = paths[next++ % 3];
  snprintf(path, sizeof paths[0], "%s", test_path(name));
  return test_write_file(path, text, (size_t)-1) == 0 ? path : NULL;
}

static int train_cli(const char *cfg, const char *run, const char *extra) {
  char *out = NULL;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' %s", cfg,
                        test_path("train.dlr"), test_path("etl"), test_path(run), extra);
  if (rc != 0) fprintf(stderr, "train %s %s -> %d: %s\n", run, extra, rc, out ? out : "");
  free(out);
  return rc;
}

static int same_file(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  int eq = dlrec_read_file(a, 1u << 30, &x, &nx) == DLREC_OK && dlrec_read_file(b, 1u << 30, &y, &ny) == DLREC_OK &&
           nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return eq;
}

/* Two checkpoints hold the same state: their dense, table and optimizer
 * files are byte for byte equal. */
static void check_same_state(const char *dir_a, const char *dir_b) {
  const char *files[] = {"dense.bin", "table.bin", "optim.bin"};
  for (int i = 0; i < 3; i++) {
    char x[2048], y[2048];
    snprintf(x, sizeof x, "%s/%s", dir_a, files[i]);
    snprintf(y, sizeof y, "%s/%s", dir_b, files[i]);
    if (!same_file(x, y)) test_fail(__FILE__, __LINE__, "%s differs after resume", files[i]);
  }
}

/* A bf16 table: the checkpoint records its dtype and half the bytes; a run
 * stopped and resumed ends bitwise where the uninterrupted one does (the
 * stochastic rounding's update counter is restored); the model loads as bf16
 * and scores as the trainer did; resuming with another dtype, or reading its
 * table as fp32, is refused naming both dtypes. */
TEST(bf16_table_checkpoint_round_trip_resume_and_load) {
  CHECK(make_data(12000, 2000) == 0);
  const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05}";
  const char *bf16 = write_config("bf16", NULL, sgd), *fp32 = write_config("fp32", NULL, sgd);
  CHECK(bf16 && fp32);
  /* ~75 steps: stop at 40, between the checkpoints at 0..50. */
  CHECK(train_cli(bf16, "straight", "") == 0);
  CHECK(train_cli(bf16, "resumed", "--max-steps 40") == 0);
  CHECK(train_cli(bf16, "resumed", "--resume") == 0);
  CHECK(train_cli(fp32, "fp32", "") == 0);
  if (test_failed_now()) return;
  dlrec_model *a = NULL, *b = NULL, *c = NULL;
  CHECK_OK(dlrec_model_load(test_path("straight"), &a));
  CHECK_OK(dlrec_model_load(test_path("resumed"), &b));
  CHECK_OK(dlrec_model_load(test_path("fp32"), &c));
  if (test_failed_now()) goto out;
  CHECK_EQ(dlrec_table_get_dtype(dlrec_net_table(a->net)), DLREC_TABLE_BF16);
  CHECK_EQ(dlrec_table_get_dtype(dlrec_net_table(c->net)), DLREC_TABLE_FP32);
  CHECK_EQ_U64(a->progress.step, b->progress.step);
  check_same_state(a->dir, b->dir);
  /* table.bin: the same rows in half the bytes (up to the header's). */
  struct stat s16, s32;
  char p16[2048], p32[2048];
  snprintf(p16, sizeof p16, "%s/table.bin", a->dir);
  snprintf(p32, sizeof p32, "%s/table.bin", c->dir);
  CHECK(stat(p16, &s16) == 0 && stat(p32, &s32) == 0);
  const dlrec_table *t = dlrec_net_table(a->net);
  const uint64_t elems = dlrec_table_rows(t) * dlrec_table_stride(t);
  CHECK(s16.st_size >= (off_t)(2 * elems) && s16.st_size < (off_t)(2 * elems + 256));
  CHECK(s32.st_size >= (off_t)(4 * elems) && s32.st_size < (off_t)(4 * elems + 256));
  /* Loaded, it scores the validation rows as any model does. */
  const char *valid[] = {test_path("valid.dlr")};
  dlrec_metrics m;
  CHECK_OK(dlrec_evaluate(a->net, valid, 1, 256, 0, &m));
  CHECK(m.auc > 0.55);
  /* Resuming a bf16 run with an fp32 config is refused, by name. */
  {
    char *out = NULL;
    int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume", fp32,
                          test_path("train.dlr"), test_path("etl"), test_path("straight"));
    CHECK(rc != 0);
    CHECK(out && strstr(out, "its embedding table is bf16, the config's 'training.table_dtype' is fp32"));
    if (out && !strstr(out, "bf16")) fprintf(stderr, "%s\n", out);
    free(out);
  }
  /* The table's array read as fp32 is refused naming both dtypes. */
  {
    float *buf = malloc(elems * sizeof(float));
    tensor_desc d = tensor_array("table", TENSOR_F32, elems, buf, 0);
    uint32_t crc;
    CHECK_ERR(tensor_file_read(p16, &d, 1, &crc), DLREC_ERR_INVALID, "holds");
    CHECK(strstr(dlrec_last_error(), "bf16") && strstr(dlrec_last_error(), "f32"));
    free(buf);
  }
out:
  dlrec_model_free(a);
  dlrec_model_free(b);
  dlrec_model_free(c);
}

/* Trains config cfg (NULL: a failure) on make_data's train.dlr into RUN and
 * returns the validation AUC, or NAN (the test failed) when anything did. */
static double train_valid_auc(const char *cfg, const char *run) {
  if (!cfg) return NAN;
  const char *train[] = {test_path("train.dlr")};
  dlrec_train_args a = {.config_path = cfg, .train = train, .n_train = 1, .valid = test_path("valid.dlr"),
                        .etl_dir = test_path("etl"), .run_dir = test_path(run)};
  dlrec_train_result r;
  if (dlrec_train(&a, &r) != DLREC_OK) {
    fprintf(stderr, "training %s: %s\n", run, dlrec_last_error());
    return NAN;
  }
  return r.has_valid ? r.valid.auc : NAN;
}

/* Learning: on the same data and seed, a bf16 table (and an fp16 one)
 * reaches the fp32 table's validation AUC within 0.003 (issue 10's bound). */
TEST(table_16bit_learns_as_well_as_fp32) {
  CHECK(make_data(60000, 20000) == 0);
  const char *adagrad = "{\"type\": \"rowwise_adagrad\", \"lr\": 0.05}";
  const char *dtypes[] = {"fp32", "bf16", "fp16"};
  double auc[3] = {0};
  for (int i = 0; i < 3 && !test_failed_now(); i++) {
    char run[32];
    snprintf(run, sizeof run, "learn-%s", dtypes[i]);
    auc[i] = train_valid_auc(write_config(dtypes[i], NULL, adagrad), run);
  }
  fprintf(stderr, "validation AUC: fp32 %.4f, bf16 %.4f, fp16 %.4f\n", auc[0], auc[1], auc[2]);
  CHECK(auc[0] > 0.6);
  CHECK(fabs(auc[1] - auc[0]) <= 0.003);
  CHECK(fabs(auc[2] - auc[0]) <= 0.003);
}

/* training.table_dtype: the three names, the default, a bad name refused
 * naming the field and the choices, and the key written back. */
TEST(config_table_dtype_parses_defaults_and_refuses_unknown_names) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  CHECK_EQ(c.model.table_dtype, DLREC_TABLE_FP32);
  const char *names[] = {"fp32", "bf16", "fp16"};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"table_dtype\": \"%s\"}}", names[i]);
    cJSON *j = cJSON_Parse(text);
    dlrec_train_config_default(&c);
    CHECK_OK(dlrec_train_config_from_json(j, "cfg.json", &c));
    CHECK_EQ(c.model.table_dtype, (uint32_t)i);
    cJSON *back = dlrec_train_config_to_json(&c);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(back, "training");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(t, "table_dtype");
    CHECK(cJSON_IsString(d) && !strcmp(d->valuestring, names[i]));
    cJSON_Delete(back);
    cJSON_Delete(j);
  }
  cJSON *j = cJSON_Parse("{\"training\": {\"table_dtype\": \"int8\"}}");
  dlrec_train_config_default(&c);
  CHECK_ERR(dlrec_train_config_from_json(j, "cfg.json", &c), DLREC_ERR_INVALID,
            "cfg.json: training: field 'table_dtype': 'int8' is not one of fp32, bf16, fp16");
  cJSON_Delete(j);
}

/* ---- bf16 GEMMs (training.precision) through the trainer ---------------------- */

#include "backend/backend.h"
#include "serve_check.h"

/* Whether a bf16 backend runs its GEMMs on bf16 instructions on this CPU
 * (oneDNN on AMX or AVX512-BF16) rather than emulating them; -1 if none
 * can be made. */
static int bf16_native_here(void) {
  dlrec_backend_config c = {1, DLREC_PRECISION_BF16, 0};
  dlrec_backend *be = NULL;
  if (dlrec_backend_create(&be, "cpu", &c) != DLREC_OK) return -1;
  int native = dlrec_backend_bf16_native(be);
  dlrec_backend_free(be);
  return native;
}

/* Every line of RUN/metrics.jsonl whose step lies in [lo, hi] names the cpu
 * backend, the GEMM precision `precision` and bf16_native `native`. Returns
 * how many lines it checked, or -1 after reporting the first that does not
 * say so (or an unreadable file). */
static int lines_say_precision(const char *run, uint64_t lo, uint64_t hi, const char *precision, int native) {
  char path[2048], *text = NULL;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(run));
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) {
    test_fail(__FILE__, __LINE__, "%s: %s", path, dlrec_last_error());
    return -1;
  }
  int checked = 0;
  for (char *line = text, *nl; checked >= 0 && (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    cJSON *j = cJSON_Parse(line);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    const cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backend");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "precision");
    const cJSON *nat = cJSON_GetObjectItemCaseSensitive(j, "bf16_native");
    const double step = cJSON_IsNumber(st) ? st->valuedouble : -1;
    if (step >= (double)lo && step <= (double)hi) {
      int ok = cJSON_IsString(be) && !strcmp(be->valuestring, "cpu") && cJSON_IsString(pr) &&
               !strcmp(pr->valuestring, precision) && cJSON_IsBool(nat) && !!cJSON_IsTrue(nat) == !!native;
      if (ok) checked++;
      else {
        test_fail(__FILE__, __LINE__, "%s: a line does not say backend cpu, precision %s, bf16_native %s: %s", path,
                  precision, native ? "true" : "false", line);
        checked = -1;
      }
    } else if (!cJSON_IsNumber(st)) {
      test_fail(__FILE__, __LINE__, "%s: a line without a step: %s", path, line);
      checked = -1;
    }
    cJSON_Delete(j);
  }
  free(text);
  return checked;
}

/* The dense parameters of two runs' checkpoints differ (in how many
 * floats, returned; -1 if a run does not load or their sizes differ). */
static long dense_params_differ(const char *run_a, const char *run_b) {
  dlrec_model *a = NULL, *b = NULL;
  long differ = -1;
  if (dlrec_model_load(test_path(run_a), &a) == DLREC_OK && dlrec_model_load(test_path(run_b), &b) == DLREC_OK) {
    size_t na, nb;
    const float *pa = dlrec_net_dense_params(a->net, &na), *pb = dlrec_net_dense_params(b->net, &nb);
    if (na == nb) {
      differ = 0;
      for (size_t i = 0; i < na; i++) differ += memcmp(&pa[i], &pb[i], sizeof(float)) != 0;
    }
  }
  if (differ < 0) fprintf(stderr, "loading %s and %s: %s\n", run_a, run_b, dlrec_last_error());
  dlrec_model_free(a);
  dlrec_model_free(b);
  return differ;
}

/* Learning (issue 10): the same small DLRM on the same data and seed,
 * trained by the trainer with training.precision "fp32" and "bf16" (native
 * on AMX or AVX512-BF16, emulated elsewhere): both learn (validation AUC
 * above BF16_LEARN_FLOOR, chance being 0.5), the bf16 run reaches the fp32
 * run's AUC within 0.003, each run's metrics.jsonl says which precision ran
 * (and whether natively, as a bf16 backend on this CPU says), and the two
 * runs' parameters differ, so bf16 really ran. The data and model are
 * table_16bit_learns_as_well_as_fp32's. Measured here (emulated, 2 cores):
 * fp32 0.6746, bf16 0.6745, in about 2 s for both. fp16 (emulated, with
 * its default dynamic loss scaling) likewise. */
#define BF16_LEARN_FLOOR 0.62
TEST(bf16_precision_training_reaches_fp32_auc) {
  CHECK(make_data(60000, 20000) == 0);
  const int native = bf16_native_here();
  CHECK(native >= 0);
  const char *adagrad = "{\"type\": \"rowwise_adagrad\", \"lr\": 0.05}";
  const char *precisions[] = {"fp32", "bf16", "fp16"};
  double auc[3] = {0};
  for (int i = 0; i < 3 && !test_failed_now(); i++) {
    char run[32];
    snprintf(run, sizeof run, "prec-%s", precisions[i]);
    auc[i] = train_valid_auc(write_config("fp32", precisions[i], adagrad), run);
    /* Every line, the final one with the validation included. */
    CHECK(lines_say_precision(run, 0, UINT64_MAX, precisions[i], i == 1 && native) >= 2);
  }
  if (test_failed_now()) return;
  const long differ = dense_params_differ("prec-fp32", "prec-bf16"),
             differ16 = dense_params_differ("prec-fp32", "prec-fp16");
  fprintf(stderr, "validation AUC: fp32 %.4f, bf16 %.4f (%s), fp16 %.4f; %ld and %ld dense parameters differ\n",
          auc[0], auc[1], native ? "native" : "emulated", auc[2], differ, differ16);
  for (int i = 0; i < 3; i++) CHECK(auc[i] > BF16_LEARN_FLOOR);
  CHECK(auc[1] >= auc[0] - 0.003);
  CHECK(auc[2] >= auc[0] - 0.003);
  CHECK(differ > 0 && differ16 > 0);
}

/* fp16 with dynamic loss scaling growing every 5 steps (so that it grows
 * to where fp16 overflows, and backs off, within the run): stopped at step
 * 43 (not a multiple of 5: the clean-step count is mid-interval there) and
 * resumed, the run ends bitwise where the uninterrupted one does, its scale,
 * clean steps and skipped steps included (the checkpoint keeps them), and
 * metrics.jsonl says the scale. */
TEST(fp16_loss_scaled_run_resumes_bitwise) {
  CHECK(make_data(12000, 2000) == 0);
  char text[1024], cfg[2048];
  snprintf(text, sizeof text,
           "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
           " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": {\"type\": \"sgd\", \"lr\": 0.05}},"
           " \"training\": {\"batch_size\": 128, \"threads\": 2, \"seed\": 5, \"deterministic\": true,"
           " \"precision\": \"fp16\", \"loss_scale_growth_interval\": 5},"
           " \"checkpoint\": {\"interval_steps\": 50, \"keep\": 3}, \"log\": {\"interval_steps\": 10}}");
  snprintf(cfg, sizeof cfg, "%s", test_path("cfg-fp16-scaled.json"));
  CHECK(test_write_file(cfg, text, (size_t)-1) == 0);
  CHECK(train_cli(cfg, "run16", "") == 0);
  CHECK(train_cli(cfg, "resumed16", "--max-steps 43") == 0);
  CHECK(train_cli(cfg, "resumed16", "--resume") == 0);
  dlrec_model *a = NULL, *b = NULL;
  CHECK_OK(dlrec_model_load(test_path("run16"), &a));
  CHECK_OK(dlrec_model_load(test_path("resumed16"), &b));
  if (test_failed_now()) goto out;
  CHECK_EQ_U64(a->progress.step, b->progress.step);
  check_same_state(a->dir, b->dir);
  fprintf(stderr, "fp16, growth every 5 steps: %llu steps, scale %g at the end, %llu skipped\n",
          (unsigned long long)a->progress.step, (double)a->progress.loss_scale,
          (unsigned long long)a->progress.skipped_steps);
  CHECK(a->progress.loss_scale > 0 && a->progress.loss_scale == b->progress.loss_scale);
  CHECK_EQ_U64(a->progress.skipped_steps, b->progress.skipped_steps);
  CHECK_EQ(a->progress.loss_scale_good_steps, b->progress.loss_scale_good_steps);
  CHECK(a->progress.skipped_steps > 0); /* it grew into fp16's overflow and backed off */
  char path[2048], *log = NULL;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path("run16"));
  CHECK_OK(dlrec_read_file(path, 1u << 24, &log, &n));
  CHECK(log && strstr(log, "\"loss_scale\":") && strstr(log, "\"skipped_steps\":"));
  free(log);
out:
  dlrec_model_free(a);
  dlrec_model_free(b);
}

/* Whether a trainer's output (its info log) says the bf16 GEMMs ran
 * emulated exactly when a bf16 backend on this CPU is not native; reports
 * the output otherwise. */
static int log_says_how_bf16_ran(const char *out, int native) {
  const int says_bf16 = out && strstr(out, "compute backend cpu: 2 threads, bf16 GEMMs (") != NULL;
  const int says_emulated = out && strstr(out, "bf16 GEMMs (emulated: this CPU has no AVX512-BF16 or AMX)") != NULL;
  if (says_bf16 && says_emulated == !native) return 1;
  fprintf(stderr, "the log does not say bf16 GEMMs ran %s:\n%s\n", native ? "natively" : "emulated", out ? out : "");
  return 0;
}

/* A run with a bf16 table and bf16 GEMMs (issue 10: "a bf16-table model
 * saves, resumes and serves; loading on a CPU without bf16 instructions
 * still works (emulated, slower), and says so"):
 *   - stopped at step 40 and resumed, it ends bitwise where the
 *     uninterrupted run does (dense, table and optimizer files), and both
 *     the run and the resume log how the bf16 GEMMs ran (emulated exactly
 *     when a bf16 backend here is not native);
 *   - its checkpoint scores through `dlrec predict` and `dlrec serve`,
 *     bitwise alike (scoring is fp32 whatever the training precision);
 *   - docs/config.md lets a resume change training.precision: resumed at
 *     step 50 with "fp32", the run goes on, metrics.jsonl says bf16 up to
 *     step 50 and fp32 after, and its parameters leave the bf16 run's. */
TEST(bf16_precision_checkpoint_resumes_serves_and_says_emulated) {
  CHECK(make_data(12000, 2000) == 0);
  const int native = bf16_native_here();
  CHECK(native >= 0);
  const char *sgd = "{\"type\": \"sgd\", \"lr\": 0.05}";
  const char *bf16 = write_config("bf16", "bf16", sgd), *fp32 = write_config("bf16", "fp32", sgd);
  CHECK(bf16 && fp32);
  /* ~75 steps; "run" is where check_served_equals_predict looks. Without
   * -q, so that the info log comes out; with --valid, so that metrics.jsonl
   * ends with a line of the final step (the log's interval is 50). */
  char *out = NULL;
  char valid_arg[2100];
  snprintf(valid_arg, sizeof valid_arg, "--valid '%s'", test_path("valid.dlr"));
  int rc = test_run_cli(&out, "train --config '%s' --train '%s' --etl '%s' --out '%s' %s", bf16,
                        test_path("train.dlr"), test_path("etl"), test_path("run"), valid_arg);
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  int logged = rc == 0 && log_says_how_bf16_ran(out, native);
  free(out);
  CHECK_EQ(rc, 0);
  CHECK(logged);
  CHECK(train_cli(bf16, "resumed", "--max-steps 40") == 0);
  rc = test_run_cli(&out, "train --config '%s' --train '%s' --etl '%s' --out '%s' --resume %s", bf16,
                    test_path("train.dlr"), test_path("etl"), test_path("resumed"), valid_arg);
  if (rc) fprintf(stderr, "%s\n", out ? out : "");
  logged = rc == 0 && log_says_how_bf16_ran(out, native) && strstr(out, "resum") != NULL;
  free(out);
  CHECK_EQ(rc, 0);
  CHECK(logged);
  dlrec_model *a = NULL, *b = NULL;
  CHECK_OK(dlrec_model_load(test_path("run"), &a));
  CHECK_OK(dlrec_model_load(test_path("resumed"), &b));
  if (test_failed_now()) goto out;
  CHECK_EQ(dlrec_table_get_dtype(dlrec_net_table(a->net)), DLREC_TABLE_BF16);
  CHECK_EQ(a->config.precision, DLREC_PRECISION_BF16);
  CHECK_EQ_U64(a->progress.step, b->progress.step);
  CHECK(a->progress.step > 50);
  check_same_state(a->dir, b->dir);
  CHECK(lines_say_precision("run", 0, UINT64_MAX, "bf16", native) >= 2);
  CHECK(lines_say_precision("resumed", 0, UINT64_MAX, "bf16", native) >= 2);
  if (test_failed_now()) goto out;
  /* It scores: through predict and serve alike, and better than chance. */
  check_served_equals_predict(test_tmpdir(), "dlrm");
  if (test_failed_now()) goto out;
  const char *valid[] = {test_path("valid.dlr")};
  dlrec_metrics m;
  CHECK_OK(dlrec_evaluate(a->net, valid, 1, 256, 0, &m));
  CHECK(m.auc > 0.55);
  /* Another precision on resume: allowed, and metrics.jsonl says which ran when. */
  CHECK(train_cli(bf16, "mixed", "--max-steps 50") == 0);
  char resume_valid[2200];
  snprintf(resume_valid, sizeof resume_valid, "--resume %s", valid_arg);
  CHECK(train_cli(fp32, "mixed", resume_valid) == 0);
  CHECK_EQ(lines_say_precision("mixed", 0, 50, "bf16", native), 1);
  CHECK_EQ(lines_say_precision("mixed", 51, UINT64_MAX, "fp32", 0), 1);
  CHECK(dense_params_differ("run", "mixed") > 0);
out:
  dlrec_model_free(a);
  dlrec_model_free(b);
}

/* Arrays in a shared file mapping (a tiered table's view) pass through
 * tensor files with their pages dropped as they go, and nothing is lost:
 * the written file holds them, and what is read lands in the file. */
TEST(tensor_file_drops_pages_of_mapped_arrays_without_losing_them) {
  enum { N = 3 << 20 }; /* floats: 12 MiB, more than one chunk */
  const char *back = test_path("mapped.bin");
  int fd = open(back, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  CHECK(ftruncate(fd, (off_t)N * 4) == 0);
  float *m = mmap(NULL, (size_t)N * 4, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(m != MAP_FAILED);
  for (size_t i = 0; i < N; i++) m[i] = (float)i * 0.5f;
  uint32_t crc_w, crc_r;
  tensor_desc d = tensor_array("table", TENSOR_F32, N, m, 1);
  CHECK_OK(tensor_file_write(test_path("t.bin"), &d, 1, &crc_w));
  for (size_t i = 0; i < N; i += 4099) CHECK(m[i] == (float)i * 0.5f);
  memset(m, 0, (size_t)N * 4);
  CHECK_OK(tensor_file_read(test_path("t.bin"), &d, 1, &crc_r));
  CHECK_EQ(crc_w, crc_r);
  CHECK(munmap(m, (size_t)N * 4) == 0);
  float *again = mmap(NULL, (size_t)N * 4, PROT_READ, MAP_SHARED, fd, 0);
  CHECK(again != MAP_FAILED);
  for (size_t i = 0; i < N; i += 4099) CHECK(again[i] == (float)i * 0.5f);
  munmap(again, (size_t)N * 4);
  close(fd);
}

/* A streamed array (tensor_desc.stream) makes the very file a plain one
 * does, asked for chunk by chunk in order, once;
 * a streamed read hands over the same bytes in order, and a damaged file is
 * still refused. */
typedef struct stream_log {
  const char *src; /* write: the bytes to hand out */
  char *dst;       /* read: where the handed bytes go */
  uint64_t calls, next, bad;
} stream_log;

static dlrec_status stream_cb(void *ctx, uint64_t at, void *buf, size_t k) {
  stream_log *x = ctx;
  if (at != x->next) x->bad++;
  x->next = at + k;
  x->calls++;
  if (x->src) memcpy(buf, x->src + at, k);
  else memcpy(x->dst + at, buf, k);
  return DLREC_OK;
}

TEST(tensor_file_streams_arrays_in_chunks) {
  enum { N = 5 << 20 }; /* floats: 20 MiB, three chunks */
  float *a = malloc((size_t)N * 4), *back = calloc(N, 4);
  CHECK(a && back);
  for (size_t i = 0; i < N; i++) a[i] = (float)(i % 1000003) * 0.25f;
  uint32_t head[3] = {7, 8, 9}, crc_plain, crc_streamed, crc_read;
  tensor_desc plain[2] = {tensor_array("head", TENSOR_U32, 3, head, 0), tensor_array("a", TENSOR_F32, N, a, 0)};
  CHECK_OK(tensor_file_write(test_path("plain.bin"), plain, 2, &crc_plain));
  stream_log w = {.src = (const char *)a};
  tensor_desc streamed[2] = {plain[0], tensor_array("a", TENSOR_F32, N, NULL, 0)};
  streamed[1].stream = stream_cb;
  streamed[1].stream_ctx = &w;
  CHECK_OK(tensor_file_write(test_path("streamed.bin"), streamed, 2, &crc_streamed));
  CHECK_EQ_U64(w.calls, 3);
  CHECK_EQ_U64(w.bad, 0);
  CHECK_EQ(crc_plain, crc_streamed);
  CHECK(same_file(test_path("plain.bin"), test_path("streamed.bin")));
  stream_log r = {.dst = (char *)back};
  streamed[1].stream_ctx = &r;
  uint32_t head_back[3] = {0};
  streamed[0].data = head_back;
  CHECK_OK(tensor_file_read(test_path("streamed.bin"), streamed, 2, &crc_read));
  CHECK_EQ(crc_read, crc_plain);
  CHECK_EQ_U64(r.calls, 3);
  CHECK_EQ_U64(r.bad, 0);
  CHECK(memcmp(back, a, (size_t)N * 4) == 0 && head_back[2] == 9);
  CHECK(flip_byte(test_path("streamed.bin"), 4096 + 17 * 1000));
  CHECK_ERR(tensor_file_read(test_path("streamed.bin"), streamed, 2, &crc_read), DLREC_ERR_CORRUPT, "checksum mismatch");
  free(a);
  free(back);
}

/* A row source standing for the ranks' shards: the rows of a whole table
 * and its optimizer state (a network of one process), handed out or taken
 * back row by row. */
typedef struct rows_of_net {
  dlrec_net *net;
  dlrec_sparse_optim_state st;
  uint64_t gets, puts;
} rows_of_net;

static char *row_of(rows_of_net *x, dlrec_row_array a, uint64_t r, size_t *bytes) {
  dlrec_table *t = dlrec_net_table(x->net);
  const size_t stride = dlrec_table_stride(t);
  switch (a) {
  case DLREC_ROWS_TABLE:
    *bytes = stride * dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
    return (char *)dlrec_table_raw(t) + r * *bytes;
  case DLREC_ROWS_ACCUM: *bytes = 4; return (char *)(x->st.accum + r);
  case DLREC_ROWS_M: *bytes = 4 * stride; return (char *)(x->st.m + r * stride);
  case DLREC_ROWS_V: *bytes = 4 * stride; return (char *)(x->st.v + r * stride);
  case DLREC_ROWS_STEPS: *bytes = 4; return (char *)(x->st.steps + r);
  }
  return NULL;
}

static dlrec_status get_rows(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, void *out) {
  rows_of_net *x = ctx;
  size_t b = 0;
  row_of(x, a, first, &b);
  for (uint64_t i = 0; i < n; i++) memcpy((char *)out + i * b, row_of(x, a, first + i, &b), b);
  x->gets++;
  return DLREC_OK;
}

static dlrec_status put_rows(void *ctx, dlrec_row_array a, uint64_t first, uint64_t n, const void *in) {
  rows_of_net *x = ctx;
  size_t b = 0;
  row_of(x, a, first, &b);
  for (uint64_t i = 0; i < n; i++) memcpy(row_of(x, a, first + i, &b), (const char *)in + i * b, b);
  x->puts++;
  return DLREC_OK;
}

/* A checkpoint written through a row source (a tableless network, rows from
 * elsewhere: ranks' shards) is byte for byte the one written from the
 * network's own table, and a resume through a row source hands back every
 * row and optimizer value: lazy Adam (m, v, steps) on a bf16 table (its
 * update count too). */
TEST(checkpoint_rows_through_a_row_source_are_the_tables) {
  CHECK(make_data(12000, 3000) == 0);
  const char *cfg_path = write_config("bf16", NULL, "{\"type\": \"lazy_adam\", \"lr\": 0.01}");
  CHECK(cfg_path && train_cli(cfg_path, "run", "--max-steps 30") == 0);
  dlrec_train_config cfg;
  CHECK_OK(dlrec_train_config_read(cfg_path, &cfg));
  dlrec_etl *etl;
  CHECK_OK(dlrec_etl_load(&etl, test_path("etl")));
  const dlrec_schema schema = *dlrec_etl_schema(etl);
  dlrec_etl_free(etl);
  /* The trained state in a whole network (one process's). */
  dlrec_net *whole, *tl;
  CHECK_OK(dlrec_net_create(&whole, &cfg.model, &schema));
  CHECK_OK(dlrec_net_create_tableless(&tl, &cfg.model, &schema));
  size_t n_params;
  dlrec_net_dense_params(whole, &n_params);
  dlrec_net_optim opt = {.dense = cfg.dense, .sparse_lr = cfg.sparse.lr};
  opt.dense_state = malloc(dlrec_optim_state_floats(&cfg.dense, n_params) * sizeof(float) + 4);
  CHECK_OK(dlrec_store_optim_create(dlrec_net_store(whole), &cfg.sparse, &opt.sparse));
  dlrec_train_progress prog;
  CHECK_OK(dlrec_checkpoint_load_training(test_path("run"), &cfg, test_path("etl"), whole, &opt, &prog, NULL));
  /* Written from the network, and through a row source. */
  rows_of_net x = {.net = whole};
  dlrec_sparse_optim_state_view(opt.sparse, &x.st);
  CHECK(x.st.m && x.st.v && x.st.steps && x.st.updates);
  const dlrec_row_source src = {.rows = schema.table_rows, .get = get_rows, .put = put_rows, .ctx = &x,
                                .updates = x.st.updates};
  size_t nt;
  memcpy(dlrec_net_dense_params(tl, &nt), dlrec_net_dense_params(whole, &n_params), n_params * sizeof(float));
  CHECK_OK(dlrec_checkpoint_save(test_path("a"), &cfg, test_path("etl"), whole, &opt, &prog, 1, NULL));
  CHECK_OK(dlrec_checkpoint_save_rows(test_path("b"), &cfg, test_path("etl"), tl, &opt, &prog, 1, NULL, &src));
  CHECK(x.gets >= 4); /* table, m, v, steps */
  char a_dir[1024], b_dir[1024];
  snprintf(a_dir, sizeof a_dir, "%s/ckpt-%012llu", test_path("a"), (unsigned long long)prog.step);
  snprintf(b_dir, sizeof b_dir, "%s/ckpt-%012llu", test_path("b"), (unsigned long long)prog.step);
  check_same_state(a_dir, b_dir);
  /* Read back through the row source into a cleared network. */
  const uint64_t updates = *x.st.updates;
  memset(dlrec_table_raw(dlrec_net_table(whole)), 0,
         schema.table_rows * dlrec_table_stride(dlrec_net_table(whole)) * 2);
  memset(x.st.m, 0, schema.table_rows * x.st.stride * 4);
  memset(x.st.v, 0, schema.table_rows * x.st.stride * 4);
  memset(x.st.steps, 0, schema.table_rows * 4);
  *x.st.updates = 0;
  CHECK_OK(dlrec_checkpoint_load_training_rows(test_path("b"), &cfg, test_path("etl"), tl, &opt, &prog, NULL, &src));
  CHECK(x.puts >= 4);
  CHECK_EQ_U64(*x.st.updates, updates);
  CHECK_OK(dlrec_checkpoint_save(test_path("c"), &cfg, test_path("etl"), whole, &opt, &prog, 1, NULL));
  snprintf(b_dir, sizeof b_dir, "%s/ckpt-%012llu", test_path("c"), (unsigned long long)prog.step);
  check_same_state(a_dir, b_dir);
  dlrec_sparse_optim_free(opt.sparse);
  free(opt.dense_state);
  dlrec_net_free(whole);
  dlrec_net_free(tl);
}
