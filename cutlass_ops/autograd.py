"""Autograd for conv2d_fused, se_gate and space_to_depth_conv: the convs' dgrad/wgrad through
our conv2d_dgrad/conv2d_wgrad ops (generated CUTLASS kernels, or cuDNN where the build's
profile measured it faster), our own CUDA kernels for the epilogues and se_gate.

Training works (loss.backward(), torch.optim; fp16/bf16 and float32 weights, and
torch.autocast through FusedResNet).  What the backward does, per op:
  - ReLU masks come from the saved output (the ops add post_bias after the ReLU, so an
    inactive element is exactly post_bias rounded to the output dtype); nothing is
    recomputed.  An element whose pre-activation is positive but below half a unit in the
    last place of post_bias counts as inactive (about 1e-4 of them in fp16 at random
    FixUp biases; none at post_bias 0).  One relu_backward kernel per ReLU masks the
    gradient and sums it before and after the mask (the FixUp biases' gradients).
  - se_gate: its whole backward (the fused AvgPool2d's gradient, the ReLU mask, the
    squeeze and gate recomputed, the excite MLP's backward, grad_h and grad_identity, and
    sum(grad_h) for h_bias: FusedResNet's conv2 bias b2b, added in se_gate) in
    the se_gate_backward op: three kernels (a pass per image, the MLP's backward for 1-8
    images per CTA, a grad_h pass) and the batch sums of the excite weights' gradients.
  - The conv's dgrad: conv2d_dgrad, the FixUp scale applied in the CUTLASS kernel's
    epilogue (alpha read on the device) or folded into the weight for cuDNN.
  - The conv's wgrad: conv2d_wgrad, which also returns the FixUp scale's gradient
    sum(g * conv(x, w)) = <w, wgrad(g, x)> (the conv is not recomputed): on CUDA one
    kernel after the wgrad sums its split-K slices, scales and takes that dot product.
    Which kernel each conv ran: cutlass_ops.ops.conv2d_backward_last_kernel().
  - While a CUDA graph is captured, each conv's wgrad (and, without a ReLU, its bias sums)
    runs on a side stream beside its dgrad, joined before the node returns, or (inside
    weights_used_once, when autograd stores the gradients as they are) at the end of the
    backward pass, so that it also overlaps the nodes after its own.  Not under
    DistributedDataParallel, whose reducer reads each gradient as autograd stores it
    (ddp_forward_active).
  - space_to_depth_conv (the stem), when its input needs no gradient:
    space_to_depth_conv_weight_grad, one pass for the ReLU mask, the FixUp sums and dw
    (the patch matrix rebuilt from the saved input, as the forward built it).
  - Other bias gradients: float32 sums over the 16-bit gradients.
Saved: the op inputs and outputs (16-bit activations; FusedResNet's outputs are the next
op's inputs, so that costs no memory).  Not fused yet: the ReLU mask and the FixUp bias
sums into the convs' GEMMs (relu_backward is its own pass).
"""
from __future__ import annotations

import contextlib
import threading

import torch

from .ops import conv2d_dgrad, conv2d_wgrad, relu_backward, se_gate_backward, space_to_depth_conv_weight_grad


def _accumulate_dtype(t: torch.Tensor) -> torch.dtype:
    """dtype of sums and of the tiny (N, C) / scalar math: float64 for float64, else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _conv_dtype(t: torch.Tensor) -> torch.dtype:
    """dtype of the backward's convolutions: fp16/bf16 on CUDA stay in it (cuDNN tensor
    cores, float32 accumulation, as PyTorch's own backward); otherwise float32/64."""
    if t.is_cuda and t.dtype in (torch.float16, torch.bfloat16):
        return t.dtype
    return _accumulate_dtype(t)


def _meta(t):
    return None if t is None else (t.shape, t.dtype)


def _grad_as(g, meta):
    return None if g is None or meta is None else g.to(meta[1]).reshape(meta[0])


def _epilogue_backward(grad: torch.Tensor, out, post_bias, acc: torch.dtype, want_sums: bool = True):
    """Backward of an ``act(z) + post_bias`` epilogue: (grad_z, sum(grad), sum(grad_z)).

    With a ReLU (out given: the op's saved output) one relu_backward pass masks the
    gradient and takes both sums (the FixUp scalars' gradients); without, grad_z is grad
    and the two sums are one (None unless want_sums)."""
    if out is None:
        total = grad.sum(dtype=acc) if want_sums else None
        return grad, total, total
    grad_z, sums = relu_backward(grad.to(out.dtype), out, post_bias)
    return grad_z, sums[0], sums[1]


# ---- conv2d_fused: y = act(scale * conv(x, w) + bias + residual) + post_bias -------------------

_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def use_side_stream(grad: torch.Tensor) -> bool:
    """Whether work that nothing waits for until the autograd node returns (a wgrad beside
    its dgrad: at small batches neither fills the GPU) should go on a side stream: while a
    CUDA graph is captured.  Eager calls stay on one stream: there the fork costs more host
    time than it saves."""
    return grad.is_cuda and torch.cuda.is_current_stream_capturing()


def fork_side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream, after it has waited for everything issued so far on the current one
    (call it once the side's inputs are issued)."""
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    return side


_SINGLE_USE = threading.local()


@contextlib.contextmanager
def weights_used_once():
    """Declares that each conv weight and scale passed to the ops inside is passed to no
    other op in the graph (FusedResNet's forward), so that no gradient of one is added to
    another's: their wgrads may then finish at the end of the backward pass (stored_as_is)."""
    before = getattr(_SINGLE_USE, "on", False)
    _SINGLE_USE.on = True
    try:
        yield
    finally:
        _SINGLE_USE.on = before


def ddp_forward_active() -> bool:
    """Whether a torch DistributedDataParallel forward is running.  Its reducer reads each
    parameter's gradient as soon as autograd stores it (a post hook on the parameter's
    AccumulateGrad node copies it into an all-reduce bucket, and a full bucket's all-reduce
    starts then, ordered after the current stream only), a reader that stored_as_is cannot
    see: no tensor hook, no .grad yet.  (DDP's Python reducer, used under compiled autograd,
    registers post-accumulate-grad hooks, which stored_as_is does see.)"""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    active = getattr(ddp, "_get_active_ddp_module", None)
    return active is not None and active() is not None


def single_use_declared() -> bool:
    """Whether the op being set up runs inside weights_used_once(), and not inside a
    DistributedDataParallel forward (ddp_forward_active): there a deferred wgrad would be
    read, copied into a bucket and all-reduced before the side stream finished it, so each
    wgrad joins before its node returns and DDP's buckets overlap the rest of the backward."""
    return getattr(_SINGLE_USE, "on", False) and not ddp_forward_active()


def stored_as_is(param, used_once: bool) -> bool:
    """Whether autograd will store param's gradient without launching anything that reads
    it before the backward pass ends: a leaf used by one op (weights_used_once) with no
    .grad yet and no hooks (AccumulateGrad then takes the tensor itself).  None (no such
    gradient) qualifies."""
    return param is None or (used_once and param.is_leaf and param.grad is None and not param._backward_hooks
                             and not getattr(param, "_post_accumulate_grad_hooks", None))


def join_side_stream(side, made_there=(), used_there=(), at_end_of_backward: bool = False) -> None:
    """The current stream waits for `side`: now, or with at_end_of_backward when the backward
    pass finishes (a callback on the caller's stream, before backward() returns), so that
    a wgrad overlaps the nodes after its own.  Deferring is only for gradients that nothing
    reads before then (stored_as_is); the inputs the side stream reads are then marked as
    used there (autograd may free them when the node returns).  The tensors made there are
    marked as used on the current stream (the allocator must not hand their memory to the
    side stream early)."""
    if side is None:
        return
    main = torch.cuda.current_stream(side.device)
    for t in made_there:
        if t is not None:
            t.record_stream(main)
    if at_end_of_backward:
        for t in used_there:
            if t is not None:
                t.record_stream(side)
        torch.autograd.Variable._execution_engine.queue_callback(
            lambda: torch.cuda.current_stream(side.device).wait_stream(side))
    else:
        main.wait_stream(side)


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
    from .ops import conv2d_fused
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


# ---- space_to_depth_conv: y = act(conv1x1(s2d(x), w)) + post_bias -------------------------------

def _s2d_setup(ctx, inputs, output):
    x, w, post_bias, relu = inputs
    ctx.save_for_backward(x, w, post_bias, output if relu else None)
    ctx.relu = relu
    ctx.metas = [_meta(t) for t in (x, w, post_bias)]
    ctx.needs = list(ctx.needs_input_grad) + [False] * 4


def _s2d_backward(ctx, grad):
    x, w, post_bias, out = ctx.saved_tensors
    x_meta, w_meta, post_meta = ctx.metas
    if not ctx.needs[0]:
        # The usual case (the input is data): mask, sums and dw in one op (one pass on CUDA).
        grad_w, sums = space_to_depth_conv_weight_grad(grad.to(x.dtype), x, out if ctx.relu else None, post_bias)
        grad_post = _grad_as(sums[0], post_meta) if ctx.needs[2] else None
        return None, _grad_as(grad_w, w_meta) if ctx.needs[1] else None, grad_post, None
    acc, conv_dtype = _accumulate_dtype(x), _conv_dtype(x)
    g, sum_grad, _ = _epilogue_backward(grad, out if ctx.relu else None, post_bias, acc, want_sums=ctx.needs[2])
    grad_post = _grad_as(sum_grad, post_meta) if ctx.needs[2] else None
    grad_x = grad_w = None
    if ctx.needs[0] or ctx.needs[1]:
        # A 1x1 conv is a GEMM over the pixels: with G = g as (N*P*Q, K) (a view of the
        # channels_last gradient) and S = space_to_depth(x) as (N*P*Q, 16C), dw = G^T S and
        # dS = G W.  (cuDNN, given the NCHW space_to_depth view, converted g to NCHW first:
        # 0.3 of 0.45 ms at N=2048 on an H100.)
        n, c, height, width = x.shape
        k, p, q = w.shape[0], height // 4, width // 4
        g_mat = g.to(conv_dtype).permute(0, 2, 3, 1).reshape(n * p * q, k)
        if ctx.needs[1]:
            s_mat = x.to(conv_dtype).reshape(n, c, p, 4, q, 4).permute(0, 2, 4, 3, 5, 1).reshape(n * p * q, 16 * c)
            grad_w = (g_mat.t() @ s_mat).reshape(w.shape)
        if ctx.needs[0]:
            grad_s = g_mat @ w.to(conv_dtype).reshape(k, 16 * c)
            grad_x = grad_s.reshape(n, p, q, 4, 4, c).permute(0, 5, 1, 3, 2, 4).reshape(n, c, height, width)
    return _grad_as(grad_x, x_meta), _grad_as(grad_w, w_meta), grad_post, None


torch.library.register_autograd("cutlass_ops::space_to_depth_conv", _s2d_backward, setup_context=_s2d_setup)


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


# ---- layer_norm_rows: y = LayerNorm(s), s = x + residual ------------------------------------------

def _ln_setup(ctx, inputs, output):
    x, residual, weight, bias, eps = inputs
    _, s, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(s if residual is not None else x, weight, bias, mean, rstd)
    ctx.set_materialize_grads(False)


def _ln_backward(ctx, grad_y, grad_s, grad_mean, grad_rstd):
    """layer_norm_rows_backward: the input gradient plus the gradient reaching the sum (grad_s)
    from its other users, in one kernel for 16-bit rows on CUDA (ATen's LayerNorm backward in
    float32 otherwise)."""
    s, weight, bias, mean, rstd = ctx.saved_tensors
    if not ctx.has_residual:  # the op's second output is then an empty placeholder
        grad_s = None
    if grad_y is None:  # only the sum is used downstream
        grad_x = grad_s
        grad_w = grad_b = None
    else:
        grad_x, grad_w, grad_b = torch.ops.cutlass_ops.layer_norm_rows_backward(
            grad_y, grad_s, s, mean, rstd, weight, weight is not None and ctx.needs_input_grad[2],
            bias is not None and ctx.needs_input_grad[3])
        grad_w = grad_w.to(weight.dtype) if grad_w.numel() else None
        grad_b = grad_b.to(bias.dtype) if grad_b.numel() else None
    return grad_x, (grad_x if ctx.has_residual else None), grad_w, grad_b, None


torch.library.register_autograd("cutlass_ops::layer_norm_rows", _ln_backward, setup_context=_ln_setup)


# ---- linear_silu: y = silu(alpha * (x @ weight^T + bias)) -------------------------------------

def _linear_silu_setup(ctx, inputs, output):
    x, weight, bias, alpha = inputs
    ctx.alpha = alpha
    ctx.save_for_backward(x, weight, bias)


def _linear_silu_backward(ctx, grad_y):
    """The pre-activation z = alpha (x W^T + b) recomputed by ATen in float32 (float64 for
    float64), then g = alpha grad_y silu'(z): grad_x = g W, grad_W = g^T x, grad_bias = sum g."""
    x, weight, bias = ctx.saved_tensors
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    x2 = x.reshape(-1, x.shape[-1]).to(ct)
    w = weight.to(ct)
    z = x2 @ w.t()
    if bias is not None:
        z = z + bias.to(ct)
    z = ctx.alpha * z
    s = torch.sigmoid(z)
    g = ctx.alpha * grad_y.reshape(-1, weight.shape[0]).to(ct) * (s * (1 + z * (1 - s)))
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (g @ w).reshape(x.shape).to(x.dtype)
    if ctx.needs_input_grad[1]:
        grad_w = (g.t() @ x2).to(weight.dtype)
    if bias is not None and ctx.needs_input_grad[2]:
        grad_b = g.sum(0).to(bias.dtype)
    return grad_x, grad_w, grad_b, None


torch.library.register_autograd("cutlass_ops::linear_silu", _linear_silu_backward, setup_context=_linear_silu_setup)


# ---- linear_residual: out = residual + alpha * x @ weight^T + bias -----------------------------

def _linear_residual_setup(ctx, inputs, output):
    x, weight, bias, residual, alpha = inputs
    ctx.alpha = alpha
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _linear_residual_backward(ctx, grad):
    """grad_residual = grad; with g = alpha grad: grad_x = g W, grad_W = g^T x, grad_bias = sum
    grad (cuBLAS GEMMs, float32 accumulation)."""
    x, weight = ctx.saved_tensors
    g2d = grad.reshape(-1, weight.shape[0])
    grad_x = grad_w = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_x = (ctx.alpha * (g2d @ weight)).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_w = ctx.alpha * (g2d.t() @ x.reshape(-1, x.shape[-1]))
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_b = g2d.sum(0)
    return grad_x, grad_w, grad_b, grad if ctx.needs_input_grad[3] else None, None


torch.library.register_autograd("cutlass_ops::linear_residual", _linear_residual_backward,
                                setup_context=_linear_residual_setup)


# ---- dw_conv3x3_tokens: depthwise 3x3 convs on a token map, lead rows in front ----------------

def _dw_tokens_setup(ctx, inputs, output):
    x, h, w, weight, bias, strides, lead = inputs
    ctx.geometry = (h, w, list(strides), 0 if lead is None else lead.shape[1])
    ctx.has_bias, ctx.has_lead = bias is not None, lead is not None
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(x, weight)


def _dw_tokens_backward(ctx, grads):
    """grad_x: one dw_conv3x3_tokens_backward_input kernel for all the convs (fp16/bf16 on CUDA);
    grad_weight: ATen's depthwise wgrad (cuDNN on CUDA) per conv on the NHWC map; grad_bias: each
    output's conv rows summed in float32; grad_lead: the lead rows' gradients summed over the
    outputs."""
    x, weight = ctx.saved_tensors
    h, w, strides, lead = ctx.geometry
    n, _, c = x.shape
    convs = [g[:, lead:] for g in grads]
    grad_x = grad_w = grad_b = grad_lead = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.cutlass_ops.dw_conv3x3_tokens_backward_input(convs, h, w, weight, strides)
    if ctx.needs_input_grad[3]:
        m = x.reshape(n, h, w, c)
        m = (m if m.is_contiguous() else m.contiguous()).permute(0, 3, 1, 2)  # NHWC memory, NCHW view
        parts = []
        for j, (g, s) in enumerate(zip(convs, strides)):
            ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
            gm = g.reshape(n, ho, wo, c)
            gm = (gm if gm.is_contiguous() else gm.contiguous()).permute(0, 3, 1, 2)
            # convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation,
            # transposed, output_padding, groups, output_mask): the weight's gradient only
            parts.append(torch.ops.aten.convolution_backward(
                gm, m, weight[j].to(x.dtype), None, [s, s], [1, 1], [1, 1], False, [0, 0], c,
                [False, True, False])[1])
        grad_w = torch.stack(parts).to(weight.dtype)
    if ctx.has_bias and ctx.needs_input_grad[4]:
        grad_b = torch.stack([g.sum((0, 1), dtype=torch.float32) for g in convs]).to(ctx.bias_dtype)
    if ctx.has_lead and ctx.needs_input_grad[6]:
        grad_lead = sum(g[:, :lead] for g in grads)
    return grad_x, None, None, grad_w, grad_b, None, grad_lead


torch.library.register_autograd("cutlass_ops::dw_conv3x3_tokens", _dw_tokens_backward, setup_context=_dw_tokens_setup)


# ---- layer_norm_dw_conv3x3_tokens: dw_conv3x3_tokens on LayerNorm(x) (and LayerNorm(lead)) -------

def _ln_dw_tokens_setup(ctx, inputs, output):
    x, h, w, ln_weight, ln_bias, eps, weight, bias, strides, lead = inputs
    ctx.geometry = (h, w, eps, list(strides))
    ctx.save_for_backward(x, ln_weight, ln_bias, weight, bias, lead)


def _ln_dw_tokens_backward(ctx, grads):
    """Recomputes the LayerNorms (float32 statistics, rounded as the op does) and the convs
    through dw_conv3x3_tokens under autograd, then differentiates them (the op runs in
    inference; this is for correctness, not speed)."""
    h, w, eps, strides = ctx.geometry
    saved = ctx.saved_tensors  # x, ln_weight, ln_bias, weight, bias, lead
    wants = [ctx.needs_input_grad[i] for i in (0, 3, 4, 6, 7, 9)]
    with torch.enable_grad():
        x, ln_w, ln_b, weight, bias, lead = [None if t is None else t.detach().requires_grad_(want)
                                             for t, want in zip(saved, wants)]

        def normed(t):
            ct = torch.float64 if t.dtype == torch.float64 else torch.float32
            return torch.nn.functional.layer_norm(t.to(ct), (t.shape[-1],), None if ln_w is None else ln_w.to(ct),
                                                  None if ln_b is None else ln_b.to(ct), eps).to(t.dtype)
        ys = torch.ops.cutlass_ops.dw_conv3x3_tokens(normed(x), h, w, weight, bias, strides,
                                                     None if lead is None else normed(lead))
        leaves = [t for t, want in zip((x, ln_w, ln_b, weight, bias, lead), wants) if t is not None and want]
        found = iter(torch.autograd.grad(ys, leaves, grads, allow_unused=True) if leaves else ())
    g = [next(found) if t is not None and want else None
         for t, want in zip((x, ln_w, ln_b, weight, bias, lead), wants)]
    return g[0], None, None, g[1], g[2], None, g[3], g[4], None, g[5]


torch.library.register_autograd("cutlass_ops::layer_norm_dw_conv3x3_tokens", _ln_dw_tokens_backward,
                                setup_context=_ln_dw_tokens_setup)


# ---- scale_samples: y = x * scale[n] per sample (FusedCvT's drop path) -------------------------

def _scale_samples_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _scale_samples_backward(ctx, grad):
    (scale,) = ctx.saved_tensors
    return torch.ops.cutlass_ops.scale_samples(grad, scale), None


torch.library.register_autograd("cutlass_ops::scale_samples", _scale_samples_backward,
                                setup_context=_scale_samples_setup)


# ---- conv_embed: tokens = LayerNorm(conv2d(x, w, b)) over the channels ----------------------------

_CONV_EMBED_DEFAULTS = (False, None, None, 1e-5)  # the schema's layer_norm, ln_weight, ln_bias, eps


def _conv_embed_setup(ctx, inputs, output):
    # a direct torch.ops call may leave the defaulted arguments out of `inputs`
    x, weight, bias, stride, padding, *rest = inputs
    layer_norm, ln_weight, ln_bias, eps = tuple(rest) + _CONV_EMBED_DEFAULTS[len(rest):]
    ctx.geometry = (stride, padding, layer_norm, eps)
    ctx.save_for_backward(x, weight, bias, ln_weight, ln_bias)


def _conv_embed_backward(ctx, grad):
    """The forward recomputed by ATen in float32 (float64 for float64) and differentiated there:
    the op's kernel has no backward of its own (FusedCvT trains through cuDNN's conv instead)."""
    x, weight, bias, ln_weight, ln_bias = ctx.saved_tensors
    stride, padding, layer_norm, eps = ctx.geometry
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    saved = (x, weight, bias, ln_weight, ln_bias)
    passed = len(ctx.needs_input_grad)  # a direct torch.ops call may pass fewer arguments
    needs = [i < passed and ctx.needs_input_grad[i] for i in (0, 1, 2, 6, 7)]  # those five's arguments
    inputs = [t.detach().to(ct).requires_grad_(need) if t is not None else None for t, need in zip(saved, needs)]
    with torch.enable_grad():
        y = torch.nn.functional.conv2d(inputs[0], inputs[1], inputs[2], stride, padding)
        t = y.flatten(2).transpose(1, 2)
        if layer_norm:
            t = torch.nn.functional.layer_norm(t, (t.shape[-1],), inputs[3], inputs[4], eps)
        wanted = [i for i, v in enumerate(inputs) if v is not None and v.requires_grad]
        grads = torch.autograd.grad(t, [inputs[i] for i in wanted], grad.to(ct)) if wanted else ()
    out = [None] * 5
    for i, g in zip(wanted, grads):
        out[i] = g.to(saved[i].dtype)
    x_g, w_g, b_g, lnw_g, lnb_g = out
    return (x_g, w_g, b_g, None, None, None, lnw_g, lnb_g, None)[:passed]


torch.library.register_autograd("cutlass_ops::conv_embed", _conv_embed_backward, setup_context=_conv_embed_setup)
