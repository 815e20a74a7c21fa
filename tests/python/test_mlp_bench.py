"""bench mlp's arithmetic (no GPU): the work and least memory traffic of a model, and a timed
system's fractions of the GPU's peaks, on the numbers of an H100 run (32-64x4-16,
2^21 rows, fp16, inference in 0.2469 ms at 261.0 TFLOP/s before rounding the time)."""
import pytest

from cutlass_ops.tools import mlp_bench

H100 = {"tflops_dense_fp16_datasheet": 989.0, "hbm_tb_s_datasheet": 3.35}


def test_work_and_traffic_of_a_model():
    model = mlp_bench.MODELS["relu_32-64x4-16"]()
    rows = 2 ** 21
    # 32x64 + 3 x 64x64 + 64x16 multiply-adds a row
    assert mlp_bench._flops(model, rows, backward=False) == 2 * (32 * 64 + 3 * 64 * 64 + 64 * 16) * rows
    assert mlp_bench._flops(model, rows, backward=True) == 3 * mlp_bench._flops(model, rows, backward=False)
    assert mlp_bench._io_bytes(32, 16, rows, 2, backward=False) == rows * 48 * 2
    assert mlp_bench._io_bytes(32, 16, rows, 2, backward=True) == 2 * rows * 48 * 2


def test_peak_fractions_and_the_printed_line():
    model = mlp_bench.MODELS["relu_32-64x4-16"]()
    rows = 2 ** 21
    gflop = mlp_bench._flops(model, rows, False) / 1e9
    io_gb = mlp_bench._io_bytes(32, 16, rows, 2, False) / 1e9
    r = {"throughput_ms": 0.2469, "latency_ms": 0.3151, "device_ms": 0.2417}
    r.update(mlp_bench.peak_fractions(r, gflop, io_gb, H100))
    assert r["tflops"] == pytest.approx(261.0, abs=0.1)
    assert r["tensor_peak_fraction"] == pytest.approx(261.0 / 989.0, rel=1e-3)
    assert r["io_tb_s"] == pytest.approx(0.815, abs=0.001)  # 0.201 GB in 0.2469 ms
    assert r["hbm_fraction"] == pytest.approx(0.815 / 3.35, rel=1e-3)
    line = mlp_bench.format_row({"model": "relu_32-64x4-16", "mode": "inference", "rows": rows,
                                 "systems": {"FusedMLP": r, "eager": {"error": "RuntimeError: x"}}})
    assert "FusedMLP: 0.2469 / 0.3151 / 0.2417 ms (260.9 TFLOP/s, 26% of fp16 peak; in/out 0.82 TB/s, 24% of HBM)" in line
    assert "eager: RuntimeError: x" in line
