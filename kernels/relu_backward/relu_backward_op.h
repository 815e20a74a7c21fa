// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::relu_backward.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace cutlass_ops {
namespace relu_backward {

// grad_z's memory format: channels_last for 4-D (the ops' outputs), else contiguous.
inline at::MemoryFormat grad_z_format(at::Tensor const& out) {
  return out.dim() == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(at::Tensor const& grad, at::Tensor const& out, c10::optional<at::Tensor> const& post_bias);

// The ATen composite: the CPU implementation and the CUDA fallback.
std::tuple<at::Tensor, at::Tensor> relu_backward_aten(at::Tensor const& grad, at::Tensor const& out,
                                                      c10::optional<at::Tensor> const& post_bias);

}  // namespace relu_backward
}  // namespace cutlass_ops
