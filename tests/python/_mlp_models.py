"""Models for the FusedMLP tests: ``chain`` (a Sequential of Linear layers with an activation
between them and optionally after the last) and ``Act`` (any elementwise function as a module),
and ``random_mlp``, the numerics criterion's random models (depth 1-8, widths 1-256, random
activations from the list and compositions), drawn the same way by the CPU emulator
test (test_mlp_emulator.py) and the GPU test (test_fused_mlp.py)."""
from __future__ import annotations

import random

import contextlib

import torch
import torch.nn as nn

from _seeds import seeded


class Act(nn.Module):
    def __init__(self, fn, name: str = ""):
        super().__init__()
        self.fn, self.name = fn, name

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self):
        return self.name


def chain(widths, act, last=None, bias=True, seed=None, init=None):
    """Linear layers widths[0] -> widths[1] -> ..., ``act`` after each but the last, ``last``
    after the last (modules, or None); built under seeded(seed) if given (the global generators
    are left as they were); init(linear, i) may set a layer's weights."""
    mods = []
    with seeded(seed) if seed is not None else contextlib.nullcontext():
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            lin = nn.Linear(a, b, bias=bias)
            if init is not None:
                init(lin, i)
            mods.append(lin)
            f = act if i < len(widths) - 2 else last
            if f is not None:
                mods.append(f)
    return nn.Sequential(*mods)


def _sin(r):
    f = r.choice([1.0, 2.0, 3.0])  # SIREN's 30 needs its own init (test_fused_mlp's siren model)
    return Act(lambda x: torch.sin(f * x), f"sin({f} x)")


# name -> a module (or None: identity) from the generator; the list, then compositions
ACTIVATIONS = {
    "relu": lambda r: nn.ReLU(),
    "leaky_relu": lambda r: nn.LeakyReLU(round(r.uniform(0.01, 0.3), 3)),
    "gelu": lambda r: nn.GELU(),
    "gelu_tanh": lambda r: nn.GELU(approximate="tanh"),
    "silu": lambda r: nn.SiLU(),
    "sigmoid": lambda r: nn.Sigmoid(),
    "tanh": lambda r: nn.Tanh(),
    "softplus": lambda r: nn.Softplus(),
    "sin": _sin,
    "identity": lambda r: None,
    "x_sigmoid_x": lambda r: Act(lambda x: x * torch.sigmoid(x), "x * sigmoid(x)"),
    "gauss": lambda r: Act(lambda x: torch.exp(-x ** 2), "exp(-x^2)"),
    "tanh_plus_x": lambda r: Act(lambda x: 0.5 * torch.tanh(x) + x, "0.5 tanh(x) + x"),
}


def _width(r):
    # a third each of narrow, middle and wide widths (uniform 1-256 would be mostly wide)
    return r.choice([r.randint(1, 16), r.randint(17, 96), r.randint(97, 256)])


def random_mlp(seed: int) -> tuple[str, nn.Sequential]:
    """Model number ``seed``: 1-8 Linear layers of widths 1-256, bias or not (per model), each
    hidden layer's activation drawn from ACTIVATIONS, the last layer's too or none; weights
    from torch's default init under seeded(seed).  Returns a descriptive name and the module."""
    r = random.Random(seed)
    depth = r.randint(1, 8)
    widths = [_width(r) for _ in range(depth + 1)]
    bias = r.random() < 0.8
    mods, names = [], []
    with seeded(seed):
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            mods.append(nn.Linear(a, b, bias=bias))
            if i < depth - 1 or r.random() < 0.5:
                name = r.choice(list(ACTIVATIONS))
                act = ACTIVATIONS[name](r)
                names.append(name)
                if act is not None:
                    mods.append(act)
    label = f"m{seed}_{'-'.join(map(str, widths))}_{'.'.join(names) or 'linear'}{'' if bias else '_nobias'}"
    return label, nn.Sequential(*mods)
