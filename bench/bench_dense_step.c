/* The dense part of a DLRM training step through a backend's ops, on any
 * backend: the bottom MLP, the dot interaction with given pooled
 * embeddings, the top MLP, BCE, the whole backward and SGD over the dense
 * parameters. No embedding table: what it measures is what the backend's
 * GEMMs and small ops give a step before the table's work is added.
 *
 * The default shape is the "small" DLRM of NVIDIA's DeepLearningExamples
 * (issue 11's reference point): 13 dense features, bottom MLP 512-256-128,
 * 26 embeddings of 128, top MLP 1024-1024-512-256-1.
 *
 * usage: bench_dense_step [device] [precision] [batch] [steps]
 *   (defaults cpu fp32 4096 10); prints samples/s and the GEMMs' TFLOP/s.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "dlrec/progress.h"
#include "dlrec/rng.h"

enum { N_DENSE = 13, F = 26, D = 128, MAX_LAYERS = 8 };
static const int bottom[] = {N_DENSE, 512, 256, 128};
static const int top[] = {D + F * (F + 1) / 2, 1024, 1024, 512, 256, 1};
#define N_BOTTOM (int)(sizeof bottom / sizeof bottom[0] - 1)
#define N_TOP (int)(sizeof top / sizeof top[0] - 1)

typedef struct layer {
  int in, out;
  size_t w, b; /* offsets into the flat parameters */
  float *act;  /* (B, out): the layer's output (after its ReLU) */
  float *dact; /* (B, out): the gradient at its output, then before its ReLU */
} layer;

static dlrec_backend *g_be;

static float *dev_alloc(size_t floats) {
  float *p = g_be->ops->alloc(g_be, floats * sizeof(float));
  if (!p) {
    fprintf(stderr, "bench_dense_step: out of %s memory (%zu floats)\n", g_be->name, floats);
    exit(1);
  }
  return p;
}

static float *dev_random(size_t n, float scale, dlrec_rng *rng) {
  float *h = malloc(n * sizeof(float));
  if (!h) exit(1);
  for (size_t i = 0; i < n; i++) h[i] = scale * (2.0f * (float)dlrec_rng_uniform(rng) - 1.0f);
  float *d = dev_alloc(n);
  if (g_be->ops->upload(g_be, d, h, n * sizeof(float)) != DLREC_OK) exit(1);
  free(h);
  return d;
}

#define RUN(call)                                                                                                   \
  do {                                                                                                              \
    if ((call) != DLREC_OK) {                                                                                       \
      fprintf(stderr, "bench_dense_step: %s: %s\n", #call, dlrec_last_error());                                    \
      exit(1);                                                                                                      \
    }                                                                                                               \
  } while (0)

/* Forward, loss, backward and SGD of one step. */
static void step(layer *bot, layer *tp, float *params, float *grads, size_t n_params, const float *dense,
                 const float *emb, float *inter, float *dinter, float *demb, const float *labels, double *loss, int B) {
  dlrec_backend *be = g_be;
  RUN(BE_OP(be, fill_rows, grads, n_params, 1, n_params, 0.0f));
  const float *in = dense;
  for (int l = 0; l < N_BOTTOM; l++) {
    RUN(BE_OP(be, linear_forward, bot[l].act, in, params + bot[l].w, params + bot[l].b, B, bot[l].in, bot[l].out,
              DLREC_ACT_RELU));
    in = bot[l].act;
  }
  RUN(BE_OP(be, dot_forward, inter, bot[N_BOTTOM - 1].act, emb, B, F, D));
  in = inter;
  for (int l = 0; l < N_TOP; l++) {
    RUN(BE_OP(be, linear_forward, tp[l].act, in, params + tp[l].w, params + tp[l].b, B, tp[l].in, tp[l].out,
              l < N_TOP - 1 ? DLREC_ACT_RELU : DLREC_ACT_NONE));
    in = tp[l].act;
  }
  RUN(BE_OP(be, bce_forward, loss, tp[N_TOP - 1].act, labels, B));
  RUN(BE_OP(be, bce_backward, tp[N_TOP - 1].dact, tp[N_TOP - 1].act, labels, B));
  for (int l = N_TOP - 1; l >= 0; l--) {
    if (l < N_TOP - 1) RUN(BE_OP(be, relu_backward, tp[l].dact, tp[l].dact, tp[l].act, (size_t)B * tp[l].out));
    RUN(BE_OP(be, linear_backward, l ? tp[l - 1].dact : dinter, grads + tp[l].w, grads + tp[l].b, tp[l].dact,
              l ? tp[l - 1].act : inter, params + tp[l].w, B, tp[l].in, tp[l].out));
  }
  RUN(BE_OP(be, dot_backward, bot[N_BOTTOM - 1].dact, demb, dinter, bot[N_BOTTOM - 1].act, emb, B, F, D));
  for (int l = N_BOTTOM - 1; l >= 0; l--) {
    RUN(BE_OP(be, relu_backward, bot[l].dact, bot[l].dact, bot[l].act, (size_t)B * bot[l].out));
    RUN(BE_OP(be, linear_backward, l ? bot[l - 1].dact : NULL, grads + bot[l].w, grads + bot[l].b, bot[l].dact,
              l ? bot[l - 1].act : dense, params + bot[l].w, B, bot[l].in, bot[l].out));
  }
  dlrec_optim_config c;
  dlrec_optim_config_default(&c, DLREC_OPTIM_SGD);
  RUN(BE_OP(be, optim_step, &c, params, grads, NULL, n_params, 1));
}

int main(int argc, char **argv) {
  const char *device = argc > 1 ? argv[1] : "cpu";
  dlrec_precision precision = DLREC_PRECISION_FP32;
  if (argc > 2 && dlrec_precision_parse(argv[2], &precision) != DLREC_OK) {
    fprintf(stderr, "bench_dense_step: %s\n", dlrec_last_error());
    return 2;
  }
  const int B = argc > 3 ? atoi(argv[3]) : 4096, steps = argc > 4 ? atoi(argv[4]) : 10;
  if (B < 2 || steps < 1) {
    fprintf(stderr, "usage: bench_dense_step [device] [precision] [batch >= 2] [steps >= 1]\n");
    return 2;
  }
  dlrec_backend_config bc = {0, precision, 0};
  if (dlrec_backend_create_on(&g_be, device, &bc) != DLREC_OK) {
    fprintf(stderr, "bench_dense_step: %s\n", dlrec_last_error());
    return 1;
  }
  dlrec_rng rng;
  dlrec_rng_seed(&rng, 1, 0);
  layer bot[MAX_LAYERS], tp[MAX_LAYERS];
  size_t n_params = 0;
  double macs = 0; /* a sample's forward multiply-adds in the GEMMs */
  for (int l = 0; l < N_BOTTOM + N_TOP; l++) {
    layer *L = l < N_BOTTOM ? &bot[l] : &tp[l - N_BOTTOM];
    L->in = l < N_BOTTOM ? bottom[l] : top[l - N_BOTTOM];
    L->out = l < N_BOTTOM ? bottom[l + 1] : top[l - N_BOTTOM + 1];
    L->w = n_params, n_params += (size_t)L->in * L->out;
    L->b = n_params, n_params += (size_t)L->out;
    L->act = dev_alloc((size_t)B * L->out);
    L->dact = dev_alloc((size_t)B * L->out);
    macs += (double)L->in * L->out;
  }
  float *params = dev_random(n_params, 0.05f, &rng), *grads = dev_alloc(n_params);
  float *dense = dev_random((size_t)B * N_DENSE, 1.0f, &rng), *emb = dev_random((size_t)B * F * D, 0.1f, &rng);
  float *labels = dev_random((size_t)B, 0.5f, &rng);
  RUN(BE_OP(g_be, scale, labels, (size_t)B, 0.0f)); /* labels 0: any will do for timing */
  float *inter = dev_alloc((size_t)B * top[0]), *dinter = dev_alloc((size_t)B * top[0]);
  float *demb = dev_alloc((size_t)B * F * D);
  double *loss = g_be->ops->alloc(g_be, sizeof(double));
  step(bot, tp, params, grads, n_params, dense, emb, inter, dinter, demb, labels, loss, B); /* warm-up */
  RUN(g_be->ops->synchronize(g_be));
  const double t0 = dlrec_now();
  for (int s = 0; s < steps; s++)
    step(bot, tp, params, grads, n_params, dense, emb, inter, dinter, demb, labels, loss, B);
  RUN(g_be->ops->synchronize(g_be));
  const double secs = (dlrec_now() - t0) / steps;
  printf("%s, batch %d: %.3f ms a step, %.0f samples/s, GEMMs %.1f TFLOP/s (%.2f MFLOP a sample)\n",
         dlrec_backend_describe(g_be), B, secs * 1e3, B / secs, 6.0 * macs * B / secs / 1e12, 6.0 * macs / 1e6);
  dlrec_backend_free(g_be); /* the process ends: the buffers go with it */
  return 0;
}
