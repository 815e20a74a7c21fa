"""conv_embed (kernels/conv_embed): a conv token embedding with an optional LayerNorm over the
channels in one kernel; its wrapper, fake impl and autograd."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import paths
from ._common import _INT32_MAX, _check_devices, _sm70_half_reason, _pair, _report


def _conv_embed_why_not(input: torch.Tensor, weight: torch.Tensor, stride, padding):
    """Why conv_embed's kernel does not run (kernels/conv_embed/conv_embed_cuda.cpp and its
    kernel_supports), None when it does, paths.EMPTY for an empty output."""
    if input.dim() != 4 or weight.dim() != 4:
        return None  # the op's own checks reject it
    n, c, h, w = input.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    why = _sm70_half_reason(input, "the kernel needs")
    if why is not None:
        return why
    if s > 8:
        return f"the kernel is {s} wide (at most 8)"
    if c * r * 8 > 256:
        return f"C * R = {c * r} (at most 32)"
    if k not in (32, 64, 128):
        return f"K = {k} is not 32, 64 or 128"
    if max(stride) > 1 << 20 or max(padding) > 1 << 20 or n * max(p, 0) * max(q, 0) >= _INT32_MAX - 4096 or \
            max(h, w) >= _INT32_MAX // 2:
        return "sizes past the kernel's 32-bit indexing"
    if n * p * q == 0:
        return paths.EMPTY
    return None


def conv_embed(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
               layer_norm: bool = False, ln_weight: Optional[torch.Tensor] = None,
               ln_bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """A token embedding: conv2d(input, weight, bias, stride, padding) (no dilation, no groups),
    then with layer_norm a LayerNorm over the output channels (ln_weight, ln_bias, eps), as
    tokens (N, P*Q, K) in (n, p, q) order, contiguous, in input's dtype.  input: (N, C, H, W) in
    any strides (NCHW as a user holds an image batch: no layout copy).  One CUDA kernel for
    fp16/bf16 with a kernel at most 8 wide, C*R <= 32 and K 32, 64 or 128 (CvT's 7x7/4 embedding
    from 3 channels: the patch gathered straight from the image, WMMA tensor cores, the bias and
    the LayerNorm in float32 on the accumulators, one rounding); ATen in float32 (float64 for
    float64) otherwise.
    Differentiable (the backward recomputes the conv and the LayerNorm with ATen)."""
    _check_devices("conv_embed", ("input", input), ("weight", weight), ("bias", bias), ("ln_weight", ln_weight),
                   ("ln_bias", ln_bias))
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    if paths.recording(input):
        _report("conv_embed", _conv_embed_why_not(input, weight, stride, padding), input=input, weight=weight,
                stride=stride, padding=padding)
    return torch.ops.cutlass_ops.conv_embed(input, weight, bias, stride, padding, bool(layer_norm), ln_weight, ln_bias,
                                            float(eps))


@torch.library.register_fake("cutlass_ops::conv_embed")
def _conv_embed_fake(input, weight, bias, stride, padding, layer_norm=False, ln_weight=None, ln_bias=None, eps=1e-5):
    p = (input.shape[2] + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    q = (input.shape[3] + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    return input.new_empty((input.shape[0], p * q, weight.shape[0]))


# ---- conv_embed: tokens = LayerNorm(conv2d(x, w, b)) over the channels ----------------------------

_CONV_EMBED_DEFAULTS = (False, None, None, 1e-5)  # the schema's layer_norm, ln_weight, ln_bias, eps


def _conv_embed_setup(ctx, inputs, output):
    # a direct torch.ops call may leave the defaulted arguments out of `inputs`
    x, weight, bias, stride, padding, *rest = inputs
    layer_norm, ln_weight, ln_bias, eps = tuple(rest) + _CONV_EMBED_DEFAULTS[len(rest):]
    ctx.geometry = (stride, padding, layer_norm, eps)
    ctx.save_for_backward(x, weight, bias, ln_weight, ln_bias)


def _conv_embed_backward(ctx, grad):
    """The forward recomputed by ATen in float32 (float64 for float64) and differentiated there:
    the op's kernel has no backward of its own (FusedCvT trains through cuDNN's conv instead)."""
    x, weight, bias, ln_weight, ln_bias = ctx.saved_tensors
    stride, padding, layer_norm, eps = ctx.geometry
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    saved = (x, weight, bias, ln_weight, ln_bias)
    passed = len(ctx.needs_input_grad)  # a direct torch.ops call may pass fewer arguments
    needs = [i < passed and ctx.needs_input_grad[i] for i in (0, 1, 2, 6, 7)]  # those five's arguments
    inputs = [t.detach().to(ct).requires_grad_(need) if t is not None else None for t, need in zip(saved, needs)]
    with torch.enable_grad():
        y = torch.nn.functional.conv2d(inputs[0], inputs[1], inputs[2], stride, padding)
        t = y.flatten(2).transpose(1, 2)
        if layer_norm:
            t = torch.nn.functional.layer_norm(t, (t.shape[-1],), inputs[3], inputs[4], eps)
        wanted = [i for i, v in enumerate(inputs) if v is not None and v.requires_grad]
        grads = torch.autograd.grad(t, [inputs[i] for i in wanted], grad.to(ct)) if wanted else ()
    out = [None] * 5
    for i, g in zip(wanted, grads):
        out[i] = g.to(saved[i].dtype)
    x_g, w_g, b_g, lnw_g, lnb_g = out
    return (x_g, w_g, b_g, None, None, None, lnw_g, lnb_g, None)[:passed]


torch.library.register_autograd("cutlass_ops::conv_embed", _conv_embed_backward, setup_context=_conv_embed_setup)
