/* `dlrec etl` (placeholder until implemented). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_etl(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "dlrec etl: not implemented yet\n");
  return 1;
}
