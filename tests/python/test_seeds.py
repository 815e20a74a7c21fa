"""The tests' seeds (conftest.py, _seeds.py): a seed is a pure function of the test id, the
global generators are seeded per test and restored around it, a second process draws the same
data whatever ran before, a failure's report names the seed, and fresh seeds are an opt-in.
CPU only; imports neither cutlass_ops nor _helpers, so that the child pytest runs start fast."""
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _seeds import (ROOT, SEED_ENV, all_global_generators_seeded, global_seed, node_id, node_seed,
                    seed_mix, seed_note, seeded)

THIS = "tests/python/test_seeds.py"
_SELFTEST = "CUTLASS_OPS_SEEDS_SELFTEST"  # set in the child runs only: enables the probes below


def test_seed_is_a_pure_function_of_the_test_id():
    a, b = f"{THIS}::test_x[cpu-float16]", f"{THIS}::test_x[cpu-float32]"
    assert node_seed(a) == node_seed(a) and 0 <= node_seed(a) < 2**31
    assert node_seed(a) != node_seed(b)
    assert node_seed(a, 7) == node_seed(a, 7) != node_seed(a, 8)
    assert node_seed(a, 7) != node_seed(a)
    assert global_seed(node_seed(a)) != node_seed(a)  # global draws differ from the rng fixture's


def test_fresh_seeds_are_opt_in():
    """CUTLASS_OPS_TEST_SEED unset: seeds from the test ids alone; an integer: mixed in; 'fresh'
    (or --fresh-seeds): a drawn number mixed in, named in a failure's report as the value of
    CUTLASS_OPS_TEST_SEED that reruns the same seeds."""
    assert seed_mix(None) is None and seed_mix("") is None
    assert seed_mix("12") == 12 and seed_mix(" 0x10 ") == 16
    drawn = {seed_mix("fresh") for _ in range(4)} | {seed_mix(None, fresh=True), seed_mix("FRESH")}
    assert len(drawn) > 1 and all(0 <= m < 2**31 for m in drawn)
    with pytest.raises(ValueError, match=SEED_ENV):
        seed_mix("twelve")
    test = f"{THIS}::test_x"
    assert seed_note(test, None).startswith(f"seed {node_seed(test)} (test id {test})")
    mix = drawn.pop()
    note = seed_note(test, mix)
    assert note.startswith(f"seed {node_seed(test, mix)} (test id {test})")
    assert note.endswith(f"rerun with {SEED_ENV}={mix}") and seed_mix(str(mix)) == mix


def test_rng_fixture_is_seeded_by_the_test_id(request, rng, rng_seed):
    assert node_id(request.node) == f"{THIS}::test_rng_fixture_is_seeded_by_the_test_id"
    if not os.environ.get(SEED_ENV) and not request.config.getoption("--fresh-seeds", default=False):
        assert rng_seed == node_seed(node_id(request.node))
    assert torch.equal(torch.rand(4, generator=rng), torch.rand(4, generator=torch.Generator().manual_seed(rng_seed)))
    # the global generators: seeded from the same test seed, a different stream
    assert torch.equal(torch.rand(4), torch.rand(4, generator=torch.Generator().manual_seed(global_seed(rng_seed))))


def test_global_generators_are_restored():
    """all_global_generators_seeded (the autouse fixture's body) restores torch's, Python's and
    NumPy's global state, whatever the block does to them (here: reseeds and draws)."""
    np = pytest.importorskip("numpy")
    torch_before, py_before, np_before = torch.get_rng_state(), random.getstate(), np.random.get_state()
    with all_global_generators_seeded(123):
        inside = torch.rand(3), random.random(), np.random.rand()
        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        torch.rand(100), random.random(), np.random.rand(100)
    assert torch.equal(torch.get_rng_state(), torch_before) and random.getstate() == py_before
    assert np.random.get_state()[1].tolist() == np_before[1].tolist()
    with all_global_generators_seeded(123):  # the same seed, the same draws
        assert torch.equal(torch.rand(3), inside[0]) and random.random() == inside[1]
        assert np.random.rand() == inside[2]
    with seeded(5):  # the tests' way to build modules under a fixed seed
        a = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), torch_before)
    with seeded(5):
        assert torch.equal(torch.rand(3), a)


# ---- probes for the child runs below (they pass trivially in an ordinary run) ---------------

def test_probe_reseeds_global_generators():
    """A test that reseeds and draws from the global generators, as a careless test would."""
    torch.manual_seed(1)
    random.seed(1)
    torch.rand(10)


def test_probe_prints_draws(rng, rng_seed):
    print(f"\nDRAWS {rng_seed} {torch.rand(3, generator=rng).tolist()} {torch.rand(3).tolist()} {random.random()}")


def test_probe_fails():
    if os.environ.get(_SELFTEST) == "fail":
        pytest.fail("deliberate failure (a probe for test_seeds)")


def _run(*tests, **env):
    """Starts a child pytest over this file's `tests` (CPU only; no cache; -s: prints pass)."""
    child_env = {k: v for k, v in os.environ.items() if k not in (SEED_ENV, _SELFTEST)}
    child_env.update(env, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s",
                             *[f"{THIS}::{t}" for t in tests]],
                            cwd=ROOT, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _draws(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("DRAWS ")]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def test_same_draws_in_another_process_whatever_ran_before():
    """The rng fixture's and the global generators' first draws are the same in two fresh
    processes, one running the probe alone and one after a test that reseeds the global
    generators and after a failing test; the failure's report names the seed and the test id."""
    alone = _run("test_probe_prints_draws")
    after = _run("test_probe_reseeds_global_generators", "test_probe_fails", "test_probe_prints_draws",
                 **{_SELFTEST: "fail"})
    out_alone, out_after = (p.communicate(timeout=300)[0] for p in (alone, after))
    assert alone.returncode == 0, out_alone[-3000:]
    assert _draws(out_alone) == _draws(out_after)
    probe = f"{THIS}::test_probe_prints_draws"
    assert _draws(out_alone).split()[1] == str(node_seed(probe))

    assert after.returncode == 1 and "1 failed, 2 passed" in out_after, out_after[-3000:]
    failed = f"{THIS}::test_probe_fails"
    assert f"seed {node_seed(failed)} (test id {failed})" in out_after, out_after[-3000:]



def _collected(*args, cwd=ROOT) -> tuple[set[str], subprocess.CompletedProcess]:
    out = subprocess.run([sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                          str(Path(ROOT) / THIS), *args], cwd=cwd, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode in (0, 4), out.stdout[-3000:]  # 4: the usage error below
    return {line for line in out.stdout.splitlines() if "::" in line}, out


def test_shards_are_disjoint_and_cover_the_selection():
    everything, _ = _collected()
    parts = [_collected("--shard", f"{k}/3")[0] for k in (1, 2, 3)]
    assert len(everything) > 5
    assert set().union(*parts) == everything
    assert sum(len(p) for p in parts) == len(everything)
    assert all(parts)  # each part holds some of them
    _, bad = _collected("--shard", "4/3")
    assert bad.returncode == 4 and "K must be in 1..N" in bad.stdout, bad.stdout[-2000:]


def test_skip_ids_leaves_out_the_listed_tests(tmp_path):
    """--skip-ids FILE: the tests FILE lists are left out, the rest run; ids as the -v log of a
    run from another directory prints them (relative to it: tests/gpu_suite.sh runs pytest from
    /tmp) match too; with --shard, the rest of that shard; a missing file is a usage error."""
    everything, _ = _collected()
    listed = sorted(everything)[: len(everything) // 2]
    ids = tmp_path / "done_ids.txt"
    ids.write_text("\n".join(listed) + "\n\n")
    rest, _ = _collected("--skip-ids", str(ids))
    assert listed and rest == everything - set(listed)
    shard, _ = _collected("--shard", "1/2")
    assert shard & set(listed) and shard - set(listed)
    assert _collected("--shard", "1/2", "--skip-ids", str(ids))[0] == shard - set(listed)
    # as pytest -v run from tmp_path names them: ../../<root>/tests/python/test_seeds.py::...
    away = [os.path.relpath(Path(ROOT) / i.split("::")[0], tmp_path) + "::" + i.split("::", 1)[1] for i in listed]
    assert away[0].startswith("..")
    ids.write_text("\n".join(away) + "\n")
    assert _collected("--skip-ids", str(ids), cwd=tmp_path)[0] == everything - set(listed)
    _, bad = _collected("--skip-ids", str(tmp_path / "missing.txt"))
    assert bad.returncode == 4 and "--skip-ids" in bad.stdout, bad.stdout[-2000:]


def test_scripts_never_pipe_a_command_into_grep_q():
    """Under `set -o pipefail`, `cmd | grep -q pattern` fails whenever grep finds the pattern and
    exits before cmd has written everything (cmd dies of a broken pipe): the test reads false where
    the pattern is there.  That kept gpu_suite.sh from passing --maxschedchunk to xdist, which put
    every long test on one worker.  The scripts feed grep -q a here-string or a file instead."""
    scripts = sorted((Path(ROOT) / "tests").glob("*.sh")) + [Path(ROOT) / ".ci" / "run"]
    piped = re.compile(r"(?<!\|)\|(?!\|)\s*grep\s+(-[A-Za-z]*q|--quiet)")  # a pipe, not ||
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in scripts for n, line in enumerate(p.read_text().splitlines(), 1)
             if piped.search(line) and not line.lstrip().startswith("#")]
    assert len(scripts) > 5
    assert not found, "\n".join(found)
