"""Shape fuzz: random cases per public op against a float64 reference.

Random N, H, W, C, K, kernel size, stride, padding, dtype (fp16/bf16/fp32), memory layout
(NCHW, channels_last, a strided view, an offset into a larger storage: a misaligned data
pointer), empty batches, and NaN/Inf in a few inputs.  Seeded and reproducible:

    CUTLASS_OPS_FUZZ_SEED   the seed (default: the test's seed, from its test id as every
                            test's is -- conftest.py; printed)
    CUTLASS_OPS_FUZZ_CASES  cases per op (default 1000 on CUDA, 50 on the CPU)

Each case is drawn from random.Random(f"{seed}:{op}:{device}:{index}"), so one case can be
rerun alone; a failure prints a snippet that does that.

Bounds: the op's error against float64 (max |out - ref| / max |ref| over finite elements)
must be at most 2x PyTorch's own error for the same computation in the same dtype, plus a
few units of the dtype's rounding: the op may be no less accurate than PyTorch.  Ops whose
results are float32 sums (the weight gradients) are held to float32 bounds.  NaN/Inf: where
float64 has a NaN, so must the op; an Inf must stay the same Inf (or be NaN where PyTorch's
own result is NaN); a finite reference must give a finite result unless PyTorch's own result
is not finite there either.  A shape no kernel covers takes the ATen path (its one-time
warning is allowed) and is held to the same bounds.
"""
from __future__ import annotations

import copy
import math
import os
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from cutlass_ops import ops
from _helpers import DEVICES, HAS_CUDA

# None: each test's own seed (the rng_seed fixture: a hash of the test id)
SEED = int(os.environ["CUTLASS_OPS_FUZZ_SEED"]) if os.environ.get("CUTLASS_OPS_FUZZ_SEED") else None
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# A few units of the dtype's rounding (relative to max |ref|): the output's own rounding.
UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
LAYOUTS = ["nchw", "channels_last", "strided", "offset"]


def num_cases(device: str) -> int:
    env = os.environ.get("CUTLASS_OPS_FUZZ_CASES")
    if env:
        return int(env)
    return 1000 if device == "cuda" else 50


# ---- tensors -------------------------------------------------------------------------------

def make(shape, dtype, device, layout, g: torch.Generator, scale=1.0, special=0, r=None):
    """A random tensor of `shape` in `layout`; `special` NaN/Inf values at random places."""
    shape = tuple(shape)
    vals = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if special and vals.numel():
        flat = vals.view(-1)
        for _ in range(special):
            i = int(torch.randint(flat.numel(), (1,), generator=g))
            flat[i] = [float("nan"), float("inf"), float("-inf")][int(torch.randint(3, (1,), generator=g))]
    vals = vals.to(dtype)
    if layout == "channels_last" and len(shape) == 4:
        return vals.to(device).contiguous(memory_format=torch.channels_last)
    if layout == "strided" and len(shape) >= 1:
        big = torch.zeros(shape[:-1] + (2 * shape[-1] + 1,), dtype=dtype)
        big[..., 1::2] = vals
        return big.to(device)[..., 1::2]
    if layout == "offset":  # a contiguous view 1-7 elements into a larger storage
        off = 1 + int(torch.randint(7, (1,), generator=g))
        storage = torch.zeros(vals.numel() + off, dtype=dtype)
        storage[off:] = vals.reshape(-1)
        return storage.to(device)[off:].view(shape)
    return vals.to(device)


def d64(t):
    return None if t is None else t.detach().double().cpu()


def _finite_err(out, ref):
    both = torch.isfinite(out) & torch.isfinite(ref)
    if not both.any():
        return 0.0
    denom = ref[torch.isfinite(ref)].abs().max().clamp_min(1e-30)
    return ((out - ref)[both].abs().max() / denom).item()


def compare(what, out, ref, own, dtype, slack=1.0, alt=None):
    """out (the op), ref (float64), own (PyTorch in the same dtype, or None: float32-sum
    bounds), all on the CPU in float64.  Returns a failure message or None."""
    out, ref = d64(out), d64(ref)
    if tuple(out.shape) != tuple(ref.shape):
        return f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if out.numel() == 0:
        return None
    own = d64(own) if own is not None else None
    # NaN/Inf: each element of the output has the class (NaN, +Inf, -Inf, finite) of the
    # float64 reference or of PyTorch's own result there (algorithms differ at the edges:
    # e.g. ATen's float64 wgrad multiplies an Inf by explicit zero padding, giving NaN).
    def cls(t):
        return torch.where(torch.isnan(t), 0, torch.where(t == math.inf, 1, torch.where(t == -math.inf, 2, 3)))
    ok = cls(out) == cls(ref)
    if own is not None:
        ok |= cls(out) == cls(own)
    if alt is not None:  # PyTorch in float32, as the ops' CPU paths compute 16-bit inputs
        ok |= cls(out) == cls(d64(alt))
    if not ok.all():
        i = tuple((~ok).nonzero()[0].tolist())
        theirs = f", PyTorch's own {own[i].item()}" if own is not None else ""
        return f"{what}: at {i} the output is {out[i].item()}, float64 gives {ref[i].item()}{theirs}"
    err = _finite_err(out, ref)
    own_err = _finite_err(own, ref) if own is not None else 0.0
    bound = 2 * own_err + slack * (4 * UNIT[dtype] + 1e-6)
    if err > bound:
        return f"{what}: error {err:.3e} > bound {bound:.3e} (PyTorch's own in {dtype}: {own_err:.3e})"
    return None


def _own(fn, dtype, device, *tensors):
    """PyTorch's own computation in `dtype` on `device`; float32 rounded to dtype where ATen
    has no such kernel (e.g. some 16-bit CPU convs)."""
    try:
        return fn(*[t if t is None else t.to(dtype) for t in tensors])
    except (RuntimeError, NotImplementedError):
        out = fn(*[t if t is None else t.float() for t in tensors])
        return tuple(o.to(dtype) for o in out) if isinstance(out, tuple) else out.to(dtype)


def _dims(rng: random.Random, mult8: float = 0.6, hi: int = 40):
    """A channel count: a multiple of 8 (the kernels' fast path) or anything."""
    return 8 * rng.randint(1, hi // 8) if rng.random() < mult8 else rng.randint(1, hi)


def _batch(rng):
    return 0 if rng.random() < 0.05 else rng.randint(1, 5)


def _special(rng):
    return rng.randint(1, 3) if rng.random() < 0.15 else 0


def _dtype(rng):
    return DTYPES[rng.randrange(3)]


# ---- ops: draw a case (plain values, printable), run it, return failures -------------------

def draw_conv2d_fused(rng):
    r, s = rng.choice([(1, 1), (3, 3), (5, 5), (1, 3), (3, 1), (2, 2)])
    stride, pad = rng.randint(1, 3), rng.randint(0, 2)
    h, w = rng.randint(max(1, r - 2 * pad), 20), rng.randint(max(1, s - 2 * pad), 20)
    return dict(n=_batch(rng), c=_dims(rng), k=_dims(rng), h=h, w=w, r=r, s=s, stride=stride, pad=pad,
                dtype=str(_dtype(rng))[6:], bias=rng.choice(["vec", "scalar", None]), residual=rng.random() < 0.5,
                scale=rng.random() < 0.5, post_bias=rng.random() < 0.5, relu=rng.random() < 0.5,
                x_layout=rng.choice(LAYOUTS), w_layout=rng.choice(LAYOUTS), r_layout=rng.choice(LAYOUTS),
                special=_special(rng), seed=rng.randrange(2**31))


def run_conv2d_fused(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, k, stride, pad = c["n"], c["k"], c["stride"], c["pad"]
    p = (c["h"] + 2 * pad - c["r"]) // stride + 1
    q = (c["w"] + 2 * pad - c["s"]) // stride + 1
    x = make((n, c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g, special=c["special"])
    wt = make((k, c["c"], c["r"], c["s"]), dtype, device, c["w_layout"], g, scale=(c["c"] * c["r"] * c["s"]) ** -0.5)
    bias = {"vec": make((k,), torch.float32, device, "nchw", g), "scalar": make((), torch.float32, device, "nchw", g),
            None: None}[c["bias"]]
    res = make((n, k, p, q), dtype, device, c["r_layout"], g) if c["residual"] else None
    scale = (torch.rand((), generator=g) + 0.5).to(device) if c["scale"] else None
    post = make((), torch.float32, device, "nchw", g) if c["post_bias"] else None
    out = cutlass_ops.conv2d_fused(x, wt, bias, res, stride, pad, scale, post, c["relu"])

    def formula(x_, w_, b_, r_, s_, pb_):
        y = F.conv2d(x_, w_, None, stride, pad)
        if s_ is not None:
            y = y * s_.to(y.dtype)
        if b_ is not None:
            y = y + (b_.to(y.dtype).view(1, -1, 1, 1) if b_.dim() == 1 else b_.to(y.dtype))
        if r_ is not None:
            y = y + r_.to(y.dtype)
        if c["relu"]:
            y = torch.relu(y)
        return y + pb_.to(y.dtype) if pb_ is not None else y
    ref = formula(d64(x), d64(wt), d64(bias), d64(res), d64(scale), d64(post))
    own = _own(lambda *t: formula(*t[:2], bias, t[2], scale, post), dtype, device, x, wt, res)
    alt = formula(*[t if t is None else t.float() for t in (x, wt, bias, res, scale, post)]) if device == "cpu" else None
    fail = compare("out", out, ref, own, dtype, alt=alt)
    if out.dtype != dtype or not out.is_contiguous(memory_format=torch.channels_last):
        fail = fail or f"out: dtype {out.dtype} / not channels_last"
    return fail


# The (K0, K1) pairs the default build has B2B instances for (python/cutlass_ops_gen/b2b.py):
# drawn often, so that the fused kernels run; other pairs take the ATen composite.
B2B_PAIRS = [(32, 64), (64, 64), (64, 128), (64, 256)]


def draw_conv2d_b2b(rng):
    r = rng.choice([1, 3, 3, 5])
    stride, pad = rng.randint(1, 2), rng.randint(0, r // 2 + 1)
    h, w = rng.randint(max(1, r - 2 * pad), 18), rng.randint(max(1, r - 2 * pad), 18)
    k0, k1 = rng.choice(B2B_PAIRS) if rng.random() < 0.7 else (_dims(rng, hi=72), _dims(rng, hi=72))
    return dict(n=_batch(rng), c=_dims(rng, mult8=0.8), k0=k0, k1=k1, h=h, w=w, r=r, stride=stride, pad=pad,
                dtype=str(_dtype(rng))[6:], bias=rng.random() < 0.8, relu0=rng.random() < 0.85,
                relu1=rng.random() < 0.85, x_layout=rng.choice(LAYOUTS), w_layout=rng.choice(LAYOUTS),
                special=_special(rng), seed=rng.randrange(2**31))


def run_conv2d_b2b(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, k0, k1, r, stride, pad = c["n"], c["k0"], c["k1"], c["r"], c["stride"], c["pad"]
    x = make((n, c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g, special=c["special"])
    w0 = make((k0, c["c"], r, r), dtype, device, c["w_layout"], g, scale=(c["c"] * r * r) ** -0.5)
    w1 = make((k1, k0, 1, 1), dtype, device, c["w_layout"], g, scale=k0 ** -0.5)
    b0 = make((k0,), dtype, device, "nchw", g, scale=0.5) if c["bias"] else None
    b1 = make((k1,), dtype, device, "nchw", g, scale=0.5) if c["bias"] else None
    out = cutlass_ops.conv2d_b2b(x, w0, b0, w1, b1, stride, pad, c["relu0"], c["relu1"])

    def formula(x_, w0_, b0_, w1_, b1_):
        y = F.conv2d(x_, w0_, b0_, stride, pad)
        y = torch.relu(y) if c["relu0"] else y
        y = F.conv2d(y, w1_, b1_)
        return torch.relu(y) if c["relu1"] else y
    ref = formula(d64(x), d64(w0), d64(b0), d64(w1), d64(b1))
    own = _own(formula, dtype, device, x, w0, b0, w1, b1)
    alt = formula(*[t if t is None else t.float() for t in (x, w0, b0, w1, b1)]) if device == "cpu" else None
    # slack 2: the first conv's output is rounded to the dtype before the second (as PyTorch's own
    # run rounds it), which PyTorch's own error covers only up to the 2x
    fail = compare("out", out, ref, own, dtype, slack=2.0, alt=alt)
    if out.dtype != dtype or not out.is_contiguous(memory_format=torch.channels_last):
        fail = fail or f"out: dtype {out.dtype} / not channels_last"
    return fail


def draw_conv_backward(rng):
    d = draw_conv2d_fused(rng)
    return {key: d[key] for key in ("n", "c", "k", "h", "w", "r", "s", "stride", "pad", "dtype", "scale",
                                    "x_layout", "w_layout", "r_layout", "special", "seed")}


def _backward_operands(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, k, stride, pad = c["n"], c["k"], c["stride"], c["pad"]
    p = (c["h"] + 2 * pad - c["r"]) // stride + 1
    q = (c["w"] + 2 * pad - c["s"]) // stride + 1
    x = make((n, c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g)
    wt = make((k, c["c"], c["r"], c["s"]), dtype, device, c["w_layout"], g, scale=(c["c"] * c["r"] * c["s"]) ** -0.5)
    dy = make((n, k, p, q), dtype, device, c["r_layout"], g, special=c["special"])
    scale = (torch.rand((), generator=g) + 0.5).to(device) if c["scale"] else None
    return dtype, x, wt, dy, scale


def run_conv2d_dgrad(c, device):
    dtype, x, wt, dy, scale = _backward_operands(c, device)
    got = cutlass_ops.conv2d_dgrad(dy, wt, x.shape, c["stride"], c["pad"], scale)
    s64 = d64(scale) if scale is not None else 1.0
    ref = conv2d_input(x.shape, d64(wt) * s64, d64(dy), c["stride"], c["pad"])
    own = _own(lambda w_, dy_: conv2d_input(x.shape, w_ * (scale.to(w_.dtype) if scale is not None else 1), dy_,
                                            c["stride"], c["pad"]), dtype, device, wt, dy)
    alt = conv2d_input(x.shape, wt.float() * (scale.float() if scale is not None else 1), dy.float(), c["stride"],
                       c["pad"]) if device == "cpu" else None
    return compare("dx", got, ref, own, dtype, alt=alt)


def run_conv2d_wgrad(c, device):
    dtype, x, wt, dy, scale = _backward_operands(c, device)
    dw, ds = cutlass_ops.conv2d_wgrad(dy, x, wt, c["stride"], c["pad"], scale)
    s64 = d64(scale) if scale is not None else 1.0
    g = conv2d_weight(d64(x), wt.shape, d64(dy), c["stride"], c["pad"])
    own_g = _own(lambda x_, dy_: conv2d_weight(x_, wt.shape, dy_, c["stride"], c["pad"]), dtype, device, x, dy)
    alt = conv2d_weight(x.float(), wt.shape, dy.float(), c["stride"], c["pad"]).double() * s64 if device == "cpu" else None
    fail = compare("grad_weight", dw, g * s64, own_g.double().cpu() * s64, dtype, alt=alt)
    if fail:
        return fail
    # d scale = <w, G>, which may cancel: its error relative to sum |w * G|.
    want = (d64(wt) * g).sum()
    if not torch.isfinite(want):  # NaN/Inf placement: checked on grad_weight above
        return None
    mag = (d64(wt) * g).abs().sum().clamp_min(1e-30)
    err = (ds.double().cpu() - want).abs() / mag
    own_err = ((d64(wt) * own_g.double().cpu()).sum() - want).abs() / mag
    if not torch.isfinite(own_err):  # torch 2.11.0's CPU bf16 G held NaN (fuzz seed 22, case 563; 2.14.1 not)
        own_err = torch.zeros((), dtype=torch.float64)
    bound = 2 * own_err + 4 * UNIT[dtype] + 1e-5
    return None if err <= bound else f"grad_scale: error {err.item():.3e} > {bound.item():.3e}"


def draw_se_gate(rng):
    c = 8 * rng.randint(1, 32) if rng.random() < 0.8 else rng.randint(1, 40)
    return dict(n=_batch(rng), c=c, h=rng.randint(1, 9), w=rng.randint(1, 9), r=rng.choice([2, 4, 16]),
                dtype=str(_dtype(rng))[6:], avgpool=rng.random() < 0.5, idb=rng.random() < 0.5,
                pb=rng.random() < 0.5, hb=rng.random() < 0.5, h_layout=rng.choice(LAYOUTS),
                i_layout=rng.choice(LAYOUTS), special=_special(rng), seed=rng.randrange(2**31))


def _se_operands(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, ch, hid = c["n"], c["c"], max(c["c"] // c["r"], 1)
    h = make((n, ch, c["h"], c["w"]), dtype, device, c["h_layout"], g, special=c["special"])
    idn = make((n, ch, c["h"], c["w"]), dtype, device, c["i_layout"], g)
    params = [make((hid, ch), torch.float32, device, "nchw", g, scale=ch ** -0.5), make((hid,), torch.float32, device, "nchw", g),
              make((ch, hid), torch.float32, device, "nchw", g, scale=hid ** -0.5), make((ch,), torch.float32, device, "nchw", g)]
    scalars = [make((), torch.float32, device, "nchw", g, scale=0.3) if c[key] else None for key in ("idb", "pb", "hb")]
    return dtype, h, idn, params, scalars


def _se_formula(h, idn, w1, b1, w2, b2, idb, pb, hb, avgpool):
    hh = h + hb.to(h.dtype) if hb is not None else h
    gate = torch.sigmoid(F.linear(torch.relu(F.linear(hh.mean((2, 3)), w1.to(h.dtype), b1.to(h.dtype))),
                                  w2.to(h.dtype), b2.to(h.dtype)))
    y = hh * gate[:, :, None, None] + idn
    if idb is not None:
        y = y + idb.to(y.dtype)
    y = torch.relu(y)
    if pb is not None:
        y = y + pb.to(y.dtype)
    return (y, F.avg_pool2d(y, 3, 2, 1, count_include_pad=True)) if avgpool else (y, None)


def run_se_gate(c, device):
    dtype, h, idn, params, (idb, pb, hb) = _se_operands(c, device)
    got = cutlass_ops.se_gate(h, idn, *params, idb, pb, avgpool=c["avgpool"], h_bias=hb)
    out, pooled = got if c["avgpool"] else (got, None)
    ref, _ = _se_formula(*map(d64, (h, idn, *params, idb, pb, hb)), False)
    own, _ = _own(lambda h_, i_: _se_formula(h_, i_, *params, idb, pb, hb, False), dtype, device, h, idn)
    fail = compare("out", out, ref, own, dtype)
    if fail or not c["avgpool"]:
        return fail
    # The op pools its own (rounded) output, as FusedResNet's next AvgPool2d would.
    want = F.avg_pool2d(d64(out), 3, 2, 1, count_include_pad=True)
    return compare("pooled", pooled, want, F.avg_pool2d(out.float(), 3, 2, 1, count_include_pad=True).to(dtype), dtype)


def draw_se_gate_backward(rng):
    d = draw_se_gate(rng)
    d["special"] = 0  # the mask and the excite MLP's kink make NaN placement op-specific
    return d


def run_se_gate_backward(c, device):
    from test_backward_kernels import _se_gate_backward_reference
    dtype, h, idn, params, (idb, pb, hb) = _se_operands(c, device)
    if h.numel() and hb is not None:  # keep fc1's pre-activations off ReLU's kink (see test_backward_kernels)
        pre1 = F.linear(d64(h).mean((2, 3)) + d64(hb), d64(params[0]), d64(params[1]))
        if pre1.abs().min() < 1e-5:
            return None
    got_fwd = cutlass_ops.se_gate(h, idn, *params, idb, pb, avgpool=c["avgpool"], h_bias=hb)
    out = got_fwd[0] if c["avgpool"] else got_fwd
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grad_out = make(h.shape, dtype, device, c["i_layout"], g)
    n, ch, hh, ww = h.shape
    grad_pooled = make((n, ch, (hh + 1) // 2, (ww + 1) // 2), dtype, device, "channels_last", g) if c["avgpool"] else None
    got = ops.se_gate_backward(grad_out, grad_pooled, h, out, *params, pb, hb)
    want, g_scale = _se_gate_backward_reference(grad_out, grad_pooled, h, out, params, pb, hb)
    names = ["grad_h", "grad_identity", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "identity_bias",
             "post_bias", "h_bias"]
    for i, (name, gt, wt) in enumerate(zip(names, got, want)):
        if i < 2:  # maps rounded to dtype
            fail = compare(name, gt, wt, None, dtype, slack=2.0)
        elif i < 6:  # float32 sums of 16-bit products
            fail = compare(name, gt, wt, None, torch.float32, slack=2e3)
        else:  # scalar sums: relative to sum |g|
            bound = 1e-5 if i < 8 else 4 * UNIT[dtype] + 1e-5
            err = abs(gt.item() - wt.item()) / max(g_scale.item(), 1e-30)
            fail = None if err <= bound else f"{name}: error {err:.3e} > {bound:.3e}"
        if fail:
            return fail
    return None


def draw_relu_backward(rng):
    rank = rng.randint(1, 4)
    shape = [0 if rng.random() < 0.05 else rng.randint(1, 9) for _ in range(rank)]
    return dict(shape=shape, dtype=str(_dtype(rng))[6:], pb=rng.random() < 0.5, g_layout=rng.choice(LAYOUTS),
                o_layout=rng.choice(LAYOUTS), special=_special(rng), seed=rng.randrange(2**31))


def run_relu_backward(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    grad = make(c["shape"], dtype, device, c["g_layout"], g, special=c["special"])
    out = make(c["shape"], dtype, device, c["o_layout"], g, special=c["special"])
    pb = make((), torch.float32, device, "nchw", g) if c["pb"] else None
    if pb is not None and out.numel():  # some inactive elements: exactly post_bias rounded
        out = torch.where(torch.rand(out.shape, generator=g).to(device) < 0.4, pb.to(dtype), out)
    else:
        out = torch.relu(out)
    grad_z, sums = ops.relu_backward(grad, out, pb)
    o = d64(out)
    active = o != d64(pb.to(dtype)) if pb is not None else o > 0
    want = torch.where(active, d64(grad), torch.zeros((), dtype=torch.float64))
    got = d64(grad_z)
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    if got.shape != want.shape or not same.all():
        return "grad_z: not exactly where(out active, grad, 0)"
    return _check_fixup_sums(sums, grad, want.sum())


def _check_fixup_sums(sums, grad, masked_total):
    """The two FixUp sums a backward kernel returns (sum of grad, sum of the masked gradient)
    against float64: NaN/Inf where the reference has them, else within 1e-5 of sum |grad|."""
    want = torch.stack([d64(grad).sum(), masked_total])
    mag = d64(grad).abs().sum().clamp_min(1e-30)
    for i in range(2):
        a, b = sums[i].double().cpu(), want[i]
        if not torch.isfinite(b):
            if not (torch.isnan(a) or a == b):
                return f"sums[{i}]: {a.item()} where the reference is {b.item()}"
        elif (a - b).abs() / mag > 1e-5:
            return f"sums[{i}]: {a.item()} vs {b.item()}"
    return None


def draw_space_to_depth_conv(rng):
    return dict(n=_batch(rng), c=rng.randint(1, 17), h=4 * rng.randint(1, 6), w=4 * rng.randint(1, 6),
                k=rng.choice([32, 64, 128, 32, 64, 128, 8, 48]), dtype=str(_dtype(rng))[6:], relu=rng.random() < 0.6,
                pb=rng.random() < 0.5, x_layout=rng.choice(LAYOUTS), w_layout=rng.choice(LAYOUTS),
                special=_special(rng), seed=rng.randrange(2**31))


def _s2d(x):
    n, ch, h, w = x.shape
    return x.reshape(n, ch, h // 4, 4, w // 4, 4).permute(0, 3, 5, 1, 2, 4).reshape(n, 16 * ch, h // 4, w // 4)


def _s2d_operands(c, device, special=True):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make((c["n"], c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g, special=c["special"] if special else 0)
    wt = make((c["k"], 16 * c["c"], 1, 1), dtype, device, c["w_layout"], g, scale=(16 * c["c"]) ** -0.5)
    pb = make((), torch.float32, device, "nchw", g) if c["pb"] else None
    return dtype, x, wt, pb


def run_space_to_depth_conv(c, device):
    dtype, x, wt, pb = _s2d_operands(c, device)
    out = cutlass_ops.space_to_depth_conv(x, wt, pb, relu=c["relu"])

    def formula(x_, w_):
        y = F.conv2d(_s2d(x_), w_)
        y = torch.relu(y) if c["relu"] else y
        return y + pb.to(y.dtype).to(y.device) if pb is not None else y
    return compare("out", out, formula(d64(x), d64(wt)), _own(formula, dtype, device, x, wt), dtype)


def run_space_to_depth_conv_weight_grad(c, device):
    dtype, x, wt, pb = _s2d_operands(c, device, special=False)  # NaN/Inf go into the gradient instead
    out = cutlass_ops.space_to_depth_conv(x, wt, pb, relu=c["relu"])
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grad = make(out.shape, dtype, device, c["w_layout"], g, special=c["special"])
    dw, sums = ops.space_to_depth_conv_weight_grad(grad, x, out if c["relu"] else None, pb)
    gz = d64(grad)
    if c["relu"]:
        o = d64(out)
        active = o != d64(pb.to(dtype)) if pb is not None else o > 0
        gz = torch.where(active, gz, torch.zeros((), dtype=torch.float64))
    n, ch, h, w = x.shape
    patches = d64(x).view(n, ch, h // 4, 4, w // 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(-1, 16 * ch)
    want_dw = (gz.permute(0, 2, 3, 1).reshape(-1, grad.shape[1]).t() @ patches).reshape(dw.shape)
    fail = compare("grad_weight", dw, want_dw, None, torch.float32, slack=2e3)
    if fail:
        return fail
    return _check_fixup_sums(sums, grad, gz.sum())


def draw_giou_loss(rng):
    rank = rng.randint(0, 2)
    batch = [0 if rng.random() < 0.05 else rng.randint(1, 40) for _ in range(rank)]
    return dict(batch=batch, dtype=str(_dtype(rng))[6:], reduction=rng.choice(["none", "mean", "sum"]),
                layout=rng.choice(["nchw", "strided", "offset"]), degenerate=rng.random() < 0.2,
                special=_special(rng), seed=rng.randrange(2**31))


def _giou_formula(b1, b2, eps=1e-7):
    a1, c1, a2, c2 = b1.unbind(-1)
    e1, f1, e2, f2 = b2.unbind(-1)
    xi1, yi1, xi2, yi2 = torch.maximum(a1, e1), torch.maximum(c1, f1), torch.minimum(a2, e2), torch.minimum(c2, f2)
    inter = torch.where((yi2 > yi1) & (xi2 > xi1), (xi2 - xi1) * (yi2 - yi1), torch.zeros_like(xi1))
    union = (a2 - a1) * (c2 - c1) + (e2 - e1) * (f2 - f1) - inter
    enclose = (torch.maximum(a2, e2) - torch.minimum(a1, e1)) * (torch.maximum(c2, f2) - torch.minimum(c1, f1))
    return 1 - (inter / (union + eps) - (enclose - union) / (enclose + eps))


def run_giou_loss(c, device):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    shape = tuple(c["batch"])

    def boxes():
        lo = torch.rand(shape + (2,), generator=g, dtype=torch.float64) * 10
        size = torch.rand(shape + (2,), generator=g, dtype=torch.float64) * 5 + 0.5
        if c["degenerate"]:
            size = size * (torch.rand(shape + (2,), generator=g) < 0.5)
        return torch.cat([lo, lo + size], -1)
    b1, b2 = boxes(), boxes()
    if c["special"] and b1.numel():
        b1.view(-1)[int(torch.randint(b1.numel(), (1,), generator=g))] = float("nan")
    b1 = make_like(b1, dtype, device, c["layout"], g).requires_grad_()
    b2 = make_like(b2, dtype, device, c["layout"], g).requires_grad_()
    loss = cutlass_ops.giou_loss(b1, b2, c["reduction"])
    up = torch.randn(loss.shape, generator=g, dtype=torch.float64)
    g1, g2 = torch.autograd.grad(loss, (b1, b2), up.to(loss.dtype).to(device), allow_unused=True)

    def reference(x1, x2, work):
        x1 = x1.detach().to(work).requires_grad_()
        x2 = x2.detach().to(work).requires_grad_()
        per = _giou_formula(x1, x2)
        out = {"none": per, "sum": per.sum(), "mean": per.sum() / max(per.numel(), 1)}[c["reduction"]]
        r1, r2 = torch.autograd.grad(out, (x1, x2), up.to(work).to(x1.device), allow_unused=True)
        return out.detach(), r1, r2
    ref = reference(b1.cpu(), b2.cpu(), torch.float64)
    own = reference(b1, b2, torch.float32)  # torchvision computes 16-bit boxes in float32
    # The loss is float32: PyTorch's float32 run is the bound's yardstick.
    fail = compare("loss", loss, ref[0], own[0], torch.float32, slack=4.0)
    for name, got, want, theirs in (("grad_boxes1", g1, ref[1], own[1]), ("grad_boxes2", g2, ref[2], own[2])):
        if fail:
            return fail
        if got is None:
            fail = None if want is None or not want.numel() else f"{name}: no gradient"
            continue
        fail = compare(name, got, want, theirs.to(dtype), dtype, slack=4.0)
    return fail


# FusedMLP: the structure from a small pool (on CUDA each compiles one kernel per dtype, cached),
# everything else random: rows (0 too), weights, values (NaN/Inf too), the input's layout.
MLP_POOL = [
    ([19, 57, 40, 7], ["relu", "tanh"], None, True),
    ([3, 64, 64, 1], ["sin30", "sin30"], None, True),
    ([32, 127, 84, 57, 16], ["relu", "silu", "gelu"], None, True),
    ([8, 24, 2], ["softplus"], "sigmoid", False),
    ([1, 1], [], "tanh", True),
    ([64, 256, 64], ["leaky"], None, True),
]


class _Sin30(torch.nn.Module):
    def forward(self, x):
        return torch.sin(30 * x)


def _mlp_act(name):
    return {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "silu": torch.nn.SiLU, "gelu": torch.nn.GELU,
            "softplus": torch.nn.Softplus, "sigmoid": torch.nn.Sigmoid, "sin30": _Sin30,
            "leaky": lambda: torch.nn.LeakyReLU(0.1)}[name]()


def draw_fused_mlp(rng):
    rows = 0 if rng.random() < 0.05 else int(math.exp(rng.uniform(0, math.log(3000))))
    return dict(structure=rng.randrange(len(MLP_POOL)), rows=rows, dtype=str(_dtype(rng))[6:],
                layout=rng.choice(["contiguous", "strided", "offset"]), special=_special(rng),
                seed=rng.randrange(2**31))


def run_fused_mlp(c, device):
    """The forward against float64 (its gradients: test_fused_mlp.py, whose bounds allow for
    16-bit ReLU masks that flip near zero)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.float16  # the CUDA kernel's dtypes (float32 there runs torch ops: test_fused_mlp)
    widths, acts, last, bias = MLP_POOL[c["structure"]]
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        lin = torch.nn.Linear(a, b, bias=bias, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=g, dtype=torch.float64) * a ** -0.5)
            if bias:
                lin.bias.copy_(torch.randn(b, generator=g, dtype=torch.float64) * 0.5)
        mods.append(lin)
        if i < len(acts):
            mods.append(_mlp_act(acts[i]))
    if last:
        mods.append(_mlp_act(last))
    model = torch.nn.Sequential(*mods).to(dtype)       # the weights rounded to the dtype ...
    ref_model = copy.deepcopy(model).double()          # ... and the float64 reference from them
    # the kernel at every width (64-256-64 included)
    fused = cutlass_ops.FusedMLP.from_module(model, options=cutlass_ops.MlpOptions(wide_kernel=True)).to(device)
    x = make((c["rows"], widths[0]), dtype, "cpu", "nchw", g, special=c["special"])
    x = x.to(device) if c["layout"] == "contiguous" else _relayout(x, device, c["layout"])
    with torch.no_grad():
        y = fused(x)
        own = model.to(device)(x)
        ref = ref_model(d64(x))
    fail = compare("y", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or y.device != x.device):
        fail = f"y: {y.dtype} on {y.device}"
    return fail


def draw_layer_norm_rows(rng):
    rank = rng.randint(1, 3)
    lead = [0 if rng.random() < 0.05 else rng.randint(1, 40) for _ in range(rank - 1)]
    cols = rng.choice([_dims(rng, hi=384), rng.randint(1, 600), rng.choice([64, 192, 384, 2048, 2056])])
    return dict(shape=lead + [cols], dtype=str(_dtype(rng))[6:], residual=rng.random() < 0.6,
                affine=rng.random() < 0.85, x_layout=rng.choice(["nchw", "strided", "offset"]),
                r_layout=rng.choice(["nchw", "strided", "offset"]), special=_special(rng),
                seed=rng.randrange(2**31))


def run_layer_norm_rows(c, device):
    """y = LayerNorm(x + residual) (float32 statistics for 16-bit x) and the sum against float64:
    the sum exactly x + residual rounded to the dtype, y within the bound of PyTorch's own
    LayerNorm in float32 on the rounded sum (as CvT's LayerNorm)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make(c["shape"], dtype, device, c["x_layout"], g, scale=2.0, special=c["special"])
    r = make(c["shape"], dtype, device, c["r_layout"], g) if c["residual"] else None
    cols = c["shape"][-1]
    w = (torch.rand(cols, generator=g) + 0.5).to(device) if c["affine"] else None
    b = torch.randn(cols, generator=g).to(device) if c["affine"] else None
    y, s = ops.layer_norm_rows(x, w, b, 1e-5, r)
    s_want = x if r is None else x + r
    if r is not None:
        same = (d64(s) == d64(s_want)) | (torch.isnan(d64(s)) & torch.isnan(d64(s_want)))
        if s.shape != s_want.shape or not same.all():
            return "sum: not exactly x + residual in the dtype"
    ref = F.layer_norm(d64(s_want), [cols], d64(w), d64(b), 1e-5)
    own = F.layer_norm(s_want.float(), [cols], w, b, 1e-5).to(dtype)
    fail = compare("y", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or y.device != x.device):
        fail = f"y: {y.dtype} on {y.device}"
    return fail


def draw_dw_conv3x3_tokens(rng):
    return dict(n=_batch(rng), h=rng.randint(1, 20), w=rng.randint(1, 20), c=_dims(rng, hi=96),
                strides=rng.choice([[1], [2], [1, 2, 2], [2, 1], [1, 1, 2]]), lead=rng.choice([0, 0, 1, 2]),
                bias=rng.random() < 0.85, x_layout=rng.choice(["nchw", "offset", "skip"]),
                dtype=str(_dtype(rng))[6:], params=rng.choice(["x", "float32"]), special=_special(rng),
                seed=rng.randrange(2**31))


def run_dw_conv3x3_tokens(c, device):
    """The depthwise convs on the token map (biases, lead rows in front) against float64 and
    PyTorch's own conv in the dtype, each; the lead rows exact.  x contiguous, 1-7 elements into
    its storage, or a view that skips a row before each image's (CvT's tokens less the cls)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, h, w, ch, strides, lead = c["n"], c["h"], c["w"], c["c"], c["strides"], c["lead"]
    if c["x_layout"] == "skip":
        full = make((n, 1 + h * w, ch), dtype, device, "nchw", g, special=c["special"])
        x = full[:, 1:]
    else:
        x = make((n, h * w, ch), dtype, device, c["x_layout"], g, special=c["special"])
    pdt = dtype if c["params"] == "x" else torch.float32
    wt = (torch.randn(len(strides), ch, 1, 3, 3, generator=g) / 3).to(device, pdt)
    b = torch.randn(len(strides), ch, generator=g).to(device, pdt) if c["bias"] else None
    ld = make((n, lead, ch), dtype, device, "nchw", g) if lead else None
    ys = ops.dw_conv3x3_tokens(x, h, w, wt, b, strides, ld)
    if len(ys) != len(strides):
        return f"{len(ys)} outputs for {len(strides)} strides"
    for j, (y, s) in enumerate(zip(ys, strides)):
        def conv(xx, ww, bb):
            m = xx.reshape(n, h, w, ch).permute(0, 3, 1, 2)
            return F.conv2d(m, ww, bb, s, 1, 1, ch).flatten(2).transpose(1, 2)
        bj = None if b is None else b[j]
        ref = conv(d64(x), d64(wt[j]), d64(bj))
        own = _own(conv, dtype, "cpu", x.cpu(), wt[j].cpu(), None if bj is None else bj.cpu())
        if ld is not None:
            if not torch.equal(y[:, :lead].cpu(), ld.cpu()):
                return f"y{j} lead rows: not copied exactly"
            y = y[:, lead:]
        fail = compare(f"y{j}", y, ref, own, dtype)
        if not fail and (y.dtype != dtype or y.device != x.device):
            fail = f"y{j}: {y.dtype} on {y.device}"
        if fail:
            return fail
    return None


def draw_linear_silu(rng):
    return dict(rows=rng.choice([0, 1, rng.randint(1, 300), rng.randint(300, 5000)]), k=_dims(rng, hi=512),
                n=_dims(rng, hi=640), bias=rng.random() < 0.85, alpha=rng.choice([1.0, 1.702, rng.uniform(-3, 3)]),
                x_layout=rng.choice(["nchw", "offset"]), dtype=str(_dtype(rng))[6:], special=_special(rng),
                seed=rng.randrange(2**31))


def run_linear_silu(c, device):
    """silu(alpha (x W^T + b)) against float64 and PyTorch's own (cuBLAS/ATen Linear, SiLU) in
    the dtype; x contiguous or 1-7 elements into its storage (the ATen path)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make((c["rows"], c["k"]), dtype, device, c["x_layout"], g, special=c["special"])
    w = (torch.randn(c["n"], c["k"], generator=g) / c["k"] ** 0.5).to(device, dtype)
    b = torch.randn(c["n"], generator=g).to(device, dtype) if c["bias"] else None
    y = ops.linear_silu(x, w, b, c["alpha"])
    ref = F.silu(c["alpha"] * F.linear(d64(x), d64(w), d64(b)))
    own = _own(lambda xx, ww, bb: F.silu(c["alpha"] * F.linear(xx, ww, bb)), dtype, "cpu", x.cpu(), w.cpu(),
               None if b is None else b.cpu())
    fail = compare("y", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or y.device != x.device):
        fail = f"y: {y.dtype} on {y.device}"
    return fail


def make_like(vals, dtype, device, layout, g):
    """`vals` (float64, CPU) as a tensor of `dtype` on `device` in `layout` (see make)."""
    t = make(vals.shape, dtype, "cpu", layout, g)
    with torch.no_grad():
        t.copy_(vals.to(dtype))
    return t.to(device) if layout == "nchw" else _relayout(t, device, layout)


def _relayout(t, device, layout):
    if layout == "strided":
        big = torch.zeros(t.shape[:-1] + (2 * t.shape[-1] + 1,), dtype=t.dtype, device=device)
        big[..., 1::2] = t.to(device)
        return big[..., 1::2]
    storage = torch.zeros(t.numel() + 3, dtype=t.dtype, device=device)
    storage[3:] = t.reshape(-1).to(device)
    return storage[3:].view(t.shape)


OPS = {
    "conv2d_fused": (draw_conv2d_fused, run_conv2d_fused),
    "conv2d_b2b": (draw_conv2d_b2b, run_conv2d_b2b),
    "conv2d_dgrad": (draw_conv_backward, run_conv2d_dgrad),
    "conv2d_wgrad": (draw_conv_backward, run_conv2d_wgrad),
    "se_gate": (draw_se_gate, run_se_gate),
    "se_gate_backward": (draw_se_gate_backward, run_se_gate_backward),
    "relu_backward": (draw_relu_backward, run_relu_backward),
    "space_to_depth_conv": (draw_space_to_depth_conv, run_space_to_depth_conv),
    "space_to_depth_conv_weight_grad": (draw_space_to_depth_conv, run_space_to_depth_conv_weight_grad),
    "giou_loss": (draw_giou_loss, run_giou_loss),
    "fused_mlp": (draw_fused_mlp, run_fused_mlp),
    "layer_norm_rows": (draw_layer_norm_rows, run_layer_norm_rows),
    "dw_conv3x3_tokens": (draw_dw_conv3x3_tokens, run_dw_conv3x3_tokens),
    "linear_silu": (draw_linear_silu, run_linear_silu),
}


def draw(op: str, device: str, index: int, seed: int) -> dict:
    return OPS[op][0](random.Random(f"{seed}:{op}:{device}:{index}"))


def run_case(op: str, case: dict, device: str):
    """Runs one case; returns None or the failure's description."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ATen fallback's one-time warning
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                return OPS[op][1](case, device)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev


def snippet(op, case, device):
    return ("# from tests/python, with cutlass_ops installed:\n"
            f"import test_fuzz\nprint(test_fuzz.run_case({op!r}, {case!r}, {device!r}))")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(OPS))
def test_fuzz(op, device, rng_seed):
    count = num_cases(device)
    seed = rng_seed if SEED is None else SEED
    print(f"fuzz {op} on {device}: seed {seed}, {count} cases (CUTLASS_OPS_FUZZ_SEED / CUTLASS_OPS_FUZZ_CASES)")
    kernels = {}
    for i in range(count):
        case = draw(op, device, i, seed)
        try:
            fail = run_case(op, case, device)
        except Exception as e:  # a crash is a failure too, reported with its reproducer
            fail = f"raised {type(e).__name__}: {e}"
        if fail:
            pytest.fail(f"fuzz {op} case {i} (CUTLASS_OPS_FUZZ_SEED={seed}) on {device}: {fail}\nreproduce:\n{snippet(op, case, device)}",
                        pytrace=False)
        if op in ("conv2d_fused", "conv2d_b2b"):  # which path ran: a generated kernel, or "aten" etc.
            last = ops.conv2d_b2b_last_kernel() if op == "conv2d_b2b" else cutlass_ops.conv2d_fused_last_kernel()
            path = "cutlass" if last.startswith("cutlass") else last.split(" ")[0]
            kernels[path] = 1 + kernels.get(path, 0)
    if kernels:
        print(f"  paths: {kernels}")
    if device == "cuda" and op in ("conv2d_fused", "conv2d_b2b") and count >= 200:
        assert kernels.get("cutlass", 0) > count // 10, kernels  # the fuzz reaches the kernels
