// CUDA implementations of cutlass_ops::layer_norm_rows and layer_norm_rows_backward (kernels in
// layer_norm_rows_kernel.cu): fp16 and bf16 rows the kernels cover; ATen's otherwise.
#include "common/cuda_device.h"
#include "layer_norm_rows/layer_norm_rows_kernel.h"
#include "layer_norm_rows/layer_norm_rows_op.h"

namespace cutlass_ops {
namespace layer_norm {

std::tuple<Tensor, Tensor, Tensor, Tensor> layer_norm_rows_cuda(Tensor const& x, std::optional<Tensor> const& residual,
                                                                std::optional<Tensor> const& weight,
                                                                std::optional<Tensor> const& bias, double eps) {
  check_inputs(x, residual, weight, bias);
  ScalarType const dtype = x.scalar_type();
  int64_t const cols = x.size(x.dim() - 1);
  if ((dtype != kHalf && dtype != kBFloat16) || cols == 0) return layer_norm_rows_aten(x, residual, weight, bias, eps);
  DeviceGuard guard(x.get_device_index());
  Tensor xc = torch::stable::contiguous(x);
  Tensor rc = residual ? torch::stable::contiguous(*residual) : Tensor();
  KernelParams const p = kernel_params(weight, bias, dtype);  // no cast kernels for a 16-bit model's own
  int64_t const rows = x.numel() / cols;
  Tensor y = empty(x.sizes(), dtype, x.device());
  Tensor s = residual ? empty(x.sizes(), dtype, x.device()) : empty({0}, dtype, x.device());
  Tensor mean = empty({rows}, kFloat, x.device()), rstd = empty({rows}, kFloat, x.device());
  LayerNormArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.rows = rows;
  a.cols = static_cast<int>(cols);
  a.eps = static_cast<float>(eps);
  a.x = xc.data_ptr();
  a.residual = residual ? rc.data_ptr() : nullptr;
  a.weight = weight ? p.weight.data_ptr() : nullptr;
  a.bias = bias ? p.bias.data_ptr() : nullptr;
  a.params_f32 = p.f32;
  a.y = y.data_ptr();
  a.sum = residual ? s.data_ptr() : nullptr;
  a.mean = mean.mutable_data_ptr<float>();
  a.rstd = rstd.mutable_data_ptr<float>();
  if (cols > INT32_MAX || !layer_norm_supported(a)) return layer_norm_rows_aten(x, residual, weight, bias, eps);
  int dev = x.get_device_index();
  cudaError_t err = launch_layer_norm(a, multiprocessor_count(dev), current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "layer_norm_rows: kernel launch failed: ", cudaGetErrorString(err));
  return {y, s, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_rows_backward_cuda(Tensor const& grad_y,
                                                                 std::optional<Tensor> const& grad_sum,
                                                                 Tensor const& s, Tensor const& mean,
                                                                 Tensor const& rstd,
                                                                 std::optional<Tensor> const& weight,
                                                                 bool weight_grad, bool bias_grad) {
  check_backward_inputs(grad_y, grad_sum, s, mean, rstd, weight);
  ScalarType const dtype = s.scalar_type();
  int64_t const cols = s.size(s.dim() - 1), rows = cols > 0 ? s.numel() / cols : 0;
  weight_grad = weight_grad && weight.has_value();
  if ((dtype != kHalf && dtype != kBFloat16) || rows == 0 || cols > INT32_MAX)
    return layer_norm_rows_backward_aten(grad_y, grad_sum, s, mean, rstd, weight, weight_grad, bias_grad);
  DeviceGuard guard(s.get_device_index());
  Tensor gy = torch::stable::contiguous(grad_y), sc = torch::stable::contiguous(s);
  Tensor gs = grad_sum ? torch::stable::contiguous(*grad_sum) : Tensor();
  Tensor mc = torch::stable::contiguous(mean), rc = torch::stable::contiguous(rstd);
  KernelParams const p = kernel_params(weight, std::nullopt, dtype);
  Tensor grad_x = empty(s.sizes(), dtype, s.device());
  LayerNormBackwardArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.rows = rows;
  a.cols = static_cast<int>(cols);
  a.grad_y = gy.data_ptr();
  a.grad_sum = grad_sum ? gs.data_ptr() : nullptr;
  a.s = sc.data_ptr();
  a.mean = mc.const_data_ptr<float>();
  a.rstd = rc.const_data_ptr<float>();
  a.weight = weight ? p.weight.data_ptr() : nullptr;
  a.params_f32 = p.f32;
  a.grad_x = grad_x.data_ptr();
  if (!layer_norm_backward_supported(a))
    return layer_norm_rows_backward_aten(grad_y, grad_sum, s, mean, rstd, weight, weight_grad, bias_grad);
  int dev = s.get_device_index();
  int const sms = multiprocessor_count(dev);
  Tensor partials;
  if (weight_grad || bias_grad) {
    a.partial_rows = layer_norm_backward_partial_rows(a, sms);
    partials = empty({2, a.partial_rows, cols}, kFloat, s.device());
    a.partials = partials.mutable_data_ptr<float>();
  }
  cudaError_t err = launch_layer_norm_backward(a, sms, current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "layer_norm_rows_backward: kernel launch failed: ", cudaGetErrorString(err));
  Tensor none = empty({0}, kFloat, s.device());
  if (!partials.defined()) return {grad_x, none, none};
  // the warps' partial sums, added in one fixed order: (2, cols)
  Tensor sums = torch::stable::sum(partials, IntArrayRef(std::vector<int64_t>{1}), false, std::nullopt);
  return {grad_x, weight_grad ? torch::stable::select(sums, 0, 0) : none,
          bias_grad ? torch::stable::select(sums, 0, 1) : none};
}

}  // namespace layer_norm
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("layer_norm_rows", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_cuda));
  m.impl("layer_norm_rows_backward", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_backward_cuda));
}
