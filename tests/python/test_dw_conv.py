"""cutlass_ops.ops.dw_conv3x3_tokens (issue 20: CvT's dw_bn q/k/v projections in eval mode, the
folded bias inside and the cls token in front, so that neither a bias add nor a concatenation
follows cuDNN's depthwise conv): the op's CPU path against float64, opcheck, bad input; the CUDA
kernel on the CPU emulator (tests/cuda_emulator: both vector widths, strides 1 and 2, with and
without the lead rows, against float64, outputs poisoned with NaN and guard elements after them,
two thread schedules bitwise equal, 16-bit parameters bitwise as their float32 copies); the
kernel on a GPU (skipped without one); FusedCvT with the switch against its default path."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import _emulator
import cutlass_ops
from cutlass_ops.ops import dw_conv3x3_tokens

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
emulator = pytest.mark.skipif(not _emulator.AVAILABLE, reason=_emulator.MISSING)
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def inputs(n, h, w, c, dtype, lead=0, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h * w, c, generator=g).to(dtype)
    wt = (torch.randn(c, 1, 3, 3, generator=g) / 3).to(dtype)
    b = torch.randn(c, generator=g).to(dtype) if bias else None
    ld = torch.randn(n, lead, c, generator=g).to(dtype) if lead else None
    return x, wt, b, ld


def reference(x, h, w, wt, b, stride, ld):
    """float64: the map NCHW, F.conv2d (groups = C), tokens, the lead rows in front."""
    n, _, c = x.shape
    m = x.double().reshape(n, h, w, c).permute(0, 3, 1, 2)
    z = F.conv2d(m, wt.double(), None if b is None else b.double(), stride, 1, 1, c)
    t = z.flatten(2).transpose(1, 2)
    return t if ld is None else torch.cat((ld.double(), t), 1)


# ---- CPU ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("lead, bias", [(0, True), (1, True), (2, False)])
@pytest.mark.parametrize("hw", [(7, 5), (8, 8), (1, 1)])
def test_cpu_path_matches_float64(dtype, stride, lead, bias, hw):
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, 6, dtype, lead, bias)
    y = dw_conv3x3_tokens(x, h, w, wt, b, stride, ld)
    ref = reference(x, h, w, wt, b, stride, ld)
    assert y.shape == ref.shape and y.dtype == dtype
    assert rel(y, ref) <= TOL[dtype]
    if ld is not None:
        assert torch.equal(y[:, :lead], ld)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_tokens_view_that_skips_the_cls_row(device):
    """x as FusedCvT hands it in stage 3: the tokens of (N, 1 + h*w, C) less each image's first
    row (a view, images apart): the same output as from the dense copy."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    x, wt, b, ld = (None if t is None else t.to(device) for t in inputs(3, 5, 4, 16, dtype, lead=1))
    full = torch.cat((ld, x), 1)
    view = full[:, 1:]
    assert not view.is_contiguous()
    assert torch.equal(dw_conv3x3_tokens(view, 5, 4, wt, b, 2, ld), dw_conv3x3_tokens(x, 5, 4, wt, b, 2, ld))


def test_opcheck_cpu():
    x, wt, b, ld = inputs(2, 4, 6, 5, torch.float32, lead=1)
    torch.library.opcheck(torch.ops.cutlass_ops.dw_conv3x3_tokens.default, (x, 4, 6, wt, b, 2, ld),
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_input_is_a_clear_error():
    x, wt, b, ld = inputs(2, 4, 4, 8, torch.float32, lead=1)
    with pytest.raises(ValueError, match="not h\\*w"):
        dw_conv3x3_tokens(x, 4, 5, wt, b, 1, ld)
    with pytest.raises(ValueError, match="stride must be 1 or 2"):
        dw_conv3x3_tokens(x, 4, 4, wt, b, 3, ld)
    with pytest.raises(ValueError, match="weight must be"):
        dw_conv3x3_tokens(x, 4, 4, wt[:, :, :2], b, 1, ld)
    with pytest.raises(ValueError, match="bias must be"):
        dw_conv3x3_tokens(x, 4, 4, wt, b[:4], 1, ld)
    with pytest.raises(ValueError, match="lead dtype"):
        dw_conv3x3_tokens(x, 4, 4, wt, b, 1, ld.double())
    with pytest.raises(ValueError, match="tokens"):
        dw_conv3x3_tokens(x[0], 4, 4, wt, b, 1, None)


# ---- the CUDA kernel on the CPU emulator ----------------------------------------------------

@pytest.fixture(scope="module")
def dw_emulator(tmp_path_factory):
    return _emulator.build("dw_conv_harness.cpp", tmp_path_factory.mktemp("dw_emu") / "dw_emu.so")


GUARD = 64


def run_emulated(lib, x, h, w, wt, b, stride, ld, seed=0, offset=0, skip=0):
    """The kernel; y poisoned with NaN and GUARD sentinels after it; offset > 0 misaligns x and
    y by that many elements (the element-wise path); skip > 0 hands it x as a view of tokens
    with `skip` NaN rows before each image's (as CvT's tokens less the cls row)."""
    n, _, c = x.shape
    if skip:
        full = torch.full((n, skip + h * w, c), float("nan"), dtype=x.dtype)
        full[:, skip:] = x
        x = full[:, skip:]
    lead = 0 if ld is None else ld.shape[1]
    rows = lead + ((h - 1) // stride + 1) * ((w - 1) // stride + 1)
    size = n * rows * c
    base = x if not skip else full
    xb = torch.empty(base.numel() + offset, dtype=x.dtype)
    xb[offset:] = base.reshape(-1)
    x_start = offset + (skip * c if skip else 0)
    image_stride = (skip + h * w) * c
    yb = torch.full((size + offset + GUARD,), float("nan"), dtype=x.dtype)
    yb[size + offset:] = -777.0
    vec = ctypes.c_int(0)
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    params_f32 = int(wt.dtype == torch.float32)
    rc = lib.emu_dw_conv(int(x.dtype == torch.bfloat16), ctypes.c_longlong(n), h, w, c, stride, lead,
                         ptr(xb[x_start:]), ctypes.c_longlong(image_stride), ptr(wt), ptr(b), params_f32, ptr(ld),
                         ptr(yb[offset:]), 0, seed,
                         ctypes.byref(vec))
    assert rc == 0, "deadlock"
    assert bool((yb[size + offset:] == -777.0).all()), "a write past the output"
    return yb[offset:size + offset].view(n, rows, c), vec.value


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, vec", [(64, 8), (24, 8), (5, 1)])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("lead", [0, 1])
def test_kernel_on_the_emulator(dw_emulator, dtype, c, vec, stride, lead):
    """Both vector widths, strides 1 and 2 (odd maps: the last window hangs over the edge), the
    lead rows copied exactly, every output written (no NaN left), nothing past it, against
    float64; a second thread schedule bitwise equal."""
    h, w = 9, 7
    x, wt, b, ld = inputs(3, h, w, c, dtype, lead, seed=c)
    y, picked = run_emulated(dw_emulator, x, h, w, wt, b, stride, ld)
    assert picked == vec
    assert not torch.isnan(y).any()
    assert rel(y, reference(x, h, w, wt, b, stride, ld)) <= TOL[dtype]
    if ld is not None:
        assert torch.equal(y[:, :lead], ld)
    again, _ = run_emulated(dw_emulator, x, h, w, wt, b, stride, ld, seed=7)
    assert torch.equal(y, again)


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_on_the_emulator_params_and_alignment(dw_emulator, dtype):
    """Weight and bias in x's dtype give bitwise their float32 copies' numbers; a misaligned x
    and y take the element-wise path with the same numbers; no bias."""
    x, wt, b, ld = inputs(2, 6, 6, 16, dtype, lead=1, seed=3)
    native, _ = run_emulated(dw_emulator, x, 6, 6, wt, b, 2, ld)
    wide, _ = run_emulated(dw_emulator, x, 6, 6, wt.float(), b.float(), 2, ld)
    assert torch.equal(native, wide)
    mis, vec = run_emulated(dw_emulator, x, 6, 6, wt, b, 2, None, offset=1)
    assert vec == 1 and torch.equal(mis, native[:, 1:])
    nob, _ = run_emulated(dw_emulator, x, 6, 6, wt, None, 1, None)
    assert rel(nob, reference(x, 6, 6, wt, None, 1, None)) <= TOL[dtype]
    # images apart: a view that skips each image's first row (CvT's cls), NaN there must not leak
    skipped, vec = run_emulated(dw_emulator, x, 6, 6, wt, b, 2, ld, skip=1)
    assert vec == 8 and torch.equal(skipped, native)


# ---- CUDA -----------------------------------------------------------------------------------

@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, hw, stride, lead", [(64, (56, 56), 1, 0), (64, (56, 56), 2, 0), (384, (14, 14), 1, 1),
                                                 (384, (14, 14), 2, 1), (5, (9, 7), 2, 1)])
def test_cuda_vs_float64(dtype, c, hw, stride, lead):
    h, w = hw
    x, wt, b, ld = inputs(5, h, w, c, dtype, lead)
    y = dw_conv3x3_tokens(x.cuda(), h, w, wt.cuda(), b.cuda(), stride, None if ld is None else ld.cuda())
    assert rel(y, reference(x, h, w, wt, b, stride, ld)) <= TOL[dtype]
    if ld is not None:
        assert torch.equal(y[:, :lead].cpu(), ld)


# ---- FusedCvT with CUTLASS_OPS_CVT_DW_TOKENS=1 ----------------------------------------------

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_fused_cvt_dw_tokens_against_float64(device, monkeypatch):
    """FusedCvT in eval mode with autograd off and the projections as dw_conv3x3_tokens (the
    cls token of stage 3 in front): float64 on the CPU within 1e-12 of the reference; fp16 on
    CUDA no worse than 2x the default path's error against that float64 run (floor 5e-3)."""
    from cutlass_ops.models.cvt import cvt13
    torch.manual_seed(0)
    ref64 = cvt13().double().eval()
    for m in ref64.modules():  # non-trivial BatchNorm statistics: the fold matters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        want = ref64(x)
    dtype = torch.float64 if device == "cpu" else torch.float16
    fused = cutlass_ops.FusedCvT.from_reference(ref64).to(device, dtype).eval()
    calls = []
    op = cutlass_ops.fused_cvt.dw_conv3x3_tokens
    monkeypatch.setattr(cutlass_ops.fused_cvt, "dw_conv3x3_tokens", lambda *a: calls.append(1) or op(*a))

    def run(flag):
        monkeypatch.setenv("CUTLASS_OPS_CVT_DW_TOKENS", flag)
        with torch.no_grad():
            return fused(x.to(device, dtype))
    on = run("1")
    assert len(calls) == 3 * 13  # q, k, v of every block
    off = run("0")
    assert len(calls) == 3 * 13
    if device == "cpu":
        assert rel(on, want) <= 1e-12
    else:
        assert rel(on, want) <= max(2 * rel(off, want), 5e-3), (rel(on, want), rel(off, want))
