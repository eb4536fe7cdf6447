/* The bookkeeping behind a backend's fresh_gradients (dispatch.h),
 * shared by the backends that implement it (cpu_gemm.c, cuda.c): while on,
 * the weight gradients a GEMM has written since it was turned on. Memory
 * outside them still holds the caller's zeros, so a GEMM's first product
 * there may be written instead of added. */
#ifndef DLREC_FRESH_GRADS_H
#define DLREC_FRESH_GRADS_H

#include <stddef.h>
#include <stdint.h>

/* More gradients than this in one pass are added to, as without fresh. */
#define FRESH_GRADS_MAX 256

typedef struct fresh_grads {
  int on;
  uint32_t n; /* the gradients written since it was turned on */
  struct {
    const float *p;
    size_t n; /* floats at p */
  } wrote[FRESH_GRADS_MAX];
} fresh_grads;

/* Turns it on or off; either way forgets what was written. */
static inline void fresh_grads_set(fresh_grads *f, int on) {
  f->on = on;
  f->n = 0;
}

/* Whether a GEMM must add its product to the n floats at dst (1), or may
 * write it (0): memory no GEMM wrote since fresh was turned on, and no part
 * of one, is still the caller's zeros. Records dst as written. */
static inline int fresh_grads_accumulates(fresh_grads *f, const float *dst, size_t n) {
  if (!f->on || f->n == FRESH_GRADS_MAX) return 1;
  for (uint32_t i = 0; i < f->n; i++)
    if (dst < f->wrote[i].p + f->wrote[i].n && f->wrote[i].p < dst + n) return 1;
  f->wrote[f->n].p = dst;
  f->wrote[f->n].n = n;
  f->n++;
  return 0;
}

#endif
