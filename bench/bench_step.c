/* A DLRM training step through a backend's ops, on any backend: the
 * embedding bags (one-hot, one fused fp32 table of `rows` rows a column,
 * ids skewed toward each column's first rows), the bottom MLP, the dot
 * interaction, the top MLP, BCE, the whole backward, SGD over the dense
 * parameters and the fused sparse backward + SGD on the table. With rows 0
 * there is no table: the pooled embeddings are given, and the step is the
 * dense part alone. Batches are host memory, as the loader's are (the bag
 * ops copy the ids over on a GPU).
 *
 * The shape is the "small" DLRM of NVIDIA's DeepLearningExamples (issue
 * 11's reference point): 13 dense features, bottom MLP 512-256-128, 26
 * columns of 128, top MLP 1024-1024-512-256-1.
 *
 * usage: bench_step [device] [precision] [batch] [steps] [rows] [profile]
 *   (defaults cpu fp32 4096 10 0); prints samples/s and the GEMMs' TFLOP/s,
 *   and with "profile" each op's share of the step.
 *   rows "1tb": the 26 columns of Criteo 1TB's frequency-threshold-15
 *   vocabularies (DeepLearningExamples' preprocessing), 32.7M rows, 4.19B
 *   parameters (15.6 GiB in fp32): the reference model's own table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/dispatch.h"
#include "core/clock.h"
#include "core/rng.h"
#include "data/synth.h"

enum { N_DENSE = 13, F = 26, D = 128, MAX_LAYERS = 8 };
static const int bottom[] = {N_DENSE, 512, 256, 128};
static const int top[] = {D + F * (F + 1) / 2, 1024, 1024, 512, 256, 1};
_Static_assert(F == DLREC_SYNTH_CAT, "the 1tb table's columns are dlrec synth's");
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
    fprintf(stderr, "bench_step: out of %s memory (%zu floats)\n", g_be->name, floats);
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

/* "profile" (argument 6): each op of the timed steps is followed by a
 * synchronize and its time is added to its name's; the report gives each op's
 * share of the step. The syncs cost some time of their own: the step is a
 * little slower than without. */
static int g_profile;
enum { MAX_PROF = 32 };
static struct {
  char name[40];
  double secs;
  long calls;
} g_prof[MAX_PROF];
static int g_n_prof;
static char g_tag[16]; /* a linear layer's shape, told apart in the report */

/* The op's name in "BE_OP(be, name, ...)", and g_tag. */
static void prof_add(const char *call, double secs) {
  const char *p = strchr(call, ',');
  p = p ? p + 1 : call;
  while (*p == ' ') p++;
  char name[sizeof g_prof[0].name];
  snprintf(name, sizeof name, "%.*s%s%s", (int)strcspn(p, ",)"), p, *g_tag ? " " : "", g_tag);
  int i = 0;
  while (i < g_n_prof && strcmp(g_prof[i].name, name)) i++;
  if (i == g_n_prof) {
    if (g_n_prof == MAX_PROF) return;
    memcpy(g_prof[i].name, name, sizeof name);
    g_n_prof++;
  }
  g_prof[i].secs += secs, g_prof[i].calls++;
}

#define RUN(call)                                                                                                   \
  do {                                                                                                              \
    const double t_ = g_profile ? dlrec_now() : 0;                                                                  \
    if ((call) != DLREC_OK || (g_profile && g_be->ops->synchronize(g_be) != DLREC_OK)) {                            \
      fprintf(stderr, "bench_step: %s: %s\n", #call, dlrec_last_error());                                           \
      exit(1);                                                                                                      \
    }                                                                                                               \
    if (g_profile) prof_add(#call, dlrec_now() - t_);                                                               \
  } while (0)

/* The table (rows > 0): the one the bag ops take (a mirror on a backend
 * whose memory is not the host's), its SGD and the batch's bags. */
typedef struct emb_stage {
  dlrec_table *host, *t;
  dlrec_sparse_optim *host_o, *o;
  dlrec_bag_batch bags;
  void *scratch;
  size_t scratch_bytes;
} emb_stage;

/* Forward, loss, backward and SGD of one step. */
static void step(layer *bot, layer *tp, float *params, float *grads, size_t n_params, const float *dense, float *emb,
                 float *inter, float *dinter, float *demb, const float *labels, double *loss, int B, emb_stage *es) {
  dlrec_backend *be = g_be;
  if (es) RUN(BE_OP(be, bag_forward, emb, es->t, &es->bags, DLREC_POOLING_SUM));
  RUN(BE_OP(be, fill_rows, grads, n_params, 1, n_params, 0.0f));
  const float *in = dense;
  for (int l = 0; l < N_BOTTOM; l++) {
    snprintf(g_tag, sizeof g_tag, "%d->%d", bot[l].in, bot[l].out);
    RUN(BE_OP(be, linear_forward, bot[l].act, in, params + bot[l].w, params + bot[l].b, B, bot[l].in, bot[l].out,
              DLREC_ACT_RELU));
    in = bot[l].act;
  }
  *g_tag = 0;
  RUN(BE_OP(be, dot_forward, inter, bot[N_BOTTOM - 1].act, emb, B, F, D));
  in = inter;
  for (int l = 0; l < N_TOP; l++) {
    snprintf(g_tag, sizeof g_tag, "%d->%d", tp[l].in, tp[l].out);
    RUN(BE_OP(be, linear_forward, tp[l].act, in, params + tp[l].w, params + tp[l].b, B, tp[l].in, tp[l].out,
              l < N_TOP - 1 ? DLREC_ACT_RELU : DLREC_ACT_NONE));
    in = tp[l].act;
  }
  *g_tag = 0;
  RUN(BE_OP(be, bce_forward, loss, tp[N_TOP - 1].act, labels, B));
  RUN(BE_OP(be, bce_backward, tp[N_TOP - 1].dact, tp[N_TOP - 1].act, labels, B));
  for (int l = N_TOP - 1; l >= 0; l--) {
    if (l < N_TOP - 1) RUN(BE_OP(be, relu_backward, tp[l].dact, tp[l].dact, tp[l].act, (size_t)B * tp[l].out));
    snprintf(g_tag, sizeof g_tag, "%d->%d", tp[l].in, tp[l].out);
    RUN(BE_OP(be, linear_backward, l ? tp[l - 1].dact : dinter, grads + tp[l].w, grads + tp[l].b, tp[l].dact,
              l ? tp[l - 1].act : inter, params + tp[l].w, B, tp[l].in, tp[l].out));
    *g_tag = 0;
  }
  RUN(BE_OP(be, dot_backward, bot[N_BOTTOM - 1].dact, demb, dinter, bot[N_BOTTOM - 1].act, emb, B, F, D));
  for (int l = N_BOTTOM - 1; l >= 0; l--) {
    RUN(BE_OP(be, relu_backward, bot[l].dact, bot[l].dact, bot[l].act, (size_t)B * bot[l].out));
    snprintf(g_tag, sizeof g_tag, "%d->%d", bot[l].in, bot[l].out);
    RUN(BE_OP(be, linear_backward, l ? bot[l - 1].dact : NULL, grads + bot[l].w, grads + bot[l].b, bot[l].dact,
              l ? bot[l - 1].act : dense, params + bot[l].w, B, bot[l].in, bot[l].out));
    *g_tag = 0;
  }
  dlrec_optim_config c;
  dlrec_optim_config_default(&c, DLREC_OPTIM_SGD);
  RUN(BE_OP(be, optim_step, &c, params, grads, NULL, n_params, 1));
  if (es)
    RUN(BE_OP(be, bag_backward_update, es->t, es->o, &es->bags, DLREC_POOLING_SUM, demb, es->scratch, es->scratch_bytes));
}

/* A table of card[c] rows for column c, initialized, its SGD, a batch of one
 * id a bag skewed toward each column's first rows (u^3), and the scratch. */
static void emb_open(emb_stage *es, const uint64_t *card, int B, dlrec_rng *rng) {
  uint64_t total = 0;
  for (int c = 0; c < F; c++) total += card[c];
  dlrec_row_range all = {.begin = 0, .end = total};
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  RUN(dlrec_table_create(&es->host, total, D));
  RUN(dlrec_table_init_uniform(es->host, &all, 1, 1));
  RUN(dlrec_sparse_optim_create(&es->host_o, es->host, &sc));
  es->t = es->host, es->o = es->host_o;
  if (!g_be->host_memory) {
    RUN(backend_table_mirror(g_be, es->host, &es->t));
    RUN(backend_sparse_optim_mirror(g_be, es->host_o, es->t, &es->o));
  }
  static uint32_t *offs[F], *ids[F];
  uint64_t first = 0; /* column c's first row */
  for (int c = 0; c < F; c++) {
    offs[c] = malloc(((size_t)B + 1) * sizeof(uint32_t));
    ids[c] = malloc((size_t)B * sizeof(uint32_t));
    if (!offs[c] || !ids[c]) exit(1);
    for (int b = 0; b <= B; b++) offs[c][b] = (uint32_t)b;
    for (int b = 0; b < B; b++) {
      const double u = dlrec_rng_uniform(rng);
      ids[c][b] = (uint32_t)(first + (uint64_t)(u * u * u * (double)card[c]));
    }
    first += card[c];
  }
  es->bags = (dlrec_bag_batch){(uint32_t)B, F, (const uint32_t *const *)offs, (const uint32_t *const *)ids, NULL};
  es->scratch_bytes = dlrec_bag_backward_scratch_bytes(es->host, (uint64_t)B * F);
  es->scratch = g_be->ops->alloc(g_be, es->scratch_bytes);
  if (!es->scratch) exit(1);
}

int main(int argc, char **argv) {
  const char *device = argc > 1 ? argv[1] : "cpu";
  dlrec_precision precision = DLREC_PRECISION_FP32;
  if (argc > 2 && dlrec_precision_parse(argv[2], &precision) != DLREC_OK) {
    fprintf(stderr, "bench_step: %s\n", dlrec_last_error());
    return 2;
  }
  const int B = argc > 3 ? atoi(argv[3]) : 4096, steps = argc > 4 ? atoi(argv[4]) : 10;
  const int tb = argc > 5 && !strcmp(argv[5], "1tb");
  const int profile = argc > 6 && !strcmp(argv[6], "profile");
  const long long rows = tb ? 1 : argc > 5 ? atoll(argv[5]) : 0;
  if (B < 2 || steps < 1 || rows < 0 || rows * F > (1ll << 32)) {
    fprintf(stderr, "usage: bench_step [device] [precision] [batch >= 2] [steps >= 1] [rows a column, 0: none; 1tb]\n");
    return 2;
  }
  dlrec_backend_config bc = {0, precision, 0};
  if (dlrec_backend_create_on(&g_be, device, &bc) != DLREC_OK) {
    fprintf(stderr, "bench_step: %s\n", dlrec_last_error());
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
  emb_stage es = {0};
  uint64_t card[F];
  const uint32_t *criteo_1tb = dlrec_synth_cardinality_preset("criteo-1tb"); /* F = DLREC_SYNTH_CAT columns */
  for (int c = 0; c < F; c++) card[c] = tb ? criteo_1tb[c] : (uint64_t)rows;
  if (rows) emb_open(&es, card, B, &rng);
  emb_stage *e = rows ? &es : NULL;
  step(bot, tp, params, grads, n_params, dense, emb, inter, dinter, demb, labels, loss, B, e); /* warm-up */
  RUN(g_be->ops->synchronize(g_be));
  g_profile = profile;
  const double t0 = dlrec_now();
  for (int s = 0; s < steps; s++) step(bot, tp, params, grads, n_params, dense, emb, inter, dinter, demb, labels, loss, B, e);
  g_profile = 0;
  RUN(g_be->ops->synchronize(g_be));
  const double secs = (dlrec_now() - t0) / steps;
  printf("%s, batch %d, %s: %.3f ms a step, %.0f samples/s, GEMMs %.1f TFLOP/s (%.2f MFLOP a sample)\n",
         dlrec_backend_describe(g_be), B, tb ? "with Criteo 1TB's table" : rows ? "with the table" : "dense part alone",
         secs * 1e3, B / secs,
         6.0 * macs * B / secs / 1e12, 6.0 * macs / 1e6);
  for (int i = 0; i < g_n_prof; i++)
    printf("  %-28s %8.3f ms a step (%4.1f%%), %ld calls\n", g_prof[i].name, g_prof[i].secs * 1e3 / steps,
           100.0 * g_prof[i].secs / steps / secs, g_prof[i].calls / steps);
  dlrec_backend_free(g_be); /* the process ends: the buffers go with it */
  return 0;
}
