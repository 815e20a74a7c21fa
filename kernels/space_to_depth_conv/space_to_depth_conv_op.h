// Torch-side pieces shared by the CPU and CUDA implementations of
// cutlass_ops::space_to_depth_conv.
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace space_to_depth_conv {

constexpr int64_t kBlock = 4;

// Checks shapes, dtypes and devices (errors name the argument); returns the output shape.
std::vector<int64_t> check_inputs(Tensor const& input, Tensor const& weight,
                                  std::optional<Tensor> const& post_bias);

// The ATen composite (reshape/permute space-to-depth, conv2d, ReLU, bias) in float32
// (float64 for double): the CPU implementation and the CUDA fallback.
Tensor space_to_depth_conv_aten(Tensor const& input, Tensor const& weight,
                                std::optional<Tensor> const& post_bias, bool relu);

// space_to_depth_conv_weight_grad: checks (errors name the argument); returns (N, C, H, W, K).
std::vector<int64_t> check_weight_grad_inputs(Tensor const& grad, Tensor const& input,
                                              std::optional<Tensor> const& out,
                                              std::optional<Tensor> const& post_bias);

// Its ATen composite (mask, sums, the permuted input and one GEMM) in float32 (float64 for
// double): the CPU implementation and the CUDA fallback.
std::tuple<Tensor, Tensor> space_to_depth_conv_weight_grad_aten(
    Tensor const& grad, Tensor const& input, std::optional<Tensor> const& out,
    std::optional<Tensor> const& post_bias);

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
