"""Generalized-IoU loss: ``torchvision.ops.generalized_box_iou_loss`` as one fused CUDA kernel
forward and one backward, for flat, padded and ragged batches of boxes.

All three functions run the op ``torch.ops.cutlass_ops.giou_loss`` (backward:
``giou_loss_backward``), which returns ``(loss, num_valid)``; they return the loss.

Semantics shared by all forms:

- Boxes are ``(x1, y1, x2, y2)``; the loss of a pair is torchvision's, eps included:
  ``1 - (inter / (union + eps) - (enclose - union) / (enclose + eps))``.  Degenerate boxes
  (zero width or height, x2 < x1) give torchvision's numbers and gradients (ties between
  corners split the gradient in half, as ``torch.maximum`` does).
- float32, float16 and bfloat16 boxes are computed in float32 (float64 in float64).  The
  loss is float32 (float64 for float64 boxes), as torchvision's upcast makes it; gradients
  come back in the boxes' dtype.  Integer boxes are converted to float32, as torchvision does.
- Invalid boxes (padding, outside the ragged range) are never read: loss 0, gradient 0.
  ``"mean"`` is the sum over the valid boxes of the whole batch divided by their number
  (at least 1, so a batch without boxes gives 0); ``"sum"`` is that sum; ``"none"`` is the
  per-box loss with 0 at invalid boxes.
- No host sync (CUDA-graph safe); the reductions are deterministic (no float atomics).
- Both box sets get gradients; no double backward.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import _library  # noqa: F401  (loads the op library)


def _as_float(boxes: torch.Tensor, name: str = "boxes") -> torch.Tensor:
    # torchvision upcasts integer boxes before computing; complex ones would lose their
    # imaginary part (with only a warning): refuse them.
    if not isinstance(boxes, torch.Tensor):
        raise TypeError(f"giou_loss: {name} must be a tensor, got {type(boxes).__name__}")
    if boxes.is_complex():
        raise ValueError(f"giou_loss: {name} must be real (float or integer), got {boxes.dtype}")
    return boxes if boxes.is_floating_point() else boxes.float()


def giou_loss(boxes1: torch.Tensor, boxes2: torch.Tensor, reduction: str = "none",
              eps: float = 1e-7) -> torch.Tensor:
    """Drop-in ``torchvision.ops.generalized_box_iou_loss(boxes1, boxes2, reduction, eps)``.

    boxes1, boxes2  [..., 4] xyxy boxes, same shape, dtype and device.
    reduction       "none" ([...] per-box loss), "mean" or "sum" (0-d; mean of no boxes is 0).
    """
    return torch.ops.cutlass_ops.giou_loss(_as_float(boxes1, "boxes1 (pred)"), _as_float(boxes2, "boxes2 (target)"),
                                           None, None, None,
                                           reduction, eps)[0]


def giou_loss_padded(pred: torch.Tensor, target: torch.Tensor, counts: Optional[torch.Tensor] = None,
                     mask: Optional[torch.Tensor] = None, reduction: str = "none",
                     eps: float = 1e-7) -> torch.Tensor:
    """GIoU loss of a padded batch: image b holds boxes pred[b, m], target[b, m].

    pred, target  (B, M, 4) xyxy boxes; padding slots may hold anything (even NaN).
    counts        (B,) int64: box m of image b is valid iff m < counts[b]; or
    mask          (B, M) bool: valid iff mask[b, m]; neither: every box is valid.
    reduction     "none" ((B, M), 0 at padding), "mean" over all valid boxes of the batch, "sum".
    """
    if pred.dim() != 3:
        raise ValueError(f"giou_loss_padded: pred must be (B, M, 4), got {tuple(pred.shape)}")
    return torch.ops.cutlass_ops.giou_loss(_as_float(pred, "boxes1 (pred)"), _as_float(target, "boxes2 (target)"),
                                           mask, counts, None,
                                           reduction, eps)[0]


def giou_loss_ragged(pred: torch.Tensor, target: torch.Tensor, offsets: torch.Tensor,
                     reduction: str = "none", eps: float = 1e-7) -> torch.Tensor:
    """GIoU loss of a ragged batch: image b holds boxes pred[offsets[b]:offsets[b+1]].

    pred, target  (T, 4) xyxy boxes of all images, concatenated.
    offsets       (B + 1,) int64, nondecreasing (not checked: that would need a host sync).
                  Boxes outside offsets[0]:offsets[B] (e.g. a preallocated tail) are invalid.
    reduction     "none" ((T,), 0 at invalid boxes), "mean" over all valid boxes of the batch, "sum".
    """
    return torch.ops.cutlass_ops.giou_loss(_as_float(pred, "boxes1 (pred)"), _as_float(target, "boxes2 (target)"),
                                           None, None, offsets,
                                           reduction, eps)[0]


def _check_devices(boxes1, named):
    # The fake impl also runs for a mix of meta and real tensors: check like the C++ impls.
    for name, t in named:
        if t is not None and t.device != boxes1.device:
            raise ValueError(f"giou_loss: {name} is on {t.device} but boxes1 (pred) is on {boxes1.device}")


@torch.library.register_fake("cutlass_ops::giou_loss")
def _giou_loss_fake(boxes1, boxes2, mask=None, counts=None, offsets=None, reduction="none", eps=1e-7):
    _check_devices(boxes1, [("boxes2 (target)", boxes2), ("mask", mask), ("counts", counts), ("offsets", offsets)])
    torch._check(boxes1.dim() >= 1 and boxes1.shape[-1] == 4,
                 lambda: f"giou_loss: boxes1 (pred) must have shape [..., 4], got {tuple(boxes1.shape)}")
    torch._check(boxes2.shape == boxes1.shape,
                 lambda: "giou_loss: boxes2 (target) shape differs from boxes1 (pred) shape")
    dtype = torch.float64 if boxes1.dtype == torch.float64 else torch.float32
    shape = boxes1.shape[:-1] if reduction == "none" else ()
    return boxes1.new_empty(shape, dtype=dtype), boxes1.new_empty((), dtype=torch.int64)


@torch.library.register_fake("cutlass_ops::giou_loss_backward")
def _giou_loss_backward_fake(grad_loss, boxes1, boxes2, mask, counts, offsets, num_valid, reduction, eps):
    _check_devices(boxes1, [("boxes2 (target)", boxes2), ("mask", mask), ("counts", counts), ("offsets", offsets),
                            ("grad_loss", grad_loss), ("num_valid", num_valid)])
    return boxes1.new_empty(boxes1.shape), boxes2.new_empty(boxes2.shape)


def _setup_context(ctx, inputs, output):
    boxes1, boxes2, mask, counts, offsets, reduction, eps = inputs
    ctx.save_for_backward(boxes1, boxes2, mask, counts, offsets, output[1])
    ctx.reduction, ctx.eps = reduction, eps


def _backward(ctx, grad_loss, _grad_num_valid):
    boxes1, boxes2, mask, counts, offsets, num_valid = ctx.saved_tensors
    grad1, grad2 = torch.ops.cutlass_ops.giou_loss_backward(
        grad_loss, boxes1, boxes2, mask, counts, offsets, num_valid, ctx.reduction, ctx.eps)
    return grad1, grad2, None, None, None, None, None


torch.library.register_autograd("cutlass_ops::giou_loss", _backward, setup_context=_setup_context)


def _no_double_backward(ctx, grad_boxes1, grad_boxes2):
    raise NotImplementedError("giou_loss: double backward (gradients of the gradient) is not implemented")


# An error rather than torch's warning and silently wrong numbers for create_graph=True.
torch.library.register_autograd("cutlass_ops::giou_loss_backward", _no_double_backward)
