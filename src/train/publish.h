/* Publishing trained rows to the Redis tier (publish.redis in the config;
 * docs/serving.md, "The Redis tier"): the trainer notes the rows each step
 * trains (ids, or a hash table's raw keys) and, every
 * publish.interval_steps and at the end, writes their current values to
 * Redis with the step, tagged with the run (its id and ETL state's
 * checksum), so that servers refuse them unless they serve that run. Redis
 * down, slow or answering errors: the rows wait for the next publish
 * (deduplicated, so at most one entry a row), the failure is counted and
 * logged, and training goes on. Tables in RAM (ram, hash); a tiered
 * table's rows are not in RAM. */
#ifndef DLREC_TRAIN_PUBLISH_H
#define DLREC_TRAIN_PUBLISH_H

#include "core/redis_rows.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/train_config.h"

typedef struct publisher publisher;

typedef struct publish_stats {
  uint64_t rows;      /* rows written */
  uint64_t publishes; /* publishes that reached Redis */
  uint64_t errors;    /* publishes that did not */
  uint64_t pending;   /* rows waiting for the next */
} publish_stats;

/* run: the run whose rows these are (its id not 0). */
dlrec_status publisher_create(publisher **p, const dlrec_train_config *c, const dlrec_net *net,
                              const dlrec_redis_run *run);
void publisher_free(publisher *p); /* accepts NULL */
/* Notes the rows of a trained batch (as the loader gave it: ids or keys). */
dlrec_status publisher_note(publisher *p, const dlrec_batch *b, uint32_t n_sparse);
/* Writes the noted rows' current values and the step; failures are counted. */
void publisher_publish(publisher *p, const dlrec_net *net, uint64_t step);
void publisher_stats(const publisher *p, publish_stats *out);
/* A new run's id (dlrec_train_progress.run_id): 64 random bits, never 0. */
uint64_t publisher_new_run_id(void);

#endif
