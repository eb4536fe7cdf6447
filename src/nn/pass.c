/* What every block calls of the pass it runs in (nn/block.h): the linear op
 * (the backend's GEMMs in training, the packed batch-invariant kernel when
 * scoring), the sum of batch normalization's statistics over the ways of a
 * split step (a barrier a failed way releases) or across processes, and the
 * profile's clock. The passes themselves are src/model/net_pass.c's. */
#include <sched.h>
#include <string.h>

#include "backend/dispatch.h"
#include "core/clock.h"
#include "nn/block.h"

void net_lap(double *acc, double *t) {
  double now = dlrec_now();
  *acc += now - *t;
  *t = now;
}

dlrec_status net_linear_forward(const net_io *io, int layer, float *out, const float *in, int relu) {
  const dlrec_act act = relu ? DLREC_ACT_RELU : DLREC_ACT_NONE;
  if (io->packed) return BE_OP(io->be, packed_forward, out, io->packed[layer], in, io->B, act);
  const net_linear *L = &io->plan->linear[layer];
  const float *w = io->params + L->w, *b = L->b == NET_NO_BIAS ? NULL : io->params + L->b;
  return BE_OP(io->be, linear_forward, out, in, w, b, io->B, (int)L->in, (int)L->out, act);
}


/* Waits until every way arrives; 0 when a way failed (it will not come). */
static int sync_wait(struct net_sync *y) {
  const uint32_t gen = atomic_load_explicit(&y->generation, memory_order_acquire);
  if (atomic_fetch_add_explicit(&y->arrived, 1, memory_order_acq_rel) + 1 == y->ways) {
    atomic_store_explicit(&y->arrived, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&y->generation, 1, memory_order_release);
    return 1;
  }
  for (unsigned spins = 0; atomic_load_explicit(&y->generation, memory_order_acquire) == gen; spins++) {
    if (atomic_load_explicit(&y->failed, memory_order_acquire)) return 0;
    if (spins >= 64) sched_yield();
  }
  return 1;
}

void net_allreduce(const net_io *io, double *v, size_t n) {
  const net_split *sp = io->split;
  /* One way of a part of a step across processes (dlrec_net_train_pass):
   * the processes' sum. A failed sum leaves the job to end (the caller's
   * communicator aborts); the statistics here are then the part's own. */
  if (sp && sp->ways == 1 && sp->sum) {
    (void)sp->sum(sp->sum_ctx, v, n);
    return;
  }
  if (!sp || sp->ways < 2) return;
  memcpy(sp->slots[sp->way], v, n * sizeof(double));
  if (!sync_wait(sp->sync)) return;
  for (size_t i = 0; i < n; i++) {
    double acc = sp->slots[0][i];
    for (uint32_t k = 1; k < sp->ways; k++) acc += sp->slots[k][i];
    v[i] = acc;
  }
  sync_wait(sp->sync); /* no way overwrites its slot before every way has read it */
}
