"""FusedResNet under torch DistributedDataParallel, through examples/ddp_ppo.py
launched by torchrun with two processes: on the CPU with gloo (runs in CI), and on GPUs with
NCCL (skipped without two GPUs) or two processes sharing one GPU through gloo.

The example is a standalone script run as one subprocess per rank (as torchrun would start it), so it imports whichever cutlass_ops
this Python imports (the installed package; a checkout's own Python files with
PYTHONPATH=<checkout> when the built library is linked into its cutlass_ops/ folder).
"""
import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import cutlass_ops
from cutlass_ops import streams as autograd  # the stream and DDP policy

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_ppo.py"
SMALL = ["--base-planes", "16", "--image", "32"]  # the same network, narrower: seconds on 2 cores
GPUS = torch.cuda.device_count() if torch.cuda.is_available() and cutlass_ops.cuda_kernels_built() else 0


_PORTS_GIVEN = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port from bind(0) is ephemeral, so between
    our closing it and rank 0's TCPStore binding it (seconds: a torch import), the gloo connections
    of the runs started beside it could take it (EADDRINUSE in CI).  Never the same port twice."""
    rng = random.Random(os.getpid())
    for _ in range(1000):
        port = rng.randrange(20000, 32768)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError("no free port in 20000..32767")


class Launch:
    """The example on `nproc` ranks, started at once: one process per rank with the variables
    torchrun would set (torchrun itself would cost one more torch import per run on the 2-core
    CI machine).  result() waits and returns (exit code, rank 0's JSON or None, output)."""

    def __init__(self, nproc, *args, tmp_path, name="out", env=None):
        self.out = Path(tmp_path) / f"{name}.json"
        self.nproc, self.env = nproc, env
        self.cmd = [sys.executable, str(EXAMPLE), *map(str, args), "--out", str(self.out)]
        self.start()
        self.done = None

    def start(self):
        # the ranks run strict exactly when the test does (a test marked fallback: not strict,
        # whatever CUTLASS_OPS_STRICT the suite set; conftest.py)
        strict = "1" if cutlass_ops.paths.is_strict() else "0"
        rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(self.nproc),
                      "LOCAL_WORLD_SIZE": str(self.nproc), "OMP_NUM_THREADS": "1", "CUTLASS_OPS_STRICT": strict,
                      **(self.env or {})}
        self.procs = [subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), **rendezvous))
                      for r in range(self.nproc)]

    def result(self, timeout=600):
        if self.done is None:
            for attempt in range(2):
                texts = [p.communicate(timeout=timeout)[0] for p in self.procs]
                rc = max(p.returncode for p in self.procs)
                # Another program took the port before rank 0 bound it: not the code under test.
                if rc == 0 or attempt == 1 or not any("EADDRINUSE" in t for t in texts):
                    break
                self.start()
            self.done = (rc, json.loads(self.out.read_text()) if self.out.exists() else None, "\n".join(texts))
        return self.done

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def torchrun(nproc, *args, tmp_path, name="out", env=None):
    return Launch(nproc, *args, tmp_path=tmp_path, name=name, env=env).result()


CPU_RUNS = {  # started together (the 2-core CI machine runs them side by side), checked below
    "float64": (2, "--check-grads", "--dtype", "float64", "--batch", 2),
    "static": (2, "--check-grads", "--dtype", "float32", "--batch", 2, "--static-graph", "--grad-as-bucket-view",
               "--bucket-cap-mb", 0.05),
    "flat": (2, "--check-grads", "--dtype", "float64", "--batch", 2, "--flat-params", "stages", "--static-graph",
             "--grad-as-bucket-view", "--bucket-cap-mb", 0.05),
    "ignored": (2, "--check-grads", "--dtype", "float64", "--batch", 2, "--check-steps", 1,
                "--ignore-param", "encoder.layers.2.0.fixup_scale"),
    "train2": (2, "--dtype", "float64", "--steps", 3, "--warmup", 1, "--lr", 1e-3, "--data-chunk", 2,
               "--batch", 2, "--bucket-cap-mb", 0.05, "--throughput-steps", 2, "--throughput-windows", 3,
               "--paired-baseline"),
    "train1": (1, "--dtype", "float64", "--steps", 3, "--warmup", 1, "--lr", 1e-3, "--data-chunk", 2,
               "--batch", 4),
}


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    runs = {name: Launch(spec[0], "--device", "cpu", *spec[1:], *SMALL, tmp_path=tmp, name=name)
            for name, spec in CPU_RUNS.items()}
    yield runs
    for run in runs.values():
        run.kill()


def assert_check_passed(rc, report, text, world=2):
    assert report is not None, text[-4000:]
    assert rc == 0 and report["passed"], (report.get("failures"), text[-3000:])
    assert report["environment"]["world_size"] == world
    for rec in report["check_steps"]:
        assert rec["grads_missing"] == 0
        assert rec["cross_rank_max_abs_diff"] == 0  # every gradient all-reduced: identical on both ranks
        assert len(rec["params"]) == len(report["params"]) == 54  # FusedResNet's 48 + the head's 6
    # ... and the ranks' own gradients (no sync) differ, so the equality above means something.
    assert report["local_cross_rank_max_abs_diff"] > 1e-3


def test_ddp_flat_parameters_gradients_equal_one_process(cpu_runs):
    """--flat-params stages (cutlass_ops.flatten_parameters: DDP sees one parameter per encoder
    stage and dtype, each in its own small bucket): every original parameter's gradient, read as a
    view of its flat one, equals one process's on the concatenated batch, as unflattened."""
    rc, report, text = cpu_runs["flat"].result()
    assert_check_passed(rc, report, text)
    assert report["args"]["flat_params"] == "stages"
    for rec in report["check_steps"]:
        for name, row in rec["params"].items():
            assert row["rel_err"] <= (1e-12 if row["dtype"] == "float64" else 1e-4), (name, row)
            assert row["ref_norm"] > 0, name


def test_ddp_gradients_equal_one_process_on_the_concatenated_batch_float64(cpu_runs):
    """Random non-zero FixUp scalars, SE and conv2 weights; 2 steps (DDP rebuilds its buckets
    after the first); float64 weights (FusedResNet keeps FixUp scalars and SE weights float32)."""
    rc, report, text = cpu_runs["float64"].result()
    assert_check_passed(rc, report, text)
    for rec in report["check_steps"]:
        for name, row in rec["params"].items():
            assert row["rel_err"] <= (1e-12 if row["dtype"] == "float64" else 1e-4), (name, row)
            assert row["ref_norm"] > 0, name  # a zero gradient would compare equal trivially


def test_ddp_static_graph_bucket_views_small_buckets_float32(cpu_runs):
    """static_graph=True, gradient_as_bucket_view=True and ~50 KB buckets (many all-reduces
    started during the backward, in the order the gradients arrive)."""
    rc, report, text = cpu_runs["static"].result()
    assert_check_passed(rc, report, text)
    assert report["args"]["static_graph"] and report["args"]["grad_as_bucket_view"]


def test_the_check_fails_when_a_gradient_is_not_all_reduced(cpu_runs):
    """Negative control: DDP told to leave one FixUp scalar alone; the check must catch it."""
    name = "encoder.layers.2.0.fixup_scale"
    rc, report, text = cpu_runs["ignored"].result()
    assert rc == 1 and report is not None and not report["passed"], text[-3000:]
    assert any(name in f for f in report["failures"]) and any("ranks' gradients differ" in f
                                                              for f in report["failures"])


def test_two_ranks_train_like_one_rank_on_the_same_global_batch(cpu_runs):
    """Training (Adam, float64): 2 ranks at N=2 vs 1 rank at N=4, the same samples per step
    (--data-chunk 2), give the same loss curve; the comm hook timed each bucket's all-reduce."""
    rc2, two, text2 = cpu_runs["train2"].result()
    assert rc2 == 0 and two is not None, text2[-3000:]
    rc1, one, text1 = cpu_runs["train1"].result()
    assert rc1 == 0 and one is not None, text1[-3000:]
    assert len(two["losses"]) == 3 and len(set(two["losses"])) == 3  # it trains: the loss changes
    for a, b in zip(two["losses"], one["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), (two["losses"], one["losses"])
    # the throughput metric: steps back to back after the logged ones, the slowest rank's time, the
    # median of the windows
    assert two["throughput_steps"] == 2 and two["throughput_step_ms"] > 0
    assert len(two["throughput_windows_ms"]) == 3
    assert two["throughput_step_ms"] == sorted(two["throughput_windows_ms"])[1]
    assert two["throughput_samples_per_s"] == pytest.approx(4 / (two["throughput_step_ms"] / 1e3))
    assert "throughput_step_ms" not in one  # off on the CPU unless asked for
    # --paired-baseline: windows alternating with one process's on rank 0, each pair's scaling
    pairs = two["paired_windows"]
    assert len(pairs) == 3 and all(p["ddp_ms"] > 0 and p["one_gpu_ms"] > 0 for p in pairs)
    assert all(p["speedup"] == pytest.approx(2 * p["one_gpu_ms"] / p["ddp_ms"]) for p in pairs)
    assert two["paired_speedup_median"] == sorted(p["speedup"] for p in pairs)[1]
    assert "paired_windows" not in one  # one process: nothing to pair with
    comm = two["comm_last_step"]
    assert two["buckets_per_step"] > 1 and all(b["done_ms"] >= b["ready_ms"] for b in comm["buckets"])
    assert comm["backward_compute_end_ms"] <= comm["backward_returned_ms"]


def test_no_deferred_wgrad_join_inside_a_ddp_forward():
    """The deferred wgrad join (autograd.weights_used_once) is off inside a DDP forward: DDP's
    reducer reads each gradient from an AccumulateGrad post hook, which stored_as_is cannot see
    (on a GPU, under graph capture, a deferred wgrad would be bucketed before it was computed)."""
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            with autograd.weights_used_once():
                seen.append(autograd.single_use_declared())
            return self.lin(x)

    probe = Probe()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        probe(torch.randn(1, 2))
        torch.nn.parallel.DistributedDataParallel(probe)(torch.randn(1, 2))
        probe(torch.randn(1, 2))
    finally:
        dist.destroy_process_group()
    assert seen == [True, False, True]


# ---- GPUs (later runs; skipped here) --------------------------------------------------------

@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (and a CUDA build)")
@pytest.mark.parametrize("mode", [[], ["--static-graph"], ["--compile"]], ids=["eager", "static_graph", "compile"])
def test_nccl_fp16_gradients_within_noise(tmp_path, mode):
    """2 GPUs, NCCL, fp16 autocast, N=256 per GPU: each tensor's DDP gradient is no farther
    from float64 than 2x the single-GPU run's on the concatenated batch (+1e-3)."""
    rc, report, text = torchrun(2, "--check-grads", "--dtype", "float16", "--batch", 256, *mode,
                                tmp_path=tmp_path)
    assert_check_passed(rc, report, text)
    assert report["environment"]["backend"] == "nccl"


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (and a CUDA build)")
@pytest.mark.fallback  # float32: FusedResNet's ATen path
def test_nccl_float32_gradients_equal(tmp_path):
    rc, report, text = torchrun(2, "--check-grads", "--dtype", "float32", "--batch", 64, tmp_path=tmp_path)
    assert_check_passed(rc, report, text)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs (and a CUDA build)")
@pytest.mark.fallback  # float32: FusedResNet's ATen path
def test_nccl_graph_capture_trains_like_eager(tmp_path):
    """The whole fwd+bwd+all-reduce captured in one CUDA graph: the loss curve matches eager's."""
    common = ["--dtype", "float32", "--batch", 128, "--steps", 6, "--warmup", 1]
    rc_e, eager, text_e = torchrun(2, *common, tmp_path=tmp_path, name="eager")
    rc_g, graph, text_g = torchrun(2, *common, "--graph", "--profile-steps", 2, tmp_path=tmp_path, name="graph")
    assert rc_e == 0 and rc_g == 0, (text_e[-2000:], text_g[-2000:])
    for a, b in zip(graph["losses"], eager["losses"]):
        assert abs(a - b) <= 1e-3 * abs(b) + 1e-5, (graph["losses"], eager["losses"])
    # the profiler sees the kernels inside the graph, the all-reduce's among them, on both ranks
    for t in graph["gpu_timeline"]["per_rank"]:
        assert t["kernels"] > t["nccl_kernels"] > 0, t
        assert abs(t["span_ms"] - (t["compute_ms"] + t["nccl_exposed_ms"] + t["idle_ms"])) < 1e-6, t


def test_gpu_timeline_sums_the_union_of_intervals():
    """The profiler breakdown's interval union (us in, ms out): overlaps count once."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_ppo_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.union_ms([]) == 0.0
    assert example.union_ms([(0, 1000), (500, 1500), (2000, 2500)]) == 2.0
    assert example.union_ms([(1000, 2000), (0, 3000), (2500, 2600)]) == 3.0


def _report_module():
    """examples/ddp_ppo_report.py, imported from its file."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_ppo_report", EXAMPLE.parent / "ddp_ppo_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_report_compares_each_round_with_its_own_baseline(tmp_path):
    """ddp_ppo_report.py: a 2-GPU run of round k against round k's 1-GPU run (the bucket size left
    out of the baseline's name), and the median over the rounds."""
    report = _report_module()

    def write(name, ms, world):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "losses": [1.0], "median_step_ms": ms, "samples_per_s": 8 * world / ms,
            "throughput_step_ms": ms, "throughput_samples_per_s": 8 * world / ms}))

    one = [4.0, 5.0, 3.0]  # the 1-GPU run of each round: a slower machine in round 2
    two = [4.4, 5.0, 3.3]  # speedups 2 * 4.0/4.4, 2.0, 2 * 3.0/3.3
    for k in range(3):
        write(f"fused_graph_n8_round{k + 1}_1gpu", one[k], 1)
        write(f"fused_graph_bucket8mb_n8_round{k + 1}_2gpu", two[k], 2)
        write(f"fused_graph_bucket8mb_view_n8_round{k + 1}_2gpu", two[k], 2)
        write(f"fused_graph_flat_view_n8_round{k + 1}_2gpu", two[k], 2)
    assert report.main(str(tmp_path)) == 0
    rows = {r["run"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    assert rows["fused_graph_bucket8mb_n8_round2"]["baseline_1gpu"] == "fused_graph_n8_round2_1gpu"
    assert rows["fused_graph_bucket8mb_view_n8_round2"]["baseline_1gpu"] == "fused_graph_n8_round2_1gpu"
    assert rows["fused_graph_flat_view_n8_round2"]["baseline_1gpu"] == "fused_graph_n8_round2_1gpu"
    summary = rows["fused_graph_bucket8mb_n8"]
    assert summary["rounds"] == [1, 2, 3]
    assert summary["speedup_rounds"] == pytest.approx([2 * 4.0 / 4.4, 2.0, 2 * 3.0 / 3.3])
    assert summary["speedup_median"] == pytest.approx(2 * 4.0 / 4.4) and not summary["meets_1.9x"]


def test_report_clocks_of_each_launch(tmp_path):
    """ddp_ppo_report.launch_clocks: each run's samples are those between its start and the next
    run's (launches.txt), per GPU; headers repeated by appending and [N/A] cells are skipped."""
    report = _report_module()
    (tmp_path / "launches.txt").write_text("2026/11/28 18:00:00 start a_1gpu\n2026/11/28 18:00:10 start a_2gpu\n")
    header = ("timestamp, index, clocks.current.sm [MHz], clocks.current.memory [MHz], temperature.gpu, "
              "power.draw [W], clocks_event_reasons.active\n")
    rows = [("18:00:01.000", 0, 1980, 50, 600.0, "0x0"), ("18:00:02.000", 0, 1900, 55, 640.0, "0x4"),
            ("18:00:03.000", 0, 1960, 52, 620.0, "0x0"), ("18:00:11.500", 0, 1700, 70, 700.0, "0x20"),
            ("18:00:11.500", 1, 1800, 60, 650.0, "0x0"), ("18:00:12.000", 1, "[N/A]", 61, 650.0, "0x0")]
    text = header + "".join(f"2026/11/28 {t}, {g}, {sm} MHz, 1593 MHz, {temp}, {w} W, {r}\n"
                            for t, g, sm, temp, w, r in rows[:3])
    text += header + "".join(f"2026/11/28 {t}, {g}, {sm} MHz, 1593 MHz, {temp}, {w} W, {r}\n"
                             for t, g, sm, temp, w, r in rows[3:])
    (tmp_path / "gpu_clocks.csv").write_text(text)
    clocks = report.launch_clocks(tmp_path)
    assert clocks["a_1gpu"] == {0: {"sm_mhz_median": 1960, "temp_c_max": 55, "power_w_median": 620.0,
                                    "event_reasons": ["0x0", "0x4"]}}
    assert clocks["a_2gpu"][0]["sm_mhz_median"] == 1700 and clocks["a_2gpu"][1]["temp_c_max"] == 60
    assert report.launch_clocks(tmp_path / "missing") == {}


def test_report_kernel_diff_names_what_ddp_adds():
    """ddp_ppo_report.kernel_diff: per kernel name, the counts a step on 1 and 2 GPUs and the time
    a step the 2-GPU run adds, largest change first; a kernel in one table only counts as 0 in
    the other."""
    report = _report_module()
    one = {"kernel_table": [{"name": "conv", "per_step": 10.0, "us_per_step": 300.0},
                            {"name": "adam", "per_step": 2.0, "us_per_step": 20.0}]}
    two = {"kernel_table": [{"name": "conv", "per_step": 10.0, "us_per_step": 310.0},
                            {"name": "copy", "per_step": 53.0, "us_per_step": 120.0},
                            {"name": "ncclAllReduce", "per_step": 1.0, "us_per_step": 200.0}]}
    rows = report.kernel_diff(two, one, top=3)
    assert [r["name"] for r in rows] == ["ncclAllReduce", "copy", "adam"]
    assert rows[1] == {"name": "copy", "per_step_1gpu": 0.0, "per_step_2gpu": 53.0, "us_per_step_added": 120.0}
    assert rows[2]["us_per_step_added"] == -20.0 and rows[2]["per_step_2gpu"] == 0.0


@pytest.mark.skipif(GPUS < 1, reason="needs a GPU (and a CUDA build)")
@pytest.mark.fallback  # float32: FusedResNet's ATen path
def test_two_processes_share_one_gpu_through_gloo(tmp_path):
    """Two ranks on one GPU (NCCL refuses that: gloo all-reduces the CUDA gradients)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    rc, report, text = torchrun(2, "--check-grads", "--dtype", "float32", "--batch", 32, tmp_path=tmp_path,
                                env={"CUDA_VISIBLE_DEVICES": first})
    assert_check_passed(rc, report, text)
    assert report["environment"]["backend"] == "gloo" and report["environment"]["ranks_share_a_gpu"]
