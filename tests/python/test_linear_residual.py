"""cutlass_ops.ops.linear_residual (a CvT block's output projection and fc2 adding onto
the residual stream in the GEMM's epilogue): the op's CPU path against float64, its autograd
(gradcheck), opcheck, bad input; on a GPU the cuBLASLt path against float64 at CvT's shapes and
odd row counts (the output memory poisoned first), with and without a bias, a non-contiguous
residual, ATen's path where K or N is not a multiple of 8, CUDA-graph capture; FusedCvT with it
against CvTOptions(residual_gemm=False).  GPU parts skipped without one."""
import pytest
import torch

import cutlass_ops
from _helpers import errors, fallback, poison_cuda_cache, seeded
from cutlass_ops.ops import linear_residual

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
# bounds on ||y - ref|| / ||ref|| against float64 (the max error relative to max |ref|: 10x)
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def inputs(lead, k, n, dtype, device="cpu", bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype).to(device)
    b = (torch.randn(n, generator=g) * 0.5).to(dtype).to(device) if bias else None
    r = torch.randn(*lead, n, generator=g).to(dtype).to(device)
    return x, w, b, r


def reference(x, w, b, r, alpha):
    z = r.double() + alpha * (x.double() @ w.double().t())
    return z if b is None else z + b.double()


def check(y, ref, dtype):
    rel, worst = errors(y, ref)
    assert rel <= TOL[dtype], (rel, worst)
    assert worst <= 10 * TOL[dtype], (rel, worst)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lead, k, n", [((5,), 7, 9), ((2, 3), 16, 24), ((1,), 1, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_cpu_vs_float64(dtype, lead, k, n, bias):
    x, w, b, r = inputs(lead, k, n, dtype, bias=bias, seed=k + n)
    y = linear_residual(x, w, b, r, 0.6)
    assert y.shape == (*lead, n) and y.dtype == dtype and y.data_ptr() != r.data_ptr()
    check(y, reference(x, w, b, r, 0.6), dtype)


def test_gradcheck_cpu():
    x, w, b, r = inputs((2, 3), 5, 4, torch.float64, seed=1)
    for t in (x, w, b, r):
        t.requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b, r: linear_residual(x, w, b, r, -0.7), (x, w, b, r))
    assert torch.autograd.gradcheck(lambda x, w, r: linear_residual(x, w, None, r, 1.3), (x, w, r))


def test_opcheck_cpu():
    x, w, b, r = inputs((3,), 8, 16, torch.float32, seed=2)
    torch.library.opcheck(torch.ops.cutlass_ops.linear_residual.default, (x, w, b, r, 1.5))


def test_bad_input():
    x, w, b, r = inputs((3,), 8, 16, torch.float32)
    with pytest.raises(ValueError, match="weight must be"):
        linear_residual(x, w[:, :4], b, r)
    with pytest.raises(ValueError, match="weight dtype"):
        linear_residual(x, w.double(), b, r)
    with pytest.raises(ValueError, match="bias must be"):
        linear_residual(x, w, b[:3], r)
    with pytest.raises(ValueError, match="residual must be"):
        linear_residual(x, w, b, r[:, :8])
    with pytest.raises(ValueError, match="residual dtype"):
        linear_residual(x, w, b, r.double())
    with pytest.raises(ValueError, match="x must be floating"):
        linear_residual(x.int(), w.int(), b, r.int())
    with pytest.raises(ValueError, match="alpha must be finite"):
        linear_residual(x, w, b, r, float("nan"))
    with pytest.raises(ValueError, match="feature dimension"):
        linear_residual(x[0, 0], w[:, :1], b, r[0])


@cuda_only
def test_device_mismatch():
    x, w, b, r = inputs((3,), 8, 16, torch.float16)
    with pytest.raises(ValueError, match="device|cuda"):
        linear_residual(x.cuda(), w.cuda(), b.cuda(), r)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("lead, k, n", [((3, 3136), 64, 64), ((3, 3136), 256, 64), ((2, 197), 384, 384),
                                        ((2, 197), 1536, 384), ((77,), 192, 192), ((1,), 64, 8),
                                        fallback((33,), 60, 128), fallback((33,), 64, 100)])  # K, N % 8: ATen
@pytest.mark.parametrize("bias", [True, False])
def test_cuda_vs_float64(dtype, lead, k, n, bias):
    """cuBLASLt where K and N are multiples of 8, ATen's path elsewhere (K 60, N 100)."""
    x, w, b, r = inputs(lead, k, n, dtype, "cuda", bias=bias, seed=k + n)
    poison_cuda_cache(4 * r.numel() + (1 << 20))
    y = linear_residual(x, w, b, r, 1 / 1.702)
    assert not torch.isnan(y).any()
    check(y, reference(x, w, b, r, 1 / 1.702), dtype)


@cuda_only
def test_cuda_views_and_graph():
    """A residual that is a strided view (copied first) and an x misaligned by one element (the
    heuristic asked for its alignment); the op captured in a CUDA graph replays with new inputs."""
    x, w, b, r = inputs((50,), 64, 64, torch.float16, "cuda", seed=3)
    wide = torch.randn(50, 128, device="cuda", dtype=torch.float16)
    wide[:, ::2] = r
    check(linear_residual(x, w, b, wide[:, ::2]), reference(x, w, b, r, 1.0), torch.float16)
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    buf[1:] = x.reshape(-1)
    check(linear_residual(buf[1:].view(x.shape), w, b, r), reference(x, w, b, r, 1.0), torch.float16)
    xs, rs = x.clone(), r.clone()
    linear_residual(xs, w, b, rs)  # warm-up (the heuristic's host call) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear_residual(xs, w, b, rs)
    x2, _, _, r2 = inputs((50,), 64, 64, torch.float16, "cuda", seed=4)
    xs.copy_(x2), rs.copy_(r2)
    graph.replay()
    check(out, reference(x2, w, b, r2, 1.0), torch.float16)


@cuda_only
def test_fused_cvt_with_residual_gemms():
    """FusedCvT's eval forward with the blocks' output projections and fc2 as linear_residual
    (the default) against CvTOptions(residual_gemm=False), both against the reference in
    float64; odd batch and a 64x48 image (uneven maps)."""
    from cutlass_ops.fused_cvt import FusedCvT
    from cutlass_ops.models.cvt import cvt13
    from cutlass_ops.options import CvTOptions
    with seeded(0):
        ref = cvt13().cuda().eval()
    x = torch.randn(3, 3, 64, 48, device="cuda")
    with torch.no_grad():
        want = ref.double()(x.double())
        fused = FusedCvT.from_reference(ref.half(), CvTOptions(residual_gemm=True)).eval()
        got = fused(x.half())
        fused.options = CvTOptions(residual_gemm=False)
        plain = fused(x.half())
    rel_fused, rel_plain = errors(got, want)[0], errors(plain, want)[0]
    assert rel_fused <= 1.5 * rel_plain + 1e-3, (rel_fused, rel_plain)
