"""Autograd for conv2d_fused, se_gate and space_to_depth_conv: backward through ATen, not
fused kernels yet.

Training works (loss.backward(), torch.optim; fp16/bf16 and float32 weights, and
torch.autocast through FusedResNet) with gradients from ATen: the conv's dgrad/wgrad
through aten.convolution_backward (in fp16/bf16 on CUDA, as PyTorch's own backward;
float32 elsewhere), the epilogue (ReLU mask, FixUp scalar sums) and the SE gate in float32
by recomputing their forward.
Nothing is saved beyond the op inputs (the convs are recomputed); the fused CUTLASS
dgrad/wgrad kernels are future work (issue: FusedResNet training).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .models import depth_to_space, space_to_depth


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _conv_dtype(t: torch.Tensor) -> torch.dtype:
    """dtype of the backward's convolutions: fp16/bf16 on CUDA stay in it (cuDNN tensor
    cores, float32 accumulation, as PyTorch's own backward); otherwise float32/64."""
    if t.is_cuda and t.dtype in (torch.float16, torch.bfloat16):
        return t.dtype
    return _compute_dtype(t)


def _grad_like(g, t):
    return None if g is None or t is None else g.to(t.dtype).reshape(t.shape)


# ---- conv2d_fused: y = act(scale * conv(x, w) + bias + residual) + post_bias -------------------

def _conv_setup(ctx, inputs, output):
    x, w, bias, residual, scale, post_bias, stride, padding, relu = inputs
    ctx.save_for_backward(x, w, bias, residual, scale)
    ctx.stride, ctx.padding, ctx.relu = list(stride), list(padding), relu
    # needs_input_grad covers the arguments the call passed (trailing defaults are dropped).
    ctx.needs = list(ctx.needs_input_grad) + [False] * 9
    ctx.has_post_bias = post_bias is not None
    ctx.post_bias_meta = (post_bias.shape, post_bias.dtype) if post_bias is not None else None


def _conv_backward(ctx, grad):
    x, w, bias, residual, scale = ctx.saved_tensors
    cd, conv_dtype = _compute_dtype(x), _conv_dtype(x)
    xc, wc, g = x.to(conv_dtype), w.to(conv_dtype), grad.to(cd)
    conv = F.conv2d(xc, wc, stride=ctx.stride, padding=ctx.padding).to(cd)
    s = scale.to(cd).reshape(()) if scale is not None else None
    grad_post = None
    if ctx.has_post_bias:
        shape, dtype = ctx.post_bias_meta
        grad_post = g.sum().to(dtype).reshape(shape)
    if ctx.relu:  # recompute the pre-activation for the mask (torch.relu: zero at <= 0)
        z = conv * s if s is not None else conv
        if bias is not None:
            z = z + (bias.to(cd).view(1, -1, 1, 1) if bias.dim() == 1 else bias.to(cd))
        if residual is not None:
            z = z + residual.to(cd)
        g = g * (z > 0)
    grad_bias = None
    needs = ctx.needs
    if bias is not None and needs[2]:
        grad_bias = g.sum(dim=(0, 2, 3)) if bias.dim() == 1 else g.sum()
    grad_residual = g if residual is not None and needs[3] else None
    grad_scale = (g * conv).sum() if s is not None and needs[4] else None
    g_conv = g * s if s is not None else g
    grad_x = grad_w = None
    if needs[0] or needs[1]:
        grad_x, grad_w, _ = torch.ops.aten.convolution_backward(
            g_conv.to(conv_dtype), xc, wc, None, ctx.stride, ctx.padding, [1, 1], False, [0, 0], 1,
            [needs[0], needs[1], False])
    return (_grad_like(grad_x, x), _grad_like(grad_w, w), _grad_like(grad_bias, bias),
            _grad_like(grad_residual, residual), _grad_like(grad_scale, scale), grad_post,
            None, None, None)


torch.library.register_autograd("cutlass_ops::conv2d_fused", _conv_backward, setup_context=_conv_setup)


# ---- se_gate: out = relu(h * g(h) + identity + identity_bias) + post_bias [, avgpool(out)] ------

def se_gate_reference(h, identity, w1, b1, w2, b2, identity_bias, post_bias):
    """The op's math in torch ops (differentiable); also the backward's recomputation."""
    gate = torch.sigmoid(F.linear(torch.relu(F.linear(h.mean((2, 3)), w1, b1)), w2, b2))
    y = h * gate[:, :, None, None] + identity
    if identity_bias is not None:
        y = y + identity_bias.reshape(())
    y = torch.relu(y)
    return y + post_bias.reshape(()) if post_bias is not None else y


def _se_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:8])
    ctx.avgpool = inputs[8]


def _se_backward(ctx, grad_out, grad_pooled):
    saved = ctx.saved_tensors
    cd = _compute_dtype(saved[0])
    # Recomputed in NCHW-contiguous memory: CUDA's avg_pool2d backward is wrong for
    # channels_last input with padding (pytorch/pytorch#188344, torch <= 2.11 at least).
    leaves = [t.detach().to(cd).contiguous().requires_grad_() if t is not None else None for t in saved]
    needs = list(ctx.needs_input_grad) + [False] * 9  # short when defaults were dropped
    with torch.enable_grad():
        out = se_gate_reference(*leaves)
        outputs, grads = [out], [grad_out.to(cd).contiguous()]
        if ctx.avgpool and grad_pooled is not None and grad_pooled.numel():
            outputs.append(F.avg_pool2d(out, 3, 2, 1, count_include_pad=True))
            grads.append(grad_pooled.to(cd).contiguous())
        wanted = [t for t, need in zip(leaves, needs) if t is not None and need]
        found = torch.autograd.grad(outputs, wanted, grads, allow_unused=True) if wanted else []
    found = iter(found)
    result = [_grad_like(next(found), s) if t is not None and need else None
              for t, s, need in zip(leaves, saved, needs)]
    return (*result, None)  # one per schema argument


torch.library.register_autograd("cutlass_ops::se_gate", _se_backward, setup_context=_se_setup)


# ---- space_to_depth_conv: y = act(conv1x1(s2d(x), w)) + post_bias -------------------------------

def _s2d_setup(ctx, inputs, output):
    x, w, post_bias, relu = inputs
    ctx.save_for_backward(x, w)
    ctx.relu = relu
    ctx.post_bias_meta = (post_bias.shape, post_bias.dtype) if post_bias is not None else None
    ctx.needs = list(ctx.needs_input_grad) + [False] * 4


def _s2d_backward(ctx, grad):
    x, w = ctx.saved_tensors
    cd, conv_dtype = _compute_dtype(x), _conv_dtype(x)
    s2d, wc, g = space_to_depth(x.to(conv_dtype)), w.to(conv_dtype), grad.to(cd)
    grad_post = None
    if ctx.post_bias_meta is not None and ctx.needs[2]:
        shape, dtype = ctx.post_bias_meta
        grad_post = g.sum().to(dtype).reshape(shape)
    if ctx.relu:  # recompute the pre-activation for the mask (torch.relu: zero at <= 0)
        g = g * (F.conv2d(s2d, wc) > 0)
    grad_x = grad_w = None
    if ctx.needs[0] or ctx.needs[1]:
        grad_s2d, grad_w, _ = torch.ops.aten.convolution_backward(
            g.to(conv_dtype), s2d, wc, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [ctx.needs[0], ctx.needs[1], False])
        if grad_s2d is not None:
            grad_x = depth_to_space(grad_s2d, x.shape[1])
    return _grad_like(grad_x, x), _grad_like(grad_w, w), grad_post, None


torch.library.register_autograd("cutlass_ops::space_to_depth_conv", _s2d_backward, setup_context=_s2d_setup)
