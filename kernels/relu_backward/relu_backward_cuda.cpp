// CUDA implementation of cutlass_ops::relu_backward (kernel in relu_backward_kernel.cu).
#include "common/cuda_device.h"
#include "relu_backward/relu_backward_kernel.h"
#include "relu_backward/relu_backward_op.h"

namespace cutlass_ops {
namespace relu_backward {

std::tuple<Tensor, Tensor> relu_backward_cuda(Tensor const& grad, Tensor const& out,
                                              std::optional<Tensor> const& post_bias) {
  check_inputs(grad, out, post_bias);
  auto dtype = out.scalar_type();
  if (dtype != kHalf && dtype != kBFloat16) return relu_backward_aten(grad, out, post_bias);
  DeviceGuard guard(out.get_device_index());
  // Elementwise: any layout works as long as grad, out and grad_z share it; the op's
  // outputs are channels_last, so that is the layout that costs no copy.
  auto format = grad_z_format(out);
  auto grad_z = empty(out.sizes(), dtype, out.device(), format);
  if (out.numel() == 0) return {grad_z, zeros({2}, kFloat, out.device())};
  Tensor g = torch::stable::contiguous(grad, format), o = torch::stable::contiguous(out, format);
  int dev = out.get_device_index();
  int blocks = relu_backward_blocks(out.numel(), multiprocessor_count(dev));
  // The per-block sums, then one word the kernel counts finished blocks in.
  auto scratch = empty({2 * blocks + 1}, kFloat, out.device());
  auto sums = empty({2}, kFloat, out.device());
  Tensor pb = post_bias ? torch::stable::contiguous(torch::stable::reshape(to_dtype(*post_bias, kFloat), {1}))
                        : Tensor();
  ReluBackwardArgs a{};
  a.dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  a.numel = out.numel();
  a.grad = g.data_ptr(); a.out = o.data_ptr(); a.grad_z = grad_z.data_ptr();
  a.post_bias = pb.defined() ? pb.mutable_data_ptr<float>() : nullptr;
  a.partial_sums = scratch.mutable_data_ptr<float>();
  a.counter = reinterpret_cast<unsigned*>(scratch.mutable_data_ptr<float>() + 2 * blocks);
  a.sums = sums.mutable_data_ptr<float>();
  cudaError_t err = launch_relu_backward(a, blocks, current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "relu_backward: kernel launch failed: ", cudaGetErrorString(err));
  return {grad_z, sums};
}

}  // namespace relu_backward
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("relu_backward", TORCH_BOX(&cutlass_ops::relu_backward::relu_backward_cuda));
}
