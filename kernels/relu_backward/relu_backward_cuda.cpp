// CUDA implementation of cutlass_ops::relu_backward (kernel in relu_backward_kernel.cu).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common/cuda_device.h"
#include "relu_backward/relu_backward_kernel.h"
#include "relu_backward/relu_backward_op.h"

namespace cutlass_ops {
namespace relu_backward {

std::tuple<at::Tensor, at::Tensor> relu_backward_cuda(at::Tensor const& grad, at::Tensor const& out,
                                                      c10::optional<at::Tensor> const& post_bias) {
  check_inputs(grad, out, post_bias);
  auto dtype = out.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16) return relu_backward_aten(grad, out, post_bias);
  c10::cuda::CUDAGuard guard(out.device());
  // Elementwise: any layout works as long as grad, out and grad_z share it; the op's
  // outputs are channels_last, so that is the layout that costs no copy.
  auto format = grad_z_format(out);
  auto grad_z = at::empty(out.sizes(), out.options().memory_format(format));
  if (out.numel() == 0) return {grad_z, at::zeros({2}, out.options().dtype(at::kFloat))};
  at::Tensor g = grad.contiguous(format), o = out.contiguous(format);
  int dev = out.device().index();
  int blocks = relu_backward_blocks(out.numel(), multiprocessor_count(dev));
  // The per-block sums, then one word the kernel counts finished blocks in.
  auto scratch = at::empty({2 * blocks + 1}, out.options().dtype(at::kFloat));
  auto sums = at::empty({2}, out.options().dtype(at::kFloat));
  at::Tensor pb = post_bias ? post_bias->to(at::kFloat).reshape({1}).contiguous() : at::Tensor();
  ReluBackwardArgs a{};
  a.dtype = dtype == at::kHalf ? DType::kF16 : DType::kBF16;
  a.numel = out.numel();
  a.grad = g.data_ptr(); a.out = o.data_ptr(); a.grad_z = grad_z.data_ptr();
  a.post_bias = pb.defined() ? pb.data_ptr<float>() : nullptr;
  a.partial_sums = scratch.data_ptr<float>();
  a.counter = reinterpret_cast<unsigned*>(scratch.data_ptr<float>() + 2 * blocks);
  a.sums = sums.data_ptr<float>();
  cudaError_t err = launch_relu_backward(a, blocks, c10::cuda::getCurrentCUDAStream(dev).stream());
  TORCH_CHECK(err == cudaSuccess, "relu_backward: kernel launch failed: ", cudaGetErrorString(err));
  return {grad_z, sums};
}

}  // namespace relu_backward
}  // namespace cutlass_ops

TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("relu_backward", &cutlass_ops::relu_backward::relu_backward_cuda);
}
