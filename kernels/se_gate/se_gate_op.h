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
                  c10::optional<at::Tensor> const& post_bias);

// Shape of the pooled output: AvgPool2d(3, 2, 1) of (N, C, H, W).
inline std::vector<int64_t> pooled_shape(at::Tensor const& h) {
  return {h.size(0), h.size(1), (h.size(2) + 1) / 2, (h.size(3) + 1) / 2};
}

// The ATen composite: the CPU implementation and the CUDA fallback.
std::tuple<at::Tensor, at::Tensor> se_gate_aten(
    at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1, at::Tensor const& b1,
    at::Tensor const& w2, at::Tensor const& b2, c10::optional<at::Tensor> const& identity_bias,
    c10::optional<at::Tensor> const& post_bias, bool avgpool);

// se_gate_pool_backward: grad_out plus the gradient through se_gate's AvgPool2d(3, 2, 1,
// count_include_pad) of grad_pooled (the backward of se_gate(..., avgpool=True)).
void check_pool_backward_inputs(at::Tensor const& grad_out, at::Tensor const& grad_pooled);
at::Tensor se_gate_pool_backward_aten(at::Tensor const& grad_out, at::Tensor const& grad_pooled);

}  // namespace se_gate
}  // namespace cutlass_ops
