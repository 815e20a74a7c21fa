"""The fuzz's framework (test_fuzz.py runs it): random tensors in every layout, the comparison
against float64 with bounds relative to PyTorch's own same-dtype error, and autograd helpers
for the backward cases.  The ops' draw/run pairs: _fuzz_conv.py, _fuzz_se.py, _fuzz_cvt.py."""
from __future__ import annotations

import math
import os
import random

import torch
import torch.nn.functional as F

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
    bounds), all on the CPU in float64.  alt: another admissible result, or a list of them
    (None entries skipped), whose NaN/Inf classes are accepted too: PyTorch in float32, or the
    float64 reference computed with a conv's zero padding multiplied in (conv2d_taps).
    Returns a failure message or None."""
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
    for a in (alt if isinstance(alt, (list, tuple)) else [alt]):
        if a is not None:
            ok |= cls(out) == cls(d64(a))
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


def _wants(rng, k):
    """Which of k inputs a backward case differentiates: each with probability 3/4, at least one."""
    w = [rng.random() < 0.75 for _ in range(k)]
    return w if any(w) else [True] + w[1:]


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


# ---- a conv with its zero padding left out of the sums ------------------------------------

def conv2d_taps(x, w, stride, pad, groups=1):
    """F.conv2d(x, w, None, stride, pad, 1, groups) (groups 1, or depthwise: groups = C, w
    (C, 1, R, S)) as a sum over the kernel's taps, each tap's products taken only at the output
    positions whose input position lies inside the image: the zero padding is left out of the
    sums rather than multiplied in.  The value is F.conv2d's; the gradients differ where a
    NaN/Inf output gradient meets the padding: F.conv2d's weight gradient multiplies it by an
    explicit zero (0 * NaN = NaN; ATen's float64, and cuDNN's fp16 NCHW wgrad on an H200), while
    an implementation that skips the padding (cuDNN's fp16 channels_last wgrad there, the CPU's
    channels_last conv) sums only real products and stays finite, as here.  Both are the same function's derivative
    in exact arithmetic; the checks accept either NaN/Inf class (autograd_case's exact_fn)."""
    n, _, h, wd = x.shape
    k, _, r_, s_ = w.shape
    (sh, sw), (ph, pw) = ((stride, stride) if isinstance(stride, int) else stride,
                          (pad, pad) if isinstance(pad, int) else pad)
    p, q = (h + 2 * ph - r_) // sh + 1, (wd + 2 * pw - s_) // sw + 1
    # empty sums (0): y depends on x and w for autograd even where no output reads the image
    y = x.new_zeros((n, k, p, q)) + (x.reshape(-1)[:0].sum() + w.reshape(-1)[:0].sum())
    for r in range(r_):
        p0, p1 = max(0, -((r - ph) // sh)), min(p - 1, (h - 1 + ph - r) // sh)  # rows inside the image
        for s in range(s_):
            q0, q1 = max(0, -((s - pw) // sw)), min(q - 1, (wd - 1 + pw - s) // sw)
            if p0 > p1 or q0 > q1:
                continue
            xs = x[:, :, p0 * sh + r - ph:p1 * sh + r - ph + 1:sh, q0 * sw + s - pw:q1 * sw + s - pw + 1:sw]
            t = (xs * w[:, 0, r, s].view(1, -1, 1, 1) if groups > 1
                 else torch.einsum("ncpq,kc->nkpq", xs, w[:, :, r, s]))
            y = y + F.pad(t, (q0, q - 1 - q1, p0, p - 1 - p1))
    return y


def conv2d_weight_taps(x, w_shape, dy, stride, pad):
    """dL/dw of conv2d_taps(x, w, stride, pad) for dy: the weight gradient with the zero padding
    left out of the sums (float64 in, float64 out)."""
    w = torch.zeros(w_shape, dtype=x.dtype).requires_grad_(True)
    with torch.enable_grad():
        return torch.autograd.grad(conv2d_taps(x, w, stride, pad), w, dy)[0]



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


def check_grads(names, got, ref, own, dtype, slack=1.0, alt=None):
    """Each gradient against float64 (compare's bound: 2x PyTorch's own + a few ulp of the
    case's dtype); a gradient the reference has and the op does not, or vice versa, fails.
    alt: per gradient, another admissible float64 result whose NaN/Inf classes are accepted
    (autograd_case's exact_fn), or None."""
    for name, g, r, o, a in zip(names, got, ref, own, alt or [None] * len(names)):
        if r is None and g is None:
            continue
        if g is None or r is None:
            if (r if g is None else g).numel() and (r if g is None else g).abs().sum() != 0:
                return f"{name}: {'no gradient' if g is None else 'a gradient where none is expected'}"
            continue
        fail = compare(name, g, r, o, dtype, slack=slack, alt=a)
        if not fail and (g.dtype != dtype_of(o, g) or tuple(g.shape) != tuple(r.shape)):
            fail = f"{name}: {g.dtype} {tuple(g.shape)}"
        if fail:
            return fail
    return None


def dtype_of(own, got):
    """The gradient's expected dtype: PyTorch's own (the input's dtype)."""
    return got.dtype if own is None else own.dtype


def autograd_case(op_fn, ref_fn, tensors, wants, grad_outs, dtype, names, slack=1.0, exact_fn=None,
                  own_device=None, float32_classes=False):
    """Runs op_fn under autograd and checks its gradients against float64 autograd of
    ref_fn (the composite, on the CPU) and PyTorch's own of ref_fn in the tensors' dtypes (on
    their device, or on ``own_device``: "cpu" where the device's would be cuDNN's depthwise conv,
    which compiles every new shape at run time -- seconds a shape with cuDNN 9.10 and later, too
    slow for a thousand random shapes; the forward fuzz computes its own on the CPU too).

    float32_classes: PyTorch's float32 gradients of ref_fn on the tensors' device give admissible
    NaN/Inf classes too, for ops whose backward is exactly that by contract (conv_embed's: ATen
    in float32): where a NaN/Inf output gradient crosses a LayerNorm row, the classes of that
    row's gradients follow the LayerNorm backward's formula, and ATen's CUDA kernel's is not
    float64's (inf where float64 has NaN).  Finite values are still checked against float64.

    exact_fn: the same composite with its conv's zero padding left out of the sums
    (conv2d_taps), for cases with NaN/Inf in the output gradient: the float64 reference is then
    exact_fn's, and ref_fn's float64 gradients (the padding's explicit zeros multiplied in, as
    F.conv2d's backward does) add their NaN/Inf classes as admissible.  A weight gradient of a
    padded conv is finite where it skips the padding and NaN where it multiplies the padding's
    zero by a NaN/Inf gradient; either is right (conv2d_taps), and the value of a finite one is
    checked against exact_fn's."""
    g64 = [None if g is None else d64(g) for g in grad_outs]
    _, got = grads_of(op_fn, tensors, wants, grad_outs)
    _, ref = grads_of(exact_fn or ref_fn, tensors, wants, g64, torch.float64, "cpu")
    alt = grads_of(ref_fn, tensors, wants, g64, torch.float64, "cpu")[1] if exact_fn else [None] * len(tensors)
    if float32_classes:
        dev = next(t.device for t in tensors if t is not None)
        f32 = grads_of(ref_fn, tensors, wants, grad_outs, torch.float32, dev)[1]
        alt = [[a, b] for a, b in zip(alt, f32)]
    if own_device is None:
        own = own_grads(ref_fn, tensors, wants, grad_outs)
    else:
        own = own_grads(ref_fn, [None if t is None else t.detach().to(own_device) for t in tensors], wants,
                        [None if g is None else g.to(own_device) for g in grad_outs])
    scalar = [t is not None and want and t.dim() == 0 for t, want in zip(tensors, wants)]
    fail = check_grads([n for n, s in zip(names, scalar) if not s], *[[v for v, s in zip(lst, scalar) if not s]
                                                                       for lst in (got, ref, own)], dtype, slack,
                       [a for a, s in zip(alt, scalar) if not s])
    for i in (i for i, s in enumerate(scalar) if s):
        fail = fail or _check_scalar_grad(names[i], got[i], ref[i], own[i], exact_fn or ref_fn, tensors, i, grad_outs,
                                          dtype, alt[i])
    return fail


def _check_scalar_grad(name, got, ref, own, ref_fn, tensors, i, grad_outs, dtype, alt=None):
    """A scalar's gradient is a sum over the whole output that may cancel: its error relative
    to the sum of its terms' magnitudes, sum |grad_out * (y(p + 1) - y(p))| (float64; y is
    affine in the scalars the ops take, given the ReLU mask), at most 2x PyTorch's own plus
    a few units of the case's dtype (whose rounded intermediates the sum may take) and float32
    summation's.  A NaN/Inf of ``alt`` (ref_fn's float64 where autograd_case has an exact_fn,
    or a list of such alternatives) is admissible too."""
    if got is None:
        return f"{name}: no gradient"
    unit = UNIT[dtype]
    got, ref, own = (d64(t).reshape(()) for t in (got, ref, own))
    if not torch.isfinite(ref):
        return None if torch.isnan(got) or got == ref else f"{name}: {got.item()} where float64 gives {ref.item()}"
    for a in (alt if isinstance(alt, (list, tuple)) else [alt]):  # (autograd_case's alternatives)
        a = None if a is None else d64(a).reshape(())
        if a is not None and not torch.isfinite(a) and (torch.isnan(got) or got == a):
            return None  # the NaN/Inf of an alternative reference
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
