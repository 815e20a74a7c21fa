// The argument checks of a Linear-shaped op, y = f(x @ weight^T + bias): x (..., K) floating,
// weight (N, K) in x's dtype, bias (N) floating or None, all on x's device (errors name the op
// and the argument).  Shared by linear_silu and linear_residual.
#pragma once

#include <optional>

#include "common/torch_stable.h"

namespace cutlass_ops {

inline void check_linear_inputs(char const* op, Tensor const& x, Tensor const& weight,
                                std::optional<Tensor> const& bias) {
  CUTLASS_OPS_CHECK_VALUE(x.dim() >= 1, op, ": x must have a feature dimension (..., K), got a 0-D tensor");
  CUTLASS_OPS_CHECK_VALUE(is_floating(x.scalar_type()), op, ": x must be floating, got ", x.scalar_type());
  int64_t const k = x.size(x.dim() - 1);
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == k, op, ": weight must be (N, ", k,
                          ") for x (..., ", k, "), got ", weight.sizes());
  CUTLASS_OPS_CHECK_VALUE(weight.scalar_type() == x.scalar_type(), op, ": weight dtype ", weight.scalar_type(),
                          " differs from x dtype ", x.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.device() == x.device(), op, ": weight is on ", weight.device(), " but x is on ",
                          x.device());
  if (bias) {
    CUTLASS_OPS_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must be (",
                            weight.size(0), "), got ", bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(bias->scalar_type()), op, ": bias must be floating, got ",
                            bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(bias->device() == x.device(), op, ": bias is on ", bias->device(), " but x is on ",
                            x.device());
  }
}

}  // namespace cutlass_ops
