"""conv2d_dgrad and conv2d_wgrad (the training path's conv gradients; cutlass_ops/autograd.py)
against float64 references, on the CPU (ATen) and the GPU (generated CUTLASS kernels)."""
import pytest
import torch
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, poison_cuda_cache

LOW = [torch.float16, torch.bfloat16]

# (N, C, H, W, K, R, S, stride, padding): FusedResNet's convs (small batches), odd sizes,
# and channel counts the kernels do not take (C % 8 != 0: ATen).
CASES = [
    (3, 64, 16, 16, 64, 3, 3, 1, 1),     # block 0
    (5, 64, 16, 16, 128, 3, 3, 2, 1),    # block 1 conv1 (strided dgrad)
    (2, 64, 8, 8, 128, 1, 1, 1, 0),      # a downsample 1x1
    (3, 256, 4, 4, 512, 3, 3, 2, 1),     # block 3 conv1
    (4, 512, 2, 2, 512, 3, 3, 1, 1),     # block 3 conv2 (2x2 maps)
    (3, 24, 9, 7, 40, 3, 3, 2, 1),       # odd maps, stride 2
    (1, 16, 7, 9, 8, 5, 3, 2, 2),        # non-square kernel and rows a stride leaves over
    (64, 64, 16, 16, 64, 3, 3, 1, 1),    # N*P*Q = 16384: wgrad split many ways
    (2, 12, 7, 7, 20, 3, 3, 1, 1),       # C % 8 != 0: the ATen composite
]
KERNEL_CASES = [c for c in CASES if c[1] % 8 == 0 and c[4] % 8 == 0]


def _operands(case, dtype, device, rng):
    n, c, h, w, k, r, s, stride, pad = case
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, generator=rng).to(dtype).to(device).contiguous(memory_format=cl)
    weight = (torch.randn(k, c, r, s, generator=rng) * (c * r * s) ** -0.5).to(dtype).to(device)
    weight = weight.contiguous(memory_format=cl)
    dy = torch.randn(n, k, p, q, generator=rng).to(dtype).to(device).contiguous(memory_format=cl)
    return x, weight, dy, stride, pad


CUDNN_BY_PROFILE = "aten (the profile measured cuDNN faster here)"


def _expect_kernel(device, dtype, case, kind):
    """On the GPU, eligible shapes run a generated kernel, or cuDNN where the build's
    profile measured it faster (test_every_kernel covers every kernel regardless)."""
    name = cutlass_ops.ops.conv2d_backward_last_kernel()
    if device == "cuda" and dtype in LOW and case[1] % 8 == 0 and case[4] % 8 == 0:
        assert name.startswith(f"cutlass_ops_conv2d_{kind}_") or name == CUDNN_BY_PROFILE, name
        if kind == "dgrad" and case[7] > 1:
            assert "_unity_" not in name, name
    else:
        assert name == "aten", name
    return name


def _no_tf32():
    """cuDNN would use TF32 for float32 by default (torch's global setting)."""
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [torch.float32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("with_scale", [True, False])
def test_conv2d_dgrad(device, dtype, case, with_scale, rng):
    x, weight, dy, stride, pad = _operands(case, dtype, device, rng)
    scale = (torch.rand((), generator=rng) * 2 - 1.2).to(device) if with_scale else None  # random, non-zero
    poison_cuda_cache(x.numel() * x.element_size())
    with _no_tf32():
        got = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
    _expect_kernel(device, dtype, case, "dgrad")
    w64 = weight.double().cpu() * (scale.double().cpu() if with_scale else 1.0)
    want = conv2d_input(x.shape, w64, dy.double().cpu(), stride, pad)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(got, want)
    bound = TOLERANCE[dtype]
    assert rel < bound[0] and mx < bound[1], (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [torch.float32])
@pytest.mark.parametrize("case", CASES)
def test_conv2d_wgrad(device, dtype, case, rng):
    x, weight, dy, stride, pad = _operands(case, dtype, device, rng)
    poison_cuda_cache(64 * weight.numel() * 4)  # covers the split-K partial sums too
    with _no_tf32():
        got = cutlass_ops.conv2d_wgrad(dy, x, weight.shape, stride, pad)
    name = _expect_kernel(device, dtype, case, "wgrad")
    want = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
    assert got.shape == weight.shape and got.dtype == torch.float32
    assert got.is_contiguous(memory_format=torch.channels_last)
    # Our kernels: float32 sums of the rounded inputs, far closer to float64 than a 16-bit
    # output.  cuDNN on CUDA (the fallback) writes 16-bit dw, converted afterwards.
    cudnn_16bit = device == "cuda" and dtype in LOW and name.startswith("aten")
    bound = TOLERANCE[dtype] if cudnn_16bit else (1e-5, 1e-4)
    rel, mx = errors(got, want)
    assert rel < bound[0] and mx < bound[1], (rel, mx)


def _built_kernels(kind, dtype):
    dname = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    return [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels()
            if k.startswith(f"cutlass_ops_conv2d_{kind}_{dname}_")]


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", KERNEL_CASES)
def test_every_kernel(dtype, case, rng):
    """Every built dgrad/wgrad kernel (whatever the dispatcher or the profile would pick)
    on each eligible shape; wgrad unsplit and split 2 and 7 ways (7: slices of unequal length)."""
    x, weight, dy, stride, pad = _operands(case, dtype, "cuda", rng)
    scale = (torch.rand((), generator=rng) + 0.5).cuda()
    want_dx = conv2d_input(x.shape, weight.double().cpu() * scale.double().cpu(), dy.double().cpu(), stride, pad)
    want_dw = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
    ran = 0
    for kind in ("dgrad", "wgrad"):
        for name in _built_kernels(kind, dtype):
            if kind == "dgrad" and stride > 1 and "_unity_" in name:
                continue
            for split in ([0] if kind == "dgrad" else [1, 2, 7]):
                torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, split)
                try:
                    poison_cuda_cache(8 * weight.numel() * 4 + x.numel() * 2)
                    if kind == "dgrad":
                        got, want, bound = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale), want_dx, \
                            TOLERANCE[dtype]
                    else:
                        got, want, bound = cutlass_ops.conv2d_wgrad(dy, x, weight.shape, stride, pad), want_dw, \
                            (1e-5, 1e-4)
                except ValueError as e:  # can_implement said no: only for too few K-iterations
                    assert "cannot run this problem" in str(e) and split > 1, (name, split, e)
                    continue
                finally:
                    torch.ops.cutlass_ops.conv2d_backward_force_kernel("")
                assert cutlass_ops.ops.conv2d_backward_last_kernel().startswith(name)
                rel, mx = errors(got, want)
                assert rel < bound[0] and mx < bound[1], (name, split, rel, mx)
                ran += 1
    assert ran >= 2


@pytest.mark.parametrize("device", DEVICES)
def test_float64_is_exact_aten(device, rng):
    case = CASES[1]
    x, weight, dy, stride, pad = _operands(case, torch.float64, device, rng)
    scale = torch.tensor(-0.7, dtype=torch.float64, device=device)
    dx = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
    dw = cutlass_ops.conv2d_wgrad(dy, x, weight.shape, stride, pad)
    assert dx.dtype == dw.dtype == torch.float64
    for got, want in ((dx, conv2d_input(x.shape, weight * scale, dy, stride, pad)),
                      (dw, conv2d_weight(x, weight.shape, dy, stride, pad))):
        rel, mx = errors(got, want)
        assert rel < 1e-12 and mx < 1e-11, (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device, rng):
    x, weight, dy, stride, pad = _operands(CASES[0], torch.float16, device, rng)
    with pytest.raises(ValueError, match="grad_output shape"):
        cutlass_ops.conv2d_dgrad(dy[:, :, 1:], weight, x.shape, stride, pad)
    with pytest.raises(ValueError, match="grad_output shape"):
        cutlass_ops.conv2d_wgrad(dy, x, weight.shape, 2, pad)
    with pytest.raises(ValueError, match="weight dtype"):
        cutlass_ops.conv2d_dgrad(dy, weight.float(), x.shape, stride, pad)
    with pytest.raises(ValueError, match="input dtype"):
        cutlass_ops.conv2d_wgrad(dy, x.float(), weight.shape, stride, pad)
    with pytest.raises(ValueError, match="scale must be a scalar"):
        cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="channels but weight expects"):
        cutlass_ops.conv2d_dgrad(dy, weight, (3, 32, 16, 16), stride, pad)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        cutlass_ops.conv2d_wgrad(dy, x, weight.shape, 0, pad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, rng):
    x, weight, dy, stride, pad = _operands(CASES[5], torch.float16, device, rng)
    scale = torch.tensor(0.8, device=device)
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_dgrad.default,
                          (dy, weight, list(x.shape), [stride] * 2, [pad] * 2, scale))
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_wgrad.default,
                          (dy, x, list(weight.shape), [stride] * 2, [pad] * 2))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_kernels_under_cuda_graph(rng):
    """The wgrad split (its partial sums' allocation and sum) and the dgrad scale read on
    the device replay correctly from a CUDA graph with new inputs."""
    x, weight, dy, stride, pad = _operands(CASES[7], torch.float16, "cuda", rng)
    scale = torch.tensor(0.5, device="cuda")
    for _ in range(2):  # warm-up on a side stream, as torch.cuda.graph needs
        cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
        cutlass_ops.conv2d_wgrad(dy, x, weight.shape, stride, pad)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dx = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
        dw = cutlass_ops.conv2d_wgrad(dy, x, weight.shape, stride, pad)
    dy.copy_(torch.randn(dy.shape, generator=rng).to(dy))
    scale.fill_(-1.25)
    graph.replay()
    rel, _ = errors(dx, conv2d_input(x.shape, weight.double().cpu() * -1.25, dy.double().cpu(), stride, pad))
    assert rel < 1e-3, rel
    rel, _ = errors(dw, conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad))
    assert rel < 1e-5, rel
