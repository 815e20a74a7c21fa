"""Run-time options of the models: ``FusedCvT(..., options=CvTOptions(...))`` and
``FusedMLP(..., options=MlpOptions(...))``.

Each field says which path the model takes where the project has more than one (a fused kernel
of this project, or the PyTorch path it replaces).  A field left out takes its default from an
environment variable, read once when the options object is made (not per call); without the
variable, the default below.  docs/options.md lists every option and environment variable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

__all__ = ["CvTOptions", "MlpOptions", "env_default"]


def env_default(name: str, default, parse: Callable[[str], object] = str):
    """A dataclass field defaulting to ``parse(os.environ[name])``, or ``default`` where the
    variable is unset or empty; read when the options object is made."""
    def read():
        raw = os.environ.get(name, "")
        return default if raw == "" else parse(raw)
    return field(default_factory=read, metadata={"env": name})


def _not_zero(raw: str) -> bool:
    return raw != "0"


@dataclass(frozen=True)
class CvTOptions:
    """Which of FusedCvT's fused kernels run.  Each is on by default (each was timed faster than
    the path it replaces); off, FusedCvT runs that part as PyTorch (ATen, cuDNN, cuBLAS) does,
    which stays the path wherever the kernel does not apply (CPU, float32/64, autograd on, ...).

    fused_layer_norm: the blocks' and embeddings' LayerNorms, with the residual add before each,
        as one ``layer_norm_rows`` kernel (forward and backward).  $CUTLASS_OPS_CVT_FUSED_LN=0: off.
    conv_embed: with autograd off, stage 1's 7x7/4 embedding from the image, its bias and its
        LayerNorm as one ``conv_embed`` kernel.  $CUTLASS_OPS_CVT_CONV_EMBED=0: off.
    dw_tokens: each attention's three depthwise q/k/v convs as one ``dw_conv3x3_tokens`` call
        (eval with autograd off: BatchNorm folded in; training on CUDA: before the real
        BatchNorms, the input gradients in one kernel).  $CUTLASS_OPS_CVT_DW_TOKENS=0: off.
    residual_gemm: on CUDA with autograd off, each block's output projection and fc2 add onto
        the residual stream in the GEMM's epilogue (``linear_residual``).
        $CUTLASS_OPS_CVT_RESIDUAL_GEMM=0: off.
    linear_silu: on sm90 with autograd off, each MLP's fc1 and its SiLU as one ``linear_silu``
        kernel, where the build holds one for the dtype.  $CUTLASS_OPS_CVT_LINEAR_SILU=0: off.
    """
    fused_layer_norm: bool = env_default("CUTLASS_OPS_CVT_FUSED_LN", True, _not_zero)
    conv_embed: bool = env_default("CUTLASS_OPS_CVT_CONV_EMBED", True, _not_zero)
    dw_tokens: bool = env_default("CUTLASS_OPS_CVT_DW_TOKENS", True, _not_zero)
    residual_gemm: bool = env_default("CUTLASS_OPS_CVT_RESIDUAL_GEMM", True, _not_zero)
    linear_silu: bool = env_default("CUTLASS_OPS_CVT_LINEAR_SILU", True, _not_zero)


@dataclass(frozen=True)
class MlpOptions:
    """FusedMLP's choices.

    fused_weight_grads: the backward kernel computes the weight gradients itself where the
        model's kernel has them (resident weights whose dW fits in registers); False: the kernel
        writes dz and the weight gradients are float32-output GEMMs over the batch (the path of
        every other model).  $CUTLASS_OPS_MLP_FUSED_DW=0: False.
    wide_kernel: run the fused kernel for models with a layer wider than 128 too (by default
        those run as PyTorch's own ops on CUDA, which measured faster there).
        $CUTLASS_OPS_MLP_WIDE=kernel: True.
    cache_dir: the root of the JIT cache; kernels go to ``<cache_dir>/mlp/<hash>``.  None:
        ``$XDG_CACHE_HOME/cutlass_ops`` (default ``~/.cache/cutlass_ops``).  $CUTLASS_OPS_CACHE.
    nvcc: the nvcc that compiles a model's kernel at first use.  None: $CUDACXX, nvcc on PATH,
        then ``$CUDA_HOME/bin/nvcc`` (default ``/usr/local/cuda``).  $CUTLASS_OPS_NVCC.
    compiler: what compiles a model's kernel that the package does not hold ahead of time:
        ``auto`` (nvcc where found, else NVRTC: libnvrtc from torch's NVIDIA wheels or the
        system CUDA, so a machine without a CUDA toolkit runs new models too), ``nvcc`` or
        ``nvrtc`` (that one only).  $CUTLASS_OPS_MLP_COMPILER.
    """
    fused_weight_grads: bool = env_default("CUTLASS_OPS_MLP_FUSED_DW", True, _not_zero)
    wide_kernel: bool = env_default("CUTLASS_OPS_MLP_WIDE", False, lambda raw: raw == "kernel")
    cache_dir: Optional[str] = env_default("CUTLASS_OPS_CACHE", None)
    nvcc: Optional[str] = env_default("CUTLASS_OPS_NVCC", None)
    compiler: str = env_default("CUTLASS_OPS_MLP_COMPILER", "auto")

    def __post_init__(self):
        if self.compiler not in ("auto", "nvcc", "nvrtc"):
            raise ValueError(f"MlpOptions.compiler (or $CUTLASS_OPS_MLP_COMPILER) must be auto, nvcc or nvrtc, "
                             f"not {self.compiler!r}")
