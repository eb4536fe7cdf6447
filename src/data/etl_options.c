/* The options of etl fit and etl apply: one row each, for both the command
 * line (`dlrec etl fit --min-count 4`, cmd_etl.c) and the host API
 * (`{"min_count": 4}`, api.c), so the two cannot drift; the defaults of
 * dlrec_etl_fit_opts_default and dlrec_etl_apply_opts_default, and the
 * reference in docs/etl.md (`dlrec options etl`, compared by test_etl),
 * come from it too. An option both subcommands take sets both structs. */
#include <stddef.h>

#include "data/etl.h"
#include "data/dlr.h"

#define FIT(f) offsetof(dlrec_etl_fit_opts, f)
#define APPLY(f) offsetof(dlrec_etl_apply_opts, f)
#define FSIZE(f) sizeof(((dlrec_etl_fit_opts *)0)->f)
#define ASIZE(f) sizeof(((dlrec_etl_apply_opts *)0)->f)
#define NONE DLREC_OPT_NO_FIELD
#define BOTH (DLREC_ETL_FIT | DLREC_ETL_APPLY)

static const dlrec_opt_choice formats[] = {{"criteo", DLREC_FORMAT_CRITEO, 0},
                                           {"csv", DLREC_FORMAT_CSV, 0},
                                           {"libsvm", DLREC_FORMAT_LIBSVM, 0},
                                           {"libfm", DLREC_FORMAT_LIBFM, 0},
                                           {NULL, 0, 0}};
static const dlrec_opt_choice poolings[] = {{"sum", DLREC_POOLING_SUM, 0}, {"mean", DLREC_POOLING_MEAN, 0}, {NULL, 0, 0}};
static const dlrec_opt_choice transforms[] = {
    {"log", DLREC_DENSE_LOG, 0}, {"none", DLREC_DENSE_NONE, 0}, {"log1p", DLREC_DENSE_LOG, 1}, {NULL, 0, 0}};
static const dlrec_opt_choice target_encodings[] = {{"oof", 0, 0}, {"full", 1, 0}, {NULL, 0, 0}};

const dlrec_option dlrec_etl_options[] = {
    {.key = "format", .flag = "--format", .where = DLREC_ETL_FIT, .type = DLREC_OPT_CHOICE, .offset = FIT(format),
     .offset2 = NONE, .choices = formats, .dflt = "criteo",
     .doc = "the input's format: Criteo TSV (no header), CSV with a header and a `schema`, libSVM (one multi-hot column "
            "`features`) or libFM (columns f0..f<N-1>, one per field; needs `--fields`); Parquet is read through the "
            "Python package"},
    {.key = "schema", .flag = "--schema", .where = DLREC_ETL_FIT, .type = DLREC_OPT_TEXT, .offset = FIT(schema_spec),
     .offset2 = NONE,
     .doc = "CSV columns by role, e.g. `label=click;ignore=id;cat=*`; `multi=genres:|[:sum|mean[:MAX]]` makes a "
            "categorical column a list of values"},
    {.key = "workflow", .flag = "--workflow", .where = DLREC_ETL_FIT, .type = DLREC_OPT_JSON, .offset = FIT(workflow),
     .offset2 = NONE,
     .doc = "column operators (fill_missing, clip) and derived columns (cross, bucketize, count, target): a JSON "
            "object, which the command line reads from a file"},
    {.key = "libfm_fields", .flag = "--fields", .where = DLREC_ETL_FIT, .type = DLREC_OPT_UINT,
     .offset = FIT(libfm_fields), .offset2 = NONE, .size = FSIZE(libfm_fields), .min = 1, .max = DLREC_MAX_SPARSE,
     .doc = "libFM: the number of fields (0..N-1)"},
    {.key = "pooling", .flag = "--pooling", .where = DLREC_ETL_FIT, .type = DLREC_OPT_CHOICE, .offset = FIT(pooling),
     .offset2 = NONE, .choices = poolings, .dflt = "sum", .doc = "libSVM, libFM: how a model pools each column"},
    {.key = "max_hotness", .flag = "--max-hotness", .where = DLREC_ETL_FIT, .type = DLREC_OPT_UINT,
     .offset = FIT(max_hotness), .offset2 = NONE, .size = FSIZE(max_hotness), .min = 1, .max = 65536,
     .dflt_doc = "the most fit saw",
     .doc = "libSVM, libFM: the most values a row keeps per column, the rest dropped and counted"},
    {.key = "no_label", .flag = "--no-label", .where = BOTH, .type = DLREC_OPT_BOOL, .offset = FIT(has_label),
     .offset2 = APPLY(no_label), .negate = 1, .dflt = "false",
     .doc = "the rows have no label (Criteo: 39 fields; CSV: the schema says so)"},
    {.key = "has_label", .where = DLREC_ETL_FIT, .type = DLREC_OPT_BOOL, .offset = FIT(has_label), .offset2 = NONE,
     .dflt = "true", .doc = "fit: the opposite of `no_label` (the host API's older name)"},
    {.key = "min_count", .flag = "--min-count", .where = DLREC_ETL_FIT, .type = DLREC_OPT_UINT,
     .offset = FIT(min_count), .offset2 = NONE, .size = FSIZE(min_count), .min = 1, .max = UINT64_MAX / 2,
     .dflt = "1", .doc = "values seen fewer times share the out-of-vocabulary id"},
    {.key = "hash_buckets", .flag = "--hash-buckets", .where = DLREC_ETL_FIT, .type = DLREC_OPT_UINT,
     .offset = FIT(hash_buckets), .offset2 = NONE, .size = FSIZE(hash_buckets), .min = 0, .max = UINT32_MAX - 2,
     .dflt = "0", .doc = "a column of more kept values is hashed into this many buckets, ranked by frequency (0: never)"},
    {.key = "raw_keys", .flag = "--raw-keys", .where = DLREC_ETL_FIT, .type = DLREC_OPT_BOOL, .offset = FIT(raw_keys),
     .offset2 = NONE, .dflt = "false",
     .doc = "no vocabularies: rows encode to raw 64-bit keys for a hash table (`storage.kind` `\"hash\"`)"},
    {.key = "dense_transform", .flag = "--dense-transform", .where = DLREC_ETL_FIT, .type = DLREC_OPT_CHOICE,
     .offset = FIT(dense_transform), .offset2 = NONE, .choices = transforms, .dflt = "log",
     .doc = "`log`: log(1 + max(x, 0)) (also spelled `log1p`); `none`: x"},
    {.key = "standardize", .flag = "--standardize", .where = DLREC_ETL_FIT, .type = DLREC_OPT_BOOL,
     .offset = FIT(standardize), .offset2 = NONE, .dflt = "false", .doc = "dense values encode as (t - mean) / std"},
    {.key = "skip_bad_rows", .flag = "--skip-bad-rows", .where = BOTH, .type = DLREC_OPT_UINT,
     .offset = FIT(skip_bad_rows), .offset2 = APPLY(skip_bad_rows), .size = FSIZE(skip_bad_rows), .min = 0,
     .max = UINT64_MAX / 2, .dflt = "0", .doc = "skip up to N bad rows, warning about each"},
    {.key = "strict_fields", .flag = "--strict-fields", .where = BOTH, .type = DLREC_OPT_BOOL,
     .offset = FIT(strict_fields), .offset2 = APPLY(strict_fields), .dflt = "false",
     .doc = "Criteo rows of fewer than 40 fields (39 unlabeled) are bad rows; by default they are valid, their missing "
            "tail empty, and counted"},
    {.key = "max_line_bytes", .flag = "--max-line-bytes", .where = BOTH, .type = DLREC_OPT_UINT,
     .offset = FIT(max_line_bytes), .offset2 = APPLY(max_line_bytes), .size = FSIZE(max_line_bytes), .min = 1,
     .max = 1u << 30, .dflt = "1048576", .doc = "longer lines are bad rows"},
    {.key = "block_bytes", .flag = "--block-bytes", .where = BOTH, .type = DLREC_OPT_UINT,
     .offset = FIT(block_bytes), .offset2 = APPLY(block_bytes), .size = FSIZE(block_bytes), .min = 1,
     .max = 1u << 30, .dflt_doc = "4 MiB", .doc = "the input is read in blocks of whole lines of about this size"},
    {.key = "threads", .flag = "--threads", .where = BOTH, .type = DLREC_OPT_UINT, .offset = FIT(threads),
     .offset2 = APPLY(threads), .size = FSIZE(threads), .min = 0, .max = 1024, .dflt = "0",
     .doc = "worker threads (0: all cores); the output does not depend on it"},
    {.key = "memory_mb", .flag = "--memory-mb", .where = DLREC_ETL_FIT, .type = DLREC_OPT_UINT,
     .offset = FIT(memory_mb), .offset2 = NONE, .size = FSIZE(memory_mb), .min = 1, .max = 1u << 30,
     .dflt_doc = "no bound",
     .doc = "keep the count tables within about this many MiB whatever the threads, spilling to disk: the same "
            "state, byte for byte"},
    {.key = "spill_dir", .flag = "--spill-dir", .where = DLREC_ETL_FIT, .type = DLREC_OPT_TEXT,
     .offset = FIT(spill_dir), .offset2 = NONE, .dflt_doc = "the state's directory",
     .doc = "with `--memory-mb`: where the count tables spill"},
    {.key = "valid_fraction", .flag = "--valid-fraction", .where = DLREC_ETL_APPLY, .type = DLREC_OPT_DOUBLE,
     .offset = NONE, .offset2 = APPLY(valid_fraction), .lo = 0, .hi = 0.999999, .dflt = "0",
     .doc = "send about this fraction of the rows to `--valid-out`"},
    {.key = "valid_out", .flag = "--valid-out", .where = DLREC_ETL_APPLY, .type = DLREC_OPT_TEXT, .offset = NONE,
     .offset2 = APPLY(valid_out), .doc = "the validation rows' `.dlr` file"},
    {.key = "seed", .flag = "--seed", .where = DLREC_ETL_APPLY, .type = DLREC_OPT_UINT, .offset = NONE,
     .offset2 = APPLY(seed), .size = ASIZE(seed), .min = 0, .max = UINT64_MAX, .dflt = "0",
     .doc = "the split's seed: a row's side depends on it, its input's number and its line, nothing else"},
    {.key = "row_group_rows", .flag = "--row-group-rows", .where = DLREC_ETL_APPLY, .type = DLREC_OPT_UINT,
     .offset = NONE, .offset2 = APPLY(row_group_rows), .size = ASIZE(row_group_rows), .min = 1,
     .max = DLREC_DLR_MAX_GROUP_ROWS, .dflt = "65536", .doc = "rows per row group"},
    {.key = "target_encoding", .flag = "--target-encoding", .where = DLREC_ETL_APPLY, .type = DLREC_OPT_CHOICE,
     .offset = NONE, .offset2 = APPLY(target_full), .choices = target_encodings, .dflt = "oof",
     .doc = "target encodings out of fold, each row's fold from its input's number and line (give fit's inputs in "
            "fit's order), or `full`, for rows fit did not see"},
    {.key = NULL},
};

void dlrec_etl_fit_opts_default(dlrec_etl_fit_opts *o) {
  *o = (dlrec_etl_fit_opts){.progress = 1};
  dlrec_options_defaults(dlrec_etl_options, DLREC_ETL_FIT, o, NULL);
}

void dlrec_etl_apply_opts_default(dlrec_etl_apply_opts *o) {
  *o = (dlrec_etl_apply_opts){.progress = 1};
  dlrec_options_defaults(dlrec_etl_options, DLREC_ETL_APPLY, NULL, o);
}

dlrec_status dlrec_etl_options_read(const cJSON *o, const char *what, unsigned command, const char *const *extra,
                                    dlrec_etl_fit_opts *fit, dlrec_etl_apply_opts *apply) {
  return dlrec_options_read_flat(dlrec_etl_options, command, o, what, extra,
                                 command & DLREC_ETL_FIT ? fit : NULL, command & DLREC_ETL_APPLY ? apply : NULL);
}

char *dlrec_etl_options_reference(void) {
  static const char *const commands[] = {"fit", "apply", NULL};
  const dlrec_opt_reference r = {1, commands};
  return dlrec_options_markdown(dlrec_etl_options, &r);
}
