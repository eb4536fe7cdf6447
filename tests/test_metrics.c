/* Metrics against independent references: AUC by the O(n^2) pairwise count,
 * logloss and NE by their formulas, known small cases. */
#include "train/metrics.h"
#include "core/rng.h"
#include "test.h"

static double naive_auc(const float *p, const float *y, size_t n) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < n; i++) {
    if (y[i] < 0.5f) continue;
    for (size_t j = 0; j < n; j++) {
      if (y[j] > 0.5f) continue;
      pairs += 1;
      wins += p[i] > p[j] ? 1.0 : (p[i] == p[j] ? 0.5 : 0.0);
    }
  }
  return wins / pairs;
}

TEST(auc_known_values) {
  float p1[] = {0.1f, 0.4f, 0.35f, 0.8f}, y1[] = {0, 0, 1, 1};
  dlrec_metrics m;
  CHECK_OK(dlrec_metrics_compute(p1, y1, 4, &m));
  CHECK_NEAR(m.auc, 0.75, 1e-12, 0); /* the scikit-learn documentation's example */
  float p2[] = {0.5f, 0.5f, 0.5f, 0.5f}, y2[] = {0, 1, 0, 1};
  CHECK_OK(dlrec_metrics_compute(p2, y2, 4, &m));
  CHECK_NEAR(m.auc, 0.5, 1e-12, 0); /* all ties */
  float p3[] = {0.9f, 0.8f, 0.1f}, y3[] = {0, 0, 1};
  CHECK_OK(dlrec_metrics_compute(p3, y3, 3, &m));
  CHECK_NEAR(m.auc, 0.0, 1e-12, 0);
  float y4[] = {1, 1, 1};
  CHECK_OK(dlrec_metrics_compute(p3, y4, 3, &m));
  CHECK(isnan(m.auc)); /* one class only */
}

TEST(auc_matches_pairwise_count_with_ties) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 3, 0);
  for (int trial = 0; trial < 20; trial++) {
    size_t n = 50 + dlrec_rng_below(&r, 1500);
    float *p = malloc(n * sizeof *p), *y = malloc(n * sizeof *y);
    int levels = 1 + (int)dlrec_rng_below(&r, trial < 10 ? 8 : 100000); /* few levels: many ties */
    for (size_t i = 0; i < n; i++) {
      int lv = (int)dlrec_rng_below(&r, (uint32_t)levels);
      p[i] = (float)lv / (float)levels - (trial % 3 == 0 ? 0.5f : 0.0f); /* negative scores too */
      y[i] = dlrec_rng_uniform(&r) < 0.2 + 0.5 * ((double)lv / levels) ? 1.0f : 0.0f;
    }
    y[0] = 1;
    y[1] = 0;
    dlrec_metrics m;
    dlrec_status st = dlrec_metrics_compute(p, y, n, &m);
    double want = naive_auc(p, y, n);
    free(p);
    free(y);
    CHECK_OK(st);
    CHECK_NEAR(m.auc, want, 1e-12, 0);
  }
}

TEST(logloss_ne_calibration) {
  float p[] = {0.9f, 0.2f, 0.6f, 0.0f, 1.0f}, y[] = {1, 0, 1, 0, 0};
  dlrec_metrics m;
  CHECK_OK(dlrec_metrics_compute(p, y, 5, &m));
  double eps = 1e-7;
  double want = -(log(0.9f) + log(1 - 0.2f) + log(0.6f) + log(1 - eps) + log(eps)) / 5;
  CHECK_NEAR(m.logloss, want, 1e-9, 1e-9);
  double c = 0.4, h = -(c * log(c) + (1 - c) * log(1 - c));
  CHECK_NEAR(m.ctr, 0.4, 1e-12, 0);
  CHECK_NEAR(m.ne, want / h, 1e-9, 1e-9);
  CHECK_NEAR(m.mean_pred, (0.9f + 0.2f + 0.6f + 0.0f + 1.0f) / 5.0, 1e-7, 0);
  CHECK_NEAR(m.calibration, m.mean_pred / 0.4, 1e-9, 0);
  CHECK_EQ(m.count, 5);
  /* Predicting the CTR itself gives NE 1. */
  float q[] = {0.4f, 0.4f, 0.4f, 0.4f, 0.4f};
  CHECK_OK(dlrec_metrics_compute(q, y, 5, &m));
  CHECK_NEAR(m.ne, 1.0, 1e-6, 0);
}

static int cmp_pair(const void *a, const void *b) {
  const float *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Reliability bins against a naive build: sort (prediction, label) pairs with
 * qsort, cut them into K equal-count runs, average each. Distinct scores, so
 * the bins do not depend on how ties are ordered; then all-equal scores and
 * fewer rows than bins. */
TEST(reliability_bins_match_naive) {
  dlrec_rng r;
  dlrec_rng_seed(&r, 5, 0);
  const size_t sizes[] = {1, 7, 20, 21, 999, 5000};
  for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
    size_t n = sizes[t];
    float *p = malloc(n * sizeof *p), *y = malloc(n * sizeof *y), *pair = malloc(2 * n * sizeof *pair);
    for (size_t i = 0; i < n; i++) {
      p[i] = (float)(i + 1) / (float)(n + 1); /* distinct */
      y[i] = dlrec_rng_uniform(&r) < p[i] ? 1.0f : 0.0f;
    }
    for (size_t i = n; i-- > 1;) { /* shuffled, so the sort has work to do */
      size_t j = dlrec_rng_below(&r, (uint32_t)(i + 1));
      float tp = p[i], ty = y[i];
      p[i] = p[j], y[i] = y[j], p[j] = tp, y[j] = ty;
    }
    for (size_t i = 0; i < n; i++) pair[2 * i] = p[i], pair[2 * i + 1] = y[i];
    qsort(pair, n, 2 * sizeof *pair, cmp_pair);
    dlrec_metrics m;
    CHECK_OK(dlrec_metrics_compute(p, y, n, &m));
    size_t k = n < DLREC_RELIABILITY_BINS ? n : DLREC_RELIABILITY_BINS, total = 0;
    for (size_t b = 0; b < DLREC_RELIABILITY_BINS; b++) {
      if (b >= k) {
        CHECK_EQ(m.reliability[b].rows, 0);
        continue;
      }
      size_t lo = b * n / k, hi = (b + 1) * n / k;
      double sp = 0, sy = 0;
      for (size_t i = lo; i < hi; i++) sp += pair[2 * i], sy += pair[2 * i + 1];
      CHECK_EQ(m.reliability[b].rows, hi - lo);
      CHECK_NEAR(m.reliability[b].mean_pred, sp / (double)(hi - lo), 1e-12, 0);
      CHECK_NEAR(m.reliability[b].ctr, sy / (double)(hi - lo), 1e-12, 0);
      total += m.reliability[b].rows;
    }
    CHECK_EQ(total, n);
    free(p);
    free(y);
    free(pair);
  }
  /* One score for all: every bin predicts it, and the bins' clicks add up. */
  float p[40], y[40];
  for (int i = 0; i < 40; i++) p[i] = 0.25f, y[i] = (float)(i % 4 == 0);
  dlrec_metrics m;
  CHECK_OK(dlrec_metrics_compute(p, y, 40, &m));
  double clicks = 0;
  for (int b = 0; b < DLREC_RELIABILITY_BINS; b++) {
    CHECK_EQ(m.reliability[b].rows, 2);
    CHECK_NEAR(m.reliability[b].mean_pred, 0.25, 0, 0);
    clicks += m.reliability[b].ctr * 2;
  }
  CHECK_NEAR(clicks, 10, 1e-12, 0);
}

TEST(evaluator_accumulates_and_rejects_nan) {
  dlrec_evaluator *ev;
  CHECK_OK(dlrec_evaluator_create(&ev, 2));
  float p[] = {0.1f, 0.4f, 0.35f, 0.8f}, y[] = {0, 0, 1, 1};
  CHECK_OK(dlrec_evaluator_add(ev, p, y, 2));
  CHECK_OK(dlrec_evaluator_add(ev, p + 2, y + 2, 2)); /* grows */
  dlrec_metrics m;
  CHECK_OK(dlrec_evaluator_compute(ev, &m));
  CHECK_NEAR(m.auc, 0.75, 1e-12, 0);
  dlrec_evaluator_reset(ev);
  CHECK_ERR(dlrec_evaluator_compute(ev, &m), DLREC_ERR_INVALID, "no rows");
  float bad[] = {NAN};
  CHECK_ERR(dlrec_evaluator_add(ev, bad, y, 1), DLREC_ERR_INVALID, "NaN");
  dlrec_evaluator_free(ev);
}
