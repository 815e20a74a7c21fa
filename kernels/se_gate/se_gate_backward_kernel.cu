#include "se_gate/se_gate_backward_kernel.h"

#include <cstdint>

#include "common/half_chunk.cuh"

namespace cutlass_ops {
namespace se_gate {
namespace {

constexpr int kThreads = 256;

// One thread per kVec channels of one input pixel.  Pooled row p covers input rows
// 2p-1 .. 2p+1, so input row y is covered by rows y/2 .. (y+1)/2 (clamped to P-1); the same
// for columns.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) se_gate_pool_backward_kernel(PoolBackwardArgs a) {
  int64_t const groups = a.C / kVec;
  int64_t const total = int64_t(a.N) * a.H * a.W * groups;
  T const* grad_out = static_cast<T const*>(a.grad_out);
  T const* grad_pooled = static_cast<T const*>(a.grad_pooled);
  T* result = static_cast<T*>(a.result);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * kThreads) {
    int64_t const c = (i % groups) * kVec;
    int64_t pixel = i / groups;
    int const x = int(pixel % a.W);
    pixel /= a.W;
    int const y = int(pixel % a.H);
    int64_t const n = pixel / a.H;
    float acc[kVec] = {};
    int const p_end = min((y + 1) >> 1, a.P - 1), q_end = min((x + 1) >> 1, a.Q - 1);
    for (int p = y >> 1; p <= p_end; ++p) {
      for (int q = x >> 1; q <= q_end; ++q) {
        HalfChunk<T, kVec> g;
        g.load(grad_pooled + ((n * a.P + p) * a.Q + q) * a.C + c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[k] += to_float(g.v[k]) / 9.0f;  // as ATen: each term / 9
      }
    }
    HalfChunk<T, kVec> g;
    g.load(grad_out + i * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) g.v[k] = from_float<T>(to_float(g.v[k]) + acc[k]);
    g.store(result + i * kVec);
  }
}

template <typename T, int kVec>
cudaError_t launch_typed(PoolBackwardArgs const& a, cudaStream_t stream) {
  int64_t const threads = int64_t(a.N) * a.H * a.W * (a.C / kVec);
  int64_t const blocks = (threads + kThreads - 1) / kThreads;
  // Grid-stride loop past 2^20 blocks: enough to fill any GPU, no grid-size limit.
  dim3 grid(unsigned(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20)));
  se_gate_pool_backward_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_se_gate_pool_backward(PoolBackwardArgs const& a, cudaStream_t stream) {
  if (int64_t(a.N) * a.H * a.W * a.C == 0) return cudaSuccess;
  bool const vec8 = a.C % 8 == 0 && aligned16(a.grad_out) && aligned16(a.grad_pooled) && aligned16(a.result);
  if (a.dtype == DType::kF16) {
    return vec8 ? launch_typed<__half, 8>(a, stream) : launch_typed<__half, 1>(a, stream);
  }
  return vec8 ? launch_typed<__nv_bfloat16, 8>(a, stream) : launch_typed<__nv_bfloat16, 1>(a, stream);
}

}  // namespace se_gate
}  // namespace cutlass_ops
