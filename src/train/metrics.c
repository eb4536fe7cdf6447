/* Exact AUC by ranking (a radix sort of the float scores, ties grouped) and
 * the likelihood-based metrics, accumulated in double precision. */
#include "train/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dlrec_evaluator {
  float *pred;
  uint8_t *label;
  size_t n, cap;
};

dlrec_status dlrec_evaluator_create(dlrec_evaluator **ev, size_t expected_rows) {
  *ev = calloc(1, sizeof **ev);
  if (!*ev) return dlrec_error(DLREC_ERR_NOMEM, "evaluator: out of memory");
  if (expected_rows) {
    (*ev)->pred = malloc(expected_rows * sizeof(float));
    (*ev)->label = malloc(expected_rows);
    if (!(*ev)->pred || !(*ev)->label) {
      dlrec_evaluator_free(*ev);
      *ev = NULL;
      return dlrec_error(DLREC_ERR_NOMEM, "evaluator: cannot allocate %zu rows", expected_rows);
    }
    (*ev)->cap = expected_rows;
  }
  return DLREC_OK;
}

void dlrec_evaluator_free(dlrec_evaluator *ev) {
  if (!ev) return;
  free(ev->pred);
  free(ev->label);
  free(ev);
}

void dlrec_evaluator_reset(dlrec_evaluator *ev) { ev->n = 0; }

dlrec_status dlrec_evaluator_add(dlrec_evaluator *ev, const float *pred, const float *label, size_t n) {
  if (ev->n + n > ev->cap) {
    size_t cap = ev->cap ? ev->cap : 4096;
    while (cap < ev->n + n) cap *= 2;
    float *p = realloc(ev->pred, cap * sizeof(float));
    if (!p) return dlrec_error(DLREC_ERR_NOMEM, "evaluator: cannot grow to %zu rows", cap);
    ev->pred = p;
    uint8_t *l = realloc(ev->label, cap);
    if (!l) return dlrec_error(DLREC_ERR_NOMEM, "evaluator: cannot grow to %zu rows", cap);
    ev->label = l;
    ev->cap = cap;
  }
  for (size_t i = 0; i < n; i++) {
    if (isnan(pred[i])) return dlrec_error(DLREC_ERR_INVALID, "evaluator: prediction %zu is NaN", ev->n + i);
    ev->pred[ev->n + i] = pred[i];
    ev->label[ev->n + i] = label[i] > 0.5f;
  }
  ev->n += n;
  return DLREC_OK;
}

/* Maps a float to a uint32 whose unsigned order is the float order
 * (negative numbers flipped entirely, positive ones with the sign bit set). */
static inline uint32_t float_key(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Sorts (key << 1 | label) values by key with an LSD radix sort, 4 passes of
 * 8 bits over the key's 32 bits; stable, so equal keys stay adjacent. */
static void radix_sort(uint64_t *v, uint64_t *tmp, size_t n) {
  for (int pass = 0; pass < 4; pass++) {
    int shift = 1 + 8 * pass;
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++) count[((v[i] >> shift) & 0xff) + 1]++;
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    for (size_t i = 0; i < n; i++) tmp[count[(v[i] >> shift) & 0xff]++] = v[i];
    uint64_t *s = v;
    v = tmp;
    tmp = s;
  }
  /* After an even number of passes the sorted data is back in the caller's v. */
}

static inline float key_float(uint32_t k) {
  uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The reliability bins of n rows sorted by score (v as radix_sort leaves it):
 * bin b holds sorted rows [b n / K, (b + 1) n / K). */
static void reliability(const uint64_t *v, size_t n, dlrec_metrics *out) {
  const size_t k = n < DLREC_RELIABILITY_BINS ? n : DLREC_RELIABILITY_BINS;
  for (size_t b = 0; b < k; b++) {
    size_t lo = b * n / k, hi = (b + 1) * n / k;
    double sum = 0;
    uint64_t pos = 0;
    for (size_t i = lo; i < hi; i++) {
      sum += key_float((uint32_t)(v[i] >> 1));
      pos += v[i] & 1;
    }
    out->reliability[b].rows = hi - lo;
    out->reliability[b].mean_pred = sum / (double)(hi - lo);
    out->reliability[b].ctr = (double)pos / (double)(hi - lo);
  }
}

dlrec_status dlrec_evaluator_compute(dlrec_evaluator *ev, dlrec_metrics *out) {
  memset(out, 0, sizeof *out);
  size_t n = ev->n;
  out->count = n;
  if (n == 0) return dlrec_error(DLREC_ERR_INVALID, "evaluator: no rows to evaluate");
  double loss = 0, sum_pred = 0;
  uint64_t pos = 0;
  for (size_t i = 0; i < n; i++) {
    double p = ev->pred[i];
    double pc = p < 1e-7 ? 1e-7 : (p > 1 - 1e-7 ? 1 - 1e-7 : p);
    loss -= ev->label[i] ? log(pc) : log(1 - pc);
    sum_pred += p;
    pos += ev->label[i];
  }
  uint64_t neg = n - pos;
  out->logloss = loss / (double)n;
  out->ctr = (double)pos / (double)n;
  out->mean_pred = sum_pred / (double)n;
  out->calibration = pos ? out->mean_pred / out->ctr : NAN;
  double c = out->ctr;
  double prior = (c > 0 && c < 1) ? -(c * log(c) + (1 - c) * log(1 - c)) : 0;
  out->ne = prior > 0 ? out->logloss / prior : NAN;
  uint64_t *v = malloc(n * sizeof *v), *tmp = malloc(n * sizeof *tmp);
  if (!v || !tmp) {
    free(v);
    free(tmp);
    return dlrec_error(DLREC_ERR_NOMEM, "evaluator: cannot sort %zu scores", n);
  }
  for (size_t i = 0; i < n; i++) v[i] = ((uint64_t)float_key(ev->pred[i]) << 1) | ev->label[i];
  radix_sort(v, tmp, n);
  reliability(v, n, out);
  if (!pos || !neg) {
    out->auc = NAN;
    free(v);
    free(tmp);
    return DLREC_OK;
  }
  /* Walk groups of equal scores in ascending order: every positive in a group
   * beats all negatives below the group and ties half of those in it. */
  double wins = 0;
  uint64_t neg_below = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    uint64_t gpos = 0;
    while (j < n && (v[j] >> 1) == (v[i] >> 1)) gpos += v[j++] & 1;
    uint64_t gneg = (j - i) - gpos;
    wins += (double)gpos * ((double)neg_below + 0.5 * (double)gneg);
    neg_below += gneg;
    i = j;
  }
  out->auc = wins / ((double)pos * (double)neg);
  free(v);
  free(tmp);
  return DLREC_OK;
}

dlrec_status dlrec_metrics_compute(const float *pred, const float *label, size_t n, dlrec_metrics *out) {
  dlrec_evaluator *ev;
  dlrec_status s = dlrec_evaluator_create(&ev, n);
  if (s == DLREC_OK) s = dlrec_evaluator_add(ev, pred, label, n);
  if (s == DLREC_OK) s = dlrec_evaluator_compute(ev, out);
  dlrec_evaluator_free(ev);
  return s;
}
