"""SE excite benchmark (not a test): FusedResNet's squeeze-excitation gate with its excite MLP
(fc1 -> ReLU -> fc2 -> sigmoid) as the loop inside `se_gate` against the same MLP as a
back-to-back GEMM kernel, to keep whichever form is faster.

The B2B GEMM cannot sit inside se_gate's kernel: the excite needs every pixel's squeeze first,
and a CTA holds 1-8 images, i.e. a GEMM of 1-8 rows. So the B2B form is the gate split in three:
`se_squeeze` (se_gate's kernel stopped after its squeeze) -> the excite as one FusedMLP kernel
over the batch's N rows (this project's N-layer B2B GEMM; fp16 weights) -> `se_gate_apply`
(se_gate's kernel with the gate read instead of computed). The same split with the excite as
cuBLAS GEMMs + ATen (float32, as se_gate keeps the weights) separates the split's own cost
from the GEMM's. FusedMLP takes widths up to 256, so block 3 (C=512) has no B2B row.

Systems per SE shape of FusedResNet (base planes 64, 64x64 input; with block 0-2's fused
AvgPool2d), each captured in a CUDA graph as FusedResNet graph=True runs it; eager channels_last
+ CUDA graph for scale; and se_gate with its maps (h, identity) always read from global
memory (CUTLASS_OPS_SE_CACHE=0) and always cached in shared memory where they fit (=1); the
default caches them only where h outgrows half of L2. Throughput, latency and device time (systems.measure_systems).

    python -m cutlass_ops bench se-excite --batch 128 2048
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .systems import measure_systems
from .timing import env_var, graphed

# (C, H, W, avgpool, post_bias): FusedResNet's four SE gates at a 64x64 input (SE ratio 16).
SE_SHAPES = ((64, 16, 16, True, True), (128, 8, 8, True, True), (256, 4, 4, True, True), (512, 2, 2, False, False))
SYSTEMS = ("se_gate (excite loop in the kernel) + CUDA graph",
           "split: se_squeeze + FusedMLP excite (B2B GEMM) + se_gate_apply + CUDA graph",
           "split: se_squeeze + cuBLAS excite + se_gate_apply + CUDA graph",
           "eager channels_last + CUDA graph",
           "se_gate, maps from global memory (CUTLASS_OPS_SE_CACHE=0) + CUDA graph",
           "se_gate, maps cached in shared memory where they fit (CUTLASS_OPS_SE_CACHE=1) + CUDA graph")
MAX_FUSED_MLP_WIDTH = 256


def se_inputs(n: int, c: int, hw: int, dtype=torch.float16, device="cuda", seed=0) -> dict:
    """Random non-zero maps, excite weights and FixUp scalars (float32 weights, as FusedResNet's)."""
    g = torch.Generator().manual_seed(seed)
    r = c // 16
    rnd = lambda *s, std=1.0: (torch.randn(*s, generator=g) * std).to(device)  # noqa: E731
    cl = lambda t: t.to(dtype).contiguous(memory_format=torch.channels_last)  # noqa: E731
    return dict(h=cl(rnd(n, c, hw, hw)), identity=cl(rnd(n, c, hw, hw)), w1=rnd(r, c, std=c ** -0.5), b1=rnd(r),
                w2=rnd(c, r, std=r ** -0.5), b2=rnd(c), idb=rnd((), std=0.3), pb=rnd((), std=0.3),
                hb=rnd((), std=0.3))


def excite_module(t: dict, dtype) -> nn.Sequential:
    """The excite MLP as the PyTorch module FusedMLP traces (weights in the maps' dtype)."""
    c, r = t["w2"].shape
    m = nn.Sequential(nn.Linear(c, r), nn.ReLU(), nn.Linear(r, c), nn.Sigmoid()).to(t["h"].device, dtype)
    with torch.no_grad():
        for lin, w, b in ((m[0], t["w1"], t["b1"]), (m[2], t["w2"], t["b2"])):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
    return m


def bench_se_excite(batches=(128, 2048), dtype=torch.float16, shapes=SE_SHAPES, systems=SYSTEMS,
                    progress=print, **timing) -> dict:
    from ..fused_mlp import FusedMLP
    from ..options import MlpOptions
    rows = []
    for n in batches:
        for c, hh, ww, avgpool, has_post in shapes:
            t = se_inputs(n, c, hh, dtype)
            pb = t["pb"] if has_post else None
            label = f"N={n} C={c} {hh}x{ww}: "
            fused_excite = None
            if c <= MAX_FUSED_MLP_WIDTH:
                # the kernel at every width: FusedMLP runs models wider than 128 as PyTorch's ops
                # by default, and here the kernel is the point
                fused_excite = FusedMLP.from_module(excite_module(t, dtype), torch.zeros(1, c, dtype=dtype, device="cuda"),
                                                    options=MlpOptions(wide_kernel=True))
                fused_excite.compile_kernel(dtype, torch.device("cuda"), inference=True)

            paths = se_paths(t, avgpool, pb, fused_excite)
            setups = {name: (lambda f=f: graphed(f)) for name, f in paths.items()}
            with torch.no_grad():
                b2b_kernel = None if fused_excite is None else fused_excite.uses_kernel(t["h"][:, :, 0, 0])
                errors = errors_vs_float64(t, avgpool, pb, paths)
                results = measure_systems({s: setups[s] for s in systems if s in setups}, label=label,
                                          progress=progress, **timing)
            rows.append({"n": n, "c": c, "h": hh, "w": ww, "r": c // 16, "avgpool": avgpool,
                         "fused_mlp_kernel": b2b_kernel, "errors_vs_float64": errors, "results": results})
            _print_row(rows[-1])
    return {"dtype": str(dtype)[6:], "systems": list(systems), "rows": rows}


def se_paths(t: dict, avgpool: bool, pb, fused_excite=None) -> dict:
    """System name -> the call it times (uncaptured): se_gate, the split with the cuBLAS excite,
    with `fused_excite` (a FusedMLP of the excite, if given), and the eager PyTorch gate."""
    from .. import ops
    dtype = t["h"].dtype

    def se_gate():
        return ops.se_gate(t["h"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"], t["idb"], pb,
                           avgpool=avgpool, h_bias=t["hb"])

    def split(excite):
        def run():
            gate = excite(ops.se_squeeze(t["h"], t["hb"]))
            return ops.se_gate_apply(t["h"], t["identity"], gate, t["idb"], pb, avgpool=avgpool, h_bias=t["hb"])
        return run

    def cublas_excite(s):
        return torch.sigmoid(F.linear(torch.relu(F.linear(s.float(), t["w1"], t["b1"])), t["w2"], t["b2"]))

    def eager():
        h = t["h"] + t["hb"]
        gate = cublas_excite(h.mean((2, 3), dtype=torch.float32)).to(dtype)
        out = torch.relu(h * gate[:, :, None, None] + t["identity"] + t["idb"])
        out = out + pb if pb is not None else out
        return (out, F.avg_pool2d(out, 3, 2, 1)) if avgpool else out

    def se_gate_cache(setting):  # se_gate with its maps' cache in shared memory set (see se_gate_cuda.cpp)
        def run():
            with env_var("CUTLASS_OPS_SE_CACHE", setting):
                return se_gate()
        return run

    paths = {SYSTEMS[0]: se_gate, SYSTEMS[2]: split(cublas_excite), SYSTEMS[3]: eager,
             SYSTEMS[4]: se_gate_cache("0"), SYSTEMS[5]: se_gate_cache("1")}
    if fused_excite is not None:
        paths[SYSTEMS[1]] = split(fused_excite)
    return paths


def errors_vs_float64(t: dict, avgpool: bool, pb, paths: dict) -> dict:
    """System -> relative error (norm) of its `out` against the float64 gate."""
    d = {k: v.double() for k, v in t.items()}
    h = d["h"] + d["hb"]
    gate = torch.sigmoid(F.linear(torch.relu(F.linear(h.mean((2, 3)), d["w1"], d["b1"])), d["w2"], d["b2"]))
    want = torch.relu(h * gate[:, :, None, None] + d["identity"] + d["idb"]) + (d["pb"] if pb is not None else 0)
    out = {}
    for name, path in paths.items():
        got = path()
        got = got[0] if avgpool else got
        out[name] = ((got.double() - want).norm() / want.norm()).item()
    return out


def _print_row(row: dict) -> None:
    b2b = {True: "its kernel", False: "PyTorch's ops (not the kernel)", None: "-"}[row.get("fused_mlp_kernel")]
    print(f"N={row['n']} C={row['c']} {row['h']}x{row['w']} (R={row['r']}, avgpool {row['avgpool']}; FusedMLP excite "
          f"ran {b2b}); ms per call, CUDA graph replays:")
    print(f"  {'system':78s} {'throughput':>10s} {'latency':>9s} {'device':>8s} {'kernels':>7s} {'rel.err':>8s}")
    base = row["results"].get(SYSTEMS[0], {})
    for name, r in row["results"].items():
        if "error" in r:
            print(f"  {name:78s} failed: {r['error']}")
            continue
        vs = ("  / se_gate: " + ", ".join(f"{r[m] / base[m]:.2f}x {m[:-3]}" for m in ("throughput_ms", "device_ms"))
              if "throughput_ms" in base and name != SYSTEMS[0] else "")
        print(f"  {name:78s} {r['throughput_ms']:10.4f} {r['latency_ms']:9.4f} {r['device_ms']:8.4f} "
              f"{r['kernels']:7d} {row['errors_vs_float64'].get(name, float('nan')):8.1e}{vs}")
