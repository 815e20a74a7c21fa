"""A short training run of FusedResNet beside the reference module, from the same weights,
on a small synthetic task: the two loss curves should agree within rounding noise.

    python -m cutlass_ops train-check --steps 50 --device cpu --out bench_results/train
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..fused_resnet import FusedResNet
from ..models import SEResNet9FixUp


def synthetic_task(n: int, in_channels: int, device, dtype, seed: int = 0):
    """Fixed images and a learnable target: a random linear readout of a random net's features."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_channels, 64, 64, generator=g).to(device=device, dtype=dtype)
    teacher = SEResNet9FixUp(in_channels)
    with torch.no_grad():
        for p in teacher.parameters():  # a teacher with non-trivial (random) FixUp scalars
            p.copy_(torch.randn(p.shape, generator=g) * (0.05 if p.dim() == 4 else 0.3))
        target = teacher.to(device=device, dtype=torch.float32)(x.float()).flatten(1)
    readout = torch.randn(target.shape[1], 10, generator=g).to(device) / target.shape[1] ** 0.5
    return x, (target @ readout).to(dtype)


def train_curves(steps=50, n=16, in_channels=3, device="cpu", dtype=torch.float32, lr=0.05, seed=0,
                 amp_dtype=None):
    """Both models from the same weights, SGD with momentum.  With `amp_dtype` the weights
    stay `dtype` (float32) and each step runs under torch.autocast(amp_dtype) with a
    GradScaler, the usual mixed-precision recipe."""
    torch.manual_seed(seed)
    ref = SEResNet9FixUp(in_channels).to(device=device, dtype=dtype)
    head = torch.nn.Linear(512 * 4, 10).to(device=device, dtype=dtype)
    fused = FusedResNet.from_reference(ref)
    models = {"reference (PyTorch)": (ref, head), "FusedResNet": (fused, copy.deepcopy(head))}
    x, y = synthetic_task(n, in_channels, device, dtype, seed)
    curves = {}
    for name, (body, readout) in models.items():
        body.train()
        opt = torch.optim.SGD(list(body.parameters()) + list(readout.parameters()), lr=lr, momentum=0.9)
        curves[name] = train_losses(opt, lambda: F.mse_loss(readout(body(x).flatten(1)).float(), y.float()),
                                    steps, device, amp_dtype)
    a, b = curves.values()
    max_rel_diff = max(abs(u - v) / max(abs(u), 1e-12) for u, v in zip(a, b))
    return {"steps": steps, "n": n, "in_channels": in_channels, "device": str(device),
            "dtype": str(dtype)[6:], "autocast": str(amp_dtype)[6:] if amp_dtype else None, "lr": lr,
            "curves": curves, "max_rel_diff": max_rel_diff}


def train_losses(opt, loss_fn, steps: int, device, amp_dtype=None) -> list[float]:
    """`steps` optimizer steps of `loss_fn()` (the forward and its loss), each under
    torch.autocast(amp_dtype) with a GradScaler when amp_dtype is given; the losses."""
    device_type = torch.device(device).type
    scaler = torch.amp.GradScaler(device_type, enabled=amp_dtype is not None)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses


def plot(result: dict, path: Path, model: str = "SE-ResNet9-FixUp", ylabel: str = "MSE loss",
         log: bool = True) -> None:
    """The two loss curves of a train_curves-style result, overlaid (also cvt_bench's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, losses), style in zip(result["curves"].items(), ("-", "--")):
        ax.plot(losses, style, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    precision = result["dtype"] + (f" + autocast {result['autocast']}" if result.get("autocast") else "")
    ax.set_title(f"{model} training, {precision} on {result['device']} "
                 f"(max rel. diff {result['max_rel_diff']:.1e})", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args) -> int:
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    amp = dtypes[args.amp] if args.amp else None
    if amp is not None and args.dtype != "fp32":
        raise SystemExit("train-check: --amp keeps float32 weights; leave --dtype at fp32")
    from .timing import environment
    result = train_curves(args.steps, args.n, 3, args.device, dtypes[args.dtype], amp_dtype=amp)
    result["environment"] = environment()  # GPU and versions, beside the curves
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    for name, losses in result["curves"].items():
        print(f"{name:22s} loss: step 0 {losses[0]:.4f}  step {len(losses) - 1} {losses[-1]:.4f}")
    print(f"max relative difference between the curves: {result['max_rel_diff']:.2e}")
    try:
        plot(result, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    except ImportError:
        print(f"wrote {out.with_suffix('.json')} (no matplotlib: no plot)")
    return 0
