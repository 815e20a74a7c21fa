#include "relu_backward/relu_backward_kernel.h"

#include <cstdint>

#include "common/grid_size.h"
#include "common/grid_sum.cuh"
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
  float sums[2] = {sum_grad, sum_grad_z};
  grid_sum<kThreads>(sums, a.partial_sums, a.counter, a.sums);
}

template <typename T>
cudaError_t launch_typed(ReluBackwardArgs const& a, int blocks, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(a.counter, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess) return err;
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
  return clamp_grid(needed, 4LL * num_sms);
}

cudaError_t launch_relu_backward(ReluBackwardArgs const& a, int blocks, cudaStream_t stream) {
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, blocks, stream)
                                : launch_typed<__nv_bfloat16>(a, blocks, stream);
}

}  // namespace relu_backward
}  // namespace cutlass_ops
