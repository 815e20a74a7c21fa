// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::se_gate.
#pragma once

#include <ATen/ATen.h>

#include <tuple>
#include <vector>

namespace cutlass_ops {
namespace se_gate {

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1,
                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                  c10::optional<at::Tensor> const& identity_bias,
                  c10::optional<at::Tensor> const& post_bias,
                  c10::optional<at::Tensor> const& h_bias = c10::nullopt, char const* op = "se_gate");

// Shape of the pooled output: AvgPool2d(3, 2, 1) of (N, C, H, W).
inline std::vector<int64_t> pooled_shape(at::Tensor const& h) {
  return {h.size(0), h.size(1), (h.size(2) + 1) / 2, (h.size(3) + 1) / 2};
}

// The ATen composite: the CPU implementation and the CUDA fallback.
std::tuple<at::Tensor, at::Tensor> se_gate_aten(
    at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1, at::Tensor const& b1,
    at::Tensor const& w2, at::Tensor const& b2, c10::optional<at::Tensor> const& identity_bias,
    c10::optional<at::Tensor> const& post_bias, bool avgpool, c10::optional<at::Tensor> const& h_bias);

// se_gate_backward: the gradients of se_gate(h, identity, fc1/fc2, identity_bias,
// post_bias[, avgpool][, h_bias]) from grad_out (and grad_pooled when avgpool) and the saved h
// and output: grad_h, grad_identity (in h's dtype, channels_last), the excite weights' and the
// three scalars' gradients (float32; float64 for float64 h).  The ReLU mask comes from the
// saved output, as relu_backward's.
using SeGateGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                               at::Tensor, at::Tensor, at::Tensor>;
void check_backward_inputs(at::Tensor const& grad_out, c10::optional<at::Tensor> const& grad_pooled,
                           at::Tensor const& h, at::Tensor const& out, at::Tensor const& w1,
                           at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                           c10::optional<at::Tensor> const& post_bias, c10::optional<at::Tensor> const& h_bias);
SeGateGrads se_gate_backward_aten(at::Tensor const& grad_out, c10::optional<at::Tensor> const& grad_pooled,
                                  at::Tensor const& h, at::Tensor const& out, at::Tensor const& w1,
                                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                                  c10::optional<at::Tensor> const& post_bias,
                                  c10::optional<at::Tensor> const& h_bias);

}  // namespace se_gate
}  // namespace cutlass_ops
