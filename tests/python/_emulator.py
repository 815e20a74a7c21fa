"""The CPU emulator of the CUDA execution model (tests/cuda_emulator): whether its toolchain is
here, and a harness built into a shared library that a test loads with ctypes."""
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EMU = ROOT / "tests" / "cuda_emulator"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
CXX = shutil.which(os.environ.get("CXX", "g++"))
AVAILABLE = CXX is not None and (CUDA_INCLUDE / "cuda_fp16.h").exists()
MISSING = "needs g++ and the CUDA headers (cuda_fp16.h)"


def build(harness: str, out: Path) -> ctypes.CDLL:
    """tests/cuda_emulator/<harness> (which includes a kernel's device code from kernels/)
    compiled against the emulator's prelude into `out`, loaded."""
    cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", f"-I{CUDA_INCLUDE}", f"-I{ROOT / 'kernels'}",
           f"-I{EMU}", "-include", str(EMU / "cuda_emulate_prelude.h"), "-x", "c++", str(EMU / harness),
           "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return ctypes.CDLL(str(out))
