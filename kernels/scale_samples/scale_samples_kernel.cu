#include "scale_samples/scale_samples_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/half_chunk.cuh"

namespace cutlass_ops {
namespace sample_scale {
namespace {

constexpr int kThreads = 256;

// Grid-stride over kVec-element chunks; a chunk never straddles two samples (kVec = 8 only
// where per_sample is a multiple of 8).  ATen's mixed-dtype broadcast multiply (a 16-bit tensor
// by a float32 (N, 1, 1) one) took about 19 us per call on CvT's stage-3 tokens on an H100,
// about 1 TB/s.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) sample_scale_kernel(SampleScaleArgs a) {
  long long const chunks = a.samples * a.per_sample / kVec;
  for (long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; i < chunks;
       i += static_cast<long long>(gridDim.x) * kThreads) {
    float const s = a.scale[i * kVec / a.per_sample];
    float v[kVec];
    load_floats<kVec>(static_cast<T const*>(a.x) + i * kVec, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) v[e] *= s;
    store_floats<kVec>(static_cast<T*>(a.y) + i * kVec, v);
  }
}

template <typename T>
cudaError_t launch_typed(SampleScaleArgs const& a, int num_sms, cudaStream_t stream) {
  bool const vec8 = a.per_sample % 8 == 0 && aligned16(a.x) && aligned16(a.y);
  long long const chunks = a.samples * a.per_sample / (vec8 ? 8 : 1);
  long long blocks = (chunks + kThreads - 1) / kThreads;
  long long const cap = 16LL * num_sms;  // grid-stride beyond 16 CTAs an SM
  if (blocks > cap) blocks = cap;
  if (vec8) {
    sample_scale_kernel<T, 8><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  } else {
    sample_scale_kernel<T, 1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sample_scale(SampleScaleArgs const& a, int num_sms, cudaStream_t stream) {
  if (a.samples == 0 || a.per_sample == 0) return cudaSuccess;
  return a.dtype == DType::kF16 ? launch_typed<__half>(a, num_sms, stream)
                                : launch_typed<__nv_bfloat16>(a, num_sms, stream);
}

}  // namespace sample_scale
}  // namespace cutlass_ops
