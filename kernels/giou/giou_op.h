// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::giou_loss
// and cutlass_ops::giou_loss_backward.
#pragma once

#include <optional>
#include <string_view>
#include <tuple>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace giou {

enum class LossReduction { kNone, kMean, kSum };

// at::arange(n, dtype int64, device) without aten::arange (its `end` is a Scalar, which the
// stable dispatcher call cannot pass): the cumulative sum of 0, 1, 1, ..., 1.  Exact.
inline Tensor arange_long(int64_t n, Device device) {
  Tensor steps = torch::stable::full({n}, 1.0, kLong, std::nullopt, device);
  if (n > 0) torch::stable::fill_(torch::stable::narrow(steps, 0, 0, 1), 0.0);
  return aten_call("aten::cumsum", "", steps, int64_t(0), std::optional<ScalarType>());
}

// Checks shapes, dtypes and devices (errors name the argument) and parses the reduction.
LossReduction check_inputs(Tensor const& boxes1, Tensor const& boxes2,
                           std::optional<Tensor> const& mask,
                           std::optional<Tensor> const& counts,
                           std::optional<Tensor> const& offsets, std::string_view reduction);

// The backward's extra operands: grad_loss shaped like the forward's loss, num_valid a scalar.
void check_backward_inputs(Tensor const& grad_loss, Tensor const& boxes1,
                           Tensor const& num_valid, LossReduction reduction);

// The loss's dtype: float64 for float64 boxes, else float32 (as torchvision upcasts).
ScalarType loss_dtype(ScalarType boxes_dtype);

// The ATen composites: the CPU implementations.
std::tuple<Tensor, Tensor> giou_loss_aten(
    Tensor const& boxes1, Tensor const& boxes2, std::optional<Tensor> const& mask,
    std::optional<Tensor> const& counts, std::optional<Tensor> const& offsets,
    std::string_view reduction, double eps);

std::tuple<Tensor, Tensor> giou_loss_backward_aten(
    Tensor const& grad_loss, Tensor const& boxes1, Tensor const& boxes2,
    std::optional<Tensor> const& mask, std::optional<Tensor> const& counts,
    std::optional<Tensor> const& offsets, Tensor const& num_valid,
    std::string_view reduction, double eps);

}  // namespace giou
}  // namespace cutlass_ops
