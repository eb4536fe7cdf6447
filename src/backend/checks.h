/* The argument checks of the ops, one place for every backend: the CPU
 * kernels run them, and a backend whose ops run elsewhere (a GPU's) runs the
 * same ones before it enqueues anything, so a refused call says the same
 * and touches nothing on either. Each returns DLREC_OK or DLREC_ERR_INVALID
 * with a message naming `what`. They live beside the CPU kernel that first
 * needed them (src/backend/cpu/), which every build compiles. */
#ifndef DLREC_BACKEND_CHECKS_H
#define DLREC_BACKEND_CHECKS_H

#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"

/* "WHAT: NULL buffer" for the first NULL of the pointers after `what`, as
 * every kernel words it: NN_NONNULL(what, a, b, ...). */
static inline dlrec_status nn_check_nonnull(const char *what, const void *const *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!p[i]) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  return DLREC_OK;
}
#define NN_NONNULL(what, ...)                                      \
  nn_check_nonnull(what, (const void *[]){__VA_ARGS__},            \
                   sizeof((const void *[]){__VA_ARGS__}) / sizeof(void *))

/* rows.c: non-NULL; width within dst_ld, and src_ld unless it is 0. */
dlrec_status nn_check_rows(const char *what, const void *dst, const void *src, size_t dst_ld, size_t src_ld,
                           size_t width);
/* rows.c's gather and scatters: non-NULL, every idx[i] < rows. */
dlrec_status nn_check_indexed_rows(const char *what, const void *dst, const void *src, size_t rows,
                                   const uint32_t *idx, size_t n);
/* linear.c: three buffers, B, IN, OUT >= 1. */
dlrec_status nn_check_linear(const char *what, const void *a, const void *b, const void *c, int B, int IN, int OUT);
/* interaction.c: the dot interaction's three buffers and shape; the
 * concatenation's two and shape. */
dlrec_status nn_check_dot(const char *what, const void *a, const void *b, const void *c, int B, int F, int D);
dlrec_status nn_check_concat(const char *what, const void *a, const void *b, int B, int DX, int F, int D);
/* cross.c (r = 0: full rank; the low-rank layers' r >= 1) and cross_mix.c. */
dlrec_status nn_check_cross(const char *what, int B, int d, int r);
dlrec_status nn_check_cross_lowrank(const char *what, int B, int d, int r);
dlrec_status nn_check_cross_mix(const char *what, int B, int d, int r, int K);
/* linear_packed.c: sets *out NULL (when out is not), then checks out,
 * weight and the shape (IN, OUT). */
dlrec_status nn_check_packed(dlrec_packed_linear **out, const float *weight, int IN, int OUT);
/* fm.c, wide.c, loss.c. */
dlrec_status nn_check_fm(const char *what, const void *a, const void *b, int B, int F, int D);
dlrec_status nn_check_wide(const char *what, const void *a, const void *b, int B, int F);
dlrec_status nn_check_bce(const char *what, const void *a, const void *b, const void *c, int B);
/* batchnorm.c: the shape (B >= B_min) and the momentum and eps. */
dlrec_status nn_check_batchnorm(const char *what, int B, int B_min, int C);
dlrec_status nn_check_momentum(const char *what, float momentum, float eps);

/* dropout.c: the mask of (p, seed, step), whose draw keeps element i when
 * the top 32 bits of dlrec_mix64(key + (i + 1) * golden) reach threshold,
 * after the checks of both buffers and of p. */
typedef struct nn_dropout_mask {
  uint64_t key;
  uint32_t threshold; /* drop when the draw's top 32 bits are below it */
  float scale;        /* 1 / (1 − p) */
} nn_dropout_mask;
dlrec_status nn_dropout_mask_make(nn_dropout_mask *m, const char *what, const void *a, const void *b, float p,
                                  uint64_t seed, uint64_t step);

#endif
