"""cutlass_ops.conv2d_fused against a float64 reference, its errors, and its registration."""
import os

import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, poison_cuda_cache, seeded

LOW_PRECISION = [torch.float16, torch.bfloat16]


def reference(x, w, bias, residual, stride, padding, scale, post_bias, relu, silu=False):
    """The op's definition, in float64 on the CPU, from the same (rounded) inputs."""
    d = lambda t: t.detach().double().cpu() if isinstance(t, torch.Tensor) else t
    y = F.conv2d(d(x), d(w), stride=stride, padding=padding)
    if scale is not None:
        y = y * d(scale)
    if bias is not None:
        b = d(bias)
        y = y + (b.view(1, -1, 1, 1) if isinstance(b, torch.Tensor) and b.dim() == 1 else b)
    if residual is not None:
        y = y + d(residual)
    if relu:
        y = torch.relu(y)
    if silu:
        y = F.silu(y)
    if post_bias is not None:
        y = y + d(post_bias)
    return y


def random_case(n, c, k, h, w, r, s, dtype, device, g, bias="channel", residual=True,
                stride=1, padding=1):
    """Random inputs and random non-zero scalars (neutral values would hide dropped terms)."""
    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(dtype)

    x = randn(n, c, h, w).to(device).contiguous(memory_format=torch.channels_last)
    wt = randn(k, c, r, s, std=(c * r * s) ** -0.5).to(device)
    p = (h + 2 * padding - r) // stride + 1
    q = (w + 2 * padding - s) // stride + 1
    res = randn(n, k, p, q).to(device).contiguous(memory_format=torch.channels_last) if residual else None
    scalar = lambda lo: torch.tensor(lo + torch.rand((), generator=g, dtype=torch.float64).item(),
                                     dtype=torch.float32, device=device)
    b = {"channel": randn(k).float().to(device), "scalar": scalar(-1.5), "none": None}[bias]
    return dict(x=x, w=wt, bias=b, residual=res, stride=stride, padding=padding,
                scale=scalar(0.5), post_bias=scalar(-1.0))


def run(case, relu, silu=False):
    return cutlass_ops.conv2d_fused(case["x"], case["w"], case["bias"], case["residual"],
                                    case["stride"], case["padding"], case["scale"],
                                    case["post_bias"], relu, silu)


def check(case, relu, dtype, expect_kernel=True, silu=False):
    if case["x"].is_cuda:
        n, _, h, w = case["x"].shape
        poison_cuda_cache(n * case["w"].shape[0] * h * w * 2)
    out = run(case, relu, silu)
    ref = reference(case["x"], case["w"], case["bias"], case["residual"], case["stride"],
                    case["padding"], case["scale"], case["post_bias"], relu, silu)
    assert out.shape == ref.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(out, ref)
    rel_tol, max_tol = TOLERANCE[dtype]
    kernel = cutlass_ops.conv2d_fused_last_kernel()
    if os.environ.get("CUTLASS_OPS_ERROR_LOG"):  # collected by tests/gpu_acceptance.sh
        with open(os.environ["CUTLASS_OPS_ERROR_LOG"], "a") as f:
            f.write(f"{kernel} {str(dtype)[6:]} {out.device.type} {rel:.3e} {mx:.3e}\n")
    assert rel <= rel_tol and mx <= max_tol, f"{kernel}: rel {rel:.3e} max {mx:.3e}"
    if case["x"].is_cuda and dtype in LOW_PRECISION and expect_kernel:
        assert kernel.startswith("cutlass_ops_conv2d_fused_"), f"ran {kernel}, not a CUTLASS kernel"
    return kernel


# (n, c, k, h, w, r, s, stride, padding): ResNet shapes, odd sizes, odd channels.
SHAPES = [
    (128, 64, 64, 16, 16, 3, 3, 1, 1),   # the ResNet9 block conv
    (3, 64, 128, 16, 16, 3, 3, 2, 1),    # strided, downsampling block
    (5, 128, 256, 9, 7, 3, 3, 2, 1),     # odd spatial
    (7, 48, 24, 11, 13, 1, 1, 1, 0),     # 1x1
    (2, 16, 40, 15, 15, 5, 3, 3, 2),     # non-square kernel, stride 3
    (1, 48, 64, 64, 64, 4, 4, 4, 0),     # stem as a 4x4 stride-4 conv
    (3, 12, 20, 10, 10, 3, 3, 1, 1),     # channels % 8 = 4: alignment 4
    (2, 6, 10, 9, 9, 3, 3, 1, 2),        # channels % 4 = 2: alignment 2
    (4, 3, 64, 17, 17, 3, 3, 2, 1),      # 3 input channels: alignment 1
    (3, 5, 7, 8, 8, 2, 2, 1, 0),         # all odd
    (1, 256, 128, 4, 4, 3, 3, 1, 1),     # tiny M, long K: serial split-K on a GPU
    (2, 512, 512, 2, 2, 3, 3, 1, 1),     # the last ResNet block at N=2
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}c{}k{}_{}x{}_r{}s{}_st{}p{}".format(*s))
def test_numerics_full_epilogue(device, dtype, shape, rng):
    n, c, k, h, w, r, s, stride, padding = shape
    case = random_case(n, c, k, h, w, r, s, dtype, device, rng, stride=stride, padding=padding)
    kernel = check(case, relu=True, dtype=dtype)
    if device == "cuda":
        align = max(a for a in (8, 4, 2, 1) if c % a == 0 and k % a == 0)
        got = int(kernel.rsplit("align", 1)[1].split()[0])
        assert align % got == 0, f"{kernel} for C={c}, K={k}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("bias", ["channel", "scalar", "none"])
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("relu", [True, False])
def test_epilogue_variants(device, dtype, bias, residual, relu, rng):
    case = random_case(3, 32, 48, 10, 10, 3, 3, dtype, device, rng, bias=bias, residual=residual)
    check(case, relu, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
@pytest.mark.parametrize("shape", [(3, 64, 256, 13, 1, 1, 1, 1, 0), (2, 32, 48, 10, 9, 3, 3, 1, 1),
                                   (1, 256, 128, 4, 4, 3, 3, 1, 1)],
                         ids=["tokens_1x1", "3x3", "split_k"])
@pytest.mark.parametrize("residual", [True, False])
def test_silu_epilogue(device, dtype, shape, residual, rng):
    """SiLU as the activation (FusedCvT's fc1): every other epilogue term present, against
    float64; on tokens viewed as an (N, C, L, 1) map, as FusedCvT calls it."""
    n, c, k, h, w, r, s, stride, padding = shape
    case = random_case(n, c, k, h, w, r, s, dtype, device, rng, residual=residual, stride=stride, padding=padding)
    check(case, relu=False, dtype=dtype, silu=True)
    with pytest.raises(ValueError, match="relu and silu"):
        run(case, relu=True, silu=True)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_split_k_is_used_and_exact_enough(dtype, rng, monkeypatch):
    # One output tile, 36 K-iterations: the dispatcher splits K; a residual forbids it.
    # Family 80's serial split-K: pin the family-90 kernels (no split-K, opt-in) off.
    monkeypatch.setenv("CUTLASS_OPS_SM90", "0")
    case = random_case(1, 256, 64, 4, 4, 3, 3, dtype, "cuda", rng, residual=False)
    assert "split_k=" in check(case, True, dtype)
    case = random_case(1, 256, 64, 4, 4, 3, 3, dtype, "cuda", rng, residual=True)
    assert "split_k=" not in check(case, True, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.fallback  # it means the ATen path
def test_float32_and_float64_take_the_aten_path(device, rng):
    # cuDNN would use TF32 for float32 by default (torch's global setting, which the
    # fallback honours); turn it off to check the composite's exact math.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for dtype in (torch.float32, torch.float64):
            case = random_case(2, 8, 8, 6, 6, 3, 3, dtype, device, rng)
            assert check(case, True, dtype) == "aten"


@pytest.mark.parametrize("device", DEVICES)
def test_python_float_scalars_and_defaults(device, rng):
    case = random_case(2, 16, 16, 8, 8, 3, 3, torch.float16, device, rng, residual=False)
    out = cutlass_ops.conv2d_fused(case["x"], case["w"], 0.25, None, 1, 1, 1.5, -0.5, True)
    ref = reference(case["x"], case["w"], 0.25, None, 1, 1, 1.5, -0.5, True)
    assert errors(out, ref)[0] <= TOLERANCE[torch.float16][0]
    plain = cutlass_ops.conv2d_fused(case["x"], case["w"], padding=1)
    assert errors(plain, F.conv2d(case["x"].double().cpu(), case["w"].double().cpu(), padding=1))[0] < 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_nchw_input_is_converted(device, rng):
    case = random_case(2, 16, 24, 9, 9, 3, 3, torch.float16, device, rng)
    expected = run(case, True)
    case["x"] = case["x"].contiguous()  # plain NCHW
    case["residual"] = case["residual"].contiguous()
    assert not case["x"].is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(run(case, True), expected, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_returns_empty(device, rng):
    case = random_case(0, 16, 24, 9, 9, 3, 3, torch.float16, device, rng)
    out = run(case, True)
    assert out.shape == (0, 24, 9, 9)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_runs_on_the_current_stream(rng):
    case = random_case(64, 64, 64, 16, 16, 3, 3, torch.float16, "cuda", rng)
    expected = run(case, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # keep the side stream busy: a default-stream launch would race
        out = run(case, True)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_capture(rng):
    case = random_case(8, 32, 32, 12, 12, 3, 3, torch.float16, "cuda", rng)
    expected = run(case, True)
    run(case, True)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(case, True)
    case["scale"].fill_(2.0)  # scalars are read from device memory at replay
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(case["x"], case["w"], case["bias"], case["residual"], 1, 1, case["scale"],
                    case["post_bias"], True)
    assert errors(out, ref)[0] <= TOLERANCE[torch.float16][0]
    assert not torch.equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_module_matches_functional(device, rng):
    with seeded(0):
        m = cutlass_ops.FusedConv2d(16, 32, 3, stride=2, padding=1, relu=True, scale=True,
                                    post_bias=True).to(device=device, dtype=torch.float16)
    with torch.no_grad():
        m.scale.fill_(0.7)
        m.post_bias.fill_(0.3)
    x = torch.randn(3, 16, 11, 11, device=device, dtype=torch.float16)
    res = torch.randn(3, 32, 6, 6, device=device, dtype=torch.float16)
    out = m(x, res)
    ref = reference(x, m.weight, m.bias, res, 2, 1, m.scale, m.post_bias, True)
    assert errors(out, ref)[0] <= TOLERANCE[torch.float16][0]
    assert m.weight.is_contiguous(memory_format=torch.channels_last)
    assert "relu=True" in repr(m)


# ---- bad input: clear errors, never a crash or wrong numbers --------------------------------

def _good(device="cpu"):
    x = torch.randn(2, 8, 6, 6, dtype=torch.float16, device=device)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float16, device=device)
    return x, w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mutate, message", [
    (lambda x, w: (x.float(), w), "weight dtype"),
    (lambda x, w: (x.int(), w.int()), "floating"),
    (lambda x, w: (x[0], w), "4-D"),
    (lambda x, w: (x, w[:, :4]), "channels"),
    (lambda x, w: (x[:, :, :1, :1], w), "smaller than the kernel"),
])
def test_bad_input_raises(device, mutate, message):
    x, w = mutate(*_good(device))
    with pytest.raises((ValueError, RuntimeError), match=message):
        cutlass_ops.conv2d_fused(x, w, padding=0)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_epilogue_operands_raise(device):
    x, w = _good(device)
    with pytest.raises(ValueError, match="bias must be"):
        cutlass_ops.conv2d_fused(x, w, torch.zeros(15, device=device), padding=1)
    with pytest.raises(ValueError, match="residual must have"):
        cutlass_ops.conv2d_fused(x, w, residual=torch.zeros(2, 16, 5, 5, dtype=x.dtype, device=device), padding=1)
    with pytest.raises(ValueError, match="residual dtype"):
        cutlass_ops.conv2d_fused(x, w, residual=torch.zeros(2, 16, 6, 6, device=device), padding=1)
    with pytest.raises(ValueError, match="scale must be a scalar"):
        cutlass_ops.conv2d_fused(x, w, scale=torch.ones(2, device=device), padding=1)
    with pytest.raises(ValueError, match="stride must be"):
        cutlass_ops.conv2d_fused(x, w, stride=0)
    with pytest.raises(ValueError, match="stride must be an int or two ints"):
        cutlass_ops.conv2d_fused(x, w, stride=(1, 2, 3))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_mixed_devices_raise():
    x, w = _good("cuda")
    with pytest.raises(ValueError, match="weight is on"):
        cutlass_ops.conv2d_fused(x, w.cpu())
    with pytest.raises(ValueError, match="bias is on"):
        cutlass_ops.conv2d_fused(x, w, torch.zeros(16))


# ---- registration: opcheck and torch.compile -------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_opcheck(device, dtype, rng):
    case = random_case(2, 16, 8, 7, 7, 3, 3, dtype, device, rng, stride=2)
    args = (case["x"], case["w"], case["bias"], case["residual"], case["scale"],
            case["post_bias"], [2, 2], [1, 1], True)
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_fused.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device, rng):
    case = random_case(2, 16, 16, 8, 8, 3, 3, torch.float16, device, rng)

    def block(x, w, b, s, pb):
        y = cutlass_ops.conv2d_fused(x, w, b, None, 1, 1, s, pb, True)
        return y * 2

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    args = (case["x"], case["w"], case["bias"], case["scale"], case["post_bias"])
    torch.testing.assert_close(compiled(*args), block(*args))
