// cutlass_ops::conv2d_fused: schema, input checks and the CPU (ATen) implementation.
// The CUDA implementation is in conv2d_fused_cuda.cpp; the fake (meta) one in
// cutlass_ops/ops/conv2d_fused.py.
#include "conv2d_fused/conv2d_fused_op.h"

#include "se_gate/se_gate_op.h"

namespace cutlass_ops {
namespace conv2d_fused {

namespace {

void check_scalar(std::optional<Tensor> const& t, char const* name, Tensor const& input) {
  if (!t) return;
  CUTLASS_OPS_CHECK_VALUE(t->numel() == 1 && t->dim() <= 1, "conv2d_fused: ", name,
                          " must be a scalar tensor (0-d or one element), got shape ", t->sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(t->scalar_type()), "conv2d_fused: ", name,
                          " must be a floating tensor, got ", t->scalar_type());
  CUTLASS_OPS_CHECK_VALUE(t->device() == input.device(), "conv2d_fused: ", name, " is on ",
                          t->device(), " but input is on ", input.device());
}

}  // namespace

void check_activation(bool relu, bool silu) {
  CUTLASS_OPS_CHECK_VALUE(!(relu && silu), "conv2d_fused: relu and silu are both set; pick one activation");
}

OutputShape check_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         std::optional<Tensor> const& residual, std::optional<Tensor> const& scale,
                         std::optional<Tensor> const& post_bias, IntArrayRef stride, IntArrayRef padding) {
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4, "conv2d_fused: input must be 4-D (N, C, H, W), got ",
                          input.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4, "conv2d_fused: weight must be 4-D (K, C, R, S), got ",
                          weight.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(input.scalar_type()),
                          "conv2d_fused: input must be a floating tensor, got ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.scalar_type() == input.scalar_type(), "conv2d_fused: weight dtype ",
                          weight.scalar_type(), " differs from input dtype ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.device() == input.device(), "conv2d_fused: weight is on ",
                          weight.device(), " but input is on ", input.device());
  CUTLASS_OPS_CHECK_VALUE(stride.size() == 2 && padding.size() == 2,
                          "conv2d_fused: stride and padding take two values (h, w)");
  CUTLASS_OPS_CHECK_VALUE(stride[0] >= 1 && stride[1] >= 1, "conv2d_fused: stride must be >= 1, got ",
                          stride);
  CUTLASS_OPS_CHECK_VALUE(padding[0] >= 0 && padding[1] >= 0,
                          "conv2d_fused: padding must be >= 0, got ", padding);

  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  int64_t K = weight.size(0), R = weight.size(2), S = weight.size(3);
  CUTLASS_OPS_CHECK_VALUE(weight.size(1) == C, "conv2d_fused: input has ", C,
                          " channels but weight expects ", weight.size(1), " (weight shape ",
                          weight.sizes(), "; grouped convs are not supported)");
  CUTLASS_OPS_CHECK_VALUE(C > 0 && K > 0 && R > 0 && S > 0, "conv2d_fused: empty channel or kernel dims");
  int64_t P = (H + 2 * padding[0] - R) / stride[0] + 1;
  int64_t Q = (W + 2 * padding[1] - S) / stride[1] + 1;
  CUTLASS_OPS_CHECK_VALUE(H + 2 * padding[0] >= R && W + 2 * padding[1] >= S,
                          "conv2d_fused: padded input ", H + 2 * padding[0], "x", W + 2 * padding[1],
                          " is smaller than the kernel ", R, "x", S);

  if (bias) {
    CUTLASS_OPS_CHECK_VALUE(bias->dim() == 0 || (bias->dim() == 1 && bias->size(0) == K),
                            "conv2d_fused: bias must be 0-d (scalar) or shape (", K, "), got ",
                            bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(bias->scalar_type()),
                            "conv2d_fused: bias must be a floating tensor, got ", bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(bias->device() == input.device(), "conv2d_fused: bias is on ",
                            bias->device(), " but input is on ", input.device());
  }
  if (residual) {
    CUTLASS_OPS_CHECK_VALUE(residual->sizes() == IntArrayRef({N, K, P, Q}),
                            "conv2d_fused: residual must have the output's shape (", N, ", ", K, ", ",
                            P, ", ", Q, "), got ", residual->sizes());
    CUTLASS_OPS_CHECK_VALUE(residual->scalar_type() == input.scalar_type(),
                            "conv2d_fused: residual dtype ", residual->scalar_type(),
                            " differs from input dtype ", input.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(residual->device() == input.device(), "conv2d_fused: residual is on ",
                            residual->device(), " but input is on ", input.device());
  }
  check_scalar(scale, "scale", input);
  check_scalar(post_bias, "post_bias", input);
  return {N, K, P, Q};
}

std::string& last_kernel_slot() {
  thread_local std::string name = "none";
  return name;
}

std::string last_kernel() { return last_kernel_slot(); }

ForcedChoice& forced_choice_slot() {
  thread_local ForcedChoice choice;
  return choice;
}

Tensor conv2d_fused_aten(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         std::optional<Tensor> const& residual, std::optional<Tensor> const& scale,
                         std::optional<Tensor> const& post_bias, IntArrayRef stride, IntArrayRef padding,
                         bool relu, bool silu) {
  last_kernel_slot() = "aten";
  check_activation(relu, silu);
  OutputShape out = check_inputs(input, weight, bias, residual, scale, post_bias, stride, padding);
  auto compute = input.scalar_type() == kDouble ? kDouble : kFloat;
  // One memory format whatever the caller's (the CUDA path converts NCHW too): ATen picks
  // its CPU conv algorithm by layout, and the result must not depend on it.
  auto cl = kChannelsLast;
  // aten::conv2d(input, weight, bias=None, stride, padding, dilation=[1, 1], groups=1)
  Tensor y = aten_call("aten::conv2d", "", torch::stable::contiguous(to_dtype(input, compute), cl),
                       torch::stable::contiguous(to_dtype(weight, compute), cl), std::nullopt, stride, padding,
                       std::vector<int64_t>{1, 1}, int64_t(1));
  if (scale) y = y * torch::stable::reshape(to_dtype(*scale, compute), {});
  if (bias) {
    Tensor b = to_dtype(*bias, compute);
    y = y + (bias->dim() == 0 ? b : torch::stable::view(b, {1, out.K, 1, 1}));
  }
  if (residual) y = y + to_dtype(*residual, compute);
  if (relu) y = cutlass_ops::relu(y);
  if (silu) y = aten_call("aten::silu", "", y);
  if (post_bias) y = y + torch::stable::reshape(to_dtype(*post_bias, compute), {});
  Tensor result = empty({out.N, out.K, out.P, out.Q}, input.scalar_type(), input.device(), kChannelsLast);
  torch::stable::copy_(result, y);
  return result;
}

OutputShape check_se_gate_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& scale,
                                 Tensor const& identity, Tensor const& w1, Tensor const& b1, Tensor const& w2,
                                 Tensor const& b2, std::optional<Tensor> const& identity_bias,
                                 std::optional<Tensor> const& post_bias, std::optional<Tensor> const& h_bias,
                                 IntArrayRef stride, IntArrayRef padding) {
  char const* op = "conv2d_fused_se_gate";
  OutputShape out = check_inputs(input, weight, std::nullopt, std::nullopt, scale, std::nullopt, stride, padding);
  CUTLASS_OPS_CHECK_VALUE(identity.sizes() == IntArrayRef({out.N, out.K, out.P, out.Q}), op,
                          ": identity must have the conv output's shape (", out.N, ", ", out.K, ", ", out.P, ", ",
                          out.Q, "), got ", identity.sizes());
  CUTLASS_OPS_CHECK_VALUE(identity.scalar_type() == input.scalar_type(), op, ": identity dtype ",
                          identity.scalar_type(), " differs from input dtype ", input.scalar_type());
  // The gate's own checks (excite shapes, devices, scalars), with identity standing for h.
  se_gate::check_inputs(identity, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias, op);
  return out;
}

std::string& se_gate_last_kernel_slot() {
  thread_local std::string name = "none";
  return name;
}

std::string se_gate_last_kernel() { return se_gate_last_kernel_slot(); }

std::tuple<Tensor, Tensor> conv2d_fused_se_gate_aten(
    Tensor const& input, Tensor const& weight, std::optional<Tensor> const& scale, Tensor const& identity,
    Tensor const& w1, Tensor const& b1, Tensor const& w2, Tensor const& b2,
    std::optional<Tensor> const& identity_bias, std::optional<Tensor> const& post_bias, bool avgpool,
    std::optional<Tensor> const& h_bias, IntArrayRef stride, IntArrayRef padding) {
  se_gate_last_kernel_slot() = "aten";
  OutputShape out = check_se_gate_inputs(input, weight, scale, identity, w1, b1, w2, b2, identity_bias, post_bias,
                                         h_bias, stride, padding);
  auto compute = input.scalar_type() == kDouble ? kDouble : kFloat;
  // h in the compute dtype, unrounded.
  Tensor h = conv2d_fused_aten(to_dtype(input, compute), to_dtype(weight, compute), std::nullopt, std::nullopt,
                               scale, h_bias, stride, padding, false, false);
  auto [y, unused] = se_gate::se_gate_aten(h, to_dtype(identity, compute), w1, b1, w2, b2, identity_bias, post_bias,
                                           false, std::nullopt);
  Tensor result = empty({out.N, out.K, out.P, out.Q}, input.scalar_type(), input.device(), kChannelsLast);
  torch::stable::copy_(result, y);
  Tensor pooled = empty({0}, input.scalar_type(), input.device());
  if (avgpool) {  // of the rounded output, as se_gate pools
    pooled = empty(se_gate::pooled_shape(result), input.scalar_type(), input.device(), kChannelsLast);
    torch::stable::copy_(pooled, aten_call("aten::avg_pool2d", "", to_dtype(result, compute),
                                           std::vector<int64_t>{3, 3}, std::vector<int64_t>{2, 2},
                                           std::vector<int64_t>{1, 1}, false, true, std::optional<int64_t>()));
  }
  return {result, pooled};
}

void force_kernel(std::string name, int64_t split_k) {
  CUTLASS_OPS_CHECK_VALUE(split_k >= 0 && split_k <= 64, "conv2d_fused_force_kernel: split_k must be 0..64, got ",
                          split_k);
  forced_choice_slot() = {std::move(name), static_cast<int>(split_k)};
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "conv2d_fused(Tensor input, Tensor weight, Tensor? bias=None, Tensor? residual=None, "
      "Tensor? scale=None, Tensor? post_bias=None, int[2] stride=[1, 1], int[2] padding=[0, 0], "
      "bool relu=False, bool silu=False) -> Tensor");
  // The kernel the last conv2d_fused call on this thread ran: a generated kernel's name,
  // or "aten" for the ATen path (CPU, and the CUDA fallback).  For tests and for users
  // checking that their shapes hit a fast path.
  m.def("conv2d_fused_last_kernel() -> str");
  // For the profiler: make this thread's CUDA conv2d_fused calls run the named kernel
  // with `split_k` serial split-K slices (0: the dispatcher's choice); an error when it
  // cannot run the problem.  "" restores the normal choice.
  m.def("conv2d_fused_force_kernel(str name, int split_k=0) -> ()");
  // se_gate with the conv as its input: h = scale * conv2d(input, weight) + h_bias, then
  // se_gate(h, identity, ...) (conv2d_fused_op.h).  Returns (out, pooled); pooled is empty
  // unless avgpool.
  m.def(
      "conv2d_fused_se_gate(Tensor input, Tensor weight, Tensor? scale, Tensor identity, Tensor fc1_weight, "
      "Tensor fc1_bias, Tensor fc2_weight, Tensor fc2_bias, Tensor? identity_bias=None, Tensor? post_bias=None, "
      "bool avgpool=False, Tensor? h_bias=None, int[2] stride=[1, 1], int[2] padding=[1, 1]) -> (Tensor, Tensor)");
  // What the last conv2d_fused_se_gate call on this thread ran (conv2d_fused_op.h).
  m.def("conv2d_fused_se_gate_last_kernel() -> str");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_fused_last_kernel", TORCH_BOX(&cutlass_ops::conv2d_fused::last_kernel));
  m.impl("conv2d_fused_force_kernel", TORCH_BOX(&cutlass_ops::conv2d_fused::force_kernel));
  m.impl("conv2d_fused_se_gate_last_kernel", TORCH_BOX(&cutlass_ops::conv2d_fused::se_gate_last_kernel));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv2d_fused", TORCH_BOX(&cutlass_ops::conv2d_fused::conv2d_fused_aten));
  m.impl("conv2d_fused_se_gate", TORCH_BOX(&cutlass_ops::conv2d_fused::conv2d_fused_se_gate_aten));
}
