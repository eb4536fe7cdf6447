/* `dlrec models`: the model types this build has (the registry,
 * src/model/registry.c), for people and for scripts: tests/onnx/run.sh and
 * bench/models_vs_torch.sh take their list of types from --json. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "model/model.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec models [--json]\n\n"
          "Lists the model types a config's model.type names (docs/config.md#model-types), one a\n"
          "line: its name and what it is.\n\n"
          "  --json       a JSON array instead, one object per type: \"type\", \"doc\" and \"tests\",\n"
          "               the configs the generic tests build the type from (each a \"model\"\n"
          "               section without its type, and the heavier \"checks\" it joins:\n"
          "               gradients, agreement, kept)\n"
          "  -q, -v       as every command\n");
}

/* The registry as JSON (see usage). */
static cJSON *models_json(void) {
  cJSON *all = cJSON_CreateArray();
  for (size_t i = 0; dlrec_net_type_name(i); i++) {
    cJSON *t = cJSON_CreateObject(), *tests = cJSON_CreateArray();
    cJSON_AddStringToObject(t, "type", dlrec_net_type_name(i));
    cJSON_AddStringToObject(t, "doc", dlrec_net_type_doc(i));
    unsigned checks = 0;
    const char *model;
    for (size_t j = 0; (model = dlrec_net_type_test_config(i, j, &checks)); j++) {
      cJSON *c = cJSON_CreateObject(), *names = cJSON_CreateArray();
      cJSON_AddItemToObject(c, "model", cJSON_Parse(model));
      if (checks & DLREC_NET_TEST_GRADIENTS) cJSON_AddItemToArray(names, cJSON_CreateString("gradients"));
      if (checks & DLREC_NET_TEST_AGREEMENT) cJSON_AddItemToArray(names, cJSON_CreateString("agreement"));
      if (checks & DLREC_NET_TEST_KEPT) cJSON_AddItemToArray(names, cJSON_CreateString("kept"));
      cJSON_AddItemToObject(c, "checks", names);
      cJSON_AddItemToArray(tests, c);
    }
    cJSON_AddItemToObject(t, "tests", tests);
    cJSON_AddItemToArray(all, t);
  }
  return all;
}

int cmd_models(int argc, char **argv) {
  static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                       {"quiet", no_argument, 0, 'q'}, {"verbose", no_argument, 0, 'v'},
                                       {0, 0, 0, 0}};
  int json = 0, c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "jhqv", opts, NULL)) != -1) {
    switch (c) {
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("models", "unknown option");
    }
  }
  if (optind < argc) return cli_usage_error("models", "unexpected argument '%s'", argv[optind]);
  if (!json) {
    for (size_t i = 0; dlrec_net_type_name(i); i++) printf("%-10s %s\n", dlrec_net_type_name(i), dlrec_net_type_doc(i));
    return 0;
  }
  cJSON *all = models_json();
  char *text = all ? cJSON_Print(all) : NULL;
  cJSON_Delete(all);
  if (!text) {
    fprintf(stderr, "dlrec models: out of memory\n");
    return 1;
  }
  printf("%s\n", text);
  free(text);
  return 0;
}
