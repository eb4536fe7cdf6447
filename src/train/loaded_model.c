/* A checkpoint loaded for scoring (train/loaded_model.h): evaluation,
 * prediction, serving and the host API load models so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/log.h"
#include "train/checkpoint_impl.h"
#include "train/loaded_model.h"

void dlrec_model_free(dlrec_model *m) {
  if (!m) return;
  dlrec_net_free(m->net);
  dlrec_etl_free(m->etl);
  free(m);
}

dlrec_status dlrec_model_load(const char *path, dlrec_model **out) {
  *out = NULL;
  dlrec_model *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  manifest man;
  memset(&man, 0, sizeof man);
  dlrec_status s = dlrec_checkpoint_resolve(path, m->dir, sizeof m->dir);
  if (s == DLREC_OK) s = ckpt_read_manifest(m->dir, &man);
  m->progress = man.p;
  if (s == DLREC_OK) s = ckpt_read_config(m->dir, &man, &m->config);
  if (s == DLREC_OK) s = ckpt_load_etl(m->dir, &man, &m->etl);
  /* A hash table's model scores through its table (its keys name its
   * rows); the others load their table into RAM (a mapping of table.bin). */
  const dlrec_store_config sc = dlrec_train_config_store(&m->config, m->etl ? dlrec_etl_schema(m->etl)->n_sparse : 0,
                                                         NULL);
  if (s == DLREC_OK)
    s = dlrec_net_create_stored(&m->net, &m->config.model, dlrec_etl_schema(m->etl),
                                m->config.storage == DLREC_STORE_HASH ? &sc : NULL);
  uint32_t *rows = NULL;
  if (s == DLREC_OK) s = ckpt_read_params(m->dir, &man, m->net, NULL, &rows, NULL, NULL);
  free(rows);
  if (s != DLREC_OK) {
    dlrec_error_context("loading checkpoint %s: ", path);
    dlrec_model_free(m);
    return dlrec_last_status();
  }
  *out = m;
  return DLREC_OK;
}

dlrec_status dlrec_model_set_backend(dlrec_model *m, dlrec_backend *be) {
  const dlrec_table_placement place = m->config.table_placement;
  int host = 0;
  float hot = 0.0f;
  if (be && !dlrec_backend_host_memory(be) && dlrec_net_schema(m->net)->n_sparse) {
    /* Scoring needs the table and the dense parameters there: its
     * workspaces are small beside a table too big for the device. */
    const dlrec_store_kind kind = dlrec_store_get_kind(dlrec_net_store(m->net));
    const dlrec_table *t = dlrec_net_table_const(m->net);
    size_t n_params;
    dlrec_net_dense_params_const(m->net, &n_params);
    const uint64_t row_bytes = dlrec_table_stride(t) * (uint64_t)dlrec_table_dtype_bytes(dlrec_table_get_dtype(t));
    const uint64_t params = (uint64_t)n_params * sizeof(float);
    char device[64];
    const char *name = dlrec_backend_name(be);
    if (strcmp(name, "cuda")) snprintf(device, sizeof device, "%s", name);
    else snprintf(device, sizeof device, "cuda:%u", dlrec_backend_device_index(be));
    host = dlrec_table_on_host(device, place, kind, m->config.hot_fraction, dlrec_table_rows(t) * row_bytes + params,
                               params, 0, dlrec_table_rows(t), row_bytes, &hot);
    if (host && kind != DLREC_STORE_RAM)
      DLREC_INFO("the table stays in host memory (storage.kind \"%s\"); its bag ops run on the CPU",
                 dlrec_store_kind_name(kind));
    else if (host)
      DLREC_INFO("the table stays in host memory (training.table_placement %s); its bag ops run on the CPU",
                 place == DLREC_TABLE_PLACEMENT_HOST ? "host" : "auto: the device cannot hold it");
  }
  dlrec_status s = dlrec_net_set_host_table(m->net, host);
  if (s == DLREC_OK && host && dlrec_store_get_kind(dlrec_net_store(m->net)) == DLREC_STORE_RAM)
    s = dlrec_net_set_hot_fraction(m->net, hot);
  if (s == DLREC_OK && dlrec_net_hot_rows(m->net))
    DLREC_INFO("%llu hot rows (training.hot_fraction %s%.3g of each column's, its most frequent values) on the "
               "device too; their lookups run there", (unsigned long long)dlrec_net_hot_rows(m->net),
               m->config.hot_fraction < 0 ? "auto: " : "", (double)hot);
  return s == DLREC_OK ? dlrec_net_set_backend(m->net, be) : s;
}
