"""Helpers the op families share: argument normalization, device checks, the dtypes of the
backward's arithmetic, the shapes and dtypes autograd hands gradients back in, and the
checks behind each wrapper's path report (cutlass_ops/paths.py)."""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import _library  # noqa: F401  (loads the op library)
from .. import paths


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


# ---- which path a CUDA call takes (paths.py): the C++ ops' own conditions, read on the host ----

_INT32_MAX = 2 ** 31 - 1
_HALF = (torch.float16, torch.bfloat16)
_CAPABILITY: dict[int, int] = {}


def _capability(t: torch.Tensor) -> int:
    """The compute capability of t's GPU as 10 * major + minor (cached per device)."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    cc = _CAPABILITY.get(index)
    if cc is None:
        major, minor = torch.cuda.get_device_capability(index)
        cc = _CAPABILITY[index] = 10 * major + minor
    return cc


def _aligned16(t: Optional[torch.Tensor], memory_format=torch.contiguous_format) -> bool:
    """Whether t, made contiguous in ``memory_format`` as the C++ op makes it (a copy when it
    is not: the allocator's blocks are aligned), starts 16-byte aligned."""
    if t is None or not t.is_contiguous(memory_format=memory_format):
        return True
    try:
        return t.data_ptr() % 16 == 0
    except RuntimeError:  # no storage (a functorch wrapper): the op sees the real tensor
        return True


def _dtype_reason(t: torch.Tensor) -> Optional[str]:
    """The reason a kernel that takes float16/bfloat16 does not run t, or None."""
    if t.dtype in _HALF:
        return None
    return f"{str(t.dtype).replace('torch.', '')} input (the kernel takes float16/bfloat16)"


def _sm70_half_reason(t: torch.Tensor, needs: str) -> Optional[str]:
    """The reason kernels of float16/bfloat16 that run on sm70 and newer (bfloat16 from sm80) do
    not run t, or None; `needs` starts the capability reason ("the kernel needs")."""
    why = _dtype_reason(t)
    if why is not None:
        return why
    if t.dtype == torch.bfloat16 and _capability(t) < 80:
        return "bfloat16 needs sm80 or newer"
    if _capability(t) < 70:
        return f"{needs} sm70 or newer"
    return None


def _gemm_why_not(x: torch.Tensor, weight: torch.Tensor):
    """Why a (..., K) x (N, K)^T GEMM kernel of linear_residual / linear_silu does not run (the
    conditions both share: kernels/linear_residual/linear_residual_cuda.cpp,
    kernels/linear_silu/linear_silu_cuda.cpp), None when it may, paths.EMPTY for
    an empty problem."""
    if x.dim() < 1 or weight.dim() != 2:
        return None  # the op's own checks reject it
    k, n = x.shape[-1], weight.shape[0]
    m = x.numel() // k if k else 0
    if m == 0 or n == 0 or k == 0:
        return paths.EMPTY
    why = _dtype_reason(x)
    if why is not None:
        return why
    if k % 8 or n % 8:
        return f"K = {k} and N = {n} must be multiples of 8"
    if max(m, n, k) > _INT32_MAX:
        return "a GEMM dimension over 2^31"
    return None


def _report(op: str, reason: Optional[str], **inputs) -> None:
    """Records the path a CUDA call of ``op`` takes: the kernel (reason None), "empty" (reason
    paths.EMPTY) or a fallback (counted; warns once per reason; raises in strict mode)."""
    if reason is None:
        paths.record(op)
    elif reason == paths.EMPTY:
        paths.record(op, paths.EMPTY)
    else:
        paths.fallback(op, reason, paths.describe(**inputs))


def _report_last_kernel(op: str, last_kernel: str, why_aten, **inputs) -> None:
    """The path report of an op that names the kernel it ran (``*_last_kernel``): "none
    (empty)" is empty; "aten (cuDNN: <why>)" is cuDNN the build's profile chose (or the
    profiler forced), a kernel choice; any other "aten..." a fallback, its reason
    ``why_aten()``; a kernel's name the kernel."""
    if last_kernel.startswith("none"):
        paths.record(op, paths.EMPTY)
    elif last_kernel.startswith("aten") and not last_kernel.startswith("aten (cuDNN:"):
        paths.fallback(op, why_aten(), paths.describe(**inputs))
    else:
        paths.record(op)
