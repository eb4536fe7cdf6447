/* `dlrec inspect` (placeholder until implemented). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_inspect(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "dlrec inspect: not implemented yet\n");
  return 1;
}
