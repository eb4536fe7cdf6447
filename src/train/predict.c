/* Batch prediction from raw rows or .dlr files. */
#include "train/predict.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/log.h"
#include "data/parse.h"
#include "core/progress.h"
#include "train/trainer.h"

void dlrec_predict_opts_default(dlrec_predict_opts *o) {
  *o = (dlrec_predict_opts){.batch_rows = 4096, .progress = 1};
}

/* The output stream: a temp file renamed on success, or stdout. */
typedef struct sink {
  FILE *f;
  const char *path;
  char tmp[4096];
  uint64_t rows;
  dlrec_progress *bar;
} sink;

static dlrec_status sink_open(sink *s, const char *path) {
  s->path = path;
  if (!strcmp(path, "-")) {
    s->f = stdout;
    return DLREC_OK;
  }
  if (snprintf(s->tmp, sizeof s->tmp, "%s.tmp", path) >= (int)sizeof s->tmp)
    return dlrec_error(DLREC_ERR_INVALID, "%s: path too long", path);
  s->f = fopen(s->tmp, "w");
  if (!s->f) return dlrec_error(DLREC_ERR_IO, "%s: %s", s->tmp, strerror(errno));
  return DLREC_OK;
}

static dlrec_status sink_write(void *ctx, const float *prob, const float *label, uint32_t n) {
  (void)label;
  sink *s = ctx;
  for (uint32_t i = 0; i < n; i++)
    if (fprintf(s->f, "%.9g\n", prob[i]) < 0) return dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
  s->rows += n;
  dlrec_progress_add(s->bar, n);
  return DLREC_OK;
}

static dlrec_status sink_close(sink *s, dlrec_status st) {
  if (s->f == stdout) {
    if (fflush(stdout) != 0 && st == DLREC_OK) st = dlrec_error(DLREC_ERR_IO, "stdout: write failed: %s", strerror(errno));
    return st;
  }
  if (s->f) {
    if (st == DLREC_OK && (fflush(s->f) != 0 || fsync(fileno(s->f)) != 0))
      st = dlrec_error(DLREC_ERR_IO, "%s: write failed: %s", s->tmp, strerror(errno));
    if (fclose(s->f) != 0 && st == DLREC_OK) st = dlrec_error(DLREC_ERR_IO, "%s: close failed: %s", s->tmp, strerror(errno));
  }
  if (st == DLREC_OK) st = dlrec_rename_durable(s->tmp, s->path);
  if (st != DLREC_OK) unlink(s->tmp);
  return st;
}

static int is_dlr(const char *path) {
  size_t n = strlen(path);
  return n > 4 && !strcmp(path + n - 4, ".dlr");
}

/* One categorical column's ids of the rows in a batch (CSR): offsets
 * (B + 1) and ids, grown geometrically for multi-hot columns. */
typedef struct col_ids {
  uint32_t *ids;
  size_t n, cap;
} col_ids;

static dlrec_status col_push(col_ids *c, const uint32_t *ids, uint32_t k) {
  if (c->n + k > c->cap) {
    size_t cap = c->cap * 2 > c->n + k ? c->cap * 2 : c->n + k;
    uint32_t *p = realloc(c->ids, cap * sizeof *p);
    if (!p) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for %zu ids", cap);
    c->ids = p;
    c->cap = cap;
  }
  memcpy(c->ids + c->n, ids, k * sizeof *ids);
  c->n += k;
  return DLREC_OK;
}

/* Short rows are valid, but a torn line reads the same way: say so, as etl
 * does; and the rows whose multi-hot fields were cut to their max hotness. */
static void say_read_as(const char *input, uint64_t short_rows, uint64_t first_short, uint64_t cut_rows,
                        uint64_t first_cut) {
  if (short_rows)
    DLREC_INFO("predict: %llu rows had fewer fields than Criteo's 40 (39 unlabeled), the first at %s:%llu: their "
               "missing fields read as empty (a torn line reads so too; --strict-fields refuses them)",
               (unsigned long long)short_rows, input, (unsigned long long)first_short);
  if (cut_rows)
    DLREC_INFO("predict: %llu rows had more values in a multi-hot field than its max hotness, the first at %s:%llu: "
               "their first values were kept, as etl apply keeps them", (unsigned long long)cut_rows, input,
               (unsigned long long)first_cut);
}

/* Raw rows: read lines, encode each with the checkpoint's ETL state (one id
 * per column, or each multi-hot column's ids), gather them per column, and
 * score full batches. */
dlrec_status dlrec_predict_stream(const dlrec_model *m, FILE *in, const char *input, const dlrec_predict_opts *o,
                                  dlrec_score_fn fn, void *ctx) {
  const dlrec_schema *sc = dlrec_etl_schema(m->etl);
  uint32_t B = o->batch_rows, F = sc->n_sparse, D = sc->n_dense;
  /* Criteo rows go through the one-hot encoder, which also checks short
   * rows (a notion of Criteo's layout only); CSV, libSVM and libFM rows,
   * whose columns may be multi-hot, through the multi-hot one. */
  const int multi = dlrec_etl_format(m->etl) != DLREC_FORMAT_CRITEO || sc->keys; /* raw keys: two ids a value */
  const uint64_t row_ids = dlrec_etl_ids_max(m->etl); /* the most ids one row encodes to */
  float *dense = malloc(((size_t)B * D + 1) * sizeof *dense), *labels = malloc(B * sizeof *labels);
  float *prob = malloc(B * sizeof *prob);
  uint32_t *ids = malloc((row_ids + 1) * sizeof *ids), nids[DLREC_MAX_SPARSE];
  uint32_t *offsets = malloc((size_t)F * (B + 1) * sizeof *offsets + 1);
  col_ids cols[DLREC_MAX_SPARSE];
  memset(cols, 0, sizeof cols);
  dlrec_net_ws *ws = NULL;
  dlrec_net_scorer *scorer = NULL;
  dlrec_layout *layout = NULL; /* a CSV input's, from its header */
  char *line = NULL;
  size_t cap = 0;
  dlrec_status s = dense && labels && prob && ids && offsets ? DLREC_OK : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (s == DLREC_OK) s = dlrec_net_ws_create(&ws, m->net, B);
  if (s == DLREC_OK) s = dlrec_net_scorer_create(&scorer, m->net);
  dlrec_batch batch;
  memset(&batch, 0, sizeof batch);
  batch.dense = dense;
  batch.labels = NULL;
  for (uint32_t c = 0; c < F && offsets; c++) {
    batch.offsets[c] = offsets + (size_t)c * (B + 1);
    offsets[(size_t)c * (B + 1)] = 0;
  }
  uint64_t lineno = 0, short_rows = 0, first_short = 0, cut_rows = 0, first_cut = 0;
  uint32_t n = 0;
  int csv = dlrec_etl_format(m->etl) == DLREC_FORMAT_CSV;
  while (s == DLREC_OK) {
    ssize_t len = getline(&line, &cap, in);
    if (len >= 0) {
      lineno++;
      while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
      /* A UTF-8 byte-order mark is not part of the first row (as in etl). */
      char *text = line;
      if (lineno == 1 && len >= 3 && !memcmp(line, "\xef\xbb\xbf", 3)) text += 3, len -= 3;
      if (csv && lineno == 1) { /* the header: columns are found by name, as etl apply finds them */
        s = dlrec_etl_header_layout(m->etl, text, (size_t)len, !o->no_label, input, &layout);
        continue;
      }
      int short_row = 0;
      uint32_t cut = 0;
      if (!multi) {
        s = dlrec_etl_encode_line_checked(m->etl, text, (size_t)len, !o->no_label, o->strict_fields, labels + n,
                                          dense + (size_t)n * D, ids, &short_row);
        for (uint32_t c = 0; c < F; c++) nids[c] = 1;
      } else {
        s = dlrec_etl_encode_line_in(m->etl, layout, text, (size_t)len, !o->no_label, labels + n, dense + (size_t)n * D,
                                     ids, nids, &cut);
      }
      if (short_row && short_rows++ == 0) first_short = lineno;
      if (cut && cut_rows++ == 0) first_cut = lineno;
      if (s != DLREC_OK) {
        dlrec_error_context("%s:%llu: ", input, (unsigned long long)lineno);
        break;
      }
      /* Rows are encoded row-major (each column's ids in turn); the batch
       * wants one array per column. */
      const uint32_t *at = ids;
      for (uint32_t c = 0; s == DLREC_OK && c < F; c++) {
        s = col_push(&cols[c], at, nids[c]);
        at += nids[c];
        offsets[(size_t)c * (B + 1) + n + 1] = (uint32_t)cols[c].n;
      }
      n++;
    } else if (ferror(in)) {
      s = dlrec_error(DLREC_ERR_IO, "%s: read failed: %s", input, strerror(errno));
    }
    if (s == DLREC_OK && (n == B || (len < 0 && n > 0))) {
      batch.rows = n;
      for (uint32_t c = 0; c < F; c++) batch.ids[c] = cols[c].ids;
      s = dlrec_net_predict(scorer, ws, &batch, prob);
      if (s == DLREC_OK) s = fn(ctx, prob, NULL, n);
      n = 0;
      for (uint32_t c = 0; c < F; c++) cols[c].n = 0;
    }
    if (len < 0) break;
  }
  if (s == DLREC_OK) say_read_as(input, short_rows, first_short, cut_rows, first_cut);
  free(line);
  dlrec_layout_free(layout);
  dlrec_net_scorer_free(scorer);
  dlrec_net_ws_free(ws);
  free(dense);
  free(labels);
  free(prob);
  free(ids);
  free(offsets);
  for (uint32_t c = 0; c < F; c++) free(cols[c].ids);
  return s;
}

dlrec_status dlrec_predict_each(const dlrec_model *m, const char *input, const dlrec_predict_opts *o, dlrec_score_fn fn,
                                void *ctx) {
  if (is_dlr(input)) {
    const char *paths[] = {input};
    return dlrec_score_files(m->net, paths, 1, o->batch_rows, 0, fn, ctx);
  }
  FILE *in = strcmp(input, "-") ? fopen(input, "r") : stdin;
  if (!in) return dlrec_error(DLREC_ERR_IO, "%s: %s", input, strerror(errno));
  dlrec_status s = dlrec_predict_stream(m, in, input, o, fn, ctx);
  if (in != stdin) fclose(in);
  return s;
}

dlrec_status dlrec_predict_file(const dlrec_model *m, const char *input, const char *output,
                                const dlrec_predict_opts *o, uint64_t *rows) {
  sink out = {0};
  dlrec_status s = sink_open(&out, output);
  if (s != DLREC_OK) return s;
  out.bar = o->progress ? dlrec_progress_start("predict", 0, "rows") : NULL;
  s = dlrec_predict_each(m, input, o, sink_write, &out);
  dlrec_progress_finish(out.bar);
  if (rows) *rows = out.rows;
  return sink_close(&out, s);
}
