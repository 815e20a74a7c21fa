"""FusedMLP's kernels: the registry of traced models by key, the compiled-kernel object and its
launches.

A model's CUDA source comes from ``cutlass_ops_gen.mlp_emit`` (the tracer's ``MlpSpec``, the
dtype, the GPU's shared memory); ``mlp_build`` gets its kernel for the GPU's arch: built with
the package ahead of time (CUTLASS_OPS_MLP_MODELS), from the disk cache
(``<cache>/mlp/<hash>``, ``MlpOptions.cache_dir``), or compiled now, by nvcc into a shared
library, or where there is no nvcc (or ``MlpOptions.compiler`` says so) by NVRTC into a CUBIN
(``mlp_nvrtc``).  The library is loaded with ctypes, the CUBIN through the CUDA driver API, and
either is launched on torch's current stream (no host syncs, no allocations outside torch's
allocator: CUDA-graph safe once compiled and loaded).
"""
from __future__ import annotations

import ctypes
import hashlib
import threading
import time
from pathlib import Path
from typing import Optional

import torch

from . import mlp_build, mlp_nvrtc
from .mlp_build import AOT_DIR, aot_library, cache_dir
from .options import MlpOptions

try:
    # cutlass_ops_gen ships in the wheel next to cutlass_ops (pyproject.toml wheel.packages): the
    # model's kernel is generated at first use, from the same tracer and emitter the build uses.
    from cutlass_ops_gen import mlp_emit
    from cutlass_ops_gen.mlp_spec import MlpSpec
except ImportError as exc:  # pragma: no cover
    raise ImportError("cutlass_ops.mlp_jit needs the cutlass_ops_gen package, which the cutlass_ops wheel "
                      "installs; in a source checkout put its python/ folder on PYTHONPATH") from exc

__all__ = ["register_spec", "kernel_info", "cache_dir", "aot_library", "AOT_DIR", "Kernel"]

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
# The compiled kernel: its build (mlp_build: package, cache, nvcc or NVRTC) loaded, its launches
# ---------------------------------------------------------------------------------------------

class Library:
    """An nvcc-built kernel library (the cache's or the package's fused_mlp.so), loaded with
    ctypes: its extern "C" entry points size the grids and launch."""

    def __init__(self, path: Path, config: "mlp_emit.Config", device_index: int):
        self.path, self.device_index = path, device_index
        self.lib = ctypes.CDLL(str(path))
        self.lib.fmlp_init.argtypes = [ctypes.c_int]
        self.lib.fmlp_error.restype = ctypes.c_char_p
        self.lib.fmlp_error.argtypes = [ctypes.c_int]
        P = ctypes.c_void_p
        self.lib.fmlp_fwd.argtypes = [ctypes.c_int, P, P, P, P, P, P, ctypes.c_longlong, ctypes.c_int, P]
        self.lib.fmlp_bwd.argtypes = [ctypes.c_int, P, P, P, P, P, P, ctypes.c_longlong, P]
        if config.dw_warps:  # the fused weight-gradient backward exists for this model
            self.lib.fmlp_bwd_dw_ctas.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.POINTER(ctypes.c_longlong)]
            self.lib.fmlp_bwd_dw.argtypes = [ctypes.c_int, P, P, P, P, P, P, P, P, ctypes.c_longlong, P]
        self.check(self.lib.fmlp_init(device_index), "init")

    def check(self, err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"FusedMLP kernel {what} failed: {self.lib.fmlp_error(err).decode()} "
                               f"(library {self.path})")

    @staticmethod
    def _arr(ptrs) -> ctypes.Array:
        return (ctypes.c_void_p * len(ptrs))(*[p or None for p in ptrs])

    def fwd(self, x, y, w, b, z, a, M, save, stream) -> None:
        self.check(self.lib.fmlp_fwd(self.device_index, x, y, self._arr(w), self._arr(b), self._arr(z),
                                     self._arr(a), M, int(save), stream), "launch (forward)")

    def bwd(self, dy, dx, z, w, dz, db, M, stream) -> None:
        self.check(self.lib.fmlp_bwd(self.device_index, dy, dx or None, self._arr(z), self._arr(w), self._arr(dz),
                                     self._arr(db), M, stream), "launch (backward)")

    def bwd_dw_ctas(self, M) -> int:
        ctas = ctypes.c_longlong(0)
        self.check(self.lib.fmlp_bwd_dw_ctas(self.device_index, M, ctypes.byref(ctas)), "grid (backward, fused dW)")
        return ctas.value

    def bwd_dw(self, dy, dx, x, z, a, w, dw, db, M, stream) -> None:
        self.check(self.lib.fmlp_bwd_dw(self.device_index, dy, dx or None, x, self._arr(z), self._arr(a),
                                        self._arr(w), self._arr(dw), self._arr(db), M, stream),
                   "launch (backward, fused dW)")


class Kernel:
    """One compiled and loaded model kernel (one spec, dtype, device, in-place shape or not):
    launches ``fwd``, ``bwd``, ``bwd_dw_ctas``, ``bwd_dw`` (pointers as ints, 0 for none; per
    layer lists), through the nvcc library or the NVRTC module alike."""

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
        self.build = mlp_build.build(spec, CUDA_DTYPES[dtype], smem, self.arch, inplace, options,
                                     meta={"torch_dtype": str(dtype)})
        self.config = self.build.config
        t0 = time.perf_counter()
        with torch.cuda.device(index):
            if self.build.compiler == "nvrtc":
                self.launcher = mlp_nvrtc.Module(self.build.dir, self.config, index, len(spec.layers))
                self.lib = None
            else:
                self.launcher = Library(self.build.path, self.config, index)
                self.lib = self.launcher.lib
        self.load_seconds = time.perf_counter() - t0
        # the launches, as attributes (one call less per launch; a test may wrap one)
        self.fwd, self.bwd = self.launcher.fwd, self.launcher.bwd
        self.bwd_dw_ctas, self.bwd_dw = self.launcher.bwd_dw_ctas, self.launcher.bwd_dw

    def info(self) -> dict:
        b = self.build
        return {"path": str(b.path), "arch": f"sm_{self.arch}", "dtype": str(self.dtype),
                # "nvcc", "nvrtc" or "ahead_of_time" (built by nvcc with the package)
                "compiler": b.compiler, "compiler_version": b.compiler_version,
                "ahead_of_time": b.compiler == "ahead_of_time", "cache_hit": b.cache_hit,
                "compile_seconds": b.compile_seconds, "load_seconds": self.load_seconds,
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
        # one lock per kernel: threads compiling different models run their compiles side by side
        with _LOCK:
            lock = _KEY_LOCKS.setdefault(k, threading.Lock())
        with lock:
            kern = _KERNELS.get(k)
            if kern is None:
                spec, options = _entry(key)
                kern = _KERNELS[k] = Kernel(spec, dtype, torch.device("cuda", index), inplace, options)
    return kern


def kernel_info(key: str) -> list[dict]:
    """What each compiled kernel of ``key`` cost: the compiler ("nvcc", "nvrtc", "ahead_of_time"),
    cache hit, compile and load seconds, path."""
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
    wp = [w.data_ptr() for w in weights]
    bp = [0 if b is None else b.data_ptr() for b in biases]
    zp = [t.data_ptr() if t.numel() else 0 for t in zs] if save else [0] * L
    ap = [t.data_ptr() for t in acts] + [0] if save else [0] * L
    stream = torch.cuda.current_stream(x.device).cuda_stream
    kern.fwd(x.data_ptr(), y.data_ptr(), wp, bp, zp, ap, M, save, stream)
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
    stream = torch.cuda.current_stream(x.device).cuda_stream
    dx_ptr = dx.data_ptr() if need_dx else 0
    db_ptrs = [0 if o is None else db_parts.data_ptr() + 4 * o for o in db_offsets]
    dw = None
    if fused_dw and kern.config.dw_warps:
        # one float32 partial of every dW per CTA, summed below in a fixed order (deterministic)
        dw_parts = x.new_empty((max(kern.bwd_dw_ctas(M), 1), dw_stride), dtype=torch.float32)
        acts = [aligned(saved[L + i]) if i < L - 1 else x for i in range(L)]
        kern.bwd_dw(grad_y.data_ptr(), dx_ptr, x.data_ptr(), [t.data_ptr() for t in zs],
                    [t.data_ptr() for t in acts], [w.data_ptr() for w in weights],
                    [dw_parts.data_ptr() + 4 * o for o in dw_offsets], db_ptrs, M, stream)
        dw = dw_parts.sum(0) if M > 0 else dw_parts.new_zeros((dw_stride,))
        dzs = []
    else:
        dzs = [x.new_empty((M, l.out_padded)) for l in spec.layers]
        kern.bwd(grad_y.data_ptr(), dx_ptr, [t.data_ptr() for t in zs], [w.data_ptr() for w in weights],
                 [t.data_ptr() for t in dzs], db_ptrs, M, stream)
    db = None if db_parts is None else (db_parts.sum(0) if M > 0 else db_parts.new_zeros((db_stride,)))
    return dx, dzs, db, dw
