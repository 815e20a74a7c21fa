#include "conv2d_backward/weight_grad_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/half_chunk.cuh"

namespace cutlass_ops {
namespace conv2d_backward {
namespace {

constexpr int kThreads = 256;


template <typename G, typename W>
__global__ void __launch_bounds__(kThreads) wgrad_epilogue_kernel(WgradEpilogueArgs a) {
  G const* g = static_cast<G const*>(a.g);
  W const* w = static_cast<W const*>(a.weight);
  float const scale = a.scale != nullptr ? *a.scale : 1.0f;
  float dot = 0.0f;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < a.n; i += (int64_t)gridDim.x * kThreads) {
    float sum = 0.0f;
    for (int s = 0; s < a.slices; ++s) sum += to_float(g[s * a.n + i]);  // coalesced per slice
    static_cast<W*>(a.dw)[i] = from_float<W>(scale * sum);
    dot += to_float(w[i]) * sum;
  }
  __shared__ float warp_dots[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_down_sync(0xffffffffu, dot, offset);
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_dots[warp] = dot;
  __syncthreads();
  if (warp == 0) {
    dot = lane < kThreads / 32 ? warp_dots[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_down_sync(0xffffffffu, dot, offset);
    if (lane == 0) a.partial_dots[blockIdx.x] = dot;
  }
}

template <typename W>
__global__ void __launch_bounds__(kThreads) scaled_weight_kernel(W const* w, int64_t n, float const* scale, W* out) {
  float const s = *scale;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n; i += (int64_t)gridDim.x * kThreads) {
    out[i] = from_float<W>(to_float(w[i]) * s);
  }
}

template <typename G>
cudaError_t launch_for_g(WgradEpilogueArgs const& a, int blocks, cudaStream_t stream) {
  if (a.w_type == Elem::kF16) {
    wgrad_epilogue_kernel<G, __half><<<blocks, kThreads, 0, stream>>>(a);
  } else if (a.w_type == Elem::kBF16) {
    wgrad_epilogue_kernel<G, __nv_bfloat16><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    wgrad_epilogue_kernel<G, float><<<blocks, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

int weight_grad_blocks(int64_t n, int num_sms) {
  int64_t const needed = (n + 4 * kThreads - 1) / (4 * kThreads);  // ~4 elements per thread
  int64_t const cap = 4LL * num_sms;
  return int(needed < 1 ? 1 : (needed < cap ? needed : cap));
}

cudaError_t launch_wgrad_epilogue(WgradEpilogueArgs const& a, int blocks, cudaStream_t stream) {
  switch (a.g_type) {
    case Elem::kF32: return launch_for_g<float>(a, blocks, stream);
    case Elem::kF16: return launch_for_g<__half>(a, blocks, stream);
    default: return launch_for_g<__nv_bfloat16>(a, blocks, stream);
  }
}

cudaError_t launch_scaled_weight(void const* w, Elem type, int64_t n, float const* scale, void* out, int blocks,
                                 cudaStream_t stream) {
  if (type == Elem::kF16) {
    scaled_weight_kernel<__half><<<blocks, kThreads, 0, stream>>>(static_cast<__half const*>(w), n, scale,
                                                                  static_cast<__half*>(out));
  } else {
    scaled_weight_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        static_cast<__nv_bfloat16 const*>(w), n, scale, static_cast<__nv_bfloat16*>(out));
  }
  return cudaGetLastError();
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops
