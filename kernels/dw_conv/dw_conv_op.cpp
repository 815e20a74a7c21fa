// cutlass_ops::dw_conv3x3_tokens(x, h, w, weight, bias, stride, lead) -> y: a depthwise 3x3 conv
// (padding 1, stride 1 or 2) with a per-channel bias on the NHWC map that tokens x (N, h*w, C)
// hold, returning tokens (N, L + Ho*Wo, C) whose first L rows are `lead` (N, L, C) (none: L = 0).
// FusedCvT's eval-mode dw_bn q/k/v projections, the cls token as the lead (CvT's stage 3).
// Inference only (no autograd).  Schema, checks and the CPU (ATen) implementation; CUDA in
// dw_conv_cuda.cpp, the fake in cutlass_ops/ops.py.
#include "dw_conv/dw_conv_op.h"

namespace cutlass_ops {
namespace dw_conv {

std::pair<int64_t, int64_t> check_inputs(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                                         std::optional<Tensor> const& bias, int64_t stride,
                                         std::optional<Tensor> const& lead) {
  char const* op = "dw_conv3x3_tokens";
  CUTLASS_OPS_CHECK_VALUE(x.dim() == 3, op, ": x must be tokens (N, H*W, C), got ", x.dim(), "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(x.scalar_type()), op, ": x must be floating, got ", x.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(h > 0 && w > 0 && x.size(1) == h * w, op, ": x has ", x.size(1), " tokens, not h*w = ",
                          h, "*", w);
  CUTLASS_OPS_CHECK_VALUE(stride == 1 || stride == 2, op, ": stride must be 1 or 2, got ", stride);
  int64_t const c = x.size(2);
  CUTLASS_OPS_CHECK_VALUE(weight.dim() == 4 && weight.size(0) == c && weight.size(1) == 1 && weight.size(2) == 3 &&
                              weight.size(3) == 3,
                          op, ": weight must be (", c, ", 1, 3, 3), got ", weight.sizes());
  for (auto const* t : {&weight}) {
    CUTLASS_OPS_CHECK_VALUE(is_floating(t->scalar_type()), op, ": weight must be floating, got ", t->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(t->device() == x.device(), op, ": weight is on ", t->device(), " but x is on ", x.device());
  }
  if (bias) {
    CUTLASS_OPS_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == c, op, ": bias must be (", c, ",), got ",
                            bias->sizes());
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
  return {(h - 1) / stride + 1, (w - 1) / stride + 1};
}

Tensor dw_conv3x3_tokens_aten(Tensor const& x, int64_t h, int64_t w, Tensor const& weight,
                              std::optional<Tensor> const& bias, int64_t stride, std::optional<Tensor> const& lead) {
  auto [ho, wo] = check_inputs(x, h, w, weight, bias, stride, lead);
  ScalarType const dtype = x.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const n = x.size(0), c = x.size(2), l0 = lead ? lead->size(1) : 0;
  Tensor map = permute(torch::stable::reshape(to_dtype(x, ct), {n, h, w, c}), {0, 3, 1, 2});
  // conv2d(input, weight, bias, stride, padding, dilation, groups)
  Tensor z = aten_call("aten::conv2d", "", map, to_dtype(weight, ct),
                       bias ? std::optional<Tensor>(to_dtype(*bias, ct)) : std::optional<Tensor>(),
                       std::vector<int64_t>{stride, stride}, std::vector<int64_t>{1, 1}, std::vector<int64_t>{1, 1}, c);
  Tensor y = empty({n, l0 + ho * wo, c}, dtype, x.device());
  if (l0 > 0) {
    Tensor head = narrowed(y, 1, 0, l0);
    torch::stable::copy_(head, *lead);
  }
  if (ho * wo > 0) {
    Tensor body = narrowed(y, 1, l0, ho * wo);
    torch::stable::copy_(body, torch::stable::reshape(permute(z, {0, 2, 3, 1}), {n, ho * wo, c}));
  }
  return y;
}

}  // namespace dw_conv
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("dw_conv3x3_tokens(Tensor x, int h, int w, Tensor weight, Tensor? bias, int stride, Tensor? lead) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("dw_conv3x3_tokens", TORCH_BOX(&cutlass_ops::dw_conv::dw_conv3x3_tokens_aten));
}
