// cutlass_ops::se_gate: squeeze-excitation gate + residual + ReLU in one pass, and
// se_gate_backward (its whole backward, used by cutlass_ops/autograd.py).
// Schemas, checks and the CPU (ATen) implementations; CUDA in se_gate_cuda.cpp, fake in
// cutlass_ops/ops.py.
#include "se_gate/se_gate_op.h"

#include <torch/library.h>

#include <utility>

namespace cutlass_ops {
namespace se_gate {

void check_inputs(at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1,
                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                  c10::optional<at::Tensor> const& identity_bias,
                  c10::optional<at::Tensor> const& post_bias,
                  c10::optional<at::Tensor> const& h_bias, char const* op) {
  TORCH_CHECK_VALUE(h.dim() == 4, op, ": h must be 4-D (N, C, H, W), got ", h.dim(), "-D");
  TORCH_CHECK_VALUE(at::isFloatingType(h.scalar_type()), op, ": h must be floating, got ",
                    h.scalar_type());
  TORCH_CHECK_VALUE(identity.sizes() == h.sizes(), op, ": identity shape ", identity.sizes(),
                    " differs from h shape ", h.sizes());
  TORCH_CHECK_VALUE(identity.scalar_type() == h.scalar_type(), op, ": identity dtype ",
                    identity.scalar_type(), " differs from h dtype ", h.scalar_type());
  int64_t C = h.size(1);
  TORCH_CHECK_VALUE(w1.dim() == 2 && w1.size(1) == C, op, ": fc1_weight must be (R, ", C,
                    "), got ", w1.sizes());
  int64_t R = w1.size(0);
  TORCH_CHECK_VALUE(b1.dim() == 1 && b1.size(0) == R, op, ": fc1_bias must be (", R, "), got ",
                    b1.sizes());
  TORCH_CHECK_VALUE(w2.dim() == 2 && w2.size(0) == C && w2.size(1) == R,
                    op, ": fc2_weight must be (", C, ", ", R, "), got ", w2.sizes());
  TORCH_CHECK_VALUE(b2.dim() == 1 && b2.size(0) == C, op, ": fc2_bias must be (", C,
                    "), got ", b2.sizes());
  std::pair<char const*, at::Tensor const*> const named[] = {
      {"identity", &identity}, {"fc1_weight", &w1}, {"fc1_bias", &b1}, {"fc2_weight", &w2}, {"fc2_bias", &b2}};
  for (auto const& [name, t] : named) {
    TORCH_CHECK_VALUE(t->device() == h.device(), op, ": ", name, " is on ", t->device(), " but h is on ",
                      h.device());
    TORCH_CHECK_VALUE(at::isFloatingType(t->scalar_type()), op, ": ", name, " must be floating, got ",
                      t->scalar_type());
  }
  std::pair<char const*, c10::optional<at::Tensor> const*> const scalars[] = {
      {"identity_bias", &identity_bias}, {"post_bias", &post_bias}, {"h_bias", &h_bias}};
  for (auto const& [name, s] : scalars) {
    if (!*s) continue;
    TORCH_CHECK_VALUE((*s)->numel() == 1 && (*s)->dim() <= 1, op, ": ", name,
                      " must be a scalar tensor (0-d or one element), got shape ", (*s)->sizes());
    TORCH_CHECK_VALUE(at::isFloatingType((*s)->scalar_type()), op, ": ", name, " must be floating, got ",
                      (*s)->scalar_type());
    TORCH_CHECK_VALUE((*s)->device() == h.device(), op, ": ", name, " is on ", (*s)->device(),
                      " but h is on ", h.device());
  }
}

std::tuple<at::Tensor, at::Tensor> se_gate_aten(
    at::Tensor const& h, at::Tensor const& identity, at::Tensor const& w1, at::Tensor const& b1,
    at::Tensor const& w2, at::Tensor const& b2, c10::optional<at::Tensor> const& identity_bias,
    c10::optional<at::Tensor> const& post_bias, bool avgpool, c10::optional<at::Tensor> const& h_bias) {
  check_inputs(h, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias);
  auto compute = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto hf = h.to(compute);
  if (h_bias) hf = hf + h_bias->to(compute).reshape({});
  auto squeeze = hf.mean({2, 3});
  auto hidden = at::relu(at::linear(squeeze, w1.to(compute), b1.to(compute)));
  auto gate = at::sigmoid(at::linear(hidden, w2.to(compute), b2.to(compute)));
  auto y = hf * gate.unsqueeze(-1).unsqueeze(-1) + identity.to(compute);
  if (identity_bias) y = y + identity_bias->to(compute).reshape({});
  y = at::relu(y);
  if (post_bias) y = y + post_bias->to(compute).reshape({});
  auto cl = h.options().memory_format(at::MemoryFormat::ChannelsLast);
  auto out = at::empty(h.sizes(), cl);
  out.copy_(y);
  auto pooled = at::empty({0}, h.options());
  if (avgpool) {
    // Pools the stored (rounded) output, as the CUDA kernel does.
    pooled = at::empty(pooled_shape(h), cl);
    pooled.copy_(at::avg_pool2d(out.to(compute), {3, 3}, {2, 2}, {1, 1}, false, true));
  }
  return {out, pooled};
}

void check_backward_inputs(at::Tensor const& grad_out, c10::optional<at::Tensor> const& grad_pooled,
                           at::Tensor const& h, at::Tensor const& out, at::Tensor const& w1,
                           at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                           c10::optional<at::Tensor> const& post_bias, c10::optional<at::Tensor> const& h_bias) {
  std::pair<char const*, at::Tensor const*> const maps[] = {{"grad_out", &grad_out}, {"out", &out}};
  for (auto const& [name, t] : maps) {
    TORCH_CHECK_VALUE(t->sizes() == h.sizes(), "se_gate_backward: ", name, " must have h's shape ", h.sizes(),
                      ", got ", t->sizes());
    TORCH_CHECK_VALUE(t->scalar_type() == h.scalar_type(), "se_gate_backward: ", name, " must have h's dtype ",
                      h.scalar_type(), ", got ", t->scalar_type());
    TORCH_CHECK_VALUE(t->device() == h.device(), "se_gate_backward: ", name, " is on ", t->device(),
                      " but h is on ", h.device());
  }
  // out stands where identity did (same shape, dtype and device: checked above).
  check_inputs(h, out, w1, b1, w2, b2, c10::nullopt, post_bias, h_bias, "se_gate_backward");
  if (grad_pooled) {
    auto want = pooled_shape(h);
    TORCH_CHECK_VALUE(grad_pooled->sizes() == at::IntArrayRef(want), "se_gate_backward: grad_pooled must be ",
                      at::IntArrayRef(want), " (AvgPool2d(3, 2, 1) of ", h.sizes(), "), got ", grad_pooled->sizes());
    TORCH_CHECK_VALUE(grad_pooled->scalar_type() == h.scalar_type(), "se_gate_backward: grad_pooled dtype ",
                      grad_pooled->scalar_type(), " differs from h dtype ", h.scalar_type());
    TORCH_CHECK_VALUE(grad_pooled->device() == h.device(), "se_gate_backward: grad_pooled on ",
                      grad_pooled->device(), " but h on ", h.device());
  }
}

SeGateGrads se_gate_backward_aten(at::Tensor const& grad_out, c10::optional<at::Tensor> const& grad_pooled,
                                  at::Tensor const& h, at::Tensor const& out, at::Tensor const& w1,
                                  at::Tensor const& b1, at::Tensor const& w2, at::Tensor const& b2,
                                  c10::optional<at::Tensor> const& post_bias,
                                  c10::optional<at::Tensor> const& h_bias) {
  check_backward_inputs(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  auto compute = h.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto g = grad_out.to(compute);
  if (grad_pooled) {
    // NCHW-contiguous: CUDA's avg_pool2d backward is wrong for channels_last input with
    // padding (pytorch/pytorch#188344).  `self` only gives the shape.
    auto shape_only = at::empty(h.sizes(), h.options().dtype(compute));
    g = g + at::avg_pool2d_backward(grad_pooled->to(compute).contiguous(), shape_only, {3, 3}, {2, 2}, {1, 1},
                                    false, true, c10::nullopt);
  }
  // The mask as the saved output encodes it (see relu_backward).
  auto active = post_bias ? out.ne(post_bias->to(out.scalar_type()).reshape({})) : out.gt(0);
  auto dy = at::where(active, g, at::zeros({}, g.options()));
  // The gate recomputed from the squeeze, and the excite MLP's backward.
  auto hf = h.to(compute);
  if (h_bias) hf = hf + h_bias->to(compute).reshape({});
  auto squeeze = hf.mean({2, 3});
  auto w1c = w1.to(compute), w2c = w2.to(compute);
  auto pre1 = at::linear(squeeze, w1c, b1.to(compute));
  auto hidden = at::relu(pre1);
  auto gate = at::sigmoid(at::linear(hidden, w2c, b2.to(compute)));
  auto d_pre2 = (dy * hf).sum({2, 3}) * gate * (1 - gate);
  auto d_pre1 = at::mm(d_pre2, w2c) * pre1.gt(0);
  auto d_squeeze = at::mm(d_pre1, w1c) / double(h.size(2) * h.size(3));
  auto cl = h.options().memory_format(at::MemoryFormat::ChannelsLast);
  auto grad_h_exact = dy * gate.unsqueeze(-1).unsqueeze(-1) + d_squeeze.unsqueeze(-1).unsqueeze(-1);
  auto grad_h = at::empty(h.sizes(), cl);
  grad_h.copy_(grad_h_exact);
  auto grad_identity = at::empty(h.sizes(), cl);
  grad_identity.copy_(dy);
  return {grad_h, grad_identity, at::mm(d_pre1.t(), squeeze), d_pre1.sum(0), at::mm(d_pre2.t(), hidden),
          d_pre2.sum(0), dy.sum(), g.sum(), grad_h_exact.sum()};
}

}  // namespace se_gate
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "se_gate(Tensor h, Tensor identity, Tensor fc1_weight, Tensor fc1_bias, Tensor fc2_weight, "
      "Tensor fc2_bias, Tensor? identity_bias=None, Tensor? post_bias=None, bool avgpool=False, "
      "Tensor? h_bias=None) -> (Tensor, Tensor)");
  m.def(
      "se_gate_backward(Tensor grad_out, Tensor? grad_pooled, Tensor h, Tensor out, Tensor fc1_weight, "
      "Tensor fc1_bias, Tensor fc2_weight, Tensor fc2_bias, Tensor? post_bias=None, Tensor? h_bias=None) -> "
      "(Tensor grad_h, Tensor grad_identity, Tensor grad_fc1_weight, Tensor grad_fc1_bias, Tensor grad_fc2_weight, "
      "Tensor grad_fc2_bias, Tensor grad_identity_bias, Tensor grad_post_bias, Tensor grad_h_bias)");
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("se_gate", &cutlass_ops::se_gate::se_gate_aten);
  m.impl("se_gate_backward", &cutlass_ops::se_gate::se_gate_backward_aten);
}
