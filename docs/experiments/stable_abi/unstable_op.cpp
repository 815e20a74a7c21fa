// The same relu_backward written the way kernels/*/*_op.cpp are today:
// at::Tensor + TORCH_LIBRARY.  Built against torch 2.11 it references
// mangled c10/at symbols whose layout is only promised for 2.11.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace cutlass_ops_unstable {
at::Tensor relu_backward(const at::Tensor& grad, const at::Tensor& out) {
  TORCH_CHECK_VALUE(grad.scalar_type() == at::kFloat, "relu_backward: expected float32");
  TORCH_CHECK_VALUE(grad.sizes() == out.sizes(), "relu_backward: shape mismatch");
  auto g = grad.contiguous();
  auto o = out.contiguous();
  auto r = at::empty_like(g);
  const float* gp = g.data_ptr<float>();
  const float* op = o.data_ptr<float>();
  float* rp = r.data_ptr<float>();
  for (int64_t i = 0; i < g.numel(); ++i) rp[i] = op[i] > 0.f ? gp[i] : 0.f;
  return r;
}
}  // namespace cutlass_ops_unstable

TORCH_LIBRARY(cutlass_ops_unstable, m) {
  m.def("relu_backward(Tensor grad, Tensor out) -> Tensor");
}
TORCH_LIBRARY_IMPL(cutlass_ops_unstable, CPU, m) {
  m.impl("relu_backward", &cutlass_ops_unstable::relu_backward);
}
