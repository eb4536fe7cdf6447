/* `dlrec export --model RUN --onnx FILE`: a trained model as an ONNX graph
 * (dlrec_net_export_onnx), for onnxruntime, TensorRT or any other runtime. */
#include <getopt.h>
#include <stdio.h>

#include "cli/cli.h"
#include "train/checkpoint.h"
#include "train/loaded_model.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec export --model RUN --onnx FILE [--checkpoint latest|best] [-q] [-v]\n\n"
          "Writes the trained model as an ONNX model (opset 17): every model type, its\n"
          "embedding table included (as float32; up to 2 GB, protobuf's limit on one file).\n"
          "RUN is a run directory (its latest checkpoint) or a checkpoint.\n\n"
          "The graph starts after the ETL: raw features are encoded outside it (dlrec\n"
          "etl apply, or the ETL state's vocabularies). Its inputs:\n"
          "  dense  (N, n_dense) float32  the dense features as a .dlr file holds them\n"
          "  ids    (N, S) int64          the categorical ids in the fused table, the columns\n"
          "                               in schema order, one slot per one-hot column and\n"
          "                               max_hotness slots per multi-hot one (unused: -1)\n"
          "and its outputs prob (N, 1), the click probability, and logit (N, 1). A model\n"
          "without dense (or categorical) columns has no dense (or ids) input.\n"
          "Raw-key models (storage.kind \"hash\") cannot be exported: their ids are keys\n"
          "that only the hash table resolves. docs/export.md says more.\n\n"
          "options:\n"
          "  --checkpoint WHICH  latest (default) or best (RUN/best)\n"
          "  -q                  warnings only           -v  debug logs\n");
}

int cmd_export(int argc, char **argv) {
  static const struct option opts[] = {{"model", required_argument, 0, 'm'}, {"onnx", required_argument, 0, 'o'},
                                       {"checkpoint", required_argument, 0, 'c'}, {"help", no_argument, 0, 'h'},
                                       {"quiet", no_argument, 0, 'q'},          {"verbose", no_argument, 0, 'v'},
                                       {0, 0, 0, 0}};
  const char *model = NULL, *onnx = NULL, *which = NULL;
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "hqv", opts, NULL)) != -1) {
    switch (c) {
    case 'm': model = optarg; break;
    case 'o': onnx = optarg; break;
    case 'c': which = optarg; break;
    case 'h': usage(stdout); return 0;
    case 'q': cli_common_option("-q"); break;
    case 'v': cli_common_option("-v"); break;
    default: return cli_usage_error("export", "unknown option");
    }
  }
  if (optind < argc) return cli_usage_error("export", "unexpected argument '%s'", argv[optind]);
  if (!model || !onnx) return cli_usage_error("export", "--model and --onnx are required");
  char dir[4096];
  if (dlrec_checkpoint_select(model, which, dir, sizeof dir) != DLREC_OK) return cli_fail("export");
  dlrec_model *m;
  if (dlrec_model_load(dir, &m) != DLREC_OK) return cli_fail("export");
  dlrec_status s = dlrec_net_export_onnx(m->net, onnx);
  dlrec_model_free(m);
  if (s != DLREC_OK) return cli_fail("export");
  printf("%s\n", onnx);
  return 0;
}
