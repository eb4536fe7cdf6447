/* `dlrec predict`: score rows with a trained model. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "backend/backend.h"
#include "train/checkpoint.h"
#include "train/loaded_model.h"
#include "train/predict.h"
#include "train/trainer.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec predict --model RUN --input FILE --out SCORES [--checkpoint latest|best] [--no-label]\n"
          "                     [--strict-fields] [--batch N] [--threads N] [--device D]\n\n"
          "Writes one click probability per input row, in input order, to SCORES ('-' for stdout).\n"
          "FILE is a .dlr file (by its .dlr extension), or raw rows ('-' for stdin) in the format the model's ETL state was\n"
          "fit on (Criteo TSV, CSV with its header, libSVM or libFM; multi-hot columns too), encoded with that state\n"
          "exactly as 'dlrec etl apply' does. RUN is a run directory (its latest checkpoint) or a checkpoint.\n\n"
          "  --checkpoint WHICH  latest (default) or best: RUN/best, the checkpoint of the best\n"
          "                    validation of a run trained with checkpoint.keep_best\n"
          "  --no-label        raw rows have no label column (e.g. Criteo's 39-field test files)\n"
          "  --strict-fields   raw Criteo rows of fewer fields (trailing empty fields stripped,\n"
          "                    or a torn line) are errors; by default they are valid and counted\n"
          "  --threads N       compute threads (default: all cores); scores do not depend on it\n"
          "  --device D        cpu (default), cuda or cuda:N: where the model scores\n");
}

int cmd_predict(int argc, char **argv) {
  static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"input", required_argument, 0, 'i'},
                                       {"out", required_argument, 0, 'o'}, {"no-label", no_argument, 0, 'L'},
                                       {"strict-fields", no_argument, 0, 'S'}, {"checkpoint", required_argument, 0, 'c'},
                                       {"batch", required_argument, 0, 'b'}, {"threads", required_argument, 0, 'j'},
                                       {"device", required_argument, 0, 'D'},
                                       {"help", no_argument, 0, 'h'}, {"quiet", no_argument, 0, 'q'},
                                       {"verbose", no_argument, 0, 'v'}, {0, 0, 0, 0}};
  const char *model = NULL, *input = NULL, *out = NULL, *which = NULL, *device = NULL;
  dlrec_predict_opts o;
  dlrec_predict_opts_default(&o);
  uint64_t batch = o.batch_rows, threads = 0;
  int c, quiet = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hqv", opts, NULL)) != -1) {
    dlrec_status s = DLREC_OK;
    switch (c) {
    case 'm': model = optarg; break;
    case 'i': input = optarg; break;
    case 'c': which = optarg; break;
    case 'o': out = optarg; break;
    case 'L': o.no_label = 1; break;
    case 'S': o.strict_fields = 1; break;
    case 'b': s = cli_parse_u64("--batch", optarg, 1, 1u << 20, &batch); break;
    case 'j': s = cli_parse_u64("--threads", optarg, 1, 4096, &threads); break;
    case 'D': s = cli_parse_device(optarg, &device); break;
    case 'h': usage(stdout); return 0;
    case 'q': quiet = 1; cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("predict", "unknown option");
    }
    if (s != DLREC_OK) return cli_usage_error("predict", "%s", dlrec_last_error());
  }
  if (optind < argc) return cli_usage_error("predict", "unexpected argument '%s'", argv[optind]);
  if (!model || !input || !out) return cli_usage_error("predict", "--model, --input and --out are required");
  o.batch_rows = (uint32_t)batch;
  o.progress = !quiet;
  char dir[4096];
  if (dlrec_checkpoint_select(model, which, dir, sizeof dir) != DLREC_OK) return cli_fail("predict");
  /* Scoring runs fp32 in every precision (backend/backend.h): only the
   * device and threads are the user's to choose. */
  dlrec_backend_config bc = {(uint32_t)threads, DLREC_PRECISION_FP32, 0};
  dlrec_backend *be;
  if (dlrec_backend_create_on(&be, device, &bc) != DLREC_OK) return cli_fail("predict");
  dlrec_model *m;
  if (dlrec_model_load(dir, &m) != DLREC_OK) {
    dlrec_backend_free(be);
    return cli_fail("predict");
  }
  uint64_t rows = 0;
  dlrec_status s = dlrec_model_set_backend(m, be);
  if (s == DLREC_OK) s = dlrec_predict_file(m, input, out, &o, &rows);
  dlrec_model_free(m);
  dlrec_backend_free(be);
  if (s != DLREC_OK) return cli_fail("predict");
  return 0;
}
