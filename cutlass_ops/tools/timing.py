"""Timing and run-record helpers every benchmark and the profiler sweep share: CUDA-event
timings (one call, back-to-back calls, a CUDA graph's replays), the profiler's device time per
call, torch.compile captured by hand, the run's environment (GPU, versions, build) and its JSON."""
from __future__ import annotations

import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .._library import build_info


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
           "triton": _version("triton"),
           "cutlass_ops_build": build_info(), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm=f"{p.major}{p.minor}", sms=p.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
    return env


def _version(package: str):
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # noqa: BLE001 - not installed
        return None


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

    def replay():
        g.replay()
    # The graph reads what fn's closure holds (the model's weights, cached folds, kernel
    # libraries): returning g.replay alone let the model be freed after set-up, and the graph
    # then replayed over memory that later set-ups had reused (bench cvt, six systems: rc 139).
    replay.captured = fn
    return replay


def time_throughput(fn: Callable[[], object], calls: int = 200, reps: int = 5) -> list[float]:
    """Milliseconds per call of `calls` back-to-back calls between two CUDA events, for each
    of `reps` repeats."""
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / calls)
    return out


def device_time(fn: Callable[[], object], repeat: int = 10) -> dict:
    """Kernel-time sum (ms), kernel count and the kernels (name, µs) of one call of fn, from
    torch.profiler."""
    kernels = kernel_times(fn, repeat=repeat)
    return {"device_ms": sum(us for _, us in kernels) / 1e3, "kernels": len(kernels), "kernel_us": kernels}


def kernel_times(fn, repeat: int = 10) -> list[tuple[str, float]]:
    """(kernel name, mean µs) in launch order, for one call of fn (torch.profiler over
    `repeat` calls)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "Memcpy" not in e.name and "Memset" not in e.name]
    per_call = len(kernels) // repeat
    out = []
    for i in range(per_call):
        same = kernels[i::per_call]
        name = same[0].name
        name = name.split("<")[0] if "cutlass" not in name else name[:90]
        out.append((name, sum(e.device_time for e in same) / len(same)))
    return out


def hand_graphed_compile(fn: Callable[[], object], mode: str = "max-autotune-no-cudagraphs"):
    """fn compiled with torch.compile(mode) and captured in one CUDA graph by hand."""
    compiled = torch.compile(fn, mode=mode)
    return graphed(compiled)


def gpu_peaks() -> dict:
    """Datasheet dense fp16 tensor-core peak and HBM bandwidth of the GPU (SXM parts)."""
    name = torch.cuda.get_device_name()
    return {"tflops_dense_fp16_datasheet": 989.0, "hbm_tb_s_datasheet": 4.8 if "H200" in name else 3.35}


@contextlib.contextmanager
def env_var(name: str, value):
    """Sets (value) or unsets (None) an environment variable for the block; name None: nothing."""
    import os
    if name is None:
        yield
        return
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}", file=sys.stderr)
