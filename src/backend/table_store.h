/* What the table offers the storage above it (embed/store.c, store_tiered.c;
 * the checkpoints, dist/sharded.c): a window of a larger table's
 * initialization, the check of its ranges, and a mapped file adopted as its
 * rows. */
#ifndef DLREC_BACKEND_TABLE_STORE_H
#define DLREC_BACKEND_TABLE_STORE_H

#include "backend/table.h"

/* Ranges as dlrec_table_init_uniform requires them, for a table of `rows`. */
dlrec_status table_check_ranges(const dlrec_row_range *ranges, uint32_t n_ranges, uint64_t rows);

/* Initializes t as rows [first, first + rows(t)) of a table initialized by
 * dlrec_table_init_uniform(ranges, seed): first must be a multiple of the
 * initialization's chunk (TABLE_INIT_CHUNK_ROWS), the ranges checked. */
#define TABLE_INIT_CHUNK_ROWS 4096
void table_init_window(dlrec_table *t, uint64_t first, const dlrec_row_range *ranges, uint32_t n_ranges,
                       uint64_t seed);

/* Makes t's rows the (rows, stride) elements at data, inside a mapping
 * (map, map_bytes) that t now owns and unmaps when freed; its own storage is
 * released. For a checkpoint's table.bin mapped in place. */
void table_adopt(dlrec_table *t, void *map, size_t map_bytes, void *data);

#endif
