"""space_to_depth_conv's sm80 kernel (kernels/space_to_depth_conv/space_to_depth_conv_fast.cuh)
on the CPU emulator (tests/cuda_emulator): the three load modes (16-byte and 8-byte cp.async,
element loads for any strides), C = 1..16, K = 32/64/128, fp16/bf16, a partial last tile, more
tiles than warps (the ring wraps) and fewer, against float64; two fiber schedules bitwise
equal; nothing written past the output."""
import ctypes

import pytest
import torch

import _emulator
from _helpers import TOLERANCE, errors

emulator = pytest.mark.skipif(not _emulator.AVAILABLE, reason=_emulator.MISSING)
SCALAR, VEC8, VEC16 = 0, 1, 2
GUARD = 64


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return _emulator.build("stem_harness.cpp", tmp_path_factory.mktemp("stem_emu") / "stem_emu.so")


def reference(x, w, post, relu):
    n, c, h, wd = x.shape
    s2d = x.double().view(n, c, h // 4, 4, wd // 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(-1, 16 * c)
    y = s2d @ w.double().reshape(w.shape[0], -1).t()
    return (torch.relu(y) if relu else y) + post.double()  # (N*P*Q, K): NHWC rows


def run(lib, x, w, post, relu, warps, grid, mode, seed=0):
    n, c, h, wd = x.shape
    k = w.shape[0]
    m = n * (h // 4) * (wd // 4)
    buf = torch.full((m * k + GUARD,), float("nan"), dtype=x.dtype)
    buf[m * k:] = -777.0
    wc = w.contiguous()
    rc = lib.emu_stem(int(x.dtype == torch.bfloat16), n, c, h, wd, k,
                      *(ctypes.c_int64(s) for s in x.stride()), ctypes.c_void_p(x.data_ptr()),
                      ctypes.c_void_p(wc.data_ptr()), ctypes.c_void_p(buf.data_ptr()),
                      ctypes.c_void_p(post.data_ptr()), int(relu), warps, ctypes.c_uint(grid), mode,
                      ctypes.c_uint(seed))
    assert rc == 0, "deadlock" if rc == 1 else f"rc {rc}"
    assert (buf[m * k:] == -777.0).all(), "wrote past the output"
    return buf[:m * k].view(m, k)


def inputs(n, c, h, w, k, dtype, seed, layout="nchw"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g, dtype=torch.float64).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "sliced":
        x = torch.randn(2 * n, c, h, w + 4, generator=g, dtype=torch.float64).to(dtype)[::2, :, :, 4:]
    wt = (torch.randn(k, 16 * c, 1, 1, generator=g, dtype=torch.float64) / (16 * c) ** 0.5).to(dtype)
    post = torch.randn((1,), generator=g, dtype=torch.float64).float()
    return x, wt, post


# (n, c, h, w, k, layout, mode, warps, grid)
CASES = [
    (3, 3, 64, 64, 64, "nchw", VEC16, 8, 2),    # the stem, ring wraps many times
    (1, 1, 64, 64, 64, "nchw", VEC16, 4, 3),
    (2, 11, 16, 16, 64, "nchw", VEC16, 2, 1),
    (7, 3, 12, 24, 64, "nchw", VEC16, 3, 2),     # partial last tile (M = 126)
    (7, 3, 12, 20, 32, "nchw", VEC8, 3, 2),      # odd Q: 8-byte copies, partial tile
    (2, 16, 8, 8, 128, "nchw", VEC16, 2, 1),
    (3, 2, 16, 4, 32, "nchw", VEC8, 1, 1),
    (1, 7, 24, 20, 64, "nchw", VEC8, 8, 1),      # more warps than tiles
    (3, 3, 16, 16, 64, "channels_last", SCALAR, 2, 2),
    (2, 5, 16, 16, 128, "sliced", VEC8, 2, 2),   # sliced rows: 8-byte aligned, not 16
    (2, 5, 16, 16, 32, "sliced", SCALAR, 2, 1),
    (3, 3, 64, 64, 64, "nchw", SCALAR, 8, 1),
]


@emulator
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_matches_float64(lib, dtype, case):
    n, c, h, w, k, layout, mode, warps, grid = case
    x, wt, post = inputs(n, c, h, w, k, dtype, hash(case) % 2**31, layout)
    relu = c % 2 == 1
    y = run(lib, x, wt, post, relu, warps, grid, mode)
    rel, mx = errors(y, reference(x, wt, post, relu))
    assert rel <= TOLERANCE[dtype][0] and mx <= TOLERANCE[dtype][1], (rel, mx)
    if mode != SCALAR or c > 3:
        y2 = run(lib, x, wt, post, relu, warps, grid, mode, seed=7)
        assert torch.equal(y.view(torch.int16), y2.view(torch.int16))
