/* The training config: defaults, the example file, strict errors that name
 * the field, the JSON round trip, and the learning-rate schedule. */
#include "dlrec/dlrm.h"
#include "dlrec/json.h"
#include "dlrec/train_config.h"
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
  CHECK_EQ(dlrec_dlrm_shape_of(&b.model)->pooling, DLREC_BAG_MEAN);
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
