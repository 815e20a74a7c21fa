"""The backward's CUDA ops (the ops' autograd formulas in cutlass_ops/ops/ use them): relu_backward (ReLU mask
from the saved output + the FixUp sums) and se_gate_backward (se_gate's whole backward,
its fused AvgPool2d(3, 2, 1) included), against float64 references."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, errors, fallback, poison_cuda_cache

LOW = [torch.float16, torch.bfloat16]


def _saved_output(shape, dtype, device, post_bias, rng):
    """An op output relu(z) + post_bias rounded once, as the kernels store it, and z."""
    z = torch.randn(shape, generator=rng, dtype=torch.float64)
    out = torch.relu(z.float()) + (post_bias.float() if post_bias is not None else 0.0)
    return out.to(dtype).to(device), z


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [fallback(torch.float32)])
@pytest.mark.parametrize("shape, channels_last", [((3, 64, 5, 7), True), ((2, 24, 9, 9), False),
                                                  ((1, 3, 5, 3), True), ((7, 13), False)])
@pytest.mark.parametrize("with_post_bias", [True, False])
def test_relu_backward(device, dtype, shape, channels_last, with_post_bias, rng):
    post_bias = (torch.rand((), generator=rng) + 0.25).to(device) if with_post_bias else None
    out, z = _saved_output(shape, dtype, device, post_bias.cpu() if with_post_bias else None, rng)
    grad = torch.randn(shape, generator=rng).to(dtype).to(device)
    if channels_last and len(shape) == 4:
        out = out.contiguous(memory_format=torch.channels_last)
    poison_cuda_cache(grad.numel() * grad.element_size())
    grad_z, sums = cutlass_ops.ops.relu_backward(grad, out, post_bias)
    # Reference: the mask as the output encodes it (an element whose z > 0 rounds to
    # post_bias is inactive there too; the ops document that), sums in float64.
    inactive = post_bias.to(dtype).double().cpu() if with_post_bias else 0.0
    active = out.double().cpu() != inactive if with_post_bias else out.double().cpu() > 0
    # Both sides exercised.  (0.15, not 0.3: the smallest shape has 45 elements, and fresh
    # seeds put fewer than 30% of them on one side about once in 150 draws.)
    assert active.float().mean() > 0.15 and (~active).float().mean() > 0.15
    ref = torch.where(active, grad.double().cpu(), 0.0)
    assert grad_z.shape == grad.shape and grad_z.dtype == dtype
    assert torch.equal(grad_z.double().cpu(), ref)  # masking is exact
    want = torch.stack([grad.double().cpu().sum(), ref.sum()])
    scale = grad.double().abs().sum().item()
    assert ((sums.double().cpu() - want).abs() / scale).max() < 1e-6, (sums, want)


@pytest.mark.parametrize("device", DEVICES)
def test_relu_backward_bad_input(device, rng):
    out = torch.randn(2, 8, 4, 4, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="grad shape"):
        cutlass_ops.ops.relu_backward(out[:1], out)
    with pytest.raises(ValueError, match="grad dtype"):
        cutlass_ops.ops.relu_backward(out.float(), out)
    with pytest.raises(ValueError, match="post_bias must be a scalar"):
        cutlass_ops.ops.relu_backward(out, out, torch.zeros(2, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_relu_backward_opcheck(device, rng):
    out = torch.randn(2, 8, 4, 4, generator=rng).half().to(device)
    grad = torch.randn(2, 8, 4, 4, generator=rng).half().to(device)
    torch.library.opcheck(torch.ops.cutlass_ops.relu_backward.default, (grad, out, torch.tensor(0.5, device=device)))


def _se_gate_backward_reference(grad_out, grad_pooled, h, out, params, post_bias, h_bias, term_scales=False,
                                flip=None):
    """float64 on the CPU, by autograd: the pool's gradient through F.avg_pool2d, the mask as
    the saved output encodes it (as in relu_backward), the rest through the SE gate's math.
    term_scales: also the scale of the excite weights' and biases' float32 rounding error: their
    gradients computed again from the magnitudes of everything that feeds them (|inputs|,
    |weights|, the same ReLU mask), so every sum or difference along the way (the squeeze, the
    hidden pre-activation, the sigmoid's slope, its input gradient, the batch sum) counts its
    terms' magnitudes rather than their cancelled result.
    flip: None, or a bool (N, R) tensor of hidden units whose ReLU mask is taken on the other
    side of the kink from float64's (_kink_flips)."""
    g = grad_out.double().cpu()
    if grad_pooled is not None:
        x = torch.zeros(h.shape, dtype=torch.float64, requires_grad=True)
        F.avg_pool2d(x, 3, 2, 1, count_include_pad=True).backward(grad_pooled.double().cpu())
        g = g + x.grad
    o = out.double().cpu()
    active = o != post_bias.to(out.dtype).double().cpu() if post_bias is not None else o > 0
    dy = torch.where(active, g, 0.0)
    h64 = h.double().cpu().requires_grad_()
    hb = (h_bias.double().cpu() if h_bias is not None else torch.zeros((), dtype=torch.float64)).requires_grad_()
    hh = h64 + hb
    w1, b1, w2, b2 = (p.double().cpu().requires_grad_() for p in params)
    squeezed = hh.mean((2, 3))
    pre1 = F.linear(squeezed, w1, b1)
    on = pre1.detach() > 0 if flip is None else (pre1.detach() > 0) ^ flip
    hidden = torch.where(on, pre1, 0.0)
    pre2 = F.linear(hidden, w2, b2)
    pre1.retain_grad()
    pre2.retain_grad()
    (hh * torch.sigmoid(pre2)[:, :, None, None]).backward(dy)
    want = [h64.grad, dy, w1.grad, b1.grad, w2.grad, b2.grad, dy.sum(), g.sum(), hb.grad]
    if not term_scales:
        return want, g.abs().sum()
    with torch.no_grad():
        g_mag = grad_out.double().cpu().abs()
        if grad_pooled is not None:  # the pool's gradient is a sum too
            x = torch.zeros(h.shape, dtype=torch.float64, requires_grad=True)
            with torch.enable_grad():
                F.avg_pool2d(x, 3, 2, 1, count_include_pad=True).backward(grad_pooled.double().cpu().abs())
            g_mag = g_mag + x.grad
        dy_mag = torch.where(active, g_mag, 0.0)
        hh_mag = h.double().cpu().abs() + hb.detach().abs()
        squeezed_mag = hh_mag.mean((2, 3))
        hidden_mag = torch.where(on, squeezed_mag @ w1.detach().abs().t() + b1.detach().abs(), 0.0)
        sig = torch.sigmoid(pre2)  # the slope sig * (1 - sig): 1 - sig cancels as sig -> 1
        d2 = (dy_mag * hh_mag).sum((2, 3)) * sig * (1 + sig)
        d1 = torch.where(on, d2 @ w2.detach().abs(), 0.0)
        scales = [d1.t() @ squeezed_mag, d1.sum(0), d2.t() @ hidden_mag, d2.sum(0)]
    return want, g.abs().sum(), scales


def _kink_flips(h, params, h_bias):
    """The ReLU masks of the excite MLP's hidden units the op may admissibly use: float64's
    first (None), then, for the units whose float64 pre-activation is within float32 rounding
    of the kink (2^-14 of the sum of its terms' magnitudes: the op sums the squeeze and the
    dot product in float32), each one and each pair of them taken on the other side."""
    hh = h.double().cpu() + (h_bias.double().cpu() if h_bias is not None else 0.0)
    w1, b1 = params[0].double().cpu(), params[1].double().cpu()
    pre1 = F.linear(hh.mean((2, 3)), w1, b1)
    magnitude = hh.abs().mean((2, 3)) @ w1.abs().t() + b1.abs()
    near = (pre1.abs() <= 2.0 ** -14 * magnitude).nonzero().tolist()
    yield None
    for k in (1, 2):
        for units in itertools.combinations(near, k):
            flip = torch.zeros(pre1.shape, dtype=torch.bool)
            for n, r in units:
                flip[n, r] = True
            yield flip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [fallback(torch.float32)])
@pytest.mark.parametrize("shape, pooled", [
    ((3, 64, 16, 16), True), ((2, 24, 9, 7), True), ((5, 512, 2, 2), False), ((1, 8, 1, 1), True),
    ((4, 128, 8, 8), False),
    ((2115, 512, 2, 2), False),  # large batch of small images: 2-8 images per CTA, the last CTA partial
    fallback((3, 12, 5, 5), True),  # C % 8 != 0: ATen
    ((2, 48, 6, 6), True)])  # an odd hidden width (R = 3)
@pytest.mark.parametrize("with_post_bias", [True, False])
@pytest.mark.parametrize("with_h_bias", [True, False])
def test_se_gate_backward(device, dtype, shape, pooled, with_post_bias, with_h_bias, rng):
    n, c, hh, ww = shape
    r = max(c // 16, 1)
    cl = torch.channels_last

    def rand(*size, scale=1.0):
        return (torch.randn(size, generator=rng) * scale).to(device)
    h = rand(*shape).to(dtype).contiguous(memory_format=cl)
    identity = rand(*shape).to(dtype).contiguous(memory_format=cl)
    # Random, non-zero excite weights and biases (the default init would hide bugs).
    params = [rand(r, c, scale=c ** -0.5), rand(r), rand(c, r, scale=r ** -0.5), rand(c)]
    h_bias = rand(scale=0.5) if with_h_bias else None
    post_bias = rand(scale=0.5) + 0.25 if with_post_bias else None
    identity_bias = rand()
    out = cutlass_ops.se_gate(h, identity, *params, identity_bias, post_bias, avgpool=pooled, h_bias=h_bias)
    out = out[0] if pooled else out
    grad_out = rand(*shape).to(dtype).contiguous(memory_format=cl)
    grad_pooled = rand(n, c, (hh + 1) // 2, (ww + 1) // 2).to(dtype).contiguous(memory_format=cl) if pooled else None
    poison_cuda_cache(2 * h.numel() * h.element_size())
    got = cutlass_ops.ops.se_gate_backward(grad_out, grad_pooled, h, out, *params, post_bias, h_bias)
    for gt in got[:2]:
        assert gt.dtype == dtype and gt.is_contiguous(memory_format=cl)
    for gt, p in zip(got[2:6], params):
        assert gt.dtype == torch.float32 and gt.shape == p.shape
    assert all(gt.dtype == torch.float32 and gt.dim() == 0 for gt in got[6:])
    # Within float32 rounding of ReLU's kink the op's mask of a hidden unit may differ from
    # float64's (one flip moved fc1_weight's gradient by 2e-3 at N=2115): either side passes.
    mismatches = []
    for flip in _kink_flips(h, params, h_bias):
        want, g_scale, term_scales = _se_gate_backward_reference(grad_out, grad_pooled, h, out, params, post_bias,
                                                                 h_bias, term_scales=True, flip=flip)
        mismatch = _se_gate_backward_mismatch(got, want, g_scale, term_scales, dtype)
        if mismatch is None:
            return
        mismatches.append(mismatch)
    pytest.fail(f"{mismatches[0]} (float64's mask; {len(mismatches) - 1} admissible flips near the kink tried)")


def _se_gate_backward_mismatch(got, want, g_scale, term_scales, dtype):
    """The first of se_gate_backward's gradients off its bound against the float64 reference
    (with its term scales), or None."""
    names = ["grad_h", "grad_identity", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "identity_bias",
             "post_bias", "h_bias"]
    # The two maps are rounded to dtype; the weights' and scalars' gradients are float32
    # sums of the same 16-bit inputs, so they sit far closer to float64.
    map_bound = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    # Rounding to a 16-bit dtype cannot beat its subnormal spacing (fp16: 6e-8): a seed sweep
    # drew grad_h around 1e-6 at (1, 8, 1, 1) fp16 (one active channel), 4.2e-3 off, each
    # element within half that spacing.
    spacing = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    for name, gt, wt in zip(names[:2], got[:2], want[:2]):
        rel, mx = errors(gt, wt)
        err = (gt.detach().double().cpu() - wt).norm().item()
        subnormal = err <= spacing * gt.numel() ** 0.5
        if not ((rel < map_bound or subnormal) and mx < 4 * map_bound):
            return f"{name}: relative error {rel:.3e}, max {mx:.3e} (bound {map_bound:g})"
    for name, gt, wt, scale in zip(names[2:6], got[2:6], want[2:6], term_scales):
        # float32 sums over the batch of the same 16-bit inputs: within 1e-4 of float64, or,
        # where the terms cancel, within 1e-6 of the sum of the terms' magnitudes (a wrong term
        # is off by about that sum).  CI once drew fc1_bias 1.08e-4 off (shape (3, 12, 5, 5),
        # one hidden unit; its terms' magnitudes summed to 1037x the result), and later, under
        # torch 2.14.1, fc2_weight 1.21e-4 off at (1, 8, 1, 1): a hidden unit that is itself a
        # cancelled sum; a seed sweep drew fc1_weight 1.24e-4 off, a saturated gate (1 - sig
        # cancels).  The magnitudes count both (the reference's term_scales); over every
        # shape, 100 seeds each, the CPU's worst error was 1.3e-7 of them.
        rel, mx = errors(gt, wt)
        err = (gt.detach().double().cpu() - wt).norm().item()
        if not ((rel < 1e-4 or err < 1e-6 * scale.norm().item()) and mx < 1e-3):
            return f"{name}: relative error {rel:.3e}, max {mx:.3e}, error {err:.3e} of terms {scale.norm().item():.3e}"
    for name, gt, wt in zip(names[6:8], got[6:8], want[6:8]):  # scalar sums: relative to sum |g|
        if not abs(gt.item() - wt.item()) / g_scale < 1e-6:
            return f"{name}: {gt.item()} where float64 gives {wt.item()} (sum |g| {g_scale:.3e})"
    # sum(grad_h): the kernels keep dy in h's dtype (rounded once the pool's gradient is added
    # in), so this sum is as close as the dtype allows, not as the exact-input sums above.
    h_bias_bound = max(map_bound, 1e-5)
    if not abs(got[8].item() - want[8].item()) / g_scale < h_bias_bound:
        return f"h_bias: {got[8].item()} where float64 gives {want[8].item()} (sum |g| {g_scale:.3e})"
    return None


def test_kink_flips_admit_only_units_at_the_kink(rng):
    """A gradient computed with one hidden unit's mask on the other side passes through
    _kink_flips when that unit sits at the kink, and not when it sits far from it."""
    n, c, r = 3, 16, 2
    h = torch.randn(n, c, 4, 4, generator=rng).half()
    params = [torch.randn(r, c, generator=rng) / 4, torch.randn(r, generator=rng), torch.randn(c, r, generator=rng),
              torch.randn(c, generator=rng)]
    pre1 = F.linear(h.double().mean((2, 3)), params[0].double(), params[1].double())
    params[1] = (params[1].double() - pre1[0]).float()  # every sample-0 unit within float32 rounding of 0
    pre1 = F.linear(h.double().mean((2, 3)), params[0].double(), params[1].double())
    far = int(pre1[1:].abs().argmax()) + r  # a unit of samples 1..n-1, flat index into (n, r)
    out = torch.randn(n, c, 4, 4, generator=rng).half().relu()
    grad_out = torch.randn(n, c, 4, 4, generator=rng).half()
    args = (grad_out, None, h, out, params, None, None)
    for unit, admitted in ((0, True), (far, False)):
        flip = torch.zeros(n, r, dtype=torch.bool)
        flip.view(-1)[unit] = True
        got = _se_gate_backward_reference(*args, flip=flip)[0]
        got = [g.float() if i >= 2 else g.half() for i, g in enumerate(got)]
        matched = []
        for candidate in _kink_flips(h, params, None):
            want, g_scale, scales = _se_gate_backward_reference(*args, term_scales=True, flip=candidate)
            if _se_gate_backward_mismatch(got, want, g_scale, scales, torch.float16) is None:
                matched.append(candidate)
                break
        # at the kink: matched by that flip, not by float64's own mask (None); far: by nothing
        assert (bool(matched) and matched[0] is not None and bool(matched[0].view(-1)[unit])) == admitted, \
            (unit, admitted, matched)


@pytest.mark.parametrize("device", DEVICES)
def test_se_gate_backward_bad_input(device):
    h = torch.randn(2, 8, 6, 6, device=device, dtype=torch.float16)
    params = [torch.randn(2, 8, device=device), torch.randn(2, device=device), torch.randn(8, 2, device=device),
              torch.randn(8, device=device)]
    with pytest.raises(ValueError, match="grad_pooled must be"):
        cutlass_ops.ops.se_gate_backward(h, h, h, h, *params)
    with pytest.raises(ValueError, match="grad_pooled dtype"):
        cutlass_ops.ops.se_gate_backward(h, torch.randn(2, 8, 3, 3, device=device), h, h, *params)
    with pytest.raises(ValueError, match="must have h's dtype"):
        cutlass_ops.ops.se_gate_backward(h.float(), None, h, h, *params)
    with pytest.raises(ValueError, match="must have h's shape"):
        cutlass_ops.ops.se_gate_backward(h, None, h, h[:1], *params)
    with pytest.raises(ValueError, match="fc2_weight must be"):
        cutlass_ops.ops.se_gate_backward(h, None, h, h, params[0], params[1], params[2].t(), params[3])


@pytest.mark.parametrize("device", DEVICES)
def test_se_gate_backward_opcheck(device, rng):
    h = torch.randn(2, 16, 4, 4, generator=rng).half().to(device)
    out, gp = torch.randn(2, 16, 4, 4, generator=rng).half().to(device), torch.randn(2, 16, 2, 2).half().to(device)
    params = [torch.randn(*s, generator=rng).to(device) for s in [(2, 16), (2,), (16, 2), (16,)]]
    torch.library.opcheck(torch.ops.cutlass_ops.se_gate_backward.default,
                          (h, gp, h, out, *params, torch.tensor(0.5, device=device), torch.tensor(-0.3, device=device)))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_se_gate_backward_nchw_input_on_cuda(rng):
    # Plain NCHW gradients (as a conv's dgrad may give) are converted: the kernel reads channels_last.
    shape, pshape = (2, 16, 8, 8), (2, 16, 4, 4)
    h, out, g = (torch.randn(shape, generator=rng).half().cuda() for _ in range(3))
    gp = torch.randn(pshape, generator=rng).half().cuda()
    params = [torch.randn(*s, generator=rng).cuda() for s in [(2, 16), (2,), (16, 2), (16,)]]
    cl = torch.channels_last
    got = cutlass_ops.ops.se_gate_backward(g, gp, h, out, *params, 0.3)
    want = cutlass_ops.ops.se_gate_backward(g.contiguous(memory_format=cl), gp.contiguous(memory_format=cl),
                                            h.contiguous(memory_format=cl), out.contiguous(memory_format=cl),
                                            *params, 0.3)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
