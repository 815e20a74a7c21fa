"""linear_silu (kernels/linear_silu): ``silu(alpha * (x @ weight^T + bias))`` in one generated
CUTLASS GEMM on sm90; its wrapper, kernel list, fake impl and autograd."""
from __future__ import annotations

from typing import Optional

import torch

from .. import paths
from ._common import _aligned16, _capability, _check_devices, _gemm_why_not, _report


def linear_silu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                alpha: float = 1.0) -> torch.Tensor:
    """silu(alpha * (x @ weight^T + bias)): x (..., K), weight (N, K), bias (N,) or None
    -> (..., N) in x's dtype.  On an sm90 GPU (H100/H200) in fp16/bf16 with K and N multiples
    of 8, one generated CUTLASS GEMM whose epilogue adds the bias (read in x's dtype), scales
    and applies the SiLU in float32 and rounds once (``linear_silu_kernels()``); elsewhere
    ATen in float32 (float64 for float64): correct, slower than cuBLAS + F.silu.
    Differentiable (the backward recomputes the pre-activation with ATen).  CvT's QuickGELU
    after fc1, z sigmoid(1.702 z), is silu(1.702 z) / 1.702: alpha 1.702 and fc1's own bias,
    the 1/1.702 going into fc2 (FusedCvT._silu_mlp)."""
    _check_devices("linear_silu", ("x", x), ("weight", weight), ("bias", bias))
    if paths.recording(x):
        _report("linear_silu", _linear_silu_why_not(x, weight), x=x, weight=weight)
    return torch.ops.cutlass_ops.linear_silu(x, weight, bias, float(alpha))


def linear_silu_kernels() -> list[str]:
    """The fused linear_silu kernels this build compiled, "<name> (<dtype>)" (none in a build
    without arch 90 or a CPU-only one)."""
    if not hasattr(torch.ops.cutlass_ops, "linear_silu_kernels"):  # registered by CUDA builds only
        return []
    return list(torch.ops.cutlass_ops.linear_silu_kernels())


_BUILT: list = []  # linear_silu_kernels(), read once


def _linear_silu_why_not(x: torch.Tensor, weight: torch.Tensor):
    """Why linear_silu's CUDA op takes ATen (kernels/linear_silu/linear_silu_cuda.cpp), None
    when its kernel runs, paths.EMPTY for an empty problem.  Not seen here: an instance's own
    refusal of the problem (none does for the shapes these checks pass)."""
    why = _gemm_why_not(x, weight)
    if why is not None:
        return why
    if not _BUILT:
        _BUILT.append(bool(linear_silu_kernels()))
    if not _BUILT[0]:
        return "this build has no linear_silu kernels (they need arch 90 in CUTLASS_OPS_ARCHS)"
    if _capability(x) != 90:
        return "the kernels run on sm90 (H100/H200) only"
    if not (_aligned16(x) and _aligned16(weight)):
        return "x or weight is not 16-byte aligned (a view at an odd offset)"
    return None


@torch.library.register_fake("cutlass_ops::linear_silu")
def _linear_silu_fake(x, weight, bias, alpha):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# ---- linear_silu: y = silu(alpha * (x @ weight^T + bias)) -------------------------------------

def _linear_silu_setup(ctx, inputs, output):
    x, weight, bias, alpha = inputs
    ctx.alpha = alpha
    ctx.save_for_backward(x, weight, bias)


def _linear_silu_backward(ctx, grad_y):
    """The pre-activation z = alpha (x W^T + b) recomputed by ATen in float32 (float64 for
    float64), then g = alpha grad_y silu'(z): grad_x = g W, grad_W = g^T x, grad_bias = sum g."""
    x, weight, bias = ctx.saved_tensors
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    x2 = x.reshape(-1, x.shape[-1]).to(ct)
    w = weight.to(ct)
    z = x2 @ w.t()
    if bias is not None:
        z = z + bias.to(ct)
    z = ctx.alpha * z
    s = torch.sigmoid(z)
    g = ctx.alpha * grad_y.reshape(-1, weight.shape[0]).to(ct) * (s * (1 + z * (1 - s)))
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (g @ w).reshape(x.shape).to(x.dtype)
    if ctx.needs_input_grad[1]:
        grad_w = (g.t() @ x2).to(weight.dtype)
    if bias is not None and ctx.needs_input_grad[2]:
        grad_b = g.sum(0).to(bias.dtype)
    return grad_x, grad_w, grad_b, None


torch.library.register_autograd("cutlass_ops::linear_silu", _linear_silu_backward, setup_context=_linear_silu_setup)
