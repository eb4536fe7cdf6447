/* `dlrec etl fit` and `dlrec etl apply`: vocabularies and statistics from raw
 * rows, then raw rows encoded into .dlr files. See docs/etl.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "data/dlr.h"
#include "data/etl.h"
#include "core/fsutil.h"
#include "core/log.h"

static void usage_etl(FILE *out) {
  fprintf(out,
          "usage: dlrec etl fit   --input FILE... --out ETLDIR [options]\n"
          "       dlrec etl apply --etl ETLDIR --input FILE... --out OUT.dlr [options]\n"
          "\n"
          "fit reads raw rows once and writes the ETL state (ETLDIR/etl.json and\n"
          "ETLDIR/vocab.bin): per categorical column a vocabulary ordered by frequency\n"
          "(rare values fold into one out-of-vocabulary id, empty values get an id of\n"
          "their own), per dense column count, min, max, mean and std.\n"
          "apply encodes rows with that state into a .dlr file for training.\n"
          "\n"
          "Inputs are Criteo TSV (label, I1..I13, C1..C26; the default), CSV with a\n"
          "header and a --schema, libSVM (label idx:1 ...) or libFM (label field:idx:1\n"
          "...). '-' reads standard input, e.g.\n"
          "  zcat day_0.gz | dlrec etl fit --input - --out etl/\n"
          "\n"
          "See 'dlrec etl fit --help', 'dlrec etl apply --help' and docs/etl.md.\n");
}

static void usage_fit(FILE *out) {
  fprintf(out,
          "usage: dlrec etl fit --input FILE... --out ETLDIR [options]\n"
          "\n"
          "Streams the input once and writes the ETL state to ETLDIR.\n"
          "\n"
          "options:\n"
          "  --input FILE...         raw rows; several files are read in order; '-' is stdin\n"
          "  --out ETLDIR            the state directory (created; files replaced atomically)\n");
  dlrec_options_help(dlrec_etl_options, DLREC_ETL_FIT, out);
  fprintf(out,
          "  -q, --quiet             no progress bar and no summary\n"
          "  -v, --verbose           debug logs\n"
          "\n"
          "The same options are the host API's (docs/python.md), by the names of\n"
          "docs/etl.md's option reference.\n"
          "\n"
          "example:\n"
          "  dlrec etl fit --input day_0.tsv day_1.tsv --out etl/ --min-count 4\n");
}

static void usage_apply(FILE *out) {
  fprintf(out,
          "usage: dlrec etl apply --etl ETLDIR --input FILE... --out OUT.dlr [options]\n"
          "\n"
          "Encodes raw rows (same format as fit's) into a .dlr file, rows in input order.\n"
          "Values fit never saw (or saw fewer than --min-count times) get their column's\n"
          "OOV id; empty values its missing id.\n"
          "\n"
          "options:\n"
          "  --etl ETLDIR            the state written by 'dlrec etl fit'\n"
          "  --input FILE...         raw rows; '-' is stdin\n"
          "  --out OUT.dlr           the encoded rows (written atomically)\n"
          "  --out-dir DIR           instead: one DIR/NAME.dlr per input (NAME: its file name\n"
          "                          without the extension), in one pass over the inputs;\n"
          "                          --valid-out still gets every input's validation rows\n");
  dlrec_options_help(dlrec_etl_options, DLREC_ETL_APPLY, out);
  fprintf(out,
          "  -q, --quiet             no progress bar and no summary\n"
          "  -v, --verbose           debug logs\n"
          "\n"
          "example:\n"
          "  dlrec etl apply --etl etl/ --input day_0.tsv --out train.dlr \\\n"
          "      --valid-fraction 0.05 --valid-out valid.dlr --seed 1\n");
}

/* The summary's line on short Criteo rows, when there were any. */
static void report_short_rows(const char *cmd, const dlrec_etl_report *rep) {
  if (!rep->short_rows) return;
  DLREC_INFO("%s: %llu rows had fewer fields than Criteo's 40 (39 unlabeled), the first at %s: their missing "
             "fields read as empty (a torn line reads so too; --strict-fields refuses them)",
             cmd, (unsigned long long)rep->short_rows, rep->first_short);
}

/* The summary's line on multi-hot fields cut to their max hotness. */
static void report_truncated(const char *cmd, const dlrec_etl_report *rep) {
  if (!rep->truncated_rows) return;
  DLREC_INFO("%s: %llu rows had a multi-hot field of more values than its max hotness; the first ones were kept",
             cmd, (unsigned long long)rep->truncated_rows);
}

/* Options shared by both subcommands, parsed in one place. */
typedef struct etl_args {
  const char *cmd; /* "etl fit" / "etl apply" */
  const char **inputs;
  int n_inputs;
  const char *workflow_path; /* fit: --workflow */
  const char *out, *etl;
  dlrec_etl_fit_opts fit;
  dlrec_etl_apply_opts apply;
} etl_args;

/* The value of option argv[*i] ("--opt value" or "--opt=value"); NULL after
 * printing a usage error when it is missing. */
static const char *value_of(const etl_args *a, int argc, char **argv, int *i, const char *inline_value) {
  if (inline_value) return inline_value;
  if (*i + 1 >= argc) {
    cli_usage_error(a->cmd, "%s needs a value", argv[*i]);
    return NULL;
  }
  return argv[++*i];
}

/* Parquet is read by pyarrow, through the Python package (docs/python.md). */
static int parquet_refused(const etl_args *a) {
  return cli_usage_error(a->cmd, "Parquet is read through the Python package, with pyarrow: pip install ./python "
                                 "pyarrow, then dlrec.%s (docs/python.md), or write the rows as CSV",
                         strcmp(a->cmd, "etl fit") ? "etl_apply(ETL, 'FILE.parquet', OUT)"
                                                   : "etl_fit('FILE.parquet', OUT, schema=SPEC)");
}

/* An option of the table (etl_options.c) for this subcommand: a flag, or a
 * flag and its value. -1 to go on, or an exit code. */
static int table_option(etl_args *a, const dlrec_option *o, int argc, char **argv, int *i, const char *iv) {
  const char *v;
  if (o->type == DLREC_OPT_BOOL) {
    if (iv) return cli_usage_error(a->cmd, "%s takes no value", o->flag);
    v = "true";
  } else if (!(v = value_of(a, argc, argv, i, iv))) {
    return 2;
  }
  if (o->type == DLREC_OPT_JSON) { /* the command line names a file holding it */
    a->workflow_path = v;
    return -1;
  }
  if (!strcmp(o->flag, "--format") && !strcmp(v, "parquet")) return parquet_refused(a);
  if (dlrec_option_from_text(o, v, o->flag, &a->fit, &a->apply) != DLREC_OK)
    return cli_usage_error(a->cmd, "%s", dlrec_last_error());
  return -1;
}

/* The checks across options, as usage errors. */
static int check_args(const etl_args *a, int is_fit) {
  if (a->n_inputs == 0) return cli_usage_error(a->cmd, "--input is required");
  for (int k = 0; k < a->n_inputs; k++) {
    size_t n = strlen(a->inputs[k]);
    if (n >= 8 && !strcmp(a->inputs[k] + n - 8, ".parquet")) return parquet_refused(a);
  }
  if (!a->out) return cli_usage_error(a->cmd, is_fit ? "--out is required" : "--out or --out-dir is required");
  if (!is_fit && !a->etl) return cli_usage_error(a->cmd, "--etl is required");
  if (!is_fit && a->apply.valid_out && !*a->apply.valid_out) return cli_usage_error(a->cmd, "--valid-out: empty name");
  if (is_fit && a->fit.format == DLREC_FORMAT_CSV && !a->fit.schema_spec)
    return cli_usage_error(a->cmd, "--format csv needs --schema (e.g. 'label=click;ignore=id;cat=*')");
  if (is_fit && a->fit.format != DLREC_FORMAT_CSV && a->fit.schema_spec)
    return cli_usage_error(a->cmd, "--schema needs --format csv (the columns of %s are fixed)",
                           dlrec_format_name(a->fit.format));
  if (is_fit && a->fit.format == DLREC_FORMAT_LIBFM && !a->fit.libfm_fields)
    return cli_usage_error(a->cmd, "--format libfm needs --fields N (the fields are 0..N-1)");
  if (!is_fit && (a->apply.valid_fraction > 0) != (a->apply.valid_out != NULL))
    return cli_usage_error(a->cmd, "--valid-fraction and --valid-out go together");
  if (is_fit && a->fit.spill_dir && !a->fit.memory_mb)
    return cli_usage_error(a->cmd, "--spill-dir needs --memory-mb");
  return -1;
}

/* Parses argv into a; returns -1 to go on, or an exit code (0 after --help). */
static int parse_args(etl_args *a, int is_fit, int argc, char **argv) {
  a->inputs = calloc((size_t)argc, sizeof *a->inputs);
  if (!a->inputs) return cli_usage_error(a->cmd, "out of memory");
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v;
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      is_fit ? usage_fit(stdout) : usage_apply(stdout);
      return 0;
    }
    if (cli_common_option(arg)) continue;
    char name[64];
    const char *iv = NULL, *eq = strchr(arg, '=');
    if (!strncmp(arg, "--", 2) && eq && (size_t)(eq - arg) < sizeof name) {
      memcpy(name, arg, (size_t)(eq - arg));
      name[eq - arg] = '\0';
      iv = eq + 1;
    } else {
      snprintf(name, sizeof name, "%s", arg);
    }
    const dlrec_option *o = dlrec_options_find_flag(dlrec_etl_options, is_fit ? DLREC_ETL_FIT : DLREC_ETL_APPLY, name);
    if (o) {
      int rc = table_option(a, o, argc, argv, &i, iv);
      if (rc >= 0) return rc;
    } else if (!strcmp(name, "--input")) {
      int before = a->n_inputs;
      if (iv) a->inputs[a->n_inputs++] = iv;
      while (!iv && i + 1 < argc && (argv[i + 1][0] != '-' || !strcmp(argv[i + 1], "-")))
        a->inputs[a->n_inputs++] = argv[++i];
      if (a->n_inputs == before) return cli_usage_error(a->cmd, "--input needs at least one file ('-' for stdin)");
    } else if (!strcmp(name, "--out") || (!is_fit && !strcmp(name, "--out-dir"))) {
      if (!(v = value_of(a, argc, argv, &i, iv))) return 2;
      if (!*v) return cli_usage_error(a->cmd, "%s: empty name", name);
      if (a->out) return cli_usage_error(a->cmd, "--out or --out-dir, once");
      a->out = v;
      a->apply.per_input = !strcmp(name, "--out-dir");
    } else if (!is_fit && !strcmp(name, "--etl")) {
      if (!(v = value_of(a, argc, argv, &i, iv))) return 2;
      a->etl = v;
    } else {
      return cli_usage_error(a->cmd, "unknown option '%s'", arg);
    }
  }
  return check_args(a, is_fit);
}

static int run_fit(int argc, char **argv) {
  etl_args a = {.cmd = "etl fit"};
  dlrec_etl_fit_opts_default(&a.fit);
  dlrec_etl_apply_opts_default(&a.apply);
  int rc = parse_args(&a, 1, argc, argv);
  if (rc >= 0) {
    free(a.inputs);
    return rc;
  }
  dlrec_etl_report rep;
  char *workflow = NULL;
  size_t wn;
  dlrec_status st = a.workflow_path ? dlrec_read_file(a.workflow_path, 1u << 20, &workflow, &wn) : DLREC_OK;
  if (st != DLREC_OK) dlrec_error_context("--workflow: ");
  a.fit.workflow = workflow;
  if (st == DLREC_OK) st = dlrec_etl_fit(a.inputs, a.n_inputs, a.out, &a.fit, &rep);
  free(workflow);
  free(a.inputs);
  if (st != DLREC_OK) return cli_fail("etl fit");
  DLREC_INFO("etl fit: %llu rows (%llu bad rows skipped), %.1f MB in %.2f s: %.0f rows/s; state in %s",
             (unsigned long long)rep.rows, (unsigned long long)rep.bad_rows, rep.bytes / 1e6, rep.seconds,
             rep.seconds > 0 ? rep.rows / rep.seconds : 0.0, a.out);
  if (rep.spilled_bytes)
    DLREC_INFO("etl fit: the count tables spilled %.1f MB to disk (--memory-mb %llu)", rep.spilled_bytes / 1e6,
               (unsigned long long)a.fit.memory_mb);
  report_short_rows("etl fit", &rep);
  report_truncated("etl fit", &rep);
  return 0;
}

static int run_apply(int argc, char **argv) {
  etl_args a = {.cmd = "etl apply"};
  dlrec_etl_fit_opts_default(&a.fit);
  dlrec_etl_apply_opts_default(&a.apply);
  int rc = parse_args(&a, 0, argc, argv);
  if (rc >= 0) {
    free(a.inputs);
    return rc;
  }
  dlrec_etl *e;
  if (dlrec_etl_load(&e, a.etl) != DLREC_OK) {
    free(a.inputs);
    return cli_fail("etl apply");
  }
  dlrec_etl_report rep;
  dlrec_status st = a.apply.per_input ? dlrec_mkdirs(a.out) : DLREC_OK;
  if (st == DLREC_OK) st = dlrec_etl_apply(e, a.inputs, a.n_inputs, a.out, &a.apply, &rep);
  dlrec_etl_free(e);
  free(a.inputs);
  if (st != DLREC_OK) return cli_fail("etl apply");
  DLREC_INFO("etl apply: %llu rows (%llu to %s%s, %llu to %s; %llu bad rows skipped), %.1f MB in %.2f s: %.0f rows/s",
             (unsigned long long)rep.rows, (unsigned long long)(rep.rows - rep.valid_rows), a.out,
             a.apply.per_input ? "/*.dlr" : "",
             (unsigned long long)rep.valid_rows, a.apply.valid_out ? a.apply.valid_out : "-",
             (unsigned long long)rep.bad_rows, rep.bytes / 1e6, rep.seconds,
             rep.seconds > 0 ? rep.rows / rep.seconds : 0.0);
  report_short_rows("etl apply", &rep);
  report_truncated("etl apply", &rep);
  return 0;
}

int cmd_etl(int argc, char **argv) {
  if (argc < 2) {
    usage_etl(stderr);
    return 2;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
    usage_etl(stdout);
    return 0;
  }
  if (!strcmp(sub, "fit")) return run_fit(argc - 1, argv + 1);
  if (!strcmp(sub, "apply")) return run_apply(argc - 1, argv + 1);
  fprintf(stderr, "dlrec etl: unknown subcommand '%s' (expected fit or apply)\n\n", sub);
  usage_etl(stderr);
  return 2;
}
