// CUDA implementation of cutlass_ops::conv2d_fused: lays the tensors out as the generated
// CUTLASS kernels expect (NHWC, float32 epilogue operands) and runs the first kernel of the
// dispatch table that fits.  Shapes or dtypes no kernel covers take the ATen composite.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common/cuda_device.h"
#include "common/kernel_table.h"
#include "conv2d_fused/conv2d_fused_dispatch.h"
#include "conv2d_fused/conv2d_fused_op.h"
#include "conv2d_fused/conv2d_fused_sm90_halo.h"
#include "se_gate/se_gate_op.h"

namespace cutlass_ops {
namespace conv2d_fused {

namespace {

// channels_last without a copy when it already is; float32 epilogue operands likewise.
Tensor as_nhwc(Tensor const& t) { return torch::stable::contiguous(t, kChannelsLast); }

Tensor as_float_vector(Tensor const& t) {
  Tensor f = torch::stable::contiguous(to_dtype(t, kFloat));
  // The epilogue reads the bias with vector loads of up to 8 floats.
  if (reinterpret_cast<std::uintptr_t>(f.data_ptr()) % 32 != 0) f = torch::stable::clone(f);
  return f;
}

// CUTLASS_OPS_SM90 (read per call, so tests and benchmarks can switch): unset = the
// profile decides, 1 = family 90 first, 0 = family 80 only.
Sm90Policy sm90_policy_from_env() {
  char const* env = std::getenv("CUTLASS_OPS_SM90");
  if (env == nullptr || env[0] == '\0') return Sm90Policy::kProfiled;
  if (env[0] == '1') return Sm90Policy::kFirst;
  if (env[0] == '0') return Sm90Policy::kNever;
  return Sm90Policy::kProfiled;
}

}  // namespace

Tensor conv2d_fused_cuda(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         std::optional<Tensor> const& residual, std::optional<Tensor> const& scale,
                         std::optional<Tensor> const& post_bias, IntArrayRef stride, IntArrayRef padding,
                         bool relu, bool silu) {
  check_activation(relu, silu);
  OutputShape out = check_inputs(input, weight, bias, residual, scale, post_bias, stride, padding);
  auto dtype = input.scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) {
    // float32/float64 have no tensor-core kernels here; the composite is exact and documented.
    return conv2d_fused_aten(input, weight, bias, residual, scale, post_bias, stride, padding, relu, silu);
  }
  DeviceGuard guard(input.get_device_index());
  Tensor output = empty({out.N, out.K, out.P, out.Q}, dtype, input.device(), kChannelsLast);
  if (output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    return output;
  }
  // The kernels index in 32 bits.  Over 2^31 elements: chunks of whole images, each under
  // 2^31, through this same function (outputs copied into place); an image over 2^31 on its
  // own takes the ATen composite (64-bit indexing, float32 temporaries).
  int64_t const in_image = input.numel() / out.N, out_image = output.numel() / out.N;
  if (input.numel() >= INT32_MAX || output.numel() >= INT32_MAX) {
    int64_t const per = (int64_t(INT32_MAX) - 1) / std::max(in_image, out_image);
    if (per == 0) {
      CUTLASS_OPS_WARN_ONCE(
          "cutlass_ops.conv2d_fused: one image over 2^31 elements; using the slower ATen composite");
      return conv2d_fused_aten(input, weight, bias, residual, scale, post_bias, stride, padding, relu, silu);
    }
    for (int64_t n0 = 0; n0 < out.N; n0 += per) {
      int64_t const nb = std::min(per, out.N - n0);
      std::optional<Tensor> res_part = residual ? std::optional<Tensor>(narrowed(*residual, 0, n0, nb)) : residual;
      Tensor out_part = narrowed(output, 0, n0, nb);
      torch::stable::copy_(out_part, conv2d_fused_cuda(narrowed(input, 0, n0, nb), weight, bias, res_part, scale,
                                                       post_bias, stride, padding, relu, silu));
    }
    return output;
  }

  Tensor x = as_nhwc(input), w = as_nhwc(weight);
  Tensor res = residual ? as_nhwc(*residual) : Tensor();
  Tensor bias_vec, bias_scalar, scale_f, post_bias_f;
  if (bias) (bias->dim() == 1 ? bias_vec : bias_scalar) = as_float_vector(*bias);
  if (scale) scale_f = as_float_vector(*scale);
  if (post_bias) post_bias_f = as_float_vector(*post_bias);

  Conv2dFusedArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.N = out.N; a.H = input.size(2); a.W = input.size(3); a.C = input.size(1);
  a.K = out.K; a.R = weight.size(2); a.S = weight.size(3); a.P = out.P; a.Q = out.Q;
  a.pad_h = padding[0]; a.pad_w = padding[1]; a.stride_h = stride[0]; a.stride_w = stride[1];
  a.input = x.data_ptr();
  a.weight = w.data_ptr();
  a.residual = res.defined() ? res.data_ptr() : nullptr;
  a.output = output.data_ptr();
  a.bias = bias_vec.defined() ? bias_vec.mutable_data_ptr<float>() : nullptr;
  a.bias_scalar = bias_scalar.defined() ? bias_scalar.mutable_data_ptr<float>() : nullptr;
  a.scale = scale_f.defined() ? scale_f.mutable_data_ptr<float>() : nullptr;
  a.post_bias = post_bias_f.defined() ? post_bias_f.mutable_data_ptr<float>() : nullptr;
  a.act = relu ? Activation::kRelu : silu ? Activation::kSilu : Activation::kIdentity;
  // Semaphores for serial split-K: one int per output tile (the dispatcher only splits
  // when there are fewer tiles than SMs).
  Tensor workspace = empty({4096}, kInt, input.device());
  a.workspace = workspace.data_ptr();
  a.workspace_bytes = nbytes(workspace);

  int dev = input.get_device_index();
  cudaStream_t stream = current_cuda_stream(dev);
  int cc = compute_capability(dev);
  a.programmatic_launch = programmatic_launch_allowed(dev);
  a.sm90_policy = sm90_policy_from_env();
  ForcedChoice const& forced_choice = forced_choice_slot();
  std::string const& forced = forced_choice.kernel;
  LaunchResult r = launch(a, cc, multiprocessor_count(dev), stream,
                          forced.empty() ? nullptr : forced.c_str(), forced_choice.split_k,
                          hand_written_kernels_from_env());
  CUTLASS_OPS_CHECK_VALUE(r.kernel != nullptr || forced.empty(), "conv2d_fused: the forced kernel ",
                          forced, " cannot run this problem: ", r.why_not);
  if (r.kernel == nullptr) {
    CUTLASS_OPS_WARN_ONCE("cutlass_ops.conv2d_fused: no generated kernel fits (", r.why_not,
                          "); using the slower ATen composite. Channel counts that are multiples "
                          "of 8 take the fastest kernels.");
    return conv2d_fused_aten(input, weight, bias, residual, scale, post_bias, stride, padding, relu, silu);
  }
  CUTLASS_OPS_CHECK(r.status == cutlass::Status::kSuccess, "conv2d_fused: kernel ", r.kernel->name,
                    " failed to launch: ", cudaGetErrorString(cudaGetLastError()),
                    " (was the library built for this GPU's arch? see CUTLASS_OPS_ARCHS)");
  CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
  last_kernel_slot() = std::string(r.kernel->name) +
                      (r.split_k_slices > 1 ? " split_k=" + std::to_string(r.split_k_slices) : "");
  return output;
}

std::tuple<Tensor, Tensor> conv2d_fused_se_gate_cuda(
    Tensor const& input, Tensor const& weight, std::optional<Tensor> const& scale, Tensor const& identity,
    Tensor const& w1, Tensor const& b1, Tensor const& w2, Tensor const& b2,
    std::optional<Tensor> const& identity_bias, std::optional<Tensor> const& post_bias, bool avgpool,
    std::optional<Tensor> const& h_bias, IntArrayRef stride, IntArrayRef padding) {
  OutputShape out = check_se_gate_inputs(input, weight, scale, identity, w1, b1, w2, b2, identity_bias, post_bias,
                                         h_bias, stride, padding);
  auto dtype = input.scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) {
    return conv2d_fused_se_gate_aten(input, weight, scale, identity, w1, b1, w2, b2, identity_bias, post_bias, avgpool,
                                     h_bias, stride, padding);
  }
  DeviceGuard guard(input.get_device_index());
  int const dev = input.get_device_index();
  std::string why_not;
  bool const conv_fits = weight.size(2) == 3 && weight.size(3) == 3 && stride[0] == 1 && stride[1] == 1 &&
                         padding[0] == 1 && padding[1] == 1;
  if (out.N == 0) {
    why_not = "empty";
  } else if (!conv_fits) {
    why_not = "the kernel takes 3x3 convs with stride 1 and padding 1";
  } else if (!hand_written_kernels_from_env()) {
    why_not = "CUTLASS_OPS_SM90_HALO=0";
  } else if (sm90_policy_from_env() == Sm90Policy::kNever) {
    why_not = "CUTLASS_OPS_SM90=0";
  } else {
    Tensor x = as_nhwc(input), w = as_nhwc(weight), idn = as_nhwc(identity);
    Tensor result = empty({out.N, out.K, out.P, out.Q}, dtype, input.device(), kChannelsLast);
    Tensor pooled = avgpool ? empty(se_gate::pooled_shape(result), dtype, input.device(), kChannelsLast)
                            : empty({0}, dtype, input.device());
    auto f32 = [](std::optional<Tensor> const& t) { return t ? as_float_vector(*t) : Tensor(); };
    auto ptr = [](Tensor& t) -> float const* { return t.defined() ? t.mutable_data_ptr<float>() : nullptr; };
    Tensor scale_f = f32(scale), h_bias_f = f32(h_bias), idb_f = f32(identity_bias), post_f = f32(post_bias);
    Tensor w1f = as_float_vector(w1), b1f = as_float_vector(b1), w2f = as_float_vector(w2), b2f = as_float_vector(b2);
    HaloSeGateArgs a{};
    a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
    a.N = out.N; a.H = input.size(2); a.W = input.size(3); a.C = input.size(1); a.K = out.K;
    a.R = w1.size(0);
    a.input = x.data_ptr(); a.weight = w.data_ptr(); a.identity = idn.data_ptr();
    a.output = result.data_ptr(); a.pooled = avgpool ? pooled.data_ptr() : nullptr;
    a.scale = ptr(scale_f); a.h_bias = ptr(h_bias_f); a.identity_bias = ptr(idb_f); a.post_bias = ptr(post_f);
    a.w1 = ptr(w1f); a.b1 = ptr(b1f); a.w2 = ptr(w2f); a.b2 = ptr(b2f);
    a.programmatic_launch = programmatic_launch_allowed(dev);
    cutlass::Status const status =
        run_halo_se_gate(a, compute_capability(dev), current_cuda_stream(dev), why_not);
    if (status != cutlass::Status::kErrorNotSupported) {
      CUTLASS_OPS_CHECK(status == cutlass::Status::kSuccess, "conv2d_fused_se_gate: kernel launch failed: ",
                        cudaGetErrorString(cudaGetLastError()));
      CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
      se_gate_last_kernel_slot() = std::string("cutlass_ops_conv2d_fused_") + (dtype == kHalf ? "f16" : "bf16") +
                                   "_sm90_halo3x3s1_w16c64k64_se_gate";
      return {result, pooled};
    }
  }
  // The two kernels it fuses: h rounded to the input dtype between them.
  Tensor h = conv2d_fused_cuda(input, weight, std::nullopt, std::nullopt, scale, std::nullopt, stride, padding,
                               false, false);
  auto result = se_gate::se_gate_cuda(h, identity, w1, b1, w2, b2, identity_bias, post_bias, avgpool, h_bias);
  se_gate_last_kernel_slot() = out.N == 0 ? "none (empty)" : "two kernels (" + why_not + ")";
  return result;
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names = built_kernel_names(kKernels, kNumKernels);
  for (KernelEntry const* e : hand_written_kernels()) names.push_back(e->name);
  return names;
}

}  // namespace conv2d_fused
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // The generated kernels of this build (empty in a CPU-only build: not registered there).
  m.def("conv2d_fused_kernels() -> str[]");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_fused_kernels", TORCH_BOX(&cutlass_ops::conv2d_fused::kernel_names));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("conv2d_fused", TORCH_BOX(&cutlass_ops::conv2d_fused::conv2d_fused_cuda));
  m.impl("conv2d_fused_se_gate", TORCH_BOX(&cutlass_ops::conv2d_fused::conv2d_fused_se_gate_cuda));
}
