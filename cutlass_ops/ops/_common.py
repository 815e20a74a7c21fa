"""Helpers the op families share: argument normalization, device checks, the dtypes of the
backward's arithmetic, and the shapes and dtypes autograd hands gradients back in."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import _library  # noqa: F401  (loads the op library)


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


def _conv_output_size(input_size, weight_size, stride, padding):
    n, _, h, w = input_size
    k, _, r, s = weight_size
    return n, k, (h + 2 * padding[0] - r) // stride[0] + 1, (w + 2 * padding[1] - s) // stride[1] + 1


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
