"""cutlass_ops.ops.conv_embed (CvT's first token embedding, 7x7/4 from 3 channels + bias
+ LayerNorm, as one kernel): the CPU path and the CUDA kernel against float64 (conv, bias and
LayerNorm in float64), by relative L2 and max error; random LayerNorm weights and biases, odd
batches and image sizes, 1 to 11 input channels, NCHW, channels_last and sliced inputs,
channels_last weights, with and without bias and LayerNorm; the kernel seen by the profiler; the
ATen fallback for shapes it does not take; autograd (gradcheck in float64, and the CUDA
gradients against float64); opcheck; bad input.  The GPU parts skip without one."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import errors, fallback, fallback_where, poison_cuda_cache
from cutlass_ops.ops import conv_embed

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")

# fp16/bf16 tokens are LayerNorm outputs (|y| up to ~4): one rounding is 2^-11 / 2^-8 relative.
# float32 runs ATen's path, whose CUDA conv is cuDNN's with TF32 (PyTorch's default for convs).
TOL = {torch.float16: (1e-3, 4e-3), torch.bfloat16: (8e-3, 3e-2), torch.float32: (1e-5, 1e-4),
       torch.float64: (1e-12, 1e-11)}
TOL_CUDA_FP32 = (1e-3, 4e-3)


def make(n, c, h, w, k, r, s, dtype, device, seed, bias=True, ln=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(dtype)
    wt = (torch.randn(k, c, r, s, generator=g) / (c * r * s) ** 0.5).to(dtype)
    b = torch.randn(k, generator=g) * 0.5 if bias else None
    lw = torch.rand(k, generator=g) * 1.5 + 0.25 if ln else None  # random, non-zero
    lb = torch.randn(k, generator=g) * 0.5 if ln else None
    to = (lambda t: t.to(device) if t is not None else None)
    return to(x), to(wt), to(b), to(lw), to(lb)


def reference(x, wt, b, stride, padding, ln, lw, lb, eps=1e-5):
    d = lambda t: t.double().cpu() if t is not None else None  # noqa: E731  (differentiable)
    y = F.conv2d(d(x), d(wt), d(b), stride, padding)
    t = y.flatten(2).transpose(1, 2)
    return F.layer_norm(t, (t.shape[-1],), d(lw), d(lb), eps) if ln else t


CASES = [  # (n, c, h, w, k, r, s, stride, padding)
    (2, 3, 224, 224, 64, 7, 7, 4, 2),   # CvT-13's stage 1
    (3, 3, 64, 48, 64, 7, 7, 4, 2),
    (1, 3, 37, 50, 32, 7, 7, 4, 2),     # odd sizes: a partial last tile, windows off every edge
    (5, 1, 33, 17, 128, 3, 3, 2, 1),
    (3, 4, 16, 16, 64, 4, 4, 4, 0),     # a ViT-style patchify
    (2, 11, 20, 18, 32, 3, 5, (2, 3), (1, 2)),
    (7, 3, 9, 9, 64, 5, 5, 1, 2),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, fallback(torch.float32)], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("case", fallback_where(CASES, lambda c: c[1] * c[5] > 32), ids=[f"{c[0]}x{c[1]}x{c[2]}x{c[3]}-k{c[4]}-{c[5]}x{c[6]}" for c in CASES])
@pytest.mark.parametrize("ln", [True, False], ids=["ln", "no_ln"])
def test_against_float64(device, dtype, case, ln):
    n, c, h, w, k, r, s, stride, padding = case
    if device == "cpu" and dtype != torch.float32 and h * w > 4096:
        pytest.skip("the CPU path computes in float32 whatever the dtype: one large case is enough")
    x, wt, b, lw, lb = make(n, c, h, w, k, r, s, dtype, device, seed=hash(case) % 1000, ln=ln)
    if device == "cuda":
        poison_cuda_cache(2 * n * h * w * k + 4096)
    out = conv_embed(x, wt, b, stride, padding, ln, lw, lb)
    ref = reference(x, wt, b, stride, padding, ln, lw, lb)
    assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous()
    rel, mx = errors(out, ref)
    tol = TOL_CUDA_FP32 if device == "cuda" and dtype == torch.float32 else TOL[dtype]
    assert rel <= tol[0] and mx <= tol[1], (rel, mx)


@cuda_only
@pytest.mark.parametrize("layout", ["channels_last", "sliced", "weight_channels_last", "no_bias", "no_affine"])
def test_cuda_layouts_and_optional_args(layout):
    """The kernel reads any input and weight strides (no copy; "sliced" starts at an odd
    element: no paired loads), and optional tensors."""
    x, wt, b, lw, lb = make(3, 3, 64, 64, 64, 7, 7, torch.float16, "cuda", seed=7)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":
        x = torch.cat([x, x], dim=3)[:, :, :, 5:69]
    elif layout == "weight_channels_last":
        wt = wt.contiguous(memory_format=torch.channels_last)
    elif layout == "no_bias":
        b = None
    else:
        lw = lb = None
    out = conv_embed(x, wt, b, 4, 2, True, lw, lb)
    rel, mx = errors(out, reference(x, wt, b, 4, 2, True, lw, lb))
    assert rel <= TOL[torch.float16][0] and mx <= TOL[torch.float16][1], (rel, mx)


@cuda_only
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_cuda_inf_just_past_a_window(layout):
    """An Inf in the column just right of a pixel's 7-wide window (NCHW: the kernel loads that
    column with the window's last in one 4-byte word, then masks it off): only the pixels whose
    windows hold it turn non-finite, as in the reference."""
    x, wt, b, lw, lb = make(2, 3, 64, 64, 64, 7, 7, torch.float16, "cuda", seed=9)
    x[1, 2, 10, 4 * 5 + 5] = float("inf")  # pixel (p, q=5) reads columns 18..24; q=6 reads 22..28
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    out = conv_embed(x, wt, b, 4, 2, True, lw, lb)
    ref = reference(x, wt, b, 4, 2, True, lw, lb)
    finite = torch.isfinite(ref).all(-1)
    assert (~finite).sum() > 0 and torch.equal(torch.isfinite(out.cpu()).all(-1), finite)
    rel, mx = errors(out.cpu()[finite], ref[finite])
    assert rel <= TOL[torch.float16][0] and mx <= TOL[torch.float16][1], (rel, mx)


@cuda_only
@pytest.mark.fallback  # it checks both paths (and counts them itself)
def test_cuda_runs_the_kernel_and_falls_back_for_other_shapes():
    """CvT's shape runs conv_embed_kernel (seen by the profiler); K = 48 (not 32/64/128), more
    than 32 window rows (C*R) and a window wider than 8 run ATen's path: the same numbers, no
    kernel of ours."""
    def kernels_of(*args):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = conv_embed(*args)
            torch.cuda.synchronize()
        return out, [e.name for e in prof.events() if "conv_embed" in e.name and e.device_type.name == "CUDA"]
    x, wt, b, lw, lb = make(2, 3, 64, 64, 64, 7, 7, torch.float16, "cuda", seed=1)
    _, names = kernels_of(x, wt, b, 4, 2, True, lw, lb)
    assert names and all("conv_embed_kernel" in name for name in names), names
    for k, c, r, s in [(48, 3, 7, 7), (64, 8, 7, 7), (32, 1, 3, 9)]:
        x, wt, b, lw, lb = make(2, c, 32, 32, k, r, s, torch.float16, "cuda", seed=2)
        out, names = kernels_of(x, wt, b, 4, 2, True, lw, lb)
        assert names == [], names
        rel, mx = errors(out, reference(x, wt, b, 4, 2, True, lw, lb))
        assert rel <= TOL[torch.float16][0] and mx <= TOL[torch.float16][1], (rel, mx)


@cuda_only
def test_cuda_large_batch_int_offsets():
    """A batch past 2^31 input bytes: the 64-bit element offsets."""
    n = 2 ** 31 // (2 * 3 * 224 * 224) + 2
    x = torch.randn(n, 3, 224, 224, dtype=torch.float16, device="cuda")
    _, wt, b, lw, lb = make(1, 3, 8, 8, 64, 7, 7, torch.float16, "cuda", seed=3)
    out = conv_embed(x, wt, b, 4, 2, True, lw, lb)
    last = reference(x[-1:], wt, b, 4, 2, True, lw, lb)
    rel, mx = errors(out[-1:], last)
    assert rel <= TOL[torch.float16][0] and mx <= TOL[torch.float16][1], (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients(device):
    """Float64 gradcheck on the CPU; on CUDA the fp16 op's gradients (ATen recompute in float32)
    against float64's."""
    if device == "cpu":
        x, wt, b, lw, lb = make(2, 3, 12, 10, 8, 3, 3, torch.float64, "cpu", seed=4)
        args = [t.double().requires_grad_() for t in (x, wt, b, lw, lb)]
        assert torch.autograd.gradcheck(lambda x, wt, b, lw, lb: conv_embed(x, wt, b, 2, 1, True, lw, lb), args)
        # a direct call that leaves the defaulted arguments out (no LayerNorm)
        y = torch.ops.cutlass_ops.conv_embed(args[0], args[1], None, [2, 2], [1, 1])
        gx, gw = torch.autograd.grad(y.sum(), args[:2])
        want = torch.autograd.grad(F.conv2d(args[0], args[1], None, 2, 1).sum(), args[:2])
        assert torch.allclose(gx, want[0]) and torch.allclose(gw, want[1])
        return
    x, wt, b, lw, lb = make(2, 3, 32, 32, 64, 7, 7, torch.float16, device, seed=5)
    ts = [t.requires_grad_() for t in (x, wt, b, lw, lb)]
    g = torch.randn(2, 64, 64, device=device, dtype=torch.float16)
    conv_embed(ts[0], ts[1], ts[2], 4, 2, True, ts[3], ts[4]).backward(g)
    ts64 = [t.detach().double().cpu().requires_grad_() for t in ts]
    reference(ts64[0], ts64[1], ts64[2], 4, 2, True, ts64[3], ts64[4]).backward(g.double().cpu())
    for t, t64 in zip(ts, ts64):
        rel, _ = errors(t.grad, t64.grad)
        assert rel <= 5e-3, rel


def test_opcheck():
    x, wt, b, lw, lb = make(2, 3, 16, 16, 32, 7, 7, torch.float32, "cpu", seed=6)
    torch.library.opcheck(torch.ops.cutlass_ops.conv_embed.default, (x, wt, b, [4, 4], [2, 2], True, lw, lb, 1e-5))


def test_bad_input():
    x, wt, b, lw, lb = make(2, 3, 16, 16, 32, 7, 7, torch.float32, "cpu", seed=8)
    with pytest.raises(ValueError, match="4-D"):
        conv_embed(x[0], wt, b, 4, 2)
    with pytest.raises(ValueError, match="weight must be"):
        conv_embed(x, wt[:, :2], b, 4, 2)
    with pytest.raises(ValueError, match="dtype"):
        conv_embed(x.half(), wt, b, 4, 2)
    with pytest.raises(ValueError, match="bias must be"):
        conv_embed(x, wt, b[:5], 4, 2)
    with pytest.raises(ValueError, match="need layer_norm"):
        conv_embed(x, wt, b, 4, 2, False, lw, lb)
    with pytest.raises(ValueError, match="stride"):
        conv_embed(x, wt, b, 0, 2)
    with pytest.raises(ValueError, match="does not fit"):
        conv_embed(x[:, :, :4, :4], wt, b, 4, 0)
    with pytest.raises(ValueError, match="eps"):
        conv_embed(x, wt, b, 4, 2, True, lw, lb, eps=-1.0)
