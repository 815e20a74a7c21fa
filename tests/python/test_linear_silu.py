"""cutlass_ops.ops.linear_silu (CvT's fc1 with its QuickGELU as silu(1.702 z) in the
GEMM's epilogue): the op's CPU path against float64, its autograd (gradcheck), opcheck, bad
input; on an sm90 GPU every generated kernel (forced one at a time) against float64 with odd
row counts and the output memory poisoned, the ATen fallback where no kernel applies
(misaligned x, K not a multiple of 8); FusedCvT with it against CvTOptions(linear_silu=False).
Skipped parts without a GPU or without the kernels (a build without arch 90)."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import errors, poison_cuda_cache, seeded
from cutlass_ops.ops import linear_silu, linear_silu_kernels

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
KERNELS = linear_silu_kernels()
HAS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0) and bool(KERNELS)
sm90_only = pytest.mark.skipif(not HAS_SM90, reason="no sm90 GPU, or a build without the linear_silu kernels (arch 90)")
# bounds on ||y - ref|| / ||ref|| against float64, and on the max error relative to max |ref|
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def inputs(lead, k, n, dtype, device="cpu", bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
    b = (torch.randn(n, generator=g) * 0.5).to(dtype).to(device) if bias else None
    return x, w, b


def reference(x, w, b, alpha):
    z = x.double() @ w.double().t()
    if b is not None:
        z = z + b.double()
    return F.silu(alpha * z)


def check(y, ref, dtype):
    rel, worst = errors(y, ref)
    assert rel <= TOL[dtype], (rel, worst)
    assert worst <= 10 * TOL[dtype], (rel, worst)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lead, k, n", [((5,), 7, 9), ((2, 3), 16, 24), ((1,), 1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_cpu_vs_float64(dtype, lead, k, n, bias):
    x, w, b = inputs(lead, k, n, dtype, bias=bias, seed=k + n)
    y = linear_silu(x, w, b, 1.702)
    assert y.shape == (*lead, n) and y.dtype == dtype
    check(y, reference(x, w, b, 1.702), dtype)


def test_gradcheck_cpu():
    x, w, b = inputs((2, 3), 5, 4, torch.float64, seed=1)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: linear_silu(x, w, b, -0.7), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: linear_silu(x, w, None, 1.3), (x, w))


def test_opcheck_cpu():
    x, w, b = inputs((3,), 8, 16, torch.float32, seed=2)
    torch.library.opcheck(torch.ops.cutlass_ops.linear_silu.default, (x, w, b, 1.5))


def test_bad_input():
    x, w, b = inputs((3,), 8, 16, torch.float32)
    with pytest.raises(ValueError, match="weight must be"):
        linear_silu(x, w[:, :4], b)
    with pytest.raises(ValueError, match="weight dtype"):
        linear_silu(x, w.double(), b)
    with pytest.raises(ValueError, match="bias must be"):
        linear_silu(x, w, b[:3])
    with pytest.raises(ValueError, match="x must be floating"):
        linear_silu(x.int(), w.int(), b)
    with pytest.raises(ValueError, match="alpha must be finite"):
        linear_silu(x, w, b, float("inf"))
    with pytest.raises(ValueError, match="feature dimension"):
        linear_silu(x[0, 0], w[:, :1], b)


@cuda_only
def test_device_mismatch():
    x, w, b = inputs((3,), 8, 16, torch.float16)
    with pytest.raises(ValueError, match="device|cuda"):
        linear_silu(x.cuda(), w, b)


@sm90_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lead, k, n", [((3, 197), 384, 1536), ((1,), 64, 256), ((77,), 192, 768),
                                        ((2, 131), 24, 40), ((1000,), 384, 8)])
def test_each_kernel_vs_float64(dtype, lead, k, n, monkeypatch):
    x, w, b = inputs(lead, k, n, dtype, "cuda", seed=k)
    ref = reference(x, w, b, 1.702)
    names = [name.split(" ")[0] for name in KERNELS if name.endswith(f"({str(dtype)[6:]})")]
    assert names, KERNELS
    for name in names:
        monkeypatch.setenv("CUTLASS_OPS_LINEAR_SILU_TILE", name)
        poison_cuda_cache(4 * x.numel() * n // k + (1 << 20))
        y = linear_silu(x, w, b, 1.702)
        assert not torch.isnan(y).any(), name
        check(y, ref, dtype)
    monkeypatch.delenv("CUTLASS_OPS_LINEAR_SILU_TILE")
    check(linear_silu(x, w, None, -0.5), reference(x, w, None, -0.5), dtype)


@sm90_only
@pytest.mark.fallback  # it means the fallback
def test_fallbacks_on_gpu():
    """No kernel applies (x misaligned by one element, K not a multiple of 8): ATen's path,
    the same numbers within the dtype's bound; a misaligned bias: the kernel on an aligned copy."""
    x, w, b = inputs((33,), 64, 128, torch.float16, "cuda", seed=3)
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    buf[1:] = x.reshape(-1)
    check(linear_silu(buf[1:].view(x.shape), w, b, 1.702), reference(x, w, b, 1.702), torch.float16)
    x, w, b = inputs((33,), 60, 128, torch.float16, "cuda", seed=4)
    check(linear_silu(x, w, b, 1.702), reference(x, w, b, 1.702), torch.float16)
    # a bias 2 bytes off 16-byte alignment (a view into a larger tensor): the kernel on a copy
    x, w, b = inputs((33,), 64, 128, torch.float16, "cuda", seed=5)
    big = torch.empty(129, dtype=b.dtype, device="cuda")
    big[1:] = b
    check(linear_silu(x, w, big[1:], 1.702), reference(x, w, b, 1.702), torch.float16)


@sm90_only
def test_fused_cvt_with_linear_silu():
    """FusedCvT's eval forward with each MLP's fc1 as linear_silu (the default on sm90) against
    CvTOptions(linear_silu=False) (cuBLAS + SiLU), both against the reference in float64."""
    from cutlass_ops.fused_cvt import FusedCvT
    from cutlass_ops.models.cvt import cvt13
    from cutlass_ops.options import CvTOptions
    with seeded(0):
        ref = cvt13().cuda().eval()
    x = torch.randn(3, 3, 64, 64, device="cuda")
    with torch.no_grad():
        want = ref.double()(x.double())
        fused = FusedCvT.from_reference(ref.half(), CvTOptions(linear_silu=True)).eval()
        got = fused(x.half())
        fused.options = CvTOptions(linear_silu=False)
        plain = fused(x.half())
    rel_fused, rel_plain = errors(got, want)[0], errors(plain, want)[0]
    assert rel_fused <= 1.5 * rel_plain + 1e-3, (rel_fused, rel_plain)
