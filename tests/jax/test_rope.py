"""Every rope type but the default once, in four families, on the jax backend against transformers
(tests/common/rope_checks.py)."""

from pathlib import Path

import pytest
from helpers import backend as jax_backend
from rope_checks import FAST, SUBSET, check_rope_checkpoint, parametrize


@pytest.fixture(scope="module")
def backend():
    return jax_backend(1)


@parametrize(SUBSET, FAST["jax"])
def test_rope_checkpoint_matches_transformers(backend, tmp_path: Path, family: str, kind: str) -> None:
    """A transformers-drawn checkpoint with the rope table `kind`: transformers' per-token losses below and above
    the original length, its greedy tokens from prompts below, above and across it."""
    check_rope_checkpoint(backend, tmp_path, family, kind)
