"""FusedMLP emitter (cutlass_ops_gen.mlp_emit): tile config vs shared-memory limits, the emitted
source, and one real nvcc compile (skipped without nvcc; the full matrix of specs, archs and
dtypes is tests/mlp_compile_check.py, which CI does not run: about 5-20 s per compile)."""
import os
import re
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from cutlass_ops_gen.mlp_spec import trace_mlp  # noqa: E402
from cutlass_ops_gen.mlp_emit import (DW_ACC_BUDGET, choose_config, dw_units, emit, nvcc_command,  # noqa: E402
                                       resident_layout)

SM80, SM86, SM90 = 166912, 101376, 232448


def seq(widths, act=nn.ReLU, bias=True):
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b, bias=bias))
        if i < len(widths) - 2:
            mods.append(act())
    return nn.Sequential(*mods)


@pytest.mark.parametrize("limit, bm", [(SM90, 128), (SM80, 64), (SM86, 64)])
def test_config_fits_the_limit(limit, bm):
    cfg = choose_config(trace_mlp(seq([3, 256, 256, 1]), None), limit)
    assert cfg.resident_warps == 0  # 156 KB of weights leave no room for 4 warps' tiles
    assert cfg.bm == bm
    assert max(cfg.smem_fwd, cfg.smem_bwd) <= limit
    # the tiles hold the widest layer (padded to 16) plus 8 columns of skew, 16-byte rows
    assert cfg.sa == 256 + 8 and cfg.sa % 8 == 0 and cfg.sw_bwd % 8 == 0


def test_small_model_gets_the_big_tile_everywhere():
    cfg = choose_config(trace_mlp(seq([2, 32, 32, 3]), None), SM86, resident=False)
    assert cfg.bm == 128 and cfg.sa == 32 + 8 and cfg.resident_warps == 0


@pytest.mark.parametrize("limit, warps", [(SM90, 16), (SM80, 12), (SM86, 4)])
def test_resident_weights_where_they_fit(limit, warps):
    """The reference width-64 model: its 35 KB of weights stay in shared memory beside as many
    warps' 32-row tiles (two of 32 x 72 halves each) as fit."""
    spec = trace_mlp(seq([32, 64, 64, 64, 64, 16]), None)
    cfg = choose_config(spec, limit)
    assert cfg.resident_warps == warps and cfg.bm == 32
    layout, total = resident_layout(spec, 64)
    assert cfg.resident == layout and cfg.smem_fwd == 2 * (total + warps * 2 * 32 * 72) <= limit
    assert choose_config(spec, limit, resident=False).resident_warps == 0


@pytest.mark.parametrize("widths", [[32, 64, 64, 64, 64, 64, 16], [57, 127, 1, 84, 3], [1, 1], [2, 33, 33, 3],
                                    [64, 128, 128, 64]])
@pytest.mark.parametrize("warps", [4, 8])
def test_dw_units_cover_each_tile_once(widths, warps):
    """The fused-dW kernel's units (16-row stripe x G column tiles, unit u to warp u % warps)
    cover every 16 x 8 tile of each padded dW exactly once, within each warp's register share."""
    spec = trace_mlp(seq(widths), None)
    for l, (g, units, per_warp) in zip(spec.layers, dw_units(spec, warps)):
        mt, nt = -(-l.out_padded // 16), l.in_padded // 8
        groups = -(-nt // g)
        assert units == mt * groups and per_warp == -(-units // warps)
        covered = []
        for w in range(warps):
            for u in range(per_warp):
                unit = w + u * warps
                if unit < units:
                    m0, n0 = unit // groups * 16, unit % groups * 8 * g
                    covered += [(m0, n0 + 8 * j) for j in range(min(g, (l.in_padded - n0) // 8))]
        assert sorted(covered) == [(16 * m, 8 * n) for m in range(mt) for n in range(nt)]


def test_inplace_resident_where_one_tile_per_warp_fits():
    """The reference width-128 model: its 184 KB of weights leave room for 4 warps' single tiles on
    sm90 (not two each), so inplace=True keeps them resident (one tile per warp, each layer
    overwriting its input); by default, and where even that does not fit, they stream."""
    spec = trace_mlp(seq([32] + [128] * 6 + [16]), None)
    assert choose_config(spec, SM90).resident_warps == 0
    cfg = choose_config(spec, SM90, inplace=True)
    assert cfg.inplace and cfg.resident_warps == 4 and cfg.smem_fwd == 2 * (resident_layout(spec, 64)[1] + 4 * 32 * 136)
    assert cfg.smem_fwd <= SM90 and cfg.dw_warps == 0
    assert choose_config(spec, SM80, inplace=True).resident_warps == 0
    # wider than 128 (the A fragments in registers): never in place, though one tile per warp
    # would fit beside these 175 KB of weights
    wide = trace_mlp(seq([32, 144, 144, 144, 16]), None)
    assert resident_layout(wide, 64)[1] * 2 + 4 * 32 * 152 * 2 <= SM90
    assert choose_config(wide, SM90, inplace=True).resident_warps == 0


@pytest.mark.parametrize("limit", [SM90, SM80, SM86])
def test_fused_dw_where_the_gradients_fit_in_registers(limit):
    """The reference width-64 model gets the fused-dW backward on every arch (4 warps, 152 float32
    accumulators a thread); the width-128 one does not (its weights are not even resident)."""
    cfg = choose_config(trace_mlp(seq([32, 64, 64, 64, 64, 64, 16]), None), limit)
    assert cfg.dw_warps == 4 and cfg.smem_dw <= limit
    assert sum(g * per_warp * 4 for g, _, per_warp in cfg.dw_units) == 152 <= DW_ACC_BUDGET
    assert choose_config(trace_mlp(seq([32] + [128] * 6 + [16]), None), limit).dw_warps == 0
    assert choose_config(trace_mlp(seq([32, 64, 64, 16]), None), limit, resident=False).dw_warps == 0


@pytest.mark.parametrize("widths", [[32, 64, 64, 16], [57, 127, 1, 3], [3, 200, 1], [1, 1], [16, 130, 8]])
def test_resident_layout_covers_the_chunks(widths):
    """Each layer's tile holds what the forward (rows: column chunks of 64 output features) and
    the backward (columns: chunks of 64 input features; rows: output features padded to 16)
    read, 16-byte aligned, with the 8-column skew."""
    spec = trace_mlp(seq(widths), None)
    layout, total = resident_layout(spec, 64)
    end = 0
    for l, (off, rows, stride) in zip(spec.layers, layout):
        assert off == end and off % 8 == 0 and stride % 8 == 0
        n_pad, k_pad = l.out_padded, l.in_padded
        assert rows >= -(-n_pad // min(64, n_pad)) * min(64, n_pad) and rows >= -(-n_pad // 16) * 16
        cols = stride - 8
        assert cols >= -(-l.in_features // 16) * 16
        assert cols >= -(-k_pad // min(64, k_pad)) * min(64, k_pad)
        end = off + rows * stride
    assert end == total


def test_config_too_big():
    with pytest.raises(ValueError, match="shared memory"):
        choose_config(trace_mlp(seq([256, 256]), None), 20000)


def test_source_holds_the_model():
    spec = trace_mlp(seq([57, 127, 1, 3], act=nn.SiLU, bias=False), None)
    src, cfg = emit(spec, "bfloat16", SM90)
    assert src == emit(spec, "bfloat16", SM90)[0]           # deterministic: the cache key hashes it
    assert "typedef __nv_bfloat16 T;" in src
    for i, l in enumerate(spec.layers):
        assert f"return {l.activation.cuda};" in src and f"return {l.activation.cuda_grad};" in src
        assert re.search(rf"fwd_layer(_resident)?<T, Act{i}, {l.in_features}, {l.out_features}, false,", src)
    assert f"constexpr int L = 3, MT = {cfg.mt}, BM = {cfg.bm}" in src
    assert 'extern "C" int fmlp_fwd(' in src and 'extern "C" int fmlp_bwd(' in src


def test_bad_dtype():
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        emit(trace_mlp(seq([4, 4]), None), "float32", SM90)


NVCC = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"


@pytest.mark.skipif(not os.path.isfile(NVCC) or os.environ.get("CUTLASS_OPS_SKIP_NVCC") == "1",
                    reason="no nvcc (or CUTLASS_OPS_SKIP_NVCC=1)")
def test_nvcc_compiles_one_model(tmp_path):
    """One odd-width model, fp16, sm_80, resident and streamed weights: compiles, three kernels
    each (four resident: its weight gradients fit the fused-dW backward), no spills (~10 s)."""
    for resident in (True, False):
        src, cfg = emit(trace_mlp(seq([57, 127, 1, 3], act=nn.GELU), None), "float16", SM80, resident)
        assert (cfg.resident_warps > 0) == resident and (cfg.dw_warps > 0) == resident
        (tmp_path / "m.cu").write_text(src)
        cmd = nvcc_command(NVCC, str(tmp_path / "m.cu"), str(tmp_path / "m.so"), "80", verbose_ptxas=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        log = r.stdout + r.stderr
        assert len(re.findall(r"Compiling entry function", log)) == 3 + resident, log
        assert not re.search(r"[1-9]\d* bytes spill (stores|loads)", log), log
