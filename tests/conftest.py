"""Shared fixtures: a fresh random generator per test (no fixed global seed)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """Fresh, randomly seeded generator; the seed is printed so a failure can be replayed."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)
