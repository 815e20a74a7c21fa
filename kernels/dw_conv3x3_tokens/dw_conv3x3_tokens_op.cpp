// cutlass_ops::dw_conv3x3_tokens(x, h, w, weight, bias, strides, lead) -> [y, ...]: depthwise 3x3
// convs (padding 1, stride 1 or 2 each) with per-channel biases on the NHWC map that tokens x
// (N, h*w, C) hold, one per entry of `strides` (1 to 3), each returning tokens
// (N, L + Ho*Wo, C) whose first L rows are `lead` (N, L, C) (none: L = 0).  FusedCvT's eval-mode
// dw_bn q/k/v projections in one call, the cls token as the lead (CvT's stage 3).
// layer_norm_dw_conv3x3_tokens(x, h, w, ln_weight, ln_bias, eps, weight, bias, strides, lead):
// the same convs on LayerNorm(x) (and the lead rows LayerNormed), the block's norm1 inside the
// kernel.  Schema, checks and the CPU (ATen) implementations; CUDA in dw_conv3x3_tokens_cuda.cpp, the
// fakes and autograd in cutlass_ops/ops/dw_conv3x3_tokens.py.
#include "dw_conv3x3_tokens/dw_conv3x3_tokens_op.h"

#include <cmath>

namespace cutlass_ops {
namespace dw_conv {

std::vector<std::pair<int64_t, int64_t>> check_inputs(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                                      std::optional<Tensor> const& bias, IntArrayRef strides,
                                                      std::optional<Tensor> const& lead) {
  char const* op = "dw_conv3x3_tokens";
  CUTLASS_OPS_CHECK_VALUE(x.dim() == 3, op, ": x must be tokens (N, H*W, C), got ", x.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(x.scalar_type()), op, ": x must be floating, got ", x.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(h > 0 && w > 0 && x.size(1) == h * w, op, ": x has ", x.size(1), " tokens, not h*w = ",
                          h, "*", w);
  int64_t const projections = static_cast<int64_t>(strides.size());
  CUTLASS_OPS_CHECK_VALUE(projections >= 1 && projections <= 3, op, ": strides must list 1 to 3 convs, got ",
                          projections);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t s : strides) {
    CUTLASS_OPS_CHECK_VALUE(s == 1 || s == 2, op, ": each stride must be 1 or 2, got ", s);
    out.emplace_back((h - 1) / s + 1, (w - 1) / s + 1);
  }
  int64_t const c = x.size(2);
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 5 && weight.size(0) == projections && weight.size(1) == c &&
                              weight.size(2) == 1 && weight.size(3) == 3 && weight.size(4) == 3,
                          op, ": weight must be (", projections, ", ", c, ", 1, 3, 3) (one depthwise weight per "
                          "stride), got ", weight.sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(weight.scalar_type()), op, ": weight must be floating, got ",
                          weight.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.device() == x.device(), op, ": weight is on ", weight.device(), " but x is on ",
                          x.device());
  if (bias) {
    CUTLASS_OPS_CHECK_VALUE(bias->dim() == 2 && bias->size(0) == projections && bias->size(1) == c, op,
                            ": bias must be (", projections, ", ", c, "), got ", bias->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(bias->scalar_type()), op, ": bias must be floating, got ", bias->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(bias->device() == x.device(), op, ": bias is on ", bias->device(), " but x is on ",
                            x.device());
  }
  if (lead) {
    CUTLASS_OPS_CHECK_VALUE(lead->dim() == 3 && lead->size(0) == x.size(0) && lead->size(2) == c, op,
                            ": lead must be (", x.size(0), ", L, ", c, "), got ", lead->sizes());
    CUTLASS_OPS_CHECK_VALUE(lead->scalar_type() == x.scalar_type(), op, ": lead dtype ", lead->scalar_type(),
                            " differs from x dtype ", x.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(lead->device() == x.device(), op, ": lead is on ", lead->device(), " but x is on ",
                            x.device());
  }
  return out;
}

std::vector<Tensor> dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                           std::optional<Tensor> const& bias, IntArrayRef strides,
                                           std::optional<Tensor> const& lead) {
  auto const sizes = check_inputs(x, h, w, weight, bias, strides, lead);
  ScalarType const dtype = x.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const n = x.size(0), c = x.size(2), l0 = lead ? lead->size(1) : 0;
  Tensor map = permute(torch::stable::reshape(to_dtype(x, ct), {n, h, w, c}), {0, 3, 1, 2});
  std::vector<Tensor> out;
  for (size_t j = 0; j < sizes.size(); ++j) {
    auto const [ho, wo] = sizes[j];
    int64_t const s = strides[j];
    Tensor wj = torch::stable::select(to_dtype(weight, ct), 0, static_cast<int64_t>(j));
    std::optional<Tensor> bj;
    if (bias) bj = torch::stable::select(to_dtype(*bias, ct), 0, static_cast<int64_t>(j));
    // conv2d(input, weight, bias, stride, padding, dilation, groups)
    Tensor z = aten_call("aten::conv2d", "", map, wj, bj, std::vector<int64_t>{s, s}, std::vector<int64_t>{1, 1},
                         std::vector<int64_t>{1, 1}, c);
    Tensor y = empty({n, l0 + ho * wo, c}, dtype, x.device());
    if (l0 > 0) {
      Tensor head = narrowed(y, 1, 0, l0);
      torch::stable::copy_(head, *lead);
    }
    if (ho * wo > 0) {
      Tensor body = narrowed(y, 1, l0, ho * wo);
      torch::stable::copy_(body, torch::stable::reshape(permute(z, {0, 2, 3, 1}), {n, ho * wo, c}));
    }
    out.push_back(y);
  }
  return out;
}

void check_layer_norm(Tensor const& x, std::optional<Tensor> const& ln_weight, std::optional<Tensor> const& ln_bias,
                      double eps) {
  char const* op = "layer_norm_dw_conv3x3_tokens";
  int64_t const c = x.size(2);
  for (auto const& [name, t] : {std::pair<char const*, std::optional<Tensor> const*>{"ln_weight", &ln_weight},
                                {"ln_bias", &ln_bias}}) {
    if (!*t) continue;
    Tensor const& v = **t;
    CUTLASS_OPS_CHECK_VALUE(v.dim() == 1 && v.size(0) == c, op, ": ", name, " must be (", c, "), got ", v.sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(v.scalar_type()), op, ": ", name, " must be floating, got ", v.scalar_type());
    CUTLASS_OPS_CHECK_VALUE(v.device() == x.device(), op, ": ", name, " is on ", v.device(), " but x is on ",
                            x.device());
  }
  CUTLASS_OPS_CHECK_VALUE(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
}

Tensor layer_norm_last_dim(Tensor const& t, std::optional<Tensor> const& ln_weight,
                           std::optional<Tensor> const& ln_bias, double eps) {
  ScalarType const dtype = t.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  std::optional<Tensor> w, b;
  if (ln_weight) w = to_dtype(*ln_weight, ct);
  if (ln_bias) b = to_dtype(*ln_bias, ct);
  // layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)
  Tensor y = aten_call("aten::layer_norm", "", to_dtype(t, ct), std::vector<int64_t>{t.size(t.dim() - 1)}, w, b, eps,
                       false);
  return to_dtype(y, dtype);
}

std::vector<Tensor> layer_norm_dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w,
                                                      std::optional<Tensor> const& ln_weight,
                                                      std::optional<Tensor> const& ln_bias, double eps,
                                                      Tensor const& weight, std::optional<Tensor> const& bias,
                                                      IntArrayRef strides, std::optional<Tensor> const& lead) {
  check_inputs(x, h, w, weight, bias, strides, lead);
  check_layer_norm(x, ln_weight, ln_bias, eps);
  std::optional<Tensor> lead_n;
  if (lead) lead_n = layer_norm_last_dim(*lead, ln_weight, ln_bias, eps);
  return dw_conv3x3_tokens_aten(layer_norm_last_dim(x, ln_weight, ln_bias, eps), h, w, weight, bias, strides, lead_n);
}

std::vector<std::pair<int64_t, int64_t>> check_backward_inputs(std::vector<Tensor> const& grad_y, int64_t h,
                                                               int64_t w, Tensor const& weight, IntArrayRef strides) {
  char const* op = "dw_conv3x3_tokens_backward_input";
  int64_t const projections = static_cast<int64_t>(strides.size());
  CUTLASS_OPS_CHECK_VALUE(projections >= 1 && projections <= 3 && static_cast<int64_t>(grad_y.size()) == projections,
                          op, ": one grad_y per stride (1 to 3), got ", grad_y.size(), " and ", projections);
  CUTLASS_OPS_CHECK_VALUE(h > 0 && w > 0, op, ": h and w must be positive, got ", h, "x", w);
  Tensor const& g0 = grad_y[0];
  CUTLASS_OPS_CHECK_VALUE(g0.dim() == 3 && is_floating(g0.scalar_type()), op,
                          ": grad_y must be floating tokens (N, Ho*Wo, C), got ", g0.dim(), "-D ", g0.scalar_type());
  int64_t const n = g0.size(0), c = g0.size(2);
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 5 && weight.size(0) == projections && weight.size(1) == c &&
                              weight.size(2) == 1 && weight.size(3) == 3 && weight.size(4) == 3,
                          op, ": weight must be (", projections, ", ", c, ", 1, 3, 3), got ", weight.sizes());
  CUTLASS_OPS_CHECK_VALUE(is_floating(weight.scalar_type()) && weight.device() == g0.device(), op,
                          ": weight must be floating on ", g0.device(), ", got ", weight.scalar_type(), " on ",
                          weight.device());
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t j = 0; j < projections; ++j) {
    int64_t const s = strides[j];
    CUTLASS_OPS_CHECK_VALUE(s == 1 || s == 2, op, ": each stride must be 1 or 2, got ", s);
    int64_t const ho = (h - 1) / s + 1, wo = (w - 1) / s + 1;
    Tensor const& g = grad_y[j];
    CUTLASS_OPS_CHECK_VALUE(g.dim() == 3 && g.size(0) == n && g.size(1) == ho * wo && g.size(2) == c, op,
                            ": grad_y[", j, "] must be (", n, ", ", ho * wo, ", ", c, "), got ", g.sizes());
    CUTLASS_OPS_CHECK_VALUE(g.scalar_type() == g0.scalar_type() && g.device() == g0.device(), op, ": grad_y[", j,
                            "] is ", g.scalar_type(), " on ", g.device(), ", grad_y[0] ", g0.scalar_type(), " on ",
                            g0.device());
    out.emplace_back(ho, wo);
  }
  return out;
}

Tensor dw_conv3x3_tokens_backward_input_aten(std::vector<Tensor> const& grad_y, int64_t h, int64_t w,
                                             Tensor const& weight, IntArrayRef strides) {
  auto const sizes = check_backward_inputs(grad_y, h, w, weight, strides);
  ScalarType const dtype = grad_y[0].scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const n = grad_y[0].size(0), c = grad_y[0].size(2);
  Tensor sum;
  for (size_t j = 0; j < sizes.size(); ++j) {
    auto const [ho, wo] = sizes[j];
    int64_t const s = strides[j];
    Tensor g = permute(torch::stable::reshape(to_dtype(grad_y[j], ct), {n, ho, wo, c}), {0, 3, 1, 2});
    Tensor wj = torch::stable::select(to_dtype(weight, ct), 0, static_cast<int64_t>(j));
    // the transposed conv's output_padding makes its output h x w: h = (ho - 1) s - 2 + 3 + pad
    std::vector<int64_t> output_padding{h - ((ho - 1) * s + 1), w - ((wo - 1) * s + 1)};
    // conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    Tensor z = aten_call("aten::conv_transpose2d", "input", g, wj, std::optional<Tensor>(), std::vector<int64_t>{s, s},
                         std::vector<int64_t>{1, 1}, output_padding, c, std::vector<int64_t>{1, 1});
    sum = j == 0 ? z : sum + z;
  }
  Tensor grad_x = empty({n, h * w, c}, dtype, grad_y[0].device());
  torch::stable::copy_(grad_x, torch::stable::reshape(permute(sum, {0, 2, 3, 1}), {n, h * w, c}));
  return grad_x;
}

}  // namespace dw_conv
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("dw_conv3x3_tokens(Tensor x, int h, int w, Tensor weight, Tensor? bias, int[] strides, Tensor? lead) "
        "-> Tensor[]");
  m.def("dw_conv3x3_tokens_backward_input(Tensor[] grad_y, int h, int w, Tensor weight, int[] strides) -> Tensor");
  m.def("layer_norm_dw_conv3x3_tokens(Tensor x, int h, int w, Tensor? ln_weight, Tensor? ln_bias, float eps, "
        "Tensor weight, Tensor? bias, int[] strides, Tensor? lead) -> Tensor[]");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("dw_conv3x3_tokens", TORCH_BOX(&cutlass_ops::dw_conv::dw_conv3x3_tokens_aten));
  m.impl("dw_conv3x3_tokens_backward_input", TORCH_BOX(&cutlass_ops::dw_conv::dw_conv3x3_tokens_backward_input_aten));
  m.impl("layer_norm_dw_conv3x3_tokens", TORCH_BOX(&cutlass_ops::dw_conv::layer_norm_dw_conv3x3_tokens_aten));
}
