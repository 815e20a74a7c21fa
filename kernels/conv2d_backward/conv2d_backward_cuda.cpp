// CUDA implementations of cutlass_ops::conv2d_dgrad / conv2d_wgrad: the generated CUTLASS
// dgrad/wgrad kernels (conv2d_backward_dispatch.h) for fp16/bf16 with channel counts that
// are multiples of 8 on sm80+, unless the build's profile measured cuDNN faster; else cuDNN
// (through ATen).  Either way the FixUp scale is applied by our weight-sized kernels
// (weight_grad_kernel.h): wgrad's epilogue pass, and the scaled operand cuDNN's dgrad reads.
#include <string>
#include <vector>

#include "common/cuda_device.h"
#include "common/kernel_table.h"
#include "conv2d_backward/conv2d_backward_dispatch.h"
#include "conv2d_fused/conv2d_fused_dispatch.h"
#include "conv2d_backward/conv2d_backward_op.h"
#include "conv2d_backward/weight_grad_kernel.h"

namespace cutlass_ops {
namespace conv2d_backward {

namespace {

bool is_half(ScalarType t) { return t == kHalf || t == kBFloat16; }

Conv2dBackwardArgs make_args(ConvKind kind, Tensor const& grad_output, ConvShape const& s, IntArrayRef stride,
                             IntArrayRef padding) {
  Conv2dBackwardArgs a{};
  a.kind = kind;
  a.dtype = grad_output.scalar_type() == kHalf ? DType::kF16 : DType::kBF16;
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
  CUTLASS_OPS_CHECK_VALUE(p.kernel != nullptr || forced.kernel.empty(), "conv2d_backward: the forced kernel ",
                          forced.kernel, " cannot run this problem: ", p.why_not);
  return p;
}

// Runs the plan's kernel; false (nothing launched) when no kernel fits.
bool run_planned(Conv2dBackwardArgs a, Tensor const& out, char const* op, Plan const& p) {
  if (p.kernel == nullptr) {
    if (p.prefer_cudnn) return false;  // a choice, not a gap: no warning
    CUTLASS_OPS_WARN_ONCE("cutlass_ops.", op, ": no generated kernel fits (", p.why_not,
                          "); using the slower ATen composite (cuDNN).");
    return false;
  }
  a.split_k_slices = p.split_k_slices;
  cudaStream_t stream = current_cuda_stream(out.get_device_index());
  cutlass::Status status = p.kernel->run(a, stream, /*query=*/false);
  CUTLASS_OPS_CHECK(status == cutlass::Status::kSuccess, op, ": kernel ", p.kernel->name, " failed: ",
                    cutlassGetStatusString(status), " (", cudaGetErrorString(cudaGetLastError()),
                    "; was the library built for this GPU's arch? see CUTLASS_OPS_ARCHS)");
  CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
  last_kernel_slot() = p.kernel->name;
  return true;
}

Elem elem_of(ScalarType t) {
  return t == kHalf ? Elem::kF16 : t == kBFloat16 ? Elem::kBF16 : Elem::kF32;
}

// scale * t (a channels_last 16-bit tensor) in one kernel.
Tensor scaled(Tensor const& t, Tensor const& scale_f, int dev) {
  Tensor in = torch::stable::contiguous(t, kChannelsLast);
  Tensor out = torch::stable::empty_like(in);
  cudaStream_t stream = current_cuda_stream(dev);
  CUTLASS_OPS_CUDA_CHECK(launch_scaled_copy(in.data_ptr(), elem_of(in.scalar_type()), in.numel(),
                                            scale_f.mutable_data_ptr<float>(), out.data_ptr(),
                                            weight_grad_blocks(in.numel(), multiprocessor_count(dev)), stream));
  return out;
}

// Block 0's dgrad (3x3, stride 1, pad 1, C = K = 64, 16-wide maps) is a stride-1 conv of dy
// with the filter rotated by 180 degrees and its C and K swapped: conv2d_fused's hand-written
// halo kernel runs it on sm90 (docs/experiments/sm90_halo_conv), unless a backward kernel is
// forced, CUTLASS_OPS_SM90=0 or CUTLASS_OPS_SM90_HALO=0.  Undefined when it does not apply.
Tensor dgrad_by_halo(Tensor const& dy, Tensor const& w, ConvShape const& s, IntArrayRef stride, IntArrayRef padding,
                     float* scale, int dev) {
  namespace fused = conv2d_fused;
  if (!forced_choice_slot().kernel.empty() || sm90_policy_from_env() == Sm90Policy::kOff ||
      !fused::hand_written_kernels_from_env() || fused::hand_written_kernels().empty() ||
      compute_capability(dev) != 90)
    return Tensor();
  if (!(s.C == 64 && s.K == 64 && s.R == 3 && s.S == 3 && stride[0] == 1 && stride[1] == 1 && padding[0] == 1 &&
        padding[1] == 1 && s.P == s.H && s.Q == s.W))
    return Tensor();  // the kernel's own run() checks the rest (width 16, height a multiple of 8)
  // w'[c][k][r][s] = w[k][c][2-r][2-s], KRSC in memory as the kernel reads filters.
  Tensor w_rot = torch::stable::contiguous(
      torch::stable::transpose(aten_call("aten::flip", "", w, std::vector<int64_t>{2, 3}), 0, 1), kChannelsLast);
  Tensor dx = empty({s.N, s.C, s.H, s.W}, dy.scalar_type(), dy.device(), kChannelsLast);
  fused::Conv2dFusedArgs a{};
  a.dtype = dy.scalar_type() == kHalf ? fused::DType::kF16 : fused::DType::kBF16;
  a.N = s.N; a.H = s.P; a.W = s.Q; a.C = s.K;  // the conv's input is dy
  a.K = s.C; a.R = 3; a.S = 3; a.P = s.H; a.Q = s.W;
  a.pad_h = a.pad_w = 1; a.stride_h = a.stride_w = 1;
  a.input = dy.data_ptr();
  a.weight = w_rot.data_ptr();
  a.output = dx.data_ptr();
  a.scale = scale;
  a.programmatic_launch = programmatic_launch_allowed(dev);
  a.sm90_policy = fused::Sm90Policy::kFirst;
  cudaStream_t stream = current_cuda_stream(dev);
  for (fused::KernelEntry const* e : fused::hand_written_kernels()) {
    if (e->dtype != a.dtype) continue;
    cutlass::Status status = e->run(a, stream);
    if (status == cutlass::Status::kErrorNotSupported) continue;
    CUTLASS_OPS_CHECK(status == cutlass::Status::kSuccess, "conv2d_dgrad: kernel ", e->name, " failed: ",
                      cudaGetErrorString(cudaGetLastError()));
    CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
    last_kernel_slot() = std::string(e->name) + " (dgrad: the rotated filter)";
    return dx;
  }
  return Tensor();
}

}  // namespace

Tensor conv2d_dgrad_cuda(Tensor const& grad_output, Tensor const& weight, IntArrayRef input_size, IntArrayRef stride,
                         IntArrayRef padding, std::optional<Tensor> const& scale) {
  ConvShape s = check_dgrad(grad_output, weight, input_size, stride, padding, scale);
  if (!is_half(grad_output.scalar_type()) || !fits_int32(s)) {
    return conv2d_dgrad_aten(grad_output, weight, input_size, stride, padding, scale);
  }
  DeviceGuard guard(grad_output.get_device_index());
  auto cl = kChannelsLast;
  int dev = grad_output.get_device_index();
  Tensor scale_f =
      scale ? torch::stable::contiguous(torch::stable::reshape(to_dtype(*scale, kFloat), {1})) : Tensor();
  if (grad_output.numel() == 0 || s.N * s.C * s.H * s.W == 0) {
    last_kernel_slot() = "none (empty)";
    // Contiguous (NCHW), as before the port: ATen's zeros ignored the channels_last asked for.
    return zeros({s.N, s.C, s.H, s.W}, grad_output.scalar_type(), grad_output.device());
  }
  Tensor dy = torch::stable::contiguous(grad_output, cl), w = torch::stable::contiguous(weight, cl);
  if (Tensor dx = dgrad_by_halo(dy, w, s, stride, padding, scale ? scale_f.mutable_data_ptr<float>() : nullptr, dev);
      dx.defined())
    return dx;
  Conv2dBackwardArgs a = make_args(ConvKind::kDgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.weight = w.data_ptr();
  a.scale = scale ? scale_f.mutable_data_ptr<float>() : nullptr;
  a.output = nullptr;  // planned before the allocation (allocations are 256-byte aligned)
  Plan p = plan_for(a, dev);
  Tensor dx = p.kernel != nullptr ? empty({s.N, s.C, s.H, s.W}, grad_output.scalar_type(), grad_output.device(), cl)
                                  : Tensor();
  a.output = p.kernel != nullptr ? dx.data_ptr() : nullptr;
  if (!run_planned(a, dx, "conv2d_dgrad", p)) {
    // cuDNN's dgrad takes no alpha: the scale goes into the smaller operand (the weight,
    // or dy where the batch is small and the weight large: block 3's convs).
    bool const scale_dy = scale && dy.numel() < w.numel();
    dx = conv2d_dgrad_aten(scale_dy ? scaled(dy, scale_f, dev) : dy, scale && !scale_dy ? scaled(w, scale_f, dev) : w,
                           input_size, stride, padding, std::nullopt);
    if (p.prefer_cudnn) last_kernel_slot() = cudnn_label(p);
  }
  return dx;
}

std::tuple<Tensor, Tensor> conv2d_wgrad_cuda(Tensor const& grad_output, Tensor const& input, Tensor const& weight,
                                             IntArrayRef stride, IntArrayRef padding,
                                             std::optional<Tensor> const& scale) {
  ConvShape s = check_wgrad(grad_output, input, weight, stride, padding, scale);
  if (!is_half(grad_output.scalar_type()) || !fits_int32(s)) {
    return conv2d_wgrad_aten(grad_output, input, weight, stride, padding, scale);
  }
  DeviceGuard guard(grad_output.get_device_index());
  auto cl = kChannelsLast;
  Device const device = grad_output.device();  // float32 tensors: on grad_output's device
  int dev = grad_output.get_device_index();
  if (grad_output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    // dw contiguous (KCRS), as before the port: ATen's zeros ignored the channels_last asked for.
    return {zeros({s.K, s.C, s.R, s.S}, weight.scalar_type(), weight.device()), zeros({}, kFloat, device)};
  }
  Tensor dy = torch::stable::contiguous(grad_output, cl), x = torch::stable::contiguous(input, cl),
         w = torch::stable::contiguous(weight, cl);
  Conv2dBackwardArgs a = make_args(ConvKind::kWgrad, grad_output, s, stride, padding);
  a.grad_output = dy.data_ptr();
  a.input = x.data_ptr();
  a.output = nullptr;  // planned before the allocation (allocations are 256-byte aligned)
  Plan p = plan_for(a, dev);
  // G: our kernel's float32 partial sums, slices x (K, R, S, C), or cuDNN's 16-bit dw
  // (channels_last (K, C, R, S): the same K, R, S, C order in memory).
  Tensor g;
  int slices = 1;
  if (p.kernel != nullptr) {
    slices = p.split_k_slices;
    g = empty({slices, s.K, s.R, s.S, s.C}, kFloat, device);
    a.output = g.data_ptr();
    run_planned(a, g, "conv2d_wgrad", p);
  } else {
    run_planned(a, g, "conv2d_wgrad", p);  // launches nothing; warns unless cuDNN was chosen
    // aten::convolution_backward(grad_output, input, weight, bias_sizes=None, stride, padding,
    //   dilation=[1, 1], transposed=False, output_padding=[0, 0], groups=1, output_mask)
    auto grads = aten_call_multi<Tensor, Tensor, Tensor>(
        "aten::convolution_backward", "", dy, x, w, std::nullopt, stride, padding, std::vector<int64_t>{1, 1}, false,
        std::vector<int64_t>{0, 0}, int64_t(1), BoolList{{false, true, false}});
    g = torch::stable::contiguous(std::get<1>(grads), cl);
  }
  // One pass over G: the split's sum, dw = scale * G, and <w, G>.
  Tensor scale_f =
      scale ? torch::stable::contiguous(torch::stable::reshape(to_dtype(*scale, kFloat), {1})) : Tensor();
  int64_t n = w.numel();
  int blocks = weight_grad_blocks(n, multiprocessor_count(dev));
  Tensor dw = empty({s.K, s.R, s.S, s.C}, w.scalar_type(), w.device(), kContiguous);
  Tensor scratch = empty({blocks + 1}, kFloat, device);  // the per-block dots, then the finished-block count
  Tensor dot = empty({}, kFloat, device);
  WgradEpilogueArgs e{g.data_ptr(), elem_of(g.scalar_type()), slices, n, w.data_ptr(), elem_of(w.scalar_type()),
                      scale ? scale_f.mutable_data_ptr<float>() : nullptr, dw.data_ptr(),
                      scratch.mutable_data_ptr<float>(),
                      reinterpret_cast<unsigned*>(scratch.mutable_data_ptr<float>() + blocks),
                      dot.mutable_data_ptr<float>()};
  CUTLASS_OPS_CUDA_CHECK(launch_wgrad_epilogue(e, blocks, current_cuda_stream(dev)));
  if (p.kernel == nullptr) {
    last_kernel_slot() = (p.prefer_cudnn ? cudnn_label(p) : std::string("aten")) + " + wgrad epilogue";
  } else {
    // family 90 splits the batch (concurrent launches), family 80 runs parallel split-K
    last_kernel_slot() += " + wgrad epilogue over " + std::to_string(slices) +
                          (p.kernel->family == 90 ? " batch slice(s)" : " split-K slice(s)");
  }
  // (K, R, S, C) memory is (K, C, R, S) channels_last.
  return {permute(dw, {0, 3, 1, 2}), dot};
}

std::vector<std::string> kernel_names() { return built_kernel_names(kKernels, kNumKernels); }

}  // namespace conv2d_backward
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // The generated dgrad/wgrad kernels of this build (not registered in a CPU-only build).
  m.def("conv2d_backward_kernels() -> str[]");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_backward_kernels", TORCH_BOX(&cutlass_ops::conv2d_backward::kernel_names));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("conv2d_dgrad", TORCH_BOX(&cutlass_ops::conv2d_backward::conv2d_dgrad_cuda));
  m.impl("conv2d_wgrad", TORCH_BOX(&cutlass_ops::conv2d_backward::conv2d_wgrad_cuda));
}
