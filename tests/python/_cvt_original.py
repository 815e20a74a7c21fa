"""The ORIGINAL microsoft/CvT model code, for comparison only (never used by the package).

``cvt_original/cls_cvt.py`` is microsoft/CvT's ``lib/models/cls_cvt.py`` byte for byte (commit
f851e681966390779b71380d2600b52360ff4fe1, MIT license: ``cvt_original/LICENSE``), and
``cvt_original/cvt-13-224x224.yaml`` its CvT-13 config.  The file imports ``torch._six``
(gone from torch), einops, timm 0.3.2, scipy and a ``.registry`` module; ``load()`` executes
its text unchanged with small stand-ins for those, written here, independent of
``cutlass_ops.cvt`` (which is what the tests compare against it):

- ``torch._six.container_abcs``: ``collections.abc``;
- ``einops.rearrange`` / ``einops.layers.torch.Rearrange``: the four patterns the file uses
  (any other raises);
- ``timm.models.layers.DropPath`` / ``trunc_normal_``: timm 0.3.2's code (drop_path draws
  ``keep_prob + torch.rand``), and torch's ``trunc_normal_`` (timm's algorithm);
- ``scipy`` (used by pretrained-weight loading only) and ``register_model``: no-ops.

The stand-ins live in ``sys.modules`` only while the file is executed.
"""
from __future__ import annotations

import ast
import collections.abc
import sys
import types
import warnings
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent / "cvt_original"


def _rearrange(x: torch.Tensor, pattern: str, **sizes) -> torch.Tensor:
    pattern = " ".join(pattern.split())
    if pattern == "b c h w -> b (h w) c":
        b, c, h, w = x.shape
        return x.permute(0, 2, 3, 1).reshape(b, h * w, c)
    if pattern == "b (h w) c -> b c h w":
        b, t, c = x.shape
        h, w = sizes["h"], sizes["w"]
        assert t == h * w, (t, h, w)
        return x.reshape(b, h, w, c).permute(0, 3, 1, 2)
    if pattern == "b t (h d) -> b h t d":
        b, t, hd = x.shape
        h = sizes["h"]
        return x.reshape(b, t, h, hd // h).permute(0, 2, 1, 3)
    if pattern == "b h t d -> b t (h d)":
        b, h, t, d = x.shape
        return x.permute(0, 2, 1, 3).reshape(b, t, h * d)
    raise NotImplementedError(f"einops stand-in: pattern {pattern!r} not implemented")


class _Rearrange(nn.Module):
    def __init__(self, pattern: str, **sizes):
        super().__init__()
        self.pattern, self.sizes = pattern, sizes

    def forward(self, x):
        return _rearrange(x, self.pattern, **self.sizes)


def _drop_path(x, drop_prob: float = 0., training: bool = False):  # timm 0.3.2
    if drop_prob == 0. or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)
    random_tensor.floor_()
    return x.div(keep_prob) * random_tensor


class _DropPath(nn.Module):  # timm 0.3.2
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return _drop_path(x, self.drop_prob, self.training)


def _trunc_normal_(tensor, mean=0., std=1., a=-2., b=2.):
    return nn.init.trunc_normal_(tensor, mean, std, a, b)


def _stubs() -> dict:
    mods = {}

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        mods[name] = m
        return m

    mod("torch._six", container_abcs=collections.abc)
    mod("einops", rearrange=_rearrange)
    mod("einops.layers")
    mod("einops.layers.torch", Rearrange=_Rearrange)
    mod("timm")
    mod("timm.models")
    mod("timm.models.layers", DropPath=_DropPath, trunc_normal_=_trunc_normal_)
    mod("scipy")
    pkg = mod("cvt_original")
    pkg.__path__ = []
    mod("cvt_original.registry", register_model=lambda fn: fn)
    return mods


_MODULE = None


def load() -> types.ModuleType:
    """The original cls_cvt module (executed once, cached)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    stubs = _stubs()
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType("cvt_original.cls_cvt")
        module.__package__ = "cvt_original"
        path = HERE / "cls_cvt.py"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # the file's `pretrained_layers[0] is '*'`
            code = compile(path.read_text(), str(path), "exec")
        exec(code, module.__dict__)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    _MODULE = module
    return module


def config_spec() -> dict:
    """MODEL.SPEC of cvt-13-224x224.yaml (its values are Python literals; no yaml needed)."""
    spec, inside = {}, False
    for line in (HERE / "cvt-13-224x224.yaml").read_text().splitlines():
        if line.strip() == "SPEC:":
            inside = True
            continue
        if inside:
            if not line.startswith("    "):
                break
            key, value = line.strip().split(":", 1)
            spec[key] = ast.literal_eval(value.strip())
    return spec


def cvt13_original(num_classes: int = 1000):
    """The original's get_cls_model(config) for the CvT-13 config (no pretrained weights)."""
    m = load()
    config = types.SimpleNamespace(
        MODEL=types.SimpleNamespace(SPEC=config_spec(), NUM_CLASSES=num_classes, INIT_WEIGHTS=False,
                                    PRETRAINED="", PRETRAINED_LAYERS=[]),
        VERBOSE=False)
    return m.get_cls_model(config)
