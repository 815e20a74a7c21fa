"""Python entry points of the ops, one module per op family (named after its kernels/<family>
folder), each with the family's wrappers, fake (meta) impls for torch.compile and autograd
registration.  Importing this package registers all of them; the wrappers are re-exported
here, so ``from cutlass_ops.ops import conv2d_fused`` and ``cutlass_ops.ops.linear_silu(...)``
work whatever module holds them.  Shared helpers: _common.py; the stream and DDP policy of the
backward passes: cutlass_ops/streams.py.

A wrapper named like its module (conv2d_fused, se_gate, ...) shadows the module as an
attribute of this package; the module itself is ``sys.modules["cutlass_ops.ops.<family>"]``.
"""
from ._common import Scalar, _pair  # noqa: F401  (_pair: nn.py's argument checks)
from .relu_backward import relu_backward
from .conv2d_backward import conv2d_backward_kernels, conv2d_backward_last_kernel, conv2d_dgrad, conv2d_wgrad
from .conv2d_fused import (conv2d_fused, conv2d_fused_kernel_family, conv2d_fused_kernels, conv2d_fused_last_kernel,
                           conv2d_fused_se_gate, conv2d_fused_se_gate_last_kernel, conv2d_fused_se_gate_why_not)
from .conv2d_b2b import conv2d_b2b, conv2d_b2b_kernels, conv2d_b2b_last_kernel
from .se_gate import se_gate, se_gate_apply, se_gate_backward, se_squeeze
from .space_to_depth_conv import space_to_depth_conv, space_to_depth_conv_weight_grad
from .layer_norm_rows import layer_norm_rows
from .dw_conv3x3_tokens import dw_conv3x3_tokens, dw_conv3x3_tokens_backward_input, layer_norm_dw_conv3x3_tokens
from .linear_silu import linear_silu, linear_silu_kernels
from .linear_residual import linear_residual
from .scale_samples import scale_samples
from .conv_embed import conv_embed
from .giou import giou_loss, giou_loss_padded, giou_loss_ragged
from . import fused_mlp  # noqa: F401  (registers the fused MLP op; its entry points are FusedMLP and the module)

__all__ = [
    "Scalar",
    "conv2d_b2b", "conv2d_b2b_kernels", "conv2d_b2b_last_kernel",
    "conv2d_backward_kernels", "conv2d_backward_last_kernel", "conv2d_dgrad", "conv2d_wgrad",
    "conv2d_fused", "conv2d_fused_kernel_family", "conv2d_fused_kernels", "conv2d_fused_last_kernel",
    "conv2d_fused_se_gate", "conv2d_fused_se_gate_last_kernel", "conv2d_fused_se_gate_why_not",
    "conv_embed",
    "dw_conv3x3_tokens", "dw_conv3x3_tokens_backward_input", "layer_norm_dw_conv3x3_tokens",
    "giou_loss", "giou_loss_padded", "giou_loss_ragged",
    "layer_norm_rows",
    "linear_residual",
    "linear_silu", "linear_silu_kernels",
    "relu_backward",
    "scale_samples",
    "se_gate", "se_gate_apply", "se_gate_backward", "se_squeeze",
    "space_to_depth_conv", "space_to_depth_conv_weight_grad",
]
