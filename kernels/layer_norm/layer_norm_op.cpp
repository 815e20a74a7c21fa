// cutlass_ops::layer_norm_rows: LayerNorm over the last dimension, optionally after a residual
// add, in float32 for 16-bit inputs (as CvT's LayerNorm), returning what the backward needs:
//   (y, x + residual or an empty tensor, mean, rstd)   mean/rstd: (rows,) float32 (float64 for float64)
// Used by cutlass_ops/layer_norm.py (autograd, fake impl) and FusedCvT.  Schema, checks and the
// CPU (ATen) implementation; CUDA in layer_norm_cuda.cpp.
#include "layer_norm/layer_norm_op.h"

namespace cutlass_ops {
namespace layer_norm {

void check_inputs(Tensor const& x, std::optional<Tensor> const& residual, std::optional<Tensor> const& weight,
                  std::optional<Tensor> const& bias) {
  CUTLASS_OPS_CHECK_VALUE(x.dim() >= 1, "layer_norm_rows: x must have at least one dimension, got a scalar");
  CUTLASS_OPS_CHECK_VALUE(is_floating(x.scalar_type()), "layer_norm_rows: x must be floating, got ", x.scalar_type());
  int64_t const cols = x.size(x.dim() - 1);
  if (residual) {
    CUTLASS_OPS_CHECK_VALUE(residual->sizes() == x.sizes(), "layer_norm_rows: residual shape ", residual->sizes(),
                            " differs from x shape ", x.sizes());
    CUTLASS_OPS_CHECK_VALUE(residual->scalar_type() == x.scalar_type(), "layer_norm_rows: residual dtype ",
                            residual->scalar_type(), " differs from x dtype ", x.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(residual->device() == x.device(), "layer_norm_rows: residual is on ", residual->device(),
                            " but x is on ", x.device());
  }
  for (auto const* p : {&weight, &bias}) {
    if (!*p) continue;
    char const* name = p == &weight ? "weight" : "bias";
    Tensor const& t = **p;
    CUTLASS_OPS_CHECK_VALUE(t.dim() == 1 && t.size(0) == cols, "layer_norm_rows: ", name, " must have shape (",
                            cols, ",) (x's last dimension), got ", t.sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(t.scalar_type()), "layer_norm_rows: ", name, " must be floating, got ",
                            t.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(t.device() == x.device(), "layer_norm_rows: ", name, " is on ", t.device(),
                            " but x is on ", x.device());
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> layer_norm_rows_aten(Tensor const& x, std::optional<Tensor> const& residual,
                                                                std::optional<Tensor> const& weight,
                                                                std::optional<Tensor> const& bias, double eps) {
  check_inputs(x, residual, weight, bias);
  ScalarType const dtype = x.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const cols = x.size(x.dim() - 1), rows = cols > 0 ? x.numel() / cols : 0;
  Tensor s = torch::stable::contiguous(residual ? add(x, *residual) : x);
  Tensor w = weight ? to_dtype(*weight, ct) : Tensor(), b = bias ? to_dtype(*bias, ct) : Tensor();
  auto [y, mean, rstd] = aten_call_multi<Tensor, Tensor, Tensor>(
      "aten::native_layer_norm", "", torch::stable::reshape(to_dtype(s, ct), {rows, cols}),
      std::vector<int64_t>{cols}, opt(w), opt(b), eps);
  return {torch::stable::reshape(to_dtype(y, dtype), to_vector(x.sizes())),
          residual ? s : empty({0}, dtype, x.device()), torch::stable::reshape(mean, {rows}),
          torch::stable::reshape(rstd, {rows})};
}

}  // namespace layer_norm
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("layer_norm_rows(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("layer_norm_rows", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_aten));
}
