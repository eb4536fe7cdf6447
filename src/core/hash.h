/* Non-cryptographic hashing for keys, buckets and per-row decisions.
 * The values are part of dlrec's file formats (hashed categorical keys,
 * hash buckets, the train/valid split): never change them within a format
 * version. */
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

#endif
