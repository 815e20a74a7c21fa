// cutlass_ops::space_to_depth_conv: SpaceToDepth(4) + 1x1 conv + ReLU + post_bias (a ResNet
// stem) from NCHW input, and space_to_depth_conv_weight_grad, its backward when the input
// needs no gradient.  Schemas, checks and the CPU (ATen) implementations; CUDA in
// space_to_depth_conv_cuda.cpp, fakes and autograd in cutlass_ops/.
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

std::vector<int64_t> check_weight_grad_inputs(at::Tensor const& grad, at::Tensor const& input,
                                              c10::optional<at::Tensor> const& out,
                                              c10::optional<at::Tensor> const& post_bias) {
  char const* op = "space_to_depth_conv_weight_grad";
  TORCH_CHECK_VALUE(input.dim() == 4 && grad.dim() == 4, op, ": input and grad must be 4-D, got ", input.dim(),
                    "-D and ", grad.dim(), "-D");
  TORCH_CHECK_VALUE(at::isFloatingType(input.scalar_type()), op, ": input must be floating, got ",
                    input.scalar_type());
  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3), K = grad.size(1);
  TORCH_CHECK_VALUE(H % kBlock == 0 && W % kBlock == 0, op, ": input height and width must be multiples of ",
                    kBlock, ", got ", H, "x", W);
  TORCH_CHECK_VALUE(grad.size(0) == N && grad.size(2) == H / kBlock && grad.size(3) == W / kBlock, op,
                    ": grad must be (", N, ", K, ", H / kBlock, ", ", W / kBlock, ") for input ", input.sizes(),
                    ", got ", grad.sizes());
  TORCH_CHECK_VALUE(grad.scalar_type() == input.scalar_type(), op, ": grad dtype ", grad.scalar_type(),
                    " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(grad.device() == input.device(), op, ": grad is on ", grad.device(), " but input is on ",
                    input.device());
  if (out) {
    TORCH_CHECK_VALUE(out->sizes() == grad.sizes(), op, ": out shape ", out->sizes(), " differs from grad shape ",
                      grad.sizes());
    TORCH_CHECK_VALUE(out->scalar_type() == grad.scalar_type(), op, ": out dtype ", out->scalar_type(),
                      " differs from grad dtype ", grad.scalar_type());
    TORCH_CHECK_VALUE(out->device() == input.device(), op, ": out is on ", out->device(), " but input is on ",
                      input.device());
  }
  if (post_bias) {
    TORCH_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1, op,
                      ": post_bias must be a scalar tensor, got ", post_bias->sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(post_bias->scalar_type()), op, ": post_bias must be floating, got ",
                      post_bias->scalar_type());
    TORCH_CHECK_VALUE(post_bias->device() == input.device(), op, ": post_bias is on ", post_bias->device(),
                      " but input is on ", input.device());
  }
  return {N, C, H, W, K};
}

std::tuple<at::Tensor, at::Tensor> space_to_depth_conv_weight_grad_aten(
    at::Tensor const& grad, at::Tensor const& input, c10::optional<at::Tensor> const& out,
    c10::optional<at::Tensor> const& post_bias) {
  auto dims = check_weight_grad_inputs(grad, input, out, post_bias);
  int64_t N = dims[0], C = dims[1], P = dims[2] / kBlock, Q = dims[3] / kBlock, K = dims[4];
  auto acc = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor g = grad.to(acc), gz = g;
  if (out) {  // the ReLU mask from the saved output, as relu_backward
    auto active = post_bias ? out->ne(post_bias->to(out->scalar_type()).reshape({})) : out->gt(0);
    gz = at::where(active, g, at::zeros({}, g.options()));
  }
  auto sums = at::stack({g.sum(), gz.sum()});
  auto patches = input.to(acc).reshape({N, C, P, kBlock, Q, kBlock}).permute({0, 2, 4, 3, 5, 1})
                     .reshape({N * P * Q, kBlock * kBlock * C});
  auto dw = gz.permute({0, 2, 3, 1}).reshape({N * P * Q, K}).t().mm(patches);
  return {dw.reshape({K, kBlock * kBlock * C, 1, 1}), sums};
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("space_to_depth_conv(Tensor input, Tensor weight, Tensor? post_bias=None, bool relu=False) -> Tensor");
  m.def("space_to_depth_conv_weight_grad(Tensor grad, Tensor input, Tensor? out=None, Tensor? post_bias=None) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("space_to_depth_conv", &cutlass_ops::space_to_depth_conv::space_to_depth_conv_aten);
  m.impl("space_to_depth_conv_weight_grad", &cutlass_ops::space_to_depth_conv::space_to_depth_conv_weight_grad_aten);
}
