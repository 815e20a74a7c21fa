// y[n, i] = x[n, i] * scale[n]: each sample of a 16-bit tensor scaled by its own float32 factor,
// the product in float32 rounded once (FusedCvT's drop path: mask / keep_prob per sample).  No
// torch here; the torch side is scale_samples_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

namespace cutlass_ops {
namespace sample_scale {

enum class DType { kF16, kBF16 };

struct SampleScaleArgs {
  DType dtype;
  long long samples;      // N
  long long per_sample;   // elements of one sample
  void const* x;          // (N, per_sample), contiguous
  float const* scale;     // (N,)
  void* y;                // (N, per_sample), contiguous
};

// Returns the launch's cudaError.
cudaError_t launch_sample_scale(SampleScaleArgs const& a, int num_sms, cudaStream_t stream);

}  // namespace sample_scale
}  // namespace cutlass_ops
