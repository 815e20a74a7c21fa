// cutlass_ops::giou_loss and giou_loss_backward: generalized-IoU loss of box pairs (as
// torchvision.ops.generalized_box_iou_loss) with optional validity (mask, per-image counts or
// ragged offsets) and the reduction over the valid boxes.  Schemas, checks and the CPU (ATen)
// implementations; CUDA in giou_cuda.cpp, fake impls and autograd in cutlass_ops/ops/giou.py.
#include "giou/giou_op.h"

#include <vector>

namespace cutlass_ops {
namespace giou {

namespace {

IntArrayRef slot_shape(Tensor const& boxes) { return boxes.sizes().slice(0, boxes.dim() - 1); }

void check_device(Tensor const& t, char const* name, Tensor const& boxes1) {
  CUTLASS_OPS_CHECK_VALUE(t.device() == boxes1.device(), "giou_loss: ", name, " is on ", t.device(),
                          " but boxes1 (pred) is on ", boxes1.device());
}

struct Corners {
  Tensor x1, y1, x2, y2;
};

Corners corners(Tensor const& boxes) {
  auto c = unbind(boxes, -1);
  return {c[0], c[1], c[2], c[3]};
}

// The loss and its intermediates, in torchvision's order of operations.
struct Terms {
  Corners a, b;
  Tensor xi1, yi1, xi2, yi2, overlap, inter, uni;
  Tensor xc1, yc1, xc2, yc2, enclose, loss;
};

// where(cond, t, 0): the 0 as a 0-dim tensor of t's dtype (ATen's where.ScalarOther).
Tensor where_else_zero(Tensor const& cond, Tensor const& t) { return where(cond, t, scalar_like(t, 0.0)); }

Terms giou_terms(Tensor const& boxes1, Tensor const& boxes2, double eps) {
  auto math = loss_dtype(boxes1.scalar_type());
  Terms t;
  t.a = corners(to_dtype(boxes1, math));
  t.b = corners(to_dtype(boxes2, math));
  Corners const& a = t.a;
  Corners const& b = t.b;
  t.xi1 = maximum(a.x1, b.x1);
  t.yi1 = maximum(a.y1, b.y1);
  t.xi2 = minimum(a.x2, b.x2);
  t.yi2 = minimum(a.y2, b.y2);
  t.overlap = (t.yi2 > t.yi1) & (t.xi2 > t.xi1);
  t.inter = where_else_zero(t.overlap, (t.xi2 - t.xi1) * (t.yi2 - t.yi1));
  t.uni = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - t.inter;
  t.xc1 = minimum(a.x1, b.x1);
  t.yc1 = minimum(a.y1, b.y1);
  t.xc2 = maximum(a.x2, b.x2);
  t.yc2 = maximum(a.y2, b.y2);
  t.enclose = (t.xc2 - t.xc1) * (t.yc2 - t.yc1);
  auto iou = t.inter / (t.uni + eps);
  t.loss = 1.0 - (iou - (t.enclose - t.uni) / (t.enclose + eps));
  return t;
}

// The valid slots as a bool tensor shaped like the per-box loss; undefined when all are.
Tensor valid_slots(Tensor const& boxes1, std::optional<Tensor> const& mask,
                   std::optional<Tensor> const& counts,
                   std::optional<Tensor> const& offsets) {
  if (mask) return *mask;
  if (counts) {
    return torch::stable::unsqueeze(arange_long(boxes1.size(1), counts->device()), 0) <
           torch::stable::unsqueeze(*counts, 1);
  }
  if (offsets) {
    auto t = arange_long(boxes1.size(0), offsets->device());
    return (t >= torch::stable::select(*offsets, 0, 0)) & (t < torch::stable::select(*offsets, 0, -1));
  }
  return {};
}

Tensor count_valid(Tensor const& valid, Tensor const& boxes1) {
  if (valid.defined()) return torch::stable::sum(valid);
  return scalar_tensor(double(boxes1.numel() / 4), kLong, boxes1.device());
}

// max(t, 1) for the int64 count (clamp_min's Tensor overload: no Scalar).
Tensor at_least_one(Tensor const& num_valid) {
  return aten_call("aten::clamp_min", "Tensor", num_valid, scalar_like(num_valid, 1.0));
}

// d max(a, b) / da as torch.maximum defines it: ties take half.  d min(a, b) / da = dmax(b, a).
Tensor dmax(Tensor const& a, Tensor const& b) {
  return to_dtype(a > b, a.scalar_type()) + to_dtype(eq(a, b), a.scalar_type()) * 0.5;
}

}  // namespace

ScalarType loss_dtype(ScalarType boxes_dtype) {
  return boxes_dtype == kDouble ? kDouble : kFloat;
}

LossReduction check_inputs(Tensor const& boxes1, Tensor const& boxes2,
                           std::optional<Tensor> const& mask,
                           std::optional<Tensor> const& counts,
                           std::optional<Tensor> const& offsets, std::string_view reduction) {
  auto dtype = boxes1.scalar_type();
  CUTLASS_OPS_CHECK_VALUE(dtype == kFloat || dtype == kDouble || dtype == kHalf || dtype == kBFloat16,
                          "giou_loss: boxes1 (pred) must be float32, float64, float16 or bfloat16, got ", dtype);
  CUTLASS_OPS_CHECK_VALUE(boxes1.dim() >= 1 && boxes1.size(-1) == 4,
                          "giou_loss: boxes1 (pred) must have shape [..., 4] (x1, y1, x2, y2), got ",
                          boxes1.sizes());
  CUTLASS_OPS_CHECK_VALUE(boxes2.sizes() == boxes1.sizes(), "giou_loss: boxes2 (target) shape ", boxes2.sizes(),
                          " differs from boxes1 (pred) shape ", boxes1.sizes());
  CUTLASS_OPS_CHECK_VALUE(boxes2.scalar_type() == dtype, "giou_loss: boxes2 (target) dtype ",
                          boxes2.scalar_type(), " differs from boxes1 (pred) dtype ", dtype);
  check_device(boxes2, "boxes2 (target)", boxes1);
  CUTLASS_OPS_CHECK_VALUE(int(mask.has_value()) + int(counts.has_value()) + int(offsets.has_value()) <= 1,
                          "giou_loss: give at most one of mask, counts and offsets");
  if (mask) {
    CUTLASS_OPS_CHECK_VALUE(mask->scalar_type() == kBool, "giou_loss: mask must be bool, got ",
                            mask->scalar_type());
    CUTLASS_OPS_CHECK_VALUE(mask->sizes() == slot_shape(boxes1), "giou_loss: mask must have shape ",
                            slot_shape(boxes1), " (the boxes' shape without the last dim), got ", mask->sizes());
    check_device(*mask, "mask", boxes1);
  }
  if (counts) {
    CUTLASS_OPS_CHECK_VALUE(boxes1.dim() == 3,
                            "giou_loss: with counts, boxes1 (pred) must be padded (B, M, 4), got ", boxes1.sizes());
    CUTLASS_OPS_CHECK_VALUE(counts->dim() == 1 && counts->size(0) == boxes1.size(0),
                            "giou_loss: counts must have shape (", boxes1.size(0),
                            ",) (one count per image), got ", counts->sizes());
    CUTLASS_OPS_CHECK_VALUE(counts->scalar_type() == kLong, "giou_loss: counts must be int64, got ",
                            counts->scalar_type());
    check_device(*counts, "counts", boxes1);
  }
  if (offsets) {
    CUTLASS_OPS_CHECK_VALUE(boxes1.dim() == 2, "giou_loss: with offsets, boxes1 (pred) must be ragged (T, 4), got ",
                            boxes1.sizes());
    CUTLASS_OPS_CHECK_VALUE(
        offsets->dim() == 1 && offsets->size(0) >= 1,
        "giou_loss: offsets must have shape (B + 1,) (image b holds boxes offsets[b]:offsets[b+1]), got ",
        offsets->sizes());
    CUTLASS_OPS_CHECK_VALUE(offsets->scalar_type() == kLong, "giou_loss: offsets must be int64, got ",
                            offsets->scalar_type());
    check_device(*offsets, "offsets", boxes1);
  }
  CUTLASS_OPS_CHECK_VALUE(reduction == "none" || reduction == "mean" || reduction == "sum",
                          "giou_loss: reduction must be 'none', 'mean' or 'sum', got '", reduction, "'");
  return reduction == "none" ? LossReduction::kNone : reduction == "mean" ? LossReduction::kMean : LossReduction::kSum;
}

void check_backward_inputs(Tensor const& grad_loss, Tensor const& boxes1, Tensor const& num_valid,
                           LossReduction reduction) {
  if (reduction == LossReduction::kNone) {
    CUTLASS_OPS_CHECK_VALUE(grad_loss.sizes() == slot_shape(boxes1),
                            "giou_loss_backward: grad_loss must have the loss's shape ", slot_shape(boxes1),
                            ", got ", grad_loss.sizes());
  } else {
    CUTLASS_OPS_CHECK_VALUE(grad_loss.dim() == 0, "giou_loss_backward: grad_loss must be a scalar, got ",
                            grad_loss.sizes());
  }
  CUTLASS_OPS_CHECK_VALUE(is_floating(grad_loss.scalar_type()),
                          "giou_loss_backward: grad_loss must be floating, got ", grad_loss.scalar_type());
  CUTLASS_OPS_CHECK_VALUE(num_valid.dim() == 0 && num_valid.scalar_type() == kLong,
                          "giou_loss_backward: num_valid must be an int64 scalar, got ", num_valid.scalar_type(),
                          num_valid.sizes());
  check_device(grad_loss, "grad_loss", boxes1);
  check_device(num_valid, "num_valid", boxes1);
}

std::tuple<Tensor, Tensor> giou_loss_aten(
    Tensor const& boxes1, Tensor const& boxes2, std::optional<Tensor> const& mask,
    std::optional<Tensor> const& counts, std::optional<Tensor> const& offsets,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  Tensor loss = giou_terms(boxes1, boxes2, eps).loss;
  Tensor valid = valid_slots(boxes1, mask, counts, offsets);
  if (valid.defined()) loss = where_else_zero(valid, loss);  // where, not *: padding may hold NaN
  Tensor num_valid = count_valid(valid, boxes1);
  if (r == LossReduction::kSum) loss = torch::stable::sum(loss);
  if (r == LossReduction::kMean) loss = torch::stable::sum(loss) / at_least_one(num_valid);
  return {loss, num_valid};
}

std::tuple<Tensor, Tensor> giou_loss_backward_aten(
    Tensor const& grad_loss, Tensor const& boxes1, Tensor const& boxes2,
    std::optional<Tensor> const& mask, std::optional<Tensor> const& counts,
    std::optional<Tensor> const& offsets, Tensor const& num_valid,
    std::string_view reduction, double eps) {
  auto r = check_inputs(boxes1, boxes2, mask, counts, offsets, reduction);
  check_backward_inputs(grad_loss, boxes1, num_valid, r);
  Terms t = giou_terms(boxes1, boxes2, eps);
  Corners const& a = t.a;
  Corners const& b = t.b;
  Tensor g = to_dtype(grad_loss, loss_dtype(boxes1.scalar_type()));
  if (r == LossReduction::kMean) g = g / at_least_one(num_valid);

  // loss = 1 - inter / ue + (enclose - union) / ce, union = area_a + area_b - inter
  auto ue = t.uni + eps, ce = t.enclose + eps;
  auto d_union = g * (t.inter / ue / ue - 1.0 / ce);
  auto d_inter = -g / ue - d_union;
  auto d_enclose = g * (ue / ce / ce);

  auto wa = a.x2 - a.x1, ha = a.y2 - a.y1, wb = b.x2 - b.x1, hb = b.y2 - b.y1;
  // Without overlap torchvision's intersection is a constant 0.
  auto d_iw = where_else_zero(t.overlap, d_inter * (t.yi2 - t.yi1));
  auto d_ih = where_else_zero(t.overlap, d_inter * (t.xi2 - t.xi1));
  auto d_cw = d_enclose * (t.yc2 - t.yc1), d_ch = d_enclose * (t.xc2 - t.xc1);
  auto grad = [&](Corners const& p, Corners const& q, Tensor const& w, Tensor const& h) {
    return stack({-d_union * h - d_iw * dmax(p.x1, q.x1) - d_cw * dmax(q.x1, p.x1),
                  -d_union * w - d_ih * dmax(p.y1, q.y1) - d_ch * dmax(q.y1, p.y1),
                  d_union * h + d_iw * dmax(q.x2, p.x2) + d_cw * dmax(p.x2, q.x2),
                  d_union * w + d_ih * dmax(q.y2, p.y2) + d_ch * dmax(p.y2, q.y2)},
                 -1);
  };
  Tensor grad1 = grad(a, b, wa, ha), grad2 = grad(b, a, wb, hb);
  Tensor valid = valid_slots(boxes1, mask, counts, offsets);
  if (valid.defined()) {
    Tensor valid_xyxy = torch::stable::unsqueeze(valid, -1);
    grad1 = where_else_zero(valid_xyxy, grad1);
    grad2 = where_else_zero(valid_xyxy, grad2);
  }
  return {to_dtype(grad1, boxes1.scalar_type()), to_dtype(grad2, boxes2.scalar_type())};
}

}  // namespace giou
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_FRAGMENT(cutlass_ops, m) {
  m.def(
      "giou_loss(Tensor boxes1, Tensor boxes2, Tensor? mask=None, Tensor? counts=None, "
      "Tensor? offsets=None, str reduction=\"none\", float eps=1e-07) -> (Tensor loss, Tensor num_valid)");
  m.def(
      "giou_loss_backward(Tensor grad_loss, Tensor boxes1, Tensor boxes2, Tensor? mask, Tensor? counts, "
      "Tensor? offsets, Tensor num_valid, str reduction, float eps) -> (Tensor grad_boxes1, Tensor grad_boxes2)");
}

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CPU, m) {
  m.impl("giou_loss", TORCH_BOX(&cutlass_ops::giou::giou_loss_aten));
  m.impl("giou_loss_backward", TORCH_BOX(&cutlass_ops::giou::giou_loss_backward_aten));
}
