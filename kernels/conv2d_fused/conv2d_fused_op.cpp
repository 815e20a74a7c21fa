// cutlass_ops::conv2d_fused: schema, input checks and the CPU (ATen) implementation.
// The CUDA implementation is in conv2d_fused_cuda.cpp; the fake (meta) one in
// cutlass_ops/ops.py.
#include "conv2d_fused/conv2d_fused_op.h"

#include <torch/library.h>

namespace cutlass_ops {
namespace conv2d_fused {

namespace {

void check_scalar(c10::optional<at::Tensor> const& t, char const* name, at::Tensor const& input) {
  if (!t) return;
  TORCH_CHECK_VALUE(t->numel() == 1 && t->dim() <= 1, "conv2d_fused: ", name,
                    " must be a scalar tensor (0-d or one element), got shape ", t->sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(t->scalar_type()), "conv2d_fused: ", name,
                    " must be a floating tensor, got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->device() == input.device(), "conv2d_fused: ", name, " is on ",
                    t->device(), " but input is on ", input.device());
}

}  // namespace

OutputShape check_inputs(at::Tensor const& input, at::Tensor const& weight,
                         c10::optional<at::Tensor> const& bias,
                         c10::optional<at::Tensor> const& residual,
                         c10::optional<at::Tensor> const& scale,
                         c10::optional<at::Tensor> const& post_bias, at::IntArrayRef stride,
                         at::IntArrayRef padding) {
  TORCH_CHECK_VALUE(input.dim() == 4, "conv2d_fused: input must be 4-D (N, C, H, W), got ",
                    input.dim(), "-D");
  TORCH_CHECK_VALUE(weight.dim() == 4, "conv2d_fused: weight must be 4-D (K, C, R, S), got ",
                    weight.dim(), "-D");
  TORCH_CHECK_VALUE(at::isFloatingType(input.scalar_type()),
                    "conv2d_fused: input must be a floating tensor, got ", input.scalar_type());
  TORCH_CHECK_VALUE(weight.scalar_type() == input.scalar_type(), "conv2d_fused: weight dtype ",
                    weight.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == input.device(), "conv2d_fused: weight is on ",
                    weight.device(), " but input is on ", input.device());
  TORCH_CHECK_VALUE(stride.size() == 2 && padding.size() == 2,
                    "conv2d_fused: stride and padding take two values (h, w)");
  TORCH_CHECK_VALUE(stride[0] >= 1 && stride[1] >= 1, "conv2d_fused: stride must be >= 1, got ",
                    stride);
  TORCH_CHECK_VALUE(padding[0] >= 0 && padding[1] >= 0,
                    "conv2d_fused: padding must be >= 0, got ", padding);

  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  int64_t K = weight.size(0), R = weight.size(2), S = weight.size(3);
  TORCH_CHECK_VALUE(weight.size(1) == C, "conv2d_fused: input has ", C,
                    " channels but weight expects ", weight.size(1), " (weight shape ",
                    weight.sizes(), "; grouped convs are not supported)");
  TORCH_CHECK_VALUE(C > 0 && K > 0 && R > 0 && S > 0, "conv2d_fused: empty channel or kernel dims");
  int64_t P = (H + 2 * padding[0] - R) / stride[0] + 1;
  int64_t Q = (W + 2 * padding[1] - S) / stride[1] + 1;
  TORCH_CHECK_VALUE(H + 2 * padding[0] >= R && W + 2 * padding[1] >= S,
                    "conv2d_fused: padded input ", H + 2 * padding[0], "x", W + 2 * padding[1],
                    " is smaller than the kernel ", R, "x", S);

  if (bias) {
    TORCH_CHECK_VALUE(bias->dim() == 0 || (bias->dim() == 1 && bias->size(0) == K),
                      "conv2d_fused: bias must be 0-d (scalar) or shape (", K, "), got ",
                      bias->sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(bias->scalar_type()),
                      "conv2d_fused: bias must be a floating tensor, got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->device() == input.device(), "conv2d_fused: bias is on ",
                      bias->device(), " but input is on ", input.device());
  }
  if (residual) {
    TORCH_CHECK_VALUE(residual->sizes() == at::IntArrayRef({N, K, P, Q}),
                      "conv2d_fused: residual must have the output's shape (", N, ", ", K, ", ",
                      P, ", ", Q, "), got ", residual->sizes());
    TORCH_CHECK_VALUE(residual->scalar_type() == input.scalar_type(),
                      "conv2d_fused: residual dtype ", residual->scalar_type(),
                      " differs from input dtype ", input.scalar_type());
    TORCH_CHECK_VALUE(residual->device() == input.device(), "conv2d_fused: residual is on ",
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

at::Tensor conv2d_fused_aten(at::Tensor const& input, at::Tensor const& weight,
                             c10::optional<at::Tensor> const& bias,
                             c10::optional<at::Tensor> const& residual,
                             c10::optional<at::Tensor> const& scale,
                             c10::optional<at::Tensor> const& post_bias, at::IntArrayRef stride,
                             at::IntArrayRef padding, bool relu) {
  last_kernel_slot() = "aten";
  OutputShape out = check_inputs(input, weight, bias, residual, scale, post_bias, stride, padding);
  auto compute = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // One memory format whatever the caller's (the CUDA path converts NCHW too): ATen picks
  // its CPU conv algorithm by layout, and the result must not depend on it.
  auto cl = at::MemoryFormat::ChannelsLast;
  auto y = at::conv2d(input.to(compute).contiguous(cl), weight.to(compute).contiguous(cl), {}, stride, padding);
  if (scale) y = y * scale->to(compute).reshape({});
  if (bias) y = y + (bias->dim() == 0 ? bias->to(compute) : bias->to(compute).view({1, out.K, 1, 1}));
  if (residual) y = y + residual->to(compute);
  if (relu) y = at::relu(y);
  if (post_bias) y = y + post_bias->to(compute).reshape({});
  auto result = at::empty({out.N, out.K, out.P, out.Q},
                          input.options().memory_format(at::MemoryFormat::ChannelsLast));
  result.copy_(y);
  return result;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "conv2d_fused(Tensor input, Tensor weight, Tensor? bias=None, Tensor? residual=None, "
      "Tensor? scale=None, Tensor? post_bias=None, int[2] stride=[1, 1], int[2] padding=[0, 0], "
      "bool relu=False) -> Tensor");
  // The kernel the last conv2d_fused call on this thread ran: a generated kernel's name,
  // or "aten" for the ATen path (CPU, and the CUDA fallback).  For tests and for users
  // checking that their shapes hit a fast path.
  m.def("conv2d_fused_last_kernel() -> str", &cutlass_ops::conv2d_fused::last_kernel);
  // For the profiler: make this thread's CUDA conv2d_fused calls run the named kernel
  // with `split_k` serial split-K slices (0: the dispatcher's choice); an error when it
  // cannot run the problem.  "" restores the normal choice.
  m.def("conv2d_fused_force_kernel(str name, int split_k=0) -> ()",
        [](std::string name, int64_t split_k) {
          TORCH_CHECK_VALUE(split_k >= 0 && split_k <= 64,
                            "conv2d_fused_force_kernel: split_k must be 0..64, got ", split_k);
          cutlass_ops::conv2d_fused::forced_choice_slot() = {std::move(name), static_cast<int>(split_k)};
        });
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv2d_fused", &cutlass_ops::conv2d_fused::conv2d_fused_aten);
}
