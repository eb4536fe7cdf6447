/* Whether two ETL states encode raw rows the same way: the check that a
 * resumed run is fed data encoded as the checkpoint's table was trained on. */
#ifndef DLREC_TRAIN_ETL_MATCH_H
#define DLREC_TRAIN_ETL_MATCH_H

#include "data/etl.h"

/* DLREC_OK when a and b give every raw row the same encoding: the same input
 * format and CSV header, the same schema (columns, names, id ranges), the same
 * dense transform (and, when standardizing, the same means and stds), and per
 * categorical column the same key kind and salt and the same vocabulary in
 * id order (or the same hash buckets in the same rank order). Counts that do
 * not change the encoding (rows, distinct values, OOV counts) may differ.
 * Otherwise DLREC_ERR_INVALID naming the first difference ("categorical
 * column 'C3': vocabulary differs at local id 17"), without context: the
 * caller says which states it compared. */
dlrec_status etl_same_encoding(const dlrec_etl *a, const dlrec_etl *b);

#endif
