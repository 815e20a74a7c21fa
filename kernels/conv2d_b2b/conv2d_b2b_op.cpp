// cutlass_ops::conv2d_b2b: schema, input checks and the CPU (ATen) implementation of the
// back-to-back conv y = act1(conv1x1(act0(conv(x, w0) + bias0), w1) + bias1).  The CUDA
// implementation is in conv2d_b2b_cuda.cpp; the fake (meta) one in cutlass_ops/ops/conv2d_b2b.py.
#include "conv2d_b2b/conv2d_b2b_op.h"

namespace cutlass_ops {
namespace conv2d_b2b {

namespace {

void check_bias(std::optional<Tensor> const& bias, char const* name, int64_t channels, Tensor const& input) {
  if (!bias) return;
  CUTLASS_OPS_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == channels, "conv2d_b2b: ", name,
                          " must have shape (", channels, "), got ", bias->sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(bias->scalar_type()), "conv2d_b2b: ", name,
                          " must be a floating tensor, got ", bias->scalar_type());
  CUTLASS_OPS_CHECK_VALUE(bias->device() == input.device(), "conv2d_b2b: ", name, " is on ", bias->device(),
                          " but input is on ", input.device());
}

}  // namespace

Shape check_inputs(Tensor const& input, Tensor const& w0, std::optional<Tensor> const& bias0, Tensor const& w1,
                   std::optional<Tensor> const& bias1, IntArrayRef stride, IntArrayRef padding) {
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4, "conv2d_b2b: input must be 4-D (N, C, H, W), got ", input.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(w0.dim() == 4, "conv2d_b2b: w0 must be 4-D (K0, C, R, S), got ", w0.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(w1.dim() == 4, "conv2d_b2b: w1 must be 4-D (K1, K0, 1, 1), got ", w1.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(input.scalar_type()), "conv2d_b2b: input must be a floating tensor, got ",
                          input.scalar_type());
  auto check_weight = [&](Tensor const& w, char const* name) {
    CUTLASS_OPS_CHECK_VALUE(w.scalar_type() == input.scalar_type(), "conv2d_b2b: ", name, " dtype ",
                            w.scalar_type(), " differs from input dtype ", input.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(w.device() == input.device(), "conv2d_b2b: ", name, " is on ", w.device(),
                            " but input is on ", input.device());
  };
  check_weight(w0, "w0");
  check_weight(w1, "w1");
  CUTLASS_OPS_CHECK_VALUE(stride.size() == 2 && padding.size() == 2,
                          "conv2d_b2b: stride and padding take two values (h, w)");
  CUTLASS_OPS_CHECK_VALUE(stride[0] >= 1 && stride[1] >= 1, "conv2d_b2b: stride must be >= 1, got ", stride);
  CUTLASS_OPS_CHECK_VALUE(padding[0] >= 0 && padding[1] >= 0, "conv2d_b2b: padding must be >= 0, got ", padding);
  Shape s{input.size(0), input.size(1), input.size(2), input.size(3), w0.size(0), w0.size(2), w0.size(3), 0, 0,
          w1.size(0)};
  CUTLASS_OPS_CHECK_VALUE(w0.size(1) == s.C, "conv2d_b2b: input has ", s.C, " channels but w0 expects ", w0.size(1),
                          " (w0 shape ", w0.sizes(), "; grouped convs are not supported)");
  CUTLASS_OPS_CHECK_VALUE(w1.size(1) == s.K0 && w1.size(2) == 1 && w1.size(3) == 1, "conv2d_b2b: w1 must be (K1, ",
                          s.K0, ", 1, 1) (a 1x1 conv over w0's ", s.K0, " outputs), got ", w1.sizes());
  CUTLASS_OPS_CHECK_VALUE(s.C > 0 && s.K0 > 0 && s.K1 > 0 && s.R > 0 && s.S > 0,
                          "conv2d_b2b: empty channel or kernel dims");
  CUTLASS_OPS_CHECK_VALUE(s.H + 2 * padding[0] >= s.R && s.W + 2 * padding[1] >= s.S, "conv2d_b2b: padded input ",
                          s.H + 2 * padding[0], "x", s.W + 2 * padding[1], " is smaller than the kernel ", s.R, "x",
                          s.S);
  s.P = (s.H + 2 * padding[0] - s.R) / stride[0] + 1;
  s.Q = (s.W + 2 * padding[1] - s.S) / stride[1] + 1;
  check_bias(bias0, "bias0", s.K0, input);
  check_bias(bias1, "bias1", s.K1, input);
  return s;
}

std::string& last_kernel_slot() {
  thread_local std::string name = "none";
  return name;
}

std::string last_kernel() { return last_kernel_slot(); }

Tensor conv2d_b2b_aten(Tensor const& input, Tensor const& w0, std::optional<Tensor> const& bias0, Tensor const& w1,
                       std::optional<Tensor> const& bias1, IntArrayRef stride, IntArrayRef padding, bool relu0,
                       bool relu1) {
  last_kernel_slot() = "aten";
  Shape s = check_inputs(input, w0, bias0, w1, bias1, stride, padding);
  auto compute = input.scalar_type() == kDouble ? kDouble : kFloat;
  auto cl = kChannelsLast;
  auto conv = [&](Tensor const& x, Tensor const& w, std::optional<Tensor> const& b, IntArrayRef st,
                  IntArrayRef pad) {
    // aten::conv2d(input, weight, bias, stride, padding, dilation=[1, 1], groups=1)
    std::optional<Tensor> bc = b ? std::optional<Tensor>(to_dtype(*b, compute)) : std::nullopt;
    return aten_call("aten::conv2d", "", torch::stable::contiguous(to_dtype(x, compute), cl),
                     torch::stable::contiguous(to_dtype(w, compute), cl), bc, st, pad, std::vector<int64_t>{1, 1},
                     int64_t(1));
  };
  Tensor y0 = conv(input, w0, bias0, stride, padding);
  if (relu0) y0 = cutlass_ops::relu(y0);
  y0 = to_dtype(y0, input.scalar_type());  // the fused kernel feeds the second conv 16-bit values
  Tensor y1 = conv(y0, w1, bias1, std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0});
  if (relu1) y1 = cutlass_ops::relu(y1);
  Tensor result = empty({s.N, s.K1, s.P, s.Q}, input.scalar_type(), input.device(), kChannelsLast);
  torch::stable::copy_(result, y1);
  return result;
}

}  // namespace conv2d_b2b
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "conv2d_b2b(Tensor input, Tensor w0, Tensor? bias0, Tensor w1, Tensor? bias1, int[2] stride=[1, 1], "
      "int[2] padding=[0, 0], bool relu0=True, bool relu1=True) -> Tensor");
  // The kernel the last conv2d_b2b call on this thread ran: a generated B2B kernel's name, or
  // "aten" for the composite (CPU, and the CUDA fallback).
  m.def("conv2d_b2b_last_kernel() -> str");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_b2b_last_kernel", TORCH_BOX(&cutlass_ops::conv2d_b2b::last_kernel));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv2d_b2b", TORCH_BOX(&cutlass_ops::conv2d_b2b::conv2d_b2b_aten));
}
