// cutlass_ops::scale_samples(x, scale) -> y: y[n, ...] = x[n, ...] * scale[n], the product in
// scale's dtype (float32, or float64 for a float64 x) rounded once to x's dtype.  FusedCvT's drop
// path (timm's x.div(keep_prob) * mask, two passes each way) as one multiply forward and
// backward.  Schema, checks and the CPU (ATen) implementation; CUDA in scale_samples_cuda.cpp,
// the fake and autograd in cutlass_ops/ops/scale_samples.py.
#include "scale_samples/scale_samples_op.h"

#include <vector>

namespace cutlass_ops {
namespace sample_scale {

void check_inputs(Tensor const& x, Tensor const& scale) {
  char const* op = "scale_samples";
  CUTLASS_OPS_CHECK_VALUE(x.dim() >= 1 && is_floating(x.scalar_type()), op,
                          ": x must be a floating tensor with a sample dimension, got ", x.dim(), "-D ",
                          x.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == x.size(0), op, ": scale must be (", x.size(0),
                          ",), one factor per sample, got ", scale.sizes());
  ScalarType const want = x.scalar_type() == kDouble ? kDouble : kFloat;
  CUTLASS_OPS_CHECK_VALUE(scale.scalar_type() == want, op, ": scale must be ", want, " for x of ", x.scalar_type(),
                          ", got ", scale.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(scale.device() == x.device(), op, ": scale is on ", scale.device(), " but x is on ",
                          x.device());
}

Tensor scale_samples_aten(Tensor const& x, Tensor const& scale) {
  check_inputs(x, scale);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  Tensor product = mul(to_dtype(x, scale.scalar_type()), torch::stable::reshape(scale, IntArrayRef(shape)));
  Tensor y = empty(x.sizes(), x.scalar_type(), x.device());
  torch::stable::copy_(y, product);
  return y;
}

}  // namespace sample_scale
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("scale_samples(Tensor x, Tensor scale) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("scale_samples", TORCH_BOX(&cutlass_ops::sample_scale::scale_samples_aten));
}
