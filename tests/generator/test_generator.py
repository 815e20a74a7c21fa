"""Unit tests of the build-time generator (run by ctest; CPU only, no compiler needed)."""
import re

import pytest

from cutlass_ops_gen.__main__ import main as generate, parse_archs
from cutlass_ops_gen.emitter import dgrad_variants, emit_instance, kernel_name
from cutlass_ops_gen.manifest import InstanceKey, arch_families, instance_keys
from cutlass_ops_gen.tiles import (SM90_CI_TILES, SM90_PERSISTENT_TILES, SM90_STOCK_TILES, SM90_TILES, Problem, Sm90Tile, Tile, ci_tiles,
                                   default_tiles, select_tiles)

KEY = InstanceKey("conv2d_fused", 80, "f16", 8)

HEADER = ("Problem,Provider,OperationKind,Operation,Disposition,Status,conv_kind,n,h,w,c,k,r,s,"
          "p,q,pad_h,pad_w,stride_h,stride_w,Activation,cta_m,cta_n,cta_k,stages,warps_m,warps_n,"
          "warps_k,Runtime\n")


def _row(i, name, n, k, tile, stages, warps, runtime, disposition="passed", c=64, hw=16, stride=1,
         activation="f16:nhwc"):
    m, nn, kk = tile
    wm, wn, wk = warps
    p = hw // stride
    return (f"{i},cutlass_ops,conv2d,{name},{disposition},success,fprop,{n},{hw},{hw},{c},{k},3,3,"
            f"{p},{p},1,1,{stride},{stride},{activation},{m},{nn},{kk},{stages},{wm},{wn},{wk},{runtime}\n")


def _profile(tmp_path, text, gpu="h200"):
    d = tmp_path / gpu
    d.mkdir(parents=True, exist_ok=True)
    (d / "sm80.csv").write_text(text)
    return tmp_path


def test_arch_families():
    assert arch_families([80, 86]) == [80]
    assert arch_families([80, 86, 90]) == [80, 90]  # sm90 runs family 80 too
    assert arch_families([70, 90]) == [70, 80, 90]
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
    names = [kernel_name(k, t, v) for k in instance_keys([70, 80, 90], "all") for t in default_tiles(k)
             for v in dgrad_variants(k)]
    assert len(names) == len(set(names))
    assert kernel_name(KEY, default_tiles(KEY)[1]) == "cutlass_ops_conv2d_fused_f16_sm80_128x64x32_4s_2x2w_o_align8"


def test_emitted_instance_uses_broadcast_kernel_and_our_epilogue():
    tile = Tile((128, 128, 32), (2, 2, 1), 3)
    inst, text = emit_instance(InstanceKey("conv2d_fused", 80, "bf16", 4), tile, "default")
    assert "DefaultConv2dFpropWithBroadcast<" in text
    assert "cutlass_ops::epilogue::FusedConvEpilogue<" in text
    assert "cutlass::bfloat16_t" in text and "cutlass::arch::Sm80" in text
    assert "GemmShape<64, 64, 32 >" in text  # warp shape = tile / warp count
    assert re.search(r"IteratorAlgorithm::kOptimized,\s+cutlass::conv::StrideSupport::kStrided,\s+4,\s+4", text)
    assert f"cutlass::Status {inst.name}(Conv2dFusedArgs const& args" in text


def test_backward_instances_use_stock_kernels():
    key = InstanceKey("conv2d_dgrad", 80, "f16", 8)
    tile = default_tiles(key)[0]
    unity, text_unity = emit_instance(key, tile, "default", strided_dgrad=False)
    strided, text_strided = emit_instance(key, tile, "default", strided_dgrad=True)
    assert unity.name.endswith("_unity_align8") and strided.name.endswith("_strided_align8")
    for text in (text_unity, text_strided):
        assert "DefaultConv2dDgrad<" in text and "WithBroadcast" not in text
        assert "cutlass::epilogue::thread::LinearCombination<" in text
        assert "(Conv2dBackwardArgs const& args, cudaStream_t stream, bool query)" in text
    assert "StrideSupport::kUnity" in text_unity and "StridedDgradIdentityThreadblockSwizzle" not in text_unity
    assert "StrideSupport::kStrided" in text_strided and "StridedDgradIdentityThreadblockSwizzle<1>" in text_strided
    wkey = InstanceKey("conv2d_wgrad", 80, "bf16", 8)
    _, text = emit_instance(wkey, default_tiles(wkey)[0], "default")
    # float32 output, 4 per 128-bit access: dw is not rounded to 16 bits
    assert "DefaultConv2dWgrad<" in text and re.search(r"LinearCombination<\s+float,\s+4,", text)


def test_backward_families_are_sm80_align8_and_ignore_fprop_rows(tmp_path):
    keys = [k for k in instance_keys([70, 80], "all") if k.op != "conv2d_fused"]
    assert {(k.op, k.family, k.alignment) for k in keys} == {("conv2d_dgrad", 80, 8), ("conv2d_wgrad", 80, 8)}
    text = HEADER + _row(1, "cutlass_tensorop_h16816fprop_optimized_128x128_32x3_nhwc_align8", 8, 128,
                         (128, 128, 32), 3, (2, 2, 1), 0.05, c=128, hw=8)
    key = InstanceKey("conv2d_wgrad", 80, "f16", 8)
    assert select_tiles(key, _profile(tmp_path, text)) == (default_tiles(key), [], "default")


def _backward_row(i, kind, name, n, tile, runtime, split=1, warps=(2, 2, 1)):
    row = _row(i, name, n, 64, tile, 4, warps, runtime).replace(",fprop,", f",{kind},")
    mode = "parallel" if split > 1 else "serial"
    return row.rstrip("\n") + f",{mode},{split}\n"


def test_backward_rules_pick_the_fastest_cudnn_included(tmp_path):
    header = HEADER.rstrip("\n") + ",split_k_mode,split_k_slices\n"
    dgrad = "cutlass_ops_conv2d_dgrad_f16_sm80_64x256x32_4s_1x4w_o_strided_align8"
    wgrad = "cutlass_ops_conv2d_wgrad_f16_sm80_64x64x64_4s_2x2w_o_align8"
    rows = [
        _backward_row(1, "dgrad", dgrad, 512, (64, 256, 32), 0.030, warps=(1, 4, 1)),
        _backward_row(2, "dgrad", "cudnn", 512, (0, 0, 0), 0.040),           # ours wins at N=512
        _backward_row(3, "dgrad", "cudnn", 2048, (0, 0, 0), 0.100),          # cuDNN wins at N=2048
        _backward_row(4, "dgrad", dgrad, 2048, (64, 256, 32), 0.120, warps=(1, 4, 1)),
        _backward_row(5, "wgrad", wgrad, 512, (64, 64, 64), 0.020, split=32),  # parallel split-K kept
        _backward_row(6, "wgrad", wgrad, 512, (64, 64, 64), 0.050, split=1),
    ]
    _profile(tmp_path / "profiles", header + "".join(rows))
    key = InstanceKey("conv2d_dgrad", 80, "f16", 8)
    tiles, rules, _ = select_tiles(key, tmp_path / "profiles")
    assert Tile((64, 256, 32), (1, 4, 1), 4) in tiles
    assert [(r.problem.gemm_m, r.tile is None, r.strided_dgrad) for r in rules] == [
        (512 * 256, False, True), (2048 * 256, True, None)]
    wkey = InstanceKey("conv2d_wgrad", 80, "f16", 8)
    assert [r.split_k for r in select_tiles(wkey, tmp_path / "profiles")[1]] == [32]
    out = tmp_path / "gen"
    generate(["--archs", "80", "--kernels", "all", "--profiles", str(tmp_path / "profiles"), "--out", str(out)])
    table = (out / "conv2d_backward_dispatch_table.cpp").read_text()
    names = re.findall(r'\{"(cutlass_ops_[^"]+)"', table)
    ours = re.search(r"\{ConvKind::kDgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, (\d+), 1, 80, [0-9.e-]+\}", table)
    assert ours and names[int(ours.group(1))] == dgrad
    assert re.search(r"\{ConvKind::kDgrad, DType::kF16, 64, 64, 3, 3, 1, 524288LL, -1, 1, 80, [0-9.e-]+\},  // cuDNN", table)
    assert re.search(r"\{ConvKind::kWgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, \d+, 32, 80, [0-9.e-]+\}", table)
    # bf16 borrows the f16 winners; the fused table has no backward rules
    assert "kNumProfileRules = 6" in table
    assert "kNumProfileRules = 0" in (out / "conv2d_fused_dispatch_table.cpp").read_text()


def test_volta_instance_uses_884():
    key = InstanceKey("conv2d_fused", 70, "f16", 8)
    _, text = emit_instance(key, default_tiles(key)[0], "default")
    assert "GemmShape<8, 8, 4>" in text and "cutlass::arch::Sm70" in text


def test_generator_writes_instances_table_and_cmake_list(tmp_path):
    out = tmp_path / "gen"
    assert generate(["--archs", "80", "--kernels", "ci", "--out", str(out)]) == 0
    sources = sorted(p.name for p in out.glob("*.cu") if "_b2b_" not in p.name)  # B2B: test_b2b.py
    # fprop: f16/bf16 x align 8/1; dgrad: f16/bf16 x unity/strided; wgrad: f16/bf16; one tile each
    assert len(sources) == 10
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    backward = (out / "conv2d_backward_dispatch_table.cpp").read_text()
    assert "kNumKernels = 4" in table and "kNumKernels = 6" in backward
    for s in sources:
        assert f"&{s[:-3]}}}" in (table if "_fused_" in s else backward)
    assert backward.count('", ConvKind::kDgrad') == 4 and backward.count('", ConvKind::kWgrad') == 2
    cmake = (out / "instances.cmake").read_text()
    assert "CUTLASS_OPS_GENERATED_CONV2D_FUSED_SM80" in cmake and all(s in cmake for s in sources)
    # Re-running leaves files untouched (no needless recompiles).
    mtimes = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    generate(["--archs", "80", "--kernels", "ci", "--out", str(out)])
    assert mtimes == {p: p.stat().st_mtime_ns for p in out.iterdir()}


def test_defaults_without_profiles(tmp_path):
    tiles, rules, origin = select_tiles(KEY, tmp_path)
    assert origin == "default" and tiles == default_tiles(KEY) and rules == []


F16 = "cutlass_ops_conv2d_fused_f16_sm80_{}_align8"


def test_profile_winner_per_problem_and_defaults_kept(tmp_path):
    small, big = Tile((64, 64, 32), (2, 2, 1), 6), Tile((256, 64, 32), (4, 1, 1), 4)
    text = "# gpu: test\n" + HEADER + "".join([
        _row(1, F16.format("a"), 1, 64, (128, 64, 32), 4, (2, 2, 1), 0.020),
        _row(2, F16.format("b"), 1, 64, (64, 64, 32), 6, (2, 2, 1), 0.015),     # N=1 winner
        _row(3, F16.format("c"), 128, 64, (256, 64, 32), 4, (4, 1, 1), 0.010),  # N=128 winner
        _row(4, F16.format("d"), 128, 64, (64, 64, 32), 6, (2, 2, 1), 0.012),
        _row(5, F16.format("e"), 128, 64, (32, 32, 32), 2, (1, 1, 1), 0.001, disposition="incorrect"),
        # Other dtype, alignment or op: not this key's.
        _row(6, "cutlass_ops_conv2d_fused_bf16_sm80_x_align8", 1, 64, (32, 32, 32), 2, (1, 1, 1), 0.001),
        _row(7, "cutlass_ops_conv2d_fused_f16_sm80_x_align4", 1, 64, (32, 32, 32), 2, (1, 1, 1), 0.001),
    ])
    tiles, rules, origin = select_tiles(KEY, _profile(tmp_path, text))
    assert origin == "default + profile h200"
    assert tiles == default_tiles(KEY) + [small, big]  # defaults stay: shapes no rule covers
    assert [(r.problem, r.tile) for r in rules] == [
        (Problem(64, 64, 3, 3, 1, 1 * 16 * 16), small), (Problem(64, 64, 3, 3, 1, 128 * 16 * 16), big)]


def test_bf16_borrows_f16_winners_and_cutlass_profiler_rows_count(tmp_path):
    # A real cutlass_profiler row: its own kernel name, dtype from the Activation column.
    text = HEADER + _row(1, "cutlass_tensorop_h16816fprop_optimized_128x128_32x3_nhwc_align8", 8, 128,
                         (128, 128, 32), 3, (2, 2, 1), 0.05, c=128, hw=8)
    key = InstanceKey("conv2d_fused", 80, "bf16", 8)
    tiles, rules, _ = select_tiles(key, _profile(tmp_path, text))
    assert [(r.problem, r.tile) for r in rules] == [
        (Problem(128, 128, 3, 3, 1, 8 * 8 * 8), Tile((128, 128, 32), (2, 2, 1), 3))]


def test_rules_reach_the_dispatch_table(tmp_path):
    text = HEADER + _row(1, F16.format("a"), 128, 64, (256, 64, 32), 4, (4, 1, 1), 0.01)
    _profile(tmp_path / "profiles", text)
    out = tmp_path / "gen"
    generate(["--archs", "80", "--kernels", "all", "--profiles", str(tmp_path / "profiles"), "--out", str(out)])
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    names = re.findall(r'\{"(cutlass_ops_[^"]+)"', table)
    rule = re.search(r"\{80, DType::kF16, 8, 64, 64, 3, 3, 1, 32768LL, (\d+), 1, 0\.01\}", table)
    assert rule and names[int(rule.group(1))] == "cutlass_ops_conv2d_fused_f16_sm80_256x64x32_4s_4x1w_o_align8"
    assert "kNumProfileRules = 2" in table  # the f16 rule, and bf16 borrowing it


def test_split_k_winner_is_kept_and_parallel_rows_skipped(tmp_path):
    header = HEADER.rstrip("\n") + ",split_k_mode,split_k_slices\n"
    tile = (64, 64, 32)
    rows = [_row(1, F16.format("a"), 1, 512, tile, 6, (2, 2, 1), 0.020, c=512, hw=2).rstrip("\n") + ",serial,1\n",
            _row(2, F16.format("a"), 1, 512, tile, 6, (2, 2, 1), 0.008, c=512, hw=2).rstrip("\n") + ",serial,4\n",
            _row(3, F16.format("a"), 1, 512, tile, 6, (2, 2, 1), 0.001, c=512, hw=2).rstrip("\n") + ",parallel,8\n"]
    _, rules, _ = select_tiles(KEY, _profile(tmp_path, header + "".join(rows)))
    assert [(r.tile.threadblock, r.split_k, r.runtime_ms) for r in rules] == [(tile, 4, 0.008)]
    out = tmp_path / "gen"
    generate(["--archs", "80", "--kernels", "all", "--profiles", str(tmp_path), "--out", str(out)])
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    assert re.search(r"\{80, DType::kF16, 8, 512, 512, 3, 3, 1, 4LL, \d+, 4, 0\.008\}", table)


def test_malformed_profile_warns_and_falls_back(tmp_path):
    _profile(tmp_path, "Problem,Operation,Runtime\n1,x,0.1\n")
    with pytest.warns(UserWarning, match="missing columns"):
        tiles, rules, origin = select_tiles(KEY, tmp_path)
    assert origin == "default" and tiles == default_tiles(KEY) and rules == []


def test_profile_with_bad_number_warns(tmp_path):
    text = HEADER + _row(1, F16.format("t"), 1, 64, (128, 128, 32), 3, (2, 2, 1), "fast")
    with pytest.warns(UserWarning, match="bad number"):
        _, rules, origin = select_tiles(KEY, _profile(tmp_path, text))
    assert origin == "default" and rules == []


def test_sweep_set_adds_candidate_tiles_for_f16_align8(tmp_path):
    from cutlass_ops_gen.tiles import SWEEP_TILES
    out = tmp_path / "gen"
    generate(["--archs", "80", "--kernels", "sweep", "--out", str(out)])
    names = {p.stem for p in out.glob("*.cu")}
    key = InstanceKey("conv2d_fused", 80, "f16", 8)
    assert all(kernel_name(key, t) in names for t in SWEEP_TILES)
    assert not any(kernel_name(InstanceKey("conv2d_fused", 80, "bf16", 8), t) in names for t in SWEEP_TILES)


# ---- family 90 (Hopper, CUTLASS 3.x) ---------------------------------------------------------

SM90_HEADER = ("Problem,Provider,OperationKind,Operation,Disposition,Status,conv_kind,n,h,w,c,k,r,s,"
               "p,q,pad_h,pad_w,stride_h,stride_w,Activation,cta_m,cta_n,cta_k,cluster_m,cluster_n,stages,"
               "split_k_mode,split_k_slices,Runtime\n")


def _sm90_row(i, name, n, tile, cluster, stages, runtime, split=1, c=64, k=64, hw=16):
    m, nn, kk = tile
    return (f"{i},cutlass_ops,conv2d,{name},passed,success,fprop,{n},{hw},{hw},{c},{k},3,3,{hw},{hw},1,1,1,1,"
            f"f16:nhwc,{m},{nn},{kk},{cluster[0]},{cluster[1]},{stages},serial,{split},{runtime}\n")


@pytest.mark.parametrize("archs", [[80], [80, 86], [70, 80], [90], [80, 90], [86, 90], [70, 80, 86, 90]])
@pytest.mark.parametrize("kernel_set", ["ci", "all"])
def test_family_90_iff_90_in_archs(archs, kernel_set, tmp_path):
    keys = instance_keys(archs, kernel_set)
    assert any(k.family == 90 for k in keys) == (90 in archs)
    assert any(k.family == 80 for k in keys) == any(a >= 80 for a in archs)  # sm90 keeps family 80
    out = tmp_path / "gen"
    generate(["--archs", ",".join(map(str, archs)), "--kernels", kernel_set, "--out", str(out)])
    sm90 = sorted(p.name for p in out.glob("cutlass_ops_conv2d_*_sm90_*.cu"))
    assert bool(sm90) == (90 in archs)
    cmake = (out / "instances.cmake").read_text()
    line = next(x for x in cmake.splitlines() if x.startswith("set(CUTLASS_OPS_GENERATED_CONV2D_FUSED_SM90"))
    assert all(s in line for s in sm90) and (line == "set(CUTLASS_OPS_GENERATED_CONV2D_FUSED_SM90 )") == (90 not in archs)
    if 90 in archs:
        expected = len(SM90_CI_TILES) if kernel_set == "ci" else 2 * len(SM90_TILES)
        assert len(sm90) == expected


def test_family_90_keys_are_fused_fprop_align8_only():
    keys = [k for k in instance_keys([90], "all") if k.family == 90]
    assert keys == [InstanceKey("conv2d_fused", 90, "f16", 8), InstanceKey("conv2d_fused", 90, "bf16", 8)]
    assert [k for k in instance_keys([80, 90], "ci") if k.family == 90] == [InstanceKey("conv2d_fused", 90, "f16", 8)]


def test_ci_set_has_one_stock_and_one_persistent_sm90_f16_instance(tmp_path):
    out = tmp_path / "gen"
    generate(["--archs", "80;90", "--kernels", "ci", "--out", str(out)])
    key = InstanceKey("conv2d_fused", 90, "f16", 8)
    sm90 = sorted(p.stem for p in out.glob("cutlass_ops_conv2d_*_sm90_*.cu"))
    assert sm90 == sorted(kernel_name(key, t) for t in SM90_CI_TILES)
    assert [t.schedule for t in SM90_CI_TILES] == ["", "coop"]
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    assert "kNumKernels = 6" in table  # the family-80 ci set's four, plus two
    # Family-80 rows keep their fields; family-90 rows add the cluster.
    assert re.search(r'\{"cutlass_ops_conv2d_fused_f16_sm80_[^"]+", 80, DType::kF16, 8, 64, 64, 64, 4, &\w+\},', table)
    for tile in SM90_CI_TILES:
        m, n, k = tile.threadblock
        assert f'", 90, DType::kF16, 8, {m}, {n}, {k}, {tile.stages}, &{kernel_name(key, tile)}, 1, 1}},' in table


def test_sm90_instance_names_the_template_with_its_configuration():
    tile = Sm90Tile((128, 128, 64), (2, 1, 1), 0)
    inst, text = emit_instance(InstanceKey("conv2d_fused", 90, "bf16", 8), tile, "default")
    assert inst.name == "cutlass_ops_conv2d_fused_bf16_sm90_128x128x64_autos_2x1c_align8"
    assert '#include "conv2d_fused/conv2d_fused_sm90_instance.cuh"' in text
    assert re.search(r"Sm90FusedConv<cutlass::bfloat16_t, 128, 128, 64, 2, 1, 0,\s+cutlass::epilogue::TmaWarpSpecialized>", text)
    assert f"return run_sm90_instance<{inst.name}_base>(args, stream);" in text
    assert f"cutlass::Status {inst.name}(Conv2dFusedArgs const& args, cudaStream_t stream)" in text
    _, text = emit_instance(InstanceKey("conv2d_fused", 90, "f16", 8), Sm90Tile((64, 128, 64), (1, 1, 1), 4), "x")
    assert "Sm90FusedConv<cutlass::half_t, 64, 128, 64, 1, 1, 4," in text
    with pytest.raises(ValueError):
        emit_instance(InstanceKey("conv2d_fused", 90, "f16", 4), tile, "default")


def test_sm90_profile_rows_are_read_without_warps_and_never_split(tmp_path):
    name = "cutlass_ops_conv2d_fused_f16_sm90_{}_align8"
    rows = [
        _sm90_row(1, name.format("a"), 128, (128, 64, 64), (1, 1), 4, 0.020),
        _sm90_row(2, name.format("b"), 128, (64, 256, 64), (2, 1), 0, 0.010),    # winner: auto stages, 2x1
        _sm90_row(3, name.format("c"), 128, (64, 64, 64), (1, 1), 4, 0.001, split=4),  # split-K: not ours
        _sm90_row(4, name.format("a").replace("sm90", "sm80"), 128, (32, 32, 32), (1, 1), 2, 0.0001),  # family 80
    ]
    d = tmp_path / "profiles" / "h100"
    d.mkdir(parents=True)
    (d / "sm90.csv").write_text("# gpu: test\n" + SM90_HEADER + "".join(rows))
    key = InstanceKey("conv2d_fused", 90, "f16", 8)
    tiles, rules, origin = select_tiles(key, tmp_path / "profiles")
    winner = Sm90Tile((64, 256, 64), (2, 1, 1), 0)
    assert origin == "default + profile h100"
    assert tiles == default_tiles(key) + [winner]
    assert [(r.problem, r.tile, r.split_k) for r in rules] == [(Problem(64, 64, 3, 3, 1, 128 * 16 * 16), winner, 1)]
    # The family-80 keys do not read sm90.csv; without any sm90.csv family 90 has its defaults.
    assert select_tiles(InstanceKey("conv2d_fused", 80, "f16", 8), tmp_path / "profiles")[1] == []
    assert select_tiles(key, tmp_path / "none") == (default_tiles(key), [], "default")
    out = tmp_path / "gen"
    generate(["--archs", "90", "--kernels", "all", "--profiles", str(tmp_path / "profiles"), "--out", str(out)])
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    names = re.findall(r'\{"(cutlass_ops_[^"]+)"', table)
    rule = re.search(r"\{90, DType::kF16, 8, 64, 64, 3, 3, 1, 32768LL, (\d+), 1, 0\.01\}", table)
    assert rule and names[int(rule.group(1))] == kernel_name(key, winner)
    assert f'", 90, DType::kF16, 8, 64, 256, 64, 0, &{kernel_name(key, winner)}, 2, 1}},' in table


# ---- family 90, persistent kernels ----------------------------------------------------------

def test_sm90_default_tiles_are_stock_and_persistent_named_by_schedule(tmp_path):
    key = InstanceKey("conv2d_fused", 90, "f16", 8)
    assert default_tiles(key) == SM90_TILES == SM90_STOCK_TILES + SM90_PERSISTENT_TILES
    assert not any(t.schedule for t in SM90_STOCK_TILES)
    assert {t.schedule for t in SM90_PERSISTENT_TILES} == {"coop", "pp"}
    assert ci_tiles(key) == SM90_CI_TILES
    assert kernel_name(key, Sm90Tile((128, 128, 64), (1, 1, 1), 6, "coop")) == \
        "cutlass_ops_conv2d_fused_f16_sm90_128x128x64_6s_1x1c_coop_align8"
    assert kernel_name(key, Sm90Tile((128, 64, 64), (1, 1, 1), 6, "pp")) == \
        "cutlass_ops_conv2d_fused_f16_sm90_128x64x64_6s_1x1c_pp_align8"
    with pytest.raises(ValueError):
        Sm90Tile((128, 128, 64), (1, 1, 1), 4, "streamk")
    names = [kernel_name(k, t) for k in instance_keys([90], "all") if k.family == 90 for t in default_tiles(k)]
    assert len(names) == len(set(names))
    # The generator builds every default tile for both 16-bit dtypes.
    out = tmp_path / "gen"
    generate(["--archs", "90", "--kernels", "all", "--out", str(out)])
    sm90 = [p.stem for p in out.glob("cutlass_ops_conv2d_*_sm90_*.cu")]
    assert len(sm90) == 2 * len(SM90_TILES)
    assert sum(n.endswith(("_coop_align8", "_pp_align8")) for n in sm90) == 2 * len(SM90_PERSISTENT_TILES)


def test_sm90_persistent_instance_names_the_persistent_template():
    key = InstanceKey("conv2d_fused", 90, "bf16", 8)
    inst, text = emit_instance(key, Sm90Tile((256, 128, 64), (1, 1, 1), 4, "coop"), "default")
    assert inst.name == "cutlass_ops_conv2d_fused_bf16_sm90_256x128x64_4s_1x1c_coop_align8"
    assert '#include "conv2d_fused/conv2d_fused_sm90_persistent_instance.cuh"' in text
    assert re.search(r"Sm90FusedConvPersistent<cutlass::bfloat16_t, 256, 128, 64, 1, 1, 4,\s+"
                     r"cutlass_ops::sm90_persistent::ConvCooperative>", text)
    assert f"return run_sm90_instance<{inst.name}_base>(args, stream);" in text
    _, text = emit_instance(key, Sm90Tile((128, 64, 64), (1, 1, 1), 6, "pp"), "default")
    assert re.search(r"Sm90FusedConvPersistent<cutlass::bfloat16_t, 128, 64, 64, 1, 1, 6,\s+"
                     r"cutlass_ops::sm90_persistent::ConvPingpong>", text)
    # The stock template stays as it was.
    _, text = emit_instance(key, SM90_STOCK_TILES[0], "default")
    assert "Sm90FusedConvPersistent" not in text and "conv2d_fused_sm90_instance.cuh" in text


def test_sm90_profile_rows_carry_the_schedule_in_the_name(tmp_path):
    name = "cutlass_ops_conv2d_fused_f16_sm90_{}_align8"
    rows = [
        _sm90_row(1, name.format("128x128x64_4s_1x1c"), 128, (128, 128, 64), (1, 1), 4, 0.020),
        _sm90_row(2, name.format("128x128x64_6s_1x1c_coop"), 128, (128, 128, 64), (1, 1), 6, 0.010),  # winner
        _sm90_row(3, name.format("128x64x64_6s_1x1c_pp"), 2048, (128, 64, 64), (1, 1), 6, 0.100),     # winner
        _sm90_row(4, name.format("128x64x64_4s_1x1c"), 2048, (128, 64, 64), (1, 1), 4, 0.120),
    ]
    d = tmp_path / "profiles" / "h100"
    d.mkdir(parents=True)
    (d / "sm90.csv").write_text("# gpu: test\n" + SM90_HEADER + "".join(rows))
    key = InstanceKey("conv2d_fused", 90, "f16", 8)
    coop = Sm90Tile((128, 128, 64), (1, 1, 1), 6, "coop")
    pp = Sm90Tile((128, 64, 64), (1, 1, 1), 6, "pp")
    tiles, rules, _ = select_tiles(key, tmp_path / "profiles")
    assert [r.tile for r in rules] == [coop, pp]
    assert coop in tiles and pp in tiles
    # A schedule column, where a profile has one, says the same.
    text = (d / "sm90.csv").read_text().replace(",Runtime\n", ",Runtime,schedule\n", 1)
    text = text.replace(name.format("128x128x64_6s_1x1c_coop"), "some_cutlass_kernel_align8")
    lines = text.splitlines()
    lines = [line + (",coop" if "some_cutlass_kernel" in line else ",") if line[0].isdigit() else line for line in lines]
    (d / "sm90.csv").write_text("\n".join(lines) + "\n")
    _, rules, _ = select_tiles(key, tmp_path / "profiles")
    assert rules[0].tile == coop


# ---- linear_silu (family 90 GEMMs with a SiLU epilogue) ---------------------------------------

@pytest.mark.parametrize("archs", [[80], [90], [80, 90]])
@pytest.mark.parametrize("kernel_set", ["ci", "all"])
def test_linear_silu_instances_iff_90_in_archs(archs, kernel_set, tmp_path):
    from cutlass_ops_gen.linear_silu import LINEAR_SILU_TILES, LINEAR_SILU_TILES_CI
    out = tmp_path / "gen"
    generate(["--archs", ",".join(map(str, archs)), "--kernels", kernel_set, "--out", str(out)])
    names = sorted(p.stem for p in out.glob("cutlass_ops_linear_silu_*.cu"))
    tiles = LINEAR_SILU_TILES_CI if kernel_set == "ci" else LINEAR_SILU_TILES
    assert len(names) == (2 * len(tiles) if 90 in archs else 0)
    table = (out / "linear_silu_dispatch_table.cpp").read_text()
    assert f"kLinearSiluInstanceCount = {len(names)};" in table
    assert all(f'{{"{n}", DType::' in table for n in names)
    line = next(x for x in (out / "instances.cmake").read_text().splitlines()
                if x.startswith("set(CUTLASS_OPS_GENERATED_LINEAR_SILU_SM90"))
    assert all(n in line for n in names)  # compiled with the family-90 (sm_90a) flags
    assert "CUTLASS_OPS_GENERATED_LINEAR_SILU_DISPATCH" in (out / "instances.cmake").read_text()
    if 90 in archs and kernel_set == "all":  # the ping-pong tile first, for K >= 256 only
        assert re.search(r'_pp", DType::kF16, 256, 32768, ', table) and re.search(r'_coop", DType::kF16, 0, 0, ', table)
