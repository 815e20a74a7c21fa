// cutlass_ops::layer_norm_rows: LayerNorm over the last dimension, optionally after a residual
// add, in float32 for 16-bit inputs (as CvT's LayerNorm), returning what the backward needs:
//   (y, x + residual or an empty tensor, mean, rstd)   mean/rstd: (rows,) float32 (float64 for float64)
// cutlass_ops::layer_norm_rows_backward: its backward,
//   (grad_x, grad_weight, grad_bias)   grad_x = LayerNorm's input gradient + grad_sum, in s's
//   dtype; the parameter gradients in the statistics' dtype (empty where not asked for).
// Used by cutlass_ops/ops/layer_norm_rows.py (fake impls, autograd) and FusedCvT.  Schemas,
// checks and the CPU (ATen) implementations; CUDA in layer_norm_rows_cuda.cpp.
#include "layer_norm_rows/layer_norm_rows_op.h"

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

void check_backward_inputs(Tensor const& grad_y, std::optional<Tensor> const& grad_sum, Tensor const& s,
                           Tensor const& mean, Tensor const& rstd, std::optional<Tensor> const& weight) {
  CUTLASS_OPS_CHECK_VALUE(s.dim() >= 1 && is_floating(s.scalar_type()),
                          "layer_norm_rows_backward: s must be a floating tensor of at least one dimension");
  int64_t const cols = s.size(s.dim() - 1), rows = cols > 0 ? s.numel() / cols : 0;
  for (auto const* p : {&grad_y, grad_sum ? &*grad_sum : nullptr}) {
    if (!p) continue;
    char const* name = p == &grad_y ? "grad_y" : "grad_sum";
    CUTLASS_OPS_CHECK_VALUE(p->sizes() == s.sizes() && p->scalar_type() == s.scalar_type() &&
                                p->device() == s.device(),
                            "layer_norm_rows_backward: ", name, " must match s (shape ", s.sizes(), ", ",
                            s.scalar_type(), ", ", s.device(), "), got ", p->sizes(), ", ", p->scalar_type(), ", ",
                            p->device());
  }
  ScalarType const ct = s.scalar_type() == kDouble ? kDouble : kFloat;
  for (auto const* p : {&mean, &rstd})
    CUTLASS_OPS_CHECK_VALUE(p->dim() == 1 && p->size(0) == rows && p->scalar_type() == ct && p->device() == s.device(),
                            "layer_norm_rows_backward: ", p == &mean ? "mean" : "rstd", " must be (", rows, ",) ", ct,
                            " on ", s.device(), " (layer_norm_rows' own), got ", p->sizes(), " ", p->scalar_type());
  if (weight)
    CUTLASS_OPS_CHECK_VALUE(weight->dim() == 1 && weight->size(0) == cols && is_floating(weight->scalar_type()) &&
                                weight->device() == s.device(),
                            "layer_norm_rows_backward: weight must be a floating (", cols, ",) tensor on ", s.device(),
                            ", got ", weight->sizes(), " ", weight->scalar_type(), " on ", weight->device());
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_rows_backward_aten(Tensor const& grad_y,
                                                                 std::optional<Tensor> const& grad_sum,
                                                                 Tensor const& s, Tensor const& mean,
                                                                 Tensor const& rstd,
                                                                 std::optional<Tensor> const& weight,
                                                                 bool weight_grad, bool bias_grad) {
  check_backward_inputs(grad_y, grad_sum, s, mean, rstd, weight);
  ScalarType const dtype = s.scalar_type(), ct = mean.scalar_type();
  int64_t const cols = s.size(s.dim() - 1), rows = cols > 0 ? s.numel() / cols : 0;
  weight_grad = weight_grad && weight.has_value();
  Tensor g = torch::stable::reshape(to_dtype(grad_y, ct), {rows, cols});
  Tensor w = weight ? to_dtype(*weight, ct) : Tensor();
  // the bias's gradient is grad_y's column sum (native_layer_norm_backward wants a bias tensor for it)
  auto [grad_in, grad_w, unused] = aten_call_multi<Tensor, Tensor, Tensor>(
      "aten::native_layer_norm_backward", "", g, torch::stable::reshape(to_dtype(s, ct), {rows, cols}),
      std::vector<int64_t>{cols}, torch::stable::reshape(mean, {rows, 1}), torch::stable::reshape(rstd, {rows, 1}),
      opt(w), std::optional<Tensor>(), BoolList{{true, weight_grad, false}});
  (void)unused;
  if (grad_sum) grad_in = add(grad_in, to_dtype(torch::stable::reshape(*grad_sum, {rows, cols}), ct));
  Tensor grad_b = bias_grad ? torch::stable::sum(g, IntArrayRef(std::vector<int64_t>{0}), false, std::nullopt)
                            : empty({0}, ct, s.device());
  return {torch::stable::reshape(to_dtype(grad_in, dtype), to_vector(s.sizes())),
          weight_grad ? grad_w : empty({0}, ct, s.device()), grad_b};
}

}  // namespace layer_norm
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("layer_norm_rows(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, float eps) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.def("layer_norm_rows_backward(Tensor grad_y, Tensor? grad_sum, Tensor s, Tensor mean, Tensor rstd, "
        "Tensor? weight, bool weight_grad, bool bias_grad) -> (Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("layer_norm_rows", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_aten));
  m.impl("layer_norm_rows_backward", TORCH_BOX(&cutlass_ops::layer_norm::layer_norm_rows_backward_aten));
}
