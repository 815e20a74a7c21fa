// Torch-side pieces shared by the CPU and CUDA implementations of cutlass_ops::se_gate.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "common/torch_stable.h"

namespace cutlass_ops {
namespace se_gate {

// Checks shapes, dtypes and devices; errors name the argument.
void check_inputs(Tensor const& h, Tensor const& identity, Tensor const& w1,
                  Tensor const& b1, Tensor const& w2, Tensor const& b2,
                  std::optional<Tensor> const& identity_bias,
                  std::optional<Tensor> const& post_bias,
                  std::optional<Tensor> const& h_bias = std::nullopt, char const* op = "se_gate");

// Shape of the pooled output: AvgPool2d(3, 2, 1) of (N, C, H, W).
inline std::vector<int64_t> pooled_shape(Tensor const& h) {
  return {h.size(0), h.size(1), (h.size(2) + 1) / 2, (h.size(3) + 1) / 2};
}

// The ATen composite: the CPU implementation and the CUDA fallback.
std::tuple<Tensor, Tensor> se_gate_aten(
    Tensor const& h, Tensor const& identity, Tensor const& w1, Tensor const& b1,
    Tensor const& w2, Tensor const& b2, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias);

// The CUDA implementation (se_gate_cuda.cpp; CUDA builds only): also conv2d_fused_se_gate's
// two-kernel path (kernels/conv2d_fused/conv2d_fused_cuda.cpp).
std::tuple<Tensor, Tensor> se_gate_cuda(
    Tensor const& h, Tensor const& identity, Tensor const& w1, Tensor const& b1,
    Tensor const& w2, Tensor const& b2, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias);

// The same gate in three steps, around an excite MLP of the caller's (cutlass_ops/ops/se_gate.py):
//   se_squeeze:    s   = mean_hw(h + h_bias)                 (N, C) in h's dtype
//   se_gate_apply: out = relu((h + h_bias) * gate + identity + identity_bias) + post_bias
//                  (and the pooled map), gate (N, C)
void check_squeeze_inputs(Tensor const& h, std::optional<Tensor> const& h_bias);
void check_apply_inputs(Tensor const& h, Tensor const& identity, Tensor const& gate,
                        std::optional<Tensor> const& identity_bias, std::optional<Tensor> const& post_bias,
                        std::optional<Tensor> const& h_bias);
Tensor se_squeeze_aten(Tensor const& h, std::optional<Tensor> const& h_bias);
std::tuple<Tensor, Tensor> se_gate_apply_aten(
    Tensor const& h, Tensor const& identity, Tensor const& gate, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias);

// se_gate_backward: the gradients of se_gate(h, identity, fc1/fc2, identity_bias,
// post_bias[, avgpool][, h_bias]) from grad_out (and grad_pooled when avgpool) and the saved h
// and output: grad_h, grad_identity (in h's dtype, channels_last), the excite weights' and the
// three scalars' gradients (float32; float64 for float64 h).  The ReLU mask comes from the
// saved output, as relu_backward's.
using SeGateGrads = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                               Tensor, Tensor, Tensor>;
void check_backward_inputs(Tensor const& grad_out, std::optional<Tensor> const& grad_pooled,
                           Tensor const& h, Tensor const& out, Tensor const& w1,
                           Tensor const& b1, Tensor const& w2, Tensor const& b2,
                           std::optional<Tensor> const& post_bias, std::optional<Tensor> const& h_bias);
SeGateGrads se_gate_backward_aten(Tensor const& grad_out, std::optional<Tensor> const& grad_pooled,
                                  Tensor const& h, Tensor const& out, Tensor const& w1,
                                  Tensor const& b1, Tensor const& w2, Tensor const& b2,
                                  std::optional<Tensor> const& post_bias,
                                  std::optional<Tensor> const& h_bias);

}  // namespace se_gate
}  // namespace cutlass_ops
