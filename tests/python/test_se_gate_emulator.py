"""se_gate's CUDA kernel (kernels/se_gate/se_gate_device.cuh) on the CPU emulator
(tests/cuda_emulator): every launch shape the launcher may pick (1-8 images a CTA with a partial
last group, W2 staged or read from global memory, the maps cached in shared memory or not) and
the three modes (the whole gate, se_squeeze's, se_gate_apply's), against float64; cached and
uncached bitwise equal; two schedules of the fibers bitwise equal (a missing barrier shows);
nothing written past an output."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import _emulator
from _helpers import TOLERANCE, errors

emulator = pytest.mark.skipif(not _emulator.AVAILABLE, reason=_emulator.MISSING)
GUARD = 64


@pytest.fixture(scope="module")
def se_emulator(tmp_path_factory):
    return _emulator.build("se_gate_harness.cpp", tmp_path_factory.mktemp("se_emu") / "se_emu.so")


def inputs(n, c, hh, ww, r, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, std=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * std  # noqa: E731
    return dict(h=rnd(n, hh, ww, c).to(dtype), identity=rnd(n, hh, ww, c).to(dtype),  # NHWC
                w1=rnd(r, c, std=c ** -0.5).float(), b1=rnd(r).float(),
                w2=rnd(c, r, std=r ** -0.5).float(), b2=rnd(c).float(),
                idb=torch.tensor([0.3 * rnd(()).item()], dtype=torch.float32),
                pb=torch.tensor([0.3 * rnd(()).item()], dtype=torch.float32),
                hb=torch.tensor([0.3 * rnd(()).item()], dtype=torch.float32))


def guarded(n, dtype):
    buf = torch.full((n + GUARD,), float("nan"), dtype=dtype)
    buf[n:] = -777.0
    return buf


def run(lib, t, images, stage_w2, cache, mode="gate", avgpool=True, gate=None, seed=0):
    """The kernel in `mode` ("gate", "squeeze", "apply"): its outputs (NaN-poisoned, a guard
    after each), or the guards' failure."""
    n, hh, ww, c = t["h"].shape
    r = t["w1"].shape[0]
    dtype = t["h"].dtype
    ph, pw = (hh + 1) // 2, (ww + 1) // 2
    out = guarded(n * hh * ww * c, dtype)
    pooled = guarded(n * ph * pw * c, dtype) if avgpool and mode != "squeeze" else None
    means = guarded(n * c, dtype) if mode == "squeeze" else None
    ptr = lambda x: None if x is None else ctypes.c_void_p(x.data_ptr())  # noqa: E731
    excite = mode != "apply"
    rc = lib.emu_se_gate(int(dtype == torch.bfloat16), n, hh, ww, c, r, ptr(t["h"]),
                         ptr(t["identity"] if mode != "squeeze" else None),
                         ptr(out if mode != "squeeze" else None), ptr(pooled),
                         *(ptr(t[k] if excite else None) for k in ("w1", "b1", "w2", "b2")),
                         ptr(t["idb"]), ptr(t["pb"]), ptr(t["hb"]), ptr(means), ptr(gate),
                         images, int(stage_w2), int(cache), ctypes.c_uint(seed))
    assert rc == 0, "deadlock" if rc == 1 else f"rc {rc}"
    results = []
    for buf, size, shape in ((out, n * hh * ww * c, (n, hh, ww, c)), (pooled, n * ph * pw * c, (n, ph, pw, c)),
                             (means, n * c, (n, c))):
        if buf is None or (buf is out and mode == "squeeze"):
            continue
        assert bool((buf[size:] == -777.0).all()), "a write past an output"
        results.append(buf[:size].view(shape))
    return results


def reference(t, avgpool, gate=None):
    """float64: (out, pooled of the rounded out, means) in NHWC."""
    d = {k: v.double() for k, v in t.items()}
    h = d["h"] + d["hb"]
    means = h.mean((1, 2))
    if gate is None:
        gate = torch.sigmoid(F.linear(torch.relu(F.linear(means, d["w1"], d["b1"])), d["w2"], d["b2"]))
    out = torch.relu(h * gate.double()[:, None, None, :] + d["identity"] + d["idb"]) + d["pb"]
    pooled = None
    if avgpool:
        rounded = out.to(t["h"].dtype).double().permute(0, 3, 1, 2)
        pooled = F.avg_pool2d(rounded, 3, 2, 1, count_include_pad=True).permute(0, 2, 3, 1)
    return out, pooled, means


# (n, c, h, w, r, images per CTA, W2 staged): one image a CTA; a partial last group of 2 and
# of 4; 8 images with W2 read from global memory; R not a multiple of 4 (W2 staged element-wise).
SHAPES = [(3, 64, 5, 5, 4, 1, True), (5, 128, 3, 3, 8, 2, True), (7, 32, 2, 3, 2, 4, True),
          (10, 16, 1, 3, 4, 8, False), (3, 24, 4, 4, 3, 1, True)]


@emulator
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}c{}_{}x{}_r{}_img{}_w2{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gate_on_the_emulator(se_emulator, shape, dtype):
    n, c, hh, ww, r, images, stage_w2 = shape
    t = inputs(n, c, hh, ww, r, dtype, seed=c + hh)
    out_ref, pooled_ref, _ = reference(t, avgpool=True)
    rel_tol, max_tol = TOLERANCE[dtype]
    runs = {}
    for cache in (False, True):
        out, pooled = run(se_emulator, t, images, stage_w2, cache)
        for got, want in ((out, out_ref), (pooled, pooled_ref)):
            rel, mx = errors(got, want)
            assert rel <= rel_tol and mx <= max_tol, f"cache {cache}: rel {rel:.2e} max {mx:.2e}"
        runs[cache] = (out, pooled)
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True])), "cached maps changed the bits"
    shuffled = run(se_emulator, t, images, stage_w2, True, seed=7)  # warps drift between barriers
    assert all(torch.equal(a, b) for a, b in zip(runs[True], shuffled)), "schedule-dependent: a missing barrier"
    out_only = run(se_emulator, t, images, stage_w2, True, avgpool=False)
    assert len(out_only) == 1 and torch.equal(out_only[0], runs[True][0])


@emulator
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "n{}c{}_{}x{}_r{}_img{}_w2{}".format(*s))
def test_split_modes_on_the_emulator(se_emulator, shape):
    """se_squeeze's mode (the means, rounded) and se_gate_apply's (a given gate), cached or not."""
    n, c, hh, ww, r, images, _ = shape
    dtype = torch.float16
    t = inputs(n, c, hh, ww, r, dtype, seed=c)
    (means,) = run(se_emulator, t, images, False, False, mode="squeeze")
    _, _, means_ref = reference(t, avgpool=False)
    rel, mx = errors(means, means_ref)
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1]
    gate = (torch.rand(n, c, generator=torch.Generator().manual_seed(3)) + 0.1).to(dtype)
    out_ref, pooled_ref, _ = reference(t, avgpool=True, gate=gate)
    outs = [run(se_emulator, t, images, False, cache, mode="apply", gate=gate) for cache in (False, True)]
    for got, want in zip(outs[0], (out_ref, pooled_ref)):
        rel, mx = errors(got, want)
        assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1]
    assert all(torch.equal(a, b) for a, b in zip(*outs))
