"""The command line (python -m cutlass_ops): help that answers, clear refusals without a GPU."""
import subprocess
import sys

import pytest
import torch


def cli(*args):
    # -P: the installed package, not the source folder (which has no compiled library).
    return subprocess.run([sys.executable, "-P", "-m", "cutlass_ops", *args], capture_output=True, text=True,
                          timeout=120)


def test_bench_help_names_the_metrics():
    r = cli("bench", "--help")
    assert r.returncode == 0, r.stderr
    for word in ("throughput", "latency", "device time", "max-autotune", "--calls", "--latency-iters"):
        assert word in " ".join(r.stdout.split()), word


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("what", ["resnet", "train"])
def test_bench_without_cuda_says_so(what):
    r = cli("bench", what)
    assert r.returncode == 2
    assert "needs a CUDA device" in r.stderr


def test_layer_table_maps_kernels_to_layers():
    """bench resnet's per-layer table: 16 kernels in launch order -> each conv's TFLOP/s, each
    memory-bound kernel's TB/s; another kernel sequence gives no table (never a wrong one)."""
    from cutlass_ops.tools.bench import layer_table
    peaks = {"tflops_dense_fp16_datasheet": 989.0, "hbm_tb_s_datasheet": 3.35}
    conv, se = "_ZN11cutlass_ops12conv2d_fused4sm9024conv2d_fused_sm90_kernel", "cutlass_ops::se_gate::se_gate_kernel"
    names = ["space_to_depth_conv_kernel", conv, conv, se] + [conv, conv, conv, se] * 3
    kernels = [(name, 100.0) for name in names]
    layers = layer_table(2048, kernels, 3, peaks)
    assert [r["layer"].split()[0] for r in layers][:5] == [
        "stem", "layers.0.conv1", "layers.0.conv2", "layers.0.se_gate", "layers.1.conv1"]
    conv1 = layers[1]  # 3x3, 64 -> 64 on 16x16: 2 * 2048 * 256 * 64 * 64 * 9 FLOPs in 100 us
    assert abs(conv1["tflops"] - 2 * 2048 * 256 * 64 * 64 * 9 / 100e-6 / 1e12) < 1e-6
    se0 = layers[3]  # reads h and the identity, writes out and the 4x smaller pooled map
    assert abs(se0["tb_s"] - 2 * 2048 * 64 * 256 * 3.25 / 100e-6 / 1e12) < 1e-6
    assert "dense" in layers[13]["layer"] and "tflops" in layers[13]
    # bounds: block 0's conv reads and writes a 2048x64x16x16 map (and its 74 KB filter) at 3.35 TB/s,
    # a little longer than its FLOPs take at 989 TFLOP/s; se_gate moves only bytes
    conv1_bytes = 2 * (2 * 2048 * 64 * 256) + 2 * 64 * 64 * 9
    assert abs(conv1["bound_us"] - conv1_bytes / 3.35e12 * 1e6) < 1e-6
    assert conv1_bytes / 3.35e12 > 2 * 2048 * 256 * 64 * 64 * 9 / 989e12
    assert abs(se0["bound_us"] - 2 * 2048 * 64 * 256 * 3.25 / 3.35e12 * 1e6) < 1e-6
    assert all(abs(r["fraction_of_bound"] - r["bound_us"] / 100.0) < 1e-12 for r in layers)
    assert layer_table(2048, kernels[:-1], 3, peaks) == []               # a kernel missing
    assert layer_table(2048, [(se, 1.0)] + kernels[1:], 3, peaks) == []  # not the stem first
    # block 0's conv2 and se_gate as one kernel (conv2d_fused_se_gate's): one row with the conv's
    # FLOPs and the bytes of both (conv1's output and the identity in, out and the pooled map out)
    fused = "void cutlass_ops::conv2d_fused::sm90_halo::halo_se_gate_kernel<cutlass::half_t>(CUtensorMap_st)"
    one = layer_table(2048, [kernels[0], kernels[1], (fused, 100.0)] + kernels[4:], 3, peaks)
    assert [r["layer"].split()[0] for r in one][:4] == ["stem", "layers.0.conv1", "layers.0.conv2", "layers.1.conv1"]
    assert "se_gate" in one[2]["layer"] and abs(one[2]["tflops"] - conv1["tflops"]) < 1e-6
    assert abs(one[2]["tb_s"] - (2 * 2048 * 64 * 256 * 3.25 + 2 * 64 * 64 * 9) / 100e-6 / 1e12) < 1e-6
    assert layer_table(2048, [kernels[0], (fused, 1.0)] + kernels[2:], 3, peaks) == []  # not in conv1's place


def test_block_fused_bound_counts_each_block_once():
    """bench resnet's bound line for the block-fused design: per image 127.5 MFLOP (the issue's
    count); block 0 at N=2048: 77.3 GFLOP and 134 MB (input and output maps once, weights once)."""
    from cutlass_ops.tools.bench import block_fused_bound
    peaks = {"tflops_dense_fp16_datasheet": 989.0, "hbm_tb_s_datasheet": 4.8}
    d = block_fused_bound(2048, 3, peaks)
    assert [p["part"] for p in d["parts"]] == ["stem", "layers.0", "layers.1", "layers.2", "layers.3"]
    assert abs(d["flops"] / 2048 / 1e6 - 127.5) < 0.1
    b0 = d["parts"][1]
    assert b0["flops"] == 2.0 * 2048 * 256 * 64 * 64 * 9 * 2
    assert b0["bytes"] == 2 * (2 * 2048 * 256 * 64 + 2 * 64 * 64 * 9)
    assert abs(b0["bound_us"] - max(b0["flops"] / 989e12, b0["bytes"] / 4.8e12) * 1e6) < 1e-9
    assert abs(d["bound_us"] - sum(p["bound_us"] for p in d["parts"])) < 1e-9
    # a block with a downsample reads its input once for both its conv1 and the downsample
    b1 = d["parts"][2]
    assert b1["bytes"] == 2 * (2048 * 64 * 256 + 2048 * 128 * 64 + 128 * 64 * 9 + 128 * 128 * 9 + 128 * 64)


def test_report_reprints_saved_results(tmp_path):
    """`report` reads what bench resnet / bench train saved (here a committed H100 run) and prints
    the same tables, the per-layer bounds included; anything else is refused by name."""
    import pathlib
    results = pathlib.Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "resnet"
    r = cli("report", str(results / "h100_inference_n2048.json"), str(results / "h100_train_n2048_halo.json"))
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "FusedResNet forward (inference)" in out and "FusedResNet training step" in out
    assert "layers.0.conv1 3x3/1 64->64 16x16" in out and "of their bounds" in out
    assert "= 0.72x" in out  # the saved run's throughput ratio, recomputed from its numbers
    other, older = tmp_path / "other.json", tmp_path / "older.json"
    other.write_text('{"rows": [{"n": 1}]}')
    older.write_text('{"dtype": "float16", "in_channels": 3, "rows": [{"n": 1, "results": {"FusedResNet": {"ms": 1}}}]}')
    r = cli("report", str(other), str(older), str(tmp_path / "missing.json"))
    assert r.returncode == 2
    assert r.stderr.count("not the JSON of `bench resnet` or `bench train`") == 2, r.stderr
    assert "'FusedResNet' lacks the metrics" in r.stderr and "missing.json" in r.stderr
    assert "Traceback" not in r.stderr
