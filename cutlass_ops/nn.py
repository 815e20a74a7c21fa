"""nn.Module front ends of the fused ops."""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .ops import _pair, conv2d_fused


class FusedConv2d(nn.Module):
    """Conv2d with a fused epilogue: ``act(scale * conv(x) + bias + residual) + post_bias``.

    ``bias`` is per output channel; ``scale`` and ``post_bias`` are learnable scalars
    (FixUp), created only when asked for.  Keep activations in channels_last to avoid a
    layout copy per call; the weight is kept in channels_last by ``to()``/``cuda()``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, relu: bool = False, scale: bool = False,
                 post_bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        r, s = _pair(kernel_size, "kernel_size")
        self.stride, self.padding, self.relu = _pair(stride, "stride"), _pair(padding, "padding"), relu
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, r, s, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.scale = nn.Parameter(torch.ones((), **factory)) if scale else None
        self.post_bias = nn.Parameter(torch.zeros((), **factory)) if post_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # as nn.Conv2d
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.weight.shape[2] * self.weight.shape[3]
            bound = 1 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.weight.dim() == 4:
            self.weight.data = self.weight.data.contiguous(memory_format=torch.channels_last)
        return out

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        return conv2d_fused(x, self.weight, self.bias, residual, self.stride, self.padding,
                            self.scale, self.post_bias, self.relu)

    def extra_repr(self) -> str:
        k, c, r, s = self.weight.shape
        return (f"{c}, {k}, kernel_size=({r}, {s}), stride={tuple(self.stride)}, "
                f"padding={tuple(self.padding)}, bias={self.bias is not None}, relu={self.relu}")
