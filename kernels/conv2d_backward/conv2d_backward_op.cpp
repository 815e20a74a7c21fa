// cutlass_ops::conv2d_dgrad and cutlass_ops::conv2d_wgrad: the gradients of a conv2d
// (cutlass_ops/ops/ (the autograd formulas) uses them for conv2d_fused).  Schema, checks and the CPU (ATen)
// implementation; CUDA in conv2d_backward_cuda.cpp, fake in cutlass_ops/ops/conv2d_backward.py.
#include "conv2d_backward/conv2d_backward_op.h"

#include <algorithm>
#include <cstdlib>

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

void check_conv_args(char const* op, IntArrayRef stride, IntArrayRef padding) {
  CUTLASS_OPS_CHECK_VALUE(stride.size() == 2 && padding.size() == 2, op, ": stride and padding take two values (h, w)");
  CUTLASS_OPS_CHECK_VALUE(stride[0] >= 1 && stride[1] >= 1, op, ": stride must be >= 1, got ", stride);
  CUTLASS_OPS_CHECK_VALUE(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be >= 0, got ", padding);
}

// The conv's shape from x's and w's sizes; dy must match its output.
ConvShape conv_shape(char const* op, Tensor const& grad_output, IntArrayRef x, IntArrayRef w,
                     IntArrayRef stride, IntArrayRef padding) {
  CUTLASS_OPS_CHECK_VALUE(grad_output.dim() == 4, op, ": grad_output must be 4-D (N, K, P, Q), got ", grad_output.dim(),
                          "-D");
  CUTLASS_OPS_CHECK_VALUE(x.size() == 4, op, ": input_size must be the input's 4 sizes (N, C, H, W), got ", x);
  CUTLASS_OPS_CHECK_VALUE(w.size() == 4, op, ": weight must be 4-D (K, C, R, S), got ", w);
  CUTLASS_OPS_CHECK_VALUE(is_floating(grad_output.scalar_type()), op, ": grad_output must be floating, got ",
                          grad_output.scalar_type());
  check_conv_args(op, stride, padding);
  ConvShape s{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0};
  CUTLASS_OPS_CHECK_VALUE(w[1] == s.C, op, ": input has ", s.C, " channels but weight expects ", w[1],
                          " (grouped convs are not supported)");
  CUTLASS_OPS_CHECK_VALUE(s.C > 0 && s.K > 0 && s.R > 0 && s.S > 0, op, ": empty channel or kernel dims");
  CUTLASS_OPS_CHECK_VALUE(s.H + 2 * padding[0] >= s.R && s.W + 2 * padding[1] >= s.S, op, ": padded input is smaller "
                          "than the kernel");
  s.P = (s.H + 2 * padding[0] - s.R) / stride[0] + 1;
  s.Q = (s.W + 2 * padding[1] - s.S) / stride[1] + 1;
  CUTLASS_OPS_CHECK_VALUE(grad_output.sizes() == IntArrayRef({s.N, s.K, s.P, s.Q}), op, ": grad_output shape ",
                          grad_output.sizes(), " is not the conv's output shape [", s.N, ", ", s.K, ", ", s.P, ", ",
                          s.Q, "] for input ", x, ", weight ", w, ", stride ", stride, ", padding ", padding);
  return s;
}

void check_operand(char const* op, char const* name, Tensor const& t, Tensor const& grad_output) {
  CUTLASS_OPS_CHECK_VALUE(t.scalar_type() == grad_output.scalar_type(), op, ": ", name, " dtype ", t.scalar_type(),
                          " differs from grad_output dtype ", grad_output.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(t.device() == grad_output.device(), op, ": ", name, " is on ", t.device(),
                          " but grad_output is on ", grad_output.device());
}

void check_scale(char const* op, std::optional<Tensor> const& scale, Tensor const& grad_output) {
  if (!scale) return;
  CUTLASS_OPS_CHECK_VALUE(scale->numel() == 1 && scale->dim() <= 1, op,
                          ": scale must be a scalar tensor (0-d or one element), got shape ", scale->sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(scale->scalar_type()), op, ": scale must be floating, got ",
                          scale->scalar_type());
  CUTLASS_OPS_CHECK_VALUE(scale->device() == grad_output.device(), op, ": scale is on ", scale->device(),
                          " but grad_output is on ", grad_output.device());
}

ScalarType accumulate_type(ScalarType t) { return t == kDouble ? kDouble : kFloat; }

ScalarType compute_type(Tensor const& t) {
  auto dtype = t.scalar_type();
  bool half = dtype == kHalf || dtype == kBFloat16;
  return t.is_cuda() && half ? dtype : accumulate_type(dtype);
}

// Above this many elements in the input or grad_output, conv2d_wgrad's ATen path sums the
// weight gradient over chunks of samples and output rows (CUTLASS_OPS_WGRAD_CHUNK_ELEMENTS
// overrides it, for tests): each ATen call stays far from 2^31 elements, and the sums are
// float32 (cuDNN's 16-bit path would round G to 16 bits once per call).
int64_t wgrad_chunk_elements() {
  char const* env = std::getenv("CUTLASS_OPS_WGRAD_CHUNK_ELEMENTS");
  int64_t v = env ? std::atoll(env) : 0;
  return v > 0 ? v : (int64_t(1) << 30);
}

// G = dL/dw of conv2d(x, w, stride, padding) for dy, in the accumulate type `acc`: in one ATen
// call (in `compute`) when both operands fit in a chunk, else as a sum over chunks, each in
// `acc`: groups of whole samples, or one sample's output rows [p0, p1) against the input rows
// they read, [p0*sh - ph, (p1-1)*sh - ph + R), zero-padded where those leave the image.
Tensor weight_grad(Tensor const& dy, Tensor const& x, Tensor const& w, ConvShape const& s, IntArrayRef stride,
                   IntArrayRef padding, ScalarType compute, ScalarType acc) {
  // channels_last on CUDA (cuDNN's fast layout); NCHW on the CPU, where ATen's channels_last
  // weight gradient of a strided 1x1 conv comes out wrong, varying from call to call (torch 2.11;
  // test_conv2d_backward.py::test_cpu_wgrad_strided_1x1).
  auto cl = x.is_cuda() ? kChannelsLast : kContiguous;
  auto wgrad = [&](Tensor const& dy_part, Tensor const& x_part, ScalarType t, IntArrayRef pad) {
    // convolution_backward reads only the weight's shape.
    // aten::convolution_backward(grad_output, input, weight, bias_sizes=None, stride, padding,
    //   dilation=[1, 1], transposed=False, output_padding=[0, 0], groups=1, output_mask)
    auto grads = aten_call_multi<Tensor, Tensor, Tensor>(
        "aten::convolution_backward", "", torch::stable::contiguous(to_dtype(dy_part, t), cl),
        torch::stable::contiguous(to_dtype(x_part, t), cl), to_dtype(w, t), std::nullopt, stride, pad,
        std::vector<int64_t>{1, 1}, false, std::vector<int64_t>{0, 0}, int64_t(1), BoolList{{false, true, false}});
    return to_dtype(std::get<1>(grads), acc);
  };
  int64_t const budget = wgrad_chunk_elements();
  if (x.numel() <= budget && dy.numel() <= budget) return wgrad(dy, x, compute, padding);

  Tensor g = zeros(w.sizes(), acc, w.device());
  int64_t const sample = std::max(s.C * s.H * s.W, s.K * s.P * s.Q);
  if (sample <= budget) {  // whole samples
    int64_t const per = std::max<int64_t>(1, budget / sample);
    for (int64_t n0 = 0; n0 < s.N; n0 += per) {
      int64_t const nb = std::min(per, s.N - n0);
      g = g + wgrad(narrowed(dy, 0, n0, nb), narrowed(x, 0, n0, nb), acc, padding);
    }
    return g;
  }
  // Output rows per chunk: dy's rows and the input rows they read both within the budget.
  int64_t const sh = stride[0], ph = padding[0];
  int64_t const by_dy = budget / (s.K * s.Q);
  int64_t const by_x = (budget / (s.C * s.W) - s.R) / sh + 1;
  int64_t const rows = std::max<int64_t>(1, std::min({s.P, by_dy, by_x}));
  for (int64_t n = 0; n < s.N; ++n) {
    for (int64_t p0 = 0; p0 < s.P; p0 += rows) {
      int64_t const p1 = std::min(s.P, p0 + rows);
      int64_t const h0 = p0 * sh - ph, h1 = (p1 - 1) * sh - ph + s.R;  // input rows read, padding included
      int64_t const lo = std::max<int64_t>(0, h0), hi = std::min(s.H, h1);
      Tensor x_part = narrowed(x, 0, n, 1);
      x_part = hi > lo ? narrowed(x_part, 2, lo, hi - lo) : narrowed(x_part, 2, 0, 0);
      // (W left, W right, H top, H bottom): the rows' own zero padding; W keeps the conv's.
      // (aten::pad in "constant" mode is aten::constant_pad_nd, whose Scalar value the stable
      // dispatcher call cannot pass.)
      x_part = torch::stable::pad(to_dtype(x_part, acc), {0, 0, lo - h0, h1 - std::max(hi, lo)}, "constant", 0.0);
      g = g + wgrad(narrowed(narrowed(dy, 0, n, 1), 2, p0, p1 - p0), x_part, acc, {0, padding[1]});
    }
  }
  return g;
}

}  // namespace

std::string& last_kernel_slot() {
  thread_local std::string name = "none";
  return name;
}

ForcedChoice& forced_choice_slot() {
  thread_local ForcedChoice choice;
  return choice;
}

std::string last_kernel() { return last_kernel_slot(); }

void force_kernel(std::string name, int64_t split_k) {
  CUTLASS_OPS_CHECK_VALUE(split_k >= 0 && split_k <= 256, "conv2d_backward_force_kernel: split_k must be 0..256, got ",
                          split_k);
  forced_choice_slot() = {std::move(name), static_cast<int>(split_k)};
}

ConvShape check_dgrad(Tensor const& grad_output, Tensor const& weight, IntArrayRef input_size, IntArrayRef stride,
                      IntArrayRef padding, std::optional<Tensor> const& scale) {
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4, "conv2d_dgrad: weight must be 4-D (K, C, R, S), got ", weight.dim(),
                          "-D");
  check_operand("conv2d_dgrad", "weight", weight, grad_output);
  check_scale("conv2d_dgrad", scale, grad_output);
  return conv_shape("conv2d_dgrad", grad_output, input_size, weight.sizes(), stride, padding);
}

ConvShape check_wgrad(Tensor const& grad_output, Tensor const& input, Tensor const& weight, IntArrayRef stride,
                      IntArrayRef padding, std::optional<Tensor> const& scale) {
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4, "conv2d_wgrad: input must be 4-D (N, C, H, W), got ", input.dim(),
                          "-D");
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4, "conv2d_wgrad: weight must be 4-D (K, C, R, S), got ", weight.dim(),
                          "-D");
  check_operand("conv2d_wgrad", "input", input, grad_output);
  check_operand("conv2d_wgrad", "weight", weight, grad_output);
  check_scale("conv2d_wgrad", scale, grad_output);
  return conv_shape("conv2d_wgrad", grad_output, input.sizes(), weight.sizes(), stride, padding);
}

Tensor conv2d_dgrad_aten(Tensor const& grad_output, Tensor const& weight, IntArrayRef input_size, IntArrayRef stride,
                         IntArrayRef padding, std::optional<Tensor> const& scale) {
  last_kernel_slot() = "aten";
  ConvShape s = check_dgrad(grad_output, weight, input_size, stride, padding, scale);
  auto compute = compute_type(grad_output);
  auto acc = accumulate_type(grad_output.scalar_type());
  // The scale goes into the (small) weight, in the accumulate type, before any rounding.
  Tensor w = scale ? to_dtype(weight, acc) * torch::stable::reshape(to_dtype(*scale, acc), {}) : weight;
  // conv_transpose2d is dgrad; output_padding restores rows a stride > 1 left over.
  int64_t out_pad_h = s.H - ((s.P - 1) * stride[0] - 2 * padding[0] + s.R);
  int64_t out_pad_w = s.W - ((s.Q - 1) * stride[1] - 2 * padding[1] + s.S);
  auto cl = kChannelsLast;
  // aten::conv_transpose2d.input(input, weight, bias=None, stride, padding, output_padding,
  //   groups=1, dilation=[1, 1])
  Tensor dx = aten_call("aten::conv_transpose2d", "input",
                        torch::stable::contiguous(to_dtype(grad_output, compute), cl),
                        torch::stable::contiguous(to_dtype(w, compute), cl), std::nullopt, stride, padding,
                        std::vector<int64_t>{out_pad_h, out_pad_w}, int64_t(1), std::vector<int64_t>{1, 1});
  // No copy when cuDNN already wrote channels_last in the output dtype (the usual case).
  return torch::stable::contiguous(to_dtype(dx, grad_output.scalar_type()), cl);
}

std::tuple<Tensor, Tensor> conv2d_wgrad_aten(Tensor const& grad_output, Tensor const& input, Tensor const& weight,
                                             IntArrayRef stride, IntArrayRef padding,
                                             std::optional<Tensor> const& scale) {
  last_kernel_slot() = "aten";
  ConvShape s = check_wgrad(grad_output, input, weight, stride, padding, scale);
  auto compute = compute_type(grad_output);
  auto acc = accumulate_type(grad_output.scalar_type());
  auto cl = kChannelsLast;
  Tensor g = torch::stable::contiguous(weight_grad(grad_output, input, weight, s, stride, padding, compute, acc), cl);
  // (g * w).sum(): g and w.to(acc) are both in acc, so summing in acc is the plain sum.
  Tensor grad_scale = sum_all(g * to_dtype(weight, acc), acc);
  Tensor grad_weight = scale ? g * torch::stable::reshape(to_dtype(*scale, acc), {}) : g;
  return {torch::stable::contiguous(to_dtype(grad_weight, weight.scalar_type()), cl), grad_scale};
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // dx = scale * (the gradient of conv2d(x, weight, stride, padding) w.r.t. x), in
  // grad_output's dtype; x's size given.
  m.def("conv2d_dgrad(Tensor grad_output, Tensor weight, int[4] input_size, int[2] stride=[1, 1], "
        "int[2] padding=[0, 0], Tensor? scale=None) -> Tensor");
  // For y = scale * conv2d(input, weight, stride, padding) with G = dL/dw of the conv:
  // (scale * G, <weight, G>) = (dL/dweight, dL/dscale); dL/dweight in weight's dtype (rounded
  // once), dL/dscale in float32 (float64 for float64).  G is summed in float32: our kernels
  // never round it to 16 bits, cuDNN's path does.  No scale: (G, <w, G>).
  m.def("conv2d_wgrad(Tensor grad_output, Tensor input, Tensor weight, int[2] stride=[1, 1], "
        "int[2] padding=[0, 0], Tensor? scale=None) -> (Tensor, Tensor)");
  // The kernel the last conv2d_dgrad/conv2d_wgrad call on this thread ran ("aten": the
  // ATen path).  For tests and for users checking their shapes hit the CUTLASS kernels.
  m.def("conv2d_backward_last_kernel() -> str");
  // For the profiler: make this thread's CUDA conv2d_dgrad/conv2d_wgrad calls run the named
  // kernel (wgrad with `split_k` slices; 0: the dispatcher's choice), or "cudnn" (the ATen
  // path); an error when the kernel cannot run the problem.  "" restores the normal choice.
  m.def("conv2d_backward_force_kernel(str name, int split_k=0) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_backward_last_kernel", TORCH_BOX(&cutlass_ops::conv2d_backward::last_kernel));
  m.impl("conv2d_backward_force_kernel", TORCH_BOX(&cutlass_ops::conv2d_backward::force_kernel));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv2d_dgrad", TORCH_BOX(&cutlass_ops::conv2d_backward::conv2d_dgrad_aten));
  m.impl("conv2d_wgrad", TORCH_BOX(&cutlass_ops::conv2d_backward::conv2d_wgrad_aten));
}
