// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::giou_loss
// and cutlass_ops::giou_loss_backward.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <tuple>

namespace cutlass_ops {
namespace giou {

enum class LossReduction { kNone, kMean, kSum };

// Checks shapes, dtypes and devices (errors name the argument) and parses the reduction.
LossReduction check_inputs(at::Tensor const& boxes1, at::Tensor const& boxes2,
                           std::optional<at::Tensor> const& mask,
                           std::optional<at::Tensor> const& counts,
                           std::optional<at::Tensor> const& offsets, std::string_view reduction);

// The backward's extra operands: grad_loss shaped like the forward's loss, num_valid a scalar.
void check_backward_inputs(at::Tensor const& grad_loss, at::Tensor const& boxes1,
                           at::Tensor const& num_valid, LossReduction reduction);

// The loss's dtype: float64 for float64 boxes, else float32 (as torchvision upcasts).
at::ScalarType loss_dtype(at::ScalarType boxes_dtype);

// The ATen composites: the CPU implementations.
std::tuple<at::Tensor, at::Tensor> giou_loss_aten(
    at::Tensor const& boxes1, at::Tensor const& boxes2, std::optional<at::Tensor> const& mask,
    std::optional<at::Tensor> const& counts, std::optional<at::Tensor> const& offsets,
    std::string_view reduction, double eps);

std::tuple<at::Tensor, at::Tensor> giou_loss_backward_aten(
    at::Tensor const& grad_loss, at::Tensor const& boxes1, at::Tensor const& boxes2,
    std::optional<at::Tensor> const& mask, std::optional<at::Tensor> const& counts,
    std::optional<at::Tensor> const& offsets, at::Tensor const& num_valid,
    std::string_view reduction, double eps);

}  // namespace giou
}  // namespace cutlass_ops
