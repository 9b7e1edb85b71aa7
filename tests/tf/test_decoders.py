"""GPT-2 and Llama on the tf backend, at a small size (the tests are tests/common/decoder_checks.py's)."""

import pytest
from decoder_checks import (  # noqa: F401  (collected here)
    smollm2,
    test_a_chat_batch_s_answer_targets_alone_give_the_whole_forward_s_losses,
    test_generation_matches_transformers,
    test_logits_match_transformers,
    test_lora_training_follows_torch,
    test_smollm2_from_its_gguf_matches_transformers_gguf_load,
    test_training_follows_torch,
)

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend

pytestmark = pytest.mark.started_first


@pytest.fixture(scope="module")
def backend():
    """Two replicas: MirroredStrategy's all-reduce and per-replica rows, at a third of the time of all eight logical
    devices (the strategy traces each replica's program in a thread of its own: 28.5 s for the two families' 20
    steps over eight, 8.4 s over two)."""
    return TfBackend(RuntimeConfig(cpu_devices=2))
