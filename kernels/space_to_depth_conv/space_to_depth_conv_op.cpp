// cutlass_ops::space_to_depth_conv: SpaceToDepth(4) + 1x1 conv + ReLU + post_bias (a ResNet
// stem) from NCHW input, and space_to_depth_conv_weight_grad, its backward when the input
// needs no gradient.  Schemas, checks and the CPU (ATen) implementations; CUDA in
// space_to_depth_conv_cuda.cpp, fakes and autograd in cutlass_ops/.
#include "space_to_depth_conv/space_to_depth_conv_op.h"

namespace cutlass_ops {
namespace space_to_depth_conv {

std::vector<int64_t> check_inputs(Tensor const& input, Tensor const& weight,
                                  std::optional<Tensor> const& post_bias) {
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4, "space_to_depth_conv: input must be 4-D (N, C, H, W), got ",
                          input.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(input.scalar_type()),
                          "space_to_depth_conv: input must be floating, got ", input.scalar_type());
  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3);
  CUTLASS_OPS_CHECK_VALUE(H % kBlock == 0 && W % kBlock == 0,
                          "space_to_depth_conv: input height and width must be multiples of ", kBlock,
                          ", got ", H, "x", W);
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4 && weight.size(1) == kBlock * kBlock * C &&
                              weight.size(2) == 1 && weight.size(3) == 1,
                          "space_to_depth_conv: weight must be (K, ", kBlock * kBlock * C,
                          ", 1, 1) for ", C, " input channels, got ", weight.sizes());
  CUTLASS_OPS_CHECK_VALUE(weight.scalar_type() == input.scalar_type(), "space_to_depth_conv: weight dtype ",
                          weight.scalar_type(), " differs from input dtype ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.device() == input.device(), "space_to_depth_conv: weight is on ",
                          weight.device(), " but input is on ", input.device());
  if (post_bias) {
    CUTLASS_OPS_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1,
                            "space_to_depth_conv: post_bias must be a scalar tensor, got ", post_bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(post_bias->scalar_type()),
                            "space_to_depth_conv: post_bias must be floating, got ", post_bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(post_bias->device() == input.device(), "space_to_depth_conv: post_bias is on ",
                            post_bias->device(), " but input is on ", input.device());
  }
  return {N, weight.size(0), H / kBlock, W / kBlock};
}

Tensor space_to_depth_conv_aten(Tensor const& input, Tensor const& weight,
                                std::optional<Tensor> const& post_bias, bool relu) {
  auto shape = check_inputs(input, weight, post_bias);
  int64_t N = input.size(0), C = input.size(1), P = shape[2], Q = shape[3];
  auto compute = input.scalar_type() == kDouble ? kDouble : kFloat;
  // New channel index dy*4C + dx*C + c.
  auto s2d = torch::stable::reshape(
      permute(torch::stable::reshape(to_dtype(input, compute), {N, C, P, kBlock, Q, kBlock}), {0, 3, 5, 1, 2, 4}),
      {N, kBlock * kBlock * C, P, Q});
  // conv2d(input, weight, bias=None, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1)
  auto y = aten_call("aten::conv2d", "", s2d, to_dtype(weight, compute), std::optional<Tensor>(),
                     std::vector<int64_t>{1, 1}, std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 1},
                     int64_t(1));
  if (relu) y = cutlass_ops::relu(y);
  if (post_bias) y = y + torch::stable::reshape(to_dtype(*post_bias, compute), {});
  auto out = empty(shape, input.scalar_type(), input.device(), kChannelsLast);
  torch::stable::copy_(out, y);
  return out;
}

std::vector<int64_t> check_weight_grad_inputs(Tensor const& grad, Tensor const& input,
                                              std::optional<Tensor> const& out,
                                              std::optional<Tensor> const& post_bias) {
  char const* op = "space_to_depth_conv_weight_grad";
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4 && grad.dim() == 4, op, ": input and grad must be 4-D, got ",
                          input.dim(), "-D and ", grad.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(input.scalar_type()), op, ": input must be floating, got ",
                          input.scalar_type());
  int64_t N = input.size(0), C = input.size(1), H = input.size(2), W = input.size(3), K = grad.size(1);
  CUTLASS_OPS_CHECK_VALUE(H % kBlock == 0 && W % kBlock == 0, op,
                          ": input height and width must be multiples of ", kBlock, ", got ", H, "x", W);
  CUTLASS_OPS_CHECK_VALUE(grad.size(0) == N && grad.size(2) == H / kBlock && grad.size(3) == W / kBlock, op,
                          ": grad must be (", N, ", K, ", H / kBlock, ", ", W / kBlock, ") for input ",
                          input.sizes(), ", got ", grad.sizes());
  CUTLASS_OPS_CHECK_VALUE(grad.scalar_type() == input.scalar_type(), op, ": grad dtype ", grad.scalar_type(),
                          " differs from input dtype ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(grad.device() == input.device(), op, ": grad is on ", grad.device(),
                          " but input is on ", input.device());
  if (out) {
    CUTLASS_OPS_CHECK_VALUE(out->sizes() == grad.sizes(), op, ": out shape ", out->sizes(),
                            " differs from grad shape ", grad.sizes());
    CUTLASS_OPS_CHECK_VALUE(out->scalar_type() == grad.scalar_type(), op, ": out dtype ", out->scalar_type(),
                            " differs from grad dtype ", grad.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(out->device() == input.device(), op, ": out is on ", out->device(),
                            " but input is on ", input.device());
  }
  if (post_bias) {
    CUTLASS_OPS_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1, op,
                            ": post_bias must be a scalar tensor, got ", post_bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(post_bias->scalar_type()), op, ": post_bias must be floating, got ",
                            post_bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(post_bias->device() == input.device(), op, ": post_bias is on ",
                            post_bias->device(), " but input is on ", input.device());
  }
  return {N, C, H, W, K};
}

std::tuple<Tensor, Tensor> space_to_depth_conv_weight_grad_aten(
    Tensor const& grad, Tensor const& input, std::optional<Tensor> const& out,
    std::optional<Tensor> const& post_bias) {
  auto dims = check_weight_grad_inputs(grad, input, out, post_bias);
  int64_t N = dims[0], C = dims[1], P = dims[2] / kBlock, Q = dims[3] / kBlock, K = dims[4];
  auto acc = input.scalar_type() == kDouble ? kDouble : kFloat;
  Tensor g = to_dtype(grad, acc), gz = g;
  if (out) {  // the ReLU mask from the saved output, as relu_backward
    auto active = post_bias ? ne(*out, torch::stable::reshape(to_dtype(*post_bias, out->scalar_type()), {}))
                            : *out > 0.0;
    gz = where(active, g, zeros({}, g.scalar_type(), g.device()));
  }
  auto sums = stack({sum_all(g, acc), sum_all(gz, acc)});
  auto patches = torch::stable::reshape(
      permute(torch::stable::reshape(to_dtype(input, acc), {N, C, P, kBlock, Q, kBlock}), {0, 2, 4, 3, 5, 1}),
      {N * P * Q, kBlock * kBlock * C});
  auto gz_rows = torch::stable::reshape(permute(gz, {0, 2, 3, 1}), {N * P * Q, K});
  auto dw = mm(transposed(gz_rows), patches);
  return {torch::stable::reshape(dw, {K, kBlock * kBlock * C, 1, 1}), sums};
}

}  // namespace space_to_depth_conv
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("space_to_depth_conv(Tensor input, Tensor weight, Tensor? post_bias=None, bool relu=False) -> Tensor");
  m.def("space_to_depth_conv_weight_grad(Tensor grad, Tensor input, Tensor? out=None, Tensor? post_bias=None) "
        "-> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("space_to_depth_conv", TORCH_BOX(&cutlass_ops::space_to_depth_conv::space_to_depth_conv_aten));
  m.impl("space_to_depth_conv_weight_grad",
         TORCH_BOX(&cutlass_ops::space_to_depth_conv::space_to_depth_conv_weight_grad_aten));
}
