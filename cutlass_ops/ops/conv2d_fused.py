"""conv2d_fused (kernels/conv2d_fused): ``act(scale * conv2d(x, w) + bias + residual) +
post_bias`` in one generated CUTLASS kernel; its wrapper, fake impl and autograd.

The backward: the conv's dgrad and wgrad through conv2d_dgrad/conv2d_wgrad
(ops/conv2d_backward.py: generated CUTLASS kernels, or cuDNN where the build's profile
measured it faster).  Training works (loss.backward(), torch.optim; fp16/bf16 and float32
weights, and torch.autocast through FusedResNet).
  - ReLU masks come from the saved output (the op adds post_bias after the ReLU, so an
    inactive element is exactly post_bias rounded to the output dtype); nothing is
    recomputed.  An element whose pre-activation is positive but below half a unit in the
    last place of post_bias counts as inactive (about 1e-4 of them in fp16 at random
    FixUp biases; none at post_bias 0).  One relu_backward kernel per ReLU masks the
    gradient and sums it before and after the mask (the FixUp biases' gradients).
  - SiLU's backward recomputes its input, the pre-activation (one more conv).
  - dgrad: conv2d_dgrad, the FixUp scale applied in the CUTLASS kernel's epilogue (alpha
    read on the device) or folded into the weight for cuDNN.
  - wgrad: conv2d_wgrad, which also returns the FixUp scale's gradient
    sum(g * conv(x, w)) = <w, wgrad(g, x)> (the conv is not recomputed): on CUDA one
    kernel after the wgrad sums its split-K slices, scales and takes that dot product.
    Which kernel each conv ran: cutlass_ops.ops.conv2d_backward_last_kernel().
  - While a CUDA graph is captured, the wgrad (and, without a ReLU, the bias sums) runs on
    a side stream beside the dgrad (cutlass_ops/streams.py), joined before the node
    returns, or (inside weights_used_once, when autograd stores the gradients as they are)
    at the end of the backward pass, so that it also overlaps the nodes after its own.
    Not under DistributedDataParallel, whose reducer reads each gradient as autograd
    stores it (ddp_forward_active).
  - Other bias gradients: float32 sums over the 16-bit gradients.
Saved: the op's inputs and output (16-bit activations; FusedResNet's outputs are the next
op's inputs, so that costs no memory).  Not fused yet: the ReLU mask and the FixUp bias
sums into the convs' GEMMs (relu_backward is its own pass)."""
from __future__ import annotations

import contextlib
import functools
import os
from typing import Optional, Sequence, Union

import torch

from ..streams import fork_side_stream, join_side_stream, single_use_declared, stored_as_is, use_side_stream
from .. import paths
from ._common import (_HALF, _INT32_MAX, Scalar, _accumulate_dtype, _aligned16, _as_tensor, _capability,
                      _check_devices, _grad_as, _meta, _pair, _report_last_kernel)
from .conv2d_backward import conv2d_dgrad, conv2d_wgrad
from .relu_backward import _epilogue_backward


def conv2d_fused(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Scalar = None,
    residual: Optional[torch.Tensor] = None,
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[int, Sequence[int]] = 0,
    scale: Scalar = None,
    post_bias: Scalar = None,
    relu: bool = False,
    silu: bool = False,
) -> torch.Tensor:
    """``act(scale * conv2d(input, weight) + bias + residual) + post_bias`` in one kernel.

    input     (N, C, H, W) float16/bfloat16 on CUDA (float32/64 work too, through ATen).
              channels_last memory is used as is; other layouts are converted (one copy).
    weight    (K, C, R, S), same dtype and device.
    bias      per-channel (K,) tensor, or a scalar (float or 0-d tensor); added before act.
    residual  (N, K, P, Q) tensor added before the activation, or None.
    scale     scalar multiplying the conv result (FixUp scale); default 1.
    post_bias scalar added after the activation (FixUp bias); default 0.
    relu      apply ReLU (else identity).
    silu      apply SiLU, v * sigmoid(v) (not with relu).  Its backward recomputes the
              pre-activation (one more conv): FusedCvT uses it with autograd off.

    Returns (N, K, P, Q) in channels_last memory format.  Any stride, padding and kernel
    size; channel counts that are not multiples of 8 run lower-alignment kernels, and
    shapes no generated kernel covers run the ATen composite (a fallback: cutlass_ops.paths).
    Scalars given as tensors stay on the device (no host sync, CUDA-graph safe).
    """
    bias_t = _as_tensor(bias, input)
    out = torch.ops.cutlass_ops.conv2d_fused(
        input, weight, bias_t, residual, _as_tensor(scale, input), _as_tensor(post_bias, input),
        _pair(stride, "stride"), _pair(padding, "padding"), bool(relu), bool(silu))
    if paths.recording(input):
        _report_last_kernel("conv2d_fused", conv2d_fused_last_kernel(), lambda: _conv2d_fused_why_aten(input, out),
                            input=input, weight=weight, stride=stride, padding=padding)
    return out


def _conv2d_fused_why_aten(input: torch.Tensor, out: torch.Tensor) -> str:
    """Why conv2d_fused's CUDA op took the ATen composite (kernels/conv2d_fused/conv2d_fused_cuda.cpp)."""
    if input.dtype not in _HALF:
        return f"{str(input.dtype).replace('torch.', '')} input (the kernels take float16/bfloat16)"
    n = max(input.shape[0], 1)
    if max(input.numel(), out.numel()) // n >= _INT32_MAX:
        return "one image over 2^31 elements"
    return "no generated kernel fits this problem (the op's warning names each kernel's refusal)"


def conv2d_fused_last_kernel() -> str:
    """The kernel the last conv2d_fused call on this thread ran ("aten" for the composite)."""
    return torch.ops.cutlass_ops.conv2d_fused_last_kernel()


def conv2d_fused_kernels(family: Optional[int] = None) -> list[str]:
    """Names of the conv2d_fused kernels this build compiled (none in a CPU-only build), in
    dispatch-table order; with ``family`` only that arch family's (70, 80, or 90: the
    Hopper-native sm_90a kernels), the ``_sm<family>_`` in each name.  Any of them can be
    forced with ``torch.ops.cutlass_ops.conv2d_fused_force_kernel(name)``."""
    if not hasattr(torch.ops.cutlass_ops, "conv2d_fused_kernels"):  # registered by CUDA builds only
        return []
    names = list(torch.ops.cutlass_ops.conv2d_fused_kernels())
    return names if family is None else [n for n in names if f"_sm{family}_" in n]


def conv2d_fused_kernel_family(name: str) -> int:
    """The arch family of a conv2d_fused kernel name (e.g. 90 for
    cutlass_ops_conv2d_fused_f16_sm90_128x64x64_4s_1x1c_align8)."""
    return int(name.split("_sm", 1)[1].split("_", 1)[0])


@torch.library.register_fake("cutlass_ops::conv2d_fused")
def _conv2d_fused_fake(input, weight, bias=None, residual=None, scale=None, post_bias=None,
                       stride=(1, 1), padding=(0, 0), relu=False, silu=False):
    torch._check(not (relu and silu), lambda: "conv2d_fused: relu and silu are both set; pick one activation")
    _check_devices("conv2d_fused", ("input", input), ("weight", weight), ("bias", bias), ("residual", residual),
                   ("scale", scale), ("post_bias", post_bias))
    torch._check(input.dim() == 4, lambda: "conv2d_fused: input must be 4-D")
    torch._check(weight.dim() == 4, lambda: "conv2d_fused: weight must be 4-D")
    torch._check(weight.shape[1] == input.shape[1],
                 lambda: "conv2d_fused: input and weight channel counts differ")
    n, _, h, w = input.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    return input.new_empty((n, k, p, q)).contiguous(memory_format=torch.channels_last)


# ---- autograd: y = act(scale * conv(x, w) + bias + residual) + post_bias --------------------------

def _conv_setup(ctx, inputs, output):
    x, w, bias, residual, scale, post_bias, stride, padding, relu = inputs[:9]
    silu = len(inputs) > 9 and inputs[9]
    # SiLU's backward needs its input, the pre-activation: recomputed from these (one conv)
    ctx.save_for_backward(x, w, scale, post_bias, output if relu else None,
                          *((bias, residual) if silu else (None, None)))
    ctx.stride, ctx.padding, ctx.relu, ctx.silu = list(stride), list(padding), relu, silu
    ctx.used_once = single_use_declared()
    # needs_input_grad covers the arguments the call passed (trailing defaults are dropped).
    ctx.needs = list(ctx.needs_input_grad) + [False] * 9
    ctx.metas = [_meta(t) for t in (x, w, bias, residual, scale, post_bias)]


def _silu_epilogue_backward(ctx, grad, x, w, scale, bias, residual, acc, want_sums):
    """(grad_z, sum(grad), sum(grad_z)) through act = SiLU: its input v = scale * conv + bias +
    residual recomputed (conv2d_fused without activation or post_bias), silu'(v) = s (1 + v (1 -
    s)) with s = sigmoid(v), in float32 (float64 for float64)."""
    v = conv2d_fused(x, w, bias, residual, ctx.stride, ctx.padding, scale).to(acc)
    s = torch.sigmoid(v)
    grad_z = grad.to(acc) * (s * (1 + v * (1 - s)))
    total = grad.sum(dtype=acc) if want_sums else None
    return grad_z, total, (grad_z.sum() if want_sums else None)


def _conv_backward(ctx, grad):
    x, w, scale, post_bias, out, bias, residual = ctx.saved_tensors
    x_meta, w_meta, bias_meta, residual_meta, scale_meta, post_meta = ctx.metas
    needs = ctx.needs
    acc = _accumulate_dtype(x)
    scalar_bias = bias_meta is not None and len(bias_meta[0]) == 0
    want_sums = needs[5] or (needs[2] and scalar_bias)
    want_w = needs[1] or (scale is not None and needs[4])
    # Under graph capture wgrad, and the bias sums when there is no ReLU to mask first, go
    # on a side stream beside dgrad (use_side_stream), joined before returning.
    beside = needs[0] and want_w and use_side_stream(grad)
    sums_on_side = beside and not ctx.relu and not ctx.silu  # no mask to apply first: they can wait

    def sums_and_bias(g, sum_grad, sum_g):
        grad_post = _grad_as(sum_grad, post_meta) if needs[5] else None
        grad_bias = None
        if needs[2] and bias_meta is not None:  # a 0-d bias is a scalar, a (K,) bias per channel
            grad_bias = _grad_as(sum_g if scalar_bias else g.sum(dim=(0, 2, 3), dtype=acc), bias_meta)
        return grad_post, grad_bias

    g = grad
    if ctx.silu:
        g, sum_grad, sum_g = _silu_epilogue_backward(ctx, grad, x, w, scale, bias, residual, acc, want_sums)
        grad_post, grad_bias = sums_and_bias(g, sum_grad, sum_g)
    elif not sums_on_side:
        g, sum_grad, sum_g = _epilogue_backward(grad, out if ctx.relu else None, post_bias, acc, want_sums)
        grad_post, grad_bias = sums_and_bias(g, sum_grad, sum_g)
    grad_residual = _grad_as(g, residual_meta) if needs[3] else None
    grad_x = grad_w = grad_scale = None
    g = g.to(x.dtype)
    side = fork_side_stream(grad.device) if beside else None  # after g (masked on this stream) is issued
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        if sums_on_side:
            _, sum_grad, sum_g = _epilogue_backward(grad, None, post_bias, acc, want_sums)
            grad_post, grad_bias = sums_and_bias(grad, sum_grad, sum_g)
        if want_w:
            # With G = wgrad(g, x): dw = s*G and ds = sum(g * conv(x, w)) = <w, G> (the conv is
            # not recomputed); conv2d_wgrad returns both, from one pass over G on CUDA.
            grad_w, grad_scale = conv2d_wgrad(g, x, w, ctx.stride, ctx.padding, scale)
            grad_w = grad_w if needs[1] else None
            grad_scale = _grad_as(grad_scale, scale_meta) if needs[4] and scale is not None else None
    if needs[0]:  # d/dx of s*conv(x, w) = s*dgrad(g, w): s is applied in dgrad's epilogue
        grad_x = conv2d_dgrad(g, w, x.shape, ctx.stride, ctx.padding, scale)
    # The wgrad may finish after this node (at the end of the backward pass) when nothing
    # reads its gradients before then.
    defer = side is not None and not sums_on_side and stored_as_is(w, ctx.used_once) and \
        stored_as_is(scale if needs[4] else None, ctx.used_once)
    join_side_stream(side, (grad_w, grad_scale, grad_post, grad_bias), (g, x), at_end_of_backward=defer)
    return (_grad_as(grad_x, x_meta), _grad_as(grad_w, w_meta), grad_bias, grad_residual,
            grad_scale, grad_post, None, None, None, None)


torch.library.register_autograd("cutlass_ops::conv2d_fused", _conv_backward, setup_context=_conv_setup)


# ---- conv2d_fused_se_gate: se_gate with the conv as its input ---------------------------------

def conv2d_fused_se_gate(input: torch.Tensor, weight: torch.Tensor, scale: Scalar, identity: torch.Tensor,
                         fc1_weight: torch.Tensor, fc1_bias: torch.Tensor, fc2_weight: torch.Tensor,
                         fc2_bias: torch.Tensor, identity_bias: Scalar = None, post_bias: Scalar = None,
                         avgpool: bool = False, h_bias: Scalar = None,
                         stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 1):
    """``se_gate`` (ops/se_gate.py) with ``h = scale * conv2d(input, weight) + h_bias`` as its input:

        h      = scale * conv2d(input, weight, stride, padding) + h_bias   # float32 (see below)
        g      = sigmoid(fc2(relu(fc1(mean_hw(h)))))
        out    = relu(h * g[:, :, None, None] + identity + identity_bias) + post_bias
        pooled = avg_pool2d(out, 3, 2, 1, count_include_pad=True)          # if avgpool

    FusedResNet's conv2 and the block's gate.  On an H100/H200 (a build with arch 90), fp16/bf16,
    3x3 stride 1 padding 1, 16x16 maps with C = K = 64 and 1-16 hidden units (block 0 at 64x64
    inputs): one kernel, the halo conv with the gate as its epilogue
    (kernels/conv2d_fused/conv2d_fused_sm90_halo_se_gate.cu): h never leaves the SM; the squeeze
    is over float32 h, the gate multiplies h rounded to the input dtype (as se_gate's input is).
    Other fp16/bf16 problems run the two kernels it fuses, conv2d_fused then se_gate, with h
    rounded to the input dtype between them (a fallback: cutlass_ops.paths;
    ``CUTLASS_OPS_SM90_HALO=0`` or ``CUTLASS_OPS_SM90=0`` asks for it); float32/float64 and CPU
    the ATen composite, h unrounded.  What ran: ``conv2d_fused_se_gate_last_kernel()``.

    Returns ``out`` (channels_last), or ``(out, pooled)`` when ``avgpool``.  The backward recomputes
    h through conv2d_fused and differentiates conv2d_fused + se_gate (one more conv), so training
    should call those two (FusedResNet does).
    """
    out, pooled = torch.ops.cutlass_ops.conv2d_fused_se_gate(
        input, weight, _as_tensor(scale, input), identity, fc1_weight, fc1_bias, fc2_weight, fc2_bias,
        _as_tensor(identity_bias, input), _as_tensor(post_bias, input), bool(avgpool), _as_tensor(h_bias, input),
        _pair(stride, "stride"), _pair(padding, "padding"))
    if paths.recording(input):
        last = conv2d_fused_se_gate_last_kernel()
        if last.startswith("none"):
            paths.record("conv2d_fused_se_gate", paths.EMPTY)
        elif last == "aten" or last.startswith("two kernels"):
            reason = last[len("two kernels ("):-1] if last.startswith("two kernels") else \
                f"{str(input.dtype).replace('torch.', '')} input (the kernels take float16/bfloat16)"
            paths.fallback("conv2d_fused_se_gate", reason,
                           paths.describe(input=input, weight=weight, fc1_weight=fc1_weight))
        else:
            paths.record("conv2d_fused_se_gate")
    return (out, pooled) if avgpool else out


def conv2d_fused_se_gate_why_not(input: torch.Tensor, weight: torch.Tensor, identity: torch.Tensor,
                                 fc1_weight: torch.Tensor, stride=1, padding=1) -> Optional[str]:
    """Why conv2d_fused_se_gate would not run its one kernel on these arguments (None when it
    would, paths.EMPTY for an empty batch): the CUDA side's conditions
    (kernels/conv2d_fused/conv2d_fused_cuda.cpp, halo_se_gate_fits), for callers that choose
    between it and the two ops (FusedResNet) and for tests."""
    if not input.is_cuda:
        return "not a CUDA tensor"
    if input.dtype not in _HALF:
        return f"{str(input.dtype).replace('torch.', '')} input (the kernels take float16/bfloat16)"
    if input.dim() != 4 or tuple(input.shape[1:]) != (64, 16, 16) or tuple(weight.shape) != (64, 64, 3, 3) \
            or _pair(stride, "stride") != [1, 1] or _pair(padding, "padding") != [1, 1]:
        return "the kernel takes 3x3 convs with stride 1 and padding 1 on 16x16 maps, C = K = 64"
    if not 1 <= fc1_weight.shape[0] <= 16:
        return "the kernel takes 1-16 hidden units"
    if input.shape[0] == 0:
        return paths.EMPTY
    if _capability(input) != 90:
        return "the kernel is sm_90a code"
    if not _built_family90():
        return "this build has no family-90 kernels (CUTLASS_OPS_ARCHS without 90)"
    for switch in ("CUTLASS_OPS_SM90_HALO", "CUTLASS_OPS_SM90"):
        if os.environ.get(switch, "")[:1] == "0":
            return f"{switch}=0"
    if not all(_aligned16(t, torch.channels_last) for t in (input, identity)):
        return "a channels_last input is not 16-byte aligned (a view at an odd offset)"
    return None


@functools.lru_cache(maxsize=None)
def _built_family90() -> bool:
    return bool(conv2d_fused_kernels(90))


def conv2d_fused_se_gate_last_kernel() -> str:
    """What the last conv2d_fused_se_gate call on this thread ran: the fused kernel's name, "two
    kernels (<why not the fused one>)", "aten" or "none (empty)"."""
    return torch.ops.cutlass_ops.conv2d_fused_se_gate_last_kernel()


@torch.library.register_fake("cutlass_ops::conv2d_fused_se_gate")
def _conv2d_fused_se_gate_fake(input, weight, scale, identity, fc1_weight, fc1_bias, fc2_weight, fc2_bias,
                               identity_bias=None, post_bias=None, avgpool=False, h_bias=None,
                               stride=(1, 1), padding=(1, 1)):
    out = _conv2d_fused_fake(input, weight, None, None, scale, None, stride, padding)
    _check_devices("conv2d_fused_se_gate", ("input", input), ("identity", identity), ("fc1_weight", fc1_weight),
                   ("fc1_bias", fc1_bias), ("fc2_weight", fc2_weight), ("fc2_bias", fc2_bias),
                   ("identity_bias", identity_bias), ("post_bias", post_bias), ("h_bias", h_bias))
    torch._check(identity.shape == out.shape,
                 lambda: "conv2d_fused_se_gate: identity must have the conv output's shape")
    if not avgpool:
        return out, input.new_empty((0,))
    n, k, p, q = out.shape
    return out, input.new_empty((n, k, (p + 1) // 2, (q + 1) // 2)).contiguous(memory_format=torch.channels_last)


# Schema positions of the op's tensor arguments (avgpool is 10, stride 12, padding 13).
_SE_CONV_TENSORS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11)
_SE_CONV_ARGS = 14


def _se_conv_setup(ctx, inputs, output):
    args = list(inputs) + [None] * (_SE_CONV_ARGS - len(inputs))
    ctx.save_for_backward(*(args[p] for p in _SE_CONV_TENSORS))
    ctx.avgpool = bool(args[10])
    ctx.stride = list(args[12]) if args[12] is not None else [1, 1]
    ctx.padding = list(args[13]) if args[13] is not None else [1, 1]
    ctx.needs = list(ctx.needs_input_grad) + [False] * _SE_CONV_ARGS


def _se_conv_backward(ctx, grad_out, grad_pooled):
    """Recomputes h = conv2d_fused(x, w, scale) and differentiates se_gate(h, ...) and the conv
    with their own backward ops (h rounded to the input dtype, as the two-kernel path has it)."""
    needs = ctx.needs
    with torch.enable_grad():
        leaves = {p: (t.detach().requires_grad_(needs[p]) if t is not None else None)
                  for p, t in zip(_SE_CONV_TENSORS, ctx.saved_tensors)}
        h = torch.ops.cutlass_ops.conv2d_fused(leaves[0], leaves[1], None, None, leaves[2], None, ctx.stride,
                                               ctx.padding, False, False)
        out, pooled = torch.ops.cutlass_ops.se_gate(h, *(leaves[p] for p in (3, 4, 5, 6, 7, 8, 9)), ctx.avgpool,
                                                    leaves[11])
        outputs, grads = [out], [grad_out if grad_out is not None else torch.zeros_like(out)]
        if ctx.avgpool and grad_pooled is not None and grad_pooled.numel():
            outputs.append(pooled)
            grads.append(grad_pooled)
        wanted = [p for p in _SE_CONV_TENSORS if leaves[p] is not None and needs[p]]
        got = torch.autograd.grad(outputs, [leaves[p] for p in wanted], grads, allow_unused=True) if wanted else ()
    result = [None] * _SE_CONV_ARGS
    for p, g in zip(wanted, got):
        result[p] = g
    return tuple(result)


torch.library.register_autograd("cutlass_ops::conv2d_fused_se_gate", _se_conv_backward, setup_context=_se_conv_setup)
