"""Hung tests (conftest.py): with CUTLASS_OPS_TEST_STACKS=<folder> each test's id is appended to
<folder>/tests_<pid>.txt as it starts, and a test still running after
CUTLASS_OPS_TEST_STACKS_AFTER seconds adds every thread's stack there.  Checked in a child pytest
run (the probes pass trivially in an ordinary run).  CPU only."""
import os
import subprocess
import sys
import time

from _seeds import ROOT

THIS = "tests/python/test_conftest_stacks.py"
_PROBE = "CUTLASS_OPS_STACKS_PROBE"  # set in the child run only


def test_probe_slow():
    if os.environ.get(_PROBE):
        time.sleep(2.5)  # past CUTLASS_OPS_TEST_STACKS_AFTER=1 in the child run


def test_probe_quick():
    pass


def test_stacks_folder_names_tests_and_dumps_a_slow_ones_stack(tmp_path):
    env = dict(os.environ, CUTLASS_OPS_TEST_STACKS=str(tmp_path), CUTLASS_OPS_TEST_STACKS_AFTER="1",
               CUDA_VISIBLE_DEVICES="", **{_PROBE: "1"})
    out = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          f"{THIS}::test_probe_quick", f"{THIS}::test_probe_slow"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout[-3000:]
    logs = list(tmp_path.glob("tests_*.txt"))
    assert len(logs) == 1, logs
    text = logs[0].read_text()
    quick, slow = text.index(f"== {THIS}::test_probe_quick"), text.index(f"== {THIS}::test_probe_slow")
    assert quick < slow
    dump = text[slow:]
    assert "Thread" in dump and "test_probe_slow" in dump, text  # the slow test's stack, after its id
    assert "Thread" not in text[quick:slow]  # none for the quick one
