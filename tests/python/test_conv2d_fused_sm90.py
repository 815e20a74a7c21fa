"""The Hopper-native (family 90: CUTLASS 3.x, TMA im2col + wgmma, sm_90a) conv2d_fused kernels,
each forced by name, against a float64 reference: every epilogue combination, ResNet shapes,
the fallback to family 80 / ATen for what TMA cannot load, and the dispatch order on sm90.

Skipped without an sm90 GPU or when the build has no family-90 kernels (build with 90 in
CUTLASS_OPS_ARCHS)."""
import itertools
import os

import pytest
import torch

import cutlass_ops
from cutlass_ops.ops import conv2d_fused_kernel_family, conv2d_fused_kernels
from _helpers import HAS_CUDA, TOLERANCE, errors, poison_cuda_cache, run_in_threads
from test_conv2d_fused import random_case, reference

# The generated family-90 kernels; the hand-written halo kernels (one problem class each) have
# their own tests (test_conv2d_fused_sm90_halo.py).
SM90 = [k for k in conv2d_fused_kernels(90) if "_halo" not in k]
ON_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not (ON_SM90 and SM90), reason=(
    "needs an sm90 GPU and a build with family-90 kernels (90 in CUTLASS_OPS_ARCHS)"))
DTYPE = {"f16": torch.float16, "bf16": torch.bfloat16}
KERNELS = [pytest.param(k, id=k.replace("cutlass_ops_conv2d_fused_", "")) for k in SM90] or [
    pytest.param(None, marks=pytest.mark.skip(reason="no family-90 kernels in this build"))]


def kernel_dtype(name):
    return DTYPE[name.split("_")[4]]  # cutlass_ops_conv2d_fused_<dtype>_sm90_...


@pytest.fixture
def forced():
    """forced(name): make this thread's conv2d_fused calls run `name` until the test ends."""
    def force(name, split_k=0):
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, split_k)
    yield force
    torch.ops.cutlass_ops.conv2d_fused_force_kernel("")


def run_checked(case, relu, dtype, expect=None, silu=False):
    """Runs the case on a poisoned allocator (an unwritten output reads NaN) and checks it
    against the float64 reference; returns the kernel that ran."""
    n, _, h, w = case["x"].shape
    poison_cuda_cache(2 * n * case["w"].shape[0] * h * w * 2)
    out = cutlass_ops.conv2d_fused(case["x"], case["w"], case["bias"], case["residual"], case["stride"],
                                   case["padding"], case["scale"], case["post_bias"], relu, silu)
    kernel = cutlass_ops.conv2d_fused_last_kernel()
    ref = reference(case["x"], case["w"], case["bias"], case["residual"], case["stride"], case["padding"],
                    case["scale"], case["post_bias"], relu, silu)
    assert out.shape == ref.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=torch.channels_last)
    rel, mx = errors(out, ref)
    rel_tol, max_tol = TOLERANCE[dtype]
    if os.environ.get("CUTLASS_OPS_ERROR_LOG"):  # collected by tests/gpu_acceptance.sh
        with open(os.environ["CUTLASS_OPS_ERROR_LOG"], "a") as f:
            f.write(f"{kernel} {str(dtype)[6:]} cuda {rel:.3e} {mx:.3e}\n")
    assert rel <= rel_tol and mx <= max_tol, f"{kernel}: rel {rel:.3e} max {mx:.3e}"
    if expect is not None:
        assert kernel == expect, f"ran {kernel}, not {expect}"
    return kernel


def test_kernel_list_and_families():
    names = conv2d_fused_kernels()
    if cutlass_ops.cuda_kernels_built():
        assert names == list(torch.ops.cutlass_ops.conv2d_fused_kernels())
    else:
        assert names == []
    for family in (70, 80, 90):
        assert all(conv2d_fused_kernel_family(n) == family for n in conv2d_fused_kernels(family))
    assert sorted(sum((conv2d_fused_kernels(f) for f in (70, 80, 90)), [])) == sorted(names)
    for name in SM90:  # fp16/bf16, alignment 8 only
        assert name.endswith("_align8") and name.split("_")[4] in DTYPE
    assert conv2d_fused_kernel_family("cutlass_ops_conv2d_fused_bf16_sm90_128x128x64_autos_2x1c_align8") == 90


# Every epilogue term present or absent (null pointers: scale 1, biases 0, no residual),
# ReLU on and off, random non-zero values.
EPILOGUES = list(itertools.product(["channel", "scalar", "none"], [True, False], [True, False],
                                   [True, False], [True, False]))


@needs_sm90
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bias, scale, post_bias, residual, relu", EPILOGUES,
                         ids=lambda v: str(v) if isinstance(v, str) else None)
def test_every_epilogue(kernel, bias, scale, post_bias, residual, relu, forced, rng):
    dtype = kernel_dtype(kernel)
    case = random_case(3, 64, 72, 10, 9, 3, 3, dtype, "cuda", rng, bias=bias, residual=residual)
    if not scale:
        case["scale"] = None
    if not post_bias:
        case["post_bias"] = None
    forced(kernel)
    run_checked(case, relu, dtype, expect=kernel)


@needs_sm90
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("residual", [True, False])
def test_silu_runs_family_80(kernel, residual, forced, monkeypatch, rng):
    """Family 90 has no SiLU epilogue (its register cost slowed every family-90 kernel): a SiLU
    call runs a family-80 kernel, whatever the policy, and forcing a family-90 one says why."""
    dtype = kernel_dtype(kernel)
    case = random_case(3, 64, 72, 10, 9, 1, 1, dtype, "cuda", rng, residual=residual, padding=0)
    monkeypatch.setenv("CUTLASS_OPS_SM90", "1")  # family 90 first wherever it can run
    ran = run_checked(case, False, dtype, silu=True)
    assert conv2d_fused_kernel_family(ran) == 80, ran
    forced(kernel)
    with pytest.raises(ValueError, match="no SiLU epilogue"):
        run_checked(case, False, dtype, silu=True)


# ResNet shapes: odd batches, C in FusedResNet's set, 1x1 and 3x3, strides 1 and 2 (K = 2C
# where the stride halves the map, as the network's downsampling convs do).
SPATIAL = {64: 12, 128: 8, 256: 6, 512: 4}
SHAPES = [(n, c, r, stride) for n in (3, 37) for c in (64, 128, 256, 512) for r in (1, 3) for stride in (1, 2)]


@needs_sm90
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "n{}_c{}_r{}_s{}".format(*s))
def test_resnet_shapes(kernel, shape, forced, rng):
    n, c, r, stride = shape
    dtype = kernel_dtype(kernel)
    k = min(2 * c, 512) if stride == 2 else c
    hw = SPATIAL[c]
    case = random_case(n, c, k, hw, hw, r, r, dtype, "cuda", rng, stride=stride, padding=r // 2)
    forced(kernel)
    run_checked(case, relu=True, dtype=dtype, expect=kernel)


# Channel counts that are multiples of 8 but not of the tile (TMA reads zeros past C),
# non-square kernels and maps, stride 3, padding 2, the stem as a 4x4 stride-4 conv.
ODD_SHAPES = [  # (n, c, k, h, w, r, s, stride, padding)
    (3, 24, 40, 11, 13, 3, 3, 1, 1),
    (1, 48, 64, 64, 64, 4, 4, 4, 0),
    (2, 16, 40, 15, 15, 5, 3, 3, 2),
    (5, 8, 8, 7, 7, 1, 1, 1, 0),
    (2, 520, 136, 5, 5, 3, 3, 1, 1),
    (1, 64, 64, 1, 1, 3, 3, 1, 1),    # one output pixel, 8 of 9 taps in the padding
]


@needs_sm90
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "n{}c{}k{}_{}x{}_r{}s{}_st{}p{}".format(*s))
def test_odd_shapes(kernel, shape, forced, rng):
    n, c, k, h, w, r, s, stride, padding = shape
    dtype = kernel_dtype(kernel)
    case = random_case(n, c, k, h, w, r, s, dtype, "cuda", rng, stride=stride, padding=padding)
    forced(kernel)
    run_checked(case, relu=True, dtype=dtype, expect=kernel)


@needs_sm90
@pytest.mark.parametrize("c", [3, 4, 12, 20])
def test_small_unaligned_channels_fall_back(c, forced, rng):
    """Stem-like inputs (C not a multiple of 8: TMA cannot load them) run family 80 or ATen,
    and forcing a family-90 kernel on them is an error naming it."""
    dtype = kernel_dtype(SM90[0])
    case = random_case(4, c, 64, 17, 17, 3, 3, dtype, "cuda", rng, stride=2, padding=1)
    kernel = run_checked(case, relu=True, dtype=dtype)
    assert "_sm90_" not in kernel and (kernel == "aten" or "_sm80_" in kernel)
    forced(SM90[0])
    with pytest.raises(ValueError, match="forced kernel"):
        cutlass_ops.conv2d_fused(case["x"], case["w"], padding=1, stride=2)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sm90_policy(dtype, monkeypatch, rng):
    """CUTLASS_OPS_SM90=0: family 80 only; =1: family 90 first; unset: the profile decides, so a
    problem no profile row covers (C=40, K=56: no FusedResNet conv) runs family 80."""
    case = random_case(8, 40, 56, 16, 16, 3, 3, dtype, "cuda", rng)
    built = [k for k in SM90 if kernel_dtype(k) == dtype]
    if not built:
        pytest.skip(f"no {dtype} family-90 kernels in this build")
    for env, family in (("0", "_sm80_"), (None, "_sm80_"), ("1", "_sm90_")):
        if env is None:
            monkeypatch.delenv("CUTLASS_OPS_SM90", raising=False)
        else:
            monkeypatch.setenv("CUTLASS_OPS_SM90", env)
        kernel = run_checked(case, relu=True, dtype=dtype)
        assert family in kernel, f"ran {kernel} with CUTLASS_OPS_SM90={env}"
    assert kernel in built


@needs_sm90
def test_no_split_k(forced, rng):
    dtype = kernel_dtype(SM90[0])
    case = random_case(1, 256, 64, 4, 4, 3, 3, dtype, "cuda", rng, residual=False)
    forced(SM90[0], 2)
    with pytest.raises(ValueError, match="cannot split K"):
        cutlass_ops.conv2d_fused(case["x"], case["w"], padding=1)
    forced(SM90[0])  # split_k 0: the dispatcher's choice, which is 1 for these kernels
    run_checked(case, relu=False, dtype=dtype, expect=SM90[0])


@needs_sm90
@pytest.mark.parametrize("kernel", KERNELS)
def test_dependent_chain_and_graph_replay(kernel, forced, rng):
    """Back-to-back dependent calls (each a programmatic dependent launch of the previous
    kernel on sm90: the scalars and inputs must be read after it finished), and a CUDA graph
    replay that reads changed scalars from device memory."""
    dtype = kernel_dtype(kernel)
    case = random_case(6, 64, 64, 12, 12, 3, 3, dtype, "cuda", rng)
    forced(kernel)
    x, ref = case["x"], case["x"].double().cpu()
    for _ in range(4):  # y_{i+1} = relu(s * conv(y_i) + b + y_i) + pb, through the op's own outputs
        x_next = cutlass_ops.conv2d_fused(x, case["w"], case["bias"], x, 1, 1, case["scale"], case["post_bias"], True)
        ref = reference(ref, case["w"], case["bias"], ref, 1, 1, case["scale"], case["post_bias"], True)
        x = x_next
    assert cutlass_ops.conv2d_fused_last_kernel() == kernel
    rel, _ = errors(x, ref)
    assert rel <= 4 * TOLERANCE[dtype][0], f"{kernel}: chain rel {rel:.3e}"

    run = lambda: cutlass_ops.conv2d_fused(case["x"], case["w"], case["bias"], case["residual"], 1, 1,
                                           case["scale"], case["post_bias"], True)
    run()  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    case["scale"].fill_(2.0)
    case["post_bias"].fill_(-0.25)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference(case["x"], case["w"], case["bias"], case["residual"], 1, 1, case["scale"],
                    case["post_bias"], True)
    rel, mx = errors(out, ref)
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], f"{kernel}: graph rel {rel:.3e} max {mx:.3e}"


@needs_sm90
def test_first_cuda_work_of_a_new_thread(rng):
    """A thread whose first CUDA work is one of our family-90 kernels (an autograd device thread
    whose backward begins with our op, a new Python thread) has no CUDA context bound until a
    runtime call binds one; the op binds the device's primary context before it encodes its TMA
    descriptors (an encode without a context fails, and the kernel then runs on a garbage
    descriptor: an illegal instruction).  The inputs and an output-sized block of the caching
    allocator are made here, so the thread makes no CUDA call before the op's own."""
    kernel = next(k for k in SM90 if kernel_dtype(k) == torch.float16)
    case = random_case(3, 64, 64, 12, 12, 3, 3, torch.float16, "cuda", rng)
    del case["residual"]
    torch.empty(3 * 64 * 12 * 12, dtype=torch.float16, device="cuda")  # cached for the thread's output
    torch.cuda.synchronize()
    result = {}

    def first_work(_):
        try:
            torch.ops.cutlass_ops.conv2d_fused_force_kernel(kernel, 0)
            result["out"] = cutlass_ops.conv2d_fused(case["x"], case["w"], case["bias"], None, 1, 1,
                                                     case["scale"], case["post_bias"], True)
            result["kernel"] = cutlass_ops.conv2d_fused_last_kernel()
            torch.cuda.synchronize()
        finally:
            torch.ops.cutlass_ops.conv2d_fused_force_kernel("")

    run_in_threads(first_work)
    assert result["kernel"] == kernel
    ref = reference(case["x"], case["w"], case["bias"], None, 1, 1, case["scale"], case["post_bias"], True)
    rel, mx = errors(result["out"], ref)
    assert rel <= TOLERANCE[torch.float16][0] and mx <= TOLERANCE[torch.float16][1], f"rel {rel:.3e} max {mx:.3e}"
