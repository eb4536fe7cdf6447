/* `dlrec`: one program for ETL, training, evaluation and serving of
 * recommendation models. Dispatches to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "backend/backend.h"
#include "core/log.h"

#ifndef DLREC_VERSION
#define DLREC_VERSION "dev"
#endif

static const struct {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
} commands[] = {
    {"synth", cmd_synth, "write synthetic click logs (Criteo layout) with known click probabilities"},
    {"etl", cmd_etl, "fit vocabularies and statistics on raw rows; encode rows into .dlr files"},
    {"inspect", cmd_inspect, "print a .dlr file's schema and row groups and verify every checksum"},
    {"train", cmd_train, "train a model (docs/config.md) on .dlr files, with evaluation and resumable checkpoints"},
    {"eval", cmd_eval, "print AUC, logloss, NE and calibration of a trained model on .dlr data"},
    {"report", cmd_report, "write a training run's report: curves, calibration, time, data, config (HTML)"},
    {"predict", cmd_predict, "score raw rows or .dlr files with a trained model, in input order"},
    {"export", cmd_export, "write a trained model as an ONNX graph (every model type)"},
    {"serve", cmd_serve, "serve a trained model over HTTP (KServe v2 / Triton protocol)"},
    {"options", cmd_options, "print the option reference of the training config or of etl (Markdown)"},
    {"models", cmd_models, "list the model types a config's model.type names (--json: with their test configs)"},
};

static void usage(FILE *out) {
  fprintf(out,
          "dlrec %s: deep-learning recommendation models, from click logs to served predictions\n\n"
          "usage: dlrec [-q|-v] COMMAND [options]   (dlrec COMMAND --help for a command's options)\n\n"
          "commands:\n",
          DLREC_VERSION);
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fprintf(out,
          "  %-10s print the version and what each backend finds (cores and GEMM engines, GPUs)\n\n"
          "Every command takes -q/--quiet (no progress bars) and -v/--verbose (debug logs),\n"
          "before or after the command's name.\n"
          "Environment: DLREC_LOG=debug|info|warn|error, DLREC_PROGRESS=0; OpenMP's own\n"
          "(OMP_NUM_THREADS; OMP_WAIT_POLICY: PASSIVE unless it or GOMP_SPINCOUNT is set);\n"
          "DLREC_FP32_GEMM=openblas|onednn: what runs fp32 GEMMs on the CPU (default: oneDNN\n"
          "where the CPU has AVX-512, else OpenBLAS; docs/config.md).\n",
          "version");
}

/* How OpenMP's idle workers wait: passively (they sleep at once), unless
 * the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT, which then win, and make
 * dlrec leave both alone (so bench/threads.sh can measure any spin count).
 * Measured with bench/threads.sh (2 shared cores, AMD EPYC,
 * examples/dlrm_synth.json, 2 threads, medians of 3, samples/s alone and
 * beside one CPU-bound process), with training steps split across the
 * threads (one parallel region per step):
 *   batch  128: PASSIVE 38.7k, 19.6k; ACTIVE 37.2k, 12.5k;
 *   batch 2048: PASSIVE 47.5k, 26.6k; ACTIVE 49.7k, 20.5k;
 * spinning gains little alone now that a step has few regions, and loses a
 * third beside a competitor, since a spinning worker takes the core that
 * the thread it waits for needs (before the split, at about 50 regions a
 * step, spinning ran 3 to 30 times slower there). libgomp reads the
 * variables when it is loaded, before main, so dlrec sets OMP_WAIT_POLICY
 * and re-executes itself once. */
static void default_omp_wait(char **argv) {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
  /* No /proc: go on with libgomp's own default. */
}

int main(int argc, char **argv) {
  default_omp_wait(argv);
  /* The options every command takes may come before the command too, as
   * git's do: `dlrec -q etl fit ...`. */
  int first = 1;
  while (first < argc && cli_common_option(argv[first])) first++;
  /* What libgomp was given, so that `dlrec -v ...` shows how idle workers
   * wait (and tests can check the default above). */
  const char *wait = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
  DLREC_DEBUG("OpenMP waiting: OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s", wait ? wait : "(unset)", spin ? spin : "(unset)");
  if (first >= argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[first];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
    /* The first line alone is the version (scripts cut it); then what
     * each backend finds on this machine, for --device. */
    printf("dlrec %s\n", DLREC_VERSION);
    static const char *const backends[] = {"cpu", "cuda"};
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
      char devices[1024];
      dlrec_backend_devices(backends[i], devices, sizeof devices);
      printf("  %-5s %s\n", backends[i], devices);
    }
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - first, argv + first);
  fprintf(stderr, "dlrec: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
