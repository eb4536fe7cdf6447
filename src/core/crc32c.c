/* CRC32C: the SSE4.2 crc32 instruction where available, else slicing-by-8. */
#include "core/crc32c.h"

#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define POLY 0x82f63b78u /* Castagnoli, reflected */

static uint32_t table[8][256];
static int table_ready; /* written once; racing initializers write the same values */

static void init_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
  __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

static uint32_t crc_soft(uint32_t crc, const unsigned char *p, size_t n) {
  if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE)) init_table();
  while (n && ((uintptr_t)p & 7)) {
    crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
          table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
          table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
  uint64_t c = crc;
  while (n && ((uintptr_t)p & 7)) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    n--;
  }
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return (uint32_t)c;
}
#endif

/* Exposed for the test that checks the two paths agree. */
uint32_t dlrec_crc32c_soft(uint32_t crc, const void *data, size_t n);
uint32_t dlrec_crc32c_soft(uint32_t crc, const void *data, size_t n) {
  return ~crc_soft(~crc, data, n);
}

uint32_t dlrec_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc_hw(~crc, data, n);
#endif
  return ~crc_soft(~crc, data, n);
}
