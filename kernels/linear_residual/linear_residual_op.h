// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::linear_residual.
#pragma once

#include <optional>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace linear_residual {

// Checks shapes, dtypes and devices (errors name the argument).
void check_inputs(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, Tensor const& residual,
                  double alpha);

// residual + alpha * x @ weight^T + bias by ATen in float32 (float64 for float64), rounded once to
// x's dtype: the CPU implementation and the CUDA fallback.
Tensor linear_residual_aten(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias,
                            Tensor const& residual, double alpha);

}  // namespace linear_residual
}  // namespace cutlass_ops
