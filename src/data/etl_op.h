/* ETL operators (etl fit --workflow, docs/etl.md): the interface each one
 * implements in its own file, etl_op_NAME.c, and the registry the generic
 * ETL code iterates (etl_ops.c), so that adding an operator touches its file
 * and one registry line (docs/contributing.md, "Adding an ETL operator").
 *
 * An operator has one of three roles:
 *   ETL_ROLE_COLUMN  it changes how an input dense column reads (fill_missing,
 *                    clip): a member of the column's object in the workflow
 *                    and in etl.json, its settings in etl_dense_ops;
 *   ETL_ROLE_CAT     it adds a categorical column (cross, bucketize): a list
 *                    of the workflow, each entry a column whose definition
 *                    (etl_derived) etl.json records as its "op" member;
 *   ETL_ROLE_DENSE   it adds a dense column (count, target), likewise.
 * Derived columns follow the input's, in registry order and then workflow
 * order within an operator. The hooks an operator's role does not use are
 * NULL, as are the optional ones (marked so) it does not need.
 *
 * The generic code owns what every operator shares: the workflow's and the
 * state's framing (names, sources by name, "kind"), fit's pass (a worker per
 * block, the vocabulary of a categorical column), the dense transform and
 * standardization of a derived dense value, and the state's checksums. */
#ifndef DLREC_DATA_ETL_OP_H
#define DLREC_DATA_ETL_OP_H

#include "data/etl_internal.h"

struct cJSON;

typedef enum etl_op_role { ETL_ROLE_COLUMN = 0, ETL_ROLE_CAT = 1, ETL_ROLE_DENSE = 2 } etl_op_role;

enum {
  ETL_OP_HASHED = 1u << 0,      /* ETL_ROLE_CAT: its column is hashed into d->buckets buckets */
  ETL_OP_COUNTS_KEYS = 1u << 1, /* ETL_ROLE_CAT: fit_row counts keys into the column's count table,
                                   which fit finishes (and spills) as an input column's */
  ETL_OP_EVERY_VALUE = 1u << 2, /* ETL_ROLE_CAT: its vocabulary keeps every value (no min count) */
  ETL_OP_RAW_VALUE = 1u << 3,   /* ETL_ROLE_DENSE: its value skips the dense transform */
  ETL_OP_NEEDS_LABEL = 1u << 4, /* it reads the labels (fit and the state need them) */
};

/* ---- what the hooks see ---- */

/* A row being encoded (etl_encode.c): its input fields, and what the row's
 * encoder parsed already (keys, local, x: all NULL, or all set: each
 * one-hot categorical field's key and local id, each dense field's value,
 * valid where the field is not empty). */
typedef struct etl_row {
  const dlrec_etl *e;
  const dlrec_layout *L;   /* the fields' numbers, for messages */
  const dlrec_where *w;    /* the row's file and line, for messages; may be NULL */
  const dlrec_text *din, *cin;
  const uint64_t *keys;
  const uint32_t *local;
  const double *x;
  const etl_pos *pos;      /* for out-of-fold target encodings; NULL: the full ones */
} etl_row;

/* The key of one-hot input column c's field (DLREC_ETL_MISSING_KEY when
 * empty; its key was checked when the column itself was encoded). */
static inline uint64_t etl_row_key(const etl_row *r, uint32_t c) {
  uint64_t key = DLREC_ETL_MISSING_KEY;
  const dlrec_text t = r->cin[c];
  if (t.n && r->keys) key = r->keys[c];
  else if (t.n) dlrec_cat_key(r->e->cat[c].key_kind, r->e->cat[c].salt, t.s, t.n, &key);
  return key;
}

/* The local id of one-hot input column c's field (missing when empty). */
static inline uint64_t etl_row_local(const etl_row *r, uint32_t c) {
  if (r->local) return r->local[c];
  if (!r->cin[c].n) return ETL_LOCAL_MISSING;
  const uint64_t key = etl_row_key(r, c);
  return etl_cat_local(&r->e->cat[c], key, keymap_hash(key));
}

/* A good row of fit's pass (etl_fit.c), as a derived column counts it. */
typedef struct etl_fit_row {
  const dlrec_raw_row *row;
  const uint64_t *keys, *hashes; /* one-hot categorical fields' keys and their keymap hashes (where not empty) */
  int positive;                  /* its label is 1 */
  uint32_t file;                 /* its input's number and line */
  uint64_t line;
} etl_fit_row;

/* One worker's share of a derived column's counts. */
typedef struct etl_fit_slot {
  keymap *map;       /* ETL_ROLE_CAT: the column's count table */
  uint64_t *missing; /* ETL_ROLE_CAT: rows without a value */
  void *acc;         /* the operator's own (fit_acc_new), or NULL */
} etl_fit_slot;

/* A derived column when fit's pass is over (fit_end). */
typedef struct etl_fit_end {
  dlrec_etl *e;     /* the state being built: the input columns, and the categorical columns counted
                       by key, are finished (vocabularies, bucket ranks, counts) */
  etl_derived *d;
  uint32_t col;     /* its index among the schema's categorical (ETL_ROLE_CAT) or dense columns */
  const char *name;
  uint64_t rows, positives;
  double *held;     /* with holds: the held column's clipped values in input order (reordered at will) */
  size_t n_held;
  void *const *acc; /* with fit_acc_new: each worker's accumulator */
  int n_acc;
} etl_fit_end;

/* ---- the interface ---- */

typedef struct etl_op_type {
  const char *name; /* the workflow's member (ETL_ROLE_COLUMN) or list, and etl.json's "kind" */
  etl_op_role role;
  unsigned flags;
  const char *const *state_keys; /* derived: its members of etl.json's "op" object besides "kind" */

  /* ---- ETL_ROLE_COLUMN: the operator's part of a dense column's ops ---- */
  /* Reads its member v of the workflow (from_state 0) or etl.json (1). */
  dlrec_status (*column_parse)(const struct cJSON *v, const char *what, int from_state, etl_dense_ops *ops);
  int (*column_set)(const etl_dense_ops *ops); /* it is set: the state records it */
  struct cJSON *(*column_json)(const etl_dense_ops *ops);
  int (*column_holds)(const etl_dense_ops *ops); /* optional: fit must hold the column's values */
  /* Optional: when the pass is over, learn from the column's clipped values held[0, n). */
  void (*column_fit_end)(etl_dense_ops *ops, double *held, size_t n, const char *name);
  /* Optional: 1 when a missing value reads as *x (raw units), which fit's
   * statistics then count for each missing row. */
  int (*column_fills)(const etl_dense_ops *ops, double *x);
  /* Optional: after the state loaded the column's statistics (dense column col). */
  dlrec_status (*column_prepare)(dlrec_etl *e, uint32_t col, const char *what);
  int (*column_same)(const etl_dense_ops *a, const etl_dense_ops *b);

  /* ---- derived columns ---- */
  /* Reads a workflow entry o (its members checked by the operator; "name"
   * is the generic code's) into d, whose type is set, and writes the
   * column's default name into dflt (dflt_size bytes). */
  dlrec_status (*parse)(const struct cJSON *o, const char *what, const dlrec_columns *cols, etl_derived *d,
                        char *dflt, size_t dflt_size);
  /* Reads etl.json's "op" object (its members already checked against
   * state_keys) into d, sources resolved among cols. */
  dlrec_status (*load)(const struct cJSON *op, const char *what, const dlrec_columns *cols, etl_derived *d);
  /* Adds d's members to its "op" object (after "kind"). */
  void (*save)(const dlrec_columns *cols, const etl_derived *d, struct cJSON *op);
  int (*holds)(const etl_derived *d); /* optional: the input dense column fit holds the values of, or -1 */
  dlrec_status (*fit_acc_new)(const etl_derived *d, void **acc); /* optional: a worker's accumulator */
  void (*fit_acc_free)(void *acc);
  /* Optional: counts a good row into a worker's slot (fit's workers, any order). */
  dlrec_status (*fit_row)(const etl_derived *d, const etl_fit_slot *s, const etl_fit_row *r);
  /* Builds the column (the state's e->cat[col] or e->dense[col]) when the pass is over;
   * optional for ETL_OP_COUNTS_KEYS, whose column fit builds. */
  dlrec_status (*fit_end)(etl_fit_end *f);
  /* ETL_ROLE_CAT: the row's local id in its column k. */
  dlrec_status (*encode_cat)(const etl_row *r, const etl_derived *d, const etl_cat *k, uint64_t *local);
  /* ETL_ROLE_DENSE: where the row's value is (prefetched with the others
   * before any is read), then the value, before the dense transform. */
  const void *(*locate)(const etl_row *r, const etl_derived *d);
  double (*value)(const void *at);
  /* Optional: a section of vocab.bin after the categorical columns', in dense-column
   * order: written through put, and read from p[0, avail) (*used bytes);
   * `index` and `name` are the dense column's, for messages. */
  dlrec_status (*section_save)(const etl_derived *d, dlrec_status (*put)(void *ctx, const void *p, size_t n),
                               void *ctx);
  dlrec_status (*section_load)(dlrec_etl *e, etl_derived *d, const unsigned char *p, uint64_t avail,
                               uint64_t *used, const char *vpath, uint32_t index, const char *name);
  /* Whether x (of state a) and y (of b) encode the same, from their
   * definitions to the tables they read. */
  int (*same)(const dlrec_etl *a, const dlrec_etl *b, const etl_derived *x, const etl_derived *y);
  void (*free)(etl_derived *d); /* optional: what it owns (d stays valid to free again) */
} etl_op_type;

/* ---- the registry (etl_ops.c) ---- */

extern const etl_op_type etl_op_fill, etl_op_clip, etl_op_cross, etl_op_bucketize, etl_op_count, etl_op_target;

/* Every operator, NULL-terminated, in the order the state records them:
 * column operators in a column's members, derived columns in the schema. */
extern const etl_op_type *const etl_ops[];

/* The operator of a role by name, or NULL. */
const etl_op_type *etl_op_find(const char *name, etl_op_role role);

/* The names of the operators of a role, joined by sep ("count, target"). */
void etl_op_names(etl_op_role role, const char *sep, char *out, size_t size);

/* Frees what d's operator owns (accepts an input column's). */
static inline void etl_derived_free(etl_derived *d) {
  if (d->type && d->type->free) d->type->free(d);
}

/* ---- the workflow (etl_workflow.c) ---- */

/* A parsed workflow: the input's dense columns' operators, and the derived
 * columns in schema order (etl_workflow_free frees them). */
typedef struct etl_workflow {
  etl_dense_ops ops[DLREC_MAX_DENSE];
  uint32_t n_dense, n_cat; /* derived columns */
  etl_derived dense[DLREC_MAX_DENSE], cat[DLREC_MAX_SPARSE];
  char dense_names[DLREC_MAX_DENSE][DLREC_NAME_MAX], cat_names[DLREC_MAX_SPARSE][DLREC_NAME_MAX];
} etl_workflow;

/* Parses a workflow (dlrec_etl_fit_opts.workflow, JSON text; NULL: none)
 * for the input columns cols; raw_keys refuses derived columns. */
dlrec_status etl_workflow_parse(const char *text, const dlrec_columns *cols, int raw_keys, etl_workflow *wf);
void etl_workflow_free(etl_workflow *wf);

/* ---- helpers for operators ---- */

/* A workflow entry's source column v by name: categorical (cat, one-hot)
 * or dense; its index, or -1 with an error naming what is wrong. */
int etl_workflow_source(const dlrec_columns *cols, const struct cJSON *v, int cat, const char *what);

/* A workflow entry's integer member key in [lo, hi]; dflt when absent
 * (UINT64_MAX: required). */
dlrec_status etl_workflow_uint(const struct cJSON *o, const char *key, const char *what, uint64_t lo, uint64_t hi,
                               uint64_t dflt, uint64_t *out);

/* The index of input column v (a name) among names[0, n), or -1. */
int etl_input_index(const char (*names)[DLREC_NAME_MAX], uint32_t n, const struct cJSON *v);

/* An "op" object's "column": an input column, dense or one-hot categorical
 * (cat), into d's first source; an error naming it otherwise. */
dlrec_status etl_state_source(const struct cJSON *op, const char *what, const dlrec_columns *cols, int cat,
                              etl_derived *d);

/* Builds column c's vocabulary (or, with force_buckets or more than
 * hash_buckets kept values, its ranked buckets) from its counts in m, which
 * it frees (etl_fit_vocab.c); own[0..2) receive the arrays it allocates. */
dlrec_status etl_finish_column(uint64_t min_count, uint64_t hash_buckets, etl_cat *c, keymap *m, void **own,
                               uint64_t force_buckets);

/* A derived dense column's statistics, its value xv[g] on w[g] of fit's
 * rows (groups of equal value), with out->transform applied. */
void etl_group_stats(etl_dense *out, const double *xv, const uint64_t *w, uint64_t groups, uint64_t rows);

/* A dense column's source vocabulary must be in memory (not in a file of
 * fit within --memory-mb) for an encoding of it. */
dlrec_status etl_fit_needs_vocab(const etl_fit_end *f, uint32_t src);

/* Whether a[0, n) and b[0, n) hold the same bytes (statistics and
 * parameters compare bitwise, as the encoders use them). */
static inline int etl_same_bits(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

/* qsort's order of doubles. */
int etl_cmp_double(const void *a, const void *b);

/* vocab.bin's sections: a 16-byte header (encoding u32, a u32, n u64),
 * and little-endian fields. */
#define ETL_VOCAB_SECTION 16u
enum { ETL_ENC_VOCAB = 0, ETL_ENC_HASHED = 1, ETL_ENC_TARGET = 2 };
static inline void etl_put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void etl_put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t etl_get32(const unsigned char *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static inline uint64_t etl_get64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* "PATH: WHAT (the ETL state is damaged: run 'dlrec etl fit' again)", WHAT
 * formatted from fmt with two numbers. */
dlrec_status etl_vocab_corrupt(const char *path, const char *fmt, unsigned long long a, unsigned long long b);

#endif
