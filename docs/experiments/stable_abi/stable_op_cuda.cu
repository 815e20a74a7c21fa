// CUDA half of the PoC: the cutlass_ops entry-point pattern (device guard,
// current stream, output allocation, launch, launch check) using only the
// stable ABI.  Compiled with nvcc and -DUSE_CUDA (which exposes the CUDA
// parts of the C shim: aoti_torch_get_current_cuda_stream, STD_CUDA_CHECK's
// torch_c10_cuda_check_msg, ...), linked against libtorch_cuda.so.
// No GPU is needed to load it: registration does not touch the device.
#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/macros.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

using torch::stable::Tensor;
using torch::headeronly::ScalarType;

namespace {
__global__ void relu_backward_kernel(const float* g, const float* o, float* r, int64_t n) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) r[i] = o[i] > 0.f ? g[i] : 0.f;
}

// c10::cuda::getCurrentCUDAStream(dev).stream() equivalent.
cudaStream_t current_stream(int32_t device) {
  void* s = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &s));
  return static_cast<cudaStream_t>(s);
}
}  // namespace

namespace cutlass_ops_stable {
Tensor relu_backward_cuda(Tensor grad, Tensor out) {
  STD_TORCH_CHECK(grad.is_cuda() && out.is_cuda(), "relu_backward: CUDA tensors expected");
  STD_TORCH_CHECK(grad.scalar_type() == ScalarType::Float && out.scalar_type() == ScalarType::Float,
                  "relu_backward: expected float32");
  STD_TORCH_CHECK(grad.numel() == out.numel(), "relu_backward: size mismatch");
  const int32_t dev = grad.get_device_index();
  torch::stable::accelerator::DeviceGuard guard(dev);  // c10::cuda::CUDAGuard equivalent
  Tensor g = torch::stable::contiguous(grad);
  Tensor o = torch::stable::contiguous(out);
  Tensor r = torch::stable::empty_like(g);
  const int64_t n = g.numel();
  if (n == 0) return r;
  const int threads = 256;
  relu_backward_kernel<<<(n + threads - 1) / threads, threads, 0, current_stream(dev)>>>(
      g.const_data_ptr<float>(), o.const_data_ptr<float>(), r.mutable_data_ptr<float>(), n);
  STD_CUDA_KERNEL_LAUNCH_CHECK();  // C10_CUDA_KERNEL_LAUNCH_CHECK equivalent
  return r;
}
}  // namespace cutlass_ops_stable

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops_stable, CUDA, m) {
  m.impl("relu_backward", TORCH_BOX(&cutlass_ops_stable::relu_backward_cuda));
}
