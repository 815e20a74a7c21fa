#include "relu_backward/relu_backward_kernel.h"

#include <cstdint>

#include "common/half_chunk.cuh"

namespace cutlass_ops {
namespace relu_backward {
namespace {

constexpr int kThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) relu_backward_kernel(ReluBackwardArgs a) {
  T const* grad = static_cast<T const*>(a.grad);
  T const* out = static_cast<T const*>(a.out);
  T* grad_z = static_cast<T*>(a.grad_z);
  // The value an inactive element holds: post_bias rounded as the forward rounded it.
  bool const has_post_bias = a.post_bias != nullptr;
  float const inactive = has_post_bias ? to_float(from_float<T>(*a.post_bias)) : 0.0f;
  float sum_grad = 0.0f, sum_grad_z = 0.0f;
  long long const chunks = a.numel / kVec;
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < chunks;
       i += (long long)gridDim.x * kThreads) {
    HalfChunk<T, kVec> g, o;
    g.load(grad + i * kVec);
    o.load(out + i * kVec);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float const gk = to_float(g.v[k]), ok = to_float(o.v[k]);
      bool const active = has_post_bias ? !(ok == inactive) : ok > 0.0f;  // NaN counts as active
      sum_grad += gk;
      if (active) {
        sum_grad_z += gk;
      } else {
        g.v[k] = from_float<T>(0.0f);
      }
    }
    g.store(grad_z + i * kVec);
  }
  // Block reduction: warp shuffles, then one warp over the warps' sums.
  __shared__ float warp_sums[2][kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum_grad += __shfl_down_sync(0xffffffffu, sum_grad, offset);
    sum_grad_z += __shfl_down_sync(0xffffffffu, sum_grad_z, offset);
  }
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_sums[0][warp] = sum_grad;
    warp_sums[1][warp] = sum_grad_z;
  }
  __syncthreads();
  if (warp == 0) {
    sum_grad = lane < kThreads / 32 ? warp_sums[0][lane] : 0.0f;
    sum_grad_z = lane < kThreads / 32 ? warp_sums[1][lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum_grad += __shfl_down_sync(0xffffffffu, sum_grad, offset);
      sum_grad_z += __shfl_down_sync(0xffffffffu, sum_grad_z, offset);
    }
    if (lane == 0) {
      a.partial_sums[2 * blockIdx.x] = sum_grad;
      a.partial_sums[2 * blockIdx.x + 1] = sum_grad_z;
    }
  }
}

template <typename T>
cudaError_t launch_typed(ReluBackwardArgs const& a, int blocks, cudaStream_t stream) {
  bool const vec8 = a.numel % 8 == 0 && aligned16(a.grad) && aligned16(a.out) && aligned16(a.grad_z);
  if (vec8) {
    relu_backward_kernel<T, 8><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    relu_backward_kernel<T, 1><<<blocks, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

int relu_backward_blocks(long long numel, int num_sms) {
  // Enough blocks to fill the GPU a few times over, no more (each writes a partial sum).
  long long const needed = (numel + 8LL * kThreads - 1) / (8LL * kThreads);
  long long const cap = 4LL * num_sms;
  return int(needed < 1 ? 1 : (needed < cap ? needed : cap));
}

cudaError_t launch_relu_backward(ReluBackwardArgs const& a, int blocks, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, blocks, stream)
                                : launch_typed<__nv_bfloat16>(a, blocks, stream);
}

}  // namespace relu_backward
}  // namespace cutlass_ops
