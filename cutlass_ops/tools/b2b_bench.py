"""Back-to-back conv benchmark (not a test): conv2d_b2b against the same two convs as PyTorch's
users run them, in the same process.

The problem: a bottleneck block's 3x3 conv (C -> K0, bias, ReLU) then its 1x1 conv (K0 -> K1,
bias, ReLU), fp16, N x C x H x W.  Systems: FusedConvPair's "b2b" path, the fused op (eager
call, and in a CUDA graph); its "two_convs" path, our own two unfused conv2d_fused calls in a
CUDA graph (what the fusion saves over them);
eager PyTorch (NCHW; channels_last + CUDA graph, i.e. cuDNN); torch.compile max-autotune
(channels_last; and no-cudagraphs captured by hand).  Throughput, latency and device time
(systems.measure_systems), the ratios of our best to the best peer per metric, the fused
result's error against float64 and the kernel that ran.

    python -m cutlass_ops bench b2b --n 128 --hw 56 --c 64 --k 64 --k1 256
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .systems import measure_systems, print_systems, ratios
from .timing import graphed, hand_graphed_compile

B2B_SYSTEMS = ("Fused conv2d_b2b", "Fused conv2d_b2b + CUDA graph", "Fused conv2d_fused x2 (unfused) + CUDA graph",
               "eager NCHW", "eager channels_last + CUDA graph", "torch.compile max-autotune channels_last",
               "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph")


def b2b_module(c: int, k0: int, k1: int, r: int = 3) -> nn.Sequential:
    """The PyTorch pair, random non-zero weights and biases."""
    g = torch.Generator().manual_seed(0)
    m = nn.Sequential(nn.Conv2d(c, k0, r, padding=r // 2), nn.ReLU(), nn.Conv2d(k0, k1, 1), nn.ReLU())
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p[0].numel() ** 0.5 if p.dim() > 1 else 2.0))
    return m


def bench_b2b(n=128, c=64, k0=64, k1=256, hw=56, dtype=torch.float16, systems=B2B_SYSTEMS, device="cuda",
              **timing) -> dict:
    from .. import ops
    from ..nn import FusedConvPair
    ref = b2b_module(c, k0, k1).to(device, dtype).eval()
    ref_cl = b2b_module(c, k0, k1).to(device, dtype).to(memory_format=torch.channels_last).eval()
    conv0, conv1 = ref_cl[0], ref_cl[2]  # channels_last weights: the fused op takes them without a copy
    x = torch.randn(n, c, hw, hw, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    # The module users run, on its two paths (sharing ref_cl's convs).
    fused = lambda p=FusedConvPair(conv0, conv1, path="b2b"): p(x_cl)  # noqa: E731
    unfused = lambda p=FusedConvPair(conv0, conv1, path="two_convs"): p(x_cl)  # noqa: E731

    with torch.no_grad():
        out = fused()
        kernel = ops.conv2d_b2b_last_kernel()
        d = lambda t: t.double()  # noqa: E731
        y0 = torch.relu(nn.functional.conv2d(d(x), d(conv0.weight), d(conv0.bias), padding=conv0.padding))
        want = torch.relu(nn.functional.conv2d(y0.to(dtype).double(), d(conv1.weight), d(conv1.bias)))
        rel = ((out.double() - want).norm() / want.norm()).item()
        max_err = ((out.double() - want).abs().max() / want.abs().max()).item()

    setups = {
        "Fused conv2d_b2b": lambda: fused,
        "Fused conv2d_b2b + CUDA graph": lambda: graphed(fused),
        "Fused conv2d_fused x2 (unfused) + CUDA graph": lambda: graphed(unfused),
        "eager NCHW": lambda: (lambda: ref(x)),
        "eager channels_last + CUDA graph": lambda: graphed(lambda: ref_cl(x_cl)),
        "torch.compile max-autotune channels_last": lambda: (lambda c=torch.compile(ref_cl, mode="max-autotune"): c(x_cl)),
        "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph":
            lambda: hand_graphed_compile(lambda: ref_cl(x_cl)),
    }
    unknown = [s for s in systems if s not in setups]
    if unknown:
        raise ValueError(f"unknown systems {unknown}; choose from {list(setups)}")
    with torch.no_grad():
        results = measure_systems({s: setups[s] for s in systems}, **timing)
    flops = 2 * n * hw * hw * (c * 9 * k0 + k0 * k1)
    return {"problem": {"n": n, "c": c, "k0": k0, "k1": k1, "hw": hw, "dtype": str(dtype)[6:], "gflop": flops / 1e9},
            "kernel": kernel, "fused_rel_error_vs_float64": rel, "fused_max_error_vs_float64": max_err,
            "results": results, "ratios": ratios(results)}


def print_b2b_table(result: dict) -> None:
    p = result["problem"]
    print(f"conv2d_b2b: N={p['n']} {p['c']}->{p['k0']} 3x3 -> {p['k1']} 1x1 at {p['hw']}x{p['hw']}, {p['dtype']}; "
          f"kernel {result['kernel']}; vs float64: rel {result['fused_rel_error_vs_float64']:.2e}, "
          f"max {result['fused_max_error_vs_float64']:.2e}")
    print("  ms per call; ratio = our best / the best peer in the same metric")
    print_systems(result["results"])
