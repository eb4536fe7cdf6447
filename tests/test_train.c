/* Training runs through the CLI: resume gives bitwise the same parameters as
 * an uninterrupted run, a run killed with SIGKILL resumes and completes, a
 * corrupt or mismatched checkpoint is refused, predict and eval agree. */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "core/crc32c.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "data/dlr_format.h"
#include "train/trainer.h"
#include "embed/store.h"
#include "net_check.h"
#include "serve_check.h"
#include "test.h"
#include "train/step.h"
#include "train/tensor_file.h"

/* Synthesizes rows, fits the ETL and encodes train/valid files in tmpdir. */
static int make_data(int rows) {
  char *out = NULL;
  int rc = test_run_cli(&out, "synth -q --rows %d --seed 3 --max-cardinality 2000 --out '%s' && '%s' etl fit -q --input '%s' "
                        "--out '%s' --min-count 2 && '%s' etl apply -q --etl '%s' --input '%s' --out '%s' "
                        "--valid-fraction 0.2 --valid-out '%s' --seed 1",
                        rows, test_path("clicks.tsv"), getenv("DLREC_BIN"), test_path("clicks.tsv"), test_path("etl"),
                        getenv("DLREC_BIN"), test_path("etl"), test_path("clicks.tsv"), test_path("train.dlr"),
                        test_path("valid.dlr"));
  if (rc != 0) fprintf(stderr, "data setup failed (%d): %s\n", rc, out ? out : "");
  free(out);
  return rc;
}

static const char *CONFIG =
    "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
    " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05}},"
    " \"training\": {\"batch_size\": 128, \"epochs\": 2, \"threads\": 2, \"seed\": 5, \"deterministic\": true},"
    " \"loader\": {\"window_groups\": 2, \"slice_rows\": 8},"
    " \"checkpoint\": {\"interval_steps\": 10, \"keep\": 3}, \"log\": {\"interval_steps\": 10}}";

/* out = in with its first `from` replaced by `to`: 0, or -1 when in has no
 * `from` or out is too small. */
static int replace_first(char *out, size_t size, const char *in, const char *from, const char *to) {
  const char *at = strstr(in, from);
  if (!at) return -1;
  const int n = snprintf(out, size, "%.*s%s%s", (int)(at - in), in, to, at + strlen(from));
  return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int files_equal(const char *a, const char *b) {
  char *x, *y;
  size_t nx, ny;
  if (dlrec_read_file(a, 1u << 30, &x, &nx) != DLREC_OK) return 0;
  if (dlrec_read_file(b, 1u << 30, &y, &ny) != DLREC_OK) {
    free(x);
    return 0;
  }
  int eq = nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return eq;
}

/* metrics.jsonl without its one timing field, samples_per_s, whose value no
 * two runs share; everything else must be the same bytes. */
static char *metrics_sans_timing(const char *run) {
  char path[2048], *text;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(run));
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) return NULL;
  const char *key = ",\"samples_per_s\":";
  for (char *p; (p = strstr(text, key));) {
    char *end = p + strlen(key);
    end += strspn(end, "0123456789.eE+-");
    memmove(p, end, strlen(end) + 1);
  }
  return text;
}

/* metrics_sans_timing without the fields that name the backend. */
static char *metrics_sans_backend(const char *run) {
  char *text = metrics_sans_timing(run);
  static const char *keys[] = {",\"backend\":", ",\"precision\":", ",\"bf16_native\":"};
  for (int k = 0; text && k < 3; k++)
    for (char *p; (p = strstr(text, keys[k]));) {
      char *end = p + strlen(keys[k]);
      if (*end == '"') end = strchr(end + 1, '"') + 1;
      else end += strspn(end, "truefals");
      memmove(p, end, strlen(end) + 1);
    }
  return text;
}

/* The normalized metrics.jsonl of two runs are equal and not empty. */
static int same_metrics(const char *run_a, const char *run_b) {
  char *a = metrics_sans_timing(run_a), *b = metrics_sans_timing(run_b);
  int eq = a && b && a[0] && !strcmp(a, b);
  if (!eq) fprintf(stderr, "metrics.jsonl of %s:\n%s\nof %s:\n%s\n", run_a, a ? a : "(none)", run_b, b ? b : "(none)");
  free(a);
  free(b);
  return eq;
}

/* Writes cfg to test_path(cfg_name), trains `run` on cpu-mirror (one
 * thread) for 6 steps (its output into *log, when log is not NULL),
 * resumes it to step 12, and scores valid.dlr with it on the CPU into
 * *scores: 0, or -1 when a command failed. */
static int mirror_two_parts(const char *cfg, const char *cfg_name, const char *run, char **log, char **scores) {
  if (test_write_file(test_path(cfg_name), cfg, (size_t)-1) != 0) return -1;
  const char *fmt = "train %s --device cpu-mirror --threads 1 %s --max-steps %d --config '%s' --train '%s' --etl '%s' "
                    "--out '%s'";
  if (test_run_cli(log, fmt, log ? "" : "-q", "", 6, test_path(cfg_name), test_path("train.dlr"), test_path("etl"),
                   test_path(run)) != 0 ||
      test_run_cli(NULL, fmt, "-q", "--resume", 12, test_path(cfg_name), test_path("train.dlr"), test_path("etl"),
                   test_path(run)) != 0)
    return -1;
  return test_run_cli(scores, "predict -q --model '%s' --input '%s' --out -", test_path(run), test_path("valid.dlr"))
             ? -1
             : 0;
}

static int train(const char *run, const char *extra) {
  char *out = NULL;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' %s", test_path("cfg.json"),
                        test_path("train.dlr"), test_path("etl"), test_path(run), extra);
  if (rc != 0) fprintf(stderr, "train %s %s -> %d: %s\n", run, extra, rc, out ? out : "");
  free(out);
  return rc;
}

/* train() on another data file and ETL state (names in the test directory). */
static int train_files(const char *run, const char *data, const char *etl, const char *extra) {
  char *out = NULL;
  char d[2048];
  snprintf(d, sizeof d, "%s", test_path(data));
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' %s", test_path("cfg.json"), d,
                        test_path(etl), test_path(run), extra);
  if (rc != 0) fprintf(stderr, "train %s %s -> %d: %s\n", run, extra, rc, out ? out : "");
  free(out);
  return rc;
}

/* dense.bin, table.bin and optim.bin of RUN_A/ckpt-STEP and RUN_B/ckpt-STEP
 * are the same bytes (the first that differs is named on stderr). */
static int same_checkpoint(const char *run_a, const char *run_b, uint64_t step) {
  const char *files[] = {"dense.bin", "table.bin", "optim.bin"};
  for (int i = 0; i < 3; i++) {
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/ckpt-%012llu/%s", test_path(run_a), (unsigned long long)step, files[i]);
    snprintf(b, sizeof b, "%s/ckpt-%012llu/%s", test_path(run_b), (unsigned long long)step, files[i]);
    if (!files_equal(a, b)) {
      fprintf(stderr, "%s differs between %s and %s\n", files[i], run_a, run_b);
      return 0;
    }
  }
  return 1;
}

TEST(resume_is_bitwise_identical) {
  CHECK(make_data(20000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  /* 2 epochs of ~125 steps: stop in the middle of the second epoch. */
  CHECK(train("straight", "--max-steps 180") == 0);
  CHECK(train("resumed", "--max-steps 95") == 0);
  CHECK(train("resumed", "--max-steps 180 --resume") == 0);
  CHECK(same_checkpoint("straight", "resumed", 180));
  /* The log of the resumed run has each step once. */
  char *log;
  size_t n;
  CHECK_OK(dlrec_read_file(test_path("resumed/metrics.jsonl"), 1u << 20, &log, &n));
  int steps90 = 0;
  for (char *p = log; (p = strstr(p, "\"step\":90,")); p++) steps90++;
  free(log);
  CHECK_EQ(steps90, 1);
  /* Step 95 is not a log step: the line at step 100 averages steps 91..100
   * in both runs, from the loss sums the checkpoint carried. */
  CHECK(same_metrics("straight", "resumed"));
  /* Step 90 is a log step (and a checkpoint's): its own line is kept. */
  CHECK(train("resumed90", "--max-steps 90") == 0);
  CHECK(train("resumed90", "--max-steps 180 --resume") == 0);
  CHECK(same_metrics("straight", "resumed90"));
}

/* Starts `dlrec train` on cfg.json into RUN (with --max-steps MAX_STEPS
 * unless NULL) and kills it with SIGKILL once it has written a checkpoint
 * or two, mid-training. 0 when the run ended and RUN/latest exists. */
static int train_killed(const char *run, const char *max_steps) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execl(getenv("DLREC_BIN"), "dlrec", "train", "-q", "--config", test_path("cfg.json"), "--train",
          test_path("train.dlr"), "--etl", test_path("etl"), "--out", test_path(run),
          max_steps ? "--max-steps" : (char *)NULL, max_steps, (char *)NULL);
    _exit(127);
  }
  char latest[2048];
  snprintf(latest, sizeof latest, "%s/latest", test_path(run));
  struct stat st;
  for (int i = 0; i < 3000 && stat(latest, &st) != 0; i++) usleep(10000);
  usleep(30000);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  return (WIFSIGNALED(status) || WIFEXITED(status)) && stat(latest, &st) == 0 ? 0 : -1;
}

TEST(sigkill_then_resume_completes) {
  CHECK(make_data(20000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train_killed("run", NULL) == 0);
  CHECK(train("run", "--resume") == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "eval --model '%s' --data '%s'", test_path("run"), test_path("valid.dlr"));
  int ok = rc == 0 && out && strstr(out, "\"auc\"");
  if (!ok) fprintf(stderr, "eval -> %d: %s\n", rc, out ? out : "");
  free(out);
  CHECK(ok);
}

/* The MiB a run's log gives for its table, its dense parameters, and its
 * activations and workspaces (the trainer's "memory:" line): 1, or 0 when
 * the log has no such line. */
static int memory_line(const char *log, double *table, double *dense, double *ws) {
  const char *mem = log ? strstr(log, "memory: the table and its optimizer state ") : NULL;
  return mem && sscanf(mem, "memory: the table and its optimizer state %lf MiB, the dense parameters and theirs %lf "
                            "MiB, activations and workspaces about %lf MiB", table, dense, ws) == 3;
}

/* --device: cpu trains, evaluates and predicts as without it; a malformed
 * device is a usage error (2); cuda, where a GPU is visible, trains,
 * evaluates and predicts there as on the CPU, and else fails (1) saying why
 * (no CUDA in the build, no GPU visible) before a run directory is made. */
TEST(device_flag_trains_on_the_cpu_and_a_gpu_or_says_why) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("dev_run", "--device cpu --max-steps 3") == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "eval --device cpu --model '%s' --data '%s'", test_path("dev_run"), test_path("valid.dlr"));
  CHECK(rc == 0 && out && strstr(out, "\"auc\""));
  free(out);
  rc = test_run_cli(&out, "eval --device gpu --model '%s' --data '%s'", test_path("dev_run"), test_path("valid.dlr"));
  CHECK(rc == 2 && out && strstr(out, "--device: device 'gpu' is not one of cpu, cuda, cuda:N"));
  free(out);
  /* cpu-mirror (a test device): the CPU running the network the way a GPU
   * does, its state in the backend's memory, which the host cannot touch
   * between ops. Trained in two parts (the resume copies the checkpoint
   * over, the checkpoints copy it back), the same run as the CPU's on one
   * thread, bit for bit, on either device's scoring. */
  CHECK(train("dev_cpu1", "--device cpu --threads 1 --max-steps 12") == 0);
  CHECK(train("dev_mirror", "--device cpu-mirror --threads 1 --max-steps 6") == 0);
  CHECK(train("dev_mirror", "--device cpu-mirror --threads 1 --resume --max-steps 12") == 0);
  char mlog[2048], head[4096] = "";
  snprintf(mlog, sizeof mlog, "%s/metrics.jsonl", test_path("dev_mirror"));
  FILE *mf = fopen(mlog, "rb");
  if (mf) {
    head[fread(head, 1, sizeof head - 1, mf)] = '\0';
    fclose(mf);
  }
  CHECK(strstr(head, "\"backend\":\"cpu-mirror") != NULL); /* it did run there */
  char *want = NULL, *got = NULL, *got_m = NULL;
  CHECK(test_run_cli(&want, "predict -q --model '%s' --input '%s' --out -", test_path("dev_cpu1"),
                     test_path("valid.dlr")) == 0);
  CHECK(test_run_cli(&got, "predict -q --model '%s' --input '%s' --out -", test_path("dev_mirror"),
                     test_path("valid.dlr")) == 0);
  CHECK(test_run_cli(&got_m, "predict -q --device cpu-mirror --model '%s' --input '%s' --out -",
                     test_path("dev_mirror"), test_path("valid.dlr")) == 0);
  CHECK(want && got && got_m && strlen(want) > 1000 && !strcmp(want, got) && !strcmp(want, got_m));
  /* Steps on a device are queued, and their losses counted a step late;
   * a step that logs, validates or checkpoints is waited for. Logging every
   * 3 steps, validating every 4 and checkpointing every 10, cpu-mirror's
   * metrics.jsonl is the CPU's, the backend's name aside. */
  char queue_cfg[2048], queue_cfg2[2048];
  CHECK(replace_first(queue_cfg, sizeof queue_cfg, CONFIG, "\"log\": {\"interval_steps\": 10}",
                      "\"log\": {\"interval_steps\": 3}, \"eval\": {\"interval_steps\": 4}") == 0);
  CHECK(replace_first(queue_cfg2, sizeof queue_cfg2, queue_cfg, "\"threads\": 2", "\"threads\": 1") == 0);
  CHECK(test_write_file(test_path("cfg_queue.json"), queue_cfg2, (size_t)-1) == 0);
  char *log_c = NULL, *log_m = NULL;
  for (int dev = 0; dev < 2; dev++)
    CHECK(test_run_cli(NULL, "train -q --device %s --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s' "
                       "--max-steps 14", dev ? "cpu-mirror" : "cpu", test_path("cfg_queue.json"),
                       test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"),
                       test_path(dev ? "queue_mirror" : "queue_cpu")) == 0);
  log_c = metrics_sans_backend("queue_cpu");
  log_m = metrics_sans_backend("queue_mirror");
  CHECK(log_c && log_m && strstr(log_c, "\"step\":12,") && strstr(log_c, "\"valid\":"));
  if (log_c && log_m && strcmp(log_c, log_m))
    fprintf(stderr, "metrics.jsonl on the CPU:\n%s\non cpu-mirror:\n%s\n", log_c, log_m);
  CHECK(log_c && log_m && !strcmp(log_c, log_m));
  free(log_c), free(log_m);
  /* The table left in host memory (training.table_placement "host"): its
   * bag ops on the CPU, the rest on cpu-mirror, the pooled rows and their
   * gradient copied across. The same run again, bit for bit, in two parts;
   * the log says where the table is, and --plan what the device then needs. */
  char host_cfg[2048];
  CHECK(replace_first(host_cfg, sizeof host_cfg, CONFIG, "\"training\": {",
                      "\"training\": {\"table_placement\": \"host\", ") == 0);
  char *host_log = NULL, *host_plan = NULL, *got_h = NULL;
  CHECK(mirror_two_parts(host_cfg, "cfg_host.json", "dev_host", &host_log, &got_h) == 0);
  CHECK(host_log && strstr(host_log, "the table stays in host memory (training.table_placement host)"));
  CHECK(want && got_h && !strcmp(want, got_h));
  /* Its hot rows on the device too (training.hot_fraction): a third of each
   * column's, their lookups and updates on cpu-mirror, the rest on the CPU.
   * The columns are one-hot, so a pooled row is one part's: the same run,
   * bit for bit, in two parts, and scored on either device. */
  char hot_cfg[2048];
  CHECK(replace_first(hot_cfg, sizeof hot_cfg, CONFIG, "\"training\": {",
                      "\"training\": {\"table_placement\": \"host\", \"hot_fraction\": 0.3, ") == 0);
  char *hot_log = NULL, *got_hot = NULL, *got_hot_m = NULL;
  CHECK(mirror_two_parts(hot_cfg, "cfg_hot.json", "dev_hot", &hot_log, &got_hot) == 0);
  CHECK(hot_log && strstr(hot_log, " hot rows (training.hot_fraction 0.3 of each column's"));
  CHECK(test_run_cli(&got_hot_m, "predict -q --device cpu-mirror --model '%s' --input '%s' --out -",
                     test_path("dev_hot"), test_path("valid.dlr")) == 0);
  CHECK(want && got_hot && got_hot_m && !strcmp(want, got_hot) && !strcmp(want, got_hot_m));
  if (hot_log && !strstr(hot_log, " hot rows (")) fprintf(stderr, "%s\n", hot_log);
  free(hot_log), free(got_hot), free(got_hot_m);
  /* A bf16 table rounds each updated row stochastically, keyed by the
   * update count and the row: a hot row keyed as the host table's row, and
   * the two parts' counts kept as one table's, so the same bits as the CPU's
   * again, resumed in two parts. */
  char hot16_cfg[2048], cpu16_cfg[2048];
  CHECK(replace_first(hot16_cfg, sizeof hot16_cfg, hot_cfg, "\"training\": {",
                      "\"training\": {\"table_dtype\": \"bf16\", ") == 0);
  CHECK(replace_first(cpu16_cfg, sizeof cpu16_cfg, CONFIG, "\"training\": {",
                      "\"training\": {\"table_dtype\": \"bf16\", ") == 0);
  CHECK(test_write_file(test_path("cfg_cpu16.json"), cpu16_cfg, (size_t)-1) == 0);
  CHECK(test_run_cli(NULL, "train -q --device cpu --threads 1 --max-steps 12 --config '%s' --train '%s' --etl '%s' "
                     "--out '%s'", test_path("cfg_cpu16.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("cpu16")) == 0);
  char *want16 = NULL, *got16 = NULL;
  CHECK(test_run_cli(&want16, "predict -q --model '%s' --input '%s' --out -", test_path("cpu16"),
                     test_path("valid.dlr")) == 0);
  CHECK(mirror_two_parts(hot16_cfg, "cfg_hot16.json", "hot16", NULL, &got16) == 0);
  CHECK(want16 && got16 && strlen(want16) > 1000 && !strcmp(want16, got16) && strcmp(want16, want));
  free(got16);
  got16 = NULL;
  /* Every row hot: the host's part never updates, yet its count (the one
   * checkpointed) moves with the device's, so the resumed run rounds on. */
  char all16_cfg[2048];
  CHECK(replace_first(all16_cfg, sizeof all16_cfg, hot16_cfg, "\"hot_fraction\": 0.3", "\"hot_fraction\": 1") == 0);
  CHECK(mirror_two_parts(all16_cfg, "cfg_all16.json", "all16", NULL, &got16) == 0);
  CHECK(want16 && got16 && !strcmp(want16, got16));
  free(want16), free(got16);
  /* predict on the device places the table as the run did, and says so. */
  char *pred_log = NULL, *got_hm = NULL, scores_path[2048];
  snprintf(scores_path, sizeof scores_path, "%s", test_path("dev_host.scores"));
  CHECK(test_run_cli(&pred_log, "predict --device cpu-mirror --model '%s' --input '%s' --out '%s'",
                     test_path("dev_host"), test_path("valid.dlr"), scores_path) == 0);
  CHECK(pred_log && strstr(pred_log, "the table stays in host memory (training.table_placement host)"));
  size_t n_hm = 0;
  CHECK(dlrec_read_file(scores_path, 1u << 26, &got_hm, &n_hm) == DLREC_OK);
  CHECK(want && got_hm && n_hm == strlen(want) && !memcmp(want, got_hm, n_hm));
  free(pred_log), free(got_hm);
  CHECK(test_run_cli(&host_plan, "train --device cpu-mirror --config '%s' --etl '%s' --plan",
                     test_path("cfg_host.json"), test_path("etl")) == 0);
  CHECK(host_plan && strstr(host_plan, "\n  device: with the table in host memory (training.table_placement host), "
                                       "about "));
  free(host_log), free(host_plan), free(got_h);
  /* training.table_placement "auto" (the default) on a device that cannot
   * hold the table too: cpu-mirror, told it has less memory than that
   * (DLREC_MIRROR_MEMORY_MB), trains with the table on the host and says
   * why, and its run scores as the CPU's; predict decides for itself, the
   * same way, on a device smaller than the table. */
  char wide_cfg[2048], auto_cfg[2048];
  CHECK(replace_first(wide_cfg, sizeof wide_cfg, CONFIG, "\"embedding_dim\": 8, \"bottom_mlp\": [32, 8]",
                      "\"embedding_dim\": 128, \"bottom_mlp\": [32, 128]") == 0);
  CHECK(replace_first(auto_cfg, sizeof auto_cfg, wide_cfg, "\"loader\"", "\"eval\": {\"batch_size\": 128}, \"loader\"") ==
        0);
  CHECK(test_write_file(test_path("cfg_auto.json"), auto_cfg, (size_t)-1) == 0);
  char *probe = NULL, *auto_log = NULL, *auto_pred = NULL, *want_a = NULL, *got_a = NULL, limit[64];
  const char *train_fmt = "train --threads 1 --config '%s' --train '%s' --etl '%s' --out '%s' %s";
  CHECK(test_run_cli(&probe, train_fmt, test_path("cfg_auto.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("auto_probe"), "--device cpu-mirror --max-steps 1") == 0);
  double table_mib = 0, dense_mib = 0, ws_mib = 0;
  CHECK(memory_line(probe, &table_mib, &dense_mib, &ws_mib));
  CHECK(table_mib >= 1.0); /* well above the log's 0.1 MiB rounding */
  CHECK(probe && !strstr(probe, "stays in host memory")); /* the host's whole memory holds it */
  snprintf(limit, sizeof limit, "%.2f", dense_mib + ws_mib + table_mib / 2);
  setenv("DLREC_MIRROR_MEMORY_MB", limit, 1);
  CHECK(test_run_cli(&auto_log, train_fmt, test_path("cfg_auto.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("auto_host"), "--device cpu-mirror --max-steps 12") == 0);
  CHECK(auto_log && strstr(auto_log, "the table stays in host memory (training.table_placement auto: the device "
                                     "cannot hold it too)"));
  /* training.hot_fraction "auto" (the default) keeps on the device what
   * the rest of its memory holds: here none, the rest being smaller than a
   * batch's pooled rows (128 x 26 x 128 floats, which the hot rows need). */
  CHECK(auto_log && !strstr(auto_log, " hot rows ("));
  char *hot_auto_log = NULL;
  const double pool_mib = 128.0 * 26 * 128 * 4 / (1024.0 * 1024.0);
  snprintf(limit, sizeof limit, "%.2f", dense_mib + ws_mib + table_mib * 0.95);
  setenv("DLREC_MIRROR_MEMORY_MB", limit, 1);
  CHECK(test_run_cli(&hot_auto_log, train_fmt, test_path("cfg_auto.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("auto_hot"), "--device cpu-mirror --max-steps 3") == 0);
  /* With room for 95% of the table beside the rest: 90% of that, less the
   * pooled rows' buffer, about a third of this small table. */
  const char *hot_at = hot_auto_log ? strstr(hot_auto_log, " hot rows (training.hot_fraction auto: ") : NULL;
  double hot_share = 0;
  if (hot_at) sscanf(hot_at, " hot rows (training.hot_fraction auto: %lf", &hot_share);
  const double want_share = (0.9 * 0.95 * table_mib - pool_mib) / table_mib;
  if (!(fabs(hot_share - want_share) < 0.05)) fprintf(stderr, "%s\n", hot_auto_log ? hot_auto_log : "");
  free(hot_auto_log);
  unsetenv("DLREC_MIRROR_MEMORY_MB");
  CHECK(want_share > 0.1 && fabs(hot_share - want_share) < 0.05);
  /* The same run on the CPU, on one thread: the same bits. */
  CHECK(test_run_cli(NULL, train_fmt, test_path("cfg_auto.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("auto_cpu"), "-q --device cpu --max-steps 12") == 0);
  CHECK(test_run_cli(&want_a, "predict -q --model '%s' --input '%s' --out -", test_path("auto_cpu"),
                     test_path("valid.dlr")) == 0);
  CHECK(test_run_cli(&got_a, "predict -q --model '%s' --input '%s' --out -", test_path("auto_host"),
                     test_path("valid.dlr")) == 0);
  CHECK(want_a && got_a && strlen(want_a) > 1000 && !strcmp(want_a, got_a));
  snprintf(limit, sizeof limit, "%.2f", table_mib / 2);
  setenv("DLREC_MIRROR_MEMORY_MB", limit, 1);
  CHECK(test_run_cli(&auto_pred, "predict --device cpu-mirror --model '%s' --input '%s' --out '%s'",
                     test_path("auto_host"), test_path("valid.dlr"), test_path("auto_host.scores")) == 0);
  unsetenv("DLREC_MIRROR_MEMORY_MB");
  CHECK(auto_pred && strstr(auto_pred, "the table stays in host memory (training.table_placement auto: the device "
                                       "cannot hold it)"));
  CHECK(auto_pred && strstr(auto_pred, " hot rows (training.hot_fraction auto: "));
  char *scored = NULL;
  size_t n_scored = 0;
  CHECK(dlrec_read_file(test_path("auto_host.scores"), 1u << 26, &scored, &n_scored) == DLREC_OK);
  CHECK(want_a && scored && n_scored == strlen(want_a) && !memcmp(want_a, scored, n_scored));
  free(scored);
  free(probe), free(auto_log), free(auto_pred), free(want_a), free(got_a);
  free(want), free(got), free(got_m);
  char *version = NULL;
  CHECK(test_run_cli(&version, "version") == 0 && version && strstr(version, "\n  cpu   "));
  const char *line = version ? strstr(version, "\n  cuda  ") : NULL;
  CHECK(line != NULL);
  if (line && !strncmp(line + 9, "cuda:0 ", 7)) {
    /* A GPU: train, evaluate and predict on it; its scores are the CPU's
     * to 1e-5 (the interaction and the GEMMs sum in other orders; the
     * bags and the packed layers round alike), and the run resumes on the
     * CPU. */
    CHECK(train("dev_gpu_run", "--device cuda --max-steps 30") == 0);
    rc = test_run_cli(&out, "eval --device cuda --model '%s' --data '%s'", test_path("dev_gpu_run"),
                      test_path("valid.dlr"));
    CHECK(rc == 0 && out && strstr(out, "\"auc\""));
    free(out);
    char *gpu = NULL, *cpu = NULL;
    CHECK(test_run_cli(&gpu, "predict -q --device cuda --model '%s' --input '%s' --out -", test_path("dev_gpu_run"),
                       test_path("valid.dlr")) == 0);
    CHECK(test_run_cli(&cpu, "predict -q --device cpu --model '%s' --input '%s' --out -", test_path("dev_gpu_run"),
                       test_path("valid.dlr")) == 0);
    int rows = 0, near = gpu && cpu;
    for (char *g = gpu, *c = cpu; near && *g && *c; rows++) {
      char *ge, *ce;
      const double a = strtod(g, &ge), b = strtod(c, &ce);
      if (ge == g || ce == c) break;
      near = fabs(a - b) <= 1e-5;
      g = ge, c = ce;
    }
    if (!near) fprintf(stderr, "GPU and CPU scores apart at row %d\n", rows);
    CHECK(near && rows > 100);
    free(gpu), free(cpu);
    CHECK(train("dev_gpu_run", "--device cpu --resume --max-steps 40") == 0);
  } else if (line) {
    /* No GPU here, or no CUDA in this build: every command says why. */
    const char *why = strstr(line, "built without the CUDA toolkit") ? "built without the CUDA toolkit"
                                                                       : "no CUDA device visible";
    CHECK(strstr(line, why) != NULL);
    rc = test_run_cli(&out, "predict --device cuda:0 --model '%s' --input '%s' --out '%s'", test_path("dev_run"),
                      test_path("valid.dlr"), test_path("dev_scores"));
    CHECK(rc == 1 && out && strstr(out, why));
    free(out);
    rc = test_run_cli(&out, "train -q --device cuda --config '%s' --train '%s' --etl '%s' --out '%s'",
                      test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("dev_gpu_run"));
    CHECK(rc == 1 && out && strstr(out, "training.device cuda:0") && strstr(out, why));
    free(out);
    struct stat st;
    CHECK(stat(test_path("dev_gpu_run"), &st) != 0);
  }
  free(version);
}

/* The MiB of `--plan`'s activations and workspaces with these options; -1
 * when the plan fails or does not say. */
static double plan_ws_mib(const char *options) {
  char *out = NULL;
  int rc = test_run_cli(&out, "train --config '%s' --etl '%s' --plan %s", test_path("cfg.json"), test_path("etl"),
                        options);
  const char *at = out ? strstr(out, "activations and workspaces (about ") : NULL;
  double mib = -1;
  if (rc == 0 && at && strstr(at, " MiB)")) mib = atof(at + strlen("activations and workspaces (about "));
  if (mib < 0) fprintf(stderr, "train --plan %s -> %d: %s\n", options, rc, out ? out : "");
  free(out);
  return mib;
}

/* --plan counts the model's activations and workspaces in each rank's
 * total: more with a step split over more threads, as one way on a GPU,
 * and less per rank across more ranks. */
TEST(plan_counts_activations_and_workspaces) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  const double one = plan_ws_mib("--threads 1"), two = plan_ws_mib("--threads 2"),
               gpu = plan_ws_mib("--threads 2 --device cuda"), ranks = plan_ws_mib("--threads 1 --ranks 4");
  CHECK(one > 0);
  CHECK(two > one);
  CHECK(gpu == one);
  CHECK(ranks > 0 && ranks < one);
  /* --dry-run is --plan; it ends saying whether the machine has the
   * memory: this small model fits, one with a batch of a million rows
   * through two 4000-wide layers (about 350 GiB) does not. */
  char *plan = NULL, *dry = NULL, *big = NULL;
  CHECK(test_run_cli(&plan, "train --config '%s' --etl '%s' --plan", test_path("cfg.json"), test_path("etl")) == 0);
  CHECK(test_run_cli(&dry, "train --config '%s' --etl '%s' --dry-run", test_path("cfg.json"), test_path("etl")) == 0);
  /* The same plan up to the device line, whose "cpu has X GiB" is the
   * memory available at that moment (checked below). */
  const char *plan_dev = plan ? strstr(plan, "\n  device: ") : NULL;
  const char *dry_dev = dry ? strstr(dry, "\n  device: ") : NULL;
  CHECK(plan_dev && dry_dev && strstr(plan, "activations and workspaces") && plan_dev - plan == dry_dev - dry &&
        !memcmp(plan, dry, (size_t)(plan_dev - plan)) && strstr(dry_dev, ": it fits\n"));
  CHECK(plan && strstr(plan, "\n  device: the largest rank needs about ") && strstr(plan, " MiB; cpu has ") &&
        strstr(plan, ": it fits\n"));
  CHECK(test_write_file(test_path("big.json"),
                        "{\"model\": {\"type\": \"wide_deep\", \"mlp\": [4000, 4000]}, \"training\": {\"batch_size\": "
                        "1048576}}",
                        (size_t)-1) == 0);
  CHECK(test_run_cli(&big, "train --config '%s' --etl '%s' --plan", test_path("big.json"), test_path("etl")) == 0);
  CHECK(big && strstr(big, ": it does NOT fit (storage.kind \"tiered\""));
  /* Trained on a device whose memory is not the host's (cpu-mirror, as a
   * GPU), a run that does not fit is refused up front, saying so. */
  char *refused = NULL;
  CHECK(test_run_cli(&refused, "train -q --device cpu-mirror --config '%s' --train '%s' --etl '%s' --out '%s'",
                     test_path("big.json"), test_path("train.dlr"), test_path("etl"), test_path("big_run")) == 1);
  CHECK(refused && strstr(refused, "memory: the run needs about ") && strstr(refused, "does NOT fit (smaller batches"));
  free(refused);
  free(plan);
  free(dry);
  free(big);
}

/* CONFIG at batch 8192 in `precision`, written to the test file `name`:
 * 0, or -1. */
static int write_precision_config(const char *name, const char *precision) {
  char cfg[2048], with[64];
  snprintf(with, sizeof with, "\"batch_size\": 8192, \"precision\": \"%s\"", precision);
  if (replace_first(cfg, sizeof cfg, CONFIG, "\"batch_size\": 128", with) != 0) return -1;
  return test_write_file(test_path(name), cfg, (size_t)-1);
}

/* The MiB of activations and workspaces a one-step CPU run of CONFIG at
 * batch 8192 in `precision` logs; -1 when it fails or does not say. */
static double run_ws_mib(const char *precision) {
  char *out = NULL;
  if (write_precision_config("cfg_prec.json", precision) != 0) return -1;
  int rc = test_run_cli(&out, "train --device cpu --max-steps 1 --config '%s' --train '%s' --etl '%s' --out '%s'",
                        test_path("cfg_prec.json"), test_path("train.dlr"), test_path("etl"), test_path("prec_run"));
  double table = 0, dense = 0, ws = -1;
  if (rc != 0 || !memory_line(out, &table, &dense, &ws)) {
    fprintf(stderr, "train in %s -> %d: %s\n", precision, rc, out ? out : "");
    ws = -1;
  }
  free(out);
  return ws;
}

/* The memory a run and its --plan say it needs counts the 16-bit copies a
 * step keeps for its backward when its GEMMs are 16-bit, and
 * training.precision "auto" counts them as what the backend resolves it
 * to: bf16 where the CPU has bf16 instructions, fp32 (none kept) where it
 * has not; bf16 on a GPU. */
TEST(run_memory_counts_kept_copies_by_resolved_precision) {
  CHECK(make_data(4000) == 0);
  const double fp32 = run_ws_mib("fp32"), bf16 = run_ws_mib("bf16"), aut = run_ws_mib("auto");
  CHECK(fp32 > 0);
  CHECK(bf16 > fp32 * 1.2); /* half the step's activations again, and more */
  dlrec_backend *be = NULL;
  dlrec_backend_config c = {.threads = 2, .precision = DLREC_PRECISION_AUTO};
  CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
  const dlrec_precision resolved = be ? dlrec_backend_precision(be) : DLREC_PRECISION_AUTO;
  dlrec_backend_free(be);
  CHECK(resolved == DLREC_PRECISION_FP32 || resolved == DLREC_PRECISION_BF16);
  CHECK(dlrec_precision_resolve("cpu", DLREC_PRECISION_AUTO) == resolved);
  CHECK(aut == (resolved == DLREC_PRECISION_BF16 ? bf16 : fp32));
  /* --plan, before any backend, resolves auto the same way. */
  const char *opts[] = {"fp32", "bf16", "auto"};
  double plan[3];
  for (int i = 0; i < 3; i++) {
    CHECK(write_precision_config("cfg.json", opts[i]) == 0); /* what plan_ws_mib reads */
    plan[i] = plan_ws_mib("");
  }
  CHECK(plan[0] > 0 && plan[1] > plan[0] * 1.2);
  CHECK(plan[2] == (resolved == DLREC_PRECISION_BF16 ? plan[1] : plan[0]));
  /* A GPU's auto is bf16, its tf32 its own; the CPU runs tf32 as fp32. */
  CHECK(dlrec_precision_resolve("cuda", DLREC_PRECISION_AUTO) == DLREC_PRECISION_BF16);
  CHECK(dlrec_precision_resolve("cuda", DLREC_PRECISION_TF32) == DLREC_PRECISION_TF32);
  CHECK(dlrec_precision_resolve("cpu", DLREC_PRECISION_TF32) == DLREC_PRECISION_FP32);
  CHECK(dlrec_precision_resolve("cpu", DLREC_PRECISION_FP16) == DLREC_PRECISION_FP16);
}

static void flip_byte(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (!f) return;
  fseek(f, offset, SEEK_SET);
  int c = fgetc(f);
  fseek(f, offset, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
}

TEST(corrupt_or_mismatched_checkpoint_is_refused) {
  CHECK(make_data(8000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 20") == 0);
  char path[2048], *out = NULL;
  /* A flipped byte in the table: eval refuses it. --resume says so and
   * resumes from the newest checkpoint that loads (step 10): its ckpt-20
   * is the first one's again, bit for bit. With no older checkpoint left,
   * the resume is refused. */
  char dense[2048];
  snprintf(path, sizeof path, "%s/ckpt-000000000020/dense.bin", test_path("run"));
  snprintf(dense, sizeof dense, "%s", test_path("dense20.bin"));
  CHECK_OK(dlrec_copy_file(path, dense));
  snprintf(path, sizeof path, "%s/ckpt-000000000020/table.bin", test_path("run"));
  flip_byte(path, 4096);
  int rc = test_run_cli(&out, "eval --model '%s' --data '%s'", test_path("run"), test_path("valid.dlr"));
  CHECK(rc == 1 && out && strstr(out, "checksum mismatch"));
  free(out);
  char resume[8192];
  snprintf(resume, sizeof resume, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 20",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
  rc = test_run_cli(&out, "%s", resume);
  CHECK(rc == 0 && out && strstr(out, "ckpt-000000000020/table.bin") && strstr(out, "checksum mismatch") &&
        strstr(out, "resuming from ") && strstr(out, "ckpt-000000000010, the newest checkpoint that loads"));
  free(out);
  snprintf(path, sizeof path, "%s/ckpt-000000000020/dense.bin", test_path("run"));
  CHECK(files_equal(path, dense));
  snprintf(path, sizeof path, "%s/ckpt-000000000020/table.bin", test_path("run"));
  flip_byte(path, 4096);
  CHECK_OK(dlrec_remove_tree(test_path("run/ckpt-000000000010")));
  rc = test_run_cli(&out, "%s", resume);
  CHECK(rc == 1 && out && strstr(out, "no checkpoint of") && strstr(out, "checksum mismatch"));
  free(out);
  flip_byte(path, 4096); /* repaired */
  /* A torn file: shorter than the manifest says. */
  snprintf(path, sizeof path, "%s/ckpt-000000000020/dense.bin", test_path("run"));
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK(truncate(path, st.st_size - 100) == 0);
  rc = test_run_cli(&out, "eval --model '%s' --data '%s'", test_path("run"), test_path("valid.dlr"));
  CHECK(rc == 1 && out && strstr(out, "dense.bin") && strstr(out, "torn"));
  free(out);
  /* A config that differs from the checkpoint's. */
  CHECK(train("run2", "--max-steps 20") == 0);
  const char *other = "{\"model\": {\"embedding_dim\": 4, \"bottom_mlp\": [32, 4], \"top_mlp\": [32, 1]}}";
  CHECK(test_write_file(test_path("cfg.json"), other, (size_t)-1) == 0);
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume", test_path("cfg.json"),
                    test_path("train.dlr"), test_path("etl"), test_path("run2"));
  CHECK(rc == 1 && out && strstr(out, "differs"));
  free(out);
  /* No checkpoint at all. */
  rc = test_run_cli(&out, "eval --model '%s' --data '%s'", test_path("nothing"), test_path("valid.dlr"));
  CHECK(rc == 1 && out && strstr(out, "nothing"));
  free(out);
}

TEST(predict_matches_eval_and_raw_rows_match_dlr) {
  CHECK(make_data(8000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 30") == 0);
  char *out = NULL;
  /* The same rows scored from raw text (encoded with the checkpoint's ETL
   * state) and from the .dlr file ETL apply wrote must be bitwise equal. */
  CHECK(test_run_cli(&out, "etl apply -q --etl '%s' --input '%s' --out '%s'", test_path("etl"), test_path("clicks.tsv"),
                     test_path("all.dlr")) == 0);
  free(out);
  CHECK(test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s'", test_path("run"), test_path("clicks.tsv"),
                     test_path("raw.scores")) == 0);
  free(out);
  /* Same batch size: sgemm's blocking makes scores depend on it in the last
   * bits (batch-invariant inference is the server's issue). */
  CHECK(test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s'", test_path("run"),
                     test_path("all.dlr"), test_path("dlr.scores")) == 0);
  free(out);
  CHECK(files_equal(test_path("raw.scores"), test_path("dlr.scores")));
  char *scores;
  size_t n;
  CHECK_OK(dlrec_read_file(test_path("raw.scores"), 1u << 26, &scores, &n));
  int lines = 0;
  for (size_t i = 0; i < n; i++) lines += scores[i] == '\n';
  free(scores);
  CHECK_EQ(lines, 8000);
  /* A bad raw row names its line. */
  CHECK(test_write_file(test_path("bad.tsv"), "1\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\tzz\n", (size_t)-1) == 0);
  int rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s'", test_path("run"), test_path("bad.tsv"),
                        test_path("bad.scores"));
  CHECK(rc == 1 && out && strstr(out, "bad.tsv:1"));
  free(out);
  CHECK(access(test_path("bad.scores"), F_OK) != 0); /* nothing written on failure */
}

/* Two processes: a holder of RUN's lock (a child that takes it and waits),
 * and `train` on the same RUN, which must be refused naming the holder's
 * pid. Once the holder dies (SIGKILL: no chance to clean up) the lock is
 * free again. */
TEST(second_writer_of_a_run_is_refused) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK_OK(dlrec_mkdirs(test_path("run")));
  int ready[2];
  CHECK(pipe(ready) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    int fd;
    char c = dlrec_lock_dir(test_path("run"), "a test's holder", &fd) == DLREC_OK ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    for (int i = 0; i < 600; i++) sleep(1); /* at most 10 minutes, were the parent to die */
    _exit(0);
  }
  close(ready[1]);
  char c = 0;
  int got = (int)read(ready[0], &c, 1);
  close(ready[0]);
  if (got != 1 || c != 'y') kill(pid, SIGKILL);
  CHECK(got == 1 && c == 'y');
  char *out = NULL, want[64];
  snprintf(want, sizeof want, "(pid %ld,", (long)pid);
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 5",
                        test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
  int refused = rc == 1 && out && strstr(out, "in use by") && strstr(out, want);
  if (!refused) fprintf(stderr, "train beside a holder -> %d: %s\n", rc, out ? out : "");
  free(out);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  CHECK(refused);
  /* Nothing was written by the refused run. */
  char latest[2048];
  snprintf(latest, sizeof latest, "%s/latest", test_path("run"));
  CHECK(access(latest, F_OK) != 0);
  CHECK(train("run", "--max-steps 5") == 0);
}

/* Rewrites a checkpoint's manifest with one member changed (to `value`),
 * keeping its stored checksum: what a hand edit does. */
static int edit_manifest(const char *ckpt, const char *object, const char *key, double value) {
  char path[2200];
  snprintf(path, sizeof path, "%s/manifest.json", ckpt);
  cJSON *j;
  if (dlrec_json_read(path, &j) != DLREC_OK) return 0;
  cJSON *o = object ? cJSON_GetObjectItemCaseSensitive(j, object) : j;
  cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  int ok = cJSON_IsNumber(v);
  if (ok) cJSON_SetNumberValue(v, value);
  ok = ok && dlrec_json_write(path, j) == DLREC_OK;
  cJSON_Delete(j);
  return ok;
}

/* The command's exit code is 1 and its message has both strings. */
static int refused_with(const char *cmd, const char *a, const char *b) {
  char *out = NULL;
  int rc = test_run_cli(&out, "%s", cmd);
  int ok = rc == 1 && out && strstr(out, a) && strstr(out, b);
  if (!ok) fprintf(stderr, "expected a refusal naming '%s' and '%s': %s -> %d: %s\n", a, b, cmd, rc, out ? out : "");
  free(out);
  return ok;
}

TEST(edited_checkpoint_is_refused) {
  CHECK(make_data(8000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 20") == 0);
  /* One checkpoint: --resume would fall back to an older one (as
   * corrupt_or_mismatched_checkpoint_is_refused checks). */
  CHECK_OK(dlrec_remove_tree(test_path("run/ckpt-000000000010")));
  char ckpt[2048], manifest[2200], saved[2200], resume[8192], eval[8192], path[2200];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-000000000020", test_path("run"));
  snprintf(manifest, sizeof manifest, "%s/manifest.json", ckpt);
  snprintf(saved, sizeof saved, "%s/manifest.saved", test_path(""));
  CHECK_OK(dlrec_copy_file(manifest, saved));
  snprintf(resume, sizeof resume, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 30",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
  snprintf(eval, sizeof eval, "eval --model '%s' --data '%s'", test_path("run"), test_path("valid.dlr"));
  /* The loader position and the step, each refused by --resume and by a
   * load for eval (predict and serve load the same way). */
  const char *objects[] = {"position", NULL}, *keys[] = {"row", "step"};
  for (int i = 0; i < 2; i++) {
    CHECK(edit_manifest(ckpt, objects[i], keys[i], 1280)); /* row 2560 and step 20 before */
    CHECK(refused_with(resume, "manifest.json", "checksum mismatch"));
    CHECK(refused_with(eval, "manifest.json", "checksum mismatch"));
    CHECK_OK(dlrec_copy_file(saved, manifest));
  }
  /* config.json: epochs may differ on resume, so only the checksum can tell. */
  snprintf(path, sizeof path, "%s/config.json", ckpt);
  char *text;
  size_t n;
  CHECK_OK(dlrec_read_file(path, 1u << 20, &text, &n));
  char *e = strstr(text, "\"epochs\":\t2");
  if (e) e[strlen("\"epochs\":\t")] = '3';
  CHECK(e && test_write_file(path, text, n) == 0);
  CHECK(refused_with(eval, "config.json", "checksum mismatch"));
  if (e) e[strlen("\"epochs\":\t")] = '2';
  CHECK(test_write_file(path, text, n) == 0);
  free(text);
  /* A flip in dense.bin's padding after its last array, which no array
   * checksum covers. dense.bin holds one array per named tensor: the number
   * of arrays n at offset 12, and the last one's table entry has its count
   * at 32+64(n-1)+48 and its offset at +56. */
  snprintf(path, sizeof path, "%s/dense.bin", ckpt);
  uint64_t count = 0, offset = 0;
  uint32_t n_arrays = 0;
  struct stat st;
  FILE *f = fopen(path, "rb");
  CHECK(f);
  int ok = fseek(f, 12, SEEK_SET) == 0 && fread(&n_arrays, 4, 1, f) == 1 && n_arrays >= 1 &&
           fseek(f, 32 + 64 * (long)(n_arrays - 1) + 48, SEEK_SET) == 0 && fread(&count, 8, 1, f) == 1 &&
           fread(&offset, 8, 1, f) == 1;
  fclose(f);
  CHECK(ok && stat(path, &st) == 0);
  CHECK((uint64_t)st.st_size > offset + count * 4); /* there is padding */
  flip_byte(path, st.st_size - 1);
  CHECK(refused_with(eval, "dense.bin", "checksum mismatch"));
  CHECK(refused_with(resume, "dense.bin", "checksum mismatch"));
  flip_byte(path, st.st_size - 1);
  /* An older version (sealed, as if written so) names the version. */
  cJSON *j;
  CHECK_OK(dlrec_json_read(manifest, &j));
  cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "version"), 1);
  dlrec_status s = dlrec_json_write_sealed(manifest, j, "checksum");
  cJSON_Delete(j);
  CHECK_OK(s);
  CHECK(refused_with(eval, "checkpoint version 1", "reads version 3"));
  CHECK_OK(dlrec_copy_file(saved, manifest));
  /* Restored, it loads and resumes. */
  CHECK(train("run", "--max-steps 30 --resume") == 0);
}

/* Applies fn to the checkpoint's manifest and seals it, as a writer of
 * another model (or an older dlrec) would have: the checksum then holds,
 * and only the content can tell. */
static int reseal_manifest(const char *ckpt, void (*fn)(cJSON *)) {
  char path[2200];
  snprintf(path, sizeof path, "%s/manifest.json", ckpt);
  cJSON *j;
  if (dlrec_json_read(path, &j) != DLREC_OK) return 0;
  fn(j);
  int ok = dlrec_json_write_sealed(path, j, "checksum") == DLREC_OK;
  cJSON_Delete(j);
  return ok;
}

static cJSON *first_tensor(cJSON *manifest) {
  return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(manifest, "model"), "tensors"), 0);
}
static void shrink_first_tensor(cJSON *j) {
  cJSON_SetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(first_tensor(j), "shape"), 0), 31);
}
static void rename_first_tensor(cJSON *j) {
  cJSON_SetValuestring(cJSON_GetObjectItemCaseSensitive(first_tensor(j), "name"), "bottom.0.w");
}
static void other_type(cJSON *j) {
  cJSON_SetValuestring(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "type"), "dcn_v2");
}
static void version_2(cJSON *j) { cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(j, "version"), 2); }

/* A checkpoint stores the model's named tensors: the manifest records
 * model.type and each tensor's name and shape, dense.bin holds one array per
 * tensor under its name, and a checkpoint whose tensors are not the ones the
 * config plans is refused naming the tensor. */
TEST(checkpoint_holds_named_tensors) {
  CHECK(make_data(8000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 20") == 0);
  char ckpt[2048], manifest[2200], saved[2200], path[2200], eval[8192], resume[8192];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-000000000020", test_path("run"));
  snprintf(manifest, sizeof manifest, "%s/manifest.json", ckpt);
  snprintf(saved, sizeof saved, "%s/manifest.saved", test_path(""));
  CHECK_OK(dlrec_copy_file(manifest, saved));
  snprintf(eval, sizeof eval, "eval --model '%s' --data '%s'", test_path("run"), test_path("valid.dlr"));
  snprintf(resume, sizeof resume, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 30",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
  /* The config's bottom_mlp [32, 8] over the 13 dense columns, then the top
   * MLP [32, 1] over the interaction's 8 + 27 * 26 / 2 = 359 outputs (x and the
   * 26 columns' embeddings, pairwise). */
  cJSON *j;
  CHECK_OK(dlrec_json_read(manifest, &j));
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(model, "tensors");
  CHECK(cJSON_IsString(type) && !strcmp(type->valuestring, "dlrm"));
  CHECK_EQ(cJSON_GetArraySize(tensors), 8);
  static const char *names[] = {"bottom.0.weight", "bottom.0.bias", "bottom.1.weight", "bottom.1.bias",
                                "top.0.weight",    "top.0.bias",    "top.1.weight",    "top.1.bias"};
  static const int shapes[8][2] = {{32, 13}, {32, 0}, {8, 32}, {8, 0}, {32, 359}, {32, 0}, {1, 32}, {1, 0}};
  for (int i = 0; i < 8 && i < cJSON_GetArraySize(tensors); i++) {
    const cJSON *t = cJSON_GetArrayItem(tensors, i);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name"), *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    CHECK(cJSON_IsString(name) && !strcmp(name->valuestring, names[i]));
    CHECK_EQ(cJSON_GetArraySize(shape), shapes[i][1] ? 2 : 1);
    CHECK_EQ(cJSON_GetArrayItem(shape, 0)->valueint, shapes[i][0]);
    if (shapes[i][1]) CHECK_EQ(cJSON_GetArrayItem(shape, 1)->valueint, shapes[i][1]);
  }
  cJSON_Delete(j);
  /* dense.bin's array table: entry i (64 bytes from offset 32) starts with
   * tensor i's name and holds its element count at +48. */
  snprintf(path, sizeof path, "%s/dense.bin", ckpt);
  FILE *f = fopen(path, "rb");
  CHECK(f);
  for (int i = 0; f && i < 8; i++) {
    char entry[64];
    uint64_t count;
    CHECK(fseek(f, 32 + 64 * i, SEEK_SET) == 0 && fread(entry, 64, 1, f) == 1);
    memcpy(&count, entry + 48, 8);
    CHECK_STR(entry, names[i]);
    CHECK_EQ(count, (uint64_t)shapes[i][0] * (uint64_t)(shapes[i][1] ? shapes[i][1] : 1));
  }
  if (f) fclose(f);
  /* Another shape, another name, another type: refused by a load for eval
   * and by --resume, naming what differs. */
  CHECK(reseal_manifest(ckpt, shrink_first_tensor));
  CHECK(refused_with(eval, "tensor 0 is 'bottom.0.weight' of shape (31, 13)", "plans 'bottom.0.weight' of shape (32, 13)"));
  CHECK(refused_with(resume, "tensor 0", "shape (32, 13)"));
  CHECK_OK(dlrec_copy_file(saved, manifest));
  CHECK(reseal_manifest(ckpt, rename_first_tensor));
  CHECK(refused_with(eval, "'bottom.0.w'", "plans 'bottom.0.weight'"));
  CHECK_OK(dlrec_copy_file(saved, manifest));
  CHECK(reseal_manifest(ckpt, other_type));
  CHECK(refused_with(eval, "a checkpoint of a 'dcn_v2' model", "model.type is 'dlrm'"));
  CHECK_OK(dlrec_copy_file(saved, manifest));
  /* A version 2 checkpoint (one unnamed dense array) names the version. */
  CHECK(reseal_manifest(ckpt, version_2));
  CHECK(refused_with(eval, "checkpoint version 2", "reads version 3 (named tensors)"));
  CHECK_OK(dlrec_copy_file(saved, manifest));
  CHECK(train("run", "--max-steps 30 --resume") == 0);
}

/* Writes n Criteo rows whose every categorical column holds "aa" in the
 * rows i % 5 < k and "bb" in the others: with k = 3 "aa" is the more
 * frequent and gets the first id, with k = 2 "bb" does. The sizes are the
 * same either way. */
static int write_two_value_rows(const char *path, int n, int k) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  for (int i = 0; i < n; i++) {
    fprintf(f, "%d", i % 3 == 0);
    for (int d = 0; d < 13; d++) fprintf(f, "\t%d", (i + d) % 7);
    for (int c = 0; c < 26; c++) fprintf(f, "\t%s", i % 5 < k ? "aa" : "bb");
    fputc('\n', f);
  }
  return fclose(f);
}

TEST(resume_with_another_vocabulary_is_refused) {
  CHECK(write_two_value_rows(test_path("a.tsv"), 2000, 3) == 0);
  CHECK(write_two_value_rows(test_path("b.tsv"), 2000, 2) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit -q --input '%s' --out '%s' && '%s' etl fit -q --input '%s' --out '%s' && '%s' etl "
                        "apply -q --etl '%s' --input '%s' --out '%s'",
                        test_path("a.tsv"), test_path("etl"), getenv("DLREC_BIN"), test_path("b.tsv"),
                        test_path("etl_b"), getenv("DLREC_BIN"), test_path("etl"), test_path("a.tsv"),
                        test_path("train.dlr"));
  if (rc != 0) fprintf(stderr, "etl -> %d: %s\n", rc, out ? out : "");
  free(out);
  CHECK(rc == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl_b"), test_path("run"));
  CHECK(refused_with(cmd, "encodes rows differently", "the vocabulary differs at local id 2"));
  /* A copy of the same state is the same encoding. */
  CHECK_OK(dlrec_mkdirs(test_path("etl_copy")));
  const char *files[] = {"etl.json", "vocab.bin"};
  for (int i = 0; i < 2; i++) {
    char src[2048], dst[2048];
    snprintf(src, sizeof src, "%s/%s", test_path("etl"), files[i]);
    snprintf(dst, sizeof dst, "%s/%s", test_path("etl_copy"), files[i]);
    CHECK_OK(dlrec_copy_file(src, dst));
  }
  CHECK(test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
                     test_path("cfg.json"), test_path("train.dlr"), test_path("etl_copy"), test_path("run")) == 0);
  free(out);
}

/* The workflow's operators are part of the encoding: a resume with a state
 * of the same vocabularies and another clip is refused, naming the column. */
TEST(resume_with_another_operator_is_refused) {
  CHECK(write_two_value_rows(test_path("a.tsv"), 2000, 3) == 0);
  CHECK(test_write_file(test_path("w1.json"), "{\"dense\": {\"I2\": {\"clip\": [0, 3]}}}", (size_t)-1) == 0);
  CHECK(test_write_file(test_path("w2.json"), "{\"dense\": {\"I2\": {\"clip\": [0, 4]}}}", (size_t)-1) == 0);
  /* One call per command: test_path's buffers rotate. */
  CHECK(test_run_cli(NULL, "etl fit -q --input '%s' --out '%s' --workflow '%s'", test_path("a.tsv"), test_path("etl"),
                     test_path("w1.json")) == 0);
  CHECK(test_run_cli(NULL, "etl fit -q --input '%s' --out '%s' --workflow '%s'", test_path("a.tsv"),
                     test_path("etl_b"), test_path("w2.json")) == 0);
  CHECK(test_run_cli(NULL, "etl apply -q --etl '%s' --input '%s' --out '%s'", test_path("etl"), test_path("a.tsv"),
                     test_path("train.dlr")) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl_b"), test_path("run"));
  CHECK(refused_with(cmd, "encodes rows differently", "dense column 'I2': another fill_missing or clip"));
}

/* A multi-hot column's pooling and max hotness are part of the encoding: a
 * resume with a state fit with another one (same vocabulary, so the same
 * sizes) is refused. Pooling is not in .dlr files, so the ETL comparison
 * names it; max hotness is in the data's schema, checked before. */
TEST(resume_with_another_pooling_or_max_hotness_is_refused) {
  test_buf csv = {0};
  static const char *const genres[] = {"a", "b|c", "a|b|c|d|e", "", "d|a", "c"};
  test_buf_printf(&csv, "click,x,genres\n");
  for (int i = 0; i < 3000; i++)
    test_buf_printf(&csv, "%d,%d,%s\n", (i * 7) % 3 == 0, i % 11, genres[(i * 5) % 6]);
  CHECK(test_write_file(test_path("m.csv"), csv.p, csv.n) == 0);
  test_buf_free(&csv);
  static const char *const specs[] = {"sum:4", "mean:4", "sum:3"};
  static const char *const dirs[] = {"etl", "etl_mean", "etl_max3"};
  char *out = NULL;
  for (int i = 0; i < 3; i++) {
    int rc = test_run_cli(&out, "etl fit -q --format csv --schema 'label=click;dense=x;cat=genres;multi=genres:|:%s' "
                          "--input '%s' --out '%s'", specs[i], test_path("m.csv"), test_path(dirs[i]));
    if (rc != 0) fprintf(stderr, "etl fit %s -> %d: %s\n", specs[i], rc, out ? out : "");
    free(out);
    CHECK(rc == 0);
  }
  int rc = test_run_cli(&out, "etl apply -q --etl '%s' --input '%s' --out '%s'", test_path("etl"), test_path("m.csv"),
                        test_path("train.dlr"));
  free(out);
  CHECK(rc == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg.json"), test_path("train.dlr"), test_path(dirs[1]), test_path("run"));
  CHECK(refused_with(cmd, "encodes rows differently", "column 'genres': another pooling"));
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg.json"), test_path("train.dlr"), test_path(dirs[2]), test_path("run"));
  CHECK(refused_with(cmd, "another ETL state", "the schemas differ"));
  CHECK(train("run", "--max-steps 10 --resume") == 0);
}

/* predict reads a CSV input's columns by the names of its header, as etl
 * apply does (issue 36, finding 1): the same rows with their columns in
 * another order score the same, to the bit; a column the model needs and
 * the header lacks (renamed) is refused by name; one it never saw is
 * ignored. */
TEST(predict_maps_csv_columns_by_name) {
  static const char *const genres[] = {"a", "b|c", "a|b|c|d|e", "", "d|a", "c"};
  test_buf a = {0}, b = {0}, c = {0}, d = {0};
  test_buf_printf(&a, "click,x,y,genres\n");
  test_buf_printf(&b, "genres,y,extra,click,x\n");
  test_buf_printf(&c, "click,xx,y,genres\n");
  for (int i = 0; i < 3000; i++) {
    const int click = (i * 7) % 3 == 0, x = i % 11, y = (i * 13) % 29;
    const char *g = genres[(i * 5) % 6];
    test_buf_printf(&a, "%d,%d,%d,%s\n", click, x, y, g);
    test_buf_printf(&b, "%s,%d,%d,%d,%d\n", g, y, i, click, x);
    test_buf_printf(&c, "%d,%d,%d,%s\n", click, x, y, g);
  }
  test_buf_printf(&d, "%s", "x,y\n1,2\n");
  CHECK(test_write_file(test_path("a.csv"), a.p, a.n) == 0);
  CHECK(test_write_file(test_path("b.csv"), b.p, b.n) == 0);
  CHECK(test_write_file(test_path("c.csv"), c.p, c.n) == 0);
  CHECK(test_write_file(test_path("d.csv"), d.p, d.n) == 0);
  test_buf_free(&a), test_buf_free(&b), test_buf_free(&c), test_buf_free(&d);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit -q --format csv --schema 'label=click;dense=x,y;cat=genres;multi=genres:|' "
                        "--input '%s' --out '%s'", test_path("a.csv"), test_path("etl"));
  free(out);
  CHECK(rc == 0);
  rc = test_run_cli(&out, "etl apply -q --etl '%s' --input '%s' --out '%s'", test_path("etl"), test_path("a.csv"),
                    test_path("train.dlr"));
  free(out);
  CHECK(rc == 0);
  /* Unlabeled encoding of labeled rows: the label column is known, not warned of. */
  rc = test_run_cli(&out, "etl apply --no-label --etl '%s' --input '%s' --out '%s'", test_path("etl"),
                    test_path("a.csv"), test_path("unlabeled.dlr"));
  CHECK(rc == 0 && out && !strstr(out, "was not in fit's input"));
  free(out);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char *want = NULL, *got = NULL;
  CHECK(test_run_cli(&want, "predict -q --model '%s' --input '%s' --out -", test_path("run"), test_path("a.csv")) == 0);
  CHECK(test_run_cli(&got, "predict -q --model '%s' --input '%s' --out -", test_path("run"), test_path("b.csv")) == 0);
  CHECK(want && got && strlen(want) > 3000 * 2);
  /* The warning comes first; then the same scores. */
  const char *scores = got ? strstr(got, want ? want : "") : NULL;
  CHECK(scores != NULL);
  CHECK(got && strstr(got, "column 'extra' was not in fit's input; ignored"));
  free(want), free(got);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "predict -q --model '%s' --input '%s' --out -", test_path("run"), test_path("c.csv"));
  CHECK(refused_with(cmd, "c.csv:1:", "header has no dense column 'x'"));
  snprintf(cmd, sizeof cmd, "predict -q --model '%s' --input '%s' --out -", test_path("run"), test_path("d.csv"));
  CHECK(refused_with(cmd, "d.csv:1:", "header has no label column 'click'"));
}

/* Every setting of the dense optimizer is part of the state a checkpoint
 * continues: a change is refused naming optimizer.dense. */
TEST(resume_refuses_another_dense_optimizer) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  static const char *dense[] = {
      "{\"type\": \"adam\", \"lr\": 0.003}",         "{\"type\": \"adam\", \"lr\": 0.002, \"beta1\": 0.8}",
      "{\"type\": \"adam\", \"lr\": 0.002, \"beta2\": 0.99}", "{\"type\": \"adam\", \"lr\": 0.002, \"eps\": 1e-6}",
      "{\"type\": \"adam\", \"lr\": 0.002, \"weight_decay\": 0.01}", "{\"type\": \"adagrad\", \"lr\": 0.002}",
  };
  for (size_t i = 0; i < sizeof dense / sizeof *dense; i++) {
    char cfg[2048], cmd[8192];
    snprintf(cfg, sizeof cfg,
             "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
             " \"optimizer\": {\"dense\": %s, \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05}},"
             " \"training\": {\"batch_size\": 128, \"epochs\": 2, \"threads\": 2, \"seed\": 5, \"deterministic\": true},"
             " \"loader\": {\"window_groups\": 2, \"slice_rows\": 8},"
             " \"checkpoint\": {\"interval_steps\": 10, \"keep\": 3}, \"log\": {\"interval_steps\": 10}}",
             dense[i]);
    CHECK(test_write_file(test_path("cfg2.json"), cfg, (size_t)-1) == 0);
    snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
             test_path("cfg2.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
    if (!refused_with(cmd, "'optimizer.dense' differs", "cannot resume")) {
      test_fail(__FILE__, __LINE__, "dense optimizer %s was not refused", dense[i]);
      return;
    }
  }
}

/* The seed and the batch size decide the data order and the steps a
 * checkpoint continues: a change to either is refused naming the field, while
 * a setting that may change (the epochs) is accepted. */
TEST(resume_refuses_another_seed_or_batch_size) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  /* slice_rows also changes the loader's fingerprint, which would refuse
   * the position later: the config check must name the field first. */
  static const struct {
    const char *training, *slice_rows, *field;
  } cases[] = {
      {"\"batch_size\": 128, \"epochs\": 2, \"seed\": 6", "8", "'training.seed' differs"},
      {"\"batch_size\": 64, \"epochs\": 2, \"seed\": 5", "8", "'training.batch_size' differs"},
      {"\"batch_size\": 128, \"epochs\": 2, \"seed\": 5", "16", "'loader' differs"},
      {"\"batch_size\": 128, \"epochs\": 3, \"seed\": 5", "8", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char cfg[2048], cmd[8192];
    snprintf(cfg, sizeof cfg,
             "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
             " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05}},"
             " \"training\": {%s, \"threads\": 2, \"deterministic\": true},"
             " \"loader\": {\"window_groups\": 2, \"slice_rows\": %s},"
             " \"checkpoint\": {\"interval_steps\": 10, \"keep\": 3}, \"log\": {\"interval_steps\": 10}}",
             cases[i].training, cases[i].slice_rows);
    CHECK(test_write_file(test_path("cfg2.json"), cfg, (size_t)-1) == 0);
    snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
             test_path("cfg2.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
    if (cases[i].field && !refused_with(cmd, cases[i].field, "cannot resume")) {
      test_fail(__FILE__, __LINE__, "training {%s} was not refused", cases[i].training);
      return;
    }
    if (!cases[i].field) {
      char *out = NULL;
      int rc = test_run_cli(&out, "%s", cmd);
      if (rc != 0) fprintf(stderr, "%s -> %d: %s\n", cmd, rc, out ? out : "");
      free(out);
      CHECK(rc == 0);
    }
  }
}

/* optim.bin with bytes appended: the manifest's size says so first. */
TEST(resume_refuses_a_grown_tensor_file) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char path[2048], cmd[8192];
  snprintf(path, sizeof path, "%s/ckpt-000000000005/optim.bin", test_path("run"));
  FILE *f = fopen(path, "ab");
  CHECK(f);
  fputs("appended", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run"));
  CHECK(refused_with(cmd, "optim.bin", "bytes, the manifest says"));
}

/* The schedule of docs/config.md, written out again: linear warmup, then 1,
 * then (1 - t)^power from decay_start_step over decay_steps, never below
 * min_lr_scale, and min_lr_scale after. */
static double lr_reference(uint64_t step, double warmup, double start, double steps, double power, double floor_) {
  if (step <= warmup) return step / warmup;
  if (step <= start) return 1.0;
  double t = (step - start) / steps;
  if (t >= 1) return floor_;
  double v = pow(1 - t, power);
  return v > floor_ ? v : floor_;
}

/* Whether a metrics.jsonl line says it trained on the CPU backend in fp32
 * GEMMs (the default training.precision, resolved) without bf16 hardware. */
static int logs_cpu_fp32(const cJSON *line) {
  const cJSON *be = cJSON_GetObjectItemCaseSensitive(line, "backend");
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(line, "precision");
  const cJSON *native = cJSON_GetObjectItemCaseSensitive(line, "bf16_native");
  return cJSON_IsString(be) && !strcmp(be->valuestring, "cpu") && cJSON_IsString(pr) &&
         !strcmp(pr->valuestring, "fp32") && cJSON_IsFalse(native);
}

/* metrics.jsonl logs the scale each step trained with: at step s that of
 * step s (1-based), through warmup, the decay, the floor before the decay
 * ends ((1 - t)^2 < 0.1 from t = 0.69) and after it; and on every line the
 * backend and the resolved precision that trained. */
TEST(lr_schedule_in_training_reaches_the_floor) {
  CHECK(make_data(8000) == 0);
  const char *cfg =
      "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
      " \"optimizer\": {\"dense\": {\"type\": \"sgd\", \"lr\": 0.05}, \"sparse\": {\"type\": \"sgd\", \"lr\": 0.05}},"
      " \"schedule\": {\"warmup_steps\": 10, \"decay_start_step\": 20, \"decay_steps\": 30, \"decay_power\": 2,"
      " \"min_lr_scale\": 0.1},"
      " \"training\": {\"batch_size\": 32, \"threads\": 1, \"seed\": 5},"
      " \"log\": {\"interval_steps\": 1}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 60") == 0);
  char path[2048], *text;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path("run"));
  CHECK_OK(dlrec_read_file(path, 1u << 24, &text, &n));
  uint64_t seen = 0, at_floor_early = 0;
  for (char *line = text; *line;) {
    char *nl = strchr(line, '\n');
    if (!nl) break;
    *nl = '\0';
    cJSON *j = cJSON_Parse(line);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "lr_scale");
    int ok = cJSON_IsNumber(st) && cJSON_IsNumber(sc) && logs_cpu_fp32(j);
    uint64_t step = ok ? (uint64_t)st->valuedouble : 0;
    double got = ok ? sc->valuedouble : NAN, want = lr_reference(step, 10, 20, 30, 2, 0.1);
    cJSON_Delete(j);
    if (!ok || step != seen + 1) {
      test_fail(__FILE__, __LINE__, "line %llu of metrics.jsonl: %s", (unsigned long long)seen + 1, line);
      break;
    }
    seen = step;
    if (!(fabs(got - want) <= 1e-12)) {
      test_fail(__FILE__, __LINE__, "step %llu: lr_scale %.17g, the schedule says %.17g", (unsigned long long)step, got,
                want);
      break;
    }
    at_floor_early += step < 50 && want == 0.1;
    line = nl + 1;
  }
  free(text);
  if (test_failed_now()) return;
  CHECK_EQ(seen, 60);
  CHECK(at_floor_early >= 5); /* the floor was reached before the decay ended */
}

/* ---- validation after every epoch, early stopping, the plateau, RUN/best ---- */

/* RUN/metrics.jsonl as a JSON array of its lines; NULL if unreadable. */
static cJSON *metrics_lines(const char *run) {
  char path[2048], *text;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(run));
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) return NULL;
  cJSON *all = cJSON_CreateArray();
  for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    cJSON *j = cJSON_Parse(line);
    if (!j) {
      cJSON_Delete(all);
      free(text);
      return NULL;
    }
    cJSON_AddItemToArray(all, j);
  }
  free(text);
  return all;
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* The step RUN/NAME (latest or best) names; 0 if none. */
static uint64_t pointer_step(const char *run, const char *name) {
  char path[2048], *text;
  size_t n;
  snprintf(path, sizeof path, "%s/%s", test_path(run), name);
  if (dlrec_read_file(path, 4096, &text, &n) != DLREC_OK) return 0;
  unsigned long long step = 0;
  if (sscanf(text, "ckpt-%llu", &step) != 1) step = 0;
  free(text);
  return step;
}

static int ckpt_exists(const char *run, uint64_t step) {
  char path[2048];
  struct stat st;
  snprintf(path, sizeof path, "%s/ckpt-%012llu/manifest.json", test_path(run), (unsigned long long)step);
  return stat(path, &st) == 0;
}

/* SIGINT (Ctrl-C) and SIGTERM to `dlrec train` stop it after the current
 * step with a checkpoint of that step and exit status 130; a resume then
 * completes. The CLI owns these handlers, not the library. */
TEST(sigint_and_sigterm_stop_with_a_checkpoint) {
  CHECK(make_data(20000) == 0);
  /* Long enough that the signal lands mid-run: 50 epochs. */
  const char *cfg =
      "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
      " \"training\": {\"batch_size\": 32, \"epochs\": 50, \"threads\": 1}, \"log\": {\"interval_steps\": 10}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  const int sigs[] = {SIGINT, SIGTERM};
  uint64_t stopped_at = 0;
  for (int k = 0; k < 2; k++) {
    char run[32], metrics[2048];
    snprintf(run, sizeof run, "run%d", k);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", test_path(run));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
      execl(getenv("DLREC_BIN"), "dlrec", "train", "-q", "--config", test_path("cfg.json"), "--train",
            test_path("train.dlr"), "--etl", test_path("etl"), "--out", test_path(run), (char *)NULL);
      _exit(127);
    }
    struct stat st;
    for (int i = 0; i < 3000 && (stat(metrics, &st) != 0 || st.st_size == 0); i++) usleep(10000);
    kill(pid, sigs[k]);
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 130);
    const uint64_t step = pointer_step(run, "latest");
    CHECK(step >= 10 && step < 50 * 16000 / 32);
    if (k == 0) stopped_at = step;
  }
  /* The stopped run resumes from its checkpoint and trains on (20 steps:
   * the rest of its 50 epochs would take minutes under the sanitizers). */
  char *out = NULL;
  CHECK(test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps %llu",
                     test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run0"),
                     (unsigned long long)stopped_at + 20) == 0);
  cJSON *summary = out ? cJSON_Parse(out) : NULL;
  CHECK(summary && cJSON_GetObjectItem(summary, "steps_this_run") &&
        cJSON_GetObjectItem(summary, "steps_this_run")->valuedouble == 20);
  cJSON_Delete(summary);
  free(out);
  CHECK_EQ(pointer_step("run0", "latest"), stopped_at + 20);
}

/* A run of up to 5 epochs, validated after each, where no validation can
 * improve by more than min_delta 1 (an AUC moves by less): the first sets
 * the references, the second and third are bad. So early stopping with
 * patience 2 ends the run at the third validation, and the plateau (factor
 * 0.5, patience 0) halves the lr scale at the second and again at the third.
 * The training lines log the scale each step trained with; RUN/best names
 * the checkpoint of the highest AUC logged, which checkpoint.keep 1 does not
 * prune, and `eval --checkpoint best` measures that AUC again. With
 * training.restore_best the summary reports it too. */
TEST(every_epoch_validation_drives_plateau_early_stop_and_best) {
  CHECK(make_data(20000) == 0);
  const char *cfg =
      "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
      " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002}, \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05}},"
      " \"training\": {\"batch_size\": 128, \"epochs\": 5, \"threads\": 2, \"seed\": 5, \"deterministic\": true,"
      " \"early_stopping_patience\": 2, \"early_stopping_min_delta\": 1, \"restore_best\": true},"
      " \"schedule\": {\"plateau_factor\": 0.5, \"plateau_patience\": 0, \"plateau_min_delta\": 1},"
      " \"eval\": {\"every_epoch\": true, \"max_rows\": 2000},"
      " \"loader\": {\"window_groups\": 2, \"slice_rows\": 8},"
      " \"checkpoint\": {\"interval_steps\": 40, \"keep\": 1, \"keep_best\": true}, \"log\": {\"interval_steps\": 5}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s'",
                        test_path("cfg.json"), test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"),
                        test_path("run"));
  cJSON *summary = rc == 0 && out ? cJSON_Parse(out) : NULL;
  if (!summary) fprintf(stderr, "train -> %d: %s\n", rc, out ? out : "");
  free(out);
  CHECK(summary != NULL);
  CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(summary, "early_stopped")));
  cJSON *lines = metrics_lines("run");
  CHECK(lines != NULL);
  uint64_t vstep[3] = {0};
  double vauc[3] = {0};
  int nv = 0;
  uint64_t last_step = 0;
  double restored_step = NAN;
  const cJSON *l;
  cJSON_ArrayForEach(l, lines) {
    uint64_t step = (uint64_t)num(l, "step");
    const cJSON *valid = cJSON_GetObjectItemCaseSensitive(l, "valid");
    if (!logs_cpu_fp32(l)) { /* training, validation and final lines alike */
      test_fail(__FILE__, __LINE__, "step %llu's line does not record backend cpu, precision fp32",
                (unsigned long long)step);
      break;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "final"))) {
      restored_step = num(l, "restored_best_step"); /* the report of restore_best, last */
      continue;
    }
    if (valid) {
      if (nv == 3 || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "epoch_end"))) {
        test_fail(__FILE__, __LINE__, "an unexpected validation line at step %llu", (unsigned long long)step);
        break;
      }
      CHECK_EQ(num(l, "epoch"), nv); /* the epoch it ends, from 0 */
      CHECK_NEAR(num(l, "plateau_scale"), nv == 0 ? 1.0 : nv == 1 ? 0.5 : 0.25, 0, 0);
      CHECK_EQ(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "early_stop")), nv == 2);
      /* "best" marks an AUC above every earlier one. */
      int higher = 1;
      for (int i = 0; i < nv; i++) higher &= num(valid, "auc") > vauc[i];
      CHECK_EQ(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "best")), higher);
      vstep[nv] = step;
      vauc[nv++] = num(valid, "auc");
    } else {
      /* A training line: the lr scale its step trained with. */
      double want = step <= vstep[0] || !vstep[0] ? 1.0 : step <= vstep[1] || !vstep[1] ? 1.0 : 0.5;
      if (nv == 2) want = 0.5;
      if (num(l, "lr_scale") != want) {
        test_fail(__FILE__, __LINE__, "step %llu: lr_scale %g, expected %g", (unsigned long long)step,
                  num(l, "lr_scale"), want);
        break;
      }
    }
    last_step = step;
  }
  CHECK_EQ(nv, 3);
  CHECK(vstep[1] == 2 * vstep[0] && vstep[2] == 3 * vstep[0]); /* epochs of equal length */
  CHECK_EQ_U64(last_step, vstep[2]);                           /* the run ended at the third validation */
  int best = 0;
  for (int i = 1; i < 3; i++)
    if (vauc[i] > vauc[best]) best = i;
  CHECK_EQ_U64(pointer_step("run", "best"), vstep[best]);
  CHECK(ckpt_exists("run", vstep[best]));
  CHECK_EQ_U64(pointer_step("run", "latest"), vstep[2]);
  /* restore_best: the summary's validation is the best checkpoint's. */
  CHECK_EQ(num(summary, "restored_best_step"), (double)vstep[best]);
  CHECK_EQ(restored_step, (double)vstep[best]);
  CHECK_NEAR(num(cJSON_GetObjectItemCaseSensitive(summary, "valid"), "auc"), vauc[best], 1e-12, 0);
  cJSON_Delete(summary);
  cJSON_Delete(lines);
  /* eval --checkpoint best scores the same rows with RUN/best's parameters. */
  out = NULL;
  rc = test_run_cli(&out, "eval --model '%s' --checkpoint best --data '%s' --max-rows 2000", test_path("run"),
                    test_path("valid.dlr"));
  cJSON *ev = rc == 0 && out ? cJSON_Parse(out) : NULL;
  if (!ev) fprintf(stderr, "eval -> %d: %s\n", rc, out ? out : "");
  free(out);
  CHECK(ev != NULL);
  CHECK_NEAR(num(ev, "auc"), vauc[best], 1e-12, 0);
  cJSON_Delete(ev);
  out = NULL;
  rc = test_run_cli(&out, "predict -q --model '%s' --checkpoint best --input '%s' --out '%s'", test_path("run"),
                    test_path("valid.dlr"), test_path("scores.txt"));
  if (rc != 0) fprintf(stderr, "predict -> %d: %s\n", rc, out ? out : "");
  free(out);
  CHECK_EQ(rc, 0);
  /* Pruning keeps RUN/best however many checkpoints come after it. */
  dlrec_model *m;
  CHECK_OK(dlrec_model_load(test_path("run"), &m));
  dlrec_train_progress p = m->progress;
  for (uint64_t s = 0; s < 3; s++) {
    p.step = 100000 + s;
    CHECK_OK(dlrec_checkpoint_save(test_path("run"), &m->config, test_path("etl"), m->net, NULL, &p, 1, NULL));
  }
  dlrec_model_free(m);
  CHECK(ckpt_exists("run", vstep[best]));
  CHECK(ckpt_exists("run", 100002));
  CHECK(!ckpt_exists("run", 100001) && !ckpt_exists("run", 100000));
}

/* --checkpoint best on a run without RUN/best, or an unknown choice, is a
 * clear error; serve refuses best with --watch before it starts anything. */
TEST(checkpoint_best_without_one_is_refused) {
  CHECK(make_data(4000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "eval --model '%s' --checkpoint best --data '%s'", test_path("run"), test_path("valid.dlr"));
  CHECK(rc == 1 && out && strstr(out, "no best checkpoint") && strstr(out, "checkpoint.keep_best"));
  free(out);
  out = NULL;
  rc = test_run_cli(&out, "eval --model '%s' --checkpoint newest --data '%s'", test_path("run"), test_path("valid.dlr"));
  CHECK(rc == 1 && out && strstr(out, "expected latest or best"));
  free(out);
  out = NULL;
  rc = test_run_cli(&out, "serve --model '%s' --checkpoint best --watch", test_path("run"));
  CHECK(rc == 2 && out && strstr(out, "--watch"));
  free(out);
  /* keep_best without --valid would never act: refused up front. */
  const char *cfg = "{\"eval\": {\"every_epoch\": true}, \"checkpoint\": {\"keep_best\": true}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  out = NULL;
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s'", test_path("cfg.json"),
                    test_path("train.dlr"), test_path("etl"), test_path("run2"));
  CHECK(rc == 1 && out && strstr(out, "need --valid"));
  free(out);
}

/* A resume in the middle of an epoch with every new feature on gives the
 * bits of an uninterrupted run: validation after each epoch (the first
 * before the interruption), the plateau halving the lr at every validation
 * after the first (min_delta 1: none improves), early stopping armed,
 * RUN/best, gradient clipping and L2 on the embeddings. The checkpoint the
 * resume starts from must carry the validation state, or the resumed run
 * would take its second validation for its first and not cut the lr. */
TEST(resume_mid_epoch_with_validation_features_is_bitwise_identical) {
  CHECK(make_data(20000) == 0);
  const char *cfg =
      "{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [32, 1]},"
      " \"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.002},"
      " \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05, \"weight_decay\": 0.0001}, \"clip_grad_norm\": 0.05},"
      " \"training\": {\"batch_size\": 128, \"epochs\": 3, \"threads\": 2, \"seed\": 5, \"deterministic\": true,"
      " \"early_stopping_patience\": 10},"
      " \"schedule\": {\"plateau_factor\": 0.5, \"plateau_patience\": 0, \"plateau_min_delta\": 1},"
      " \"eval\": {\"every_epoch\": true, \"max_rows\": 1000},"
      " \"loader\": {\"window_groups\": 2, \"slice_rows\": 8},"
      " \"checkpoint\": {\"interval_steps\": 10, \"keep\": 3, \"keep_best\": true}, \"log\": {\"interval_steps\": 10}}";
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  char valid[2100];
  snprintf(valid, sizeof valid, "--valid '%s'", test_path("valid.dlr"));
  char a1[2200], a2[2200], a3[2200];
  snprintf(a1, sizeof a1, "%s --max-steps 300", valid);
  snprintf(a2, sizeof a2, "%s --max-steps 190", valid);
  snprintf(a3, sizeof a3, "%s --max-steps 300 --resume", valid);
  /* Epochs of ~125 steps: validations at ~125 and ~250; 190 is mid-epoch. */
  CHECK(train("straight", a1) == 0);
  CHECK(train("resumed", a2) == 0);
  CHECK(train("resumed", a3) == 0);
  CHECK(same_checkpoint("straight", "resumed", 300));
  CHECK(same_metrics("straight", "resumed"));
  CHECK(pointer_step("straight", "best") != 0);
  CHECK_EQ_U64(pointer_step("straight", "best"), pointer_step("resumed", "best"));
  /* The plateau acted before step 300: the log says so. */
  cJSON *lines = metrics_lines("straight");
  CHECK(lines != NULL);
  int halved = 0;
  const cJSON *l;
  cJSON_ArrayForEach(l, lines) halved += num(l, "lr_scale") == 0.5 && num(l, "step") > 250;
  cJSON_Delete(lines);
  CHECK(halved > 0);
}

/* ---- gradient-norm clipping ---- */

/* One SGD step with optimizer.clip_grad_norm against a naive double
 * reference: the gradients of the same batch (dense, and d_emb (B, F, D)
 * per lookup), their joint L2 norm, coef = min(1, max_norm / (norm + 1e-6))
 * as PyTorch's clip_grad_norm_, then every dense parameter minus
 * lr * coef * g and every embedding row minus lr * coef * the sum of the
 * d_emb of its lookups. The tiny batch has a multi-hot column (bags of 0 to
 * 3 ids), so rows get several lookups. Checked clipping (max_norm below the
 * norm) and not (above it). */
/* A `type` network on net_check_schema's columns (3 dense), initialized
 * from seed 7, on backend be (NULL: the default), and a workspace of
 * max_batch rows. */
static void tiny_net(const char *type, dlrec_backend *be, uint32_t max_batch, dlrec_schema *s, dlrec_net **m,
                     dlrec_net_ws **ws) {
  net_check_schema(s, 3);
  dlrec_net_config nc;
  CHECK_OK(dlrec_net_config_default(&nc, type));
  CHECK_OK(dlrec_net_create(m, &nc, s));
  CHECK_OK(dlrec_net_init(*m, 7));
  if (be) CHECK_OK(dlrec_net_set_backend(*m, be));
  CHECK_OK(dlrec_net_ws_create(ws, *m, max_batch));
}

static void check_clip(const char *type, double max_norm_over_norm) {
  dlrec_schema s;
  dlrec_net *m = NULL;
  dlrec_net_ws *ws = NULL;
  tiny_net(type, NULL, 4, &s, &m, &ws);
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 3, -1);
  size_t n;
  float *p = dlrec_net_dense_params(m, &n);
  dlrec_table *t = dlrec_net_table(m);
  const uint32_t D = dlrec_table_dim(t), stride = dlrec_table_stride(t), F = s.n_sparse, B = tb.b.rows;
  const size_t n_emb = (size_t)B * F * D, table_floats = (size_t)s.table_rows * stride;
  double loss;
  const float *grad, *d_emb;
  CHECK_OK(dlrec_net_gradients(m, ws, &tb.b, &loss, &grad, &d_emb));
  double *g = malloc(n * sizeof *g), *dE = malloc(n_emb * sizeof *dE), sq = 0;
  for (size_t i = 0; i < n; i++) {
    g[i] = grad[i];
    sq += g[i] * g[i];
  }
  for (size_t i = 0; i < n_emb; i++) {
    dE[i] = d_emb[i];
    sq += dE[i] * dE[i];
  }
  const double norm = sqrt(sq), max_norm = max_norm_over_norm * norm;
  const double coef = max_norm / (norm + 1e-6) < 1 ? max_norm / (norm + 1e-6) : 1.0, lr = 0.1;
  double *want_p = malloc(n * sizeof *want_p), *want_t = malloc(table_floats * sizeof *want_t);
  for (size_t i = 0; i < n; i++) want_p[i] = p[i] - lr * coef * g[i];
  const float *rows = dlrec_table_data(t);
  for (size_t i = 0; i < table_floats; i++) want_t[i] = rows[i];
  for (uint32_t c = 0; c < F; c++)
    for (uint32_t b = 0; b < B; b++)
      for (uint32_t k = tb.b.offsets[c][b]; k < tb.b.offsets[c][b + 1]; k++)
        for (uint32_t d = 0; d < D; d++)
          want_t[(size_t)tb.b.ids[c][k] * stride + d] -= lr * coef * dE[((size_t)b * F + c) * D + d];

  dlrec_net_optim opt = {0};
  dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_SGD);
  opt.dense.lr = (float)lr;
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  opt.sparse_lr = (float)lr;
  opt.clip_grad_norm = (float)max_norm;
  CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, t, &sc));
  CHECK_OK(dlrec_train_step(m, ws, &opt, &tb.b, 1.0f, 1, &loss, NULL));
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!(fabs(p[i] - want_p[i]) <= 1e-6 + 1e-5 * fabs(want_p[i])) && bad++ < 5)
      fprintf(stderr, "%s: param %zu: %.9g, reference %.9g\n", type, i, p[i], want_p[i]);
  for (size_t i = 0; i < table_floats; i++)
    if (!(fabs(rows[i] - want_t[i]) <= 1e-6 + 1e-5 * fabs(want_t[i])) && bad++ < 10)
      fprintf(stderr, "%s: table float %zu: %.9g, reference %.9g\n", type, i, rows[i], want_t[i]);
  CHECK_EQ(bad, 0);
  /* The step moved something: the reference is not a no-op. */
  CHECK(norm > 1e-3);
  dlrec_sparse_optim_free(opt.sparse);
  free(g), free(dE), free(want_p), free(want_t);
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
}

TEST(clip_grad_norm_matches_naive_reference) {
  check_clip("fm", 0.25);   /* clipped to a quarter */
  check_clip("fm", 2.0);    /* below the limit: unchanged */
  check_clip("dlrm", 0.1);
  check_clip("lr", 0.5);
}

/* The loss scaling rule (dlrec_net_loss_scale_update): a dynamic scale
 * doubles after growth_interval finite steps in a row, up to the maximum,
 * and halves at a non-finite one, which is skipped; a fixed one only counts
 * the skip; at a dynamic scale of 1 there is no way out but an error. */
TEST(loss_scale_rule_grows_backs_off_and_gives_up) {
  dlrec_net_optim o = {.loss_scale = 8, .scale_growth_interval = 3};
  CHECK_OK(dlrec_loss_scale_update(&o, 1, 1));
  CHECK_OK(dlrec_loss_scale_update(&o, 1, 2));
  CHECK(o.loss_scale == 8 && o.scale_good_steps == 2);
  CHECK_OK(dlrec_loss_scale_update(&o, 1, 3));
  CHECK(o.loss_scale == 16 && o.scale_good_steps == 0);
  CHECK_OK(dlrec_loss_scale_update(&o, 1, 4));
  CHECK_OK(dlrec_loss_scale_update(&o, 0, 5));
  CHECK(o.loss_scale == 8 && o.scale_good_steps == 0 && o.skipped_steps == 1);
  o.loss_scale = DLREC_LOSS_SCALE_MAX, o.scale_good_steps = 2;
  CHECK_OK(dlrec_loss_scale_update(&o, 1, 6));
  CHECK(o.loss_scale == DLREC_LOSS_SCALE_MAX && o.scale_good_steps == 0);
  dlrec_net_optim f = {.loss_scale = 4};
  CHECK_OK(dlrec_loss_scale_update(&f, 0, 1));
  CHECK_OK(dlrec_loss_scale_update(&f, 1, 2));
  CHECK(f.loss_scale == 4 && f.skipped_steps == 1);
  o.loss_scale = 2;
  CHECK_OK(dlrec_loss_scale_update(&o, 0, 7));
  CHECK(o.loss_scale == 1);
  CHECK_ERR(dlrec_loss_scale_update(&o, 0, 8), DLREC_ERR_INVALID, "training diverged at step 8");
}

/* A batch of 16 copies of net_check's 4 rows (64: a step of it splits
 * across 2 threads, 32 rows a way). */
typedef struct tiled_batch {
  dlrec_batch b;
  float labels[64], dense[64 * 3];
  uint32_t off[3][65], ids[3][16 * 12];
} tiled_batch;

static void tile_batch(tiled_batch *t, const net_check_batch *x, uint32_t n_dense) {
  memset(t, 0, sizeof *t);
  t->b.rows = 64;
  for (uint32_t k = 0; k < 16; k++)
    for (uint32_t r = 0; r < 4; r++) {
      t->labels[k * 4 + r] = x->labels[r];
      memcpy(&t->dense[(k * 4 + r) * n_dense], &x->dense[r * n_dense], n_dense * sizeof(float));
    }
  for (int c = 0; c < 3; c++) {
    uint32_t n = 0;
    for (uint32_t k = 0; k < 16; k++)
      for (uint32_t r = 0; r < 4; r++) {
        t->off[c][k * 4 + r] = n;
        for (uint32_t j = x->off[c][r]; j < x->off[c][r + 1]; j++) t->ids[c][n++] = x->ids[c][j];
      }
    t->off[c][64] = n;
    t->b.offsets[c] = t->off[c];
    t->b.ids[c] = t->ids[c];
  }
  t->b.labels = t->labels;
  t->b.dense = t->dense;
}

/* steps SGD steps of a `type` network (seed 7) on net_check's batches (as
 * 64 rows where tile), on backend be (NULL: the default) with loss scale
 * `scale` (0: none) and growth interval `interval`; the dense parameters
 * and the table's rows into p and t (n and t_n floats), opt's state into
 * *out. */
static void scaled_run(const char *type, dlrec_backend *be, float scale, uint32_t interval, int steps, int tile,
                       float **p, size_t *n, float **t, size_t *t_n, dlrec_net_optim *out) {
  dlrec_schema s;
  dlrec_net *m = NULL;
  dlrec_net_ws *ws = NULL;
  tiny_net(type, be, 64, &s, &m, &ws);
  dlrec_net_optim opt = {.loss_scale = scale, .scale_growth_interval = interval};
  dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_SGD);
  opt.dense.lr = 0.1f;
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  opt.sparse_lr = 0.1f;
  CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, dlrec_net_table(m), &sc));
  for (int k = 0; k < steps; k++) {
    net_check_batch tb;
    net_check_make_batch(&tb, &s, 3 + (uint64_t)k, -1);
    tiled_batch big;
    if (tile) tile_batch(&big, &tb, s.n_dense);
    double loss;
    CHECK_OK(dlrec_train_step(m, ws, &opt, tile ? &big.b : &tb.b, 1.0f, (uint64_t)k + 1, &loss, NULL));
    if (tile) CHECK_EQ(dlrec_net_ws_split(ws), dlrec_backend_threads(dlrec_backend_default()) >= 2 ? 2u : 1u);
  }
  const float *dp = dlrec_net_dense_params(m, n);
  dlrec_table *tab = dlrec_net_table(m);
  *t_n = (size_t)s.table_rows * dlrec_table_stride(tab);
  *p = malloc(*n * sizeof **p), *t = malloc(*t_n * sizeof **t);
  memcpy(*p, dp, *n * sizeof **p);
  memcpy(*t, dlrec_table_data(tab), *t_n * sizeof **t);
  dlrec_sparse_optim_free(opt.sparse);
  opt.sparse = NULL;
  *out = opt;
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
}

/* Loss scaling by a power of two is exact: fp32 steps scaled by 1024, by
 * 2^60, or dynamically (growing every 2 steps) leave the same bits as
 * unscaled ones, dense parameters and table alike (a step that forgot to
 * divide the dense gradients or d_emb back would not), on 4 rows (whole
 * steps) and on 64 (split across the threads). In fp16 (emulated),
 * 2^60 overflows the GEMMs' operands: a fixed scale skips every step and
 * leaves the model as it was; a dynamic one halves until the steps fit,
 * then trains. Every registered model type, in its defaults. */
TEST(loss_scaling_is_exact_and_skips_overflowing_steps) {
  const char *types[64];
  int n_types = 0;
  while (n_types < 64 && (types[n_types] = dlrec_net_type_name((size_t)n_types))) n_types++;
  for (int ti = 0; ti < n_types; ti++) {
    float *p0, *t0, *p1, *t1;
    size_t n, tn;
    dlrec_net_optim o;
    for (int tile = 0; tile < 2; tile++) {
      scaled_run(types[ti], NULL, 0, 0, 5, tile, &p0, &n, &t0, &tn, &o);
      const float scales[] = {1024.0f, 0x1p60f, DLREC_LOSS_SCALE_INIT};
      for (int si = 0; si < 3; si++) {
        const uint32_t interval = si == 2 ? 2 : 0;
        scaled_run(types[ti], NULL, scales[si], interval, 5, tile, &p1, &n, &t1, &tn, &o);
        if (memcmp(p0, p1, n * sizeof *p0) || memcmp(t0, t1, tn * sizeof *t0))
          test_fail(__FILE__, __LINE__, "%s scaled by %g (%d rows): not the unscaled run's bits", types[ti],
                    (double)scales[si], tile ? 64 : 4);
        CHECK_EQ(o.skipped_steps, 0);
        CHECK(o.loss_scale == (interval ? scales[si] * 4 : scales[si])); /* 5 steps: grown twice */
        free(p1), free(t1);
      }
      free(p0), free(t0);
    }
    dlrec_backend *be;
    dlrec_backend_config c = {.threads = 1, .precision = DLREC_PRECISION_FP16};
    CHECK_OK(dlrec_backend_create(&be, "cpu", &c));
    float *pi, *ti0;
    scaled_run(types[ti], be, 0, 0, 0, 0, &pi, &n, &ti0, &tn, &o); /* the initial model */
    scaled_run(types[ti], be, 0x1p60f, 0, 4, 0, &p1, &n, &t1, &tn, &o);
    CHECK(!memcmp(pi, p1, n * sizeof *pi) && !memcmp(ti0, t1, tn * sizeof *ti0));
    CHECK_EQ(o.skipped_steps, 4);
    CHECK(o.loss_scale == 0x1p60f);
    free(p1), free(t1);
    scaled_run(types[ti], be, 0x1p60f, 1000, 60, 0, &p1, &n, &t1, &tn, &o);
    CHECK(o.skipped_steps > 0 && o.skipped_steps < 60 && o.loss_scale < 0x1p40f);
    CHECK(memcmp(pi, p1, n * sizeof *pi) != 0);
    int finite = 1;
    for (size_t i = 0; i < n; i++) finite &= isfinite(p1[i]) != 0;
    CHECK(finite);
    fprintf(stderr, "%s in fp16 from 2^60: %llu steps skipped, scale then %g\n", types[ti],
            (unsigned long long)o.skipped_steps, (double)o.loss_scale);
    free(p1), free(t1), free(pi), free(ti0);
    dlrec_backend_free(be);
  }
}

/* CONFIG with the table tiered: a cache of 4000 rows (more than a batch's
 * 128 x 26 ids, a fraction of the table's rows), in the run directory. */
static int write_tiered_config(void) {
  char cfg[2048];
  snprintf(cfg, sizeof cfg, "%.*s, \"storage\": {\"kind\": \"tiered\", \"cache_rows\": 4000}}",
           (int)strlen(CONFIG) - 1, CONFIG);
  return test_write_file(test_path("cfg.json"), cfg, (size_t)-1);
}


/* The last metrics line's table_storage counter `key` (-1 if absent). */
static double last_storage_counter(const char *run, const char *key) {
  char path[2048], *text;
  size_t n;
  snprintf(path, sizeof path, "%s/metrics.jsonl", test_path(run));
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) return -1;
  char *last = text, *nl;
  while ((nl = strchr(last, '\n')) && nl[1]) last = nl + 1;
  cJSON *j = cJSON_Parse(last);
  free(text);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "table_storage");
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, key);
  double r = cJSON_IsNumber(v) ? v->valuedouble : -1;
  cJSON_Delete(j);
  return r;
}

TEST(tiered_table_trains_as_ram_resumes_and_survives_sigkill) {
  CHECK(make_data(20000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("ram", "--max-steps 180") == 0);
  CHECK(write_tiered_config() == 0);
  CHECK(train("tiered", "--max-steps 180") == 0);
  /* Rows went through the file: evicted, written back and read again. */
  CHECK(last_storage_counter("tiered", "evictions") > 0);
  CHECK(last_storage_counter("tiered", "bytes_written") > 0);
  double hit = last_storage_counter("tiered", "hit_rate");
  CHECK(hit > 0 && hit < 1);
  CHECK(same_checkpoint("ram", "tiered", 180));
  /* The table's file is the run's scratch: gone when the run ends. */
  struct stat st;
  CHECK(stat(test_path("tiered/table.tiered"), &st) != 0);
  CHECK(train("resumed", "--max-steps 95") == 0);
  CHECK(train("resumed", "--max-steps 180 --resume") == 0);
  CHECK(same_checkpoint("ram", "resumed", 180));
  /* Killed mid-run (its table file left behind), resumed: nothing lost. */
  CHECK(train_killed("killed", "180") == 0);
  CHECK(train("killed", "--max-steps 180 --resume") == 0);
  CHECK(same_checkpoint("ram", "killed", 180));
}

/* A tiered table on a device (cpu-mirror, as a GPU): the table stays in
 * host memory on its own (auto), the store moving its rows through the
 * file as on the CPU, and the run trains the bits of a RAM table's run on
 * one CPU thread (which cpu-mirror's runs equal). Asked to put it on the
 * device, the run is refused, saying why. */
TEST(tiered_table_trains_on_a_device_from_host_memory) {
  CHECK(make_data(20000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  CHECK(train("ram1", "--threads 1 --max-steps 60") == 0);
  CHECK(write_tiered_config() == 0);
  char *log = NULL;
  CHECK(test_run_cli(&log, "train --device cpu-mirror --threads 1 --max-steps 60 --config '%s' --train '%s' --etl '%s' "
                     "--out '%s'", test_path("cfg.json"), test_path("train.dlr"), test_path("etl"),
                     test_path("tiered_dev")) == 0);
  CHECK(log && strstr(log, "the table stays in host memory (training.table_placement auto: a store's table stays "
                           "there)"));
  free(log);
  CHECK(same_checkpoint("ram1", "tiered_dev", 60));
  CHECK(last_storage_counter("tiered_dev", "evictions") > 0);
  char *text = NULL, cfg[2048];
  size_t n;
  CHECK_OK(dlrec_read_file(test_path("cfg.json"), 1u << 16, &text, &n));
  CHECK(text && replace_first(cfg, sizeof cfg, text, "\"training\": {",
                              "\"training\": {\"table_placement\": \"device\", ") == 0);
  free(text);
  CHECK(test_write_file(test_path("cfg_dev.json"), cfg, (size_t)-1) == 0);
  char *refused = NULL;
  CHECK(test_run_cli(&refused, "train -q --device cpu-mirror --config '%s' --train '%s' --etl '%s' --out '%s'",
                     test_path("cfg_dev.json"), test_path("train.dlr"), test_path("etl"), test_path("tiered_on_dev")) == 1);
  CHECK(refused && strstr(refused, "training.table_placement \"device\": storage.kind \"tiered\" keeps its table in "
                                   "host memory"));
  free(refused);
}

/* RUN/ckpt-STEP's table and Adagrad state as whole arrays, read with the
 * tensor file reader alone: table.bin and optim.bin, then, for a journaled
 * checkpoint, journal.bin's and journal_optim.bin's rows put in place (this
 * is the format docs/formats.md states, applied independently of the
 * loader). rows and stride: the table's shape; n_dense: the dense
 * optimizer's state floats. *journal_rows: the journal's rows (0: none). */
static int read_state(const char *run, uint64_t step, uint64_t rows, uint64_t stride, uint64_t n_dense, float **table,
                      float **accum, float **dense, uint64_t *journal_rows) {
  char dir[2048], path[2100];
  snprintf(dir, sizeof dir, "%s/ckpt-%012llu", test_path(run), (unsigned long long)step);
  uint32_t crc;
  *table = malloc(rows * stride * sizeof(float));
  *accum = malloc(rows * sizeof(float));
  *dense = malloc(n_dense * sizeof(float));
  uint32_t updates[2];
  tensor_desc t = tensor_array("table", TENSOR_F32, rows * stride, *table, 0);
  tensor_desc o[3] = {tensor_array("dense_state", TENSOR_F32, n_dense, *dense, 0),
                      tensor_array("sparse_accum", TENSOR_F32, rows, *accum, 0),
                      tensor_array("sparse_updates", TENSOR_U32, 2, updates, 0)};
  snprintf(path, sizeof path, "%s/table.bin", dir);
  if (tensor_file_read(path, &t, 1, &crc) != DLREC_OK) return 0;
  snprintf(path, sizeof path, "%s/optim.bin", dir);
  if (tensor_file_read(path, o, 2, &crc) != DLREC_OK) return 0;
  *journal_rows = 0;
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  char *text;
  size_t n;
  if (dlrec_read_file(path, 1u << 20, &text, &n) != DLREC_OK) return 0;
  cJSON *m = cJSON_Parse(text);
  free(text);
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(m, "journal");
  const cJSON *jr = cJSON_GetObjectItemCaseSensitive(j, "rows");
  const uint64_t k = cJSON_IsNumber(jr) ? (uint64_t)jr->valuedouble : 0;
  const int journaled = j != NULL;
  cJSON_Delete(m);
  if (!journaled) return 1;
  *journal_rows = k;
  uint32_t *r = malloc((k + 1) * sizeof *r);
  float *jt = malloc((k * stride + 1) * sizeof(float)), *ja = malloc((k + 1) * sizeof(float));
  tensor_desc a[2] = {tensor_array("rows", TENSOR_U32, k, r, 0), tensor_array("table", TENSOR_F32, k * stride, jt, 0)};
  tensor_desc b[2] = {tensor_array("dense_state", TENSOR_F32, n_dense, *dense, 0),
                      tensor_array("sparse_accum", TENSOR_F32, k, ja, 0)};
  snprintf(path, sizeof path, "%s/journal.bin", dir);
  int ok = tensor_file_read(path, a, 2, &crc) == DLREC_OK;
  snprintf(path, sizeof path, "%s/journal_optim.bin", dir);
  ok = ok && tensor_file_read(path, b, 2, &crc) == DLREC_OK;
  for (uint64_t i = 0; ok && i < k; i++) {
    ok = r[i] < rows && (i == 0 || r[i] > r[i - 1]);
    if (ok) memcpy(*table + (uint64_t)r[i] * stride, jt + i * stride, stride * sizeof(float));
    if (ok) (*accum)[r[i]] = ja[i];
  }
  free(r), free(jt), free(ja);
  return ok;
}

/* RUN_A/ckpt-STEP (full) and RUN_B/ckpt-STEP (full or journaled) hold the
 * same model and optimizer state, bit for bit. */
static int same_state(const char *run_a, const char *run_b, uint64_t step, uint64_t *journal_rows) {
  char a[2048], b[2048];
  snprintf(a, sizeof a, "%s/ckpt-%012llu/dense.bin", test_path(run_a), (unsigned long long)step);
  snprintf(b, sizeof b, "%s/ckpt-%012llu/dense.bin", test_path(run_b), (unsigned long long)step);
  if (!files_equal(a, b)) return fprintf(stderr, "dense.bin differs\n"), 0;
  dlrec_model *m;
  snprintf(a, sizeof a, "%s/ckpt-%012llu", test_path(run_a), (unsigned long long)step);
  if (dlrec_model_load(a, &m) != DLREC_OK) return 0;
  const uint64_t rows = dlrec_store_rows(dlrec_net_store(m->net)), stride = dlrec_table_stride(dlrec_net_table_const(m->net));
  size_t n_params;
  dlrec_net_dense_params_const(m->net, &n_params);
  const uint64_t n_dense = dlrec_optim_state_floats(&m->config.dense, n_params);
  dlrec_model_free(m);
  float *ta = NULL, *aa = NULL, *da = NULL, *tb = NULL, *ab = NULL, *db = NULL;
  uint64_t none;
  int ok = read_state(run_a, step, rows, stride, n_dense, &ta, &aa, &da, &none) &&
           read_state(run_b, step, rows, stride, n_dense, &tb, &ab, &db, journal_rows);
  if (ok && memcmp(ta, tb, rows * stride * sizeof(float))) ok = 0, fprintf(stderr, "the tables differ\n");
  if (ok && memcmp(aa, ab, rows * sizeof(float))) ok = 0, fprintf(stderr, "the Adagrad states differ\n");
  if (ok && memcmp(da, db, n_dense * sizeof(float))) ok = 0, fprintf(stderr, "the dense optimizer states differ\n");
  free(ta), free(aa), free(da), free(tb), free(ab), free(db);
  return ok;
}

/* Writes CONFIG with its checkpoint section replaced by `sections` (which
 * then end the object). */
static int write_config_with(const char *sections) {
  const char *ckpt = "\"checkpoint\": {\"interval_steps\": 10, \"keep\": 3}, ", *at = strstr(CONFIG, ckpt);
  if (!at) return -1;
  const char *rest = at + strlen(ckpt);
  char cfg[2048];
  snprintf(cfg, sizeof cfg, "%.*s%.*s, %s}", (int)(at - CONFIG), CONFIG, (int)strlen(rest) - 1, rest, sections);
  return test_write_file(test_path("cfg.json"), cfg, (size_t)-1);
}

/* The steps of RUN's checkpoints that are journaled and that are full. */
static void count_journaled(const char *run, int *journaled, int *full) {
  *journaled = *full = 0;
  for (int step = 1; step <= 200; step++) {
    char path[2048];
    struct stat st;
    snprintf(path, sizeof path, "%s/ckpt-%012d/manifest.json", test_path(run), step);
    if (stat(path, &st) != 0) continue;
    snprintf(path, sizeof path, "%s/ckpt-%012d/journal.bin", test_path(run), step);
    if (stat(path, &st) == 0) (*journaled)++;
    else (*full)++;
  }
}

/* A tiered table's checkpoints journal the rows changed since the last full
 * one: with journal_max_fraction 1 every checkpoint after the first is a
 * journal, holds the ram run's state bit for bit, and links the first one's
 * table.bin; the first journal (10 steps of changes) is smaller than the
 * table. With 0.3, full checkpoints and journals alternate, each holding
 * the same state. Resume from a journal, and SIGKILL, lose nothing; predict
 * reads a journaled checkpoint as the full one; a damaged journal is refused
 * by name. */
TEST(tiered_checkpoints_journal_the_changed_rows) {
  CHECK(make_data(20000) == 0);
  const char *tiered = "\"storage\": {\"kind\": \"tiered\", \"cache_rows\": 4000}";
  char sections[512];
  CHECK(write_config_with("\"checkpoint\": {\"interval_steps\": 10, \"keep\": 20}") == 0);
  CHECK(train("ram", "--max-steps 180") == 0);
  snprintf(sections, sizeof sections,
           "%s, \"checkpoint\": {\"interval_steps\": 10, \"keep\": 20, \"journal_max_fraction\": 1}", tiered);
  CHECK(write_config_with(sections) == 0);
  CHECK(train("tiered", "--max-steps 180") == 0);
  uint64_t rows = 0;
  for (uint64_t step = 20; step <= 180; step += 80) {
    CHECK(same_state("ram", "tiered", step, &rows));
    CHECK(rows > 0);
  }
  struct stat base, table, journal;
  CHECK(stat(test_path("tiered/ckpt-000000000010/table.bin"), &base) == 0);
  CHECK(stat(test_path("tiered/ckpt-000000000180/table.bin"), &table) == 0);
  CHECK(stat(test_path("tiered/ckpt-000000000020/journal.bin"), &journal) == 0);
  CHECK(table.st_ino == base.st_ino && table.st_nlink >= 18);
  CHECK(journal.st_size < table.st_size);
  int journaled, full;
  count_journaled("tiered", &journaled, &full);
  CHECK(full == 1 && journaled == 17);
  /* Resumed from a journaled checkpoint, and killed and resumed. */
  CHECK(train("resumed", "--max-steps 95") == 0);
  CHECK(train("resumed", "--max-steps 180 --resume") == 0);
  CHECK(same_state("ram", "resumed", 180, &rows) && rows > 0);
  CHECK(train_killed("killed", "180") == 0);
  CHECK(train("killed", "--max-steps 180 --resume") == 0);
  CHECK(same_state("ram", "killed", 180, &rows) && rows > 0);
  /* predict scores the journaled checkpoint as the full one. */
  char *out = NULL;
  int rc = test_run_cli(&out, "predict --model '%s' --input '%s' --out '%s' && '%s' predict --model '%s' --input '%s' "
                        "--out '%s' && cmp '%s' '%s'",
                        test_path("ram/ckpt-000000000180"), test_path("valid.dlr"), test_path("p_ram.tsv"),
                        getenv("DLREC_BIN"), test_path("tiered/ckpt-000000000180"), test_path("valid.dlr"),
                        test_path("p_tiered.tsv"), test_path("p_ram.tsv"), test_path("p_tiered.tsv"));
  CHECK_EQ(rc, 0);
  free(out);
  /* Every 2 steps with at most 30% of the rows in a journal: both kinds. */
  snprintf(sections, sizeof sections,
           "%s, \"checkpoint\": {\"interval_steps\": 2, \"keep\": 100, \"journal_max_fraction\": 0.3}", tiered);
  CHECK(write_config_with(sections) == 0);
  CHECK(train("mixed", "--max-steps 60") == 0);
  count_journaled("mixed", &journaled, &full);
  CHECK(journaled >= 3 && full >= 3);
  for (uint64_t step = 10; step <= 60; step += 10) CHECK(same_state("ram", "mixed", step, &rows));
  /* A flipped byte in the journal: refused, naming the file. */
  flip_byte(test_path("tiered/ckpt-000000000180/journal.bin"), 300);
  rc = test_run_cli(&out, "predict --model '%s' --input '%s' --out '%s'", test_path("tiered/ckpt-000000000180"),
                    test_path("valid.dlr"), test_path("p_bad.tsv"));
  CHECK(rc != 0 && out && strstr(out, "journal.bin"));
  free(out);
}

/* Journaled checkpoints with checkpoint.keep 3 keep two bases: a full one
 * every keep - 1 = 2 intervals (5 full, 10 on it, 15 full, ...). A run
 * stopped at 28 and resumed to 30 leaves 25, 28 and 30 on one base, so
 * pruning keeps 20 (on 15's) too. A flipped byte in the newest base takes
 * down 25, 28 and 30; --resume says so, resumes from 20 and trains on: its
 * ckpt-25 is the first run's again, bit for bit, and the damaged 28 and 30,
 * newer than it, are neither counted nor removed. Without an interval (a
 * checkpoint where each run ends), a new base once two checkpoints hold the
 * last one. */
TEST(journaled_checkpoints_keep_two_bases_and_resume_past_a_damaged_one) {
  CHECK(make_data(4000) == 0);
  CHECK(write_config_with("\"storage\": {\"kind\": \"tiered\", \"cache_rows\": 4000}, \"checkpoint\": "
                          "{\"interval_steps\": 5, \"keep\": 3, \"journal_max_fraction\": 1}") == 0);
  CHECK(train("run", "--max-steps 28") == 0);
  CHECK(train("run", "--max-steps 30 --resume") == 0);
  int journaled, full;
  count_journaled("run", &journaled, &full);
  CHECK_EQ(journaled, 3); /* 20, 28, 30 */
  CHECK_EQ(full, 1);      /* 25 */
  struct stat t20, t25, t28, t30;
  CHECK(stat(test_path("run/ckpt-000000000020/table.bin"), &t20) == 0);
  CHECK(stat(test_path("run/ckpt-000000000025/table.bin"), &t25) == 0);
  CHECK(stat(test_path("run/ckpt-000000000028/table.bin"), &t28) == 0);
  CHECK(stat(test_path("run/ckpt-000000000030/table.bin"), &t30) == 0);
  CHECK(t30.st_ino == t25.st_ino && t28.st_ino == t25.st_ino && t20.st_ino != t25.st_ino);
  CHECK(access(test_path("run/ckpt-000000000015"), F_OK) != 0); /* pruned: its files live on in 20's links */
  char dense[2048];
  snprintf(dense, sizeof dense, "%s", test_path("dense25.bin"));
  CHECK_OK(dlrec_copy_file(test_path("run/ckpt-000000000025/dense.bin"), dense));
  flip_byte(test_path("run/ckpt-000000000030/table.bin"), 4096);
  char *out = NULL;
  CHECK(test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 25",
                     test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("run")) == 0);
  CHECK(out && strstr(out, "ckpt-000000000030/table.bin") && strstr(out, "ckpt-000000000025/table.bin") &&
        strstr(out, "ckpt-000000000020, the newest checkpoint that loads: 3 newer one(s) skipped"));
  free(out);
  CHECK(files_equal(test_path("run/ckpt-000000000025/dense.bin"), dense));
  CHECK(access(test_path("run/ckpt-000000000020"), F_OK) == 0);
  CHECK(access(test_path("run/ckpt-000000000030"), F_OK) == 0);
  dlrec_model *m = NULL;
  CHECK_OK(dlrec_model_load(test_path("run"), &m));
  dlrec_model_free(m);
  /* checkpoint.interval_steps 0: 5 full, 10 on it, 15 full, 20 on it. */
  CHECK(write_config_with("\"storage\": {\"kind\": \"tiered\", \"cache_rows\": 4000}, \"checkpoint\": "
                          "{\"keep\": 3, \"journal_max_fraction\": 1}") == 0);
  for (int steps = 5; steps <= 20; steps += 5) {
    char extra[64];
    snprintf(extra, sizeof extra, "--max-steps %d%s", steps, steps > 5 ? " --resume" : "");
    CHECK(train("ends", extra) == 0);
  }
  count_journaled("ends", &journaled, &full);
  CHECK(journaled == 2 && full == 1);
  struct stat t10, t15;
  CHECK(stat(test_path("ends/ckpt-000000000010/table.bin"), &t10) == 0);
  CHECK(stat(test_path("ends/ckpt-000000000015/table.bin"), &t15) == 0);
  CHECK(stat(test_path("ends/ckpt-000000000020/table.bin"), &t20) == 0);
  CHECK(t20.st_ino == t15.st_ino && t10.st_ino != t15.st_ino);
}

/* Encodes 2560 synthetic rows (seed `seed`, 20 batches of 128) with the
 * ETL state of make_data into PATH, through PATH.tmp as etl apply writes. */
static int make_part(int seed, const char *path) {
  char *out = NULL;
  int rc = test_run_cli(&out, "synth -q --rows 2560 --seed %d --max-cardinality 2000 --out '%s' && '%s' etl apply -q "
                        "--etl '%s' --input '%s' --out '%s'",
                        seed, test_path("part.tsv"), getenv("DLREC_BIN"), test_path("etl"), test_path("part.tsv"), path);
  if (rc != 0) fprintf(stderr, "part %d: %s\n", seed, out ? out : "");
  free(out);
  return rc;
}

/* `dlrec train --follow DIR` for RUN in the background (--max-steps
 * max_steps unless NULL), with up to 4 more arguments `extra` (NULL-ended)
 * and its stderr into the file `log` (unless NULL): its pid. */
static pid_t follow_start_with(const char *run, const char *dir, const char *idle, int resume, const char *max_steps,
                               const char *const *extra, const char *log) {
  pid_t pid = fork();
  if (pid == 0) {
    const char *argv[24] = {"dlrec", "train", "-q", "--config", test_path("cfg.json"), "--follow", dir,
                            "--follow-idle", idle, "--etl", test_path("etl"), "--out", test_path(run)};
    int n = 13;
    if (resume) argv[n++] = "--resume";
    if (max_steps) argv[n++] = "--max-steps", argv[n++] = max_steps;
    for (int i = 0; extra && extra[i] && i < 4; i++) argv[n++] = extra[i];
    if (!freopen("/dev/null", "w", stdout)) _exit(126); /* the run's summary */
    if (log && !freopen(log, "w", stderr)) _exit(126);
    execv(getenv("DLREC_BIN"), (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static pid_t follow_start(const char *run, const char *dir, const char *idle, int resume, const char *max_steps) {
  return follow_start_with(run, dir, idle, resume, max_steps, NULL, NULL);
}

static int exit_code(pid_t pid) {
  int status;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Hard-links the staged parts FROM .. TO - 1 into dir. */
static int add_parts(char parts[][2048], int from, int to, const char *dir) {
  for (int i = from; i < to; i++) {
    char path[2100];
    snprintf(path, sizeof path, "%s/part-%d.dlr", dir, i);
    if (link(parts[i], path) != 0) return -1;
  }
  return 0;
}

/* --follow trains each file once, in name order, as files appear: the same
 * bits as one run over the files in that order (no shuffle, batches that do
 * not straddle files). Files that appear while it runs are picked up; a run
 * stopped inside a file resumes there, and one killed while waiting for the
 * next file resumes after the last; a follow run is not resumed with
 * --train. */
/* cfg.json: CONFIG without shuffling, so that a followed file's batches are
 * its rows in order. */
static int write_follow_config(void) {
  const char *loader = "\"loader\": {\"window_groups\": 2, \"slice_rows\": 8}", *at = strstr(CONFIG, loader);
  if (!at) return -1;
  char cfg[2048];
  snprintf(cfg, sizeof cfg, "%.*s\"loader\": {\"shuffle\": false}%s", (int)(at - CONFIG), CONFIG, at + strlen(loader));
  return test_write_file(test_path("cfg.json"), cfg, (size_t)-1);
}

TEST(follow_trains_files_as_they_appear_and_resumes_inside_one) {
  CHECK(make_data(8000) == 0);
  CHECK(write_follow_config() == 0);
  char parts[3][2048], dir[2048], staged[2100];
  CHECK(mkdir(test_path("staged"), 0755) == 0);
  for (int i = 0; i < 3; i++) {
    snprintf(parts[i], sizeof parts[i], "%s/part-%d.dlr", test_path("staged"), i);
    CHECK(make_part(11 + i, parts[i]) == 0);
  }
  char *out = NULL;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --train '%s' --train '%s' --etl '%s' --out '%s' --max-steps 60",
                        test_path("cfg.json"), parts[0], parts[1], parts[2], test_path("etl"), test_path("all"));
  CHECK_EQ(rc, 0);
  free(out);
  /* Live: the follower starts on an empty directory; the files arrive by
   * rename, in order, while it waits or trains. */
  snprintf(dir, sizeof dir, "%s", test_path("live-in"));
  CHECK(mkdir(dir, 0755) == 0);
  pid_t pid = follow_start("live", dir, "2", 0, NULL);
  for (int i = 0; i < 3; i++) {
    usleep(300000);
    char tmp[2200];
    snprintf(staged, sizeof staged, "%s/part-%d.dlr", dir, i);
    snprintf(tmp, sizeof tmp, "%s.tmp", staged);
    CHECK(link(parts[i], tmp) == 0 && rename(tmp, staged) == 0);
  }
  CHECK_EQ(exit_code(pid), 0);
  CHECK(same_checkpoint("all", "live", 60));
  /* Stopped inside the second file (--max-steps 25), resumed there. */
  snprintf(dir, sizeof dir, "%s", test_path("all-in"));
  CHECK(mkdir(dir, 0755) == 0);
  CHECK(add_parts(parts, 0, 3, dir) == 0);
  CHECK_EQ(exit_code(follow_start("paused", dir, "0.5", 0, "25")), 0);
  size_t n;
  CHECK_OK(dlrec_read_file(test_path("paused/ckpt-000000000025/manifest.json"), 1u << 20, &out, &n));
  CHECK(out && strstr(out, "\"follow_file\":\t\"part-1.dlr\""));
  free(out);
  CHECK_EQ(exit_code(follow_start("paused", dir, "0.5", 1, NULL)), 0);
  CHECK(same_checkpoint("all", "paused", 60));
  /* Killed while waiting after the first file, resumed when the others came. */
  snprintf(dir, sizeof dir, "%s", test_path("late-in"));
  CHECK(mkdir(dir, 0755) == 0);
  CHECK(add_parts(parts, 0, 1, dir) == 0);
  pid = follow_start("killed", dir, "60", 0, NULL);
  char ckpt[2048];
  struct stat st;
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-000000000020/manifest.json", test_path("killed"));
  for (int i = 0; i < 1500 && stat(ckpt, &st) != 0; i++) usleep(10000);
  usleep(100000);
  kill(pid, SIGKILL);
  CHECK_EQ(exit_code(pid), 128 + SIGKILL);
  CHECK(add_parts(parts, 1, 3, dir) == 0);
  CHECK_EQ(exit_code(follow_start("killed", dir, "0.5", 1, NULL)), 0);
  CHECK(same_checkpoint("all", "killed", 60));
  /* A follow run resumed on --train files is refused, saying why. */
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume", test_path("cfg.json"),
                    parts[0], test_path("etl"), test_path("paused"));
  CHECK(rc != 0 && out && strstr(out, "resume it with --follow"));
  free(out);
}

/* Sets (or clears) the complete flag of the .dlr file at path, in place and
 * with its header's checksum: the file as its writer leaves it when finished
 * (or while it still writes). */
static int set_complete(const char *path, int complete) {
  static unsigned char h[1 << 16];
  FILE *f = fopen(path, "r+b");
  if (!f) return -1;
  int ok = fread(h, 1, DLR_HDR_FIXED, f) == DLR_HDR_FIXED;
  const uint32_t hb = ok ? dlr_get32(h + DLR_HDR_BYTES) : 0;
  ok = ok && hb >= DLR_HDR_FIXED && hb <= sizeof h && fseek(f, 0, SEEK_SET) == 0 && fread(h, 1, hb, f) == hb;
  if (ok) {
    const uint32_t flags = dlr_get32(h + DLR_HDR_FLAGS);
    dlr_put32(h + DLR_HDR_FLAGS, complete ? flags | DLR_FLAG_COMPLETE : flags & ~DLR_FLAG_COMPLETE);
    dlr_put32(h + hb - 4, dlrec_crc32c(0, h, hb - 4));
    ok = fseek(f, 0, SEEK_SET) == 0 && fwrite(h, 1, hb, f) == hb;
  }
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* Writes bytes [from, to) of the file src to dst (appended when from > 0):
 * a copy arriving in two parts. */
static int copy_part(const char *src, const char *dst, size_t from, size_t to) {
  char *data;
  size_t n;
  if (dlrec_read_file(src, 1u << 30, &data, &n) != DLREC_OK) return -1;
  FILE *f = to <= n && from <= to ? fopen(dst, from ? "ab" : "wb") : NULL;
  const int ok = f && fwrite(data + from, 1, to - from, f) == to - from;
  free(data);
  return f && fclose(f) == 0 && ok ? 0 : -1;
}

/* Whether the text file at path (a whole metrics.jsonl, a .reason, a log)
 * contains `what`; `last_line`: only its last line does. */
static int file_says(const char *path, const char *what, int last_line) {
  char *text;
  size_t n;
  if (dlrec_read_file(path, 1u << 24, &text, &n) != DLREC_OK) return 0;
  while (last_line && n && text[n - 1] == '\n') text[--n] = '\0';
  const char *nl = last_line ? strrchr(text, '\n') : NULL;
  const int yes = strstr(nl ? nl : text, what) != NULL;
  free(text);
  return yes;
}

/* --follow goes on past bad files: a file its writer has not finished (its
 * header's complete flag unset) and one still being copied in (shorter
 * than its header says) are waited for and trained once whole; a flipped
 * byte in a row group, a text file and a symlink to junk are moved into
 * DIR/.rejected/ (the link, not its target) with a reason naming the error,
 * before any of their rows is trained, and so is a file still unfinished
 * after --follow-wait. The run trains exactly the four good files (80
 * steps, 10240 rows), counts 4 rejected files in metrics.jsonl and its
 * summary, and moves no good file. --follow-strict keeps the fail-stop:
 * exit 1 naming the file, which stays where it is. */
TEST(follow_waits_for_unfinished_files_and_moves_bad_ones_aside) {
  CHECK(make_data(8000) == 0);
  CHECK(write_follow_config() == 0);
  char good[2048], dir[2048], p[8][2200], junk[2048], log[2048], run[2048];
  snprintf(good, sizeof good, "%s", test_path("part.dlr"));
  snprintf(junk, sizeof junk, "%s", test_path("junk.txt"));
  snprintf(log, sizeof log, "%s", test_path("follow.log"));
  snprintf(dir, sizeof dir, "%s", test_path("in"));
  snprintf(run, sizeof run, "%s", test_path("run"));
  CHECK(make_part(11, good) == 0);
  CHECK(mkdir(dir, 0755) == 0);
  const char *names[] = {"a-0.dlr", "b-1.dlr", "c-2.dlr", "d-3.dlr", "e-4.dlr", "f-5.dlr", "g-6.dlr", "h-7.dlr"};
  for (int i = 0; i < 8; i++) snprintf(p[i], sizeof p[i], "%s/%s", dir, names[i]);
  struct stat st;
  CHECK(stat(good, &st) == 0);
  const size_t size = (size_t)st.st_size;
  CHECK(link(good, p[0]) == 0 && link(good, p[7]) == 0);                      /* good */
  CHECK_OK(dlrec_copy_file(good, p[1]));                                        /* finished while followed */
  CHECK(set_complete(p[1], 0) == 0);
  CHECK(copy_part(good, p[2], 0, size / 2) == 0);                               /* copied in while followed */
  CHECK_OK(dlrec_copy_file(good, p[3]));                                        /* a flipped byte in its rows */
  flip_byte(p[3], (long)size / 2);
  CHECK(test_write_file(p[4], "label,clicks\n1,2\n", (size_t)-1) == 0);         /* text */
  CHECK(test_write_file(junk, "junk\n", (size_t)-1) == 0 && symlink(junk, p[5]) == 0); /* a symlink to junk */
  CHECK_OK(dlrec_copy_file(good, p[6]));                                        /* never finished */
  CHECK(set_complete(p[6], 0) == 0);
  const char *extra[] = {"--follow-wait", "1", NULL};
  pid_t pid = follow_start_with("run", dir, "0.3", 0, NULL, extra, log);
  /* b-1 is finished, and c-2's copy completed, once the follower says it
   * waits for each. */
  for (int i = 0; i < 1500 && !file_says(log, "writer of b-1.dlr", 0); i++) usleep(10000);
  CHECK(set_complete(p[1], 1) == 0);
  for (int i = 0; i < 1500 && !file_says(log, "writer of c-2.dlr", 0); i++) usleep(10000);
  CHECK(copy_part(good, p[2], size / 2, size) == 0);
  CHECK_EQ(exit_code(pid), 0);
  CHECK(file_says(log, "writer of b-1.dlr", 0) && file_says(log, "writer of c-2.dlr", 0));
  /* Exactly the three good files' rows trained; nothing deleted, no good file moved. */
  char path[2300], *text = NULL;
  cJSON *sum = NULL;
  snprintf(path, sizeof path, "%s/summary.json", run);
  CHECK_OK(dlrec_json_read(path, &sum));
  uint64_t steps = 0, samples = 0, rejected = 0;
  CHECK_OK(dlrec_json_get_u64(sum, "steps", "summary", &steps));
  CHECK_OK(dlrec_json_get_u64(sum, "samples", "summary", &samples));
  CHECK_OK(dlrec_json_get_u64(sum, "files_rejected", "summary", &rejected));
  CHECK_EQ_U64(steps, 80);
  CHECK_EQ_U64(samples, 4 * 2560);
  CHECK_EQ_U64(rejected, 4);
  cJSON_Delete(sum);
  snprintf(path, sizeof path, "%s/metrics.jsonl", run);
  CHECK(file_says(path, "\"step\":80,", 1) && file_says(path, "\"files_rejected\":4,", 1));
  for (int i = 0; i < 8; i++) {
    const int rejected = i >= 3 && i <= 6;
    snprintf(path, sizeof path, "%s/.rejected/%s", dir, names[i]);
    CHECK_EQ(lstat(p[i], &st) == 0, !rejected);
    CHECK_EQ(lstat(path, &st) == 0, rejected);
  }
  const char *why[] = {"d-3.dlr: row group ", "e-4.dlr: not a .dlr file", "f-5.dlr: not a .dlr file",
                       "g-6.dlr: incomplete after 1 s"};
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/.rejected/%s.reason", dir, names[i + 3]);
    CHECK(file_says(path, why[i], 0));
  }
  snprintf(path, sizeof path, "%s/.rejected/d-3.dlr.reason", dir);
  CHECK(file_says(path, "checksum mismatch", 0));
  snprintf(path, sizeof path, "%s/.rejected/f-5.dlr", dir);
  char target[2048] = "";
  CHECK(readlink(path, target, sizeof target - 1) > 0 && strcmp(target, junk) == 0);
  CHECK(file_says(junk, "junk", 0));
  int entries = 0;
  snprintf(path, sizeof path, "%s/.rejected", dir);
  DIR *d = opendir(path);
  for (struct dirent *e; d && (e = readdir(d));) entries += e->d_name[0] != '.';
  if (d) closedir(d);
  CHECK_EQ(entries, 8); /* 4 files, 4 reasons */
  /* --follow-strict: a corrupt file stops the run, named, and stays. */
  snprintf(dir, sizeof dir, "%s", test_path("strict-in"));
  CHECK(mkdir(dir, 0755) == 0);
  snprintf(path, sizeof path, "%s/c.dlr", dir);
  CHECK_OK(dlrec_copy_file(good, path));
  flip_byte(path, (long)size / 2);
  int rc = test_run_cli(&text, "train -q --config '%s' --follow '%s' --follow-idle 0.3 --follow-strict --etl '%s' "
                        "--out '%s'", test_path("cfg.json"), dir, test_path("etl"), test_path("strict"));
  CHECK(rc == 1 && text && strstr(text, "c.dlr: row group") && strstr(text, "checksum mismatch"));
  free(text);
  CHECK(stat(path, &st) == 0);
  snprintf(path, sizeof path, "%s/.rejected", dir);
  CHECK(stat(path, &st) != 0);
}

/* The final validation AUC of a run's summary in `out` (NAN if absent). */
static double summary_auc(const char *out) {
  const char *v = out ? strstr(out, "\"valid\"") : NULL;
  const char *a = v ? strstr(v, "\"auc\":") : NULL;
  return a ? strtod(a + 6, NULL) : NAN;
}

/* Raw keys end to end: ETL without vocabularies, a hash table smaller than
 * the keys (admission at the second sighting, LRU eviction, expiry), the
 * keys' counters in metrics.jsonl, a resume bitwise equal to the straight
 * run, predict on raw rows equal to predict on the encoded rows and within
 * a stated distance of the vocabulary run's AUC; the two kinds of data and
 * tables do not mix. */
TEST(hash_table_trains_on_raw_keys_end_to_end) {
  CHECK(make_data(20000) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit -q --input '%s' --out '%s' --raw-keys && '%s' etl apply -q --etl '%s' --input '%s' "
                        "--out '%s' --valid-fraction 0.2 --valid-out '%s' --seed 1",
                        test_path("clicks.tsv"), test_path("ketl"), getenv("DLREC_BIN"), test_path("ketl"),
                        test_path("clicks.tsv"), test_path("ktrain.dlr"), test_path("kvalid.dlr"));
  CHECK_EQ(rc, 0);
  free(out);
  /* Checkpoints journal the rows changed since the first (fraction 1). */
  CHECK(write_config_with("\"storage\": {\"kind\": \"hash\", \"cache_rows\": 12000, \"admit_min_count\": 2, "
                          "\"ttl_steps\": 100}, \"checkpoint\": {\"interval_steps\": 10, \"keep\": 3, "
                          "\"journal_max_fraction\": 1}") == 0);
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s' --max-steps 180",
                    test_path("cfg.json"), test_path("ktrain.dlr"), test_path("kvalid.dlr"), test_path("ketl"),
                    test_path("hash"));
  CHECK_EQ(rc, 0);
  const double hash_auc = summary_auc(out);
  free(out);
  /* Keys were admitted, kept out until their second sighting, evicted. */
  CHECK(last_storage_counter("hash", "admitted") > 12000);
  CHECK(last_storage_counter("hash", "not_admitted") > 0);
  CHECK(last_storage_counter("hash", "evictions") > 0);
  CHECK(last_storage_counter("hash", "dropped") == 0);
  /* Resumed: the same bits, the table's bookkeeping included. */
  CHECK(train_files("resumed", "ktrain.dlr", "ketl", "--max-steps 95") == 0);
  CHECK(train_files("resumed", "ktrain.dlr", "ketl", "--max-steps 180 --resume") == 0);
  CHECK(same_checkpoint("hash", "resumed", 180));
  const char *more[] = {"hash.bin", "journal.bin", "journal_optim.bin"};
  for (int i = 0; i < 3; i++) {
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/ckpt-000000000180/%s", test_path("hash"), more[i]);
    snprintf(b, sizeof b, "%s/ckpt-000000000180/%s", test_path("resumed"), more[i]);
    CHECK(files_equal(a, b)); /* files_equal fails on a missing file: these are journals */
  }
  /* On a device (cpu-mirror, as a GPU) the hash table stays in host memory
   * and trains the bits of one CPU thread's run, its bookkeeping included. */
  CHECK(train_files("hash1", "ktrain.dlr", "ketl", "--threads 1 --max-steps 60") == 0);
  CHECK(train_files("hash_dev", "ktrain.dlr", "ketl", "--device cpu-mirror --threads 1 --max-steps 60") == 0);
  CHECK(same_checkpoint("hash1", "hash_dev", 60));
  for (int i = 0; i < 3; i++) {
    char a[2048], b[2048];
    snprintf(a, sizeof a, "%s/ckpt-000000000060/%s", test_path("hash1"), more[i]);
    snprintf(b, sizeof b, "%s/ckpt-000000000060/%s", test_path("hash_dev"), more[i]);
    CHECK(files_equal(a, b));
  }
  /* And scores there, raw rows through the table on the host, the CPU's bits. */
  rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s' && '%s' predict -q --device cpu-mirror "
                    "--model '%s' --input '%s' --out '%s'", test_path("hash_dev"), test_path("clicks.tsv"),
                    test_path("p_cpu.txt"), getenv("DLREC_BIN"), test_path("hash_dev"), test_path("clicks.tsv"),
                    test_path("p_dev.txt"));
  CHECK_EQ(rc, 0);
  free(out);
  CHECK(files_equal(test_path("p_cpu.txt"), test_path("p_dev.txt")));
  /* Learning: the vocabulary run's AUC, less a stated margin (the hash
   * table admits a key at its second sighting, so it learns nothing of the
   * keys seen once, which the vocabulary maps to the shared OOV row). */
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s' --max-steps 180",
                    test_path("cfg.json"), test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"),
                    test_path("vocab"));
  CHECK_EQ(rc, 0);
  const double vocab_auc = summary_auc(out);
  free(out);
  fprintf(stderr, "valid AUC: hash table on raw keys %.4f, vocabulary %.4f\n", hash_auc, vocab_auc);
  CHECK(hash_auc > 0.6 && hash_auc > vocab_auc - 0.02);
  /* Scoring: raw rows and their encoded .dlr give the same bits. */
  char clicks[2048], all[2048], raw[2048], enc[2048];
  snprintf(clicks, sizeof clicks, "%s", test_path("clicks.tsv"));
  snprintf(all, sizeof all, "%s", test_path("kall.dlr"));
  snprintf(raw, sizeof raw, "%s", test_path("p_raw.txt"));
  snprintf(enc, sizeof enc, "%s", test_path("p_dlr.txt"));
  rc = test_run_cli(&out, "etl apply -q --etl '%s' --input '%s' --out '%s'", test_path("ketl"), clicks, all);
  CHECK_EQ(rc, 0);
  free(out);
  rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s'", test_path("hash"), clicks, raw);
  CHECK_EQ(rc, 0);
  free(out);
  rc = test_run_cli(&out, "predict -q --model '%s' --input '%s' --out '%s'", test_path("hash"), all, enc);
  CHECK_EQ(rc, 0);
  free(out);
  CHECK(files_equal(raw, enc));
  /* Scoring leaves keys without a row out, counts them, and admits none. */
  dlrec_model *m = NULL;
  CHECK_OK(dlrec_model_load(test_path("hash"), &m));
  if (m) {
    dlrec_store *st = dlrec_net_store(m->net);
    const dlrec_schema *sc = dlrec_net_schema(m->net);
    uint64_t known = 0;
    for (uint32_t r = 0; r < 12000 && !dlrec_store_key_of(st, r, &known); r++) {}
    dlrec_store_stats before, after;
    dlrec_store_get_stats(st, &before);
    float dense[13] = {0}, prob;
    uint32_t offs[26][2], words[26][2];
    dlrec_batch bt = {.rows = 1, .dense = dense};
    for (uint32_t c = 0; c < sc->n_sparse; c++) {
      const uint64_t k = c == 0 ? known : 0x5eed0000ull + c; /* column 0's key is in the table */
      words[c][0] = (uint32_t)k, words[c][1] = (uint32_t)(k >> 32);
      offs[c][0] = 0, offs[c][1] = 2;
      bt.offsets[c] = offs[c], bt.ids[c] = words[c];
    }
    dlrec_net_ws *ws = NULL;
    dlrec_net_scorer *scorer = NULL;
    CHECK_OK(dlrec_net_ws_create(&ws, m->net, 4));
    CHECK_OK(dlrec_net_scorer_create(&scorer, m->net));
    if (ws && scorer) CHECK_OK(dlrec_net_predict(scorer, ws, &bt, &prob));
    CHECK_EQ_U64(dlrec_net_ws_keys_missing(ws), 25);
    dlrec_store_get_stats(st, &after);
    CHECK_EQ_U64(after.admitted, before.admitted);
    CHECK_EQ_U64(after.resident, before.resident);
    dlrec_net_scorer_free(scorer);
    dlrec_net_ws_free(ws);
    dlrec_model_free(m);
  }
  /* The server scores raw features as predict does. */
  CHECK(rename(test_path("hash"), test_path("run")) == 0);
  check_served_equals_predict(test_tmpdir(), "dlrm");
  /* Keys and ids do not mix. */
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 2",
                    test_path("cfg.json"), test_path("ktrain.dlr"), test_path("ketl"), test_path("mixed1"));
  CHECK(rc != 0 && out && strstr(out, "need storage.kind \"hash\""));
  free(out);
  CHECK(write_config_with("\"storage\": {\"kind\": \"hash\", \"cache_rows\": 100}, "
                          "\"checkpoint\": {\"interval_steps\": 10, \"keep\": 3}") == 0);
  rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 2",
                    test_path("cfg.json"), test_path("train.dlr"), test_path("etl"), test_path("mixed2"));
  CHECK(rc != 0 && out && strstr(out, "--raw-keys"));
  free(out);
}

/* Whether /proc/self/maps has a mapping of a file whose path contains s. */
static int mapped_here(const char *s) {
  FILE *f = fopen("/proc/self/maps", "r"); /* its size reads as 0: read it line by line */
  if (!f) return -1;
  char line[4096 + 128];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, s) != NULL;
  fclose(f);
  return found;
}

/* A model-only load maps table.bin instead of reading it into memory (so a
 * table larger than RAM can be scored from the page cache), and scores
 * what the training run's own evaluation scored. */
TEST(model_load_maps_the_table_and_scores_as_training_did) {
  CHECK(make_data(8000) == 0);
  CHECK(test_write_file(test_path("cfg.json"), CONFIG, (size_t)-1) == 0);
  char *out = NULL;
  int rc = test_run_cli(&out, "train -q --config '%s' --train '%s' --valid '%s' --etl '%s' --out '%s' --max-steps 40",
                        test_path("cfg.json"), test_path("train.dlr"), test_path("valid.dlr"), test_path("etl"),
                        test_path("mapped"));
  CHECK(rc == 0 && out);
  cJSON *trained = cJSON_Parse(strchr(out, '{'));
  free(out);
  const cJSON *tv = cJSON_GetObjectItemCaseSensitive(trained, "valid");
  double train_auc = cJSON_GetObjectItemCaseSensitive(tv, "auc") ? cJSON_GetObjectItemCaseSensitive(tv, "auc")->valuedouble : -1;
  cJSON_Delete(trained);
  CHECK(train_auc > 0);
  char ckpt[2048];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-000000000040/table.bin", test_path("mapped"));
  CHECK_EQ(mapped_here(ckpt), 0);
  dlrec_model *m = NULL;
  CHECK_OK(dlrec_model_load(test_path("mapped"), &m));
  CHECK_EQ(mapped_here(ckpt), 1);
  const char *paths[] = {test_path("valid.dlr")};
  dlrec_metrics met;
  CHECK_OK(dlrec_evaluate(m->net, paths, 1, 4096, 0, &met));
  /* Equal as far as the summary's JSON prints (15 significant digits). */
  CHECK_NEAR(met.auc, train_auc, 1e-13, 0);
  dlrec_model_free(m);
  CHECK_EQ(mapped_here(ckpt), 0);
  /* Another checkpoint's table.bin is a sound tensor file of the right shape:
   * only the manifest's CRC32C tells it is not this checkpoint's. */
  char other[2048];
  snprintf(other, sizeof other, "%s/ckpt-000000000030/table.bin", test_path("mapped"));
  CHECK_OK(dlrec_copy_file(other, ckpt));
  CHECK_ERR(dlrec_model_load(test_path("mapped"), &m), DLREC_ERR_CORRUPT, "the manifest says");
  CHECK_EQ(mapped_here(ckpt), 0);
}

/* model.embedding_init drew the rows a checkpoint holds, so a resume with
 * another one is accepted; a hash table draws each new key's row with it,
 * so there the change is refused, naming the field. A column the data
 * lacks is refused before training. */
TEST(resume_refuses_another_initializer_only_on_a_hash_table) {
  CHECK(make_data(4000) == 0);
  char cfg[2048], cmd[8192];
  CHECK(replace_first(cfg, sizeof cfg, CONFIG, "\"top_mlp\": [32, 1]",
                      "\"top_mlp\": [32, 1], \"embedding_init\": {\"type\": \"normal\", \"std\": 0.0001}") == 0);
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  CHECK(train("run", "--max-steps 5") == 0);
  CHECK(replace_first(cfg, sizeof cfg, CONFIG, "\"top_mlp\": [32, 1]", "\"top_mlp\": [32, 1], \"embedding_init\": \"zeros\"") == 0);
  CHECK(test_write_file(test_path("cfg.json"), cfg, (size_t)-1) == 0);
  CHECK(train("run", "--resume --max-steps 10") == 0);
  CHECK(replace_first(cfg, sizeof cfg, CONFIG, "\"top_mlp\": [32, 1]",
                      "\"top_mlp\": [32, 1], \"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"nope\": \"zeros\"}}") == 0);
  CHECK(test_write_file(test_path("cfg2.json"), cfg, (size_t)-1) == 0);
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --max-steps 10",
           test_path("cfg2.json"), test_path("train.dlr"), test_path("etl"), test_path("run2"));
  CHECK(refused_with(cmd, "model.embedding_init.columns: 'nope' is not a categorical column", "dlrec inspect"));

  char *out = NULL;
  int rc = test_run_cli(&out, "etl fit -q --input '%s' --out '%s' --raw-keys && '%s' etl apply -q --etl '%s' --input '%s' "
                        "--out '%s'",
                        test_path("clicks.tsv"), test_path("ketl"), getenv("DLREC_BIN"), test_path("ketl"),
                        test_path("clicks.tsv"), test_path("ktrain.dlr"));
  CHECK_EQ(rc, 0);
  free(out);
  const char *hash = "\"storage\": {\"kind\": \"hash\", \"cache_rows\": 4000}";
  CHECK(write_config_with(hash) == 0);
  CHECK(train_files("hash", "ktrain.dlr", "ketl", "--max-steps 5") == 0);
  CHECK(replace_first(cfg, sizeof cfg, CONFIG, "\"top_mlp\": [32, 1]", "\"top_mlp\": [32, 1], \"embedding_init\": \"zeros\"") == 0);
  cfg[strlen(cfg) - 1] = '\0';
  char full[4096];
  snprintf(full, sizeof full, "%s, %s}", cfg, hash);
  CHECK(test_write_file(test_path("cfg2.json"), full, (size_t)-1) == 0);
  snprintf(cmd, sizeof cmd, "train -q --config '%s' --train '%s' --etl '%s' --out '%s' --resume --max-steps 10",
           test_path("cfg2.json"), test_path("ktrain.dlr"), test_path("ketl"), test_path("hash"));
  CHECK(refused_with(cmd, "'model.embedding_init' differs", "cannot resume"));
}
