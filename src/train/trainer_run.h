/* A training run's state (private to src/train/: trainer.c's loop and the
 * trainer_*.c files beside it), and what those files give each other:
 *   trainer_setup.c   the run made and freed, resumed or started, checkpointed
 *   trainer_memory.c  the config read, the memory plan (--plan), the table placed
 *   trainer_log.c     metrics.jsonl's lines, the result, summary.json
 *   trainer_valid.c   validations, the best checkpoint's evaluation
 *   trainer_follow.c  training on the files of a followed directory
 *   trainer_ranks.c   what the ranks of a job agree on and do together
 *   evaluate.c        scoring and evaluating .dlr files (trainer.h's API)
 */
#ifndef DLREC_TRAIN_TRAINER_RUN_H
#define DLREC_TRAIN_TRAINER_RUN_H

#include <stdio.h>

#include "core/progress.h"
#include "dist/dist.h"
#include "train/checkpoint.h"
#include "train/publish.h"
#include "train/step.h"
#include "train/trainer.h"

typedef struct run {
  const dlrec_train_args *a;
  dlrec_train_config cfg;
  char metrics_path[4096];
  FILE *metrics;
  dlrec_backend *be; /* the run's: training.threads and training.precision; the model borrows it */
  dlrec_net *model;
  dlrec_net_ws *ws;
  dlrec_net_optim opt;
  dlrec_step step; /* what each training step runs on (train/step.h) */
  dlrec_checkpoint_journal journal; /* journaled checkpoints of a tiered table */
  dlrec_loader *loader; /* following a directory: the current file's, or NULL between files */
  dlrec_train_progress prog;
  /* --follow: the options and schema each file's loader is opened with, and
   * the current file's rows. */
  dlrec_loader_opts lo;
  dlrec_schema schema;
  uint64_t follow_rows;
  double follow_idle; /* seconds spent waiting for a new file, or for one's writer to finish it */
  uint64_t files_rejected; /* files this run moved into DIR/.rejected/ */
  publisher *pub;     /* publish.redis: trained rows to the Redis tier; NULL: off */
  uint32_t etl_crc;   /* the ETL state's checksum (dlrec_etl_state_crc), which published rows carry */
  /* Across ranks (a->comm of more than one rank): this rank's part of each
   * batch, its shard of the table and the exchanges (dist/dist.h). No
   * rank holds the whole table; rank 0 alone writes into RUN. */
  int rank, ranks;
  dlrec_shard_plan plan;
  dlrec_sharded *sh;
  int lock_fd; /* RUN/lock, held while the run writes into RUN; -1 if not */
  /* The last validation of this run (its step and metrics), so that the
   * final report reuses one made at the last step rather than repeating it,
   * and the step of the last checkpoint this run saved (UINT64_MAX: none). */
  int has_last_valid;
  uint64_t last_valid_step, last_ckpt_step;
  dlrec_metrics last_valid;
  int stop;             /* a stop was requested (sticky) */
  /* on_progress: when it was last called, and the loop's start, its
   * samples then and the planned total. */
  double last_progress, loop_start;
  uint64_t start_samples, total_samples;
} run;

/* trainer_setup.c */
int run_stop_requested(run *r); /* whether the host asked the run to stop (args.stop); sticky */
void run_report_progress(run *r, const dlrec_train_result *res, int force, int done);
void run_free(run *r);
dlrec_status run_checkpoint_now(run *r);
dlrec_status run_setup(run *r);
dlrec_status run_start(run *r, const dlrec_row_source *rows);

/* trainer_memory.c */
uint32_t run_rows_per_rank(uint32_t batch, int ranks);
dlrec_status run_read_config(const dlrec_train_args *a, dlrec_train_config *cfg);
uint32_t run_cores_share(long ranks);
dlrec_status run_make_plan(const dlrec_train_config *cfg, dlrec_net *net, int ranks, dlrec_shard_plan *p,
                           uint64_t *dense_bytes);
uint32_t run_part_rows(const dlrec_train_config *cfg, int ranks);
uint64_t run_ws_bytes(const dlrec_train_config *cfg, const dlrec_net *net, int ranks, uint32_t threads,
                      dlrec_precision precision);
dlrec_status run_check_memory(run *r);

/* trainer_log.c */
dlrec_status run_log_json(run *r, cJSON *j);
dlrec_status run_truncate_metrics(const char *path, uint64_t step);
cJSON *run_step_json(const run *r, double loss, double lr_scale, double rate);
void run_write_summary(const dlrec_train_args *a, const dlrec_train_result *res);

/* trainer_valid.c */
dlrec_status run_evaluate_file(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out);
dlrec_status run_evaluate_now(run *r, dlrec_metrics *out);
dlrec_status run_evaluate_train(run *r, dlrec_metrics *out, int *has);
dlrec_status run_validate(run *r, dlrec_train_result *res, double scale, double loss, int epoch_end,
                          dlrec_progress *bar, int *stop);
dlrec_status run_evaluate_best(run *r, dlrec_train_result *res);

/* trainer_follow.c */
dlrec_status run_follow_open(run *r, const char *file);
dlrec_status run_follow_next(run *r, const dlrec_batch **b);

/* trainer_ranks.c */
dlrec_row_source run_shard_rows(run *r);
dlrec_status run_dist_agree(run *r, dlrec_status s);
dlrec_status run_dist_start(run *r);
dlrec_status run_dist_status(run *r, dlrec_status s, void *shared, size_t bytes);
dlrec_status run_dist_checkpoint(run *r);
dlrec_status run_dist_step_agree(run *r, dlrec_status ls, uint32_t rows, uint32_t *global, uint32_t *base, int *stop,
                                 uint32_t *each);
dlrec_status run_dist_evaluate(run *r, const char *path, uint64_t max_rows, dlrec_metrics *out);

/* evaluate.c */
dlrec_status run_open_scoring(dlrec_loader **ld, const dlrec_net *m, const char *const *paths, int n_paths,
                              uint32_t batch, uint32_t part, uint32_t parts);

#endif
