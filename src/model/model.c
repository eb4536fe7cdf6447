/* A network: its type's plan and context, its parameters and its table,
 * and where they live. The registry of types is registry.c; the passes over
 * a network live in net_pass.c, its embedding stages in stage_*.c
 * (model/stage.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "model/model_type.h"

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
  if (!t) return net_type_unknown("model", c->type);
  dlrec_net *n = calloc(1, sizeof *n);
  if (!n) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  n->type = t;
  n->be = dlrec_backend_default();
  n->config = *c;
  n->schema = *schema;
  n->plan.type = t;
  /* The type's context, zeroed, which its plan fills and the network frees. */
  n->ctx = calloc(1, t->ctx_size ? t->ctx_size : 1);
  dlrec_status s = n->ctx ? t->plan(c->params, schema, &n->plan, n->ctx) : dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  if (s == DLREC_OK) s = net_plan_finish(&n->plan);
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
  /* Every named column must be the data's; a hash table draws each row by
   * its key, which does not say its column. */
  dlrec_row_range ranges[DLREC_MAX_SPARSE];
  dlrec_store_config hashed;
  if (s == DLREC_OK && schema->n_sparse) s = dlrec_net_config_ranges(c, schema, ranges);
  if (s == DLREC_OK && kind == DLREC_STORE_HASH && c->embedding_init.n_columns)
    s = dlrec_error(DLREC_ERR_INVALID, "model.embedding_init.columns: a hash table (storage.kind \"hash\") draws a row "
                                       "by its key, not its column: give one initializer for every column");
  if (s == DLREC_OK && kind == DLREC_STORE_HASH) {
    hashed = *storage;
    hashed.init = c->embedding_init.all;
    storage = &hashed;
  }
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
  free(n->ctx);
  dlrec_store_free(n->store);
  free(n->params);
  free(n);
}

/* model.bias_init "zeros": every tensor named "bias" or "*.bias" zeroed
 * (the weights keep their draws, the same as with "normal"). */
static void zero_biases(dlrec_net *n) {
  for (uint32_t i = 0; i < n->plan.n_tensors; i++) {
    const dlrec_net_tensor *t = &n->plan.tensors[i];
    const size_t len = strlen(t->name);
    if (!strcmp(t->name, "bias") || (len > 5 && !strcmp(t->name + len - 5, ".bias")))
      memset(n->params + t->offset, 0, t->count * sizeof(float));
  }
}

dlrec_status dlrec_net_init(dlrec_net *n, uint64_t seed) {
  n->type->init(n->ctx, &n->plan, n->params, seed);
  if (n->config.bias_init == DLREC_BIAS_INIT_ZEROS) zero_biases(n);
  /* A hash table draws each row when its key is admitted; a tableless
   * network's rows live elsewhere. */
  dlrec_status s = DLREC_OK;
  if (dlrec_store_get_kind(n->store) != DLREC_STORE_HASH && !n->tableless) {
    dlrec_row_range ranges[DLREC_MAX_SPARSE];
    s = dlrec_net_config_ranges(&n->config, &n->schema, ranges);
    if (s == DLREC_OK) s = dlrec_store_init_uniform(n->store, ranges, n->schema.n_sparse, seed);
  }
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
    const int mean = n->plan.pooling == DLREC_POOLING_MEAN || n->mean_cols[c];
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
  return n->plan.pooling == DLREC_POOLING_MEAN || (c < n->schema.n_sparse && n->mean_cols[c]);
}
const dlrec_net_tensor *dlrec_net_tensors(const dlrec_net *n) { return n->plan.tensors; }

