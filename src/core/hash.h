/* Hashing for keys, buckets and per-row decisions. The unkeyed hashes'
 * values are part of dlrec's file formats (hashed categorical keys, hash
 * buckets, the train/valid split): never change them within a format
 * version. The keyed one (dlrec_siphash13_u64) places keys that an outsider
 * chooses in in-memory indexes, where an unkeyed, invertible hash would let
 * them pick keys that all land on one probe chain. */
#ifndef DLREC_HASH_H
#define DLREC_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Callable from CUDA kernels too (the CUDA backend's dropout masks are the
 * CPU's bit for bit). */
#ifdef __CUDACC__
#define DLREC_HOST_DEVICE __host__ __device__
#else
#define DLREC_HOST_DEVICE
#endif

/* A bijective 64-bit mixer (the SplitMix64 finalizer). */
static inline DLREC_HOST_DEVICE uint64_t dlrec_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* Hash of a byte string with a seed. Stable across platforms. */
uint64_t dlrec_hash_bytes(const void *data, size_t n, uint64_t seed);

static inline uint64_t dlrec_rotl64(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

/* SipHash (Aumasson and Bernstein, the public-domain reference's structure)
 * of the 8 bytes of m, little-endian, under the 128-bit key (k0, k1): c
 * compression rounds per block, d finalization rounds. Without the key, an
 * outsider can neither invert it nor find keys that collide in its low bits
 * faster than by chance. */
static inline uint64_t dlrec_siphash_u64(uint64_t m, uint64_t k0, uint64_t k1, int c, int d) {
  uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
#define DLREC_SIPROUND                                                                              \
  (v0 += v1, v1 = dlrec_rotl64(v1, 13), v1 ^= v0, v0 = dlrec_rotl64(v0, 32), v2 += v3,             \
   v3 = dlrec_rotl64(v3, 16), v3 ^= v2, v0 += v3, v3 = dlrec_rotl64(v3, 21), v3 ^= v0, v2 += v1,    \
   v1 = dlrec_rotl64(v1, 17), v1 ^= v2, v2 = dlrec_rotl64(v2, 32))
  /* The message block, then the last block: no bytes left, the length (8)
   * in the top byte. */
  const uint64_t last = 8ULL << 56;
  v3 ^= m;
  for (int i = 0; i < c; i++) DLREC_SIPROUND;
  v0 ^= m;
  v3 ^= last;
  for (int i = 0; i < c; i++) DLREC_SIPROUND;
  v0 ^= last;
  v2 ^= 0xff;
  for (int i = 0; i < d; i++) DLREC_SIPROUND;
#undef DLREC_SIPROUND
  return v0 ^ v1 ^ v2 ^ v3;
}

/* SipHash-1-3 (as Rust's and Python's hash tables use): the index hash. */
static inline uint64_t dlrec_siphash13_u64(uint64_t m, uint64_t k0, uint64_t k1) {
  return dlrec_siphash_u64(m, k0, k1, 1, 3);
}

/* A fresh 128-bit secret for a keyed hash: from getrandom(2), else
 * /dev/urandom, else (neither available) the clock, the process id and a
 * counter mixed, so that two calls never return the same secret. */
void dlrec_random_secret(uint64_t secret[2]);

#endif
