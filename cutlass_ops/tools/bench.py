"""Benchmarks (not tests) of one fused conv layer (bench conv, demo) and of FusedResNet
inference (bench resnet, and its per-layer table): CUDA-event timings, medians, baselines in
the same run (timing.py, systems.py).  Results are written as JSON with the GPU name and the
software versions.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..ops import conv2d_fused
from .systems import measure_systems, plot_systems, print_systems, ratios
from .timing import env_var, gpu_peaks, graphed, hand_graphed_compile, time_cuda


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


def print_table(result: dict) -> None:
    rows = sorted(result["results"].items(), key=lambda kv: kv[1]["median_ms"])
    fused = result["results"]["cutlass_ops.conv2d_fused"]["median_ms"]
    print(f"{'system':48s} {'median ms':>10s} {'TFLOP/s':>8s} {'vs fused':>9s}")
    for name, r in rows:
        print(f"{name:48s} {r['median_ms']:10.4f} {r['tflops']:8.1f} {r['median_ms'] / fused:8.2f}x")


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
# FusedResNet(fuse_se_gate=True): block 0's conv2 and SE gate as one kernel (conv2d_fused_se_gate).
FUSE_SE_GATE_SYSTEM = "FusedResNet graph=True fuse_se_gate=True"
RESNET_OPTIONAL_SYSTEMS = ("TorchScript NCHW", "torch.compile default", FUSE_SE_GATE_SYSTEM) + FAMILY_SYSTEMS


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
               "block_fused_bound": block_fused_bound(n, in_channels, peak),
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


def _has_family_90() -> bool:
    """Whether this GPU is sm90 and the build has family-90 (Hopper-native) conv kernels."""
    from .profiler import kernel_families
    return 90 in kernel_families()


def _resnet_system(name, ref, ref_cl, fused, fused_graph, x, x_cl):
    if name == "FusedResNet":
        return lambda: fused(x)
    if name == "FusedResNet graph=True":
        return lambda: fused_graph(x)
    if name == "eager NCHW":
        return lambda: ref(x)
    if name == "eager channels_last + CUDA graph":
        return graphed(lambda: ref_cl(x_cl))
    if name == FUSE_SE_GATE_SYSTEM:
        from ..fused_resnet import FusedResNet
        model = FusedResNet.from_reference(ref, graph=True, fuse_se_gate=True).eval()
        return lambda: model(x)
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
    design = block_fused_bound(row["n"], result["in_channels"], result["peaks"])
    print(f"bound of the block-fused design at N={row['n']} (each block reads its input and weights once and "
          f"writes its output once; the stem as now): {design['bound_us']:.1f} us "
          f"({design['flops'] / 1e9:.1f} GFLOP at the dense fp16 peak: {design['flops_us']:.1f} us; "
          f"{design['bytes'] / 1e6:.0f} MB at HBM bandwidth: {design['bytes_us']:.1f} us; per part: "
          + ", ".join(f"{b['part']} {b['bound_us']:.1f}" for b in design["parts"]) + ")")


def layer_table(n: int, kernel_us: list, in_channels: int, peaks: dict) -> list[dict]:
    """One FusedResNet forward's kernels (kernel_us: (name, µs) in launch order, from its
    device-time measurement) as layers: each conv's TFLOP/s and fraction of the dense fp16
    peak; each memory-bound kernel's (stem, se_gate) compulsory bytes, TB/s and fraction of
    HBM bandwidth.  Every row also gets its bound, `bound_us`: the time at the datasheet peak of
    whichever resource binds it (its FLOPs at the tensor-core peak or its compulsory bytes,
    each map read once and written once, at HBM bandwidth), and `fraction_of_bound`.
    Block 0's conv2 and se_gate may be one kernel (conv2d_fused_se_gate's, in inference on sm90:
    15 kernels); its row then counts the conv's FLOPs and the bytes of both.  Empty when the
    kernel sequence is not the one expected."""
    from ..models import SEResNet9FixUp
    from ..small_map_conv import runs_dense
    model = SEResNet9FixUp(in_channels)
    hw, c = 16, 64
    # the stem reads the input and writes block 0's input
    expected = [("stem (space-to-depth 1x1 conv)", "stem", 0.0, 2 * n * (in_channels * 64 * 64 + 64 * hw * hw))]
    blocks = [layer[0] for layer in model.layers]
    gate_in_conv2 = any("halo_se_gate" in name for name, _ in kernel_us)  # block 0's conv2 + se_gate
    for i, blk in enumerate(blocks):
        k, st = blk.conv1.out_channels, blk.conv1.stride[0]
        out = (hw - 1) // st + 1
        act_in, act = 2 * n * c * hw * hw, 2 * n * k * out * out  # bytes of the input and output maps
        expected.append((f"layers.{i}.conv1 3x3/{st} {c}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * c * 9,
                         act_in + act + 2 * k * c * 9))
        pool_next = i + 1 < len(blocks) and blocks[i + 1].downsample is not None
        if i == 0 and gate_in_conv2 and blk.downsample is None:
            # one kernel: reads conv1's output and the identity, writes out (and the pooled map)
            expected.append((f"layers.{i}.conv2 + se_gate 3x3/1 {k}->{k} {out}x{out} (one kernel)", "conv_se",
                             2.0 * n * out * out * k * k * 9, 3 * act + 2 * k * k * 9 + (act // 4 if pool_next else 0)))
            hw, c = out, k
            continue
        if runs_dense(out, out, 3, 3):  # a dense layer on the whole map: the FLOPs it executes
            expected.append((f"layers.{i}.conv2 as dense {k * out * out}->{k * out * out}", "conv",
                             2.0 * n * (k * out * out) ** 2, 2 * act + 2 * (k * out * out) ** 2))
        else:
            expected.append((f"layers.{i}.conv2 3x3/1 {k}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * k * 9,
                             2 * act + 2 * k * k * 9))
        if blk.downsample is not None:  # on the map se_gate pooled
            expected.append((f"layers.{i}.downsample 1x1 {c}->{k} {out}x{out}", "conv", 2.0 * n * out * out * k * c,
                             act_in // 4 + act + 2 * k * c))
        # se_gate: reads h and the identity, writes out (and the pooled map for the next block)
        expected.append((f"layers.{i}.se_gate", "se_gate", 0.0, 3 * act + (act // 4 if pool_next else 0)))
        hw, c = out, k
    def matches(kind: str, name: str) -> bool:
        if kind == "conv":
            return "conv2d_fused" in name and "se_gate" not in name
        return {"stem": "space_to_depth", "se_gate": "se_gate", "conv_se": "halo_se_gate"}[kind] in name

    if len(kernel_us) != len(expected) or not all(
            matches(kind, name) for (_, kind, _, _), (name, _) in zip(expected, kernel_us)):
        return []
    rows = []
    for (layer, kind, flops, nbytes), (name, us) in zip(expected, kernel_us):
        row = {"layer": layer, "kernel": name, "us": us}
        if kind in ("conv", "conv_se"):
            row["tflops"] = flops / (us * 1e-6) / 1e12
            row["fraction_of_tensor_peak"] = row["tflops"] / peaks["tflops_dense_fp16_datasheet"]
        if kind != "conv":
            row["tb_s"] = nbytes / (us * 1e-6) / 1e12
            row["fraction_of_hbm_peak"] = row["tb_s"] / peaks["hbm_tb_s_datasheet"]
        row["bound_us"] = max(flops / (peaks["tflops_dense_fp16_datasheet"] * 1e12),
                              nbytes / (peaks["hbm_tb_s_datasheet"] * 1e12)) * 1e6
        row["fraction_of_bound"] = row["bound_us"] / us
        rows.append(row)
    return rows


def block_fused_bound(n: int, in_channels: int, peaks: dict) -> dict:
    """The time bound of FusedResNet's forward with each residual block one kernel: per part (the
    stem; each block with its downsample), its FLOPs (every conv as a conv, 3x3 taps on the padding
    counted) at the dense fp16 peak or its compulsory bytes (the part's input read once, its output
    written once, its weights read once, fp16) at HBM bandwidth, whichever is longer; the parts
    add up: what such fusion could reach at best, not what a kernel does."""
    from ..models import SEResNet9FixUp
    model = SEResNet9FixUp(in_channels)
    peak_flops, peak_bytes = peaks["tflops_dense_fp16_datasheet"] * 1e12, peaks["hbm_tb_s_datasheet"] * 1e12
    parts = [("stem", 2.0 * n * 16 * 16 * 16 * in_channels * 64,
              2 * (n * in_channels * 64 * 64 + n * 64 * 16 * 16 + 16 * in_channels * 64))]
    hw, c = 16, 64
    for i, layer in enumerate(model.layers):
        blk = layer[0]
        k, st = blk.conv1.out_channels, blk.conv1.stride[0]
        out = (hw - 1) // st + 1
        flops = 2.0 * n * out * out * (k * c * 9 + k * k * 9 + (k * c if blk.downsample is not None else 0))
        weights = k * c * 9 + k * k * 9 + (k * c if blk.downsample is not None else 0)
        parts.append((f"layers.{i}", flops, 2 * (n * c * hw * hw + n * k * out * out + weights)))
        hw, c = out, k
    rows = [{"part": name, "flops": f, "bytes": b, "bound_us": max(f / peak_flops, b / peak_bytes) * 1e6}
            for name, f, b in parts]
    flops, nbytes = sum(r["flops"] for r in rows), sum(r["bytes"] for r in rows)
    return {"n": n, "parts": rows, "flops": flops, "bytes": nbytes, "flops_us": flops / peak_flops * 1e6,
            "bytes_us": nbytes / peak_bytes * 1e6, "bound_us": sum(r["bound_us"] for r in rows)}


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


def plot_resnet(result: dict, path: Path) -> None:
    env = result.get("environment", {})
    plot_systems(result["rows"], f"SE-ResNet9-FixUp forward, {result['dtype']}, {env.get('gpu', '')}, torch "
                 f"{env.get('torch', '')}\nthroughput (plain) and latency (hatched)", path)
