// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::relu_backward.
#pragma once

#include <optional>
#include <tuple>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace relu_backward {

// grad_z's memory format: channels_last for 4-D (the ops' outputs), else contiguous.
inline MemoryFormat grad_z_format(Tensor const& out) {
  return out.dim() == 4 ? kChannelsLast : kContiguous;
}

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(Tensor const& grad, Tensor const& out, std::optional<Tensor> const& post_bias);

// The ATen composite: the CPU implementation and the CUDA fallback.
std::tuple<Tensor, Tensor> relu_backward_aten(Tensor const& grad, Tensor const& out,
                                              std::optional<Tensor> const& post_bias);

}  // namespace relu_backward
}  // namespace cutlass_ops
