// cutlass_ops::conv_embed(input, weight, bias, stride, padding, layer_norm, ln_weight, ln_bias, eps)
// -> tokens (N, P*Q, K): a token embedding's strided conv (no dilation, no groups), its bias and,
// with layer_norm, a LayerNorm over the K output channels, the tokens in (n, p, q) order.  CvT's
// first embedding (7x7/4 from 3 channels, then LayerNorm), which as ATen is a cuDNN conv, a bias
// pass, a layout copy and a LayerNorm.  Schema, checks and the CPU (ATen) implementation; CUDA in
// conv_embed_cuda.cpp, the fake and autograd in cutlass_ops/.
#include "conv_embed/conv_embed_op.h"

#include <cmath>
#include <vector>

namespace cutlass_ops {
namespace conv_embed {

OutputShape check_inputs(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                         IntArrayRef stride, IntArrayRef padding, bool layer_norm,
                         std::optional<Tensor> const& ln_weight, std::optional<Tensor> const& ln_bias, double eps) {
  char const* op = "conv_embed";
  CUTLASS_OPS_CHECK_VALUE(input.dim() == 4, op, ": input must be 4-D (N, C, H, W), got ", input.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(input.scalar_type()), op, ": input must be floating, got ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4 && weight.size(1) == input.size(1), op, ": weight must be (K, ",
                          input.size(1), ", R, S) for an input of ", input.size(1), " channels, got ", weight.sizes());
  CUTLASS_OPS_CHECK_VALUE(weight.scalar_type() == input.scalar_type(), op, ": weight dtype ", weight.scalar_type(),
                          " differs from input dtype ", input.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(weight.device() == input.device(), op, ": weight is on ", weight.device(),
                          " but input is on ", input.device());
  CUTLASS_OPS_CHECK_VALUE(stride.size() == 2 && stride[0] >= 1 && stride[1] >= 1, op,
                          ": stride must be two positive ints, got ", stride);
  CUTLASS_OPS_CHECK_VALUE(padding.size() == 2 && padding[0] >= 0 && padding[1] >= 0, op,
                          ": padding must be two non-negative ints, got ", padding);
  int64_t const K = weight.size(0);
  int64_t const P = (input.size(2) + 2 * padding[0] - weight.size(2)) / stride[0] + 1;
  int64_t const Q = (input.size(3) + 2 * padding[1] - weight.size(3)) / stride[1] + 1;
  CUTLASS_OPS_CHECK_VALUE(input.size(2) + 2 * padding[0] >= weight.size(2) &&
                              input.size(3) + 2 * padding[1] >= weight.size(3),
                          op, ": the ", weight.size(2), "x", weight.size(3), " kernel does not fit the padded ",
                          input.size(2), "x", input.size(3), " input");
  auto check_vector = [&](std::optional<Tensor> const& t, char const* name) {
    if (!t) return;
    CUTLASS_OPS_CHECK_VALUE(t->dim() == 1 && t->size(0) == K, op, ": ", name, " must be (", K, ",), got ",
                            t->sizes());
    CUTLASS_OPS_CHECK_VALUE(is_floating(t->scalar_type()), op, ": ", name, " must be floating, got ",
                            t->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(t->device() == input.device(), op, ": ", name, " is on ", t->device(),
                            " but input is on ", input.device());
  };
  check_vector(bias, "bias");
  check_vector(ln_weight, "ln_weight");
  check_vector(ln_bias, "ln_bias");
  CUTLASS_OPS_CHECK_VALUE(layer_norm || (!ln_weight && !ln_bias), op,
                          ": ln_weight and ln_bias need layer_norm=True");
  CUTLASS_OPS_CHECK_VALUE(!layer_norm || (std::isfinite(eps) && eps >= 0), op,
                          ": eps must be finite and non-negative, got ", eps);
  return {input.size(0), K, P, Q};
}

Tensor conv_embed_aten(Tensor const& input, Tensor const& weight, std::optional<Tensor> const& bias,
                       IntArrayRef stride, IntArrayRef padding, bool layer_norm, std::optional<Tensor> const& ln_weight,
                       std::optional<Tensor> const& ln_bias, double eps) {
  OutputShape o = check_inputs(input, weight, bias, stride, padding, layer_norm, ln_weight, ln_bias, eps);
  ScalarType const dtype = input.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  std::optional<Tensor> b = bias ? std::optional<Tensor>(to_dtype(*bias, ct)) : std::nullopt;
  // aten::conv2d(input, weight, bias, stride, padding, dilation=[1, 1], groups=1)
  Tensor y = aten_call("aten::conv2d", "", torch::stable::contiguous(to_dtype(input, ct)),
                       torch::stable::contiguous(to_dtype(weight, ct)), b, stride, padding,
                       std::vector<int64_t>{1, 1}, int64_t(1));
  Tensor t = torch::stable::reshape(permute(y, {0, 2, 3, 1}), {o.N * o.P * o.Q, o.K});
  if (layer_norm) {
    std::optional<Tensor> w = ln_weight ? std::optional<Tensor>(to_dtype(*ln_weight, ct)) : std::nullopt;
    std::optional<Tensor> lb = ln_bias ? std::optional<Tensor>(to_dtype(*ln_bias, ct)) : std::nullopt;
    auto [normed, mean, rstd] = aten_call_multi<Tensor, Tensor, Tensor>(
        "aten::native_layer_norm", "", t, std::vector<int64_t>{o.K}, w, lb, eps);
    (void)mean;
    (void)rstd;
    t = normed;
  }
  Tensor out = empty({o.N, o.P * o.Q, o.K}, dtype, input.device());
  torch::stable::copy_(out, torch::stable::reshape(t, {o.N, o.P * o.Q, o.K}));
  return out;
}

}  // namespace conv_embed
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("conv_embed(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding, "
        "bool layer_norm=False, Tensor? ln_weight=None, Tensor? ln_bias=None, float eps=1e-05) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("conv_embed", TORCH_BOX(&cutlass_ops::conv_embed::conv_embed_aten));
}
