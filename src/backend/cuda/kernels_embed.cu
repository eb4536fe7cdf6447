// The CUDA backend's kernels (declared in cuda_kernels.h, called by the ops of
// cuda_*.c): the embedding bags' forward and the fused sparse update. They came
// from dev/cuda/, where each was checked bit for bit or within its stated bound
// against a CPU reference and timed on an H100; the op-by-op test
// (tests/test_backend.c) checks them here against the same double references as
// the CPU backend's.
//
// Products and sums that the CPU rounds one by one use the _rn intrinsics
// where the result is compared bit for bit (dropout's masks, the copies);
// elsewhere the compiler may contract into FMA, which the op tests' bounds
// allow. Reductions are fixed trees or in-order loops: two runs give the
// same bits.
#include "backend/cuda/kernels.cuh"

#include <cub/cub.cuh>

#include "backend/dtype.h"
#include "core/hash.h"

namespace {

// ---- embedding bags ----

__device__ inline float row_elem(const cuk_rows &t, size_t i) {
  if (t.dtype == 0) return static_cast<const float *>(t.data)[i];
  const uint16_t h = static_cast<const uint16_t *>(t.data)[i];
  return t.dtype == 1 ? dtype_bf16_to_f32(h) : dtype_fp16_to_f32(h);
}

// A thread per (bag, d), bag = b F + c: the bag's rows in id order, as the
// CPU's pooling adds them; mean multiplies the sum by 1 / the bag's size.
__global__ void bag_forward_k(float *out, cuk_rows t, cuk_bags bg) {
  GRID_STRIDE(i, (size_t)bg.B * bg.F * t.D) {
    const size_t g = i / t.D;
    const uint32_t d = (uint32_t)(i % t.D), b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    const uint32_t lo = off[b], hi = off[b + 1], *ids = bg.ids + bg.idbase[c];
    float s = 0.0f;
    for (uint32_t k = lo; k < hi; k++) s = __fadd_rn(s, row_elem(t, (size_t)ids[k - off[0]] * t.stride + d));
    if (bg.mean[c] && hi > lo) s = __fmul_rn(s, __fdiv_rn(1.0f, (float)(hi - lo)));
    out[i] = s;
  }
}

// The same, 4 elements of a row at a time (one 16-byte load of fp32, one
// 8-byte load of bf16 or fp16): a thread per (bag, 4 d's). D and the stride
// are multiples of 4, the rows and out aligned to 16 bytes.
template <int DTYPE>
__device__ inline void row_elems4(float *v, const cuk_rows &t, size_t i) {
  if (DTYPE == 0) {
    const float4 x = *reinterpret_cast<const float4 *>(static_cast<const float *>(t.data) + i);
    v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    return;
  }
  const uint2 h = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(t.data) + i);
  const uint16_t e[4] = {(uint16_t)(h.x & 0xffff), (uint16_t)(h.x >> 16), (uint16_t)(h.y & 0xffff),
                         (uint16_t)(h.y >> 16)};
  for (int j = 0; j < 4; j++) v[j] = DTYPE == 1 ? dtype_bf16_to_f32(e[j]) : dtype_fp16_to_f32(e[j]);
}

template <int DTYPE>
__global__ void bag_forward4_k(float *out, cuk_rows t, cuk_bags bg) {
  const uint32_t Q = t.D / 4;
  GRID_STRIDE(i, (size_t)bg.B * bg.F * Q) {
    const size_t g = i / Q;
    const uint32_t d = (uint32_t)(i % Q) * 4, b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    const uint32_t lo = off[b], hi = off[b + 1], *ids = bg.ids + bg.idbase[c];
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
    for (uint32_t k = lo; k < hi; k++) {
      row_elems4<DTYPE>(v, t, (size_t)ids[k - off[0]] * t.stride + d);
      for (int j = 0; j < 4; j++) s[j] = __fadd_rn(s[j], v[j]);
    }
    if (bg.mean[c] && hi > lo) {
      const float inv = __fdiv_rn(1.0f, (float)(hi - lo));
      for (int j = 0; j < 4; j++) s[j] = __fmul_rn(s[j], inv);
    }
    *reinterpret_cast<float4 *>(out + g * t.D + d) = make_float4(s[0], s[1], s[2], s[3]);
  }
}

// ---- the fused sparse update (dev/cuda/sparse_update.cu's, on the CPU
// op's item order: column, sample, position) ----

// A run of more than kShortRun items is summed in segments of seg_len(n).
constexpr uint32_t kShortRun = 64;

__device__ inline uint32_t seg_len(uint32_t n) {
  uint32_t L = (uint32_t)sqrtf((float)n);
  while (L * L < n) L++;
  while (L > 1 && (L - 1) * (L - 1) >= n) L--;
  return L < 32 ? 32 : L;
}

// vals[item] = the item's bag, for every item of bag g = b F + c.
__global__ void item_bags_k(uint32_t *vals, cuk_bags bg) {
  GRID_STRIDE(g, (size_t)bg.B * bg.F) {
    const uint32_t b = (uint32_t)(g / bg.F), c = (uint32_t)(g % bg.F);
    const uint32_t *off = bg.offs + (size_t)c * (bg.B + 1);
    for (uint32_t k = off[b]; k < off[b + 1]; k++) vals[bg.idbase[c] + (k - off[0])] = (uint32_t)g;
  }
}

struct Runs {
  const uint32_t *rows_u, *count, *start, *n_unique, *nseg, *seg_start, *seg_row, *sorted_vals;
  const float *dout;
  float *partial;
  cuk_bags bg;
  uint32_t D;
};

// An item's gradient at the lane's d (lane, lane + 32, ...): its bag's
// d_out row, times 1 / the bag's size where the column pools by its mean.
template <int PER_LANE>
__device__ inline void item_grad(float *v, uint32_t i, int lane, const Runs &R) {
  const uint32_t bag = R.sorted_vals[i], c = bag % R.bg.F, s = bag / R.bg.F;
  const float *go = R.dout + (size_t)bag * R.D;
  const uint32_t *off = R.bg.offs + (size_t)c * (R.bg.B + 1);
  const float inv = R.bg.mean[c] ? __fdiv_rn(1.0f, (float)(off[s + 1] - off[s])) : 1.0f;
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    v[j] = d < R.D ? (R.bg.mean[c] ? __fmul_rn(inv, go[d]) : go[d]) : 0.0f;
  }
}

// g (lane's d) += the items [a, b) in order, four items' loads in flight.
template <int PER_LANE>
__device__ inline void sum_items(float *g, uint32_t a, uint32_t b, int lane, const Runs &R) {
  uint32_t i = a;
  for (; i + 4 <= b; i += 4) {
    float v[4][PER_LANE];
#pragma unroll
    for (int u = 0; u < 4; u++) item_grad<PER_LANE>(v[u], i + u, lane, R);
#pragma unroll
    for (int u = 0; u < 4; u++)
      for (int j = 0; j < PER_LANE; j++)
        if (lane + 32 * j < R.D) g[j] = __fadd_rn(g[j], v[u][j]);
  }
  for (; i < b; i++) {
    float v[PER_LANE];
    item_grad<PER_LANE>(v, i, lane, R);
    for (int j = 0; j < PER_LANE; j++)
      if (lane + 32 * j < R.D) g[j] = __fadd_rn(g[j], v[j]);
  }
}

__global__ void seg_plan_k(uint32_t *nseg, const uint32_t *count, const uint32_t *n_unique, uint32_t n) {
  GRID_STRIDE(u, (size_t)n) {
    const uint32_t k = u < *n_unique ? count[u] : 0;
    nseg[u] = k > kShortRun ? (k + seg_len(k) - 1) / seg_len(k) : 0;
  }
}

__global__ void seg_rows_k(uint32_t *seg_row, const uint32_t *nseg, const uint32_t *seg_start,
                           const uint32_t *n_unique, uint32_t n) {
  GRID_STRIDE(u, (size_t)n) {
    if (u >= *n_unique) break;
    for (uint32_t k = 0; k < nseg[u]; k++) seg_row[seg_start[u] + k] = (uint32_t)u;
  }
}

template <int PER_LANE>
__global__ void seg_sum_k(Runs R, uint32_t seg_cap) {
  const uint32_t s = (uint32_t)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (s >= seg_cap) return;
  const uint32_t u = R.seg_row[s];
  if (u == 0xffffffffu) return;
  const uint32_t n = R.count[u], L = seg_len(n), a = R.start[u] + (s - R.seg_start[u]) * L;
  const uint32_t b = a + L < R.start[u] + n ? a + L : R.start[u] + n;
  float g[PER_LANE];
  for (int j = 0; j < PER_LANE; j++) g[j] = 0.0f;
  sum_items<PER_LANE>(g, a, b, lane, R);
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    if (d < R.D) R.partial[(size_t)s * R.D + d] = g[j];
  }
}

// A warp per unique row: its gradient, then src/backend/cpu/sparse_update.c's
// update with each product and sum rounded as the CPU's (Adagrad's sum of
// squares by lanes, then a butterfly), a 16-bit row widened, updated in
// fp32 and stored with the CPU's stochastic rounding.
template <int PER_LANE>
__global__ void reduce_update_k(cuk_rows t, Runs R, cuk_sparse_opt o) {
  const uint32_t u = (uint32_t)(((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x % 32;
  if (u >= *R.n_unique) return;
  const uint32_t r = R.rows_u[u], n = R.count[u], D = R.D;
  float g[PER_LANE], w[PER_LANE];
  const size_t row = (size_t)r * t.stride;
  for (int j = 0; j < PER_LANE; j++) { /* the row's loads first: they overlap the gradient's */
    const uint32_t d = lane + 32 * j;
    w[j] = d < D ? row_elem(t, row + d) : 0.0f;
    g[j] = 0.0f;
  }
  if (n <= kShortRun) {
    sum_items<PER_LANE>(g, R.start[u], R.start[u] + n, lane, R);
  } else {
    for (uint32_t k = 0; k < R.nseg[u]; k++) {
      const float *p = R.partial + (size_t)(R.seg_start[u] + k) * D;
      for (int j = 0; j < PER_LANE; j++) {
        const uint32_t d = lane + 32 * j;
        if (d < D) g[j] = __fadd_rn(g[j], p[d]);
      }
    }
  }
  if (o.kind == 0) {
    for (int j = 0; j < PER_LANE; j++) w[j] = __fsub_rn(w[j], __fmul_rn(o.lr, __fadd_rn(g[j], __fmul_rn(o.wd, w[j]))));
  } else if (o.kind == 1) {
    float sq = 0.0f;
    for (int j = 0; j < PER_LANE; j++) {
      g[j] = lane + 32 * j < D ? __fadd_rn(g[j], __fmul_rn(o.wd, w[j])) : 0.0f; /* gw */
      sq = __fadd_rn(sq, __fmul_rn(g[j], g[j]));
    }
    for (int m = 16; m > 0; m /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, m));
    const float acc = __fadd_rn(o.accum[r], __fdiv_rn(sq, (float)D));
    const float step = __fdiv_rn(o.lr, __fadd_rn(__fsqrt_rn(acc), o.eps));
    __syncwarp();
    if (lane == 0) o.accum[r] = acc;
    for (int j = 0; j < PER_LANE; j++) w[j] = __fsub_rn(w[j], __fmul_rn(step, g[j]));
  } else {
    const uint32_t ts = o.steps[r] + 1; /* the row is this warp's alone */
    const double bc1 = -expm1((double)ts * o.log_b1), bc2 = -expm1((double)ts * o.log_b2);
    const float step_size = (float)(o.lr / bc1), inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    __syncwarp();
    if (lane == 0) o.steps[r] = ts;
    float *m = o.m + row, *v = o.v + row;
    for (int j = 0; j < PER_LANE; j++) {
      const uint32_t d = lane + 32 * j;
      if (d >= D) continue;
      const float gd = __fadd_rn(g[j], __fmul_rn(o.wd, w[j]));
      m[d] = __fadd_rn(__fmul_rn(o.b1, m[d]), __fmul_rn(__fsub_rn(1.0f, o.b1), gd));
      v[d] = __fadd_rn(__fmul_rn(o.b2, v[d]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, o.b2), gd), gd));
      const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(v[d]), inv_sqrt_bc2), o.eps);
      w[j] = __fsub_rn(w[j], __fdiv_rn(__fmul_rn(step_size, m[d]), den));
    }
  }
  for (int j = 0; j < PER_LANE; j++) {
    const uint32_t d = lane + 32 * j;
    if (d >= D) continue;
    if (t.dtype == 0) {
      static_cast<float *>(t.data)[row + d] = w[j];
    } else {
      const uint64_t draws = dtype_sr_draws_keyed(o.sr_key, o.row_keys ? (uint32_t)o.row_keys[r] : r, d / 4);
      const uint32_t draw = (uint32_t)(draws >> (16 * (d % 4))) & 0xffffu;
      static_cast<uint16_t *>(t.data)[row + d] =
          t.dtype == 1 ? dtype_f32_to_bf16_sr(w[j], draw) : dtype_f32_to_fp16_sr(w[j], draw);
    }
  }
}

// The scratch's pieces for n items (cuk_bag_update_scratch sizes them).
struct UpdateScratch {
  uint32_t *vals, *sorted_rows, *sorted_vals, *rows_u, *count, *start, *n_unique, *nseg, *seg_start, *seg_row;
  float *partial;
  void *tmp;
  size_t tmp_bytes;
  uint32_t seg_cap;
  int key_bits;
};

size_t carve_update(UpdateScratch *u, char *base, uint32_t n, uint32_t D, uint64_t rows) {
  u->key_bits = 1;
  while (u->key_bits < 32 && ((rows - 1) >> u->key_bits)) u->key_bits++;
  u->seg_cap = (uint32_t)(3 * (uint64_t)n / 64 + 1);
  size_t a = 0, b = 0, c = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, a, (const uint32_t *)nullptr, (uint32_t *)nullptr,
                                  (const uint32_t *)nullptr, (uint32_t *)nullptr, (int)n, 0, u->key_bits);
  cub::DeviceRunLengthEncode::Encode(nullptr, b, (const uint32_t *)nullptr, (uint32_t *)nullptr, (uint32_t *)nullptr,
                                     (uint32_t *)nullptr, (int)n);
  cub::DeviceScan::ExclusiveSum(nullptr, c, (const uint32_t *)nullptr, (uint32_t *)nullptr, (int)n);
  u->tmp_bytes = a > b ? (a > c ? a : c) : (b > c ? b : c);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    void *p = base ? base + at : nullptr;
    at += (bytes + 255) / 256 * 256;
    return p;
  };
  uint32_t **lists[] = {&u->vals, &u->sorted_rows, &u->sorted_vals, &u->rows_u, &u->count, &u->start, &u->nseg,
                        &u->seg_start};
  for (uint32_t **l : lists) *l = static_cast<uint32_t *>(take((size_t)n * 4));
  u->n_unique = static_cast<uint32_t *>(take(4));
  u->seg_row = static_cast<uint32_t *>(take((size_t)u->seg_cap * 4));
  u->partial = static_cast<float *>(take((size_t)u->seg_cap * D * 4));
  u->tmp = take(u->tmp_bytes);
  return at;
}

template <int PER_LANE>
cudaError_t launch_bag_update(cudaStream_t st, cuk_rows t, const Runs &R, const UpdateScratch &u, uint32_t n,
                              cuk_sparse_opt o) {
  seg_sum_k<PER_LANE><<<(unsigned)(((uint64_t)u.seg_cap * 32 + 255) / 256), 256, 0, st>>>(R, u.seg_cap);
  reduce_update_k<PER_LANE><<<(unsigned)(((uint64_t)n * 32 + 255) / 256), 256, 0, st>>>(t, R, o);
  return cudaGetLastError();
}

} // namespace

extern "C" {

cudaError_t cuk_bag_forward(cudaStream_t st, float *out, cuk_rows t, cuk_bags bags) {
  const size_t esz = t.dtype == 0 ? 4 : 2;
  if (t.D % 4 == 0 && t.stride % 4 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)t.data % (4 * esz) == 0) {
    const size_t n = (size_t)bags.B * bags.F * (t.D / 4);
    if (t.dtype == 0) return LAUNCH(bag_forward4_k<0>, n, st, out, t, bags);
    if (t.dtype == 1) return LAUNCH(bag_forward4_k<1>, n, st, out, t, bags);
    return LAUNCH(bag_forward4_k<2>, n, st, out, t, bags);
  }
  return LAUNCH(bag_forward_k, (size_t)bags.B * bags.F * t.D, st, out, t, bags);
}

size_t cuk_bag_update_scratch(uint32_t n, uint32_t D, uint64_t rows) {
  UpdateScratch u;
  return carve_update(&u, nullptr, n, D, rows);
}

cudaError_t cuk_bag_update(cudaStream_t st, cuk_rows t, cuk_bags bags, uint32_t n, const float *d_out,
                           cuk_sparse_opt o, void *scratch, size_t scratch_bytes) {
  UpdateScratch u;
  if (carve_update(&u, static_cast<char *>(scratch), n, t.D, t.rows) > scratch_bytes) return cudaErrorInvalidValue;
  cudaError_t e = LAUNCH(item_bags_k, (size_t)bags.B * bags.F, st, u.vals, bags);
  size_t bytes = u.tmp_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(u.tmp, bytes, bags.ids, u.sorted_rows, u.vals, u.sorted_vals, (int)n, 0,
                                        u.key_bits, st);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRunLengthEncode::Encode(u.tmp, bytes, u.sorted_rows, u.rows_u, u.count, u.n_unique, (int)n, st);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(u.tmp, bytes, u.count, u.start, (int)n, st);
  if (e == cudaSuccess) e = LAUNCH(seg_plan_k, (size_t)n, st, u.nseg, u.count, u.n_unique, n);
  bytes = u.tmp_bytes;
  if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(u.tmp, bytes, u.nseg, u.seg_start, (int)n, st);
  if (e == cudaSuccess) e = cudaMemsetAsync(u.seg_row, 0xff, (size_t)u.seg_cap * 4, st);
  if (e == cudaSuccess) e = LAUNCH(seg_rows_k, (size_t)n, st, u.seg_row, u.nseg, u.seg_start, u.n_unique, n);
  if (e != cudaSuccess) return e;
  const Runs R = {u.rows_u, u.count, u.start, u.n_unique, u.nseg, u.seg_start, u.seg_row, u.sorted_vals,
                  d_out,    u.partial, bags, t.D};
  if (t.D <= 32) return launch_bag_update<1>(st, t, R, u, n, o);
  if (t.D <= 64) return launch_bag_update<2>(st, t, R, u, n, o);
  if (t.D <= 128) return launch_bag_update<4>(st, t, R, u, n, o);
  if (t.D <= 256) return launch_bag_update<8>(st, t, R, u, n, o);
  if (t.D <= 512) return launch_bag_update<16>(st, t, R, u, n, o);
  return launch_bag_update<32>(st, t, R, u, n, o);
}

} // extern "C"
