// Backward of se_gate's fused AvgPool2d(3, stride 2, pad 1, count_include_pad): the
// gradient reaching `out` is the op's own plus, for each pixel, the pooled gradients of the
// (at most 2 x 2) windows that cover it, each divided by 9:
//   grad[n, y, x, c] = grad_out[n, y, x, c] + sum_{p,q covering (y, x)} grad_pooled[n, p, q, c] / 9
// One pass, NHWC (channels_last) fp16/bf16, float accumulation.  No torch here: the op entry
// point (se_gate_cuda.cpp) calls launch_se_gate_pool_backward.
#pragma once

#include <cuda_runtime.h>

#include "se_gate/se_gate_kernel.h"

namespace cutlass_ops {
namespace se_gate {

struct PoolBackwardArgs {
  DType dtype;
  int N, H, W, C;          // the shape of grad_out (and of the result)
  int P, Q;                // the pooled shape: (H + 1) / 2, (W + 1) / 2
  void const* grad_out;    // [N, H, W, C]
  void const* grad_pooled; // [N, P, Q, C]
  void* result;            // [N, H, W, C]
};

// Vectorized (8 channels per thread) when C % 8 == 0 and the three pointers are 16-byte
// aligned, else one channel per thread.  Returns the launch's cudaError.
cudaError_t launch_se_gate_pool_backward(PoolBackwardArgs const& a, cudaStream_t stream);

}  // namespace se_gate
}  // namespace cutlass_ops
