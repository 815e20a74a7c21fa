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


# ---- FusedResNet ------------------------------------------------------------------------------

RESNET_SYSTEMS = ("FusedResNet", "FusedResNet graph=True", "eager NCHW",
                  "eager channels_last + CUDA graph", "TorchScript NCHW", "torch.compile default",
                  "torch.compile max-autotune", "torch.compile max-autotune channels_last")


def resnet_work(n: int, in_channels: int = 3) -> dict:
    """The network's MACs and the fewest bytes the fused forward moves (fp16), counted per
    kernel: inputs read once, output written once."""
    from .models import SEResNet9FixUp
    model = SEResNet9FixUp(in_channels)
    macs, act_bytes = 0, 0
    # stem: space_to_depth_conv reads the NCHW input, writes 64 channels at 16x16
    inp = n * in_channels * 64 * 64 * 2
    macs += n * 16 * 16 * 16 * in_channels * 64
    act_bytes += inp + n * 64 * 16 * 16 * 2
    hw, c = 16, 64
    for layer in model.layers:
        blk = layer[0]
        k, s = blk.conv1.out_channels, blk.conv1.stride[0]
        out_hw = hw // s
        x_b, h_b = n * c * hw * hw * 2, n * k * out_hw * out_hw * 2
        macs += n * out_hw * out_hw * k * c * 9 + n * out_hw * out_hw * k * k * 9
        act_bytes += (x_b + h_b) + (h_b + h_b)  # conv1, conv2
        if blk.downsample is not None:  # 1x1 conv on the pooled input (pooled in se_gate)
            macs += n * out_hw * out_hw * k * c
            act_bytes += x_b // 4 + h_b + x_b // 4  # read pooled, write identity; se_gate wrote pooled
        act_bytes += 3 * h_b + h_b  # se_gate reads h twice and identity once, writes out
        hw, c = out_hw, k
    weight_bytes = sum(p.numel() for p in model.parameters()) * 2
    return {"macs": macs, "flops": 2 * macs, "bytes": act_bytes + weight_bytes}


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


def resnet_reference(in_channels: int = 3, dtype=torch.float16, seed: int = 0):
    """The plain module on CUDA with random weights and random non-zero FixUp scalars
    (FixUp's zero conv2 init would flatter every system)."""
    from .models import SEResNet9FixUp
    torch.manual_seed(seed)
    ref = SEResNet9FixUp(in_channels)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 4:
                p.normal_(0, (2.0 / (p.shape[1] * p.shape[2] * p.shape[3])) ** 0.5)
            elif "fixup" in name:
                p.uniform_(0.2, 0.8)
    return ref.cuda().to(dtype)


def bench_resnet(batch_sizes=(1, 32, 128, 512, 2048), dtype=torch.float16, in_channels=3,
                 systems=RESNET_SYSTEMS, iters=50, rounds=3, progress=print) -> dict:
    """Every system timed `rounds` times, interleaved (system A, B, ..., then again), so
    that drift in clocks or in the machine affects all of them alike; the reported median
    is the median of the rounds' medians (each round's median is kept too)."""
    from .fused_resnet import FusedResNet
    from .models import SEResNet9FixUp
    ref = resnet_reference(in_channels, dtype).eval()
    ref_cl = SEResNet9FixUp(in_channels).cuda().to(dtype).eval().to(memory_format=torch.channels_last)
    ref_cl.load_state_dict(ref.state_dict())
    fused = FusedResNet.from_reference(ref).eval()
    fused_graph = FusedResNet.from_reference(ref, graph=True).eval()
    peak = {"tflops_dense_fp16_datasheet": 989.0,
            "hbm_tb_s_datasheet": 4.8 if "H200" in torch.cuda.get_device_name() else 3.35}
    rows = []
    for n in batch_sizes:
        x = torch.randn(n, in_channels, 64, 64, device="cuda", dtype=dtype)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            want = ref(x).double()
            got = fused(x).double()
        rel = ((got - want).norm() / want.norm()).item()
        work = resnet_work(n, in_channels)
        with torch.no_grad():  # as inference runs (with grad on, a b1a negation kernel is added)
            breakdown = kernel_times(lambda: fused(x))
        row = {"n": n, "fused_vs_eager_rel_error": rel, "work": work,
               "fused_kernels_per_forward": len(breakdown), "fused_kernel_us": breakdown,
               "results": {}}
        fns, timings = {}, {name: [] for name in systems}
        with torch.no_grad():
            for name in systems:
                progress(f"  N={n}: {name} (set up) ...")
                fns[name] = _resnet_system(name, ref, ref_cl, fused, fused_graph, x, x_cl)
            for r in range(rounds):
                for name in systems:
                    progress(f"  N={n}: {name} (round {r + 1}/{rounds}) ...")
                    timings[name].append(time_cuda(fns[name], warmup=5, iters=iters))
        for name, ts in timings.items():
            medians = [t["median_ms"] for t in ts]
            row["results"][name] = {"median_ms": statistics.median(medians), "round_medians_ms": medians,
                                    "min_ms": min(t["min_ms"] for t in ts),
                                    "max_ms": max(t["max_ms"] for t in ts), "iters": iters * rounds}
        del fns
        fused_ms = min(row["results"][s]["median_ms"] for s in ("FusedResNet", "FusedResNet graph=True")
                       if s in row["results"])
        row["fused_best_ms"] = fused_ms
        row["fused_tflops"] = work["flops"] / (fused_ms * 1e-3) / 1e12
        row["fused_tb_s"] = work["bytes"] / (fused_ms * 1e-3) / 1e12
        row["fraction_of_tensor_peak"] = row["fused_tflops"] / peak["tflops_dense_fp16_datasheet"]
        row["fraction_of_hbm_peak"] = row["fused_tb_s"] / peak["hbm_tb_s_datasheet"]
        rows.append(row)
        torch._dynamo.reset()
    return {"dtype": str(dtype)[6:], "in_channels": in_channels, "peaks": peak, "rows": rows}


def _resnet_system(name, ref, ref_cl, fused, fused_graph, x, x_cl):
    if name == "FusedResNet":
        return lambda: fused(x)
    if name == "FusedResNet graph=True":
        return lambda: fused_graph(x)
    if name == "eager NCHW":
        return lambda: ref(x)
    if name == "eager channels_last + CUDA graph":
        return graphed(lambda: ref_cl(x_cl))
    if name == "TorchScript NCHW":
        ts = torch.jit.freeze(torch.jit.trace(ref, x))
        return lambda: ts(x)
    if name == "torch.compile default":
        c = torch.compile(ref)
        return lambda: c(x)
    if name == "torch.compile max-autotune":
        c = torch.compile(ref, mode="max-autotune")
        return lambda: c(x)
    if name == "torch.compile max-autotune channels_last":  # the model and input as cuDNN likes them
        c = torch.compile(ref_cl, mode="max-autotune")
        return lambda: c(x_cl)
    raise ValueError(f"unknown system {name!r}; choose from {RESNET_SYSTEMS}")


def _systems(rows) -> list:
    """Every system any row timed, in first-seen order (rows merged from several runs)."""
    return list(dict.fromkeys(s for row in rows for s in row["results"]))


def best_max_autotune_ms(row: dict):
    """The faster torch.compile max-autotune variant (NCHW or channels_last) in a row."""
    times = [r["median_ms"] for s, r in row["results"].items() if s.startswith("torch.compile max-autotune")]
    return min(times) if times else None


def print_resnet_table(result: dict) -> None:
    systems = _systems(result["rows"])
    print(f"FusedResNet benchmark, {result['dtype']}, C_in={result['in_channels']}: median ms (CUDA events)")
    # Column heads shortened ("compile" = torch.compile, "CL" = channels_last); the last
    # column: FusedResNet's better time / the better torch.compile max-autotune.
    heads = [s.replace("torch.compile ", "compile ").replace("channels_last", "CL")[:24] for s in systems]
    print(f"{'N':>5s} " + " ".join(f"{h:>24s}" for h in heads) + f" {'fused/best-MA':>14s}")
    for row in result["rows"]:
        r = row["results"]
        best_ma = best_max_autotune_ms(row)
        ratio = f"{row['fused_best_ms'] / best_ma:.2f}x" if best_ma else ""
        print(f"{row['n']:5d} " + " ".join(f"{r[s]['median_ms']:24.4f}" if s in r else f"{'-':>24s}"
                                           for s in systems) + f" {ratio:>14s}")
    for row in result["rows"]:
        print(f"N={row['n']}: {row['fused_kernels_per_forward']} kernels/forward, "
              f"{row['fused_tflops']:.0f} TFLOP/s ({100 * row['fraction_of_tensor_peak']:.1f}% of dense fp16 peak), "
              f"{row['fused_tb_s']:.2f} TB/s ({100 * row['fraction_of_hbm_peak']:.1f}% of HBM peak), "
              f"rel. error vs eager {row['fused_vs_eager_rel_error']:.1e}")
    row = max(result["rows"], key=lambda r: r["n"] == 128)
    print(f"per-kernel device time of one FusedResNet forward, N={row['n']} (µs, torch.profiler):")
    for name, us in row.get("fused_kernel_us", []):
        print(f"  {us:8.1f}  {name}")


def plot_resnet(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["rows"]
    systems = _systems(rows)
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 4.5), squeeze=False)
    for ax, row in zip(axes[0], rows):
        ms = [row["results"][s]["median_ms"] if s in row["results"] else 0.0 for s in systems]
        colors = ["tab:green" if s.startswith("Fused") else "tab:gray" for s in systems]
        ax.bar(range(len(systems)), ms, color=colors)
        ax.set_xticks(range(len(systems)), systems, rotation=70, ha="right", fontsize=7)
        ax.set_title(f"N={row['n']}")
        ax.set_ylabel("ms (median)")
    env = result.get("environment", {})
    fig.suptitle(f"SE-ResNet9-FixUp forward, {result['dtype']}, {env.get('gpu', '')}, torch {env.get('torch', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)
