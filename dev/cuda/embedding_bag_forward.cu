// Embedding bag forward on the GPU: each bag's rows of one fused table,
// pooled by sum or mean, fp32, bf16 or fp16 rows, one-hot or multi-hot bags (the
// CUDA twin of src/backend/cpu/bag.c's cpu_bag_forward, issue 11).
//
//   out[bag][d] = sum over k in [off[bag], off[bag+1]) of table[ids[k]][d]
//                 (times 1 / count for mean; an empty bag pools to 0)
//
// Bags are numbered sample-major (bag = b * F + c) and the output is
// (B, F, D) float32, as the CPU backend's. Sums run in float32 in id order,
// as the CPU's do, so every variant must match the CPU reference bit for
// bit (bf16 and fp16 rows widen exactly). An id outside the table sets a flag and
// pools as 0: the host turns the flag into an error.
//
// Variants:
//   1  naive: a thread per (bag, d)
//   2  a group of lanes per bag (as many as the row has 16-byte pieces, up
//      to a warp), each lane 16 bytes of a row at a time (float4, or 8
//      bf16 or fp16), four rows in flight before they are added in id order; small
//      rows (D = 16) share a warp among several bags
//
// usage: embedding_bag_forward [rows] [dim] [batch] [cols] [hot]
//   (defaults 2000000 128 65536 26 1); exits 77 (CTest: skipped) without a
//   CUDA device. Prints each variant's time and its bandwidth (the rows
//   gathered, the ids and the output) against the device's.
#include <vector>

#include <cuda_fp16.h>

#include <type_traits>

#include "common.h"

// An fp16 row element: its IEEE binary16 bits, as the CPU table stores them
// (src/backend/dtype.h); a type of its own, apart from bf16's uint16_t.
struct fp16 {
  uint16_t bits;
};

// ---- CPU reference ----

template <class T>
static float widen(T x);
template <>
float widen<float>(float x) {
  return x;
}
template <>
float widen<uint16_t>(uint16_t x) {
  return dtype_bf16_to_f32(x);
}
template <>
float widen<fp16>(fp16 x) {
  return dtype_fp16_to_f32(x.bits);
}

template <class T>
static void bag_forward_cpu(float *out, const T *table, uint64_t rows, int D, const uint32_t *off, const uint32_t *ids,
                            uint32_t bags, int mean, int *bad) {
  for (uint32_t g = 0; g < bags; g++) {
    float *o = out + (size_t)g * D;
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (uint32_t k = off[g]; k < off[g + 1]; k++) {
      if (ids[k] >= rows) {
        *bad = 1;
        continue;
      }
      const T *r = table + (size_t)ids[k] * D;
      for (int d = 0; d < D; d++) o[d] += widen(r[d]);
    }
    if (mean && off[g + 1] > off[g]) {
      const float inv = 1.0f / (float)(off[g + 1] - off[g]);
      for (int d = 0; d < D; d++) o[d] *= inv;
    }
  }
}

// ---- GPU ----

__device__ inline float widen_d(float x) { return x; }
__device__ inline float widen_d(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
__device__ inline float widen_d(fp16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <class T>
__global__ void bag_forward_naive(float *out, const T *table, uint64_t rows, int D, const uint32_t *off,
                                  const uint32_t *ids, uint32_t bags, int mean, int *bad) {
  const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (uint64_t)bags * D) return;
  const uint32_t g = (uint32_t)(i / D);
  const int d = (int)(i % D);
  float s = 0.0f;
  for (uint32_t k = off[g]; k < off[g + 1]; k++) {
    const uint32_t id = ids[k];
    if (id >= rows) {
      *bad = 1;
      continue;
    }
    s += widen_d(table[(size_t)id * D + d]);
  }
  if (mean && off[g + 1] > off[g]) s *= 1.0f / (float)(off[g + 1] - off[g]);
  out[i] = s;
}

// 16 bytes of a row: 4 floats, or 8 bf16 or fp16, widened.
template <class T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int N = 4;
  __device__ static void load(float *v, const float *p) {
    const float4 x = *reinterpret_cast<const float4 *>(p);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
  }
};
template <>
struct Vec<uint16_t> {
  static constexpr int N = 8;
  __device__ static void load(float *v, const uint16_t *p) {
    const uint4 x = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    for (int i = 0; i < 4; i++) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Vec<fp16> {
  static constexpr int N = 8;
  __device__ static void load(float *v, const fp16 *p) {
    const uint4 x = *reinterpret_cast<const uint4 *>(p);
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
    for (int i = 0; i < 4; i++) {
      v[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
      v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
  }
};

// LANES threads per bag (a power of two dividing 32); D a multiple of
// Vec<T>::N. Four rows are loaded before any is added, so that each lane has
// four gathers in flight; the adds stay in id order.
template <class T, int LANES>
__global__ void bag_forward_vec(float *out, const T *table, uint64_t rows, int D, const uint32_t *off,
                                const uint32_t *ids, uint32_t bags, int mean, int *bad) {
  constexpr int N = Vec<T>::N;
  const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t g = (uint32_t)(t / LANES);
  const int lane = (int)(t % LANES);
  if (g >= bags) return;
  const uint32_t lo = off[g], hi = off[g + 1];
  const float inv = mean && hi > lo ? 1.0f / (float)(hi - lo) : 1.0f;
  for (int d0 = lane * N; d0 < D; d0 += LANES * N) {
    float s[N];
    for (int j = 0; j < N; j++) s[j] = 0.0f;
    uint32_t k = lo;
    for (; k + 4 <= hi; k += 4) {
      float v[4][N];
      for (int u = 0; u < 4; u++) {
        const uint32_t id = ids[k + u];
        if (id < rows) {
          Vec<T>::load(v[u], table + (size_t)id * D + d0);
        } else {
          *bad = 1;
          for (int j = 0; j < N; j++) v[u][j] = 0.0f;
        }
      }
      for (int u = 0; u < 4; u++)
        for (int j = 0; j < N; j++) s[j] += v[u][j];
    }
    for (; k < hi; k++) {
      float v[N];
      const uint32_t id = ids[k];
      if (id < rows) {
        Vec<T>::load(v, table + (size_t)id * D + d0);
        for (int j = 0; j < N; j++) s[j] += v[j];
      } else {
        *bad = 1;
      }
    }
    // 16-byte stores: the output (fp32) is twice a 16-bit row's bytes, and
    // scalar stores left bf16 and fp16 at 30% of the bandwidth on an H100.
    float4 *o = reinterpret_cast<float4 *>(out + (size_t)g * D + d0);
    for (int j = 0; j < N; j += 4)
      o[j / 4] = mean ? make_float4(s[j] * inv, s[j + 1] * inv, s[j + 2] * inv, s[j + 3] * inv)
                      : make_float4(s[j], s[j + 1], s[j + 2], s[j + 3]);
  }
}

// ---- driver ----

template <class T>
static int run(const char *what, uint64_t rows, int D, uint32_t B, uint32_t F, uint32_t hot, int mean) {
  const uint32_t bags = B * F;
  std::vector<uint32_t> off, ids;
  make_bags(rows, bags, hot, off, ids);
  ids.back() = (uint32_t)rows; // one id past the table's end: the flag must say so; its row pools as 0
  std::vector<T> table((size_t)rows * D);
  for (size_t i = 0; i < table.size(); i++) {
    const float x = val(i, 0x5eed, 1.0f);
    if constexpr (std::is_same_v<T, uint16_t>) table[i] = dtype_f32_to_bf16(x);
    else if constexpr (std::is_same_v<T, fp16>) table[i].bits = dtype_f32_to_fp16(x);
    else table[i] = x;
  }
  std::vector<float> want((size_t)bags * D), got((size_t)bags * D);
  int bad_cpu = 0;
  bag_forward_cpu(want.data(), table.data(), rows, D, off.data(), ids.data(), bags, mean, &bad_cpu);

  T *d_table;
  uint32_t *d_off, *d_ids;
  float *d_out;
  int *d_bad;
  CUDA_CHECK(cudaMalloc(&d_table, table.size() * sizeof(T)));
  CUDA_CHECK(cudaMalloc(&d_off, off.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_ids, ids.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_out, want.size() * 4));
  CUDA_CHECK(cudaMalloc(&d_bad, 4));
  CUDA_CHECK(cudaMemcpy(d_table, table.data(), table.size() * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));

  const double bytes = (double)ids.size() * D * sizeof(T) + (double)want.size() * 4 + (double)ids.size() * 4 +
                       (double)off.size() * 4;
  int dev = 0, clock_khz = 0, bus_bits = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  const double peak = 2.0 * clock_khz * 1e3 * bus_bits / 8; // bytes/s, double data rate
  int failures = 0;
  for (int variant = 1; variant <= 2; variant++) {
    auto launch = [&]() {
      if (variant == 1) {
        const uint64_t n = (uint64_t)bags * D;
        bag_forward_naive<T><<<(unsigned)((n + 255) / 256), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean,
                                                                   d_bad);
      } else {
        // As many lanes a bag as the row has 16-byte pieces, up to a warp
        // (D = 16: 4 lanes for fp32, 2 for bf16 or fp16, so 8 or 16 bags a warp).
        const int vecs = D / Vec<T>::N;
        auto blocks = [&](int lanes) { return (unsigned)(((uint64_t)bags * lanes + 255) / 256); };
        if (vecs <= 2)
          bag_forward_vec<T, 2><<<blocks(2), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean, d_bad);
        else if (vecs <= 4)
          bag_forward_vec<T, 4><<<blocks(4), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean, d_bad);
        else if (vecs <= 8)
          bag_forward_vec<T, 8><<<blocks(8), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean, d_bad);
        else if (vecs <= 16)
          bag_forward_vec<T, 16><<<blocks(16), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean, d_bad);
        else
          bag_forward_vec<T, 32><<<blocks(32), 256>>>(d_out, d_table, rows, D, d_off, d_ids, bags, mean, d_bad);
      }
    };
    if (variant == 2 && D % Vec<T>::N) continue;
    CUDA_CHECK(cudaMemset(d_bad, 0, 4));
    CUDA_CHECK(cudaMemset(d_out, 0xff, want.size() * 4));
    launch();
    CUDA_CHECK(cudaGetLastError());
    int bad = 0;
    CUDA_CHECK(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&bad, d_bad, 4, cudaMemcpyDeviceToHost));
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
      if (std::memcmp(&got[i], &want[i], 4) != 0 && diff++ == 0) first = i;
    if (diff || bad != bad_cpu) {
      std::printf("  %s variant %d: FAIL: %zu values differ (first %zu: %.9g, want %.9g), flag %d (want %d)\n", what,
                  variant, diff, first, diff ? got[first] : 0.0f, diff ? want[first] : 0.0f, bad, bad_cpu);
      failures++;
      continue;
    }
    const float ms = time_ms(launch, 20);
    std::printf("  %s variant %d: bitwise equal; %.3f ms, %.0f GB/s", what, variant, ms, bytes / ms / 1e6);
    if (peak > 0) std::printf(" (%.0f%% of %.0f GB/s)", 100.0 * bytes / ms / 1e-3 / peak, peak / 1e9);
    std::printf(", %.1f M bags/s\n", bags / ms / 1e3);
  }
  CUDA_CHECK(cudaFree(d_table));
  CUDA_CHECK(cudaFree(d_off));
  CUDA_CHECK(cudaFree(d_ids));
  CUDA_CHECK(cudaFree(d_out));
  CUDA_CHECK(cudaFree(d_bad));
  return failures;
}

int main(int argc, char **argv) {
  BagArgs a;
  if (parse_bag_args(argc, argv, "embedding_bag_forward", 4096, &a)) return 2;
  require_gpu("embedding_bag_forward");
  const uint64_t rows = a.rows;
  const int D = a.D;
  const uint32_t B = a.B, F = a.F, hot = a.hot;
  int failures = 0;
  for (int mean = 0; mean <= 1; mean++) {
    failures += run<float>(mean ? "fp32 mean" : "fp32 sum ", rows, D, B, F, hot, mean);
    failures += run<uint16_t>(mean ? "bf16 mean" : "bf16 sum ", rows, D, B, F, hot, mean);
    failures += run<fp16>(mean ? "fp16 mean" : "fp16 sum ", rows, D, B, F, hot, mean);
  }
  // The small rows of Criteo's tables, multi-hot.
  failures += run<float>("fp32 D=16 multi-hot", rows, 16, B, F, 8, 1);
  failures += run<uint16_t>("bf16 D=16 multi-hot", rows, 16, B, F, 8, 0);
  failures += run<fp16>("fp16 D=16 multi-hot", rows, 16, B, F, 8, 1);
  return failures ? 1 : 0;
}
