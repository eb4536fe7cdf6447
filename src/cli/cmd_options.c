/* `dlrec options config|etl`: the option reference of the training config
 * or of etl fit and apply, printed from their option tables as the Markdown
 * tables of docs/config.md and docs/etl.md (the tests compare the docs with
 * it, so a changed option shows as a stale doc until the doc is rewritten
 * from this). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/etl.h"
#include "train/train_config.h"

static void usage_options(FILE *out) {
  fprintf(out,
          "usage: dlrec options config|etl\n"
          "\n"
          "Prints an option reference as a Markdown table, from the table the options\n"
          "are read with:\n"
          "  config   the training config's keys (docs/config.md, \"Option reference\")\n"
          "  etl      the options of etl fit and etl apply, as flags and as host API keys\n"
          "           (docs/etl.md, \"Option reference\")\n");
}

int cmd_options(int argc, char **argv) {
  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    usage_options(stdout);
    return 0;
  }
  if (argc != 2 || (strcmp(argv[1], "config") && strcmp(argv[1], "etl"))) {
    usage_options(stderr);
    return 2;
  }
  char *text = !strcmp(argv[1], "config") ? dlrec_train_config_reference() : dlrec_etl_options_reference();
  if (!text) return cli_usage_error("options", "out of memory");
  fputs(text, stdout);
  free(text);
  return 0;
}
