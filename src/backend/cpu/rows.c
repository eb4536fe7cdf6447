/* Moving activations between the models' blocks: strided row copies (the
 * concatenations and splits of DCN-v2's x0, DLRM's interaction, the FM
 * models' factors and weights), fills, and the elementwise adds and scales
 * that join branches. Written as ops so that a backend whose memory is not
 * the host's runs them where the data is; on the CPU they are the plain
 * loops the models had, with the same arithmetic (one rounding per add or
 * multiply), so results keep their bits. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/checks.h"

/* Passes smaller than this run on one thread (see linear.c). */
#define PARALLEL_MIN 32768

dlrec_status nn_check_rows(const char *what, const void *dst, const void *src, size_t dst_ld, size_t src_ld,
                           size_t width) {
  if (!dst || !src) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  if (width > dst_ld || (src_ld && width > src_ld))
    return dlrec_error(DLREC_ERR_INVALID, "%s: rows of %zu values do not fit strides %zu and %zu", what, width,
                       dst_ld, src_ld);
  return DLREC_OK;
}

dlrec_status cpu_copy_rows(float *dst, size_t dst_ld, const float *src, size_t src_ld, size_t rows, size_t width) {
  if (!rows || !width) return DLREC_OK;
  dlrec_status s = nn_check_rows("copy_rows", dst, src, dst_ld, src_ld, width);
  if (s != DLREC_OK) return s;
  if (dst_ld == width && src_ld == width) {
    memcpy(dst, src, rows * width * sizeof(float));
    return DLREC_OK;
  }
#pragma omp parallel for schedule(static) if (rows * width >= PARALLEL_MIN)
  for (size_t r = 0; r < rows; r++) memcpy(dst + r * dst_ld, src + r * src_ld, width * sizeof(float));
  return DLREC_OK;
}

dlrec_status cpu_fill_rows(float *dst, size_t dst_ld, size_t rows, size_t width, float value) {
  if (!rows || !width) return DLREC_OK;
  dlrec_status s = nn_check_rows("fill_rows", dst, dst, dst_ld, dst_ld, width);
  if (s != DLREC_OK) return s;
  if (dst_ld == width) {
    const size_t n = rows * width;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = value;
    return DLREC_OK;
  }
#pragma omp parallel for schedule(static) if (rows * width >= PARALLEL_MIN)
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < width; c++) dst[r * dst_ld + c] = value;
  return DLREC_OK;
}

dlrec_status nn_check_indexed_rows(const char *what, const void *dst, const void *src, size_t rows,
                                   const uint32_t *idx, size_t n) {
  if (!n) return DLREC_OK;
  if (!dst || !src || !idx) return dlrec_error(DLREC_ERR_INVALID, "%s: NULL buffer", what);
  for (size_t i = 0; i < n; i++)
    if (idx[i] >= rows)
      return dlrec_error(DLREC_ERR_INVALID, "%s: index %zu is row %u of %zu", what, i, idx[i], rows);
  return DLREC_OK;
}

dlrec_status cpu_gather_rows(float *dst, const float *src, size_t rows, const uint32_t *idx, size_t n,
                               size_t width) {
  if (!width) return DLREC_OK;
  dlrec_status s = nn_check_indexed_rows("gather_rows", dst, src, rows, idx, n);
  if (s != DLREC_OK) return s;
#pragma omp parallel for schedule(static) if (n * width >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) memcpy(dst + i * width, src + (size_t)idx[i] * width, width * sizeof(float));
  return DLREC_OK;
}

dlrec_status cpu_scatter_rows(float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
                                size_t width) {
  if (!width) return DLREC_OK;
  dlrec_status s = nn_check_indexed_rows("scatter_rows", dst, src, rows, idx, n);
  if (s != DLREC_OK) return s;
#pragma omp parallel for schedule(static) if (n * width >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) memcpy(dst + (size_t)idx[i] * width, src + i * width, width * sizeof(float));
  return DLREC_OK;
}

dlrec_status cpu_scatter_add_rows(float *dst, size_t rows, const uint32_t *idx, const float *src, size_t n,
                                    size_t width) {
  if (!width) return DLREC_OK;
  dlrec_status s = nn_check_indexed_rows("scatter_add_rows", dst, src, rows, idx, n);
  if (s != DLREC_OK) return s;
#pragma omp parallel for schedule(static) if (n * width >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) {
    float *d = dst + (size_t)idx[i] * width;
    const float *x = src + i * width;
    for (size_t c = 0; c < width; c++) d[c] += x[c];
  }
  return DLREC_OK;
}

dlrec_status cpu_add(float *y, const float *x, size_t n) {
  if (!n) return DLREC_OK;
  if (!y || !x) return dlrec_error(DLREC_ERR_INVALID, "add: NULL buffer");
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) y[i] += x[i];
  return DLREC_OK;
}

dlrec_status cpu_sum_columns(float *dst, const float *src, size_t B, size_t C) {
  if (!C) return DLREC_OK;
  if (!dst || (B && !src)) return dlrec_error(DLREC_ERR_INVALID, "sum_columns: NULL buffer");
#pragma omp parallel for schedule(static) if (B * C >= PARALLEL_MIN && C > 1)
  for (size_t c = 0; c < C; c++) {
    double acc = 0;
    for (size_t b = 0; b < B; b++) acc += src[b * C + c];
    dst[c] += (float)acc;
  }
  return DLREC_OK;
}

dlrec_status cpu_all_finite(int *finite, const float *x, size_t n) {
  if (!finite || (n && !x)) return dlrec_error(DLREC_ERR_INVALID, "all_finite: NULL buffer");
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
  *finite = !bad;
  return DLREC_OK;
}

dlrec_status cpu_scale(float *x, size_t n, float s) {
  if (!n) return DLREC_OK;
  if (!x) return dlrec_error(DLREC_ERR_INVALID, "scale: NULL buffer");
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
  for (size_t i = 0; i < n; i++) x[i] *= s;
  return DLREC_OK;
}
