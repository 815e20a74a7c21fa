// CUDA implementations of cutlass_ops::space_to_depth_conv (kernel in
// space_to_depth_conv_kernel.cu) and space_to_depth_conv_weight_grad
// (space_to_depth_conv_backward_kernel.cu).  fp16/bf16 with 1..16 input channels and 32, 64
// or 128 output channels run the kernels; anything else the ATen composites.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "common/cuda_device.h"
#include "space_to_depth_conv/space_to_depth_conv_backward_kernel.h"
#include "space_to_depth_conv/space_to_depth_conv_kernel.h"
#include "space_to_depth_conv/space_to_depth_conv_op.h"

namespace cutlass_ops {
namespace space_to_depth_conv {

namespace {
// The kernels load the weight, the gradient and the saved output 16 bytes at a time.
bool aligned16(at::Tensor const& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }
// The kernels index output pixels with 32-bit ints, including a tile's start plus its
// pixels and (weight grad) a grid-stride step past the last tile: keep that headroom.
constexpr int64_t kMaxPixels = INT32_MAX - (int64_t(1) << 24);
}  // namespace

at::Tensor space_to_depth_conv_cuda(at::Tensor const& input, at::Tensor const& weight,
                                    c10::optional<at::Tensor> const& post_bias, bool relu) {
  auto shape = check_inputs(input, weight, post_bias);
  auto dtype = input.scalar_type();
  int64_t C = input.size(1), K = weight.size(0);
  if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return space_to_depth_conv_aten(input, weight, post_bias, relu);
  }
  c10::cuda::CUDAGuard guard(input.device());
  DType kernel_dtype = dtype == at::kHalf ? DType::kF16 : DType::kBF16;
  // The kernel indexes output pixels (N * H/4 * W/4) with 32-bit integers.
  if (!kernel_supports(kernel_dtype, compute_capability(input.device().index()), C, K) ||
      shape[0] * shape[2] * shape[3] >= kMaxPixels) {
    return space_to_depth_conv_aten(input, weight, post_bias, relu);
  }
  auto out = at::empty(shape, input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  at::Tensor w = weight.contiguous();  // (K, 16C, 1, 1): the same bytes in either format
  // The kernel loads the weight 16 bytes at a time (a sliced weight may start unaligned).
  if (!aligned16(w)) w = w.clone();
  at::Tensor pb = post_bias ? post_bias->to(at::kFloat).contiguous() : at::Tensor();

  SpaceToDepthConvArgs a{};
  a.dtype = kernel_dtype;
  a.N = input.size(0); a.C = C; a.H = input.size(2); a.W = input.size(3); a.K = K;
  a.stride_n = input.stride(0); a.stride_c = input.stride(1);
  a.stride_h = input.stride(2); a.stride_w = input.stride(3);
  a.input = input.data_ptr();
  a.weight = w.data_ptr();
  a.output = out.data_ptr();
  a.post_bias = pb.defined() ? pb.data_ptr<float>() : nullptr;
  a.relu = relu;
  a.programmatic_launch = programmatic_launch_allowed(input.device().index());
  cudaError_t err = launch_space_to_depth_conv(a, c10::cuda::getCurrentCUDAStream(input.device().index()).stream());
  TORCH_CHECK(err == cudaSuccess, "space_to_depth_conv: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

std::tuple<at::Tensor, at::Tensor> space_to_depth_conv_weight_grad_cuda(
    at::Tensor const& grad, at::Tensor const& input, c10::optional<at::Tensor> const& out,
    c10::optional<at::Tensor> const& post_bias) {
  auto dims = check_weight_grad_inputs(grad, input, out, post_bias);
  int64_t const N = dims[0], C = dims[1], H = dims[2], W = dims[3], K = dims[4];
  auto dtype = input.scalar_type();
  auto fallback = [&] { return space_to_depth_conv_weight_grad_aten(grad, input, out, post_bias); };
  if (dtype != at::kHalf && dtype != at::kBFloat16) return fallback();
  DType kernel_dtype = dtype == at::kHalf ? DType::kF16 : DType::kBF16;
  int const dev = input.device().index();
  if (!kernel_supports(kernel_dtype, compute_capability(dev), C, K) || N * (H / kBlock) * (W / kBlock) >= kMaxPixels ||
      N == 0) {
    return fallback();
  }
  auto const cl = at::MemoryFormat::ChannelsLast;
  at::Tensor g = grad.contiguous(cl), o = out ? out->contiguous(cl) : at::Tensor();
  if (!aligned16(g) || (o.defined() && !aligned16(o))) return fallback();
  c10::cuda::CUDAGuard guard(input.device());
  auto f32 = input.options().dtype(at::kFloat);
  int const blocks = weight_grad_blocks(N, H, W, multiprocessor_count(dev));
  auto partials = at::empty({blocks, K * kBlock * kBlock * C + 2}, f32);
  auto dw = at::empty({K, kBlock * kBlock * C, 1, 1}, f32);
  auto sums = at::empty({2}, f32);
  at::Tensor pb = post_bias ? post_bias->to(at::kFloat).reshape({1}).contiguous() : at::Tensor();

  WeightGradArgs a{};
  a.dtype = kernel_dtype;
  a.N = N; a.C = C; a.H = H; a.W = W; a.K = K;
  a.stride_n = input.stride(0); a.stride_c = input.stride(1);
  a.stride_h = input.stride(2); a.stride_w = input.stride(3);
  a.input = input.data_ptr(); a.grad = g.data_ptr(); a.out = o.defined() ? o.data_ptr() : nullptr;
  a.post_bias = pb.defined() ? pb.data_ptr<float>() : nullptr;
  a.partials = partials.data_ptr<float>(); a.grad_weight = dw.data_ptr<float>(); a.sums = sums.data_ptr<float>();
  cudaError_t err = launch_space_to_depth_conv_weight_grad(a, blocks, c10::cuda::getCurrentCUDAStream(dev).stream());
  TORCH_CHECK(err == cudaSuccess, "space_to_depth_conv_weight_grad: kernel launch failed: ", cudaGetErrorString(err));
  return {dw, sums};
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops

TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("space_to_depth_conv", &cutlass_ops::space_to_depth_conv::space_to_depth_conv_cuda);
  m.impl("space_to_depth_conv_weight_grad", &cutlass_ops::space_to_depth_conv::space_to_depth_conv_weight_grad_cuda);
}
