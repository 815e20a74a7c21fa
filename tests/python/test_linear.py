"""cutlass_ops.linear.linear (FusedCvT's Linears: the bias gradient as a GEMV with ones, not
ATen's column sum): values and every gradient against float64 F.linear / addmm with alpha, bias
or none, both bias-gradient modes; gradcheck; the fallbacks (no grad, autocast)."""
import pytest
import torch
import torch.nn.functional as F

from cutlass_ops.linear import linear

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("alpha", [1.0, 1.702])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", ["gemv", "sum"])
def test_linear_against_float64(device, dtype, alpha, bias, mode, monkeypatch):
    """Odd sizes, a 3-d input; output and gradients of x, weight and bias against float64
    (fp16 on the CPU too: the same code path)."""
    monkeypatch.setenv("CUTLASS_OPS_LINEAR_BGRAD", mode)
    g = torch.Generator().manual_seed(int(alpha * 10) + bias)
    x = torch.randn(3, 37, 24, generator=g)
    w = torch.randn(19, 24, generator=g) / 5
    b = torch.randn(19, generator=g) if bias else None
    gy = torch.randn(3, 37, 19, generator=g)
    leaves = [t.to(device, dtype).clone().requires_grad_(True) for t in (x, w) + ((b,) if bias else ())]
    out = linear(leaves[0], leaves[1], leaves[2] if bias else None, alpha=alpha)
    out.backward(gy.to(device, dtype))
    ref_leaves = [t.double().requires_grad_(True) for t in (x, w) + ((b,) if bias else ())]
    ref = alpha * F.linear(ref_leaves[0], ref_leaves[1]) + (ref_leaves[2] if bias else 0)
    ref.backward(gy.double())
    tol = 1e-6 if dtype == torch.float32 else 3e-3
    assert out.dtype == dtype and out.shape == ref.shape
    assert rel(out, ref) <= tol
    for got, want in zip(leaves, ref_leaves):
        assert got.grad.dtype == dtype and rel(got.grad, want.grad) <= tol


def test_linear_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((5, 4), (3, 4), (3,))]
    assert torch.autograd.gradcheck(lambda x, w, b: linear(x, w, b, alpha=0.7), args)


def test_linear_fallbacks():
    """No grad recorded, autocast: F.linear / addmm's own numbers and casts."""
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(6, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    with torch.no_grad():
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))
        assert torch.allclose(linear(x, w, None, alpha=2.0), 2 * F.linear(x, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xa = x.requires_grad_(True)
        out = linear(xa, w, b)
        assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert xa.grad is not None and xa.grad.dtype == torch.float32
