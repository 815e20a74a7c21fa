"""FusedMLP's kernels without nvcc: NVRTC compiles a model's device code into a CUBIN, and the
CUDA driver API (libcuda, through ctypes) loads and launches it.

A machine with ``pip install torch cutlass_ops`` and no CUDA toolkit has no nvcc, but it has
libnvrtc: torch's CUDA wheels install it (``nvidia/cu13/lib/libnvrtc.so.13``, or
``nvidia/cuda_nvrtc/lib`` for CUDA 12), with the CUDA headers the kernels include
(``cuda_fp16.h``, ``cuda_bf16.h``).  ``find_nvrtc`` looks there first, then in the system
CUDA's (``$CUDA_HOME``, ``/usr/local/cuda``, the loader's path).

The source NVRTC compiles is the nvcc source's kernels without its host side
(``mlp_emit.emit(..., device_only=True)``); ``<cuda_runtime.h>`` and ``<stdint.h>``, host
headers NVRTC cannot read, come from HEADERS instead.  The host side is here: ``Module`` fills
the kernels' parameter structs (FwdParams, BwdParams, BwdDwParams: ctypes mirrors of mlp_emit's,
filled as its PARAMS helpers do) and sizes the grids as its ``grid_size`` and ``dw_grid`` do.
The cache (``mlp_build``) keeps the CUBIN and the kernels' mangled names (kernels.json), so a
later process loads them without compiling.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import json
import os
import threading
from pathlib import Path
from typing import Optional

from cutlass_ops_gen import mlp_emit

__all__ = ["KERNELS", "Nvrtc", "find_nvrtc", "library_candidates", "compile_cubin", "Module", "MISSING"]

# The kernels by role, as name expressions NVRTC lowers to their mangled names.
KERNELS = {"fwd_save": "fmlp_model::fwd_kernel<true>", "fwd": "fmlp_model::fwd_kernel<false>",
           "bwd": "fmlp_model::bwd_kernel", "bwd_dw": "fmlp_model::bwd_dw_kernel"}

# Host headers mlp_kernel.cuh includes, as NVRTC sees them: the device runtime (threadIdx,
# __syncthreads, make_uint4, ...) is built into NVRTC, and the kernels use the fixed-width
# integer types only.
HEADERS = {
    "cuda_runtime.h": "// NVRTC: the device runtime is built in\n",
    "stdint.h": ("typedef signed char int8_t; typedef short int16_t; typedef int int32_t; typedef long long int64_t;\n"
                 "typedef unsigned char uint8_t; typedef unsigned short uint16_t; typedef unsigned int uint32_t;\n"
                 "typedef unsigned long long uint64_t;\n"),
}

MISSING = ("NVRTC: libnvrtc and the CUDA headers come with torch's CUDA wheels (pip install nvidia-cuda-nvrtc "
           "nvidia-cuda-runtime for CUDA 13, nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 for CUDA 12) or with a "
           "CUDA toolkit ($CUDA_HOME/lib64/libnvrtc.so, $CUDA_HOME/include)")


def _torch_cuda_major() -> Optional[str]:
    try:
        import torch
        return (torch.version.cuda or "").split(".")[0] or None
    except ImportError:  # pragma: no cover
        return None


def _is_libnvrtc(path: str) -> bool:
    """libnvrtc itself, not its builtins library or its .alt. variant beside it."""
    name = os.path.basename(path)
    return "builtins" not in name and ".alt." not in name


def library_candidates() -> list[tuple[str, list[str]]]:
    """(libnvrtc path, include folders) to try, in order: NVIDIA's pip wheels (those of torch's
    CUDA major version first), then the system CUDA's."""
    includes, wheels = [], []
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        includes += [d for d in sorted(glob.glob(os.path.join(root, "*", "include")))
                     if os.path.isfile(os.path.join(d, "cuda_fp16.h"))]
        wheels += [p for p in sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*"))) if _is_libnvrtc(p)]
    major = _torch_cuda_major()
    wheels.sort(key=lambda p: not (major and p.endswith(f".so.{major}")))
    out = [(p, sorted(includes, key=lambda d: os.path.dirname(d) != os.path.dirname(os.path.dirname(p))))
           for p in wheels]
    for home in dict.fromkeys([os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        if home:
            for p in sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")) +
                            glob.glob(os.path.join(home, "targets", "*", "lib", "libnvrtc.so*"))):
                if _is_libnvrtc(p):
                    out.append((p, [os.path.join(home, "include")]))
    found = ctypes.util.find_library("nvrtc")
    if found:
        home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        out.append((found, [os.path.join(home, "include")]))
    return out


class Nvrtc:
    """One loaded libnvrtc and the include folders its compiles get."""

    def __init__(self, library: str, includes: list[str]):
        self.library, self.includes = library, list(includes)
        lib = self.lib = ctypes.CDLL(library)
        # libnvrtc opens libnvrtc-builtins by name at its first compile, which the loader finds
        # beside it only where something (torch, LD_LIBRARY_PATH) put that folder in reach
        major = library.rsplit(".so.", 1)[-1].split(".")[0] if ".so." in library else ""
        if os.path.isabs(library):
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(library),
                                                          f"libnvrtc-builtins.so.{major}*"))):
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = f"nvrtc {major.value}.{minor.value}"

    def _check(self, result: int, what: str, log: str = "") -> None:
        if result:
            raise RuntimeError(f"FusedMLP: {what} failed: {self.lib.nvrtcGetErrorString(result).decode()} "
                               f"({self.library}){log}")

    def options(self, arch: str) -> list[str]:
        """nvcc_command's device flags (a CUBIN for sm_<arch>, C++17, line info, ptxas's report
        as its -Xptxas -v), without the warning for constants only the host side reads."""
        return ([f"--gpu-architecture=sm_{arch}", "-std=c++17", "-lineinfo", "--ptxas-options=-v",
                 "-diag-suppress=177"] +
                [f"--include-path={d}" for d in self.includes])

    def compile(self, source: str, arch: str, names: list[str]) -> tuple[bytes, dict, str]:
        """(CUBIN, {name expression: mangled name}, compile log) for ``source`` on sm_<arch>."""
        lib, vp = self.lib, ctypes.c_void_p
        prog = vp()
        hnames = list(HEADERS)
        arr = ctypes.c_char_p * len(hnames)
        self._check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"fused_mlp.cu", len(hnames),
                                           arr(*[HEADERS[h].encode() for h in hnames]),
                                           arr(*[h.encode() for h in hnames])), "nvrtcCreateProgram")
        try:
            for name in names:
                self._check(lib.nvrtcAddNameExpression(prog, name.encode()), "nvrtcAddNameExpression")
            opts = [o.encode() for o in self.options(arch)]
            result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            self._check(result, f"NVRTC compiling the kernel for sm_{arch}", ":\n" + log)
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            lowered = {}
            for name in names:
                out = ctypes.c_char_p()
                self._check(lib.nvrtcGetLoweredName(prog, name.encode(), ctypes.byref(out)), "nvrtcGetLoweredName")
                lowered[name] = out.value.decode()
            return cubin.raw, lowered, log
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


_FOUND: dict[str, Optional[Nvrtc]] = {}
_FIND_LOCK = threading.Lock()


def find_nvrtc() -> Optional[Nvrtc]:
    """The first of library_candidates() that loads (once per process), or None."""
    with _FIND_LOCK:
        if "nvrtc" not in _FOUND:
            _FOUND["nvrtc"] = None
            for library, includes in library_candidates():
                try:
                    _FOUND["nvrtc"] = Nvrtc(library, includes)
                    break
                except (OSError, RuntimeError, AttributeError):
                    continue
        return _FOUND["nvrtc"]


def kernel_names(config) -> list[str]:
    """The model's kernels' name expressions (bwd_dw_kernel only where the config has it)."""
    return [n for role, n in KERNELS.items() if role != "bwd_dw" or config.dw_warps]


def compile_cubin(nvrtc: Nvrtc, source: str, arch: str, config, folder: Path) -> dict:
    """Compiles ``source`` (device only) into ``folder``: fused_mlp.cu, fused_mlp.cubin,
    kernels.json (name expression -> mangled name), nvrtc.txt (the log); returns what the
    cache's meta.json records of it."""
    (folder / "fused_mlp.cu").write_text(source)
    cubin, lowered, log = nvrtc.compile(source, arch, kernel_names(config))
    (folder / "fused_mlp.cubin").write_bytes(cubin)
    (folder / "kernels.json").write_text(json.dumps(lowered, indent=1))
    (folder / "nvrtc.txt").write_text(log)
    return {"command": [nvrtc.library] + nvrtc.options(arch), "kernels": lowered}


# ---------------------------------------------------------------------------------------------
# The CUDA driver API: load the CUBIN, launch its kernels
# ---------------------------------------------------------------------------------------------
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_DRIVER: list = []


def _driver():
    if not _DRIVER:
        lib = ctypes.CDLL("libcuda.so.1")
        vp, u = ctypes.c_void_p, ctypes.c_uint
        lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [vp, ctypes.c_int, ctypes.c_int]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int), vp, ctypes.c_int,
                                                                    ctypes.c_size_t]
        lib.cuCtxSetCurrent.argtypes = [vp]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _DRIVER.append(lib)
    return _DRIVER[0]


def _structs(L: int):
    """ctypes mirrors of mlp_emit's FwdParams, BwdParams, BwdDwParams for L layers."""
    P, A = ctypes.c_void_p, ctypes.c_void_p * L
    fields = {"Fwd": ["x", "y", "w", "b", "z", "a"], "Bwd": ["dy", "dx", "z", "w", "dz", "db"],
              "BwdDw": ["dy", "dx", "x", "z", "a", "w", "dw", "db"]}
    scalars = {"x", "y", "dy", "dx"}
    return {k: type(f"{k}Params", (ctypes.Structure,),
                    {"_fields_": [(n, P if n in scalars else A) for n in names] + [("M", ctypes.c_longlong)]})
            for k, names in fields.items()}


class Module:
    """A model's CUBIN loaded into the device's primary context (the one torch uses), with
    the launches of mlp_jit's kernel interface (fwd, bwd, bwd_dw_ctas, bwd_dw)."""

    def __init__(self, folder: Path, config, device_index: int, layers: int):
        self.path, self.config, self.L = folder / "fused_mlp.cubin", config, layers
        drv = self.drv = _driver()
        lowered = json.loads((folder / "kernels.json").read_text())
        self._check(drv.cuInit(0), "cuInit")
        dev, self.ctx = ctypes.c_int(), ctypes.c_void_p()
        self._check(drv.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
        self._check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self._ensure_context()
        sms = ctypes.c_int()
        self._check(drv.cuDeviceGetAttribute(ctypes.byref(sms), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                    "cuDeviceGetAttribute")
        self.sms = sms.value
        self.module = ctypes.c_void_p()
        self._check(drv.cuModuleLoadData(ctypes.byref(self.module), self.path.read_bytes()), "cuModuleLoadData")
        self.threads = config.resident_warps * 32 if config.resident_warps else mlp_emit.FMLP_THREADS
        smem = {"fwd_save": config.smem_fwd, "fwd": config.smem_fwd, "bwd": config.smem_bwd, "bwd_dw": config.smem_dw}
        threads = {"bwd_dw": config.dw_warps * 32}
        self.func, self.per_sm = {}, {}
        for role, name in KERNELS.items():
            if name not in lowered:
                continue
            f = ctypes.c_void_p()
            self._check(drv.cuModuleGetFunction(ctypes.byref(f), self.module, lowered[name].encode()),
                        f"cuModuleGetFunction({name})")
            self._check(drv.cuFuncSetAttribute(f, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem[role]),
                        f"cuFuncSetAttribute({name})")
            # the occupancy is the kernel's and the GPU's: computed once (mlp_emit's grid_size
            # and dw_grid ask per launch, for the same number)
            n = ctypes.c_int()
            self._check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), f,
                                                                       threads.get(role, self.threads), smem[role]),
                        f"cuOccupancyMaxActiveBlocksPerMultiprocessor({name})")
            self.func[role], self.per_sm[role] = f, n.value
        self.smem = smem
        self.structs = _structs(layers)

    def _check(self, result: int, what: str) -> None:
        if result:
            name = ctypes.c_char_p()
            self.drv.cuGetErrorName(result, ctypes.byref(name))
            raise RuntimeError(f"FusedMLP kernel {what} failed: {(name.value or b'?').decode()} ({result}) "
                               f"(module {self.path})")

    def _ensure_context(self) -> None:
        """The device's primary context current on this thread (the nvcc library's
        ensure_device: cudaSetDevice)."""
        cur = ctypes.c_void_p()
        self._check(self.drv.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if cur.value != self.ctx.value:
            self._check(self.drv.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def _grid(self, role: str, M: int) -> int:
        """mlp_emit's grid_size: streamed, one CTA per BM rows; resident, as many CTAs as fit
        on the GPU at once, or fewer where the warps' BM-row tiles are fewer."""
        tiles = -(-M // self.config.bm)
        if not self.config.resident_warps:
            return tiles
        ctas = -(-tiles // self.config.resident_warps)
        return min(ctas, self.sms * max(self.per_sm[role], 1))

    def _launch(self, role: str, grid: int, threads: int, params, stream: int, what: str) -> None:
        self._ensure_context()
        args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        self._check(self.drv.cuLaunchKernel(self.func[role], grid, 1, 1, threads, 1, 1, self.smem[role],
                                            stream or None, args, None), what)

    def _arr(self, ptrs) -> ctypes.Array:
        return (ctypes.c_void_p * self.L)(*[p or None for p in ptrs])

    def fwd(self, x, y, w, b, z, a, M, save, stream) -> None:
        if M <= 0:
            return
        none = [0] * self.L
        p = self.structs["Fwd"](x, y, self._arr(w), self._arr(b), self._arr(z if save else none),
                                self._arr(a if save else none), M)
        role = "fwd_save" if save else "fwd"
        self._launch(role, self._grid(role, M), self.threads, p, stream, "launch (forward)")

    def bwd(self, dy, dx, z, w, dz, db, M, stream) -> None:
        if M <= 0:
            return
        p = self.structs["Bwd"](dy, dx or None, self._arr(z), self._arr(w), self._arr(dz), self._arr(db), M)
        self._launch("bwd", self._grid("bwd", M), self.threads, p, stream, "launch (backward)")

    def bwd_dw_ctas(self, M) -> int:
        """mlp_emit's dw_grid: CTAs of DW_WARPS warps over DW_WARPS * BM-row tiles, at most as
        many as fit on the GPU at once."""
        if M <= 0:
            return 0
        ctas = -(-M // (self.config.dw_warps * self.config.bm))
        return min(ctas, self.sms * max(self.per_sm["bwd_dw"], 1))

    def bwd_dw(self, dy, dx, x, z, a, w, dw, db, M, stream) -> None:
        if M <= 0:
            return
        p = self.structs["BwdDw"](dy, dx or None, x, self._arr(z), self._arr(a), self._arr(w), self._arr(dw),
                                  self._arr(db), M)
        self._launch("bwd_dw", self.bwd_dw_ctas(M), self.config.dw_warps * 32, p, stream,
                     "launch (backward, fused dW)")
