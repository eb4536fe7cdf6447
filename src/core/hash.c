/* Byte-string hashing: 8 bytes at a time through the 64-bit mixer. */
#include "core/hash.h"

#include <string.h>

uint64_t dlrec_hash_bytes(const void *data, size_t n, uint64_t seed) {
  const unsigned char *p = data;
  uint64_t h = dlrec_mix64(seed ^ (0x9e3779b97f4a7c15ULL * (n + 1)));
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8); /* little-endian hosts only; dlrec's formats assume them */
    h = dlrec_mix64(h ^ w) + 0x632be59bd9b4e019ULL;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = dlrec_mix64(h ^ w ^ ((uint64_t)n << 56));
  }
  return dlrec_mix64(h);
}
