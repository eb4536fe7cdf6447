/* The training config: defaults, the example file, strict errors that name
 * the field, the JSON round trip, and the learning-rate schedule. */
#include <dirent.h>
#include <math.h>

#include "model/dlrm.h"
#include "core/fsutil.h"
#include "core/json.h"
#include "train/train_config.h"
#include "test.h"

static dlrec_status parse(const char *text, dlrec_train_config *c) {
  cJSON *j;
  dlrec_status s = dlrec_json_parse(text, strlen(text), "cfg.json", &j);
  if (s != DLREC_OK) return s;
  s = dlrec_train_config_from_json(j, "cfg.json", c);
  cJSON_Delete(j);
  return s;
}

TEST(example_config_is_the_kaggle_dlrm) {
  dlrec_train_config c;
  CHECK_OK(dlrec_train_config_read(test_source_path("examples/dlrm_criteo.json"), &c));
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->emb_dim, 16);
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->n_bottom, 4);
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->bottom[0], 512);
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->bottom[3], 16);
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->n_top, 3);
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->top[2], 1);
  CHECK_EQ(c.batch_size, 128);
  CHECK_EQ(c.dense.kind, DLREC_OPTIM_SGD);
  CHECK_NEAR(c.sparse.lr, 0.1, 1e-7, 0);
  CHECK_STR(c.name, "dlrm");
}

/* Every config in examples/ reads. */
TEST(every_example_config_reads) {
  char dir[2048];
  snprintf(dir, sizeof dir, "%s", test_source_path("examples"));
  DIR *d = opendir(dir);
  CHECK(d != NULL);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    size_t len = strlen(e->d_name);
    if (len < 6 || strcmp(e->d_name + len - 5, ".json")) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    dlrec_train_config c;
    if (dlrec_train_config_read(path, &c) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "%s: %s", e->d_name, dlrec_last_error());
    n++;
  }
  if (d) closedir(d);
  CHECK(n >= 8);
}

/* The FuxiCTR/BARS protocol the issue names, as a config: embedding dim 10,
 * Adam at 1e-3, batch 4096, L2 on the embeddings, dropout, batch norm,
 * validation AUC after every epoch, lr x0.1 on a plateau, early stopping
 * and the best checkpoint restored. */
TEST(fuxictr_example_is_the_recipe) {
  dlrec_train_config c;
  CHECK_OK(dlrec_train_config_read(test_source_path("examples/fuxictr_deepfm.json"), &c));
  CHECK_STR(c.model.type, "deepfm");
  cJSON *m = cJSON_CreateObject();
  dlrec_net_config_to_json(&c.model, m);
  CHECK_EQ(cJSON_GetObjectItem(m, "embedding_dim")->valuedouble, 10);
  CHECK(cJSON_GetObjectItem(m, "dropout")->valuedouble > 0);
  CHECK(cJSON_IsTrue(cJSON_GetObjectItem(m, "batch_norm")));
  cJSON_Delete(m);
  CHECK_EQ(c.dense.kind, DLREC_OPTIM_ADAM);
  CHECK_NEAR(c.dense.lr, 1e-3, 1e-9, 0);
  CHECK_EQ(c.sparse.kind, DLREC_SPARSE_ADAM);
  CHECK_EQ(c.sparse.l2_scope, DLREC_SPARSE_L2_TABLE);
  CHECK_NEAR(c.sparse.lr, 1e-3, 1e-9, 0);
  CHECK(c.sparse.weight_decay > 0);
  CHECK_EQ(c.model.embedding_init.all.kind, DLREC_INIT_NORMAL);
  CHECK(c.model.embedding_init.all.scale == 1e-4f);
  CHECK_EQ(c.model.bias_init, DLREC_BIAS_INIT_ZEROS);
  CHECK_EQ(c.batch_size, 4096);
  CHECK(c.eval_every_epoch && c.eval_metric == DLREC_VALID_AUC);
  CHECK_NEAR(c.plateau_factor, 0.1, 1e-9, 0);
  CHECK(c.early_stop_patience > 0 && c.keep_best && c.restore_best);
}

TEST(config_overrides_and_kind_defaults) {
  dlrec_train_config c;
  CHECK_OK(parse("{\"optimizer\": {\"dense\": {\"type\": \"adam\", \"lr\": 0.001},"
                 " \"sparse\": {\"type\": \"rowwise_adagrad\", \"lr\": 0.05}},"
                 " \"training\": {\"batch_size\": 2048, \"deterministic\": true}, \"name\": \"ctr-v2\"}",
                 &c));
  CHECK_EQ(c.dense.kind, DLREC_OPTIM_ADAM);
  CHECK_NEAR(c.dense.lr, 0.001, 1e-9, 0);
  CHECK_NEAR(c.dense.beta2, 0.999, 1e-7, 0);
  CHECK_EQ(c.sparse.kind, DLREC_SPARSE_ROWWISE_ADAGRAD);
  CHECK_EQ(c.batch_size, 2048);
  CHECK(c.deterministic);
  CHECK_STR(c.name, "ctr-v2");
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->emb_dim, 16); /* untouched sections keep the defaults */
}

TEST(config_errors_name_the_field) {
  dlrec_train_config c;
  CHECK_ERR(parse("{\"trainig\": {}}", &c), DLREC_ERR_INVALID, "unknown field 'trainig'");
  CHECK_ERR(parse("{\"training\": {\"batch_size\": 0}}", &c), DLREC_ERR_INVALID, "cfg.json: training: field 'batch_size'");
  CHECK_ERR(parse("{\"training\": {\"batch_size\": \"big\"}}", &c), DLREC_ERR_INVALID, "batch_size");
  CHECK_ERR(parse("{\"optimizer\": {\"dense\": {\"type\": \"lamb\"}}}", &c), DLREC_ERR_INVALID,
            "optimizer.dense: field 'type': 'lamb' is not one of sgd, adam, adagrad");
  CHECK_ERR(parse("{\"model\": {\"embedding_dim\": 8}}", &c), DLREC_ERR_INVALID, "bottom_mlp must end with embedding_dim (8)");
  CHECK_ERR(parse("{\"model\": {\"top_mlp\": [64, 2]}}", &c), DLREC_ERR_INVALID, "top_mlp must end with 1");
  CHECK_ERR(parse("{\"model\": {\"bottom_mlp\": [512, -3, 16]}}", &c), DLREC_ERR_INVALID, "bottom_mlp[1]");
  CHECK_ERR(parse("{\"name\": \"a/b\"}", &c), DLREC_ERR_INVALID, "field 'name'");
  CHECK_ERR(parse("{\"optimizer\": {\"dense\": {\"lr\": -1}}}", &c), DLREC_ERR_INVALID, "out of range");
  CHECK_ERR(parse("[1, 2]", &c), DLREC_ERR_INVALID, "expected a JSON object");
  CHECK_ERR(parse("{\"a\": ", &c), DLREC_ERR_PARSE, "cfg.json:1:");
}

TEST(config_json_round_trip) {
  dlrec_train_config a, b;
  CHECK_OK(parse("{\"optimizer\": {\"dense\": {\"type\": \"adagrad\", \"lr\": 0.02}, \"sparse\": {\"type\": \"lazy_adam\"}},"
                 " \"schedule\": {\"warmup_steps\": 100, \"decay_start_step\": 500, \"decay_steps\": 1000},"
                 " \"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [32, 8], \"top_mlp\": [16, 1], \"pooling\": \"mean\"},"
                 " \"eval\": {\"interval_steps\": 50}, \"loader\": {\"slice_rows\": 1}}",
                 &a));
  cJSON *j = dlrec_train_config_to_json(&a);
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON_Delete(j);
  CHECK(memcmp(&a.model, &b.model, sizeof a.model) == 0);
  CHECK(memcmp(&a.dense, &b.dense, sizeof a.dense) == 0);
  CHECK(memcmp(&a.sparse, &b.sparse, sizeof a.sparse) == 0);
  CHECK_EQ(b.warmup_steps, 100);
  CHECK_EQ(b.decay_steps, 1000);
  CHECK_EQ(b.eval_interval_steps, 50);
  CHECK_EQ(b.slice_rows, 1);
  CHECK_EQ(dlrec_dlrm_shape_of(&b.model)->pooling, DLREC_POOLING_MEAN);
}

TEST(lr_schedule) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  CHECK_NEAR(dlrec_lr_scale(&c, 1), 1.0, 0, 0);
  c.warmup_steps = 10;
  c.decay_start_step = 20;
  c.decay_steps = 10;
  c.decay_power = 2;
  c.min_lr_scale = 0.01;
  CHECK_NEAR(dlrec_lr_scale(&c, 1), 0.1, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 5), 0.5, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 10), 1.0, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 15), 1.0, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 20), 1.0, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 25), 0.25, 1e-12, 0); /* (1 - 5/10)^2 */
  CHECK_NEAR(dlrec_lr_scale(&c, 29), 0.01, 1e-12, 0); /* (0.1)^2 = 0.01 */
  CHECK_NEAR(dlrec_lr_scale(&c, 1000), 0.01, 1e-12, 0);
}

/* cJSON keeps both members of a repeated key; the first would win silently. */
TEST(config_duplicate_keys_are_refused) {
  dlrec_train_config c;
  CHECK_ERR(parse("{\"training\": {\"batch_size\": 128, \"batch_size\": 0}}", &c), DLREC_ERR_INVALID,
            "cfg.json: training: field 'batch_size' given twice");
  CHECK_ERR(parse("{\"training\": {\"epochs\": 2}, \"training\": {\"epochs\": 3}}", &c), DLREC_ERR_INVALID,
            "cfg.json: field 'training' given twice");
  CHECK_ERR(parse("{\"optimizer\": {\"dense\": {\"lr\": 0.1, \"type\": \"sgd\", \"lr\": 0.2}}}", &c), DLREC_ERR_INVALID,
            "optimizer.dense: field 'lr' given twice");
  CHECK_OK(parse("{\"training\": {\"batch_size\": 64}, \"eval\": {\"batch_size\": 64}}", &c)); /* one per object */
}

/* The floor holds inside the decay too, where (1 - t)^power falls below it
 * before t reaches 1: (1 - 0.8)^2 = 0.04 < 0.05. */
TEST(lr_schedule_floor_inside_the_decay) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  c.decay_start_step = 20;
  c.decay_steps = 10;
  c.decay_power = 2;
  c.min_lr_scale = 0.05;
  CHECK_NEAR(dlrec_lr_scale(&c, 27), 0.09, 1e-12, 0); /* (1 - 0.7)^2 */
  CHECK_NEAR(dlrec_lr_scale(&c, 28), 0.05, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 29), 0.05, 1e-12, 0);
  CHECK_NEAR(dlrec_lr_scale(&c, 30), 0.05, 1e-12, 0);
}

/* model.type picks the model type, which reads the rest of the section; a
 * config without it trains DLRM, and an unknown type is refused naming the
 * field and the known types. */
TEST(config_model_type) {
  dlrec_train_config c;
  CHECK_OK(parse("{\"model\": {\"embedding_dim\": 8, \"bottom_mlp\": [8], \"top_mlp\": [1]}}", &c));
  CHECK_STR(c.model.type, "dlrm");
  CHECK_OK(parse("{\"model\": {\"type\": \"dlrm\", \"embedding_dim\": 8, \"bottom_mlp\": [8], \"top_mlp\": [1]}}", &c));
  CHECK_STR(c.model.type, "dlrm");
  CHECK_EQ(dlrec_dlrm_shape_of(&c.model)->n_bottom, 1);
  CHECK_ERR(parse("{\"model\": {\"type\": \"wide\"}}", &c), DLREC_ERR_INVALID,
            "cfg.json: model: field 'type': 'wide' is not one of dlrm");
  CHECK_ERR(parse("{\"model\": {\"type\": 3}}", &c), DLREC_ERR_INVALID, "type");
  /* The type's own keys: a key DLRM does not know is refused. */
  CHECK_ERR(parse("{\"model\": {\"cross_layers\": 3}}", &c), DLREC_ERR_INVALID, "unknown field 'cross_layers'");
  cJSON *j = dlrec_train_config_to_json(&c);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "type");
  CHECK(cJSON_IsString(type) && !strcmp(type->valuestring, "dlrm"));
  cJSON_Delete(j);
}

/* An MLP layer of width 0 would build a layer with no outputs; the config
 * refuses it naming the layer, at both ends of the width check. */
TEST(config_mlp_width_zero_is_refused) {
  dlrec_train_config c;
  CHECK_ERR(parse("{\"model\": {\"bottom_mlp\": [512, 0, 16]}}", &c), DLREC_ERR_INVALID,
            "field 'bottom_mlp[1]': expected a width in [1, 65536]");
  CHECK_ERR(parse("{\"model\": {\"top_mlp\": [0, 1]}}", &c), DLREC_ERR_INVALID,
            "field 'top_mlp[0]': expected a width in [1, 65536]");
  CHECK_OK(parse("{\"model\": {\"embedding_dim\": 1, \"bottom_mlp\": [1], \"top_mlp\": [1]}}", &c));
}

/* The validation keys: absent, everything is off (today's behaviour);
 * given, they are read, checked, and survive the JSON round trip that a
 * checkpoint's config.json makes. */
TEST(config_validation_keys) {
  dlrec_train_config c, b;
  CHECK_OK(parse("{}", &c));
  CHECK_EQ(c.eval_every_epoch, 0);
  CHECK_EQ(c.early_stop_patience, 0);
  CHECK_NEAR(c.plateau_factor, 1.0, 0, 0);
  CHECK_EQ(c.keep_best, 0);
  CHECK_EQ(c.restore_best, 0);
  CHECK_NEAR(c.clip_grad_norm, 0.0, 0, 0);
  CHECK_EQ(c.eval_metric, DLREC_VALID_AUC);
  CHECK_OK(parse("{\"eval\": {\"every_epoch\": true, \"metric\": \"logloss\"},"
                 " \"training\": {\"early_stopping_patience\": 2, \"early_stopping_min_delta\": 0.0005,"
                 " \"restore_best\": true},"
                 " \"schedule\": {\"plateau_factor\": 0.1, \"plateau_patience\": 1, \"plateau_cooldown\": 2,"
                 " \"plateau_min_delta\": 0.0001, \"plateau_min_scale\": 0.001},"
                 " \"checkpoint\": {\"keep_best\": true}, \"optimizer\": {\"clip_grad_norm\": 10,"
                 " \"sparse\": {\"type\": \"lazy_adam\", \"weight_decay\": 0.01}}}",
                 &c));
  cJSON *j = dlrec_train_config_to_json(&c);
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON_Delete(j);
  const dlrec_train_config *x[] = {&c, &b};
  for (int i = 0; i < 2; i++) {
    CHECK_EQ(x[i]->eval_every_epoch, 1);
    CHECK_EQ(x[i]->eval_metric, DLREC_VALID_LOGLOSS);
    CHECK_EQ(x[i]->early_stop_patience, 2);
    CHECK_NEAR(x[i]->early_stop_min_delta, 0.0005, 0, 0);
    CHECK_EQ(x[i]->restore_best, 1);
    CHECK_NEAR(x[i]->plateau_factor, 0.1, 0, 0);
    CHECK_EQ(x[i]->plateau_patience, 1);
    CHECK_EQ(x[i]->plateau_cooldown, 2);
    CHECK_NEAR(x[i]->plateau_min_delta, 0.0001, 0, 0);
    CHECK_NEAR(x[i]->plateau_min_scale, 0.001, 0, 0);
    CHECK_EQ(x[i]->keep_best, 1);
    CHECK_NEAR(x[i]->clip_grad_norm, 10.0, 0, 0);
    CHECK_NEAR(x[i]->sparse.weight_decay, 0.01, 1e-9, 0);
  }
}

/* Settings that could never act are refused, naming the field. */
TEST(config_validation_keys_errors) {
  dlrec_train_config c;
  CHECK_ERR(parse("{\"training\": {\"early_stopping_patience\": 2}}", &c), DLREC_ERR_INVALID,
            "field 'training.early_stopping_patience' acts on validations: set eval.every_epoch or eval.interval_steps");
  CHECK_ERR(parse("{\"schedule\": {\"plateau_factor\": 0.5}}", &c), DLREC_ERR_INVALID, "'schedule.plateau_factor'");
  CHECK_ERR(parse("{\"checkpoint\": {\"keep_best\": true}}", &c), DLREC_ERR_INVALID, "'checkpoint.keep_best'");
  CHECK_ERR(parse("{\"eval\": {\"every_epoch\": true}, \"training\": {\"restore_best\": true}}", &c), DLREC_ERR_INVALID,
            "'training.restore_best' needs checkpoint.keep_best");
  CHECK_ERR(parse("{\"eval\": {\"metric\": \"ne\"}}", &c), DLREC_ERR_INVALID,
            "cfg.json: eval: field 'metric': 'ne' is not one of auc, logloss");
  CHECK_ERR(parse("{\"eval\": {\"interval_steps\": 5}, \"schedule\": {\"plateau_factor\": 0}}", &c), DLREC_ERR_INVALID,
            "schedule: field 'plateau_factor'");
  CHECK_ERR(parse("{\"eval\": {\"interval_steps\": 5}, \"schedule\": {\"plateau_factor\": 1.5}}", &c),
            DLREC_ERR_INVALID, "schedule: field 'plateau_factor'");
  CHECK_ERR(parse("{\"optimizer\": {\"clip_grad_norm\": -1}}", &c), DLREC_ERR_INVALID,
            "optimizer: field 'clip_grad_norm'");
  CHECK_ERR(parse("{\"eval\": {\"every_epoch\": 1}}", &c), DLREC_ERR_INVALID, "every_epoch");
  CHECK_OK(parse("{\"eval\": {\"interval_steps\": 5}, \"training\": {\"early_stopping_patience\": 2}}", &c));
}

/* A scripted validation curve (AUC, higher is better) through the state
 * machine, with the decisions worked out by hand from the definitions:
 *   best:  strictly higher than every earlier AUC;
 *   stop:  3 validations in a row not above the reference + 0.001
 *          (Keras EarlyStopping, patience 3, min_delta 0.001);
 *   plateau: more than 1 bad validation in a row (not above the reference
 *          + 0.001) cuts the factor x0.5, floored at 0.2; one validation of
 *          cooldown after a cut (PyTorch ReduceLROnPlateau, mode max,
 *          threshold_mode abs).
 * v  auc     best  ES ref/bad   PL ref/bad/cool  scale  event
 * 1  0.70    yes   .70/0        .70/0/0          1
 * 2  0.72    yes   .72/0        .72/0/0          1
 * 3  0.7205  yes   .72/1        .72/1/0          1      (a new best, but not by min_delta)
 * 4  0.719   -     .72/2        .72/2 -> cut     0.5    reduced, cooldown 1
 * 5  0.725   yes   .725/0       .725/0/0         0.5    (the cooldown ends)
 * 6  0.724   -     .725/1       .725/1/0         0.5
 * 7  0.7255  yes   .725/2       .725/2 -> cut    0.25   reduced, cooldown 1
 * 8  0.7251  -     .725/3 stop  .725/0/0         0.25   stop (cooldown absorbs the bad one)
 * 9  NaN     -     .725/4 stop  .725/1/0         0.25   stop (NaN never improves)
 * 10 0.70    -     .725/5 stop  .725/2 -> cut    0.2    0.125 floored to 0.2: reduced
 * 11 0.70    -     stop         .725/0/0 (cool)  0.2
 * 12 0.70    -     stop         .725/1/0         0.2
 * 13 0.70    -     stop         .725/2 -> none   0.2    at the floor: no cut reported
 */
TEST(validation_state_machine_on_a_scripted_curve) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  c.early_stop_patience = 3;
  c.early_stop_min_delta = 0.001;
  c.plateau_factor = 0.5;
  c.plateau_patience = 1;
  c.plateau_cooldown = 1;
  c.plateau_min_delta = 0.001;
  c.plateau_min_scale = 0.2;
  const double auc[] = {0.70, 0.72, 0.7205, 0.719, 0.725, 0.724, 0.7255, 0.7251, NAN, 0.70, 0.70, 0.70, 0.70};
  const int improved[] = {1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0};
  const int reduced[] = {0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0};
  const int stop[] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
  const double scale[] = {1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.2, 0.2, 0.2, 0.2};
  const uint64_t best_step[] = {10, 20, 30, 30, 50, 50, 70, 70, 70, 70, 70, 70, 70};
  dlrec_valid_state s;
  dlrec_valid_state_init(&s);
  CHECK(isnan(s.best));
  CHECK_NEAR(s.plateau_scale, 1.0, 0, 0);
  for (int i = 0; i < 13; i++) {
    dlrec_valid_outcome o;
    dlrec_valid_observe(&c, &s, auc[i], 10 * (uint64_t)(i + 1), &o);
    if (o.improved != improved[i] || o.reduced != reduced[i] || o.stop != stop[i] || s.plateau_scale != scale[i] ||
        s.best_step != best_step[i])
      test_fail(__FILE__, __LINE__,
                "validation %d (auc %g): improved %d reduced %d stop %d scale %g best_step %llu; expected %d %d %d %g %llu",
                i + 1, auc[i], o.improved, o.reduced, o.stop, s.plateau_scale, (unsigned long long)s.best_step,
                improved[i], reduced[i], stop[i], scale[i], (unsigned long long)best_step[i]);
  }
  CHECK_EQ_U64(s.validations, 13);
  CHECK_NEAR(s.best, 0.7255, 0, 0);
}

/* With logloss, lower is better; with everything off, only the best is kept. */
TEST(validation_state_machine_logloss_and_off) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  c.eval_metric = DLREC_VALID_LOGLOSS;
  c.early_stop_patience = 1;
  dlrec_valid_state s;
  dlrec_valid_state_init(&s);
  dlrec_valid_outcome o;
  dlrec_valid_observe(&c, &s, 0.50, 1, &o);
  CHECK(o.improved && !o.stop);
  dlrec_valid_observe(&c, &s, 0.45, 2, &o);
  CHECK(o.improved && !o.stop);
  dlrec_valid_observe(&c, &s, 0.46, 3, &o); /* higher logloss: worse */
  CHECK(!o.improved && o.stop);
  CHECK_EQ_U64(s.best_step, 2);
  dlrec_train_config_default(&c);
  dlrec_valid_state_init(&s);
  for (int i = 0; i < 5; i++) {
    dlrec_valid_observe(&c, &s, 0.5 - 0.01 * i, (uint64_t)i + 1, &o);
    CHECK(!o.stop && !o.reduced);
    CHECK_EQ(o.improved, i == 0);
  }
  CHECK_NEAR(s.plateau_scale, 1.0, 0, 0);
}

/* c written to JSON, where training.KEY must be the string `written`, and
 * read back into *back: 1 when both hold. */
static int training_round_trip(const dlrec_train_config *c, const char *key, const char *written,
                               dlrec_train_config *back) {
  cJSON *j = dlrec_train_config_to_json(c);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "training"), key);
  const int named = cJSON_IsString(v) && !strcmp(v->valuestring, written);
  const dlrec_status s = dlrec_train_config_from_json(j, "round trip", back);
  cJSON_Delete(j);
  return named && s == DLREC_OK;
}

/* training.precision: fp32 by default, each name read, anything else refused
 * naming the field and the accepted values, and kept by the JSON round trip. */
TEST(config_precision) {
  dlrec_train_config c;
  CHECK_OK(parse("{}", &c));
  CHECK_EQ(c.precision, DLREC_PRECISION_FP32);
  const char *names[] = {"fp32", "bf16", "auto", "tf32", "fp16"};
  const dlrec_precision want[] = {DLREC_PRECISION_FP32, DLREC_PRECISION_BF16, DLREC_PRECISION_AUTO,
                                  DLREC_PRECISION_TF32, DLREC_PRECISION_FP16};
  for (int i = 0; i < 5; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"precision\": \"%s\"}}", names[i]);
    CHECK_OK(parse(text, &c));
    CHECK_EQ(c.precision, want[i]);
    dlrec_train_config b;
    CHECK(training_round_trip(&c, "precision", names[i], &b));
    CHECK_EQ(b.precision, want[i]);
  }
  CHECK_ERR(parse("{\"training\": {\"precision\": \"fp8\"}}", &c), DLREC_ERR_INVALID,
            "cfg.json: training: field 'precision': precision 'fp8' is not one of fp32, bf16, auto, tf32, fp16");
  CHECK_ERR(parse("{\"training\": {\"precision\": \"BF16\"}}", &c), DLREC_ERR_INVALID, "field 'precision'");
  CHECK_ERR(parse("{\"training\": {\"precision\": 16}}", &c), DLREC_ERR_INVALID, "precision");
  CHECK_ERR(parse("{\"training\": {\"precison\": \"bf16\"}}", &c), DLREC_ERR_INVALID, "unknown field 'precison'");
}

/* training.device: cpu by default; cuda and cuda:N read into the backend's
 * name and the GPU's index and written back as cuda:N; anything else
 * refused naming the field and the accepted forms. */
TEST(config_device) {
  dlrec_train_config c;
  CHECK_OK(parse("{}", &c));
  CHECK_STR(c.device, "cpu");
  CHECK_EQ(c.device_index, 0);
  const char *in[] = {"cpu", "cuda", "cuda:0", "cuda:3", "cuda:1234"};
  const char *back[] = {"cpu", "cuda:0", "cuda:0", "cuda:3", "cuda:1234"};
  const char *backend[] = {"cpu", "cuda", "cuda", "cuda", "cuda"};
  const uint32_t index[] = {0, 0, 0, 3, 1234};
  for (int i = 0; i < 5; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"device\": \"%s\"}}", in[i]);
    CHECK_OK(parse(text, &c));
    CHECK_STR(c.device, backend[i]);
    CHECK_EQ(c.device_index, index[i]);
    dlrec_train_config b;
    CHECK(training_round_trip(&c, "device", back[i], &b));
    CHECK_STR(b.device, backend[i]);
    CHECK_EQ(b.device_index, index[i]);
  }
  CHECK_ERR(parse("{\"training\": {\"device\": \"gpu\"}}", &c), DLREC_ERR_INVALID,
            "cfg.json: training: field 'device': device 'gpu' is not one of cpu, cuda, cuda:N");
  const char *bad[] = {"", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda0", "cuda:12345", "cpu:0", "cuda: 1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"device\": \"%s\"}}", bad[i]);
    CHECK_ERR(parse(text, &c), DLREC_ERR_INVALID, "field 'device'");
  }
  CHECK_ERR(parse("{\"training\": {\"device\": 0}}", &c), DLREC_ERR_INVALID, "device");
}

/* training.table_placement: auto by default; device and host read and
 * written back; anything else refused naming the field and the choices. */
TEST(config_table_placement) {
  dlrec_train_config c;
  CHECK_OK(parse("{}", &c));
  CHECK_EQ(c.table_placement, DLREC_TABLE_PLACEMENT_AUTO);
  const char *names[] = {"auto", "device", "host"};
  const dlrec_table_placement want[] = {DLREC_TABLE_PLACEMENT_AUTO, DLREC_TABLE_PLACEMENT_DEVICE,
                                        DLREC_TABLE_PLACEMENT_HOST};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"table_placement\": \"%s\"}}", names[i]);
    CHECK_OK(parse(text, &c));
    CHECK_EQ(c.table_placement, want[i]);
    dlrec_train_config b;
    CHECK(training_round_trip(&c, "table_placement", names[i], &b));
    CHECK_EQ(b.table_placement, want[i]);
  }
  CHECK_ERR(parse("{\"training\": {\"table_placement\": \"gpu\"}}", &c), DLREC_ERR_INVALID,
            "field 'table_placement'");
  CHECK(strstr(dlrec_last_error(), "auto, device, host") != NULL);
  CHECK_ERR(parse("{\"training\": {\"table_placement\": 1}}", &c), DLREC_ERR_INVALID, "table_placement");
}

/* training.loss_scale: auto by default (growth every 2000 steps);
 * "dynamic", "none" and a power of two in [1, 2^24] read and written back;
 * anything else refused naming the field. */
TEST(config_loss_scale) {
  dlrec_train_config c, b;
  CHECK_OK(parse("{}", &c));
  CHECK_EQ(c.loss_scaling, DLREC_LOSS_SCALING_AUTO);
  CHECK_EQ(c.loss_scale_growth_interval, 2000);
  const char *names[] = {"auto", "dynamic", "none"};
  const dlrec_loss_scaling want[] = {DLREC_LOSS_SCALING_AUTO, DLREC_LOSS_SCALING_DYNAMIC, DLREC_LOSS_SCALING_NONE};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"loss_scale\": \"%s\", \"loss_scale_growth_interval\": 7}}",
             names[i]);
    CHECK_OK(parse(text, &c));
    CHECK_EQ(c.loss_scaling, want[i]);
    CHECK(training_round_trip(&c, "loss_scale", names[i], &b));
    CHECK_EQ(b.loss_scaling, want[i]);
    CHECK_EQ(b.loss_scale_growth_interval, 7);
  }
  const double fixed[] = {1, 1024, 16777216};
  for (int i = 0; i < 3; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"loss_scale\": %.0f}}", fixed[i]);
    CHECK_OK(parse(text, &c));
    CHECK_EQ(c.loss_scaling, DLREC_LOSS_SCALING_FIXED);
    CHECK(c.loss_scale == (float)fixed[i]);
    cJSON *j = dlrec_train_config_to_json(&c);
    CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
    cJSON_Delete(j);
    CHECK(b.loss_scaling == DLREC_LOSS_SCALING_FIXED && b.loss_scale == (float)fixed[i]);
  }
  const char *bad[] = {"3", "0.5", "0", "-2", "33554432", "\"fixed\"", "true", "1e400"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[128];
    snprintf(text, sizeof text, "{\"training\": {\"loss_scale\": %s}}", bad[i]);
    CHECK_ERR(parse(text, &c), DLREC_ERR_INVALID, "field 'loss_scale'");
  }
  CHECK_ERR(parse("{\"training\": {\"loss_scale_growth_interval\": 0}}", &c), DLREC_ERR_INVALID,
            "field 'loss_scale_growth_interval'");
}

TEST(config_storage_parses_round_trips_and_names_errors) {
  dlrec_train_config a, b;
  CHECK_OK(parse("{}", &a));
  CHECK_EQ(a.storage, DLREC_STORE_RAM);
  CHECK_OK(parse("{\"storage\": {\"kind\": \"tiered\", \"cache_rows\": 5000, \"path\": \"/fast/t.tiered\"}}", &a));
  CHECK_EQ(a.storage, DLREC_STORE_TIERED);
  CHECK_EQ_U64(a.storage_cache_rows, 5000);
  CHECK_STR(a.storage_path, "/fast/t.tiered");
  cJSON *j = dlrec_train_config_to_json(&a);
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON_Delete(j);
  CHECK_EQ(b.storage, DLREC_STORE_TIERED);
  CHECK_EQ_U64(b.storage_cache_rows, 5000);
  CHECK_STR(b.storage_path, "/fast/t.tiered");
  CHECK_ERR(parse("{\"storage\": {\"kind\": \"disk\"}}", &a), DLREC_ERR_INVALID,
            "storage: field 'kind': unknown table storage \"disk\" (one of: ram, tiered, hash)");
  /* A hash table: its settings, round trip, and the store config they give. */
  CHECK_OK(parse("{\"storage\": {\"kind\": \"hash\", \"cache_rows\": 1000, \"admit_min_count\": 3, "
                 "\"evict\": \"lfu\", \"ttl_steps\": 50, \"admit_probability\": 0.25}, "
                 "\"training\": {\"seed\": 9}}", &a));
  j = dlrec_train_config_to_json(&a);
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON_Delete(j);
  dlrec_store_config sc = dlrec_train_config_store(&b, 10, NULL);
  CHECK_EQ(sc.kind, DLREC_STORE_HASH);
  CHECK_EQ_U64(sc.cache_rows, 1000);
  CHECK_EQ(sc.admit_min_count, 3);
  CHECK(sc.admit_probability == 0.25f);
  CHECK_EQ(sc.evict, DLREC_HASH_EVICT_LFU);
  CHECK_EQ_U64(sc.ttl_steps, 50);
  CHECK_EQ_U64(sc.seed, 9);
  CHECK(fabsf(sc.init_range - 0.1f) < 1e-7f); /* sqrt(10 columns / 1000 rows) */
  CHECK_ERR(parse("{\"storage\": {\"kind\": \"hash\"}}", &a), DLREC_ERR_INVALID, "storage.cache_rows");
  /* Publishing to the Redis tier: defaults, round trip, errors. */
  CHECK_OK(parse("{}", &a));
  CHECK(a.publish_redis[0] == 0 && a.publish_interval_steps == 10 && a.publish_timeout_ms == 200);
  CHECK_OK(parse("{\"publish\": {\"redis\": \"10.0.0.5:6379\", \"interval_steps\": 3, \"prefix\": \"m:v2\"}}", &a));
  j = dlrec_train_config_to_json(&a);
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON_Delete(j);
  CHECK_STR(b.publish_redis, "10.0.0.5:6379");
  CHECK_STR(b.publish_prefix, "m:v2");
  CHECK_EQ_U64(b.publish_interval_steps, 3);
  CHECK_ERR(parse("{\"publish\": {\"interval_steps\": 0}}", &a), DLREC_ERR_INVALID, "'interval_steps' must be >= 1");
  CHECK_ERR(parse("{\"publish\": {\"host\": \"x\"}}", &a), DLREC_ERR_INVALID, "unknown field 'host'");
  CHECK_ERR(parse("{\"storage\": {\"kind\": \"hash\", \"cache_rows\": 9, \"evict\": \"fifo\"}}", &a),
            DLREC_ERR_INVALID, "'fifo' is not one of lru, lfu");
  CHECK_ERR(parse("{\"storage\": {\"kind\": \"tiered\"}}", &a), DLREC_ERR_INVALID, "storage.cache_rows");
  CHECK_ERR(parse("{\"storage\": {\"cache\": 3}}", &a), DLREC_ERR_INVALID, "unknown field 'cache'");
}

/* The defaults the options table sets are the Criteo Kaggle DLRM's, as
 * dlrec_train_config_default set them field by field before the table. */
TEST(config_table_defaults) {
  dlrec_train_config c;
  dlrec_train_config_default(&c);
  CHECK_STR(c.name, "dlrm");
  CHECK_EQ(c.dense.kind, DLREC_OPTIM_SGD);
  CHECK(c.dense.lr == 0.1f && c.sparse.lr == 0.1f);
  CHECK(c.dense.beta1 == 0.9f && c.dense.beta2 == 0.999f && c.dense.eps == 1e-8f);
  CHECK_EQ(c.sparse.kind, DLREC_SPARSE_SGD);
  CHECK_NEAR(c.decay_power, 2.0, 0, 0);
  CHECK_EQ(c.batch_size, 128);
  CHECK_EQ(c.epochs, 1);
  CHECK_EQ_U64(c.seed, 1);
  CHECK_STR(c.device, "cpu");
  CHECK_EQ(c.device_index, 0);
  CHECK_EQ(c.eval_batch_size, 4096);
  CHECK_EQ_U64(c.eval_train_rows, 65536);
  CHECK_EQ(c.checkpoint_keep, 2);
  CHECK(c.checkpoint_journal_max_fraction == 0.25);
  CHECK_EQ(c.storage, DLREC_STORE_RAM);
  CHECK_EQ(c.storage_admit_min_count, 1);
  CHECK_EQ(c.storage_evict, DLREC_HASH_EVICT_LRU);
  CHECK_EQ_U64(c.publish_interval_steps, 10);
  CHECK_EQ(c.publish_timeout_ms, 200);
  CHECK(c.dist_rowwise_share == 0.5);
  CHECK_EQ_U64(c.log_interval_steps, 1000);
  CHECK(c.shuffle == 1 && c.window_groups == 8 && c.slice_rows == 32 && c.prefetch == 4);
  CHECK(c.plateau_factor == 1.0);
  CHECK_EQ(c.loss_scaling, DLREC_LOSS_SCALING_AUTO);
  CHECK_EQ(c.loss_scale_growth_interval, 2000);
  CHECK(c.hot_fraction == DLREC_HOT_FRACTION_AUTO);
  CHECK_EQ(c.precision, DLREC_PRECISION_FP32);
  CHECK_EQ(c.table_placement, DLREC_TABLE_PLACEMENT_AUTO);
  CHECK_EQ(c.eval_metric, DLREC_VALID_AUC);
  CHECK(c.storage_path[0] == 0 && c.publish_redis[0] == 0 && c.publish_prefix[0] == 0);
  /* Every default the table states reads as its type reads a value. */
  for (const dlrec_option *o = dlrec_train_config_options; o->key; o++) {
    dlrec_train_config d;
    dlrec_train_config_default(&d);
    if (o->dflt && dlrec_option_from_text(o, o->dflt, o->key, &d, NULL) != DLREC_OK)
      test_fail(__FILE__, __LINE__, "%s.%s: default '%s': %s", o->section, o->key, o->dflt, dlrec_last_error());
  }
  /* The complete config, written, read and written again, is the same text. */
  cJSON *j = dlrec_train_config_to_json(&c);
  dlrec_train_config b;
  CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
  cJSON *k = dlrec_train_config_to_json(&b);
  char *t1 = cJSON_Print(j), *t2 = cJSON_Print(k);
  CHECK_STR(t1, t2);
  free(t1);
  free(t2);
  cJSON_Delete(j);
  cJSON_Delete(k);
}

/* docs/config.md's option reference is the table's: a new or changed option
 * fails here until the doc is regenerated (`dlrec options config`). */
TEST(config_reference_in_the_docs_is_current) {
  char *doc = NULL, *want = dlrec_train_config_reference();
  size_t n = 0;
  CHECK(want != NULL);
  CHECK_OK(dlrec_read_file(test_source_path("docs/config.md"), 1u << 22, &doc, &n));
  static const char begin[] = "<!-- options-reference: dlrec options config -->\n", end[] = "<!-- end options-reference -->";
  const char *a = doc ? strstr(doc, begin) : NULL, *b = a ? strstr(a, end) : NULL;
  CHECK(a && b);
  if (a && b && ((size_t)(b - a) - strlen(begin) != strlen(want) || strncmp(a + strlen(begin), want, strlen(want))))
    test_fail(__FILE__, __LINE__, "docs/config.md's option reference is out of date: regenerate it with "
              "`build/dlrec options config` and paste it between the markers");
  free(doc);
  free(want);
}

/* model.embedding_init: its forms read, round-trip through the JSON a
 * checkpoint stores, are absent from it by default, and refuse what they
 * cannot mean, naming the field. */
TEST(config_embedding_init) {
  dlrec_train_config a, b;
  CHECK_OK(parse("{}", &a));
  CHECK_EQ(a.model.embedding_init.all.kind, DLREC_INIT_UNIFORM_SQRT_ROWS);
  cJSON *j = dlrec_train_config_to_json(&a);
  CHECK(!cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "model"), "embedding_init"));
  cJSON_Delete(j);
  const char *forms[] = {
      "{\"model\": {\"embedding_init\": \"xavier_uniform\"}}",
      "{\"model\": {\"embedding_init\": {\"type\": \"normal\", \"std\": 1e-4}, \"embedding_dim\": 8, \"bottom_mlp\": [8]}}",
      ("{\"model\": {\"type\": \"fm\", \"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"C1\": {\"type\": "
       "\"uniform\", \"range\": 0.25}, \"C7\": \"uniform_sqrt_rows\"}}}}"),
      "{\"model\": {\"type\": \"dnn\", \"embedding_init\": {\"type\": \"uniform\", \"range\": 0.01}}}",
  };
  const uint32_t kinds[] = {DLREC_INIT_XAVIER_UNIFORM, DLREC_INIT_NORMAL, DLREC_INIT_ZEROS, DLREC_INIT_UNIFORM};
  const float scales[] = {0, 1e-4f, 0, 0.01f};
  for (int i = 0; i < 4; i++) {
    CHECK_OK(parse(forms[i], &a));
    CHECK_EQ(a.model.embedding_init.all.kind, kinds[i]);
    CHECK(a.model.embedding_init.all.scale == scales[i]);
    j = dlrec_train_config_to_json(&a);
    CHECK_OK(dlrec_train_config_from_json(j, "round trip", &b));
    cJSON_Delete(j);
    CHECK(memcmp(&a.model, &b.model, sizeof a.model) == 0);
  }
  CHECK_EQ(a.model.embedding_init.n_columns, 0);
  CHECK_OK(parse(forms[2], &a));
  CHECK_EQ(a.model.embedding_init.n_columns, 2);
  CHECK(!strcmp(a.model.embedding_init.column[1], "C7"));
  CHECK_EQ(a.model.embedding_init.column_init[0].kind, DLREC_INIT_UNIFORM);
  CHECK(a.model.embedding_init.column_init[0].scale == 0.25f);
  CHECK_EQ(a.model.embedding_init.column_init[1].kind, DLREC_INIT_UNIFORM_SQRT_ROWS);

  CHECK_ERR(parse("{\"model\": {\"embedding_init\": \"gaussian\"}}", &a), DLREC_ERR_INVALID,
            "cfg.json: model.embedding_init: field 'type': 'gaussian' is not one of uniform_sqrt_rows, normal");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": \"normal\"}}", &a), DLREC_ERR_INVALID, "'normal' needs its 'std'");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"normal\"}}}", &a), DLREC_ERR_INVALID, "std");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"normal\", \"std\": 0}}}", &a), DLREC_ERR_INVALID,
            "field 'std': 0 is not in (0, 1000]");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"uniform\", \"std\": 0.1}}}", &a), DLREC_ERR_INVALID,
            "field 'std' means nothing to 'uniform'");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"scale\": 1}}}", &a), DLREC_ERR_INVALID,
            "model.embedding_init: unknown field 'scale'");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": 3}}", &a), DLREC_ERR_INVALID, "model.embedding_init: expected one of");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": \"zeros\", \"embedding_init\": \"zeros\"}}", &a), DLREC_ERR_INVALID,
            "field 'embedding_init' given twice");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"C1\": {\"type\": \"zeros\", "
                  "\"columns\": {}}}}}}",
                  &a),
            DLREC_ERR_INVALID, "model.embedding_init.columns.C1: unknown field 'columns'");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"C1\": \"zeros\", \"C1\": "
                  "\"zeros\"}}}}",
                  &a),
            DLREC_ERR_INVALID, "field 'C1' given twice");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": \"zeros\"}, \"storage\": {\"init_range\": 0.1}}", &a),
            DLREC_ERR_INVALID, "field 'storage.init_range'");
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"columns\": 3}}}", &a), DLREC_ERR_INVALID,
            "model.embedding_init: field 'columns': expected an object of column names");
  /* A column name takes at most DLREC_NAME_MAX - 1 bytes, as the schema's. */
  char name[DLREC_NAME_MAX + 1], text[256];
  memset(name, 'c', sizeof name);
  name[DLREC_NAME_MAX - 1] = '\0';
  snprintf(text, sizeof text, "{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"%s\": \"zeros\"}}}}",
           name);
  CHECK_OK(parse(text, &a));
  CHECK_STR(a.model.embedding_init.column[0], name);
  name[DLREC_NAME_MAX - 1] = 'c';
  name[DLREC_NAME_MAX] = '\0';
  snprintf(text, sizeof text, "{\"model\": {\"embedding_init\": {\"type\": \"zeros\", \"columns\": {\"%s\": \"zeros\"}}}}",
           name);
  CHECK_ERR(parse(text, &a), DLREC_ERR_INVALID, "is longer than a column name can be");
  /* The type's own keys are still checked beside it. */
  CHECK_ERR(parse("{\"model\": {\"embedding_init\": \"zeros\", \"cross_layers\": 3}}", &a), DLREC_ERR_INVALID,
            "unknown field 'cross_layers'");
}

/* optimizer.sparse "adam" and l2_scope (docs/config.md, "Table-wide
 * updates"; their arithmetic is test_sparse_dense's). */
/* The sparse section of c as config.json writes it, malloc'd. */
static char *sparse_json(const dlrec_train_config *c) {
  cJSON *j = dlrec_train_config_to_json(c);
  char *text = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "optimizer"), "sparse"));
  cJSON_Delete(j);
  return text;
}

TEST(config_adam_and_l2_scope_parse_round_trip_and_name_errors) {
  dlrec_train_config c, back;
  /* l2_scope before type: a type's defaults do not reset it. */
  CHECK_OK(parse("{\"optimizer\": {\"sparse\": {\"l2_scope\": \"table\", \"type\": \"adam\", \"lr\": 0.001, "
                 "\"weight_decay\": 1e-5}}}", &c));
  CHECK_EQ(c.sparse.kind, DLREC_SPARSE_ADAM);
  CHECK_EQ(c.sparse.l2_scope, DLREC_SPARSE_L2_TABLE);
  CHECK(c.sparse.beta1 == 0.9f && c.sparse.eps == 1e-8f && c.sparse.lr == 0.001f);
  char *text = sparse_json(&c);
  CHECK(text && strstr(text, "\"type\":\"adam\"") && strstr(text, "\"l2_scope\":\"table\""));
  free(text);
  cJSON *j = dlrec_train_config_to_json(&c);
  dlrec_status st = dlrec_train_config_from_json(j, "round trip", &back);
  cJSON_Delete(j);
  CHECK_OK(st);
  CHECK(!memcmp(&back.sparse, &c.sparse, sizeof c.sparse));
  /* The default scope is not written: config.json stays as it was. */
  CHECK_OK(parse("{\"optimizer\": {\"sparse\": {\"type\": \"lazy_adam\", \"l2_scope\": \"touched\"}}}", &c));
  CHECK_EQ(c.sparse.l2_scope, DLREC_SPARSE_L2_TOUCHED);
  text = sparse_json(&c);
  CHECK(text && !strstr(text, "l2_scope"));
  free(text);
  CHECK_ERR(parse("{\"optimizer\": {\"sparse\": {\"l2_scope\": \"all\"}}}", &c), DLREC_ERR_INVALID,
            "cfg.json: optimizer.sparse: field 'l2_scope': 'all' is not one of touched, table");
  CHECK_ERR(parse("{\"optimizer\": {\"sparse\": {\"l2_scope\": 1}}}", &c), DLREC_ERR_INVALID,
            "field 'l2_scope': expected a string");
  CHECK_ERR(parse("{\"optimizer\": {\"sparse\": {\"type\": \"adamw\"}}}", &c), DLREC_ERR_INVALID,
            "field 'type': 'adamw' is not one of sgd, rowwise_adagrad, lazy_adam, adam");
  CHECK_ERR(parse("{\"optimizer\": {\"dense\": {\"l2_scope\": \"table\"}}}", &c), DLREC_ERR_INVALID, "l2_scope");
}
