"""conv2d_b2b (kernels/conv2d_b2b): two convs back to back in one CUTLASS B2B kernel; its
wrapper, fake impl and autograd (no fused backward: the gradient of the composite it computes)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import paths
from ._common import (_HALF, _INT32_MAX, _accumulate_dtype, _capability, _check_devices, _conv_output_size, _pair,
                      _report_last_kernel)


def conv2d_b2b(
    input: torch.Tensor,
    w0: torch.Tensor,
    bias0: Optional[torch.Tensor],
    w1: torch.Tensor,
    bias1: Optional[torch.Tensor] = None,
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[int, Sequence[int]] = 0,
    relu0: bool = True,
    relu1: bool = True,
) -> torch.Tensor:
    """Back-to-back convs ``act1(conv1x1(act0(conv2d(input, w0) + bias0), w1) + bias1)``: on
    CUDA in one kernel (CUTLASS's B2B fusion: the first conv's output tile stays on chip, in
    registers or for K1 >= 128 in shared memory, and is the second conv's input; it is rounded
    to the input dtype there, as two separate 16-bit convs would round it).  The 3x3 -> 1x1
    pair of a bottleneck block.

    input  (N, C, H, W) float16/bfloat16 on CUDA (CPU and float32/64 run the ATen composite).
    w0     (K0, C, R, S), any kernel size, with ``stride`` and ``padding``.
    bias0  (K0,) or None; w1 (K1, K0, 1, 1); bias1 (K1,) or None.
    relu0, relu1: ReLU after each conv.

    Returns (N, K1, P, Q), channels_last.  Fused only where a generated instance exists:
    sm80 or newer (Volta has no B2B conv in CUTLASS), fp16/bf16, C a multiple of 8, both ReLUs
    on, and (K0, K1) one of the built pairs (``conv2d_b2b_kernels()``; by default 32->64,
    64->64, 64->128, 64->256): each instance computes exactly its channel counts.  Anything
    else runs two ATen convs (a fallback: cutlass_ops.paths); ``conv2d_b2b_last_kernel()``
    names the kernel that ran.
    Differentiable: the backward recomputes the composite (there is no fused backward).
    """
    out = torch.ops.cutlass_ops.conv2d_b2b(input, w0, bias0, w1, bias1, _pair(stride, "stride"),
                                           _pair(padding, "padding"), bool(relu0), bool(relu1))
    if paths.recording(input):
        _report_last_kernel("conv2d_b2b", conv2d_b2b_last_kernel(),
                            lambda: _b2b_why_aten(input, w0, w1, out, bool(relu0), bool(relu1)),
                            input=input, w0=w0, w1=w1, stride=stride, padding=padding, relu0=relu0, relu1=relu1)
    return out


def _b2b_why_aten(input, w0, w1, out, relu0: bool, relu1: bool) -> str:
    """Why conv2d_b2b's CUDA op took two ATen convs (kernels/conv2d_b2b/conv2d_b2b_cuda.cpp)."""
    if _capability(input) < 80:
        return "B2B instances need sm80 or newer"
    if input.dtype not in _HALF:
        return f"{str(input.dtype).replace('torch.', '')} input (B2B instances are float16/bfloat16 only)"
    if not (relu0 and relu1):
        return "B2B instances apply ReLU after both convs"
    if input.shape[1] % 8:
        return "input channels are not a multiple of 8"
    if max(input.numel(), out.numel() // max(w1.shape[0], 1) * w0.shape[0], out.numel()) >= _INT32_MAX:
        return "over 2^31 elements"
    return (f"no B2B instance runs {w0.shape[0]}->{w1.shape[0]} channels (conv2d_b2b_kernels() lists the "
            "built ones), or a tensor is not 16-byte aligned")


def conv2d_b2b_last_kernel() -> str:
    """The kernel the last conv2d_b2b call on this thread ran ("aten" for the composite)."""
    return torch.ops.cutlass_ops.conv2d_b2b_last_kernel()


def conv2d_b2b_kernels() -> list[str]:
    """Names of the B2B kernels this build compiled (none in a CPU-only build)."""
    if not hasattr(torch.ops.cutlass_ops, "conv2d_b2b_kernels"):  # registered by CUDA builds only
        return []
    return list(torch.ops.cutlass_ops.conv2d_b2b_kernels())


@torch.library.register_fake("cutlass_ops::conv2d_b2b")
def _conv2d_b2b_fake(input, w0, bias0, w1, bias1=None, stride=(1, 1), padding=(0, 0), relu0=True, relu1=True):
    _check_devices("conv2d_b2b", ("input", input), ("w0", w0), ("bias0", bias0), ("w1", w1), ("bias1", bias1))
    torch._check(input.dim() == 4 and w0.dim() == 4 and w1.dim() == 4, lambda: "conv2d_b2b: tensors must be 4-D")
    torch._check(w0.shape[1] == input.shape[1], lambda: "conv2d_b2b: input and w0 channel counts differ")
    torch._check(w1.shape[1] == w0.shape[0] and w1.shape[2] == 1 and w1.shape[3] == 1,
                 lambda: "conv2d_b2b: w1 must be (K1, K0, 1, 1)")
    n, _, p, q = _conv_output_size(input.shape, w0.shape, stride, padding)
    return input.new_empty((n, w1.shape[0], p, q)).contiguous(memory_format=torch.channels_last)


# ---- conv2d_b2b: no fused backward; the gradient of the composite it computes ----------------

def _b2b_setup(ctx, inputs, output):
    ctx.save_for_backward(*[t if isinstance(t, torch.Tensor) else None for t in inputs[:5]])
    ctx.args = inputs[5:]


def _b2b_backward(ctx, grad):
    """Recomputes the two convs with ATen under autograd (the fused kernel's math: the first
    conv's output rounded to the input dtype) and differentiates them."""
    x, w0, b0, w1, b1 = ctx.saved_tensors
    stride, padding, relu0, relu1 = ctx.args
    acc = _accumulate_dtype(x)
    leaves = [t.detach().requires_grad_(need) if t is not None else None
              for t, need in zip((x, w0, b0, w1, b1), ctx.needs_input_grad[:5])]
    with torch.enable_grad():
        lx, lw0, lb0, lw1, lb1 = leaves
        y0 = torch.nn.functional.conv2d(lx.to(acc), lw0.to(acc), None if lb0 is None else lb0.to(acc), stride, padding)
        if relu0:
            y0 = torch.relu(y0)
        y0 = y0.to(x.dtype).to(acc)
        y1 = torch.nn.functional.conv2d(y0, lw1.to(acc), None if lb1 is None else lb1.to(acc))
        if relu1:
            y1 = torch.relu(y1)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(y1, wanted, grad.to(acc)) if wanted else ())
    return tuple(next(grads).to(t.dtype) if t is not None and t.requires_grad else None for t in leaves) + \
        (None,) * 4


torch.library.register_autograd("cutlass_ops::conv2d_b2b", _b2b_backward, setup_context=_b2b_setup)
