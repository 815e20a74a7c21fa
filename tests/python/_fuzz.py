"""The fuzz's framework (test_fuzz.py runs it): random tensors in every layout, the comparison
against float64 with bounds relative to PyTorch's own same-dtype error, and autograd helpers
for the backward cases.  The ops' draw/run pairs: _fuzz_conv.py, _fuzz_se.py, _fuzz_cvt.py."""
from __future__ import annotations

import math
import os
import random

import torch

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



# ---- backward: gradients by autograd, against float64 autograd of the composite -------------

def round_st(t, dtype):
    """t rounded to dtype and back, with a straight-through gradient: where an op rounds an
    intermediate by its contract (the reference rounds there too, gradients pass unchanged)."""
    if dtype is None or t.dtype == dtype:
        return t
    return t + (t.detach().to(dtype).to(t.dtype) - t.detach())


def grads_of(fn, tensors, wants, grad_outs, work=None, device=None):
    """(outputs, gradients) of fn(*tensors) by autograd: tensors as they are (work None), or
    cast to the floating dtype ``work`` on ``device``; the gradients of tensors[i] where
    wants[i] (None elsewhere).  fn returns a tensor or a list/tuple (None entries allowed);
    grad_outs matches it (None: that output is not differentiated)."""
    leaves = []
    for t, want in zip(tensors, wants):
        if t is None:
            leaves.append(None)
            continue
        x = t.detach()
        if work is not None:
            x = x.to(device=device, dtype=work if x.is_floating_point() else x.dtype)
        leaves.append(x.requires_grad_(bool(want)))
    with torch.enable_grad():
        outs = fn(*leaves)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        # an output that needs no gradient (it depends on none of the wanted tensors: the sum
        # x + residual when only the LayerNorm's bias is wanted) contributes nothing; autograd.grad
        # would reject it.  An op whose output is disconnected where the reference's is not
        # still fails: its gradients come out missing or wrong (check_grads).
        pairs = [(o, g) for o, g in zip(outs, grad_outs) if o is not None and g is not None and o.requires_grad]
        wanted = [x for x, want in zip(leaves, wants) if x is not None and want]
        found = torch.autograd.grad([o for o, _ in pairs], wanted,
                                    [g.to(device=o.device, dtype=o.dtype) for o, g in pairs],
                                    allow_unused=True) if wanted and pairs else [None] * len(wanted)
    found = iter(found)
    grads = [next(found) if x is not None and want else None for x, want in zip(leaves, wants)]
    return [None if o is None else o.detach() for o in outs], grads


def own_grads(fn, tensors, wants, grad_outs):
    """PyTorch's own gradients of the composite fn in the tensors' own dtypes (on their
    device); where ATen has no such kernel (some 16-bit CPU ops), float32 rounded to each
    tensor's dtype."""
    try:
        return grads_of(fn, tensors, wants, grad_outs)[1]
    except (RuntimeError, NotImplementedError):
        dev = next(t.device for t in tensors if t is not None)
        g32 = grads_of(fn, tensors, wants, grad_outs, torch.float32, dev)[1]
        return [None if g is None else g.to(t.dtype) for g, t in zip(g32, tensors)]


def check_grads(names, got, ref, own, dtype, slack=1.0):
    """Each gradient against float64 (compare's bound: 2x PyTorch's own + a few ulp of the
    case's dtype); a gradient the reference has and the op does not, or vice versa, fails."""
    for name, g, r, o in zip(names, got, ref, own):
        if r is None and g is None:
            continue
        if g is None or r is None:
            if (r if g is None else g).numel() and (r if g is None else g).abs().sum() != 0:
                return f"{name}: {'no gradient' if g is None else 'a gradient where none is expected'}"
            continue
        fail = compare(name, g, r, o, dtype, slack=slack)
        if not fail and (g.dtype != dtype_of(o, g) or tuple(g.shape) != tuple(r.shape)):
            fail = f"{name}: {g.dtype} {tuple(g.shape)}"
        if fail:
            return fail
    return None


def dtype_of(own, got):
    """The gradient's expected dtype: PyTorch's own (the input's dtype)."""
    return got.dtype if own is None else own.dtype


def autograd_case(op_fn, ref_fn, tensors, wants, grad_outs, dtype, names, slack=1.0):
    """Runs op_fn under autograd and checks its gradients against float64 autograd of
    ref_fn (the composite, on the CPU) and PyTorch's own of ref_fn in the tensors' dtypes."""
    _, got = grads_of(op_fn, tensors, wants, grad_outs)
    _, ref = grads_of(ref_fn, tensors, wants, [None if g is None else d64(g) for g in grad_outs],
                      torch.float64, "cpu")
    own = own_grads(ref_fn, tensors, wants, grad_outs)
    scalar = [t is not None and want and t.dim() == 0 for t, want in zip(tensors, wants)]
    fail = check_grads([n for n, s in zip(names, scalar) if not s], *[[v for v, s in zip(lst, scalar) if not s]
                                                                       for lst in (got, ref, own)], dtype, slack)
    for i in (i for i, s in enumerate(scalar) if s):
        fail = fail or _check_scalar_grad(names[i], got[i], ref[i], own[i], ref_fn, tensors, i, grad_outs, dtype)
    return fail


def _check_scalar_grad(name, got, ref, own, ref_fn, tensors, i, grad_outs, dtype):
    """A scalar's gradient is a sum over the whole output that may cancel: its error relative
    to the sum of its terms' magnitudes, sum |grad_out * (y(p + 1) - y(p))| (float64; y is
    affine in the scalars the ops take, given the ReLU mask), at most 2x PyTorch's own plus
    a few units of the case's dtype (whose rounded intermediates the sum may take) and float32
    summation's."""
    if got is None:
        return f"{name}: no gradient"
    unit = UNIT[dtype]
    got, ref, own = (d64(t).reshape(()) for t in (got, ref, own))
    if not torch.isfinite(ref):
        return None if torch.isnan(got) or got == ref else f"{name}: {got.item()} where float64 gives {ref.item()}"
    with torch.no_grad():
        t64 = [d64(t) for t in tensors]
        y0 = ref_fn(*t64)
        t64[i] = t64[i] + 1
        y1 = ref_fn(*t64)
    y0, y1 = ([y] if not isinstance(y, (list, tuple)) else list(y) for y in (y0, y1))
    mag = sum((torch.where(b == a, 0.0, d64(g) * (b - a)).abs().sum() for a, b, g in zip(y0, y1, grad_outs)
               if a is not None and g is not None), torch.zeros((), dtype=torch.float64))
    mag = mag.clamp_min(1e-30)
    err, own_err = (got - ref).abs() / mag, (own - ref).abs() / mag
    if not torch.isfinite(own_err):
        own_err = torch.zeros(())
    bound = 2 * own_err.item() + 4 * unit + 1e-5
    return None if err <= bound else f"{name}: error {err.item():.3e} (of sum |terms|) > {bound:.3e}"
