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
