// cutlass_ops::se_gate: squeeze-excitation gate + residual + ReLU in one pass, and
// se_gate_backward (its whole backward, used by cutlass_ops/ops/ (the autograd formulas)); se_squeeze and
// se_gate_apply, the same gate's two ends around an excite MLP of the caller's.
// Schemas, checks and the CPU (ATen) implementations; CUDA in se_gate_cuda.cpp, fake in
// cutlass_ops/ops/se_gate.py.
#include "se_gate/se_gate_op.h"

#include <utility>

namespace cutlass_ops {
namespace se_gate {

namespace {

// The ATen ops the composites use, by schema (every argument, defaults included).
// t.mean({2, 3}): the per-image, per-channel mean.
Tensor mean_hw(Tensor const& t) {
  return aten_call("aten::mean", "dim", t, std::optional<std::vector<int64_t>>(std::vector<int64_t>{2, 3}), false,
                   std::optional<ScalarType>());
}
// t.sum(dims), in t's dtype.
Tensor sum_over(Tensor const& t, std::vector<int64_t> const& dims) {
  return torch::stable::sum(t, IntArrayRef(dims), false, std::nullopt);
}
Tensor linear(Tensor const& input, Tensor const& weight, Tensor const& bias) {
  return aten_call("aten::linear", "", input, weight, std::optional<Tensor>(bias));
}
// t.unsqueeze(-1).unsqueeze(-1): (N, C) -> (N, C, 1, 1).
Tensor unsqueeze_hw(Tensor const& t) { return torch::stable::unsqueeze(torch::stable::unsqueeze(t, -1), -1); }
// A scalar tensor as a 0-dim one in `dtype`.
Tensor as_scalar(Tensor const& s, ScalarType dtype) { return torch::stable::reshape(to_dtype(s, dtype), {}); }

std::vector<int64_t> const kPoolKernel{3, 3}, kPoolStride{2, 2}, kPoolPadding{1, 1};

// The composites' result: y stored in h's dtype (channels_last), and, if `avgpool`, the
// AvgPool2d(3, 2, 1) of that stored (rounded) output, as the CUDA kernel pools it.
std::tuple<Tensor, Tensor> store_and_pool(Tensor const& h, Tensor const& y, bool avgpool) {
  auto out = empty(h.sizes(), h.scalar_type(), h.device(), kChannelsLast);
  torch::stable::copy_(out, y);
  auto pooled = empty({0}, h.scalar_type(), h.device());
  if (avgpool) {
    pooled = empty(pooled_shape(h), h.scalar_type(), h.device(), kChannelsLast);
    torch::stable::copy_(pooled, aten_call("aten::avg_pool2d", "", to_dtype(out, y.scalar_type()), kPoolKernel,
                                           kPoolStride, kPoolPadding, false, true, std::optional<int64_t>()));
  }
  return {out, pooled};
}

}  // namespace

namespace {
void check_map(Tensor const& h, char const* op) {
  CUTLASS_OPS_CHECK_VALUE(h.dim() == 4, op, ": h must be 4-D (N, C, H, W), got ", h.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(h.scalar_type()), op, ": h must be floating, got ",
                          h.scalar_type());
}

void check_scalars(Tensor const& h, std::optional<Tensor> const& identity_bias,
                   std::optional<Tensor> const& post_bias, std::optional<Tensor> const& h_bias, char const* op) {
  std::pair<char const*, std::optional<Tensor> const*> const scalars[] = {
      {"identity_bias", &identity_bias}, {"post_bias", &post_bias}, {"h_bias", &h_bias}};
  for (auto const& [name, s] : scalars) {
    if (!*s) continue;
    CUTLASS_OPS_CHECK_VALUE((*s)->numel() == 1 && (*s)->dim() <= 1, op, ": ", name,
                            " must be a scalar tensor (0-d or one element), got shape ", (*s)->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating((*s)->scalar_type()), op, ": ", name, " must be floating, got ",
                            (*s)->scalar_type());
    CUTLASS_OPS_CHECK_VALUE((*s)->device() == h.device(), op, ": ", name, " is on ", (*s)->device(),
                            " but h is on ", h.device());
  }
}
}  // namespace

void check_inputs(Tensor const& h, Tensor const& identity, Tensor const& w1,
                  Tensor const& b1, Tensor const& w2, Tensor const& b2,
                  std::optional<Tensor> const& identity_bias,
                  std::optional<Tensor> const& post_bias,
                  std::optional<Tensor> const& h_bias, char const* op) {
  check_map(h, op);
  CUTLASS_OPS_CHECK_VALUE(identity.sizes() == h.sizes(), op, ": identity shape ", identity.sizes(),
                          " differs from h shape ", h.sizes());
  CUTLASS_OPS_CHECK_VALUE(identity.scalar_type() == h.scalar_type(), op, ": identity dtype ",
                          identity.scalar_type(), " differs from h dtype ", h.scalar_type());
  int64_t C = h.size(1);
  CUTLASS_OPS_CHECK_VALUE(w1.dim() == 2 && w1.size(1) == C, op, ": fc1_weight must be (R, ", C,
                          "), got ", w1.sizes());
  int64_t R = w1.size(0);
  CUTLASS_OPS_CHECK_VALUE(b1.dim() == 1 && b1.size(0) == R, op, ": fc1_bias must be (", R, "), got ",
                          b1.sizes());
  CUTLASS_OPS_CHECK_VALUE(w2.dim() == 2 && w2.size(0) == C && w2.size(1) == R,
                          op, ": fc2_weight must be (", C, ", ", R, "), got ", w2.sizes());
  CUTLASS_OPS_CHECK_VALUE(b2.dim() == 1 && b2.size(0) == C, op, ": fc2_bias must be (", C,
                          "), got ", b2.sizes());
  std::pair<char const*, Tensor const*> const named[] = {
      {"identity", &identity}, {"fc1_weight", &w1}, {"fc1_bias", &b1}, {"fc2_weight", &w2}, {"fc2_bias", &b2}};
  for (auto const& [name, t] : named) {
    CUTLASS_OPS_CHECK_VALUE(t->device() == h.device(), op, ": ", name, " is on ", t->device(), " but h is on ",
                            h.device());
    CUTLASS_OPS_CHECK_VALUE(is_floating(t->scalar_type()), op, ": ", name, " must be floating, got ",
                            t->scalar_type());
  }
  check_scalars(h, identity_bias, post_bias, h_bias, op);
}

void check_squeeze_inputs(Tensor const& h, std::optional<Tensor> const& h_bias) {
  check_map(h, "se_squeeze");
  check_scalars(h, std::nullopt, std::nullopt, h_bias, "se_squeeze");
}

void check_apply_inputs(Tensor const& h, Tensor const& identity, Tensor const& gate,
                        std::optional<Tensor> const& identity_bias, std::optional<Tensor> const& post_bias,
                        std::optional<Tensor> const& h_bias) {
  char const* op = "se_gate_apply";
  check_map(h, op);
  CUTLASS_OPS_CHECK_VALUE(identity.sizes() == h.sizes(), op, ": identity shape ", identity.sizes(),
                          " differs from h shape ", h.sizes());
  CUTLASS_OPS_CHECK_VALUE(identity.scalar_type() == h.scalar_type(), op, ": identity dtype ",
                          identity.scalar_type(), " differs from h dtype ", h.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(identity.device() == h.device(), op, ": identity is on ", identity.device(),
                          " but h is on ", h.device());
  CUTLASS_OPS_CHECK_VALUE(gate.dim() == 2 && gate.size(0) == h.size(0) && gate.size(1) == h.size(1), op,
                          ": gate must be (N, C) = (", h.size(0), ", ", h.size(1), "), got ", gate.sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(gate.scalar_type()), op, ": gate must be floating, got ", gate.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(gate.device() == h.device(), op, ": gate is on ", gate.device(), " but h is on ",
                          h.device());
  check_scalars(h, identity_bias, post_bias, h_bias, op);
}

std::tuple<Tensor, Tensor> se_gate_aten(
    Tensor const& h, Tensor const& identity, Tensor const& w1, Tensor const& b1,
    Tensor const& w2, Tensor const& b2, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias) {
  check_inputs(h, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias);
  auto compute = h.scalar_type() == kDouble ? kDouble : kFloat;
  auto hf = to_dtype(h, compute);
  if (h_bias) hf = hf + as_scalar(*h_bias, compute);
  auto squeeze = mean_hw(hf);
  auto hidden = relu(linear(squeeze, to_dtype(w1, compute), to_dtype(b1, compute)));
  auto gate = sigmoid(linear(hidden, to_dtype(w2, compute), to_dtype(b2, compute)));
  auto y = hf * unsqueeze_hw(gate) + to_dtype(identity, compute);
  if (identity_bias) y = y + as_scalar(*identity_bias, compute);
  y = relu(y);
  if (post_bias) y = y + as_scalar(*post_bias, compute);
  return store_and_pool(h, y, avgpool);
}

Tensor se_squeeze_aten(Tensor const& h, std::optional<Tensor> const& h_bias) {
  check_squeeze_inputs(h, h_bias);
  auto compute = h.scalar_type() == kDouble ? kDouble : kFloat;
  auto hf = to_dtype(h, compute);
  if (h_bias) hf = hf + as_scalar(*h_bias, compute);
  return to_dtype(mean_hw(hf), h.scalar_type());
}

std::tuple<Tensor, Tensor> se_gate_apply_aten(
    Tensor const& h, Tensor const& identity, Tensor const& gate, std::optional<Tensor> const& identity_bias,
    std::optional<Tensor> const& post_bias, bool avgpool, std::optional<Tensor> const& h_bias) {
  check_apply_inputs(h, identity, gate, identity_bias, post_bias, h_bias);
  auto compute = h.scalar_type() == kDouble ? kDouble : kFloat;
  auto hf = to_dtype(h, compute);
  if (h_bias) hf = hf + as_scalar(*h_bias, compute);
  // The gate as the CUDA kernel reads it: rounded to h's dtype first.
  auto g = to_dtype(to_dtype(gate, h.scalar_type()), compute);
  auto y = hf * unsqueeze_hw(g) + to_dtype(identity, compute);
  if (identity_bias) y = y + as_scalar(*identity_bias, compute);
  y = relu(y);
  if (post_bias) y = y + as_scalar(*post_bias, compute);
  return store_and_pool(h, y, avgpool);
}

void check_backward_inputs(Tensor const& grad_out, std::optional<Tensor> const& grad_pooled,
                           Tensor const& h, Tensor const& out, Tensor const& w1,
                           Tensor const& b1, Tensor const& w2, Tensor const& b2,
                           std::optional<Tensor> const& post_bias, std::optional<Tensor> const& h_bias) {
  std::pair<char const*, Tensor const*> const maps[] = {{"grad_out", &grad_out}, {"out", &out}};
  for (auto const& [name, t] : maps) {
    CUTLASS_OPS_CHECK_VALUE(t->sizes() == h.sizes(), "se_gate_backward: ", name, " must have h's shape ",
                            h.sizes(), ", got ", t->sizes());
    CUTLASS_OPS_CHECK_VALUE(t->scalar_type() == h.scalar_type(), "se_gate_backward: ", name,
                            " must have h's dtype ", h.scalar_type(), ", got ", t->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(t->device() == h.device(), "se_gate_backward: ", name, " is on ", t->device(),
                            " but h is on ", h.device());
  }
  // out stands where identity did (same shape, dtype and device: checked above).
  check_inputs(h, out, w1, b1, w2, b2, std::nullopt, post_bias, h_bias, "se_gate_backward");
  if (grad_pooled) {
    auto want = pooled_shape(h);
    CUTLASS_OPS_CHECK_VALUE(grad_pooled->sizes() == IntArrayRef(want), "se_gate_backward: grad_pooled must be ",
                            IntArrayRef(want), " (AvgPool2d(3, 2, 1) of ", h.sizes(), "), got ",
                            grad_pooled->sizes());
    CUTLASS_OPS_CHECK_VALUE(grad_pooled->scalar_type() == h.scalar_type(), "se_gate_backward: grad_pooled dtype ",
                            grad_pooled->scalar_type(), " differs from h dtype ", h.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(grad_pooled->device() == h.device(), "se_gate_backward: grad_pooled on ",
                            grad_pooled->device(), " but h on ", h.device());
  }
}

SeGateGrads se_gate_backward_aten(Tensor const& grad_out, std::optional<Tensor> const& grad_pooled,
                                  Tensor const& h, Tensor const& out, Tensor const& w1,
                                  Tensor const& b1, Tensor const& w2, Tensor const& b2,
                                  std::optional<Tensor> const& post_bias,
                                  std::optional<Tensor> const& h_bias) {
  check_backward_inputs(grad_out, grad_pooled, h, out, w1, b1, w2, b2, post_bias, h_bias);
  auto compute = h.scalar_type() == kDouble ? kDouble : kFloat;
  auto g = to_dtype(grad_out, compute);
  if (grad_pooled) {
    // NCHW-contiguous: CUDA's avg_pool2d backward is wrong for channels_last input with
    // padding (pytorch/pytorch#188344).  `self` only gives the shape.
    auto shape_only = empty(h.sizes(), compute, h.device());
    g = g + aten_call("aten::avg_pool2d_backward", "", torch::stable::contiguous(to_dtype(*grad_pooled, compute)),
                      shape_only, kPoolKernel, kPoolStride, kPoolPadding, false, true, std::optional<int64_t>());
  }
  // The mask as the saved output encodes it (see relu_backward).
  auto active = post_bias ? ne(out, as_scalar(*post_bias, out.scalar_type())) : out > 0.0;
  auto dy = where(active, g, zeros({}, g.scalar_type(), g.device()));
  // The gate recomputed from the squeeze, and the excite MLP's backward.
  auto hf = to_dtype(h, compute);
  if (h_bias) hf = hf + as_scalar(*h_bias, compute);
  auto squeeze = mean_hw(hf);
  auto w1c = to_dtype(w1, compute), w2c = to_dtype(w2, compute);
  auto pre1 = linear(squeeze, w1c, to_dtype(b1, compute));
  auto hidden = relu(pre1);
  auto gate = sigmoid(linear(hidden, w2c, to_dtype(b2, compute)));
  auto d_pre2 = sum_over(dy * hf, {2, 3}) * gate * (1.0 - gate);
  auto d_pre1 = mm(d_pre2, w2c) * (pre1 > 0.0);
  // Divided by a CPU scalar, as ATen's `tensor / double` is (on CUDA: times its reciprocal).
  auto d_squeeze = mm(d_pre1, w1c) / scalar_like(d_pre1, double(h.size(2) * h.size(3)));
  auto grad_h_exact = dy * unsqueeze_hw(gate) + unsqueeze_hw(d_squeeze);
  auto grad_h = empty(h.sizes(), h.scalar_type(), h.device(), kChannelsLast);
  torch::stable::copy_(grad_h, grad_h_exact);
  auto grad_identity = empty(h.sizes(), h.scalar_type(), h.device(), kChannelsLast);
  torch::stable::copy_(grad_identity, dy);
  return {grad_h, grad_identity, mm(transposed(d_pre1), squeeze), sum_over(d_pre1, {0}),
          mm(transposed(d_pre2), hidden), sum_over(d_pre2, {0}), torch::stable::sum(dy), torch::stable::sum(g),
          torch::stable::sum(grad_h_exact)};
}

}  // namespace se_gate
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "se_gate(Tensor h, Tensor identity, Tensor fc1_weight, Tensor fc1_bias, Tensor fc2_weight, "
      "Tensor fc2_bias, Tensor? identity_bias=None, Tensor? post_bias=None, bool avgpool=False, "
      "Tensor? h_bias=None) -> (Tensor, Tensor)");
  m.def(
      "se_gate_backward(Tensor grad_out, Tensor? grad_pooled, Tensor h, Tensor out, Tensor fc1_weight, "
      "Tensor fc1_bias, Tensor fc2_weight, Tensor fc2_bias, Tensor? post_bias=None, Tensor? h_bias=None) -> "
      "(Tensor grad_h, Tensor grad_identity, Tensor grad_fc1_weight, Tensor grad_fc1_bias, Tensor grad_fc2_weight, "
      "Tensor grad_fc2_bias, Tensor grad_identity_bias, Tensor grad_post_bias, Tensor grad_h_bias)");
  m.def("se_squeeze(Tensor h, Tensor? h_bias=None) -> Tensor");
  m.def(
      "se_gate_apply(Tensor h, Tensor identity, Tensor gate, Tensor? identity_bias=None, Tensor? post_bias=None, "
      "bool avgpool=False, Tensor? h_bias=None) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("se_gate", TORCH_BOX(&cutlass_ops::se_gate::se_gate_aten));
  m.impl("se_gate_backward", TORCH_BOX(&cutlass_ops::se_gate::se_gate_backward_aten));
  m.impl("se_squeeze", TORCH_BOX(&cutlass_ops::se_gate::se_squeeze_aten));
  m.impl("se_gate_apply", TORCH_BOX(&cutlass_ops::se_gate::se_gate_apply_aten));
}
