"""Python entry points of the ops, and their fake (meta) implementations."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from . import _library  # noqa: F401  (loads the op library)

Scalar = Union[float, torch.Tensor, None]


def _pair(v: Union[int, Sequence[int]], name: str) -> list[int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"{name} must be an int or two ints, got {type(v).__name__} {v!r}")
    v = list(v)
    if len(v) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ValueError(f"{name} must be an int or two ints, got {v}")
    return v


def _check_devices(op: str, first: tuple[str, torch.Tensor], *named: tuple[str, Optional[torch.Tensor]]) -> None:
    """As the C++ checks do (the fake impls also run for a mix of meta and real tensors)."""
    ref_name, ref = first
    for name, t in named:
        if t is not None and t.device != ref.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}")


def _as_tensor(v: Scalar, like: torch.Tensor) -> Optional[torch.Tensor]:
    if v is None or isinstance(v, torch.Tensor):
        return v
    return torch.full((), float(v), dtype=torch.float32, device=like.device)


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
    shapes no generated kernel covers run the ATen composite (with a one-time warning).
    Scalars given as tensors stay on the device (no host sync, CUDA-graph safe).
    """
    bias_t = _as_tensor(bias, input)
    return torch.ops.cutlass_ops.conv2d_fused(
        input, weight, bias_t, residual, _as_tensor(scale, input), _as_tensor(post_bias, input),
        _pair(stride, "stride"), _pair(padding, "padding"), bool(relu), bool(silu))


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
    else runs two ATen convs with a one-time warning; ``conv2d_b2b_last_kernel()`` says
    which ran.
    Differentiable: the backward recomputes the composite (there is no fused backward).
    """
    return torch.ops.cutlass_ops.conv2d_b2b(input, w0, bias0, w1, bias1, _pair(stride, "stride"),
                                            _pair(padding, "padding"), bool(relu0), bool(relu1))


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
    dtype (float32 keeps them exact).  One CTA per image; C % 8 == 0 and C <= 2048 run the
    CUDA kernel, other shapes the ATen composite.  Returns ``out`` (channels_last), or
    ``(out, pooled)`` when ``avgpool``: the pooled map feeds a ResNet downsample.
    """
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


def relu_backward(grad: torch.Tensor, out: torch.Tensor, post_bias: Scalar = None):
    """Backward of an ``out = relu(z) + post_bias`` epilogue from the saved output, with the
    two sums FixUp's scalars need, in one pass (fp16/bf16 on CUDA; ATen otherwise):

        grad_z = where(z > 0, grad, 0)        # z > 0 <=> out != post_bias rounded to out's dtype
        sums   = (grad.sum(), grad_z.sum())   # float32 (float64 for float64 inputs)

    The ops compute in float32 and round once, so z <= 0 stores exactly post_bias rounded;
    an element with 0 < z below half an ulp of post_bias counts as inactive.  Returns
    ``(grad_z, sums)``, grad_z in out's layout (channels_last for 4-D).
    """
    return torch.ops.cutlass_ops.relu_backward(grad, out, _as_tensor(post_bias, out))


@torch.library.register_fake("cutlass_ops::relu_backward")
def _relu_backward_fake(grad, out, post_bias=None):
    _check_devices("relu_backward", ("out", out), ("grad", grad), ("post_bias", post_bias))
    torch._check(grad.shape == out.shape, lambda: "relu_backward: grad shape differs from out shape")
    fmt = torch.channels_last if out.dim() == 4 else torch.contiguous_format
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    return torch.empty_like(out, memory_format=fmt), out.new_empty((2,), dtype=acc)


def space_to_depth_conv(input: torch.Tensor, weight: torch.Tensor, post_bias: Scalar = None,
                        relu: bool = False) -> torch.Tensor:
    """``act(conv1x1(space_to_depth(input, 4), weight)) + post_bias`` in one kernel: a ResNet
    stem reading the (N, C, H, W) input as it is, any memory layout.

    space_to_depth puts input pixel (4p+dy, 4q+dx) of channel c at channel dy*4C + dx*C + c
    of output pixel (p, q), i.e. ``x.view(N,C,H/4,4,W/4,4).permute(0,3,5,1,2,4)``; the
    whole op equals a 4x4 stride-4 conv.  weight: (K, 16C, 1, 1).  H and W must be
    multiples of 4.  fp16/bf16 on CUDA with C <= 16 and K in {32, 64, 128} run a
    tensor-core kernel (sm80+: persistent, cp.async + mma.sync; sm70/75: WMMA); other cases
    the ATen composite.  Returns (N, K, H/4, W/4)
    in channels_last memory.
    """
    return torch.ops.cutlass_ops.space_to_depth_conv(input, weight, _as_tensor(post_bias, input),
                                                     bool(relu))


@torch.library.register_fake("cutlass_ops::space_to_depth_conv")
def _space_to_depth_conv_fake(input, weight, post_bias=None, relu=False):
    _check_devices("space_to_depth_conv", ("input", input), ("weight", weight), ("post_bias", post_bias))
    torch._check(input.dim() == 4, lambda: "space_to_depth_conv: input must be 4-D")
    torch._check(weight.shape[1] == 16 * input.shape[1],
                 lambda: "space_to_depth_conv: weight must have 16 * C input channels")
    n, _, h, w = input.shape
    return input.new_empty((n, weight.shape[0], h // 4, w // 4)).contiguous(memory_format=torch.channels_last)


def space_to_depth_conv_weight_grad(grad: torch.Tensor, input: torch.Tensor, out: Optional[torch.Tensor] = None,
                                    post_bias: Scalar = None):
    """The backward of ``space_to_depth_conv(input, weight, post_bias, relu)`` when ``input``
    needs no gradient (a stem's input is data), in one pass over grad, out and input:

        grad_z      = where(out != post_bias rounded, grad, 0)   # the ReLU mask; grad if out is None
        grad_weight = grad_z^T @ space_to_depth(input)           # (K, 16C, 1, 1)
        sums        = (grad.sum(), grad_z.sum())                 # post_bias's gradient is sums[0]

    ``out`` is the forward's saved output (pass it when the forward had ``relu=True``).
    grad_weight and sums are float32 (float64 for float64 inputs).  fp16/bf16 on CUDA with
    the forward kernel's shapes run a WMMA kernel (the patch matrix rebuilt from the input, as
    the WMMA forward kernel builds it); other cases the ATen composite.
    """
    return torch.ops.cutlass_ops.space_to_depth_conv_weight_grad(grad, input, out, _as_tensor(post_bias, input))


@torch.library.register_fake("cutlass_ops::space_to_depth_conv_weight_grad")
def _space_to_depth_conv_weight_grad_fake(grad, input, out=None, post_bias=None):
    _check_devices("space_to_depth_conv_weight_grad", ("input", input), ("grad", grad), ("out", out),
                   ("post_bias", post_bias))
    torch._check(input.dim() == 4 and grad.dim() == 4,
                 lambda: "space_to_depth_conv_weight_grad: input and grad must be 4-D")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    return (input.new_empty((grad.shape[1], 16 * input.shape[1], 1, 1), dtype=acc),
            input.new_empty((2,), dtype=acc))


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
    return torch.ops.cutlass_ops.conv2d_dgrad(grad_output, weight, list(input_size), _pair(stride, "stride"),
                                              _pair(padding, "padding"), _as_tensor(scale, grad_output))


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
    return torch.ops.cutlass_ops.conv2d_wgrad(grad_output, input, weight, _pair(stride, "stride"),
                                              _pair(padding, "padding"), _as_tensor(scale, grad_output))


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


def _conv_output_size(input_size, weight_size, stride, padding):
    n, _, h, w = input_size
    k, _, r, s = weight_size
    return n, k, (h + 2 * padding[0] - r) // stride[0] + 1, (w + 2 * padding[1] - s) // stride[1] + 1


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


def layer_norm_rows(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                    residual: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """LayerNorm over x's last dimension, computed in float32 for 16-bit x (as CvT's LayerNorm),
    after adding ``residual`` if given: returns ``(y, x + residual)`` (the sum in x's dtype, the
    next residual; None without one).  One CUDA kernel for fp16/bf16 rows of up to 2048 columns
    (a row per 4-32 lanes of a warp), fused with the add; ATen's otherwise.  Differentiable."""
    _check_devices("layer_norm_rows", ("x", x), ("residual", residual), ("weight", weight), ("bias", bias))
    y, s, _, _ = torch.ops.cutlass_ops.layer_norm_rows(x, residual, weight, bias, float(eps))
    return y, (s if residual is not None else None)


@torch.library.register_fake("cutlass_ops::layer_norm_rows")
def _layer_norm_rows_fake(x, residual, weight, bias, eps):
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    stat = torch.float64 if x.dtype == torch.float64 else torch.float32
    return (x.new_empty(x.shape), x.new_empty(x.shape if residual is not None else (0,)),
            x.new_empty((rows,), dtype=stat), x.new_empty((rows,), dtype=stat))


@torch.library.register_fake("cutlass_ops::layer_norm_rows_backward")
def _layer_norm_rows_backward_fake(grad_y, grad_sum, s, mean, rstd, weight, weight_grad, bias_grad):
    cols = s.shape[-1]
    return (s.new_empty(s.shape), mean.new_empty((cols,) if weight_grad and weight is not None else (0,)),
            mean.new_empty((cols,) if bias_grad else (0,)))


def dw_conv3x3_tokens(x: torch.Tensor, h: int, w: int, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      strides: Sequence[int], lead: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """Depthwise 3x3 convs (padding 1, stride 1 or 2 each) with per-channel biases on the NHWC
    map that tokens x (N, h*w, C) hold, one per entry of ``strides`` (1 to 3; CvT's q, k, v:
    [1, 2, 2]), weight (len(strides), C, 1, 3, 3), bias (len(strides), C) or None.  Returns one
    tokens tensor (N, L + Ho*Wo, C) per conv, whose first L rows are ``lead`` (N, L, C) (CvT's
    cls token; none: L = 0).  x and lead may be views of one token tensor (images apart, rows
    contiguous): read in place.  One CUDA kernel for all the convs in fp16/bf16 (the map read
    once; float32 arithmetic; weight and bias read in x's dtype or float32), ATen's conv
    otherwise.  Differentiable: the input gradient of all the convs in one
    ``dw_conv3x3_tokens_backward_input`` kernel (fp16/bf16 on CUDA), the weights' by cuDNN's
    depthwise wgrad per conv, the biases' and the lead rows' by sums."""
    _check_devices("dw_conv3x3_tokens", ("x", x), ("weight", weight), ("bias", bias), ("lead", lead))
    if isinstance(strides, int):
        raise TypeError("dw_conv3x3_tokens: strides must be a list (one stride per conv), e.g. [1, 2, 2]")
    return torch.ops.cutlass_ops.dw_conv3x3_tokens(x, int(h), int(w), weight, bias, [int(s) for s in strides], lead)


def layer_norm_dw_conv3x3_tokens(x: torch.Tensor, h: int, w: int, ln_weight: Optional[torch.Tensor],
                                 ln_bias: Optional[torch.Tensor], eps: float, weight: torch.Tensor,
                                 bias: Optional[torch.Tensor], strides: Sequence[int],
                                 lead: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """``dw_conv3x3_tokens(LayerNorm(x), h, w, weight, bias, strides, LayerNorm(lead))``, the
    LayerNorm over C (ln_weight, ln_bias (C,) or None, eps) computed in float32 and rounded to
    x's dtype, as ``layer_norm_rows`` writes it: a CvT block's norm1 and its three dw_bn
    projections.  On CUDA in fp16/bf16 one tiled kernel: each band of the map is normalized in
    shared memory right after it is read (every channel of a pixel in one CTA; the padding stays
    zero) and convolved from there, so the normalized map is never written; where that kernel
    does not run (the band too large for shared memory, unaligned views, CUTLASS_OPS_DW_TILE=0)
    ATen's LayerNorm first, then dw_conv3x3_tokens.  Elsewhere ATen.  Differentiable (the backward
    recomputes the LayerNorm and differentiates through dw_conv3x3_tokens)."""
    _check_devices("layer_norm_dw_conv3x3_tokens", ("x", x), ("ln_weight", ln_weight), ("ln_bias", ln_bias),
                   ("weight", weight), ("bias", bias), ("lead", lead))
    if isinstance(strides, int):
        raise TypeError("layer_norm_dw_conv3x3_tokens: strides must be a list (one stride per conv), e.g. [1, 2, 2]")
    return torch.ops.cutlass_ops.layer_norm_dw_conv3x3_tokens(x, int(h), int(w), ln_weight, ln_bias, float(eps),
                                                             weight, bias, [int(s) for s in strides], lead)


@torch.library.register_fake("cutlass_ops::layer_norm_dw_conv3x3_tokens")
def _layer_norm_dw_conv3x3_tokens_fake(x, h, w, ln_weight, ln_bias, eps, weight, bias, strides, lead):
    return _dw_conv3x3_tokens_fake(x, h, w, weight, bias, strides, lead)


def dw_conv3x3_tokens_backward_input(grad_y: Sequence[torch.Tensor], h: int, w: int, weight: torch.Tensor,
                                     strides: Sequence[int]) -> torch.Tensor:
    """The input gradient of dw_conv3x3_tokens's convs: grad_y[j] (N, Ho_j*Wo_j, C), the
    gradients of output j's conv rows (images may be apart: slices behind lead rows) -> grad_x
    (N, h*w, C), the sum over the convs of each one's transposed conv, written once.  One CUDA
    kernel for fp16/bf16 (float32 sums), ATen's conv_transpose2d otherwise."""
    return torch.ops.cutlass_ops.dw_conv3x3_tokens_backward_input(list(grad_y), int(h), int(w), weight,
                                                                  [int(s) for s in strides])


@torch.library.register_fake("cutlass_ops::dw_conv3x3_tokens_backward_input")
def _dw_conv3x3_tokens_backward_input_fake(grad_y, h, w, weight, strides):
    return grad_y[0].new_empty((grad_y[0].shape[0], h * w, grad_y[0].shape[2]))


@torch.library.register_fake("cutlass_ops::dw_conv3x3_tokens")
def _dw_conv3x3_tokens_fake(x, h, w, weight, bias, strides, lead):
    lead_rows = lead.shape[1] if lead is not None else 0
    return [x.new_empty((x.shape[0], lead_rows + ((h - 1) // s + 1) * ((w - 1) // s + 1), x.shape[2]))
            for s in strides]


def linear_silu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                alpha: float = 1.0) -> torch.Tensor:
    """silu(alpha * (x @ weight^T + bias)): x (..., K), weight (N, K), bias (N,) or None
    -> (..., N) in x's dtype.  On an sm90 GPU (H100/H200) in fp16/bf16 with K and N multiples
    of 8, one generated CUTLASS GEMM whose epilogue adds the bias (read in x's dtype), scales
    and applies the SiLU in float32 and rounds once (``linear_silu_kernels()``); elsewhere
    ATen in float32 (float64 for float64): correct, slower than cuBLAS + F.silu.
    Differentiable (the backward recomputes the pre-activation with ATen).  CvT's QuickGELU
    after fc1, z sigmoid(1.702 z), is silu(1.702 z) / 1.702: alpha 1.702 and fc1's own bias,
    the 1/1.702 going into fc2 (FusedCvT._silu_mlp)."""
    _check_devices("linear_silu", ("x", x), ("weight", weight), ("bias", bias))
    return torch.ops.cutlass_ops.linear_silu(x, weight, bias, float(alpha))


def linear_silu_kernels() -> list[str]:
    """The fused linear_silu kernels this build compiled, "<name> (<dtype>)" (none in a build
    without arch 90 or a CPU-only one)."""
    if not hasattr(torch.ops.cutlass_ops, "linear_silu_kernels"):  # registered by CUDA builds only
        return []
    return list(torch.ops.cutlass_ops.linear_silu_kernels())


@torch.library.register_fake("cutlass_ops::linear_silu")
def _linear_silu_fake(x, weight, bias, alpha):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_residual(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,
                    alpha: float = 1.0) -> torch.Tensor:
    """residual + alpha * x @ weight^T + bias: x (..., K), weight (N, K), bias (N,) or None,
    residual (..., N) -> a new (..., N) tensor in x's dtype (a transformer's output projection
    or second MLP Linear landing on the residual stream).  On CUDA in fp16/bf16 with K and N
    multiples of 8, one cuBLASLt matmul: the residual as its C input (beta = 1), the bias (read
    in x's dtype) in its epilogue, float32 accumulation, one rounding; elsewhere ATen in float32
    (float64 for float64), rounded once.  Differentiable."""
    _check_devices("linear_residual", ("x", x), ("weight", weight), ("bias", bias), ("residual", residual))
    return torch.ops.cutlass_ops.linear_residual(x, weight, bias, residual, float(alpha))


@torch.library.register_fake("cutlass_ops::linear_residual")
def _linear_residual_fake(x, weight, bias, residual, alpha):
    return residual.new_empty(residual.shape)


def scale_samples(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x[n, ...] * scale[n]: scale (N,) float32 (float64 for a float64 x), the product in scale's
    dtype rounded once to x's dtype.  One CUDA kernel for fp16/bf16 (16-byte accesses where the
    sample size and pointers allow), ATen otherwise.  Differentiable in x (the backward is the
    same multiply; scale gets no gradient).  FusedCvT's drop path: scale = mask / keep_prob."""
    _check_devices("scale_samples", ("x", x), ("scale", scale))
    return torch.ops.cutlass_ops.scale_samples(x, scale)


@torch.library.register_fake("cutlass_ops::scale_samples")
def _scale_samples_fake(x, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def conv_embed(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
               layer_norm: bool = False, ln_weight: Optional[torch.Tensor] = None,
               ln_bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """A token embedding: conv2d(input, weight, bias, stride, padding) (no dilation, no groups),
    then with layer_norm a LayerNorm over the output channels (ln_weight, ln_bias, eps), as
    tokens (N, P*Q, K) in (n, p, q) order, contiguous, in input's dtype.  input: (N, C, H, W) in
    any strides (NCHW as a user holds an image batch: no layout copy).  One CUDA kernel for
    fp16/bf16 with a kernel at most 8 wide, C*R <= 32 and K 32, 64 or 128 (CvT's 7x7/4 embedding
    from 3 channels: the patch gathered straight from the image, WMMA tensor cores, the bias and
    the LayerNorm in float32 on the accumulators, one rounding); ATen in float32 (float64 for
    float64) otherwise.
    Differentiable (the backward recomputes the conv and the LayerNorm with ATen)."""
    _check_devices("conv_embed", ("input", input), ("weight", weight), ("bias", bias), ("ln_weight", ln_weight),
                   ("ln_bias", ln_bias))
    return torch.ops.cutlass_ops.conv_embed(input, weight, bias, _pair(stride, "stride"), _pair(padding, "padding"),
                                            bool(layer_norm), ln_weight, ln_bias, float(eps))


@torch.library.register_fake("cutlass_ops::conv_embed")
def _conv_embed_fake(input, weight, bias, stride, padding, layer_norm=False, ln_weight=None, ln_bias=None, eps=1e-5):
    p = (input.shape[2] + 2 * padding[0] - weight.shape[2]) // stride[0] + 1
    q = (input.shape[3] + 2 * padding[1] - weight.shape[3]) // stride[1] + 1
    return input.new_empty((input.shape[0], p * q, weight.shape[0]))
