/* `dlrec train`: train a model on .dlr files. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dist/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "train/trainer.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec train --config CFG.json --train T.dlr [--train T2.dlr ...] [--valid V.dlr]\n"
          "                   --etl ETLDIR --out RUN [--resume] [options]\n"
          "       dlrec train --config CFG.json --follow DIR [--follow-idle S] [--follow-wait S]\n"
          "                   [--follow-strict] --etl ETLDIR --out RUN ...\n\n"
          "Trains the config's model.type (default dlrm) on encoded rows (see 'dlrec etl apply')\n"
          "and writes RUN/: checkpoints (RUN/ckpt-STEP, RUN/latest, RUN/best), RUN/metrics.jsonl, and a\n"
          "summary on stdout (JSON).\n\n"
          "  --config FILE       training config (docs/config.md; examples/dlrm_criteo.json);\n"
          "                      without it, the Criteo Kaggle DLRM defaults\n"
          "  --train FILE        training data (.dlr); repeat for several files\n"
          "  --follow DIR        instead of --train: train each .dlr file of DIR once, in name\n"
          "                      order, then wait for the next to appear (name files by time;\n"
          "                      write NAME.dlr.tmp and rename, as 'dlrec etl apply' does); one\n"
          "                      pass per file; eval.every_epoch validates after each file\n"
          "  --follow-idle S     with --follow: stop after S seconds without a new file\n"
          "                      (default: wait until SIGINT/SIGTERM or --max-steps)\n"
          "  --follow-wait S     with --follow: wait up to S seconds (default 300) for a file\n"
          "                      whose header's complete flag is not yet set, or that is shorter\n"
          "                      than its header says (its writer or copy is still at it). Each\n"
          "                      file is checked whole before it is trained, and a bad one\n"
          "                      (corrupt, not .dlr, another encoding, a symlink to junk, still\n"
          "                      incomplete after S) is moved into DIR/.rejected/ with\n"
          "                      NAME.reason saying why; training goes on, and metrics.jsonl's\n"
          "                      files_rejected counts them\n"
          "  --follow-strict     with --follow: a bad file stops the run (exit 1) and stays where\n"
          "                      it is\n"
          "  --valid FILE        validation data (.dlr): AUC, logloss, NE, calibration at the\n"
          "                      config's eval interval, after each epoch with eval.every_epoch,\n"
          "                      and at the end; early stopping, the lr plateau and RUN/best\n"
          "                      (checkpoint.keep_best) act on these validations\n"
          "  --etl DIR           the ETL state the data was encoded with (copied into checkpoints)\n"
          "  --out RUN           the run directory; one training run at a time holds it (RUN/lock\n"
          "                      names the holder's pid)\n"
          "  --resume            continue from RUN's latest checkpoint, exactly where it stopped\n"
          "                      (the config's model, optimizers, batch size, seed and loader, and\n"
          "                      the encoding of --etl, must be those of the checkpoint); a damaged\n"
          "                      latest checkpoint is skipped, loudly, for the newest one that loads\n"
          "  --deterministic     bitwise reproducible: same config and threads, same parameters\n"
          "  --threads N         compute threads (default: the config's, 0 = all cores)\n"
          "  --device D          cpu, cuda or cuda:N (default: the config's training.device,\n"
          "                      cpu); 'dlrec version' lists the GPUs this build finds\n"
          "  --max-steps N       stop after N steps in all (default: the config's)\n"
          "  --plan, --dry-run   print how the embedding table is sharded over the job's ranks\n"
          "                      and each rank's memory (table, dense parameters, step buffers,\n"
          "                      activations and workspaces), then exit (no training; needs only\n"
          "                      --config and --etl; --threads and --device change the plan)\n"
          "  --ranks N           with --plan: plan for N ranks (default: the job's)\n"
          "  -q, --quiet         no progress bar\n"
          "  -v, --verbose       debug logs\n\n"
          "Across processes and machines: mpirun -np N dlrec train ... (docs/distributed.md).\n"
          "Each rank trains on its part of every batch, with its shard of the table; the\n"
          "dense gradients are summed over the ranks, and rank 0 alone writes RUN/.\n"
          "Checkpoints are those of one process: any number of ranks resumes them.\n\n"
          "SIGINT or SIGTERM stops after the current step and saves a checkpoint.\n\n"
          "Model types (model.type; 'dlrec models', docs/config.md#model-types):\n");
  for (size_t i = 0; dlrec_net_type_name(i); i++) fprintf(out, "  %-10s %s\n", dlrec_net_type_name(i), dlrec_net_type_doc(i));
}

/* SIGINT and SIGTERM ask the run to stop after its current step (with a
 * checkpoint): the library polls the flag (dlrec_train_args.stop). */
static volatile int g_stop;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

/* The arguments into *a (the --train paths into train), --plan and --ranks;
 * -1 when they are good, else the exit code (0 for --help). */
static int parse_args(int argc, char **argv, dlrec_train_args *a, const char **train, int *plan, int *ranks) {
  static const struct option opts[] = {
      {"config", required_argument, 0, 'c'}, {"train", required_argument, 0, 't'},
      {"valid", required_argument, 0, 'V'},  {"etl", required_argument, 0, 'e'},
      {"out", required_argument, 0, 'o'},    {"resume", no_argument, 0, 'r'},
      {"deterministic", no_argument, 0, 'd'}, {"threads", required_argument, 0, 'j'},
      {"max-steps", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'},
      {"quiet", no_argument, 0, 'q'},        {"verbose", no_argument, 0, 'v'},
      {"follow", required_argument, 0, 'F'}, {"follow-idle", required_argument, 0, 'I'},
      {"plan", no_argument, 0, 'P'},         {"ranks", required_argument, 0, 'R'},
      {"device", required_argument, 0, 'D'}, {"dry-run", no_argument, 0, 'P'},
      {"follow-wait", required_argument, 0, 'W'}, {"follow-strict", no_argument, 0, 'X'},
      {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hqv", opts, NULL)) != -1) {
    uint64_t v;
    switch (c) {
    case 'c': a->config_path = optarg; break;
    case 't':
      if (a->n_train == 64) return cli_usage_error("train", "at most 64 --train files");
      train[a->n_train++] = optarg;
      break;
    case 'V': a->valid = optarg; break;
    case 'F': a->follow_dir = optarg; break;
    case 'I':
    case 'W': {
      char *end;
      errno = 0;
      const double sec = strtod(optarg, &end);
      if (end == optarg || *end || errno || !(sec > 0 && sec <= 1e9))
        return cli_usage_error("train", "--follow-%s: '%s' is not a number of seconds in (0, 1e9]",
                               c == 'I' ? "idle" : "wait", optarg);
      *(c == 'I' ? &a->follow_idle : &a->follow_wait) = sec;
      break;
    }
    case 'X': a->follow_strict = 1; break;
    case 'e': a->etl_dir = optarg; break;
    case 'o': a->run_dir = optarg; break;
    case 'r': a->resume = 1; break;
    case 'd': a->deterministic = 1; break;
    case 'j':
      if (cli_parse_u64("--threads", optarg, 1, 4096, &v) != DLREC_OK) return cli_usage_error("train", "%s", dlrec_last_error());
      a->threads = (uint32_t)v;
      break;
    case 'D':
      if (cli_parse_device(optarg, &a->device) != DLREC_OK) return cli_usage_error("train", "%s", dlrec_last_error());
      break;
    case 's':
      if (cli_parse_u64("--max-steps", optarg, 1, UINT64_MAX, &v) != DLREC_OK)
        return cli_usage_error("train", "%s", dlrec_last_error());
      a->max_steps = v;
      break;
    case 'P': *plan = 1; break;
    case 'R':
      if (cli_parse_u64("--ranks", optarg, 1, 1024, &v) != DLREC_OK) return cli_usage_error("train", "%s", dlrec_last_error());
      *ranks = (int)v;
      break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("train", "unknown option");
    }
  }
  if (*ranks && !*plan) return cli_usage_error("train", "--ranks goes with --plan");
  if (optind < argc) return cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
  if (*plan && !a->etl_dir) return cli_usage_error("train", "--plan needs --etl (and the --config to plan)");
  if (*plan) return -1;
  if (!a->n_train && !a->follow_dir) return cli_usage_error("train", "--train or --follow is required");
  if (a->n_train && a->follow_dir) return cli_usage_error("train", "--train and --follow do not go together");
  if (a->follow_idle > 0 && !a->follow_dir) return cli_usage_error("train", "--follow-idle needs --follow");
  if ((a->follow_wait > 0 || a->follow_strict) && !a->follow_dir)
    return cli_usage_error("train", "--follow-wait and --follow-strict need --follow");
  if (!a->etl_dir) return cli_usage_error("train", "--etl is required");
  if (!a->run_dir) return cli_usage_error("train", "--out is required");
  return -1;
}

/* --plan: only rank 0 prints; the plan needs the config and the ETL state alone. */
static int print_plan(const dlrec_train_args *a, int ranks) {
  dlrec_comm *comm = NULL;
  if (dlrec_comm_open(&comm) != DLREC_OK) return cli_fail("train");
  const int n = ranks ? ranks : dlrec_comm_size(comm);
  dlrec_status s = dlrec_comm_rank(comm) == 0 ? dlrec_train_print_plan(a, n, stdout) : DLREC_OK;
  dlrec_comm_free(comm);
  return s == DLREC_OK ? 0 : cli_fail("train");
}

int cmd_train(int argc, char **argv) {
  dlrec_train_args a = {0};
  int plan = 0, ranks = 0;
  const char *train[64];
  const int code = parse_args(argc, argv, &a, train, &plan, &ranks);
  if (code >= 0) return code;
  if (plan) return print_plan(&a, ranks);
  a.train = train;
  /* The job's ranks: MPI's when mpirun started this process, else this one. */
  dlrec_comm *comm = NULL;
  if (dlrec_comm_open(&comm) != DLREC_OK) return cli_fail("train");
  const int rank = dlrec_comm_rank(comm);
  a.comm = comm;
  /* One voice: the other ranks log only warnings and errors (or all with -v). */
  if (rank != 0 && dlrec_log_get_level() == DLREC_LOG_INFO) dlrec_log_set_level(DLREC_LOG_WARN);
  dlrec_train_result r;
  struct sigaction sa = {0}, old_int, old_term;
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  a.stop = &g_stop;
  dlrec_status ts = dlrec_train(&a, &r);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  /* Every rank reports (rank 0 its result, any rank its error), then the
   * ranks meet before they leave, on either path, so that none waits for
   * one gone: a rank that left first with 130 after a signal made mpirun
   * abort the job, which could cut rank 0's report (tests/dist/run.sh saw
   * it once under load). A failed barrier leaves nothing to wait for. */
  if (ts != DLREC_OK) {
    int fail = cli_fail("train");
    (void)dlrec_comm_barrier(comm);
    dlrec_comm_free(comm);
    return fail;
  }
  if (rank == 0) {
    cJSON *j = dlrec_train_result_to_json(&a, &r);
    char *text = cJSON_Print(j);
    printf("%s\n", text ? text : "{}");
    fflush(stdout);
    cJSON_free(text);
    cJSON_Delete(j);
  }
  (void)dlrec_comm_barrier(comm);
  dlrec_comm_free(comm);
  return r.interrupted ? 130 : 0;
}
