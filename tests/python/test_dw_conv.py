"""cutlass_ops.ops.dw_conv3x3_tokens (CvT's dw_bn q/k/v projections in eval mode, all
three from one read of the map, the folded biases inside and the cls token in front, so that
neither a bias add nor a concatenation follows a depthwise conv): the op's CPU path against
float64, opcheck, bad input; the CUDA kernels, tiled and strip, on the CPU emulator
(tests/cuda_emulator: both vector widths, strides 1 and 2 alone and together, with and without
the lead rows, against float64, outputs poisoned with NaN and guard elements after them, two
thread schedules bitwise equal, 16-bit parameters bitwise as their float32 copies);
layer_norm_dw_conv3x3_tokens (the convs on LayerNorm(x), the tiled kernel normalizing its band)
on the CPU, the emulator and the GPU; the backward (gradcheck in float64
on the CPU; the input-gradient kernel on the emulator against float64 autograd, views behind a
lead row, two schedules bitwise); the kernels on a GPU, forward and backward (skipped without
one); FusedCvT with the switch against its default path."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import _emulator
import cutlass_ops
from _helpers import poison_cuda_cache, seeded
from cutlass_ops.ops import dw_conv3x3_tokens, layer_norm_dw_conv3x3_tokens

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
emulator = pytest.mark.skipif(not _emulator.AVAILABLE, reason=_emulator.MISSING)
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
QKV = [1, 2, 2]  # CvT's q, k, v


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def inputs(n, h, w, c, dtype, lead=0, bias=True, seed=0, convs=3):
    """x (n, h*w, c), weight (convs, c, 1, 3, 3), bias (convs, c), lead (n, lead, c)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h * w, c, generator=g).to(dtype)
    wt = (torch.randn(convs, c, 1, 3, 3, generator=g) / 3).to(dtype)
    b = torch.randn(convs, c, generator=g).to(dtype) if bias else None
    ld = torch.randn(n, lead, c, generator=g).to(dtype) if lead else None
    return x, wt, b, ld


def reference(x, h, w, wt, b, strides, ld):
    """float64, per conv: the map NCHW, F.conv2d (groups = C), tokens, the lead rows in front."""
    n, _, c = x.shape
    m = x.double().reshape(n, h, w, c).permute(0, 3, 1, 2)
    out = []
    for j, s in enumerate(strides):
        z = F.conv2d(m, wt[j].double(), None if b is None else b[j].double(), s, 1, 1, c)
        t = z.flatten(2).transpose(1, 2)
        out.append(t if ld is None else torch.cat((ld.double(), t), 1))
    return out


def worst(ys, refs):
    assert len(ys) == len(refs)
    for y, r in zip(ys, refs):
        assert y.shape == r.shape
    return max(rel(y, r) for y, r in zip(ys, refs))


# ---- CPU ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("strides", [[1], [2], QKV, [2, 1]])
@pytest.mark.parametrize("lead, bias", [(0, True), (1, True), (2, False)])
@pytest.mark.parametrize("hw", [(7, 5), (8, 8), (1, 1)])
def test_cpu_path_matches_float64(dtype, strides, lead, bias, hw):
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, 6, dtype, lead, bias, convs=len(strides))
    ys = dw_conv3x3_tokens(x, h, w, wt, b, strides, ld)
    assert all(y.dtype == dtype for y in ys)
    assert worst(ys, reference(x, h, w, wt, b, strides, ld)) <= TOL[dtype]
    if ld is not None:
        assert all(torch.equal(y[:, :lead], ld) for y in ys)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_tokens_view_that_skips_the_cls_row(device):
    """x and lead as FusedCvT hands them in stage 3: views of the tokens (N, 1 + h*w, C), the cls
    row and the rest (images apart): the same outputs as from dense copies."""
    dtype = torch.float32 if device == "cpu" else torch.float16
    x, wt, b, ld = (None if t is None else t.to(device) for t in inputs(3, 5, 4, 16, dtype, lead=1))
    full = torch.cat((ld, x), 1)
    view, cls = full[:, 1:], full[:, :1]
    assert not view.is_contiguous() and not cls.is_contiguous()
    for got, want in zip(dw_conv3x3_tokens(view, 5, 4, wt, b, QKV, cls), dw_conv3x3_tokens(x, 5, 4, wt, b, QKV, ld)):
        assert torch.equal(got, want)


def test_opcheck_cpu():
    x, wt, b, ld = inputs(2, 4, 6, 5, torch.float32, lead=1)
    torch.library.opcheck(torch.ops.cutlass_ops.dw_conv3x3_tokens.default, (x, 4, 6, wt, b, QKV, ld),
                          test_utils=("test_schema", "test_faketensor"))


def test_bad_input_is_a_clear_error():
    x, wt, b, ld = inputs(2, 4, 4, 8, torch.float32, lead=1)
    with pytest.raises(ValueError, match="not h\\*w"):
        dw_conv3x3_tokens(x, 4, 5, wt, b, QKV, ld)
    with pytest.raises(ValueError, match="each stride must be 1 or 2"):
        dw_conv3x3_tokens(x, 4, 4, wt, b, [1, 3, 2], ld)
    with pytest.raises(ValueError, match="strides must list 1 to 3"):
        dw_conv3x3_tokens(x, 4, 4, wt, b, [], ld)
    with pytest.raises(TypeError, match="strides must be a list"):
        dw_conv3x3_tokens(x, 4, 4, wt[:1], b[:1], 1, ld)
    with pytest.raises(ValueError, match="weight must be"):
        dw_conv3x3_tokens(x, 4, 4, wt[:, :, :, :2], b, QKV, ld)
    with pytest.raises(ValueError, match="weight must be"):
        dw_conv3x3_tokens(x, 4, 4, wt[:2], b, QKV, ld)  # fewer weights than strides
    with pytest.raises(ValueError, match="bias must be"):
        dw_conv3x3_tokens(x, 4, 4, wt, b[:, :4], QKV, ld)
    with pytest.raises(ValueError, match="lead dtype"):
        dw_conv3x3_tokens(x, 4, 4, wt, b, QKV, ld.double())
    with pytest.raises(ValueError, match="tokens"):
        dw_conv3x3_tokens(x[0], 4, 4, wt, b, QKV, None)


# ---- the CUDA kernel on the CPU emulator ----------------------------------------------------

@pytest.fixture(scope="module")
def dw_emulator(tmp_path_factory):
    return _emulator.build("dw_conv_harness.cpp", tmp_path_factory.mktemp("dw_emu") / "dw_emu.so")


GUARD = 64


def run_emulated(lib, x, h, w, wt, b, strides, ld, seed=0, offset=0, skip=0, tiled=True, kernel=None, ln=None):
    """The kernel the launcher picks (the tiled one unless `tiled` is off, as CUTLASS_OPS_DW_TILE=0;
    kernel: a list that gets "tiled" or "strip" appended); each output poisoned with NaN and
    GUARD sentinels after it; offset > 0 misaligns x and the outputs by that many elements (the
    element-wise path); skip > 0 hands it x as a view of tokens with `skip` NaN rows before each
    image's (as CvT's tokens less the cls row); ln: (weight, bias, eps), x and ld LayerNormed
    first (the tiled kernel's layer_norm)."""
    n, _, c = x.shape
    if skip:
        full = torch.full((n, skip + h * w, c), float("nan"), dtype=x.dtype)
        full[:, skip:] = x
        x = full[:, skip:]
    lead = 0 if ld is None else ld.shape[1]
    base = x if not skip else full
    xb = torch.empty(base.numel() + offset, dtype=x.dtype)
    xb[offset:] = base.reshape(-1)
    x_start = offset + (skip * c if skip else 0)
    image_stride = (skip + h * w) * c
    rows = [lead + ((h - 1) // s + 1) * ((w - 1) // s + 1) for s in strides]
    ybs = []
    for r in rows:
        yb = torch.full((n * r * c + offset + GUARD,), float("nan"), dtype=x.dtype)
        yb[n * r * c + offset:] = -777.0
        ybs.append(yb)
    vec, picked = ctypes.c_int(0), ctypes.c_int(0)
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    params_f32 = int(wt.dtype == torch.float32)
    y_ptrs = (ctypes.c_void_p * len(strides))(*[yb[offset:].data_ptr() for yb in ybs])
    stride_arr = (ctypes.c_int * len(strides))(*strides)
    rc = lib.emu_dw_conv(int(x.dtype == torch.bfloat16), ctypes.c_longlong(n), h, w, c, len(strides), stride_arr,
                         lead, ptr(xb[x_start:]), ctypes.c_longlong(image_stride), ptr(wt), ptr(b), params_f32,
                         ptr(ld), ctypes.c_longlong(lead * c), y_ptrs, 0, seed, int(tiled), ctypes.byref(vec),
                         ctypes.byref(picked), int(ln is not None), ptr(ln[0] if ln else None),
                         ptr(ln[1] if ln else None), int(ln is not None and ln[0].dtype == torch.float32),
                         ctypes.c_float(ln[2] if ln else 0.0))
    assert rc != 2, "layer_norm where the tiled kernel does not run"
    assert rc == 0, "deadlock"
    if kernel is not None:
        kernel.append("tiled" if picked.value else "strip")
    out = []
    for yb, r in zip(ybs, rows):
        size = n * r * c
        assert bool((yb[size + offset:] == -777.0).all()), "a write past an output"
        out.append(yb[offset:size + offset].view(n, r, c))
    return out, vec.value


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, vec", [(64, 8), (24, 8), (80, 8), (5, 1)])
@pytest.mark.parametrize("strides", [[1], [2], QKV, [2, 1]])
@pytest.mark.parametrize("lead", [0, 1])
@pytest.mark.parametrize("hw", [(9, 7), (6, 4)])
@pytest.mark.parametrize("tiled", [True, False])
def test_kernel_on_the_emulator(dw_emulator, dtype, c, vec, strides, lead, hw, tiled):
    """Both kernels (tiled: where 16-byte vectors work, here in several bands of rows, a slice
    of 8 and one of 2 chunks at c = 80, idle threads at c = 24), both vector widths, strides 1
    and 2 alone and together (odd maps: the last stride-2 window hangs over the edge), the lead
    rows copied exactly into every output, every output written (no NaN left), nothing past it,
    against float64; a second thread schedule bitwise equal."""
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, c, dtype, lead, seed=c, convs=len(strides))
    kernel = []
    ys, picked = run_emulated(dw_emulator, x, h, w, wt, b, strides, ld, tiled=tiled, kernel=kernel)
    assert picked == vec
    assert kernel == ["tiled" if tiled and vec == 8 else "strip"]
    assert not any(torch.isnan(y).any() for y in ys)
    assert worst(ys, reference(x, h, w, wt, b, strides, ld)) <= TOL[dtype]
    if ld is not None:
        assert all(torch.equal(y[:, :lead], ld) for y in ys)
    again, _ = run_emulated(dw_emulator, x, h, w, wt, b, strides, ld, seed=7, tiled=tiled)
    assert all(torch.equal(y, z) for y, z in zip(ys, again))


def layer_norm_params(c, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 100)
    return (1 + 0.5 * torch.randn(c, generator=g)).to(dtype), (0.3 * torch.randn(c, generator=g)).to(dtype), 1e-5


def layer_normed(t, ln):
    """float64 LayerNorm over the last dimension (the reference of the kernel's layer_norm)."""
    return None if t is None else F.layer_norm(t.double(), (t.shape[-1],), ln[0].double(), ln[1].double(), ln[2])


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c", [64, 24, 80])
@pytest.mark.parametrize("strides", [[1], QKV, [2, 1]])
@pytest.mark.parametrize("lead", [0, 1])
@pytest.mark.parametrize("hw", [(9, 7), (6, 4)])
def test_layer_norm_kernel_on_the_emulator(dw_emulator, dtype, c, strides, lead, hw):
    """The tiled kernel with the LayerNorm inside (layer_norm_dw_conv3x3_tokens: every channel in
    one slice; the band's pixels normalized in shared memory, the padding left zero; the lead
    rows normalized into every output): against float64 LayerNorm then convs, several bands,
    x's values far from zero mean (the statistics' cancellation shows), float32 LayerNorm
    parameters bitwise as 16-bit ones, two schedules bitwise."""
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, c, dtype, lead, seed=c + 1, convs=len(strides))
    x = (x.double() * 2 + 5).to(dtype)
    ln = layer_norm_params(c, dtype, seed=c)
    kernel = []
    ys, _ = run_emulated(dw_emulator, x, h, w, wt, b, strides, ld, ln=ln, kernel=kernel)
    assert kernel == ["tiled"]
    assert not any(torch.isnan(y).any() for y in ys)
    want = reference(layer_normed(x, ln), h, w, wt, b, strides, layer_normed(ld, ln))
    assert worst(ys, want) <= TOL[dtype]
    again, _ = run_emulated(dw_emulator, x, h, w, wt, b, strides, ld, seed=7, ln=ln)
    assert all(torch.equal(y, z) for y, z in zip(ys, again))
    wide, _ = run_emulated(dw_emulator, x, h, w, wt, b, strides, ld, ln=(ln[0].float(), ln[1].float(), ln[2]))
    assert all(torch.equal(y, z) for y, z in zip(ys, wide))


@emulator
def test_wide_map_takes_the_strip_kernel(dw_emulator):
    """A map too wide for the tiled kernel's band in shared memory (2 rows + halo of 130 pixels x
    64 channels > 64 KB) runs the strip kernel, with the same numbers as ever."""
    x, wt, b, ld = inputs(1, 3, 130, 64, torch.float16, 1, seed=5)
    kernel = []
    ys, _ = run_emulated(dw_emulator, x, 3, 130, wt, b, QKV, ld, kernel=kernel)
    assert kernel == ["strip"]
    assert worst(ys, reference(x, 3, 130, wt, b, QKV, ld)) <= TOL[torch.float16]


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_on_the_emulator_params_and_alignment(dw_emulator, dtype):
    """Each kernel: weight and bias in x's dtype give bitwise their float32 copies' numbers; no
    bias; one conv of the three alone gives bitwise its output among the three; a view with each
    image's rows apart gives bitwise the dense numbers.  A misaligned x and outputs, or 16-bit
    weights off their 16-byte alignment, take the strip kernel's element-wise path with its
    16-byte path's numbers."""
    x, wt, b, ld = inputs(2, 6, 6, 16, dtype, lead=1, seed=3)
    for tiled in (True, False):
        kernel = []
        native, _ = run_emulated(dw_emulator, x, 6, 6, wt, b, QKV, ld, tiled=tiled, kernel=kernel)
        assert kernel == ["tiled" if tiled else "strip"]
        wide, _ = run_emulated(dw_emulator, x, 6, 6, wt.float(), b.float(), QKV, ld, tiled=tiled)
        assert all(torch.equal(p, q) for p, q in zip(native, wide))
        nob, _ = run_emulated(dw_emulator, x, 6, 6, wt, None, QKV, None, tiled=tiled)
        assert worst(nob, reference(x, 6, 6, wt, None, QKV, None)) <= TOL[dtype]
        alone, _ = run_emulated(dw_emulator, x, 6, 6, wt[2:], b[2:], [2], ld, tiled=tiled)
        assert torch.equal(alone[0], native[2])
        # images apart: a view that skips each image's first row (CvT's cls), NaN there must not leak
        skipped, vec = run_emulated(dw_emulator, x, 6, 6, wt, b, QKV, ld, skip=1, tiled=tiled)
        assert vec == 8 and all(torch.equal(p, q) for p, q in zip(skipped, native))
    # `native` is now the strip kernel's 16-byte path
    kernel = []
    mis, vec = run_emulated(dw_emulator, x, 6, 6, wt, b, QKV, None, offset=1, kernel=kernel)
    assert kernel == ["strip"] and vec == 1 and all(torch.equal(p, q[:, 1:]) for p, q in zip(mis, native))
    # 16-bit weights 2 bytes off the 16-byte alignment of their chunk loads: the element-wise path
    off = torch.empty(wt.numel() + 1, dtype=dtype)
    off[1:] = wt.reshape(-1)
    shifted, vec = run_emulated(dw_emulator, x, 6, 6, off[1:].view(wt.shape), b, QKV, ld)
    assert vec == 1 and all(torch.equal(p, q) for p, q in zip(shifted, native))


# ---- layer_norm_dw_conv3x3_tokens: the convs on LayerNorm(x) ------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("strides, lead", [(QKV, 1), ([2], 0)])
def test_layer_norm_op_cpu(dtype, strides, lead):
    x, wt, b, ld = inputs(2, 5, 4, 16, dtype, lead, seed=9, convs=len(strides))
    ln = layer_norm_params(16, dtype)
    ys = layer_norm_dw_conv3x3_tokens(x, 5, 4, ln[0], ln[1], ln[2], wt, b, strides, ld)
    want = reference(layer_normed(x, ln), 5, 4, wt, b, strides, layer_normed(ld, ln))
    assert worst(ys, want) <= TOL[dtype]
    plain = layer_norm_dw_conv3x3_tokens(x, 5, 4, None, None, 1e-5, wt, b, strides, ld)  # no affine
    no_affine = (torch.ones(16, dtype=dtype), torch.zeros(16, dtype=dtype), 1e-5)
    assert worst(plain, reference(layer_normed(x, no_affine), 5, 4, wt, b, strides, layer_normed(ld, no_affine))) \
        <= TOL[dtype]


def test_layer_norm_op_gradcheck_and_opcheck_cpu():
    x, wt, b, ld = inputs(2, 3, 4, 5, torch.float64, 1, seed=4)
    lw, lb, eps = layer_norm_params(5, torch.float64)
    args = tuple(t.requires_grad_() for t in (x, lw, lb, wt, b, ld))

    def f(x, lw, lb, wt, b, ld):
        return tuple(layer_norm_dw_conv3x3_tokens(x, 3, 4, lw, lb, eps, wt, b, QKV, ld))
    assert torch.autograd.gradcheck(f, args)
    x, wt, b, ld = inputs(2, 3, 4, 8, torch.float32, 1, seed=5)
    lw, lb, eps = layer_norm_params(8, torch.float32)
    torch.library.opcheck(torch.ops.cutlass_ops.layer_norm_dw_conv3x3_tokens.default,
                          (x, 3, 4, lw, lb, eps, wt, b, QKV, ld))


def test_layer_norm_op_bad_input():
    x, wt, b, ld = inputs(2, 4, 4, 8, torch.float32, 1)
    lw, lb, eps = layer_norm_params(8, torch.float32)
    with pytest.raises(ValueError, match="ln_weight must be"):
        layer_norm_dw_conv3x3_tokens(x, 4, 4, lw[:4], lb, eps, wt, b, QKV, ld)
    with pytest.raises(ValueError, match="ln_bias must be floating"):
        layer_norm_dw_conv3x3_tokens(x, 4, 4, lw, lb.int(), eps, wt, b, QKV, ld)
    with pytest.raises(ValueError, match="eps must be"):
        layer_norm_dw_conv3x3_tokens(x, 4, 4, lw, lb, -1.0, wt, b, QKV, ld)
    with pytest.raises(ValueError, match="not h\\*w"):
        layer_norm_dw_conv3x3_tokens(x, 4, 5, lw, lb, eps, wt, b, QKV, ld)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, hw, strides, lead", [(64, (56, 56), QKV, 0), (384, (14, 14), QKV, 1),
                                                  (192, (28, 28), QKV, 0), (24, (9, 7), [2, 1], 1),
                                                  (64, (3, 130), QKV, 1), (5, (9, 7), [1], 0)])
def test_layer_norm_op_cuda_vs_float64(dtype, c, hw, strides, lead, monkeypatch):
    """The tiled kernel with the LayerNorm inside (CvT's maps, an odd one), ATen's LayerNorm then
    the convs where it does not run (a 130-wide map, 5 channels, CUTLASS_OPS_DW_TILE=0): each
    against float64, x far from zero mean, the outputs' memory poisoned first."""
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, c, dtype, lead, convs=len(strides))
    x = (x.double() * 2 + 5).to(dtype)
    ln = layer_norm_params(c, dtype)
    want = reference(layer_normed(x, ln), h, w, wt, b, strides, layer_normed(ld, ln))
    for tile in ("1", "0"):
        monkeypatch.setenv("CUTLASS_OPS_DW_TILE", tile)
        poison_cuda_cache(8 * x.numel())
        ys = layer_norm_dw_conv3x3_tokens(x.cuda(), h, w, ln[0].cuda(), ln[1].cuda(), ln[2], wt.cuda(), b.cuda(),
                                          strides, None if ld is None else ld.cuda())
        assert worst(ys, want) <= TOL[dtype], tile


# ---- the backward: autograd on the CPU, the input-gradient kernel on the emulator --------------

@pytest.mark.parametrize("strides", [[1], [2], QKV, [2, 1]])
@pytest.mark.parametrize("lead", [0, 1])
@pytest.mark.parametrize("hw", [(5, 4), (4, 5), (1, 3)])
def test_gradcheck_cpu(strides, lead, hw):
    """float64 gradcheck of x, weight, bias and the lead rows through dw_conv3x3_tokens's autograd
    (the input gradient by dw_conv3x3_tokens_backward_input, ATen's conv_transpose2d on the
    CPU), odd maps: the last stride-2 window hangs over the edge."""
    h, w = hw
    x, wt, b, ld = inputs(2, h, w, 3, torch.float64, lead, seed=h + w, convs=len(strides))
    args = [t.requires_grad_() for t in (x, wt, b) + ((ld,) if lead else ())]

    def f(x, wt, b, ld=None):
        return tuple(dw_conv3x3_tokens(x, h, w, wt, b, strides, ld))
    assert torch.autograd.gradcheck(f, tuple(args))


def test_backward_input_bad_input():
    g = [torch.randn(2, 4, 8)]
    wt = torch.randn(1, 8, 1, 3, 3)
    with pytest.raises(ValueError, match="one grad_y per stride"):
        cutlass_ops.ops.dw_conv3x3_tokens_backward_input(g, 4, 4, wt, [2, 2])
    with pytest.raises(ValueError, match=r"grad_y\[0\] must be"):
        cutlass_ops.ops.dw_conv3x3_tokens_backward_input(g, 4, 4, wt, [1])  # 16 rows, not 4
    with pytest.raises(ValueError, match="weight must be"):
        cutlass_ops.ops.dw_conv3x3_tokens_backward_input(g, 4, 4, wt[:, :4], [2])


def run_backward_emulated(lib, grads, h, w, wt, strides, seed=0, skip=0):
    """The input-gradient kernel; grad_x poisoned with NaN and GUARD sentinels after it; skip > 0
    hands each grad_y as a view with `skip` NaN rows before each image's (as behind a lead row)."""
    n, _, c = grads[0].shape
    views, keep = [], []
    for g in grads:
        if skip:
            full = torch.full((n, skip + g.shape[1], c), float("nan"), dtype=g.dtype)
            full[:, skip:] = g
            keep.append(full)
            views.append((full[:, skip:], (skip + g.shape[1]) * c))
        else:
            views.append((g.contiguous(), g.shape[1] * c))
    out = torch.full((n * h * w * c + GUARD,), float("nan"), dtype=grads[0].dtype)
    out[n * h * w * c:] = -777.0
    vec = ctypes.c_int(0)
    gp = (ctypes.c_void_p * len(views))(*[v.data_ptr() for v, _ in views])
    gs = (ctypes.c_longlong * len(views))(*[st for _, st in views])
    sa = (ctypes.c_int * len(strides))(*strides)
    rc = lib.emu_dw_conv_backward_input(int(grads[0].dtype == torch.bfloat16), ctypes.c_longlong(n), h, w, c,
                                        len(strides), sa, gp, gs, ctypes.c_void_p(wt.data_ptr()),
                                        int(wt.dtype == torch.float32), ctypes.c_void_p(out.data_ptr()), 0, seed,
                                        ctypes.byref(vec))
    assert rc == 0, "deadlock"
    assert bool((out[n * h * w * c:] == -777.0).all()), "a write past grad_x"
    return out[:n * h * w * c].view(n, h * w, c), vec.value


def backward_reference(grads, h, w, wt, strides):
    """float64: the gradient of sum_j <grad_y[j], conv_j(x)> with respect to x, by autograd."""
    n, _, c = grads[0].shape
    x = torch.zeros(n, h * w, c, dtype=torch.float64, requires_grad=True)
    ys = reference(x, h, w, wt, None, strides, None)
    torch.autograd.backward(ys, [g.double() for g in grads])
    return x.grad


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, vec", [(64, 8), (24, 8), (5, 1)])
@pytest.mark.parametrize("strides", [[1], [2], QKV, [2, 1]])
@pytest.mark.parametrize("hw", [(9, 7), (6, 4), (1, 2)])
def test_backward_input_kernel_on_the_emulator(dw_emulator, dtype, c, vec, strides, hw):
    """The input gradient of 1-3 convs in one kernel: every element written (no NaN left), nothing
    past grad_x, against float64 autograd; a second thread schedule bitwise equal; grad_y as
    views behind a NaN row (images apart) bitwise the same; float32 weights bitwise as their
    16-bit copies."""
    h, w = hw
    g = torch.Generator().manual_seed(c + h)
    grads = [torch.randn(3, ((h - 1) // s + 1) * ((w - 1) // s + 1), c, generator=g).to(dtype) for s in strides]
    wt = (torch.randn(len(strides), c, 1, 3, 3, generator=g) / 3).to(dtype)
    gx, picked = run_backward_emulated(dw_emulator, grads, h, w, wt, strides)
    assert picked == vec and not torch.isnan(gx).any()
    assert rel(gx, backward_reference(grads, h, w, wt, strides)) <= TOL[dtype]
    again, _ = run_backward_emulated(dw_emulator, grads, h, w, wt, strides, seed=5)
    assert torch.equal(gx, again)
    apart, _ = run_backward_emulated(dw_emulator, grads, h, w, wt, strides, skip=1)
    assert torch.equal(gx, apart)
    wide, _ = run_backward_emulated(dw_emulator, grads, h, w, wt.float(), strides)
    assert torch.equal(gx, wide)


# ---- CUDA -----------------------------------------------------------------------------------

@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, hw, strides, lead", [(64, (56, 56), QKV, 0), (64, (56, 56), [2], 0),
                                                  (384, (14, 14), QKV, 1), (384, (14, 14), [1], 1),
                                                  (192, (28, 28), QKV, 0), (5, (9, 7), [2, 1], 1)])
def test_cuda_vs_float64(dtype, c, hw, strides, lead):
    h, w = hw
    x, wt, b, ld = inputs(5, h, w, c, dtype, lead, convs=len(strides))
    ys = dw_conv3x3_tokens(x.cuda(), h, w, wt.cuda(), b.cuda(), strides, None if ld is None else ld.cuda())
    assert worst(ys, reference(x, h, w, wt, b, strides, ld)) <= TOL[dtype]
    if ld is not None:
        assert all(torch.equal(y[:, :lead].cpu(), ld) for y in ys)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c, hw, strides, lead", [(64, (56, 56), QKV, 0), (384, (14, 14), QKV, 1),
                                                  (192, (28, 28), QKV, 0), (5, (9, 7), [2, 1], 1)])
def test_cuda_backward_vs_float64(dtype, c, hw, strides, lead):
    """Gradients of x, weight, bias and the lead rows through the op on the GPU (the input
    gradient by the kernel, outputs poisoned first) against float64 autograd on the CPU."""
    h, w = hw
    x, wt, b, ld = inputs(3, h, w, c, dtype, lead, convs=len(strides))
    g = torch.Generator().manual_seed(7)
    rows = [lead + ((h - 1) // s + 1) * ((w - 1) // s + 1) for s in strides]
    grads = [torch.randn(3, r, c, generator=g).to(dtype) for r in rows]
    leaves64 = [t.double().requires_grad_() for t in (x, wt, b) + ((ld,) if lead else ())]
    torch.autograd.backward(reference(leaves64[0], h, w, leaves64[1], leaves64[2], strides,
                                      leaves64[3] if lead else None), [t.double() for t in grads])
    leaves = [t.cuda().requires_grad_() for t in (x, wt, b) + ((ld,) if lead else ())]
    poison_cuda_cache(8 * x.numel())
    ys = dw_conv3x3_tokens(leaves[0], h, w, leaves[1], leaves[2], strides, leaves[3] if lead else None)
    torch.autograd.backward(ys, [t.cuda() for t in grads])
    for got, want in zip(leaves, leaves64):
        assert rel(got.grad, want.grad) <= 2 * TOL[dtype], (got.shape, rel(got.grad, want.grad))


# ---- FusedCvT with CvTOptions.dw_tokens ------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_fused_cvt_dw_tokens_against_float64(device, monkeypatch):
    """FusedCvT in eval mode with autograd off and the projections as dw_conv3x3_tokens (the
    cls token of stage 3 in front): float64 on the CPU within 1e-12 of the reference; fp16 on
    CUDA no worse than 2x the default path's error against that float64 run (floor 5e-3)."""
    from cutlass_ops.models.cvt import cvt13
    with seeded(0):
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
    import cutlass_ops.fused_cvt_blocks as blocks
    op = blocks.dw_conv3x3_tokens
    monkeypatch.setattr(blocks, "dw_conv3x3_tokens", lambda *a: calls.append(1) or op(*a))

    def run(flag):
        fused.options = cutlass_ops.CvTOptions(dw_tokens=flag == "1")
        with torch.no_grad():
            return fused(x.to(device, dtype))
    on = run("1")
    assert calls == [1] * 13  # q, k, v of every block in one call
    off = run("0")
    assert len(calls) == 13
    if device == "cpu":
        assert rel(on, want) <= 1e-12
    else:
        assert rel(on, want) <= max(2 * rel(off, want), 5e-3), (rel(on, want), rel(off, want))
