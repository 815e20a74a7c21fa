// cutlass_ops::space_to_depth_conv: SpaceToDepth(4) + 1x1 conv + ReLU + post_bias (a ResNet
// stem) from NCHW input.  Schema, checks and the CPU (ATen) implementation; CUDA in
// space_to_depth_conv_cuda.cpp, fake and autograd in cutlass_ops/.
#include "space_to_depth_conv/space_to_depth_conv_op.h"

#include <torch/library.h>

namespace cutlass_ops {
namespace space_to_depth_conv {

std::vector<int64_t> check_inputs(at::Tensor const& input, at::Tensor const& weight,
                                  c10::optional<at::Tensor> const& post_bias) {
  TORCH_CHECK_VALUE(input.dim() == 4, "space_to_depth_conv: input must be 4-D (N, C, H, W), got ",
                    input.dim(), "-D");
  TORCH_CHECK_VALUE(at::isFloatingType(input.scalar_type()),
                    "space_to_depth_conv: input must be floating, got ", input.scalar_type());
  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  TORCH_CHECK_VALUE(H % kBlock == 0 && W % kBlock == 0,
                    "space_to_depth_conv: input height and width must be multiples of ", kBlock,
                    ", got ", H, "x", W);
  TORCH_CHECK_VALUE(weight.dim() == 4 && weight.size(1) == kBlock * kBlock * C &&
                        weight.size(2) == 1 && weight.size(3) == 1,
                    "space_to_depth_conv: weight must be (K, ", kBlock * kBlock * C,
                    ", 1, 1) for ", C, " input channels, got ", weight.sizes());
  TORCH_CHECK_VALUE(weight.scalar_type() == input.scalar_type(), "space_to_depth_conv: weight dtype ",
                    weight.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(weight.device() == input.device(), "space_to_depth_conv: weight is on ",
                    weight.device(), " but input is on ", input.device());
  if (post_bias) {
    TORCH_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1,
                      "space_to_depth_conv: post_bias must be a scalar tensor, got ", post_bias->sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(post_bias->scalar_type()),
                      "space_to_depth_conv: post_bias must be floating, got ", post_bias->scalar_type());
    TORCH_CHECK_VALUE(post_bias->device() == input.device(), "space_to_depth_conv: post_bias is on ",
                      post_bias->device(), " but input is on ", input.device());
  }
  return {N, weight.size(0), H / kBlock, W / kBlock};
}

at::Tensor space_to_depth_conv_aten(at::Tensor const& input, at::Tensor const& weight,
                                    c10::optional<at::Tensor> const& post_bias, bool relu) {
  auto shape = check_inputs(input, weight, post_bias);
  int64_t N = input.size(0), C = input.size(1), P = shape[2], Q = shape[3];
  auto compute = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // New channel index dy*4C + dx*C + c.
  auto s2d = input.to(compute)
                 .reshape({N, C, P, kBlock, Q, kBlock})
                 .permute({0, 3, 5, 1, 2, 4})
                 .reshape({N, kBlock * kBlock * C, P, Q});
  auto y = at::conv2d(s2d, weight.to(compute));
  if (relu) y = at::relu(y);
  if (post_bias) y = y + post_bias->to(compute).reshape({});
  auto out = at::empty(shape, input.options().memory_format(at::MemoryFormat::ChannelsLast));
  out.copy_(y);
  return out;
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("space_to_depth_conv(Tensor input, Tensor weight, Tensor? post_bias=None, bool relu=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("space_to_depth_conv", &cutlass_ops::space_to_depth_conv::space_to_depth_conv_aten);
}
