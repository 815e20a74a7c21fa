"""The Hopper-native (family 90: CUTLASS 3.x, TMA im2col + wgmma, sm_90a) conv2d_dgrad and
conv2d_wgrad kernels, each forced by name, against float64 references: FusedResNet's backward
shapes and odd ones, with and without the FixUp scale, on a poisoned allocator (an unwritten
output reads NaN); wgrad at several batch-slice counts (CUTLASS 4.2's sm90 conv cannot split K:
the instance runs one conv per slice of images, concurrently on side streams); dgrad's refusal
of stride > 1 (the sm90 dgrad kernel is unity-stride only) and the fallback to family 80's
strided kernel; the dispatcher's CUTLASS_OPS_SM90 policy; a CUDA graph capture of the sliced wgrad.

Skipped without an sm90 GPU or when the build has no family-90 dgrad/wgrad kernels (build with
90 in CUTLASS_OPS_ARCHS and CUTLASS_OPS_SM90_BACKWARD=1)."""
import functools
import re
import zlib

import pytest
import torch
from torch.nn.grad import conv2d_input, conv2d_weight

import cutlass_ops
from _helpers import HAS_CUDA, TOLERANCE, errors, poison_cuda_cache, run_in_threads


def _built():
    if not HAS_CUDA or not hasattr(torch.ops.cutlass_ops, "conv2d_backward_kernels"):
        return []
    return [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels() if "_sm90_" in k]


SM90 = _built()
ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not (ON_SM90 and SM90), reason=(
    "needs an sm90 GPU and a build with family-90 dgrad/wgrad kernels "
    "(90 in CUTLASS_OPS_ARCHS and CUTLASS_OPS_SM90_BACKWARD=1)"))
pytestmark = needs_sm90
DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16}


def _params(kind):
    names = [k for k in SM90 if k.startswith(f"cutlass_ops_conv2d_{kind}_")]
    return [pytest.param(k, id=k.replace("cutlass_ops_conv2d_", "")) for k in names] or [
        pytest.param(None, marks=pytest.mark.skip(reason=f"no family-90 {kind} kernels in this build"))]


def kernel_dtype(name):
    return DTYPE[name.split("_")[4]]  # cutlass_ops_conv2d_<kind>_<dtype>_sm90_...


# (N, C, H, W, K, R, S, stride, padding): FusedResNet's backward convs (each block's 3x3 convs,
# the downsample 1x1 convs on the pooled maps, block 3's conv2 as the dense layer), at small
# batches, and odd shapes (channels not a multiple of the 64-wide K tile: TMA's zero fill;
# odd and non-square maps and filters, N = 1, many images).
RESNET = [
    (8, 64, 16, 16, 64, 3, 3, 1, 1),      # block 0 conv1/conv2
    (8, 128, 8, 8, 128, 3, 3, 1, 1),      # block 1 conv2
    (8, 256, 4, 4, 256, 3, 3, 1, 1),      # block 2 conv2
    (4, 512, 2, 2, 512, 3, 3, 1, 1),      # block 3 conv2 (2x2 maps)
    (8, 64, 8, 8, 128, 1, 1, 1, 0),       # block 1 downsample (on the pooled map)
    (8, 256, 2, 2, 512, 1, 1, 1, 0),      # block 3 downsample
    (3, 2048, 1, 1, 2048, 1, 1, 1, 0),    # block 3 conv2 as the dense layer (small_map_conv)
    (5, 64, 16, 16, 128, 3, 3, 2, 1),     # block 1 conv1 (stride 2: wgrad only)
    (3, 256, 4, 4, 512, 3, 3, 2, 1),      # block 3 conv1 (stride 2: wgrad only)
]
ODD = [
    (3, 24, 9, 7, 40, 3, 3, 1, 1),        # C, K not multiples of 64
    (2, 16, 7, 9, 8, 5, 3, 1, 2),         # non-square filter, pad 2
    (1, 8, 5, 5, 8, 3, 3, 1, 1),          # one image, 8 channels
    (7, 72, 11, 13, 136, 3, 3, 1, 1),     # odd everything
    (2, 64, 9, 9, 64, 3, 3, 2, 1),        # stride 2 on an odd map (wgrad only)
    (64, 64, 16, 16, 64, 3, 3, 1, 1),     # N*P*Q = 16384: many batch slices
]
CASES = [pytest.param(c, id="x".join(map(str, c))) for c in RESNET + ODD]
SCALES = [pytest.param(None, id="noscale"), pytest.param(-0.7, id="scale")]
# Our wgrad sums G in float32 (as family 80's; test_conv2d_backward.F32_SUMS): d scale = <w, G>
# within 1e-4 of sum |w * G|.
F32_SUMS = (1e-4, 4e-4)


def _operands(case, dtype, rng):
    n, c, h, w, k, r, s, stride, pad = case
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, generator=rng).to(dtype).cuda().contiguous(memory_format=cl)
    weight = (torch.randn(k, c, r, s, generator=rng) * (c * r * s) ** -0.5).to(dtype).cuda()
    weight = weight.contiguous(memory_format=cl)
    dy = torch.randn(n, k, p, q, generator=rng).to(dtype).cuda().contiguous(memory_format=cl)
    return x, weight, dy, stride, pad


@functools.lru_cache(maxsize=4)
def _cached(case, dtype):
    """Operands (fixed seed per case and dtype) and their float64 references, shared by the
    kernels, scales and slice counts of one case (the 64-image case's reference takes ~1 s)."""
    rng = torch.Generator().manual_seed(zlib.crc32(repr((case, str(dtype))).encode()))
    x, weight, dy, stride, pad = _operands(case, dtype, rng)
    xd, wd, dyd = x.double().cpu(), weight.double().cpu(), dy.double().cpu()
    dx = conv2d_input(x.shape, wd, dyd, stride, pad) if stride == 1 else None
    g = conv2d_weight(xd, weight.shape, dyd, stride, pad)
    return x, weight, dy, dx, g, g * wd


@pytest.fixture
def forced():
    """forced(name, split): this thread's dgrad/wgrad calls run `name` until the test ends."""
    def force(name, split_k=0):
        torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, split_k)
    yield force
    torch.ops.cutlass_ops.conv2d_backward_force_kernel("", 0)


def _scale(value):
    return None if value is None else torch.tensor(value, device="cuda")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", _params("dgrad"))
def test_dgrad_kernel(name, case, scale, forced):
    dtype = kernel_dtype(name)
    x, weight, dy, want, _, _ = _cached(case, dtype)
    stride, pad = case[7], case[8]
    s = _scale(scale)
    forced(name)
    if stride > 1:  # CUTLASS 4.2's sm90 dgrad is unity-stride only: refused, never run
        with pytest.raises(ValueError, match="cannot run this problem"):
            cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, s)
        return
    poison_cuda_cache(x.numel() * 2 + (1 << 20))
    dx = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, s)
    assert cutlass_ops.ops.conv2d_backward_last_kernel() == name
    if scale is not None:
        want = want * scale
    assert dx.dtype == dtype and dx.shape == x.shape
    assert dx.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(dx, want)
    assert rel < TOLERANCE[dtype][0] and mx < TOLERANCE[dtype][1], (name, rel, mx)


@pytest.mark.parametrize("split", [0, 1, 2, 7])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", _params("wgrad"))
def test_wgrad_kernel(name, case, scale, split, forced):
    """split: forced batch slices (0: the dispatcher's count; 7: slices of unequal length)."""
    dtype = kernel_dtype(name)
    x, weight, dy, _, g, wg = _cached(case, dtype)
    stride, pad = case[7], case[8]
    s = _scale(scale)
    forced(name, split)
    if split > x.shape[0]:  # at most one slice per image
        with pytest.raises(ValueError, match="cannot run this problem"):
            cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, s)
        return
    poison_cuda_cache((split or 64) * weight.numel() * 4 + (1 << 20))  # unwritten float32 slices read NaN
    dw, dscale = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, s)
    last = cutlass_ops.ops.conv2d_backward_last_kernel()
    m = re.fullmatch(re.escape(name) + r" \+ wgrad epilogue over (\d+) batch slice\(s\)", last)
    assert m, last
    if split > 0:
        assert int(m.group(1)) == split, last
    want = g * (1.0 if scale is None else scale)
    assert dw.dtype == dtype and dw.shape == weight.shape
    rel, mx = errors(dw, want)
    assert rel < TOLERANCE[dtype][0] and mx < TOLERANCE[dtype][1], (name, split, rel, mx)
    dot_err = (dscale.double().cpu() - wg.sum()).abs() / wg.abs().sum()
    assert dscale.dtype == torch.float32 and dot_err < F32_SUMS[0], (name, split, dot_err.item())


def test_dgrad_stride_2_falls_through_to_family_80(monkeypatch, rng):
    """Unforced, with family 90 first: a strided dgrad runs family 80's strided kernel (or cuDNN),
    a unity-stride one a family-90 kernel."""
    monkeypatch.setenv("CUTLASS_OPS_SM90", "1")
    for dtype in (torch.float16, torch.bfloat16):
        if not any(k.startswith(f"cutlass_ops_conv2d_dgrad_{'f16' if dtype == torch.float16 else 'bf16'}_sm90")
                   for k in SM90):
            continue
        x, weight, dy, stride, pad = _operands(RESNET[7], dtype, rng)
        dx = cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, None)
        last = cutlass_ops.ops.conv2d_backward_last_kernel()
        assert "_sm90_" not in last, last
        want = conv2d_input(x.shape, weight.double().cpu(), dy.double().cpu(), stride, pad)
        assert errors(dx, want)[0] < TOLERANCE[dtype][0]
        x, weight, dy, stride, pad = _operands(RESNET[0], dtype, rng)
        cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, None)
        assert "_sm90_" in cutlass_ops.ops.conv2d_backward_last_kernel()


@pytest.mark.parametrize("policy", ["0", "1"])
@pytest.mark.parametrize("kind", ["dgrad", "wgrad"])
def test_sm90_policy(kind, policy, monkeypatch, rng):
    """CUTLASS_OPS_SM90=0: never family 90; =1: family 90 first wherever it runs."""
    if not any(k.startswith(f"cutlass_ops_conv2d_{kind}_f16_sm90") for k in SM90):
        pytest.skip(f"no f16 family-90 {kind} kernels in this build")
    monkeypatch.setenv("CUTLASS_OPS_SM90", policy)
    x, weight, dy, stride, pad = _operands(RESNET[0], torch.float16, rng)
    if kind == "dgrad":
        cutlass_ops.conv2d_dgrad(dy, weight, x.shape, stride, pad, None)
    else:
        cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, None)
    last = cutlass_ops.ops.conv2d_backward_last_kernel()
    assert ("_sm90_" in last) == (policy == "1"), last


@pytest.mark.parametrize("name", _params("wgrad"))
def test_sliced_wgrad_in_a_cuda_graph(name, forced, rng):
    """The batch slices' fork/join over side streams captures into a CUDA graph, and replays
    right on new inputs."""
    dtype = kernel_dtype(name)
    case = RESNET[0]
    x, weight, dy, stride, pad = _operands(case, dtype, rng)
    scale = torch.tensor(0.5, device="cuda")
    forced(name, 4)
    cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)  # warm-up (side streams created)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dw, dscale = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, scale)
    assert "over 4 batch slice(s)" in cutlass_ops.ops.conv2d_backward_last_kernel()
    for _ in range(2):
        x2, w2, dy2, _, _ = _operands(case, dtype, rng)
        x.copy_(x2)
        dy.copy_(dy2)
        graph.replay()
        torch.cuda.synchronize()
        g = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
        rel, mx = errors(dw, g * 0.5)
        assert rel < TOLERANCE[dtype][0] and mx < TOLERANCE[dtype][1], (rel, mx)
        wg = g * weight.double().cpu()
        assert (dscale.double().cpu() - wg.sum()).abs() / wg.abs().sum() < F32_SUMS[0]


@pytest.mark.parametrize("name", _params("wgrad"))
def test_sliced_wgrad_first_call_inside_a_capture(name, rng):
    """On a fresh thread the side streams and events are created by the first sliced call; here
    that call is inside a CUDA graph capture (FusedResNet captures its backward like this)."""
    dtype = kernel_dtype(name)
    case = RESNET[0]
    x, weight, dy, stride, pad = _operands(case, dtype, rng)
    out = {}

    def body(_):
        torch.cuda.set_device(x.device)
        torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, 3)  # thread-local
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out["dw"], out["ds"] = cutlass_ops.conv2d_wgrad(dy, x, weight, stride, pad, None)
        graph.replay()
        torch.cuda.synchronize()
        out["graph"] = graph

    run_in_threads(body)
    g = conv2d_weight(x.double().cpu(), weight.shape, dy.double().cpu(), stride, pad)
    rel, mx = errors(out["dw"], g)
    assert rel < TOLERANCE[dtype][0] and mx < TOLERANCE[dtype][1], (rel, mx)
