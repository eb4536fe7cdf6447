/* Checks every model type's tests share: the analytic gradients of a whole
 * network (every dense parameter and every embedding row a batch touches)
 * against finite differences of its loss, and batch-invariant
 * scoring (a row scored alone has the bits it has inside a batch). Header
 * only: each test executable is one source file. */
#ifndef DLREC_TEST_NET_CHECK_H
#define DLREC_TEST_NET_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "core/rng.h"

/* Whether config c, written to JSON and read back over the defaults of
 * another type (so nothing is left over from the same type's defaults),
 * comes back byte for byte. */
static inline int net_check_config_round_trip(const dlrec_net_config *c, const char *other_type) {
  dlrec_net_config back;
  cJSON *o = cJSON_CreateObject();
  dlrec_net_config_to_json(c, o);
  int same = dlrec_net_config_default(&back, other_type) == DLREC_OK &&
             dlrec_net_config_parse(&back, o, "model") == DLREC_OK && memcmp(c, &back, sizeof *c) == 0;
  cJSON_Delete(o);
  return same;
}

/* A tiny schema: n_dense dense columns, 3 categorical (the second
 * multi-hot, up to 3 ids). */
static inline void net_check_schema(dlrec_schema *s, uint32_t n_dense) {
  memset(s, 0, sizeof *s);
  s->has_label = 1;
  strcpy(s->label_name, "label");
  s->n_dense = n_dense;
  for (uint32_t i = 0; i < n_dense; i++) snprintf(s->dense_names[i], DLREC_NAME_MAX, "I%u", i + 1);
  s->n_sparse = 3;
  uint64_t begin = 0, sizes[3] = {5, 7, 4};
  for (int c = 0; c < 3; c++) {
    snprintf(s->sparse[c].name, DLREC_NAME_MAX, "C%d", c + 1);
    s->sparse[c].hotness = c == 1 ? 0 : 1;
    s->sparse[c].max_hotness = c == 1 ? 3 : 1;
    s->sparse[c].id_begin = begin;
    s->sparse[c].id_end = begin + sizes[c];
    begin += sizes[c];
  }
  s->table_rows = begin;
}

/* 4 rows of schema s (at most 3 dense columns); the multi-hot column's
 * bags hold 0 to 3 ids (one empty); dense values uniform in [dense_lo, 1). */
typedef struct net_check_batch {
  dlrec_batch b;
  float labels[4], dense[4 * 3];
  uint32_t off[3][5], ids[3][12];
} net_check_batch;

static inline void net_check_make_batch(net_check_batch *t, const dlrec_schema *s, uint64_t seed, double dense_lo) {
  memset(t, 0, sizeof *t);
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  t->b.rows = 4;
  for (int i = 0; i < 4; i++) t->labels[i] = (float)(i % 2);
  for (int i = 0; i < 12; i++) t->dense[i] = (float)(dense_lo + (1 - dense_lo) * dlrec_rng_uniform(&r));
  for (int c = 0; c < 3; c++) {
    uint32_t n = 0;
    for (int i = 0; i < 4; i++) {
      t->off[c][i] = n;
      uint32_t k = c == 1 ? (uint32_t)i % 4 : 1;
      uint32_t span = (uint32_t)(s->sparse[c].id_end - s->sparse[c].id_begin);
      for (uint32_t j = 0; j < k; j++) t->ids[c][n++] = (uint32_t)s->sparse[c].id_begin + (i + 2 * j) % span;
    }
    t->off[c][4] = n;
    t->b.offsets[c] = t->off[c];
    t->b.ids[c] = t->ids[c];
  }
  t->b.labels = t->labels;
  t->b.dense = s->n_dense ? t->dense : NULL;
}

static inline double net_check_loss(dlrec_net *m, dlrec_net_ws *ws, const dlrec_batch *b) {
  double loss = NAN;
  const float *g, *d;
  if (dlrec_net_gradients(m, ws, b, &loss, &g, &d) != DLREC_OK) return NAN;
  return loss;
}

/* Whether a gradient within 5e-4 + 2% of a finite difference fd (float
 * rounding of the loss over the step) agrees with it. */
static inline int net_check_close(double analytic, double fd) { return fabs(fd - analytic) <= 5e-4 + 2e-2 * fabs(fd); }

/* Whether the analytic gradient of the loss in *x agrees with the loss's
 * finite differences of step 1e-3: the central difference (into *fd), or,
 * where the two one-sided differences disagree (the stencil straddles a
 * kink of the loss, a ReLU's input crossing 0, which steps the slope), one
 * of them: the analytic gradient is the slope on its own side of the kink,
 * and the central difference the mean of the two sides'. A wrong gradient
 * agrees with neither side; a kink is where the mismatch of a check with a
 * fixed step and seed otherwise lies. *x is left as it was. */
static inline int net_check_slope(dlrec_net *m, dlrec_net_ws *ws, const dlrec_batch *b, float *x, double analytic,
                                  double *fd) {
  const float eps = 1e-3f, keep = *x;
  *x = keep + eps;
  const double up = net_check_loss(m, ws, b);
  *x = keep - eps;
  const double down = net_check_loss(m, ws, b);
  *x = keep;
  *fd = (up - down) / (2 * eps);
  if (net_check_close(analytic, *fd)) return 1;
  const double base = net_check_loss(m, ws, b), fwd = (up - base) / eps, bwd = (base - down) / eps;
  return !net_check_close(fwd, bwd) && (net_check_close(analytic, fwd) || net_check_close(analytic, bwd));
}

/* The number of gradients (dense parameters, then embedding row entries)
 * that disagree with the loss's finite differences (net_check_slope); the
 * first few are printed. An embedding row's gradient is the sum of d_emb
 * over the bags holding it (times 1/bag size when pooling by mean). Returns
 * -1 if a pass fails. */
static inline int net_check_gradients(dlrec_net *m, dlrec_net_ws *ws, const dlrec_batch *b, int mean_pooling) {
  const dlrec_schema *s = dlrec_net_schema(m);
  dlrec_table *t = dlrec_net_table(m);
  uint32_t F = s->n_sparse, D = dlrec_table_dim(t), B = b->rows;
  double loss;
  const float *grad, *d_emb;
  if (dlrec_net_gradients(m, ws, b, &loss, &grad, &d_emb) != DLREC_OK) return -1;
  size_t n;
  float *p = dlrec_net_dense_params(m, &n);
  size_t n_emb = (size_t)B * F * D;
  float *g = malloc((n ? n : 1) * sizeof *g), *dE = malloc((n_emb ? n_emb : 1) * sizeof *dE);
  memcpy(g, grad, n * sizeof *g);
  memcpy(dE, d_emb, n_emb * sizeof *dE);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    double fd;
    if (!net_check_slope(m, ws, b, &p[i], g[i], &fd) && bad++ < 5)
      fprintf(stderr, "param %zu: analytic %.6g, finite difference %.6g\n", i, g[i], fd);
  }
  float *rows = dlrec_table_data(t);
  uint32_t stride = dlrec_table_stride(t);
  int touched = 0;
  for (uint64_t r = 0; r < s->table_rows; r++) {
    for (uint32_t k = 0; k < D; k++) {
      double want = 0;
      int hit = 0;
      for (uint32_t c = 0; c < F; c++)
        for (uint32_t bb = 0; bb < B; bb++) {
          uint32_t lo = b->offsets[c][bb], hi = b->offsets[c][bb + 1];
          for (uint32_t j = lo; j < hi; j++)
            if (b->ids[c][j] == r) {
              want += dE[((size_t)bb * F + c) * D + k] / (mean_pooling ? (double)(hi - lo) : 1.0);
              hit = 1;
            }
        }
      touched += hit;
      double fd;
      if (!net_check_slope(m, ws, b, &rows[r * stride + k], want, &fd) && bad++ < 10)
        fprintf(stderr, "row %llu[%u]: analytic %.6g, finite difference %.6g\n", (unsigned long long)r, k, want, fd);
    }
  }
  /* A check over rows no batch touches would pass with any d_emb. */
  if (F && !touched && bad++ < 10) fprintf(stderr, "the batch touches no embedding row\n");
  free(g);
  free(dE);
  return bad;
}

/* Scores batch b (rows <= 64) with a fresh scorer, then each row alone, and
 * returns the number of rows whose score differs in any bit; -1 if a pass
 * fails. n_dense is the schema's. */
static inline int net_check_batch_invariance(const dlrec_net *m, dlrec_net_ws *ws, const dlrec_batch *b) {
  dlrec_net_scorer *sc;
  if (dlrec_net_scorer_create(&sc, m) != DLREC_OK) return -1;
  const dlrec_schema *s = dlrec_net_schema(m);
  float all[64];
  int diff = 0;
  if (b->rows > 64 || dlrec_net_predict(sc, ws, b, all) != DLREC_OK) diff = -1;
  for (uint32_t r = 0; diff >= 0 && r < b->rows; r++) {
    dlrec_batch one = *b;
    one.rows = 1;
    one.dense = b->dense ? b->dense + (size_t)r * s->n_dense : NULL;
    one.labels = b->labels ? b->labels + r : NULL;
    for (uint32_t c = 0; c < s->n_sparse; c++) one.offsets[c] = b->offsets[c] + r;
    float alone;
    if (dlrec_net_predict(sc, ws, &one, &alone) != DLREC_OK) diff = -1;
    else if (memcmp(&alone, &all[r], sizeof alone)) diff++;
  }
  dlrec_net_scorer_free(sc);
  return diff;
}

#endif
