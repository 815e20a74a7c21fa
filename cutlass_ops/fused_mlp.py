"""FusedMLP: a PyTorch MLP run as one generated CUDA kernel per pass.

    fused = cutlass_ops.FusedMLP.from_module(model, example_input)   # model: a chain of nn.Linear
    y = fused(x)                                                      # x: (..., in_features)

``from_module`` traces the model (``cutlass_ops_gen.mlp.trace_mlp``: nn.Linear layers of width
1..256, bias or not, elementwise activations between and after them) and copies its weights.  On
CUDA (float16 / bfloat16, sm_80 or newer) the first call for a dtype and GPU arch generates the
model's CUDA source and compiles it with nvcc, or with NVRTC where there is no nvcc (or loads
it from the cache, or from the kernels built with the package: ``mlp_jit``, ``mlp_build``);
``kernel_info()`` reports the compiler and the compile and load times.
Models with a layer wider than 128 run as PyTorch's own ops on CUDA by default
(``KERNEL_MAX_WIDTH``; ``MlpOptions.wide_kernel`` sends them to the kernel).  The ops and their
autograd: ``torch.ops.cutlass_ops.fused_mlp`` / ``fused_mlp_backward`` (``ops.fused_mlp``).

The kernel (``cutlass_ops_gen/mlp_kernel.cuh``): per layer a warp-level tensor-core GEMM
(``mma.sync.m16n8k16``, fp32 accumulation) from shared memory, bias and activation in the
epilogue, the result back into shared memory as the next layer's input in x's dtype; only y
(and, for training, the saved intermediates) is written to global memory.  The weights stay
resident in shared memory where they fit, else stream through it per 128-row CTA.  Widths are
padded to multiples of 8 inside (zero-filled).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from cutlass_ops_gen.mlp_spec import MlpSpec, to_torch, trace_mlp

from .ops.fused_mlp import _FusedMLPFunction, _fused_mlp_cuda
from .mlp_jit import CUDA_DTYPES, kernel, kernel_info, register_spec
from .options import MlpOptions

__all__ = ["FusedMLP", "KERNEL_MAX_WIDTH", "runs_torch_ops", "torch_layers"]

# The widest layer FusedMLP's kernel runs by default.  On an H200 (fp16) every model with a
# 256-wide layer measured slower as one kernel than as PyTorch's own ops (SIREN 3-256x4-1 at
# 2^21 rows: 24.7 ms streamed against eager's 7.4; CvT-13 stage 1's 64-256-64 MLP at 200,704
# rows: 332 us against 145 for cuBLAS + SiLU); every model no wider than 128 measured faster.
KERNEL_MAX_WIDTH = 128


def runs_torch_ops(spec: MlpSpec, device_type: str, dtype: torch.dtype, wide_kernel: bool = False) -> bool:
    """Whether FusedMLP's forward runs the model as PyTorch's ops (F.linear and the traced
    activations in the input's dtype: what the user's module does in eager) instead of its
    kernel: on CUDA in float16/bfloat16 for a model with a layer wider than KERNEL_MAX_WIDTH,
    unless ``wide_kernel`` (MlpOptions.wide_kernel) asks for the kernel anyway."""
    if device_type != "cuda" or dtype not in CUDA_DTYPES or wide_kernel:
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
    Linear); ``options`` an ``MlpOptions`` (None: its defaults, from the environment when made;
    assigning ``options`` later takes effect at the next call).  Input (..., in_features) in the
    parameters' dtype and device, any number of rows (0 too).  On CUDA the fused kernel runs
    float16 and bfloat16; float32/float64 run the same math as torch ops (correct, not fused; a
    one-time warning says so), as on the CPU.  A model with a layer wider than KERNEL_MAX_WIDTH
    (128) runs as PyTorch's own ops on CUDA, where they measured faster than the kernel
    (``runs_torch_ops``; ``MlpOptions(wide_kernel=True)`` forces the kernel); ``uses_kernel(x)``
    says which path an input takes.
    """

    def __init__(self, spec: MlpSpec, weights, biases, options: Optional[MlpOptions] = None):
        super().__init__()
        self.spec = spec
        self.n_layers = len(spec.layers)
        self.options = options if options is not None else MlpOptions()
        for i, (w, b) in enumerate(zip(weights, biases)):
            self.register_parameter(f"weight_{i}", nn.Parameter(w))
            self.register_parameter(f"bias_{i}", None if b is None else nn.Parameter(b))

    @property
    def options(self) -> MlpOptions:
        return self._options

    @options.setter
    def options(self, options: MlpOptions) -> None:
        if not isinstance(options, MlpOptions):
            raise TypeError(f"FusedMLP: options must be an MlpOptions, got {type(options).__name__}")
        self._options = options
        self.key = register_spec(self.spec, options)  # the ops find the options by the key

    @classmethod
    def from_module(cls, model: nn.Module, example_input: Optional[torch.Tensor] = None,
                    options: Optional[MlpOptions] = None) -> "FusedMLP":
        """Trace ``model`` and copy its Linear weights (same dtype and device as the model's)."""
        spec = trace_mlp(model, example_input)
        mods = dict(model.named_modules())
        ws = [mods[l.name].weight.detach().clone() for l in spec.layers]
        bs = [mods[l.name].bias.detach().clone() if l.bias else None for l in spec.layers]
        return cls(spec, ws, bs, options)

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
        if runs_torch_ops(self.spec, x.device.type, x.dtype, self._options.wide_kernel):
            return torch_layers(x, weights, biases, self.spec)
        save = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))
        x2 = x.reshape(-1, self.spec.in_features)
        if x.is_cuda and x.dtype in CUDA_DTYPES and _eager_kernel_path(x):
            y = (_FusedMLPFunction.apply(x2, self.key, *weights, *biases) if save
                 else _fused_mlp_cuda(x2, weights, biases, self.key, False)[0])
        else:
            y, _ = torch.ops.cutlass_ops.fused_mlp(x2, weights, biases, self.key, save)
        return y.reshape(*lead, self.spec.out_features)

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """Whether forward(x) runs the fused kernel (CUDA, float16/bfloat16, no layer wider than
        KERNEL_MAX_WIDTH or MlpOptions.wide_kernel); else PyTorch ops."""
        return (x.device.type == "cuda" and x.dtype in CUDA_DTYPES
                and not runs_torch_ops(self.spec, x.device.type, x.dtype, self._options.wide_kernel))

    def compile_kernel(self, dtype: Optional[torch.dtype] = None, device=None, inference: bool = False) -> dict:
        """Compile (or load from the cache) the CUDA kernels now; returns ``kernel_info``'s entry
        of the backward's kernel (training: the forwards' kernel is made ready too), or with
        inference=True of the forwards' (the same kernel unless the in-place shape applies to
        the forward only: mlp_jit.config)."""
        p = self.weight_0
        dtype = dtype or p.dtype
        device = torch.device(device) if device is not None else p.device
        if dtype not in CUDA_DTYPES or device.type != "cuda":
            raise ValueError(f"FusedMLP kernels are for float16/bfloat16 on CUDA, not {dtype} on {device}")
        forward = kernel(self.key, dtype, device, forward=True)
        return forward.info() if inference else kernel(self.key, dtype, device).info()

    def kernel_info(self) -> list[dict]:
        return kernel_info(self.key)

    def extra_repr(self) -> str:
        return self.spec.structure_key()


def _eager_kernel_path(x: torch.Tensor) -> bool:
    """Whether FusedMLP.forward calls _FusedMLPFunction rather than the op: eager (not under
    torch.compile) and a plain tensor (subclasses and modes see the op)."""
    return not torch.compiler.is_compiling() and type(x) is torch.Tensor
