"""Benchmarks (not tests): CUDA-event timings, medians, baselines in the same run.

Results are written as JSON with the GPU name and the software versions.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ._library import build_info
from .ops import conv2d_fused


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "cutlass_ops_build": build_info(), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm=f"{p.major}{p.minor}", sms=p.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
    return env


def time_cuda(fn: Callable[[], object], warmup: int = 20, iters: int = 100) -> dict:
    """Median/min/max milliseconds of fn() over `iters` runs, each timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "iters": iters}


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """fn captured in a CUDA graph (static inputs), replayed per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def conv_layer_inputs(n=128, c=64, k=64, hw=16, dtype=torch.float16, seed=0):
    """One FixUp ResNet layer: 3x3 pad 1, random data and random non-zero scalars."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, c, hw, hw, device="cuda", dtype=dtype, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(k, c, 3, 3, device="cuda", dtype=dtype, generator=g) / (9 * c) ** 0.5)
    w = w.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(k, device="cuda", dtype=torch.float32, generator=g)
    scale = torch.rand((), device="cuda", generator=g) + 0.5
    post = torch.randn((), device="cuda", generator=g)
    return x, w, bias, scale, post


def bench_conv(n=128, c=64, k=64, hw=16, dtype=torch.float16, compile_max_autotune=True,
               iters=200) -> dict:
    """Fused conv vs `F.relu(conv*scale + bias) + post_bias` in PyTorch, one layer shape."""
    x, w, bias, scale, post = conv_layer_inputs(n, c, k, hw, dtype)
    x_nchw, w_nchw = x.contiguous(), w.contiguous()
    b_view, s_t, p_t = bias.to(dtype).view(1, -1, 1, 1), scale.to(dtype), post.to(dtype)

    def torch_layer(xx, ww):
        return F.relu(F.conv2d(xx, ww, padding=1) * s_t + b_view) + p_t

    def fused():
        return conv2d_fused(x, w, bias, None, 1, 1, scale, post, True)

    # Correctness of what is timed: the fused output against a float64 evaluation.
    ref = F.relu(F.conv2d(x.double(), w.double(), padding=1) * scale.double()
                 + bias.double().view(1, -1, 1, 1)) + post.double()
    out = fused()
    rel = ((out.double() - ref).norm() / ref.norm()).item()

    candidates = {
        "cutlass_ops.conv2d_fused": fused,
        "cutlass_ops.conv2d_fused + CUDA graph": graphed(fused),
        "eager NCHW": lambda: torch_layer(x_nchw, w_nchw),
        "eager channels_last": lambda: torch_layer(x, w),
        "eager channels_last + CUDA graph": graphed(lambda: torch_layer(x, w)),
    }
    if compile_max_autotune:
        compiled = torch.compile(torch_layer, mode="max-autotune-no-cudagraphs")
        candidates["torch.compile max-autotune (no cudagraphs)"] = lambda: compiled(x, w)
    results = {name: time_cuda(fn, iters=iters) for name, fn in candidates.items()}
    flops = 2 * n * hw * hw * k * c * 9
    for r in results.values():
        r["tflops"] = flops / (r["median_ms"] * 1e-3) / 1e12
    return {"problem": {"n": n, "c": c, "k": k, "h": hw, "w": hw, "r": 3, "s": 3, "pad": 1,
                        "dtype": str(dtype).replace("torch.", "")},
            "fused_rel_error_vs_float64": rel, "results": results}


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}", file=sys.stderr)


def print_table(result: dict) -> None:
    rows = sorted(result["results"].items(), key=lambda kv: kv[1]["median_ms"])
    fused = result["results"]["cutlass_ops.conv2d_fused"]["median_ms"]
    print(f"{'system':48s} {'median ms':>10s} {'TFLOP/s':>8s} {'vs fused':>9s}")
    for name, r in rows:
        print(f"{name:48s} {r['median_ms']:10.4f} {r['tflops']:8.1f} {r['median_ms'] / fused:8.2f}x")
