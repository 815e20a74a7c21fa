// cutlass_ops::attention_tokens(q, k, v, heads, scale) -> o: multi-head attention on token tensors,
// q (N, Lq, C), k and v (N, Lkv, C), C = heads x head_dim, o (N, Lq, C) = per head h,
// softmax(scale q_h k_h^T) v_h, the heads' outputs side by side as the output projection reads
// them (no transposes either way).  CvT's attentions (scale: the whole dim's, which the caller
// passes).  Schema, checks and the CPU (ATen) implementation; CUDA in attention_cuda.cpp, the fake
// and autograd in cutlass_ops/.
#include "attention/attention_op.h"

#include <cmath>
#include <vector>

namespace cutlass_ops {
namespace attention {

void check_inputs(Tensor const& q, Tensor const& k, Tensor const& v, int64_t heads, double scale) {
  char const* op = "attention_tokens";
  CUTLASS_OPS_CHECK_VALUE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, op,
                          ": q, k and v must be 3-D (N, L, C), got ", q.dim(), "-D, ", k.dim(), "-D and ", v.dim(),
                          "-D");
  CUTLASS_OPS_CHECK_VALUE(is_floating(q.scalar_type()), op, ": q must be floating, got ", q.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), op,
                          ": k and v must have q's dtype ", q.scalar_type(), ", got ", k.scalar_type(), " and ",
                          v.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(k.device() == q.device() && v.device() == q.device(), op, ": k is on ", k.device(),
                          " and v on ", v.device(), " but q is on ", q.device());
  CUTLASS_OPS_CHECK_VALUE(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(2) == q.size(2) &&
                              v.sizes() == k.sizes(),
                          op, ": k and v must be (", q.size(0), ", Lkv, ", q.size(2), ") alike, got ", k.sizes(),
                          " and ", v.sizes());
  CUTLASS_OPS_CHECK_VALUE(k.size(1) >= 1, op, ": no keys (Lkv = 0)");
  CUTLASS_OPS_CHECK_VALUE(heads >= 1 && q.size(2) % heads == 0, op, ": heads (", heads,
                          ") must divide the channels (", q.size(2), ")");
  CUTLASS_OPS_CHECK_VALUE(std::isfinite(scale) && scale > 0, op, ": scale must be finite and positive, got ", scale);
}

Tensor attention_tokens_aten(Tensor const& q, Tensor const& k, Tensor const& v, int64_t heads, double scale) {
  check_inputs(q, k, v, heads, scale);
  ScalarType const dtype = q.scalar_type(), ct = dtype == kDouble ? kDouble : kFloat;
  int64_t const n = q.size(0), lq = q.size(1), lkv = k.size(1), c = q.size(2), d = c / heads;
  auto split = [&](Tensor const& t, int64_t l) {  // (N, L, C) -> (N * heads, L, d)
    return torch::stable::reshape(
        torch::stable::contiguous(permute(torch::stable::reshape(to_dtype(t, ct), {n, l, heads, d}), {0, 2, 1, 3})),
        {n * heads, l, d});
  };
  Tensor s = aten_call("aten::bmm", "", split(q, lq), permute(split(k, lkv), {0, 2, 1}));
  Tensor p = aten_call("aten::_softmax", "", s * scale, int64_t(2), false);
  Tensor o = aten_call("aten::bmm", "", p, split(v, lkv));  // (N * heads, Lq, d)
  Tensor out = empty({n, lq, c}, dtype, q.device());
  torch::stable::copy_(out, torch::stable::reshape(permute(torch::stable::reshape(o, {n, heads, lq, d}), {0, 2, 1, 3}),
                                                   {n, lq, c}));
  return out;
}

}  // namespace attention
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def("attention_tokens(Tensor q, Tensor k, Tensor v, int heads, float scale) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("attention_tokens", TORCH_BOX(&cutlass_ops::attention::attention_tokens_aten));
}
