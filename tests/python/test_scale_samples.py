"""cutlass_ops.ops.scale_samples (FusedCvT's drop path, x * mask / keep_prob per
sample, as one multiply forward and backward): the CPU path and the CUDA kernel against the
product in float32 (float64 for float64) rounded once, bitwise; odd sample sizes (the
element-wise path), a misaligned x, zero and negative factors, NaN passing through; autograd
(gradcheck in float64); opcheck; bad input.  The GPU parts skip without one."""
import pytest
import torch

import cutlass_ops
from _helpers import fallback, poison_cuda_cache
from cutlass_ops.ops import scale_samples

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def want(x, scale):
    """The product in scale's dtype, rounded once to x's dtype (on the CPU)."""
    shape = (-1,) + (1,) * (x.dim() - 1)
    return (x.cpu().to(scale.dtype) * scale.cpu().view(shape)).to(x.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, fallback(torch.float32), fallback(torch.float64)])
@pytest.mark.parametrize("shape", [(64, 197, 384), (3, 5, 7), (1, 8), (5,), (4, 0, 3)])
def test_bitwise_against_one_rounding(device, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    if x.numel():
        x.view(-1)[0] = float("nan")
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    scale = torch.tensor([0.0, 1 / 0.9, -2.5, 1.0, 1 / 0.7] * 13, dtype=sdt)[:shape[0]]
    if device == "cuda":
        poison_cuda_cache(4 * x.numel() + 4096)
    y = scale_samples(x.to(device), scale.to(device))
    assert y.dtype == dtype and y.shape == x.shape and y.device.type == device
    assert torch.equal(y.cpu().nan_to_num(7.0), want(x, scale).nan_to_num(7.0))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
def test_cuda_misaligned_and_strided_x():
    """x 1 element into its storage (the element-wise path) and a transposed view (made
    contiguous first): the same numbers."""
    x = torch.randn(6, 40, dtype=torch.float16)
    scale = torch.rand(6) * 2
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    buf[1:] = x.reshape(-1).cuda()
    assert torch.equal(scale_samples(buf[1:].view(6, 40), scale.cuda()).cpu(), want(x, scale))
    xt = torch.randn(40, 6, dtype=torch.float16).t()
    assert torch.equal(scale_samples(xt.cuda(), scale.cuda()).cpu(), want(xt, scale))


def test_gradcheck_and_opcheck():
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    scale = torch.tensor([0.0, 1.25, -0.5], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda t: scale_samples(t, scale), (x,))
    torch.library.opcheck(torch.ops.cutlass_ops.scale_samples.default, (x.detach().float(), scale.float()))


def test_bad_input():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="one factor per sample"):
        scale_samples(x, torch.ones(4))
    with pytest.raises(ValueError, match="scale must be torch.float32|scale must be Float"):
        scale_samples(x.half(), torch.ones(3, dtype=torch.float16))
    with pytest.raises(ValueError, match="floating"):
        scale_samples(x.int(), torch.ones(3))
