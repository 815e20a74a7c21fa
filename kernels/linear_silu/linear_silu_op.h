// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::linear_silu.
#pragma once

#include <optional>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace linear_silu {

// Checks shapes, dtypes and devices (errors name the argument).
void check_inputs(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, double alpha);

// silu(alpha * (x @ weight^T + bias)) by ATen in float32 (float64 for float64), rounded once to x's
// dtype: the CPU implementation and the CUDA fallback where no fused kernel applies.
Tensor linear_silu_aten(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, double alpha);

}  // namespace linear_silu
}  // namespace cutlass_ops
