/* `dlrec report RUN`: (re)builds RUN/report.html (train/report.h) from what
 * the run wrote, and prints the file's path. Training writes the report at
 * its end; this rebuilds it, of a run still going too. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "train/report.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec report RUN [--out FILE] [-q] [-v]\n\n"
          "Writes the training report of the run directory RUN: one self-contained HTML\n"
          "file (no network, plots as inline SVG) with the loss and AUC curves of the\n"
          "training and validation rows, the last validation's calibration (reliability)\n"
          "curve, the throughput of each logging interval, where the training steps spent\n"
          "their time, the data summary (rows, columns, vocabulary sizes, missing rates)\n"
          "and the config. It reads RUN/metrics.jsonl, RUN/summary.json and RUN/latest's\n"
          "checkpoint; a part not there yet is said so in its place. `dlrec train`\n"
          "writes the same report when it ends.\n\n"
          "options:\n"
          "  --out FILE  write the report there (default: RUN/report.html)\n"
          "  -q          warnings only           -v  debug logs\n\n"
          "exit status: 0 written (its path on stdout); 1 RUN has no readable\n"
          "metrics.jsonl or the file cannot be written; 2 bad usage.\n");
}

int cmd_report(int argc, char **argv) {
  static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                       {"help", no_argument, 0, 'h'},
                                       {"quiet", no_argument, 0, 'q'},
                                       {"verbose", no_argument, 0, 'v'},
                                       {0, 0, 0, 0}};
  const char *out = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "o:hqv", opts, NULL)) != -1) {
    switch (c) {
    case 'o': out = optarg; break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("report", "unknown option");
    }
  }
  if (optind >= argc) return cli_usage_error("report", "the run directory is required (dlrec report RUN)");
  if (optind + 1 < argc) return cli_usage_error("report", "unexpected argument '%s'", argv[optind + 1]);
  const char *run = argv[optind];
  if (dlrec_report_write(run, out) != DLREC_OK) return cli_fail("report");
  if (out)
    printf("%s\n", out);
  else
    printf("%s/report.html\n", run);
  return 0;
}
