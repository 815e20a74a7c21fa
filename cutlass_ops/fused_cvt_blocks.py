"""FusedCvT's transformer blocks: LayerNorms with their residual adds, the convolutional q/k/v
projections (depthwise 3x3 + BatchNorm), attention and the MLP, as FusedCvT runs them.

``CvTBlocks`` is a mixin of FusedCvT (``fused_cvt.py``: construction, loading, the conv
embeddings and the forward); its methods read the model's ``options`` (``CvTOptions``) and its
cache of BatchNorm folds (``_folded``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import paths
from .linear import linear
from .models.cvt import DropPath, QuickGELU, drop_path_mask, layer_norm
from .ops import dw_conv3x3_tokens, layer_norm_rows, linear_residual, linear_silu, linear_silu_kernels, scale_samples

QUICK_GELU_SCALE = 1.702  # QuickGELU(x) = x * sigmoid(1.702 x)

_LINEAR_SILU_BUILT: dict = {}


def linear_silu_can_run(mlp, h: torch.Tensor, enabled: bool = True) -> bool:
    """Whether this MLP's fc1 and its SiLU run as one linear_silu kernel (CvTOptions.linear_silu):
    autograd off (its backward recomputes with ATen), 16-bit tokens on an sm90 GPU in the
    weights' dtype, widths multiples of 8, and a kernel of that dtype in this build."""
    w = mlp.fc1.weight
    if not (enabled and h.is_cuda and not torch.is_grad_enabled() and w.dtype == h.dtype
            and h.dtype in (torch.float16, torch.bfloat16) and w.shape[0] % 8 == 0 and w.shape[1] % 8 == 0):
        return False
    key = (h.device, h.dtype)
    if key not in _LINEAR_SILU_BUILT:
        dtype = str(h.dtype).removeprefix("torch.")
        _LINEAR_SILU_BUILT[key] = (torch.cuda.get_device_capability(h.device) == (9, 0)
                                   and any(name.endswith(f"({dtype})") for name in linear_silu_kernels()))
    return _LINEAR_SILU_BUILT[key]


def residual_gemms_can_run(blk, x: torch.Tensor, enabled: bool = True) -> bool:
    """Whether a block's output projection and fc2 add onto the residual stream in their GEMM's
    epilogue (linear_residual, CvTOptions.residual_gemm): 16-bit CUDA tokens with autograd off
    and the block's Linears in their dtype (not autocast), no active dropout or drop path."""
    lins = (blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2)
    return (enabled and x.is_cuda and not torch.is_grad_enabled()
            and x.dtype in (torch.float16, torch.bfloat16) and all(lin.weight.dtype == x.dtype for lin in lins)
            and not (blk.training and (blk.attn.proj_drop.p > 0 or blk.mlp.drop.p > 0
                                       or not isinstance(blk.drop_path, nn.Identity))))


class CvTBlocks:
    """The block-level methods of FusedCvT (see the module docstring)."""

    def _add_layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm, residual: torch.Tensor | None = None):
        """(LayerNorm(s), s) with s = x + residual (x without one): CvT's LayerNorm, in float32
        for 16-bit inputs; one layer_norm_rows kernel with CvTOptions.fused_layer_norm."""
        if self.options.fused_layer_norm:
            y, s = layer_norm_rows(x, norm.weight, norm.bias, norm.eps, residual)
            return y, (x if s is None else s)
        s = x if residual is None else x + residual
        return layer_norm(s, norm), s

    def _block(self, blk, x: torch.Tensor, h: int, w: int, folds: dict, pending: torch.Tensor | None = None):
        """One transformer block on x + pending (the previous block's last residual branch, not
        yet added): returns (the block's output less its MLP branch, that branch), or (the
        block's output, None) where its Linears add onto the stream (residual_gemms_can_run)."""
        if residual_gemms_can_run(blk, x, self.options.residual_gemm) and pending is None:
            attn = blk.attn
            h1, _ = self._add_layer_norm(x, blk.norm1)
            o = self._attend_heads(attn, *self._project(attn, h1, h, w, folds))
            s = linear_residual(o, attn.proj.weight, attn.proj.bias, x)
            h2, _ = self._add_layer_norm(s, blk.norm2)
            return self._mlp_onto(blk.mlp, h2, s), None
        h1, x = self._add_layer_norm(x, blk.norm1, pending)
        a = _drop_path(blk.drop_path, self._attention(blk.attn, h1, h, w, folds))
        h2, x = self._add_layer_norm(x, blk.norm2, a)
        return x, _drop_path(blk.drop_path, self._mlp(blk.mlp, h2))

    # -- MLP: QuickGELU as one SiLU ---------------------------------------------------------
    # x * sigmoid(1.702 x) is three ATen elementwise passes over the widest activation; since
    # fc2(x * sigmoid(1.702 x)) = (fc2.weight / 1.702) silu(1.702 x) + fc2.bias, it runs as one
    # SiLU with 1.702 and 1/1.702 as the two GEMMs' alpha.  Other activations (nn.GELU:
    # transformers' CvT) run as the module itself after fc1 (_act_fc1): correct, unfused.
    def _mlp_onto(self, mlp, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the MLP of h, fc2 adding onto the residual in its epilogue where fc1 and
        its SiLU run as one kernel (_silu_fc1) or the activation is not QuickGELU;
        residual + _mlp(h) otherwise."""
        if not isinstance(mlp.act, QuickGELU):
            return linear_residual(self._act_fc1(mlp, h), mlp.fc2.weight, mlp.fc2.bias, residual)
        y = self._silu_fc1(mlp, h)
        if y is not None:
            return linear_residual(y, mlp.fc2.weight, mlp.fc2.bias, residual, 1 / QUICK_GELU_SCALE)
        return residual + self._mlp(mlp, h)

    def _mlp(self, mlp, h: torch.Tensor) -> torch.Tensor:
        """fc1, QuickGELU (as one SiLU; another activation as it is), fc2 on the normalized tokens."""
        if not isinstance(mlp.act, QuickGELU):
            return mlp.drop(linear(mlp.drop(self._act_fc1(mlp, h)), mlp.fc2.weight, mlp.fc2.bias))
        y = self._silu_fc1(mlp, h)
        if y is None:
            self._note_mlp(mlp, h, "aten: QuickGELU as one SiLU (linear_silu does not run here)")
            return self._silu_mlp_aten(mlp, h)
        return mlp.drop(linear(mlp.drop(y), mlp.fc2.weight, mlp.fc2.bias, alpha=1 / QUICK_GELU_SCALE))

    def _silu_fc1(self, mlp, h: torch.Tensor) -> torch.Tensor | None:
        """silu(1.702 fc1(h)) as one linear_silu kernel, None where it does not run."""
        if linear_silu_can_run(mlp, h, self.options.linear_silu):
            self._note_mlp(mlp, h, "kernel")
            return linear_silu(h, mlp.fc1.weight, mlp.fc1.bias, QUICK_GELU_SCALE)
        return None

    def _act_fc1(self, mlp, h: torch.Tensor) -> torch.Tensor:
        """act(fc1(h)) for an activation other than QuickGELU (nn.GELU: F.gelu, exact or tanh as
        the module says): fc1 through cutlass_ops.linear, the activation as PyTorch computes it.
        linear_silu's epilogue computes silu only, so no kernel fuses these."""
        act = mlp.act
        what = f"F.gelu(approximate={act.approximate!r})" if isinstance(act, nn.GELU) else type(act).__name__
        self._note_mlp(mlp, h, f"aten: {what} after fc1 (linear_silu computes QuickGELU only)")
        return act(linear(h, mlp.fc1.weight, mlp.fc1.bias))

    def _note_mlp(self, mlp, h: torch.Tensor, path: str) -> None:
        """Records which path an MLP's fc1 and activation took: ``cutlass_ops.last_path("fused_cvt.mlp")``
        on CUDA, and kernel_report(x, mlps=True)'s list while it runs."""
        if paths.recording(h):
            paths.record("fused_cvt.mlp", path)
        log = getattr(self, "_mlp_log", None)
        if log is not None:
            names, rows = log
            rows.append((names.get(id(mlp), "mlp"), (*h.shape[:-1], mlp.fc1.weight.shape[0]), path))

    @staticmethod
    def _silu_mlp_aten(mlp, h: torch.Tensor) -> torch.Tensor:
        """fc2(QuickGELU(fc1(h))) with one SiLU: z σ(1.702 z) = silu(1.702 z) / 1.702, the two
        scales as the GEMMs' alpha (cuBLAS applies alpha in float32 before rounding, and keeps
        its bias epilogue, which needs beta = 1), so only fc1's bias is scaled by a tensor op:
        fc1 -> addmm(1.702 b1, h, W1^T, alpha=1.702), SiLU, addmm(b2, ., W2^T, alpha=1/1.702).
        No weight is folded, so nothing is recomputed per call (a CUDA graph replays one small
        kernel per block)."""
        fc1, fc2 = mlp.fc1, mlp.fc2
        b1 = fc1.bias * QUICK_GELU_SCALE if fc1.bias is not None else None
        y = mlp.drop(F.silu(linear(h, fc1.weight, b1, alpha=QUICK_GELU_SCALE)))
        return mlp.drop(linear(y, fc2.weight, fc2.bias, alpha=1 / QUICK_GELU_SCALE))

    # -- q/k/v projections: depthwise conv + BatchNorm ----------------------------------------
    def _dw_bn(self, proj: nn.Sequential, m: torch.Tensor, folds: dict):
        """Depthwise conv + BatchNorm on an NHWC map (N, C, H, W) -> (tokens (N, H'*W', C), c):
        in eval mode the tokens lack the folded bias c, which goes into the q/k/v Linear's bias
        instead of an add over the whole map (cuDNN's depthwise conv adds no bias); in training
        c is None and the tokens are whole."""
        conv, bn = proj.conv, proj.bn
        if bn.training or bn.running_mean is None:
            y = bn(F.conv2d(m, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups))
            return y.flatten(2).transpose(1, 2), None
        wt, bias = folds[id(proj)] if id(proj) in folds else self._folded_dw_bn(proj)
        y = F.conv2d(m, wt, None, conv.stride, conv.padding, conv.dilation, conv.groups)
        return y.flatten(2).transpose(1, 2), bias

    def _eval_folds(self) -> dict:
        """The eval-mode BatchNorm folds of all dw_bn projections at once, {id(proj): (weight,
        bias)}, the same arithmetic as _folded_dw_bn on the projections' tensors concatenated:
        20 ops instead of 14 per projection (39 in CvT-13), which matters where the fold cannot
        be cached (a CUDA graph, autograd, torch.compile).  Also, for each attention whose q, k,
        v were folded side by side, {id(attn): (their weights as one (3, C, 1, 3, 3) view, their
        biases as one (3, C) view)}: dw_conv3x3_tokens's arguments, and the three biases the cls
        row loses in one subtraction.  Cached like each projection's fold.  {} where the
        projections' dtypes or eps differ (or none is in eval mode): each is folded on its own."""
        projs, attns = [], {}
        for stage in self.stages():
            for blk in stage.blocks:
                for p in (blk.attn.conv_proj_q, blk.attn.conv_proj_k, blk.attn.conv_proj_v):
                    if hasattr(p, "bn") and not p.bn.training and p.bn.running_mean is not None:
                        projs.append(p)
                        attns[p] = blk.attn
        if not projs or any(p.bn.weight is None or p.bn.bias is None for p in projs):
            return {}
        tensors = tuple(t for p in projs for t in (p.conv.weight, p.bn.weight, p.bn.bias, p.bn.running_mean,
                                                   p.bn.running_var))
        eps = {p.bn.eps for p in projs}
        if len(eps) != 1 or len({t.dtype for t in tensors[0::5]}) != 1 or len({t.dtype for t in tensors[1::5]}) != 1:
            return {}
        eps = eps.pop()

        def fold_all(*ts):
            ws = ts[0::5]
            acc = torch.promote_types(ws[0].dtype, torch.float32)
            inv = torch.cat(ts[1::5]).to(acc) * torch.rsqrt(torch.cat(ts[4::5]).to(acc) + eps)
            w = (torch.cat([t.reshape(t.shape[0], -1) for t in ws]).to(acc) * inv[:, None]).to(ws[0].dtype)
            b = (torch.cat(ts[2::5]).to(acc) - torch.cat(ts[3::5]).to(acc) * inv).to(ws[0].dtype)
            out, at = {}, 0
            for i, (p, t) in enumerate(zip(projs, ws)):
                width = t.shape[0]
                out[id(p)] = (w[at:at + width].reshape(t.shape), b[at:at + width])
                attn = attns[p]
                if (p is attn.conv_proj_q and i + 2 < len(projs) and projs[i + 1] is attn.conv_proj_k
                        and projs[i + 2] is attn.conv_proj_v and ws[i + 1].shape == ws[i + 2].shape == t.shape):
                    out[id(attn)] = (w[at:at + 3 * width].view((3,) + tuple(t.shape)),
                                     b[at:at + 3 * width].view(3, width))
                at += width
            return out
        return self._cached_fold("dw_bn folds", tensors, fold_all, eps)

    def _folded_dw_bn(self, proj: nn.Sequential) -> tuple[torch.Tensor, torch.Tensor]:
        """The eval-mode fold of proj's BatchNorm into its depthwise conv: (weight, bias).
        Recomputing it costs ~7 small kernels per projection (39 projections in CvT-13), so
        with autograd off it is cached, keyed by the five tensors' addresses and version
        counters (an in-place update bumps the counter), as FusedResNet caches its derived
        weights.  Not cached while autograd records (the gradients reach conv and BN through
        the fold), while torch.compile traces (a traced tensor must not outlive the trace), or
        while a CUDA graph is captured: the graph computes its own fold at each replay, so that
        it follows in-place updates of the weights (a cached fold it captured would go stale,
        and be freed under it when the cache moved on)."""
        conv, bn = proj.conv, proj.bn

        def fold(weight, gamma, beta, mean, var):
            acc = torch.promote_types(weight.dtype, torch.float32)
            inv = gamma.to(acc) * torch.rsqrt(var.to(acc) + bn.eps)
            return ((weight.to(acc) * inv.view(-1, 1, 1, 1)).to(weight.dtype),
                    (beta.to(acc) - mean.to(acc) * inv).to(weight.dtype))
        return self._cached_fold(id(proj), (conv.weight, bn.weight, bn.bias, bn.running_mean, bn.running_var), fold,
                                 bn.eps)

    def _cached_fold(self, slot, tensors: tuple, fold, *extra):
        """fold(*tensors), cached in ``slot`` (a projection's id, or a name) when autograd is off,
        keyed by the tensors' addresses, version counters and dtypes (and ``extra``); computed
        afresh while autograd records, torch.compile traces or a CUDA graph is captured (see
        _folded_dw_bn)."""
        lead = next(t for t in tensors if t is not None)
        cacheable = not (torch.is_grad_enabled() or torch.compiler.is_compiling()
                         or (lead.is_cuda and torch.cuda.is_current_stream_capturing()))
        if cacheable:
            key = (tuple(None if t is None else (t.data_ptr(), t._version, t.dtype) for t in tensors), extra)
            hit = self._folded.get(slot)
            if hit is not None and hit[0] == key:
                return hit[1]
        out = fold(*tensors)
        if cacheable:
            self._folded[slot] = (key, out)
        return out

    # -- attention --------------------------------------------------------------------------
    def _attention(self, attn, x: torch.Tensor, h: int, w: int, folds: dict) -> torch.Tensor:
        return self._attend(attn, *self._project(attn, x, h, w, folds))

    def _project(self, attn, x: torch.Tensor, h: int, w: int, folds: dict):
        """The convolutional projection: dw_bn q/k/v on the token map (the cls token, stage 3,
        beside them), then the q/k/v Linears, split into heads (N, heads, L, d)."""
        projs = (attn.conv_proj_q, attn.conv_proj_k, attn.conv_proj_v)
        dw_on = self.options.dw_tokens
        n, t, c = x.shape
        if attn.with_cls_token:
            cls_token, x = torch.split(x, [1, h * w], 1)
        if dw_on and not torch.is_grad_enabled() and all(_dw_tokens_can_run(p) for p in projs):
            # one kernel for the three: the folded convs and biases, the cls token written in front
            lead = cls_token.to(x.dtype) if attn.with_cls_token else None
            if id(attn) in folds:
                wt, bias = folds[id(attn)]
            else:
                wt, bias = (torch.stack(t) for t in zip(*(folds[id(p)] if id(p) in folds else self._folded_dw_bn(p)
                                                          for p in projs)))
            strides = [p.conv.stride[0] for p in projs]
            parts = [(z, None) for z in dw_conv3x3_tokens(x, h, w, wt, bias, strides, lead)]
        elif dw_on and x.is_cuda and all(_dw_tokens_train_can_run(p) for p in projs):
            # training: the three convs from one read (in place behind stage 3's cls row) and, in
            # the backward, their input gradients in one kernel; then each real BatchNorm
            strides = [p.conv.stride[0] for p in projs]
            convs = dw_conv3x3_tokens(x, h, w, torch.stack([p.conv.weight for p in projs]), None, strides, None)
            parts = []
            for p, z, s in zip(projs, convs, strides):
                ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
                y = p.bn(z.view(n, ho, wo, c).permute(0, 3, 1, 2))  # NHWC memory: BN's channels-last kernels
                parts.append((y.permute(0, 2, 3, 1).reshape(n, ho * wo, c), None))
            if attn.with_cls_token:
                parts = [(torch.cat((cls_token.to(z.dtype), _contiguous_grad(z)), dim=1), None) for z, _ in parts]
        else:
            m = x.reshape(n, h, w, c)
            if not m.is_contiguous():
                # stage 3's map behind the cls row (batch stride 197 rows): each of the three convs
                # would copy it, and each of their backwards again; once here instead
                m = m.contiguous()
            m = m.permute(0, 3, 1, 2)  # NHWC memory, NCHW view
            parts = [self._dw_bn(p, m, folds) for p in projs]
            if attn.with_cls_token:  # the cls row less the bias the Linear adds back
                three_c = folds[id(attn)][1] if id(attn) in folds else None  # (3, C): one subtraction
                leads = ((cls_token - three_c.to(cls_token.dtype)).split(1, dim=1) if three_c is not None
                         else [cls_token if c is None else cls_token - c for _, c in parts])
                parts = [(torch.cat((lead.to(z.dtype), _contiguous_grad(z)), dim=1), c)
                         for lead, (z, c) in zip(leads, parts)]
        heads = attn.num_heads

        def split(part, lin):
            z, c = part
            b = lin.bias
            if c is not None:  # W (z + c) + b = W z + (W c + b)
                b = lin.weight @ c.to(lin.weight.dtype) if b is None else torch.addmv(b, lin.weight, c.to(b.dtype))
            z = linear(z, lin.weight, b)
            return z.reshape(n, z.shape[1], heads, z.shape[2] // heads).transpose(1, 2)

        return tuple(split(part, lin) for part, lin in zip(parts, (attn.proj_q, attn.proj_k, attn.proj_v)))

    def _attend(self, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention with CvT's scale over the heads, then the output projection: (N, L, dim)."""
        return attn.proj_drop(linear(self._attend_heads(attn, q, k, v), attn.proj.weight, attn.proj.bias))

    def _attend_heads(self, attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention with CvT's scale over the heads, the heads concatenated: (N, L, dim)."""
        n = q.shape[0]
        if q.is_cuda:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=attn.attn_drop.p if self.training else 0.0,
                                               scale=attn.scale)
        else:
            # The CPU path computes attention as the reference does: PyTorch's CPU flash attention
            # gave 1.8x the reference's gradient error in bfloat16 (test_fused_cvt_bfloat16_cpu).
            o = attn.attn_drop(torch.softmax(q @ k.transpose(-2, -1) * attn.scale, dim=-1)) @ v
        return o.transpose(1, 2).reshape(n, o.shape[2], attn.dim)


def _drop_path(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The reference's DropPath (timm 0.3.2's drop path: the same random draw, so the same
    samples dropped) as one ``scale_samples`` multiply by mask / keep_prob per sample, forward
    and backward, where timm's ``x.div(keep_prob) * mask`` is two passes over x each way; the
    product in float32 (float64 for float64), rounded once.  DropPath modules other than the
    reference's run as they are."""
    p = getattr(module, "drop_prob", None)
    if type(module) is not DropPath or not module.training or not p:
        return module(x)
    keep = 1 - p
    mask = drop_path_mask(x, keep)
    return scale_samples(x, mask.reshape(-1).to(torch.promote_types(x.dtype, torch.float32)) / keep)


def _dw_conv_fits(conv: nn.Module) -> bool:
    """A depthwise 3x3 conv with padding 1, no bias and the same stride 1 or 2 both ways (CvT's):
    what dw_conv3x3_tokens computes."""
    return (conv is not None and conv.kernel_size == (3, 3) and conv.padding == (1, 1) and conv.dilation == (1, 1)
            and conv.stride[0] == conv.stride[1] and conv.stride[0] in (1, 2)
            and conv.groups == conv.in_channels == conv.out_channels and conv.bias is None)


def _dw_tokens_can_run(proj: nn.Module) -> bool:
    """Whether dw_conv3x3_tokens computes this dw_bn projection with its BatchNorm folded in:
    eval-mode BatchNorm with running statistics, a conv that fits (_dw_conv_fits)."""
    bn = getattr(proj, "bn", None)
    return (bn is not None and not bn.training and bn.running_mean is not None
            and _dw_conv_fits(getattr(proj, "conv", None)))


def _dw_tokens_train_can_run(proj: nn.Module) -> bool:
    """Whether FusedCvT's training path runs this dw_bn projection's conv as dw_conv3x3_tokens
    (its BatchNorm after it): train-mode BatchNorm, a conv that fits (_dw_conv_fits)."""
    bn = getattr(proj, "bn", None)
    return isinstance(bn, nn.BatchNorm2d) and bn.training and _dw_conv_fits(getattr(proj, "conv", None))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous.  The tokens after a dw_bn
    projection are concatenated behind the cls token (stage 3), so the gradient reaching them is
    a slice with a batch stride of 197 rows, not 196: BatchNorm's backward would then take
    ATen's generic-layout kernels (several times slower than its channels-last ones) and the
    conv's backward would copy it; one copy here instead."""

    @staticmethod
    def forward(x):
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _contiguous_grad(x: torch.Tensor) -> torch.Tensor:
    return _ContiguousGrad.apply(x) if torch.is_grad_enabled() and x.requires_grad else x
