"""Fuzz cases of the conv ops (conv2d_fused, conv2d_b2b, conv2d_dgrad / wgrad, relu_backward,
space_to_depth_conv and its weight gradient) and their autograd backward passes; test_fuzz.py
runs them (the framework: _fuzz.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from cutlass_ops import ops
from _fuzz import (LAYOUTS, UNIT, _batch, _dims, _dtype, _own, _special, _wants, autograd_case, compare,
                   conv2d_taps, conv2d_weight_taps, d64, make, round_st)
from _fuzz_se import _se_formula

def draw_conv2d_fused(rng):
    r, s = rng.choice([(1, 1), (3, 3), (5, 5), (1, 3), (3, 1), (2, 2)])
    stride, pad = rng.randint(1, 3), rng.randint(0, 2)
    h, w = rng.randint(max(1, r - 2 * pad), 20), rng.randint(max(1, s - 2 * pad), 20)
    return dict(n=_batch(rng), c=_dims(rng), k=_dims(rng), h=h, w=w, r=r, s=s, stride=stride, pad=pad,
                dtype=str(_dtype(rng))[6:], bias=rng.choice(["vec", "scalar", None]), residual=rng.random() < 0.5,
                scale=rng.random() < 0.5, post_bias=rng.random() < 0.5, relu=rng.random() < 0.5,
                x_layout=rng.choice(LAYOUTS), w_layout=rng.choice(LAYOUTS), r_layout=rng.choice(LAYOUTS),
                special=_special(rng), seed=rng.randrange(2**31), silu=rng.random() < 0.25)


def _fused_operands(c, device, special=True):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, k, stride, pad = c["n"], c["k"], c["stride"], c["pad"]
    p = (c["h"] + 2 * pad - c["r"]) // stride + 1
    q = (c["w"] + 2 * pad - c["s"]) // stride + 1
    x = make((n, c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g, special=c["special"] if special else 0)
    wt = make((k, c["c"], c["r"], c["s"]), dtype, device, c["w_layout"], g, scale=(c["c"] * c["r"] * c["s"]) ** -0.5)
    bias = {"vec": make((k,), torch.float32, device, "nchw", g), "scalar": make((), torch.float32, device, "nchw", g),
            None: None}[c["bias"]]
    res = make((n, k, p, q), dtype, device, c["r_layout"], g) if c["residual"] else None
    scale = (torch.rand((), generator=g) + 0.5).to(device) if c["scale"] else None
    post = make((), torch.float32, device, "nchw", g) if c["post_bias"] else None
    return dtype, x, wt, bias, res, scale, post


def _fused_formula(c, mask=None, taps=False):
    """conv2d_fused's composite; with ``mask`` (the op's ReLU mask) the ReLU keeps where it is set (a NaN gradient elsewhere gives 0).
    taps: the conv as conv2d_taps (its zero padding left out of the sums) with the scale
    folded into the weight: d scale = <w, dL/dw'> as the op's conv2d_wgrad computes it, which is
    finite where its weight gradient skips the padding (s * conv would multiply a NaN
    gradient by a conv output that is exactly 0 at an output reading only padding)."""
    silu = c.get("silu") and not c["relu"]
    stride, pad = c["stride"], c["pad"]

    def formula(x_, w_, b_, r_, s_, pb_):
        if taps:
            y = conv2d_taps(x_, w_ * s_.to(w_.dtype) if s_ is not None else w_, stride, pad)
        else:
            y = F.conv2d(x_, w_, None, stride, pad)
        if s_ is not None and not taps:
            y = y * s_.to(y.dtype)
        if b_ is not None:
            y = y + (b_.to(y.dtype).view(1, -1, 1, 1) if b_.dim() == 1 else b_.to(y.dtype))
        if r_ is not None:
            y = y + r_.to(y.dtype)
        if c["relu"]:
            y = torch.relu(y) if mask is None else torch.where(mask.to(y.device), y, 0)
        elif silu:
            y = F.silu(y)
        return y + pb_.to(y.dtype) if pb_ is not None else y
    return formula


def run_conv2d_fused(c, device):
    dtype, x, wt, bias, res, scale, post = _fused_operands(c, device)
    stride, pad = c["stride"], c["pad"]
    silu = bool(c.get("silu")) and not c["relu"]
    out = cutlass_ops.conv2d_fused(x, wt, bias, res, stride, pad, scale, post, c["relu"], silu)
    formula = _fused_formula(c)
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
    # G with the zero padding left out of the sums; F.conv2d's G (the padding's zeros times a
    # NaN/Inf of dy give NaN) is as right: its NaN/Inf classes are admissible (conv2d_taps)
    g = conv2d_weight_taps(d64(x), wt.shape, d64(dy), c["stride"], c["pad"])
    g_pad = conv2d_weight(d64(x), wt.shape, d64(dy), c["stride"], c["pad"])
    own_g = _own(lambda x_, dy_: conv2d_weight(x_, wt.shape, dy_, c["stride"], c["pad"]), dtype, device, x, dy)
    alt = conv2d_weight(x.float(), wt.shape, dy.float(), c["stride"], c["pad"]).double() * s64 if device == "cpu" else None
    fail = compare("grad_weight", dw, g * s64, own_g.double().cpu() * s64, dtype, alt=[alt, g_pad * s64])
    if fail:
        return fail
    # d scale = <w, G>, which may cancel: its error relative to sum |w * G|.
    want = (d64(wt) * g).sum()
    if not torch.isfinite(want):  # NaN/Inf placement: checked on grad_weight above
        return None
    want_pad = (d64(wt) * g_pad).sum()
    if not torch.isfinite(want_pad) and (torch.isnan(ds) or ds.double().cpu() == want_pad):
        return None  # G multiplied the padding's zeros by a NaN/Inf of dy (admissible, above)
    mag = (d64(wt) * g).abs().sum().clamp_min(1e-30)
    err = (ds.double().cpu() - want).abs() / mag
    own_err = ((d64(wt) * own_g.double().cpu()).sum() - want).abs() / mag
    if not torch.isfinite(own_err):  # torch 2.11.0's CPU bf16 G held NaN (fuzz seed 22, case 563; 2.14.1 not)
        own_err = torch.zeros((), dtype=torch.float64)
    bound = 2 * own_err + 4 * UNIT[dtype] + 1e-5
    return None if err <= bound else f"grad_scale: error {err.item():.3e} > {bound.item():.3e}"


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



def _relu_mask(out, post, dtype):
    """The ReLU mask the ops' backward reads from the saved output (relu_backward's contract)."""
    return out != post.to(dtype) if post is not None else out > 0


def draw_conv2d_fused_backward(rng):
    d = draw_conv2d_fused(rng)
    d["wants"] = _wants(rng, 6)  # x, weight, bias, residual, scale, post_bias
    return d


def run_conv2d_fused_backward(c, device):
    """conv2d_fused's autograd backward (relu_backward, conv2d_dgrad, conv2d_wgrad, the SiLU's
    recompute) against float64 autograd of the composite with the op's own ReLU mask."""
    dtype, x, wt, bias, res, scale, post = _fused_operands(c, device, special=False)
    stride, pad, relu = c["stride"], c["pad"], c["relu"]
    silu = bool(c.get("silu")) and not relu
    with torch.no_grad():
        out = cutlass_ops.conv2d_fused(x, wt, bias, res, stride, pad, scale, post, relu, silu)
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grad = make(out.shape, dtype, device, c["r_layout"], g, special=c["special"])
    mask = _relu_mask(out, post, dtype) if relu else None

    def op_fn(x_, w_, b_, r_, s_, pb_):
        return cutlass_ops.conv2d_fused(x_, w_, b_, r_, stride, pad, s_, pb_, relu, silu)
    # NaN/Inf in grad: the weight gradient's class where they meet the padding is the
    # implementation's (conv2d_taps): the reference skips the padding, F.conv2d's classes admissible
    return autograd_case(op_fn, _fused_formula(c, mask), [x, wt, bias, res, scale, post], c["wants"], [grad],
                         dtype, ["grad_input", "grad_weight", "grad_bias", "grad_residual", "grad_scale",
                                 "grad_post_bias"], exact_fn=_fused_formula(c, mask, taps=True))


def draw_conv2d_b2b_backward(rng):
    d = draw_conv2d_b2b(rng)
    d["special"] = 0
    d["wants"] = _wants(rng, 5)  # x, w0, b0, w1, b1
    return d


def run_conv2d_b2b_backward(c, device):
    """conv2d_b2b's autograd backward (ATen's recompute of both convs, the first rounded to the
    dtype) against float64 autograd of the composite with the ReLU masks of a float32 recompute
    (the op's own, up to float32 ties)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, k0, k1, r, stride, pad = c["n"], c["k0"], c["k1"], c["r"], c["stride"], c["pad"]
    x = make((n, c["c"], c["h"], c["w"]), dtype, device, c["x_layout"], g)
    w0 = make((k0, c["c"], r, r), dtype, device, c["w_layout"], g, scale=(c["c"] * r * r) ** -0.5)
    w1 = make((k1, k0, 1, 1), dtype, device, c["w_layout"], g, scale=k0 ** -0.5)
    b0 = make((k0,), dtype, device, "nchw", g, scale=0.5) if c["bias"] else None
    b1 = make((k1,), dtype, device, "nchw", g, scale=0.5) if c["bias"] else None
    f32 = [None if t is None else t.detach().float().cpu() for t in (x, w0, b0, w1, b1)]
    y0 = F.conv2d(f32[0], f32[1], f32[2], stride, pad)
    m0 = y0 > 0 if c["relu0"] else None
    y0 = (torch.relu(y0) if c["relu0"] else y0).to(dtype).float()
    y1 = F.conv2d(y0, f32[3], f32[4])
    m1 = y1 > 0 if c["relu1"] else None
    grad = make(y1.shape, dtype, device, "channels_last", torch.Generator().manual_seed(c["seed"] + 1))

    def ref_fn(x_, w0_, b0_, w1_, b1_):
        y = F.conv2d(x_, w0_, b0_, stride, pad)
        y = torch.where(m0.to(y.device), y, 0) if m0 is not None else y
        y = round_st(y, dtype)
        y = F.conv2d(y, w1_, b1_)
        return torch.where(m1.to(y.device), y, 0) if m1 is not None else y

    def op_fn(x_, w0_, b0_, w1_, b1_):
        return cutlass_ops.conv2d_b2b(x_, w0_, b0_, w1_, b1_, stride, pad, c["relu0"], c["relu1"])
    return autograd_case(op_fn, ref_fn, [x, w0, b0, w1, b1], c["wants"], [grad], dtype,
                         ["grad_input", "grad_w0", "grad_b0", "grad_w1", "grad_b1"], slack=2.0)


def draw_space_to_depth_conv_backward(rng):
    d = draw_space_to_depth_conv(rng)
    d["wants"] = _wants(rng, 3)  # x, weight, post_bias
    return d


def run_space_to_depth_conv_backward(c, device):
    """space_to_depth_conv's autograd backward: the weight-gradient kernel when x needs no
    gradient, the ATen GEMMs after relu_backward when it does."""
    dtype, x, wt, pb = _s2d_operands(c, device, special=False)
    with torch.no_grad():
        out = cutlass_ops.space_to_depth_conv(x, wt, pb, relu=c["relu"])
    grad = make(out.shape, dtype, device, c["w_layout"], torch.Generator().manual_seed(c["seed"] + 1),
                special=c["special"])
    mask = _relu_mask(out, pb, dtype) if c["relu"] else None

    def ref_fn(x_, w_, pb_):
        y = F.conv2d(_s2d(x_), w_)
        y = torch.where(mask.to(y.device), y, 0) if mask is not None else y
        return y + pb_.to(y.dtype) if pb_ is not None else y
    return autograd_case(lambda x_, w_, pb_: cutlass_ops.space_to_depth_conv(x_, w_, pb_, relu=c["relu"]), ref_fn,
                         [x, wt, pb], c["wants"], [grad], dtype, ["grad_input", "grad_weight", "grad_post_bias"])


def draw_conv2d_fused_se_gate(rng):
    """Half the cases in the one kernel's class (fp16/bf16, 16x16 maps, C = K = 64, 1-16 hidden
    units), the rest anywhere (the two kernels it fuses, or ATen)."""
    if rng.random() < 0.5:
        c = k = 64
        h = w = 16
        r = rng.randint(1, 16)
        dtype = rng.choice(["float16", "bfloat16"])
    else:
        c, k, h, w, r = _dims(rng), _dims(rng), rng.randint(1, 12), rng.randint(1, 12), rng.randint(1, 8)
        dtype = str(_dtype(rng))[6:]
    return dict(n=_batch(rng), c=c, k=k, h=h, w=w, r=r, dtype=dtype, avgpool=rng.random() < 0.5,
                scale=rng.random() < 0.75, idb=rng.random() < 0.5, pb=rng.random() < 0.5, hb=rng.random() < 0.5,
                x_layout=rng.choice(LAYOUTS), w_layout=rng.choice(LAYOUTS), i_layout=rng.choice(LAYOUTS),
                special=_special(rng), seed=rng.randrange(2**31))


def _se_conv_operands(c, device, special=True):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    n, ch, k, r = c["n"], c["c"], c["k"], c["r"]
    x = make((n, ch, c["h"], c["w"]), dtype, device, c["x_layout"], g, special=c["special"] if special else 0)
    wt = make((k, ch, 3, 3), dtype, device, c["w_layout"], g, scale=(9 * ch) ** -0.5)
    idn = make((n, k, c["h"], c["w"]), dtype, device, c["i_layout"], g)
    excite = [make((r, k), torch.float32, device, "nchw", g, scale=k ** -0.5), make((r,), torch.float32, device, "nchw", g),
              make((k, r), torch.float32, device, "nchw", g, scale=r ** -0.5), make((k,), torch.float32, device, "nchw", g)]
    scale = (torch.rand((), generator=g) + 0.5).to(device) if c["scale"] else None
    idb, pb, hb = (make((), torch.float32, device, "nchw", g, scale=0.3) if c[key] else None for key in ("idb", "pb", "hb"))
    return dtype, [x, wt, scale, idn, *excite, idb, pb, hb]


def _se_conv_formula(x, wt, scale, idn, w1, b1, w2, b2, idb, pb, hb):
    """conv2d_fused_se_gate's composite in the tensors' dtype (PyTorch's own: conv2d, then the gate)."""
    h = F.conv2d(x, wt, None, 1, 1)
    return _se_formula(h * scale.to(h.dtype) if scale is not None else h, idn, w1, b1, w2, b2, idb, pb, hb, False)[0]


def run_conv2d_fused_se_gate(c, device):
    """se_gate of scale * conv3x3(x, w) + h_bias against float64 and PyTorch's own in the dtype;
    the pooled map against the pool of the op's own output."""
    dtype, t = _se_conv_operands(c, device)
    got = ops.conv2d_fused_se_gate(*t[:8], t[8], t[9], avgpool=c["avgpool"], h_bias=t[10])
    out, pooled = got if c["avgpool"] else (got, None)
    ref = _se_conv_formula(*map(d64, t))
    own = _own(lambda x_, w_, i_: _se_conv_formula(x_, w_, t[2], i_, *t[4:]), dtype, device, t[0], t[1], t[3])
    fail = compare("out", out, ref, own, dtype)
    if not fail and (out.dtype != dtype or not out.is_contiguous(memory_format=torch.channels_last)):
        fail = f"out: {out.dtype} / not channels_last"
    if fail or not c["avgpool"]:
        return fail
    want = F.avg_pool2d(d64(out), 3, 2, 1, count_include_pad=True)
    return compare("pooled", pooled, want, F.avg_pool2d(out.float(), 3, 2, 1, count_include_pad=True).to(dtype),
                   dtype)


OPS = {
    "conv2d_fused": (draw_conv2d_fused, run_conv2d_fused, ["conv2d_fused"]),
    "conv2d_fused_backward": (draw_conv2d_fused_backward, run_conv2d_fused_backward,
                              ["relu_backward", "conv2d_dgrad", "conv2d_wgrad"]),
    "conv2d_fused_se_gate": (draw_conv2d_fused_se_gate, run_conv2d_fused_se_gate, ["conv2d_fused_se_gate"]),
    "conv2d_b2b": (draw_conv2d_b2b, run_conv2d_b2b, ["conv2d_b2b"]),
    "conv2d_b2b_backward": (draw_conv2d_b2b_backward, run_conv2d_b2b_backward, []),
    "conv2d_dgrad": (draw_conv_backward, run_conv2d_dgrad, ["conv2d_dgrad"]),
    "conv2d_wgrad": (draw_conv_backward, run_conv2d_wgrad, ["conv2d_wgrad"]),
    "relu_backward": (draw_relu_backward, run_relu_backward, ["relu_backward"]),
    "space_to_depth_conv": (draw_space_to_depth_conv, run_space_to_depth_conv, ["space_to_depth_conv"]),
    "space_to_depth_conv_weight_grad": (draw_space_to_depth_conv, run_space_to_depth_conv_weight_grad,
                                        ["space_to_depth_conv_weight_grad"]),
    "space_to_depth_conv_backward": (draw_space_to_depth_conv_backward, run_space_to_depth_conv_backward,
                                     ["space_to_depth_conv_weight_grad", "relu_backward"]),
}
