"""Generator unit tests of the family-90 (sm_90a, CUTLASS 3.x) conv2d_dgrad / conv2d_wgrad
instances, which are built only with --sm90-backward (CMake CUTLASS_OPS_SM90_BACKWARD=1)."""
import re
from pathlib import Path

import pytest

from cutlass_ops_gen.__main__ import main as generate
from cutlass_ops_gen.emitter import dgrad_variants, emit_instance, kernel_name
from cutlass_ops_gen.manifest import InstanceKey, instance_keys
from cutlass_ops_gen.tiles import (SM90_DGRAD_TILES, SM90_WGRAD_TILES, Sm90Tile, ci_tiles, default_tiles,
                                   select_tiles, sweep_tiles)

REPO = Path(__file__).resolve().parents[2]
DGRAD90 = InstanceKey("conv2d_dgrad", 90, "f16", 8)
WGRAD90 = InstanceKey("conv2d_wgrad", 90, "bf16", 8)


def _backward90(keys):
    return [k for k in keys if k.family == 90 and k.op != "conv2d_fused"]


@pytest.mark.parametrize("kernel_set", ["ci", "all", "sweep"])
def test_generator_emits_them_only_when_asked_and_only_with_90_in_the_archs(kernel_set):
    assert _backward90(instance_keys([80, 90], kernel_set)) == []
    assert _backward90(instance_keys([80, 86], kernel_set, sm90_backward=True)) == []
    keys = _backward90(instance_keys([80, 90], kernel_set, sm90_backward=True))
    dtypes = ["f16"] if kernel_set == "ci" else ["f16", "bf16"]
    assert keys == ([InstanceKey("conv2d_dgrad", 90, d, 8) for d in dtypes]
                    + [InstanceKey("conv2d_wgrad", 90, d, 8) for d in dtypes])
    # the family-80 keys are the same with and without the switch
    assert ([k for k in instance_keys([80, 90], kernel_set, True) if not (k.family == 90 and k.op != "conv2d_fused")]
            == instance_keys([80, 90], kernel_set))


def test_tiles_names_and_variants():
    assert default_tiles(DGRAD90) == SM90_DGRAD_TILES and default_tiles(WGRAD90) == SM90_WGRAD_TILES
    assert ci_tiles(DGRAD90) == SM90_DGRAD_TILES[:1] and ci_tiles(WGRAD90) == SM90_WGRAD_TILES[:1]
    assert sweep_tiles(DGRAD90) == [] and sweep_tiles(WGRAD90) == []
    assert all(not t.schedule and t.threadblock[2] == 64 for t in SM90_DGRAD_TILES + SM90_WGRAD_TILES)
    assert dgrad_variants(DGRAD90) == [False]          # unity stride only on family 90
    assert dgrad_variants(InstanceKey("conv2d_dgrad", 80, "f16", 8)) == [False, True]
    assert kernel_name(DGRAD90, SM90_DGRAD_TILES[0], False) == \
        "cutlass_ops_conv2d_dgrad_f16_sm90_128x64x64_4s_1x1c_unity_align8"
    assert kernel_name(WGRAD90, SM90_WGRAD_TILES[1]) == "cutlass_ops_conv2d_wgrad_bf16_sm90_64x64x64_4s_1x1c_align8"
    names = [kernel_name(k, t, v) for k in instance_keys([80, 90], "all", True) for t in default_tiles(k)
             for v in dgrad_variants(k)]
    assert len(names) == len(set(names))


def test_emitted_instances_name_the_sm90_backward_template():
    inst, text = emit_instance(DGRAD90, Sm90Tile((128, 128, 64), (2, 1, 1), 0), "default", False)
    assert inst.name == "cutlass_ops_conv2d_dgrad_f16_sm90_128x128x64_autos_2x1c_unity_align8"
    assert inst.strided_dgrad is False and inst.conv_kind == "dgrad"
    assert '#include "conv2d_backward/conv2d_backward_sm90_instance.cuh"' in text
    assert re.search(r"Sm90BackwardConv<cutlass::half_t, cutlass::conv::Operator::kDgrad, 128, 128, 64,\s+2, 1, 0>",
                     text)
    assert f"cutlass::Status {inst.name}(Conv2dBackwardArgs const& args, cudaStream_t stream, bool query)" in text
    assert f"return run_sm90_instance<{inst.name}_base>(args, stream, query);" in text
    assert "namespace conv2d_backward" in text and "conv2d_fused" not in text
    inst, text = emit_instance(WGRAD90, SM90_WGRAD_TILES[0], "default")
    assert inst.strided_dgrad is None
    assert re.search(r"Sm90BackwardConv<cutlass::bfloat16_t, cutlass::conv::Operator::kWgrad, 128, 64, 64,\s+1, 1, 4>",
                     text)


def test_emitter_refuses_what_family_90_backward_cannot_build():
    with pytest.raises(ValueError):
        emit_instance(InstanceKey("conv2d_dgrad", 90, "f16", 4), SM90_DGRAD_TILES[0], "default", False)
    with pytest.raises(ValueError):
        emit_instance(WGRAD90, Sm90Tile((128, 128, 64), (1, 1, 1), 6, "coop"), "default")


def test_generator_switch_adds_instances_table_rows_and_cmake_entries(tmp_path):
    plain, on = tmp_path / "plain", tmp_path / "on"
    generate(["--archs", "80,90", "--kernels", "ci", "--out", str(plain)])
    generate(["--archs", "80,90", "--kernels", "ci", "--sm90-backward", "--out", str(on)])
    assert not list(plain.glob("*_dgrad_*_sm90_*.cu")) and not list(plain.glob("*_wgrad_*_sm90_*.cu"))
    new = sorted(p.stem for p in on.glob("cutlass_ops_conv2d_*_sm90_*.cu") if "_fused_" not in p.name)
    assert new == sorted([kernel_name(DGRAD90, SM90_DGRAD_TILES[0], False),
                          kernel_name(InstanceKey("conv2d_wgrad", 90, "f16", 8), SM90_WGRAD_TILES[0])])
    # everything else is generated exactly as without the switch
    for p in plain.iterdir():
        if p.name not in ("conv2d_backward_dispatch_table.cpp", "instances.cmake"):
            assert (on / p.name).read_text() == p.read_text(), p.name
    backward = (on / "conv2d_backward_dispatch_table.cpp").read_text()
    assert "kNumKernels = 8" in backward  # the family-80 ci set's six, plus two
    assert "kNumKernels = 6" in (plain / "conv2d_backward_dispatch_table.cpp").read_text()
    assert re.search(r'\{"cutlass_ops_conv2d_dgrad_f16_sm90_128x64x64_4s_1x1c_unity_align8", ConvKind::kDgrad, 90, '
                     r"DType::kF16, 8, false, 128, 64, 64, 4, &cutlass_ops_conv2d_dgrad_f16_sm90_\w+\},", backward)
    assert re.search(r'\{"cutlass_ops_conv2d_wgrad_f16_sm90_128x64x64_4s_1x1c_align8", ConvKind::kWgrad, 90, ', backward)
    cmake = (on / "instances.cmake").read_text()
    line = next(x for x in cmake.splitlines() if x.startswith("set(CUTLASS_OPS_GENERATED_CONV2D_BACKWARD_SM90"))
    assert all(n in line for n in new)
    line80 = next(x for x in cmake.splitlines() if x.startswith("set(CUTLASS_OPS_GENERATED_CONV2D_BACKWARD_SM80"))
    assert not any(n in line80 for n in new)


SM90_BWD_HEADER = ("Problem,Provider,OperationKind,Operation,Disposition,Status,conv_kind,n,h,w,c,k,r,s,"
                   "p,q,pad_h,pad_w,stride_h,stride_w,Activation,cta_m,cta_n,cta_k,cluster_m,cluster_n,stages,"
                   "split_k_mode,split_k_slices,Runtime\n")


def _row(i, kind, name, n, tile, runtime, split=1):
    m, nn, kk = tile
    mode = "parallel" if split > 1 else "serial"
    return (f"{i},cutlass_ops,conv2d,{name},passed,success,{kind},{n},16,16,64,64,3,3,16,16,1,1,1,1,"
            f"f16:nhwc,{m},{nn},{kk},1,1,4,{mode},{split},{runtime}\n")


def test_sm90_backward_profile_rules_keep_wgrad_batch_slices_and_carry_family_90(tmp_path):
    dgrad = "cutlass_ops_conv2d_dgrad_f16_sm90_64x64x64_4s_1x1c_unity_align8"
    wgrad = "cutlass_ops_conv2d_wgrad_f16_sm90_64x64x64_4s_1x1c_align8"
    d = tmp_path / "profiles" / "h100"
    d.mkdir(parents=True)
    (d / "sm90.csv").write_text("# gpu: test\n" + SM90_BWD_HEADER + "".join([
        _row(1, "dgrad", dgrad, 512, (64, 64, 64), 0.030),
        _row(2, "dgrad", dgrad.replace("64x64x64", "128x64x64"), 512, (128, 64, 64), 0.040),
        _row(3, "wgrad", wgrad, 512, (64, 64, 64), 0.020, split=16),   # batch slices: kept
        _row(4, "wgrad", wgrad, 512, (64, 64, 64), 0.090, split=1),
        _row(5, "fprop", "cutlass_ops_conv2d_fused_f16_sm90_128x64x64_4s_1x1c_align8", 512, (128, 64, 64), 0.001),
    ]))
    tiles, rules, origin = select_tiles(DGRAD90, tmp_path / "profiles")
    assert "profile h100" in origin and tiles == SM90_DGRAD_TILES  # the winner is a default tile
    assert [(r.tile, r.strided_dgrad, r.split_k) for r in rules] == [(Sm90Tile((64, 64, 64), (1, 1, 1), 4), False, 1)]
    wkey = InstanceKey("conv2d_wgrad", 90, "f16", 8)
    assert [r.split_k for r in select_tiles(wkey, tmp_path / "profiles")[1]] == [16]
    out = tmp_path / "gen"
    generate(["--archs", "80,90", "--kernels", "all", "--sm90-backward", "--profiles", str(tmp_path / "profiles"),
              "--out", str(out)])
    table = (out / "conv2d_backward_dispatch_table.cpp").read_text()
    names = re.findall(r'\{"(cutlass_ops_[^"]+)"', table)
    rule = re.search(r"\{ConvKind::kDgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, (\d+), 1, 90, 0\.03\}", table)
    assert rule and names[int(rule.group(1))] == dgrad
    rule = re.search(r"\{ConvKind::kWgrad, DType::kF16, 64, 64, 3, 3, 1, 131072LL, (\d+), 16, 90, 0\.02\}", table)
    assert rule and names[int(rule.group(1))] == wgrad
    # bf16 borrows the f16 winners; the fused rule stays in the fused table
    assert "kNumProfileRules = 4" in table
    assert "0.001" in (out / "conv2d_fused_dispatch_table.cpp").read_text()


def test_build_switch_is_wired_from_env_to_the_generator():
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert 'set(CUTLASS_OPS_SM90_BACKWARD "$ENV{CUTLASS_OPS_SM90_BACKWARD}" CACHE STRING' in cmake
    generate_cmake = (REPO / "cmake" / "Generate.cmake").read_text()
    assert re.search(r"if\(CUTLASS_OPS_SM90_BACKWARD\)\s+#[^\n]*\n\s+list\(APPEND _gen_flags --sm90-backward\)",
                     generate_cmake)
    assert "${_gen_flags}" in generate_cmake
    pyproject = (REPO / "pyproject.toml").read_text()
    # on by default, in a pip build (pyproject) and a plain CMake configure alike
    assert 'CUTLASS_OPS_SM90_BACKWARD = { env = "CUTLASS_OPS_SM90_BACKWARD", default = "ON" }' in pyproject
    assert re.search(r'if\(CUTLASS_OPS_SM90_BACKWARD STREQUAL ""\)\s+set\(CUTLASS_OPS_SM90_BACKWARD ON\)', cmake)
