"""Shape fuzz: random cases per public op, forward and backward, against a float64 reference.

Random N, H, W, C, K, kernel size, stride, padding, dtype (fp16/bf16/fp32), memory layout
(NCHW, channels_last, a strided view, an offset into a larger storage: a misaligned data
pointer), empty batches, and NaN/Inf in a few inputs.  Seeded and reproducible:

    CUTLASS_OPS_FUZZ_SEED   the seed (default: the test's seed, from its test id as every
                            test's is -- conftest.py; printed)
    CUTLASS_OPS_FUZZ_CASES  cases per op (default 1000 on CUDA, 50 on the CPU)

Each case is drawn from random.Random(f"{seed}:{op}:{device}:{index}"), so one case can be
rerun alone; a failure prints a snippet that does that.

Bounds: the op's error against float64 (max |out - ref| / max |ref| over finite elements)
must be at most 2x PyTorch's own error for the same computation in the same dtype, plus a
few units of the dtype's rounding: the op may be no less accurate than PyTorch.  Ops whose
results are float32 sums (the weight gradients) are held to float32 bounds.  NaN/Inf: where
float64 has a NaN, so must the op; an Inf must stay the same Inf (or be NaN where PyTorch's
own result is NaN); a finite reference must give a finite result unless PyTorch's own result
is not finite there either.  A padded conv's weight gradient meets NaN/Inf in its output
gradient at the zero padding: multiplied in (F.conv2d's float64 backward: NaN) or skipped (a
finite sum of the real products; some cuDNN and oneDNN algorithms): both are admissible, and
the reference that skips it (_fuzz.conv2d_taps) checks a finite result's value.  A shape no kernel covers takes the ATen path (its one-time
warning is allowed) and is held to the same bounds.

Backward: each op's autograd formula (its backward kernels: relu_backward, conv2d_dgrad /
wgrad, se_gate_backward, layer_norm_rows_backward, dw_conv3x3_tokens_backward_input,
giou_loss_backward, fused_mlp_backward, ...) against float64 autograd of the composite, with
the ReLU mask the op's contract defines (read from its saved output), under the same bounds; a
scalar's gradient (a sum over the whole output) relative to the sum of its terms' magnitudes.

Which path ran: on CUDA each case's ops report "kernel", "empty" or "fallback: <reason>"
(cutlass_ops.last_path; the backward runs on the calling thread here so that it can be read);
with 200 cases or more every op that has a kernel must reach it in at least a tenth of them, so
that the fuzz cannot pass on fallbacks alone.  The counts are printed; a shortfall names the
other paths' reasons.  An op whose kernel cannot run here at all (FusedMLP without nvcc or
NVRTC) fails once, up front, saying why (READY).

The ops' draw/run pairs: _fuzz_conv.py (conv), _fuzz_se.py (SE gate, GIoU, FusedMLP),
_fuzz_cvt.py (the CvT ops); the framework: _fuzz.py.
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time
import warnings

import pytest
import torch

import cutlass_ops
from cutlass_ops import paths
from _fuzz import num_cases
from _helpers import DEVICES
import _fuzz_conv
import _fuzz_cvt
import _fuzz_se

# None: each test's own seed (the rng_seed fixture: a hash of the test id)
SEED = int(os.environ["CUTLASS_OPS_FUZZ_SEED"]) if os.environ.get("CUTLASS_OPS_FUZZ_SEED") else None

# op -> (draw(rng) -> case, run(case, device) -> failure or None, the ops whose path is counted)
OPS = {**_fuzz_conv.OPS, **_fuzz_se.OPS, **_fuzz_cvt.OPS}
# op -> ready(device) -> None, or why the op's kernel cannot run on this machine at all
READY = {**_fuzz_se.READY}
NOT_CALLED = "not called"
# a case running this long is named on the terminal while it runs (Watchdog): a hung kernel or a
# pathological reference names its case even when the run is stopped from outside
SLOW_CASE_S = float(os.environ.get("CUTLASS_OPS_FUZZ_SLOW_CASE_S", "60"))


class Watchdog:
    """Names the running case on the real stderr (past pytest's capture, so that it reaches the
    terminal while the case still runs), and in CUTLASS_OPS_TEST_STACKS's folder where set
    (conftest.py), once it has taken SLOW_CASE_S seconds; one thread per test."""

    def __init__(self, op, device, seed, poll=1.0):
        self.op, self.device, self.seed, self.poll = op, device, seed, poll
        self.case = None  # (index, case, start) of the running case
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    def start(self, index, case):
        self.case = (index, case, time.monotonic())

    def _watch(self):
        named = None
        while not self.done.wait(self.poll):
            running = self.case
            if running is None or running[0] == named or time.monotonic() - running[2] < SLOW_CASE_S:
                continue
            named = running[0]
            text = (f"\nfuzz {self.op} on {self.device} (CUTLASS_OPS_FUZZ_SEED={self.seed}): case {named} "
                    f"still running after {SLOW_CASE_S:g} s:\n{snippet(self.op, running[1], self.device)}\n")
            sys.__stderr__.write(text)
            sys.__stderr__.flush()
            folder = os.environ.get("CUTLASS_OPS_TEST_STACKS")  # (pytest-xdist workers' stderr reaches no log)
            if folder:
                with open(os.path.join(folder, f"slow_fuzz_cases_{os.getpid()}.txt"), "a") as f:
                    f.write(text)


def draw(op: str, device: str, index: int, seed: int) -> dict:
    return OPS[op][0](random.Random(f"{seed}:{op}:{device}:{index}"))


def run_case(op: str, case: dict, device: str):
    """Runs one case; returns None or the failure's description."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ATen fallback's one-time warning
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), \
                torch.autograd.set_multithreading_enabled(False):  # the backward's paths on this thread
            prev = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = False
            try:
                return OPS[op][1](case, device)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = prev


def snippet(op, case, device):
    return ("# from tests/python, with cutlass_ops installed:\n"
            f"import test_fuzz\nprint(test_fuzz.run_case({op!r}, {case!r}, {device!r}))")


def _path_kind(path):
    return "fallback" if path.startswith("fallback") else path


def _has_kernel(name: str) -> bool:
    """Whether the build has a kernel for the op on this GPU (linear_silu's need arch 90)."""
    if name == "linear_silu":
        return bool(cutlass_ops.ops.linear_silu_kernels()) and torch.cuda.get_device_capability()[0] == 9
    if name == "conv2d_fused_se_gate":  # one sm_90a kernel; elsewhere the two kernels it fuses
        return bool(cutlass_ops.ops.conv2d_fused_kernels(90)) and torch.cuda.get_device_capability() == (9, 0)
    return True


@pytest.mark.long
@pytest.mark.fallback  # its float32 and odd-shape cases mean the ATen path; it counts each case's path itself
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", list(OPS))
def test_fuzz(op, device, rng_seed):
    count = num_cases(device)
    seed = rng_seed if SEED is None else SEED
    print(f"fuzz {op} on {device}: seed {seed}, {count} cases (CUTLASS_OPS_FUZZ_SEED / CUTLASS_OPS_FUZZ_CASES)")
    why_not = READY.get(op, lambda _: None)(device)
    if why_not:  # e.g. FusedMLP without nvcc or NVRTC: no kernel to fuzz, said once, up front
        pytest.fail(f"fuzz {op} on {device}: cannot run its kernel here: {why_not}", pytrace=False)
    tracked = OPS[op][2] if device == "cuda" else []
    counts = {name: {} for name in tracked}
    others = {name: {} for name in tracked}  # the paths other than the kernel, by full text (reasons)
    took = []  # (seconds, index) of each case
    with Watchdog(op, device, seed) as watchdog:
        for i in range(count):
            case = draw(op, device, i, seed)
            watchdog.start(i, case)
            start = time.monotonic()
            _run_one(op, case, device, i, seed, tracked, counts, others)
            took.append((time.monotonic() - start, i))
    print("  slowest cases: " + ", ".join(f"{i} ({t:.2f} s)" for t, i in sorted(took, reverse=True)[:3]))
    for name, seen in counts.items():
        print(f"  {name} paths: {seen}")
    if count >= 200:  # the fuzz reaches the kernels, not only the fallbacks
        for name, seen in counts.items():
            if _has_kernel(name):
                assert seen.get("kernel", 0) >= count // 10, _floor_message(name, seen, others[name], count)


def _run_one(op, case, device, i, seed, tracked, counts, others):
    """Case i: fails the test with its reproducer, or counts each tracked op's path."""
    for name in tracked:
        paths.record(name, NOT_CALLED)
    try:
        fail = run_case(op, case, device)
    except Exception as e:  # a crash is a failure too, reported with its reproducer
        fail = f"raised {type(e).__name__}: {e}"
    if fail:
        ran = {name: paths.last_path(name, any_thread=True) for name in tracked}
        pytest.fail(f"fuzz {op} case {i} (CUTLASS_OPS_FUZZ_SEED={seed}) on {device}: {fail}"
                    + (f" [paths: {ran}]" if ran else "") + f"\nreproduce:\n{snippet(op, case, device)}",
                    pytrace=False)
    for name in tracked:
        # any thread: a tracked backward op called by autograd runs on autograd's CUDA thread
        path = paths.last_path(name, any_thread=True) or NOT_CALLED
        kind = _path_kind(path)
        counts[name][kind] = 1 + counts[name].get(kind, 0)
        if kind != paths.KERNEL:
            others[name][path] = 1 + others[name].get(path, 0)


def _floor_message(name, seen, others, count):
    """Why the kernel floor failed: the counts, then the most frequent other paths (the
    fallbacks' reasons), and what "not called" means."""
    top = sorted(others.items(), key=lambda kv: -kv[1])[:5]
    msg = (f"{name}: the kernel ran in {seen.get('kernel', 0)} of {count} cases (at least {count // 10} needed): "
           f"{seen}; most frequent other paths: " + "; ".join(f"{n}x {p}" for p, n in top))
    if NOT_CALLED in others:
        msg += (f" ('{NOT_CALLED}': no call of {name} on any thread recorded a path in that case: the case did not"
                " reach it, or it ran a path that does not report itself to cutlass_ops.paths)")
    return msg


def test_watchdog_names_a_slow_case(monkeypatch, capfd, tmp_path):
    """The Watchdog writes a case that runs past SLOW_CASE_S, with its reproducer, while it runs:
    on stderr and in CUTLASS_OPS_TEST_STACKS's folder."""
    monkeypatch.setattr(sys.modules[__name__], "SLOW_CASE_S", 0.5)
    monkeypatch.setenv("CUTLASS_OPS_TEST_STACKS", str(tmp_path))
    case = {"n": 3, "marker": "slow-case"}
    with Watchdog("some_op", "cpu", 7, poll=0.05) as watchdog:
        watchdog.start(0, {"n": 1})
        watchdog.start(4, case)
        time.sleep(3.0)
    err = capfd.readouterr().err
    assert "fuzz some_op on cpu (CUTLASS_OPS_FUZZ_SEED=7): case 4 still running after 0.5 s" in err
    assert "slow-case" in err and "case 0 " not in err
    assert err.count("still running") == 1  # once per case
    text = (tmp_path / f"slow_fuzz_cases_{os.getpid()}.txt").read_text()
    assert "case 4 still running" in text and "slow-case" in text and "case 0 " not in text
