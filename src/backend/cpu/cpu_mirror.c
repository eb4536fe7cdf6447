/* "cpu-mirror": the CPU backend saying its memory is not the host's
 * (backend_impl.h), so that a network on it takes the path it takes on a
 * GPU, with the CPU's ops. Its memory is made inaccessible to the host
 * between ops: each op opens it, runs the CPU backend's op, and closes it,
 * so host code that reads or writes a buffer of the backend's memory (which
 * on a GPU would be a device pointer) faults here at once, on any machine.
 * The other way round, an op given a buffer outside that memory (a host
 * pointer, which a GPU's kernel could not read) is refused, saying which.
 *
 * The memory is one reservation (PROT_NONE, no swap reserved), handed out
 * by pages from its start and never reused: released allocations give their
 * pages back to the kernel (MADV_DONTNEED) but keep their addresses, which
 * a test's lifetime cannot run out of. Opening and closing protect the used
 * range in one call each. For one thread at a time (tests).
 */
#include "backend/backend_impl.h"
#include "backend/ops_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define RESERVE_BYTES ((size_t)64 << 30)
#define PAGE ((size_t)4096)

typedef struct mirror {
  dlrec_backend inner; /* the CPU backend whose ops run */
  char *base;
  size_t used; /* bytes handed out from base, whole pages */
  /* Each live allocation's size, to give its pages back on release. */
  struct alloc_entry {
    char *p;
    size_t bytes;
  } *live;
  size_t n_live, cap_live;
} mirror;

static mirror *mir(dlrec_backend *be) { return be->ctx; }

static void open_all(mirror *m) {
  if (m->used) mprotect(m->base, m->used, PROT_READ | PROT_WRITE);
}
static void close_all(mirror *m) {
  if (m->used) mprotect(m->base, m->used, PROT_NONE);
}

/* The op's pointers into the backend's memory (NULLs pass: whether one
 * may be NULL is the op's to say), or why not: on a GPU a host pointer
 * given to an op is the kernel's illegal address. */
static dlrec_status in_memory(const mirror *m, const char *op, const void *const *p, size_t n) {
  for (size_t i = 1; i < n; i++)
    if (p[i] && ((const char *)p[i] < m->base || (const char *)p[i] >= m->base + m->used))
      return dlrec_error(DLREC_ERR_INVALID, "cpu-mirror: %s given memory that is not the backend's (its pointer "
                         "argument %zu): on a GPU, a host pointer", op, i);
  return DLREC_OK;
}

/* Keeping touches no buffer of the backend's memory: the kept copies are
 * the inner backend's own. */
static int m_keep_operands(dlrec_backend *be, int on) {
  mirror *m = mir(be);
  return m->inner.ops->keep_operands(&m->inner, on);
}

/* Nor does knowing the gradients fresh. */
static int m_fresh_gradients(dlrec_backend *be, int on) {
  mirror *m = mir(be);
  return m->inner.ops->fresh_gradients(&m->inner, on);
}

static void m_packed_free(dlrec_backend *be, dlrec_packed_linear *p) {
  mirror *m = mir(be);
  open_all(m);
  m->inner.ops->packed_free(&m->inner, p);
  close_all(m);
}

/* Each op (ops.def): its buffers checked, the memory opened, the CPU
 * backend's op run, the memory closed. The first entry of p_ stands for
 * none, so that an op without buffers has a list too, and the k-th buffer
 * is p_[k]. */
#define A DLREC_OPS_TUPLE
#define DLREC_OP(name, cpu, args, test)                                                                             \
  static dlrec_status m_##name(dlrec_backend *be DLREC_OPS_PARAMS(args)) {                                          \
    mirror *m = mir(be);                                                                                            \
    const void *const p_[] = {NULL DLREC_OPS_BUFFERS(args)};                                                        \
    dlrec_status st_ = in_memory(m, #name, p_, sizeof p_ / sizeof p_[0]);                                           \
    if (st_ != DLREC_OK) return st_;                                                                                \
    open_all(m);                                                                                                    \
    st_ = m->inner.ops->name(&m->inner DLREC_OPS_NAMES(args));                                                      \
    close_all(m);                                                                                                   \
    return st_;                                                                                                     \
  }
#include "backend/ops.def"
#undef DLREC_OP

/* ---- memory ---- */

static void *m_alloc(dlrec_backend *be, size_t bytes) {
  mirror *m = mir(be);
  const size_t size = ((bytes ? bytes : 1) + PAGE - 1) / PAGE * PAGE;
  if (size > RESERVE_BYTES - m->used) return NULL;
  if (m->n_live == m->cap_live) {
    size_t cap = m->cap_live ? 2 * m->cap_live : 64;
    struct alloc_entry *l = realloc(m->live, cap * sizeof *l);
    if (!l) return NULL;
    m->live = l, m->cap_live = cap;
  }
  char *p = m->base + m->used;
  m->used += size;
  m->live[m->n_live++] = (struct alloc_entry){p, size};
  return p;
}

static void m_release(dlrec_backend *be, void *p) {
  mirror *m = mir(be);
  for (size_t i = 0; p && i < m->n_live; i++)
    if (m->live[i].p == p) {
      madvise(p, m->live[i].bytes, MADV_DONTNEED);
      m->live[i] = m->live[--m->n_live];
      return;
    }
}

/* Host memory for copies (a GPU's pinned memory): the host's own, so that a
 * network here takes the GPU's path for the buffers that cross each step. */
static void *m_alloc_host(dlrec_backend *be, size_t bytes) {
  (void)be;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) ? NULL : p;
}

static void m_release_host(dlrec_backend *be, void *p) {
  (void)be;
  free(p);
}

static dlrec_status m_copy(dlrec_backend *be, void *dst, const void *src, size_t bytes) {
  if (bytes && (!dst || !src)) return dlrec_error(DLREC_ERR_INVALID, "copy of %zu bytes with a NULL buffer", bytes);
  mirror *m = mir(be);
  open_all(m);
  if (bytes) memmove(dst, src, bytes);
  close_all(m);
  return DLREC_OK;
}

static dlrec_status m_synchronize(dlrec_backend *be) {
  (void)be;
  return DLREC_OK;
}

/* A GPU's copies back without a wait, and its fences, as the CPU has them:
 * the copy is done when it returns, so a fence has nothing to wait for. They
 * are here so that a network on the mirror takes the GPU's path. */
static void *m_fence_create(dlrec_backend *be) {
  (void)be;
  return malloc(1);
}

static void m_fence_free(dlrec_backend *be, void *f) {
  (void)be;
  free(f);
}

static dlrec_status m_fence(dlrec_backend *be, void *f) {
  (void)be;
  return f ? DLREC_OK : dlrec_error(DLREC_ERR_INVALID, "NULL fence");
}

static void m_free(dlrec_backend *be) {
  mirror *m = mir(be);
  if (!m) return;
  if (m->inner.ops && m->inner.ops->free) m->inner.ops->free(&m->inner);
  if (m->base) munmap(m->base, RESERVE_BYTES);
  free(m->live);
  free(m);
  be->ctx = NULL;
}

static const dlrec_backend_ops mirror_ops = {
    .free = m_free,
    .alloc = m_alloc,
    .release = m_release,
    .alloc_host = m_alloc_host,
    .release_host = m_release_host,
    .upload = m_copy,
    .download = m_copy,
    .synchronize = m_synchronize,
    .download_async = m_copy,
    .fence_create = m_fence_create,
    .fence_free = m_fence_free,
    .fence_record = m_fence,
    .fence_wait = m_fence,
    .keep_operands = m_keep_operands,
    .fresh_gradients = m_fresh_gradients,
    .packed_free = m_packed_free,
#define DLREC_OP(name, cpu, args, test) .name = m_##name,
#include "backend/ops.def"
#undef DLREC_OP
#undef A
};

dlrec_status dlrec_backend_cpu_mirror_init(dlrec_backend *be, const dlrec_backend_config *c) {
  mirror *m = calloc(1, sizeof *m);
  if (!m) return dlrec_error(DLREC_ERR_NOMEM, "out of memory");
  dlrec_status s = dlrec_backend_cpu_init(&m->inner, c);
  if (s != DLREC_OK) {
    free(m);
    return s;
  }
  m->base = mmap(NULL, RESERVE_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m->base == MAP_FAILED) {
    m->inner.ops->free(&m->inner);
    free(m);
    return dlrec_error(DLREC_ERR_NOMEM, "cpu-mirror: cannot reserve its address range");
  }
  *be = m->inner;
  be->ops = &mirror_ops;
  be->name = "cpu-mirror";
  be->host_memory = 0; /* what a GPU's backend says: networks copy their state in and out */
  be->ctx = m;
  snprintf(be->describe, sizeof be->describe, "cpu-mirror (the CPU as a device) %.90s", m->inner.describe + 5);
  return DLREC_OK;
}
