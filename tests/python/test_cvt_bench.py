"""`bench cvt` and `train-check-cvt` on the CPU: the command line answers, the benchmark
refuses without a GPU, a tiny training run gives the same loss curves for FusedCvT and the
reference, and split benchmark runs merge.  (The timings themselves need a GPU.)"""
import contextlib
import importlib.util
import io

import pytest
import torch

import cutlass_ops.__main__ as cli
from cutlass_ops.models import cvt
from cutlass_ops.tools import cvt_bench
from _seeds import seeded


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(argv))
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_cvt_cli_help():
    rc, out, _ = run("bench", "--help")
    assert rc == 0
    text = " ".join(out.split())
    for word in ("cvt", "FusedCvT", "--infer-batch", "--train-batch", "--size", "throughput", "latency"):
        assert word in text, word
    rc, out, _ = run("train-check-cvt", "--help")
    assert rc == 0 and "--steps" in out and "--amp" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_bench_cvt_without_cuda_says_so():
    rc, _, err = run("bench", "cvt")
    assert rc == 2 and "needs a CUDA device" in err


def test_bench_cvt_rejects_unknown_systems():
    with pytest.raises(ValueError, match="unknown inference system"):
        cvt_bench.bench_cvt(infer_systems=["FusedCvT", "nope"])
    with pytest.raises(ValueError, match="unknown training system"):
        cvt_bench.bench_cvt(train_systems=["nope"])


def _tiny():
    from functools import partial
    spec = dict(cvt.CVT13_SPEC, DIM_EMBED=[8, 16, 24], NUM_HEADS=[1, 2, 3], DEPTH=[1, 1, 2],
                DROP_PATH_RATE=[0.0, 0.0, 0.0])
    return cvt.ConvolutionalVisionTransformer(num_classes=10, act_layer=cvt.QuickGELU,
                                              norm_layer=partial(cvt.LayerNorm, eps=1e-5), spec=spec)


def test_cvt_train_check_cpu_tiny(tmp_path):
    result = cvt_bench.train_curves(steps=8, n=4, size=32, device="cpu", dtype=torch.float32, lr=3e-3,
                                    model_fn=_tiny)
    ref, fused = result["curves"].values()
    assert len(ref) == len(fused) == 8
    assert ref[-1] < 0.8 * ref[0]  # it learns (memorises the fixed batch)
    assert result["max_rel_diff"] < 1e-4, result["max_rel_diff"]
    if importlib.util.find_spec("matplotlib") is not None:  # CI's venv has none
        cvt_bench.plot_curves(result, tmp_path / "curves.png")
        assert (tmp_path / "curves.png").stat().st_size > 1000


def test_cvt_train_check_cli_refuses_bad_size():
    rc, _, _ = run("train-check-cvt", "--size", "100", "--device", "cpu", "--steps", "1")
    assert "multiple of 16" in str(rc)  # SystemExit(message)


def test_cvt_bench_merge_results():
    def row(n, systems):
        return {"n": n, "results": {s: {"throughput_ms": t, "latency_ms": t, "device_ms": t} for s, t in systems.items()}}
    old = {"inference": [row(1, {"FusedCvT": 2.0, "eager NCHW": 3.0}), row(64, {"eager NCHW": 9.0})], "training": []}
    new = {"inference": [row(1, {"FusedCvT": 1.0})], "training": [row(64, {"FusedCvT": 5.0})]}
    merged = cvt_bench.merge_results(old, new)
    assert [r["n"] for r in merged["inference"]] == [1, 64]
    r1 = merged["inference"][0]
    assert r1["results"]["FusedCvT"]["throughput_ms"] == 1.0 and r1["results"]["eager NCHW"]["throughput_ms"] == 3.0
    assert r1["ratios"]["throughput_ms"]["ratio"] == pytest.approx(1 / 3)
    assert [r["n"] for r in merged["training"]] == [64]


def test_cvt_bench_systems_run_on_cpu():
    """The benchmark's un-graphed, un-compiled systems build and run (on the CPU, a tiny CvT):
    the same callables bench_cvt times on the GPU."""
    with seeded(0):
        ref = _tiny()
    x = torch.randn(2, 3, 32, 32)
    for name in ("FusedCvT", "eager NCHW"):
        out = cvt_bench._infer_system(name, ref, x)()
        assert out.shape == (2, 10) and not out.requires_grad
    cvt_bench._train_system("FusedCvT", ref, x)()  # zero_grad, forward, loss, backward
    with pytest.raises(ValueError, match="unknown inference system"):
        cvt_bench._infer_system("nope", ref, x)
