"""CvT-13 benchmark and training check (not tests).

    python -m cutlass_ops bench cvt                      # 224x224 fp16: inference N=1 64 256, training N=64 128
    python -m cutlass_ops train-check-cvt --steps 50     # loss curves FusedCvT vs the reference (JSON + PNG)

Inference: FusedCvT (eager, and captured in a CUDA graph by hand; with its switchable paths
too, FUSED_CVT_VARIANTS) against the reference
module (cutlass_ops.models.cvt) run as its users would: eager NCHW, eager channels_last in a CUDA
graph, torch.compile mode="max-autotune" (its own CUDA graphs) on the NCHW and the
channels_last model, and mode="max-autotune-no-cudagraphs" captured in one CUDA graph by hand.
A training step: gradients set to None, forward, loss = mean(out^2) in float32, backward
(bench.train_bench's step), the same systems.  Each in bench.measure_systems's three
metrics: throughput (K back-to-back calls between two CUDA events, median of reps), latency
(one synchronized call, median), device time (torch.profiler kernel sum of one call), with
setup time and peak memory.  The model: random weights (the reference's init), fp16 (or
bf16), eval mode for inference, train mode (BatchNorm batch statistics, drop path 0.1 in
stage 3) for training.

FusedCvT is fused only in parts: two conv embeddings, its LayerNorms with the residual adds
(forward and backward), QuickGELU as one SiLU, and in inference each attention's q/k/v
depthwise convs as one kernel (cutlass_ops/fused_cvt.py, fused_cvt_blocks.py); the rest is PyTorch.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from .systems import measure_systems, plot_systems, print_systems, ratios
from .timing import env_var, graphed, hand_graphed_compile
from ..models.cvt import cvt13, cvt_flops, CVT13_SPEC
from ..fused_cvt import FusedCvT
from ..options import CvTOptions
from .train_check import plot, train_losses

# FusedCvT's switchable paths: the default runs every fused kernel (CvTOptions, all timed
# faster); each variant turns one off ("unfused LN": ATen's add and LayerNorm; "cuBLAS fc1":
# cuBLAS's fc1 and a SiLU pass; "cuDNN dw convs": cuDNN's depthwise conv per projection with the
# dw_bn bias in the q/k/v Linears; "cuDNN embedding": cuDNN's conv, a bias pass and the
# LayerNorm kernel for stage 1's embedding; "residual adds apart": the residual adds in the
# LayerNorm kernels and a pass at each stage's end instead of the GEMMs' epilogues), or, through
# an environment variable read per call by the op (set while the CUDA graph is captured), runs
# dw_conv3x3_tokens's strip kernel instead of its tiled one ("strip dw kernel",
# CUTLASS_OPS_DW_TILE=0) or, in training, the Linears' bias gradients as ATen's column sums
# instead of GEMVs ("bias grad by sum", CUTLASS_OPS_LINEAR_BGRAD=sum, cutlass_ops/linear.py).
FUSED_CVT_VARIANTS = {
    "FusedCvT unfused LN + CUDA graph": {"fused_layer_norm": False},
    "FusedCvT cuBLAS fc1 + CUDA graph": {"linear_silu": False},
    "FusedCvT cuDNN dw convs + CUDA graph": {"dw_tokens": False},
    "FusedCvT cuDNN embedding + CUDA graph": {"conv_embed": False},
    "FusedCvT residual adds apart + CUDA graph": {"residual_gemm": False},
    "FusedCvT bias grad by sum + CUDA graph": {"CUTLASS_OPS_LINEAR_BGRAD": "sum"},
    "FusedCvT strip dw kernel + CUDA graph": {"CUTLASS_OPS_DW_TILE": "0"},
}
CVT_INFER_SYSTEMS = ("FusedCvT", "FusedCvT + CUDA graph", *FUSED_CVT_VARIANTS, "eager NCHW",
                     "eager channels_last + CUDA graph",
                     "torch.compile max-autotune", "torch.compile max-autotune channels_last",
                     "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph")
CVT_TRAIN_SYSTEMS = ("FusedCvT", "FusedCvT + CUDA graph", *FUSED_CVT_VARIANTS,
                     "eager channels_last + CUDA graph",
                     "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph",
                     "torch.compile max-autotune", "torch.compile max-autotune channels_last")
CVT_INFER_BATCHES = (1, 64, 256)
CVT_TRAIN_BATCHES = (64, 128)


def cvt_reference(dtype=torch.float16, device="cuda", seed: int = 0):
    torch.manual_seed(seed)
    return cvt13().to(device=device, dtype=dtype)


def _variant_options(name: str) -> CvTOptions:
    """The CvTOptions of FusedCvT variant `name` (the defaults for other systems)."""
    fields = {k: v for k, v in FUSED_CVT_VARIANTS.get(name, {}).items() if not k.startswith("CUTLASS_OPS_")}
    return dataclasses.replace(CvTOptions(), **fields)


@contextlib.contextmanager
def _variant_env(name: str):
    """The environment variables of FusedCvT variant `name` set (none for other systems)."""
    with contextlib.ExitStack() as stack:
        for var, value in FUSED_CVT_VARIANTS.get(name, {}).items():
            if var.startswith("CUTLASS_OPS_"):
                stack.enter_context(env_var(var, value))
        yield


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def _infer_system(name: str, ref, x):
    """The callable to time for inference system `name` (models built from copies of `ref`)."""
    if name.startswith("FusedCvT"):
        fused = FusedCvT.from_reference(ref, _variant_options(name)).eval()
        call = _no_grad(lambda: fused(x))
        if name == "FusedCvT":
            return call
        with torch.no_grad(), _variant_env(name):
            return graphed(lambda: fused(x))
    model = copy.deepcopy(ref).eval()
    xin = x
    if "channels_last" in name:
        model = model.to(memory_format=torch.channels_last)
        xin = x.contiguous(memory_format=torch.channels_last)
    if name == "eager NCHW":
        return _no_grad(lambda: model(xin))
    if name == "eager channels_last + CUDA graph":
        with torch.no_grad():
            return graphed(lambda: model(xin))
    if name == "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph":
        with torch.no_grad():
            return hand_graphed_compile(lambda: model(xin))
    if name.startswith("torch.compile max-autotune"):
        compiled = torch.compile(model, mode="max-autotune")
        return _no_grad(lambda: compiled(xin))
    raise ValueError(f"unknown inference system {name!r}; choose from {list(CVT_INFER_SYSTEMS)}")


def _train_system(name: str, ref, x):
    from .train_bench import _loss, _step_fn  # the FusedResNet training bench's step
    if name.startswith("FusedCvT"):
        model = FusedCvT.from_reference(ref, _variant_options(name)).train()
    else:
        model = copy.deepcopy(ref).train()
    if "channels_last" in name:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if name == "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph":
        return graphed(_step_fn(model, torch.compile(_loss(model), mode="max-autotune-no-cudagraphs"), x))
    if name.startswith("torch.compile max-autotune"):
        return _step_fn(model, torch.compile(_loss(model), mode="max-autotune"), x, mark_step=True)
    if name not in CVT_TRAIN_SYSTEMS:
        raise ValueError(f"unknown training system {name!r}; choose from {list(CVT_TRAIN_SYSTEMS)}")
    step = _step_fn(model, _loss(model), x)
    if not name.endswith("CUDA graph"):
        return step
    with _variant_env(name):
        return graphed(step)


def _rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def bench_cvt(infer_batches=CVT_INFER_BATCHES, train_batches=CVT_TRAIN_BATCHES, dtype=torch.float16,
              infer_systems=CVT_INFER_SYSTEMS, train_systems=CVT_TRAIN_SYSTEMS, size: int = 224,
              calls: int = 50, reps: int = 5, latency_iters: int = 50, rounds: int = 3, progress=print) -> dict:
    for name in infer_systems:
        if name not in CVT_INFER_SYSTEMS:
            raise ValueError(f"unknown inference system {name!r}; choose from {list(CVT_INFER_SYSTEMS)}")
    for name in train_systems:
        if name not in CVT_TRAIN_SYSTEMS:
            raise ValueError(f"unknown training system {name!r}; choose from {list(CVT_TRAIN_SYSTEMS)}")
    ref = cvt_reference(dtype)
    flops = cvt_flops(CVT13_SPEC, size, size)
    infer_rows, train_rows = [], []
    for n in infer_batches:
        x = torch.randn(n, 3, size, size, device="cuda", dtype=dtype)
        with torch.no_grad():  # a sanity check of the timed model, not the accuracy test (tests/python)
            fused = FusedCvT.from_reference(ref).eval()
            err = _rel_error(fused(x), copy.deepcopy(ref).eval()(x))
            report = fused.kernel_report(x)
            del fused
        setups = {name: (lambda name=name: _infer_system(name, ref, x)) for name in infer_systems}
        results = measure_systems(setups, rounds=rounds, calls=calls, reps=reps, latency_iters=latency_iters,
                                  progress=progress, label=f"inference N={n}: ", interleave=True)
        row = {"n": n, "results": results, "ratios": ratios(results), "fused_vs_eager_rel_error": err,
               "fused_conv_kernels": report, "gflop_per_image": flops / 1e9}
        ours = [r["throughput_ms"] for s, r in results.items() if s.startswith("FusedCvT") and "throughput_ms" in r]
        if ours:
            row["fused_tflops"] = n * flops / (min(ours) * 1e-3) / 1e12
        infer_rows.append(row)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    for n in train_batches:
        x = torch.randn(n, 3, size, size, device="cuda", dtype=dtype)
        setups = {name: (lambda name=name: _train_system(name, ref, x)) for name in train_systems}
        results = measure_systems(setups, rounds=rounds, calls=max(1, calls // 5), reps=reps,
                                  latency_iters=max(5, latency_iters // 5), progress=progress,
                                  label=f"training N={n}: ", interleave=False)
        train_rows.append({"n": n, "results": results, "ratios": ratios(results)})
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return {"model": "CvT-13", "size": size, "dtype": str(dtype)[6:],
            "fused_parts": "conv embeddings 2 and 3: conv2d_fused (CUTLASS, conv + bias); the 7x7 embedding with its "
                           "LayerNorm: conv_embed (autograd off; cuDNN + layer_norm_rows in training); "
                           "LayerNorms: layer_norm_rows (with the residual add before each where it is not in a "
                           "GEMM); with autograd off the output projections and fc2 add onto the residual stream "
                           "in their epilogue: linear_residual (cuBLASLt); QuickGELU as one "
                           "SiLU (its scales as the GEMMs' alpha; on sm90 with autograd off fc1 + SiLU as linear_silu); "
                           "the q/k/v depthwise convs: dw_conv3x3_tokens (BatchNorm folded in eval; in training the "
                           "convs and their input gradients); the drop path: scale_samples; everything else PyTorch "
                           "(the other linears, SDPA, BatchNorm in training, the head's LayerNorm)",
            "timing": {"throughput": f"inference: {calls} back-to-back calls between two CUDA events, training: "
                                     f"{max(1, calls // 5)} steps; median of {reps}",
                       "latency": "one synchronized call between two CUDA events, median",
                       "device_time": "torch.profiler kernel sum of one call (memcpy/memset excluded)",
                       "rounds": f"{rounds} rounds (inference interleaved; training one system after the other)"},
            "inference": infer_rows, "training": train_rows}


def merge_results(old: dict, new: dict) -> dict:
    """`new` with the rows and systems of an earlier run's result `old` that it lacks (a long
    benchmark split over several calls: one batch size or system per call); `new` wins."""
    out = dict(new)
    for kind in ("inference", "training"):
        rows = {r["n"]: copy.deepcopy(r) for r in old.get(kind, [])}
        for r in new.get(kind, []):
            if r["n"] in rows:
                merged = rows[r["n"]]
                merged.update({k: v for k, v in r.items() if k != "results"})
                merged["results"] = {**merged["results"], **r["results"]}
                merged["ratios"] = ratios(merged["results"])
            else:
                rows[r["n"]] = r
        out[kind] = [rows[n] for n in sorted(rows)]
    return out


def print_cvt_table(result: dict) -> None:
    env = result.get("environment", {})
    print(f"CvT-13 {result['size']}x{result['size']}, {result['dtype']}, {env.get('gpu', '')}; fused: "
          f"{result['fused_parts']}")
    for k, v in result.get("timing", {}).items():
        print(f"  {k}: {v}")
    for kind in ("inference", "training"):
        for row in result[kind]:
            extra = f"  (rel. error vs eager {row['fused_vs_eager_rel_error']:.1e})" if kind == "inference" else ""
            print(f"{kind} N={row['n']}{extra}")
            print_systems(row["results"])
            if "fused_tflops" in row:
                print(f"  FusedCvT best throughput: {row['fused_tflops']:.1f} TFLOP/s "
                      f"({row['gflop_per_image']:.2f} GFLOP per image)")


def plot_cvt(result: dict, path: Path) -> None:
    env = result.get("environment", {})
    for kind in ("inference", "training"):
        if result[kind]:
            plot_systems(result[kind], f"CvT-13 {kind}, {result['dtype']}, {env.get('gpu', '')}, torch "
                         f"{env.get('torch', '')}\nthroughput (plain) and latency (hatched)",
                         path.with_name(f"{path.stem}_{kind}{path.suffix}"))


# ---- training check: loss curves ------------------------------------------------------------

def train_curves(steps: int = 50, n: int = 8, size: int = 224, device="cpu", dtype=torch.float32, amp_dtype=None,
                 lr: float = 1e-3, seed: int = 0, model_fn=None) -> dict:
    """The reference and FusedCvT from the same weights, trained side by side with AdamW on
    one fixed synthetic batch (random images, random labels: the loss falls as they are
    memorised).  Drop path 0 (its random draws would differ between the two runs' RNG
    streams).  With `amp_dtype`: float32 weights, torch.autocast and a GradScaler."""
    torch.manual_seed(seed)
    ref = (model_fn or (lambda: cvt13(drop_path_rate=0.0)))().to(device=device, dtype=dtype)
    fused = FusedCvT.from_reference(ref)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, 3, size, size, generator=g).to(device=device, dtype=dtype)
    y = torch.randint(0, ref.num_classes, (n,), generator=g).to(device)
    curves = {}
    for name, model in (("reference (PyTorch)", ref), ("FusedCvT", fused)):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
        curves[name] = train_losses(opt, lambda: F.cross_entropy(model(x).float(), y), steps, device, amp_dtype)
    a, b = curves.values()
    return {"model": "CvT-13" if model_fn is None else "CvT (custom)", "steps": steps, "n": n, "size": size,
            "device": str(device), "dtype": str(dtype)[6:], "autocast": str(amp_dtype)[6:] if amp_dtype else None,
            "lr": lr, "optimizer": "AdamW(weight_decay=0.05)", "curves": curves,
            "max_rel_diff": max(abs(u - v) / max(abs(u), 1e-12) for u, v in zip(a, b)),
            "median_rel_diff": statistics.median(abs(u - v) / max(abs(u), 1e-12) for u, v in zip(a, b))}


def plot_curves(result: dict, path: Path) -> None:
    plot(result, path, model=f"{result['model']}, N={result['n']} {result['size']}x{result['size']},",
         ylabel="cross-entropy loss", log=False)


def train_check_main(args) -> int:
    from .timing import environment
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    amp = dtypes[args.amp] if args.amp else None
    if amp is not None and args.dtype != "fp32":
        raise SystemExit("train-check-cvt: --amp keeps float32 weights; leave --dtype at fp32")
    if args.size % 16:
        raise SystemExit(f"train-check-cvt: --size must be a multiple of 16, got {args.size}")
    result = train_curves(args.steps, args.n, args.size, args.device, dtypes[args.dtype], amp_dtype=amp, lr=args.lr)
    result["environment"] = environment()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    for name, losses in result["curves"].items():
        print(f"{name:22s} loss: step 0 {losses[0]:.4f}  step {len(losses) - 1} {losses[-1]:.4f}")
    print(f"max relative difference between the curves: {result['max_rel_diff']:.2e} "
          f"(median {result['median_rel_diff']:.2e})")
    try:
        plot_curves(result, out.with_suffix(".png"))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    except ImportError:
        print(f"wrote {out.with_suffix('.json')} (no matplotlib: no plot)")
    return 0
