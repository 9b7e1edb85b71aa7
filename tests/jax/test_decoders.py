"""GPT-2 and Llama on the jax backend, at a small size (the tests are tests/common/decoder_checks.py's)."""

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
from helpers import backend as jax_backend


@pytest.fixture(scope="module")
def backend():
    return jax_backend(8)
