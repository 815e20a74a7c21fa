"""Loads the compiled op library (libcutlass_ops_C.so) that the build installs here, after
checking that it can work in this process: the torch it was built against (its C++ ABI
changes between torch minor versions) and, per visible GPU, whether it holds machine code
or PTX that the GPU can run."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent


def _find_library() -> Path:
    candidates = sorted(_HERE.glob("libcutlass_ops_C*.so")) + sorted(_HERE.glob("cutlass_ops_C*.pyd"))
    if not candidates:
        raise ImportError(
            f"cutlass_ops: the compiled op library is missing from {_HERE}. Build and install "
            "the package (`pip install --no-build-isolation .`); when running from a source "
            "checkout, make sure the installed package is imported, not the source folder.")
    return candidates[0]


def build_info() -> dict:
    """Archs, kernel set, CUDA and torch versions the library was built with."""
    path = _HERE / "build_info.json"
    return json.loads(path.read_text()) if path.exists() else {}


def torch_mismatch(built: str, running: str) -> str | None:
    """Why a library built against torch `built` cannot load into torch `running` (None: it can).
    torch's C++ ABI holds within a minor version (2.11.x), not across."""
    def minor(version: str) -> tuple:
        return tuple(version.split("+")[0].split(".")[:2])
    if not built or minor(built) == minor(running):
        return None
    return (f"cutlass_ops was built against torch {built} and cannot load into torch {running}: its op "
            f"library uses torch's C++ ABI, which changes between torch minor versions. Install the "
            f"cutlass_ops wheel built for torch {'.'.join(minor(running))}, or rebuild against this torch "
            f"(`pip install --no-build-isolation .`).")


def unsupported_gpu(name: str, capability: tuple[int, int], archs: str) -> str | None:
    """Why a GPU of this compute capability cannot run a library built for `archs` (e.g.
    "80;86;90"; None: it can).  Machine code for sm_XY runs on X.Y..X.9; the PTX of the newest
    arch (the build emits it) is compiled by the driver for any newer GPU."""
    built = sorted(int(a.rstrip("a")) for a in archs.replace(",", ";").split(";") if a.strip())
    if not built:
        return None  # a CPU-only build, or no record: nothing to check
    cc = capability[0] * 10 + capability[1]
    if any(a // 10 == cc // 10 and a <= cc for a in built) or cc >= built[-1]:
        return None
    return (f"cutlass_ops has no kernels for {name} (compute capability {capability[0]}.{capability[1]}, "
            f"sm_{cc}): this build holds machine code for sm_{', sm_'.join(map(str, built))} and PTX "
            f"for sm_{built[-1]} and newer. Build for it: CUTLASS_OPS_ARCHS={cc} pip install "
            f"--no-build-isolation . (sm70 needs a CUDA 11.8/12.x toolkit).")


def unsupported_gpus() -> dict[int, str]:
    """Visible CUDA devices this build cannot run, with the reason (device index -> message)."""
    info = build_info()
    if not info.get("archs") or not torch.cuda.is_available():
        return {}
    out = {}
    for i in range(torch.cuda.device_count()):
        why = unsupported_gpu(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i), info["archs"])
        if why:
            out[i] = why
    return out


_mismatch = torch_mismatch(build_info().get("torch", ""), torch.__version__)
if _mismatch:
    raise ImportError(_mismatch)
torch.ops.load_library(str(_find_library()))
for _why in unsupported_gpus().values():
    warnings.warn(_why, RuntimeWarning, stacklevel=2)


def cuda_kernels_built() -> bool:
    """True if the library holds CUDA kernels (False for a CPU-only build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_ops::conv2d_fused", "CUDA")
