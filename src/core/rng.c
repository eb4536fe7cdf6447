/* xoshiro256** seeded through SplitMix64 (Blackman and Vigna). */
#include "core/rng.h"

#include <math.h>

#include "core/hash.h"

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void dlrec_rng_seed(dlrec_rng *r, uint64_t seed, uint64_t stream) {
  /* Seed and stream go through the mixer separately, so (seed, stream) pairs
   * that sum or xor to the same value still give unrelated states. */
  uint64_t x = dlrec_mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ dlrec_mix64(stream + 0x9e3779b97f4a7c15ULL);
  for (int i = 0; i < 4; i++) {
    x += 0x9e3779b97f4a7c15ULL;
    r->s[i] = dlrec_mix64(x);
  }
  if (!(r->s[0] | r->s[1] | r->s[2] | r->s[3])) r->s[0] = 1; /* the one forbidden state */
}

uint64_t dlrec_rng_u64(dlrec_rng *r) {
  uint64_t *s = r->s;
  const uint64_t result = rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint32_t dlrec_rng_below(dlrec_rng *r, uint32_t n) {
  /* Lemire's multiply-and-reject: unbiased, one multiplication in the common case. */
  uint64_t m = (uint64_t)(uint32_t)(dlrec_rng_u64(r) >> 32) * n;
  uint32_t lo = (uint32_t)m;
  if (lo < n) {
    uint32_t threshold = -n % n;
    while (lo < threshold) {
      m = (uint64_t)(uint32_t)(dlrec_rng_u64(r) >> 32) * n;
      lo = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

double dlrec_rng_uniform(dlrec_rng *r) { return (double)(dlrec_rng_u64(r) >> 11) * 0x1.0p-53; }

double dlrec_rng_normal(dlrec_rng *r) {
  double u1 = 1.0 - dlrec_rng_uniform(r); /* (0, 1]: log is finite */
  double u2 = dlrec_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void dlrec_rng_shuffle_u32(dlrec_rng *r, uint32_t *v, uint32_t n) {
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = dlrec_rng_below(r, i);
    uint32_t t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}
