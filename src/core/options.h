/* Option tables: each option of a config file, a command line or the host
 * API declared once, with its place (a config section and key, a flag, an
 * API key), its type and range, its default and one line of
 * documentation, and the struct field it sets. One table drives everything
 * that reads, writes or documents those options: the JSON reader and
 * writer, the command line's flags, the defaults, and the reference tables
 * of the docs (printed by `dlrec options`, compared with the docs by the
 * tests). The tables: the training config's (train/config_options.c) and
 * the ETL's (data/etl_options.c).
 *
 * An option sets a field of one struct (offset), or of two at once
 * (offset2: the ETL's fit and apply options, which share some). */
#ifndef DLREC_CORE_OPTIONS_H
#define DLREC_CORE_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "core/status.h"

#define DLREC_OPT_NO_FIELD ((size_t)-1)

typedef enum dlrec_opt_type {
  DLREC_OPT_BOOL,   /* an int: true or false; a flag without a value on the command line */
  DLREC_OPT_UINT,   /* an unsigned integer field of `size` bytes (or a non-negative int), in [min, max] */
  DLREC_OPT_FLOAT,  /* a float, in [lo, hi] */
  DLREC_OPT_DOUBLE, /* a double, in [lo, hi] */
  DLREC_OPT_CHOICE, /* an int or enum field: one of choices' names */
  DLREC_OPT_STRING, /* a char[size] buffer */
  DLREC_OPT_TEXT,   /* a const char * into the input it was read from (valid as long as that) */
  DLREC_OPT_JSON,   /* a const char *: a JSON object's text (the command line: a file holding it) */
  DLREC_OPT_CUSTOM, /* read and written by the option's own functions */
} dlrec_opt_type;

/* A CHOICE's name and the value it sets; an alias is accepted, not listed. */
typedef struct dlrec_opt_choice {
  const char *name;
  int value;
  int alias;
} dlrec_opt_choice;

struct dlrec_option;

/* A CUSTOM option's functions (obj: the first struct). */
typedef struct dlrec_opt_custom {
  const char *type_doc; /* the reference's type column */
  dlrec_status (*from_json)(const struct dlrec_option *o, const cJSON *v, const char *what, void *obj);
  dlrec_status (*from_text)(const struct dlrec_option *o, const char *text, const char *what, void *obj);
  cJSON *(*to_json)(const struct dlrec_option *o, const void *obj);
} dlrec_opt_custom;

typedef struct dlrec_option {
  const char *section;    /* a config's section ("training", "optimizer.dense"; "" the top level) */
  const char *key;        /* its key there; the host API's key */
  const char *flag;       /* the command line's flag ("--min-count"), or NULL */
  unsigned where;         /* which commands take it (the table owner's bits; 0: every one) */
  dlrec_opt_type type;
  size_t offset, offset2; /* the field in the first and second struct (DLREC_OPT_NO_FIELD: none) */
  size_t size;            /* UINT: the field's bytes; STRING: the buffer's */
  int negate;             /* BOOL: the first struct's field holds the opposite (--no-label, has_label) */
  uint64_t min, max;      /* UINT */
  double lo, hi;          /* FLOAT, DOUBLE */
  const dlrec_opt_choice *choices; /* CHOICE: ends with a NULL name */
  const dlrec_opt_custom *custom;  /* CUSTOM */
  const char *dflt;       /* the default as the command line writes it ("128", "sgd", "true"); NULL:
                             set otherwise, as dflt_doc says */
  const char *dflt_doc;   /* the reference's default when dflt is NULL or says too little */
  int omit_default;       /* dlrec_options_write leaves it out while it is dflt (a key added after configs
                             were written: theirs keep their bytes); CHOICE, STRING */
  const char *doc;        /* one line for the reference */
} dlrec_option;

/* A table ends with an option of NULL key. */

/* Sets o's field(s) in obj (and obj2) from a JSON value (a config's, the
 * host API's); errors read "WHAT: field 'KEY': ...". */
dlrec_status dlrec_option_from_json(const dlrec_option *o, const cJSON *v, const char *what, void *obj, void *obj2);

/* The same from text (a flag's value, a default); errors read
 * "WHAT: ..." (WHAT: the flag). A BOOL takes "true" or "false". */
dlrec_status dlrec_option_from_text(const dlrec_option *o, const char *text, const char *what, void *obj, void *obj2);

/* o's value in obj as JSON (the caller owns it). */
cJSON *dlrec_option_to_json(const dlrec_option *o, const void *obj);

/* Sets every option of the table with a default (and, when where is not
 * 0, one of the where bits) to it. */
void dlrec_options_defaults(const dlrec_option *table, unsigned where, void *obj, void *obj2);

/* Reads a config: each section of the table an object of root (the
 * sections' keys, unknown ones refused, each read into obj in the table's
 * order). what names root in errors ("cfg.json"); a section's are
 * "cfg.json: training: field 'batch_size': ...". Sections absent keep their
 * values. */
dlrec_status dlrec_options_read(const dlrec_option *table, const cJSON *root, const char *what, void *obj);

/* Writes obj as a config: every option, sections as objects in the
 * table's order. The caller owns the result. */
cJSON *dlrec_options_write(const dlrec_option *table, const void *obj);

/* Reads a flat object of options (the host API's), each key one of the
 * options with a where bit (or one of extra, which the caller reads). */
dlrec_status dlrec_options_read_flat(const dlrec_option *table, unsigned where, const cJSON *root, const char *what,
                                     const char *const *extra, void *obj, void *obj2);

/* The option of a flag taken by a command (where), or NULL. */
const dlrec_option *dlrec_options_find_flag(const dlrec_option *table, unsigned where, const char *flag);

/* Which reference a table prints: a config's (key as section.key, type,
 * default, meaning), or a command's (flag, API key, commands, type,
 * default, meaning; `commands` names each where bit, in bit order). */
typedef struct dlrec_opt_reference {
  int flags;                  /* 1: the flag and API key columns; 0: the config key column */
  const char *const *commands; /* the names of the where bits, or NULL */
} dlrec_opt_reference;

/* The table's reference as a Markdown table, malloc'd. */
char *dlrec_options_markdown(const dlrec_option *table, const dlrec_opt_reference *r);

/* The flags of a command (where) for --help: "  --flag VALUE  doc
 * (default D)", wrapped at 80 columns. */
void dlrec_options_help(const dlrec_option *table, unsigned where, FILE *out);

/* Text to numbers, strictly, as flags take them: an unsigned integer
 * (suffixes k, M, G: 10^3, 10^6, 10^9) in [min, max], a finite number in
 * [lo, hi]; errors name `what`. */
dlrec_status dlrec_opt_parse_u64(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);
dlrec_status dlrec_opt_parse_double(const char *what, const char *s, double lo, double hi, double *out);

#endif
