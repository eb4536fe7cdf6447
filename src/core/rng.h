/* A seedable, splittable random number generator (xoshiro256**).
 *
 * Streams: dlrec_rng_seed(r, seed, stream) gives statistically independent
 * sequences for different streams of one seed, so parallel work seeds chunk
 * i with stream i and the result does not depend on the thread count.
 * The state is plain data: copy it to checkpoint it.
 */
#ifndef DLREC_RNG_H
#define DLREC_RNG_H

#include <stdint.h>

typedef struct dlrec_rng {
  uint64_t s[4];
} dlrec_rng;

void dlrec_rng_seed(dlrec_rng *r, uint64_t seed, uint64_t stream);
uint64_t dlrec_rng_u64(dlrec_rng *r);
/* Uniform in [0, n) without modulo bias; n > 0. */
uint32_t dlrec_rng_below(dlrec_rng *r, uint32_t n);
/* Uniform in [0, 1) with 53 random bits. */
double dlrec_rng_uniform(dlrec_rng *r);
/* Standard normal (Box-Muller, one value per call). */
double dlrec_rng_normal(dlrec_rng *r);
/* Fisher-Yates shuffle of n uint32 values. */
void dlrec_rng_shuffle_u32(dlrec_rng *r, uint32_t *v, uint32_t n);

#endif
