/* The training configuration: a JSON file (docs/config.md) read into a
 * struct with every value checked. Unknown keys are errors, so a typo is
 * reported rather than silently ignored; missing keys take the defaults of
 * dlrec_train_config_default (the Criteo Kaggle DLRM). */
#ifndef DLREC_TRAIN_CONFIG_H
#define DLREC_TRAIN_CONFIG_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "core/options.h"
#include "model/model.h"
#include "core/status.h"
#include "embed/store.h"

/* training.table_placement: where the embedding table lives on a device
 * whose memory is not the host's (a GPU): auto (the device when the table,
 * its optimizer state, the dense part and the workspaces fit its memory,
 * else the host), device (mirrored there), host (in host memory, the bag
 * ops on the CPU: dlrec_net_set_host_table). No effect on the CPU. */
typedef enum dlrec_table_placement {
  DLREC_TABLE_PLACEMENT_AUTO = 0,
  DLREC_TABLE_PLACEMENT_DEVICE = 1,
  DLREC_TABLE_PLACEMENT_HOST = 2
} dlrec_table_placement;

/* training.hot_fraction "auto". */
#define DLREC_HOT_FRACTION_AUTO (-1.0f)

/* training.hot_fraction "auto" resolved: the share of a table of `rows`
 * rows of `row_bytes` bytes each (with their optimizer state) that 90% of
 * `available` device bytes hold once `rest` (the run's other device
 * memory) and `fixed` (the hot rows' per-batch buffers) are taken; 0 when
 * none fit, at most 1. */
float dlrec_hot_fraction_fit(uint64_t available, uint64_t rest, uint64_t fixed, uint64_t rows, uint64_t row_bytes);

/* training.table_placement's and training.hot_fraction's rule, the one
 * training and scoring follow, for a network with categorical columns on
 * `device` (dlrec_device_memory's name), whose memory is not the host's: 1
 * when its table stays in host memory, with *hot the share of each
 * column's rows (its most frequent values) mirrored on the device too
 * (0 when the table is on the device). The table stays on the host when
 * `place` says so, when a store other than RAM's holds it (`kind`), and on
 * auto when the run's `need` bytes on the device with the table are more
 * than the device has available (its memory unknown: the device). Hot
 * rows: `hot_fraction` when set; on auto, none unless auto placement moved
 * the table, and then what dlrec_hot_fraction_fit gives for `rest` (the
 * run's device bytes without the table), `fixed`, `rows` and `row_bytes`. */
int dlrec_table_on_host(const char *device, dlrec_table_placement place, dlrec_store_kind kind, float hot_fraction,
                        uint64_t need, uint64_t rest, uint64_t fixed, uint64_t rows, uint64_t row_bytes, float *hot);

/* training.loss_scale: "auto" (dynamic in fp16, none otherwise), "dynamic",
 * "none", or a fixed power of two (dlrec_net_optim's loss scaling). */
typedef enum dlrec_loss_scaling {
  DLREC_LOSS_SCALING_AUTO = 0,
  DLREC_LOSS_SCALING_DYNAMIC = 1,
  DLREC_LOSS_SCALING_NONE = 2,
  DLREC_LOSS_SCALING_FIXED = 3
} dlrec_loss_scaling;

typedef struct dlrec_train_config {
  char name[64];                       /* the model's name (serving uses it); default "dlrm" */
  dlrec_net_config model;              /* model.type and that type's section; default "dlrm" */
  dlrec_optim_config dense;            /* dense optimizer (lr = base rate) */
  dlrec_sparse_optim_config sparse;    /* sparse optimizer (lr = base rate) */
  /* Schedule: lr scale rises linearly over warmup_steps, stays 1, then from
   * decay_start_step decays polynomially ((1 - t)^decay_power) to
   * min_lr_scale over decay_steps (the DLRM reference's schedule). */
  uint64_t warmup_steps, decay_start_step, decay_steps;
  double decay_power, min_lr_scale;
  uint32_t batch_size;
  uint32_t epochs;
  uint64_t max_steps;                  /* 0: no limit beyond epochs */
  uint32_t threads;                    /* 0: all cores */
  dlrec_precision precision;           /* of the dense layers' GEMMs (backend/backend.h); default fp32 */
  const char *device;                  /* training.device's backend: "cpu" (default) or "cuda" (static) */
  uint32_t device_index;               /* and its device: "cuda:N" gives N */
  dlrec_table_placement table_placement; /* training.table_placement; default auto */
  /* training.hot_fraction: with the table in host memory on a device, the
   * share of each column's rows (its most frequent) kept on the device too
   * (dlrec_net_set_hot_fraction), or DLREC_HOT_FRACTION_AUTO (the default):
   * what the device's memory holds when auto placement put the table on the
   * host for want of it, none when the config asked for the host */
  float hot_fraction;
  dlrec_loss_scaling loss_scaling;     /* training.loss_scale; default auto */
  float loss_scale;                    /* FIXED: the scale */
  uint32_t loss_scale_growth_interval; /* dynamic: finite steps in a row that double the scale; default 2000 */
  uint64_t seed;
  int deterministic;                   /* bitwise reproducible runs (fixed thread counts) */
  double target_auc;                   /* stop once validation AUC reaches it; 0 = off */
  uint64_t eval_interval_steps;        /* 0: evaluate at the end only */
  uint32_t eval_batch_size;
  uint64_t eval_max_rows;              /* 0: the whole validation file */
  uint64_t eval_train_rows;            /* score this many rows of the first training file at each validation too
                                          (the report's training curves); 0: off */
  uint64_t checkpoint_interval_steps;  /* 0: checkpoint at the end only */
  uint32_t checkpoint_keep;            /* checkpoints kept (newest first), >= 1 */
  /* tiered and hash tables: a checkpoint journals the rows changed since the last
   * full one while they are at most this fraction of the table (0: every
   * checkpoint full; docs/formats.md "Journaled checkpoints") */
  double checkpoint_journal_max_fraction;
  uint64_t log_interval_steps;
  /* Validation-driven control (docs/config.md; the state machine is
   * dlrec_valid_observe). All off by default. */
  int eval_every_epoch;                /* validate after every epoch too */
  int eval_metric;                     /* the monitored metric: DLREC_VALID_AUC or DLREC_VALID_LOGLOSS */
  uint32_t early_stop_patience;        /* stop after this many validations without improvement; 0 = off */
  double early_stop_min_delta;         /* an improvement must exceed this */
  double plateau_factor;               /* lr scale x factor on a plateau; 1 = off */
  uint32_t plateau_patience;           /* validations without improvement tolerated before a cut */
  uint32_t plateau_cooldown;           /* validations after a cut before counting again */
  double plateau_min_delta;            /* an improvement must exceed this */
  double plateau_min_scale;            /* the plateau factor never goes below this */
  int keep_best;                       /* keep RUN/best, the checkpoint of the best validation */
  int restore_best;                    /* the final report evaluates RUN/best */
  float clip_grad_norm;                /* clip the global gradient norm to this; 0 = off */
  /* Where the embedding table lives (embed/store.h; docs/config.md "storage"). */
  dlrec_store_kind storage;            /* default ram */
  uint64_t storage_cache_rows;         /* tiered: rows resident in RAM; hash: the table's rows */
  char storage_path[1024];             /* tiered: the table's file; "" = RUN/table.tiered */
  /* hash: admission, eviction, expiry and new rows (embed/store.h) */
  uint32_t storage_admit_min_count;    /* a key gets a row at its n-th sighting (1: the first) */
  double storage_admit_probability;    /* or with this probability per sighting; 0: off */
  int storage_evict;                   /* dlrec_hash_evict: LRU (default) or LFU */
  uint64_t storage_ttl_steps;          /* rows unseen this many steps are freed; 0: never */
  double storage_init_range;           /* new rows uniform in +-this; 0: sqrt(columns / rows) */
  /* The Redis tier: trained rows published for servers (docs/serving.md) */
  char publish_redis[256];             /* HOST:PORT; "" = off */
  char publish_prefix[201];            /* the rows' key prefix; "" = dlrec:NAME */
  uint64_t publish_interval_steps;     /* publish every N steps (and at the end); default 10 */
  uint32_t publish_timeout_ms;         /* per Redis call; default 200 */
  /* Across ranks (docs/distributed.md): a column with more than this share
   * of a rank's fair part of the table's bytes is split row-wise; default 0.5 */
  double dist_rowwise_share;
  /* Seconds one collective may wait for the other ranks before the job is
   * ended, naming the ranks that stalled; 0: forever. Default 300. */
  double dist_timeout_s;
  /* loader */
  int shuffle;
  uint32_t window_groups, slice_rows, prefetch;
} dlrec_train_config;

/* The config's options, one row each (config_options.c): the reader, the
 * writer, the defaults and docs/config.md's reference come from it. */
extern const dlrec_option dlrec_train_config_options[];

/* The options' reference, the Markdown table of docs/config.md's "Option
 * reference" (`dlrec options config`); malloc'd, NULL when out of memory. */
char *dlrec_train_config_reference(void);

/* The Criteo Kaggle DLRM (model type "dlrm" with its defaults: embedding
 * dim 16, bottom 512-256-64-16, top 512-256-1), SGD lr 0.1 for both, batch
 * 128, one epoch, seed 1. */
void dlrec_train_config_default(dlrec_train_config *c);

/* training.device as the config writes it: "cpu" or "cuda:N". */
void dlrec_train_config_device(const dlrec_train_config *c, char *buf, size_t size);

/* Reads and validates a config; errors name the file and the field
 * ("cfg.json: field 'optimizer.dense.type': expected one of sgd, adam, adagrad"). */
dlrec_status dlrec_train_config_read(const char *path, dlrec_train_config *c);
/* The same from parsed JSON; `what` names its source in errors. */
dlrec_status dlrec_train_config_from_json(const cJSON *j, const char *what, dlrec_train_config *c);

/* The table storage the config asks for, for data of n_sparse columns
 * (path: a tiered table's file, resolved by the caller). */
dlrec_store_config dlrec_train_config_store(const dlrec_train_config *c, uint32_t n_sparse, const char *path);

/* The complete config as JSON (every field, defaults included), so a
 * checkpoint records exactly what ran. The caller frees it (cJSON_Delete). */
cJSON *dlrec_train_config_to_json(const dlrec_train_config *c);

/* The learning-rate scale of the schedule at 1-based step `step` (the
 * plateau factor, if any, multiplies it: dlrec_valid_state.plateau_scale). */
double dlrec_lr_scale(const dlrec_train_config *c, uint64_t step);

/* ---- validation-driven control (plateau.c) ------------------------------- */

enum { DLREC_VALID_AUC = 0, DLREC_VALID_LOGLOSS = 1 };

/* What the validations of a run have decided so far; a checkpoint stores it,
 * so a resumed run continues with the same counters and factor. Metric
 * values are as measured (AUC or logloss); NaN means "none yet". */
typedef struct dlrec_valid_state {
  uint64_t validations;     /* validations observed */
  double best;              /* the best metric so far (strictly better wins) */
  uint64_t best_step;       /* the step it was measured at */
  double stop_best;         /* early stopping's reference (improved by more than its min_delta) */
  uint32_t stop_bad;        /* validations since that reference */
  double plateau_best;      /* the plateau's reference (improved by more than its min_delta) */
  uint32_t plateau_bad;     /* validations since, not counting the cooldown */
  uint32_t plateau_cooldown;/* validations left in the cooldown */
  double plateau_scale;     /* the learning-rate factor: 1, then x factor per plateau */
} dlrec_valid_state;

/* What one validation decided. */
typedef struct dlrec_valid_outcome {
  int improved; /* a new best: RUN/best is written (checkpoint.keep_best) */
  int reduced;  /* plateau_scale was cut */
  int stop;     /* early stopping: the run ends here */
} dlrec_valid_outcome;

/* No validation yet: every best NaN, counters 0, plateau_scale 1. */
void dlrec_valid_state_init(dlrec_valid_state *s);

/* Feeds one validation's metric, measured after step `step`, into s with
 * c's rules (PyTorch ReduceLROnPlateau for the plateau, with an absolute
 * threshold; Keras EarlyStopping for the stop), and says what it decided in
 * *o. A NaN metric (an AUC of one-class data) never improves. */
void dlrec_valid_observe(const dlrec_train_config *c, dlrec_valid_state *s, double metric, uint64_t step,
                         dlrec_valid_outcome *o);

#endif
