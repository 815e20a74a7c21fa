"""Profiler sweep: every built conv2d_fused kernel on a model's conv problems, timed on this
GPU, written to profiles/<gpu>/sm<family>.csv in the CUTLASS profiler's conv2d columns.
With ``--backward`` the dgrad/wgrad kernels and cuDNN's instead (profiler_backward.py).  On
sm90 the dispatcher compares family 90's rules (sm90.csv) with the same GPU's sm80.csv by their times.

The generator (python/cutlass_ops_gen/tiles.py) reads these files at the next build: it
instantiates each problem's fastest tile and emits a dispatch rule for it.  Build with
CUTLASS_OPS_KERNELS=sweep first so the candidate tiles exist.  Rows are appended as they
are measured, and problems already in the file are skipped: a sweep resumes where an
earlier (interrupted) one stopped.
"""
from __future__ import annotations

import copy
import csv
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..ops import conv2d_fused
from .timing import environment, graphed, time_cuda

# The CUTLASS profiler's conv2d CSV columns (tools/profiler), in its order.
COLUMNS = ("Problem,Provider,OperationKind,Operation,Disposition,Status,conv_kind,n,h,w,c,k,r,s,p,q,g,"
           "pad_h,pad_w,stride_h,stride_w,dilation_h,dilation_w,Activation,Filter,Output,conv_mode,"
           "iterator_algorithm,alpha,beta,split_k_mode,split_k_slices,eq_gemm_provider,op_class,accum,"
           "cta_m,cta_n,cta_k,cluster_m,cluster_n,cluster_k,cluster_m_fallback,cluster_n_fallback,"
           "cluster_k_fallback,stages,warps_m,warps_n,warps_k,inst_m,inst_n,inst_k,min_cc,max_cc,"
           "Bytes,Flops,Flops/Byte,Runtime,GB/s,GFLOPs").split(",")

_NAME = re.compile(r"cutlass_ops_conv2d_fused_(?P<dtype>b?f16)_sm(?P<family>\d+)_(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)"
                   r"_(?P<stages>\d+)s_(?P<wm>\d+)x(?P<wn>\d+)w_(?P<it>[oa])_align(?P<align>\d+)$")
# Family 90 (CUTLASS 3.x): tile, stages ("auto" = the builder's count), cluster M x N, and the
# persistent kernels' schedule (coop, pp; none for the stock kernel), which the profile rows keep
# in their Operation name (the generator's reader takes it from there).
_NAME90 = re.compile(r"cutlass_ops_conv2d_fused_(?P<dtype>b?f16)_sm(?P<family>90)_(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)"
                     r"_(?P<stages>\d+|auto)s_(?P<cm>\d+)x(?P<cn>\d+)c(?:_(?P<schedule>coop|pp))?_align(?P<align>\d+)$")


def kernel_families() -> list[int]:
    """The conv2d_fused kernel families in this build that this GPU runs (90 only on sm90)."""
    cc = torch.cuda.get_device_capability()
    built = {int(m["family"]) for m in map(lambda n: _NAME.match(n) or _NAME90.match(n),
                                            torch.ops.cutlass_ops.conv2d_fused_kernels()) if m}
    runs = {90, 80} if cc == (9, 0) else {80} if cc >= (8, 0) else {70}
    return sorted(built & runs, reverse=True)


def resnet_problems(batch_sizes, in_channels: int = 3, training: bool = False) -> list[dict]:
    """Every distinct conv FusedResNet runs (stem, conv1, conv2, downsample per block), per
    batch size (block 0's conv1 and conv2 are one problem).  FusedResNet's convs differ
    from the reference module's (the stem is a 1x1 conv on the space-to-depth input, the
    downsample a 1x1 conv on the pooled map, block 3's conv2 a dense layer), so they are
    listed here, not hooked.  training=True: the convs whose dgrad/wgrad training runs
    (conv1, conv2 and downsample; block 3's dense conv2 for its dgrad, its 3x3 conv for
    its wgrad, small_map_conv.py; the stem's backward is its own kernel)."""
    from ..models import SEResNet9FixUp
    from ..small_map_conv import runs_dense
    model = SEResNet9FixUp(in_channels)
    problems = []
    for n in batch_sizes:
        if not training:
            problems.append(dict(n=n, h=16, w=16, c=16 * in_channels, k=64, r=1, s=1, pad=0, stride=1))
        hw = 16
        for layer in model.layers:
            blk = layer[0]
            c, k, st = blk.conv1.in_channels, blk.conv1.out_channels, blk.conv1.stride[0]
            out = hw // st
            problems.append(dict(n=n, h=hw, w=hw, c=c, k=k, r=3, s=3, pad=1, stride=st))
            problems.append(dict(n=n, h=out, w=out, c=k, k=k, r=3, s=3, pad=1, stride=1))
            if runs_dense(out, out):  # a 1x1 conv on one "pixel" of out*out*k channels
                problems.append(dict(n=n, h=1, w=1, c=out * out * k, k=out * out * k, r=1, s=1,
                                     pad=0, stride=1))
            if blk.downsample is not None:  # 1x1 on the pooled input
                problems.append(dict(n=n, h=out, w=out, c=c, k=k, r=1, s=1, pad=0, stride=1))
            hw = out
    return _unique(problems)


def problems_from_model(model: torch.nn.Module, input_shape, batch_sizes) -> list[dict]:
    """The conv problems `model` runs on inputs (N, *input_shape), read with forward hooks
    on its nn.Conv2d modules (grouped or dilated convs are skipped: no kernels for them)."""
    seen: list[dict] = []

    def hook(conv, inputs, _output):
        x = inputs[0]
        if conv.groups != 1 or conv.dilation != (1, 1) or conv.stride[0] != conv.stride[1] \
                or conv.padding[0] != conv.padding[1] or isinstance(conv.padding, str):
            return
        seen.append(dict(n=x.shape[0], h=x.shape[2], w=x.shape[3], c=conv.in_channels,
                         k=conv.out_channels, r=conv.kernel_size[0], s=conv.kernel_size[1],
                         pad=conv.padding[0], stride=conv.stride[0]))

    model = copy.deepcopy(model).to("meta")  # shapes only: no memory, no compute
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    try:
        with torch.no_grad():
            for n in batch_sizes:
                model(torch.empty(n, *input_shape, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return _unique(seen)


class CvtMlpGemms(torch.nn.Module):
    """CvT-13's block MLP GEMMs (fc1 C -> 4C and fc2 4C -> C for C = 64, 192, 384) as 1x1 convs
    over a token map (N, C, L, 1), each on an input of its own width (only the shapes matter),
    for ``profile --model cutlass_ops.tools.profiler:CvtMlpGemms --input-shape 64,3136,1 --batch
    4 16 64`` (GEMM M 12544, 50176, 200704: N=64's stage 3, 2 and 1): conv2d_fused's tiles on
    those shapes, for comparing with linear_silu (FusedCvT's fc1 in inference); no such rules
    are committed in profiles/."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(a, b, 1) for c in (64, 192, 384) for a, b in ((c, 4 * c), (4 * c, c)))

    def forward(self, x):
        return [conv(x.new_empty(x.shape[0], conv.in_channels, *x.shape[2:])) for conv in self.convs]


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA A100-SXM4-80GB' -> 'a100-sxm4-80gb'."""
    name = name.lower().replace("nvidia", "").strip()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def _problem_key(p: dict) -> tuple:
    return (p["n"], p["h"], p["w"], p["c"], p["k"], p["r"], p["s"], p["pad"], p["stride"])


def _unique(problems: list[dict]) -> list[dict]:
    """First occurrence of each problem, in order."""
    unique: dict = {}
    for p in problems:
        unique.setdefault(_problem_key(p), p)
    return list(unique.values())


def _done(path: Path) -> set:
    if not path.exists():
        return set()
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(r["Operation"], int(r.get("split_k_slices") or 1))
                + tuple(int(r[c]) for c in ("n", "h", "w", "c", "k", "r", "s", "pad_h", "stride_h"))
                for r in rows}


def _time_ms(fn, iters: int, reps: int = 10) -> float:
    """Median GPU time of one fn() call, timed as replays of a CUDA graph of `reps` calls:
    an eager call costs ~35 us of host work, more than most of these kernels take, so
    timing eager calls would rank tiles by noise (the first sweep on the H200 did)."""
    replay = graphed(lambda: [fn() for _ in range(reps)])
    return time_cuda(replay, warmup=1, iters=iters)["median_ms"] / reps


def sweep(problems: list[dict], out: Path, dtype=torch.float16, iters: int = 20, family: int | None = None,
          progress=lambda msg: print(msg, file=sys.stderr, flush=True)) -> int:
    """Measures every built kernel of `dtype` and `family` (default: this GPU's newest) on
    each problem; returns rows written."""
    dname = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    if family is None:
        families = kernel_families()
        family = families[0] if families else 80
    name = _NAME90 if family == 90 else _NAME
    kernels = [m for m in map(name.match, torch.ops.cutlass_ops.conv2d_fused_kernels())
               if m and m["dtype"] == dname and int(m["family"]) == family]
    if not kernels:
        raise RuntimeError(f"no {dname} sm{family} kernels in this build")
    done = _done(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not out.exists()
    env = environment()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    jobs = [(p, k, split) for p in problems for k in kernels
            if int(k["align"]) == 8 and p["c"] % 8 == 0 and p["k"] % 8 == 0
            for split in split_k_candidates(p, k, sms)
            if (k.string, split) + _problem_key(p) not in done]
    progress(f"profile: {len(jobs)} measurements ({len(problems)} problems x {len(kernels)} kernels, "
             f"{len(done)} already in {out})")
    written, start = 0, time.time()
    with open(out, "a", newline="") as f:
        if new_file:
            f.write(f"# cutlass_ops profile: {env.get('gpu')} (sm{env.get('sm')}), kernel family sm{family}, "
                    f"driver {_driver()}, CUDA {env['cuda']}, torch {env['torch']}, {env['time']}\n")
        writer = csv.DictWriter(f, COLUMNS)
        if new_file:
            writer.writeheader()
        cache = {}
        for i, (p, k, split) in enumerate(jobs, 1):
            key = _problem_key(p)
            if key not in cache:
                cache = {key: _inputs(p, dtype)}  # one problem's tensors at a time
            x, w, bias, ref = cache[key]
            torch.ops.cutlass_ops.conv2d_fused_force_kernel(k.string, split)
            try:
                fn = lambda: conv2d_fused(x, w, bias, None, p["stride"], p["pad"], None, None, True)
                y = fn()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                ok = err < (5e-3 if dtype == torch.float16 else 3e-2)
                ms = _time_ms(fn, iters) if ok else float("nan")
                writer.writerow(_row(len(done) + i, p, k, dname, family, split, ms,
                                     "passed" if ok else "incorrect"))
                written += 1
            except (ValueError, RuntimeError) as e:  # cannot run this problem: no row
                progress(f"  skip {k.string} split_k={split}: {str(e).splitlines()[0][:120]}")
            finally:
                torch.ops.cutlass_ops.conv2d_fused_force_kernel("")
            if i % 10 == 0 or i == len(jobs):
                f.flush()
                eta = (time.time() - start) / i * (len(jobs) - i)
                progress(f"  [{i}/{len(jobs)}] n={p['n']} {p['c']}->{p['k']} {p['h']}x{p['w']} "
                         f"{p['r']}x{p['s']}/{p['stride']}  {k.string[25:]} split_k={split}  eta {eta:.0f} s")
    return written


def split_k_candidates(p: dict, k: re.Match, num_sms: int) -> list[int]:
    """Serial split-K slices worth timing: 1, and when the output tiles leave SMs idle,
    2..16 that keep >= 2 K-iterations per slice and <= 2 CTAs per SM."""
    if k["family"] == "90":
        return [1]  # the CUTLASS 3.x conv kernel has no split-K
    pq = [(d + 2 * p["pad"] - f) // p["stride"] + 1 for d, f in ((p["h"], p["r"]), (p["w"], p["s"]))]
    tm, tn, tk = int(k["m"]), int(k["n"]), int(k["k"])
    ctas = -(-p["n"] * pq[0] * pq[1] // tm) * -(-p["k"] // tn)
    k_iterations = -(-p["r"] * p["s"] * p["c"] // tk)
    if ctas >= num_sms:
        return [1]
    return [1] + [s for s in (2, 4, 8, 16) if 2 * s <= k_iterations and ctas * s <= 2 * num_sms]


def _driver() -> str:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception:  # informative only
        return "unknown"


def _inputs(p: dict, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(p["n"], p["c"], p["h"], p["w"], device="cuda", dtype=dtype, generator=g)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(p["k"], p["c"], p["r"], p["s"], device="cuda", dtype=dtype, generator=g)
    w = (w / (p["c"] * p["r"] * p["s"]) ** 0.5).contiguous(memory_format=torch.channels_last)
    bias = torch.randn((), device="cuda", generator=g)
    ref = torch.relu(F.conv2d(x.float(), w.float(), stride=p["stride"], padding=p["pad"]) + bias)
    return x, w, bias, ref


def _row(idx, p, k, dname, family, split, ms, disposition) -> dict:
    pq = [(d + 2 * p["pad"] - f) // p["stride"] + 1 for d, f in ((p["h"], p["r"]), (p["w"], p["s"]))]
    flops = 2 * p["n"] * pq[0] * pq[1] * p["k"] * p["c"] * p["r"] * p["s"]
    nbytes = 2 * (p["n"] * p["h"] * p["w"] * p["c"] + p["k"] * p["r"] * p["s"] * p["c"] + p["n"] * pq[0] * pq[1] * p["k"])
    t = f"{dname}:nhwc"
    row = dict(Problem=idx, Provider="cutlass_ops", OperationKind="conv2d", Operation=k.string,
               Disposition=disposition, Status="success", conv_kind="fprop", n=p["n"], h=p["h"], w=p["w"],
               c=p["c"], k=p["k"], r=p["r"], s=p["s"], p=pq[0], q=pq[1], g=1, pad_h=p["pad"], pad_w=p["pad"],
               stride_h=p["stride"], stride_w=p["stride"], dilation_h=1, dilation_w=1, Activation=t,
               Filter=t, Output=t, conv_mode="cross",
               iterator_algorithm="optimized" if family == 90 or k["it"] == "o" else "analytic", alpha=1, beta=0,
               split_k_mode="serial", split_k_slices=split, eq_gemm_provider="none", op_class="tensorop",
               accum="f32", cta_m=k["m"], cta_n=k["n"], cta_k=k["k"], cluster_m=1, cluster_n=1, cluster_k=1,
               cluster_m_fallback=1, cluster_n_fallback=1, cluster_k_fallback=1, stages=k["stages"],
               warps_m=k.groupdict().get("wm"), warps_n=k.groupdict().get("wn"), warps_k=1,
               inst_m=16, inst_n=8, inst_k=16,
               min_cc=family, max_cc=1024, Bytes=nbytes, Flops=flops, Runtime=f"{ms:.6f}")
    if family == 90:  # a cluster instead of warps; the tile's wgmma instruction is 64 x N x 16
        row.update(cluster_m=k["cm"], cluster_n=k["cn"], cluster_m_fallback=k["cm"], cluster_n_fallback=k["cn"],
                   stages=0 if k["stages"] == "auto" else k["stages"], warps_m="", warps_n="", warps_k="",
                   inst_m=64, inst_n=k["n"])
    row["Flops/Byte"] = f"{flops / nbytes:.2f}"
    row["GB/s"] = f"{nbytes / (ms * 1e-3) / 1e9:.1f}" if ms == ms else ""
    row["GFLOPs"] = f"{flops / (ms * 1e-3) / 1e9:.1f}" if ms == ms else ""
    return row
