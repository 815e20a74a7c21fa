"""``bench cvt-ops``: CvT-13's parts one at a time, FusedCvT's path against the reference's (a
per-op table), forward and forward + backward, at each stage's shapes.

    python -m cutlass_ops bench cvt-ops --n 64          # 224x224 fp16, stages 1-3, JSON to bench_results/

The parts, as FusedCvT's forward calls them (``FusedCvT._embed``, ``_project``, ``_attend``,
``_mlp``, ``_add_layer_norm``) and as the reference module computes them (its modules and
functions, eager):

- embedding: the conv embedding (conv + bias, LayerNorm), the stage's input map -> tokens;
- norm: the residual add and LayerNorm before a block's attention;
- projection: dw_bn q/k/v (depthwise conv + BatchNorm; the cls token beside them in stage 3)
  and the q/k/v Linears, split into heads;
- attention: softmax(q k^T * scale) v over the heads and the output Linear;
- MLP: fc1, QuickGELU, fc2.

Each on its own inputs at the stage's shapes (block 0 of each stage; random tokens), in the
model's mode (eval for the forward, train for forward + backward, as `bench cvt`), timed in
`bench`'s metrics: throughput (K back-to-back calls between two CUDA events, median of reps)
and device time (the profiler's kernel sum of one call).  Eager calls, no CUDA graph: launch
gaps count in throughput, not in device time.  The backward is ``torch.autograd.grad`` of the
output's sum of squares w.r.t. the input and the part's parameters.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.nn.functional as F

from ..fused_cvt import FusedCvT
from ..models.cvt import merge_heads, split_heads
from .timing import device_time, time_throughput

PARTS = ("embedding", "norm", "projection", "attention", "MLP")


def _reference_parts(model, stage, blk, h: int, w: int) -> dict[str, Callable]:
    """The reference's computation of each part: name -> fn(*inputs)."""
    attn = blk.attn

    def projection(t):
        q, k, v = attn.forward_conv(t, h, w)
        return (split_heads(attn.proj_q(q), attn.num_heads), split_heads(attn.proj_k(k), attn.num_heads),
                split_heads(attn.proj_v(v), attn.num_heads))

    def attention(q, k, v):
        a = attn.attn_drop(F.softmax(torch.matmul(q, k.transpose(-2, -1)) * attn.scale, dim=-1))
        return attn.proj_drop(attn.proj(merge_heads(torch.matmul(a, v))))

    return {"embedding": lambda x: stage.patch_embed(x), "norm": lambda t, r: blk.norm1(t + r),
            "projection": projection, "attention": attention, "MLP": lambda t: blk.mlp(t)}


def _fused_parts(model: FusedCvT, stage, blk, h: int, w: int) -> dict[str, Callable]:
    """FusedCvT's computation of each part, as its forward calls them."""
    return {"embedding": lambda x: model._embed(stage, x)[0],  # x in NHWC memory, as the forward has it
            "norm": lambda t, r: model._add_layer_norm(t, blk.norm1, r)[0],
            "projection": lambda t: model._project(blk.attn, t, h, w, model._eval_folds()),
            "attention": lambda q, k, v: model._attend(blk.attn, q, k, v),
            "MLP": lambda t: model._mlp(blk.mlp, t)}


def _inputs(model, stage_index: int, n: int, size: int, dtype, device, g) -> tuple[dict, int, int]:
    """Each part's random inputs at stage `stage_index`'s shapes, and the stage's map size."""
    stages = list(model.stages())
    stage = stages[stage_index]
    c_in = stage.patch_embed.proj.in_channels
    hw_in = size if stage_index == 0 else size // (4 * 2 ** (stage_index - 1))  # 224, 56, 28 at 224
    x = torch.randn(n, c_in, hw_in, hw_in, generator=g).to(device, dtype)
    with torch.no_grad():
        y = stage.patch_embed.proj(x)
    h, w, c = y.shape[2], y.shape[3], y.shape[1]
    tokens = h * w + (1 if stage.cls_token is not None else 0)
    t = torch.randn(n, tokens, c, generator=g).to(device, dtype)
    r = torch.randn(n, tokens, c, generator=g).to(device, dtype)
    blk = stage.blocks[0]
    # k and v: the 3x3 stride-2 pad-1 projection's map, and the cls token
    heads, kv = blk.attn.num_heads, ((h + 1) // 2) * ((w + 1) // 2) + (1 if stage.cls_token is not None else 0)
    q = torch.randn(n, heads, tokens, c // heads, generator=g).to(device, dtype)
    k = torch.randn(n, heads, kv, c // heads, generator=g).to(device, dtype)
    v = torch.randn(n, heads, kv, c // heads, generator=g).to(device, dtype)
    return {"embedding": (x,), "norm": (t, r), "projection": (t,), "attention": (q, k, v), "MLP": (t,)}, h, w


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _timed(fn: Callable, calls: int, reps: int, timer, device: str) -> dict:
    for _ in range(3):
        fn()
    out = {"throughput_ms": statistics.median(timer(fn, calls, reps))}
    if device == "cuda":
        out.update({k: v for k, v in device_time(fn).items() if k != "kernel_us"})
    return out


def bench_cvt_ops(n: int = 64, size: int = 224, dtype=torch.float16, device: str = "cuda", stages=(0, 1, 2),
                  calls: int = 20, reps: int = 5, timer=time_throughput, progress=print) -> dict:
    """{"rows": [{stage, part, pass, FusedCvT: metrics, reference: metrics}]} (see the module
    docstring); ``timer`` (fn, calls, reps) -> ms per call, CUDA events by default."""
    from .cvt_bench import cvt_reference
    ref = cvt_reference(dtype, device)
    fused = FusedCvT.from_reference(ref)
    g = torch.Generator().manual_seed(0)
    rows = []
    for si in stages:
        inputs, h, w = _inputs(ref, si, n, size, dtype, device, g)
        systems = {}
        for label, model in (("FusedCvT", fused), ("reference", ref)):
            stage = list(model.stages())[si]
            parts = (_fused_parts if label == "FusedCvT" else _reference_parts)(model, stage, stage.blocks[0], h, w)
            systems[label] = (model, stage, parts)
        for part in PARTS:
            for pass_ in ("forward", "forward+backward"):
                row = {"stage": si + 1, "part": part, "pass": pass_, "n": n}
                for label, (model, stage, parts) in systems.items():
                    progress(f"stage {si + 1} {part} {pass_}: {label} ...")
                    fn_part = parts[part]
                    args = inputs[part]
                    if label == "FusedCvT" and part == "embedding":  # its maps are NHWC in memory
                        args = (args[0].contiguous(memory_format=torch.channels_last),)
                    if pass_ == "forward":
                        model.eval()

                        def fn(fn_part=fn_part, args=args):
                            with torch.no_grad():
                                fn_part(*args)
                    else:
                        model.train()
                        xs = [t.detach().requires_grad_(True) for t in args]
                        params = [p for p in (stage.patch_embed if part == "embedding" else stage.blocks[0]).parameters()
                                  if p.requires_grad]

                        def fn(fn_part=fn_part, xs=xs, params=params):
                            outs = _outputs(fn_part(*xs))
                            loss = sum(o.float().square().sum() for o in outs)
                            torch.autograd.grad(loss, xs + params, allow_unused=True)
                    row[label] = _timed(fn, calls, reps, timer, device)
                rows.append(row)
                progress(format_row(row))
    ref.eval()
    fused.eval()
    return {"model": "CvT-13", "size": size, "dtype": str(dtype)[6:], "rows": rows,
            "timing": {"throughput": f"{calls} back-to-back eager calls between two CUDA events, median of {reps}",
                       "device_time": "torch.profiler kernel sum of one call"}}


def format_row(row: dict) -> str:
    parts = [f"stage {row['stage']} {row['part']:10s} {row['pass']:16s}"]
    for label in ("FusedCvT", "reference"):
        r = row.get(label, {})
        parts.append(f"{label}: {r.get('throughput_ms', float('nan')):.4f} ms"
                     + (f" (device {r['device_ms']:.4f}, {r['kernels']} kernels)" if "device_ms" in r else ""))
    return "  ".join(parts)
