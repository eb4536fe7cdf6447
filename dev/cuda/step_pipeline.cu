// How the CUDA backend will feed and launch a training step (issue 11):
//   - the next batch copied host-to-device from pinned memory on a stream of
//     its own while the current one computes (two buffers, events between
//     the streams), and
//   - the step's kernels captured once in a CUDA graph and replayed, so that
//     a step costs one launch instead of one per kernel.
//
// The step is a small stand-in with the real one's shape of work: gather
// each sample's F rows of a table (one-hot ids) and sum them, a logit per
// sample (the sum against a weight vector), BCE's gradient against the
// batch's labels, and an SGD step on the weights (a deterministic block
// reduction per weight, no atomics). Every mode must leave the weights with
// the same bits as the plain one (kernels launched one by one, each batch
// copied before its step), and each is timed:
//
//   plain       synchronous copy, then the step's kernels
//   overlapped  copies on their own stream, one batch ahead
//   graph       overlapped, the step replayed from a CUDA graph (one per
//               buffer, captured once)
//
// usage: step_pipeline [batch] [cols] [dim] [steps]   (defaults 65536 26 128
//   100); exits 77 (CTest: skipped) without a CUDA device.
#include <vector>

#include "common.h"

struct Shape {
  uint32_t B, F, D, rows, steps;
};

// Host batch s: labels (B) and ids (B, F), a pure function of s.
static void make_batch(const Shape &sh, uint32_t s, float *labels, uint32_t *ids) {
  for (uint32_t b = 0; b < sh.B; b++) {
    labels[b] = (float)(dlrec_mix64(((uint64_t)s << 32) ^ b) & 1);
    for (uint32_t f = 0; f < sh.F; f++)
      ids[(size_t)b * sh.F + f] = (uint32_t)(dlrec_mix64(((uint64_t)s << 40) ^ ((uint64_t)b << 8) ^ f) % sh.rows);
  }
}

// pooled (B, D) = sum over f of table[ids[b][f]]; a thread per (b, d), f in order.
__global__ void gather_sum(float *pooled, const float *table, const uint32_t *ids, uint32_t B, uint32_t F,
                           uint32_t D) {
  const uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (uint64_t)B * D) return;
  const uint32_t b = (uint32_t)(i / D), d = (uint32_t)(i % D);
  float s = 0.0f;
  for (uint32_t f = 0; f < F; f++) s = __fadd_rn(s, table[(size_t)ids[(size_t)b * F + f] * D + d]);
  pooled[i] = s;
}

// dz[b] = (sigmoid(pooled[b] . w) - y[b]) / B; a warp per sample, lanes over d
// then a fixed shuffle tree: the same order every run.
__global__ void logit_grad(float *dz, const float *pooled, const float *w, const float *y, uint32_t B, uint32_t D) {
  const uint32_t b = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (b >= B) return;
  float s = 0.0f;
  for (uint32_t d = lane; d < D; d += 32) s = __fadd_rn(s, __fmul_rn(pooled[(size_t)b * D + d], w[d]));
  for (int m = 16; m > 0; m /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
  if (lane == 0) dz[b] = (1.0f / (1.0f + expf(-s)) - y[b]) / (float)B;
}

// w[d] -= lr * sum over b of dz[b] pooled[b][d]; a block per d, a fixed tree.
__global__ void sgd_weights(float *w, const float *dz, const float *pooled, uint32_t B, uint32_t D, float lr) {
  __shared__ float part[256];
  const uint32_t d = blockIdx.x;
  float s = 0.0f;
  for (uint32_t b = threadIdx.x; b < B; b += blockDim.x) s = __fadd_rn(s, __fmul_rn(dz[b], pooled[(size_t)b * D + d]));
  part[threadIdx.x] = s;
  __syncthreads();
  for (uint32_t k = blockDim.x / 2; k > 0; k /= 2) {
    if (threadIdx.x < k) part[threadIdx.x] = __fadd_rn(part[threadIdx.x], part[threadIdx.x + k]);
    __syncthreads();
  }
  if (threadIdx.x == 0) w[d] = __fsub_rn(w[d], __fmul_rn(lr, part[0]));
}

struct Dev {
  float *table, *w, *pooled, *dz;
  float *y[2];
  uint32_t *ids[2];
};

static void launch_step(const Shape &sh, const Dev &g, int buf, cudaStream_t st) {
  const uint64_t n = (uint64_t)sh.B * sh.D;
  gather_sum<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(g.pooled, g.table, g.ids[buf], sh.B, sh.F, sh.D);
  logit_grad<<<(unsigned)(((uint64_t)sh.B * 32 + 255) / 256), 256, 0, st>>>(g.dz, g.pooled, g.w, g.y[buf], sh.B,
                                                                            sh.D);
  sgd_weights<<<sh.D, 256, 0, st>>>(g.w, g.dz, g.pooled, sh.B, sh.D, 0.1f);
}

enum Mode { PLAIN = 0, OVERLAPPED = 1, GRAPH = 2 };

enum { HOST_BATCHES = 4 };

// Runs sh.steps steps in mode m from the same initial weights; the final
// weights into w_out; returns milliseconds per step.
static float run(const Shape &sh, Dev &g, Mode m, const std::vector<float> &w0, std::vector<float> &w_out) {
  const size_t ids_n = (size_t)sh.B * sh.F;
  // The batches, made in pinned memory before the clock starts: the loader's
  // work is the loader's (its threads), and making them inside the loop
  // timed the host's hashing instead of the copies and kernels (4 ms of a
  // step at batch 65536 on an H100, all modes alike).
  float *h_y[HOST_BATCHES];
  uint32_t *h_ids[HOST_BATCHES];
  for (int k = 0; k < HOST_BATCHES; k++) {
    CUDA_CHECK(cudaMallocHost(&h_y[k], sh.B * 4));
    CUDA_CHECK(cudaMallocHost(&h_ids[k], ids_n * 4));
    make_batch(sh, (uint32_t)k, h_y[k], h_ids[k]);
  }
  cudaStream_t compute, copy;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  cudaEvent_t copied[2], consumed[2], t0, t1;
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaEventCreateWithFlags(&copied[k], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&consumed[k], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaEventCreate(&t0));
  CUDA_CHECK(cudaEventCreate(&t1));
  CUDA_CHECK(cudaMemcpy(g.w, w0.data(), w0.size() * 4, cudaMemcpyHostToDevice));

  // One graph a buffer: the step's kernels reading that buffer.
  cudaGraphExec_t exec[2] = {nullptr, nullptr};
  if (m == GRAPH)
    for (int k = 0; k < 2; k++) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
      launch_step(sh, g, k, compute);
      CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec[k], graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
  // Step s's batch (host batch s % HOST_BATCHES) into device buffer s % 2,
  // on `copy` after the step that last read that buffer.
  auto stage = [&](uint32_t s) {
    const int k = (int)(s % 2), h = (int)(s % HOST_BATCHES);
    cudaStream_t st = m == PLAIN ? compute : copy;
    if (m != PLAIN) CUDA_CHECK(cudaStreamWaitEvent(copy, consumed[k], 0));
    CUDA_CHECK(cudaMemcpyAsync(g.y[k], h_y[h], sh.B * 4, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaMemcpyAsync(g.ids[k], h_ids[h], ids_n * 4, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaEventRecord(copied[k], st));
  };
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaEventRecord(copied[k], compute));
    CUDA_CHECK(cudaEventRecord(consumed[k], compute));
  }
  CUDA_CHECK(cudaEventRecord(t0, compute));
  if (m != PLAIN) stage(0);
  for (uint32_t s = 0; s < sh.steps; s++) {
    const int k = (int)(s % 2);
    if (m == PLAIN) {
      stage(s);
      CUDA_CHECK(cudaStreamSynchronize(compute)); // the copy lands before the step starts
    } else {
      CUDA_CHECK(cudaStreamWaitEvent(compute, copied[k], 0));
    }
    if (m == GRAPH) CUDA_CHECK(cudaGraphLaunch(exec[k], compute));
    else launch_step(sh, g, k, compute);
    CUDA_CHECK(cudaEventRecord(consumed[k], compute));
    // The next batch is made and travels while this step computes.
    if (m != PLAIN && s + 1 < sh.steps) stage(s + 1);
  }
  CUDA_CHECK(cudaEventRecord(t1, compute));
  CUDA_CHECK(cudaEventSynchronize(t1));
  CUDA_CHECK(cudaGetLastError());
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
  w_out.resize(w0.size());
  CUDA_CHECK(cudaMemcpy(w_out.data(), g.w, w0.size() * 4, cudaMemcpyDeviceToHost));
  for (int k = 0; k < 2; k++) {
    if (exec[k]) CUDA_CHECK(cudaGraphExecDestroy(exec[k]));
    cudaEventDestroy(copied[k]), cudaEventDestroy(consumed[k]);
  }
  for (int k = 0; k < HOST_BATCHES; k++) cudaFreeHost(h_y[k]), cudaFreeHost(h_ids[k]);
  cudaEventDestroy(t0), cudaEventDestroy(t1);
  cudaStreamDestroy(compute), cudaStreamDestroy(copy);
  return ms / (float)sh.steps;
}

int main(int argc, char **argv) {
  Shape sh = {65536, 26, 128, 1000000, 100};
  if (argc > 1) sh.B = (uint32_t)std::atoi(argv[1]);
  if (argc > 2) sh.F = (uint32_t)std::atoi(argv[2]);
  if (argc > 3) sh.D = (uint32_t)std::atoi(argv[3]);
  if (argc > 4) sh.steps = (uint32_t)std::atoi(argv[4]);
  if (sh.B < 1 || sh.B > (1u << 22) || sh.F < 1 || sh.F > 1024 || sh.D < 1 || sh.D > 4096 || sh.steps < 2) {
    std::fprintf(stderr, "usage: step_pipeline [batch <= 2^22] [cols <= 1024] [dim <= 4096] [steps >= 2]\n");
    return 2;
  }
  std::printf("batch %u x %u columns, dim %u, %u steps\n", sh.B, sh.F, sh.D, sh.steps);
  require_gpu("step_pipeline");
  std::vector<float> table((size_t)sh.rows * sh.D), w0(sh.D);
  for (size_t i = 0; i < table.size(); i++) table[i] = val(i, 31, 0.05f);
  for (uint32_t d = 0; d < sh.D; d++) w0[d] = val(d, 37, 0.1f);
  Dev g{};
  CUDA_CHECK(cudaMalloc(&g.table, table.size() * 4));
  CUDA_CHECK(cudaMalloc(&g.w, sh.D * 4));
  CUDA_CHECK(cudaMalloc(&g.pooled, (size_t)sh.B * sh.D * 4));
  CUDA_CHECK(cudaMalloc(&g.dz, sh.B * 4));
  for (int k = 0; k < 2; k++) {
    CUDA_CHECK(cudaMalloc(&g.y[k], sh.B * 4));
    CUDA_CHECK(cudaMalloc(&g.ids[k], (size_t)sh.B * sh.F * 4));
  }
  CUDA_CHECK(cudaMemcpy(g.table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  std::vector<float> want, got;
  const char *names[] = {"plain", "overlapped", "graph"};
  float ms[3];
  int failures = 0;
  for (int m = PLAIN; m <= GRAPH; m++) {
    ms[m] = run(sh, g, (Mode)m, w0, m == PLAIN ? want : got);
    if (m != PLAIN && std::memcmp(got.data(), want.data(), want.size() * 4)) {
      std::printf("  %s: FAIL: its weights differ from the plain run's\n", names[m]);
      failures++;
      continue;
    }
    std::printf("  %-10s %.3f ms a step (%.2fx plain), %.0f samples/s%s\n", names[m], ms[m], ms[PLAIN] / ms[m],
                sh.B / ms[m] * 1e3, m == PLAIN ? "" : "; weights bitwise equal to plain");
  }
  // A run must have moved the weights, or the comparison proves nothing.
  if (!std::memcmp(want.data(), w0.data(), w0.size() * 4)) {
    std::printf("  FAIL: the weights did not move\n");
    failures++;
  }
  cudaFree(g.table), cudaFree(g.w), cudaFree(g.pooled), cudaFree(g.dz);
  for (int k = 0; k < 2; k++) cudaFree(g.y[k]), cudaFree(g.ids[k]);
  return failures ? 1 : 0;
}
