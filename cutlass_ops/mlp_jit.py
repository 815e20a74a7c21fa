"""FusedMLP's kernels: the registry of traced models by key, nvcc lookup, the disk cache, the
compiled-kernel object and its launches.

A model's CUDA source comes from ``cutlass_ops_gen.mlp_emit`` (the tracer's ``MlpSpec``, the
dtype, the GPU's shared memory); the first use for a dtype and GPU arch compiles it with nvcc
into a shared library in the cache (``<cache>/mlp/<hash>``, ``MlpOptions.cache_dir``), keyed by
a hash of the source (structure, dtype, tile config), the arch and nvcc's version, so that a
later process loads it from there.  Models listed in the build's manifest
(CUTLASS_OPS_MLP_MODELS, ``cutlass_ops_gen.mlp_aot``) come compiled with the package
(``mlp_aot/<key>/fused_mlp.so``) and need no nvcc.  The library is loaded with ctypes and
launched on torch's current stream (no host syncs, no allocations outside torch's allocator:
CUDA-graph safe once compiled and loaded).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from .options import MlpOptions

try:
    # cutlass_ops_gen ships in the wheel next to cutlass_ops (pyproject.toml wheel.packages): the
    # model's kernel is generated at first use, from the same tracer and emitter the build uses.
    from cutlass_ops_gen import mlp_emit
    from cutlass_ops_gen.mlp_spec import MlpSpec
except ImportError as exc:  # pragma: no cover
    raise ImportError("cutlass_ops.mlp_jit needs the cutlass_ops_gen package, which the cutlass_ops wheel "
                      "installs; in a source checkout put its python/ folder on PYTHONPATH") from exc

__all__ = ["register_spec", "kernel_info", "cache_dir", "aot_library", "AOT_DIR"]

CUDA_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

# ---------------------------------------------------------------------------------------------
# Models by key: the ops take the key, a string (a constant for torch.compile)
# ---------------------------------------------------------------------------------------------
_SPECS: dict[str, tuple[MlpSpec, MlpOptions]] = {}


def register_spec(spec: MlpSpec, options: Optional[MlpOptions] = None) -> str:
    """The key the ops know ``spec`` by, with the options its kernels and backward follow."""
    options = options or MlpOptions()
    ident = spec.structure_key() + repr(options)
    key = "mlp_" + hashlib.sha256(ident.encode()).hexdigest()[:20]
    _SPECS[key] = (spec, options)
    return key


def spec_of(key: str) -> MlpSpec:
    return _entry(key)[0]


def options_of(key: str) -> MlpOptions:
    return _entry(key)[1]


def _entry(key: str) -> tuple[MlpSpec, MlpOptions]:
    try:
        return _SPECS[key]
    except KeyError:
        raise ValueError(f"fused_mlp: unknown kernel key {key!r}; create the model with "
                         f"FusedMLP.from_module (or register_spec) in this process first") from None


# ---------------------------------------------------------------------------------------------
# nvcc and the disk cache
# ---------------------------------------------------------------------------------------------

def cache_dir(options: Optional[MlpOptions] = None) -> Path:
    """Where compiled kernels go: ``<options.cache_dir>/mlp``, else under the XDG cache."""
    root = (options or MlpOptions()).cache_dir
    if root:
        return Path(root) / "mlp"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "cutlass_ops" / "mlp"


def _nvcc(options: MlpOptions) -> str:
    for cand in (options.nvcc, os.environ.get("CUDACXX"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError("FusedMLP compiles its kernel at first use and needs nvcc: put it on PATH or set "
                       "CUDACXX / CUTLASS_OPS_NVCC (MlpOptions.nvcc) / CUDA_HOME")


_NVCC_VERSION: dict[str, str] = {}


def _nvcc_version(nvcc: str) -> str:
    if nvcc not in _NVCC_VERSION:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        _NVCC_VERSION[nvcc] = out.strip().splitlines()[-1]
    return _NVCC_VERSION[nvcc]


AOT_DIR = Path(__file__).resolve().parent / "mlp_aot"


def aot_library(source: str, arch: str) -> Optional[Path]:
    """The kernel library the package was built with for this exact source and arch
    (cutlass_ops/mlp_aot/<key>/fused_mlp.so, from the build's CUTLASS_OPS_MLP_MODELS), or None."""
    path = AOT_DIR / mlp_emit.aot_key(source, arch) / "fused_mlp.so"
    return path if path.is_file() else None


class Kernel:
    """One compiled and loaded model kernel (one spec, dtype, device, in-place shape or not)."""

    def __init__(self, spec: MlpSpec, dtype: torch.dtype, device: torch.device, inplace: bool,
                 options: MlpOptions):
        self.spec, self.dtype, self.device = spec, dtype, device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device_index = index
        major, minor = torch.cuda.get_device_capability(index)
        if major < 8:
            raise RuntimeError(f"FusedMLP needs an sm_80 or newer GPU (tensor-core mma.sync with bf16); "
                               f"{torch.cuda.get_device_name(index)} is sm_{major}{minor}")
        self.arch = f"{major}{minor}"
        smem = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
        self.source, self.config = mlp_emit.emit(spec, CUDA_DTYPES[dtype], smem, resident=True, inplace=inplace)
        self.compile_seconds = None
        aot = aot_library(self.source, self.arch)
        self.ahead_of_time = aot is not None
        if self.ahead_of_time:  # built with the package (CUTLASS_OPS_MLP_MODELS): no nvcc needed
            self.path, self.dir, self.hash, self.cache_hit = aot, aot.parent, aot.parent.name, True
        else:
            nvcc = _nvcc(options)
            ident = {"source_sha256": hashlib.sha256(self.source.encode()).hexdigest(), "arch": self.arch,
                     "nvcc": _nvcc_version(nvcc), "emitter": mlp_emit.EMITTER_VERSION}
            self.hash = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
            self.dir = cache_dir(options) / self.hash
            self.path = self.dir / "fused_mlp.so"
            self.cache_hit = self.path.exists()
            if not self.cache_hit:
                self._compile(nvcc, ident)
        t0 = time.perf_counter()
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.fmlp_init.argtypes = [ctypes.c_int]
        self.lib.fmlp_error.restype = ctypes.c_char_p
        self.lib.fmlp_error.argtypes = [ctypes.c_int]
        P = ctypes.c_void_p
        self.lib.fmlp_fwd.argtypes = [ctypes.c_int, P, P, P, P, P, P, ctypes.c_longlong, ctypes.c_int, P]
        self.lib.fmlp_bwd.argtypes = [ctypes.c_int, P, P, P, P, P, P, ctypes.c_longlong, P]
        if self.config.dw_warps:  # the fused weight-gradient backward exists for this model
            self.lib.fmlp_bwd_dw_ctas.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.POINTER(ctypes.c_longlong)]
            self.lib.fmlp_bwd_dw.argtypes = [ctypes.c_int, P, P, P, P, P, P, P, P, ctypes.c_longlong, P]
        with torch.cuda.device(index):
            self.check(self.lib.fmlp_init(index), "init")
        self.load_seconds = time.perf_counter() - t0

    def _compile(self, nvcc: str, ident: dict) -> None:
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.hash}.", dir=self.dir.parent))
        try:
            src = tmp / "fused_mlp.cu"
            src.write_text(self.source)
            cmd = mlp_emit.nvcc_command(nvcc, str(src), str(tmp / "fused_mlp.so"), self.arch, verbose_ptxas=True)
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True)
            self.compile_seconds = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(f"FusedMLP: nvcc failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}")
            (tmp / "ptxas.txt").write_text(r.stdout + r.stderr)
            (tmp / "meta.json").write_text(json.dumps(
                {**ident, "structure": self.spec.structure_key(), "dtype": str(self.dtype),
                 "config": self.config.__dict__, "command": cmd, "compile_seconds": self.compile_seconds},
                indent=1))
            try:
                os.replace(tmp, self.dir)  # atomic: another process may have finished first
            except OSError:
                if not self.path.exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def check(self, err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"FusedMLP kernel {what} failed: {self.lib.fmlp_error(err).decode()} "
                               f"(library {self.path})")

    def info(self) -> dict:
        return {"path": str(self.path), "arch": f"sm_{self.arch}", "dtype": str(self.dtype),
                "ahead_of_time": self.ahead_of_time, "cache_hit": self.cache_hit, "compile_seconds": self.compile_seconds,
                "load_seconds": self.load_seconds,
                # resident weights: warps per CTA (each on its own rows_per_tile rows); 0: streamed
                "resident_warps": self.config.resident_warps, "rows_per_tile": self.config.bm,
                "inplace": self.config.inplace,
                "smem_fwd": self.config.smem_fwd, "smem_bwd": self.config.smem_bwd,
                # > 0: the weight gradients come from the backward kernel (warps per CTA)
                "fused_weight_grad_warps": self.config.dw_warps, "smem_bwd_dw": self.config.smem_dw}


# ---------------------------------------------------------------------------------------------
# Kernel choice and the in-process cache
# ---------------------------------------------------------------------------------------------
_CONFIGS: dict[tuple, "mlp_emit.Config"] = {}


def config(key: str, device_index: int, forward: bool) -> "mlp_emit.Config":
    """The kernel config (mlp_emit.choose_config) of the model's forward or backward kernel on
    this GPU; cached, as the GPU's shared memory is all it depends on (host time: this runs
    every call).  Resident weights wherever they fit; the in-place resident shape (weights that
    fit beside one activation tile per warp but not two, e.g. 32-128x6-16 on sm90) for the
    forwards only, inference's and training's: the backward's in-place shape measured slower
    than its streamed one, and it reads what the in-place forward saved in the same layout."""
    k = (key, device_index, forward)
    cfg = _CONFIGS.get(k)
    if cfg is None:
        smem = torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin
        cfg = _CONFIGS[k] = mlp_emit.choose_config(spec_of(key), smem, resident=True, inplace=forward)
    return cfg


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_KERNELS: dict[tuple, Kernel] = {}
_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple, threading.Lock] = {}


def kernel(key: str, dtype: torch.dtype, device: torch.device, forward: bool = False) -> Kernel:
    """The model's kernel for the forward (with or without save), or for the backward: the two
    differ where the in-place shape applies to the forward only (config)."""
    index = device_index(device)
    # keyed by the shape, so that a model the in-place shape does not apply to has one kernel
    inplace = config(key, index, forward).inplace
    k = (key, dtype, index, inplace)
    kern = _KERNELS.get(k)
    if kern is None:
        # one lock per kernel: threads compiling different models run their nvcc side by side
        with _LOCK:
            lock = _KEY_LOCKS.setdefault(k, threading.Lock())
        with lock:
            kern = _KERNELS.get(k)
            if kern is None:
                spec, options = _entry(key)
                kern = _KERNELS[k] = Kernel(spec, dtype, torch.device("cuda", index), inplace, options)
    return kern


def kernel_info(key: str) -> list[dict]:
    """What each compiled kernel of ``key`` cost: cache hit, compile and load seconds, path."""
    return [k.info() for (kk, *_), k in _KERNELS.items() if kk == key]


_LAYOUTS: dict[str, tuple] = {}


def partial_layout(key: str) -> tuple:
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _LAYOUTS[key] = mlp_emit.partial_layout(spec_of(key))
    return layout


# ---------------------------------------------------------------------------------------------
# Launches (CUDA, float16/bfloat16; the op's checks have run)
# ---------------------------------------------------------------------------------------------

def aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with a 16-byte aligned start (the kernel's vector loads need it)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def saved_buffers(x, spec: MlpSpec):
    """What a forward with save=True returns beside y: per layer its pre-activation z (M, padded
    out), an empty tensor where the backward takes the derivative from the activation instead
    (spec.saves_pre_activation), and per hidden layer its activation a (M, padded out)."""
    M = x.shape[0]
    zs = [x.new_empty((M, l.out_padded)) if spec.saves_pre_activation(i) else x.new_empty((0,))
          for i, l in enumerate(spec.layers)]
    acts = [x.new_empty((M, l.out_padded)) for l in spec.layers[:-1]]
    return zs, acts


def launch_forward(key: str, x, weights, biases, save: bool):
    """y (and with save the saved tensors, zs + acts) from the forward kernel."""
    spec = spec_of(key)
    kern = kernel(key, x.dtype, x.device, forward=True)
    M = x.shape[0]
    x = aligned(x)
    weights = [aligned(w) for w in weights]
    biases = [None if b is None else b.contiguous() for b in biases]
    y = x.new_empty((M, spec.out_features))
    L = len(spec.layers)
    zs, acts = saved_buffers(x, spec) if save else ([], [])
    arr = ctypes.c_void_p * L
    wp = arr(*[w.data_ptr() for w in weights])
    bp = arr(*[0 if b is None else b.data_ptr() for b in biases])
    zp = arr(*[t.data_ptr() if t.numel() else 0 for t in zs]) if save else arr()
    ap = arr(*([t.data_ptr() for t in acts] + [0])) if save else arr()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    kern.check(kern.lib.fmlp_fwd(kern.device_index, x.data_ptr(), y.data_ptr(), wp, bp, zp, ap, M,
                                 int(save), stream), "launch (forward)")
    return y, zs + acts


def launch_backward(key: str, grad_y, x, weights, saved, need_dx: bool, fused_dw: bool):
    """(dx, dzs, db, dw) with db and dw flat float32 sums of the kernel's partials
    (mlp_emit.partial_layout: every layer's in one row; None where no layer has a bias, or where
    the weight gradients are GEMMs: dzs are then layer i's dz, else empty).  One reduction per
    kind over all layers, rather than one per layer: fewer launches, less host time."""
    spec = spec_of(key)
    kern = kernel(key, x.dtype, x.device)
    M = x.shape[0]
    L = len(spec.layers)
    x = aligned(x)
    grad_y = aligned(grad_y)
    weights = [aligned(w) for w in weights]
    # per layer what bwd_act reads: z, or the activation where its derivative comes from it
    zs = [aligned(saved[i] if spec.saves_pre_activation(i) else saved[L + i]) for i in range(L)]
    dx = x.new_empty((M, spec.in_features)) if need_dx else x.new_empty((0,))
    db_offsets, db_stride, dw_offsets, dw_stride = partial_layout(key)
    # per warp tile: each layer's bias-gradient column sums (the kernel's partials), one buffer
    tiles = -(-M // (16 * kern.config.mt))  # the kernels index partials by 16*MT-row warp tile
    db_parts = x.new_empty((tiles, db_stride), dtype=torch.float32) if db_stride else None
    arr = ctypes.c_void_p * L
    stream = torch.cuda.current_stream(x.device).cuda_stream
    dx_ptr = dx.data_ptr() if need_dx else None
    db_ptrs = arr(*[0 if o is None else db_parts.data_ptr() + 4 * o for o in db_offsets])
    dw = None
    if fused_dw and kern.config.dw_warps:
        ctas = ctypes.c_longlong(0)
        kern.check(kern.lib.fmlp_bwd_dw_ctas(kern.device_index, M, ctypes.byref(ctas)), "grid (backward, fused dW)")
        # one float32 partial of every dW per CTA, summed below in a fixed order (deterministic)
        dw_parts = x.new_empty((max(ctas.value, 1), dw_stride), dtype=torch.float32)
        acts = [aligned(saved[L + i]) if i < L - 1 else x for i in range(L)]
        kern.check(kern.lib.fmlp_bwd_dw(kern.device_index, grad_y.data_ptr(), dx_ptr, x.data_ptr(),
                                        arr(*[t.data_ptr() for t in zs]), arr(*[t.data_ptr() for t in acts]),
                                        arr(*[w.data_ptr() for w in weights]),
                                        arr(*[dw_parts.data_ptr() + 4 * o for o in dw_offsets]), db_ptrs, M, stream),
                   "launch (backward, fused dW)")
        dw = dw_parts.sum(0) if M > 0 else dw_parts.new_zeros((dw_stride,))
        dzs = []
    else:
        dzs = [x.new_empty((M, l.out_padded)) for l in spec.layers]
        kern.check(kern.lib.fmlp_bwd(kern.device_index, grad_y.data_ptr(), dx_ptr,
                                     arr(*[t.data_ptr() for t in zs]), arr(*[w.data_ptr() for w in weights]),
                                     arr(*[t.data_ptr() for t in dzs]), db_ptrs, M, stream),
                   "launch (backward)")
    db = None if db_parts is None else (db_parts.sum(0) if M > 0 else db_parts.new_zeros((db_stride,)))
    return dx, dzs, db, dw
