"""Tensors over 2^31 elements: each op gives correct results or a clear error
before launch, never a wrapped 32-bit index.  Tested at the boundary: just below 2^31 (the
kernels run) and at or just above it (64-bit kernels run, or the op takes ATen, or raises).
GPU only, up to ~30 GB of GPU memory per test (each skips when less is free); select them
with `-k large`, skip them with CUTLASS_OPS_SKIP_LARGE=1.  Results are checked on slices
at the far end of the tensors (where a wrapped index would land), against float64."""
import os
import time

import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops import ops
from _helpers import HAS_CUDA, b2b_reference, errors

pytestmark = [pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)"),
              pytest.mark.skipif(os.environ.get("CUTLASS_OPS_SKIP_LARGE") == "1", reason="CUTLASS_OPS_SKIP_LARGE=1"),
              pytest.mark.fallback]  # a kernel, ATen or a clear error: each is right at these sizes
H = torch.float16
GiB = 2 ** 30
LIMIT = 2 ** 31


def need(gib, wait_s=180):
    """Skips unless ``gib`` GiB of GPU memory are free, waiting up to ``wait_s`` seconds for them:
    under pytest-xdist the other workers' tests hold memory for a while, then free it."""
    deadline = time.monotonic() + wait_s
    while True:
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info()[0]
        if free >= gib * GiB:
            return
        if time.monotonic() > deadline:
            pytest.skip(f"needs {gib} GiB of free GPU memory, {free / GiB:.1f} free after {wait_s} s")
        time.sleep(2)


_draws = iter(range(1, 1 << 30))


def randn(*shape, dtype=H, cl=False):
    """Fresh values on every call (a seed per call, not per shape: two operands of one shape
    must differ, or a wgrad's diagonal is a sum of squares that overflows float16)."""
    t = torch.empty(shape, dtype=dtype, device="cuda", memory_format=torch.channels_last if cl else torch.contiguous_format)
    return t.normal_(generator=torch.Generator("cuda").manual_seed(sum(shape) * 7919 + next(_draws)))


@pytest.fixture(autouse=True)
def _free():
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("n", [2, 1])
def test_large_conv2d_fused_over_2_31(n):
    """2^31 elements: two images of 2^30 run as two chunks of one image each; one image of
    2^31 takes the ATen composite (with its warning).  Checked with a residual and every
    epilogue term, at the start and the far end of the last image."""
    need(12 if n == 2 else 48)
    hw = 16384 if n == 1 else 11586  # n=2: 8 * 11586^2 * 2, just over 2^31 elements
    x = randn(n, 8, hw, hw, cl=True)
    w = (randn(8, 8, 1, 1, cl=True) * 0.3).contiguous(memory_format=torch.channels_last)
    res = randn(n, 8, hw, hw, cl=True)
    bias = torch.linspace(-1, 1, 8, device="cuda")
    scale, post = torch.tensor(0.7, device="cuda"), torch.tensor(-0.2, device="cuda")
    assert x.numel() >= LIMIT
    out = cutlass_ops.conv2d_fused(x, w, bias, res, 1, 0, scale, post, True)
    for r0 in (0, hw - 2):
        want = (torch.einsum("nchw,kc->nkhw", x[-1:, :, r0:r0 + 2].double(), w.double().view(8, 8)) * 0.7
                + bias.double().view(1, 8, 1, 1) + res[-1:, :, r0:r0 + 2].double()).relu() - 0.2
        assert errors(out[-1:, :, r0:r0 + 2], want)[0] < 2e-3, r0


@pytest.mark.parametrize("kernel", [3, 1])
def test_large_conv2d_fused_just_below_2_31(kernel):
    need(12)
    h, w_ = 16383, 16384  # 8 * h * w = 2^31 - 2^17
    x = randn(1, 8, h, w_, cl=True)
    w = (randn(8, 8, kernel, kernel, cl=True) * 0.2).contiguous(memory_format=torch.channels_last)
    bias = torch.linspace(-1, 1, 8, device="cuda")
    # On an H100 (2026-11-25) every CUTLASS kernel's can_implement() refused this problem
    # ("Invalid Problem"), so the ATen composite ran, with its warning: right either way.
    out = cutlass_ops.conv2d_fused(x, w, bias, None, 1, kernel // 2, None, None, True)
    assert cutlass_ops.conv2d_fused_last_kernel().split()[0] in set(cutlass_ops.ops.conv2d_fused_kernels()) | {"aten"}
    pad = kernel // 2
    for r0 in (0, h // 2, h - 4):  # output rows r0..r0+3: the start, the middle, the far end
        lo, hi = max(r0 - pad, 0), min(r0 + 4 + pad, h)
        xs = F.pad(x[:, :, lo:hi].double(), (0, 0, pad - (r0 - lo), pad - (hi - r0 - 4)))  # zeros at real borders
        ref = F.conv2d(xs, w.double(), bias.double(), 1, (0, pad)).relu()
        assert errors(out[:, :, r0:r0 + 4], ref)[0] < 2e-3, r0


def test_large_conv2d_dgrad_wgrad_over_2_31():
    """Over 2^31 elements the generated kernels are not used (ATen/cuDNN is): still right."""
    need(24)
    n, c, hw = 1, 8, 16384  # 2^31 elements per map
    x = randn(n, c, hw, hw, cl=True)
    w = randn(c, c, 1, 1, cl=True) * 0.3
    dy = randn(n, c, hw, hw, cl=True).mul_(0.25)  # dw's sums over 2^28 pixels: std ~4e3, within float16
    dx = cutlass_ops.conv2d_dgrad(dy, w, x.shape, 1, 0, torch.tensor(0.5, device="cuda"))
    assert cutlass_ops.ops.conv2d_backward_last_kernel().startswith("aten")
    for rows in (slice(0, 2), slice(hw - 2, hw)):
        want = torch.einsum("nkhw,kc->nchw", dy[:, :, rows].double(), w.double().view(c, c)) * 0.5
        assert errors(dx[:, :, rows], want)[0] < 2e-3
    del dx
    dw, ds = cutlass_ops.conv2d_wgrad(dy, x, w, 1, 0)
    g = torch.zeros(c, c, dtype=torch.float64, device="cuda")
    for r0 in range(0, hw, 2048):  # dw[k, c] = sum over pixels dy[k] x[c], in float64 chunks
        g += torch.einsum("nkhw,nchw->kc", dy[:, :, r0:r0 + 2048].double(), x[:, :, r0:r0 + 2048].double())
    assert errors(dw.view(c, c), g)[0] < 1e-2
    assert abs(ds.item() - (g * w.double().view(c, c)).sum().item()) < 1e-2 * (g * w.double().view(c, c)).abs().sum().item()


@pytest.mark.parametrize("n", [8191, 8192])
def test_large_se_gate_at_2_31(n):
    """h with 2^31 - 2^18 elements runs the kernel in one launch; 2^31 in two (8191 images,
    then the last one): the op is per image, the kernel's indices 32-bit."""
    need(16)
    c, hw = 64, 64  # 2^18 elements per image
    h, idn = randn(n, c, hw, hw, cl=True), randn(n, c, hw, hw, cl=True)
    g = torch.Generator().manual_seed(0)
    params = [(torch.randn(4, c, generator=g) / 8).cuda(), torch.randn(4, generator=g).cuda(),
              (torch.randn(c, 4, generator=g) / 2).cuda(), torch.randn(c, generator=g).cuda()]
    out, pooled = cutlass_ops.se_gate(h, idn, *params, None, None, avgpool=True)
    for i in (0, n - 2, n - 1):  # per-image op: images on both sides of the chunk edge, in float64
        want, want_pool = cutlass_ops.se_gate(h[i:i + 1].double().cpu(), idn[i:i + 1].double().cpu(),
                                              *(p.double().cpu() for p in params), avgpool=True)
        assert errors(out[i:i + 1], want)[0] < 2e-3, i
        assert errors(pooled[i:i + 1], want_pool)[0] < 2e-3, i


def test_large_relu_backward_over_2_31():
    need(16)
    numel = LIMIT + 4096
    grad = randn(numel)
    out = torch.relu(randn(numel))
    grad_z, sums = ops.relu_backward(grad, out)
    for sl in (slice(0, 4096), slice(LIMIT - 2048, numel)):
        assert torch.equal(grad_z[sl], torch.where(out[sl] > 0, grad[sl], 0).to(grad_z))
    total = sum(grad[i:i + GiB].double().sum() for i in range(0, numel, GiB))
    active = sum(torch.where(out[i:i + GiB] > 0, grad[i:i + GiB], 0).double().sum() for i in range(0, numel, GiB))
    scale = sum(grad[i:i + GiB].double().abs().sum() for i in range(0, numel, GiB))
    assert abs(sums[0].item() - total.item()) < 1e-5 * scale.item()
    assert abs(sums[1].item() - active.item()) < 1e-5 * scale.item()


def test_large_space_to_depth_conv_input_over_2_31():
    """An input of 2^31 elements (N * H/4 * W/4 output pixels < 2^31: the kernels run)."""
    need(28)
    n = 2048
    x = randn(n, 1, 1024, 1024)  # 2^31 elements
    w = randn(32, 16, 1, 1) * 0.25
    out = cutlass_ops.space_to_depth_conv(x, w, None, relu=True)
    for i in (0, n - 1):
        s2d = x[i:i + 1].double().reshape(1, 1, 256, 4, 256, 4).permute(0, 3, 5, 1, 2, 4).reshape(1, 16, 256, 256)
        assert errors(out[i:i + 1], F.conv2d(s2d, w.double()).relu())[0] < 2e-3, i
    grad = randn(*out.shape, cl=True)
    dw, sums = ops.space_to_depth_conv_weight_grad(grad, x, out)
    assert torch.isfinite(dw).all() and torch.isfinite(sums).all()
    # The last image's share of dw, against the full dw minus all but the last: the far end is read.
    head, _ = ops.space_to_depth_conv_weight_grad(grad[:-1], x[:-1], out[:-1])
    tail, _ = ops.space_to_depth_conv_weight_grad(grad[-1:].double().cpu(), x[-1:].double().cpu(), out[-1:].double().cpu())
    assert errors((dw - head).double().cpu(), tail)[0] < 1e-2


@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_large_giou_over_2_31_elements(reduction):
    need(32)
    n = LIMIT // 4 + 1024  # boxes: 2^31 + 4096 elements per box tensor
    lo = torch.rand(n, 2, device="cuda", dtype=H) * 10
    b1 = torch.cat([lo, lo + 1 + torch.rand(n, 2, device="cuda", dtype=H)], -1)
    del lo
    b2 = (b1 + 0.5).requires_grad_()
    b1.requires_grad_()
    loss = cutlass_ops.giou_loss(b1, b2, reduction)
    ends = (slice(0, 1024), slice(n - 1024, n))
    if reduction == "none":
        for sl in ends:
            want = cutlass_ops.giou_loss(b1[sl].detach().double().cpu(), b2[sl].detach().double().cpu())
            assert errors(loss[sl], want)[0] < 1e-5
        loss = loss.sum()
    else:
        want = sum(cutlass_ops.giou_loss(b1[i:i + GiB // 8].detach().double(), b2[i:i + GiB // 8].detach().double(), "sum")
                   for i in range(0, n, GiB // 8))
        assert abs(loss.item() - want.item()) < 1e-5 * n
    loss.backward()
    for sl in ends:
        p, t = b1[sl].detach().double().cpu().requires_grad_(), b2[sl].detach().double().cpu().requires_grad_()
        cutlass_ops.giou_loss(p, t, "sum").backward()
        assert errors(b1.grad[sl], p.grad)[0] < 2e-3 and errors(b2.grad[sl], t.grad)[0] < 2e-3


def test_large_conv2d_b2b_over_2_31():
    """The B2B instances index in 32 bits: an output over 2^31 elements takes the ATen
    composite (its one-time warning), right at the far end; just below it, the fused kernel
    runs (when this build has the 64 -> 256 instance)."""
    need(30)
    w0 = (randn(64, 64, 3, 3, cl=True) * (64 * 9) ** -0.5).contiguous(memory_format=torch.channels_last)
    w1 = (randn(256, 64, 1, 1, cl=True) * 0.125).contiguous(memory_format=torch.channels_last)
    b0, b1 = torch.linspace(-0.5, 0.5, 64, device="cuda", dtype=H), torch.linspace(-0.5, 0.5, 256, device="cuda", dtype=H)
    fused = "cutlass_ops_conv2d_b2b_f16_sm80_k64_k256_relu" in ops.conv2d_b2b_kernels()
    for n, over in ((63, False), (65, True)):  # 256 * 362^2 * n: 2.11e9 (n=63) and 2.18e9 (n=65)
        x = randn(n, 64, 362, 362, cl=True)
        out = cutlass_ops.conv2d_b2b(x, w0, b0, w1, b1, stride=1, padding=1)
        assert (out.numel() >= LIMIT) == over
        ran = ops.conv2d_b2b_last_kernel()
        assert ran == "aten" if over else (ran.startswith("cutlass") or not fused), ran
        last = slice(n - 1, n)  # the far end, where a wrapped index would land
        want = b2b_reference(x[last], w0, b0, w1, b1, 1, 1, round_to=H)
        assert errors(out[last], want)[0] < 2e-3, (n, ran)
        del x, out
        torch.cuda.empty_cache()
