/* What fit and apply share when they run over input files: the list of
 * inputs read as one stream of line blocks (each file with its own layout,
 * from its CSV header), key derivation per column, and bad-row bookkeeping. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/etl_internal.h"
#include "core/log.h"

void etl_column_keys_init(etl_column_keys *k, dlrec_input_format f, const dlrec_columns *c) {
  for (uint32_t i = 0; i < c->n_cat; i++) {
    int hashed = f == DLREC_FORMAT_CSV;
    k->kind[i] = f == DLREC_FORMAT_CRITEO ? DLREC_KEY_HEX : hashed ? DLREC_KEY_HASH : DLREC_KEY_DEC;
    k->salt[i] = hashed ? dlrec_cat_salt(c->cat[i]) : 0;
  }
}

/* A reader on input i: its file, or its source. */
static dlrec_status open_reader(etl_inputs *in, uint32_t i) {
  return in->sources ? dlrec_reader_open_source(&in->r, &in->sources[i], in->block_bytes, in->max_line_bytes)
                     : dlrec_reader_open(&in->r, in->paths[i], in->block_bytes, in->max_line_bytes);
}

/* Opens input i and builds its layout (for CSV from its header line). */
static dlrec_status open_file(etl_inputs *in, uint32_t i) {
  dlrec_status st = open_reader(in, i);
  if (st == DLREC_OK && in->format == DLREC_FORMAT_CRITEO) {
    st = dlrec_layout_criteo(&in->layouts[i], in->has_label);
  } else if (st == DLREC_OK && in->format != DLREC_FORMAT_CSV) {
    st = dlrec_layout_svm(&in->layouts[i], &in->cols, in->format, in->has_label);
  } else if (st == DLREC_OK) {
    const char *line;
    size_t len;
    st = dlrec_reader_line(in->r, &line, &len);
    if (st == DLREC_END)
      st = dlrec_error(DLREC_ERR_PARSE, "%s: empty file (a CSV file starts with a header line)", in->names[i]);
    if (st == DLREC_OK) st = dlrec_layout_csv(&in->layouts[i], &in->cols, in->has_label, line, len, in->names[i]);
    in->header_bytes += len + 1;
  }
  if (st != DLREC_OK) {
    dlrec_reader_close(in->r);
    in->r = NULL;
    return st;
  }
  in->cur = i;
  return DLREC_OK;
}

dlrec_status etl_inputs_init(etl_inputs *in, const char *const *paths, const dlrec_source *sources, int n,
                             dlrec_input_format format, const char *spec, const dlrec_columns *cols, int has_label,
                             size_t block_bytes, size_t max_line_bytes) {
  memset(in, 0, sizeof *in);
  if (n < 1) return dlrec_error(DLREC_ERR_INVALID, "no input files");
  in->paths = paths;
  in->sources = sources;
  in->n = (uint32_t)n;
  in->format = format;
  in->has_label = has_label;
  in->block_bytes = block_bytes ? block_bytes : DLREC_BLOCK_BYTES_DEFAULT;
  in->max_line_bytes = max_line_bytes ? max_line_bytes : DLREC_MAX_LINE_BYTES_DEFAULT;
  in->layouts = calloc((size_t)n, sizeof *in->layouts);
  in->names = calloc((size_t)n, sizeof *in->names);
  if (!in->layouts || !in->names) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  int stdin_seen = 0, sizes_known = 1;
  for (int i = 0; i < n; i++) {
    /* Fail now, not after an hour of reading the files before it. */
    struct stat stt;
    if (sources) {
      sizes_known = 0;
      in->names[i] = strdup(sources[i].name ? sources[i].name : "(source)");
    } else if (!strcmp(paths[i], "-")) {
      if (stdin_seen++) return dlrec_error(DLREC_ERR_INVALID, "standard input ('-') given twice");
      sizes_known = 0;
      in->names[i] = strdup("stdin");
    } else if (stat(paths[i], &stt) != 0) {
      return dlrec_error(DLREC_ERR_IO, "%s: %s", paths[i], strerror(errno));
    } else {
      in->total_bytes += S_ISREG(stt.st_mode) ? (uint64_t)stt.st_size : 0;
      sizes_known &= S_ISREG(stt.st_mode) != 0;
      in->names[i] = strdup(paths[i]);
    }
    if (!in->names[i]) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  if (!sizes_known) in->total_bytes = 0;
  if (format == DLREC_FORMAT_CSV && spec) {
    /* fit: the first file's header and the SPEC decide the columns. */
    const char *line;
    size_t len;
    dlrec_status st = open_reader(in, 0);
    if (st != DLREC_OK) return st;
    st = dlrec_reader_line(in->r, &line, &len);
    if (st == DLREC_END)
      return dlrec_error(DLREC_ERR_PARSE, "%s: empty file (a CSV file starts with a header line)", in->names[0]);
    if (st == DLREC_OK) st = dlrec_csv_split_header(line, len, in->names[0], &in->header, &in->n_header);
    if (st == DLREC_OK)
      st = dlrec_columns_from_spec(&in->cols, spec, (const char *const *)in->header, in->n_header);
    /* The SPEC decides whether there is a label; --no-label must agree. */
    if (st == DLREC_OK && in->cols.has_label && !has_label)
      st = dlrec_error(DLREC_ERR_INVALID, "--schema names a label (label=%s) but --no-label was given",
                       in->cols.label);
    in->has_label = in->cols.has_label;
    if (st == DLREC_OK) st = dlrec_layout_csv(&in->layouts[0], &in->cols, in->has_label, line, len, in->names[0]);
    if (st != DLREC_OK) return st;
    in->cur = 0;
    in->next = 1;
    in->header_bytes = len + 1;
  } else if (format == DLREC_FORMAT_CRITEO) {
    dlrec_columns_criteo(&in->cols, has_label);
  } else {
    in->cols = *cols;
    /* The label follows the rows (apply's --no-label), not the columns. */
    if (format != DLREC_FORMAT_CSV) {
      in->cols.has_label = has_label;
      if (has_label) strcpy(in->cols.label, "label");
    }
  }
  etl_column_keys_init(&in->keys, format, &in->cols);
  return DLREC_OK;
}

dlrec_status etl_inputs_next(etl_inputs *in, dlrec_block *b, uint32_t *file, uint64_t *bytes) {
  for (;;) {
    if (!in->r) {
      if (in->next >= in->n) return DLREC_END;
      dlrec_status st = open_file(in, in->next++);
      if (st != DLREC_OK) return st;
    }
    dlrec_status st = dlrec_reader_next(in->r, b);
    if (st == DLREC_OK) {
      *file = in->cur;
      *bytes = b->n + in->header_bytes;
      in->header_bytes = 0;
      return DLREC_OK;
    }
    if (st != DLREC_END) return st;
    dlrec_reader_close(in->r);
    in->r = NULL;
  }
}

void etl_inputs_free(etl_inputs *in) {
  dlrec_reader_close(in->r);
  for (uint32_t i = 0; in->layouts && i < in->n; i++) dlrec_layout_free(in->layouts[i]);
  for (uint32_t i = 0; in->names && i < in->n; i++) free(in->names[i]);
  free(in->layouts);
  free(in->names);
  free(in->header);
  memset(in, 0, sizeof *in);
}

dlrec_status etl_badlist_add(etl_badlist *b, const char *msg) {
  size_t n = strlen(msg) + 1;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n) cap *= 2;
    char *t = realloc(b->text, cap);
    if (!t) return dlrec_error(DLREC_ERR_NOMEM, "out of memory for bad-row messages");
    b->text = t;
    b->cap = cap;
  }
  memcpy(b->text + b->len, msg, n);
  b->len += n;
  b->n++;
  return DLREC_OK;
}

dlrec_status etl_badlist_report(const etl_badlist *b, uint64_t *total, uint64_t limit) {
  const char *p = b->text;
  for (uint64_t i = 0; i < b->n; i++, p += strlen(p) + 1) {
    if (++*total > limit)
      return dlrec_error(DLREC_ERR_PARSE, "%s (bad row %llu; --skip-bad-rows allows %llu)", p,
                         (unsigned long long)*total, (unsigned long long)limit);
    DLREC_WARN("skipped bad row: %s", p);
  }
  return DLREC_OK;
}

void etl_badlist_free(etl_badlist *b) {
  free(b->text);
  memset(b, 0, sizeof *b);
}

dlrec_status etl_line_too_long(const dlrec_where *w, size_t max) {
  return dlrec_error(DLREC_ERR_PARSE, "%s:%llu: line longer than %zu bytes (--max-line-bytes)", w->file,
                     (unsigned long long)w->line, max);
}

void etl_shorts_report(const etl_shorts *s, const etl_inputs *in, dlrec_etl_report *rep) {
  rep->short_rows = s->n;
  rep->first_short[0] = '\0';
  if (s->n && in->names && s->first_file < in->n)
    snprintf(rep->first_short, sizeof rep->first_short, "%s:%llu", in->names[s->first_file],
             (unsigned long long)s->first_line);
}
