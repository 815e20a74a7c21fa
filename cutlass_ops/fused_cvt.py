"""FusedCvT: CvT (Convolutional Vision Transformer) on cutlass_ops ops, NHWC inside.

PARTLY FUSED (listed below; the rest is PyTorch).  Same parameters, buffers and state_dict
names as the reference ``cutlass_ops.models.cvt.ConvolutionalVisionTransformer`` (``cvt13()``);
only the forward differs.  What runs where, per forward:

  fused CUTLASS kernel (``conv2d_fused``, on CUDA fp16/bf16; on the CPU and for float32/64
  it is ATen's conv, correct but not fused):
    - two of the three conv embeddings, conv + bias in one kernel: 3x3/2 64->192 and 3x3/2
      192->384; output NHWC (channels_last), read as tokens (N, H*W, C) without a copy.
    - not the first, 7x7/4 from C_in=3: an input whose channels are not a multiple of 8 gets
      only alignment-1 CUTLASS kernels, and on an H100 (N=64, 224x224, fp16) the one picked took
      1019 us against cuDNN's 106 us for the same conv in the same run
      (docs/results/cvt_fp16_h100_n64.json), so under autograd it runs as ATen's conv (cuDNN)
      with its bias, then the LayerNorm kernel.

  stage 1's embedding with autograd off (CUTLASS_OPS_CVT_CONV_EMBED=0 turns it off): the 7x7/4
  conv from the image, its bias and its LayerNorm as one ``conv_embed`` kernel
  (kernels/conv_embed: the patches gathered from the NCHW image, no layout copy, WMMA, the
  LayerNorm on the accumulators).  H100, one process: forward N=64 3.163 -> 3.009 ms, N=256
  11.460 -> 10.897 (docs/results/cvt_h100_session15/).

  fused LayerNorms (``layer_norm_rows``, kernels/layer_norm; CUTLASS_OPS_CVT_FUSED_LN=0 turns
  them off): each block's two LayerNorms and the embeddings' in one kernel with the residual add
  before each (float32 statistics; each block's last residual add is done by the next block's
  first LayerNorm), and their backward in one kernel each (``layer_norm_rows_backward``; H200,
  N=64 training step 24.07 -> 19.81 ms).  On the H200 (N=64, 224x224, fp16, CUDA graph) they took the forward from
  7.50 to 5.31 ms and the training step from 26.99 to 26.05 ms
  (docs/results/cvt_h200_session11/).

  QuickGELU as one SiLU (CUTLASS_OPS_CVT_SILU_MLP=0 turns it off): x * sigmoid(1.702 x) is
  three ATen elementwise passes; with 1.702 as fc1's GEMM alpha (and on its bias) and 1/1.702
  as fc2's it is one ``F.silu`` (``_silu_mlp``).  H200, in its first form (the scales folded
  into the weights at each call; the alpha form is the default of the H200 runs since):
  forward 7.50 -> 7.02 ms, training step 26.99 -> 25.05 ms; with the fused LayerNorms (and
  FusedMLP) 4.96 and 24.44 ms.

  the q/k/v "dw_bn" projections in eval mode with autograd off (CUTLASS_OPS_CVT_DW_TOKENS=0
  turns it off): each attention's three depthwise 3x3 convs (stride 1 for q, 2 for k and v),
  the BatchNorms folded in (weight * gamma / sqrt(var + eps), bias beta - mean * gamma /
  sqrt(var + eps), float32 or wider, from the current parameters and running statistics; in
  eager calls with autograd off the folds are cached until one of them changes, a CUDA graph
  recomputes them at each replay), as one ``dw_conv3x3_tokens`` kernel (kernels/dw_conv): the
  map read once, in place behind stage 3's cls row, the cls token written in front of each
  output.  H200, N=64, CUDA graph: forward 3.793 -> 3.361 ms (docs/results/cvt_h200_session13/);
  its tiled form (the band of rows in shared memory once; CUTLASS_OPS_DW_TILE=0 for the strip
  form): H100 forward 3.010 -> 2.842 ms (docs/results/cvt_h100_session16/).

  the residual adds with autograd off on CUDA (CUTLASS_OPS_CVT_RESIDUAL_GEMM=0 turns it off):
  each block's output projection and fc2 as ``linear_residual`` (kernels/linear_residual: one
  cuBLASLt matmul, the residual stream as its C input, the bias in its epilogue), so each
  LayerNorm reads one tensor and writes one and no stage ends with an add pass.  H100: forward
  2.844 -> 2.799 ms at N=64, 10.294 -> 9.956 at N=256.

  each MLP's fc1 and its SiLU on an sm90 GPU with autograd off (CUTLASS_OPS_CVT_LINEAR_SILU=0
  turns it off): one ``linear_silu`` kernel (kernels/linear_silu: CUTLASS's sm90 GEMM with
  silu(1.702 (acc + b1)) in its epilogue), where cuBLAS wrote the pre-activation and F.silu read
  and wrote it again.  H100, one process: forward N=64 3.586 -> 3.156 ms, N=256 12.859 ->
  11.433 (docs/results/cvt_h100_session14/).

  the dw_bn projections' convs in training on CUDA (CUTLASS_OPS_CVT_DW_TOKENS=0 turns it off):
  each attention's three depthwise convs (no bias) as one ``dw_conv3x3_tokens`` call (stage 3's
  map read in place behind the cls row), then each real BatchNorm; in the backward their input
  gradients as one ``dw_conv3x3_tokens_backward_input`` kernel (the weights' by cuDNN's wgrad).
  H100, training step N=64 17.132 -> 16.474 ms, N=128 29.418 -> 28.346.

  opt-in, CUTLASS_OPS_CVT_SILU_EPILOGUE=1 (autograd off): each MLP's fc1 and its SiLU as one
  conv2d_fused kernel (SiLU in its epilogue); off by default, slower than cuBLAS + SiLU here
  (silu_epilogue_enabled).

  still PyTorch (ATen / cuDNN / cuBLAS kernels, one or more per op):
    - with CUTLASS_OPS_CVT_FUSED_LN=0 the LayerNorms and residual adds (16-bit inputs in
      float32, as CvT's LayerNorm); always the head's LayerNorm;
    - the q/k/v "dw_bn" projections otherwise: cuDNN's depthwise conv per projection on the
      NHWC map; eval mode (under autograd, or =0 above): the folded conv, its bias moved into
      the q/k/v Linear's (dw_bias_in_linear_enabled); train mode (on the CPU, or =0 above): the
      real ``nn.BatchNorm2d`` after the conv (batch statistics, running statistics updated);
      the BatchNorms themselves in training always.
    - the q/k/v/out linears, the MLP linears (fc1 under autograd or off sm90; out and fc2
      under autograd or on the CPU; cuBLAS through
      ``cutlass_ops.linear.linear``, whose
      backward takes the bias gradient as a GEMV with ones: ATen's column sums took 2.2 ms of
      the H200's N=64 training step; opt-in, CUTLASS_OPS_CVT_FUSED_MLP=1:
      MLPs no wider than 256, i.e. stage 1's, as one FusedMLP kernel, which the H200 run timed
      at 7.59 ms against 7.50 for the forward, so it stays off), residual adds (in inference
      on CUDA inside the output projections' and fc2's GEMMs, above), dropout;
      drop path draws timm 0.3.2's random mask as the reference, applied as one
      ``scale_samples`` kernel per sample forward and backward (_drop_path);
    - attention: ``F.scaled_dot_product_attention`` with ``scale = dim ** -0.5`` (the
      whole embed dim, as CvT) on CUDA, matmul-softmax-matmul on the CPU (as the reference),
      the cls token concatenated in front of q, k, v;
    - the head: LayerNorm of the cls token, Linear.

Input: (N, in_chans, H, W), H and W multiples of 16 (each stage then halves the map
exactly: H/4, H/8, H/16), the model's dtype and device (or any float under torch.autocast);
any batch size >= 1.  Attention dropout > 0 (no CvT config uses it) runs inside SDPA on CUDA,
so its random mask differs from the reference's.
"""
from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .models.cvt import (CVT13_SPEC, Block, ConvolutionalVisionTransformer, DropPath, LayerNorm, QuickGELU,
                          VisionTransformer, drop_path_mask, layer_norm, quick_gelu)
from .fused_resnet import FusedResNet
from .linear import linear
from .ops import (conv2d_fused, conv2d_fused_last_kernel, conv_embed, dw_conv3x3_tokens, layer_norm_dw_conv3x3_tokens,
                  layer_norm_rows, linear_residual, linear_silu, linear_silu_kernels, scale_samples)

QUICK_GELU_SCALE = 1.702  # QuickGELU(x) = x * sigmoid(1.702 x)


def silu_mlp_enabled() -> bool:
    """CUTLASS_OPS_CVT_SILU_MLP (default on): each MLP's QuickGELU, x * sigmoid(1.702 x) (three
    ATen elementwise passes over the widest activation, 1.61 ms of the H100 forward at N=64), runs
    as one SiLU on 1.702 x, since fc2(x * sigmoid(1.702 x)) = (fc2.weight / 1.702) silu(1.702 x)
    + fc2.bias: the scales as the two GEMMs' alpha (FusedCvT._silu_mlp).
    On by default since the H200 run (module docstring); =0 turns it off; read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_SILU_MLP", "1") != "0"


def fused_mlp_enabled() -> bool:
    """CUTLASS_OPS_CVT_FUSED_MLP=1: a block MLP no wider than 256 (stage 1's 64 -> 256 -> 64)
    runs as FusedMLP's generated kernel (fc1, QuickGELU and fc2 in one pass: the 256-wide hidden
    activation never reaches global memory), with the block's own weights.  Opt-in: the H200
    run timed the forward at N=64 7.59 ms with it, 7.50 without (its kernel 332 us, the two
    GEMMs and the activation 145: at width 256 the kernel keeps the weights resident with only
    4 warps a CTA; FusedMLP itself sends models wider than 128 to PyTorch's ops).  The kernel
    compiles at first use (nvcc).  Read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_FUSED_MLP", "0") == "1"


def dw_bias_in_linear_enabled() -> bool:
    """CUTLASS_OPS_CVT_DW_BIAS_IN_LINEAR (default on; eval mode): each dw_bn projection's folded
    BatchNorm bias goes into the q/k/v Linear's bias (W (conv(m) + c) + b = W conv(m) + (W c +
    b), one small addmv a projection) instead of an elementwise add over the whole map after the
    depthwise conv (cuDNN's depthwise kernel adds no bias); the cls token (stage 3) enters as
    cls - c so its row is unchanged.  H200, N=64, fp16, CUDA graph: forward 4.303 -> 3.968 ms
    (docs/results/cvt_h200_session12/); =0 turns it off; read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_DW_BIAS_IN_LINEAR", "1") != "0"


def dw_tokens_enabled() -> bool:
    """CUTLASS_OPS_CVT_DW_TOKENS (default on): in eval mode with autograd off, each attention's
    three dw_bn projections as one ``dw_conv3x3_tokens`` kernel (kernels/dw_conv): the folded
    depthwise convs with their biases from one read of the token map (stage 3's read in place
    behind the cls row), the cls token written in front of each output, where =0 runs cuDNN's
    depthwise conv per projection, a contiguous copy of stage 3's map and three concatenations
    behind the cls row (H200, N=64, fp16, CUDA graph, one process: forward 3.793 -> 3.361 ms,
    docs/results/cvt_h200_session13/).  In training on CUDA, the three convs (no bias) as one
    dw_conv3x3_tokens call before each real BatchNorm, their input gradients in one
    ``dw_conv3x3_tokens_backward_input`` kernel where cuDNN ran a dgrad per projection and
    autograd added the three.  Read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_DW_TOKENS", "1") != "0"


def silu_epilogue_enabled() -> bool:
    """CUTLASS_OPS_CVT_SILU_EPILOGUE=1 (autograd off, CUDA, fp16/bf16): each MLP's fc1 and its
    SiLU (QuickGELU, silu_mlp_enabled) as one conv2d_fused kernel with the SiLU in its epilogue
    (FusedCvT._fc1_silu_epilogue) instead of cuBLAS's GEMM and a SiLU pass over the widest
    activation.  Opt-in: this build's CUTLASS kernels are slower than cuBLAS on these GEMMs.
    H200, N=64, fp16, CUDA graph, one process: forward 4.320 ms with it, 3.317 without (kernels
    by the occupancy heuristic); the profiler's best kernel per GEMM (graphed, with the
    epilogue) against cuBLAS's GEMM + SiLU: stage 1 83 us against 55 + 55, stage 2 85 against
    41 + 44, stage 3 60 against 32 + 23 (docs/results/cvt_h200_session13/).  Read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_SILU_EPILOGUE", "0") == "1"


def silu_epilogue_can_run(mlp, h: torch.Tensor) -> bool:
    """Whether FusedCvT._fc1_silu_epilogue takes this MLP's fc1: switched on, autograd off (its
    backward would recompute the GEMM), tokens (N, L, C) of 16 bits on CUDA in the weights'
    dtype, widths multiples of 8 (conv2d_fused's 16-byte kernels)."""
    w = mlp.fc1.weight
    return (silu_epilogue_enabled() and h.is_cuda and h.dim() == 3 and h.dtype in (torch.float16, torch.bfloat16)
            and w.dtype == h.dtype and not torch.is_grad_enabled() and w.shape[0] % 8 == 0 and w.shape[1] % 8 == 0)


def linear_silu_enabled() -> bool:
    """CUTLASS_OPS_CVT_LINEAR_SILU (default on; autograd off): each MLP's fc1 and its SiLU
    (QuickGELU, silu_mlp_enabled) as one ``linear_silu`` kernel (kernels/linear_silu: CUTLASS's
    sm90 GEMM with silu(1.702 (acc + b1)) in its epilogue, b1 fc1's own bias) where this build
    holds one for the GPU and dtype, instead of 1.702 b1 (a small kernel), cuBLAS's GEMM and a
    SiLU pass over the widest activation.
    =0 turns it off; read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_LINEAR_SILU", "1") != "0"


_LINEAR_SILU_BUILT: dict = {}


def linear_silu_can_run(mlp, h: torch.Tensor) -> bool:
    """Whether FusedCvT._silu_mlp takes this MLP's fc1 as one linear_silu kernel: switched on,
    autograd off (its backward recomputes with ATen), 16-bit tokens on an sm90 GPU in the
    weights' dtype, widths multiples of 8, and a kernel of that dtype in this build."""
    w = mlp.fc1.weight
    if not (linear_silu_enabled() and h.is_cuda and not torch.is_grad_enabled() and w.dtype == h.dtype
            and h.dtype in (torch.float16, torch.bfloat16) and w.shape[0] % 8 == 0 and w.shape[1] % 8 == 0):
        return False
    key = (h.device, h.dtype)
    if key not in _LINEAR_SILU_BUILT:
        dtype = str(h.dtype).removeprefix("torch.")
        _LINEAR_SILU_BUILT[key] = (torch.cuda.get_device_capability(h.device) == (9, 0)
                                   and any(name.endswith(f"({dtype})") for name in linear_silu_kernels()))
    return _LINEAR_SILU_BUILT[key]


_CONSTANTS: dict = {}


def _constant(value: float, device: torch.device) -> torch.Tensor:
    """A float32 scalar on `device`, made once (a fill kernel per call otherwise, 13 per
    forward; never written, so a CUDA graph may capture it)."""
    key = (value, device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.full((), value, dtype=torch.float32, device=device)
    return _CONSTANTS[key]


def conv_embed_enabled() -> bool:
    """CUTLASS_OPS_CVT_CONV_EMBED (default on; autograd off): a conv embedding whose input
    channels are not a multiple of 8 (stage 1's 7x7/4 from the image) as one ``conv_embed``
    kernel (kernels/conv_embed: the patches gathered from the NCHW image, the conv on tensor
    cores, its bias and the LayerNorm on the accumulators), where cuDNN ran the conv after a
    layout copy of the image, then a bias pass and the LayerNorm kernel.  =0 turns it off; read
    per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_CONV_EMBED", "1") != "0"


def conv_embed_can_run(patch_embed, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether FusedCvT._embed takes this embedding as one conv_embed call: switched on, CUDA,
    16-bit, input channels not a multiple of 8 (conv2d_fused takes the others), a plain conv
    (no dilation, no groups, zero padding), and no gradient wanted (the op's backward
    recomputes with ATen: training keeps cuDNN's conv and its wgrad).  Shapes the kernel does
    not take run ATen's path inside the op, still correct."""
    proj, norm = patch_embed.proj, patch_embed.norm
    params = [t for t in (proj.weight, proj.bias) + ((norm.weight, norm.bias) if norm is not None else ())
              if t is not None]
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in params))
    return (conv_embed_enabled() and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and not wants_grad
            and x.shape[1] % 8 != 0 and proj.dilation == (1, 1) and proj.groups == 1
            and proj.padding_mode == "zeros" and isinstance(proj.padding, tuple)
            and (norm is None or isinstance(norm, nn.LayerNorm)))


def residual_gemms_enabled() -> bool:
    """CUTLASS_OPS_CVT_RESIDUAL_GEMM (default on; CUDA, autograd off): each block's output
    projection and fc2 add their output onto the residual stream in the GEMM's epilogue
    (``linear_residual``: one cuBLASLt matmul, the stream as its C input, the bias in its
    epilogue), so the LayerNorm after each reads one tensor and writes one, where it read the
    stream and the branch and wrote their sum and its output, and no stage ends with an add
    pass.  =0 turns it off; read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_RESIDUAL_GEMM", "1") != "0"


def residual_gemms_can_run(blk, x: torch.Tensor) -> bool:
    """Whether FusedCvT._block runs this block with linear_residual (residual_gemms_enabled):
    16-bit CUDA tokens with autograd off and the block's Linears in their dtype (not autocast),
    no active dropout or drop path."""
    lins = (blk.attn.proj, blk.mlp.fc1, blk.mlp.fc2)
    return (residual_gemms_enabled() and x.is_cuda and not torch.is_grad_enabled()
            and x.dtype in (torch.float16, torch.bfloat16) and all(lin.weight.dtype == x.dtype for lin in lins)
            and not (blk.training and (blk.attn.proj_drop.p > 0 or blk.mlp.drop.p > 0
                                       or not isinstance(blk.drop_path, nn.Identity))))


def norm1_in_dw_enabled() -> bool:
    """CUTLASS_OPS_CVT_NORM1_IN_DW=1 (opt-in; with the residual GEMMs and the fused LayerNorms):
    each block's norm1 runs inside its dw_bn projections' kernel (``layer_norm_dw_conv3x3_tokens``:
    the band of the map normalized in shared memory right after it is read), so the normalized
    map, which only those convs and the cls token read, is never written.  Off by default: slower
    on the H100 (session 16, N=64 per attention, against layer_norm_rows + the tiled dw kernel:
    74.4 / 83.5 / 59.7 us against 68.3 / 48.9 / 27.1; forward 3.242 against 2.811 ms): with
    every channel of a pixel in one CTA, stages 2 and 3 get 2-row bands (twice the rows read)
    and few threads a CTA for the statistics.  Read per forward."""
    return os.environ.get("CUTLASS_OPS_CVT_NORM1_IN_DW", "0") == "1"


def fused_layer_norm_enabled() -> bool:
    """CUTLASS_OPS_CVT_FUSED_LN (default on): the blocks' LayerNorms run as ``layer_norm_rows``
    (one kernel for the residual add before each and the LayerNorm), instead of ATen's add, casts and
    LayerNorm.  On by default since the H200 run (module docstring); =0 turns it off; read per
    forward."""
    return os.environ.get("CUTLASS_OPS_CVT_FUSED_LN", "1") != "0"


class FusedCvT(ConvolutionalVisionTransformer):
    """Drop-in for the CvT reference (``cutlass_ops.models.cvt``); see the module docstring for
    which parts are fused kernels (two conv embeddings, the LayerNorms with their residual adds,
    the eval-mode q/k/v depthwise convs) and which are still PyTorch."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, spec: dict | None = None):
        super().__init__(in_chans=in_chans, num_classes=num_classes, act_layer=QuickGELU,
                         norm_layer=partial(LayerNorm, eps=1e-5), init=(spec or CVT13_SPEC).get("INIT", "trunc_norm"),
                         spec=spec or CVT13_SPEC)
        self.in_chans = in_chans
        self._folded: dict = {}  # eval-mode dw_bn folds: slot (_cached_fold) -> (key, result)
        self._to_kernel_layouts()
        self._register_fused_mlps()

    @classmethod
    def from_reference(cls, model: ConvolutionalVisionTransformer) -> "FusedCvT":
        """A FusedCvT with the reference's spec, weights, buffers, dtype, device and mode."""
        if not isinstance(model, ConvolutionalVisionTransformer):
            raise TypeError(f"FusedCvT.from_reference: expected a cutlass_ops.models.cvt model, got {type(model).__name__}")
        for name, m in model.named_modules():
            if isinstance(m, Block) and not isinstance(m.mlp.act, QuickGELU):
                raise ValueError(f"FusedCvT.from_reference: {name}.mlp.act is {type(m.mlp.act).__name__}; "
                                 "FusedCvT runs QuickGELU (what CvT's get_cls_model builds)")
            if isinstance(m, nn.LayerNorm) and not isinstance(m, LayerNorm):
                raise ValueError(f"FusedCvT.from_reference: {name} is a plain nn.LayerNorm; FusedCvT runs "
                                 "CvT's LayerNorm (16-bit inputs in float32)")
        in_chans = model.stage0.patch_embed.proj.weight.shape[1]
        p = next(model.parameters())
        with torch.device("meta"):  # no init work (and no RNG draws): the weights are loaded next
            fused = cls(model.num_classes, in_chans, model.spec)
        fused = fused.to_empty(device=p.device).to(dtype=p.dtype)
        fused.load_state_dict(model.state_dict())
        for a, b in zip(fused.modules(), model.modules()):
            if isinstance(a, LayerNorm):
                a.eps = b.eps
        return fused.train(model.training)

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

    def kernel_report(self, x: torch.Tensor) -> list[tuple[str, tuple, str]]:
        """(layer, output shape, kernel) of each conv embedding in one forward on x: the
        generated CUTLASS kernel (tile, alignment, split-K) the dispatcher picked, or "aten"
        (CPU, float32/64, a shape no kernel covers, or an input whose channels are not a
        multiple of 8 on CUDA: cuDNN)."""
        report: list = []
        with torch.no_grad():
            self._forward(x, report)
        return report

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
        if conv_embed_can_run(stage.patch_embed, x, weight):  # the image as the caller holds it
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

    def _add_layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm, residual: torch.Tensor | None = None):
        """(LayerNorm(s), s) with s = x + residual (x without one): CvT's LayerNorm, in float32
        for 16-bit inputs; one fused kernel under CUTLASS_OPS_CVT_FUSED_LN=1."""
        if fused_layer_norm_enabled():
            y, s = layer_norm_rows(x, norm.weight, norm.bias, norm.eps, residual)
            return y, (x if s is None else s)
        s = x if residual is None else x + residual
        return layer_norm(s, norm), s

    def _block(self, blk: Block, x: torch.Tensor, h: int, w: int, folds: dict, pending: torch.Tensor | None = None):
        """One transformer block on x + pending (the previous block's last residual branch, not
        yet added): returns (the block's output less its MLP branch, that branch), or (the
        block's output, None) where its Linears add onto the stream (residual_gemms_can_run)."""
        if residual_gemms_can_run(blk, x) and pending is None:
            attn = blk.attn
            if norm1_in_dw_enabled() and fused_layer_norm_enabled():  # norm1 inside the dw kernel (or first)
                o = self._attend_heads(attn, *self._project(attn, x, h, w, folds, norm=blk.norm1))
            else:
                h1, _ = self._add_layer_norm(x, blk.norm1)
                o = self._attend_heads(attn, *self._project(attn, h1, h, w, folds))
            s = linear_residual(o, attn.proj.weight, attn.proj.bias, x)
            h2, _ = self._add_layer_norm(s, blk.norm2)
            return self._mlp_onto(blk.mlp, h2, s), None
        h1, x = self._add_layer_norm(x, blk.norm1, pending)
        a = _drop_path(blk.drop_path, self._attention(blk.attn, h1, h, w, folds))
        h2, x = self._add_layer_norm(x, blk.norm2, a)
        return x, _drop_path(blk.drop_path, self._mlp(blk.mlp, h2))

    def _mlp_onto(self, mlp, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the MLP of h, fc2 adding onto the residual in its epilogue where fc1 and
        its SiLU run as one kernel (_silu_fc1); residual + _mlp(h) otherwise."""
        if silu_mlp_enabled() and not (fused_mlp_enabled() and self._fused_mlp_key(mlp, h) is not None):
            y = self._silu_fc1(mlp, h)
            if y is not None:
                return linear_residual(y, mlp.fc2.weight, mlp.fc2.bias, residual, 1 / QUICK_GELU_SCALE)
        return residual + self._mlp(mlp, h)

    def _mlp(self, mlp, h: torch.Tensor) -> torch.Tensor:
        """fc1, QuickGELU, fc2 on the normalized tokens: FusedMLP's kernel (opt-in), one SiLU
        (default) or ATen's three passes."""
        key = self._fused_mlp_key(mlp, h) if fused_mlp_enabled() else None
        if key is not None:
            weights, biases = [mlp.fc1.weight, mlp.fc2.weight], [mlp.fc1.bias, mlp.fc2.bias]
            save = torch.is_grad_enabled() and (h.requires_grad or any(t.requires_grad for t in weights))
            y, _ = torch.ops.cutlass_ops.fused_mlp(h.reshape(-1, h.shape[-1]), weights, biases, key, save)
            return y.reshape(*h.shape[:-1], y.shape[-1])
        if silu_mlp_enabled():
            return self._silu_mlp(mlp, h)
        y = mlp.drop(quick_gelu(linear(h, mlp.fc1.weight, mlp.fc1.bias)))
        return mlp.drop(linear(y, mlp.fc2.weight, mlp.fc2.bias))

    def _register_fused_mlps(self) -> None:
        """Each block MLP FusedMLP can take (fc1, QuickGELU, fc2, no wider than 256: stage 1's)
        gets its kernel key as ``_fused_mlp_key`` (None for the others), traced once per shape
        here rather than in the forward, which torch.compile then traces without a break."""
        from cutlass_ops_gen.mlp import trace_mlp
        from .mlp import register_spec
        keys: dict = {}
        for stage in self.stages():
            for blk in stage.blocks:
                fc1, fc2 = blk.mlp.fc1, blk.mlp.fc2
                shape = (fc1.in_features, fc1.out_features, fc2.out_features, fc1.bias is not None, fc2.bias is not None)
                if max(shape[:3]) > 256:
                    blk.mlp._fused_mlp_key = None
                    continue
                if shape not in keys:
                    with torch.random.fork_rng(devices=[]):  # the Linears' init must not move the caller's RNG
                        model = nn.Sequential(nn.Linear(shape[0], shape[1], bias=shape[3]), QuickGELU(),
                                              nn.Linear(shape[1], shape[2], bias=shape[4]))
                    keys[shape] = register_spec(trace_mlp(model, None))
                blk.mlp._fused_mlp_key = keys[shape]

    def _fused_mlp_key(self, mlp, h: torch.Tensor) -> str | None:
        """The MLP's FusedMLP kernel key (_register_fused_mlps), or None where FusedMLP does not
        take it: wider than 256, dropout active, or weights of another dtype than h (autocast)."""
        key = getattr(mlp, "_fused_mlp_key", None)
        if key is None or mlp.fc1.weight.dtype != h.dtype or (self.training and mlp.drop.p > 0):
            return None
        return key

    @staticmethod
    def _silu_fc1(mlp, h: torch.Tensor) -> torch.Tensor | None:
        """silu(1.702 fc1(h)) as one kernel (conv2d_fused's SiLU epilogue, opt-in, or
        linear_silu), None where neither runs."""
        if silu_epilogue_can_run(mlp, h):
            return FusedCvT._fc1_silu_epilogue(mlp.fc1, h)
        if linear_silu_can_run(mlp, h):
            return linear_silu(h, mlp.fc1.weight, mlp.fc1.bias, QUICK_GELU_SCALE)
        return None

    @staticmethod
    def _silu_mlp(mlp, h: torch.Tensor) -> torch.Tensor:
        y = FusedCvT._silu_fc1(mlp, h)
        if y is None:
            return FusedCvT._silu_mlp_aten(mlp, h)
        return mlp.drop(linear(mlp.drop(y), mlp.fc2.weight, mlp.fc2.bias, alpha=1 / QUICK_GELU_SCALE))

    @staticmethod
    def _fc1_silu_epilogue(fc1: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        """silu(1.702 (h W1^T + b1)) as one conv2d_fused kernel: fc1 a 1x1 conv over the tokens
        viewed as a map (N, C, L, 1) in NHWC memory (no copy), 1.702 as its scale, 1.702 b1 as
        its bias, SiLU in its epilogue.  Its tiles come from profiles/ where a rule covers these
        1x1 shapes (none committed: the profiler's CvtMlpGemms rows, in
        docs/results/cvt_h200_session13/, would add instances to every build for an opt-in
        path), else from the occupancy heuristic."""
        n, length, c = h.shape
        tokens_map = h.reshape(n, length, 1, c).permute(0, 3, 1, 2)
        weight = fc1.weight.view(fc1.out_features, c, 1, 1)
        bias = fc1.bias.float() * QUICK_GELU_SCALE if fc1.bias is not None else None
        # (a cached device scalar, but a fresh one while torch.compile traces: a traced tensor
        # must not outlive the trace)
        scale = QUICK_GELU_SCALE if torch.compiler.is_compiling() else _constant(QUICK_GELU_SCALE, h.device)
        y = conv2d_fused(tokens_map, weight, bias, scale=scale, silu=True)
        return y.permute(0, 2, 3, 1).reshape(n, length, fc1.out_features)

    @staticmethod
    def _silu_mlp_aten(mlp, h: torch.Tensor) -> torch.Tensor:
        """fc2(QuickGELU(fc1(h))) with one SiLU: z σ(1.702 z) = silu(1.702 z) / 1.702, the two
        scales as the GEMMs' alpha (cuBLAS applies alpha in float32 before rounding, and keeps
        its bias epilogue, which needs beta = 1), so only fc1's bias is scaled by a tensor op:
        fc1 -> addmm(1.702 b1, h, W1^T, alpha=1.702), SiLU, addmm(b2, ., W2^T, alpha=1/1.702).
        No weight is folded, so nothing is recomputed per call (a CUDA graph replays one small
        kernel per block, not the fold's nine)."""
        fc1, fc2 = mlp.fc1, mlp.fc2
        b1 = fc1.bias * QUICK_GELU_SCALE if fc1.bias is not None else None
        y = mlp.drop(F.silu(linear(h, fc1.weight, b1, alpha=QUICK_GELU_SCALE)))
        return mlp.drop(linear(y, fc2.weight, fc2.bias, alpha=1 / QUICK_GELU_SCALE))

    def _dw_bn(self, proj: nn.Sequential, m: torch.Tensor, folds: dict, bias_apart: bool = False):
        """Depthwise conv + BatchNorm on an NHWC map (N, C, H, W) -> (tokens (N, H'*W', C), c):
        with bias_apart in eval mode the tokens lack the folded bias c (dw_bias_in_linear_enabled),
        else c is None and the tokens are whole."""
        conv, bn = proj.conv, proj.bn
        bias = None
        if bn.training or bn.running_mean is None:
            y = bn(F.conv2d(m, conv.weight, None, conv.stride, conv.padding, conv.dilation, conv.groups))
        else:  # eval: BatchNorm folded into the conv's weight and a bias
            wt, bias = folds[id(proj)] if id(proj) in folds else self._folded_dw_bn(proj)
            y = F.conv2d(m, wt, None if bias_apart else bias, conv.stride, conv.padding, conv.dilation, conv.groups)
        return y.flatten(2).transpose(1, 2), (bias if bias_apart else None)

    def _eval_folds(self) -> dict:
        """The eval-mode BatchNorm folds of all dw_bn projections at once, {id(proj): (weight,
        bias)}, the same arithmetic as _folded_dw_bn on the projections' tensors concatenated:
        20 ops instead of 14 per projection (39 in CvT-13: 546; in the H100 run's graphed
        forward, 573 kernels under 3.5 us took 1.0 ms of the 9.93, most of them these), which
        matters where the fold cannot be cached (a CUDA graph, autograd, torch.compile).  Also,
        for each attention whose q, k, v were folded side by side, {id(attn): (their weights as
        one (3, C, 1, 3, 3) view, their biases as one (3, C) view)}: dw_conv3x3_tokens's
        arguments, and the three biases the cls row loses in one subtraction.  Cached like each
        projection's fold.  {} where the projections' dtypes or eps differ (or none is in eval
        mode): _dw_bn then folds each on its own."""
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

    def _attention(self, attn, x: torch.Tensor, h: int, w: int, folds: dict) -> torch.Tensor:
        return self._attend(attn, *self._project(attn, x, h, w, folds))

    def _project(self, attn, x: torch.Tensor, h: int, w: int, folds: dict, norm: LayerNorm | None = None):
        """The convolutional projection: dw_bn q/k/v on the token map (the cls token, stage 3,
        beside them), then the q/k/v Linears, split into heads (N, heads, L, d); with ``norm``
        on norm(x), inside the dw kernel where it runs (layer_norm_dw_conv3x3_tokens)."""
        projs = (attn.conv_proj_q, attn.conv_proj_k, attn.conv_proj_v)
        dw_kernel = dw_tokens_enabled() and not torch.is_grad_enabled() and all(_dw_tokens_can_run(p) for p in projs)
        if norm is not None and not dw_kernel:
            x, _ = self._add_layer_norm(x, norm)
            norm = None
        n, t, c = x.shape
        if attn.with_cls_token:
            cls_token, x = torch.split(x, [1, h * w], 1)
        if dw_kernel:
            # one kernel for the three: the folded convs and biases, the cls token written in front
            lead = cls_token.to(x.dtype) if attn.with_cls_token else None
            if id(attn) in folds:
                wt, bias = folds[id(attn)]
            else:
                wt, bias = (torch.stack(t) for t in zip(*(folds[id(p)] if id(p) in folds else self._folded_dw_bn(p)
                                                          for p in projs)))
            strides = [p.conv.stride[0] for p in projs]
            if norm is not None:
                convs = layer_norm_dw_conv3x3_tokens(x, h, w, norm.weight, norm.bias, norm.eps, wt, bias, strides, lead)
            else:
                convs = dw_conv3x3_tokens(x, h, w, wt, bias, strides, lead)
            parts = [(z, None) for z in convs]
        elif dw_tokens_enabled() and x.is_cuda and all(_dw_tokens_train_can_run(p) for p in projs):
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
                # would copy it, and each of their backwards again (H200, training step at N=64:
                # 60 copies, 0.72 ms); once here instead
                m = m.contiguous()
            m = m.permute(0, 3, 1, 2)  # NHWC memory, NCHW view
            apart = dw_bias_in_linear_enabled()
            parts = [self._dw_bn(p, m, folds, apart) for p in projs]
            if attn.with_cls_token:  # the cls row less the bias the Linear adds back
                three_c = folds[id(attn)][1] if apart and id(attn) in folds else None  # (3, C): one subtraction
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
            # gave 1.8x the reference's gradient error in bfloat16 (on an AVX512-BF16 EPYC:
            # RMS 0.084 vs 0.046 in test_fused_cvt_bfloat16_cpu; 0.052 this way).
            o = attn.attn_drop(torch.softmax(q @ k.transpose(-2, -1) * attn.scale, dim=-1)) @ v
        return o.transpose(1, 2).reshape(n, o.shape[2], attn.dim)


def _drop_path(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The reference's DropPath (timm 0.3.2's drop path: the same random draw, so the same
    samples dropped) as one ``scale_samples`` multiply by mask / keep_prob per sample, forward
    and backward, where timm's ``x.div(keep_prob) * mask`` is two passes over x each way (H200,
    N=64 training step: 36 such multiplies took 0.43 ms); the product in float32 (float64 for
    float64), rounded once.  On CUDA fp16/bf16 one kernel (kernels/sample_scale), where ATen's
    mixed-dtype broadcast multiply took 0.69 ms for the 36 on an H100.  DropPath modules other
    than the reference's run as they are."""
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
    a slice with a batch stride of 197 rows, not 196: BatchNorm's backward then takes ATen's
    generic-layout kernels (H200, training step at N=64: 1.92 ms for stage 3's 30, where the
    channels-last kernels take ~0.4) and the conv's backward copies it; one copy here instead."""

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


__all__ = ["FusedCvT"]
