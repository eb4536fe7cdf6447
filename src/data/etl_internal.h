/* Internal: the ETL state in memory, shared by fit (etl_fit.c: builds and
 * saves it), the files (etl_state.c, etl_vocab.c), the encoders
 * (etl_encode.c) and apply (etl_apply.c); and what fit and apply share when
 * they read inputs (etl_run.c). The workflow's operators, each in its own
 * file, plug in through etl_op.h. */
#ifndef DLREC_DATA_ETL_INTERNAL_H
#define DLREC_DATA_ETL_INTERNAL_H

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "data/keymap.h"
#include "data/layout.h"
#include "data/etl.h"
#include "core/hash.h"

#define ETL_JSON "etl.json"
#define ETL_VOCAB "vocab.bin"
#define ETL_FORMAT_NAME "dlrec-etl"
#define ETL_CRC_KEY "state_crc32c" /* etl.json's checksum of itself */
#define ETL_LOCAL_MISSING 0u
#define ETL_LOCAL_OOV 1u
#define ETL_LOCAL_FIRST 2u

/* A dense column's operators (etl fit --workflow; the column operators
 * fill_missing and clip of etl_op_fill.c and etl_op_clip.c), in raw units:
 * clip to [clip_lo, clip_hi], and a missing value replaced by fill_value (a
 * constant, or the median of the column's clipped values in fit). */
typedef enum etl_fill { ETL_FILL_NONE = 0, ETL_FILL_CONSTANT = 1, ETL_FILL_MEDIAN = 2 } etl_fill;
typedef struct etl_dense_ops {
  etl_fill fill;
  double fill_value;
  int clip;
  double clip_lo, clip_hi;
} etl_dense_ops;

/* x clipped by ops (raw units): clip's encoder, inline because fit and
 * every encoder run it on each dense value (etl_op_clip.c). */
static inline double etl_clip(const etl_dense_ops *op, double x) {
  if (!op->clip) return x;
  return x < op->clip_lo ? op->clip_lo : x > op->clip_hi ? op->clip_hi : x;
}

/* A derived column (the workflow's cross, bucketize, count and target
 * operators; docs/etl.md): computed from input columns (src, indices into
 * dlrec_etl.cols) by its operator (type; etl_op.h), wherever rows are
 * encoded. Derived columns follow the input's in the schema: dense ones
 * (count, target) after its dense columns, categorical ones (cross,
 * bucketize) after its categorical columns. The members after src are the
 * parameters and fitted tables of the operators that use them. */
#define ETL_CROSS_MAX 8
struct etl_op_type;
typedef struct etl_derived {
  const struct etl_op_type *type; /* NULL: an input column */
  uint32_t src[ETL_CROSS_MAX], n_src;
  /* cross: the buckets it hashes into */
  uint64_t buckets;
  /* bucketize: boundaries (malloc'd; the state owns them), given or fitted
   * from `quantiles` (0: given) */
  double *bounds;
  uint32_t n_bounds, quantiles;
  /* target */
  uint32_t folds;
  double smoothing;
  uint64_t seed;
  uint64_t groups;       /* the source column's size */
  const uint64_t *stats; /* (folds, groups, 2): rows, positives of fold f in group g */
  double *full, *oof;    /* the encodings of each group, and (folds, groups) out of fold (set at load) */
} etl_derived;

typedef struct etl_dense {
  uint64_t count, missing;
  double min, max, mean, std; /* min, max: of the clipped raw values; mean, std: of the transformed
                                 values after filling (what standardize divides by) */
  double inv_std; /* 1 / std, or 1 when std is 0 (a constant column) */
  etl_dense_ops ops;
  float fill_out;  /* a missing value's encoding: 0, or the fill's (set when the state is loaded) */
  dlrec_dense_transform transform; /* the state's, or none for a target encoding (set at load) */
  etl_derived derived;
} etl_dense;

typedef struct etl_cat {
  dlrec_key_kind key_kind;
  uint64_t salt;
  int hashed;
  uint64_t buckets;   /* hashed: N */
  uint64_t kept;      /* keys with count >= min_count */
  uint64_t distinct, missing, oov;
  uint64_t size;      /* local ids */
  uint64_t id_begin;
  /* Vocabulary columns: keys[i], counts[i] of local id 2 + i (kept entries). */
  const uint64_t *keys, *counts;
  /* Hashed columns: rank of each bucket; counts in rank order. */
  const uint32_t *bucket_rank;
  const uint64_t *bucket_counts;
  keymap map; /* vocabulary columns: key -> local id (built by the loader) */
  /* Multi-hot columns: the byte between values (0: one-hot), and the value
   * occurrences fit counted (the counts add up to it, not to the rows). The
   * hotness, max hotness and pooling are the schema's. */
  char sep;
  uint64_t values;
  etl_derived derived;
  /* fit within --memory-mb: a vocabulary too large for memory lives in this
   * file (keys, then counts; keys and counts are NULL), which etl_save copies */
  const struct etl_runs *vocab_file;
} etl_cat;

struct dlrec_etl {
  dlrec_input_format format;
  char *spec;            /* CSV SPEC as given to fit */
  char **header;         /* CSV: fit's header names (one malloc'd block) */
  uint32_t n_header;
  dlrec_columns cols;
  dlrec_schema schema;
  uint64_t min_count, hash_buckets;
  dlrec_dense_transform transform;
  int standardize;
  uint64_t rows, positives, bad_rows;
  uint32_t state_crc;      /* etl.json's state_crc32c, as loaded (dlrec_etl_state_crc) */
  etl_dense dense[DLREC_MAX_DENSE];
  etl_cat cat[DLREC_MAX_SPARSE];
  dlrec_layout *layout[2]; /* encode_line's layouts without / with the label */
  uint32_t libfm_fields;   /* libFM: the fields fit was told */
  int multi;               /* some column is multi-hot (and every raw-keys state) */
  /* Raw keys (dlrec_etl_fit_opts.raw_keys): the schema is the keys schema;
   * the columns keep the vocabulary layout fit recorded (no kept values),
   * whose table rows are vocab_rows. */
  int raw_keys;
  uint64_t vocab_rows;
  uint64_t ids_max;        /* the most ids a row encodes to: the sum of max hotness */
  void *owned[2 * DLREC_MAX_SPARSE + DLREC_MAX_DENSE + 1]; /* buffers keys/counts/ranks/stats point into */
  int n_owned;
};

/* Turns a raw-keys state's schema from the vocabulary layout into the keys
 * schema (dlrec_schema.keys): two ids a value, ranges [0, 2^32). */
void etl_keys_schema(dlrec_etl *e);

/* Column c's raw key for a value's key (see data/etl.h). */
static inline uint64_t etl_raw_key(uint32_t c, uint64_t key) {
  return dlrec_mix64(key + (uint64_t)(c + 1) * 0x9e3779b97f4a7c15ull);
}

/* Writes e (keys, counts and ranks from its arrays) to dir atomically:
 * vocab.bin first, then etl.json, which records vocab.bin's size and CRC. */
dlrec_status etl_save(const dlrec_etl *e, const char *dir);

/* vocab.bin (etl_vocab.c): written from e to path atomically, its size and
 * CRC32C handed back for etl.json; or checked against etl.json's (the
 * columns and their statistics read from it) and the columns pointed into
 * buf[0, n), which e then owns. */
dlrec_status etl_vocab_save(const dlrec_etl *e, const char *path, uint64_t *bytes, uint32_t *crc);
dlrec_status etl_vocab_load(dlrec_etl *e, const char *vpath, unsigned char *buf, size_t n, uint64_t want_bytes,
                            uint32_t want_crc);

/* Builds encode_line's layouts (CSV: from the header). */
dlrec_status etl_build_layouts(dlrec_etl *e);

/* ---- the per-value encoders, shared by apply and the public functions ---- */

/* log1p(x) of the integers 0..ETL_LOG_TABLE-1, computed by log1p itself (so
 * identical to it): most raw counts are small integers, and a table lookup
 * is much cheaper than log1p. */
#define ETL_LOG_TABLE 1024
extern double etl_log1p_table[ETL_LOG_TABLE];

/* The next line of a block (without its '\n'): sets *s and *n and advances
 * *p past it. The caller loops while *p < end; a last line without a final
 * newline ends at end. */
static inline void etl_next_line(const char **p, const char *end, const char **s, size_t *n) {
  const char *nl = memchr(*p, '\n', (size_t)(end - *p));
  *s = *p;
  *n = (size_t)((nl ? nl : end) - *p);
  *p = nl ? nl + 1 : end;
}

/* The dense transform t(x). */
static inline double etl_transform(dlrec_dense_transform tr, double x) {
  if (tr != DLREC_DENSE_LOG) return x;
  if (!(x > 0)) return 0.0; /* log(1 + max(x, 0)) */
  if (x < ETL_LOG_TABLE) {
    uint32_t i = (uint32_t)x;
    if ((double)i == x) return etl_log1p_table[i];
  }
  return log1p(x);
}

/* Dense values are stored and fed to the model as float32: a transformed
 * value beyond float32's range would become inf, so it is a bad value
 * instead (fit refuses it too, which also keeps fit's sums of squares far
 * from double's range). */
#define ETL_BEYOND_FLOAT32 "value beyond float32 range (|t| > 3.4e38)"

/* A raw value x of dense column col, clipped, transformed and standardized. */
static inline const char *etl_dense_encode(const dlrec_etl *e, uint32_t col, double x, float *out) {
  double t = etl_transform(e->dense[col].transform, etl_clip(&e->dense[col].ops, x));
  if (!(fabs(t) <= FLT_MAX)) return ETL_BEYOND_FLOAT32;
  if (e->standardize) {
    /* A column of tiny std in fit can blow up a value fit never saw. */
    t = (t - e->dense[col].mean) * e->dense[col].inv_std;
    if (!(fabs(t) <= FLT_MAX)) return "standardized value beyond float32 range";
  }
  *out = (float)t;
  return NULL;
}

/* etl_dense_value that also hands back the parsed raw value in *x (left
 * as it is for a missing value), for a derived column reading the field. */
static inline const char *etl_dense_value_x(const dlrec_etl *e, uint32_t col, const char *s, size_t n, float *out,
                                            double *x) {
  if (n == 0) {
    /* Missing: 0, or the fill's encoding (etl_dense_encode of the fill
     * value, computed once when the state is loaded). */
    *out = e->dense[col].fill_out;
    return NULL;
  }
  const char *why = dlrec_parse_number(s, n, x);
  return why ? why : etl_dense_encode(e, col, *x, out);
}

static inline const char *etl_dense_value(const dlrec_etl *e, uint32_t col, const char *s, size_t n, float *out) {
  double x;
  return etl_dense_value_x(e, col, s, n, out, &x);
}

/* Local id of a key in categorical column col. */
static inline uint32_t etl_cat_local(const etl_cat *c, uint64_t key, uint64_t hash) {
  if (c->hashed) return ETL_LOCAL_FIRST + c->bucket_rank[dlrec_mix64(key) % c->buckets];
  const uint64_t *v = keymap_find_h(&c->map, key, hash);
  return v ? (uint32_t)*v : ETL_LOCAL_OOV;
}

/* Builds a vocabulary column's key -> local id map from its keys; `where`
 * and name for messages. */
dlrec_status etl_build_map(etl_cat *c, const char *where, const char *name);

/* Global id of categorical column col's raw text; NULL or a reason. */
static inline const char *etl_cat_id(const dlrec_etl *e, uint32_t col, const char *s, size_t n, uint32_t *id) {
  const etl_cat *c = &e->cat[col];
  if (n == 0) {
    *id = (uint32_t)(c->id_begin + ETL_LOCAL_MISSING);
    return NULL;
  }
  uint64_t key;
  const char *why = dlrec_cat_key(c->key_kind, c->salt, s, n, &key);
  if (why) return why;
  *id = (uint32_t)(c->id_begin + etl_cat_local(c, key, keymap_hash(key)));
  return NULL;
}

/* The values of a multi-hot field, split at sep; empty values are skipped.
 * Loop: while (etl_next_value(&p, end, sep, &v, &vn)) ... */
static inline int etl_next_value(const char **p, const char *end, char sep, const char **v, size_t *vn) {
  while (*p < end) {
    const char *q = memchr(*p, sep, (size_t)(end - *p));
    if (!q) q = end;
    *v = *p;
    *vn = (size_t)(q - *p);
    *p = q < end ? q + 1 : end;
    if (*vn) return 1;
  }
  return 0;
}

/* Where a row was in fit's inputs (its input's number and its line), for
 * the out-of-fold target encodings of etl apply; NULL: the full ones. */
typedef struct etl_pos {
  uint32_t file;
  uint64_t line;
} etl_pos;

/* Encodes one split row (label if with_label, dense, ids) as apply does; a
 * bad value is DLREC_ERR_PARSE naming w (may be NULL) and the field of L.
 * ids receives each column's ids in turn (at most e->ids_max in all), nids[c]
 * how many column c has (1 for one-hot columns; a multi-hot column with no
 * value has one id, its missing id); *truncated (may be NULL) counts the
 * columns that had more values than their max hotness (the first ones kept).
 * The input columns (row) are the layout's; the output (dense, ids) is the
 * schema's, derived columns included. */
dlrec_status etl_encode_row(const dlrec_etl *e, const dlrec_layout *L, const dlrec_raw_row *row, int with_label,
                            const dlrec_where *w, const etl_pos *pos, float *label, float *dense, uint32_t *ids,
                            uint32_t *nids, uint32_t *truncated);

/* ---- fit's count tables on disk (etl_spill.c) ---- */

/* A key and its count. */
typedef struct etl_kc {
  uint64_t key, count;
} etl_kc;

/* Sorts a[0, n) by key (by_key), or by count descending then key ascending
 * (a vocabulary's order): a radix sort, with qsort for small n (etl_fit_vocab.c). */
void etl_sort_kc(etl_kc *a, uint64_t n, int by_key);

/* Runs of sorted pairs in one file (removed by etl_runs_close); runs are
 * added by any thread. */
typedef struct etl_runs {
  int open, fd;
  char path[4200];
  _Atomic uint64_t end; /* bytes reserved */
  pthread_mutex_t mu;   /* the run list */
  uint64_t *off, *n;    /* (count) each run's offset and pairs */
  uint32_t count, cap;
} etl_runs;

dlrec_status etl_runs_open(etl_runs *r, const char *dir, const char *name);
/* Appends a run of n pairs, sorted as the merge will read them. */
dlrec_status etl_runs_add(etl_runs *r, const etl_kc *pairs, uint64_t n);
void etl_runs_close(etl_runs *r); /* accepts a closed one */

/* The pairs of every run in one order: by key (by_count 0) or by count
 * descending then key; read buffers share `memory` bytes. */
typedef struct etl_merge etl_merge;
dlrec_status etl_merge_open(etl_merge **m, const etl_runs *r, int by_count, uint64_t memory);
/* The next pair (*got 1), or *got 0 at the end. */
dlrec_status etl_merge_next(etl_merge *m, etl_kc *out, int *got);
void etl_merge_close(etl_merge *m); /* accepts NULL */

/* ---- running fit and apply over input files (etl_run.c) ---- */

/* How each categorical column derives keys: hex for Criteo, a salted hash of
 * the text for CSV. */
typedef struct etl_column_keys {
  dlrec_key_kind kind[DLREC_MAX_SPARSE];
  uint64_t salt[DLREC_MAX_SPARSE];
} etl_column_keys;

void etl_column_keys_init(etl_column_keys *k, dlrec_input_format f, const dlrec_columns *c);

/* The input files of a run, read one after the other as blocks of lines. */
typedef struct etl_inputs {
  const char *const *paths;
  const dlrec_source *sources; /* (n) read instead of paths when not NULL */
  uint32_t n;
  dlrec_input_format format;
  int has_label;
  size_t block_bytes, max_line_bytes;
  dlrec_columns cols;     /* the columns every file's layout looks for */
  char **header;          /* CSV: the first file's header names (one block) */
  uint32_t n_header;
  etl_column_keys keys;
  dlrec_layout **layouts; /* (n) per file, built when the file is opened */
  char **names;           /* (n) file names for messages */
  uint64_t total_bytes;   /* sizes added up; 0 when one is unknown (a pipe) */
  uint64_t header_bytes;  /* CSV header bytes read and not yet reported as done */
  uint32_t next;          /* next file to open */
  uint32_t cur;           /* the open file */
  dlrec_reader *r;
} etl_inputs;

/* Checks that every input exists (sources: read those instead, their
 * names for messages). For CSV with a SPEC (fit), reads the first
 * file's header and resolves the SPEC into in->cols; otherwise uses cols. */
dlrec_status etl_inputs_init(etl_inputs *in, const char *const *paths, const dlrec_source *sources, int n,
                             dlrec_input_format format, const char *spec, const dlrec_columns *cols, int has_label,
                             size_t block_bytes, size_t max_line_bytes);
/* The next block of any file, with the file's index; DLREC_END after the
 * last. *bytes is the input it stands for (the block, plus any CSV header
 * read since the last call), for progress. */
dlrec_status etl_inputs_next(etl_inputs *in, dlrec_block *b, uint32_t *file, uint64_t *bytes);
void etl_inputs_free(etl_inputs *in);

/* Bad rows a worker skipped in one block: their messages, in order. */
typedef struct etl_badlist {
  char *text; /* NUL-separated messages */
  size_t len, cap;
  uint64_t n;
} etl_badlist;

static inline void etl_badlist_clear(etl_badlist *b) {
  b->len = 0;
  b->n = 0;
}
dlrec_status etl_badlist_add(etl_badlist *b, const char *msg);
/* Warns about each bad row, adding to *total; the row that takes *total over
 * limit is an error instead. */
dlrec_status etl_badlist_report(const etl_badlist *b, uint64_t *total, uint64_t limit);
void etl_badlist_free(etl_badlist *b);

/* Criteo rows of fewer fields than the layout's are valid (public copies
 * strip trailing empty fields) but may be torn lines, so runs count them and
 * name the first. Returns 1 for such a row; with strict set it is a bad row
 * instead (*st is the error; w may be NULL for a line of no file). */
static inline int etl_short_row(const dlrec_layout *L, const dlrec_raw_row *row, int strict, const dlrec_where *w,
                                dlrec_status *st) {
  *st = DLREC_OK;
  if (L->format != DLREC_FORMAT_CRITEO || row->n_fields >= L->n_fields) return 0;
  if (strict && w)
    *st = dlrec_error(DLREC_ERR_PARSE, "%s:%llu: %u fields, expected %u (--strict-fields)", w->file,
                      (unsigned long long)w->line, row->n_fields, L->n_fields);
  else if (strict)
    *st = dlrec_error(DLREC_ERR_PARSE, "%u fields, expected %u (--strict-fields)", row->n_fields, L->n_fields);
  return 1;
}

/* The short rows of a run: a block's (first_line is the first short line of
 * the block, in its file), or the whole run's in input order. */
typedef struct etl_shorts {
  uint64_t n;
  uint64_t first_line;
  uint32_t first_file;
} etl_shorts;

static inline void etl_shorts_add_line(etl_shorts *s, uint32_t file, uint64_t line) {
  if (s->n++ == 0) s->first_file = file, s->first_line = line;
}

/* Adds a block's short rows to the run's; blocks come in input order. */
static inline void etl_shorts_add(etl_shorts *run, const etl_shorts *block) {
  if (block->n && run->n == 0) run->first_file = block->first_file, run->first_line = block->first_line;
  run->n += block->n;
}

/* Fills the report's short-row fields. */
void etl_shorts_report(const etl_shorts *s, const etl_inputs *in, dlrec_etl_report *rep);

/* "FILE:LINE: line longer than N bytes (--max-line-bytes)". */
dlrec_status etl_line_too_long(const dlrec_where *w, size_t max);

#endif
