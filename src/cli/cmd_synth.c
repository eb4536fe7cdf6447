/* `dlrec synth`: synthetic Criteo-like click logs with known click probabilities. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/log.h"
#include "data/synth.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: dlrec synth --rows N --out FILE [options]\n"
          "\n"
          "Writes synthetic click logs in the Criteo display-ads layout\n"
          "(label, I1..I13, C1..C26, tab-separated), with Criteo-like missing rates,\n"
          "heavy-tailed counts and Zipf-distributed categories. Labels are drawn from a\n"
          "hidden model with feature interactions, so each row's true click probability\n"
          "is known: its AUC is the best any model can reach. See docs/synth.md.\n"
          "\n"
          "options:\n"
          "  --rows N              rows to write (required; k, M, G suffixes: 2M = 2000000)\n"
          "  --out FILE            the click log; '-' writes to stdout (required)\n"
          "  --probs FILE          also write each row's true click probability, one per\n"
          "                        line (\"%%.6f\"), in the same order; '-' for stdout\n"
          "  --seed S              which rows are drawn (default 1)\n"
          "  --model-seed S        the hidden model: value strings, weights (default 1);\n"
          "                        files of one model seed and different seeds are\n"
          "                        independent samples of one world (train and test)\n"
          "  --cardinalities C     the categorical columns' distinct values: criteo-kaggle\n"
          "                        (the default: Criteo Kaggle's, up to 10.1M), criteo-1tb\n"
          "                        (Criteo 1TB's vocabularies at frequency threshold 15,\n"
          "                        NVIDIA's DLRM benchmark table: 32.7M rows), or 26 counts\n"
          "                        for C1..C26, comma-separated (k, M suffixes)\n"
          "  --max-cardinality N   cap every categorical column at N distinct values\n"
          "  --threads N           worker threads (default: all cores); the output does\n"
          "                        not depend on it\n"
          "  -q, --quiet           no progress bar and no summary\n"
          "  -v, --verbose         debug logs\n"
          "  -h, --help            this text\n"
          "\n"
          "A regular output file is written as FILE.tmp and renamed when complete, so an\n"
          "interrupted run never leaves a partial file under FILE. The summary on stderr\n"
          "gives rows, bytes, time, rows/s, the click rate and the AUC of the true\n"
          "probabilities.\n"
          "\n"
          "example:\n"
          "  dlrec synth --rows 1M --out clicks.tsv --probs clicks.probs\n");
}

/* --cardinalities v: a preset's name (*out = its counts), or
 * DLREC_SYNTH_CAT counts separated by commas, parsed into card (*out =
 * card). The error names the value that is wrong. */
static dlrec_status parse_cardinalities(const char *v, uint32_t *card, const uint32_t **out) {
  if ((*out = dlrec_synth_cardinality_preset(v))) return DLREC_OK;
  if (!strchr(v, ',') && (*v < '0' || *v > '9'))
    return dlrec_error(DLREC_ERR_INVALID, "--cardinalities: '%s' is neither a set (criteo-kaggle, criteo-1tb) nor %d "
                       "counts", v, DLREC_SYNTH_CAT);
  int n = 0;
  for (const char *p = v;; n++) {
    const char *comma = strchr(p, ',');
    const size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char item[32], what[64];
    snprintf(what, sizeof what, "--cardinalities: value %d", n + 1);
    if (n == DLREC_SYNTH_CAT)
      return dlrec_error(DLREC_ERR_INVALID, "--cardinalities: more than %d values (C1..C%d)", DLREC_SYNTH_CAT,
                         DLREC_SYNTH_CAT);
    if (len >= sizeof item)
      return dlrec_error(DLREC_ERR_INVALID, "%s: '%.*s' is not a count", what, (int)len, p);
    memcpy(item, p, len);
    item[len] = '\0';
    uint64_t x;
    if (cli_parse_u64(what, item, 1, UINT32_MAX, &x) != DLREC_OK) return dlrec_last_status();
    card[n] = (uint32_t)x;
    if (!comma) break;
    p = comma + 1;
  }
  if (n + 1 != DLREC_SYNTH_CAT)
    return dlrec_error(DLREC_ERR_INVALID,
                       "--cardinalities: %d value%s, C1..C%d need %d (or a set's name: criteo-kaggle, criteo-1tb)",
                       n + 1, n ? "s" : "", DLREC_SYNTH_CAT, DLREC_SYNTH_CAT);
  *out = card;
  return DLREC_OK;
}

/* The value of option argv[*i], advancing *i; NULL (after a usage error
 * message) when it is missing. */
static const char *option_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) {
    cli_usage_error("synth", "%s needs a value", argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

int cmd_synth(int argc, char **argv) {
  dlrec_synth_opts o = dlrec_synth_opts_default();
  uint32_t card[DLREC_SYNTH_CAT];
  int have_rows = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (cli_common_option(a)) continue;
    const char *v;
    uint64_t n;
    if (!strcmp(a, "--rows")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (cli_parse_u64("--rows", v, 1, UINT64_MAX / 2, &o.rows) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
      have_rows = 1;
    } else if (!strcmp(a, "--out")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (!*v) return cli_usage_error("synth", "--out: empty file name");
      o.out = v;
    } else if (!strcmp(a, "--probs")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (!*v) return cli_usage_error("synth", "--probs: empty file name");
      o.probs = v;
    } else if (!strcmp(a, "--seed")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (cli_parse_u64("--seed", v, 0, UINT64_MAX, &o.seed) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
    } else if (!strcmp(a, "--model-seed")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (cli_parse_u64("--model-seed", v, 0, UINT64_MAX, &o.model_seed) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
    } else if (!strcmp(a, "--cardinalities")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (parse_cardinalities(v, card, &o.cardinalities) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
    } else if (!strcmp(a, "--max-cardinality")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (cli_parse_u64("--max-cardinality", v, 1, UINT32_MAX, &o.max_cardinality) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
    } else if (!strcmp(a, "--threads")) {
      if (!(v = option_value(argc, argv, &i))) return 2;
      if (cli_parse_u64("--threads", v, 1, 1024, &n) != DLREC_OK)
        return cli_usage_error("synth", "%s", dlrec_last_error());
      o.threads = (int)n;
    } else {
      return cli_usage_error("synth", "unknown option '%s'", a);
    }
  }
  if (!have_rows) return cli_usage_error("synth", "--rows is required");
  if (!o.out) return cli_usage_error("synth", "--out is required ('-' for stdout)");
  if (o.probs && !strcmp(o.out, "-") && !strcmp(o.probs, "-"))
    return cli_usage_error("synth", "--out and --probs cannot both be stdout");

  dlrec_synth_stats s;
  if (dlrec_synth_write(&o, &s) != DLREC_OK) return cli_fail("synth");
  if (dlrec_log_get_level() <= DLREC_LOG_INFO)
    fprintf(stderr,
            "dlrec synth: %llu rows, %.1f MB in %.2f s (%.2fM rows/s); click rate %.4f (mean true p %.4f); "
            "true p: AUC %.4f, logloss %.4f (the best a model can do)\n",
            (unsigned long long)s.rows, (double)s.bytes / 1e6, s.seconds,
            s.seconds > 0 ? (double)s.rows / s.seconds / 1e6 : 0.0, (double)s.positives / (double)s.rows,
            s.mean_prob, s.auc, s.logloss);
  return 0;
}
