"""Speech recognition on the jax backend: tests/common/speech_checks.py's checks."""

import pytest
from speech_checks import (  # noqa: F401  (collected here)
    speech_run,
    test_ctc_training_follows_torch_on_real_recordings,
    test_the_torch_checkpoint_transcribes_alike,
)

pytestmark = pytest.mark.started_first


@pytest.fixture(scope="module")
def backend_name() -> str:
    return "jax"
