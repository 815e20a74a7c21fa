"""Strict test runs (conftest.py): under CUTLASS_OPS_STRICT=1 a test runs in strict mode unless
it carries the ``fallback`` marker, which turns strict mode off on every thread for it.  The
probes below assert it in a child pytest run with CUTLASS_OPS_STRICT=1 (in an ordinary run
they pass trivially).  Also conftest's list of the tests during which an op fell back
(``fallbacks_<pid>.txt`` under CUTLASS_OPS_TEST_STACKS), from a child run.  CPU only."""
import os
import subprocess
import sys
import threading
import warnings

import pytest

from cutlass_ops import paths
from _seeds import ROOT

THIS = "tests/python/test_strict_marker.py"
_PROBE = "CUTLASS_OPS_STRICT_MARKER_PROBE"  # set in the child run only


def _strict_here_and_in_a_thread() -> tuple[bool, bool]:
    seen = []
    t = threading.Thread(target=lambda: seen.append(paths.is_strict()))
    t.start()
    t.join()
    return paths.is_strict(), seen[0]


def test_probe_unmarked_is_strict():
    if os.environ.get(_PROBE):
        assert _strict_here_and_in_a_thread() == (True, True)


@pytest.mark.fallback
def test_probe_marked_fallback_is_not_strict():
    if os.environ.get(_PROBE):
        assert _strict_here_and_in_a_thread() == (False, False)


def _fall_back_once():
    with paths.strict(False), warnings.catch_warnings():  # (it warns once per process)
        warnings.simplefilter("ignore")
        paths.fallback("probe_op", "a probe's reason")


def test_probe_falls_back_unmarked():
    if os.environ.get(_PROBE):
        _fall_back_once()


@pytest.mark.fallback
def test_probe_falls_back_marked():
    if os.environ.get(_PROBE):
        _fall_back_once()


def test_probe_does_not_fall_back():
    pass


def test_fallbacks_list_names_each_test_that_fell_back(tmp_path):
    """conftest lists the two probes that fell back, marked or not, with the op, the reason and
    the count, and not the one that did not."""
    probes = ["test_probe_falls_back_unmarked", "test_probe_falls_back_marked", "test_probe_does_not_fall_back"]
    env = dict(os.environ, CUTLASS_OPS_TEST_STACKS=str(tmp_path), CUDA_VISIBLE_DEVICES="", **{_PROBE: "1"})
    env.pop("CUTLASS_OPS_STRICT", None)
    out = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          *(f"{THIS}::{p}" for p in probes)],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0 and "3 passed" in out.stdout, out.stdout[-3000:]
    lines = sorted(line for f in tmp_path.glob("fallbacks_*.txt") for line in f.read_text().splitlines())
    assert lines == [f"{THIS}::test_probe_falls_back_marked\tmarked\tprobe_op: a probe's reason x1",
                     f"{THIS}::test_probe_falls_back_unmarked\tunmarked\tprobe_op: a probe's reason x1"], lines


def test_strict_env_and_the_fallback_marker():
    env = dict(os.environ, CUTLASS_OPS_STRICT="1", CUDA_VISIBLE_DEVICES="", **{_PROBE: "1"})
    out = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          f"{THIS}::test_probe_unmarked_is_strict", f"{THIS}::test_probe_marked_fallback_is_not_strict"],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout[-3000:]
