// Space-to-depth by 4 followed by a 1x1 conv, ReLU and a scalar post-bias, reading the
// user's NCHW input directly (no layout pass): a ResNet stem.  Equivalent to a 4x4
// stride-4 conv whose weight is the 1x1 weight re-indexed as (dy, dx, c).
//   y[n, k, p, q] = act(sum_{dy, dx, c} x[n, c, 4p+dy, 4q+dx] * w[k, dy*4C + dx*C + c]) + post_bias
// Tensor cores, float32 accumulate: on sm80+ a persistent cp.async + mma.sync kernel
// (space_to_depth_conv_fast.cuh), else (or where its shared memory does not fit) a WMMA
// kernel with 128 output pixels per CTA.
// No torch here: the op entry point (space_to_depth_conv_cuda.cpp) calls the launcher.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_ops {
namespace space_to_depth_conv {

enum class DType { kF16, kBF16 };

struct SpaceToDepthConvArgs {
  DType dtype;
  int N, C, H, W, K;          // input (N, C, H, W); output (N, K, H/4, W/4)
  int64_t stride_n, stride_c, stride_h, stride_w;  // input strides in elements (any layout)
  void const* input;
  void const* weight;          // (K, 16C) row-major: a (K, 16C, 1, 1) tensor
  void* output;                // NHWC: (N, H/4, W/4, K) contiguous
  float const* post_bias;      // device scalar or null
  bool relu;
  bool programmatic_launch;    // see common/programmatic_launch.cuh
};

// Whether the kernel runs this case on a GPU of compute capability `cc` (e.g. 90): C in
// 1..16, K in {32, 64, 128}, fp16 on sm70+, bf16 on sm80+.  Else the op uses ATen.
bool kernel_supports(DType dtype, int cc, int C, int K);

// Returns the launch's cudaError.
cudaError_t launch_space_to_depth_conv(SpaceToDepthConvArgs const& a, cudaStream_t stream);

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
