"""Unit tests of the build-time generator (run by ctest; CPU only, no compiler needed)."""
import re

import pytest

from cutlass_ops_gen.__main__ import main as generate, parse_archs
from cutlass_ops_gen.emitter import dgrad_variants, emit_instance, kernel_name
from cutlass_ops_gen.manifest import InstanceKey, arch_families, instance_keys
from cutlass_ops_gen.tiles import Problem, Tile, default_tiles, select_tiles

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
    names = [kernel_name(k, t, v) for k in instance_keys([70, 80], "all") for t in default_tiles(k)
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
    ours = re.search(r"\{ConvKind::kDgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, (\d+), 1\}", table)
    assert ours and names[int(ours.group(1))] == dgrad
    assert re.search(r"\{ConvKind::kDgrad, DType::kF16, 64, 64, 3, 3, 1, 524288LL, -1, 1\},  // cuDNN", table)
    assert re.search(r"\{ConvKind::kWgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, \d+, 32\}", table)
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
    sources = sorted(p.name for p in out.glob("*.cu"))
    # fprop: f16/bf16 x align 8/1; dgrad: f16/bf16 x unity/strided; wgrad: f16/bf16; one tile each
    assert len(sources) == 10
    table = (out / "conv2d_fused_dispatch_table.cpp").read_text()
    backward = (out / "conv2d_backward_dispatch_table.cpp").read_text()
    assert "kNumKernels = 4" in table and "kNumKernels = 6" in backward
    for s in sources:
        assert f"&{s[:-3]}}}" in (table if "_fused_" in s else backward)
    assert backward.count('", ConvKind::kDgrad') == 4 and backward.count('", ConvKind::kWgrad') == 2
    cmake = (out / "instances.cmake").read_text()
    assert "CUTLASS_OPS_INSTANCES_SM80" in cmake and all(s in cmake for s in sources)
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
    rule = re.search(r"\{80, DType::kF16, 8, 64, 64, 3, 3, 1, 32768LL, (\d+), 1\}", table)
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
    assert re.search(r"\{80, DType::kF16, 8, 512, 512, 3, 3, 1, 4LL, \d+, 4\}", table)


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
