/* Internal: the layout of a text row (which field is the label, which are
 * dense and which categorical), shared by the row parser and its builders. */
#ifndef DLREC_DATA_LAYOUT_H
#define DLREC_DATA_LAYOUT_H

#include "data/parse.h"

/* CSV lines may have at most this many fields (each needs a role). */
#define DLREC_LAYOUT_MAX_FIELDS 4096
#define DLREC_CRITEO_DENSE 13
#define DLREC_CRITEO_CAT 26
#define DLREC_CRITEO_FIELDS (1 + DLREC_CRITEO_DENSE + DLREC_CRITEO_CAT)

struct dlrec_layout {
  dlrec_input_format format;
  int has_label;
  uint32_t n_fields;
  uint32_t n_dense, n_cat;
  uint32_t label_field;                 /* UINT32_MAX without a label */
  uint32_t dense_field[DLREC_MAX_DENSE];
  uint32_t cat_field[DLREC_MAX_SPARSE];
  char sep[DLREC_MAX_SPARSE];              /* multi-hot value separator, 0 for one-hot */
  uint8_t role[DLREC_LAYOUT_MAX_FIELDS];   /* dlrec_role per field */
  uint16_t index[DLREC_LAYOUT_MAX_FIELDS]; /* index within the role */
  char *names[DLREC_LAYOUT_MAX_FIELDS];    /* into names_block */
  char *names_block;
  char *ignored;                           /* "a,b,c" */
};

/* Splits a CSV line into at most max fields (see parse.c). */
dlrec_status dlrec__csv_split(const char *line, size_t n, char *scratch, dlrec_text *fields, uint32_t max,
                              uint32_t *count, char *const *names, const dlrec_where *w);

#endif
