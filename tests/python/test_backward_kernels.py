"""The backward's two CUDA helpers (cutlass_ops/autograd.py uses them): relu_backward (ReLU
mask from the saved output + the FixUp sums) and se_gate_pool_backward (the gradient
through se_gate's fused AvgPool2d(3, 2, 1)), against float64 references."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, errors, poison_cuda_cache

LOW = [torch.float16, torch.bfloat16]


def _saved_output(shape, dtype, device, post_bias, rng):
    """An op output relu(z) + post_bias rounded once, as the kernels store it, and z."""
    z = torch.randn(shape, generator=rng, dtype=torch.float64)
    out = torch.relu(z.float()) + (post_bias.float() if post_bias is not None else 0.0)
    return out.to(dtype).to(device), z


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [torch.float32])
@pytest.mark.parametrize("shape, channels_last", [((3, 64, 5, 7), True), ((2, 24, 9, 9), False),
                                                  ((1, 3, 5, 3), True), ((7, 13), False)])
@pytest.mark.parametrize("with_post_bias", [True, False])
def test_relu_backward(device, dtype, shape, channels_last, with_post_bias, rng):
    post_bias = (torch.rand((), generator=rng) + 0.25).to(device) if with_post_bias else None
    out, z = _saved_output(shape, dtype, device, post_bias.cpu() if with_post_bias else None, rng)
    grad = torch.randn(shape, generator=rng).to(dtype).to(device)
    if channels_last and len(shape) == 4:
        out = out.contiguous(memory_format=torch.channels_last)
    poison_cuda_cache(grad.numel() * grad.element_size())
    grad_z, sums = cutlass_ops.ops.relu_backward(grad, out, post_bias)
    # Reference: the mask as the output encodes it (an element whose z > 0 rounds to
    # post_bias is inactive there too; the ops document that), sums in float64.
    inactive = post_bias.to(dtype).double().cpu() if with_post_bias else 0.0
    active = out.double().cpu() != inactive if with_post_bias else out.double().cpu() > 0
    assert active.float().mean() > 0.3 and (~active).float().mean() > 0.3  # both sides exercised
    ref = torch.where(active, grad.double().cpu(), 0.0)
    assert grad_z.shape == grad.shape and grad_z.dtype == dtype
    assert torch.equal(grad_z.double().cpu(), ref)  # masking is exact
    want = torch.stack([grad.double().cpu().sum(), ref.sum()])
    scale = grad.double().abs().sum().item()
    assert ((sums.double().cpu() - want).abs() / scale).max() < 1e-6, (sums, want)


@pytest.mark.parametrize("device", DEVICES)
def test_relu_backward_bad_input(device, rng):
    out = torch.randn(2, 8, 4, 4, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="grad shape"):
        cutlass_ops.ops.relu_backward(out[:1], out)
    with pytest.raises(ValueError, match="grad dtype"):
        cutlass_ops.ops.relu_backward(out.float(), out)
    with pytest.raises(ValueError, match="post_bias must be a scalar"):
        cutlass_ops.ops.relu_backward(out, out, torch.zeros(2, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_relu_backward_opcheck(device, rng):
    out = torch.randn(2, 8, 4, 4, generator=rng).half().to(device)
    grad = torch.randn(2, 8, 4, 4, generator=rng).half().to(device)
    torch.library.opcheck(torch.ops.cutlass_ops.relu_backward.default, (grad, out, torch.tensor(0.5, device=device)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [torch.float32])
@pytest.mark.parametrize("shape", [(3, 64, 16, 16), (2, 24, 9, 7), (5, 3, 2, 2), (1, 8, 1, 1)])
def test_se_gate_pool_backward(device, dtype, shape, rng):
    n, c, h, w = shape
    grad_out = torch.randn(shape, generator=rng).to(dtype).to(device).contiguous(memory_format=torch.channels_last)
    pooled_shape = (n, c, (h + 1) // 2, (w + 1) // 2)
    grad_pooled = torch.randn(pooled_shape, generator=rng).to(dtype).to(device).contiguous(
        memory_format=torch.channels_last)
    poison_cuda_cache(grad_out.numel() * grad_out.element_size())
    got = cutlass_ops.ops.se_gate_pool_backward(grad_out, grad_pooled)
    # Reference: autograd of the float64 pool (CPU, NCHW).
    x = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    F.avg_pool2d(x, 3, 2, 1, count_include_pad=True).backward(grad_pooled.double().cpu())
    ref = grad_out.double().cpu() + x.grad
    rel, mx = errors(got, ref)
    bound = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    assert rel < bound and mx < 4 * bound, (rel, mx)
    assert got.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("device", DEVICES)
def test_se_gate_pool_backward_bad_input(device):
    g = torch.randn(2, 8, 6, 6, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="grad_pooled must be"):
        cutlass_ops.ops.se_gate_pool_backward(g, g)
    with pytest.raises(ValueError, match="grad_pooled dtype"):
        cutlass_ops.ops.se_gate_pool_backward(g, torch.randn(2, 8, 3, 3, device=device))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_se_gate_pool_backward_nchw_input_on_cuda(rng):
    # Plain NCHW gradients are converted (the kernel reads channels_last).
    g = torch.randn(2, 16, 8, 8, generator=rng).half().cuda()
    gp = torch.randn(2, 16, 4, 4, generator=rng).half().cuda()
    got = cutlass_ops.ops.se_gate_pool_backward(g, gp)
    want = cutlass_ops.ops.se_gate_pool_backward(g.cpu().float(), gp.cpu().float())
    rel, _ = errors(got, want)
    assert rel < 1e-3, rel
