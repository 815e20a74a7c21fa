// CUDA implementation of cutlass_ops::dw_conv3x3_tokens and layer_norm_dw_conv3x3_tokens (kernels
// in dw_conv3x3_tokens_kernel.cu): fp16 and bf16, all projections in one launch; ATen's path (dw_conv3x3_tokens_op.cpp)
// for other dtypes.
#include "common/cuda_device.h"
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_kernel.h"
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_op.h"

namespace cutlass_ops {
namespace dw_conv {

namespace {
// rows contiguous; images may be apart (views of tokens that skip or keep only the cls row)
Tensor rows_contiguous(Tensor const& t) {
  return t.stride(2) == 1 && (t.size(1) <= 1 || t.stride(1) == t.size(2)) ? t : torch::stable::contiguous(t);
}
long long image_stride(Tensor const& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1) * t.size(2); }

}  // namespace

struct LayerNormArgs {
  std::optional<Tensor> weight, bias;
  double eps;
};

// The kernel launch of both ops (ln: layer_norm_dw_conv3x3_tokens's LayerNorm, where the tiled
// kernel runs; elsewhere the LayerNorm by ATen first, then the convs).
std::vector<Tensor> run_dw_conv(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                std::optional<Tensor> const& bias, IntArrayRef strides,
                                std::optional<Tensor> const& lead, std::optional<LayerNormArgs> const& ln) {
  auto const sizes = check_inputs(x, h, w, weight, bias, strides, lead);
  ScalarType const dtype = x.scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) {
    if (ln) return layer_norm_dw_conv3x3_tokens_aten(x, h, w, ln->weight, ln->bias, ln->eps, weight, bias, strides, lead);
    return dw_conv3x3_tokens_aten(x, h, w, weight, bias, strides, lead);
  }
  DeviceGuard guard(x.get_device_index());
  int64_t const n = x.size(0), c = x.size(2), l0 = lead ? lead->size(1) : 0;
  CUTLASS_OPS_CHECK_VALUE(c <= INT32_MAX && h * w <= INT32_MAX && l0 <= INT32_MAX,
                          "dw_conv3x3_tokens: sizes past int32");
  Tensor xc = rows_contiguous(x);
  Tensor lc = lead ? rows_contiguous(*lead) : Tensor();
  KernelParams const p = kernel_params(weight, bias, dtype);  // contiguous; a 16-bit model's own as they are
  DwConvArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.n = n;
  a.h = static_cast<int>(h);
  a.w = static_cast<int>(w);
  a.c = static_cast<int>(c);
  a.projections = static_cast<int>(sizes.size());
  a.lead = static_cast<int>(l0);
  a.x = xc.data_ptr();
  a.x_image_stride = image_stride(xc);
  a.weight = p.weight.data_ptr();
  a.bias = bias ? p.bias.data_ptr() : nullptr;
  a.params_f32 = p.f32;
  a.lead_tokens = l0 > 0 ? lc.data_ptr() : nullptr;
  a.lead_image_stride = l0 > 0 ? image_stride(lc) : 0;
  std::vector<Tensor> out;
  for (size_t j = 0; j < sizes.size(); ++j) {
    auto const [ho, wo] = sizes[j];
    out.push_back(empty({n, l0 + ho * wo, c}, dtype, x.device()));
    a.stride[j] = static_cast<int>(strides[j]);
    a.ho[j] = static_cast<int>(ho);
    a.wo[j] = static_cast<int>(wo);
    a.y[j] = out.back().data_ptr();
  }
  int dev = x.get_device_index();
  Tensor lnw, lnb;  // (kept alive through the launch)
  if (ln) {
    a.layer_norm = true;
    a.ln_eps = static_cast<float>(ln->eps);
    KernelParams const q = kernel_params(ln->weight, ln->bias, dtype);
    a.ln_params_f32 = q.f32;
    if (ln->weight) lnw = q.weight;
    if (ln->bias) lnb = q.bias;
    a.ln_weight = ln->weight ? lnw.data_ptr() : nullptr;
    a.ln_bias = ln->bias ? lnb.data_ptr() : nullptr;
    if (!dw_conv_tiled(a, multiprocessor_count(dev))) {  // the LayerNorm by ATen, then the convs
      std::optional<Tensor> lead_n;
      if (lead) lead_n = layer_norm_last_dim(*lead, ln->weight, ln->bias, ln->eps);
      return run_dw_conv(layer_norm_last_dim(x, ln->weight, ln->bias, ln->eps), h, w, weight, bias, strides, lead_n,
                         std::nullopt);
    }
  }
  cudaError_t err = launch_dw_conv(a, multiprocessor_count(dev), current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "dw_conv3x3_tokens: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

std::vector<Tensor> dw_conv3x3_tokens_cuda(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                           std::optional<Tensor> const& bias, IntArrayRef strides,
                                           std::optional<Tensor> const& lead) {
  return run_dw_conv(x, h, w, weight, bias, strides, lead, std::nullopt);
}

std::vector<Tensor> layer_norm_dw_conv3x3_tokens_cuda(Tensor const& x, int64_t h, int64_t w,
                                                      std::optional<Tensor> const& ln_weight,
                                                      std::optional<Tensor> const& ln_bias, double eps,
                                                      Tensor const& weight, std::optional<Tensor> const& bias,
                                                      IntArrayRef strides, std::optional<Tensor> const& lead) {
  check_inputs(x, h, w, weight, bias, strides, lead);
  check_layer_norm(x, ln_weight, ln_bias, eps);
  return run_dw_conv(x, h, w, weight, bias, strides, lead, LayerNormArgs{ln_weight, ln_bias, eps});
}

Tensor dw_conv3x3_tokens_backward_input_cuda(std::vector<Tensor> const& grad_y, int64_t h, int64_t w,
                                             Tensor const& weight, IntArrayRef strides) {
  auto const sizes = check_backward_inputs(grad_y, h, w, weight, strides);
  ScalarType const dtype = grad_y[0].scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) return dw_conv3x3_tokens_backward_input_aten(grad_y, h, w, weight, strides);
  int const dev = grad_y[0].get_device_index();
  DeviceGuard guard(dev);
  int64_t const n = grad_y[0].size(0), c = grad_y[0].size(2);
  CUTLASS_OPS_CHECK_VALUE(c <= INT32_MAX && h * w <= INT32_MAX, "dw_conv3x3_tokens_backward_input: sizes past int32");
  KernelParams const p = kernel_params(weight, std::nullopt, dtype);  // a 16-bit model's own weight as it is
  std::vector<Tensor> gc;
  DwConvBackwardArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.n = n;
  a.h = static_cast<int>(h);
  a.w = static_cast<int>(w);
  a.c = static_cast<int>(c);
  a.projections = static_cast<int>(sizes.size());
  for (size_t j = 0; j < sizes.size(); ++j) {
    gc.push_back(rows_contiguous(grad_y[j]));
    a.stride[j] = static_cast<int>(strides[j]);
    a.ho[j] = static_cast<int>(sizes[j].first);
    a.wo[j] = static_cast<int>(sizes[j].second);
    a.grad_y[j] = gc.back().data_ptr();
    a.grad_image_stride[j] = image_stride(gc.back());
  }
  a.weight = p.weight.data_ptr();
  a.params_f32 = p.f32;
  Tensor grad_x = empty({n, h * w, c}, dtype, grad_y[0].device());
  a.grad_x = grad_x.data_ptr();
  cudaError_t err = launch_dw_conv_backward_input(a, multiprocessor_count(dev), current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "dw_conv3x3_tokens_backward_input: kernel launch failed: ",
                    cudaGetErrorString(err));
  return grad_x;
}

}  // namespace dw_conv
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("dw_conv3x3_tokens", TORCH_BOX(&cutlass_ops::dw_conv::dw_conv3x3_tokens_cuda));
  m.impl("dw_conv3x3_tokens_backward_input",
         TORCH_BOX(&cutlass_ops::dw_conv::dw_conv3x3_tokens_backward_input_cuda));
  m.impl("layer_norm_dw_conv3x3_tokens", TORCH_BOX(&cutlass_ops::dw_conv::layer_norm_dw_conv3x3_tokens_cuda));
}
