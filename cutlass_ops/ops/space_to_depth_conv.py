"""space_to_depth_conv (kernels/space_to_depth_conv): a ResNet stem, ``act(conv1x1(space_to_depth(x,
4), w)) + post_bias`` in one kernel; its wrapper, fake impl and autograd.  When the input needs
no gradient (the usual case: it is data) the backward is space_to_depth_conv_weight_grad, one
pass for the ReLU mask, the FixUp sums and dw (the patch matrix rebuilt from the saved input,
as the forward built it)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import paths
from ._common import (_INT32_MAX, Scalar, _accumulate_dtype, _aligned16, _as_tensor, _check_devices,
                      _conv_dtype, _sm70_half_reason, _grad_as, _meta, _report)
from .relu_backward import _epilogue_backward


def space_to_depth_conv(input: torch.Tensor, weight: torch.Tensor, post_bias: Scalar = None,
                        relu: bool = False) -> torch.Tensor:
    """``act(conv1x1(space_to_depth(input, 4), weight)) + post_bias`` in one kernel: a ResNet
    stem reading the (N, C, H, W) input as it is, any memory layout.

    space_to_depth puts input pixel (4p+dy, 4q+dx) of channel c at channel dy*4C + dx*C + c
    of output pixel (p, q), i.e. ``x.view(N,C,H/4,4,W/4,4).permute(0,3,5,1,2,4)``; the
    whole op equals a 4x4 stride-4 conv.  weight: (K, 16C, 1, 1).  H and W must be
    multiples of 4.  fp16/bf16 on CUDA with C <= 16 and K in {32, 64, 128} run a
    tensor-core kernel (sm80+: persistent, cp.async + mma.sync; sm70/75: WMMA); other cases
    the ATen composite.  Returns (N, K, H/4, W/4)
    in channels_last memory.
    """
    if paths.recording(input):
        why = _s2d_why_not(input, weight.shape[0] if weight.dim() else 0)
        _report("space_to_depth_conv", why, input=input, weight=weight)
    return torch.ops.cutlass_ops.space_to_depth_conv(input, weight, _as_tensor(post_bias, input),
                                                     bool(relu))


_MAX_PIXELS = _INT32_MAX - (1 << 24)  # the kernels index output pixels in 32 bits


def _s2d_why_not(input: torch.Tensor, k: int):
    """Why the space_to_depth_conv kernels (forward, and the weight gradient) do not run input
    with K output channels (kernels/space_to_depth_conv/*_cuda.cpp), None when they do,
    paths.EMPTY for an empty problem."""
    if input.dim() != 4:
        return None  # the op's own checks reject it
    n, c, h, w = input.shape
    if input.numel() == 0 or k == 0:
        return paths.EMPTY
    why = _sm70_half_reason(input, "the kernels need")
    if why is not None:
        return why
    if c > 16:
        return f"C = {c} is over 16"
    if k not in (32, 64, 128):
        return f"K = {k} is not 32, 64 or 128"
    if n * (h // 4) * (w // 4) >= _MAX_PIXELS:
        return "over 2^31 output pixels"
    return None


@torch.library.register_fake("cutlass_ops::space_to_depth_conv")
def _space_to_depth_conv_fake(input, weight, post_bias=None, relu=False):
    _check_devices("space_to_depth_conv", ("input", input), ("weight", weight), ("post_bias", post_bias))
    torch._check(input.dim() == 4, lambda: "space_to_depth_conv: input must be 4-D")
    torch._check(weight.shape[1] == 16 * input.shape[1],
                 lambda: "space_to_depth_conv: weight must have 16 * C input channels")
    n, _, h, w = input.shape
    return input.new_empty((n, weight.shape[0], h // 4, w // 4)).contiguous(memory_format=torch.channels_last)


def space_to_depth_conv_weight_grad(grad: torch.Tensor, input: torch.Tensor, out: Optional[torch.Tensor] = None,
                                    post_bias: Scalar = None):
    """The backward of ``space_to_depth_conv(input, weight, post_bias, relu)`` when ``input``
    needs no gradient (a stem's input is data), in one pass over grad, out and input:

        grad_z      = where(out != post_bias rounded, grad, 0)   # the ReLU mask; grad if out is None
        grad_weight = grad_z^T @ space_to_depth(input)           # (K, 16C, 1, 1)
        sums        = (grad.sum(), grad_z.sum())                 # post_bias's gradient is sums[0]

    ``out`` is the forward's saved output (pass it when the forward had ``relu=True``).
    grad_weight and sums are float32 (float64 for float64 inputs).  fp16/bf16 on CUDA with
    the forward kernel's shapes run a WMMA kernel (the patch matrix rebuilt from the input, as
    the WMMA forward kernel builds it); other cases the ATen composite.
    """
    if paths.recording(input):
        why = _s2d_why_not(input, grad.shape[1] if grad.dim() == 4 else 0)
        if why is None and not (_aligned16(grad, torch.channels_last) and _aligned16(out, torch.channels_last)):
            why = "grad or out is not 16-byte aligned (a channels_last view at an odd offset)"
        _report("space_to_depth_conv_weight_grad", why, grad=grad, input=input, out=out)
    return torch.ops.cutlass_ops.space_to_depth_conv_weight_grad(grad, input, out, _as_tensor(post_bias, input))


@torch.library.register_fake("cutlass_ops::space_to_depth_conv_weight_grad")
def _space_to_depth_conv_weight_grad_fake(grad, input, out=None, post_bias=None):
    _check_devices("space_to_depth_conv_weight_grad", ("input", input), ("grad", grad), ("out", out),
                   ("post_bias", post_bias))
    torch._check(input.dim() == 4 and grad.dim() == 4,
                 lambda: "space_to_depth_conv_weight_grad: input and grad must be 4-D")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    return (input.new_empty((grad.shape[1], 16 * input.shape[1], 1, 1), dtype=acc),
            input.new_empty((2,), dtype=acc))


# ---- space_to_depth_conv: y = act(conv1x1(s2d(x), w)) + post_bias -------------------------------

def _s2d_setup(ctx, inputs, output):
    x, w, post_bias, relu = inputs
    ctx.save_for_backward(x, w, post_bias, output if relu else None)
    ctx.relu = relu
    ctx.metas = [_meta(t) for t in (x, w, post_bias)]
    ctx.needs = list(ctx.needs_input_grad) + [False] * 4


def _s2d_backward(ctx, grad):
    x, w, post_bias, out = ctx.saved_tensors
    x_meta, w_meta, post_meta = ctx.metas
    if not ctx.needs[0]:
        # The usual case (the input is data): mask, sums and dw in one op (one pass on CUDA).
        grad_w, sums = space_to_depth_conv_weight_grad(grad.to(x.dtype), x, out if ctx.relu else None, post_bias)
        grad_post = _grad_as(sums[0], post_meta) if ctx.needs[2] else None
        return None, _grad_as(grad_w, w_meta) if ctx.needs[1] else None, grad_post, None
    acc, conv_dtype = _accumulate_dtype(x), _conv_dtype(x)
    g, sum_grad, _ = _epilogue_backward(grad, out if ctx.relu else None, post_bias, acc, want_sums=ctx.needs[2])
    grad_post = _grad_as(sum_grad, post_meta) if ctx.needs[2] else None
    grad_x = grad_w = None
    if ctx.needs[0] or ctx.needs[1]:
        # A 1x1 conv is a GEMM over the pixels: with G = g as (N*P*Q, K) (a view of the
        # channels_last gradient) and S = space_to_depth(x) as (N*P*Q, 16C), dw = G^T S and
        # dS = G W.  (cuDNN, given the NCHW space_to_depth view, converted g to NCHW first:
        # 0.3 of 0.45 ms at N=2048 on an H100.)
        n, c, height, width = x.shape
        k, p, q = w.shape[0], height // 4, width // 4
        g_mat = g.to(conv_dtype).permute(0, 2, 3, 1).reshape(n * p * q, k)
        if ctx.needs[1]:
            s_mat = x.to(conv_dtype).reshape(n, c, p, 4, q, 4).permute(0, 2, 4, 3, 5, 1).reshape(n * p * q, 16 * c)
            grad_w = (g_mat.t() @ s_mat).reshape(w.shape)
        if ctx.needs[0]:
            grad_s = g_mat @ w.to(conv_dtype).reshape(k, 16 * c)
            grad_x = grad_s.reshape(n, p, q, 4, 4, c).permute(0, 5, 1, 3, 2, 4).reshape(n, c, height, width)
    return _grad_as(grad_x, x_meta), _grad_as(grad_w, w_meta), grad_post, None


torch.library.register_autograd("cutlass_ops::space_to_depth_conv", _s2d_backward, setup_context=_s2d_setup)
