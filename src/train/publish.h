/* Publishing trained rows to the Redis tier (publish.redis in the config;
 * docs/serving.md, "The Redis tier"): the trainer notes the rows each step
 * trains (ids, or a hash table's raw keys) and, every
 * publish.interval_steps and at the end, writes their current values to
 * Redis with the step. Redis down or slow: the rows wait for the next
 * publish (deduplicated, so at most one entry a row), and training goes on.
 * Tables in RAM (ram, hash); a tiered table's rows are not in RAM. */
#ifndef DLREC_TRAIN_PUBLISH_H
#define DLREC_TRAIN_PUBLISH_H

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

dlrec_status publisher_create(publisher **p, const dlrec_train_config *c, const dlrec_net *net);
void publisher_free(publisher *p); /* accepts NULL */
/* Notes the rows of a trained batch (as the loader gave it: ids or keys). */
dlrec_status publisher_note(publisher *p, const dlrec_batch *b, uint32_t n_sparse);
/* Writes the noted rows' current values and the step; failures are counted. */
void publisher_publish(publisher *p, const dlrec_net *net, uint64_t step);
void publisher_stats(const publisher *p, publish_stats *out);

#endif
