"""pytest fixtures."""
import sys
from pathlib import Path

import pytest
import torch

# `python -m pytest` from the repository root puts the root on sys.path, where the source
# folder cutlass_ops/ (which has no compiled library) would shadow the installed package:
# take it off, as `python -P` does (README, Troubleshooting).
_ROOT = Path(__file__).resolve().parents[2]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]


@pytest.fixture
def rng():
    """A generator with a fresh seed per test (inputs drawn fresh each run); the seed is printed,
    so a failure's captured output names it (torch.Generator().manual_seed(SEED) reproduces)."""
    seed = torch.seed() % (2**31)
    print(f"rng seed {seed}")
    return torch.Generator().manual_seed(seed)
