/* `dlrec eval`: metrics of a trained model on labeled .dlr data. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "backend/backend.h"
#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "core/json.h"
#include "train/trainer.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec eval --model RUN --data V.dlr [--checkpoint latest|best] [--batch N] [--max-rows N]\n"
          "                  [--threads N] [--device D]\n\n"
          "Prints AUC, logloss, normalized entropy and calibration of the model on the data\n"
          "as one JSON object. RUN is a run directory (its latest checkpoint) or a checkpoint.\n\n"
          "  --checkpoint WHICH  latest (default) or best: RUN/best, the checkpoint of the best\n"
          "                      validation of a run trained with checkpoint.keep_best\n"
          "  --threads N         compute threads (default: all cores); scores do not depend on it\n"
          "  --device D          cpu (default), cuda or cuda:N: where the model scores\n");
}

int cmd_eval(int argc, char **argv) {
  static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"data", required_argument, 0, 'd'},
                                       {"batch", required_argument, 0, 'b'}, {"max-rows", required_argument, 0, 'n'},
                                       {"threads", required_argument, 0, 'j'}, {"help", no_argument, 0, 'h'},
                                       {"checkpoint", required_argument, 0, 'c'}, {"device", required_argument, 0, 'D'},
                                       {"quiet", no_argument, 0, 'q'}, {"verbose", no_argument, 0, 'v'},
                                       {0, 0, 0, 0}};
  const char *model = NULL, *data = NULL, *which = NULL, *device = NULL;
  uint64_t batch = 4096, max_rows = 0, threads = 0;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hqv", opts, NULL)) != -1) {
    dlrec_status s = DLREC_OK;
    switch (c) {
    case 'm': model = optarg; break;
    case 'd': data = optarg; break;
    case 'c': which = optarg; break;
    case 'b': s = cli_parse_u64("--batch", optarg, 1, 1u << 20, &batch); break;
    case 'n': s = cli_parse_u64("--max-rows", optarg, 1, UINT64_MAX, &max_rows); break;
    case 'j': s = cli_parse_u64("--threads", optarg, 1, 4096, &threads); break;
    case 'D': s = cli_parse_device(optarg, &device); break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("eval", "unknown option");
    }
    if (s != DLREC_OK) return cli_usage_error("eval", "%s", dlrec_last_error());
  }
  if (optind < argc) return cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
  if (!model || !data) return cli_usage_error("eval", "--model and --data are required");
  char dir[4096];
  if (dlrec_checkpoint_select(model, which, dir, sizeof dir) != DLREC_OK) return cli_fail("eval");
  /* Scoring runs fp32 in every precision (backend/backend.h): only the
   * device and threads are the user's to choose. */
  dlrec_backend_config bc = {(uint32_t)threads, DLREC_PRECISION_FP32, 0};
  dlrec_backend *be;
  if (dlrec_backend_create_on(&be, device, &bc) != DLREC_OK) return cli_fail("eval");
  dlrec_model *m;
  if (dlrec_model_load(dir, &m) != DLREC_OK) {
    dlrec_backend_free(be);
    return cli_fail("eval");
  }
  dlrec_metrics met;
  const char *paths[] = {data};
  dlrec_status s = dlrec_model_set_backend(m, be);
  if (s == DLREC_OK) s = dlrec_evaluate(m->net, paths, 1, (uint32_t)batch, max_rows, &met);
  dlrec_model_free(m);
  dlrec_backend_free(be);
  if (s != DLREC_OK) return cli_fail("eval");
  cJSON *j = dlrec_metrics_to_json(&met);
  char *text = cJSON_Print(j);
  printf("%s\n", text ? text : "{}");
  cJSON_free(text);
  cJSON_Delete(j);
  return 0;
}
