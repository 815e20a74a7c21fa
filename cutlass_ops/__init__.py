"""cutlass_ops: CUTLASS-generated fused operators for PyTorch.

    import cutlass_ops
    y = cutlass_ops.conv2d_fused(x, w, bias, stride=1, padding=1, relu=True)

Ops live under ``torch.ops.cutlass_ops``; this package loads the compiled library,
registers the fake (meta) implementations for torch.compile and the autograd formulas, and
adds Python wrappers (``ops/``, one module per op family) and nn modules (``nn.py``).  Which
path each op took on CUDA (its kernel or an ATen fallback) and strict mode: ``paths.py``.
"""
from ._library import build_info, cuda_kernels_built
from . import paths
from .paths import FallbackError, fallback_counts, last_path, strict
from .ops import (conv2d_b2b, conv2d_dgrad, conv2d_fused, conv2d_fused_last_kernel, conv2d_wgrad, giou_loss,
                  giou_loss_padded, giou_loss_ragged, se_gate, space_to_depth_conv)
from .nn import FusedConv2d, FusedConvPair
from .fused_resnet import FusedResNet
from .fused_mlp import FusedMLP
from .fused_cvt import FusedCvT
from .options import CvTOptions, MlpOptions

__all__ = ["conv2d_b2b", "conv2d_fused", "conv2d_fused_last_kernel", "conv2d_dgrad", "conv2d_wgrad", "se_gate", "space_to_depth_conv", "FusedConv2d", "FusedConvPair", "FusedResNet", "FusedMLP", "FusedCvT", "CvTOptions", "MlpOptions",
           "giou_loss", "giou_loss_padded", "giou_loss_ragged", "build_info", "cuda_kernels_built",
           "paths", "FallbackError", "fallback_counts", "last_path", "strict"]
__version__ = "0.1.0"
