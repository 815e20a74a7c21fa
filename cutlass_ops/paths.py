"""Which path each op took on CUDA, and strict mode.

Most ops run their own kernel only on some inputs (fp16/bf16, channel counts, sizes); on the
others they run an ATen (cuDNN, cuBLAS) composite, which gives the same numbers, slower.  Each
op's wrapper records, for every call on CUDA, which path it took:

    cutlass_ops.last_path("se_gate")        # "kernel", "empty" or "fallback: <reason>"

(per thread: the last call of that op on this thread; ``last_path(op, any_thread=True)``: the
last call on any thread, e.g. a CUDA backward's op, which runs on autograd's thread).  A model
may record its own choices the same way, with "aten: <what ran>" for a PyTorch path that is
not a fallback (no count, no warning, allowed in strict mode): ``last_path("fused_cvt.mlp")``,
FusedCvT's MLP activation (a GELU model's ``F.gelu``).  A fallback also

- counts: ``fallback_counts()[(op, reason)]`` (all threads, this process);
- warns once per distinct (op, reason) per process (a UserWarning naming the op, the reason
  and the input);
- in strict mode raises ``FallbackError`` instead, naming the op, the reason and the input's
  shapes, dtypes and strides.  Strict mode: ``with cutlass_ops.strict(): ...`` (this thread;
  nestable, ``strict(False)`` turns it off inside; ``strict(all_threads=True)``: every
  thread, autograd's backward threads included), default from ``CUTLASS_OPS_STRICT=1`` (read
  once, at import).

CPU tensors are not recorded: the CPU implementation is the CPU path, not a fallback.  A
path the build's profile chose (cuDNN measured faster than our kernel on a problem) is
"kernel": a choice, not a gap.  Nothing is recorded while torch.compile traces (the compiled
graph calls the ops themselves) or for fake/meta tensors.  Recording is host-side only (no
device sync), so CUDA graph capture is unaffected.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Iterator, Optional

import torch

__all__ = ["FallbackError", "describe", "fallback", "fallback_counts", "is_strict", "last_path", "record",
           "recording", "reset", "strict"]

KERNEL = "kernel"
EMPTY = "empty"  # a zero-size problem: nothing to compute, no kernel launched


class FallbackError(RuntimeError):
    """An op fell back to its ATen composite in strict mode."""


def parse_flag(value: Optional[str], name: str = "CUTLASS_OPS_STRICT") -> bool:
    """An on/off environment value: unset, "", 0, false, no, off -> False; 1, true, yes, on ->
    True; anything else a ValueError."""
    v = (value or "").strip().lower()
    if v in ("", "0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name}={value!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def _strict_from_env() -> bool:
    try:
        return parse_flag(os.environ.get("CUTLASS_OPS_STRICT"))
    except ValueError as e:  # an import must not fail on a typo: say so, stay lenient
        warnings.warn(f"cutlass_ops: {e}; strict mode stays off", stacklevel=2)
        return False


_STRICT_DEFAULT = _strict_from_env()
_default = [_STRICT_DEFAULT]  # the threads' default; strict(all_threads=True) sets it for a block
_local = threading.local()
_lock = threading.Lock()
_counts: dict[tuple[str, str], int] = {}
_last_any: dict[str, str] = {}  # op -> its last recorded path on any thread
_warned: set[tuple[str, str]] = set()


def is_strict() -> bool:
    """Whether a fallback raises on this thread (the innermost ``strict()``, else the default)."""
    s = getattr(_local, "strict", None)
    return _default[0] if s is None else s


@contextlib.contextmanager
def strict(enabled: bool = True, all_threads: bool = False) -> Iterator[None]:
    """Within the block, on this thread, any op that falls back raises FallbackError
    (``strict(False)``: warns and counts instead, as outside strict mode).  Nestable; the
    previous setting comes back on exit.

    all_threads: set the default of every thread without a ``strict()`` of its own instead
    (the process's, as CUTLASS_OPS_STRICT sets it), for the block.  Autograd runs a CUDA
    backward on its own threads: ``strict(all_threads=True)`` covers the backward's ops too."""
    if all_threads:
        previous_default = _default[0]
        _default[0] = bool(enabled)
        try:
            yield
        finally:
            _default[0] = previous_default
        return
    previous = getattr(_local, "strict", None)
    _local.strict = bool(enabled)
    try:
        yield
    finally:
        _local.strict = previous


def recording(*tensors: Optional[torch.Tensor]) -> bool:
    """Whether a call with these tensors records its path: the first tensor is a real CUDA
    tensor and torch.compile is not tracing.  Cheap; the wrappers call it first."""
    t = next((t for t in tensors if t is not None), None)
    if t is None or not isinstance(t, torch.Tensor) or t.device.type != "cuda":
        return False
    if torch.compiler.is_compiling() or _is_fake(t):
        return False
    return True


def _is_fake(t: torch.Tensor) -> bool:
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return False
    from torch._subclasses.fake_tensor import FakeTensor  # only for subclasses: rare
    return isinstance(t, FakeTensor)


def record(op: str, path: str = KERNEL) -> None:
    """Records the path of ``op``'s call on this thread ("kernel", "empty", or
    "fallback: <reason>", which ``fallback`` writes)."""
    paths = getattr(_local, "paths", None)
    if paths is None:
        paths = _local.paths = {}
    paths[op] = path
    with _lock:
        _last_any[op] = path


def last_path(op: str, any_thread: bool = False) -> Optional[str]:
    """The path of the last CUDA call of ``op`` on this thread: "kernel" (our kernel, or a
    library path the profile chose), "empty" (nothing to compute), "fallback: <reason>", or
    None when there was none.  any_thread: the last call on any thread of this process
    instead (a CUDA backward's ops run on autograd's threads, not the caller's)."""
    if any_thread:
        with _lock:
            return _last_any.get(op)
    paths = getattr(_local, "paths", None)
    return None if paths is None else paths.get(op)


def describe(**named) -> str:
    """The input of a call, for a fallback's message: each tensor's shape, dtype, strides and
    device, other values as they are; None left out."""
    parts = []
    for name, v in named.items():
        if v is None:
            continue
        if isinstance(v, torch.Tensor):
            parts.append(f"{name} {tuple(v.shape)} {str(v.dtype).replace('torch.', '')} strides {v.stride()} "
                         f"{v.device}")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(t, torch.Tensor) for t in v):
            parts.append(f"{name} [" + ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
                                                 for t in v) + "]")
        else:
            parts.append(f"{name}={v!r}")
    return "; ".join(parts)


def fallback(op: str, reason: str, inputs: str = "") -> None:
    """Records that ``op`` ran its ATen composite instead of its kernel because of ``reason``
    (the input described by ``inputs``, see ``describe``): counts it, then raises
    FallbackError in strict mode, else warns once per distinct (op, reason) per process."""
    key = (op, reason)
    record(op, "fallback: " + reason)
    strict = is_strict()
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1
        # A strict-mode error is not the warning: the first non-strict fallback still warns.
        first = not strict and key not in _warned
        if first:
            _warned.add(key)
    message = f"cutlass_ops.{op}: {reason}; ran the ATen composite instead of the kernel"
    if inputs:
        message += f" (input: {inputs})"
    if strict:
        raise FallbackError(message + " [strict mode: CUTLASS_OPS_STRICT or cutlass_ops.strict()]")
    if first:
        warnings.warn(message + " (warned once per op and reason; cutlass_ops.fallback_counts() counts them)",
                      stacklevel=3)


def fallback_counts() -> dict[tuple[str, str], int]:
    """How many calls fell back, by (op, reason), over all threads of this process."""
    with _lock:
        return dict(_counts)


def reset() -> None:
    """Clears the counts and the warned-once set (the next fallback of each reason warns again)
    and the recorded paths (this thread's, and the any-thread record)."""
    with _lock:
        _counts.clear()
        _warned.clear()
        _last_any.clear()
    _local.paths = {}
