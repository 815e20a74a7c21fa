"""Unit tests of the build-time generator (run by ctest; CPU only, no compiler needed)."""
import re
import textwrap
import warnings
from pathlib import Path

import pytest

from cutlass_ops_gen.__main__ import main as generate, parse_archs
from cutlass_ops_gen.emitter import emit_instance, kernel_name
from cutlass_ops_gen.manifest import InstanceKey, arch_families, instance_keys
from cutlass_ops_gen.tiles import Tile, default_tiles, select_tiles

KEY = InstanceKey("conv2d_fused", 80, "f16", 8)

HEADER = ("Problem,Provider,OperationKind,Operation,Disposition,Status,conv_kind,n,h,w,c,k,r,s,"
          "p,q,cta_m,cta_n,cta_k,stages,warps_m,warps_n,warps_k,Runtime\n")


def _row(i, name, k, tile, stages, warps, runtime, disposition="passed"):
    m, n, kk = tile
    wm, wn, wk = warps
    return (f"{i},CUTLASS,conv2d,{name},{disposition},success,fprop,128,16,16,64,{k},3,3,16,16,"
            f"{m},{n},{kk},{stages},{wm},{wn},{wk},{runtime}\n")


def _profile(tmp_path, text, gpu="h200"):
    d = tmp_path / gpu
    d.mkdir(parents=True, exist_ok=True)
    (d / "sm80.csv").write_text(text)
    return tmp_path


def test_arch_families():
    assert arch_families([80, 86, 90]) == [80]
    assert arch_families([70, 90]) == [70, 80]
    with pytest.raises(ValueError):
        arch_families([60])


def test_parse_archs_accepts_cmake_and_torch_spellings():
    assert parse_archs("80;86;90") == [80, 86, 90]
    assert parse_archs("sm_80,9.0") == [80, 90]


def test_instance_keys_ci_is_small_and_volta_is_f16_align8():
    ci = instance_keys([80], "ci")
    assert {(k.dtype, k.alignment) for k in ci} == {("f16", 8), ("f16", 1), ("bf16", 8), ("bf16", 1)}
    volta = [k for k in instance_keys([70, 80], "all") if k.family == 70]
    assert volta == [InstanceKey("conv2d_fused", 70, "f16", 8)]


def test_names_are_unique_and_carry_op_dtype_alignment():
    names = [kernel_name(k, t) for k in instance_keys([70, 80], "all") for t in default_tiles(k)]
    assert len(names) == len(set(names))
    assert kernel_name(KEY, default_tiles(KEY)[1]) == "cutlass_ops_conv2d_fused_f16_sm80_128x64x32_4s_o_align8"


def test_emitted_instance_uses_broadcast_kernel_and_our_epilogue():
    tile = Tile((128, 128, 32), (2, 2, 1), 3)
    inst, text = emit_instance(InstanceKey("conv2d_fused", 80, "bf16", 4), tile, "default")
    assert "DefaultConv2dFpropWithBroadcast<" in text
    assert "cutlass_ops::epilogue::FusedConvEpilogue<" in text
    assert "cutlass::bfloat16_t" in text and "cutlass::arch::Sm80" in text
    assert "GemmShape<64, 64, 32 >" in text  # warp shape = tile / warp count
    assert re.search(r"IteratorAlgorithm::kOptimized,\s+cutlass::conv::StrideSupport::kStrided,\s+4,\s+4", text)
    assert f"cutlass::Status {inst.name}(Conv2dFusedArgs const& args" in text


def test_volta_instance_uses_884():
    key = InstanceKey("conv2d_fused", 70, "f16", 8)
    _, text = emit_instance(key, default_tiles(key)[0], "default")
    assert "GemmShape<8, 8, 4>" in text and "cutlass::arch::Sm70" in text


def test_generator_writes_instances_table_and_cmake_list(tmp_path):
    out = tmp_path / "gen"
    assert generate(["--archs", "80", "--kernels", "ci", "--out", str(out)]) == 0
    sources = sorted(p.name for p in out.glob("*.cu"))
    assert len(sources) == 4  # f16/bf16 x align 8/1, one tile each
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    assert "kNumKernels = 4" in table
    for s in sources:
        assert f"&{s[:-3]}}}" in table
    cmake = (out / "instances.cmake").read_text()
    assert "CUTLASS_OPS_INSTANCES_SM80" in cmake and all(s in cmake for s in sources)
    # Re-running leaves files untouched (no needless recompiles).
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    generate(["--archs", "80", "--kernels", "ci", "--out", str(out)])
    assert mtimes == {p: p.stat().st_mtime_ns for p in out.iterdir()}


def test_defaults_without_profiles(tmp_path):
    tiles, origin = select_tiles(KEY, tmp_path)
    assert origin == "default" and tiles == default_tiles(KEY)
    assert tiles[-1].max_out_channels == 0  # a catch-all tile always exists


def test_profile_winners_per_output_channel_count(tmp_path):
    f16 = "cutlass_ops_conv2d_fused_f16_sm80_{}_align8"
    text = HEADER + "".join([
        _row(1, f16.format("a"), 64, (128, 64, 32), 4, (2, 2, 1), 0.020),
        _row(2, f16.format("b"), 64, (64, 64, 32), 5, (2, 2, 1), 0.015),   # k=64 winner
        _row(3, f16.format("c"), 256, (128, 128, 32), 3, (2, 2, 1), 0.050),  # k=256 winner
        _row(4, f16.format("d"), 256, (64, 64, 32), 5, (2, 2, 1), 0.060),
        _row(5, f16.format("e"), 256, (32, 32, 32), 2, (1, 1, 1), 0.001, disposition="failed"),
        # Other dtype and alignment: ignored for this key.
        _row(6, "cutlass_ops_conv2d_fused_bf16_sm80_x_align8", 64, (32, 32, 32), 2, (1, 1, 1), 0.001),
        _row(7, "cutlass_ops_conv2d_fused_f16_sm80_x_align4", 64, (32, 32, 32), 2, (1, 1, 1), 0.001),
    ])
    tiles, origin = select_tiles(KEY, _profile(tmp_path, text))
    assert origin == "profile h200"
    assert tiles == [Tile((64, 64, 32), (2, 2, 1), 5, max_out_channels=64),
                     Tile((128, 128, 32), (2, 2, 1), 3, max_out_channels=0)]


def test_profile_same_winner_merges(tmp_path):
    name = "cutlass_ops_conv2d_fused_f16_sm80_t_align8"
    text = HEADER + _row(1, name, 64, (128, 128, 32), 3, (2, 2, 1), 0.01) + \
        _row(2, name, 128, (128, 128, 32), 3, (2, 2, 1), 0.02)
    tiles, _ = select_tiles(KEY, _profile(tmp_path, text))
    assert tiles == [Tile((128, 128, 32), (2, 2, 1), 3)]


def test_malformed_profile_warns_and_falls_back(tmp_path):
    _profile(tmp_path, "Problem,Operation,Runtime\n1,x,0.1\n")
    with pytest.warns(UserWarning, match="missing columns"):
        tiles, origin = select_tiles(KEY, tmp_path)
    assert origin == "default" and tiles == default_tiles(KEY)


def test_profile_with_bad_number_warns(tmp_path):
    text = HEADER + _row(1, "cutlass_ops_conv2d_fused_f16_sm80_t_align8", 64, (128, 128, 32), 3,
                         (2, 2, 1), "fast")
    with pytest.warns(UserWarning, match="bad Runtime"):
        _, origin = select_tiles(KEY, _profile(tmp_path, text))
    assert origin == "default"
