"""T5 on the jax backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import pytest
from helpers import backend as jax_backend
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_training_follows_torch,
)


@pytest.fixture(scope="module")
def backend():
    return jax_backend(2)
