"""T5 on the torch backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import pytest
from helpers import backend as torch_backend
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
)


@pytest.fixture(scope="module")
def backend():
    return torch_backend()
