/* The network's side of a training step (src/train/step.c runs the step):
 * the dense optimizer's step over the flat array, the optimizer's copies on
 * a device made ready, the network's embedding stage, and the losses of
 * queued steps coming back from a device. */
#include "core/clock.h"
#include "model/net_ws.h"

dlrec_status dlrec_net_dense_step(dlrec_net *n, dlrec_net_ws *ws, dlrec_net_optim *opt, float lr_scale,
                                  uint64_t step) {
  double t = dlrec_now();
  dlrec_optim_config dense = opt->dense;
  dense.lr = opt->dense.lr * lr_scale;
  /* The trainable prefix only: buffers have no gradient and are not stepped.
   * On a device the optimizers' copies there step (the host's keep the
   * learning rate in step). */
  dlrec_status st = BE_OP(n->be, optim_step, &dense, net_params(n), ws->grad,
                          ws->dev_be ? opt->dev_dense_state : opt->dense_state, n->plan.n_trainable, step);
  net_lap(&ws->prof.other, &t);
  return st;
}

dlrec_status dlrec_net_optim_ready(dlrec_net *n, dlrec_net_optim *opt) {
  return n->be->host_memory ? DLREC_OK : net_optim_device(n, opt);
}

void net_stage_pick(dlrec_net *n) {
  const dlrec_stage_ops *ops = &net_stage_local_ops;
  if (n->dev_be && n->host_table && n->schema.n_sparse) ops = n->dhot ? &net_stage_hot_ops : &net_stage_host_ops;
  n->stage = (dlrec_stage){.ops = ops, .net = n};
}

dlrec_stage *dlrec_net_stage(const dlrec_net *n) {
  /* The stage is the network's, as its store's cache is: a pass through a
   * read-only network (a scorer's) still runs the stage's ops. */
  return (dlrec_stage *)&n->stage;
}

/* ---- the losses of queued steps ---- */

dlrec_status dlrec_net_ws_loss_slot(dlrec_net_ws *ws, int queue, double **slot) {
  if (!queue && ws->queued)
    return dlrec_error(DLREC_ERR_INVALID, "train_step: %u step%s queued: take %s loss first", ws->queued,
                       ws->queued == 1 ? "" : "s", ws->queued == 1 ? "its" : "their");
  if (queue && ws->queued >= NET_QUEUED)
    return dlrec_error(DLREC_ERR_INVALID, "train_step_queue: %u steps queued already: take a loss first", ws->queued);
  *slot = &ws->h_loss[queue ? (ws->queue_head + ws->queued) % NET_QUEUED : 0];
  return DLREC_OK;
}

dlrec_status dlrec_net_ws_loss_sent(dlrec_net *n, dlrec_net_ws *ws, double *slot, int queue) {
  dlrec_status st = DLREC_OK;
  /* On a device, the loss once the step is queued (a skipped step's too). */
  if (ws->dev_be)
    st = n->be->ops->download_async ? n->be->ops->download_async(n->be, slot, ws->d_loss, sizeof *slot)
                                    : n->be->ops->download(n->be, slot, ws->d_loss, sizeof *slot);
  if (!queue) return st == DLREC_OK && ws->dev_be ? n->be->ops->synchronize(n->be) : st;
  const uint32_t q = (uint32_t)(slot - ws->h_loss);
  if (st == DLREC_OK && ws->loss_fence[q]) st = n->be->ops->fence_record(n->be, ws->loss_fence[q]);
  if (st == DLREC_OK) ws->queued++;
  return st;
}

dlrec_status dlrec_net_ws_loss(dlrec_net_ws *ws, double *loss) {
  if (!ws->queued) return dlrec_error(DLREC_ERR_INVALID, "train_step_loss: no step queued");
  const uint32_t q = ws->queue_head;
  dlrec_status st = DLREC_OK;
  if (ws->loss_fence[q]) st = ws->dev_be->ops->fence_wait(ws->dev_be, ws->loss_fence[q]);
  else if (ws->dev_be) st = ws->dev_be->ops->synchronize(ws->dev_be);
  ws->queue_head = (q + 1) % NET_QUEUED;
  ws->queued--;
  if (st == DLREC_OK) *loss = ws->h_loss[q];
  return st;
}
