// CUDA implementation of cutlass_ops::conv_embed (kernel in conv_embed_kernel.cu): fp16/bf16 with
// C*R <= 32, S <= 8 and K 32, 64 or 128 run the kernel; anything else ATen's path (conv_embed_op.cpp).
#include <cstdint>

#include "common/cuda_device.h"
#include "conv_embed/conv_embed_kernel.h"
#include "conv_embed/conv_embed_op.h"

namespace cutlass_ops {
namespace conv_embed {

Tensor conv_embed_cuda(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                       IntArrayRef stride, IntArrayRef padding, bool layer_norm, std::optional<Tensor> const& ln_weight,
                       std::optional<Tensor> const& ln_bias, double eps) {
  OutputShape o = check_inputs(input, weight, bias, stride, padding, layer_norm, ln_weight, ln_bias, eps);
  ScalarType const dtype = input.scalar_type();
  auto fallback = [&] {
    return conv_embed_aten(input, weight, bias, stride, padding, layer_norm, ln_weight, ln_bias, eps);
  };
  if (dtype != kHalf && dtype != kBFloat16) return fallback();
  int const dev = input.get_device_index();
  DeviceGuard guard(dev);
  DType const kdt = dtype == kHalf ? DType::kF16 : DType::kBF16;
  int64_t const C = input.size(1), R = weight.size(2), S = weight.size(3);
  int64_t const pixels = o.N * o.P * o.Q;
  // The kernel indexes pixels, rows and columns with 32-bit ints (and a tile past the last pixel).
  constexpr int64_t kGeometryLimit = int64_t(1) << 20;
  if (C > 256 || R > 256 || S > 256 || o.K > 256 || stride[0] > kGeometryLimit || stride[1] > kGeometryLimit ||
      padding[0] > kGeometryLimit || padding[1] > kGeometryLimit ||
      !kernel_supports(kdt, compute_capability(dev), static_cast<int>(C), static_cast<int>(R), static_cast<int>(S),
                       static_cast<int>(o.K)) ||
      pixels >= INT32_MAX - 4096 || input.size(2) >= INT32_MAX / 2 || input.size(3) >= INT32_MAX / 2)
    return fallback();
  Tensor out = empty({o.N, o.P * o.Q, o.K}, dtype, input.device());
  if (out.numel() == 0) return out;
  auto as_float = [](std::optional<Tensor> const& t) {
    return t ? torch::stable::contiguous(to_dtype(*t, kFloat)) : Tensor();
  };
  Tensor b = as_float(bias), g = as_float(ln_weight), beta = as_float(ln_bias);

  ConvEmbedArgs a{};
  a.dtype = kdt;
  a.N = static_cast<int>(o.N); a.C = static_cast<int>(C);
  a.H = static_cast<int>(input.size(2)); a.W = static_cast<int>(input.size(3));
  a.K = static_cast<int>(o.K); a.R = static_cast<int>(R); a.S = static_cast<int>(S);
  a.stride_h = static_cast<int>(stride[0]); a.stride_w = static_cast<int>(stride[1]);
  a.pad_h = static_cast<int>(padding[0]); a.pad_w = static_cast<int>(padding[1]);
  a.P = static_cast<int>(o.P); a.Q = static_cast<int>(o.Q);
  for (int d = 0; d < 4; ++d) {
    a.in_stride[d] = input.stride(d);
    a.w_stride[d] = weight.stride(d);
  }
  a.input = input.data_ptr();
  a.weight = weight.data_ptr();
  a.bias = b.defined() ? b.const_data_ptr<float>() : nullptr;
  a.ln_weight = g.defined() ? g.const_data_ptr<float>() : nullptr;
  a.ln_bias = beta.defined() ? beta.const_data_ptr<float>() : nullptr;
  a.layer_norm = layer_norm;
  a.eps = static_cast<float>(eps);
  a.output = out.data_ptr();
  a.programmatic_launch = programmatic_launch_allowed(dev);
  a.paired_loads = a.in_stride[3] == 1 && a.in_stride[0] % 2 == 0 && a.in_stride[1] % 2 == 0 &&
                   a.in_stride[2] % 2 == 0 && a.stride_w % 2 == 0 && a.pad_w % 2 == 0 && a.W % 2 == 0 &&
                   reinterpret_cast<std::uintptr_t>(a.input) % 4 == 0;
  cudaError_t err = launch_conv_embed(a, multiprocessor_count(dev), current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "conv_embed: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace conv_embed
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("conv_embed", TORCH_BOX(&cutlass_ops::conv_embed::conv_embed_cuda));
}
