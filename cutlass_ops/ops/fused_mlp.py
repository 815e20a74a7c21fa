"""The fused MLP ops (``torch.ops.cutlass_ops``): registration, fake impls for torch.compile,
the CPU math, and autograd.

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
  Autograd asks for ``fused_dw`` where the model's kernel has it and the model's options
  (``MlpOptions.fused_weight_grads``) allow it.
- CPU impls: the kernel's math and rounding points in float32 (float64 for float64 inputs);
  float32/float64 on CUDA run the same math.

``_FusedMLPFunction`` is FusedMLP's eager CUDA path with grad: the same kernels, called without
the ops' Python round trips.  The kernels and their launches: ``mlp_jit``.
"""
from __future__ import annotations

import torch

from cutlass_ops_gen.mlp_spec import MlpSpec, diff, to_torch

from .. import paths
from ..mlp_jit import (CUDA_DTYPES, config, device_index, launch_backward, launch_forward, options_of,
                      partial_layout, saved_buffers, spec_of)

__all__ = ["fused_mlp"]


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


def _check_saved(grad_y, x, saved, spec):
    L = len(spec.layers)
    M = x.shape[0]
    if len(saved) != 2 * L - 1:
        raise ValueError(f"fused_mlp_backward: expected {2 * L - 1} saved tensors (the forward with "
                         f"save=True), got {len(saved)}")
    if tuple(grad_y.shape) != (M, spec.out_features) or grad_y.dtype != x.dtype or grad_y.device != x.device:
        raise ValueError(f"fused_mlp_backward: grad_y must be ({M}, {spec.out_features}) {x.dtype} on "
                         f"{x.device}, got {tuple(grad_y.shape)} {grad_y.dtype} on {grad_y.device}")


def _pad_cols(t: torch.Tensor, width: int) -> torch.Tensor:
    out = t.new_zeros((t.shape[0], width))
    out[:, :t.shape[1]] = t
    return out


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# The math in torch ops (CPU; CUDA in float32/float64)
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


def _layer_inputs(x, saved, spec: MlpSpec) -> list:
    """Each layer's input, what its weight gradient multiplies: x, then the saved hidden
    activations (a forward with save=True) less their padding columns."""
    L = len(spec.layers)
    return [x] + [saved[L + i][:, :l.out_features] for i, l in enumerate(spec.layers[:-1])]


def _layer_views(key: str, db, dw) -> tuple[list, list]:
    """The flat sums of launch_backward as per-layer views: the bias gradients (None for a
    layer without bias) and, where dw is given, the (out, in) weight gradients."""
    spec = spec_of(key)
    db_offsets, _, dw_offsets, _ = partial_layout(key)
    gb = [None if o is None else db[o:o + l.out_features] for o, l in zip(db_offsets, spec.layers)]
    gw = None if dw is None else [dw[o:o + l.out_features * l.in_features].view(l.out_features, l.in_features)
                                  for o, l in zip(dw_offsets, spec.layers)]
    return gb, gw


def _report_path(op: str, x: torch.Tensor) -> None:
    """The path report of a CUDA call (cutlass_ops.paths): the kernel takes float16/bfloat16;
    other dtypes run the same math as torch ops (correct, not fused): a fallback.  No rows:
    "empty" (nothing to compute)."""
    if not paths.recording(x):
        return
    if x.shape[0] == 0:
        paths.record(op, paths.EMPTY)
    elif x.dtype in CUDA_DTYPES:
        paths.record(op)
    else:
        paths.fallback(op, f"{str(x.dtype).replace('torch.', '')} input (the kernel takes float16/bfloat16; "
                       "the same math runs as torch ops)", paths.describe(x=x))


# ---------------------------------------------------------------------------------------------
# The ops.  Defined with the low-level Library API, not torch.library.custom_op, whose per-call
# wrappers (an output-aliasing check over the tensor lists, a dynamo-disable frame) cost host
# time that a small training step notices; same schemas, autograd and fake impls.
# ---------------------------------------------------------------------------------------------
_LIB = torch.library.Library("cutlass_ops", "FRAGMENT")
_LIB.define("fused_mlp(Tensor x, Tensor[] weights, Tensor?[] biases, str key, bool save) -> (Tensor, Tensor[])")
_LIB.define("fused_mlp_backward(Tensor grad_y, Tensor x, Tensor[] weights, Tensor[] saved, str key, "
            "bool need_dx, bool fused_dw) -> (Tensor, Tensor[], Tensor[], Tensor[])")


def _fused_mlp_cpu(x, weights, biases, key, save):
    spec = spec_of(key)
    _check_args("fused_mlp", x, weights, biases, spec)
    return _forward_math(x, weights, biases, spec, save)


def _fused_mlp_cuda(x, weights, biases, key, save):
    spec = spec_of(key)
    _check_args("fused_mlp", x, weights, biases, spec)
    _report_path("fused_mlp", x)
    if x.dtype not in CUDA_DTYPES:
        return _forward_math(x, weights, biases, spec, save)
    return launch_forward(key, x, weights, biases, save)


@torch.library.register_fake("cutlass_ops::fused_mlp", lib=_LIB)
def _fused_mlp_fake(x, weights, biases, key, save):
    spec = spec_of(key)
    torch._check(x.dim() == 2, lambda: "fused_mlp: x must be 2-D")
    M = x.shape[0]
    y = x.new_empty((M, spec.out_features))
    if not save:
        return y, []
    zs, acts = saved_buffers(x, spec)
    return y, zs + acts


def _fused_mlp_backward_cpu(grad_y, x, weights, saved, key, need_dx, fused_dw):
    spec = spec_of(key)
    _check_saved(grad_y, x, saved, spec)
    return _backward_math(grad_y, x, weights, saved, spec, need_dx, fused_dw)


def _fused_mlp_backward_cuda(grad_y, x, weights, saved, key, need_dx, fused_dw):
    spec = spec_of(key)
    _check_saved(grad_y, x, saved, spec)
    _report_path("fused_mlp_backward", x)
    if x.dtype not in CUDA_DTYPES:
        return _backward_math(grad_y, x, weights, saved, spec, need_dx, fused_dw)
    dx, dzs, db, dw = launch_backward(key, grad_y, x, weights, saved, need_dx, fused_dw)
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
    spec = spec_of(key)
    M = x.shape[0]
    dx = x.new_empty((M, spec.in_features)) if need_dx else x.new_empty((0,))
    bt = _compute_dtype(x.dtype)
    dzs = [x.new_empty((0,) if fused_dw else (M, l.out_padded)) for l in spec.layers]
    dws = [x.new_empty((l.out_features, l.in_features) if fused_dw else (0,), dtype=bt) for l in spec.layers]
    return dx, dzs, [x.new_empty((l.out_features if l.bias else 0,), dtype=bt) for l in spec.layers], dws


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------

def _fused_weight_grads(key: str, x: torch.Tensor) -> bool:
    """Whether the backward computes the weight gradients in its kernel (resident models whose dW
    fits in registers, on CUDA in float16/bfloat16, MlpOptions.fused_weight_grads) rather than
    as GEMMs over saved dz.  Decided from the config alone (no compile), so a torch.compile
    trace with fake tensors decides the same."""
    if x.device.type != "cuda" or x.dtype not in CUDA_DTYPES or not options_of(key).fused_weight_grads:
        return False
    return config(key, device_index(x.device), forward=False).dw_warps > 0


def _setup_context(ctx, inputs, output):
    x, weights, biases, key, save = inputs
    _, saved = output
    ctx.key = key
    ctx.n_layers = len(weights)
    ctx.has_bias = [b is not None for b in biases]
    ctx.saved_forward = bool(save)
    ctx.save_for_backward(x, *weights, *saved)
    # the saved intermediates are outputs nobody differentiates: without this, autograd fills a
    # zero gradient for each (2L - 1 tensors the size of the activations)
    ctx.set_materialize_grads(False)


def _weight_grad(dz: torch.Tensor, a_prev: torch.Tensor, round_to_dtype: bool = True) -> torch.Tensor:
    """dW = dz^T a_prev, a sum over the batch, with a float32-output GEMM on CUDA (rounded to the
    dtype once; round_to_dtype=False: left in float32, as the fused kernel returns it).  How far
    a 16-bit dW is from float64 depends on cancellation in the sum more than on this GEMM
    (tests/python/test_fused_mlp.py::_check_grads measures on the summands' scale)."""
    dz = dz.contiguous()
    a_prev = a_prev.contiguous()
    if dz.is_cuda and dz.dtype in CUDA_DTYPES:
        dw = torch.mm(dz.t(), a_prev, out_dtype=torch.float32)
        return dw.to(dz.dtype) if round_to_dtype else dw
    return dz.t() @ a_prev


def _backward(ctx, grad_y, grad_saved):
    if not ctx.saved_forward:
        raise RuntimeError("fused_mlp: backward through a call made with save=False (FusedMLP saves "
                           "the intermediates when grad mode is on and an input or parameter requires grad)")
    spec = spec_of(ctx.key)
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
    register_autograd's pytree wrappers) and one reduction and cast per layer cost more host
    time than a small training step's kernels; here the bias and weight gradients come out of
    one sum and one cast each.  torch.compile (and tensor subclasses) run the ops instead.
    Inputs: x, the key, then the weights and the biases (None for a layer without)."""

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
        spec = spec_of(key)
        L = len(spec.layers)
        x, weights, saved = ctx.saved_tensors[0], ctx.saved_tensors[1:1 + L], ctx.saved_tensors[1 + L:]
        need_dx = ctx.needs_input_grad[0]
        _report_path("fused_mlp_backward", x)  # as the op's CUDA impl reports it
        fused_dw = _fused_weight_grads(key, x)
        dx, dzs, db, dw = launch_backward(key, grad_y.contiguous(), x, weights, saved, need_dx, fused_dw)
        # one cast each for every layer's bias and (fused) weight gradients, then views
        gb, gw = _layer_views(key, None if db is None else db.to(x.dtype), None if dw is None else dw.to(x.dtype))
        if gw is None:
            gw = [_weight_grad(dz[:, :l.out_features], a)
                  for dz, a, l in zip(dzs, _layer_inputs(x, saved, spec), spec.layers)]
        return (dx if need_dx else None), None, *gw, *gb


for _op, _cpu, _cuda in (("fused_mlp", _fused_mlp_cpu, _fused_mlp_cuda),
                         ("fused_mlp_backward", _fused_mlp_backward_cpu, _fused_mlp_backward_cuda)):
    _LIB.impl(_op, _cpu, "CPU")
    _LIB.impl(_op, _cuda, "CUDA")
torch.library.register_autograd("cutlass_ops::fused_mlp", _backward, setup_context=_setup_context, lib=_LIB)


def fused_mlp(x: torch.Tensor, weights, biases, key: str, save: bool = False):
    """``torch.ops.cutlass_ops.fused_mlp`` returning ``y`` only (x: (M, in_features))."""
    return torch.ops.cutlass_ops.fused_mlp(x, list(weights), list(biases), key, save)[0]
