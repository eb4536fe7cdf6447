/* DLRM: the whole model's analytic gradients (dense parameters and the pooled
 * embeddings) against central finite differences of the loss, on a tiny
 * shape with multi-hot bags; a training step lowering the loss; the named
 * tensors DLRM plans; scoring running the training forward; and the
 * backend, not the process, deciding a pass's threads. */
#include <omp.h>

#include "backend/backend.h"
#include "model/dlrm.h"
#include "core/rng.h"
#include "net_check.h"
#include "test.h"
#include "train/step.h"

static dlrec_dlrm_shape tiny_shape(void) {
  dlrec_dlrm_shape sh = {.emb_dim = 4, .n_bottom = 2, .bottom = {5, 4}, .n_top = 2, .top = {6, 1},
                         .pooling = DLREC_POOLING_SUM};
  return sh;
}

TEST(dlrm_gradients_match_finite_differences) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  dlrec_net_ws *ws;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_init(m, 5));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 1, 0);
  double loss;
  const float *grad, *d_emb;
  CHECK_OK(dlrec_net_gradients(m, ws, &tb.b, &loss, &grad, &d_emb));
  size_t n;
  float *p = dlrec_net_dense_params(m, &n);
  float *g = malloc(n * sizeof *g);
  memcpy(g, grad, n * sizeof *g);
  const float eps = 1e-3f;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    float keep = p[i];
    p[i] = keep + eps;
    double up = net_check_loss(m, ws, &tb.b);
    p[i] = keep - eps;
    double down = net_check_loss(m, ws, &tb.b);
    p[i] = keep;
    double fd = (up - down) / (2 * eps);
    if (fabs(fd - g[i]) > 5e-4 + 2e-2 * fabs(fd)) {
      if (bad++ < 5) fprintf(stderr, "param %zu: analytic %.6g, finite difference %.6g\n", i, g[i], fd);
    }
  }
  /* Embedding rows: dL/d(row r, k) = sum of d_emb[b][c][k] over the bags holding r. */
  float *dE = malloc(4 * 3 * 4 * sizeof *dE);
  CHECK_OK(dlrec_net_gradients(m, ws, &tb.b, &loss, &grad, &d_emb));
  memcpy(dE, d_emb, 4 * 3 * 4 * sizeof *dE);
  dlrec_table *t = dlrec_net_table(m);
  float *rows = dlrec_table_data(t);
  uint32_t stride = dlrec_table_stride(t);
  for (uint64_t r = 0; r < s.table_rows; r++) {
    for (int k = 0; k < 4; k++) {
      double want = 0;
      for (int c = 0; c < 3; c++)
        for (int b = 0; b < 4; b++)
          for (uint32_t j = tb.off[c][b]; j < tb.off[c][b + 1]; j++)
            if (tb.ids[c][j] == r) want += dE[(b * 3 + c) * 4 + k];
      float keep = rows[r * stride + (uint64_t)k];
      rows[r * stride + (uint64_t)k] = keep + eps;
      double up = net_check_loss(m, ws, &tb.b);
      rows[r * stride + (uint64_t)k] = keep - eps;
      double down = net_check_loss(m, ws, &tb.b);
      rows[r * stride + (uint64_t)k] = keep;
      double fd = (up - down) / (2 * eps);
      if (fabs(fd - want) > 5e-4 + 2e-2 * fabs(fd)) {
        if (bad++ < 10) fprintf(stderr, "row %llu[%d]: analytic %.6g, finite difference %.6g\n",
                                (unsigned long long)r, k, want, fd);
      }
    }
  }
  free(g);
  free(dE);
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
  CHECK_EQ(bad, 0);
}

TEST(dlrm_training_steps_lower_the_loss) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  dlrec_net_ws *ws;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_init(m, 9));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 2, 0);
  dlrec_net_optim opt = {0};
  dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_SGD);
  opt.dense.lr = 0.5f;
  size_t n;
  dlrec_net_dense_params(m, &n);
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  opt.sparse_lr = 0.5f;
  CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, dlrec_net_table(m), &sc));
  double first = 0, loss = 0;
  float prob[4];
  for (uint64_t step = 1; step <= 50; step++) {
    CHECK_OK(dlrec_train_step(m, ws, &opt, &tb.b, 1.0f, step, &loss, prob));
    if (step == 1) first = loss;
  }
  CHECK(loss < 0.5 * first); /* one batch memorized */
  float p2[4];
  dlrec_net_scorer *scorer;
  CHECK_OK(dlrec_net_scorer_create(&scorer, m));
  CHECK_OK(dlrec_net_predict(scorer, ws, &tb.b, p2));
  for (int i = 0; i < 4; i++) CHECK(fabsf(p2[i] - tb.labels[i]) < 0.5f);
  /* A batch with an id outside the table is refused, not a crash. */
  tb.ids[0][0] = (uint32_t)s.table_rows + 3;
  CHECK_ERR(dlrec_net_predict(scorer, ws, &tb.b, p2), DLREC_ERR_INVALID, "");
  dlrec_net_scorer_free(scorer);
  dlrec_sparse_optim_free(opt.sparse);
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
}

/* The backend, not the process, decides how many threads a pass runs on:
 * the same DLRM on a 1-thread and on a 2-thread backend both learn one
 * batch, and whatever team size the calling thread had before, a step or a
 * scorer on the 1-thread backend leaves it at 1 and one on the 2-thread
 * backend at 2. A scorer keeps the backend it was created with after its
 * network is given another, and scores the same bits on either (the packed
 * kernel is thread-count invariant). */
TEST(dlrm_threads_belong_to_the_backend) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_backend *be[2];
  for (int i = 0; i < 2; i++) {
    dlrec_backend_config c = {(uint32_t)i + 1, DLREC_PRECISION_FP32, 0};
    CHECK_OK(dlrec_backend_create(&be[i], "cpu", &c));
    CHECK_EQ(dlrec_backend_threads(be[i]), (uint32_t)i + 1);
  }
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 2, 0);
  dlrec_net *m[2];
  dlrec_net_ws *ws[2];
  dlrec_net_optim opt[2];
  memset(opt, 0, sizeof opt);
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  for (int i = 0; i < 2; i++) {
    CHECK_OK(dlrec_dlrm_create(&m[i], &sh, &s));
    CHECK(dlrec_net_backend(m[i]) == dlrec_backend_default());
    CHECK_OK(dlrec_net_set_backend(m[i], be[i]));
    CHECK(dlrec_net_backend(m[i]) == be[i]);
    CHECK_OK(dlrec_net_init(m[i], 9));
    CHECK_OK(dlrec_net_ws_create(&ws[i], m[i], 4));
    dlrec_optim_config_default(&opt[i].dense, DLREC_OPTIM_SGD);
    opt[i].dense.lr = 0.5f;
    opt[i].sparse_lr = 0.5f;
    CHECK_OK(dlrec_sparse_optim_create(&opt[i].sparse, dlrec_net_table(m[i]), &sc));
  }
  const int keep = omp_get_max_threads();
  double first[2] = {0, 0}, loss[2] = {0, 0};
  for (uint64_t step = 1; step <= 30; step++)
    for (int i = 0; i < 2; i++) {
      omp_set_num_threads(3); /* the process's setting, which the backend overrides */
      CHECK_OK(dlrec_train_step(m[i], ws[i], &opt[i], &tb.b, 1.0f, step, &loss[i], NULL));
      CHECK_EQ(omp_get_max_threads(), i + 1);
      if (step == 1) first[i] = loss[i];
    }
  for (int i = 0; i < 2; i++) CHECK(loss[i] < 0.5 * first[i]); /* both learned the batch */
  /* The same steps on other thread counts: equal up to float summation order. */
  CHECK_NEAR(loss[1], loss[0], 1e-6, 1e-4);
  float prob[3][4];
  dlrec_net_scorer *on1, *on2;
  CHECK_OK(dlrec_net_scorer_create(&on1, m[0]));
  CHECK_OK(dlrec_net_set_backend(m[0], be[1]));
  CHECK_OK(dlrec_net_scorer_create(&on2, m[0]));
  omp_set_num_threads(3);
  CHECK_OK(dlrec_net_predict(on1, ws[0], &tb.b, prob[0]));
  CHECK_EQ(omp_get_max_threads(), 1);
  CHECK_OK(dlrec_net_predict(on2, ws[0], &tb.b, prob[1]));
  CHECK_EQ(omp_get_max_threads(), 2);
  CHECK_OK(dlrec_net_predict(on1, ws[0], &tb.b, prob[2]));
  CHECK_EQ(omp_get_max_threads(), 1);
  CHECK(memcmp(prob[0], prob[1], sizeof prob[0]) == 0);
  CHECK(memcmp(prob[0], prob[2], sizeof prob[0]) == 0);
  CHECK_OK(dlrec_net_set_backend(m[0], NULL));
  CHECK(dlrec_net_backend(m[0]) == dlrec_backend_default());
  omp_set_num_threads(keep);
  dlrec_net_scorer_free(on1);
  dlrec_net_scorer_free(on2);
  for (int i = 0; i < 2; i++) {
    dlrec_sparse_optim_free(opt[i].sparse);
    dlrec_net_ws_free(ws[i]);
    dlrec_net_free(m[i]);
    dlrec_backend_free(be[i]);
  }
}

/* DLRM plans its dense parameters as named tensors, bottom then top, each
 * layer's weight (out, in) then bias (out), back to back in the flat array.
 * The tiny shape by hand: 3 dense -> 5 -> 4 (= D); the interaction has
 * D + F(F+1)/2 = 4 + 6 = 10 outputs -> 6 -> 1. */
TEST(dlrm_plans_named_tensors) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  static const struct {
    const char *name;
    uint32_t ndim, rows, cols;
  } want[] = {{"bottom.0.weight", 2, 5, 3}, {"bottom.0.bias", 1, 5, 0}, {"bottom.1.weight", 2, 4, 5},
              {"bottom.1.bias", 1, 4, 0},   {"top.0.weight", 2, 6, 10},  {"top.0.bias", 1, 6, 0},
              {"top.1.weight", 2, 1, 6},    {"top.1.bias", 1, 1, 0}};
  CHECK_EQ(dlrec_net_n_tensors(m), 8);
  const dlrec_net_tensor *t = dlrec_net_tensors(m);
  size_t off = 0;
  for (uint32_t i = 0; i < 8 && i < dlrec_net_n_tensors(m); i++) {
    CHECK_STR(t[i].name, want[i].name);
    CHECK_EQ(t[i].ndim, want[i].ndim);
    CHECK_EQ(t[i].shape[0], want[i].rows);
    if (want[i].ndim == 2) CHECK_EQ(t[i].shape[1], want[i].cols);
    CHECK_EQ(t[i].offset, off);
    CHECK_EQ(t[i].count, (size_t)want[i].rows * (want[i].cols ? want[i].cols : 1));
    off += t[i].count;
  }
  size_t n;
  dlrec_net_dense_params(m, &n);
  CHECK_EQ(n, off);
  CHECK_STR(dlrec_net_get_config(m)->type, "dlrm");
  dlrec_net_free(m);
}

/* Scoring runs the model's one forward with the packed batch-invariant
 * linear kernel under it: its probabilities are those of the training
 * forward (sgemm) up to float rounding, row by row, and bitwise the same
 * whether a row is scored alone or in a batch. */
TEST(dlrm_scoring_runs_the_training_forward) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  dlrec_net_ws *ws;
  dlrec_net_scorer *scorer;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_init(m, 11));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
  CHECK_OK(dlrec_net_scorer_create(&scorer, m));
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 3, 0);
  /* The training forward's probabilities: a step with a zero learning rate
   * leaves the parameters as they are. */
  dlrec_net_optim opt = {0};
  dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_SGD);
  opt.dense.lr = 0;
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
  CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, dlrec_net_table(m), &sc));
  double loss;
  float train_prob[4], score[4];
  CHECK_OK(dlrec_train_step(m, ws, &opt, &tb.b, 1.0f, 1, &loss, train_prob));
  CHECK_OK(dlrec_net_predict(scorer, ws, &tb.b, score));
  for (int i = 0; i < 4; i++) CHECK_NEAR(score[i], train_prob[i], 1e-6, 1e-5);
  /* Row 2 alone: the same bits as in the batch of 4. */
  net_check_batch one = tb;
  one.b.rows = 1;
  one.b.dense = tb.dense + 2 * 3;
  for (int c = 0; c < 3; c++) one.b.offsets[c] = &tb.off[c][2];
  one.b.labels = tb.labels + 2;
  float alone;
  CHECK_OK(dlrec_net_predict(scorer, ws, &one.b, &alone));
  CHECK(memcmp(&alone, &score[2], sizeof alone) == 0);
  dlrec_sparse_optim_free(opt.sparse);
  dlrec_net_scorer_free(scorer);
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
}

/* A server thread frees its workspace after a reload freed the network it
 * was made for: the workspace must not reach back into the network. (ASan
 * reports the use after free this once was.) */
TEST(workspace_outlives_its_network) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  dlrec_net_ws *ws;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
  dlrec_net_free(m);
  dlrec_net_ws_free(ws);
}

/* Model types are picked by name; an unknown one is refused naming the
 * known ones, every one of them in registry order; dlrm, the default, is
 * the first, and the first six keep their places. Each name is unique, has a one-line description, and gives a
 * config of its own type. */
TEST(model_type_registry) {
  dlrec_net_config c;
  CHECK_OK(dlrec_net_config_default(&c, "dlrm"));
  CHECK_STR(c.type, "dlrm");
  CHECK_EQ(dlrec_dlrm_shape_of(&c)->emb_dim, 16);
  CHECK_ERR(dlrec_net_config_default(&c, "gbdt"), DLREC_ERR_INVALID, "'gbdt' is not one of dlrm, lr, fm");
  CHECK_STR(dlrec_net_type_name(0), DLREC_DEFAULT_MODEL_TYPE);
  /* The types that were there first keep their places; new ones come after. */
  static const char *const first[] = {"dlrm", "lr", "fm", "wide_deep", "deepfm", "dcn_v2"};
  for (size_t i = 0; i < 6; i++) CHECK_STR(dlrec_net_type_name(i), first[i]);
  char known[512] = "";
  size_t n = 0;
  for (; dlrec_net_type_name(n); n++) {
    const char *name = dlrec_net_type_name(n);
    CHECK_OK(dlrec_net_config_default(&c, name));
    CHECK_STR(c.type, name);
    CHECK(dlrec_net_type_doc(n) && strlen(dlrec_net_type_doc(n)) > 10);
    for (size_t k = 0; k < n; k++) CHECK(strcmp(dlrec_net_type_name(k), name) != 0);
    snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", n ? ", " : "", name);
  }
  CHECK(n >= 6);
  CHECK(dlrec_net_type_name(n) == NULL && dlrec_net_type_doc(n) == NULL);
  CHECK(dlrec_net_type_test_config(n, 0, NULL) == NULL);
  CHECK_ERR(dlrec_net_config_default(&c, "gbdt"), DLREC_ERR_INVALID, known);
}

/* ---- DLRM on data with no dense column ------------------------------------ */

/* With no dense column there is no bottom MLP: the plan is the top MLP
 * alone, over the F(F-1)/2 = 3 pairs of the 3 embeddings (no x among them). */
TEST(dlrm_categorical_only_plans_no_bottom_mlp) {
  dlrec_schema s;
  net_check_schema(&s, 0);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_EQ(dlrec_net_n_tensors(m), 4);
  const dlrec_net_tensor *t = dlrec_net_tensors(m);
  CHECK_STR(t[0].name, "top.0.weight");
  CHECK_EQ(t[0].shape[0], 6);
  CHECK_EQ(t[0].shape[1], 3);
  CHECK_STR(t[3].name, "top.1.bias");
  dlrec_net_free(m);
  /* One categorical column and no dense one: nothing to interact. */
  s.n_sparse = 1;
  s.table_rows = s.sparse[0].id_end;
  CHECK_ERR(dlrec_dlrm_create(&m, &sh, &s), DLREC_ERR_INVALID, "at least two categorical columns");
}

/* Every gradient of the categorical-only DLRM (top MLP, every embedding row
 * the batch touches) against finite differences, with sum and mean pooling. */
TEST(dlrm_categorical_only_gradients_match_finite_differences) {
  for (int mean = 0; mean <= 1; mean++) {
    dlrec_schema s;
    net_check_schema(&s, 0);
    dlrec_dlrm_shape sh = tiny_shape();
    sh.pooling = mean ? DLREC_POOLING_MEAN : DLREC_POOLING_SUM;
    dlrec_net *m;
    dlrec_net_ws *ws;
    CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
    CHECK_OK(dlrec_net_init(m, 8));
    CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
    net_check_batch tb;
    net_check_make_batch(&tb, &s, 1, 0);
    tb.b.dense = NULL;
    CHECK_EQ(net_check_gradients(m, ws, &tb.b, mean), 0);
    dlrec_net_ws_free(ws);
    dlrec_net_free(m);
  }
}

/* The categorical-only DLRM scores a row alone and inside a batch to the
 * same bits, and its scores are the training forward's. */
TEST(dlrm_categorical_only_scoring_is_batch_invariant) {
  dlrec_schema s;
  net_check_schema(&s, 0);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_net *m;
  dlrec_net_ws *ws;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_init(m, 11));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
  net_check_batch tb;
  net_check_make_batch(&tb, &s, 3, 0);
  tb.b.dense = NULL;
  CHECK_EQ(net_check_batch_invariance(m, ws, &tb.b), 0);
  dlrec_net_free(m);
  dlrec_net_ws_free(ws);
}

/* End to end through the CLI on categorical-only data: synth's rows as a
 * CSV whose dense columns are ignored, etl fit/apply, training with
 * examples/dlrm_categorical.json (on 2 threads), eval. The categorical
 * columns carry much of synth's signal: the validation AUC must be clearly
 * above chance. Measured at this size: 0.645. */
#define CAT_ROWS 60000
#define MIN_AUC 0.60
TEST(dlrm_categorical_only_trains_end_to_end) {
  const char *bin = getenv("DLREC_BIN");
  char *out = NULL;
  /* test_path's buffers rotate; one directory string serves every path. */
  const char *d = test_tmpdir();
  int rc = test_run_cli(
      &out,
      "synth -q --rows %d --seed 3 --max-cardinality 500 --out '%s/cat.tsv' && "
      "{ printf 'label'; for i in $(seq 1 13); do printf ',I%%d' $i; done; for i in $(seq 1 26); do printf ',C%%d' $i; "
      "done; echo; tr '\\t' ',' < '%s/cat.tsv'; } > '%s/cat.csv' && "
      "'%s' etl fit -q --format csv --schema 'label=label;ignore=I1..I13;cat=*' --input '%s/cat.csv' "
      "--out '%s/etl' --min-count 2 && "
      "'%s' etl apply -q --etl '%s/etl' --input '%s/cat.csv' --out '%s/train.dlr' --valid-fraction 0.2 "
      "--valid-out '%s/valid.dlr' --seed 1 && "
      "sed 's/\"threads\": *[0-9]*/\"threads\": 2/' '%s' > '%s/cat.json' && "
      "'%s' train -q --config '%s/cat.json' --train '%s/train.dlr' --etl '%s/etl' --out '%s/run' && "
      "'%s' eval --model '%s/run' --data '%s/valid.dlr'",
      CAT_ROWS, d, d, d, bin, d, d, bin, d, d, d, d, test_source_path("examples/dlrm_categorical.json"), d, bin, d,
      d, d, d, bin, d, d);
  if (rc != 0) fprintf(stderr, "categorical-only pipeline -> %d: %s\n", rc, out ? out : "");
  CHECK_EQ(rc, 0);
  const char *a = out ? strstr(out, "\"auc\":") : NULL;
  CHECK(a != NULL);
  double auc = a ? strtod(a + 6, NULL) : 0;
  fprintf(stderr, "categorical-only DLRM: validation AUC %.4f\n", auc);
  CHECK(auc > MIN_AUC);
  free(out);
}

/* ---- the concat interaction ------------------------------------------------ */

/* "cat": the top MLP reads [x, e_1 .. e_F] (D + F·D = 16 wide on the tiny
 * schema), or the embeddings alone (F·D = 12) on data with no dense column,
 * where even one categorical column is enough. */
TEST(dlrm_cat_interaction_plans_top_mlp_input) {
  dlrec_dlrm_shape sh = tiny_shape();
  sh.interaction = DLREC_DLRM_CAT;
  for (int no_dense = 0; no_dense <= 1; no_dense++) {
    dlrec_schema s;
    if (no_dense) net_check_schema(&s, 0);
    else net_check_schema(&s, 3);
    dlrec_net *m;
    CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
    const dlrec_net_tensor *t = dlrec_net_tensors(m);
    uint32_t top0 = no_dense ? 0 : 4; /* after bottom.0 and bottom.1's weight and bias */
    CHECK_EQ(dlrec_net_n_tensors(m), top0 + 4);
    CHECK_STR(t[top0].name, "top.0.weight");
    CHECK_EQ(t[top0].shape[1], no_dense ? 12 : 16);
    dlrec_net_free(m);
  }
  dlrec_schema s;
  net_check_schema(&s, 0);
  s.n_sparse = 1;
  s.table_rows = s.sparse[0].id_end;
  dlrec_net *m;
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  dlrec_net_free(m);
}

/* model.interaction reads "dot" or "cat", names the field otherwise, and a
 * config written to JSON reads back the same. */
TEST(dlrm_interaction_config) {
  dlrec_net_config c;
  CHECK_OK(dlrec_net_config_default(&c, "dlrm"));
  CHECK_EQ(dlrec_dlrm_shape_of(&c)->interaction, DLREC_DLRM_DOT);
  cJSON *o = cJSON_Parse("{\"interaction\": \"max\"}");
  CHECK_ERR(dlrec_net_config_parse(&c, o, "cfg.json: model"), DLREC_ERR_INVALID,
            "cfg.json: model: field 'interaction': 'max' is not one of dot, cat");
  cJSON_Delete(o);
  o = cJSON_Parse("{\"interaction\": \"cat\"}");
  CHECK_OK(dlrec_net_config_parse(&c, o, "model"));
  cJSON_Delete(o);
  CHECK_EQ(dlrec_dlrm_shape_of(&c)->interaction, DLREC_DLRM_CAT);
  CHECK(net_check_config_round_trip(&c, "dlrm"));
}

/* Every gradient of DLRM with the concat interaction against finite
 * differences, and its scores batch-invariant, with and without dense
 * columns. */
TEST(dlrm_cat_interaction_gradients_and_batch_invariance) {
  for (int no_dense = 0; no_dense <= 1; no_dense++) {
    dlrec_schema s;
    if (no_dense) net_check_schema(&s, 0);
    else net_check_schema(&s, 3);
    dlrec_dlrm_shape sh = tiny_shape();
    sh.interaction = DLREC_DLRM_CAT;
    dlrec_net *m;
    dlrec_net_ws *ws;
    CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
    CHECK_OK(dlrec_net_init(m, 7));
    CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
    net_check_batch tb;
    net_check_make_batch(&tb, &s, 1, 0);
    if (no_dense) tb.b.dense = NULL;
    int bad = net_check_gradients(m, ws, &tb.b, 0);
    if (bad) fprintf(stderr, "%s dense columns\n", no_dense ? "without" : "with");
    CHECK_EQ(bad, 0);
    CHECK_EQ(net_check_batch_invariance(m, ws, &tb.b), 0);
    dlrec_net_ws_free(ws);
    dlrec_net_free(m);
  }
}

/* The top MLP's dropout and batch normalization (BARS's DLRM protocol):
 * off by default and then left out of the config's JSON (which a config
 * without them writes as before they existed); read back when set, errors
 * naming the field; with batch normalization each hidden top layer gets
 * its bn tensors after its Linear's and the running statistics come last;
 * dropout draws its masks in training.
 * (Their gradients, batch invariance and training across backends are the
 * registry's test configs: test_models.) */
TEST(dlrm_top_mlp_dropout_and_batch_norm) {
  dlrec_net_config c;
  CHECK_OK(dlrec_net_config_default(&c, "dlrm"));
  cJSON *o = cJSON_CreateObject();
  dlrec_net_config_to_json(&c, o);
  CHECK(!cJSON_GetObjectItem(o, "top_mlp_dropout") && !cJSON_GetObjectItem(o, "top_mlp_batch_norm"));
  cJSON_Delete(o);
  o = cJSON_Parse("{\"top_mlp_dropout\": 1}");
  CHECK_ERR(dlrec_net_config_parse(&c, o, "cfg.json: model"), DLREC_ERR_INVALID,
            "cfg.json: model: field 'top_mlp_dropout': 1 is out of range [0, 1)");
  cJSON_Delete(o);
  o = cJSON_Parse("{\"top_mlp_batch_norm\": 1}");
  CHECK_ERR(dlrec_net_config_parse(&c, o, "cfg.json: model"), DLREC_ERR_INVALID, "top_mlp_batch_norm");
  cJSON_Delete(o);
  o = cJSON_Parse("{\"embedding_dim\": 4, \"bottom_mlp\": [5, 4], \"top_mlp\": [6, 3, 1], "
                  "\"top_mlp_dropout\": 0.5, \"top_mlp_batch_norm\": true}");
  CHECK_OK(dlrec_net_config_parse(&c, o, "model"));
  cJSON_Delete(o);
  CHECK(dlrec_dlrm_shape_of(&c)->top_dropout == 0.5f && dlrec_dlrm_shape_of(&c)->top_batch_norm);
  CHECK(net_check_config_round_trip(&c, "lr"));
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_net *m;
  CHECK_OK(dlrec_net_create(&m, &c, &s));
  static const char *const names[] = {"bottom.0.weight",      "bottom.0.bias",       "bottom.1.weight",
                                      "bottom.1.bias",        "top.0.weight",        "top.0.bias",
                                      "top.0.bn.weight",      "top.0.bn.bias",       "top.1.weight",
                                      "top.1.bias",           "top.1.bn.weight",     "top.1.bn.bias",
                                      "top.2.weight",         "top.2.bias",          "top.0.bn.running_mean",
                                      "top.0.bn.running_var", "top.1.bn.running_mean", "top.1.bn.running_var"};
  CHECK_EQ(dlrec_net_n_tensors(m), 18);
  for (uint32_t i = 0; i < 18 && i < dlrec_net_n_tensors(m); i++) CHECK_STR(dlrec_net_tensors(m)[i].name, names[i]);
  dlrec_net_free(m);
  /* Dropout acts in training: two training forwards of one batch at steps
   * 1 and 2 (a learning rate of 0, so nothing moves) differ by their masks,
   * and agree without dropout. */
  for (int drop = 0; drop <= 1; drop++) {
    dlrec_dlrm_shape sh = *dlrec_dlrm_shape_of(&c);
    sh.top_dropout = drop ? 0.5f : 0.0f;
    dlrec_net_ws *ws;
    CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
    CHECK_OK(dlrec_net_init(m, 3));
    CHECK_OK(dlrec_net_ws_create(&ws, m, 4));
    dlrec_net_optim opt = {0};
    dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_SGD);
    opt.dense.lr = 0;
    dlrec_sparse_optim_config sc;
    dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_SGD);
    CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, dlrec_net_table(m), &sc));
    net_check_batch tb;
    net_check_make_batch(&tb, &s, 2, 0);
    double loss;
    float prob[2][4];
    for (int k = 0; k < 2; k++) CHECK_OK(dlrec_train_step(m, ws, &opt, &tb.b, 1.0f, (uint64_t)k + 1, &loss, prob[k]));
    CHECK((memcmp(prob[0], prob[1], sizeof prob[0]) != 0) == drop);
    dlrec_sparse_optim_free(opt.sparse);
    dlrec_net_ws_free(ws);
    dlrec_net_free(m);
  }
}

/* A batch of B rows of net_check_schema's 3 columns (the middle one
 * multi-hot, 0 to 3 ids), labels and dense values from seed. */
typedef struct big_batch {
  dlrec_batch b;
  float labels[128], dense[128 * 3];
  uint32_t off[3][129], ids[3][128 * 3];
} big_batch;

static void make_big_batch(big_batch *t, const dlrec_schema *s, uint32_t B, uint64_t seed) {
  memset(t, 0, sizeof *t);
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, 0);
  t->b.rows = B;
  for (uint32_t i = 0; i < B; i++) t->labels[i] = dlrec_rng_uniform(&r) < 0.4 ? 1.0f : 0.0f;
  for (uint32_t i = 0; i < B * s->n_dense; i++) t->dense[i] = (float)dlrec_rng_uniform(&r);
  for (int c = 0; c < 3; c++) {
    uint32_t n = 0, span = (uint32_t)(s->sparse[c].id_end - s->sparse[c].id_begin);
    for (uint32_t i = 0; i < B; i++) {
      t->off[c][i] = n;
      uint32_t k = c == 1 ? dlrec_rng_below(&r, 4) : 1;
      for (uint32_t j = 0; j < k; j++) t->ids[c][n++] = (uint32_t)s->sparse[c].id_begin + dlrec_rng_below(&r, span);
    }
    t->off[c][B] = n;
    t->b.offsets[c] = t->off[c];
    t->b.ids[c] = t->ids[c];
  }
  t->b.labels = t->labels;
  t->b.dense = t->dense;
}

/* Trains the tiny DLRM for 6 steps on batch b with a `threads`-thread
 * backend; its dense parameters and table land in params and table, the
 * losses in loss, the ways the last step split in *split. With nested set,
 * the steps run inside an enclosing parallel region, where OpenMP gives the
 * step's own region a team of one: every way then runs on one thread. */
static void train_tiny(uint32_t threads, const dlrec_batch *b, int nested, float *params, float *table,
                       double *loss, uint32_t *split) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  dlrec_dlrm_shape sh = tiny_shape();
  dlrec_backend_config bc = {threads, DLREC_PRECISION_FP32, 0};
  dlrec_backend *be;
  dlrec_net *m;
  dlrec_net_ws *ws;
  CHECK_OK(dlrec_backend_create(&be, "cpu", &bc));
  CHECK_OK(dlrec_dlrm_create(&m, &sh, &s));
  CHECK_OK(dlrec_net_set_backend(m, be));
  CHECK_OK(dlrec_net_init(m, 5));
  CHECK_OK(dlrec_net_ws_create(&ws, m, 128));
  dlrec_net_optim opt;
  memset(&opt, 0, sizeof opt);
  dlrec_optim_config_default(&opt.dense, DLREC_OPTIM_ADAM);
  opt.dense.lr = 0.01f;
  opt.sparse_lr = 0.1f;
  dlrec_sparse_optim_config sc;
  dlrec_sparse_optim_config_default(&sc, DLREC_SPARSE_ROWWISE_ADAGRAD);
  CHECK_OK(dlrec_sparse_optim_create(&opt.sparse, dlrec_net_table(m), &sc));
  size_t n_params = 0;
  dlrec_net_dense_params_const(m, &n_params);
  CHECK(n_params <= 256 && s.table_rows * sh.emb_dim <= 64); /* what the caller's arrays hold */
  opt.dense_state = calloc(dlrec_optim_state_floats(&opt.dense, n_params), sizeof(float));
  CHECK_OK(dlrec_optim_state_init(&opt.dense, opt.dense_state, n_params));
  for (uint64_t step = 1; step <= 6; step++) {
    dlrec_status st = DLREC_OK;
    if (nested) {
#pragma omp parallel num_threads(2)
#pragma omp single
      st = dlrec_train_step(m, ws, &opt, b, 1.0f, step, &loss[step - 1], NULL);
    } else {
      st = dlrec_train_step(m, ws, &opt, b, 1.0f, step, &loss[step - 1], NULL);
    }
    CHECK_OK(st);
  }
  *split = dlrec_net_ws_split(ws);
  memcpy(params, dlrec_net_dense_params_const(m, &n_params), n_params * sizeof(float));
  const dlrec_table *t = dlrec_net_table_const(m);
  for (uint64_t r = 0; r < s.table_rows; r++) dlrec_table_get_row(t, r, table + r * sh.emb_dim);
  free(opt.dense_state);
  dlrec_sparse_optim_free(opt.sparse);
  dlrec_net_ws_free(ws);
  dlrec_net_free(m);
  dlrec_backend_free(be);
}

/* A training step split across threads (dlrec_net_ws_split) computes the
 * whole batch's step: the same losses, dense parameters (Adam) and
 * embedding rows (row-wise Adagrad) as one thread, up to float summation order, for
 * an even and an uneven split; bitwise the same run to run; and bitwise the
 * same when OpenMP gives it fewer threads than ways. Batches too small to
 * give each way 32 rows run whole. */
TEST(split_training_step_matches_the_whole_batch) {
  dlrec_schema s;
  net_check_schema(&s, 3);
  enum { NP = 256, NT = 16 * 4 };
  static big_batch bb;
  make_big_batch(&bb, &s, 100, 3);
  float p[5][NP] = {{0}}, tab[5][NT] = {{0}};
  double loss[5][6];
  uint32_t split[5];
  train_tiny(1, &bb.b, 0, p[0], tab[0], loss[0], &split[0]);
  train_tiny(2, &bb.b, 0, p[1], tab[1], loss[1], &split[1]);
  train_tiny(3, &bb.b, 0, p[2], tab[2], loss[2], &split[2]); /* 33, 33 and 34 rows */
  train_tiny(2, &bb.b, 0, p[3], tab[3], loss[3], &split[3]);
  train_tiny(2, &bb.b, 1, p[4], tab[4], loss[4], &split[4]);
  CHECK_EQ(split[0], 1u);
  CHECK_EQ(split[1], 2u);
  CHECK_EQ(split[2], 3u);
  CHECK_EQ(split[4], 2u);
  CHECK(loss[0][5] < loss[0][0]); /* it learned */
  for (int k = 1; k <= 2; k++) {
    for (int i = 0; i < 6; i++) CHECK_NEAR(loss[k][i], loss[0][i], 1e-7, 1e-5);
    for (int i = 0; i < NP; i++) CHECK_NEAR(p[k][i], p[0][i], 1e-6, 1e-4);
    for (int i = 0; i < NT; i++) CHECK_NEAR(tab[k][i], tab[0][i], 1e-6, 1e-4);
  }
  CHECK(memcmp(p[1], p[3], sizeof p[1]) == 0 && memcmp(tab[1], tab[3], sizeof tab[1]) == 0);
  CHECK(memcmp(p[1], p[4], sizeof p[1]) == 0 && memcmp(tab[1], tab[4], sizeof tab[1]) == 0);
  /* 63 rows cannot give 2 ways 32 each: the step runs whole. */
  make_big_batch(&bb, &s, 63, 4);
  train_tiny(2, &bb.b, 0, p[0], tab[0], loss[0], &split[0]);
  CHECK_EQ(split[0], 1u);
}
