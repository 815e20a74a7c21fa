// cutlass_ops::linear_silu(x, weight, bias, alpha) -> y = silu(alpha * (x @ weight^T + bias)): a
// Linear whose SiLU (and a scale: CvT's QuickGELU as silu(1.702 z)) runs in the GEMM's epilogue,
// so that the activation is written once instead of written, read and written again.  x
// (..., K), weight (N, K), bias (N) or None; y (..., N) in x's dtype.  Schema, checks and the CPU
// (ATen) implementation; CUDA in linear_silu_cuda.cpp (the generated family-90 kernels), the
// fake and autograd in cutlass_ops/ops/linear_silu.py.
#include "linear_silu/linear_silu_op.h"

#include <cmath>
#include <vector>

#include "common/linear_checks.h"

namespace cutlass_ops {
namespace linear_silu {

void check_inputs(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, double alpha) {
  char const* op = "linear_silu";
  check_linear_inputs(op, x, weight, bias);
  CUTLASS_OPS_CHECK_VALUE(std::isfinite(alpha), op, ": alpha must be finite, got ", alpha);
}

Tensor linear_silu_aten(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias, double alpha) {
  check_inputs(x, weight, bias, alpha);
  ScalarType const dtype = x.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const k = x.size(x.dim() - 1), n = weight.size(0);
  std::vector<int64_t> out_sizes = to_vector(x.sizes());
  out_sizes.back() = n;
  Tensor x2 = torch::stable::reshape(to_dtype(x, ct), {-1, k});
  Tensor z = mm(x2, transposed(to_dtype(weight, ct)));
  if (bias) z = z + to_dtype(*bias, ct);
  z = z * alpha;
  Tensor y = empty(IntArrayRef(out_sizes), dtype, x.device());
  torch::stable::copy_(y, torch::stable::reshape(aten_call("aten::silu", "", z), IntArrayRef(out_sizes)));
  return y;
}

}  // namespace linear_silu
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("linear_silu(Tensor x, Tensor weight, Tensor? bias, float alpha) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("linear_silu", TORCH_BOX(&cutlass_ops::linear_silu::linear_silu_aten));
}
