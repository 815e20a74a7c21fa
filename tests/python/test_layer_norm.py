"""cutlass_ops.ops.layer_norm_rows (CvT's LayerNorms, fused with the residual add before
them): the op's CPU path against float64, its autograd (gradcheck), opcheck, bad input; the CUDA
kernel on the CPU emulator (tests/cuda_emulator: the same device code, every row shape the
launcher picks, against the CPU path, two thread schedules bitwise equal, guard elements); the
kernel on a GPU (skipped without one); FusedCvT with its fused LayerNorms (the default) against
CvTOptions(fused_layer_norm=False)."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

import _emulator
import cutlass_ops
from cutlass_ops.ops import layer_norm_rows
from _helpers import fallback
from _seeds import seeded

HAS_CUDA = torch.cuda.is_available() and cutlass_ops.cuda_kernels_built()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
emulator = pytest.mark.skipif(not _emulator.AVAILABLE, reason=_emulator.MISSING)

# float64 reference: x + residual rounded to x's dtype (as the op and CvT's block), then the
# LayerNorm in float64; bounds per dtype on ||y - ref|| / ||ref||
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def inputs(shape, dtype, device="cpu", residual=True, affine=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = shape[-1]
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype).to(device)
    r = torch.randn(shape, generator=g).to(dtype).to(device) if residual else None
    w = (torch.rand(c, generator=g) + 0.5).to(device) if affine else None  # float32, as CvT's weights
    b = torch.randn(c, generator=g).to(device) if affine else None
    return x, r, w, b


def reference(x, r, w, b, eps=1e-5):
    s = x if r is None else x + r
    return F.layer_norm(s.double(), [s.shape[-1]], None if w is None else w.double(),
                        None if b is None else b.double(), eps), s


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---- CPU ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 192), (1, 1), (4, 3), (2, 384), (0, 64)])
@pytest.mark.parametrize("residual", [False, True])
def test_cpu_vs_float64(dtype, shape, residual):
    x, r, w, b = inputs(shape, dtype, residual=residual)
    y, s = layer_norm_rows(x, w, b, 1e-5, r)
    ref, ref_s = reference(x, r, w, b)
    assert y.shape == x.shape and y.dtype == dtype
    if residual:
        assert torch.equal(s, ref_s)
    else:
        assert s is None
    if y.numel():
        assert rel(y, ref) <= TOL[dtype], rel(y, ref)


def test_cpu_no_affine_and_one_column():
    x, r, _, _ = inputs((5, 40), torch.float32)
    y, _ = layer_norm_rows(x, None, None, 1e-5, r)
    assert rel(y, reference(x, r, None, None)[0]) <= 1e-5
    x, _, w, b = inputs((6, 1), torch.float32, residual=False)
    y, _ = layer_norm_rows(x, w, b, 1e-5)
    assert torch.equal(y, b.expand(6, 1))  # a one-element row normalises to 0: y is the bias


def test_cpu_gradcheck_float64():
    x, r, w, b = inputs((5, 24), torch.float64)
    w, b = w.double(), b.double()
    args = [t.clone().requires_grad_(True) for t in (x, r, w, b)]

    def f(x, r, w, b):
        y, s = layer_norm_rows(x, w, b, 1e-5, r)
        return y, s * 0.3  # the sum has users of its own (the next residual)
    assert torch.autograd.gradcheck(f, tuple(args))


def test_cpu_opcheck():
    x, r, w, b = inputs((6, 16), torch.float32)
    for res in (None, r):
        torch.library.opcheck(torch.ops.cutlass_ops.layer_norm_rows.default, (x, res, w, b, 1e-5))
    _, s, mean, rstd = torch.ops.cutlass_ops.layer_norm_rows(x, r, w, b, 1e-5)
    gy = torch.randn_like(x)
    for gs, weight, flags in ((None, w, (True, True)), (gy * 0.5, None, (False, True)), (gy, w, (False, False))):
        torch.library.opcheck(torch.ops.cutlass_ops.layer_norm_rows_backward.default,
                              (gy, gs, s, mean, rstd, weight, *flags),
                              test_utils=("test_schema", "test_faketensor"))


def test_errors():
    x, r, w, b = inputs((4, 8), torch.float32)
    with pytest.raises(ValueError, match="residual shape"):
        layer_norm_rows(x, w, b, 1e-5, r[:, :4])
    with pytest.raises(ValueError, match="weight must have shape"):
        layer_norm_rows(x, w[:4], b, 1e-5)
    with pytest.raises(ValueError, match="residual dtype"):
        layer_norm_rows(x, w, b, 1e-5, r.double())
    with pytest.raises(ValueError, match="must be floating"):
        layer_norm_rows(x.int(), w, b, 1e-5)


# ---- the CUDA kernel on the CPU emulator ----------------------------------------------------

@pytest.fixture(scope="module")
def ln_emulator(tmp_path_factory):
    return _emulator.build("layer_norm_harness.cpp", tmp_path_factory.mktemp("ln_emu") / "ln_emu.so")


GUARD = 64


def _guarded(n, dtype):
    full = torch.full((n + GUARD,), float("nan"), dtype=dtype)
    full[n:] = -777.0
    return full


def _placed(t, offset):
    """A copy of t (flattened) starting `offset` elements into a buffer (None for None)."""
    if t is None:
        return None
    buf = torch.empty(t.numel() + offset, dtype=t.dtype)
    buf[offset:] = t.reshape(-1)
    return buf[offset:]


def run_emulated(lib, x, r, w, b, eps=1e-5, seed=0, offset=0):
    """The kernel on x (rows, cols): outputs poisoned with NaN, GUARD sentinel elements after each;
    offset > 0 misaligns every pointer by that many elements (the element-wise path)."""
    rows, cols = x.shape
    n = rows * cols

    xp, rp = _placed(x, offset), _placed(r, offset)
    yf, sf = _guarded(n + offset, x.dtype), _guarded(n + offset, x.dtype)
    mf, rf = _guarded(rows, torch.float32), _guarded(rows, torch.float32)
    shape = (ctypes.c_int * 3)()
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.emu_layer_norm(int(x.dtype == torch.bfloat16), ctypes.c_longlong(rows), cols, ctypes.c_float(eps),
                            ptr(xp), ptr(rp), ptr(w), ptr(b),
                            int(not any(t is not None and t.dtype == x.dtype for t in (w, b))),
                            ptr(yf[offset:]), ptr(sf[offset:] if r is not None else None),
                            ptr(mf), ptr(rf), 0, seed, shape)
    if rc == 2:
        return None, tuple(shape)
    assert rc == 0, "deadlock"
    for full, size in ((yf, n + offset), (mf, rows), (rf, rows)) + (((sf, n + offset),) if r is not None else ()):
        assert bool((full[size:] == -777.0).all()), "a write past the output"
    y = yf[offset:n + offset].view(rows, cols)
    s = sf[offset:n + offset].view(rows, cols) if r is not None else None
    return (y, s, mf[:rows], rf[:rows]), tuple(shape)


@emulator
@pytest.mark.parametrize("cols, shape", [(24, (8, 4, 1)), (64, (8, 8, 1)), (128, (8, 16, 1)), (192, (8, 32, 1)),
                                         (384, (8, 32, 2)), (2048, (8, 32, 8)), (3, (1, 32, 1)), (100, (1, 32, 4)),
                                         (57, (1, 32, 2)), (512, (8, 32, 2))])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("residual", [True, False])
def test_kernel_on_the_emulator(ln_emulator, cols, shape, dtype, residual):
    """Every row shape the launcher picks (vector width, lanes per row, chunks per lane), 37 rows
    (warps with rows past the end), CTAs looping over several row groups: y, the sum, mean and
    rstd against the op's CPU path; two schedules bitwise equal; nothing written past an output."""
    x, r, w, b = inputs((37, cols), dtype, residual=residual, seed=cols)
    got, picked = run_emulated(ln_emulator, x, r, w, b, seed=0)
    assert picked == shape
    again, _ = run_emulated(ln_emulator, x, r, w, b, seed=11)
    assert all(torch.equal(a, c) for a, c in zip(got[:1] + got[2:], again[:1] + again[2:]))
    y_ref, s_ref, mean_ref, rstd_ref = torch.ops.cutlass_ops.layer_norm_rows(x, r, w, b, 1e-5)
    y, s, mean, rstd = got
    assert rel(y, y_ref) <= TOL[dtype] / 4, rel(y, y_ref)
    assert rel(y, reference(x, r, w, b)[0]) <= TOL[dtype]
    assert rel(mean, mean_ref) <= 1e-5 and rel(rstd, rstd_ref) <= 1e-5
    if residual:
        assert torch.equal(s, s_ref)


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_on_the_emulator_params_in_x_dtype(ln_emulator, dtype):
    """Weight and bias in x's dtype (a 16-bit model's own parameters, read without a cast kernel)
    give bitwise the numbers of the same values in float32, on the vector and element-wise paths."""
    for cols, offset in ((64, 0), (384, 0), (57, 0), (64, 1)):
        x, r, w, b = inputs((37, cols), dtype, residual=True, seed=cols)
        w16, b16 = w.to(dtype), b.to(dtype)
        native, _ = run_emulated(ln_emulator, x, r, w16, b16, offset=offset)
        wide, _ = run_emulated(ln_emulator, x, r, w16.float(), b16.float(), offset=offset)
        assert all(torch.equal(p, q) for p, q in zip(native, wide)), (cols, offset)


@emulator
def test_kernel_on_the_emulator_misaligned_and_too_wide(ln_emulator):
    """A row start off 16 bytes takes the element-wise path (same numbers); rows too wide for
    the registers (over 2048 columns, or over 512 not a multiple of 8) are not covered: the CUDA
    op runs ATen's LayerNorm for them."""
    x, r, w, b = inputs((9, 64), torch.float16)
    got, picked = run_emulated(ln_emulator, x, r, w, b, offset=1)
    assert picked == (1, 32, 2)
    assert rel(got[0], torch.ops.cutlass_ops.layer_norm_rows(x, r, w, b, 1e-5)[0]) <= TOL[torch.float16] / 4
    for cols in (2056, 521):
        x, r, w, b = inputs((2, cols), torch.float16)
        assert run_emulated(ln_emulator, x, r, w, b)[0] is None


def backward_reference(s, gy, gs, w, eps=1e-5):
    """float64 gradients of LayerNorm(s) (s the 16-bit sum the forward normalized) for output
    gradient gy, plus gs: (grad_x, grad_weight, grad_bias)."""
    s64 = s.double().requires_grad_(True)
    w64 = None if w is None else w.double().requires_grad_(True)
    b64 = torch.zeros(s.shape[-1], dtype=torch.float64, requires_grad=True)
    F.layer_norm(s64, [s.shape[-1]], w64, b64, eps).backward(gy.double())
    gx = s64.grad + (0 if gs is None else gs.double())
    return gx, (None if w is None else w64.grad), b64.grad


def run_emulated_backward(lib, gy, gs, s, mean, rstd, w, params=True, grid=2, seed=0, offset=0):
    """The backward kernel on `grid` CTAs: grad_x poisoned with NaN and guarded, the per-CTA
    partials poisoned too (each CTA must write its row) and summed here as the op does."""
    rows, cols = s.shape
    n = rows * cols

    gyp, gsp, sp = _placed(gy, offset), _placed(gs, offset), _placed(s, offset)
    gxf = _guarded(n + offset, s.dtype)
    pf = _guarded(2 * grid * cols, torch.float32) if params else None
    shape = (ctypes.c_int * 3)()
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())  # noqa: E731
    rc = lib.emu_layer_norm_backward(int(s.dtype == torch.bfloat16), ctypes.c_longlong(rows), cols, ptr(gyp),
                                     ptr(gsp), ptr(sp), ptr(mean), ptr(rstd), ptr(w),
                                     int(w is None or w.dtype == torch.float32), ptr(gxf[offset:]), ptr(pf),
                                     grid, seed, shape)
    if rc == 2:
        return None, tuple(shape)
    assert rc == 0, "deadlock"
    assert bool((gxf[n + offset:] == -777.0).all()), "a write past grad_x"
    gx = gxf[offset:n + offset].view(rows, cols)
    sums = None
    if params:
        assert bool((pf[2 * grid * cols:] == -777.0).all()), "a write past the partials"
        part = pf[:2 * grid * cols].view(2, grid, cols)
        assert not part.isnan().any(), "a CTA left its partial row unwritten"
        sums = part.sum(1)
    return (gx, sums), tuple(shape)


def backward_inputs(rows, cols, dtype, grad_sum, weight, seed):
    g = torch.Generator().manual_seed(seed)
    x, r, w, b = inputs((rows, cols), dtype, residual=True, seed=seed)
    if weight == "x dtype":
        w = w.to(dtype)
    elif weight is None:
        w = None
    _, s, mean, rstd = torch.ops.cutlass_ops.layer_norm_rows(x, r, w, b, 1e-5)
    gy = torch.randn((rows, cols), generator=g).to(dtype)
    gs = torch.randn((rows, cols), generator=g).to(dtype) if grad_sum else None
    return gy, gs, s, mean, rstd, w


@emulator
@pytest.mark.parametrize("cols, shape", [(24, (8, 4, 1)), (64, (8, 8, 1)), (128, (8, 16, 1)), (192, (8, 32, 1)),
                                         (384, (8, 32, 2)), (1024, (8, 32, 4)), (3, (1, 32, 1)), (100, (1, 32, 4)),
                                         (57, (1, 32, 2))])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("grad_sum", [True, False])
def test_backward_kernel_on_the_emulator(ln_emulator, cols, shape, dtype, grad_sum):
    """The backward kernel at every row shape it takes, 37 rows on 2 CTAs (warps looping over
    several row groups, warps with rows past the end): grad_x (+ grad_sum) and the summed
    per-CTA partials (the weight's and bias's gradients) against float64 and the op's CPU path
    (ATen's float32 backward); two schedules bitwise equal; nothing written past an output."""
    weight = {24: None, 64: "x dtype"}.get(cols, "float32")
    gy, gs, s, mean, rstd, w = backward_inputs(37, cols, dtype, grad_sum, weight, seed=cols)
    got, picked = run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w, params=True, seed=0)
    assert picked == shape
    again, _ = run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w, params=True, seed=5)
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1])
    gx, sums = got
    ref_gx, ref_gw, ref_gb = backward_reference(s, gy, gs, w)
    cpu_gx, cpu_gw, cpu_gb = torch.ops.cutlass_ops.layer_norm_rows_backward(gy, gs, s, mean, rstd, w, True, True)
    assert rel(gx, ref_gx) <= TOL[dtype] and rel(gx, cpu_gx) <= TOL[dtype] / 2
    assert rel(sums[1], ref_gb) <= 1e-5 and rel(sums[1], cpu_gb) <= 1e-5
    if w is not None:
        assert rel(sums[0], ref_gw) <= 1e-4 and rel(sums[0], cpu_gw) <= 1e-4
    nop, _ = run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w, params=False)
    assert torch.equal(nop[0], gx)  # the parameters' sums do not change grad_x


@emulator
def test_backward_kernel_on_the_emulator_misaligned_and_too_wide(ln_emulator):
    """Pointers off 16 bytes: the element-wise path, same numbers; rows over 1024 columns (or
    over 512 not a multiple of 8) are not covered: the CUDA op runs ATen's backward."""
    gy, gs, s, mean, rstd, w = backward_inputs(9, 64, torch.float16, True, "float32", seed=2)
    aligned, _ = run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w)
    got, picked = run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w, offset=1)
    assert picked == (1, 32, 2)
    assert rel(got[0], aligned[0]) <= 1e-3 and rel(got[1], aligned[1]) <= 1e-5
    for cols in (1032, 521):
        gy, gs, s, mean, rstd, w = backward_inputs(2, cols, torch.float16, False, "float32", seed=3)
        assert run_emulated_backward(ln_emulator, gy, gs, s, mean, rstd, w)[0] is None


def test_cpu_backward_op_and_errors():
    """layer_norm_rows_backward's CPU path (what autograd calls) against float64, the
    parameters' gradients only where asked for, and its argument checks."""
    gy, gs, s, mean, rstd, w = backward_inputs(5, 24, torch.float16, True, "float32", seed=4)
    gx, gw, gb = torch.ops.cutlass_ops.layer_norm_rows_backward(gy, gs, s, mean, rstd, w, False, True)
    ref_gx, _, ref_gb = backward_reference(s, gy, gs, w)
    assert gx.dtype == torch.float16 and rel(gx, ref_gx) <= TOL[torch.float16]
    assert gw.numel() == 0 and rel(gb, ref_gb) <= 1e-5
    with pytest.raises(ValueError, match="grad_y must match s"):
        torch.ops.cutlass_ops.layer_norm_rows_backward(gy[:4], gs, s, mean, rstd, w, True, True)
    with pytest.raises(ValueError, match="rstd must be"):
        torch.ops.cutlass_ops.layer_norm_rows_backward(gy, gs, s, mean, rstd.double(), w, True, True)
    with pytest.raises(ValueError, match="weight must be"):
        torch.ops.cutlass_ops.layer_norm_rows_backward(gy, gs, s, mean, rstd, w[:3], True, True)


# ---- CUDA -----------------------------------------------------------------------------------

@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_params_in_x_dtype(dtype):
    """A 16-bit model's own weight and bias (read by the kernel without a cast kernel): bitwise
    the output of their float32 copies, and gradients of the parameters' dtype."""
    x, r, w, b = inputs((2053, 384), dtype, "cuda")
    w16, b16 = (t.to(dtype).requires_grad_(True) for t in (w, b))
    y16, s16 = layer_norm_rows(x, w16, b16, 1e-5, r)
    y32, s32 = layer_norm_rows(x, w16.detach().float(), b16.detach().float(), 1e-5, r)
    assert torch.equal(y16, y32) and torch.equal(s16, s32)
    y16.float().square().sum().backward()
    assert w16.grad.dtype == dtype and b16.grad.dtype == dtype and torch.isfinite(w16.grad).all()


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cols", [64, 192, 384, 57, 1024, fallback(2048), fallback(3000)])  # ATen past the kernels' columns
@pytest.mark.parametrize("residual", [True, False])
def test_cuda_vs_float64_and_cpu_path(dtype, cols, residual):
    """The kernel (3000 columns: ATen's) at an odd row count against float64 and the CPU path,
    and its gradients (the backward kernel up to 1024 columns, ATen's above) against float64's."""
    x, r, w, b = inputs((2053, cols), dtype, residual=residual)
    xc, rc, wc, bc = (None if t is None else t.cuda().requires_grad_(True) for t in (x, r, w, b))
    y, s = layer_norm_rows(xc, wc, bc, 1e-5, rc)
    ref, ref_s = reference(x, r, w, b)
    assert rel(y, ref) <= TOL[dtype]
    assert rel(y, layer_norm_rows(x, w, b, 1e-5, r)[0]) <= TOL[dtype] / 4
    if residual:
        assert torch.equal(s.cpu(), ref_s)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    y.backward(gy.cuda())
    x64, r64, w64, b64 = (None if t is None else t.double().requires_grad_(True) for t in (x, r, w, b))
    ref64, _ = reference(x64, r64, w64, b64)
    ref64.backward(gy.double())
    assert rel(xc.grad, x64.grad) <= 2 * TOL[dtype]
    assert rel(wc.grad, w64.grad) <= 2 * TOL[dtype] and rel(bc.grad, b64.grad) <= 2 * TOL[dtype]
    if residual:
        assert torch.equal(rc.grad, xc.grad)


# ---- FusedCvT with the fused LayerNorms ------------------------------------------------------

@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_fused_cvt_fused_layer_norm_matches_unfused(device):
    """FusedCvT (random weights, eval mode) with its fused LayerNorms (CvTOptions.fused_layer_norm,
    the default) against the ATen path (off): outputs and every parameter's gradient.  float32 on
    the CPU: the same math, so the two agree to 1e-5.  fp16 on CUDA: each path against the
    float64 run of the same model (the ATen path on the CPU), the fused LayerNorms no worse than
    2x the ATen path's error (floor 5e-3).  Not fp16 against fp16: the first H200 run found a
    stem-conv weight gradient of ~1e-5 per element, below fp16's normal range, where the two
    16-bit runs differ by 1.1% from each other for rounding alone."""
    from cutlass_ops.models.cvt import cvt13
    dtype = torch.float32 if device == "cpu" else torch.float16
    with seeded(0):
        ref = cvt13().to(device, dtype).eval()
    fused = cutlass_ops.FusedCvT.from_reference(ref).eval()
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1)).to(device, dtype)

    def run(model, inp, flag):
        model.options = cutlass_ops.CvTOptions(fused_layer_norm=flag == "1")
        model.zero_grad(set_to_none=True)
        y = model(inp)
        y.float().square().sum().backward()
        return [y.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    on, off = run(fused, x, "1"), run(fused, x, "0")
    assert len(on) == len(off)
    if dtype == torch.float32:
        for i, (a, c) in enumerate(zip(on, off)):
            if c.norm() > 0:
                assert rel(a, c) <= 1e-5, (i, rel(a, c))
        return
    fused64 = cutlass_ops.FusedCvT.from_reference(cvt13().double().eval())
    fused64.load_state_dict({k: v.double().cpu() for k, v in fused.state_dict().items()})
    ref64 = run(fused64.eval(), x.double().cpu(), "0")
    assert len(ref64) == len(on)
    for i, (a, c, r) in enumerate(zip(on, off, ref64)):
        if r.norm() > 0:
            e_on, e_off = rel(a.cpu(), r), rel(c.cpu(), r)
            assert e_on <= max(2 * e_off, 5e-3), (i, e_on, e_off)
