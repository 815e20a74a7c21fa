"""``bench mlp``: FusedMLP vs eager PyTorch and torch.compile (max-autotune), inference and
fwd+bwd, at several batch sizes.  JSON out.

Metrics as in bench.py: **throughput**, `calls` back-to-back calls between two CUDA events,
median of `reps`, per call; **latency**, one synchronized call between two events, median.
Each system is set up (for FusedMLP: kernel compile or cache load, reported as compile_s /
load_s; for torch.compile: compile + autotune) and timed, then released before the next.
**Device time**: the profiler's kernel sum of one call (timing.device_time). Timing helpers
are tools/timing.py's.  Each system's rate in throughput is also given against the GPU's datasheet
peaks (the fraction of tensor and memory peak): TFLOP/s of the Linear layers'
work and TB/s of the least memory traffic (x and y; a training step also dy and dx).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time

import torch
import torch.nn as nn

from .timing import device_time, graphed, gpu_peaks, time_cuda, time_throughput
from ..fused_mlp import FusedMLP
from ..options import MlpOptions


class _Sin30(nn.Module):
    def forward(self, x):
        return torch.sin(30.0 * x)


def _chain(widths, act):
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            mods.append(act())
    return nn.Sequential(*mods)


# The benchmark models (name -> constructor): width 64 with 4 hidden layers, width 128 with 6, a
# SIREN of width 256 with 5 layers, odd widths (input 32 / output 16 where the task left them
# open), and the 32 -> 64 x5 -> 16 model that independent H200 numbers (eager, max-autotune)
# were taken on.
MODELS = {
    "relu_32-64x4-16": lambda: _chain([32, 64, 64, 64, 64, 16], nn.ReLU),
    "relu_32-128x6-16": lambda: _chain([32, 128, 128, 128, 128, 128, 128, 16], nn.ReLU),
    "siren_3-256x4-1": lambda: _chain([3, 256, 256, 256, 256, 1], _Sin30),
    "relu_32-127-84-57-16": lambda: _chain([32, 127, 84, 57, 16], nn.ReLU),
    "relu_32-64x5-16": lambda: _chain([32, 64, 64, 64, 64, 64, 16], nn.ReLU),
}
BATCHES = [2 ** 14, 2 ** 18, 2 ** 21]
SYSTEMS = ["FusedMLP", "eager", "torch.compile max-autotune"]
# FusedMLP variants, for comparison, by the options each runs with (MlpOptions): the weight
# gradients as GEMMs over saved dz where the default computes them in the backward kernel, and
# the kernel for models wider than 128, which FusedMLP runs as PyTorch ops by default
# (fused_mlp.runs_torch_ops).
VARIANTS = {"FusedMLP GEMM dW": {"fused_weight_grads": False},
            "FusedMLP kernel": {"wide_kernel": True}}
# FusedMLP captured in a CUDA graph by hand (static input; a training step's forward and
# backward in one graph), as a small-batch user would run it: max-autotune runs its own graphs.
GRAPHED = "FusedMLP + CUDA graph"
# Its like-for-like peer: torch.compile without its own CUDA graphs, the whole call (a training
# step: forward, autograd's backward) captured in one graph by hand, so that neither pays
# autograd's host time per step (max-autotune's own graphs leave it in).
HAND_GRAPHED_COMPILE = "torch.compile max-autotune-no-cudagraphs + CUDA graph"
OPTIONAL_SYSTEMS = list(VARIANTS) + [GRAPHED, HAND_GRAPHED_COMPILE]


def _flops(model, rows, backward):
    f = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, nn.Linear)) * rows
    return 3 * f if backward else f


def _io_bytes(in_features, out_features, rows, elem_bytes, backward):
    """The least global memory any implementation moves: x read and y written (a training step:
    also dy read and dx written); what is saved between the passes comes on top."""
    return (2 if backward else 1) * rows * (in_features + out_features) * elem_bytes


def peak_fractions(r: dict, gflop: float, io_gb: float, peaks: dict) -> dict:
    """A timed system's rate against the GPU's datasheet peaks (bench.gpu_peaks), in throughput:
    the tensor work's TFLOP/s and the least memory traffic's TB/s (_io_bytes), each with its
    fraction of the dense fp16 peak and of HBM bandwidth.  GFLOP and GB per ms are TFLOP/s and
    TB/s."""
    tp = r["throughput_ms"]
    tflops, tb_s = gflop / tp, io_gb / tp
    return {"tflops": tflops, "tensor_peak_fraction": tflops / peaks["tflops_dense_fp16_datasheet"],
            "io_tb_s": tb_s, "hbm_fraction": tb_s / peaks["hbm_tb_s_datasheet"]}


def bench_mlp(models=None, batches=None, dtype=torch.float16, modes=("inference", "train"), systems=None,
              calls=20, reps=5, latency_iters=20, progress=print) -> dict:
    models = models or list(MODELS)
    batches = batches or BATCHES
    systems = systems or SYSTEMS
    peaks = gpu_peaks()
    out = []
    for name in models:
        torch.manual_seed(0)
        ref = MODELS[name]().to("cuda", dtype)
        in_f = ref[0].in_features
        for mode in modes:
            backward = mode == "train"
            for rows in batches:
                x = torch.randn(rows, in_f, device="cuda", dtype=dtype)
                row = {"model": name, "mode": mode, "rows": rows, "dtype": str(dtype).split(".")[-1],
                       "gflop": _flops(ref, rows, backward) / 1e9,
                       "io_gb": _io_bytes(in_f, ref[-1].out_features, rows, x.element_size(), backward) / 1e9,
                       "systems": {}}
                for system in systems:
                    progress(f"{name} {mode} rows={rows}: {system} ...")
                    t0 = time.perf_counter()
                    extra, fn = {}, None
                    try:
                        if system.startswith("FusedMLP"):
                            options = dataclasses.replace(MlpOptions(), **VARIANTS.get(system, {}))
                            module = FusedMLP.from_module(ref, options=options)
                            extra = module.compile_kernel(dtype, "cuda", inference=not backward)
                            extra["path"] = "kernel" if module.uses_kernel(x) else "torch ops"
                        elif system == "eager":
                            module = ref
                        else:
                            torch._dynamo.reset()
                            # (not `mode`: the loop's pass name, which the next rows' label reads)
                            compile_mode = ("max-autotune-no-cudagraphs" if system == HAND_GRAPHED_COMPILE
                                            else "max-autotune")
                            module = torch.compile(ref, mode=compile_mode)
                        if backward:
                            xg = x.clone().requires_grad_(True)
                            params = list(module.parameters())

                            def fn(module=module, xg=xg, params=params):
                                y = module(xg)
                                torch.autograd.grad(y, [xg] + params, torch.ones_like(y))
                        else:
                            def fn(module=module):
                                with torch.no_grad():
                                    module(x)
                        if system in (GRAPHED, HAND_GRAPHED_COMPILE):
                            fn = graphed(fn)
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        setup = time.perf_counter() - t0
                        tp = statistics.median(time_throughput(fn, calls, reps))
                        lat = time_cuda(fn, warmup=1, iters=latency_iters)["median_ms"]
                        r = {"setup_s": setup, "throughput_ms": tp, "latency_ms": lat}
                        r.update(peak_fractions(r, row["gflop"], row["io_gb"], peaks) if tp > 0 else
                                 {"tflops": math.nan})
                        r.update(device_time(fn))
                        if system.startswith("FusedMLP"):
                            r.update(path=extra["path"], compile_s=extra.get("compile_seconds"), load_s=extra.get("load_seconds"),
                                     cache_hit=extra.get("cache_hit"), resident_warps=extra.get("resident_warps"),
                                     rows_per_tile=extra.get("rows_per_tile"), inplace=extra.get("inplace"),
                                     fused_weight_grads=backward and system != "FusedMLP GEMM dW"
                                     and bool(extra.get("fused_weight_grad_warps")))
                    except Exception as e:  # noqa: BLE001 - reported, the others still run
                        r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
                    row["systems"][system] = r
                    del fn
                    torch.cuda.empty_cache()
                out.append(row)
                progress(format_row(row))
    return {"rows": out, "calls": calls, "reps": reps, "latency_iters": latency_iters, "peaks": peaks}


def format_row(row: dict) -> str:
    """One line per row: each system's throughput / latency / device ms, its TFLOP/s and in/out
    TB/s in throughput with their fractions of the GPU's peaks (peak_fractions)."""
    parts = [f"{row['model']:18s} {row['mode']:9s} {row['rows']:8d}"]
    for name, r in row["systems"].items():
        if "error" in r:
            parts.append(f"{name}: {r['error'][:60]}")
        else:
            peak = (f", {100 * r['tensor_peak_fraction']:.0f}% of fp16 peak; in/out {r['io_tb_s']:.2f} TB/s, "
                    f"{100 * r['hbm_fraction']:.0f}% of HBM" if "tensor_peak_fraction" in r else "")
            parts.append(f"{name}: {r['throughput_ms']:.4f} / {r['latency_ms']:.4f} / {r['device_ms']:.4f} ms "
                         f"({r['tflops']:.1f} TFLOP/s{peak})")
    return "  ".join(parts)


def plot_mlp(result: dict, path) -> None:
    """Bars per (model, mode, rows): throughput and latency (ms) of every system, ours in green."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows) + 1, 5), squeeze=False)
    width = 0.4
    for ax, row in zip(axes[0], rows):
        systems = [s for s, r in row["systems"].items() if "error" not in r]
        for j, (metric, hatch, label) in enumerate((("throughput_ms", "", "throughput"),
                                                    ("latency_ms", "//", "latency"))):
            ax.bar([i + (j - 0.5) * width for i in range(len(systems))],
                   [row["systems"][s][metric] for s in systems], width, hatch=hatch, label=label,
                   color=["tab:green" if s.startswith("FusedMLP") else "tab:gray" for s in systems],
                   edgecolor="black", linewidth=0.3)
        ax.set_xticks(range(len(systems)), [s.replace("torch.compile ", "compile ") for s in systems],
                      rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{row['model']}\n{row['mode']}, {row['rows']} rows", fontsize=8)
        ax.set_ylabel("ms per call")
        ax.legend(fontsize=7)
    env = result.get("environment", {})
    fig.suptitle(f"bench mlp, {row['dtype']}: {env.get('gpu', '?')}, torch {env.get('torch', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
