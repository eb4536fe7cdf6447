/* Byte-string hashing: 8 bytes at a time through the 64-bit mixer; the
 * secrets of the keyed index hash. */
#include "core/hash.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

void dlrec_random_secret(uint64_t secret[2]) {
  unsigned char *p = (unsigned char *)secret;
  size_t got = 0;
  while (got < 16) {
    const ssize_t n = getrandom(p + got, 16 - got, 0);
    if (n > 0) got += (size_t)n;
    else if (n < 0 && errno != EINTR) break;
  }
  if (got < 16) {
    FILE *f = fopen("/dev/urandom", "rb");
    got = f ? fread(secret, 1, 16, f) : 0;
    if (f) fclose(f);
  }
  if (got == 16) return;
  /* No source of randomness: a secret no other call returns, though one an
   * observer of the process could guess. */
  static atomic_uint_fast64_t calls;
  const uint64_t n = atomic_fetch_add(&calls, 1) + 1;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint64_t t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  secret[0] = dlrec_mix64(t ^ ((uint64_t)getpid() << 40) ^ dlrec_mix64(n));
  secret[1] = dlrec_mix64(secret[0] + 0x9e3779b97f4a7c15ULL * n);
}
