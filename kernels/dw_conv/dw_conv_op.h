// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::dw_conv3x3_tokens.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace dw_conv {

// Checks shapes, dtypes and devices (errors name the argument); returns each projection's
// output map (Ho, Wo).
std::vector<std::pair<int64_t, int64_t>> check_inputs(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                                      std::optional<Tensor> const& bias, IntArrayRef strides,
                                                      std::optional<Tensor> const& lead);

// aten::conv2d (groups = C) in float32 (float64 for float64) on the map per projection, its
// bias, the lead rows in front: the CPU implementation and the CUDA fallback.
std::vector<Tensor> dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                           std::optional<Tensor> const& bias, IntArrayRef strides,
                                           std::optional<Tensor> const& lead);

}  // namespace dw_conv
}  // namespace cutlass_ops
