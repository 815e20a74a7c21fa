"""GIoU loss benchmark (not a test): forward + backward of a detection batch's box loss.

A batch of B images with a long-tailed number of boxes each (most under 10, a few up to 256),
the "mean" GIoU loss over all boxes of the batch and its gradient with respect to the
predictions, by:

  cutlass_ops.giou_loss_ragged   (T, 4) boxes + offsets: one kernel forward (+ a one-block
                                 reduction), one backward
  cutlass_ops.giou_loss_padded   (B, M, 4) boxes + per-image counts: the same kernels
  per-image loop                 torchvision per image, slicing the padded batch
  cat + torchvision              slice each image out of the padded batch, torch.cat, torchvision
  padded composite (mask)        torchvision on the whole padded batch, masked mean
  torchvision (ragged input)     torchvision on boxes already concatenated (no preparation)

Each timing covers the whole loss: the data preparation the method needs (slicing, cat,
mask), the forward and the backward.  CUDA events, warm-up, medians (timing.time_cuda).

    python -m cutlass_ops.tools.giou_bench [out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from .timing import environment, time_cuda, write_json
from ..ops import giou_loss_padded, giou_loss_ragged


def _giou_formula(boxes1, boxes2, reduction="none", eps=1e-7):
    """torchvision.ops.generalized_box_iou_loss restated: the baseline when torchvision is absent."""
    boxes1 = boxes1 if boxes1.dtype in (torch.float32, torch.float64) else boxes1.float()
    boxes2 = boxes2 if boxes2.dtype in (torch.float32, torch.float64) else boxes2.float()
    x1, y1, x2, y2 = boxes1.unbind(-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(-1)
    xkis1, ykis1 = torch.max(x1, x1g), torch.max(y1, y1g)
    xkis2, ykis2 = torch.min(x2, x2g), torch.min(y2, y2g)
    inter = torch.zeros_like(x1)
    m = (ykis2 > ykis1) & (xkis2 > xkis1)
    inter[m] = (xkis2[m] - xkis1[m]) * (ykis2[m] - ykis1[m])
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    area_c = (torch.max(x2, x2g) - torch.min(x1, x1g)) * (torch.max(y2, y2g) - torch.min(y1, y1g))
    loss = 1 - (inter / (union + eps) - (area_c - union) / (area_c + eps))
    if reduction == "mean":
        return loss.mean() if loss.numel() > 0 else 0.0 * loss.sum()
    return loss.sum() if reduction == "sum" else loss


def giou_batch(images=1024, max_boxes=256, dtype=torch.float32, alpha=1.2, seed=0, device="cuda") -> dict:
    """Predicted and target boxes of a batch, padded and ragged.  Boxes per image follow a
    discrete Pareto law, P(count >= k) = k^-alpha (alpha=1.2: ~94% of images under 10 boxes,
    mean ~4), capped at max_boxes."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.rand(images, generator=g, dtype=torch.float64).pow(-1.0 / alpha).floor()
    counts = counts.clamp(max=max_boxes).long()
    total = int(counts.sum())
    xy = torch.rand(total, 2, generator=g) * 0.8
    wh = torch.rand(total, 2, generator=g) * 0.18 + 0.02
    target = torch.cat([xy, xy + wh], -1)
    pred = target + torch.randn(total, 4, generator=g) * 0.02  # some inverted/degenerate: fine
    mask = torch.arange(max_boxes)[None, :] < counts[:, None]
    pad_pred = torch.zeros(images, max_boxes, 4)
    pad_target = torch.zeros(images, max_boxes, 4)
    pad_pred[mask], pad_target[mask] = pred, target
    offsets = torch.zeros(images + 1, dtype=torch.int64)
    offsets[1:] = counts.cumsum(0)
    cuda = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    return {"pred": cuda(pred).requires_grad_(), "target": cuda(target), "offsets": cuda(offsets),
            "pad_pred": cuda(pad_pred).requires_grad_(), "pad_target": cuda(pad_target),
            "counts": cuda(counts), "counts_list": counts.tolist(), "mask": cuda(mask)}


def _methods(b: dict, tv_loss) -> dict:
    """name -> fn() returning (loss, gradient w.r.t. the predictions)."""
    pred, target, offsets = b["pred"], b["target"], b["offsets"]
    pad_pred, pad_target, counts, counts_list = b["pad_pred"], b["pad_target"], b["counts"], b["counts_list"]
    total = max(sum(counts_list), 1)
    max_boxes = pad_pred.shape[1]

    def with_grad(loss, leaf):
        return loss, torch.autograd.grad(loss, leaf)[0]

    def fused_ragged():
        return with_grad(giou_loss_ragged(pred, target, offsets, "mean"), pred)

    def fused_padded():
        return with_grad(giou_loss_padded(pad_pred, pad_target, counts=counts, reduction="mean"), pad_pred)

    def per_image_loop():
        loss = sum(tv_loss(pad_pred[i, :n], pad_target[i, :n], "sum") for i, n in enumerate(counts_list) if n)
        return with_grad(loss / total, pad_pred)

    def cat_torchvision():
        p = torch.cat([pad_pred[i, :n] for i, n in enumerate(counts_list)])
        t = torch.cat([pad_target[i, :n] for i, n in enumerate(counts_list)])
        return with_grad(tv_loss(p, t, "mean"), pad_pred)

    def padded_composite():
        mask = torch.arange(max_boxes, device=counts.device)[None, :] < counts[:, None]
        per_box = torch.where(mask, tv_loss(pad_pred, pad_target, "none"), 0)
        return with_grad(per_box.sum() / mask.sum().clamp_min(1), pad_pred)

    def torchvision_ragged():
        return with_grad(tv_loss(pred, target, "mean"), pred)

    return {"cutlass_ops.giou_loss_ragged": fused_ragged,
            "cutlass_ops.giou_loss_padded": fused_padded,
            "per-image loop (torchvision)": per_image_loop,
            "cat + torchvision": cat_torchvision,
            "padded composite (mask)": padded_composite,
            "torchvision (ragged input)": torchvision_ragged}


def bench_giou(images=1024, max_boxes=256, dtype=torch.float32, alpha=1.2, seed=0, iters=100,
               loop_iters=10) -> dict:
    """Median ms of forward + backward per method, with each method's error against a float64
    evaluation of torchvision's formula.  The per-image loop runs `loop_iters` timed
    iterations (it takes ~1000x longer)."""
    try:
        from torchvision.ops import generalized_box_iou_loss as tv_loss
        baseline = "torchvision"
    except ImportError:
        tv_loss, baseline = _giou_formula, "torchvision's formula restated (torchvision not installed)"
    b = giou_batch(images, max_boxes, dtype, alpha, seed)
    valid = b["mask"]
    pred64 = b["pred"].detach().double().requires_grad_()
    ref_loss = _giou_formula(pred64, b["target"].double(), "mean")
    ref_grad = torch.autograd.grad(ref_loss, pred64)[0]

    results = {}
    for name, fn in _methods(b, tv_loss).items():
        try:
            loss, grad = fn()
            grad = grad[valid] if grad.dim() == 3 else grad  # padded layout -> the boxes in order
            row = {"loss_abs_error": abs(loss.item() - ref_loss.item()),
                   "grad_rel_error": ((grad.double() - ref_grad).norm() / ref_grad.norm()).item()}
            slow = name.startswith("per-image")
            row.update(time_cuda(fn, warmup=2 if slow else 20, iters=loop_iters if slow else iters))
        except Exception as e:  # one failing method should not lose the others' numbers
            row = {"error": f"{type(e).__name__}: {e}"}
        results[name] = row

    counts = torch.tensor(b["counts_list"])
    return {"problem": {"images": images, "max_boxes": max_boxes, "dtype": str(dtype).replace("torch.", ""),
                        "alpha": alpha, "seed": seed, "boxes": int(counts.sum()),
                        "mean_boxes": counts.double().mean().item(), "max_boxes_drawn": int(counts.max()),
                        "images_under_10_boxes": (counts < 10).double().mean().item(),
                        "reduction": "mean over all boxes of the batch", "baseline": baseline},
            "environment": environment(), "results": results}


def print_giou_table(result: dict) -> None:
    p = result["problem"]
    print(f"GIoU loss forward+backward, {p['images']} images, {p['boxes']} boxes "
          f"(mean {p['mean_boxes']:.1f}, max {p['max_boxes_drawn']}, {100 * p['images_under_10_boxes']:.0f}% "
          f"of images under 10), {p['dtype']}, baseline: {p['baseline']}")
    ok = {k: v for k, v in result["results"].items() if "median_ms" in v}
    fused = ok.get("cutlass_ops.giou_loss_ragged", {}).get("median_ms")
    print(f"{'method':44s} {'median ms':>10s} {'vs fused':>9s} {'loss err':>9s} {'grad err':>9s}")
    for name, r in sorted(ok.items(), key=lambda kv: kv[1]["median_ms"]):
        ratio = f"{r['median_ms'] / fused:8.2f}x" if fused else ""
        print(f"{name:44s} {r['median_ms']:10.4f} {ratio:>9s} {r['loss_abs_error']:9.1e} {r['grad_rel_error']:9.1e}")
    for name, r in result["results"].items():
        if "error" in r:
            print(f"{name:44s} failed: {r['error']}")


if __name__ == "__main__":
    res = bench_giou()
    print_giou_table(res)
    if len(sys.argv) > 1:
        write_json(Path(sys.argv[1]), res)
