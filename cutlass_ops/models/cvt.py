"""CvT (Convolutional Vision Transformer, Wu et al. 2021) in plain PyTorch: the reference
that ``cutlass_ops.FusedCvT`` is checked against and loads its weights from.

Our own code, written from microsoft/CvT ``lib/models/cls_cvt.py`` (commit f851e68) and its
CvT-13 config ``experiments/imagenet/cvt/cvt-13-224x224.yaml``, without its timm/einops
dependencies.  Same module tree, so the same state_dict names and shapes
(``stage{0,1,2}.patch_embed.proj.*``, ``stage2.cls_token``,
``stage{i}.blocks.{j}.attn.conv_proj_{q,k,v}.{conv,bn}.*``, ``...attn.proj_{q,k,v}.*``,
``norm.*``, ``head.*``, ...), the same initialisation, consumed from the RNG in the same
order (a model built after ``torch.manual_seed(s)`` equals the original's built after the same
seed: ``tests/python/test_cvt_reference.py`` checks it), and the same forward, except:

- ``LayerNorm``: the original casts the input to float32 ("to handle fp16") and then
  cannot run a float64 model (float32 input, float64 weight); here 16-bit inputs run in
  float32 as there, float32/float64 inputs in their own dtype, and the weights are cast with
  the input (so a ``.half()`` model works too).
- The head: the original squeezes the normalised cls token with ``torch.squeeze(x)``, which
  for a batch of 1 also drops the batch dimension (output shape (1000,)); here
  ``squeeze(1)``: always (N, num_classes).

CvT-13 (``cvt13()``): three stages, embed dims 64/192/384, heads 1/3/6, depths 1/2/10, MLP
ratio 4, QuickGELU ``x * sigmoid(1.702 x)`` (``get_cls_model`` passes it), LayerNorm eps
1e-5.  Each stage: a conv embedding (7x7/4 pad 2, then 3x3/2 pad 1 twice, with bias) and a
LayerNorm over channels, then transformer blocks whose q/k/v come from "dw_bn"
projections: a depthwise 3x3 conv without bias (stride 1 for q, 2 for k and v, padding 1),
BatchNorm2d, flattened to tokens, then a Linear with bias (qkv_bias).  The attention scale
is ``dim_out ** -0.5``, the whole embed dim, not the head dim (as the original).  Stage 3
has a cls token: it bypasses the conv projections and is concatenated in front of q, k and
v after them.  The head: LayerNorm of the cls token, Linear(384, 1000).  Drop path 0.1 in
stage 3 (linearly from 0 over its 10 blocks, timm 0.3.2's ``drop_path``), dropout 0.
CvT-21 (``cvt21()``) and CvT-W24 (``cvtw24()``): the same with other depths and widths
(their yaml files beside CvT-13's).  Hugging Face checkpoints: ``cvt_hf.py``.
"""
from __future__ import annotations

from collections import OrderedDict
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .cvt_specs import CVT13_SPEC, CVT21_SPEC, CVTW24_SPEC, cvt_flops  # the specs live there; same names here


def trunc_normal_(tensor: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """timm's trunc_normal_(t, std=std): bounds -2..2 absolute (not in units of std)."""
    return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0, b=2.0)


def drop_path_mask(x: torch.Tensor, keep_prob: float) -> torch.Tensor:
    """The per-sample keep mask (N, 1, ...) of 0s and 1s in x's dtype, drawn as timm 0.3.2 (CvT's
    pinned version) draws it: floor(keep_prob + U[0, 1))."""
    mask = keep_prob + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device)
    return mask.floor_()


def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
    """Stochastic depth per sample, as timm 0.3.2 (CvT's pinned version) computes it."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    return x.div(keep_prob) * drop_path_mask(x, keep_prob)


class DropPath(nn.Module):
    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """CvT's LayerNorm: 16-bit inputs normalised in float32, the result in the input dtype."""
    if x.dtype in (torch.float16, torch.bfloat16):
        w = norm.weight.float() if norm.weight is not None else None
        b = norm.bias.float() if norm.bias is not None else None
        return F.layer_norm(x.float(), norm.normalized_shape, w, b, norm.eps).to(x.dtype)
    w = norm.weight.to(x.dtype) if norm.weight is not None else None
    b = norm.bias.to(x.dtype) if norm.bias is not None else None
    return F.layer_norm(x, norm.normalized_shape, w, b, norm.eps)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computing in float32 for 16-bit inputs (CvT's subclass, see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quick_gelu(x)


class MapToTokens(nn.Module):
    """einops ``Rearrange('b c h w -> b (h w) c')``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2).transpose(1, 2)


def tokens_to_map(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``rearrange(x, 'b (h w) c -> b c h w')``."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``rearrange(x, 'b t (h d) -> b h t d')``."""
    b, t, c = x.shape
    return x.reshape(b, t, heads, c // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``rearrange(x, 'b h t d -> b t (h d)')``."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        x = self.drop(self.act(self.fc1(x)))
        return self.drop(self.fc2(x))


class Attention(nn.Module):
    def __init__(self, dim_in, dim_out, num_heads, qkv_bias=False, attn_drop=0.0, proj_drop=0.0,
                 method="dw_bn", kernel_size=3, stride_kv=1, stride_q=1, padding_kv=1, padding_q=1,
                 with_cls_token=True, **kwargs):
        super().__init__()
        if method != "dw_bn":
            # the original also has 'avg' (AvgPool2d k/v, linear q) and 'linear'; no CvT
            # config uses them and FusedCvT does not implement them
            raise ValueError(f"CvT Attention: only the 'dw_bn' projection is implemented, got {method!r}")
        self.stride_kv = stride_kv
        self.stride_q = stride_q
        self.dim = dim_out
        self.num_heads = num_heads
        self.scale = dim_out ** -0.5  # the whole dim, as the original (not the head dim)
        self.with_cls_token = with_cls_token
        self.conv_proj_q = self._build_projection(dim_in, kernel_size, padding_q, stride_q)
        self.conv_proj_k = self._build_projection(dim_in, kernel_size, padding_kv, stride_kv)
        self.conv_proj_v = self._build_projection(dim_in, kernel_size, padding_kv, stride_kv)
        self.proj_q = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.proj_k = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.proj_v = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim_out, dim_out)
        self.proj_drop = nn.Dropout(proj_drop)

    @staticmethod
    def _build_projection(dim_in, kernel_size, padding, stride):
        return nn.Sequential(OrderedDict([
            ("conv", nn.Conv2d(dim_in, dim_in, kernel_size=kernel_size, padding=padding, stride=stride,
                               bias=False, groups=dim_in)),
            ("bn", nn.BatchNorm2d(dim_in)),
            ("rearrage", MapToTokens()),  # (sic: the original's name)
        ]))

    def forward_conv(self, x, h, w):
        if self.with_cls_token:
            cls_token, x = torch.split(x, [1, h * w], 1)
        x = tokens_to_map(x, h, w)
        q, k, v = self.conv_proj_q(x), self.conv_proj_k(x), self.conv_proj_v(x)
        if self.with_cls_token:
            q = torch.cat((cls_token, q), dim=1)
            k = torch.cat((cls_token, k), dim=1)
            v = torch.cat((cls_token, v), dim=1)
        return q, k, v

    def forward(self, x, h, w):
        q, k, v = self.forward_conv(x, h, w)
        q = split_heads(self.proj_q(q), self.num_heads)
        k = split_heads(self.proj_k(k), self.num_heads)
        v = split_heads(self.proj_v(v), self.num_heads)
        attn = F.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        attn = self.attn_drop(attn)
        x = merge_heads(torch.matmul(attn, v))
        return self.proj_drop(self.proj(x))


class Block(nn.Module):
    def __init__(self, dim_in, dim_out, num_heads, mlp_ratio=4.0, qkv_bias=False, drop=0.0, attn_drop=0.0,
                 drop_path=0.0, act_layer=nn.GELU, norm_layer=nn.LayerNorm, **kwargs):
        super().__init__()
        self.with_cls_token = kwargs["with_cls_token"]
        self.norm1 = norm_layer(dim_in)
        self.attn = Attention(dim_in, dim_out, num_heads, qkv_bias, attn_drop, drop, **kwargs)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim_out)
        self.mlp = Mlp(in_features=dim_out, hidden_features=int(dim_out * mlp_ratio), act_layer=act_layer,
                       drop=drop)

    def forward(self, x, h, w):
        x = x + self.drop_path(self.attn(self.norm1(x), h, w))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvEmbed(nn.Module):
    """Conv2d (with bias) then LayerNorm over channels; NCHW in and out."""

    def __init__(self, patch_size=7, in_chans=3, embed_dim=64, stride=4, padding=2, norm_layer=None):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=stride, padding=padding)
        self.norm = norm_layer(embed_dim) if norm_layer else None

    def forward(self, x):
        x = self.proj(x)
        _, _, h, w = x.shape
        x = MapToTokens()(x)
        if self.norm:
            x = self.norm(x)
        return tokens_to_map(x, h, w)


class VisionTransformer(nn.Module):
    """One CvT stage: conv embedding, optional cls token, blocks; returns (NCHW map, cls tokens)."""

    def __init__(self, patch_size=16, patch_stride=16, patch_padding=0, in_chans=3, embed_dim=768, depth=12,
                 num_heads=12, mlp_ratio=4.0, qkv_bias=False, drop_rate=0.0, attn_drop_rate=0.0,
                 drop_path_rate=0.0, act_layer=nn.GELU, norm_layer=nn.LayerNorm, init="trunc_norm", **kwargs):
        super().__init__()
        self.num_features = self.embed_dim = embed_dim
        self.rearrage = None
        self.patch_embed = ConvEmbed(patch_size=patch_size, in_chans=in_chans, stride=patch_stride,
                                     padding=patch_padding, embed_dim=embed_dim, norm_layer=norm_layer)
        if kwargs["with_cls_token"]:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        else:
            self.cls_token = None
        self.pos_drop = nn.Dropout(p=drop_rate)
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth, device="cpu")]
        self.blocks = nn.ModuleList([
            Block(dim_in=embed_dim, dim_out=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                  drop=drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[j], act_layer=act_layer,
                  norm_layer=norm_layer, **kwargs)
            for j in range(depth)])
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights_xavier if init == "xavier" else self._init_weights_trunc_normal)

    @staticmethod
    def _init_weights_trunc_normal(m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    @staticmethod
    def _init_weights_xavier(m):
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)

    def forward(self, x):
        x = self.patch_embed(x)
        b, _, h, w = x.shape
        x = MapToTokens()(x)
        cls_tokens = None
        if self.cls_token is not None:
            cls_tokens = self.cls_token.expand(b, -1, -1)
            x = torch.cat((cls_tokens, x), dim=1)
        x = self.pos_drop(x)
        for blk in self.blocks:
            x = blk(x, h, w)
        if self.cls_token is not None:
            cls_tokens, x = torch.split(x, [1, h * w], 1)
        return tokens_to_map(x, h, w), cls_tokens


class ConvolutionalVisionTransformer(nn.Module):
    def __init__(self, in_chans=3, num_classes=1000, act_layer=nn.GELU, norm_layer=nn.LayerNorm,
                 init="trunc_norm", spec=None):
        super().__init__()
        self.num_classes = num_classes
        self.num_stages = spec["NUM_STAGES"]
        self.spec = dict(spec)
        for i in range(self.num_stages):
            kwargs = {
                "patch_size": spec["PATCH_SIZE"][i], "patch_stride": spec["PATCH_STRIDE"][i],
                "patch_padding": spec["PATCH_PADDING"][i], "embed_dim": spec["DIM_EMBED"][i],
                "depth": spec["DEPTH"][i], "num_heads": spec["NUM_HEADS"][i], "mlp_ratio": spec["MLP_RATIO"][i],
                "qkv_bias": spec["QKV_BIAS"][i], "drop_rate": spec["DROP_RATE"][i],
                "attn_drop_rate": spec["ATTN_DROP_RATE"][i], "drop_path_rate": spec["DROP_PATH_RATE"][i],
                "with_cls_token": spec["CLS_TOKEN"][i], "method": spec["QKV_PROJ_METHOD"][i],
                "kernel_size": spec["KERNEL_QKV"][i], "padding_q": spec["PADDING_Q"][i],
                "padding_kv": spec["PADDING_KV"][i], "stride_kv": spec["STRIDE_KV"][i],
                "stride_q": spec["STRIDE_Q"][i],
            }
            setattr(self, f"stage{i}", VisionTransformer(in_chans=in_chans, init=init, act_layer=act_layer,
                                                         norm_layer=norm_layer, **kwargs))
            in_chans = spec["DIM_EMBED"][i]
        dim_embed = spec["DIM_EMBED"][-1]
        self.norm = norm_layer(dim_embed)
        self.cls_token = spec["CLS_TOKEN"][-1]
        self.head = nn.Linear(dim_embed, num_classes) if num_classes > 0 else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02)

    def stages(self) -> list[VisionTransformer]:
        return [getattr(self, f"stage{i}") for i in range(self.num_stages)]

    def forward_features(self, x):
        cls_tokens = None
        for stage in self.stages():
            x, cls_tokens = stage(x)
        if self.cls_token:
            return self.norm(cls_tokens).squeeze(1)  # the original: torch.squeeze (see the module doc)
        return torch.mean(self.norm(x.flatten(2).transpose(1, 2)), dim=1)

    def forward(self, x):
        return self.head(self.forward_features(x))


def _cvt(spec: dict, num_classes: int, in_chans: int, drop_path_rate: float | None, init: str):
    spec = dict(spec)
    if drop_path_rate is not None:
        spec["DROP_PATH_RATE"] = [0.0] * (spec["NUM_STAGES"] - 1) + [float(drop_path_rate)]
    return ConvolutionalVisionTransformer(in_chans=in_chans, num_classes=num_classes, act_layer=QuickGELU,
                                          norm_layer=partial(LayerNorm, eps=1e-5), init=init, spec=spec)


def cvt13(num_classes: int = 1000, in_chans: int = 3, drop_path_rate: float | None = None,
          init: str = "trunc_norm") -> ConvolutionalVisionTransformer:
    """CvT-13 as ``get_cls_model`` builds it from cvt-13-224x224.yaml (QuickGELU, LayerNorm
    eps 1e-5).  ``drop_path_rate``: stage 3's (default the config's 0.1; 0 for deterministic
    training)."""
    return _cvt(CVT13_SPEC, num_classes, in_chans, drop_path_rate, init)


def cvt21(num_classes: int = 1000, in_chans: int = 3, drop_path_rate: float | None = None,
          init: str = "trunc_norm") -> ConvolutionalVisionTransformer:
    """CvT-21 (cvt-21-*.yaml): as ``cvt13`` with depths 1/4/16."""
    return _cvt(CVT21_SPEC, num_classes, in_chans, drop_path_rate, init)


def cvtw24(num_classes: int = 1000, in_chans: int = 3, drop_path_rate: float | None = None,
           init: str = "trunc_norm") -> ConvolutionalVisionTransformer:
    """CvT-W24 (cvt-w24-384x384.yaml): dims 192/768/1024, heads 3/12/16, depths 2/2/20, stage
    3's drop path 0.3."""
    return _cvt(CVTW24_SPEC, num_classes, in_chans, drop_path_rate, init)


__all__ = ["CVT13_SPEC", "CVT21_SPEC", "CVTW24_SPEC", "ConvolutionalVisionTransformer", "VisionTransformer", "Block",
           "Attention", "Mlp", "ConvEmbed", "LayerNorm", "QuickGELU", "DropPath", "cvt13", "cvt21", "cvtw24",
           "cvt_flops", "drop_path", "drop_path_mask", "layer_norm", "quick_gelu"]
