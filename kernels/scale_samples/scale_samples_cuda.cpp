// CUDA implementation of cutlass_ops::scale_samples (kernel in scale_samples_kernel.cu): fp16 and
// bf16 x; ATen's path (scale_samples_op.cpp) for other dtypes.
#include "common/cuda_device.h"
#include "scale_samples/scale_samples_kernel.h"
#include "scale_samples/scale_samples_op.h"

namespace cutlass_ops {
namespace sample_scale {

Tensor scale_samples_cuda(Tensor const& x, Tensor const& scale) {
  check_inputs(x, scale);
  ScalarType const dtype = x.scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) return scale_samples_aten(x, scale);
  int const dev = x.get_device_index();
  DeviceGuard guard(dev);
  Tensor xc = torch::stable::contiguous(x), sc = torch::stable::contiguous(scale);
  Tensor y = empty(x.sizes(), dtype, x.device());
  SampleScaleArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.samples = x.size(0);
  a.per_sample = a.samples > 0 ? x.numel() / a.samples : 0;
  a.x = xc.data_ptr();
  a.scale = sc.const_data_ptr<float>();
  a.y = y.data_ptr();
  cudaError_t err = launch_sample_scale(a, multiprocessor_count(dev), current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "scale_samples: kernel launch failed: ", cudaGetErrorString(err));
  return y;
}

}  // namespace sample_scale
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("scale_samples", TORCH_BOX(&cutlass_ops::sample_scale::scale_samples_cuda));
}
