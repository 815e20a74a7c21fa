"""Training on several GPUs: ``flatten_parameters``, one flat parameter for a module's many.

DistributedDataParallel works per parameter: without gradient bucket views it copies each
gradient into its bucket and, after the all-reduce, back, a kernel each way per parameter.
FusedResNet has 48 parameters (20 of them FixUp scalars); on two H200s at N=2048 DDP added 109
kernels to the DD-PPO agent's 3.7 ms step: the all-reduce and two per parameter (54, with the
agent's head).  A module
flattened here has one parameter per dtype and device (or per group of names): its old
parameters become views of it, rebuilt at every forward through one autograd node whose backward
concatenates their gradients into the flat parameter's in one kernel.  DDP then sees one
parameter (one gradient, one copy).

    model = flatten_parameters(FusedResNet.from_reference(ref))
    ddp = DistributedDataParallel(model, ...)

The state dict keeps the original names and shapes (checkpoints load either way); ``parameters()``
yields the flat parameters, so build the optimizer after flattening.  Costs: the concatenation
(one copy of the gradients a step) and, with one flat parameter, no overlap of the all-reduce
with the backward (its one gradient is ready when the backward ends; ``group`` splits it).
tests/gpu_ddp.sh measures whether it pays (docs/ddp.md).
"""
from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import nn

__all__ = ["flatten_parameters", "is_flattened", "named_gradients"]


def _member(t: torch.Tensor, offset: int, shape, stride) -> torch.Tensor:
    """One member's view of a flat tensor t (a flat parameter, its gradient, or a state dict's copy)."""
    return t.as_strided(shape, stride, t.storage_offset() + offset)


def _views(flat: torch.Tensor, layout) -> tuple:
    return tuple(_member(flat, off, shape, stride) for off, shape, stride, _ in layout)


class _Unflatten(torch.autograd.Function):
    """flat -> its views (each parameter's shape and strides at its offset); backward: the views'
    gradients, each in its view's memory order, concatenated (one kernel)."""

    @staticmethod
    def forward(ctx, flat, layout):
        ctx.layout, ctx.dtype, ctx.device = layout, flat.dtype, flat.device
        return _views(flat, layout)

    @staticmethod
    def backward(ctx, *grads):
        parts = []
        for g, (_, shape, stride, order) in zip(grads, ctx.layout):
            if g is None:  # a view the forward did not use
                g = torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
            parts.append(g.permute(order).reshape(-1))  # a view where g is laid out as the parameter
        return torch.cat(parts), None


def _memory_order(shape, stride):
    """The dims from the outermost to the innermost in memory (a channels_last weight: 0, 2, 3, 1)."""
    return tuple(sorted(range(len(shape)), key=lambda d: (-stride[d], -shape[d], d)))


def _dense(shape, stride, numel) -> bool:
    """Whether (shape, stride) covers exactly numel consecutive elements (no gaps, no overlap)."""
    expected = 1
    for d in reversed(_memory_order(shape, stride)):
        if shape[d] != 1 and stride[d] != expected:
            return False
        expected *= shape[d]
    return expected == numel


def is_flattened(module: nn.Module) -> bool:
    return getattr(module, "_flat_groups", None) is not None


def flatten_parameters(module: nn.Module, group: Callable[[str], Hashable] | None = None) -> nn.Module:
    """Replaces the module's parameters (all of them, in every submodule) by one flat parameter
    per (dtype, device), ``flat_parameter_<k>``, each old parameter a view of it with its shape
    and strides (a channels_last weight stays channels_last); values kept, gradients and
    optimizer state not (flatten before building the optimizer).  Returns the module.

    group: a function of each parameter's qualified name, for one flat parameter per (group,
    dtype, device) instead: e.g. one per stage of a network, so that DDP all-reduces the last
    stages' gradients while the backward runs through the first ones (a flat parameter's gradient
    is ready when the backward has passed all of its members)."""
    if is_flattened(module):
        raise ValueError("flatten_parameters: the module is already flattened")
    entries = []  # (owner module, attribute, qualified name, parameter)
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for attr, p in list(owner._parameters.items()):
            if p is not None:
                entries.append((owner, attr, f"{prefix}.{attr}" if prefix else attr, p))
    seen = {}
    for owner, attr, name, p in entries:
        if id(p) in seen:
            raise ValueError(f"flatten_parameters: {name} is the same parameter as {seen[id(p)]} (shared "
                             "parameters are not supported)")
        seen[id(p)] = name
        if not _dense(tuple(p.shape), p.stride(), p.numel()):
            raise ValueError(f"flatten_parameters: {name} is not dense in memory (shape {tuple(p.shape)}, strides "
                             f"{p.stride()}); make it contiguous first")
    groups = {}
    for e in entries:
        groups.setdefault((None if group is None else group(e[2]), e[3].dtype, e[3].device), []).append(e)
    flat_groups = []
    for k, ((_, dtype, device), members) in enumerate(groups.items()):
        layout, offset = [], 0
        for _, _, _, p in members:
            layout.append((offset, tuple(p.shape), tuple(p.stride()), _memory_order(tuple(p.shape), p.stride())))
            offset += p.numel()
        flat = torch.empty(offset, dtype=dtype, device=device)
        with torch.no_grad():
            for (off, shape, stride, _), (_, _, _, p) in zip(layout, members):
                _member(flat, off, shape, stride).copy_(p)
        requires_grad = any(p.requires_grad for *_, p in members)
        name = f"flat_parameter_{k}"
        module.register_parameter(name, nn.Parameter(flat, requires_grad=requires_grad))
        for owner, attr, _, _ in members:
            del owner._parameters[attr]
        flat_groups.append((name, tuple(layout), [(owner, attr, qname) for owner, attr, qname, _ in members]))
    module._flat_groups = flat_groups
    _set_views(module)
    module.register_forward_pre_hook(lambda m, args: _set_views(m))
    module._register_state_dict_hook(_state_dict_hook)
    module._register_load_state_dict_pre_hook(_load_state_dict_pre_hook, with_module=True)
    return module


def named_gradients(module: nn.Module) -> list:
    """(name, parameter, gradient) for every parameter as named before flattening, in the order
    of ``named_parameters()`` where nothing was flattened: a flattened module's as views of its
    flat parameter and of its gradient (None where it has none)."""
    out = []
    for prefix, m in module.named_modules():
        flat_names = set()
        for name, layout, members in getattr(m, "_flat_groups", None) or ():
            flat_names.add(name)
            flat = m._parameters[name]
            for (off, shape, stride, _), (_, _, qname) in zip(layout, members):
                full = f"{prefix}.{qname}" if prefix else qname
                g = flat.grad
                out.append((full, _member(flat.detach(), off, shape, stride),
                            None if g is None else _member(g, off, shape, stride)))
        for attr, p in m._parameters.items():
            if p is not None and attr not in flat_names:
                out.append((f"{prefix}.{attr}" if prefix else attr, p, p.grad))
    return out


def _set_views(module: nn.Module) -> None:
    """Each old parameter's attribute becomes its view of the flat parameter, through _Unflatten
    (so that its gradient reaches the flat one); plain tensors, not parameters."""
    for name, layout, members in module._flat_groups:
        flat = module._parameters[name]
        views = _Unflatten.apply(flat, layout) if flat.requires_grad and torch.is_grad_enabled() else \
            _views(flat, layout)
        for (owner, attr, _), view in zip(members, views):
            object.__setattr__(owner, attr, view)  # past nn.Module.__setattr__: not a parameter again


def _state_dict_hook(module, state, prefix, local_metadata):
    """The original names, each its view's values; no flat_parameter_<k> entries."""
    for name, layout, members in module._flat_groups:
        flat = state.pop(prefix + name)
        for (off, shape, stride, _), (_, _, qname) in zip(layout, members):
            state[prefix + qname] = _member(flat, off, shape, stride).detach()
    return state


def _load_state_dict_pre_hook(module, state, prefix, local_metadata, strict, missing, unexpected, errors):
    """Loads a state dict with the original names into the flat parameters (a flat entry, if the
    state dict has one instead, loads as it is)."""
    for name, layout, members in module._flat_groups:
        if prefix + name in state:
            continue
        keys = [prefix + qname for _, _, qname in members]
        if not all(k in state for k in keys):
            continue  # load_state_dict reports the flat parameter as missing
        flat = module._parameters[name]
        assembled = torch.empty(flat.numel(), dtype=flat.dtype, device=flat.device)
        for (off, shape, stride, _), key in zip(layout, keys):
            value = state.pop(key)
            if tuple(value.shape) != shape:
                errors.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, the "
                              f"shape in the current model is {shape}")
                continue
            _member(assembled, off, shape, stride).copy_(value)
        state[prefix + name] = assembled
