"""Every rope type but the default once, in four families, on the tf backend against transformers
(tests/common/rope_checks.py)."""

from pathlib import Path

import pytest
from rope_checks import FAST, SUBSET, check_rope_checkpoint, parametrize

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend

pytestmark = pytest.mark.started_first


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig(cpu_devices=1))


@parametrize(SUBSET, FAST["tf"])
def test_rope_checkpoint_matches_transformers(backend, tmp_path: Path, family: str, kind: str) -> None:
    """A transformers-drawn checkpoint with the rope table `kind`: transformers' per-token losses below and above
    the original length, its greedy tokens from prompts below, above and across it."""
    check_rope_checkpoint(backend, tmp_path, family, kind)
