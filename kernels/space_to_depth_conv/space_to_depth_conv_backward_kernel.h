// The stem's backward in one pass, for space_to_depth_conv (space_to_depth_conv_kernel.h)
// when its input needs no gradient (it is data):
//   grad_z = (z > 0) ? grad : 0      (the ReLU mask from the saved output, as relu_backward;
//                                     grad_z = grad without a ReLU)
//   dW     = grad_z^T * patches      (K x 16C: the 1x1 weight's gradient)
//   sums   = (sum(grad), sum(grad_z))  (post_bias's gradient, and a pre-ReLU bias's)
// Each CTA walks tiles of 128 output pixels: the patch matrix as the forward builds it, the
// masked gradient beside it, WMMA (float32 accumulate) into K x 16C per CTA; a second kernel
// adds the CTAs' partials in a fixed order (deterministic).  Replaced relu_backward, an ATen
// permute copy of the input and a cuBLAS GEMM (about 56 us at N=512 on an H100).
// No torch here: space_to_depth_conv_cuda.cpp launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "space_to_depth_conv/space_to_depth_conv_kernel.h"

namespace cutlass_ops {
namespace space_to_depth_conv {

struct WeightGradArgs {
  DType dtype;
  int N, C, H, W, K;
  int64_t stride_n, stride_c, stride_h, stride_w;  // input strides in elements
  void const* input;          // (N, C, H, W)
  void const* grad;           // (N, H/4, W/4, K) contiguous (channels_last), 16-byte aligned
  void const* out;            // the forward's output, same layout; null: no ReLU mask
  float const* post_bias;     // device scalar or null
  float* partials;            // [blocks][K * 16C + 2]
  float* grad_weight;         // [K][16C] float32
  float* sums;                // [2]
};

// CTAs the first kernel uses (the partials rows to allocate).
int weight_grad_blocks(int N, int H, int W, int num_sms);

// Requirements: kernel_supports(dtype, cc, C, K).  Returns the first launch error.
cudaError_t launch_space_to_depth_conv_weight_grad(WeightGradArgs const& a, int blocks, cudaStream_t stream);

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
