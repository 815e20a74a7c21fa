// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::se_gate.
#pragma once

#include <ATen/ATen.h>

namespace cutlass_ops {
namespace se_gate {

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1,
                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                  c10::optional<at::Tensor> const& identity_bias,
                  c10::optional<at::Tensor> const& post_bias);

// The ATen composite: the CPU implementation and the CUDA fallback.
at::Tensor se_gate_aten(at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1,
                        at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                        c10::optional<at::Tensor> const& identity_bias,
                        c10::optional<at::Tensor> const& post_bias);

}  // namespace se_gate
}  // namespace cutlass_ops
