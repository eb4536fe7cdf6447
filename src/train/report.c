/* RUN/report.html (train/report.h): the run's curves as inline SVG line
 * plots, its time breakdown as bars, its data and config as tables. Every
 * string that comes from the run (column names, the config) is escaped. */
#include "train/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint.h"
#include "core/fsutil.h"
#include "core/json.h"

/* ---- the curves of metrics.jsonl ---- */

typedef struct series {
  const char *name, *color;
  double *x, *y;
  size_t n, cap;
  int markers; /* dots at the points (few points: evaluations) */
} series;

static int series_add(series *s, double x, double y) {
  if (!isfinite(x) || !isfinite(y)) return 0;
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    double *nx = realloc(s->x, cap * sizeof *nx);
    if (!nx) return -1;
    s->x = nx;
    double *ny = realloc(s->y, cap * sizeof *ny);
    if (!ny) return -1;
    s->y = ny;
    s->cap = cap;
  }
  s->x[s->n] = x;
  s->y[s->n++] = y;
  return 0;
}

enum { TRAIN_LOSS, TRAIN_LOGLOSS, VALID_LOGLOSS, TRAIN_AUC, VALID_AUC, THROUGHPUT, N_SERIES };

typedef struct curves {
  series s[N_SERIES];
  size_t lines, skipped;
  cJSON *last_valid; /* the last line's "valid" (owned) */
  uint64_t last_step;
} curves;

static double num(const cJSON *o, const char *key) {
  const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
  return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static int take_line(curves *c, cJSON *j) {
  double step = num(j, "step");
  if (!isfinite(step)) return 1;
  const cJSON *valid = cJSON_GetObjectItemCaseSensitive(j, "valid");
  const cJSON *train = cJSON_GetObjectItemCaseSensitive(j, "train");
  int e = 0;
  if (!cJSON_IsObject(valid)) {
    /* A logging line: the training loss of the interval and its rate. */
    e |= series_add(&c->s[TRAIN_LOSS], step, num(j, "loss"));
    e |= series_add(&c->s[THROUGHPUT], step, num(j, "samples_per_s"));
  } else {
    e |= series_add(&c->s[VALID_LOGLOSS], step, num(valid, "logloss"));
    e |= series_add(&c->s[VALID_AUC], step, num(valid, "auc"));
    e |= series_add(&c->s[TRAIN_LOGLOSS], step, num(train, "logloss"));
    e |= series_add(&c->s[TRAIN_AUC], step, num(train, "auc"));
    cJSON_Delete(c->last_valid);
    c->last_valid = cJSON_DetachItemViaPointer(j, (cJSON *)valid);
  }
  c->last_step = (uint64_t)step;
  return e;
}

static dlrec_status read_curves(const char *path, curves *c) {
  char *text;
  size_t n;
  dlrec_status s = dlrec_read_file(path, (size_t)1 << 31, &text, &n);
  if (s != DLREC_OK) return dlrec_error_context("the run's metrics: ");
  static const struct {
    const char *name, *color;
    int markers;
  } look[N_SERIES] = {{"training loss (interval mean)", "#1f77b4", 0},
                      {"training rows, scored", "#2ca02c", 1},
                      {"validation", "#d62728", 1},
                      {"training rows, scored", "#2ca02c", 1},
                      {"validation", "#d62728", 1},
                      {"samples/s", "#1f77b4", 0}};
  for (int k = 0; k < N_SERIES; k++) {
    c->s[k].name = look[k].name;
    c->s[k].color = look[k].color;
    c->s[k].markers = look[k].markers;
  }
  for (size_t i = 0; i < n && s == DLREC_OK;) {
    char *nl = memchr(text + i, '\n', n - i);
    size_t end = nl ? (size_t)(nl - text) : n;
    cJSON *j = cJSON_ParseWithLength(text + i, end - i);
    if (end > i) {
      int r = j ? take_line(c, j) : 1;
      if (r < 0) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
      if (r) c->skipped += r > 0;
      else c->lines++;
    }
    cJSON_Delete(j);
    i = end + 1;
  }
  free(text);
  return s;
}

/* ---- HTML and SVG ---- */

static void esc(FILE *f, const char *t) {
  for (; t && *t; t++) switch (*t) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*t, f);
    }
}

/* Ticks at 1, 2 or 5 times a power of ten, about five over [lo, hi]. */
static double tick_step(double lo, double hi) {
  double raw = (hi - lo) / 5, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void range(const series *s, int ns, int axis_y, double *lo, double *hi) {
  *lo = INFINITY, *hi = -INFINITY;
  for (int k = 0; k < ns; k++)
    for (size_t i = 0; i < s[k].n; i++) {
      double v = axis_y ? s[k].y[i] : s[k].x[i];
      if (v < *lo) *lo = v;
      if (v > *hi) *hi = v;
    }
  if (*hi - *lo < 1e-12 * (fabs(*hi) + 1)) *lo -= 0.5 * (fabs(*lo) + 1e-3), *hi += 0.5 * (fabs(*hi) + 1e-3);
  double pad = 0.04 * (*hi - *lo);
  *lo -= pad, *hi += pad;
}

#define W 600
#define H 320
#define ML 70 /* margins: left, right, top, bottom */
#define MR 20
#define MT 30
#define MB 45

/* A line plot of the series (those with points) in an <svg> of class
 * "plot", or a paragraph saying why there is nothing to plot. diagonal: a
 * square plot over [0, max] with the line y = x (the reliability curve). */
static void plot(FILE *f, const char *id, const char *title, const char *xlabel, const char *ylabel,
                 const series *s, int ns, int diagonal, const char *empty) {
  size_t points = 0;
  for (int k = 0; k < ns; k++) points += s[k].n;
  fprintf(f, "<figure id=\"%s\"><figcaption>", id);
  esc(f, title);
  fputs("</figcaption>\n", f);
  if (!points) {
    fputs("<p class=\"empty\">", f);
    esc(f, empty);
    fputs("</p></figure>\n", f);
    return;
  }
  double x0, x1, y0, y1;
  range(s, ns, 0, &x0, &x1);
  range(s, ns, 1, &y0, &y1);
  if (diagonal) {
    x0 = y0 = 0;
    x1 = y1 = fmax(x1, y1);
  }
  const double pw = W - ML - MR, ph = H - MT - MB;
#define PX(v) (ML + ((v) - x0) / (x1 - x0) * pw)
#define PY(v) (MT + ph - ((v) - y0) / (y1 - y0) * ph)
  fprintf(f, "<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
          W, H, W, H);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n", ML, MT, pw, ph);
  for (int axis = 0; axis < 2; axis++) {
    double lo = axis ? y0 : x0, hi = axis ? y1 : x1, st = tick_step(lo, hi);
    for (double t = ceil(lo / st) * st; t <= hi + 1e-9 * st; t += st) {
      double v = fabs(t) < 1e-9 * st ? 0 : t;
      if (axis)
        fprintf(f,
                "<line x1=\"%d\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" class=\"tick\">%g</text>\n",
                ML, ML + pw, PY(v), PY(v), ML - 4, PY(v) + 4, v);
      else
        fprintf(f,
                "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%g\" stroke=\"#eee\"/>"
                "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\" class=\"tick\">%g</text>\n",
                PX(v), PX(v), MT, MT + ph, PX(v), MT + ph + 14, v);
    }
  }
  fprintf(f, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\" class=\"label\">", ML + pw / 2, H - 8);
  esc(f, xlabel);
  fprintf(f, "</text><text transform=\"translate(14 %g) rotate(-90)\" text-anchor=\"middle\" class=\"label\">",
          MT + ph / 2);
  esc(f, ylabel);
  fputs("</text>\n", f);
  if (diagonal)
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n",
            PX(0.0), PY(0.0), PX(x1), PY(y1));
  int legend = 0;
  for (int k = 0; k < ns; k++) {
    if (!s[k].n) continue;
    fprintf(f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", s[k].color);
    for (size_t i = 0; i < s[k].n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", PX(s[k].x[i]), PY(s[k].y[i]));
    fputs("\"/>\n", f);
    if (s[k].markers)
      for (size_t i = 0; i < s[k].n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", PX(s[k].x[i]), PY(s[k].y[i]),
                s[k].color);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"3\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" class=\"tick\">",
            ML + 8, MT + 10 + 14 * legend, s[k].color, ML + 22, MT + 14 + 14 * legend);
    esc(f, s[k].name);
    fputs("</text>\n", f);
    legend++;
  }
#undef PX
#undef PY
  fputs("</svg></figure>\n", f);
}

/* ---- the sections ---- */

static void reliability_plot(FILE *f, const cJSON *valid) {
  const cJSON *rel = valid ? cJSON_GetObjectItemCaseSensitive(valid, "reliability") : NULL;
  const cJSON *pred = rel ? cJSON_GetObjectItemCaseSensitive(rel, "mean_prediction") : NULL;
  const cJSON *ctr = rel ? cJSON_GetObjectItemCaseSensitive(rel, "ctr") : NULL;
  series s = {.name = "validation bins (equal row counts)", .color = "#d62728", .markers = 1};
  const int n = cJSON_GetArraySize(pred) < cJSON_GetArraySize(ctr) ? cJSON_GetArraySize(pred) : cJSON_GetArraySize(ctr);
  for (int i = 0; i < n; i++) {
    const cJSON *p = cJSON_GetArrayItem(pred, i), *c = cJSON_GetArrayItem(ctr, i);
    if (cJSON_IsNumber(p) && cJSON_IsNumber(c) && series_add(&s, p->valuedouble, c->valuedouble)) break;
  }
  plot(f, "calibration", "Calibration of the last validation (a calibrated model follows the diagonal)",
       "mean predicted click probability", "observed click rate", &s, 1, 1,
       "No validation with calibration bins in metrics.jsonl (train with --valid).");
  free(s.x);
  free(s.y);
}

static void profile_bars(FILE *f, const cJSON *summary) {
  const cJSON *p = summary ? cJSON_GetObjectItemCaseSensitive(summary, "profile") : NULL;
  static const struct {
    const char *key, *label;
  } parts[] = {{"mlp_seconds", "MLPs (GEMMs, bias, activations)"},
               {"embedding_forward_seconds", "embedding lookups"},
               {"embedding_update_seconds", "sparse backward + update"},
               {"interaction_seconds", "feature interaction"},
               {"other_seconds", "loss, dense optimizer, other"},
               {"table_storage_seconds", "table storage (tiered)"},
               {"loader_wait_seconds", "waiting for the loader"}};
  const int np = (int)(sizeof parts / sizeof *parts);
  double total = num(summary, "seconds"), max = 0;
  for (int i = 0; i < np; i++)
    if (num(p, parts[i].key) > max) max = num(p, parts[i].key);
  fputs("<figure id=\"profile\"><figcaption>Where the last training process's steps spent their time</figcaption>\n", f);
  if (!cJSON_IsObject(p) || !(max > 0)) {
    fputs("<p class=\"empty\">No time profile: RUN/summary.json is written when a training process ends.</p></figure>\n",
          f);
    return;
  }
  const int bh = 22, lw = 230, bw = W - lw - 120;
  fprintf(f, "<svg class=\"bars\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
          W, np * bh + 10, W, np * bh + 10);
  for (int i = 0; i < np; i++) {
    double v = num(p, parts[i].key);
    if (!(v >= 0)) v = 0;
    int y = 5 + i * bh;
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" class=\"tick\">%s</text>", lw - 6, y + 14, parts[i].label);
    fprintf(f, "<rect class=\"bar\" x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#1f77b4\"/>", lw, y + 3,
            v / max * bw, bh - 6);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" class=\"tick\">%.3g s", lw + v / max * bw + 4, y + 14, v);
    if (total > 0) fprintf(f, " (%.1f%%)", 100 * v / total);
    fputs("</text>\n", f);
  }
  fputs("</svg>", f);
  if (total > 0)
    fprintf(f, "<p>Training loop: %.3g s, %.0f samples/s over %.0f steps of this process.</p>", total,
            num(summary, "samples_per_s"), num(summary, "steps_this_run"));
  fputs("</figure>\n", f);
}

static void data_summary(FILE *f, const cJSON *etl) {
  fputs("<h2>Data</h2>\n", f);
  if (!etl) {
    fputs("<p class=\"empty\">No checkpoint yet, so no ETL state to summarize.</p>\n", f);
    return;
  }
  double rows = num(etl, "rows"), pos = num(etl, "positives");
  fprintf(f, "<p>The ETL was fitted on %.0f rows", rows);
  if (rows > 0 && isfinite(pos)) fprintf(f, " (click rate %.4f)", pos / rows);
  fprintf(f, "; %.0f bad rows skipped; %.0f embedding rows in all.</p>\n", num(etl, "bad_rows_skipped"),
          num(etl, "table_rows"));
  fputs("<table id=\"columns\"><tr><th>column</th><th>kind</th><th>missing</th><th>vocabulary / statistics</th></tr>\n",
        f);
  const cJSON *col;
  cJSON_ArrayForEach(col, cJSON_GetObjectItemCaseSensitive(etl, "dense")) {
    fputs("<tr><td>", f);
    esc(f, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(col, "name")));
    fprintf(f, "</td><td>dense</td><td>%.2f%%</td><td>mean %.4g, std %.4g, min %.4g, max %.4g (transformed)</td></tr>\n",
            rows > 0 ? 100 * num(col, "missing") / rows : NAN, num(col, "mean"), num(col, "std"), num(col, "min"),
            num(col, "max"));
  }
  cJSON_ArrayForEach(col, cJSON_GetObjectItemCaseSensitive(etl, "categorical")) {
    fputs("<tr><td>", f);
    esc(f, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(col, "name")));
    fputs("</td><td>categorical, ", f);
    esc(f, cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(col, "encoding")));
    fprintf(f, "</td><td>%.2f%%</td><td>%.0f ids", rows > 0 ? 100 * num(col, "missing") / rows : NAN,
            num(col, "size"));
    if (isfinite(num(col, "distinct")))
      fprintf(f, " (%.0f distinct values, %.0f kept, %.0f rows out of vocabulary)", num(col, "distinct"),
              num(col, "kept"), num(col, "oov"));
    fputs("</td></tr>\n", f);
  }
  fputs("</table>\n", f);
}

static const char STYLE[] =
    "body{font-family:sans-serif;max-width:1280px;margin:1em auto;color:#222}"
    "figure{display:inline-block;margin:0.5em;vertical-align:top}figcaption{font-weight:bold;margin-bottom:4px}"
    ".tick{font-size:11px;fill:#444}.label{font-size:12px;fill:#222}.empty{color:#a00;width:560px}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
    "pre{background:#f6f6f6;padding:8px;font-size:12px}";

/* Reads path as JSON, or NULL (a missing part of the report). */
static cJSON *optional_json(const char *dir, const char *name) {
  char path[4096];
  cJSON *j = NULL;
  if (dlrec_path_join(path, sizeof path, dir, name) != DLREC_OK || dlrec_json_read(path, &j) != DLREC_OK) return NULL;
  return j;
}

dlrec_status dlrec_report_write(const char *run_dir, const char *out_path) {
  char metrics[4096], out[4096], ckpt[4096];
  dlrec_status s = dlrec_path_join(metrics, sizeof metrics, run_dir, "metrics.jsonl");
  if (s == DLREC_OK && !out_path) s = dlrec_path_join(out, sizeof out, run_dir, "report.html");
  if (s != DLREC_OK) return s;
  if (!out_path) out_path = out;
  curves c = {0};
  if ((s = read_curves(metrics, &c)) != DLREC_OK) return s;
  cJSON *summary = optional_json(run_dir, "summary.json"), *config = NULL, *etl = NULL;
  int has_ckpt = dlrec_checkpoint_select(run_dir, "latest", ckpt, sizeof ckpt) == DLREC_OK;
  if (has_ckpt) {
    config = optional_json(ckpt, "config.json");
    etl = optional_json(ckpt, "etl/etl.json");
  }
  char *html = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&html, &len);
  if (!f) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (f) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(config, "name"));
    const char *type = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(config, "model"), "type"));
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>dlrec report: ", f);
    esc(f, name ? name : run_dir);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>Training report: ", STYLE);
    esc(f, run_dir);
    fputs("</h1>\n<p>", f);
    if (type) {
      fputs("Model <b>", f);
      esc(f, type);
      fputs("</b>; ", f);
    }
    fprintf(f, "%zu lines of metrics.jsonl up to step %llu", c.lines, (unsigned long long)c.last_step);
    if (c.skipped) fprintf(f, " (%zu torn or unknown lines skipped)", c.skipped);
    if (has_ckpt) {
      fputs("; checkpoint ", f);
      esc(f, ckpt);
    } else {
      fputs("; no checkpoint yet", f);
    }
    fputs(".</p>\n<h2>Learning</h2>\n", f);
    plot(f, "loss", "Loss (binary cross-entropy)", "step", "loss", &c.s[TRAIN_LOSS], 3, 0,
         "No loss logged yet (log.interval_steps).");
    plot(f, "auc", "AUC", "step", "AUC", &c.s[TRAIN_AUC], 2, 0,
         "No evaluation in metrics.jsonl: train with --valid (eval.interval_steps, eval.every_epoch; "
         "eval.train_rows for the training rows' AUC).");
    reliability_plot(f, c.last_valid);
    plot(f, "throughput", "Throughput (each logging interval)", "step", "samples/s", &c.s[THROUGHPUT], 1, 0,
         "No logging interval finished yet (log.interval_steps).");
    fputs("<h2>Time</h2>\n", f);
    profile_bars(f, summary);
    data_summary(f, etl);
    fputs("<h2>Config</h2>\n", f);
    char *text = config ? cJSON_Print(config) : NULL;
    if (text) {
      fputs("<pre id=\"config\">", f);
      esc(f, text);
      fputs("</pre>\n", f);
    } else {
      fputs("<p class=\"empty\">No checkpoint yet, so no config to show.</p>\n", f);
    }
    free(text);
    fputs("</body></html>\n", f);
    if (fclose(f) != 0) s = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  }
  if (s == DLREC_OK) s = dlrec_write_file_atomic(out_path, html, len);
  free(html);
  for (int k = 0; k < N_SERIES; k++) free(c.s[k].x), free(c.s[k].y);
  cJSON_Delete(c.last_valid);
  cJSON_Delete(summary);
  cJSON_Delete(config);
  cJSON_Delete(etl);
  return s;
}
