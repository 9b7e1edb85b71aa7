"""GPT-2 and Llama on the tf backend, at a small size: logits as transformers', training as the torch backend,
decoding as transformers' generate (tests/common/decoder_checks.py)."""

import pytest
from decoder_checks import check_generation, check_logits_match_hf, check_training_follows_torch

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend

FAMILIES = ("gpt2", "llama")


@pytest.fixture(scope="module")
def backend():
    return TfBackend(RuntimeConfig())


@pytest.mark.parametrize("model_type", FAMILIES)
def test_logits_match_transformers(backend, tmp_path, model_type):
    check_logits_match_hf(backend, tmp_path, model_type)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_training_follows_torch(backend, tmp_path, model_type):
    check_training_follows_torch(backend, tmp_path, model_type)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_generation_matches_transformers(backend, tmp_path, model_type):
    check_generation(backend, tmp_path, model_type)
