"""A stride-1 conv on a map smaller than its kernel footprint, run as a dense layer.

FusedResNet's block-3 conv2 sees a 2x2 map: there a 3x3 conv with padding 1 multiplies
padding zeros in 5 of every 9 taps.  Flattened, the map is one "pixel" of H*W*C channels
and the conv is a 1x1 conv with a dense (P*Q*K, H*W*C) weight built from the kernel's taps,
which does H*W/(R*S) of the implicit GEMM's work (4/9 at 2x2).

  forward:  y = scale * conv1x1(flat(h), dense(w)), one conv2d_fused (scale in its epilogue)
  backward: grad_h as the dense layer's conv2d_dgrad (the same saving); grad_w and
            grad_scale from the 3x3 conv's conv2d_wgrad (the dense weight's own gradient
            would then need summing over the taps back into w); under CUDA-graph capture
            the wgrad runs on a side stream beside the dgrad, as in ops/conv2d_fused.py.
The dense weight is one gather kernel, rebuilt on every training forward (the weight
trains; FusedResNet issues it on a side stream at the start of a captured forward);
inference caches it (FusedResNet._cached).
"""
from __future__ import annotations

import contextlib

import torch

from .streams import fork_side_stream, join_side_stream, single_use_declared, stored_as_is, use_side_stream
from .ops import conv2d_dgrad, conv2d_fused, conv2d_wgrad


def runs_dense(height: int, width: int, kernel_h: int = 3, kernel_w: int = 3) -> bool:
    """Whether a stride-1 conv on an H x W map runs as a dense layer: on maps smaller than
    the kernel footprint (H*W < R*S)."""
    return height * width < kernel_h * kernel_w


_ROW_INDEX: dict = {}


def _dense_row_index(k: int, r: int, s: int, height: int, width: int, padding: int, device) -> torch.Tensor:
    """For each (p, q, k, y, x) of the dense weight, its row in the (K*R*S + 1, C) table of
    kernel taps: k*R*S + (y - p + padding)*S + (x - q + padding), or K*R*S (a row of zeros)
    where that tap lies outside the kernel.  Built with device ops (no host copy, so also
    inside a CUDA graph capture) and cached per shape and device."""
    key = (k, r, s, height, width, padding, str(device))
    index = _ROW_INDEX.get(key)
    if index is None:
        p, q = height + 2 * padding - r + 1, width + 2 * padding - s + 1

        def axis(n, shape):
            return torch.arange(n, device=device).view(shape)

        pp, qq, kk = axis(p, (p, 1, 1, 1, 1)), axis(q, (1, q, 1, 1, 1)), axis(k, (1, 1, k, 1, 1))
        yy, xx = axis(height, (1, 1, 1, height, 1)), axis(width, (1, 1, 1, 1, width))
        tap_r, tap_s = yy - pp + padding, xx - qq + padding
        inside = (tap_r >= 0) & (tap_r < r) & (tap_s >= 0) & (tap_s < s)
        index = torch.where(inside, kk * (r * s) + tap_r * s + tap_s, k * r * s).reshape(-1)
        if not torch.compiler.is_compiling():  # a traced tensor must not leak into the cache
            _ROW_INDEX[key] = index
    return index


def dense_conv_weight(weight: torch.Tensor, height: int, width: int, padding: int) -> torch.Tensor:
    """The stride-1 conv of ``weight`` (K, C, R, S) on an H x W map as a dense matrix.

    Returns (P*Q*K, H*W*C, 1, 1) with entry [(p, q, k), (y, x, c)] =
    weight[k, c, y - p + padding, x - q + padding] (zero outside the kernel), so that a 1x1
    conv of the map flattened to (N, H*W*C, 1, 1) gives the conv's output flattened the
    same way.  One gather (index_select) over the kernel's taps.
    """
    k, c, r, s = weight.shape
    p, q = height + 2 * padding - r + 1, width + 2 * padding - s + 1
    taps = weight.permute(0, 2, 3, 1).reshape(k * r * s, c)  # a view of a channels_last weight
    if p - 1 > padding or q - 1 > padding or height + padding > r or width + padding > s:
        taps = torch.cat([taps, weight.new_zeros(1, c)])  # some (p, y) pairs fall outside the kernel
    index = _dense_row_index(k, r, s, height, width, padding, weight.device)
    return taps.index_select(0, index).view(p * q * k, height * width * c, 1, 1)


def _flatten_map(t: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, H*W*C, 1, 1): a view of a channels_last tensor."""
    n, c, height, width = t.shape
    return t.permute(0, 2, 3, 1).reshape(n, 1, 1, height * width * c).permute(0, 3, 1, 2)


def _unflatten_map(t: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """(N, H*W*C, 1, 1) -> (N, C, H, W) channels_last (a view)."""
    return t.permute(0, 2, 3, 1).reshape(t.shape[0], height, width, channels).permute(0, 3, 1, 2)


def _dense_forward(h: torch.Tensor, dense: torch.Tensor, scale, out_channels: int, padding: int,
                   kernel: tuple) -> torch.Tensor:
    height, width = h.shape[2], h.shape[3]
    p, q = height + 2 * padding - kernel[0] + 1, width + 2 * padding - kernel[1] + 1
    y = conv2d_fused(_flatten_map(h), dense, None, None, 1, 0, scale, None, relu=False)
    return _unflatten_map(y, out_channels, p, q)


class _SmallMapConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, scale, padding, dense):
        if dense is None:
            dense = dense_conv_weight(weight, h.shape[2], h.shape[3], padding)
        # Under torch.compile (torch 2.14) saving a tensor built here fails to trace (dynamo: "an
        # intermediate tensor 'dense' ... aliases an input or output"): the backward rebuilds it.
        ctx.save_for_backward(h, weight, scale, None if torch.compiler.is_compiling() else dense)
        ctx.padding, ctx.used_once = padding, single_use_declared()
        return _dense_forward(h, dense, scale, weight.shape[0], padding, weight.shape[2:])

    @staticmethod
    def backward(ctx, grad):
        h, weight, scale, dense = ctx.saved_tensors
        if dense is None:
            dense = dense_conv_weight(weight, h.shape[2], h.shape[3], ctx.padding)
        needs_h, needs_w, needs_scale = ctx.needs_input_grad[:3]
        g = grad.to(h.dtype)
        grad_h = grad_w = grad_scale = None
        beside = needs_h and (needs_w or needs_scale) and use_side_stream(g)  # wgrad beside dgrad
        side = fork_side_stream(g.device) if beside else None
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            if needs_w or needs_scale:
                grad_w, grad_scale = conv2d_wgrad(g, h, weight, 1, ctx.padding, scale)
                grad_w = grad_w if needs_w else None
                grad_scale = grad_scale.to(scale.dtype).reshape(scale.shape) if needs_scale else None
        if needs_h:
            n, c, height, width = h.shape
            flat_grad = conv2d_dgrad(_flatten_map(g), dense, (n, height * width * c, 1, 1), 1, 0, scale)
            grad_h = _unflatten_map(flat_grad, c, height, width)
        defer = stored_as_is(weight, ctx.used_once) and stored_as_is(scale if needs_scale else None, ctx.used_once)
        join_side_stream(side, (grad_w, grad_scale), (g, h), at_end_of_backward=defer)
        return grad_h, grad_w, grad_scale, None, None


def small_map_conv(h: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, padding: int,
                   dense: torch.Tensor | None = None) -> torch.Tensor:
    """``scale * conv2d(h, weight, stride=1, padding)`` as a dense layer (see the module
    docstring; meant for runs_dense maps), differentiable in h, weight and scale.  ``dense``:
    dense_conv_weight(weight, H, W, padding) when the caller built it already (an inference
    cache, or a build issued earlier on another stream); the weight's gradient comes from the
    3x3 conv either way."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, scale)):
        return _SmallMapConv.apply(h, weight, scale, padding, dense)
    if dense is None:
        dense = dense_conv_weight(weight, h.shape[2], h.shape[3], padding)
    return _dense_forward(h, dense, scale, weight.shape[0], padding, weight.shape[2:])
