// cutlass_ops::conv2d_dgrad and cutlass_ops::conv2d_wgrad: the gradients of a conv2d
// (cutlass_ops/autograd.py uses them for conv2d_fused).  Schema, checks and the CPU (ATen)
// implementation; CUDA in conv2d_backward_cuda.cpp, fake in cutlass_ops/ops.py.
#include "conv2d_backward/conv2d_backward_op.h"

#include <torch/library.h>

#include <algorithm>
#include <cstdlib>

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

void check_conv_args(char const* op, at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK_VALUE(stride.size() == 2 && padding.size() == 2, op, ": stride and padding take two values (h, w)");
  TORCH_CHECK_VALUE(stride[0] >= 1 && stride[1] >= 1, op, ": stride must be >= 1, got ", stride);
  TORCH_CHECK_VALUE(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be >= 0, got ", padding);
}

// The conv's shape from x's and w's sizes; dy must match its output.
ConvShape conv_shape(char const* op, at::Tensor const& grad_output, at::IntArrayRef x, at::IntArrayRef w,
                     at::IntArrayRef stride, at::IntArrayRef padding) {
  TORCH_CHECK_VALUE(grad_output.dim() == 4, op, ": grad_output must be 4-D (N, K, P, Q), got ", grad_output.dim(),
                    "-D");
  TORCH_CHECK_VALUE(x.size() == 4, op, ": input_size must be the input's 4 sizes (N, C, H, W), got ", x);
  TORCH_CHECK_VALUE(w.size() == 4, op, ": weight must be 4-D (K, C, R, S), got ", w);
  TORCH_CHECK_VALUE(at::isFloatingType(grad_output.scalar_type()), op, ": grad_output must be floating, got ",
                    grad_output.scalar_type());
  check_conv_args(op, stride, padding);
  ConvShape s{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0};
  TORCH_CHECK_VALUE(w[1] == s.C, op, ": input has ", s.C, " channels but weight expects ", w[1],
                    " (grouped convs are not supported)");
  TORCH_CHECK_VALUE(s.C > 0 && s.K > 0 && s.R > 0 && s.S > 0, op, ": empty channel or kernel dims");
  TORCH_CHECK_VALUE(s.H + 2 * padding[0] >= s.R && s.W + 2 * padding[1] >= s.S, op, ": padded input is smaller "
                    "than the kernel");
  s.P = (s.H + 2 * padding[0] - s.R) / stride[0] + 1;
  s.Q = (s.W + 2 * padding[1] - s.S) / stride[1] + 1;
  TORCH_CHECK_VALUE(grad_output.sizes() == at::IntArrayRef({s.N, s.K, s.P, s.Q}), op, ": grad_output shape ",
                    grad_output.sizes(), " is not the conv's output shape [", s.N, ", ", s.K, ", ", s.P, ", ", s.Q,
                    "] for input ", x, ", weight ", w, ", stride ", stride, ", padding ", padding);
  return s;
}

void check_operand(char const* op, char const* name, at::Tensor const& t, at::Tensor const& grad_output) {
  TORCH_CHECK_VALUE(t.scalar_type() == grad_output.scalar_type(), op, ": ", name, " dtype ", t.scalar_type(),
                    " differs from grad_output dtype ", grad_output.scalar_type());
  TORCH_CHECK_VALUE(t.device() == grad_output.device(), op, ": ", name, " is on ", t.device(),
                    " but grad_output is on ", grad_output.device());
}

void check_scale(char const* op, c10::optional<at::Tensor> const& scale, at::Tensor const& grad_output) {
  if (!scale) return;
  TORCH_CHECK_VALUE(scale->numel() == 1 && scale->dim() <= 1, op,
                    ": scale must be a scalar tensor (0-d or one element), got shape ", scale->sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(scale->scalar_type()), op, ": scale must be floating, got ",
                    scale->scalar_type());
  TORCH_CHECK_VALUE(scale->device() == grad_output.device(), op, ": scale is on ", scale->device(),
                    " but grad_output is on ", grad_output.device());
}

at::ScalarType accumulate_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

at::ScalarType compute_type(at::Tensor const& t) {
  auto dtype = t.scalar_type();
  bool half = dtype == at::kHalf || dtype == at::kBFloat16;
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
at::Tensor weight_grad(at::Tensor const& dy, at::Tensor const& x, at::Tensor const& w, ConvShape const& s,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::ScalarType compute, at::ScalarType acc) {
  auto cl = at::MemoryFormat::ChannelsLast;
  auto wgrad = [&](at::Tensor const& dy_part, at::Tensor const& x_part, at::ScalarType t, at::IntArrayRef pad) {
    // convolution_backward reads only the weight's shape.
    auto grads = at::convolution_backward(dy_part.to(t).contiguous(cl), x_part.to(t).contiguous(cl), w.to(t),
                                          c10::nullopt, stride, pad, {1, 1}, false, {0, 0}, 1, {false, true, false});
    return std::get<1>(grads).to(acc);
  };
  int64_t const budget = wgrad_chunk_elements();
  if (x.numel() <= budget && dy.numel() <= budget) return wgrad(dy, x, compute, padding);

  auto g = at::zeros(w.sizes(), w.options().dtype(acc));
  int64_t const sample = std::max(s.C * s.H * s.W, s.K * s.P * s.Q);
  if (sample <= budget) {  // whole samples
    int64_t const per = std::max<int64_t>(1, budget / sample);
    for (int64_t n0 = 0; n0 < s.N; n0 += per) {
      int64_t const nb = std::min(per, s.N - n0);
      g += wgrad(dy.narrow(0, n0, nb), x.narrow(0, n0, nb), acc, padding);
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
      at::Tensor x_part = x.narrow(0, n, 1);
      x_part = hi > lo ? x_part.narrow(2, lo, hi - lo) : x_part.narrow(2, 0, 0);
      // (W left, W right, H top, H bottom): the rows' own zero padding; W keeps the conv's.
      x_part = at::constant_pad_nd(x_part.to(acc), {0, 0, lo - h0, h1 - std::max(hi, lo)});
      g += wgrad(dy.narrow(0, n, 1).narrow(2, p0, p1 - p0), x_part, acc, {0, padding[1]});
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

ConvShape check_dgrad(at::Tensor const& grad_output, at::Tensor const& weight, at::IntArrayRef input_size,
                      at::IntArrayRef stride, at::IntArrayRef padding, c10::optional<at::Tensor> const& scale) {
  TORCH_CHECK_VALUE(weight.dim() == 4, "conv2d_dgrad: weight must be 4-D (K, C, R, S), got ", weight.dim(), "-D");
  check_operand("conv2d_dgrad", "weight", weight, grad_output);
  check_scale("conv2d_dgrad", scale, grad_output);
  return conv_shape("conv2d_dgrad", grad_output, input_size, weight.sizes(), stride, padding);
}

ConvShape check_wgrad(at::Tensor const& grad_output, at::Tensor const& input, at::Tensor const& weight,
                      at::IntArrayRef stride, at::IntArrayRef padding, c10::optional<at::Tensor> const& scale) {
  TORCH_CHECK_VALUE(input.dim() == 4, "conv2d_wgrad: input must be 4-D (N, C, H, W), got ", input.dim(), "-D");
  TORCH_CHECK_VALUE(weight.dim() == 4, "conv2d_wgrad: weight must be 4-D (K, C, R, S), got ", weight.dim(), "-D");
  check_operand("conv2d_wgrad", "input", input, grad_output);
  check_operand("conv2d_wgrad", "weight", weight, grad_output);
  check_scale("conv2d_wgrad", scale, grad_output);
  return conv_shape("conv2d_wgrad", grad_output, input.sizes(), weight.sizes(), stride, padding);
}

at::Tensor conv2d_dgrad_aten(at::Tensor const& grad_output, at::Tensor const& weight, at::IntArrayRef input_size,
                             at::IntArrayRef stride, at::IntArrayRef padding,
                             c10::optional<at::Tensor> const& scale) {
  last_kernel_slot() = "aten";
  ConvShape s = check_dgrad(grad_output, weight, input_size, stride, padding, scale);
  auto compute = compute_type(grad_output);
  auto acc = accumulate_type(grad_output.scalar_type());
  // The scale goes into the (small) weight, in the accumulate type, before any rounding.
  auto w = scale ? weight.to(acc) * scale->to(acc).reshape({}) : weight;
  // conv_transpose2d is dgrad; output_padding restores rows a stride > 1 left over.
  int64_t out_pad_h = s.H - ((s.P - 1) * stride[0] - 2 * padding[0] + s.R);
  int64_t out_pad_w = s.W - ((s.Q - 1) * stride[1] - 2 * padding[1] + s.S);
  auto cl = at::MemoryFormat::ChannelsLast;
  auto dx = at::conv_transpose2d(grad_output.to(compute).contiguous(cl), w.to(compute).contiguous(cl), {}, stride,
                                 padding, {out_pad_h, out_pad_w});
  // No copy when cuDNN already wrote channels_last in the output dtype (the usual case).
  return dx.to(grad_output.scalar_type()).contiguous(cl);
}

std::tuple<at::Tensor, at::Tensor> conv2d_wgrad_aten(at::Tensor const& grad_output, at::Tensor const& input,
                                                     at::Tensor const& weight, at::IntArrayRef stride,
                                                     at::IntArrayRef padding, c10::optional<at::Tensor> const& scale) {
  last_kernel_slot() = "aten";
  ConvShape s = check_wgrad(grad_output, input, weight, stride, padding, scale);
  auto compute = compute_type(grad_output);
  auto acc = accumulate_type(grad_output.scalar_type());
  auto cl = at::MemoryFormat::ChannelsLast;
  auto g = weight_grad(grad_output, input, weight, s, stride, padding, compute, acc).contiguous(cl);
  auto grad_scale = (g * weight.to(acc)).sum();
  auto grad_weight = scale ? g * scale->to(acc).reshape({}) : g;
  return {grad_weight.to(weight.scalar_type()).contiguous(cl), grad_scale};
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
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
  m.def("conv2d_backward_last_kernel() -> str", []() { return cutlass_ops::conv2d_backward::last_kernel_slot(); });
  // For the profiler: make this thread's CUDA conv2d_dgrad/conv2d_wgrad calls run the named
  // kernel (wgrad with `split_k` slices; 0: the dispatcher's choice), or "cudnn" (the ATen
  // path); an error when the kernel cannot run the problem.  "" restores the normal choice.
  m.def("conv2d_backward_force_kernel(str name, int split_k=0) -> ()", [](std::string name, int64_t split_k) {
    TORCH_CHECK_VALUE(split_k >= 0 && split_k <= 256, "conv2d_backward_force_kernel: split_k must be 0..256, got ",
                      split_k);
    cutlass_ops::conv2d_backward::forced_choice_slot() = {std::move(name), static_cast<int>(split_k)};
  });
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv2d_dgrad", &cutlass_ops::conv2d_backward::conv2d_dgrad_aten);
  m.impl("conv2d_wgrad", &cutlass_ops::conv2d_backward::conv2d_wgrad_aten);
}
