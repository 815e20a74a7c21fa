"""linear_residual (kernels/linear_residual): ``residual + alpha * x @ weight^T + bias`` in one
cuBLASLt matmul; its wrapper, fake impl and autograd."""
from __future__ import annotations

from typing import Optional

import torch

from .. import paths
from ._common import _check_devices, _gemm_why_not, _report


def linear_residual(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,
                    alpha: float = 1.0) -> torch.Tensor:
    """residual + alpha * x @ weight^T + bias: x (..., K), weight (N, K), bias (N,) or None,
    residual (..., N) -> a new (..., N) tensor in x's dtype (a transformer's output projection
    or second MLP Linear landing on the residual stream).  On CUDA in fp16/bf16 with K and N
    multiples of 8, one cuBLASLt matmul: the residual as its C input (beta = 1), the bias (read
    in x's dtype) in its epilogue, float32 accumulation, one rounding; elsewhere ATen in float32
    (float64 for float64), rounded once (also where cuBLASLt's heuristic offers no algorithm:
    not reported as a fallback).  Differentiable."""
    _check_devices("linear_residual", ("x", x), ("weight", weight), ("bias", bias), ("residual", residual))
    if paths.recording(x):
        _report("linear_residual", _gemm_why_not(x, weight), x=x, weight=weight, residual=residual)
    return torch.ops.cutlass_ops.linear_residual(x, weight, bias, residual, float(alpha))


@torch.library.register_fake("cutlass_ops::linear_residual")
def _linear_residual_fake(x, weight, bias, residual, alpha):
    return residual.new_empty(residual.shape)


# ---- linear_residual: out = residual + alpha * x @ weight^T + bias -----------------------------

def _linear_residual_setup(ctx, inputs, output):
    x, weight, bias, residual, alpha = inputs
    ctx.alpha = alpha
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _linear_residual_backward(ctx, grad):
    """grad_residual = grad; with g = alpha grad: grad_x = g W, grad_W = g^T x, grad_bias = sum
    grad (cuBLAS GEMMs, float32 accumulation)."""
    x, weight = ctx.saved_tensors
    g2d = grad.reshape(-1, weight.shape[0])
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (ctx.alpha * (g2d @ weight)).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_w = ctx.alpha * (g2d.t() @ x.reshape(-1, x.shape[-1]))
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g2d.sum(0)
    return grad_x, grad_w, grad_b, grad if ctx.needs_input_grad[3] else None, None


torch.library.register_autograd("cutlass_ops::linear_residual", _linear_residual_backward,
                                setup_context=_linear_residual_setup)
