// cutlass_ops::relu_backward: the backward of an op's "relu(z) + post_bias" epilogue from its
// saved output, with the two scalar sums FixUp needs (see relu_backward_kernel.h).  Used by
// cutlass_ops/autograd.py.  Schema, checks and the CPU (ATen) implementation; CUDA in
// relu_backward_cuda.cpp, fake in cutlass_ops/ops.py.
#include "relu_backward/relu_backward_op.h"

#include <torch/library.h>

namespace cutlass_ops {
namespace relu_backward {

void check_inputs(at::Tensor const& grad, at::Tensor const& out, c10::optional<at::Tensor> const& post_bias) {
  TORCH_CHECK_VALUE(grad.sizes() == out.sizes(), "relu_backward: grad shape ", grad.sizes(),
                    " differs from out shape ", out.sizes());
  TORCH_CHECK_VALUE(at::isFloatingType(out.scalar_type()), "relu_backward: out must be floating, got ",
                    out.scalar_type());
  TORCH_CHECK_VALUE(grad.scalar_type() == out.scalar_type(), "relu_backward: grad dtype ", grad.scalar_type(),
                    " differs from out dtype ", out.scalar_type());
  TORCH_CHECK_VALUE(grad.device() == out.device(), "relu_backward: grad is on ", grad.device(), " but out is on ",
                    out.device());
  if (post_bias) {
    TORCH_CHECK_VALUE(post_bias->numel() == 1 && post_bias->dim() <= 1,
                      "relu_backward: post_bias must be a scalar tensor, got ", post_bias->sizes());
    TORCH_CHECK_VALUE(at::isFloatingType(post_bias->scalar_type()), "relu_backward: post_bias must be floating, got ",
                      post_bias->scalar_type());
    TORCH_CHECK_VALUE(post_bias->device() == out.device(), "relu_backward: post_bias is on ", post_bias->device(),
                      " but out is on ", out.device());
  }
}

std::tuple<at::Tensor, at::Tensor> relu_backward_aten(at::Tensor const& grad, at::Tensor const& out,
                                                      c10::optional<at::Tensor> const& post_bias) {
  check_inputs(grad, out, post_bias);
  auto acc = out.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto active = post_bias ? out.ne(post_bias->to(out.scalar_type()).reshape({})) : out.gt(0);
  auto grad_z = at::where(active, grad, at::zeros({}, grad.options())).contiguous(grad_z_format(out));
  auto sums = at::stack({grad.sum(acc), grad_z.sum(acc)});
  return {grad_z, sums};
}

}  // namespace relu_backward
}  // namespace cutlass_ops

TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("relu_backward(Tensor grad, Tensor out, Tensor? post_bias=None) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("relu_backward", &cutlass_ops::relu_backward::relu_backward_aten);
}
