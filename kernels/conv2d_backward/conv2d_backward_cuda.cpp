// CUDA implementations of cutlass_ops::conv2d_dgrad / conv2d_wgrad: the generated CUTLASS
// dgrad/wgrad kernels (conv2d_backward_dispatch.h) for fp16/bf16 with channel counts that
// are multiples of 8 on sm80+, unless the build's profile measured cuDNN faster; else cuDNN
// (through ATen).  Either way the FixUp scale is applied by our weight-sized kernels
// (weight_grad_kernel.h): wgrad's epilogue pass, and the scaled operand cuDNN's dgrad reads.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "common/cuda_device.h"
#include "common/kernel_table.h"
#include "conv2d_backward/conv2d_backward_dispatch.h"
#include "conv2d_backward/conv2d_backward_op.h"
#include "conv2d_backward/weight_grad_kernel.h"

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

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

// "aten (cuDNN: <why>)" when cuDNN ran by choice.
std::string cudnn_label(Plan const& p) { return "aten (cuDNN: " + p.why_not + ")"; }

// The dispatcher's plan, or the profiler's forced kernel ("cudnn": the ATen path).
Plan plan_for(Conv2dBackwardArgs const& a, int dev) {
  ForcedChoice const& forced = forced_choice_slot();
  if (forced.kernel == "cudnn") {
    Plan p;
    p.prefer_cudnn = true;
    p.why_not = "forced";
    return p;
  }
  Plan p = plan(a, compute_capability(dev), multiprocessor_count(dev),
                forced.kernel.empty() ? nullptr : forced.kernel.c_str(), forced.split_k, sm90_policy_from_env());
  TORCH_CHECK_VALUE(p.kernel != nullptr || forced.kernel.empty(), "conv2d_backward: the forced kernel ",
                    forced.kernel, " cannot run this problem: ", p.why_not);
  return p;
}

// Runs the plan's kernel; false (nothing launched) when no kernel fits.
bool run_planned(Conv2dBackwardArgs a, at::Tensor const& out, char const* op, Plan const& p) {
  if (p.kernel == nullptr) {
    if (p.prefer_cudnn) return false;  // a choice, not a gap: no warning
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

Elem elem_of(at::ScalarType t) {
  return t == at::kHalf ? Elem::kF16 : t == at::kBFloat16 ? Elem::kBF16 : Elem::kF32;
}

// scale * t (a channels_last 16-bit tensor) in one kernel.
at::Tensor scaled(at::Tensor const& t, at::Tensor const& scale_f, int dev) {
  auto in = t.contiguous(at::MemoryFormat::ChannelsLast);
  auto out = at::empty_like(in);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev).stream();
  C10_CUDA_CHECK(launch_scaled_copy(in.data_ptr(), elem_of(in.scalar_type()), in.numel(), scale_f.data_ptr<float>(),
                                    out.data_ptr(), weight_grad_blocks(in.numel(), multiprocessor_count(dev)), stream));
  return out;
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
  int dev = grad_output.device().index();
  at::Tensor scale_f = scale ? scale->to(at::kFloat).reshape({1}).contiguous() : at::Tensor();
  if (grad_output.numel() == 0 || s.N * s.C * s.H * s.W == 0) {
    last_kernel_slot() = "none (empty)";
    return at::zeros({s.N, s.C, s.H, s.W}, grad_output.options().memory_format(cl));
  }
  at::Tensor dy = grad_output.contiguous(cl), w = weight.contiguous(cl);
  Conv2dBackwardArgs a = make_args(ConvKind::kDgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.weight = w.data_ptr();
  a.scale = scale ? scale_f.data_ptr<float>() : nullptr;
  a.output = nullptr;  // planned before the allocation (allocations are 256-byte aligned)
  Plan p = plan_for(a, dev);
  at::Tensor dx = p.kernel != nullptr ? at::empty({s.N, s.C, s.H, s.W}, grad_output.options().memory_format(cl))
                                      : at::Tensor();
  a.output = p.kernel != nullptr ? dx.data_ptr() : nullptr;
  if (!run_planned(a, dx, "conv2d_dgrad", p)) {
    // cuDNN's dgrad takes no alpha: the scale goes into the smaller operand (the weight,
    // or dy where the batch is small and the weight large: block 3's convs).
    bool const scale_dy = scale && dy.numel() < w.numel();
    dx = conv2d_dgrad_aten(scale_dy ? scaled(dy, scale_f, dev) : dy, scale && !scale_dy ? scaled(w, scale_f, dev) : w,
                           input_size, stride, padding, c10::nullopt);
    if (p.prefer_cudnn) last_kernel_slot() = cudnn_label(p);
  }
  return dx;
}

std::tuple<at::Tensor, at::Tensor> conv2d_wgrad_cuda(at::Tensor const& grad_output, at::Tensor const& input,
                                                     at::Tensor const& weight, at::IntArrayRef stride,
                                                     at::IntArrayRef padding, c10::optional<at::Tensor> const& scale) {
  ConvShape s = check_wgrad(grad_output, input, weight, stride, padding, scale);
  if (!is_half(grad_output.scalar_type()) || !fits_int32(s)) {
    return conv2d_wgrad_aten(grad_output, input, weight, stride, padding, scale);
  }
  c10::cuda::CUDAGuard guard(grad_output.device());
  auto cl = at::MemoryFormat::ChannelsLast;
  auto f32 = grad_output.options().dtype(at::kFloat);
  int dev = grad_output.device().index();
  if (grad_output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    return {at::zeros({s.K, s.C, s.R, s.S}, weight.options().memory_format(cl)), at::zeros({}, f32)};
  }
  at::Tensor dy = grad_output.contiguous(cl), x = input.contiguous(cl), w = weight.contiguous(cl);
  Conv2dBackwardArgs a = make_args(ConvKind::kWgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.input = x.data_ptr();
  a.output = nullptr;  // planned before the allocation (allocations are 256-byte aligned)
  Plan p = plan_for(a, dev);
  // G: our kernel's float32 partial sums, slices x (K, R, S, C), or cuDNN's 16-bit dw
  // (channels_last (K, C, R, S): the same K, R, S, C order in memory).
  at::Tensor g;
  int slices = 1;
  if (p.kernel != nullptr) {
    slices = p.split_k_slices;
    g = at::empty({slices, s.K, s.R, s.S, s.C}, f32);
    a.output = g.data_ptr();
    run_planned(a, g, "conv2d_wgrad", p);
  } else {
    run_planned(a, g, "conv2d_wgrad", p);  // launches nothing; warns unless cuDNN was chosen
    g = std::get<1>(at::convolution_backward(dy, x, w, c10::nullopt, stride, padding, {1, 1}, false, {0, 0}, 1,
                                             {false, true, false}))
            .contiguous(cl);
  }
  // One pass over G: the split's sum, dw = scale * G, and <w, G>.
  at::Tensor scale_f = scale ? scale->to(at::kFloat).reshape({1}).contiguous() : at::Tensor();
  int64_t n = w.numel();
  int blocks = weight_grad_blocks(n, multiprocessor_count(dev));
  auto dw = at::empty({s.K, s.R, s.S, s.C}, w.options().memory_format(at::MemoryFormat::Contiguous));
  auto scratch = at::empty({blocks + 1}, f32);  // the per-block dots, then the finished-block count
  auto dot = at::empty({}, f32);
  WgradEpilogueArgs e{g.data_ptr(), elem_of(g.scalar_type()), slices, n, w.data_ptr(), elem_of(w.scalar_type()),
                      scale ? scale_f.data_ptr<float>() : nullptr, dw.data_ptr(), scratch.data_ptr<float>(),
                      reinterpret_cast<unsigned*>(scratch.data_ptr<float>() + blocks), dot.data_ptr<float>()};
  C10_CUDA_CHECK(launch_wgrad_epilogue(e, blocks, c10::cuda::getCurrentCUDAStream(dev).stream()));
  if (p.kernel == nullptr) {
    last_kernel_slot() = (p.prefer_cudnn ? cudnn_label(p) : std::string("aten")) + " + wgrad epilogue";
  } else {
    // family 90 splits the batch (concurrent launches), family 80 runs parallel split-K
    last_kernel_slot() += " + wgrad epilogue over " + std::to_string(slices) +
                          (p.kernel->family == 90 ? " batch slice(s)" : " split-K slice(s)");
  }
  // (K, R, S, C) memory is (K, C, R, S) channels_last.
  return {dw.permute({0, 3, 1, 2}), dot};
}

std::vector<std::string> kernel_names() { return built_kernel_names(kKernels, kNumKernels); }

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
