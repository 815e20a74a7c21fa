"""FusedMLP's generated kernels, run unchanged on a CPU emulator of the CUDA execution model
(tests/cuda_emulator: fibers for threads, the PTX ISA's ldmatrix / mma.m16n8k16 fragment layouts,
cp.async landing at its wait, shared memory poisoned per CTA), against the op's CPU path (the same
rounding points) and float64.  No GPU needed: g++ and the CUDA headers (for cuda_fp16.h) only.

What it checks that the GPU tests check too, here in CI: every kernel's indexing, padding,
tiling, the grid-stride loops and the per-CTA / per-tile partials.  What it adds: a read of
shared memory nobody wrote (poison), a cp.async read before its wait, a missing barrier (two
schedules of the threads, shuffled by different seeds, must give bitwise the same results), a
deadlock, a write past an output (guard elements).  What it cannot check: timing, and whatever
the emulator's model of an instruction gets wrong; the emulator's own layouts are checked by
running the kernels that passed on an H100 (fwd, bwd) through it.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from _mlp_models import Act, chain, random_mlp
from _seeds import seeded
from cutlass_ops.ops.fused_mlp import _backward_math, _forward_math
from cutlass_ops_gen.mlp_spec import trace_mlp
from cutlass_ops_gen.mlp_emit import emit, partial_layout

EMU = Path(__file__).resolve().parents[1] / "cuda_emulator"
CUDA_INCLUDE = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
CXX = shutil.which(os.environ.get("CXX", "g++"))
pytestmark = pytest.mark.skipif(CXX is None or not (CUDA_INCLUDE / "cuda_fp16.h").exists(),
                                reason="needs g++ and the CUDA headers (cuda_fp16.h)")

SM90, SM80 = 232448, 166912
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
CPU_PATH_TOL = {torch.float16: 5e-4, torch.bfloat16: 2.5e-3}   # kernel vs the op's CPU path
F64_TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}            # the target bound vs float64


MODELS = {
    "relu_32_64x5_16": lambda: chain([32, 64, 64, 64, 64, 64, 16], nn.ReLU()),
    "relu_32_128x6_16": lambda: chain([32] + [128] * 6 + [16], nn.ReLU()),   # in place on sm90
    "cvt_stage1_mlp": lambda: chain([64, 256, 64], Act(lambda x: x * torch.sigmoid(1.702 * x))),  # QuickGELU
    "gelu_19_57_40_7": lambda: chain([19, 57, 40, 7], nn.GELU(), last=nn.Tanh()),
    "odd_57_127_1_84_3": lambda: chain([57, 127, 1, 84, 3], nn.SiLU(), last=nn.Sigmoid()),
    "nobias_softplus_5_24_24_2": lambda: chain([5, 24, 24, 2], nn.Softplus(), bias=False),
    "w1_1_1": lambda: chain([1, 1], None, last=nn.Tanh()),
}


def build(src: str, has_dw: bool, work: Path) -> ctypes.CDLL:
    key = hashlib.sha256((src + str(has_dw)).encode()).hexdigest()[:16]
    lib = work / f"emu_{key}.so"
    if not lib.exists():
        cu = work / f"model_{key}.cu"
        cu.write_text(src)
        cmd = [CXX, "-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-DFMLP_EMULATE",
               f"-DKERNEL_SOURCE=\"{cu}\"", f"-I{CUDA_INCLUDE}", f"-I{EMU}",
               "-include", str(EMU / "cuda_emulate_prelude.h"), "-x", "c++", str(EMU / "mlp_harness.cpp"),
               "-o", str(lib)] + (["-DHAS_BWD_DW"] if has_dw else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
    return ctypes.CDLL(str(lib))


GUARD = 64  # elements past each output, filled with a pattern the kernels must leave alone


def guarded(shape, dtype):
    """An output tensor poisoned with NaN, followed by GUARD elements of a sentinel."""
    n = 1
    for s in shape:
        n *= s
    full = torch.full((n + GUARD,), float("nan"), dtype=dtype)
    full[n:] = -12345.0
    return full[:n].view(shape), full


def guards_intact(full, n):
    return bool((full[n:] == -12345.0).all())


def ptrs(ts):
    return (ctypes.c_void_p * len(ts))(*[None if t is None else t.data_ptr() for t in ts])


def column_ptrs(buf, offsets):
    """Per layer the address of its first column in a shared (rows, stride) float32 partials
    buffer (mlp_emit.partial_layout), or null."""
    return (ctypes.c_void_p * len(offsets))(*[None if o is None else buf.data_ptr() + 4 * o for o in offsets])


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Case:
    """One model, dtype and kernel shape: the emulated kernels' outputs and the references."""

    def __init__(self, name, dtype, rows, resident, work, smem=SM90, seed=0, model=None):
        with seeded(seed):
            self.model = model = (MODELS[name]() if model is None else model).to(dtype)
        self.spec = spec = trace_mlp(model, None)
        self.src, self.cfg = emit(spec, DTYPES[dtype], smem, resident, inplace=True)
        self.lib = build(self.src, self.cfg.dw_warps > 0, work)
        self.dtype, self.M = dtype, rows
        self.L = len(spec.layers)
        lins = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.w = [l.weight.detach().contiguous() for l in lins]
        self.b = [None if l.bias is None else l.bias.detach().contiguous() for l in lins]
        g = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(rows, spec.in_features, generator=g).to(dtype)
        self.dy = torch.randn(rows, spec.out_features, generator=g).to(dtype)
        self.ref_y, self.ref_saved = _forward_math(self.x, self.w, self.b, spec, True)

    def grid(self, streamed_rows, resident_grid):
        if self.cfg.resident_warps:
            return resident_grid
        return -(-self.M // streamed_rows)

    def forward(self, save, seed=0, grid=2):
        spec, M = self.spec, self.M
        y, yfull = guarded((M, spec.out_features), self.dtype)
        zs = [guarded((M, l.out_padded), self.dtype) if spec.saves_pre_activation(i) else (None, None)
              for i, l in enumerate(spec.layers)]
        acts = [guarded((M, l.out_padded), self.dtype) for l in spec.layers[:-1]] + [(None, None)]
        rc = self.lib.emu_fwd(int(save), ctypes.c_void_p(self.x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                              ptrs(self.w), ptrs(self.b), ptrs([z for z, _ in zs]), ptrs([a for a, _ in acts]),
                              ctypes.c_longlong(M), self.grid(self.cfg.bm, grid), seed)
        assert rc == 0, "deadlock"
        assert guards_intact(yfull, y.numel())
        if save:
            for t, full in zs + acts:
                assert t is None or guards_intact(full, t.numel())
        return y, [z for z, _ in zs], [a for a, _ in acts[:-1]]

    def saved_for_backward(self):
        """What the CUDA op passes the backward kernels: the forward's saved tensors (here the CPU
        path's, the same values up to rounding: the backward is checked on its own)."""
        L = self.L
        zs = [self.ref_saved[i] if self.spec.saves_pre_activation(i) else self.ref_saved[L + i] for i in range(L)]
        acts = [self.ref_saved[L + i] for i in range(L - 1)]
        return zs, acts

    def tiles(self):
        return -(-self.M // (16 * self.cfg.mt))

    def backward(self, seed=0, grid=2):
        spec, M = self.spec, self.M
        zs, _ = self.saved_for_backward()
        dx, dxfull = guarded((M, spec.in_features), self.dtype)
        dzs = [guarded((M, l.out_padded), self.dtype) for l in spec.layers]
        db_offsets, db_stride, _, _ = partial_layout(spec)
        dbs = guarded((self.tiles(), db_stride), torch.float32)
        rc = self.lib.emu_bwd(ctypes.c_void_p(self.dy.data_ptr()), ctypes.c_void_p(dx.data_ptr()), ptrs(zs),
                              ptrs(self.w), ptrs([d for d, _ in dzs]), column_ptrs(dbs[0], db_offsets),
                              ctypes.c_longlong(M), self.grid(self.cfg.bm, grid), seed)
        assert rc == 0, "deadlock"
        for t, full in [(dx, dxfull)] + dzs + [dbs]:
            assert t is None or guards_intact(full, t.numel())
        return dx, [d for d, _ in dzs], self.bias_sums(dbs[0], db_offsets)

    def bias_sums(self, buf, offsets):
        # a layer's columns left unwritten keep the NaN poison, which the comparisons catch
        return [None if o is None else buf[:, o:o + l.out_features].sum(0) for o, l in zip(offsets, self.spec.layers)]

    def backward_dw(self, seed=0, grid=2):
        spec, M = self.spec, self.M
        zs, acts = self.saved_for_backward()
        dx, dxfull = guarded((M, spec.in_features), self.dtype)
        db_offsets, db_stride, dw_offsets, dw_stride = partial_layout(spec)
        dws = guarded((grid, dw_stride), torch.float32)
        dbs = guarded((self.tiles(), db_stride), torch.float32)
        rc = self.lib.emu_bwd_dw(ctypes.c_void_p(self.dy.data_ptr()), ctypes.c_void_p(dx.data_ptr()),
                                 ctypes.c_void_p(self.x.data_ptr()), ptrs(zs), ptrs(acts + [None]), ptrs(self.w),
                                 column_ptrs(dws[0], dw_offsets), column_ptrs(dbs[0], db_offsets),
                                 ctypes.c_longlong(M), grid, seed)
        assert rc == 0, "deadlock"
        for t, full in [(dx, dxfull), dws, dbs]:
            assert guards_intact(full, t.numel())
        dw = [dws[0][:, o:o + l.out_features * l.in_features].sum(0).view(l.out_features, l.in_features)
              for o, l in zip(dw_offsets, spec.layers)]
        return dx, dw, self.bias_sums(dbs[0], db_offsets)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("mlp_emulator")


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("resident", [True, False])
def test_forward_and_backward_kernels(name, dtype, resident, work):
    """fwd_kernel<false/true> and bwd_kernel (the kernels that ran on an H100) at 300 rows: the
    same numbers as the op's CPU path, the float64 bound, untouched guards, schedule-independent."""
    case = Case(name, dtype, 300, resident, work)
    assert (case.cfg.resident_warps > 0) == resident
    assert case.cfg.inplace == (resident and name == "relu_32_128x6_16")
    y, _, _ = case.forward(False, seed=0)
    y2, zs, acts = case.forward(True, seed=7)
    assert torch.equal(y, y2)  # no race: another schedule, the same bits
    assert rel(y, case.ref_y) <= CPU_PATH_TOL[dtype], rel(y, case.ref_y)
    L = case.L
    for i in range(L):
        if zs[i] is not None:
            assert rel(zs[i], case.ref_saved[i]) <= CPU_PATH_TOL[dtype], ("z", i)
    for i in range(L - 1):
        assert rel(acts[i], case.ref_saved[L + i]) <= CPU_PATH_TOL[dtype], ("a", i)
    model64 = MODELS[name]().double()
    model64.load_state_dict({k: v.double() for k, v in case.model.state_dict().items()})
    with torch.no_grad():
        assert rel(y, model64(case.x.double())) <= F64_TOL[dtype]

    dx, dzs, db = case.backward(seed=0)
    dx2, _, _ = case.backward(seed=3)
    assert torch.equal(dx, dx2)
    ref_dx, ref_dzs, ref_db, _ = _backward_math(case.dy, case.x, case.w, case.ref_saved, case.spec, True)
    assert rel(dx, ref_dx) <= CPU_PATH_TOL[dtype], rel(dx, ref_dx)
    for i, l in enumerate(case.spec.layers):
        assert rel(dzs[i], ref_dzs[i]) <= CPU_PATH_TOL[dtype], ("dz", i)
        if l.bias:
            assert rel(db[i], ref_db[i]) <= CPU_PATH_TOL[dtype], ("db", i, rel(db[i], ref_db[i]))


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows, grid", [(300, 2), (1, 1), (513, 3)])
def test_fused_weight_gradient_kernel(name, dtype, rows, grid, work):
    """bwd_dw_kernel (not yet run on a GPU): dx, db and the weight gradients from its per-CTA
    partials against the CPU path's dz^T a_prev in float32, with CTAs that loop over several
    tiles (grid < tiles) and rows that leave warps empty; schedule-independent bits."""
    case = Case(name, dtype, rows, True, work, seed=rows)
    if not case.cfg.dw_warps:
        pytest.skip(f"{name}: its weight gradients do not fit the fused kernel")
    dx, dws, db = case.backward_dw(seed=0, grid=grid)
    dx2, dws2, db2 = case.backward_dw(seed=5, grid=grid)
    assert torch.equal(dx, dx2) and all(torch.equal(a, b) for a, b in zip(dws, dws2))
    ref_dx, _, ref_db, ref_dws = _backward_math(case.dy, case.x, case.w, case.ref_saved, case.spec, True,
                                                fused_dw=True)
    assert rel(dx, ref_dx) <= CPU_PATH_TOL[dtype], rel(dx, ref_dx)
    for i, l in enumerate(case.spec.layers):
        assert rel(dws[i], ref_dws[i]) <= CPU_PATH_TOL[dtype], ("dW", i, rel(dws[i], ref_dws[i]))
        if l.bias:
            assert rel(db[i], ref_db[i]) <= CPU_PATH_TOL[dtype], ("db", i)


def test_the_emulator_catches_a_missing_barrier(work):
    """Negative control: bwd_dw_kernel with its barrier before the weight-gradient MMAs removed
    reads other warps' tiles before they are written: its results depend on the schedule (or
    show the poison)."""
    case = Case("relu_32_64x5_16", torch.float16, 300, True, work)
    marker = "    fmlp::cp_wait<0>();\n    __syncthreads();\n"
    assert marker in case.src
    case.lib = build(case.src.replace(marker, "    fmlp::cp_wait<0>();\n", 1), True, work)
    _, dws, _ = case.backward_dw(seed=0)
    _, dws2, _ = case.backward_dw(seed=5)
    _, _, _, ref_dws = _backward_math(case.dy, case.x, case.w, case.ref_saved, case.spec, True, fused_dw=True)
    differs = any(not torch.equal(a, b) for a, b in zip(dws, dws2))
    wrong = any(not (rel(a, r) <= CPU_PATH_TOL[torch.float16]) for a, r in zip(dws, ref_dws))
    assert differs or wrong


RANDOM_MODELS = int(os.environ.get("CUTLASS_OPS_EMU_RANDOM_MODELS", "16"))


@pytest.mark.parametrize("seed", range(RANDOM_MODELS))
def test_random_models(seed, work):
    """The random models (_mlp_models: depth 1-8, widths 1-256, activations from the list
    and compositions; the GPU runs 200 in test_fused_mlp.py), each in one dtype, on a shared-memory
    limit drawn from sm90/sm80/sm86 (so resident, in-place and streamed shapes all come up): the
    forward with saves, the backward and, where the model has it, the fused weight-gradient
    backward, against the op's CPU path (the same rounding points).  CI runs the first 16;
    CUTLASS_OPS_EMU_RANDOM_MODELS=200 runs all (README: FusedMLP)."""
    import random
    name, model = random_mlp(seed)
    r = random.Random(1000 + seed)
    dtype = (torch.float16, torch.bfloat16)[seed % 2]
    case = Case(name, dtype, r.randint(1, 300), True, work, smem=r.choice([SM90, SM80, 101376]), seed=seed,
                model=model)
    tol = 2 * CPU_PATH_TOL[dtype]
    y, zs, acts = case.forward(True, seed=seed + 1)
    assert rel(y, case.ref_y) <= tol, (name, case.cfg, rel(y, case.ref_y))
    dx, dzs, db = case.backward(seed=seed + 2)
    ref_dx, ref_dzs, ref_db, ref_dws = _backward_math(case.dy, case.x, case.w, case.ref_saved, case.spec, True,
                                                      fused_dw=True)
    assert rel(dx, ref_dx) <= tol, (name, "dx", rel(dx, ref_dx))
    for i, l in enumerate(case.spec.layers):
        if l.bias:
            assert rel(db[i], ref_db[i]) <= tol, (name, "db", i, rel(db[i], ref_db[i]))
    if case.cfg.dw_warps:
        grid = r.randint(1, 3)
        dx2, dws, db2 = case.backward_dw(seed=seed + 3, grid=grid)
        assert torch.equal(dx2, dx) or rel(dx2, ref_dx) <= tol
        for i, l in enumerate(case.spec.layers):
            assert rel(dws[i], ref_dws[i]) <= tol, (name, "dW", i, rel(dws[i], ref_dws[i]))
