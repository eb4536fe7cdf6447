/* ETL apply: encode raw rows into .dlr files with a fitted state.
 *
 * The pipeline: the caller's thread reads blocks of whole lines; workers
 * split each line and encode it with etl_encode_row (the function behind
 * dlrec_etl_encode_line, so training and serving encode alike) into the
 * block's train or validation buffers; the caller's thread copies the
 * buffers, in input order, into row groups of exactly row_group_rows rows
 * and appends them to the writers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/etl_internal.h"
#include "data/dlr.h"
#include "core/log.h"
#include "core/pipeline.h"
#include "core/clock.h"
#include "core/progress.h"

int dlrec_etl_is_valid_row(uint64_t seed, uint32_t file_index, uint64_t line, double fraction) {
  uint64_t h = dlrec_mix64(dlrec_mix64(dlrec_mix64(seed) ^ file_index) ^ line);
  return (double)(h >> 11) * 0x1p-53 < fraction;
}

/* Encoded rows of one block for one output: labels (rows), dense (rows,
 * n_dense) row-major as in a row group, ids (n_sparse, cap) column-major. */
typedef struct enc_buf {
  uint32_t rows;
  float *labels, *dense;
  uint32_t *ids;
  /* States with multi-hot columns: per column its ids, grown as needed, and
   * row starts (cap + 1), for every column alike. */
  uint32_t *cids[DLREC_MAX_SPARSE];
  size_t ccap[DLREC_MAX_SPARSE];
  uint32_t *coff[DLREC_MAX_SPARSE];
} enc_buf;

/* Appends n ids to a growable array. */
static dlrec_status ids_append(uint32_t **a, size_t *cap, size_t len, const uint32_t *ids, size_t n) {
  if (len + n > *cap) {
    size_t c = *cap ? *cap : 1024;
    while (c < len + n) c *= 2;
    uint32_t *t = realloc(*a, c * sizeof *t);
    if (!t) return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory for multi-hot ids");
    *a = t;
    *cap = c;
  }
  memcpy(*a + len, ids, n * sizeof *ids);
  return DLREC_OK;
}

typedef struct apply_job {
  dlrec_block block;
  uint32_t file;
  uint64_t bytes; /* input bytes the block stands for (progress) */
  uint32_t cap;
  enc_buf out[2]; /* train, validation */
  etl_badlist bad;
  etl_shorts shorts;
  uint64_t truncated;
} apply_job;

typedef struct apply_worker {
  dlrec_raw_row row;
  char *scratch;
  uint32_t *ids; /* (ids_max) */
  uint32_t nids[DLREC_MAX_SPARSE];
} apply_worker;

/* A row group being filled for one output, and its writer. */
typedef struct stage {
  dlrec_dlr_writer *w;
  const char *path;
  uint32_t rows;
  float *labels, *dense;
  uint32_t *ids; /* (n_sparse, row_group_rows) */
  uint64_t written;
  /* States with multi-hot columns: per column ids and row starts (group + 1). */
  uint32_t *cids[DLREC_MAX_SPARSE];
  size_t ccap[DLREC_MAX_SPARSE];
  uint32_t *coff[DLREC_MAX_SPARSE];
} stage;

typedef struct apply_ctx {
  etl_inputs in;
  const dlrec_etl *e;
  const dlrec_etl_apply_opts *o;
  uint32_t nd, nc, group;
  int with_label, split;
  apply_worker *workers;
  stage st[2];
  /* per_input: each input's output path, and the input st[0] writes now. */
  char **paths;
  uint32_t cur_out;
  uint64_t written_before; /* st[0].written when its current file was opened */
  dlrec_schema schema;     /* of the outputs */
  uint64_t bad, bytes, truncated;
  etl_shorts shorts;
  dlrec_progress *progress;
} apply_ctx;

static dlrec_status apply_produce(void *vctx, void *vjob, uint64_t seq) {
  apply_ctx *x = vctx;
  apply_job *j = vjob;
  (void)seq;
  return etl_inputs_next(&x->in, &j->block, &j->file, &j->bytes);
}

static dlrec_status job_reserve(apply_ctx *x, apply_job *j, uint64_t rows) {
  if (rows <= j->cap) return DLREC_OK;
  if (rows > UINT32_MAX / 2) return dlrec_error(DLREC_ERR_INVALID, "apply: block of %llu rows", (unsigned long long)rows);
  uint32_t cap = (uint32_t)(rows + rows / 4 + 64);
  for (int v = 0; v < 2; v++) {
    enc_buf *b = &j->out[v];
    free(b->labels), free(b->dense), free(b->ids);
    b->labels = malloc(cap * sizeof(float));
    b->dense = malloc(((size_t)cap * x->nd + 1) * sizeof(float));
    b->ids = malloc(((size_t)cap * x->nc + 1) * sizeof(uint32_t));
    if (!b->labels || !b->dense || !b->ids) return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory for a block");
    for (uint32_t c = 0; x->e->multi && c < x->nc; c++) {
      free(b->coff[c]);
      if (!(b->coff[c] = malloc(((size_t)cap + 1) * sizeof(uint32_t))))
        return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory for a block");
    }
  }
  j->cap = cap;
  return DLREC_OK;
}

static dlrec_status apply_work(void *vctx, void *vjob, int worker) {
  apply_ctx *x = vctx;
  apply_job *j = vjob;
  apply_worker *W = &x->workers[worker];
  etl_badlist_clear(&j->bad);
  j->shorts = (etl_shorts){0};
  j->out[0].rows = j->out[1].rows = 0;
  j->truncated = 0;
  dlrec_status st = job_reserve(x, j, j->block.lines);
  const int multi = x->e->multi;
  for (int v = 0; multi && v < 2; v++)
    for (uint32_t c = 0; c < x->nc; c++) j->out[v].coff[c][0] = 0;
  if (st != DLREC_OK) return st;
  const dlrec_layout *L = x->in.layouts[j->file];
  dlrec_where w = {x->in.names[j->file], j->block.first_line};
  const char *p = j->block.data, *end = p + j->block.n;
  for (; p < end; w.line++) {
    const char *s;
    size_t n;
    etl_next_line(&p, end, &s, &n);
    int v = x->split && dlrec_etl_is_valid_row(x->o->seed, j->file, w.line, x->o->valid_fraction);
    enc_buf *b = &j->out[v];
    uint32_t r = b->rows;
    float label = 0;
    int is_short = 0;
    if (n > x->o->max_line_bytes) st = etl_line_too_long(&w, x->o->max_line_bytes);
    else st = dlrec_parse_row(L, s, n, W->scratch, &W->row, &w);
    if (st == DLREC_OK) is_short = etl_short_row(L, &W->row, x->o->strict_fields, &w, &st);
    uint32_t truncated = 0;
    const etl_pos pos = {j->file, w.line};
    if (st == DLREC_OK)
      st = etl_encode_row(x->e, L, &W->row, x->with_label, &w, x->o->target_full ? NULL : &pos, &label,
                          b->dense + (size_t)r * x->nd, W->ids, W->nids, &truncated);
    if (st == DLREC_OK && multi) {
      const uint32_t *ids = W->ids;
      for (uint32_t c = 0; st == DLREC_OK && c < x->nc; c++) {
        st = ids_append(&b->cids[c], &b->ccap[c], b->coff[c][r], ids, W->nids[c]);
        b->coff[c][r + 1] = b->coff[c][r] + W->nids[c];
        ids += W->nids[c];
      }
      if (st != DLREC_OK) return st;
    }
    if (st == DLREC_OK) {
      if (is_short) etl_shorts_add_line(&j->shorts, j->file, w.line);
      j->truncated += truncated != 0;
      b->labels[r] = label;
      for (uint32_t c = 0; !multi && c < x->nc; c++) b->ids[(size_t)c * j->cap + r] = W->ids[c];
      b->rows++;
      continue;
    }
    if (st != DLREC_ERR_PARSE || x->o->skip_bad_rows == 0) return st;
    st = etl_badlist_add(&j->bad, dlrec_last_error());
    if (st != DLREC_OK) return st;
    if (j->bad.n > x->o->skip_bad_rows) break; /* the run fails at the consumer */
  }
  return DLREC_OK;
}

static dlrec_status stage_flush(apply_ctx *x, stage *g) {
  if (g->rows == 0) return DLREC_OK;
  dlrec_rowgroup rg = {.rows = g->rows, .labels = x->with_label ? g->labels : NULL, .dense = g->dense};
  for (uint32_t c = 0; c < x->nc; c++) {
    if (!x->e->multi) {
      rg.ids[c] = g->ids + (size_t)c * x->group;
      continue;
    }
    rg.ids[c] = g->cids[c];
    rg.offsets[c] = x->e->schema.sparse[c].hotness ? NULL : g->coff[c];
  }
  dlrec_status st = dlrec_dlr_writer_append(g->w, &rg);
  g->written += g->rows;
  g->rows = 0;
  return st;
}

/* Copies a block's rows for one output into row groups, flushing full ones. */
static dlrec_status stage_add(apply_ctx *x, stage *g, const enc_buf *b, uint32_t cap) {
  uint32_t done = 0;
  while (done < b->rows) {
    uint32_t k = b->rows - done;
    if (k > x->group - g->rows) k = x->group - g->rows;
    memcpy(g->labels + g->rows, b->labels + done, k * sizeof(float));
    memcpy(g->dense + (size_t)g->rows * x->nd, b->dense + (size_t)done * x->nd, (size_t)k * x->nd * sizeof(float));
    for (uint32_t c = 0; !x->e->multi && c < x->nc; c++)
      memcpy(g->ids + (size_t)c * x->group + g->rows, b->ids + (size_t)c * cap + done, k * sizeof(uint32_t));
    for (uint32_t c = 0; x->e->multi && c < x->nc; c++) {
      /* Row starts rebased onto the group's ids so far. */
      const uint32_t *off = b->coff[c];
      uint32_t base = g->coff[c][g->rows];
      dlrec_status st = ids_append(&g->cids[c], &g->ccap[c], base, b->cids[c] + off[done], off[done + k] - off[done]);
      if (st != DLREC_OK) return st;
      for (uint32_t i = 1; i <= k; i++) g->coff[c][g->rows + i] = base + (off[done + i] - off[done]);
    }
    g->rows += k;
    done += k;
    if (g->rows == x->group) {
      dlrec_status st = stage_flush(x, g);
      if (st != DLREC_OK) return st;
    }
  }
  return DLREC_OK;
}

/* per_input: finishes st[0]'s file and opens input `to`'s (inputs in
 * between, which had no rows, get empty files). */
static dlrec_status next_output(apply_ctx *x, uint32_t to) {
  stage *g = &x->st[0];
  dlrec_status st = stage_flush(x, g);
  while (st == DLREC_OK && x->cur_out < to) {
    if (g->written == x->written_before) DLREC_WARN("apply: no rows for %s: writing an empty file", g->path);
    st = dlrec_dlr_writer_finish(g->w);
    g->w = NULL;
    x->cur_out++;
    x->written_before = g->written;
    g->path = x->paths[x->cur_out];
    if (st == DLREC_OK) st = dlrec_dlr_writer_open(&g->w, g->path, &x->schema);
  }
  return st;
}

/* Input i's output for per_input: OUT/NAME.dlr. */
static dlrec_status output_paths(apply_ctx *x, const char *dir, const char *const *inputs, int n) {
  x->paths = calloc((size_t)n, sizeof *x->paths);
  if (!x->paths) return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory");
  for (int i = 0; i < n; i++) {
    if (!strcmp(inputs[i], "-")) return dlrec_error(DLREC_ERR_INVALID, "one output per input does not go with stdin ('-')");
    const char *base = strrchr(inputs[i], '/');
    base = base ? base + 1 : inputs[i];
    const char *dot = strrchr(base, '.');
    int len = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    size_t need = strlen(dir) + (size_t)len + 6;
    if (!(x->paths[i] = malloc(need))) return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory");
    snprintf(x->paths[i], need, "%s/%.*s.dlr", dir, len, base);
    for (int k = 0; k < i; k++)
      if (!strcmp(x->paths[k], x->paths[i]))
        return dlrec_error(DLREC_ERR_INVALID, "%s and %s would both be written to %s", inputs[k], inputs[i],
                           x->paths[i]);
    if (x->o->valid_out && !strcmp(x->o->valid_out, x->paths[i]))
      return dlrec_error(DLREC_ERR_INVALID, "--valid-out is %s's output %s", inputs[i], x->paths[i]);
  }
  return DLREC_OK;
}

static dlrec_status apply_consume(void *vctx, void *vjob, uint64_t seq) {
  apply_ctx *x = vctx;
  apply_job *j = vjob;
  (void)seq;
  dlrec_status st = etl_badlist_report(&j->bad, &x->bad, x->o->skip_bad_rows);
  if (st == DLREC_OK && x->paths && j->file != x->cur_out) st = next_output(x, j->file);
  etl_shorts_add(&x->shorts, &j->shorts);
  x->truncated += j->truncated;
  for (int v = 0; st == DLREC_OK && v < 1 + x->split; v++) st = stage_add(x, &x->st[v], &j->out[v], j->cap);
  x->bytes += j->bytes;
  dlrec_progress_add(x->progress, j->bytes);
  return st;
}

static dlrec_status check_opts(const dlrec_etl *e, const char *out, const dlrec_etl_apply_opts *o) {
  if (o->row_group_rows < 1 || o->row_group_rows > DLREC_DLR_MAX_GROUP_ROWS)
    return dlrec_error(DLREC_ERR_INVALID, "--row-group-rows must be in [1, %u]", DLREC_DLR_MAX_GROUP_ROWS);
  if (!(o->valid_fraction >= 0 && o->valid_fraction < 1))
    return dlrec_error(DLREC_ERR_INVALID, "--valid-fraction must be in [0, 1)");
  if (o->valid_fraction > 0 && !o->valid_out)
    return dlrec_error(DLREC_ERR_INVALID, "--valid-fraction needs --valid-out FILE");
  if (o->valid_out && o->valid_fraction <= 0)
    return dlrec_error(DLREC_ERR_INVALID, "--valid-out needs --valid-fraction F > 0");
  if (o->valid_out && !strcmp(o->valid_out, out))
    return dlrec_error(DLREC_ERR_INVALID, "--valid-out must differ from --out");
  if (o->max_line_bytes == 0 || o->max_line_bytes > (1u << 30))
    return dlrec_error(DLREC_ERR_INVALID, "--max-line-bytes must be in [1, 2^30]");
  if (!o->no_label && !e->schema.has_label)
    DLREC_DEBUG("apply: the ETL state has no label; encoding unlabeled rows");
  return DLREC_OK;
}

/* The stages' row-group buffers and their .dlr writers (the training file,
 * and the validation file with a split). */
static dlrec_status stages_open(apply_ctx *x, const char *out) {
  const dlrec_etl *e = x->e;
  dlrec_status st = DLREC_OK;
  for (int v = 0; st == DLREC_OK && v < 1 + x->split; v++) {
    stage *g = &x->st[v];
    g->path = v ? x->o->valid_out : x->paths ? x->paths[0] : out;
    g->labels = malloc((size_t)x->group * sizeof(float));
    g->dense = malloc(((size_t)x->group * x->nd + 1) * sizeof(float));
    g->ids = malloc(((size_t)x->group * x->nc + 1) * sizeof(uint32_t));
    if (!g->labels || !g->dense || !g->ids) st = dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory for row groups");
    for (uint32_t c = 0; st == DLREC_OK && e->multi && c < x->nc; c++) {
      g->coff[c] = calloc((size_t)x->group + 1, sizeof(uint32_t));
      if (!g->coff[c]) st = dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory for row groups");
    }
    if (st == DLREC_OK) st = dlrec_dlr_writer_open(&g->w, g->path, &x->schema);
  }
  return st;
}

/* The stages' last row groups flushed and their files finished (an empty
 * one warned of), or on an error st, aborted; then the run's warnings. */
static dlrec_status stages_close(apply_ctx *x, dlrec_status st) {
  for (int v = 0; st == DLREC_OK && v < 1 + x->split; v++) st = stage_flush(x, &x->st[v]);
  for (int v = 0; v < 2; v++) {
    stage *g = &x->st[v];
    if (!g->w) continue;
    if (st == DLREC_OK) {
      if (g->written == (v ? 0 : x->written_before)) DLREC_WARN("apply: no rows for %s: writing an empty file", g->path);
      st = dlrec_dlr_writer_finish(g->w);
    } else {
      dlrec_dlr_writer_abort(g->w);
    }
    g->w = NULL;
  }
  if (st == DLREC_OK && x->bad) DLREC_WARN("apply: skipped %llu bad rows in all", (unsigned long long)x->bad);
  if (st == DLREC_OK && x->truncated)
    DLREC_WARN("apply: %llu rows had more values in a multi-hot field than its max hotness; the first were kept",
               (unsigned long long)x->truncated);
  return st;
}

/* Frees what dlrec_etl_apply made: the stages', the workers' and the jobs'
 * buffers, the inputs, the output paths, x. */
static void apply_free(apply_ctx *x, apply_job *jobs, int n_jobs, void **slots, int threads, int n_inputs) {
  for (int v = 0; v < 2; v++) {
    free(x->st[v].labels), free(x->st[v].dense), free(x->st[v].ids);
    for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) free(x->st[v].cids[c]), free(x->st[v].coff[c]);
  }
  for (int w = 0; x->workers && w < threads; w++) free(x->workers[w].scratch), free(x->workers[w].ids);
  for (int i = 0; jobs && i < n_jobs; i++) {
    dlrec_block_free(&jobs[i].block);
    for (int v = 0; v < 2; v++) {
      free(jobs[i].out[v].labels), free(jobs[i].out[v].dense), free(jobs[i].out[v].ids);
      for (uint32_t c = 0; c < DLREC_MAX_SPARSE; c++) free(jobs[i].out[v].cids[c]), free(jobs[i].out[v].coff[c]);
    }
    etl_badlist_free(&jobs[i].bad);
  }
  etl_inputs_free(&x->in);
  for (int i = 0; x->paths && i < n_inputs; i++) free(x->paths[i]);
  free(x->paths);
  free(jobs);
  free(slots);
  free(x->workers);
  free(x);
}

dlrec_status dlrec_etl_apply(const dlrec_etl *e, const char *const *inputs, int n_inputs, const char *out,
                             const dlrec_etl_apply_opts *o, dlrec_etl_report *rep) {
  double t0 = dlrec_now();
  dlrec_status st = check_opts(e, out, o);
  if (st != DLREC_OK) return st;
  apply_ctx *x = calloc(1, sizeof *x);
  if (!x) return dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory");
  x->e = e;
  x->o = o;
  x->nd = e->schema.n_dense;
  x->nc = e->schema.n_sparse;
  x->group = o->row_group_rows;
  x->with_label = e->schema.has_label && !o->no_label;
  x->split = o->valid_fraction > 0;
  int threads = o->threads > 0 ? o->threads : dlrec_default_threads();
  int n_jobs = 2 * threads + 2;
  apply_job *jobs = calloc((size_t)n_jobs, sizeof *jobs);
  void **slots = calloc((size_t)n_jobs, sizeof *slots);
  x->workers = calloc((size_t)threads, sizeof *x->workers);
  if (!jobs || !slots || !x->workers) st = dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory");
  for (int i = 0; st == DLREC_OK && i < n_jobs; i++) slots[i] = &jobs[i];
  for (int w = 0; st == DLREC_OK && w < threads; w++)
    if (!(x->workers[w].scratch = malloc(o->max_line_bytes + 1)) ||
        !(x->workers[w].ids = malloc((e->ids_max + 1) * sizeof(uint32_t))))
      st = dlrec_error(DLREC_ERR_NOMEM, "apply: out of memory");
  if (st == DLREC_OK)
    st = etl_inputs_init(&x->in, inputs, o->sources, n_inputs, e->format, NULL, &e->cols, x->with_label, o->block_bytes,
                         o->max_line_bytes);
  /* The output schema: fit's, without the label for unlabeled input. */
  x->schema = e->schema;
  if (!x->with_label) {
    x->schema.has_label = 0;
    memset(x->schema.label_name, 0, sizeof x->schema.label_name);
  }
  if (st == DLREC_OK && o->per_input) st = output_paths(x, out, inputs, n_inputs);
  if (st == DLREC_OK) st = stages_open(x, out);
  if (st == DLREC_OK) {
    if (o->progress) x->progress = dlrec_progress_start("etl apply", x->in.total_bytes, "bytes");
    dlrec_pipeline_ops ops = {apply_produce, apply_work, apply_consume};
    st = dlrec_pipeline_run(&ops, x, slots, n_jobs, threads);
    dlrec_progress_finish(x->progress);
  }
  for (uint32_t f = 0; st == DLREC_OK && f < x->in.n; f++)
    if (x->in.layouts[f]) dlrec_etl_warn_unknown_columns(e, x->in.layouts[f], !o->no_label, x->in.names[f]);
  /* per_input: the last inputs' files, empty ones included. */
  if (st == DLREC_OK && x->paths && x->in.n > 1) st = next_output(x, x->in.n - 1);
  st = stages_close(x, st);
  if (rep) {
    *rep = (dlrec_etl_report){.rows = x->st[0].written + x->st[1].written,
                              .valid_rows = x->st[1].written,
                              .bad_rows = x->bad,
                              .truncated_rows = x->truncated,
                              .bytes = x->bytes,
                              .seconds = dlrec_now() - t0};
    etl_shorts_report(&x->shorts, &x->in, rep);
  }
  apply_free(x, jobs, n_jobs, slots, threads, n_inputs);
  return st;
}
