"""Fuzz cases of the CvT ops (layer_norm_rows, dw_conv3x3_tokens, layer_norm_dw_conv3x3_tokens,
linear_silu, linear_residual, scale_samples, conv_embed), forward and autograd backward
(layer_norm_rows_backward, dw_conv3x3_tokens_backward_input, ...); test_fuzz.py runs them (the
framework: _fuzz.py)."""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from cutlass_ops import ops
from _fuzz import (LAYOUTS, _batch, _dims, _dtype, _own, _special, _wants, autograd_case, compare, conv2d_taps, d64,
                   make, round_st)


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


def _dw3x3(m, w, b, s, taps=False):
    """F.conv2d(m, w, b, s, 1, 1, C) for a depthwise 3x3, padding 1; in float64 as nine shifted
    multiply-adds: ATen's float64 depthwise conv on the CPU takes ~0.3-0.6 s a call, even on tiny
    maps, which would make the CPU fuzz of these ops take minutes (the same sum, in another order).
    taps: (float64) as conv2d_taps, the zero padding left out of the sums (its gradients' NaN/Inf
    classes differ from F.conv2d's at the padding: autograd_case's exact_fn)."""
    if m.dtype != torch.float64:
        return F.conv2d(m, w, b, s, 1, 1, m.shape[1])
    n, c, h, wd = m.shape
    if taps:
        y = conv2d_taps(m, w, s, 1, groups=c)
        return y if b is None else y + b.view(1, c, 1, 1)
    p = F.pad(m, (1, 1, 1, 1))
    ho, wo = (h - 1) // s + 1, (wd - 1) // s + 1
    y = sum(p[:, :, r:r + s * (ho - 1) + 1:s, q:q + s * (wo - 1) + 1:s] * w[:, 0, r, q].view(1, c, 1, 1)
            for r in range(3) for q in range(3))
    return y if b is None else y + b.view(1, c, 1, 1)


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
            return _dw3x3(m, ww, bb, s).flatten(2).transpose(1, 2)
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



def draw_layer_norm_rows_backward(rng):
    d = draw_layer_norm_rows(rng)
    d["special"] = 0
    d["wants"] = _wants(rng, 4)  # x, residual, weight, bias
    d["grad_sum"] = rng.random() < 0.5  # the sum has users of its own
    return d


def run_layer_norm_rows_backward(c, device):
    """layer_norm_rows's autograd (the layer_norm_rows_backward kernel) against float64."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make(c["shape"], dtype, device, c["x_layout"], g, scale=2.0)
    r = make(c["shape"], dtype, device, c["r_layout"], g) if c["residual"] else None
    cols = c["shape"][-1]
    w = (torch.rand(cols, generator=g) + 0.5).to(device) if c["affine"] else None
    b = torch.randn(cols, generator=g).to(device) if c["affine"] else None
    gy = make(c["shape"], dtype, device, "nchw", g)
    gs = make(c["shape"], dtype, device, "nchw", g) if c["grad_sum"] and r is not None else None

    def ref_fn(x_, r_, w_, b_):
        s = x_ + r_ if r_ is not None else x_
        ct = torch.float64 if s.dtype == torch.float64 else torch.float32  # CvT's LayerNorm: float32 statistics
        y = F.layer_norm(s.to(ct), [cols], None if w_ is None else w_.to(ct), None if b_ is None else b_.to(ct),
                         1e-5).to(s.dtype)
        return y, s

    return autograd_case(lambda x_, r_, w_, b_: ops.layer_norm_rows(x_, w_, b_, 1e-5, r_), ref_fn, [x, r, w, b],
                         c["wants"], [gy, gs], dtype, ["grad_x", "grad_residual", "grad_weight", "grad_bias"])


def _dw_operands(c, device, special=True):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, h, w, ch, strides, lead = c["n"], c["h"], c["w"], c["c"], c["strides"], c["lead"]
    sp = c["special"] if special else 0
    if c["x_layout"] == "skip":
        x = make((n, 1 + h * w, ch), dtype, device, "nchw", g, special=sp)[:, 1:]
    else:
        x = make((n, h * w, ch), dtype, device, c["x_layout"], g, special=sp)
    pdt = dtype if c["params"] == "x" else torch.float32
    wt = (torch.randn(len(strides), ch, 1, 3, 3, generator=g) / 3).to(device, pdt)
    b = torch.randn(len(strides), ch, generator=g).to(device, pdt) if c["bias"] else None
    ld = make((n, lead, ch), dtype, device, "nchw", g) if lead else None
    return dtype, x, wt, b, ld


def _dw_formula(c, norm=None, taps=False):
    """dw_conv3x3_tokens's composite: per stride, the lead rows then the conv rows; ``norm``
    (a function) applied to x and the lead rows first; taps: _dw3x3's (float64)."""
    n, h, w, ch, strides = c["n"], c["h"], c["w"], c["c"], c["strides"]

    def formula(x, wt, b, ld, *ln):
        if norm is not None:
            x, ld = norm(x, *ln), (None if ld is None else norm(ld, *ln))
        ys = []
        for j, s in enumerate(strides):
            m = x.reshape(n, h, w, ch).permute(0, 3, 1, 2)
            y = _dw3x3(m, wt[j].to(x.dtype), None if b is None else b[j].to(x.dtype), s, taps)
            y = y.flatten(2).transpose(1, 2)
            ys.append(y if ld is None else torch.cat([ld, y], 1))
        return ys
    return formula


def _small_map(d, rng):
    """A smaller map for the CPU's float64 and 16-bit references of the backward / LayerNorm
    cases (the forward's sizes stay in dw_conv3x3_tokens's own fuzz)."""
    d["h"], d["w"], d["c"] = min(d["h"], rng.randint(1, 10)), min(d["w"], rng.randint(1, 10)), min(d["c"], 48)
    return d


# A case that wants the weight gradient reaches the op's backward's depthwise wgrad (ATen's: cuDNN
# on CUDA), which compiles every new shape at run time, seconds a shape with cuDNN 9.10 and later:
# such cases take their map (batch, size, channels, strides, dtype) from a fixed pool of this many,
# so that a 1,000-case run compiles a few dozen shapes, not a thousand; the other cases, and
# PyTorch's own gradients (computed on the CPU: autograd_case's own_device), draw freely.
CUDNN_MAP_POOL = 16


def _pooled_map(d, rng):
    k = rng.randrange(CUDNN_MAP_POOL)
    m = _small_map(draw_dw_conv3x3_tokens(random.Random(f"dw map {k}")), random.Random(f"dw small map {k}"))
    d.update({key: m[key] for key in ("n", "h", "w", "c", "strides", "dtype")})
    return d


def draw_dw_conv3x3_tokens_backward(rng):
    d = _small_map(draw_dw_conv3x3_tokens(rng), rng)
    d["wants"] = _wants(rng, 4)  # x, weight, bias, lead
    return _pooled_map(d, rng) if d["wants"][1] else d


def run_dw_conv3x3_tokens_backward(c, device):
    """dw_conv3x3_tokens's autograd: the input gradient of all the convs in one
    dw_conv3x3_tokens_backward_input kernel, the weights' and biases' and lead rows'."""
    dtype, x, wt, b, ld = _dw_operands(c, device, special=False)
    with torch.no_grad():
        ys = ops.dw_conv3x3_tokens(x, c["h"], c["w"], wt, b, c["strides"], ld)
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grads = [make(y.shape, dtype, device, "nchw", g, special=c["special"] if j == 0 else 0)
             for j, y in enumerate(ys)]
    # NaN/Inf in the first output's gradient: the weight gradient's class where they meet the
    # padding is the implementation's (conv2d_taps), F.conv2d's admissible
    return autograd_case(lambda x_, w_, b_, l_: ops.dw_conv3x3_tokens(x_, c["h"], c["w"], w_, b_, c["strides"], l_),
                         _dw_formula(c), [x, wt, b, ld], c["wants"], grads, dtype,
                         ["grad_x", "grad_weight", "grad_bias", "grad_lead"], exact_fn=_dw_formula(c, taps=True),
                         own_device="cpu")


def draw_layer_norm_dw_conv3x3_tokens(rng):
    d = _small_map(draw_dw_conv3x3_tokens(rng), rng)
    d["affine"] = rng.random() < 0.8
    d["wants"] = _wants(rng, 6)  # x, weight, bias, lead, ln_weight, ln_bias
    return d


def draw_layer_norm_dw_conv3x3_tokens_backward(rng):
    d = draw_layer_norm_dw_conv3x3_tokens(rng)
    return _pooled_map(d, rng) if d["wants"][1] else d


def _ln_dw_operands(c, device, special=True):
    dtype, x, wt, b, ld = _dw_operands(c, device, special)
    g = torch.Generator().manual_seed(c["seed"] + 2)
    lw = (torch.rand(c["c"], generator=g) + 0.5).to(device, wt.dtype) if c["affine"] else None
    lb = torch.randn(c["c"], generator=g).to(device, wt.dtype) if c["affine"] else None
    return dtype, [x, wt, b, ld, lw, lb]


def _ln_norm(dtype):
    """LayerNorm over C in float32 statistics (float64 in float64), rounded to the case's
    dtype (straight through), as the op writes it."""
    def norm(t, lw, lb):
        ct = torch.float64 if t.dtype == torch.float64 else torch.float32
        y = F.layer_norm(t.to(ct), (t.shape[-1],), None if lw is None else lw.to(ct), None if lb is None else lb.to(ct),
                         1e-5)
        return round_st(y, dtype).to(t.dtype)
    return norm


def _ln_dw_op(c):
    return lambda x, wt, b, ld, lw, lb: ops.layer_norm_dw_conv3x3_tokens(x, c["h"], c["w"], lw, lb, 1e-5, wt, b,
                                                                         c["strides"], ld)


def run_layer_norm_dw_conv3x3_tokens(c, device):
    """dw_conv3x3_tokens(LayerNorm(x), ..., LayerNorm(lead)), the LayerNorm rounded to the
    dtype, against float64 (rounded at the same point) and PyTorch's own in the dtype."""
    dtype, t = _ln_dw_operands(c, device)
    ys = _ln_dw_op(c)(*t)
    formula = _dw_formula(c, _ln_norm(dtype))
    ref = formula(*map(d64, t))
    own = formula(*[None if v is None else v.cpu() for v in t])
    for j, (y, r, o) in enumerate(zip(ys, ref, own)):
        fail = compare(f"y{j}", y, r, o, dtype, slack=2.0)  # the normalized map rounded first (as PyTorch's)
        if not fail and (y.dtype != dtype or y.device != t[0].device):
            fail = f"y{j}: {y.dtype} on {y.device}"
        if fail:
            return fail
    return None if len(ys) == len(c["strides"]) else f"{len(ys)} outputs for {len(c['strides'])} strides"


def run_layer_norm_dw_conv3x3_tokens_backward(c, device):
    """Its autograd (the LayerNorm recomputed, then dw_conv3x3_tokens's backward)."""
    dtype, t = _ln_dw_operands(c, device, special=False)
    with torch.no_grad():
        ys = _ln_dw_op(c)(*t)
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grads = [make(y.shape, dtype, device, "nchw", g) for y in ys]
    return autograd_case(_ln_dw_op(c), _dw_formula(c, _ln_norm(dtype)), t, c["wants"], grads, dtype,
                         ["grad_x", "grad_weight", "grad_bias", "grad_lead", "grad_ln_weight", "grad_ln_bias"],
                         slack=2.0, own_device="cpu")


def draw_linear_silu_backward(rng):
    d = draw_linear_silu(rng)
    d["rows"] = min(d["rows"], 400)
    d["k"], d["n"] = min(d["k"], 256), min(d["n"], 256)
    d["special"] = 0
    d["wants"] = _wants(rng, 3)  # x, weight, bias
    return d


def run_linear_silu_backward(c, device):
    """linear_silu's autograd (the pre-activation recomputed in float32) against float64."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make((c["rows"], c["k"]), dtype, device, c["x_layout"], g)
    w = (torch.randn(c["n"], c["k"], generator=g) / c["k"] ** 0.5).to(device, dtype)
    b = torch.randn(c["n"], generator=g).to(device, dtype) if c["bias"] else None
    gy = make((c["rows"], c["n"]), dtype, device, "nchw", g)
    alpha = c["alpha"]
    return autograd_case(lambda x_, w_, b_: ops.linear_silu(x_, w_, b_, alpha),
                         lambda x_, w_, b_: F.silu(alpha * F.linear(x_, w_, b_)), [x, w, b], c["wants"], [gy],
                         dtype, ["grad_x", "grad_weight", "grad_bias"])


def draw_linear_residual(rng):
    rank = rng.randint(1, 3)
    lead = [rng.choice([0, 1, rng.randint(1, 40), rng.randint(40, 300)]) if i == 0 else rng.randint(1, 5)
            for i in range(rank - 1)]
    return dict(lead=lead, k=_dims(rng, hi=256), n=_dims(rng, hi=256), bias=rng.random() < 0.8,
                alpha=rng.choice([1.0, rng.uniform(-2, 2)]), x_layout=rng.choice(["nchw", "strided", "offset"]),
                r_layout=rng.choice(["nchw", "strided", "offset"]), dtype=str(_dtype(rng))[6:],
                special=_special(rng), wants=_wants(rng, 4), seed=rng.randrange(2**31))


def _linear_residual_operands(c, device, special=True):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make(c["lead"] + [c["k"]], dtype, device, c["x_layout"], g, special=c["special"] if special else 0)
    w = (torch.randn(c["n"], c["k"], generator=g) / c["k"] ** 0.5).to(device, dtype)
    b = torch.randn(c["n"], generator=g).to(device, dtype) if c["bias"] else None
    r = make(c["lead"] + [c["n"]], dtype, device, c["r_layout"], g)
    return dtype, [x, w, b, r]


def _linear_residual_formula(alpha):
    return lambda x, w, b, r: r + alpha * F.linear(x, w) + (b if b is not None else 0)


def run_linear_residual(c, device):
    """residual + alpha x W^T + b (one rounding) against float64 and PyTorch's own in the dtype."""
    dtype, t = _linear_residual_operands(c, device)
    y = ops.linear_residual(t[0], t[1], t[2], t[3], c["alpha"])
    f = _linear_residual_formula(c["alpha"])
    ref = f(*map(d64, t))
    own = _own(f, dtype, "cpu", *[None if v is None else v.cpu() for v in t])
    fail = compare("y", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or y.device != t[0].device):
        fail = f"y: {y.dtype} on {y.device}"
    return fail


def run_linear_residual_backward(c, device):
    """linear_residual's autograd (cuBLAS / ATen GEMMs) against float64."""
    dtype, t = _linear_residual_operands(c, device, special=False)
    gy = make(c["lead"] + [c["n"]], dtype, device, "nchw", torch.Generator().manual_seed(c["seed"] + 1),
              special=c["special"])
    return autograd_case(lambda x, w, b, r: ops.linear_residual(x, w, b, r, c["alpha"]),
                         _linear_residual_formula(c["alpha"]), t, c["wants"], [gy], dtype,
                         ["grad_x", "grad_weight", "grad_bias", "grad_residual"])


def draw_scale_samples(rng):
    rank = rng.randint(1, 4)
    shape = [_batch(rng)] + [rng.choice([1, 2, 3, 8, rng.randint(1, 70)]) for _ in range(rank - 1)]
    return dict(shape=shape, dtype=str(_dtype(rng))[6:], layout=rng.choice(LAYOUTS),
                keep=rng.choice([None, 0.9, 0.5]), special=_special(rng), seed=rng.randrange(2**31))


def _scale_operands(c, device, special):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make(c["shape"], dtype, device, c["layout"], g, special=special)
    n = c["shape"][0]
    if c["keep"] is None:
        scale = torch.randn(n, generator=g)
    else:  # a drop path's mask / keep_prob
        scale = (torch.rand(n, generator=g) < c["keep"]).float() / c["keep"]
    return dtype, x, scale.to(device)


def _scale_formula(x, scale):
    return x * scale.to(x.dtype).view((-1,) + (1,) * (x.dim() - 1))


def run_scale_samples(c, device):
    """x[n] * scale[n] (float32, rounded once) against float64 and PyTorch's own in the dtype."""
    dtype, x, scale = _scale_operands(c, device, c["special"])
    y = ops.scale_samples(x, scale)
    ref = _scale_formula(d64(x), d64(scale))
    fail = compare("y", y, ref, _own(lambda x_: _scale_formula(x_, scale), dtype, device, x), dtype)
    if not fail and (y.dtype != dtype or y.shape != x.shape):
        fail = f"y: {y.dtype} {tuple(y.shape)}"
    return fail


def run_scale_samples_backward(c, device):
    """Its autograd (the same multiply on the gradient; scale gets none)."""
    dtype, x, scale = _scale_operands(c, device, 0)
    gy = make(c["shape"], dtype, device, c["layout"], torch.Generator().manual_seed(c["seed"] + 1),
              special=c["special"])
    return autograd_case(lambda x_, s_: ops.scale_samples(x_, s_), _scale_formula, [x, scale], [True, False], [gy],
                         dtype, ["grad_x", "grad_scale"])


def draw_conv_embed(rng):
    c = rng.choice([1, 2, 3, 3, 4])
    if rng.random() < 0.8:  # the kernel's shapes: C * R <= 32, S <= 8, K 32/64/128
        r = rng.choice([r for r in (1, 2, 3, 4, 5, 7) if c * r <= 32])
        s = rng.choice([r, rng.randint(1, 8)])
        k = rng.choice([32, 64, 128])
    else:
        r, s, k = rng.randint(1, 9), rng.randint(1, 9), _dims(rng, hi=72)
    stride, pad = rng.randint(1, 4), rng.randint(0, 3)
    h, w = rng.randint(max(1, r - 2 * pad), 24), rng.randint(max(1, s - 2 * pad), 24)
    return dict(n=_batch(rng), c=c, h=h, w=w, k=k, r=r, s=s, stride=stride, pad=pad, dtype=str(_dtype(rng))[6:],
                bias=rng.random() < 0.8, ln=rng.random() < 0.7, ln_affine=rng.random() < 0.8,
                x_layout=rng.choice(LAYOUTS), special=_special(rng), wants=_wants(rng, 5), seed=rng.randrange(2**31))


def _embed_operands(c, device, special):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    x = make((c["n"], c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g, special=special)
    wt = make((c["k"], c["c"], c["r"], c["s"]), dtype, device, "nchw", g, scale=(c["c"] * c["r"] * c["s"]) ** -0.5)
    b = make((c["k"],), dtype, device, "nchw", g, scale=0.5) if c["bias"] else None
    aff = c["ln"] and c["ln_affine"]
    lw = (torch.rand(c["k"], generator=g) + 0.5).to(device, dtype) if aff else None
    lb = torch.randn(c["k"], generator=g).to(device, dtype) if aff else None
    return dtype, [x, wt, b, lw, lb]


def _embed_formula(c, taps=False):
    """conv_embed's composite; taps: the conv as conv2d_taps (float64: autograd_case's exact_fn)."""
    def formula(x, wt, b, lw, lb):
        if taps:
            t = conv2d_taps(x, wt, c["stride"], c["pad"])
            t = t if b is None else t + b.view(1, -1, 1, 1)
        else:
            t = F.conv2d(x, wt, b, c["stride"], c["pad"])
        t = t.flatten(2).transpose(1, 2)
        return F.layer_norm(t, (t.shape[-1],), lw, lb, 1e-5) if c["ln"] else t
    return formula


def _embed_op(c):
    return lambda x, wt, b, lw, lb: ops.conv_embed(x, wt, b, c["stride"], c["pad"], c["ln"], lw, lb)


def run_conv_embed(c, device):
    """The conv's tokens [LayerNorm over the channels] (float32 accumulators, one rounding)
    against float64 and PyTorch's own conv [and LayerNorm] in the dtype."""
    dtype, t = _embed_operands(c, device, c["special"])
    y = _embed_op(c)(*t)
    f = _embed_formula(c)
    ref = f(*map(d64, t))
    own = _own(f, dtype, device, *t)
    fail = compare("tokens", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or not y.is_contiguous()):
        fail = f"tokens: {y.dtype} / not contiguous"
    return fail


def run_conv_embed_backward(c, device):
    """conv_embed's autograd (the conv and LayerNorm recomputed in float32 by ATen)."""
    dtype, t = _embed_operands(c, device, 0)
    p = (c["h"] + 2 * c["pad"] - c["r"]) // c["stride"] + 1
    q = (c["w"] + 2 * c["pad"] - c["s"]) // c["stride"] + 1
    gy = make((c["n"], p * q, c["k"]), dtype, device, "nchw", torch.Generator().manual_seed(c["seed"] + 1),
              special=c["special"])
    # NaN/Inf in grad_y: the weight gradient's class where they meet the padding is the
    # implementation's (conv2d_taps; the CPU's bfloat16 channels_last conv skips the padding,
    # float64 and PyTorch's own NCHW multiply it in), F.conv2d's admissible
    # ... and where they cross a LayerNorm row, the classes of its gradients are those of the
    # backward's contract, ATen's LayerNorm backward in float32 (autograd_case's float32_classes)
    return autograd_case(_embed_op(c), _embed_formula(c), t, c["wants"], [gy], dtype,
                         ["grad_input", "grad_weight", "grad_bias", "grad_ln_weight", "grad_ln_bias"],
                         exact_fn=_embed_formula(c, taps=True), float32_classes=c["ln"] and c["special"] > 0)


OPS = {
    "layer_norm_rows": (draw_layer_norm_rows, run_layer_norm_rows, ["layer_norm_rows"]),
    "layer_norm_rows_backward": (draw_layer_norm_rows_backward, run_layer_norm_rows_backward,
                                 ["layer_norm_rows_backward"]),
    "dw_conv3x3_tokens": (draw_dw_conv3x3_tokens, run_dw_conv3x3_tokens, ["dw_conv3x3_tokens"]),
    "dw_conv3x3_tokens_backward": (draw_dw_conv3x3_tokens_backward, run_dw_conv3x3_tokens_backward,
                                   ["dw_conv3x3_tokens_backward_input"]),
    "layer_norm_dw_conv3x3_tokens": (draw_layer_norm_dw_conv3x3_tokens, run_layer_norm_dw_conv3x3_tokens,
                                     ["layer_norm_dw_conv3x3_tokens"]),
    "layer_norm_dw_conv3x3_tokens_backward": (draw_layer_norm_dw_conv3x3_tokens_backward,
                                              run_layer_norm_dw_conv3x3_tokens_backward,
                                              ["dw_conv3x3_tokens_backward_input"]),
    "linear_silu": (draw_linear_silu, run_linear_silu, ["linear_silu"]),
    "linear_silu_backward": (draw_linear_silu_backward, run_linear_silu_backward, []),
    "linear_residual": (draw_linear_residual, run_linear_residual, ["linear_residual"]),
    "linear_residual_backward": (draw_linear_residual, run_linear_residual_backward, []),
    "scale_samples": (draw_scale_samples, run_scale_samples, ["scale_samples"]),
    "scale_samples_backward": (draw_scale_samples, run_scale_samples_backward, []),
    "conv_embed": (draw_conv_embed, run_conv_embed, ["conv_embed"]),
    "conv_embed_backward": (draw_conv_embed, run_conv_embed_backward, []),
}
