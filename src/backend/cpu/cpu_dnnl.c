/* oneDNN matmul for the CPU backend's GEMMs (cpu_dnnl.h).
 *
 * Creating a oneDNN primitive runs its dispatcher and, on x86, its JIT: far
 * too slow per batch. So each distinct call shape gets one cached entry (the
 * primitive and its four memory objects, made with no buffer) on its first
 * call; a later call only sets the memories' data handles and executes. A
 * trainer has a few shapes per layer (the full batch and the last, smaller
 * one, times forward/dW/din), so a linear search over the cache is enough.
 *
 * Threads: this oneDNN is built on OpenMP, and sizes its team from the
 * calling thread's omp_get_max_threads(), which the CPU backend sets to its
 * own thread count before every op (cpu.c's enter).
 */
#include "backend/cpu/cpu_dnnl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DLREC_HAVE_DNNL
#include <dnnl.h>
#include <dnnl_debug.h>

typedef struct dnnl_entry {
  int M, N, K, a_trans, b_trans, has_bias, act, accumulate;
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, bias, dst;
} dnnl_entry;

struct cpu_dnnl {
  int bf16;
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  dnnl_entry *entries;
  size_t n_entries, cap_entries;
  char impl[64];
};

int cpu_dnnl_available(void) { return 1; }

dlrec_status cpu_dnnl_create(cpu_dnnl **out, int bf16) {
  *out = NULL;
  cpu_dnnl *d = calloc(1, sizeof *d);
  if (!d) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  d->bf16 = bf16;
  dnnl_status_t s = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
  if (s == dnnl_success) s = dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags);
  if (s != dnnl_success) {
    cpu_dnnl_free(d);
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "oneDNN: cannot create a CPU engine and stream (%s)", dnnl_status2str(s));
  }
  *out = d;
  return DLREC_OK;
}

static void entry_free(dnnl_entry *e) {
  if (e->prim) dnnl_primitive_destroy(e->prim);
  if (e->a) dnnl_memory_destroy(e->a);
  if (e->b) dnnl_memory_destroy(e->b);
  if (e->bias) dnnl_memory_destroy(e->bias);
  if (e->dst) dnnl_memory_destroy(e->dst);
}

void cpu_dnnl_free(cpu_dnnl *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_entries; i++) entry_free(&d->entries[i]);
  free(d->entries);
  if (d->stream) dnnl_stream_destroy(d->stream);
  if (d->engine) dnnl_engine_destroy(d->engine);
  free(d);
}

const char *cpu_dnnl_impl(const cpu_dnnl *d) { return d->impl; }

/* A (rows, cols) matrix stored row-major, or stored transposed (cols, rows)
 * row-major when trans: oneDNN takes either as strides, no copy. */
static dnnl_status_t matrix_md(dnnl_memory_desc_t *md, int rows, int cols, int trans, dnnl_data_type_t dt) {
  dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {trans ? 1 : cols, trans ? rows : 1};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides);
}

/* Creates e's primitive and memories for the shape already in e's key. */
static dnnl_status_t entry_create(cpu_dnnl *d, dnnl_entry *e, char *impl, size_t impl_size) {
  dnnl_data_type_t in_dt = d->bf16 ? dnnl_bf16 : dnnl_f32;
  dnnl_memory_desc_t a_md, b_md, bias_md, dst_md;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s;
  if ((s = matrix_md(&a_md, e->M, e->K, e->a_trans, in_dt)) != dnnl_success) goto done;
  if ((s = matrix_md(&b_md, e->K, e->N, e->b_trans, in_dt)) != dnnl_success) goto done;
  if ((s = matrix_md(&bias_md, 1, e->N, 0, dnnl_f32)) != dnnl_success) goto done;
  if ((s = matrix_md(&dst_md, e->M, e->N, 0, dnnl_f32)) != dnnl_success) goto done;
  if ((s = dnnl_matmul_desc_init(&desc, &a_md, &b_md, e->has_bias ? &bias_md : NULL, &dst_md)) != dnnl_success)
    goto done;
  if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success) goto done;
  if ((s = dnnl_post_ops_create(&ops)) != dnnl_success) goto done;
  if (e->accumulate && (s = dnnl_post_ops_append_sum(ops, 1.0f)) != dnnl_success) goto done;
  if (e->act == DLREC_ACT_RELU &&
      (s = dnnl_post_ops_append_eltwise(ops, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f)) != dnnl_success)
    goto done;
  if ((s = dnnl_primitive_attr_set_post_ops(attr, ops)) != dnnl_success) goto done;
  if ((s = dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL)) != dnnl_success) goto done;
  const char *info = NULL;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info) == dnnl_success && info)
    snprintf(impl, impl_size, "%s", info);
  if ((s = dnnl_primitive_create(&e->prim, pd)) != dnnl_success) goto done;
  if ((s = dnnl_memory_create(&e->a, &a_md, d->engine, DNNL_MEMORY_NONE)) != dnnl_success) goto done;
  if ((s = dnnl_memory_create(&e->b, &b_md, d->engine, DNNL_MEMORY_NONE)) != dnnl_success) goto done;
  if ((s = dnnl_memory_create(&e->bias, &bias_md, d->engine, DNNL_MEMORY_NONE)) != dnnl_success) goto done;
  s = dnnl_memory_create(&e->dst, &dst_md, d->engine, DNNL_MEMORY_NONE);
done:
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (ops) dnnl_post_ops_destroy(ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
  return s;
}

/* The cached entry for this shape, created on its first call; NULL with an
 * error set when oneDNN refuses the shape. */
static dnnl_entry *entry_get(cpu_dnnl *d, int M, int N, int K, int a_trans, int b_trans, int has_bias, int act,
                             int accumulate) {
  dnnl_entry key = {M, N, K, a_trans, b_trans, has_bias, act, accumulate, NULL, NULL, NULL, NULL, NULL};
  for (size_t i = 0; i < d->n_entries; i++) {
    dnnl_entry *e = &d->entries[i];
    if (e->M == M && e->N == N && e->K == K && e->a_trans == a_trans && e->b_trans == b_trans &&
        e->has_bias == has_bias && e->act == act && e->accumulate == accumulate)
      return e;
  }
  if (d->n_entries == d->cap_entries) {
    size_t cap = d->cap_entries ? 2 * d->cap_entries : 16;
    dnnl_entry *grown = realloc(d->entries, cap * sizeof *grown);
    if (!grown) {
      dlrec_error(DLREC_ERR_NOMEM, "out of memory");
      return NULL;
    }
    d->entries = grown;
    d->cap_entries = cap;
  }
  dnnl_status_t s = entry_create(d, &key, d->impl, sizeof d->impl);
  if (s != dnnl_success) {
    entry_free(&key);
    dlrec_error(DLREC_ERR_UNSUPPORTED,
                "oneDNN has no %s matmul for M=%d N=%d K=%d%s%s on this CPU (%s)",
                d->bf16 ? "bf16" : "fp32", M, N, K, act == DLREC_ACT_RELU ? " with ReLU" : "",
                accumulate ? " accumulating" : "", dnnl_status2str(s));
    return NULL;
  }
  d->entries[d->n_entries] = key;
  return &d->entries[d->n_entries++];
}

dlrec_status cpu_dnnl_matmul(cpu_dnnl *d, float *out, const void *a, int a_trans, const void *b, int b_trans,
                             const float *bias, int M, int N, int K, dlrec_act act, int accumulate) {
  if (!out || !a || !b) return dlrec_error(DLREC_ERR_INVALID, "oneDNN matmul: NULL buffer");
  if (M < 1 || N < 1 || K < 1)
    return dlrec_error(DLREC_ERR_INVALID, "oneDNN matmul: bad shape M=%d N=%d K=%d", M, N, K);
  dnnl_entry *e = entry_get(d, M, N, K, a_trans, b_trans, bias != NULL, (int)act, accumulate);
  if (!e) return dlrec_last_status();
  /* oneDNN only reads the inputs; its handles are not const-qualified. */
  dnnl_memory_set_data_handle(e->a, (void *)a);
  dnnl_memory_set_data_handle(e->b, (void *)b);
  dnnl_memory_set_data_handle(e->dst, out);
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->dst}};
  int nargs = 3;
  if (bias) {
    dnnl_memory_set_data_handle(e->bias, (void *)bias);
    args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, e->bias};
  }
  dnnl_status_t s = dnnl_primitive_execute(e->prim, d->stream, nargs, args);
  if (s == dnnl_success) s = dnnl_stream_wait(d->stream);
  if (s != dnnl_success)
    return dlrec_error(DLREC_ERR_UNSUPPORTED, "oneDNN matmul M=%d N=%d K=%d failed (%s)", M, N, K,
                       dnnl_status2str(s));
  return DLREC_OK;
}

#else /* no oneDNN in this build */

struct cpu_dnnl {
  int unused;
};

int cpu_dnnl_available(void) { return 0; }

dlrec_status cpu_dnnl_create(cpu_dnnl **out, int bf16) {
  (void)bf16;
  *out = NULL;
  return dlrec_error(DLREC_ERR_UNSUPPORTED,
                     "this build has no oneDNN (install libdnnl-dev: scripts/deps.sh build, and reconfigure)");
}

void cpu_dnnl_free(cpu_dnnl *d) { free(d); }

const char *cpu_dnnl_impl(const cpu_dnnl *d) {
  (void)d;
  return "";
}

dlrec_status cpu_dnnl_matmul(cpu_dnnl *d, float *out, const void *a, int a_trans, const void *b, int b_trans,
                             const float *bias, int M, int N, int K, dlrec_act act, int accumulate) {
  (void)d, (void)out, (void)a, (void)a_trans, (void)b, (void)b_trans, (void)bias, (void)M, (void)N, (void)K;
  (void)act, (void)accumulate;
  return dlrec_error(DLREC_ERR_UNSUPPORTED, "this build has no oneDNN");
}

#endif
