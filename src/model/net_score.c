/* Batch-invariant scoring (model.h's scorer): the network's linear layers
 * packed once for the packed kernel, and the scoring pass over any
 * embedding stage. */
#include <stdlib.h>

#include "model/net_ws.h"

struct dlrec_net_scorer {
  const dlrec_net *net;
  /* The backend that packed the layers: it scores with them and frees them,
   * whatever backend the network is given later. */
  dlrec_backend *be;
  dlrec_packed_linear *packed[NET_MAX_LINEAR];
};

const dlrec_net *net_scorer_net(const dlrec_net_scorer *s) { return s->net; }

void dlrec_net_scorer_free(dlrec_net_scorer *s) {
  if (!s) return;
  for (uint32_t l = 0; l < NET_MAX_LINEAR; l++)
    if (s->packed[l]) BE_OP(s->be, packed_free, s->packed[l]);
  free(s);
}

dlrec_status dlrec_net_scorer_create(dlrec_net_scorer **out, const dlrec_net *n) {
  *out = NULL;
  dlrec_net_scorer *s = calloc(1, sizeof *s);
  if (!s) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  s->net = n;
  s->be = n->be;
  dlrec_status st = DLREC_OK;
  /* Layers are packed from host arrays: on a device, its parameters' copy
   * brought over (the host's may be older). */
  const float *params = n->params;
  float *fetched = NULL;
  if (n->dparams) {
    const size_t bytes = net_params_bytes(n);
    if (!(fetched = malloc(bytes))) st = dlrec_error(DLREC_ERR_NOMEM, "out of memory");
    if (st == DLREC_OK) st = n->dev_be->ops->download(n->dev_be, fetched, n->dparams, bytes);
    params = fetched;
  }
  for (uint32_t l = 0; st == DLREC_OK && l < n->plan.n_linear; l++) {
    const net_linear *L = &n->plan.linear[l];
    const float *bias = L->b == NET_NO_BIAS ? NULL : params + L->b;
    st = BE_OP(s->be, packed_create, &s->packed[l], params + L->w, bias, (int)L->in, (int)L->out);
  }
  free(fetched);
  if (st != DLREC_OK) {
    dlrec_net_scorer_free(s);
    return st;
  }
  *out = s;
  return DLREC_OK;
}

dlrec_status dlrec_net_predict_stage(const dlrec_net_scorer *sc, dlrec_net_ws *ws, dlrec_stage *s,
                                     const dlrec_batch *batch, float *prob) {
  const float *logits = NULL;
  dlrec_batch rb;
  ws->stage = s;
  dlrec_status st = s->net == sc->net ? s->ops->rows(s, ws, batch, &rb, 0)
                                      : dlrec_error(DLREC_ERR_INTERNAL, "a scorer given another network's stage");
  if (st == DLREC_OK)
    st = net_run_forward(sc->net, sc->be, ws, &rb, (const dlrec_packed_linear *const *)sc->packed, NULL, 0, &logits);
  if (st == DLREC_OK) st = net_scores_out(sc->be, ws, prob, logits, rb.rows);
  return st;
}

dlrec_status dlrec_net_predict(const dlrec_net_scorer *s, dlrec_net_ws *ws, const dlrec_batch *batch, float *prob) {
  return dlrec_net_predict_stage(s, ws, dlrec_net_stage(s->net), batch, prob);
}
