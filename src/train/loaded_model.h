/* A checkpoint loaded for scoring: what evaluation, prediction, serving and
 * the host API score with (loaded_model.c). */
#ifndef DLREC_TRAIN_LOADED_MODEL_H
#define DLREC_TRAIN_LOADED_MODEL_H

#include "backend/backend.h"
#include "train/checkpoint.h"

/* A model loaded from a checkpoint, for evaluation, prediction and serving. */
typedef struct dlrec_model {
  char dir[1024];           /* the checkpoint directory */
  dlrec_train_config config;
  dlrec_etl *etl;           /* the checkpoint's ETL state */
  dlrec_net *net;          /* the network, of the config's model.type */
  dlrec_train_progress progress;
} dlrec_model;

/* Loads the checkpoint at `path` (see dlrec_checkpoint_resolve): config,
 * ETL state, parameters, after checking every file's size and checksum.
 * The caller frees *out with dlrec_model_free. */
dlrec_status dlrec_model_load(const char *path, dlrec_model **out);
void dlrec_model_free(dlrec_model *m); /* accepts NULL */
/* dlrec_net_set_backend for a loaded model, its table placed as its
 * training.table_placement says: on a device whose memory is not the
 * host's, "host" keeps the table in host memory (dlrec_net_set_host_table),
 * "device" mirrors it there, and "auto" keeps it on the host when the
 * table and the dense parameters do not fit the device's available memory
 * (logged). What eval, predict and serve call. */
dlrec_status dlrec_model_set_backend(dlrec_model *m, dlrec_backend *be);

#endif
