// CUDA implementation of cutlass_ops::layer_norm_rows (kernel in layer_norm_kernel.cu): fp16
// and bf16 rows the kernel covers (layer_norm_supported); ATen's otherwise.
#include "common/cuda_device.h"
#include "layer_norm/layer_norm_kernel.h"
#include "layer_norm/layer_norm_op.h"

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

}  // namespace layer_norm
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("layer_norm_rows", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_cuda));
}
