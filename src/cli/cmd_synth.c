/* `dlrec synth` (placeholder until implemented). */
#include <stdio.h>

#include "cli/cli.h"

int cmd_synth(int argc, char **argv) {
  (void)argc;
  (void)argv;
  fprintf(stderr, "dlrec synth: not implemented yet\n");
  return 1;
}
