"""Masked-LM pre-training on every family on tf: per-token losses equal HF transformers' `*ForMaskedLM`, training
with the core's masks follows the torch backend, and the decoder stays tied (tests/common/mlm_checks.py)."""

from __future__ import annotations

import hf_families as families
import mlm_checks
import pytest

from tpuplex.config import RuntimeConfig
from tpuplex_tf.backend import TfBackend


@pytest.fixture(scope="module", params=families.FAMILIES)
def family_dir(request, tmp_path_factory):
    return families.write_checkpoint(request.param, tmp_path_factory.mktemp(request.param))


def test_token_losses_match_hf(family_dir):
    mlm_checks.check_token_losses_match_hf(TfBackend(RuntimeConfig(cpu_devices=1)), family_dir)


@pytest.mark.parametrize("family_dir", families.HEADS_TRAINED_FAST, indirect=True)
def test_twenty_steps_follow_the_torch_backend(family_dir):
    mlm_checks.check_training_follows_torch(TfBackend(RuntimeConfig(cpu_devices=1)), family_dir)
