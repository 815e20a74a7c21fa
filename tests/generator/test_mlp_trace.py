"""FusedMLP front end (cutlass_ops_gen.mlp_spec): tracing, widths, and the emitted CUDA expressions.

CPU only.  The emitted CUDA expression strings are parsed and evaluated here in float64 by a
small evaluator of our own, and compared with torch's activation and its autograd gradient.
"""
import re

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cutlass_ops_gen.mlp_spec import padded, trace_mlp  # noqa: E402


# ---------------------------------------------------------------------------------------------
# A tiny evaluator of the emitted CUDA float expressions (variable ``x``), on float64 tensors.
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?f?)|([A-Za-z_]\w*)|(\S))")
_FNS = {"expf": torch.exp, "logf": torch.log, "log1pf": torch.log1p, "sinf": torch.sin, "cosf": torch.cos,
        "tanhf": torch.tanh, "erff": torch.erf, "sqrtf": torch.sqrt, "fabsf": torch.abs,
        "powf": lambda a, b: torch.pow(a, b)}


def _tokens(text):
    pos, out = 0, []
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, text[pos:]
        num, ident, sym = m.groups()
        out.append(("num", float(num.rstrip("f"))) if num else ("id", ident) if ident else ("sym", sym))
        pos = m.end()
    return out


def cuda_eval(text, x):
    toks, i = _tokens(text), [0]

    def peek():
        return toks[i[0]] if i[0] < len(toks) else (None, None)

    def take(expected=None):
        t = toks[i[0]]
        i[0] += 1
        assert expected is None or t == ("sym", expected), (t, expected, text)
        return t

    def ternary():
        c = comparison()
        if peek() == ("sym", "?"):
            take("?")
            a = ternary()
            take(":")
            b = ternary()
            return torch.where(c, a, b)
        return c

    def comparison():
        a = additive()
        if peek() in (("sym", ">"), ("sym", "<")):
            op = take()[1]
            b = additive()
            return a > b if op == ">" else a < b
        return a

    def additive():
        a = multiplicative()
        while peek() in (("sym", "+"), ("sym", "-")):
            op = take()[1]
            b = multiplicative()
            a = a + b if op == "+" else a - b
        return a

    def multiplicative():
        a = unary()
        while peek() in (("sym", "*"), ("sym", "/")):
            op = take()[1]
            b = unary()
            a = a * b if op == "*" else a / b
        return a

    def unary():
        if peek() == ("sym", "-"):
            take("-")
            return -unary()
        return primary()

    def primary():
        kind, v = take()
        if kind == "num":
            return torch.full_like(x, v)
        if kind == "id" and v == "x":
            return x
        if kind == "id":
            take("(")
            args = [ternary()]
            while peek() == ("sym", ","):
                take(",")
                args.append(ternary())
            take(")")
            return _FNS[v](*args)
        assert v == "(", (v, text)
        e = ternary()
        take(")")
        return e

    r = ternary()
    assert i[0] == len(toks), text
    return r


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

class Chain(nn.Module):
    """Linear layers of ``widths`` with ``act`` after each hidden layer and ``last`` after the last."""

    def __init__(self, widths, act, last=None, bias=True):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(a, b, bias=bias) for a, b in zip(widths[:-1], widths[1:]))
        self.act, self.last = act, last

    def forward(self, x):
        for i, lin in enumerate(self.lins):
            x = lin(x)
            f = self.act if i < len(self.lins) - 1 else self.last
            if f is not None:
                x = f(x)
        return x


def siren_sin(x):
    return torch.sin(30 * x)


def swish(x):
    return x * torch.sigmoid(x)


def gauss(x):
    return torch.exp(-x ** 2)


# name -> (model, the activation used between layers as a torch callable, the widths)
MODELS = {
    "relu_64x4": (Chain([32, 64, 64, 64, 64, 16], nn.ReLU()), nn.ReLU(), [32, 64, 64, 64, 64, 16]),
    "siren": (Chain([3, 256, 256, 256, 256, 1], siren_sin), siren_sin, [3, 256, 256, 256, 256, 1]),
    "odd_widths": (Chain([32, 127, 84, 57, 16], nn.ReLU()), nn.ReLU(), [32, 127, 84, 57, 16]),
    "gelu_tanh": (Chain([16, 64, 64, 8], nn.GELU(approximate="tanh")), nn.GELU(approximate="tanh"), [16, 64, 64, 8]),
    "gelu_erf": (Chain([16, 64, 8], nn.GELU()), nn.GELU(), [16, 64, 8]),
    "swish": (Chain([8, 48, 48, 4], swish), swish, [8, 48, 48, 4]),
    "gauss": (Chain([2, 40, 40, 3], gauss), gauss, [2, 40, 40, 3]),
    "leaky_0.2": (Chain([10, 33, 33, 1], nn.LeakyReLU(0.2)), nn.LeakyReLU(0.2), [10, 33, 33, 1]),
    "softplus": (Chain([5, 24, 24, 2], nn.Softplus()), nn.Softplus(), [5, 24, 24, 2]),
    "softplus_beta": (Chain([5, 24, 2], nn.Softplus(beta=2.0, threshold=10.0)),
                      nn.Softplus(beta=2.0, threshold=10.0), [5, 24, 2]),
    "silu": (Chain([4, 16, 4], nn.SiLU()), nn.SiLU(), [4, 16, 4]),
    "sigmoid_nobias": (Chain([4, 16, 4], nn.Sigmoid(), bias=False), nn.Sigmoid(), [4, 16, 4]),
    "tanh": (Chain([4, 16, 4], nn.Tanh()), nn.Tanh(), [4, 16, 4]),
    "identity": (Chain([4, 16, 4], nn.Identity()), nn.Identity(), [4, 16, 4]),
    "functional": (Chain([4, 16, 4], lambda x: F.leaky_relu(F.relu(x) - 0.5, negative_slope=0.1) * 2.0 + torch.tanh(x) / 3),
                   lambda x: F.leaky_relu(F.relu(x) - 0.5, negative_slope=0.1) * 2.0 + torch.tanh(x) / 3, [4, 16, 4]),
    "methods": (Chain([4, 16, 4], lambda x: x.sigmoid().mul(x).add(1.0).log() + x.pow(3) / (1 + x.square())),
                lambda x: x.sigmoid().mul(x).add(1.0).log() + x.pow(3) / (1 + x.square()), [4, 16, 4]),
    "misc": (Chain([4, 16, 4], nn.ELU(0.7)), nn.ELU(0.7), [4, 16, 4]),
    "hardtanh_mish": (Chain([4, 16, 4], lambda x: F.mish(F.hardtanh(x, -1.5, 2.0)) + torch.clamp(x, min=0.2)),
                      lambda x: F.mish(F.hardtanh(x, -1.5, 2.0)) + torch.clamp(x, min=0.2), [4, 16, 4]),
    "width1": (Chain([1, 1, 256, 1], torch.tanh, last=torch.sigmoid), torch.tanh, [1, 1, 256, 1]),
}


def _grid(n=4000, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * scale
    # add the far tails (softplus threshold, sigmoid saturation) and keep away from exact kinks
    return torch.cat([x, torch.linspace(-40, 40, 801, dtype=torch.float64) + 1e-3])


def _check_activation(act_spec, fn, scale=3.0):
    x = _grid(scale=scale).requires_grad_(True)
    want = fn(x)
    (dwant,) = torch.autograd.grad(want.sum(), x)
    x = x.detach()
    got = cuda_eval(act_spec.cuda, x)
    dgot = cuda_eval(act_spec.cuda_grad, x)
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10, msg=lambda m: f"{act_spec.cuda}\n{m}")
    torch.testing.assert_close(dgot, dwant, rtol=1e-10, atol=1e-10, msg=lambda m: f"{act_spec.cuda_grad}\n{m}")


@pytest.mark.parametrize("name", MODELS)
def test_widths_and_padding(name):
    model, _, widths = MODELS[name]
    spec = trace_mlp(model, torch.randn(7, widths[0]))
    assert [(l.in_features, l.out_features) for l in spec.layers] == list(zip(widths[:-1], widths[1:]))
    assert [(l.in_padded, l.out_padded) for l in spec.layers] == \
        [(padded(a), padded(b)) for a, b in zip(widths[:-1], widths[1:])]
    for l in spec.layers:
        assert l.in_padded % 8 == 0 and l.in_features <= l.in_padded < l.in_features + 8 and l.in_padded <= 256
    assert spec.in_features == widths[0] and spec.out_features == widths[-1]
    assert [l.name for l in spec.layers] == [f"lins.{i}" for i in range(len(widths) - 1)]
    assert all(l.bias == (name != "sigmoid_nobias") for l in spec.layers)
    assert spec.structure_key() == trace_mlp(model, None).structure_key()


def test_padding_values():
    assert [padded(w) for w in (1, 7, 8, 9, 16, 57, 84, 127, 255, 256)] == [8, 8, 8, 16, 16, 64, 88, 128, 256, 256]


def test_odd_widths_padding():
    spec = trace_mlp(MODELS["odd_widths"][0], torch.randn(2, 32))
    assert [(l.in_padded, l.out_padded) for l in spec.layers] == [(32, 128), (128, 88), (88, 64), (64, 16)]


@pytest.mark.parametrize("name", MODELS)
def test_activation_expressions_match_torch(name):
    model, fn, widths = MODELS[name]
    spec = trace_mlp(model, torch.randn(3, widths[0]))
    scale = 0.2 if name == "siren" else 3.0
    for l in spec.layers[:-1]:
        _check_activation(l.activation, fn, scale)
    last = model.last
    if last is None:
        assert spec.layers[-1].activation.is_identity
        assert spec.layers[-1].activation.cuda == "x" and spec.layers[-1].activation.cuda_grad == "1.0f"
    else:
        _check_activation(spec.layers[-1].activation, last)


@pytest.mark.parametrize("name", MODELS)
def test_whole_model_from_spec(name):
    """Run the spec (emitted expressions + the model's weights) in float64 against the model."""
    model, _, widths = MODELS[name]
    model = model.double()
    spec = trace_mlp(model, torch.randn(3, widths[0]))
    x = torch.randn(50, widths[0], dtype=torch.float64)
    mods = dict(model.named_modules())
    h = x
    for l in spec.layers:
        lin = mods[l.name]
        h = cuda_eval(l.activation.cuda, F.linear(h, lin.weight, lin.bias))
    torch.testing.assert_close(h, model(x).detach(), rtol=1e-9, atol=1e-9)
    model.float()


def test_relu_keeps_nan_as_torch_does():
    """fmaxf(NaN, 0) is 0 in CUDA; torch.relu(NaN) is NaN: the emitted ReLU is a comparison
    that a NaN fails, so NaN passes through (C's `<`, as the evaluator's)."""
    spec = trace_mlp(MODELS["relu_64x4"][0], torch.randn(3, 32))
    x = torch.tensor([float("nan"), -1.5, -0.0, 0.0, 2.5], dtype=torch.float64)
    got, want = cuda_eval(spec.layers[0].activation.cuda, x), torch.relu(x)
    assert torch.isnan(got[0]) and torch.equal(got[1:], want[1:])


def test_issue_examples_text():
    spec = trace_mlp(MODELS["siren"][0], torch.randn(3, 3))
    assert spec.layers[0].activation.cuda == "sinf((30.0f * x))"
    assert spec.layers[0].activation.cuda_grad == "(cosf((30.0f * x)) * 30.0f)"
    spec = trace_mlp(MODELS["relu_64x4"][0], torch.randn(3, 32))
    assert spec.layers[0].activation.cuda == "(x < 0.0f ? 0.0f : x)"
    assert spec.layers[0].activation.cuda_grad == "(x > 0.0f ? 1.0f : 0.0f)"
    spec = trace_mlp(MODELS["gauss"][0], torch.randn(3, 2))
    assert spec.layers[0].activation.cuda == "expf((-(x * x)))"


def test_nn_sequential_and_inline_forward():
    seq = nn.Sequential(nn.Linear(3, 20), nn.ReLU(), nn.Linear(20, 20), nn.SiLU(), nn.Linear(20, 2))
    spec = trace_mlp(seq, torch.randn(4, 3))
    assert [l.name for l in spec.layers] == ["0", "2", "4"]
    assert spec.layers[-1].activation.is_identity

    class Inline(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 9), nn.Linear(9, 5)
            self.register_buffer("scale", torch.tensor(2.5))

        def forward(self, x):
            h = self.a(x)
            h = F.relu(h, inplace=True) * self.scale
            return torch.sigmoid(self.b(h))

    spec = trace_mlp(Inline(), torch.randn(2, 4))
    _check_activation(spec.layers[0].activation, lambda t: F.relu(t) * 2.5)
    _check_activation(spec.layers[1].activation, torch.sigmoid)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

class Softmaxed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.softmax(self.a(x), dim=-1))


class Catted(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(16, 3)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.cat([h, h], dim=-1))


class Matmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return h @ h


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.a(x) + y


class Skip(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return torch.relu(self.b(h)) + h


class Branch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(h))) * h


class InputAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        return self.a(torch.sin(x))


class Learnable(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.a(x) * self.w


class Tuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        h = self.a(x)
        return h, h


class VarPow(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        h = self.a(x)
        return h ** h


class Reshape(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        return self.a(x).view(-1, 2, 4)


@pytest.mark.parametrize("model, node, reason", [
    (Softmaxed(), "softmax", "not a supported elementwise function"),
    (Catted(), "cat", "not a supported elementwise function"),
    (Matmul(), "matmul", "not a supported elementwise function"),
    (nn.Sequential(nn.Linear(4, 8), nn.Softmax(dim=-1)), "_1", "Softmax is not a supported elementwise module"),
    (nn.Sequential(nn.Linear(4, 300), nn.ReLU(), nn.Linear(300, 2)), "_0", "out_features=300 is outside 1..256"),
    (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(257, 2)), "_3",
     "in_features=257 is outside 1..256"),
    (TwoInputs(), "y", "a second input"),
    (Skip(), "add", "uses 'relu', an activation of an earlier layer"),
    (Branch(), "mul", "uses 'relu', an activation of an earlier layer"),
    (InputAct(), "a", "before the first nn.Linear"),
    (Learnable(), "w", "parameter outside nn.Linear"),
    (Tuple(), "output", "one tensor"),
    (VarPow(), "pow_1", "exponent depends on the activation"),
    (Reshape(), "view", "method 'view' is not a supported"),
    (nn.Sequential(nn.ReLU()), "output", "no nn.Linear"),
])
def test_errors_name_the_node(model, node, reason):
    with pytest.raises(ValueError) as exc:
        trace_mlp(model, torch.randn(2, 4))
    msg = str(exc.value)
    assert f"fx node '{node}'" in msg and reason in msg, msg


def test_example_input_checked():
    with pytest.raises(ValueError, match="last dimension 5"):
        trace_mlp(nn.Sequential(nn.Linear(4, 8)), torch.randn(2, 5))
    with pytest.raises(ValueError, match="floating point"):
        trace_mlp(nn.Sequential(nn.Linear(4, 8)), torch.ones(2, 4, dtype=torch.long))


def test_untraceable_control_flow():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return h if h.sum() > 0 else -h

    with pytest.raises(ValueError, match="torch.fx could not trace"):
        trace_mlp(DataDependent(), torch.randn(2, 4))



@pytest.mark.parametrize("act, from_output", [
    (nn.ReLU(), True), (nn.LeakyReLU(0.1), True), (nn.LeakyReLU(2.0), True), (nn.Tanh(), True),
    (nn.Sigmoid(), True), (nn.Identity(), True), (nn.LeakyReLU(-0.5), False), (nn.GELU(), False),
    (nn.SiLU(), False), (nn.Softplus(), False), (nn.ELU(), False),
])
def test_derivative_from_the_output(act, from_output):
    """Where the training forward skips saving z, the backward's derivative from the output y
    (the emitted dfy expression, y = act(x)) equals the derivative in x, away from the kink;
    everything else keeps z."""
    spec = trace_mlp(nn.Sequential(nn.Linear(4, 8), act, nn.Linear(8, 2)), None)
    a = spec.layers[0].activation
    assert (a.cuda_grad_from_output is not None) == from_output
    assert spec.saves_pre_activation(0) == (not from_output) and spec.saves_pre_activation(1)
    if from_output:
        x = torch.linspace(-4, 4, 801, dtype=torch.float64)
        x = x[x.abs() > 1e-3]  # the kink at 0: both sides take torch's convention there
        y = cuda_eval(a.cuda, x)
        torch.testing.assert_close(cuda_eval(a.cuda_grad_from_output, y), cuda_eval(a.cuda_grad, x),
                                   rtol=1e-12, atol=1e-12)
