"""conv2d_dgrad and conv2d_wgrad (the training path's conv gradients; cutlass_ops/ops/conv2d_fused.py's autograd)
against float64 references, on the CPU (ATen) and the GPU (generated CUTLASS kernels)."""
import pathlib

import pytest
import torch
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from _helpers import DEVICES, HAS_CUDA, TOLERANCE, errors, fallback, fallback_where, poison_cuda_cache

LOW = [torch.float16, torch.bfloat16]

# (N, C, H, W, K, R, S, stride, padding): FusedResNet's convs (small batches), odd sizes,
# and channel counts the kernels do not take (C % 8 != 0: ATen).
CASES = [
    (3, 64, 16, 16, 64, 3, 3, 1, 1),     # block 0
    (5, 64, 16, 16, 128, 3, 3, 2, 1),    # block 1 conv1 (strided dgrad)
    (2, 64, 8, 8, 128, 1, 1, 1, 0),      # a downsample 1x1
    (3, 256, 4, 4, 512, 3, 3, 2, 1),     # block 3 conv1
    (4, 512, 2, 2, 512, 3, 3, 1, 1),     # block 3 conv2 (2x2 maps; cuDNN's dgrad: dy scaled, not w)
    (3, 24, 9, 7, 40, 3, 3, 2, 1),       # odd maps, stride 2
    (1, 16, 7, 9, 8, 5, 3, 2, 2),        # non-square kernel and rows a stride leaves over
    (64, 64, 16, 16, 64, 3, 3, 1, 1),    # N*P*Q = 16384: wgrad split many ways
    (3, 2048, 1, 1, 2048, 1, 1, 1, 0),   # block 3 conv2 as the dense layer (small_map_conv)
    (2, 12, 7, 7, 20, 3, 3, 1, 1),       # C % 8 != 0: the ATen composite
]
KERNEL_CASES = [c for c in CASES if c[1] % 8 == 0 and c[4] % 8 == 0]
# Bounds for our wgrad's float32 G: float32 accumulation over N*P*Q products (16384 in one
# CTA for an unsplit 64-image case measured 1.8e-5), still 10x tighter than a 16-bit G.
F32_SUMS = (1e-4, 4e-4)


def _operands(case, dtype, device, rng):
    n, c, h, w, k, r, s, stride, pad = case
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, generator=rng).to(dtype).to(device).contiguous(memory_format=cl)
    weight = (torch.randn(k, c, r, s, generator=rng) * (c * r * s) ** -0.5).to(dtype).to(device)
    weight = weight.contiguous(memory_format=cl)
    dy = torch.randn(n, k, p, q, generator=rng).to(dtype).to(device).contiguous(memory_format=cl)
    return x, weight, dy, stride, pad




def _expect_kernel(device, dtype, case, kind):
    """On the GPU, eligible shapes run a generated kernel, or cuDNN where the build's
    profile measured it faster (test_every_kernel covers every kernel regardless)."""
    name = cutlass_ops.ops.conv2d_backward_last_kernel()
    if device == "cuda" and dtype in LOW and case[1] % 8 == 0 and case[4] % 8 == 0:
        # (block 0's dgrad on sm90: conv2d_fused's halo kernel on the rotated filter)
        assert name.startswith((f"cutlass_ops_conv2d_{kind}_", "aten (cuDNN: the profile")) or (
            kind == "dgrad" and "_sm90_halo" in name and name.endswith("(dgrad: the rotated filter)")), name
        if kind == "dgrad" and case[7] > 1:
            assert "_unity_" not in name, name
    else:
        assert name.startswith("aten") and "cuDNN" not in name, name
    return name


def _no_tf32():
    """cuDNN would use TF32 for float32 by default (torch's global setting)."""
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [fallback(torch.float32)])
@pytest.mark.parametrize("case", fallback_where(CASES, lambda c: c[1] % 8 or c[4] % 8))
@pytest.mark.parametrize("with_scale", [True, False])
def test_conv2d_dgrad(device, dtype, case, with_scale, rng):
    x, weight, dy, stride, pad = _operands(case, dtype, device, rng)
    scale = (torch.rand((), generator=rng) * 2 - 1.2).to(device) if with_scale else None  # random, non-zero
    poison_cuda_cache(x.numel() * x.element_size())
    with _no_tf32():
        got = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
    _expect_kernel(device, dtype, case, "dgrad")
    w64 = weight.double().cpu() * (scale.double().cpu() if with_scale else 1.0)
    want = conv2d_input(x.shape, w64, dy.double().cpu(), stride, pad)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(got, want)
    bound = TOLERANCE[dtype]
    assert rel < bound[0] and mx < bound[1], (rel, mx)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW + [fallback(torch.float32)])
@pytest.mark.parametrize("case", fallback_where(CASES, lambda c: c[1] % 8 or c[4] % 8))
@pytest.mark.parametrize("with_scale", [True, False])
def test_conv2d_wgrad(device, dtype, case, with_scale, rng):
    x, weight, dy, stride, pad = _operands(case, dtype, device, rng)
    scale = (torch.rand((), generator=rng) * 2 - 1.2).to(device) if with_scale else None  # random, non-zero
    poison_cuda_cache(64 * weight.numel() * 4)  # covers the split-K partial sums too
    with _no_tf32():
        grad_w, grad_scale = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)
    name = _expect_kernel(device, dtype, case, "wgrad")
    g = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
    s = scale.double().cpu() if with_scale else 1.0
    assert grad_w.shape == weight.shape and grad_w.dtype == dtype and grad_scale.shape == ()
    assert grad_w.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(grad_w, g * s)  # rounded once to the weight's dtype
    bound = TOLERANCE[dtype]
    assert rel < bound[0] and mx < bound[1], (name, rel, mx)
    # d scale = <w, G> in float32: our kernels sum G in float32, far closer to float64 than
    # a 16-bit G; cuDNN on CUDA writes a 16-bit G.  Relative to sum |w * G| (the dot may cancel).
    cudnn_16bit = device == "cuda" and dtype in LOW and name.startswith("aten")
    want = (weight.double().cpu() * g).sum()
    scale_err = (grad_scale.double().cpu() - want).abs() / (weight.double().cpu() * g).abs().sum()
    assert scale_err < (TOLERANCE[dtype] if cudnn_16bit else F32_SUMS)[0], (name, scale_err.item())


def _built_kernels(kind, dtype):
    """The build's kernels of this kind and dtype that this GPU runs (family 90, built with
    CUTLASS_OPS_SM90_BACKWARD=1, runs on sm90 only; test_conv2d_backward_sm90.py tests it)."""
    dname = {torch.float16: "f16", torch.bfloat16: "bf16"}[dtype]
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    return [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels()
            if k.startswith(f"cutlass_ops_conv2d_{kind}_{dname}_") and (sm90 or "_sm90_" not in k)]


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("case", KERNEL_CASES)
def test_every_kernel(dtype, case, rng):
    """Every built dgrad/wgrad kernel (whatever the dispatcher or the profile would pick),
    and the cuDNN path, on each eligible shape; wgrad unsplit and split 2 and 7 ways (7:
    slices of unequal length)."""
    x, weight, dy, stride, pad = _operands(case, dtype, "cuda", rng)
    scale = (torch.rand((), generator=rng) + 0.5).cuda()
    want_dx = conv2d_input(x.shape, weight.double().cpu() * scale.double().cpu(), dy.double().cpu(), stride, pad)
    g = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
    wg = g * weight.double().cpu()
    want_dw = (g * scale.double().cpu(), wg.sum(), wg.abs().sum())  # dw, d scale, its scale
    ran = 0
    for kind in ("dgrad", "wgrad"):
        for name in _built_kernels(kind, dtype) + ["cudnn"]:  # "cudnn": the ATen path, forced
            if kind == "dgrad" and stride > 1 and "_unity_" in name:
                continue
            for split in ([0] if kind == "dgrad" or name == "cudnn" else [1, 2, 7]):
                torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, split)
                try:
                    poison_cuda_cache(8 * weight.numel() * 4 + x.numel() * 2)
                    if kind == "dgrad":
                        got, want = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale), want_dx
                        bound = TOLERANCE[dtype]
                    else:  # d scale = <w, G>: float32 sums for ours, a 16-bit G for cuDNN
                        got, want = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale), want_dw
                        bound = TOLERANCE[dtype] if name == "cudnn" else F32_SUMS
                except ValueError as e:  # can_implement said no: only for too few K-iterations
                    assert "cannot run this problem" in str(e) and split > 1, (name, split, e)
                    continue
                finally:
                    torch.ops.cutlass_ops.conv2d_backward_force_kernel("")
                last = cutlass_ops.ops.conv2d_backward_last_kernel()
                assert last.startswith(name if name != "cudnn" else "aten (cuDNN: forced)"), last
                if kind == "wgrad":  # the dot may cancel: its error relative to sum |w * G|
                    (got, got_scale), (want, want_scale, dot_scale) = got, want
                    assert got.dtype == dtype
                    scale_err = (got_scale.double().cpu() - want_scale).abs() / dot_scale
                    assert scale_err < bound[0], (name, split, scale_err.item())
                    bound = TOLERANCE[dtype]  # dw itself is rounded to the weight's dtype
                rel, mx = errors(got, want)
                assert rel < bound[0] and mx < bound[1], (name, split, rel, mx)
                ran += 1
    assert ran >= 2


def _sum_error(got: torch.Tensor, terms: torch.Tensor) -> float:
    """Error of a computed sum of `terms`, relative to the sum of their magnitudes: the bound a
    float64 sum in any order meets.  Relative to the sum itself it would fail by chance, since
    the FixUp scale's gradient sum(dW * W) can cancel to near zero (CI saw 6.7e-12 that way)."""
    got, terms = got.detach().double().cpu(), terms.detach().double().cpu()
    return ((got - terms.sum()).abs() / terms.abs().sum().clamp_min(1e-30)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.fallback  # float64: the ATen path
def test_float64_is_exact_aten(device, rng):
    case = CASES[1]
    x, weight, dy, stride, pad = _operands(case, torch.float64, device, rng)
    scale = torch.tensor(-0.7, dtype=torch.float64, device=device)
    dx = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)
    dw, ds = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)
    assert dx.dtype == dw.dtype == ds.dtype == torch.float64
    g = conv2d_weight(x, weight.shape, dy, stride, pad)
    for got, want in ((dx, conv2d_input(x.shape, weight * scale, dy, stride, pad)), (dw, g * scale)):
        rel, mx = errors(got, want)
        assert rel < 1e-12 and mx < 1e-11, (rel, mx)
    assert _sum_error(ds, g * weight) < 1e-12


# The ATen path's chunked weight gradient (used above 2^30 elements; here forced small with
# CUTLASS_OPS_WGRAD_CHUNK_ELEMENTS): groups of samples, and output rows against the input rows
# they read, zero-padded at the image's edges.  Budgets as fractions of the larger operand:
# from below one row to a few samples.
@pytest.mark.parametrize("case", [
    (3, 16, 9, 7, 24, 3, 3, 1, 1),
    (2, 8, 11, 6, 16, 5, 3, 2, 2),    # rows a stride leaves over, pad 2 on a 5-row kernel
    (2, 8, 10, 5, 8, 3, 3, 3, 0),     # stride 3, no padding: input rows between chunks unread
    (4, 16, 6, 6, 32, 1, 1, 1, 0),
])
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.3, 0.6])
def test_wgrad_aten_chunks(case, fraction, monkeypatch, rng):
    x, weight, dy, stride, pad = _operands(case, torch.float32, "cpu", rng)
    x, weight, dy = x.double(), weight.double(), dy.double()
    budget = max(1, int(fraction * max(x.numel(), dy.numel())))  # below it: the chunked path runs
    monkeypatch.setenv("CUTLASS_OPS_WGRAD_CHUNK_ELEMENTS", str(budget))
    scale = torch.tensor(-0.8, dtype=torch.float64)
    dw, ds = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)
    g = conv2d_weight(x, weight.shape, dy, stride, pad)
    rel, mx = errors(dw, g * scale)
    assert rel < 1e-12 and mx < 1e-11, (budget, rel, mx)
    assert _sum_error(ds, g * weight) < 1e-12, budget


def _profile_cudnn_problems():
    """(kind, N, C, H, W, K, R, stride, pad) of the shipped profiles' rows where cuDNN was
    fastest, smallest first (read with the generator's own profile reader)."""
    from cutlass_ops_gen.tiles import profile_files, read_profile_rows
    rows = []
    for path in profile_files(pathlib.Path(__file__).resolve().parents[2] / "profiles", 80):
        for kind in ("dgrad", "wgrad"):
            for r in read_profile_rows(path, kind):
                if r["Provider"] == "cudnn" and r["Activation"] == "f16:nhwc" and r["r"] == r["s"]:
                    rows.append((kind, *(int(r[f]) for f in ("n", "c", "h", "w", "k", "r", "stride_h", "pad_h"))))
    # by size, ties by the tuple: the same problem in every process (a set's order is not)
    return sorted(set(rows), key=lambda t: (t[1] * t[3] * t[4] * max(t[2], t[5]), t))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("kind", ["dgrad", "wgrad"])
def test_cudnn_off_runs_our_kernel(kind, monkeypatch, rng):
    """A problem the profile gives to cuDNN runs our family-80 kernel under CUTLASS_OPS_CUDNN=0
    (the sanitizer's initcheck run uses it) and gives the same numbers."""
    problems = [p for p in _profile_cudnn_problems() if p[0] == kind]
    if not problems:
        pytest.skip(f"no cuDNN {kind} row in profiles/*/sm80.csv")
    _, n, c, h, w, k, r, stride, pad = problems[0]
    x, weight, dy, stride, pad = _operands((n, c, h, w, k, r, r, stride, pad), torch.float16, "cuda", rng)
    monkeypatch.setenv("CUTLASS_OPS_SM90", "0")

    def run():
        if kind == "dgrad":
            return cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad)
        return cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad)[0]

    if kind == "dgrad":
        ref = conv2d_input(x.shape, weight.double(), dy.double(), stride, pad)
    else:
        ref = conv2d_weight(x.double(), weight.shape, dy.double(), stride, pad)
    run()
    assert cutlass_ops.ops.conv2d_backward_last_kernel().startswith("aten (cuDNN: the profile"), problems[0]
    monkeypatch.setenv("CUTLASS_OPS_CUDNN", "0")
    got = run()
    name = cutlass_ops.ops.conv2d_backward_last_kernel()
    assert name.startswith(f"cutlass_ops_conv2d_{kind}_f16_sm80_"), (problems[0], name)
    rel, mx = errors(got, ref)
    assert rel < 2e-3, (problems[0], name, rel, mx)


def test_cpu_wgrad_strided_1x1(rng):
    """float32 weight gradient of a strided 1x1 conv on the CPU: ATen's channels_last path gave
    a wrong G (0.01-0.3 relative, changing from call to call) for this shape in torch 2.11, so
    the CPU path computes it in NCHW; several calls, as one may come out right by chance."""
    case = (3, 3, 12, 6, 24, 1, 1, 2, 0)
    for _ in range(8):
        x, weight, dy = _operands(case, torch.float32, "cpu", rng)[:3]
        g, _ = cutlass_ops.conv2d_wgrad(dy, x, weight, stride=2, padding=0)
        want = conv2d_weight(x.double(), weight.shape, dy.double(), stride=2, padding=0)
        assert errors(g, want)[0] < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_bad_input(device, rng):
    x, weight, dy, stride, pad = _operands(CASES[0], torch.float16, device, rng)
    with pytest.raises(ValueError, match="grad_output shape"):
        cutlass_ops.conv2d_dgrad(dy[:, :, 1:], weight, x.shape, stride, pad)
    with pytest.raises(ValueError, match="grad_output shape"):
        cutlass_ops.conv2d_wgrad(dy, x, weight, 2, pad)
    with pytest.raises(ValueError, match="weight dtype"):
        cutlass_ops.conv2d_dgrad(dy, weight.float(), x.shape, stride, pad)
    with pytest.raises(ValueError, match="input dtype"):
        cutlass_ops.conv2d_wgrad(dy, x.float(), weight, stride, pad)
    with pytest.raises(ValueError, match="scale must be a scalar"):
        cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="channels but weight expects"):
        cutlass_ops.conv2d_dgrad(dy, weight, (3, 32, 16, 16), stride, pad)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        cutlass_ops.conv2d_wgrad(dy, x, weight, 0, pad)
    with pytest.raises(ValueError, match="weight dtype"):
        cutlass_ops.conv2d_wgrad(dy, x, weight.float(), stride, pad)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, rng):
    x, weight, dy, stride, pad = _operands(CASES[5], torch.float16, device, rng)
    scale = torch.tensor(0.8, device=device)
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_dgrad.default,
                          (dy, weight, list(x.shape), [stride] * 2, [pad] * 2, scale))
    torch.library.opcheck(torch.ops.cutlass_ops.conv2d_wgrad.default,
                          (dy, x, weight, [stride] * 2, [pad] * 2, scale))


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (or a CPU-only build)")
@pytest.mark.parametrize("kind", ["dgrad", "wgrad"])
def test_kernels_under_cuda_graph(kind, rng):
    """Our kernels (forced: the profile may prefer cuDNN for this shape) replay correctly
    from a CUDA graph with new inputs: the wgrad split's partial sums (allocated in the
    graph's pool) and its epilogue pass (checked through d scale), and dgrad's scale read on
    the device."""
    x, weight, dy, stride, pad = _operands(CASES[7], torch.float16, "cuda", rng)  # 64 images
    scale = torch.tensor(0.5, device="cuda")
    name = [k for k in _built_kernels(kind, torch.float16) if "_strided_" not in k][0]
    if kind == "dgrad":
        fn = lambda: cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, scale)  # noqa: E731
    else:
        fn = lambda: cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)[1]  # noqa: E731
    torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, 0)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph needs
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    finally:
        torch.ops.cutlass_ops.conv2d_backward_force_kernel("")
    dy.copy_(torch.randn(dy.shape, generator=rng).to(dy))
    scale.fill_(-1.25)
    out.fill_(float("nan"))
    graph.replay()
    if kind == "dgrad":
        rel, _ = errors(out, conv2d_input(x.shape, weight.double().cpu() * -1.25, dy.double().cpu(), stride, pad))
        assert rel < 1e-3, rel
    else:  # d scale = <w, G>, every slice in it; a dot may cancel: relative to sum |w * G|
        wg = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad) * weight.double().cpu()
        err = (out.double().cpu() - wg.sum()).abs() / wg.abs().sum()
        assert err < F32_SUMS[0], err.item()
