// The embedding backward fused with the sparse optimizer on the GPU (the
// CUDA twin of src/backend/cpu/sparse_update.c, issue 11): no dense table
// gradient. Each id of the batch is an item (row, bag); the items are sorted
// by row (a stable radix sort, so the order within a row is the items'
// order and the result is deterministic); each run of equal rows is one
// unique row, whose gradient is the sum of its bags' output gradients
// (times 1 / count for mean pooling), summed in item order; the row is then
// updated in place by SGD, row-wise Adagrad (FBGEMM's: one accumulator a
// row, fed with the row's mean squared gradient) or lazy Adam (moments per
// element, a step count per row: only the batch's rows move), with weight
// decay.
//
//   gw      = g + wd * w
//   SGD:      w -= lr * gw
//   Adagrad:  acc += sum(gw^2) / D;  w -= lr / (sqrt(acc) + eps) * gw
//   Adam:     t = ++steps[row]; bc1 = 1 - b1^t, bc2 = 1 - b2^t (as -expm1(t log b))
//             m = b1 m + (1 - b1) gw;  v = b2 v + (1 - b2) gw^2
//             w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
//
// Products and sums use the _rn intrinsics (no contraction into FMA), and
// the reference sums each row's items in the kernels' order (a long run by
// segments, below), so each unique row's gradient is the reference's bit
// for bit; the CPU op sums a long run in item order, a rounding apart. Adagrad's
// sum of squares is a warp reduction, which the reference follows (the CPU
// op's loop sums in d order, a rounding apart), so SGD's and Adagrad's
// weights and accumulators must match bit for bit; Adam's moments and
// weights to a relative 1e-6 (its bias corrections come from CUDA's expm1
// and sqrt in double, which may differ from glibc's in the last bit; step
// counts exactly); and two GPU runs must agree bit for bit (determinism).
// On an H100 (2026-11-26) Adam matched bit for bit too.
//
// Items here are in bag-major order (bag = b * F + c, then position); the
// CPU backend lists them column-major, which the backend port will follow.
//
// usage: sparse_update [rows] [dim] [batch] [cols] [hot]
//   (defaults 2000000 128 65536 26 1); exits 77 (CTest: skipped) without a
//   CUDA device.
#include <algorithm>
#include <cmath>
#include <cub/cub.cuh>
#include <vector>

#include "common.h"

enum { OPT_SGD = 0, OPT_ADAGRAD = 1, OPT_ADAM = 2 };

struct Opt {
  int kind;
  float lr, wd, eps, b1, b2;
};

// Lazy Adam's state: moments (rows, D) and a step count a row.
struct AdamState {
  float *m, *v;
  uint32_t *steps;
};

// A unique row's items are summed by its warp in order when there are at
// most SHORT_RUN of them. A longer run (a hot row: with the test's skew the
// hottest row holds about 1% of a batch's ids) is cut into segments of
// seg_len(n) items, about sqrt(n) of them of about sqrt(n) items, each
// summed by a warp of its own; the row's warp then adds the segments' sums
// in order. Serially, the hottest row set the whole update's time.
constexpr uint32_t SHORT_RUN = 64;

__host__ __device__ inline uint32_t seg_len(uint32_t n) {
  uint32_t L = (uint32_t)sqrtf((float)n);
  while (L * L < n) L++;
  while (L > 1 && (L - 1) * (L - 1) >= n) L--;
  return L < 32 ? 32 : L;
}

// ---- CPU reference ----

static void reference(float *w, float *acc, AdamState st, int D, const uint32_t *off, const uint32_t *ids,
                      uint32_t bags, const float *dout, int mean, Opt o) {
  const uint32_t nnz = off[bags];
  std::vector<uint32_t> bag_of(nnz), order(nnz);
  for (uint32_t g = 0; g < bags; g++)
    for (uint32_t k = off[g]; k < off[g + 1]; k++) bag_of[k] = g;
  for (uint32_t k = 0; k < nnz; k++) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
  std::vector<float> g(D), gw(D), part(D);
  for (uint32_t s = 0; s < nnz;) {
    const uint32_t r = ids[order[s]];
    uint32_t e = s;
    while (e < nnz && ids[order[e]] == r) e++;
    // The row's items in order; a long run (more than SHORT_RUN items) in
    // segments of seg_len items, each summed in order from zero, then the
    // segments' sums in order, as the kernels do.
    const uint32_t n = e - s, L = n <= SHORT_RUN ? n : seg_len(n);
    std::fill(g.begin(), g.end(), 0.0f);
    for (uint32_t a = s; a < e; a += L) {
      std::fill(part.begin(), part.end(), 0.0f);
      for (uint32_t i = a; i < e && i < a + L; i++) {
        const uint32_t bag = bag_of[order[i]];
        const float inv = mean ? 1.0f / (float)(off[bag + 1] - off[bag]) : 1.0f;
        for (int d = 0; d < D; d++)
          part[d] += mean ? inv * dout[(size_t)bag * D + d] : dout[(size_t)bag * D + d];
      }
      for (int d = 0; d < D; d++) g[d] = n <= SHORT_RUN ? part[d] : g[d] + part[d];
    }
    float *wr = w + (size_t)r * D;
    if (o.kind == OPT_SGD) {
      for (int d = 0; d < D; d++) wr[d] -= o.lr * (g[d] + o.wd * wr[d]);
    } else if (o.kind == OPT_ADAM) {
      const uint32_t t = ++st.steps[r];
      const double bc1 = -std::expm1((double)t * std::log((double)o.b1));
      const double bc2 = -std::expm1((double)t * std::log((double)o.b2));
      const float step_size = (float)(o.lr / bc1), inv_sqrt_bc2 = (float)(1.0 / std::sqrt(bc2));
      float *m = st.m + (size_t)r * D, *v = st.v + (size_t)r * D;
      for (int d = 0; d < D; d++) {
        const float gd = g[d] + o.wd * wr[d];
        m[d] = o.b1 * m[d] + (1.0f - o.b1) * gd;
        v[d] = o.b2 * v[d] + (1.0f - o.b2) * gd * gd;
        wr[d] -= step_size * m[d] / (std::sqrt(v[d]) * inv_sqrt_bc2 + o.eps);
      }
    } else {
      // The squares summed in the GPU kernel's order, so the check is bit
      // for bit: each of a warp's 32 lanes sums d = lane, lane + 32, ...,
      // then the lanes' sums meet in an xor butterfly. (The CPU op sums in
      // d order: a rounding apart, which the whole-model tests allow.)
      float part[32] = {0.0f}, next[32];
      for (int d = 0; d < D; d++) {
        gw[d] = g[d] + o.wd * wr[d];
        part[d % 32] += gw[d] * gw[d];
      }
      for (int m = 16; m > 0; m /= 2) {
        for (int l = 0; l < 32; l++) next[l] = part[l] + part[l ^ m];
        std::copy(next, next + 32, part);
      }
      acc[r] += part[0] / (float)D;
      const float step = o.lr / (std::sqrt(acc[r]) + o.eps);
      for (int d = 0; d < D; d++) wr[d] -= step * gw[d];
    }
    s = e;
  }
}

// ---- GPU ----

// The bag of each item: offsets searched (the items of bag g are
// [off[g], off[g+1])).
__global__ void bag_of_items(uint32_t *bag_of, const uint32_t *off, uint32_t bags) {
  const uint32_t g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= bags) return;
  for (uint32_t k = off[g]; k < off[g + 1]; k++) bag_of[k] = g;
}

__global__ void iota(uint32_t *v, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) v[i] = i;
}

// What the segment and update kernels read (device pointers): the runs of
// equal rows (rows_u, count, start; n_unique of them), the long runs'
// segments (nseg and seg_start per run, seg_row per segment), the items.
struct Runs {
  const uint32_t *rows_u, *count, *start, *n_unique, *nseg, *seg_start, *seg_row;
  const uint32_t *sorted_items, *bag_of, *off;
  const float *dout;
  float *partial; // (segments, D): each segment's sum
  int mean;
};

// g (lane's d = lane, lane + 32, ...) += the items [a, b) in order; four
// items' loads in flight before their adds.
template <int PER_LANE>
__device__ inline void sum_items(float *g, uint32_t a, uint32_t b, int lane, int D, const Runs &R) {
  uint32_t i = a;
  for (; i + 4 <= b; i += 4) {
    uint32_t bag[4];
    float inv[4], v[4][PER_LANE];
    for (int u = 0; u < 4; u++) bag[u] = R.bag_of[R.sorted_items[i + u]];
    for (int u = 0; u < 4; u++) {
      inv[u] = R.mean ? __frcp_rn((float)(R.off[bag[u] + 1] - R.off[bag[u]])) : 1.0f;
      for (int j = 0; j < PER_LANE; j++) {
        const int d = lane + 32 * j;
        v[u][j] = d < D ? R.dout[(size_t)bag[u] * D + d] : 0.0f;
      }
    }
    for (int u = 0; u < 4; u++)
      for (int j = 0; j < PER_LANE; j++) g[j] = __fadd_rn(g[j], R.mean ? __fmul_rn(inv[u], v[u][j]) : v[u][j]);
  }
  for (; i < b; i++) {
    const uint32_t bag = R.bag_of[R.sorted_items[i]];
    const float inv = R.mean ? __frcp_rn((float)(R.off[bag + 1] - R.off[bag])) : 1.0f;
    for (int j = 0; j < PER_LANE; j++) {
      const int d = lane + 32 * j;
      if (d < D)
        g[j] = __fadd_rn(g[j], R.mean ? __fmul_rn(inv, R.dout[(size_t)bag * D + d]) : R.dout[(size_t)bag * D + d]);
    }
  }
}

// nseg[u]: the segments of run u (0 for a short run; 0 past n_unique, so the
// scan over all nnz entries counts the long runs' alone).
__global__ void seg_plan(uint32_t *nseg, const uint32_t *count, const uint32_t *n_unique, uint32_t nnz) {
  const uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= nnz) return;
  const uint32_t n = u < *n_unique ? count[u] : 0;
  nseg[u] = n > SHORT_RUN ? (n + seg_len(n) - 1) / seg_len(n) : 0;
}

// seg_row[seg_start[u] + k] = u for each segment k of run u.
__global__ void seg_rows(uint32_t *seg_row, const uint32_t *nseg, const uint32_t *seg_start,
                         const uint32_t *n_unique) {
  const uint32_t u = blockIdx.x * blockDim.x + threadIdx.x;
  if (u >= *n_unique) return;
  for (uint32_t k = 0; k < nseg[u]; k++) seg_row[seg_start[u] + k] = u;
}

// A warp per segment (seg_row past the last one is all ones: those return).
template <int PER_LANE>
__global__ void seg_sum(Runs R, int D, uint32_t seg_cap) {
  const uint32_t s = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (s >= seg_cap) return;
  const uint32_t u = R.seg_row[s];
  if (u == 0xffffffffu) return;
  const uint32_t n = R.count[u], L = seg_len(n), a = R.start[u] + (s - R.seg_start[u]) * L;
  const uint32_t b = a + L < R.start[u] + n ? a + L : R.start[u] + n;
  float g[PER_LANE];
  for (int j = 0; j < PER_LANE; j++) g[j] = 0.0f;
  sum_items<PER_LANE>(g, a, b, lane, D, R);
  for (int j = 0; j < PER_LANE; j++) {
    const int d = lane + 32 * j;
    if (d < D) R.partial[(size_t)s * D + d] = g[j];
  }
}

// One warp per unique row u: its gradient from its items in order (a short
// run) or its segments' sums in order (a long one), then the row updated in
// place. Lanes take d = lane, lane + 32, ...; D <= 32 * 8.
template <int PER_LANE>
__global__ void reduce_update(float *w, float *acc, AdamState st, int D, Runs R, Opt o) {
  const uint32_t u = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (u >= *R.n_unique) return;
  const uint32_t r = R.rows_u[u], n = R.count[u];
  float g[PER_LANE];
  for (int j = 0; j < PER_LANE; j++) g[j] = 0.0f;
  if (n <= SHORT_RUN) {
    sum_items<PER_LANE>(g, R.start[u], R.start[u] + n, lane, D, R);
  } else {
    for (uint32_t k = 0; k < R.nseg[u]; k++) {
      const float *p = R.partial + (size_t)(R.seg_start[u] + k) * D;
      for (int j = 0; j < PER_LANE; j++) {
        const int d = lane + 32 * j;
        if (d < D) g[j] = __fadd_rn(g[j], p[d]);
      }
    }
  }
  float *wr = w + (size_t)r * D;
  float gw[PER_LANE], sq = 0.0f;
  for (int j = 0; j < PER_LANE; j++) {
    const int d = lane + 32 * j;
    gw[j] = d < D ? __fadd_rn(g[j], __fmul_rn(o.wd, wr[d])) : 0.0f;
    sq = __fadd_rn(sq, __fmul_rn(gw[j], gw[j]));
  }
  if (o.kind == OPT_SGD) {
    for (int j = 0; j < PER_LANE; j++) {
      const int d = lane + 32 * j;
      if (d < D) wr[d] = __fsub_rn(wr[d], __fmul_rn(o.lr, gw[j]));
    }
    return;
  }
  if (o.kind == OPT_ADAM) {
    // A unique row is one warp's alone: its step count needs no atomic.
    const uint32_t t = st.steps[r] + 1;
    const double bc1 = -expm1((double)t * log((double)o.b1)), bc2 = -expm1((double)t * log((double)o.b2));
    const float step_size = (float)(o.lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    __syncwarp();
    if (lane == 0) st.steps[r] = t;
    float *m = st.m + (size_t)r * D, *v = st.v + (size_t)r * D;
    for (int j = 0; j < PER_LANE; j++) {
      const int d = lane + 32 * j;
      if (d >= D) continue;
      const float gd = gw[j];
      m[d] = __fadd_rn(__fmul_rn(o.b1, m[d]), __fmul_rn(__fsub_rn(1.0f, o.b1), gd));
      v[d] = __fadd_rn(__fmul_rn(o.b2, v[d]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, o.b2), gd), gd));
      const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v[d]), inv_sqrt_bc2), o.eps);
      wr[d] = __fsub_rn(wr[d], __fdiv_rn(__fmul_rn(step_size, m[d]), den));
    }
    return;
  }
  for (int m = 16; m > 0; m /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, m));
  const float a = __fadd_rn(acc[r], __fdiv_rn(sq, (float)D));
  const float step = __fdiv_rn(o.lr, __fadd_rn(__fsqrt_rn(a), o.eps));
  __syncwarp();
  if (lane == 0) acc[r] = a;
  for (int j = 0; j < PER_LANE; j++) {
    const int d = lane + 32 * j;
    if (d < D) wr[d] = __fsub_rn(wr[d], __fmul_rn(step, gw[j]));
  }
}

// ---- driver ----

struct Gpu {
  uint32_t *off, *ids, *bag_of, *items, *sorted_rows, *sorted_items, *rows_u, *count, *start, *n_unique;
  uint32_t *nseg, *seg_start, *seg_row;
  float *w, *acc, *dout, *partial;
  AdamState adam;
  void *tmp;
  size_t tmp_bytes;
  int key_bits;     // the rows' ids fit in this many bits: the sort's passes
  uint32_t seg_cap; // segments at most: a long run of n > 64 items has at most 3n / 64
};

// The whole backward + update on the device, with no wait for the host (the
// number of unique rows stays on the device: the grids are sized for every
// item being unique, and the warps past the count return); the result left
// in g.w, g.acc. With ev, an event recorded after each phase (the items, the
// sort, the runs, the long runs' segments, the update).
template <int PER_LANE>
static void launch_update(Gpu &g, int D, uint32_t nnz, int mean, Opt o, cudaEvent_t *ev) {
  const Runs R = {g.rows_u, g.count, g.start, g.n_unique, g.nseg, g.seg_start, g.seg_row, g.sorted_items, g.bag_of,
                  g.off, g.dout, g.partial, mean};
  seg_plan<<<(nnz + 255) / 256, 256>>>(g.nseg, g.count, g.n_unique, nnz);
  size_t bytes = g.tmp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(g.tmp, bytes, g.nseg, g.seg_start, (int)nnz));
  CUDA_CHECK(cudaMemsetAsync(g.seg_row, 0xff, (size_t)g.seg_cap * 4));
  seg_rows<<<(nnz + 255) / 256, 256>>>(g.seg_row, g.nseg, g.seg_start, g.n_unique);
  seg_sum<PER_LANE><<<(unsigned)(((uint64_t)g.seg_cap * 32 + 255) / 256), 256>>>(R, D, g.seg_cap);
  if (ev) CUDA_CHECK(cudaEventRecord(ev[3]));
  reduce_update<PER_LANE><<<(unsigned)(((uint64_t)nnz * 32 + 255) / 256), 256>>>(g.w, g.acc, g.adam, D, R, o);
}

static void step(Gpu &g, int D, uint32_t bags, uint32_t nnz, int mean, Opt o, cudaEvent_t *ev = nullptr) {
  bag_of_items<<<(bags + 255) / 256, 256>>>(g.bag_of, g.off, bags);
  iota<<<(nnz + 255) / 256, 256>>>(g.items, nnz);
  if (ev) CUDA_CHECK(cudaEventRecord(ev[0]));
  size_t bytes = g.tmp_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(g.tmp, bytes, g.ids, g.sorted_rows, g.items, g.sorted_items, (int)nnz, 0,
                                             g.key_bits));
  if (ev) CUDA_CHECK(cudaEventRecord(ev[1]));
  bytes = g.tmp_bytes;
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(g.tmp, bytes, g.sorted_rows, g.rows_u, g.count, g.n_unique, (int)nnz));
  bytes = g.tmp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(g.tmp, bytes, g.count, g.start, (int)nnz));
  if (ev) CUDA_CHECK(cudaEventRecord(ev[2]));
  if (D <= 32) launch_update<1>(g, D, nnz, mean, o, ev);
  else if (D <= 64) launch_update<2>(g, D, nnz, mean, o, ev);
  else if (D <= 128) launch_update<4>(g, D, nnz, mean, o, ev);
  else launch_update<8>(g, D, nnz, mean, o, ev);
  CUDA_CHECK(cudaGetLastError());
}

static int run(const char *what, uint64_t rows, int D, uint32_t B, uint32_t F, uint32_t hot, int mean, Opt o) {
  const uint32_t bags = B * F;
  std::vector<uint32_t> off, ids;
  make_bags(rows, bags, hot, off, ids); // hot rows repeat: long runs
  const uint32_t nnz = (uint32_t)ids.size();
  std::vector<float> w((size_t)rows * D), acc(rows), dout((size_t)bags * D);
  for (size_t i = 0; i < w.size(); i++) w[i] = val(i, 0, 1.0f);
  for (size_t i = 0; i < acc.size(); i++) acc[i] = std::fabs(val(i, 7, 1.0f));
  for (size_t i = 0; i < dout.size(); i++) dout[i] = val(i, 99, 0.25f);
  // Adam's state (Adam runs only): moments mid-training, rows at steps 0 to 4.
  const size_t adam_n = o.kind == OPT_ADAM ? w.size() : 0;
  std::vector<float> m(adam_n), v(adam_n);
  std::vector<uint32_t> steps(o.kind == OPT_ADAM ? rows : 0);
  for (size_t i = 0; i < adam_n; i++) m[i] = val(i, 3, 0.1f), v[i] = std::fabs(val(i, 5, 0.01f));
  for (size_t i = 0; i < steps.size(); i++) steps[i] = (uint32_t)(i % 5);
  std::vector<float> w_ref = w, acc_ref = acc, m_ref = m, v_ref = v;
  std::vector<uint32_t> steps_ref = steps;
  reference(w_ref.data(), acc_ref.data(), AdamState{m_ref.data(), v_ref.data(), steps_ref.data()}, D, off.data(),
            ids.data(), bags, dout.data(), mean, o);

  Gpu g{};
  CUDA_CHECK(cudaMalloc(&g.off, off.size() * 4));
  CUDA_CHECK(cudaMalloc(&g.ids, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.bag_of, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.items, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.sorted_rows, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.sorted_items, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.rows_u, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.count, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.start, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.n_unique, 4));
  g.seg_cap = (uint32_t)(3 * (uint64_t)nnz / 64 + 1);
  CUDA_CHECK(cudaMalloc(&g.nseg, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.seg_start, (size_t)nnz * 4));
  CUDA_CHECK(cudaMalloc(&g.seg_row, (size_t)g.seg_cap * 4));
  CUDA_CHECK(cudaMalloc(&g.partial, (size_t)g.seg_cap * D * 4));
  CUDA_CHECK(cudaMalloc(&g.w, w.size() * 4));
  CUDA_CHECK(cudaMalloc(&g.acc, acc.size() * 4));
  CUDA_CHECK(cudaMalloc(&g.dout, dout.size() * 4));
  if (o.kind == OPT_ADAM) {
    CUDA_CHECK(cudaMalloc(&g.adam.m, adam_n * 4));
    CUDA_CHECK(cudaMalloc(&g.adam.v, adam_n * 4));
    CUDA_CHECK(cudaMalloc(&g.adam.steps, steps.size() * 4));
  }
  g.key_bits = 1;
  while (g.key_bits < 32 && (rows - 1) >> g.key_bits) g.key_bits++;
  size_t a = 0, b = 0, c = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, a, g.ids, g.sorted_rows, g.items, g.sorted_items, (int)nnz, 0,
                                             g.key_bits));
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, b, g.sorted_rows, g.rows_u, g.count, g.n_unique, (int)nnz));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, c, g.count, g.start, (int)nnz));
  g.tmp_bytes = std::max(a, std::max(b, c));
  CUDA_CHECK(cudaMalloc(&g.tmp, g.tmp_bytes));
  CUDA_CHECK(cudaMemcpy(g.off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(g.ids, ids.data(), (size_t)nnz * 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(g.dout, dout.data(), dout.size() * 4, cudaMemcpyHostToDevice));

  int failures = 0;
  std::vector<float> w_got[2], acc_got[2], m_got[2], v_got[2];
  std::vector<uint32_t> steps_got[2];
  for (int pass = 0; pass < 2; pass++) { // twice: the two results must be the same bits
    CUDA_CHECK(cudaMemcpy(g.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(g.acc, acc.data(), acc.size() * 4, cudaMemcpyHostToDevice));
    if (adam_n) {
      CUDA_CHECK(cudaMemcpy(g.adam.m, m.data(), adam_n * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(g.adam.v, v.data(), adam_n * 4, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(g.adam.steps, steps.data(), steps.size() * 4, cudaMemcpyHostToDevice));
    }
    step(g, D, bags, nnz, mean, o);
    w_got[pass].resize(w.size());
    acc_got[pass].resize(acc.size());
    m_got[pass].resize(adam_n);
    v_got[pass].resize(adam_n);
    steps_got[pass].resize(steps.size());
    CUDA_CHECK(cudaMemcpy(w_got[pass].data(), g.w, w.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(acc_got[pass].data(), g.acc, acc.size() * 4, cudaMemcpyDeviceToHost));
    if (adam_n) {
      CUDA_CHECK(cudaMemcpy(m_got[pass].data(), g.adam.m, adam_n * 4, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(v_got[pass].data(), g.adam.v, adam_n * 4, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(steps_got[pass].data(), g.adam.steps, steps.size() * 4, cudaMemcpyDeviceToHost));
    }
  }
  if (w_got[0] != w_got[1] || acc_got[0] != acc_got[1] || m_got[0] != m_got[1] || v_got[0] != v_got[1] ||
      steps_got[0] != steps_got[1]) {
    std::printf("  %s: FAIL: two runs differ\n", what);
    failures++;
  }
  if (steps_got[0] != steps_ref) {
    std::printf("  %s: FAIL: the rows' step counts differ from the reference's\n", what);
    failures++;
  }
  double worst = 0;
  size_t at = 0;
  auto compare = [&](const std::vector<float> &got, const std::vector<float> &want) {
    for (size_t i = 0; i < want.size(); i++) {
      const double e = std::fabs((double)got[i] - want[i]) / (std::fabs((double)want[i]) + 1e-3);
      if (e > worst) worst = e, at = i;
    }
  };
  compare(w_got[0], w_ref);
  compare(acc_got[0], acc_ref);
  compare(m_got[0], m_ref);
  compare(v_got[0], v_ref);
  if (!(worst <= (o.kind == OPT_ADAM ? 1e-6 : 0.0))) {
    std::printf("  %s: FAIL: relative error %.3g at %zu\n", what, worst, at);
    failures++;
  }
  // Timed on fresh copies of the state each time would measure copies: the
  // state drifts across the repetitions instead, which costs the same.
  const float ms = time_ms([&]() { step(g, D, bags, nnz, mean, o); }, 10);
  if (!failures) {
    std::printf("  %s: deterministic, within %.1e of the reference; %.3f ms (%.1f M ids/s)\n", what, worst, ms,
                nnz / ms / 1e3);
    cudaEvent_t ev[6];
    for (auto &e : ev) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(ev[5]));
    step(g, D, bags, nnz, mean, o, ev);
    CUDA_CHECK(cudaEventRecord(ev[4]));
    CUDA_CHECK(cudaEventSynchronize(ev[4]));
    float at[5];
    CUDA_CHECK(cudaEventElapsedTime(&at[0], ev[5], ev[0]));
    for (int k = 1; k < 5; k++) CUDA_CHECK(cudaEventElapsedTime(&at[k], ev[k - 1], ev[k]));
    std::printf("    phases: items %.3f ms, sort (%d bits) %.3f, runs %.3f, long runs' segments %.3f, update %.3f\n",
                at[0], g.key_bits, at[1], at[2], at[3], at[4]);
    for (auto &e : ev) cudaEventDestroy(e);
  }
  cudaFree(g.off), cudaFree(g.ids), cudaFree(g.bag_of), cudaFree(g.items), cudaFree(g.sorted_rows);
  cudaFree(g.sorted_items), cudaFree(g.rows_u), cudaFree(g.count), cudaFree(g.start), cudaFree(g.n_unique);
  cudaFree(g.nseg), cudaFree(g.seg_start), cudaFree(g.seg_row), cudaFree(g.partial);
  cudaFree(g.w), cudaFree(g.acc), cudaFree(g.dout), cudaFree(g.tmp);
  cudaFree(g.adam.m), cudaFree(g.adam.v), cudaFree(g.adam.steps);
  return failures;
}

int main(int argc, char **argv) {
  BagArgs a;
  if (parse_bag_args(argc, argv, "sparse_update", 256, &a)) return 2;
  require_gpu("sparse_update");
  const uint64_t rows = a.rows;
  const int D = a.D;
  const uint32_t B = a.B, F = a.F, hot = a.hot;
  const Opt sgd = {OPT_SGD, 0.05f, 1e-4f, 0.0f, 0.0f, 0.0f};
  const Opt adagrad = {OPT_ADAGRAD, 0.05f, 1e-4f, 1e-10f, 0.0f, 0.0f};
  const Opt adam = {OPT_ADAM, 0.001f, 1e-4f, 1e-8f, 0.9f, 0.999f};
  int failures = 0;
  failures += run("sgd, sum", rows, D, B, F, hot, 0, sgd);
  failures += run("rowwise adagrad, sum", rows, D, B, F, hot, 0, adagrad);
  failures += run("rowwise adagrad, mean, multi-hot", rows, D, B, F, 8, 1, adagrad);
  failures += run("rowwise adagrad, D=16", rows, 16, B, F, hot, 0, adagrad);
  failures += run("lazy adam, sum", rows, D, B, F, hot, 0, adam);
  failures += run("lazy adam, mean, multi-hot", rows, D, B, F, 8, 1, adam);
  return failures ? 1 : 0;
}
