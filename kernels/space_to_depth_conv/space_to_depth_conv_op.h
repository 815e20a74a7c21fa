// Torch-side pieces shared by the CPU and CUDA implementations of
// cutlass_ops::space_to_depth_conv.
#pragma once

#include <ATen/ATen.h>

namespace cutlass_ops {
namespace space_to_depth_conv {

constexpr int64_t kBlock = 4;

// Checks shapes, dtypes and devices (errors name the argument); returns the output shape.
std::vector<int64_t> check_inputs(at::Tensor const& input, at::Tensor const& weight,
                                  c10::optional<at::Tensor> const& post_bias);

// The ATen composite (reshape/permute space-to-depth, conv2d, ReLU, bias) in float32
// (float64 for double): the CPU implementation and the CUDA fallback.
at::Tensor space_to_depth_conv_aten(at::Tensor const& input, at::Tensor const& weight,
                                    c10::optional<at::Tensor> const& post_bias, bool relu);

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
