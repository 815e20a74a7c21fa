// CUDA implementations of cutlass_ops::space_to_depth_conv (kernel in
// space_to_depth_conv_kernel.cu) and space_to_depth_conv_weight_grad
// (space_to_depth_conv_backward_kernel.cu).  fp16/bf16 with 1..16 input channels and 32, 64
// or 128 output channels run the kernels; anything else the ATen composites.
#include <cstdint>

#include "common/cuda_device.h"
#include "space_to_depth_conv/space_to_depth_conv_backward_kernel.h"
#include "space_to_depth_conv/space_to_depth_conv_kernel.h"
#include "space_to_depth_conv/space_to_depth_conv_op.h"

namespace cutlass_ops {
namespace space_to_depth_conv {

namespace {
// The kernels load the weight, the gradient and the saved output 16 bytes at a time.
bool aligned16(Tensor const& t) { return reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0; }
// The kernels index output pixels with 32-bit ints, including a tile's start plus its
// pixels and (weight grad) a grid-stride step past the last tile: keep that headroom.
constexpr int64_t kMaxPixels = INT32_MAX - (int64_t(1) << 24);
}  // namespace

Tensor space_to_depth_conv_cuda(Tensor const& input, Tensor const& weight,
                                std::optional<Tensor> const& post_bias, bool relu) {
  auto shape = check_inputs(input, weight, post_bias);
  auto dtype = input.scalar_type();
  int64_t C = input.size(1), K = weight.size(0);
  if (dtype != kHalf && dtype != kBFloat16) {
    return space_to_depth_conv_aten(input, weight, post_bias, relu);
  }
  DeviceGuard guard(input.get_device_index());
  DType kernel_dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  // The kernel indexes output pixels (N * H/4 * W/4) with 32-bit integers.
  if (!kernel_supports(kernel_dtype, compute_capability(input.get_device_index()), C, K) ||
      shape[0] * shape[2] * shape[3] >= kMaxPixels) {
    return space_to_depth_conv_aten(input, weight, post_bias, relu);
  }
  auto out = empty(shape, dtype, input.device(), kChannelsLast);
  if (out.numel() == 0) return out;
  Tensor w = torch::stable::contiguous(weight);  // (K, 16C, 1, 1): the same bytes in either format
  // The kernel loads the weight 16 bytes at a time (a sliced weight may start unaligned).
  if (!aligned16(w)) w = torch::stable::clone(w);
  Tensor pb = post_bias ? torch::stable::contiguous(to_dtype(*post_bias, kFloat)) : Tensor();

  SpaceToDepthConvArgs a{};
  a.dtype = kernel_dtype;
  a.N = input.size(0); a.C = C; a.H = input.size(2); a.W = input.size(3); a.K = K;
  a.stride_n = input.stride(0); a.stride_c = input.stride(1);
  a.stride_h = input.stride(2); a.stride_w = input.stride(3);
  a.input = input.data_ptr();
  a.weight = w.data_ptr();
  a.output = out.data_ptr();
  a.post_bias = pb.defined() ? pb.mutable_data_ptr<float>() : nullptr;
  a.relu = relu;
  a.programmatic_launch = programmatic_launch_allowed(input.get_device_index());
  cudaError_t err = launch_space_to_depth_conv(a, current_cuda_stream(input.get_device_index()));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "space_to_depth_conv: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

std::tuple<Tensor, Tensor> space_to_depth_conv_weight_grad_cuda(
    Tensor const& grad, Tensor const& input, std::optional<Tensor> const& out,
    std::optional<Tensor> const& post_bias) {
  auto dims = check_weight_grad_inputs(grad, input, out, post_bias);
  int64_t const N = dims[0], C = dims[1], H = dims[2], W = dims[3], K = dims[4];
  auto dtype = input.scalar_type();
  auto fallback = [&] { return space_to_depth_conv_weight_grad_aten(grad, input, out, post_bias); };
  if (dtype != kHalf && dtype != kBFloat16) return fallback();
  DType kernel_dtype = dtype == kHalf ? DType::kF16 : DType::kBF16;
  int const dev = input.get_device_index();
  if (!kernel_supports(kernel_dtype, compute_capability(dev), C, K) || N * (H / kBlock) * (W / kBlock) >= kMaxPixels ||
      N == 0) {
    return fallback();
  }
  auto const cl = kChannelsLast;
  Tensor g = torch::stable::contiguous(grad, cl), o = out ? torch::stable::contiguous(*out, cl) : Tensor();
  if (!aligned16(g) || (o.defined() && !aligned16(o))) return fallback();
  DeviceGuard guard(dev);
  int const blocks = weight_grad_blocks(N, H, W, multiprocessor_count(dev));
  auto partials = empty({blocks, K * kBlock * kBlock * C + 2}, kFloat, input.device());
  auto dw = empty({K, kBlock * kBlock * C, 1, 1}, kFloat, input.device());
  auto sums = empty({2}, kFloat, input.device());
  Tensor pb = post_bias ? torch::stable::contiguous(torch::stable::reshape(to_dtype(*post_bias, kFloat), {1}))
                        : Tensor();

  WeightGradArgs a{};
  a.dtype = kernel_dtype;
  a.N = N; a.C = C; a.H = H; a.W = W; a.K = K;
  a.stride_n = input.stride(0); a.stride_c = input.stride(1);
  a.stride_h = input.stride(2); a.stride_w = input.stride(3);
  a.input = input.data_ptr(); a.grad = g.data_ptr(); a.out = o.defined() ? o.data_ptr() : nullptr;
  a.post_bias = pb.defined() ? pb.mutable_data_ptr<float>() : nullptr;
  a.partials = partials.mutable_data_ptr<float>(); a.grad_weight = dw.mutable_data_ptr<float>();
  a.sums = sums.mutable_data_ptr<float>();
  cudaError_t err = launch_space_to_depth_conv_weight_grad(a, blocks, current_cuda_stream(dev));
  CUTLASS_OPS_CHECK(err == cudaSuccess, "space_to_depth_conv_weight_grad: kernel launch failed: ",
                    cudaGetErrorString(err));
  return {dw, sums};
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("space_to_depth_conv", TORCH_BOX(&cutlass_ops::space_to_depth_conv::space_to_depth_conv_cuda));
  m.impl("space_to_depth_conv_weight_grad",
         TORCH_BOX(&cutlass_ops::space_to_depth_conv::space_to_depth_conv_weight_grad_cuda));
}
