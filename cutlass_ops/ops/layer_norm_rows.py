"""layer_norm_rows (kernels/layer_norm_rows): LayerNorm over the last dimension fused with a
residual add; its wrapper, fake impls (forward and backward op) and autograd."""
from __future__ import annotations

from typing import Optional

import torch

from .. import paths
from ._common import _INT32_MAX, _aligned16, _check_devices, _dtype_reason, _report


def _rows_why_not(x: torch.Tensor, others, max_cols8: int):
    """Why the layer_norm_rows kernels do not run rows of x (forward: ``max_cols8`` 2048,
    backward 1024; kernels/layer_norm_rows/layer_norm_rows_device.cuh's row_shape: 8-wide
    vectors need a column count that is a multiple of 8 and 16-byte aligned rows, else at most
    512 columns), None when they do, paths.EMPTY for no rows."""
    if x.dim() == 0:
        return None  # the op's own checks reject it
    cols = x.shape[-1]
    if x.numel() == 0:
        return paths.EMPTY
    why = _dtype_reason(x)
    if why is not None:
        return why
    vec8 = cols % 8 == 0 and all(_aligned16(t) for t in (x, *others))
    limit = max_cols8 if vec8 else 512
    if cols > min(limit, _INT32_MAX):
        return (f"{cols} columns: over the kernel's {limit}" +
                ("" if vec8 else " (no 16-byte vectors: the columns are not a multiple of 8 or a row is unaligned)"))
    return None


def layer_norm_rows(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                    residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """LayerNorm over x's last dimension, computed in float32 for 16-bit x (as CvT's LayerNorm),
    after adding ``residual`` if given: returns ``(y, x + residual)`` (the sum in x's dtype, the
    next residual; None without one).  One CUDA kernel for fp16/bf16 rows of up to 2048 columns
    (a multiple of 8; otherwise up to 512; a row per 4-32 lanes of a warp), fused with the add;
    ATen's otherwise.  Differentiable (the backward's kernel: up to 1024 columns, or 512)."""
    _check_devices("layer_norm_rows", ("x", x), ("residual", residual), ("weight", weight), ("bias", bias))
    if paths.recording(x):
        _report("layer_norm_rows", _rows_why_not(x, (residual,), 2048), x=x, residual=residual)
    y, s, _, _ = torch.ops.cutlass_ops.layer_norm_rows(x, residual, weight, bias, float(eps))
    return y, (s if residual is not None else None)


@torch.library.register_fake("cutlass_ops::layer_norm_rows")
def _layer_norm_rows_fake(x, residual, weight, bias, eps):
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.new_empty(x.shape), x.new_empty(x.shape if residual is not None else (0,)),
            x.new_empty((rows,), dtype=stat), x.new_empty((rows,), dtype=stat))


@torch.library.register_fake("cutlass_ops::layer_norm_rows_backward")
def _layer_norm_rows_backward_fake(grad_y, grad_sum, s, mean, rstd, weight, weight_grad, bias_grad):
    cols = s.shape[-1]
    return (s.new_empty(s.shape), mean.new_empty((cols,) if weight_grad and weight is not None else (0,)),
            mean.new_empty((cols,) if bias_grad else (0,)))


# ---- layer_norm_rows: y = LayerNorm(s), s = x + residual ------------------------------------------

def _ln_setup(ctx, inputs, output):
    x, residual, weight, bias, eps = inputs
    _, s, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(s if residual is not None else x, weight, bias, mean, rstd)
    ctx.set_materialize_grads(False)


def _ln_backward(ctx, grad_y, grad_s, grad_mean, grad_rstd):
    """layer_norm_rows_backward: the input gradient plus the gradient reaching the sum (grad_s)
    from its other users, in one kernel for 16-bit rows on CUDA (ATen's LayerNorm backward in
    float32 otherwise)."""
    s, weight, bias, mean, rstd = ctx.saved_tensors
    if not ctx.has_residual:  # the op's second output is then an empty placeholder
        grad_s = None
    if grad_y is None:  # only the sum is used downstream
        grad_x = grad_s
        grad_w = grad_b = None
    else:
        if paths.recording(s):
            _report("layer_norm_rows_backward", _rows_why_not(s, (grad_y, grad_s), 1024), grad_y=grad_y, s=s)
        grad_x, grad_w, grad_b = torch.ops.cutlass_ops.layer_norm_rows_backward(
            grad_y, grad_s, s, mean, rstd, weight, weight is not None and ctx.needs_input_grad[2],
            bias is not None and ctx.needs_input_grad[3])
        grad_w = grad_w.to(weight.dtype) if grad_w.numel() else None
        grad_b = grad_b.to(bias.dtype) if grad_b.numel() else None
    return grad_x, (grad_x if ctx.has_residual else None), grad_w, grad_b, None


torch.library.register_autograd("cutlass_ops::layer_norm_rows", _ln_backward, setup_context=_ln_setup)
