/* A network on a backend whose memory is not the host's (a GPU's).
 *
 * The passes there read and write the backend's copies: the dense
 * parameters (dparams), the embedding table (dtable, a mirror of
 * backend/mirror.c) and, for training, the optimizer's state (in
 * dlrec_net_optim). The host's params and table stay the network's own:
 * what checkpoints, exports and the CPU read, current after
 * dlrec_net_sync_host. The workspaces' arenas are the backend's memory too
 * (net_arena_memory), and each pass copies its batch's dense features and
 * labels over; the loss and the scores come back.
 *
 * With dlrec_net_set_host_table the table stays the host's alone (no
 * dtable, no optimizer mirror): the host stage (stage_host.c) pools on the CPU and copies the
 * pooled rows over, and their gradient back for the CPU's sparse update.
 * With hot rows too (dlrec_net_set_hot_fraction), a mirror of those rows
 * (dhot, runs of the host's) and of their optimizer state: their lookups
 * and updates run on the device; the host's copies of them are current
 * after dlrec_net_sync_host, as a device table's are.
 *
 * A table other than RAM's (tiered, hash, raw keys) is the host's only:
 * its resident rows, which resolve() points the bags at, are host memory
 * that the store moves under the network. What such a network cannot have
 * yet: its rows elsewhere (a rank's shard).
 */
#include <stdlib.h>
#include <string.h>

#include "model/model_type.h"

dlrec_status net_device_check(const dlrec_net *n, const dlrec_backend *be) {
  if (be->host_memory) return DLREC_OK;
  if (n->tableless)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: training across ranks runs on the CPU only for now", be->describe);
  if (n->schema.n_sparse && dlrec_store_get_kind(n->store) != DLREC_STORE_RAM && !n->host_table)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: storage.kind \"%s\" keeps its table in host memory: "
                       "training.table_placement \"host\" (or \"auto\") on a GPU",
                       be->describe, dlrec_store_kind_name(dlrec_store_get_kind(n->store)));
  if (n->host_table && n->hot_total && dlrec_store_get_kind(n->store) != DLREC_STORE_RAM)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "%s: hot rows on the device (training.hot_fraction) need the table "
                       "in RAM; storage.kind \"%s\" moves or keys its rows on the CPU", be->describe,
                       dlrec_store_kind_name(dlrec_store_get_kind(n->store)));
  return DLREC_OK;
}

void net_device_drop(dlrec_net *n) {
  if (!n->dev_be) return;
  n->dev_be->ops->release(n->dev_be, n->dparams);
  backend_table_mirror_free(n->dev_be, n->dtable);
  backend_table_mirror_free(n->dev_be, n->dhot);
  n->dev_be->ops->release(n->dev_be, n->hot_keys);
  n->hot_keys = NULL;
  n->dparams = NULL;
  n->dtable = NULL;
  n->dhot = NULL;
  n->dev_be = NULL;
  net_stage_pick(n);
}

static size_t dense_state_bytes(const dlrec_net *n, const dlrec_net_optim *opt) {
  return dlrec_optim_state_floats(&opt->dense, n->plan.n_params) * sizeof(float);
}

/* The hot rows' keys on the backend: each one's row in the host's table. */
static dlrec_status hot_keys_make(dlrec_net *n, dlrec_backend *be) {
  const size_t bytes = (n->hot_total ? n->hot_total : 1) * sizeof(uint64_t);
  uint64_t *keys = malloc(bytes);
  if (!keys || !(n->hot_keys = be->ops->alloc(be, bytes))) {
    free(keys);
    return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the hot rows' %zu-byte keys", be->describe, bytes);
  }
  for (uint32_t i = 0; i < n->hot_runs; i++)
    for (uint64_t r = 0; r < n->hot[i].count; r++) keys[n->hot[i].dev + r] = n->hot[i].host + r;
  dlrec_status s = be->ops->upload(be, n->hot_keys, keys, bytes);
  free(keys);
  return s;
}

/* The network's mirrors on its backend, made from or refreshed with the
 * host's. */
static dlrec_status net_upload(dlrec_net *n) {
  dlrec_backend *be = n->be;
  if (n->dev_be != be) {
    net_device_drop(n);
    if (!(n->dparams = be->ops->alloc(be, net_params_bytes(n))))
      return dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for %zu dense parameters", be->describe, n->plan.n_params);
    n->dev_be = be;
    dlrec_status s = DLREC_OK;
    if (n->schema.n_sparse && !n->host_table) s = backend_table_mirror(be, n->table, &n->dtable);
    else if (n->schema.n_sparse && n->hot_total)
      s = backend_table_mirror_runs(be, n->table, n->hot, n->hot_runs, n->hot_total, &n->dhot);
    if (s == DLREC_OK && n->dhot) s = hot_keys_make(n, be);
    if (s != DLREC_OK) {
      net_device_drop(n);
      return s;
    }
    net_stage_pick(n);
  } else if (n->dtable || n->dhot) {
    dlrec_status s = n->dtable ? backend_table_upload(be, n->dtable, n->table)
                               : backend_table_copy_runs(be, n->table, n->dhot, n->hot, n->hot_runs, 1);
    if (s != DLREC_OK) return s;
  }
  return be->ops->upload(be, n->dparams, n->params, net_params_bytes(n));
}

void dlrec_net_optim_free_device(dlrec_net_optim *opt) {
  if (!opt->dev_be) return;
  opt->dev_be->ops->release(opt->dev_be, opt->dev_dense_state);
  backend_sparse_optim_mirror_free(opt->dev_be, opt->dev_sparse);
  opt->dev_dense_state = NULL;
  opt->dev_sparse = NULL;
  opt->dev_be = NULL;
}

dlrec_status net_optim_device(dlrec_net *n, dlrec_net_optim *opt) {
  dlrec_backend *be = n->be;
  if (opt->dev_be == be && (opt->dev_sparse || (!n->dtable && !n->dhot))) return DLREC_OK;
  dlrec_net_optim_free_device(opt);
  opt->dev_be = be;
  const size_t state = dense_state_bytes(n, opt);
  dlrec_status s = DLREC_OK;
  if (state && !(opt->dev_dense_state = be->ops->alloc(be, state)))
    s = dlrec_error(DLREC_ERR_NOMEM, "%s: no memory for the dense optimizer's state", be->describe);
  if (s == DLREC_OK && state) s = be->ops->upload(be, opt->dev_dense_state, opt->dense_state, state);
  if (s == DLREC_OK && n->dtable) s = backend_sparse_optim_mirror(be, opt->sparse, n->dtable, &opt->dev_sparse);
  if (s == DLREC_OK && n->dhot)
    s = backend_sparse_optim_mirror_runs(be, opt->sparse, n->dhot, n->hot, n->hot_runs, &opt->dev_sparse);
  /* A hot row rounds as the host table's row it is. */
  if (s == DLREC_OK && n->dhot) dlrec_sparse_optim_set_row_keys(opt->dev_sparse, n->hot_keys);
  if (s != DLREC_OK) dlrec_net_optim_free_device(opt);
  return s;
}

dlrec_status dlrec_net_sync_device(dlrec_net *n, dlrec_net_optim *opt) {
  if (n->be->host_memory) return DLREC_OK;
  dlrec_status s = net_upload(n);
  if (s != DLREC_OK || !opt) return s;
  dlrec_net_optim_free_device(opt); /* remade from the host's at once */
  return net_optim_device(n, opt);
}

dlrec_status dlrec_net_sync_host(dlrec_net *n, dlrec_net_optim *opt) {
  dlrec_backend *be = n->dev_be;
  if (!be) return DLREC_OK;
  dlrec_status s = be->ops->download(be, n->params, n->dparams, net_params_bytes(n));
  if (s == DLREC_OK && n->dtable) s = backend_table_download(be, n->table, n->dtable);
  if (s == DLREC_OK && n->dhot) s = backend_table_copy_runs(be, n->table, n->dhot, n->hot, n->hot_runs, 0);
  if (s != DLREC_OK || !opt || opt->dev_be != be) return s;
  const size_t state = dense_state_bytes(n, opt);
  if (state) s = be->ops->download(be, opt->dense_state, opt->dev_dense_state, state);
  if (s == DLREC_OK && opt->dev_sparse && n->dhot)
    s = backend_sparse_optim_download_runs(be, opt->sparse, opt->dev_sparse, n->hot, n->hot_runs);
  else if (s == DLREC_OK && opt->dev_sparse)
    s = backend_sparse_optim_download(be, opt->sparse, opt->dev_sparse);
  return s;
}

/* ---- the workspaces' memory ---- */

static void *arena_alloc(void *ctx, size_t bytes) {
  dlrec_backend *be = ctx;
  return be->ops->alloc(be, bytes);
}

static void arena_release(void *ctx, void *p) {
  dlrec_backend *be = ctx;
  be->ops->release(be, p);
}

/* Zeros as floats, and a tail of fewer than 4 bytes from the host. */
static int arena_zero(void *ctx, void *p, size_t bytes) {
  dlrec_backend *be = ctx;
  const size_t floats = bytes / sizeof(float), tail = bytes % sizeof(float);
  static const char zeros[sizeof(float)];
  if (floats && BE_OP(be, fill_rows, p, floats, 1, floats, 0.0f) != DLREC_OK) return -1;
  if (tail && be->ops->upload(be, (char *)p + floats * sizeof(float), zeros, tail) != DLREC_OK) return -1;
  return 0;
}

dlrec_arena_memory net_arena_memory(dlrec_backend *be) {
  return (dlrec_arena_memory){arena_alloc, arena_release, arena_zero, be};
}

/* ---- host memory for what crosses each step (alloc_host) ---- */

static void *host_alloc(void *ctx, size_t bytes) {
  dlrec_backend *be = ctx;
  return be->ops->alloc_host(be, bytes);
}
static void host_release(void *ctx, void *p) {
  dlrec_backend *be = ctx;
  be->ops->release_host(be, p);
}
static int host_zero(void *ctx, void *p, size_t bytes) {
  (void)ctx;
  memset(p, 0, bytes);
  return 0;
}
dlrec_arena_memory net_host_arena_memory(dlrec_backend *be) {
  return (dlrec_arena_memory){host_alloc, host_release, host_zero, be};
}
