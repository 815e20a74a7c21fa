"""conv2d_b2b (back-to-back conv: KxRxS conv + bias + ReLU, then 1x1 conv + bias + ReLU) against
float64: the fused CUDA instances, the ATen composite (CPU, and the CUDA fallback), the fake
impl, the gradient, and bad input."""
import warnings

import pytest
import torch

import cutlass_ops
from cutlass_ops import ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, b2b_reference, errors, poison_cuda_cache

CL = torch.channels_last


def _inputs(n, c, h, w, k0, k1, r, dtype, device, g, bias=True):
    x = torch.randn(n, c, h, w, generator=g).to(dtype).to(device).contiguous(memory_format=CL)
    w0 = (torch.randn(k0, c, r, r, generator=g) / (c * r * r) ** 0.5).to(dtype).to(device)
    w1 = (torch.randn(k1, k0, 1, 1, generator=g) / k0 ** 0.5).to(dtype).to(device)
    # biases random and non-zero (a zero bias would hide a bias that is dropped)
    b0 = (0.5 * torch.randn(k0, generator=g)).to(dtype).to(device) if bias else None
    b1 = (0.5 * torch.randn(k1, generator=g)).to(dtype).to(device) if bias else None
    return x, w0, b0, w1, b1


# (N, C, H, W, K0, K1, R, stride, padding): odd batches and maps, strided, 1x1 and 3x3.
# Smem-resident instances (K1 >= 128): the 64 -> 128 rows and the last two, a bottleneck block's
# 3x3 64 -> 64 then 1x1 64 -> 256.
SHAPES = [(3, 64, 9, 7, 64, 128, 3, 1, 1), (5, 32, 16, 16, 64, 64, 3, 2, 1), (1, 16, 5, 11, 32, 64, 3, 1, 0),
          (7, 64, 8, 8, 64, 128, 1, 1, 0), (2, 8, 13, 13, 64, 64, 3, 2, 0), (3, 64, 14, 14, 64, 256, 3, 1, 1),
          (2, 64, 9, 9, 64, 256, 3, 2, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_composite_cpu_matches_float64(shape, bias, rng):
    n, c, h, w, k0, k1, r, stride, padding = shape
    for dtype in (torch.float32, torch.float64):
        args = _inputs(n, c, h, w, k0, k1, r, dtype, "cpu", rng, bias)
        out = cutlass_ops.conv2d_b2b(*args, stride=stride, padding=padding)
        assert ops.conv2d_b2b_last_kernel() == "aten"
        assert out.is_contiguous(memory_format=CL) and out.dtype == dtype
        rel, mx = errors(out, b2b_reference(*args, stride, padding))
        assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], (dtype, rel, mx)


@pytest.mark.parametrize("relu0, relu1", [(False, True), (True, False), (False, False)])
def test_composite_relu_flags(relu0, relu1, rng):
    args = _inputs(2, 8, 6, 6, 16, 8, 3, torch.float64, "cpu", rng)
    out = cutlass_ops.conv2d_b2b(*args, stride=1, padding=1, relu0=relu0, relu1=relu1)
    rel, _ = errors(out, b2b_reference(*args, 1, 1, relu0, relu1))
    assert rel <= 1e-12
    assert (out < 0).any() == (not relu1)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_cuda_matches_float64(shape, dtype, rng):
    n, c, h, w, k0, k1, r, stride, padding = shape
    name = f"cutlass_ops_conv2d_b2b_{'f16' if dtype == torch.float16 else 'bf16'}_sm80_k{k0}_k{k1}_relu"
    if name not in ops.conv2d_b2b_kernels():
        pytest.skip(f"{name} is not in this build")
    args = _inputs(n, c, h, w, k0, k1, r, dtype, "cuda", rng)
    p = (h + 2 * padding - r) // stride + 1
    poison_cuda_cache(n * k1 * p * p * 2 * 4)
    out = cutlass_ops.conv2d_b2b(*args, stride=stride, padding=padding)
    assert ops.conv2d_b2b_last_kernel() == name
    assert out.is_contiguous(memory_format=CL) and out.dtype == dtype
    rel, mx = errors(out, b2b_reference(*args, stride, padding, round_to=dtype))
    bound = {torch.float16: (2e-3, 8e-3), torch.bfloat16: (1e-2, 4e-2)}[dtype]
    assert rel <= bound[0] and mx <= bound[1], (rel, mx)
    # NCHW input: converted, same answer
    x_nchw = args[0].contiguous()
    again = cutlass_ops.conv2d_b2b(x_nchw, *args[1:], stride=stride, padding=padding)
    assert ops.conv2d_b2b_last_kernel() == name
    torch.testing.assert_close(again, out, rtol=0, atol=0)


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("case", ["no_instance", "relu1_off", "channels_not_8", "float32"])
@pytest.mark.fallback  # it means the fallback
def test_cuda_fallback_is_right(case, rng):
    dtype = torch.float32 if case == "float32" else torch.float16
    c, k0 = (12, 64) if case == "channels_not_8" else (32, 48 if case == "no_instance" else 64)
    args = _inputs(3, c, 7, 7, k0, 64, 3, dtype, "cuda", rng)
    relu1 = case != "relu1_off"
    # float32 falls back to ATen convs, which follow torch's TF32 switch like F.conv2d (on by
    # default for cuDNN convs: 3.5e-4 off float64 on an H100); off here to check the float32 path.
    with warnings.catch_warnings(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        warnings.simplefilter("ignore")
        out = cutlass_ops.conv2d_b2b(*args, stride=1, padding=1, relu1=relu1)
    assert ops.conv2d_b2b_last_kernel() == "aten"
    rel, mx = errors(out, b2b_reference(*args, 1, 1, relu1=relu1, round_to=dtype))
    assert rel <= TOLERANCE[dtype][0] * 2 and mx <= TOLERANCE[dtype][1] * 2, (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
def test_fake_impl_and_opcheck(device, rng):
    args = _inputs(2, 8, 6, 5, 16, 24, 3, torch.float32, device, rng)
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_b2b.default, (*args, [2, 2], [1, 1], True, True))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = [None if t is None else mode.from_tensor(t) for t in args]
        out = torch.ops.cutlass_ops.conv2d_b2b(*fake, [2, 2], [1, 1], True, True)
    assert tuple(out.shape) == (2, 24, 3, 3) and out.is_contiguous(memory_format=CL)


def test_gradients_float64():
    g = torch.Generator().manual_seed(0)
    args = [t.requires_grad_() for t in _inputs(2, 3, 5, 4, 4, 5, 3, torch.float64, "cpu", g)]
    fn = lambda *a: cutlass_ops.conv2d_b2b(*a, stride=1, padding=1)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(args))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input_names_the_argument(device, rng):
    x, w0, b0, w1, b1 = _inputs(2, 8, 6, 6, 16, 8, 3, torch.float32, device, rng)
    with pytest.raises((ValueError, RuntimeError), match="w1 must be"):
        cutlass_ops.conv2d_b2b(x, w0, b0, torch.randn(8, 16, 3, 3, device=device), b1)
    with pytest.raises((ValueError, RuntimeError), match="w0 dtype"):
        cutlass_ops.conv2d_b2b(x, w0.double(), b0, w1, b1)
    with pytest.raises((ValueError, RuntimeError), match="bias1 must have shape"):
        cutlass_ops.conv2d_b2b(x, w0, b0, w1, torch.zeros(3, device=device))
    with pytest.raises((ValueError, RuntimeError), match="input has 4 channels but w0 expects 8"):
        cutlass_ops.conv2d_b2b(x[:, :4], w0, b0, w1, b1)
    with pytest.raises((ValueError, TypeError), match="stride"):
        cutlass_ops.conv2d_b2b(x, w0, b0, w1, b1, stride="2")
    if device == "cuda":
        with pytest.raises((ValueError, RuntimeError), match="w0 is on"):
            cutlass_ops.conv2d_b2b(x, w0.cpu(), b0, w1, b1)


@pytest.mark.parametrize("path", cutlass_ops.FusedConvPair.PATHS)
@pytest.mark.parametrize("device", DEVICES)
def test_fused_conv_pair_module(device, path, rng):
    """FusedConvPair from the user's two convs shares their parameters and gives the output and
    gradients of the plain modules: against a float64 copy, no worse than the plain modules'
    own run in the same dtype (float32 on the CPU, fp16 on CUDA), on either path."""
    import copy
    dtype = torch.float32 if device == "cpu" else torch.float16
    conv0, conv1 = torch.nn.Conv2d(16, 64, 3, stride=2, padding=1), torch.nn.Conv2d(64, 128, 1)
    with torch.no_grad():
        for p in (*conv0.parameters(), *conv1.parameters()):
            p.copy_(torch.randn(p.shape, generator=rng) * 0.2)  # random, non-zero biases
    ref64 = torch.nn.Sequential(copy.deepcopy(conv0), torch.nn.ReLU(), copy.deepcopy(conv1), torch.nn.ReLU()).double()
    conv0, conv1 = conv0.to(device, dtype), conv1.to(device, dtype)
    plain = torch.nn.Sequential(conv0, torch.nn.ReLU(), conv1, torch.nn.ReLU())
    pair = cutlass_ops.FusedConvPair.from_modules(conv0, conv1, path=path)
    assert set(pair.state_dict()) == {"conv0.weight", "conv0.bias", "conv1.weight", "conv1.bias"}
    assert pair.conv0.weight is conv0.weight and conv0.weight.is_contiguous(memory_format=CL)
    x = torch.randn(3, 16, 11, 9, generator=rng).to(device, dtype)
    g = torch.randn(3, 128, 6, 5, generator=rng)
    results = {}
    for name, model, inp in (("fused", pair, x), ("plain", plain, x), ("f64", ref64, x.double().cpu())):
        inp = inp.clone().requires_grad_()
        out = model(inp)
        params = [p for p in model.parameters()]
        grads = torch.autograd.grad(out, [inp, *params], g.to(out.device, out.dtype))
        results[name] = [out.detach(), *grads]
    for i, (fused, plain_t, want) in enumerate(zip(results["fused"], results["plain"], results["f64"])):
        err, own = errors(fused, want)[0], errors(plain_t, want)[0]
        slack = 1e-3 if dtype == torch.float16 else 1e-6  # a few units of the dtype's rounding
        assert err <= 2 * own + slack, (i, err, own)  # 0: the output, 1: x, then the parameters
    with torch.no_grad():
        assert pair(x).shape == (3, 128, 6, 5)
    if device == "cuda":  # the path that ran: one B2B kernel, or conv2d_fused twice (not ATen)
        ran = ops.conv2d_b2b_last_kernel() if path == "b2b" else ops.conv2d_fused_last_kernel()
        assert ran.startswith("cutlass_ops_conv2d_"), ran


def test_fused_conv_pair_refuses_what_it_cannot_fuse():
    c0 = torch.nn.Conv2d(8, 16, 3, padding=1)
    with pytest.raises(ValueError, match="conv1 must be a 1x1 conv"):
        cutlass_ops.FusedConvPair(c0, torch.nn.Conv2d(16, 8, 3))
    with pytest.raises(ValueError, match="conv1 takes 12 channels but conv0 gives 16"):
        cutlass_ops.FusedConvPair(c0, torch.nn.Conv2d(12, 8, 1))
    with pytest.raises(ValueError, match="groups=1"):
        cutlass_ops.FusedConvPair(torch.nn.Conv2d(8, 16, 3, groups=2), torch.nn.Conv2d(16, 8, 1))
    with pytest.raises(TypeError, match="nn.Conv2d"):
        cutlass_ops.FusedConvPair(c0, torch.nn.Linear(16, 8))
    with pytest.raises(ValueError, match="path must be one of"):
        cutlass_ops.FusedConvPair(c0, torch.nn.Conv2d(16, 8, 1), path="fast")
