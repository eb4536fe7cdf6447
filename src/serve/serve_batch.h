/* Serving: parsed inference requests (kserve.h) -> encoded model rows, and
 * rows of several requests -> one batch (dynamic batching).
 *
 * A request gives its rows in one of two conventions, told apart by the
 * names of its inputs:
 *
 * Raw features (needs the model's ETL state):
 *   dense        [B, n_dense]  FP32, FP64 or any integer type: the raw values
 *                as a click log holds them, encoded with the ETL's transform
 *                (as `etl apply` would encode their decimal text; FP32 values
 *                are taken exactly, as the double they equal). Non-finite
 *                values are refused. Or BYTES: the raw text itself, "" for
 *                a missing value, exactly as in a log line.
 *   categorical  [B, n_sparse] BYTES: the raw values ("" for missing), encoded
 *                with the ETL's vocabularies. A multi-hot CSV column's
 *                element is the field's text as a log line holds it,
 *                separators and all ("Action|Drama"); a libSVM or libFM
 *                column's the row's indices of that column separated by
 *                spaces ("3 7 12"). It encodes to its values' ids (at most
 *                the column's max hotness, the first ones kept; none: the
 *                missing id), exactly as `etl apply` and `predict` encode it.
 *   An input of no model columns may be left out: a model without dense
 *   columns takes categorical alone (or dense of shape [B, 0]), one without
 *   categorical columns dense alone.
 *
 * HugeCTR backend compatible (triton-inference-server/hugectr_backend: a
 * "variant CSR" of three inputs), for clients that encode themselves:
 *   DES          [1, B*n_dense], [B*n_dense] or [B, n_dense] FP32: the dense
 *                values as the model consumes them (already transformed), row
 *                after row; copied as they are (non-finite refused). B is
 *                DES's length / n_dense, as HugeCTR derives it. A model
 *                without dense columns takes DES empty or left out; B is then
 *                (ROWINDEX's length - 1) / n_sparse.
 *   CATCOLUMN    [1, K] or [K] INT64 (also UINT32 as older HugeCTR clients
 *                send, INT32, UINT64): encoded GLOBAL ids, i.e. rows of the
 *                model's fused table as the ETL assigns them; each must lie
 *                in its column's id range. (HugeCTR sends raw keys that its
 *                parameter server hashes; dlrec has no such server, so the
 *                ids are the rows themselves.)
 *   ROWINDEX     [1, B*n_sparse + 1] or [B*n_sparse + 1] INT32 (or INT64): CSR
 *                offsets into CATCOLUMN, sample-major: sample b's keys of
 *                column c are CATCOLUMN[ROWINDEX[b*n_sparse + c] ..
 *                ROWINDEX[b*n_sparse + c + 1]). It starts at 0, never
 *                decreases and ends at K. (HugeCTR models with several
 *                embedding tables concatenate one such array per table; a
 *                dlrec model has one fused table, so there is one array.)
 *                A column of fixed hotness h takes exactly h keys per sample;
 *                a variable (multi-hot) one, hotness 0, from 0 up to its
 *                max_hotness: ROWINDEX gives each slot's row offsets, as
 *                HugeCTR's does for its multi-hot slots. (The ETL encodes
 *                an empty field as the column's missing id, so a client
 *                matching `predict` sends that id rather than no key; no
 *                key pools to a zero vector.)
 *
 * Every problem is a 400-class error (DLREC_ERR_PARSE, or _UNSUPPORTED for a
 * convention this server cannot serve) naming the input, and the sample and
 * column where there is one.
 *
 * Rows live in a dlrec_serve_rows: caller-owned, growing geometrically, so
 * that a batcher that clears and refills one keeps its buffers and does not
 * allocate per request in steady state. Not thread-safe: one thread fills
 * and reads a dlrec_serve_rows at a time. The ETL state is only read, and may
 * be shared by the rows objects of many threads.
 */
#ifndef DLREC_SERVE_BATCH_H
#define DLREC_SERVE_BATCH_H

#include <stdint.h>

#include "data/etl.h"
#include "serve/kserve.h"
#include "data/loader.h"
#include "data/schema.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlrec_serve_rows dlrec_serve_rows;

/* Creates an empty rows object for a model of this schema (copied and
 * validated). etl, when not NULL, enables the raw convention: it must have
 * the schema's dense and categorical columns with the same id ranges, and
 * must outlive *r. Free with dlrec_serve_rows_free. */
dlrec_status dlrec_serve_rows_new(dlrec_serve_rows **r, const dlrec_schema *schema, const dlrec_etl *etl);
void dlrec_serve_rows_free(dlrec_serve_rows *r); /* accepts NULL */

/* Drops every row; the buffers stay for the next rows. */
void dlrec_serve_rows_clear(dlrec_serve_rows *r);

/* Rows held. */
uint32_t dlrec_serve_rows_count(const dlrec_serve_rows *r);
/* The bytes r's buffers hold (what it allocated, not what its rows use). */
size_t dlrec_serve_rows_bytes(const dlrec_serve_rows *r);

/* Grows the buffers to hold `rows` rows in all (with each column's
 * max_hotness ids per row), so that adding them later does not allocate. */
dlrec_status dlrec_serve_rows_reserve(dlrec_serve_rows *r, uint32_t rows);

/* Encodes the request's rows and appends them after r's rows: B rows, where
 * 1 <= B <= max_rows (else a 400 naming the input that gave B). *added (may
 * be NULL) is B; the request's rows are r's rows [count before, count after).
 * On any error r is left exactly as it was. The request may be freed
 * afterwards: r copies what it needs. */
dlrec_status dlrec_serve_rows_add_request(dlrec_serve_rows *r, const dlrec_kserve_request *req, uint32_t max_rows,
                                          uint32_t *added);

/* Appends src's rows after dst's (both of one schema: equal column counts
 * and id ranges, else DLREC_ERR_INVALID), as if dst had been given src's
 * requests too. On error dst is unchanged. */
dlrec_status dlrec_serve_rows_append(dlrec_serve_rows *dst, const dlrec_serve_rows *src);

/* Views the rows as a batch for the model: rows, dense (rows, n_dense),
 * per column CSR offsets (rows + 1, from 0) and global ids; labels NULL,
 * epoch and end zero. The pointers stay valid until r is next changed
 * (add, append, reserve, clear, free). */
void dlrec_serve_rows_batch(const dlrec_serve_rows *r, dlrec_batch *b);

#ifdef __cplusplus
}
#endif
#endif
