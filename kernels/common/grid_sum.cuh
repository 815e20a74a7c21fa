// Sums over a whole grid without a second kernel, deterministically (no floating-point
// atomics: the same inputs give the same bits, whichever block finishes last).
//   warp_sum:  a warp's sum in every lane (butterfly shuffles).
//   block_sum: a block's sum of each thread's values (warp shuffles, then warp 0).
//   grid_sum:  each block stores its block sum in `partials`; the last block to arrive (an
//              integer atomic on `counter`) adds the partials in block order and writes
//              `result`.  `counter` must be zero at launch: a cudaMemsetAsync before it (a
//              memset node in a CUDA graph, cheaper than the reduce kernel it replaces) or an
//              earlier kernel of the same stream.  The last block's reads of the partials are
//              the tail of the kernel: a grid of B blocks adds about B / (4 * kThreads) round
//              trips (each thread has four loads in flight).
// Shared by the elementwise kernels whose FixUp scalar gradients are whole-tensor sums.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {

__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <int N>
__device__ inline void warp_sum(float (&v)[N]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], offset);
  }
}

// The block's sums in every lane of warp 0 (other threads: unspecified).  Call from all
// threads; kThreads a multiple of 32, at most 1024.
template <int kThreads, int N>
__device__ inline void block_sum(float (&v)[N]) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps");
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_sums[N][kWarps];
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  warp_sum(v);
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) warp_sums[k][warp] = v[k];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = lane < kWarps ? warp_sums[k][lane] : 0.0f;
    warp_sum(v);
  }
}

// result[k] = sum over all threads of the grid of v[k].  partials: [gridDim.x][N] floats;
// counter: zero at launch, left at gridDim.x.  Call from all threads of every block.
template <int kThreads, int N>
__device__ inline void grid_sum(float (&v)[N], float* partials, unsigned* counter, float* result) {
  __shared__ bool last;
  block_sum<kThreads>(v);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) partials[blockIdx.x * N + k] = v[k];
    __threadfence();  // the partials are visible before the count says so
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  float total[N] = {};
#pragma unroll 4  // independent loads in flight; the adds keep a fixed order per thread
  for (unsigned b = threadIdx.x; b < gridDim.x; b += kThreads) {
#pragma unroll
    for (int k = 0; k < N; ++k) total[k] += __ldcg(partials + b * N + k);  // L2: other SMs wrote them
  }
  block_sum<kThreads>(total);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) result[k] = total[k];
  }
}

}  // namespace cutlass_ops
