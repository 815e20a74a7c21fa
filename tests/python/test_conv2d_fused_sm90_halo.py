"""The hand-written Hopper halo kernels (kernels/conv2d_fused/conv2d_fused_sm90_halo.cu): 3x3,
stride 1, pad 1, C = K = 64, 16-wide maps, no residual.  Each forced by name against a float64
reference (poisoned output memory, random non-zero FixUp scalars), every epilogue it takes, odd
batches and heights, batches that leave a persistent CTA several tiles or none; the dispatcher
picks it on sm90 for that class only; dependent launches and a CUDA graph replay; conv2d_dgrad of
the same problem through it (the rotated filter).

Skipped without an sm90 GPU or when the build has no family-90 kernels."""
import itertools

import pytest
import torch

import cutlass_ops
from cutlass_ops.ops import conv2d_fused_kernels
from _helpers import HAS_CUDA, TOLERANCE, errors, poison_cuda_cache
from test_conv2d_fused import random_case, reference
from test_conv2d_fused_sm90 import run_checked

HALO = [k for k in conv2d_fused_kernels(90) if "_halo" in k]
ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not (ON_SM90 and HALO), reason=(
    "needs an sm90 GPU and a build with family-90 kernels (90 in CUTLASS_OPS_ARCHS)"))
DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16}


def halo_kernel(dtype):
    name = {torch.float16: "_f16_", torch.bfloat16: "_bf16_"}[dtype]
    return next(k for k in HALO if name in k)


@pytest.fixture
def forced():
    def force(name, split_k=0):
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, split_k)
    yield force
    torch.ops.cutlass_ops.conv2d_fused_force_kernel("")


DTYPES = [torch.float16, torch.bfloat16]
# Every epilogue term present or absent but the residual (the kernel has none), ReLU on and off.
EPILOGUES = list(itertools.product(["channel", "scalar", "none"], [True, False], [True, False], [True, False]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias, scale, post_bias, relu", EPILOGUES,
                         ids=lambda v: str(v) if isinstance(v, str) else None)
def test_every_epilogue(dtype, bias, scale, post_bias, relu, forced, rng):
    case = random_case(3, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, bias=bias, residual=False)
    if not scale:
        case["scale"] = None
    if not post_bias:
        case["post_bias"] = None
    forced(halo_kernel(dtype))
    run_checked(case, relu, dtype, expect=halo_kernel(dtype))


# (N, H): one image (2 tiles, most CTAs idle), odd batches, heights 8 to 40 (the tiles are 8
# rows), and batches that leave every persistent CTA several tiles, unevenly.
SHAPES = [(1, 16), (1, 8), (3, 24), (37, 16), (77, 40), (301, 16), (1024, 16)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, h", SHAPES, ids=lambda v: str(v))
def test_shapes(dtype, n, h, forced, rng):
    case = random_case(n, 64, 64, h, 16, 3, 3, dtype, "cuda", rng, bias="scalar", residual=False)
    forced(halo_kernel(dtype))
    run_checked(case, True, dtype, expect=halo_kernel(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dispatcher_choice(dtype, monkeypatch, rng):
    """Block 0's problem runs the halo kernel under the automatic choice (CUTLASS_OPS_SM90 unset
    or 1), a generated kernel with CUTLASS_OPS_SM90=0; a residual, SiLU or another shape never
    runs it, and forcing it there is an error naming it."""
    halo = halo_kernel(dtype)
    case = random_case(5, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, residual=False)
    for env, expect_halo in ((None, True), ("1", True), ("0", False)):
        if env is None:
            monkeypatch.delenv("CUTLASS_OPS_SM90", raising=False)
        else:
            monkeypatch.setenv("CUTLASS_OPS_SM90", env)
        ran = run_checked(case, True, dtype)
        assert (ran == halo) == expect_halo, f"CUTLASS_OPS_SM90={env}: ran {ran}"
    monkeypatch.delenv("CUTLASS_OPS_SM90", raising=False)
    others = [
        random_case(5, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, residual=True),    # residual
        random_case(5, 64, 64, 16, 12, 3, 3, dtype, "cuda", rng, residual=False),   # W != 16
        random_case(5, 64, 64, 12, 16, 3, 3, dtype, "cuda", rng, residual=False),   # H % 8 != 0
        random_case(5, 64, 128, 16, 16, 3, 3, dtype, "cuda", rng, residual=False),  # K != 64
        random_case(5, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, residual=False, stride=2),
    ]
    for other in others:
        assert run_checked(other, True, dtype) != halo
    assert run_checked(case, False, dtype, silu=True) != halo
    torch.ops.cutlass_ops.conv2d_fused_force_kernel(halo, 0)
    try:
        for other in others:
            with pytest.raises(ValueError, match="forced kernel"):
                run_checked(other, True, dtype)
    finally:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel("", 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dependent_chain_and_graph_replay(dtype, forced, rng):
    """Back-to-back dependent calls (programmatic dependent launches: each must read its input
    after the previous kernel wrote it), then a CUDA graph replay that reads changed scalars."""
    kernel = halo_kernel(dtype)
    case = random_case(6, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, residual=False)
    forced(kernel)
    x, ref = case["x"], case["x"].double().cpu()
    for _ in range(4):  # y_{i+1} = relu(s * conv(y_i) + b) + pb, through the op's own outputs
        x = cutlass_ops.conv2d_fused(x, case["w"], case["bias"], None, 1, 1, case["scale"], case["post_bias"], True)
        ref = reference(ref, case["w"], case["bias"], None, 1, 1, case["scale"], case["post_bias"], True)
    assert cutlass_ops.conv2d_fused_last_kernel() == kernel
    rel, _ = errors(x, ref)
    assert rel <= 4 * TOLERANCE[dtype][0], f"{kernel}: chain rel {rel:.3e}"

    run = lambda: cutlass_ops.conv2d_fused(case["x"], case["w"], case["bias"], None, 1, 1, case["scale"],
                                           case["post_bias"], True)
    run()  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    case["scale"].fill_(2.0)
    case["post_bias"].fill_(-0.25)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(case["x"], case["w"], case["bias"], None, 1, 1, case["scale"], case["post_bias"], True)
    rel, mx = errors(out, ref)
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"{kernel}: graph rel {rel:.3e} max {mx:.3e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n, h", [(1, 16), (5, 8), (37, 24)], ids=lambda v: str(v))
@pytest.mark.parametrize("scaled", [True, False], ids=["scale", "no_scale"])
def test_dgrad(dtype, n, h, scaled, monkeypatch, rng):
    """conv2d_dgrad of block 0's problem runs the halo kernel on the rotated filter (unless
    CUTLASS_OPS_SM90_HALO=0), against float64: scale * dL/dx of a 3x3 stride-1 conv."""
    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=rng, dtype=torch.float64) * std).to(dtype).cuda()
    dy = randn(n, 64, h, 16).contiguous(memory_format=torch.channels_last)
    w = randn(64, 64, 3, 3, std=576 ** -0.5)
    scale = torch.tensor(0.5 + torch.rand((), generator=rng, dtype=torch.float64).item(),
                         dtype=torch.float32, device="cuda") if scaled else None
    ref = torch.nn.grad.conv2d_input((n, 64, h, 16), w.double().cpu(), dy.double().cpu(), 1, 1)
    if scaled:
        ref = ref * scale.double().cpu()
    rel_tol, max_tol = TOLERANCE[dtype]
    for halo_env in (None, "0"):
        if halo_env is None:
            monkeypatch.delenv("CUTLASS_OPS_SM90_HALO", raising=False)
        else:
            monkeypatch.setenv("CUTLASS_OPS_SM90_HALO", halo_env)
        poison_cuda_cache(2 * n * 64 * h * 16 * 2)
        dx = cutlass_ops.conv2d_dgrad(dy, w, (n, 64, h, 16), 1, 1, scale)
        kernel = cutlass_ops.ops.conv2d_backward_last_kernel()
        assert ("_halo" in kernel) == (halo_env is None), kernel
        assert dx.shape == ref.shape and dx.dtype == dtype
        rel, mx = errors(dx, ref)
        assert rel <= rel_tol and mx <= max_tol, f"{kernel}: rel {rel:.3e} max {mx:.3e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_input_falls_back(dtype, rng):
    """An input 8 bytes off a 16-byte boundary (TMA needs 16): a generated kernel runs it."""
    case = random_case(3, 64, 64, 16, 16, 3, 3, dtype, "cuda", rng, residual=False)
    x = case["x"]
    flat = torch.empty(x.numel() + 4, dtype=dtype, device="cuda")
    shifted = flat[4:].view(3, 16, 16, 64).permute(0, 3, 1, 2)  # channels_last, 8 bytes off
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 == 8 and shifted.is_contiguous(memory_format=torch.channels_last)
    case["x"] = shifted
    assert run_checked(case, True, dtype) != halo_kernel(dtype)
