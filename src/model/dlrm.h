/* DLRM (Naumov et al. 2019), the model type "dlrm" (model.h): a bottom MLP
 * on the dense features, the embedding bags on the categorical ones (the
 * generic embedding stage), the pairwise dot interaction, a top MLP and a
 * sigmoid. Its parameter tensors are "bottom.L.weight" (out, in),
 * "bottom.L.bias" (out), then "top.L.weight" and "top.L.bias" (and, with
 * the top MLP's batch normalization, "top.L.bn.weight" and "top.L.bn.bias"
 * after each hidden layer's, and its running statistics last), in that
 * order in the flat dense array.
 *
 * Everything else (workspaces, scoring, training steps, checkpoints) goes
 * through the model interface of model.h; this header only describes DLRM's
 * config section.
 */
#ifndef DLREC_DLRM_H
#define DLREC_DLRM_H

#include <stdint.h>

#include "model/model.h"

/* How the top MLP sees the features: DLRM's "dot" (x and the pairwise dot
 * products of [x, e_1 .. e_F]) or "cat" (x and the embeddings concatenated). */
typedef enum dlrec_dlrm_interaction { DLREC_DLRM_DOT = 0, DLREC_DLRM_CAT = 1 } dlrec_dlrm_interaction;

typedef struct dlrec_dlrm_shape {
  uint32_t emb_dim;                       /* D: embedding width = the bottom MLP's last width */
  uint32_t n_bottom;                      /* bottom MLP layers (>= 1), all ReLU */
  uint32_t bottom[DLREC_MLP_MAX_LAYERS];  /* their output widths */
  uint32_t n_top;                         /* top MLP layers (>= 1), ReLU but the last */
  uint32_t top[DLREC_MLP_MAX_LAYERS];     /* their output widths; the last is 1 (the logit) */
  dlrec_pooling pooling;                  /* how multi-hot bags pool */
  dlrec_dlrm_interaction interaction;     /* dot (the default, 0) or cat */
  float top_dropout;                      /* dropout after each of the top MLP's hidden layers, [0, 1) */
  int top_batch_norm;                     /* batch normalization in each of the top MLP's hidden layers */
} dlrec_dlrm_shape;

/* DLRM's profile is the generic one: its MLPs are "mlp", its dot
 * interaction "interaction". */
typedef dlrec_net_profile dlrec_dlrm_profile;

/* Sets c to a "dlrm" config of this shape. */
void dlrec_dlrm_config(dlrec_net_config *c, const dlrec_dlrm_shape *shape);
/* The DLRM shape inside config c, or NULL if c is of another type. */
const dlrec_dlrm_shape *dlrec_dlrm_shape_of(const dlrec_net_config *c);

/* dlrec_net_create of a "dlrm" config of this shape. Checks the shape against
 * the schema (bottom's last width == emb_dim, top's last == 1, at least one
 * categorical column; with no dense column, at least two, and no bottom MLP
 * is planned). */
dlrec_status dlrec_dlrm_create(dlrec_net **n, const dlrec_dlrm_shape *shape, const dlrec_schema *schema);

#endif
