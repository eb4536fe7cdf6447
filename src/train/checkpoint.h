/* Checkpoints of a training run (the models that evaluation, prediction and
 * serving load from them: train/loaded_model.h).
 *
 * A run directory RUN holds checkpoints RUN/ckpt-STEP/ and a file RUN/latest
 * naming the newest complete one; with checkpoint.keep_best, a file RUN/best
 * names the checkpoint of the best validation, which pruning never removes. A checkpoint is written as
 * RUN/ckpt-STEP.tmp/, every file fsync'd, then renamed, then `latest` is
 * replaced atomically, so a crash at any moment leaves the previous
 * checkpoint intact and `latest` pointing at a complete one. Contents
 * (docs/formats.md):
 *   manifest.json     format version, progress (step, samples, loader
 *                     position, the loss sums since the last metrics line,
 *                     the validation state: best, early-stopping and
 *                     plateau counters, the plateau's lr factor),
 *                     the model type and its tensors' names and shapes,
 *                     every other file with its size and CRC32C, and a
 *                     CRC32C of the manifest itself
 *   config.json       the complete training config
 *   etl/              the ETL state the data was encoded with
 *   dense.bin         the named dense tensors     } tensor files: header,
 *   table.bin         the fused embedding table   } arrays with a CRC32C
 *   optim.bin         optimizer state (dense and sparse)  each
 * A torn, truncated, corrupt or edited checkpoint is refused with an error
 * naming the file; so is one whose config or ETL state does not match the
 * run resuming.
 */
#ifndef DLREC_CHECKPOINT_H
#define DLREC_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "data/etl.h"
#include "data/loader.h"
#include "core/status.h"
#include "model/row_source.h"
#include "train/train_config.h"

/* 3: the manifest records the model type and its named dense tensors
 * (name and shape), and dense.bin holds one array per tensor. 2: the
 * manifest carries a checksum of itself and of every file. Older
 * checkpoints are refused with DLREC_ERR_VERSION. */
#define DLREC_CHECKPOINT_VERSION 3

typedef struct dlrec_train_progress {
  uint64_t step;           /* optimizer steps done */
  uint64_t samples;        /* samples trained on */
  dlrec_position position; /* the loader's position after the last trained batch */
  double valid_auc;        /* the last validation AUC; NaN if none yet */
  /* The training loss summed over the rows since the last metrics line, and
   * those rows: a resumed run's next line then averages the same steps as
   * an uninterrupted run's. */
  double loss_sum;
  uint64_t loss_rows;
  /* Loss scaling's state (dlrec_net_optim's): the scale (0: none), the
   * finite steps since it last changed, the steps skipped so far. */
  float loss_scale;
  uint32_t loss_scale_good_steps;
  uint64_t skipped_steps;
  /* What the validations decided so far (best, early stopping, plateau). */
  dlrec_valid_state valid;
  /* dlrec train --follow: the file (its name in the followed directory)
   * that `position` is a position of; "" for a run on --train files. */
  char follow_file[256];
  /* The run's id: 64 random bits drawn when the run first publishes to
   * Redis (publish.redis), kept by a resumed run; its published rows carry
   * it (core/redis_rows.h). 0: the run never published (its checkpoints,
   * free of anything random, stay the same bytes for the same config). */
  uint64_t run_id;
} dlrec_train_progress;

/* Journaled checkpoints of a tiered or hash table (docs/formats.md): what a trainer
 * carries from one save to the next. A journaled checkpoint's table.bin and
 * optim.bin are hard links to those of `base` (a checkpoint directory), and
 * its journal.bin holds the rows the store recorded as changed since then
 * (dlrec_store_changes), with their optimizer state. */
typedef struct dlrec_checkpoint_journal {
  double max_fraction; /* journal while changed rows <= this fraction of the table; 0: always full */
  char base[4096];     /* a checkpoint holding the base table.bin and optim.bin; "" for none yet */
  uint64_t base_step;  /* the step of the full checkpoint that wrote them */
} dlrec_checkpoint_journal;


/* Saves model, optimizer state (opt may be NULL: a model-only checkpoint)
 * and progress as RUN/ckpt-STEP, points RUN/latest at it, and removes the
 * oldest checkpoints beyond `keep` (never the one RUN/best names; with keep
 * >= 2, never the newest one on a second base while the newest `keep` share
 * one). etl_dir's files are copied in. With j (and opt) and a store that
 * tracks changes, the checkpoint is journaled when it can be (a base, at
 * most j->max_fraction of the rows changed, with keep >= 2 a base less than
 * keep - 1 of cfg's checkpoint intervals old, the base's files linkable),
 * else full; j is updated to the new base, and a full save resets the
 * store's changes. j may be NULL: a full checkpoint. */
dlrec_status dlrec_checkpoint_save(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                   const dlrec_net *m, const dlrec_net_optim *opt,
                                   const dlrec_train_progress *p, uint32_t keep, dlrec_checkpoint_journal *j);
/* The same with the rows from src (NULL: from m's own table). */
dlrec_status dlrec_checkpoint_save_rows(const char *run_dir, const dlrec_train_config *cfg, const char *etl_dir,
                                        const dlrec_net *m, const dlrec_net_optim *opt, const dlrec_train_progress *p,
                                        uint32_t keep, dlrec_checkpoint_journal *j, const dlrec_row_source *src);

/* Points RUN/best at RUN/ckpt-STEP (which must exist), atomically. */
dlrec_status dlrec_checkpoint_mark_best(const char *run_dir, uint64_t step);

/* Resolves `path` to a checkpoint directory: path itself if it holds a
 * manifest.json, else the checkpoint that path/latest names. */
dlrec_status dlrec_checkpoint_resolve(const char *path, char *out, size_t out_size);

/* The same with a choice of pointer: `which` "latest" (or NULL) is
 * dlrec_checkpoint_resolve; "best" is the checkpoint that path/best names
 * (path must then be a run directory; a run without RUN/best is refused
 * with a message saying how to get one). */
dlrec_status dlrec_checkpoint_select(const char *path, const char *which, char *out, size_t out_size);


/* For --resume: loads parameters, optimizer state and progress of the
 * checkpoint at `path` into an existing training setup of the same config
 * (the model shape, optimizers, batch size, seed and loader settings must be
 * those the checkpoint was written with, else DLREC_ERR_INVALID says which
 * field differs) and the same encoding: the ETL state in etl_dir must encode
 * rows as the checkpoint's own etl/ does (else DLREC_ERR_INVALID names the
 * first column that differs). */
/* With j (may be NULL), j becomes the loaded checkpoint's base and, for a
 * store that tracks changes, the store's changes the rows of its journal.
 * When `path` is a run directory whose latest checkpoint is damaged
 * (DLREC_ERR_CORRUPT, _IO or _PARSE), the newest older checkpoint that
 * loads is resumed instead, with a warning for each one skipped; when none
 * loads, the latest's error. A checkpoint directory given itself, or a load
 * through src (across ranks), does not fall back. */
dlrec_status dlrec_checkpoint_load_training(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                            dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *p,
                                            dlrec_checkpoint_journal *j);
/* The same with the rows to src (NULL: into m's own table). */
dlrec_status dlrec_checkpoint_load_training_rows(const char *path, const dlrec_train_config *cfg, const char *etl_dir,
                                                 dlrec_net *m, dlrec_net_optim *opt, dlrec_train_progress *prog,
                                                 dlrec_checkpoint_journal *j, const dlrec_row_source *src);

#endif
