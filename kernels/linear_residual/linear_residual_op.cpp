// cutlass_ops::linear_residual(x, weight, bias, residual, alpha) -> residual + alpha * x @ weight^T
// + bias: a Linear whose output lands on the residual stream in the GEMM's epilogue, so that a
// transformer's residual add is not a pass of its own (nor a LayerNorm's second input).  x
// (..., K), weight (N, K), bias (N) or None, residual (..., N); out (..., N) in x's dtype.
// Schema, checks and the CPU (ATen) implementation; CUDA (cuBLASLt) in linear_residual_cuda.cpp,
// the fake and autograd in cutlass_ops/ops/linear_residual.py.
#include "linear_residual/linear_residual_op.h"

#include <cmath>
#include <vector>

#include "common/linear_checks.h"

namespace cutlass_ops {
namespace linear_residual {

void check_inputs(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, Tensor const& residual,
                  double alpha) {
  char const* op = "linear_residual";
  check_linear_inputs(op, x, weight, bias);
  std::vector<int64_t> out_sizes = to_vector(x.sizes());
  out_sizes.back() = weight.size(0);
  CUTLASS_OPS_CHECK_VALUE(residual.sizes() == IntArrayRef(out_sizes), op, ": residual must be ",
                          IntArrayRef(out_sizes), " (x's rows, weight's N), got ", residual.sizes());
  CUTLASS_OPS_CHECK_VALUE(residual.scalar_type() == x.scalar_type(), op, ": residual dtype ",
                          residual.scalar_type(), " differs from x dtype ", x.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(residual.device() == x.device(), op, ": residual is on ", residual.device(),
                          " but x is on ", x.device());
  CUTLASS_OPS_CHECK_VALUE(std::isfinite(alpha), op, ": alpha must be finite, got ", alpha);
}

Tensor linear_residual_aten(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias,
                            Tensor const& residual, double alpha) {
  check_inputs(x, weight, bias, residual, alpha);
  ScalarType const dtype = x.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const k = x.size(x.dim() - 1), n = weight.size(0);
  Tensor x2 = torch::stable::reshape(to_dtype(x, ct), {-1, k});
  Tensor z = mm(x2, transposed(to_dtype(weight, ct))) * alpha;
  if (bias) z = z + to_dtype(*bias, ct);
  z = z + torch::stable::reshape(to_dtype(residual, ct), {-1, n});
  Tensor y = empty(residual.sizes(), dtype, x.device());
  torch::stable::copy_(y, torch::stable::reshape(z, residual.sizes()));
  return y;
}

}  // namespace linear_residual
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("linear_residual(Tensor x, Tensor weight, Tensor? bias, Tensor residual, float alpha) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("linear_residual", TORCH_BOX(&cutlass_ops::linear_residual::linear_residual_aten));
}
