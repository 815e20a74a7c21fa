"""Hugging Face transformers' CvT (``CvtModel``, ``CvtForImageClassification``: the
microsoft/cvt-13, cvt-21, cvt-w24 ... checkpoints on the Hub) as this project's CvT reference
(``cvt.py``, microsoft/CvT's names), and through it as ``FusedCvT.from_huggingface``.

Written from transformers' ``models/cvt/modeling_cvt.py`` and ``configuration_cvt.py``
(v5.24).  Its network is microsoft/CvT's with other names (``cvt_key_to_hf``), except:

- the MLP activation is ``nn.GELU()`` (exact, erf), where microsoft/CvT's ``get_cls_model``
  passes QuickGELU: the reference built here has ``nn.GELU`` (FusedCvT then runs its MLP
  activation through PyTorch, see docs/fused_cvt.md);
- every LayerNorm is a plain ``nn.LayerNorm(dim)``, eps 1e-5: ``config.layer_norm_eps``
  (1e-12 by default) is read by no module of modeling_cvt.py, so it is ignored here too; given
  a module, each LayerNorm's and BatchNorm's own eps (and BatchNorm momentum) are copied;
- a ``CvtModel`` has neither the final LayerNorm nor the classifier: it loads as a model
  with ``num_classes=0`` and a final LayerNorm of weight 1, bias 0, so its output is the
  normalised cls token (the last stage's mean token without one), before any affine.

The same in both: the attention scale (``embed_dim ** -0.5``, the whole dim), the cls token
(in front of the tokens, beside the conv projections), BatchNorm2d's defaults, the final
LayerNorm over the cls token and the classifier.  Training-only differences, not reproduced
(the reference follows microsoft/CvT): HF gives every layer of a stage the drop path rate
``linspace(0, rate, depth)[stage]`` and drops the MLP branch together with the residual; its
dropouts (``drop_rate``, 0 in every published config) sit after the embedding and not after
the MLP activation.

No transformers import: a state_dict with a dict config loads without it.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from functools import partial

import torch
from torch import nn

from .cvt import ConvolutionalVisionTransformer, LayerNorm

# CvtConfig's fields that shape the network, with its defaults (a dict config may leave any out)
HF_CONFIG_DEFAULTS = {
    "num_channels": 3, "patch_sizes": [7, 3, 3], "patch_stride": [4, 2, 2], "patch_padding": [2, 1, 1],
    "embed_dim": [64, 192, 384], "num_heads": [1, 3, 6], "depth": [1, 2, 10], "mlp_ratio": [4.0, 4.0, 4.0],
    "attention_drop_rate": [0.0, 0.0, 0.0], "drop_rate": [0.0, 0.0, 0.0], "drop_path_rate": [0.0, 0.0, 0.1],
    "qkv_bias": [True, True, True], "cls_token": [False, False, True],
    "qkv_projection_method": ["dw_bn", "dw_bn", "dw_bn"], "kernel_qkv": [3, 3, 3], "padding_kv": [1, 1, 1],
    "stride_kv": [2, 2, 2], "padding_q": [1, 1, 1], "stride_q": [1, 1, 1],
}
# spec key <- config field, one value per stage
_SPEC_FIELDS = {
    "PATCH_SIZE": "patch_sizes", "PATCH_STRIDE": "patch_stride", "PATCH_PADDING": "patch_padding",
    "DIM_EMBED": "embed_dim", "NUM_HEADS": "num_heads", "DEPTH": "depth", "MLP_RATIO": "mlp_ratio",
    "ATTN_DROP_RATE": "attention_drop_rate", "DROP_RATE": "drop_rate", "DROP_PATH_RATE": "drop_path_rate",
    "QKV_BIAS": "qkv_bias", "CLS_TOKEN": "cls_token", "QKV_PROJ_METHOD": "qkv_projection_method",
    "KERNEL_QKV": "kernel_qkv", "PADDING_KV": "padding_kv", "STRIDE_KV": "stride_kv", "PADDING_Q": "padding_q",
    "STRIDE_Q": "stride_q",
}

_QKV = {"q": "query", "k": "key", "v": "value"}
_LAYER = r"^stage(\d+)\.blocks\.(\d+)\."
# our state_dict/module name -> the HF one (without CvtForImageClassification's "cvt." prefix
# on the encoder's names): regex, replacement
_TO_HF = [(re.compile(p), r) for p, r in [
    (r"^stage(\d+)\.cls_token$", r"encoder.stages.\1.cls_token"),
    (r"^stage(\d+)\.patch_embed\.proj\b", r"encoder.stages.\1.embedding.convolution_embeddings.projection"),
    (r"^stage(\d+)\.patch_embed\.norm\b", r"encoder.stages.\1.embedding.convolution_embeddings.normalization"),
    (_LAYER + r"attn\.conv_proj_([qkv])\.(conv|bn)\b",
     lambda m: (f"encoder.stages.{m[1]}.layers.{m[2]}.attention.attention.convolution_projection_{_QKV[m[3]]}"
                ".convolution_projection." + ("convolution" if m[4] == "conv" else "normalization"))),
    (_LAYER + r"attn\.proj_([qkv])\b",
     lambda m: f"encoder.stages.{m[1]}.layers.{m[2]}.attention.attention.projection_{_QKV[m[3]]}"),
    (_LAYER + r"attn\.proj\b", r"encoder.stages.\1.layers.\2.attention.output.dense"),
    (_LAYER + r"mlp\.fc1\b", r"encoder.stages.\1.layers.\2.intermediate.dense"),
    (_LAYER + r"mlp\.fc2\b", r"encoder.stages.\1.layers.\2.output.dense"),
    (_LAYER + r"norm1\b", r"encoder.stages.\1.layers.\2.layernorm_before"),
    (_LAYER + r"norm2\b", r"encoder.stages.\1.layers.\2.layernorm_after"),
    (r"^norm\b", "layernorm"),
    (r"^head\b", "classifier"),
]]


def cvt_key_to_hf(name: str) -> str:
    """Our state_dict (or module) name -> transformers' (without the "cvt." prefix that
    CvtForImageClassification puts before ``encoder.``)."""
    for pattern, repl in _TO_HF:
        out, n = pattern.subn(repl, name, count=1)
        if n:
            return out
    raise KeyError(f"{name}: not a CvT parameter name")


def _strip(key: str) -> str:
    return key[len("cvt."):] if key.startswith("cvt.") else key


def hf_config_dict(config) -> dict:
    """The network's fields of a transformers CvtConfig (or a dict with its field names; a
    field left out takes CvtConfig's default), plus ``num_labels`` where given."""
    if isinstance(config, Mapping):
        given = dict(config)
    elif hasattr(config, "to_dict"):
        given = config.to_dict()
    else:
        raise TypeError(f"CvT config: expected a transformers CvtConfig or a dict, got {type(config).__name__}")
    out = {k: given.get(k, v) for k, v in HF_CONFIG_DEFAULTS.items()}
    if given.get("num_labels") is not None:
        out["num_labels"] = given["num_labels"]
    elif given.get("id2label"):  # CvtConfig.to_dict() holds id2label, not num_labels
        out["num_labels"] = len(given["id2label"])
    return out


def hf_spec(config) -> dict:
    """The spec (``cvt.CVT13_SPEC``'s keys) of a transformers CvtConfig or dict; a ValueError
    naming the field where the lists' lengths disagree or a stage needs what the reference and
    FusedCvT do not implement."""
    c = hf_config_dict(config)
    stages = len(c["depth"])
    spec = {"INIT": "trunc_norm", "NUM_STAGES": stages, "POS_EMBED": [False] * stages}
    for key, field in _SPEC_FIELDS.items():
        value = c[field]
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != stages:
            raise ValueError(f"CvT config: {field} = {value!r} needs one value per stage ({stages}, as depth)")
        spec[key] = list(value)
    for i, method in enumerate(spec["QKV_PROJ_METHOD"]):
        if method != "dw_bn":
            raise ValueError(f"CvT config: qkv_projection_method[{i}] = {method!r}: only 'dw_bn' (depthwise conv + "
                             "BatchNorm, every published CvT) is implemented by the reference and FusedCvT")
    for i, (dim, heads) in enumerate(zip(spec["DIM_EMBED"], spec["NUM_HEADS"])):
        if heads <= 0 or dim % heads:
            raise ValueError(f"CvT config: embed_dim[{i}] = {dim} is not a multiple of num_heads[{i}] = {heads}")
    spec["MLP_RATIO"] = [float(r) for r in spec["MLP_RATIO"]]
    return spec


def hf_state_dict_to_cvt(state_dict: Mapping, config) -> tuple[dict, "OrderedDict[str, torch.Tensor]"]:
    """(spec, state_dict with our names) of a transformers CvtForImageClassification's or
    CvtModel's state_dict and its config (a CvtConfig or a dict of its fields).  ValueError
    naming the key for a key that does not map, a missing one or a shape that disagrees.
    The number of classes is the classifier's rows (0 without a classifier); a CvtModel's
    state_dict gets a final LayerNorm of weight 1, bias 0 (see the module docstring); a
    missing ``num_batches_tracked`` is 0."""
    spec = hf_spec(config)
    given = {_strip(k): v for k, v in state_dict.items()}
    if len(given) != len(state_dict):
        raise ValueError("CvT state_dict: holds both 'cvt.<name>' and '<name>' for some name")
    num_labels = hf_config_dict(config).get("num_labels")
    head = given.get("classifier.weight")
    num_classes = head.shape[0] if head is not None else 0
    if head is not None and num_labels is not None and num_labels != num_classes:
        raise ValueError(f"CvT config: num_labels = {num_labels} but classifier.weight has {num_classes} rows")
    in_chans = hf_config_dict(config)["num_channels"]
    with torch.device("meta"):
        expected = ConvolutionalVisionTransformer(in_chans, num_classes, nn.GELU, partial(LayerNorm, eps=1e-5),
                                                  spec=spec).state_dict()
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    to_ours = {cvt_key_to_hf(k): k for k in expected}
    for k in given:
        if k not in to_ours:
            raise ValueError(f"CvT state_dict: {k!r} has no counterpart in a CvT with depth {spec['DEPTH']}, "
                             f"embed_dim {spec['DIM_EMBED']}, cls_token {spec['CLS_TOKEN']}"
                             + ("" if head is not None else " and no classifier"))
    no_final_norm = "layernorm.weight" not in given and head is None  # a CvtModel
    for hf_key, ours in to_ours.items():
        want = expected[ours]
        if hf_key in given:
            t = given[hf_key]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"CvT state_dict: {hf_key!r} is a {type(t).__name__}, not a tensor")
            if tuple(t.shape) != tuple(want.shape):
                raise ValueError(f"CvT state_dict: {hf_key!r} has shape {tuple(t.shape)}; the config gives "
                                 f"{tuple(want.shape)} ({ours})")
            out[ours] = t
        elif hf_key.endswith("num_batches_tracked"):
            out[ours] = torch.zeros((), dtype=torch.long)
        elif no_final_norm and hf_key in ("layernorm.weight", "layernorm.bias"):
            out[ours] = None  # filled in the checkpoint's dtype below
        else:
            raise ValueError(f"CvT state_dict: {hf_key!r} is missing (the config needs it: {ours})")
    like = next(t for t in out.values() if t is not None and t.is_floating_point())
    for k in ("norm.weight", "norm.bias"):
        if out[k] is None:
            out[k] = (torch.ones if k.endswith("weight") else torch.zeros)(expected[k].shape, dtype=like.dtype,
                                                                           device=like.device)
    return spec, out


def _hf_activation(model: nn.Module):
    """nn.GELU (its approximate) of the HF module's MLPs; ValueError naming a module with another."""
    acts = {}
    for name, m in model.named_modules():
        if name.endswith(".intermediate") and hasattr(m, "activation"):
            a = m.activation
            if type(a) is not nn.GELU:
                raise ValueError(f"{name}.activation is {type(a).__name__}; the CvT reference and FusedCvT run "
                                 "nn.GELU (transformers' CvtIntermediate) or QuickGELU (microsoft/CvT)")
            acts[a.approximate] = name
    if len(acts) > 1:
        raise ValueError(f"the MLPs' GELUs differ ({sorted(acts)}): one activation per model")
    return partial(nn.GELU, approximate=next(iter(acts), "none"))


def cvt_from_huggingface(model_or_state_dict, config=None) -> ConvolutionalVisionTransformer:
    """The reference CvT (``cvt.ConvolutionalVisionTransformer``, nn.GELU, transformers'
    eps) of a transformers CvtForImageClassification / CvtModel (its ``.config``, weights,
    buffers, eps, BatchNorm momentum, dtype, device and mode), or of a state_dict and its
    config (a CvtConfig or a dict of its fields; the state_dict's dtype and device; eval
    mode).  Needs no transformers for a state_dict."""
    if isinstance(model_or_state_dict, nn.Module):
        hf = model_or_state_dict
        config = hf.config if config is None else config
        state_dict, act, training = hf.state_dict(), _hf_activation(hf), hf.training
    elif isinstance(model_or_state_dict, Mapping):
        if config is None:
            raise ValueError("cvt_from_huggingface: a state_dict needs its config (a CvtConfig or a dict)")
        hf, state_dict, act, training = None, model_or_state_dict, partial(nn.GELU), False
    else:
        raise TypeError("cvt_from_huggingface: expected a transformers CvT module or a state_dict, got "
                        f"{type(model_or_state_dict).__name__}")
    spec, ours = hf_state_dict_to_cvt(state_dict, config)
    num_classes = ours["head.weight"].shape[0] if "head.weight" in ours else 0
    like = next(t for t in ours.values() if t.is_floating_point())
    with torch.device("meta"):  # no init work: the weights are loaded next
        ref = ConvolutionalVisionTransformer(hf_config_dict(config)["num_channels"], num_classes, act,
                                             partial(LayerNorm, eps=1e-5), spec=spec)
    ref = ref.to_empty(device=like.device).to(dtype=like.dtype)
    ref.load_state_dict(ours)
    if hf is not None:
        prefix = "cvt." if any(k.startswith("cvt.") for k in state_dict) else ""
        for name, m in ref.named_modules():
            if isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
                theirs = cvt_key_to_hf(name)
                try:
                    src = hf.get_submodule((prefix if theirs.startswith("encoder.") else "") + theirs)
                except AttributeError:  # a CvtModel's missing final LayerNorm
                    continue
                m.eps = src.eps
                if isinstance(m, nn.BatchNorm2d):
                    m.momentum = src.momentum
    return ref.train(training)


__all__ = ["HF_CONFIG_DEFAULTS", "cvt_from_huggingface", "cvt_key_to_hf", "hf_config_dict", "hf_spec",
           "hf_state_dict_to_cvt"]
