"""cutlass_ops.se_gate (squeeze-excitation gate + residual + ReLU [+ avgpool]) vs float64."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, fallback_where

LOW_PRECISION = [torch.float16, torch.bfloat16]


def make(n, c, h, w, dtype, device, g, r=16):
    rnd = lambda *s, std=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * std
    hidden = max(c // r, 1)
    t = dict(h=rnd(n, c, h, w).to(dtype), identity=rnd(n, c, h, w).to(dtype),
             w1=rnd(hidden, c, std=c ** -0.5).float(), b1=rnd(hidden).float(),
             w2=rnd(c, hidden, std=hidden ** -0.5).float(), b2=rnd(c).float(),
             idb=torch.tensor(0.3 * rnd(()).item()), pb=torch.tensor(0.3 * rnd(()).item()),
             hb=torch.tensor(0.3 * rnd(()).item()))
    out = {}
    for k, v in t.items():
        v = v.to(device)
        out[k] = v.contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v
    return out


def excite64(t, h_bias=True):
    """The float64 squeeze and excite: (means, gate)."""
    d = {k: v.double().cpu() for k, v in t.items()}
    h = d["h"] + d["hb"] if h_bias else d["h"]
    means = h.mean((2, 3))
    return means, torch.sigmoid(F.linear(torch.relu(F.linear(means, d["w1"], d["b1"])), d["w2"], d["b2"]))


def reference(t, avgpool, h_bias=True):
    d = {k: v.double().cpu() for k, v in t.items()}
    h = d["h"] + d["hb"] if h_bias else d["h"]
    _, gate = excite64(t, h_bias)
    out = torch.relu(h * gate[:, :, None, None] + d["identity"] + d["idb"]) + d["pb"]
    pooled = F.avg_pool2d(out, 3, 2, 1, count_include_pad=True) if avgpool else None
    return out, pooled


def run(t, avgpool, h_bias=True):
    return cutlass_ops.se_gate(t["h"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"],
                               t["idb"], t["pb"], avgpool=avgpool, h_bias=t["hb"] if h_bias else None)


# (n, c, h, w): the four SE-ResNet9 blocks, odd sizes, C not a power of two, C % 8 != 0.
SHAPES = [(4, 64, 16, 16), (3, 128, 8, 8), (5, 256, 4, 4), (7, 512, 2, 2), (2, 24, 7, 5),
          (3, 40, 9, 9), (2, 20, 5, 6),
          (1, 2048, 3, 3),  # W2 (2048 x 128) too big to stage in shared memory
          # Enough images that a GPU groups several per CTA, with a partial last group.
          (1061, 64, 3, 3), (1061, 512, 2, 2)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("shape", fallback_where(SHAPES, lambda s: s[1] % 8), ids=lambda s: "n{}c{}_{}x{}".format(*s))
@pytest.mark.parametrize("avgpool", [False, True])
@pytest.mark.parametrize("h_bias", [True, False])
def test_se_gate_numerics(device, dtype, shape, avgpool, h_bias, rng):
    t = make(*shape, dtype, device, rng, r=16 if shape[1] >= 64 else 4)
    if device == "cuda":
        torch.full((4 * t["h"].numel(),), float("nan"), dtype=dtype, device=device)  # poison
    got = run(t, avgpool, h_bias)
    out, pooled = got if avgpool else (got, None)
    ref_out, _ = reference(t, False, h_bias)
    rel_tol, max_tol = TOLERANCE[dtype]
    rel, mx = errors(out, ref_out)
    assert rel <= rel_tol and mx <= max_tol, f"out: rel {rel:.2e} max {mx:.2e}"
    assert out.is_contiguous(memory_format=torch.channels_last)
    if avgpool:
        # The kernel pools its own rounded output: compare with pooling that output.
        want = F.avg_pool2d(out.double().cpu(), 3, 2, 1, count_include_pad=True)
        rel, mx = errors(pooled, want)
        assert rel <= rel_tol and mx <= max_tol, f"pooled: rel {rel:.2e} max {mx:.2e}"
        assert pooled.shape == (shape[0], shape[1], (shape[2] + 1) // 2, (shape[3] + 1) // 2)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_se_gate_is_deterministic(rng):
    t = make(64, 64, 16, 16, torch.float16, "cuda", rng)
    first = run(t, True)
    for _ in range(3):
        again = run(t, True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.parametrize("device", DEVICES)
def test_se_gate_bad_input(device, rng):
    t = make(2, 64, 4, 4, torch.float16, device, rng)
    with pytest.raises(ValueError, match="identity shape"):
        cutlass_ops.se_gate(t["h"], t["identity"][:, :, :2], t["w1"], t["b1"], t["w2"], t["b2"])
    with pytest.raises(ValueError, match="fc1_weight must be"):
        cutlass_ops.se_gate(t["h"], t["identity"], t["w1"].t(), t["b1"], t["w2"], t["b2"])
    with pytest.raises(ValueError, match="fc2_bias must be"):
        cutlass_ops.se_gate(t["h"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"][:5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("avgpool", [False, True])
def test_se_gate_opcheck(device, avgpool, rng):
    t = make(2, 64, 4, 4, torch.float16, device, rng)
    torch.library.opcheck(torch.ops.cutlass_ops.se_gate.default,
                          (t["h"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"], t["idb"], t["pb"], avgpool,
                           t["hb"]))


@pytest.mark.parametrize("device", DEVICES)
def test_se_gate_unaligned_excite_weights(device, rng):
    # Weights sliced out of a larger buffer start off the 16-byte boundary the kernel's
    # vector loads need: the op copies them.
    t = make(3, 128, 4, 4, torch.float16, device, rng)
    for name in ("w1", "w2"):
        buf = torch.empty(t[name].numel() + 1, dtype=torch.float32, device=device)
        buf[1:] = t[name].flatten()
        t[name] = buf[1:].view(t[name].shape)
    rel, mx = errors(run(t, False), reference(t, False)[0])
    assert rel <= TOLERANCE[torch.float16][0] and mx <= TOLERANCE[torch.float16][1]


# ---- se_squeeze + se_gate_apply: the same gate split around a caller's excite MLP --------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("shape", fallback_where(SHAPES, lambda s: s[1] % 8), ids=lambda s: "n{}c{}_{}x{}".format(*s))
@pytest.mark.parametrize("h_bias", [True, False])
def test_se_squeeze_numerics(device, dtype, shape, h_bias, rng):
    t = make(*shape, dtype, device, rng)
    if device == "cuda":
        torch.full((4 * t["h"].numel(),), float("nan"), dtype=dtype, device=device)  # poison
    got = cutlass_ops.ops.se_squeeze(t["h"], t["hb"] if h_bias else None)
    want, _ = excite64(t, h_bias)
    assert got.shape == want.shape and got.dtype == dtype and got.device.type == device
    rel, mx = errors(got, want)
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"rel {rel:.2e} max {mx:.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("shape", fallback_where(SHAPES, lambda s: s[1] % 8), ids=lambda s: "n{}c{}_{}x{}".format(*s))
@pytest.mark.parametrize("avgpool", [False, True])
def test_se_gate_apply_matches_se_gate(device, dtype, shape, avgpool, rng):
    # squeeze -> the float64 excite (rounded to h's dtype) -> apply: se_gate's result.
    t = make(*shape, dtype, device, rng)
    _, gate = excite64(t)
    gate = gate.to(dtype).to(device)
    got = cutlass_ops.ops.se_gate_apply(t["h"], t["identity"], gate, t["idb"], t["pb"], avgpool=avgpool,
                                        h_bias=t["hb"])
    out, pooled = got if avgpool else (got, None)
    ref_out, _ = reference(t, False)
    rel, mx = errors(out, ref_out)
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"out: rel {rel:.2e} max {mx:.2e}"
    assert out.is_contiguous(memory_format=torch.channels_last)
    if avgpool:
        want = F.avg_pool2d(out.double().cpu(), 3, 2, 1, count_include_pad=True)
        rel, mx = errors(pooled, want)
        assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"pooled: rel {rel:.2e} max {mx:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_se_split_bad_input(device, rng):
    t = make(2, 64, 4, 4, torch.float16, device, rng)
    gate = torch.rand(2, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="h must be 4-D"):
        cutlass_ops.ops.se_squeeze(t["h"][0])
    with pytest.raises(ValueError, match=r"gate must be \(N, C\)"):
        cutlass_ops.ops.se_gate_apply(t["h"], t["identity"], gate[:, :32])
    with pytest.raises(ValueError, match="identity shape"):
        cutlass_ops.ops.se_gate_apply(t["h"], t["identity"][:1], gate)


@pytest.mark.parametrize("device", DEVICES)
def test_se_split_opcheck(device, rng):
    t = make(3, 64, 5, 5, torch.float16, device, rng)
    gate = torch.rand(3, 64, dtype=torch.float16, device=device) + 0.1
    torch.library.opcheck(torch.ops.cutlass_ops.se_squeeze.default, (t["h"], t["hb"]))
    for avgpool in (False, True):
        torch.library.opcheck(torch.ops.cutlass_ops.se_gate_apply.default,
                              (t["h"], t["identity"], gate, t["idb"], t["pb"], avgpool, t["hb"]))


def test_se_split_gradcheck(rng):
    # float64 on the CPU: the composites' backward, through both ops and a torch excite.
    t = make(2, 8, 3, 3, torch.float64, "cpu", rng, r=4)
    args = [t[k].double().clone().requires_grad_() for k in ("h", "identity", "w1", "b1", "w2", "b2", "idb", "pb", "hb")]

    def split(h, identity, w1, b1, w2, b2, idb, pb, hb):
        s = cutlass_ops.ops.se_squeeze(h, hb)
        gate = torch.sigmoid(F.linear(torch.relu(F.linear(s, w1, b1)), w2, b2))
        return cutlass_ops.ops.se_gate_apply(h, identity, gate, idb, pb, avgpool=True, h_bias=hb)

    assert torch.autograd.gradcheck(split, args)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("shape", fallback_where(SHAPES + [(2048, 64, 16, 16), (2048, 512, 2, 2)], lambda s: s[1] % 8),
                         ids=lambda s: "n{}c{}_{}x{}".format(*s))
def test_se_gate_cached_maps_match_uncached(shape, monkeypatch, rng):
    # The kernel with the CTA's h and identity in shared memory (CUTLASS_OPS_SE_CACHE=1:
    # wherever two CTAs still fit an SM; by default only where h outgrows half of L2, as
    # (2048, 64, 16, 16) does) computes exactly what it computes from global memory: same bits.
    t = make(*shape, torch.float16, "cuda", rng)
    gate = torch.rand(shape[0], shape[1], dtype=torch.float16, device="cuda") + 0.1
    results = []
    for cache in ("1", "0"):
        monkeypatch.setenv("CUTLASS_OPS_SE_CACHE", cache)
        torch.full((4 * t["h"].numel(),), float("nan"), dtype=torch.float16, device="cuda")  # poison
        results.append(run(t, True) + cutlass_ops.ops.se_gate_apply(t["h"], t["identity"], gate, t["idb"], t["pb"],
                                                                     avgpool=True, h_bias=t["hb"]))
    for cached, uncached in zip(*results):
        assert torch.equal(cached, uncached)
