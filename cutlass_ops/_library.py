"""Loads the compiled op library (libcutlass_ops_C.so) that the build installs here."""
from __future__ import annotations

import json
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


torch.ops.load_library(str(_find_library()))


def build_info() -> dict:
    """Archs, kernel set, CUDA and torch versions the library was built with."""
    path = _HERE / "build_info.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cuda_kernels_built() -> bool:
    """True if the library holds CUDA kernels (False for a CPU-only build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_ops::conv2d_fused", "CUDA")
