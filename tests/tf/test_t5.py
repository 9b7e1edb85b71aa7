"""T5 on the tf backend, at a small size (the tests are tests/common/t5_checks.py's)."""

import pytest
from t5_checks import (  # noqa: F401  (collected here)
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_training_follows_torch,
)

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig(cpu_devices=2))
