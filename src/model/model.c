/* The registry of model types, their configs, and a network's plan and
 * parameters. The passes over a network live in net_pass.c, its embedding
 * stages in stage_*.c (model/stage.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "core/rng.h"
#include "model/model_type.h"

/* Every model type, by name. A new type adds one line here. */
static const net_type *const TYPES[] = {&net_type_dlrm,      &net_type_lr,     &net_type_fm,
                                        &net_type_wide_deep, &net_type_deepfm, &net_type_dcn_v2, NULL};

const char *dlrec_net_type_name(size_t i) {
  return i < sizeof TYPES / sizeof *TYPES - 1 ? TYPES[i]->name : NULL;
}

const net_type *net_type_find(const char *name) {
  for (size_t i = 0; TYPES[i]; i++)
    if (!strcmp(TYPES[i]->name, name)) return TYPES[i];
  return NULL;
}

/* An error naming the unknown type and the known ones. */
static dlrec_status unknown_type(const char *what, const char *type) {
  char list[256] = "";
  for (size_t i = 0; TYPES[i]; i++) {
    strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, TYPES[i]->name, sizeof list - strlen(list) - 1);
  }
  return dlrec_error(DLREC_ERR_INVALID, "%s: field 'type': '%s' is not one of %s", what, type, list);
}

dlrec_status dlrec_net_config_default(dlrec_net_config *c, const char *type) {
  const net_type *t = net_type_find(type);
  if (!t) return unknown_type("model", type);
  memset(c, 0, sizeof *c);
  snprintf(c->type, sizeof c->type, "%s", t->name);
  t->config_default(c->params);
  return DLREC_OK;
}

dlrec_status dlrec_net_config_parse(dlrec_net_config *c, const cJSON *o, const char *what) {
  const char *type;
  dlrec_status s = dlrec_json_get_string_or(o, "type", what, c->type, &type);
  if (s != DLREC_OK) return s;
  const net_type *t = net_type_find(type);
  if (!t) return unknown_type(what, type);
  /* Another type's settings mean nothing to this one: start from its defaults. */
  if (strcmp(type, c->type) && (s = dlrec_net_config_default(c, type)) != DLREC_OK) return s;
  return t->config_parse(c->params, o, what);
}

void dlrec_net_config_to_json(const dlrec_net_config *c, cJSON *o) {
  cJSON_AddStringToObject(o, "type", c->type);
  const net_type *t = net_type_find(c->type);
  if (t) t->config_to_json(c->params, o);
}

/* ---- the plan ------------------------------------------------------------ */

dlrec_status net_plan_tensor(net_plan *p, const char *name, uint32_t rows, uint32_t cols, size_t *offset) {
  if (p->n_tensors == DLREC_NET_MAX_TENSORS)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d parameter tensors", DLREC_NET_MAX_TENSORS);
  dlrec_net_tensor *t = &p->tensors[p->n_tensors];
  memset(t, 0, sizeof *t);
  if (snprintf(t->name, sizeof t->name, "%s", name) >= (int)sizeof t->name)
    return dlrec_error(DLREC_ERR_INTERNAL, "tensor name '%s' longer than %d bytes", name, DLREC_NET_TENSOR_NAME - 1);
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->offset = p->n_params;
  t->count = (size_t)rows * (cols ? cols : 1);
  p->n_params += t->count;
  p->n_tensors++;
  *offset = t->offset;
  return DLREC_OK;
}

dlrec_status net_plan_linear(net_plan *p, const char *prefix, uint32_t in, uint32_t out, int *index) {
  if (p->n_linear == NET_MAX_LINEAR)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d linear layers", NET_MAX_LINEAR);
  net_linear *L = &p->linear[p->n_linear];
  char name[DLREC_NET_TENSOR_NAME + 16];
  snprintf(name, sizeof name, "%s.weight", prefix);
  dlrec_status s = net_plan_tensor(p, name, out, in, &L->w);
  snprintf(name, sizeof name, "%s.bias", prefix);
  if (s == DLREC_OK) s = net_plan_tensor(p, name, out, 0, &L->b);
  if (s != DLREC_OK) return s;
  L->in = in;
  L->out = out;
  *index = (int)p->n_linear++;
  return DLREC_OK;
}

dlrec_status net_plan_buffer(net_plan *p, const char *name, uint32_t rows, size_t *handle) {
  if (p->n_buffers == NET_MAX_BUFFERS)
    return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d buffers", NET_MAX_BUFFERS);
  dlrec_net_tensor *t = &p->buffers[p->n_buffers];
  memset(t, 0, sizeof *t);
  if (snprintf(t->name, sizeof t->name, "%s", name) >= (int)sizeof t->name)
    return dlrec_error(DLREC_ERR_INTERNAL, "tensor name '%s' longer than %d bytes", name, DLREC_NET_TENSOR_NAME - 1);
  t->ndim = 1;
  t->shape[0] = rows;
  t->offset = p->buffer_floats;
  t->count = rows;
  p->buffer_floats += rows;
  p->n_buffers++;
  *handle = t->offset;
  return DLREC_OK;
}

/* Ends a plan: the buffers go after every trainable tensor. */
static dlrec_status plan_finish(net_plan *p) {
  p->n_trainable = p->n_params;
  for (uint32_t i = 0; i < p->n_buffers; i++) {
    if (p->n_tensors == DLREC_NET_MAX_TENSORS)
      return dlrec_error(DLREC_ERR_INVALID, "the model has more than %d parameter tensors", DLREC_NET_MAX_TENSORS);
    dlrec_net_tensor *t = &p->tensors[p->n_tensors++];
    *t = p->buffers[i];
    t->offset += p->n_trainable;
  }
  p->n_params += p->buffer_floats;
  return DLREC_OK;
}

void net_init_linear(const net_linear *L, float *params, uint64_t seed, uint64_t stream) {
  dlrec_rng r;
  dlrec_rng_seed(&r, seed, stream);
  double wstd = sqrt(2.0 / (L->in + L->out)), bstd = sqrt(1.0 / L->out);
  for (size_t i = 0; i < (size_t)L->in * L->out; i++) params[L->w + i] = (float)(wstd * dlrec_rng_normal(&r));
  for (uint32_t i = 0; i < L->out; i++) params[L->b + i] = (float)(bstd * dlrec_rng_normal(&r));
}

/* ---- the network --------------------------------------------------------- */

dlrec_status dlrec_net_create(dlrec_net **out, const dlrec_net_config *c, const dlrec_schema *schema) {
  return dlrec_net_create_stored(out, c, schema, NULL);
}

/* tableless: the network's rows live elsewhere; its table is one row. */
static dlrec_status create(dlrec_net **out, const dlrec_net_config *c, const dlrec_schema *schema,
                           const dlrec_store_config *storage, int tableless) {
  *out = NULL;
  const dlrec_store_config ram = {.kind = DLREC_STORE_RAM};
  const net_type *t = net_type_find(c->type);
  if (!t) return unknown_type("model", c->type);
  dlrec_net *n = calloc(1, sizeof *n);
  if (!n) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  n->type = t;
  n->be = dlrec_backend_default();
  n->config = *c;
  n->schema = *schema;
  dlrec_status s = t->plan(c->params, schema, &n->plan, &n->ctx);
  if (s == DLREC_OK) s = plan_finish(&n->plan);
  if (s == DLREC_OK && (n->plan.emb_dim < 1 || n->plan.emb_dim > DLREC_EMBED_MAX_DIM))
    s = dlrec_error(DLREC_ERR_INVALID, "embedding dim %u out of range [1, %d]", n->plan.emb_dim, DLREC_EMBED_MAX_DIM);
  if (s == DLREC_OK) {
    n->params = calloc(1, net_params_bytes(n));
    if (!n->params) s = dlrec_error(DLREC_ERR_NOMEM, "cannot allocate %zu dense parameters", n->plan.n_params);
  }
  /* Raw keys index nothing: only a hash table (whose rows keys take as they
   * are admitted) trains or scores them, and a hash table only them. */
  const dlrec_store_kind kind = storage ? storage->kind : DLREC_STORE_RAM;
  if (s == DLREC_OK && schema->n_sparse && schema->keys != (kind == DLREC_STORE_HASH))
    s = dlrec_error(DLREC_ERR_INVALID,
                    schema->keys ? "the data holds raw keys (etl fit --raw-keys): they need storage.kind \"hash\""
                                 : "a hash table (storage.kind \"hash\") takes raw keys: fit the ETL with --raw-keys");
  /* Data with no categorical column has no embedding rows; the network
   * keeps a one-row table that no pass reads, so that checkpoints, the
   * sparse optimizer and the scorer need no special case. */
  if (s == DLREC_OK)
    s = dlrec_store_create(&n->store, schema->n_sparse && storage ? storage : &ram,
                           schema->n_sparse && !tableless ? schema->table_rows : 1, n->plan.emb_dim,
                           (dlrec_table_dtype)c->table_dtype);
  if (s == DLREC_OK) n->table = dlrec_store_table(n->store);
  n->tableless = tableless;
  net_stage_pick(n);
  for (uint32_t i = 0; i < schema->n_sparse; i++) {
    n->max_ids_per_row += schema->sparse[i].max_hotness;
    n->mean_cols[i] = schema->sparse[i].pooling == DLREC_POOLING_MEAN;
  }
  if (s != DLREC_OK) {
    dlrec_net_free(n);
    return s;
  }
  *out = n;
  return DLREC_OK;
}

dlrec_status dlrec_net_create_stored(dlrec_net **out, const dlrec_net_config *c, const dlrec_schema *schema,
                                     const dlrec_store_config *storage) {
  return create(out, c, schema, storage, 0);
}

dlrec_status dlrec_net_create_tableless(dlrec_net **out, const dlrec_net_config *c, const dlrec_schema *schema) {
  return create(out, c, schema, NULL, 1);
}

void dlrec_net_free(dlrec_net *n) {
  if (!n) return;
  net_device_drop(n);
  if (n->ctx) n->type->free_ctx(n->ctx);
  dlrec_store_free(n->store);
  free(n->params);
  free(n);
}

dlrec_status dlrec_net_init(dlrec_net *n, uint64_t seed) {
  n->type->init(n->ctx, &n->plan, n->params, seed);
  /* A hash table draws each row when its key is admitted. */
  if (dlrec_store_get_kind(n->store) == DLREC_STORE_HASH) return dlrec_net_sync_device(n, NULL);
  if (n->tableless) return dlrec_net_sync_device(n, NULL); /* its rows live elsewhere */
  dlrec_row_range ranges[DLREC_MAX_SPARSE];
  for (uint32_t c = 0; c < n->schema.n_sparse; c++)
    ranges[c] = (dlrec_row_range){n->schema.sparse[c].id_begin, n->schema.sparse[c].id_end};
  dlrec_status s = dlrec_store_init_uniform(n->store, ranges, n->schema.n_sparse, seed);
  return s == DLREC_OK ? dlrec_net_sync_device(n, NULL) : s;
}

dlrec_status dlrec_net_set_backend(dlrec_net *n, dlrec_backend *be) {
  if (!be) be = dlrec_backend_default();
  dlrec_status s = net_device_check(n, be);
  if (s != DLREC_OK) return s;
  if (be == n->be && (be->host_memory || n->dev_be == be)) return DLREC_OK; /* the copies stay as they are */
  if (n->dev_be && n->dev_be != be) { /* leaving a device: its copies come home first */
    n->be = n->dev_be;
    if ((s = dlrec_net_sync_host(n, NULL)) != DLREC_OK) return s;
    net_device_drop(n);
  }
  dlrec_backend *old = n->be;
  n->be = be;
  if ((s = dlrec_net_sync_device(n, NULL)) != DLREC_OK) n->be = old;
  return s;
}
dlrec_backend *dlrec_net_backend(const dlrec_net *n) { return n->be; }

void dlrec_net_set_keep_operands(dlrec_net *n, int on) { n->keep_off = !on; }

dlrec_status dlrec_net_set_host_table(dlrec_net *n, int host) {
  if (n->dev_be && !host != !n->host_table)
    return dlrec_error(DLREC_ERR_INVALID, "the table's place is set before the network is on %s",
                       n->dev_be->describe);
  n->host_table = host != 0;
  net_stage_pick(n);
  return DLREC_OK;
}
int dlrec_net_host_table(const dlrec_net *n) { return n->host_table; }

dlrec_status dlrec_net_set_hot_fraction(dlrec_net *n, float fraction) {
  if (!(fraction >= 0.0f && fraction <= 1.0f))
    return dlrec_error(DLREC_ERR_INVALID, "the hot rows' fraction %g is not in [0, 1]", (double)fraction);
  if (n->dev_be && fraction != n->hot_fraction)
    return dlrec_error(DLREC_ERR_INVALID, "the hot rows are set before the network is on %s", n->dev_be->describe);
  n->hot_fraction = fraction;
  /* Per column, the first ceil(fraction x its rows); none in a multi-hot
   * column pooled by its mean (a bag split in two would average each part
   * over its own rows). */
  n->hot_total = 0;
  n->hot_runs = 0;
  for (uint32_t c = 0; c < n->schema.n_sparse; c++) {
    const dlrec_sparse_col *col = &n->schema.sparse[c];
    const int mean = n->plan.pooling == DLREC_BAG_MEAN || n->mean_cols[c];
    const uint64_t rows = col->id_end - col->id_begin;
    uint64_t hot = (uint64_t)ceil((double)fraction * (double)rows);
    if (hot > rows || n->schema.keys) hot = n->schema.keys ? 0 : rows;
    if (mean && col->max_hotness > 1) hot = 0;
    n->hot_rows[c] = hot;
    n->hot_base[c] = n->hot_total;
    if (hot) n->hot[n->hot_runs++] = (backend_rows){col->id_begin, n->hot_total, hot};
    n->hot_total += hot;
  }
  return DLREC_OK;
}

uint64_t dlrec_net_hot_rows(const dlrec_net *n) { return n->host_table ? n->hot_total : 0; }

const dlrec_net_config *dlrec_net_get_config(const dlrec_net *n) { return &n->config; }
const dlrec_schema *dlrec_net_schema(const dlrec_net *n) { return &n->schema; }
float *dlrec_net_dense_params(dlrec_net *n, size_t *count) {
  *count = n->plan.n_params;
  return n->params;
}
const float *dlrec_net_dense_params_const(const dlrec_net *n, size_t *count) {
  *count = n->plan.n_params;
  return n->params;
}
dlrec_table *dlrec_net_table(dlrec_net *n) { return n->table; }
const dlrec_table *dlrec_net_table_const(const dlrec_net *n) { return n->table; }
dlrec_store *dlrec_net_store(const dlrec_net *n) { return n->store; }
uint32_t dlrec_net_n_tensors(const dlrec_net *n) { return n->plan.n_tensors; }
int dlrec_net_pools_mean(const dlrec_net *n, uint32_t c) {
  return n->plan.pooling == DLREC_BAG_MEAN || (c < n->schema.n_sparse && n->mean_cols[c]);
}
const dlrec_net_tensor *dlrec_net_tensors(const dlrec_net *n) { return n->plan.tensors; }

dlrec_status net_config_pooling(const cJSON *o, const char *what, dlrec_bag_mode *pooling) {
  const char *pool = NULL;
  dlrec_status s = dlrec_json_get_string_or(o, "pooling", what, NULL, &pool);
  if (s != DLREC_OK || !pool) return s;
  if (!strcmp(pool, "sum")) *pooling = DLREC_BAG_SUM;
  else if (!strcmp(pool, "mean")) *pooling = DLREC_BAG_MEAN;
  else return dlrec_error(DLREC_ERR_INVALID, "%s: field 'pooling': '%s' is not one of sum, mean", what, pool);
  return DLREC_OK;
}

const char *net_pooling_name(dlrec_bag_mode pooling) { return pooling == DLREC_BAG_MEAN ? "mean" : "sum"; }

dlrec_status net_config_widths(const cJSON *o, const char *key, const char *what, uint32_t min_n, uint32_t max_n,
                               uint32_t *n, uint32_t *w) {
  const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!a) return DLREC_OK;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) < (int)min_n || cJSON_GetArraySize(a) > (int)max_n)
    return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s': expected an array of %u to %u layer widths", what, key,
                       min_n, max_n);
  uint32_t i = 0, v[DLREC_MLP_MAX_LAYERS];
  for (const cJSON *e = a->child; e; e = e->next, i++) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > 65536 || floor(e->valuedouble) != e->valuedouble)
      return dlrec_error(DLREC_ERR_INVALID, "%s: field '%s[%u]': expected a width in [1, 65536]", what, key, i);
    v[i] = (uint32_t)e->valuedouble;
  }
  memset(w, 0, DLREC_MLP_MAX_LAYERS * sizeof *w);
  memcpy(w, v, i * sizeof *w);
  *n = i;
  return DLREC_OK;
}

cJSON *net_widths_json(const uint32_t *w, uint32_t n) {
  cJSON *a = cJSON_CreateArray();
  for (uint32_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(w[i]));
  return a;
}
