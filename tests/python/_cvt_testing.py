"""Shared by the CvT tests: the installed cvt/fused_cvt modules and random non-trivial
weights.  (To run a checkout's changed Python files against an installed op library
without rebuilding: tests/dev_overlay.sh.)"""
from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from cutlass_ops import fused_cvt
from cutlass_ops.models import cvt

from _seeds import seeded


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random non-zero everything: conv/linear weights ~ N(0, 1/fan_in), biases, LayerNorm
    and BatchNorm affine parameters around (1, 0), BatchNorm running means and variances
    away from (0, 1), the cls token; num_batches_tracked non-zero."""
    g = torch.Generator().manual_seed(seed)

    def rand(shape, scale=1.0, offset=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(rand(m.weight.shape, fan_in ** -0.5))
                if m.bias is not None:
                    m.bias.copy_(rand(m.bias.shape, 0.2))
            elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                m.weight.copy_(rand(m.weight.shape, 0.2, 1.0))
                m.bias.copy_(rand(m.bias.shape, 0.2))
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.copy_(rand(m.running_mean.shape, 0.3))
                    m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=torch.float64) + 0.5)
                    m.num_batches_tracked.fill_(7)
        for name, p in model.named_parameters():
            if name.endswith("cls_token"):
                p.copy_(rand(p.shape, 0.5))
    return model


@functools.lru_cache(maxsize=4)
def _reference64(seed: int, drop_path_rate) -> nn.Module:
    with seeded(seed):
        return randomize(cvt.cvt13(drop_path_rate=drop_path_rate), seed).double()


def reference(dtype=torch.float64, seed: int = 0, drop_path_rate=None, device="cpu"):
    """A random-weight CvT-13 reference (a new copy) in `dtype` on `device`, train mode."""
    return copy.deepcopy(_reference64(seed, drop_path_rate)).to(device=device, dtype=dtype).train()
