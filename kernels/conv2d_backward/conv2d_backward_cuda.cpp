// CUDA implementations of cutlass_ops::conv2d_dgrad / conv2d_wgrad: the generated CUTLASS
// dgrad/wgrad kernels (conv2d_backward_dispatch.h) for fp16/bf16 with channel counts that
// are multiples of 8 on sm80+; everything else takes the ATen composite (cuDNN).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "common/cuda_device.h"
#include "conv2d_backward/conv2d_backward_dispatch.h"
#include "conv2d_backward/conv2d_backward_op.h"

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

constexpr char kCudnnByProfile[] = "aten (the profile measured cuDNN faster here)";

bool is_half(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

Conv2dBackwardArgs make_args(ConvKind kind, at::Tensor const& grad_output, ConvShape const& s,
                             at::IntArrayRef stride, at::IntArrayRef padding) {
  Conv2dBackwardArgs a{};
  a.kind = kind;
  a.dtype = grad_output.scalar_type() == at::kHalf ? DType::kF16 : DType::kBF16;
  a.N = s.N; a.H = s.H; a.W = s.W; a.C = s.C; a.K = s.K; a.R = s.R; a.S = s.S; a.P = s.P; a.Q = s.Q;
  a.pad_h = padding[0]; a.pad_w = padding[1]; a.stride_h = stride[0]; a.stride_w = stride[1];
  return a;
}

bool fits_int32(ConvShape const& s) {
  return s.N * s.C * s.H * s.W < INT32_MAX && s.N * s.K * s.P * s.Q < INT32_MAX;
}

// The dispatcher's plan, or the profiler's forced kernel.
Plan plan_for(Conv2dBackwardArgs const& a, int dev) {
  ForcedChoice const& forced = forced_choice_slot();
  Plan p = plan(a, compute_capability(dev), multiprocessor_count(dev),
                forced.kernel.empty() ? nullptr : forced.kernel.c_str(), forced.split_k);
  TORCH_CHECK_VALUE(p.kernel != nullptr || forced.kernel.empty(), "conv2d_backward: the forced kernel ",
                    forced.kernel, " cannot run this problem: ", p.why_not);
  return p;
}

// Runs the plan's kernel; false (nothing launched) when no kernel fits.
bool run_planned(Conv2dBackwardArgs a, at::Tensor const& out, char const* op, Plan const& p) {
  if (p.kernel == nullptr) {
    if (p.cudnn_measured_faster) return false;  // the profile's choice, not a gap: no warning
    TORCH_WARN_ONCE("cutlass_ops.", op, ": no generated kernel fits (", p.why_not,
                    "); using the slower ATen composite (cuDNN).");
    return false;
  }
  a.split_k_slices = p.split_k_slices;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();
  cutlass::Status status = p.kernel->run(a, stream, /*query=*/false);
  TORCH_CHECK(status == cutlass::Status::kSuccess, op, ": kernel ", p.kernel->name, " failed: ",
              cutlassGetStatusString(status), " (", cudaGetErrorString(cudaGetLastError()),
              "; was the library built for this GPU's arch? see CUTLASS_OPS_ARCHS)");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  last_kernel_slot() = p.kernel->name;
  return true;
}

}  // namespace

at::Tensor conv2d_dgrad_cuda(at::Tensor const& grad_output, at::Tensor const& weight, at::IntArrayRef input_size,
                             at::IntArrayRef stride, at::IntArrayRef padding,
                             c10::optional<at::Tensor> const& scale) {
  ConvShape s = check_dgrad(grad_output, weight, input_size, stride, padding, scale);
  if (!is_half(grad_output.scalar_type()) || !fits_int32(s)) {
    return conv2d_dgrad_aten(grad_output, weight, input_size, stride, padding, scale);
  }
  c10::cuda::CUDAGuard guard(grad_output.device());
  auto cl = at::MemoryFormat::ChannelsLast;
  auto dx = at::empty({s.N, s.C, s.H, s.W}, grad_output.options().memory_format(cl));
  if (dx.numel() == 0 || grad_output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    return dx.zero_();
  }
  at::Tensor dy = grad_output.contiguous(cl), w = weight.contiguous(cl);
  at::Tensor scale_f = scale ? scale->to(at::kFloat).reshape({1}).contiguous() : at::Tensor();
  Conv2dBackwardArgs a = make_args(ConvKind::kDgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.weight = w.data_ptr();
  a.output = dx.data_ptr();
  a.scale = scale ? scale_f.data_ptr<float>() : nullptr;
  Plan p = plan_for(a, grad_output.device().index());
  if (!run_planned(a, dx, "conv2d_dgrad", p)) {
    dx = conv2d_dgrad_aten(grad_output, weight, input_size, stride, padding, scale);
    if (p.cudnn_measured_faster) last_kernel_slot() = kCudnnByProfile;
  }
  return dx;
}

at::Tensor conv2d_wgrad_cuda(at::Tensor const& grad_output, at::Tensor const& input, at::IntArrayRef weight_size,
                             at::IntArrayRef stride, at::IntArrayRef padding) {
  ConvShape s = check_wgrad(grad_output, input, weight_size, stride, padding);
  if (!is_half(grad_output.scalar_type()) || !fits_int32(s)) {
    return conv2d_wgrad_aten(grad_output, input, weight_size, stride, padding);
  }
  c10::cuda::CUDAGuard guard(grad_output.device());
  auto cl = at::MemoryFormat::ChannelsLast;
  auto f32 = grad_output.options().dtype(at::kFloat);
  if (grad_output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    return at::zeros({s.K, s.C, s.R, s.S}, f32.memory_format(cl));
  }
  at::Tensor dy = grad_output.contiguous(cl), x = input.contiguous(cl);
  Conv2dBackwardArgs a = make_args(ConvKind::kWgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.input = x.data_ptr();
  int dev = grad_output.device().index();
  // Plan first (the output is not allocated yet: the dispatcher skips a null pointer's
  // alignment; allocations are 256-byte aligned), then allocate the split's partial sums.
  a.output = nullptr;
  Plan p = plan_for(a, dev);
  int slices = p.split_k_slices;
  // Slices x (K, R, S, C): slice i is K x R x S x C floats at offset i * K*R*S*C.
  auto partial = p.kernel != nullptr ? at::empty({slices, s.K, s.R, s.S, s.C}, f32) : at::Tensor();
  a.output = p.kernel != nullptr ? partial.data_ptr() : nullptr;
  if (!run_planned(a, partial, "conv2d_wgrad", p)) {
    auto dw = conv2d_wgrad_aten(grad_output, input, weight_size, stride, padding);
    if (p.cudnn_measured_faster) last_kernel_slot() = kCudnnByProfile;
    return dw;
  }
  // (K, R, S, C) memory is (K, C, R, S) channels_last.
  auto dw = slices > 1 ? partial.sum(0) : partial.select(0, 0);
  if (slices > 1) last_kernel_slot() += " + sum of " + std::to_string(slices) + " split-K slices";
  return dw.permute({0, 3, 1, 2});
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (int i = 0; i < kNumKernels; ++i) {
    if (kKernels[i].run != nullptr) names.emplace_back(kKernels[i].name);
  }
  return names;
}

}  // namespace conv2d_backward
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // The generated dgrad/wgrad kernels of this build (not registered in a CPU-only build).
  m.def("conv2d_backward_kernels() -> str[]", &cutlass_ops::conv2d_backward::kernel_names);
}

TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("conv2d_dgrad", &cutlass_ops::conv2d_backward::conv2d_dgrad_cuda);
  m.impl("conv2d_wgrad", &cutlass_ops::conv2d_backward::conv2d_wgrad_cuda);
}
