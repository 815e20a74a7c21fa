"""Benchmarks (not tests): CUDA-event timings, medians, baselines in the same run.

Results are written as JSON with the GPU name and the software versions.
"""
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
import torch.nn.functional as F

from .._library import build_info
from ..ops import conv2d_fused


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


# ---- Measuring a set of systems: throughput, latency, device time ---------------------------
#
# Every system is timed the two ways users run a model, side by side:
#   throughput: K back-to-back calls between two CUDA events, no sync inside (a pipelined
#               user: host work overlaps the GPU's), per call; median of `reps` repeats;
#   latency:    one call between two events, synchronized after each (a user waiting for
#               each answer: host work before the launch counts); median of the calls;
# and the device time: the profiler's sum of the kernels one call launches (what the GPU
# itself spends; neither host work nor launch gaps).  The systems are timed in `rounds`
# interleaved rounds (A, B, ..., then again), so drift in clocks or in the machine affects
# all alike; each metric's result is the median of the rounds' medians.

METRICS = ("throughput_ms", "latency_ms", "device_ms")
METRIC_NAMES = {"throughput_ms": "throughput", "latency_ms": "latency", "device_ms": "device time"}


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


def measure_systems(setups: dict, rounds: int = 3, calls: int = 200, reps: int = 5,
                    latency_iters: int = 50, warmup: int = 3, progress=print, label: str = "",
                    interleave: bool = True) -> dict:
    """Set up each system (`setups`: name -> zero-argument function returning the callable
    to time; compile, autotune and capture happen there and in the first calls, timed as
    setup_s), then time them in the three metrics, `rounds` times.  interleave=True: all
    systems set up first, then timed in interleaved rounds.  interleave=False: each system
    set up, timed in its rounds and released before the next is set up (training: a
    torch.compile model's own CUDA graphs (cudagraph trees) left hand-captured graphs of
    another model hanging or crashing at their next replay on torch 2.11).  A system whose
    setup fails is reported with its error instead of stopping the others."""
    results = {}

    def set_up(name):
        progress(f"  {label}{name}: set up ...")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        try:
            fn = setups[name]()
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported in the results, the others still run
            results[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
            progress(f"  {label}{name}: FAILED: {results[name]['error']}")
            return None
        results[name] = {"setup_s": time.perf_counter() - t0,
                         "peak_mem_mib": (torch.cuda.max_memory_allocated() - base) / 2**20}
        return fn

    def time_rounds(fns: dict):
        tp = {name: [] for name in fns}
        lat = {name: [] for name in fns}
        for r in range(rounds):
            for name, fn in fns.items():
                progress(f"  {label}{name}: round {r + 1}/{rounds} ...")
                tp[name].append(statistics.median(time_throughput(fn, calls, reps)))
                lat[name].append(time_cuda(fn, warmup=1, iters=latency_iters)["median_ms"])
        for name, fn in fns.items():
            results[name].update(throughput_ms=statistics.median(tp[name]), throughput_round_ms=tp[name],
                                 latency_ms=statistics.median(lat[name]), latency_round_ms=lat[name],
                                 calls=calls, reps=reps, latency_iters=latency_iters * rounds)
            results[name].update(device_time(fn))
        report_row(progress, label.rstrip(": "), {name: results[name] for name in fns})

    if interleave:
        fns = {name: fn for name in setups if (fn := set_up(name)) is not None}
        time_rounds(fns)
    else:
        for name in setups:
            fn = set_up(name)
            if fn is not None:
                time_rounds({name: fn})
            del fn
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return {name: results[name] for name in setups}


def is_ours(system: str) -> bool:
    return system.startswith("Fused")


def ratios(results: dict) -> dict:
    """Per metric: our best system against the best peer in that same metric."""
    out = {}
    for metric in METRICS:
        timed = {s: r[metric] for s, r in results.items() if metric in r}
        ours = {s: t for s, t in timed.items() if is_ours(s)}
        peers = {s: t for s, t in timed.items() if not is_ours(s)}
        if not ours or not peers:
            continue
        o, p = min(ours, key=ours.get), min(peers, key=peers.get)
        out[metric] = {"ours": o, "ours_ms": ours[o], "peer": p, "peer_ms": peers[p],
                       "ratio": ours[o] / peers[p]}
    return out


def report_row(progress, label: str, results: dict) -> None:
    """One finished row's times through `progress` as soon as they exist (the table is printed
    at the end: a run stopped before then keeps these lines)."""
    for name, r in results.items():
        times = (" / ".join(f"{r[m]:.4f}" for m in METRICS) + " ms (throughput / latency / device)"
                 if all(m in r for m in METRICS) else r.get("error", "not timed"))
        progress(f"  {label} done: {name}: {times}")


# What print_systems reads of each system (besides "error" for one that failed).
SYSTEM_COLUMNS = (*METRIC_NAMES, "kernels", "setup_s", "peak_mem_mib")


def not_a_systems_table(result) -> str:
    """Why `result` is not what bench resnet / bench train write (empty when it is): rows of
    {n, results: {system: SYSTEM_COLUMNS, or an error}}, with the dtype and C_in."""
    if not isinstance(result, dict) or not isinstance(result.get("rows"), list) or not result["rows"]:
        return "no rows"
    if "dtype" not in result or "in_channels" not in result:
        return "no dtype or in_channels"
    for row in result["rows"]:
        if not isinstance(row, dict) or "n" not in row or not isinstance(row.get("results"), dict):
            return "a row without n or results"
        for system, r in row["results"].items():
            if not isinstance(r, dict) or ("error" not in r and not all(c in r for c in SYSTEM_COLUMNS)):
                return f"{system!r} lacks the metrics {', '.join(SYSTEM_COLUMNS)} (an older bench?)"
    return ""


def print_systems(results: dict, indent: str = "  ") -> None:
    """One line per system (throughput, latency, device time, setup) and the ratios."""
    print(f"{indent}{'system':58s} {'throughput':>10s} {'latency':>9s} {'device':>8s} {'kernels':>7s} "
          f"{'setup s':>8s} {'peak MiB':>9s}")
    for name, r in results.items():
        if "error" in r:
            print(f"{indent}{name:58s} failed: {r['error']}")
            continue
        print(f"{indent}{name:58s} {r['throughput_ms']:10.4f} {r['latency_ms']:9.4f} {r['device_ms']:8.4f} "
              f"{r['kernels']:7d} {r['setup_s']:8.1f} {r['peak_mem_mib']:9.1f}")
    for metric, q in ratios(results).items():
        print(f"{indent}{METRIC_NAMES[metric]:>11s}: {q['ours']} {q['ours_ms']:.4f} ms / {q['peer']} "
              f"{q['peer_ms']:.4f} ms = {q['ratio']:.2f}x")


# ---- FusedResNet ------------------------------------------------------------------------------

# torch.compile's modes as their users run them: "max-autotune" captures its own CUDA graphs
# (cudagraph trees); "max-autotune-no-cudagraphs" compiled code captured in one CUDA graph
# by hand (less host work per call than the graph trees' bookkeeping).
RESNET_SYSTEMS = ("FusedResNet", "FusedResNet graph=True", "eager NCHW",
                  "eager channels_last + CUDA graph", "torch.compile max-autotune",
                  "torch.compile max-autotune channels_last",
                  "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph")
# On sm90, FusedResNet with its conv kernel families fixed (CUTLASS_OPS_SM90 while its graph is
# captured): 0 = the Ampere (family 80) kernels only, 1 = the Hopper (family 90) ones first; the
# default systems above run what the profile decides per conv.  CUTLASS_OPS_SM90_HALO=0: without
# the hand-written halo kernel for block 0's convs (kernels/conv2d_fused/conv2d_fused_sm90_halo.cu).
FAMILY_SYSTEMS = ("FusedResNet graph=True CUTLASS_OPS_SM90=0", "FusedResNet graph=True CUTLASS_OPS_SM90=1",
                  "FusedResNet graph=True CUTLASS_OPS_SM90_HALO=0")
RESNET_OPTIONAL_SYSTEMS = ("TorchScript NCHW", "torch.compile default") + FAMILY_SYSTEMS


def resnet_work(n: int, in_channels: int = 3) -> dict:
    """The network's MACs and the fewest bytes the fused forward moves (fp16), counted per
    kernel: inputs read once, output written once."""
    from ..models import SEResNet9FixUp
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
    from ..models import SEResNet9FixUp
    torch.manual_seed(seed)
    ref = SEResNet9FixUp(in_channels)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 4:
                p.normal_(0, (2.0 / (p.shape[1] * p.shape[2] * p.shape[3])) ** 0.5)
            elif "fixup" in name:
                p.uniform_(0.2, 0.8)
    return ref.cuda().to(dtype)


def gpu_peaks() -> dict:
    """Datasheet dense fp16 tensor-core peak and HBM bandwidth of the GPU (SXM parts)."""
    name = torch.cuda.get_device_name()
    return {"tflops_dense_fp16_datasheet": 989.0, "hbm_tb_s_datasheet": 4.8 if "H200" in name else 3.35}


def bench_resnet(batch_sizes=(128, 512, 2048), dtype=torch.float16, in_channels=3,
                 systems=None, calls=200, reps=5, latency_iters=50, rounds=3,
                 progress=print) -> dict:
    """FusedResNet's forward (inference, no grad) against the peers, per batch size, in the
    three metrics (measure_systems).  Default systems: RESNET_SYSTEMS, and on an sm90 GPU
    with family-90 kernels built FAMILY_SYSTEMS too."""
    from ..fused_resnet import FusedResNet
    from ..models import SEResNet9FixUp
    if systems is None:
        systems = RESNET_SYSTEMS + (FAMILY_SYSTEMS if _has_family_90() else ())
    unknown = [s for s in systems if s not in RESNET_SYSTEMS + RESNET_OPTIONAL_SYSTEMS]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {list(RESNET_SYSTEMS + RESNET_OPTIONAL_SYSTEMS)}")
    ref = resnet_reference(in_channels, dtype).eval()
    ref_cl = SEResNet9FixUp(in_channels).cuda().to(dtype).eval().to(memory_format=torch.channels_last)
    ref_cl.load_state_dict(ref.state_dict())
    fused = FusedResNet.from_reference(ref).eval()
    fused_graph = FusedResNet.from_reference(ref, graph=True).eval()
    peak = gpu_peaks()
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
            setups = {name: (lambda name=name: _resnet_system(name, ref, ref_cl, fused, fused_graph, x, x_cl))
                      for name in systems}
            results = measure_systems(setups, rounds=rounds, calls=calls, reps=reps,
                                      latency_iters=latency_iters, progress=progress, label=f"N={n}: ")
        # Where one FusedResNet forward's device time goes (measured with its device time).
        breakdown = results.get("FusedResNet", {}).get("kernel_us", [])
        row = {"n": n, "fused_vs_eager_rel_error": rel, "work": work,
               "fused_kernels_per_forward": len(breakdown), "fused_kernel_us": breakdown,
               "layers": layer_table(n, breakdown, in_channels, peak),
               "results": results, "ratios": ratios(results)}
        tp = row["ratios"].get("throughput_ms")
        if tp:
            ms = tp["ours_ms"]
            row["fused_tflops"] = work["flops"] / (ms * 1e-3) / 1e12
            row["fused_tb_s"] = work["bytes"] / (ms * 1e-3) / 1e12
            row["fraction_of_tensor_peak"] = row["fused_tflops"] / peak["tflops_dense_fp16_datasheet"]
            row["fraction_of_hbm_peak"] = row["fused_tb_s"] / peak["hbm_tb_s_datasheet"]
        rows.append(row)
        torch._dynamo.reset()
    return {"dtype": str(dtype)[6:], "in_channels": in_channels, "peaks": peak,
            "timing": {"throughput": f"{calls} back-to-back calls between two CUDA events, median of {reps}",
                       "latency": f"one synchronized call between two CUDA events, median of {latency_iters}",
                       "device_time": "torch.profiler kernel sum of one call (memcpy/memset excluded)",
                       "rounds": f"{rounds} interleaved rounds, median of the rounds' medians"},
            "rows": rows}


def hand_graphed_compile(fn: Callable[[], object], mode: str = "max-autotune-no-cudagraphs"):
    """fn compiled with torch.compile(mode) and captured in one CUDA graph by hand."""
    compiled = torch.compile(fn, mode=mode)
    return graphed(compiled)


def _has_family_90() -> bool:
    """Whether this GPU is sm90 and the build has family-90 (Hopper-native) conv kernels."""
    from .profiler import kernel_families  # (profiler imports this module)
    return 90 in kernel_families()


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


def _resnet_system(name, ref, ref_cl, fused, fused_graph, x, x_cl):
    if name == "FusedResNet":
        return lambda: fused(x)
    if name == "FusedResNet graph=True":
        return lambda: fused_graph(x)
    if name == "eager NCHW":
        return lambda: ref(x)
    if name == "eager channels_last + CUDA graph":
        return graphed(lambda: ref_cl(x_cl))
    if name in FAMILY_SYSTEMS:
        from ..fused_resnet import FusedResNet
        model = FusedResNet.from_reference(ref, graph=True).eval()
        with env_var(*name.rsplit(" ", 1)[1].split("=")):
            model(x)  # captures its graph: the kernels chosen now are the ones it replays
        return lambda: model(x)
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
    if name == "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph":
        return hand_graphed_compile(lambda: ref_cl(x_cl))
    raise ValueError(f"unknown system {name!r}; choose from {RESNET_SYSTEMS + RESNET_OPTIONAL_SYSTEMS}")


def print_resnet_table(result: dict) -> None:
    print(f"FusedResNet forward (inference), {result['dtype']}, C_in={result['in_channels']}, "
          f"{result.get('environment', {}).get('gpu', '')}")
    for k, v in result.get("timing", {}).items():
        print(f"  {k}: {v}")
    print("  ms per call; ratio = our best / the best peer in the same metric")
    for row in result["rows"]:
        print(f"N={row['n']}  (rel. error vs eager {row['fused_vs_eager_rel_error']:.1e})")
        print_systems(row["results"])
        if "fused_tflops" in row:
            print(f"  at our best throughput: {row['fused_tflops']:.0f} TFLOP/s "
                  f"({100 * row['fraction_of_tensor_peak']:.1f}% of dense fp16 peak), {row['fused_tb_s']:.2f} TB/s "
                  f"({100 * row['fraction_of_hbm_peak']:.1f}% of HBM peak)")
    row = max(result["rows"], key=lambda r: r["n"])
    layers = layer_table(row["n"], row.get("fused_kernel_us", []), result["in_channels"], result["peaks"])
    if layers:
        print_layer_table(row["n"], layers)


def layer_table(n: int, kernel_us: list, in_channels: int, peaks: dict) -> list[dict]:
    """One FusedResNet forward's kernels (kernel_us: (name, µs) in launch order, from its
    device-time measurement) as layers: each conv's TFLOP/s and fraction of the dense fp16
    peak; each memory-bound kernel's (stem, se_gate) compulsory bytes, TB/s and fraction of
    HBM bandwidth.  Every row also gets its bound, `bound_us`: the time at the datasheet peak of
    whichever resource binds it (its FLOPs at the tensor-core peak or its compulsory bytes,
    each map read once and written once, at HBM bandwidth), and `fraction_of_bound`.
    Empty when the kernel sequence is not the one expected (16 kernels)."""
    from ..models import SEResNet9FixUp
    from ..small_map_conv import runs_dense
    model = SEResNet9FixUp(in_channels)
    hw, c = 16, 64
    # the stem reads the input and writes block 0's input
    expected = [("stem (space-to-depth 1x1 conv)", "stem", 0.0, 2 * n * (in_channels * 64 * 64 + 64 * hw * hw))]
    blocks = [layer[0] for layer in model.layers]
    for i, blk in enumerate(blocks):
        k, st = blk.conv1.out_channels, blk.conv1.stride[0]
        out = (hw - 1) // st + 1
        act_in, act = 2 * n * c * hw * hw, 2 * n * k * out * out  # bytes of the input and output maps
        expected.append((f"layers.{i}.conv1 3x3/{st} {c}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * c * 9,
                         act_in + act + 2 * k * c * 9))
        if runs_dense(out, out, 3, 3):  # a dense layer on the whole map: the FLOPs it executes
            expected.append((f"layers.{i}.conv2 as dense {k * out * out}->{k * out * out}", "conv",
                             2.0 * n * (k * out * out) ** 2, 2 * act + 2 * (k * out * out) ** 2))
        else:
            expected.append((f"layers.{i}.conv2 3x3/1 {k}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * k * 9,
                             2 * act + 2 * k * k * 9))
        if blk.downsample is not None:  # on the map se_gate pooled
            expected.append((f"layers.{i}.downsample 1x1 {c}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * c,
                             act_in // 4 + act + 2 * k * c))
        pool_next = i + 1 < len(blocks) and blocks[i + 1].downsample is not None
        # se_gate: reads h and the identity, writes out (and the pooled map for the next block)
        expected.append((f"layers.{i}.se_gate", "se_gate", 0.0, 3 * act + (act // 4 if pool_next else 0)))
        hw, c = out, k
    def matches(kind: str, name: str) -> bool:
        return "conv2d_fused" in name if kind == "conv" else {"stem": "space_to_depth", "se_gate": "se_gate"}[kind] in name

    if len(kernel_us) != len(expected) or not all(
            matches(kind, name) for (_, kind, _, _), (name, _) in zip(expected, kernel_us)):
        return []
    rows = []
    for (layer, kind, flops, nbytes), (name, us) in zip(expected, kernel_us):
        row = {"layer": layer, "kernel": name, "us": us}
        if kind == "conv":
            row["tflops"] = flops / (us * 1e-6) / 1e12
            row["fraction_of_tensor_peak"] = row["tflops"] / peaks["tflops_dense_fp16_datasheet"]
        else:
            row["tb_s"] = nbytes / (us * 1e-6) / 1e12
            row["fraction_of_hbm_peak"] = row["tb_s"] / peaks["hbm_tb_s_datasheet"]
        row["bound_us"] = max(flops / (peaks["tflops_dense_fp16_datasheet"] * 1e12),
                              nbytes / (peaks["hbm_tb_s_datasheet"] * 1e12)) * 1e6
        row["fraction_of_bound"] = row["bound_us"] / us
        rows.append(row)
    return rows


def print_layer_table(n: int, layers: list[dict]) -> None:
    print(f"per layer, one FusedResNet forward at N={n} (device µs from torch.profiler; convs: TFLOP/s and "
          f"fraction of dense fp16 peak; stem and se_gate: compulsory HBM bytes / time and fraction of HBM peak; "
          f"bound: the time at the peak of the binding resource, and the kernel's fraction of it):")
    for r in layers:
        if "tflops" in r:
            rate = f"{r['tflops']:6.0f} TFLOP/s  {100 * r['fraction_of_tensor_peak']:5.1f}% of peak"
        else:
            rate = f"{r['tb_s']:6.2f} TB/s     {100 * r['fraction_of_hbm_peak']:5.1f}% of HBM"
        family = "sm90" if "sm90" in r["kernel"] else "sm80" if "conv2d_fused" in r["kernel"] else ""
        print(f"  {r['layer']:<40} {r['us']:7.1f} us  {rate}  bound {r['bound_us']:6.1f} us "
              f"({100 * r['fraction_of_bound']:3.0f}%)  {family}")
    measured, bound = sum(r["us"] for r in layers), sum(r["bound_us"] for r in layers)
    if measured > 0:
        print(f"  {'sum':<40} {measured:7.1f} us  bound {bound:.1f} us: the kernels at "
              f"{100 * bound / measured:.0f}% of their bounds")


def _systems(rows) -> list:
    """Every system any row timed, in first-seen order (rows merged from several runs)."""
    return list(dict.fromkeys(s for row in rows for s in row["results"]))


def plot_systems(rows: list, title: str, path: Path) -> None:
    """Bars per batch size: throughput and latency (ms) of every system, ours in green."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    systems = _systems(rows)
    fig, axes = plt.subplots(1, len(rows), figsize=(3.6 * len(rows) + 1, 5), squeeze=False)
    width = 0.4
    for ax, row in zip(axes[0], rows):
        res = row["results"]
        xs = range(len(systems))
        for j, (metric, hatch) in enumerate((("throughput_ms", ""), ("latency_ms", "//"))):
            ms = [res.get(s, {}).get(metric, 0.0) for s in systems]
            colors = ["tab:green" if is_ours(s) else "tab:gray" for s in systems]
            ax.bar([i + (j - 0.5) * width for i in xs], ms, width, color=colors, hatch=hatch,
                   edgecolor="black", linewidth=0.3, label=METRIC_NAMES[metric])
        ax.set_xticks(list(xs), [s.replace("torch.compile ", "compile ").replace("channels_last", "CL")
                                 for s in systems], rotation=70, ha="right", fontsize=6)
        ax.set_title(f"N={row['n']}")
        ax.set_ylabel("ms per call")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)


def plot_resnet(result: dict, path: Path) -> None:
    env = result.get("environment", {})
    plot_systems(result["rows"], f"SE-ResNet9-FixUp forward, {result['dtype']}, {env.get('gpu', '')}, torch "
                 f"{env.get('torch', '')}\nthroughput (plain) and latency (hatched)", path)
