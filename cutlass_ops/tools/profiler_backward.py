"""Profiler sweep of the dgrad/wgrad kernels (``profile --backward``): every built dgrad/wgrad
kernel (wgrad at several split-K slice counts) and cuDNN's dgrad/wgrad (Provider ``cudnn``) on
FusedResNet's training convs, appended to profiles/<gpu>/sm80.csv with conv_kind dgrad/wgrad;
the generator's rules then run, per problem, the fastest of them, cuDNN included.  Family-90
dgrad/wgrad kernels (a CUTLASS_OPS_SM90_BACKWARD=1 build, on sm90) are swept separately
(``family=90``: wgrad at several batch-slice counts, no cuDNN rows) into sm90.csv.  The CSV
columns, the problem list and the timing are the forward sweep's (profiler.py)."""
from __future__ import annotations

import csv
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .profiler import COLUMNS, _driver, _problem_key, _row, _time_ms
from .timing import environment


_BACKWARD_NAME = re.compile(
    r"cutlass_ops_conv2d_(?P<kind>dgrad|wgrad)_(?P<dtype>b?f16)_sm(?P<family>\d+)_(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)"
    r"_(?P<stages>\d+)s_(?P<wm>\d+)x(?P<wn>\d+)w_(?P<it>[oa])(?:_(?P<variant>unity|strided))?_align(?P<align>\d+)$")
# Family 90 (CUTLASS 3.x, built with CUTLASS_OPS_SM90_BACKWARD=1): tile, stages, cluster; dgrad is
# unity-stride only (_unity).
_BACKWARD_NAME90 = re.compile(
    r"cutlass_ops_conv2d_(?P<kind>dgrad|wgrad)_(?P<dtype>b?f16)_sm(?P<family>90)_(?P<m>\d+)x(?P<n>\d+)x(?P<k>\d+)"
    r"_(?P<stages>\d+|auto)s_(?P<cm>\d+)x(?P<cn>\d+)c(?:_(?P<variant>unity))?_align(?P<align>\d+)$")


def backward_families() -> list[int]:
    """The dgrad/wgrad kernel families in this build that this GPU runs (90 only on sm90 and
    only in a CUTLASS_OPS_SM90_BACKWARD=1 build), newest first."""
    cc = torch.cuda.get_device_capability()
    built = {int(m["family"]) for m in map(lambda n: _BACKWARD_NAME.match(n) or _BACKWARD_NAME90.match(n),
                                            torch.ops.cutlass_ops.conv2d_backward_kernels()) if m}
    runs = {90, 80} if cc == (9, 0) else {80} if cc >= (8, 0) else set()
    return sorted(built & runs, reverse=True)


class _Cudnn:
    """Stands in for a kernel-name match in cuDNN's rows."""
    string = "cudnn"

    def __init__(self, kind: str):
        self.kind = kind

    def groupdict(self) -> dict:
        return {"kind": self.kind, "m": 0, "n": 0, "k": 0, "stages": 0, "wm": 0, "wn": 0, "it": "o"}

    def __getitem__(self, key):
        return self.groupdict()[key]


def wgrad_split_candidates(p: dict, k, num_sms: int) -> list[int]:
    """Parallel split-K slices worth timing for wgrad: powers of two up to 128 that keep
    >= 8 K-iterations (of N*P*Q) per slice and launch between 1/2 and 8 CTAs per SM."""
    pq = [(d + 2 * p["pad"] - f) // p["stride"] + 1 for d, f in ((p["h"], p["r"]), (p["w"], p["s"]))]
    tm, tn, tk = int(k["m"]), int(k["n"]), int(k["k"])
    tiles = -(-p["k"] // tm) * -(-p["c"] * p["r"] * p["s"] // tn)
    k_iterations = -(-p["n"] * pq[0] * pq[1] // tk)
    splits = [s for s in (1, 2, 4, 8, 16, 32, 64, 128)
              if k_iterations >= 8 * s and num_sms // 2 <= tiles * s <= 8 * num_sms]
    return splits or [1]


def sm90_wgrad_slice_candidates(p: dict, k, num_sms: int) -> list[int]:
    """Batch slices worth timing for a family-90 wgrad kernel (CUTLASS 4.2's sm90 conv cannot
    split K; the instance runs one conv per slice of whole images, concurrently): powers of two
    up to min(N, 64) that keep >= 16 K-iterations per slice and launch <= 4 CTAs per SM."""
    pq = [(d + 2 * p["pad"] - f) // p["stride"] + 1 for d, f in ((p["h"], p["r"]), (p["w"], p["s"]))]
    tm, tn, tk = int(k["m"]), int(k["n"]), int(k["k"])
    tiles = -(-p["k"] // tm) * -(-p["c"] * p["r"] * p["s"] // tn)
    k_iterations = -(-p["n"] * pq[0] * pq[1] // tk)
    splits = [s for s in (1, 2, 4, 8, 16, 32, 64)
              if s <= min(p["n"], 64) and k_iterations >= 16 * s and tiles * s <= 4 * num_sms]
    return splits or [1]


def _backward_done(path: Path) -> set:
    if not path.exists():
        return set()
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {(r["conv_kind"], r["Operation"], int(r.get("split_k_slices") or 1))
                + tuple(int(r[c]) for c in ("n", "h", "w", "c", "k", "r", "s", "pad_h", "stride_h"))
                for r in rows}


def sweep_backward(problems: list[dict], out: Path, dtype=torch.float16, iters: int = 20,
                   progress=lambda msg: print(msg, file=sys.stderr, flush=True), family: int = 80) -> int:
    """Measures every built dgrad/wgrad kernel of `dtype` and `family` on each problem, and with
    family 80 cuDNN's too (family 90's rules compete with sm80.csv's, cuDNN's included, by
    their times); appends rows (conv_kind dgrad/wgrad) to `out`; returns rows written."""
    from ..ops import conv2d_dgrad, conv2d_wgrad
    dname = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    name = _BACKWARD_NAME90 if family == 90 else _BACKWARD_NAME
    kernels = [m for m in map(name.match, torch.ops.cutlass_ops.conv2d_backward_kernels())
               if m and m["dtype"] == dname and int(m["family"]) == family]
    if not kernels:
        raise RuntimeError(f"no {dname} family-{family} dgrad/wgrad kernels in this build")
    done = _backward_done(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not out.exists()
    env = environment()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    jobs = []
    for p in problems:
        if p["c"] % 8 or p["k"] % 8:
            continue
        for kind in ("dgrad", "wgrad"):
            cudnn = [_Cudnn(kind)] if family == 80 else []
            for k in [m for m in kernels if m["kind"] == kind] + cudnn:
                # family 90's dgrad is unity-stride only; family 80 has strided kernels too
                if kind == "dgrad" and k.string != "cudnn" and p["stride"] > 1 and k["variant"] != "strided":
                    continue
                if kind == "wgrad" and k.string != "cudnn":
                    splits = (sm90_wgrad_slice_candidates if family == 90 else wgrad_split_candidates)(p, k, sms)
                else:
                    splits = [1]
                jobs += [(p, kind, k, split) for split in splits
                         if (kind, k.string, split) + _problem_key(p) not in done]
    progress(f"profile --backward: {len(jobs)} measurements ({len(problems)} problems, {len(kernels)} family-{family} "
             f"kernels{' + cuDNN' if family == 80 else ''}, {len(done)} already in {out})")
    written, start = 0, time.time()
    with open(out, "a", newline="") as f:
        if new_file:
            f.write(f"# cutlass_ops profile: {env.get('gpu')} (sm{env.get('sm')}), kernel family sm{family}, "
                    f"driver {_driver()}, CUDA {env['cuda']}, torch {env['torch']}, cuDNN {env.get('cudnn')}, "
                    f"{env['time']}\n")
        writer = csv.DictWriter(f, COLUMNS)
        if new_file:
            writer.writeheader()
        cache = {}
        for i, (p, kind, k, split) in enumerate(jobs, 1):
            key = _problem_key(p)
            if key not in cache:
                cache = {key: _backward_inputs(p, dtype)}
            x, w, dy, scale, ref_dx, ref_dw = cache[key]
            st, pad = p["stride"], p["pad"]
            # Both at the op level (cuDNN forced by name): the op's own passes count for both,
            # wgrad's epilogue over its split-K slices among them.
            if kind == "dgrad":
                fn = lambda: conv2d_dgrad(dy, w, x.shape, st, pad, scale)
            else:
                fn = lambda: conv2d_wgrad(dy, x, w, st, pad, scale)[0]
            torch.ops.cutlass_ops.conv2d_backward_force_kernel(k.string, split)
            try:
                got = fn()
                ref = ref_dx if kind == "dgrad" else ref_dw
                err = ((got.float() - ref).norm() / ref.norm()).item()
                ok = err < (5e-3 if dtype == torch.float16 else 3e-2)
                ms = _time_ms(fn, iters) if ok else float("nan")
                row = _row(len(done) + i, p, k, dname, family if k.string != "cudnn" else 80, split, ms,
                           "passed" if ok else "incorrect")
                row.update(conv_kind=kind, split_k_mode="parallel" if split > 1 else "serial",
                           Provider="cudnn" if k.string == "cudnn" else "cutlass_ops")
                writer.writerow(row)
                written += 1
            except (ValueError, RuntimeError) as e:
                progress(f"  skip {kind} {k.string} split_k={split}: {str(e).splitlines()[0][:120]}")
            finally:
                torch.ops.cutlass_ops.conv2d_backward_force_kernel("")
            if i % 20 == 0 or i == len(jobs):
                f.flush()
                eta = (time.time() - start) / i * (len(jobs) - i)
                progress(f"  [{i}/{len(jobs)}] n={p['n']} {p['c']}->{p['k']} {p['h']}x{p['w']} "
                         f"{p['r']}x{p['s']}/{p['stride']} {kind} {k.string[20:]} split_k={split}  eta {eta:.0f} s")
    return written


def _backward_inputs(p: dict, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(p["n"], p["c"], p["h"], p["w"], device="cuda", dtype=dtype, generator=g).contiguous(memory_format=cl)
    w = torch.randn(p["k"], p["c"], p["r"], p["s"], device="cuda", dtype=dtype, generator=g)
    w = (w / (p["c"] * p["r"] * p["s"]) ** 0.5).contiguous(memory_format=cl)
    y = F.conv2d(x, w, stride=p["stride"], padding=p["pad"])
    dy = torch.randn(y.shape, device="cuda", dtype=dtype, generator=g).contiguous(memory_format=cl)
    scale = torch.tensor(0.5, device="cuda")  # the FixUp scale conv2's gradients carry
    ref_dx, ref_dw, _ = torch.ops.aten.convolution_backward(
        dy.float(), x.float(), w.float(), None, [p["stride"]] * 2, [p["pad"]] * 2, [1, 1], False, [0, 0], 1,
        [True, True, False])
    return x, w, dy, scale, ref_dx * 0.5, ref_dw * 0.5
