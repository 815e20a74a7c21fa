"""The GPU selection tests/gpu_sanitize.sh runs under compute-sanitizer (memcheck, racecheck,
initcheck, synccheck): every kernel of the library at least once, at the smallest shapes
that reach it (racecheck is slow).  Each test also checks its result, loosely, so that a
kernel that silently did nothing shows.  Tests whose name contains "graph" capture CUDA
graphs: the script runs them with the caching allocator on (capture needs it), the rest
without it (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that memcheck sees each allocation's
bounds)."""
import os

import pytest
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from cutlass_ops import ops
from _helpers import HAS_CUDA, b2b_reference, errors, seeded

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
H = torch.float16
CL = torch.channels_last
UNCACHED = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"


def _r(*shape, dtype=H, scale=1.0, cl=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = (torch.randn(shape, generator=g) * scale).to(dtype).cuda()
    return t.contiguous(memory_format=CL) if cl else t


def _family_kernels(family):
    names = [n for n in ops.conv2d_fused_kernels(family) if "_f16_" in n]
    return names


# ---- conv2d_fused: every epilogue, dispatcher's choice, one forced kernel per family, split-K --

EPILOGUES = {
    "bias_relu": dict(bias="vec", relu=True),
    "scalar_bias": dict(bias="scalar"),
    "fixup_scale_post_bias_relu": dict(bias="scalar", scale=True, post_bias=True, relu=True),
    "residual": dict(bias="vec", residual=True, relu=True),
    "plain": dict(),
}


def _conv_case(epi, n=2, c=16, k=16, hw=6, stride=1):
    x, w = _r(n, c, hw, hw, cl=True), _r(k, c, 3, 3, scale=(9 * c) ** -0.5, cl=True)
    p = (hw + 2 - 3) // stride + 1
    bias = {"vec": _r(k, dtype=torch.float32), "scalar": _r(dtype=torch.float32), None: None}[epi.get("bias")]
    res = _r(n, k, p, p, cl=True) if epi.get("residual") else None
    scale = torch.tensor(0.75, device="cuda") if epi.get("scale") else None
    post = torch.tensor(0.25, device="cuda") if epi.get("post_bias") else None
    args = (x, w, bias, res, stride, 1, scale, post, epi.get("relu", False))
    y = F.conv2d(x.double(), w.double(), None, stride, 1)
    if scale is not None:
        y = y * 0.75
    if bias is not None:
        y = y + (bias.double().view(1, -1, 1, 1) if bias.dim() else bias.double())
    if res is not None:
        y = y + res.double()
    if epi.get("relu"):
        y = y.relu()
    if post is not None:
        y = y + 0.25
    return args, y


@pytest.mark.parametrize("epi", list(EPILOGUES))
def test_conv2d_fused_epilogue(epi):
    args, want = _conv_case(EPILOGUES[epi])
    out = cutlass_ops.conv2d_fused(*args)
    assert cutlass_ops.conv2d_fused_last_kernel().startswith("cutlass"), cutlass_ops.conv2d_fused_last_kernel()
    assert errors(out, want)[0] < 1e-2


@pytest.mark.parametrize("family", [80, 90])
@pytest.mark.parametrize("split_k", [0, 2])
def test_conv2d_fused_forced_family(family, split_k):
    """One kernel of each arch family this GPU runs (the dispatcher may prefer one), and
    serial split-K (its semaphores: racecheck/synccheck)."""
    names = _family_kernels(family)
    if family == 90 and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("family-90 kernels run on sm90 only")
    if family == 90 and os.environ.get("CUTLASS_OPS_SM90") == "0":
        pytest.skip("CUTLASS_OPS_SM90=0 (gpu_sanitize.sh's initcheck: tests/sanitize_tma_probe.py instead)")
    if not names:
        pytest.skip(f"no family-{family} f16 kernels built")
    args, want = _conv_case(EPILOGUES["fixup_scale_post_bias_relu"], n=1, c=64, k=64, hw=4)
    ran = None
    for name in names:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, split_k)
        try:
            out = cutlass_ops.conv2d_fused(*args)
            ran = name
            break
        except ValueError:  # this kernel cannot run the problem: the next one
            continue
        finally:
            torch.ops.cutlass_ops.conv2d_fused_force_kernel("", 0)
    if ran is None:
        pytest.skip(f"no family-{family} kernel runs this problem with split_k={split_k}")
    assert errors(out, want)[0] < 1e-2, ran


def test_conv2d_fused_align1():
    """Channel counts that are not multiples of 8: the lower-alignment kernels."""
    args, want = _conv_case(EPILOGUES["bias_relu"], c=3, k=5)
    out = cutlass_ops.conv2d_fused(*args)
    assert errors(out, want)[0] < 1e-2


# ---- conv2d_b2b: every built back-to-back instance (register- and shared-memory-resident) ----

@pytest.mark.parametrize("name", ops.conv2d_b2b_kernels() or ["(none built)"])
def test_conv2d_b2b(name):
    if name == "(none built)":
        pytest.skip("no conv2d_b2b instances in this build")
    k0, k1 = (int(part[1:]) for part in name.split("_")[-3:-1])
    dtype = H if "_f16_" in name else torch.bfloat16
    x = _r(3, 16, 5, 7, dtype=dtype, cl=True)
    w0, w1 = _r(k0, 16, 3, 3, dtype=dtype, scale=0.25), _r(k1, k0, 1, 1, dtype=dtype, scale=k0 ** -0.5)
    b0, b1 = _r(k0, dtype=dtype, seed=1), _r(k1, dtype=dtype, seed=2)
    out = cutlass_ops.conv2d_b2b(x, w0, b0, w1, b1, stride=1, padding=1)
    assert ops.conv2d_b2b_last_kernel() == name
    assert errors(out, b2b_reference(x, w0, b0, w1, b1, 1, 1, round_to=dtype))[0] < 2e-2


# ---- dgrad / wgrad: unity and strided CUTLASS kernels, split-K wgrad, the cuDNN path's scaling --

def _bwd_kernels(kind):
    return [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels() if k.startswith(f"cutlass_ops_conv2d_{kind}_f16_")]


def _first_that_runs(names, split, fn):
    """fn() with the first of the forced kernels that can run the problem."""
    for name in names:
        torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, split)
        try:
            return fn()
        except ValueError as e:  # this kernel cannot run the problem (e.g. too few K-iterations to split)
            assert "cannot run this problem" in str(e), e
        finally:
            torch.ops.cutlass_ops.conv2d_backward_force_kernel("", 0)
    pytest.skip(f"none of {names} runs this problem (split {split})")


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("forced", ["unity", "strided", "cudnn"])
def test_conv2d_dgrad(stride, forced):
    if forced == "unity" and stride > 1:
        pytest.skip("unity-stride kernels need stride 1")
    names = ["cudnn"] if forced == "cudnn" else [k for k in _bwd_kernels("dgrad") if f"_{forced}_" in k]
    if not names:
        pytest.skip(f"no {forced} dgrad kernel built")
    n, c, k, hw = 2, 16, 16, 6
    x, w = _r(n, c, hw, hw, cl=True), _r(k, c, 3, 3, scale=0.1, cl=True)
    p = (hw + 2 - 3) // stride + 1
    dy = _r(n, k, p, p, cl=True)
    scale = torch.tensor(0.5, device="cuda")
    dx = _first_that_runs(names, 0, lambda: cutlass_ops.conv2d_dgrad(dy, w, x.shape, stride, 1, scale))
    want = conv2d_input(x.shape, w.double().cpu() * 0.5, dy.double().cpu(), stride, 1)
    assert errors(dx, want)[0] < 1e-2


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("split", [1, 3, "cudnn"])
def test_conv2d_wgrad(stride, split):
    names = ["cudnn"] if split == "cudnn" else _bwd_kernels("wgrad")
    if not names:
        pytest.skip("no wgrad kernel built")
    n, c, k, hw = 2, 16, 16, 6
    x, w = _r(n, c, hw, hw, cl=True), _r(k, c, 3, 3, scale=0.1, cl=True)
    p = (hw + 2 - 3) // stride + 1
    dy = _r(n, k, p, p, cl=True)
    scale = torch.tensor(0.5, device="cuda")
    dw, ds = _first_that_runs(names, 0 if split == "cudnn" else split,
                              lambda: cutlass_ops.conv2d_wgrad(dy, x, w, stride, 1, scale))
    g = conv2d_weight(x.double().cpu(), w.shape, dy.double().cpu(), stride, 1)
    assert errors(dw, g * 0.5)[0] < 1e-2
    assert abs(ds.item() - (g * w.double().cpu()).sum().item()) <= 1e-2 * (g * w.double().cpu()).abs().sum().item()


# ---- se_gate and its backward; relu_backward ---------------------------------------------------

SE_SHAPES = {"one_image_per_cta": (2, 64, 4, 4), "grouped_images": (300, 64, 2, 2), "w2_unstaged": (1, 2048, 2, 2)}


def _se_args(shape):
    n, c, h, w = shape
    r = max(c // 16, 1)
    return (_r(n, c, h, w, cl=True), _r(n, c, h, w, cl=True, seed=1), _r(r, c, dtype=torch.float32, scale=c ** -0.5),
            _r(r, dtype=torch.float32), _r(c, r, dtype=torch.float32, scale=r ** -0.5), _r(c, dtype=torch.float32))


@pytest.mark.parametrize("shape", list(SE_SHAPES))
@pytest.mark.parametrize("avgpool", [False, True])
def test_se_gate_and_backward(shape, avgpool):
    h, idn, w1, b1, w2, b2 = _se_args(SE_SHAPES[shape])
    idb, pb, hb = (torch.tensor(v, device="cuda") for v in (0.1, 0.2, 0.3))
    got = cutlass_ops.se_gate(h, idn, w1, b1, w2, b2, idb, pb, avgpool=avgpool, h_bias=hb)
    out = got[0] if avgpool else got
    ref = cutlass_ops.se_gate(*(t.double().cpu() for t in (h, idn, w1, b1, w2, b2, idb, pb)), avgpool=False,
                              h_bias=hb.double().cpu())
    assert errors(out, ref)[0] < 1e-2
    n, c, hh, ww = h.shape
    grad_out = _r(n, c, hh, ww, cl=True, seed=2)
    grad_pooled = _r(n, c, (hh + 1) // 2, (ww + 1) // 2, cl=True, seed=3) if avgpool else None
    grads = ops.se_gate_backward(grad_out, grad_pooled, h, out, w1, b1, w2, b2, pb, hb)
    assert all(torch.isfinite(t).all() for t in grads)


@pytest.mark.parametrize("shape", ["one_image_per_cta", "grouped_images"])
def test_se_gate_cached_maps_and_split_ops(shape, monkeypatch):
    # The kernel's shared-memory map cache (cp.async; forced on at these small shapes) and its
    # two split modes (se_squeeze, se_gate_apply).
    monkeypatch.setenv("CUTLASS_OPS_SE_CACHE", "1")
    h, idn, w1, b1, w2, b2 = _se_args(SE_SHAPES[shape])
    idb, pb, hb = (torch.tensor(v, device="cuda") for v in (0.1, 0.2, 0.3))
    out, _ = cutlass_ops.se_gate(h, idn, w1, b1, w2, b2, idb, pb, avgpool=True, h_bias=hb)
    cpu = [t.double().cpu() for t in (h, idn, w1, b1, w2, b2, idb, pb, hb)]
    ref = cutlass_ops.se_gate(*cpu[:8], avgpool=False, h_bias=cpu[8])
    assert errors(out, ref)[0] < 1e-2
    means = ops.se_squeeze(h, hb)
    assert errors(means, (cpu[0] + cpu[8]).mean((2, 3)))[0] < 1e-2
    gate = torch.sigmoid(F.linear(torch.relu(F.linear(means.float(), w1, b1)), w2, b2))
    applied, _ = ops.se_gate_apply(h, idn, gate, idb, pb, avgpool=True, h_bias=hb)
    assert errors(applied, ref)[0] < 1e-2


def test_relu_backward():
    out = torch.relu(_r(3, 16, 5, 5, cl=True)) + 0.25
    grad = _r(3, 16, 5, 5, cl=True, seed=1)
    for pb, o in ((torch.tensor(0.25, device="cuda"), out), (None, out - 0.25)):
        grad_z, sums = ops.relu_backward(grad, o, pb)
        assert torch.equal(grad_z, torch.where(o != (0.25 if pb is not None else 0), grad, 0).to(grad_z))
    odd = _r(7, 3, dtype=H)  # not 16-byte vectorizable: the scalar loop
    ops.relu_backward(odd, odd, None)


# ---- space_to_depth_conv and its weight gradient -----------------------------------------------

@pytest.mark.parametrize("k", [32, 64, 128])
def test_space_to_depth_conv_and_weight_grad(k):
    x = _r(2, 3, 16, 16)
    w = _r(k, 48, 1, 1, scale=48 ** -0.5)
    pb = torch.tensor(0.1, device="cuda")
    out = cutlass_ops.space_to_depth_conv(x, w, pb, relu=True)
    s2d = x.double().cpu().reshape(2, 3, 4, 4, 4, 4).permute(0, 3, 5, 1, 2, 4).reshape(2, 48, 4, 4)
    assert errors(out, F.conv2d(s2d, w.double().cpu()).relu() + 0.1)[0] < 1e-2
    grad = _r(*out.shape, cl=True, seed=4)
    dw, sums = ops.space_to_depth_conv_weight_grad(grad, x, out, pb)
    assert dw.shape == (k, 48, 1, 1) and torch.isfinite(dw).all() and torch.isfinite(sums).all()


# ---- giou -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("form", ["flat", "padded", "ragged"])
def test_giou_forward_backward(dtype, form):
    g = torch.Generator().manual_seed(0)
    lo, size = torch.rand(2, 300, 2, generator=g) * 10, torch.rand(2, 300, 2, generator=g) * 5
    b = torch.cat([lo, lo + size], -1).to(dtype).cuda()
    p, t = b[0].clone().requires_grad_(), b[1].clone().requires_grad_()
    if form == "flat":
        loss = cutlass_ops.giou_loss(p, t, "mean")
    elif form == "padded":
        counts = torch.tensor([100, 37, 0], device="cuda")
        loss = cutlass_ops.giou_loss_padded(p.view(3, 100, 4), t.view(3, 100, 4), counts=counts, reduction="sum")
    else:
        loss = cutlass_ops.giou_loss_ragged(p, t, torch.tensor([0, 120, 250], device="cuda"), "none").sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(p.grad).all() and torch.isfinite(t.grad).all()


# ---- layer_norm_rows: its forward and backward kernels (16-byte and element-wise rows, the add) --

@pytest.mark.parametrize("cols", [64, 57])
def test_layer_norm_rows_forward_backward(cols):  # w, b: the global generators, seeded per test
    x = _r(33, cols).requires_grad_()
    r = _r(33, cols, seed=1).requires_grad_()
    w = (torch.rand(cols, device="cuda") + 0.5).requires_grad_()
    b = torch.randn(cols, device="cuda").requires_grad_()
    y, s = cutlass_ops.ops.layer_norm_rows(x, w, b, 1e-5, r)
    (y.float().square().sum() + s.float().sum()).backward()
    want = torch.nn.functional.layer_norm((x + r).float(), [cols], w, b, 1e-5)
    assert errors(y, want)[0] < 1e-2
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (x, r, w, b))


# ---- dw_conv3x3_tokens: the depthwise conv kernel (16-byte and element-wise, a lead row, images apart) --

@pytest.mark.parametrize("c, strides", [(64, [1, 2, 2]), (5, [2, 1])])
def test_dw_conv3x3_tokens(c, strides):
    full = _r(3, 1 + 7 * 5, c)
    x, lead = full[:, 1:], full[:, :1]
    w = _r(len(strides), c, 1, 3, 3, seed=1)
    b = _r(len(strides), c, seed=2)
    ys = cutlass_ops.ops.dw_conv3x3_tokens(x, 7, 5, w, b, strides, lead)
    m = x.float().reshape(3, 7, 5, c).permute(0, 3, 1, 2)
    for j, (y, s) in enumerate(zip(ys, strides)):
        want = torch.nn.functional.conv2d(m, w[j].float(), b[j].float(), s, 1, 1, c).flatten(2).transpose(1, 2)
        assert errors(y[:, 1:], want)[0] < 1e-2 and torch.equal(y[:, :1], lead)


@pytest.mark.parametrize("c, strides", [(64, [1, 2, 2]), (5, [2, 1])])
def test_dw_conv3x3_tokens_backward_input(c, strides):
    w = _r(len(strides), c, 1, 3, 3, seed=1)
    grads = [_r(3, ((7 - 1) // s + 1) * ((5 - 1) // s + 1), c, seed=3 + j) for j, s in enumerate(strides)]
    gx = cutlass_ops.ops.dw_conv3x3_tokens_backward_input(grads, 7, 5, w, strides)
    x = torch.zeros(3, 7 * 5, c, dtype=torch.float64, device=gx.device, requires_grad=True)
    m = x.reshape(3, 7, 5, c).permute(0, 3, 1, 2)
    ys = [torch.nn.functional.conv2d(m, w[j].double(), None, s, 1, 1, c).flatten(2).transpose(1, 2)
          for j, s in enumerate(strides)]
    torch.autograd.backward(ys, [g.double() for g in grads])
    assert errors(gx, x.grad)[0] < 1e-2


# ---- FusedMLP: the generated forward and backward kernels (odd widths: padding inside) -------------

@pytest.mark.parametrize("rows", [1, 131])
@pytest.mark.parametrize("fused_dw", [True, False])
def test_fused_mlp_forward_backward(rows, fused_dw):
    """A 3-layer MLP with odd widths and two activations, forward and backward (the kernel is
    compiled at first use, outside the sanitized kernels), the weight gradients in the backward
    kernel (MlpOptions.fused_weight_grads) or as GEMMs.  Against the module's own float32 CPU
    path, loosely."""
    with seeded(rows):
        ref = torch.nn.Sequential(torch.nn.Linear(19, 57), torch.nn.SiLU(), torch.nn.Linear(57, 40),
                                  torch.nn.Tanh(), torch.nn.Linear(40, 7))
    cpu = cutlass_ops.FusedMLP.from_module(ref, torch.randn(2, 19))
    gpu = cutlass_ops.FusedMLP.from_module(ref.cuda().half(), torch.randn(2, 19),
                                           options=cutlass_ops.MlpOptions(fused_weight_grads=fused_dw))
    x = torch.randn(rows, 19)
    xg = x.cuda().half().requires_grad_()
    y = gpu(xg)
    y.float().square().sum().backward()
    xc = x.clone().requires_grad_()
    yc = cpu(xc)
    yc.square().sum().backward()
    assert errors(y, yc.detach())[0] < 1e-2
    assert errors(xg.grad, xc.grad)[0] < 3e-2
    for pg, pc in zip(gpu.parameters(), cpu.parameters()):
        assert pg.grad is not None and errors(pg.grad, pc.grad)[0] < 3e-2


# ---- FusedResNet: forward and a training step, eager and graphed ---------------------------------

def _model(graph=False):
    from cutlass_ops.models import SEResNet9FixUp
    from test_fused_resnet import randomize_
    ref = randomize_(SEResNet9FixUp(3), torch.Generator().manual_seed(0)).cuda().half()
    return cutlass_ops.FusedResNet.from_reference(ref, graph=graph)


def test_fused_resnet_forward():
    model = _model().eval()
    with torch.no_grad():
        y = model(_r(2, 3, 64, 64))
    assert y.shape == (2, 512, 2, 2) and torch.isfinite(y).all()


def test_fused_resnet_forward_graph():
    if UNCACHED:
        pytest.skip("CUDA graphs need the caching allocator")
    model = _model(graph=True).eval()
    x = _r(2, 3, 64, 64)
    with torch.no_grad():
        y1 = model(x).clone()
        y2 = model(x)
    assert torch.equal(y1, y2) and torch.isfinite(y2).all()


def _train_step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()


def test_fused_resnet_training_step():
    model = _model().train()
    _train_step(model, _r(2, 3, 64, 64))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_fused_resnet_training_step_graph():
    if UNCACHED:
        pytest.skip("CUDA graphs need the caching allocator")
    from cutlass_ops.tools.timing import graphed
    model = _model().train()
    x = _r(2, 3, 64, 64)
    replay = graphed(lambda: _train_step(model, x))
    replay()
    torch.cuda.synchronize()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
