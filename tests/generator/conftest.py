"""The generator tests' random seeds: as tests/python's (see tests/python/conftest.py), every
test's global generators are seeded from its test id and restored afterwards, so the sample
inputs a test traces with do not depend on which tests ran before it.  CUTLASS_OPS_TEST_SEED
mixes a number in, as there (the --fresh-seeds option is tests/python's alone)."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from _seeds import SEED_ENV, all_global_generators_seeded, global_seed, node_id, node_seed, seed_mix, seed_note  # noqa: E402

_MIX = seed_mix(os.environ.get(SEED_ENV))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("seed", seed_note(node_id(item), _MIX)))


@pytest.fixture(autouse=True)
def _seeded_global_generators(request):
    with all_global_generators_seeded(global_seed(node_seed(node_id(request.node), _MIX))):
        yield
