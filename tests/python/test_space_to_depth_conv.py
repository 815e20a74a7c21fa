"""cutlass_ops.space_to_depth_conv (SpaceToDepth(4) + 1x1 conv + ReLU + post_bias) vs float64."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops.models import depth_to_space, space_to_depth
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, fallback, fallback_where, poison_cuda_cache


def reference(x, w, post, relu):
    """The spec's stem in float64: x.view(N,C,H/4,4,W/4,4).permute(0,3,5,1,2,4), conv, act."""
    n, c, h, wd = x.shape
    s2d = x.double().cpu().view(n, c, h // 4, 4, wd // 4, 4).permute(0, 3, 5, 1, 2, 4).reshape(n, 16 * c, h // 4, wd // 4)
    y = F.conv2d(s2d, w.double().cpu())
    return (torch.relu(y) if relu else y) + post.double().cpu()


def make(n, c, h, w, k, dtype, device, g, layout="nchw"):
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":  # a non-contiguous view: every other image of a bigger batch
        x = torch.randn(2 * n, c, h, w, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)[::2]
    elif layout == "offset":  # rows 8-byte but not 16-byte aligned: the kernel's 8-byte copies
        x = torch.randn(n, c, h, w + 4, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)[..., 4:]
    elif layout == "strided_w":  # stride_w = 2: the kernel's element loads
        x = torch.randn(n, c, h, 2 * w, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)[..., ::2]
    wt = (torch.randn(k, 16 * c, 1, 1, generator=g, dtype=torch.float64) / (16 * c) ** 0.5).to(device=device, dtype=dtype)
    post = torch.randn((), generator=g, dtype=torch.float64).float().to(device)
    return x, wt, post


# (n, c, h, w, k): the FusedResNet stems (C = 1, 3, 11 at 64x64), odd batches, a tail CTA
# (N*P*Q not a multiple of 128), non-square inputs, K = 32/128, and cases the kernel does
# not take (C = 17, K = 48) that must fall back to ATen with the same numbers.  C = 7, K = 64:
# the weight gradient's dynamic shared memory is exactly 48 KB, which with the kernel's static
# 128 bytes needs the opt-in (the fuzz found its launch failing, 2026-11-25).
SHAPES = [(3, 3, 64, 64, 64), (1, 1, 64, 64, 64), (5, 11, 64, 64, 64), (7, 3, 12, 20, 64),
          (2, 16, 8, 8, 128), (3, 2, 16, 4, 32), (2, 17, 8, 8, 64), (3, 3, 8, 8, 48), (1, 7, 24, 20, 64)]


def _falls_back(shape):
    """The shapes the kernel does not take (C over 16; K not 32, 64 or 128): the ATen path."""
    return shape[1] > 16 or shape[4] not in (32, 64, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, fallback(torch.float32)])
@pytest.mark.parametrize("shape", fallback_where(SHAPES, _falls_back), ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("relu", [True, False])
def test_matches_float64(device, dtype, shape, relu):
    g = torch.Generator().manual_seed(hash((shape, relu)) % 2**31)
    n, c, h, w, k = shape
    x, wt, post = make(n, c, h, w, k, dtype, device, g)
    poison_cuda_cache(2 * n * k * h * w)
    # float32 takes the ATen path, where cuDNN would use TF32 by default (torch's global
    # setting, which the op honours): off, to check the exact math.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = cutlass_ops.space_to_depth_conv(x, wt, post, relu=relu)
    assert y.shape == (n, k, h // 4, w // 4) and y.dtype == dtype
    assert y.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(y, reference(x, wt, post, relu))
    bound_rel, bound_max = TOLERANCE[dtype]
    assert rel <= bound_rel and mx <= bound_max, (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["channels_last", "sliced", "offset", "strided_w"])
@pytest.mark.parametrize("c", [1, 3, 11])
def test_any_input_layout(device, layout, c):
    g = torch.Generator().manual_seed(5)
    x, wt, post = make(3, c, 16, 16, 64, torch.float16, device, g, layout)
    y = cutlass_ops.space_to_depth_conv(x, wt, post, relu=True)
    rel, _ = errors(y, reference(x, wt, post, True))
    assert rel <= TOLERANCE[torch.float16][0]
    # Every way the CUDA kernel reads its input (16-byte, 8-byte copies, element loads) gives
    # the same bits as from a contiguous copy.
    if device == "cuda":
        assert torch.equal(y, cutlass_ops.space_to_depth_conv(x.contiguous(), wt, post, relu=True))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_batch(dtype):
    """Enough tiles that every warp of the persistent kernel takes several (its ring of staged
    tiles wraps): 64x64 (16-byte copies), and 60x60 (8-byte copies; M = 601 * 225, a partial
    last tile)."""
    g = torch.Generator().manual_seed(8)
    for n, h, w in ((600, 64, 64), (601, 60, 60)):
        x, wt, post = make(n, 3, h, w, 64, dtype, "cuda", g)
        y = cutlass_ops.space_to_depth_conv(x, wt, post, relu=True)
        rel, mx = errors(y, reference(x, wt, post, True))
        assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], (n, w, rel, mx)


def test_space_to_depth_round_trip_and_channel_order():
    x = torch.randn(2, 3, 8, 12)
    s = space_to_depth(x)
    assert torch.equal(depth_to_space(s, 3), x)
    # channel dy*4C + dx*C + c of pixel (p, q) is x[c, 4p+dy, 4q+dx]
    assert s[1, 2 * 4 * 3 + 1 * 3 + 2, 1, 2] == x[1, 2, 4 + 2, 8 + 1]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_clear_errors(device):
    x = torch.randn(2, 3, 16, 16, device=device, dtype=torch.float16)
    w = torch.randn(64, 48, 1, 1, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiples of 4"):
        cutlass_ops.space_to_depth_conv(x[:, :, :14], w)
    with pytest.raises(ValueError, match=r"weight must be \(K, 48, 1, 1\)"):
        cutlass_ops.space_to_depth_conv(x, w[:, :47])
    with pytest.raises(ValueError, match="dtype"):
        cutlass_ops.space_to_depth_conv(x, w.float())
    with pytest.raises(ValueError, match="scalar"):
        cutlass_ops.space_to_depth_conv(x, w, torch.zeros(2, device=device))


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 32, 1, 1, generator=g, dtype=torch.float64, requires_grad=True)
    post = torch.randn((), generator=g, dtype=torch.float64, requires_grad=True)
    for relu in (True, False):
        assert torch.autograd.gradcheck(lambda *a: cutlass_ops.space_to_depth_conv(*a, relu=relu), (x, w, post))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(2, 3, 8, 8, device=device, dtype=torch.float16)
    w = torch.randn(64, 48, 1, 1, device=device, dtype=torch.float16)
    post = torch.tensor(0.5, device=device)
    torch.library.opcheck(torch.ops.cutlass_ops.space_to_depth_conv.default, (x, w, post, True))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda_graph_capture():
    g = torch.Generator().manual_seed(9)
    x, wt, post = make(4, 3, 64, 64, 64, torch.float16, "cuda", g)
    static = cutlass_ops.space_to_depth_conv(x, wt, post, relu=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = cutlass_ops.space_to_depth_conv(x, wt, post, relu=True)
    x.copy_(torch.randn_like(x))
    graph.replay()
    rel, _ = errors(out, reference(x, wt, post, True))
    assert rel <= TOLERANCE[torch.float16][0] and not torch.equal(out, static)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_view_not_16_byte_aligned(device):
    g = torch.Generator().manual_seed(6)
    x, wt, post = make(2, 3, 8, 8, 64, torch.float16, device, g)
    storage = torch.zeros(wt.numel() + 1, device=device, dtype=wt.dtype)
    shifted = storage[1:].view_as(wt)  # starts 2 bytes into the allocation
    shifted.copy_(wt)
    rel, _ = errors(cutlass_ops.space_to_depth_conv(x, shifted, post, relu=True), reference(x, wt, post, True))
    assert rel <= TOLERANCE[torch.float16][0]


# ---- space_to_depth_conv_weight_grad: the stem's backward when the input needs no gradient ----

def weight_grad_reference(grad, x, out, post):
    """float64: the ReLU mask as the saved output encodes it, then dW = grad_z^T s2d(x)."""
    g = grad.double().cpu()
    gz = g
    if out is not None:
        inactive = post.to(out.dtype).double().cpu() if post is not None else 0.0
        o = out.double().cpu()
        gz = torch.where(o != inactive if post is not None else o > 0, g, 0.0)
    n, c, h, w = x.shape
    s2d = x.double().cpu().view(n, c, h // 4, 4, w // 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(-1, 16 * c)
    dw = gz.permute(0, 2, 3, 1).reshape(-1, g.shape[1]).t() @ s2d
    return dw.reshape(g.shape[1], 16 * c, 1, 1), torch.stack([g.sum(), gz.sum()]), g.abs().sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, fallback(torch.float32)])
@pytest.mark.parametrize("shape", fallback_where(SHAPES + [(37, 3, 64, 64, 64)], _falls_back), ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("relu, with_post", [(True, True), (True, False), (False, True)])
def test_weight_grad_matches_float64(device, dtype, shape, relu, with_post):
    g = torch.Generator().manual_seed(hash((shape, relu, with_post)) % 2**31)
    n, c, h, w, k = shape
    x, wt, post = make(n, c, h, w, k, dtype, device, g, layout="sliced" if n == 7 else "nchw")
    post = post if with_post else None
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = cutlass_ops.space_to_depth_conv(x, wt, post, relu=relu)
    grad = torch.randn(out.shape, generator=g).to(device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    poison_cuda_cache(4 * k * 16 * c * 300)
    dw, sums = cutlass_ops.ops.space_to_depth_conv_weight_grad(grad, x, out if relu else None, post)
    want_dw, want_sums, scale = weight_grad_reference(grad, x, out if relu else None, post)
    assert dw.shape == (k, 16 * c, 1, 1) and dw.dtype == torch.float32 and sums.shape == (2,)
    # float32 sums of the exact 16-bit products: far closer to float64 than the dtype's rounding.
    rel, mx = errors(dw, want_dw)
    assert rel < 1e-5 and mx < 1e-4, (rel, mx)
    assert ((sums.double().cpu() - want_sums).abs() / scale).max() < 1e-6, (sums, want_sums)
    if relu:  # both sides of the mask exercised
        o = out.double().cpu()
        active = o != post.to(dtype).double().cpu() if with_post else o > 0
        assert 0.2 < active.double().mean() < 0.8


@pytest.mark.parametrize("device", DEVICES)
def test_weight_grad_bad_inputs_raise_clear_errors(device):
    x = torch.randn(2, 3, 16, 16, device=device, dtype=torch.float16)
    grad = torch.randn(2, 64, 4, 4, device=device, dtype=torch.float16)
    wg = cutlass_ops.ops.space_to_depth_conv_weight_grad
    with pytest.raises(ValueError, match=r"grad must be \(2, K, 4, 4\)"):
        wg(grad[:, :, :3], x)
    with pytest.raises(ValueError, match="grad dtype"):
        wg(grad.float(), x)
    with pytest.raises(ValueError, match="out shape"):
        wg(grad, x, grad[:1])
    with pytest.raises(ValueError, match="multiples of 4"):
        wg(grad, x[:, :, :14])
    with pytest.raises(ValueError, match="scalar"):
        wg(grad, x, grad, torch.zeros(2, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_grad_opcheck(device):
    x = torch.randn(2, 3, 8, 8, device=device, dtype=torch.float16)
    grad = torch.randn(2, 64, 2, 2, device=device, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    out = torch.randn(2, 64, 2, 2, device=device, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.cutlass_ops.space_to_depth_conv_weight_grad.default,
                          (grad, x, out, torch.tensor(0.5, device=device)))


def test_gradcheck_float64_input_without_grad():
    """The autograd path FusedResNet takes for data: weight and post_bias through
    space_to_depth_conv_weight_grad."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64)
    w = torch.randn(4, 32, 1, 1, generator=g, dtype=torch.float64, requires_grad=True)
    post = torch.randn((), generator=g, dtype=torch.float64, requires_grad=True)
    for relu in (True, False):
        assert torch.autograd.gradcheck(lambda *a: cutlass_ops.space_to_depth_conv(x, *a, relu=relu), (w, post))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weight_grad_paths_agree_on_cuda(dtype):
    """With and without an input gradient (the fused op vs relu_backward + a 16-bit GEMM),
    the stem's weight and post_bias gradients agree: to one rounding of dw to the weight's
    dtype, and to float32 summation order."""
    g = torch.Generator().manual_seed(4)
    x, wt, post = make(64, 3, 64, 64, 64, dtype, "cuda", g)
    wt.requires_grad_()
    post.requires_grad_()
    grads = []
    for input_grad in (False, True):
        xi = x.clone().requires_grad_(input_grad)
        y = cutlass_ops.space_to_depth_conv(xi, wt, post, relu=True)
        wt.grad = post.grad = None
        (y.double() * torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to("cuda")).sum().backward()
        grads.append((wt.grad.clone(), post.grad.clone()))
    (dw_fused, post_fused), (dw_unfused, post_unfused) = grads
    assert errors(dw_fused, dw_unfused)[0] < (1e-3 if dtype == torch.float16 else 8e-3)
    assert errors(post_fused, post_unfused)[0] < 1e-5
