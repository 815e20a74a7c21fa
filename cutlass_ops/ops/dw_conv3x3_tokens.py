"""dw_conv3x3_tokens (kernels/dw_conv3x3_tokens): depthwise 3x3 convs on the map a token tensor
holds (CvT's q, k, v projections), layer_norm_dw_conv3x3_tokens (the same after a LayerNorm)
and dw_conv3x3_tokens_backward_input; wrappers, fake impls and autograd."""
from __future__ import annotations

import os
from typing import Optional, Sequence

import torch

from .. import paths
from ._common import _check_devices, _dtype_reason, _report


def _dw_why_not(x: torch.Tensor):
    """Why the dw_conv3x3_tokens kernels do not run tokens x (kernels/dw_conv3x3_tokens/
    dw_conv3x3_tokens_cuda.cpp), None when they do, paths.EMPTY for no tokens."""
    return paths.EMPTY if x.numel() == 0 else _dtype_reason(x)


def dw_conv3x3_tokens(x: torch.Tensor, h: int, w: int, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      strides: Sequence[int], lead: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """Depthwise 3x3 convs (padding 1, stride 1 or 2 each) with per-channel biases on the NHWC
    map that tokens x (N, h*w, C) hold, one per entry of ``strides`` (1 to 3; CvT's q, k, v:
    [1, 2, 2]), weight (len(strides), C, 1, 3, 3), bias (len(strides), C) or None.  Returns one
    tokens tensor (N, L + Ho*Wo, C) per conv, whose first L rows are ``lead`` (N, L, C) (CvT's
    cls token; none: L = 0).  x and lead may be views of one token tensor (images apart, rows
    contiguous): read in place.  One CUDA kernel for all the convs in fp16/bf16 (the map read
    once; float32 arithmetic; weight and bias read in x's dtype or float32), ATen's conv
    otherwise.  Differentiable: the input gradient of all the convs in one
    ``dw_conv3x3_tokens_backward_input`` kernel (fp16/bf16 on CUDA), the weights' by cuDNN's
    depthwise wgrad per conv, the biases' and the lead rows' by sums."""
    _check_devices("dw_conv3x3_tokens", ("x", x), ("weight", weight), ("bias", bias), ("lead", lead))
    if isinstance(strides, int):
        raise TypeError("dw_conv3x3_tokens: strides must be a list (one stride per conv), e.g. [1, 2, 2]")
    if paths.recording(x):
        _report("dw_conv3x3_tokens", _dw_why_not(x), x=x, h=h, w=w, weight=weight, lead=lead)
    return torch.ops.cutlass_ops.dw_conv3x3_tokens(x, int(h), int(w), weight, bias, [int(s) for s in strides], lead)


def layer_norm_dw_conv3x3_tokens(x: torch.Tensor, h: int, w: int, ln_weight: Optional[torch.Tensor],
                                 ln_bias: Optional[torch.Tensor], eps: float, weight: torch.Tensor,
                                 bias: Optional[torch.Tensor], strides: Sequence[int],
                                 lead: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """``dw_conv3x3_tokens(LayerNorm(x), h, w, weight, bias, strides, LayerNorm(lead))``, the
    LayerNorm over C (ln_weight, ln_bias (C,) or None, eps) computed in float32 and rounded to
    x's dtype, as ``layer_norm_rows`` writes it: a CvT block's norm1 and its three dw_bn
    projections.  On CUDA in fp16/bf16 one tiled kernel: each band of the map is normalized in
    shared memory right after it is read (every channel of a pixel in one CTA; the padding stays
    zero) and convolved from there, so the normalized map is never written; where that kernel
    does not run (the band too large for shared memory, unaligned views, CUTLASS_OPS_DW_TILE=0)
    ATen's LayerNorm first, then dw_conv3x3_tokens.  Elsewhere ATen.  Differentiable (the backward
    recomputes the LayerNorm and differentiates through dw_conv3x3_tokens)."""
    _check_devices("layer_norm_dw_conv3x3_tokens", ("x", x), ("ln_weight", ln_weight), ("ln_bias", ln_bias),
                   ("weight", weight), ("bias", bias), ("lead", lead))
    if isinstance(strides, int):
        raise TypeError("layer_norm_dw_conv3x3_tokens: strides must be a list (one stride per conv), e.g. [1, 2, 2]")
    if paths.recording(x):
        why = _dw_why_not(x)
        if why is None and os.environ.get("CUTLASS_OPS_DW_TILE", "") == "0":
            # the user's choice, not a gap: recorded as such (no warning; allowed in strict mode)
            paths.record("layer_norm_dw_conv3x3_tokens",
                         "aten: ATen's LayerNorm, then the dw_conv3x3_tokens strip kernel (CUTLASS_OPS_DW_TILE=0)")
        else:
            _report("layer_norm_dw_conv3x3_tokens", why, x=x, h=h, w=w, weight=weight, lead=lead)
    return torch.ops.cutlass_ops.layer_norm_dw_conv3x3_tokens(x, int(h), int(w), ln_weight, ln_bias, float(eps),
                                                             weight, bias, [int(s) for s in strides], lead)


@torch.library.register_fake("cutlass_ops::layer_norm_dw_conv3x3_tokens")
def _layer_norm_dw_conv3x3_tokens_fake(x, h, w, ln_weight, ln_bias, eps, weight, bias, strides, lead):
    return _dw_conv3x3_tokens_fake(x, h, w, weight, bias, strides, lead)


def dw_conv3x3_tokens_backward_input(grad_y: Sequence[torch.Tensor], h: int, w: int, weight: torch.Tensor,
                                     strides: Sequence[int]) -> torch.Tensor:
    """The input gradient of dw_conv3x3_tokens's convs: grad_y[j] (N, Ho_j*Wo_j, C), the
    gradients of output j's conv rows (images may be apart: slices behind lead rows) -> grad_x
    (N, h*w, C), the sum over the convs of each one's transposed conv, written once.  One CUDA
    kernel for fp16/bf16 (float32 sums), ATen's conv_transpose2d otherwise."""
    if grad_y and paths.recording(grad_y[0]):
        _report("dw_conv3x3_tokens_backward_input", _dw_why_not(grad_y[0]), grad_y=list(grad_y), h=h, w=w)
    return torch.ops.cutlass_ops.dw_conv3x3_tokens_backward_input(list(grad_y), int(h), int(w), weight,
                                                                  [int(s) for s in strides])


@torch.library.register_fake("cutlass_ops::dw_conv3x3_tokens_backward_input")
def _dw_conv3x3_tokens_backward_input_fake(grad_y, h, w, weight, strides):
    return grad_y[0].new_empty((grad_y[0].shape[0], h * w, grad_y[0].shape[2]))


@torch.library.register_fake("cutlass_ops::dw_conv3x3_tokens")
def _dw_conv3x3_tokens_fake(x, h, w, weight, bias, strides, lead):
    lead_rows = lead.shape[1] if lead is not None else 0
    return [x.new_empty((x.shape[0], lead_rows + ((h - 1) // s + 1) * ((w - 1) // s + 1), x.shape[2]))
            for s in strides]


# ---- dw_conv3x3_tokens: depthwise 3x3 convs on a token map, lead rows in front ----------------

def _dw_tokens_setup(ctx, inputs, output):
    x, h, w, weight, bias, strides, lead = inputs
    ctx.geometry = (h, w, list(strides), 0 if lead is None else lead.shape[1])
    ctx.has_bias, ctx.has_lead = bias is not None, lead is not None
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(x, weight)


def _dw_tokens_backward(ctx, grads):
    """grad_x: one dw_conv3x3_tokens_backward_input kernel for all the convs (fp16/bf16 on CUDA);
    grad_weight: ATen's depthwise wgrad (cuDNN on CUDA) per conv on the NHWC map; grad_bias: each
    output's conv rows summed in float32; grad_lead: the lead rows' gradients summed over the
    outputs."""
    x, weight = ctx.saved_tensors
    h, w, strides, lead = ctx.geometry
    n, _, c = x.shape
    convs = [g[:, lead:] for g in grads]
    grad_x = grad_w = grad_b = grad_lead = None
    if ctx.needs_input_grad[0]:
        grad_x = dw_conv3x3_tokens_backward_input(convs, h, w, weight, strides)  # (records its path)
    if ctx.needs_input_grad[3]:
        m = x.reshape(n, h, w, c)
        m = (m if m.is_contiguous() else m.contiguous()).permute(0, 3, 1, 2)  # NHWC memory, NCHW view
        parts = []
        for j, (g, s) in enumerate(zip(convs, strides)):
            ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
            gm = g.reshape(n, ho, wo, c)
            gm = (gm if gm.is_contiguous() else gm.contiguous()).permute(0, 3, 1, 2)
            # convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation,
            # transposed, output_padding, groups, output_mask): the weight's gradient only
            parts.append(torch.ops.aten.convolution_backward(
                gm, m, weight[j].to(x.dtype), None, [s, s], [1, 1], [1, 1], False, [0, 0], c,
                [False, True, False])[1])
        grad_w = torch.stack(parts).to(weight.dtype)
    if ctx.has_bias and ctx.needs_input_grad[4]:
        grad_b = torch.stack([g.sum((0, 1), dtype=torch.float32) for g in convs]).to(ctx.bias_dtype)
    if ctx.has_lead and ctx.needs_input_grad[6]:
        grad_lead = sum(g[:, :lead] for g in grads)
    return grad_x, None, None, grad_w, grad_b, None, grad_lead


torch.library.register_autograd("cutlass_ops::dw_conv3x3_tokens", _dw_tokens_backward, setup_context=_dw_tokens_setup)


# ---- layer_norm_dw_conv3x3_tokens: dw_conv3x3_tokens on LayerNorm(x) (and LayerNorm(lead)) -------

def _ln_dw_tokens_setup(ctx, inputs, output):
    x, h, w, ln_weight, ln_bias, eps, weight, bias, strides, lead = inputs
    ctx.geometry = (h, w, eps, list(strides))
    ctx.save_for_backward(x, ln_weight, ln_bias, weight, bias, lead)


def _ln_dw_tokens_backward(ctx, grads):
    """Recomputes the LayerNorms (float32 statistics, rounded as the op does) and the convs
    through dw_conv3x3_tokens under autograd, then differentiates them (the op runs in
    inference; this is for correctness, not speed)."""
    h, w, eps, strides = ctx.geometry
    saved = ctx.saved_tensors  # x, ln_weight, ln_bias, weight, bias, lead
    wants = [ctx.needs_input_grad[i] for i in (0, 3, 4, 6, 7, 9)]
    with torch.enable_grad():
        x, ln_w, ln_b, weight, bias, lead = [None if t is None else t.detach().requires_grad_(want)
                                             for t, want in zip(saved, wants)]

        def normed(t):
            ct = torch.float64 if t.dtype == torch.float64 else torch.float32
            return torch.nn.functional.layer_norm(t.to(ct), (t.shape[-1],), None if ln_w is None else ln_w.to(ct),
                                                  None if ln_b is None else ln_b.to(ct), eps).to(t.dtype)
        ys = torch.ops.cutlass_ops.dw_conv3x3_tokens(normed(x), h, w, weight, bias, strides,
                                                     None if lead is None else normed(lead))
        leaves = [t for t, want in zip((x, ln_w, ln_b, weight, bias, lead), wants) if t is not None and want]
        found = iter(torch.autograd.grad(ys, leaves, grads, allow_unused=True) if leaves else ())
    g = [next(found) if t is not None and want else None
         for t, want in zip((x, ln_w, ln_b, weight, bias, lead), wants)]
    return g[0], None, None, g[1], g[2], None, g[3], g[4], None, g[5]


torch.library.register_autograd("cutlass_ops::layer_norm_dw_conv3x3_tokens", _ln_dw_tokens_backward,
                                setup_context=_ln_dw_tokens_setup)
