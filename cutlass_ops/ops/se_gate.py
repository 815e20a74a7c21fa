"""se_gate (kernels/se_gate): the squeeze-excitation gate joined with the residual, its split
halves se_squeeze and se_gate_apply, and se_gate_backward; wrappers, fake impls and autograd.

se_gate's whole backward (the fused AvgPool2d's gradient, the ReLU mask, the squeeze and gate
recomputed, the excite MLP's backward, grad_h and grad_identity, and sum(grad_h) for h_bias:
FusedResNet's conv2 bias, added in se_gate) is the se_gate_backward op: three kernels (a pass
per image, the MLP's backward for 1-8 images per CTA, a grad_h pass) and the batch sums of the
excite weights' gradients.  se_squeeze and se_gate_apply differentiate through ATen's composite
(they serve the B2B-excite measurement)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import paths
from ._common import (_INT32_MAX, Scalar, _aligned16, _as_tensor, _check_devices, _dtype_reason, _grad_as, _meta,
                      _report)

_FORWARD_MAX_C = 4096   # se_gate_max_channels(): 512 threads x 8 channels (kernels/se_gate/se_gate_device.cuh)
_BACKWARD_MAX_C = 2048  # se_gate_backward_supported(): 256 threads x 8 channels


def _se_why_not(h: torch.Tensor, maps, max_c: int) -> Optional[str]:
    """Why se_gate's kernels (se_gate, se_squeeze, se_gate_apply: ``max_c`` 4096; the backward:
    2048) do not run h and the maps of its shape (kernels/se_gate/se_gate_cuda.cpp), None when
    they do, paths.EMPTY for an empty h."""
    if h.dim() != 4:
        return None  # the op's own checks reject it
    if h.numel() == 0:
        return paths.EMPTY
    why = _dtype_reason(h)
    if why is not None:
        return why
    c = h.shape[1]
    if c % 8:
        return f"C = {c} is not a multiple of 8"
    if c > max_c:
        return f"C = {c} is over the kernel's {max_c} channels"
    if h.numel() // h.shape[0] >= _INT32_MAX:
        return "one image over 2^31 elements"
    if not all(_aligned16(t, torch.channels_last) for t in (h, *maps)):
        return "a channels_last input is not 16-byte aligned (a view at an odd offset)"
    return None


def se_gate(h: torch.Tensor, identity: torch.Tensor, fc1_weight: torch.Tensor,
            fc1_bias: torch.Tensor, fc2_weight: torch.Tensor, fc2_bias: torch.Tensor,
            identity_bias: Scalar = None, post_bias: Scalar = None, avgpool: bool = False,
            h_bias: Scalar = None):
    """Squeeze-excitation gate joined with the residual, one kernel per call:

        h      = h + h_bias                                    # if given (a FixUp bias after the conv)
        g      = sigmoid(fc2(relu(fc1(mean_hw(h)))))          # nn.Linear weight layouts
        out    = relu(h * g[:, :, None, None] + identity + identity_bias) + post_bias
        pooled = avg_pool2d(out, 3, 2, 1, count_include_pad=True)   # if avgpool

    h, identity: (N, C, H, W) fp16/bf16 (channels_last); the excite weights in any float
    dtype (float32 keeps them exact).  One CTA per image; C % 8 == 0 and C <= 4096 run the
    CUDA kernel, other shapes the ATen composite.  Returns ``out`` (channels_last), or
    ``(out, pooled)`` when ``avgpool``: the pooled map feeds a ResNet downsample.
    """
    if paths.recording(h):
        _report("se_gate", _se_why_not(h, (identity,), _FORWARD_MAX_C), h=h, identity=identity)
    out, pooled = torch.ops.cutlass_ops.se_gate(
        h, identity, fc1_weight, fc1_bias, fc2_weight, fc2_bias, _as_tensor(identity_bias, h),
        _as_tensor(post_bias, h), bool(avgpool), _as_tensor(h_bias, h))
    return (out, pooled) if avgpool else out


@torch.library.register_fake("cutlass_ops::se_gate")
def _se_gate_fake(h, identity, fc1_weight, fc1_bias, fc2_weight, fc2_bias, identity_bias=None,
                  post_bias=None, avgpool=False, h_bias=None):
    _check_devices("se_gate", ("h", h), ("identity", identity), ("fc1_weight", fc1_weight), ("fc1_bias", fc1_bias),
                   ("fc2_weight", fc2_weight), ("fc2_bias", fc2_bias), ("identity_bias", identity_bias),
                   ("post_bias", post_bias), ("h_bias", h_bias))
    torch._check(h.dim() == 4, lambda: "se_gate: h must be 4-D")
    torch._check(identity.shape == h.shape, lambda: "se_gate: identity shape differs from h")
    return _se_gate_fake_outputs(h, avgpool)


def _se_gate_fake_outputs(h, avgpool):
    out = torch.empty_like(h, memory_format=torch.channels_last)
    if not avgpool:
        return out, h.new_empty((0,))
    n, c, hh, ww = h.shape
    pooled = h.new_empty((n, c, (hh + 1) // 2, (ww + 1) // 2)).contiguous(memory_format=torch.channels_last)
    return out, pooled


def se_squeeze(h: torch.Tensor, h_bias: Scalar = None) -> torch.Tensor:
    """The squeeze of ``se_gate`` alone: ``mean_hw(h + h_bias)``, (N, C) in h's dtype.

    With ``se_gate_apply`` it splits the gate around an excite MLP of the caller's (a B2B
    GEMM, say: ``python -m cutlass_ops bench se-excite``).  CUDA: se_gate's kernel stopped
    after its squeeze; other shapes and CPU: ATen.  Its backward is ATen's composite."""
    if paths.recording(h):
        _report("se_squeeze", _se_why_not(h, (), _FORWARD_MAX_C), h=h)
    return torch.ops.cutlass_ops.se_squeeze(h, _as_tensor(h_bias, h))


@torch.library.register_fake("cutlass_ops::se_squeeze")
def _se_squeeze_fake(h, h_bias=None):
    _check_devices("se_squeeze", ("h", h), ("h_bias", h_bias))
    torch._check(h.dim() == 4, lambda: "se_squeeze: h must be 4-D")
    return h.new_empty((h.shape[0], h.shape[1]))


def se_gate_apply(h: torch.Tensor, identity: torch.Tensor, gate: torch.Tensor,
                  identity_bias: Scalar = None, post_bias: Scalar = None, avgpool: bool = False,
                  h_bias: Scalar = None):
    """The rest of ``se_gate`` with the gate given (N, C), rounded to h's dtype:

        out    = relu((h + h_bias) * gate[:, :, None, None] + identity + identity_bias) + post_bias
        pooled = avg_pool2d(out, 3, 2, 1, count_include_pad=True)   # if avgpool

    Returns ``out`` (channels_last), or ``(out, pooled)`` when ``avgpool``.  CUDA: se_gate's
    kernel with its squeeze and excite skipped; other shapes and CPU: ATen.  Its backward is
    ATen's composite."""
    if paths.recording(h):
        _report("se_gate_apply", _se_why_not(h, (identity,), _FORWARD_MAX_C), h=h, identity=identity, gate=gate)
    out, pooled = torch.ops.cutlass_ops.se_gate_apply(
        h, identity, gate, _as_tensor(identity_bias, h), _as_tensor(post_bias, h), bool(avgpool),
        _as_tensor(h_bias, h))
    return (out, pooled) if avgpool else out


@torch.library.register_fake("cutlass_ops::se_gate_apply")
def _se_gate_apply_fake(h, identity, gate, identity_bias=None, post_bias=None, avgpool=False, h_bias=None):
    _check_devices("se_gate_apply", ("h", h), ("identity", identity), ("gate", gate),
                   ("identity_bias", identity_bias), ("post_bias", post_bias), ("h_bias", h_bias))
    torch._check(h.dim() == 4, lambda: "se_gate_apply: h must be 4-D")
    torch._check(identity.shape == h.shape, lambda: "se_gate_apply: identity shape differs from h")
    torch._check(gate.shape == h.shape[:2], lambda: "se_gate_apply: gate must be (N, C)")
    return _se_gate_fake_outputs(h, avgpool)


def se_gate_backward(grad_out: torch.Tensor, grad_pooled: Optional[torch.Tensor], h: torch.Tensor,
                     out: torch.Tensor, fc1_weight: torch.Tensor, fc1_bias: torch.Tensor,
                     fc2_weight: torch.Tensor, fc2_bias: torch.Tensor, post_bias: Scalar = None,
                     h_bias: Scalar = None):
    """The whole backward of ``se_gate`` from its saved input ``h`` and output ``out``
    (``h_bias`` as the forward had it):

        g      = grad_out + the gradient through the fused AvgPool2d(3, 2, 1) of grad_pooled
        dy     = where(out != post_bias rounded, g, 0)          # the ReLU mask, as relu_backward
        grad_h = dy * gate + (d_squeeze / (H*W))[:, :, None, None]   # gate recomputed from h
        grad_identity = dy

    Returns ``(grad_h, grad_identity, grad_fc1_weight, grad_fc1_bias, grad_fc2_weight,
    grad_fc2_bias, grad_identity_bias, grad_post_bias, grad_h_bias)`` (grad_h_bias =
    sum(grad_h), summed before grad_h is rounded): the two maps in h's dtype
    (channels_last), the rest float32 (float64 for float64 h).  ``grad_pooled`` is None
    without the fused pool.  fp16/bf16 on CUDA with C % 8 == 0 and C <= 2048 run three
    kernels (a pass per image for dy, the squeeze and sum(dy * h); the excite MLP's backward
    for 1-8 images per CTA; a grad_h pass with its sum) plus the batch reductions of the
    weights' gradients; other cases run the ATen composite.
    """
    if paths.recording(h):
        why = _se_why_not(h, (grad_out, out, grad_pooled), _BACKWARD_MAX_C)
        if why is None and fc1_weight.dim() == 2 and fc1_weight.shape[0] < 1:
            why = "the excite MLP has no hidden units"
        _report("se_gate_backward", why, grad_out=grad_out, grad_pooled=grad_pooled, h=h, out=out,
                fc1_weight=fc1_weight)
    return torch.ops.cutlass_ops.se_gate_backward(grad_out, grad_pooled, h, out, fc1_weight, fc1_bias,
                                                  fc2_weight, fc2_bias, _as_tensor(post_bias, h),
                                                  _as_tensor(h_bias, h))


@torch.library.register_fake("cutlass_ops::se_gate_backward")
def _se_gate_backward_fake(grad_out, grad_pooled, h, out, fc1_weight, fc1_bias, fc2_weight, fc2_bias,
                           post_bias=None, h_bias=None):
    _check_devices("se_gate_backward", ("h", h), ("grad_out", grad_out), ("grad_pooled", grad_pooled), ("out", out),
                   ("fc1_weight", fc1_weight), ("fc1_bias", fc1_bias), ("fc2_weight", fc2_weight),
                   ("fc2_bias", fc2_bias), ("post_bias", post_bias), ("h_bias", h_bias))
    torch._check(h.dim() == 4, lambda: "se_gate_backward: h must be 4-D")
    torch._check(grad_out.shape == h.shape and out.shape == h.shape,
                 lambda: "se_gate_backward: grad_out and out must have h's shape")
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    maps = [torch.empty_like(h, memory_format=torch.channels_last) for _ in range(2)]
    params = [t.new_empty(t.shape, dtype=acc) for t in (fc1_weight, fc1_bias, fc2_weight, fc2_bias)]
    return (*maps, *params, *(h.new_empty((), dtype=acc) for _ in range(3)))


# ---- se_gate: out = relu(h' * g(h') + identity + identity_bias) + post_bias [, avgpool(out)],
#      h' = h + h_bias --------------------------------------------------------------------------

def _se_setup(ctx, inputs, output):
    h, identity, w1, b1, w2, b2, identity_bias, post_bias, avgpool, h_bias = (list(inputs) + [None])[:10]
    ctx.save_for_backward(h, w1, b1, w2, b2, post_bias, h_bias, output[0])
    ctx.avgpool = avgpool
    ctx.metas = [_meta(t) for t in (h, identity, w1, b1, w2, b2, identity_bias, post_bias, h_bias)]
    ctx.needs = list(ctx.needs_input_grad) + [False] * 10  # short when defaults were dropped


def _se_backward(ctx, grad_out, grad_pooled):
    h, w1, b1, w2, b2, post_bias, h_bias, out = ctx.saved_tensors
    metas, needs = ctx.metas, ctx.needs
    g_out = grad_out.to(out.dtype) if grad_out is not None else torch.zeros_like(out)
    pooled = ctx.avgpool and grad_pooled is not None and grad_pooled.numel()
    grads = se_gate_backward(g_out, grad_pooled.to(out.dtype) if pooled else None, h, out, w1, b1, w2, b2,
                             post_bias, h_bias)
    # se_gate's inputs: h, identity, fc1 w/b, fc2 w/b, identity_bias, post_bias, avgpool, h_bias.
    by_input = list(grads[:8]) + [None, grads[8]]
    metas = metas[:8] + [None, metas[8]]
    return tuple(_grad_as(g, m) if need else None for g, m, need in zip(by_input, metas, needs[:10]))


torch.library.register_autograd("cutlass_ops::se_gate", _se_backward, setup_context=_se_setup)


# ---- se_squeeze and se_gate_apply: se_gate split around a caller's excite MLP; their
#      backward is ATen's composite (they serve the B2B-excite measurement) ------------------

def _squeeze_setup(ctx, inputs, output):
    h, h_bias = (list(inputs) + [None])[:2]
    ctx.metas = [_meta(h), _meta(h_bias)]
    ctx.needs = list(ctx.needs_input_grad) + [False]


def _squeeze_backward(ctx, grad):
    (shape, dtype), bias_meta = ctx.metas
    g = grad.float() if grad.dtype in (torch.float16, torch.bfloat16) else grad
    grad_h = (g / (shape[2] * shape[3]))[:, :, None, None].expand(shape).to(dtype)
    return (grad_h if ctx.needs[0] else None, _grad_as(g.sum(), bias_meta) if ctx.needs[1] else None)


torch.library.register_autograd("cutlass_ops::se_squeeze", _squeeze_backward, setup_context=_squeeze_setup)


def _apply_setup(ctx, inputs, output):
    h, identity, gate, identity_bias, post_bias, avgpool, h_bias = (list(inputs) + [None] * 4)[:7]
    ctx.save_for_backward(h, gate, post_bias, h_bias, output[0])
    ctx.avgpool = bool(avgpool)
    ctx.metas = [_meta(t) for t in (h, identity, gate, identity_bias, post_bias, h_bias)]
    ctx.needs = list(ctx.needs_input_grad) + [False] * 7


def _apply_backward(ctx, grad_out, grad_pooled):
    h, gate, post_bias, h_bias, out = ctx.saved_tensors
    acc = torch.float64 if h.dtype == torch.float64 else torch.float32
    g = grad_out.to(acc) if grad_out is not None else torch.zeros(out.shape, dtype=acc, device=out.device)
    if ctx.avgpool and grad_pooled is not None and grad_pooled.numel():
        # NCHW-contiguous: CUDA's channels_last avg_pool2d backward with padding is wrong
        # (pytorch/pytorch#188344).
        g = g + torch.ops.aten.avg_pool2d_backward(grad_pooled.to(acc).contiguous(), g.contiguous(), [3, 3],
                                                   [2, 2], [1, 1], False, True, None)
    # The ReLU mask from the saved output, as relu_backward reads it.
    active = out != post_bias.to(out.dtype) if post_bias is not None else out > 0
    dy = torch.where(active, g, 0)
    hf = h.to(acc) + (h_bias.to(acc) if h_bias is not None else 0)
    gate_rounded = gate.to(h.dtype).to(acc)
    grad_h = dy * gate_rounded[:, :, None, None]
    grads = (grad_h, dy, (dy * hf).sum((2, 3)), dy.sum(), g.sum(), None, grad_h.sum())
    metas = ctx.metas[:5] + [None, ctx.metas[5]]
    return tuple(_grad_as(x, m) if need else None for x, m, need in zip(grads, metas, ctx.needs[:7]))


torch.library.register_autograd("cutlass_ops::se_gate_apply", _apply_backward, setup_context=_apply_setup)
