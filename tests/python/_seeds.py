"""The tests' random seeds: a test's seed is a pure function of its test id (conftest.py's
docstring says how the fixtures use it), and `seeded(k)` fixes the global generators for a
block without changing them for anything after it."""
from __future__ import annotations

import contextlib
import random
import secrets
import zlib
from pathlib import Path

import torch

try:
    import numpy
except ImportError:  # numpy is optional
    numpy = None

ROOT = Path(__file__).resolve().parents[2]  # the repository root
SEED_ENV = "CUTLASS_OPS_TEST_SEED"
_MASK = 0x7FFFFFFF  # seeds are 31-bit: valid for torch, numpy and random alike


def node_id(item) -> str:
    """A pytest item's node id with its file's path relative to the repository root, POSIX
    separators (``tests/python/test_x.py::test_y[params]``): the same from any working
    directory, rootdir or clone."""
    path = Path(str(item.path)).resolve()
    try:
        rel = path.relative_to(ROOT).as_posix()
    except ValueError:  # a test file outside this checkout: its name only
        rel = path.name
    rest = item.nodeid.split("::", 1)
    return rel + ("::" + rest[1] if len(rest) == 2 else "")


def node_seed(test_id: str, mix: int | None = None) -> int:
    """A test's seed, 0 <= seed < 2**31: the CRC-32 of its id (with `mix` in front, if given)."""
    key = test_id if mix is None else f"{mix}:{test_id}"
    return zlib.crc32(key.encode()) & _MASK


def global_seed(seed: int) -> int:
    """The global generators' seed for a test whose seed is `seed`: derived from it, but not
    equal, so that draws without a generator differ from the `rng` fixture's draws."""
    return zlib.crc32(f"global:{seed}".encode()) & _MASK


def seed_mix(env: str | None, fresh: bool = False) -> int | None:
    """The number mixed into every test's seed this run, from CUTLASS_OPS_TEST_SEED's value
    `env` and the --fresh-seeds option: None (unset or empty, no option: seeds from the test ids
    alone), that integer, or a freshly drawn one ('fresh' or the option)."""
    env = (env or "").strip()
    if fresh or env.lower() == "fresh":
        return secrets.randbelow(2**31)
    if not env:
        return None
    try:
        return int(env, 0)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={env!r}: expected 'fresh' or an integer") from None


def seed_note(test_id: str, mix: int | None) -> str:
    """What a failing test's report says about its seed."""
    seed = node_seed(test_id, mix)
    note = f"seed {seed} (test id {test_id}); global generators seeded with {global_seed(seed)}"
    if mix is not None:
        note += f"; mixed with {mix}: rerun with {SEED_ENV}={mix}"
    return note


def cuda_devices() -> list[int]:
    """The CUDA devices whose generator state forking saves and restores (none without CUDA)."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


@contextlib.contextmanager
def all_global_generators_seeded(seed: int):
    """Inside: torch's global generators (CPU and every CUDA device), Python's ``random`` and
    NumPy's legacy global state seeded with `seed`; on leaving, the state of each comes back
    (what the conftest's autouse fixture wraps every test in)."""
    py_state = random.getstate()
    np_state = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=cuda_devices()):
            torch.manual_seed(seed)
            random.seed(seed)
            if numpy is not None:
                numpy.random.seed(seed)
            yield
    finally:
        random.setstate(py_state)
        if numpy is not None:
            numpy.random.set_state(np_state)


@contextlib.contextmanager
def seeded(seed: int):
    """Inside: torch's global generators (CPU and every CUDA device) seeded with `seed`; on
    leaving, their earlier state comes back, so later draws (and later tests) are unaffected.
    For building modules reproducibly: ``with seeded(0): model = Net()``."""
    with torch.random.fork_rng(devices=cuda_devices()):
        torch.manual_seed(seed)
        yield
