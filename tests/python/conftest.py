"""pytest fixtures."""
import pytest
import torch


@pytest.fixture
def rng():
    g = torch.Generator().manual_seed(torch.seed() % (2**31))
    return g
