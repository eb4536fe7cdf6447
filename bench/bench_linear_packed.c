/* The batch-invariant linear layer (cpu_packed_forward) against
 * OpenBLAS, side by side in one run:
 *
 *   bench_linear_packed [--threads 2] [--seconds 0.3] [--batches 1,64,2048]
 *
 * For each layer of the Kaggle DLRM MLPs (bottom 13-512-256-64-16, top
 * 367-512-256-1; ReLU on all but the last) and each batch size, prints
 * GFLOP/s (2 B IN OUT flops per call) of
 *   packed  cpu_packed_forward with the bias and the ReLU fused, and
 *   sgemm   what cpu_sgemm_linear_relu_forward does: the bias copied into out,
 *           cblas_sgemm with beta = 1, then a ReLU pass,
 * and their ratio, then the whole MLP's time per batch. Each side runs in
 * alternating rounds of --seconds / 5 and keeps its best round, so that
 * both see the same machine noise. Threads: --threads for OpenMP and
 * OpenBLAS. Also prints the largest difference between the two outputs
 * relative to the output's magnitude, as a check that both compute the same
 * layer. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/clock.h"
#include "core/rng.h"

void openblas_set_num_threads(int n);

#define ROUNDS 5
#define MAX_BATCHES 8
/* As src/backend/cpu/linear.c: elementwise passes below this run on one thread. */
#define PARALLEL_MIN 32768

typedef struct layer {
  int in, out, relu;
} layer;

static const layer kaggle[] = {{13, 512, 1},  {512, 256, 1}, {256, 64, 1}, {64, 16, 1},
                               {367, 512, 1}, {512, 256, 1}, {256, 1, 0}};
#define N_LAYERS (int)(sizeof kaggle / sizeof kaggle[0])

static void *xmalloc(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench_linear_packed: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

static float *random_floats(size_t n, uint64_t seed, float scale) {
  float *p = xmalloc(n * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  for (size_t i = 0; i < n; i++) p[i] = scale * (float)(dlrec_rng_uniform(&r) * 2 - 1);
  return p;
}

typedef struct work {
  int B, IN, OUT, relu;
  const float *in, *w, *bias;
  float *out;
  const dlrec_packed_linear *packed;
} work;

static void run_packed(const work *k) {
  if (cpu_packed_forward(k->out, k->packed, k->in, k->B, (k->relu) ? DLREC_ACT_RELU : DLREC_ACT_NONE) != DLREC_OK) {
    fprintf(stderr, "bench_linear_packed: %s\n", dlrec_last_error());
    exit(1);
  }
}

/* The training path's forward, spelled out (src/backend/cpu/linear.c). */
static void run_sgemm(const work *k) {
  const int B = k->B, OUT = k->OUT;
  const size_t total = (size_t)B * OUT;
  float *out = k->out;
#pragma omp parallel for schedule(static) if (total >= PARALLEL_MIN)
  for (int b = 0; b < B; b++)
    for (int o = 0; o < OUT; o++) out[(size_t)b * OUT + o] = k->bias[o];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, OUT, k->IN, 1.0f, k->in, k->IN, k->w, k->IN, 1.0f, out,
              OUT);
  if (k->relu) {
#pragma omp parallel for schedule(static) if (total >= PARALLEL_MIN)
    for (size_t i = 0; i < total; i++) out[i] = out[i] > 0.0f ? out[i] : 0.0f;
  }
}

/* Calls per second over one round of `seconds`. */
static double round_rate(void (*fn)(const work *), const work *k, double seconds) {
  long calls = 0;
  double t0 = dlrec_now(), t;
  do {
    for (int i = 0; i < 4; i++) fn(k);
    calls += 4;
    t = dlrec_now() - t0;
  } while (t < seconds);
  return (double)calls / t;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_linear_packed [--threads 2] [--seconds 0.3] [--batches 1,64,2048]\n"
          "Compares cpu_packed_forward with cblas_sgemm (+ bias and ReLU passes) on\n"
          "the Kaggle DLRM MLP layers: GFLOP/s of each and their ratio, per batch size.\n");
}

int main(int argc, char **argv) {
  int threads = 2, batches[MAX_BATCHES] = {1, 64, 2048}, n_batches = 3;
  double seconds = 0.3;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--seconds")) seconds = atof(v);
    else if (!strcmp(a, "--batches")) {
      n_batches = 0;
      for (char *end; *v && n_batches < MAX_BATCHES; v = *end ? end + 1 : end) {
        long b = strtol(v, &end, 10);
        if (end == v || b < 1 || b > 1 << 20 || (*end && *end != ',')) {
          n_batches = 0;
          break;
        }
        batches[n_batches++] = (int)b;
      }
      if (*v) n_batches = 0;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (threads < 1 || seconds <= 0 || n_batches == 0) {
    usage(stderr);
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  const char *wait = getenv("OMP_WAIT_POLICY");
  printf("threads %d, OMP_WAIT_POLICY=%s, best of %d rounds of %.3f s each side\n", threads, wait ? wait : "(unset)",
         ROUNDS, seconds / ROUNDS);
  printf("%-9s %5s %4s | %8s %9s | %8s %9s | %6s | %8s\n", "layer", "B", "relu", "packed", "us/call", "sgemm",
         "us/call", "ratio", "max diff");

  for (int bi = 0; bi < n_batches; bi++) {
    const int B = batches[bi];
    double t_packed = 0, t_sgemm = 0, flops_all = 0;
    for (int li = 0; li < N_LAYERS; li++) {
      const layer *L = &kaggle[li];
      const size_t n_out = (size_t)B * L->out;
      float *in = random_floats((size_t)B * L->in, 1 + li, 1.0f);
      float *w = random_floats((size_t)L->out * L->in, 100 + li, 1.0f / sqrtf((float)L->in));
      float *bias = random_floats((size_t)L->out, 200 + li, 0.1f);
      float *out_p = xmalloc(n_out * sizeof(float)), *out_s = xmalloc(n_out * sizeof(float));
      dlrec_packed_linear *p;
      if (cpu_packed_create(&p, w, bias, L->in, L->out) != DLREC_OK) {
        fprintf(stderr, "bench_linear_packed: %s\n", dlrec_last_error());
        return 1;
      }
      work kp = {B, L->in, L->out, L->relu, in, w, bias, out_p, p};
      work ks = kp;
      ks.out = out_s;
      run_packed(&kp), run_sgemm(&ks); /* warm up: page faults, threads */
      double best_p = 0, best_s = 0;
      for (int r = 0; r < ROUNDS; r++) {
        double rp = round_rate(run_packed, &kp, seconds / ROUNDS), rs = round_rate(run_sgemm, &ks, seconds / ROUNDS);
        if (rp > best_p) best_p = rp;
        if (rs > best_s) best_s = rs;
      }
      double diff = 0, mag = 0;
      for (size_t i = 0; i < n_out; i++) {
        diff = fmax(diff, fabs((double)out_p[i] - out_s[i]));
        mag = fmax(mag, fabs((double)out_s[i]));
      }
      const double flops = 2.0 * B * L->in * L->out;
      printf("%4dx%-4d %5d %4s | %8.2f %9.2f | %8.2f %9.2f | %6.2f | %8.1e\n", L->in, L->out, B, L->relu ? "yes" : "no",
             flops * best_p / 1e9, 1e6 / best_p, flops * best_s / 1e9, 1e6 / best_s, best_p / best_s,
             mag > 0 ? diff / mag : diff);
      fflush(stdout);
      t_packed += 1 / best_p, t_sgemm += 1 / best_s, flops_all += flops;
      cpu_packed_free(p);
      free(in), free(w), free(bias), free(out_p), free(out_s);
    }
    printf("%-9s %5d %4s | %8.2f %9.2f | %8.2f %9.2f | %6.2f |\n", "MLPs", B, "", flops_all / t_packed / 1e9,
           t_packed * 1e6, flops_all / t_sgemm / 1e9, t_sgemm * 1e6, t_sgemm / t_packed);
  }
  return 0;
}
