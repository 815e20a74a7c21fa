"""cutlass_ops.ops.conv2d_fused_se_gate (se_gate with h = scale * conv2d(x, w) + h_bias as its
input) against float64: its one kernel on sm90 (the halo conv with se_gate as its epilogue,
kernels/conv2d_fused/conv2d_fused_sm90_halo_se_gate.cu: block 0's 16x16x64), checked to have
run; the two kernels it fuses for other shapes; the ATen composite on the CPU.  Poisoned
outputs, random non-zero FixUp scalars, odd batches (one image per CTA, several per CTA,
unevenly); the pooled map; the backward; FusedResNet taking it in inference only."""
import pytest
import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops.ops import (conv2d_fused_kernels, conv2d_fused_se_gate, conv2d_fused_se_gate_last_kernel,
                             conv2d_fused_se_gate_why_not)
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, fallback

ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0) and bool(conv2d_fused_kernels(90))
LOW_PRECISION = [torch.float16, torch.bfloat16]


def make(n, c, k, hw, r, dtype, device, g):
    rnd = lambda *s, std=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * std  # noqa: E731
    t = dict(x=rnd(n, c, hw, hw).to(dtype), w=rnd(k, c, 3, 3, std=(2.0 / (9 * c)) ** 0.5).to(dtype),
             identity=rnd(n, k, hw, hw).to(dtype), w1=rnd(r, k, std=k ** -0.5).float(), b1=rnd(r).float(),
             w2=rnd(k, r, std=r ** -0.5).float(), b2=rnd(k).float(),
             scale=torch.tensor(0.5 + rnd(()).abs().item()), idb=torch.tensor(0.3 * rnd(()).item()),
             pb=torch.tensor(0.3 * rnd(()).item()), hb=torch.tensor(0.3 * rnd(()).item()))
    return {key: (v.to(device).contiguous(memory_format=torch.channels_last) if v.dim() == 4 else v.to(device))
            for key, v in t.items()}


def reference(t, dtype=torch.float64):
    """The op's math in `dtype` on the CPU: float64 is the reference; the input dtype on CUDA
    (conv2d, then the gate, each rounded) is PyTorch's own error."""
    d = {k: v.to(dtype) for k, v in t.items()}
    h = F.conv2d(d["x"], d["w"], padding=1) * d["scale"] + d["hb"]
    g = torch.sigmoid(F.linear(torch.relu(F.linear(h.mean((2, 3)), d["w1"], d["b1"])), d["w2"], d["b2"]))
    return torch.relu(h * g[:, :, None, None] + d["identity"] + d["idb"]) + d["pb"]


def run(t, avgpool=False):
    return conv2d_fused_se_gate(t["x"], t["w"], t["scale"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"],
                                t["idb"], t["pb"], avgpool=avgpool, h_bias=t["hb"])


def fused_here(t) -> bool:
    return conv2d_fused_se_gate_why_not(t["x"], t["w"], t["identity"], t["w1"]) is None


# (n, c, k, hw, r): block 0 (one image, an odd batch, more images than an H100's 132 SMs so that
# CTAs take two or one, a batch of several per CTA), the widest excite the kernel takes; then
# shapes it does not take (the two-kernel path on CUDA: marked fallback).
KERNEL_SHAPES = [(1, 64, 64, 16, 4), (3, 64, 64, 16, 4), (133, 64, 64, 16, 4), (1031, 64, 64, 16, 4),
                 (5, 64, 64, 16, 16), (2, 64, 64, 16, 1)]
OTHER_SHAPES = [(3, 64, 64, 8, 4), (2, 32, 48, 16, 3), (2, 64, 64, 16, 17)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("shape", KERNEL_SHAPES + [fallback(s) for s in OTHER_SHAPES],
                         ids=lambda s: "n{}c{}k{}_{}x{}r{}".format(s[0], s[1], s[2], s[3], s[3], s[4]))
@pytest.mark.parametrize("avgpool", [False, True])
def test_numerics(device, dtype, shape, avgpool, rng):
    if device == "cpu" and shape[0] > 200:
        pytest.skip("the CPU composite at this batch only repeats the smaller cases")
    t = make(*shape, dtype, device, rng)
    if device == "cuda":  # unwritten outputs show as NaN
        torch.full((8 * t["identity"].numel(),), float("nan"), dtype=dtype, device=device)
    got = run(t, avgpool)
    out, pooled = got if avgpool else (got, None)
    last = conv2d_fused_se_gate_last_kernel()
    if device == "cuda" and ON_SM90 and shape in KERNEL_SHAPES:
        assert fused_here(t) and last.endswith("_se_gate") and "_sm90_halo" in last, last
    elif device == "cuda":
        assert last.startswith("two kernels ("), last
    else:
        assert last == "aten"
    ref = reference({k: v.cpu() for k, v in t.items()})
    rel, mx = errors(out, ref)
    rel_tol, max_tol = TOLERANCE[dtype]
    if device == "cuda":  # against PyTorch's own error in this dtype, on the GPU
        torch_rel, _ = errors(reference(t, dtype), ref)
        rel_tol = max(2 * torch_rel, 1e-4)
    assert rel <= rel_tol and mx <= max_tol, f"out: rel {rel:.2e} (bound {rel_tol:.2e}) max {mx:.2e}"
    assert out.shape == ref.shape and out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
    if avgpool:  # pooled from the op's own rounded output
        want = F.avg_pool2d(out.double().cpu(), 3, 2, 1, count_include_pad=True)
        rel, mx = errors(pooled, want)
        assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"pooled: rel {rel:.2e} max {mx:.2e}"
        assert pooled.shape == want.shape and pooled.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.skipif(not ON_SM90, reason="needs an sm90 GPU and a build with family-90 kernels")
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.fallback  # compared with the two-kernel fallback (CUTLASS_OPS_SM90_HALO=0)
def test_kernel_is_deterministic_and_as_accurate_as_the_two_kernels(dtype, rng, monkeypatch):
    """The same bits on every call; the one kernel's error against float64 no more than a quarter
    above the two kernels' (both gate h rounded to the input dtype; the one kernel's squeeze is
    over float32 h)."""
    t = make(300, 64, 64, 16, 4, dtype, "cuda", rng)
    first = run(t, True)
    assert conv2d_fused_se_gate_last_kernel().endswith("_sm90_halo3x3s1_w16c64k64_se_gate")
    for _ in range(2):
        again = run(t, True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    monkeypatch.setenv("CUTLASS_OPS_SM90_HALO", "0")
    with cutlass_ops.paths.strict(False):
        two = run(t, False)
    assert conv2d_fused_se_gate_last_kernel() == "two kernels (CUTLASS_OPS_SM90_HALO=0)"
    ref = reference({k: v.cpu() for k, v in t.items()})
    assert errors(first[0], ref)[0] <= 1.25 * errors(two, ref)[0]


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device, rng):
    t = make(2, 64, 64, 16, 4, torch.float16, device, rng)
    call = lambda **kw: conv2d_fused_se_gate(*(kw.get(k, t[k]) for k in ("x", "w", "scale", "identity", "w1", "b1", "w2", "b2")))  # noqa: E731,E501
    with pytest.raises(ValueError, match="identity must have the conv output's shape"):
        call(identity=t["identity"][:, :, :8])
    with pytest.raises(ValueError, match="identity dtype"):
        call(identity=t["identity"].float())
    with pytest.raises(ValueError, match="fc1_weight must be"):
        call(w1=t["w1"].t())
    with pytest.raises(ValueError, match="weight dtype"):
        call(w=t["w"].float())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("avgpool", [False, True])
def test_opcheck(device, avgpool, rng):
    t = make(2, 64, 64, 16, 4, torch.float16, device, rng)
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_fused_se_gate.default,
                          (t["x"], t["w"], t["scale"], t["identity"], t["w1"], t["b1"], t["w2"], t["b2"], t["idb"],
                           t["pb"], avgpool, t["hb"], [1, 1], [1, 1]))


@pytest.mark.parametrize("device", DEVICES)
def test_backward(device, rng):
    """Every input's gradient against float64 autograd of the same math (the op's backward
    recomputes h through conv2d_fused: float32 on the CPU, fp16 on CUDA)."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    t = make(3, 64, 64, 16, 4, dtype, device, rng)
    names = ["x", "w", "scale", "identity", "w1", "b1", "w2", "b2", "idb", "pb", "hb"]
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
    out, pooled = run(leaves, True)
    g = torch.Generator().manual_seed(7)
    go, gp = (torch.randn(v.shape, generator=g).to(device=device, dtype=dtype) for v in (out, pooled))
    got = torch.autograd.grad([out, pooled], [leaves[k] for k in names], [go, gp])
    ref_leaves = {k: t[k].detach().double().cpu().requires_grad_(True) for k in names}
    ref_out = reference(ref_leaves)
    ref_pooled = F.avg_pool2d(ref_out, 3, 2, 1, count_include_pad=True)
    want = torch.autograd.grad([ref_out, ref_pooled], [ref_leaves[k] for k in names],
                               [go.double().cpu(), gp.double().cpu()])
    bound = 1e-4 if device == "cpu" else 2e-2
    for name, a, b in zip(names, got, want):
        rel, _ = errors(a, b)
        assert rel <= bound, f"grad {name}: rel {rel:.2e}"


@pytest.mark.skipif(not ON_SM90, reason="needs an sm90 GPU and a build with family-90 kernels")
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
def test_fused_resnet_takes_it_in_inference_only(dtype, rng, monkeypatch):
    """FusedResNet(fuse_se_gate=True) runs it for block 0 in inference (not by default, nor in
    training); its output against float64 is checked by test_fused_resnet.py's cases."""
    x = torch.randn(140, 3, 64, 64, generator=rng).to(device="cuda", dtype=dtype)  # > 132 images: CTAs take two
    default = {name for name, _, _ in cutlass_ops.FusedResNet(3).cuda().to(dtype).kernel_report(x)}
    assert "layers.0.conv2" in default and "layers.0.conv2+se_gate" not in default
    model = cutlass_ops.FusedResNet(3, fuse_se_gate=True).cuda().to(dtype)
    report = {name: kernel for name, _, kernel in model.kernel_report(x)}
    assert "layers.0.conv2" not in report, report
    assert report["layers.0.conv2+se_gate"].endswith("_sm90_halo3x3s1_w16c64k64_se_gate"), report
    assert all("se_gate" not in k for name, k in report.items() if name != "layers.0.conv2+se_gate"), report

    # Training: conv2 and se_gate stay two ops (their backward needs h).
    def not_in_training(*args, **kwargs):
        raise AssertionError("conv2d_fused_se_gate called with gradients wanted")
    monkeypatch.setattr(cutlass_ops.fused_resnet, "conv2d_fused_se_gate", not_in_training)
    model(x).float().sum().backward()
