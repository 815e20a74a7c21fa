"""bench cvt-ops on the CPU (tiny sizes, a wall-clock timer): it covers every stage, part and
pass for both systems, and each of FusedCvT's parts computes what the reference's does (so the
per-op table compares like with like)."""
import time

import torch

from cutlass_ops.fused_cvt import FusedCvT
from cutlass_ops.models.cvt import cvt13
from cutlass_ops.tools.cvt_ops_bench import PARTS, _fused_parts, _inputs, _reference_parts, bench_cvt_ops
from _seeds import seeded


def _wall(fn, calls, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e3 / calls)
    return out


def test_every_stage_part_and_pass_timed_on_the_cpu():
    result = bench_cvt_ops(n=2, size=64, dtype=torch.float32, device="cpu", calls=1, reps=1, timer=_wall,
                           progress=lambda m: None)
    rows = result["rows"]
    assert len(rows) == 3 * len(PARTS) * 2
    assert {(r["stage"], r["part"], r["pass"]) for r in rows} == {
        (s, p, q) for s in (1, 2, 3) for p in PARTS for q in ("forward", "forward+backward")}
    assert all(r[label]["throughput_ms"] > 0 for r in rows for label in ("FusedCvT", "reference"))


def test_fused_parts_compute_the_reference_parts():
    with seeded(0):
        ref = cvt13().double().eval()
        for m in ref.modules():  # non-trivial BatchNorm statistics, so that the eval fold matters
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    fused = FusedCvT.from_reference(ref).eval()
    g = torch.Generator().manual_seed(1)
    for si in range(3):
        inputs, h, w = _inputs(ref, si, 2, 64, torch.float64, "cpu", g)
        rs, fs = list(ref.stages())[si], list(fused.stages())[si]
        rp, fp = _reference_parts(ref, rs, rs.blocks[0], h, w), _fused_parts(fused, fs, fs.blocks[0], h, w)
        with torch.no_grad():
            for part in PARTS:
                args = inputs[part]
                want, got = rp[part](*args), fp[part](*(
                    (args[0].contiguous(memory_format=torch.channels_last),) if part == "embedding" else args))
                if part == "embedding":  # the reference returns the NCHW map, FusedCvT the tokens
                    want = want.flatten(2).transpose(1, 2)
                for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                    assert a.shape == b.shape, (si, part, a.shape, b.shape)
                    assert ((a - b).norm() / b.norm()).item() < 1e-12, (si, part)
