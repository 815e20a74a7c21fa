"""SE-ResNet9-FixUp in plain PyTorch, with the original state_dict names.

``SEResNet9FixUp`` is bps-nav's ``se_resnet9_fixup`` (base planes 64, input 64x64):
the reference the fused implementation (``cutlass_ops.FusedResNet``) is checked against
and loads its weights from.
"""
from __future__ import annotations

import torch
from torch import nn


def space_to_depth(x: torch.Tensor, block: int = 4) -> torch.Tensor:
    """(N, C, H, W) -> (N, block*block*C, H/block, W/block); new channel dy*block*C + dx*C + c."""
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // block, block, w // block, block).permute(0, 3, 5, 1, 2, 4)
    return x.reshape(n, block * block * c, h // block, w // block)


def depth_to_space(y: torch.Tensor, channels: int, block: int = 4) -> torch.Tensor:
    """The inverse of space_to_depth."""
    n, _, p, q = y.shape
    return y.reshape(n, block, block, channels, p, q).permute(0, 3, 4, 1, 5, 2) \
        .reshape(n, channels, p * block, q * block)


class SpaceToDepth(nn.Module):
    """(N, C, H, W) -> (N, 16C, H/4, W/4); new channel index = dy*4*C + dx*C + c."""

    def __init__(self, block: int = 4):
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return space_to_depth(x, self.block)


class SE(nn.Module):
    """Squeeze-excitation gate g = sigmoid(fc2(relu(fc1(mean_hw(x))))), shape (N, C)."""

    def __init__(self, planes: int, r: int = 16):
        super().__init__()
        self.excite = nn.Sequential(nn.Linear(planes, planes // r), nn.ReLU(inplace=True),
                                    nn.Linear(planes // r, planes), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.excite(x.mean(dim=(2, 3)))


class SEFixupBasicBlock(nn.Module):
    def __init__(self, inplanes: int, planes: int, stride: int = 1):
        super().__init__()
        self.fixup_bias1a = nn.Parameter(torch.zeros(1))
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.fixup_bias1b = nn.Parameter(torch.zeros(1))
        self.fixup_bias2a = nn.Parameter(torch.zeros(1))
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.fixup_scale = nn.Parameter(torch.ones(1))
        self.fixup_bias2b = nn.Parameter(torch.zeros(1))
        self.se = SE(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.AvgPool2d(3, stride, 1, count_include_pad=True),
                nn.Conv2d(inplanes, planes, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xa = x + self.fixup_bias1a
        h = torch.relu(self.conv1(xa) + self.fixup_bias1b)
        h = self.conv2(h + self.fixup_bias2a) * self.fixup_scale + self.fixup_bias2b
        g = self.se(h)
        identity = x if self.downsample is None else self.downsample(xa)
        return torch.relu(h * g[:, :, None, None] + identity)


class SEResNet9FixUp(nn.Module):
    """bps-nav se_resnet9_fixup: (N, C_in, 64, 64) -> (N, 512, 2, 2).

    C_in is 3 (RGB), 1 (depth) or 11 (depth + 10 one-hot bins).  FixUp initialisation as
    in the paper: conv1 ~ N(0, sqrt(2 / (Cout*9)) / sqrt(4)) (4 blocks), conv2 = 0,
    downsample ~ N(0, sqrt(2 / Cout)), scalar biases 0, scale 1.
    """

    def __init__(self, in_channels: int = 3, base_planes: int = 64):
        super().__init__()
        self.stem = nn.Sequential(SpaceToDepth(4), nn.Conv2d(16 * in_channels, base_planes, 1, bias=False),
                                  nn.ReLU(inplace=True))
        planes = [base_planes, base_planes * 2, base_planes * 4, base_planes * 8]
        inplanes = [base_planes] + planes[:-1]
        strides = [1, 2, 2, 2]
        self.layers = nn.ModuleList(
            nn.Sequential(SEFixupBasicBlock(i, p, s)) for i, p, s in zip(inplanes, planes, strides))
        self._fixup_init()

    def _fixup_init(self) -> None:
        n_blocks = len(self.layers)
        for m in self.modules():
            if isinstance(m, SEFixupBasicBlock):
                c = m.conv1.weight
                nn.init.normal_(c, 0, (2 / (c.shape[0] * c.shape[2] * c.shape[3])) ** 0.5 * n_blocks ** -0.5)
                nn.init.zeros_(m.conv2.weight)
                if m.downsample is not None:
                    d = m.downsample[1].weight
                    nn.init.normal_(d, 0, (2 / (d.shape[0] * d.shape[2] * d.shape[3])) ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return x
