/* The hash table store against the plain array lookup, side by side in one
 * run (issue 12's benchmark).
 *
 * A table of --rows rows of --dim floats; batches of --batch samples of
 * --cols one-hot columns whose ids (keys, for the hash table) follow a Zipf
 * law of exponent --zipf over --keys distinct values per column. Timed, each
 * the best of --repeats passes over the same --batches batches:
 *   array         the ram store: cpu_bag_forward straight on the ids
 *   hash lookups  the hash store with every key already admitted: resolve
 *                 (index lookups) then the same gather from its rows
 *   hash inserts  a hash store of a tenth of the keys: resolve admits new
 *                 keys and evicts (LRU, sampled) on most misses
 * at 1 and at --threads threads (the gather is parallel; resolving is one
 * thread by design: it decides admission and eviction in batch order, so the
 * table is a function of the batch sequence). Prints one JSON object: ids/s
 * of each, and each hash rate as a share of the array's at the same threads.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/hash.h"
#include "core/clock.h"
#include "core/rng.h"
#include "embed/store.h"

typedef struct opts {
  uint32_t rows_per_col, dim, batch, cols, batches, repeats, threads;
  double zipf;
} opts;

/* Zipf ranks 0..n-1 by inversion of the cumulative weights (a table of n). */
static uint32_t *zipf_cdf_sample(dlrec_rng *r, uint32_t n, double s, size_t count) {
  double *cdf = malloc(n * sizeof *cdf);
  uint32_t *out = malloc(count * sizeof *out);
  if (!cdf || !out) {
    free(cdf);
    free(out);
    return NULL;
  }
  double sum = 0;
  for (uint32_t i = 0; i < n; i++) cdf[i] = sum += pow((double)i + 1, -s);
  for (size_t k = 0; k < count; k++) {
    double u = dlrec_rng_uniform(r) * sum;
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
      uint32_t mid = (lo + hi) / 2;
      if (cdf[mid] < u) lo = mid + 1;
      else hi = mid;
    }
    out[k] = lo;
  }
  free(cdf);
  return out;
}

typedef struct batches {
  uint32_t n, B, F;
  uint32_t *offsets;     /* (B + 1), shared by every column: one-hot */
  uint32_t *ids;         /* (n, F, B) global ids */
  uint64_t *keys;        /* the same as raw keys: hashed, 64-bit */
} batches;

/* Ids/s of `repeats` passes (the best) over the batches through store s at
 * `threads` threads. */
static double run(dlrec_store *s, const batches *d, int keys, uint32_t threads, uint32_t repeats, float *out) {
  double best = 0;
  omp_set_num_threads((int)threads);
  for (uint32_t rep = 0; rep < repeats; rep++) {
    double t = dlrec_now();
    for (uint32_t i = 0; i < d->n; i++) {
      const uint32_t *offp[DLREC_BAG_MAX_COLS], *idp[DLREC_BAG_MAX_COLS];
      const uint64_t *kp[DLREC_BAG_MAX_COLS];
      for (uint32_t c = 0; c < d->F; c++) {
        offp[c] = d->offsets;
        idp[c] = d->ids + ((size_t)i * d->F + c) * d->B;
        kp[c] = d->keys + ((size_t)i * d->F + c) * d->B;
      }
      dlrec_bag_batch in = {d->B, d->F, offp, idp, NULL}, r;
      dlrec_key_batch kin = {d->B, d->F, offp, kp, NULL};
      dlrec_status st = keys ? dlrec_store_resolve_keys(s, &kin, &r, 0) : dlrec_store_resolve(s, &in, &r, 0);
      if (st == DLREC_OK) st = cpu_bag_forward(out, dlrec_store_table(s), &r, DLREC_POOLING_SUM);
      if (st != DLREC_OK) {
        fprintf(stderr, "bench_store: %s\n", dlrec_last_error());
        exit(1);
      }
    }
    double rate = (double)d->n * d->B * d->F / (dlrec_now() - t);
    if (rate > best) best = rate;
  }
  return best;
}

int main(int argc, char **argv) {
  opts o = {100000, 16, 2048, 26, 50, 3, 2, 1.05};
  for (int i = 1; i < argc; i += 2) { /* options come in pairs: --name value */
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !v) {
      fprintf(stderr, "usage: bench_store [--keys 100000] [--dim 16] [--batch 2048] [--cols 26] [--batches 50]\n"
                      "                   [--repeats 3] [--threads 2] [--zipf 1.05]\n"
                      "Times the hash table store's lookups and inserts against the plain array lookup\n"
                      "(the ram store) on Zipf-distributed ids, and prints one JSON object.\n");
      return strcmp(a, "--help") ? 2 : 0;
    }
    if (!strcmp(a, "--keys")) o.rows_per_col = (uint32_t)atoi(v);
    else if (!strcmp(a, "--dim")) o.dim = (uint32_t)atoi(v);
    else if (!strcmp(a, "--batch")) o.batch = (uint32_t)atoi(v);
    else if (!strcmp(a, "--cols")) o.cols = (uint32_t)atoi(v);
    else if (!strcmp(a, "--batches")) o.batches = (uint32_t)atoi(v);
    else if (!strcmp(a, "--repeats")) o.repeats = (uint32_t)atoi(v);
    else if (!strcmp(a, "--threads")) o.threads = (uint32_t)atoi(v);
    else if (!strcmp(a, "--zipf")) o.zipf = atof(v);
    else {
      fprintf(stderr, "bench_store: unknown option %s (--help)\n", a);
      return 2;
    }
  }
  if (!o.rows_per_col || !o.dim || !o.batch || !o.cols || o.cols > DLREC_BAG_MAX_COLS || !o.batches ||
      !o.repeats || !o.threads) {
    fprintf(stderr, "bench_store: every option must be positive (--cols at most %d)\n", DLREC_BAG_MAX_COLS);
    return 2;
  }
  batches d = {o.batches, o.batch, o.cols, NULL, NULL, NULL};
  const size_t n_ids = (size_t)o.batches * o.cols * o.batch;
  const uint64_t rows = (uint64_t)o.rows_per_col * o.cols;
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 1, 0);
  uint32_t *ranks = zipf_cdf_sample(&rng, o.rows_per_col, o.zipf, n_ids);
  d.offsets = malloc((o.batch + 1) * sizeof *d.offsets);
  d.ids = malloc(n_ids * sizeof *d.ids);
  d.keys = malloc(n_ids * sizeof *d.keys);
  float *out = malloc((size_t)o.batch * o.cols * o.dim * sizeof *out);
  if (!ranks || !d.offsets || !d.ids || !d.keys || !out) {
    fprintf(stderr, "bench_store: out of memory\n");
    return 1;
  }
  for (uint32_t b = 0; b <= o.batch; b++) d.offsets[b] = b;
  for (size_t k = 0; k < n_ids; k++) {
    const uint32_t c = (uint32_t)(k / o.batch % o.cols);
    d.ids[k] = c * o.rows_per_col + ranks[k];
    d.keys[k] = dlrec_hash_bytes(&d.ids[k], sizeof d.ids[k], 42); /* a raw key stands for the id */
  }
  free(ranks);

  dlrec_store *ram = NULL, *full = NULL, *small = NULL;
  dlrec_store_config rc = {.kind = DLREC_STORE_RAM};
  dlrec_store_config hc = {.kind = DLREC_STORE_HASH, .cache_rows = rows, .init_range = 0.01f, .seed = 1};
  dlrec_store_config sc = hc;
  sc.cache_rows = rows / 10 > (uint64_t)o.batch * o.cols ? rows / 10 : (uint64_t)o.batch * o.cols;
  if (dlrec_store_create(&ram, &rc, rows, o.dim, DLREC_TABLE_FP32) ||
      dlrec_store_create(&full, &hc, rows, o.dim, DLREC_TABLE_FP32) ||
      dlrec_store_create(&small, &sc, rows, o.dim, DLREC_TABLE_FP32)) {
    fprintf(stderr, "bench_store: %s\n", dlrec_last_error());
    return 1;
  }
  /* Every key admitted before the lookups are timed. */
  run(full, &d, 1, 1, 1, out);
  double r[2][3];
  uint32_t th[2] = {1, o.threads};
  dlrec_store_stats before, after;
  dlrec_store_get_stats(small, &before);
  for (int t = 0; t < 2; t++) {
    r[t][0] = run(ram, &d, 0, th[t], o.repeats, out);
    r[t][1] = run(full, &d, 1, th[t], o.repeats, out);
    r[t][2] = run(small, &d, 1, th[t], o.repeats, out);
  }
  dlrec_store_get_stats(small, &after);
  printf("{\"rows\":%llu,\"dim\":%u,\"batch\":%u,\"cols\":%u,\"zipf\":%g,\"threads\":%u,"
         "\"insert_table_rows\":%llu,\"insert_miss_rate\":%.4f,",
         (unsigned long long)rows, o.dim, o.batch, o.cols, o.zipf, o.threads, (unsigned long long)sc.cache_rows,
         (double)(after.misses - before.misses) / (double)(after.lookups - before.lookups));
  for (int t = 0; t < 2; t++)
    printf("\"t%u\":{\"array_ids_per_s\":%.0f,\"hash_lookup_ids_per_s\":%.0f,\"hash_insert_ids_per_s\":%.0f,"
           "\"lookup_vs_array\":%.3f,\"insert_vs_array\":%.3f}%s",
           th[t], r[t][0], r[t][1], r[t][2], r[t][1] / r[t][0], r[t][2] / r[t][0], t ? "" : ",");
  printf("}\n");
  dlrec_store_free(ram);
  dlrec_store_free(full);
  dlrec_store_free(small);
  free(d.offsets);
  free(d.ids);
  free(d.keys);
  free(out);
  return 0;
}
