"""conv2d_dgrad and conv2d_wgrad (kernels/conv2d_backward): a conv's input and weight gradients
(generated CUTLASS kernels, or cuDNN where the build's profile measured it faster), used by
the backward of conv2d_fused and small_map_conv; their wrappers and fake impls, and the
lists of the kernels the build compiled."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import paths
from ._common import (_HALF, _INT32_MAX, Scalar, _as_tensor, _check_devices, _conv_output_size, _pair,
                      _report_last_kernel)


def conv2d_dgrad(grad_output: torch.Tensor, weight: torch.Tensor, input_size: Sequence[int],
                 stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                 scale: Scalar = None) -> torch.Tensor:
    """``scale * dL/dx`` of ``y = conv2d(x, weight, stride, padding)`` given ``dL/dy``.

    grad_output (N, K, P, Q), weight (K, C, R, S), input_size = x's (N, C, H, W).  fp16/bf16
    on an sm80+ GPU with C and K multiples of 8 run a generated CUTLASS dgrad kernel
    (unity-stride or strided; the scale is read on the device in its epilogue) unless the
    build's profile measured cuDNN faster on the problem; other cases, and those, take
    ATen (cuDNN on CUDA; the scale folded into the weight).  Returns (N, C, H, W) in
    grad_output's dtype, channels_last.  ``conv2d_backward_last_kernel()`` says which ran.
    """
    dx = torch.ops.cutlass_ops.conv2d_dgrad(grad_output, weight, list(input_size), _pair(stride, "stride"),
                                            _pair(padding, "padding"), _as_tensor(scale, grad_output))
    if paths.recording(grad_output):
        _report_last_kernel("conv2d_dgrad", conv2d_backward_last_kernel(),
                            lambda: _backward_why_aten(grad_output, dx.numel()),
                            grad_output=grad_output, weight=weight, input_size=tuple(input_size), stride=stride,
                            padding=padding)
    return dx


def conv2d_wgrad(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                 stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
                 scale: Scalar = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight gradients of ``y = scale * conv2d(input, weight, stride, padding)`` (FixUp's
    scaled conv) given ``dL/dy``: with G = dL/dw of the conv, returns ``(scale * G, <weight, G>)``
    = (dL/dweight, dL/dscale); dL/dweight in weight's dtype (what autograd needs; rounded
    once), dL/dscale in float32 (float64 for float64 input).  Without a scale: (G, <weight, G>).

    fp16/bf16 on an sm80+ GPU with C and K multiples of 8 run a generated CUTLASS wgrad
    kernel, split over N*P*Q into float32 partial sums (G is never rounded to 16 bits),
    unless the build's profile measured cuDNN faster on the problem; other cases, and those,
    take ATen (cuDNN on CUDA, which writes a 16-bit G as PyTorch's own backward does).  On
    CUDA one more kernel then sums the slices, scales and takes the dot product.  dL/dweight
    is (K, C, R, S) in channels_last memory.
    """
    grads = torch.ops.cutlass_ops.conv2d_wgrad(grad_output, input, weight, _pair(stride, "stride"),
                                               _pair(padding, "padding"), _as_tensor(scale, grad_output))
    if paths.recording(grad_output):
        _report_last_kernel("conv2d_wgrad", conv2d_backward_last_kernel(),
                            lambda: _backward_why_aten(grad_output, input.numel()),
                            grad_output=grad_output, input=input, weight=weight, stride=stride, padding=padding)
    return grads


def _backward_why_aten(grad_output: torch.Tensor, input_numel: int) -> str:
    """Why conv2d_dgrad/conv2d_wgrad's CUDA op took ATen without the profile choosing cuDNN
    (kernels/conv2d_backward/conv2d_backward_cuda.cpp and its dispatcher)."""
    if grad_output.dtype not in _HALF:
        return f"{str(grad_output.dtype).replace('torch.', '')} input (the kernels take float16/bfloat16)"
    if max(grad_output.numel(), input_numel) >= _INT32_MAX:
        return "over 2^31 elements"
    return ("no generated kernel fits this problem (channel counts not multiples of 8, unaligned tensors, "
            "or a GPU before sm80; the op's warning says which)")


def conv2d_backward_kernels(family: Optional[int] = None) -> list[str]:
    """Names of the conv2d_dgrad/conv2d_wgrad kernels this build compiled (none in a CPU-only
    build), in dispatch-table order; with ``family`` only that arch family's (80, or 90: the
    Hopper-native sm_90a ones, built with CUTLASS_OPS_SM90_BACKWARD=1).  Any of them can be
    forced with ``torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, split_k)``."""
    if not hasattr(torch.ops.cutlass_ops, "conv2d_backward_kernels"):  # registered by CUDA builds only
        return []
    names = list(torch.ops.cutlass_ops.conv2d_backward_kernels())
    return names if family is None else [n for n in names if f"_sm{family}_" in n]


def conv2d_backward_last_kernel() -> str:
    """The kernel the last conv2d_dgrad/conv2d_wgrad call on this thread ran ("aten": ATen)."""
    return torch.ops.cutlass_ops.conv2d_backward_last_kernel()


@torch.library.register_fake("cutlass_ops::conv2d_dgrad")
def _conv2d_dgrad_fake(grad_output, weight, input_size, stride=(1, 1), padding=(0, 0), scale=None):
    _check_devices("conv2d_dgrad", ("grad_output", grad_output), ("weight", weight), ("scale", scale))
    torch._check(tuple(grad_output.shape) == _conv_output_size(input_size, weight.shape, stride, padding),
                 lambda: "conv2d_dgrad: grad_output shape is not the conv's output shape")
    return grad_output.new_empty(list(input_size)).contiguous(memory_format=torch.channels_last)


@torch.library.register_fake("cutlass_ops::conv2d_wgrad")
def _conv2d_wgrad_fake(grad_output, input, weight, stride=(1, 1), padding=(0, 0), scale=None):
    _check_devices("conv2d_wgrad", ("grad_output", grad_output), ("input", input), ("weight", weight),
                   ("scale", scale))
    torch._check(tuple(grad_output.shape) == _conv_output_size(input.shape, weight.shape, stride, padding),
                 lambda: "conv2d_wgrad: grad_output shape is not the conv's output shape")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    grad_weight = torch.empty_like(weight, memory_format=torch.channels_last)
    return grad_weight, input.new_empty((), dtype=acc)
