/* Training and evaluation runs: the loop around the model, loader,
 * optimizers, metrics and checkpoints.
 *
 * A training run writes into RUN:
 *   RUN/metrics.jsonl  one JSON object per logging interval (step, samples,
 *                      epoch, loss, lr_scale, samples_per_s (evaluations
 *                      left out); on every line
 *                      too: backend, precision (the GEMMs' resolved one,
 *                      fp32 or bf16) and bf16_native) and per
 *                      evaluation (the same plus "valid": {auc, logloss, ...,
 *                      reliability} and, with eval.train_rows, "train": the
 *                      same metrics of the training file's first rows;
 *                      "epoch_end", "best", "plateau_scale", "early_stop"
 *                      on scheduled validations; "final": true on the
 *                      end-of-run report, which a resume drops)
 *   RUN/summary.json   written when the run ends (not after an error): the
 *                      totals and time profile, as `dlrec train` prints them
 *   RUN/report.html    the training report (train/report.h), rebuilt then
 *   RUN/ckpt-STEP/     checkpoints (checkpoint.h), RUN/latest the newest,
 *                      RUN/best the best validation's (checkpoint.keep_best)
 *   RUN/lock           the run's exclusive flock, holding its pid: a second
 *                      run on RUN is refused with DLREC_ERR_INVALID naming it
 * A stop request (args.stop, which the CLI's SIGINT and SIGTERM handlers
 * set, or args.on_progress) stops at the end of the current step, saves a
 * checkpoint, and returns DLREC_OK with result.interrupted set.
 *
 * Following a directory (follow_dir): the run trains each `*.dlr` file of
 * the directory once, in name order, then waits for the next name after the
 * last one trained (polling five times a second), until a signal, max_steps
 * or follow_idle seconds without a new file. A file counts once it has its
 * .dlr name: dlrec etl apply writes NAME.dlr.tmp and renames it when done;
 * a file under its .dlr name whose writer has not finished it
 * (dlrec_dlr_unfinished) is waited for, up to follow_wait seconds. Each file
 * is checked whole (every row group's checksum, the run's schema) before its
 * first step; a bad one, or one still unfinished after follow_wait, is moved
 * into DIR/.rejected/ (a symlink itself, not its target) with NAME.reason
 * holding the error, and the run goes on (follow_strict: the run stops with
 * that error and the file stays). Each file is one pass (training.epochs
 * does not apply); eval.every_epoch validates after each file. The
 * checkpoints' position names its file, so --resume continues inside it.
 */
#ifndef DLREC_TRAINER_H
#define DLREC_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "dist/dist.h"
#include "model/model.h"
#include "train/metrics.h"
#include "core/status.h"
#include "train/train_config.h"

/* What dlrec_train_args.on_progress sees. */
typedef struct dlrec_train_progress_info {
  uint64_t step, samples;   /* so far, a resumed part included */
  uint64_t total_samples;   /* the run's planned samples; 0 when unknown (following a directory) */
  uint32_t epoch;
  double loss;              /* the mean loss of the last logging interval; NaN before one */
  double valid_auc;         /* the last validation's AUC; NaN before one */
  double samples_per_s;     /* of this process's training loop so far */
  int done;                 /* the last call: the loop has ended */
} dlrec_train_progress_info;

/* --follow: how long a file whose writer has not finished it is waited for. */
#define DLREC_FOLLOW_WAIT_DEFAULT 300.0

typedef struct dlrec_train_args {
  const char *config_path;        /* NULL: config_json, else the defaults of dlrec_train_config_default */
  const char *config_json;        /* the config as JSON text, when config_path is NULL (a host's) */
  const char *const *train;       /* .dlr files */
  int n_train;
  /* Instead of train: a directory whose .dlr files are trained one after
   * the other, in name order, each once, as they appear (see dlrec_train). */
  const char *follow_dir;
  double follow_idle;             /* --follow: stop after this many seconds without a new file; 0: never */
  double follow_wait;             /* --follow: seconds to wait for an unfinished file; 0: DLREC_FOLLOW_WAIT_DEFAULT */
  int follow_strict;              /* --follow: a bad file stops the run (left in place) instead of being moved aside */
  const char *valid;              /* a .dlr file, or NULL */
  const char *etl_dir;            /* the ETL state the files were encoded with */
  const char *run_dir;
  int resume;                     /* continue from RUN's latest checkpoint */
  int deterministic;              /* force deterministic mode (else the config's) */
  uint32_t threads;               /* 0: the config's */
  const char *device;             /* "cpu", "cuda" or "cuda:N"; NULL: the config's training.device */
  uint64_t max_steps;             /* 0: the config's */
  /* The job's ranks (dist/comm.h), which the caller opened; NULL or one
   * rank: this process alone. With more, every rank calls dlrec_train with
   * the same arguments: each trains on its part of every batch with its
   * shard of the table (dist/dist.h), and rank 0 alone writes into RUN. */
  struct dlrec_comm *comm;
  /* A stop request, polled at every step: when *stop becomes nonzero (the
   * CLI's SIGINT/SIGTERM handler sets it) the run stops after the current
   * step, saves a checkpoint and returns DLREC_OK with result.interrupted.
   * The library installs no signal handler itself: the host owns those. */
  volatile int *stop;
  /* Progress for a host (a notebook's bar), called on rank 0 after a step
   * at most five times a second, after each validation and at the end;
   * returning nonzero requests a stop as *stop does. NULL: none. */
  int (*on_progress)(void *ctx, const dlrec_train_progress_info *info);
  void *progress_ctx;
} dlrec_train_args;


/* Prints how a->config's embedding table would be sharded over `ranks`
 * ranks (dist/dist.h) and each rank's memory, from the config and the ETL
 * state alone (nothing is allocated for the table). */
dlrec_status dlrec_train_print_plan(const dlrec_train_args *a, int ranks, FILE *out);

typedef struct dlrec_train_result {
  uint64_t steps, samples;        /* totals of the run, resumed part included */
  uint64_t steps_this_run;
  double seconds;                 /* of this run's training loop */
  double samples_per_s;           /* of this run's training loop */
  double last_loss;               /* mean loss of the last logging interval */
  int has_valid;                  /* valid holds the final evaluation */
  dlrec_metrics valid;
  int interrupted;                /* stopped by a signal (a checkpoint was saved) */
  int reached_target;             /* stopped at the config's target AUC */
  int early_stopped;              /* stopped by training.early_stopping_patience */
  int restored_best;              /* valid is RUN/best's evaluation (training.restore_best) */
  uint64_t best_step;             /* the step of RUN/best when restored_best */
  dlrec_net_profile profile;     /* where this run's training steps spent their time */
  int ranks;                      /* the job's ranks (1: this process alone) */
  dlrec_sharded_stats dist;       /* ranks > 1: this rank's exchanges */
  double loader_wait;             /* seconds the loop waited for the loader's next batch */
  double idle_seconds;            /* --follow: seconds waiting for new files (in neither of the above) */
  uint64_t files_rejected;        /* --follow: files this run moved into DIR/.rejected/ */
  float loss_scale;               /* loss scaling's scale at the end (0: none; training.loss_scale) */
  uint64_t skipped_steps;         /* steps whose scaled gradients overflowed, resumed part included */
} dlrec_train_result;

dlrec_status dlrec_train(const dlrec_train_args *a, dlrec_train_result *r);

/* Scores every row of the .dlr files in order (no shuffle) with batches of
 * `batch` rows, up to max_rows (0: all), on the network's backend (its
 * threads: dlrec_net_set_backend). dlrec_evaluate computes the metrics into
 * *out (the data must be labeled); dlrec_score_files passes each prediction
 * to the callback in row order. */
typedef dlrec_status (*dlrec_score_fn)(void *ctx, const float *prob, const float *label, uint32_t n);
dlrec_status dlrec_score_files(const dlrec_net *m, const char *const *paths, int n_paths, uint32_t batch,
                               uint64_t max_rows, dlrec_score_fn fn, void *ctx);
dlrec_status dlrec_evaluate(const dlrec_net *m, const char *const *paths, int n_paths, uint32_t batch,
                            uint64_t max_rows, dlrec_metrics *out);

/* The run's totals and time profile as a JSON object: what `dlrec train`
 * prints and RUN/summary.json holds. */
struct cJSON *dlrec_train_result_to_json(const dlrec_train_args *a, const dlrec_train_result *r);

/* The metrics as a JSON object (the CLI's and metrics.jsonl's format). */
struct cJSON *dlrec_metrics_to_json(const dlrec_metrics *m);

#endif
