/* 16-bit storage of embedding rows: bf16 and fp16 conversions in plain C (bit
 * manipulation, so every CPU gives the same bits), and the stochastic
 * rounding that the sparse update writes rows back with.
 *
 * Why stochastic rounding: an SGD step is often far smaller than a bf16 row
 * value's last place (8 bits of mantissa), so round-to-nearest would drop
 * most updates and the table would stop learning. Rounding up with a
 * probability equal to the dropped fraction keeps the expected stored value
 * equal to the fp32 result (FBGEMM's TBE does the same).
 *
 * Determinism: the random draw is a pure function of (update counter, row,
 * coordinate), a counter-based hash, so a row gets the same bits whichever
 * thread updates it and however many threads there are.
 */
#ifndef DLREC_BACKEND_DTYPE_H
#define DLREC_BACKEND_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/hash.h" /* DLREC_HOST_DEVICE: the CUDA backend rounds 16-bit rows with these */

static inline DLREC_HOST_DEVICE uint32_t dtype_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
static inline DLREC_HOST_DEVICE float dtype_bits_f32(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* bf16 is the top half of an fp32: widening is a shift. */
static inline DLREC_HOST_DEVICE float dtype_bf16_to_f32(uint16_t h) { return dtype_bits_f32((uint32_t)h << 16); }

/* Round to nearest, ties to even; NaN stays a (quiet) NaN. */
static inline DLREC_HOST_DEVICE uint16_t dtype_f32_to_bf16(float x) {
  uint32_t u = dtype_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* fp16 (IEEE binary16): 5 exponent bits, 10 mantissa bits, subnormals.
 * Shifting the exponent and mantissa into place and rebiasing the exponent
 * is exact for normals; infinities and NaN get the rest of the exponent
 * range, and subnormals are renormalized by one float subtraction (exact:
 * both operands are powers of two apart by at most 2^10). Written as
 * selects so that the pooling loop vectorizes. */
static inline DLREC_HOST_DEVICE float dtype_fp16_to_f32(uint16_t h) {
  const uint32_t shifted = (uint32_t)(h & 0x7fffu) << 13, exp = shifted & 0x0f800000u;
  const uint32_t is_special = 0u - (uint32_t)(exp == 0x0f800000u), is_sub = 0u - (uint32_t)(exp == 0);
  const uint32_t o = shifted + ((127u - 15u) << 23) + (is_special & ((128u - 16u) << 23));
  const float sub = dtype_bits_f32(o + (1u << 23)) - dtype_bits_f32(113u << 23);
  const uint32_t mag = (is_sub & dtype_f32_bits(sub)) | (~is_sub & o);
  return dtype_bits_f32(mag | ((uint32_t)(h & 0x8000u) << 16));
}

/* Round toward zero (truncation), the lower neighbour in magnitude of x's two
 * fp16 neighbours; magnitudes beyond the largest finite fp16 (65504) give it.
 * NaN stays NaN, infinities stay infinite. */
static inline DLREC_HOST_DEVICE uint16_t dtype_f32_to_fp16_rtz(float x) {
  const uint32_t u = dtype_f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  const int e = (int)(a >> 23) - 127; /* unbiased exponent */
  if (e > 15) return (uint16_t)(sign | 0x7bffu);
  if (e >= -14) return (uint16_t)(sign | ((uint32_t)(e + 15) << 10) | ((a >> 13) & 0x3ffu));
  if (e < -25) return (uint16_t)sign;
  /* Subnormal: the value in units of 2^-24, truncated. */
  const uint32_t m = (a & 0x7fffffu) | 0x800000u; /* the significand, times 2^23 */
  return (uint16_t)(sign | (m >> (-e - 1)));
}

/* Round to nearest, ties to even: from the truncation and the exact
 * remainder, which float arithmetic gives exactly here (both neighbours and x
 * are floats within a factor of 2). Magnitudes at or beyond 65520 become
 * infinite, as IEEE rounding says. */
static inline DLREC_HOST_DEVICE uint16_t dtype_f32_to_fp16(float x) {
  const uint16_t lo = dtype_f32_to_fp16_rtz(x);
  if ((lo & 0x7fffu) >= 0x7c00u) return lo; /* inf, NaN */
  const float ax = fabsf(x), alo = fabsf(dtype_fp16_to_f32(lo));
  const float ahi = (lo & 0x7fffu) == 0x7bffu ? 65536.0f : fabsf(dtype_fp16_to_f32((uint16_t)(lo + 1)));
  const float below = ax - alo, above = ahi - ax;
  if (below > above || (below == above && (lo & 1u))) return (uint16_t)(lo + 1); /* 0x7bff + 1 is inf */
  return lo;
}

/* A 64-bit mix (splitmix64's finalizer): every input bit reaches every
 * output bit, so neighbouring keys give independent-looking draws. */
static inline DLREC_HOST_DEVICE uint64_t dtype_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Four 16-bit random draws for coordinates 4k .. 4k + 3 of `row` at update
 * `counter`, draw j in bits 16j .. 16j + 15. A pure function of its inputs. */
static inline DLREC_HOST_DEVICE uint64_t dtype_sr_key(uint64_t counter) { return dtype_mix64(counter + 0x9e3779b97f4a7c15ull); }
static inline DLREC_HOST_DEVICE uint64_t dtype_sr_draws_keyed(uint64_t key, uint32_t row, uint32_t k) {
  return dtype_mix64(key ^ (((uint64_t)row << 10) | k));
}
static inline DLREC_HOST_DEVICE uint64_t dtype_sr_draws(uint64_t counter, uint32_t row, uint32_t k) {
  return dtype_sr_draws_keyed(dtype_sr_key(counter), row, k);
}

/* bf16 with stochastic rounding: adding a uniform 16-bit draw to the bits
 * that truncation drops carries into the kept half with probability equal
 * to the dropped fraction, so E[result] = x exactly. Infinities and NaN are
 * rounded to nearest. */
static inline DLREC_HOST_DEVICE uint16_t dtype_f32_to_bf16_sr(float x, uint32_t draw16) {
  const uint32_t u = dtype_f32_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return dtype_f32_to_bf16(x);
  return (uint16_t)((u + (draw16 & 0xffffu)) >> 16);
}

/* fp16 with stochastic rounding: the upper neighbour in magnitude with
 * probability equal to the dropped fraction. In fp16's normal range the
 * dropped part is fp32's low 13 mantissa bits, so adding 13 random bits and
 * truncating is exact (as for bf16); in the subnormal range, |x| * 2^24 is
 * exact and its fraction is compared with the 16-bit draw (resolved to
 * 1/65536 of a last place). Magnitudes from the largest finite fp16 (65504)
 * up, infinities and NaN are rounded to nearest. */
static inline DLREC_HOST_DEVICE uint16_t dtype_f32_to_fp16_sr(float x, uint32_t draw16) {
  const uint32_t u = dtype_f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x38800000u && a < 0x477fe000u) { /* [2^-14, 65504) */
    const uint32_t t = a + ((draw16 & 0xffffu) >> 3);
    return (uint16_t)(sign | ((t >> 13) - ((127u - 15u) << 10)));
  }
  if (a < 0x38800000u) {
    const float v = dtype_bits_f32(a) * 0x1p24f, fl = floorf(v);
    const uint32_t up = (v - fl) * 65536.0f > (float)(draw16 & 0xffffu);
    return (uint16_t)(sign | ((uint32_t)fl + up));
  }
  return dtype_f32_to_fp16(x);
}

#endif
