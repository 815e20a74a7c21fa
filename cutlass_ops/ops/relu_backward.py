"""relu_backward (kernels/relu_backward): the backward of an ``act(z) + post_bias`` epilogue from
the op's saved output, with the sums FixUp's scalars need; its wrapper and fake impl, and
_epilogue_backward, which the conv families' autograd calls."""
from __future__ import annotations

import torch

from .. import paths
from ._common import Scalar, _as_tensor, _check_devices, _dtype_reason, _report


def relu_backward(grad: torch.Tensor, out: torch.Tensor, post_bias: Scalar = None):
    """Backward of an ``out = relu(z) + post_bias`` epilogue from the saved output, with the
    two sums FixUp's scalars need, in one pass (fp16/bf16 on CUDA; ATen otherwise):

        grad_z = where(z > 0, grad, 0)        # z > 0 <=> out != post_bias rounded to out's dtype
        sums   = (grad.sum(), grad_z.sum())   # float32 (float64 for float64 inputs)

    The ops compute in float32 and round once, so z <= 0 stores exactly post_bias rounded;
    an element with 0 < z below half an ulp of post_bias counts as inactive.  Returns
    ``(grad_z, sums)``, grad_z in out's layout (channels_last for 4-D).
    """
    if paths.recording(out):
        _report("relu_backward", paths.EMPTY if out.numel() == 0 else _dtype_reason(out), grad=grad, out=out)
    return torch.ops.cutlass_ops.relu_backward(grad, out, _as_tensor(post_bias, out))


@torch.library.register_fake("cutlass_ops::relu_backward")
def _relu_backward_fake(grad, out, post_bias=None):
    _check_devices("relu_backward", ("out", out), ("grad", grad), ("post_bias", post_bias))
    torch._check(grad.shape == out.shape, lambda: "relu_backward: grad shape differs from out shape")
    fmt = torch.channels_last if out.dim() == 4 else torch.contiguous_format
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    return torch.empty_like(out, memory_format=fmt), out.new_empty((2,), dtype=acc)


def _epilogue_backward(grad: torch.Tensor, out, post_bias, acc: torch.dtype, want_sums: bool = True):
    """Backward of an ``act(z) + post_bias`` epilogue: (grad_z, sum(grad), sum(grad_z)).

    With a ReLU (out given: the op's saved output) one relu_backward pass masks the
    gradient and takes both sums (the FixUp scalars' gradients); without, grad_z is grad
    and the two sums are one (None unless want_sums)."""
    if out is None:
        total = grad.sum(dtype=acc) if want_sums else None
        return grad, total, total
    grad_z, sums = relu_backward(grad.to(out.dtype), out, post_bias)
    return grad_z, sums[0], sums[1]
