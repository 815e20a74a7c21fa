"""FusedMLP's kernel builds: which compiler, the disk cache, the kernels built with the package.

A model's kernel comes, in this order, from:

- the package (``mlp_aot/<key>/fused_mlp.so``): models listed in the build's manifest
  (CUTLASS_OPS_MLP_MODELS, ``cutlass_ops_gen.mlp_aot``), compiled by nvcc when the package was
  built; ``kernel_info()`` says ``compiler: "ahead_of_time"``;
- nvcc: the whole generated source (kernels and ``extern "C"`` host entry points) into a shared
  library, ``<cache>/mlp/<hash>/fused_mlp.so``, keyed by a hash of the source, the arch, nvcc's
  version and the emitter's version;
- NVRTC (``mlp_nvrtc``), where nvcc is not found or ``MlpOptions.compiler`` says so: the device
  code alone into a CUBIN, ``<cache>/mlp/<hash>/fused_mlp.cubin``, keyed by a hash of the
  device source, the arch, NVRTC's version and flags and the emitter's version, launched
  through the CUDA driver API.

``MlpOptions.compiler``: ``auto`` (nvcc where found, else NVRTC), ``nvcc`` or ``nvrtc`` (that
one only).  A compile writes into a temporary folder beside the cache entry and renames it into
place (atomic: processes compiling the same model at once both end with one whole entry).
Nothing here needs a GPU: ``build`` takes the arch and the shared-memory limit.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import mlp_nvrtc
from .options import MlpOptions

from cutlass_ops_gen import mlp_emit

__all__ = ["Build", "build", "cache_dir", "aot_library", "AOT_DIR", "find_nvcc", "choose_compiler"]


def cache_dir(options: Optional[MlpOptions] = None) -> Path:
    """Where compiled kernels go: ``<options.cache_dir>/mlp``, else under the XDG cache."""
    root = (options or MlpOptions()).cache_dir
    if root:
        return Path(root) / "mlp"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "cutlass_ops" / "mlp"


AOT_DIR = Path(__file__).resolve().parent / "mlp_aot"


def aot_library(source: str, arch: str) -> Optional[Path]:
    """The kernel library the package was built with for this exact source and arch
    (cutlass_ops/mlp_aot/<key>/fused_mlp.so, from the build's CUTLASS_OPS_MLP_MODELS), or None."""
    path = AOT_DIR / mlp_emit.aot_key(source, arch) / "fused_mlp.so"
    return path if path.is_file() else None


NVCC_MISSING = ("nvcc (a CUDA toolkit's): put it on PATH or set CUDACXX / CUTLASS_OPS_NVCC (MlpOptions.nvcc) / "
                "CUDA_HOME")


def find_nvcc(options: MlpOptions) -> str:
    for cand in (options.nvcc, os.environ.get("CUDACXX"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError(f"FusedMLP compiles its kernel at first use, here with nvcc (MlpOptions.compiler="
                       f"{options.compiler!r}), and found none. {NVCC_MISSING}")


_NVCC_VERSION: dict[str, str] = {}


def nvcc_version(nvcc: str) -> str:
    if nvcc not in _NVCC_VERSION:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        _NVCC_VERSION[nvcc] = out.strip().splitlines()[-1]
    return _NVCC_VERSION[nvcc]


def choose_compiler(options: MlpOptions):
    """("nvcc", its path) or ("nvrtc", an mlp_nvrtc.Nvrtc), as ``options.compiler`` asks."""
    if options.compiler != "nvrtc":
        try:
            return "nvcc", find_nvcc(options)
        except RuntimeError:
            if options.compiler == "nvcc":
                raise
    nvrtc = mlp_nvrtc.find_nvrtc()
    if nvrtc is not None:
        return "nvrtc", nvrtc
    if options.compiler == "nvrtc":
        raise RuntimeError("FusedMLP compiles its kernel at first use, here with NVRTC (MlpOptions.compiler="
                           f"'nvrtc'), and found no libnvrtc. {mlp_nvrtc.MISSING}.")
    raise RuntimeError("FusedMLP compiles a model's kernel at first use, with nvcc or NVRTC, and found neither; "
                       f"either one will do. {NVCC_MISSING}. {mlp_nvrtc.MISSING}.  (Models built into the "
                       "package ahead of time, CUTLASS_OPS_MLP_MODELS, need neither.)")


@dataclass
class Build:
    """A model kernel on disk: which compiler built it, where, whether the cache had it."""
    compiler: str                 # "nvcc", "nvrtc" or "ahead_of_time" (nvcc, with the package)
    path: Path                    # fused_mlp.so (nvcc, ahead of time) or fused_mlp.cubin (nvrtc)
    hash: str
    cache_hit: bool
    compile_seconds: Optional[float]
    compiler_version: Optional[str]
    config: "mlp_emit.Config"

    @property
    def dir(self) -> Path:
        return self.path.parent


def _ident(source: str, arch: str, compiler: str, tool, version: str) -> dict:
    ident = {"source_sha256": hashlib.sha256(source.encode()).hexdigest(), "arch": arch,
             "emitter": mlp_emit.EMITTER_VERSION}
    if compiler == "nvcc":  # the nvcc key as it always was (existing cache entries stay valid)
        ident["nvcc"] = version
    else:  # NVRTC's flags too (not its include folders: where the headers are found)
        ident.update(nvrtc=version, compiler="nvrtc",
                     flags=[f for f in tool.options(arch) if not f.startswith("--include-path")])
    return ident


def build(spec, dtype: str, smem_limit: int, arch: str, inplace: bool, options: MlpOptions,
          meta: Optional[dict] = None) -> Build:
    """The model's kernel for sm_<arch> (e.g. "80", "90"; its ``smem_limit``, ``inplace``:
    mlp_emit.emit), from the package, the cache, or compiled now."""
    source, config = mlp_emit.emit(spec, dtype, smem_limit, resident=True, inplace=inplace)
    aot = aot_library(source, arch)
    if aot is not None:  # built with the package (CUTLASS_OPS_MLP_MODELS): no compiler needed
        return Build("ahead_of_time", aot, aot.parent.name, True, None, None, config)
    compiler, tool = choose_compiler(options)
    if compiler == "nvcc":
        version, artifact = nvcc_version(tool), "fused_mlp.so"
    else:
        source = mlp_emit.emit(spec, dtype, smem_limit, resident=True, inplace=inplace, device_only=True)[0]
        version, artifact = tool.version, "fused_mlp.cubin"
    ident = _ident(source, arch, compiler, tool, version)
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir(options) / key / artifact
    out = Build(compiler, path, key, path.exists(), None, version, config)
    if not out.cache_hit:
        out.compile_seconds = _compile(out, tool, source, arch, {**ident, "structure": spec.structure_key(),
                                                                  "dtype": dtype, **(meta or {})})
    return out


def _compile(out: Build, tool, source: str, arch: str, meta: dict) -> float:
    """Compiles into a temporary folder, then renames it to the cache entry; the seconds."""
    out.dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.hash}.", dir=out.dir.parent))
    try:
        t0 = time.perf_counter()
        if out.compiler == "nvcc":
            extra = _nvcc_compile(tool, source, arch, tmp)
        else:
            extra = mlp_nvrtc.compile_cubin(tool, source, arch, out.config, tmp)
        seconds = time.perf_counter() - t0
        (tmp / "meta.json").write_text(json.dumps(
            {**meta, "compiler": out.compiler, "config": out.config.__dict__, **extra, "compile_seconds": seconds},
            indent=1))
        try:
            os.replace(tmp, out.dir)  # atomic: another process may have finished first
        except OSError:
            if not out.path.exists():
                raise
        return seconds
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _nvcc_compile(nvcc: str, source: str, arch: str, tmp: Path) -> dict:
    src = tmp / "fused_mlp.cu"
    src.write_text(source)
    cmd = mlp_emit.nvcc_command(nvcc, str(src), str(tmp / "fused_mlp.so"), arch, verbose_ptxas=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"FusedMLP: nvcc failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}")
    (tmp / "ptxas.txt").write_text(r.stdout + r.stderr)
    return {"command": cmd}
