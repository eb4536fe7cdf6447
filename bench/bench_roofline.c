/* The machine's limits for DLRM training, measured in the same run as the
 * trainer they are compared with (bench/train_vs_torch.sh):
 *
 *   bench_roofline --data T.dlr [--batch 2048] [--threads 2] [--dim 16]
 *                  [--bottom 512,256,64,16] [--top 512,256,1] [--seconds 1]
 *
 * Prints one JSON object:
 *   sgemm_peak_gflops    OpenBLAS sgemm on 2048 x 2048 x 2048, the best of
 *                        its runs: the MLP roofline
 *   sgemm_model_gflops   the same sgemm calls a training step makes (forward,
 *                        dW and din of every layer of the given MLPs at this
 *                        batch size), flops over their summed time
 *   gather_ids_per_s     a plain gather of one embedding row (dim floats, rows
 *                        padded to 16 bytes) per id, of the file's own ids in
 *                        batches of --batch rows, OpenMP over samples, with
 *                        the rows of 4 samples ahead prefetched: the
 *                        embedding roofline for this data
 *   random_gather_ids_per_s  the same with ids uniform over the table
 *   bag_forward_ids_per_s    cpu_bag_forward on the same batches
 *   cold_gather_ids_per_s, cold_bag_forward_ids_per_s
 *                        the gather and cpu_bag_forward with the caches
 *                        flushed before each batch, as in a training step,
 *                        where the MLPs' activations evict the table: the
 *                        limit the trainer's lookups compare with
 *   dnnl_f32_peak_gflops, dnnl_f32_model_gflops   oneDNN's fp32 matmul on
 *                        2048^3 and on the same calls (null in a build
 *                        without oneDNN): the rates that decided where fp32
 *                        GEMMs run (src/backend/cpu/cpu_gemm.c)
 *   dnnl_bf16_model_gflops  oneDNN's bf16 matmul (bf16 operands already
 *                        converted, fp32 accumulation) on the same calls;
 *                        null where oneDNN has no bf16 kernel for this CPU
 *                        (oneDNN 2.6 has none below AVX512)
 *   bf16_model_gflops    the CPU backend's bf16 linear layers (forward, then
 *                        backward: dW, db and din unless first), operand
 *                        rounding or conversion included, on the MLPs' layers
 *   fp32_layer_model_gflops, fp32_gemms  the same layers in fp32, for
 *                        comparison, and what ran them ("fp32 GEMMs (oneDNN)")
 *   bf16_gemms, bf16_native  what ran bf16 ("bf16 GEMMs (emulated: ...)") and
 *                        whether on the CPU's own bf16 instructions
 * Threads: --threads for OpenMP and OpenBLAS (the trainer's setting). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_dnnl.h"
#include "backend/cpu/cpu_gemm.h"
#include "embed/embed.h"
#include "data/loader.h"
#include "backend/cpu/kernels.h"
#include "core/clock.h"
#include "core/rng.h"

void openblas_set_num_threads(int n);

#define MAX_BATCHES 64
#define MAX_LAYERS 8

static void die(const char *what) {
  fprintf(stderr, "bench_roofline: %s: %s\n", what, dlrec_last_error());
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench_roofline: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

static float *random_floats(size_t n, uint64_t seed) {
  float *p = xmalloc(n * sizeof(float));
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  for (size_t i = 0; i < n; i++) p[i] = (float)(dlrec_rng_uniform(&r) - 0.5);
  return p;
}

static int parse_widths(const char *s, uint32_t *w) {
  int n = 0;
  for (char *end; *s && n < MAX_LAYERS; s = *end ? end + 1 : end) {
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 65536 || (*end && *end != ',')) return 0;
    w[n++] = (uint32_t)v;
  }
  return *s ? 0 : n;
}

/* Runs fn until `seconds` have passed (at least twice) and returns the best
 * rate of work units per second over its runs. */
typedef void (*work_fn)(void *ctx);
static double best_rate(work_fn fn, void *ctx, double units, double seconds) {
  fn(ctx); /* warm up: page faults, thread start */
  double best = 0, t_end = dlrec_now() + seconds;
  for (int runs = 0; runs < 2 || dlrec_now() < t_end; runs++) {
    double t0 = dlrec_now();
    fn(ctx);
    double r = units / (dlrec_now() - t0);
    if (r > best) best = r;
  }
  return best;
}

typedef struct gemm {
  int ta, tb, M, N, K; /* row-major C (M, N) = op(A) op(B), A and B as the trainer lays them out */
  float *a, *b, *c;
} gemm;

static void run_gemm(void *ctx) {
  const gemm *g = ctx;
  int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->M, g->N, g->K,
              1.0f, g->a, lda, g->b, ldb, 1.0f, g->c, g->N);
}

static gemm make_gemm(int ta, int tb, int M, int N, int K) {
  gemm g = {ta, tb, M, N, K, random_floats((size_t)M * K, 1), random_floats((size_t)K * N, 2),
            random_floats((size_t)M * N, 3)};
  return g;
}

static void free_gemm(gemm *g) {
  free(g->a);
  free(g->b);
  free(g->c);
}

/* The GEMMs of one MLP layer (in -> out) at batch B, as src/backend/cpu/linear.c
 * calls them: forward (B, out) = in · Wᵀ, dW (out, in) = doutᵀ · in, and
 * din (B, in) = dout · W unless the layer is the network's first. Returns
 * the seconds they take at their best rates. */
static double layer_seconds(int B, int in, int out, int first, double seconds, double *flops) {
  gemm g[3] = {make_gemm(0, 1, B, out, in), make_gemm(1, 0, out, in, B), make_gemm(0, 0, B, in, out)};
  double s = 0, f = 2.0 * B * in * out;
  for (int i = 0; i < (first ? 2 : 3); i++) {
    s += f / best_rate(run_gemm, &g[i], f, seconds);
    *flops += f;
  }
  for (int i = 0; i < 3; i++) free_gemm(&g[i]);
  return s;
}

/* The same GEMM on oneDNN: A and B converted to bf16 beforehand (the
 * conversion is the caller's, timed in bf16_model_gflops), accumulating
 * onto C as the sgemm above does. */
typedef struct dnnl_gemm {
  cpu_dnnl *d;
  gemm g;
  const void *a, *b;
  int failed;
} dnnl_gemm;

static void run_dnnl_gemm(void *ctx) {
  dnnl_gemm *x = ctx;
  if (cpu_dnnl_matmul(x->d, x->g.c, x->a, x->g.ta, x->b, x->g.tb, NULL, x->g.M, x->g.N, x->g.K, DLREC_ACT_NONE, 1))
    x->failed = 1;
}

static uint16_t *to_bf16(const float *x, size_t n) {
  uint16_t *h = xmalloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* finite inputs: no NaN case */
  }
  return h;
}

/* layer_seconds on oneDNN, fp32 or bf16 as d was created; a negative result
 * when oneDNN refuses a shape. */
static double dnnl_layer_seconds(cpu_dnnl *d, int bf16, int B, int in, int out, int first, double seconds) {
  dnnl_gemm x[3] = {{d, make_gemm(0, 1, B, out, in), NULL, NULL, 0}, {d, make_gemm(1, 0, out, in, B), NULL, NULL, 0},
                    {d, make_gemm(0, 0, B, in, out), NULL, NULL, 0}};
  double s = 0, f = 2.0 * B * in * out;
  for (int i = 0; i < (first ? 2 : 3) && s >= 0; i++) {
    gemm *g = &x[i].g;
    x[i].a = bf16 ? (void *)to_bf16(g->a, (size_t)g->M * g->K) : (void *)g->a;
    x[i].b = bf16 ? (void *)to_bf16(g->b, (size_t)g->K * g->N) : (void *)g->b;
    run_dnnl_gemm(&x[i]);
    if (x[i].failed) s = -1;
    else s += f / best_rate(run_dnnl_gemm, &x[i], f, seconds);
    if (bf16) free((void *)x[i].a), free((void *)x[i].b);
  }
  for (int i = 0; i < 3; i++) free_gemm(&x[i].g);
  return s;
}

/* One MLP layer's forward and backward through the CPU backend's GEMMs (cpu_gemm.c). */
typedef struct layer {
  cpu_gemm *gm;
  int B, in, out, first;
  float *x, *w, *bias, *y, *dy, *dx, *dw, *db;
} layer;

static void run_layer(void *ctx) {
  layer *l = ctx;
  if (cpu_linear_forward(l->gm, l->y, l->x, l->w, l->bias, l->B, l->in, l->out, DLREC_ACT_RELU) ||
      cpu_linear_backward(l->gm, l->first ? NULL : l->dx, l->dw, l->db, l->dy, l->x, l->w, l->B, l->in, l->out))
    die("cpu_gemm layer");
}

static double gemm_layer_seconds(cpu_gemm *gm, int B, int in, int out, int first, double seconds, double *flops) {
  layer l = {gm, B, in, out, first, random_floats((size_t)B * in, 1), random_floats((size_t)out * in, 2),
             random_floats(out, 3), random_floats((size_t)B * out, 4), random_floats((size_t)B * out, 5),
             random_floats((size_t)B * in, 6), random_floats((size_t)out * in, 7), random_floats(out, 8)};
  double f = 2.0 * B * in * out * (first ? 2 : 3);
  double s = f / best_rate(run_layer, &l, f, seconds);
  *flops += f;
  free(l.x), free(l.w), free(l.bias), free(l.y), free(l.dy), free(l.dx), free(l.dw), free(l.db);
  return s;
}

typedef struct gather {
  const float *table;
  uint32_t stride, dim, cols;
  int n_batches;
  uint32_t rows[MAX_BATCHES];
  uint32_t *ids[MAX_BATCHES]; /* (rows, cols) sample-major */
  float *out;                 /* (rows, cols, dim) */
} gather;

static void gather_batch(const void *ctx, int k) {
  const gather *g = ctx;
  const size_t row_bytes = g->dim * sizeof(float);
  const uint32_t *ids = g->ids[k];
#pragma omp parallel for schedule(static)
  for (uint32_t b = 0; b < g->rows[k]; b++)
    for (uint32_t c = 0; c < g->cols; c++) {
      size_t i = (size_t)b * g->cols + c;
      if (b + 4 < g->rows[k]) __builtin_prefetch(g->table + (size_t)ids[i + 4 * g->cols] * g->stride);
      memcpy(g->out + i * g->dim, g->table + (size_t)ids[i] * g->stride, row_bytes);
    }
}

static void run_gather(void *ctx) {
  const gather *g = ctx;
  for (int k = 0; k < g->n_batches; k++) gather_batch(g, k);
}

typedef struct bags {
  const dlrec_table *table;
  int n_batches;
  dlrec_bag_batch batch[MAX_BATCHES];
  float *out;
} bags;

static void bags_batch(const void *ctx, int k) {
  const bags *g = ctx;
  if (cpu_bag_forward(g->out, g->table, &g->batch[k], DLREC_POOLING_SUM) != DLREC_OK) die("bag forward");
}

static void run_bags(void *ctx) {
  const bags *g = ctx;
  for (int k = 0; k < g->n_batches; k++) bags_batch(g, k);
}

/* Ids per second of fn over every batch, each started with cold caches: a
 * 64 MiB buffer (twice this machine's L3) is read and written before each batch,
 * outside the timing, as a training step's MLP activations evict the table
 * between one step's lookups and the next. */
typedef void (*batch_fn)(const void *ctx, int k);
static double cold_rate(batch_fn fn, const void *ctx, int n_batches, double lookups) {
  const size_t n = (size_t)64 << 20;
  char *junk = xmalloc(n);
  double t = 0;
  for (int k = 0; k < n_batches; k++) {
    /* A read and a write per line: glibc's memset of this size streams
     * past the caches with non-temporal stores and would evict nothing. */
    for (size_t i = 0; i < n; i += 64) ((volatile char *)junk)[i] += (char)k;
    double t0 = dlrec_now();
    fn(ctx, k);
    t += dlrec_now() - t0;
  }
  free(junk);
  return lookups / t;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_roofline --data T.dlr [--batch 2048] [--threads 2] [--dim 16]\n"
          "                      [--bottom 512,256,64,16] [--top 512,256,1] [--seconds 1]\n"
          "Measures sgemm's peak and its rate on the MLPs' shapes, oneDNN's fp32 and bf16\n"
          "matmuls and the CPU backend's bf16 layers on the same shapes, and embedding gathers\n"
          "of the file's ids, and prints them as one JSON object.\n");
}

int main(int argc, char **argv) {
  const char *data = NULL;
  int batch = 2048, threads = 2, dim = 16;
  double seconds = 1;
  uint32_t bottom[MAX_LAYERS] = {512, 256, 64, 16}, top[MAX_LAYERS] = {512, 256, 1};
  int n_bottom = 4, n_top = 3;
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
    if (!strcmp(a, "--data")) data = v;
    else if (!strcmp(a, "--batch")) batch = atoi(v);
    else if (!strcmp(a, "--threads")) threads = atoi(v);
    else if (!strcmp(a, "--dim")) dim = atoi(v);
    else if (!strcmp(a, "--seconds")) seconds = atof(v);
    else if (!strcmp(a, "--bottom")) n_bottom = parse_widths(v, bottom);
    else if (!strcmp(a, "--top")) n_top = parse_widths(v, top);
    else {
      usage(stderr);
      return 2;
    }
  }
  if (!data || batch < 1 || batch > 65536 || threads < 1 || dim < 1 || dim > DLREC_EMBED_MAX_DIM || !n_bottom ||
      !n_top || seconds <= 0) {
    usage(stderr);
    return 2;
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  /* The file's first batches, in file order. */
  dlrec_loader_opts o;
  dlrec_loader_opts_default(&o);
  o.batch_rows = (uint32_t)batch;
  o.shuffle = 0;
  o.epochs = 1;
  dlrec_loader *l;
  if (dlrec_loader_open(&l, &data, 1, &o) != DLREC_OK) die(data);
  const dlrec_schema *s = dlrec_loader_schema(l);
  uint32_t F = s->n_sparse, n_dense = s->n_dense;
  gather g = {.dim = (uint32_t)dim, .cols = F};
  bags bg = {0};
  const dlrec_batch *b;
  dlrec_status st;
  uint64_t lookups = 0;
  while (g.n_batches < MAX_BATCHES && (st = dlrec_loader_next(l, &b)) == DLREC_OK) {
    int k = g.n_batches++;
    g.rows[k] = b->rows;
    g.ids[k] = xmalloc((size_t)b->rows * F * sizeof(uint32_t));
    uint32_t *off = xmalloc(((size_t)b->rows + 1) * F * sizeof(uint32_t)), *ids = xmalloc((size_t)b->rows * F * 4);
    for (uint32_t c = 0; c < F; c++) {
      if (b->offsets[c][b->rows] - b->offsets[c][0] != b->rows) {
        fprintf(stderr, "bench_roofline: %s: column %u is not one-hot\n", data, c);
        return 1;
      }
      for (uint32_t r = 0; r <= b->rows; r++) off[(size_t)c * (b->rows + 1) + r] = r;
      for (uint32_t r = 0; r < b->rows; r++) {
        uint32_t id = b->ids[c][b->offsets[c][0] + r];
        g.ids[k][(size_t)r * F + c] = id;
        ids[(size_t)c * b->rows + r] = id;
      }
    }
    bg.batch[k].rows = b->rows;
    bg.batch[k].cols = F;
    const uint32_t **offs = xmalloc(F * sizeof *offs), **idp = xmalloc(F * sizeof *idp);
    for (uint32_t c = 0; c < F; c++) {
      offs[c] = off + (size_t)c * (b->rows + 1);
      idp[c] = ids + (size_t)c * b->rows;
    }
    bg.batch[k].offsets = offs;
    bg.batch[k].ids = idp;
    lookups += (uint64_t)b->rows * F;
  }
  if (!g.n_batches) die("no batches");
  uint64_t table_rows = s->table_rows;
  dlrec_loader_close(l);

  dlrec_table *t;
  if (dlrec_table_create(&t, table_rows, (uint32_t)dim) != DLREC_OK) die("table");
  dlrec_row_range all = {.begin = 0, .end = table_rows};
  if (dlrec_table_init_uniform(t, &all, 1, 1) != DLREC_OK) die("table init");
  g.table = dlrec_table_data_const(t);
  g.stride = dlrec_table_stride(t);
  g.out = xmalloc((size_t)batch * F * dim * sizeof(float));
  bg.table = t;
  bg.n_batches = g.n_batches;
  bg.out = g.out;

  double gather_rate = best_rate(run_gather, &g, (double)lookups, seconds);
  double bag_rate = best_rate(run_bags, &bg, (double)lookups, seconds);
  double cold_gather = 0, cold_bag = 0;
  for (int rep = 0; rep < 3; rep++) { /* the best of 3 */
    double x = cold_rate(gather_batch, &g, g.n_batches, (double)lookups);
    double y = cold_rate(bags_batch, &bg, g.n_batches, (double)lookups);
    cold_gather = x > cold_gather ? x : cold_gather;
    cold_bag = y > cold_bag ? y : cold_bag;
  }
  dlrec_rng r;
  dlrec_rng_seed(&r, 7, 0);
  for (int k = 0; k < g.n_batches; k++)
    for (size_t i = 0; i < (size_t)g.rows[k] * F; i++) g.ids[k][i] = (uint32_t)(dlrec_rng_u64(&r) % table_rows);
  double random_rate = best_rate(run_gather, &g, (double)lookups, seconds);

  gemm sq = make_gemm(0, 1, 2048, 2048, 2048);
  double peak = best_rate(run_gemm, &sq, 2.0 * 2048 * 2048 * 2048, seconds) / 1e9;
  free_gemm(&sq);
  double model_s = 0, model_flops = 0;
  uint32_t inter = (uint32_t)dlrec_interaction_dot_dim((int)F, dim);
  for (int i = 0; i < n_bottom; i++)
    model_s += layer_seconds(batch, i ? (int)bottom[i - 1] : (int)n_dense, (int)bottom[i], i == 0, seconds / 4,
                             &model_flops);
  for (int i = 0; i < n_top; i++)
    model_s += layer_seconds(batch, i ? (int)top[i - 1] : (int)inter, (int)top[i], 0, seconds / 4, &model_flops);


  /* The same layers on oneDNN (fp32, then bf16), and through the CPU
   * backend's linear layers in fp32 and bf16. */
  int n_layers = n_bottom + n_top, lin[2 * MAX_LAYERS], lout[2 * MAX_LAYERS];
  for (int i = 0; i < n_layers; i++) {
    if (i < n_bottom) lin[i] = i ? (int)bottom[i - 1] : (int)n_dense;
    else lin[i] = i > n_bottom ? (int)top[i - n_bottom - 1] : (int)inter;
    lout[i] = i < n_bottom ? (int)bottom[i] : (int)top[i - n_bottom];
  }
  char dnnl_rate[2][32], dnnl_peak[32] = "null";
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    cpu_dnnl *d = NULL;
    double secs = 0;
    snprintf(dnnl_rate[bf16], sizeof dnnl_rate[bf16], "null");
    if (cpu_dnnl_available() && cpu_dnnl_create(&d, bf16) == DLREC_OK) {
      if (!bf16) { /* the fp32 peak, on sgemm's square */
        dnnl_gemm x = {d, make_gemm(0, 1, 2048, 2048, 2048), NULL, NULL, 0};
        x.a = x.g.a, x.b = x.g.b;
        run_dnnl_gemm(&x);
        const double f = 2.0 * 2048 * 2048 * 2048;
        if (!x.failed) snprintf(dnnl_peak, sizeof dnnl_peak, "%.1f", best_rate(run_dnnl_gemm, &x, f, seconds) / 1e9);
        free_gemm(&x.g);
      }
      for (int i = 0; i < n_layers && secs >= 0; i++) {
        double t = dnnl_layer_seconds(d, bf16, batch, lin[i], lout[i], i == 0, seconds / 4);
        secs = t < 0 ? -1 : secs + t;
      }
      if (secs > 0) snprintf(dnnl_rate[bf16], sizeof dnnl_rate[bf16], "%.1f", model_flops / secs / 1e9);
      else fprintf(stderr, "bench_roofline: oneDNN %s matmul: %s\n", bf16 ? "bf16" : "fp32", dlrec_last_error());
    }
    cpu_dnnl_free(d);
  }
  double layer_rate[2];
  int bf16_native = 0;
  char bf16_gemms[160] = "", fp32_gemms[160] = "";
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    cpu_gemm *gm;
    int native;
    if (cpu_gemm_create(&gm, bf16 ? DLREC_PRECISION_BF16 : DLREC_PRECISION_FP32, &native) != DLREC_OK) die("cpu_gemm");
    double secs = 0, flops = 0;
    for (int i = 0; i < n_layers; i++)
      secs += gemm_layer_seconds(gm, batch, lin[i], lout[i], i == 0, seconds / 4, &flops);
    layer_rate[bf16] = flops / secs / 1e9;
    if (bf16) bf16_native = native, snprintf(bf16_gemms, sizeof bf16_gemms, "%s", cpu_gemm_describe(gm));
    else snprintf(fp32_gemms, sizeof fp32_gemms, "%s", cpu_gemm_describe(gm));
    cpu_gemm_free(gm);
  }

  printf("{\"batch\": %d, \"threads\": %d, \"sgemm_peak_gflops\": %.1f, \"sgemm_model_gflops\": %.1f, "
         "\"dnnl_f32_peak_gflops\": %s, \"dnnl_f32_model_gflops\": %s, \"dnnl_bf16_model_gflops\": %s, "
         "\"fp32_layer_model_gflops\": %.1f, \"fp32_gemms\": \"%s\", "
         "\"bf16_model_gflops\": %.1f, \"bf16_gemms\": \"%s\", \"bf16_native\": %s, "
         "\"gather_ids_per_s\": %.0f, \"random_gather_ids_per_s\": %.0f, \"bag_forward_ids_per_s\": %.0f, "
         "\"cold_gather_ids_per_s\": %.0f, \"cold_bag_forward_ids_per_s\": %.0f, \"table_rows\": %llu}\n",
         batch, threads, peak, model_flops / model_s / 1e9, dnnl_peak, dnnl_rate[0], dnnl_rate[1], layer_rate[0],
         fp32_gemms, layer_rate[1], bf16_gemms, bf16_native ? "true" : "false", gather_rate, random_rate, bag_rate,
         cold_gather, cold_bag, (unsigned long long)table_rows);
  dlrec_table_free(t);
  return 0;
}
