"""The GPU selection tests/gpu_sanitize.sh runs under compute-sanitizer (memcheck, racecheck,
initcheck, synccheck): every public op's kernels (COVERAGE: op -> the tests that launch it) at
least once, at the smallest shapes that reach them (the sanitizers are 10-100x slower).  Each
test also checks its result, loosely, so that a kernel that silently did nothing shows.  Tests
whose name contains "graph" capture CUDA graphs: the script runs them with the caching
allocator on (capture needs it), the rest without it (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so that
memcheck sees each allocation's bounds).

initcheck's production pass sets CUTLASS_OPS_SANITIZE_TMA_BLIND to the writer classes whose
stores the script's TMA probes just showed initcheck cannot see (values right, reads reported):
a test skips, before anything reads such a writer's output, only for a class named there
(tma_blind_spot).  The family-80 pass (CUTLASS_OPS_SM90=0, CUTLASS_OPS_CUDNN=0) runs them all.

The test_static_* tests run on the CPU (CI): the script's rules and this selection's coverage of
every registered op."""
import inspect
import os
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from cutlass_ops import ops
from _helpers import HAS_CUDA, b2b_reference, errors, seeded

H = torch.float16
CL = torch.channels_last
UNCACHED = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
# The writer classes whose stores initcheck does not see, as the script's probes found them this run.
TMA_BLIND = set(os.environ.get("CUTLASS_OPS_SANITIZE_TMA_BLIND", "").split())
TMA_CLASSES = {  # class -> the writer, and the probe (tests/gpu_sanitize.sh runs it) that shows it
    "fprop90": "a generated family-90 conv2d_fused kernel (CUTLASS sm90 TMA-store epilogue; "
               "tests/sanitize_tma_probe.py --writer 90)",
    "bwd90": "a generated family-90 conv2d_dgrad/wgrad kernel (CUTLASS sm90 TMA-store epilogue; "
             "tests/sanitize_controls/tma_probe.py --writer bwd90)",
    "linear_silu": "linear_silu's sm90 GEMM (CUTLASS TMA-store epilogue; "
                   "tests/sanitize_controls/tma_probe.py --writer linear_silu)",
}


@pytest.fixture(autouse=True)
def _needs_cuda(request):
    if not request.node.name.startswith("test_static_") and not HAS_CUDA:
        pytest.skip("no CUDA device (or a CPU-only build)")


def tma_blind_spot(writer_class):
    """Skips the test in initcheck's production pass when the probes showed that initcheck does
    not see this writer's stores: called right after the writer ran, before anything reads its
    output (so no report is made and none is forgiven)."""
    assert writer_class in TMA_CLASSES, writer_class
    if writer_class in TMA_BLIND:
        pytest.skip(f"initcheck TMA blind spot [{writer_class}]: {TMA_CLASSES[writer_class]}")


def _fprop90(name):
    """A generated family-90 conv2d_fused kernel (the hand-written halo kernel stores without TMA)."""
    return name.startswith("cutlass") and ops.conv2d_fused_kernel_family(name) == 90 and "_halo" not in name


def _r(*shape, dtype=H, scale=1.0, cl=False, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    t = (torch.randn(shape, generator=g) * scale).to(dtype).cuda()
    return t.contiguous(memory_format=CL) if cl else t


def _family_kernels(family):
    return [n for n in ops.conv2d_fused_kernels(family) if "_f16_" in n and "_halo" not in n]


# ---- conv2d_fused: every epilogue, dispatcher's choice, one forced kernel per family, split-K --

EPILOGUES = {
    "bias_relu": dict(bias="vec", relu=True),
    "scalar_bias": dict(bias="scalar"),
    "fixup_scale_post_bias_relu": dict(bias="scalar", scale=True, post_bias=True, relu=True),
    "residual": dict(bias="vec", residual=True, relu=True),
    "plain": dict(),
    "silu": dict(bias="vec", silu=True),
}


def _conv_case(epi, n=2, c=16, k=16, hw=6, stride=1):
    x, w = _r(n, c, hw, hw, cl=True), _r(k, c, 3, 3, scale=(9 * c) ** -0.5, cl=True)
    p = (hw + 2 - 3) // stride + 1
    bias = {"vec": _r(k, dtype=torch.float32), "scalar": _r(dtype=torch.float32), None: None}[epi.get("bias")]
    res = _r(n, k, p, p, cl=True) if epi.get("residual") else None
    scale = torch.tensor(0.75, device="cuda") if epi.get("scale") else None
    post = torch.tensor(0.25, device="cuda") if epi.get("post_bias") else None
    args = (x, w, bias, res, stride, 1, scale, post, epi.get("relu", False), epi.get("silu", False))
    y = F.conv2d(x.double(), w.double(), None, stride, 1)
    if scale is not None:
        y = y * 0.75
    if bias is not None:
        y = y + (bias.double().view(1, -1, 1, 1) if bias.dim() else bias.double())
    if res is not None:
        y = y + res.double()
    if epi.get("relu"):
        y = y.relu()
    if epi.get("silu"):
        y = F.silu(y)
    if post is not None:
        y = y + 0.25
    return args, y


@pytest.mark.parametrize("epi", list(EPILOGUES))
def test_conv2d_fused_epilogue(epi):
    args, want = _conv_case(EPILOGUES[epi])
    out = cutlass_ops.conv2d_fused(*args)
    ran = cutlass_ops.conv2d_fused_last_kernel()
    assert ran.startswith("cutlass"), ran
    if _fprop90(ran):
        tma_blind_spot("fprop90")
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
        pytest.skip("CUTLASS_OPS_SM90=0 (gpu_sanitize.sh's initcheck family-80 pass)")
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
    if _fprop90(ran):
        tma_blind_spot("fprop90")
    assert errors(out, want)[0] < 1e-2, ran


def test_conv2d_fused_align1():
    """Channel counts that are not multiples of 8: the lower-alignment kernels."""
    args, want = _conv_case(EPILOGUES["bias_relu"], c=3, k=5)
    out = cutlass_ops.conv2d_fused(*args)
    if _fprop90(cutlass_ops.conv2d_fused_last_kernel()):
        tma_blind_spot("fprop90")
    assert errors(out, want)[0] < 1e-2


def test_conv2d_fused_sm90_halo():
    """The hand-written Hopper halo kernel (TMA loads, ordinary stores): 3x3, C = K = 64, a
    16-wide map, forced by name."""
    halo = [n for n in ops.conv2d_fused_kernels(90) if "_halo" in n and "_f16_" in n]
    if not (ON_SM90 and halo) or os.environ.get("CUTLASS_OPS_SM90") == "0":
        pytest.skip("the halo kernel runs on sm90 builds with family-90 kernels only (not with CUTLASS_OPS_SM90=0)")
    x, w = _r(1, 64, 8, 16, cl=True), _r(64, 64, 3, 3, scale=(9 * 64) ** -0.5, cl=True)
    bias = _r(64, dtype=torch.float32)
    scale, post = torch.tensor(0.75, device="cuda"), torch.tensor(0.25, device="cuda")
    torch.ops.cutlass_ops.conv2d_fused_force_kernel(halo[0], 0)
    try:
        out = cutlass_ops.conv2d_fused(x, w, bias, None, 1, 1, scale, post, True)
    finally:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel("", 0)
    assert ops.conv2d_fused_last_kernel() == halo[0]
    want = (F.conv2d(x.double().cpu(), w.double().cpu(), None, 1, 1) * 0.75
            + bias.double().cpu().view(1, -1, 1, 1)).relu() + 0.25
    assert errors(out, want)[0] < 1e-2


def test_conv2d_fused_se_gate():
    """conv2d_fused_se_gate: on sm90 its one kernel (the halo conv with se_gate as its epilogue:
    TMA loads, named barriers between a consumer group's epilogue phases, ordinary stores), 134
    images, more than an H100's or H200's 132 SMs, so that the first CTAs take two, one for each
    consumer group; elsewhere the two kernels it fuses."""
    x, w = _r(134, 64, 16, 16, cl=True), _r(64, 64, 3, 3, scale=(9 * 64) ** -0.5, cl=True)
    idn = _r(134, 64, 16, 16, cl=True, seed=1)
    w1, b1 = _r(4, 64, dtype=torch.float32, scale=0.125, seed=2), _r(4, dtype=torch.float32, seed=3)
    w2, b2 = _r(64, 4, dtype=torch.float32, scale=0.5, seed=4), _r(64, dtype=torch.float32, seed=5)
    scale, hb = torch.tensor(0.75, device="cuda"), torch.tensor(0.1, device="cuda")
    out, pooled = ops.conv2d_fused_se_gate(x, w, scale, idn, w1, b1, w2, b2, None, None, avgpool=True, h_bias=hb)
    if ON_SM90 and ops.conv2d_fused_kernels(90) and os.environ.get("CUTLASS_OPS_SM90") != "0":
        assert ops.conv2d_fused_se_gate_last_kernel().endswith("_se_gate"), ops.conv2d_fused_se_gate_last_kernel()
    d = lambda t: t.double().cpu()  # noqa: E731
    h = F.conv2d(d(x), d(w), None, 1, 1) * 0.75 + 0.1
    g = torch.sigmoid(F.linear(torch.relu(F.linear(h.mean((2, 3)), d(w1), d(b1))), d(w2), d(b2)))
    want = torch.relu(h * g[:, :, None, None] + d(idn))
    assert errors(out, want)[0] < 1e-2
    assert errors(pooled, F.avg_pool2d(want, 3, 2, 1))[0] < 1e-2


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

def _bwd_kernels(kind, family=80):
    return [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels()
            if k.startswith(f"cutlass_ops_conv2d_{kind}_f16_sm{family}")]


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


@pytest.mark.parametrize("kind", ["dgrad", "wgrad"])
def test_conv2d_backward_family90(kind):
    """A family-90 dgrad/wgrad kernel (stock CUTLASS sm90 conv, built with --sm90-backward), forced."""
    names = _bwd_kernels(kind, 90)
    if not (ON_SM90 and names) or os.environ.get("CUTLASS_OPS_SM90") == "0":
        pytest.skip("family-90 backward kernels: sm90 builds with --sm90-backward only (not with CUTLASS_OPS_SM90=0)")
    tma_blind_spot("bwd90")  # before the run: conv2d_wgrad's own epilogue kernel reads the writer's output
    n, c, k, hw = 2, 64, 64, 4
    x, w = _r(n, c, hw, hw, cl=True), _r(k, c, 3, 3, scale=0.05, cl=True)
    dy = _r(n, k, hw, hw, cl=True)
    scale = torch.tensor(0.5, device="cuda")
    if kind == "dgrad":
        dx = _first_that_runs(names, 0, lambda: cutlass_ops.conv2d_dgrad(dy, w, x.shape, 1, 1, scale))
        assert errors(dx, conv2d_input(x.shape, w.double().cpu() * 0.5, dy.double().cpu(), 1, 1))[0] < 1e-2
    else:
        dw, _ = _first_that_runs(names, 0, lambda: cutlass_ops.conv2d_wgrad(dy, x, w, 1, 1, scale))
        assert errors(dw, conv2d_weight(x.double().cpu(), w.shape, dy.double().cpu(), 1, 1) * 0.5)[0] < 1e-2


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

@pytest.mark.parametrize("tile", ["1", "0"])  # the tiled kernel; the strip kernel (CUTLASS_OPS_DW_TILE=0)
@pytest.mark.parametrize("c, strides", [(64, [1, 2, 2]), (5, [2, 1])])
def test_dw_conv3x3_tokens(c, strides, tile, monkeypatch):
    monkeypatch.setenv("CUTLASS_OPS_DW_TILE", tile)
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


@pytest.mark.parametrize("tile", ["1", "0"])  # the LayerNorm inside the tiled kernel; ATen's then the strip kernel
def test_layer_norm_dw_conv3x3_tokens(tile, monkeypatch):
    monkeypatch.setenv("CUTLASS_OPS_DW_TILE", tile)
    c, strides = 64, [1, 2, 2]
    full = (_r(3, 1 + 7 * 5, c).float() * 2 + 5).half()  # far from zero mean
    x, lead = full[:, 1:], full[:, :1]
    lw, lb = _r(c, dtype=torch.float32, seed=4) * 0.5 + 1, _r(c, dtype=torch.float32, seed=5)
    w, b = _r(len(strides), c, 1, 3, 3, seed=1), _r(len(strides), c, seed=2)
    ys = cutlass_ops.ops.layer_norm_dw_conv3x3_tokens(x, 7, 5, lw.half(), lb.half(), 1e-5, w, b, strides, lead)
    n = F.layer_norm(full.float(), [c], lw.half().float(), lb.half().float(), 1e-5).half().float()
    m = n[:, 1:].reshape(3, 7, 5, c).permute(0, 3, 1, 2)
    for j, (y, s) in enumerate(zip(ys, strides)):
        want = F.conv2d(m, w[j].float(), b[j].float(), s, 1, 1, c).flatten(2).transpose(1, 2)
        assert errors(y[:, 1:], want)[0] < 1e-2 and errors(y[:, :1], n[:, :1])[0] < 1e-2


# ---- the other CvT ops: conv_embed, linear_silu, linear_residual, scale_samples -------------------

@pytest.mark.parametrize("ln", [True, False])
def test_conv_embed(ln):
    """The kernel's shape class (a 7x7/4 patch from 3 channels, K 64) on a small odd image."""
    x, w, b = _r(2, 3, 23, 19), _r(64, 3, 7, 7, scale=(3 * 49) ** -0.5), _r(64, dtype=torch.float32)
    lw, lb = _r(64, dtype=torch.float32, seed=1) * 0.5 + 1, _r(64, dtype=torch.float32, seed=2)
    y = cutlass_ops.ops.conv_embed(x, w, b, 4, 2, ln, lw if ln else None, lb if ln else None)
    t = F.conv2d(x.double(), w.double(), b.double(), 4, 2).flatten(2).transpose(1, 2)
    if ln:
        t = F.layer_norm(t, [64], lw.double(), lb.double(), 1e-5)
    assert errors(y, t)[0] < 1e-2


def test_linear_silu(monkeypatch):
    """Every generated f16 instance forced in turn (CUTLASS_OPS_LINEAR_SILU_TILE), then the
    dispatcher's choice; ATen's path off sm90 (the test still runs the op)."""
    x, w, b = _r(3, 5, 64), _r(72, 64, scale=0.125), _r(72, seed=1)
    want = F.silu(1.702 * (x.double() @ w.double().t() + b.double()))
    names = [n.split(" ")[0] for n in ops.linear_silu_kernels() if n.endswith("(float16)")] if ON_SM90 else []
    for name in names + [None]:
        if name is None:
            monkeypatch.delenv("CUTLASS_OPS_LINEAR_SILU_TILE", raising=False)
        else:
            monkeypatch.setenv("CUTLASS_OPS_LINEAR_SILU_TILE", name)
        y = cutlass_ops.ops.linear_silu(x, w, b, 1.702)
        if names:  # a generated sm90 GEMM wrote y (its TMA-store epilogue)
            tma_blind_spot("linear_silu")
        assert errors(y, want)[0] < 1e-2, name


@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual(bias):
    x, w, r = _r(2, 9, 64), _r(48, 64, scale=0.125), _r(2, 9, 48, seed=1)
    b = _r(48, seed=2) if bias else None
    y = cutlass_ops.ops.linear_residual(x, w, b, r, 0.5)
    want = r.double() + 0.5 * (x.double() @ w.double().t()) + (b.double() if bias else 0)
    assert errors(y, want)[0] < 1e-2


@pytest.mark.parametrize("shape", [(4, 9, 16), (5, 3, 7)])  # 16-byte accesses; element-wise
def test_scale_samples(shape):
    x = _r(*shape)
    scale = torch.tensor([0.0, 1 / 0.9, -2.5, 1.0, 2.0][:shape[0]], device="cuda")
    y = cutlass_ops.ops.scale_samples(x, scale)
    assert torch.equal(y, (x.float() * scale.view(-1, 1, 1)).half())


def test_cvt_ops_graph():
    """layer_norm_rows, dw_conv3x3_tokens, linear_residual and scale_samples captured in one
    CUDA graph, replayed: the eager results."""
    if UNCACHED:
        pytest.skip("CUDA graphs need the caching allocator")
    x, r = _r(2, 35, 64), _r(2, 35, 64, seed=1)
    lw, lb = _r(64, dtype=torch.float32, seed=2) + 1, _r(64, dtype=torch.float32, seed=3)
    w, b = _r(1, 64, 1, 3, 3, seed=4), _r(1, 64, seed=5)
    wl, scale = _r(64, 64, scale=0.125, seed=6), torch.tensor([0.5, 2.0], device="cuda")

    def step():
        y, s = cutlass_ops.ops.layer_norm_rows(x, lw, lb, 1e-5, r)
        (d,) = cutlass_ops.ops.dw_conv3x3_tokens(y, 7, 5, w, b, [1])
        return cutlass_ops.ops.scale_samples(cutlass_ops.ops.linear_residual(d, wl, None, s, 1.0), scale)
    want = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert errors(out, want)[0] < 1e-3


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
    with torch.no_grad():  # the inference kernel (nothing saved), through the op
        y0, _ = torch.ops.cutlass_ops.fused_mlp(xg.detach(), gpu.weights, gpu.biases, gpu.key, False)
    assert errors(y0, yc.detach())[0] < 1e-2
    for pg, pc in zip(gpu.parameters(), cpu.parameters()):
        assert pg.grad is not None and errors(pg.grad, pc.grad)[0] < 3e-2


# ---- FusedResNet: forward and a training step, eager and graphed ---------------------------------

def _model(graph=False):
    # On sm90 the profile runs the model's convs on generated family-90 kernels, each read by
    # the next kernel inside the model: initcheck's production pass cannot judge those reads.
    if ON_SM90 and os.environ.get("CUTLASS_OPS_SM90") != "0" and any(map(_fprop90, ops.conv2d_fused_kernels(90))):
        tma_blind_spot("fprop90")
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


# ---- what the selection covers, and the script's rules (CPU: CI) -----------------------------------

# Every registered op (torch.ops.cutlass_ops.*) that launches kernels -> the tests that launch them.
COVERAGE = {
    "conv2d_fused": ["test_conv2d_fused_epilogue", "test_conv2d_fused_forced_family", "test_conv2d_fused_align1",
                     "test_conv2d_fused_sm90_halo"],
    "conv2d_fused_se_gate": ["test_conv2d_fused_se_gate"],
    "conv2d_b2b": ["test_conv2d_b2b"],
    "conv2d_dgrad": ["test_conv2d_dgrad", "test_conv2d_backward_family90"],
    "conv2d_wgrad": ["test_conv2d_wgrad", "test_conv2d_backward_family90"],
    "se_gate": ["test_se_gate_and_backward", "test_se_gate_cached_maps_and_split_ops"],
    "se_gate_backward": ["test_se_gate_and_backward"],
    "se_squeeze": ["test_se_gate_cached_maps_and_split_ops"],
    "se_gate_apply": ["test_se_gate_cached_maps_and_split_ops"],
    "relu_backward": ["test_relu_backward"],
    "space_to_depth_conv": ["test_space_to_depth_conv_and_weight_grad"],
    "space_to_depth_conv_weight_grad": ["test_space_to_depth_conv_and_weight_grad"],
    "giou_loss": ["test_giou_forward_backward"],
    "giou_loss_backward": ["test_giou_forward_backward"],
    "layer_norm_rows": ["test_layer_norm_rows_forward_backward", "test_cvt_ops_graph"],
    "layer_norm_rows_backward": ["test_layer_norm_rows_forward_backward"],
    "dw_conv3x3_tokens": ["test_dw_conv3x3_tokens", "test_cvt_ops_graph"],
    "dw_conv3x3_tokens_backward_input": ["test_dw_conv3x3_tokens_backward_input"],
    "layer_norm_dw_conv3x3_tokens": ["test_layer_norm_dw_conv3x3_tokens"],
    "conv_embed": ["test_conv_embed"],
    "linear_silu": ["test_linear_silu"],
    "linear_residual": ["test_linear_residual", "test_cvt_ops_graph"],
    "scale_samples": ["test_scale_samples", "test_cvt_ops_graph"],
    "fused_mlp": ["test_fused_mlp_forward_backward"],
    "fused_mlp_backward": ["test_fused_mlp_forward_backward"],
}
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu_sanitize.sh"
QUERY_OP = re.compile(r"_(kernels|last_kernel|force_kernel)$")  # report or force kernel names: launch nothing


def registered_ops():
    """The op names the sources register: m.def in kernels/*/*.cpp, Library.define in cutlass_ops/."""
    names = set()
    for f in (ROOT / "kernels").glob("*/*.cpp"):
        names |= set(re.findall(r'm\.def\(\s*"([a-z0-9_]+)\(', f.read_text()))
    for f in (ROOT / "cutlass_ops").rglob("*.py"):
        names |= set(re.findall(r'\.define\(\s*"([a-z0-9_]+)\(', f.read_text()))
    return {n for n in names if not QUERY_OP.search(n)}


def test_static_every_op_is_covered():
    ops_found = registered_ops()
    assert {"conv2d_fused", "fused_mlp", "conv_embed", "scale_samples"} <= ops_found, ops_found  # the parser works
    assert not ops_found - set(COVERAGE), f"ops the sanitizer selection does not run: {sorted(ops_found - set(COVERAGE))}"
    assert not set(COVERAGE) - ops_found, f"COVERAGE names ops no source registers: {sorted(set(COVERAGE) - ops_found)}"
    for op, tests in COVERAGE.items():
        for name in tests:
            src = inspect.getsource(globals()[name])
            forward = op[:-len("_backward")] if op.endswith("_backward") else None
            assert op in src or (forward in src and "backward(" in src), f"{name} does not launch {op}"
    # every op family (a module of cutlass_ops/ops/) by name too
    families = {f.stem for f in (ROOT / "cutlass_ops" / "ops").glob("*.py") if not f.stem.startswith("_")}
    text = Path(__file__).read_text()
    assert not [f for f in families if f not in text], families


def test_static_script_rules():
    """gpu_sanitize.sh: every sanitizer run fails on the tool's own exit code, no report is
    forgiven by a kernel name, pytest's status counts, a minimum of tests must pass per pass."""
    text = SCRIPT.read_text()
    code = "\n".join(line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    runs = [line for line in code.splitlines() if re.search(r'"\$SANITIZER"\s+--tool', line)]
    assert runs and all("--error-exitcode" in line for line in runs), runs
    assert re.search(r"^MIN_TESTS=[1-9][0-9]*\b", text, re.M) and re.search(r"^MIN_GRAPH_TESTS=[1-9][0-9]*\b", text, re.M)
    assert not re.search(r"grep\s+-[A-Za-z]*v", code), "an inverted grep (a report filter)"
    assert not re.search(r"grep[^|\n]*cutlass", code, re.I), "a kernel-name filter on reports"
    assert not re.search(r"\b(errors|tool_rc|rc)=0\b", code), "a result reset to 0"
    assert not re.search(r"(&&|\|\||\bthen|;)\s*[A-Za-z_]+=0\b", code), "a result reset to 0"
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
        assert tool in text
    assert "sanitize_controls" in code and "CUTLASS_OPS_SANITIZE_TMA_BLIND" in code
