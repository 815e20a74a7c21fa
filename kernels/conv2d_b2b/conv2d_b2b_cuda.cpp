// CUDA implementation of cutlass_ops::conv2d_b2b: the generated B2B instance whose dtype, K0
// and K1 match, on NHWC tensors; anything no instance covers (other channel counts or dtypes,
// channels not a multiple of 8, relu0/relu1 off, over 2^31 elements) takes the ATen
// composite with a one-time warning.
#include <cstdint>

#include "common/cuda_device.h"
#include "common/kernel_table.h"
#include "conv2d_b2b/conv2d_b2b_args.h"
#include "conv2d_b2b/conv2d_b2b_op.h"

namespace cutlass_ops {
namespace conv2d_b2b {

namespace {

bool aligned16(void const* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// Why no instance runs this problem ("" when one does); the instance in *entry.
std::string why_not(Shape const& s, ScalarType dtype, bool relu0, bool relu1, int cc, KernelEntry const** entry) {
  if (cc < 80) return "B2B instances need sm80 or newer";
  if (dtype != kHalf && dtype != kBFloat16) return "B2B instances are float16/bfloat16 only";
  if (!relu0 || !relu1) return "B2B instances apply ReLU after both convs";
  if (s.C % 8 != 0) return "input channels are not a multiple of 8";
  int64_t const elems[] = {s.N * s.C * s.H * s.W, s.N * s.K0 * s.P * s.Q, s.N * s.K1 * s.P * s.Q};
  for (int64_t e : elems) {
    if (e >= INT32_MAX) return "over 2^31 elements";
  }
  DType const d = dtype == kHalf ? DType::kF16 : DType::kBF16;
  std::string built;
  for (int i = 0; i < kNumKernels; ++i) {
    KernelEntry const& k = kKernels[i];
    if (k.run == nullptr || k.dtype != d) continue;
    if (k.k0 == s.K0 && k.k1 == s.K1) {
      *entry = &k;
      return "";
    }
    built += (built.empty() ? "" : ", ") + std::to_string(k.k0) + "->" + std::to_string(k.k1);
  }
  return "no B2B instance for " + std::to_string(s.K0) + "->" + std::to_string(s.K1) + " channels (built: " +
         (built.empty() ? std::string("none") : built) + ")";
}

}  // namespace

Tensor conv2d_b2b_cuda(Tensor const& input, Tensor const& w0, std::optional<Tensor> const& bias0, Tensor const& w1,
                       std::optional<Tensor> const& bias1, IntArrayRef stride, IntArrayRef padding, bool relu0,
                       bool relu1) {
  Shape s = check_inputs(input, w0, bias0, w1, bias1, stride, padding);
  int dev = input.get_device_index();
  DeviceGuard guard(dev);
  auto dtype = input.scalar_type();
  KernelEntry const* entry = nullptr;
  std::string const why = why_not(s, dtype, relu0, relu1, compute_capability(dev), &entry);
  if (entry == nullptr) {
    if (dtype == kHalf || dtype == kBFloat16) {
      CUTLASS_OPS_WARN_ONCE("cutlass_ops.conv2d_b2b: ", why, "; using two ATen convs (not fused)");
    }
    return conv2d_b2b_aten(input, w0, bias0, w1, bias1, stride, padding, relu0, relu1);
  }
  Tensor output = empty({s.N, s.K1, s.P, s.Q}, dtype, input.device(), kChannelsLast);
  if (output.numel() == 0) {
    last_kernel_slot() = "none (empty)";
    return output;
  }
  auto cl = kChannelsLast;
  Tensor x = torch::stable::contiguous(input, cl), w0c = torch::stable::contiguous(w0, cl),
         w1c = torch::stable::contiguous(w1, cl);
  // bias0 in float32 (the first epilogue's vector), bias1 in the input dtype (the second
  // epilogue's C operand, broadcast); zeros for an absent one.
  Tensor b0 = bias0 ? torch::stable::clone(to_dtype(*bias0, kFloat)) : zeros({s.K0}, kFloat, input.device());
  Tensor b1 = bias1 ? torch::stable::clone(to_dtype(*bias1, dtype)) : zeros({s.K1}, dtype, input.device());
  for (Tensor const* t : {&x, &w0c, &w1c, &b0, &b1}) {
    if (!aligned16(t->data_ptr())) {
      CUTLASS_OPS_WARN_ONCE("cutlass_ops.conv2d_b2b: a tensor's data is not 16-byte aligned; using two ATen "
                            "convs (not fused)");
      return conv2d_b2b_aten(input, w0, bias0, w1, bias1, stride, padding, relu0, relu1);
    }
  }
  Conv2dB2bArgs a{};
  a.dtype = entry->dtype;
  a.N = int(s.N); a.H = int(s.H); a.W = int(s.W); a.C = int(s.C);
  a.K0 = int(s.K0); a.R = int(s.R); a.S = int(s.S); a.P = int(s.P); a.Q = int(s.Q); a.K1 = int(s.K1);
  a.pad_h = int(padding[0]); a.pad_w = int(padding[1]); a.stride_h = int(stride[0]); a.stride_w = int(stride[1]);
  a.input = x.data_ptr();
  a.w0 = w0c.data_ptr();
  a.bias0 = b0.mutable_data_ptr<float>();
  a.w1 = w1c.data_ptr();
  a.bias1 = b1.data_ptr();
  a.output = output.data_ptr();
  cutlass::Status status = entry->run(a, current_cuda_stream(dev));
  if (status == cutlass::Status::kErrorInvalidProblem || status == cutlass::Status::kErrorNotSupported ||
      status == cutlass::Status::kErrorMisalignedOperand) {
    // CUTLASS's can_implement refused the problem before any launch: the composite is right.
    CUTLASS_OPS_WARN_ONCE("cutlass_ops.conv2d_b2b: ", entry->name, " cannot run this problem (",
                          cutlass::cutlassGetStatusString(status), "); using two ATen convs (not fused)");
    return conv2d_b2b_aten(input, w0, bias0, w1, bias1, stride, padding, relu0, relu1);
  }
  CUTLASS_OPS_CHECK(status == cutlass::Status::kSuccess, "conv2d_b2b: kernel ", entry->name, " failed: ",
                    cutlass::cutlassGetStatusString(status), " / ", cudaGetErrorString(cudaGetLastError()),
                    " (was the library built for this GPU's arch? see CUTLASS_OPS_ARCHS)");
  CUTLASS_OPS_CUDA_CHECK(cudaGetLastError());
  last_kernel_slot() = entry->name;
  return output;
}

std::vector<std::string> kernel_names() { return built_kernel_names(kKernels, kNumKernels); }

}  // namespace conv2d_b2b
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  // The generated B2B kernels of this build (not registered in a CPU-only build).
  m.def("conv2d_b2b_kernels() -> str[]");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CompositeExplicitAutograd, m) {
  m.impl("conv2d_b2b_kernels", TORCH_BOX(&cutlass_ops::conv2d_b2b::kernel_names));
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("conv2d_b2b", TORCH_BOX(&cutlass_ops::conv2d_b2b::conv2d_b2b_cuda));
}
