"""FusedMLP front end: trace a user's PyTorch MLP into an ``MlpSpec``.

This is the generator's front end: it turns a model into the description that the code
emitter (``mlp_emit.py``) and ``cutlass_ops.FusedMLP`` consume.  It runs on the CPU and needs
torch (for torch.fx) but no CUDA and no compiler.

``trace_mlp(model, example_input)`` symbolically traces ``model`` with torch.fx and accepts a
chain of ``nn.Linear`` layers (in/out width 1..256, bias or not) with elementwise functions
between them and after the last one.  Each activation segment (everything between two Linear
layers, or after the last) becomes a small expression tree ``Expr`` in one variable ``x``, the
Linear's output (the fp32 GEMM accumulator plus bias).  From the same tree come:

- ``cuda``: a CUDA device expression in ``x`` (float math: expf, tanhf, erff, ...);
- ``cuda_grad``: its derivative d out / d x, from symbolic differentiation of the tree;
- ``to_torch(tree, x)``: the same expression on a torch tensor (the op's CPU implementation).

Anything else raises ``ValueError`` naming the fx node and the reason.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

MAX_WIDTH = 256
PAD = 8


def padded(width: int) -> int:
    """The width a layer is padded to inside the kernel: the next multiple of 8."""
    return -(-width // PAD) * PAD


# ---------------------------------------------------------------------------------------------
# Expression trees
# ---------------------------------------------------------------------------------------------

UNARY = ("neg", "exp", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "erf", "sqrt", "abs", "relu")
BINARY = ("add", "sub", "mul", "div")
_CUDA_FN = {"exp": "expf", "log": "logf", "log1p": "log1pf", "sin": "sinf", "cos": "cosf",
            "tanh": "tanhf", "erf": "erff", "sqrt": "sqrtf", "abs": "fabsf"}
_PY_FN = {"exp": math.exp, "log": math.log, "log1p": math.log1p, "sin": math.sin, "cos": math.cos,
          "tanh": math.tanh, "erf": math.erf, "sqrt": math.sqrt, "abs": abs,
          "relu": lambda v: max(v, 0.0), "neg": operator.neg,
          "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v))}


@dataclass(frozen=True)
class Expr:
    """A node of an elementwise expression in the single variable ``x``.

    op: "x", "const" (value), a unary op of UNARY (args=(u,)), a binary op of BINARY
    (args=(a, b)), "powc" (args=(u,), value=constant exponent), or "select"
    (args=(c, a, b): ``c > 0 ? a : b``).
    """
    op: str
    args: tuple = ()
    value: float | None = None

    def is_const(self, v=None) -> bool:
        return self.op == "const" and (v is None or self.value == v)


X = Expr("x")


def const(v) -> Expr:
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"non-finite constant {v}")
    return Expr("const", (), v)


ZERO, ONE = const(0.0), const(1.0)


def lift(v) -> Expr:
    return v if isinstance(v, Expr) else const(v)


def unary(op: str, u) -> Expr:
    u = lift(u)
    if u.is_const():
        return const(_PY_FN[op](u.value))
    if op == "neg" and u.op == "neg":
        return u.args[0]
    return Expr(op, (u,))


def add(a, b) -> Expr:
    a, b = lift(a), lift(b)
    if a.is_const() and b.is_const():
        return const(a.value + b.value)
    if a.is_const(0.0):
        return b
    if b.is_const(0.0):
        return a
    return Expr("add", (a, b))


def sub(a, b) -> Expr:
    a, b = lift(a), lift(b)
    if a.is_const() and b.is_const():
        return const(a.value - b.value)
    if b.is_const(0.0):
        return a
    if a.is_const(0.0):
        return unary("neg", b)
    return Expr("sub", (a, b))


def mul(a, b) -> Expr:
    a, b = lift(a), lift(b)
    if a.is_const() and b.is_const():
        return const(a.value * b.value)
    if a.is_const(0.0) or b.is_const(0.0):
        return ZERO
    if a.is_const(1.0):
        return b
    if b.is_const(1.0):
        return a
    if a.is_const(-1.0):
        return unary("neg", b)
    if b.is_const(-1.0):
        return unary("neg", a)
    return Expr("mul", (a, b))


def div(a, b) -> Expr:
    a, b = lift(a), lift(b)
    if b.is_const(0.0):
        raise ValueError("division by the constant 0")
    if a.is_const() and b.is_const():
        return const(a.value / b.value)
    if a.is_const(0.0):
        return ZERO
    if b.is_const(1.0):
        return a
    return Expr("div", (a, b))


def powc(u, c) -> Expr:
    u, c = lift(u), float(c)
    if c == 0.0:
        return ONE
    if c == 1.0:
        return u
    if u.is_const():
        return const(u.value ** c)
    return Expr("powc", (u,), c)


def select(c, a, b) -> Expr:
    """``c > 0 ? a : b``."""
    c, a, b = lift(c), lift(a), lift(b)
    if a == b:
        return a
    if c.is_const():
        return a if c.value > 0 else b
    return Expr("select", (c, a, b))


def substitute(e: Expr, u: Expr) -> Expr:
    """``e`` with ``x`` replaced by ``u`` (used to build compositions such as GELU of a node)."""
    if e.op == "x":
        return u
    if e.op == "const":
        return e
    args = tuple(substitute(a, u) for a in e.args)
    if e.op in UNARY:
        return unary(e.op, *args)
    if e.op == "powc":
        return powc(args[0], e.value)
    if e.op == "select":
        return select(*args)
    return {"add": add, "sub": sub, "mul": mul, "div": div}[e.op](*args)


def diff(e: Expr) -> Expr:
    """d e / d x by the chain, product and quotient rules (kinks: torch's conventions)."""
    op = e.op
    if op == "x":
        return ONE
    if op == "const":
        return ZERO
    if op == "select":
        c, a, b = e.args
        return select(c, diff(a), diff(b))
    if op == "add":
        return add(diff(e.args[0]), diff(e.args[1]))
    if op == "sub":
        return sub(diff(e.args[0]), diff(e.args[1]))
    if op == "mul":
        a, b = e.args
        return add(mul(diff(a), b), mul(a, diff(b)))
    if op == "div":
        a, b = e.args
        da, db = diff(a), diff(b)
        return sub(div(da, b), div(mul(a, db), mul(b, b)))
    u = e.args[0]
    du = diff(u)
    if op == "powc":
        outer = mul(e.value, powc(u, e.value - 1.0))
    elif op == "neg":
        return unary("neg", du)
    elif op == "exp":
        outer = e
    elif op == "log":
        return div(du, u)
    elif op == "log1p":
        return div(du, add(1.0, u))
    elif op == "sin":
        outer = unary("cos", u)
    elif op == "cos":
        outer = unary("neg", unary("sin", u))
    elif op == "tanh":
        outer = sub(1.0, mul(e, e))
    elif op == "sigmoid":
        outer = mul(e, sub(1.0, e))
    elif op == "erf":
        outer = mul(2.0 / math.sqrt(math.pi), unary("exp", unary("neg", mul(u, u))))
    elif op == "sqrt":
        return div(du, mul(2.0, e))
    elif op == "abs":
        outer = select(u, 1.0, select(unary("neg", u), -1.0, 0.0))
    elif op == "relu":
        outer = select(u, 1.0, 0.0)
    else:  # pragma: no cover
        raise AssertionError(op)
    return mul(outer, du)


def _literal(v: float) -> str:
    s = repr(float(v))
    if "e" not in s and "." not in s:
        s += ".0"
    return f"({s}f)" if v < 0 else f"{s}f"


def to_cuda(e: Expr) -> str:
    """A CUDA float expression in ``x``; every subexpression it emits is atomic (parenthesized)."""
    op = e.op
    if op == "x":
        return "x"
    if op == "const":
        return _literal(e.value)
    a = [to_cuda(u) for u in e.args]
    if op in _CUDA_FN:
        return f"{_CUDA_FN[op]}({a[0]})"
    if op == "neg":
        return f"(-{a[0]})"
    if op == "sigmoid":
        return f"(1.0f / (1.0f + expf(-{a[0]})))"
    if op == "relu":  # not fmaxf, which turns NaN into 0: torch.relu keeps NaN
        return f"({a[0]} < 0.0f ? 0.0f : {a[0]})"
    if op in BINARY:
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
        return f"({a[0]} {sym} {a[1]})"
    if op == "powc":
        if e.value == 2.0 and e.args[0].op in ("x", "const"):
            return f"({a[0]} * {a[0]})"
        return f"powf({a[0]}, {_literal(e.value)})"
    if op == "select":
        return f"({a[0]} > 0.0f ? {a[1]} : {a[2]})"
    raise AssertionError(op)  # pragma: no cover


def to_torch(e: Expr, x):
    """``e`` evaluated on the tensor ``x`` with torch ops, as the emitted CUDA expression computes
    it (``select`` is ``c > 0 ? a : b``, ``relu`` is ``u < 0 ? 0 : u``, sigmoid ``1 / (1 + exp(-u))``).
    Constants stay Python numbers (a scalar operand, as the CUDA expression's float literal),
    not tensors the size of x: SIREN's sin(30 x) on a 2^21 x 256 fp16 activation ran 1.3x
    eager PyTorch's time with each 30 materialized (H200)."""
    import torch
    out = _to_torch(e, x)
    return out if isinstance(out, torch.Tensor) else torch.full_like(x, out)


def _to_torch(e: Expr, x):
    """to_torch's recursion: a tensor, or a float where the subtree is constant."""
    import torch

    def tensor(v):  # a constant operand where torch wants a tensor (0-dim: broadcasts)
        return v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=x.dtype, device=x.device)
    op = e.op
    if op == "x":
        return x
    if op == "const":
        return float(e.value)
    a = [_to_torch(u, x) for u in e.args]
    if op in ("exp", "log", "log1p", "sin", "cos", "tanh", "erf", "sqrt", "abs"):
        return getattr(torch, op)(tensor(a[0]))
    if op == "neg":
        return -a[0]
    if op == "sigmoid":
        return 1.0 / (1.0 + torch.exp(-tensor(a[0])))
    if op == "relu":
        return torch.clamp_min(tensor(a[0]), 0.0)
    if op == "add":
        return a[0] + a[1]
    if op == "sub":
        return a[0] - a[1]
    if op == "mul":
        return a[0] * a[1]
    if op == "div":
        return a[0] / a[1]
    if op == "powc":
        return torch.pow(tensor(a[0]), e.value)
    if op == "select":
        return torch.where(tensor(a[0]) > 0, tensor(a[1]), tensor(a[2]))
    raise AssertionError(op)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# The spec
# ---------------------------------------------------------------------------------------------

def output_derivative(tree: Expr) -> Expr | None:
    """d out / d x written in the activation's output (the result's variable ``x`` stands for
    the output), for the activations whose output determines it: identity, ReLU, leaky ReLU with
    a positive slope (the output has the input's sign), sigmoid, tanh.  PyTorch's own backward
    reads the output the same way for ReLU, sigmoid and tanh.  None for any other tree."""
    if tree == X:
        return ONE
    if tree == Expr("relu", (X,)):
        return select(X, 1.0, 0.0)
    if tree == Expr("sigmoid", (X,)):
        return mul(X, sub(1.0, X))
    if tree == Expr("tanh", (X,)):
        return sub(1.0, mul(X, X))
    if tree.op == "select" and tree.args[0] == X and tree.args[1] == X:
        negative = tree.args[2]
        if negative == ZERO:
            return select(X, 1.0, 0.0)
        if negative.op == "mul" and X in negative.args:
            c = negative.args[0] if negative.args[1] == X else negative.args[1]
            if c.is_const() and c.value > 0:
                return select(X, 1.0, c.value)
    return None


@dataclass(frozen=True)
class Activation:
    tree: Expr
    cuda: str = field(init=False)
    cuda_grad: str = field(init=False)
    grad_from_output: Expr | None = field(init=False)   # output_derivative(tree)
    cuda_grad_from_output: str | None = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "cuda", to_cuda(self.tree))
        object.__setattr__(self, "cuda_grad", to_cuda(diff(self.tree)))
        g = output_derivative(self.tree)
        object.__setattr__(self, "grad_from_output", g)
        object.__setattr__(self, "cuda_grad_from_output", None if g is None else to_cuda(g))

    @property
    def is_identity(self) -> bool:
        return self.tree == X


@dataclass(frozen=True)
class Layer:
    name: str            # the fx node's target: the Linear's qualified name in the model
    in_features: int
    out_features: int
    bias: bool
    activation: Activation  # applied to this layer's output

    @property
    def in_padded(self) -> int:
        return padded(self.in_features)

    @property
    def out_padded(self) -> int:
        return padded(self.out_features)


@dataclass(frozen=True)
class MlpSpec:
    layers: tuple

    @property
    def in_features(self) -> int:
        return self.layers[0].in_features

    @property
    def out_features(self) -> int:
        return self.layers[-1].out_features

    def saves_pre_activation(self, i: int) -> bool:
        """Whether training saves layer i's pre-activation z for the backward: the last layer's
        always; a hidden layer's only where its activation's derivative needs z (otherwise the
        backward reads it from the saved activation, which the weight gradient needs anyway)."""
        return i == len(self.layers) - 1 or self.layers[i].activation.grad_from_output is None

    def structure_key(self) -> str:
        """A stable text of the structure (widths, bias, activations): the future cache key's input."""
        return ";".join(f"{l.in_features}>{l.out_features}{'b' if l.bias else ''}:{l.activation.cuda}"
                        for l in self.layers)


# ---------------------------------------------------------------------------------------------
# Tracing
# ---------------------------------------------------------------------------------------------

def _gelu(u, approximate="none"):
    if approximate == "tanh":
        inner = mul(math.sqrt(2.0 / math.pi), add(u, mul(0.044715, powc(u, 3.0))))
        return mul(mul(0.5, u), add(1.0, unary("tanh", inner)))
    if approximate != "none":
        raise ValueError(f"unknown GELU approximation {approximate!r}")
    return mul(mul(0.5, u), add(1.0, unary("erf", mul(u, 1.0 / math.sqrt(2.0)))))


def _softplus(u, beta=1.0, threshold=20.0):
    bu = mul(beta, u)
    return select(sub(bu, threshold), u, div(unary("log1p", unary("exp", bu)), beta))


def _leaky_relu(u, negative_slope=0.01, inplace=False):
    return select(u, u, mul(negative_slope, u))


def _elu(u, alpha=1.0, inplace=False):
    return select(u, u, mul(alpha, sub(unary("exp", u), 1.0)))


def _hardtanh(u, min_val=-1.0, max_val=1.0, inplace=False):
    return select(sub(u, max_val), max_val, select(sub(min_val, u), min_val, u))


def _mish(u, inplace=False):
    return mul(u, unary("tanh", _softplus(u)))


def _clamp(u, min=None, max=None):
    if isinstance(min, Expr) or isinstance(max, Expr):
        raise ValueError("clamp bounds must be constants")
    if min is not None:
        u = select(sub(min, u), min, u)
    if max is not None:
        u = select(sub(u, max), max, u)
    return u


def _un(op):
    return lambda u, *_, **__: unary(op, u)


def _add(a, b, alpha=1):
    return add(a, mul(alpha, b))


def _sub(a, b, alpha=1):
    return sub(a, mul(alpha, b))


def _pow(a, b):
    if isinstance(b, Expr):
        if b.is_const():
            b = b.value
        else:
            raise ValueError("a power whose exponent depends on the activation")
    if isinstance(a, Expr):
        return powc(a, b)
    return const(float(a) ** b)


def _functions():
    import torch
    import torch.nn.functional as F
    fns = {
        operator.add: add, operator.sub: sub, operator.mul: mul, operator.truediv: div,
        operator.neg: lambda u: unary("neg", u), operator.pos: lift, operator.pow: _pow,
        torch.add: _add, torch.sub: _sub, torch.mul: mul, torch.div: div, torch.true_divide: div,
        torch.pow: _pow, torch.square: lambda u: powc(u, 2.0), torch.rsqrt: lambda u: div(1.0, unary("sqrt", u)),
        torch.expm1: lambda u: sub(unary("exp", u), 1.0),
        torch.reciprocal: lambda u: div(1.0, u), torch.clamp: _clamp, torch.clip: _clamp,
        F.relu: _un("relu"), F.leaky_relu: _leaky_relu, F.gelu: _gelu, F.silu: lambda u, inplace=False: mul(u, unary("sigmoid", u)),
        F.softplus: _softplus, F.elu: _elu, F.hardtanh: _hardtanh, F.mish: _mish,
        F.relu6: lambda u, inplace=False: _hardtanh(u, 0.0, 6.0),
        F.tanh: _un("tanh"), F.sigmoid: _un("sigmoid"),
    }
    for op in ("exp", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "erf", "sqrt", "abs", "relu", "neg"):
        fns[getattr(torch, op)] = _un(op)
    return fns


def _methods():
    m = {"add": _add, "sub": _sub, "mul": mul, "div": div, "pow": _pow, "square": lambda u: powc(u, 2.0),
         "clamp": _clamp, "clip": _clamp,
         "__add__": add, "__sub__": sub, "__mul__": mul, "__truediv__": div,
         "__radd__": lambda a, b: add(b, a), "__rsub__": lambda a, b: sub(b, a),
         "__rmul__": lambda a, b: mul(b, a), "__rtruediv__": lambda a, b: div(b, a)}
    for op in ("exp", "log", "log1p", "sin", "cos", "tanh", "sigmoid", "erf", "sqrt", "abs", "relu", "neg"):
        m[op] = _un(op)
    return m


def _module_fn(mod):
    """The expression builder of an elementwise activation module, or None."""
    import torch.nn as nn
    if isinstance(mod, nn.Identity):
        return lift
    if isinstance(mod, nn.ReLU6):
        return lambda u: _hardtanh(u, 0.0, 6.0)
    if isinstance(mod, nn.Hardtanh):
        return lambda u: _hardtanh(u, mod.min_val, mod.max_val)
    table = {
        nn.ReLU: _un("relu"), nn.Sigmoid: _un("sigmoid"), nn.Tanh: _un("tanh"),
        nn.SiLU: lambda u: mul(u, unary("sigmoid", u)), nn.Mish: _mish,
        nn.LeakyReLU: lambda u: _leaky_relu(u, mod.negative_slope),
        nn.GELU: lambda u: _gelu(u, mod.approximate),
        nn.Softplus: lambda u: _softplus(u, mod.beta, mod.threshold),
        nn.ELU: lambda u: _elu(u, mod.alpha),
    }
    return table.get(type(mod))


def _node_text(node) -> str:
    target = node.target
    if callable(target) and not isinstance(target, str):
        mod = getattr(target, "__module__", None) or ""
        target = f"{mod}.{getattr(target, '__name__', repr(target))}".lstrip(".")
    return f"fx node '{node.name}' ({node.op} {target})"


class _Act:
    """The running activation: an expression in segment ``seg``'s variable."""
    __slots__ = ("seg", "tree")

    def __init__(self, seg, tree):
        self.seg, self.tree = seg, tree


def trace_mlp(model, example_input) -> MlpSpec:
    """Trace ``model`` (an nn.Module) into an ``MlpSpec``; ValueError names the node and reason."""
    import torch
    import torch.fx as fx
    import torch.nn as nn

    if not isinstance(model, nn.Module):
        raise ValueError(f"expected an nn.Module, got {type(model).__name__}")
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:  # fx.proxy.TraceError and data-dependent control flow
        raise ValueError(f"torch.fx could not trace the model: {exc}") from exc
    gm.graph.eliminate_dead_code()
    modules = dict(gm.named_modules())
    functions, methods = _functions(), _methods()

    env = {}
    layers = []          # [name, in, out, bias]
    activations = []     # tree applied after layers[i]
    seg = 0              # index of the current segment: 0 before the first Linear
    inputs = 0

    def value(node, arg):
        """An argument of ``node`` as a float or an Expr of the current segment."""
        if isinstance(arg, fx.Node):
            v = env[arg]
            if isinstance(v, _Act):
                if v.seg != seg:
                    raise ValueError(
                        f"{_node_text(node)}: uses '{arg.name}', an activation of an earlier layer "
                        f"than the running one (only a chain is supported, no skip or branch)")
                return v.tree
            return v
        if isinstance(arg, bool) or arg is None:
            return arg
        if isinstance(arg, (int, float)):
            return float(arg)
        if isinstance(arg, str):
            return arg
        raise ValueError(f"{_node_text(node)}: unsupported argument of type {type(arg).__name__}")

    for node in gm.graph.nodes:
        where = _node_text(node)
        if node.op == "placeholder":
            inputs += 1
            if inputs > 1:
                raise ValueError(f"{where}: a second input; the MLP takes exactly one tensor")
            env[node] = _Act(0, X)
            continue
        if node.op == "get_attr":
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor) and obj.numel() == 1 and not obj.requires_grad:
                env[node] = float(obj.item())
                continue
            raise ValueError(f"{where}: a tensor or parameter outside nn.Linear "
                             f"(only single-element constant buffers are accepted)")
        if node.op == "output":
            (out,) = node.args
            if not isinstance(out, fx.Node) or not isinstance(env.get(out), _Act):
                raise ValueError(f"{where}: the model must return the running activation as one tensor")
            tree = value(node, out)
            if seg == 0:
                raise ValueError(f"{where}: the model has no nn.Linear layer")
            activations.append(tree)
            break

        def arguments():
            return ([value(node, a) for a in node.args],
                    {k: value(node, a) for k, a in node.kwargs.items()})

        if node.op == "call_module":
            mod = modules[node.target]
            if isinstance(mod, nn.Linear):
                args, kwargs = arguments()
                if len(args) != 1 or kwargs or not isinstance(args[0], Expr):
                    raise ValueError(f"{where}: nn.Linear must take the running activation only")
                for what, w in (("in", mod.in_features), ("out", mod.out_features)):
                    if not 1 <= w <= MAX_WIDTH:
                        raise ValueError(f"{where}: {what}_features={w} is outside 1..{MAX_WIDTH}")
                if seg == 0:
                    if args[0] != X:
                        raise ValueError(f"{where}: elementwise functions before the first nn.Linear "
                                         f"are not supported")
                else:
                    if mod.in_features != layers[-1][2]:
                        raise ValueError(f"{where}: in_features={mod.in_features} does not match the "
                                         f"previous layer's out_features={layers[-1][2]}")
                    activations.append(args[0])
                layers.append([node.target, mod.in_features, mod.out_features, mod.bias is not None])
                seg += 1
                env[node] = _Act(seg, X)
                continue
            fn = _module_fn(mod)
            if fn is None:
                raise ValueError(f"{where}: {type(mod).__name__} is not a supported elementwise module")
        elif node.op == "call_function":
            fn = functions.get(node.target)
            if fn is None:
                raise ValueError(f"{where}: not a supported elementwise function")
        elif node.op == "call_method":
            fn = methods.get(node.target)
            if fn is None:
                raise ValueError(f"{where}: method '{node.target}' is not a supported elementwise function")
            # call_method args[0] is self
        else:  # pragma: no cover
            raise ValueError(f"{where}: unsupported node kind")
        args, kwargs = arguments()
        try:
            result = fn(*args, **kwargs)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        except TypeError as exc:
            raise ValueError(f"{where}: unsupported arguments ({exc})") from exc
        if not isinstance(result, Expr):
            raise ValueError(f"{where}: unsupported result")
        env[node] = _Act(seg, result) if any(isinstance(a, Expr) for a in [*args, *kwargs.values()]) \
            else result.value if result.is_const() else _Act(seg, result)

    if example_input is not None:
        if not isinstance(example_input, torch.Tensor) or example_input.dim() < 1:
            raise ValueError("example_input must be a tensor of shape [..., in_features]")
        if example_input.shape[-1] != layers[0][1]:
            raise ValueError(f"example_input's last dimension {example_input.shape[-1]} does not match "
                             f"the first layer's in_features={layers[0][1]}")
        if not example_input.is_floating_point():
            raise ValueError(f"example_input must be floating point, got {example_input.dtype}")

    return MlpSpec(tuple(Layer(name, i, o, b, Activation(t))
                         for (name, i, o, b), t in zip(layers, activations)))
