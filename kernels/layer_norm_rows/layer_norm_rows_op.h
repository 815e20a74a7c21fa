// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::layer_norm_rows.
#pragma once

#include <optional>
#include <tuple>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace layer_norm {

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(Tensor const& x, std::optional<Tensor> const& residual, std::optional<Tensor> const& weight,
                  std::optional<Tensor> const& bias);

// The ATen composite (x + residual in x's dtype, then aten::native_layer_norm in float32, or
// float64 for float64): the CPU implementation and the CUDA fallback.
std::tuple<Tensor, Tensor, Tensor, Tensor> layer_norm_rows_aten(Tensor const& x, std::optional<Tensor> const& residual,
                                                                std::optional<Tensor> const& weight,
                                                                std::optional<Tensor> const& bias, double eps);

void check_backward_inputs(Tensor const& grad_y, std::optional<Tensor> const& grad_sum, Tensor const& s,
                           Tensor const& mean, Tensor const& rstd, std::optional<Tensor> const& weight);

// The backward as ATen ops in the statistics' dtype (aten::native_layer_norm_backward, the
// bias's gradient a column sum): the CPU implementation and the CUDA fallback.
std::tuple<Tensor, Tensor, Tensor> layer_norm_rows_backward_aten(Tensor const& grad_y,
                                                                 std::optional<Tensor> const& grad_sum,
                                                                 Tensor const& s, Tensor const& mean,
                                                                 Tensor const& rstd,
                                                                 std::optional<Tensor> const& weight,
                                                                 bool weight_grad, bool bias_grad);

}  // namespace layer_norm
}  // namespace cutlass_ops
