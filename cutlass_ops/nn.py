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


class FusedConvPair(nn.Module):
    """A KxK conv + ReLU followed by a 1x1 conv + ReLU (a bottleneck block's middle and
    expansion convs) as one ``conv2d_b2b`` call: one kernel on CUDA where a B2B instance covers
    the channel counts (``ops.conv2d_b2b_kernels()``), two ATen convs otherwise (or, with
    ``path="two_convs"``, as two ``conv2d_fused`` calls).

    ``FusedConvPair.from_modules(conv0, conv1)`` takes two ``nn.Conv2d`` (``conv1`` 1x1,
    stride 1, no padding; neither grouped nor dilated) and shares their parameters (its
    state_dict keys: ``conv0.weight``, ``conv0.bias``, ``conv1.weight``, ``conv1.bias``); the
    weights are kept in channels_last, which the kernel reads without a copy (the shared convs
    accept it as they are).  ``relu0``/``relu1``: whether a ReLU follows each conv (fused only
    when both do).

    ``path``: ``"b2b"`` (default) runs ``conv2d_b2b``; ``"two_convs"`` runs two
    ``conv2d_fused`` calls (bias and ReLU fused into each conv).  Measured on an H100 (README,
    "The op: conv2d_b2b"): both beat eager PyTorch, cuDNN and torch.compile max-autotune;
    ``"two_convs"`` was the faster for a 1x1 conv of 128 or 256 channels (the B2B kernel took
    1.1x-1.3x its time), the two were level for 64 -> 64; ``"b2b"`` needs less memory (the
    intermediate never reaches global memory).
    """

    PATHS = ("b2b", "two_convs")

    def __init__(self, conv0: nn.Conv2d, conv1: nn.Conv2d, relu0: bool = True, relu1: bool = True,
                 path: str = "b2b"):
        super().__init__()
        if path not in self.PATHS:
            raise ValueError(f"FusedConvPair: path must be one of {self.PATHS}, got {path!r}")
        for name, conv in (("conv0", conv0), ("conv1", conv1)):
            if not isinstance(conv, nn.Conv2d):
                raise TypeError(f"FusedConvPair: {name} must be an nn.Conv2d, got {type(conv).__name__}")
            if conv.groups != 1 or tuple(conv.dilation) != (1, 1) or conv.padding_mode != "zeros":
                raise ValueError(f"FusedConvPair: {name} must have groups=1, dilation=1 and zero padding, got "
                                 f"groups={conv.groups}, dilation={conv.dilation}, padding_mode={conv.padding_mode!r}")
            if isinstance(conv.padding, str):
                raise ValueError(f"FusedConvPair: {name} padding must be numbers, got {conv.padding!r}")
        if tuple(conv1.kernel_size) != (1, 1) or tuple(conv1.stride) != (1, 1) or tuple(conv1.padding) != (0, 0):
            raise ValueError("FusedConvPair: conv1 must be a 1x1 conv with stride 1 and no padding, got kernel "
                             f"{conv1.kernel_size}, stride {conv1.stride}, padding {conv1.padding}")
        if conv1.in_channels != conv0.out_channels:
            raise ValueError(f"FusedConvPair: conv1 takes {conv1.in_channels} channels but conv0 gives "
                             f"{conv0.out_channels}")
        self.conv0, self.conv1, self.relu0, self.relu1, self.path = conv0, conv1, relu0, relu1, path
        self._weights_channels_last()

    def _weights_channels_last(self) -> None:
        for conv in (self.conv0, self.conv1):
            conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._weights_channels_last()
        return out

    @classmethod
    def from_modules(cls, conv0: nn.Conv2d, conv1: nn.Conv2d, relu0: bool = True, relu1: bool = True,
                     path: str = "b2b"):
        return cls(conv0, conv1, relu0, relu1, path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .ops import conv2d_b2b, conv2d_fused
        c0, c1 = self.conv0, self.conv1
        if self.path == "two_convs":
            y = conv2d_fused(x, c0.weight, c0.bias, stride=c0.stride, padding=c0.padding, relu=self.relu0)
            return conv2d_fused(y, c1.weight, c1.bias, relu=self.relu1)
        return conv2d_b2b(x, c0.weight, c0.bias, c1.weight, c1.bias, list(c0.stride), list(c0.padding),
                          self.relu0, self.relu1)

    def extra_repr(self) -> str:
        return f"relu0={self.relu0}, relu1={self.relu1}, path={self.path!r}"
