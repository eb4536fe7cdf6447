/* Arrow tables into the ETL: a host's record batches, handed over through
 * the Arrow C Data Interface (a stream of struct arrays; pyarrow exports
 * one without copying), read in place and formatted as the CSV text the
 * ETL's one parser reads (src/data/arrow_csv.c). So a table encodes to the
 * .dlr bytes its rows give as a CSV file, with no temporary file and no
 * conversion on the host's side.
 *
 * The text is what CSV writers produce for the values: integers in
 * decimal, floating-point values in their shortest form that reads back to
 * the same value, booleans as 1 and 0, strings as they are (quoted when
 * they hold the separator, a quote or a carriage return), dictionary-encoded
 * columns as their values, nulls and empty strings as empty fields. Other
 * types (dates, timestamps, decimals, lists, ...) are refused, naming the
 * column; so is a string holding a line feed (the CSV parser takes none
 * inside quotes), naming its row (0-based, across batches) and column, and a
 * batch whose arrays lack the buffers or rows its schema and length need.
 * Offsets (of the batch, its arrays and dictionaries) and null counts of -1
 * (not computed: the bitmap is read) are as the C Data Interface has them.
 */
#ifndef DLREC_ARROW_H
#define DLREC_ARROW_H

#include <stdint.h>

#include "data/parse.h"
#include "core/status.h"

/* The C Data Interface's structs, as the Arrow specification defines them
 * (an ABI, stable across Arrow versions). */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE
struct ArrowSchema {
  const char *format;
  const char *name;
  const char *metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema **children;
  struct ArrowSchema *dictionary;
  void (*release)(struct ArrowSchema *);
  void *private_data;
};

struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void **buffers;
  struct ArrowArray **children;
  struct ArrowArray *dictionary;
  void (*release)(struct ArrowArray *);
  void *private_data;
};
#endif

#ifndef ARROW_C_STREAM_INTERFACE
#define ARROW_C_STREAM_INTERFACE
struct ArrowArrayStream {
  int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *out);
  int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *out);
  const char *(*get_last_error)(struct ArrowArrayStream *);
  void (*release)(struct ArrowArrayStream *);
  void *private_data;
};
#endif

typedef struct dlrec_arrow_csv dlrec_arrow_csv;

/* A CSV text source over stream, which it takes over (released by
 * dlrec_arrow_csv_free, also when this fails). name names it in messages.
 * header: a first line of column names; sep: ',' or '\t' (the Criteo
 * layout, where a value holding a tab or a line break is an error).
 * columns (n_columns names; NULL: every column in the stream's order)
 * picks and orders the columns; a missing one is an error naming it. */
dlrec_status dlrec_arrow_csv_open(dlrec_arrow_csv **out, struct ArrowArrayStream *stream, const char *name, int header,
                                  char sep, const char *const *columns, int n_columns);
void dlrec_arrow_csv_free(dlrec_arrow_csv *a); /* accepts NULL */
/* The text as a byte source for dlrec_reader_open_source (and the ETL's
 * sources), valid while a lives. */
dlrec_source dlrec_arrow_csv_source(dlrec_arrow_csv *a);
/* Whether the stream has a column of that name. */
int dlrec_arrow_csv_has_column(const dlrec_arrow_csv *a, const char *name);

#endif
