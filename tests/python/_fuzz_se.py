"""Fuzz cases of the SE gate ops (se_gate, se_squeeze, se_gate_apply, se_gate_backward and the
autograd of the split halves), the GIoU loss and FusedMLP (forward and backward); test_fuzz.py
runs them (the framework: _fuzz.py)."""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops import ops, paths
from _fuzz import (DTYPES, LAYOUTS, UNIT, _batch, _dtype, _own, _relayout, _special, _wants, autograd_case, compare,
                   d64, make, make_like, round_st)


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
    from test_backward_kernels import _kink_flips, _se_gate_backward_reference
    dtype, h, idn, params, (idb, pb, hb) = _se_operands(c, device)
    got_fwd = cutlass_ops.se_gate(h, idn, *params, idb, pb, avgpool=c["avgpool"], h_bias=hb)
    out = got_fwd[0] if c["avgpool"] else got_fwd
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grad_out = make(h.shape, dtype, device, c["i_layout"], g)
    n, ch, hh, ww = h.shape
    grad_pooled = make((n, ch, (hh + 1) // 2, (ww + 1) // 2), dtype, device, "channels_last", g) if c["avgpool"] else None
    got = ops.se_gate_backward(grad_out, grad_pooled, h, out, *params, pb, hb)
    # A hidden unit within float32 rounding of ReLU's kink may take either side (_kink_flips).
    first = None
    for flip in _kink_flips(h, params, hb) if h.numel() else [None]:
        want, g_scale = _se_gate_backward_reference(grad_out, grad_pooled, h, out, params, pb, hb, flip=flip)
        fail = _se_gate_backward_fail(got, want, g_scale, dtype)
        if fail is None:
            return None
        first = first or fail
    return first


def _se_gate_backward_fail(got, want, g_scale, dtype):
    """The first of se_gate_backward's gradients off its bound against one float64 reference, or None."""
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
    return _compare_giou(loss, (g1, g2), ref, own, dtype)


def _compare_giou(loss, grads, ref, own, dtype):
    """A GIoU loss and its two box gradients against float64's (ref) and PyTorch's float32 run
    (own: (loss, grad1, grad2)); the loss is float32, so PyTorch's float32 run is its yardstick."""
    fail = compare("loss", loss, ref[0], own[0], torch.float32, slack=4.0)
    for name, got, want, theirs in zip(("grad_boxes1", "grad_boxes2"), grads, ref[1:], own[1:]):
        if fail:
            return fail
        if got is None:
            fail = None if want is None or not want.numel() else f"{name}: no gradient"
            continue
        fail = compare(name, got, want, theirs.to(dtype), dtype, slack=4.0)
    return fail


def draw_giou_loss_batched(rng):
    """giou_loss_padded and giou_loss_ragged: B images of up to M boxes, which boxes are valid
    drawn (counts, a mask, or all; ragged: offsets, a tail left out), NaN in the padding."""
    b = 0 if rng.random() < 0.05 else rng.randint(1, 6)
    m = 0 if rng.random() < 0.05 else rng.randint(1, 30)
    return dict(b=b, m=m, valid=rng.choice(["counts", "mask", "all"]), dtype=str(_dtype(rng))[6:],
                reduction=rng.choice(["none", "mean", "sum"]), degenerate=rng.random() < 0.2,
                nan_padding=rng.random() < 0.5, special=_special(rng), seed=rng.randrange(2**31))


def _giou_batched_case(c, g):
    """(boxes1, boxes2, valid) float64 on the CPU, the padded (B, M, 4) layout; NaN in invalid
    slots when nan_padding, and (special) one NaN somewhere."""
    b, m = c["b"], c["m"]
    lo = torch.rand(b, m, 2, generator=g, dtype=torch.float64) * 10
    b1 = torch.cat([lo, lo + torch.rand(b, m, 2, generator=g, dtype=torch.float64) * 5 + 0.5], -1)
    lo = torch.rand(b, m, 2, generator=g, dtype=torch.float64) * 10
    size = torch.rand(b, m, 2, generator=g, dtype=torch.float64) * 5 + 0.5
    if c["degenerate"]:
        size = size * (torch.rand(b, m, 2, generator=g) < 0.5)
    b2 = torch.cat([lo, lo + size], -1)
    counts = torch.randint(0, m + 1, (b,), generator=g)
    valid = {"counts": torch.arange(m)[None, :] < counts[:, None], "mask": torch.rand(b, m, generator=g) < 0.7,
             "all": torch.ones(b, m, dtype=torch.bool)}[c["valid"]]
    if c["nan_padding"]:
        b1[~valid] = float("nan")
        b2[~valid] = float("nan")
    if c["special"] and b1.numel():
        b1.view(-1)[int(torch.randint(b1.numel(), (1,), generator=g))] = float("nan")
    return b1, b2, valid, counts


def _giou_batched_check(loss, grads, b1, b2, valid, up, c, dtype):
    """loss and its gradients against float64 (and PyTorch's float32) of the per-box formula
    on the valid boxes only, zero elsewhere: padding contributes nothing, NaN or not."""
    def reference(x1, x2, work):
        x1 = x1.detach().to(work).requires_grad_()
        x2 = x2.detach().to(work).requires_grad_()
        per = torch.zeros(valid.shape, dtype=work).index_put((valid,), _giou_formula(x1[valid], x2[valid]))
        out = {"none": per, "sum": per.sum(), "mean": per.sum() / max(int(valid.sum()), 1)}[c["reduction"]]
        r1, r2 = torch.autograd.grad(out, (x1, x2), up.to(work), allow_unused=True)
        return out.detach(), r1, r2
    return _compare_giou(loss, grads, reference(b1, b2, torch.float64), reference(b1, b2, torch.float32), dtype)


def run_giou_loss_padded(c, device):
    """giou_loss_padded: (B, M, 4) boxes, validity from counts, a mask or neither; loss and
    gradients."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    b1, b2, valid, counts = _giou_batched_case(c, g)
    x1 = b1.to(dtype).to(device).requires_grad_()
    x2 = b2.to(dtype).to(device).requires_grad_()
    kw = {"counts": {"counts": counts.to(device)}, "mask": {"mask": valid.to(device)}, "all": {}}[c["valid"]]
    loss = cutlass_ops.giou_loss_padded(x1, x2, reduction=c["reduction"], **kw)
    up = torch.randn(loss.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(loss, (x1, x2), up.to(loss.dtype).to(device), allow_unused=True)
    return _giou_batched_check(loss, grads, b1.to(dtype), b2.to(dtype), valid, up, c, dtype)


def run_giou_loss_ragged(c, device):
    """giou_loss_ragged: the same boxes concatenated (T = B*M, 4), images [offsets[b],
    offsets[b+1]) with offsets[0] > 0 or a tail left out at random; loss and gradients."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    b1, b2, _, _ = _giou_batched_case(c, g)
    t = c["b"] * c["m"]
    b1, b2 = b1.reshape(t, 4), b2.reshape(t, 4)
    cuts = torch.sort(torch.randint(0, t + 1, (c["b"] + 1,), generator=g)).values if c["valid"] != "all" else \
        torch.linspace(0, t, c["b"] + 1, dtype=torch.float64).round().long()
    valid = (torch.arange(t) >= cuts[0]) & (torch.arange(t) < cuts[-1])
    if c["nan_padding"]:
        b1[~valid] = float("nan")
        b2[~valid] = float("nan")
    x1 = b1.to(dtype).to(device).requires_grad_()
    x2 = b2.to(dtype).to(device).requires_grad_()
    loss = cutlass_ops.giou_loss_ragged(x1, x2, cuts.to(device), reduction=c["reduction"])
    up = torch.randn(loss.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(loss, (x1, x2), up.to(loss.dtype).to(device), allow_unused=True)
    return _giou_batched_check(loss, grads, b1.to(dtype), b2.to(dtype), valid, up, c, dtype)


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
    """The forward against float64 (the gradients: run_fused_mlp_backward)."""
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    # float32 is tested as float32, on CUDA too, where it runs the same math as torch ops (a
    # fallback the path report names: the kernel takes float16/bfloat16), under float32's bound.
    fused, model, ref_model, x = _mlp_setup(c, device, dtype, g)
    with torch.no_grad():
        y = fused(x)
        own = model.to(device)(x)
        ref = ref_model(d64(x))
    fail = compare("y", y, ref, own, dtype)
    if not fail and (y.dtype != dtype or y.device != x.device):
        fail = f"y: {y.dtype} on {y.device}"
    return _mlp_path_note(fail, "fused_mlp", device)


def _mlp_path_note(fail, op, device):
    """The failure, naming the path that ran on CUDA (the kernel, or torch ops for float32)."""
    return fail if not fail or device != "cuda" else f"{fail} (path: {paths.last_path(op)})"


def _mlp_setup(c, device, dtype, g):
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
    return fused, model, ref_model, x



def draw_se_squeeze(rng):
    d = draw_se_gate(rng)
    d["wants"] = [True, rng.random() < 0.6]  # h, h_bias
    return d


def _squeeze_formula(h, hb):
    return (h + hb.to(h.dtype) if hb is not None else h).mean((2, 3))


def _squeeze_operands(c, device, special):
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    h = make((c["n"], c["c"], c["h"], c["w"]), dtype, device, c["h_layout"], g, special=special)
    hb = make((), torch.float32, device, "nchw", g, scale=0.3) if c["hb"] else None
    return dtype, h, hb


def run_se_squeeze(c, device):
    """mean_hw(h + h_bias) in h's dtype against float64 and PyTorch's own in the dtype."""
    dtype, h, hb = _squeeze_operands(c, device, c["special"])
    out = ops.se_squeeze(h, hb)
    ref = _squeeze_formula(d64(h), d64(hb))
    own = _own(lambda h_: _squeeze_formula(h_, hb), dtype, device, h)
    fail = compare("squeezed", out, ref, own, dtype)
    return fail or (None if out.dtype == dtype else f"squeezed: {out.dtype}")


def run_se_squeeze_backward(c, device):
    """se_squeeze's autograd (ATen's composite): grad_h = grad / (H W) everywhere, grad_h_bias its sum."""
    dtype, h, hb = _squeeze_operands(c, device, 0)
    grad = make((c["n"], c["c"]), dtype, device, "nchw", torch.Generator().manual_seed(c["seed"] + 1),
                special=c["special"])
    return autograd_case(lambda h_, hb_: ops.se_squeeze(h_, hb_), _squeeze_formula, [h, hb], c["wants"], [grad],
                         dtype, ["grad_h", "grad_h_bias"])


def draw_se_gate_apply(rng):
    d = draw_se_gate(rng)
    d["gate_dtype"] = rng.choice(["x", "float32"])
    d["wants"] = _wants(rng, 6)  # h, identity, gate, identity_bias, post_bias, h_bias
    return d


def _apply_operands(c, device, special=True):
    dtype, h, idn, _, (idb, pb, hb) = _se_operands(c, device)
    if not special and c["special"]:  # the same draw without the NaN/Inf
        c = dict(c, special=0)
        dtype, h, idn, _, (idb, pb, hb) = _se_operands(c, device)
    g = torch.Generator().manual_seed(c["seed"] + 2)
    gate = torch.rand((c["n"], c["c"]), generator=g).to(device, dtype if c["gate_dtype"] == "x" else torch.float32)
    return dtype, [h, idn, gate, idb, pb, hb]


def _apply_formula(dtype, avgpool, mask=None):
    """se_gate_apply's composite, the gate rounded to h's dtype; with ``mask`` (the op's ReLU
    mask, from its output) the ReLU keeps where it is set (a NaN gradient elsewhere gives 0)."""
    def formula(h, idn, gate, idb, pb, hb):
        hh = h + hb.to(h.dtype) if hb is not None else h
        y = hh * round_st(gate, dtype).to(h.dtype)[:, :, None, None] + idn
        if idb is not None:
            y = y + idb.to(y.dtype)
        y = torch.relu(y) if mask is None else torch.where(mask.to(y.device), y, 0)
        if pb is not None:
            y = y + pb.to(y.dtype)
        return (y, F.avg_pool2d(y, 3, 2, 1, count_include_pad=True)) if avgpool else y
    return formula


def _apply_op(avgpool):
    return lambda h, idn, gate, idb, pb, hb: ops.se_gate_apply(h, idn, gate, idb, pb, avgpool, hb)


def run_se_gate_apply(c, device):
    """relu((h + h_bias) * gate + identity + identity_bias) + post_bias [and its AvgPool2d]
    against float64 and PyTorch's own in the dtype."""
    dtype, t = _apply_operands(c, device)
    got = _apply_op(c["avgpool"])(*t)
    out, pooled = got if c["avgpool"] else (got, None)
    formula = _apply_formula(dtype, False)
    ref = formula(*map(d64, t))
    own = _own(lambda h_, i_: formula(h_, i_, *t[2:]), dtype, device, t[0], t[1])
    fail = compare("out", out, ref, own, dtype)
    if not fail and (out.dtype != dtype or not out.is_contiguous(memory_format=torch.channels_last)):
        fail = f"out: {out.dtype} / not channels_last"
    if fail or not c["avgpool"]:
        return fail
    want = F.avg_pool2d(d64(out), 3, 2, 1, count_include_pad=True)  # the pool of its own output
    return compare("pooled", pooled, want, F.avg_pool2d(out.float(), 3, 2, 1, count_include_pad=True).to(dtype),
                   dtype)


def run_se_gate_apply_backward(c, device):
    """se_gate_apply's autograd (ATen's composite, the ReLU mask from the saved output)."""
    dtype, t = _apply_operands(c, device, special=False)
    with torch.no_grad():
        got = _apply_op(c["avgpool"])(*t)
    out = got[0] if c["avgpool"] else got
    mask = out != t[4].to(dtype) if t[4] is not None else out > 0
    g = torch.Generator().manual_seed(c["seed"] + 1)
    grads = [make(out.shape, dtype, device, c["i_layout"], g, special=c["special"])]
    if c["avgpool"]:
        grads.append(make(got[1].shape, dtype, device, "channels_last", g))
    return autograd_case(_apply_op(c["avgpool"]), _apply_formula(dtype, c["avgpool"], mask), t, c["wants"], grads,
                         dtype, ["grad_h", "grad_identity", "grad_gate", "grad_identity_bias", "grad_post_bias",
                                 "grad_h_bias"])


# FusedMLP's backward: the structures of MLP_POOL whose backward kernels it compiles on CUDA
MLP_BACKWARD_POOL = [0, 2, 3, 4]


def draw_fused_mlp_backward(rng):
    d = draw_fused_mlp(rng)
    d["structure"] = MLP_BACKWARD_POOL[d["structure"] % len(MLP_BACKWARD_POOL)]
    d["rows"] = min(d["rows"], 1000)
    d["special"] = 0
    return d


def run_fused_mlp_backward(c, device):
    """FusedMLP's gradients (the fused_mlp_backward op: the kernel for float16/bfloat16 on CUDA,
    torch ops for float32) against float64, under test_fused_mlp's gradient bounds: 2x
    PyTorch's own same-dtype error per gradient (or the forward's target), the weight and
    bias gradients measured on the scale of their summands (16-bit ReLU masks flip near
    zero; see _check_grads there)."""
    from test_fused_mlp import _check_grads
    dtype, g = getattr(torch, c["dtype"]), torch.Generator().manual_seed(c["seed"])
    fused, model, ref_model, x = _mlp_setup(c, device, dtype, g)
    model = model.to(device)
    try:
        _check_grads(f"pool[{c['structure']}]", fused, ref_model, x, dtype, model)
    except AssertionError as e:
        return _mlp_path_note(str(e).split("\n")[0], "fused_mlp_backward", device)
    return None


def mlp_kernel_ready(device):
    """None where FusedMLP's kernel can run (not CUDA: the CPU path needs none; CUDA: it builds
    pool[0]'s float16 kernel, which the fuzz compiles first anyway), else why not (no nvcc or
    NVRTC, a GPU before sm_80, a compile error): the CUDA fuzz of fused_mlp / fused_mlp_backward
    fails once with that reason instead of on its first 16-bit case."""
    if device != "cuda":
        return None
    case = dict(structure=0, rows=1, layout="contiguous", special=0)
    try:
        _mlp_setup(case, device, torch.float16, torch.Generator().manual_seed(0))[0].compile_kernel()
    except Exception as e:  # the compiler's or the driver's error, as it says it
        return f"FusedMLP could not build its kernel: {type(e).__name__}: {str(e).strip()}"
    return None


READY = {"fused_mlp": mlp_kernel_ready, "fused_mlp_backward": mlp_kernel_ready}


OPS = {
    "se_gate": (draw_se_gate, run_se_gate, ["se_gate"]),
    "se_gate_backward": (draw_se_gate_backward, run_se_gate_backward, ["se_gate_backward"]),
    "se_squeeze": (draw_se_squeeze, run_se_squeeze, ["se_squeeze"]),
    "se_squeeze_backward": (draw_se_squeeze, run_se_squeeze_backward, []),
    "se_gate_apply": (draw_se_gate_apply, run_se_gate_apply, ["se_gate_apply"]),
    "se_gate_apply_backward": (draw_se_gate_apply, run_se_gate_apply_backward, []),
    "giou_loss": (draw_giou_loss, run_giou_loss, []),
    "giou_loss_padded": (draw_giou_loss_batched, run_giou_loss_padded, []),
    "giou_loss_ragged": (draw_giou_loss_batched, run_giou_loss_ragged, []),
    "fused_mlp": (draw_fused_mlp, run_fused_mlp, ["fused_mlp"]),
    "fused_mlp_backward": (draw_fused_mlp_backward, run_fused_mlp_backward, ["fused_mlp_backward"]),
}
