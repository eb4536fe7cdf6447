/* `dlrec`: one program for ETL, training, evaluation and serving of
 * recommendation models. Dispatches to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

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
    {"train", cmd_train, "train a DLRM on .dlr files, with evaluation and resumable checkpoints"},
    {"eval", cmd_eval, "print AUC, logloss, NE and calibration of a trained model on .dlr data"},
    {"predict", cmd_predict, "score raw rows or .dlr files with a trained model, in input order"},
    {"serve", cmd_serve, "serve a trained model over HTTP (KServe v2 / Triton protocol)"},
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
          "  %-10s print the version\n\n"
          "Every command takes -q/--quiet (no progress bars) and -v/--verbose (debug logs),\n"
          "before or after the command's name.\n"
          "Environment: DLREC_LOG=debug|info|warn|error, DLREC_PROGRESS=0; OpenMP's own\n"
          "(OMP_NUM_THREADS, OMP_WAIT_POLICY: PASSIVE unless set).\n",
          "version");
}

/* OpenMP threads that wait by spinning (libgomp's default spins for a
 * while before sleeping) burn the cores that dlrec's own prefetching and
 * serving threads, or any other process, need: on 2 cores batch-128
 * training ran at 0.79x of the passive policy's speed, and far slower when
 * anything else ran beside it. Passive waiting cost nothing measurable at
 * batch 2048. libgomp reads the variable when it is loaded, before main,
 * so dlrec sets it and re-executes itself once; a user's own setting wins. */
static void default_passive_wait(char **argv) {
  if (getenv("OMP_WAIT_POLICY")) return;
  if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
  /* No /proc: go on with the default policy. */
}

int main(int argc, char **argv) {
  default_passive_wait(argv);
  /* The options every command takes may come before the command too, as
   * git's do: `dlrec -q etl fit ...`. */
  int first = 1;
  while (first < argc && cli_common_option(argv[first])) first++;
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
    printf("dlrec %s\n", DLREC_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(cmd, commands[i].name)) return commands[i].fn(argc - first, argv + first);
  fprintf(stderr, "dlrec: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
