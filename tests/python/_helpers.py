"""Shared by the tests: devices to test on, tolerances, error metrics, poisoning."""
import threading

import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from _seeds import seeded  # noqa: F401  (the tests' way to build modules under a fixed seed)

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device (or a CPU-only build)"))]


def fallback(*values, **kwargs):
    """A parameter that means the ATen fallback on CUDA (a dtype or shape no kernel takes): marked
    ``fallback``, so that its cases run outside strict mode (conftest.py) while the others stay
    strict.  Several values for a parametrize of several names; the test id is the one the bare
    values would get."""
    return pytest.param(*values, marks=pytest.mark.fallback, **kwargs)


def fallback_where(values, means_fallback):
    """``values`` as parameters, those for which ``means_fallback(value)`` holds marked with
    ``fallback`` (above)."""
    return [fallback(v) if means_fallback(v) else v for v in values]


# ||out - ref|| / ||ref|| bounds and max-error bounds (relative to max |ref|) per dtype.
TOLERANCE = {torch.float16: (1e-3, 4e-3), torch.bfloat16: (8e-3, 3e-2),
             torch.float32: (1e-5, 1e-4), torch.float64: (1e-12, 1e-11)}


def run_in_threads(fn, count: int = 1) -> None:
    """Runs fn(i) on `count` new threads at once and raises the first error on the caller's."""
    errors_ = []

    def body(i):
        try:
            fn(i)
        except BaseException as e:  # noqa: BLE001  (raised below, on the caller's thread)
            errors_.append(e)
    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors_:
        raise errors_[0]


def errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, max abs error / max |ref|); NaN anywhere gives inf."""
    out = out.detach().double().cpu()
    ref = ref.detach().double().cpu()
    if not torch.isfinite(out).all():
        return float("inf"), float("inf")
    rel = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    mx = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item() if ref.numel() else 0.0
    return rel, mx


def poison_cuda_cache(nbytes: int) -> None:
    """Fill the caching allocator's next free block with NaN so that an output the kernel
    fails to write shows up as NaN instead of as stale, plausible numbers."""
    if torch.cuda.is_available():
        t = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.float16, device="cuda")
        del t


def b2b_reference(x, w0, b0, w1, b1, stride, padding, relu0=True, relu1=True, round_to=None):
    """conv2d_b2b in float64 on the CPU; the first conv's output rounded to `round_to`, as the op
    defines it (None: not rounded)."""
    d = lambda t: None if t is None else t.double().cpu()  # noqa: E731
    y0 = F.conv2d(d(x), d(w0), d(b0), stride, padding)
    if relu0:
        y0 = y0.relu()
    if round_to is not None:
        y0 = y0.to(round_to).double()
    y1 = F.conv2d(y0, d(w1), d(b1))
    return y1.relu() if relu1 else y1
