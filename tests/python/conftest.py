"""pytest fixtures, and the tests' random seeds.

Seeds: every test's random data is fixed by its test id, so a run draws the same inputs as the
last one, whatever the order or selection of tests (_seeds.py holds the functions).

- A test's seed is the CRC-32 of its pytest node id, masked to 31 bits, with the file's path
  relative to the repository root (``tests/python/test_x.py::test_y[params]``: the same from
  any working directory or clone).
- The ``rng`` fixture is a ``torch.Generator`` seeded with it (``rng_seed``: the seed itself).
- Around every test (an autouse fixture) the global generators -- torch's CPU generator and,
  where CUDA is available, each CUDA device's; Python's ``random``; NumPy's legacy global
  state -- are seeded from the test's seed (with a value derived from it, so that draws
  without a generator differ from the ``rng`` fixture's), and their earlier state is restored
  afterwards.  A test that draws without a generator is deterministic too, and nothing a test
  does to the global generators reaches a later test.
- A failing test's report carries a ``seed`` section: the seed, the test id, the global seed.

Strict mode: with ``CUTLASS_OPS_STRICT=1`` (tests/gpu_suite.sh's STRICT=1) any op that falls
back on CUDA raises, so a GPU test passes only on the kernels it means; tests marked ``fallback``
(they mean the fallback path too, e.g. float32 inputs, or count the paths themselves) run with
strict mode off.

Hung tests: with ``CUTLASS_OPS_TEST_STACKS=<folder>`` (tests/gpu_suite.sh sets it) each process
appends to ``<folder>/tests_<pid>.txt`` the id of every test it starts and, for a test still
running after ``CUTLASS_OPS_TEST_STACKS_AFTER`` seconds (240), every thread's Python stack
(faulthandler: it works while the main thread waits inside a CUDA call).  Under pytest-xdist a
worker's stderr reaches no log, so the file is where a hung test shows what it waits on.
Each process also appends to ``<folder>/fallbacks_<pid>.txt`` one line for every test during
whose call an op fell back on CUDA (``paths.fallback_counts()`` before and after): the test's
id, whether it is marked ``fallback``, and each (op, reason) with its count, " | " between
them.  An unmarked test listed there fails in strict mode, so one ordinary GPU run shows what
a strict one would meet.

``--shard K/N`` runs the K-th of N disjoint parts of the selection (a hash of each test id
decides), for GPU suites split over several sittings (tests/gpu_suite.sh's SHARD).
``--skip-ids FILE`` leaves out the tests whose ids FILE lists, one a line: those a sitting stopped
by its time limit already ran (tests/gpu_suite.sh's SKIP_IDS and done_ids.txt), so that the next
sitting runs the rest.

Fresh seeds, to hunt for seed-dependent failures (opt-in):

- ``--fresh-seeds`` (pytest option) or ``CUTLASS_OPS_TEST_SEED=fresh`` (environment): the run
  draws a random number and mixes it into every test's seed, so every test gets new data.
  The number is printed in the run's header and in every failure's ``seed`` section, and
  ``CUTLASS_OPS_TEST_SEED=<that number>`` reruns the same seeds.
- ``CUTLASS_OPS_TEST_SEED=<integer>``: that integer is mixed into every test's seed.
  Unset (the default): seeds come from the test ids alone.

Tests that build modules under a fixed seed use ``seeded(k)`` (_seeds.py, also in _helpers):
a context manager that seeds torch's global generators inside a fork of their state, never a
bare ``torch.manual_seed``.  test_fuzz.py's cases follow the test's seed unless
CUTLASS_OPS_FUZZ_SEED names one.
"""
import faulthandler
import os
import sys
import zlib
from pathlib import Path

# Under pytest-xdist with CUTLASS_OPS_TEST_GPUS="0,1,..." (tests/gpu_suite.sh), worker k runs
# on the k-th GPU of that list, modulo its length: set before anything initialises CUDA.
if os.environ.get("CUTLASS_OPS_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER"):
    _gpus = os.environ["CUTLASS_OPS_TEST_GPUS"].split(",")
    _k = int("".join(c for c in os.environ["PYTEST_XDIST_WORKER"] if c.isdigit()) or 0)
    os.environ["CUDA_VISIBLE_DEVICES"] = _gpus[_k % len(_gpus)]

import pytest
import torch

from _seeds import SEED_ENV, all_global_generators_seeded, global_seed, node_id, node_seed, seed_mix, seed_note

# `python -m pytest` from the repository root puts the root on sys.path, where the source
# folder cutlass_ops/ (which has no compiled library) would shadow the installed package:
# take it off, as `python -P` does (README, Troubleshooting).
_ROOT = Path(__file__).resolve().parents[2]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

_mix_state: dict = {}


def pytest_addoption(parser):
    parser.addoption("--fresh-seeds", action="store_true", default=False,
                     help=f"mix a freshly drawn number into every test's seed (printed; "
                          f"{SEED_ENV}=<it> reruns the same seeds); also {SEED_ENV}=fresh")
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N disjoint parts of the selected tests (by a hash of each test id: "
                          "the parts are stable and every file is spread over them); e.g. a GPU suite too long "
                          "for one sitting as --shard 1/2 and --shard 2/2")
    parser.addoption("--skip-ids", default=None, metavar="FILE",
                     help="leave out the tests whose ids FILE lists, one a line (e.g. the done_ids.txt of a GPU "
                          "suite sitting stopped by its time limit: the next sitting runs the rest)")


def _shard(config) -> tuple[int, int] | None:
    text = config.getoption("--shard", default=None)
    if text is None:
        return None
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {text!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {text!r}: K must be in 1..N")
    return k, n


def _skip_ids(config) -> set[str]:
    """--skip-ids's test ids, repository-relative (as node_id makes them): the -v log names a test
    by its path relative to where pytest ran (``../work/repo/tests/python/...`` from /tmp)."""
    path = config.getoption("--skip-ids", default=None)
    if path is None:
        return set()
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError as e:
        raise pytest.UsageError(f"--skip-ids {path!r}: {e}") from None
    ids = set()
    for line in lines:
        file, sep, rest = line.partition("::")
        try:
            file = (Path(config.invocation_params.dir) / file).resolve().relative_to(_ROOT).as_posix()
        except ValueError:  # outside this checkout: as written
            pass
        ids.add(file + sep + rest)
    return ids


def pytest_collection_modifyitems(config, items):
    # The long tests first (a stable sort: the rest keep their order), so that they start early
    # instead of trailing after everything else is done.  Under pytest-xdist they spread over
    # the workers only when it hands out tests a few at a time (gpu_suite.sh: --maxschedchunk 2);
    # its default first chunk, about tests/workers/4 consecutive tests, gives them all to one.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    shard, skip = _shard(config), _skip_ids(config)
    if shard is None and not skip:
        return
    k, n = shard or (1, 1)
    keep, drop = [], []
    for item in items:
        nid = node_id(item)
        (keep if nid not in skip and zlib.crc32(nid.encode()) % n == k - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _mix(config) -> int | None:
    """None (seeds from test ids alone) or the number mixed into every seed this run."""
    if "mix" not in _mix_state:
        try:
            _mix_state["mix"] = seed_mix(os.environ.get(SEED_ENV), config.getoption("--fresh-seeds", default=False))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
    return _mix_state["mix"]


def item_seed(item) -> int:
    return node_seed(node_id(item), _mix(item.config))


def pytest_configure(config):
    _mix_state.clear()
    _mix(config)  # a bad CUTLASS_OPS_TEST_SEED is a usage error before any test runs
    _shard(config)  # likewise a bad --shard
    _skip_ids(config)  # and a missing --skip-ids file


def pytest_report_header(config):
    mix = _mix(config)
    if mix is None:
        return f"test seeds: from the test ids ({SEED_ENV}=fresh or --fresh-seeds for fresh ones)"
    return f"test seeds: the test ids mixed with {mix} ({SEED_ENV}={mix} reruns them)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("seed", seed_note(node_id(item), _mix(item.config))))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """CUTLASS_OPS_TEST_STACKS (the module's docstring): the test's id, then every thread's stack
    if it runs past CUTLASS_OPS_TEST_STACKS_AFTER seconds."""
    folder = os.environ.get("CUTLASS_OPS_TEST_STACKS")
    if not folder:
        yield
        return
    after = float(os.environ.get("CUTLASS_OPS_TEST_STACKS_AFTER", "240"))
    before = _fallback_counts()
    with open(os.path.join(folder, f"tests_{os.getpid()}.txt"), "a") as f:
        f.write(f"== {node_id(item)}\n")
        f.flush()
        faulthandler.dump_traceback_later(after, file=f)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
    # (a count below its earlier value: the test cleared the counts, paths.reset(), and all of it is new)
    new = {k: n - before.get(k, 0) if n >= before.get(k, 0) else n
           for k, n in _fallback_counts().items() if n != before.get(k, 0)}
    if new:
        marked = "marked" if item.get_closest_marker("fallback") is not None else "unmarked"
        what = " | ".join(f"{op}: {reason} x{n}" for (op, reason), n in sorted(new.items()))  # reasons hold "; "
        with open(os.path.join(folder, f"fallbacks_{os.getpid()}.txt"), "a") as f:
            f.write(f"{node_id(item)}\t{marked}\t{what}\n")


def _fallback_counts() -> dict:
    """cutlass_ops.paths.fallback_counts() where the test process has imported cutlass_ops, else
    {} (nothing can have fallen back)."""
    paths = sys.modules.get("cutlass_ops.paths")
    return paths.fallback_counts() if paths is not None else {}


@pytest.fixture(autouse=True)
def _seeded_global_generators(request):
    """Seeds torch's (CPU and CUDA), Python's and NumPy's global generators from the test's
    seed for the test, restoring their state afterwards."""
    with all_global_generators_seeded(global_seed(item_seed(request.node))):
        yield


@pytest.fixture(autouse=True)
def _fallback_tests_outside_strict_mode(request):
    """A test marked ``fallback`` runs with strict mode off, on every thread (autograd's
    included), whatever CUTLASS_OPS_STRICT says."""
    if request.node.get_closest_marker("fallback") is None:
        yield
        return
    import cutlass_ops
    with cutlass_ops.strict(False, all_threads=True), cutlass_ops.strict(False):
        yield


@pytest.fixture
def rng_seed(request) -> int:
    """This test's seed (see the module's docstring)."""
    return item_seed(request.node)


@pytest.fixture
def rng(rng_seed):
    """A torch.Generator seeded with this test's seed (printed on failure)."""
    return torch.Generator().manual_seed(rng_seed)
