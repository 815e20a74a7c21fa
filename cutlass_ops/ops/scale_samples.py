"""scale_samples (kernels/scale_samples): ``x[n, ...] * scale[n]``, FusedCvT's drop path; its
wrapper, fake impl and autograd."""
from __future__ import annotations

import torch

from .. import paths
from ._common import _check_devices, _dtype_reason, _report


def scale_samples(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x[n, ...] * scale[n]: scale (N,) float32 (float64 for a float64 x), the product in scale's
    dtype rounded once to x's dtype.  One CUDA kernel for fp16/bf16 (16-byte accesses where the
    sample size and pointers allow), ATen otherwise.  Differentiable in x (the backward is the
    same multiply; scale gets no gradient).  FusedCvT's drop path: scale = mask / keep_prob."""
    _check_devices("scale_samples", ("x", x), ("scale", scale))
    if paths.recording(x):
        _report("scale_samples", paths.EMPTY if x.numel() == 0 else _dtype_reason(x), x=x, scale=scale)
    return torch.ops.cutlass_ops.scale_samples(x, scale)


@torch.library.register_fake("cutlass_ops::scale_samples")
def _scale_samples_fake(x, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---- scale_samples: y = x * scale[n] per sample (FusedCvT's drop path) -------------------------

def _scale_samples_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _scale_samples_backward(ctx, grad):
    (scale,) = ctx.saved_tensors
    return torch.ops.cutlass_ops.scale_samples(grad, scale), None


torch.library.register_autograd("cutlass_ops::scale_samples", _scale_samples_backward,
                                setup_context=_scale_samples_setup)
