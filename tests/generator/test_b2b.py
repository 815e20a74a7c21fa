"""The back-to-back conv instances (python/cutlass_ops_gen/b2b.py): which builds have them,
their names, sources and dispatch table."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from cutlass_ops_gen.__main__ import main  # noqa: E402
from cutlass_ops_gen.b2b import B2B_SHAPES, b2b_instances, emit_b2b_dispatch_table, emit_b2b_instance  # noqa: E402


def test_family_80_builds_only():
    assert b2b_instances([70], "all") == []  # CUTLASS has no Sm70 B2B conv
    ci = b2b_instances([80], "ci")
    assert [(i.dtype, i.k0, i.k1) for i in ci] == [("f16", 64, 128)]
    full = b2b_instances([80, 86, 90], "all")
    assert len(full) == 2 * len(B2B_SHAPES) and len({i.name for i in full}) == len(full)
    assert {i.dtype for i in full} == {"f16", "bf16"}


def test_instance_and_table_sources():
    inst = b2b_instances([80], "ci")[0]
    text = emit_b2b_instance(inst)
    assert '#include "conv2d_b2b/conv2d_b2b_instance.cuh"' in text
    assert f"CUTLASS_OPS_B2B_INSTANCE({inst.name}, cutlass::half_t, 64, 128)" in text
    table = emit_b2b_dispatch_table([inst])
    assert f'{{"{inst.name}", DType::kF16, 64, 128, &{inst.name}}},' in table
    assert "const int kNumKernels = 1;" in table
    empty = emit_b2b_dispatch_table([])  # a build without instances: a well-formed array
    assert "nullptr" in empty and "const int kNumKernels = 0;" in empty


def test_generator_lists_them_for_cmake(tmp_path):
    assert main(["--archs", "80", "--kernels", "ci", "--out", str(tmp_path)]) == 0
    cmake = (tmp_path / "instances.cmake").read_text()
    assert "cutlass_ops_conv2d_b2b_f16_sm80_k64_k128_relu.cu" in cmake
    assert "CUTLASS_OPS_GENERATED_CONV2D_B2B_DISPATCH" in cmake
    assert (tmp_path / "cutlass_ops_conv2d_b2b_f16_sm80_k64_k128_relu.cu").exists()
    assert main(["--archs", "70", "--kernels", "all", "--out", str(tmp_path / "v")]) == 0
    assert 'set(CUTLASS_OPS_GENERATED_CONV2D_B2B_SM80 )' in (tmp_path / "v" / "instances.cmake").read_text()
