"""Gradients of conv2d_fused, se_gate and FusedResNet (cutlass_ops/ops/: each family's autograd registration) vs float64."""
import pytest
import torch

import cutlass_ops
from cutlass_ops.models import SEResNet9FixUp
from cutlass_ops.small_map_conv import small_map_conv
from _helpers import DEVICES, errors, seeded
from test_fused_resnet import randomize_

D = torch.float64


def _leaf(*shape, g):
    return torch.randn(shape, generator=g, dtype=D).requires_grad_()


@pytest.mark.parametrize("bias_kind", ["channel", "scalar", "none"])
@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("residual", [True, False])
def test_conv2d_fused_gradcheck(bias_kind, relu, residual):
    g = torch.Generator().manual_seed(0)
    x, w = _leaf(2, 3, 5, 6, g=g), _leaf(4, 3, 3, 3, g=g)
    bias = {"channel": _leaf(4, g=g), "scalar": _leaf(g=g), "none": None}[bias_kind]
    res = _leaf(2, 4, 3, 3, g=g) if residual else None
    scale, post = _leaf(1, g=g), _leaf(g=g)
    fn = lambda *a: cutlass_ops.conv2d_fused(a[0], a[1], a[2], a[3], 2, 1, a[4], a[5], relu)
    assert torch.autograd.gradcheck(fn, (x, w, bias, res, scale, post))


@pytest.mark.parametrize("bias_kind", ["channel", "scalar"])
@pytest.mark.parametrize("residual", [True, False])
def test_conv2d_fused_silu_gradcheck(bias_kind, residual):
    """SiLU's backward recomputes the pre-activation (ops/conv2d_fused.py): every input's gradient."""
    g = torch.Generator().manual_seed(1)
    x, w = _leaf(2, 3, 5, 6, g=g), _leaf(4, 3, 3, 3, g=g)
    bias = _leaf(4, g=g) if bias_kind == "channel" else _leaf(g=g)
    res = _leaf(2, 4, 3, 3, g=g) if residual else None
    scale, post = _leaf(1, g=g), _leaf(g=g)
    fn = lambda *a: cutlass_ops.conv2d_fused(a[0], a[1], a[2], a[3], 2, 1, a[4], a[5], silu=True)
    assert torch.autograd.gradcheck(fn, (x, w, bias, res, scale, post))


@pytest.mark.parametrize("height,width", [(2, 2), (1, 1), (1, 2), (2, 3)])
def test_small_map_conv_gradcheck(height, width):
    # FusedResNet's conv2 on maps smaller than 3x3 (a dense layer; dgrad and wgrad differ
    # from conv2d_fused's): its value and every gradient against the 3x3 conv's.
    g = torch.Generator().manual_seed(height * 10 + width)
    h = _leaf(3, 8, height, width, g=g).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    w, scale = _leaf(5, 8, 3, 3, g=g), _leaf(1, g=g)
    assert torch.autograd.gradcheck(lambda *a: small_map_conv(*a, padding=1), (h, w, scale))
    direct = cutlass_ops.conv2d_fused(h, w, None, None, 1, 1, scale, None, False)
    torch.testing.assert_close(small_map_conv(h, w, scale, padding=1), direct, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("avgpool", [False, True])
def test_se_gate_gradcheck(avgpool):
    g = torch.Generator().manual_seed(1)
    h, idn = _leaf(2, 8, 5, 4, g=g), _leaf(2, 8, 5, 4, g=g)
    args = (h, idn, _leaf(2, 8, g=g), _leaf(2, g=g), _leaf(8, 2, g=g), _leaf(8, g=g), _leaf(g=g), _leaf(g=g),
            _leaf(g=g))

    def fn(*a):
        out = cutlass_ops.se_gate(*a[:8], avgpool=avgpool, h_bias=a[8])
        return out if not avgpool else out[0].sum() + 3 * out[1].sum()
    assert torch.autograd.gradcheck(fn, args)


def _projection(out):
    """The loss's random projection: every output element gets its own weight (float64)."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64).to(out.device)


def _grads(model, x):
    x = x.detach().clone().requires_grad_()
    out = model(x)
    (out.double() * _projection(out)).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    grads["input"] = x.grad
    return grads


def _se_hidden_conditioning(r64):
    """Hooks on a float64 SEResNet9FixUp that, after a backward, give per block the condition
    number of the sums that carry the gate's gradient to the SE's hidden units:
    d_hidden[n, j] = sum_c W2[c, j] * dpre[n, c] (dpre: the gradient at fc2's output), the
    largest sum|terms| / |sum| over the active (ReLU > 0) units.  excite.0's gradient is
    built from these sums, so its relative error can be this many times dpre's."""
    seen = {}
    for b, layer in enumerate(r64.layers):
        fc1, fc2 = layer[0].se.excite[0], layer[0].se.excite[2]
        fc1.register_forward_hook(lambda m, a, o, b=b: seen.__setitem__((b, "z"), o.detach().clone()))
        fc2.register_forward_hook(lambda m, a, o, b=b: (o.register_hook(lambda gr: seen.__setitem__((b, "dpre"), gr)),
                                                        None)[1])  # a hook's non-None result replaces the output

    def kappa(b):
        w2 = r64.layers[b][0].se.excite[2].weight.detach()
        terms = seen[(b, "dpre")][:, :, None] * w2[None]  # (N, C, hidden)
        ratio = (terms.abs().sum(1) / terms.sum(1).abs())[seen[(b, "z")] > 0]
        return ratio.max().item() if ratio.numel() else 1.0  # no active unit: excite.0's gradient is 0
    return kappa


def _scalar_term_magnitudes(r64, x64):
    """Per FixUp scalar of a float64 SEResNet9FixUp, sum |terms| of its gradient under _grads'
    loss: each scalar enters at one site (x + b, or conv2(...) * s), and its gradient is the sum
    over the site's elements of the upstream gradient (times conv2's output, for the scale).  Its
    error relative to this sum is the measure the fuzz holds scalar gradients to
    (_fuzz._check_scalar_grad): sums of 10^5 terms that cancel are as exact as their terms, not as
    their result.  Each scalar is replaced by a tensor of its site's shape (its value everywhere),
    whose gradient is the terms."""
    shapes, hooks = {}, []

    def note(names, shape):
        for name in names:
            shapes[name] = shape

    for b, layer in enumerate(r64.layers):
        blk, pre = layer[0], f"layers.{b}.0."
        hooks.append(blk.register_forward_pre_hook(lambda m, a, pre=pre: note([pre + "fixup_bias1a"], a[0].shape)))
        hooks.append(blk.conv1.register_forward_hook(
            lambda m, a, o, pre=pre: note([pre + "fixup_bias1b", pre + "fixup_bias2a"], o.shape)))
        hooks.append(blk.conv2.register_forward_hook(
            lambda m, a, o, pre=pre: note([pre + "fixup_scale", pre + "fixup_bias2b"], o.shape)))
    with torch.no_grad():
        r64(x64)
    for h in hooks:
        h.remove()
    params = {k: v.detach() for k, v in r64.named_parameters()}
    expanded = {name: params[name].expand(shape).clone().requires_grad_() for name, shape in shapes.items()}
    out = torch.func.functional_call(r64, {**params, **expanded}, (x64,))
    (out * _projection(out)).sum().backward()
    return {name: t.grad.abs().sum().item() for name, t in expanded.items()}


def _grad_errors(dtype, device, seed=3):
    """Relative error vs a float64 reference, per parameter and the input, of FusedResNet's
    gradients and of the plain reference module's run in the same dtype (what PyTorch
    itself achieves at that precision); per SE block, the conditioning of its excite.0
    gradient (_se_hidden_conditioning); and per FixUp scalar, both errors relative to the sum
    of its gradient's terms' magnitudes (_scalar_term_magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    ref = randomize_(SEResNet9FixUp(3), g).to(device=device, dtype=dtype)
    fused = cutlass_ops.FusedResNet.from_reference(ref).train()
    r64 = SEResNet9FixUp(3).to(device=device, dtype=torch.float64)
    r64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    x = torch.randn(3, 3, 64, 64, generator=g).to(device=device, dtype=dtype)
    terms = _scalar_term_magnitudes(r64, x.double())  # (before the conditioning's hooks)
    kappa = _se_hidden_conditioning(r64)
    want = _grads(r64, x.double())
    got, eager = _grads(fused, x), _grads(ref, x)
    errs = {name: (errors(got[name], w)[0], errors(eager[name], w)[0]) for name, w in want.items()}
    scalar_errs = {name: ((got[name].double() - want[name]).abs().item() / t,
                          (eager[name].double() - want[name]).abs().item() / t) for name, t in terms.items()}
    return errs, {b: kappa(b) for b in range(len(r64.layers))}, scalar_errs


def _rms(values) -> float:
    return (sum(v * v for v in values) / len(values)) ** 0.5


def _is_scalar(name: str) -> bool:
    return "fixup" in name  # FixUp's scalar biases and scale


# 16 bits: which of FusedResNet and PyTorch lands closer to float64 changes with the weights
# and the input (on an AVX512-BF16 EPYC in fp16, tensor-gradient RMS fused/eager: 0.0213/0.0170,
# 0.0215/0.0416, 0.0078/0.0281, 0.0270/0.0126 for seeds 3-6), so one seed's ratio is noise:
# the 16-bit check pools four.
_LOW_PRECISION_SEEDS = (3, 4, 5, 6)


# A unit of the 16-bit dtypes' rounding (2^-p, p the significand's bits).
_UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def _check_grads(dtype, device, bound):
    """float64: every gradient within `bound`.  fp16/bf16: tensor by tensor, pooled over four
    seeds (one seed's ratio is noise: which of FusedResNet and PyTorch lands closer to float64
    changes with the weights and the input), every parameter's gradient and the input's: the
    RMS over the seeds of FusedResNet's relative error at most 2x PyTorch's own (the reference
    module run in the same dtype) plus one unit of the dtype; the FixUp scalars' gradients (sums
    of 10^4-10^6 terms that largely cancel, docs/benchmarks/resnet/h100_gradient_errors_six_inputs.txt)
    measured relative to the sum of their terms' magnitudes, at most 2x PyTorch's plus four
    units (the fuzz's scalar bound).  Also the tensor gradients' RMS at most 1.25x PyTorch's.
    Prints the tables, per seed and pooled."""
    seeds = (3,) if dtype == torch.float64 else _LOW_PRECISION_SEEDS
    pooled, tensors = {}, {}  # (seed, name) -> (fused, eager): every gradient; the tensors' alone
    low = dtype != torch.float64  # (in 16 bits the scalars by their terms' magnitudes)
    for seed in seeds:
        errs, kappa, scalar_errs = _grad_errors(dtype, device, seed)
        print(f"\nFusedResNet grads, {dtype} {device}, seed {seed}: relative error vs float64 (fused, eager same dtype;"
              " FixUp scalars also relative to sum |terms|)")
        for name, (fused, eager) in errs.items():
            extra = "  {:9.2e} {:9.2e}".format(*scalar_errs[name]) if name in scalar_errs else ""
            print(f"  {name:40s} {fused:9.2e} {eager:9.2e}{extra}")
        fused, eager = [e[0] for e in errs.values()], [e[1] for e in errs.values()]
        print(f"over {bound:g}: fused {sum(e > bound for e in fused)}, eager {sum(e > bound for e in eager)} "
              f"of {len(errs)}; RMS fused {_rms(fused):.3g}, eager {_rms(eager):.3g}")
        print("condition of the SE hidden units' gradient sums: "
              + ", ".join(f"block {b} {k:.1f}" for b, k in kappa.items()))
        pooled.update({(seed, name): scalar_errs[name] if low and name in scalar_errs else e
                       for name, e in errs.items()})
        tensors.update({(seed, name): e for name, e in errs.items() if not _is_scalar(name)})
    if dtype == torch.float64:
        assert max(e[0] for e in pooled.values()) <= bound, pooled
        return
    fused_t, eager_t = _rms([e[0] for e in tensors.values()]), _rms([e[1] for e in tensors.values()])
    print(f"tensor gradients over seeds {seeds}: RMS fused {fused_t:.3g}, eager {eager_t:.3g}")
    unit = _UNIT[dtype]
    print(f"pooled over seeds {seeds} (RMS of the relative errors; scalars relative to sum |terms|): "
          "fused, eager, bound, fused / bound")
    worse = {}
    for name in dict.fromkeys(name for _, name in pooled):
        f_ = _rms([pooled[(s, name)][0] for s in seeds])
        e_ = _rms([pooled[(s, name)][1] for s in seeds])
        limit = 2 * e_ + (4 * unit if _is_scalar(name) else unit)
        print(f"  {name:40s} {f_:9.2e} {e_:9.2e} {limit:9.2e} {f_ / limit:6.2f}")
        if f_ > limit:
            worse[name] = (f_, e_, limit)
    assert fused_t <= 1.25 * eager_t, (fused_t, eager_t)
    assert not worse, ("gradients over 2x PyTorch's own error (fused, eager, bound)", worse)


def test_fused_resnet_gradients_cpu_float64():
    # Not ~1e-15: the FixUp scalars' gradients are sums of ~10^5 terms that largely cancel
    # (block 0's b1a reaches the identity path as xa - b1a), which amplifies rounding.
    _check_grads(torch.float64, "cpu", 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, bound", [(torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
def test_fused_resnet_gradients_low_precision(device, dtype, bound):
    _check_grads(dtype, device, bound)


def test_fused_resnet_trains_with_an_optimizer():
    with seeded(0):
        ref = randomize_(SEResNet9FixUp(1), torch.Generator().manual_seed(4))
    model = cutlass_ops.FusedResNet.from_reference(ref).train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 1, 64, 64)
    target = torch.randn(4, 512, 2, 2)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_loss_curve_matches_the_reference():
    from cutlass_ops.tools.train_check import train_curves
    result = train_curves(steps=6, n=4, device="cpu", dtype=torch.float32)
    assert result["max_rel_diff"] < 1e-4, result["curves"]


@pytest.mark.long
def test_training_step_under_torch_compile():
    # The default (inductor) backend on the whole module, as users call it: the ops' fake
    # impls trace, the backward's ops (relu_backward, se_gate_backward) too.
    ref = randomize_(SEResNet9FixUp(1), torch.Generator().manual_seed(5))
    fused = cutlass_ops.FusedResNet.from_reference(ref).train()
    x = torch.randn(2, 1, 64, 64)
    compiled = torch.compile(fused, fullgraph=True)
    compiled(x).square().sum().backward()
    got = {n: p.grad.clone() for n, p in fused.named_parameters()}
    fused.zero_grad()
    fused(x).square().sum().backward()
    for n, p in fused.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.fallback  # float32 on CUDA: the ATen path against the CPU
def test_se_gate_avgpool_gradients_cuda_match_cpu():
    # CUDA's avg_pool2d backward is wrong for channels_last input with padding
    # (pytorch/pytorch#188344); se_gate's backward must not go through that path.
    g = torch.Generator().manual_seed(11)
    args = [torch.randn(3, 64, 8, 8, generator=g), torch.randn(3, 64, 8, 8, generator=g),
            torch.randn(4, 64, generator=g) / 8, torch.randn(4, generator=g),
            torch.randn(64, 4, generator=g) / 2, torch.randn(64, generator=g), None, torch.randn((), generator=g)]
    grad_out = torch.randn(3, 64, 8, 8, generator=g)
    grad_pooled = torch.randn(3, 64, 4, 4, generator=g)  # NCHW-contiguous, as a conv's dgrad may give

    def grads(device):
        leaves = [a.to(device).requires_grad_() if a is not None else None for a in args]
        h, idn = (t.detach().contiguous(memory_format=torch.channels_last).requires_grad_() for t in leaves[:2])
        out, pooled = cutlass_ops.se_gate(h, idn, *leaves[2:], avgpool=True)
        torch.autograd.backward([out, pooled], [grad_out.to(device), grad_pooled.to(device)])
        return [h.grad, idn.grad] + [t.grad for t in leaves[2:] if t is not None]

    for got, want in zip(grads("cuda"), grads("cpu")):
        assert errors(got, want)[0] < 1e-5


@pytest.mark.parametrize("device, dtype", [("cpu", torch.bfloat16), pytest.param(
    "cuda", torch.float16, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_autocast_casts_like_pytorch_and_keeps_float32_gradients(device, dtype):
    # float32 weights under torch.autocast: FusedResNet casts the input and conv weights to
    # the autocast dtype, as autocast does for the reference's convs.
    g = torch.Generator().manual_seed(8)
    ref = randomize_(SEResNet9FixUp(3), g).to(device)
    fused = cutlass_ops.FusedResNet.from_reference(ref).train()
    r64 = SEResNet9FixUp(3).double().to(device)
    r64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    x = torch.randn(2, 3, 64, 64, generator=g).to(device)
    want = _grads(r64, x.double())
    with torch.autocast(device, dtype=dtype):
        out = fused(x)
        got, eager = _grads(fused, x), _grads(ref, x)
    assert out.dtype == dtype
    assert errors(out, r64(x.double()))[0] < 2e-2
    assert all(got[n].dtype == torch.float32 for n in got if n != "input")
    fused_rms = _rms([errors(got[n], w)[0] for n, w in want.items()])
    eager_rms = _rms([errors(eager[n], w)[0] for n, w in want.items()])
    assert fused_rms <= 1.25 * eager_rms, (fused_rms, eager_rms)


def test_mixed_precision_training_with_grad_scaler():
    from cutlass_ops.tools.train_check import train_curves
    result = train_curves(steps=5, n=4, device="cpu", dtype=torch.float32, amp_dtype=torch.bfloat16)
    for losses in result["curves"].values():
        assert losses[-1] < losses[0]
    assert result["max_rel_diff"] < 5e-2, result["curves"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_step_in_a_cuda_graph_matches_eager():
    """A captured fwd+bwd step (the backward's wgrads then run on a side stream beside the
    dgrads) gives the eager step's gradients, for an input other than the captured one."""
    from cutlass_ops.tools.timing import graphed
    g = torch.Generator().manual_seed(11)
    ref = randomize_(SEResNet9FixUp(3), g).to(device="cuda", dtype=torch.float16)
    model = cutlass_ops.FusedResNet.from_reference(ref).train()
    x = torch.randn(64, 3, 64, 64, generator=g).to(device="cuda", dtype=torch.float16)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()

    replay = graphed(step)
    x.copy_(torch.randn(x.shape, generator=g).to(x))
    replay()
    captured = {n: p.grad.clone() for n, p in model.named_parameters()}
    step()  # eager, same input
    for n, p in model.named_parameters():
        rel, _ = errors(captured[n], p.grad)
        assert rel < 1e-5, (n, rel)


def test_wgrads_finish_late_only_for_single_use_leaves_without_grad_or_hooks():
    # A captured backward lets a wgrad finish at the end of the pass only when nothing reads
    # its gradient before then (autograd.stored_as_is): guard every case that would.
    from cutlass_ops.streams import single_use_declared, stored_as_is, weights_used_once
    w = torch.nn.Parameter(torch.randn(3))
    assert stored_as_is(None, used_once=False)  # no such gradient
    assert stored_as_is(w, used_once=True)
    assert not stored_as_is(w, used_once=False)  # maybe used twice: the two gradients get added
    w.grad = torch.zeros(3)
    assert not stored_as_is(w, used_once=True)  # accumulated into .grad by a kernel
    w.grad = None
    hook = w.register_hook(lambda grad: grad)
    assert not stored_as_is(w, used_once=True)  # a tensor hook reads it
    hook.remove()
    hook = w.register_post_accumulate_grad_hook(lambda p: None)
    assert not stored_as_is(w, used_once=True)
    hook.remove()
    assert stored_as_is(w, used_once=True)
    assert not stored_as_is(w * 2, used_once=True)  # not a leaf (an autocast copy): a cast reads it
    assert not single_use_declared()
    with weights_used_once():
        assert single_use_declared()
    assert not single_use_declared()
