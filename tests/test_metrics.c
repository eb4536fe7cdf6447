/* Metrics against independent references: AUC by the O(n^2) pairwise count,
 * logloss and NE by their formulas, known small cases. */
#include "dlrec/metrics.h"
#include "dlrec/rng.h"
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
