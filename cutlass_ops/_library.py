"""Loads the compiled op library (libcutlass_ops_C.so) that the build installs here, after
checking that it can work in this process: torch at least the version whose stable ABI it
uses (it loads into every later torch), the CUDA major version of that torch and of the
driver (the library links the CUDA runtime of its toolkit) and, per visible GPU, whether it
holds machine code or PTX that the GPU can run."""
from __future__ import annotations

import ctypes
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


def _release(version: str) -> tuple[int, ...]:
    """(2, 11) of "2.11.0+cu130"."""
    return tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())


def torch_mismatch(info: dict, running: str) -> str | None:
    """Why a library with these build facts cannot load into torch `running` (None: it can).
    A stable-ABI library (torch_abi "stable") loads into its minimum torch (torch_min) and
    every later one; a library of torch's C++ ABI (older builds) only into the minor version
    it was built against."""
    built, torch_min = info.get("torch", ""), info.get("torch_min", "")
    if info.get("torch_abi") == "stable" and torch_min:
        if _release(running) >= _release(torch_min):
            return None
        return (f"cutlass_ops needs torch >= {torch_min} but this is torch {running}: its op library uses "
                f"LibTorch's stable ABI as of torch {torch_min} (built against torch {built}). Upgrade "
                f"torch (`pip install 'torch>={torch_min}'`).")
    if not built or _release(built) == _release(running):
        return None
    minor = ".".join(map(str, _release(running)))
    return (f"cutlass_ops was built against torch {built} and cannot load into torch {running}: its op "
            f"library uses torch's C++ ABI, which changes between torch minor versions. Install the "
            f"cutlass_ops wheel built for torch {minor}, or rebuild against this torch "
            f"(`pip install --no-build-isolation .`).")


def _cuda_major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def cuda_mismatch(built_cuda: str, torch_cuda: str | None) -> str | None:
    """Why a library built with CUDA `built_cuda` (e.g. "13.0.88"; "" for a CPU-only build)
    cannot load into a torch built for CUDA `torch_cuda` (torch.version.cuda; None: a CPU-only
    torch).  None: it can.  The library links its toolkit's CUDA runtime (libcudart.so.<major>),
    which torch's CUDA build of the same major version provides."""
    built = _cuda_major(built_cuda) if built_cuda else None
    if built is None:
        return None
    if torch_cuda is None:
        return (f"cutlass_ops was built with CUDA {built_cuda} but this torch ({torch.__version__}) is a "
                f"CPU-only build: install torch's CUDA {built} build (e.g. `pip install torch` from "
                f"https://download.pytorch.org/whl/cu{built}0), or build cutlass_ops without CUDA "
                f"(CUTLASS_OPS_CUDA=OFF).")
    if _cuda_major(torch_cuda) != built:
        return (f"cutlass_ops was built with CUDA {built_cuda} but this torch ({torch.__version__}) is built "
                f"for CUDA {torch_cuda}: the op library needs the CUDA {built} runtime. Install the "
                f"cutlass_ops wheel built with CUDA {_cuda_major(torch_cuda)}, or rebuild against this torch.")
    return None


def old_driver(built_cuda: str, driver_version: int | None) -> str | None:
    """Why a driver that supports CUDA `driver_version` (the driver API's number, e.g. 12080 for
    12.8; None or 0: no driver) cannot run a library built with CUDA `built_cuda`.  None: it
    can.  A CUDA X.y runtime runs on any driver for X.0 or newer (minor-version compatibility),
    not on an older major version."""
    built = _cuda_major(built_cuda) if built_cuda else None
    if built is None or not driver_version:
        return None
    driver_major, driver_minor = driver_version // 1000, (driver_version % 1000) // 10
    if driver_major >= built:
        return None
    return (f"cutlass_ops was built with CUDA {built_cuda}, which needs a driver for CUDA {built}.0 or "
            f"newer; this machine's driver supports CUDA {driver_major}.{driver_minor}. Update the NVIDIA "
            f"driver, or install a cutlass_ops (and torch) built for CUDA {driver_major}.")


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
            f"--no-build-isolation . (sm70 needs a CUDA 12.x toolkit: CUDA 13 dropped it).")


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


def driver_version() -> int | None:
    """The CUDA version the installed driver supports (cuDriverGetVersion, e.g. 13000 for 13.0;
    torch has no API for it), None without a driver (libcuda.so.1 absent)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    return version.value if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 else None


_mismatch = (torch_mismatch(build_info(), torch.__version__)
             or cuda_mismatch(build_info().get("cuda", ""), torch.version.cuda))
if _mismatch:
    raise ImportError(_mismatch)
_old_driver = old_driver(build_info().get("cuda", ""), driver_version())
if _old_driver:
    # torch itself may still import (its CPU ops work): say why the CUDA ops will not.
    warnings.warn(_old_driver, RuntimeWarning, stacklevel=2)
torch.ops.load_library(str(_find_library()))
for _why in unsupported_gpus().values():
    warnings.warn(_why, RuntimeWarning, stacklevel=2)


def cuda_kernels_built() -> bool:
    """True if the library holds CUDA kernels (False for a CPU-only build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_ops::conv2d_fused", "CUDA")
