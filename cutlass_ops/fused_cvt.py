"""FusedCvT: CvT (Convolutional Vision Transformer) on cutlass_ops ops, NHWC inside.

A drop-in for the CvT reference ``cutlass_ops.models.cvt.ConvolutionalVisionTransformer``
(``cvt13()``, ``cvt21()``, ``cvtw24()``, other specs): the same parameters, buffers and
state_dict names; only the forward differs.  ``from_huggingface`` loads transformers' CvT
(``models/cvt_hf.py``).
Parts of it run as this project's fused kernels, the rest as PyTorch (ATen, cuDNN, cuBLAS):

- the conv embeddings: 3x3/2 64->192 and 192->384 as ``conv2d_fused`` (conv + bias, NHWC output
  read as tokens without a copy); stage 1's 7x7/4 from 3 channels, with autograd off, as one
  ``conv_embed`` kernel (patches gathered from the NCHW image, the conv, its bias and its
  LayerNorm), under autograd as cuDNN's conv: with 3 input channels only alignment-1 CUTLASS
  kernels apply, about ten times slower than cuDNN's there;
- the LayerNorms with the residual add before each as ``layer_norm_rows`` (forward and backward);
- each attention's three depthwise q/k/v convs as one ``dw_conv3x3_tokens`` call (eval with
  autograd off: BatchNorm folded in, the cls token written in front of each output; training:
  before the real BatchNorms, their input gradients in one kernel); elsewhere cuDNN's conv with
  the folded BatchNorm bias moved into the q/k/v Linear's bias;
- each MLP's QuickGELU as one SiLU (the scales as the GEMMs' alpha), on sm90 with autograd off
  fc1 and its SiLU as one ``linear_silu`` kernel; with autograd off on CUDA the output
  projection and fc2 add onto the residual stream in their GEMM's epilogue (``linear_residual``).
  A model with nn.GELU (transformers' CvT: exact GELU) runs it as ``F.gelu`` after fc1, unfused
  (``last_path("fused_cvt.mlp")``, ``kernel_report(x, mlps=True)`` say which ran);
- drop path as one ``scale_samples`` multiply per sample (timm's random draws).

Still PyTorch: the Linears (cuBLAS through ``cutlass_ops.linear``), attention
(``F.scaled_dot_product_attention`` with CvT's scale ``dim ** -0.5`` on CUDA; on the CPU the
reference's matmul-softmax-matmul), BatchNorm in training, the head.  ``CvTOptions`` turns each
fused kernel off (``options=``).  The block-level methods live in ``fused_cvt_blocks.py``.

Input: (N, in_chans, H, W), H and W multiples of 16 (each stage then halves the map
exactly: H/4, H/8, H/16), the model's dtype and device (or any float under torch.autocast);
any batch size >= 1.  Attention dropout > 0 (no CvT config uses it) runs inside SDPA on CUDA,
so its random mask differs from the reference's.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .models.cvt import (CVT13_SPEC, Block, ConvolutionalVisionTransformer, LayerNorm, Mlp, QuickGELU,
                          VisionTransformer, layer_norm)
from .models.cvt_hf import cvt_from_huggingface
from .fused_cvt_blocks import CvTBlocks
from .fused_resnet import FusedResNet
from .ops import conv2d_fused, conv2d_fused_last_kernel, conv_embed
from .options import CvTOptions


def conv_embed_can_run(patch_embed, x: torch.Tensor, weight: torch.Tensor, enabled: bool = True) -> bool:
    """Whether FusedCvT._embed takes this embedding as one conv_embed call (CvTOptions.conv_embed): CUDA,
    16-bit, input channels not a multiple of 8 (conv2d_fused takes the others), 32, 64 or 128
    output channels (the kernel's tiles: CvT-W24's 192 go to cuDNN without a fallback warning),
    a plain conv (no dilation, no groups, zero padding), and no gradient wanted (the op's backward
    recomputes with ATen: training keeps cuDNN's conv and its wgrad).  Shapes the kernel does
    not take run ATen's path inside the op, still correct."""
    proj, norm = patch_embed.proj, patch_embed.norm
    params = [t for t in (proj.weight, proj.bias) + ((norm.weight, norm.bias) if norm is not None else ())
              if t is not None]
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in params))
    return (enabled and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and not wants_grad
            and x.shape[1] % 8 != 0 and weight.shape[0] in (32, 64, 128)
            and proj.dilation == (1, 1) and proj.groups == 1
            and proj.padding_mode == "zeros" and isinstance(proj.padding, tuple)
            and (norm is None or isinstance(norm, nn.LayerNorm)))


class FusedCvT(CvTBlocks, ConvolutionalVisionTransformer):
    """Drop-in for the CvT reference (``cutlass_ops.models.cvt``); see the module docstring for
    which parts are fused kernels and which are still PyTorch.  ``options``: a ``CvTOptions``
    (None: its defaults, read from the environment when the model is made)."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, spec: dict | None = None,
                 options: CvTOptions | None = None):
        super().__init__(in_chans=in_chans, num_classes=num_classes, act_layer=QuickGELU,
                         norm_layer=partial(LayerNorm, eps=1e-5), init=(spec or CVT13_SPEC).get("INIT", "trunc_norm"),
                         spec=spec or CVT13_SPEC)
        self.in_chans = in_chans
        self.options = options if options is not None else CvTOptions()
        self._folded: dict = {}  # eval-mode dw_bn folds: slot (_cached_fold) -> (key, result)
        self._mlp_log = None  # kernel_report(mlps=True)'s ({id(mlp): name}, rows) while it runs
        self._to_kernel_layouts()

    @classmethod
    def from_reference(cls, model: ConvolutionalVisionTransformer, options: CvTOptions | None = None) -> "FusedCvT":
        """A FusedCvT with the reference's spec, weights, buffers, dtype, device and mode."""
        if not isinstance(model, ConvolutionalVisionTransformer):
            raise TypeError(f"FusedCvT.from_reference: expected a cutlass_ops.models.cvt model, got {type(model).__name__}")
        for name, m in model.named_modules():
            if isinstance(m, Block) and not isinstance(m.mlp.act, (QuickGELU, nn.GELU)):
                raise ValueError(f"FusedCvT.from_reference: {name}.mlp.act is {type(m.mlp.act).__name__}; "
                                 "FusedCvT runs QuickGELU (what CvT's get_cls_model builds; fused) or nn.GELU "
                                 "(transformers' CvT; through PyTorch)")
            if isinstance(m, nn.LayerNorm) and not isinstance(m, LayerNorm):
                raise ValueError(f"FusedCvT.from_reference: {name} is a plain nn.LayerNorm; FusedCvT runs "
                                 "CvT's LayerNorm (16-bit inputs in float32)")
        in_chans = model.stage0.patch_embed.proj.weight.shape[1]
        p = next(model.parameters())
        with torch.device("meta"):  # no init work (and no RNG draws): the weights are loaded next
            fused = cls(model.num_classes, in_chans, model.spec, options)
        fused = fused.to_empty(device=p.device).to(dtype=p.dtype)
        fused.load_state_dict(model.state_dict())
        for a, b in zip(fused.modules(), model.modules()):
            if isinstance(a, (LayerNorm, nn.BatchNorm2d)):
                a.eps = b.eps
            if isinstance(a, nn.BatchNorm2d):
                a.momentum = b.momentum
            if isinstance(a, Block) and not isinstance(b.mlp.act, QuickGELU):
                a.mlp.act = nn.GELU(approximate=b.mlp.act.approximate)
        return fused.train(model.training)

    @classmethod
    def from_huggingface(cls, model_or_state_dict, config=None, options: CvTOptions | None = None) -> "FusedCvT":
        """A FusedCvT of a transformers ``CvtForImageClassification`` or ``CvtModel`` (its
        config, weights, buffers, eps, dtype, device and mode), or of such a module's state_dict
        and its config (a ``CvtConfig`` or a dict of its fields; needs no transformers; eval
        mode): ``models.cvt_hf.cvt_from_huggingface``, then ``from_reference``.  Its MLPs run
        transformers' exact GELU through PyTorch, not the fused QuickGELU (docs/fused_cvt.md)."""
        return cls.from_reference(cvt_from_huggingface(model_or_state_dict, config), options)

    # -- parameter layouts -----------------------------------------------------------------
    def _to_kernel_layouts(self) -> None:
        """The conv embeddings' weights in NHWC (KRSC) memory, as conv2d_fused reads them."""
        for stage in self.stages():
            w = stage.patch_embed.proj.weight
            w.data = w.data.contiguous(memory_format=torch.channels_last)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._to_kernel_layouts()
        self._folded.clear()
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._to_kernel_layouts()
        self._folded.clear()
        return result

    # -- forward ---------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor, autocast_dtype) -> None:
        w = self.stage0.patch_embed.proj.weight
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(f"FusedCvT: expected input (N, {self.in_chans}, H, W), got {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise ValueError("FusedCvT: empty batch (N = 0)")
        if x.shape[2] % 16 or x.shape[3] % 16 or x.shape[2] == 0 or x.shape[3] == 0:
            raise ValueError(f"FusedCvT: input height and width must be positive multiples of 16, got "
                             f"{x.shape[2]}x{x.shape[3]}")
        if not x.is_floating_point():
            raise ValueError(f"FusedCvT: input must be floating point, got {x.dtype}")
        if x.device != w.device or (autocast_dtype is None and x.dtype != w.dtype):
            raise ValueError(f"FusedCvT: input is {x.dtype} on {x.device} but the model is {w.dtype} on "
                             f"{w.device}; convert one of them")

    _autocast_dtype = staticmethod(FusedResNet._autocast_dtype)  # the dtype autocast asks for, or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)

    def kernel_report(self, x: torch.Tensor, mlps: bool = False) -> list[tuple[str, tuple, str]]:
        """(layer, output shape, kernel) of each conv embedding in one forward on x: the
        generated CUTLASS kernel (tile, alignment, split-K) the dispatcher picked, or "aten"
        (CPU, float32/64, a shape no kernel covers, or an input whose channels are not a
        multiple of 8 on CUDA: cuDNN).  mlps: then also each block's MLP (its fc1 output
        shape): "kernel" (fc1 and QuickGELU as one linear_silu) or "aten: <what ran>" (QuickGELU
        as one SiLU after cuBLAS, or a GELU model's F.gelu)."""
        report: list = []
        if mlps:
            self._mlp_log = ({id(m): n for n, m in self.named_modules() if isinstance(m, Mlp)}, [])
        try:
            with torch.no_grad():
                self._forward(x, report)
        finally:
            log, self._mlp_log = getattr(self, "_mlp_log", None), None
        return report + (log[1] if log is not None else [])

    def _forward(self, x: torch.Tensor, report: list | None = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"FusedCvT: input must be a tensor, got {type(x).__name__}")
        autocast_dtype = self._autocast_dtype(x)
        self._check_input(x, autocast_dtype)
        cls_tokens = None
        folds = self._eval_folds()
        for i, stage in enumerate(self.stages()):
            x, cls_tokens = self._stage(stage, x, autocast_dtype, folds, report, f"stage{i}.patch_embed.proj")
        if self.cls_token:
            feat = layer_norm(cls_tokens, self.norm).squeeze(1)
        else:
            feat = layer_norm(x.flatten(2).transpose(1, 2), self.norm).mean(dim=1)
        return self.head(feat)

    def _stage(self, stage: VisionTransformer, x: torch.Tensor, autocast_dtype, folds: dict, report=None, name=""):
        """x: (N, C, H, W) in NHWC memory -> (N, C', H', W') in NHWC memory, cls tokens; the conv
        embedding's (name, output shape, kernel) appended to ``report`` if given; ``folds``:
        _eval_folds()."""
        t, (n, c, h, w) = self._embed(stage, x, autocast_dtype, report, name)
        cls_tokens = None
        if stage.cls_token is not None:
            t = torch.cat((stage.cls_token.expand(n, -1, -1).to(t.dtype), t), dim=1)
        t = stage.pos_drop(t)
        pending = None  # each block's last residual add, done by the next block's first LayerNorm
        for blk in stage.blocks:
            t, pending = self._block(blk, t, h, w, folds, pending)
        if pending is not None:
            t = t + pending
        if stage.cls_token is not None:
            cls_tokens, t = torch.split(t, [1, h * w], 1)
        return t.reshape(n, h, w, c).permute(0, 3, 1, 2), cls_tokens

    def _embed(self, stage: VisionTransformer, x: torch.Tensor, autocast_dtype=None, report=None, name=""):
        """The conv embedding (conv + bias, then the LayerNorm): x (N, C, H, W) in NHWC memory ->
        (tokens (N, H'*W', C'), (N, C', H', W'))."""
        proj = stage.patch_embed.proj
        weight = proj.weight
        if autocast_dtype is not None:  # as autocast does for F.conv2d
            x, weight = x.to(autocast_dtype), weight.to(autocast_dtype)
        if conv_embed_can_run(stage.patch_embed, x, weight, self.options.conv_embed):  # the image as the caller holds it
            norm = stage.patch_embed.norm
            t = conv_embed(x, weight, proj.bias, list(proj.stride), list(proj.padding), norm is not None,
                           *((norm.weight, norm.bias, norm.eps) if norm is not None else ()))
            n, c = t.shape[0], t.shape[2]
            h = (x.shape[2] + 2 * proj.padding[0] - proj.kernel_size[0]) // proj.stride[0] + 1
            if report is not None:
                report.append((name, (n, c, h, t.shape[1] // h), "conv_embed"))
            return t, (n, c, h, t.shape[1] // h)
        x = x.contiguous(memory_format=torch.channels_last)
        if x.is_cuda and x.shape[1] % 8 != 0:  # alignment-1 CUTLASS kernels only: cuDNN (module docstring)
            bias = proj.bias.to(weight.dtype) if proj.bias is not None else None
            y = F.conv2d(x, weight, bias, proj.stride, proj.padding)
            kernel = "aten (cuDNN: C_in not a multiple of 8)"
        else:
            y = conv2d_fused(x, weight, bias=proj.bias, stride=list(proj.stride), padding=list(proj.padding))
            kernel = conv2d_fused_last_kernel() if report is not None else ""
        if report is not None:
            report.append((name, tuple(y.shape), kernel))
        n, c, h, w = y.shape
        t = y.permute(0, 2, 3, 1).reshape(n, h * w, c)  # NHWC memory: a view
        if stage.patch_embed.norm is not None:
            t, _ = self._add_layer_norm(t, stage.patch_embed.norm)
        return t, (n, c, h, w)


__all__ = ["FusedCvT"]
