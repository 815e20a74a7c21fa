"""cutlass_ops.distributed.flatten_parameters: one flat parameter per dtype and device, the old
parameters its views; the same outputs and gradients as the module before flattening, the same
state dict, and loads from either kind of state dict.  (DDP with it: test_ddp.py, --flat-params.)"""
import pytest
import torch
from torch import nn

import cutlass_ops
from cutlass_ops.distributed import flatten_parameters, is_flattened, named_gradients
from cutlass_ops.models import SEResNet9FixUp
from test_fused_resnet import randomize_


def _pair(rng_seed, dtype=torch.float64):
    """A FusedResNet with random non-zero weights (FixUp scalars, SE), and a flattened copy."""
    g = torch.Generator().manual_seed(rng_seed)
    ref = randomize_(SEResNet9FixUp(3, 64), g)
    plain = cutlass_ops.FusedResNet.from_reference(ref).to(dtype).train()
    flat = cutlass_ops.FusedResNet.from_reference(ref).to(dtype).train()
    return plain, flatten_parameters(flat), torch.randn(3, 3, 32, 32, generator=g, dtype=dtype)


def test_same_outputs_and_gradients_as_before(rng_seed):
    plain, flat, x = _pair(rng_seed)
    # one per dtype: float64 weights, and the FixUp scalars and SE weights FusedResNet keeps float32
    assert [n for n, _ in flat.named_parameters()] == ["flat_parameter_0", "flat_parameter_1"]
    assert is_flattened(flat) and not is_flattened(plain)
    y0, y1 = plain(x), flat(x)
    assert torch.equal(y0, y1)
    gy = torch.randn_like(y0)
    y0.backward(gy)
    y1.backward(gy)
    got = {name: g for name, _, g in named_gradients(flat)}
    want = dict(plain.named_parameters())
    assert got.keys() == want.keys()
    for name, p in want.items():
        assert torch.equal(got[name], p.grad), name
    # random non-zero weights: every gradient non-zero, so that the equality above means something
    assert sum(bool(p.grad.abs().sum() == 0) for p in want.values()) == 0
    # the flat gradient is the views' gradients laid out as the parameters
    assert sum(p.grad.numel() for p in flat.parameters()) == sum(p.numel() for p in want.values())


def test_same_under_autocast_with_float32_weights(rng_seed):
    """float32 weights under bfloat16 autocast (how DDP trains it on GPUs, there in fp16): one
    flat parameter, and the same outputs and gradients, bit for bit, as unflattened."""
    plain, flat, x = _pair(rng_seed, torch.float32)
    assert [n for n, _ in flat.named_parameters()] == ["flat_parameter_0"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0, y1 = plain(x.float()), flat(x.float())
    assert y0.dtype == torch.bfloat16 and torch.equal(y0, y1)
    y0.float().square().sum().backward()
    y1.float().square().sum().backward()
    got = {name: g for name, _, g in named_gradients(flat)}
    for name, p in plain.named_parameters():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], p.grad), name


def test_views_keep_each_parameter_layout_and_see_optimizer_steps():
    conv = nn.Conv2d(4, 6, 3).to(memory_format=torch.channels_last)
    stride = conv.weight.stride()
    module = flatten_parameters(nn.Sequential(conv, nn.ReLU(), nn.Conv2d(6, 2, 1)))
    assert module[0].weight.stride() == stride and not isinstance(module[0].weight, nn.Parameter)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    x = torch.randn(2, 4, 7, 7)
    module(x).square().sum().backward()
    before = module[0].weight.detach().clone()
    grad = dict((n, g) for n, _, g in named_gradients(module))["0.weight"].clone()
    opt.step()
    module(x)  # the forward rebuilds the views: they see the step
    assert torch.allclose(module[0].weight, before - 0.5 * grad)


def test_groups_by_name():
    """group=: one flat parameter per group (here per layer), each of them its members' values."""
    module = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    want = {k: v.clone() for k, v in module.state_dict().items()}
    flatten_parameters(module, group=lambda name: name.split(".")[0])
    assert [(n, p.numel()) for n, p in module.named_parameters()] == [("flat_parameter_0", 16),
                                                                       ("flat_parameter_1", 10)]
    assert all(torch.equal(v, want[k]) for k, v in module.state_dict().items())
    module(torch.randn(5, 3)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_unused_parameter_gets_a_zero_gradient():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

        def forward(self, x):
            return self.a(x)

    module = flatten_parameters(Two())
    module(torch.randn(2, 3)).sum().backward()
    grads = {n: g for n, _, g in named_gradients(module)}
    assert grads["b.weight"].abs().sum() == 0 and grads["a.weight"].abs().sum() > 0


def test_state_dict_keeps_the_names_and_loads_either_way(rng_seed):
    plain, flat, x = _pair(rng_seed)
    a, b = plain.state_dict(), flat.state_dict()
    assert list(a) == list(b) or set(a) == set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a plain state dict into a flattened model, and the flattened model's into a plain one
    other, flat2, _ = _pair(rng_seed + 1)
    flat2.load_state_dict(a)
    assert torch.equal(flat2(x), plain(x))
    other.load_state_dict(flat.state_dict())
    assert torch.equal(other(x), plain(x))
    with pytest.raises(RuntimeError, match="size mismatch"):
        flat2.load_state_dict({**a, "stem.1.weight": torch.zeros(1, 1, 1, 1, dtype=torch.float64)})


def test_refuses_what_it_cannot_flatten():
    module = flatten_parameters(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="already flattened"):
        flatten_parameters(module)
    shared = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    shared[1].weight = shared[0].weight
    with pytest.raises(ValueError, match="same parameter"):
        flatten_parameters(shared)
    strided = nn.Linear(4, 4)
    strided.weight = nn.Parameter(torch.randn(4, 8)[:, ::2])
    with pytest.raises(ValueError, match="not dense"):
        flatten_parameters(strided)
