"""A Linear layer whose backward takes the bias gradient from cuBLAS, for FusedCvT's training step.

``linear(x, weight, bias, alpha)`` computes ``alpha * x @ weight^T + bias`` (x (..., in), weight
(out, in), bias (out,) or None) like ``F.linear`` / ``torch.addmm``, with one difference, in the
backward: ``F.linear``'s bias gradient is ATen's column sum of the output gradient
(``grad.sum(0)``), whose reduce kernel is slow on tall narrow 16-bit matrices (H200, CvT-13's
training step at N=64: 95 us for a 50176 x 192 sum, 2.2 ms for the step's 81 sums); here it is a
GEMV with a ones vector (``grad^T @ 1``), float32 accumulation inside cuBLAS as in the weight's
gradient GEMM.  CUTLASS_OPS_LINEAR_BGRAD=sum turns it back into ATen's sum (read per call).
Input, weight and output gradients use the same GEMMs as ``F.linear``'s backward.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn.functional as F


def bias_grad_by_gemv() -> bool:
    """CUTLASS_OPS_LINEAR_BGRAD (default gemv): the bias gradient as a GEMV with ones; =sum: ATen's
    column sum (F.linear's).  Read per call."""
    return os.environ.get("CUTLASS_OPS_LINEAR_BGRAD", "gemv") != "sum"


def _addmm(x, weight, bias, alpha):
    """alpha * x @ weight^T + bias in one cuBLAS call (alpha applied in float32 before rounding);
    without a bias, beta = 0 and the unused input ignored (torch.addmm's documented rule)."""
    x2d = x.reshape(-1, x.shape[-1])
    if bias is None:
        out = torch.addmm(x2d.new_empty(()), x2d, weight.t(), beta=0, alpha=alpha)
    else:
        out = torch.addmm(bias, x2d, weight.t(), alpha=alpha)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(x, weight, bias, alpha):
        return _addmm(x, weight, bias, alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, alpha = inputs
        ctx.save_for_backward(x, weight)
        ctx.alpha = alpha
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        alpha = ctx.alpha
        g2d = grad.reshape(-1, grad.shape[-1])
        unused = g2d.new_empty(())  # beta = 0: ignored, NaN included (torch.addmm's documented rule)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.addmm(unused, g2d, weight, beta=0, alpha=alpha).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            grad_w = torch.addmm(unused, g2d.t(), x.reshape(-1, x.shape[-1]), beta=0, alpha=alpha)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            if bias_grad_by_gemv():
                grad_b = torch.mv(g2d.t(), g2d.new_ones(g2d.shape[0]))
            else:
                grad_b = g2d.sum(0)
        return grad_x, grad_w, grad_b, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           alpha: float = 1.0) -> torch.Tensor:
    """alpha * x @ weight^T + bias, its bias gradient a GEMV (module docstring); plain
    ``F.linear`` / ``torch.addmm`` where no gradient is recorded, under autocast (whose casts
    the backward would have to redo) or where x, weight and bias differ in dtype."""
    recorded = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                            (bias is not None and bias.requires_grad))
    same_dtype = x.dtype == weight.dtype and (bias is None or bias.dtype == x.dtype)
    if recorded and same_dtype and not torch.is_autocast_enabled(x.device.type):
        return _Linear.apply(x, weight, bias, alpha)
    return F.linear(x, weight, bias) if alpha == 1 else _addmm(x, weight, bias, alpha)


__all__ = ["linear", "bias_grad_by_gemv"]
