/* The embedding stage's view of what lies below it: the fused table as the
 * backend's tensor of rows (backend/table.h), the bags of a batch and the
 * sparse optimizer (backend/ops.h, backend/sparse_optim.h), whose kernels
 * are backend ops (backend/ops.def: bag_forward, bag_backward_update). What
 * stays here, in src/embed/, is the storage of tables: which rows are
 * resident, and where the others live (store.h: ram, tiered, hash).
 *
 * A training step uses it as:
 *
 *   dlrec_table_create(&t, rows, dim);                 // once
 *   dlrec_table_init_uniform(t, ranges, n_cols, seed); // once
 *   dlrec_sparse_optim_create(&o, t, &optim_config);   // once
 *   scratch = malloc(dlrec_bag_backward_scratch_bytes(t, max_ids)); // once
 *   ...
 *   BE_OP(be, bag_forward, emb, t, &bags, DLREC_POOLING_SUM);   // emb (B, F, D)
 *   ... dense forward, loss, dense backward down to d_emb (B, F, D) ...
 *   BE_OP(be, bag_backward_update, t, o, &bags, DLREC_POOLING_SUM, d_emb, scratch, bytes);
 *
 * The backward never materializes a dense gradient of the table: it reduces
 * the gradients of the rows the batch touched, per unique row, in a fixed
 * order, and updates only those rows in place. The result is bitwise the
 * same for any number of OpenMP threads.
 */
#ifndef DLREC_EMBED_H
#define DLREC_EMBED_H

#include "backend/ops.h"
#include "backend/sparse_optim.h"
#include "backend/table.h"

#endif
