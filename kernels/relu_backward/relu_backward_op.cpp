// cutlass_ops::relu_backward: the backward of an op's "relu(z) + post_bias" epilogue from its
// saved output, with the two scalar sums FixUp needs (see relu_backward_kernel.h).  Used by
// cutlass_ops/ops/ (the autograd formulas).  Schema, checks and the CPU (ATen) implementation; CUDA in
// relu_backward_cuda.cpp, fake in cutlass_ops/ops/relu_backward.py.
#include "relu_backward/relu_backward_op.h"

namespace cutlass_ops {
namespace relu_backward {

void check_inputs(Tensor const& grad, Tensor const& out, std::optional<Tensor> const& post_bias) {
  CUTLASS_OPS_CHECK_VALUE(grad.sizes() == out.sizes(), "relu_backward: grad shape ", grad.sizes(),
                          " differs from out shape ", out.sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(out.scalar_type()), "relu_backward: out must be floating, got ",
                          out.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(grad.scalar_type() == out.scalar_type(), "relu_backward: grad dtype ",
                          grad.scalar_type(), " differs from out dtype ", out.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(grad.device() == out.device(), "relu_backward: grad is on ", grad.device(),
                          " but out is on ", out.device());
  if (post_bias) {
    CUTLASS_OPS_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1,
                            "relu_backward: post_bias must be a scalar tensor, got ", post_bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(post_bias->scalar_type()),
                            "relu_backward: post_bias must be floating, got ", post_bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(post_bias->device() == out.device(), "relu_backward: post_bias is on ",
                            post_bias->device(), " but out is on ", out.device());
  }
}

std::tuple<Tensor, Tensor> relu_backward_aten(Tensor const& grad, Tensor const& out,
                                              std::optional<Tensor> const& post_bias) {
  check_inputs(grad, out, post_bias);
  auto acc = out.scalar_type() == kDouble ? kDouble : kFloat;
  auto active = post_bias ? ne(out, torch::stable::reshape(to_dtype(*post_bias, out.scalar_type()), {}))
                          : out > 0.0;
  auto grad_z = torch::stable::contiguous(
      where(active, grad, zeros({}, grad.scalar_type(), grad.device())), grad_z_format(out));
  auto sums = stack({sum_all(grad, acc), sum_all(grad_z, acc)});
  return {grad_z, sums};
}

}  // namespace relu_backward
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("relu_backward(Tensor grad, Tensor out, Tensor? post_bias=None) -> (Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("relu_backward", TORCH_BOX(&cutlass_ops::relu_backward::relu_backward_aten));
}
