"""FusedMLP (issue 19): a PyTorch MLP run as one generated CUDA kernel per pass.

    fused = cutlass_ops.FusedMLP.from_module(model, example_input)   # model: a chain of nn.Linear
    y = fused(x)                                                      # x: (..., in_features)

``from_module`` traces the model (``cutlass_ops_gen.mlp.trace_mlp``: nn.Linear layers of width
1..256, bias or not, elementwise activations between and after them) and copies its weights.  On
CUDA (float16 / bfloat16, sm_80 or newer) the first call for a dtype and GPU arch generates the
model's CUDA source (``cutlass_ops_gen.mlp_emit``) and compiles it with nvcc into a shared
library in the cache (``$CUTLASS_OPS_CACHE/mlp/<hash>``, default ``~/.cache/cutlass_ops/mlp``),
keyed by a hash of the source (structure, dtype, tile config), the arch and nvcc's version; a
later process with the same model loads it from there.  Models listed in the build's manifest
(CUTLASS_OPS_MLP_MODELS, ``cutlass_ops_gen.mlp_aot``) come compiled with the package
(``mlp_aot/<key>/fused_mlp.so``) and need no nvcc.  ``kernel_info()`` reports the compile and
load times.  Models with a layer wider than 128 run as PyTorch's own ops on CUDA by default
(``KERNEL_MAX_WIDTH``: the H200 timed the kernel slower than them there; the ops below still
take any width, and ``CUTLASS_OPS_MLP_WIDE=kernel`` sends FusedMLP to the kernel).

Ops (``torch.ops.cutlass_ops``), registered here with ``torch.library.Library`` (see _LIB):

- ``fused_mlp(x, weights, biases, key, save) -> (y, saved)``: x (M, K0) -> y (M, N).  ``save``
  also returns, for the backward, each hidden layer's activation a_l and the pre-activation z_l
  of the last layer and of each hidden layer whose activation's derivative needs it
  (``MlpSpec.saves_pre_activation``; an empty tensor in its place for ReLU, leaky ReLU, tanh,
  sigmoid and identity, whose derivative comes from a_l), (M, pad8(width)) in x's dtype.
- ``fused_mlp_backward(grad_y, x, weights, saved, key, need_dx, fused_dw) -> (dx, dz, db, dw)``:
  one kernel walks the layers backwards (dz_l = g * act'(z_l), g = dz_l . W_l in shared memory)
  and writes dx and the bias gradients db_l (float32 column sums of dz_l).  The weight gradients
  dW_l = dz_l^T a_{l-1}: with ``fused_dw`` the kernel accumulates them itself (per-CTA float32
  partials, summed in a fixed order) and returns them as dw (dz empty); without, it writes dz_l
  and autograd's backward runs the GEMMs over the batch with torch (cuBLAS on CUDA; dw empty).
  Autograd asks for ``fused_dw`` where the model's kernel has it (resident weights whose dW fits
  in registers, e.g. width 64; ``CUTLASS_OPS_MLP_FUSED_DW=0`` turns it off).
- Autograd (``register_autograd``), fake impls for torch.compile, CPU impls (the same math and
  rounding points in float32, or float64 for float64 inputs).

``FusedMLP.forward`` in eager mode on CUDA calls the same kernels without the ops
(``_FusedMLPFunction``; host time: see its docstring); under torch.compile, for tensor subclasses
and with ``CUTLASS_OPS_MLP_EAGER_OPS=1`` it calls the ops.

The kernel (``cutlass_ops_gen/mlp_kernel.cuh``): per layer a warp-level tensor-core GEMM
(``mma.sync.m16n8k16``, fp32 accumulation) from shared memory, bias and activation in the
epilogue, the result back into shared memory as the next layer's input in x's dtype; only y
(and with ``save`` the tensors above) is written to global memory.  The weights stay resident
in shared memory where they fit, else stream through it per 128-row CTA (``mlp_emit``).
Widths are padded to multiples of 8 inside (zero-filled).  CUDA-graph safe (no host syncs or
allocations outside torch's allocator; compile and load happen at the first call).

Tests: ``tests/python/test_fused_mlp.py`` (CPU and GPU), ``tests/generator/test_mlp_emit.py``,
``tests/mlp_compile_check.py``; README.md ("FusedMLP") for what has run on a GPU.
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
import warnings
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

try:
    # cutlass_ops_gen ships in the wheel next to cutlass_ops (pyproject.toml wheel.packages): the
    # model's kernel is generated at first use, from the same tracer and emitter the build uses.
    from cutlass_ops_gen import mlp_emit
    from cutlass_ops_gen.mlp import MlpSpec, diff, to_torch, trace_mlp
except ImportError as exc:  # pragma: no cover
    raise ImportError("cutlass_ops.mlp needs the cutlass_ops_gen package, which the cutlass_ops wheel "
                      "installs; in a source checkout put its python/ folder on PYTHONPATH") from exc

__all__ = ["FusedMLP", "fused_mlp", "kernel_info", "cache_dir"]

_CUDA_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

# ---------------------------------------------------------------------------------------------
# Specs by key: the ops take the key, a string (a constant for torch.compile)
# ---------------------------------------------------------------------------------------------
_SPECS: dict[str, MlpSpec] = {}


def register_spec(spec: MlpSpec) -> str:
    key = "mlp_" + hashlib.sha256(spec.structure_key().encode()).hexdigest()[:20]
    _SPECS[key] = spec
    return key


def _spec(key: str) -> MlpSpec:
    try:
        return _SPECS[key]
    except KeyError:
        raise ValueError(f"fused_mlp: unknown kernel key {key!r}; create the model with "
                         f"FusedMLP.from_module (or register_spec) in this process first") from None


# ---------------------------------------------------------------------------------------------
# JIT compile + disk cache
# ---------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    root = os.environ.get("CUTLASS_OPS_CACHE")
    if root:
        return Path(root) / "mlp"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "cutlass_ops" / "mlp"


def _nvcc() -> str:
    for cand in (os.environ.get("CUTLASS_OPS_NVCC"), os.environ.get("CUDACXX"), shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if cand and os.path.isfile(cand):
            return cand
    raise RuntimeError("FusedMLP compiles its kernel at first use and needs nvcc: put it on PATH or set "
                       "CUDACXX / CUTLASS_OPS_NVCC / CUDA_HOME")


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


class _Kernel:
    """One compiled and loaded model kernel (one spec, dtype, device)."""

    def __init__(self, spec: MlpSpec, dtype: torch.dtype, device: torch.device, inplace: bool):
        self.spec, self.dtype, self.device = spec, dtype, device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device_index = index
        major, minor = torch.cuda.get_device_capability(index)
        if major < 8:
            raise RuntimeError(f"FusedMLP needs an sm_80 or newer GPU (tensor-core mma.sync with bf16); "
                               f"{torch.cuda.get_device_name(index)} is sm_{major}{minor}")
        self.arch = f"{major}{minor}"
        smem = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
        self.source, self.config = mlp_emit.emit(spec, _CUDA_DTYPES[dtype], smem, resident=_resident_allowed(),
                                                 inplace=inplace)
        self.compile_seconds = None
        aot = aot_library(self.source, self.arch)
        self.ahead_of_time = aot is not None
        if self.ahead_of_time:  # built with the package (CUTLASS_OPS_MLP_MODELS): no nvcc needed
            self.path, self.dir, self.hash, self.cache_hit = aot, aot.parent, aot.parent.name, True
        else:
            nvcc = _nvcc()
            ident = {"source_sha256": hashlib.sha256(self.source.encode()).hexdigest(), "arch": self.arch,
                     "nvcc": _nvcc_version(nvcc), "emitter": mlp_emit.EMITTER_VERSION}
            self.hash = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
            self.dir = cache_dir() / self.hash
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
            self._check(self.lib.fmlp_init(index), "init")
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

    def _check(self, err: int, what: str) -> None:
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


_CONFIGS: dict[tuple, "mlp_emit.Config"] = {}


def _config(key: str, device_index: int, forward: bool) -> "mlp_emit.Config":
    """The kernel config (mlp_emit.choose_config) of the model's forward or backward kernel on
    this GPU under the switches now set; cached, as the switches and the GPU's shared memory
    are all it depends on (host time: this runs every call)."""
    k = (key, device_index, _resident_allowed(), _inplace_allowed(forward))
    cfg = _CONFIGS.get(k)
    if cfg is None:
        smem = torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin
        cfg = _CONFIGS[k] = mlp_emit.choose_config(_spec(key), smem, resident=k[2], inplace=k[3])
    return cfg


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _fused_weight_grads(key: str, x: torch.Tensor) -> bool:
    """Whether the backward computes the weight gradients in its kernel (resident models whose dW
    fits in registers, on CUDA in float16/bfloat16) rather than as GEMMs over saved dz.  On by
    default since the H200 run (32-64x4-16, training step at 2^21 rows: 1.72 ms against 2.12 ms
    with the GEMMs; docs/results/mlp_h200_session11/); CUTLASS_OPS_MLP_FUSED_DW=0 turns it off
    (read per call).  Decided from the config alone (no compile), so a torch.compile trace with
    fake tensors decides the same."""
    if x.device.type != "cuda" or x.dtype not in _CUDA_DTYPES or os.environ.get("CUTLASS_OPS_MLP_FUSED_DW", "1") == "0":
        return False
    return _config(key, _device_index(x.device), forward=False).dw_warps > 0


def _inplace_allowed(forward: bool) -> bool:
    """Whether models whose weights fit in shared memory beside one activation tile per warp but
    not two (e.g. 32-128x6-16 on sm90) keep them resident and compute each layer in place,
    instead of streaming them.  By default in every forward (inference and training's, which
    saves the intermediates for the backward) and not in the backward: on an H100
    (docs/results/mlp_h100_session17/) 32-128x6-16's forward with saves at 2^21 rows took 2.07 ms
    in place against 3.52 streamed, its backward 8.38 ms in place against 5.98 streamed (the two
    kernels read and write the saved tensors in the same layout).  CUTLASS_OPS_MLP_INPLACE=1 uses
    it for every kernel, =0 for none; read per call, the kernels cached side by side."""
    flag = os.environ.get("CUTLASS_OPS_MLP_INPLACE", "")
    return flag == "1" if flag in ("0", "1") else forward


def _resident_allowed() -> bool:
    """CUTLASS_OPS_MLP_RESIDENT=0 keeps every model on streamed weights (to compare the two);
    read per call: kernels of both shapes are built and cached side by side."""
    return os.environ.get("CUTLASS_OPS_MLP_RESIDENT", "1") != "0"


_KERNELS: dict[tuple, _Kernel] = {}
_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple, threading.Lock] = {}


def _kernel(key: str, dtype: torch.dtype, device: torch.device, forward: bool = False) -> _Kernel:
    """The model's kernel for the forward (with or without save), or for the backward: the two
    differ where the in-place shape applies to the forward only (_inplace_allowed)."""
    index = _device_index(device)
    # keyed by the shape the switches give this model, so that a model the in-place shape does
    # not apply to has one kernel for both passes
    inplace = _config(key, index, forward).inplace
    k = (key, dtype, index, _resident_allowed(), inplace)
    kern = _KERNELS.get(k)
    if kern is None:
        # one lock per kernel: threads compiling different models run their nvcc side by side
        with _LOCK:
            lock = _KEY_LOCKS.setdefault(k, threading.Lock())
        with lock:
            kern = _KERNELS.get(k)
            if kern is None:
                kern = _KERNELS[k] = _Kernel(_spec(key), dtype, torch.device("cuda", index), inplace)
    return kern


def kernel_info(key: str) -> list[dict]:
    """What each compiled kernel of ``key`` cost: cache hit, compile and load seconds, path."""
    return [k.info() for (kk, *_), k in _KERNELS.items() if kk == key]


# ---------------------------------------------------------------------------------------------
# Checks shared by every implementation
# ---------------------------------------------------------------------------------------------

def _check_args(op: str, x, weights, biases, spec: MlpSpec) -> None:
    L = len(spec.layers)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"{op}: x must be a 2-D tensor (rows, {spec.in_features}), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.shape[1] != spec.in_features:
        raise ValueError(f"{op}: x has {x.shape[1]} columns, the model takes {spec.in_features}")
    if len(weights) != L or len(biases) != L:
        raise ValueError(f"{op}: the model has {L} layers, got {len(weights)} weights and {len(biases)} biases")
    if not x.is_floating_point():
        raise ValueError(f"{op}: x must be floating point, got {x.dtype}")
    for i, (layer, w, b) in enumerate(zip(spec.layers, weights, biases)):
        if tuple(w.shape) != (layer.out_features, layer.in_features):
            raise ValueError(f"{op}: weights[{i}] has shape {tuple(w.shape)}, layer {layer.name!r} needs "
                             f"{(layer.out_features, layer.in_features)}")
        if (b is not None) != layer.bias:
            raise ValueError(f"{op}: biases[{i}] is {'given' if b is not None else 'None'} but layer "
                             f"{layer.name!r} has {'a' if layer.bias else 'no'} bias")
        for name, t in ((f"weights[{i}]", w), (f"biases[{i}]", b)):
            if t is None:
                continue
            if t.dtype != x.dtype:
                raise ValueError(f"{op}: {name} is {t.dtype} but x is {x.dtype}")
            if t.device != x.device:
                raise ValueError(f"{op}: {name} is on {t.device} but x is on {x.device}")
        if b is not None and tuple(b.shape) != (layer.out_features,):
            raise ValueError(f"{op}: biases[{i}] has shape {tuple(b.shape)}, needs ({layer.out_features},)")


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with a 16-byte aligned start (the kernel's vector loads need it)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    out = t.new_zeros((t.shape[0], width))
    out[:, :t.shape[1]] = t
    return out


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# Forward op
# ---------------------------------------------------------------------------------------------

def _forward_math(x, weights, biases, spec: MlpSpec, save: bool):
    """The forward in torch ops, any device: the CPU implementation, and CUDA's for dtypes the
    kernel does not take (float32/float64)."""
    ct = _compute_dtype(x.dtype)
    a = x.to(ct)
    zs, acts = [], []
    out = None
    for i, (layer, w, b) in enumerate(zip(spec.layers, weights, biases)):
        z = a @ w.to(ct).t()
        if b is not None:
            z = z + b.to(ct)
        out = to_torch(layer.activation.tree, z).to(x.dtype)
        if save:
            zs.append(_pad_cols(z.to(x.dtype), layer.out_padded) if spec.saves_pre_activation(i)
                      else x.new_empty((0,)))
            if i < len(spec.layers) - 1:
                acts.append(_pad_cols(out, layer.out_padded))
        a = out.to(ct)
    return out, zs + acts


def _saved_buffers(x, spec: MlpSpec):
    """What a forward with save=True returns beside y: per layer its pre-activation z (M, padded
    out), an empty tensor where the backward takes the derivative from the activation instead
    (spec.saves_pre_activation), and per hidden layer its activation a (M, padded out)."""
    M = x.shape[0]
    zs = [x.new_empty((M, l.out_padded)) if spec.saves_pre_activation(i) else x.new_empty((0,))
          for i, l in enumerate(spec.layers)]
    acts = [x.new_empty((M, l.out_padded)) for l in spec.layers[:-1]]
    return zs, acts


def _layer_inputs(x, saved, spec: MlpSpec) -> list:
    """Each layer's input, what its weight gradient multiplies: x, then the saved hidden
    activations (a forward with save=True) less their padding columns."""
    L = len(spec.layers)
    return [x] + [saved[L + i][:, :l.out_features] for i, l in enumerate(spec.layers[:-1])]


def _layer_views(key: str, db, dw) -> tuple[list, list]:
    """The flat sums of _backward_kernels as per-layer views: the bias gradients (None for a
    layer without bias) and, where dw is given, the (out, in) weight gradients."""
    spec = _spec(key)
    db_offsets, _, dw_offsets, _ = _partial_layout(key)
    gb = [None if o is None else db[o:o + l.out_features] for o, l in zip(db_offsets, spec.layers)]
    gw = None if dw is None else [dw[o:o + l.out_features * l.in_features].view(l.out_features, l.in_features)
                                  for o, l in zip(dw_offsets, spec.layers)]
    return gb, gw


def _warn_torch_path(dtype) -> None:
    if dtype not in _WARNED:
        _WARNED.add(dtype)
        warnings.warn(f"cutlass_ops.FusedMLP: the CUDA kernel takes float16/bfloat16; {dtype} runs as "
                      "torch ops (correct, not fused)", stacklevel=3)


_WARNED: set = set()


# The two ops are defined with the low-level Library API, not torch.library.custom_op, whose
# per-call wrappers (an output-aliasing check over the tensor lists, a dynamo-disable frame)
# cost host time: on an H200 a training step of a 5-layer model at 2^14 rows took 1.56 ms of
# host time with custom_op and 1.42 with this (0.09 ms of kernels; the rest is autograd's own,
# as eager PyTorch's 1.2 ms).  Same schemas, autograd and fake impls.
_LIB = torch.library.Library("cutlass_ops", "FRAGMENT")
_LIB.define("fused_mlp(Tensor x, Tensor[] weights, Tensor?[] biases, str key, bool save) -> (Tensor, Tensor[])")
_LIB.define("fused_mlp_backward(Tensor grad_y, Tensor x, Tensor[] weights, Tensor[] saved, str key, "
            "bool need_dx, bool fused_dw) -> (Tensor, Tensor[], Tensor[], Tensor[])")


def _fused_mlp_cpu(x, weights, biases, key, save):
    spec = _spec(key)
    _check_args("fused_mlp", x, weights, biases, spec)
    return _forward_math(x, weights, biases, spec, save)


def _fused_mlp_cuda(x, weights, biases, key, save):
    spec = _spec(key)
    _check_args("fused_mlp", x, weights, biases, spec)
    if x.dtype not in _CUDA_DTYPES:
        _warn_torch_path(x.dtype)
        return _forward_math(x, weights, biases, spec, save)
    kern = _kernel(key, x.dtype, x.device, forward=True)
    M = x.shape[0]
    x = _aligned(x)
    weights = [_aligned(w) for w in weights]
    biases = [None if b is None else b.contiguous() for b in biases]
    y = x.new_empty((M, spec.out_features))
    L = len(spec.layers)
    zs, acts = _saved_buffers(x, spec) if save else ([], [])
    arr = ctypes.c_void_p * L
    wp = arr(*[w.data_ptr() for w in weights])
    bp = arr(*[0 if b is None else b.data_ptr() for b in biases])
    zp = arr(*[t.data_ptr() if t.numel() else 0 for t in zs]) if save else arr()
    ap = arr(*([t.data_ptr() for t in acts] + [0])) if save else arr()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    kern._check(kern.lib.fmlp_fwd(kern.device_index, x.data_ptr(), y.data_ptr(), wp, bp, zp, ap, M,
                                  int(save), stream), "launch (forward)")
    return y, zs + acts


@torch.library.register_fake("cutlass_ops::fused_mlp", lib=_LIB)
def _fused_mlp_fake(x, weights, biases, key, save):
    spec = _spec(key)
    torch._check(x.dim() == 2, lambda: "fused_mlp: x must be 2-D")
    M = x.shape[0]
    y = x.new_empty((M, spec.out_features))
    if not save:
        return y, []
    zs, acts = _saved_buffers(x, spec)
    return y, zs + acts


# ---------------------------------------------------------------------------------------------
# Backward op: dx, each layer's dz (the weight gradients are GEMMs over the batch, below) and
# bias gradient (float32; empty for a layer without bias)
# ---------------------------------------------------------------------------------------------

def _backward_math(grad_y, x, weights, saved, spec: MlpSpec, need_dx: bool, fused_dw: bool = False):
    """The backward in torch ops, any device (as _forward_math).  fused_dw: return the weight
    gradients (float32 / float64, as the fused kernel) and empty dz, as the op's contract says."""
    L = len(spec.layers)
    ct = _compute_dtype(x.dtype)
    g = grad_y.to(ct)
    dzs, dbs, dws = [None] * L, [None] * L, [None] * L
    inputs = _layer_inputs(x, saved, spec) if fused_dw else None
    for i in reversed(range(L)):
        layer = spec.layers[i]
        if spec.saves_pre_activation(i):
            z = saved[i][:, :layer.out_features].to(ct)
            dz = (g * to_torch(diff(layer.activation.tree), z)).to(x.dtype)
        else:  # the derivative from the saved activation (as the kernel's bwd_act<FROM_OUT>)
            y = saved[L + i][:, :layer.out_features].to(ct)
            dz = (g * to_torch(layer.activation.grad_from_output, y)).to(x.dtype)
        dzs[i] = _pad_cols(dz, layer.out_padded)
        # the bias gradient in the compute dtype (float32, float64 for float64)
        dbs[i] = dz.to(ct).sum(0) if layer.bias else x.new_empty((0,), dtype=ct)
        if fused_dw:
            dws[i] = dz.to(ct).t() @ inputs[i].to(ct)
            dzs[i] = x.new_empty((0,))
        else:
            dws[i] = x.new_empty((0,), dtype=ct)
        if i > 0 or need_dx:
            g = (dz.to(ct) @ weights[i].to(ct)).to(x.dtype).to(ct)
    dx = g.to(x.dtype) if need_dx else x.new_empty((0,))
    return dx, dzs, dbs, dws


def _fused_mlp_backward_cpu(grad_y, x, weights, saved, key, need_dx, fused_dw):
    spec = _spec(key)
    _check_saved(grad_y, x, saved, spec)
    return _backward_math(grad_y, x, weights, saved, spec, need_dx, fused_dw)


def _check_saved(grad_y, x, saved, spec):
    L = len(spec.layers)
    M = x.shape[0]
    if len(saved) != 2 * L - 1:
        raise ValueError(f"fused_mlp_backward: expected {2 * L - 1} saved tensors (the forward with "
                         f"save=True), got {len(saved)}")
    if tuple(grad_y.shape) != (M, spec.out_features) or grad_y.dtype != x.dtype or grad_y.device != x.device:
        raise ValueError(f"fused_mlp_backward: grad_y must be ({M}, {spec.out_features}) {x.dtype} on "
                         f"{x.device}, got {tuple(grad_y.shape)} {grad_y.dtype} on {grad_y.device}")


def _backward_kernels(grad_y, x, weights, saved, key, need_dx, fused_dw):
    """The backward on CUDA in float16/bfloat16: (dx, dzs, db, dw) with db and dw flat float32
    sums of the kernel's partials (mlp_emit.partial_layout: every layer's in one row; None where
    no layer has a bias, or where the weight gradients are GEMMs: dzs are then layer i's dz, else
    empty).  One reduction per kind over all layers, rather than one per layer: fewer launches,
    less host time."""
    spec = _spec(key)
    kern = _kernel(key, x.dtype, x.device)
    M = x.shape[0]
    L = len(spec.layers)
    x = _aligned(x)
    grad_y = _aligned(grad_y)
    weights = [_aligned(w) for w in weights]
    # per layer what bwd_act reads: z, or the activation where its derivative comes from it
    zs = [_aligned(saved[i] if spec.saves_pre_activation(i) else saved[L + i]) for i in range(L)]
    dx = x.new_empty((M, spec.in_features)) if need_dx else x.new_empty((0,))
    db_offsets, db_stride, dw_offsets, dw_stride = _partial_layout(key)
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
        kern._check(kern.lib.fmlp_bwd_dw_ctas(kern.device_index, M, ctypes.byref(ctas)), "grid (backward, fused dW)")
        # one float32 partial of every dW per CTA, summed below in a fixed order (deterministic)
        dw_parts = x.new_empty((max(ctas.value, 1), dw_stride), dtype=torch.float32)
        acts = [_aligned(saved[L + i]) if i < L - 1 else x for i in range(L)]
        kern._check(kern.lib.fmlp_bwd_dw(kern.device_index, grad_y.data_ptr(), dx_ptr, x.data_ptr(),
                                         arr(*[t.data_ptr() for t in zs]), arr(*[t.data_ptr() for t in acts]),
                                         arr(*[w.data_ptr() for w in weights]),
                                         arr(*[dw_parts.data_ptr() + 4 * o for o in dw_offsets]), db_ptrs, M, stream),
                    "launch (backward, fused dW)")
        dw = dw_parts.sum(0) if M > 0 else dw_parts.new_zeros((dw_stride,))
        dzs = []
    else:
        dzs = [x.new_empty((M, l.out_padded)) for l in spec.layers]
        kern._check(kern.lib.fmlp_bwd(kern.device_index, grad_y.data_ptr(), dx_ptr,
                                      arr(*[t.data_ptr() for t in zs]), arr(*[w.data_ptr() for w in weights]),
                                      arr(*[t.data_ptr() for t in dzs]), db_ptrs, M, stream),
                    "launch (backward)")
    db = None if db_parts is None else (db_parts.sum(0) if M > 0 else db_parts.new_zeros((db_stride,)))
    return dx, dzs, db, dw


_LAYOUTS: dict[str, tuple] = {}


def _partial_layout(key: str) -> tuple:
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _LAYOUTS[key] = mlp_emit.partial_layout(_spec(key))
    return layout


def _fused_mlp_backward_cuda(grad_y, x, weights, saved, key, need_dx, fused_dw):
    spec = _spec(key)
    _check_saved(grad_y, x, saved, spec)
    if x.dtype not in _CUDA_DTYPES:
        return _backward_math(grad_y, x, weights, saved, spec, need_dx, fused_dw)
    dx, dzs, db, dw = _backward_kernels(grad_y, x, weights, saved, key, need_dx, fused_dw)
    # the op's outputs per layer, each its own tensor (the eager path, _FusedMLPFunction, keeps
    # views of the flat sums instead)
    gb, gw = _layer_views(key, db, dw)
    dbs = [x.new_empty((0,), dtype=torch.float32) if b is None else b.clone() for b in gb]
    if gw is not None:  # the kernel computed them
        dws = [w.clone() for w in gw]
        dzs = [x.new_empty((0,)) for _ in spec.layers]
    else:
        dws = [x.new_empty((0,), dtype=torch.float32) for _ in spec.layers]
        if fused_dw:  # asked for, but this model's kernel has none: the GEMMs here, same contract
            dws = [_weight_grad(dz[:, :l.out_features], a, round_to_dtype=False)
                   for dz, a, l in zip(dzs, _layer_inputs(x, saved, spec), spec.layers)]
            dzs = [x.new_empty((0,)) for _ in spec.layers]
    return dx, dzs, dbs, dws


@torch.library.register_fake("cutlass_ops::fused_mlp_backward", lib=_LIB)
def _fused_mlp_backward_fake(grad_y, x, weights, saved, key, need_dx, fused_dw):
    spec = _spec(key)
    M = x.shape[0]
    dx = x.new_empty((M, spec.in_features)) if need_dx else x.new_empty((0,))
    bt = _compute_dtype(x.dtype)
    dzs = [x.new_empty((0,) if fused_dw else (M, l.out_padded)) for l in spec.layers]
    dws = [x.new_empty((l.out_features, l.in_features) if fused_dw else (0,), dtype=bt) for l in spec.layers]
    return dx, dzs, [x.new_empty((l.out_features if l.bias else 0,), dtype=bt) for l in spec.layers], dws


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    x, weights, biases, key, save = inputs
    _, saved = output
    ctx.key = key
    ctx.n_layers = len(weights)
    ctx.has_bias = [b is not None for b in biases]
    ctx.saved_forward = bool(save)
    ctx.save_for_backward(x, *weights, *saved)
    # the saved intermediates are outputs nobody differentiates: without this, autograd fills a
    # zero gradient for each (2L - 1 tensors the size of the activations: 0.7 ms at 2^21 rows)
    ctx.set_materialize_grads(False)


def _weight_grad(dz: torch.Tensor, a_prev: torch.Tensor, round_to_dtype: bool = True) -> torch.Tensor:
    """dW = dz^T a_prev, a sum over the batch, with a float32-output GEMM on CUDA (rounded to the
    dtype once; round_to_dtype=False: left in float32, as the fused kernel returns it).  How far a 16-bit dW is from float64 depends on cancellation in the sum more
    than on this GEMM: for a 1 -> 1 bf16 tanh layer over 20011 rows on an H100, dW was 12% off
    float64 here and 0.75% in PyTorch, and 5% with PyTorch's formula applied in float64 to its own
    rounded dz (tests/python/test_fused_mlp.py::_check_grads measures on the summands' scale)."""
    dz = dz.contiguous()
    a_prev = a_prev.contiguous()
    if dz.is_cuda and dz.dtype in _CUDA_DTYPES:
        dw = torch.mm(dz.t(), a_prev, out_dtype=torch.float32)
        return dw.to(dz.dtype) if round_to_dtype else dw
    return dz.t() @ a_prev


def _backward(ctx, grad_y, grad_saved):
    if not ctx.saved_forward:
        raise RuntimeError("fused_mlp: backward through a call made with save=False (FusedMLP saves "
                           "the intermediates when grad mode is on and an input or parameter requires grad)")
    spec = _spec(ctx.key)
    L = ctx.n_layers
    x, weights, saved = ctx.saved_tensors[0], ctx.saved_tensors[1:1 + L], ctx.saved_tensors[1 + L:]
    need_dx = ctx.needs_input_grad[0]
    if grad_y is None:  # y unused (set_materialize_grads(False) above)
        grad_y = x.new_zeros((x.shape[0], spec.out_features))
    fused_dw = _fused_weight_grads(ctx.key, x)
    dx, dzs, dbs, dws = torch.ops.cutlass_ops.fused_mlp_backward(grad_y.contiguous(), x, list(weights), list(saved),
                                                                 ctx.key, need_dx, fused_dw)
    gw, gb = [], []
    inputs = None if fused_dw else _layer_inputs(x, saved, spec)
    for i, layer in enumerate(spec.layers):
        if fused_dw:
            gw.append(dws[i].to(x.dtype))
        else:
            gw.append(_weight_grad(dzs[i][:, :layer.out_features], inputs[i]))
        gb.append(dbs[i].to(x.dtype) if ctx.has_bias[i] else None)
    # a list of Nones is one pytree leaf to autograd's input spec: its gradient is one None
    return (dx if need_dx else None), gw, (gb if any(ctx.has_bias) else None), None, None


class _FusedMLPFunction(torch.autograd.Function):
    """FusedMLP's eager CUDA path with grad: the same kernels and math as the registered ops,
    called directly.  The ops' Python round trips (the dispatcher's boxing of the tensor lists,
    register_autograd's pytree wrappers) and one reduction and cast per layer made a training
    step of 32-64x4-16 cost 1.6 ms of host time on an H100 against eager PyTorch's 0.9-1.1
    (docs/results/mlp_h100_session17/), more than its kernels take at 2^21 rows; here the bias
    and weight gradients come out of one sum and one cast each.  torch.compile (and
    CUTLASS_OPS_MLP_EAGER_OPS=1) runs the ops instead.  Inputs: x, the key, then the weights and
    the biases (None for a layer without)."""

    @staticmethod
    def forward(ctx, x, key, *params):
        L = len(params) // 2
        weights, biases = params[:L], params[L:]
        y, saved = _fused_mlp_cuda(x, weights, biases, key, True)
        ctx.key = key
        ctx.save_for_backward(x, *weights, *saved)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # as the op's: no double backward
    def backward(ctx, grad_y):
        key = ctx.key
        spec = _spec(key)
        L = len(spec.layers)
        x, weights, saved = ctx.saved_tensors[0], ctx.saved_tensors[1:1 + L], ctx.saved_tensors[1 + L:]
        need_dx = ctx.needs_input_grad[0]
        fused_dw = _fused_weight_grads(key, x)
        dx, dzs, db, dw = _backward_kernels(grad_y.contiguous(), x, weights, saved, key, need_dx, fused_dw)
        # one cast each for every layer's bias and (fused) weight gradients, then views
        gb, gw = _layer_views(key, None if db is None else db.to(x.dtype), None if dw is None else dw.to(x.dtype))
        if gw is None:
            gw = [_weight_grad(dz[:, :l.out_features], a)
                  for dz, a, l in zip(dzs, _layer_inputs(x, saved, spec), spec.layers)]
        return (dx if need_dx else None), None, *gw, *gb


def _eager_kernel_path(x: torch.Tensor) -> bool:
    """Whether FusedMLP.forward calls _FusedMLPFunction rather than the op: eager (not under
    torch.compile), a plain tensor (subclasses and modes see the op), unless
    CUTLASS_OPS_MLP_EAGER_OPS=1."""
    return (not torch.compiler.is_compiling() and type(x) is torch.Tensor
            and os.environ.get("CUTLASS_OPS_MLP_EAGER_OPS", "0") != "1")


for _op, _cpu, _cuda in (("fused_mlp", _fused_mlp_cpu, _fused_mlp_cuda),
                         ("fused_mlp_backward", _fused_mlp_backward_cpu, _fused_mlp_backward_cuda)):
    _LIB.impl(_op, _cpu, "CPU")
    _LIB.impl(_op, _cuda, "CUDA")
torch.library.register_autograd("cutlass_ops::fused_mlp", _backward, setup_context=_setup_context, lib=_LIB)


def fused_mlp(x: torch.Tensor, weights, biases, key: str, save: bool = False):
    """``torch.ops.cutlass_ops.fused_mlp`` returning ``y`` only (x: (M, in_features))."""
    return torch.ops.cutlass_ops.fused_mlp(x, list(weights), list(biases), key, save)[0]


# ---------------------------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------------------------

# The widest layer FusedMLP's kernel runs by default.  On an H200 (2026-11-26, fp16) every model
# with a 256-wide layer measured slower as one kernel than as PyTorch's own ops: SIREN
# 3-256x4-1 at 2^21 rows 24.7 ms (streamed weights) against eager's 7.4 (training step 65.2
# against 22.8), CvT-13 stage 1's 64-256-64 MLP at 200,704 rows 332 us (resident, 4 warps a
# CTA) against 145 for cuBLAS + SiLU; every model no wider than 128 measured faster.
KERNEL_MAX_WIDTH = 128


def runs_torch_ops(spec: MlpSpec, device_type: str, dtype: torch.dtype) -> bool:
    """Whether FusedMLP's forward runs the model as PyTorch's ops (F.linear and the traced
    activations in the input's dtype: what the user's module does in eager) instead of its
    kernel: on CUDA in float16/bfloat16 for a model with a layer wider than KERNEL_MAX_WIDTH,
    unless CUTLASS_OPS_MLP_WIDE=kernel (read per call) asks for the kernel anyway."""
    if device_type != "cuda" or dtype not in _CUDA_DTYPES or os.environ.get("CUTLASS_OPS_MLP_WIDE", "torch") == "kernel":
        return False
    return max(max(l.in_features, l.out_features) for l in spec.layers) > KERNEL_MAX_WIDTH


def torch_layers(x: torch.Tensor, weights, biases, spec: MlpSpec) -> torch.Tensor:
    """The model as PyTorch ops in x's dtype (runs_torch_ops): F.linear per layer, then its traced
    activation; autograd as PyTorch's."""
    a = x
    for layer, w, b in zip(spec.layers, weights, biases):
        a = to_torch(layer.activation.tree, F.linear(a, w, b))
    return a


class FusedMLP(nn.Module):
    """A traced MLP as one fused kernel per pass (see the module docstring).

    Parameters ``weight_<i>`` / ``bias_<i>`` (nn.Linear layouts; ``bias_<i>`` is None for a layer
    without bias); ``spec`` is the traced ``MlpSpec`` (``spec.layers[i].name`` names the original
    Linear).  Input (..., in_features) in the parameters' dtype and device, any number of rows
    (0 too).  On CUDA the fused kernel runs float16 and bfloat16; float32/float64 run the same
    math as torch ops (correct, not fused; a one-time warning says so), as on the CPU.  A model
    with a layer wider than KERNEL_MAX_WIDTH (128) runs as PyTorch's own ops on CUDA, where they
    measured faster than the kernel (``runs_torch_ops``; ``CUTLASS_OPS_MLP_WIDE=kernel`` forces
    the kernel); ``uses_kernel(x)`` says which path an input takes.
    """

    def __init__(self, spec: MlpSpec, weights, biases):
        super().__init__()
        self.spec = spec
        self.key = register_spec(spec)
        self.n_layers = len(spec.layers)
        for i, (w, b) in enumerate(zip(weights, biases)):
            self.register_parameter(f"weight_{i}", nn.Parameter(w))
            self.register_parameter(f"bias_{i}", None if b is None else nn.Parameter(b))

    @classmethod
    def from_module(cls, model: nn.Module, example_input: Optional[torch.Tensor] = None) -> "FusedMLP":
        """Trace ``model`` and copy its Linear weights (same dtype and device as the model's)."""
        spec = trace_mlp(model, example_input)
        mods = dict(model.named_modules())
        ws = [mods[l.name].weight.detach().clone() for l in spec.layers]
        bs = [mods[l.name].bias.detach().clone() if l.bias else None for l in spec.layers]
        return cls(spec, ws, bs)

    @property
    def weights(self) -> list:
        return [getattr(self, f"weight_{i}") for i in range(self.n_layers)]

    @property
    def biases(self) -> list:
        return [getattr(self, f"bias_{i}") for i in range(self.n_layers)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != self.spec.in_features:
            raise ValueError(f"FusedMLP: input must have shape (..., {self.spec.in_features}), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        lead = x.shape[:-1]
        weights, biases = self.weights, self.biases
        if runs_torch_ops(self.spec, x.device.type, x.dtype):
            return torch_layers(x, weights, biases, self.spec)
        save = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        x2 = x.reshape(-1, self.spec.in_features)
        if x.is_cuda and x.dtype in _CUDA_DTYPES and _eager_kernel_path(x):
            y = (_FusedMLPFunction.apply(x2, self.key, *weights, *biases) if save
                 else _fused_mlp_cuda(x2, weights, biases, self.key, False)[0])
        else:
            y, _ = torch.ops.cutlass_ops.fused_mlp(x2, weights, biases, self.key, save)
        return y.reshape(*lead, self.spec.out_features)

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """Whether forward(x) runs the fused kernel (CUDA, float16/bfloat16, no layer wider than
        KERNEL_MAX_WIDTH or CUTLASS_OPS_MLP_WIDE=kernel); else PyTorch ops."""
        return (x.device.type == "cuda" and x.dtype in _CUDA_DTYPES
                and not runs_torch_ops(self.spec, x.device.type, x.dtype))

    def compile_kernel(self, dtype: Optional[torch.dtype] = None, device=None, inference: bool = False) -> dict:
        """Compile (or load from the cache) the CUDA kernels now; returns ``kernel_info``'s entry
        of the backward's kernel (training: the forwards' kernel is made ready too), or with
        inference=True of the forwards' (the same kernel unless the in-place shape applies to
        the forward only: _inplace_allowed)."""
        p = self.weight_0
        dtype = dtype or p.dtype
        device = torch.device(device) if device is not None else p.device
        if dtype not in _CUDA_DTYPES or device.type != "cuda":
            raise ValueError(f"FusedMLP kernels are for float16/bfloat16 on CUDA, not {dtype} on {device}")
        forward = _kernel(self.key, dtype, device, forward=True)
        return forward.info() if inference else _kernel(self.key, dtype, device).info()

    def kernel_info(self) -> list[dict]:
        return kernel_info(self.key)

    def extra_repr(self) -> str:
        return self.spec.structure_key()
