"""The profiler sweep (python -m cutlass_ops profile) and the forced-kernel hook it uses."""
import csv

import pytest
import torch

import cutlass_ops
from cutlass_ops.models import SEResNet9FixUp
from cutlass_ops.tools.profiler import (COLUMNS, _NAME, _NAME90, gpu_slug, kernel_families, problems_from_model,
                                        resnet_problems, split_k_candidates, sweep)
from cutlass_ops.tools.profiler_backward import (_BACKWARD_NAME, _BACKWARD_NAME90, backward_families,
                                                 sm90_wgrad_slice_candidates, sweep_backward)
from _helpers import HAS_CUDA


def test_resnet_problems_cover_every_conv():
    problems = resnet_problems([1, 128])
    # stem, block 0 (conv1 == conv2: one problem), blocks 1-3 (conv1, conv2, downsample),
    # block 3's conv2 as inference runs it (a dense layer on the 2x2 map)
    assert len(problems) == 2 * (1 + 1 + 3 * 3 + 1)
    assert dict(n=128, h=1, w=1, c=2048, k=2048, r=1, s=1, pad=0, stride=1) in problems
    assert problems[0] == dict(n=1, h=16, w=16, c=48, k=64, r=1, s=1, pad=0, stride=1)
    assert dict(n=128, h=4, w=4, c=256, k=512, r=3, s=3, pad=1, stride=2) in problems
    assert dict(n=128, h=2, w=2, c=256, k=512, r=1, s=1, pad=0, stride=1) in problems  # downsample
    # Training: no stem (its backward is its own kernel); block 3's conv2 both as the dense
    # layer (its dgrad) and as the 3x3 conv (its wgrad).
    training = resnet_problems([128], training=True)
    assert len(training) == 1 + 3 * 3 + 1
    assert dict(n=128, h=1, w=1, c=2048, k=2048, r=1, s=1, pad=0, stride=1) in training
    assert dict(n=128, h=2, w=2, c=512, k=512, r=3, s=3, pad=1, stride=1) in training


def test_problems_from_model_hooks_every_conv():
    problems = problems_from_model(SEResNet9FixUp(3), (3, 64, 64), [2, 8])
    # The reference runs the same convs as FusedResNet except the downsample (a 1x1 conv on
    # the 3x3/s2-pooled input there too, so the same problem) and the dense conv2.
    fused = [p for p in resnet_problems([2, 8]) if p["h"] > 1]
    assert sorted(map(str, problems)) == sorted(map(str, fused))


def test_kernel_name_patterns():
    m = _NAME90.match("cutlass_ops_conv2d_fused_f16_sm90_128x128x64_4s_1x1c_align8")
    assert m and m["schedule"] is None and (m["m"], m["stages"], m["cm"]) == ("128", "4", "1")
    m = _NAME90.match("cutlass_ops_conv2d_fused_bf16_sm90_256x128x64_4s_1x1c_coop_align8")
    assert m and m["schedule"] == "coop" and (m["dtype"], m["m"], m["n"], m["align"]) == ("bf16", "256", "128", "8")
    assert _NAME90.match("cutlass_ops_conv2d_fused_f16_sm90_128x64x64_6s_1x1c_pp_align8")["schedule"] == "pp"
    assert not _NAME90.match("cutlass_ops_conv2d_fused_f16_sm90_128x64x64_6s_1x1c_xx_align8")
    assert _NAME.match("cutlass_ops_conv2d_fused_f16_sm80_128x64x32_4s_2x2w_o_align8")


def test_backward_kernel_name_patterns():
    m = _BACKWARD_NAME90.match("cutlass_ops_conv2d_dgrad_f16_sm90_128x64x64_4s_1x1c_unity_align8")
    assert m and (m["kind"], m["variant"], m["m"], m["n"], m["stages"], m["cm"]) == ("dgrad", "unity", "128", "64", "4", "1")
    m = _BACKWARD_NAME90.match("cutlass_ops_conv2d_wgrad_bf16_sm90_64x64x64_autos_2x1c_align8")
    assert m and (m["kind"], m["dtype"], m["variant"], m["stages"], m["cm"]) == ("wgrad", "bf16", None, "auto", "2")
    assert not _BACKWARD_NAME.match("cutlass_ops_conv2d_dgrad_f16_sm90_128x64x64_4s_1x1c_unity_align8")
    assert _BACKWARD_NAME.match("cutlass_ops_conv2d_dgrad_f16_sm80_128x64x32_4s_2x2w_o_strided_align8")
    assert not _BACKWARD_NAME90.match("cutlass_ops_conv2d_dgrad_f16_sm80_128x64x32_4s_2x2w_o_strided_align8")


def test_sm90_wgrad_slice_candidates():
    k = _BACKWARD_NAME90.match("cutlass_ops_conv2d_wgrad_f16_sm90_64x64x64_4s_1x1c_align8")
    p = dict(n=2048, h=16, w=16, c=64, k=64, r=3, s=3, pad=1, stride=1)  # 9 output tiles, 8192 K-iterations
    assert sm90_wgrad_slice_candidates(p, k, 132) == [1, 2, 4, 8, 16, 32]  # 64 slices: > 4 CTAs per SM
    assert sm90_wgrad_slice_candidates(p, k, 1000) == [1, 2, 4, 8, 16, 32, 64]
    # 48 K-iterations, 3 images: >= 16 K-iterations and one image per slice
    assert sm90_wgrad_slice_candidates(dict(p, n=3, h=32, w=32), k, 132) == [1, 2]
    p = dict(n=8, h=2, w=2, c=512, k=512, r=3, s=3, pad=1, stride=1)      # 1 K-iteration, 576 tiles
    assert sm90_wgrad_slice_candidates(p, k, 132) == [1]


def test_gpu_slug():
    assert gpu_slug("NVIDIA H200") == "h200"
    assert gpu_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("family", [80, 90])
def test_sweep_writes_profiler_rows_and_resumes(tmp_path, family):
    if family not in kernel_families():
        pytest.skip(f"no family-{family} kernels for this GPU in this build")
    out = tmp_path / "h" / f"sm{family}.csv"
    problems = [dict(n=2, h=8, w=8, c=64, k=64, r=3, s=3, pad=1, stride=1)]
    written = sweep(problems, out, iters=3, family=family)
    # The sweep measures the kernels of one family (the names its pattern matches).
    name = _NAME90 if family == 90 else _NAME
    kernels = [k for k in torch.ops.cutlass_ops.conv2d_fused_kernels()
               if "_f16_" in k and k.endswith("align8") and f"_sm{family}_" in k and name.match(k)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    expected = {(k, split) for k in kernels for split in split_k_candidates(problems[0], name.match(k), sms)}
    if family == 80:
        assert written == len(expected) > len(kernels) > 0  # 128 output rows: split-K is swept too
    else:
        assert written == len(expected) == len(kernels) > 0  # no split-K in family 90
    with open(out) as f:
        assert f.readline().startswith("# cutlass_ops profile:")
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == COLUMNS
    assert {(r["Operation"], int(r["split_k_slices"])) for r in rows} == expected
    # "passed" means checked against a float32 reference, split or not.
    assert all(r["Disposition"] == "passed" and float(r["Runtime"]) > 0 for r in rows)
    if family == 90:  # what the generator reads back: a cluster, no warps
        assert all(r["warps_m"] == "" and int(r["cluster_m"]) >= 1 for r in rows)
    assert sweep(problems, out, iters=3, family=family) == 0  # resumed: nothing left to measure


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_forced_kernel_runs_or_raises():
    x = torch.randn(2, 64, 8, 8, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.half)
    # a general kernel: the hand-written halo kernels take only their one map shape (16 wide)
    name = [k for k in torch.ops.cutlass_ops.conv2d_fused_kernels()
            if "_f16_" in k and k.endswith("align8") and "_halo" not in k][-1]
    try:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name)
        cutlass_ops.conv2d_fused(x, w, padding=1)
        assert cutlass_ops.conv2d_fused_last_kernel().split()[0] == name
        with pytest.raises(ValueError, match="forced kernel"):
            cutlass_ops.conv2d_fused(x[:, :12], w[:, :12], padding=1)  # alignment 4: cannot run
    finally:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel("")


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_forced_split_k_runs_exactly_or_raises():
    x = torch.randn(1, 256, 4, 4, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 256, 3, 3, device="cuda", dtype=torch.half) / 48
    ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    # A family-80 kernel: the family-90 ones have no split-K.
    name = [k for k in torch.ops.cutlass_ops.conv2d_fused_kernels()
            if "_f16_sm80_" in k and k.endswith("align8")][0]
    try:
        for split in (1, 2, 4):
            torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, split)
            y = cutlass_ops.conv2d_fused(x, w, padding=1)
            assert ("split_k=%d" % split in cutlass_ops.conv2d_fused_last_kernel()) == (split > 1)
            assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, 2)
        with pytest.raises(ValueError, match="cannot split K"):  # a residual rules split-K out
            cutlass_ops.conv2d_fused(x, w, residual=torch.randn_like(ref, dtype=torch.half), padding=1)
    finally:
        torch.ops.cutlass_ops.conv2d_fused_force_kernel("")


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_backward_sweep_family_90_rows_feed_the_generator(tmp_path):
    """profile --backward --family 90: the family-90 dgrad/wgrad rows (no cuDNN rows), read back
    by the generator as family-90 rules (wgrad's batch slices kept)."""
    if 90 not in backward_families():
        pytest.skip("no family-90 dgrad/wgrad kernels for this GPU in this build (CUTLASS_OPS_SM90_BACKWARD=1)")
    from cutlass_ops_gen.manifest import InstanceKey
    from cutlass_ops_gen.tiles import select_tiles
    out = tmp_path / "profiles" / "h" / "sm90.csv"
    # N=64: 64 K-iterations of 64, enough for 2 and 4 batch slices (>= 16 each); at N=16 (as
    # written first) wgrad had one slice only and the split-slice assertion failed on the H100.
    problems = [dict(n=64, h=8, w=8, c=64, k=64, r=3, s=3, pad=1, stride=1),
                dict(n=16, h=8, w=8, c=64, k=128, r=3, s=3, pad=1, stride=2)]
    assert sweep_backward(problems, out, iters=3, family=90) > 0
    with open(out) as f:
        assert "kernel family sm90" in f.readline()
        rows = list(csv.DictReader(f))
    assert rows and all("_sm90_" in r["Operation"] and r["Disposition"] == "passed" for r in rows)
    assert not any(r["conv_kind"] == "dgrad" and r["stride_h"] == "2" for r in rows)  # unity-stride dgrad only
    assert {r["conv_kind"] for r in rows} == {"dgrad", "wgrad"}
    assert any(int(r["split_k_slices"]) > 1 for r in rows if r["conv_kind"] == "wgrad")
    for op in ("conv2d_dgrad", "conv2d_wgrad"):
        _, rules, origin = select_tiles(InstanceKey(op, 90, "f16", 8), tmp_path / "profiles")
        assert rules and "profile h" in origin
    assert sweep_backward(problems, out, iters=3, family=90) == 0  # resumed


def test_cudnn_rows_are_written_like_kernel_rows():
    """profile --backward's cuDNN rows go through the same row writer as our kernels' (on the CPU:
    no timing, only the row)."""
    from cutlass_ops.tools.profiler import _row
    from cutlass_ops.tools.profiler_backward import _Cudnn
    p = dict(n=512, h=16, w=16, c=64, k=64, r=3, s=3, stride=1, pad=1)
    row = _row(1, p, _Cudnn("wgrad"), "f16", 80, 1, 0.0123, "passed")
    assert row["Operation"] == "cudnn" and row["Runtime"] == "0.012300" and row["p"] == 16
    assert set(row) <= set(COLUMNS)
